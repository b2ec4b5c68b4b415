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

use crate::kernels::quant::{k_quants, q8_0, GROUP};

crate::kernels::quant::packed_kernels!(q8_0_dots, q4_k_dots);

/// How far ahead the kernels ask for the weights' cache lines (into L2), in bytes.
const AHEAD: usize = 16 * 1024;

/// The 16 rows' results of one group as two vectors, stored.
///
/// # Safety
/// The CPU has AVX (called from AVX2 kernels only).
#[inline(always)]
unsafe fn store16(acc: [__m256; 2]) -> [f32; GROUP] {
    let mut out = [0f32; GROUP];
    // SAFETY: 16 floats.
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr(), acc[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[1]);
    }
    out
}

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
unsafe fn mask16(mask: u32) -> __m256i {
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
    let m6 = _mm256_set1_epi32(0x3f3f_3f3f);
    let m4 = _mm256_set1_epi32(0x0f0f_0f0f);
    let m2 = _mm256_set1_epi32(0x0303_0303);
    let even = _mm256_set1_epi32(0x00ff_00ff);
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
                let (a, bw, c) = (words!(blk, 0, h), words!(blk, 1, h), words!(blk, 2, h));
                let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(192 + 16 * h).cast()));
                let dmin = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(224 + 16 * h).cast()));
                let sc_lo = _mm256_and_si256(a, m6);
                let m_lo = _mm256_and_si256(bw, m6);
                let sc_hi = _mm256_or_si256(
                    _mm256_and_si256(c, m4),
                    _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(a), m2)),
                );
                let m_hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi32::<4>(c), m4),
                    _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(bw), m2)),
                );
                let scale = |s: usize| {
                    _mm256_cvtepi32_ps(if s < 4 {
                        byte_of!(sc_lo, s)
                    } else {
                        byte_of!(sc_hi, s)
                    })
                };
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
                    let (s0, s1) = (scale(2 * g), scale(2 * g + 1));
                    for j in 0..M {
                        fsum[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo[j]), s0, fsum[j]);
                        fsum[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi[j]), s1, fsum[j]);
                    }
                }
                // The mins as 16-bit pairs (m0, m2), (m1, m3), (m4, m6), (m5, m7) of each row.
                let mins = [
                    _mm256_and_si256(m_lo, even),
                    _mm256_and_si256(_mm256_srli_epi32::<8>(m_lo), even),
                    _mm256_and_si256(m_hi, even),
                    _mm256_and_si256(_mm256_srli_epi32::<8>(m_hi), even),
                ];
                for j in 0..M {
                    let pairs = ps[j].min_pairs.as_ptr().add(b * 4);
                    let mut msum = _mm256_setzero_si256();
                    for (p, &mp) in mins.iter().enumerate() {
                        let x = _mm256_set1_epi32(*pairs.add(p));
                        msum = _mm256_dpwssd_avx_epi32(msum, mp, x);
                    }
                    let dx = _mm256_set1_ps(*ps[j].d.as_ptr().add(b));
                    acc[j][h] = _mm256_fmadd_ps(fsum[j], _mm256_mul_ps(d, dx), acc[j][h]);
                    acc[j][h] = _mm256_fnmadd_ps(
                        _mm256_cvtepi32_ps(msum),
                        _mm256_mul_ps(dmin, dx),
                        acc[j][h],
                    );
                }
            }
        }
    }
    // SAFETY: plain stores of the accumulators.
    acc.map(|a| unsafe { store16(a) })
}
