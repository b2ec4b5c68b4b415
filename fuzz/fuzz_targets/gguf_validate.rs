//! Fuzzes the GGUF gate: the parser, then the Qwen3-TTS checks of both file kinds, on any bytes.
//! Run with: `cargo fuzz run gguf_validate fuzz/seeds -- -max_total_time=600 -rss_limit_mb=2048`
//! (seeds: `cargo run --release --example fuzz_seeds -- fuzz/seeds`).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = std::path::Path::new("fuzz.gguf");
    if let Ok(h) = qtts::gguf::parse(data, path) {
        let _ = qtts::model::validate::check_talker(path, &h);
        let _ = qtts::model::validate::check_mmproj(path, &h);
    }
});
