//! The talker's thread: takes requests into slots (up to [`EngineConfig::max_streams`] at once),
//! splits each into utterances, and runs steps: in each, every running stream's frame goes to
//! the code predictor as one batch, and their talker steps run as one batch after it.
//!
//! A joining request's prefill runs between two steps (one prefill a step while others run); a
//! stream waiting for a fed text's next token sits the step out, the others go on.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::config::EngineConfig;
use super::error::EngineError;
use super::feed::TextReader;
use super::plan::burst_pool;
use super::plan::pin;
use super::protocol::Behind;
use super::protocol::CodePredictorMsg;
use super::protocol::CodePredictorReply;
use super::protocol::DecoderMsg;
use super::protocol::EndMsg;
use super::protocol::FrameRow;
use super::protocol::Job;
use super::protocol::Ready;
use super::protocol::StartInfo;
use super::synthesis::check_feed;
use super::synthesis::plan_fed;
use super::synthesis::plan_request;
use super::synthesis::EngineInfo;
use super::synthesis::SegmentReport;
use super::synthesis::Utterance;
use crate::ffi::{CoreLoan, Reservation, Threadpool};
use crate::metrics::{record, Metrics};
use crate::model::ModelFiles;
use crate::sampling::SamplingParams;
use crate::synth::code_predictor_seed;
use crate::talker::graph::Batch;
use crate::talker::Runtime as TalkerRuntime;
use crate::talker::{Next, Session, StopReason, Talker};

/// The talker's channels: requests in, the code predictor there and back, the decoder.
pub(super) type Channels = (
    Receiver<Box<Job>>,
    Sender<CodePredictorMsg>,
    Receiver<CodePredictorReply>,
    Sender<DecoderMsg>,
);

pub(super) fn run(
    files: ModelFiles,
    cfg: EngineConfig,
    loan: Option<Arc<CoreLoan>>,
    ready: Ready,
    (jobs, cp_tx, reply_rx, dec_tx): Channels,
    behind: Behind,
) {
    let setup = (|| -> Result<(Threadpool, Option<Threadpool>, Talker), EngineError> {
        let pool = pin(&cfg.plan.talker, loan.as_ref())?;
        let burst = burst_pool(&cfg, &cfg.plan.talker)?;
        let talker = Talker::load_with(&files.talker, cfg.talker)?;
        Ok((pool, burst, talker))
    })();
    let (pool, burst, talker) = match setup {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let pools = Some((&pool, burst.as_ref()));
    let threads = cfg.plan.talker.threads;
    let first = match Session::new(&talker, cfg.n_ctx, threads, pools, cfg.exact) {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return;
        }
    };
    let c = talker.config();
    let _ = ready.send(Ok(Some(StartInfo {
        info: EngineInfo {
            model_type: c.tts_model_type.as_str(),
            size: c.tts_model_size.clone(),
            speakers: talker.speakers(),
            languages: talker.languages(),
            hidden: talker.n_embd(),
        },
        generation: talker.generation_config().clone(),
    })));
    drop(ready);
    let n = cfg.streams();
    let mut sessions: Vec<Option<Session<'_>>> = (0..n).map(|_| None).collect();
    sessions[0] = Some(first);
    let mut t = Talk {
        talker: &talker,
        cfg: &cfg,
        pools,
        sessions,
        slots: (0..n).map(|_| None).collect(),
        cp_tx,
        reply_rx,
        dec_tx,
        batch: Batch::default(),
        cores: None,
        behind,
    };
    while t.turn(&jobs) {}
}

/// The talker's side of the pipeline: the sessions and requests of every slot, and the
/// channels.
struct Talk<'t> {
    talker: &'t Talker,
    cfg: &'t EngineConfig,
    pools: Option<(&'t Threadpool, Option<&'t Threadpool>)>,
    /// Each slot's session (its KV cache), made at the slot's first request and kept.
    sessions: Vec<Option<Session<'t>>>,
    slots: Vec<Option<Slot<'t>>>,
    cp_tx: Sender<CodePredictorMsg>,
    reply_rx: Receiver<CodePredictorReply>,
    dec_tx: Sender<DecoderMsg>,
    /// The batched step's graph, kept while the same slots step together.
    batch: Batch,
    /// The decoder's cores, reserved by the code predictor for the next step.
    cores: Option<Reservation>,
    /// Per slot: its reader is behind (its sink full); its frames wait.
    behind: Behind,
}

/// A running request.
struct Slot<'t> {
    req: super::synthesis::Request,
    cancel: Arc<AtomicBool>,
    progress: Arc<AtomicUsize>,
    metrics: Metrics,
    segments: Vec<SegmentReport>,
    /// A whole text's utterances not started yet.
    rest: std::vec::IntoIter<Utterance>,
    /// A fed text, as the talker takes it.
    fed: Option<Fed<'t>>,
    /// The utterance being spoken.
    now: Option<Speaking>,
    /// The buffers of the hidden state and the embedded frame (with the code predictor during
    /// a frame).
    bufs: Option<(Vec<f32>, Vec<f32>)>,
}

/// An utterance under way.
struct Speaking {
    report: SegmentReport,
    phase: Phase,
    /// The code predictor's seed and sampling, sent with the utterance's first frame.
    reseed: Option<(u64, SamplingParams)>,
    /// Whether its frame waited for a fed text's token (counted once it steps).
    waited: bool,
}

/// Where an utterance is.
enum Phase {
    /// Its prompt waits for the prefill.
    Prefill(Box<(crate::talker::Prompt, crate::talker::GenOptions)>),
    /// Code 0 of the next frame is picked: the frame goes to the code predictor.
    Code(u32),
    /// The frame's embedded codes are back (`bufs.1`): the talker's step feeds them.
    Frame,
}

fn gone(stage: &'static str) -> EngineError {
    EngineError::StageGone { stage }
}

/// Whether a request has asked to stop.
fn cancelled(slot: &Slot<'_>) -> bool {
    slot.cancel.load(Ordering::Acquire)
}

impl<'t> Talk<'t> {
    /// One turn: takes requests into free slots, starts utterances, then one frame of every
    /// running stream. Returns false once the engine is dropped (or a stage is gone) and no
    /// request runs.
    fn turn(&mut self, jobs: &Receiver<Box<Job>>) -> bool {
        // Requests into free slots: waiting for one when nothing runs.
        while let Some(free) = self.slots.iter().position(Option::is_none) {
            let idle = self.slots.iter().all(Option::is_none);
            let job = if idle {
                match jobs.recv() {
                    Ok(j) => j,
                    Err(_) => return false,
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => break,
                }
            };
            if !self.admit(free, *job) {
                return false;
            }
        }
        let mut busy = false;
        // Cancels, ended fed texts' waits, and the next utterances' prefills: one prefill a
        // turn while other streams have frames to run.
        let running = |s: &Option<Slot<'_>>| {
            s.as_ref()
                .and_then(|s| s.now.as_ref())
                .is_some_and(|n| !matches!(n.phase, Phase::Prefill(_)))
        };
        let mut prefills = if self.slots.iter().any(running) {
            1
        } else {
            usize::MAX
        };
        for i in 0..self.slots.len() {
            match self.start_next(i, &mut prefills) {
                Ok(did) => busy |= did,
                Err(e) => busy |= self.fail(i, e),
            }
        }
        if !self.frames() {
            return false;
        }
        match self.steps() {
            Some(did) => busy |= did,
            None => return false,
        }
        if !busy {
            self.wait_for_text();
        }
        true
    }

    /// Takes `job` into slot `i`; false when the decoder is gone.
    fn admit(&mut self, i: usize, job: Job) -> bool {
        let Job {
            req,
            cancel,
            progress,
            sink,
            done,
            started,
        } = job;
        let begin = DecoderMsg::Begin {
            slot: i,
            sink,
            cancel: cancel.clone(),
            started,
            keep_codes: req.keep_codes,
            done,
        };
        if self.dec_tx.send(begin).is_err() {
            return false;
        }
        let mut slot = Slot {
            req,
            cancel,
            progress,
            metrics: Metrics::default(),
            segments: Vec::new(),
            rest: Vec::new().into_iter(),
            fed: None,
            now: None,
            bufs: Some((
                vec![0.0; self.talker.n_embd()],
                vec![0.0; self.talker.n_embd()],
            )),
        };
        let planned = (|| -> Result<(), EngineError> {
            if self.sessions[i].is_none() {
                let threads = self.cfg.plan.talker.threads;
                let s = Session::new(
                    self.talker,
                    self.cfg.n_ctx,
                    threads,
                    self.pools,
                    self.cfg.exact,
                )?;
                self.sessions[i] = Some(s);
            }
            match &slot.req.text_feed {
                Some(feed) => {
                    check_feed(&slot.req)?;
                    let reader =
                        TextReader::new(feed, self.talker.tokenizer(), self.cfg.segment_tokens);
                    slot.fed = Some(Fed {
                        reader,
                        pushed: 0,
                        ended: false,
                        limit: slot.req.frame_limit,
                        starved: 0,
                        rows: Vec::new(),
                    });
                }
                None => {
                    let u = plan_request(self.talker, &slot.req, self.cfg.segment_tokens)?;
                    slot.rest = u.into_iter();
                }
            }
            Ok(())
        })();
        self.slots[i] = Some(slot);
        if let Err(e) = planned {
            self.fail(i, e);
        }
        true
    }

    /// For slot `i` between frames: a cancel ends its utterance; with no utterance under way,
    /// the next one starts (a fed text's once its first token is there); an utterance waiting
    /// for its prefill gets it when `prefills` allows. Returns whether it did anything.
    fn start_next(&mut self, i: usize, prefills: &mut usize) -> Result<bool, EngineError> {
        let Some(slot) = self.slots[i].as_mut() else {
            return Ok(false);
        };
        let Some(session) = self.sessions[i].as_mut() else {
            return Err(gone("talker session"));
        };
        if cancelled(slot) {
            if let Some(mut now) = slot.now.take() {
                now.report.stop = session.cancel();
                slot.segments.push(now.report);
                self.dec_tx
                    .send(DecoderMsg::SegmentEnd(i))
                    .map_err(|_| gone("decoder"))?;
            }
            for u in slot.rest.by_ref() {
                let mut report = u.report;
                report.stop = StopReason::Cancelled;
                slot.segments.push(report);
            }
            self.end(i, Ok(()));
            return Ok(true);
        }
        if slot.now.is_none() {
            let next = match slot.fed.as_mut() {
                Some(_) if !slot.segments.is_empty() => None,
                Some(fed) => {
                    fed.reader.poll(Duration::ZERO)?;
                    if !fed.reader.may_start(slot.req.feed_start) {
                        // Not a word yet, or not as much text as the start policy waits for.
                        return Ok(false);
                    }
                    Some(plan_fed(
                        self.talker,
                        &slot.req,
                        &fed.reader,
                        self.cfg.segment_tokens,
                    )?)
                }
                None => slot.rest.next(),
            };
            let Some(u) = next else {
                self.end(i, Ok(()));
                return Ok(true);
            };
            let Utterance {
                prompt,
                opts,
                code_predictor_sampling,
                report,
            } = u;
            let seed = code_predictor_seed(opts.seed);
            slot.now = Some(Speaking {
                report,
                reseed: Some((seed, code_predictor_sampling)),
                phase: Phase::Prefill(Box::new((prompt, opts))),
                waited: false,
            });
        }
        let Some(now) = slot.now.as_mut() else {
            return Ok(false);
        };
        let Phase::Prefill(u) = &now.phase else {
            return Ok(false);
        };
        if *prefills == 0 {
            return Ok(false);
        }
        *prefills -= 1;
        self.dec_tx
            .send(DecoderMsg::SegmentStart(
                i,
                slot.req.voice.reference.clone(),
            ))
            .map_err(|_| gone("decoder"))?;
        let t = Instant::now();
        let next = session.start(&u.0, &u.1);
        record(&mut slot.metrics.talker_prefill, t.elapsed());
        match next? {
            Next::Code(c) => now.phase = Phase::Code(c),
            Next::Stop(r) => self.stop(i, r)?,
        }
        Ok(true)
    }

    /// Every stream with a code 0 picked: one batched frame of the code predictor, its codes on
    /// to the decoder. False when a stage is gone.
    fn frames(&mut self) -> bool {
        let mut rows = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if self.behind[i].load(Ordering::Acquire) {
                continue;
            }
            let Some(slot) = slot.as_mut() else { continue };
            let Some(now) = slot.now.as_mut() else {
                continue;
            };
            let Phase::Code(code0) = now.phase else {
                continue;
            };
            let Some((mut hidden, embedded)) = slot.bufs.take() else {
                continue;
            };
            if let Some(s) = self.sessions[i].as_ref() {
                hidden.copy_from_slice(s.hidden());
            }
            rows.push(FrameRow {
                slot: i,
                hidden,
                embedded,
                code0,
                reseed: now.reseed.take(),
            });
        }
        if rows.is_empty() {
            return true;
        }
        let t = Instant::now();
        if self.cp_tx.send(CodePredictorMsg::Frames(rows)).is_err() {
            return false;
        }
        let (rows, error, cores) = match self.reply_rx.recv() {
            Ok(CodePredictorReply::Frames { rows, cores }) => (rows, None, cores),
            Ok(CodePredictorReply::Failed(e, rows)) => (rows, Some(e), None),
            Ok(CodePredictorReply::Metrics(_)) | Err(_) => return false,
        };
        let waited = t.elapsed();
        let mut first_error = error;
        let message = first_error.as_ref().map(|e| e.to_string());
        for row in rows {
            let i = row.slot;
            let Some(slot) = self.slots[i].as_mut() else {
                continue;
            };
            slot.bufs = Some((row.hidden, row.embedded));
            if let Some(m) = &message {
                let e = first_error
                    .take()
                    .unwrap_or(EngineError::BatchFailed { error: m.clone() });
                self.fail(i, e);
                continue;
            }
            record(&mut slot.metrics.talker_wait, waited);
            if let Some(now) = slot.now.as_mut() {
                now.report.frames += 1;
                now.phase = Phase::Frame;
            }
            slot.progress.fetch_add(1, Ordering::AcqRel);
        }
        self.cores = cores;
        true
    }
}

impl<'t> Talk<'t> {
    /// Every stream whose embedded frame is back and whose text row is there (a fed text's): one
    /// batched talker step. `None` when a stage is gone; else whether any stream stepped.
    fn steps(&mut self) -> Option<bool> {
        let mut ids = Vec::new();
        let mut failed = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if self.behind[i].load(Ordering::Acquire) {
                continue;
            }
            let Some(slot) = slot.as_mut() else { continue };
            let Some(now) = slot.now.as_mut() else {
                continue;
            };
            if !matches!(now.phase, Phase::Frame) {
                continue;
            }
            if let (Some(fed), Some(session)) = (slot.fed.as_mut(), self.sessions[i].as_mut()) {
                match fed.ready(session) {
                    Ok(true) => {}
                    Ok(false) => {
                        now.waited = true;
                        continue;
                    }
                    Err(e) => {
                        failed.push((i, e));
                        continue;
                    }
                }
            }
            ids.push(i);
        }
        for (i, e) in failed {
            self.fail(i, e);
        }
        // llama.cpp's talker computes on its own pools: the reservation would only hold the
        // decoder back.
        let llama = self.talker.runtime() == TalkerRuntime::LlamaCpp;
        let cores = self.cores.take().filter(|_| !llama);
        if ids.is_empty() {
            return Some(false);
        }
        let embedded: Vec<&[f32]> = ids
            .iter()
            .map(|&i| {
                self.slots[i]
                    .as_ref()
                    .and_then(|s| s.bufs.as_ref())
                    .map_or(&[][..], |b| b.1.as_slice())
            })
            .collect();
        let mut picked: Vec<&mut Session<'t>> = self
            .sessions
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| ids.contains(i))
            .filter_map(|(_, s)| s.as_mut())
            .collect();
        let t = Instant::now();
        let results = Session::feed_together(&mut picked, &embedded, &mut self.batch);
        drop(cores);
        let took = t.elapsed();
        drop(picked);
        drop(embedded);
        let rows = ids.len() as u64;
        for (i, r) in ids.into_iter().zip(results) {
            let Some(slot) = self.slots[i].as_mut() else {
                continue;
            };
            record(&mut slot.metrics.talker_step, took);
            let _ = slot.metrics.streams.record(rows);
            slot.metrics.record_step_of(rows as usize, took);
            if let (Some(now), Some(fed)) = (slot.now.as_mut(), slot.fed.as_mut()) {
                fed.starved += std::mem::take(&mut now.waited) as usize;
            }
            let done = match r {
                Ok(Next::Code(c)) => {
                    if let Some(now) = slot.now.as_mut() {
                        now.phase = Phase::Code(c);
                    }
                    Ok(())
                }
                Ok(Next::Stop(r)) => self.stop(i, r),
                Err(e) => Err(e.into()),
            };
            if let Err(e) = done {
                self.fail(i, e);
            }
        }
        Some(true)
    }

    /// Slot `i`'s utterance ended with `stop`.
    fn stop(&mut self, i: usize, stop: StopReason) -> Result<(), EngineError> {
        let Some(slot) = self.slots[i].as_mut() else {
            return Ok(());
        };
        if let Some(mut now) = slot.now.take() {
            now.report.stop = stop;
            if let Some(f) = &slot.fed {
                now.report.tokens = f.reader.text().len();
            }
            slot.segments.push(now.report);
        }
        self.dec_tx
            .send(DecoderMsg::SegmentEnd(i))
            .map_err(|_| gone("decoder"))
    }

    /// Slot `i`'s request failed: it ends with `e`. Returns true (it did something).
    fn fail(&mut self, i: usize, e: EngineError) -> bool {
        if let (Some(slot), Some(session)) = (self.slots[i].as_mut(), self.sessions[i].as_mut()) {
            if slot.now.take().is_some() {
                session.cancel();
            }
        }
        self.end(i, Err(e));
        true
    }

    /// Slot `i`'s request is over: the code predictor's metrics of it are collected, and the
    /// decoder told; the slot is free.
    fn end(&mut self, i: usize, result: Result<(), EngineError>) {
        let Some(mut slot) = self.slots[i].take() else {
            return;
        };
        if self.cp_tx.send(CodePredictorMsg::Collect(i)).is_ok() {
            if let Ok(CodePredictorReply::Metrics(m)) = self.reply_rx.recv() {
                slot.metrics.merge(&m);
            }
        }
        let end = EndMsg {
            result,
            segments: slot.segments,
            metrics: slot.metrics,
            text_starved: slot.fed.map_or(0, |f| f.starved),
        };
        // The feed's reader goes before the request's end is told, so that its writer hears
        // the request is over (`FeedClosed`) by the time the job has ended.
        slot.req.text_feed = None;
        let _ = self.dec_tx.send(DecoderMsg::End(i, Box::new(end)));
    }

    /// Nothing ran this turn: every running stream waits for a fed text. Waits for the first
    /// one's next piece, at most [`POLL`].
    fn wait_for_text(&mut self) {
        let any = self.slots.iter().any(Option::is_some);
        let waiting = self
            .slots
            .iter_mut()
            .enumerate()
            .find_map(|(i, s)| s.as_mut().and_then(|s| s.fed.as_mut()).map(|f| (i, f)));
        match waiting {
            Some((i, fed)) => {
                if let Err(e) = fed.reader.poll(POLL) {
                    self.fail(i, e);
                }
            }
            // Every running stream's reader is behind.
            None if any => std::thread::sleep(BEHIND_POLL),
            None => {}
        }
    }
}

/// How long the talker sleeps when every running stream's reader is behind.
const BEHIND_POLL: Duration = Duration::from_millis(2);

/// How long the talker waits for a fed text's next fragment before it looks at the cancel flag
/// again.
const POLL: Duration = Duration::from_millis(20);

/// A fed text as the talker takes it: its final ids, and how many are rows of the utterance.
struct Fed<'t> {
    reader: TextReader<'t>,
    /// Text ids after the first given to the session as rows.
    pushed: usize,
    /// Whether `tts_eos` was given (the text ended).
    ended: bool,
    /// The request's frame limit (the cap follows the text's tokens below it).
    limit: Option<usize>,
    /// Frames that waited for their token.
    starved: usize,
    rows: Vec<f32>,
}

impl Fed<'_> {
    /// Gives `session` the rows of the ids that became final, and `tts_eos` once the text ends.
    fn give(&mut self, session: &mut Session<'_>) -> Result<(), EngineError> {
        let text = self.reader.text();
        session.set_text_tokens(text.len(), self.limit);
        let new = &text[(1 + self.pushed).min(text.len())..];
        let end = self.reader.ended() && !self.ended;
        if new.is_empty() && !end {
            return Ok(());
        }
        self.rows.clear();
        session.talker().text_rows(new, end, &mut self.rows)?;
        session.push_text(&self.rows);
        self.pushed += new.len();
        self.ended |= end;
        Ok(())
    }

    /// Before a step: whether the row it takes is there, or the text has ended (then
    /// `tts_pad`, as for a whole text). Takes what arrived without waiting.
    fn ready(&mut self, session: &mut Session<'_>) -> Result<bool, EngineError> {
        self.reader.poll(Duration::ZERO)?;
        self.give(session)?;
        Ok(self.ended || session.text_rows() >= session.frames())
    }
}
