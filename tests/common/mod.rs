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

/// Converts fixture `name` (`tiny`, `tiny17`) to GGUF at `ty` in a temporary directory.
pub fn convert_tiny(
    name: &str,
    ty: qtts::model::convert::OutType,
) -> (tempfile::TempDir, qtts::model::convert::Converted) {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("tokenizer");
    tiny_tokenizer(&tok);
    let model = fixture(name).join("model");
    let out = qtts::model::convert::convert(
        &model,
        Some(&tok),
        &tmp.path().join("out"),
        ty,
        &mut |_, _| {},
    )
    .unwrap();
    (tmp, out)
}

/// The f32 (or int64, converted) tensors of an oracle safetensors file.
pub fn oracle(path: &std::path::Path) -> std::collections::HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            let f = match v.dtype() {
                safetensors::Dtype::F32 => v
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                safetensors::Dtype::I64 => v
                    .data()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
                    .collect(),
                d => panic!("{n}: {d:?}"),
            };
            (n, f)
        })
        .collect()
}

/// The largest absolute difference of two equal-length slices.
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
