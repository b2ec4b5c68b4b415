//! The `qtts` command line: speaking and synthesizing, model conversion, random checkpoints and
//! validation.

// The arguments' doc comments are the command's `--help` text, written for a terminal.
#![allow(rustdoc::invalid_html_tags)]

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use qtts::model::config::Preset;
use qtts::model::convert::{convert, OutType};

mod bench;
mod bench_cli;
mod bench_streams;
mod bench_text;
mod cache_cli;
mod input;
mod pull_cli;
mod serve_cli;
mod voice_cli;

/// qtts: a CPU-first streaming text-to-speech engine for Qwen3-TTS-12Hz.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// The kernel tier to run (scalar, avx2, avxvnni, avx512, amx, neon): a lower one than the CPU's best,
    /// to test it or to measure what a CPU without the higher ones gets. Default:
    /// `$QTTS_KERNELS`, else the best this CPU runs.
    #[arg(long, global = true, value_parser = parse_tier)]
    kernels: Option<qtts::kernels::Tier>,
    #[command(subcommand)]
    command: Command,
}

fn parse_tier(s: &str) -> Result<qtts::kernels::Tier, String> {
    qtts::kernels::Tier::parse(s).map_err(|e| e.to_string())
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Fetch a checkpoint from the Hugging Face Hub (`org/name[@revision]`) into its cache and
    /// convert it for the engine; without a name, list the published Qwen3-TTS-12Hz ones.
    Pull(pull_cli::PullArgs),
    /// Saved voices cloned from reference recordings (Base models).
    Voice {
        #[command(subcommand)]
        action: voice_cli::VoiceAction,
    },
    /// Speak text live through the default audio device.
    Speak {
        #[command(flatten)]
        args: SpeakArgs,
        /// Audio queued before playback starts, in ms (against the onset underrun).
        #[arg(long, default_value_t = 300.0)]
        prebuffer_ms: f64,
        /// Capacity of the ring between the decoder and the device, in ms.
        #[arg(long, default_value_t = 2000.0)]
        ring_ms: f64,
        /// Write a WAV file instead of playing (as `synth --out`), e.g. without a sound card.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Synthesize text into a WAV file (24 kHz mono).
    Synth {
        #[command(flatten)]
        args: SpeakArgs,
        /// The WAV file to write; `-`: standard output, written as the audio is made (`| aplay`,
        /// `| ffplay -`), its WAV header's lengths left unknown as on any pipe.
        #[arg(long)]
        out: PathBuf,
        /// Sample format: s16 (16-bit PCM, what every reader opens, Python's `wave` included)
        /// or f32 (32-bit float, the engine's samples exactly).
        #[arg(long, value_enum, default_value = "s16")]
        sample_format: qtts::audio::SampleFormat,
        /// Raw samples without a WAV header (24 kHz mono, little-endian, --sample-format): e.g.
        /// `--out - --raw --sample-format s16 | aplay -f S16_LE -r 24000`.
        #[arg(long)]
        raw: bool,
    },
    /// Convert an official Hugging Face checkpoint directory into the GGUF pair
    /// (talker-<type>.gguf and mmproj-<type>.gguf, llama.cpp's Qwen3-TTS layout).
    Convert {
        /// The checkpoint directory (config.json, model.safetensors, speech_tokenizer/, vocab.json,
        /// ...), or a Hub repository `org/name[@revision]` (fetched once, as `qtts pull`).
        hf_dir: PathBuf,
        /// Where to write the two GGUF files.
        out_dir: PathBuf,
        /// Storage type of the matrices (norms, biases, codebooks stay f32).
        #[arg(long = "type", value_enum, default_value = "q8_0")]
        ty: OutType,
        /// Directory with vocab.json, merges.txt and tokenizer_config.json, when not in the checkpoint.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
    },
    /// Write a checkpoint of a released geometry with seeded random weights (for benches and demos).
    RandomModel {
        /// Which released checkpoint's geometry and configs.
        #[arg(long, value_enum)]
        preset: Preset,
        /// Random seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Directory with the real tokenizer files (vocab.json, merges.txt, tokenizer_config.json),
        /// as found in every downloaded checkpoint.
        #[arg(long)]
        tokenizer: PathBuf,
        /// Output checkpoint directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Measure real-time synthesis (RTF, time to first audio, underruns through a paced sink, peak
    /// RSS, per-stage percentiles) on full-size random-weight models, optionally against the
    /// official PyTorch package, and print one table of medians.
    Bench(bench_cli::BenchArgs),
    /// Serve the OpenAI speech API (HTTP) and Wyoming (Home Assistant) from one engine; prints
    /// `listening http=ADDR wyoming=ADDR` once ready.
    Serve(serve_cli::ServeArgs),
    /// One measured run of `qtts bench`, printed as a JSON line (run by `qtts bench`).
    #[command(hide = true)]
    BenchRun(bench_cli::RunArgs),
    /// Show or remove the checkpoints converted into the cache (`--model <checkpoint>` converts
    /// once, into `$XDG_CACHE_HOME/qtts/converted`, else `~/.cache/qtts/converted`).
    Cache {
        #[command(subcommand)]
        action: cache_cli::CacheAction,
    },
    /// Check GGUF files as the engine does before loading them, and describe them.
    Validate {
        /// GGUF files (talker or mmproj, told apart by their architecture).
        files: Vec<PathBuf>,
        /// After validation, also load each file with llama.cpp's own loaders
        /// (the mmproj with the talker given before it).
        #[arg(long)]
        llama: bool,
    },
}

/// Options shared by `speak` and `synth`.
#[derive(clap::Args, Debug)]
pub(crate) struct SpeakArgs {
    /// The text; `-` reads standard input (pipe a language model in): each sentence is spoken
    /// from its first word while it is being written (a line's end ends a sentence too), with
    /// the audio of the same sentence read whole; at most 150 tokens a sentence. Sentences start
    /// at the pace of the text (`FeedStart::Paced`).
    text: Option<String>,
    /// With `-`: one request per line, each spoken once the line is complete (the line mode).
    #[arg(long)]
    lines: bool,
    /// With `-`: what `-` does without `--lines` (kept for the scripts that ask for it).
    #[arg(long, hide = true, conflicts_with = "lines")]
    live: bool,
    /// A model: a directory with talker-<type>.gguf and mmproj-<type>.gguf, a talker GGUF, an
    /// official Hugging Face checkpoint directory (converted once into the cache), or a Hub
    /// repository such as Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice (fetched once, as `qtts pull`).
    /// Default: the best model under models/, else the built-in test model (noise, not speech).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The token ids of the whole `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n`
    /// string, comma- or space-separated, instead of text.
    #[arg(long)]
    token_ids: Option<String>,
    /// Speaker (CustomVoice models; default: vivian, or the model's first). `--voice` takes a
    /// speaker's name too.
    #[arg(long)]
    speaker: Option<String>,
    /// Language, or auto.
    #[arg(long)]
    language: Option<String>,
    /// Voice instruction (VoiceDesign and 1.7B CustomVoice models).
    #[arg(long)]
    instruct: Option<String>,
    /// Speaker x-vector for Base models: a file of little-endian f32 values (hidden size).
    #[arg(long)]
    xvector: Option<PathBuf>,
    /// A voice by name, as the C ABI, Python and the server take it: a speaker of the model (any
    /// case), else a voice saved with `qtts voice add` (Base models).
    #[arg(long)]
    voice: Option<String>,
    /// Clone the voice of this recording for this run (Base models; WAV, FLAC, MP3, Ogg/Vorbis,
    /// 1 to 30 s); `qtts voice add` saves the work for the next runs.
    #[arg(long)]
    ref_audio: Option<PathBuf>,
    /// What --ref-audio says (in-context cloning); without it, the x-vector alone.
    #[arg(long)]
    ref_text: Option<String>,
    /// Where voices are saved (default: $QTTS_VOICES, else ~/.local/share/qtts/voices).
    #[arg(long)]
    voices: Option<PathBuf>,
    /// How the text enters the prompt.
    #[arg(long, value_enum, default_value = "streaming")]
    text_mode: qtts::talker::TextMode,
    /// Greedy decoding (reproducible without a seed, and what the reference's tests use).
    #[arg(long)]
    greedy: bool,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Codebook-0 sampling temperature (0: greedy); default: the model's.
    #[arg(long)]
    temperature: Option<f32>,
    /// Keep the k most likely codes (0: all); default: the model's.
    #[arg(long)]
    top_k: Option<usize>,
    /// Keep the most likely codes up to this probability, in (0, 1]; default: the model's.
    #[arg(long)]
    top_p: Option<f32>,
    /// Repetition penalty over codebook 0, above 0 (1: none); default: the model's.
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Frame cap per utterance (80 ms each); default: scaled to the text.
    #[arg(long)]
    max_frames: Option<usize>,
    /// Frames each utterance speaks at least (end-of-speech is not sampled before); default: 2.
    #[arg(long)]
    min_frames: Option<usize>,
    /// Write every frame's 16 codes as JSON (`[[c0, .., c15], ...]`).
    #[arg(long)]
    codes_out: Option<PathBuf>,
    /// Write what was spoken as JSON: per utterance (long text is split into several, in order),
    /// its text, text tokens, frames, how it ended and where its text was cut.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Print the per-stage latency table at the end.
    #[arg(long)]
    stats: bool,
    /// Save the latency histograms in HdrHistogram's interval-log format.
    #[arg(long)]
    stats_log: Option<PathBuf>,
    /// Draw the latency distributions as an SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Plan threads for this many cores (default: the machine's).
    #[arg(long)]
    cores: Option<usize>,
    /// f32 KV cache, flash attention off: matches the float32 reference (slower).
    #[arg(long)]
    exact: bool,
    /// The code predictor on every core, the decoder yielding its core under SCHED_IDLE: real time
    /// at q4_k on 2 cores when they are otherwise idle, about as fast as the default (which lends
    /// the decoder's core between frames) when they are not, and other busy programs starve the
    /// decoder (PERFORMANCE.md).
    #[arg(long)]
    code_predictor_on_every_core: bool,
    /// The decoder's matrices: auto (bf16 where the CPU has AMX, else f32), f32 (exact), bf16
    /// (AMX only; about 32 dB from f32) or q8_0 (a quarter of f32's memory, about 19 dB from f32);
    /// see PERFORMANCE.md.
    #[arg(long, value_enum, default_value = "auto")]
    decoder: bench_cli::DecoderArg,
}

/// Finds the model to use and says which; `exact` takes f32 files only (a checkpoint converted to
/// f32), and refuses others.
pub(crate) fn pick_model(
    arg: Option<&std::path::Path>,
    exact: bool,
) -> anyhow::Result<qtts::model::find::FoundModel> {
    use qtts::model::find;
    let cache = find::cache_dir();
    let m = match arg {
        Some(p) => find::resolve(
            &pull_cli::local_or_fetched(p)?,
            &cache,
            exact,
            &mut |line| eprintln!("qtts: {line}"),
            &mut progress_printer("convert"),
        )
        .with_context(|| format!("model {}", p.display()))?,
        None => {
            let models = find::scan(std::path::Path::new("models"));
            let usable = models.iter().find_map(|m| {
                if !exact {
                    return Some(m.clone());
                }
                let dir = m.files.talker.parent()?;
                find::pair_of_type(dir, "f32").map(find::model_of)
            });
            match (usable, models.first()) {
                (Some(m), _) => m,
                (None, Some(m)) => anyhow::bail!(
                    "--exact needs f32 files, and models/ has {} ({}): convert its checkpoint \
                     with --type f32, or pass the checkpoint with --model (converted to f32 once)",
                    m.description,
                    m.files.talker.display()
                ),
                (None, None) => {
                    eprintln!(
                        "qtts: no model under models/ and none given (--model): using the built-in \
                         tiny random-weight model. It runs every stage, but its audio is noise, not \
                         speech. For speech: qtts pull Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice, then \
                         --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice (`qtts pull` lists the others)"
                    );
                    find::builtin(&cache).context("making the built-in model")?
                }
            }
        }
    };
    eprintln!(
        "qtts: model {} ({})",
        m.description,
        m.files.talker.display()
    );
    Ok(m)
}

/// The engine, and the cloned voice when one was asked for.
fn engine_for(
    args: &SpeakArgs,
) -> anyhow::Result<(qtts::engine::Engine, Option<qtts::talker::Voice>)> {
    use qtts::engine::{Engine, EngineConfig, ThreadPlan};
    let model = pick_model(args.model.as_deref(), args.exact)?;
    let config = EngineConfig {
        plan: {
            let n = args.cores.unwrap_or_else(ThreadPlan::available_cores);
            if args.code_predictor_on_every_core {
                ThreadPlan::code_predictor_on_every_core(n)
            } else {
                ThreadPlan::default_for(n)
            }
        },
        exact: args.exact,
        decoder: args.decoder.weights(qtts::kernels::active()),
        ..EngineConfig::default()
    };
    let engine = Engine::load(&model.files, config).context("loading the engine")?;
    let cloned = voice_cli::requested_voice(args, &model.files, engine.info())?;
    Ok((engine, cloned))
}

/// Above this many utterances in a request, `speak` and `synth` print one line for them all
/// (`--report` has each).
const MANY_UTTERANCES: usize = 20;

/// Runs every request into `sink`, with a progress line; returns the merged metrics and the sink.
fn run_all(
    args: &SpeakArgs,
    engine: &mut qtts::engine::Engine,
    cloned: Option<qtts::talker::Voice>,
    mut sink: Box<dyn qtts::audio::AudioSink>,
    label: &str,
) -> anyhow::Result<Box<dyn qtts::audio::AudioSink>> {
    let started = std::time::SystemTime::now();
    let clock = Instant::now();
    let info = engine.info().clone();
    let mut metrics = qtts::metrics::Metrics::default();
    let mut codes: Vec<[u32; 16]> = Vec::new();
    let mut report: Vec<serde_json::Value> = Vec::new();
    let mut totals = (0usize, 0f64);
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    for req in input::requests(args, &info, cloned)? {
        let req = req?;
        // Refused before anything runs, as every surface refuses it.
        info.check(&req)?;
        let mut s = engine.synthesize(req, sink);
        let finished = loop {
            match s.wait_timeout(std::time::Duration::from_millis(100)) {
                Ok(f) => break f,
                Err(running) => {
                    s = running;
                    let f = s.frames();
                    bar.set_message(format!(
                        "{label}: {f} frames, {:.1} s of audio",
                        f as f64 * 0.08
                    ));
                    bar.tick();
                }
            }
        };
        let (summary, back) = finished;
        sink = back;
        // A sentence of standard input with nothing to speak is skipped, as a blank line is.
        if matches!(summary, Err(qtts::engine::EngineError::EmptyText))
            && args.text.as_deref() == Some("-")
            && !args.lines
        {
            continue;
        }
        let summary = summary?;
        for seg in &summary.segments {
            report.push(serde_json::json!({
                "text": seg.text,
                "tokens": seg.tokens,
                "frames": seg.frames,
                "stop": seg.stop.name(),
                "cut": seg.cut.map(|c| format!("{c:?}")),
            }));
        }
        bar.suspend(|| {
            let many = summary.segments.len() > MANY_UTTERANCES;
            if many {
                let capped = summary
                    .segments
                    .iter()
                    .filter(|s| matches!(s.stop, qtts::talker::StopReason::FrameCap { .. }))
                    .count();
                eprintln!(
                    "  {} utterances, {capped} of them stopped at their frame cap (--report \
                     writes each one)",
                    summary.segments.len()
                );
            }
            for (i, seg) in summary.segments.iter().enumerate().filter(|_| !many) {
                if summary.segments.len() > 1 {
                    eprintln!(
                        "  utterance {}: {} tokens, {} frames, {:?}, cut {:?}",
                        i + 1,
                        seg.tokens,
                        seg.frames,
                        seg.stop,
                        seg.cut
                    );
                } else if let qtts::talker::StopReason::FrameCap { frames } = seg.stop {
                    eprintln!("  stopped at the frame cap ({frames} frames), not at end-of-speech");
                }
            }
            eprintln!(
                "{label}: {} frames, {:.2} s of audio, first audio after {} ms, RTF {:.2}, \
                 plays from its first sample without a gap with a {} ms buffer{}",
                summary.frames,
                summary.audio_seconds(),
                summary
                    .ttfa
                    .map(|t| t.as_millis().to_string())
                    .unwrap_or_else(|| "-".into()),
                summary.rtf(),
                summary.playout.gap_free_buffer().as_millis(),
                if summary.non_finite > 0 {
                    format!(", {} non-finite samples zeroed", summary.non_finite)
                } else {
                    String::new()
                }
            );
        });
        totals.0 += summary.frames;
        totals.1 += summary.audio_seconds();
        metrics.merge(&summary.metrics);
        codes.extend_from_slice(&summary.codes);
    }
    bar.finish_and_clear();
    if let Some(p) = &args.codes_out {
        let json = serde_json::to_string(&codes)?;
        std::fs::write(p, json).with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.report {
        let json = serde_json::to_string_pretty(&serde_json::json!({
            "frames": totals.0,
            "audio_s": totals.1,
            "utterances": report,
        }))?;
        std::fs::write(p, json).with_context(|| format!("writing {}", p.display()))?;
    }
    if args.stats {
        eprint!("{}", metrics.table());
    }
    if let Some(p) = &args.stats_log {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        );
        metrics
            .write_interval_log(&mut f, started, clock.elapsed())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &args.plot {
        metrics.plot_svg(p, &format!("qtts stage latencies ({} frames)", totals.0))?;
    }
    Ok(sink)
}

fn synth(
    args: &SpeakArgs,
    out: &std::path::Path,
    format: qtts::audio::SampleFormat,
    raw: bool,
) -> anyhow::Result<()> {
    use qtts::audio::{StreamHeader, StreamSink};
    let (mut engine, cloned) = engine_for(args)?;
    let header = if raw {
        StreamHeader::Raw
    } else {
        StreamHeader::Wav
    };
    if out == std::path::Path::new("-") || raw {
        let (writer, name): (Box<dyn std::io::Write + Send>, String) =
            if out == std::path::Path::new("-") {
                (Box::new(std::io::stdout()), "standard output".into())
            } else {
                let f = std::fs::File::create(out)
                    .with_context(|| format!("creating {}", out.display()))?;
                (Box::new(f), out.display().to_string())
            };
        let sink = StreamSink::new(writer, format, header);
        let sink = run_all(args, &mut engine, cloned, Box::new(sink), "wrote")?;
        let sink: StreamSink = qtts::engine::downcast_sink(sink)
            .context("the output sink did not come back from the engine")?;
        let n = sink.samples();
        sink.finish()?;
        eprintln!("qtts: {name} ({:.2} s)", n as f64 / 24_000.0);
        return Ok(());
    }
    let wav = qtts::audio::WavSink::create(out, format)
        .with_context(|| format!("creating {}", out.display()))?;
    let sink = run_all(args, &mut engine, cloned, Box::new(wav), "wrote")?;
    let wav: qtts::audio::WavSink = qtts::engine::downcast_sink(sink)
        .context("the WAV sink did not come back from the engine")?;
    let n = wav.samples();
    wav.finish()?;
    eprintln!("qtts: {} ({:.2} s)", out.display(), n as f64 / 24_000.0);
    Ok(())
}

fn progress_printer(label: &'static str) -> impl FnMut(u64, u64) {
    let start = Instant::now();
    let mut last = 0u64;
    move |done, total| {
        let pct = (done * 100).checked_div(total).unwrap_or(100);
        if pct >= last + 5 || done == total {
            last = pct;
            eprint!(
                "\r{label}: {pct:3}% ({:.1} of {:.1} GB, {:.0} s)",
                done as f64 / 1e9,
                total as f64 / 1e9,
                start.elapsed().as_secs_f64()
            );
            if done == total {
                eprintln!();
            }
        }
    }
}

/// `qtts speak` through the default audio device.
#[cfg(feature = "playback")]
fn speak(args: &SpeakArgs, prebuffer_ms: f64, ring_ms: f64) -> anyhow::Result<()> {
    let (mut engine, cloned) = engine_for(args)?;
    let (ring, player) = qtts::audio::ring(ring_ms, prebuffer_ms);
    let out = qtts::audio::cpal_out::CpalOutput::open(player)?;
    eprintln!("qtts: playing on {}", out.description);
    let shared = out.shared();
    run_all(args, &mut engine, cloned, Box::new(ring), "spoke")?;
    let underruns = shared.underruns();
    if underruns > 0 {
        let first: Vec<u64> = shared.underrun_periods().into_iter().take(8).collect();
        eprintln!(
            "qtts: {underruns} underruns of {} device periods (first at periods {first:?}); \
             a larger --prebuffer-ms helps when generation is slower than real time",
            shared.periods()
        );
    }
    Ok(())
}

/// `qtts speak` in a build without playback: what to do instead.
#[cfg(not(feature = "playback"))]
fn speak(_: &SpeakArgs, _: f64, _: f64) -> anyhow::Result<()> {
    anyhow::bail!(
        "this qtts was built without playback (`--no-default-features`): write a file with \
         `speak --out file.wav` or `synth`, or rebuild with the default features"
    )
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Fixed before anything loads: a tier the CPU lacks (or a misspelt `QTTS_KERNELS`) is an
    // error here, never a silent fallback.
    match cli.kernels {
        Some(tier) => qtts::kernels::force(tier)?,
        None => {
            qtts::kernels::selected()?;
        }
    }
    match cli.command {
        Command::Speak {
            args,
            out: Some(out),
            ..
        } => synth(&args, &out, qtts::audio::SampleFormat::S16, false)?,
        Command::Speak {
            args,
            prebuffer_ms,
            ring_ms,
            out: None,
        } => speak(&args, prebuffer_ms, ring_ms)?,
        Command::Synth {
            args,
            out,
            sample_format,
            raw,
        } => synth(&args, &out, sample_format, raw)?,
        Command::Cache { action } => cache_cli::run(&action)?,
        Command::Pull(a) => pull_cli::run(&a)?,
        Command::Voice { action } => voice_cli::run(&action)?,
        Command::Convert {
            hf_dir,
            out_dir,
            ty,
            tokenizer,
        } => {
            let start = Instant::now();
            let hf_dir = pull_cli::local_or_fetched(&hf_dir)?;
            let out = convert(
                &hf_dir,
                tokenizer.as_deref(),
                &out_dir,
                ty,
                &mut progress_printer("convert"),
            )
            .with_context(|| format!("converting {}", hf_dir.display()))?;
            println!(
                "wrote {} and {} in {:.1} s",
                out.talker.display(),
                out.mmproj.display(),
                start.elapsed().as_secs_f64()
            );
        }
        Command::RandomModel {
            preset,
            seed,
            tokenizer,
            out,
        } => {
            let start = Instant::now();
            qtts::model::random::write_random_checkpoint(
                preset,
                seed,
                &tokenizer,
                &out,
                &mut progress_printer("random-model"),
            )
            .with_context(|| format!("writing a random {} checkpoint", preset.hf_name()))?;
            println!(
                "wrote a random-weight {} checkpoint (seed {seed}) to {} in {:.1} s",
                preset.hf_name(),
                out.display(),
                start.elapsed().as_secs_f64()
            );
        }
        Command::Serve(a) => serve_cli::run(&a)?,
        Command::Bench(a) => bench_cli::run(&a)?,
        Command::BenchRun(a) => bench_cli::run_one(&a)?,
        Command::Validate { files, llama } => {
            anyhow::ensure!(
                !files.is_empty(),
                "no file given: pass one or more .gguf paths"
            );
            let mut talker: Option<qtts::ffi::LlamaModel> = None;
            for f in files {
                let gguf = qtts::gguf::GgufFile::open(&f)?;
                let arch = gguf
                    .header
                    .get("general.architecture")
                    .and_then(|v| v.as_str())
                    .unwrap_or("");
                match arch {
                    "qwen3tts" => {
                        let g = qtts::model::validate::check_talker(&f, &gguf.header)?;
                        println!("{}: talker ok: {} layers, width {}, {} tokens", f.display(), g.n_layer, g.n_embd, g.n_vocab);
                        if llama {
                            let m = qtts::ffi::LlamaModel::load(&qtts::model::validate::talker(&f)?)?;
                            println!("{}: llama_model_load_from_file ok: {} layers, width {}", f.display(), m.n_layer(), m.n_embd());
                            talker = Some(m);
                        }
                    }
                    "clip" => {
                        qtts::model::validate::check_mmproj(&f, &gguf.header)?;
                        println!("{}: mmproj ok: {} tensors", f.display(), gguf.header.tensors.len());
                        if llama {
                            let t = talker.as_ref().context("--llama loads an mmproj with its talker: name the talker file first")?;
                            let _m = qtts::ffi::Mmproj::load(&qtts::model::validate::mmproj(&f)?, t, 1)?;
                            println!("{}: mtmd_init_from_file ok", f.display());
                        }
                    }
                    other => anyhow::bail!("{}: architecture '{other}' is neither a Qwen3-TTS talker ('qwen3tts') nor an mmproj ('clip')", f.display()),
                }
            }
        }
    }
    Ok(())
}
