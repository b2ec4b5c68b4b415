//! The conversion cache: official checkpoints converted once into `<cache>/converted/`, keyed by
//! what the checkpoint is, not by its directory's name.
//!
//! Contract:
//! - A checkpoint's identity ([`checkpoint_id`]) is a SHA-256 of every file the conversion
//!   reads: the JSON and tokenizer files whole, each `model.safetensors` by its header (the
//!   tensors' names, types, shapes and offsets), size and modification time, and the
//!   converter's format ([`FORMAT`]). Two checkpoints that share a directory name have two
//!   identities; a checkpoint changed in place gets a new one.
//! - An entry is the directory `<name>-<type>-<id16>` holding the GGUF pair, whose files carry the
//!   full identity ([`KEY_CHECKPOINT_ID`]), and `source.json` (the checkpoint's path, the identity,
//!   the type). [`converted`] checks both against the checkpoint again before trusting an entry;
//!   an entry that does not match is converted again, and the caller is told why.
//! - One conversion per entry at a time, across processes: an exclusive lock on
//!   `.lock-<entry>`; a second process waits for it and uses the first one's files. A conversion
//!   is written under `<entry>.partial-<pid>` and renamed into place when complete, so a failure
//!   (a full disk, an unwritable directory, an interruption) never leaves an entry that looks
//!   complete; the partial directory is removed on failure.
//! - Blocks for the whole conversion (minutes for a full-size checkpoint); reports its bytes
//!   through the caller's `progress`.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::ModelError;
use crate::model::convert::{self, OutType};

/// The GGUF metadata key carrying the identity of the checkpoint a file was converted from.
pub const KEY_CHECKPOINT_ID: &str = "qtts.source.checkpoint_id";

/// What the conversion writes, by version: a change to the converter's output that makes older
/// conversions wrong bumps it, and every cached entry is converted again.
pub const FORMAT: &str = "qtts-convert-1";

/// Files read whole into the identity: the configs and tokenizer files of a checkpoint.
const SMALL: [&str; 8] = [
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "speech_tokenizer/config.json",
    "speech_tokenizer/preprocessor_config.json",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
];

/// Files read by their header, size and modification time.
const LARGE: [&str; 2] = ["model.safetensors", "speech_tokenizer/model.safetensors"];

/// The largest safetensors header read into the identity (the format caps it at 100 MB; real
/// checkpoints' are tens of KB).
const MAX_HEADER: u64 = 100 << 20;

/// The identity of the checkpoint in `dir` (64 hex digits; see the module's contract).
pub fn checkpoint_id(dir: &Path) -> Result<String, ModelError> {
    let mut h = Sha256::new();
    h.update(FORMAT.as_bytes());
    for name in SMALL {
        let p = dir.join(name);
        h.update(name.as_bytes());
        match std::fs::read(&p) {
            Ok(bytes) => {
                h.update((bytes.len() as u64).to_le_bytes());
                h.update(&bytes);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => h.update(b"absent"),
            Err(e) => return Err(ModelError::io(p, "read", e)),
        }
    }
    for name in LARGE {
        let p = dir.join(name);
        h.update(name.as_bytes());
        let meta = match std::fs::metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                h.update(b"absent");
                continue;
            }
            Err(e) => return Err(ModelError::io(p, "stat", e)),
        };
        h.update(meta.len().to_le_bytes());
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        h.update(mtime.to_le_bytes());
        let mut f = std::fs::File::open(&p).map_err(|e| ModelError::io(&p, "open", e))?;
        let mut len = [0u8; 8];
        if f.read_exact(&mut len).is_ok() {
            let n = u64::from_le_bytes(len).min(MAX_HEADER).min(meta.len());
            let mut header = Vec::new();
            f.take(n)
                .read_to_end(&mut header)
                .map_err(|e| ModelError::io(&p, "read", e))?;
            h.update(len);
            h.update(&header);
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// A cached conversion.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Its directory.
    pub dir: PathBuf,
    /// The checkpoint it was converted from (as recorded), if its `source.json` reads.
    pub source: Option<PathBuf>,
    /// The checkpoint's identity (as recorded).
    pub id: Option<String>,
    /// The storage type's name (`q8_0`, `f32`, ...).
    pub ty: Option<String>,
    /// Bytes of every file in it.
    pub bytes: u64,
}

/// `source.json` of an entry.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Source {
    checkpoint: PathBuf,
    id: String,
    #[serde(rename = "type")]
    ty: String,
    format: String,
}

/// Where the cache keeps its conversions.
pub fn converted_dir(cache: &Path) -> PathBuf {
    cache.join("converted")
}

/// Every entry under `cache` (finished ones: not the partial directories of a conversion in
/// progress), sorted by directory.
pub fn list(cache: &Path) -> Vec<Entry> {
    let Ok(rd) = std::fs::read_dir(converted_dir(cache)) else {
        return Vec::new();
    };
    let mut v: Vec<Entry> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !is_partial(p))
        .map(|dir| {
            let source = read_source(&dir);
            Entry {
                bytes: dir_bytes(&dir),
                source: source.as_ref().map(|s| s.checkpoint.clone()),
                id: source.as_ref().map(|s| s.id.clone()),
                ty: source.map(|s| s.ty),
                dir,
            }
        })
        .collect();
    v.sort_by(|a, b| a.dir.cmp(&b.dir));
    v
}

/// Removes every entry under `cache` (and leftovers of interrupted conversions); returns what
/// was removed and the bytes freed. An entry being converted right now is left alone (its lock
/// is held).
pub fn clear(cache: &Path) -> Result<(Vec<PathBuf>, u64), ModelError> {
    let root = converted_dir(cache);
    let Ok(rd) = std::fs::read_dir(&root) else {
        return Ok((Vec::new(), 0));
    };
    let mut removed = Vec::new();
    let mut bytes = 0;
    for p in rd.filter_map(|e| e.ok()).map(|e| e.path()) {
        if !p.is_dir() {
            continue;
        }
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let entry = name.split(".partial-").next().unwrap_or(name);
        let lock = match lock_file(&root, entry) {
            Ok(f) => f,
            Err(_) => continue,
        };
        if lock.try_lock().is_err() {
            continue;
        }
        bytes += dir_bytes(&p);
        std::fs::remove_dir_all(&p).map_err(|e| ModelError::io(&p, "remove", e))?;
        removed.push(p);
    }
    Ok((removed, bytes))
}

fn is_partial(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.contains(".partial-"))
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn read_source(dir: &Path) -> Option<Source> {
    let text = std::fs::read_to_string(dir.join("source.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// The lock file of entry `entry` (created if absent).
fn lock_file(root: &Path, entry: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(format!(".lock-{entry}")))
}

/// The entry's name for a checkpoint directory `name`, type and identity.
fn entry_name(name: &str, ty: OutType, id: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}-{}-{}", ty.name(), &id[..16])
}

/// Why an entry cannot be trusted for the checkpoint of identity `id`, or `None` when it can:
/// its `source.json` and both GGUF files must name that identity and type.
fn mismatch(dir: &Path, ty: OutType, id: &str) -> Option<String> {
    let Some(src) = read_source(dir) else {
        return Some("its source.json is missing or unreadable".into());
    };
    if src.id != id || src.ty != ty.name() || src.format != FORMAT {
        return Some(format!(
            "it was converted from another checkpoint or converter ({} {} {})",
            &src.id[..16.min(src.id.len())],
            src.ty,
            src.format
        ));
    }
    let files = convert::output_paths(dir, ty);
    for f in [&files.talker, &files.mmproj] {
        let found = crate::gguf::GgufFile::open(f).ok().and_then(|g| {
            g.header
                .get(KEY_CHECKPOINT_ID)
                .and_then(crate::gguf::Value::as_str)
                .map(str::to_owned)
        });
        if found.as_deref() != Some(id) {
            return Some(format!(
                "{} does not carry the checkpoint's identity",
                f.display()
            ));
        }
    }
    None
}

/// The GGUF pair of the checkpoint in `ckpt` stored as `ty`, from the cache under `cache`,
/// converted first when the cache has no entry this checkpoint's identity matches. `notice`
/// gets a line for everything the user should know (a conversion starting, a stale or foreign
/// entry replaced, waiting for another process's conversion); `progress` the conversion's bytes
/// done and total.
pub fn converted(
    ckpt: &Path,
    cache: &Path,
    ty: OutType,
    notice: &mut dyn FnMut(&str),
    progress: &mut dyn FnMut(u64, u64),
) -> Result<convert::Converted, ModelError> {
    let id = checkpoint_id(ckpt)?;
    let source = ckpt.canonicalize().unwrap_or_else(|_| ckpt.to_path_buf());
    let name = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "checkpoint".into());
    let root = converted_dir(cache);
    std::fs::create_dir_all(&root).map_err(|e| unwritable(&root, e))?;
    let entry = entry_name(&name, ty, &id);
    let dir = root.join(&entry);
    let lock = lock_file(&root, &entry).map_err(|e| unwritable(&root, e))?;
    if lock.try_lock().is_err() {
        notice(&format!(
            "waiting for another process converting {} into {}",
            source.display(),
            dir.display()
        ));
        lock.lock().map_err(|e| ModelError::io(&dir, "lock", e))?;
    }
    if dir.is_dir() {
        match mismatch(&dir, ty, &id) {
            None => return Ok(convert::output_paths(&dir, ty)),
            Some(why) => {
                notice(&format!(
                    "the cached conversion {} does not match {}: {why}; converting again",
                    dir.display(),
                    source.display()
                ));
                std::fs::remove_dir_all(&dir).map_err(|e| ModelError::io(&dir, "remove", e))?;
            }
        }
    }
    // Older conversions of this checkpoint's path at this type: the checkpoint changed since.
    for old in list(cache) {
        let same_source = old.source.as_deref() == Some(source.as_path());
        if same_source && old.ty.as_deref() == Some(ty.name()) && old.dir != dir {
            notice(&format!(
                "{} changed since it was converted into {}: removing that conversion",
                source.display(),
                old.dir.display()
            ));
            let _ = std::fs::remove_dir_all(&old.dir);
        }
    }
    notice(&format!(
        "converting {} to {} into the cache ({}), once",
        source.display(),
        ty.name(),
        dir.display()
    ));
    let work = root.join(format!("{entry}.partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let result = (|| {
        let c = convert::convert(ckpt, None, &work, ty, progress)?;
        let src = Source {
            checkpoint: source.clone(),
            id: id.clone(),
            ty: ty.name().into(),
            format: FORMAT.into(),
        };
        let json = serde_json::to_string_pretty(&src).map_err(|e| ModelError::Parse {
            path: work.join("source.json"),
            message: e.to_string(),
        })?;
        std::fs::write(work.join("source.json"), json)
            .map_err(|e| ModelError::io(work.join("source.json"), "write", e))?;
        std::fs::rename(&work, &dir).map_err(|e| ModelError::io(&dir, "rename", e))?;
        drop(c);
        Ok(convert::output_paths(&dir, ty))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&work);
    }
    result.map_err(|e| match e {
        ModelError::Io { path, op, source } if out_of_space(&source) => {
            ModelError::CacheFull { path, op, source }
        }
        e => e,
    })
}

/// Whether an I/O error says the disk (or the process's file-size limit) is full.
fn out_of_space(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOSPC) | Some(libc::EFBIG) | Some(libc::EDQUOT)
    )
}

fn unwritable(path: &Path, source: std::io::Error) -> ModelError {
    ModelError::CacheUnwritable {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_keep_the_directory_name_readable_and_the_identity_apart() {
        let id = "0123456789abcdef".repeat(4);
        assert_eq!(
            entry_name("Qwen3-TTS 0.6B/x", OutType::Q8_0, &id),
            "Qwen3-TTS_0.6B_x-q8_0-0123456789abcdef"
        );
    }
}
