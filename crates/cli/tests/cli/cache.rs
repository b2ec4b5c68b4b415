//! The conversion cache through the `qtts` binary (`model::cache`): checkpoints that share a
//! directory name, a checkpoint changed in place, `--exact` from a checkpoint against the oracle,
//! an unwritable cache, a full disk, two processes converting at once, and `qtts cache`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::max_abs;
use qtts::model::config::Preset;

/// `qtts args` with `cache` as its cache directory.
fn qtts(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qtts"))
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes a tiny random-weight checkpoint of `seed` (with its tokenizer files) into `dir`.
fn checkpoint(dir: &Path, seed: u64) {
    let cfg = qtts::model::testing::tiny_config(Preset::Small06CustomVoice, true);
    let tok = dir.with_extension("tokenizer");
    common::tiny_tokenizer(&tok);
    qtts::model::random::write_random_checkpoint_with(&cfg, seed, &tok, dir, &mut |_, _| {})
        .unwrap();
    common::tiny_tokenizer(dir);
}

/// The greedy codes of three frames of "Hello." from `model`, through `qtts synth`.
fn codes(model: &Path, cache: &Path) -> (Vec<Vec<u32>>, String) {
    let out = tempfile::tempdir().unwrap();
    let (wav, json) = (out.path().join("x.wav"), out.path().join("x.json"));
    let r = qtts(
        &[
            "synth",
            "Hello.",
            "--model",
            model.to_str().unwrap(),
            "--greedy",
            "--max-frames",
            "3",
            "--out",
            wav.to_str().unwrap(),
            "--codes-out",
            json.to_str().unwrap(),
        ],
        cache,
    );
    assert!(r.status.success(), "{}", stderr(&r));
    let codes = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (codes, stderr(&r))
}

/// The cache's entries as `qtts cache list` prints them (one line each).
fn listed(cache: &Path) -> Vec<String> {
    let r = qtts(&["cache", "list"], cache);
    assert!(r.status.success(), "{}", stderr(&r));
    String::from_utf8_lossy(&r.stdout)
        .lines()
        .filter(|l| l.contains(" from "))
        .map(str::to_owned)
        .collect()
}

/// Nothing under the cache's directory looks like a half-written conversion.
fn no_partials(cache: &Path) {
    let root = cache.join("qtts/converted");
    let Ok(rd) = std::fs::read_dir(&root) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(!name.contains(".partial"), "left behind: {name}");
    }
}

/// The codes of `ckpt` converted directly (`qtts convert`), not through the cache.
fn direct(ckpt: &Path, cache: &Path) -> Vec<Vec<u32>> {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("gguf");
    let r = qtts(
        &[
            "convert",
            ckpt.to_str().unwrap(),
            dir.to_str().unwrap(),
            "--type",
            "q8_0",
        ],
        cache,
    );
    assert!(r.status.success(), "{}", stderr(&r));
    codes(&dir, cache).0
}

#[test]
fn same_named_checkpoints_and_a_changed_one_each_give_their_own_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (a, b) = (tmp.path().join("a/model"), tmp.path().join("b/model"));
    checkpoint(&a, 1);
    checkpoint(&b, 2);
    let (ca, err) = codes(&a, &cache);
    assert!(err.contains("converting"), "{err}");
    let (cb, _) = codes(&b, &cache);
    assert_ne!(ca, cb, "two checkpoints named `model`, one conversion");
    assert_eq!(ca, direct(&a, &cache));
    assert_eq!(cb, direct(&b, &cache));
    assert_eq!(listed(&cache).len(), 2, "{:?}", listed(&cache));
    // The second use converts nothing.
    let (again, err) = codes(&a, &cache);
    assert_eq!(again, ca);
    assert!(!err.contains("qtts: converting"), "{err}");

    // `a` rewritten in place with other weights: converted again, the old conversion removed.
    std::fs::remove_dir_all(&a).unwrap();
    checkpoint(&a, 3);
    let (c3, err) = codes(&a, &cache);
    assert!(err.contains("qtts: converting"), "{err}");
    assert!(err.contains("changed since it was converted"), "{err}");
    assert_ne!(c3, ca);
    assert_eq!(c3, direct(&a, &cache));
    assert_eq!(listed(&cache).len(), 2, "{:?}", listed(&cache));
    no_partials(&cache);

    // `qtts cache clear` removes them all.
    let r = qtts(&["cache", "clear"], &cache);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(String::from_utf8_lossy(&r.stdout).contains("MiB freed"));
    assert!(listed(&cache).is_empty());
}

/// An entry whose files do not carry the checkpoint's identity (replaced by hand, or from an
/// older converter) is not trusted: it is converted again, with a line saying why.
#[test]
fn a_foreign_entry_is_converted_again() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (a, b) = (tmp.path().join("a/model"), tmp.path().join("b/model"));
    checkpoint(&a, 1);
    checkpoint(&b, 2);
    let (ca, _) = codes(&a, &cache);
    // Put b's conversion in a's entry.
    let entry = PathBuf::from(listed(&cache)[0].split_whitespace().nth(3).unwrap());
    let out = tmp.path().join("b-gguf");
    let r = qtts(
        &[
            "convert",
            b.to_str().unwrap(),
            out.to_str().unwrap(),
            "--type",
            "q8_0",
        ],
        &cache,
    );
    assert!(r.status.success(), "{}", stderr(&r));
    for f in ["talker-q8_0.gguf", "mmproj-q8_0.gguf"] {
        std::fs::copy(out.join(f), entry.join(f)).unwrap();
    }
    let (again, err) = codes(&a, &cache);
    assert!(err.contains("does not match"), "{err}");
    assert_eq!(again, ca);
}

/// `--exact` with a checkpoint converts it to f32 (an entry of its own) and reproduces the
/// oracle; `--exact` with quantized files is refused, not run inexactly.
#[test]
fn exact_from_a_checkpoint_reproduces_the_oracle_and_quantized_files_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let ckpt = tmp.path().join("tiny");
    copy_dir(&common::fixture("tiny").join("model"), &ckpt);
    common::tiny_tokenizer(&ckpt);
    let o = common::oracle(&common::fixture("tiny").join("oracle/generate_stream.safetensors"));
    let ids: Vec<String> = o["input_ids"]
        .iter()
        .map(|&x| (x as u32).to_string())
        .collect();
    let ids = ids.join(",");
    let frames = (o["codes"].len() / 16).to_string();
    let (wav, json) = (tmp.path().join("x.wav"), tmp.path().join("x.json"));
    let run = |model: &Path| {
        qtts(
            &[
                "synth",
                "--sample-format",
                "f32",
                "--model",
                model.to_str().unwrap(),
                "--token-ids",
                &ids,
                "--speaker",
                "vivian",
                "--language",
                "english",
                "--greedy",
                "--exact",
                "--max-frames",
                &frames,
                "--out",
                wav.to_str().unwrap(),
                "--codes-out",
                json.to_str().unwrap(),
            ],
            &cache,
        )
    };
    let r = run(&ckpt);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(stderr(&r).contains("to f32"), "{}", stderr(&r));
    let got: Vec<Vec<u32>> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let got: Vec<f32> = got.iter().flatten().map(|&c| c as f32).collect();
    assert_eq!(got, o["codes"]);
    let samples: Vec<f32> = hound::WavReader::open(&wav)
        .unwrap()
        .samples::<f32>()
        .map(Result::unwrap)
        .collect();
    let e = max_abs(&samples, &o["wav"]);
    assert!(e < 1e-4, "wav off by {e}");
    assert!(listed(&cache)[0].contains("f32"), "{:?}", listed(&cache));

    // The same checkpoint without --exact: its own q8_0 entry beside the f32 one.
    codes(&ckpt, &cache);
    assert_eq!(listed(&cache).len(), 2);

    // Quantized files with --exact: refused, with what to do.
    let q8 = tmp.path().join("q8");
    let r = qtts(
        &[
            "convert",
            ckpt.to_str().unwrap(),
            q8.to_str().unwrap(),
            "--type",
            "q8_0",
        ],
        &cache,
    );
    assert!(r.status.success(), "{}", stderr(&r));
    let r = run(&q8);
    assert!(!r.status.success());
    let err = stderr(&r);
    assert!(err.contains("--exact") && err.contains("f32"), "{err}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

/// A cache that cannot be written (here its path is a file: root ignores permissions) is a clear
/// error with what to do, and nothing is converted anywhere else.
#[test]
fn an_unwritable_cache_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("model");
    checkpoint(&ckpt, 1);
    let cache = tmp.path().join("not-a-dir");
    std::fs::write(&cache, b"a file").unwrap();
    let out = tmp.path().join("x.wav");
    let r = qtts(
        &[
            "synth",
            "Hello.",
            "--model",
            ckpt.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        &cache,
    );
    assert!(!r.status.success());
    let err = stderr(&r);
    assert!(err.contains("conversion cache cannot be written"), "{err}");
    assert!(err.contains("XDG_CACHE_HOME"), "{err}");
    assert!(!out.exists());
}

/// A conversion that runs out of space (here the process's file-size limit, `ulimit -f`, with
/// SIGXFSZ ignored so that the write fails as on a full disk) is a clear error and leaves
/// nothing a later run would trust; the next run, with room, converts and speaks.
#[test]
fn a_full_disk_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("model");
    checkpoint(&ckpt, 1);
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("x.wav");
    let script = format!(
        "trap '' XFSZ; ulimit -f 64; exec '{}' synth Hello. --model '{}' --out '{}'",
        env!("CARGO_BIN_EXE_qtts"),
        ckpt.display(),
        out.display()
    );
    let r = Command::new("sh")
        .args(["-c", &script])
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .unwrap();
    assert!(!r.status.success());
    let err = stderr(&r);
    assert!(err.contains("the disk is full"), "{err}");
    assert!(err.contains("nothing of the conversion was kept"), "{err}");
    no_partials(&cache);
    assert!(listed(&cache).is_empty(), "{:?}", listed(&cache));
    let (_, err) = codes(&ckpt, &cache);
    assert!(err.contains("converting"), "{err}");
    assert_eq!(listed(&cache).len(), 1);
}

/// Two processes using the same new checkpoint at once: one converts, the other waits for it and
/// uses its files.
#[test]
fn concurrent_first_uses_convert_once() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("model");
    checkpoint(&ckpt, 1);
    let cache = tmp.path().join("cache");
    let run = |n: usize| {
        let wav = tmp.path().join(format!("{n}.wav"));
        Command::new(env!("CARGO_BIN_EXE_qtts"))
            .args([
                "synth",
                "Hello.",
                "--greedy",
                "--max-frames",
                "2",
                "--model",
                ckpt.to_str().unwrap(),
                "--out",
                wav.to_str().unwrap(),
            ])
            .env("XDG_CACHE_HOME", &cache)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (p1, p2) = (run(1), run(2));
    let (r1, r2) = (
        p1.wait_with_output().unwrap(),
        p2.wait_with_output().unwrap(),
    );
    assert!(r1.status.success(), "{}", stderr(&r1));
    assert!(r2.status.success(), "{}", stderr(&r2));
    let conversions = [&r1, &r2]
        .iter()
        .filter(|r| stderr(r).contains("qtts: converting"))
        .count();
    assert_eq!(conversions, 1, "{}\n---\n{}", stderr(&r1), stderr(&r2));
    assert_eq!(listed(&cache).len(), 1);
    no_partials(&cache);
}
