//! What the stage threads send each other, and the capacity of every channel between them.

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::Sender;

use super::error::EngineError;
use super::synthesis::EngineInfo;
use super::synthesis::Finished;
use super::synthesis::Request;
use super::synthesis::SegmentReport;
use crate::audio::AudioSink;
use crate::ffi::Reservation;
use crate::metrics::Metrics;
use crate::sampling::SamplingParams;

/// Requests waiting for the talker to take them into a free slot: 1; more wait in the caller
/// ([`super::Engine::start`] blocks while one waits here).
pub(super) const JOB_QUEUE: usize = 1;
/// Talker → code predictor: one step's frames, a row per stream (the talker then waits for the
/// reply; at most one frame a stream, 80 ms of its audio, is in flight between them).
pub(super) const TO_CODE_PREDICTOR: usize = 1;
/// Code predictor → talker: the step's embedded codes, the talker's next inputs (one step).
pub(super) const TO_TALKER: usize = 1;
/// Decoder → code predictor: "an utterance's first frame is written" (one acknowledgement).
pub(super) const FIRST_FRAME_ACK: usize = 1;
/// Stage threads → `Engine::load`: one setup result per stage.
pub(super) const READY: usize = 3;
/// Engine → caller: a request's end, sent once.
pub(super) const DONE: usize = 1;
// Code predictor → decoder: `EngineConfig::codes_queue` frames (4 by default, 320 ms of audio);
// with the sink's ring (`EngineConfig::ring_ms`) the only buffers of audio between the stages.

/// A request, as the talker's thread receives it.
pub(super) struct Job {
    pub(super) req: Request,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) progress: Arc<AtomicUsize>,
    pub(super) sink: Box<dyn AudioSink>,
    pub(super) done: Sender<Finished>,
    pub(super) started: Instant,
}

/// Per slot, set by the decoder while the slot's sink is full and its samples wait: the talker
/// skips the slot's frames until it clears.
pub(super) type Behind = Arc<Vec<AtomicBool>>;

/// Which of the engine's streams a message is for: its slot, `0..EngineConfig::max_streams`.
pub(super) type Slot = usize;

/// One stream's row of a batched code-predictor frame, there and back with its buffers.
pub(super) struct FrameRow {
    pub(super) slot: Slot,
    /// The talker's hidden state (there); unchanged (back).
    pub(super) hidden: Vec<f32>,
    /// Back: the frame's embedded codes, the talker's next input.
    pub(super) embedded: Vec<f32>,
    pub(super) code0: u32,
    /// Set on an utterance's first frame: (seed, sampling).
    pub(super) reseed: Option<(u64, SamplingParams)>,
}

/// Talker → code predictor.
pub(super) enum CodePredictorMsg {
    /// One frame of each stream in the step (one row each).
    Frames(Vec<FrameRow>),
    /// Send back the metrics of this stream's request.
    Collect(Slot),
}

/// Code predictor → talker.
pub(super) enum CodePredictorReply {
    Frames {
        rows: Vec<FrameRow>,
        /// The decoder's cores, reserved for the talker's next step when it borrows them: the
        /// decoder decodes after that step instead of beside it. Dropped after the step.
        cores: Option<Reservation>,
    },
    /// The frame failed (for every row of it); the rows come back with their buffers.
    Failed(EngineError, Vec<FrameRow>),
    Metrics(Box<Metrics>),
}

/// Talker and code predictor → decoder, each message for one stream.
pub(super) enum DecoderMsg {
    Begin {
        slot: Slot,
        sink: Box<dyn AudioSink>,
        cancel: Arc<AtomicBool>,
        started: Instant,
        keep_codes: bool,
        done: Sender<Finished>,
    },
    /// A new utterance; with a cloned voice's reference, the decoder is primed with it.
    SegmentStart(Slot, Option<Arc<crate::talker::IclReference>>),
    Frame(Slot, [u32; 16]),
    /// An utterance's first frame, sent with the burst on: decoded on every core while the code
    /// predictor waits (so the talker does too), then acknowledged on the first-frame channel.
    FirstFrame(Slot, [u32; 16]),
    SegmentEnd(Slot),
    End(Slot, Box<EndMsg>),
}

/// A request's end, as the decoder receives it.
pub(super) struct EndMsg {
    pub(super) result: Result<(), EngineError>,
    pub(super) segments: Vec<SegmentReport>,
    pub(super) metrics: Metrics,
    /// Frames that waited for a fed text's next token.
    pub(super) text_starved: usize,
}

/// What the talker's thread learns at load, for [`super::Engine::load`].
pub(super) struct StartInfo {
    pub(super) info: EngineInfo,
    pub(super) generation: crate::model::config::GenerationConfig,
}

/// Where a stage thread announces its setup.
pub(super) type Ready = Sender<Result<Option<StartInfo>, EngineError>>;

/// Tells `Engine::load` how a stage's setup went; the stage runs on only if it succeeded.
pub(super) fn announce<T>(ready: Ready, setup: Result<T, EngineError>) -> Option<T> {
    match setup {
        Ok(x) => {
            let _ = ready.send(Ok(None));
            Some(x)
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            None
        }
    }
}
