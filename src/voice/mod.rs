//! Voice cloning: a reference recording → what the talker needs to speak in its voice.
//!
//! Two encoders read the same 24 kHz mono waveform, as in the official implementation: the
//! speaker encoder ([`speaker`]) gives the x-vector that fills the prompt's speaker slot, the
//! codec encoder ([`codec`]) gives the reference's codes for the in-context (ICL) prompt and for
//! priming the decoder. Both run on the host in f32 from the mmproj's weights.

pub mod audio_in;
pub mod codec;
pub mod mel;
mod ops;
pub mod speaker;

pub use codec::CodecEncoder;
pub use speaker::SpeakerEncoder;

/// Stages recorded by an encoder for parity tests: `(oracle name, values time-major, row width)`.
pub type Trace = Vec<(String, Vec<f32>, usize)>;

pub mod clone;
pub mod store;
pub mod wav_header;

pub use clone::{speaking_voice, Cloner, SharedCloner};
pub use store::{ClonedVoice, VoiceModel, VoiceStore};

use std::path::PathBuf;

/// Why a voice could not be made, saved or used.
#[derive(Debug, thiserror::Error)]
pub enum VoiceError {
    /// Cloning needs a Base model's encoders.
    #[error("voice cloning needs a Base model (Qwen3-TTS-12Hz-*-Base), this one is {model_type}")]
    NotBase {
        /// What the model is.
        model_type: String,
    },
    /// The mmproj has no speech-tokenizer encoder (converted by a qtts before cloning existed).
    #[error(
        "this model file has no speech-tokenizer encoder, which cloning with a transcript needs: \
         convert the checkpoint again with this qtts (`qtts convert`), or clone without a \
         transcript (x-vector only)"
    )]
    NoCodecEncoder,
    /// A bad reference, transcript, code or name.
    #[error("{what}: expected {expected}, found {found}")]
    BadInput {
        /// What was wrong.
        what: String,
        /// What fits.
        expected: String,
        /// What was given.
        found: String,
    },
    /// A voice file that cannot be used.
    #[error("voice file {path}: expected {expected}, found {found}")]
    VoiceFile {
        /// The file.
        path: PathBuf,
        /// What fits.
        expected: String,
        /// What it holds.
        found: String,
    },
    /// A voice made with another model.
    #[error(
        "the voice was made for {found}; this model is {expected}: add it again with this model"
    )]
    WrongModel {
        /// This model.
        expected: String,
        /// The voice's.
        found: String,
    },
    /// A voice name that is neither a speaker of the model nor a saved voice.
    /// Pick one of the model's speakers or saved voices, or save one with `qtts voice add`.
    #[error(
        "unknown voice {name:?}: not a speaker of this model (speakers: {speakers:?}) nor a voice saved in {dir} (saved: {known:?}); save one with `qtts voice add`"
    )]
    UnknownName {
        /// The name asked for.
        name: String,
        /// The model's speakers.
        speakers: Vec<String>,
        /// The store.
        dir: PathBuf,
        /// The names there.
        known: Vec<String>,
    },
    /// No voice of that name.
    #[error("no saved voice {name:?} in {dir} (saved: {known:?}); add it with `qtts voice add`")]
    UnknownVoice {
        /// The name asked for.
        name: String,
        /// The store.
        dir: PathBuf,
        /// The names there.
        known: Vec<String>,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The reference recording cannot be used.
    #[error(transparent)]
    Audio(#[from] audio_in::AudioInError),
    /// The model files are wrong.
    #[error(transparent)]
    Model(#[from] crate::error::ModelError),
}
