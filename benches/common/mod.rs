//! The full-size random-weight model the benches run on.

use std::path::{Path, PathBuf};

use qtts::model::config::Preset;
use qtts::model::convert::OutType;

/// A directory with `mmproj-<type>.gguf` (and `talker-<type>.gguf`) for each of `types`:
/// `QTTS_BENCH_MODELS` when set, else made once under the target directory with
/// [`qtts::model::random::ensure_models`] for the 0.6B CustomVoice geometry (minutes, and GBs of disk).
#[allow(dead_code)]
pub fn models(types: &[OutType]) -> PathBuf {
    if let Some(dir) = std::env::var_os("QTTS_BENCH_MODELS") {
        return dir.into();
    }
    models_for(Preset::Small06CustomVoice, "0.6b-customvoice", types)
}

/// As [`models`], for another geometry, under the target directory's `qtts-bench/<name>`.
pub fn models_for(preset: Preset, name: &str, types: &[OutType]) -> PathBuf {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    let dir = target.join("qtts-bench").join(name);
    let tok = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/released");
    qtts::model::random::ensure_models(preset, Some(&tok), &dir, types, &mut |what, _, total| {
        if total == 0 {
            eprintln!("bench models: {what} in {}", dir.display());
        }
    })
    .unwrap();
    dir
}

/// The median of `v` (the upper of the middle two for an even count, as `qtts bench`); NaN for
/// none.
#[allow(dead_code)]
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
