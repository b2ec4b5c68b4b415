//! Voice cloning: a reference recording → what the talker needs to speak in its voice.
//!
//! Two encoders read the same 24 kHz mono waveform (`../shared/design/voice-clone.md` §1): the
//! speaker encoder ([`speaker`]) gives the x-vector that fills the prompt's speaker slot, the
//! codec encoder ([`codec`]) gives the reference's codes for the in-context (ICL) prompt and for
//! priming the decoder. Both run on the host in f32 from the mmproj's weights.

pub mod codec;
pub mod mel;
mod ops;
pub mod speaker;

pub use codec::CodecEncoder;
pub use speaker::SpeakerEncoder;

/// Stages recorded by an encoder for parity tests: `(oracle name, values time-major, row width)`.
pub type Trace = Vec<(String, Vec<f32>, usize)>;
