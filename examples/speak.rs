//! The live speaker demo: speaks a sentence through the default audio device as it is generated,
//! then prints each stage's latency percentiles and the playback underruns.
//!
//! Demonstrates: loading the engine with the default thread plan, the lock-free ring between the
//! decoder thread and the cpal callback, a start-up buffer, and the per-stage histograms.
//!
//! Run: `cargo run --release --example speak -- "Hello from qtts."`
//! It uses the best model under `models/` (see `models/README.md`), else the built-in tiny random
//! model, whose audio is noise. Without a sound card it says so; `qtts synth --out` writes a file.

use anyhow::Context;
use qtts::audio::{cpal_out::CpalOutput, ring};
use qtts::engine::{Engine, EngineConfig, Request};
use qtts::model::find;

fn main() -> anyhow::Result<()> {
    let text = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "Hello from qtts, speaking as soon as the first frame exists.".into());
    let model = match find::scan("models".as_ref()).into_iter().next() {
        Some(m) => m,
        None => find::builtin(&find::cache_dir())?,
    };
    println!("model: {}", model.description);
    let mut engine = Engine::load(&model.files, EngineConfig::default())?;

    // 2 s of ring; playback starts once 300 ms are queued.
    let (sink, player) = ring(2000.0, 300.0);
    let out = CpalOutput::open(player).context("opening the audio device")?;
    println!("playing on {}", out.description);

    let mut req = Request::text(text);
    if engine.info().model_type == "custom_voice" {
        req.voice.speaker = engine.info().speakers.first().cloned();
    }
    let (summary, _sink) = engine.synthesize(req, Box::new(sink)).wait();
    let summary = summary?;
    println!(
        "{} frames ({:.2} s), first audio after {:?}, RTF {:.2}, {} underruns",
        summary.frames,
        summary.audio_seconds(),
        summary.ttfa.unwrap_or_default(),
        summary.rtf(),
        out.shared().underruns()
    );
    print!("{}", summary.metrics.table());
    Ok(())
}
