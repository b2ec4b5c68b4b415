//! SnakeBeta, `y = x + β⁻¹ · sin²(α · x)` per channel, in one pass: the decoder's activation
//! (7 of them per upsampling block), which as five ggml ops (mul, sin, sqr, mul, add) spent 14 %
//! of the decoder's time in `sinf` and 7 % in the elementwise passes (PERFORMANCE.md).
//!
//! `sin²` needs no sign: with `t = jπ/2 + r`, `|r| ≤ π/4`, it is `sin² r` for even `j` and
//! `cos² r = 1 − sin² r` for odd `j` (at least 1/2 there, so the difference loses nothing), so
//! one polynomial serves both. `r` comes from a three-part Cody–Waite reduction and the polynomial
//! is Cephes' `sinf` one (absolute error about 1e-7 on `[-π/4, π/4]`), each step one fused
//! multiply-add where it has the form of one (`f32::mul_add` in the scalar twin, correctly
//! rounded as the vector instructions). Arguments beyond [`REDUCED`] (where the reduction loses
//! accuracy) take `f32::sin`.

/// Largest |α·x| reduced by the polynomial path.
pub const REDUCED: f32 = 32768.0;

pub(crate) const PIO2_1: f32 = 1.570_312_5;
pub(crate) const PIO2_2: f32 = 4.837_513e-4;
pub(crate) const PIO2_3: f32 = 7.549_79e-8;
pub(crate) const TWO_OVER_PI: f32 = std::f32::consts::FRAC_2_PI;
pub(crate) const S1: f32 = -1.666_665_5e-1;
pub(crate) const S2: f32 = 8.332_161e-3;
pub(crate) const S3: f32 = -1.951_529_6e-4;

/// `sin²(t)`, scalar, the same arithmetic as the SIMD path.
#[inline]
pub fn sin2(t: f32) -> f32 {
    if t.is_nan() || t.abs() > REDUCED {
        let s = t.sin();
        return s * s;
    }
    let j = (t * TWO_OVER_PI).round_ties_even();
    let r = (-j).mul_add(PIO2_3, (-j).mul_add(PIO2_2, (-j).mul_add(PIO2_1, t)));
    let z = r * r;
    let s = (r * z).mul_add(z.mul_add(z.mul_add(S3, S2), S1), r);
    let s2 = s * s;
    if (j as i32) & 1 == 0 {
        s2
    } else {
        1.0 - s2
    }
}

/// `x + inv_beta · sin²(alpha · x)`, scalar, the same arithmetic as the SIMD path.
#[inline]
pub fn snake(x: f32, alpha: f32, inv_beta: f32) -> f32 {
    inv_beta.mul_add(sin2(alpha * x), x)
}

/// The instructions [`row_with`] computes with. All give the same bits: the same operations in
/// the same order, the same fused multiply-adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// One value at a time ([`sin2`]).
    Scalar,
    /// 8 lanes (AVX2).
    Avx2,
    /// 16 lanes (AVX-512 F): 1.3x AVX2 on the decoder's rows (`cargo bench --bench decoder`).
    Avx512,
    /// 4 lanes (aarch64 NEON).
    Neon,
}

impl Kernel {
    /// The widest kernel among `caps` (a tier's features, [`crate::kernels::Tier::caps`]).
    pub fn for_caps(caps: super::Features) -> Kernel {
        if caps.avx512 {
            Kernel::Avx512
        } else if caps.avx2 && caps.fma {
            Kernel::Avx2
        } else if caps.neon {
            Kernel::Neon
        } else {
            Kernel::Scalar
        }
    }

    /// The kernel of the process's tier ([`crate::kernels::caps`]).
    pub fn active() -> Kernel {
        static ACTIVE: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *ACTIVE.get_or_init(|| Kernel::for_caps(super::caps()))
    }
}

/// One row of `c` channels: `y[i] = x[i] + inv_beta[i] · sin²(alpha[i] · x[i])`, by the
/// process's tier's kernel.
pub fn row(x: &[f32], alpha: &[f32], inv_beta: &[f32], y: &mut [f32]) {
    row_with(Kernel::active(), x, alpha, inv_beta, y);
}

/// [`row`] by `kernel`; a kernel the CPU lacks computes as [`Kernel::Scalar`].
pub fn row_with(kernel: Kernel, x: &[f32], alpha: &[f32], inv_beta: &[f32], y: &mut [f32]) {
    let n = x.len().min(alpha.len()).min(inv_beta.len()).min(y.len());
    let (x, alpha, inv_beta, y) = (&x[..n], &alpha[..n], &inv_beta[..n], &mut y[..n]);
    let done = match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if super::Features::get().avx512 => {
            // SAFETY: the CPU has AVX-512 F (the guard); the kernel reads and writes within the
            // slices, all of length `n`.
            unsafe { super::x86::avx512::snake_row(x, alpha, inv_beta, y) }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 if super::Features::get().avx2 && super::Features::get().fma => {
            // SAFETY: the CPU has AVX2 and FMA (the guard); as above.
            unsafe { super::x86::avx2::snake_row(x, alpha, inv_beta, y) }
        }
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon if super::Features::get().neon => {
            // SAFETY: the CPU has NEON (the guard); as above.
            unsafe { super::aarch64::neon::snake_row(x, alpha, inv_beta, y) }
        }
        _ => 0,
    };
    for i in done..n {
        y[i] = snake(x[i], alpha[i], inv_beta[i]);
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

    /// Every tier's kernel.
    #[test]
    fn every_tier_s_row_equals_the_scalar_formula_bit_for_bit() {
        crate::kernels::for_each_tier(|tier| {
            let kernel = Kernel::for_caps(tier.caps());
            check_row(|x, a, b, y| row_with(kernel, x, a, b, y));
        });
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
                let want = snake(x[i], alpha[i], inv_beta[i]);
                assert!(
                    y[i].to_bits() == want.to_bits() || (y[i].is_nan() && want.is_nan()),
                    "{i}: {} vs {want}",
                    y[i]
                );
            }
        }
    }
}
