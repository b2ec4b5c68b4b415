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
//! tests and of [`mat_vnni`].
//!
//! [`mat_vnni`] reads the file's rows, a few at a time, with 256-bit vectors and a horizontal
//! sum per row: it was compute-bound (PERFORMANCE.md, "The q8_0 rows packed 16 at a time").
//! [`pack`] rearranges a matrix in place, as [`super::q4k16`] does q4_K's, in groups of
//! [`GROUP`] rows and pairs of blocks, the bytes of a group the same bytes as its rows' with
//! each weight's top bit flipped (`q + 128`, the unsigned side of `vpdpbusd`). Pair `p` of a
//! group (2 × 16 × 34 = 1088 bytes, 17 cache lines, at `p · 1088`) holds:
//! - bytes 0..64: `d` (f16) of the 16 rows for block `2p`, then for block `2p + 1`;
//! - bytes 64..576 and 576..1088: blocks `2p` and `2p + 1`, each as 8 steps `t` of 64 bytes:
//!   weights `4t .. 4t + 4` of row 0, then row 1, … row 15.
//!
//! [`mat_packed`] keeps one 32-bit lane per row, so a `vpdpbusd` adds four weights of each of
//! 16 rows, and starts each block's integer sum at `−128 · Σ xq` instead of correcting in
//! float: `Σ (q + 128) · xq − 128 · Σ xq = Σ q · xq` exactly. The code predictor (and the
//! talker's own graph) use it where [`super::q4k::available`] says the CPU has VNNI.

use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
use super::quant::{drive, mat_groups, Dots};
use super::quant::{quantize_block, with_inputs, Fill};

/// Weights per q8_0 block.
pub const BLOCK: usize = 32;
/// Bytes per q8_0 block.
pub const BLOCK_BYTES: usize = crate::gguf::GgmlType::Q8_0.type_size() as usize;

/// Rows per packed group.
pub const GROUP: usize = super::quant::GROUP;
/// Bytes of a packed pair of blocks of a group.
const PAIR_BYTES: usize = 2 * GROUP * BLOCK_BYTES;

/// Input rows quantized for the kernels.
#[derive(Default)]
struct Prepared {
    /// The int8 values.
    q: Vec<i8>,
    /// Per block, its scale.
    d: Vec<f32>,
    /// Per block, `128 · dx · Σ q`: what the flipped top bit adds to the block's product.
    c: Vec<f32>,
    /// Per block, `−128 · Σ q`: where [`mat_packed`] starts the block's integer sum.
    start: Vec<i32>,
}

impl Fill for Prepared {
    fn fill(&mut self, x: &[f32]) {
        let nb = x.len() / BLOCK;
        self.q.resize(nb * BLOCK, 0);
        self.d.resize(nb, 0.0);
        self.c.resize(nb, 0.0);
        self.start.resize(nb, 0);
        for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
            let mut sum = 0i32;
            let q = &mut self.q[b * BLOCK..(b + 1) * BLOCK];
            let d = quantize_block(xb, |i, v| {
                q[i] = v;
                sum += v as i32;
            });
            self.d[b] = d;
            self.c[b] = 128.0 * d * sum as f32;
            self.start[b] = -128 * sum;
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

/// Whether a q8_0 matrix of `n` rows of `k` weights can be packed.
pub fn fits(n: usize, k: usize) -> bool {
    n > 0 && n.is_multiple_of(GROUP) && k > 0 && k.is_multiple_of(2 * BLOCK)
}

/// Where byte `i` of row `r`'s block `b` goes in its group's packed pair.
#[inline]
fn packed_offset(r: usize, b: usize, i: usize) -> usize {
    let h = b % 2;
    match i {
        0..2 => 32 * h + 2 * r + i,
        _ => {
            let (t, e) = ((i - 2) / 4, (i - 2) % 4);
            64 + 512 * h + 64 * t + 4 * r + e
        }
    }
}

/// Rearranges `q` (`n` q8_0 rows of `row_bytes`) into the packed layout, or back when
/// `!forward`. `q` must hold exactly `n` rows, `n` a multiple of [`GROUP`], of a whole number of
/// pairs of blocks.
fn permute(q: &mut [u8], n: usize, row_bytes: usize, forward: bool) {
    assert!(
        n.is_multiple_of(GROUP)
            && row_bytes.is_multiple_of(2 * BLOCK_BYTES)
            && q.len() == n * row_bytes,
        "q8_0 packing: {n} rows of {row_bytes} bytes in {} bytes",
        q.len()
    );
    let nb = row_bytes / BLOCK_BYTES;
    let mut tmp = vec![0u8; GROUP * row_bytes];
    for region in q.chunks_exact_mut(GROUP * row_bytes) {
        tmp.copy_from_slice(region);
        for b in 0..nb {
            let pair = b / 2 * PAIR_BYTES;
            for r in 0..GROUP {
                let raw = r * row_bytes + b * BLOCK_BYTES;
                for i in 0..BLOCK_BYTES {
                    // The weights' top bit flips both ways; the scale's bytes move as they are.
                    let flip = if i < 2 { 0 } else { 0x80 };
                    let at = pair + packed_offset(r, b, i);
                    if forward {
                        region[at] = tmp[raw + i] ^ flip;
                    } else {
                        region[raw + i] = tmp[at] ^ flip;
                    }
                }
            }
        }
    }
}

/// Packs `n` q8_0 rows of `row_bytes` in place (see the module's layout); see [`fits`].
pub fn pack(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, true);
}

/// Undoes [`pack`].
pub fn unpack(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, false);
}

/// A [`crate::ffi::MatKernel`] for q8_0 rows packed by [`pack`], with AVX-512 VNNI; only where
/// [`super::q4k::available`], and only on whole groups of [`GROUP`] rows (`n` a multiple of it,
/// `w` at a group's start: [`crate::ffi::Context::map_mat_in`] with `G` = [`GROUP`]).
///
/// # Safety
/// As [`crate::ffi::MatKernel`], with `w` pointing at `n / GROUP` packed groups; `k` is a
/// multiple of `2 · BLOCK` and `row_bytes` is `k / BLOCK · BLOCK_BYTES`; the CPU has the
/// features of [`super::q4k::available`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn mat_packed(
    w: *const u8,
    row_bytes: usize,
    n: usize,
    k: usize,
    x: *const f32,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let dots = (vnni::packed::<1> as _, vnni::packed::<2> as _);
    // SAFETY: the caller's contract: n / GROUP groups of GROUP · row_bytes bytes at w, m inputs
    // of k floats, outputs within y's rows.
    unsafe { mat_groups(&SCRATCH, BLOCK, dots, w, row_bytes, n, k, x, m, y, y_stride) }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{Prepared, BLOCK, BLOCK_BYTES, GROUP, PAIR_BYTES};
    use std::arch::x86_64::*;

    /// How far ahead of the pair being read [`packed`] asks for the weights' cache lines (into
    /// L2), in pairs of blocks: 17 KB.
    const AHEAD_PAIRS: usize = 16;

    /// The products of one packed group (16 rows of `nb` blocks at `grp`) with `M` inputs, one
    /// vector of 16 row results per input. Per block, the steps run in two independent chains
    /// (even and odd), so that `vpdpbusd`'s latency is not the loop's.
    ///
    /// # Safety
    /// `grp` points at `nb / 2` packed pairs, each input holds `nb` blocks; the CPU has the
    /// features of [`super::super::q4k::available`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn packed<const M: usize>(
        grp: *const u8,
        nb: usize,
        ps: [&Prepared; M],
    ) -> [[f32; GROUP]; M] {
        let mut acc = [_mm512_setzero_ps(); M];
        for b in 0..nb {
            let pair = grp.wrapping_add(b / 2 * PAIR_BYTES);
            // SAFETY: block b of the group and of each input (the caller's contract); the
            // prefetches are hints, never dereferenced, and may point past the matrix.
            unsafe {
                if b % 2 == 0 {
                    for l in 0..PAIR_BYTES / 64 {
                        _mm_prefetch::<_MM_HINT_T1>(
                            pair.wrapping_add(AHEAD_PAIRS * PAIR_BYTES + 64 * l).cast(),
                        );
                    }
                }
                let h = b % 2;
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(pair.add(32 * h).cast()));
                let q = pair.add(64 + 512 * h);
                let mut sum = [[_mm512_setzero_si512(); 2]; M];
                for (j, p) in ps.iter().enumerate() {
                    sum[j][0] = _mm512_set1_epi32(*p.start.get_unchecked(b));
                }
                for t in 0..8 {
                    let v = _mm512_loadu_si512(q.add(64 * t).cast());
                    for (j, p) in ps.iter().enumerate() {
                        let xq = p.q.as_ptr().add(b * BLOCK + 4 * t);
                        let x = _mm512_set1_epi32(xq.cast::<i32>().read_unaligned());
                        sum[j][t % 2] = _mm512_dpbusd_epi32(sum[j][t % 2], v, x);
                    }
                }
                for (j, p) in ps.iter().enumerate() {
                    let s = _mm512_cvtepi32_ps(_mm512_add_epi32(sum[j][0], sum[j][1]));
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(*p.d.get_unchecked(b)));
                    acc[j] = _mm512_fmadd_ps(s, scale, acc[j]);
                }
            }
        }
        let mut out = [[0f32; GROUP]; M];
        for (o, a) in out.iter_mut().zip(&acc) {
            // SAFETY: 16 floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
        }
        out
    }

    /// How far ahead of the block being read the kernel asks for the weights' cache lines (into
    /// L2). 4608 bytes into L1 streamed 13 % slower from memory (PERFORMANCE.md,
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

    #[test]
    fn packing_is_a_permutation_with_flipped_weights_that_unpack_undoes() {
        // Every byte of a pair is written once.
        let mut hit = vec![0u8; PAIR_BYTES];
        for r in 0..GROUP {
            for b in 0..2 {
                for i in 0..BLOCK_BYTES {
                    hit[packed_offset(r, b, i)] += 1;
                }
            }
        }
        assert!(hit.iter().all(|&h| h == 1), "{hit:?}");
        let (n, k) = (32, 256);
        let (q, _, _) = testing::case(GgmlType::Q8_0, n, k, 1, 3);
        let row_bytes = q.len() / n;
        let mut p = q.clone();
        pack(&mut p, n, row_bytes);
        // Row 17's block 3 (group 1, second block of pair 1): its scale and its weight 6
        // (step 1, byte 2), flipped.
        let (raw, pair) = (
            17 * row_bytes + 3 * BLOCK_BYTES,
            GROUP * row_bytes + PAIR_BYTES,
        );
        assert_eq!(p[pair + 32 + 2], q[raw]);
        assert_eq!(p[pair + 64 + 512 + 64 + 4 + 2], q[raw + 2 + 6] ^ 0x80);
        unpack(&mut p, n, row_bytes);
        assert_eq!(p, q);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_kernel_equals_the_scalar_one_and_the_dequantized_products() {
        if !super::super::q4k::available() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        for (seed, &(n, k, m)) in [(16, 64, 1), (64, 1024, 1), (32, 3072, 2), (48, 512, 3)]
            .iter()
            .enumerate()
        {
            let (q, deq, x) = testing::case(GgmlType::Q8_0, n, k, m, 50 + seed as u64);
            let want = testing::run(mat_scalar, &q, n, k, &x, m);
            let mut p = q.clone();
            pack(&mut p, n, q.len() / n);
            let got = testing::run(mat_packed, &p, n, k, &x, m);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                    "{n}x{k}, {m} inputs, output {i}: {a} vs {b}"
                );
            }
            testing::check_outputs(&got, &deq, &x, (n, k, m));
        }
    }
}
