//! Model files: the official checkpoint (configs and safetensors), conversion to the GGUF pair,
//! the Qwen3-TTS checks on GGUF files, and seeded random checkpoints for benches.

pub mod cache;
pub mod checkpoint;
pub mod config;
pub mod convert;
pub mod files;
pub mod find;
pub mod layout;
pub mod random;
pub mod testing;
pub mod validate;

pub use files::ModelFiles;
