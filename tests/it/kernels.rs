//! The kernel layer's invariant, checked on the sources: every `std::arch` intrinsic,
//! `#[target_feature]` function and inline `asm!` of the crate lives under `src/kernels/`
//! (ARCHITECTURE.md), so one policy (`qtts::kernels::Tier`) decides what runs.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn cpu_specific_code_lives_under_src_kernels() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let kernels = root.join("src/kernels");
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    assert!(files.len() > 20, "{} source files", files.len());
    let mut inside = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let hits: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .filter(|l| {
                ["std::arch", "core::arch", "target_feature(", "asm!("]
                    .iter()
                    .any(|k| l.contains(k))
            })
            .collect();
        if f.starts_with(&kernels) {
            inside += hits.len();
        } else {
            assert!(
                hits.is_empty(),
                "{}: CPU-specific code outside src/kernels: {hits:?}",
                f.display()
            );
        }
    }
    // The check sees the kernels' own uses (it would pass vacuously if it matched nothing).
    assert!(inside > 20, "{inside} uses under src/kernels");
}
