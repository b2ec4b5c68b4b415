//! Paths shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// `tests/fixtures/<name>`: the oracle's outputs committed with the project.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(name)
}

/// `../shared/<rel>`: the published configs and tokenizer, which stay outside the project.
pub fn shared(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("shared")
        .join(rel)
}

/// GPT-2's byte-to-character map (the byte-level BPE alphabet of Qwen2's vocab.json).
pub fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap();
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + n).unwrap();
            n += 1;
        }
    }
    printable.clear();
    chars
}

/// Writes a small byte-level BPE tokenizer for the tiny fixtures (text vocab 1024, special ids
/// from the fixture's manifest: im_start 1000 … tts_eos 1006) into `dir`.
pub fn tiny_tokenizer(dir: &std::path::Path) {
    let chars = byte_chars();
    let mut vocab = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), i.into());
    }
    vocab.insert("as".into(), 256.into());
    vocab.insert("assistant".into(), 1002.into());
    vocab.insert("Ċ".into(), 1003.into());
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("vocab.json"),
        serde_json::Value::Object(vocab).to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("merges.txt"), "#version: 0.2\na s\n").unwrap();
    let added = serde_json::json!({
        "added_tokens_decoder": {
            "1000": {"content": "<|im_start|>", "special": true},
            "1001": {"content": "<|im_end|>", "special": true},
            "1004": {"content": "<tts_pad>", "special": true},
            "1005": {"content": "<tts_text_bos>", "special": true},
            "1006": {"content": "<tts_text_eod>", "special": true}
        }
    });
    std::fs::write(dir.join("tokenizer_config.json"), added.to_string()).unwrap();
}
