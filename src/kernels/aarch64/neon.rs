//! aarch64 Advanced SIMD kernels: the heads' dot products ([`crate::kernels::dot`]), SnakeBeta
//! ([`crate::kernels::snake`]), the quantized products on packed rows
//! ([`crate::kernels::quant`]) and the decoder's f32 products on panels
//! ([`crate::kernels::panel`]).
//!
//! The packed products keep one row per 32-bit lane, four vectors a group. With the dot-product
//! instructions (`sdot`, FEAT_DotProd: Cortex-A76 and later, Apple M1 and later) a step adds four
//! weights of each of four rows times the input's four in one instruction; without them (the
//! Cortex-A72 of a Raspberry Pi 4), by widening products and pairwise adds. q8_0's packed
//! weights have their top bit flipped (x86's unsigned side) and are flipped back; the K types'
//! nibbles, shifted down to 0..15 (0..31 with q5_K's fifth bit), are non-negative bytes already.
//! Each follows its type's fixed arithmetic, so it gives the scalar twin's bits; the f16 scales
//! are widened by the `half` crate, exactly.

use std::arch::aarch64::*;

use crate::kernels::dot::LANES;
use crate::kernels::quant::{k_quants, q8_0, GROUP};
use crate::kernels::snake::{snake, PIO2_1, PIO2_2, PIO2_3, REDUCED, S1, S2, S3, TWO_OVER_PI};

/// The 64 lanes of [`crate::kernels::dot`]'s order, sixteen registers of 4.
///
/// # Safety
/// The CPU has NEON; `a.len() == b.len()` is a multiple of 64.
#[target_feature(enable = "neon")]
pub unsafe fn dot_lanes(a: &[f32], b: &[f32], lanes: &mut [f32; LANES]) {
    // SAFETY: every load reads 4 floats below len (a multiple of 64).
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 16];
        for i in (0..a.len()).step_by(LANES) {
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = vld1q_f32(a.as_ptr().add(i + 4 * r));
                let y = vld1q_f32(b.as_ptr().add(i + 4 * r));
                *acc = vfmaq_f32(*acc, x, y);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            vst1q_f32(lanes.as_mut_ptr().add(4 * r), *acc);
        }
    }
}

/// The first multiple-of-4 part of a SnakeBeta row, the scalar [`snake`]'s operations in its
/// order (the same fused multiply-adds); returns how many elements it did. Vectors with a lane
/// beyond [`REDUCED`] (or NaN) are done with the scalar [`snake`].
///
/// # Safety
/// The CPU has NEON; the slices have equal lengths.
#[target_feature(enable = "neon")]
pub unsafe fn snake_row(x: &[f32], alpha: &[f32], inv_beta: &[f32], y: &mut [f32]) -> usize {
    let n = x.len() / 4 * 4;
    let mut i = 0;
    while i < n {
        // SAFETY: i + 4 ≤ n ≤ every slice's length.
        let (xv, av, bv) = unsafe {
            (
                vld1q_f32(x.as_ptr().add(i)),
                vld1q_f32(alpha.as_ptr().add(i)),
                vld1q_f32(inv_beta.as_ptr().add(i)),
            )
        };
        let t = vmulq_f32(av, xv);
        // NaN compares false, as beyond the range.
        let in_range = vcleq_f32(vabsq_f32(t), vdupq_n_f32(REDUCED));
        if vminvq_u32(in_range) == 0 {
            for k in i..i + 4 {
                y[k] = snake(x[k], alpha[k], inv_beta[k]);
            }
            i += 4;
            continue;
        }
        let j = vrndnq_f32(vmulq_f32(t, vdupq_n_f32(TWO_OVER_PI)));
        // The same operations as the scalar `sin2`, fused where it fuses (`vfmsq`: a − b·c).
        let r = vfmsq_f32(t, j, vdupq_n_f32(PIO2_1));
        let r = vfmsq_f32(r, j, vdupq_n_f32(PIO2_2));
        let r = vfmsq_f32(r, j, vdupq_n_f32(PIO2_3));
        let z = vmulq_f32(r, r);
        let p = vfmaq_f32(vdupq_n_f32(S2), z, vdupq_n_f32(S3));
        let p = vfmaq_f32(vdupq_n_f32(S1), z, p);
        let s = vfmaq_f32(r, vmulq_f32(r, z), p);
        let s2 = vmulq_f32(s, s);
        let odd = vtstq_s32(vcvtq_s32_f32(j), vdupq_n_s32(1));
        let v = vbslq_f32(odd, vsubq_f32(vdupq_n_f32(1.0), s2), s2);
        let out = vfmaq_f32(xv, bv, v);
        // SAFETY: as for the loads.
        unsafe { vst1q_f32(y.as_mut_ptr().add(i), out) };
        i += 4;
    }
    n
}

/// The 16 f16 values at `p`, widened.
///
/// # Safety
/// `p` points at 32 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn widen16(p: *const u8) -> [float32x4_t; 4] {
    let mut f = [0f32; 16];
    for (i, v) in f.iter_mut().enumerate() {
        // SAFETY: value i of the caller's 16.
        let b = unsafe { [*p.add(2 * i), *p.add(2 * i + 1)] };
        *v = half::f16::from_le_bytes(b).to_f32();
    }
    // SAFETY: 16 floats.
    unsafe { std::array::from_fn(|i| vld1q_f32(f.as_ptr().add(4 * i))) }
}

/// The four rows' dots of 16 signed weight bytes (4 per row) with the input's 4 bytes `x`
/// (repeated), added to `acc`, with `sdot` when `DOT`.
///
/// # Safety
/// The CPU has FEAT_DotProd when `DOT`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot4<const DOT: bool>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    if DOT {
        // SAFETY: `DOT` kernels run only where the CPU has FEAT_DotProd (`packed_kernel`), and
        // their callers enable it.
        unsafe { sdot(acc, w, x) }
    } else {
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
        let hi = vpaddlq_s16(vmull_high_s8(w, x));
        vaddq_s32(acc, vpaddq_s32(lo, hi))
    }
}

/// `sdot` (FEAT_DotProd), written out: its intrinsic is not stable in Rust yet.
///
/// # Safety
/// The CPU has FEAT_DotProd.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(mut acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: a register-only instruction of a feature the caller guarantees.
    unsafe {
        std::arch::asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Four bytes of `p`, repeated over a vector.
///
/// # Safety
/// `p` points at 4 readable bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn splat4(p: *const i8) -> int8x16_t {
    // SAFETY: the caller's 4 bytes.
    vreinterpretq_s8_s32(vdupq_n_s32(unsafe { p.cast::<i32>().read_unaligned() }))
}

/// The 16 rows' results of one group as four vectors, stored.
///
/// # Safety
/// The CPU has NEON (every aarch64 does; the tier's check).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn store16(acc: [float32x4_t; 4]) -> [f32; GROUP] {
    let mut out = [0f32; GROUP];
    for (i, a) in acc.iter().enumerate() {
        // SAFETY: 4 floats of 16.
        unsafe { vst1q_f32(out.as_mut_ptr().add(4 * i), *a) };
    }
    out
}

/// The products of one packed q8_0 group (16 rows of `nb` blocks at `grp`) with `M` inputs.
///
/// # Safety
/// `grp` points at `nb / 2` packed pairs, each input holds `nb` blocks; the CPU has NEON, and
/// FEAT_DotProd when `DOT`.
#[target_feature(enable = "neon")]
#[allow(clippy::needless_range_loop)] // `i` picks lanes of several arrays at once.
unsafe fn q8_0_dots_with<const M: usize, const DOT: bool>(
    grp: *const u8,
    nb: usize,
    ps: [&q8_0::Prepared; M],
) -> [[f32; GROUP]; M] {
    let flip = vdupq_n_u8(0x80);
    let mut acc = [[vdupq_n_f32(0.0); 4]; M];
    for b in 0..nb {
        let pair = grp.wrapping_add(b / 2 * q8_0::PAIR_BYTES);
        let hb = b % 2;
        // SAFETY: block b of the group and of each input (the caller's contract).
        unsafe {
            let d = widen16(pair.add(32 * hb));
            let q = pair.add(64 + 512 * hb);
            let mut sum = [[vdupq_n_s32(0); 4]; M];
            for t in 0..8 {
                let mut w = [vdupq_n_s8(0); 4];
                for (i, w) in w.iter_mut().enumerate() {
                    let v = vld1q_u8(q.add(64 * t + 16 * i));
                    *w = vreinterpretq_s8_u8(veorq_u8(v, flip));
                }
                for (j, p) in ps.iter().enumerate() {
                    let x = splat4(p.q.as_ptr().add(b * q8_0::BLOCK + 4 * t));
                    for i in 0..4 {
                        sum[j][i] = dot4::<DOT>(sum[j][i], w[i], x);
                    }
                }
            }
            for (j, p) in ps.iter().enumerate() {
                let dx = vdupq_n_f32(*p.d.get_unchecked(b));
                for i in 0..4 {
                    let s = vcvtq_f32_s32(sum[j][i]);
                    acc[j][i] = vfmaq_f32(acc[j][i], s, vmulq_f32(d[i], dx));
                }
            }
        }
    }
    // SAFETY: plain stores of the accumulators.
    acc.map(|a| unsafe { store16(a) })
}

/// [`q8_0_dots_with`] with `sdot`.
///
/// # Safety
/// As [`q8_0_dots_with`], with FEAT_DotProd.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q8_0_dots_dot<const M: usize>(
    grp: *const u8,
    nb: usize,
    ps: [&q8_0::Prepared; M],
) -> [[f32; GROUP]; M] {
    // SAFETY: the caller's contract.
    unsafe { q8_0_dots_with::<M, true>(grp, nb, ps) }
}

/// [`q8_0_dots_with`] without `sdot`.
///
/// # Safety
/// As [`q8_0_dots_with`].
#[target_feature(enable = "neon")]
unsafe fn q8_0_dots_plain<const M: usize>(
    grp: *const u8,
    nb: usize,
    ps: [&q8_0::Prepared; M],
) -> [[f32; GROUP]; M] {
    // SAFETY: the caller's contract.
    unsafe { q8_0_dots_with::<M, false>(grp, nb, ps) }
}

/// Byte `S` (0..4) of each lane (a shift by 0 is no instruction, and `vshrq_n_u32` takes 1..=32).
macro_rules! byte_of {
    ($v:expr, 0) => {
        vandq_u32($v, vdupq_n_u32(0xff))
    };
    ($v:expr, $s:literal) => {
        vandq_u32(vshrq_n_u32::<{ 8 * $s }>($v), vdupq_n_u32(0xff))
    };
}

/// Each byte of a vector set to 16 where bit `i` of `mask` is set (byte `i`), else 0.
#[inline]
#[target_feature(enable = "neon")]
fn mask16(mask: u16) -> uint8x16_t {
    let bytes = vcombine_u8(vdup_n_u8(mask as u8), vdup_n_u8((mask >> 8) as u8));
    let bits = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    vandq_u8(vtstq_u8(bytes, bits), vdupq_n_u8(16))
}

/// The products of one packed q4_K (or q5_K when `Q5`) group with `M` inputs, the arithmetic of
/// [`crate::kernels::quant::k_quants`].
///
/// # Safety
/// `grp` points at `nb` packed blocks, each input holds `nb` blocks; the CPU has NEON, and
/// FEAT_DotProd when `DOT`.
#[target_feature(enable = "neon")]
#[allow(clippy::needless_range_loop)] // `i` and `s` pick lanes of several arrays at once.
unsafe fn q4_k_dots_with<const M: usize, const Q5: bool, const DOT: bool>(
    grp: *const u8,
    nb: usize,
    ps: [&k_quants::Natural; M],
) -> [[f32; GROUP]; M] {
    let block_bytes = if Q5 {
        k_quants::GROUP_BLOCK5
    } else {
        k_quants::GROUP_BLOCK
    };
    let low = vdupq_n_u8(0x0f);
    let m6 = vdupq_n_u32(0x3f3f_3f3f);
    let m4 = vdupq_n_u32(0x0f0f_0f0f);
    let m2 = vdupq_n_u32(0x0303_0303);
    let mut acc = [[vdupq_n_f32(0.0); 4]; M];
    for b in 0..nb {
        let blk = grp.wrapping_add(b * block_bytes);
        // SAFETY: block b of the group and of each input (the caller's contract).
        unsafe {
            let qs = blk.add(if Q5 { k_quants::NIBBLES5 } else { 256 });
            let d = widen16(blk.add(192));
            let dmin = widen16(blk.add(224));
            // Per vector of four rows: the eight scales and eight mins as 32-bit lanes.
            let mut sc = [[vdupq_n_f32(0.0); 8]; 4];
            let mut mn = [[vdupq_n_s32(0); 8]; 4];
            for i in 0..4 {
                let word = |w: usize| vld1q_u32(blk.add(64 * w + 16 * i).cast());
                let (a, bw, c) = (word(0), word(1), word(2));
                let sc_lo = vandq_u32(a, m6);
                let m_lo = vandq_u32(bw, m6);
                let sc_hi = vorrq_u32(
                    vandq_u32(c, m4),
                    vshlq_n_u32::<4>(vandq_u32(vshrq_n_u32::<6>(a), m2)),
                );
                let m_hi = vorrq_u32(
                    vandq_u32(vshrq_n_u32::<4>(c), m4),
                    vshlq_n_u32::<4>(vandq_u32(vshrq_n_u32::<6>(bw), m2)),
                );
                let scs = [
                    byte_of!(sc_lo, 0),
                    byte_of!(sc_lo, 1),
                    byte_of!(sc_lo, 2),
                    byte_of!(sc_lo, 3),
                    byte_of!(sc_hi, 0),
                    byte_of!(sc_hi, 1),
                    byte_of!(sc_hi, 2),
                    byte_of!(sc_hi, 3),
                ];
                let mns = [
                    byte_of!(m_lo, 0),
                    byte_of!(m_lo, 1),
                    byte_of!(m_lo, 2),
                    byte_of!(m_lo, 3),
                    byte_of!(m_hi, 0),
                    byte_of!(m_hi, 1),
                    byte_of!(m_hi, 2),
                    byte_of!(m_hi, 3),
                ];
                for s in 0..8 {
                    sc[i][s] = vcvtq_f32_u32(scs[s]);
                    mn[i][s] = vreinterpretq_s32_u32(mns[s]);
                }
            }
            let mut fsum = [[vdupq_n_f32(0.0); 4]; M];
            for g in 0..4 {
                let mut lo = [[vdupq_n_s32(0); 4]; M];
                let mut hi = [[vdupq_n_s32(0); 4]; M];
                for t in 0..8 {
                    let step = qs.add((g * 8 + t) * 64);
                    let mut ql = [vdupq_n_s8(0); 4];
                    let mut qh = [vdupq_n_s8(0); 4];
                    for i in 0..4 {
                        let v = vld1q_u8(step.add(16 * i));
                        let (mut l, mut h) = (vandq_u8(v, low), vshrq_n_u8::<4>(v));
                        if Q5 {
                            let mask = |hl: usize| {
                                let at = blk.add(k_quants::mask_offset(g, t, hl) + 2 * i);
                                mask16(at.cast::<u16>().read_unaligned())
                            };
                            l = vaddq_u8(l, mask(0));
                            h = vaddq_u8(h, mask(1));
                        }
                        (ql[i], qh[i]) = (vreinterpretq_s8_u8(l), vreinterpretq_s8_u8(h));
                    }
                    for j in 0..M {
                        let xq = ps[j].q.as_ptr().add(b * k_quants::BLOCK + 64 * g + 4 * t);
                        let (xl, xh) = (splat4(xq), splat4(xq.add(32)));
                        for i in 0..4 {
                            lo[j][i] = dot4::<DOT>(lo[j][i], ql[i], xl);
                            hi[j][i] = dot4::<DOT>(hi[j][i], qh[i], xh);
                        }
                    }
                }
                for j in 0..M {
                    for i in 0..4 {
                        let f = vfmaq_f32(fsum[j][i], vcvtq_f32_s32(lo[j][i]), sc[i][2 * g]);
                        fsum[j][i] = vfmaq_f32(f, vcvtq_f32_s32(hi[j][i]), sc[i][2 * g + 1]);
                    }
                }
            }
            for j in 0..M {
                let sums = ps[j].sums.as_ptr().add(b * 8);
                let dx = vdupq_n_f32(*ps[j].d.as_ptr().add(b));
                for i in 0..4 {
                    let mut msum = vdupq_n_s32(0);
                    for s in 0..8 {
                        msum = vmlaq_s32(msum, mn[i][s], vdupq_n_s32(*sums.add(s)));
                    }
                    let a = vfmaq_f32(acc[j][i], fsum[j][i], vmulq_f32(d[i], dx));
                    acc[j][i] = vfmsq_f32(a, vcvtq_f32_s32(msum), vmulq_f32(dmin[i], dx));
                }
            }
        }
    }
    // SAFETY: plain stores of the accumulators.
    acc.map(|a| unsafe { store16(a) })
}

/// [`q4_k_dots_with`] with `sdot`.
///
/// # Safety
/// As [`q4_k_dots_with`], with FEAT_DotProd.
#[target_feature(enable = "neon,dotprod")]
unsafe fn q4_k_dots_dot<const M: usize, const Q5: bool>(
    grp: *const u8,
    nb: usize,
    ps: [&k_quants::Natural; M],
) -> [[f32; GROUP]; M] {
    // SAFETY: the caller's contract.
    unsafe { q4_k_dots_with::<M, Q5, true>(grp, nb, ps) }
}

/// [`q4_k_dots_with`] without `sdot`.
///
/// # Safety
/// As [`q4_k_dots_with`].
#[target_feature(enable = "neon")]
unsafe fn q4_k_dots_plain<const M: usize, const Q5: bool>(
    grp: *const u8,
    nb: usize,
    ps: [&k_quants::Natural; M],
) -> [[f32; GROUP]; M] {
    // SAFETY: the caller's contract.
    unsafe { q4_k_dots_with::<M, Q5, false>(grp, nb, ps) }
}

/// The packed kernels with `sdot` (FEAT_DotProd).
pub mod dot {
    use super::{q4_k_dots_dot, q8_0_dots_dot};
    crate::kernels::quant::packed_kernels!(q8_0_dots_dot, q4_k_dots_dot);
}

/// The packed kernels without `sdot`.
pub mod plain {
    use super::{q4_k_dots_plain, q8_0_dots_plain};
    crate::kernels::quant::packed_kernels!(q8_0_dots_plain, q4_k_dots_plain);
}

/// Rows `rows` of column block `nb` of [`crate::kernels::panel::conv`]: each of its two panels
/// in turn, 6 rows at a time (24 accumulators of 4 lanes, the panel's four weight vectors and
/// the broadcasts in the 32 registers). `fmla` by element is fused, as the twin's `mul_add`.
///
/// # Safety
/// As [`crate::kernels::panel::conv`], with NEON.
pub unsafe fn panel_block(
    w: *const f32,
    x: *const f32,
    y: *mut f32,
    s: crate::kernels::panel::Conv,
    nb: usize,
    rows: std::ops::Range<usize>,
) {
    for p in 2 * nb..2 * nb + 2 {
        crate::kernels::panel::row_groups(rows.clone(), &[6, 4, 2], |t, r| {
            // SAFETY: the caller's contract; rows t..t + r lie below `rows.end` <= t_out.
            unsafe {
                match r {
                    6 => panel_rows::<6>(w, x, y, s, p, t),
                    4 => panel_rows::<4>(w, x, y, s, p, t),
                    2 => panel_rows::<2>(w, x, y, s, p, t),
                    _ => panel_rows::<1>(w, x, y, s, p, t),
                }
            }
        });
    }
}

/// Output rows `t..t + R` of panel `p` (16 columns, four vectors of 4).
///
/// # Safety
/// As [`panel_block`]; rows `t..t + R` are below `t_out`.
#[target_feature(enable = "neon")]
unsafe fn panel_rows<const R: usize>(
    w: *const f32,
    x: *const f32,
    y: *mut f32,
    s: crate::kernels::panel::Conv,
    p: usize,
    t: usize,
) {
    use crate::kernels::panel::{CHAIN, PANEL};
    let k = s.taps * s.c_in;
    let wp = w.wrapping_add(p * PANEL * k);
    let o0 = p * PANEL;
    let out: [*mut f32; R] = std::array::from_fn(|i| y.wrapping_add((t + i) * s.n + o0));
    let mut first = true;
    for j in 0..s.taps {
        // Row t + i of this tap: input row t + i + j · dilation, one pointer each.
        let rows: [*const f32; R] =
            std::array::from_fn(|i| x.wrapping_add((t + i + j * s.dilation) * s.c_in));
        let mut pw = wp.wrapping_add(j * s.c_in * PANEL);
        for c0 in (0..s.c_in).step_by(CHAIN) {
            let mut acc = [[vdupq_n_f32(0.0); 4]; R];
            for c in c0..(c0 + CHAIN).min(s.c_in) {
                // SAFETY: weights (j · c_in + c, panel p) inside `w`; input rows t + i +
                // j · dilation < t_out + span for i < R, channel c < c_in.
                unsafe {
                    let wv: [float32x4_t; 4] = std::array::from_fn(|q| vld1q_f32(pw.add(4 * q)));
                    for (acc, row) in acc.iter_mut().zip(&rows) {
                        let xv = *row.add(c);
                        for (a, &wq) in acc.iter_mut().zip(&wv) {
                            *a = vfmaq_n_f32(*a, wq, xv);
                        }
                    }
                }
                pw = pw.wrapping_add(PANEL);
            }
            // The chain into the output rows: stored first, then added.
            for (acc, &row) in acc.iter().zip(&out) {
                for (q, &a) in acc.iter().enumerate() {
                    // SAFETY: output row t + i < t_out, columns o0 + 4q..o0 + 4q + 4 <= n.
                    unsafe {
                        let at = row.add(4 * q);
                        let v = if first {
                            a
                        } else {
                            vaddq_f32(vld1q_f32(at), a)
                        };
                        vst1q_f32(at, v);
                    }
                }
            }
            first = false;
        }
    }
}

/// Rows `rows` of column block `nb` of an 8-bit decoder product ([`crate::kernels::int8`]):
/// each of its two panels in turn, 4 rows at a time (16 accumulators of 4 lanes). `sdot` takes
/// both sides signed, so the input bytes `xq + 128` get their top bit flipped back to `xq` and
/// the sums need no correction: they are `Σ xq · wq` exactly, as on x86.
///
/// # Safety
/// As [`crate::kernels::int8::conv`]'s kernels: `ops` holds the packed matrix and the input rows
/// that `rows` read, `y` the output rows; the CPU has NEON and FEAT_DotProd.
pub(crate) unsafe fn int8_block(
    ops: crate::kernels::int8::Operands,
    y: *mut f32,
    s: crate::kernels::int8::Conv,
    nb: usize,
    rows: std::ops::Range<usize>,
) {
    for p in 2 * nb..2 * nb + 2 {
        crate::kernels::panel::row_groups(rows.clone(), &[4, 2], |t, r| {
            // SAFETY: the caller's contract; rows t..t + r lie in `rows`, panel p in block nb.
            unsafe {
                match r {
                    4 => int8_rows::<4>(ops, y, s, p, t),
                    2 => int8_rows::<2>(ops, y, s, p, t),
                    _ => int8_rows::<1>(ops, y, s, p, t),
                }
            }
        });
    }
}

/// Output rows `t..t + R` of panel `p`: per group of four channels, the panel's line (four
/// vectors of four columns) times each row's four input bytes, one `sdot` per row and vector;
/// each run's sums then go into the f32 totals kept in the output rows.
///
/// # Safety
/// As [`int8_block`]; rows `t..t + R` are below `t_out`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn int8_rows<const R: usize>(
    ops: crate::kernels::int8::Operands,
    y: *mut f32,
    s: crate::kernels::int8::Conv,
    p: usize,
    t: usize,
) {
    use crate::kernels::int8::{runs, GROUP as G8, PANEL, RUN};
    let (k, nr) = (s.taps * s.c_in, runs(s.c_in));
    let w0 = ops.w.wrapping_add(p * PANEL * k);
    let o0 = p * PANEL;
    let out: [*mut f32; R] = std::array::from_fn(|i| y.wrapping_add((t + i) * s.n + o0));
    // SAFETY: register-only.
    let flip = unsafe { vdupq_n_s8(i8::MIN) };
    let mut first = true;
    for j in 0..s.taps {
        let r: [usize; R] = std::array::from_fn(|i| t + i + j * s.dilation - ops.r0);
        let xrows: [*const u8; R] = std::array::from_fn(|i| ops.xq.wrapping_add(r[i] * s.c_in));
        for u in 0..nr {
            let (c0, c1) = (u * RUN, ((u + 1) * RUN).min(s.c_in));
            let mut pw = w0.wrapping_add((j * s.c_in + c0) * PANEL);
            // SAFETY: register-only.
            let mut acc = [[unsafe { vdupq_n_s32(0) }; 4]; R];
            for c in (c0..c1).step_by(G8) {
                // SAFETY: group (j · c_in + c) / 4 of the panel inside the packed matrix; four
                // channels c.. of each held input row; the CPU has FEAT_DotProd.
                unsafe {
                    let wv: [int8x16_t; 4] =
                        std::array::from_fn(|q| vld1q_s8(pw.add(16 * q).cast()));
                    for (acc, row) in acc.iter_mut().zip(&xrows) {
                        let xv = veorq_s8(splat4(row.add(c).cast()), flip);
                        for (a, &wq) in acc.iter_mut().zip(&wv) {
                            *a = sdot(*a, wq, xv);
                        }
                    }
                }
                pw = pw.wrapping_add(G8 * PANEL);
            }
            let run = (j * nr + u) * s.n + o0;
            for i in 0..R {
                // SAFETY: run (j, u)'s scales of columns o0..o0 + 16; row r[i]'s run-u scale;
                // output row t + i < t_out, columns o0..o0 + 16 <= n.
                unsafe {
                    let sx = vdupq_n_f32(*ops.sx.add(r[i] * nr + u));
                    for q in 0..4 {
                        let coef = vmulq_f32(sx, vld1q_f32(ops.sw.add(run + 4 * q)));
                        let sum = vcvtq_f32_s32(acc[i][q]);
                        let at = out[i].add(4 * q);
                        let total = if first {
                            vdupq_n_f32(0.0)
                        } else {
                            vld1q_f32(at)
                        };
                        vst1q_f32(at, vfmaq_f32(total, sum, coef));
                    }
                }
            }
            first = false;
        }
    }
}
