//! What both front ends share: the engine [`Worker`], admission, the limits, voice resolution,
//! and the pump that moves a job's audio from the engine to an async front end.
//!
//! ```text
//!  front end ──admit──▶ Worker queue (cap --queue) ──▶ engine ──▶ Job (CHUNK_QUEUE chunks)
//!                                                                   │ qtts-pump thread
//!  response body ◀── tokio channel (cap: --buffer-seconds of audio) ◀┘
//! ```
//!
//! The pump never lets a slow client stall the engine for long: it buffers up to
//! `buffer_seconds` of audio per request, and cancels the request (`slow_client`) when its client
//! has taken nothing for `write_stall`. A dropped [`Admitted`] (the client went away) cancels its
//! job at once, queued or running.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qtts::engine::{
    Canceller, EngineError, EngineInfo, Job, Order, Read, Request, Summary, Worker,
};
use qtts::talker::{StopReason, Voice};
use tokio::sync::mpsc;

use crate::clone::RefCloner;
use crate::metrics::{CancelLabels, Reason, ServerMetrics};
use crate::voices::Voices;
use qtts::talker::TextMode;

/// Per-request limits and timeouts.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Characters of `input` (and of Wyoming text per connection): 4096.
    pub max_input_chars: usize,
    /// Frames per utterance (80 ms each): 1125 (90 s).
    pub max_frames: usize,
    /// Audio per request: 600 s; past it the request is cancelled (`audio_limit`).
    pub max_audio_seconds: f64,
    /// From admission to the start in the engine: 30 s; past it, 503.
    pub queue_timeout: Duration,
    /// Audio buffered per request for a client that reads slower than real time: 120 s.
    pub buffer_seconds: f64,
    /// A client that takes nothing for this long while its buffer is full is dropped: 20 s.
    pub write_stall: Duration,
}

impl Limits {
    /// [`Limits::max_audio_seconds`] in samples at 24 kHz.
    pub fn max_samples(&self) -> usize {
        (self.max_audio_seconds * 24_000.0) as usize
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_chars: 4096,
            max_frames: 1125,
            max_audio_seconds: 600.0,
            queue_timeout: Duration::from_secs(30),
            buffer_seconds: 120.0,
            write_stall: Duration::from_secs(20),
        }
    }
}

/// What a front end receives for one request.
#[derive(Debug)]
pub enum Event {
    /// The next audio (24 kHz mono f32).
    Audio(Vec<f32>),
    /// The end, with the engine's summary or error.
    End(Result<Box<Summary>, EngineError>),
    /// The request waited longer than [`Limits::queue_timeout`] and was dropped before it ran.
    QueueTimeout,
    /// The audio reached [`Limits::max_audio_seconds`] before the text's end: the request was
    /// cut there (the client's to split; in place of `End`).
    OverLimit {
        /// The limit, in seconds of audio.
        seconds: f64,
    },
}

/// What a client is told when its audio reached the limit: how to split the request.
pub fn over_limit_message(seconds: f64) -> String {
    format!(
        "the audio reached the limit of {} s per request before the end of the text; split the \
         input into shorter requests",
        qtts::sampling::shown(seconds)
    )
}

/// What a client is told when its request ended before its end: it must not take the audio for
/// a whole file.
pub const CUT_SHORT: &str = "the request was cancelled before its end (server shutdown)";

/// The code an engine error is reported with: the request's fault (`empty_input`,
/// `invalid_request`) or the engine's (`engine_error`).
pub fn error_code(e: &EngineError) -> &'static str {
    match e {
        EngineError::EmptyText => "empty_input",
        EngineError::Talker(_) | EngineError::Sampling(_) => "invalid_request",
        _ => "engine_error",
    }
}

/// Work a streaming connection (Wyoming, the live WebSocket) queued for its synthesis task and
/// not yet done: its idle timer runs only while there is none.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pending(Arc<AtomicUsize>);

impl Pending {
    /// Queues `w`, counting it pending until the synthesis task drops its [`Pending::take`].
    pub(crate) async fn send<T>(
        &self,
        tx: &mpsc::Sender<T>,
        w: T,
    ) -> Result<(), mpsc::error::SendError<T>> {
        self.0.fetch_add(1, Ordering::AcqRel);
        let r = tx.send(w).await;
        if r.is_err() {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
        r
    }

    /// Whether any work is pending.
    pub(crate) fn any(&self) -> bool {
        self.0.load(Ordering::Acquire) > 0
    }

    /// The synthesis task's hold on one piece of work it received: done when dropped, whatever
    /// happens (an early return included).
    pub(crate) fn take(&self) -> PendingDone<'_> {
        PendingDone(&self.0)
    }
}

/// See [`Pending::take`].
pub(crate) struct PendingDone<'a>(&'a AtomicUsize);

impl Drop for PendingDone<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request a front end refuses before it reaches the engine: the error code and the message
/// the client gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The error code (`voice_not_found`, `unsupported_language`, ...).
    pub code: &'static str,
    /// What went wrong and what to do.
    pub message: String,
}

/// Why a request was refused before it was queued.
#[derive(Debug)]
pub enum Refused {
    /// The queue is full; retry after this many seconds.
    Busy {
        /// Suggested wait.
        retry_after: u64,
    },
    /// The server is shutting down.
    Draining,
    /// The engine is gone.
    Engine(EngineError),
}

/// The server's shared state.
#[derive(Debug)]
pub struct Service {
    /// The engine.
    pub worker: Worker,
    /// The exported metrics.
    pub metrics: ServerMetrics,
    /// The limits.
    pub limits: Limits,
    /// Named voices.
    pub voices: Voices,
    /// The model id `/v1/models` lists (`qwen3-tts-12hz-0.6b-customvoice`, ...).
    pub model_id: String,
    /// `custom_voice 0b6 q4_k (path)`.
    pub description: String,
    /// How a request's text enters the prompt unless it says (`non_streaming_mode`); default
    /// streaming ([`Service::with_text_mode`]).
    pub text_mode: TextMode,
    /// A Base model's encoders for `ref_audio` ([`Service::with_cloner`]); `None` otherwise.
    pub cloner: Option<Arc<RefCloner>>,
    draining: AtomicBool,
    ready: AtomicBool,
    /// Set when the engine reported a dead stage: liveness fails, so the process is restarted.
    broken: AtomicBool,
    /// Admitted requests not yet ended.
    in_flight: AtomicUsize,
    /// A running average of request durations in the engine (f64 seconds as bits).
    mean_duration: AtomicU64,
}

impl Service {
    /// The state around a loaded worker.
    pub fn new(
        worker: Worker,
        limits: Limits,
        voices: Voices,
        model_id: String,
        description: String,
    ) -> Service {
        let metrics = ServerMetrics::new(worker.info(), &description);
        Service {
            worker,
            metrics,
            limits,
            voices,
            model_id,
            description,
            text_mode: TextMode::Streaming,
            cloner: None,
            draining: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            mean_duration: AtomicU64::new(1.0f64.to_bits()),
        }
    }

    /// Requests take `mode` unless they say otherwise (`qtts serve --text-mode`; `Trailing` lets a
    /// saved cloned voice's prompt be reused whole, see [`TextMode::Trailing`]).
    pub fn with_text_mode(mut self, mode: TextMode) -> Service {
        self.text_mode = mode;
        self
    }

    /// Clones `ref_audio` references with `cloner` (a Base model's encoders).
    pub fn with_cloner(mut self, cloner: RefCloner) -> Service {
        self.cloner = Some(Arc::new(cloner));
        self
    }

    /// What the model offers.
    pub fn info(&self) -> &EngineInfo {
        self.worker.info()
    }

    /// Marks the server ready (after the warm-up request).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Stops admitting requests (shutdown).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether new requests are refused.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Ready for traffic: loaded, warmed up, not draining.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire) && !self.is_draining()
    }

    /// Alive: no engine stage has died.
    pub fn is_live(&self) -> bool {
        !self.broken.load(Ordering::Acquire)
    }

    /// Requests admitted and not yet ended.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Sets the queue gauges from the worker (called before `/metrics` is encoded).
    pub fn refresh_gauges(&self) {
        let waiting = self.worker.queued();
        let in_flight = self.in_flight();
        self.metrics.waiting.set(waiting as i64);
        self.metrics.in_flight.set(in_flight as i64);
        self.metrics.running.set(self.worker.running() as i64);
    }

    /// `Retry-After` for a full queue: the queue's expected wait, 1 to 30 s.
    pub fn retry_after(&self) -> u64 {
        let mean = f64::from_bits(self.mean_duration.load(Ordering::Relaxed));
        let streams = self.worker.config().streams() as f64;
        let wait = (self.worker.queued() + 1) as f64 * mean / streams;
        (wait.ceil() as u64).clamp(1, 30)
    }

    /// Resolves a voice name (profiles, then the model's speakers, then the OpenAI aliases) into
    /// the voice a request gets; `None` means the model's default voice. `Err` lists the names.
    pub fn voice(&self, name: Option<&str>) -> Result<Voice, String> {
        self.voices.resolve(name, self.info())
    }

    /// The engine's language name for `s` (a model language, any case, or its ISO 639-1 code).
    pub fn language(&self, s: &str) -> Option<String> {
        crate::voices::language(s, self.info())
    }

    /// The voice `name` ([`Service::voice`]) speaking `language` (a model language or its ISO
    /// code; `None`: the voice's own): what a streaming front end (Wyoming, the live WebSocket)
    /// asks for, refused with the front ends' error code and a message that lists what exists.
    pub fn voice_in(&self, name: Option<&str>, language: Option<&str>) -> Result<Voice, Refusal> {
        let mut v = self.voice(name).map_err(|names| Refusal {
            code: "voice_not_found",
            message: format!(
                "voice '{}' is unknown; available: {names}",
                name.unwrap_or("")
            ),
        })?;
        if let Some(l) = language {
            v.language = Some(self.language(l).ok_or_else(|| Refusal {
                code: "unsupported_language",
                message: format!(
                    "language '{l}' is unknown; the model has {}",
                    self.info().languages.join(", ")
                ),
            })?);
        }
        Ok(v)
    }

    /// Queues `req` and starts its pump; the job's audio comes through the returned
    /// [`Admitted`]. `frontend` labels the metrics (`http`, `wyoming`).
    pub fn admit(
        self: &Arc<Self>,
        req: Request,
        frontend: &'static str,
    ) -> Result<Admitted, Refused> {
        if self.is_draining() {
            self.metrics
                .rejected
                .get_or_create(&Reason { reason: "draining" })
                .inc();
            return Err(Refused::Draining);
        }
        let job = match self.worker.submit(req) {
            Ok(j) => j,
            Err(EngineError::Busy { .. }) => {
                self.metrics
                    .rejected
                    .get_or_create(&Reason {
                        reason: "queue_full",
                    })
                    .inc();
                return Err(Refused::Busy {
                    retry_after: self.retry_after(),
                });
            }
            Err(e) => {
                self.note_error(&e);
                return Err(Refused::Engine(e));
            }
        };
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let chunk = 1920 * self.worker.config().decoder_chunk.max(1);
        let capacity = ((self.limits.buffer_seconds * 24_000.0) / chunk as f64)
            .ceil()
            .max(2.0) as usize;
        let (tx, rx) = mpsc::channel(capacity);
        let canceller = job.canceller();
        let order = job.order();
        let svc = self.clone();
        let admitted = Instant::now();
        let spawned = std::thread::Builder::new()
            .name("qtts-pump".into())
            .spawn(move || {
                pump(&svc, job, &tx, frontend, admitted);
                svc.in_flight.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            // The job was moved into the closure and dropped with it: cancelled.
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Refused::Engine(EngineError::StageGone { stage: "pump" }));
        }
        Ok(Admitted {
            rx,
            canceller: Some(canceller),
            order,
        })
    }

    /// Counts an engine error, and marks the service broken when a stage died.
    pub fn note_error(&self, e: &EngineError) {
        let reason = match e {
            EngineError::StageGone { .. } => {
                self.broken.store(true, Ordering::Release);
                "stage_gone"
            }
            EngineError::Talker(_) | EngineError::EmptyText | EngineError::Sampling(_) => "request",
            _ => "engine",
        };
        self.metrics.errors.get_or_create(&Reason { reason }).inc();
    }

    fn note_duration(&self, secs: f64) {
        let old = f64::from_bits(self.mean_duration.load(Ordering::Relaxed));
        let new = 0.8 * old + 0.2 * secs;
        self.mean_duration.store(new.to_bits(), Ordering::Relaxed);
    }
}

/// An admitted request: its events, and the cancel that runs when it is dropped before its end
/// (the client went away).
#[derive(Debug)]
pub struct Admitted {
    rx: mpsc::Receiver<Event>,
    canceller: Option<Canceller>,
    order: Order,
}

impl Admitted {
    /// The request's place in the engine's order: its `seq`, and once it has started, the `seq`
    /// of the request the engine ran just before. Front ends report both (HTTP headers
    /// `x-qtts-job` and `x-qtts-after-job`, Wyoming's `audio-start` data), so that a client can
    /// check the FIFO from what the server did rather than from when bytes arrived.
    pub fn order(&self) -> (u64, Option<u64>) {
        (self.order.seq(), self.order.after())
    }

    /// The next event; `None` only if the pump died.
    pub async fn next(&mut self) -> Option<Event> {
        let e = self.rx.recv().await;
        if matches!(
            e,
            Some(Event::End(_) | Event::QueueTimeout | Event::OverLimit { .. }) | None
        ) {
            // Over: nothing left to cancel.
            self.canceller = None;
        }
        e
    }

    /// Stops the request now (it ends with [`StopReason::Cancelled`]).
    pub fn cancel(&self) {
        if let Some(c) = &self.canceller {
            c.cancel();
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some(c) = self.canceller.take() {
            c.cancel();
        }
    }
}

/// How long the pump waits for audio before it looks at its client again.
const POLL: Duration = Duration::from_millis(20);

/// Moves `job`'s audio into `tx` (see the module docs); runs on its own thread.
fn pump(
    svc: &Service,
    mut job: Job,
    tx: &mpsc::Sender<Event>,
    frontend: &'static str,
    admitted: Instant,
) {
    let m = &svc.metrics;
    let limits = &svc.limits;
    let mut started: Option<Instant> = None;
    let mut first_audio: Option<Instant> = None;
    let mut samples = 0usize;
    // The most a chunk came after the audio before it had played out, seconds.
    let mut lateness = 0f64;
    let mut reason: Option<&'static str> = None;
    let max_samples = limits.max_samples();
    let cancel = |job: &Job, why: &'static str, reason: &mut Option<&'static str>| {
        if reason.is_none() {
            *reason = Some(why);
            job.cancel();
        }
    };
    loop {
        if reason.is_none() && tx.is_closed() {
            cancel(&job, "client_disconnect", &mut reason);
        }
        if started.is_none() {
            if !job.is_queued() {
                started = Some(Instant::now());
                m.queue_wait.observe(admitted.elapsed().as_secs_f64());
            } else if reason.is_none() && admitted.elapsed() > limits.queue_timeout {
                job.cancel();
                let _ = job.finish();
                m.rejected
                    .get_or_create(&Reason {
                        reason: "queue_timeout",
                    })
                    .inc();
                let _ = tx.try_send(Event::QueueTimeout);
                return;
            }
        }
        match job.next_chunk(Some(POLL)) {
            Ok(Some(chunk)) => {
                let now = Instant::now();
                match first_audio {
                    None => {
                        first_audio = Some(now);
                        m.ttfa.observe(admitted.elapsed().as_secs_f64());
                    }
                    Some(t0) => {
                        // The audio sent so far has played out: a real-time listener hears a gap.
                        let late = now.duration_since(t0).as_secs_f64() - samples as f64 / 24_000.0;
                        if late > 0.0 {
                            m.late_chunks.inc();
                            lateness = lateness.max(late);
                        }
                    }
                }
                samples += chunk.len();
                if samples > max_samples {
                    cancel(&job, "audio_limit", &mut reason);
                }
                if reason.is_none() && !deliver(tx, Event::Audio(chunk), limits.write_stall) {
                    let why = if tx.is_closed() {
                        "client_disconnect"
                    } else {
                        "slow_client"
                    };
                    cancel(&job, why, &mut reason);
                }
            }
            Ok(None) => break,
            Err(Read::Timeout | Read::Samples(_) | Read::End) => {}
        }
    }
    let result = job.finish();
    match &result {
        Ok(s) => {
            if started.is_none() && s.stop == StopReason::Cancelled {
                m.queue_abandoned.inc();
            }
            if reason.is_none() && s.stop == StopReason::Cancelled && tx.is_closed() {
                reason = Some("client_disconnect");
            }
            if started.is_some() {
                m.record_summary(s);
                svc.note_duration(s.elapsed.as_secs_f64());
            }
        }
        Err(e) => svc.note_error(e),
    }
    if let Some(reason) = reason {
        m.cancelled
            .get_or_create(&CancelLabels { reason, frontend })
            .inc();
    }
    m.duration.observe(admitted.elapsed().as_secs_f64());
    if first_audio.is_some() {
        m.lateness.observe(lateness);
    }
    if !tx.is_closed() {
        let end = match (reason, result) {
            (Some("audio_limit"), Ok(_)) => Event::OverLimit {
                seconds: limits.max_audio_seconds,
            },
            (_, r) => Event::End(r.map(Box::new)),
        };
        let _ = deliver(tx, end, limits.write_stall);
    }
}

/// Sends `e`, waiting while the channel is full; false when the client is gone or took nothing
/// for `stall`.
fn deliver(tx: &mpsc::Sender<Event>, mut e: Event, stall: Duration) -> bool {
    let since = Instant::now();
    loop {
        match tx.try_send(e) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
            Err(mpsc::error::TrySendError::Full(back)) => {
                if since.elapsed() > stall {
                    return false;
                }
                e = back;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}
