//! q8_0 matrix-vector products with VNNI, for the code predictor's layers stored as q8_0: one
//! `vpdpbusd` multiplies a block's 32 weights by 32 int8 inputs, where ggml's AVX2 kernel
//! (`ggml_vec_dot_q8_0_q8_0`) runs below the memory bandwidth (PERFORMANCE.md).
//!
//! A q8_0 block (ggml's `block_q8_0`, 34 bytes) holds 32 weights: an f16 scale `d` and 32 int8
//! `q`, weight `d · q`. `vpdpbusd` takes one side unsigned, so the kernel reads `q + 128` (the
//! byte with its top bit flipped) and subtracts `128 · Σ xq`, a property of the input computed
//! once per call.
//!
//! The input is quantized once per call, per 32 values, to int8 with scale `dx = max|x| / 127`
//! (as ggml's `q8_0`). [`mat_scalar`] is the same arithmetic without SIMD: the reference of the
//! tests and of [`mat_vnni`], which the code predictor uses where [`super::q4k::available`] says
//! the CPU has VNNI.

use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
use super::quant::{drive, Dots};
use super::quant::{quantize_block, with_inputs, Fill};

/// Weights per q8_0 block.
pub const BLOCK: usize = 32;
/// Bytes per q8_0 block.
pub const BLOCK_BYTES: usize = 34;

/// Input rows quantized for the kernels.
#[derive(Default)]
struct Prepared {
    /// The int8 values.
    q: Vec<i8>,
    /// Per block, its scale.
    d: Vec<f32>,
    /// Per block, `128 · dx · Σ q`: what the flipped top bit adds to the block's product.
    c: Vec<f32>,
}

impl Fill for Prepared {
    fn fill(&mut self, x: &[f32]) {
        let nb = x.len() / BLOCK;
        self.q.resize(nb * BLOCK, 0);
        self.d.resize(nb, 0.0);
        self.c.resize(nb, 0.0);
        for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
            let mut sum = 0i32;
            let q = &mut self.q[b * BLOCK..(b + 1) * BLOCK];
            let d = quantize_block(xb, |i, v| {
                q[i] = v;
                sum += v as i32;
            });
            self.d[b] = d;
            self.c[b] = 128.0 * d * sum as f32;
        }
    }
}

thread_local! {
    /// The inputs of the current call, reused across calls on this thread.
    static SCRATCH: RefCell<Vec<Prepared>> = const { RefCell::new(Vec::new()) };
}

/// One row's dot product, scalar, with the kernel's arithmetic: `(q + 128) · xq` summed per
/// block, minus the input's correction.
fn dot_scalar(row: &[u8], p: &Prepared) -> f32 {
    let mut sum = 0f32;
    let mut corr = 0f32;
    for (b, blk) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let xq = &p.q[b * BLOCK..(b + 1) * BLOCK];
        let s: i32 = blk[2..]
            .iter()
            .zip(xq)
            .map(|(&w, &x)| (w ^ 0x80) as i32 * x as i32)
            .sum();
        sum += d * p.d[b] * s as f32;
        corr += d * p.c[b];
    }
    sum - corr
}

/// A [`crate::ffi::MatKernel`] for q8_0 rows, scalar: the tests' reference.
///
/// # Safety
/// As [`crate::ffi::MatKernel`]; `k` is a multiple of [`BLOCK`] and `row_bytes` is
/// `k / BLOCK · BLOCK_BYTES`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn mat_scalar(
    w: *const u8,
    row_bytes: usize,
    n: usize,
    k: usize,
    x: *const f32,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        with_inputs(&SCRATCH, x, k, m, |inputs| {
            for r in 0..n {
                let row = std::slice::from_raw_parts(w.add(r * row_bytes), row_bytes);
                for (j, p) in inputs.iter().enumerate() {
                    *y.add(j * y_stride + r) = dot_scalar(row, p);
                }
            }
        })
    }
}

/// A [`crate::ffi::MatKernel`] for q8_0 rows with VNNI; only where [`super::q4k::available`].
///
/// # Safety
/// As [`mat_scalar`], on a CPU where [`super::q4k::available`] is true.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn mat_vnni(
    w: *const u8,
    row_bytes: usize,
    n: usize,
    k: usize,
    x: *const f32,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        with_inputs(&SCRATCH, x, k, m, |inputs| {
            drive(w, row_bytes, n, k / BLOCK, inputs, y, y_stride)
        })
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{Prepared, BLOCK, BLOCK_BYTES};
    use std::arch::x86_64::*;

    /// How far ahead of the block being read the kernel asks for the weights' cache lines (into
    /// L2). 4608 bytes into L1 streamed 15 % slower from memory and from L3 (PERFORMANCE.md,
    /// "Prefetching into L2").
    const AHEAD: usize = 9216;

    /// The products of `R` rows (each `nb` blocks) with `M` inputs, rows interleaved block by
    /// block.
    ///
    /// # Safety
    /// Each row points at `nb` q8_0 blocks, each input holds `nb` blocks; the CPU has the
    /// features of [`super::super::q4k::available`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn dots<const R: usize, const M: usize>(
        rows: [*const u8; R],
        nb: usize,
        ps: [&Prepared; M],
    ) -> [[f32; R]; M] {
        let flip = _mm256_set1_epi8(-128);
        let zero = _mm256_setzero_si256();
        let mut acc = [[_mm256_setzero_ps(); M]; R];
        let mut corr = [[0f32; M]; R];
        for b in 0..nb {
            for r in 0..R {
                let blk = rows[r].wrapping_add(b * BLOCK_BYTES);
                // A hint only, never dereferenced here, so it may point past the matrix.
                _mm_prefetch::<_MM_HINT_T1>(blk.wrapping_add(AHEAD).cast());
                // SAFETY: block b of each row and of the inputs (the caller's contract).
                unsafe {
                    let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                        blk.cast::<u16>().read_unaligned() as i32,
                    )));
                    let q = _mm256_xor_si256(_mm256_loadu_si256(blk.add(2).cast()), flip);
                    for (j, p) in ps.iter().enumerate() {
                        let x = _mm256_loadu_si256(p.q.as_ptr().add(b * BLOCK).cast());
                        let s = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, q, x));
                        let scale = _mm256_set1_ps(d * *p.d.get_unchecked(b));
                        acc[r][j] = _mm256_fmadd_ps(s, scale, acc[r][j]);
                        corr[r][j] += d * *p.c.get_unchecked(b);
                    }
                }
            }
        }
        let mut out = [[0f32; R]; M];
        for r in 0..R {
            for j in 0..M {
                let v = acc[r][j];
                let v = _mm256_add_ps(v, _mm256_permute2f128_ps::<1>(v, v));
                let v = _mm256_hadd_ps(v, v);
                let v = _mm256_hadd_ps(v, v);
                out[j][r] = _mm256_cvtss_f32(v) - corr[r][j];
            }
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
impl Dots for Prepared {
    unsafe fn dots<const R: usize, const M: usize>(
        rows: [*const u8; R],
        nb: usize,
        ps: [&Self; M],
    ) -> [[f32; R]; M] {
        // SAFETY: the caller's contract, which includes the CPU's features.
        unsafe { vnni::dots::<R, M>(rows, nb, ps) }
    }
}

#[cfg(test)]
mod tests {
    use super::super::quant::testing;
    use super::*;
    use crate::gguf::GgmlType;

    #[test]
    fn scalar_kernel_matches_the_dequantized_rows_within_the_input_rounding() {
        testing::check_against_dequantized(mat_scalar, GgmlType::Q8_0);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vnni_kernel_equals_the_scalar_one() {
        if !super::super::q4k::available() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        testing::check_same(
            mat_scalar,
            mat_vnni,
            GgmlType::Q8_0,
            &[(16, 1024, 1), (33, 3072, 2), (9, 64, 3)],
        );
    }
}
