//! `qtts voice add|list|rm`, and the cloned voice of `speak`/`synth` (`--voice`, `--ref-audio`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use qtts::model::ModelFiles;
use qtts::talker::Voice;
use qtts::voice::{speaking_voice, ClonedVoice, Cloner, VoiceStore};

/// `qtts voice` actions.
#[derive(clap::Subcommand, Debug)]
pub enum VoiceAction {
    /// Make a voice from a reference recording (WAV, FLAC, MP3 or Ogg/Vorbis, 1 to 30 s; 3 to
    /// 10 s of clear speech is best) with a Base model, and save it as NAME.
    Add {
        /// The voice's name (letters, digits, '-', '_', '.').
        name: String,
        /// The reference recording.
        #[arg(long)]
        audio: PathBuf,
        /// What the recording says: the voice then speaks in context (the official default,
        /// closest likeness). Without it, the voice keeps only the speaker's x-vector.
        #[arg(long)]
        text: Option<String>,
        /// A Base model (as `speak --model`); default: the best model under models/.
        #[arg(long)]
        model: Option<PathBuf>,
        /// Where voices are saved (default: $QTTS_VOICES, else ~/.local/share/qtts/voices).
        #[arg(long)]
        voices: Option<PathBuf>,
    },
    /// List the saved voices.
    List {
        /// Where voices are saved.
        #[arg(long)]
        voices: Option<PathBuf>,
    },
    /// Remove a saved voice.
    Rm {
        /// The voice's name.
        name: String,
        /// Where voices are saved.
        #[arg(long)]
        voices: Option<PathBuf>,
    },
}

fn store(dir: Option<&Path>) -> VoiceStore {
    VoiceStore::new(dir.map_or_else(VoiceStore::default_dir, Path::to_path_buf))
}

fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Decodes, resamples and encodes a reference, saying how long it took.
fn clone_from(files: &ModelFiles, audio: &Path, text: Option<&str>) -> anyhow::Result<ClonedVoice> {
    let t = Instant::now();
    let wav = qtts::voice::audio_in::load_reference(audio)
        .with_context(|| format!("reference {}", audio.display()))?;
    let loaded = t.elapsed();
    let mut cloner = Cloner::load(files, threads()).context("loading the voice encoders")?;
    let t = Instant::now();
    let v = cloner.clone_voice(&wav, text)?;
    eprintln!(
        "qtts: reference {:.1} s decoded in {:.2} s, encoded in {:.2} s ({})",
        wav.len() as f64 / 24000.0,
        loaded.as_secs_f64(),
        t.elapsed().as_secs_f64(),
        if v.in_context() {
            format!("x-vector and {} frames, in context", v.codes.len())
        } else {
            "x-vector only".into()
        }
    );
    Ok(v)
}

/// Runs `qtts voice ...`.
pub fn run(action: &VoiceAction) -> anyhow::Result<()> {
    match action {
        VoiceAction::Add {
            name,
            audio,
            text,
            model,
            voices,
        } => {
            let m = crate::pick_model(model.as_deref(), false)?;
            let v = clone_from(&m.files, audio, text.as_deref())?;
            let path = store(voices.as_deref()).add(name, &v)?;
            eprintln!("qtts: saved voice {name} ({})", path.display());
        }
        VoiceAction::List { voices } => {
            let s = store(voices.as_deref());
            let names = s.names()?;
            if names.is_empty() {
                eprintln!("qtts: no saved voices in {}", s.dir().display());
            }
            for n in names {
                match s.get(&n) {
                    Ok(v) => println!(
                        "{n}\t{} {}\t{:.1} s\t{}",
                        v.model.model_type,
                        v.model.size,
                        v.seconds,
                        v.text
                            .as_deref()
                            .map_or("x-vector only".into(), |t| format!("{t:?}"))
                    ),
                    Err(e) => println!("{n}\tunusable: {e}"),
                }
            }
        }
        VoiceAction::Rm { name, voices } => {
            store(voices.as_deref()).remove(name)?;
            eprintln!("qtts: removed voice {name}");
        }
    }
    Ok(())
}

/// The voice `speak`/`synth` asked for with `--voice` or `--ref-audio`, for the model `files`
/// described by `info`. `--voice NAME` is a speaker of the model, else a saved voice
/// ([`VoiceStore::named`](qtts::voice::VoiceStore::named)), as on every surface.
pub fn requested_voice(
    args: &crate::SpeakArgs,
    files: &ModelFiles,
    info: &qtts::engine::EngineInfo,
) -> anyhow::Result<Option<Voice>> {
    let v = match (&args.voice, &args.ref_audio) {
        (None, None) => {
            anyhow::ensure!(args.ref_text.is_none(), "--ref-text goes with --ref-audio");
            return Ok(None);
        }
        (Some(_), Some(_)) => anyhow::bail!("give --voice or --ref-audio, not both"),
        (Some(name), None) => {
            anyhow::ensure!(
                args.speaker.is_none(),
                "give --voice or --speaker, not both (each names the voice)"
            );
            anyhow::ensure!(args.ref_text.is_none(), "--ref-text goes with --ref-audio");
            let mut voice = store(args.voices.as_deref()).named(
                &info.speakers,
                &files.mmproj,
                name,
                args.language.clone(),
            )?;
            if voice.speaker.is_some() {
                // A speaker of the model: as --speaker.
                anyhow::ensure!(
                    args.xvector.is_none(),
                    "--voice {name} is a speaker of the model: it takes no --xvector"
                );
                voice.instruct = args.instruct.clone();
                return Ok(Some(voice));
            }
            anyhow::ensure!(
                args.xvector.is_none() && args.instruct.is_none(),
                "a saved voice (--voice {name}) takes no --xvector or --instruct"
            );
            return Ok(Some(voice));
        }
        (None, Some(audio)) => clone_from(files, audio, args.ref_text.as_deref())?,
    };
    anyhow::ensure!(
        args.speaker.is_none() && args.xvector.is_none() && args.instruct.is_none(),
        "a cloned voice (--ref-audio) takes no --speaker, --xvector or --instruct"
    );
    let mmproj = qtts::gguf::GgufFile::open(&files.mmproj)?;
    Ok(Some(speaking_voice(&mmproj, &v, args.language.clone())?))
}
