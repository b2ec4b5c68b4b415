//! qtts: a CPU-first, streaming text-to-speech engine for the Qwen3-TTS-12Hz models.
//!
//! It reads official Hugging Face checkpoints, converts them to llama.cpp's Qwen3-TTS GGUF layout
//! and validates every GGUF file in Rust before llama.cpp or ggml sees it; [`engine::Engine`] runs
//! the talker, the code predictor and the decoder on three pinned threads and streams the audio
//! into an [`audio::AudioSink`]. Only the engine (and the audio devices it is given) spawns
//! threads; the stages themselves run on the caller's thread ([`engine::serial::Serial`]).
//! See `ARCHITECTURE.md` for the whole engine and which parts exist.

// The library's API lints; those of every target are in Cargo.toml's `[workspace.lints]`.
#![deny(missing_docs, missing_debug_implementations)]

pub mod audio;
pub mod code_predictor;
pub mod decoder;
pub mod engine;
pub mod error;
pub mod ffi;
pub mod gguf;
#[cfg(feature = "hub")]
pub mod hub;
pub mod kernels;
pub mod metrics;
pub mod model;
mod qwen3;
pub mod sampling;
mod sync;
pub mod synth;
pub mod talker;
pub mod text;
pub mod voice;

pub use error::ModelError;
