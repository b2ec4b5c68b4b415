//! The decoder's products on bf16 weights: a causal convolution (or a plain matrix product, one
//! tap) of f32 input rows by a kernel matrix rounded to bf16 and packed once at load ([`pack`]),
//! f32 out. Two kernels read the same packing: AMX tiles (`tdpbf16ps`, Intel Sapphire Rapids and
//! later) and AVX-512 BF16 (`vdpbf16ps`, AMD Zen 4 and 5, Intel Cooper Lake and later).
//!
//! [`pack`]'s order is AMX's tile order, which is also `vdpbf16ps`'s operand: tile `(nb, kb)`
//! holds, for each pair `p` of reduction values, the 16 columns `nb · 16 ..` as bf16 pairs
//! `(w[kb · 32 + 2p][o], w[kb · 32 + 2p + 1][o])`, one 64-byte row. Tiles are ordered `nb`-major,
//! so one column block's reduction is contiguous.
//!
//! Each call converts its input rows to bf16 once per thread ((`with_rows`)), then computes
//! output blocks of up to 32 rows by 32 columns ([`blocks`]), split over the threads by block.
//! Each output value sums its reduction in one order that depends on neither the row count nor
//! the thread count, from its own input row only; the kernels round differently from each other
//! (AMX and `vdpbf16ps` each accumulate pairs in their own way, and Intel and AMD implement
//! `vdpbf16ps`'s intermediate rounding differently), so they agree with [`conv_reference`]
//! within the f32 accumulation's rounding, not bit for bit.

use super::Features;

/// Reduction values (bf16) per tile step: one A tile row, 64 bytes.
pub const TILE_K: usize = 32;
/// Output columns per C tile.
pub(crate) const TILE_N: usize = 16;
/// Output rows per C tile.
pub(crate) const TILE_M: usize = 16;
/// Output rows and columns per block: 2 × 2 C tiles.
pub(crate) const BLOCK: usize = 32;
/// Bytes of a cache line, and the alignment of both operands' tile rows: a 64-byte row that
/// straddles two lines costs two loads (1.3x the kernel's time on the decoder's shapes,
/// PERFORMANCE.md).
pub const LINE: usize = 64;

/// Whether a conv of `c_in` input channels and `n` output columns can be packed: channel blocks of
/// [`TILE_K`] that never straddle two taps, whole 32-column output blocks.
pub fn fits(c_in: usize, n: usize) -> bool {
    c_in > 0 && n > 0 && c_in.is_multiple_of(TILE_K) && n.is_multiple_of(BLOCK)
}

/// A bf16 product kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Intel AMX tiles: 2 × 2 tiles of 16 × 16 outputs per block.
    Amx,
    /// AVX-512 BF16 dot products: 16 columns per vector.
    Avx512,
}

impl Kernel {
    /// The kernel among `caps` (a tier's features), if any.
    pub fn for_caps(caps: Features) -> Option<Kernel> {
        if caps.amx_bf16 {
            Some(Kernel::Amx)
        } else if caps.avx512_bf16 {
            Some(Kernel::Avx512)
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
            Kernel::Amx => f.amx_bf16,
            Kernel::Avx512 => f.avx512_bf16,
        }
    }
}

thread_local! {
    /// The bf16 copy of a call's input rows, per thread (ggml's workers call in parallel).
    static INPUT: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The input rows `r0..r1` that output blocks `b0..b1` (of [`blocks`]) read: whole row blocks
/// plus the taps' span, so `r1` may pass the input's last row.
pub(crate) fn input_rows(s: Conv, (b0, b1): (usize, usize)) -> (usize, usize) {
    let span = (s.taps - 1) * s.dilation;
    let mrows = block_rows(s.t_out);
    let (mut r0, mut r1) = (usize::MAX, 0);
    for b in b0..b1 {
        let (_, rows) = block(s, b);
        r0 = r0.min(rows.start);
        r1 = r1.max(rows.start + mrows);
    }
    if r0 > r1 {
        return (0, span);
    }
    (r0, r1 + span)
}

/// Calls `f(xb, r0)` with the input rows that output blocks `b0..b1` read (from row `r0`),
/// rounded to bf16, starting on a cache line ([`LINE`]); rows past the input are zero (they feed
/// only the output rows past `t_out`, which are not stored).
///
/// # Safety
/// `x` holds the conv's `t_out + (taps − 1) · dilation` input rows of `c_in` values.
unsafe fn with_rows<R>(
    x: *const f32,
    s: Conv,
    (b0, b1): (usize, usize),
    f: impl FnOnce(&[u16], usize) -> R,
) -> R {
    let (r0, r1) = input_rows(s, (b0, b1));
    let rows_in = s.t_out + (s.taps - 1) * s.dilation;
    INPUT.with(|cell| {
        let mut buf = cell.borrow_mut();
        buf.clear();
        buf.resize((r1 - r0) * s.c_in + LINE / 2, 0);
        // The rows from a cache line's start: `c_in` is a multiple of 32 values, so every
        // 32-value step of a row is a whole line.
        let skip = (buf.as_ptr() as usize).next_multiple_of(LINE) - buf.as_ptr() as usize;
        let xb = &mut buf[skip / 2..][..(r1 - r0) * s.c_in];
        // SAFETY: rows r0..min(r1, rows_in) of the caller's input.
        let src = unsafe {
            std::slice::from_raw_parts(x.add(r0 * s.c_in), (rows_in.min(r1) - r0) * s.c_in)
        };
        for (d, &v) in xb.iter_mut().zip(src) {
            *d = bf16(v);
        }
        f(xb, r0)
    })
}

/// Output blocks `b0..b1` (of [`blocks`], in the grid's order) of the causal conv of the f32 input
/// rows `x` (`t_out + (taps − 1) · dilation` rows of `c_in`) by the packed kernel `w`, into the
/// f32 rows `y` (`t_out` of `n`), by `kernel`. After each block is stored, `then(rows, columns)`
/// is called on its stored part, while it is still in cache (the caller's bias and residual
/// adds).
///
/// # Safety
/// `kernel.available()`; [`fits`]`(c_in, n)`; `w` holds `taps · c_in · n` packed values
/// ([`pack`]), `x` the input rows and `y` room for the output rows, none of them written by
/// anyone else during the call except `y`'s other blocks.
pub unsafe fn conv(
    kernel: Kernel,
    w: *const u16,
    x: *const f32,
    y: *mut f32,
    s: Conv,
    blocks: (usize, usize),
    then: impl FnMut(std::ops::Range<usize>, std::ops::Range<usize>),
) {
    if blocks.0 >= blocks.1 {
        return;
    }
    // SAFETY: the caller's contract; the rows handed on are the ones the blocks read.
    unsafe {
        with_rows(x, s, blocks, |xb, r0| {
            #[cfg(target_arch = "x86_64")]
            match kernel {
                Kernel::Amx => super::x86::amx::conv_blocks(w, xb, r0, y, s, blocks, then),
                Kernel::Avx512 => {
                    super::x86::avx512_bf16::conv_blocks(w, xb, r0, y, s, blocks, then)
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                let _ = (kernel, w, xb, r0, y, then);
                unreachable!("no bf16 kernel is available off x86-64 (`Kernel::available`)")
            }
        })
    }
}

/// `x` rounded to the nearest bf16, ties to even (finite inputs; a NaN may come out as an
/// infinity).
#[inline]
pub fn bf16(x: f32) -> u16 {
    let b = x.to_bits();
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of a bf16.
#[inline]
pub fn f32_of(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The kernel matrix `w` (`k` rows of reduction by `n` columns, element `(r, o)` at `r + k · o`,
/// as [`crate::ffi::Context::conv_gemm`] takes it in f32) as bf16 tiles: column
/// tile `nb` and reduction step `kb` hold, at `p · 32 + o · 2 + e`, element
/// `(kb · 32 + 2p + e, nb · 16 + o)`; tiles ordered `nb`-major. `None` unless `w` has `k · n`
/// values and `k`, `n` are multiples of 32.
pub fn pack(w: &[f32], k: usize, n: usize) -> Option<Vec<u16>> {
    if w.len() != k * n || !k.is_multiple_of(TILE_K) || !n.is_multiple_of(BLOCK) {
        return None;
    }
    let kb = k / TILE_K;
    let mut out = vec![0u16; k * n];
    for (i, v) in out.iter_mut().enumerate() {
        let (e, rest) = (i % 2, i / 2);
        let (o, rest) = (rest % TILE_N, rest / TILE_N);
        let (p, rest) = (rest % (TILE_K / 2), rest / (TILE_K / 2));
        let (s, nb) = (rest % kb, rest / kb);
        *v = bf16(w[(s * TILE_K + 2 * p + e) + k * (nb * TILE_N + o)]);
    }
    Some(out)
}

/// Output rows per block: 32 (two row tiles), or 16 for products of at most 16 rows (the
/// decoder's transformer and upsamplers see 1-16 rows per call), which would waste half their
/// tile products on zero rows.
pub(crate) fn block_rows(t_out: usize) -> usize {
    if t_out <= TILE_M {
        TILE_M
    } else {
        BLOCK
    }
}

/// Weight values per group of column blocks (see [`block`]): 128 Ki, half a MiB at f32, a
/// quarter of one at bf16 or f16, so a group's weights stay in a core's L2 (1-2 MiB on the
/// CPUs this engine runs on) while its rows stream past them.
pub(crate) const GROUP_VALUES: usize = 128 * 1024;

/// Block `b` of the [`blocks`] grid of the product `s`: its column block and its rows (the last
/// row block may be short). The grid walks the column blocks in groups whose weights total at
/// most [`GROUP_VALUES`] (one block when a block's alone pass it), and each group row block by
/// row block, each row block across the group's columns: a product whose weights are small (the
/// decoder's late convs, thousands of rows by a few hundred columns) reads each input row once
/// while its weights stay in cache, one whose weights are large (the few-row products) streams
/// each column block's weights once, as column-block-major order would. Which block computes an
/// output changes nothing in its value.
pub(crate) fn block(s: Conv, b: usize) -> (usize, std::ops::Range<usize>) {
    let mrows = block_rows(s.t_out);
    let row_blocks = s.t_out.div_ceil(mrows);
    let col_blocks = s.n / BLOCK;
    let group = (GROUP_VALUES / (s.taps * s.c_in * BLOCK).max(1)).clamp(1, col_blocks.max(1));
    let g = b / (row_blocks * group);
    let width = group.min(col_blocks - g * group);
    let rest = b - g * row_blocks * group;
    let (mb, nb) = (rest / width, g * group + rest % width);
    let t0 = mb * mrows;
    (nb, t0..(t0 + mrows).min(s.t_out))
}

/// Output blocks of a product of `t_out` rows and `n` columns: the unit [`conv`] shares out.
pub fn blocks(t_out: usize, n: usize) -> usize {
    t_out.div_ceil(block_rows(t_out)) * (n / BLOCK)
}

/// Shape of one [`conv`] call.
#[derive(Clone, Copy, Debug)]
pub struct Conv {
    /// Input channels (values per input row).
    pub c_in: usize,
    /// Kernel taps.
    pub taps: usize,
    /// Rows between taps.
    pub dilation: usize,
    /// Output rows.
    pub t_out: usize,
    /// Output columns.
    pub n: usize,
}

/// What [`conv`] computes, on the same bf16 values, one product at a time in f64: the tests'
/// reference. `x` and `w` as in [`conv`] but unpacked (`w` as
/// [`crate::ffi::Context::conv_gemm`] takes f32).
pub fn conv_reference(w: &[f32], x: &[f32], s: Conv) -> Vec<f32> {
    let k = s.taps * s.c_in;
    let mut y = vec![0f32; s.t_out * s.n];
    for t in 0..s.t_out {
        for o in 0..s.n {
            let mut acc = 0f64;
            for j in 0..s.taps {
                for c in 0..s.c_in {
                    let xv = f32_of(bf16(x[(t + j * s.dilation) * s.c_in + c]));
                    let wv = f32_of(bf16(w[j * s.c_in + c + k * o]));
                    acc += xv as f64 * wv as f64;
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

    /// The grid's blocks cover every output row and column block once, in groups of column
    /// blocks whose weights stay within [`GROUP_VALUES`] (or one block), row block by row block
    /// inside a group; and the input rows of any run of blocks hold every row its blocks read.
    #[test]
    fn block_grid_covers_each_output_once_in_groups_that_fit() {
        // (t_out, n, taps, c_in): one group of all columns, several with a narrower last one,
        // one block a group (weights past the budget), and the few-row blocks of 16.
        for (t_out, n, taps, c_in) in [
            (7680, 96, 1, 96),
            (300, 256, 7, 96),
            (40, 6144, 1, 1536),
            (70, 768, 7, 768),
            (4, 1024, 1, 512),
        ] {
            let s = Conv {
                c_in,
                taps,
                dilation: 3,
                t_out,
                n,
            };
            let count = blocks(t_out, n);
            let mrows = block_rows(t_out);
            let mut seen = vec![0u8; t_out.div_ceil(mrows) * (n / BLOCK)];
            let mut prev: Option<(usize, usize)> = None;
            for b in 0..count {
                let (nb, rows) = block(s, b);
                assert!(nb < n / BLOCK && rows.start < rows.end && rows.end <= t_out);
                assert_eq!(rows.start % mrows, 0);
                seen[(rows.start / mrows) * (n / BLOCK) + nb] += 1;
                if let Some((pnb, prow)) = prev {
                    // Within a group the columns advance first, then the rows; a new group starts
                    // at row 0 past the previous group's columns.
                    let next_in_row = prow == rows.start && nb == pnb + 1;
                    let next_row = rows.start == prow + mrows && nb < pnb + 1;
                    let next_group = rows.start == 0 && nb == pnb + 1;
                    assert!(
                        next_in_row || next_row || next_group,
                        "{b}: {pnb},{prow} then {nb},{rows:?}"
                    );
                }
                prev = Some((nb, rows.start));
            }
            assert!(seen.iter().all(|&c| c == 1), "{t_out}x{n}: {seen:?}");
            // Columns the first group spans: its blocks of row 0 (all the columns when there is
            // one row block, where the order is immaterial).
            let width = (0..count).take_while(|&b| block(s, b).1.start == 0).count();
            let fits = width * taps * c_in * BLOCK <= GROUP_VALUES;
            let one_row = t_out <= mrows;
            assert!(
                one_row || width == 1 || fits,
                "{t_out}x{n}: a group of {width} blocks"
            );
            for (b0, b1) in [(0, count), (count / 3, count / 2 + 1), (count - 1, count)] {
                let (r0, r1) = input_rows(s, (b0, b1));
                for b in b0..b1 {
                    let (_, rows) = block(s, b);
                    assert!(r0 <= rows.start && rows.start + mrows + (taps - 1) * 3 <= r1);
                }
            }
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1.
        assert_eq!(bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even.
        assert_eq!(bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf16(-2.0), 0xc000);
        for v in [0.1f32, -3.7, 1e-3, 123.456] {
            let r = f32_of(bf16(v));
            assert!((r - v).abs() <= v.abs() / 256.0, "{v} -> {r}");
        }
    }

    #[test]
    fn pack_places_each_value_in_its_tile() {
        let (k, n) = (64, 32);
        // Every value a distinct bf16.
        let w: Vec<f32> = (0..k * n).map(|i| f32_of(0x3f80 + i as u16)).collect();
        let p = pack(&w, k, n).unwrap();
        // Tile (nb 1, kb 1), pair row 3, column 5, second of the pair: element (32 + 7, 16 + 5).
        let i = ((k / TILE_K) + 1) * 512 + 3 * 32 + 5 * 2 + 1;
        assert_eq!(f32_of(p[i]), w[39 + k * 21]);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), k * n, "each value placed once");
        assert!(pack(&w, 48, 32 * 64 / 48).is_none());
    }
}
