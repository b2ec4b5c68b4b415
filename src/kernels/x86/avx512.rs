//! AVX-512 F and BW kernels: the heads' dot products ([`crate::kernels::dot`]), SnakeBeta
//! ([`crate::kernels::snake`]), one row's q8_0 attention ([`crate::kernels::attend`]) and the
//! decoder's packed f32 products ([`crate::kernels::panel`]).

use std::arch::x86_64::*;

use crate::kernels::attend::{q8_scale, softmax_rows, MAX_GROUP, Q8_0_BLOCK};
use crate::kernels::dot::LANES;
use crate::kernels::snake::{snake, PIO2_1, PIO2_2, PIO2_3, REDUCED, S1, S2, S3, TWO_OVER_PI};

/// The 64 lanes of [`crate::kernels::dot`]'s order, four registers of 16.
///
/// # Safety
/// The CPU has AVX-512F; `a.len() == b.len()` is a multiple of 64.
#[target_feature(enable = "avx512f")]
pub unsafe fn dot_lanes(a: &[f32], b: &[f32], lanes: &mut [f32; LANES]) {
    // SAFETY: every load reads 16 floats at an offset below len - 15 (len is a multiple of 64);
    // unaligned loads and stores are used throughout.
    unsafe {
        let mut acc = [_mm512_setzero_ps(); 4];
        for i in (0..a.len()).step_by(LANES) {
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm512_loadu_ps(a.as_ptr().add(i + 16 * r));
                let y = _mm512_loadu_ps(b.as_ptr().add(i + 16 * r));
                *acc = _mm512_fmadd_ps(x, y, *acc);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(lanes.as_mut_ptr().add(16 * r), *acc);
        }
    }
}

/// [`super::avx2::snake_row`] 16 lanes at a time: the first multiple-of-16 part of the row, the
/// same operations in the same order.
///
/// # Safety
/// The CPU has AVX-512 F (`Tier::Avx512`); `alpha`, `inv_beta` and `y` are at least as long as `x`.
#[target_feature(enable = "avx512f")]
pub unsafe fn snake_row(x: &[f32], alpha: &[f32], inv_beta: &[f32], y: &mut [f32]) -> usize {
    let n = x.len() / 16 * 16;
    let limit = _mm512_set1_ps(REDUCED);
    let mut i = 0;
    while i < n {
        // SAFETY: i + 16 ≤ n ≤ every slice's length.
        let (xv, av, bv) = unsafe {
            (
                _mm512_loadu_ps(x.as_ptr().add(i)),
                _mm512_loadu_ps(alpha.as_ptr().add(i)),
                _mm512_loadu_ps(inv_beta.as_ptr().add(i)),
            )
        };
        let t = _mm512_mul_ps(av, xv);
        if _mm512_cmp_ps_mask::<_CMP_LE_OQ>(_mm512_abs_ps(t), limit) != 0xffff {
            for k in i..i + 16 {
                y[k] = snake(x[k], alpha[k], inv_beta[k]);
            }
            i += 16;
            continue;
        }
        let j = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(t, _mm512_set1_ps(TWO_OVER_PI)),
        );
        // The same operations as the scalar `sin2`, fused where it fuses.
        let r = _mm512_fnmadd_ps(j, _mm512_set1_ps(PIO2_1), t);
        let r = _mm512_fnmadd_ps(j, _mm512_set1_ps(PIO2_2), r);
        let r = _mm512_fnmadd_ps(j, _mm512_set1_ps(PIO2_3), r);
        let z = _mm512_mul_ps(r, r);
        let p = _mm512_fmadd_ps(z, _mm512_set1_ps(S3), _mm512_set1_ps(S2));
        let p = _mm512_fmadd_ps(z, p, _mm512_set1_ps(S1));
        let s = _mm512_fmadd_ps(_mm512_mul_ps(r, z), p, r);
        let s2 = _mm512_mul_ps(s, s);
        let odd = _mm512_test_epi32_mask(_mm512_cvtps_epi32(j), _mm512_set1_epi32(1));
        let v = _mm512_mask_sub_ps(s2, odd, _mm512_set1_ps(1.0), s2);
        let out = _mm512_fmadd_ps(bv, v, xv);
        // SAFETY: as for the loads.
        unsafe { _mm512_storeu_ps(y.as_mut_ptr().add(i), out) };
        i += 16;
    }
    n
}

/// [`crate::kernels::attend::attend_q8_group`] in AVX-512 (BW for the 16-bit products): each key
/// block's dot with a query block is an integer product (`vpmaddwd`) scaled by both blocks'
/// scales; a key or value row is read once for all the heads of its group.
///
/// # Safety
/// As [`crate::kernels::attend::GroupKernel`]; the CPU has AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_q8_group(
    q: &[u8],
    d: usize,
    (k, v): (*const u8, *const u8),
    row: usize,
    n: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let nb = d / 32;
    let group = q.len() / (nb * Q8_0_BLOCK);
    // The queries in q8_0, as 16-bit lanes per block, and their scales.
    let mut q16 = [[_mm512_setzero_si512(); 8]; MAX_GROUP];
    let mut qd = [[0f32; 8]; MAX_GROUP];
    for h in 0..group {
        for b in 0..nb {
            let blk = &q[(h * nb + b) * Q8_0_BLOCK..][..Q8_0_BLOCK];
            // SAFETY: a whole block; 32 bytes of its values after the scale.
            unsafe {
                qd[h][b] = q8_scale(blk.as_ptr());
                q16[h][b] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(blk[2..].as_ptr().cast()));
            }
        }
    }
    scores.clear();
    scores.resize(group * n, 0.0);
    for t in 0..n {
        let mut acc = [_mm512_setzero_ps(); MAX_GROUP];
        for b in 0..nb {
            // SAFETY: block b of this head's key row at position t (the caller's contract).
            let (kd, kv) = unsafe {
                let p = k.add(t * row + b * Q8_0_BLOCK);
                (
                    q8_scale(p),
                    _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.add(2).cast())),
                )
            };
            for h in 0..group {
                let dot = _mm512_cvtepi32_ps(_mm512_madd_epi16(kv, q16[h][b]));
                acc[h] = _mm512_fmadd_ps(dot, _mm512_set1_ps(kd * qd[h][b]), acc[h]);
            }
        }
        for h in 0..group {
            scores[h * n + t] = _mm512_reduce_add_ps(acc[h]) * scale;
        }
    }
    softmax_rows(scores, n);
    // Each head's output, 16 lanes at a time: at most 16 vectors of 16 for 256 values.
    let mut o = [[_mm512_setzero_ps(); 16]; MAX_GROUP];
    for t in 0..n {
        for b in 0..nb {
            // SAFETY: block b of this head's value row at position t (the caller's contract).
            let (lo, hi) = unsafe {
                let p = v.add(t * row + b * Q8_0_BLOCK);
                let vd = _mm512_set1_ps(q8_scale(p));
                let x = _mm256_loadu_si256(p.add(2).cast());
                (
                    _mm512_mul_ps(
                        vd,
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(x))),
                    ),
                    _mm512_mul_ps(
                        vd,
                        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(x, 1))),
                    ),
                )
            };
            for h in 0..group {
                let w = _mm512_set1_ps(scores[h * n + t]);
                o[h][2 * b] = _mm512_fmadd_ps(w, lo, o[h][2 * b]);
                o[h][2 * b + 1] = _mm512_fmadd_ps(w, hi, o[h][2 * b + 1]);
            }
        }
    }
    for h in 0..group {
        for (j, lanes) in o[h][..2 * nb].iter().enumerate() {
            // SAFETY: 16 values of head h's output, inside `out`.
            unsafe { _mm512_storeu_ps(out[h * d + 16 * j..].as_mut_ptr(), *lanes) };
        }
    }
}

/// [`crate::kernels::read_all`]: the bytes as 64-byte vectors of 32-bit integers, summed in four
/// chains, the tail byte by byte.
///
/// # Safety
/// The CPU has AVX-512 F.
#[target_feature(enable = "avx512f")]
pub unsafe fn read_all(bytes: &[u8]) -> u64 {
    let mut acc = [_mm512_setzero_si512(); 4];
    let chunks = bytes.chunks_exact(256);
    let tail = chunks.remainder();
    for c in chunks {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: 64 bytes of the 256-byte chunk.
            let v = unsafe { _mm512_loadu_si512(c.as_ptr().add(64 * i).cast()) };
            *a = _mm512_add_epi32(*a, v);
        }
    }
    let s = _mm512_add_epi32(
        _mm512_add_epi32(acc[0], acc[1]),
        _mm512_add_epi32(acc[2], acc[3]),
    );
    let t: u64 = tail.iter().map(|&b| b as u64).sum();
    (_mm512_reduce_add_epi32(s) as u32 as u64).wrapping_add(t)
}

/// Rows of a [`crate::kernels::panel`] block computed together: 16 accumulators (two panels
/// each), the two weight vectors and the broadcasts stay in registers, and the rows' pointers in
/// general registers.
const PANEL_ROWS: usize = 8;

/// Rows `rows` of column block `nb` of [`crate::kernels::panel::conv`], [`PANEL_ROWS`] at a time;
/// the weights `w` are f32, or f16 widened as they are loaded when `F16`.
///
/// # Safety
/// As [`crate::kernels::panel::conv`], with AVX-512 F.
pub unsafe fn panel_block<const F16: bool>(
    w: *const u8,
    x: *const f32,
    y: *mut f32,
    s: crate::kernels::panel::Conv,
    nb: usize,
    rows: std::ops::Range<usize>,
) {
    crate::kernels::panel::row_groups(rows, &[PANEL_ROWS, 4, 2], |t, r| {
        // SAFETY: the caller's contract; rows t..t + r lie below `rows.end` <= t_out.
        unsafe {
            match r {
                PANEL_ROWS => panel_rows::<PANEL_ROWS, F16>(w, x, y, s, nb, t),
                4 => panel_rows::<4, F16>(w, x, y, s, nb, t),
                2 => panel_rows::<2, F16>(w, x, y, s, nb, t),
                _ => panel_rows::<1, F16>(w, x, y, s, nb, t),
            }
        }
    });
}

/// Output rows `t..t + R` of column block `nb`: per reduction value, two 16-column weight
/// vectors (f16 widened by `vcvtph2ps` when `F16`, exact) times each row's broadcast input
/// value, one `vfmadd` per row and panel.
///
/// # Safety
/// As [`panel_block`]; rows `t..t + R` are below `t_out`.
#[target_feature(enable = "avx512f")]
unsafe fn panel_rows<const R: usize, const F16: bool>(
    w: *const u8,
    x: *const f32,
    y: *mut f32,
    s: crate::kernels::panel::Conv,
    nb: usize,
    t: usize,
) {
    use crate::kernels::panel::{CHAIN, PANEL};
    // Bytes of one weight, and of one panel line.
    let es = if F16 { 2 } else { 4 };
    let line = PANEL * es;
    let k = s.taps * s.c_in;
    let w0 = w.wrapping_add(2 * nb * k * line);
    let w1 = w0.wrapping_add(k * line);
    let o0 = 2 * nb * PANEL;
    let out: [*mut f32; R] = std::array::from_fn(|i| y.wrapping_add((t + i) * s.n + o0));
    let mut first = true;
    for j in 0..s.taps {
        // Row t + i of this tap: input row t + i + j · dilation, one pointer each (kept in
        // registers, not recomputed per value).
        let rows: [*const f32; R] =
            std::array::from_fn(|i| x.wrapping_add((t + i + j * s.dilation) * s.c_in));
        let (mut p0, mut p1) = (
            w0.wrapping_add(j * s.c_in * line),
            w1.wrapping_add(j * s.c_in * line),
        );
        for c0 in (0..s.c_in).step_by(CHAIN) {
            let mut acc = [[_mm512_setzero_ps(); 2]; R];
            for c in c0..(c0 + CHAIN).min(s.c_in) {
                // SAFETY: weights (j · c_in + c, both panels) inside `w`; input rows t + i +
                // j · dilation < t_out + span for i < R, channel c < c_in.
                unsafe {
                    let (bw0, bw1) = if F16 {
                        (
                            _mm512_cvtph_ps(_mm256_loadu_si256(p0.cast())),
                            _mm512_cvtph_ps(_mm256_loadu_si256(p1.cast())),
                        )
                    } else {
                        (_mm512_loadu_ps(p0.cast()), _mm512_loadu_ps(p1.cast()))
                    };
                    for (acc, row) in acc.iter_mut().zip(&rows) {
                        let xv = _mm512_set1_ps(*row.add(c));
                        acc[0] = _mm512_fmadd_ps(xv, bw0, acc[0]);
                        acc[1] = _mm512_fmadd_ps(xv, bw1, acc[1]);
                    }
                }
                (p0, p1) = (p0.wrapping_add(line), p1.wrapping_add(line));
            }
            // The chain into the output rows: stored first, then added.
            for (acc, &row) in acc.iter().zip(&out) {
                // SAFETY: output row t + i < t_out, columns o0..o0 + 32 <= n.
                unsafe {
                    let (a, b) = if first {
                        (acc[0], acc[1])
                    } else {
                        (
                            _mm512_add_ps(_mm512_loadu_ps(row), acc[0]),
                            _mm512_add_ps(_mm512_loadu_ps(row.add(PANEL)), acc[1]),
                        )
                    };
                    _mm512_storeu_ps(row, a);
                    _mm512_storeu_ps(row.add(PANEL), b);
                }
            }
            first = false;
        }
    }
}

/// One run of 32 values of [`crate::kernels::int8::quantize_rows`]: the largest magnitude (NaN
/// ignored), each value times 127 over it, NaN to 0, clamped to ±127, rounded to the nearest
/// (ties to even), plus 128, into `q`; returns the run's scale. The twin's bytes and scale.
///
/// # Safety
/// AVX-512 F; `v` holds 32 values, `q` room for 32 bytes.
#[target_feature(enable = "avx512f")]
pub unsafe fn quantize_run32(v: *const f32, q: *mut u8) -> f32 {
    // SAFETY: 32 values at `v`, 32 bytes at `q` (the caller's contract).
    unsafe {
        let (a, b) = (_mm512_loadu_ps(v), _mm512_loadu_ps(v.add(16)));
        // `max(x, m)` gives `m` where `x` is NaN: NaN ignored, as the twin's `f32::max`.
        let m = _mm512_max_ps(_mm512_abs_ps(a), _mm512_setzero_ps());
        let m = _mm512_max_ps(_mm512_abs_ps(b), m);
        let (scale, inv) = crate::kernels::int8::scale_of_max(_mm512_reduce_max_ps(m));
        let inv = _mm512_set1_ps(inv);
        let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        for (i, x) in [a, b].into_iter().enumerate() {
            let x = _mm512_mul_ps(x, inv);
            let x = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(x, x), x);
            let x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
            let n =
                _mm512_cvt_roundps_epi32::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            let n = _mm512_add_epi32(n, _mm512_set1_epi32(128));
            _mm_storeu_si128(q.add(16 * i).cast(), _mm512_cvtepi32_epi8(n));
        }
        scale
    }
}
