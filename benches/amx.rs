//! The decoder's bf16 products on AMX tiles alone (`ffi::amx::conv`), one thread, on the shapes
//! a two-frame decoder call computes: the residual units' k = 7 convs and 1×1 convs of the four
//! blocks, their transposed convs (as products of `r · c_out` columns), and the small-row
//! products whose weights come once per call. Each shape with its packed kernel at a 64-byte
//! address (as the decoder places it, `Context::new_tensor_aligned`) and, in the same run, 32
//! bytes off (as ggml placed it before): the cost of tile rows that straddle two cache lines.
//!
//! Run with: `cargo bench --bench amx`. Criterion prints elements per second: one element is
//! one floating-point operation (2 per multiply-add), so the rate reads as FLOP/s. The operands
//! stay in cache between iterations.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qtts::ffi::amx;

/// `(c_in, taps, dilation, t_out, n)` of one product.
const SHAPES: [(usize, usize, usize, usize, usize); 13] = [
    (96, 7, 3, 3840, 96),
    (192, 7, 3, 1280, 192),
    (384, 7, 3, 320, 384),
    (768, 7, 3, 64, 768),
    (96, 1, 1, 3840, 96),
    (192, 1, 1, 1280, 192),
    (384, 1, 1, 320, 384),
    (768, 1, 1, 64, 768),
    (192, 1, 1, 1280, 288),
    (384, 1, 1, 320, 768),
    (768, 1, 1, 64, 1920),
    (1536, 1, 1, 8, 6144),
    (512, 1, 1, 2, 1024),
];

fn bench(c: &mut Criterion) {
    if !amx::available() {
        eprintln!("amx: no AMX-BF16 tiles on this CPU or OS, bench skipped");
        return;
    }
    let val = |i: usize, s: usize| ((i * s % 1000) as f32 - 500.0) * 1e-3;
    for (c_in, taps, dilation, t_out, n) in SHAPES {
        let k = taps * c_in;
        let w: Vec<f32> = (0..k * n).map(|i| val(i, 7919)).collect();
        let packed = amx::pack(&w, k, n).expect("the shapes fit the tiles");
        // Room to place the packed kernel at a line's start or 32 bytes past it.
        let mut buf = vec![0u16; packed.len() + amx::LINE];
        let line = (buf.as_ptr() as usize).next_multiple_of(amx::LINE) - buf.as_ptr() as usize;
        let rows = t_out + (taps - 1) * dilation;
        let x: Vec<f32> = (0..rows * c_in).map(|i| val(i, 104729)).collect();
        let mut y = vec![0f32; t_out * n];
        let s = amx::Conv {
            c_in,
            taps,
            dilation,
            t_out,
            n,
        };
        let blocks = amx::blocks(t_out, n);
        let mut g = c.benchmark_group(format!(
            "amx conv c_in {c_in}, taps {taps}, rows {t_out}, columns {n}"
        ));
        g.throughput(Throughput::Elements((2 * k * t_out * n) as u64));
        g.sample_size(20);
        for (label, bytes_off) in [("on a line", 0), ("32 bytes off", 32)] {
            let at = (line + bytes_off) / 2;
            buf[at..at + packed.len()].copy_from_slice(&packed);
            let wp = buf[at..].as_ptr();
            g.bench_function(label, |b| {
                b.iter(|| {
                    // SAFETY: AMX is available (checked above); the shape fits; `wp` holds the
                    // packed kernel, `x` the input rows, `y` room for the output; all blocks.
                    unsafe { amx::conv(wp, x.as_ptr(), y.as_mut_ptr(), s, (0, blocks), |_, _| {}) };
                    std::hint::black_box(&y);
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
