//! The `qtts` command line: model conversion, random checkpoints and validation.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use qtts::model::config::Preset;
use qtts::model::convert::{convert, OutType};

/// qtts: a CPU-first streaming text-to-speech engine for Qwen3-TTS-12Hz.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Convert an official Hugging Face checkpoint directory into the GGUF pair
    /// (talker-<type>.gguf and mmproj-<type>.gguf, llama.cpp's Qwen3-TTS layout).
    Convert {
        /// The checkpoint directory (config.json, model.safetensors, speech_tokenizer/, vocab.json, ...).
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

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Convert {
            hf_dir,
            out_dir,
            ty,
            tokenizer,
        } => {
            let start = Instant::now();
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
                            let m = qtts::ffi::LlamaModel::load(&f)?;
                            println!("{}: llama_model_load_from_file ok: {} layers, width {}", f.display(), m.n_layer(), m.n_embd());
                            talker = Some(m);
                        }
                    }
                    "clip" => {
                        qtts::model::validate::check_mmproj(&f, &gguf.header)?;
                        println!("{}: mmproj ok: {} tensors", f.display(), gguf.header.tensors.len());
                        if llama {
                            let t = talker.as_ref().context("--llama loads an mmproj with its talker: name the talker file first")?;
                            let _m = qtts::ffi::Mmproj::load(&f, t, 1)?;
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
