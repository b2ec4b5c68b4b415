//! The streaming decoder on the full-size geometry: ms per frame when fed 1, 2 and 4 frames per call,
//! on 1 and 2 threads, with ggml's f32 products (the in-run baseline), the host products
//! (`Context::conv_gemm`) from f32 and f16 files, their weights stored as f16 (`Products::HostF16`),
//! every matrix as q8_0 at load, and the residual units' k = 7 convs in 8 bits
//! (`Products::HostInt8`).
//! The decoder's ≈ 5 GFLOP per frame (MODEL-NOTES.md §7) gives GFLOP/s. Then the fused SnakeBeta
//! against the five ggml ops it replaced (`snakebeta` group), host f32 and q8_0 matrices, 1
//! thread, 1 frame per call. Then SnakeBeta's row kernels alone (`snakebeta rows` group).
//!
//! Run with: `QTTS_BENCH_MODELS=<dir with mmproj-f32.gguf, mmproj-f16.gguf> cargo bench --bench decoder`
//! (without it, the models are made once under the target directory, as in `benches/code_predictor.rs`).

mod common;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qtts::decoder::{Decoder, Products};
use qtts::ffi::Threadpool;
use qtts::gguf::GgufFile;
use qtts::model::convert::OutType;

fn bench(c: &mut Criterion) {
    let dir = common::models(&[OutType::F32, OutType::F16]);
    // 32 frames of codes, varied but deterministic.
    let codes: Vec<[u32; 16]> = (0..32u32)
        .map(|t| std::array::from_fn(|k| (t * 131 + k as u32 * 977) % 2048))
        .collect();
    let mut out = vec![0f32; 4 * 1920];
    let mut g = c.benchmark_group("decoder, per frame");
    g.sample_size(10);
    g.throughput(Throughput::Elements(1));
    // ggml's products on the f32 file (the baseline), the host products (`conv_gemm`) on the f32
    // file by `matrixmultiply` (the f32 products before the panels), on the f32 and f16 files by
    // the tier's panel kernel where it has one, the bf16 products, and ggml's q8_0 products.
    use qtts::kernels::bf16::Kernel as Bf16;
    for (label, ty, q8, products, bf16) in [
        ("ggml f32", OutType::F32, false, Products::Ggml, None),
        (
            "host f32 sgemm",
            OutType::F32,
            false,
            Products::HostF32Sgemm,
            None,
        ),
        ("host f32", OutType::F32, false, Products::HostF32, None),
        ("host f16", OutType::F32, false, Products::HostF16, None),
        (
            "host f32 from f16 file",
            OutType::F16,
            false,
            Products::HostF32,
            None,
        ),
        (
            "host bf16 (AMX)",
            OutType::F32,
            false,
            Products::HostBf16,
            Some(Bf16::Amx),
        ),
        (
            "host bf16 (AVX-512 BF16)",
            OutType::F32,
            false,
            Products::HostBf16,
            Some(Bf16::Avx512),
        ),
        ("ggml q8_0", OutType::F32, true, Products::Ggml, None),
        ("host int8", OutType::F32, false, Products::HostInt8, None),
    ] {
        if products == Products::HostInt8 && qtts::kernels::int8::Kernel::active().is_none() {
            eprintln!("{label}: skipped, this CPU or tier lacks AVX-512 VNNI and AVX-VNNI");
            continue;
        }
        if bf16.is_some_and(|k: Bf16| !k.available()) {
            eprintln!("{label}: skipped, this CPU lacks the instructions");
            continue;
        }
        let f = GgufFile::open(qtts::model::ModelFiles::converted_in(&dir, ty).mmproj).unwrap();
        let q8 = q8.then_some(qtts::gguf::GgmlType::Q8_0);
        let mut voc = match bf16 {
            Some(k) => Decoder::load_bf16(&f, k).unwrap(),
            None => Decoder::load_options(&f, q8, products).unwrap(),
        };
        for threads in [1, 2] {
            let pool = Threadpool::new(threads, &[]).unwrap();
            for chunk in [1usize, 2, 4] {
                g.bench_function(
                    format!("{label}, {threads} thread(s), {chunk} frame(s) per call"),
                    |b| {
                        let mut t = 0;
                        b.iter_custom(|iters| {
                            // Time per frame: each iteration decodes one chunk, divided by its frames.
                            let start = std::time::Instant::now();
                            for _ in 0..iters {
                                let frames = &codes[t % 28..t % 28 + chunk];
                                voc.decode_frames(&pool, frames, &mut out[..chunk * 1920])
                                    .unwrap();
                                t += chunk;
                            }
                            start.elapsed() / chunk as u32
                        })
                    },
                );
            }
        }
    }
    g.finish();

    // The fused SnakeBeta against the five ggml ops it replaced, interleaved in one group.
    let mut g = c.benchmark_group("snakebeta, decoder per frame, 1 thread, 1 frame per call");
    g.sample_size(10);
    let pool = Threadpool::new(1, &[]).unwrap();
    for q8 in [false, true] {
        let f = GgufFile::open(dir.join("mmproj-f32.gguf")).unwrap();
        let mut voc = Decoder::load_with(&f, q8.then_some(qtts::gguf::GgmlType::Q8_0)).unwrap();
        for fused in [false, true] {
            voc.set_fused_snake(fused);
            let name = format!(
                "{} matrices, {}",
                if q8 { "q8_0" } else { "host f32" },
                if fused {
                    "fused snake"
                } else {
                    "five-op snake"
                }
            );
            g.bench_function(name, |b| {
                let mut t = 0;
                b.iter(|| {
                    voc.decode_frames(&pool, &codes[t % 28..t % 28 + 1], &mut out[..1920])
                        .unwrap();
                    t += 1;
                })
            });
        }
    }
    g.finish();
}

/// SnakeBeta's kernels (`qtts::kernels::snake::row_with`) of every tier this CPU runs alone, on the rows of one frame: each
/// upsampling block's seven activations at its width (768, 384, 192 and 96 channels at 32,
/// 160, 640 and 1920 rows a frame; the first block's input and the last activation are left
/// out), about 2.75 M values. The scalar kernel is the in-run baseline.
fn snake_rows(c: &mut Criterion) {
    use qtts::kernels::snake::{row_with, Kernel};
    let shapes = [(768usize, 32usize), (384, 160), (192, 640), (96, 1920)];
    let max = shapes.iter().map(|&(ch, r)| ch * r).max().unwrap_or(0);
    let x: Vec<f32> = (0..max)
        .map(|i| ((i * 7919 % 2001) as f32 - 1000.0) * 0.002)
        .collect();
    let mut y = vec![0f32; max];
    let params = |ch: usize| -> (Vec<f32>, Vec<f32>) {
        let alpha = (0..ch).map(|i| 0.5 + (i % 13) as f32 * 0.3).collect();
        let inv_beta = (0..ch).map(|i| 1.0 / (1.0 + (i % 7) as f32)).collect();
        (alpha, inv_beta)
    };
    let params: Vec<_> = shapes.iter().map(|&(ch, _)| params(ch)).collect();
    let values: usize = shapes.iter().map(|&(ch, r)| 7 * ch * r).sum();
    let mut g = c.benchmark_group("snakebeta rows of one frame, 1 thread");
    g.throughput(Throughput::Elements(values as u64));
    let mut kernels = Vec::new();
    qtts::kernels::for_each_tier(|t| {
        let k = Kernel::for_caps(t.caps());
        if !kernels.contains(&k) {
            kernels.push(k);
        }
    });
    for kernel in kernels {
        g.bench_function(format!("{kernel:?}"), |b| {
            b.iter(|| {
                for (&(ch, rows), (alpha, inv_beta)) in shapes.iter().zip(&params) {
                    for _ in 0..7 {
                        for (xr, yr) in x[..ch * rows]
                            .chunks_exact(ch)
                            .zip(y[..ch * rows].chunks_exact_mut(ch))
                        {
                            row_with(kernel, xr, alpha, inv_beta, yr);
                        }
                    }
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench, snake_rows);
criterion_main!(benches);
