//! Dot products in one fixed summation order: the sample heads' `logits = W · h`.
//!
//! Contract: every kernel computes each f32 dot product in one order, so that all of them give
//! bit-identical results: 64 lanes, lane `j` accumulating `a[i] · b[i]` for every `i ≡ j (mod 64)`
//! with fused multiply-adds in increasing `i`, then a fixed pairwise tree over the lanes
//! (`lane[i] += lane[i + w]` for w = 32, 16, …, 1). The scalar kernel is that definition; AVX-512
//! keeps the 64 lanes in 4 registers, AVX2 in 8, NEON in 16 (4+ independent accumulator chains
//! each). `f32::mul_add` is a correctly rounded FMA on every target, like the SIMD instructions.
//! q8_0 rows ([`Kernel::dot_q8`]) have their own fixed order. Nothing here allocates.

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
    /// The widest kernel among `caps` (a tier's features, [`crate::kernels::Tier::caps`]).
    pub fn for_caps(caps: super::Features) -> Self {
        if caps.avx512 && caps.avx2 && caps.fma {
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
    pub fn active() -> Self {
        Self::for_caps(super::caps())
    }

    /// `a · b` in the fixed order (the slices have equal lengths).
    pub fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let mut lanes = [0f32; LANES];
        let body = n - n % LANES;
        let (ab, bb) = (&a[..body], &b[..body]);
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has AVX-512F: `for_caps` hands this kernel out only then (and
            // `caps` only holds the CPU's own features).
            Kernel::Avx512 if super::Features::get().avx512 => unsafe {
                super::x86::avx512::dot_lanes(ab, bb, &mut lanes)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, for AVX2 and FMA.
            Kernel::Avx2 | Kernel::Avx512 if avx2_fma() => unsafe {
                super::x86::avx2::dot_lanes(ab, bb, &mut lanes)
            },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above, for NEON.
            Kernel::Neon if super::Features::get().neon => unsafe {
                super::aarch64::neon::dot_lanes(ab, bb, &mut lanes)
            },
            _ => lanes_scalar(ab, bb, &mut lanes),
        }
        // The tail joins the same lanes, in the same order, in every kernel.
        for i in body..n {
            let l = &mut lanes[i % LANES];
            *l = a[i].mul_add(b[i], *l);
        }
        reduce(lanes)
    }

    /// `Σ_b d_b · (Σ_j q_bj · h_bj)` over q8_0 blocks, in one fixed order: per block, the 32
    /// products (exact int-to-float conversions, one rounding each) summed by the same pairwise
    /// tree as the f32 kernels over 32 lanes, then `total = fma(d_b, s_b, total)` block after
    /// block. AVX2 implements it; the other kernels use the scalar definition.
    pub fn dot_q8(self, blocks: &[BlockQ8], h: &[f32]) -> f32 {
        let mut total = 0f32;
        for (b, hb) in blocks.iter().zip(h.chunks_exact(32)) {
            let s = match self {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has AVX2 and FMA (checked); hb has 32 values.
                Kernel::Avx2 | Kernel::Avx512 if avx2_fma() => unsafe {
                    super::x86::avx2::block_q8(&b.q, hb)
                },
                _ => block_q8_scalar(&b.q, hb),
            };
            total = b.d.mul_add(s, total);
        }
        total
    }
}

/// Whether this CPU has AVX2 and FMA (whatever the tier: a kernel value is only made from a
/// tier's features, so this only guards against a value made by hand).
#[cfg(target_arch = "x86_64")]
fn avx2_fma() -> bool {
    let f = super::Features::get();
    f.avx2 && f.fma
}

/// The 64 lanes of `a · b` (lengths a multiple of 64), scalar.
fn lanes_scalar(a: &[f32], b: &[f32], lanes: &mut [f32; LANES]) {
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

/// One q8_0 block: 32 weights as `d · q[j]` (ggml's `block_q8_0`, its f16 scale widened).
#[derive(Debug, Clone, Copy)]
pub struct BlockQ8 {
    /// Scale.
    pub d: f32,
    /// Quantized weights.
    pub q: [i8; 32],
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::for_each_tier;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 20001) as f32 / 10000.0 - 1.0
            })
            .collect()
    }

    /// Every tier's kernels give the scalar definition's bits, on lengths with and without a
    /// tail, and on q8_0 blocks.
    #[test]
    fn every_tier_gives_the_scalar_bits() {
        for_each_tier(|tier| {
            let k = Kernel::for_caps(tier.caps());
            for n in [1, 63, 64, 65, 1024, 2048 + 17] {
                let (a, b) = (data(n, 1), data(n, 2));
                let (want, got) = (Kernel::Scalar.dot(&a, &b), k.dot(&a, &b));
                assert_eq!(want.to_bits(), got.to_bits(), "{tier} ({k:?}) n={n}");
            }
            let h = data(1024, 3);
            let blocks: Vec<BlockQ8> = (0..32)
                .map(|i| BlockQ8 {
                    d: 0.01 * (i as f32 + 1.0),
                    q: std::array::from_fn(|j| ((i * 37 + j * 11) % 255) as i8),
                })
                .collect();
            let (want, got) = (Kernel::Scalar.dot_q8(&blocks, &h), k.dot_q8(&blocks, &h));
            assert_eq!(want.to_bits(), got.to_bits(), "{tier} ({k:?}) q8_0");
        });
    }

    #[test]
    fn the_scalar_order_is_close_to_f64() {
        let (a, b) = (data(4096, 5), data(4096, 6));
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        let got = Kernel::Scalar.dot(&a, &b) as f64;
        assert!((got - exact).abs() < 1e-4, "{got} vs {exact}");
    }
}
