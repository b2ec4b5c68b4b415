//! The committed header is what cbindgen makes from the crate today.

use std::path::Path;

#[test]
fn committed_header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).unwrap();
    let mut made = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads src/lib.rs")
        .write(&mut made);
    let path = dir.join("include/qtts.h");
    if std::env::var_os("QTTS_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &made).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == made,
        "{} is stale: regenerate it with `QTTS_BLESS=1 cargo test --release -p qtts-c --test header` and commit it",
        path.display()
    );
}
