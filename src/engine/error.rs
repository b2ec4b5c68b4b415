//! The engine's error type.

use crate::audio::AudioError;
use crate::decoder::DecoderError;
use crate::error::ModelError;
use crate::ffi::GgmlError;
use crate::talker::TalkerError;

/// A failure of a request or of the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The request does not fit the model (see [`TalkerError`]).
    #[error(transparent)]
    Talker(#[from] TalkerError),
    /// A model file is wrong.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The decoder failed.
    #[error(transparent)]
    Decoder(#[from] DecoderError),
    /// ggml failed.
    #[error(transparent)]
    Ggml(#[from] GgmlError),
    /// The audio output failed.
    #[error(transparent)]
    Audio(#[from] AudioError),
    /// A stage thread is gone (it panicked or could not start).
    /// Drop the engine and load a new one; report the bug.
    #[error("the {stage} thread stopped unexpectedly")]
    StageGone {
        /// Which stage.
        stage: &'static str,
    },
    /// The text has nothing to speak.
    /// Give text with at least one letter, digit or symbol.
    #[error("the text is empty after clean-up; nothing to speak")]
    EmptyText,
    /// A sampling setting is out of range.
    #[error(transparent)]
    Sampling(#[from] crate::sampling::SamplingError),
    /// A [`Worker`](super::Worker)'s queue is full.
    /// Try again once a request ends (a server answers 503 with `Retry-After`), or load the worker
    /// with a longer queue.
    #[error("busy: expected a free place in the queue of {queue} waiting requests, found it full; retry later")]
    Busy {
        /// The queue's capacity.
        queue: usize,
    },
    /// The thread plan cannot run.
    /// Fix [`EngineConfig::plan`](super::EngineConfig::plan) (or use [`ThreadPlan::default_for`](super::ThreadPlan::default_for)).
    #[error("thread plan: expected {expected}, found {found}")]
    Plan {
        /// What a plan needs.
        expected: String,
        /// What this one has.
        found: String,
    },
}
