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

/// Writes the tiny fixtures' tokenizer into `dir` (see `qtts::model::testing`).
pub fn tiny_tokenizer(dir: &std::path::Path) {
    qtts::model::testing::write_tiny_tokenizer(dir).unwrap();
}
