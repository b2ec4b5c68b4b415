//! Errors of the model-file boundary: reading, validating and writing checkpoints and GGUF files.
//!
//! One enum, [`ModelError`], covers everything that can be wrong with a file on disk.
//! Every variant names the file and the key, field or tensor, what was expected and what was found,
//! and its doc says what the caller should do.
//! [`GgmlError`] covers ggml's and llama.cpp's failures at run time (re-exported by `ffi`).
//! None of them is produced by a panic or an abort: a voice assistant must survive a bad download.

use std::path::PathBuf;

/// A failure to read, validate or write a model file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The operating system refused a read or a write.
    /// Check the path and its permissions, then retry.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`open`, `read`, `write`, `rename`, ...).
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The file ends before a structure it announces.
    /// The file is incomplete (an interrupted download?): fetch it again.
    #[error(
        "{path}: truncated: {what} needs bytes {offset}..{end} but the file has {file_len} bytes"
    )]
    Truncated {
        /// The file.
        path: PathBuf,
        /// The structure being read.
        what: String,
        /// Where it starts.
        offset: u64,
        /// Where it would end.
        end: u64,
        /// The file's length.
        file_len: u64,
    },

    /// The file does not start with `GGUF`.
    /// This is not a GGUF file: pass the right path.
    #[error("{path}: not a GGUF file: magic {found:?}, expected \"GGUF\"")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first four bytes.
        found: [u8; 4],
    },

    /// The GGUF version is not one this build reads (2 or 3).
    /// Re-export the file with a current converter.
    #[error("{path}: GGUF version {found} is not supported, expected 2 or 3")]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version field.
        found: u32,
    },

    /// A count or length is over the cap this reader sets to bound its memory.
    /// The file is corrupt or hostile: do not load it.
    #[error("{path}: {what} is {found}, over the limit of {limit}")]
    LimitExceeded {
        /// The file.
        path: PathBuf,
        /// Which count or length (`n_tensors`, `key length`, `array length of 'tokenizer.ggml.tokens'`, ...).
        what: String,
        /// The cap.
        limit: u64,
        /// The value in the file.
        found: u64,
    },

    /// A metadata value has a type code that GGUF does not define, or a nested array.
    /// The file is corrupt: do not load it.
    #[error("{path}: key '{key}': invalid value type {found}")]
    BadValueType {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The type code.
        found: u32,
    },

    /// A string in the file is not UTF-8, or a key is empty.
    /// The file is corrupt: do not load it.
    #[error("{path}: {what} at byte {offset} is not a valid string")]
    BadString {
        /// The file.
        path: PathBuf,
        /// What the string is (`key`, `value of 'general.name'`, `tensor name`).
        what: String,
        /// Where the string starts.
        offset: u64,
    },

    /// The same key or tensor name appears twice.
    /// The file is corrupt: do not load it.
    #[error("{path}: duplicate {what} '{name}'")]
    Duplicate {
        /// The file.
        path: PathBuf,
        /// `key` or `tensor`.
        what: &'static str,
        /// The repeated name.
        name: String,
    },

    /// `general.alignment` is not a power of two between 1 and 65536, or not a u32.
    /// The file is corrupt: do not load it.
    #[error("{path}: general.alignment is {found}, expected a power of two in 1..=65536")]
    BadAlignment {
        /// The file.
        path: PathBuf,
        /// The value found.
        found: u64,
    },

    /// A tensor's header entry is malformed: type, rank, shape or size.
    /// The file is corrupt: do not load it.
    #[error("{path}: tensor '{tensor}': {problem}")]
    BadTensorInfo {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong, with the values found.
        problem: String,
    },

    /// A tensor's data does not start where the layout puts it (misaligned, overlapping or with gaps).
    /// The file is corrupt: do not load it.
    #[error("{path}: tensor '{tensor}': data offset {found}, expected {expected}")]
    BadTensorOffset {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The offset the preceding tensors imply.
        expected: u64,
        /// The offset in the file.
        found: u64,
    },

    /// A metadata key this model needs is absent.
    /// The file was not written for this engine's model: convert the checkpoint again with `qtts convert`.
    #[error("{path}: missing key '{key}'")]
    MissingKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },

    /// A metadata key has the wrong type or a value out of its range.
    /// The file is inconsistent: convert the checkpoint again.
    #[error("{path}: key '{key}': expected {expected}, found {found}")]
    BadKey {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What was expected.
        expected: String,
        /// What was found.
        found: String,
    },

    /// A tensor this model needs is absent.
    /// The file is incomplete: convert the checkpoint again.
    #[error("{path}: missing tensor '{tensor}'")]
    MissingTensor {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
    },

    /// A tensor has the wrong shape for the model the metadata describes.
    /// The file is inconsistent: convert the checkpoint again.
    #[error("{path}: tensor '{tensor}': shape {found:?}, expected {expected:?}")]
    WrongShape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The expected shape (ggml order for GGUF, PyTorch order for safetensors).
        expected: Vec<u64>,
        /// The shape found.
        found: Vec<u64>,
    },

    /// A tensor has a data type this engine cannot use there.
    /// Convert the checkpoint again, with a supported `--type`.
    #[error("{path}: tensor '{tensor}': type {found}, expected {expected}")]
    WrongType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The accepted types.
        expected: String,
        /// The type found.
        found: String,
    },

    /// A checkpoint's JSON file is missing a field or has a wrong value.
    /// The checkpoint is incomplete or from another model: download it again.
    #[error("{path}: field '{field}': expected {expected}, found {found}")]
    BadField {
        /// The JSON file.
        path: PathBuf,
        /// The field path (`talker_config.hidden_size`).
        field: String,
        /// What was expected.
        expected: String,
        /// What was found (`nothing` when absent).
        found: String,
    },

    /// A JSON or safetensors file does not parse.
    /// The file is corrupt: download it again.
    #[error("{path}: cannot parse: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },

    /// llama.cpp or ggml refused a file that this crate's validator accepted.
    /// This is a bug in the validator: report it with the file.
    #[error("{path}: {loader} refused the file after validation")]
    LoaderRefused {
        /// The file.
        path: PathBuf,
        /// Which loader (`llama_model_load_from_file`, `mtmd_init_from_file`, ...).
        loader: &'static str,
    },

    /// ggml or llama.cpp failed while loading or converting a model (out of memory, a graph that
    /// does not fit). Free memory or use a smaller type; if it persists, report it.
    #[error("ggml: {0}")]
    Ggml(#[from] GgmlError),

    /// The conversion cache's directory cannot be created or written (read-only, or not a
    /// directory). Set `XDG_CACHE_HOME` to a writable directory, or convert once with
    /// `qtts convert <checkpoint> <dir>` into a directory of yours and pass that with `--model`.
    #[error(
        "{path}: the conversion cache cannot be written ({source}): set XDG_CACHE_HOME to a \
         writable directory, or run `qtts convert <checkpoint> <dir>` and pass <dir> with --model"
    )]
    CacheUnwritable {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A conversion into the cache ran out of space (the disk, a quota or the process's
    /// file-size limit). Nothing of it was kept: free space (`qtts cache clear` removes older
    /// conversions) or set `XDG_CACHE_HOME` elsewhere, then retry.
    #[error(
        "{path}: {op}: {source}: the disk is full; nothing of the conversion was kept (free \
         space, e.g. `qtts cache clear`, or set XDG_CACHE_HOME elsewhere, then retry)"
    )]
    CacheFull {
        /// The file being written.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The requested output or option is not possible (e.g. an unsupported quantization type).
    /// Pick another option.
    #[error("{what}: expected {expected}, found {found}")]
    Unsupported {
        /// The option.
        what: String,
        /// What is supported.
        expected: String,
        /// What was asked.
        found: String,
    },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            op,
            source,
        }
    }
}

/// Failures of ggml or llama.cpp at run time (not of files: those are [`ModelError`]s).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GgmlError {
    /// ggml could not allocate a context, buffer or threadpool.
    /// The machine is out of memory or the request was too large: free memory or lower the size.
    #[error("{what}: allocation of {bytes} bytes failed")]
    Alloc {
        /// What was being allocated.
        what: &'static str,
        /// How much.
        bytes: usize,
    },
    /// A threadpool could not be created with this thread count and core mask.
    /// Use fewer threads or cores that exist.
    #[error("threadpool of {n_threads} threads on cores {cores:?} could not be created")]
    Threadpool {
        /// Threads asked.
        n_threads: usize,
        /// Cores asked (empty: any).
        cores: Vec<usize>,
    },
    /// A graph computation returned a non-success status (aborted or failed).
    /// Retry; if it persists, report it.
    #[error("graph compute failed with ggml status {status}")]
    Compute {
        /// ggml's status code.
        status: i32,
    },
    /// `llama_decode` returned an error code.
    /// Clear the context's memory and retry with a smaller batch.
    #[error("llama_decode failed with code {code} on a batch of {n_tokens} rows")]
    Decode {
        /// llama.cpp's return code.
        code: i32,
        /// Rows in the batch.
        n_tokens: usize,
    },
    /// An argument does not fit the object it is given to.
    /// Fix the caller.
    #[error("{what}: expected {expected}, found {found}")]
    Shape {
        /// The argument.
        what: &'static str,
        /// What fits.
        expected: String,
        /// What was given.
        found: String,
    },
}
