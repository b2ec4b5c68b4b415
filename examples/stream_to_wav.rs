//! Streams a request's audio chunk by chunk through the iterator API and writes it to a WAV file
//! as it arrives, printing when each chunk came.
//!
//! Demonstrates: `Engine::stream` (audio as an iterator of `Vec<f32>` chunks, bounded by a small
//! queue: backpressure, not buffering), writing with `hound`, and the summary at the end.
//!
//! Run: `cargo run --release --example stream_to_wav -- "Some text." out.wav`
//! It uses the best model under `models/`, else the built-in tiny random model (noise).

use std::time::Instant;

use qtts::engine::{Engine, EngineConfig, Request};
use qtts::model::find;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let text = args
        .next()
        .unwrap_or_else(|| "One chunk at a time, written as it arrives.".into());
    let path = args.next().unwrap_or_else(|| "stream.wav".into());
    let model = match find::scan("models".as_ref()).into_iter().next() {
        Some(m) => m,
        None => find::builtin(&find::cache_dir())?,
    };
    let mut engine = Engine::load(&model.files, EngineConfig::default())?;
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: qtts::audio::SAMPLE_RATE,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut wav = hound::WavWriter::create(&path, spec)?;
    let start = Instant::now();
    let mut stream = engine.stream(Request::text(text), 4);
    for (i, chunk) in stream.by_ref().enumerate() {
        println!(
            "chunk {i}: {} ms of audio at {:?}",
            chunk.len() / 24,
            start.elapsed()
        );
        for x in chunk {
            wav.write_sample(x)?;
        }
    }
    let summary = stream.finish()?;
    wav.finalize()?;
    println!(
        "{path}: {} frames, {:.2} s, stop: {:?}",
        summary.frames,
        summary.audio_seconds(),
        summary.stop
    );
    Ok(())
}
