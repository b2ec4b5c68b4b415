//! Seeded random checkpoints of the real geometry (`qtts random-model`).
//!
//! The real weights cannot be downloaded on the machines this project is built on, and the cost of
//! inference does not depend on weight values, so benches and demos run on these.
//! The initialisation follows the scheme of the oracle (`oracle_init` of the development tools
//! that made `tests/fixtures`, not shipped):
//! fan-in scaled normals, so that every activation stays O(1) and no branch is numerically
//! invisible; the decoder's residual branches are damped by 0.3 as there.
//! Values are not those of the oracle (a different generator): these files are for speed, the
//! oracle's fixtures are for correctness.
//!
//! Output is bf16 like the released `model.safetensors`; each tensor is generated when the writer
//! asks for its bytes, in chunks seeded by (seed, tensor index, chunk index), on all cores, so the
//! result does not depend on the thread count and memory stays near one tensor.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Dtype, View};

use super::checkpoint::{expected_tensors, CheckpointFile, Init, Spec};
use super::config::{CheckpointConfig, Preset};
use super::convert::{convert, OutType};
use super::ModelFiles;
use crate::error::ModelError;

const CHUNK: usize = 1 << 20;

struct Lazy<'a> {
    spec: &'a Spec,
    shape: Vec<usize>,
    seed: u64,
    index: u64,
}

struct Gen(ChaCha8Rng);

impl Gen {
    fn uniform(&mut self) -> f32 {
        self.0.random::<f32>()
    }

    fn normal(&mut self) -> f32 {
        // Box-Muller; u1 in (0, 1] so ln is finite.
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }
}

fn fill(spec: &Spec, seed: u64, index: u64, chunk: usize, out: &mut [u8]) {
    let stream = (index << 32) ^ chunk as u64;
    let mut g = Gen(ChaCha8Rng::seed_from_u64(
        seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15),
    ));
    let damp = if spec.name.contains(".conv2.conv.") {
        0.3
    } else {
        1.0
    };
    for b in out.chunks_exact_mut(2) {
        let x = match spec.init {
            Init::FanIn(fan) => g.normal() / (fan as f32).sqrt(),
            Init::Bias => 0.1 * g.normal(),
            Init::Normal => g.normal(),
            Init::Norm => 1.0 + 0.1 * g.normal(),
            Init::Snake => 0.2 * g.normal(),
            Init::Usage => 0.5 + 1.5 * g.uniform(),
            Init::Scale => 0.5 + 0.5 * g.uniform(),
        } * damp;
        b.copy_from_slice(&half::bf16::from_f32(x).to_le_bytes());
    }
}

impl View for Lazy<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::BF16
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let mut out = vec![0u8; self.data_len()];
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let chunks: Vec<(usize, &mut [u8])> = out.chunks_mut(CHUNK * 2).enumerate().collect();
        let per = chunks.len().div_ceil(threads).max(1);
        let mut groups: Vec<Vec<(usize, &mut [u8])>> = Vec::new();
        let mut it = chunks.into_iter().peekable();
        while it.peek().is_some() {
            groups.push(it.by_ref().take(per).collect());
        }
        std::thread::scope(|s| {
            for group in groups {
                s.spawn(move || {
                    for (i, c) in group {
                        fill(self.spec, self.seed, self.index, i, c);
                    }
                });
            }
        });
        Cow::Owned(out)
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * 2
    }
}

/// Writes a random checkpoint of `preset` into `out` (created), with the tokenizer files
/// (`vocab.json`, `merges.txt`, `tokenizer_config.json`) copied from `tokenizer_dir`.
///
/// `progress` is called with (bytes written so far, total bytes).
pub fn write_random_checkpoint(
    preset: Preset,
    seed: u64,
    tokenizer_dir: &Path,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), ModelError> {
    write_random_checkpoint_with(&preset.config(), seed, tokenizer_dir, out, progress)
}

/// [`write_random_checkpoint`] for any consistent configs (test models of other geometries).
pub fn write_random_checkpoint_with(
    cfg: &CheckpointConfig,
    seed: u64,
    tokenizer_dir: &Path,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), ModelError> {
    cfg.check(out)?;
    for f in ["vocab.json", "merges.txt", "tokenizer_config.json"] {
        let src = tokenizer_dir.join(f);
        if !src.is_file() {
            return Err(ModelError::io(
                &src,
                "open",
                std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer file missing"),
            ));
        }
    }
    std::fs::create_dir_all(out).map_err(|e| ModelError::io(out, "create_dir", e))?;
    cfg.write(out)?;
    for f in ["vocab.json", "merges.txt", "tokenizer_config.json"] {
        let (src, dst) = (tokenizer_dir.join(f), out.join(f));
        std::fs::copy(&src, &dst).map_err(|e| ModelError::io(&dst, "copy", e))?;
    }
    let specs = expected_tensors(cfg);
    let total: u64 = specs
        .iter()
        .map(|s| s.shape.iter().product::<u64>() * 2)
        .sum();
    let mut done = 0u64;
    for file in [CheckpointFile::Talker, CheckpointFile::SpeechTokenizer] {
        let views: Vec<(String, Lazy<'_>)> = specs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.file == file)
            .map(|(i, s)| {
                (
                    s.name.clone(),
                    Lazy {
                        spec: s,
                        shape: s.shape.iter().map(|&d| d as usize).collect(),
                        seed,
                        index: i as u64,
                    },
                )
            })
            .collect();
        let bytes: u64 = views.iter().map(|(_, v)| v.data_len() as u64).sum();
        let path = out.join(file.rel_path());
        let mut tmp = path.clone().into_os_string();
        tmp.push(".partial");
        let tmp = std::path::PathBuf::from(tmp);
        let meta = Some(std::collections::HashMap::from([(
            "format".to_string(),
            "pt".to_string(),
        )]));
        safetensors::serialize_to_file(views, meta, &tmp).map_err(|e| ModelError::Parse {
            path: tmp.clone(),
            message: e.to_string(),
        })?;
        std::fs::rename(&tmp, &path).map_err(|e| ModelError::io(&path, "rename", e))?;
        done += bytes;
        progress(done, total);
    }
    Ok(())
}

/// Makes what is missing of a bench directory: `checkpoint/`, a random-weight checkpoint of
/// `preset` (seed 1, with the tokenizer files of `tokenizer`), and its GGUF pair for each of
/// `types`. Minutes and gigabytes for a full-size preset; nothing when all is there. `progress`
/// gets each step's name with (0, 0) as it starts, then its bytes done and total.
pub fn ensure_models(
    preset: Preset,
    tokenizer: Option<&Path>,
    dir: &Path,
    types: &[OutType],
    progress: &mut dyn FnMut(&str, u64, u64),
) -> Result<PathBuf, ModelError> {
    let ckpt = dir.join("checkpoint");
    let missing: Vec<OutType> = types
        .iter()
        .copied()
        .filter(|&ty| {
            let f = ModelFiles::converted_in(dir, ty);
            !(f.talker.exists() && f.mmproj.exists())
        })
        .collect();
    if !missing.is_empty() && !ckpt.join("model.safetensors").exists() {
        let tokenizer = tokenizer.ok_or_else(|| ModelError::Unsupported {
            what: format!("bench models in {}", dir.display()),
            expected: format!(
                "a {} checkpoint in checkpoint/, or a tokenizer directory (vocab.json, merges.txt, \
                 tokenizer_config.json) to write a random one with: pass --tokenizer",
                preset.hf_name()
            ),
            found: "neither".into(),
        })?;
        progress("random checkpoint", 0, 0);
        write_random_checkpoint(preset, 1, tokenizer, &ckpt, &mut |d, t| {
            progress("random checkpoint", d, t)
        })?;
    }
    for ty in missing {
        let label = format!("convert to {}", ty.name());
        progress(&label, 0, 0);
        convert(&ckpt, None, dir, ty, &mut |d, t| progress(&label, d, t))?;
    }
    Ok(ckpt)
}
