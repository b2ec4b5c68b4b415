//! The decoder's packed f32 products (`qtts::kernels::panel`): every vector kernel this CPU has
//! gives its scalar twin's bits on any row count, dilation and split of the blocks; the twin is the
//! exact sum within f32 rounding; through `Context::conv_gemm_panel` (ggml's threads, the bias and
//! residual epilogue) the same bits again. f16 panels give the bits of f32 panels of the widened
//! weights, and the full-size decoder with them (`Products::HostF16`) stays within a bound of f32.

use qtts::ffi::{Context, GgmlError, Threadpool};
use qtts::gguf::GgmlType;
use qtts::kernels::panel::{self, Conv, Kernel};

use crate::common::spread_values as values;

/// Every vector kernel this CPU has, the others reported as skipped by name.
fn vector_kernels() -> Vec<Kernel> {
    [Kernel::Avx2, Kernel::Avx512, Kernel::Neon]
        .into_iter()
        .filter(|k| {
            let ok = k.available();
            if !ok {
                eprintln!("panel kernel {k:?}: skipped, this CPU lacks its instructions");
            }
            ok
        })
        .collect()
}

/// `(c_in, taps, dilation, n, t_out)`: one row to several blocks, dilations of the residual
/// units, row counts that leave every remainder of the kernels' row groups.
const SHAPES: [(usize, usize, usize, usize, usize); 11] = [
    (8, 1, 1, 32, 1),
    (300, 1, 1, 64, 9),
    (200, 3, 2, 32, 13),
    (3, 1, 1, 64, 2),
    (40, 1, 1, 96, 16),
    (17, 3, 1, 32, 17),
    (32, 7, 1, 64, 45),
    (24, 7, 3, 32, 33),
    (16, 7, 9, 96, 70),
    (64, 2, 1, 128, 11),
    (5, 7, 1, 32, 100),
];

/// The product by `kernel`, its blocks shared out in `parts` calls as `parts` threads would.
fn run(kernel: Kernel, w: &[f32], x: &[f32], s: Conv, parts: usize) -> Vec<f32> {
    let k = s.taps * s.c_in;
    let packed = panel::pack(w, k, s.n).expect("whole blocks");
    let mut y = vec![f32::NAN; s.t_out * s.n];
    let blocks = panel::blocks(s.t_out, s.n);
    let per = blocks.div_ceil(parts);
    for p in 0..parts {
        let share = ((p * per).min(blocks), ((p + 1) * per).min(blocks));
        let mut seen = Vec::new();
        // SAFETY: the kernel is available; `packed` holds k · n values, `x` the input rows and
        // `y` the output rows.
        unsafe {
            panel::conv(
                kernel,
                packed.as_ptr(),
                x.as_ptr(),
                y.as_mut_ptr(),
                s,
                share,
                |rows, cols| seen.push((rows, cols)),
            )
        };
        assert_eq!(seen.len(), share.1 - share.0, "one epilogue call per block");
    }
    y
}

fn shape(c_in: usize, taps: usize, dilation: usize, n: usize, t_out: usize) -> Conv {
    Conv {
        c_in,
        taps,
        dilation,
        t_out,
        n,
    }
}

#[test]
fn vector_kernels_give_the_scalar_twins_bits() {
    for (c_in, taps, dilation, n, t_out) in SHAPES {
        let s = shape(c_in, taps, dilation, n, t_out);
        let w = values(taps * c_in * n, 1);
        let x = values((t_out + (taps - 1) * dilation) * c_in, 2);
        let twin = run(Kernel::Scalar, &w, &x, s, 1);
        assert!(
            twin.iter().all(|v| v.is_finite()),
            "{s:?}: every output written"
        );
        for kernel in vector_kernels() {
            for parts in [1, 2, 3] {
                let got = run(kernel, &w, &x, s, parts);
                let same = got
                    .iter()
                    .zip(&twin)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{kernel:?} {s:?} in {parts} parts: not the twin's bits"
                );
            }
        }
    }
}

/// Each output sums from its own input rows only: the first rows of a product alone (a shorter
/// chunk) give the same bits, on the decoder's pre-conv shape and a dilated one.
#[test]
fn the_first_rows_alone_give_the_same_bits() {
    for (c_in, taps, dilation, n, t_out) in [(512, 3, 1, 1024, 40), (96, 7, 9, 96, 70)] {
        let s = shape(c_in, taps, dilation, n, t_out);
        let w = values(taps * c_in * n, 9);
        let x = values((t_out + (taps - 1) * dilation) * c_in, 10);
        let mut kernels = vector_kernels();
        kernels.push(Kernel::Scalar);
        for kernel in kernels {
            let whole = run(kernel, &w, &x, s, 2);
            for rows in [1, 5, 17] {
                let head = run(kernel, &w, &x, shape(c_in, taps, dilation, n, rows), 1);
                let same = head
                    .iter()
                    .zip(&whole)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{kernel:?} {s:?}: the first {rows} rows alone differ");
            }
        }
    }
}

/// The twin is the exact product within f32 rounding (an f64 sum of the same terms), summed as
/// the module fixes: per tap, runs of `CHAIN` channels each one fused chain, the runs added in
/// order. A kernel that rounded its products apart from its sums, or chained all the terms, would
/// give other bits on these values.
#[test]
fn the_twin_sums_runs_of_fused_chains() {
    let (mut unfused_differs, mut one_chain_differs) = (false, false);
    for (c_in, taps, dilation, n, t_out) in SHAPES {
        let s = shape(c_in, taps, dilation, n, t_out);
        let k = taps * c_in;
        let w = values(k * n, 3);
        let x = values((t_out + (taps - 1) * dilation) * c_in, 4);
        let got = run(Kernel::Scalar, &w, &x, s, 1);
        for t in 0..t_out {
            for o in 0..n {
                let (mut exact, mut mag) = (0f64, 0f64);
                let (mut runs, mut unfused, mut one_chain) = (None, 0f32, 0f32);
                for j in 0..taps {
                    for c0 in (0..c_in).step_by(panel::CHAIN) {
                        let mut chain = 0f32;
                        for c in c0..(c0 + panel::CHAIN).min(c_in) {
                            let xv = x[(t + j * dilation) * c_in + c];
                            let wv = w[j * c_in + c + k * o];
                            exact += xv as f64 * wv as f64;
                            mag += (xv as f64 * wv as f64).abs();
                            chain = xv.mul_add(wv, chain);
                            one_chain = xv.mul_add(wv, one_chain);
                            unfused += xv * wv;
                        }
                        runs = Some(runs.map_or(chain, |r: f32| r + chain));
                    }
                }
                let (g, want) = (got[t * n + o], runs.unwrap());
                assert_eq!(g.to_bits(), want.to_bits(), "{s:?} ({t}, {o})");
                let tol = mag * panel::CHAIN as f64 * f32::EPSILON as f64;
                assert!(
                    (g as f64 - exact).abs() <= tol,
                    "{s:?} ({t}, {o}): {g} vs {exact}"
                );
                unfused_differs |= unfused.to_bits() != want.to_bits();
                one_chain_differs |= one_chain.to_bits() != want.to_bits();
            }
        }
    }
    assert!(
        unfused_differs,
        "the values never tell fused from unfused sums apart"
    );
    assert!(
        one_chain_differs,
        "the values never tell runs from one chain apart"
    );
}

/// `conv_gemm_panel` on 1 and 2 ggml threads: the twin's bits plus the bias, then the residual,
/// as separate adds; against the unpacked sgemm product within f32 rounding.
#[test]
fn conv_gemm_panel_is_the_twin_then_bias_then_residual() {
    let Some(kernel) = Kernel::active() else {
        eprintln!(
            "skipped: kernel tier {} has no panel kernel",
            qtts::kernels::active()
        );
        return;
    };
    eprintln!("panel kernel {kernel:?}");
    for (c_in, taps, dilation, n, t_out) in [(24, 7, 3, 64, 33), (40, 1, 1, 96, 5)] {
        let s = shape(c_in, taps, dilation, n, t_out);
        let k = taps * c_in;
        let w = values(k * n, 5);
        let x = values((t_out + (taps - 1) * dilation) * c_in, 6);
        let bias = values(n, 7);
        let residual = values(t_out * n, 8);
        let twin = run(Kernel::Scalar, &w, &x, s, 1);
        let want: Vec<f32> = twin
            .iter()
            .enumerate()
            .map(|(i, v)| (v + bias[i % n]) + residual[i])
            .collect();
        let ctx = Context::new(16 << 20).unwrap();
        let tw = ctx
            .new_tensor_aligned(GgmlType::F32, &[k, n], panel::LINE)
            .unwrap();
        tw.write_f32(&panel::pack(&w, k, n).unwrap()).unwrap();
        let tu = ctx.new_f32(&[k, n]).unwrap();
        tu.write_f32(&w).unwrap();
        let tx = ctx.new_f32(&[c_in, x.len() / c_in]).unwrap();
        tx.write_f32(&x).unwrap();
        let tb = ctx.new_f32(&[n]).unwrap();
        tb.write_f32(&bias).unwrap();
        let tr = ctx.new_f32(&[n, t_out]).unwrap();
        tr.write_f32(&residual).unwrap();
        let y = ctx
            .conv_gemm_panel(tw, tx, taps, dilation, Some(tb), Some(tr))
            .unwrap();
        let plain = ctx.conv_gemm(tu, tx, taps, dilation).unwrap();
        // The same in f16 panels, against the twin on the widened weights.
        let w16 = panel::pack_f16(&w, k, n).unwrap();
        let t16 = ctx
            .new_tensor_aligned(GgmlType::F16, &[k, n], panel::LINE)
            .unwrap();
        let bytes: Vec<u8> = w16.iter().flat_map(|b| b.to_le_bytes()).collect();
        t16.write_bytes(&bytes).unwrap();
        let y16 = ctx
            .conv_gemm_panel(t16, tx, taps, dilation, Some(tb), Some(tr))
            .unwrap();
        let widened: Vec<f32> = w.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect();
        let want16: Vec<f32> = run(Kernel::Scalar, &widened, &x, s, 1)
            .iter()
            .enumerate()
            .map(|(i, v)| (v + bias[i % n]) + residual[i])
            .collect();
        assert!(want16 != want, "the f16 rounding changes these products");
        for threads in [1, 2] {
            let pool = Threadpool::new(threads, &[]).unwrap();
            ctx.graph(y).unwrap().compute(&pool).unwrap();
            let got = y.to_vec();
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{s:?} on {threads} threads: not the twin's bits");
            if kernel.reads_f16() {
                ctx.graph(y16).unwrap().compute(&pool).unwrap();
                let same = y16
                    .to_vec()
                    .iter()
                    .zip(&want16)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{s:?} f16 on {threads} threads: not the widened twin's bits"
                );
            } else {
                eprintln!("f16 panels: skipped, {kernel:?} reads f32 only");
            }
            ctx.graph(plain).unwrap().compute(&pool).unwrap();
            let sgemm = plain.to_vec();
            let tol = k as f32 * 64.0 * f32::EPSILON;
            for (i, (a, b)) in twin.iter().zip(&sgemm).enumerate() {
                assert!((a - b).abs() <= tol, "{s:?} output {i}: {a} vs sgemm {b}");
            }
        }
    }
    // Columns that are not whole blocks are an error, not an abort.
    let ctx = Context::new(1 << 20).unwrap();
    let tw = ctx.new_f32(&[7 * 8, 48]).unwrap();
    let tx = ctx.new_f32(&[8, 20]).unwrap();
    assert!(matches!(
        ctx.conv_gemm_panel(tw, tx, 7, 1, None, None),
        Err(GgmlError::Shape { .. })
    ));
}

/// Least SNR of the decoder with f16 panels (`Products::HostF16`) against f32, at every stage, dB:
/// the random checkpoint's weights are bf16, as the released ones, and bf16 values are f16 values
/// unless under 2^-14 in magnitude, so only the smallest weights round (109 dB measured at the
/// waveform).
const F16_MIN_SNR_DB: f64 = 100.0;

/// The full-size random decoder with f16 panels against its f32 products on the same codes: every
/// stage within [`F16_MIN_SNR_DB`] and none the same bits (the f16 matrices are in use); decoding
/// again gives the same bits.
#[test]
fn full_size_f16_decoder_is_within_its_bound_of_f32() {
    use qtts::decoder::{Decoder, Products};
    use qtts::model::config::Preset;
    if !Kernel::active().is_some_and(Kernel::reads_f16) {
        eprintln!(
            "f16 decoder: skipped, kernel tier {} has no panel kernel that reads f16",
            qtts::kernels::active()
        );
        return;
    }
    let cfg = crate::common::tiny_talker(Preset::Small06CustomVoice);
    let (_tmp, out) = crate::common::random_converted(&cfg, 3, qtts::model::convert::OutType::F32);
    let f = qtts::gguf::GgufFile::open(&out.mmproj).unwrap();
    let pool = Threadpool::new(2, &[]).unwrap();
    let exact = crate::int8::stages(
        &mut Decoder::load_options(&f, None, Products::HostF32).unwrap(),
        &pool,
    );
    let mut voc = Decoder::load_options(&f, None, Products::HostF16).unwrap();
    let f16 = crate::int8::stages(&mut voc, &pool);
    for stage in qtts::decoder::STAGES {
        let snr = qtts::metrics::snr_db(&exact[stage], &f16[stage]);
        eprintln!("full-size decoder, {stage}: f16 panels {snr:.1} dB from f32");
        assert!(snr >= F16_MIN_SNR_DB, "{stage}: {snr:.1} dB");
        assert!(exact[stage] != f16[stage], "{stage}: nothing in f16");
    }
    assert_eq!(crate::int8::stages(&mut voc, &pool), f16, "decoded again");
}
