//! The checkpoint's JSON files: `config.json`, `generation_config.json`, `speech_tokenizer/config.json`.
//!
//! Model: Qwen3-TTS-12Hz (<https://huggingface.co/Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice>), reference
//! implementation PyPI `qwen-tts` 0.1.1 (`qwen_tts/core/models/configuration_qwen3_tts.py`).
//!
//! Every field a computation depends on is required here, with no default: the official config
//! classes' defaults are stale (wrong special ids, layer counts and head_dim), so a value that is not
//! in the file is an error naming the file and the field path, never a guess.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ModelError;

mod preset;
pub use preset::Preset;

/// `config.json` at the checkpoint's top level.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct TtsConfig {
    /// `"0b6"`, `"1b7"` (or anything for test models).
    pub tts_model_size: String,
    /// `base`, `custom_voice` or `voice_design`.
    pub tts_model_type: ModelType,
    /// `qwen3_tts_tokenizer_12hz`.
    pub tokenizer_type: String,
    /// `<|im_start|>` text id.
    pub im_start_token_id: u32,
    /// `<|im_end|>` text id.
    pub im_end_token_id: u32,
    /// `assistant` text id.
    pub assistant_token_id: u32,
    /// `<tts_pad>` text id.
    pub tts_pad_token_id: u32,
    /// `<tts_text_bos>` text id.
    pub tts_bos_token_id: u32,
    /// `<tts_text_eod>` text id.
    pub tts_eos_token_id: u32,
    /// The talker and its code predictor.
    pub talker_config: TalkerConfig,
    /// The x-vector speaker encoder (Base models); `{}` elsewhere.
    #[serde(default)]
    pub speaker_encoder_config: SpeakerEncoderConfig,
}

/// Which of the three released variants a checkpoint is.
#[derive(Deserialize, Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ModelType {
    /// Voice cloning from a reference (x-vector and ICL).
    Base,
    /// Nine named speakers.
    CustomVoice,
    /// Voices described by an instruction.
    VoiceDesign,
}

impl ModelType {
    /// The name used in `config.json`.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelType::Base => "base",
            ModelType::CustomVoice => "custom_voice",
            ModelType::VoiceDesign => "voice_design",
        }
    }

    /// The variant `config.json` names `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Base, Self::CustomVoice, Self::VoiceDesign]
            .into_iter()
            .find(|t| t.as_str() == name)
    }

    /// Whether a model of this type and size (`tts_model_size`: `0b6`, `1b7`) takes a voice
    /// instruction: VoiceDesign models and the 1.7B CustomVoice.
    pub fn takes_instruct(self, size: &str) -> bool {
        match self {
            ModelType::VoiceDesign => true,
            ModelType::CustomVoice => size != "0b6",
            ModelType::Base => false,
        }
    }
}

/// `speaker_encoder_config` (Base models only).
///
/// The released configs give only `enc_dim` and `sample_rate`; the widths take the defaults of
/// `Qwen3TTSSpeakerEncoderConfig` (`qwen_tts/core/models/configuration_qwen3_tts.py`), which the
/// accessors return when a field is absent. The mel front end (128 bins, 24 kHz) and the kernel
/// sizes and dilations are hard-coded by the reference and are not configurable here.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq, Default)]
pub struct SpeakerEncoderConfig {
    /// Output width: the talker's hidden size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enc_dim: Option<u32>,
    /// Input sample rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_rate: Option<u32>,
    /// Channels of the TDNN block, the three SE-Res2Net blocks and the MFA (`[512 ×4, 1536]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enc_channels: Option<Vec<u32>>,
    /// Attentive-pooling bottleneck (128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enc_attention_channels: Option<u32>,
    /// Squeeze-excitation bottleneck (128).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enc_se_channels: Option<u32>,
}

impl SpeakerEncoderConfig {
    /// Block width `C` (512): channels of the first four blocks; the MFA has `3·C`.
    pub fn channels(&self) -> u32 {
        self.enc_channels
            .as_ref()
            .and_then(|c| c.first().copied())
            .unwrap_or(512)
    }

    /// Attentive-pooling bottleneck (128).
    pub fn attention_channels(&self) -> u32 {
        self.enc_attention_channels.unwrap_or(128)
    }

    /// Squeeze-excitation bottleneck (128).
    pub fn se_channels(&self) -> u32 {
        self.enc_se_channels.unwrap_or(128)
    }
}

/// `talker_config`.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct TalkerConfig {
    /// Width of the talker's residual stream (1024 or 2048).
    pub hidden_size: u32,
    /// Decoder layers (28).
    pub num_hidden_layers: u32,
    /// Query heads.
    pub num_attention_heads: u32,
    /// Key/value heads.
    pub num_key_value_heads: u32,
    /// Per-head width.
    pub head_dim: u32,
    /// SwiGLU inner width.
    pub intermediate_size: u32,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Multimodal-RoPE sections.
    pub rope_scaling: RopeScaling,
    /// Longest sequence.
    pub max_position_embeddings: u32,
    /// Codec vocabulary (3072): codebook-0 codes, specials, languages, speakers.
    pub vocab_size: u32,
    /// Rows of the text embedding (151936).
    pub text_vocab_size: u32,
    /// Width of the text embedding (2048).
    pub text_hidden_size: u32,
    /// Codebooks per frame (16).
    pub num_code_groups: u32,
    /// Codec pad id.
    pub codec_pad_id: u32,
    /// Codec bos id.
    pub codec_bos_id: u32,
    /// Codec end-of-speech id.
    pub codec_eos_token_id: u32,
    /// Codec think id.
    pub codec_think_id: u32,
    /// Codec no-think id.
    pub codec_nothink_id: u32,
    /// Codec think-bos id.
    pub codec_think_bos_id: u32,
    /// Codec think-eos id.
    pub codec_think_eos_id: u32,
    /// Language name to codec id.
    pub codec_language_id: BTreeMap<String, u32>,
    /// Speaker name to codec id (CustomVoice only).
    #[serde(default)]
    pub spk_id: BTreeMap<String, u32>,
    /// Speaker name to dialect language, or `false`.
    #[serde(default)]
    pub spk_is_dialect: BTreeMap<String, Dialect>,
    /// The code predictor.
    pub code_predictor_config: CodePredictorConfig,
}

/// A speaker's dialect: `false` or a language name.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
#[serde(untagged)]
pub enum Dialect {
    /// `false`: no dialect.
    None(bool),
    /// The dialect's language name (`sichuan_dialect`).
    Language(String),
}

/// `rope_scaling` of the talker.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct RopeScaling {
    /// Interleaved M-RoPE.
    #[serde(default)]
    pub interleaved: bool,
    /// Rotary pairs per section (t, h, w): 24, 20, 20.
    pub mrope_section: Vec<u32>,
    /// The rope initialiser of transformers (`default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_type: Option<String>,
    /// The same, under its older key.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// `talker_config.code_predictor_config`.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct CodePredictorConfig {
    /// Width (1024).
    pub hidden_size: u32,
    /// Layers (5).
    pub num_hidden_layers: u32,
    /// Query heads.
    pub num_attention_heads: u32,
    /// Key/value heads.
    pub num_key_value_heads: u32,
    /// Per-head width.
    pub head_dim: u32,
    /// SwiGLU inner width.
    pub intermediate_size: u32,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Code vocabulary per codebook (2048).
    pub vocab_size: u32,
    /// Codebooks per frame (16).
    pub num_code_groups: u32,
    /// Longest sequence.
    pub max_position_embeddings: u32,
}

/// `speech_tokenizer/config.json`.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct SpeechTokenizerConfig {
    /// Output sample rate (24000).
    pub output_sample_rate: u32,
    /// Samples per frame (1920).
    pub decode_upsample_rate: u32,
    /// Input sample rate of the encoder.
    pub input_sample_rate: u32,
    /// Samples per frame of the encoder.
    pub encode_downsample_rate: u32,
    /// The code-to-waveform decoder.
    pub decoder_config: DecoderConfig,
    /// The waveform-to-code encoder (Mimi), used for voice cloning; every released checkpoint
    /// has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder_config: Option<EncoderConfig>,
    /// Codebooks of the encoder's output kept (16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder_valid_num_quantizers: Option<u32>,
}

/// `speech_tokenizer/config.json` → `encoder_config`: a transformers `MimiConfig` (SEANet encoder,
/// causal transformer, split RVQ). `sliding_window` is deliberately not read: the reference's
/// eager attention ignores it and attends over the whole reference.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct EncoderConfig {
    /// Input rate (24000).
    pub sampling_rate: u32,
    /// Input channels (1).
    pub audio_channels: u32,
    /// Transformer width and SEANet output (512).
    pub hidden_size: u32,
    /// First SEANet width (64), doubled at each downsampling.
    pub num_filters: u32,
    /// Residual units per SEANet stage (1).
    pub num_residual_layers: u32,
    /// Downsampling ratios, walked in reverse by the encoder (`[8, 6, 5, 4]`).
    pub upsampling_ratios: Vec<u32>,
    /// First conv kernel (7).
    pub kernel_size: u32,
    /// Last conv kernel (3).
    pub last_kernel_size: u32,
    /// Residual unit kernel (3).
    pub residual_kernel_size: u32,
    /// Dilation growth of stacked residual units (2; one unit: dilation 1).
    pub dilation_growth_rate: u32,
    /// Causal convolutions (true).
    pub use_causal_conv: bool,
    /// Conv padding (`constant`).
    pub pad_mode: String,
    /// Residual unit bottleneck divisor (2).
    pub compress: u32,
    /// A 1×1 shortcut in residual units (false).
    pub use_conv_shortcut: bool,
    /// Codes per codebook (2048).
    pub codebook_size: u32,
    /// Codebook vector width (256).
    pub codebook_dim: u32,
    /// Codebooks computed by the reference (32; the first 16 are kept).
    pub num_quantizers: u32,
    /// Width of the RVQ input projections (256).
    pub vector_quantization_hidden_dimension: u32,
    /// Semantic codebooks (1).
    pub num_semantic_quantizers: u32,
    /// Transformer layers (8).
    pub num_hidden_layers: u32,
    /// Transformer MLP width (2048).
    pub intermediate_size: u32,
    /// Heads (8).
    pub num_attention_heads: u32,
    /// Key/value heads (8).
    pub num_key_value_heads: u32,
    /// Per-head width (64).
    pub head_dim: u32,
    /// MLP activation (`gelu`, the erf form).
    pub hidden_act: String,
    /// LayerNorm epsilon.
    pub norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
}

/// `speech_tokenizer/config.json` → `decoder_config`.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    /// Codes per codebook (2048).
    pub codebook_size: u32,
    /// Split-RVQ output width (512; each half-codebook is 256 wide).
    pub codebook_dim: u32,
    /// Pre-conv output width (1024).
    pub latent_dim: u32,
    /// First decoder conv width (1536).
    pub decoder_dim: u32,
    /// Transformer width (512).
    pub hidden_size: u32,
    /// Transformer SwiGLU width (1024).
    pub intermediate_size: u32,
    /// Transformer layers (8).
    pub num_hidden_layers: u32,
    /// Heads (16).
    pub num_attention_heads: u32,
    /// Key/value heads (16).
    pub num_key_value_heads: u32,
    /// Per-head width (64).
    pub head_dim: u32,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Attention window in frames (72).
    pub sliding_window: u32,
    /// Codebooks (16).
    pub num_quantizers: u32,
    /// Semantic codebooks (1).
    pub num_semantic_quantizers: u32,
    /// DecoderBlock rates (8, 5, 4, 3).
    pub upsample_rates: Vec<u32>,
    /// ConvNeXt upsampler ratios (2, 2).
    pub upsampling_ratios: Vec<u32>,
    /// Longest sequence.
    pub max_position_embeddings: u32,
    /// LayerScale initial value (unused at inference).
    pub layer_scale_initial_scale: f64,
}

/// `generation_config.json`: the sampling defaults.
#[derive(Deserialize, Serialize, Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// Sample codebook 0 (else greedy).
    pub do_sample: bool,
    /// Codebook-0 temperature.
    pub temperature: f64,
    /// Codebook-0 top-k.
    pub top_k: u32,
    /// Codebook-0 top-p.
    pub top_p: f64,
    /// Penalty over generated codebook-0 ids.
    pub repetition_penalty: f64,
    /// Sample codebooks 1..15.
    pub subtalker_dosample: bool,
    /// Codebooks 1..15 temperature.
    pub subtalker_temperature: f64,
    /// Codebooks 1..15 top-k.
    pub subtalker_top_k: u32,
    /// Codebooks 1..15 top-p.
    pub subtalker_top_p: f64,
    /// Frame cap.
    pub max_new_tokens: u32,
}

/// Reads and deserializes a JSON file; errors name the file and the field path.
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, "read", e))?;
    parse_json(&text, path)
}

/// Deserializes JSON text; errors name `path` and the field path.
pub fn parse_json<T: for<'de> Deserialize<'de>>(text: &str, path: &Path) -> Result<T, ModelError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_data() {
            let msg = inner.to_string();
            // serde's text is "missing field `x` at line.." or "invalid type: .., expected ..".
            let (expected, found) = match msg.split_once(", expected ") {
                Some((found, expected)) => (
                    expected
                        .split(" at line")
                        .next()
                        .unwrap_or(expected)
                        .to_owned(),
                    found.to_owned(),
                ),
                None => (
                    "a value".to_owned(),
                    msg.split(" at line").next().unwrap_or(&msg).to_owned(),
                ),
            };
            let field = match msg.strip_prefix("missing field `") {
                Some(rest) => {
                    let name = rest.split('`').next().unwrap_or("");
                    if field == "." {
                        name.to_owned()
                    } else {
                        format!("{field}.{name}")
                    }
                }
                None => field,
            };
            ModelError::BadField {
                path: path.into(),
                field,
                expected,
                found,
            }
        } else {
            ModelError::Parse {
                path: path.into(),
                message: inner.to_string(),
            }
        }
    })
}

/// The three JSON files of a checkpoint directory.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointConfig {
    /// `config.json`.
    pub tts: TtsConfig,
    /// `generation_config.json`.
    pub generation: GenerationConfig,
    /// `speech_tokenizer/config.json`.
    pub speech_tokenizer: SpeechTokenizerConfig,
}

impl CheckpointConfig {
    /// Reads the three files of checkpoint directory `dir`, then checks them against each other.
    pub fn read(dir: &Path) -> Result<Self, ModelError> {
        let cfg = CheckpointConfig {
            tts: read_json(&dir.join("config.json"))?,
            generation: read_json(&dir.join("generation_config.json"))?,
            speech_tokenizer: read_json(&dir.join("speech_tokenizer").join("config.json"))?,
        };
        cfg.check(dir)?;
        Ok(cfg)
    }

    /// Consistency checks that the engine's arithmetic relies on.
    pub fn check(&self, dir: &Path) -> Result<(), ModelError> {
        let t = &self.tts.talker_config;
        let cp = &t.code_predictor_config;
        let d = &self.speech_tokenizer.decoder_config;
        let cfg = dir.join("config.json");
        let st = dir.join("speech_tokenizer").join("config.json");
        let bad = |path: &Path, field: &str, expected: String, found: String| {
            Err(ModelError::BadField {
                path: path.into(),
                field: field.into(),
                expected,
                found,
            })
        };
        let heads_ok = |h: u32, kv: u32| h > 0 && kv > 0 && h.is_multiple_of(kv);
        if !heads_ok(t.num_attention_heads, t.num_key_value_heads) {
            return bad(
                &cfg,
                "talker_config.num_key_value_heads",
                format!(
                    "a divisor of num_attention_heads ({})",
                    t.num_attention_heads
                ),
                t.num_key_value_heads.to_string(),
            );
        }
        if !heads_ok(cp.num_attention_heads, cp.num_key_value_heads) {
            return bad(
                &cfg,
                "talker_config.code_predictor_config.num_key_value_heads",
                format!(
                    "a divisor of num_attention_heads ({})",
                    cp.num_attention_heads
                ),
                cp.num_key_value_heads.to_string(),
            );
        }
        let sections: u32 = t.rope_scaling.mrope_section.iter().sum();
        if t.rope_scaling.mrope_section.len() != 3 || sections * 2 != t.head_dim {
            return bad(
                &cfg,
                "talker_config.rope_scaling.mrope_section",
                format!("3 sections summing to head_dim/2 = {}", t.head_dim / 2),
                format!("{:?}", t.rope_scaling.mrope_section),
            );
        }
        if t.num_code_groups != 16 || cp.num_code_groups != 16 || d.num_quantizers != 16 {
            return bad(
                &cfg,
                "talker_config.num_code_groups",
                "16 in the talker, the code predictor and the decoder".into(),
                format!(
                    "{}, {}, {}",
                    t.num_code_groups, cp.num_code_groups, d.num_quantizers
                ),
            );
        }
        if cp.vocab_size != d.codebook_size {
            return bad(
                &cfg,
                "talker_config.code_predictor_config.vocab_size",
                format!("the decoder's codebook_size ({})", d.codebook_size),
                cp.vocab_size.to_string(),
            );
        }
        let codec_ids = [
            ("codec_pad_id", t.codec_pad_id),
            ("codec_bos_id", t.codec_bos_id),
            ("codec_eos_token_id", t.codec_eos_token_id),
            ("codec_think_id", t.codec_think_id),
            ("codec_nothink_id", t.codec_nothink_id),
            ("codec_think_bos_id", t.codec_think_bos_id),
            ("codec_think_eos_id", t.codec_think_eos_id),
        ];
        let named = t
            .codec_language_id
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .chain(t.spk_id.iter().map(|(k, v)| (k.as_str(), *v)));
        for (name, id) in codec_ids.into_iter().chain(named) {
            if id < d.codebook_size || id >= t.vocab_size {
                return bad(
                    &cfg,
                    &format!("talker_config.{name}"),
                    format!("a codec id in {}..{}", d.codebook_size, t.vocab_size),
                    id.to_string(),
                );
            }
        }
        for (name, dialect) in &t.spk_is_dialect {
            if let Dialect::Language(lang) = dialect {
                if !t.codec_language_id.contains_key(lang) {
                    return bad(
                        &cfg,
                        &format!("talker_config.spk_is_dialect.{name}"),
                        "a language of codec_language_id".into(),
                        lang.clone(),
                    );
                }
            }
        }
        let text_ids = [
            ("im_start_token_id", self.tts.im_start_token_id),
            ("im_end_token_id", self.tts.im_end_token_id),
            ("assistant_token_id", self.tts.assistant_token_id),
            ("tts_pad_token_id", self.tts.tts_pad_token_id),
            ("tts_bos_token_id", self.tts.tts_bos_token_id),
            ("tts_eos_token_id", self.tts.tts_eos_token_id),
        ];
        for (name, id) in text_ids {
            if id >= t.text_vocab_size {
                return bad(
                    &cfg,
                    name,
                    format!("a text id below text_vocab_size ({})", t.text_vocab_size),
                    id.to_string(),
                );
            }
        }
        if self.tts.tts_model_type == ModelType::Base
            && self
                .tts
                .speaker_encoder_config
                .enc_dim
                .is_some_and(|e| e != t.hidden_size)
        {
            return bad(
                &cfg,
                "speaker_encoder_config.enc_dim",
                format!("the talker's hidden_size ({})", t.hidden_size),
                format!("{:?}", self.tts.speaker_encoder_config.enc_dim),
            );
        }
        if let Some(e) = &self.speech_tokenizer.encoder_config {
            check_encoder(e, &self.speech_tokenizer, &st)?;
        }
        let product: u32 = d
            .upsample_rates
            .iter()
            .chain(&d.upsampling_ratios)
            .product();
        if product != self.speech_tokenizer.decode_upsample_rate
            || !d.codebook_dim.is_multiple_of(2)
        {
            return bad(
                &st,
                "decoder_config.upsample_rates",
                format!(
                    "rates whose product with upsampling_ratios is decode_upsample_rate ({})",
                    self.speech_tokenizer.decode_upsample_rate
                ),
                format!("{:?} × {:?}", d.upsample_rates, d.upsampling_ratios),
            );
        }
        if !d.decoder_dim.is_multiple_of(1 << d.upsample_rates.len())
            || d.num_attention_heads * d.head_dim == 0
        {
            return bad(
                &st,
                "decoder_config.decoder_dim",
                format!("a multiple of 2^{}", d.upsample_rates.len()),
                d.decoder_dim.to_string(),
            );
        }
        Ok(())
    }
}

/// What the encoder's arithmetic (`crate::voice`) relies on: the released geometry's kinds of
/// layer, with any widths and counts.
fn check_encoder(
    e: &EncoderConfig,
    st: &SpeechTokenizerConfig,
    path: &Path,
) -> Result<(), ModelError> {
    let bad = |field: &str, expected: &str, found: String| {
        Err(ModelError::BadField {
            path: path.into(),
            field: format!("encoder_config.{field}"),
            expected: expected.into(),
            found,
        })
    };
    let ratios: u32 = e.upsampling_ratios.iter().product();
    if e.sampling_rate != st.input_sample_rate || e.audio_channels != 1 {
        return bad(
            "sampling_rate",
            &format!("input_sample_rate ({}), one channel", st.input_sample_rate),
            format!("{} Hz, {} channels", e.sampling_rate, e.audio_channels),
        );
    }
    if ratios == 0 || ratios * 2 != st.encode_downsample_rate {
        return bad(
            "upsampling_ratios",
            &format!(
                "ratios whose product is half of encode_downsample_rate ({})",
                st.encode_downsample_rate
            ),
            format!("{:?}", e.upsampling_ratios),
        );
    }
    if !e.use_causal_conv || e.pad_mode != "constant" || e.use_conv_shortcut {
        return bad(
            "use_causal_conv",
            "causal convs, pad_mode \"constant\", no conv shortcut",
            format!(
                "causal {}, pad_mode {:?}, shortcut {}",
                e.use_causal_conv, e.pad_mode, e.use_conv_shortcut
            ),
        );
    }
    if e.num_residual_layers != 1 || e.compress == 0 || !e.num_filters.is_multiple_of(e.compress) {
        return bad(
            "num_residual_layers",
            "1 residual unit per stage, num_filters a multiple of compress",
            format!(
                "{} units, num_filters {}, compress {}",
                e.num_residual_layers, e.num_filters, e.compress
            ),
        );
    }
    if e.hidden_act != "gelu" {
        return bad("hidden_act", "gelu", e.hidden_act.clone());
    }
    if e.num_attention_heads == 0
        || e.num_key_value_heads != e.num_attention_heads
        || !e.head_dim.is_multiple_of(2)
        || e.num_attention_heads * e.head_dim != e.hidden_size
    {
        return bad(
            "num_attention_heads",
            "heads × head_dim = hidden_size, as many key/value heads, an even head_dim",
            format!(
                "{} heads ({} kv) × {}, hidden {}",
                e.num_attention_heads, e.num_key_value_heads, e.head_dim, e.hidden_size
            ),
        );
    }
    if e.codebook_dim != e.vector_quantization_hidden_dimension
        || e.num_semantic_quantizers != 1
        || e.num_quantizers < 16
        || st.encoder_valid_num_quantizers.is_some_and(|n| n != 16)
    {
        return bad(
            "codebook_dim",
            "codebook_dim = vector_quantization_hidden_dimension, 1 semantic codebook, 16 kept of at least 16",
            format!(
                "{} / {}, {} semantic, {:?} kept of {}",
                e.codebook_dim,
                e.vector_quantization_hidden_dimension,
                e.num_semantic_quantizers,
                st.encoder_valid_num_quantizers,
                e.num_quantizers
            ),
        );
    }
    Ok(())
}

impl CheckpointConfig {
    /// Writes the three JSON files into checkpoint directory `dir` (which must exist).
    pub fn write(&self, dir: &Path) -> Result<(), ModelError> {
        let st = dir.join("speech_tokenizer");
        std::fs::create_dir_all(&st).map_err(|e| ModelError::io(&st, "create_dir", e))?;
        let mut tts = serde_json::to_value(&self.tts).map_err(|e| ModelError::Parse {
            path: dir.join("config.json"),
            message: e.to_string(),
        })?;
        // The fields the official loader dispatches on.
        tts["architectures"] = serde_json::json!(["Qwen3TTSForConditionalGeneration"]);
        tts["model_type"] = "qwen3_tts".into();
        let mut stc =
            serde_json::to_value(&self.speech_tokenizer).map_err(|e| ModelError::Parse {
                path: st.join("config.json"),
                message: e.to_string(),
            })?;
        stc["architectures"] = serde_json::json!(["Qwen3TTSTokenizerV2Model"]);
        stc["model_type"] = "qwen3_tts_tokenizer_12hz".into();
        let gen = serde_json::to_value(&self.generation).map_err(|e| ModelError::Parse {
            path: dir.join("generation_config.json"),
            message: e.to_string(),
        })?;
        // The two feature-extractor files the official loader opens (values of the released files).
        let processor = serde_json::json!({
            "padding_side": "left",
            "padding_value": 0.0,
            "processor_class": "Qwen3TTSProcessor",
            "return_attention_mask": true
        });
        let extractor = serde_json::json!({
            "chunk_length_s": null,
            "feature_extractor_type": "EncodecFeatureExtractor",
            "feature_size": 1,
            "overlap": null,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": true,
            "sampling_rate": self.speech_tokenizer.input_sample_rate
        });
        for (path, value) in [
            (dir.join("config.json"), tts),
            (dir.join("generation_config.json"), gen),
            (st.join("config.json"), stc),
            (dir.join("preprocessor_config.json"), processor),
            (st.join("preprocessor_config.json"), extractor),
        ] {
            let text = serde_json::to_string_pretty(&value).unwrap_or_default();
            std::fs::write(&path, text).map_err(|e| ModelError::io(&path, "write", e))?;
        }
        Ok(())
    }
}
