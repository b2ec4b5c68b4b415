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
            // The AVX-512 kernel's q8_0 blocks use the AVX2 code.
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
            {
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

    /// One q8_0 block's 32 products, reduced by the scalar tree: lanes i += i + 16, i + 8, i + 4,
    /// i + 2, i + 1.
    ///
    /// # Safety
    /// The CPU has AVX2; `h` has at least 32 values.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block_q8_avx2(q: &[i8; 32], h: &[f32]) -> f32 {
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

/// One q8_0 block: 32 weights as `d · q[j]` (ggml's `block_q8_0`, its f16 scale widened).
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8 {
    /// Scale.
    pub d: f32,
    /// Quantized weights.
    pub q: [i8; 32],
}

impl Kernel {
    /// `Σ_b d_b · (Σ_j q_bj · h_bj)` over q8_0 blocks, in one fixed order: per block, the 32 products
    /// (exact int-to-float conversions, one rounding each) summed by the same pairwise tree as the f32 kernels
    /// over 32 lanes, then `total = fma(d_b, s_b, total)` block after block. AVX2 implements it;
    /// the other kernels use the scalar definition.
    pub fn dot_q8(self, blocks: &[BlockQ8], h: &[f32]) -> f32 {
        let mut total = 0f32;
        for (b, hb) in blocks.iter().zip(h.chunks_exact(32)) {
            let s = match self {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: Avx2 and Avx512 are only constructed when the CPU has AVX2 and FMA
                // (Kernel::available); hb has 32 values.
                Kernel::Avx2 | Kernel::Avx512 => unsafe { x86::block_q8_avx2(&b.q, hb) },
                _ => block_q8_scalar(&b.q, hb),
            };
            total = b.d.mul_add(s, total);
        }
        total
    }
}

fn block_q8_scalar(q: &[i8; 32], h: &[f32]) -> f32 {
    let mut l = [0f32; 32];
    for j in 0..32 {
        l[j] = q[j] as f32 * h[j];
    }
    let mut w = 16;
    while w > 0 {
        for i in 0..w {
            l[i] += l[i + w];
        }
        w /= 2;
    }
    l[0]
}

/// How the heads' weights are stored on the host.
#[derive(Debug, Clone)]
pub enum HeadWeights {
    /// f32 rows (exact).
    F32(Vec<f32>),
    /// q8_0 rows: a quarter of the memory traffic, logits within quantization error.
    Q8(Vec<BlockQ8>),
    /// q8_0 rows packed for [`super::q8::mat_packed`] (AVX-512 VNNI, the input quantized to
    /// int8 as the layers' is): several times faster, outside this module's fixed order, so the
    /// logits are not the same on every CPU (see [`Heads::to_packed`]).
    Q8Packed(Vec<u8>),
}

/// The 15 heads on the host.
#[derive(Debug, Clone)]
pub struct Heads {
    weights: HeadWeights,
    n_codes: usize,
    width: usize,
    kernel: Kernel,
}

impl Heads {
    /// f32 heads from `weights` (`groups × n_codes × width`, row-major) using `kernel`.
    pub fn new(weights: Vec<f32>, n_codes: usize, width: usize, kernel: Kernel) -> Self {
        Heads {
            weights: HeadWeights::F32(weights),
            n_codes,
            width,
            kernel,
        }
    }

    /// q8_0 heads from ggml's q8_0 encoding (34-byte blocks: f16 scale, 32 × i8), rows of
    /// `width` values (a multiple of 32).
    pub fn from_q8_bytes(bytes: &[u8], n_codes: usize, width: usize, kernel: Kernel) -> Self {
        let blocks = bytes
            .chunks_exact(34)
            .map(|c| {
                let mut q = [0i8; 32];
                for (d, s) in q.iter_mut().zip(&c[2..]) {
                    *d = *s as i8;
                }
                BlockQ8 {
                    d: half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
                    q,
                }
            })
            .collect();
        Heads {
            weights: HeadWeights::Q8(blocks),
            n_codes,
            width,
            kernel,
        }
    }

    /// These heads stored as q8_0 (ggml's quantizer), when the width is a multiple of 32.
    pub fn to_q8(&self) -> Option<Heads> {
        let HeadWeights::F32(w) = &self.weights else {
            return Some(self.clone());
        };
        if !self.width.is_multiple_of(32) {
            return None;
        }
        let bytes = crate::ffi::quantize(crate::gguf::GgmlType::Q8_0, w, self.width).ok()?;
        Some(Self::from_q8_bytes(
            &bytes,
            self.n_codes,
            self.width,
            self.kernel,
        ))
    }

    /// These q8_0 heads packed for [`super::q8::mat_packed`], when the CPU has its features
    /// ([`super::q4k::available`]) and the shape packs ([`super::q8::fits`]); `None` otherwise,
    /// and for f32 heads (which stay exact).
    pub fn to_packed(&self) -> Option<Heads> {
        let HeadWeights::Q8(blocks) = &self.weights else {
            return None;
        };
        if !super::q4k::available() || !super::q8::fits(self.n_codes, self.width) {
            return None;
        }
        use super::q8::{BLOCK, BLOCK_BYTES};
        let mut bytes = Vec::with_capacity(blocks.len() * BLOCK_BYTES);
        for b in blocks {
            bytes.extend(half::f16::from_f32(b.d).to_le_bytes());
            bytes.extend(b.q.iter().map(|&q| q as u8));
        }
        let row_bytes = self.width / BLOCK * BLOCK_BYTES;
        let rows = bytes.len() / row_bytes;
        super::q8::pack(&mut bytes, rows, row_bytes);
        Some(Heads {
            weights: HeadWeights::Q8Packed(bytes),
            ..self.clone_shape()
        })
    }

    /// These heads' shape and kernel, with no weights.
    fn clone_shape(&self) -> Heads {
        Heads {
            weights: HeadWeights::F32(Vec::new()),
            n_codes: self.n_codes,
            width: self.width,
            kernel: self.kernel,
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

    /// Whether the weights are q8_0 (packed or not).
    pub fn is_q8(&self) -> bool {
        matches!(self.weights, HeadWeights::Q8(_) | HeadWeights::Q8Packed(_))
    }

    /// The packed heads' bytes, head after head (`n_codes` packed rows each), when packed.
    pub(crate) fn packed_bytes(&mut self) -> Option<&mut [u8]> {
        match &mut self.weights {
            HeadWeights::Q8Packed(b) => Some(b),
            _ => None,
        }
    }

    /// Whether the weights are packed for [`super::q8::mat_packed`].
    pub fn is_packed(&self) -> bool {
        matches!(self.weights, HeadWeights::Q8Packed(_))
    }

    /// Logits of head `group` for hidden state `h` (length `width`) into `out` (length `n_codes`).
    ///
    /// # Real-time safety
    /// No lock, no system call; time linear in `n_codes · width`. No allocation, but for packed
    /// heads on a thread's first call (the kernel's scratch for the quantized input).
    pub fn logits(&self, group: usize, h: &[f32], out: &mut [f32]) {
        match &self.weights {
            #[cfg(target_arch = "x86_64")]
            HeadWeights::Q8Packed(bytes) => {
                let row_bytes = self.width / super::q8::BLOCK * super::q8::BLOCK_BYTES;
                let head = &bytes[group * self.n_codes * row_bytes..][..self.n_codes * row_bytes];
                assert!(h.len() == self.width && out.len() >= self.n_codes);
                // SAFETY: `head` is n_codes packed rows of width weights (whole groups, see
                // `to_packed`, which also checked the CPU's features), one input of width
                // floats, n_codes outputs.
                unsafe {
                    super::q8::mat_packed(
                        head.as_ptr(),
                        row_bytes,
                        self.n_codes,
                        self.width,
                        h.as_ptr(),
                        1,
                        out.as_mut_ptr(),
                        self.n_codes,
                    )
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            HeadWeights::Q8Packed(_) => unreachable!("packed heads need x86-64 (to_packed)"),
            HeadWeights::F32(w) => {
                let base = group * self.n_codes * self.width;
                let rows = w[base..base + self.n_codes * self.width].chunks_exact(self.width);
                for (o, row) in out.iter_mut().zip(rows) {
                    *o = self.kernel.dot(row, h);
                }
            }
            HeadWeights::Q8(blocks) => {
                let per_row = self.width / 32;
                let base = group * self.n_codes * per_row;
                let rows = blocks[base..base + self.n_codes * per_row].chunks_exact(per_row);
                for (o, row) in out.iter_mut().zip(rows) {
                    *o = self.kernel.dot_q8(row, h);
                }
            }
        }
    }
}
