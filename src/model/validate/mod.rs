//! The Qwen3-TTS checks every GGUF passes before llama.cpp or ggml sees it.
//!
//! [`crate::gguf::parse`] already refused malformed files; these checks refuse well-formed files
//! that are not a usable Qwen3-TTS model, in particular everything llama.cpp's loaders answer with
//! an abort instead of an error: metadata of the wrong type (the clip loader `GGML_ASSERT`s on it),
//! duplicate token strings (`llama-vocab.cpp`), a token embedding over 2^32 elements, a vocabulary
//! smaller than the 3072 codec tokens (`qwen3vl.cpp`), and tensor shapes that would fail inside
//! ggml operators at the first compute.
//!
//! Geometry comes from the file's own llama.cpp keys (so published files check the same way as the
//! ones this crate writes); the decoder's layer and block counts, which llama.cpp hard-codes, come
//! from the checkpoint's JSON carried in the file when it is there.

mod voice;
use voice::{check_codec_encoder, check_speaker_encoder};

use std::path::Path;

use super::config::{parse_json, Preset, SpeechTokenizerConfig};
use super::convert::KEY_HF_SPEECH_TOKENIZER;
use crate::error::ModelError;
use crate::ffi::{Role, Validated};
use crate::gguf::{Array, GgmlType, GgufFile, Header, Value};

/// The number of codec tokens at the end of a talker vocabulary (llama.cpp hard-codes it).
pub const CODEC_VOCAB: u64 = 3072;

struct Check<'a> {
    path: &'a Path,
    h: &'a Header,
}

impl<'a> Check<'a> {
    fn key(&self, key: &str) -> Result<&'a Value, ModelError> {
        self.h.get(key).ok_or_else(|| ModelError::MissingKey {
            path: self.path.into(),
            key: key.into(),
        })
    }

    fn bad_key(
        &self,
        key: &str,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> ModelError {
        ModelError::BadKey {
            path: self.path.into(),
            key: key.into(),
            expected: expected.into(),
            found: found.into(),
        }
    }

    fn u32(&self, key: &str) -> Result<u64, ModelError> {
        match self.key(key)? {
            Value::U32(x) => Ok(*x as u64),
            v => Err(self.bad_key(key, "u32", v.type_name())),
        }
    }

    /// A u32 in `range`.
    fn u32_in(&self, key: &str, range: std::ops::RangeInclusive<u64>) -> Result<u64, ModelError> {
        let x = self.u32(key)?;
        if !range.contains(&x) {
            return Err(self.bad_key(key, format!("a value in {range:?}"), x.to_string()));
        }
        Ok(x)
    }

    fn f32(&self, key: &str) -> Result<f32, ModelError> {
        match self.key(key)? {
            Value::F32(x) if x.is_finite() => Ok(*x),
            Value::F32(x) => Err(self.bad_key(key, "a finite f32", x.to_string())),
            v => Err(self.bad_key(key, "f32", v.type_name())),
        }
    }

    fn str(&self, key: &str) -> Result<&'a str, ModelError> {
        match self.key(key)? {
            Value::Str(s) => Ok(s),
            v => Err(self.bad_key(key, "string", v.type_name())),
        }
    }

    fn str_is(&self, key: &str, expected: &str) -> Result<(), ModelError> {
        let s = self.str(key)?;
        if s != expected {
            return Err(self.bad_key(key, format!("\"{expected}\""), format!("\"{s}\"")));
        }
        Ok(())
    }

    /// When `key` is present it has type `ty` (a clip loader abort otherwise).
    fn optional_type(&self, key: &str, ty: &str) -> Result<(), ModelError> {
        match self.h.get(key) {
            Some(v) if v.type_name() != ty => Err(self.bad_key(key, ty, v.type_name())),
            _ => Ok(()),
        }
    }

    fn tensor(&self, name: &str, ne: &[u64], types: &[GgmlType]) -> Result<(), ModelError> {
        let Some(t) = self.h.tensor(name) else {
            return Err(ModelError::MissingTensor {
                path: self.path.into(),
                tensor: name.into(),
            });
        };
        if t.ne != ne {
            return Err(ModelError::WrongShape {
                path: self.path.into(),
                tensor: name.into(),
                expected: ne.to_vec(),
                found: t.ne.clone(),
            });
        }
        if !types.is_empty() && !types.contains(&t.ty) {
            let names: Vec<&str> = types.iter().map(|t| t.name()).collect();
            return Err(ModelError::WrongType {
                path: self.path.into(),
                tensor: name.into(),
                expected: names.join(" or "),
                found: t.ty.name().into(),
            });
        }
        Ok(())
    }

    fn vector(&self, name: &str, n: u64) -> Result<(), ModelError> {
        self.tensor(name, &[n], &[GgmlType::F32])
    }

    fn matrix(&self, name: &str, ne0: u64, ne1: u64) -> Result<(), ModelError> {
        self.tensor(name, &[ne0, ne1], MATRIX)
    }

    fn ne(&self, name: &str) -> Result<&'a [u64], ModelError> {
        self.h
            .tensor(name)
            .map(|t| t.ne.as_slice())
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.into(),
                tensor: name.into(),
            })
    }
}

/// Types a matrix may have: those ggml's CPU matmul and get_rows take.
const MATRIX: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
];
const CONV: &[GgmlType] = &[GgmlType::F32, GgmlType::F16];

/// Geometry of a talker file, read from its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TalkerGeometry {
    /// Residual width.
    pub n_embd: u64,
    /// Layers.
    pub n_layer: u64,
    /// Query heads.
    pub n_head: u64,
    /// Key/value heads.
    pub n_head_kv: u64,
    /// Per-head width.
    pub head_dim: u64,
    /// SwiGLU width.
    pub n_ff: u64,
    /// Tokens (text, then 3072 codec).
    pub n_vocab: u64,
}

/// Opens and checks a talker GGUF, for [`crate::ffi::LlamaModel::load`].
pub fn talker(path: &Path) -> Result<Validated, ModelError> {
    talker_file(path)?;
    Ok(Validated::vouched(path, Role::Talker))
}

/// Opens and checks an mmproj GGUF, for [`crate::ffi::Mmproj::load`].
pub fn mmproj(path: &Path) -> Result<Validated, ModelError> {
    mmproj_file(path)?;
    Ok(Validated::vouched(path, Role::Mmproj))
}

/// Opens and checks a talker GGUF.
pub fn talker_file(path: &Path) -> Result<TalkerGeometry, ModelError> {
    let f = GgufFile::open(path)?;
    check_talker(path, &f.header)
}

/// Checks a parsed talker header.
pub fn check_talker(path: &Path, h: &Header) -> Result<TalkerGeometry, ModelError> {
    let c = Check { path, h };
    let a = "qwen3tts";
    c.str_is("general.architecture", a)?;
    c.optional_type("general.name", "string")?;
    c.u32_in(&format!("{a}.context_length"), 1..=1 << 20)?;
    let n_embd = c.u32_in(&format!("{a}.embedding_length"), 1..=1 << 16)?;
    let n_layer = c.u32_in(&format!("{a}.block_count"), 1..=512)?;
    let n_ff = c.u32_in(&format!("{a}.feed_forward_length"), 1..=1 << 18)?;
    let n_head = c.u32_in(&format!("{a}.attention.head_count"), 1..=1024)?;
    let kv_key = format!("{a}.attention.head_count_kv");
    let n_head_kv = c.u32_in(&kv_key, 1..=n_head)?;
    if n_head % n_head_kv != 0 {
        return Err(c.bad_key(
            &kv_key,
            format!("a divisor of head_count ({n_head})"),
            n_head_kv.to_string(),
        ));
    }
    let head_dim = c.u32_in(&format!("{a}.attention.key_length"), 2..=1024)?;
    c.u32_in(&format!("{a}.attention.value_length"), head_dim..=head_dim)?;
    c.f32(&format!("{a}.attention.layer_norm_rms_epsilon"))?;
    c.f32(&format!("{a}.rope.freq_base"))?;
    let sec_key = format!("{a}.rope.dimension_sections");
    let sections = c.key(&sec_key)?.as_array().and_then(Array::to_i64s);
    match sections {
        Some(s)
            if s.len() == 4
                && s.iter().all(|&x| x >= 0)
                && s.iter().sum::<i64>() > 0
                && s.iter().sum::<i64>() * 2 <= head_dim as i64 => {}
        _ => {
            return Err(c.bad_key(
                &sec_key,
                "4 non-negative sections, sum in 1..=head_dim/2",
                format!("{sections:?}"),
            ))
        }
    }
    if let Some(v) = h.get(&format!("{a}.rope.dimension_count")) {
        if v.as_i64() != Some(head_dim as i64) {
            return Err(c.bad_key(
                &format!("{a}.rope.dimension_count"),
                format!("key_length ({head_dim})"),
                format!("{v:?}"),
            ));
        }
    }
    if let Some(v) = h.get(&format!("{a}.n_deepstack_layers")) {
        if v.as_i64() != Some(0) {
            return Err(c.bad_key(
                &format!("{a}.n_deepstack_layers"),
                "0 or absent",
                format!("{v:?}"),
            ));
        }
    }

    // Tokenizer: llama.cpp asserts token strings are unique and that ids fit.
    c.str_is("tokenizer.ggml.model", "gpt2")?;
    c.optional_type("tokenizer.ggml.pre", "string")?;
    let tokens = match c.key("tokenizer.ggml.tokens")? {
        Value::Array(Array::Str(t)) => t,
        v => {
            return Err(c.bad_key(
                "tokenizer.ggml.tokens",
                "an array of strings",
                v.type_name(),
            ))
        }
    };
    let n_vocab = tokens.len() as u64;
    if n_vocab < CODEC_VOCAB + 1 {
        return Err(c.bad_key(
            "tokenizer.ggml.tokens",
            format!("more than {CODEC_VOCAB} tokens"),
            n_vocab.to_string(),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(tokens.len());
    if let Some(dup) = tokens.iter().find(|t| !seen.insert(t.as_str())) {
        return Err(c.bad_key(
            "tokenizer.ggml.tokens",
            "unique token strings",
            format!("'{dup}' twice"),
        ));
    }
    let n_text = n_vocab - CODEC_VOCAB;
    if tokens[n_text as usize] != "<|codec_0|>" {
        return Err(c.bad_key(
            "tokenizer.ggml.tokens",
            format!("'<|codec_0|>' at id {n_text} (3072 codec tokens last)"),
            format!("'{}'", tokens[n_text as usize]),
        ));
    }
    for special in [
        "<|im_start|>",
        "<|im_end|>",
        "<tts_pad>",
        "<tts_text_bos>",
        "<tts_text_eod>",
        "<|codec_eos_token|>",
        "<|codec_pad|>",
        "<|codec_bos|>",
    ] {
        if !tokens.iter().any(|t| t == special) {
            return Err(c.bad_key(
                "tokenizer.ggml.tokens",
                format!("a token '{special}'"),
                "none",
            ));
        }
    }
    match c.key("tokenizer.ggml.token_type")? {
        Value::Array(Array::I32(t)) if t.len() as u64 == n_vocab => {}
        Value::Array(a) => {
            return Err(c.bad_key(
                "tokenizer.ggml.token_type",
                format!("{n_vocab} i32"),
                format!("{} items of another or the same type", a.len()),
            ))
        }
        v => return Err(c.bad_key("tokenizer.ggml.token_type", "an i32 array", v.type_name())),
    }
    match c.key("tokenizer.ggml.merges")? {
        Value::Array(Array::Str(_)) => {}
        v => {
            return Err(c.bad_key(
                "tokenizer.ggml.merges",
                "an array of strings",
                v.type_name(),
            ))
        }
    }
    for key in [
        "bos",
        "eos",
        "eot",
        "eom",
        "unknown",
        "seperator",
        "padding",
        "mask",
    ] {
        let key = format!("tokenizer.ggml.{key}_token_id");
        if let Some(v) = h.get(&key) {
            match v {
                Value::U32(id) if (*id as u64) < n_vocab => {}
                v => {
                    return Err(c.bad_key(&key, format!("a u32 below {n_vocab}"), format!("{v:?}")))
                }
            }
        }
    }
    for key in [
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.add_eos_token",
    ] {
        c.optional_type(key, "bool")?;
    }
    if let Some(v) = h.get("tokenizer.ggml.suppress_tokens") {
        if !matches!(v, Value::Array(Array::I32(_))) {
            return Err(c.bad_key(
                "tokenizer.ggml.suppress_tokens",
                "an i32 array",
                v.type_name(),
            ));
        }
    }

    // Tensors: exactly the 3 + 11 per layer llama.cpp creates, with their shapes.
    if n_embd * n_vocab > u32::MAX as u64 {
        return Err(c.bad_key(
            "tokenizer.ggml.tokens",
            "a token embedding of at most 2^32 elements",
            format!("{n_vocab} × {n_embd}"),
        ));
    }
    c.tensor("token_embd.weight", &[n_embd, n_vocab], MATRIX)?;
    c.vector("output_norm.weight", n_embd)?;
    c.matrix("output.weight", n_embd, CODEC_VOCAB)?;
    let (q, kv) = (n_head * head_dim, n_head_kv * head_dim);
    for i in 0..n_layer {
        let b = format!("blk.{i}");
        c.vector(&format!("{b}.attn_norm.weight"), n_embd)?;
        c.matrix(&format!("{b}.attn_q.weight"), n_embd, q)?;
        c.matrix(&format!("{b}.attn_k.weight"), n_embd, kv)?;
        c.matrix(&format!("{b}.attn_v.weight"), n_embd, kv)?;
        c.matrix(&format!("{b}.attn_output.weight"), q, n_embd)?;
        c.vector(&format!("{b}.attn_q_norm.weight"), head_dim)?;
        c.vector(&format!("{b}.attn_k_norm.weight"), head_dim)?;
        c.vector(&format!("{b}.ffn_norm.weight"), n_embd)?;
        c.matrix(&format!("{b}.ffn_gate.weight"), n_embd, n_ff)?;
        c.matrix(&format!("{b}.ffn_up.weight"), n_embd, n_ff)?;
        c.matrix(&format!("{b}.ffn_down.weight"), n_ff, n_embd)?;
    }
    let expected = 3 + 11 * n_layer;
    if h.tensors.len() as u64 != expected {
        let extra = h
            .tensors
            .iter()
            .find(|t| {
                !(t.name.starts_with("blk.")
                    || ["token_embd.weight", "output_norm.weight", "output.weight"]
                        .contains(&t.name.as_str()))
            })
            .map_or_else(
                || "a layer beyond block_count".to_owned(),
                |t| t.name.clone(),
            );
        return Err(c.bad_key(
            &format!("{a}.block_count"),
            format!("{expected} tensors for {n_layer} layers"),
            format!("{} tensors (e.g. '{extra}')", h.tensors.len()),
        ));
    }
    Ok(TalkerGeometry {
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_vocab,
    })
}

/// Opens and checks an mmproj GGUF.
pub fn mmproj_file(path: &Path) -> Result<(), ModelError> {
    let f = GgufFile::open(path)?;
    check_mmproj(path, &f.header)
}

/// Checks a parsed mmproj header: code predictor, decoder and, when declared, speaker encoder.
pub fn check_mmproj(path: &Path, h: &Header) -> Result<(), ModelError> {
    let c = Check { path, h };
    c.str_is("general.architecture", "clip")?;
    for key in ["general.name", "general.description", "general.type"] {
        c.optional_type(key, "string")?;
    }
    if let Some(v) = h.get("clip.projector_type") {
        return Err(c.bad_key(
            "clip.projector_type",
            "absent (one projector type per modality)",
            format!("{v:?}"),
        ));
    }
    if let Some(v) = h.get("clip.has_vision_encoder") {
        if v != &Value::Bool(false) {
            return Err(c.bad_key(
                "clip.has_vision_encoder",
                "false or absent",
                format!("{v:?}"),
            ));
        }
    }
    if c.key("clip.has_gen_audio_encoder")? != &Value::Bool(true) {
        return Err(c.bad_key(
            "clip.has_gen_audio_encoder",
            "true",
            format!("{:?}", h.get("clip.has_gen_audio_encoder")),
        ));
    }
    c.str_is("clip.gen.audio.projector_type", "qwen3tts_gen")?;
    let g = "clip.gen.audio";
    let n_cp = c.u32_in(&format!("{g}.embedding_length"), 1..=1 << 16)?;
    let n_head = c.u32_in(&format!("{g}.attention.head_count"), 1..=1024)?;
    let n_head_kv = c.u32_in(&format!("{g}.attention.head_count_kv"), 1..=n_head)?;
    let n_ff = c.u32_in(&format!("{g}.feed_forward_length"), 1..=1 << 18)?;
    let n_layer = c.u32_in(&format!("{g}.block_count"), 1..=64)?;
    let n_talker = c.u32_in(&format!("{g}.projection_dim"), 1..=1 << 16)?;
    c.f32(&format!("{g}.attention.layer_norm_epsilon"))?;
    c.optional_type(&format!("{g}.attention.head_dim"), "u32")?;
    c.optional_type(&format!("{g}.model_variant"), "string")?;

    // Code predictor.
    let head = c.ne("a.gen.code.head.weight")?;
    let (n_codes, n_groups) = match head {
        [x, v, g] if *x == n_cp && *g + 1 == 16 => (*v, *g),
        _ => {
            return Err(ModelError::WrongShape {
                path: path.into(),
                tensor: "a.gen.code.head.weight".into(),
                expected: vec![n_cp, 2048, 15],
                found: head.to_vec(),
            })
        }
    };
    if n_codes != 2048 {
        return Err(ModelError::WrongShape {
            path: path.into(),
            tensor: "a.gen.code.head.weight".into(),
            expected: vec![n_cp, 2048, 15],
            found: head.to_vec(),
        });
    }
    c.tensor("a.gen.code.head.weight", &[n_cp, n_codes, n_groups], MATRIX)?;
    c.tensor(
        "a.gen.code.embd.weight",
        &[n_talker, n_codes, n_groups],
        MATRIX,
    )?;
    c.matrix("a.gen.code.out_embd.weight", n_talker, CODEC_VOCAB)?;
    c.vector("a.gen.code.output_norm.weight", n_cp)?;
    if h.tensor("a.gen.code.proj_in.weight").is_some() || n_talker != n_cp {
        c.matrix("a.gen.code.proj_in.weight", n_talker, n_cp)?;
        c.vector("a.gen.code.proj_in.bias", n_cp)?;
    }
    let q_ne = c.ne("a.gen.code.blk.0.attn_q.weight")?;
    let hd = q_ne.get(1).copied().unwrap_or(0) / n_head;
    if hd == 0 || q_ne.get(1).copied().unwrap_or(0) % n_head != 0 {
        return Err(ModelError::WrongShape {
            path: path.into(),
            tensor: "a.gen.code.blk.0.attn_q.weight".into(),
            expected: vec![n_cp, n_head * 128],
            found: q_ne.to_vec(),
        });
    }
    for l in 0..n_layer {
        let b = format!("a.gen.code.blk.{l}");
        c.vector(&format!("{b}.ln1.weight"), n_cp)?;
        c.matrix(&format!("{b}.attn_q.weight"), n_cp, n_head * hd)?;
        c.vector(&format!("{b}.attn_q_norm.weight"), hd)?;
        c.matrix(&format!("{b}.attn_k.weight"), n_cp, n_head_kv * hd)?;
        c.vector(&format!("{b}.attn_k_norm.weight"), hd)?;
        c.matrix(&format!("{b}.attn_v.weight"), n_cp, n_head_kv * hd)?;
        c.matrix(&format!("{b}.attn_out.weight"), n_head * hd, n_cp)?;
        c.vector(&format!("{b}.ln2.weight"), n_cp)?;
        c.matrix(&format!("{b}.ffn_gate.weight"), n_cp, n_ff)?;
        c.matrix(&format!("{b}.ffn_up.weight"), n_cp, n_ff)?;
        c.matrix(&format!("{b}.ffn_down.weight"), n_ff, n_cp)?;
    }

    // Decoder: counts from the carried JSON when present, else llama.cpp's fixed geometry.
    let st: SpeechTokenizerConfig = match h.get(KEY_HF_SPEECH_TOKENIZER) {
        Some(Value::Str(json)) => parse_json(json, path)?,
        Some(v) => return Err(c.bad_key(KEY_HF_SPEECH_TOKENIZER, "string", v.type_name())),
        None => Preset::Small06CustomVoice.config().speech_tokenizer,
    };
    check_decoder(&c, &st, n_groups)?;

    // Speaker encoder.
    if let Some(v) = h.get("clip.has_audio_encoder") {
        match v {
            Value::Bool(false) => {}
            Value::Bool(true) => check_speaker_encoder(&c, n_talker)?,
            v => return Err(c.bad_key("clip.has_audio_encoder", "bool", v.type_name())),
        }
    }

    // The speech tokenizer's encoder (voice cloning), when the file carries it.
    let enc = crate::model::layout::ENCODER_PREFIX;
    if h.tensor(&format!("{enc}.conv.0.weight")).is_some() {
        match &st.encoder_config {
            Some(e) => check_codec_encoder(&c, e)?,
            None => {
                return Err(c.bad_key(
                    KEY_HF_SPEECH_TOKENIZER,
                    "a speech tokenizer config with encoder_config (the file has encoder tensors)",
                    "none",
                ))
            }
        }
    }
    Ok(())
}

fn check_decoder(
    c: &Check<'_>,
    st: &SpeechTokenizerConfig,
    n_groups: u64,
) -> Result<(), ModelError> {
    let d = &st.decoder_config;
    let w = "a.gen.wav";
    let (cd, half) = (d.codebook_dim as u64, d.codebook_dim as u64 / 2);
    let (lat, hs, dd) = (
        d.latent_dim as u64,
        d.hidden_size as u64,
        d.decoder_dim as u64,
    );
    let n_rest = d.num_quantizers as u64 - d.num_semantic_quantizers as u64;
    if n_rest != n_groups || d.num_semantic_quantizers != 1 || d.codebook_size != 2048 {
        return Err(c.bad_key(
            KEY_HF_SPEECH_TOKENIZER,
            format!("1 semantic + {n_groups} acoustic codebooks of 2048"),
            format!(
                "{} + {n_rest} of {}",
                d.num_semantic_quantizers, d.codebook_size
            ),
        ));
    }
    for g in ["first", "rest"] {
        c.matrix(&format!("{w}.quant.{g}.in_proj.weight"), cd, half)?;
        c.matrix(&format!("{w}.quant.{g}.out_proj.weight"), half, cd)?;
    }
    c.tensor(
        &format!("{w}.quant.first.codebook.weight"),
        &[half, 2048],
        MATRIX,
    )?;
    c.tensor(
        &format!("{w}.quant.rest.codebook.weight"),
        &[half, 2048, n_rest],
        MATRIX,
    )?;
    c.tensor(&format!("{w}.pre_conv.weight"), &[3, cd, lat], CONV)?;
    c.vector(&format!("{w}.pre_conv.bias"), lat)?;
    c.matrix(&format!("{w}.tfm.in_proj.weight"), lat, hs)?;
    c.vector(&format!("{w}.tfm.in_proj.bias"), hs)?;
    c.matrix(&format!("{w}.tfm.out_proj.weight"), hs, lat)?;
    c.vector(&format!("{w}.tfm.out_proj.bias"), lat)?;
    c.vector(&format!("{w}.tfm.output_norm.weight"), hs)?;
    let (q, kv, ff) = (
        (d.num_attention_heads * d.head_dim) as u64,
        (d.num_key_value_heads * d.head_dim) as u64,
        d.intermediate_size as u64,
    );
    for i in 0..d.num_hidden_layers {
        let b = format!("{w}.tfm.blk.{i}");
        c.vector(&format!("{b}.ln1.weight"), hs)?;
        c.matrix(&format!("{b}.attn_q.weight"), hs, q)?;
        c.matrix(&format!("{b}.attn_k.weight"), hs, kv)?;
        c.matrix(&format!("{b}.attn_v.weight"), hs, kv)?;
        c.matrix(&format!("{b}.attn_out.weight"), q, hs)?;
        c.vector(&format!("{b}.ls1.weight"), hs)?;
        c.vector(&format!("{b}.ln2.weight"), hs)?;
        c.matrix(&format!("{b}.ffn_gate.weight"), hs, ff)?;
        c.matrix(&format!("{b}.ffn_up.weight"), hs, ff)?;
        c.matrix(&format!("{b}.ffn_down.weight"), ff, hs)?;
        c.vector(&format!("{b}.ls2.weight"), hs)?;
    }
    for (u, &r) in d.upsampling_ratios.iter().enumerate() {
        let b = format!("{w}.up.blk.{u}");
        c.tensor(&format!("{b}.conv.weight"), &[r as u64, lat, lat], CONV)?;
        c.vector(&format!("{b}.conv.bias"), lat)?;
        c.tensor(&format!("{b}.dwconv.weight"), &[7, 1, lat], CONV)?;
        c.vector(&format!("{b}.dwconv.bias"), lat)?;
        c.vector(&format!("{b}.norm.weight"), lat)?;
        c.vector(&format!("{b}.norm.bias"), lat)?;
        c.matrix(&format!("{b}.pw1.weight"), lat, 4 * lat)?;
        c.vector(&format!("{b}.pw1.bias"), 4 * lat)?;
        c.matrix(&format!("{b}.pw2.weight"), 4 * lat, lat)?;
        c.vector(&format!("{b}.pw2.bias"), lat)?;
        c.vector(&format!("{b}.gamma"), lat)?;
    }
    c.tensor(&format!("{w}.dac.entry.weight"), &[7, lat, dd], CONV)?;
    c.vector(&format!("{w}.dac.entry.bias"), dd)?;
    let mut cin = dd;
    for (i, &r) in d.upsample_rates.iter().enumerate() {
        let (b, cout) = (format!("{w}.dac.blk.{i}"), cin / 2);
        c.vector(&format!("{b}.snake.alpha"), cin)?;
        c.vector(&format!("{b}.snake.beta"), cin)?;
        c.tensor(
            &format!("{b}.conv.weight"),
            &[2 * r as u64, cout, cin],
            CONV,
        )?;
        c.vector(&format!("{b}.conv.bias"), cout)?;
        for j in 0..3 {
            let rb = format!("{b}.res.{j}");
            for act in ["act1", "act2"] {
                c.vector(&format!("{rb}.{act}.alpha"), cout)?;
                c.vector(&format!("{rb}.{act}.beta"), cout)?;
            }
            c.tensor(&format!("{rb}.conv1.weight"), &[7, cout, cout], CONV)?;
            c.vector(&format!("{rb}.conv1.bias"), cout)?;
            c.tensor(&format!("{rb}.conv2.weight"), &[1, cout, cout], CONV)?;
            c.vector(&format!("{rb}.conv2.bias"), cout)?;
        }
        cin = cout;
    }
    c.vector(&format!("{w}.dac.post_snake.alpha"), cin)?;
    c.vector(&format!("{w}.dac.post_snake.beta"), cin)?;
    c.tensor(&format!("{w}.dac.post_conv.weight"), &[7, cin, 1], CONV)?;
    c.vector(&format!("{w}.dac.post_conv.bias"), 1)?;
    Ok(())
}
