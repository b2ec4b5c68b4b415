//! q4_K matrix-vector products over rows packed 16 at a time, with AVX-512 VNNI: each 32-bit
//! lane of a vector is one row, so a `vpdpbusd` adds four weights of each of 16 rows times the
//! same four inputs, and no horizontal sum is needed until the end of a row. The kernel of
//! [`super::q4k`], which reads the file's rows as they are, was compute-bound: it spent as long
//! per block on a matrix in L2 as on one streamed from memory (PERFORMANCE.md).
//!
//! [`pack`] rearranges a q4_K matrix in place, in groups of [`GROUP`] rows; the bytes of a group
//! are the same bytes as its 16 rows', so the matrix keeps its size and [`unpack`] restores it.
//! Block `b` of a group (16 × 144 = 2304 bytes at `b · 2304` from the group's start) holds:
//! - bytes 0..192: the 12 scale bytes of each row as three little-endian words `a`, `b`, `c`,
//!   each as 16 consecutive words (one per row);
//! - bytes 192..224 and 224..256: `d` and `dmin` of the 16 rows (f16);
//! - bytes 256..2304: for each 32-byte nibble group `g` (0..4) and each 4-byte step `t` (0..8) of
//!   it, 64 bytes: bytes `32g + 4t .. 32g + 4t + 4` of the nibbles of row 0, then row 1, … row 15.
//!
//! q5_K rows (176 bytes per block: the same `d`, `dmin` and scales, then 32 bytes `qh` of fifth
//! bits before the same 128 nibble bytes) pack the same way ([`pack5`], [`mat_vnni5`]), with
//! their fifth bits between the halves: a packed block (16 × 176 = 2816 bytes) holds the scales
//! and `d`, `dmin` at bytes 0..256 as above, then at 256..768, for each nibble group `g` and step
//! `t`, two 64-bit masks (low nibbles, then high) whose bit `4r + e` is the fifth bit of the
//! weight held by byte `4r + e` of that step's 64 nibble bytes, then the nibbles at 768..2816.
//! The kernel adds 16 to the weights whose bit is set (a masked byte add) before the products.
//!
//! The input is quantized as for [`super::q4k`] (per 256 values, `dx = max|x| / 127`), kept in
//! its natural order with each sub-block's integer sum; a row's product is
//! `Σ_blocks dx · (d · Σ_j sc_j · (q · xq)_j − dmin · Σ_j m_j · Σ xq_j)`. The tests hold
//! [`mat_vnni`] on packed rows to [`super::q4k::mat_scalar`] on the same rows unpacked.

use std::cell::RefCell;

use super::q4k::{BLOCK, BLOCK_BYTES};
#[cfg(target_arch = "x86_64")]
use super::quant::mat_groups;
use super::quant::{quantize_block, Fill};

/// Rows per packed group.
pub const GROUP: usize = super::quant::GROUP;
/// Bytes of one block of a packed group.
const GROUP_BLOCK: usize = GROUP * BLOCK_BYTES;
/// Bytes of one q5_K block.
pub const BLOCK_BYTES5: usize = 176;
/// Bytes of one block of a packed q5_K group.
const GROUP_BLOCK5: usize = GROUP * BLOCK_BYTES5;
/// Where a packed q5_K block's masks start, and its nibbles.
const MASKS5: usize = 256;
const NIBBLES5: usize = 768;

/// Whether a q4_K matrix of `n` rows of `k` weights can be packed.
pub fn fits(n: usize, k: usize) -> bool {
    n > 0 && n.is_multiple_of(GROUP) && k > 0 && k.is_multiple_of(BLOCK)
}

/// Where byte `i` of row `r`'s block goes in its group's packed block.
#[inline]
fn packed_offset(r: usize, i: usize) -> usize {
    match i {
        0..2 => 192 + 2 * r + i,
        2..4 => 224 + 2 * r + (i - 2),
        4..16 => (i - 4) / 4 * 64 + 4 * r + (i - 4) % 4,
        _ => {
            let q = i - 16;
            let (g, t, e) = (q / 32, q % 32 / 4, q % 4);
            256 + (g * 8 + t) * 64 + 4 * r + e
        }
    }
}

/// Where byte `i` of row `r`'s q5_K block goes in its group's packed block, for the bytes that
/// move whole (`d`, `dmin`, the scales and the nibbles, not `qh` at 16..48): q4_K's places, the
/// nibbles after the masks.
#[inline]
fn packed_offset5(r: usize, i: usize) -> usize {
    match i {
        0..16 => packed_offset(r, i),
        _ => packed_offset(r, i - 32) - 256 + NIBBLES5,
    }
}

/// Rearranges `q` (`n` q4_K rows of `row_bytes`, or q5_K when `five`) into the packed layout, or
/// back when `!forward`. `q` must hold exactly `n` rows, `n` a multiple of [`GROUP`].
fn permute(q: &mut [u8], n: usize, row_bytes: usize, five: bool, forward: bool) {
    let (block_bytes, group_block) = if five {
        (BLOCK_BYTES5, GROUP_BLOCK5)
    } else {
        (BLOCK_BYTES, GROUP_BLOCK)
    };
    assert!(
        n.is_multiple_of(GROUP)
            && row_bytes.is_multiple_of(block_bytes)
            && q.len() == n * row_bytes,
        "q{}_K packing: {n} rows of {row_bytes} bytes in {} bytes",
        if five { 5 } else { 4 },
        q.len()
    );
    let nb = row_bytes / block_bytes;
    let mut tmp = vec![0u8; GROUP * row_bytes];
    for region in q.chunks_exact_mut(GROUP * row_bytes) {
        tmp.copy_from_slice(region);
        // q5_K's masks (forward) or qh bytes (back) are built bit by bit below.
        region.fill(0);
        for b in 0..nb {
            let packed = |i: usize| b * group_block + i;
            for r in 0..GROUP {
                let raw = r * row_bytes + b * block_bytes;
                // d, dmin, the scales and the nibbles; q5_K's nibbles come after its qh bytes
                // in a row and after its masks in a group.
                let bytes = (0..16).chain(if five { 48 } else { 16 }..block_bytes);
                for i in bytes {
                    let at = if five {
                        packed_offset5(r, i)
                    } else {
                        packed_offset(r, i)
                    };
                    if forward {
                        region[packed(at)] = tmp[raw + i];
                    } else {
                        region[raw + i] = tmp[packed(at)];
                    }
                }
                if !five {
                    continue;
                }
                // Fifth bits: weight l of nibble group g has bit 2g (low nibble) or 2g + 1
                // (high) of qh[l]; l = 4t + e sits at byte 4r + e of step t.
                for g in 0..4 {
                    for t in 0..8 {
                        for h in 0..2 {
                            let m = packed(mask_offset(g, t, h));
                            for e in 0..4 {
                                let (qh, bit) = (raw + 16 + 4 * t + e, 2 * g + h);
                                let (byte, mbit) = (m + (4 * r + e) / 8, (4 * r + e) % 8);
                                if forward {
                                    region[byte] |= (tmp[qh] >> bit & 1) << mbit;
                                } else {
                                    region[qh] |= (tmp[byte] >> mbit & 1) << bit;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Offset in a packed q5_K block of mask `h` (0: low nibbles, 1: high) of nibble group `g`, step
/// `t`.
fn mask_offset(g: usize, t: usize, h: usize) -> usize {
    MASKS5 + ((g * 8 + t) * 2 + h) * 8
}

/// Packs `n` q4_K rows of `row_bytes` in place (see the module's layout); `n` must be a
/// multiple of [`GROUP`] (see [`fits`]).
pub fn pack(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, false, true);
}

/// Undoes [`pack`].
pub fn unpack(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, false, false);
}

/// Packs `n` q5_K rows of `row_bytes` in place (see the module's layout); `n` must be a
/// multiple of [`GROUP`] (see [`fits`]).
pub fn pack5(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, true, true);
}

/// Undoes [`pack5`].
pub fn unpack5(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, true, false);
}

/// An input row quantized for [`mat_vnni`], in its natural order.
#[derive(Default)]
struct Natural {
    /// 256 int8 values per block.
    q: Vec<i8>,
    /// Per block, its scale.
    d: Vec<f32>,
    /// Per block, its eight sub-block sums of `q` as four pairs of 16-bit halves, in the order
    /// the kernel's mins are paired: (s0, s2), (s1, s3), (s4, s6), (s5, s7), low half first.
    /// A sum is at most 32 · 127 in magnitude, so it fits.
    min_pairs: Vec<i32>,
}

impl Fill for Natural {
    fn fill(&mut self, x: &[f32]) {
        let nb = x.len() / BLOCK;
        self.q.resize(nb * BLOCK, 0);
        self.d.resize(nb, 0.0);
        self.min_pairs.resize(nb * 4, 0);
        for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
            let mut sums = [0i32; 8];
            let q = &mut self.q[b * BLOCK..(b + 1) * BLOCK];
            self.d[b] = quantize_block(xb, |i, v| {
                q[i] = v;
                sums[i / 32] += v as i32;
            });
            let pair = |lo: i32, hi: i32| {
                (lo as i16 as u16 as u32 | (hi as i16 as u16 as u32) << 16) as i32
            };
            self.min_pairs[b * 4..b * 4 + 4].copy_from_slice(&[
                pair(sums[0], sums[2]),
                pair(sums[1], sums[3]),
                pair(sums[4], sums[6]),
                pair(sums[5], sums[7]),
            ]);
        }
    }
}

thread_local! {
    /// The inputs of the current call, reused across calls on this thread.
    static SCRATCH: RefCell<Vec<Natural>> = const { RefCell::new(Vec::new()) };
}

/// A [`crate::ffi::MatKernel`] for q4_K rows packed by [`pack`], with AVX-512 VNNI; only where
/// [`super::q4k::available`], and only on whole groups of [`GROUP`] rows (`n` a multiple of it,
/// `w` at a group's start: [`crate::ffi::Context::map_mat_in`] with `G` = [`GROUP`]).
///
/// # Safety
/// As [`crate::ffi::MatKernel`], with `w` pointing at `n / GROUP` packed groups; `k` is a
/// multiple of [`BLOCK`] and `row_bytes` is `k / BLOCK · BLOCK_BYTES`; the CPU has the
/// features of [`super::q4k::available`].
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
    unsafe { mat::<false>(w, row_bytes, n, k, x, m, y, y_stride) }
}

/// [`mat_vnni`] for q5_K rows packed by [`pack5`].
///
/// # Safety
/// As [`mat_vnni`], with `w` pointing at `n / GROUP` groups packed by [`pack5`] and `row_bytes`
/// `k / BLOCK · BLOCK_BYTES5`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn mat_vnni5(
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
    unsafe { mat::<true>(w, row_bytes, n, k, x, m, y, y_stride) }
}

/// [`mat_vnni`] (`Q5` false) and [`mat_vnni5`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn mat<const Q5: bool>(
    w: *const u8,
    row_bytes: usize,
    n: usize,
    k: usize,
    x: *const f32,
    m: usize,
    y: *mut f32,
    y_stride: usize,
) {
    let dots = (vnni::dots::<1, Q5> as _, vnni::dots::<2, Q5> as _);
    // SAFETY: the caller's contract: n / GROUP groups of GROUP · row_bytes bytes at w, m inputs
    // of k floats, outputs within y's rows.
    unsafe { mat_groups(&SCRATCH, BLOCK, dots, w, row_bytes, n, k, x, m, y, y_stride) }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use super::{mask_offset, Natural, BLOCK, GROUP, GROUP_BLOCK, GROUP_BLOCK5, NIBBLES5};
    use std::arch::x86_64::*;

    /// How far ahead of the block being read the kernel asks for the weights' cache lines (into
    /// L2), in blocks: 18 KB of q4_K, 22 KB of q5_K. Into L1 and 4 blocks ahead, the kernel
    /// streamed 13 % slower from memory (PERFORMANCE.md, "Prefetching into L2").
    const AHEAD: usize = 8;

    /// Scale or min `s` (0..8) of the 16 rows, from the unpacked low (`s < 4`) and high words
    /// (a macro, so that the intrinsics inline into the caller's target features).
    macro_rules! byte_of {
        ($lo:expr, $hi:expr, $s:expr) => {{
            let s: usize = $s;
            let w = if s < 4 { $lo } else { $hi };
            _mm512_and_si512(
                _mm512_srlv_epi32(w, _mm512_set1_epi32(8 * (s % 4) as i32)),
                _mm512_set1_epi32(0xff),
            )
        }};
    }

    /// The products of one packed group (16 rows of `nb` blocks at `grp`, q5_K when `Q5`, else
    /// q4_K) with `M` inputs, one vector of 16 row results per input.
    ///
    /// Per block: the nibble products run in two independent chains per sub-block (even and
    /// odd 4-byte steps), so that `vpdpbusd`'s latency is not the loop's; each sub-block's sum is
    /// scaled in float (`sc · d`) rather than by an integer multiply; the mins' term is four
    /// `vpdpwssd` of the rows' mins (as 16-bit pairs) with the input's sub-block sums.
    ///
    /// # Safety
    /// `grp` points at `nb` packed blocks, each input holds `nb` blocks; the CPU has the
    /// features of [`super::super::q4k::available`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn dots<const M: usize, const Q5: bool>(
        grp: *const u8,
        nb: usize,
        ps: [&Natural; M],
    ) -> [[f32; GROUP]; M] {
        let block_bytes = if Q5 { GROUP_BLOCK5 } else { GROUP_BLOCK };
        let sixteen = _mm512_set1_epi8(16);
        // Opaque to the compiler: knowing that `v & low` leaves bit 4 clear, it turns the masked
        // add of 16 below into an OR and a masked move, two instructions instead of one.
        let low = std::hint::black_box(_mm512_set1_epi8(0x0f));
        let high = _mm512_set1_epi8(0xf0u8 as i8);
        let m6 = _mm512_set1_epi32(0x3f3f_3f3f);
        let m4 = _mm512_set1_epi32(0x0f0f_0f0f);
        let m2 = _mm512_set1_epi32(0x0303_0303);
        let even = _mm512_set1_epi32(0x00ff_00ff);
        let mut acc = [_mm512_setzero_ps(); M];
        for b in 0..nb {
            let blk = grp.wrapping_add(b * block_bytes);
            // SAFETY: block b of the group and of each input (the caller's contract); the
            // prefetches are hints, never dereferenced, and may point past the matrix.
            unsafe {
                for l in 0..block_bytes / 64 {
                    _mm_prefetch::<_MM_HINT_T1>(
                        blk.wrapping_add(AHEAD * block_bytes + 64 * l).cast(),
                    );
                }
                let a = _mm512_loadu_si512(blk.cast());
                let bw = _mm512_loadu_si512(blk.add(64).cast());
                let c = _mm512_loadu_si512(blk.add(128).cast());
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(192).cast()));
                let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(224).cast()));
                let sc_lo = _mm512_and_si512(a, m6);
                let m_lo = _mm512_and_si512(bw, m6);
                let sc_hi = _mm512_or_si512(
                    _mm512_and_si512(c, m4),
                    _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(a), m2)),
                );
                let m_hi = _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi32::<4>(c), m4),
                    _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(bw), m2)),
                );
                let qs = blk.add(if Q5 { NIBBLES5 } else { 256 });
                let mut fsum = [_mm512_setzero_ps(); M];
                for g in 0..4 {
                    let mut lo_acc = [[_mm512_setzero_si512(); 2]; M];
                    let mut hi_acc = [[_mm512_setzero_si512(); 2]; M];
                    for t in 0..8 {
                        let v = _mm512_loadu_si512(qs.add((g * 8 + t) * 64).cast());
                        let mut lo = _mm512_and_si512(v, low);
                        // q4_K's high nibbles stay where they are, 16 times their value (the
                        // sub-block's scale is divided by 16 below); q5_K's, shifted down, get
                        // their fifth bit added.
                        let hi = if Q5 {
                            let bits = |h| _load_mask64(blk.add(mask_offset(g, t, h)).cast());
                            lo = _mm512_mask_add_epi8(lo, bits(0), lo, sixteen);
                            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                            _mm512_mask_add_epi8(hi, bits(1), hi, sixteen)
                        } else {
                            _mm512_and_si512(v, high)
                        };
                        for j in 0..M {
                            let xq = ps[j].q.as_ptr().add(b * BLOCK + 64 * g + 4 * t);
                            let xl = _mm512_set1_epi32(xq.cast::<i32>().read_unaligned());
                            let xh = _mm512_set1_epi32(xq.add(32).cast::<i32>().read_unaligned());
                            lo_acc[j][t % 2] = _mm512_dpbusd_epi32(lo_acc[j][t % 2], lo, xl);
                            hi_acc[j][t % 2] = _mm512_dpbusd_epi32(hi_acc[j][t % 2], hi, xh);
                        }
                    }
                    let s0 = _mm512_cvtepi32_ps(byte_of!(sc_lo, sc_hi, 2 * g));
                    let s1 = _mm512_cvtepi32_ps(byte_of!(sc_lo, sc_hi, 2 * g + 1));
                    // Exact: a power of two, and the high sums are below 2^24.
                    let s1 = if Q5 {
                        s1
                    } else {
                        _mm512_mul_ps(s1, _mm512_set1_ps(1.0 / 16.0))
                    };
                    for j in 0..M {
                        let lo = _mm512_add_epi32(lo_acc[j][0], lo_acc[j][1]);
                        let hi = _mm512_add_epi32(hi_acc[j][0], hi_acc[j][1]);
                        fsum[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), s0, fsum[j]);
                        fsum[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), s1, fsum[j]);
                    }
                }
                // The mins as 16-bit pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) of each row.
                let mins = [
                    _mm512_and_si512(m_lo, even),
                    _mm512_and_si512(_mm512_srli_epi32::<8>(m_lo), even),
                    _mm512_and_si512(m_hi, even),
                    _mm512_and_si512(_mm512_srli_epi32::<8>(m_hi), even),
                ];
                for j in 0..M {
                    let pairs = ps[j].min_pairs.as_ptr().add(b * 4);
                    let mut msum = _mm512_setzero_si512();
                    for (p, &mp) in mins.iter().enumerate() {
                        msum = _mm512_dpwssd_epi32(msum, mp, _mm512_set1_epi32(*pairs.add(p)));
                    }
                    let dx = _mm512_set1_ps(*ps[j].d.as_ptr().add(b));
                    acc[j] = _mm512_fmadd_ps(fsum[j], _mm512_mul_ps(d, dx), acc[j]);
                    acc[j] =
                        _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, dx), acc[j]);
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
}

#[cfg(test)]
mod tests {
    use super::super::q4k;
    use super::super::quant::testing;
    use super::*;
    use crate::gguf::GgmlType;

    #[test]
    fn packing_is_a_permutation_that_unpack_undoes() {
        let (q, _, _) = testing::case(GgmlType::Q4K, 32, 512, 1, 9);
        let row_bytes = q.len() / 32;
        let mut p = q.clone();
        pack(&mut p, 32, row_bytes);
        assert_ne!(p, q, "packing moves bytes");
        let (mut a, mut b) = (p.clone(), q.clone());
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "the same bytes");
        unpack(&mut p, 32, row_bytes);
        assert_eq!(p, q);
        // Every offset of a group block is hit once.
        let mut hit = vec![0u8; GROUP_BLOCK];
        for r in 0..GROUP {
            for i in 0..BLOCK_BYTES {
                hit[packed_offset(r, i)] += 1;
            }
        }
        assert!(hit.iter().all(|&h| h == 1));
    }

    #[test]
    fn q5_packing_moves_every_bit_and_unpack_undoes_it() {
        let (q, _, _) = testing::case(GgmlType::Q5K, 32, 512, 1, 9);
        let row_bytes = q.len() / 32;
        assert_eq!(row_bytes, 2 * BLOCK_BYTES5);
        let mut p = q.clone();
        pack5(&mut p, 32, row_bytes);
        assert_ne!(p, q, "packing moves bytes");
        let ones = |v: &[u8]| v.iter().map(|b| b.count_ones()).sum::<u32>();
        assert_eq!(ones(&p), ones(&q), "the same bits");
        unpack5(&mut p, 32, row_bytes);
        assert_eq!(p, q);
        // Every byte of a packed block is written by exactly one byte or bit of the rows.
        let mut hit = vec![0u32; GROUP_BLOCK5];
        for r in 0..GROUP {
            for i in (0..16).chain(48..BLOCK_BYTES5) {
                hit[packed_offset5(r, i)] += 8;
            }
            for (g, t, h, e) in (0..4 * 8 * 2 * 4).map(|i| (i / 64, i / 8 % 8, i / 4 % 2, i % 4)) {
                hit[mask_offset(g, t, h) + (4 * r + e) / 8] += 1;
            }
        }
        assert!(hit.iter().all(|&h| h == 8), "{hit:?}");
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_q5_kernel_equals_the_dequantized_rows_products() {
        if !q4k::available() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        for (seed, &(n, k, m)) in [(16, 256, 1), (64, 1024, 1), (32, 3072, 2), (48, 512, 3)]
            .iter()
            .enumerate()
        {
            let (q, deq, x) = testing::case(GgmlType::Q5K, n, k, m, 60 + seed as u64);
            let mut p = q.clone();
            pack5(&mut p, n, q.len() / n);
            let got = testing::run(mat_vnni5, &p, n, k, &x, m);
            testing::check_outputs(&got, &deq, &x, (n, k, m));
            // The fifth bits matter: the same rows with every mask cleared are far off.
            for blk in p.chunks_exact_mut(GROUP_BLOCK5) {
                blk[MASKS5..NIBBLES5].fill(0);
            }
            let q4 = testing::run(mat_vnni5, &p, n, k, &x, m);
            let mut err = 0f64;
            for (a, b) in got.iter().zip(&q4) {
                err = err.max((a - b).abs() as f64);
            }
            assert!(err > 0.1, "{err}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn packed_vnni_kernel_equals_the_scalar_one_on_the_rows_unpacked() {
        if !q4k::available() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        for (seed, &(n, k, m)) in [(16, 256, 1), (64, 1024, 1), (32, 3072, 2), (48, 512, 3)]
            .iter()
            .enumerate()
        {
            let (q, _, x) = testing::case(GgmlType::Q4K, n, k, m, 40 + seed as u64);
            let want = testing::run(q4k::mat_scalar, &q, n, k, &x, m);
            let mut p = q.clone();
            pack(&mut p, n, q.len() / n);
            let got = testing::run(mat_vnni, &p, n, k, &x, m);
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-4 * (1.0 + a.abs()),
                    "{n}x{k}, {m} inputs, output {i}: {a} vs {b}"
                );
            }
        }
    }
}
