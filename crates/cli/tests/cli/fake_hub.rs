//! A Hugging Face Hub on loopback for `qtts pull`'s tests: the model listing
//! (`/api/models/<id>/revision/<rev>?blobs=true`), `resolve/<rev>/<file>` with the Hub's headers
//! (`ETag`, `X-Repo-Commit`, `X-Linked-Etag`, a redirect to storage for LFS files), ranges
//! (`Content-Range`), gated repositories (401 without a token, 403 with a wrong one), and faults:
//! connections dropped mid-file, a flipped byte, a slow link. It counts every request and the
//! body bytes sent of every file.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha1::Sha1;
use sha2::{Digest, Sha256};

/// One file of a repository.
#[derive(Clone)]
pub struct File {
    pub name: String,
    pub bytes: Arc<Vec<u8>>,
    /// Stored in LFS (served through the storage redirect, listed with its SHA-256).
    pub lfs: bool,
}

impl File {
    pub fn sha256(&self) -> String {
        hex(&Sha256::digest(&*self.bytes))
    }

    pub fn git_sha1(&self) -> String {
        let mut h = Sha1::new();
        h.update(format!("blob {}\0", self.bytes.len()).as_bytes());
        h.update(&*self.bytes);
        hex(&h.finalize())
    }

    /// The name of its blob in the cache.
    pub fn hash(&self) -> String {
        if self.lfs {
            self.sha256()
        } else {
            self.git_sha1()
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A repository: its id, commit, files and (gated) the token it takes.
#[derive(Clone)]
pub struct Repo {
    pub id: String,
    pub commit: String,
    pub files: Vec<File>,
    pub token: Option<String>,
}

impl Repo {
    /// The files of checkpoint directory `dir` (every file under it; `.safetensors` in LFS).
    pub fn from_dir(id: &str, dir: &Path) -> Repo {
        let mut files = Vec::new();
        for rel in ["", "speech_tokenizer"] {
            for e in std::fs::read_dir(dir.join(rel)).unwrap() {
                let p = e.unwrap().path();
                if !p.is_file() {
                    continue;
                }
                let fname = p.file_name().unwrap().to_str().unwrap().to_owned();
                let name = if rel.is_empty() {
                    fname.clone()
                } else {
                    format!("{rel}/{fname}")
                };
                files.push(File {
                    lfs: fname.ends_with(".safetensors"),
                    name,
                    bytes: Arc::new(std::fs::read(&p).unwrap()),
                });
            }
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Repo {
            id: id.to_owned(),
            commit: hex(&Sha1::digest(id.as_bytes())),
            files,
            token: None,
        }
    }

    pub fn file(&self, name: &str) -> &File {
        self.files.iter().find(|f| f.name == name).unwrap()
    }
}

/// Faults and pacing.
#[derive(Default)]
pub struct Faults {
    /// The next `n` requests for this file's bytes send `k` bytes each, then close the connection.
    pub drop: Option<(String, u32, u64)>,
    /// This file's bytes are served with one byte flipped (its listing stays right).
    pub flip: Option<String>,
    /// A pause after every 64 KiB sent.
    pub pace: Duration,
}

#[derive(Default)]
struct State {
    repos: Vec<Repo>,
    faults: Faults,
    sent: HashMap<String, u64>,
    /// Where each request for a file's bytes started (its Range, else 0), in order.
    starts: HashMap<String, Vec<u64>>,
}

/// The server; it runs until the test process ends.
pub struct FakeHub {
    pub url: String,
    state: Arc<Mutex<State>>,
    requests: Arc<AtomicU64>,
}

impl FakeHub {
    pub fn start(repos: Vec<Repo>) -> FakeHub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State {
            repos,
            ..State::default()
        }));
        let requests = Arc::new(AtomicU64::new(0));
        let (s, r, u) = (state.clone(), requests.clone(), url.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (s, r, u) = (s.clone(), r.clone(), u.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &s, &r, &u);
                });
            }
        });
        FakeHub {
            url,
            state,
            requests,
        }
    }

    pub fn set_faults(&self, f: Faults) {
        self.state.lock().unwrap().faults = f;
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }

    /// Where each request for `file`'s bytes started, in order (all repositories).
    pub fn starts(&self, file: &str) -> Vec<u64> {
        self.state
            .lock()
            .unwrap()
            .starts
            .get(file)
            .cloned()
            .unwrap_or_default()
    }

    /// Body bytes of `file` sent so far (all repositories).
    pub fn sent(&self, file: &str) -> u64 {
        self.state
            .lock()
            .unwrap()
            .sent
            .get(file)
            .copied()
            .unwrap_or(0)
    }
}

fn serve(
    conn: TcpStream,
    state: &Mutex<State>,
    requests: &AtomicU64,
    base: &str,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    requests.fetch_add(1, Ordering::SeqCst);
    let mut out = conn;
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let auth = headers.get("authorization").cloned();
    let range = headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|r| r.parse::<u64>().ok());

    if let Some(sha) = path.strip_prefix("/cdn/") {
        let file = {
            let st = state.lock().unwrap();
            st.repos
                .iter()
                .flat_map(|r| r.files.iter())
                .find(|f| f.lfs && f.sha256() == sha)
                .cloned()
        };
        return match file {
            Some(f) => send_bytes(&mut out, state, &f, range, &[]),
            None => respond(&mut out, "404 Not Found", &[], b"no such object"),
        };
    }
    let api = path.strip_prefix("/api/models/");
    let rest = api.unwrap_or(path.trim_start_matches('/'));
    let mut parts = rest.splitn(3, '/');
    let (org, name, tail) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
        parts.next().unwrap_or(""),
    );
    let id = format!("{org}/{name}");
    let repo = state
        .lock()
        .unwrap()
        .repos
        .iter()
        .find(|r| r.id == id)
        .cloned();
    let Some(repo) = repo else {
        return respond(
            &mut out,
            "404 Not Found",
            &[("X-Error-Code", "RepoNotFound".into())],
            b"Repository not found",
        );
    };
    if let Some(t) = &repo.token {
        match auth {
            None => return respond(&mut out, "401 Unauthorized", &[], b"gated: log in"),
            Some(a) if a != format!("Bearer {t}") => {
                return respond(&mut out, "403 Forbidden", &[], b"gated: no access")
            }
            Some(_) => {}
        }
    }
    let (kind, tail) = tail.split_once('/').unwrap_or((tail, ""));
    let (rev, file) = tail.split_once('/').unwrap_or((tail, ""));
    if rev != "main" && rev != repo.commit {
        return respond(&mut out, "404 Not Found", &[], b"Revision not found");
    }
    let commit = ("X-Repo-Commit", repo.commit.clone());
    match (api.is_some(), kind) {
        (true, "revision") => {
            assert_eq!(query, "blobs=true", "the listing is asked with its hashes");
            let siblings: Vec<serde_json::Value> = repo
                .files
                .iter()
                .map(|f| {
                    let mut v = serde_json::json!({
                        "rfilename": f.name,
                        "blobId": f.git_sha1(),
                        "size": f.bytes.len(),
                    });
                    if f.lfs {
                        v["lfs"] = serde_json::json!({
                            "sha256": f.sha256(), "size": f.bytes.len(), "pointerSize": 134
                        });
                    }
                    v
                })
                .collect();
            let body = serde_json::json!({"id": repo.id, "sha": repo.commit, "siblings": siblings});
            respond(&mut out, "200 OK", &[commit], body.to_string().as_bytes())
        }
        (false, "resolve") => {
            let Some(f) = repo.files.iter().find(|f| f.name == file) else {
                return respond(&mut out, "404 Not Found", &[commit], b"Entry not found");
            };
            if f.lfs {
                respond(
                    &mut out,
                    "302 Found",
                    &[
                        commit,
                        ("X-Linked-Etag", format!("\"{}\"", f.sha256())),
                        ("X-Linked-Size", f.bytes.len().to_string()),
                        ("Location", format!("{base}/cdn/{}", f.sha256())),
                    ],
                    b"",
                )
            } else {
                let etag = ("ETag", format!("\"{}\"", f.git_sha1()));
                send_bytes(&mut out, state, f, range, &[commit, etag])
            }
        }
        _ => respond(&mut out, "404 Not Found", &[], b"not found"),
    }
}

fn respond(
    out: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    out.write_all(body)?;
    out.flush()
}

/// A file's bytes from `from` on (206 with its range) or whole (200), with the faults applied.
fn send_bytes(
    out: &mut TcpStream,
    state: &Mutex<State>,
    f: &File,
    from: Option<u64>,
    extra: &[(&str, String)],
) -> std::io::Result<()> {
    let len = f.bytes.len() as u64;
    let start = from.unwrap_or(0);
    if start >= len {
        let range = ("Content-Range", format!("bytes */{len}"));
        return respond(out, "416 Range Not Satisfiable", &[range], b"");
    }
    let (cut, flip, pace) = {
        let mut st = state.lock().unwrap();
        st.starts.entry(f.name.clone()).or_default().push(start);
        let cut = match &mut st.faults.drop {
            Some((name, n, k)) if *name == f.name && *n > 0 => {
                *n -= 1;
                Some(*k)
            }
            _ => None,
        };
        (
            cut,
            st.faults.flip.as_deref() == Some(&f.name),
            st.faults.pace,
        )
    };
    let mut head = match from {
        Some(_) => format!(
            "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {start}-{}/{len}\r\n",
            len - 1
        ),
        None => "HTTP/1.1 200 OK\r\n".to_owned(),
    };
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\nAccept-Ranges: bytes\r\n",
        len - start
    ));
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    out.write_all(head.as_bytes())?;
    let mut body = f.bytes[start as usize..].to_vec();
    if flip && start <= len / 2 {
        body[(len / 2 - start) as usize] ^= 0x20;
    }
    let end = cut.map_or(body.len(), |k| (k as usize).min(body.len()));
    for chunk in body[..end].chunks(64 << 10) {
        out.write_all(chunk)?;
        *state
            .lock()
            .unwrap()
            .sent
            .entry(f.name.clone())
            .or_default() += chunk.len() as u64;
        if !pace.is_zero() {
            std::thread::sleep(pace);
        }
    }
    out.flush()?;
    if cut.is_some() {
        out.shutdown(std::net::Shutdown::Both)?;
    }
    Ok(())
}
