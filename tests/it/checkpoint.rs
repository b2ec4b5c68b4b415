//! The checkpoint reader against the oracle's tiny checkpoints and the published configs.

use crate::common;

use qtts::model::checkpoint::{expected_tensors, Checkpoint};
use qtts::model::config::{CheckpointConfig, ModelType};
use qtts::ModelError;

/// Every tensor the engine reads is present with its shape, and every `decoder.*` / `talker.*`
/// tensor of the files is one the spec lists (the spec is complete, not just consistent).
#[test]
fn tiny_checkpoints_match_the_spec_exactly() {
    for name in ["tiny", "tiny17"] {
        let dir = common::fixture(name).join("model");
        let ckpt = Checkpoint::open(&dir).unwrap();
        let listed: std::collections::HashSet<_> =
            ckpt.specs().iter().map(|s| s.name.clone()).collect();
        for file in ["model.safetensors", "speech_tokenizer/model.safetensors"] {
            let bytes = std::fs::read(dir.join(file)).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for n in st.names() {
                if n.starts_with("talker.") || n.starts_with("decoder.") {
                    assert!(listed.contains(n), "{name}: {n} is not in the spec");
                }
            }
        }
        let proj = listed.contains("talker.code_predictor.small_to_mtp_projection.weight");
        assert_eq!(
            proj,
            name == "tiny17",
            "{name}: projection iff the CP is narrower"
        );
    }
}

/// The published configs of all five checkpoints parse and pass the consistency checks,
/// with the facts of MODEL-NOTES.md §2.
#[test]
fn published_configs_parse() {
    let root = common::fixture("configs");
    for (name, hidden, ty, speakers) in [
        ("Qwen3-TTS-12Hz-0.6B-Base", 1024, ModelType::Base, 0),
        (
            "Qwen3-TTS-12Hz-0.6B-CustomVoice",
            1024,
            ModelType::CustomVoice,
            9,
        ),
        ("Qwen3-TTS-12Hz-1.7B-Base", 2048, ModelType::Base, 0),
        (
            "Qwen3-TTS-12Hz-1.7B-CustomVoice",
            2048,
            ModelType::CustomVoice,
            9,
        ),
        (
            "Qwen3-TTS-12Hz-1.7B-VoiceDesign",
            2048,
            ModelType::VoiceDesign,
            0,
        ),
    ] {
        let cfg = CheckpointConfig::read(&root.join(name)).unwrap();
        let t = &cfg.tts.talker_config;
        assert_eq!(t.hidden_size, hidden, "{name}");
        assert_eq!(cfg.tts.tts_model_type, ty, "{name}");
        assert_eq!(t.spk_id.len(), speakers, "{name}");
        assert_eq!(t.code_predictor_config.hidden_size, 1024, "{name}");
        assert_eq!(t.code_predictor_config.num_hidden_layers, 5, "{name}");
        assert_eq!(t.num_hidden_layers, 28, "{name}");
        assert_eq!(t.codec_eos_token_id, 2150, "{name}");
        assert_eq!(cfg.tts.tts_pad_token_id, 151671, "{name}");
        assert_eq!(
            cfg.speech_tokenizer.decoder_config.sliding_window, 72,
            "{name}"
        );
        assert_eq!(cfg.generation.max_new_tokens, 8192, "{name}");
        // 0.6B ≈ 906 M parameters, 1.7B ≈ 1.92 B (MODEL-NOTES.md §3), talker file only.
        let params: u64 = expected_tensors(&cfg)
            .iter()
            .filter(|s| s.name.starts_with("talker."))
            .map(|s| s.shape.iter().product::<u64>())
            .sum();
        let expect = if hidden == 1024 { 906e6 } else { 1.92e9 };
        assert!(
            (params as f64 - expect).abs() / expect < 0.01,
            "{name}: {params}"
        );
    }
}

/// A missing or mistyped field is named with its full path and the file.
#[test]
fn config_errors_name_file_and_field() {
    let src = std::fs::read_to_string(common::fixture("tiny").join("model/config.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&src).unwrap();
    v["talker_config"]["code_predictor_config"]
        .as_object_mut()
        .unwrap()
        .remove("head_dim");
    let err = qtts::model::config::parse_json::<qtts::model::config::TtsConfig>(
        &v.to_string(),
        std::path::Path::new("x/config.json"),
    )
    .unwrap_err();
    match err {
        ModelError::BadField { field, path, .. } => {
            assert_eq!(field, "talker_config.code_predictor_config.head_dim");
            assert_eq!(path, std::path::Path::new("x/config.json"));
        }
        e => panic!("wrong error {e:?}"),
    }
    v["talker_config"]["code_predictor_config"]["head_dim"] = "big".into();
    let err = qtts::model::config::parse_json::<qtts::model::config::TtsConfig>(
        &v.to_string(),
        std::path::Path::new("x/config.json"),
    )
    .unwrap_err();
    assert!(
        matches!(&err, ModelError::BadField { field, expected, .. }
            if field == "talker_config.code_predictor_config.head_dim" && expected == "u32"),
        "{err:?}"
    );
}

/// The configs `qtts random-model` writes are the published ones, field for field.
#[test]
fn presets_equal_the_published_configs() {
    use qtts::model::config::Preset;
    let root = common::fixture("configs");
    for p in [
        Preset::Small06CustomVoice,
        Preset::Small06Base,
        Preset::Large17CustomVoice,
        Preset::Large17Base,
        Preset::Large17VoiceDesign,
    ] {
        let published = CheckpointConfig::read(&root.join(p.hf_name())).unwrap();
        assert_eq!(p.config(), published, "{}", p.hf_name());
        // And what it writes reads back the same.
        let tmp = tempfile::tempdir().unwrap();
        p.config().write(tmp.path()).unwrap();
        assert_eq!(
            CheckpointConfig::read(tmp.path()).unwrap(),
            published,
            "{}",
            p.hf_name()
        );
    }
}
