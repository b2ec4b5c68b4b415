//! The quantized products on AVX-512 VNNI (`vpdpbusd`), over rows packed 16 at a time
//! ([`crate::kernels::quant`]): each 32-bit lane of a vector is one row, so a `vpdpbusd` adds
//! four weights of each of 16 rows times the same four inputs, and no horizontal sum is needed
//! until the end of a row. Each follows its type's fixed arithmetic (the module docs of
//! [`q8_0`](crate::kernels::quant::q8_0) and [`k_quants`](crate::kernels::quant::k_quants)), so it gives
//! the scalar twin's bits.
//!
//! q8_0's packed weights are `q + 128` (unsigned), so each block's integer sum starts at
//! `−128 · Σ xq` ([`Prepared::start`]): `Σ (q + 128) · xq − 128 · Σ xq = Σ q · xq` exactly. q4_K's
//! high nibbles stay where they are, 16 times their value, and their sub-block scale is divided
//! by 16 (exact, and the same fused product); q5_K's fifth bits are added as 16 by a masked byte
//! add. The mins' term of the K types is four `vpdpwssd` of the rows' mins (as 16-bit pairs) with
//! the input's sub-block sums.
//!
//! Only [`crate::kernels::quant::packed_kernel`] hands these out, where the CPU has AVX-512 F,
//! BW, VL, VNNI and F16C.

use std::arch::x86_64::*;

use crate::kernels::quant::k_quants::{
    mask_offset, Natural, BLOCK as K_BLOCK, GROUP_BLOCK, GROUP_BLOCK5, NIBBLES5,
};
use crate::kernels::quant::q8_0::{Prepared, BLOCK, PAIR_BYTES};
use crate::kernels::quant::GROUP;

crate::kernels::quant::packed_kernels!(q8_0_dots, q4_k_dots);

/// How far ahead of the pair being read [`q8_0_dots`] asks for the weights' cache lines (into
/// L2), in pairs of blocks: 17 KB.
const AHEAD_PAIRS: usize = 16;

/// The products of one packed group (16 rows of `nb` blocks at `grp`) with `M` inputs, one
/// vector of 16 row results per input. Per block, the steps run in two independent chains
/// (even and odd), so that `vpdpbusd`'s latency is not the loop's.
///
/// # Safety
/// `grp` points at `nb / 2` packed pairs, each input holds `nb` blocks; the CPU has the
/// features this module enables.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
unsafe fn q8_0_dots<const M: usize>(
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
/// features this module enables.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
unsafe fn q4_k_dots<const M: usize, const Q5: bool>(
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
                _mm_prefetch::<_MM_HINT_T1>(blk.wrapping_add(AHEAD * block_bytes + 64 * l).cast());
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
                        let xq = ps[j].q.as_ptr().add(b * K_BLOCK + 64 * g + 4 * t);
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

/// Rows `rows` of column block `nb` of an 8-bit decoder product ([`crate::kernels::int8`]):
/// 4 rows by two panels at a time.
///
/// # Safety
/// As [`crate::kernels::int8::conv`]'s kernels: `ops` holds the packed matrix and the input rows
/// that `rows` read, `y` the output rows; the CPU has AVX-512 F, BW and VNNI.
pub(crate) unsafe fn int8_block(
    ops: crate::kernels::int8::Operands,
    y: *mut f32,
    s: crate::kernels::int8::Conv,
    nb: usize,
    rows: std::ops::Range<usize>,
) {
    crate::kernels::panel::row_groups(rows, &[4, 2], |t, r| {
        // SAFETY: the caller's contract; rows t..t + r lie in `rows`.
        unsafe {
            match r {
                4 => int8_rows::<4>(ops, y, s, nb, t),
                2 => int8_rows::<2>(ops, y, s, nb, t),
                _ => int8_rows::<1>(ops, y, s, nb, t),
            }
        }
    });
}

/// Output rows `t..t + R` of column block `nb`: per group of four channels, two 16-column weight
/// lines times each row's four broadcast input bytes, one `vpdpbusd` per row and panel; each
/// run's sums then go into f32 totals that stay in registers until the last run of the last
/// tap (4 rows: 8 integer sums, 8 totals).
///
/// # Safety
/// As [`int8_block`]; rows `t..t + R` are below `t_out`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn int8_rows<const R: usize>(
    ops: crate::kernels::int8::Operands,
    y: *mut f32,
    s: crate::kernels::int8::Conv,
    nb: usize,
    t: usize,
) {
    use crate::kernels::int8::{runs, GROUP, PANEL, RUN};
    let (k, nr) = (s.taps * s.c_in, runs(s.c_in));
    let w0 = ops.w.wrapping_add(2 * nb * PANEL * k);
    let w1 = w0.wrapping_add(PANEL * k);
    let o0 = 2 * nb * PANEL;
    let mut total = [[_mm512_setzero_ps(); 2]; R];
    for j in 0..s.taps {
        let r: [usize; R] = std::array::from_fn(|i| t + i + j * s.dilation - ops.r0);
        let xrows: [*const u8; R] = std::array::from_fn(|i| ops.xq.wrapping_add(r[i] * s.c_in));
        for u in 0..nr {
            let (c0, c1) = (u * RUN, ((u + 1) * RUN).min(s.c_in));
            let g0 = (j * s.c_in + c0) / GROUP;
            let (mut p0, mut p1) = (
                w0.wrapping_add(g0 * GROUP * PANEL),
                w1.wrapping_add(g0 * GROUP * PANEL),
            );
            let run = (j * nr + u) * s.n + o0;
            // The sums start at −128 · Σ wq (the corrections), so they end at Σ xq · wq.
            // SAFETY: run (j, u)'s corrections of columns o0..o0 + 32.
            let corr = unsafe {
                [
                    _mm512_sub_epi32(
                        _mm512_setzero_si512(),
                        _mm512_loadu_si512(ops.corr.add(run).cast()),
                    ),
                    _mm512_sub_epi32(
                        _mm512_setzero_si512(),
                        _mm512_loadu_si512(ops.corr.add(run + PANEL).cast()),
                    ),
                ]
            };
            let mut acc = [corr; R];
            for c in (c0..c1).step_by(GROUP) {
                // SAFETY: group (j · c_in + c) / 4 of both panels inside the packed matrix;
                // four channels c.. of each held input row.
                unsafe {
                    let bw0 = _mm512_loadu_si512(p0.cast());
                    let bw1 = _mm512_loadu_si512(p1.cast());
                    for (acc, row) in acc.iter_mut().zip(&xrows) {
                        let xv = _mm512_set1_epi32(row.add(c).cast::<i32>().read_unaligned());
                        acc[0] = _mm512_dpbusd_epi32(acc[0], xv, bw0);
                        acc[1] = _mm512_dpbusd_epi32(acc[1], xv, bw1);
                    }
                }
                (p0, p1) = (
                    p0.wrapping_add(GROUP * PANEL),
                    p1.wrapping_add(GROUP * PANEL),
                );
            }
            // SAFETY: run (j, u)'s scales of columns o0..o0 + 32; each row's run-u scale.
            unsafe {
                let sw = [
                    _mm512_loadu_ps(ops.sw.add(run)),
                    _mm512_loadu_ps(ops.sw.add(run + PANEL)),
                ];
                for i in 0..R {
                    let sx = _mm512_set1_ps(*ops.sx.add(r[i] * nr + u));
                    for h in 0..2 {
                        let coef = _mm512_mul_ps(sx, sw[h]);
                        let sum = _mm512_cvtepi32_ps(acc[i][h]);
                        total[i][h] = _mm512_fmadd_ps(sum, coef, total[i][h]);
                    }
                }
            }
        }
    }
    for (i, total) in total.iter().enumerate() {
        // SAFETY: output row t + i < t_out, columns o0..o0 + 32 <= n.
        unsafe {
            let at = y.add((t + i) * s.n + o0);
            _mm512_storeu_ps(at, total[0]);
            _mm512_storeu_ps(at.add(PANEL), total[1]);
        }
    }
}
