//! q4_K matrix-vector products with AVX-512 VNNI, for the code predictor's layers: one
//! `vpdpbusd` multiplies 64 weight nibbles by 64 int8 inputs, where ggml's AVX2 kernel
//! (`ggml_vec_dot_q4_K_q8_K`) spent 82 % of the code predictor's time (PERFORMANCE.md).
//!
//! A q4_K block (ggml's `block_q4_K`, 144 bytes) holds 256 weights: f16 `d` and `dmin`, 12 bytes
//! of eight 6-bit scales `sc` and mins `m`, and 128 bytes of nibbles. Byte `l` of the 32-byte group
//! `g` holds weight `64g + l` in its low nibble and `64g + 32 + l` in its high one, and the weight
//! of nibble `q` in sub-block `j` (32 weights) is `d · sc_j · q − dmin · m_j`.
//!
//! The input is quantized once per call, per 256 values, to int8 with scale `dx = max|x| / 127`
//! (as ggml's `q8_K`, up to the sign convention), stored in the order the nibbles are read, with
//! each sub-block's sum times `dx` for the mins. A row's dot product is then
//! `Σ_blocks d · dx · Σ_j sc_j · (q · xq)_j − dmin · Σ_j m_j · dx · Σ xq_j`: integer products, one
//! float multiply-add per block.
//!
//! [`mat_scalar`] is the same arithmetic without SIMD: the reference of the tests and of
//! [`mat_vnni`], which the code predictor uses where [`available`] says the CPU has VNNI.

use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
use super::quant::{drive, Dots};
use super::quant::{quantize_block, with_inputs, Fill};

/// Weights per q4_K block.
pub const BLOCK: usize = 256;
/// Bytes per q4_K block.
pub const BLOCK_BYTES: usize = 144;

/// Whether this CPU runs [`mat_vnni`] and [`super::q8::mat_vnni`] (AVX-512 F, BW, VL, VNNI
/// and F16C).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The eight scales and eight mins of a block's 12 scale bytes, one per byte (ggml's
/// `get_scale_min_k4`, four at a time).
#[inline(always)]
fn scales_mins(s: &[u8]) -> (u64, u64) {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (a, b, c) = (word(0), word(4), word(8));
    let sc_lo = a & 0x3f3f_3f3f;
    let m_lo = b & 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | (((a >> 6) & 0x0303_0303) << 4);
    let m_hi = ((c >> 4) & 0x0f0f_0f0f) | (((b >> 6) & 0x0303_0303) << 4);
    (
        sc_lo as u64 | (sc_hi as u64) << 32,
        m_lo as u64 | (m_hi as u64) << 32,
    )
}

/// Where value `i` (0..256) of a block sits in the kernel's input order: for each half `c` of
/// the block (two 32-byte groups, one 64-byte load), the inputs of the low nibbles, then those of
/// the high nibbles.
#[inline(always)]
fn arranged(i: usize) -> usize {
    let (g, w) = (i / 64, i % 64);
    let (high, l) = (w / 32, w % 32);
    (g / 2) * 128 + high * 64 + (g % 2) * 32 + l
}

/// Input rows quantized for the kernels.
#[derive(Default)]
struct Prepared {
    /// Per block, 256 int8 values in [`arranged`] order.
    q: Vec<i8>,
    /// Per block, its scale.
    d: Vec<f32>,
    /// Per block, each sub-block's sum of `q` times the block's scale.
    xs: Vec<f32>,
}

impl Fill for Prepared {
    fn fill(&mut self, x: &[f32]) {
        let nb = x.len() / BLOCK;
        self.q.resize(nb * BLOCK, 0);
        self.d.resize(nb, 0.0);
        self.xs.resize(nb * 8, 0.0);
        for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
            let mut sums = [0i32; 8];
            let q = &mut self.q[b * BLOCK..(b + 1) * BLOCK];
            let d = quantize_block(xb, |i, v| {
                q[arranged(i)] = v;
                sums[i / 32] += v as i32;
            });
            self.d[b] = d;
            for (j, s) in sums.iter().enumerate() {
                self.xs[b * 8 + j] = d * *s as f32;
            }
        }
    }
}

thread_local! {
    /// The inputs of the current call, reused across calls on this thread.
    static SCRATCH: RefCell<Vec<Prepared>> = const { RefCell::new(Vec::new()) };
}

/// One row's dot product, scalar.
fn dot_scalar(row: &[u8], p: &Prepared) -> f32 {
    let mut sum = 0f32;
    for (b, blk) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let dmin = half::f16::from_le_bytes([blk[2], blk[3]]).to_f32();
        let (sc, m) = scales_mins(&blk[4..16]);
        let qs = &blk[16..];
        let xq = &p.q[b * BLOCK..(b + 1) * BLOCK];
        let mut isum = 0i32;
        let mut msum = 0f32;
        for j in 0..8 {
            let mut s = 0i32;
            for l in 0..32 {
                let i = 32 * j + l;
                let byte = qs[(i / 64) * 32 + l];
                let q = if j % 2 == 0 { byte & 15 } else { byte >> 4 };
                s += q as i32 * xq[arranged(i)] as i32;
            }
            isum += ((sc >> (8 * j)) & 0xff) as i32 * s;
            msum += ((m >> (8 * j)) & 0xff) as f32 * p.xs[b * 8 + j];
        }
        sum += d * p.d[b] * isum as f32 - dmin * msum;
    }
    sum
}

/// A [`crate::ffi::MatKernel`] for q4_K rows, scalar: the tests' reference.
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

/// A [`crate::ffi::MatKernel`] for q4_K rows with AVX-512 VNNI; only where [`available`].
///
/// # Safety
/// As [`mat_scalar`], on a CPU where [`available`] is true.
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
    use super::{scales_mins, Prepared, BLOCK, BLOCK_BYTES};
    use std::arch::x86_64::*;

    /// How far ahead of the block being read the kernel asks for the weights' cache lines.
    const AHEAD: usize = 4608;

    /// The products of `R` rows (each `nb` blocks) with `M` inputs; rows are interleaved block
    /// by block, so that each row's chain of dependent operations overlaps the others', and each
    /// block is decoded once for all inputs.
    ///
    /// # Safety
    /// Each row points at `nb` q4_K blocks, each input holds `nb` blocks; the CPU has the
    /// features of [`super::available`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn dots<const R: usize, const M: usize>(
        rows: [*const u8; R],
        nb: usize,
        ps: [&Prepared; M],
    ) -> [[f32; R]; M] {
        let mut acc = [[_mm256_setzero_ps(); M]; R];
        let mut macc = [[_mm256_setzero_ps(); M]; R];
        for b in 0..nb {
            for r in 0..R {
                let blk = rows[r].wrapping_add(b * BLOCK_BYTES);
                // The same block `AHEAD` bytes on: a hint only, never dereferenced here, so it
                // may point past the matrix.
                let next = blk.wrapping_add(AHEAD);
                _mm_prefetch::<_MM_HINT_T0>(next.cast());
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64).cast());
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(128).cast());
                // SAFETY: block b of each row and of the inputs (the caller's contract).
                unsafe { block(blk, b, ps, &mut acc[r], &mut macc[r]) };
            }
        }
        let mut out = [[0f32; R]; M];
        for r in 0..R {
            for j in 0..M {
                let v = _mm256_sub_ps(acc[r][j], macc[r][j]);
                let v = _mm256_add_ps(v, _mm256_permute2f128_ps::<1>(v, v));
                let v = _mm256_hadd_ps(v, v);
                let v = _mm256_hadd_ps(v, v);
                out[j][r] = _mm256_cvtss_f32(v);
            }
        }
        out
    }

    /// Adds block `b` of a row (at `blk`) times each input to its `acc` (scales) and `macc`
    /// (mins).
    #[inline(always)]
    unsafe fn block<const M: usize>(
        blk: *const u8,
        b: usize,
        ps: [&Prepared; M],
        acc: &mut [__m256; M],
        macc: &mut [__m256; M],
    ) {
        // SAFETY: the caller's contract (see `dots`).
        unsafe {
            let low = _mm512_set1_epi8(0x0f);
            let zero = _mm512_setzero_si512();
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(blk.cast::<i32>().read_unaligned()));
            let (d, dmin) = (_mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)));
            let (sc, m) = scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
            let qs = blk.add(16);
            let q0 = _mm512_loadu_si512(qs.cast());
            let q1 = _mm512_loadu_si512(qs.add(64).cast());
            // Nibbles of sub-blocks 0 | 2, 1 | 3, 4 | 6, 5 | 7 (64 bytes each).
            let nib = [
                _mm512_and_si512(q0, low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q0), low),
                _mm512_and_si512(q1, low),
                _mm512_and_si512(_mm512_srli_epi16::<4>(q1), low),
            ];
            let scv = _mm256_permutevar8x32_epi32(
                _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64)),
                _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7),
            );
            let mv = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(m as i64)));
            for (j, p) in ps.iter().enumerate() {
                let xq = p.q.as_ptr().add(b * BLOCK);
                let dp = |i: usize| {
                    _mm512_dpbusd_epi32(zero, nib[i], _mm512_loadu_si512(xq.add(64 * i).cast()))
                };
                let (a0, a1, a2, a3) = (dp(0), dp(1), dp(2), dp(3));
                // Sum each 8-lane half with shuffles: each 128-bit chunk c of u holds a0..a3
                // summed over lanes 4c..4c+4.
                let t0 =
                    _mm512_add_epi32(_mm512_unpacklo_epi32(a0, a1), _mm512_unpackhi_epi32(a0, a1));
                let t1 =
                    _mm512_add_epi32(_mm512_unpacklo_epi32(a2, a3), _mm512_unpackhi_epi32(a2, a3));
                let u =
                    _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
                let u = _mm512_add_epi32(u, _mm512_shuffle_i32x4::<0b10_11_00_01>(u, u));
                // Chunks 0 and 2: sub-blocks 0, 1, 4, 5 and 2, 3, 6, 7.
                let sums = _mm512_castsi512_si256(_mm512_permutexvar_epi32(
                    _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0),
                    u,
                ));
                let s = _mm256_cvtepi32_ps(_mm256_mullo_epi32(sums, scv));
                acc[j] = _mm256_fmadd_ps(s, _mm256_set1_ps(d * *p.d.get_unchecked(b)), acc[j]);
                let xs = _mm256_loadu_ps(p.xs.as_ptr().add(b * 8));
                macc[j] = _mm256_fmadd_ps(mv, _mm256_mul_ps(_mm256_set1_ps(dmin), xs), macc[j]);
            }
        }
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
        testing::check_against_dequantized(mat_scalar, GgmlType::Q4K);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vnni_kernel_equals_the_scalar_one() {
        if !available() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        testing::check_same(
            mat_scalar,
            mat_vnni,
            GgmlType::Q4K,
            &[(16, 1024, 1), (33, 3072, 2), (8, 256, 3)],
        );
    }
}
