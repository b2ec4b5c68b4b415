//! One talker step (one row at position 100 to 300, after a prefill) on the full-size 0.6B
//! geometry, at q4_K and q8_0 weights: llama.cpp (the baseline) against the crate's own graph of
//! the same layers with ggml's products and with the packed VNNI kernels (where the CPU has
//! AVX-512 VNNI), 1 and 2 threads; and the prefill of the streaming-text prompt.
//!
//! Run with: `cargo bench --bench talker`. The model comes from `QTTS_BENCH_MODELS` (a directory
//! of `talker-<type>.gguf`), else it is made once under the target directory (see
//! `benches/common`).

mod common;

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use qtts::code_predictor::LayerKernel;
use qtts::ffi::Threadpool;
use qtts::model::convert::OutType;
use qtts::sampling::SamplingParams;
use qtts::talker::{GenOptions, Next, Runtime, Session, Talker, TextInput, TextMode, Voice};

const TYPES: [OutType; 2] = [OutType::Q4K, OutType::Q8_0];

fn runtimes() -> Vec<Runtime> {
    let mut v = vec![Runtime::LlamaCpp, Runtime::Graph(LayerKernel::Ggml)];
    if LayerKernel::fastest() == LayerKernel::Packed {
        v.push(Runtime::Graph(LayerKernel::Packed));
    }
    v
}

fn bench(c: &mut Criterion) {
    let dir = common::models(&TYPES);
    let opts = GenOptions {
        sampling: SamplingParams::GREEDY,
        repetition_penalty: 1.0,
        seed: 0,
        max_frames: Some(1000),
        min_frames: 1000,
    };
    let voice = Voice {
        speaker: Some("vivian".into()),
        language: Some("english".into()),
        ..Voice::default()
    };
    for threads in [1, 2] {
        let pool = Threadpool::new(threads, &[]).unwrap();
        let mut g = c.benchmark_group(format!("talker, {threads} thread(s)"));
        g.sample_size(20);
        for ty in TYPES {
            for runtime in runtimes() {
                let path = qtts::model::ModelFiles::converted_in(&dir, ty).talker;
                let talker = Talker::load_with(&path, runtime).unwrap();
                let prompt = talker
                    .prompt(
                        &TextInput::Text("The quick brown fox jumps over the lazy dog.".into()),
                        &voice,
                        TextMode::Streaming,
                    )
                    .unwrap();
                let mut s =
                    Session::new(&talker, 512, threads, Some((&pool, None)), false).unwrap();
                let row = vec![0.01f32; talker.n_embd()];
                // Steps at positions 100..300: restart (untimed) when past them.
                let restart = |s: &mut Session| {
                    s.start(&prompt, &opts).unwrap();
                    while s.frames() < 100 {
                        s.feed(&row).unwrap();
                    }
                };
                restart(&mut s);
                g.bench_function(format!("{} step, {runtime:?}", ty.name()), |b| {
                    b.iter_custom(|iters| {
                        let mut spent = Duration::ZERO;
                        for _ in 0..iters {
                            if s.frames() >= 300 {
                                restart(&mut s);
                            }
                            let t = Instant::now();
                            let next = s.feed(&row).unwrap();
                            spent += t.elapsed();
                            if !matches!(next, Next::Code(_)) {
                                restart(&mut s);
                            }
                        }
                        spent
                    })
                });
                // The whole prefill: a new session each time (none reuses a cached prefix).
                g.bench_function(
                    format!(
                        "{} prefill of {} rows, {runtime:?}",
                        ty.name(),
                        prompt.len()
                    ),
                    |b| {
                        b.iter_custom(|iters| {
                            let mut spent = Duration::ZERO;
                            for _ in 0..iters {
                                let mut s =
                                    Session::new(&talker, 64, threads, Some((&pool, None)), false)
                                        .unwrap();
                                let t = Instant::now();
                                s.start(&prompt, &opts).unwrap();
                                spent += t.elapsed();
                            }
                            spent
                        })
                    },
                );
            }
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
