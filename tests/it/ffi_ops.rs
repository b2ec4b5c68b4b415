//! The decoder's ggml ops (`src/ffi/ops.rs`) compute what the math says and refuse what would make
//! ggml abort.

use qtts::ffi::{Context, GgmlError, Threadpool};
use qtts::gguf::GgmlType;

/// `n` deterministic values in [-2, 2), varied by `seed`.
pub(crate) fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 + seed * 11) % 101) as f32 / 25.0 - 2.0)
        .collect()
}

#[test]
fn elementwise_and_row_ops_match_a_reference() {
    let pool = Threadpool::new(1, &[]).unwrap();
    let (n, rows) = (12, 5);
    let x = values(n * rows, 1);
    let ctx = Context::new(1 << 20).unwrap();
    let t = ctx.new_f32(&[n, rows]).unwrap();
    t.write_f32(&x).unwrap();
    let u = ctx.new_f32(&[n, rows]).unwrap();
    u.write_f32(&x.iter().rev().copied().collect::<Vec<_>>())
        .unwrap();
    type Reference = Box<dyn Fn(&[f32], usize) -> f32>;
    let cases: Vec<(qtts::ffi::Tensor<'_>, Reference)> = vec![
        (ctx.sin(t).unwrap(), Box::new(|x, i| x[i].sin())),
        (ctx.sqr(t).unwrap(), Box::new(|x, i| x[i] * x[i])),
        (
            ctx.gelu_erf(t).unwrap(),
            Box::new(|x, i| {
                let v = x[i] as f64;
                (0.5 * v * (1.0 + libm_erf(v / 2f64.sqrt()))) as f32
            }),
        ),
        (
            // silu(x) ⊙ y with y the same values reversed.
            ctx.swiglu(t, u).unwrap(),
            Box::new(move |x, i| {
                let (v, g) = (x[i] as f64, x[x.len() - 1 - i] as f64);
                (v / (1.0 + (-v).exp()) * g) as f32
            }),
        ),
        (
            ctx.clamp(t, -1.0, 0.5).unwrap(),
            Box::new(|x, i| x[i].clamp(-1.0, 0.5)),
        ),
        (
            ctx.norm(t, 1e-6).unwrap(),
            Box::new(move |x, i| {
                let row = &x[i / n * n..i / n * n + n];
                let mean = row.iter().sum::<f32>() / n as f32;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
                (x[i] - mean) / (var + 1e-6).sqrt()
            }),
        ),
    ];
    let outs: Vec<_> = cases.iter().map(|(t, _)| *t).collect();
    let sums = ctx.sum_rows(t).unwrap();
    let mut all = outs.clone();
    all.push(sums);
    ctx.graph_of(&all).unwrap().compute(&pool).unwrap();
    for (k, (out, reference)) in cases.iter().enumerate() {
        let got = out.to_vec();
        for (i, &g) in got.iter().enumerate() {
            let want = reference(&x, i);
            assert!(
                (g - want).abs() < 1e-5,
                "case {k}, element {i}: {g} vs {want}"
            );
        }
    }
    let got = sums.to_vec();
    assert_eq!(sums.ne(), [1, rows, 1, 1]);
    for r in 0..rows {
        let want: f32 = x[r * n..(r + 1) * n].iter().sum();
        assert!((got[r] - want).abs() < 1e-5);
    }
}

/// erf by its Maclaurin series (enough terms for |x| < 3).
fn libm_erf(x: f64) -> f64 {
    let (mut term, mut sum) = (x, x);
    for k in 1..80 {
        term *= -x * x / k as f64;
        sum += term / (2 * k + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn im2col_columns_times_the_kernel_are_a_dilated_conv() {
    let pool = Threadpool::new(2, &[]).unwrap();
    let (k, c_in, c_out, t, d) = (3, 4, 5, 11, 2);
    let w = values(k * c_in * c_out, 2); // ggml [k, c_in, c_out]
    let x = values(t * c_in, 3); // ggml [t, c_in]: time fastest
    let ctx = Context::new(1 << 20).unwrap();
    let tw = ctx.new_f32(&[k, c_in, c_out]).unwrap();
    tw.write_f32(&w).unwrap();
    let tx = ctx.new_f32(&[t, c_in]).unwrap();
    tx.write_f32(&x).unwrap();
    let cols = ctx.im2col_1d(tw, tx, d).unwrap();
    let t_out = t - (k - 1) * d;
    assert_eq!(cols.ne(), [k * c_in, t_out, 1, 1]);
    let w2 = ctx.reshape(tw, [k * c_in, c_out, 1]).unwrap();
    let y = ctx.mul_mat(w2, cols).unwrap();
    ctx.graph(y).unwrap().compute(&pool).unwrap();
    let got = y.to_vec();
    for s in 0..t_out {
        for o in 0..c_out {
            let want: f32 = (0..c_in)
                .flat_map(|c| (0..k).map(move |j| (c, j)))
                .map(|(c, j)| w[j + k * (c + c_in * o)] * x[c * t + s + j * d])
                .sum();
            let g = got[s * c_out + o];
            assert!((g - want).abs() < 1e-4, "({s},{o}): {g} vs {want}");
        }
    }
}

#[test]
fn inplace_ops_and_row_views_compute_in_place() {
    let pool = Threadpool::new(1, &[]).unwrap();
    let ctx = Context::new(1 << 20).unwrap();
    let a = ctx.new_f32(&[3, 4]).unwrap();
    a.write_f32(&values(12, 4)).unwrap();
    let b = ctx.new_f32(&[3]).unwrap();
    b.write_f32(&[1.0, 2.0, 3.0]).unwrap();
    let fresh = ctx.mul(a, b).unwrap();
    let y = ctx.sqr_inplace(ctx.sin_inplace(fresh).unwrap()).unwrap();
    let y = ctx.add_inplace(ctx.mul_inplace(y, b).unwrap(), a).unwrap();
    let mid = ctx.rows(a, 1, 2).unwrap();
    assert_eq!(mid.ne(), [3, 2, 1, 1]);
    let mid = ctx.cont(mid).unwrap();
    ctx.graph_of(&[y, mid]).unwrap().compute(&pool).unwrap();
    let av = a.to_vec();
    let want: Vec<f32> = av
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let s = (x * b.to_vec()[i % 3]).sin();
            s * s * b.to_vec()[i % 3] + x
        })
        .collect();
    let got = y.to_vec();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5);
    }
    assert_eq!(
        fresh.to_vec(),
        got,
        "the result lives in the first operand's memory"
    );
    assert_eq!(mid.to_vec(), av[3..9].to_vec());
}

#[test]
fn concat_joins_rows_stacks_and_strided_tensors() {
    // Rows of a matrix and matrices of a stack (two copies), inner columns and a transposed
    // operand (ggml's concat): each against the join written out, on 1 and 2 threads (whose
    // byte shares split rows and operands mid-way).
    for threads in [1, 2] {
        let pool = Threadpool::new(threads, &[]).unwrap();
        let ctx = Context::new(1 << 20).unwrap();
        let tensor = |ne: &[usize], seed| {
            let t = ctx.new_f32(ne).unwrap();
            t.write_f32(&values(ne.iter().product(), seed)).unwrap();
            t
        };
        let (a, b) = (tensor(&[5, 3], 1), tensor(&[5, 4], 2));
        let rows = ctx.concat(a, b, 1).unwrap();
        let (s, t) = (tensor(&[2, 3, 2], 3), tensor(&[2, 3, 1], 4));
        let stack = ctx.concat(s, t, 2).unwrap();
        let (l, r) = (tensor(&[3, 4], 5), tensor(&[2, 4], 6));
        let cols = ctx.concat(l, r, 0).unwrap();
        let strided = ctx.permute(tensor(&[3, 5], 7), [1, 0, 2, 3]).unwrap();
        let mixed = ctx.concat(strided, a, 1).unwrap();
        for out in [rows, stack, cols, mixed] {
            ctx.graph(out).unwrap().compute(&pool).unwrap();
        }
        let join = |x: Vec<f32>, y: Vec<f32>| [x, y].concat();
        assert_eq!(rows.ne(), [5, 7, 1, 1]);
        assert_eq!(rows.to_vec(), join(a.to_vec(), b.to_vec()));
        assert_eq!(stack.ne(), [2, 3, 3, 1]);
        assert_eq!(stack.to_vec(), join(s.to_vec(), t.to_vec()));
        let (lv, rv) = (l.to_vec(), r.to_vec());
        let want: Vec<f32> = (0..4)
            .flat_map(|i| [&lv[i * 3..i * 3 + 3], &rv[i * 2..i * 2 + 2]].concat())
            .collect();
        assert_eq!(cols.to_vec(), want);
        // The transposed [3, 5] read as [5, 3]: element (i, j) is the source's (j, i).
        let src = values(15, 7);
        let transposed: Vec<f32> = (0..3)
            .flat_map(|j| (0..5).map(move |i| (i, j)))
            .map(|(i, j)| src[i * 3 + j])
            .collect();
        assert_eq!(mixed.to_vec(), join(transposed, a.to_vec()));
    }
}

#[test]
fn misuse_is_an_error_not_an_abort() {
    let ctx = Context::new(1 << 16).unwrap();
    let a = ctx.new_f32(&[8, 4]).unwrap();
    let k = ctx.new_f32(&[3, 5, 2]).unwrap();
    let strided = ctx.permute(a, [1, 0, 2, 3]).unwrap();
    let what = |r: Result<qtts::ffi::Tensor<'_>, GgmlError>| match r {
        Err(GgmlError::Shape { what, .. }) => what,
        other => panic!("expected a shape error, got {other:?}"),
    };
    assert_eq!(what(ctx.sin(strided)), "sin");
    assert_eq!(what(ctx.norm(a, -1.0)), "norm eps");
    assert_eq!(what(ctx.norm(a, f32::NAN)), "norm eps");
    assert_eq!(what(ctx.clamp(a, 1.0, -1.0)), "clamp bounds");
    assert_eq!(what(ctx.rows(a, 3, 2)), "rows");
    assert_eq!(what(ctx.rows(strided, 0, 1)), "rows");
    // Channels differ (4 vs 5), then the input is shorter than the kernel's span.
    assert_eq!(what(ctx.im2col_1d(k, a, 1)), "im2col_1d");
    let x = ctx.new_f32(&[4, 5]).unwrap();
    assert_eq!(what(ctx.im2col_1d(k, x, 2)), "im2col_1d");
    assert!(ctx.im2col_1d(k, x, 1).is_ok());
    let b = ctx.new_f32(&[3]).unwrap();
    assert_eq!(what(ctx.add_inplace(a, b)), "add_inplace");
    assert_eq!(what(ctx.swiglu(a, x)), "swiglu");
    assert_eq!(what(ctx.swiglu(a, strided)), "swiglu");
    assert_eq!(what(ctx.swiglu_halves(strided)), "swiglu_halves");
    assert_eq!(what(ctx.swiglu_halves(b)), "swiglu_halves");
}

/// `swiglu_halves` is `silu(a) · b` for each row `[a, b]`: the same floats as `swiglu` of the
/// two halves as separate tensors.
#[test]
fn swiglu_halves_is_swiglu_of_each_row_s_halves() {
    let pool = Threadpool::new(2, &[]).unwrap();
    let (n, rows) = (10, 3);
    let x = values(2 * n * rows, 3);
    let ctx = Context::new(1 << 20).unwrap();
    let t = ctx.new_f32(&[2 * n, rows]).unwrap();
    t.write_f32(&x).unwrap();
    let half = |h: usize| {
        let v: Vec<f32> = x
            .chunks(2 * n)
            .flat_map(|r| r[h * n..(h + 1) * n].to_vec())
            .collect();
        let u = ctx.new_f32(&[n, rows]).unwrap();
        u.write_f32(&v).unwrap();
        u
    };
    let (gate, up) = (half(0), half(1));
    let joined = ctx.swiglu_halves(t).unwrap();
    assert_eq!(joined.ne()[..2], [n, rows]);
    let split = ctx.swiglu(gate, up).unwrap();
    ctx.graph_of(&[joined, split])
        .unwrap()
        .compute(&pool)
        .unwrap();
    let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
    joined.read_f32(&mut a).unwrap();
    split.read_f32(&mut b).unwrap();
    assert_eq!(a, b);
    for (i, &y) in a.iter().enumerate() {
        let (g, u) = (
            x[(i / n) * 2 * n + i % n] as f64,
            x[(i / n) * 2 * n + n + i % n] as f64,
        );
        let want = g / (1.0 + (-g).exp()) * u;
        assert!(
            (y as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
            "{i}: {y} vs {want}"
        );
    }
}

/// `set_rows` writes each source row at the row its index names when the graph runs (f32, and
/// f16 rounded as ggml rounds), leaves the other rows alone, and refuses shapes and types that
/// would make ggml abort; `zero_bytes` clears a byte range and refuses one past the data.
#[test]
fn set_rows_writes_at_run_time_indices() {
    let pool = Threadpool::new(2, &[]).unwrap();
    let ctx = Context::new(1 << 20).unwrap();
    let src = ctx.new_f32(&[4, 2]).unwrap();
    src.write_f32(&values(8, 3)).unwrap();
    let idx = ctx.new_i32(2).unwrap();
    for ty in [GgmlType::F32, GgmlType::F16] {
        let dst = ctx.new_tensor(ty, &[4, 5]).unwrap();
        let before = values(20, 9);
        let init = ctx.new_f32(&[4, 5]).unwrap();
        init.write_f32(&before).unwrap();
        ctx.graph(ctx.copy_into(init, dst).unwrap())
            .unwrap()
            .compute(&pool)
            .unwrap();
        let start = read(dst);
        idx.write_i32(&[3, 1]).unwrap();
        let w = ctx.set_rows(dst, src, idx).unwrap();
        ctx.graph(w).unwrap().compute(&pool).unwrap();
        let got = read(dst);
        let s = src.to_vec();
        let round = |x: f32| match ty {
            GgmlType::F16 => half_round(x),
            _ => x,
        };
        for r in 0..5 {
            let want: Vec<f32> = match r {
                3 => s[0..4].iter().map(|&x| round(x)).collect(),
                1 => s[4..8].iter().map(|&x| round(x)).collect(),
                _ => start[r * 4..r * 4 + 4].to_vec(),
            };
            assert_eq!(&got[r * 4..r * 4 + 4], &want[..], "{ty:?} row {r}");
        }
        // The same graph with other indices writes elsewhere.
        idx.write_i32(&[0, 4]).unwrap();
        ctx.graph(w).unwrap().compute(&pool).unwrap();
        let again = read(dst);
        assert_eq!(
            &again[0..4],
            &got[12..16],
            "{ty:?}: row 0 now holds source row 0"
        );
        let bytes = dst.nbytes();
        dst.zero_bytes(bytes / 5, bytes / 5).unwrap();
        assert!(read(dst)[4..8].iter().all(|&x| x == 0.0));
        assert!(dst.zero_bytes(bytes - 2, 4).is_err());
    }
    let what = |r: Result<qtts::ffi::Tensor<'_>, GgmlError>| match r {
        Err(GgmlError::Shape { what, .. }) => what,
        other => panic!("expected a shape error, got {other:?}"),
    };
    let dst = ctx.new_f32(&[4, 5]).unwrap();
    let narrow = ctx.new_f32(&[3, 2]).unwrap();
    assert_eq!(what(ctx.set_rows(dst, narrow, idx)), "set_rows");
    let three = ctx.new_i32(3).unwrap();
    assert_eq!(what(ctx.set_rows(dst, src, three)), "set_rows");
    // A q8_0 destination (the talker's caches) holds the rows as ggml's quantizer rounds them.
    let q = ctx.new_tensor(GgmlType::Q8_0, &[32, 2]).unwrap();
    let wide = ctx.new_f32(&[32, 2]).unwrap();
    let rows: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 7.0).collect();
    wide.write_f32(&rows).unwrap();
    let swap = ctx.new_i32(2).unwrap();
    swap.write_i32(&[1, 0]).unwrap();
    let w = ctx.set_rows(q, wide, swap).unwrap();
    ctx.graph(w).unwrap().compute(&pool).unwrap();
    let swapped: Vec<f32> = rows[32..].iter().chain(&rows[..32]).copied().collect();
    let want = qtts::ffi::quantize(GgmlType::Q8_0, &swapped, 32).unwrap();
    assert_eq!(q.read_bytes().unwrap(), want);
    // Other quantized destinations are refused.
    let q4 = ctx.new_tensor(GgmlType::Q4K, &[256, 2]).unwrap();
    let wide = ctx.new_f32(&[256, 2]).unwrap();
    assert_eq!(what(ctx.set_rows(q4, wide, swap)), "set_rows");
    assert_eq!(what(ctx.set_rows(dst, src, src)), "set_rows");
}

/// The values of an f32 or f16 tensor.
fn read(t: qtts::ffi::Tensor<'_>) -> Vec<f32> {
    let bytes = t.read_bytes().unwrap();
    if t.is_type(GgmlType::F16) {
        qtts::ffi::dequantize(GgmlType::F16, &bytes, t.n_elems()).unwrap()
    } else {
        t.to_vec()
    }
}

/// `x` rounded to the nearest f16 (ties to even), as ggml's conversion does.
fn half_round(x: f32) -> f32 {
    let b = x.to_bits();
    let exp = ((b >> 23) & 0xff) as i32 - 127;
    // Normal f16 range only (the test's values are).
    assert!((-14..=15).contains(&exp));
    let drop = 13;
    let mask = (1u32 << drop) - 1;
    let half = 1u32 << (drop - 1);
    let low = b & mask;
    let mut r = b & !mask;
    if low > half || (low == half && (r >> drop) & 1 == 1) {
        r += 1 << drop;
    }
    f32::from_bits(r)
}

/// `rows3_after` is `head`'s rows, then the row kernel of `x`'s, whatever the thread count; it
/// refuses shapes that do not line up.
#[test]
fn rows3_after_puts_the_kernel_rows_behind_the_head() {
    fn kernel(x: &[f32], b: &[f32], c: &[f32], y: &mut [f32]) {
        for i in 0..x.len() {
            y[i] = x[i] * b[i] + c[i];
        }
    }
    // A thread's share of the rows holds head rows, kernel rows or both.
    for (ne0, h, t, threads) in [(5, 3, 7, 1), (5, 3, 7, 2), (4, 7, 2, 2)] {
        let head = values(ne0 * h, 1);
        let x = values(ne0 * t, 2);
        let (b, c) = (values(ne0, 3), values(ne0, 4));
        let pool = Threadpool::new(threads, &[]).unwrap();
        let ctx = Context::new(1 << 20).unwrap();
        let th = ctx.new_f32(&[ne0, h]).unwrap();
        th.write_f32(&head).unwrap();
        let tx = ctx.new_f32(&[ne0, t]).unwrap();
        tx.write_f32(&x).unwrap();
        let tb = ctx.new_f32(&[ne0]).unwrap();
        tb.write_f32(&b).unwrap();
        let tc = ctx.new_f32(&[ne0]).unwrap();
        tc.write_f32(&c).unwrap();
        let y = ctx.rows3_after(th, tx, tb, tc, kernel).unwrap();
        assert_eq!(y.ne(), [ne0, h + t, 1, 1]);
        ctx.graph(y).unwrap().compute(&pool).unwrap();
        let got = y.to_vec();
        assert_eq!(
            &got[..ne0 * h],
            &head[..],
            "{threads} threads: the head's rows"
        );
        for (r, row) in got[ne0 * h..].chunks(ne0).enumerate() {
            for i in 0..ne0 {
                assert_eq!(
                    row[i],
                    x[r * ne0 + i] * b[i] + c[i],
                    "{threads} threads, row {r}"
                );
            }
        }
        let narrow = ctx.new_f32(&[ne0 - 1, h]).unwrap();
        assert!(matches!(
            ctx.rows3_after(narrow, tx, tb, tc, kernel),
            Err(GgmlError::Shape { .. })
        ));
        assert!(matches!(
            ctx.rows3_after(th, tx, tx, tc, kernel),
            Err(GgmlError::Shape { .. })
        ));
    }
}

/// f32 rows for `map_mat`: `y[j · y_stride + r] = w_r · x_j`.
#[allow(clippy::too_many_arguments)]
unsafe fn f32_rows(
    w: *const u8,
    row_bytes: usize,
    n: usize,
    k: usize,
    x: *const f32,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    for j in 0..m {
        for r in 0..n {
            // SAFETY: `map_mat` passes n rows of row_bytes at w, m inputs of k at x, and room
            // for every y index.
            unsafe {
                let wr = std::slice::from_raw_parts(w.add(r * row_bytes) as *const f32, k);
                let xj = std::slice::from_raw_parts(x.add(j * k), k);
                *y.add(j * y_stride + r) = wr.iter().zip(xj).map(|(a, b)| a * b).sum();
            }
        }
    }
}

/// `map_mat_with` folds the RMSNorm of its input and the residual add into the product's node:
/// the same values as ggml's `rms_norm`, `mul`, product and `add` (within float rounding), over
/// both threads' rows; shapes that do not fit are refused.
#[test]
fn map_mat_with_folds_the_norm_and_the_residual() {
    let pool = Threadpool::new(2, &[]).unwrap();
    let (k, n, m) = (48, 20, 3);
    let ctx = Context::new(1 << 20).unwrap();
    let tensor = |ne: &[usize], seed: usize| {
        let t = ctx.new_f32(ne).unwrap();
        t.write_f32(&values(ne.iter().product(), seed)).unwrap();
        t
    };
    let (w, x, g, r) = (
        tensor(&[k, n], 1),
        tensor(&[k, m], 2),
        tensor(&[k], 3),
        tensor(&[n, m], 4),
    );
    let eps = 1e-6;
    let folded = ctx
        .map_mat_with::<1>(w, x, Some((g, eps)), Some(r), f32_rows)
        .unwrap();
    let plain = ctx.map_mat_with::<1>(w, x, None, None, f32_rows).unwrap();
    let normed = ctx.mul(ctx.rms_norm(x, eps).unwrap(), g).unwrap();
    let reference = ctx.add(r, ctx.mul_mat(w, normed).unwrap()).unwrap();
    let product = ctx.mul_mat(w, x).unwrap();
    ctx.graph_of(&[folded, plain, reference, product])
        .unwrap()
        .compute(&pool)
        .unwrap();
    let read = |t: qtts::ffi::Tensor<'_>| {
        let mut v = vec![0f32; n * m];
        t.read_f32(&mut v).unwrap();
        v
    };
    for (got, want) in [
        (read(folded), read(reference)),
        (read(plain), read(product)),
    ] {
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{i}: {a} vs {b}");
        }
    }
    let what = |r: Result<qtts::ffi::Tensor<'_>, GgmlError>| match r {
        Err(GgmlError::Shape { what, .. }) => what,
        other => panic!("expected a shape error, got {other:?}"),
    };
    let short = tensor(&[k - 1], 5);
    let wrong = tensor(&[n, m + 1], 6);
    let with = |norm, res| ctx.map_mat_with::<1>(w, x, norm, res, f32_rows);
    assert_eq!(what(with(Some((short, eps)), None)), "map_mat norm");
    assert_eq!(what(with(None, Some(wrong))), "map_mat residual");
}

/// `attend_one` refuses what its kernel could not read safely: a row of another length, norms
/// of another width, caches of other shapes or types, and a position past the caches.
#[test]
fn attend_one_refuses_shapes_it_cannot_read() {
    unsafe fn never(_: &qtts::ffi::AttendOne, _: usize, _: usize) {
        unreachable!("a refused node never runs");
    }
    let ctx = Context::new(1 << 20).unwrap();
    let (nh, nkv, hd, n_ctx) = (4, 2, 8, 16);
    let f32s = |ne: &[usize]| ctx.new_f32(ne).unwrap();
    let qkv = f32s(&[hd * (nh + 2 * nkv)]);
    let norm = f32s(&[hd]);
    let (k, v) = (f32s(&[hd, nkv, n_ctx]), f32s(&[n_ctx, hd * nkv]));
    let heads = [nh, nkv, hd];
    let attend = |qkv, norm, k, v, pos| {
        ctx.attend_one(qkv, [norm, norm], [k, v], pos, heads, 1e-6, 1e4, never)
    };
    assert!(attend(qkv, norm, k, v, n_ctx - 1).is_ok());
    let what = |r: Result<qtts::ffi::Tensor<'_>, GgmlError>| match r {
        Err(GgmlError::Shape { what, .. }) => what,
        other => panic!("expected a shape error, got {other:?}"),
    };
    let short = f32s(&[hd * (nh + 2 * nkv) - 1]);
    let f16 = ctx
        .new_tensor(qtts::gguf::GgmlType::F16, &[hd, nkv, n_ctx])
        .unwrap();
    assert_eq!(what(attend(short, norm, k, v, 0)), "attend_one");
    assert_eq!(what(attend(qkv, f32s(&[hd + 1]), k, v, 0)), "attend_one");
    assert_eq!(
        what(attend(qkv, norm, f32s(&[hd, nkv + 1, n_ctx]), v, 0)),
        "attend_one"
    );
    assert_eq!(
        what(attend(qkv, norm, k, f32s(&[n_ctx - 1, hd * nkv]), 0)),
        "attend_one"
    );
    assert_eq!(what(attend(qkv, norm, f16, v, 0)), "attend_one");
    assert_eq!(what(attend(qkv, norm, k, v, n_ctx)), "attend_one");
}
