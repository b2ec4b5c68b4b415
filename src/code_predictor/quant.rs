//! What the VNNI kernels of [`super::q4k`] and [`super::q8`] share: each call's input rows,
//! quantized once into a per-thread scratch, and the tests' cases.

use std::cell::RefCell;
use std::thread::LocalKey;

/// An input row quantized for a kernel.
pub(super) trait Fill: Default {
    /// Quantizes `x` (a whole number of the kernel's blocks) into `self`, reusing its memory.
    fn fill(&mut self, x: &[f32]);
}

/// `t` (within ±127) rounded to the nearest integer, ties to even, as i8: adding and taking away
/// 1.5 · 2²³ leaves no fraction bits (a `roundf` call per value cost 3 % of the code predictor).
#[inline(always)]
pub(super) fn to_i8(t: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    ((t + MAGIC) - MAGIC).clamp(-127.0, 127.0) as i8
}

/// Quantizes one block of inputs to int8 with the scale `d = max|x| / 127` (ggml's q8
/// convention, up to the sign), handing each value to `put(i, q)`; returns `d`.
#[inline]
pub(super) fn quantize_block(xb: &[f32], mut put: impl FnMut(usize, i8)) -> f32 {
    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    for (i, &v) in xb.iter().enumerate() {
        put(i, to_i8(v * inv));
    }
    amax / 127.0
}

/// Quantizes the `m` input rows at `x` (`k` values each) into `scratch` (this thread's) and
/// calls `f` with them.
///
/// # Safety
/// `x` points at `m · k` floats.
pub(super) unsafe fn with_inputs<P: Fill, R>(
    scratch: &'static LocalKey<RefCell<Vec<P>>>,
    x: *const f32,
    k: usize,
    m: usize,
    f: impl FnOnce(&[P]) -> R,
) -> R {
    scratch.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < m {
            s.resize_with(m, P::default);
        }
        for (j, p) in s.iter_mut().take(m).enumerate() {
            // SAFETY: row j of the caller's m rows of k floats.
            p.fill(unsafe { std::slice::from_raw_parts(x.add(j * k), k) });
        }
        f(&s[..m])
    })
}

/// A kernel's inner loop: the products of `R` rows with `M` inputs of its own kind.
pub(super) trait Dots: Fill {
    /// The products of the `R` rows at `rows` (`nb` blocks each) with the inputs `ps`.
    ///
    /// # Safety
    /// Each row points at `nb` of the kernel's blocks, each input holds `nb` blocks, and the CPU
    /// has the kernel's features.
    unsafe fn dots<const R: usize, const M: usize>(
        rows: [*const u8; R],
        nb: usize,
        ps: [&Self; M],
    ) -> [[f32; R]; M];
}

/// Every product of `n` rows at `w` (`row_bytes` apart, `nb` blocks each) with `inputs`, output
/// `j` of row `r` at `y[j · y_stride + r]`: two inputs at a time share each row's decoding, and a
/// lone input takes four rows at a time.
///
/// # Safety
/// As [`crate::ffi::MatKernel`], with `inputs` prepared from its `m` input rows, on a CPU with the
/// kernel's features.
pub(super) unsafe fn drive<P: Dots>(
    w: *const u8,
    row_bytes: usize,
    n: usize,
    nb: usize,
    inputs: &[P],
    y: *mut f32,
    y_stride: usize,
) {
    // SAFETY: the caller's contract; every row index stays below n and every input below m.
    unsafe {
        let mut j = 0;
        while j < inputs.len() {
            if j + 2 <= inputs.len() {
                let ys = [y.add(j * y_stride), y.add((j + 1) * y_stride)];
                rows::<P, 2, 2>(w, row_bytes, n, nb, [&inputs[j], &inputs[j + 1]], ys);
                j += 2;
            } else {
                rows::<P, 4, 1>(w, row_bytes, n, nb, [&inputs[j]], [y.add(j * y_stride)]);
                j += 1;
            }
        }
    }
}

/// Rows per packed group of the group kernels ([`super::q4k16`]'s, [`super::q8::mat_packed`]):
/// one row per 32-bit lane of a 512-bit vector.
pub(super) const GROUP: usize = 16;

/// A group kernel: the products of the [`GROUP`] rows of the packed group at `grp` (`nb` blocks)
/// with `M` inputs, one array of row results per input.
pub(super) type GroupDots<P, const M: usize> =
    unsafe fn(grp: *const u8, nb: usize, ps: [&P; M]) -> [[f32; GROUP]; M];

/// A group kernel's [`crate::ffi::MatKernel`]: the `m` inputs at `x` quantized into `scratch`
/// (this thread's), then every product of the `n / GROUP` packed groups at `w` (`row_bytes` a
/// row, blocks of `block` weights) with them, output `j` of row `r` at `y[j · y_stride + r]`, by
/// the kernels for one input and for two (`dots`: two inputs at a time share each group's
/// decoding).
///
/// # Safety
/// As [`crate::ffi::MatKernel`], with `w` at `n / GROUP` whole groups of the kernels' packing and
/// `k` a multiple of `block`, on a CPU with the kernels' features.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn mat_groups<P: Fill>(
    scratch: &'static LocalKey<RefCell<Vec<P>>>,
    block: usize,
    dots: (GroupDots<P, 1>, GroupDots<P, 2>),
    w: *const u8,
    row_bytes: usize,
    n: usize,
    k: usize,
    x: *const f32,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let (one, two) = dots;
    let (group_bytes, nb) = (GROUP * row_bytes, k / block);
    // SAFETY: the caller's contract; every group stays below n / GROUP, every input below m.
    unsafe {
        with_inputs(scratch, x, k, m, |inputs| {
            for grp in 0..n / GROUP {
                let (gw, r0) = (w.add(grp * group_bytes), grp * GROUP);
                let put = |j: usize, out: &[f32; GROUP]| {
                    std::ptr::copy_nonoverlapping(out.as_ptr(), y.add(j * y_stride + r0), GROUP)
                };
                let mut j = 0;
                while j < inputs.len() {
                    if j + 2 <= inputs.len() {
                        let out = two(gw, nb, [&inputs[j], &inputs[j + 1]]);
                        put(j, &out[0]);
                        put(j + 1, &out[1]);
                        j += 2;
                    } else {
                        put(j, &one(gw, nb, [&inputs[j]])[0]);
                        j += 1;
                    }
                }
            }
        })
    }
}

/// The products of all `n` rows with the inputs `ps`, `R` rows at a time, written at `ys`.
///
/// # Safety
/// As [`drive`].
unsafe fn rows<P: Dots, const R: usize, const M: usize>(
    w: *const u8,
    row_bytes: usize,
    n: usize,
    nb: usize,
    ps: [&P; M],
    ys: [*mut f32; M],
) {
    // SAFETY: the caller's contract; every row index stays below n.
    unsafe {
        let mut r = 0;
        while r + R <= n {
            let rows = std::array::from_fn(|i| w.add((r + i) * row_bytes));
            let out = P::dots::<R, M>(rows, nb, ps);
            for (y, o) in ys.iter().zip(&out) {
                std::ptr::copy_nonoverlapping(o.as_ptr(), y.add(r), R);
            }
            r += R;
        }
        for r in r..n {
            let out = P::dots::<1, M>([w.add(r * row_bytes)], nb, ps);
            for (y, o) in ys.iter().zip(&out) {
                *y.add(r) = o[0];
            }
        }
    }
}

/// Rows and inputs for the kernels' tests, and the two checks every kernel passes.
#[cfg(test)]
pub(super) mod testing {
    use crate::ffi::MatKernel;
    use crate::gguf::GgmlType;
    use rand::{Rng, SeedableRng};

    /// `n` rows of `k` random weights quantized as `ty`, their dequantized values, and `m`
    /// input rows.
    pub fn case(
        ty: GgmlType,
        n: usize,
        k: usize,
        m: usize,
        seed: u64,
    ) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-0.1f32..0.1)).collect();
        let q = crate::ffi::quantize(ty, &w, k).unwrap();
        let deq = crate::ffi::dequantize(ty, &q, n * k).unwrap();
        let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-2f32..2.0)).collect();
        (q, deq, x)
    }

    /// `kernel` on `n` rows of `q` (of `k` weights each) and the `m` rows of `x`.
    pub fn run(kernel: MatKernel, q: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![f32::NAN; n * m];
        let row_bytes = q.len() / n;
        // SAFETY: n rows of row_bytes, m rows of k inputs, n · m outputs.
        unsafe {
            kernel(
                q.as_ptr(),
                row_bytes,
                n,
                k,
                x.as_ptr(),
                m,
                y.as_mut_ptr(),
                n,
            )
        };
        y
    }

    /// `kernel` against the f64 products of the dequantized rows: each output within what
    /// rounding the inputs to int8 can move it, and all of them within 1 % (rms).
    pub fn check_against_dequantized(kernel: MatKernel, ty: GgmlType) {
        let (n, k, m) = (24, 1024, 2);
        let (q, deq, x) = case(ty, n, k, m, 1);
        let y = run(kernel, &q, n, k, &x, m);
        check_outputs(&y, &deq, &x, (n, k, m));
    }

    /// A kernel's outputs `y` (`m` rows of `n`) against the f64 products of the dequantized rows
    /// `deq` (`n` of `k`) with the inputs `x` (`m` of `k`), as [`check_against_dequantized`].
    pub fn check_outputs(y: &[f32], deq: &[f32], x: &[f32], (n, k, m): (usize, usize, usize)) {
        let (mut err2, mut sig2) = (0f64, 0f64);
        for j in 0..m {
            for r in 0..n {
                let row = &deq[r * k..(r + 1) * k];
                let xr = &x[j * k..(j + 1) * k];
                let exact: f64 = row.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                // Each input moves by at most half a step (max|x| / 254) when quantized.
                let bound: f64 = row.iter().map(|a| a.abs() as f64).sum::<f64>() * 2.0 / 254.0;
                let err = (y[j * n + r] as f64 - exact).abs();
                err2 += err * err;
                sig2 += exact * exact;
                assert!(
                    err <= bound,
                    "row {r} input {j}: {} vs {exact}, error {err} > {bound}",
                    y[j * n + r]
                );
            }
        }
        // The inputs' rounding moves the outputs by well under 1 % (rms); a misread weight by as
        // much as the outputs themselves.
        let rel = (err2 / sig2).sqrt();
        assert!(rel < 0.01, "relative rms error {rel}");
    }

    #[test]
    fn to_i8_rounds_to_nearest_with_ties_to_even() {
        for (t, q) in [
            (0.4, 0),
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.6, -1),
            (-126.5, -126),
        ] {
            assert_eq!(super::to_i8(t), q, "{t}");
        }
        for t in (-1270..=1270).map(|i| i as f32 * 0.1 + 0.03) {
            assert_eq!(super::to_i8(t) as f32, t.round(), "{t}");
        }
        assert_eq!(super::to_i8(127.4), 127);
    }

    /// `simd` against `scalar` on each `(n, k, m)`: the same integer sums, so only the order of
    /// the float sums may differ.
    pub fn check_same(
        scalar: MatKernel,
        simd: MatKernel,
        ty: GgmlType,
        shapes: &[(usize, usize, usize)],
    ) {
        for (seed, &(n, k, m)) in shapes.iter().enumerate() {
            let (q, _, x) = case(ty, n, k, m, seed as u64 + 2);
            let s = run(scalar, &q, n, k, &x, m);
            let v = run(simd, &q, n, k, &x, m);
            for (i, (a, b)) in s.iter().zip(&v).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                    "{n}x{k}, {m} inputs, output {i}: {a} vs {b}"
                );
            }
        }
    }
}
