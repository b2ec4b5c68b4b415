//! The first version of the ABI, for programs built against its header: `qtts_options_init`,
//! `qtts_request_init` and `qtts_synthesis_summary` as exported functions that know nothing of a
//! caller's size, so they write exactly version 1's structs. Today's header replaces them with
//! inline functions of the same names that pass `sizeof` to the sized functions, so they are
//! left out of it (`cbindgen.toml`).
//!
//! A program built against a header that had `QttsRequest::cloned_voice` but called the
//! unsized `qtts_request_init` gets version 1's request (`size` 56 on 64-bit targets): its
//! `cloned_voice` is not read. Writing the longer struct would overwrite a version-1 caller's
//! memory, which is worse; such a program is rebuilt against today's header.

use std::ffi::c_char;

use crate::{
    default_options, default_request, guard, invalid, summary_of, write_sized, QttsOptions,
    QttsRequest, QttsSynthesis, OPTIONS_V1, QTTS_OK, REQUEST_V1,
};

#[allow(dead_code)] // only its layout is used
/// Version 1's `QttsOptions` (the same fields as today's; `cores` was `threads`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OptionsV1 {
    pub size: usize,
    pub model: *const c_char,
    pub threads: u32,
    pub queue: u32,
    pub cache_dir: *const c_char,
}

#[allow(dead_code)] // only its layout is used
/// Version 1's `QttsRequest`: today's up to `min_frames`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RequestV1 {
    pub size: usize,
    pub text: *const c_char,
    pub voice: *const c_char,
    pub language: *const c_char,
    pub instruct: *const c_char,
    pub seed: u64,
    pub max_frames: u32,
    pub min_frames: u32,
}

/// Version 1's `QttsSummary`, without a `size`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SummaryV1 {
    pub frames: u64,
    pub samples: u64,
    pub cancelled: i32,
    pub ttfa_ms: f64,
    pub rtf: f64,
}

/// Version 1's `qtts_options_init`: version 1's defaults in version 1's size.
///
/// # Safety
/// `opts` is null or points to a writable version-1 `QttsOptions`.
#[no_mangle]
pub unsafe extern "C" fn qtts_options_init(opts: *mut QttsOptions) -> i32 {
    let value = QttsOptions {
        size: OPTIONS_V1,
        ..default_options()
    };
    // SAFETY: OPTIONS_V1 writable bytes by the contract.
    guard(|| unsafe { write_sized(opts, value, OPTIONS_V1, OPTIONS_V1, "opts") }.map(|()| QTTS_OK))
}

/// Version 1's `qtts_request_init`: version 1's defaults in version 1's size.
///
/// # Safety
/// `req` is null or points to a writable version-1 `QttsRequest`.
#[no_mangle]
pub unsafe extern "C" fn qtts_request_init(req: *mut QttsRequest) -> i32 {
    let value = QttsRequest {
        size: REQUEST_V1,
        ..default_request()
    };
    // SAFETY: REQUEST_V1 writable bytes by the contract.
    guard(|| unsafe { write_sized(req, value, REQUEST_V1, REQUEST_V1, "req") }.map(|()| QTTS_OK))
}

/// Version 1's `qtts_synthesis_summary`: version 1's struct, without a `size`.
///
/// # Safety
/// `s` is a live synthesis; `out` points to a writable version-1 `QttsSummary`.
#[no_mangle]
pub unsafe extern "C" fn qtts_synthesis_summary(
    s: *const QttsSynthesis,
    out: *mut SummaryV1,
) -> i32 {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out: expected a pointer, found NULL"));
        }
        // SAFETY: null or live by the contract.
        let q = unsafe { summary_of(s)? };
        let v1 = SummaryV1 {
            frames: q.frames,
            samples: q.samples,
            cancelled: q.cancelled,
            ttfa_ms: q.ttfa_ms,
            rtf: q.rtf,
        };
        // SAFETY: writable by the contract.
        unsafe { out.write(v1) };
        Ok(QTTS_OK)
    })
}
