//! `Context::conv_gemm` and its epilogue: the bf16 kernels against the bf16 sum, the one-column
//! product, the bias and residual adds.

use qtts::ffi::{Context, GgmlError, Threadpool};
use qtts::gguf::GgmlType;
use qtts::kernels::bf16::{self, Kernel};

use super::ffi_ops::values;

/// `conv_gemm` of `x` (`rows` of `c_in`) by the kernel `w` (`[taps · c_in, n]`, f32), with the
/// kernel packed to bf16 for the bf16 kernel `bf16` when there is one, on `threads` threads.
fn conv_gemm(
    w: &[f32],
    x: &[f32],
    shape: (usize, usize, usize, usize),
    bf16: Option<Kernel>,
    threads: usize,
) -> Vec<f32> {
    conv_gemm_then(w, x, shape, bf16, threads, None, None)
}

/// [`conv_gemm`] with `conv_gemm_then`'s bias and residual.
fn conv_gemm_then(
    w: &[f32],
    x: &[f32],
    (c_in, taps, dilation, n): (usize, usize, usize, usize),
    kernel: Option<Kernel>,
    threads: usize,
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
) -> Vec<f32> {
    let pool = Threadpool::new(threads, &[]).unwrap();
    let ctx = Context::new(8 << 20).unwrap();
    let k = taps * c_in;
    let tw = if kernel.is_some() {
        let p = bf16::pack(w, k, n).unwrap();
        let t = ctx.new_tensor(GgmlType::BF16, &[k, n]).unwrap();
        let bytes: Vec<u8> = p.iter().flat_map(|v| v.to_le_bytes()).collect();
        t.write_bytes(&bytes).unwrap();
        t
    } else {
        let t = ctx.new_f32(&[k, n]).unwrap();
        t.write_f32(w).unwrap();
        t
    };
    let tx = ctx.new_f32(&[c_in, x.len() / c_in]).unwrap();
    tx.write_f32(x).unwrap();
    let tensor = |v: &[f32]| {
        let t = ctx.new_f32(&[v.len()]).unwrap();
        t.write_f32(v).unwrap();
        t
    };
    let y = ctx
        .conv_gemm_by(
            kernel,
            tw,
            tx,
            taps,
            dilation,
            bias.map(tensor),
            residual.map(tensor),
        )
        .unwrap();
    ctx.graph(y).unwrap().compute(&pool).unwrap();
    y.to_vec()
}

/// Every bf16 kernel this CPU has (AMX tiles, AVX-512 BF16), the others reported as skipped.
fn bf16_kernels() -> Vec<Kernel> {
    [Kernel::Amx, Kernel::Avx512]
        .into_iter()
        .filter(|k| {
            let ok = k.available();
            if !ok {
                eprintln!("bf16 kernel {k:?}: skipped, this CPU lacks its instructions");
            }
            ok
        })
        .collect()
}

/// Each bf16 kernel gives the bf16 products' sum (in f64, the reference) within the f32
/// accumulation's rounding, on 1 and 2 threads, and the first rows of a product alone give the
/// same values, bit for bit (each output sums in one order, whatever the rows around it).
#[test]
fn bf16_conv_is_the_bf16_sum_in_any_chunking() {
    for kernel in bf16_kernels() {
        check_bf16_conv(kernel);
    }
}

fn check_bf16_conv(kernel: Kernel) {
    for (c_in, taps, dilation, n, t_out) in [
        (32, 1, 1, 32, 5),
        (64, 1, 1, 96, 16),
        (64, 3, 1, 64, 17),
        (96, 7, 1, 96, 70),
        (64, 7, 3, 64, 33),
        (96, 7, 9, 32, 64),
        (32, 3, 2, 128, 100),
    ] {
        let k = taps * c_in;
        let w = values(k * n, 5);
        let x = values((t_out + (taps - 1) * dilation) * c_in, 6);
        let s = bf16::Conv {
            c_in,
            taps,
            dilation,
            t_out,
            n,
        };
        let want = bf16::conv_reference(&w, &x, s);
        let exact = conv_gemm(&w, &x, (c_in, taps, dilation, n), None, 1);
        for threads in [1, 2] {
            let got = conv_gemm(&w, &x, (c_in, taps, dilation, n), Some(kernel), threads);
            assert_eq!(got.len(), t_out * n);
            // The reference sums the same bf16 products in f64, the kernels in f32: k roundings
            // of partial sums of terms bounded by 4 (|x|, |w| <= 2), far below the worst case.
            let tol = k as f32 * 4.0 * 8.0 * f32::EPSILON;
            let mut bf16_off = 0f32;
            for (i, (g, r)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - r).abs() <= tol,
                    "{kernel:?} {s:?} output {i}: {g} vs {r}"
                );
                bf16_off = bf16_off.max((g - exact[i]).abs());
            }
            // bf16 rounding (2^-9 relative per factor) is felt against the f32 product, as a
            // random walk over k terms bounded by 4.
            let walk = (k as f32).sqrt() * 4.0 / 64.0;
            assert!(
                bf16_off > 0.0 && bf16_off < walk,
                "{kernel:?} {s:?}: {bf16_off}"
            );
            // The first rows alone give the same values, bit for bit.
            let rows = t_out / 2 + 1;
            let head = conv_gemm(
                &w,
                &x[..(rows + (taps - 1) * dilation) * c_in],
                (c_in, taps, dilation, n),
                Some(kernel),
                threads,
            );
            assert_eq!(head[..], got[..rows * n], "{kernel:?} {s:?}: {rows} rows");
        }
    }
    // A shape the packing cannot take is an error, not an abort.
    let ctx = Context::new(1 << 20).unwrap();
    let tw = ctx.new_tensor(GgmlType::BF16, &[7 * 48, 32]).unwrap();
    let tx = ctx.new_f32(&[48, 20]).unwrap();
    assert!(matches!(
        ctx.conv_gemm_by(Some(kernel), tw, tx, 7, 1, None, None),
        Err(GgmlError::Shape { .. })
    ));
}

/// The two bf16 kernels agree with each other within the f32 accumulation's rounding on the
/// decoder's shapes, where the CPU has both (they round each pair's products in their own way).
#[test]
fn the_bf16_kernels_agree() {
    let kernels = bf16_kernels();
    if kernels.len() < 2 {
        eprintln!("skipped: this CPU has {kernels:?} only");
        return;
    }
    for (c_in, taps, dilation, n, t_out) in [(96, 7, 1, 96, 70), (768, 7, 9, 64, 40)] {
        let k = taps * c_in;
        let w = values(k * n, 7);
        let x = values((t_out + (taps - 1) * dilation) * c_in, 8);
        let shape = (c_in, taps, dilation, n);
        let a = conv_gemm(&w, &x, shape, Some(kernels[0]), 2);
        let b = conv_gemm(&w, &x, shape, Some(kernels[1]), 2);
        let tol = k as f32 * 4.0 * 16.0 * f32::EPSILON;
        let e = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        eprintln!(
            "{shape:?}: {:?} vs {:?}: max {e:e} (bound {tol:e})",
            kernels[0], kernels[1]
        );
        assert!(e <= tol, "{shape:?}: {e}");
    }
}

/// A conv to one output column (the decoder's post-conv: 96 channels, 7 taps, to the waveform)
/// is each row's dot product: within f32 rounding of the f64 sum, plus the bias, the same bits on
/// 1 and 2 threads and for the first rows alone; dilated, the same to the reference.
#[test]
fn conv_gemm_to_one_column_is_each_row_s_dot_product() {
    for (c_in, taps, dilation, t_out) in [(96, 7, 1, 300), (32, 3, 1, 5), (64, 7, 3, 40)] {
        let w = values(taps * c_in, 1);
        let rows = t_out + (taps - 1) * dilation;
        let x = values(rows * c_in, 2);
        let bias = [0.25f32];
        let shape = (c_in, taps, dilation, 1);
        let got = conv_gemm_then(&w, &x, shape, None, 1, Some(&bias), None);
        assert_eq!(got.len(), t_out);
        for (t, &g) in got.iter().enumerate() {
            let (mut want, mut scale) = (0f64, 0f64);
            for j in 0..taps {
                for c in 0..c_in {
                    let p = w[j * c_in + c] as f64 * x[(t + j * dilation) * c_in + c] as f64;
                    (want, scale) = (want + p, scale + p.abs());
                }
            }
            let want = want + 0.25;
            assert!(
                (g as f64 - want).abs() <= 1e-6 * (scale + 1.0),
                "{shape:?} row {t}: {g} vs {want}"
            );
        }
        let two = conv_gemm_then(&w, &x, shape, None, 2, Some(&bias), None);
        assert_eq!(two, got, "{shape:?}: 2 threads");
        let head = t_out / 2 + 1;
        let first = conv_gemm_then(
            &w,
            &x[..(head + (taps - 1) * dilation) * c_in],
            shape,
            None,
            1,
            Some(&bias),
            None,
        );
        assert_eq!(first, got[..head], "{shape:?}: the first {head} rows alone");
    }
}

#[test]
fn conv_gemm_adds_bias_then_residual_as_separate_adds_would() {
    // f32 products everywhere, and bf16 tiles where AMX is: (c_in, taps, dilation, n, t_out,
    // bias length), the bias shorter than the row where it repeats (a transposed conv's), up to
    // five times.
    let mut kernels = vec![None];
    kernels.extend(bf16_kernels().into_iter().map(Some));
    for bf16 in kernels {
        for (c_in, taps, dilation, n, t_out, b) in [
            (32, 1, 1, 64, 5, 64),
            (64, 7, 3, 96, 40, 96),
            (32, 3, 1, 96, 33, 32),
            (64, 1, 1, 128, 17, 64),
            // More than three repeats of the bias in a row.
            (32, 1, 1, 160, 9, 32),
        ] {
            let w = values(taps * c_in * n, 1);
            let x = values((t_out + (taps - 1) * dilation) * c_in, 2);
            let (bias, res) = (values(b, 3), values(t_out * n, 4));
            let shape = (c_in, taps, dilation, n);
            for threads in [1, 2] {
                let plain = conv_gemm(&w, &x, shape, bf16, threads);
                // What ggml's two adds would give: the bias first, then the residual.
                let want: Vec<f32> = plain
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| (v + bias[i % n % b]) + res[i])
                    .collect();
                let got = conv_gemm_then(&w, &x, shape, bf16, threads, Some(&bias), Some(&res));
                assert_eq!(got, want, "bf16 {bf16:?}, {shape:?}, {threads} thread(s)");
                let biased = conv_gemm_then(&w, &x, shape, bf16, threads, Some(&bias), None);
                let want: Vec<f32> = plain
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| v + bias[i % n % b])
                    .collect();
                assert_eq!(biased, want);
                let summed = conv_gemm_then(&w, &x, shape, bf16, threads, None, Some(&res));
                let want: Vec<f32> = plain.iter().zip(&res).map(|(v, r)| v + r).collect();
                assert_eq!(summed, want);
            }
        }
    }
    // A bias whose length does not divide the row, or a residual of another size, is refused.
    let ctx = Context::new(1 << 20).unwrap();
    let (tw, tx) = (
        ctx.new_f32(&[32, 64]).unwrap(),
        ctx.new_f32(&[32, 8]).unwrap(),
    );
    let (b48, r) = (ctx.new_f32(&[48]).unwrap(), ctx.new_f32(&[64, 7]).unwrap());
    for (bias, res, what) in [
        (Some(b48), None, "conv_gemm bias"),
        (None, Some(r), "conv_gemm residual"),
    ] {
        match ctx.conv_gemm_then(tw, tx, 1, 1, bias, res) {
            Err(GgmlError::Shape { what: w, .. }) => assert_eq!(w, what),
            other => panic!("expected a shape error, got {other:?}"),
        }
    }
}
