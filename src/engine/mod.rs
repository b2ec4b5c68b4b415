//! The pipelined engine: the talker, the code predictor and the decoder on three pinned threads,
//! joined by bounded channels, writing to an [`AudioSink`].
//!
//! ```text
//!  caller ──Job (cap 1)──▶ qtts-talker ──hidden, code0 (cap 1)──▶ qtts-predictor
//!                              ▲  ◀──────embedded frame (cap 1)───────┘ │
//!                              │                                        │ codes (cap `codes_queue`,
//!                              └──Begin / SegmentEnd / End──▶ qtts-decoder ◀┘  4 frames = 320 ms)
//!                                                                │
//!                                                     AudioSink::write (ring: `ring_ms`)
//! ```
//!
//! The talker needs frame N's codes before it can start frame N+1, so the talker and the code
//! predictor alternate; the decoder overlaps them: frame N decodes while frame N+1 is predicted.
//!
//! Every channel's capacity is a named constant in `protocol` (with the audio it holds, in ms).
//!
//! Contract:
//! - [`Engine::load`] starts the three threads, each of which loads its stage, creates one
//!   persistent ggml threadpool pinned over its [`StagePlan`]'s cores, and pins itself where ggml
//!   puts the calling thread. Load errors come back from `load`; nothing runs until then.
//! - [`Engine::synthesize`] takes `&mut self` and returns a [`Synthesis`], whose
//!   [`Synthesis::wait`] gives the [`Summary`] and the sink back. [`Canceller::cancel`] (from any
//!   thread) stops the request between frames: playback is flushed, and the engine serves the
//!   next request.
//! - Several at once: [`Engine::start`] takes `&self`; up to [`EngineConfig::max_streams`]
//!   requests run together, each in a slot of its own (talker KV cache, sampler, decoder
//!   state). Every turn of the talker's thread is one frame of every running stream: their
//!   code-predictor frames run as one batch, then their talker steps; a request joins at the
//!   next turn and leaves when it ends, is cancelled or fails, alone. A stream whose sink is full
//!   ([`AudioSink::is_full`]) is skipped (its samples held) until the sink has room.
//! - Backpressure, not buffering: every channel is bounded; a sink that does not take audio stops
//!   the decoder, which stops the code predictor, which stops the talker.
//! - Determinism: the codes of a request depend only on the request (seed included), never on
//!   thread timing nor on the streams beside it; the decoder's chunking is fixed ([`EngineConfig::chunk_after`]: 1, 1, 2, then
//!   `decoder_chunk` frames at a time), so
//!   the samples are too. [`serial::Serial`] computes the same samples on one thread.
//! - First frame: with [`EngineConfig::burst`], an utterance's first frame runs stage after stage
//!   on every core (prefill, code predictor, then decoder); the code predictor waits for the
//!   decoder's acknowledgement (the first-frame channel, capacity 1) before the talker may go on.
//! - Dropping the engine stops and joins its threads.

mod code_predictor_thread;
mod config;
mod decoder_thread;
mod error;
pub mod feed;
mod plan;
mod prime;
mod protocol;
pub mod serial;
mod stream;
mod synthesis;
mod talker_thread;
mod worker;

pub use config::{DecoderWeights, EngineConfig};
pub(crate) use decoder_thread::decode_and_write;
pub use error::EngineError;
pub use feed::{
    text_feed, FeedClosed, FeedError, FeedStart, TextFeedHandle, TextWriter, FEED_QUEUE,
    PACE_HORIZON,
};
pub use plan::{StagePlan, ThreadPlan};
pub use stream::AudioStream;
pub(crate) use synthesis::plan_request;
pub use synthesis::{
    downcast_sink, Canceller, EngineInfo, Finished, Playout, Request, SegmentReport, Summary,
    Synthesis,
};
pub use worker::{Job, Order, Read, Worker, CHUNK_QUEUE, DEFAULT_QUEUE};

use crate::model::ModelFiles;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{bounded, Sender};

use crate::audio::AudioSink;
pub use crate::code_predictor::LayerKernel;
use crate::ffi::CoreLoan;
pub use crate::talker::Runtime as TalkerRuntime;
use protocol::CodePredictorMsg;
use protocol::CodePredictorReply;
use protocol::DecoderMsg;
use protocol::Job as StageJob;
use protocol::StartInfo;

/// The pipelined engine.
#[derive(Debug)]
pub struct Engine {
    jobs: Option<Sender<Box<StageJob>>>,
    threads: Vec<JoinHandle<()>>,
    info: EngineInfo,
    config: EngineConfig,
    generation: crate::model::config::GenerationConfig,
}

impl Engine {
    /// Starts the engine on `files` (see the module docs).
    pub fn load(files: &ModelFiles, config: EngineConfig) -> Result<Self, EngineError> {
        config.plan.check_loans()?;
        if config.exact {
            files.check_exact()?;
        }
        let lends =
            !(config.plan.talker.borrow.is_empty() && config.plan.code_predictor.borrow.is_empty());
        let loan = lends.then(CoreLoan::new);
        let (job_tx, job_rx) = bounded::<Box<StageJob>>(protocol::JOB_QUEUE);
        let (cp_tx, cp_rx) = bounded::<CodePredictorMsg>(protocol::TO_CODE_PREDICTOR);
        let (reply_tx, reply_rx) = bounded::<CodePredictorReply>(protocol::TO_TALKER);
        let (dec_tx, dec_rx) = bounded::<DecoderMsg>(config.codes_queue.max(1) * config.streams());
        // Decoder → CP: "an utterance's first frame is written" (see `DecoderMsg::FirstFrame`).
        let (first_tx, first_rx) = bounded::<()>(protocol::FIRST_FRAME_ACK);
        let (ready_tx, ready_rx) =
            bounded::<Result<Option<StartInfo>, EngineError>>(protocol::READY);
        let behind: protocol::Behind = Arc::new(
            (0..config.streams())
                .map(|_| AtomicBool::new(false))
                .collect(),
        );
        let mut threads = Vec::new();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|_| EngineError::StageGone { stage: "spawn" })
        };
        {
            let (files, cfg, ready) = (files.clone(), config.clone(), ready_tx.clone());
            let (dec_tx, loan, behind) = (dec_tx.clone(), loan.clone(), behind.clone());
            threads.push(spawn(
                "qtts-talker",
                Box::new(move || {
                    let channels = (job_rx, cp_tx, reply_rx, dec_tx);
                    talker_thread::run(files, cfg, loan, ready, channels, behind)
                }),
            )?);
        }
        {
            let (files, cfg, ready) = (files.clone(), config.clone(), ready_tx.clone());
            let loan = loan.clone();
            threads.push(spawn(
                "qtts-predictor",
                Box::new(move || {
                    code_predictor_thread::run(
                        files, cfg, loan, ready, cp_rx, reply_tx, dec_tx, first_rx,
                    )
                }),
            )?);
        }
        {
            let (files, cfg, ready) = (files.clone(), config.clone(), ready_tx);
            threads.push(spawn(
                "qtts-decoder",
                Box::new(move || {
                    decoder_thread::run(files, cfg, loan, ready, dec_rx, first_tx, behind)
                }),
            )?);
        }
        let mut info = None;
        let mut first_err = None;
        for _ in 0..3 {
            match ready_rx.recv() {
                Ok(Ok(Some(i))) => info = Some(i),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(EngineError::StageGone { stage: "loader" });
                }
            }
        }
        match (first_err, info) {
            (None, Some(start)) => Ok(Engine {
                jobs: Some(job_tx),
                threads,
                info: start.info,
                config,
                generation: start.generation,
            }),
            (e, _) => {
                // Closing the job channel stops the talker, and with it the others.
                drop(job_tx);
                for t in threads {
                    let _ = t.join();
                }
                Err(e.unwrap_or(EngineError::StageGone { stage: "talker" }))
            }
        }
    }

    /// What the model offers.
    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The checkpoint's sampling defaults.
    pub fn generation_config(&self) -> &crate::model::config::GenerationConfig {
        &self.generation
    }

    /// Starts a request writing to `sink`. A request without a speaker, x-vector or reference
    /// gets the model's default speaker ([`EngineInfo::default_speaker`]), as on every surface.
    pub fn synthesize(&mut self, req: Request, sink: Box<dyn AudioSink>) -> Synthesis<'_> {
        self.synthesize_with(req, sink, Arc::new(AtomicBool::new(false)))
    }

    /// Starts a request beside the running ones: up to [`EngineConfig::max_streams`] run at
    /// once, each in a slot of its own, with the codes and samples it gets alone. Past that,
    /// one more waits for a free slot and this call blocks until the engine takes it (a caller
    /// that queues requests, as [`Worker`] does, starts no more than `max_streams` at once).
    pub fn start(&self, req: Request, sink: Box<dyn AudioSink>) -> Synthesis<'_> {
        self.synthesize_with(req, sink, Arc::new(AtomicBool::new(false)))
    }

    /// [`Engine::start`] stopped by `cancel` (a flag the caller made before the request
    /// started, as [`Worker`] does for queued requests).
    pub(crate) fn synthesize_with(
        &self,
        req: Request,
        sink: Box<dyn AudioSink>,
        cancel: Arc<AtomicBool>,
    ) -> Synthesis<'_> {
        let mut req = req;
        self.info.default_voice(&mut req.voice);
        let progress = Arc::new(AtomicUsize::new(0));
        let (done_tx, done_rx) = bounded(protocol::DONE);
        let job = Box::new(StageJob {
            req,
            cancel: cancel.clone(),
            progress: progress.clone(),
            sink,
            done: done_tx,
            started: Instant::now(),
        });
        if let Some(Err(e)) = self.jobs.as_ref().map(|j| j.send(job)) {
            // The talker is gone: answer the request here.
            let job = e.into_inner();
            let _ = job
                .done
                .send((Err(EngineError::StageGone { stage: "talker" }), job.sink));
        }
        Synthesis {
            cancel,
            progress,
            done: done_rx,
            _engine: std::marker::PhantomData,
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the job channel stops the talker, whose channels' closing stops the others.
        self.jobs.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
