//! Voice cloning's encoders on the full-size 0.6B Base geometry: a 10 s speech-like reference
//! through the speaker encoder (log-mel + ECAPA, ≈ 1 GFLOP/s of audio) and the codec encoder
//! (SEANet + transformer + RVQ, ≈ 5.5 GFLOP/s of audio), on
//! 1 and 2 threads: the 1-thread run is the in-run baseline of the split over threads. The issue's
//! bar is both encoders in 0.8 s on 2 cores.
//!
//! Run with: `cargo bench --bench voice` (the random Base model is made once under the target
//! directory: minutes and GBs of disk; `QTTS_BENCH_BASE_MODELS=<dir with mmproj-f16.gguf>` skips
//! that).

mod common;

use criterion::{criterion_group, criterion_main, Criterion};
use qtts::gguf::GgufFile;
use qtts::model::config::Preset;
use qtts::model::convert::OutType;
use qtts::voice::{CodecEncoder, SpeakerEncoder};

/// The speech-like reference (harmonics of a gliding f0, syllable-rate envelope, noise).
fn reference(seconds: f64) -> Vec<f32> {
    let n = (seconds * 24000.0) as usize;
    let mut phase = 0.0f64;
    (0..n)
        .map(|i| {
            let t = i as f64 / 24000.0;
            let f0 = 165.0 + 55.0 * (std::f64::consts::TAU * 0.3 * t).sin();
            phase += std::f64::consts::TAU * f0 / 24000.0;
            let v: f64 = (1..=12).map(|h| (h as f64 * phase).sin() / h as f64).sum();
            (0.3 * (0.5 + 0.5 * (std::f64::consts::TAU * 4.0 * t).sin().abs()) * v) as f32
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let dir = match std::env::var_os("QTTS_BENCH_BASE_MODELS") {
        Some(d) => d.into(),
        None => common::models_for(Preset::Small06Base, "0.6b-base", &[OutType::F16]),
    };
    let f = GgufFile::open(dir.join("mmproj-f16.gguf")).unwrap();
    let spk = SpeakerEncoder::load(&f).unwrap().unwrap();
    let mut codec = CodecEncoder::load(&f)
        .unwrap()
        .expect("a Base mmproj with the codec encoder");
    let wav = reference(10.0);
    let mut g = c.benchmark_group("voice encoders, 10 s reference");
    g.sample_size(10);
    for threads in [1, 2] {
        g.bench_function(format!("speaker encoder, {threads} threads"), |b| {
            b.iter(|| spk.embed(&wav, threads, None))
        });
        g.bench_function(format!("codec encoder, {threads} threads"), |b| {
            b.iter(|| codec.encode(&wav, threads, None))
        });
        g.bench_function(format!("both, {threads} threads"), |b| {
            b.iter(|| {
                spk.embed(&wav, threads, None);
                codec.encode(&wav, threads, None)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
