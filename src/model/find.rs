//! Finding a model to speak with: a named path, the `models/` directory, or the built-in default.
//!
//! A model is a directory holding a converted pair `talker-<type>.gguf` + `mmproj-<type>.gguf`
//! (what `qtts convert` writes), a talker file whose mmproj sits beside it, or an official Hugging
//! Face checkpoint directory, which is converted once into the cache ([`super::cache`], keyed by
//! the checkpoint's identity).
//! When nothing is named and `models/` holds nothing usable, the built-in default is a tiny
//! random-weight CustomVoice model made on the spot (a second, cached): it runs every stage of
//! the engine, but its audio is noise, and callers must say so.

use std::path::{Path, PathBuf};

use crate::error::ModelError;
use crate::gguf::{GgufFile, Value};
use crate::model::config::{ModelType, TtsConfig};
use crate::model::convert::{OutType, KEY_HF_CONFIG};
use crate::model::ModelFiles;

/// A usable model and what it is.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundModel {
    /// The GGUF pair.
    pub files: ModelFiles,
    /// `custom_voice 0b6 q8_0`, ...
    pub description: String,
    /// Whether this is the built-in random-weight model (noise, not speech).
    pub builtin: bool,
}

/// The storage types in order of preference: q8_0 is near-lossless and fast; q6_k and q5_k faster
/// and within cosine 0.99 of f32 (PERFORMANCE.md); q4_k fastest and coarser; f16 and f32 slower.
const TYPES: [&str; 6] = ["q8_0", "q6_k", "q5_k", "q4_k", "f16", "f32"];

/// The GGUF pair in `dir`, the preferred type first.
pub fn pair_in(dir: &Path) -> Option<ModelFiles> {
    TYPES.iter().find_map(|ty| pair_of_type(dir, ty))
}

/// The checkpoint config carried by a talker GGUF, if it has one.
fn talker_config(talker: &Path) -> Option<TtsConfig> {
    let f = GgufFile::open(talker).ok()?;
    let text = f.header.get(KEY_HF_CONFIG).and_then(Value::as_str)?;
    serde_json::from_str(text).ok()
}

fn describe(files: &ModelFiles) -> (String, (u8, u8, usize)) {
    let ty = type_of(&files.talker).to_owned();
    let ty_rank = TYPES.iter().position(|t| *t == ty).unwrap_or(TYPES.len());
    match talker_config(&files.talker) {
        Some(c) => {
            let kind = match c.tts_model_type {
                ModelType::CustomVoice => 0,
                ModelType::VoiceDesign => 1,
                ModelType::Base => 2,
            };
            let size = u8::from(c.tts_model_size != "0b6");
            (
                format!("{} {} {ty}", c.tts_model_type.as_str(), c.tts_model_size),
                (kind, size, ty_rank),
            )
        }
        None => (format!("unknown model {ty}"), (3, 1, ty_rank)),
    }
}

/// `files` as a found model, described by what its talker file carries.
pub fn model_of(files: ModelFiles) -> FoundModel {
    let (description, _) = describe(&files);
    FoundModel {
        files,
        description,
        builtin: false,
    }
}

/// The usable models under `dir` (each subdirectory holding a pair), best first: CustomVoice
/// (named speakers, speaks without a reference) before VoiceDesign before Base, 0.6B before 1.7B
/// (real time on small CPUs), then by type: q8_0, q6_k, q5_k, q4_k, f16, f32.
pub fn scan(dir: &Path) -> Vec<FoundModel> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(FoundModel, (u8, u8, usize))> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| pair_in(&e.path()))
        .map(|files| {
            let (description, rank) = describe(&files);
            (
                FoundModel {
                    files,
                    description,
                    builtin: false,
                },
                rank,
            )
        })
        .collect();
    found.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.files.talker.cmp(&b.0.files.talker)));
    found.into_iter().map(|(m, _)| m).collect()
}

/// The cache directory (`$XDG_CACHE_HOME/qtts`, else `$HOME/.cache/qtts`, else the temp dir).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("qtts")
}

/// The GGUF pair of type `ty` in `dir` (`talker-<ty>.gguf` and `mmproj-<ty>.gguf`).
pub fn pair_of_type(dir: &Path, ty: &str) -> Option<ModelFiles> {
    let talker = dir.join(format!("talker-{ty}.gguf"));
    let mmproj = dir.join(format!("mmproj-{ty}.gguf"));
    (talker.is_file() && mmproj.is_file()).then_some(ModelFiles { talker, mmproj })
}

/// The storage type of a talker file by its name (`talker-<type>.gguf`).
fn type_of(talker: &Path) -> &str {
    talker
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.strip_prefix("talker-"))
        .unwrap_or("?")
}

/// The name that asks for the built-in test model ([`builtin`]) wherever a model path goes (a
/// folder of that name is `./builtin`).
pub const BUILTIN: &str = "builtin";

/// The model a library caller asked for: a path as [`resolve`] takes it, or [`BUILTIN`]. The C
/// ABI and the Python package go through here: without a model they fail with what to do rather
/// than speak the built-in model's noise, and they never look in the working directory.
pub fn named(model: Option<&Path>, cache: &Path) -> Result<FoundModel, ModelError> {
    match model {
        Some(p) => resolve(p, cache, false, &mut |_| {}, &mut |_, _| {}),
        None => Err(ModelError::Unsupported {
            what: "model".into(),
            expected: "a model: a directory with talker-<type>.gguf and mmproj-<type>.gguf, a \
                       talker GGUF, a Hugging Face checkpoint directory (converted once), or \
                       `builtin` for the tiny random-weight test model (noise, not speech)"
                .into(),
            found: "none given".into(),
        }),
    }
}

/// Resolves `path` ([`BUILTIN`]: the built-in model): a directory with a GGUF pair, a talker GGUF with its mmproj beside it, or a
/// Hugging Face checkpoint directory, converted once into the cache under `cache`
/// ([`super::cache::converted`]; q8_0, or f32 when `exact`). With `exact`, only f32 files will
/// do: a pair of another type is refused (a quantized model cannot be exact), never used
/// silently. `notice` gets the cache's lines for the user; `progress` a conversion's bytes done
/// and total.
pub fn resolve(
    path: &Path,
    cache: &Path,
    exact: bool,
    notice: &mut dyn FnMut(&str),
    progress: &mut dyn FnMut(u64, u64),
) -> Result<FoundModel, ModelError> {
    if path == Path::new(BUILTIN) {
        return builtin(cache);
    }
    let found = model_of;
    let not_exact = |files: &ModelFiles| ModelError::Unsupported {
        what: format!("--exact with {}", files.talker.display()),
        expected: "f32 files (talker-f32.gguf and mmproj-f32.gguf: `qtts convert --type f32`), \
                   or the checkpoint directory itself (converted to f32 once)"
            .into(),
        found: format!("{} files", type_of(&files.talker)),
    };
    if path.is_file() {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let mmproj = name
            .strip_prefix("talker-")
            .map(|rest| path.with_file_name(format!("mmproj-{rest}")));
        return match mmproj {
            Some(m) if m.is_file() => {
                let files = ModelFiles {
                    talker: path.to_path_buf(),
                    mmproj: m,
                };
                if exact && type_of(&files.talker) != "f32" {
                    return Err(not_exact(&files));
                }
                Ok(found(files))
            }
            _ => Err(ModelError::Unsupported {
                what: format!("model file {}", path.display()),
                expected:
                    "a talker-<type>.gguf with its mmproj-<type>.gguf beside it, or their directory"
                        .into(),
                found: name.to_owned(),
            }),
        };
    }
    if exact {
        if let Some(files) = pair_of_type(path, "f32") {
            return Ok(found(files));
        }
    }
    if let Some(files) = pair_in(path) {
        if exact {
            return Err(not_exact(&files));
        }
        return Ok(found(files));
    }
    if path.join("config.json").is_file() && path.join("model.safetensors").is_file() {
        let ty = if exact { OutType::F32 } else { OutType::Q8_0 };
        let c = super::cache::converted(path, cache, ty, notice, progress)?;
        return Ok(found(ModelFiles {
            talker: c.talker,
            mmproj: c.mmproj,
        }));
    }
    Err(ModelError::Unsupported {
        what: format!("model path {}", path.display()),
        expected: "a directory with talker-<type>.gguf and mmproj-<type>.gguf, a talker GGUF, or a Hugging Face checkpoint directory (config.json, model.safetensors)".into(),
        found: if path.exists() { "neither".into() } else { "nothing at that path".into() },
    })
}

/// The model to use when none is named: the best under `models` ([`scan`]), else the built-in
/// model ([`builtin`], made under `cache`; its [`FoundModel::builtin`] says it speaks noise).
pub fn default_model(models: &Path, cache: &Path) -> Result<FoundModel, ModelError> {
    match scan(models).into_iter().next() {
        Some(m) => Ok(m),
        None => builtin(cache),
    }
}

/// The built-in default model: tiny random-weight CustomVoice (seed 1), made under `cache` on
/// first use (about a second) and reused.
pub fn builtin(cache: &Path) -> Result<FoundModel, ModelError> {
    let dir = cache.join("builtin-tiny-v1");
    let files = match pair_in(&dir) {
        Some(f) => f,
        None => {
            let work = cache.join(format!("builtin-tiny-v1.partial-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&work);
            let tok = work.join("tokenizer");
            crate::model::testing::write_tiny_tokenizer(&tok)?;
            let cfg = crate::model::testing::tiny_config(
                crate::model::config::Preset::Small06CustomVoice,
                true,
            );
            let ckpt = work.join("checkpoint");
            crate::model::random::write_random_checkpoint_with(
                &cfg,
                1,
                &tok,
                &ckpt,
                &mut |_, _| {},
            )?;
            let out = work.join("gguf");
            crate::model::convert::convert(&ckpt, None, &out, OutType::F32, &mut |_, _| {})?;
            // Publish atomically: a concurrent maker loses the rename and uses the winner's.
            match std::fs::rename(&out, &dir) {
                Ok(()) => {}
                Err(_) if pair_in(&dir).is_some() => {}
                Err(e) => return Err(ModelError::io(&dir, "rename", e)),
            }
            let _ = std::fs::remove_dir_all(&work);
            pair_in(&dir).ok_or_else(|| ModelError::MissingTensor {
                path: dir.clone(),
                tensor: "talker-f32.gguf".into(),
            })?
        }
    };
    Ok(FoundModel {
        files,
        description: "built-in tiny random-weight CustomVoice model (noise, not speech)".into(),
        builtin: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair is found for every type `qtts convert` writes, q8_0 first when several are there;
    /// half a pair is not a pair.
    #[test]
    fn pairs_of_every_converted_type_are_found_preferred_type_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let touch = |name: &str| std::fs::write(dir.join(name), b"").unwrap();
        let talker = |ty: &str| dir.join(format!("talker-{ty}.gguf"));
        touch("talker-q8_0.gguf");
        assert!(pair_in(dir).is_none(), "a talker alone");
        std::fs::remove_file(talker("q8_0")).unwrap();
        // From the least preferred type to the most: each new pair is the one found.
        for ty in ["f32", "f16", "q4_k", "q5_k", "q6_k", "q8_0"] {
            touch(&format!("talker-{ty}.gguf"));
            touch(&format!("mmproj-{ty}.gguf"));
            let found = pair_in(dir).unwrap();
            assert_eq!(found.talker, talker(ty), "{ty}");
            assert_eq!(found.mmproj, dir.join(format!("mmproj-{ty}.gguf")), "{ty}");
        }
    }
}
