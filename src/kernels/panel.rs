//! The decoder's exact f32 products on weights packed once at load: a causal convolution (or a
//! plain matrix product, one tap) of f32 input rows by a kernel matrix stored in column panels
//! ([`pack`]), f32 out, each output one chain of fused multiply-adds.
//!
//! [`pack`]'s order: panel `p` holds, for each reduction index `r` in turn, the [`PANEL`] columns
//! `p · 16 ..` of row `r`, one 64-byte line. A kernel keeps [`BLOCK`] columns (two panels) of a
//! few output rows in registers and, for each reduction value, loads two lines of weights and
//! broadcasts each row's input value: no copy of the input (no im2col: row `t` of tap `j` is input
//! row `t + j · dilation`, read where it lies) and no packing per call, which `matrixmultiply`'s
//! sgemm does for every product (its cost kept the few-row products on ggml before).
//!
//! Arithmetic, fixed: for each tap `j` in turn, the channels in runs of [`CHAIN`] (the last run of
//! a tap may be shorter), each run one chain `acc = fma(x[t + j·d][c], w[j, c][o], acc)` from
//! `acc = 0`; output `(t, o)` is the first run's chain, then `+` each next run's, in order. One
//! order that depends on neither the row count, the thread count nor the kernel, so
//! [`Kernel::Scalar`] (`f32::mul_add`) gives the same bits as the vector kernels (tested). The
//! runs keep the rounding error of a long reduction near a blocked sum's (one chain over all
//! `taps · c_in` values drifts several times further, which the decoder's stages compound).
//!
//! Work is shared out in blocks of up to 32 rows by 32 columns ([`blocks`]), as the bf16 kernels'.

use super::Features;

/// Columns per panel: one AVX-512 vector, two AVX2 ones, four NEON ones.
pub const PANEL: usize = 16;
/// Output columns per block: two panels, the bf16 kernels' block width (one block grid serves
/// both families: [`blocks`]).
pub const BLOCK: usize = super::bf16::BLOCK;
/// Bytes of a cache line: each panel row is one, when the packed matrix starts on one.
pub const LINE: usize = 64;
/// Channels per fused chain (see the module docs).
pub const CHAIN: usize = 128;

/// Whether a product of `n` output columns can be packed: whole blocks.
pub fn fits(n: usize) -> bool {
    n > 0 && n.is_multiple_of(BLOCK)
}

/// A packed-f32 product kernel. All give the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Portable Rust (`f32::mul_add`): the twin the others are tested against.
    Scalar,
    /// AVX2 with FMA: 6 rows by one panel (12 accumulators).
    Avx2,
    /// AVX-512 F: 8 rows by two panels (16 accumulators).
    Avx512,
    /// aarch64 NEON: 6 rows by one panel (24 accumulators of 4 lanes).
    Neon,
}

impl Kernel {
    /// The fastest kernel among `caps` (a tier's features); `None` where only the scalar twin
    /// would run (the decoder then keeps `matrixmultiply`'s products, faster than it).
    pub fn for_caps(caps: Features) -> Option<Kernel> {
        if caps.avx512 {
            Some(Kernel::Avx512)
        } else if caps.avx2 && caps.fma && caps.f16c {
            Some(Kernel::Avx2)
        } else if caps.neon {
            Some(Kernel::Neon)
        } else {
            None
        }
    }

    /// The kernel of the process's tier ([`crate::kernels::caps`]), if any.
    pub fn active() -> Option<Kernel> {
        Self::for_caps(super::caps())
    }

    /// Whether this CPU runs the kernel.
    pub fn available(self) -> bool {
        let f = Features::get();
        match self {
            Kernel::Scalar => true,
            Kernel::Avx2 => f.avx2 && f.fma && f.f16c,
            Kernel::Avx512 => f.avx512,
            Kernel::Neon => f.neon,
        }
    }

    /// Whether the kernel reads f16 panels ([`pack_f16`], [`conv_f16`]): all but NEON's (whose
    /// f16 intrinsics Rust has not stabilized).
    pub fn reads_f16(self) -> bool {
        self != Kernel::Neon
    }
}

/// A packed matrix's values: f32 ([`pack`]), or f16 bits ([`pack_f16`]) widened as they are
/// read, which is exact: the products are then f32 products of the rounded weights.
#[derive(Clone, Copy, Debug)]
enum Weights {
    F32(*const f32),
    F16(*const u16),
}

/// Shape of one [`conv`] call: the bf16 kernels' ([`super::bf16::Conv`]).
pub use super::bf16::Conv;

/// Output blocks of a product of `t_out` rows and `n` columns, the unit [`conv`] shares out: the
/// bf16 kernels' grid (up to 32 rows, 16 for products of at most 16 rows, by 32 columns), in
/// groups of column blocks whose weights fit in L2, each walked row block by row block.
pub use super::bf16::blocks;

/// Splits `rows` into groups as wide as the first of `widths` (widest first) that fits in the
/// rows left, 1 when none does, and calls `f(first row, width)` for each in order: how the
/// vector kernels walk a block's rows with their register-blocked widths.
pub(crate) fn row_groups(
    rows: std::ops::Range<usize>,
    widths: &[usize],
    mut f: impl FnMut(usize, usize),
) {
    let mut t = rows.start;
    while t < rows.end {
        let width = widths
            .iter()
            .copied()
            .find(|&w| w <= rows.end - t)
            .unwrap_or(1);
        f(t, width);
        t += width;
    }
}

/// The kernel matrix `w` (`k` rows of reduction by `n` columns, element `(r, o)` at `r + k · o`,
/// as [`crate::ffi::Context::conv_gemm`] takes it unpacked) in panels: element `(r, o)` at
/// `(o / 16) · 16k + 16r + o % 16`. `None` unless `w` has `k · n` values and [`fits`]`(n)`.
pub fn pack(w: &[f32], k: usize, n: usize) -> Option<Vec<f32>> {
    if w.len() != k * n || k == 0 || !fits(n) {
        return None;
    }
    let mut out = vec![0f32; k * n];
    for (i, v) in out.iter_mut().enumerate() {
        let (o, rest) = (i % PANEL, i / PANEL);
        let (r, p) = (rest % k, rest / k);
        *v = w[r + k * (p * PANEL + o)];
    }
    Some(out)
}

/// [`pack`] with each value rounded to the nearest f16 (its bits): half the bytes to stream, for
/// the products that read their weights for few rows. `None` as [`pack`], and when a value is
/// out of f16's range (its magnitude above 65504, or not finite).
pub fn pack_f16(w: &[f32], k: usize, n: usize) -> Option<Vec<u16>> {
    let out: Vec<u16> = pack(w, k, n)?
        .into_iter()
        .map(|v| half::f16::from_f32(v).to_bits())
        .collect();
    let finite = out.iter().all(|&b| half::f16::from_bits(b).is_finite());
    finite.then_some(out)
}

/// Output blocks `b0..b1` (of [`blocks`]) of the causal conv of the f32 input rows `x`
/// (`t_out + (taps − 1) · dilation` rows of `c_in`) by the packed kernel `w`, into the f32 rows
/// `y` (`t_out` of `n`), by `kernel`. After each block is stored, `then(rows, columns)` is called
/// on it, while it is still in cache (the caller's bias and residual adds).
///
/// # Safety
/// `kernel.available()`; [`fits`]`(n)`; `w` holds `taps · c_in · n` packed values ([`pack`]),
/// `x` the input rows and `y` room for the output rows, none of them written by anyone else during
/// the call except `y`'s other blocks.
pub unsafe fn conv(
    kernel: Kernel,
    w: *const f32,
    x: *const f32,
    y: *mut f32,
    s: Conv,
    blocks: (usize, usize),
    then: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
) {
    // SAFETY: the caller's contract.
    unsafe { conv_weights(kernel, Weights::F32(w), x, y, s, blocks, then) }
}

/// [`conv`] with the kernel matrix packed as f16 ([`pack_f16`]): the same arithmetic on the
/// widened weights, so the scalar twin's bits on every kernel.
///
/// # Safety
/// As [`conv`], `w` holding `taps · c_in · n` packed f16 values, and `kernel.reads_f16()`.
pub unsafe fn conv_f16(
    kernel: Kernel,
    w: *const u16,
    x: *const f32,
    y: *mut f32,
    s: Conv,
    blocks: (usize, usize),
    then: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
) {
    // SAFETY: the caller's contract.
    unsafe { conv_weights(kernel, Weights::F16(w), x, y, s, blocks, then) }
}

/// [`conv`] and [`conv_f16`].
///
/// # Safety
/// As theirs.
unsafe fn conv_weights(
    kernel: Kernel,
    w: Weights,
    x: *const f32,
    y: *mut f32,
    s: Conv,
    (b0, b1): (usize, usize),
    mut then: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
) {
    for b in b0..b1 {
        let (nb, rows) = super::bf16::block(s, b);
        // SAFETY: the caller's contract; rows below t_out, columns of block nb < n.
        unsafe {
            match (kernel, w) {
                (Kernel::Scalar, w) => block_scalar(w, x, y, s, nb, rows.clone()),
                #[cfg(target_arch = "x86_64")]
                (Kernel::Avx512, Weights::F32(w)) => super::x86::avx512::panel_block::<false>(
                    w.cast(),
                    x,
                    y,
                    s,
                    nb,
                    rows.clone(),
                ),
                #[cfg(target_arch = "x86_64")]
                (Kernel::Avx512, Weights::F16(w)) => super::x86::avx512::panel_block::<true>(
                    w.cast(),
                    x,
                    y,
                    s,
                    nb,
                    rows.clone(),
                ),
                #[cfg(target_arch = "x86_64")]
                (Kernel::Avx2, Weights::F32(w)) => {
                    super::x86::avx2::panel_block::<false>(w.cast(), x, y, s, nb, rows.clone())
                }
                #[cfg(target_arch = "x86_64")]
                (Kernel::Avx2, Weights::F16(w)) => {
                    super::x86::avx2::panel_block::<true>(w.cast(), x, y, s, nb, rows.clone())
                }
                #[cfg(target_arch = "aarch64")]
                (Kernel::Neon, Weights::F32(w)) => {
                    super::aarch64::neon::panel_block(w, x, y, s, nb, rows.clone())
                }
                #[allow(unreachable_patterns)]
                _ => unreachable!("{kernel:?} does not read {w:?} here (`Kernel::available`, `Kernel::reads_f16`)"),
            }
        }
        then(rows, nb * BLOCK..(nb + 1) * BLOCK);
    }
}

/// Rows `rows` of column block `nb`, one value at a time: the twin.
///
/// # Safety
/// As [`conv`].
unsafe fn block_scalar(
    w: Weights,
    x: *const f32,
    y: *mut f32,
    s: Conv,
    nb: usize,
    rows: std::ops::Range<usize>,
) {
    let k = s.taps * s.c_in;
    for t in rows {
        for o in nb * BLOCK..(nb + 1) * BLOCK {
            // Offset of weight (0, o) in the packed matrix.
            let panel = (o / PANEL) * PANEL * k + o % PANEL;
            let mut total = None;
            for j in 0..s.taps {
                for c0 in (0..s.c_in).step_by(CHAIN) {
                    let mut acc = 0f32;
                    for c in c0..(c0 + CHAIN).min(s.c_in) {
                        let r = j * s.c_in + c;
                        // SAFETY: weight (r, o) inside `w`.
                        let wv = unsafe {
                            match w {
                                Weights::F32(w) => *w.add(panel + r * PANEL),
                                Weights::F16(w) => {
                                    half::f16::from_bits(*w.add(panel + r * PANEL)).to_f32()
                                }
                            }
                        };
                        // SAFETY: input row t + j · dilation < t_out + span.
                        let xv = unsafe { *x.add((t + j * s.dilation) * s.c_in + c) };
                        acc = xv.mul_add(wv, acc);
                    }
                    total = Some(total.map_or(acc, |t: f32| t + acc));
                }
            }
            // SAFETY: output (t, o) inside `y`.
            unsafe { *y.add(t * s.n + o) = total.unwrap_or(0.0) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every vector kernel this CPU has gives the scalar twin's bits (runs of chains, row groups'
    /// remainders, dilation, the blocks split in two calls); the others are named as skipped.
    /// (`tests/it/panel.rs` has more shapes and the graph op; this one also runs under qemu.)
    #[test]
    fn vector_kernels_give_the_twins_bits() {
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0)
                .map(|v| v * [1.0, 0.3, 2.7][(v.to_bits() as usize) % 3])
                .collect()
        };
        for kernel in [Kernel::Avx2, Kernel::Avx512, Kernel::Neon] {
            if !kernel.available() {
                eprintln!("panel kernel {kernel:?}: skipped, this CPU lacks its instructions");
                continue;
            }
            for (c_in, taps, dilation, n, t_out) in
                [(300, 1, 1, 64, 9), (40, 7, 3, 32, 23), (130, 3, 1, 96, 1)]
            {
                let s = Conv {
                    c_in,
                    taps,
                    dilation,
                    t_out,
                    n,
                };
                let k = taps * c_in;
                let w = pack(&values(k * n, 1), k, n).unwrap();
                // f16 panels, and f32 panels of the same values widened.
                let w16 = pack_f16(&values(k * n, 1), k, n).unwrap();
                let widened: Vec<f32> = w16
                    .iter()
                    .map(|&b| half::f16::from_bits(b).to_f32())
                    .collect();
                let x = values((t_out + (taps - 1) * dilation) * c_in, 2);
                let all = blocks(t_out, n);
                let run = |kernel, w: Weights, shares: &[(usize, usize)]| {
                    let mut y = vec![f32::NAN; t_out * n];
                    for &share in shares {
                        // SAFETY: the kernel is available (and reads f16 when `w` is); `w` holds
                        // k · n packed values, `x` the input rows, `y` the output rows.
                        unsafe {
                            conv_weights(kernel, w, x.as_ptr(), y.as_mut_ptr(), s, share, |_, _| {})
                        };
                    }
                    y
                };
                let bits =
                    |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                let halves = [(0, all / 2), (all / 2, all)];
                let twin = run(Kernel::Scalar, Weights::F32(w.as_ptr()), &[(0, all)]);
                let got = run(kernel, Weights::F32(w.as_ptr()), &halves);
                assert!(bits(&got, &twin), "{kernel:?} {s:?}: not the twin's bits");
                if !kernel.reads_f16() {
                    eprintln!("panel kernel {kernel:?}: f16 panels skipped, it reads f32 only");
                    continue;
                }
                // f16 panels: the f32 twin's bits on the widened weights, from the twin and the
                // kernel.
                let want = run(Kernel::Scalar, Weights::F32(widened.as_ptr()), &[(0, all)]);
                assert!(want != twin, "the f16 rounding changes these products");
                for (kernel, shares) in [(Kernel::Scalar, &[(0, all)][..]), (kernel, &halves)] {
                    let got = run(kernel, Weights::F16(w16.as_ptr()), shares);
                    assert!(
                        bits(&got, &want),
                        "{kernel:?} {s:?}: f16 panels differ from f32 on the widened weights"
                    );
                }
            }
        }
    }

    #[test]
    fn pack_places_each_value_in_its_panel() {
        let (k, n) = (5, 64);
        let w: Vec<f32> = (0..k * n).map(|i| i as f32).collect();
        let p = pack(&w, k, n).unwrap();
        // Element (r 3, o 37): panel 2, row 3, lane 5.
        assert_eq!(p[2 * 16 * k + 3 * 16 + 5], w[3 + k * 37]);
        let mut sorted = p.clone();
        sorted.sort_by(f32::total_cmp);
        sorted.dedup();
        assert_eq!(sorted.len(), k * n, "each value placed once");
        assert!(pack(&w[..k * 48], k, 48).is_none());
    }
}
