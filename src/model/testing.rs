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
