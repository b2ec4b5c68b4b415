//! The 15 sample heads on the host: `logits = W · h` for a 2048 × width matrix, with explicit SIMD.
//!
//! Contract: every kernel computes each dot product in one fixed order, so that all of them give
//! bit-identical results: 64 lanes, lane `j` accumulating `a[i] · b[i]` for every `i ≡ j (mod 64)`
//! with fused multiply-adds in increasing `i`, then a fixed pairwise tree over the lanes
//! (`lane[i] += lane[i + w]` for w = 32, 16, …, 1). The scalar kernel is that definition; AVX-512
//! keeps the 64 lanes in 4 registers, AVX2 in 8, NEON in 16 (4+ independent accumulator chains
//! each). `f32::mul_add` is a correctly rounded FMA on every target, like the SIMD instructions.
//! Nothing here allocates; [`Heads::logits`] writes into the caller's buffer.
//!
//! `QTTS_SCALAR_HEADS=1` forces the scalar kernel (read once, at [`Kernel::detect`]).

/// Lanes of the fixed summation order.
pub const LANES: usize = 64;

/// A dot-product kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Portable, the definition of the order.
    Scalar,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// x86-64 AVX-512F.
    Avx512,
    /// aarch64 NEON.
    Neon,
}

impl Kernel {
    /// The best kernel this CPU runs, or [`Kernel::Scalar`] when `QTTS_SCALAR_HEADS=1`.
    pub fn detect() -> Self {
        if std::env::var_os("QTTS_SCALAR_HEADS").is_some_and(|v| v == "1") {
            return Kernel::Scalar;
        }
        Self::available()
            .into_iter()
            .last()
            .unwrap_or(Kernel::Scalar)
    }

    /// Every kernel this CPU runs, scalar first.
    pub fn available() -> Vec<Self> {
        let mut v = vec![Kernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                v.push(Kernel::Avx2);
            }
            if is_x86_feature_detected!("avx512f") {
                v.push(Kernel::Avx512);
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                v.push(Kernel::Neon);
            }
        }
        v
    }

    /// `a · b` in the fixed order (the slices have equal lengths).
    pub fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut lanes = [0f32; LANES];
        let body = n - n % LANES;
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Avx512 is only constructed when the CPU has AVX-512F (Kernel::available).
            Kernel::Avx512 => unsafe { x86::body_avx512(&a[..body], &b[..body], &mut lanes) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: Avx2 is only constructed when the CPU has AVX2 and FMA.
            Kernel::Avx2 => unsafe { x86::body_avx2(&a[..body], &b[..body], &mut lanes) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: Neon is only constructed when the CPU has NEON.
            Kernel::Neon => unsafe { arm::body_neon(&a[..body], &b[..body], &mut lanes) },
            _ => body_scalar(&a[..body], &b[..body], &mut lanes),
        }
        // The tail joins the same lanes, in the same order, in every kernel.
        for i in body..n {
            let l = &mut lanes[i % LANES];
            *l = a[i].mul_add(b[i], *l);
        }
        reduce(lanes)
    }
}

fn body_scalar(a: &[f32], b: &[f32], lanes: &mut [f32; LANES]) {
    for (ca, cb) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for j in 0..LANES {
            lanes[j] = ca[j].mul_add(cb[j], lanes[j]);
        }
    }
}

fn reduce(mut lanes: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            lanes[i] += lanes[i + w];
        }
        w /= 2;
    }
    lanes[0]
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::LANES;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU has AVX-512F; `a.len() == b.len()` is a multiple of 64.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn body_avx512(a: &[f32], b: &[f32], lanes: &mut [f32; LANES]) {
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

    /// # Safety
    /// The CPU has AVX2 and FMA; `a.len() == b.len()` is a multiple of 64.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn body_avx2(a: &[f32], b: &[f32], lanes: &mut [f32; LANES]) {
        // SAFETY: as in body_avx512, with 8-float loads.
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
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::LANES;
    use std::arch::aarch64::*;

    /// # Safety
    /// The CPU has NEON; `a.len() == b.len()` is a multiple of 64.
    #[target_feature(enable = "neon")]
    pub unsafe fn body_neon(a: &[f32], b: &[f32], lanes: &mut [f32; LANES]) {
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
}

/// The 15 heads as f32 rows on the host.
#[derive(Debug, Clone)]
pub struct Heads {
    weights: Vec<f32>,
    n_codes: usize,
    width: usize,
    kernel: Kernel,
}

impl Heads {
    /// Heads from `weights` (`groups × n_codes × width`, row-major) using `kernel`.
    pub fn new(weights: Vec<f32>, n_codes: usize, width: usize, kernel: Kernel) -> Self {
        Heads {
            weights,
            n_codes,
            width,
            kernel,
        }
    }

    /// The kernel in use.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Uses `kernel` from now on.
    pub fn set_kernel(&mut self, kernel: Kernel) {
        self.kernel = kernel;
    }

    /// Logits of head `group` for hidden state `h` (length `width`) into `out` (length `n_codes`).
    ///
    /// # Real-time safety
    /// No allocation, no lock, no system call; time linear in `n_codes · width`.
    pub fn logits(&self, group: usize, h: &[f32], out: &mut [f32]) {
        let base = group * self.n_codes * self.width;
        let rows = self.weights[base..base + self.n_codes * self.width].chunks_exact(self.width);
        for (o, row) in out.iter_mut().zip(rows) {
            *o = self.kernel.dot(row, h);
        }
    }
}
