//! Models by name from the Hugging Face Hub (`qtts pull`, `--model org/name`; feature `hub`).
//!
//! Contract:
//! - Files live in the Hub's own cache layout, shared with Python's `huggingface_hub`
//!   (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`):
//!   `models--org--name/blobs/<hash>`, `snapshots/<commit>/<file>` (a link to its blob) and
//!   `refs/<revision>` (the commit). A checkpoint already fetched by Python is used as it is.
//! - No request at all when the revision's snapshot already holds every file the engine needs
//!   ([`REQUIRED`]), online or offline (`HF_HUB_OFFLINE=1`); offline with anything missing is an
//!   error that says so, before any request.
//! - Only the files the engine reads are fetched ([`REQUIRED`], and [`OPTIONAL`] where the
//!   repository has them), pinned to one commit, `config.json` first: a repository that is not a
//!   Qwen3-TTS-12Hz checkpoint is refused before its weights are fetched. The disk's free space is
//!   checked before the first byte.
//! - Every file is verified against the hash the Hub lists for it (the LFS SHA-256, or the git
//!   blob SHA-1 of a small file) before it is placed under `blobs/`: a partial or corrupt file is
//!   never linked into a snapshot. A transfer writes `blobs/<hash>.incomplete` (the name Python
//!   uses too) and an interrupted one resumes from there with an HTTP range, in this run (a few
//!   retries) or the next one.
//! - One transfer per blob across processes: an exclusive lock on `blobs/<hash>.lock`; a second
//!   process waits for it and then finds the blob in place.
//!
//! hf-hub gives the cache layout, the settings from the environment and the repository's listing
//! request; the transfers are ureq's (the client hf-hub's blocking API is built on), because
//! hf-hub's own download neither verifies the bytes nor waits for another process's lock.

mod error;
mod transfer;

pub use error::HubError;

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use transfer::Expected;

/// The files the engine reads from a checkpoint, all needed (the conversion's inputs), in the
/// order they are fetched: `config.json` first, the weights last.
pub const REQUIRED: [&str; 8] = [
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "speech_tokenizer/config.json",
    "speech_tokenizer/model.safetensors",
    "model.safetensors",
];

/// Files fetched when the repository has them (part of a checkpoint's identity in the
/// conversion cache, not read by the conversion).
pub const OPTIONAL: [&str; 2] = [
    "preprocessor_config.json",
    "speech_tokenizer/preprocessor_config.json",
];

/// A published checkpoint: the repository and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// `org/name` on the Hub.
    pub repo: &'static str,
    /// What it does.
    pub what: &'static str,
    /// About how much is fetched (from the parameter counts; not measured on the files).
    pub size: &'static str,
}

/// The Qwen3-TTS-12Hz checkpoints Qwen published (`qtts pull` without a name lists them; no
/// request is made).
pub const PUBLISHED: [Published; 5] = [
    Published {
        repo: "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
        what: "9 built-in speakers",
        size: "about 2.5 GB",
    },
    Published {
        repo: "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
        what: "voice cloning from a recording",
        size: "about 2.5 GB",
    },
    Published {
        repo: "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
        what: "9 built-in speakers, with instructions",
        size: "about 4.6 GB",
    },
    Published {
        repo: "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
        what: "voice cloning from a recording",
        size: "about 4.6 GB",
    },
    Published {
        repo: "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
        what: "a voice described in words",
        size: "about 4.6 GB",
    },
];

/// The Hub's default address.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A repository on the Hub and a revision: `org/name` or `org/name@revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoName {
    /// `org/name`.
    pub id: String,
    /// A branch, a tag or a commit (`main` when none is given).
    pub revision: String,
}

impl RepoName {
    /// Parses `org/name[@revision]`; `None` for anything else (a local path such as `./x`,
    /// `a/b/c` or `/abs` never parses). Names take letters, digits, `.`, `_` and `-`, and
    /// start with neither `.` nor `-`.
    pub fn parse(s: &str) -> Option<Self> {
        let (id, revision) = match s.split_once('@') {
            Some((id, rev)) => (id, rev),
            None => (s, "main"),
        };
        let (org, name) = id.split_once('/')?;
        let part = |p: &str| {
            !p.is_empty()
                && p.len() <= 96
                && !p.starts_with(['.', '-'])
                && !p.contains("..")
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        };
        let rev_ok = !revision.is_empty()
            && revision.len() <= 256
            && !revision.starts_with(['.', '-', '/'])
            && !revision.contains("..")
            && revision
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'));
        (part(org) && part(name) && rev_ok).then(|| RepoName {
            id: id.to_owned(),
            revision: revision.to_owned(),
        })
    }

    /// The cache's folder of this repository (`models--org--name`).
    pub fn folder(&self) -> String {
        format!("models--{}", self.id.replace('/', "--"))
    }
}

impl std::fmt::Display for RepoName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.revision == "main" {
            f.write_str(&self.id)
        } else {
            write!(f, "{}@{}", self.id, self.revision)
        }
    }
}

/// Where and how to fetch, from the same environment variables as Python's `huggingface_hub`.
#[derive(Clone, PartialEq, Eq)]
pub struct Settings {
    /// The Hub or a mirror (`HF_ENDPOINT`; default [`DEFAULT_ENDPOINT`]).
    pub endpoint: String,
    /// The cache's `hub` folder (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`).
    pub cache: PathBuf,
    /// An access token for gated or private repositories (`HF_TOKEN`, else the file
    /// `$HF_HOME/token` that `hf auth login` writes).
    pub token: Option<String>,
    /// Never make a request (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// Transfers resumed within one run after a dropped connection before giving up.
    pub retries: u32,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("endpoint", &self.endpoint)
            .field("cache", &self.cache)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .field("offline", &self.offline)
            .field("retries", &self.retries)
            .finish()
    }
}

impl Settings {
    /// The settings of this process's environment.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let hf_cache = Cache::from_env();
        let cache = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| hf_cache.path().clone());
        let token = var("HF_TOKEN")
            .map(|t| t.trim().to_owned())
            .or_else(|| hf_cache.token());
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "on" | "yes" | "true"
            )
        });
        Settings {
            endpoint: var("HF_ENDPOINT")
                .map(|e| e.trim().trim_end_matches('/').to_owned())
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned()),
            cache,
            token,
            offline,
            retries: 3,
        }
    }
}

/// What a fetch is doing, for a progress display.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event<'a> {
    /// Before the first byte: the bytes to transfer in all (`total`), of which `resumed` are
    /// already on disk from an interrupted transfer, over `files` files.
    Plan {
        /// Files to transfer.
        files: usize,
        /// Their bytes.
        total: u64,
        /// Bytes already on disk from earlier, interrupted transfers.
        resumed: u64,
    },
    /// Another process is fetching `file`; this one waits for it.
    Waiting {
        /// The file.
        file: &'a str,
    },
    /// A transfer begins (or resumes at `from`).
    Start {
        /// The file.
        file: &'a str,
        /// Its size.
        size: u64,
        /// Bytes already on disk.
        from: u64,
    },
    /// `n` more bytes of `file` arrived.
    Bytes {
        /// The file.
        file: &'a str,
        /// How many.
        n: u64,
    },
    /// The connection dropped at `at` bytes of `file`; the transfer resumes there.
    Retry {
        /// The file.
        file: &'a str,
        /// Bytes on disk.
        at: u64,
    },
    /// `file` is complete and its hash verified.
    Done {
        /// The file.
        file: &'a str,
    },
}

/// A checkpoint on disk, in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The snapshot folder: a checkpoint directory (`config.json`, `model.safetensors`, ...).
    pub dir: PathBuf,
    /// The commit it is.
    pub commit: String,
    /// Bytes transferred by this call (0 when everything was in the cache).
    pub transferred: u64,
}

/// Whether `s` is a full commit hash (40 hex digits).
fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The checkpoint `name` from the cache alone, when its snapshot holds every [`REQUIRED`] file:
/// no request is made.
pub fn cached(name: &RepoName, settings: &Settings) -> Option<Snapshot> {
    in_cache(name, settings).ok()
}

/// The cached snapshot of `name`, or what it lacks (the revision, or files of [`REQUIRED`]).
fn in_cache(name: &RepoName, settings: &Settings) -> Result<Snapshot, String> {
    let repo_dir = settings.cache.join(name.folder());
    let commit = cached_commit(&repo_dir, &name.revision)
        .ok_or_else(|| format!("the revision {}", name.revision))?;
    let dir = repo_dir.join("snapshots").join(&commit);
    let missing: Vec<&str> = REQUIRED
        .iter()
        .filter(|f| !dir.join(f).is_file())
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(missing.join(", "));
    }
    Ok(Snapshot {
        dir,
        commit,
        transferred: 0,
    })
}

/// The checkpoint `name`: from the cache when complete ([`cached`]), else fetched (see the
/// module's contract). Blocks for the whole transfer; reports through `progress`.
pub fn fetch(
    name: &RepoName,
    settings: &Settings,
    progress: &mut dyn FnMut(Event),
) -> Result<Snapshot, HubError> {
    let missing = match in_cache(name, settings) {
        Ok(s) => return Ok(s),
        Err(missing) => missing,
    };
    if settings.offline {
        return Err(HubError::Offline {
            repo: name.to_string(),
            cache: settings.cache.clone(),
            missing,
        });
    }
    let listing = list(name, settings)?;
    let missing: Vec<&str> = REQUIRED
        .iter()
        .filter(|f| !listing.files.iter().any(|l| l.name == **f))
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(HubError::NotACheckpoint {
            repo: name.to_string(),
            why: format!("it has no {}", missing.join(", ")),
        });
    }
    let wanted: Vec<&Listed> = REQUIRED
        .iter()
        .chain(OPTIONAL.iter())
        .filter_map(|f| listing.files.iter().find(|l| l.name == *f))
        .collect();
    let repo_dir = settings.cache.join(name.folder());
    let blobs = repo_dir.join("blobs");
    let snapshot = repo_dir.join("snapshots").join(&listing.commit);
    std::fs::create_dir_all(&blobs).map_err(|e| HubError::io(&blobs, "create", e))?;

    let pinned = api(settings)?.repo(Repo::with_revision(
        name.id.clone(),
        RepoType::Model,
        listing.commit.clone(),
    ));
    let client = transfer::Client::new(settings);
    let ctx = |l: &Listed| transfer::Job {
        repo: name.to_string(),
        file: l.name.clone(),
        url: pinned.url(&l.name),
        expected: l.expected.clone(),
        size: l.size,
        blob: blobs.join(l.expected.hex()),
    };

    // config.json first: a repository of another model is refused before its weights.
    let config = wanted[0];
    let mut transferred = client.blob(&ctx(config), settings.retries, progress)?;
    link(&snapshot, &config.name, &config.expected)?;
    check_config(name, &snapshot.join("config.json"))?;
    if !is_commit(&name.revision) {
        write_ref(&repo_dir, &name.revision, &listing.commit)?;
    }

    let rest: Vec<transfer::Job> = wanted[1..].iter().map(|l| ctx(l)).collect();
    let todo: Vec<&transfer::Job> = rest.iter().filter(|j| !j.blob.is_file()).collect();
    let resumed: u64 = todo.iter().map(|j| j.partial_len()).sum();
    let total: u64 = todo.iter().map(|j| j.size).sum();
    // Each job's partial length is at most its size.
    let need = total - resumed;
    let available = free_bytes(&blobs)?;
    if need > available {
        return Err(HubError::DiskFull {
            dir: blobs,
            need,
            available,
        });
    }
    progress(Event::Plan {
        files: todo.len(),
        total,
        resumed,
    });
    for job in &rest {
        transferred += client.blob(job, settings.retries, progress)?;
        link(&snapshot, &job.file, &job.expected)?;
    }
    Ok(Snapshot {
        dir: snapshot,
        commit: listing.commit,
        transferred,
    })
}

/// hf-hub's client for `settings` (the endpoint, the token, the cache).
fn api(settings: &Settings) -> Result<hf_hub::api::sync::Api, HubError> {
    ApiBuilder::from_cache(Cache::new(settings.cache.clone()))
        .with_endpoint(settings.endpoint.clone())
        .with_token(settings.token.clone())
        .with_progress(false)
        .with_user_agent("qtts", env!("CARGO_PKG_VERSION"))
        .build()
        .map_err(|e| HubError::BadAnswer {
            url: settings.endpoint.clone(),
            what: e.to_string(),
            expected: "a client for it".into(),
        })
}

fn cached_commit(repo_dir: &Path, revision: &str) -> Option<String> {
    if is_commit(revision) {
        return Some(revision.to_ascii_lowercase());
    }
    let text = std::fs::read_to_string(repo_dir.join("refs").join(revision)).ok()?;
    Some(text.trim().to_owned()).filter(|c| is_commit(c))
}

/// A file of the repository's listing.
#[derive(Debug, Clone)]
struct Listed {
    name: String,
    size: u64,
    expected: Expected,
}

/// The repository's commit for the revision and its files' sizes and hashes.
#[derive(Debug)]
struct Listing {
    commit: String,
    files: Vec<Listed>,
}

/// One request: the model's listing with its files' hashes (`/api/models/<id>/revision/<rev>?blobs=true`).
fn list(name: &RepoName, settings: &Settings) -> Result<Listing, HubError> {
    #[derive(serde::Deserialize)]
    struct Lfs {
        sha256: String,
        size: u64,
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Sibling {
        rfilename: String,
        blob_id: Option<String>,
        size: Option<u64>,
        lfs: Option<Lfs>,
    }
    #[derive(serde::Deserialize)]
    struct Info {
        sha: String,
        siblings: Vec<Sibling>,
    }
    let api = api(settings)?;
    let url = format!(
        "{}/api/models/{}/revision/{}?blobs=true",
        settings.endpoint, name.id, name.revision
    );
    let repo = api.repo(Repo::with_revision(
        name.id.clone(),
        RepoType::Model,
        name.revision.clone(),
    ));
    let mut response = repo
        .info_request()
        .query("blobs", "true")
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .map_err(|e| transfer::network(&url, e))?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(transfer::status_error(
            &name.to_string(),
            &url,
            status,
            settings.token.is_some(),
            &settings.endpoint,
        ));
    }
    let text = response
        .body_mut()
        .with_config()
        .limit(16 << 20)
        .read_to_string()
        .map_err(|e| transfer::network(&url, e))?;
    let info: Info = serde_json::from_str(&text).map_err(|e| HubError::BadAnswer {
        url: url.clone(),
        what: format!("a listing that does not parse ({e})"),
        expected: "the model's JSON with `sha` and `siblings`".into(),
    })?;
    if !is_commit(&info.sha) {
        return Err(HubError::BadAnswer {
            url,
            what: format!("the commit {:?}", info.sha),
            expected: "40 hex digits".into(),
        });
    }
    let mut files = Vec::new();
    for s in info.siblings {
        let wanted =
            REQUIRED.contains(&s.rfilename.as_str()) || OPTIONAL.contains(&s.rfilename.as_str());
        if !wanted {
            continue;
        }
        let (expected, size) = match (&s.lfs, &s.blob_id, s.size) {
            (Some(lfs), _, _) => (Expected::sha256(&lfs.sha256), Some(lfs.size)),
            (None, Some(id), Some(size)) => (Expected::git_sha1(id), Some(size)),
            _ => (None, None),
        };
        let (Some(expected), Some(size)) = (expected, size) else {
            return Err(HubError::BadAnswer {
                url,
                what: format!("no hash or size for {}", s.rfilename),
                expected: "`lfs.sha256` or `blobId`, and a size, per file (blobs=true)".into(),
            });
        };
        files.push(Listed {
            name: s.rfilename,
            size,
            expected,
        });
    }
    Ok(Listing {
        commit: info.sha.to_ascii_lowercase(),
        files,
    })
}

/// Refuses a `config.json` that is not a Qwen3-TTS-12Hz model's.
fn check_config(name: &RepoName, path: &Path) -> Result<(), HubError> {
    let text = std::fs::read_to_string(path).map_err(|e| HubError::io(path, "read", e))?;
    crate::model::config::parse_json::<crate::model::config::TtsConfig>(&text, path)
        .map(|_| ())
        .map_err(|e| HubError::NotACheckpoint {
            repo: name.to_string(),
            why: format!("its config.json: {e}"),
        })
}

/// Links `snapshot/file` to its blob (a relative symbolic link, as Python's cache has), through
/// a temporary name and a rename, so the link is either absent or whole.
fn link(snapshot: &Path, file: &str, expected: &Expected) -> Result<(), HubError> {
    let path = snapshot.join(file);
    let depth = Path::new(file).components().count() + 1;
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push("blobs");
    target.push(expected.hex());
    if std::fs::read_link(&path).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let parent = path.parent().unwrap_or(snapshot);
    std::fs::create_dir_all(parent).map_err(|e| HubError::io(parent, "create", e))?;
    let tmp = parent.join(format!(
        ".{}.link-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&target, &tmp).map_err(|e| HubError::io(&tmp, "link", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| HubError::io(&path, "rename", e))
}

/// Writes `refs/<revision>` (the commit), through a temporary name and a rename.
fn write_ref(repo_dir: &Path, revision: &str, commit: &str) -> Result<(), HubError> {
    let path = repo_dir.join("refs").join(revision);
    let parent = path.parent().unwrap_or(repo_dir);
    std::fs::create_dir_all(parent).map_err(|e| HubError::io(parent, "create", e))?;
    let tmp = parent.join(format!(".ref-{}", std::process::id()));
    std::fs::write(&tmp, commit).map_err(|e| HubError::io(&tmp, "write", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| HubError::io(&path, "rename", e))
}

/// Free bytes for an unprivileged writer on the file system of `dir`.
fn free_bytes(dir: &Path) -> Result<u64, HubError> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| HubError::io(dir, "statvfs", std::io::Error::other(e)))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` points to a statvfs the call fills.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(HubError::io(
            dir,
            "statvfs",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // u64 here; narrower on 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_paths_do_not() {
        let n = RepoName::parse("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice").unwrap();
        assert_eq!(n.id, "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice");
        assert_eq!(n.revision, "main");
        assert_eq!(n.folder(), "models--Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice");
        let r = RepoName::parse("a/b@refs/pr/1").unwrap();
        assert_eq!((r.id.as_str(), r.revision.as_str()), ("a/b", "refs/pr/1"));
        for bad in [
            "",
            "a",
            "a/",
            "/a",
            "./a",
            "../a",
            "a/b/c",
            "a/.b",
            "a/-b",
            "a b/c",
            "a/b@",
            "a/b@..",
            "a/b@/x",
            "models/x y",
        ] {
            assert_eq!(RepoName::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_published_repositories_parse() {
        for p in PUBLISHED {
            assert!(RepoName::parse(p.repo).is_some(), "{}", p.repo);
        }
    }
}
