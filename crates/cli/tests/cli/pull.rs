//! `qtts pull` and `--model org/name` against a Hub on loopback (`fake_hub`): pull then speak,
//! a dropped connection resumed with the missing bytes only, a flipped byte refused, a gated
//! repository with and without a token, offline with a full and an empty cache, two processes
//! at once, a cache laid out as Python's, and repositories that are not checkpoints.

use crate::common;
use crate::fake_hub::{FakeHub, Faults, Repo};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use qtts::model::config::Preset;

const ID: &str = "qtts-test/tiny-customvoice";

/// A tiny random-weight checkpoint (with its tokenizer files), written once per test.
fn checkpoint(dir: &Path) -> PathBuf {
    let ckpt = dir.join("checkpoint");
    let cfg = qtts::model::testing::tiny_config(Preset::Small06CustomVoice, true);
    let tok = dir.join("tokenizer");
    common::tiny_tokenizer(&tok);
    qtts::model::random::write_random_checkpoint_with(&cfg, 7, &tok, &ckpt, &mut |_, _| {})
        .unwrap();
    common::tiny_tokenizer(&ckpt);
    ckpt
}

/// A temporary home: the checkpoint served, the Hub's cache and qtts's cache.
struct Home {
    dir: tempfile::TempDir,
    ckpt: PathBuf,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = checkpoint(dir.path());
        Home { dir, ckpt }
    }

    fn hf_home(&self) -> PathBuf {
        self.dir.path().join("hf")
    }

    fn repo_dir(&self) -> PathBuf {
        self.hf_home()
            .join("hub/models--qtts-test--tiny-customvoice")
    }

    /// `qtts args` against `hub`, with `env` on top.
    fn command(&self, hub: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_qtts"));
        c.args(args)
            .env("HF_HOME", self.hf_home())
            .env("HF_ENDPOINT", hub)
            .env("XDG_CACHE_HOME", self.dir.path().join("cache"))
            .env("RUST_BACKTRACE", "0")
            .current_dir(self.dir.path())
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_CACHE")
            .env_remove("HF_HUB_OFFLINE");
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    fn run(&self, hub: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        self.command(hub, args, env).output().unwrap()
    }

    /// The greedy samples of "Hello." from `model`.
    fn samples(&self, hub: &str, model: &str, env: &[(&str, &str)]) -> Result<Vec<f32>, String> {
        let out = self.dir.path().join("x.wav");
        let r = self.run(
            hub,
            &[
                "synth",
                "Hello.",
                "--model",
                model,
                "--greedy",
                "--max-frames",
                "3",
                "--sample-format",
                "f32",
                "--out",
                out.to_str().unwrap(),
            ],
            env,
        );
        if !r.status.success() {
            return Err(stderr(&r));
        }
        let mut wav = hound::WavReader::open(&out).unwrap();
        Ok(wav.samples::<f32>().map(|s| s.unwrap()).collect())
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", stderr(o));
    stderr(o)
}

fn failed(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure: {}", stderr(o));
    stderr(o)
}

/// Every file of `repo` is in the snapshot of its commit with its bytes, and no transfer is
/// left behind.
fn complete(home: &Home, repo: &Repo) {
    let snap = home.repo_dir().join("snapshots").join(&repo.commit);
    for f in &repo.files {
        assert_eq!(
            std::fs::read(snap.join(&f.name)).unwrap(),
            *f.bytes,
            "{}",
            f.name
        );
        assert!(home.repo_dir().join("blobs").join(f.hash()).is_file());
    }
    let main = std::fs::read_to_string(home.repo_dir().join("refs/main")).unwrap();
    assert_eq!(main, repo.commit);
    assert_eq!(incomplete(home), Vec::<String>::new());
}

/// The names of the `.incomplete` files under `blobs/`.
fn incomplete(home: &Home) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(home.repo_dir().join("blobs")) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".incomplete"))
        .collect()
}

#[test]
fn pull_then_speak_the_checkpoints_samples_with_no_request_after() {
    let home = Home::new();
    let repo = Repo::from_dir(ID, &home.ckpt);
    let hub = FakeHub::start(vec![repo.clone()]);
    let err = ok(&home.run(&hub.url, &["pull", ID], &[]));
    assert!(err.contains("verified"), "{err}");
    complete(&home, &repo);
    for f in &repo.files {
        assert_eq!(
            hub.sent(&f.name),
            f.bytes.len() as u64,
            "{} sent once",
            f.name
        );
    }
    let before = hub.requests();
    let pulled = home.samples(&hub.url, ID, &[]).unwrap();
    assert_eq!(
        hub.requests(),
        before,
        "a complete cache is used without a request"
    );
    let local = home
        .samples(&hub.url, home.ckpt.to_str().unwrap(), &[])
        .unwrap();
    assert!(!pulled.is_empty());
    assert_eq!(
        pulled, local,
        "the pulled checkpoint speaks as the checkpoint itself"
    );
    // `@<commit>` is found in the cache too, and offline mode makes no request either.
    let at = format!("{ID}@{}", repo.commit);
    ok(&home.run(
        &hub.url,
        &["pull", &at, "--no-convert"],
        &[("HF_HUB_OFFLINE", "1")],
    ));
    ok(&home.run(&hub.url, &["pull", ID, "--no-convert"], &[]));
    assert_eq!(hub.requests(), before);
}

#[test]
fn a_dropped_connection_resumes_with_the_missing_bytes_only() {
    let home = Home::new();
    let repo = Repo::from_dir(ID, &home.ckpt);
    let big = repo.file("model.safetensors").bytes.len() as u64;
    let hub = FakeHub::start(vec![repo.clone()]);
    // Within one run: dropped once, resumed by the retry.
    hub.set_faults(Faults {
        drop: Some(("model.safetensors".into(), 1, big / 3)),
        ..Faults::default()
    });
    let err = ok(&home.run(&hub.url, &["pull", ID, "--no-convert"], &[]));
    assert!(err.contains("resuming"), "{err}");
    assert_eq!(hub.sent("model.safetensors"), big);
    complete(&home, &repo);

    // Across runs: every retry dropped too, so the run stops; the next one resumes.
    let home = Home::new();
    let repo = Repo::from_dir(ID, &home.ckpt);
    let hub = FakeHub::start(vec![repo.clone()]);
    let k = big / 10;
    hub.set_faults(Faults {
        drop: Some(("model.safetensors".into(), 4, k)),
        ..Faults::default()
    });
    let err = failed(&home.run(&hub.url, &["pull", ID, "--no-convert"], &[]));
    assert!(err.contains("run the command again"), "{err}");
    let blob = home
        .repo_dir()
        .join("blobs")
        .join(repo.file("model.safetensors").hash());
    assert!(!blob.exists(), "a partial file is never a blob");
    let snap = home.repo_dir().join("snapshots").join(&repo.commit);
    assert!(!snap.join("model.safetensors").exists());
    let part = PathBuf::from(format!("{}.incomplete", blob.display()));
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 4 * k);
    let err = failed(&home.run(
        &hub.url,
        &["synth", "x", "--model", ID, "--out", "/dev/null"],
        &[("HF_HUB_OFFLINE", "1")],
    ));
    assert!(err.contains("model.safetensors"), "{err}");
    let err = ok(&home.run(&hub.url, &["pull", ID, "--no-convert"], &[]));
    assert!(err.contains("resuming at"), "{err}");
    assert_eq!(
        hub.sent("model.safetensors"),
        big,
        "only the missing bytes the second time"
    );
    complete(&home, &repo);
}

#[test]
fn a_flipped_byte_is_refused_and_nothing_is_converted() {
    let home = Home::new();
    let repo = Repo::from_dir(ID, &home.ckpt);
    let hub = FakeHub::start(vec![repo.clone()]);
    hub.set_faults(Faults {
        flip: Some("speech_tokenizer/model.safetensors".into()),
        ..Faults::default()
    });
    let err = failed(&home.run(&hub.url, &["pull", ID], &[]));
    assert!(err.contains("the file was removed"), "{err}");
    assert!(
        err.contains(&repo.file("speech_tokenizer/model.safetensors").sha256()),
        "{err}"
    );
    let snap = home.repo_dir().join("snapshots").join(&repo.commit);
    assert!(!snap.join("speech_tokenizer/model.safetensors").exists());
    assert_eq!(incomplete(&home), Vec::<String>::new());
    assert!(
        !home.dir.path().join("cache/qtts/converted").exists(),
        "nothing converted"
    );
    // Healed, the next run fetches it again and completes.
    hub.set_faults(Faults::default());
    ok(&home.run(&hub.url, &["pull", ID, "--no-convert"], &[]));
    complete(&home, &repo);
}

#[test]
fn a_gated_repository_takes_a_token() {
    let home = Home::new();
    let mut repo = Repo::from_dir(ID, &home.ckpt);
    repo.token = Some("hf_right".into());
    let hub = FakeHub::start(vec![repo.clone()]);
    let err = failed(&home.run(&hub.url, &["pull", ID, "--no-convert"], &[]));
    assert!(err.contains("401") && err.contains("HF_TOKEN"), "{err}");
    let err = failed(&home.run(
        &hub.url,
        &["pull", ID, "--no-convert"],
        &[("HF_TOKEN", "hf_wrong")],
    ));
    assert!(err.contains("403") && err.contains("no access"), "{err}");
    assert_eq!(hub.sent("model.safetensors"), 0);
    // The token also comes from the file `hf auth login` writes.
    std::fs::create_dir_all(home.hf_home()).unwrap();
    std::fs::write(home.hf_home().join("token"), "hf_right\n").unwrap();
    ok(&home.run(&hub.url, &["pull", ID, "--no-convert"], &[]));
    complete(&home, &repo);
}

#[test]
fn offline_takes_a_full_cache_and_names_what_an_empty_one_lacks() {
    let home = Home::new();
    let repo = Repo::from_dir(ID, &home.ckpt);
    let hub = FakeHub::start(vec![repo.clone()]);
    let offline = [("HF_HUB_OFFLINE", "1")];
    let err = failed(&home.run(&hub.url, &["pull", ID], &offline));
    assert!(
        err.contains("HF_HUB_OFFLINE") && err.contains("the revision main"),
        "{err}"
    );
    let err = failed(&home.run(
        &hub.url,
        &["speak", "x", "--model", ID, "--out", "/dev/null"],
        &offline,
    ));
    assert!(err.contains("HF_HUB_OFFLINE"), "{err}");
    assert_eq!(hub.requests(), 0);
    ok(&home.run(&hub.url, &["pull", ID, "--no-convert"], &[]));
    let before = hub.requests();
    home.samples(&hub.url, ID, &offline).unwrap();
    assert_eq!(hub.requests(), before);
}

#[test]
fn two_processes_pulling_at_once_transfer_each_file_once() {
    let home = Home::new();
    let repo = Repo::from_dir(ID, &home.ckpt);
    let hub = FakeHub::start(vec![repo.clone()]);
    hub.set_faults(Faults {
        pace: Duration::from_millis(20),
        ..Faults::default()
    });
    let spawn = || {
        home.command(&hub.url, &["pull", ID, "--no-convert"], &[])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    for child in [a, b] {
        ok(&child.wait_with_output().unwrap());
    }
    for f in &repo.files {
        assert_eq!(
            hub.sent(&f.name),
            f.bytes.len() as u64,
            "{} transferred once",
            f.name
        );
    }
    complete(&home, &repo);
}

#[test]
fn an_interrupted_pull_leaves_nothing_used_and_the_next_resumes() {
    let home = Home::new();
    let repo = Repo::from_dir(ID, &home.ckpt);
    let big = repo.file("model.safetensors");
    let hub = FakeHub::start(vec![repo.clone()]);
    hub.set_faults(Faults {
        pace: Duration::from_millis(50),
        ..Faults::default()
    });
    let mut child = home
        .command(&hub.url, &["pull", ID], &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let blob = home.repo_dir().join("blobs").join(big.hash());
    let part = PathBuf::from(format!("{}.incomplete", blob.display()));
    // Ctrl-C once some of the weights are on disk (what the process did, not when).
    let mut waited = 0;
    while std::fs::metadata(&part).map_or(0, |m| m.len()) < (1 << 20) {
        assert!(waited < 600, "the transfer never began");
        std::thread::sleep(Duration::from_millis(100));
        waited += 1;
    }
    // SAFETY: kill only sends a signal to the child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    assert!(!child.wait().unwrap().success());
    let sent = hub.sent("model.safetensors");
    assert!(sent < big.bytes.len() as u64);
    assert!(!blob.exists());
    let snap = home.repo_dir().join("snapshots").join(&repo.commit);
    assert!(!snap.join("model.safetensors").exists());
    assert!(!home.dir.path().join("cache/qtts/converted").exists());
    hub.set_faults(Faults::default());
    let err = ok(&home.run(&hub.url, &["pull", ID, "--no-convert"], &[]));
    assert!(err.contains("resuming at"), "{err}");
    // What the first run wrote is kept: the second asks for the rest only. (The bytes sent
    // are no measure of it: the first run's last chunk may be counted after it was read above.)
    let kept = *hub.starts("model.safetensors").last().unwrap();
    assert!(kept >= 1 << 20, "the second run resumed at {kept}");
    complete(&home, &repo);
}

#[test]
fn a_cache_laid_out_by_python_is_used_without_a_request() {
    let home = Home::new();
    let repo = Repo::from_dir(ID, &home.ckpt);
    // huggingface_hub's layout: blobs by hash, snapshot links relative to them, refs/main.
    let dir = home.repo_dir();
    std::fs::create_dir_all(dir.join("blobs")).unwrap();
    std::fs::create_dir_all(dir.join("refs")).unwrap();
    std::fs::write(dir.join("refs/main"), &repo.commit).unwrap();
    for f in &repo.files {
        std::fs::write(dir.join("blobs").join(f.hash()), &*f.bytes).unwrap();
        let link = dir.join("snapshots").join(&repo.commit).join(&f.name);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let up = "../".repeat(f.name.matches('/').count() + 2);
        std::os::unix::fs::symlink(format!("{up}blobs/{}", f.hash()), &link).unwrap();
    }
    let hub = FakeHub::start(vec![]);
    let pulled = home.samples(&hub.url, ID, &[]).unwrap();
    let local = home
        .samples(&hub.url, home.ckpt.to_str().unwrap(), &[])
        .unwrap();
    assert_eq!(pulled, local);
    assert_eq!(hub.requests(), 0);
}

#[test]
fn what_is_not_a_checkpoint_is_refused_before_its_weights() {
    let home = Home::new();
    let mut other = Repo::from_dir("qtts-test/other-model", &home.ckpt);
    let cfg = other
        .files
        .iter_mut()
        .find(|f| f.name == "config.json")
        .unwrap();
    cfg.bytes = std::sync::Arc::new(br#"{"model_type": "llama", "hidden_size": 4096}"#.to_vec());
    let mut partial = Repo::from_dir("qtts-test/no-decoder", &home.ckpt);
    partial
        .files
        .retain(|f| !f.name.starts_with("speech_tokenizer/"));
    let hub = FakeHub::start(vec![other, partial]);
    let err = failed(&home.run(&hub.url, &["pull", "qtts-test/other-model"], &[]));
    assert!(
        err.contains("not a Qwen3-TTS-12Hz checkpoint") && err.contains("config.json"),
        "{err}"
    );
    let err = failed(&home.run(&hub.url, &["pull", "qtts-test/no-decoder"], &[]));
    assert!(err.contains("speech_tokenizer/model.safetensors"), "{err}");
    assert_eq!(hub.sent("model.safetensors"), 0, "no weights fetched");
    let err = failed(&home.run(&hub.url, &["pull", "qtts-test/nothing-here"], &[]));
    assert!(
        err.contains("404") && err.contains("no such repository"),
        "{err}"
    );
    let err = failed(&home.run(&hub.url, &["pull", "qtts-test/other-model@v9"], &[]));
    assert!(err.contains("404"), "{err}");
    let err = failed(&home.run(&hub.url, &["pull", "not a name"], &[]));
    assert!(err.contains("org/name"), "{err}");
    // No Hub at all.
    let err = failed(&home.run("http://127.0.0.1:9", &["pull", ID], &[]));
    assert!(err.contains("cannot reach"), "{err}");
}

#[test]
fn pull_without_a_name_lists_the_published_checkpoints_without_a_request() {
    let home = Home::new();
    let hub = FakeHub::start(vec![]);
    let r = home.run(&hub.url, &["pull"], &[]);
    ok(&r);
    let out = String::from_utf8_lossy(&r.stdout);
    for p in qtts::hub::PUBLISHED {
        assert!(out.contains(p.repo), "{out}");
    }
    assert_eq!(hub.requests(), 0);
    // And the first run without a model names the pull command.
    let r = home.run(
        &hub.url,
        &["synth", "x", "--out", "/dev/null", "--max-frames", "1"],
        &[],
    );
    assert!(
        stderr(&r).contains("qtts pull Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"),
        "{}",
        stderr(&r)
    );
}
