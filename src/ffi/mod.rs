//! A thin safe layer over `llama-cpp-sys-2`, the project's only binding to llama.cpp and ggml.
//!
//! Contract:
//! - Every handle here owns one C object and frees it on drop; none is `Clone`.
//!   Handles are `Send` (each C object may move between threads) but not `Sync`: one thread at a
//!   time uses a context, as llama.cpp and ggml require.
//! - Model files reach llama.cpp only through [`LlamaModel::load`] and [`Mmproj::load`], which run
//!   the Rust validator of [`crate::model::validate`] first, because llama.cpp and ggml abort the
//!   process on some malformed files.
//! - Nothing here allocates per call on a hot path: [`Graph::compute`] reuses its work buffer,
//!   [`EmbdBatch`] is allocated once for its capacity.
//! - llama.cpp's and ggml's log lines go to [`install_logging`]'s sink: dropped unless
//!   `QTTS_LLAMA_LOG=1`, and the last error line is kept for error messages.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Once};

mod ops;
pub use crate::kernels::MatKernel;
pub(crate) use ops::rms_norm_row;
pub use ops::{AttendKernel, AttendOne, RowKernel3};

pub use llama_cpp_sys_2 as sys;

use crate::error::ModelError;

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

static LAST_ERROR: Mutex<String> = Mutex::new(String::new());
static INIT: Once = Once::new();

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

/// A llama.cpp model (the talker), loaded after validation.
#[derive(Debug)]
pub struct LlamaModel {
    ptr: NonNull<sys::llama_model>,
}

// SAFETY: a llama_model is immutable after loading and llama.cpp allows using it from any thread.
unsafe impl Send for LlamaModel {}
// SAFETY: as above; contexts created from it only read it.
unsafe impl Sync for LlamaModel {}

impl LlamaModel {
    /// Validates `path` as a Qwen3-TTS talker GGUF, then loads it on the CPU with mmap.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        crate::model::validate::talker_file(path)?;
        Self::load_unvalidated(path)
    }

    /// Loads `path` with llama.cpp without this crate's validation.
    ///
    /// Only for files that [`crate::model::validate`] already accepted (and for tests that compare
    /// the two gates).
    pub fn load_unvalidated(path: &Path) -> Result<Self, ModelError> {
        install_logging();
        let cpath = c_path(path)?;
        // SAFETY: default params are a plain struct; n_gpu_layers 0 keeps everything on the CPU.
        let ptr = unsafe {
            let mut params = sys::llama_model_default_params();
            params.n_gpu_layers = 0;
            // No repacking into llama.cpp's extra buffer types: the repacked copy of every layer
            // stays resident beside the mapped file (+235 MB at q4_K for the 0.6B talker), and
            // one-token steps were not faster with it on AVX2 (PERFORMANCE.md, "Peak RSS").
            params.use_extra_bufts = false;
            sys::llama_model_load_from_file(cpath.as_ptr(), params)
        };
        NonNull::new(ptr)
            .map(|ptr| LlamaModel { ptr })
            .ok_or_else(|| ModelError::LoaderRefused {
                path: path.into(),
                loader: "llama_model_load_from_file",
            })
    }

    /// Width of the model's embeddings.
    pub fn n_embd(&self) -> usize {
        // SAFETY: the pointer is a live model.
        unsafe { sys::llama_model_n_embd(self.ptr.as_ptr()) as usize }
    }

    /// Number of layers.
    pub fn n_layer(&self) -> usize {
        // SAFETY: the pointer is a live model.
        unsafe { sys::llama_model_n_layer(self.ptr.as_ptr()) as usize }
    }

    /// Number of tokens in the model's vocabulary.
    pub fn n_vocab(&self) -> usize {
        // SAFETY: the pointer is a live model; its vocab lives as long as it.
        unsafe { sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(self.ptr.as_ptr())) as usize }
    }

    /// The raw pointer, for calls this module does not wrap.
    pub fn as_ptr(&self) -> *mut sys::llama_model {
        self.ptr.as_ptr()
    }
}

impl Drop for LlamaModel {
    fn drop(&mut self) {
        // SAFETY: the pointer came from llama_model_load_from_file and is freed once.
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
    }
}

/// llama.cpp's own multimodal context over a Qwen3-TTS `mmproj` file (code predictor and decoder).
///
/// The engine runs its own stages; this handle exists so that tests can check that the files this
/// crate writes load in llama.cpp's loader, and compare against llama.cpp's implementation.
#[derive(Debug)]
pub struct Mmproj {
    ptr: NonNull<sys::mtmd_context>,
}

// SAFETY: an mtmd context is used by one thread at a time (the handle is not Sync).
unsafe impl Send for Mmproj {}

impl Mmproj {
    /// Validates `path` as a Qwen3-TTS mmproj GGUF, then loads it with `mtmd_init_from_file`.
    pub fn load(
        path: impl AsRef<Path>,
        text_model: &LlamaModel,
        n_threads: usize,
    ) -> Result<Self, ModelError> {
        let path = path.as_ref();
        crate::model::validate::mmproj_file(path)?;
        install_logging();
        let cpath = c_path(path)?;
        // SAFETY: default params are a plain struct; the model outlives this call (mtmd keeps a
        // pointer to it, and the caller keeps `text_model` alive by holding it next to this handle).
        let ptr = unsafe {
            let mut params = sys::mtmd_context_params_default();
            params.use_gpu = false;
            params.print_timings = false;
            params.warmup = false;
            params.n_threads = n_threads.max(1) as i32;
            sys::mtmd_init_from_file(cpath.as_ptr(), text_model.as_ptr(), params)
        };
        NonNull::new(ptr)
            .map(|ptr| Mmproj { ptr })
            .ok_or_else(|| ModelError::LoaderRefused {
                path: path.into(),
                loader: "mtmd_init_from_file",
            })
    }

    /// The raw pointer, for calls this module does not wrap.
    pub fn as_ptr(&self) -> *mut sys::mtmd_context {
        self.ptr.as_ptr()
    }
}

impl Drop for Mmproj {
    fn drop(&mut self) {
        // SAFETY: the pointer came from mtmd_init_from_file and is freed once.
        unsafe { sys::mtmd_free(self.ptr.as_ptr()) }
    }
}

/// A persistent ggml worker pool, optionally pinned to a set of cores.
///
/// Create one per stage at engine start; creating a pool per call would spawn threads per call.
#[derive(Debug)]
pub struct Threadpool {
    ptr: NonNull<sys::ggml_threadpool>,
    n_threads: usize,
    /// A wider pool over cores on loan, and the loan (see [`Threadpool::borrowing`]).
    wide: Option<(Box<Threadpool>, Arc<CoreLoan>)>,
}

/// Cores one stage lends another between its own computes: the owner (the decoder) claims them
/// back for a whole frame with [`CoreLoan::claim`]; a borrower's pool ([`Threadpool::borrowing`])
/// runs a graph over them only when the owner holds no claim, one graph at a time, so the two
/// never run threads on the same core at once. A claim waits at most for the borrower's graph
/// in progress, or for the one a [`Reservation`] holds the cores for (a code-predictor
/// sub-step is a few ms, a talker step tens).
#[derive(Debug, Default)]
pub struct CoreLoan {
    state: Mutex<LoanState>,
    returned: Condvar,
    lent: AtomicU64,
    kept: AtomicU64,
}

#[derive(Debug, Default)]
struct LoanState {
    /// The owner holds a claim (or waits for one).
    claimed: bool,
    /// A borrower's graph is running on the cores, or they are reserved for the next one.
    out: bool,
    /// The cores are out for the next borrowing graph ([`CoreLoan::reserve`]).
    reserved: bool,
}

impl CoreLoan {
    /// A loan with the cores at home and nobody waiting.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LoanState> {
        // The state is three flags, valid whatever a panicking holder left.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The owner takes the cores back until the returned guard drops: blocks while a borrower's
    /// graph runs on them, and keeps any new one off them.
    pub fn claim(&self) -> Claim<'_> {
        let mut s = self.state();
        s.claimed = true;
        while s.out {
            s = self.returned.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        Claim { loan: self }
    }

    /// Graphs the borrower ran on the cores, and graphs it ran without them (the owner held a
    /// claim), since the loan was made.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.lent.load(Ordering::Relaxed),
            self.kept.load(Ordering::Relaxed),
        )
    }

    /// Takes the cores out now for the next borrowing graph, whoever runs it, so that a claim
    /// made meanwhile waits for that graph to end; `None` when the owner holds them or they are
    /// out already. Dropping the reservation unused gives them back.
    pub fn reserve(self: &Arc<Self>) -> Option<Reservation> {
        let mut s = self.state();
        if s.claimed || s.out {
            return None;
        }
        s.out = true;
        s.reserved = true;
        Some(Reservation { loan: self.clone() })
    }

    fn try_borrow(&self) -> bool {
        let mut s = self.state();
        if s.reserved {
            // The reservation becomes this graph's loan.
            s.reserved = false;
            self.lent.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let ok = !s.claimed && !s.out;
        if ok {
            s.out = true;
            self.lent.fetch_add(1, Ordering::Relaxed);
        } else {
            self.kept.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    fn give_back(&self) {
        self.bring_home(&mut self.state());
    }

    /// The cores back from a graph or an unused reservation: a waiting claim goes on.
    fn bring_home(&self, s: &mut LoanState) {
        s.out = false;
        if s.claimed {
            self.returned.notify_all();
        }
    }
}

/// Cores taken out by [`CoreLoan::reserve`] for the next borrowing graph; dropping it before a
/// graph took them gives them back.
#[derive(Debug)]
pub struct Reservation {
    loan: Arc<CoreLoan>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut s = self.loan.state();
        if s.reserved {
            s.reserved = false;
            self.loan.bring_home(&mut s);
        }
    }
}

/// The owner's hold on a [`CoreLoan`]'s cores; dropping it lends them again.
#[derive(Debug)]
pub struct Claim<'a> {
    loan: &'a CoreLoan,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.loan.state().claimed = false;
    }
}

/// Which pool a graph runs on: the wide one while it is on loan.
struct Lease<'a> {
    pool: &'a Threadpool,
    loan: Option<&'a CoreLoan>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.loan {
            l.give_back();
        }
    }
}

// SAFETY: the pool is driven by whichever single thread computes a graph with it.
unsafe impl Send for Threadpool {}

impl Threadpool {
    /// A pool of `n_threads` workers (the calling thread counts as one), pinned to `cores` when
    /// that is not empty.
    pub fn new(n_threads: usize, cores: &[usize]) -> Result<Self, GgmlError> {
        Self::with_poll(n_threads, cores, None)
    }

    /// As [`Threadpool::new`], with ggml's polling level (0: idle workers sleep at once instead of
    /// spinning; ggml's default, 50, spins a while for the next graph). Pools that share cores
    /// with another stage should not spin.
    pub fn with_poll(
        n_threads: usize,
        cores: &[usize],
        poll: Option<u32>,
    ) -> Result<Self, GgmlError> {
        Self::with_options(n_threads, cores, poll, true)
    }

    /// As [`Threadpool::with_poll`]; `strict` pins each thread to one core of `cores` (ggml gives
    /// the workers the first cores and the calling thread the last), else every thread, the
    /// calling one included, may run on any of them.
    pub fn with_options(
        n_threads: usize,
        cores: &[usize],
        poll: Option<u32>,
        strict: bool,
    ) -> Result<Self, GgmlError> {
        let err = || GgmlError::Threadpool {
            n_threads,
            cores: cores.to_vec(),
        };
        if n_threads == 0 || n_threads > 512 || cores.iter().any(|&c| c >= 512) {
            return Err(err());
        }
        // SAFETY: params is a plain struct initialised by ggml; the mask has 512 entries and every
        // index was checked above.
        let ptr = unsafe {
            let mut params = sys::ggml_threadpool_params_default(n_threads as i32);
            if let Some(p) = poll {
                params.poll = p;
            }
            if !cores.is_empty() {
                params.cpumask = [false; 512];
                for &c in cores {
                    params.cpumask[c] = true;
                }
                params.strict_cpu = strict;
            }
            sys::ggml_threadpool_new(&mut params)
        };
        NonNull::new(ptr)
            .map(|ptr| Threadpool {
                ptr,
                n_threads,
                wide: None,
            })
            .ok_or_else(err)
    }

    /// This pool, which runs a graph on `wide` instead whenever `loan`'s owner does not hold its
    /// cores: `wide` is this pool's cores and the owner's, and must put its calling thread where
    /// this pool does (ggml places a strict pool's calling thread on its highest core).
    pub fn borrowing(mut self, wide: Threadpool, loan: Arc<CoreLoan>) -> Self {
        self.wide = Some((Box::new(wide), loan));
        self
    }

    /// The pool the next graph runs on (see [`Threadpool::borrowing`]), until the lease drops.
    fn lease(&self) -> Lease<'_> {
        match &self.wide {
            Some((wide, loan)) if loan.try_borrow() => Lease {
                pool: wide,
                loan: Some(loan),
            },
            _ => Lease {
                pool: self,
                loan: None,
            },
        }
    }

    /// Worker count.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// The raw pointer, for llama.cpp's `llama_attach_threadpool`.
    pub fn as_ptr(&self) -> *mut sys::ggml_threadpool {
        self.ptr.as_ptr()
    }
}

impl Drop for Threadpool {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_threadpool_new and is freed once.
        unsafe { sys::ggml_threadpool_free(self.ptr.as_ptr()) }
    }
}

/// A ggml context that owns the memory of its tensors (weights, inputs and activations).
#[derive(Debug)]
pub struct Context {
    ptr: NonNull<sys::ggml_context>,
    /// Tensors get no data here (a graph allocator places them later).
    no_alloc: bool,
}

// SAFETY: the context is used by one thread at a time (not Sync).
unsafe impl Send for Context {}

/// A tensor of a [`Context`]; valid while the context lives.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'ctx> {
    ptr: NonNull<sys::ggml_tensor>,
    _ctx: std::marker::PhantomData<&'ctx Context>,
}

impl Context {
    /// A context with `mem_bytes` of tensor and graph memory.
    pub fn new(mem_bytes: usize) -> Result<Self, GgmlError> {
        Self::with_alloc(mem_bytes, false)
    }

    fn with_alloc(mem_bytes: usize, no_alloc: bool) -> Result<Self, GgmlError> {
        install_logging();
        let params = sys::ggml_init_params {
            mem_size: mem_bytes,
            mem_buffer: std::ptr::null_mut(),
            no_alloc,
        };
        // SAFETY: ggml_init allocates its own buffer of mem_size bytes (or returns null).
        let ptr = unsafe { sys::ggml_init(params) };
        NonNull::new(ptr)
            .map(|ptr| Context { ptr, no_alloc })
            .ok_or(GgmlError::Alloc {
                what: "ggml context",
                bytes: mem_bytes,
            })
    }

    fn wrap(&self, p: *mut sys::ggml_tensor, bytes: usize) -> Result<Tensor<'_>, GgmlError> {
        NonNull::new(p)
            .map(|ptr| Tensor {
                ptr,
                _ctx: std::marker::PhantomData,
            })
            .ok_or(GgmlError::Alloc {
                what: "ggml tensor",
                bytes,
            })
    }

    fn room(&self, bytes: usize) -> Result<(), GgmlError> {
        // SAFETY: the context is live.
        let free = unsafe {
            sys::ggml_get_mem_size(self.ptr.as_ptr()) - sys::ggml_used_mem(self.ptr.as_ptr())
        };
        // ggml aborts when a context runs out of memory; refuse before that.
        let bytes = if self.no_alloc { 0 } else { bytes };
        // SAFETY: pure function.
        let need = bytes + unsafe { sys::ggml_tensor_overhead() } + 64;
        if need > free {
            return Err(GgmlError::Alloc {
                what: "ggml tensor (context full)",
                bytes: need,
            });
        }
        Ok(())
    }

    /// A new f32 tensor of shape `ne` (ggml order, 1 to 4 dimensions), zeroed; in a graph-allocated
    /// context ([`OwnedGraph::build_allocated`]) it has no data until the graph is allocated.
    pub fn new_f32(&self, ne: &[usize]) -> Result<Tensor<'_>, GgmlError> {
        if ne.is_empty() || ne.len() > 4 || ne.contains(&0) {
            return Err(GgmlError::Shape {
                what: "tensor shape",
                expected: "1 to 4 non-zero dimensions".into(),
                found: format!("{ne:?}"),
            });
        }
        let bytes = ne.iter().product::<usize>() * 4;
        self.room(bytes)?;
        let ne64: Vec<i64> = ne.iter().map(|&x| x as i64).collect();
        // SAFETY: the context has room (checked above) and ne64 holds ne.len() dimensions.
        let p = unsafe {
            sys::ggml_new_tensor(
                self.ptr.as_ptr(),
                sys::GGML_TYPE_F32,
                ne64.len() as i32,
                ne64.as_ptr(),
            )
        };
        let t = self.wrap(p, bytes)?;
        if !self.no_alloc {
            t.write_f32(&vec![0.0; bytes / 4])?;
        }
        Ok(t)
    }

    /// `a · b` in ggml's convention: `a` is `[k, m]`, `b` is `[k, n]`, the result `[m, n]`.
    pub fn mul_mat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        if a.ne()[0] != b.ne()[0] {
            return Err(GgmlError::Shape {
                what: "mul_mat",
                expected: format!("inner dimensions equal ({})", a.ne()[0]),
                found: format!("{}", b.ne()[0]),
            });
        }
        let bytes = a.ne()[1] * b.ne()[1] * 4;
        self.room(bytes)?;
        // SAFETY: both tensors belong to this live context and their shapes agree.
        let p = unsafe { sys::ggml_mul_mat(self.ptr.as_ptr(), a.ptr.as_ptr(), b.ptr.as_ptr()) };
        self.wrap(p, bytes)
    }

    /// `a + b`, with `b` broadcast over `a` (a bias vector over rows).
    pub fn add<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        let (na, nb) = (a.ne(), b.ne());
        if (0..4).any(|i| na[i] % nb[i] != 0) {
            return Err(GgmlError::Shape {
                what: "add",
                expected: format!("a shape that repeats into {na:?}"),
                found: format!("{nb:?}"),
            });
        }
        let bytes = na.iter().product::<usize>() * 4;
        self.room(bytes)?;
        // SAFETY: both tensors are live and b repeats into a (checked above).
        let p = unsafe { sys::ggml_add(self.ptr.as_ptr(), a.ptr.as_ptr(), b.ptr.as_ptr()) };
        self.wrap(p, bytes)
    }

    /// `x · sigmoid(x)`, elementwise.
    pub fn silu<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        let bytes = x.ne().iter().product::<usize>() * 4;
        self.room(bytes)?;
        // SAFETY: the tensor is live.
        let p = unsafe { sys::ggml_silu(self.ptr.as_ptr(), x.ptr.as_ptr()) };
        self.wrap(p, bytes)
    }

    /// A new tensor of ggml type `ty` (any type; data uninitialised), for weights copied in bytes.
    pub fn new_tensor(
        &self,
        ty: crate::gguf::GgmlType,
        ne: &[usize],
    ) -> Result<Tensor<'_>, GgmlError> {
        let ne64: Vec<u64> = ne.iter().map(|&x| x as u64).collect();
        let bytes = match ty.nbytes(&ne64) {
            Some(b) if !ne.is_empty() && ne.len() <= 4 && !ne.contains(&0) => b as usize,
            _ => {
                return Err(GgmlError::Shape {
                    what: "tensor shape",
                    expected: format!("1 to 4 non-zero dimensions, rows of whole {ty} blocks"),
                    found: format!("{ne:?}"),
                })
            }
        };
        self.room(bytes)?;
        let ne64: Vec<i64> = ne.iter().map(|&x| x as i64).collect();
        // SAFETY: the context has room, the shape is valid for the type (checked above).
        let p = unsafe {
            sys::ggml_new_tensor(
                self.ptr.as_ptr(),
                ty as u32 as sys::ggml_type,
                ne64.len() as i32,
                ne64.as_ptr(),
            )
        };
        self.wrap(p, bytes)
    }

    /// As [`Context::new_tensor`] for a type of one value per block (f32, f16, bf16), with its
    /// data at a multiple of `align` bytes (a power of two) where ggml places tensors at 16: a
    /// view into a tensor `align` bytes longer. For kernels that load whole cache lines (AMX
    /// tiles: a 64-byte tile row that straddles two lines costs two loads).
    pub fn new_tensor_aligned(
        &self,
        ty: crate::gguf::GgmlType,
        ne: &[usize],
        align: usize,
    ) -> Result<Tensor<'_>, GgmlError> {
        let es = ty.type_size() as usize;
        if self.no_alloc
            || ty.block_size() != 1
            || !align.is_power_of_two()
            || ne.is_empty()
            || ne.len() > 3
        {
            return Err(GgmlError::Shape {
                what: "aligned tensor",
                expected: "a type of one value per block, 1 to 3 dimensions, a power-of-two \
                           alignment, in a context that allocates"
                    .into(),
                found: format!("{ty}, shape {ne:?}, alignment {align}"),
            });
        }
        let n: usize = ne.iter().product();
        let base = self.new_tensor(ty, &[n + align.div_ceil(es)])?;
        // SAFETY: the tensor is live and has data (`new_tensor` on an allocating context).
        let addr = unsafe { sys::ggml_get_data(base.ptr.as_ptr()) } as usize;
        let offset = addr.next_multiple_of(align) - addr;
        let mut shape = [1; 3];
        shape[..ne.len()].copy_from_slice(ne);
        let nb = [es, es * shape[0], es * shape[0] * shape[1]];
        self.view(base, shape, nb, offset)
    }

    /// A context of at most `n_tensors` tensors that get no memory of their own: views of the
    /// caller's ([`Context::tensor_over`]).
    pub fn unallocated(n_tensors: usize) -> Result<Self, GgmlError> {
        // SAFETY: pure function.
        let per = unsafe { sys::ggml_tensor_overhead() } + 64;
        Self::with_alloc(n_tensors * per + 1024, true)
    }

    /// A tensor of type `ty` and shape `ne` whose data are the `len` bytes at `data`, in place
    /// (an [`Context::unallocated`] context's; refused elsewhere, or when `len` is not the
    /// tensor's size).
    ///
    /// # Safety
    /// The bytes stay valid, and nothing else writes them, for as long as a graph that uses the
    /// tensor may run.
    pub unsafe fn tensor_over(
        &self,
        ty: crate::gguf::GgmlType,
        ne: &[usize],
        data: *mut u8,
        len: usize,
    ) -> Result<Tensor<'_>, GgmlError> {
        if !self.no_alloc {
            return Err(GgmlError::Shape {
                what: "tensor_over",
                expected: "a context without memory of its own (Context::unallocated)".into(),
                found: "an allocating context".into(),
            });
        }
        let t = self.new_tensor(ty, ne)?;
        if t.nbytes() != len || data.is_null() {
            return Err(GgmlError::Shape {
                what: "tensor_over",
                expected: format!("{} bytes for {ty} {ne:?}", t.nbytes()),
                found: format!("{len} bytes"),
            });
        }
        // SAFETY: the tensor is live and has no data of its own; the caller vouches for the
        // bytes, which are exactly its size.
        unsafe { (*t.ptr.as_ptr()).data = data.cast() };
        Ok(t)
    }

    /// A new i32 tensor of `n` values (row indices, positions).
    pub fn new_i32(&self, n: usize) -> Result<Tensor<'_>, GgmlError> {
        self.new_tensor(crate::gguf::GgmlType::I32, &[n])
    }

    fn op<'a>(
        &'a self,
        out_elems: usize,
        f: impl FnOnce(*mut sys::ggml_context) -> *mut sys::ggml_tensor,
    ) -> Result<Tensor<'a>, GgmlError> {
        let bytes = out_elems * 4;
        self.room(bytes)?;
        self.wrap(f(self.ptr.as_ptr()), bytes)
    }

    fn same_shape(what: &'static str, a: Tensor<'_>, b: Tensor<'_>) -> Result<(), GgmlError> {
        let (na, nb) = (a.ne(), b.ne());
        if (0..4).any(|i| na[i] % nb[i] != 0) {
            return Err(GgmlError::Shape {
                what,
                expected: format!("a shape that repeats into {na:?}"),
                found: format!("{nb:?}"),
            });
        }
        Ok(())
    }

    /// `a ⊙ b`, with `b` broadcast over `a`.
    pub fn mul<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::same_shape("mul", a, b)?;
        // SAFETY: both tensors are live and b repeats into a.
        self.op(a.n_elems(), |c| unsafe {
            sys::ggml_mul(c, a.ptr.as_ptr(), b.ptr.as_ptr())
        })
    }

    /// `x / rms(x)` over dimension 0 (no weight), with `eps`.
    pub fn rms_norm<'a>(&'a self, x: Tensor<'a>, eps: f32) -> Result<Tensor<'a>, GgmlError> {
        // SAFETY: the tensor is live.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_rms_norm(c, x.ptr.as_ptr(), eps)
        })
    }

    /// `x · s`.
    pub fn scale<'a>(&'a self, x: Tensor<'a>, s: f32) -> Result<Tensor<'a>, GgmlError> {
        // SAFETY: the tensor is live.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_scale(c, x.ptr.as_ptr(), s)
        })
    }

    /// Rows `ids` (an i32 tensor) of matrix `a` (`[n, rows]`), dequantized to f32: `[n, len(ids)]`.
    pub fn get_rows<'a>(&'a self, a: Tensor<'a>, ids: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        // SAFETY: both tensors are live; ggml checks nothing more than types at build time, and ids
        // are checked in range by the callers before compute.
        self.op(a.ne()[0] * ids.n_elems(), |c| unsafe {
            sys::ggml_get_rows(c, a.ptr.as_ptr(), ids.ptr.as_ptr())
        })
    }

    /// NeoX rotary embedding of `x` (`[head_dim, heads, tokens]`) at positions `pos` (i32, one per
    /// token), over the first `n_dims` dimensions with base `theta`.
    pub fn rope_neox<'a>(
        &'a self,
        x: Tensor<'a>,
        pos: Tensor<'a>,
        n_dims: usize,
        theta: f32,
    ) -> Result<Tensor<'a>, GgmlError> {
        if pos.ne()[0] != x.ne()[2] || n_dims > x.ne()[0] || !n_dims.is_multiple_of(2) {
            return Err(GgmlError::Shape {
                what: "rope",
                expected: format!(
                    "{} positions and an even n_dims <= {}",
                    x.ne()[2],
                    x.ne()[0]
                ),
                found: format!("{} positions, n_dims {n_dims}", pos.ne()[0]),
            });
        }
        // SAFETY: shapes checked above; mode 2 is GGML_ROPE_TYPE_NEOX; no frequency factors.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_rope_ext(
                c,
                x.ptr.as_ptr(),
                pos.ptr.as_ptr(),
                std::ptr::null_mut(),
                n_dims as i32,
                2,
                0,
                theta,
                1.0,
                0.0,
                1.0,
                0.0,
                0.0,
            )
        })
    }

    /// `softmax(x · scale + mask)` over dimension 0; `mask` (f32, `[ne0, ne1]`) may be absent.
    pub fn soft_max<'a>(
        &'a self,
        x: Tensor<'a>,
        mask: Option<Tensor<'a>>,
        scale: f32,
    ) -> Result<Tensor<'a>, GgmlError> {
        if let Some(m) = mask {
            if m.ne()[0] != x.ne()[0] || m.ne()[1] < x.ne()[1] {
                return Err(GgmlError::Shape {
                    what: "soft_max mask",
                    expected: format!("[{}, >= {}]", x.ne()[0], x.ne()[1]),
                    found: format!("{:?}", m.ne()),
                });
            }
        }
        let m = mask.map_or(std::ptr::null_mut(), |m| m.ptr.as_ptr());
        // SAFETY: shapes checked above.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_soft_max_ext(c, x.ptr.as_ptr(), m, scale, 0.0)
        })
    }

    /// The attention of the query heads `q` (f32 `[head_dim, n_head, rows]`) over the first
    /// `n_kv` positions of the key and value caches `k` and `v` (`[head_dim · n_head_kv,
    /// n_ctx]`, one position a row, both f16 or both q8_0; `n_head_kv` divides `n_head`), with
    /// `mask` (f16 `[n_kv, rows]`: 0 where a row sees a key, −∞ where it does not; a masked key
    /// is skipped, not read) and `scale` on the scores, by ggml's flash attention: `[head_dim ·
    /// n_head, rows]`. Values are summed in f32 for q8_0, in f16 for f16 (ggml's CPU kernel).
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_cache<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        n_kv: usize,
        n_head_kv: usize,
        mask: Tensor<'a>,
        scale: f32,
    ) -> Result<Tensor<'a>, GgmlError> {
        use crate::gguf::GgmlType;
        let [hd, nh, rows, q3] = q.ne();
        let [width, n_ctx, k2, k3] = k.ne();
        let ty = [GgmlType::F16, GgmlType::Q8_0]
            .into_iter()
            .find(|&t| k.is_type(t) && v.is_type(t));
        let ok = q.is_type(GgmlType::F32)
            && q3 == 1
            && ty.is_some_and(|t| (hd as u64).is_multiple_of(t.block_size()))
            && v.ne() == k.ne()
            && [k2, k3] == [1, 1]
            && n_head_kv > 0
            && nh.is_multiple_of(n_head_kv)
            && width == hd * n_head_kv
            && (1..=n_ctx).contains(&n_kv)
            && mask.is_type(GgmlType::F16)
            && mask.ne() == [n_kv, rows, 1, 1]
            // SAFETY: the tensor is live; a pure query of its strides.
            && unsafe { sys::ggml_is_contiguous(mask.ptr.as_ptr()) };
        if !ok {
            return Err(GgmlError::Shape {
                what: "flash attention",
                expected: format!(
                    "f32 q [d, heads, rows], f16 or q8_0 caches [d · {n_head_kv}, n_ctx >= \
                     {n_kv}] with d whole blocks, an f16 mask [{n_kv}, rows]"
                ),
                found: format!(
                    "q {:?}, k {:?}, v {:?}, mask {:?}",
                    q.ne(),
                    k.ne(),
                    v.ne(),
                    mask.ne()
                ),
            });
        }
        // Whole blocks per head: a position's row is `n_head_kv` heads of equal bytes.
        let row = k.nbytes() / n_ctx;
        let head = row / n_head_kv;
        let view = |t: Tensor<'a>| {
            // SAFETY: the view lies inside the cache: n_kv positions of `row` bytes, `n_head_kv`
            // heads of `head` bytes each (checked above).
            self.op(0, |c| unsafe {
                sys::ggml_view_3d(
                    c,
                    t.ptr.as_ptr(),
                    hd as i64,
                    n_kv as i64,
                    n_head_kv as i64,
                    row,
                    head,
                    0,
                )
            })
        };
        let (kv, vv) = (view(k)?, view(v)?);
        let qp = self.permute(q, [0, 2, 1, 3])?;
        // SAFETY: the shapes satisfy ggml_flash_attn_ext's asserts (checked above: q's width is
        // the keys', its heads a multiple of theirs, the mask f16 and contiguous; q's permuted
        // view keeps each row contiguous).
        let out = self.op(hd * nh * rows, |c| unsafe {
            sys::ggml_flash_attn_ext(
                c,
                qp.ptr.as_ptr(),
                kv.ptr.as_ptr(),
                vv.ptr.as_ptr(),
                mask.ptr.as_ptr(),
                scale,
                0.0,
                0.0,
            )
        })?;
        self.reshape(out, [hd * nh, rows, 1])
    }

    /// A view of `x` with shape `ne` and byte strides `nb` (`nb[0]` is the element size) at byte
    /// `offset`; checked to stay inside `x`'s data.
    pub fn view<'a>(
        &'a self,
        x: Tensor<'a>,
        ne: [usize; 3],
        nb: [usize; 3],
        offset: usize,
    ) -> Result<Tensor<'a>, GgmlError> {
        let last = offset + (ne[0] - 1) * nb[0] + (ne[1] - 1) * nb[1] + (ne[2] - 1) * nb[2] + nb[0];
        if ne.contains(&0) || last > x.nbytes() {
            return Err(GgmlError::Shape {
                what: "view",
                expected: format!("a view inside {} bytes", x.nbytes()),
                found: format!("ne {ne:?}, nb {nb:?}, offset {offset}"),
            });
        }
        // SAFETY: the view lies inside x's data (checked above).
        self.op(0, |c| unsafe {
            sys::ggml_view_3d(
                c,
                x.ptr.as_ptr(),
                ne[0] as i64,
                ne[1] as i64,
                ne[2] as i64,
                nb[1],
                nb[2],
                offset,
            )
        })
    }

    /// `x` with shape `ne` (same element count; `x` contiguous).
    pub fn reshape<'a>(&'a self, x: Tensor<'a>, ne: [usize; 3]) -> Result<Tensor<'a>, GgmlError> {
        if ne.iter().product::<usize>() != x.n_elems() {
            return Err(GgmlError::Shape {
                what: "reshape",
                expected: format!("{} elements", x.n_elems()),
                found: format!("{ne:?}"),
            });
        }
        // SAFETY: element counts agree; ggml requires x contiguous, which callers ensure with cont.
        self.op(0, |c| unsafe {
            sys::ggml_reshape_3d(c, x.ptr.as_ptr(), ne[0] as i64, ne[1] as i64, ne[2] as i64)
        })
    }

    /// `x` with its axes permuted (ggml's convention: axis i of x goes to position `axes[i]`).
    pub fn permute<'a>(&'a self, x: Tensor<'a>, axes: [i32; 4]) -> Result<Tensor<'a>, GgmlError> {
        let mut seen = [false; 4];
        for &a in &axes {
            if !(0..4).contains(&a) || std::mem::replace(&mut seen[a as usize], true) {
                return Err(GgmlError::Shape {
                    what: "permute",
                    expected: "a permutation of 0..4".into(),
                    found: format!("{axes:?}"),
                });
            }
        }
        // SAFETY: a valid permutation.
        self.op(0, |c| unsafe {
            sys::ggml_permute(c, x.ptr.as_ptr(), axes[0], axes[1], axes[2], axes[3])
        })
    }

    /// A contiguous copy of `x`.
    pub fn cont<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        // SAFETY: the tensor is live.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_cont(c, x.ptr.as_ptr())
        })
    }

    /// Copies `src` into `dst` (same element count) when the graph runs; returns the copy node.
    pub fn copy_into<'a>(
        &'a self,
        src: Tensor<'a>,
        dst: Tensor<'a>,
    ) -> Result<Tensor<'a>, GgmlError> {
        if src.n_elems() != dst.n_elems() {
            return Err(GgmlError::Shape {
                what: "copy",
                expected: format!("{} elements", dst.n_elems()),
                found: format!("{}", src.n_elems()),
            });
        }
        // SAFETY: element counts agree.
        self.op(0, |c| unsafe {
            sys::ggml_cpy(c, src.ptr.as_ptr(), dst.ptr.as_ptr())
        })
    }

    /// `a` and `b` joined along dimension `dim` (their other dimensions equal). Contiguous f32
    /// tensors joined along their outermost dimension (the rows of a matrix, the last matrix of
    /// a stack) are two copies (`Context::append`); others go through ggml's `concat`, which
    /// computes every element's index.
    pub fn concat<'a>(
        &'a self,
        a: Tensor<'a>,
        b: Tensor<'a>,
        dim: usize,
    ) -> Result<Tensor<'a>, GgmlError> {
        let (na, nb) = (a.ne(), b.ne());
        if dim > 3 || (0..4).any(|i| i != dim && na[i] != nb[i]) {
            return Err(GgmlError::Shape {
                what: "concat",
                expected: format!("shapes equal but in dimension {dim}: {na:?}"),
                found: format!("{nb:?}"),
            });
        }
        if let Some(joined) = self.append(a, b, dim)? {
            return Ok(joined);
        }
        // SAFETY: shapes checked above.
        self.op(a.n_elems() + b.n_elems(), |c| unsafe {
            sys::ggml_concat(c, a.ptr.as_ptr(), b.ptr.as_ptr(), dim as i32)
        })
    }

    /// Matrix `i` of a stack of matrices `x` (`[ne0, ne1, n]`, any type) as a 2-D view.
    pub fn slice2d<'a>(&'a self, x: Tensor<'a>, i: usize) -> Result<Tensor<'a>, GgmlError> {
        let ne = x.ne();
        if i >= ne[2] || ne[3] != 1 {
            return Err(GgmlError::Shape {
                what: "slice2d",
                expected: format!("an index below {} of a 3-D stack", ne[2]),
                found: format!("index {i} of {ne:?}"),
            });
        }
        // SAFETY: the tensor is live; its strides describe its own data and slice i lies inside.
        let (nb1, nb2) = unsafe { ((*x.ptr.as_ptr()).nb[1], (*x.ptr.as_ptr()).nb[2]) };
        // SAFETY: the view covers exactly slice i (checked above).
        self.op(0, |c| unsafe {
            sys::ggml_view_2d(c, x.ptr.as_ptr(), ne[0] as i64, ne[1] as i64, nb1, i * nb2)
        })
    }

    /// The tensor of this context named `name`, if any.
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        let c = CString::new(name).ok()?;
        // SAFETY: the context is live; the name is NUL-terminated.
        let p = unsafe { sys::ggml_get_tensor(self.ptr.as_ptr(), c.as_ptr()) };
        NonNull::new(p).map(|ptr| Tensor {
            ptr,
            _ctx: std::marker::PhantomData,
        })
    }

    /// Frees every tensor and graph of the context at once (their handles must be gone: `&mut`).
    pub fn reset(&mut self) {
        // SAFETY: the context is live and no tensor borrows it (exclusive borrow).
        unsafe { sys::ggml_reset(self.ptr.as_ptr()) }
    }

    /// A graph whose output is `out`, with a reusable work buffer.
    pub fn graph<'a>(&'a self, out: Tensor<'a>) -> Result<Graph<'a>, GgmlError> {
        self.graph_of(&[out])
    }

    /// A graph computing all of `outs` (in order), with a reusable work buffer.
    pub fn graph_of<'a>(&'a self, outs: &[Tensor<'a>]) -> Result<Graph<'a>, GgmlError> {
        // SAFETY: the context is live; the graph is allocated in it (room checked by ggml's
        // overhead function first).
        let size = unsafe { sys::ggml_graph_overhead_custom(2048, false) };
        self.room(size)?;
        // SAFETY: as above; `out` belongs to this context.
        let g = unsafe {
            let g = sys::ggml_new_graph_custom(self.ptr.as_ptr(), 2048, false);
            if !g.is_null() {
                for out in outs {
                    sys::ggml_build_forward_expand(g, out.ptr.as_ptr());
                }
            }
            g
        };
        let ptr = NonNull::new(g).ok_or(GgmlError::Alloc {
            what: "ggml graph",
            bytes: size,
        })?;
        Ok(Graph {
            ptr,
            work: Vec::new(),
            _ctx: std::marker::PhantomData,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_init and is freed once; tensors borrow the context.
        unsafe { sys::ggml_free(self.ptr.as_ptr()) }
    }
}

impl<'ctx> Tensor<'ctx> {
    /// The shape (ggml order, trailing ones included).
    pub fn ne(&self) -> [usize; 4] {
        // SAFETY: the tensor is live while its context is.
        let ne = unsafe { (*self.ptr.as_ptr()).ne };
        ne.map(|x| x as usize)
    }

    /// Names the tensor (at most 63 bytes; longer names are cut), for [`Context::get`].
    pub fn set_name(&self, name: &str) -> Self {
        let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(63).collect();
        bytes.push(0);
        // SAFETY: a NUL-terminated name of at most 64 bytes, which ggml copies.
        unsafe { sys::ggml_set_name(self.ptr.as_ptr(), bytes.as_ptr().cast()) };
        *self
    }

    /// Whether the tensor's type is `ty`.
    pub fn is_type(&self, ty: crate::gguf::GgmlType) -> bool {
        // SAFETY: the tensor is live; its type is a field read.
        unsafe { (*self.ptr.as_ptr()).type_ == ty as u32 as sys::ggml_type }
    }

    /// Number of elements.
    pub fn n_elems(&self) -> usize {
        self.ne().iter().product()
    }

    /// The address of the tensor's data (0 while it has none), for alignment checks.
    pub fn data_address(&self) -> usize {
        // SAFETY: the tensor is live; its data pointer is a field read.
        unsafe { sys::ggml_get_data(self.ptr.as_ptr()) as usize }
    }

    /// Bytes of data.
    pub fn nbytes(&self) -> usize {
        // SAFETY: the tensor is live.
        unsafe { sys::ggml_nbytes(self.ptr.as_ptr()) }
    }

    /// Copies raw bytes (of the tensor's own type) into the tensor.
    pub fn write_bytes(&self, src: &[u8]) -> Result<(), GgmlError> {
        if src.len() != self.nbytes() {
            return Err(GgmlError::Shape {
                what: "tensor bytes",
                expected: format!("{} bytes", self.nbytes()),
                found: format!("{} bytes", src.len()),
            });
        }
        self.check_data()?;
        // SAFETY: sizes agree, the data exists; no reference into it exists while it is written.
        unsafe {
            let p = sys::ggml_get_data(self.ptr.as_ptr()).cast::<u8>();
            std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len());
        }
        Ok(())
    }

    /// Sets bytes `offset..offset + len` of the tensor's data to zero.
    pub fn zero_bytes(&self, offset: usize, len: usize) -> Result<(), GgmlError> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.nbytes())
        {
            return Err(GgmlError::Shape {
                what: "tensor byte range",
                expected: format!("a range inside {} bytes", self.nbytes()),
                found: format!("{len} bytes at {offset}"),
            });
        }
        self.check_data()?;
        // SAFETY: the range lies inside the data (checked above), which exists; no reference
        // into it exists while it is written.
        unsafe {
            let p = sys::ggml_get_data(self.ptr.as_ptr()).cast::<u8>();
            std::ptr::write_bytes(p.add(offset), 0, len);
        }
        Ok(())
    }

    /// The tensor's raw bytes (of its own type).
    pub fn read_bytes(&self) -> Result<Vec<u8>, GgmlError> {
        self.check_data()?;
        let mut out = vec![0u8; self.nbytes()];
        // SAFETY: the data exists and holds nbytes bytes; nothing writes it while it is copied
        // (graphs compute inside Graph::compute only).
        unsafe {
            let p = sys::ggml_get_data(self.ptr.as_ptr()).cast::<u8>();
            std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len());
        }
        Ok(out)
    }

    /// Writes i32 values (row indices, positions) into an i32 tensor.
    pub fn write_i32(&self, src: &[i32]) -> Result<(), GgmlError> {
        let bytes: Vec<u8> = src.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.write_bytes(&bytes)
    }

    /// Copies the values of an f32 tensor into `out`, which must have the tensor's length.
    pub fn read_f32(&self, out: &mut [f32]) -> Result<(), GgmlError> {
        self.check_len(out.len())?;
        // SAFETY: tensors of this module are f32, contiguous, allocated with data in a context that
        // is not Sync, and no reference into the data outlives a call of this module, so nothing
        // writes it while it is copied (graphs compute inside Graph::compute only).
        unsafe {
            let p = sys::ggml_get_data_f32(self.ptr.as_ptr());
            std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// The values of an f32 tensor.
    pub fn to_vec(&self) -> Vec<f32> {
        let mut v = vec![0.0; self.n_elems()];
        // The length matches by construction.
        let _ = self.read_f32(&mut v);
        v
    }

    /// Copies `src`, which must have the tensor's length, into an f32 tensor.
    pub fn write_f32(&self, src: &[f32]) -> Result<(), GgmlError> {
        self.check_len(src.len())?;
        // SAFETY: as in read_f32; no reference into the data exists while it is written.
        unsafe {
            let p = sys::ggml_get_data_f32(self.ptr.as_ptr());
            std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len());
        }
        Ok(())
    }

    /// Dequantizes row `row` (the rows of `ne[0]` values, counted over all higher dimensions) of
    /// a contiguous tensor of any type ggml converts to f32 into `out` (length `ne[0]`).
    pub fn read_row(&self, row: usize, out: &mut [f32]) -> Result<(), GgmlError> {
        let ne = self.ne();
        let rows = ne[1] * ne[2] * ne[3];
        // SAFETY: the tensor is live; these are field reads.
        let (ty, nb1) = unsafe { ((*self.ptr.as_ptr()).type_, (*self.ptr.as_ptr()).nb[1]) };
        // ggml_type is a C enum: u32 here, i32 on some targets.
        #[allow(clippy::unnecessary_cast)]
        let gty = crate::gguf::GgmlType::from_u32(ty as u32);
        let row_bytes = gty.and_then(|t| t.nbytes(&[ne[0] as u64]));
        match (gty, row_bytes) {
            (Some(gty), Some(rb)) if row < rows && out.len() == ne[0] && rb as usize == nb1 => {
                // SAFETY: the tensor is contiguous (nb[1] is one packed row) and holds `rows`
                // rows; the bytes are only read, and graphs never write weight tensors.
                let data = unsafe {
                    let p = sys::ggml_get_data(self.ptr.as_ptr()).cast::<u8>();
                    std::slice::from_raw_parts(p.add(row * nb1), nb1)
                };
                dequantize_into(gty, data, out)
            }
            _ => Err(GgmlError::Shape {
                what: "tensor row",
                expected: format!("a row below {rows} of {} values", ne[0]),
                found: format!("row {row} into {} values (type {ty})", out.len()),
            }),
        }
    }

    /// Tensors of a graph-allocated context that the graph does not use have no data.
    fn check_data(&self) -> Result<(), GgmlError> {
        // SAFETY: the tensor is live; reading its data pointer is a field read.
        if unsafe { sys::ggml_get_data(self.ptr.as_ptr()) }.is_null() {
            // SAFETY: the tensor is live; its name is NUL-terminated by ggml.
            let name = unsafe { CStr::from_ptr(sys::ggml_get_name(self.ptr.as_ptr())) };
            return Err(GgmlError::Shape {
                what: "tensor data",
                expected: "a tensor with data".into(),
                found: format!(
                    "'{}', which has none (a graph-allocated tensor its graph does not use)",
                    name.to_string_lossy()
                ),
            });
        }
        Ok(())
    }

    fn check_len(&self, n: usize) -> Result<(), GgmlError> {
        self.check_data()?;
        // SAFETY: the tensor is live; reading its type is a field read.
        let ty = unsafe { (*self.ptr.as_ptr()).type_ };
        if n != self.n_elems() || ty != sys::GGML_TYPE_F32 {
            return Err(GgmlError::Shape {
                what: "tensor data",
                expected: format!("{} f32 values", self.n_elems()),
                found: format!("{n} values (tensor type {ty})"),
            });
        }
        Ok(())
    }
}

/// A tensor handle without a lifetime: an output of [`OwnedGraph::build`].
#[derive(Debug, Clone, Copy)]
pub struct Node(NonNull<sys::ggml_tensor>);

impl Tensor<'_> {
    /// This tensor as a graph output.
    pub fn node(self) -> Node {
        Node(self.ptr)
    }
}

/// A computation graph of a [`Context`].
#[derive(Debug)]
pub struct Graph<'ctx> {
    ptr: NonNull<sys::ggml_cgraph>,
    work: Vec<u8>,
    _ctx: std::marker::PhantomData<&'ctx Context>,
}

impl Graph<'_> {
    /// Computes the graph on `pool`; the work buffer grows once and is reused.
    pub fn compute(&mut self, pool: &Threadpool) -> Result<(), GgmlError> {
        let mut work = std::mem::take(&mut self.work);
        let r = self.compute_with(pool, &mut work);
        self.work = work;
        r
    }

    /// As [`Graph::compute`], with the caller's work buffer (grown as needed): for graphs built
    /// anew at every step in a reused context, so that the buffer outlives them.
    pub fn compute_with(&mut self, pool: &Threadpool, work: &mut Vec<u8>) -> Result<(), GgmlError> {
        // SAFETY: the graph is live for 'ctx.
        unsafe { compute_graph(self.ptr, pool, work) }
    }
}

/// Computes `graph` on `pool` (or the wider pool it borrows, see [`Threadpool::borrowing`]) with
/// `work` as ggml's work buffer, grown as needed.
///
/// # Safety
/// `graph` is a live graph whose tensors' memory stays allocated for the call.
unsafe fn compute_graph(
    graph: NonNull<sys::ggml_cgraph>,
    pool: &Threadpool,
    work: &mut Vec<u8>,
) -> Result<(), GgmlError> {
    let lease = pool.lease();
    let pool = lease.pool;
    // SAFETY: the caller's graph and a live pool; the plan's work buffer points into `work`,
    // which is at least work_size bytes and outlives the compute call.
    let status = unsafe {
        let mut plan = sys::ggml_graph_plan(graph.as_ptr(), pool.n_threads() as i32, pool.as_ptr());
        if work.len() < plan.work_size {
            work.resize(plan.work_size, 0);
        }
        plan.work_data = work.as_mut_ptr();
        sys::ggml_graph_compute(graph.as_ptr(), &mut plan)
    };
    drop(lease);
    if status != sys::GGML_STATUS_SUCCESS {
        return Err(GgmlError::Compute { status });
    }
    Ok(())
}

/// Quantizes `rows` rows of `n_per_row` f32 values to ggml type `ty` with ggml's own quantizer.
///
/// Returns the quantized bytes; `src.len()` must be `rows · n_per_row` and `n_per_row` a multiple of
/// the type's block size.
pub fn quantize(
    ty: crate::gguf::GgmlType,
    src: &[f32],
    n_per_row: usize,
) -> Result<Vec<u8>, GgmlError> {
    let bad = |found: String| GgmlError::Shape {
        what: "quantize",
        expected: format!("rows of a multiple of {} values", ty.block_size()),
        found,
    };
    if n_per_row == 0
        || !src.len().is_multiple_of(n_per_row)
        || !(n_per_row as u64).is_multiple_of(ty.block_size())
    {
        return Err(bad(format!("{} values in rows of {n_per_row}", src.len())));
    }
    // SAFETY: pure query on a valid type id.
    if unsafe { sys::ggml_quantize_requires_imatrix(ty as u32 as sys::ggml_type) } {
        return Err(bad(format!("{ty}, which needs an importance matrix")));
    }
    let rows = src.len() / n_per_row;
    let nbytes = ty
        .nbytes(&[n_per_row as u64, rows as u64])
        .ok_or_else(|| bad("overflow".into()))? as usize;
    let mut dst = vec![0u8; nbytes];
    // SAFETY: src holds rows·n_per_row floats, dst holds exactly the bytes ggml writes for them
    // (ty.nbytes agrees with ggml_row_size, checked by this crate's tests); no importance matrix is
    // passed, so only types that do not require one may be used (the caller's types: q8_0, q4_K...).
    let written = unsafe {
        sys::ggml_quantize_chunk(
            ty as u32 as sys::ggml_type,
            src.as_ptr(),
            dst.as_mut_ptr().cast(),
            0,
            rows as i64,
            n_per_row as i64,
            std::ptr::null(),
        )
    };
    if written != nbytes {
        return Err(bad(format!(
            "ggml wrote {written} bytes, expected {nbytes}"
        )));
    }
    Ok(dst)
}

/// ggml's own block size and bytes per block for type id `id`, to check this crate's table.
pub fn ggml_type_layout(id: u32) -> (i64, usize) {
    // SAFETY: callers pass ids below GGML_TYPE_COUNT (checked here); ggml's trait table has an
    // entry for each.
    unsafe {
        if id >= sys::GGML_TYPE_COUNT {
            return (0, 0);
        }
        (
            sys::ggml_blck_size(id as sys::ggml_type),
            sys::ggml_type_size(id as sys::ggml_type),
        )
    }
}

/// A batch of input-embedding rows for [`LlamaContext::decode`], allocated once for its capacity.
///
/// `llama_batch_init` allocates one position per row, but the `qwen3tts` architecture uses IMROPE
/// and reads four positions per row, section-major (`pos[j * n_tokens + i]`); this batch owns
/// buffers sized for that and fills all four sections with the row's 1-D position, as llama.cpp's
/// own helper does for text and codec streams (`set_position_mrope_1d`).
#[derive(Debug)]
pub struct EmbdBatch {
    n_embd: usize,
    capacity: usize,
    len: usize,
    embd: Vec<f32>,
    pos: Vec<i32>,
    n_seq_id: Vec<i32>,
    seq_id_storage: Vec<i32>,
    seq_id: Vec<*mut i32>,
    logits: Vec<i8>,
}

// SAFETY: the raw pointers in seq_id point into seq_id_storage, owned by the same struct.
unsafe impl Send for EmbdBatch {}

impl EmbdBatch {
    /// A batch of up to `capacity` rows of width `n_embd`.
    pub fn new(capacity: usize, n_embd: usize) -> Self {
        let mut b = EmbdBatch {
            n_embd,
            capacity,
            len: 0,
            embd: vec![0.0; capacity * n_embd],
            pos: vec![0; capacity * 4],
            n_seq_id: vec![1; capacity],
            seq_id_storage: vec![0; capacity],
            seq_id: Vec::with_capacity(capacity),
            logits: vec![0; capacity],
        };
        let base = b.seq_id_storage.as_mut_ptr();
        // SAFETY: i < capacity = seq_id_storage.len(); the storage is never reallocated.
        b.seq_id
            .extend((0..capacity).map(|i| unsafe { base.add(i) }));
        b
    }

    /// Empties the batch.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The most rows the batch takes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch has no row.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a row at 1-D position `pos`; `output` asks llama.cpp to keep its output.
    pub fn push(&mut self, row: &[f32], pos: i32, output: bool) -> Result<(), GgmlError> {
        if self.len == self.capacity || row.len() != self.n_embd {
            return Err(GgmlError::Shape {
                what: "embedding batch row",
                expected: format!(
                    "a row of {} with room (capacity {})",
                    self.n_embd, self.capacity
                ),
                found: format!("a row of {} at {} rows", row.len(), self.len),
            });
        }
        let i = self.len;
        self.embd[i * self.n_embd..(i + 1) * self.n_embd].copy_from_slice(row);
        self.pos[i] = pos;
        self.logits[i] = output as i8;
        self.len += 1;
        Ok(())
    }

    fn raw(&mut self) -> sys::llama_batch {
        // Section-major positions: all four sections of row i hold the row's position.
        let n = self.len;
        for j in 1..4 {
            for i in 0..n {
                self.pos[j * n + i] = self.pos[i];
            }
        }
        sys::llama_batch {
            n_tokens: n as i32,
            token: std::ptr::null_mut(),
            embd: self.embd.as_mut_ptr(),
            pos: self.pos.as_mut_ptr(),
            n_seq_id: self.n_seq_id.as_mut_ptr(),
            seq_id: self.seq_id.as_mut_ptr(),
            logits: self.logits.as_mut_ptr(),
        }
    }
}

/// A llama.cpp context over a [`LlamaModel`], returning embeddings (no pooling).
#[derive(Debug)]
pub struct LlamaContext<'m> {
    ptr: NonNull<sys::llama_context>,
    n_embd: usize,
    n_vocab: usize,
    _model: std::marker::PhantomData<&'m LlamaModel>,
}

// SAFETY: a context is used by one thread at a time (not Sync).
unsafe impl Send for LlamaContext<'_> {}

impl<'m> LlamaContext<'m> {
    /// A context of `n_ctx` positions with `n_threads` threads, keeping embeddings of output rows,
    /// with an f16 KV cache (llama.cpp's default: half the memory, about 1e-3 off an f32 run).
    pub fn new(model: &'m LlamaModel, n_ctx: u32, n_threads: usize) -> Result<Self, GgmlError> {
        Self::with_kv(model, n_ctx, n_threads, false)
    }

    /// As [`LlamaContext::new`], with an f32 KV cache when `kv_f32` (exact against f32 references;
    /// 229 KB per position for the 0.6B talker), else q8_0 (61 KB per position).
    pub fn with_kv(
        model: &'m LlamaModel,
        n_ctx: u32,
        n_threads: usize,
        kv_f32: bool,
    ) -> Result<Self, GgmlError> {
        // SAFETY: default params are a plain struct; the model outlives the context (lifetime 'm).
        let ptr = unsafe {
            let mut p = sys::llama_context_default_params();
            p.n_ctx = n_ctx;
            p.n_batch = n_ctx;
            p.n_ubatch = n_ctx;
            p.n_seq_max = 1;
            p.n_threads = n_threads as i32;
            p.n_threads_batch = n_threads as i32;
            p.embeddings = true;
            p.pooling_type = sys::LLAMA_POOLING_TYPE_NONE;
            if kv_f32 {
                p.type_k = sys::GGML_TYPE_F32;
                p.type_v = sys::GGML_TYPE_F32;
                // ggml's CPU flash attention rounds through f16; the exact path needs it off.
                p.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_DISABLED;
            } else {
                // q8_0 keys and values (flash attention, which a quantized V cache needs): half
                // of f16's memory, 2048 positions of the 0.6B talker in 122 MB instead of 235.
                p.type_k = sys::GGML_TYPE_Q8_0;
                p.type_v = sys::GGML_TYPE_Q8_0;
                p.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_ENABLED;
            }
            p.no_perf = true;
            sys::llama_init_from_model(model.as_ptr(), p)
        };
        NonNull::new(ptr)
            .map(|ptr| LlamaContext {
                ptr,
                n_embd: model.n_embd(),
                n_vocab: model.n_vocab(),
                _model: std::marker::PhantomData,
            })
            .ok_or(GgmlError::Alloc {
                what: "llama context",
                bytes: 0,
            })
    }

    /// Runs llama.cpp's graph on `pool` from now on (`pool` must outlive the context's use).
    pub fn attach_threadpool(&mut self, pool: &'m Threadpool) {
        self.attach_threadpools(pool, pool);
    }

    /// As [`LlamaContext::attach_threadpool`], with `batch` for batches of more than one row (the
    /// prefill) and `pool` for single rows (the steps).
    pub fn attach_threadpools(&mut self, pool: &'m Threadpool, batch: &'m Threadpool) {
        // SAFETY: the pointers are live; the lifetime ties the pools to the model's borrow. The
        // thread counts follow the pools: llama.cpp computes with its own counts, not the pool's.
        unsafe {
            sys::llama_attach_threadpool(self.ptr.as_ptr(), pool.as_ptr(), batch.as_ptr());
            sys::llama_set_n_threads(
                self.ptr.as_ptr(),
                pool.n_threads() as i32,
                batch.n_threads() as i32,
            );
        }
    }

    /// Decodes a batch of embedding rows.
    pub fn decode(&mut self, batch: &mut EmbdBatch) -> Result<(), GgmlError> {
        if batch.n_embd != self.n_embd {
            return Err(GgmlError::Shape {
                what: "batch width",
                expected: self.n_embd.to_string(),
                found: batch.n_embd.to_string(),
            });
        }
        let n = batch.len();
        // SAFETY: the batch's buffers hold n rows, 4n positions and n seq ids, all live for the call.
        let code = unsafe { sys::llama_decode(self.ptr.as_ptr(), batch.raw()) };
        if code != 0 {
            return Err(GgmlError::Decode { code, n_tokens: n });
        }
        Ok(())
    }

    /// The output embedding of batch row `i` (negative counts from the end), if it was kept.
    pub fn embeddings(&self, i: i32) -> Option<&[f32]> {
        // SAFETY: llama.cpp returns null for rows without output, else n_embd floats that live
        // until the next decode, which needs &mut self.
        unsafe {
            let p = sys::llama_get_embeddings_ith(self.ptr.as_ptr(), i);
            (!p.is_null()).then(|| std::slice::from_raw_parts(p, self.n_embd))
        }
    }

    /// The logits of batch row `i` (negative counts from the end), if it was kept: `n_vocab` values,
    /// the codec's 3072 last for the `qwen3tts` architecture (text positions are -inf).
    pub fn logits(&self, i: i32) -> Option<&[f32]> {
        // SAFETY: as in embeddings(); llama.cpp returns null for rows without output, else n_vocab
        // floats living until the next decode.
        unsafe {
            let p = sys::llama_get_logits_ith(self.ptr.as_ptr(), i);
            (!p.is_null()).then(|| std::slice::from_raw_parts(p, self.n_vocab))
        }
    }

    /// Clears the KV cache (a new utterance).
    pub fn clear(&mut self) {
        // SAFETY: the context is live; its memory handle lives as long as it.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) }
    }

    /// Keeps positions `0..keep` of the KV cache and drops the rest. Returns false when llama.cpp
    /// cannot drop a part of it (the caller then clears it).
    pub fn truncate(&mut self, keep: usize) -> bool {
        // SAFETY: the context is live; its memory handle lives as long as it; sequence 0 is the
        // only one (n_seq_max 1) and p1 < 0 means "to the end".
        unsafe {
            sys::llama_memory_seq_rm(
                sys::llama_get_memory(self.ptr.as_ptr()),
                0,
                keep.min(i32::MAX as usize) as i32,
                -1,
            )
        }
    }
}

impl Drop for LlamaContext<'_> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from llama_init_from_model and is freed once.
        unsafe { sys::llama_free(self.ptr.as_ptr()) }
    }
}

/// A context and one graph over it, built once and computed many times.
///
/// Inputs and outputs are found by name ([`Tensor::set_name`]); the graph's tensors may read
/// tensors of other contexts (weights), which must outlive it: the caller keeps those contexts
/// next to this one and drops them after it.
#[derive(Debug)]
pub struct OwnedGraph {
    /// The graph allocator's buffer holding every tensor of `ctx`, when built with
    /// [`OwnedGraph::build_allocated`]; freed before `ctx`.
    galloc: Option<NonNull<sys::ggml_gallocr>>,
    ctx: Context,
    graph: NonNull<sys::ggml_cgraph>,
    work: Vec<u8>,
    /// The tensors named `in.*` and `out.*`, found once at build.
    ports: Vec<(String, NonNull<sys::ggml_tensor>)>,
}

// SAFETY: the graph lives in the owned context; used by one thread at a time (not Sync).
unsafe impl Send for OwnedGraph {}

impl Drop for OwnedGraph {
    fn drop(&mut self) {
        if let Some(g) = self.galloc.take() {
            // SAFETY: made by ggml_gallocr_new and freed once; ctx (dropped after) only holds
            // tensor headers pointing into its buffer, which nothing reads after this.
            unsafe { sys::ggml_gallocr_free(g.as_ptr()) }
        }
    }
}

impl OwnedGraph {
    /// Bytes of the graph allocator's buffer (0 when built with [`OwnedGraph::build`]).
    pub fn buffer_bytes(&self) -> usize {
        match self.galloc {
            // SAFETY: the allocator is live.
            Some(g) => unsafe { sys::ggml_gallocr_get_buffer_size(g.as_ptr(), 0) },
            None => 0,
        }
    }
}

impl OwnedGraph {
    /// Builds a graph in a new context of `mem_bytes`: `build` returns the output nodes, which
    /// are computed in the order given (put cache writes before the nodes that read the cache).
    ///
    /// # Safety
    ///
    /// The graph may read tensors of other contexts (weights, caches). Every such context must
    /// outlive the returned `OwnedGraph` and must not be reset while it lives.
    pub unsafe fn build(
        mem_bytes: usize,
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
    ) -> Result<Self, GgmlError> {
        // SAFETY: the caller's contract.
        unsafe { Self::build_in(Context::new(mem_bytes)?, build, None) }
    }

    /// As [`OwnedGraph::build`], with ggml's graph allocator placing the context's tensors in one
    /// buffer where a tensor's memory is reused once its last reader has run: the buffer is the
    /// graph's peak of live intermediates, not their sum. `in.*` tensors are graph inputs, `out.*`
    /// outputs, both kept whole, and so are the tensors whose names start with `keep` (to read
    /// intermediates); tensors the graph does not reach get no memory.
    ///
    /// # Safety
    ///
    /// As [`OwnedGraph::build`].
    pub unsafe fn build_allocated(
        keep: Option<&str>,
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
    ) -> Result<Self, GgmlError> {
        // Tensor headers and the graph only: 8192 tensors of overhead plus the graph's.
        // SAFETY: pure functions.
        let meta = unsafe {
            8192 * sys::ggml_tensor_overhead() + sys::ggml_graph_overhead_custom(2048, false)
        };
        // SAFETY: the caller's contract.
        unsafe {
            Self::build_in(
                Context::with_alloc(meta, true)?,
                build,
                Some(keep.unwrap_or("out.")),
            )
        }
    }

    /// `allocate`: use the graph allocator, keeping tensors named with this prefix as outputs.
    unsafe fn build_in(
        ctx: Context,
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
        allocate: Option<&str>,
    ) -> Result<Self, GgmlError> {
        let outs: Vec<Tensor<'_>> = build(&ctx)?
            .into_iter()
            .map(|n| Tensor {
                ptr: n.0,
                _ctx: std::marker::PhantomData,
            })
            .collect();
        let graph = ctx.graph_of(&outs)?.ptr;
        let mut ports = Vec::new();
        // SAFETY: walking the live context's tensor list; names are NUL-terminated by ggml.
        unsafe {
            let mut t = sys::ggml_get_first_tensor(ctx.ptr.as_ptr());
            while let Some(p) = NonNull::new(t) {
                let name = CStr::from_ptr(sys::ggml_get_name(p.as_ptr())).to_string_lossy();
                let is_leaf = (*p.as_ptr()).op == sys::GGML_OP_NONE;
                if name.starts_with("in.") {
                    // ggml asserts that inputs are leaves; an op named in.* is an ordinary node.
                    if allocate.is_some() && is_leaf {
                        sys::ggml_set_input(p.as_ptr());
                    }
                    ports.push((name.into_owned(), p));
                } else if name.starts_with("out.") {
                    if allocate.is_some() {
                        sys::ggml_set_output(p.as_ptr());
                    }
                    ports.push((name.into_owned(), p));
                } else if allocate.is_some_and(|k| name.starts_with(k)) {
                    sys::ggml_set_output(p.as_ptr());
                }
                t = sys::ggml_get_next_tensor(ctx.ptr.as_ptr(), p.as_ptr());
            }
        }
        let mut galloc = None;
        if allocate.is_some() {
            // SAFETY: a CPU buffer type is static; the allocator is freed in Drop, before ctx; the
            // graph and its tensors live in ctx.
            unsafe {
                let g = NonNull::new(sys::ggml_gallocr_new(sys::ggml_backend_cpu_buffer_type()))
                    .ok_or(GgmlError::Alloc {
                        what: "ggml graph allocator",
                        bytes: 0,
                    })?;
                if !sys::ggml_gallocr_alloc_graph(g.as_ptr(), graph.as_ptr()) {
                    let bytes = sys::ggml_gallocr_get_buffer_size(g.as_ptr(), 0);
                    sys::ggml_gallocr_free(g.as_ptr());
                    return Err(GgmlError::Alloc {
                        what: "ggml graph buffer",
                        bytes,
                    });
                }
                galloc = Some(g);
            }
        }
        Ok(OwnedGraph {
            galloc,
            ctx,
            graph,
            work: Vec::new(),
            ports,
        })
    }

    /// The graph's tensor named `name`: an `in.*` or `out.*` port without allocating or scanning
    /// the context, any other name through [`Context::get`].
    pub fn tensor(&self, name: &str) -> Option<Tensor<'_>> {
        match self.ports.iter().find(|(n, _)| n == name) {
            Some((_, p)) => Some(Tensor {
                ptr: *p,
                _ctx: std::marker::PhantomData,
            }),
            None => self.ctx.get(name),
        }
    }

    /// Computes the graph on `pool`.
    pub fn compute(&mut self, pool: &Threadpool) -> Result<(), GgmlError> {
        // SAFETY: the graph lives in self.ctx, which outlives the call.
        unsafe { compute_graph(self.graph, pool, &mut self.work) }
    }
}

/// Dequantizes `data` (whole rows of ggml type `ty`, `n` values) to f32 with ggml's own routine.
pub fn dequantize(ty: crate::gguf::GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, GgmlError> {
    let mut out = vec![0f32; n];
    dequantize_into(ty, data, &mut out)?;
    Ok(out)
}

/// [`dequantize`] into a caller's buffer, whose length is the number of values; allocates nothing.
pub fn dequantize_into(
    ty: crate::gguf::GgmlType,
    data: &[u8],
    out: &mut [f32],
) -> Result<(), GgmlError> {
    let n = out.len();
    let expected = ty.nbytes(&[n as u64]);
    if n == 0 || expected != Some(data.len() as u64) {
        return Err(GgmlError::Shape {
            what: "dequantize",
            expected: format!("{expected:?} bytes for {n} values of {ty}"),
            found: format!("{} bytes", data.len()),
        });
    }
    match ty {
        crate::gguf::GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        _ => {
            // SAFETY: the traits table has an entry for every known type; to_float reads exactly
            // the bytes of n values (checked above) and writes n floats.
            unsafe {
                let traits = sys::ggml_get_type_traits(ty as u32 as sys::ggml_type);
                let Some(f) = traits.as_ref().and_then(|t| t.to_float) else {
                    return Err(GgmlError::Shape {
                        what: "dequantize",
                        expected: "a type ggml converts to f32".into(),
                        found: ty.name().into(),
                    });
                };
                f(data.as_ptr().cast(), out.as_mut_ptr(), n as i64);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_waits_for_the_graph_on_loan_and_keeps_new_ones_off() {
        let loan = CoreLoan::new();
        assert!(loan.try_borrow(), "nobody claims: lent");
        let claimed = Arc::new(AtomicU64::new(0));
        let owner = {
            let (loan, claimed) = (loan.clone(), claimed.clone());
            std::thread::spawn(move || {
                let _claim = loan.claim();
                claimed.store(1, Ordering::SeqCst);
                // Hold it until the borrower has tried again.
                while loan.counts().1 == 0 {
                    std::thread::yield_now();
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            claimed.load(Ordering::SeqCst),
            0,
            "the claim waits for the loan"
        );
        loan.give_back();
        while claimed.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        assert!(!loan.try_borrow(), "claimed: kept off");
        owner.join().unwrap();
        assert!(loan.try_borrow(), "the claim dropped: lent again");
        loan.give_back();
        assert_eq!(loan.counts(), (2, 1));
    }

    #[test]
    fn a_reservation_holds_a_claim_off_until_a_graph_used_it_or_it_dropped() {
        let loan = CoreLoan::new();
        let r = loan.reserve().unwrap();
        assert!(loan.reserve().is_none(), "out already");
        let claimed = Arc::new(AtomicU64::new(0));
        let owner = {
            let (loan, claimed) = (loan.clone(), claimed.clone());
            std::thread::spawn(move || {
                let _claim = loan.claim();
                claimed.store(1, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            claimed.load(Ordering::SeqCst),
            0,
            "reserved: the claim waits"
        );
        // The next borrowing graph takes the reservation, claim or not.
        assert!(loan.try_borrow());
        drop(r);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(claimed.load(Ordering::SeqCst), 0, "the graph still runs");
        loan.give_back();
        owner.join().unwrap();
        assert_eq!(claimed.load(Ordering::SeqCst), 1);
        // Unused, a reservation gives the cores back when it drops.
        let r = loan.reserve().unwrap();
        drop(r);
        let _claim = loan.claim();
        assert!(!loan.try_borrow());
    }
}
