//! What can go wrong fetching a model from the Hub.

use std::path::PathBuf;

/// A failure to fetch a model from the Hub. Each variant says what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HubError {
    /// `HF_HUB_OFFLINE` is set and the cache lacks files of the checkpoint.
    /// Unset it to fetch them, or fill the cache where there is network and copy it here.
    #[error(
        "{repo}: HF_HUB_OFFLINE is set and the cache at {cache} lacks {missing}: unset \
         HF_HUB_OFFLINE to fetch it, or copy a cache that has it"
    )]
    Offline {
        /// The repository.
        repo: String,
        /// The cache's `hub` folder.
        cache: PathBuf,
        /// What is missing (a file, or the revision itself).
        missing: String,
    },
    /// The endpoint could not be reached.
    /// Check the network, or set HF_ENDPOINT to a mirror you can reach.
    #[error(
        "{url}: cannot reach the Hub ({cause}): check the network, or set HF_ENDPOINT to a mirror"
    )]
    Network {
        /// What was requested.
        url: String,
        /// The transport's error.
        cause: String,
    },
    /// 404: no such repository, revision or file.
    /// Check the name (`qtts pull` lists the published ones) and the revision.
    #[error(
        "{repo}: the Hub has no such repository or revision ({url} answered 404; `qtts pull` \
         lists the published Qwen3-TTS-12Hz repositories)"
    )]
    NotFound {
        /// The repository.
        repo: String,
        /// What was requested.
        url: String,
    },
    /// 401 or 403: a gated or private repository, and no token or one without access.
    /// Accept the repository's conditions on the Hub, then set HF_TOKEN.
    #[error("{repo}: {url} answered {status}: {advice}")]
    Unauthorized {
        /// The repository.
        repo: String,
        /// What was requested.
        url: String,
        /// 401 or 403.
        status: u16,
        /// What to do, by whether a token was sent.
        advice: String,
    },
    /// Another HTTP status.
    /// Retry later; if it persists, the endpoint may not be a Hugging Face Hub.
    #[error(
        "{url} answered HTTP {status}, expected 200 or 206: retry later, or check HF_ENDPOINT"
    )]
    Status {
        /// What was requested.
        url: String,
        /// The status.
        status: u16,
    },
    /// The endpoint's answer is not what the Hub answers.
    /// Check HF_ENDPOINT: it must be the Hub or a mirror of it.
    #[error("{url}: {what}, expected {expected}: is HF_ENDPOINT the Hub or a mirror of it?")]
    BadAnswer {
        /// What was requested.
        url: String,
        /// What came.
        what: String,
        /// What the Hub sends.
        expected: String,
    },
    /// The repository is not a Qwen3-TTS-12Hz checkpoint.
    /// Pick one of the published repositories (`qtts pull` lists them).
    #[error(
        "{repo}: not a Qwen3-TTS-12Hz checkpoint: {why} (`qtts pull` lists the published ones)"
    )]
    NotACheckpoint {
        /// The repository.
        repo: String,
        /// What is wrong.
        why: String,
    },
    /// A file's bytes do not have the hash the Hub lists: it was removed.
    /// Run the command again; if it happens again, the mirror or a proxy alters files.
    #[error(
        "{file}: the bytes received hash to {found}, the Hub lists {expected}: the file was \
         removed; run the command again (if it happens again, a mirror or proxy alters files)"
    )]
    Corrupt {
        /// The file.
        file: String,
        /// The Hub's hash.
        expected: String,
        /// The received bytes' hash.
        found: String,
    },
    /// The transfer stopped before the end and the retries ran out.
    /// Run the command again: it resumes where this one stopped.
    #[error(
        "{file}: the transfer stopped at {at} of {size} bytes ({cause}): run the command again, \
         it resumes from there"
    )]
    Interrupted {
        /// The file.
        file: String,
        /// Bytes on disk.
        at: u64,
        /// Its size.
        size: u64,
        /// Why.
        cause: String,
    },
    /// Not enough free space for the files to fetch.
    /// Free space, or point HF_HOME (or HF_HUB_CACHE) to a disk that has it.
    #[error(
        "{dir}: {need} bytes to fetch, {available} free: free space, or set HF_HOME to a disk \
         with room"
    )]
    DiskFull {
        /// The cache folder.
        dir: PathBuf,
        /// Bytes needed.
        need: u64,
        /// Bytes free.
        available: u64,
    },
    /// The operating system refused a read or a write in the cache.
    /// Check the path and its permissions (or its free space), then retry.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl HubError {
    pub(super) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        HubError::Io {
            path: path.into(),
            op,
            source,
        }
    }
}
