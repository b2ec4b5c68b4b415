//! `qtts convert`: an official checkpoint directory to llama.cpp's Qwen3-TTS GGUF pair.
//!
//! Contract: reads `config.json`, `generation_config.json`, `speech_tokenizer/config.json`, the two
//! `model.safetensors` and the tokenizer files (`vocab.json`, `merges.txt`, `tokenizer_config.json`);
//! writes `talker-<type>.gguf` and `mmproj-<type>.gguf`. Every input is checked before the first
//! byte is written; tensors are converted one at a time (the token embedding in chunks of rows), so
//! memory stays near one tensor; each file is written under a `.partial` name and renamed when
//! complete, so an error or an interruption never leaves a file that looks valid.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::checkpoint::Checkpoint;
use super::config::read_json;
use super::layout::{layout, OutTensor, Source};
use crate::error::ModelError;
use crate::ffi;
use crate::gguf::{Array, GgmlType, Plan, Value, Writer};

/// The output types `qtts convert --type` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum OutType {
    /// 32-bit floats: exact.
    F32,
    /// 16-bit floats.
    F16,
    /// 8-bit blocks of 32 (ggml q8_0).
    #[cfg_attr(feature = "clap", value(name = "q8_0"))]
    Q8_0,
    /// 6-bit k-quants (ggml q6_K): the talker's and code predictor's products by ggml.
    #[cfg_attr(feature = "clap", value(name = "q6_k"))]
    Q6K,
    /// 5-bit k-quants (ggml q5_K): the smallest single type that meets cosine 0.99 on random
    /// weights (PERFORMANCE.md).
    #[cfg_attr(feature = "clap", value(name = "q5_k"))]
    Q5K,
    /// 4-bit k-quants (ggml q4_K): the fastest, under cosine 0.99 on random weights.
    #[cfg_attr(feature = "clap", value(name = "q4_k"))]
    Q4K,
}

impl OutType {
    /// The ggml type of matrices.
    pub fn ggml(self) -> GgmlType {
        match self {
            OutType::F32 => GgmlType::F32,
            OutType::F16 => GgmlType::F16,
            OutType::Q8_0 => GgmlType::Q8_0,
            OutType::Q6K => GgmlType::Q6K,
            OutType::Q5K => GgmlType::Q5K,
            OutType::Q4K => GgmlType::Q4K,
        }
    }

    /// llama.cpp's `general.file_type` (`enum llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            OutType::F32 => 0,
            OutType::F16 => 1,
            OutType::Q8_0 => 7,
            OutType::Q6K => 18,
            OutType::Q5K => 17,
            OutType::Q4K => 15,
        }
    }

    /// The name used in file names (`f32`, `q4_k`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OutType::F32 => "f32",
            OutType::F16 => "f16",
            OutType::Q8_0 => "q8_0",
            OutType::Q6K => "q6_k",
            OutType::Q5K => "q5_k",
            OutType::Q4K => "q4_k",
        }
    }
}

/// llama.cpp token types (`enum llama_token_type`).
const TOKEN_NORMAL: i32 = 1;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;
const TOKEN_UNUSED: i32 = 5;

/// Metadata keys where this crate carries the checkpoint's JSON files verbatim, so that every
/// config field travels with the model (llama.cpp ignores them).
pub const KEY_HF_CONFIG: &str = "qtts.hf.config_json";
/// See [`KEY_HF_CONFIG`].
pub const KEY_HF_GENERATION: &str = "qtts.hf.generation_config_json";
/// See [`KEY_HF_CONFIG`].
pub const KEY_HF_SPEECH_TOKENIZER: &str = "qtts.hf.speech_tokenizer_config_json";

#[derive(Deserialize)]
struct AddedToken {
    content: String,
    #[serde(default)]
    special: bool,
}

#[derive(Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    added_tokens_decoder: BTreeMap<String, AddedToken>,
}

/// The talker vocabulary in llama.cpp's layout: text tokens, then one token per codec id.
#[derive(Debug, Clone)]
pub struct Vocab {
    /// Token strings, id order.
    pub tokens: Vec<String>,
    /// llama.cpp token types.
    pub types: Vec<i32>,
    /// BPE merges (`"a b"`).
    pub merges: Vec<String>,
}

/// Reads the tokenizer files of `dir` and lays out the talker vocabulary for `ckpt`.
pub fn read_vocab(dir: &Path, ckpt: &Checkpoint) -> Result<Vocab, ModelError> {
    let t = &ckpt.config.tts.talker_config;
    let n_text = t.text_vocab_size as usize;
    let vocab_path = dir.join("vocab.json");
    let vocab: BTreeMap<String, u32> = read_json(&vocab_path)?;
    let tok_cfg_path = dir.join("tokenizer_config.json");
    let tok_cfg: TokenizerConfig = read_json(&tok_cfg_path)?;
    let mut tokens: Vec<Option<String>> = vec![None; n_text];
    let mut types = vec![TOKEN_UNUSED; n_text];
    let mut put = |path: &Path, field: String, id: usize, s: String, ty: i32| {
        if id >= n_text || tokens[id].is_some() {
            return Err(ModelError::BadField {
                path: path.into(),
                field,
                expected: format!("a unique id below text_vocab_size ({n_text})"),
                found: id.to_string(),
            });
        }
        tokens[id] = Some(s);
        types[id] = ty;
        Ok(())
    };
    for (s, id) in vocab {
        put(&vocab_path, s.clone(), id as usize, s, TOKEN_NORMAL)?;
    }
    for (id, tok) in tok_cfg.added_tokens_decoder {
        let field = format!("added_tokens_decoder.{id}");
        let n: usize = id.parse().map_err(|_| ModelError::BadField {
            path: tok_cfg_path.clone(),
            field: field.clone(),
            expected: "a numeric id".into(),
            found: id.clone(),
        })?;
        let looks_special = tok.content.starts_with("<|") && tok.content.ends_with("|>");
        let ty = if tok.special || looks_special {
            TOKEN_CONTROL
        } else {
            TOKEN_USER_DEFINED
        };
        put(&tok_cfg_path, field, n, tok.content, ty)?;
    }
    let mut tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();
    // Codec tokens: `<|codec_{c}|>`, or the name of the config key that holds c.
    let mut names: BTreeMap<u32, String> = BTreeMap::new();
    for (key, id) in [
        ("codec_pad", t.codec_pad_id),
        ("codec_bos", t.codec_bos_id),
        ("codec_eos_token", t.codec_eos_token_id),
        ("codec_think", t.codec_think_id),
        ("codec_nothink", t.codec_nothink_id),
        ("codec_think_bos", t.codec_think_bos_id),
        ("codec_think_eos", t.codec_think_eos_id),
    ] {
        names.insert(id, format!("<|{key}|>"));
    }
    for (lang, id) in &t.codec_language_id {
        names.insert(*id, format!("<|codec_language_{lang}|>"));
    }
    for (spk, id) in &t.spk_id {
        names.insert(*id, format!("<|spk_{spk}|>"));
    }
    for c in 0..t.vocab_size {
        tokens.push(names.remove(&c).unwrap_or_else(|| format!("<|codec_{c}|>")));
        types.push(TOKEN_CONTROL);
    }
    let mut seen = std::collections::HashSet::with_capacity(tokens.len());
    for tok in &tokens {
        if !seen.insert(tok.as_str()) {
            return Err(ModelError::BadField {
                path: vocab_path.clone(),
                field: tok.clone(),
                expected: "token strings unique across text and codec tokens".into(),
                found: "a duplicate".into(),
            });
        }
    }
    let merges_path = dir.join("merges.txt");
    let text = std::fs::read_to_string(&merges_path)
        .map_err(|e| ModelError::io(&merges_path, "read", e))?;
    let merges = text
        .lines()
        .filter(|l| !l.starts_with("#version") && !l.is_empty())
        .map(str::to_owned)
        .collect();
    Ok(Vocab {
        tokens,
        types,
        merges,
    })
}

fn json_text(path: &Path) -> Result<String, ModelError> {
    std::fs::read_to_string(path).map_err(|e| ModelError::io(path, "read", e))
}

fn talker_metadata(ckpt: &Checkpoint, vocab: &Vocab, ty: OutType) -> Result<Plan, ModelError> {
    let t = &ckpt.config.tts.talker_config;
    let mut p = Plan::default();
    let a = "qwen3tts";
    p.set("general.architecture", Value::Str(a.into()));
    p.set("general.type", Value::Str("model".into()));
    p.set("general.name", Value::Str(model_name(ckpt)));
    p.set("general.file_type", Value::U32(ty.file_type()));
    p.set("general.quantization_version", Value::U32(2));
    p.set(
        format!("{a}.context_length"),
        Value::U32(t.max_position_embeddings),
    );
    p.set(format!("{a}.embedding_length"), Value::U32(t.hidden_size));
    p.set(format!("{a}.block_count"), Value::U32(t.num_hidden_layers));
    p.set(
        format!("{a}.feed_forward_length"),
        Value::U32(t.intermediate_size),
    );
    p.set(
        format!("{a}.attention.head_count"),
        Value::U32(t.num_attention_heads),
    );
    p.set(
        format!("{a}.attention.head_count_kv"),
        Value::U32(t.num_key_value_heads),
    );
    p.set(format!("{a}.attention.key_length"), Value::U32(t.head_dim));
    p.set(
        format!("{a}.attention.value_length"),
        Value::U32(t.head_dim),
    );
    p.set(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(t.rms_norm_eps as f32),
    );
    p.set(
        format!("{a}.rope.freq_base"),
        Value::F32(t.rope_theta as f32),
    );
    let mut sections: Vec<i32> = t
        .rope_scaling
        .mrope_section
        .iter()
        .map(|&x| x as i32)
        .collect();
    sections.resize(4, 0);
    p.set(
        format!("{a}.rope.dimension_sections"),
        Value::Array(Array::I32(sections)),
    );
    p.set("tokenizer.ggml.model", Value::Str("gpt2".into()));
    p.set("tokenizer.ggml.pre", Value::Str("qwen2".into()));
    p.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::Str(vocab.tokens.clone())),
    );
    p.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vocab.types.clone())),
    );
    p.set(
        "tokenizer.ggml.merges",
        Value::Array(Array::Str(vocab.merges.clone())),
    );
    let n_text = t.text_vocab_size;
    p.set(
        "tokenizer.ggml.eos_token_id",
        Value::U32(n_text + t.codec_eos_token_id),
    );
    p.set("tokenizer.ggml.add_bos_token", Value::Bool(false));
    p.set("tokenizer.ggml.add_eos_token", Value::Bool(false));
    let suppress: Vec<i32> = (n_text + ckpt.config.speech_tokenizer.decoder_config.codebook_size
        ..n_text + t.vocab_size)
        .filter(|&id| id != n_text + t.codec_eos_token_id)
        .map(|id| id as i32)
        .collect();
    p.set(
        "tokenizer.ggml.suppress_tokens",
        Value::Array(Array::I32(suppress)),
    );
    hf_json(&mut p, ckpt)?;
    Ok(p)
}

fn hf_json(p: &mut Plan, ckpt: &Checkpoint) -> Result<(), ModelError> {
    p.set(
        KEY_HF_CONFIG,
        Value::Str(json_text(&ckpt.dir.join("config.json"))?),
    );
    p.set(
        KEY_HF_GENERATION,
        Value::Str(json_text(&ckpt.dir.join("generation_config.json"))?),
    );
    let st = ckpt.dir.join("speech_tokenizer").join("config.json");
    p.set(KEY_HF_SPEECH_TOKENIZER, Value::Str(json_text(&st)?));
    Ok(())
}

fn model_name(ckpt: &Checkpoint) -> String {
    let c = &ckpt.config.tts;
    format!(
        "Qwen3-TTS-12Hz-{}-{}",
        c.tts_model_size,
        c.tts_model_type.as_str()
    )
}

fn mmproj_metadata(ckpt: &Checkpoint, ty: OutType) -> Result<Plan, ModelError> {
    let t = &ckpt.config.tts.talker_config;
    let cp = &t.code_predictor_config;
    let mut p = Plan::default();
    p.set("general.architecture", Value::Str("clip".into()));
    p.set("general.type", Value::Str("mmproj".into()));
    p.set("general.name", Value::Str(model_name(ckpt)));
    p.set("general.file_type", Value::U32(ty.file_type()));
    p.set("general.quantization_version", Value::U32(2));
    p.set("clip.has_gen_audio_encoder", Value::Bool(true));
    p.set(
        "clip.gen.audio.projector_type",
        Value::Str("qwen3tts_gen".into()),
    );
    let g = "clip.gen.audio";
    p.set(format!("{g}.embedding_length"), Value::U32(cp.hidden_size));
    p.set(
        format!("{g}.attention.head_count"),
        Value::U32(cp.num_attention_heads),
    );
    p.set(
        format!("{g}.attention.head_count_kv"),
        Value::U32(cp.num_key_value_heads),
    );
    p.set(
        format!("{g}.feed_forward_length"),
        Value::U32(cp.intermediate_size),
    );
    p.set(format!("{g}.block_count"), Value::U32(cp.num_hidden_layers));
    p.set(format!("{g}.projection_dim"), Value::U32(t.hidden_size));
    p.set(
        format!("{g}.attention.layer_norm_epsilon"),
        Value::F32(cp.rms_norm_eps as f32),
    );
    if let Some(enc_dim) = ckpt.config.tts.speaker_encoder_config.enc_dim {
        // The speaker encoder's keys; llama.cpp reads the widths from the tensors and requires these
        // (clip.cpp `load_hparams`), with the values its own converter writes.
        p.set("clip.has_audio_encoder", Value::Bool(true));
        p.set(
            "clip.audio.projector_type",
            Value::Str("qwen3tts_spkenc".into()),
        );
        let mfa = 3 * ckpt.config.tts.speaker_encoder_config.channels();
        p.set("clip.audio.embedding_length", Value::U32(mfa));
        p.set("clip.audio.attention.head_count", Value::U32(1));
        p.set("clip.audio.feed_forward_length", Value::U32(mfa));
        p.set("clip.audio.block_count", Value::U32(3));
        p.set("clip.audio.projection_dim", Value::U32(enc_dim));
        p.set("clip.audio.attention.layer_norm_epsilon", Value::F32(1e-5));
        p.set("clip.audio.num_mel_bins", Value::U32(128));
    }
    hf_json(&mut p, ckpt)?;
    Ok(p)
}

/// Computes `text_projection` (`fc2(silu(fc1(x)))`) over rows of the text embedding with ggml.
struct TextProjector {
    ctx: ffi::Context,
    pool: ffi::Threadpool,
    n_in: usize,
    n_out: usize,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
}

impl TextProjector {
    const ROWS: usize = 2048;

    fn new(ckpt: &Checkpoint) -> Result<Self, ModelError> {
        let t = &ckpt.config.tts.talker_config;
        let (n_in, n_out) = (t.text_hidden_size as usize, t.hidden_size as usize);
        let floats =
            n_in * n_in + n_in + n_out * n_in + n_out + Self::ROWS * (4 * n_in + 2 * n_out);
        let ctx = ffi::Context::new(floats * 4 + (16 << 20)).map_err(ModelError::from)?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pool = ffi::Threadpool::new(threads, &[]).map_err(ModelError::from)?;
        let p = "talker.text_projection";
        Ok(TextProjector {
            ctx,
            pool,
            n_in,
            n_out,
            w1: ckpt.f32(&format!("{p}.linear_fc1.weight"))?,
            b1: ckpt.f32(&format!("{p}.linear_fc1.bias"))?,
            w2: ckpt.f32(&format!("{p}.linear_fc2.weight"))?,
            b2: ckpt.f32(&format!("{p}.linear_fc2.bias"))?,
        })
    }

    /// Projects `x` (`rows × n_in`, at most ROWS rows) into `out` (`rows × n_out`).
    fn project(&mut self, x: &[f32], out: &mut Vec<f32>) -> Result<(), ModelError> {
        let rows = x.len() / self.n_in;
        let ctx = &self.ctx;
        let input = |ne: &[usize], v: &[f32]| {
            let t = ctx.new_f32(ne).map_err(ModelError::from)?;
            t.write_f32(v).map_err(ModelError::from)?;
            Ok::<_, ModelError>(t)
        };
        // NB: the weights are copied into the context per chunk of 2048 rows (24 MB for 0.6B), which
        // costs little next to the chunk's 26 GFLOP, and keeps the context free of self-borrows.
        let w1 = input(&[self.n_in, self.n_in], &self.w1)?;
        let b1 = input(&[self.n_in], &self.b1)?;
        let w2 = input(&[self.n_in, self.n_out], &self.w2)?;
        let b2 = input(&[self.n_out], &self.b2)?;
        let xin = input(&[self.n_in, rows], x)?;
        let h = ctx.mul_mat(w1, xin).map_err(ModelError::from)?;
        let h = ctx.add(h, b1).map_err(ModelError::from)?;
        let h = ctx.silu(h).map_err(ModelError::from)?;
        let y = ctx.mul_mat(w2, h).map_err(ModelError::from)?;
        let y = ctx.add(y, b2).map_err(ModelError::from)?;
        let mut g = ctx.graph(y).map_err(ModelError::from)?;
        g.compute(&self.pool).map_err(ModelError::from)?;
        out.resize(rows * self.n_out, 0.0);
        y.read_f32(out).map_err(ModelError::from)?;
        drop(g);
        self.ctx.reset();
        Ok(())
    }
}

/// Encodes f32 values as ggml type `ty` in rows of `n_per_row`.
pub fn encode(ty: GgmlType, values: &[f32], n_per_row: usize) -> Result<Vec<u8>, ModelError> {
    Ok(match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => {
            // Rows quantize independently: split them over the cores (same bytes as one call).
            let rows = values.len() / n_per_row.max(1);
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let per = rows.div_ceil(threads).max(1) * n_per_row;
            let parts: Vec<Result<Vec<u8>, ffi::GgmlError>> = std::thread::scope(|s| {
                let handles: Vec<_> = values
                    .chunks(per)
                    .map(|c| s.spawn(move || ffi::quantize(ty, c, n_per_row)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or(Err(ffi::GgmlError::Compute { status: -1 }))
                    })
                    .collect()
            });
            let mut out = Vec::new();
            for p in parts {
                out.extend(p.map_err(ModelError::from)?);
            }
            out
        }
    })
}

/// The f32 values of output tensor `t` (all but the token embedding).
pub fn source_values(ckpt: &Checkpoint, t: &OutTensor) -> Result<Vec<f32>, ModelError> {
    Ok(match &t.source {
        Source::Copy(n) => ckpt.f32(n)?,
        Source::Stack(names) => {
            let mut v = Vec::new();
            for n in names {
                v.extend(ckpt.f32(n)?);
            }
            v
        }
        Source::Codebooks(pairs) => {
            let mut v = Vec::new();
            for (sum, usage) in pairs {
                let sum = ckpt.f32(sum)?;
                let usage = ckpt.f32(usage)?;
                let dim = sum.len() / usage.len().max(1);
                for (row, &u) in sum.chunks_exact(dim).zip(&usage) {
                    let u = u.max(1e-5);
                    v.extend(row.iter().map(|&x| x / u));
                }
            }
            v
        }
        Source::SnakeAlpha(n) => ckpt.f32(n)?.into_iter().map(f32::exp).collect(),
        Source::SnakeBeta(n) => ckpt
            .f32(n)?
            .into_iter()
            .map(|b| 1.0 / (b.exp() + 1e-9))
            .collect(),
        Source::TokenEmbd => {
            return Err(ModelError::Unsupported {
                what: format!("tensor '{}'", t.name),
                expected: "a tensor with a direct source".into(),
                found: "the token embedding, which is written in chunks".into(),
            })
        }
    })
}

/// What a finished conversion wrote.
#[derive(Debug, Clone)]
pub struct Converted {
    /// The talker GGUF.
    pub talker: PathBuf,
    /// The mmproj GGUF.
    pub mmproj: PathBuf,
}

/// Where [`convert`] writes the pair of type `ty` in `out_dir`: `talker-<type>.gguf` and
/// `mmproj-<type>.gguf`.
pub fn output_paths(out_dir: &Path, ty: OutType) -> Converted {
    Converted {
        talker: out_dir.join(format!("talker-{}.gguf", ty.name())),
        mmproj: out_dir.join(format!("mmproj-{}.gguf", ty.name())),
    }
}

/// Converts checkpoint `dir` into `out_dir` at `ty`; tokenizer files are read from
/// `tokenizer_dir` (the checkpoint directory when `None`).
///
/// `progress(done, total)` is called after each tensor, in output bytes.
pub fn convert(
    dir: &Path,
    tokenizer_dir: Option<&Path>,
    out_dir: &Path,
    ty: OutType,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Converted, ModelError> {
    let ckpt = Checkpoint::open(dir)?;
    let vocab = read_vocab(tokenizer_dir.unwrap_or(dir), &ckpt)?;
    let lay = layout(&ckpt.config, ckpt.specs());
    let req = ty.ggml();
    // Where the files came from, for the conversion cache's checks (`model::cache`).
    let id = Value::Str(super::cache::checkpoint_id(dir)?);
    let talker_plan = {
        let mut p = talker_metadata(&ckpt, &vocab, ty)?;
        p.set(super::cache::KEY_CHECKPOINT_ID, id.clone());
        for t in &lay.talker {
            p.add_tensor(t.name.clone(), t.ne.clone(), t.storage_type(req));
        }
        p
    };
    let mmproj_plan = {
        let mut p = mmproj_metadata(&ckpt, ty)?;
        p.set(super::cache::KEY_CHECKPOINT_ID, id);
        for t in &lay.mmproj {
            p.add_tensor(t.name.clone(), t.ne.clone(), t.storage_type(req));
        }
        p
    };
    let total: u64 = talker_plan
        .tensors()
        .chain(mmproj_plan.tensors())
        .map(|(_, ne, t)| t.nbytes(ne).unwrap_or(0))
        .sum();
    std::fs::create_dir_all(out_dir).map_err(|e| ModelError::io(out_dir, "create_dir", e))?;
    let Converted {
        talker: talker_path,
        mmproj: mmproj_path,
    } = output_paths(out_dir, ty);
    let mut done = 0u64;

    let mut w = Writer::create(&talker_path, &talker_plan)?;
    for t in &lay.talker {
        let st = t.storage_type(req);
        if t.source == Source::TokenEmbd {
            write_token_embd(&ckpt, &mut w, t, st)?;
        } else {
            let v = source_values(&ckpt, t)?;
            w.write_tensor(&t.name, &encode(st, &v, t.ne[0] as usize)?)?;
        }
        done += st.nbytes(&t.ne).unwrap_or(0);
        progress(done, total);
    }
    let talker = w.finish()?;

    let mut w = Writer::create(&mmproj_path, &mmproj_plan)?;
    for t in &lay.mmproj {
        let st = t.storage_type(req);
        let v = source_values(&ckpt, t)?;
        w.write_tensor(&t.name, &encode(st, &v, t.ne[0] as usize)?)?;
        done += st.nbytes(&t.ne).unwrap_or(0);
        progress(done, total);
    }
    let mmproj = w.finish()?;
    Ok(Converted { talker, mmproj })
}

fn write_token_embd(
    ckpt: &Checkpoint,
    w: &mut Writer,
    t: &OutTensor,
    st: GgmlType,
) -> Result<(), ModelError> {
    let cfg = &ckpt.config.tts.talker_config;
    let n_text = cfg.text_vocab_size as usize;
    let h = cfg.hidden_size as usize;
    let mut proj = TextProjector::new(ckpt)?;
    let mut y = Vec::with_capacity(TextProjector::ROWS * h);
    w.begin_tensor(&t.name)?;
    let mut r = 0;
    while r < n_text {
        let n = (n_text - r).min(TextProjector::ROWS);
        let x = ckpt
            .raw_rows("talker.model.text_embedding.weight", r..r + n)?
            .to_f32();
        proj.project(&x, &mut y)?;
        w.write_bytes(&encode(st, &y, h)?)?;
        r += n;
    }
    let codec = ckpt.f32("talker.model.codec_embedding.weight")?;
    w.write_bytes(&encode(st, &codec, h)?)?;
    w.end_tensor()
}
