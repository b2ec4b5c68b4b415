//! The C ABI of qtts: load a model, start a synthesis, **pull** its audio, cancel, free.
//!
//! The header is `include/qtts.h`, made from this file by cbindgen (`cbindgen.toml`); read it for
//! the C view. Everything runs on a [`qtts::engine::Worker`]: the engine's threads never call
//! into foreign code, and the caller's threads only copy samples out ([`qtts_read`]).
//!
//! Contract:
//! - Every function returns a status ([`QTTS_OK`] or a negative `QTTS_ERR_*`), or a value whose
//!   failure case the function's docs state. After a failure, [`qtts_last_error`] gives the
//!   message on the thread that saw it.
//! - No panic crosses the boundary: one is caught and answered [`QTTS_ERR_INTERNAL`].
//! - Null pointers, non-UTF-8 strings and structs whose `size` is smaller than the first
//!   version's are answered [`QTTS_ERR_INVALID_ARGUMENT`]; never undefined behaviour that a check
//!   could catch.
//! - Versions (the header's "ABI versions" comment): every struct that may grow starts with its
//!   `size`, the caller's `sizeof`; the library never reads or writes past it. A caller built
//!   against an older header passes a smaller size and the fields it lacks take their defaults;
//!   a newer caller's extra bytes are zeroed by the `_defaults` functions and otherwise ignored.
//!   The functions that fill a struct take the caller's size (the header's inline
//!   `qtts_options_init`, `qtts_request_init` and `qtts_synthesis_summary` pass `sizeof`);
//!   version 1's functions of those names stay exported with version 1's sizes (`v1.rs`), for
//!   programs built against its header. [`QTTS_ABI_VERSION`] changes only when a program built
//!   against an earlier header would break.
//! - Text written while it is spoken (`live.rs`): a request with [`QttsRequest::live`] takes its
//!   text through [`qtts_feed_text`] in any pieces, then [`qtts_finish_text`].
//! - Cloned voices (Base models; `voice.rs`): [`qtts_voice_clone`] from a recording,
//!   [`qtts_voice_save`] and [`qtts_voice_load`] by name, spoken through
//!   [`QttsRequest::cloned_voice`].
//! - Threads: an engine may be used from any thread ([`qtts_synthesize`] from several at once);
//!   a synthesis is read from one thread at a time, and [`qtts_cancel`] may be called from any
//!   thread at any time before [`qtts_synthesis_free`].

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

mod info;
mod live;
mod v1;
mod voice;
pub use info::*;
pub use live::*;
pub use v1::*;
pub use voice::*;

use qtts::engine::{
    Canceller, EngineConfig, EngineError, FeedStart, Job, Read, Request, TextWriter, ThreadPlan,
    Worker,
};
use qtts::model::ModelFiles;
use qtts::sampling::SamplingOverrides;
use qtts::talker::{StopReason, Voice};
use qtts::voice::SharedCloner;

/// ABI versions. Every struct that may grow starts with `size`, the caller's `sizeof`; the
/// library never reads or writes a byte past it. A caller built against an older header passes a
/// smaller size, and the fields it lacks take their defaults; the library's newer fields are
/// added at the ends of structs only. The functions that fill a struct take the caller's size
/// (`qtts_options_defaults`, `qtts_request_defaults`, `qtts_synthesis_summary_sized`); this
/// header's inline `qtts_options_init`, `qtts_request_init` and `qtts_synthesis_summary` pass
/// `sizeof` for them. Programs built against the first header call exported functions of those
/// names, which keep the first version's sizes (request 56 bytes and options 32 on 64-bit
/// targets, a summary without `size`). A program built against the header that first had
/// `cloned_voice` but not these rules gets the first version's request from that exported
/// `qtts_request_init`, so its `cloned_voice` is not read: rebuild it against this header to
/// use cloned voices. `QTTS_ABI_VERSION` changes only when a program built against an earlier
/// header would break: compare it with [`qtts_abi_version`] at startup.
pub const QTTS_ABI_VERSION: u32 = 1;

/// Success.
pub const QTTS_OK: i32 = 0;
/// A null pointer, a string that is not UTF-8, a struct `size` too small, a value out of range.
pub const QTTS_ERR_INVALID_ARGUMENT: i32 = -1;
/// The model could not be found or loaded (missing or corrupt files).
pub const QTTS_ERR_MODEL: i32 = -2;
/// The request does not fit the model (unknown voice or language, empty text, a sampling
/// setting out of range, ...): refused by [`qtts_synthesize`], before anything is queued.
pub const QTTS_ERR_REQUEST: i32 = -3;
/// The engine's queue is full: try again when a synthesis ends.
pub const QTTS_ERR_BUSY: i32 = -4;
/// [`qtts_read`] found no audio within its timeout; the synthesis goes on.
pub const QTTS_ERR_TIMEOUT: i32 = -5;
/// An engine thread failed, or a bug (a caught panic): free the engine and load it again.
pub const QTTS_ERR_INTERNAL: i32 = -6;
/// A reference recording or a saved voice cannot be used (not audio, too short, silent, a damaged
/// file, no such voice, a voice of another model), or the model cannot clone (not a Base model).
pub const QTTS_ERR_VOICE: i32 = -7;
/// The synthesis is over (ended, cancelled or failed): it takes no more text
/// ([`qtts_feed_text`]).
pub const QTTS_ERR_ENDED: i32 = -8;

/// The talker emitted end-of-speech ([`QttsSummary::stop`]).
pub const QTTS_STOP_EOS: i32 = 0;
/// The frame cap was reached: `max_frames`, the runaway guard scaled to the text, or the context.
pub const QTTS_STOP_FRAME_CAP: i32 = 1;
/// The synthesis was cancelled.
pub const QTTS_STOP_CANCELLED: i32 = 2;

/// Options of [`qtts_engine_load`]; fill with `qtts_options_init` first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QttsOptions {
    /// `sizeof(QttsOptions)` as the caller was built (set by [`qtts_options_init`]).
    pub size: usize,
    /// The model (required): a directory with `talker-<type>.gguf` and `mmproj-<type>.gguf`, a
    /// talker GGUF, an official checkpoint directory (converted once into the cache), or
    /// `builtin`, the tiny random-weight test model (noise, not speech). NULL fails with
    /// [`QTTS_ERR_MODEL`].
    pub model: *const c_char,
    /// CPU cores for the engine (`qtts --cores`, Python's `cores`); 0: all this process may use.
    /// The engine's plan for that many cores, as on every surface. (Named `threads` in the first
    /// header, at the same place.)
    pub cores: u32,
    /// Syntheses that may wait behind the running ones before [`QTTS_ERR_BUSY`]; 0: 8 (the
    /// default on every surface).
    pub queue: u32,
    /// Where converted checkpoints and the built-in model are kept; NULL: `$XDG_CACHE_HOME/qtts`
    /// or `~/.cache/qtts`.
    pub cache_dir: *const c_char,
    /// Syntheses spoken at once (`qtts serve --max-streams`, Python's `max_streams`): each
    /// frame, their steps run as one batch, and each synthesis's audio is what it gets alone.
    /// 0 or 1: one at a time (callers built against an earlier header get that). At most 16.
    pub max_streams: u32,
}

/// A request to [`qtts_synthesize`]; fill with `qtts_request_init` first.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QttsRequest {
    /// `sizeof(QttsRequest)` as the caller was built (set by [`qtts_request_init`]).
    pub size: usize,
    /// UTF-8 text to speak (required).
    pub text: *const c_char,
    /// A voice by name: a speaker of a CustomVoice model ([`qtts_engine_voice_name`]), else a
    /// voice saved under that name (`qtts voice add`, [`qtts_voice_save`]) in the default voices
    /// folder, as `qtts speak --voice` and Python's `voice=` resolve it. NULL: the model's default
    /// speaker (vivian where it has her, else its first; none for other models).
    pub voice: *const c_char,
    /// A language (`english`, `chinese`, ...); NULL: `auto`.
    pub language: *const c_char,
    /// A voice instruction (VoiceDesign, 1.7B CustomVoice); NULL: none.
    pub instruct: *const c_char,
    /// Sampling seed: the same request and seed give the same audio.
    pub seed: u64,
    /// Frame cap per utterance (80 ms each); 0: scaled to the text.
    pub max_frames: u32,
    /// Frames per utterance before end-of-speech may be sampled; 0: the model's minimum. Equal
    /// to `max_frames`, it fixes the length (benchmarks, tests).
    pub min_frames: u32,
    /// A cloned voice ([`qtts_voice_clone`], [`qtts_voice_load`]) of this engine's model, instead
    /// of `voice` and `instruct` (which must then be NULL); NULL: none. Added after the first
    /// version: a caller built without it passes a smaller `size` and gets NULL.
    pub cloned_voice: *const QttsVoice,
    /// Codebook-0 sampling temperature; 0: greedy; negative: the model's (the default).
    pub temperature: f32,
    /// Keep the k most likely codes (0: all); negative: the model's (the default).
    pub top_k: i32,
    /// Keep the most likely codes up to this probability, in (0, 1]; negative: the model's (the
    /// default).
    pub top_p: f32,
    /// Repetition penalty over codebook 0, above 0 (1: none); negative: the model's (the
    /// default).
    pub repetition_penalty: f32,
    /// 1: the text is written while it is spoken (`qtts speak --live`, Python's `live=True`):
    /// `text` is its first piece (NULL: none yet), the rest comes through [`qtts_feed_text`] and
    /// its end with [`qtts_finish_text`]; speech starts at the first word and is the audio the
    /// whole text gives. One utterance (about 150 tokens of text) for now. 0: `text` is the whole
    /// text (the default; callers built against an earlier header get that).
    pub live: i32,
    /// When a live synthesis starts speaking: 0 (the default) at the pace of its text: at the
    /// first word when the text comes at least as fast as speech takes it (12.5 tokens a
    /// second), else once enough of it is there that playback will not wait for the rest; 1: at
    /// the first word; n > 1: once n tokens are final; -1: at the text's end.
    pub live_start: i32,
}

/// The end of a synthesis, from `qtts_synthesis_summary`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct QttsSummary {
    /// Set by the caller to its `sizeof(QttsSummary)`; on return, the bytes the library filled
    /// (the fields past them, zeroed, are newer than the library).
    pub size: usize,
    /// Frames generated (80 ms each).
    pub frames: u64,
    /// Samples made (24 kHz mono).
    pub samples: u64,
    /// 1 when the synthesis was cancelled, else 0 (`stop == QTTS_STOP_CANCELLED`).
    pub cancelled: i32,
    /// Why it ended: [`QTTS_STOP_EOS`], [`QTTS_STOP_FRAME_CAP`] or [`QTTS_STOP_CANCELLED`] (that
    /// of its last utterance, or the cancel).
    pub stop: i32,
    /// Request to first audio, in milliseconds; -1 when no audio was made.
    pub ttfa_ms: f64,
    /// Real-time factor of generation (time to the last sample over the audio's duration).
    pub rtf: f64,
    /// Frames that waited for text not written yet ([`QttsRequest::live`]): a gap the writer
    /// caused, not the engine; 0 otherwise.
    pub text_starved_frames: u64,
}

/// A loaded model on its own thread (opaque).
pub struct QttsEngine {
    worker: Worker,
    voices: Vec<CString>,
    languages: Vec<CString>,
    model_type: CString,
    builtin: bool,
    files: ModelFiles,
    /// A Base model's encoders, loaded by the first [`qtts_voice_clone`].
    cloner: SharedCloner,
}

/// A running synthesis (opaque).
pub struct QttsSynthesis {
    job: Mutex<Job>,
    cancel: Canceller,
    /// A live request's text writer ([`QttsRequest::live`]) until [`qtts_finish_text`]; `Err`
    /// for a request given its whole text.
    writer: Mutex<Result<Option<TextWriter>, ()>>,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_error(msg: impl std::fmt::Display) {
    let text = msg.to_string().replace('\0', " ");
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(text).unwrap_or_default());
}

/// Runs `f`, turning an `Err((code, message))` or a panic into a status and the thread's last
/// error.
fn guard(f: impl FnOnce() -> Result<i32, (i32, String)>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err((code, msg))) => {
            set_error(msg);
            code
        }
        Err(_) => {
            set_error(
                "internal error: a panic was caught at the C boundary (a bug: please report it)",
            );
            QTTS_ERR_INTERNAL
        }
    }
}

fn invalid(msg: impl Into<String>) -> (i32, String) {
    (QTTS_ERR_INVALID_ARGUMENT, msg.into())
}

fn code_of(e: &EngineError) -> i32 {
    match e {
        EngineError::Model(_) => QTTS_ERR_MODEL,
        EngineError::Talker(_) | EngineError::EmptyText | EngineError::Sampling(_) => {
            QTTS_ERR_REQUEST
        }
        EngineError::Busy { .. } => QTTS_ERR_BUSY,
        EngineError::Plan { .. } => QTTS_ERR_INVALID_ARGUMENT,
        _ => QTTS_ERR_INTERNAL,
    }
}

/// An optional UTF-8 string argument.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string valid for the call.
unsafe fn opt_str(p: *const c_char, what: &str) -> Result<Option<String>, (i32, String)> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(|s| Some(s.to_owned())).map_err(|e| {
        invalid(format!(
            "{what}: expected UTF-8, found an invalid byte at {}",
            e.valid_up_to()
        ))
    })
}

/// Reads a caller's struct of which only `size` bytes may exist: the missing tail keeps the
/// defaults in `init`.
///
/// # Safety
/// `p` is null or points to at least `size_of::<usize>()` readable bytes starting with the
/// struct's `size` field, and to that many readable bytes in all.
unsafe fn read_sized<T: Copy>(
    p: *const T,
    init: T,
    min: usize,
    what: &str,
) -> Result<T, (i32, String)> {
    if p.is_null() {
        return Err(invalid(format!("{what}: expected a pointer, found NULL")));
    }
    // SAFETY: every such struct starts with its size (a usize), readable by the contract.
    let size = unsafe { std::ptr::read_unaligned(p.cast::<usize>()) };
    if size < min {
        return Err(invalid(format!(
            "{what}.size: expected at least {min} (sizeof of the first version; call the _init function), found {size}"
        )));
    }
    let mut out = init;
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: `n` bytes are readable at `p` (the caller's size) and fit in `out`; T is plain
    // old data (pointers and integers), so any bytes the caller wrote are a valid T.
    unsafe {
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&raw mut out).cast::<u8>(), n);
    }
    Ok(out)
}

/// Writes `value` into a caller's struct of `size` bytes: the first `min(size, sizeof T)` bytes of
/// `value`, zeros for the caller's bytes past `T` (fields newer than this library). Never a byte
/// past `size`.
///
/// # Safety
/// `p` is null or points to `size` writable bytes.
unsafe fn write_sized<T: Copy>(
    p: *mut T,
    value: T,
    size: usize,
    min: usize,
    what: &str,
) -> Result<(), (i32, String)> {
    if p.is_null() {
        return Err(invalid(format!("{what}: expected a pointer, found NULL")));
    }
    if size < min {
        return Err(invalid(format!(
            "{what} size: expected at least {min} (sizeof of the first version; pass sizeof), found {size}"
        )));
    }
    let own = std::mem::size_of::<T>();
    let n = size.min(own);
    // SAFETY: `size` writable bytes at `p` by the contract; `n <= size` bytes of `value` are
    // copied and `size - n` zeroed after them.
    unsafe {
        std::ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), p.cast::<u8>(), n);
        std::ptr::write_bytes(p.cast::<u8>().add(n), 0, size - n);
    }
    Ok(())
}

/// The first version's struct sizes ([`v1`]): a caller's `size` below these is an error.
pub(crate) const OPTIONS_V1: usize = std::mem::size_of::<v1::OptionsV1>();
pub(crate) const REQUEST_V1: usize = std::mem::size_of::<v1::RequestV1>();
/// The summary's first size (the version that gave it a `size`).
const SUMMARY_V2: usize = std::mem::size_of::<QttsSummary>();

pub(crate) fn default_options() -> QttsOptions {
    QttsOptions {
        size: std::mem::size_of::<QttsOptions>(),
        model: std::ptr::null(),
        cores: 0,
        queue: 0,
        cache_dir: std::ptr::null(),
        max_streams: 0,
    }
}

pub(crate) fn default_request() -> QttsRequest {
    QttsRequest {
        size: std::mem::size_of::<QttsRequest>(),
        text: std::ptr::null(),
        voice: std::ptr::null(),
        language: std::ptr::null(),
        instruct: std::ptr::null(),
        seed: 0,
        max_frames: 0,
        min_frames: 0,
        cloned_voice: std::ptr::null(),
        temperature: -1.0,
        top_k: -1,
        top_p: -1.0,
        repetition_penalty: -1.0,
        live: 0,
        live_start: 0,
    }
}

/// This library's ABI version ([`QTTS_ABI_VERSION`] as it was built): compare with the header's
/// `QTTS_ABI_VERSION` at startup.
#[no_mangle]
pub extern "C" fn qtts_abi_version() -> u32 {
    QTTS_ABI_VERSION
}

/// The sample rate of all audio: 24000 Hz, mono, f32 in [-1, 1].
#[no_mangle]
pub extern "C" fn qtts_sample_rate() -> u32 {
    qtts::audio::SAMPLE_RATE
}

/// The message of the last failure on this thread ("" when none): valid until the next call
/// into this library on this thread; do not free it.
#[no_mangle]
pub extern "C" fn qtts_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Fills the caller's `size` bytes at `opts` with the defaults, `size` included (bytes past this
/// library's struct are zeroed); the header's `qtts_options_init(opts)` passes `sizeof *opts`.
/// Returns a status.
///
/// # Safety
/// `opts` is null or points to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qtts_options_defaults(opts: *mut QttsOptions, size: usize) -> i32 {
    let value = QttsOptions {
        size,
        ..default_options()
    };
    // SAFETY: by the contract.
    guard(|| unsafe { write_sized(opts, value, size, OPTIONS_V1, "opts") }.map(|()| QTTS_OK))
}

/// Fills the caller's `size` bytes at `req` with the defaults, `size` included (bytes past this
/// library's struct are zeroed); the header's `qtts_request_init(req)` passes `sizeof *req`.
/// Returns a status.
///
/// # Safety
/// `req` is null or points to `size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn qtts_request_defaults(req: *mut QttsRequest, size: usize) -> i32 {
    let value = QttsRequest {
        size,
        ..default_request()
    };
    // SAFETY: by the contract.
    guard(|| unsafe { write_sized(req, value, size, REQUEST_V1, "req") }.map(|()| QTTS_OK))
}

/// Loads a model and starts its engine; on success `*out` holds it (free with
/// [`qtts_engine_free`]). Loading a model takes from a second (the built-in one) to a minute
/// (converting a checkpoint the first time). Returns a status.
///
/// # Safety
/// `opts` is null (the defaults) or points to a `QttsOptions` of at least its `size` bytes whose
/// strings are null or NUL-terminated; `out` points to a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn qtts_engine_load(
    opts: *const QttsOptions,
    out: *mut *mut QttsEngine,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out: expected a pointer, found NULL"));
        }
        // SAFETY: `out` is writable by the contract; cleared first so a failure leaves NULL.
        unsafe { out.write(std::ptr::null_mut()) };
        let o = if opts.is_null() {
            default_options()
        } else {
            // SAFETY: by the contract.
            unsafe { read_sized(opts, default_options(), OPTIONS_V1, "opts")? }
        };
        // SAFETY: the strings are null or NUL-terminated by the contract.
        let (model, cache) = unsafe {
            (
                opt_str(o.model, "opts.model")?,
                opt_str(o.cache_dir, "opts.cache_dir")?,
            )
        };
        let cache = cache
            .map(PathBuf::from)
            .unwrap_or_else(qtts::model::find::cache_dir);
        let found = qtts::model::find::named(model.as_deref().map(std::path::Path::new), &cache)
            .map_err(|e| (QTTS_ERR_MODEL, e.to_string()))?;
        let mut config = EngineConfig::default();
        if o.cores > 0 {
            config.plan = ThreadPlan::default_for(o.cores as usize);
        }
        let most = qtts::code_predictor::MAX_ROWS;
        if o.max_streams as usize > most {
            return Err(invalid(format!(
                "opts.max_streams: expected 0 to {most}, found {}",
                o.max_streams
            )));
        }
        config.max_streams = (o.max_streams as usize).max(1);
        let threads = config.plan.all_cores().len().max(1);
        let queue = o.queue as usize;
        let worker =
            Worker::load(&found.files, config, queue).map_err(|e| (code_of(&e), e.to_string()))?;
        let c_strings = |v: &[String]| -> Vec<CString> {
            v.iter()
                .map(|s| CString::new(s.replace('\0', " ")).unwrap_or_default())
                .collect()
        };
        let info = worker.info();
        let voices = c_strings(&info.speakers);
        let languages = c_strings(&info.languages);
        let model_type = CString::new(info.model_type).unwrap_or_default();
        let engine = Box::new(QttsEngine {
            worker,
            voices,
            languages,
            model_type,
            builtin: found.builtin,
            cloner: SharedCloner::new(found.files.clone(), threads),
            files: found.files,
        });
        // SAFETY: writable by the contract.
        unsafe { out.write(Box::into_raw(engine)) };
        Ok(QTTS_OK)
    })
}

/// Stops the engine: cancels its running and queued syntheses and joins its threads. Their
/// handles stay valid (reads answer the end) until freed. NULL is ignored.
///
/// # Safety
/// `engine` is null or came from [`qtts_engine_load`] and was not freed; no other thread uses it.
#[no_mangle]
pub unsafe extern "C" fn qtts_engine_free(engine: *mut QttsEngine) {
    if engine.is_null() {
        return;
    }
    // SAFETY: owned by the caller, who gives it back (contract).
    let engine = unsafe { Box::from_raw(engine) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(engine)));
}

/// Starts synthesizing `req` (queued behind running syntheses); on success `*out` holds its
/// handle, read with [`qtts_read`] and freed with [`qtts_synthesis_free`]. The request is checked
/// first and refused at once, before anything is queued: [`QTTS_ERR_REQUEST`] for an unknown
/// voice or language, empty text, an instruction the model does not take or a sampling setting
/// out of range; [`QTTS_ERR_VOICE`] for a saved or cloned voice of another model or a damaged
/// voice file; [`QTTS_ERR_BUSY`] when the queue is full. Returns a status.
///
/// # Safety
/// `engine` is a live engine; `req` points to a `QttsRequest` of at least its `size` bytes whose
/// strings are null or NUL-terminated and whose `cloned_voice` is null or a live voice; `out`
/// points to a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn qtts_synthesize(
    engine: *const QttsEngine,
    req: *const QttsRequest,
    out: *mut *mut QttsSynthesis,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out: expected a pointer, found NULL"));
        }
        // SAFETY: writable by the contract; cleared so a failure leaves NULL.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: null or live by the contract.
        let engine = unsafe { engine.as_ref() }
            .ok_or_else(|| invalid("engine: expected an engine, found NULL"))?;
        // SAFETY: by the contract.
        let r = unsafe { read_sized(req, default_request(), REQUEST_V1, "req")? };
        // SAFETY: strings null or NUL-terminated by the contract.
        let (text, voice, language, instruct) = unsafe {
            (
                opt_str(r.text, "req.text")?,
                opt_str(r.voice, "req.voice")?,
                opt_str(r.language, "req.language")?,
                opt_str(r.instruct, "req.instruct")?,
            )
        };
        let (mut request, writer) = match r.live {
            0 => {
                let text =
                    text.ok_or_else(|| invalid("req.text: expected UTF-8 text, found NULL"))?;
                (Request::text(text), Err(()))
            }
            1 => {
                let start = match r.live_start {
                    0 => FeedStart::Paced,
                    1 => FeedStart::FirstWord,
                    -1 => FeedStart::TextEnd,
                    n if n > 1 => FeedStart::Tokens(n as usize),
                    n => {
                        return Err(invalid(format!(
                            "req.live_start: expected -1 (the text's end), 0 (paced), 1 (the \
                             first word) or a number of tokens, found {n}"
                        )))
                    }
                };
                let (mut w, feed) = qtts::engine::text_feed();
                // A fresh feed takes its first piece at once (nothing reads it yet).
                let _ = w.push(text.as_deref().unwrap_or(""));
                let mut req = Request::fed(feed);
                req.feed_start = start;
                (req, Ok(Some(w)))
            }
            n => return Err(invalid(format!("req.live: expected 0 or 1, found {n}"))),
        };
        // SAFETY: null or a live voice by the contract.
        request.voice = match unsafe { r.cloned_voice.as_ref() } {
            Some(v) => {
                if voice.is_some() || instruct.is_some() {
                    return Err((
                        QTTS_ERR_REQUEST,
                        "req.cloned_voice: a cloned voice takes no req.voice or req.instruct (the \
                         recording gives the voice); set them to NULL"
                            .into(),
                    ));
                }
                voice::speaking(engine, v, language)?
            }
            None => match voice {
                Some(name) if instruct.is_none() => voice::named(engine, &name, language)?,
                // An instruction goes with a speaker of the model (1.7B CustomVoice).
                speaker => Voice {
                    speaker,
                    language,
                    instruct,
                    xvector: None,
                    reference: None,
                },
            },
        };
        request.seed = r.seed;
        request.max_frames = (r.max_frames > 0).then_some(r.max_frames as usize);
        request.min_frames = request.min_frames.max(r.min_frames as usize);
        let unset = |v: f32| v < 0.0;
        request.overrides = SamplingOverrides {
            temperature: (!unset(r.temperature)).then_some(r.temperature),
            top_k: usize::try_from(r.top_k).ok(),
            top_p: (!unset(r.top_p)).then_some(r.top_p),
        };
        request.repetition_penalty = (!unset(r.repetition_penalty)).then_some(r.repetition_penalty);
        let job = engine
            .worker
            .submit(request)
            .map_err(|e| (code_of(&e), e.to_string()))?;
        let cancel = job.canceller();
        let handle = Box::new(QttsSynthesis {
            job: Mutex::new(job),
            cancel,
            writer: Mutex::new(writer),
        });
        // SAFETY: writable by the contract.
        unsafe { out.write(Box::into_raw(handle)) };
        Ok(QTTS_OK)
    })
}

/// Copies up to `cap` samples of the synthesis's audio (24 kHz mono f32) into `buf`, waiting up
/// to `timeout_ms` for some (negative: as long as it takes; 0: only what is there).
///
/// Returns the number of samples copied (> 0); 0 at the end of the audio (after a cancel too);
/// [`QTTS_ERR_TIMEOUT`] when none came in time (call again); another negative status when the
/// synthesis failed (its message in [`qtts_last_error`]).
///
/// # Safety
/// `s` is a live synthesis; `buf` points to `cap` writable floats.
#[no_mangle]
pub unsafe extern "C" fn qtts_read(
    s: *mut QttsSynthesis,
    buf: *mut f32,
    cap: usize,
    timeout_ms: i32,
) -> i64 {
    let mut count = 0i64;
    let status = guard(|| {
        // SAFETY: null or live by the contract; only shared access (the job is behind a mutex).
        let s = unsafe { s.as_ref() }
            .ok_or_else(|| invalid("synthesis: expected a handle, found NULL"))?;
        if buf.is_null() || cap == 0 {
            return Err(invalid(format!(
                "buf: expected room for at least 1 sample, found {} of capacity {cap}",
                if buf.is_null() { "NULL" } else { "a buffer" }
            )));
        }
        // SAFETY: `cap` writable floats at `buf` by the contract.
        let out = unsafe { std::slice::from_raw_parts_mut(buf, cap) };
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        let mut job = s.job.lock().unwrap_or_else(|e| e.into_inner());
        match job.read(out, timeout) {
            Read::Samples(n) => {
                count = n as i64;
                Ok(QTTS_OK)
            }
            Read::Timeout => Err((
                QTTS_ERR_TIMEOUT,
                format!("no audio within {timeout_ms} ms; the synthesis goes on"),
            )),
            Read::End => match job.outcome() {
                Some(Err(e)) => Err((code_of(e), e.to_string())),
                _ => Ok(QTTS_OK),
            },
        }
    });
    if status == QTTS_OK {
        count
    } else {
        i64::from(status)
    }
}

/// Stops the synthesis between frames (queued or running); what was made stays readable, then
/// [`qtts_read`] answers 0. Any thread, any time before [`qtts_synthesis_free`]. Returns a
/// status.
///
/// # Safety
/// `s` is null or a live synthesis.
#[no_mangle]
pub unsafe extern "C" fn qtts_cancel(s: *const QttsSynthesis) -> i32 {
    // SAFETY: null or live by the contract; the canceller is an atomic flag.
    match unsafe { s.as_ref() } {
        Some(s) => {
            s.cancel.cancel();
            QTTS_OK
        }
        None => {
            set_error("synthesis: expected a handle, found NULL");
            QTTS_ERR_INVALID_ARGUMENT
        }
    }
}

/// The summary of a synthesis at its end, in this library's layout.
///
/// # Safety
/// `s` is null or a live synthesis.
pub(crate) unsafe fn summary_of(s: *const QttsSynthesis) -> Result<QttsSummary, (i32, String)> {
    // SAFETY: null or live by the contract.
    let s =
        unsafe { s.as_ref() }.ok_or_else(|| invalid("synthesis: expected a handle, found NULL"))?;
    let job = s.job.lock().unwrap_or_else(|e| e.into_inner());
    let summary = match job.outcome() {
        None => return Err(invalid("summary: expected a synthesis at its end (qtts_read answered 0), found one still running")),
        Some(Err(e)) => return Err((code_of(e), e.to_string())),
        Some(Ok(summary)) => summary,
    };
    Ok(QttsSummary {
        size: std::mem::size_of::<QttsSummary>(),
        frames: summary.frames as u64,
        samples: summary.samples as u64,
        cancelled: i32::from(summary.stop == StopReason::Cancelled),
        stop: match summary.stop {
            StopReason::Eos => QTTS_STOP_EOS,
            StopReason::FrameCap { .. } => QTTS_STOP_FRAME_CAP,
            StopReason::Cancelled => QTTS_STOP_CANCELLED,
        },
        ttfa_ms: summary.ttfa.map_or(-1.0, |t| t.as_secs_f64() * 1e3),
        rtf: summary.rtf(),
        text_starved_frames: summary.text_starved_frames as u64,
    })
}

/// Writes the synthesis's summary into the caller's struct once [`qtts_read`] has answered 0:
/// the caller sets `out->size` to its `sizeof(QttsSummary)` (the header's inline
/// `qtts_synthesis_summary` does), and on return `out->size` is the number of bytes filled (the
/// rest, fields newer than this library, are zeroed). Returns a status
/// ([`QTTS_ERR_INVALID_ARGUMENT`] before the end, the synthesis's error when it failed).
///
/// # Safety
/// `s` is a live synthesis; `out` points to `out->size` writable bytes, `size` first.
#[no_mangle]
pub unsafe extern "C" fn qtts_synthesis_summary_sized(
    s: *const QttsSynthesis,
    out: *mut QttsSummary,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out: expected a pointer, found NULL"));
        }
        // SAFETY: the struct starts with its size, readable by the contract.
        let size = unsafe { std::ptr::read_unaligned(out.cast::<usize>()) };
        // SAFETY: null or live by the contract.
        let mut q = unsafe { summary_of(s)? };
        q.size = size.min(std::mem::size_of::<QttsSummary>());
        // SAFETY: `size` writable bytes by the contract.
        unsafe { write_sized(out, q, size, SUMMARY_V2, "out")? };
        Ok(QTTS_OK)
    })
}

/// Frees a synthesis, cancelling it if it has not ended. NULL is ignored.
///
/// # Safety
/// `s` is null or a live synthesis no other thread uses (a [`qtts_cancel`] included).
#[no_mangle]
pub unsafe extern "C" fn qtts_synthesis_free(s: *mut QttsSynthesis) {
    if s.is_null() {
        return;
    }
    // SAFETY: owned by the caller, who gives it back (contract).
    let s = unsafe { Box::from_raw(s) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(s)));
}
