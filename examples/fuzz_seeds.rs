//! This example demonstrates: writing a seed corpus for the GGUF fuzzer from the tiny fixtures.
//!
//! Run with: `cargo run --release --example fuzz_seeds -- fuzz/seeds`
//! It converts `tests/fixtures/tiny` and `tiny17` at q8_0 with the tiny tokenizer and copies the
//! resulting talker and mmproj files into the given directory.

use std::path::PathBuf;

use anyhow::Context as _;
use qtts::model::convert::{convert, OutType};

fn main() -> anyhow::Result<()> {
    let out: PathBuf = std::env::args()
        .nth(1)
        .context("usage: fuzz_seeds OUT_DIR")?
        .into();
    std::fs::create_dir_all(&out)?;
    let tmp = std::env::temp_dir().join(format!("qtts-seeds-{}", std::process::id()));
    let tok = tmp.join("tokenizer");
    qtts::model::testing::write_tiny_tokenizer(&tok)?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for name in ["tiny", "tiny17"] {
        let c = convert(
            &root.join(name).join("model"),
            Some(&tok),
            &tmp.join(name),
            OutType::Q8_0,
            &mut |_, _| {},
        )?;
        std::fs::copy(&c.talker, out.join(format!("{name}-talker.gguf")))?;
        std::fs::copy(&c.mmproj, out.join(format!("{name}-mmproj.gguf")))?;
    }
    std::fs::remove_dir_all(&tmp)?;
    println!("seeds written to {}", out.display());
    Ok(())
}
