//! The source tree's invariants, checked on the sources. The kernel layer: every `std::arch` intrinsic,
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
    let root = &crate::common::root();
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

/// The library's modules from the bottom up: a module may use only modules of lower layers, so
/// imports run one way (ARCHITECTURE.md, "Layers"). Test modules and comments are not imports.
const LAYERS: &[&[&str]] = &[
    &["error", "sync"],
    &["gguf"],
    &["kernels"],
    &["ffi"],
    &["text"],
    &["model"],
    &["sampling", "qwen3", "audio", "metrics", "hub"],
    &["code_predictor", "decoder"],
    &["talker"],
    &["synth", "voice"],
    &["engine"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The source without comments and without its `#[cfg(test)]` modules (tests may compare with
/// any layer).
fn code_of(text: &str) -> String {
    let code: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let t = code[i].trim_start();
        let test_mod = (t.starts_with("#[cfg(test)]") || t.starts_with("#[cfg(all(test"))
            && code[i + 1..]
                .iter()
                .find(|l| !l.trim_start().starts_with("#["))
                .is_some_and(|l| l.contains("mod ") && l.trim_end().ends_with('{'));
        if !test_mod {
            out.push(code[i]);
            i += 1;
            continue;
        }
        // Skip to the brace that closes the module.
        let mut depth = 0i32;
        let mut opened = false;
        while i < code.len() && !(opened && depth == 0) {
            for c in code[i].chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            i += 1;
        }
    }
    out.join("\n")
}

/// The crate's modules each module of `src/<top>` names, `crate::x` and `crate::{x, y}` alike.
fn uses(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let close = group.find('}').unwrap_or(group.len());
            for part in group[..close].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.push(name);
            }
        } else {
            out.push(
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
    }
    out
}

#[test]
fn imports_run_one_way_from_error_up_to_engine() {
    let root = crate::common::root().join("src");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap();
        let top = rel.iter().next().unwrap().to_string_lossy();
        let top = top.trim_end_matches(".rs");
        if top == "lib" {
            continue;
        }
        let Some(own) = layer_of(top) else {
            panic!("{}: module `{top}` is in no layer of LAYERS", rel.display());
        };
        for used in uses(&code_of(&std::fs::read_to_string(f).unwrap())) {
            // `crate::ModelError` and the like: the crate root's re-exports of `error`.
            let used = if used.chars().next().is_some_and(|c| c.is_uppercase()) {
                "error".to_string()
            } else {
                used
            };
            if used == top {
                continue;
            }
            let Some(theirs) = layer_of(&used) else {
                panic!(
                    "{}: uses `crate::{used}`, in no layer of LAYERS",
                    rel.display()
                );
            };
            assert!(
                theirs < own,
                "{}: `{top}` (layer {own}) uses `crate::{used}` (layer {theirs}): imports run \
                 from error up to engine only",
                rel.display()
            );
            checked += 1;
        }
    }
    assert!(
        checked > 100,
        "only {checked} imports seen: is the parser right?"
    );
}

#[test]
fn no_source_file_is_a_grab_bag() {
    const MOST_LINES: usize = 800;
    let root = &crate::common::root();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("tests"), &mut files);
    // The other crates of the workspace (command, C ABI, Python, server) too.
    rust_files(&root.join("crates"), &mut files);
    for f in &files {
        let n = std::fs::read_to_string(f).unwrap().lines().count();
        assert!(
            n <= MOST_LINES,
            "{}: {n} lines, over {MOST_LINES}: split it by responsibility",
            f.display()
        );
    }
}

#[test]
fn every_unsafe_fn_says_what_its_caller_must_uphold() {
    let root = &crate::common::root();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut seen = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let declares = !t.starts_with("//")
                && !t.contains("= unsafe fn")
                && (t.contains("unsafe fn ") || t.contains("unsafe extern \"C\" fn "))
                && ["unsafe", "pub ", "pub(", "const "]
                    .iter()
                    .any(|p| t.starts_with(p));
            if !declares {
                continue;
            }
            seen += 1;
            let doc = lines[..i]
                .iter()
                .rev()
                .take_while(|l| {
                    let t = l.trim_start();
                    t.starts_with("///")
                        || t.starts_with("#[")
                        || t.starts_with(')')
                        || t.starts_with("not(")
                        || t.starts_with("allow(")
                })
                .any(|l| l.contains("# Safety"));
            assert!(
                doc,
                "{}:{}: `unsafe fn` without a `# Safety` section in its docs",
                f.display(),
                i + 1
            );
        }
    }
    assert!(
        seen > 40,
        "only {seen} unsafe fns seen: is the parser right?"
    );
}
