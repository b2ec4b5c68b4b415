//! q8_0 rows: the arithmetic every q8_0 kernel follows, the scalar twin, and the packed layout.
//!
//! A q8_0 block (ggml's `block_q8_0`, 34 bytes) holds 32 weights: an f16 scale `d` and 32 int8
//! `q`, weight `d · q`. The input is quantized per 32 values (scale `dx`, rounded to nearest, ties to even).
//! A row's product is, block after block in order:
//! `acc = fma(s_b, d_b · dx_b, acc)` from `acc = 0`, where `s_b = Σ q · xq` is the block's exact
//! integer dot product (at most 32 · 128 · 127 in magnitude, exact in f32) and `d_b · dx_b` one
//! f32 product. [`mat_scalar`] is that definition.
//!
//! [`pack`] rearranges a matrix in place in groups of [`super::GROUP`] rows and pairs of blocks,
//! each weight with its top bit flipped (`q + 128`, the unsigned side of x86's `vpdpbusd`; the
//! kernels that multiply signed bytes flip it back). Pair `p` of a group (2 × 16 × 34 = 1088
//! bytes, 17 cache lines, at `p · 1088`) holds:
//! - bytes 0..64: `d` (f16) of the 16 rows for block `2p`, then for block `2p + 1`;
//! - bytes 64..576 and 576..1088: blocks `2p` and `2p + 1`, each as 8 steps `t` of 64 bytes:
//!   weights `4t .. 4t + 4` of row 0, then row 1, … row 15.

use std::cell::RefCell;

use super::{quantize_block, with_inputs, Fill, GROUP};

/// Weights per q8_0 block.
pub const BLOCK: usize = 32;
/// Bytes per q8_0 block.
pub const BLOCK_BYTES: usize = crate::gguf::GgmlType::Q8_0.type_size() as usize;
/// Bytes of a packed pair of blocks of a group.
pub const PAIR_BYTES: usize = 2 * GROUP * BLOCK_BYTES;

/// Input rows quantized for the kernels.
#[derive(Default)]
pub(crate) struct Prepared {
    /// The int8 values.
    pub q: Vec<i8>,
    /// Per block, its scale.
    pub d: Vec<f32>,
    /// Per block, `−128 · Σ q`: where a kernel that reads the flipped weights as unsigned starts
    /// the block's integer sum, so that it ends at `Σ q · xq`.
    pub start: Vec<i32>,
}

impl Fill for Prepared {
    fn fill(&mut self, x: &[f32]) {
        let nb = x.len() / BLOCK;
        self.q.resize(nb * BLOCK, 0);
        self.d.resize(nb, 0.0);
        self.start.resize(nb, 0);
        for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
            let mut sum = 0i32;
            let q = &mut self.q[b * BLOCK..(b + 1) * BLOCK];
            let d = quantize_block(xb, |i, v| {
                q[i] = v;
                sum += v as i32;
            });
            self.d[b] = d;
            self.start[b] = -128 * sum;
        }
    }
}

thread_local! {
    /// The inputs of the current call, reused across calls on this thread.
    pub(crate) static SCRATCH: RefCell<Vec<Prepared>> = const { RefCell::new(Vec::new()) };
}

/// One row's product, scalar: the definition (see the module's doc).
fn dot_scalar(row: &[u8], p: &Prepared) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(BLOCK_BYTES).enumerate() {
        let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
        let xq = &p.q[b * BLOCK..(b + 1) * BLOCK];
        let s: i32 = blk[2..]
            .iter()
            .zip(xq)
            .map(|(&w, &x)| w as i8 as i32 * x as i32)
            .sum();
        acc = (s as f32).mul_add(d * p.d[b], acc);
    }
    acc
}

/// A [`crate::kernels::MatKernel`] for q8_0 rows as the file stores them, scalar: the
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

/// Packs `n` q8_0 rows of `row_bytes` in place (see the module's layout and
/// [`super::fits`]).
pub fn pack(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, true);
}

/// Undoes [`pack`].
pub fn unpack(q: &mut [u8], n: usize, row_bytes: usize) {
    permute(q, n, row_bytes, false);
}

#[cfg(test)]
mod tests {
    use super::super::{testing, QType};
    use super::*;

    #[test]
    fn packing_places_each_byte_once_and_flips_the_weights() {
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
        let (q, _, _) = testing::case(QType::Q8_0, n, k, 1, 3);
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
    }
}
