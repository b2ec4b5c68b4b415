//! SnakeBeta, `y = x + β⁻¹ · sin²(α · x)` per channel, in one pass: the decoder's activation
//! (7 of them per upsampling block), which as five ggml ops (mul, sin, sqr, mul, add) spent 14 %
//! of the decoder's time in `sinf` and 7 % in the elementwise passes (PERFORMANCE.md).
//!
//! `sin²` needs no sign: with `t = jπ/2 + r`, `|r| ≤ π/4`, it is `sin² r` for even `j` and
//! `cos² r` for odd `j`. `r` comes from a three-part Cody–Waite reduction and the two
//! polynomials are Cephes' `sinf`/`cosf` ones (absolute error about 1e-7 on `[-π/4, π/4]`).
//! Arguments beyond [`REDUCED`] (where the reduction loses accuracy) take `f32::sin`.

/// Largest |α·x| reduced by the polynomial path.
pub const REDUCED: f32 = 32768.0;

const PIO2_1: f32 = 1.570_312_5;
const PIO2_2: f32 = 4.837_513e-4;
const PIO2_3: f32 = 7.549_79e-8;
const TWO_OVER_PI: f32 = std::f32::consts::FRAC_2_PI;
const S1: f32 = -1.666_665_5e-1;
const S2: f32 = 8.332_161e-3;
const S3: f32 = -1.951_529_6e-4;
const C1: f32 = 4.166_664_6e-2;
const C2: f32 = -1.388_731_6e-3;
const C3: f32 = 2.443_315_7e-5;

/// `sin²(t)`, scalar, the same arithmetic as the SIMD path.
#[inline]
pub fn sin2(t: f32) -> f32 {
    if t.is_nan() || t.abs() > REDUCED {
        let s = t.sin();
        return s * s;
    }
    let j = (t * TWO_OVER_PI).round_ties_even();
    let r = ((t - j * PIO2_1) - j * PIO2_2) - j * PIO2_3;
    let z = r * r;
    let s = r + r * z * (S1 + z * (S2 + z * S3));
    let c = 1.0 - 0.5 * z + z * z * (C1 + z * (C2 + z * C3));
    let v = if (j as i32) & 1 == 0 { s } else { c };
    v * v
}

/// The instructions [`row_with`] computes with. All give the same bits: the same operations in
/// the same order, no fused multiply-add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// One value at a time ([`sin2`]).
    Scalar,
    /// 8 lanes (AVX2).
    Avx2,
    /// 16 lanes (AVX-512 F): 1.3x AVX2 on the decoder's rows (`cargo bench --bench vocoder`).
    Avx512,
}

impl Kernel {
    /// Whether this CPU has the kernel's instructions.
    pub fn available(self) -> bool {
        match self {
            Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest kernel this CPU has.
    pub fn fastest() -> Kernel {
        [Kernel::Avx512, Kernel::Avx2]
            .into_iter()
            .find(|k| k.available())
            .unwrap_or(Kernel::Scalar)
    }
}

/// One row of `c` channels: `y[i] = x[i] + inv_beta[i] · sin²(alpha[i] · x[i])`, by the widest
/// kernel the CPU has.
pub fn row(x: &[f32], alpha: &[f32], inv_beta: &[f32], y: &mut [f32]) {
    static FASTEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    row_with(*FASTEST.get_or_init(Kernel::fastest), x, alpha, inv_beta, y);
}

/// [`row`] by `kernel`; a kernel the CPU lacks computes as [`Kernel::Scalar`].
pub fn row_with(kernel: Kernel, x: &[f32], alpha: &[f32], inv_beta: &[f32], y: &mut [f32]) {
    let n = x.len().min(alpha.len()).min(inv_beta.len()).min(y.len());
    let (x, alpha, inv_beta, y) = (&x[..n], &alpha[..n], &inv_beta[..n], &mut y[..n]);
    let done = match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if kernel.available() => {
            // SAFETY: the CPU has AVX-512 F (the guard); the kernel reads and writes within the
            // slices, all of length `n`.
            unsafe { avx512::row(x, alpha, inv_beta, y) }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 if kernel.available() => {
            // SAFETY: the CPU has AVX2 and FMA (the guard); as above.
            unsafe { avx2::row(x, alpha, inv_beta, y) }
        }
        _ => 0,
    };
    for i in done..n {
        y[i] = x[i] + inv_beta[i] * sin2(alpha[i] * x[i]);
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// The first multiple-of-8 part of the row; returns how many elements it did. Vectors with a
    /// lane beyond [`REDUCED`] (or NaN) are done with the scalar [`sin2`].
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn row(x: &[f32], alpha: &[f32], inv_beta: &[f32], y: &mut [f32]) -> usize {
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
                    y[k] = x[k] + inv_beta[k] * sin2(alpha[k] * x[k]);
                }
                i += 8;
                continue;
            }
            let j = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(t, _mm256_set1_ps(TWO_OVER_PI)),
            );
            // The same operation order as the scalar `sin2` (no fused multiply-add here, so the
            // two paths agree).
            let r = _mm256_sub_ps(t, _mm256_mul_ps(j, _mm256_set1_ps(PIO2_1)));
            let r = _mm256_sub_ps(r, _mm256_mul_ps(j, _mm256_set1_ps(PIO2_2)));
            let r = _mm256_sub_ps(r, _mm256_mul_ps(j, _mm256_set1_ps(PIO2_3)));
            let z = _mm256_mul_ps(r, r);
            let ps = _mm256_add_ps(_mm256_set1_ps(S2), _mm256_mul_ps(z, _mm256_set1_ps(S3)));
            let ps = _mm256_add_ps(_mm256_set1_ps(S1), _mm256_mul_ps(z, ps));
            let s = _mm256_add_ps(r, _mm256_mul_ps(_mm256_mul_ps(r, z), ps));
            let pc = _mm256_add_ps(_mm256_set1_ps(C2), _mm256_mul_ps(z, _mm256_set1_ps(C3)));
            let pc = _mm256_add_ps(_mm256_set1_ps(C1), _mm256_mul_ps(z, pc));
            let c = _mm256_add_ps(
                _mm256_sub_ps(_mm256_set1_ps(1.0), _mm256_mul_ps(_mm256_set1_ps(0.5), z)),
                _mm256_mul_ps(_mm256_mul_ps(z, z), pc),
            );
            let odd = _mm256_castsi256_ps(_mm256_slli_epi32::<31>(_mm256_cvtps_epi32(j)));
            let v = _mm256_blendv_ps(s, c, odd);
            let out = _mm256_add_ps(xv, _mm256_mul_ps(bv, _mm256_mul_ps(v, v)));
            // SAFETY: as for the loads.
            unsafe { _mm256_storeu_ps(y.as_mut_ptr().add(i), out) };
            i += 8;
        }
        n
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// [`super::avx2::row`] 16 lanes at a time: the first multiple-of-16 part of the row, the
    /// same operations in the same order.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn row(x: &[f32], alpha: &[f32], inv_beta: &[f32], y: &mut [f32]) -> usize {
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
                    y[k] = x[k] + inv_beta[k] * sin2(alpha[k] * x[k]);
                }
                i += 16;
                continue;
            }
            let j = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_mul_ps(t, _mm512_set1_ps(TWO_OVER_PI)),
            );
            // The same operation order as the scalar `sin2`, no fused multiply-add.
            let r = _mm512_sub_ps(t, _mm512_mul_ps(j, _mm512_set1_ps(PIO2_1)));
            let r = _mm512_sub_ps(r, _mm512_mul_ps(j, _mm512_set1_ps(PIO2_2)));
            let r = _mm512_sub_ps(r, _mm512_mul_ps(j, _mm512_set1_ps(PIO2_3)));
            let z = _mm512_mul_ps(r, r);
            let ps = _mm512_add_ps(_mm512_set1_ps(S2), _mm512_mul_ps(z, _mm512_set1_ps(S3)));
            let ps = _mm512_add_ps(_mm512_set1_ps(S1), _mm512_mul_ps(z, ps));
            let s = _mm512_add_ps(r, _mm512_mul_ps(_mm512_mul_ps(r, z), ps));
            let pc = _mm512_add_ps(_mm512_set1_ps(C2), _mm512_mul_ps(z, _mm512_set1_ps(C3)));
            let pc = _mm512_add_ps(_mm512_set1_ps(C1), _mm512_mul_ps(z, pc));
            let c = _mm512_add_ps(
                _mm512_sub_ps(_mm512_set1_ps(1.0), _mm512_mul_ps(_mm512_set1_ps(0.5), z)),
                _mm512_mul_ps(_mm512_mul_ps(z, z), pc),
            );
            let odd = _mm512_test_epi32_mask(_mm512_cvtps_epi32(j), _mm512_set1_epi32(1));
            let v = _mm512_mask_blend_ps(odd, s, c);
            let out = _mm512_add_ps(xv, _mm512_mul_ps(bv, _mm512_mul_ps(v, v)));
            // SAFETY: as for the loads.
            unsafe { _mm512_storeu_ps(y.as_mut_ptr().add(i), out) };
            i += 16;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sin2_is_within_3e7_of_f64_near_zero_and_2e6_over_the_reduced_range() {
        let err = |t: f32| (sin2(t) as f64 - (t as f64).sin().powi(2)).abs();
        let near = (-20_000..20_000)
            .map(|k| err(k as f32 * 1e-3))
            .fold(0.0, f64::max);
        assert!(near < 3e-7, "worst {near} on [-20, 20]");
        let mut far = 0.0f64;
        let mut t = -REDUCED;
        while t <= REDUCED {
            far = far.max(err(t));
            t += 0.37;
        }
        assert!(far < 2e-6, "worst {far} on ±{REDUCED}");
    }

    /// Every kernel the CPU has.
    #[test]
    fn the_simd_row_equals_the_scalar_formula_bit_for_bit() {
        for kernel in [Kernel::Scalar, Kernel::Avx2, Kernel::Avx512] {
            if !kernel.available() {
                eprintln!("{kernel:?}: not on this CPU");
                continue;
            }
            check_row(|x, a, b, y| row_with(kernel, x, a, b, y));
        }
    }

    fn check_row(row: impl Fn(&[f32], &[f32], &[f32], &mut [f32])) {
        let n = 1000;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 2001) as f32 - 1000.0) * 0.05)
            .collect();
        let alpha: Vec<f32> = (0..n).map(|i| 0.5 + (i % 13) as f32 * 0.3).collect();
        let inv_beta: Vec<f32> = (0..n).map(|i| 1.0 / (1.0 + (i % 7) as f32)).collect();
        let mut x_far = x.clone();
        x_far[17] = 1e9; // one vector takes the scalar fallback
        x_far[18] = f32::NAN;
        for x in [&x, &x_far] {
            let mut y = vec![0.0; n];
            row(x, &alpha, &inv_beta, &mut y);
            for i in 0..n {
                let want = x[i] + inv_beta[i] * sin2(alpha[i] * x[i]);
                assert!(
                    y[i].to_bits() == want.to_bits() || (y[i].is_nan() && want.is_nan()),
                    "{i}: {} vs {want}",
                    y[i]
                );
            }
        }
    }
}
