//! Time to first audio and real-time factor of the pipelined engine against the same stages run
//! serially on one thread, on the full-size random-weight 0.6B CustomVoice model (random weights
//! never emit EOS, so every run is capped at `QTTS_BENCH_FRAMES` frames, 24 by default).
//!
//! Runs interleave (pipelined, serial) `QTTS_BENCH_RUNS` times (3) after one warm-up each; the
//! medians and their ratio are printed, then the pipelined run's per-stage percentile table.
//! Weights: `QTTS_BENCH_TYPE` (q4_k, q8_0, f16, f32; default q4_k), from `QTTS_BENCH_MODELS` or
//! made once under the target directory. `QTTS_BENCH_DECODER` (f32, f16, int8, bf16, q8_0; default: the
//! engine's, bf16 where the CPU has AMX) picks the decoder's matrices. `QTTS_BENCH_PLAN` changes
//! the default plan: `shared` gives the decoder 2 threads over both cores (the talker and the code
//! predictor keep core 0), `code-predictor-shared` gives them to the code predictor (the decoder keeps core 1,
//! time-shared), `talker-code-predictor-shared` to both the talker and the code predictor.
//! `QTTS_BENCH_DECODER_NICE` sets the decoder's `qtts::engine::StagePlan::nice` (20: `SCHED_IDLE`).
//! `qtts bench --plan` compares plans interleaved, in separate processes.
//! `QTTS_BENCH_BURST=0` turns off the all-core first frame.
//!
//! Run: `cargo bench --bench pipeline`

#[path = "common/mod.rs"]
mod common;

use std::time::Duration;

use qtts::audio::MemorySink;
use qtts::engine::serial::Serial;
use qtts::engine::{DecoderWeights, Engine, EngineConfig, Request, Summary, ThreadPlan};
use qtts::model::convert::OutType;
use qtts::model::ModelFiles;

fn env<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let ty = match std::env::var("QTTS_BENCH_TYPE").as_deref() {
        Ok("q8_0") => OutType::Q8_0,
        Ok("f16") => OutType::F16,
        Ok("f32") => OutType::F32,
        _ => OutType::Q4K,
    };
    let frames: usize = env("QTTS_BENCH_FRAMES", 24);
    let runs: usize = env("QTTS_BENCH_RUNS", 3);
    let dir = common::models(&[ty]);
    let files = ModelFiles::converted_in(&dir, ty);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut config = EngineConfig {
        decoder: match std::env::var("QTTS_BENCH_DECODER").as_deref() {
            Ok("f32") => DecoderWeights::F32,
            Ok("f16") => DecoderWeights::F16,
            Ok("int8") => DecoderWeights::Int8,
            Ok("bf16") => DecoderWeights::Bf16,
            Ok("q8_0") => DecoderWeights::Q8_0,
            _ => DecoderWeights::fastest(),
        },
        burst: env("QTTS_BENCH_BURST", 1u8) == 1,
        ..EngineConfig::default()
    };
    let all = qtts::engine::StagePlan {
        cores: (0..cores).collect(),
        threads: cores,
        nice: 0,
        borrow: Vec::new(),
    };
    match std::env::var("QTTS_BENCH_PLAN").as_deref() {
        Ok("shared") if cores >= 2 => config.plan.decoder = all,
        Ok("code-predictor-shared") if cores >= 2 => config.plan.code_predictor = all,
        Ok("talker-code-predictor-shared") if cores >= 2 => {
            config.plan.talker = all.clone();
            config.plan.code_predictor = all;
        }
        _ => {}
    }
    config.plan.decoder.nice = env("QTTS_BENCH_DECODER_NICE", config.plan.decoder.nice);
    println!(
        "pipeline bench: 0.6B CustomVoice random weights, {}, decoder {}, burst {}, {frames} frames, {cores} cores, plan {:?}",
        ty.name(),
        config.decoder.name(),
        config.burst,
        config.plan
    );
    let mut engine = Engine::load(&files, config.clone()).unwrap();
    let serial_cfg = EngineConfig {
        plan: ThreadPlan::for_cores(cores),
        ..config
    };
    let mut serial = Serial::load(&files, serial_cfg, cores).unwrap();
    let mut req = Request::text("The quick brown fox jumps over the lazy dog, twice.");
    req.voice.speaker = Some("vivian".into());
    req.voice.language = Some("english".into());
    req.max_frames = Some(frames);
    req.min_frames = frames;
    req.seed = 1;

    let pipelined = |engine: &mut Engine| -> Summary {
        let (s, _) = engine
            .synthesize(req.clone(), Box::new(MemorySink::default()))
            .wait();
        s.unwrap()
    };
    let serial_run =
        |serial: &mut Serial| -> Summary { serial.run(&req, &mut MemorySink::default()).unwrap() };
    pipelined(&mut engine);
    serial_run(&mut serial);
    let (mut p_rtf, mut p_ttfa, mut s_rtf, mut s_ttfa) = (vec![], vec![], vec![], vec![]);
    let mut last = None;
    for i in 0..runs {
        let p = pipelined(&mut engine);
        let s = serial_run(&mut serial);
        let ms = |d: Option<Duration>| d.unwrap_or_default().as_secs_f64() * 1e3;
        println!(
            "run {i}: pipelined RTF {:.3} TTFA {:.0} ms | serial RTF {:.3} TTFA {:.0} ms",
            p.rtf(),
            ms(p.ttfa),
            s.rtf(),
            ms(s.ttfa)
        );
        p_rtf.push(p.rtf());
        p_ttfa.push(ms(p.ttfa));
        s_rtf.push(s.rtf());
        s_ttfa.push(ms(s.ttfa));
        last = Some((p, s));
    }
    let (pr, pt, sr, st) = (
        common::median(p_rtf),
        common::median(p_ttfa),
        common::median(s_rtf),
        common::median(s_ttfa),
    );
    println!("\nmedian of {runs}:        RTF      TTFA ms");
    println!("pipelined          {pr:>7.3}  {pt:>8.0}");
    println!("serial (1 thread)  {sr:>7.3}  {st:>8.0}");
    println!(
        "serial / pipelined {:>7.2}x {:>7.2}x",
        sr / pr.max(1e-9),
        st / pt.max(1e-9)
    );
    if let Some((p, s)) = last {
        println!("\npipelined, last run:\n{}", p.metrics.table());
        println!("serial, last run:\n{}", s.metrics.table());
    }
}
