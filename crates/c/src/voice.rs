//! Cloned voices through the C ABI (Base models): clone one from a recording, save and load it by
//! name (the store `qtts voice` uses), and speak with it
//! ([`QttsRequest::cloned_voice`](crate::QttsRequest::cloned_voice)).

use std::ffi::c_char;
use std::path::PathBuf;
use std::ptr::null_mut;

use qtts::talker::Voice;
use qtts::voice::{ClonedVoice, VoiceError, VoiceStore};

use crate::{
    guard, invalid, opt_str, QttsEngine, QTTS_ERR_MODEL, QTTS_ERR_REQUEST, QTTS_ERR_VOICE, QTTS_OK,
};

/// A voice cloned from a recording (opaque), made by [`qtts_voice_clone`] or [`qtts_voice_load`]
/// for one model. Read-only: any number of threads and requests may use it at once. A synthesis
/// copies what it needs, so the voice may be freed ([`qtts_voice_free`]) as soon as
/// `qtts_synthesize` has returned.
pub struct QttsVoice {
    inner: ClonedVoice,
}

fn voice_err(e: VoiceError) -> (i32, String) {
    let code = match e {
        // A name that is no voice at all is a request's error, as an unknown speaker is.
        VoiceError::UnknownName { .. } => QTTS_ERR_REQUEST,
        _ => QTTS_ERR_VOICE,
    };
    (code, e.to_string())
}

fn store(dir: Option<String>) -> VoiceStore {
    VoiceStore::new(dir.map_or_else(VoiceStore::default_dir, PathBuf::from))
}

/// The engine's model file (the mmproj), opened to check voices against.
fn mmproj(engine: &QttsEngine) -> Result<qtts::gguf::GgufFile, (i32, String)> {
    qtts::gguf::GgufFile::open(&engine.files.mmproj).map_err(|e| (QTTS_ERR_MODEL, e.to_string()))
}

/// The request voice of `v` on `engine`'s model.
pub(crate) fn speaking(
    engine: &QttsEngine,
    v: &QttsVoice,
    language: Option<String>,
) -> Result<Voice, (i32, String)> {
    qtts::voice::speaking_voice(&mmproj(engine)?, &v.inner, language).map_err(voice_err)
}

/// The voice `name` means ([`QttsRequest::voice`](crate::QttsRequest::voice)): the model's
/// speaker, else a voice saved under that name in the default voices folder.
pub(crate) fn named(
    engine: &QttsEngine,
    name: &str,
    language: Option<String>,
) -> Result<Voice, (i32, String)> {
    store(None)
        .named(
            &engine.worker.info().speakers,
            &engine.files.mmproj,
            name,
            language,
        )
        .map_err(voice_err)
}

/// Clears `*out`, checks `engine`, and writes the voice `make` returns to `*out`; a status.
///
/// # Safety
/// `engine` is null or a live engine; `out` is null or points to a writable pointer.
unsafe fn new_voice(
    engine: *const QttsEngine,
    out: *mut *mut QttsVoice,
    make: impl FnOnce(&QttsEngine) -> Result<ClonedVoice, (i32, String)>,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out: expected a pointer, found NULL"));
        }
        // SAFETY: writable by the contract; cleared so a failure leaves NULL.
        unsafe { out.write(null_mut()) };
        // SAFETY: null or live by the contract.
        let engine = unsafe { engine.as_ref() }
            .ok_or_else(|| invalid("engine: expected an engine, found NULL"))?;
        let inner = make(engine)?;
        // SAFETY: writable by the contract.
        unsafe { out.write(Box::into_raw(Box::new(QttsVoice { inner }))) };
        Ok(QTTS_OK)
    })
}

/// Clones the voice in the recording at `audio_path` (WAV, FLAC, MP3 or Ogg/Vorbis, 1 to 30 s, at
/// 24 kHz unless the library was built with the `resample` feature) with the engine's Base model.
/// `text` is what is said in the recording: the voice then speaks in context (the official
/// default); NULL: from the speaker's x-vector alone. On success `*out` holds the voice (free with
/// [`qtts_voice_free`]). The encoders load on the first call; cloning takes about half a second
/// per 10 s of recording on 2 cores. Returns a status ([`QTTS_ERR_VOICE`]: the recording cannot be
/// used, or the model is not a Base model).
///
/// # Safety
/// `engine` is a live engine; the strings are null or NUL-terminated; `out` points to a writable
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn qtts_voice_clone(
    engine: *const QttsEngine,
    audio_path: *const c_char,
    text: *const c_char,
    out: *mut *mut QttsVoice,
) -> i32 {
    let make = |engine: &QttsEngine| {
        // SAFETY: strings null or NUL-terminated by the contract.
        let (path, text) = unsafe { (opt_str(audio_path, "audio_path")?, opt_str(text, "text")?) };
        let path = path.ok_or_else(|| invalid("audio_path: expected a file's path, found NULL"))?;
        let samples = qtts::voice::audio_in::load_reference(path.as_ref())
            .map_err(|e| (QTTS_ERR_VOICE, e.to_string()))?;
        engine
            .cloner
            .clone_voice(&samples, text.as_deref())
            .map_err(voice_err)
    };
    // SAFETY: by this function's contract, which `new_voice` states.
    unsafe { new_voice(engine, out, make) }
}

/// Clones the voice in `count` samples at `samples` (mono f32 in [-1, 1], 1 to 30 s) recorded at
/// `sample_rate` Hz (8000 to 192000), as [`qtts_voice_clone`] does a file: 24000 is taken as is;
/// another rate is resampled when the library was built with the `resample` feature, else
/// refused. Returns a
/// status ([`QTTS_ERR_VOICE`]: the samples cannot be used, or the model is not a Base model).
///
/// # Safety
/// `engine` is a live engine; `samples` points to `count` readable floats; `text` is null or
/// NUL-terminated; `out` points to a writable pointer.
#[no_mangle]
pub unsafe extern "C" fn qtts_voice_clone_samples(
    engine: *const QttsEngine,
    samples: *const f32,
    count: usize,
    sample_rate: u32,
    text: *const c_char,
    out: *mut *mut QttsVoice,
) -> i32 {
    let make = |engine: &QttsEngine| {
        if samples.is_null() || count == 0 {
            return Err(invalid(format!(
                "samples: expected at least 1 sample, found {} of {count}",
                if samples.is_null() {
                    "NULL"
                } else {
                    "a buffer"
                }
            )));
        }
        // SAFETY: string null or NUL-terminated by the contract.
        let text = unsafe { opt_str(text, "text")? };
        // SAFETY: `count` readable floats by the contract.
        let samples = unsafe { std::slice::from_raw_parts(samples, count) };
        let samples = qtts::voice::audio_in::reference_from_samples(samples, sample_rate)
            .map_err(|e| (QTTS_ERR_VOICE, e.to_string()))?;
        engine
            .cloner
            .clone_voice(&samples, text.as_deref())
            .map_err(voice_err)
    };
    // SAFETY: by this function's contract, which `new_voice` states.
    unsafe { new_voice(engine, out, make) }
}

/// Loads the voice saved as `name` (by [`qtts_voice_save`] or `qtts voice add`) from `voices_dir`
/// (NULL: `$QTTS_VOICES`, else `~/.local/share/qtts/voices`), checked against the engine's model;
/// on success `*out` holds it (free with [`qtts_voice_free`]). Returns a status
/// ([`QTTS_ERR_VOICE`]: no such voice, a damaged file, or a voice of another model).
///
/// # Safety
/// `engine` is a live engine; the strings are null or NUL-terminated; `out` points to a writable
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn qtts_voice_load(
    engine: *const QttsEngine,
    name: *const c_char,
    voices_dir: *const c_char,
    out: *mut *mut QttsVoice,
) -> i32 {
    let make = |engine: &QttsEngine| {
        // SAFETY: strings null or NUL-terminated by the contract.
        let (name, dir) = unsafe { (opt_str(name, "name")?, opt_str(voices_dir, "voices_dir")?) };
        let name = name.ok_or_else(|| invalid("name: expected a voice's name, found NULL"))?;
        let voice = store(dir).get(&name).map_err(voice_err)?;
        voice.check_for(&mmproj(engine)?).map_err(voice_err)?;
        Ok(voice)
    };
    // SAFETY: by this function's contract, which `new_voice` states.
    unsafe { new_voice(engine, out, make) }
}

/// Saves `voice` as `name` in `voices_dir` (NULL: as for [`qtts_voice_load`]), replacing a voice
/// of that name, where `qtts speak --voice NAME` also finds it. Returns a status.
///
/// # Safety
/// `voice` is a live voice; the strings are null or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn qtts_voice_save(
    voice: *const QttsVoice,
    name: *const c_char,
    voices_dir: *const c_char,
) -> i32 {
    guard(|| {
        // SAFETY: null or live by the contract.
        let voice = unsafe { voice.as_ref() }
            .ok_or_else(|| invalid("voice: expected a voice, found NULL"))?;
        // SAFETY: strings null or NUL-terminated by the contract.
        let (name, dir) = unsafe { (opt_str(name, "name")?, opt_str(voices_dir, "voices_dir")?) };
        let name = name.ok_or_else(|| invalid("name: expected a voice's name, found NULL"))?;
        store(dir).add(&name, &voice.inner).map_err(voice_err)?;
        Ok(QTTS_OK)
    })
}

/// 1 when the voice speaks in context (it was cloned with a transcript), 0 when from its
/// x-vector alone, -1 for NULL.
///
/// # Safety
/// `voice` is null or a live voice.
#[no_mangle]
pub unsafe extern "C" fn qtts_voice_in_context(voice: *const QttsVoice) -> i32 {
    // SAFETY: null or live by the contract.
    match unsafe { voice.as_ref() } {
        Some(v) => i32::from(v.inner.in_context()),
        None => -1,
    }
}

/// Frees a voice. NULL is ignored.
///
/// # Safety
/// `voice` is null or came from [`qtts_voice_clone`] or [`qtts_voice_load`] and was not freed; no
/// other thread uses it.
#[no_mangle]
pub unsafe extern "C" fn qtts_voice_free(voice: *mut QttsVoice) {
    if voice.is_null() {
        return;
    }
    // SAFETY: owned by the caller, who gives it back (contract).
    drop(unsafe { Box::from_raw(voice) });
}
