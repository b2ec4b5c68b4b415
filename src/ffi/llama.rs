//! llama.cpp's own objects: the talker's model and context, the embedding batch, and the mtmd
//! context over an `mmproj` file.

use super::sys;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use super::c_path;
use super::install_logging;
use super::threadpool::Threadpool;
use super::GgmlError;
use crate::error::ModelError;

/// Which file of a Qwen3-TTS GGUF pair a [`Validated`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The talker (`general.architecture = qwen3tts`), for [`LlamaModel::load`].
    Talker,
    /// The code predictor and decoder (`clip`), for [`Mmproj::load`].
    Mmproj,
}

/// A GGUF file this crate's validator accepted, the only form in which a file reaches llama.cpp
/// here ([`LlamaModel::load`], [`Mmproj::load`]): llama.cpp and ggml abort the process on some
/// malformed files, so they are checked in Rust first. Made by `crate::model::validate::talker`
/// and `crate::model::validate::mmproj`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validated {
    path: PathBuf,
    role: Role,
}

impl Validated {
    /// Vouches for `path` as a valid file of `role`: for the validator only.
    pub(crate) fn vouched(path: &Path, role: Role) -> Self {
        Validated {
            path: path.to_owned(),
            role,
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Which file of the pair it is.
    pub fn role(&self) -> Role {
        self.role
    }

    fn expect(&self, role: Role) -> Result<&Path, ModelError> {
        if self.role == role {
            return Ok(&self.path);
        }
        Err(ModelError::Unsupported {
            what: format!("{}", self.path.display()),
            expected: format!("a validated {role:?} GGUF"),
            found: format!(
                "a validated {:?} GGUF: pass the other file of the pair",
                self.role
            ),
        })
    }
}

/// A llama.cpp model (the talker), loaded after validation.
#[derive(Debug)]
pub struct LlamaModel {
    pub(super) ptr: NonNull<sys::llama_model>,
}

// SAFETY: a llama_model is immutable after loading and llama.cpp allows using it from any thread.
unsafe impl Send for LlamaModel {}
// SAFETY: as above; contexts created from it only read it.
unsafe impl Sync for LlamaModel {}

impl LlamaModel {
    /// Loads a validated talker GGUF on the CPU with mmap.
    pub fn load(file: &Validated) -> Result<Self, ModelError> {
        Self::load_unvalidated(file.expect(Role::Talker)?)
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
    pub(super) ptr: NonNull<sys::mtmd_context>,
}

// SAFETY: an mtmd context is used by one thread at a time (the handle is not Sync).
unsafe impl Send for Mmproj {}

impl Mmproj {
    /// Loads a validated mmproj GGUF with `mtmd_init_from_file`.
    pub fn load(
        file: &Validated,
        text_model: &LlamaModel,
        n_threads: usize,
    ) -> Result<Self, ModelError> {
        let path = file.expect(Role::Mmproj)?;
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

/// A batch of input-embedding rows for [`LlamaContext::decode`], allocated once for its capacity.
///
/// `llama_batch_init` allocates one position per row, but the `qwen3tts` architecture uses IMROPE
/// and reads four positions per row, section-major (`pos[j * n_tokens + i]`); this batch owns
/// buffers sized for that and fills all four sections with the row's 1-D position, as llama.cpp's
/// own helper does for text and codec streams (`set_position_mrope_1d`).
#[derive(Debug)]
pub struct EmbdBatch {
    pub(super) n_embd: usize,
    pub(super) capacity: usize,
    pub(super) len: usize,
    pub(super) embd: Vec<f32>,
    pub(super) pos: Vec<i32>,
    pub(super) n_seq_id: Vec<i32>,
    pub(super) seq_id_storage: Vec<i32>,
    pub(super) seq_id: Vec<*mut i32>,
    pub(super) logits: Vec<i8>,
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

    pub(super) fn raw(&mut self) -> sys::llama_batch {
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
    pub(super) ptr: NonNull<sys::llama_context>,
    pub(super) n_embd: usize,
    pub(super) n_vocab: usize,
    pub(super) _model: std::marker::PhantomData<&'m LlamaModel>,
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
