//! One code-predictor frame (15 graph computes + 15 sample heads) on the full-size 0.6B geometry,
//! at f32, f16, q8_0 and q4_K weights, with the scalar heads as the in-run baseline of the SIMD
//! heads; q4_K and q8_0 layer products by ggml against the VNNI kernels (where the CPU has
//! AVX-512 VNNI);
//! and the 15 heads alone, scalar vs SIMD.
//!
//! Run with: `cargo bench --bench code_predictor`. The model comes from `QTTS_BENCH_MODELS`
//! (a directory of `mmproj-<type>.gguf`), else it is made once under the target directory with
//! `qtts random-model --preset 0.6b-customvoice` and `qtts convert` (a few minutes, 6 GB of disk).

mod common;

use criterion::{criterion_group, criterion_main, Criterion};
use qtts::code_predictor::heads::{Heads, Kernel};
use qtts::code_predictor::{CodePredictor, LayerKernel};
use qtts::ffi::Threadpool;
use qtts::gguf::GgufFile;
use qtts::model::convert::OutType;

const TYPES: [OutType; 4] = [OutType::F32, OutType::F16, OutType::Q8_0, OutType::Q4K];

fn bench(c: &mut Criterion) {
    let dir = common::models(&TYPES);
    // The per-step split of one frame, from the engine's own profile (QTTS_PROFILE), per type.
    std::env::set_var("QTTS_PROFILE", "1");
    let simd = Kernel::active();
    let hidden: Vec<f32> = (0..1024)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    for threads in [1, 2] {
        let pool = Threadpool::new(threads, &[]).unwrap();
        let mut g = c.benchmark_group(format!("cp frame, {threads} thread(s)"));
        g.sample_size(20);
        for ty in TYPES {
            let f = GgufFile::open(qtts::model::ModelFiles::converted_in(&dir, ty).mmproj).unwrap();
            let mut cp = CodePredictor::load(&f).unwrap();
            let greedy = &mut |_: usize, l: &[f32]| qtts::sampling::argmax(l);
            for _ in 0..10 {
                cp.frame(&pool, &hidden, 100, greedy, None).unwrap();
            }
            if let Some(p) = cp.take_profile() {
                eprintln!(
                    "{} weights, {threads} thread(s), {simd:?} heads:\n{}",
                    ty.name(),
                    p.table()
                );
            }
            for kernel in [Kernel::Scalar, simd] {
                cp.set_heads_kernel(kernel);
                g.bench_function(format!("{} weights, {kernel:?} heads", ty.name()), |b| {
                    b.iter(|| {
                        cp.frame(
                            &pool,
                            &hidden,
                            100,
                            &mut |_, l| {
                                let mut best = 0;
                                for (i, &x) in l.iter().enumerate() {
                                    if x > l[best] {
                                        best = i;
                                    }
                                }
                                best as u32
                            },
                            None,
                        )
                        .unwrap()
                    })
                });
            }
        }
        g.finish();
    }
    // Quantized layer products: ggml's `mul_mat` (the baseline) against the kernel tier's
    // packed kernels, 1 thread, q4_K then q8_0 weights (`QTTS_KERNELS` picks the tier; `cargo
    // bench --bench kernels` compares the tiers' kernels alone in one run).
    if LayerKernel::fastest() == LayerKernel::Packed {
        let pool = Threadpool::new(1, &[]).unwrap();
        let mut g = c.benchmark_group("cp frame, quantized layer products, 1 thread");
        g.sample_size(20);
        for ty in [OutType::Q4K, OutType::Q8_0] {
            let f = GgufFile::open(qtts::model::ModelFiles::converted_in(&dir, ty).mmproj).unwrap();
            let mut cp = CodePredictor::load(&f).unwrap();
            for kernel in [LayerKernel::Ggml, LayerKernel::Packed] {
                cp.set_layer_kernel(kernel).unwrap();
                g.bench_function(format!("{} weights, {kernel:?}", ty.name()), |b| {
                    b.iter(|| {
                        cp.frame(
                            &pool,
                            &hidden,
                            100,
                            &mut |_, l| qtts::sampling::argmax(l),
                            None,
                        )
                        .unwrap()
                    })
                });
            }
        }
        g.finish();
    } else {
        eprintln!(
            "quantized layer products: kernel tier {} has no packed kernels, group skipped",
            qtts::kernels::active()
        );
    }
    // The heads alone: 15 heads of 2048 × 1024 on one hidden state.
    let w: Vec<f32> = (0..15 * 2048 * 1024)
        .map(|i| ((i * 31 % 977) as f32 / 488.0) - 1.0)
        .collect();
    let f32_heads = Heads::new(w, 2048, 1024, Kernel::Scalar);
    let q8_heads = f32_heads.to_q8().unwrap();
    let mut out = vec![0f32; 2048];
    let mut g = c.benchmark_group("15 sample heads (2048 x 1024)");
    for (label, heads) in [("f32", &f32_heads), ("q8_0", &q8_heads)] {
        let mut heads = heads.clone();
        for kernel in [Kernel::Scalar, simd] {
            heads.set_kernel(kernel);
            g.bench_function(format!("{label} {kernel:?}"), |b| {
                b.iter(|| {
                    for group in 0..15 {
                        heads.logits(group, &hidden, &mut out);
                    }
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
