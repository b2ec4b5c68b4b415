//! The decoder's products alone, one thread, on the shapes a two-frame decoder call computes
//! (the residual units' k = 7 convs and 1×1 convs of the four blocks, their transposed convs as
//! products of `r · c_out` columns, and the small-row products whose weights come once per
//! call): each bf16 kernel this CPU has (`qtts::kernels::bf16`: AMX tiles, AVX-512 BF16), and in
//! the same run the f32 path's `matrixmultiply` sgemm on the same shape (one product per tap, as
//! `ffi::Context::conv_gemm` runs it for dilated convs), and the exact f32 kernels on panels
//! (`qtts::kernels::panel`, each one this CPU has): the ratios the decoder's paths gain.
//!
//! Run with: `cargo bench --bench bf16`. Criterion prints elements per second: one element is
//! one floating-point operation (2 per multiply-add), so the rate reads as FLOP/s. The operands
//! stay in cache between iterations; the packed kernels on cache lines, as the decoder places
//! them.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qtts::kernels::bf16::{self, Kernel};
use qtts::kernels::int8::{self, Kernel as Int8Kernel};
use qtts::kernels::panel::{self, Kernel as PanelKernel};

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
    let val = |i: usize, s: usize| ((i * s % 1000) as f32 - 500.0) * 1e-3;
    let kernels: Vec<Kernel> = [Kernel::Amx, Kernel::Avx512]
        .into_iter()
        .filter(|k| {
            if !k.available() {
                eprintln!("bf16: kernel {k:?} skipped, this CPU lacks its instructions");
            }
            k.available()
        })
        .collect();
    let panels: Vec<PanelKernel> = [PanelKernel::Avx512, PanelKernel::Avx2]
        .into_iter()
        .filter(|k| {
            if !k.available() {
                eprintln!("panel: kernel {k:?} skipped, this CPU lacks its instructions");
            }
            k.available()
        })
        .collect();
    let int8s: Vec<Int8Kernel> = [Int8Kernel::Avx512Vnni, Int8Kernel::AvxVnni]
        .into_iter()
        .filter(|k| {
            if !k.available() {
                eprintln!("int8: kernel {k:?} skipped, this CPU lacks its instructions");
            }
            k.available()
        })
        .collect();
    for (c_in, taps, dilation, t_out, n) in SHAPES {
        let k = taps * c_in;
        let w: Vec<f32> = (0..k * n).map(|i| val(i, 7919)).collect();
        let packed = bf16::pack(&w, k, n).expect("the shapes fit the packing");
        let mut buf = vec![0u16; packed.len() + bf16::LINE];
        let line = (buf.as_ptr() as usize).next_multiple_of(bf16::LINE) - buf.as_ptr() as usize;
        buf[line / 2..line / 2 + packed.len()].copy_from_slice(&packed);
        let wp = buf[line / 2..].as_ptr();
        let rows = t_out + (taps - 1) * dilation;
        let x: Vec<f32> = (0..rows * c_in).map(|i| val(i, 104729)).collect();
        let mut y = vec![0f32; t_out * n];
        let s = bf16::Conv {
            c_in,
            taps,
            dilation,
            t_out,
            n,
        };
        let blocks = bf16::blocks(t_out, n);
        let mut g = c.benchmark_group(format!(
            "decoder product c_in {c_in}, taps {taps}, rows {t_out}, columns {n}"
        ));
        g.throughput(Throughput::Elements((2 * k * t_out * n) as u64));
        g.sample_size(20);
        for &kernel in &kernels {
            g.bench_function(format!("bf16 {kernel:?}"), |b| {
                b.iter(|| {
                    // SAFETY: the kernel is available (filtered above); the shape fits; `wp`
                    // holds the packed kernel, `x` the input rows, `y` room for the output.
                    unsafe {
                        bf16::conv(
                            kernel,
                            wp,
                            x.as_ptr(),
                            y.as_mut_ptr(),
                            s,
                            (0, blocks),
                            |_, _| {},
                        )
                    };
                    std::hint::black_box(&y);
                })
            });
        }
        // The exact f32 products on panels (`qtts::kernels::panel`), each vector kernel this CPU
        // has.
        let wpanel = panel::pack(&w, k, n).expect("the shapes fit the panels");
        let mut pbuf = vec![0f32; wpanel.len() + panel::LINE / 4];
        let line = (pbuf.as_ptr() as usize).next_multiple_of(panel::LINE) - pbuf.as_ptr() as usize;
        pbuf[line / 4..line / 4 + wpanel.len()].copy_from_slice(&wpanel);
        let pp = pbuf[line / 4..].as_ptr();
        let ps = panel::Conv {
            c_in,
            taps,
            dilation,
            t_out,
            n,
        };
        for &kernel in &panels {
            g.bench_function(format!("f32 panel {kernel:?}"), |b| {
                b.iter(|| {
                    // SAFETY: the kernel is available (filtered above); `pp` holds the packed
                    // kernel on a cache line, `x` the input rows, `y` room for the output.
                    unsafe {
                        panel::conv(
                            kernel,
                            pp,
                            x.as_ptr(),
                            y.as_mut_ptr(),
                            ps,
                            (0, panel::blocks(t_out, n)),
                            |_, _| {},
                        )
                    };
                    std::hint::black_box(&y);
                })
            });
        }
        // The 8-bit products (`qtts::kernels::int8`), the input rows' rounding included.
        let w8 = int8::pack(&w, taps, c_in, n).expect("the shapes fit the 8-bit packing");
        let mut b8 = vec![0u8; w8.len() + int8::LINE];
        let line = (b8.as_ptr() as usize).next_multiple_of(int8::LINE) - b8.as_ptr() as usize;
        b8[line..line + w8.len()].copy_from_slice(&w8);
        for &kernel in &int8s {
            g.bench_function(format!("int8 {kernel:?}"), |b| {
                b.iter(|| {
                    // SAFETY: the kernel is available (filtered above); `b8` holds the packed
                    // kernel on a cache line, `x` the input rows, `y` room for the output.
                    unsafe {
                        int8::conv(
                            kernel,
                            b8[line..].as_ptr(),
                            x.as_ptr(),
                            y.as_mut_ptr(),
                            ps,
                            (0, int8::blocks(t_out, n)),
                            |_, _| {},
                        )
                    };
                    std::hint::black_box(&y);
                })
            });
        }
        g.bench_function("f32 sgemm (matrixmultiply)", |b| {
            let per_tap = if dilation == 1 { taps } else { 1 };
            b.iter(|| {
                for j in (0..taps).step_by(per_tap) {
                    // SAFETY: row t of the product reads input rows t + j · dilation onwards,
                    // `per_tap · c_in` values, all inside `x`; `w` is `[k, n]` column-major
                    // with columns k apart; `y` holds t_out rows of n.
                    unsafe {
                        matrixmultiply::sgemm(
                            t_out,
                            per_tap * c_in,
                            n,
                            1.0,
                            x.as_ptr().add(j * dilation * c_in),
                            c_in as isize,
                            1,
                            w.as_ptr().add(j * c_in),
                            1,
                            k as isize,
                            if j == 0 { 0.0 } else { 1.0 },
                            y.as_mut_ptr(),
                            n as isize,
                            1,
                        )
                    };
                }
                std::hint::black_box(&y);
            })
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
