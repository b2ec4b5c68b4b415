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
    /// A fed text grew past one utterance, which is as far as a text feed goes for now.
    /// Feed one utterance per request (a sentence or a few), or give the whole text at once.
    #[error(
        "the fed text reached {tokens} tokens, over the {limit} of one utterance: feed one \
         utterance per request (a sentence or a few), or give the whole text at once"
    )]
    FeedTooLong {
        /// Its final tokens so far.
        tokens: usize,
        /// `segment_tokens`.
        limit: usize,
    },
    /// The fed text is not UTF-8, or a feed was asked of a request it does not fit.
    /// Send UTF-8 text; feed streaming-mode requests without a cloned voice's reference.
    #[error("text feed: {found}")]
    BadFeed {
        /// What is wrong.
        found: String,
    },
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
    /// Another request's frame in the same batch failed, and with it this one's.
    /// Send the request again; report the error (it is a bug).
    #[error(
        "a frame computed in one batch with this request's failed: {error}; send the request again"
    )]
    BatchFailed {
        /// The other request's error.
        error: String,
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
