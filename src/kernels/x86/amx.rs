//! The bf16 products on Intel AMX tiles ([`crate::kernels::bf16`]).
//!
//! A tile register holds 16 rows of 64 bytes. `tdpbf16ps C, A, B` adds to the 16 × 16 f32 tile
//! `C` the product of `A` (16 rows × 32 bf16) and `B` (32 × 16 bf16, stored as 16 rows of bf16
//! pairs: row `p` holds `B[2p][n], B[2p + 1][n]` for `n = 0..16`). The kernel keeps a 32 × 32
//! block of the output in four `C` tiles and walks the reduction 32 values at a time: two input
//! tiles (rows `t..t + 16`, `t + 16..t + 32`), two kernel tiles, four products. A product of at
//! most 16 rows uses 16 × 32 blocks: one input tile, two products per step.
//!
//! The input tiles are read straight from the bf16 copy of the conv's input rows, at row stride
//! `c_in`: the row of tap `j` for output `t` is input row `t + j · dilation`, so the taps need no
//! im2col. Both operands' tile rows start on cache lines ([`LINE`]): the bf16 copy by
//! construction, the packed kernel when its caller places it so
//! ([`crate::ffi::Context::new_tensor_aligned`]). Each output value sums its reduction in one
//! fixed order (tap, then channel blocks of 32).

use std::arch::asm;

use crate::kernels::bf16::{block, block_rows, Conv, BLOCK, LINE, TILE_K, TILE_M, TILE_N};

/// Output blocks `b0..b1` of [`crate::kernels::bf16::conv`], from the bf16 input rows `xb`
/// (starting at input row `r0`).
///
/// # Safety
/// As [`crate::kernels::bf16::conv`], with AMX-BF16 usable; `xb` starts on a cache line and
/// holds every input row the blocks read.
pub unsafe fn conv_blocks(
    w: *const u16,
    xb: &[u16],
    r0: usize,
    y: *mut f32,
    s: Conv,
    (b0, b1): (usize, usize),
    mut then: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
) {
    let Conv {
        c_in,
        taps,
        dilation,
        t_out,
        n,
    } = s;
    debug_assert!((xb.as_ptr() as usize).is_multiple_of(LINE));
    let mrows = block_rows(t_out);
    let pair = mrows == BLOCK;
    let ksteps = taps * c_in / TILE_K;
    let tile_bytes = TILE_K * TILE_N * 2;
    // SAFETY: the caller's contract; every tile read below stays inside `xb` (its rows) or `w`,
    // every store inside `y`'s rows below `t_out` or `part`.
    unsafe {
        // One configuration for all eight tiles: 16 rows of 64 bytes.
        let mut cfg = TileConfig([0; 64]);
        cfg.0[0] = 1;
        for t in 0..8 {
            cfg.0[16 + 2 * t] = 64;
            cfg.0[48 + t] = TILE_M as u8;
        }
        asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        let mut part = [0f32; BLOCK * BLOCK];
        let a_stride = c_in * 2;
        for b in b0..b1 {
            let (nb, rows) = block(s, b);
            let (t0, o0) = (rows.start, nb * BLOCK);
            let full = t0 + mrows <= t_out;
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            let w0 = w.add(2 * nb * ksteps * tile_bytes / 2);
            let w1 = w0.add(ksteps * tile_bytes / 2);
            for j in 0..taps {
                let a = xb.as_ptr().add((t0 + j * dilation - r0) * c_in);
                for cb in 0..c_in / TILE_K {
                    let step = j * (c_in / TILE_K) + cb;
                    let a0 = a.add(cb * TILE_K);
                    let a1 = a0.add(TILE_M * c_in);
                    let bw0 = w0.add(step * tile_bytes / 2);
                    let bw1 = w1.add(step * tile_bytes / 2);
                    if !pair {
                        asm!(
                            "tileloadd tmm4, [{a0} + {sa}*1]",
                            "tileloadd tmm6, [{b0} + {sb}*1]",
                            "tileloadd tmm7, [{b1} + {sb}*1]",
                            "tdpbf16ps tmm0, tmm4, tmm6",
                            "tdpbf16ps tmm1, tmm4, tmm7",
                            a0 = in(reg) a0,
                            b0 = in(reg) bw0,
                            b1 = in(reg) bw1,
                            sa = in(reg) a_stride,
                            sb = in(reg) 64usize,
                            options(nostack, readonly)
                        );
                        continue;
                    }
                    asm!(
                        "tileloadd tmm4, [{a0} + {sa}*1]",
                        "tileloadd tmm5, [{a1} + {sa}*1]",
                        "tileloadd tmm6, [{b0} + {sb}*1]",
                        "tileloadd tmm7, [{b1} + {sb}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a0 = in(reg) a0,
                        a1 = in(reg) a1,
                        b0 = in(reg) bw0,
                        b1 = in(reg) bw1,
                        sa = in(reg) a_stride,
                        sb = in(reg) 64usize,
                        options(nostack, readonly)
                    );
                }
            }
            let (dst, stride) = if full {
                (y.add(t0 * n + o0), n * 4)
            } else {
                (part.as_mut_ptr(), BLOCK * 4)
            };
            asm!(
                "tilestored [{c0} + {s}*1], tmm0",
                "tilestored [{c1} + {s}*1], tmm1",
                c0 = in(reg) dst,
                c1 = in(reg) dst.add(TILE_N),
                s = in(reg) stride,
                options(nostack)
            );
            if pair {
                let down = TILE_M * stride / 4;
                asm!(
                    "tilestored [{c2} + {s}*1], tmm2",
                    "tilestored [{c3} + {s}*1], tmm3",
                    c2 = in(reg) dst.add(down),
                    c3 = in(reg) dst.add(down + TILE_N),
                    s = in(reg) stride,
                    options(nostack)
                );
            }
            if !full {
                for r in 0..t_out - t0 {
                    std::ptr::copy_nonoverlapping(
                        part.as_ptr().add(r * BLOCK),
                        y.add((t0 + r) * n + o0),
                        BLOCK,
                    );
                }
            }
            then(rows, o0..o0 + BLOCK);
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

/// `ldtilecfg`'s 64-byte operand: palette, then per tile its bytes per row (u16 at 16 + 2t) and
/// rows (u8 at 48 + t).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);
