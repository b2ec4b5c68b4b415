//! A thin safe layer over `llama-cpp-sys-2`, the project's only binding to llama.cpp and ggml.
//!
//! Contract:
//! - Every handle here owns one C object and frees it on drop; none is `Clone`.
//!   Handles are `Send` (each C object may move between threads) but not `Sync`: one thread at a
//!   time uses a context, as llama.cpp and ggml require.
//! - Model files reach llama.cpp only through [`LlamaModel::load`] and [`Mmproj::load`], which
//!   take a [`Validated`] file: only the Rust validator (`crate::model::validate`) makes one,
//!   because llama.cpp and ggml abort the process on some malformed files. This module does not
//!   depend on the validator.
//! - Nothing here allocates per call on a hot path: [`Graph::compute`] reuses its work buffer,
//!   [`EmbdBatch`] is allocated once for its capacity.
//! - llama.cpp's and ggml's log lines go to [`install_logging`]'s sink: dropped unless
//!   `QTTS_LLAMA_LOG=1`, and the last error line is kept for error messages.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::sync::{Mutex, Once};

mod context;
mod custom;
mod graph;
mod llama;
mod ops;
mod quant;
mod tensor;
mod threadpool;

pub use crate::kernels::MatKernel;
pub use context::{Context, SharedContext, Tensor};
pub(crate) use custom::rms_norm_row;
pub use custom::{AttendKernel, AttendOne, RowKernel3};
pub use graph::{Graph, OwnedGraph};
pub use llama::{EmbdBatch, LlamaContext, LlamaModel, Mmproj, Role, Validated};
pub use quant::{dequantize, dequantize_into, ggml_type_layout, quantize};
pub use tensor::Node;
pub use threadpool::{Claim, CoreLoan, Reservation, Threadpool};

// The raw bindings stay inside the crate: everything outside goes through the safe types here.
use llama_cpp_sys_2 as sys;

pub use crate::error::GgmlError;
use crate::error::ModelError;

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());
static INIT: Once = Once::new();

/// llama.cpp's and ggml's log callback (see [`install_logging`]).
///
/// # Safety
/// Called by ggml only, with `text` NULL or a NUL-terminated string.
unsafe extern "C" fn log_sink(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: ggml passes a NUL-terminated string that lives for the duration of the call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if level == sys::GGML_LOG_LEVEL_ERROR {
        if let Ok(mut last) = LAST_ERROR.lock() {
            last.clear();
            last.push_str(text.trim_end());
        }
    }
    if std::env::var_os("QTTS_LLAMA_LOG").is_some_and(|v| v == "1") {
        eprint!("{text}");
    }
}

/// Initialises llama.cpp's backends once and routes its logs to this module's sink.
pub fn install_logging() {
    INIT.call_once(|| {
        // SAFETY: plain initialisation calls with a static callback that never unwinds
        // (it only formats into a Mutex-guarded String and stderr).
        unsafe {
            sys::llama_log_set(Some(log_sink), std::ptr::null_mut());
            sys::ggml_log_set(Some(log_sink), std::ptr::null_mut());
            sys::mtmd_log_set(Some(log_sink), std::ptr::null_mut());
            sys::mtmd_helper_log_set(Some(log_sink), std::ptr::null_mut());
            sys::llama_backend_init();
        }
    });
}

/// The last error line llama.cpp or ggml logged, if any.
pub fn last_error() -> String {
    LAST_ERROR.lock().map(|s| s.clone()).unwrap_or_default()
}

fn c_path(path: &Path) -> Result<CString, ModelError> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| ModelError::Unsupported {
        what: format!("path {}", path.display()),
        expected: "a path without NUL bytes".into(),
        found: "a NUL byte".into(),
    })
}
