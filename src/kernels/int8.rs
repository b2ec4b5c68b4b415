//! The decoder's products on 8-bit integers: a causal convolution (or a plain matrix product, one
//! tap) of f32 input rows by a kernel matrix quantized once at load ([`pack`]), f32 out. Not
//! exact: each input row is rounded to 8 bits at every call, as each weight was at load.
//!
//! Quantization, fixed: the weights of output column `o` in each run of [`RUN`] channels of one
//! tap (the last run of a tap may be shorter) share one scale, their largest magnitude over 127,
//! and are rounded to `i8`; each run `u` of each input row `r` has one scale too, `sx[r][u]`
//! ([`quantize_rows`]). Output `(t, o)` is, for each tap `j` and each run `u` in turn,
//! `total = fma(Σ_c xq[r][c] · wq[j, c][o], sx[r][u] · sw[j, u][o], total)` from
//! `total = 0`, where `r = t + j · dilation` and the sum, over the run's channels, is exact in
//! 32 bits (`|sum| < 127² · RUN`). So every kernel gives [`Kernel::Scalar`]'s bits (tested), and
//! the result depends on neither the row count, the thread count nor the chunking.
//!
//! The input rows are held as `xq + 128` (unsigned, as `vpdpbusd` takes them); the x86 kernels
//! start each run's sum at `−128 · Σ_c wq` (stored with the scales per run and column), so it
//! ends exactly at `Σ xq · wq`; NEON's `sdot` takes both sides signed and flips the input bytes'
//! top bit back instead.
//!
//! [`pack`]'s order: panel `p` holds, for each group of four reduction indices in turn (four
//! channels of one tap), the [`PANEL`] columns `p · 16 ..` as four bytes each, one 64-byte line:
//! one `vpdpbusd` operand. Then the scales (f32) and the corrections (i32), each
//! `taps · runs` rows of `n` values. Work is shared out in blocks of up to 32 rows by 32 columns
//! ([`blocks`]), as the f32 panels'.

use super::Features;

/// Columns per panel: one AVX-512 vector of 32-bit sums, two AVX2 ones.
pub const PANEL: usize = 16;
/// Channels summed per 32-bit lane by one `vpdpbusd`.
pub const GROUP: usize = 4;
/// Output columns per block: two panels (the f32 panels' block grid).
pub const BLOCK: usize = super::bf16::BLOCK;
/// Channels per scale (and per integer sum) within one tap (see the module docs). On the
/// full-size random decoder with the residual units' k = 7 convs in 8 bits (the engine's choice,
/// [`crate::decoder::int8_layer`]), the waveform ends 29.9 dB from f32 with runs of 128, 30.7
/// with 64 and 31.6 with 32 (bf16: 31.7); each halving costs the kernels about a fifth more
/// time on those shapes (docs/perf-log/2026-12-07-int8-decoder.md).
pub const RUN: usize = 32;
/// Bytes of a cache line: each panel line is one when the packed matrix starts on one.
pub const LINE: usize = 64;

pub use super::bf16::{blocks, Conv};

/// Whether a conv of `c_in` input channels and `n` output columns can be packed: groups of four
/// channels that never straddle two taps, whole 32-column output blocks.
pub fn fits(c_in: usize, n: usize) -> bool {
    c_in > 0 && n > 0 && c_in.is_multiple_of(GROUP) && n.is_multiple_of(BLOCK)
}

/// Runs of channels per tap: `⌈c_in / RUN⌉`.
pub fn runs(c_in: usize) -> usize {
    c_in.div_ceil(RUN)
}

/// Bytes of [`pack`]'s output for a conv of `taps` taps, `c_in` channels and `n` columns: the
/// weights, then a scale and a correction per run and column.
pub fn packed_len(taps: usize, c_in: usize, n: usize) -> usize {
    taps * c_in * n + 8 * taps * runs(c_in) * n
}

/// An 8-bit product kernel. All give the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Portable Rust: the twin the others are tested against.
    Scalar,
    /// AVX-512 VNNI (`vpdpbusd` on 512 bits): 8 rows by two panels.
    Avx512Vnni,
    /// AVX-VNNI (the VEX-encoded 256-bit `vpdpbusd`): 6 rows by one panel.
    AvxVnni,
    /// aarch64 NEON with `sdot` (FEAT_DotProd): 4 rows by one panel.
    Neon,
}

impl Kernel {
    /// The fastest kernel among `caps` (a tier's features); `None` where only the scalar twin
    /// would run (far slower than the f32 products).
    pub fn for_caps(caps: Features) -> Option<Kernel> {
        if caps.avx512 && caps.avx512_vnni {
            Some(Kernel::Avx512Vnni)
        } else if caps.avx2 && caps.fma && caps.avx_vnni {
            Some(Kernel::AvxVnni)
        } else if caps.neon && caps.dotprod {
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
            Kernel::Avx512Vnni => f.avx512 && f.avx512_vnni,
            Kernel::AvxVnni => f.avx2 && f.fma && f.avx_vnni,
            Kernel::Neon => f.neon && f.dotprod,
        }
    }
}

/// `v` rounded to `i8` at `inv` (127 over the largest magnitude of its group).
/// Ties go to the even integer (the vector kernels' conversion), a NaN to 0.
fn round(v: f32, inv: f32) -> i8 {
    (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8
}

/// The largest magnitude of `v` (NaN ignored) and its scale, `max / 127`, with the factor that
/// rounds to it (0 for an all-zero group).
fn scale_of(v: impl Iterator<Item = f32>) -> (f32, f32) {
    scale_of_max(v.fold(0f32, |m, v| m.max(v.abs())))
}

/// [`scale_of`] from the largest magnitude.
pub(crate) fn scale_of_max(max: f32) -> (f32, f32) {
    if max > 0.0 && max.is_finite() {
        (max / 127.0, 127.0 / max)
    } else {
        (max / 127.0, 0.0)
    }
}

/// The kernel matrix `w` (`taps · c_in` rows of reduction by `n` columns, element `(r, o)` at
/// `r + k · o`, as [`crate::ffi::Context::conv_gemm`] takes it unpacked) quantized and packed
/// ([`packed_len`] bytes, see the module docs). `None` unless `w` has `taps · c_in · n` values
/// and [`fits`]`(c_in, n)`.
pub fn pack(w: &[f32], taps: usize, c_in: usize, n: usize) -> Option<Vec<u8>> {
    let k = taps * c_in;
    if w.len() != k * n || taps == 0 || !fits(c_in, n) {
        return None;
    }
    let nr = runs(c_in);
    let mut out = vec![0u8; packed_len(taps, c_in, n)];
    let (weights, rest) = out.split_at_mut(k * n);
    let (scales, corrections) = rest.split_at_mut(4 * taps * nr * n);
    for o in 0..n {
        for j in 0..taps {
            for u in 0..nr {
                let cs = u * RUN..((u + 1) * RUN).min(c_in);
                let col = |c: usize| w[j * c_in + c + k * o];
                let (scale, inv) = scale_of(cs.clone().map(col));
                let mut sum = 0i32;
                for c in cs {
                    let q = round(col(c), inv);
                    sum += q as i32;
                    let r = j * c_in + c;
                    let at = (o / PANEL) * PANEL * k + (r / GROUP) * GROUP * PANEL;
                    weights[at + (o % PANEL) * GROUP + r % GROUP] = q as u8;
                }
                let at = 4 * ((j * nr + u) * n + o);
                scales[at..at + 4].copy_from_slice(&scale.to_le_bytes());
                corrections[at..at + 4].copy_from_slice(&(128 * sum).to_le_bytes());
            }
        }
    }
    Some(out)
}

/// Rounds each of the input rows of `c_in` values in `x` to 8 bits, each run of [`RUN`]
/// channels to its own scale: `q[r][c] = xq + 128` and `scale[r][u]`, the scale of row `r`'s run
/// `u` (the module docs). The scalar twin of [`quantize_rows_with`].
pub fn quantize_rows(x: &[f32], c_in: usize, q: &mut [u8], scale: &mut [f32]) {
    quantize_rows_with(Kernel::Scalar, x, c_in, q, scale)
}

/// [`quantize_rows`] by `kernel`'s vector code for whole runs (AVX-512 F for
/// [`Kernel::Avx512Vnni`], AVX2 for [`Kernel::AvxVnni`], the twin's elsewhere and for a row's
/// last, shorter run): the twin's bytes and scales (tested).
///
/// # Panics
/// If `kernel` is not [`Kernel::available`] (the callers' contract).
pub fn quantize_rows_with(kernel: Kernel, x: &[f32], c_in: usize, q: &mut [u8], scale: &mut [f32]) {
    assert!(
        kernel.available(),
        "{kernel:?} is not available on this CPU"
    );
    let nr = runs(c_in);
    for ((row, qr), sr) in x
        .chunks_exact(c_in)
        .zip(q.chunks_exact_mut(c_in))
        .zip(scale.chunks_exact_mut(nr))
    {
        for ((run, qrun), s) in row.chunks(RUN).zip(qr.chunks_mut(RUN)).zip(sr) {
            if run.len() == RUN {
                #[cfg(target_arch = "x86_64")]
                match kernel {
                    Kernel::Avx512Vnni => {
                        // SAFETY: the kernel, so AVX-512 F, is available (asserted); `run` and
                        // `qrun` hold RUN (32) values.
                        *s = unsafe {
                            super::x86::avx512::quantize_run32(run.as_ptr(), qrun.as_mut_ptr())
                        };
                        continue;
                    }
                    Kernel::AvxVnni => {
                        // SAFETY: the kernel, so AVX2, is available (asserted); `run` and `qrun`
                        // hold RUN (32) values.
                        *s = unsafe {
                            super::x86::avx2::quantize_run32(run.as_ptr(), qrun.as_mut_ptr())
                        };
                        continue;
                    }
                    _ => {}
                }
            }
            let (sc, inv) = scale_of(run.iter().copied());
            *s = sc;
            for (d, &v) in qrun.iter_mut().zip(run) {
                *d = (round(v, inv) as i32 + 128) as u8;
            }
        }
    }
}

thread_local! {
    /// The 8-bit copy of a call's input rows and their scales, per thread (ggml's workers call in
    /// parallel).
    static INPUT: std::cell::RefCell<(Vec<u8>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Where a kernel finds one call's operands.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operands {
    /// The packed weights ([`pack`]).
    pub w: *const u8,
    /// Each run's weight scales, `[taps · runs][n]`.
    pub sw: *const f32,
    /// Each run's correction `128 · Σ wq`, `[taps · runs][n]`.
    pub corr: *const i32,
    /// The input rows as `xq + 128`, from row `r0` on.
    pub xq: *const u8,
    /// Their scales, `[rows][runs]`, from row `r0` on.
    pub sx: *const f32,
    /// First input row held.
    pub r0: usize,
}

/// Output blocks `b0..b1` (of [`blocks`]) of the causal conv of the f32 input rows `x`
/// (`t_out + (taps − 1) · dilation` rows of `c_in`) by the packed kernel `w`, into the f32 rows
/// `y` (`t_out` of `n`), by `kernel`. The input rows the blocks read are rounded to 8 bits first
/// (once per call and thread). After each block is stored, `then(rows, columns)` is called on
/// it, while it is still in cache (the caller's bias and residual adds).
///
/// # Safety
/// `kernel.available()`; [`fits`]`(c_in, n)`; `w` holds [`packed_len`] bytes from [`pack`], `x`
/// the input rows and `y` room for the output rows, none of them written by anyone else during
/// the call except `y`'s other blocks.
pub unsafe fn conv(
    kernel: Kernel,
    w: *const u8,
    x: *const f32,
    y: *mut f32,
    s: Conv,
    (b0, b1): (usize, usize),
    mut then: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
) {
    if b0 >= b1 {
        return;
    }
    let (r0, r1) = super::bf16::input_rows(s, (b0, b1));
    let r1 = r1.min(s.t_out + (s.taps - 1) * s.dilation);
    INPUT.with(|cell| {
        let (q, sx) = &mut *cell.borrow_mut();
        q.clear();
        q.resize((r1 - r0) * s.c_in, 0);
        sx.clear();
        sx.resize((r1 - r0) * runs(s.c_in), 0.0);
        // SAFETY: rows r0..r1 of the caller's input.
        let src = unsafe { std::slice::from_raw_parts(x.add(r0 * s.c_in), (r1 - r0) * s.c_in) };
        quantize_rows_with(kernel, src, s.c_in, q, sx);
        let k = s.taps * s.c_in;
        let per = s.taps * runs(s.c_in) * s.n;
        let ops = Operands {
            w,
            sw: w.wrapping_add(k * s.n).cast(),
            corr: w.wrapping_add(k * s.n + 4 * per).cast(),
            xq: q.as_ptr(),
            sx: sx.as_ptr(),
            r0,
        };
        for b in b0..b1 {
            let (nb, rows) = super::bf16::block(s, b);
            // SAFETY: the caller's contract; rows below t_out read input rows below r1,
            // columns of block nb < n.
            unsafe {
                match kernel {
                    Kernel::Scalar => block_scalar(ops, y, s, nb, rows.clone()),
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx512Vnni => {
                        super::x86::avx512_vnni::int8_block(ops, y, s, nb, rows.clone())
                    }
                    #[cfg(target_arch = "x86_64")]
                    Kernel::AvxVnni => {
                        super::x86::avx_vnni::int8_block(ops, y, s, nb, rows.clone())
                    }
                    #[cfg(target_arch = "aarch64")]
                    Kernel::Neon => super::aarch64::neon::int8_block(ops, y, s, nb, rows.clone()),
                    #[allow(unreachable_patterns)]
                    _ => unreachable!("{kernel:?} is not available here (`Kernel::available`)"),
                }
            }
            then(rows, nb * BLOCK..(nb + 1) * BLOCK);
        }
    });
}

/// Rows `rows` of column block `nb`, one value at a time: the twin.
///
/// # Safety
/// As [`conv`], with `ops` holding the input rows that `rows` read.
unsafe fn block_scalar(
    ops: Operands,
    y: *mut f32,
    s: Conv,
    nb: usize,
    rows: std::ops::Range<usize>,
) {
    let (k, nr) = (s.taps * s.c_in, runs(s.c_in));
    for t in rows {
        for o in nb * BLOCK..(nb + 1) * BLOCK {
            let panel = ops
                .w
                .wrapping_add((o / PANEL) * PANEL * k + (o % PANEL) * GROUP);
            let mut total = 0f32;
            for j in 0..s.taps {
                let r = t + j * s.dilation - ops.r0;
                for u in 0..nr {
                    let mut sum = 0i32;
                    for c in u * RUN..((u + 1) * RUN).min(s.c_in) {
                        let at = j * s.c_in + c;
                        // SAFETY: input row r (held), channel c < c_in; weight (at, o) inside
                        // the packed matrix.
                        unsafe {
                            let xq = *ops.xq.add(r * s.c_in + c) as i32;
                            let wq = *panel.add((at / GROUP) * GROUP * PANEL + at % GROUP) as i8;
                            sum += xq * wq as i32;
                        }
                    }
                    let run = (j * nr + u) * s.n + o;
                    // SAFETY: run (j, u) and column o of the scales and corrections; run u of
                    // row r's scales.
                    let (sum, coef) = unsafe {
                        (
                            sum - *ops.corr.add(run),
                            *ops.sx.add(r * nr + u) * *ops.sw.add(run),
                        )
                    };
                    total = (sum as f32).mul_add(coef, total);
                }
            }
            // SAFETY: output (t, o) inside `y`.
            unsafe { *y.add(t * s.n + o) = total };
        }
    }
}

/// What [`conv`] approximates: the exact product of the unquantized values, in f64 (the tests'
/// reference). `w` as [`pack`] takes it.
pub fn conv_reference(w: &[f32], x: &[f32], s: Conv) -> Vec<f32> {
    let k = s.taps * s.c_in;
    let mut y = vec![0f32; s.t_out * s.n];
    for t in 0..s.t_out {
        for o in 0..s.n {
            let mut acc = 0f64;
            for j in 0..s.taps {
                for c in 0..s.c_in {
                    let xv = x[(t + j * s.dilation) * s.c_in + c] as f64;
                    acc += xv * w[j * s.c_in + c + k * o] as f64;
                }
            }
            y[t * s.n + o] = acc as f32;
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0)
            .map(|v| v * [1.0, 0.3, 2.7][(v.to_bits() as usize) % 3])
            .collect()
    }

    fn run(kernel: Kernel, w: &[u8], x: &[f32], s: Conv, shares: &[(usize, usize)]) -> Vec<f32> {
        let mut y = vec![f32::NAN; s.t_out * s.n];
        for &share in shares {
            // SAFETY: the kernel is available; `w` is packed for `s`, `x` holds the input rows,
            // `y` the output rows.
            unsafe {
                conv(
                    kernel,
                    w.as_ptr(),
                    x.as_ptr(),
                    y.as_mut_ptr(),
                    s,
                    share,
                    |_, _| {},
                )
            };
        }
        y
    }

    /// Every vector kernel this CPU has gives the scalar twin's bits (runs, row groups'
    /// remainders, dilation, the blocks split in two calls); the others are named as skipped.
    #[test]
    fn vector_kernels_give_the_twins_bits() {
        for kernel in [Kernel::Avx512Vnni, Kernel::AvxVnni, Kernel::Neon] {
            if !kernel.available() {
                eprintln!("int8 kernel {kernel:?}: skipped, this CPU lacks its instructions");
                continue;
            }
            for (c_in, taps, dilation, n, t_out) in [
                (300, 1, 1, 64, 9),
                (40, 7, 3, 32, 23),
                (132, 3, 1, 96, 1),
                (256, 2, 1, 32, 40),
            ] {
                let s = Conv {
                    c_in,
                    taps,
                    dilation,
                    t_out,
                    n,
                };
                let w = pack(&values(taps * c_in * n, 1), taps, c_in, n).unwrap();
                let x = values((t_out + (taps - 1) * dilation) * c_in, 2);
                let all = blocks(t_out, n);
                let twin = run(Kernel::Scalar, &w, &x, s, &[(0, all)]);
                let got = run(kernel, &w, &x, s, &[(0, all / 2), (all / 2, all)]);
                let same = got
                    .iter()
                    .zip(&twin)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{kernel:?} {s:?}: not the twin's bits");
            }
        }
    }

    /// The twin is within the rounding of 8 bits of the exact product: each output's error is
    /// below the sum of its terms' worst rounding (half a step of the input and of the weight
    /// each), so a packing or indexing slip (a wrong weight, scale or correction) shows.
    #[test]
    fn the_twin_is_the_product_within_eight_bits_rounding() {
        for (c_in, taps, dilation, n, t_out) in [(300, 1, 1, 64, 9), (40, 7, 3, 32, 23)] {
            let s = Conv {
                c_in,
                taps,
                dilation,
                t_out,
                n,
            };
            let k = taps * c_in;
            let wf = values(k * n, 3);
            let x = values((t_out + (taps - 1) * dilation) * c_in, 4);
            let w = pack(&wf, taps, c_in, n).unwrap();
            let got = run(Kernel::Scalar, &w, &x, s, &[(0, blocks(t_out, n))]);
            let exact = conv_reference(&wf, &x, s);
            let row_max = |r: usize, cs: std::ops::Range<usize>| {
                cs.map(|c| x[r * c_in + c].abs()).fold(0f32, f32::max)
            };
            for t in 0..t_out {
                for o in 0..n {
                    let mut bound = 0f64;
                    for j in 0..taps {
                        let r = t + j * dilation;
                        for u in 0..runs(c_in) {
                            let cs = u * RUN..((u + 1) * RUN).min(c_in);
                            let xm = row_max(r, cs.clone()) as f64;
                            let xs = xm / 127.0;
                            let wm = cs
                                .clone()
                                .map(|c| wf[j * c_in + c + k * o].abs())
                                .fold(0f32, f32::max) as f64;
                            let ws = wm / 127.0;
                            bound += cs.len() as f64 * (0.5 * xs * wm + 0.5 * ws * xm);
                        }
                    }
                    let err = (got[t * n + o] as f64 - exact[t * n + o] as f64).abs();
                    assert!(
                        err <= bound * 1.01 + 1e-5,
                        "({t}, {o}): error {err}, bound {bound}"
                    );
                }
            }
            // And far closer than that on the whole: the errors cancel.
            let (mut e2, mut s2) = (0f64, 0f64);
            for (g, e) in got.iter().zip(&exact) {
                e2 += ((g - e) as f64).powi(2);
                s2 += (*e as f64).powi(2);
            }
            let snr = 10.0 * (s2 / e2).log10();
            assert!(snr > 30.0, "{s:?}: {snr:.1} dB from the exact product");
        }
    }

    #[test]
    fn pack_places_each_value_and_refuses_other_shapes() {
        let (taps, c_in, n) = (2, 8, 32);
        let k = taps * c_in;
        // Column o's values are o + 1 at every reduction index: every weight rounds to 127.
        let w: Vec<f32> = (0..k * n).map(|i| (i / k + 1) as f32).collect();
        let p = pack(&w, taps, c_in, n).unwrap();
        assert_eq!(p.len(), packed_len(taps, c_in, n));
        assert!(p[..k * n].iter().all(|&b| b as i8 == 127));
        // The scale of column 17, tap 1, run 0: 18 / 127; its correction 128 · 8 · 127.
        let at = k * n + 4 * (n + 17);
        assert_eq!(
            f32::from_le_bytes(p[at..at + 4].try_into().unwrap()),
            18.0 / 127.0
        );
        let at = k * n + 4 * taps * n + 4 * (n + 17);
        assert_eq!(
            i32::from_le_bytes(p[at..at + 4].try_into().unwrap()),
            128 * 8 * 127
        );
        assert!(pack(&w, taps, c_in, n - 1).is_none());
        assert!(
            pack(&w[..taps * 6 * n], taps, 6, n).is_none(),
            "c_in not whole groups"
        );
    }

    #[test]
    fn rows_round_to_their_own_scale() {
        let x = [1.0f32, -0.5, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0];
        let (mut q, mut s) = ([0u8; 8], [0f32; 2]);
        assert_eq!(runs(4), 1);
        quantize_rows(&x, 4, &mut q, &mut s);
        assert_eq!(s, [1.0 / 127.0, 0.0]);
        assert_eq!(q, [255, 128 - 64, 128 + 32, 128, 128, 128, 128, 128]);
    }

    /// Each vector kernel's row rounding gives the twin's bytes and scales: ties (to even), NaN
    /// (ignored in the scale, rounded to 0), infinities, all-zero runs, a last shorter run.
    #[test]
    fn vector_row_rounding_gives_the_twins_bytes() {
        for kernel in [Kernel::Avx512Vnni, Kernel::AvxVnni, Kernel::Neon] {
            if !kernel.available() {
                eprintln!("int8 kernel {kernel:?}: skipped, this CPU lacks its instructions");
                continue;
            }
            for c_in in [96, 100, 32] {
                let mut x = values(5 * c_in, 3);
                // Row 1: largest magnitude 127, so every k + 0.5 is a tie.
                for (i, v) in x[c_in..2 * c_in].iter_mut().enumerate() {
                    *v = if i == 0 { 127.0 } else { (i % 19) as f32 - 9.5 };
                }
                x[2 * c_in + 3] = f32::NAN;
                x[2 * c_in + 40.min(c_in - 1)] = f32::INFINITY;
                x[3 * c_in..4 * c_in].fill(0.0);
                x[4 * c_in + c_in - 1] = f32::NAN;
                let nr = runs(c_in);
                let (mut q0, mut s0) = (vec![0u8; x.len()], vec![0f32; 5 * nr]);
                let (mut q1, mut s1) = (vec![1u8; x.len()], vec![1f32; 5 * nr]);
                quantize_rows(&x, c_in, &mut q0, &mut s0);
                quantize_rows_with(kernel, &x, c_in, &mut q1, &mut s1);
                assert_eq!(q1, q0, "{kernel:?}, {c_in} channels: bytes");
                let bits = |s: &[f32]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&s1), bits(&s0), "{kernel:?}, {c_in} channels: scales");
                assert_eq!(q0[c_in + 1], 128 - 8, "-8.5 rounds to the even -8");
                assert_eq!(q0[c_in + 2], 128 - 8, "-7.5 rounds to the even -8");
            }
        }
    }
}
