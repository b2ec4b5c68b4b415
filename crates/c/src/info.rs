//! What an engine's model is, through the C ABI: built-in or real, its type, languages and
//! named voices, as Rust's `EngineInfo` and Python's `Engine` properties give them.

use std::ffi::c_char;

use crate::{set_error, QttsEngine};

/// 1 when the engine runs the built-in random-weight model (noise, not speech), 0 when a real
/// one, -1 for NULL.
///
/// # Safety
/// `engine` is null or a live engine.
#[no_mangle]
pub unsafe extern "C" fn qtts_engine_is_builtin(engine: *const QttsEngine) -> i32 {
    // SAFETY: null or live by the contract.
    match unsafe { engine.as_ref() } {
        Some(e) => i32::from(e.builtin),
        None => -1,
    }
}

/// The model's type, as its checkpoint names it: `custom_voice` (named speakers), `voice_design`
/// (voices described by `instruct`) or `base` (cloned voices); NULL for NULL. Valid while the
/// engine lives.
///
/// # Safety
/// `engine` is null or a live engine.
#[no_mangle]
pub unsafe extern "C" fn qtts_engine_model_type(engine: *const QttsEngine) -> *const c_char {
    // SAFETY: null or live by the contract.
    unsafe { engine.as_ref() }.map_or(std::ptr::null(), |e| e.model_type.as_ptr())
}

/// The number of languages the model takes for [`QttsRequest::language`](crate::QttsRequest::language) (`auto` included; 0
/// for NULL).
///
/// # Safety
/// `engine` is null or a live engine.
#[no_mangle]
pub unsafe extern "C" fn qtts_engine_language_count(engine: *const QttsEngine) -> usize {
    // SAFETY: null or live by the contract.
    unsafe { engine.as_ref() }.map_or(0, |e| e.languages.len())
}

/// Language `index`'s name, valid while the engine lives; NULL when `index` is out of range.
///
/// # Safety
/// `engine` is null or a live engine.
#[no_mangle]
pub unsafe extern "C" fn qtts_engine_language_name(
    engine: *const QttsEngine,
    index: usize,
) -> *const c_char {
    // SAFETY: null or live by the contract.
    match unsafe { engine.as_ref() }.and_then(|e| e.languages.get(index)) {
        Some(v) => v.as_ptr(),
        None => {
            set_error(format!(
                "language index {index}: out of range (qtts_engine_language_count)"
            ));
            std::ptr::null()
        }
    }
}

/// The number of named voices (CustomVoice speakers; 0 for other models, and for NULL).
///
/// # Safety
/// `engine` is null or a live engine.
#[no_mangle]
pub unsafe extern "C" fn qtts_engine_voice_count(engine: *const QttsEngine) -> usize {
    // SAFETY: null or live by the contract.
    unsafe { engine.as_ref() }.map_or(0, |e| e.voices.len())
}

/// Voice `index`'s name, valid while the engine lives; NULL when `index` is out of range.
///
/// # Safety
/// `engine` is null or a live engine.
#[no_mangle]
pub unsafe extern "C" fn qtts_engine_voice_name(
    engine: *const QttsEngine,
    index: usize,
) -> *const c_char {
    // SAFETY: null or live by the contract.
    match unsafe { engine.as_ref() }.and_then(|e| e.voices.get(index)) {
        Some(v) => v.as_ptr(),
        None => {
            set_error(format!(
                "voice index {index}: out of range (qtts_engine_voice_count)"
            ));
            std::ptr::null()
        }
    }
}
