//! The integration tests, one crate so that llama.cpp links once: each module is one subject
//! (`engine`, `decoder`, `cli`, ...); `common` holds the paths and helpers they share.
//!
//! Run one subject with `cargo test --release --test it engine::`.

// The audio tests check that the device side of the ring never allocates (`audio`); the
// allocator only counts inside `assert_no_alloc` scopes, so the other tests are unaffected.
#[global_allocator]
static ALLOC: assert_no_alloc::AllocDisabler = assert_no_alloc::AllocDisabler;

#[allow(dead_code)]
mod common;

mod audio;
mod batch;
#[allow(dead_code)] // `Outcome::Skipped` is the command's
mod cases;
mod checkpoint;
mod code_predictor;
mod conv_gemm;
mod convert;
mod corrupt;
mod decoder;
mod engine;
mod fed;
mod feed;
mod ffi;
mod ffi_ops;
mod generate;
mod gguf;
mod handoff_model;
mod int8;
mod layout;
mod panel;

mod sampling;
mod split;
mod surfaces;
mod talker;
mod tokenizer;
mod voice;
mod worker;

/// `crate::sync` for the lock-free files the loom models compile (`handoff_model`): loom's atomics.
mod sync {
    pub(crate) use loom::sync::atomic;
}
