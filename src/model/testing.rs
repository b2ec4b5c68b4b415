//! Small model files for tests, fuzzing and examples, made without any download.

use std::path::Path;

use crate::error::ModelError;

/// Writes a byte-level BPE tokenizer (`vocab.json`, `merges.txt`, `tokenizer_config.json`) for the
/// oracle's tiny checkpoints into `dir`: 256 byte tokens, the merges that spell `assistant`,
/// `assistant` and `\n` at the ids the tiny
/// configs use (1002, 1003), and the specials `<|im_start|>` 1000, `<|im_end|>` 1001, `<tts_pad>`
/// 1004, `<tts_text_bos>` 1005, `<tts_text_eod>` 1006 (`tests/fixtures/tiny/manifest.json`).
pub fn write_tiny_tokenizer(dir: &Path) -> Result<(), ModelError> {
    let mut vocab = serde_json::Map::new();
    for (i, c) in crate::text::bpe::byte_chars().iter().enumerate() {
        vocab.insert(c.to_string(), i.into());
    }
    // Merges that spell `assistant` (as the real vocabulary's do), so that wrapped text tokenizes
    // to the ids the configs name.
    let pieces = [
        "as", "ass", "assi", "assis", "assist", "assista", "assistan",
    ];
    for (i, p) in pieces.iter().enumerate() {
        vocab.insert((*p).into(), (256 + i).into());
    }
    vocab.insert("assistant".into(), 1002.into());
    vocab.insert("Ċ".into(), 1003.into());
    let added = serde_json::json!({
        "added_tokens_decoder": {
            "1000": {"content": "<|im_start|>", "special": true},
            "1001": {"content": "<|im_end|>", "special": true},
            "1004": {"content": "<tts_pad>", "special": true},
            "1005": {"content": "<tts_text_bos>", "special": true},
            "1006": {"content": "<tts_text_eod>", "special": true}
        }
    });
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, "create_dir", e))?;
    for (name, text) in [
        ("vocab.json", serde_json::Value::Object(vocab).to_string()),
        (
            "merges.txt",
            "#version: 0.2\na s\nas s\nass i\nassi s\nassis t\nassist a\nassista n\nassistan t\n"
                .to_owned(),
        ),
        ("tokenizer_config.json", added.to_string()),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| ModelError::io(&path, "write", e))?;
    }
    Ok(())
}

/// `preset`'s configs with a tiny talker and code predictor (widths 64 and 48, 2 layers each, text
/// vocabulary 1024 with the tiny tokenizer's special ids, as the oracle's tiny fixtures), and,
/// when `small_decoder`, a decoder of the same structure but widths 16 to 64 and 2 layers (the
/// full-size one otherwise). Random weights in this geometry are the built-in default model.
pub fn tiny_config(
    preset: crate::model::config::Preset,
    small_decoder: bool,
) -> crate::model::config::CheckpointConfig {
    let mut cfg = preset.config();
    let t = &mut cfg.tts.talker_config;
    (
        t.hidden_size,
        t.num_hidden_layers,
        t.num_attention_heads,
        t.num_key_value_heads,
    ) = (64, 2, 4, 2);
    (
        t.head_dim,
        t.intermediate_size,
        t.text_vocab_size,
        t.text_hidden_size,
    ) = (32, 128, 1024, 96);
    t.rope_scaling.mrope_section = vec![6, 5, 5];
    let cp = &mut t.code_predictor_config;
    (
        cp.hidden_size,
        cp.num_hidden_layers,
        cp.num_attention_heads,
        cp.num_key_value_heads,
    ) = (48, 2, 4, 2);
    (cp.head_dim, cp.intermediate_size) = (32, 128);
    if cfg.tts.speaker_encoder_config.enc_dim.is_some() {
        cfg.tts.speaker_encoder_config.enc_dim = Some(64);
    }
    let tts = &mut cfg.tts;
    (
        tts.im_start_token_id,
        tts.im_end_token_id,
        tts.assistant_token_id,
    ) = (1000, 1001, 1002);
    (
        tts.tts_pad_token_id,
        tts.tts_bos_token_id,
        tts.tts_eos_token_id,
    ) = (1004, 1005, 1006);
    if small_decoder {
        let d = &mut cfg.speech_tokenizer.decoder_config;
        (d.codebook_dim, d.latent_dim, d.decoder_dim, d.hidden_size) = (16, 48, 64, 32);
        (d.intermediate_size, d.head_dim, d.num_hidden_layers) = (64, 4, 2);
    }
    cfg
}
