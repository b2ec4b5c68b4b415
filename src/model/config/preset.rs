//! The five released checkpoints' configs ([`Preset`]), as `qtts random-model` writes them.

use std::collections::BTreeMap;

use super::*;

/// The five released 12 Hz checkpoints, whose configs this crate can write (`qtts random-model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Preset {
    /// Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice.
    #[cfg_attr(feature = "clap", value(name = "0.6b-customvoice"))]
    Small06CustomVoice,
    /// Qwen/Qwen3-TTS-12Hz-0.6B-Base.
    #[cfg_attr(feature = "clap", value(name = "0.6b-base"))]
    Small06Base,
    /// Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice.
    #[cfg_attr(feature = "clap", value(name = "1.7b-customvoice"))]
    Large17CustomVoice,
    /// Qwen/Qwen3-TTS-12Hz-1.7B-Base.
    #[cfg_attr(feature = "clap", value(name = "1.7b-base"))]
    Large17Base,
    /// Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign.
    #[cfg_attr(feature = "clap", value(name = "1.7b-voicedesign"))]
    Large17VoiceDesign,
}

impl Preset {
    /// The Hugging Face repository name.
    pub fn hf_name(self) -> &'static str {
        match self {
            Preset::Small06CustomVoice => "Qwen3-TTS-12Hz-0.6B-CustomVoice",
            Preset::Small06Base => "Qwen3-TTS-12Hz-0.6B-Base",
            Preset::Large17CustomVoice => "Qwen3-TTS-12Hz-1.7B-CustomVoice",
            Preset::Large17Base => "Qwen3-TTS-12Hz-1.7B-Base",
            Preset::Large17VoiceDesign => "Qwen3-TTS-12Hz-1.7B-VoiceDesign",
        }
    }

    /// The released configs (values from the checkpoints' JSON files, MODEL-NOTES.md §2).
    pub fn config(self) -> CheckpointConfig {
        let large = matches!(
            self,
            Preset::Large17CustomVoice | Preset::Large17Base | Preset::Large17VoiceDesign
        );
        let ty = match self {
            Preset::Small06CustomVoice | Preset::Large17CustomVoice => ModelType::CustomVoice,
            Preset::Small06Base | Preset::Large17Base => ModelType::Base,
            Preset::Large17VoiceDesign => ModelType::VoiceDesign,
        };
        let (hidden, inter) = if large { (2048, 6144) } else { (1024, 3072) };
        let mut languages: BTreeMap<String, u32> = [
            ("chinese", 2055),
            ("english", 2050),
            ("german", 2053),
            ("italian", 2070),
            ("portuguese", 2071),
            ("spanish", 2054),
            ("japanese", 2058),
            ("korean", 2064),
            ("french", 2061),
            ("russian", 2069),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let mut spk_id = BTreeMap::new();
        let mut spk_is_dialect = BTreeMap::new();
        if ty == ModelType::CustomVoice {
            languages.insert("beijing_dialect".into(), 2074);
            languages.insert("sichuan_dialect".into(), 2062);
            for (name, id) in [
                ("aiden", 2861),
                ("sohee", 2864),
                ("ono_anna", 2873),
                ("eric", 2875),
                ("dylan", 2878),
                ("uncle_fu", 3010),
                ("ryan", 3061),
                ("vivian", 3065),
                ("serena", 3066),
            ] {
                spk_id.insert(name.to_owned(), id);
                let dialect = match name {
                    "eric" => Dialect::Language("sichuan_dialect".into()),
                    "dylan" => Dialect::Language("beijing_dialect".into()),
                    _ => Dialect::None(false),
                };
                spk_is_dialect.insert(name.to_owned(), dialect);
            }
        }
        let speaker_encoder_config = if ty == ModelType::Base {
            SpeakerEncoderConfig {
                enc_dim: Some(hidden),
                sample_rate: Some(24000),
                ..SpeakerEncoderConfig::default()
            }
        } else {
            SpeakerEncoderConfig::default()
        };
        CheckpointConfig {
            tts: TtsConfig {
                tts_model_size: if large { "1b7" } else { "0b6" }.into(),
                tts_model_type: ty,
                tokenizer_type: "qwen3_tts_tokenizer_12hz".into(),
                im_start_token_id: 151644,
                im_end_token_id: 151645,
                assistant_token_id: 77091,
                tts_pad_token_id: 151671,
                tts_bos_token_id: 151672,
                tts_eos_token_id: 151673,
                speaker_encoder_config,
                talker_config: TalkerConfig {
                    hidden_size: hidden,
                    num_hidden_layers: 28,
                    num_attention_heads: 16,
                    num_key_value_heads: 8,
                    head_dim: 128,
                    intermediate_size: inter,
                    rms_norm_eps: 1e-6,
                    rope_theta: 1e6,
                    rope_scaling: RopeScaling {
                        interleaved: true,
                        mrope_section: vec![24, 20, 20],
                        rope_type: Some("default".into()),
                        kind: Some("default".into()),
                    },
                    max_position_embeddings: 32768,
                    vocab_size: 3072,
                    text_vocab_size: 151936,
                    text_hidden_size: 2048,
                    num_code_groups: 16,
                    codec_pad_id: 2148,
                    codec_bos_id: 2149,
                    codec_eos_token_id: 2150,
                    codec_think_id: 2154,
                    codec_nothink_id: 2155,
                    codec_think_bos_id: 2156,
                    codec_think_eos_id: 2157,
                    codec_language_id: languages,
                    spk_id,
                    spk_is_dialect,
                    code_predictor_config: CodePredictorConfig {
                        hidden_size: 1024,
                        num_hidden_layers: 5,
                        num_attention_heads: 16,
                        num_key_value_heads: 8,
                        head_dim: 128,
                        intermediate_size: 3072,
                        rms_norm_eps: 1e-6,
                        rope_theta: 1e6,
                        vocab_size: 2048,
                        num_code_groups: 16,
                        max_position_embeddings: 65536,
                    },
                },
            },
            generation: GenerationConfig {
                do_sample: true,
                temperature: 0.9,
                top_k: 50,
                top_p: 1.0,
                repetition_penalty: 1.05,
                subtalker_dosample: true,
                subtalker_temperature: 0.9,
                subtalker_top_k: 50,
                subtalker_top_p: 1.0,
                max_new_tokens: 8192,
            },
            speech_tokenizer: SpeechTokenizerConfig {
                output_sample_rate: 24000,
                decode_upsample_rate: 1920,
                input_sample_rate: 24000,
                encode_downsample_rate: 1920,
                decoder_config: DecoderConfig {
                    codebook_size: 2048,
                    codebook_dim: 512,
                    latent_dim: 1024,
                    decoder_dim: 1536,
                    hidden_size: 512,
                    intermediate_size: 1024,
                    num_hidden_layers: 8,
                    num_attention_heads: 16,
                    num_key_value_heads: 16,
                    head_dim: 64,
                    rms_norm_eps: 1e-5,
                    rope_theta: 1e4,
                    sliding_window: 72,
                    num_quantizers: 16,
                    num_semantic_quantizers: 1,
                    upsample_rates: vec![8, 5, 4, 3],
                    upsampling_ratios: vec![2, 2],
                    max_position_embeddings: 8000,
                    layer_scale_initial_scale: 0.01,
                },
                encoder_config: Some(EncoderConfig {
                    sampling_rate: 24000,
                    audio_channels: 1,
                    hidden_size: 512,
                    num_filters: 64,
                    num_residual_layers: 1,
                    upsampling_ratios: vec![8, 6, 5, 4],
                    kernel_size: 7,
                    last_kernel_size: 3,
                    residual_kernel_size: 3,
                    dilation_growth_rate: 2,
                    use_causal_conv: true,
                    pad_mode: "constant".into(),
                    compress: 2,
                    use_conv_shortcut: false,
                    codebook_size: 2048,
                    codebook_dim: 256,
                    num_quantizers: 32,
                    vector_quantization_hidden_dimension: 256,
                    num_semantic_quantizers: 1,
                    num_hidden_layers: 8,
                    intermediate_size: 2048,
                    num_attention_heads: 8,
                    num_key_value_heads: 8,
                    head_dim: 64,
                    hidden_act: "gelu".into(),
                    norm_eps: 1e-5,
                    rope_theta: 1e4,
                }),
                encoder_valid_num_quantizers: Some(16),
            },
        }
    }
}
