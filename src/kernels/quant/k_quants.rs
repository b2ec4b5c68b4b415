//! q4_K and q5_K rows: the arithmetic every kernel follows, the scalar twins, and the packed
//! layout.
//!
//! A q4_K block (ggml's `block_q4_K`, 144 bytes) holds 256 weights: f16 `d` and `dmin`, 12 bytes
//! of eight 6-bit scales `sc` and mins `m`, and 128 bytes of nibbles. Byte `l` of the 32-byte
//! group `g` holds weight `64g + l` (sub-block `2g`) in its low nibble and `64g + 32 + l`
//! (sub-block `2g + 1`) in its high one; the weight of nibble `q` in sub-block `j` is
//! `d · sc_j · q − dmin · m_j`. A q5_K block (176 bytes) has the same `d`, `dmin` and scales,
//! then 32 bytes `qh` whose bit `2g` (low nibble) or `2g + 1` (high) of byte `l` is the fifth
//! bit of those two weights, then the same 128 nibble bytes.
//!
//! The input is quantized per 256 values (scale `dx`, rounded to nearest, ties to even), with each sub-block's
//! integer sum `Σ xq`. A row's product is, block after block in order, from `acc = 0`:
//! - `f = 0`, then for `g` in 0..4: `f = fma(lo_g, sc_2g, f)`, `f = fma(hi_g, sc_2g+1, f)`, where
//!   `lo_g` and `hi_g` are the exact integer dots of the sub-blocks' weights `q` with `xq`;
//! - `acc = fma(f, d · dx, acc)`;
//! - `acc = fma(−msum, dmin · dx, acc)`, `msum = Σ_j m_j · Σ xq_j` (exact).
//!
//! Every integer is below 2²⁴ in magnitude, so it converts exactly, and a kernel may scale one
//! factor of a product by a power of two and the other by its inverse (the fused multiply-add
//! sees the same exact product). [`mat_scalar`] and [`mat_scalar5`] are the definition.
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
//! q5_K rows pack the same way ([`pack5`]), with their fifth bits between the halves: a packed
//! block (16 × 176 = 2816 bytes) holds the scales and `d`, `dmin` at bytes 0..256 as above, then
//! at 256..768, for each nibble group `g` and step `t`, two 64-bit masks (low nibbles, then high)
//! whose bit `4r + e` is the fifth bit of the weight held by byte `4r + e` of that step's 64
//! nibble bytes, then the nibbles at 768..2816.

use std::cell::RefCell;

use super::{quantize_block, with_inputs, Fill, GROUP};

/// Weights per q4_K (and q5_K) block.
pub const BLOCK: usize = 256;
/// Bytes per q4_K block.
pub const BLOCK_BYTES: usize = 144;
/// Bytes per q5_K block.
pub const BLOCK_BYTES5: usize = 176;
/// Bytes of one block of a packed q4_K group.
pub const GROUP_BLOCK: usize = GROUP * BLOCK_BYTES;
/// Bytes of one block of a packed q5_K group.
pub const GROUP_BLOCK5: usize = GROUP * BLOCK_BYTES5;
/// Where a packed q5_K block's masks start, and its nibbles.
pub const MASKS5: usize = 256;
/// Where a packed q5_K block's nibbles start.
pub const NIBBLES5: usize = 768;

/// The eight scales and eight mins of a block's 12 scale bytes, one per byte (ggml's
/// `get_scale_min_k4`, four at a time).
#[inline(always)]
pub(crate) fn scales_mins(s: &[u8]) -> (u64, u64) {
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

/// An input row quantized for the kernels, in its natural order.
#[derive(Default)]
pub(crate) struct Natural {
    /// 256 int8 values per block.
    pub q: Vec<i8>,
    /// Per block, its scale.
    pub d: Vec<f32>,
    /// Per block, its eight sub-block sums of `q`.
    pub sums: Vec<i32>,
    /// Per block, the same sums as four pairs of 16-bit halves, in the order the AVX-512
    /// kernel pairs the mins: (s0, s2), (s1, s3), (s4, s6), (s5, s7), low half first. A sum is
    /// at most 32 · 127 in magnitude, so it fits.
    pub min_pairs: Vec<i32>,
}

impl Fill for Natural {
    fn fill(&mut self, x: &[f32]) {
        let nb = x.len() / BLOCK;
        self.q.resize(nb * BLOCK, 0);
        self.d.resize(nb, 0.0);
        self.sums.resize(nb * 8, 0);
        self.min_pairs.resize(nb * 4, 0);
        for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
            let mut sums = [0i32; 8];
            let q = &mut self.q[b * BLOCK..(b + 1) * BLOCK];
            self.d[b] = quantize_block(xb, |i, v| {
                q[i] = v;
                sums[i / 32] += v as i32;
            });
            self.sums[b * 8..b * 8 + 8].copy_from_slice(&sums);
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
    pub(crate) static SCRATCH: RefCell<Vec<Natural>> = const { RefCell::new(Vec::new()) };
}

/// One row's product, scalar: the definition (see the module's doc); `five` for q5_K rows.
fn dot_scalar(row: &[u8], p: &Natural, five: bool) -> f32 {
    let block_bytes = if five { BLOCK_BYTES5 } else { BLOCK_BYTES };
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(block_bytes).enumerate() {
        let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let dmin = half::f16::from_le_bytes([blk[2], blk[3]]).to_f32();
        let (sc, m) = scales_mins(&blk[4..16]);
        let byte = |v: u64, j: usize| ((v >> (8 * j)) & 0xff) as i32;
        let (qh, qs) = if five {
            (&blk[16..48], &blk[48..])
        } else {
            (&blk[..0], &blk[16..])
        };
        let xq = &p.q[b * BLOCK..(b + 1) * BLOCK];
        let mut f = 0f32;
        for g in 0..4 {
            let (mut lo, mut hi) = (0i32, 0i32);
            for l in 0..32 {
                let (mut ql, mut qu) = ((qs[32 * g + l] & 15) as i32, (qs[32 * g + l] >> 4) as i32);
                if five {
                    ql += 16 * ((qh[l] >> (2 * g)) & 1) as i32;
                    qu += 16 * ((qh[l] >> (2 * g + 1)) & 1) as i32;
                }
                lo += ql * xq[64 * g + l] as i32;
                hi += qu * xq[64 * g + 32 + l] as i32;
            }
            f = (lo as f32).mul_add(byte(sc, 2 * g) as f32, f);
            f = (hi as f32).mul_add(byte(sc, 2 * g + 1) as f32, f);
        }
        let msum: i32 = (0..8).map(|j| byte(m, j) * p.sums[b * 8 + j]).sum();
        let dx = p.d[b];
        acc = f.mul_add(d * dx, acc);
        acc = (-(msum as f32)).mul_add(dmin * dx, acc);
    }
    acc
}

/// [`mat_scalar`] and [`mat_scalar5`].
///
/// # Safety
/// As [`mat_scalar`].
#[allow(clippy::too_many_arguments)]
unsafe fn mat<const FIVE: bool>(
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
                    *y.add(j * y_stride + r) = dot_scalar(row, p, FIVE);
                }
            }
        })
    }
}

/// A [`crate::kernels::MatKernel`] for q4_K rows as the file stores them, scalar: the
/// reference of every packed kernel.
///
/// # Safety
/// As [`crate::kernels::MatKernel`]; `k` is a multiple of [`BLOCK`] and `row_bytes` is
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
    unsafe { mat::<false>(w, row_bytes, n, k, x, m, y, y_stride) }
}

/// [`mat_scalar`] for q5_K rows (`row_bytes` is `k / BLOCK · BLOCK_BYTES5`).
///
/// # Safety
/// As [`mat_scalar`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn mat_scalar5(
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
pub(crate) fn mask_offset(g: usize, t: usize, h: usize) -> usize {
    MASKS5 + ((g * 8 + t) * 2 + h) * 8
}

/// Packs `n` q4_K rows of `row_bytes` in place (see the module's layout); `n` must be a
/// multiple of [`GROUP`] (see [`super::fits`]).
pub fn pack(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, false, true);
}

/// Undoes [`pack`].
pub fn unpack(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, false, false);
}

/// Packs `n` q5_K rows of `row_bytes` in place (see the module's layout); `n` must be a
/// multiple of [`GROUP`] (see [`super::fits`]).
pub fn pack5(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, true, true);
}

/// Undoes [`pack5`].
pub fn unpack5(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, true, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_places_each_byte_and_bit_once() {
        // Every offset of a q4_K group block is hit once.
        let mut hit = vec![0u8; GROUP_BLOCK];
        for r in 0..GROUP {
            for i in 0..BLOCK_BYTES {
                hit[packed_offset(r, i)] += 1;
            }
        }
        assert!(hit.iter().all(|&h| h == 1));
        // Every byte of a packed q5_K block is written by exactly one byte or eight bits of the
        // rows.
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
}
