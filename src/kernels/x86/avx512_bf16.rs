//! The bf16 products on AVX-512 BF16 ([`crate::kernels::bf16`]): `vdpbf16ps` adds to each of 16
//! f32 lanes the products of one pair of bf16 inputs with one pair of bf16 weights, which is a
//! row of [`crate::kernels::bf16::pack`]'s tiles as it stands (16 columns, their weights for two
//! consecutive reduction values).
//!
//! A block (up to 32 output rows by 32 columns, as the AMX kernel's) is computed [`ROWS`] rows
//! at a time: `2 · ROWS` accumulators (two column vectors per row), each step loading the two
//! column vectors' weights once and broadcasting each row's input pair. Each output sums its
//! reduction in the AMX kernel's order (tap, then channel blocks of 32, then pairs), from its
//! own input row only, so it does not depend on the row count or the thread count.

use std::arch::x86_64::*;

use crate::kernels::bf16::{block, block_rows, Conv, BLOCK, TILE_K, TILE_N};

/// Output rows computed together: 16 accumulators and the two weight vectors stay in registers,
/// and a block's 16 or 32 rows split evenly.
const ROWS: usize = 8;

/// Output blocks `b0..b1` of [`crate::kernels::bf16::conv`], from the bf16 input rows `xb`
/// (starting at input row `r0`).
///
/// # Safety
/// As [`crate::kernels::bf16::conv`], with AVX-512 F and BF16; `xb` holds every input row the
/// blocks read, rows padded to whole blocks included.
pub unsafe fn conv_blocks(
    w: *const u16,
    xb: &[u16],
    r0: usize,
    y: *mut f32,
    s: Conv,
    (b0, b1): (usize, usize),
    mut then: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
) {
    let mrows = block_rows(s.t_out);
    for b in b0..b1 {
        let (nb, part) = block(s, b);
        let (t0, o0) = (part.start, nb * BLOCK);
        for c in (t0..t0 + mrows).step_by(ROWS) {
            if c >= s.t_out {
                break;
            }
            // SAFETY: the caller's contract: rows c..c + ROWS of this block are inside `xb`
            // (padded to whole blocks), the block's columns inside `w`, and only the rows below
            // `t_out` are stored.
            unsafe { rows(w, xb, r0, y, s, nb, c) };
        }
        then(part, o0..o0 + BLOCK);
    }
}

/// Output rows `t..t + ROWS` (those below `t_out` stored) of column block `nb` (32 columns).
///
/// # Safety
/// As [`conv_blocks`].
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn rows(w: *const u16, xb: &[u16], r0: usize, y: *mut f32, s: Conv, nb: usize, t: usize) {
    let Conv {
        c_in,
        taps,
        dilation,
        t_out,
        n,
    } = s;
    let ksteps = taps * c_in / TILE_K;
    // Values of one packed tile: 16 pair-rows of 16 columns.
    let tile = TILE_K * TILE_N;
    let w0 = w.wrapping_add(2 * nb * ksteps * tile);
    let w1 = w0.wrapping_add(ksteps * tile);
    let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
    for j in 0..taps {
        // SAFETY: row `t + i + j · dilation` of the input, inside `xb` (the caller's contract).
        let a = unsafe { xb.as_ptr().add((t + j * dilation - r0) * c_in) };
        for cb in 0..c_in / TILE_K {
            let step = j * (c_in / TILE_K) + cb;
            for p in 0..TILE_K / 2 {
                // SAFETY: pair-row p of step `step` of both column tiles, inside `w`; input
                // pair `cb · 32 + 2p` of each row, inside `xb`.
                unsafe {
                    let at = step * tile + p * 2 * TILE_N;
                    let load = |p: *const u16| {
                        std::mem::transmute::<__m512, __m512bh>(_mm512_loadu_ps(p.cast()))
                    };
                    let (bw0, bw1) = (load(w0.add(at)), load(w1.add(at)));
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let x = a.add(i * c_in + cb * TILE_K + 2 * p);
                        let pair = _mm512_set1_epi32(x.cast::<i32>().read_unaligned());
                        let pair = std::mem::transmute::<__m512i, __m512bh>(pair);
                        acc[0] = _mm512_dpbf16_ps(acc[0], pair, bw0);
                        acc[1] = _mm512_dpbf16_ps(acc[1], pair, bw1);
                    }
                }
            }
        }
    }
    let o0 = nb * BLOCK;
    for (i, acc) in acc.iter().enumerate() {
        if t + i >= t_out {
            break;
        }
        // SAFETY: output row t + i < t_out, columns o0..o0 + 32 < n.
        unsafe {
            let row = y.add((t + i) * n + o0);
            _mm512_storeu_ps(row, acc[0]);
            _mm512_storeu_ps(row.add(TILE_N), acc[1]);
        }
    }
}
