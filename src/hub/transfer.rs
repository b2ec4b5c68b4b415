//! One file's transfer into the cache: the blob's lock, the `.incomplete` file, resumption by
//! HTTP range, the hash check, and the rename into `blobs/`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::{Event, HubError, Settings};

/// A transfer stalls for this long without a byte: it is retried (resumed).
const READ_STALL: Duration = Duration::from_secs(60);

/// Bytes read from the connection at a time (and hashed, and written).
const CHUNK: usize = 1 << 20;

/// The hash the Hub lists for a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Expected {
    /// An LFS file: the SHA-256 of its bytes (64 hex digits, lower case).
    Sha256(String),
    /// A file kept in git: its blob id, the SHA-1 of `blob <len>\0` and its bytes.
    GitSha1(String),
}

impl Expected {
    pub(super) fn sha256(hex: &str) -> Option<Self> {
        let h = hex.trim().to_ascii_lowercase();
        (h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())).then_some(Expected::Sha256(h))
    }

    pub(super) fn git_sha1(hex: &str) -> Option<Self> {
        let h = hex.trim().to_ascii_lowercase();
        (h.len() == 40 && h.bytes().all(|b| b.is_ascii_hexdigit())).then_some(Expected::GitSha1(h))
    }

    /// The hex digits: the blob's name in the cache (as Python names it: the ETag the Hub
    /// sends for the file, which is this hash).
    pub(super) fn hex(&self) -> &str {
        match self {
            Expected::Sha256(h) | Expected::GitSha1(h) => h,
        }
    }
}

/// A running hash of the kind [`Expected`] names.
enum Hasher {
    Sha256(Sha256),
    GitSha1(Sha1),
}

impl Hasher {
    fn new(kind: &Expected, size: u64) -> Self {
        match kind {
            Expected::Sha256(_) => Hasher::Sha256(Sha256::new()),
            Expected::GitSha1(_) => {
                let mut h = Sha1::new();
                h.update(format!("blob {size}\0").as_bytes());
                Hasher::GitSha1(h)
            }
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::GitSha1(h) => h.update(bytes),
        }
    }

    fn hex(self) -> String {
        let bytes: Vec<u8> = match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::GitSha1(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// One file to place in the cache.
#[derive(Debug, Clone)]
pub(super) struct Job {
    /// The repository, for messages.
    pub repo: String,
    /// Its name in the repository.
    pub file: String,
    /// Where to get it (`<endpoint>/<id>/resolve/<commit>/<file>`).
    pub url: String,
    /// Its hash.
    pub expected: Expected,
    /// Its size.
    pub size: u64,
    /// `blobs/<hash>`.
    pub blob: PathBuf,
}

impl Job {
    fn incomplete(&self) -> PathBuf {
        with_suffix(&self.blob, ".incomplete")
    }

    /// Bytes of an interrupted transfer already on disk.
    pub(super) fn partial_len(&self) -> u64 {
        std::fs::metadata(self.incomplete())
            .map(|m| m.len().min(self.size))
            .unwrap_or(0)
    }
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// The HTTP client of the transfers.
pub(super) struct Client {
    agent: ureq::Agent,
    token: Option<String>,
    endpoint: String,
}

impl Client {
    pub(super) fn new(settings: &Settings) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(READ_STALL))
            // The token goes to the Hub, not to the storage it redirects to.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .user_agent(format!("qtts/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            agent,
            token: settings.token.clone(),
            endpoint: settings.endpoint.clone(),
        }
    }

    /// Places `job`'s blob in the cache (see the module's contract); returns the bytes this
    /// call transferred (0 when the blob was there, or another process placed it).
    pub(super) fn blob(
        &self,
        job: &Job,
        retries: u32,
        progress: &mut dyn FnMut(Event),
    ) -> Result<u64, HubError> {
        if job.blob.is_file() {
            return Ok(0);
        }
        let _lock = lock(&with_suffix(&job.blob, ".lock"), &job.file, progress)?;
        if job.blob.is_file() {
            progress(Event::Done { file: &job.file });
            return Ok(0);
        }
        let part_path = job.incomplete();
        let mut part = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&part_path)
            .map_err(|e| HubError::io(&part_path, "open", e))?;
        let io = |op: &'static str| {
            let path = part_path.clone();
            move |e| HubError::io(path, op, e)
        };
        let mut have = part.metadata().map_err(io("stat"))?.len();
        if have > job.size {
            part.set_len(0).map_err(io("truncate"))?;
            have = 0;
        }
        // The bytes already there are hashed again: the hash covers the whole file.
        let mut hasher = Hasher::new(&job.expected, job.size);
        part.seek(SeekFrom::Start(0)).map_err(io("seek"))?;
        let mut buf = vec![0u8; CHUNK];
        let mut left = have;
        while left > 0 {
            let n = part
                .read(&mut buf[..CHUNK.min(left as usize)])
                .map_err(io("read"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            left -= n as u64;
        }
        progress(Event::Start {
            file: &job.file,
            size: job.size,
            from: have,
        });
        let start = have;
        let mut attempt = 0;
        while have < job.size {
            let (cause, restart) =
                match self.resume(job, &mut part, &mut have, &mut hasher, &mut buf, progress) {
                    Ok(()) => continue,
                    Err(Stop::Fatal(e)) => return Err(e),
                    Err(Stop::Dropped(cause)) => (cause, false),
                    Err(Stop::Restart) => {
                        ("the server ignores or refuses the range".to_owned(), true)
                    }
                };
            if attempt >= retries {
                return Err(HubError::Interrupted {
                    file: job.file.clone(),
                    at: have,
                    size: job.size,
                    cause,
                });
            }
            attempt += 1;
            if restart {
                part.set_len(0).map_err(io("truncate"))?;
                part.seek(SeekFrom::Start(0)).map_err(io("seek"))?;
                have = 0;
                hasher = Hasher::new(&job.expected, job.size);
            } else {
                std::thread::sleep(Duration::from_millis(250 << attempt.min(5)));
                progress(Event::Retry {
                    file: &job.file,
                    at: have,
                });
            }
        }
        part.flush().map_err(io("write"))?;
        part.sync_all().map_err(io("sync"))?;
        drop(part);
        let found = hasher.hex();
        if found != job.expected.hex() {
            let _ = std::fs::remove_file(job.incomplete());
            return Err(HubError::Corrupt {
                file: job.file.clone(),
                expected: job.expected.hex().to_owned(),
                found,
            });
        }
        std::fs::rename(job.incomplete(), &job.blob)
            .map_err(|e| HubError::io(&job.blob, "rename", e))?;
        progress(Event::Done { file: &job.file });
        Ok(have - start)
    }

    /// One request for the bytes from `have` on, appended to `part` until the body ends.
    fn resume(
        &self,
        job: &Job,
        part: &mut File,
        have: &mut u64,
        hasher: &mut Hasher,
        buf: &mut [u8],
        progress: &mut dyn FnMut(Event),
    ) -> Result<(), Stop> {
        let mut req = self.agent.get(&job.url);
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        if *have > 0 {
            req = req.header("Range", format!("bytes={have}-"));
        }
        let response = req.call().map_err(|e| match e {
            ureq::Error::StatusCode(_) | ureq::Error::BadUri(_) | ureq::Error::RedirectFailed => {
                Stop::Fatal(network(&job.url, e))
            }
            e => Stop::Dropped(e.to_string()),
        })?;
        let status = response.status().as_u16();
        match status {
            206 => {
                let range = response
                    .headers()
                    .get("content-range")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                if !range.starts_with(&format!("bytes {have}-")) {
                    return Err(Stop::Fatal(HubError::BadAnswer {
                        url: job.url.clone(),
                        what: format!("Content-Range {range:?} for a request from byte {have}"),
                        expected: format!("bytes {have}-..."),
                    }));
                }
            }
            // The server sent the whole file: start over with it.
            200 if *have > 0 => return Err(Stop::Restart),
            200 => {}
            // Nothing after `have`: the file is shorter than listed; the hash check says so.
            416 => return Err(Stop::Restart),
            _ => {
                return Err(Stop::Fatal(status_error(
                    &job.repo,
                    &job.url,
                    status,
                    self.token.is_some(),
                    &self.endpoint,
                )))
            }
        }
        let mut body = response.into_body().into_reader();
        loop {
            let want = buf.len().min((job.size - *have) as usize);
            if want == 0 {
                return Ok(());
            }
            match body.read(&mut buf[..want]) {
                Ok(0) => return Err(Stop::Dropped("the connection closed".into())),
                Ok(n) => {
                    if let Err(e) = part.write_all(&buf[..n]) {
                        return Err(Stop::Fatal(HubError::io(job.incomplete(), "write", e)));
                    }
                    hasher.update(&buf[..n]);
                    *have += n as u64;
                    progress(Event::Bytes {
                        file: &job.file,
                        n: n as u64,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Stop::Dropped(e.to_string())),
            }
        }
    }
}

/// Why one request ended before the file's end.
enum Stop {
    /// The connection failed or closed early: resume.
    Dropped(String),
    /// The server ignored the range: start over.
    Restart,
    /// Nothing a retry fixes.
    Fatal(HubError),
}

/// The exclusive lock on `path` (created if needed), waited for when another process holds it
/// (as the conversion cache's lock is).
fn lock(path: &Path, file: &str, progress: &mut dyn FnMut(Event)) -> Result<File, HubError> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| HubError::io(path, "open", e))?;
    if f.try_lock().is_ok() {
        return Ok(f);
    }
    progress(Event::Waiting { file });
    f.lock().map_err(|e| HubError::io(path, "lock", e))?;
    Ok(f)
}

/// A transport failure (no answer, or a status where ureq makes one an error).
pub(super) fn network(url: &str, e: ureq::Error) -> HubError {
    match e {
        ureq::Error::StatusCode(code) => HubError::Status {
            url: url.to_owned(),
            status: code,
        },
        e => HubError::Network {
            url: url.to_owned(),
            cause: e.to_string(),
        },
    }
}

/// What an unexpected HTTP status means for `repo`.
pub(super) fn status_error(
    repo: &str,
    url: &str,
    status: u16,
    has_token: bool,
    endpoint: &str,
) -> HubError {
    let id = repo.split('@').next().unwrap_or(repo);
    match status {
        404 => HubError::NotFound {
            repo: repo.to_owned(),
            url: url.to_owned(),
        },
        401 | 403 => HubError::Unauthorized {
            repo: repo.to_owned(),
            url: url.to_owned(),
            status,
            advice: if has_token {
                format!(
                    "the token (HF_TOKEN, or the one `hf auth login` saved) has no access to it: \
                     accept its conditions at {endpoint}/{id} with that account, or use a token \
                     that may read it"
                )
            } else {
                format!(
                    "a gated or private repository (or none of that name): accept its conditions \
                     at {endpoint}/{id}, then set HF_TOKEN to a token of that account"
                )
            },
        },
        _ => HubError::Status {
            url: url.to_owned(),
            status,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_those_git_and_lfs_list() {
        // `git hash-object` of "hello\n" and the SHA-256 of the same bytes.
        let git = Expected::git_sha1("ce013625030ba8dba906f756967f9e9ca394464a").unwrap();
        let mut h = Hasher::new(&git, 6);
        h.update(b"hello\n");
        assert_eq!(h.hex(), git.hex());
        let lfs =
            Expected::sha256("5891B5B522D5DF086D0FF0B110FBD9D21BB4FC7163AF34D08286A2E846F6BE03")
                .unwrap();
        let mut h = Hasher::new(&lfs, 6);
        h.update(b"hel");
        h.update(b"lo\n");
        assert_eq!(h.hex(), lfs.hex());
        assert_eq!(Expected::sha256("abc"), None);
        assert_eq!(Expected::git_sha1(&"g".repeat(40)), None);
    }
}
