//! Matrix products over ggml's q8_0, q4_K and q5_K rows: the code predictor's and the talker's
//! layer matrices, and the packed sample heads.
//!
//! Each call quantizes its f32 inputs once, per block, to int8 with the scale
//! `dx = max|x| / 127` (ggml's q8 convention, up to the sign), into a per-thread scratch
//! (`with_inputs`); the weights' integer products with them are exact, and the float steps
//! are fixed per type (see [`q8_0`] and [`k_quants`]): the same operations in the same order for
//! each row on every tier, so every kernel gives its scalar twin's bits.
//!
//! The SIMD kernels read matrices packed [`GROUP`] rows at a time ([`pack`]: the same bytes in
//! another order, one vector lane per row), the scalar twins the file's rows as they are. Packing
//! does not depend on the tier: a matrix packed once is read by whichever kernel
//! [`packed_kernel`] picks.

pub mod k_quants;
pub mod q8_0;

use std::cell::RefCell;
use std::thread::LocalKey;

use super::{Features, MatKernel};

/// Rows per packed group: one row per 32-bit lane of a 512-bit vector (two 256-bit vectors,
/// four 128-bit ones).
pub const GROUP: usize = 16;

/// The quantized types these kernels multiply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QType {
    /// ggml's `Q8_0`: blocks of 32 weights, an f16 scale and 32 int8.
    Q8_0,
    /// ggml's `Q4_K`: blocks of 256 weights in 8 sub-blocks with 6-bit scales and mins.
    Q4K,
    /// ggml's `Q5_K`: `Q4_K` with a fifth bit per weight.
    Q5K,
}

impl QType {
    /// Every type, in ggml's order.
    pub const ALL: [QType; 3] = [QType::Q8_0, QType::Q4K, QType::Q5K];

    /// Weights per block.
    pub fn block(self) -> usize {
        match self {
            QType::Q8_0 => q8_0::BLOCK,
            QType::Q4K | QType::Q5K => k_quants::BLOCK,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QType::Q8_0 => q8_0::BLOCK_BYTES,
            QType::Q4K => k_quants::BLOCK_BYTES,
            QType::Q5K => k_quants::BLOCK_BYTES5,
        }
    }

    /// The type of ggml's type `t`, if it is one of these.
    pub fn of(t: crate::gguf::GgmlType) -> Option<QType> {
        use crate::gguf::GgmlType;
        match t {
            GgmlType::Q8_0 => Some(QType::Q8_0),
            GgmlType::Q4K => Some(QType::Q4K),
            GgmlType::Q5K => Some(QType::Q5K),
            _ => None,
        }
    }

    /// ggml's type.
    pub fn ggml(self) -> crate::gguf::GgmlType {
        use crate::gguf::GgmlType;
        match self {
            QType::Q8_0 => GgmlType::Q8_0,
            QType::Q4K => GgmlType::Q4K,
            QType::Q5K => GgmlType::Q5K,
        }
    }
}

/// Whether a matrix of `n` rows of `k` weights of type `ty` can be packed: whole groups of rows,
/// whole blocks (pairs of blocks for q8_0).
pub fn fits(ty: QType, n: usize, k: usize) -> bool {
    let unit = match ty {
        QType::Q8_0 => 2 * q8_0::BLOCK,
        QType::Q4K | QType::Q5K => k_quants::BLOCK,
    };
    n > 0 && n.is_multiple_of(GROUP) && k > 0 && k.is_multiple_of(unit)
}

/// Rearranges the `n` rows of `bytes` (of type `ty`, `bytes.len() / n` bytes each) into the
/// packed layout, in place; see [`fits`].
pub fn pack(ty: QType, bytes: &mut [u8], n: usize) {
    let row_bytes = bytes.len() / n;
    match ty {
        QType::Q8_0 => q8_0::pack(bytes, n, row_bytes),
        QType::Q4K => k_quants::pack(bytes, n, row_bytes),
        QType::Q5K => k_quants::pack5(bytes, n, row_bytes),
    }
}

/// Undoes [`pack`].
pub fn unpack(ty: QType, bytes: &mut [u8], n: usize) {
    let row_bytes = bytes.len() / n;
    match ty {
        QType::Q8_0 => q8_0::unpack(bytes, n, row_bytes),
        QType::Q4K => k_quants::unpack(bytes, n, row_bytes),
        QType::Q5K => k_quants::unpack5(bytes, n, row_bytes),
    }
}

/// The SIMD kernel for `ty`'s packed rows among `caps`, or `None` where `caps` has none (the
/// scalar tier: its callers multiply by ggml, and the tests by [`rows_kernel`]). Called on
/// packed groups only: whole groups of [`GROUP`] rows per call
/// ([`crate::ffi::Context::map_mat_in`] with `G` = [`GROUP`]).
pub fn packed_kernel(ty: QType, caps: Features) -> Option<MatKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86::{avx2, avx512_vnni, avx_vnni};
        if caps.avx512_vnni && caps.f16c {
            return Some(match ty {
                QType::Q8_0 => avx512_vnni::q8_0_packed,
                QType::Q4K => avx512_vnni::q4_k_packed,
                QType::Q5K => avx512_vnni::q5_k_packed,
            });
        }
        if caps.avx_vnni && caps.avx2 && caps.fma && caps.f16c {
            return Some(match ty {
                QType::Q8_0 => avx_vnni::q8_0_packed,
                QType::Q4K => avx_vnni::q4_k_packed,
                QType::Q5K => avx_vnni::q5_k_packed,
            });
        }
        if caps.avx2 && caps.fma && caps.f16c {
            return Some(match ty {
                QType::Q8_0 => avx2::q8_0_packed,
                QType::Q4K => avx2::q4_k_packed,
                QType::Q5K => avx2::q5_k_packed,
            });
        }
    }
    #[cfg(target_arch = "aarch64")]
    if caps.neon {
        use super::aarch64::neon::{dot, plain};
        return Some(match (ty, caps.dotprod) {
            (QType::Q8_0, true) => dot::q8_0_packed,
            (QType::Q4K, true) => dot::q4_k_packed,
            (QType::Q5K, true) => dot::q5_k_packed,
            (QType::Q8_0, false) => plain::q8_0_packed,
            (QType::Q4K, false) => plain::q4_k_packed,
            (QType::Q5K, false) => plain::q5_k_packed,
        });
    }
    let _ = (ty, caps);
    None
}

/// The scalar kernel for `ty` on the file's rows (unpacked): the definition of the arithmetic
/// every packed kernel reproduces bit for bit.
pub fn rows_kernel(ty: QType) -> MatKernel {
    match ty {
        QType::Q8_0 => q8_0::mat_scalar,
        QType::Q4K => k_quants::mat_scalar,
        QType::Q5K => k_quants::mat_scalar5,
    }
}

/// An input row quantized for a kernel.
pub(crate) trait Fill: Default {
    /// Quantizes `x` (a whole number of the kernel's blocks) into `self`, reusing its memory.
    fn fill(&mut self, x: &[f32]);
}

/// `t` (within ±127) rounded to the nearest integer, ties to even, as i8: adding and taking away
/// 1.5 · 2²³ leaves no fraction bits (a `roundf` call per value cost 3 % of the code predictor).
#[inline(always)]
pub(crate) fn to_i8(t: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    ((t + MAGIC) - MAGIC).clamp(-127.0, 127.0) as i8
}

/// Quantizes one block of inputs to int8 with the scale `d = max|x| / 127` (ggml's q8
/// convention, up to the sign), handing each value to `put(i, q)`; returns `d`.
#[inline]
pub(crate) fn quantize_block(xb: &[f32], mut put: impl FnMut(usize, i8)) -> f32 {
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
pub(crate) unsafe fn with_inputs<P: Fill, R>(
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

/// A group kernel: the products of the [`GROUP`] rows of the packed group at `grp` (`nb` blocks)
/// with `M` inputs, one array of row results per input.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) type GroupDots<P, const M: usize> =
    unsafe fn(grp: *const u8, nb: usize, ps: [&P; M]) -> [[f32; GROUP]; M];

/// A group kernel's [`MatKernel`]: the `m` inputs at `x` quantized into `scratch` (this
/// thread's), then every product of the `n / GROUP` packed groups at `w` (`row_bytes` a row,
/// blocks of `block` weights) with them, output `j` of row `r` at `y[j · y_stride + r]`, by the
/// kernels for one input and for two (`dots`: two inputs at a time share each group's decoding).
///
/// # Safety
/// As [`MatKernel`], with `w` at `n / GROUP` whole groups of the kernels' packing and `k` a
/// multiple of `block`, on a CPU with the kernels' features.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
/// # Safety
/// The CPU has the features of `kernel`, and the pointers and lengths are those of
/// [`MatKernel`]'s contract.
pub(crate) unsafe fn mat_groups<P: Fill>(
    scratch: &'static LocalKey<RefCell<Vec<P>>>,
    block: usize,
    dots: (GroupDots<P, 1>, GroupDots<P, 2>),
    (w, row_bytes, n, k): (*const u8, usize, usize, usize),
    (x, m): (*const f32, usize),
    (y, y_stride): (*mut f32, usize),
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

/// Defines a kernel module's three [`MatKernel`]s over packed groups, `q8_0_packed`,
/// `q4_k_packed` and `q5_k_packed`, from its group kernels `$q8::<M>` and `$q4::<M, Q5>` (the
/// products of one packed group with one or two inputs), through [`mat_groups`].
macro_rules! packed_kernels {
    ($q8:ident, $q4:ident) => {
        /// A [`crate::kernels::MatKernel`] for q8_0 rows packed by
        /// [`crate::kernels::quant::q8_0::pack`], on whole groups of 16 rows.
        ///
        /// # Safety
        /// As [`crate::kernels::MatKernel`], with `w` at `n / 16` packed groups, `k` a multiple
        /// of 64 and `row_bytes` `k / 32 · 34`; the CPU has this module's features.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn q8_0_packed(
            w: *const u8,
            row_bytes: usize,
            n: usize,
            k: usize,
            x: *const f32,
            m: usize,
            y: *mut f32,
            y_stride: usize,
        ) {
            use $crate::kernels::quant::{mat_groups, q8_0};
            let dots = ($q8::<1> as _, $q8::<2> as _);
            // SAFETY: the caller's contract.
            unsafe {
                mat_groups(
                    &q8_0::SCRATCH,
                    q8_0::BLOCK,
                    dots,
                    (w, row_bytes, n, k),
                    (x, m),
                    (y, y_stride),
                )
            }
        }

        /// [`q8_0_packed`] for q4_K rows packed by [`crate::kernels::quant::k_quants::pack`].
        ///
        /// # Safety
        /// As [`q8_0_packed`], with `k` a multiple of 256 and `row_bytes` `k / 256 · 144`.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn q4_k_packed(
            w: *const u8,
            row_bytes: usize,
            n: usize,
            k: usize,
            x: *const f32,
            m: usize,
            y: *mut f32,
            y_stride: usize,
        ) {
            use $crate::kernels::quant::{k_quants, mat_groups};
            let dots = ($q4::<1, false> as _, $q4::<2, false> as _);
            // SAFETY: the caller's contract.
            unsafe {
                mat_groups(
                    &k_quants::SCRATCH,
                    k_quants::BLOCK,
                    dots,
                    (w, row_bytes, n, k),
                    (x, m),
                    (y, y_stride),
                )
            }
        }

        /// [`q8_0_packed`] for q5_K rows packed by [`crate::kernels::quant::k_quants::pack5`].
        ///
        /// # Safety
        /// As [`q8_0_packed`], with `k` a multiple of 256 and `row_bytes` `k / 256 · 176`.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn q5_k_packed(
            w: *const u8,
            row_bytes: usize,
            n: usize,
            k: usize,
            x: *const f32,
            m: usize,
            y: *mut f32,
            y_stride: usize,
        ) {
            use $crate::kernels::quant::{k_quants, mat_groups};
            let dots = ($q4::<1, true> as _, $q4::<2, true> as _);
            // SAFETY: the caller's contract.
            unsafe {
                mat_groups(
                    &k_quants::SCRATCH,
                    k_quants::BLOCK,
                    dots,
                    (w, row_bytes, n, k),
                    (x, m),
                    (y, y_stride),
                )
            }
        }
    };
}
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(unused_imports)
)]
pub(crate) use packed_kernels;

/// Rows and inputs for the kernels' tests, and the checks every kernel passes.
#[cfg(test)]
pub(crate) mod testing {
    use super::super::{for_each_tier, MatKernel, Tier};
    use super::{QType, GROUP};
    use rand::{Rng, SeedableRng};

    /// `n` rows of `k` random weights quantized as `ty` (by ggml's quantizer), their dequantized
    /// values, and `m` input rows.
    pub fn case(
        ty: QType,
        n: usize,
        k: usize,
        m: usize,
        seed: u64,
    ) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-0.1f32..0.1)).collect();
        let q = crate::ffi::quantize(ty.ggml(), &w, k).unwrap();
        let deq = crate::ffi::dequantize(ty.ggml(), &q, n * k).unwrap();
        let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-2f32..2.0)).collect();
        (q, deq, x)
    }

    /// `kernel` on `n` rows of `q` (of `k` weights each) and the `m` rows of `x`.
    pub fn run(kernel: MatKernel, q: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
        let mut y = vec![f32::NAN; n * m];
        let row_bytes = q.len() / n;
        // SAFETY: n rows of row_bytes, m rows of k inputs, n · m outputs; the kernels the tests
        // pass come from `packed_kernel` for an available tier, or are scalar.
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

    /// A kernel's outputs `y` (`m` rows of `n`) against the f64 products of the dequantized rows
    /// `deq` (`n` of `k`) with the inputs `x` (`m` of `k`): each output within what rounding the
    /// inputs to int8 can move it, and all of them within 1 % (rms).
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

    /// The shapes every kernel is checked on: one group, several, one and two and three inputs
    /// (the kernels take inputs two at a time), and the longest rows of the models.
    pub const SHAPES: [(usize, usize, usize); 5] = [
        (16, 256, 1),
        (64, 1024, 1),
        (32, 3072, 2),
        (48, 512, 3),
        (GROUP, 6144, 1),
    ];

    /// For every tier this CPU runs that has a packed kernel for `ty`: the kernel on the packed
    /// rows gives, bit for bit, the scalar kernel's outputs on the rows as they are.
    pub fn check_packed_equals_scalar(ty: QType) {
        let mut ran = 0;
        for_each_tier(|tier: Tier| {
            for caps in tier.variants() {
                let Some(kernel) = super::packed_kernel(ty, caps) else {
                    continue;
                };
                ran += 1;
                check_kernel(ty, tier, kernel);
            }
        });
        eprintln!("{ty:?}: {ran} packed kernels checked against the scalar one");
    }

    /// [`check_packed_equals_scalar`] for one kernel.
    fn check_kernel(ty: QType, tier: Tier, kernel: MatKernel) {
        for (seed, &(n, k, m)) in SHAPES.iter().enumerate() {
            let (q, _, x) = case(ty, n, k, m, 40 + seed as u64);
            let want = run(super::rows_kernel(ty), &q, n, k, &x, m);
            let mut p = q.clone();
            super::pack(ty, &mut p, n);
            let got = run(kernel, &p, n, k, &x, m);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{ty:?} {tier}: {n}x{k}, {m} inputs, output {i}: scalar {a}, packed {b}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

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
            assert_eq!(to_i8(t), q, "{t}");
        }
        for t in (-1270..=1270).map(|i| i as f32 * 0.1 + 0.03) {
            assert_eq!(to_i8(t) as f32, t.round(), "{t}");
        }
        assert_eq!(to_i8(127.4), 127);
    }

    #[test]
    fn scalar_kernels_match_the_dequantized_rows_within_the_input_rounding() {
        for ty in QType::ALL {
            let (n, k, m) = (24, 1024, 2);
            let (q, deq, x) = case(ty, n, k, m, 1);
            let y = run(rows_kernel(ty), &q, n, k, &x, m);
            check_outputs(&y, &deq, &x, (n, k, m));
        }
    }

    #[test]
    fn packing_is_a_permutation_that_unpack_undoes() {
        for ty in QType::ALL {
            let (q, _, _) = case(ty, 32, 512, 1, 9);
            let mut p = q.clone();
            pack(ty, &mut p, 32);
            assert_ne!(p, q, "{ty:?}: packing moves bytes");
            let ones = |v: &[u8]| v.iter().map(|b| b.count_ones()).sum::<u32>();
            if ty != QType::Q8_0 {
                // q8_0's weights are stored with their top bit flipped (see `q8_0`).
                assert_eq!(ones(&p), ones(&q), "{ty:?}: the same bits");
            }
            unpack(ty, &mut p, 32);
            assert_eq!(p, q, "{ty:?}");
        }
    }

    #[test]
    fn packed_q8_0_kernels_give_the_scalar_kernel_s_bits() {
        check_packed_equals_scalar(QType::Q8_0);
    }

    #[test]
    fn packed_q4_k_kernels_give_the_scalar_kernel_s_bits() {
        check_packed_equals_scalar(QType::Q4K);
    }

    #[test]
    fn packed_q5_k_kernels_give_the_scalar_kernel_s_bits() {
        check_packed_equals_scalar(QType::Q5K);
    }

    /// A row's outputs do not depend on the rows beside it: each input row alone gives the bits
    /// it gets among 1 to 9 others (the batched talker and code predictor rely on it), for the
    /// scalar kernels and every packed kernel this CPU runs.
    #[test]
    fn each_row_s_outputs_are_its_own_whatever_the_rows_beside_it() {
        let mut kernels: Vec<(QType, String, MatKernel, bool)> = QType::ALL
            .into_iter()
            .map(|ty| (ty, "scalar".to_string(), rows_kernel(ty), false))
            .collect();
        crate::kernels::for_each_tier(|tier| {
            for ty in QType::ALL {
                for caps in tier.variants() {
                    if let Some(k) = packed_kernel(ty, caps) {
                        kernels.push((ty, format!("{tier} {caps:?}"), k, true));
                    }
                }
            }
        });
        for (ty, name, kernel, packed) in kernels {
            let (n, k, m) = (GROUP * 2, 512, 10);
            let (mut q, _, x) = case(ty, n, k, m, 90);
            if packed {
                pack(ty, &mut q, n);
            }
            let alone: Vec<Vec<u32>> = (0..m)
                .map(|r| {
                    let y = run(kernel, &q, n, k, &x[r * k..(r + 1) * k], 1);
                    y.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            for rows in 2..=m {
                let y = run(kernel, &q, n, k, &x[..rows * k], rows);
                for (r, want) in alone.iter().take(rows).enumerate() {
                    let got: Vec<u32> = y[r * n..(r + 1) * n].iter().map(|v| v.to_bits()).collect();
                    assert_eq!(
                        &got, want,
                        "{ty:?} {name}: row {r} of {rows} differs from alone"
                    );
                }
            }
        }
    }

    /// Every packed kernel also stays within the input rounding of the dequantized rows' exact
    /// products (so that a kernel and its twin cannot be wrong together), and q5_K's fifth bits
    /// matter: the rows with them cleared are far off.
    #[test]
    fn packed_kernels_match_the_dequantized_rows() {
        crate::kernels::for_each_tier(|tier| {
            for (ty, caps) in QType::ALL
                .into_iter()
                .flat_map(|ty| tier.variants().into_iter().map(move |c| (ty, c)))
            {
                let Some(kernel) = packed_kernel(ty, caps) else {
                    continue;
                };
                for (seed, &(n, k, m)) in SHAPES.iter().enumerate() {
                    let (q, deq, x) = case(ty, n, k, m, 60 + seed as u64);
                    let mut p = q.clone();
                    pack(ty, &mut p, n);
                    let got = run(kernel, &p, n, k, &x, m);
                    check_outputs(&got, &deq, &x, (n, k, m));
                    if ty == QType::Q5K {
                        let mut q4 = q.clone();
                        for blk in q4.chunks_exact_mut(k_quants::BLOCK_BYTES5) {
                            blk[16..48].fill(0);
                        }
                        pack(ty, &mut q4, n);
                        let without = run(kernel, &q4, n, k, &x, m);
                        let err = got
                            .iter()
                            .zip(&without)
                            .fold(0f32, |e, (a, b)| e.max((a - b).abs()));
                        assert!(err > 0.1, "{tier}: fifth bits ignored ({err})");
                    }
                }
            }
        });
    }
}
