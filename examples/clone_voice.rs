//! Clones a voice from a recording and speaks a sentence with it into a WAV file, then saves the
//! voice so that the next run skips the encoders.
//!
//! Demonstrates: `voice::audio_in::load_reference` (any WAV, FLAC, MP3 or Ogg/Vorbis, mixed to
//! mono and resampled to 24 kHz as the official code does), `voice::Cloner` (the speaker encoder's
//! x-vector and the codec encoder's reference codes), `voice::speaking_voice` and a `VoiceStore`.
//!
//! Run: `cargo run --release --example clone_voice -- MODEL ref.wav "What ref.wav says." \
//!       "Text to speak." out.wav`
//! MODEL is a Base model: a directory with talker-<type>.gguf and mmproj-<type>.gguf, or a
//! talker GGUF (e.g. `qtts convert Qwen3-TTS-12Hz-0.6B-Base models/0.6b-base`).

use std::time::Instant;

use anyhow::Context;
use qtts::engine::{Engine, EngineConfig, Request};
use qtts::gguf::GgufFile;
use qtts::voice::{speaking_voice, Cloner, VoiceStore};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, reference, transcript, text, out] = &args[..] else {
        anyhow::bail!("usage: clone_voice MODEL REF_AUDIO REF_TRANSCRIPT TEXT OUT.wav");
    };
    let found = qtts::model::find::resolve(
        model.as_ref(),
        &qtts::model::find::cache_dir(),
        false,
        &mut |line| eprintln!("{line}"),
        &mut |_, _| {},
    )
    .with_context(|| format!("model {model}"))?;
    let files = found.files;

    // Decode and resample the recording, then run both encoders.
    let t = Instant::now();
    let audio = qtts::voice::audio_in::load_reference(reference.as_ref())?;
    let mut cloner = Cloner::load(&files, 2)?;
    let voice = cloner.clone_voice(&audio, Some(transcript))?;
    println!(
        "cloned {:.1} s of reference in {:?}: {} frames in context",
        audio.len() as f64 / 24000.0,
        t.elapsed(),
        voice.codes.len()
    );

    // Speak with it.
    let mmproj = GgufFile::open(&files.mmproj)?;
    let mut req = Request::text(text.as_str());
    req.voice = speaking_voice(&mmproj, &voice, None)?;
    let mut engine = Engine::load(&files, EngineConfig::default())?;
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: qtts::audio::SAMPLE_RATE,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut wav = hound::WavWriter::create(out, spec)?;
    let mut stream = engine.stream(req, 4);
    for chunk in stream.by_ref() {
        for x in chunk {
            wav.write_sample(x)?;
        }
    }
    let summary = stream.finish()?;
    wav.finalize()?;
    println!(
        "{out}: {:.2} s, first audio after {:?}",
        summary.audio_seconds(),
        summary.ttfa.unwrap_or_default()
    );

    // Save it: `qtts speak --voice example "..."` uses it without the encoders.
    let store = VoiceStore::new(VoiceStore::default_dir());
    let path = store.add("example", &voice)?;
    println!("saved as 'example' in {}", path.display());
    Ok(())
}
