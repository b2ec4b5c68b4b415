//! bf16 products on Intel AMX tiles, for [`Context::conv_gemm`](super::Context::conv_gemm) with a
//! bf16 kernel.
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
//! im2col. The kernel is packed once at load ([`pack`]): tile after tile, each 1 KB, in the
//! order the kernel reads them. Both operands' tile rows start on cache lines ([`LINE`]): the
//! bf16 copy by construction, the packed kernel when its caller places it so
//! ([`Context::new_tensor_aligned`](super::Context::new_tensor_aligned)).
//!
//! Each output value sums its reduction in one fixed order (tap, then channel blocks of 32), from
//! its own input row only: it does not depend on the row count or the thread count, as with the
//! f32 products.

/// Reduction values (bf16) per tile step: one A tile row, 64 bytes.
pub const TILE_K: usize = 32;
/// Output columns per C tile.
const TILE_N: usize = 16;
/// Output rows per C tile.
const TILE_M: usize = 16;
/// Output rows and columns per block: 2 × 2 C tiles.
const BLOCK: usize = 32;
/// Bytes of a cache line, and the alignment of both operands' tile rows: a 64-byte row that
/// straddles two lines costs two loads (1.3x the kernel's time on the decoder's shapes,
/// PERFORMANCE.md).
pub const LINE: usize = 64;

/// Whether a conv of `c_in` input channels and `n` output columns can run here: channel blocks of
/// [`TILE_K`] that never straddle two taps, whole 32-column output blocks.
pub fn fits(c_in: usize, n: usize) -> bool {
    c_in > 0 && n > 0 && c_in.is_multiple_of(TILE_K) && n.is_multiple_of(BLOCK)
}

/// Whether this CPU has AMX with bf16 and the OS lets this process use the tile registers (asked
/// once, for the whole process, with `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`).
pub fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(request)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: `cpuid` leaf 7 exists on every x86-64 CPU that reports it as its maximum leaf or
    // above, checked first; the syscall only changes this process's permitted XSAVE features.
    unsafe {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        if __cpuid(0).eax < 7 {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        // AMX-BF16 is bit 22, AMX-TILE bit 24.
        if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
            return false;
        }
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request() -> bool {
    false
}

/// `x` rounded to the nearest bf16, ties to even (finite inputs; a NaN may come out as an
/// infinity).
#[inline]
pub fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of a bf16.
#[inline]
pub fn f32_of(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The kernel matrix `w` (`k` rows of reduction by `n` columns, element `(r, o)` at `r + k · o`,
/// as [`Context::conv_gemm`](super::Context::conv_gemm) takes it in f32) as bf16 tiles: column
/// tile `nb` and reduction step `kb` hold, at `p · 32 + o · 2 + e`, element
/// `(kb · 32 + 2p + e, nb · 16 + o)`; tiles ordered `nb`-major. `None` unless `w` has `k · n`
/// values and `k`, `n` are multiples of 32.
pub fn pack(w: &[f32], k: usize, n: usize) -> Option<Vec<u16>> {
    if w.len() != k * n || !k.is_multiple_of(TILE_K) || !n.is_multiple_of(BLOCK) {
        return None;
    }
    let kb = k / TILE_K;
    let mut out = vec![0u16; k * n];
    for (i, v) in out.iter_mut().enumerate() {
        let (e, rest) = (i % 2, i / 2);
        let (o, rest) = (rest % TILE_N, rest / TILE_N);
        let (p, rest) = (rest % (TILE_K / 2), rest / (TILE_K / 2));
        let (s, nb) = (rest % kb, rest / kb);
        *v = bf16(w[(s * TILE_K + 2 * p + e) + k * (nb * TILE_N + o)]);
    }
    Some(out)
}

/// Output rows per block: 32 (two row tiles), or 16 for products of at most 16 rows (the
/// decoder's transformer and upsamplers see 1-16 rows per call), which would waste half their
/// tile products on zero rows.
fn block_rows(t_out: usize) -> usize {
    if t_out <= TILE_M {
        TILE_M
    } else {
        BLOCK
    }
}

/// Output blocks of a product of `t_out` rows and `n` columns: the unit [`conv`] shares out.
pub fn blocks(t_out: usize, n: usize) -> usize {
    t_out.div_ceil(block_rows(t_out)) * (n / BLOCK)
}

/// Shape of one [`conv`] call.
#[derive(Clone, Copy, Debug)]
pub struct Conv {
    /// Input channels (values per input row).
    pub c_in: usize,
    /// Kernel taps.
    pub taps: usize,
    /// Rows between taps.
    pub dilation: usize,
    /// Output rows.
    pub t_out: usize,
    /// Output columns.
    pub n: usize,
}

thread_local! {
    /// The bf16 copy of a call's input rows, per thread (ggml's workers call in parallel).
    static INPUT: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Output blocks `b0..b1` (of [`blocks`], column-block-major) of the causal conv of the f32 input
/// rows `x` (`t_out + (taps − 1) · dilation` rows of `c_in`) by the packed kernel `w`, into the
/// f32 rows `y` (`t_out` of `n`). After each block is stored, `then(rows, columns)` is called
/// on its stored part, while it is still in cache (the caller's bias and residual adds).
///
/// # Safety
/// [`available`] returned true; [`fits`]`(c_in, n)`; `w` holds `taps · c_in · n` packed values
/// ([`pack`]), `x` the input rows and `y` room for the output rows, none of them written by
/// anyone else during the call except `y`'s other blocks.
#[cfg(target_arch = "x86_64")]
pub unsafe fn conv(
    w: *const u16,
    x: *const f32,
    y: *mut f32,
    s: Conv,
    (b0, b1): (usize, usize),
    mut then: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
) {
    use std::arch::asm;
    if b0 >= b1 {
        return;
    }
    let Conv {
        c_in,
        taps,
        dilation,
        t_out,
        n,
    } = s;
    let span = (taps - 1) * dilation;
    let mrows = block_rows(t_out);
    let pair = mrows == BLOCK;
    let row_blocks = t_out.div_ceil(mrows);
    // Input rows this thread's blocks read, the rows past the input zero (they feed only the
    // output rows past `t_out`, which are not stored).
    let (m0, m1) = if b1 - b0 >= row_blocks {
        (0, row_blocks)
    } else {
        let (a, b) = (b0 % row_blocks, (b1 - 1) % row_blocks);
        if a <= b {
            (a, b + 1)
        } else {
            (0, row_blocks)
        }
    };
    let (r0, r1) = (m0 * mrows, m1 * mrows + span);
    let rows_in = t_out + span;
    let ksteps = taps * c_in / TILE_K;
    let tile_bytes = TILE_K * TILE_N * 2;
    INPUT.with(|cell| {
        let mut buf = cell.borrow_mut();
        buf.clear();
        buf.resize((r1 - r0) * c_in + LINE / 2, 0);
        // The rows from a cache line's start: `c_in` is a multiple of 32 values, so every tile
        // row is a whole line.
        let skip = (buf.as_ptr() as usize).next_multiple_of(LINE) - buf.as_ptr() as usize;
        let xb = &mut buf[skip / 2..][..(r1 - r0) * c_in];
        // SAFETY: the caller's contract; every tile read below stays inside `xb` (rows
        // r0..r1) or `w`, every store inside `y`'s rows below `t_out` or `part`.
        unsafe {
            let src = std::slice::from_raw_parts(x.add(r0 * c_in), (rows_in.min(r1) - r0) * c_in);
            for (d, &v) in xb.iter_mut().zip(src) {
                *d = bf16(v);
            }
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
                let (nb, mb) = (b / row_blocks, b % row_blocks);
                let (t0, o0) = (mb * mrows, nb * BLOCK);
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
                    let a = xb.as_ptr().add((mb * mrows + j * dilation - r0) * c_in);
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
                then(t0..(t0 + mrows).min(t_out), o0..o0 + BLOCK);
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    });
}

/// `ldtilecfg`'s 64-byte operand: palette, then per tile its bytes per row (u16 at 16 + 2t) and
/// rows (u8 at 48 + t).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

/// What [`conv`] computes, on the same bf16 values, one product at a time in f64: the tests'
/// reference. `x` and `w` as in [`conv`] but unpacked (`w` as
/// [`Context::conv_gemm`](super::Context::conv_gemm) takes f32).
pub fn conv_reference(w: &[f32], x: &[f32], s: Conv) -> Vec<f32> {
    let k = s.taps * s.c_in;
    let mut y = vec![0f32; s.t_out * s.n];
    for t in 0..s.t_out {
        for o in 0..s.n {
            let mut acc = 0f64;
            for j in 0..s.taps {
                for c in 0..s.c_in {
                    let xv = f32_of(bf16(x[(t + j * s.dilation) * s.c_in + c]));
                    let wv = f32_of(bf16(w[j * s.c_in + c + k * o]));
                    acc += xv as f64 * wv as f64;
                }
            }
            y[t * s.n + o] = acc as f32;
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1.
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even.
        assert_eq!(bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16(-2.0), 0xc000);
        for v in [0.1f32, -3.7, 1e-3, 123.456] {
            let r = f32_of(bf16(v));
            assert!((r - v).abs() <= v.abs() / 256.0, "{v} -> {r}");
        }
    }

    #[test]
    fn pack_places_each_value_in_its_tile() {
        let (k, n) = (64, 32);
        // Every value a distinct bf16.
        let w: Vec<f32> = (0..k * n).map(|i| f32_of(0x3f80 + i as u16)).collect();
        let p = pack(&w, k, n).unwrap();
        // Tile (nb 1, kb 1), pair row 3, column 5, second of the pair: element (32 + 7, 16 + 5).
        let i = ((k / TILE_K) + 1) * 512 + 3 * 32 + 5 * 2 + 1;
        assert_eq!(f32_of(p[i]), w[39 + k * 21]);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), k * n, "each value placed once");
        assert!(pack(&w, 48, 32 * 64 / 48).is_none());
    }
}
