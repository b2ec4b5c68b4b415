//! What the C ABI's tests share: the calls made as a C program makes them.
#![allow(dead_code)]

use std::ffi::{CStr, CString};
use std::ptr::null_mut;
use std::sync::OnceLock;

use qtts_c::*;

/// A cache directory (holding the built-in model) shared by the tests of this process.
pub fn cache() -> &'static (tempfile::TempDir, CString) {
    static CACHE: OnceLock<(tempfile::TempDir, CString)> = OnceLock::new();
    CACHE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        // Made once here: the tests' engines load it concurrently.
        qtts::model::find::builtin(dir.path()).unwrap();
        let c = CString::new(dir.path().to_str().unwrap()).unwrap();
        (dir, c)
    })
}

pub fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(qtts_last_error()) }
        .to_str()
        .unwrap()
        .to_owned()
}

/// This header's options with their defaults, as its inline `qtts_options_init` fills them.
pub fn options() -> QttsOptions {
    let mut opts = std::mem::MaybeUninit::<QttsOptions>::uninit();
    let size = std::mem::size_of::<QttsOptions>();
    // SAFETY: a writable struct of `size` bytes, then initialized.
    unsafe {
        assert_eq!(qtts_options_defaults(opts.as_mut_ptr(), size), QTTS_OK);
        opts.assume_init()
    }
}

pub fn request(text: &CStr, frames: u32) -> QttsRequest {
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
    r
}

/// A request of exactly `frames` frames (end-of-speech not sampled before).
pub fn fixed(text: &CStr, frames: u32) -> QttsRequest {
    let mut r = request(text, frames);
    r.min_frames = frames;
    r
}

pub fn start(engine: *mut QttsEngine, req: &QttsRequest) -> Result<*mut QttsSynthesis, i32> {
    let mut s = null_mut();
    // SAFETY: a live engine, a valid request and out pointer.
    match unsafe { qtts_synthesize(engine, req, &mut s) } {
        QTTS_OK => Ok(s),
        e => Err(e),
    }
}

/// The summary of `s` at its end, as this header's inline `qtts_synthesis_summary` gets it.
pub fn summary(s: *const QttsSynthesis) -> Result<QttsSummary, i32> {
    let mut sum = QttsSummary {
        size: std::mem::size_of::<QttsSummary>(),
        ..QttsSummary::default()
    };
    // SAFETY: a live synthesis; a writable summary of its size.
    match unsafe { qtts_synthesis_summary_sized(s, &mut sum) } {
        QTTS_OK => {
            assert_eq!(sum.size, std::mem::size_of::<QttsSummary>());
            Ok(sum)
        }
        e => Err(e),
    }
}

/// Reads `s` to its end with a buffer of `cap`; the final status (0, or an error) with the audio.
pub fn read_all(s: *mut QttsSynthesis, cap: usize) -> (Vec<f32>, i64) {
    let mut out = Vec::new();
    let mut buf = vec![0f32; cap];
    loop {
        // SAFETY: a live synthesis and `cap` writable floats.
        let n = unsafe { qtts_read(s, buf.as_mut_ptr(), cap, 60_000) };
        if n <= 0 {
            return (out, n);
        }
        assert!(n as usize <= cap);
        out.extend_from_slice(&buf[..n as usize]);
    }
}

/// The built-in model's options (in [`cache`], on 2 cores).
pub fn builtin_options() -> QttsOptions {
    let mut opts = options();
    opts.model = c"builtin".as_ptr();
    opts.cache_dir = cache().1.as_ptr();
    opts.cores = 2;
    opts
}

/// Loads an engine as `opts` say.
pub fn load_with(opts: &QttsOptions) -> Result<*mut QttsEngine, i32> {
    let mut engine = null_mut();
    // SAFETY: valid options and out pointer.
    match unsafe { qtts_engine_load(opts, &mut engine) } {
        QTTS_OK => Ok(engine),
        e => Err(e),
    }
}
