//! The quantized products on AVX-VNNI (the VEX-encoded 256-bit `vpdpbusd` and `vpdpwssd` of
//! Intel Alder Lake and later, N100 included, and AMD Zen 5), over rows packed 16 at a time
//! ([`crate::kernels::quant`]): the AVX2 kernels' layout and float arithmetic (one row per 32-bit
//! lane, two vectors a group), with each step's integer products summed in 32 bits by one
//! instruction where AVX2 needs `vpmaddubsw`, `vpmaddwd` and an add. q8_0's packed weights are
//! `q + 128` (unsigned), as `vpdpbusd` takes them: each block's sum starts at `−128 · Σ xq`, as on
//! AVX-512 VNNI. The integer sums are exact either way, so each kernel gives the scalar twin's
//! bits.
//!
//! Only [`crate::kernels::quant::packed_kernel`] hands these out, where the CPU has AVX2, FMA,
//! F16C and AVX-VNNI and the tier allows them.

use std::arch::x86_64::*;

use super::avx2::{mask16, store16, KScales};
use crate::kernels::quant::{k_quants, q8_0, GROUP};

crate::kernels::quant::packed_kernels!(q8_0_dots, q4_k_dots);

/// How far ahead the kernels ask for the weights' cache lines (into L2), in bytes.
const AHEAD: usize = 16 * 1024;

/// The products of one packed q8_0 group (16 rows of `nb` blocks at `grp`) with `M` inputs:
/// each block's integer sums start at [`q8_0::Prepared::start`] (`−128 · Σ xq`) and add the
/// packed `q + 128` weights by `vpdpbusd`, so they end at `Σ q · xq` exactly.
///
/// # Safety
/// `grp` points at `nb / 2` packed pairs, each input holds `nb` blocks; the CPU has AVX2, FMA,
/// F16C and AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::needless_range_loop)] // `h` picks the half of several arrays at once.
unsafe fn q8_0_dots<const M: usize>(
    grp: *const u8,
    nb: usize,
    ps: [&q8_0::Prepared; M],
) -> [[f32; GROUP]; M] {
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    for b in 0..nb {
        let pair = grp.wrapping_add(b / 2 * q8_0::PAIR_BYTES);
        // SAFETY: block b of the group and of each input (the caller's contract); the
        // prefetches are hints, never dereferenced, and may point past the matrix.
        unsafe {
            if b % 2 == 0 {
                for l in 0..q8_0::PAIR_BYTES / 64 {
                    _mm_prefetch::<_MM_HINT_T1>(pair.wrapping_add(AHEAD + 64 * l).cast());
                }
            }
            let hb = b % 2;
            let d = [
                _mm256_cvtph_ps(_mm_loadu_si128(pair.add(32 * hb).cast())),
                _mm256_cvtph_ps(_mm_loadu_si128(pair.add(32 * hb + 16).cast())),
            ];
            let q = pair.add(64 + 512 * hb);
            let mut sum = [[_mm256_setzero_si256(); 2]; M];
            for (j, p) in ps.iter().enumerate() {
                sum[j] = [_mm256_set1_epi32(*p.start.get_unchecked(b)); 2];
            }
            for t in 0..8 {
                for h in 0..2 {
                    // The weights as packed, `q + 128`: unsigned, as `vpdpbusd` takes them.
                    let v = _mm256_loadu_si256(q.add(64 * t + 32 * h).cast());
                    for (j, p) in ps.iter().enumerate() {
                        let xq = p.q.as_ptr().add(b * q8_0::BLOCK + 4 * t);
                        let x = _mm256_set1_epi32(xq.cast::<i32>().read_unaligned());
                        sum[j][h] = _mm256_dpbusd_avx_epi32(sum[j][h], v, x);
                    }
                }
            }
            for (j, p) in ps.iter().enumerate() {
                let dx = _mm256_set1_ps(*p.d.get_unchecked(b));
                for h in 0..2 {
                    let s = _mm256_cvtepi32_ps(sum[j][h]);
                    acc[j][h] = _mm256_fmadd_ps(s, _mm256_mul_ps(d[h], dx), acc[j][h]);
                }
            }
        }
    }
    // SAFETY: plain stores of the accumulators.
    acc.map(|a| unsafe { store16(a) })
}

/// The products of one packed q4_K (or q5_K when `Q5`) group with `M` inputs, the arithmetic of
/// [`crate::kernels::quant::k_quants`]: the nibbles' products summed in 32 bits by `vpdpbusd`
/// over a sub-block, the mins' term by `vpdpwssd`.
///
/// # Safety
/// `grp` points at `nb` packed blocks, each input holds `nb` blocks; the CPU has AVX2, FMA,
/// F16C and AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
#[allow(clippy::needless_range_loop)] // `h` picks the half of several arrays at once.
unsafe fn q4_k_dots<const M: usize, const Q5: bool>(
    grp: *const u8,
    nb: usize,
    ps: [&k_quants::Natural; M],
) -> [[f32; GROUP]; M] {
    let block_bytes = if Q5 {
        k_quants::GROUP_BLOCK5
    } else {
        k_quants::GROUP_BLOCK
    };
    let low = _mm256_set1_epi8(0x0f);
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    for b in 0..nb {
        let blk = grp.wrapping_add(b * block_bytes);
        // SAFETY: block b of the group and of each input (the caller's contract); the
        // prefetches are hints, never dereferenced, and may point past the matrix.
        unsafe {
            for l in 0..block_bytes / 64 {
                _mm_prefetch::<_MM_HINT_T1>(blk.wrapping_add(AHEAD + 64 * l).cast());
            }
            let qs = blk.add(if Q5 { k_quants::NIBBLES5 } else { 256 });
            for h in 0..2 {
                let sc = KScales::read(blk, h);
                let mut fsum = [_mm256_setzero_ps(); M];
                for g in 0..4 {
                    let mut lo = [_mm256_setzero_si256(); M];
                    let mut hi = [_mm256_setzero_si256(); M];
                    for t in 0..8 {
                        let v = _mm256_loadu_si256(qs.add((g * 8 + t) * 64 + 32 * h).cast());
                        let mut ql = _mm256_and_si256(v, low);
                        let mut qh = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                        if Q5 {
                            let bits = |hl: usize| {
                                let at = blk.add(k_quants::mask_offset(g, t, hl) + 4 * h);
                                mask16(at.cast::<u32>().read_unaligned())
                            };
                            ql = _mm256_add_epi8(ql, bits(0));
                            qh = _mm256_add_epi8(qh, bits(1));
                        }
                        for j in 0..M {
                            let xq = ps[j].q.as_ptr().add(b * k_quants::BLOCK + 64 * g + 4 * t);
                            let xl = _mm256_set1_epi32(xq.cast::<i32>().read_unaligned());
                            let xh = _mm256_set1_epi32(xq.add(32).cast::<i32>().read_unaligned());
                            lo[j] = _mm256_dpbusd_avx_epi32(lo[j], ql, xl);
                            hi[j] = _mm256_dpbusd_avx_epi32(hi[j], qh, xh);
                        }
                    }
                    let (s0, s1) = (sc.scale(2 * g), sc.scale(2 * g + 1));
                    for j in 0..M {
                        fsum[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[j]), s0, fsum[j]);
                        fsum[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[j]), s1, fsum[j]);
                    }
                }
                let mins = sc.min_pairs();
                for j in 0..M {
                    let pairs = ps[j].min_pairs.as_ptr().add(b * 4);
                    let mut msum = _mm256_setzero_si256();
                    for (p, &mp) in mins.iter().enumerate() {
                        let x = _mm256_set1_epi32(*pairs.add(p));
                        msum = _mm256_dpwssd_avx_epi32(msum, mp, x);
                    }
                    let dx = _mm256_set1_ps(*ps[j].d.as_ptr().add(b));
                    acc[j][h] = _mm256_fmadd_ps(fsum[j], _mm256_mul_ps(sc.d, dx), acc[j][h]);
                    acc[j][h] = _mm256_fnmadd_ps(
                        _mm256_cvtepi32_ps(msum),
                        _mm256_mul_ps(sc.dmin, dx),
                        acc[j][h],
                    );
                }
            }
        }
    }
    // SAFETY: plain stores of the accumulators.
    acc.map(|a| unsafe { store16(a) })
}

/// Rows `rows` of column block `nb` of an 8-bit decoder product ([`crate::kernels::int8`]):
/// one panel at a time, 6 rows by two vectors of 8 columns.
///
/// # Safety
/// As [`crate::kernels::int8::conv`]'s kernels: `ops` holds the packed matrix and the input rows
/// that `rows` read, `y` the output rows; the CPU has AVX2, FMA and AVX-VNNI.
pub(crate) unsafe fn int8_block(
    ops: crate::kernels::int8::Operands,
    y: *mut f32,
    s: crate::kernels::int8::Conv,
    nb: usize,
    rows: std::ops::Range<usize>,
) {
    for p in [2 * nb, 2 * nb + 1] {
        crate::kernels::panel::row_groups(rows.clone(), &[6, 4, 2], |t, r| {
            // SAFETY: the caller's contract; rows t..t + r lie in `rows`, panel p in block nb.
            unsafe {
                match r {
                    6 => int8_rows::<6>(ops, y, s, p, t),
                    4 => int8_rows::<4>(ops, y, s, p, t),
                    2 => int8_rows::<2>(ops, y, s, p, t),
                    _ => int8_rows::<1>(ops, y, s, p, t),
                }
            }
        });
    }
}

/// Output rows `t..t + R` of panel `p`: per group of four channels, the panel's line (two
/// vectors) times each row's four broadcast input bytes, one `vpdpbusd` per row and half; each
/// run's sums then go into the f32 totals kept in the output rows.
///
/// # Safety
/// As [`int8_block`]; rows `t..t + R` are below `t_out`.
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn int8_rows<const R: usize>(
    ops: crate::kernels::int8::Operands,
    y: *mut f32,
    s: crate::kernels::int8::Conv,
    p: usize,
    t: usize,
) {
    use crate::kernels::int8::{runs, GROUP, PANEL, RUN};
    let (k, nr) = (s.taps * s.c_in, runs(s.c_in));
    let w0 = ops.w.wrapping_add(p * PANEL * k);
    let o0 = p * PANEL;
    let out: [*mut f32; R] = std::array::from_fn(|i| y.wrapping_add((t + i) * s.n + o0));
    let mut first = true;
    for j in 0..s.taps {
        let r: [usize; R] = std::array::from_fn(|i| t + i + j * s.dilation - ops.r0);
        let xrows: [*const u8; R] = std::array::from_fn(|i| ops.xq.wrapping_add(r[i] * s.c_in));
        for u in 0..nr {
            let (c0, c1) = (u * RUN, ((u + 1) * RUN).min(s.c_in));
            let mut pw = w0.wrapping_add((j * s.c_in + c0) * PANEL);
            let mut acc = [[_mm256_setzero_si256(); 2]; R];
            for c in (c0..c1).step_by(GROUP) {
                // SAFETY: group (j · c_in + c) / 4 of the panel inside the packed matrix; four
                // channels c.. of each held input row.
                unsafe {
                    let bw = [
                        _mm256_loadu_si256(pw.cast()),
                        _mm256_loadu_si256(pw.add(32).cast()),
                    ];
                    for (acc, row) in acc.iter_mut().zip(&xrows) {
                        let xv = _mm256_set1_epi32(row.add(c).cast::<i32>().read_unaligned());
                        acc[0] = _mm256_dpbusd_avx_epi32(acc[0], xv, bw[0]);
                        acc[1] = _mm256_dpbusd_avx_epi32(acc[1], xv, bw[1]);
                    }
                }
                pw = pw.wrapping_add(GROUP * PANEL);
            }
            let run = (j * nr + u) * s.n + o0;
            // SAFETY: run (j, u)'s scales and corrections of columns o0..o0 + 16; each row's
            // run-u scale; output rows t + i < t_out, columns o0..o0 + 16 <= n.
            unsafe {
                let corr = [
                    _mm256_loadu_si256(ops.corr.add(run).cast()),
                    _mm256_loadu_si256(ops.corr.add(run + 8).cast()),
                ];
                let sw = [
                    _mm256_loadu_ps(ops.sw.add(run)),
                    _mm256_loadu_ps(ops.sw.add(run + 8)),
                ];
                for i in 0..R {
                    let sx = _mm256_set1_ps(*ops.sx.add(r[i] * nr + u));
                    for h in 0..2 {
                        let sum = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[i][h], corr[h]));
                        let coef = _mm256_mul_ps(sx, sw[h]);
                        let at = out[i].add(8 * h);
                        let total = if first {
                            _mm256_setzero_ps()
                        } else {
                            _mm256_loadu_ps(at)
                        };
                        _mm256_storeu_ps(at, _mm256_fmadd_ps(sum, coef, total));
                    }
                }
            }
            first = false;
        }
    }
}
