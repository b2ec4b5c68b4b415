//! The full-size random-weight model the benches run on.

use std::path::{Path, PathBuf};

use qtts::model::config::Preset;
use qtts::model::convert::{convert, OutType};

/// A directory with `mmproj-<type>.gguf` (and `talker-<type>.gguf`) for each of `types`:
/// `QTTS_BENCH_MODELS` when set, else made once under the target directory with
/// `random-model --preset 0.6b-customvoice` and `convert` (minutes, and GBs of disk).
pub fn models(types: &[OutType]) -> PathBuf {
    if let Some(dir) = std::env::var_os("QTTS_BENCH_MODELS") {
        return dir.into();
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    let dir = target.join("qtts-bench").join("0.6b-customvoice");
    let ckpt = dir.join("checkpoint");
    if !ckpt.join("model.safetensors").exists() {
        let tok = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/qwen3-tts/tokenizer");
        eprintln!("writing a random 0.6B checkpoint into {}", ckpt.display());
        qtts::model::random::write_random_checkpoint(
            Preset::Small06CustomVoice,
            1,
            &tok,
            &ckpt,
            &mut |_, _| {},
        )
        .unwrap();
    }
    for &ty in types {
        if !dir.join(format!("mmproj-{}.gguf", ty.name())).exists() {
            eprintln!("converting to {}", ty.name());
            convert(&ckpt, None, &dir, ty, &mut |_, _| {}).unwrap();
        }
    }
    dir
}
