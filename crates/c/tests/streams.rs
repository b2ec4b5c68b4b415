//! Several syntheses at once on one engine through the C ABI (`QttsOptions::max_streams`).

use std::ffi::{CStr, CString};
use std::ptr::null_mut;

use qtts_c::*;

fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(qtts_last_error()) }
        .to_str()
        .unwrap()
        .to_owned()
}

/// The built-in model's options, in a cache of this test's own.
fn options(cache: &CStr) -> QttsOptions {
    let mut opts = std::mem::MaybeUninit::<QttsOptions>::uninit();
    let size = std::mem::size_of::<QttsOptions>();
    // SAFETY: a writable struct of `size` bytes, then initialized.
    let mut o = unsafe {
        assert_eq!(qtts_options_defaults(opts.as_mut_ptr(), size), QTTS_OK);
        opts.assume_init()
    };
    o.model = c"builtin".as_ptr();
    o.cache_dir = cache.as_ptr();
    o.cores = 2;
    o
}

fn load(opts: &QttsOptions) -> Result<*mut QttsEngine, i32> {
    let mut engine = null_mut();
    // SAFETY: valid options and out pointer.
    match unsafe { qtts_engine_load(opts, &mut engine) } {
        QTTS_OK => Ok(engine),
        e => Err(e),
    }
}

/// A request of exactly `frames` frames, seed 7.
fn fixed(text: &CStr, frames: u32) -> QttsRequest {
    let mut r = std::mem::MaybeUninit::<QttsRequest>::uninit();
    let size = std::mem::size_of::<QttsRequest>();
    // SAFETY: a writable struct of `size` bytes, then initialized.
    let mut r = unsafe {
        assert_eq!(qtts_request_defaults(r.as_mut_ptr(), size), QTTS_OK);
        r.assume_init()
    };
    r.text = text.as_ptr();
    r.seed = 7;
    r.max_frames = frames;
    r.min_frames = frames;
    r
}

fn start(engine: *mut QttsEngine, req: &QttsRequest) -> *mut QttsSynthesis {
    let mut s = null_mut();
    // SAFETY: a live engine, a valid request and out pointer.
    let status = unsafe { qtts_synthesize(engine, req, &mut s) };
    assert_eq!(status, QTTS_OK, "{}", last_error());
    s
}

/// Reads `s` to its end, then frees it; its audio.
fn read_all(s: *mut QttsSynthesis) -> Vec<f32> {
    let mut out = Vec::new();
    let mut buf = vec![0f32; 4096];
    loop {
        // SAFETY: a live synthesis and 4096 writable floats.
        let n = unsafe { qtts_read(s, buf.as_mut_ptr(), buf.len(), 60_000) };
        assert!(n >= 0, "{}", last_error());
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    }
    // SAFETY: a live synthesis, freed once.
    unsafe { qtts_synthesis_free(s) };
    out
}

/// An engine loaded with `max_streams` 3 runs three syntheses at once, read one after the other
/// from this thread (each waits while another is read): each gives the audio it gives alone;
/// `max_streams` over 16 is refused with a message.
#[test]
fn several_syntheses_at_once_are_each_what_they_are_alone() {
    let texts = [c"The first.", c"A second one.", c"And a third."];
    let dir = tempfile::tempdir().unwrap();
    let cache = CString::new(dir.path().to_str().unwrap()).unwrap();
    let mut opts = options(&cache);
    let alone: Vec<Vec<f32>> = {
        let engine = load(&opts).unwrap();
        let v = texts
            .iter()
            .map(|t| read_all(start(engine, &fixed(t, 30))))
            .collect();
        // SAFETY: a live engine, freed once.
        unsafe { qtts_engine_free(engine) };
        v
    };
    opts.max_streams = 17;
    assert_eq!(load(&opts), Err(QTTS_ERR_INVALID_ARGUMENT));
    assert!(last_error().contains("max_streams"), "{}", last_error());
    opts.max_streams = 3;
    let engine = load(&opts).unwrap();
    let running: Vec<_> = texts.iter().map(|t| start(engine, &fixed(t, 30))).collect();
    for (s, want) in running.into_iter().zip(&alone).rev() {
        let audio = read_all(s);
        assert!(
            audio == *want,
            "a synthesis beside others differs from its run alone"
        );
    }
    // SAFETY: a live engine, freed once.
    unsafe { qtts_engine_free(engine) };
}
