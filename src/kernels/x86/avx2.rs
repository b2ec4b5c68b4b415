//! AVX2 (with FMA and F16C) kernels: the heads' dot products ([`crate::kernels::dot`]),
//! SnakeBeta ([`crate::kernels::snake`]) and the quantized products on packed rows
//! ([`crate::kernels::quant`]).
//!
//! The packed products keep one row per 32-bit lane, two vectors a group. AVX2 has no
//! `vpdpbusd`: a step multiplies each row's four weights with the input's four by `vpmaddubsw`
//! (unsigned by signed bytes into 16-bit pair sums) and widens by `vpmaddwd`. q8_0's weights are
//! signed, so the step takes their magnitudes times the input with the weights' signs (no pair
//! sum can saturate); the K types' nibbles are unsigned already, shifted down to 0..15 (or
//! 0..31 with q5_K's fifth bit), and their 16-bit pair sums add up over a sub-block before
//! widening. Each follows its type's fixed arithmetic, so it gives the scalar twin's bits.

use std::arch::x86_64::*;

use crate::kernels::dot::LANES;
use crate::kernels::quant::{k_quants, q8_0, GROUP};
use crate::kernels::snake::{snake, PIO2_1, PIO2_2, PIO2_3, REDUCED, S1, S2, S3, TWO_OVER_PI};

/// One q8_0 block's 32 products, reduced by the scalar tree: lanes i += i + 16, i + 8, i + 4,
/// i + 2, i + 1.
///
/// # Safety
/// The CPU has AVX2; `h` has at least 32 values.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn block_q8(q: &[i8; 32], h: &[f32]) -> f32 {
    // SAFETY: 32 i8 and 32 f32 are read, both in bounds.
    unsafe {
        let qb = _mm256_loadu_si256(q.as_ptr().cast());
        let lo = _mm256_castsi256_si128(qb);
        let hi = _mm256_extracti128_si256(qb, 1);
        let q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
        let q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
        let q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
        let q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
        let p0 = _mm256_mul_ps(q0, _mm256_loadu_ps(h.as_ptr()));
        let p1 = _mm256_mul_ps(q1, _mm256_loadu_ps(h.as_ptr().add(8)));
        let p2 = _mm256_mul_ps(q2, _mm256_loadu_ps(h.as_ptr().add(16)));
        let p3 = _mm256_mul_ps(q3, _mm256_loadu_ps(h.as_ptr().add(24)));
        let a = _mm256_add_ps(p0, p2); // lanes 0..8 += 16..24
        let b = _mm256_add_ps(p1, p3); // lanes 8..16 += 24..32
        let c = _mm256_add_ps(a, b); // lanes 0..8 += 8..16
        let d = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1)); // += 4
        let e = _mm_add_ps(d, _mm_movehl_ps(d, d)); // lanes 0, 1 += 2, 3
        let f = _mm_add_ss(e, _mm_shuffle_ps(e, e, 1)); // lane 0 += 1
        _mm_cvtss_f32(f)
    }
}

/// The 64 lanes of [`crate::kernels::dot`]'s order, eight registers of 8.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a.len() == b.len()` is a multiple of 64.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_lanes(a: &[f32], b: &[f32], lanes: &mut [f32; LANES]) {
    // SAFETY: every load reads 8 floats at an offset below len - 7 (len is a multiple of 64);
    // unaligned loads and stores are used throughout.
    unsafe {
        let mut acc = [_mm256_setzero_ps(); 8];
        for i in (0..a.len()).step_by(LANES) {
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(a.as_ptr().add(i + 8 * r));
                let y = _mm256_loadu_ps(b.as_ptr().add(i + 8 * r));
                *acc = _mm256_fmadd_ps(x, y, *acc);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * r), *acc);
        }
    }
}

/// The first multiple-of-8 part of the row; returns how many elements it did. Vectors with a
/// lane beyond [`REDUCED`] (or NaN) are done with the scalar [`snake`].
///
/// # Safety
/// The CPU has AVX2 and FMA (`Tier::Avx2`); `alpha`, `inv_beta` and `y` are at least as long as `x`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn snake_row(x: &[f32], alpha: &[f32], inv_beta: &[f32], y: &mut [f32]) -> usize {
    let n = x.len() / 8 * 8;
    let limit = _mm256_set1_ps(REDUCED);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut i = 0;
    while i < n {
        // SAFETY: i + 8 ≤ n ≤ every slice's length.
        let (xv, av, bv) = unsafe {
            (
                _mm256_loadu_ps(x.as_ptr().add(i)),
                _mm256_loadu_ps(alpha.as_ptr().add(i)),
                _mm256_loadu_ps(inv_beta.as_ptr().add(i)),
            )
        };
        let t = _mm256_mul_ps(av, xv);
        let in_range = _mm256_cmp_ps::<_CMP_LE_OQ>(_mm256_and_ps(t, abs_mask), limit);
        if _mm256_movemask_ps(in_range) != 0xff {
            for k in i..i + 8 {
                y[k] = snake(x[k], alpha[k], inv_beta[k]);
            }
            i += 8;
            continue;
        }
        let j = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(t, _mm256_set1_ps(TWO_OVER_PI)),
        );
        // The same operations as the scalar `sin2`, fused where it fuses.
        let r = _mm256_fnmadd_ps(j, _mm256_set1_ps(PIO2_1), t);
        let r = _mm256_fnmadd_ps(j, _mm256_set1_ps(PIO2_2), r);
        let r = _mm256_fnmadd_ps(j, _mm256_set1_ps(PIO2_3), r);
        let z = _mm256_mul_ps(r, r);
        let p = _mm256_fmadd_ps(z, _mm256_set1_ps(S3), _mm256_set1_ps(S2));
        let p = _mm256_fmadd_ps(z, p, _mm256_set1_ps(S1));
        let s = _mm256_fmadd_ps(_mm256_mul_ps(r, z), p, r);
        let s2 = _mm256_mul_ps(s, s);
        let odd = _mm256_castsi256_ps(_mm256_slli_epi32::<31>(_mm256_cvtps_epi32(j)));
        let v = _mm256_blendv_ps(s2, _mm256_sub_ps(_mm256_set1_ps(1.0), s2), odd);
        let out = _mm256_fmadd_ps(bv, v, xv);
        // SAFETY: as for the loads.
        unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(i), out) };
        i += 8;
    }
    n
}

crate::kernels::quant::packed_kernels!(q8_0_dots, q4_k_dots);

/// How far ahead the kernels ask for the weights' cache lines (into L2), in bytes.
const AHEAD: usize = 16 * 1024;

/// The 16 rows' results of one group as two vectors, stored.
///
/// # Safety
/// The CPU has AVX (called from AVX2 kernels only).
#[inline(always)]
pub(super) unsafe fn store16(acc: [__m256; 2]) -> [f32; GROUP] {
    let mut out = [0f32; GROUP];
    // SAFETY: 16 floats.
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[1]);
    }
    out
}

/// The products of one packed q8_0 group (16 rows of `nb` blocks at `grp`) with `M` inputs.
///
/// # Safety
/// `grp` points at `nb / 2` packed pairs, each input holds `nb` blocks; the CPU has AVX2, FMA
/// and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `h` picks the half of several arrays at once.
unsafe fn q8_0_dots<const M: usize>(
    grp: *const u8,
    nb: usize,
    ps: [&q8_0::Prepared; M],
) -> [[f32; GROUP]; M] {
    let ones = _mm256_set1_epi16(1);
    let flip = _mm256_set1_epi8(-128);
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
            for t in 0..8 {
                for h in 0..2 {
                    // The weights, signed again, and their magnitudes (128 for −128, unsigned).
                    let v =
                        _mm256_xor_si256(_mm256_loadu_si256(q.add(64 * t + 32 * h).cast()), flip);
                    let mag = _mm256_sign_epi8(v, v);
                    for (j, p) in ps.iter().enumerate() {
                        let xq = p.q.as_ptr().add(b * q8_0::BLOCK + 4 * t);
                        let x = _mm256_set1_epi32(xq.cast::<i32>().read_unaligned());
                        let prod = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(x, v));
                        sum[j][h] = _mm256_add_epi32(sum[j][h], _mm256_madd_epi16(prod, ones));
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

/// The 8 rows' 32-bit words `i..i + 8` of a packed q4_K block's scale words (`a`, `b` or `c`),
/// half `h`.
macro_rules! words {
    ($blk:expr, $word:expr, $h:expr) => {
        _mm256_loadu_si256($blk.add(64 * $word + 32 * $h).cast())
    };
}

/// Byte `s % 4` of each lane of `v`, as a 32-bit integer.
macro_rules! byte_of {
    ($v:expr, $s:expr) => {
        _mm256_and_si256(
            _mm256_srlv_epi32($v, _mm256_set1_epi32(8 * ($s % 4) as i32)),
            _mm256_set1_epi32(0xff),
        )
    };
}

/// Each byte of a 32-byte vector set to 16 where bit `i` of `mask` is set (byte `i`), else 0.
///
/// # Safety
/// The CPU has AVX2 (called from AVX2 kernels only).
#[inline(always)]
pub(super) unsafe fn mask16(mask: u32) -> __m256i {
    // SAFETY: register operations only (the caller has AVX2).
    unsafe {
        let m = _mm256_set1_epi32(mask as i32);
        // Byte i takes byte i / 8 of the mask, then tests its bit i % 8.
        let spread = _mm256_shuffle_epi8(
            m,
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            ),
        );
        let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
        _mm256_and_si256(set, _mm256_set1_epi8(16))
    }
}

/// Half `h` (8 rows) of a packed q4_K or q5_K block's scales: each row's 6-bit sub-block scales
/// and mins as bytes of 32-bit lanes (sub-blocks 0..4 in `*_lo`, 4..8 in `*_hi`), and its `d` and
/// `dmin`.
pub(super) struct KScales {
    sc_lo: __m256i,
    sc_hi: __m256i,
    m_lo: __m256i,
    m_hi: __m256i,
    pub(super) d: __m256,
    pub(super) dmin: __m256,
}

impl KScales {
    /// Unpacks half `h` of the block at `blk`.
    ///
    /// # Safety
    /// `blk` points at a packed block; the CPU has AVX2 and F16C (called from such kernels only).
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn read(blk: *const u8, h: usize) -> KScales {
        // SAFETY: the caller's contract: the block's scale words and f16 scales.
        unsafe {
            let (m6, m4) = (
                _mm256_set1_epi32(0x3f3f_3f3f),
                _mm256_set1_epi32(0x0f0f_0f0f),
            );
            let m2 = _mm256_set1_epi32(0x0303_0303);
            let (a, bw, c) = (words!(blk, 0, h), words!(blk, 1, h), words!(blk, 2, h));
            KScales {
                sc_lo: _mm256_and_si256(a, m6),
                m_lo: _mm256_and_si256(bw, m6),
                sc_hi: _mm256_or_si256(
                    _mm256_and_si256(c, m4),
                    _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(a), m2)),
                ),
                m_hi: _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi32::<4>(c), m4),
                    _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(bw), m2)),
                ),
                d: _mm256_cvtph_ps(_mm_loadu_si128(blk.add(192 + 16 * h).cast())),
                dmin: _mm256_cvtph_ps(_mm_loadu_si128(blk.add(224 + 16 * h).cast())),
            }
        }
    }

    /// Sub-block `s`'s scale of each row, as a float.
    ///
    /// # Safety
    /// The CPU has AVX2 (called from such kernels only).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scale(&self, s: usize) -> __m256 {
        _mm256_cvtepi32_ps(if s < 4 {
            byte_of!(self.sc_lo, s)
        } else {
            byte_of!(self.sc_hi, s)
        })
    }

    /// The mins as 16-bit pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) of each row.
    ///
    /// # Safety
    /// The CPU has AVX2 (called from such kernels only).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn min_pairs(&self) -> [__m256i; 4] {
        let even = _mm256_set1_epi32(0x00ff_00ff);
        [
            _mm256_and_si256(self.m_lo, even),
            _mm256_and_si256(_mm256_srli_epi32::<8>(self.m_lo), even),
            _mm256_and_si256(self.m_hi, even),
            _mm256_and_si256(_mm256_srli_epi32::<8>(self.m_hi), even),
        ]
    }
}

/// The products of one packed q4_K (or q5_K when `Q5`) group with `M` inputs, the arithmetic of
/// [`crate::kernels::quant::k_quants`]: the nibbles' products summed as 16-bit pairs over a
/// sub-block (q4_K: at most 8 · 2 · 15 · 127 = 30480; q5_K's, twice as large, in two halves),
/// then widened once.
///
/// # Safety
/// `grp` points at `nb` packed blocks, each input holds `nb` blocks; the CPU has AVX2, FMA and
/// F16C.
#[target_feature(enable = "avx2,fma,f16c")]
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
    let ones = _mm256_set1_epi16(1);
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
                    let mut lo = [[_mm256_setzero_si256(); 2]; M];
                    let mut hi = [[_mm256_setzero_si256(); 2]; M];
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
                        // q4_K's 16-bit sums hold all 8 steps; q5_K's, 4.
                        let half = if Q5 { t / 4 } else { 0 };
                        for j in 0..M {
                            let xq = ps[j].q.as_ptr().add(b * k_quants::BLOCK + 64 * g + 4 * t);
                            let xl = _mm256_set1_epi32(xq.cast::<i32>().read_unaligned());
                            let xh = _mm256_set1_epi32(xq.add(32).cast::<i32>().read_unaligned());
                            lo[j][half] =
                                _mm256_add_epi16(lo[j][half], _mm256_maddubs_epi16(ql, xl));
                            hi[j][half] =
                                _mm256_add_epi16(hi[j][half], _mm256_maddubs_epi16(qh, xh));
                        }
                    }
                    let (s0, s1) = (sc.scale(2 * g), sc.scale(2 * g + 1));
                    for j in 0..M {
                        let wide = |v: [__m256i; 2]| {
                            _mm256_add_epi32(
                                _mm256_madd_epi16(v[0], ones),
                                _mm256_madd_epi16(v[1], ones),
                            )
                        };
                        fsum[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide(lo[j])), s0, fsum[j]);
                        fsum[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(wide(hi[j])), s1, fsum[j]);
                    }
                }
                let mins = sc.min_pairs();
                for j in 0..M {
                    let pairs = ps[j].min_pairs.as_ptr().add(b * 4);
                    let mut msum = _mm256_setzero_si256();
                    for (p, &mp) in mins.iter().enumerate() {
                        let prod = _mm256_madd_epi16(mp, _mm256_set1_epi32(*pairs.add(p)));
                        msum = _mm256_add_epi32(msum, prod);
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

/// Rows `rows` of column block `nb` of [`crate::kernels::panel::conv`]: each of its two panels
/// in turn, 6 rows at a time (12 accumulators, two weight vectors and a broadcast in the 16
/// registers); the weights `w` are f32, or f16 widened as they are loaded when `F16`.
///
/// # Safety
/// As [`crate::kernels::panel::conv`], with AVX2, FMA and F16C.
pub unsafe fn panel_block<const F16: bool>(
    w: *const u8,
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
                    6 => panel_rows::<6, F16>(w, x, y, s, p, t),
                    4 => panel_rows::<4, F16>(w, x, y, s, p, t),
                    2 => panel_rows::<2, F16>(w, x, y, s, p, t),
                    _ => panel_rows::<1, F16>(w, x, y, s, p, t),
                }
            }
        });
    }
}

/// Output rows `t..t + R` of panel `p` (16 columns, two vectors of 8; f16 weights widened by
/// `vcvtph2ps` when `F16`, exact).
///
/// # Safety
/// As [`panel_block`]; rows `t..t + R` are below `t_out`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_rows<const R: usize, const F16: bool>(
    w: *const u8,
    x: *const f32,
    y: *mut f32,
    s: crate::kernels::panel::Conv,
    p: usize,
    t: usize,
) {
    use crate::kernels::panel::{CHAIN, PANEL};
    // Bytes of one weight, and of one panel line.
    let es = if F16 { 2 } else { 4 };
    let line = PANEL * es;
    let k = s.taps * s.c_in;
    let wp = w.wrapping_add(p * k * line);
    let o0 = p * PANEL;
    let out: [*mut f32; R] = std::array::from_fn(|i| y.wrapping_add((t + i) * s.n + o0));
    let mut first = true;
    for j in 0..s.taps {
        // Row t + i of this tap: input row t + i + j · dilation, one pointer each.
        let rows: [*const f32; R] =
            std::array::from_fn(|i| x.wrapping_add((t + i + j * s.dilation) * s.c_in));
        let mut pw = wp.wrapping_add(j * s.c_in * line);
        for c0 in (0..s.c_in).step_by(CHAIN) {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for c in c0..(c0 + CHAIN).min(s.c_in) {
                // SAFETY: weights (j · c_in + c, panel p) inside `w`; input rows t + i +
                // j · dilation < t_out + span for i < R, channel c < c_in.
                unsafe {
                    let (bw0, bw1) = if F16 {
                        (
                            _mm256_cvtph_ps(_mm_loadu_si128(pw.cast())),
                            _mm256_cvtph_ps(_mm_loadu_si128(pw.add(16).cast())),
                        )
                    } else {
                        (
                            _mm256_loadu_ps(pw.cast()),
                            _mm256_loadu_ps(pw.add(32).cast()),
                        )
                    };
                    for (acc, row) in acc.iter_mut().zip(&rows) {
                        let xv = _mm256_broadcast_ss(&*row.add(c));
                        acc[0] = _mm256_fmadd_ps(xv, bw0, acc[0]);
                        acc[1] = _mm256_fmadd_ps(xv, bw1, acc[1]);
                    }
                }
                pw = pw.wrapping_add(line);
            }
            // The chain into the output rows: stored first, then added.
            for (acc, &row) in acc.iter().zip(&out) {
                // SAFETY: output row t + i < t_out, columns o0..o0 + 16 <= n.
                unsafe {
                    let (a, b) = if first {
                        (acc[0], acc[1])
                    } else {
                        (
                            _mm256_add_ps(_mm256_loadu_ps(row), acc[0]),
                            _mm256_add_ps(_mm256_loadu_ps(row.add(8)), acc[1]),
                        )
                    };
                    _mm256_storeu_ps(row, a);
                    _mm256_storeu_ps(row.add(8), b);
                }
            }
            first = false;
        }
    }
}

/// One run of 32 values of [`crate::kernels::int8::quantize_rows`], as
/// [`super::avx512::quantize_run32`] with AVX2: the twin's bytes and scale.
///
/// # Safety
/// AVX2; `v` holds 32 values, `q` room for 32 bytes.
#[target_feature(enable = "avx2")]
pub unsafe fn quantize_run32(v: *const f32, q: *mut u8) -> f32 {
    // SAFETY: 32 values at `v`, 32 bytes at `q` (the caller's contract).
    unsafe {
        let x: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(v.add(8 * i)));
        let sign = _mm256_set1_ps(-0.0);
        // `max(x, m)` gives `m` where `x` is NaN: NaN ignored, as the twin's `f32::max`.
        let mut m = _mm256_setzero_ps();
        for &x in &x {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, x), m);
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
        let (scale, inv) = crate::kernels::int8::scale_of_max(_mm_cvtss_f32(m));
        let inv = _mm256_set1_ps(inv);
        let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
        let n: [__m256i; 4] = std::array::from_fn(|i| {
            let y = _mm256_mul_ps(x[i], inv);
            let y = _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
            let y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
            let y = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(y);
            // Whole numbers in 1..=255: the conversion is exact.
            _mm256_cvttps_epi32(_mm256_add_ps(y, _mm256_set1_ps(128.0)))
        });
        // 32 lanes to 32 bytes: the packs work within 128-bit halves, so the dwords come out
        // as (0, 2, 4, 6, 1, 3, 5, 7) of the wanted order.
        let w = _mm256_packus_epi16(
            _mm256_packs_epi32(n[0], n[1]),
            _mm256_packs_epi32(n[2], n[3]),
        );
        let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.cast(), w);
        scale
    }
}
