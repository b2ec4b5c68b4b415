//! An engine owned by a thread of its own and fed by a bounded queue: the front end for callers
//! that cannot hold `&mut Engine` across a request (the C ABI, the Python package, a server).
//!
//! ```text
//!  any thread ──submit──▶ queue (cap `queue`) ──▶ qtts-worker: Engine::start ────────▶ chunks
//!      ▲                                                                  (cap CHUNK_QUEUE)
//!      └────────────── Job::read (pull, with a timeout) ◀─────────────────────┘
//! ```
//!
//! Contract:
//! - [`Worker::load`] loads the engine on the thread `qtts-worker`; load errors come back from it.
//! - [`Worker::submit`] takes `&self` (a worker is `Send + Sync`) and never blocks: past `queue`
//!   waiting requests it answers [`EngineError::Busy`] at once.
//! - A [`Job`]'s audio is pulled ([`Job::read`], [`Job::next_chunk`]): foreign code never runs on
//!   an engine thread. At most [`CHUNK_QUEUE`] decoder chunks wait; past that the engine blocks
//!   (backpressure), so a reader that stops reading holds no more than that in memory.
//! - Up to [`EngineConfig::max_streams`] requests run at once (one by default), taken in
//!   submission order; each has its own chunks, so a reader that stops reading holds its own
//!   request back (the engine's pipeline with it, for now: see the engine's docs).
//! - [`Job::cancel`], or dropping the [`Job`], stops the request between frames, whether it is
//!   running or still queued; the worker then takes the next one. [`Worker::cancel_all`] does so
//!   for every request submitted before it.
//! - Dropping the [`Worker`] cancels the running requests, answers the queued ones with
//!   [`StopReason::Cancelled`] and joins the thread.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use super::error::EngineError;
use super::synthesis::{EngineInfo, Request, Summary};
use super::{Engine, EngineConfig};
use crate::audio::ChannelSink;
use crate::model::ModelFiles;
use crate::talker::StopReason;

/// Decoder chunks a job holds before the engine waits for its reader: 16 chunks, 1.28 s of audio
/// at one frame a chunk (more with [`EngineConfig::decoder_chunk`] above 1).
pub const CHUNK_QUEUE: usize = 16;

/// Requests that may wait behind the running ones by default ([`Worker::load`]'s `queue`).
pub const DEFAULT_QUEUE: usize = 8;

/// A job's state, shared by its reader and the worker: the one that moves it out of `QUEUED`
/// answers it.
const QUEUED: u8 = 0;
/// Taken by the worker.
const TAKEN: u8 = 1;
/// Cancelled while queued: its reader answered itself; the worker skips it.
const ABANDONED: u8 = 2;

/// A queued request.
struct Queued {
    state: Arc<AtomicU8>,
    /// Its place in submission order (from 1).
    seq: u64,
    /// Set by the worker as it takes the request: the `seq` of the request it answered last.
    after: Arc<AtomicU64>,
    req: Request,
    sink: ChannelSink,
    cancel: Arc<AtomicBool>,
    done: Sender<Result<Summary, EngineError>>,
}

/// An engine on a thread of its own (see the module docs).
#[derive(Debug)]
pub struct Worker {
    jobs: Option<Sender<Queued>>,
    /// Closed (dropped) when the worker is dropped: wakes the thread waiting on a request.
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    info: EngineInfo,
    config: EngineConfig,
    queue: usize,
    shared: Arc<Shared>,
}

/// What the worker thread and the handles share.
#[derive(Debug, Default)]
struct Shared {
    /// Requests in the queue.
    waiting: AtomicUsize,
    /// The last submission's `seq`.
    submitted: AtomicU64,
    /// Requests up to this `seq` are cancelled ([`Worker::cancel_all`]).
    cancelled_up_to: AtomicU64,
    /// The running requests' flags.
    running: Mutex<Vec<Arc<AtomicBool>>>,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued").finish_non_exhaustive()
    }
}

impl Worker {
    /// Loads the engine on `files` on a new thread; up to `queue` requests may wait behind the
    /// running one (0: [`DEFAULT_QUEUE`], as in the C ABI and the Python package).
    pub fn load(
        files: &ModelFiles,
        config: EngineConfig,
        queue: usize,
    ) -> Result<Worker, EngineError> {
        let queue = if queue == 0 { DEFAULT_QUEUE } else { queue };
        let (jobs_tx, jobs_rx) = bounded::<Queued>(queue);
        let (stop_tx, stop_rx) = bounded::<()>(1);
        let (ready_tx, ready_rx) = bounded::<Result<EngineInfo, EngineError>>(1);
        let shared = Arc::new(Shared::default());
        let (files, cfg, count) = (files.clone(), config.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name("qtts-worker".into())
            .spawn(move || {
                let engine = match Engine::load(&files, cfg) {
                    Ok(e) => {
                        let _ = ready_tx.send(Ok(e.info().clone()));
                        e
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                serve(&engine, &jobs_rx, &stop_rx, &count);
            })
            .map_err(|_| EngineError::StageGone { stage: "worker" })?;
        match ready_rx.recv() {
            Ok(Ok(info)) => Ok(Worker {
                jobs: Some(jobs_tx),
                stop: Some(stop_tx),
                thread: Some(thread),
                info,
                config,
                queue,
                shared,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(EngineError::StageGone { stage: "worker" })
            }
        }
    }

    /// What the model offers.
    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Requests waiting behind the running ones.
    pub fn queued(&self) -> usize {
        self.shared.waiting.load(Ordering::Acquire)
    }

    /// Requests running in the engine now (at most [`EngineConfig::streams`]).
    pub fn running(&self) -> usize {
        self.shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Cancels every request submitted so far: the running ones and the queued ones.
    pub fn cancel_all(&self) {
        // SeqCst with the worker's store of `running` then load of this: either it sees this
        // bound, or this sees its flag.
        let last = self.shared.submitted.load(Ordering::SeqCst);
        self.shared
            .cancelled_up_to
            .fetch_max(last, Ordering::SeqCst);
        for flag in self
            .shared
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            flag.store(true, Ordering::Release);
        }
    }

    /// Queues `req`; fails at once with the request's error when [`EngineInfo::check`] refuses
    /// it (nothing waits in the queue to fail), and with [`EngineError::Busy`] when `queue`
    /// requests already wait.
    pub fn submit(&self, req: Request) -> Result<Job, EngineError> {
        self.info.check(&req)?;
        let (sink, chunks) = ChannelSink::new(CHUNK_QUEUE);
        let (done_tx, done_rx) = bounded(1);
        let (wake_tx, wake_rx) = bounded(1);
        let cancel = Arc::new(AtomicBool::new(false));
        let state = Arc::new(AtomicU8::new(QUEUED));
        let after = Arc::new(AtomicU64::new(0));
        let seq = self.shared.submitted.fetch_add(1, Ordering::SeqCst) + 1;
        let queued = Queued {
            state: state.clone(),
            seq,
            after: after.clone(),
            req,
            sink,
            cancel: cancel.clone(),
            done: done_tx,
        };
        let jobs = self
            .jobs
            .as_ref()
            .ok_or(EngineError::StageGone { stage: "worker" })?;
        // Counted before it is sent, so that the worker's decrement never comes first.
        self.shared.waiting.fetch_add(1, Ordering::AcqRel);
        match jobs.try_send(queued) {
            Ok(()) => Ok(Job {
                order: Order {
                    seq,
                    after,
                    state: state.clone(),
                },
                chunks,
                done: done_rx,
                canceller: super::Canceller::new(cancel, Some(wake_tx)),
                wake: wake_rx,
                state,
                partial: Vec::new(),
                at: 0,
                finished: None,
            }),
            Err(e) => {
                self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
                Err(match e {
                    TrySendError::Full(_) => EngineError::Busy { queue: self.queue },
                    TrySendError::Disconnected(_) => EngineError::StageGone { stage: "worker" },
                })
            }
        }
    }
}

/// A request the worker thread has started.
struct Running<'e> {
    seq: u64,
    cancel: Arc<AtomicBool>,
    done: Sender<Result<Summary, EngineError>>,
    synthesis: super::Synthesis<'e>,
}

/// The worker thread's loop: up to [`EngineConfig::max_streams`] requests at once, taken in
/// submission order, until the queue closes and the last one ends.
fn serve(engine: &Engine, jobs: &Receiver<Queued>, stop: &Receiver<()>, shared: &Shared) {
    let max = engine.config().streams();
    let flags = |f: &dyn Fn(&mut Vec<Arc<AtomicBool>>)| {
        f(&mut shared.running.lock().unwrap_or_else(|e| e.into_inner()));
    };
    // The `seq` of the request answered last (0: none yet).
    let mut last = 0;
    let mut running: Vec<Running<'_>> = Vec::new();
    let (mut stopping, mut closed) = (false, false);
    loop {
        if closed && running.is_empty() {
            return;
        }
        let mut sel = crossbeam_channel::Select::new();
        let take = (!closed && running.len() < max).then(|| sel.recv(jobs));
        let halt = (!stopping).then(|| sel.recv(stop));
        let ends: Vec<usize> = running
            .iter()
            .map(|r| sel.recv(&r.synthesis.done))
            .collect();
        let op = sel.select();
        let i = op.index();
        if Some(i) == take {
            let Ok(job) = op.recv(jobs) else {
                closed = true;
                continue;
            };
            shared.waiting.fetch_sub(1, Ordering::AcqRel);
            // Before the state leaves QUEUED, so that a reader that sees it taken sees this too.
            job.after.store(last, Ordering::Release);
            if job
                .state
                .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Cancelled while queued: its reader has answered itself.
                continue;
            }
            flags(&|v| v.push(job.cancel.clone()));
            if job.seq <= shared.cancelled_up_to.load(Ordering::SeqCst) {
                job.cancel.store(true, Ordering::Release);
            }
            if stopping || job.cancel.load(Ordering::Acquire) {
                let mut s = Summary::empty();
                s.stop = StopReason::Cancelled;
                flags(&|v| v.retain(|f| !Arc::ptr_eq(f, &job.cancel)));
                let _ = job.done.send(Ok(s));
                last = job.seq;
                continue;
            }
            let synthesis = engine.synthesize_with(job.req, Box::new(job.sink), job.cancel.clone());
            running.push(Running {
                seq: job.seq,
                cancel: job.cancel,
                done: job.done,
                synthesis,
            });
        } else if Some(i) == halt {
            let _ = op.recv(stop);
            // The worker is being dropped: stop the running requests, then answer them.
            stopping = true;
            for r in &running {
                r.cancel.store(true, Ordering::Release);
            }
        } else if let Some(k) = ends.iter().position(|&e| e == i) {
            let finished = op.recv(&running[k].synthesis.done);
            let r = running.remove(k);
            flags(&|v| v.retain(|f| !Arc::ptr_eq(f, &r.cancel)));
            let result = match finished {
                Ok((r, _sink)) => r,
                Err(_) => Err(EngineError::StageGone { stage: "decoder" }),
            };
            let _ = r.done.send(result);
            last = r.seq;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.take();
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What [`Job::read`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// This many samples were copied into the buffer.
    Samples(usize),
    /// No audio came within the timeout; the request goes on.
    Timeout,
    /// The request is over and all its audio was read; [`Job::finish`] gives its summary.
    End,
}

/// A job's place in its worker's order, readable from any thread: what a server reports so that
/// a client can check the engine's order without timing anything.
#[derive(Debug, Clone)]
pub struct Order {
    seq: u64,
    after: Arc<AtomicU64>,
    state: Arc<AtomicU8>,
}

impl Order {
    /// The job's place in submission order (from 1; a submission refused as busy also takes
    /// one).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Once the worker has taken the job: the [`Order::seq`] of the request it answered just
    /// before (0 for its first). `None` while the job is queued, or when it was cancelled there.
    /// With [`EngineConfig::max_streams`] 1 the worker runs one request at a time, so a job
    /// whose `after` is another's `seq` started only once that one had ended.
    pub fn after(&self) -> Option<u64> {
        (self.state.load(Ordering::Acquire) == TAKEN).then(|| self.after.load(Ordering::Acquire))
    }
}

/// A submitted request: its audio, pulled, and its end. Dropping it cancels the request (no one
/// would read its audio), unlike dropping an [`Engine`](super::Engine)'s
/// [`Synthesis`](super::Synthesis), whose audio goes to a sink.
#[derive(Debug)]
#[must_use = "dropping a job cancels its request"]
pub struct Job {
    order: Order,
    chunks: Receiver<Vec<f32>>,
    done: Receiver<Result<Summary, EngineError>>,
    canceller: super::Canceller,
    /// Woken by a cancel, so that a reader waiting on a queued job answers it at once.
    wake: Receiver<()>,
    state: Arc<AtomicU8>,
    /// The chunk being read and how much of it was.
    partial: Vec<f32>,
    at: usize,
    finished: Option<Result<Summary, EngineError>>,
}

impl Job {
    /// Stops the request between frames (also when it is still queued). Audio made before stays
    /// readable; the summary says [`StopReason::Cancelled`].
    pub fn cancel(&self) {
        self.canceller.cancel();
    }

    /// Its place in the worker's order.
    pub fn order(&self) -> Order {
        self.order.clone()
    }

    /// A handle that cancels this job from another thread (waking a reader waiting on it).
    pub fn canceller(&self) -> super::Canceller {
        self.canceller.clone()
    }

    /// Whether the request still waits in the queue (the worker has not taken it, and it was not
    /// cancelled there): a server uses it to bound the time a request waits before it starts.
    pub fn is_queued(&self) -> bool {
        self.state.load(Ordering::Acquire) == QUEUED
    }

    /// Answers a job cancelled while still queued, if it is (the worker will skip it).
    fn abandon(&mut self) -> bool {
        let won = self
            .state
            .compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if won {
            let mut s = Summary::empty();
            s.stop = StopReason::Cancelled;
            self.finished = Some(Ok(s));
        }
        won
    }

    /// The next chunk of audio (24 kHz mono f32), waiting up to `timeout` (`None`: until it comes
    /// or the request ends). `Ok(None)` at the end; `Err(Read::Timeout)` when nothing came.
    pub fn next_chunk(&mut self, timeout: Option<Duration>) -> Result<Option<Vec<f32>>, Read> {
        if self.at < self.partial.len() {
            let rest = self.partial.split_off(self.at);
            self.at = 0;
            self.partial.clear();
            return Ok(Some(rest));
        }
        if self.finished.is_some() {
            // Every chunk was sent before the end: what is left is in the channel.
            return Ok(self.chunks.try_recv().ok());
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let never = crossbeam_channel::never();
        let timer = match deadline {
            Some(d) => crossbeam_channel::at(d),
            None => never.clone(),
        };
        loop {
            crossbeam_channel::select! {
                recv(self.chunks) -> c => return match c {
                    Ok(c) => Ok(Some(c)),
                    // The sink is gone: the request ended; its answer follows.
                    Err(_) => {
                        self.finished = Some(self.done.recv().unwrap_or(Err(
                            EngineError::StageGone { stage: "worker" },
                        )));
                        Ok(None)
                    }
                },
                recv(self.done) -> d => {
                    self.finished =
                        Some(d.unwrap_or(Err(EngineError::StageGone { stage: "worker" })));
                    return Ok(self.chunks.try_recv().ok());
                },
                recv(self.wake) -> _ => {
                    // Cancelled: a queued job ends here; a running one ends soon (its chunks or
                    // its answer wake this loop again).
                    if self.abandon() {
                        return Ok(None);
                    }
                },
                recv(timer) -> _ => return Err(Read::Timeout),
            }
        }
    }

    /// Copies up to `buf.len()` samples of the request's audio into `buf`, waiting up to
    /// `timeout` for some (`None`: as long as it takes).
    pub fn read(&mut self, buf: &mut [f32], timeout: Option<Duration>) -> Read {
        if buf.is_empty() {
            return Read::Samples(0);
        }
        if self.at >= self.partial.len() {
            match self.next_chunk(timeout) {
                Ok(Some(c)) => {
                    self.partial = c;
                    self.at = 0;
                }
                Ok(None) => return Read::End,
                Err(r) => return r,
            }
        }
        let n = buf.len().min(self.partial.len() - self.at);
        buf[..n].copy_from_slice(&self.partial[self.at..self.at + n]);
        self.at += n;
        Read::Samples(n)
    }

    /// The request's result once it has ended (`None` before; see [`Read::End`]).
    pub fn outcome(&self) -> Option<Result<&Summary, &EngineError>> {
        self.finished.as_ref().map(|r| r.as_ref())
    }

    /// Whether the request has ended and all its audio was read.
    pub fn is_done(&self) -> bool {
        self.finished.is_some() && self.at >= self.partial.len() && self.chunks.is_empty()
    }

    /// The request's summary: waits for its end, dropping audio not yet read.
    pub fn finish(mut self) -> Result<Summary, EngineError> {
        loop {
            if let Some(r) = self.finished.take() {
                return r;
            }
            self.partial.clear();
            self.at = 0;
            // Keep taking chunks so that the engine never blocks on a full channel.
            let _ = self.next_chunk(None);
        }
    }

    /// All of the request's audio and its summary.
    pub fn collect(mut self) -> (Vec<f32>, Result<Summary, EngineError>) {
        let mut audio = Vec::new();
        while let Ok(Some(c)) = self.next_chunk(None) {
            audio.extend_from_slice(&c);
        }
        (audio, self.finish())
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        // A job nobody reads is a cancelled one (a closed channel would end it with an error).
        if self.finished.is_none() {
            self.canceller.cancel();
            self.abandon();
        }
    }
}
