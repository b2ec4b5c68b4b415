//! The decoder's thread: codes to samples, written to the request's sink.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

use super::config::EngineConfig;
use super::error::EngineError;
use super::plan::burst_pool;
use super::plan::pin;
use super::protocol::announce;
use super::protocol::Behind;
use super::protocol::DecoderMsg;
use super::protocol::EndMsg;
use super::protocol::Ready;
use super::synthesis::Finished;
use super::synthesis::Summary;
use crate::audio::{AudioError, AudioSink, FRAME_SAMPLES};
use crate::decoder::{Decoder, DecoderState};
use crate::ffi::{CoreLoan, Threadpool};
use crate::gguf::GgufFile;
use crate::metrics::{record, Metrics};
use crate::model::ModelFiles;
use crate::talker::StopReason;

/// The decoder's state for one request.
struct Active {
    sink: Box<dyn AudioSink>,
    cancel: Arc<AtomicBool>,
    started: Instant,
    keep_codes: bool,
    done: Sender<Finished>,
    error: Option<EngineError>,
    pending: Vec<[u32; 16]>,
    /// Whole chunks waiting for their turn at the decoder, in order.
    due: std::collections::VecDeque<Vec<[u32; 16]>>,
    /// Frames decoded in this utterance (the next chunk's size: `EngineConfig::chunk_after`).
    decoded: usize,
    summary: Summary,
    metrics: Metrics,
    /// The stream's decoder state while another stream's is loaded.
    state: Option<DecoderState>,
    /// Non-finite samples of the stream's earlier loads.
    non_finite: u64,
    /// Samples decoded while the sink was full, written once it takes them.
    held: Vec<f32>,
    /// The request's end, kept until its held samples are written.
    end: Option<Box<EndMsg>>,
    /// When its first sample was written.
    first_audio: Option<Instant>,
}

/// The decoder and which slot's stream it holds: each request's stream state (conv histories,
/// transformer window) is swapped in when its frames are decoded and saved when another's are.
struct Streams {
    voc: Decoder,
    active: Vec<Option<Active>>,
    loaded: Option<usize>,
    /// Per slot: its sink is full and samples wait (the talker skips the slot meanwhile).
    behind: Behind,
    /// Requests whose end came while their sink was full: only their held samples are left to
    /// write; their slots are free for the next requests.
    finishing: Vec<Active>,
}

impl Streams {
    /// Makes slot `to`'s stream the decoder's, saving the loaded one's; a stream with no saved
    /// state starts cold.
    fn switch(&mut self, to: usize) -> Result<(), EngineError> {
        if self.loaded == Some(to) {
            return Ok(());
        }
        if let Some(l) = self.loaded.take() {
            if let Some(a) = self.active[l].as_mut() {
                a.non_finite += self.voc.non_finite();
                a.state = Some(self.voc.state()?);
            }
        }
        match self.active[to].as_mut().and_then(|a| a.state.take()) {
            Some(s) => self.voc.restore(&s)?,
            None => self.voc.reset()?,
        }
        self.loaded = Some(to);
        Ok(())
    }

    /// Slot `slot`'s next due chunk decoded and written (its stream loaded first).
    fn decode(&mut self, slot: usize, (pool, loan): On<'_>, pcm: &mut [f32]) {
        let Some(chunk) = self.active[slot].as_mut().and_then(|a| a.due.pop_front()) else {
            return;
        };
        let switched = self.switch(slot);
        let Some(a) = self.active[slot].as_mut() else {
            return;
        };
        if let Err(e) = switched {
            a.error.get_or_insert(e);
        }
        decode_pending(
            &mut self.voc,
            pool,
            loan,
            a,
            &chunk,
            pcm,
            &self.behind[slot],
        );
    }

    /// Writes the held samples of every stream whose sink takes them now, and ends the requests
    /// that waited for that (those still in a slot, and those that ended while their sink was
    /// full, whose slots are free already).
    fn flush(&mut self) {
        for a in &mut self.finishing {
            if a.cancel.load(Ordering::Acquire) {
                a.held.clear();
            }
            // Its slot may be another request's now: that one's flag is not this one's.
            deliver(a, &AtomicBool::new(false));
        }
        for a in self.finishing.extract_if(.., |a| a.held.is_empty()) {
            complete(a);
        }
        for slot in 0..self.active.len() {
            let Some(a) = self.active[slot].as_mut() else {
                continue;
            };
            if a.held.is_empty() {
                continue;
            }
            deliver(a, &self.behind[slot]);
            if a.held.is_empty() && a.end.is_some() {
                self.finish(slot);
            }
        }
    }

    /// Whether a stream holds samples its sink has not taken.
    fn holding(&self) -> bool {
        !self.finishing.is_empty() || self.active.iter().flatten().any(|a| !a.held.is_empty())
    }

    /// Slot `slot`'s request is over (its end came): the slot is free; the request is answered
    /// once its held samples are written (at once when none are, or when it was cancelled).
    fn finish(&mut self, slot: usize) {
        let Some(mut a) = self.active.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.behind[slot].store(false, Ordering::Release);
        if self.loaded == Some(slot) {
            a.non_finite += self.voc.non_finite();
            self.loaded = None;
        }
        if a.cancel.load(Ordering::Acquire) {
            a.held.clear();
        }
        if a.held.is_empty() {
            complete(a);
        } else {
            self.finishing.push(a);
        }
    }
}

pub(super) fn run(
    files: ModelFiles,
    cfg: EngineConfig,
    loan: Option<Arc<CoreLoan>>,
    ready: Ready,
    rx: Receiver<DecoderMsg>,
    first_done: Sender<()>,
    behind: Behind,
) {
    let setup = (|| -> Result<(Threadpool, Option<Threadpool>, Decoder), EngineError> {
        let pool = pin(&cfg.plan.decoder, None)?;
        let burst = burst_pool(&cfg, &cfg.plan.decoder)?;
        let mut voc = cfg
            .decoder
            .load(&GgufFile::open(&files.mmproj)?, cfg.exact)?;
        voc.set_max_chunk(cfg.decoder_chunk.max(1));
        Ok((pool, burst, voc))
    })();
    let Some((pool, burst, voc)) = announce(ready, setup) else {
        return;
    };
    let chunk = cfg.decoder_chunk.max(1);
    let mut pcm = vec![0.0f32; chunk * FRAME_SAMPLES];
    let mut st = Streams {
        voc,
        active: (0..cfg.streams()).map(|_| None).collect(),
        loaded: None,
        behind,
        finishing: Vec::new(),
    };
    let mut primed = super::prime::PrimeCache::default();
    let loan = loan.as_deref();
    loop {
        let t = Instant::now();
        let msg = if st.holding() {
            match rx.recv_timeout(HELD_POLL) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        } else {
            match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => return,
            }
        };
        let mut waited = t.elapsed();
        let mut next = msg;
        // Every message there is, then the most urgent stream's next chunk, then again: a
        // stream that has played least of its audio (a joining one: none) is decoded first.
        loop {
            if let Some(msg) = next.take() {
                let first = matches!(msg, DecoderMsg::FirstFrame(..));
                let slot = st.handle(msg, waited, &mut primed, (&pool, loan), &mut pcm, &cfg);
                waited = std::time::Duration::ZERO;
                if first {
                    // With the burst, an utterance's first frame is decoded on every core at
                    // once while the code predictor waits; it then waits for this.
                    if let (Some(slot), Some(b)) = (slot, &burst) {
                        st.drain(slot, (b, loan), &mut pcm);
                    }
                    if first_done.send(()).is_err() {
                        return;
                    }
                }
                match rx.try_recv() {
                    Ok(m) => {
                        next = Some(m);
                        continue;
                    }
                    Err(TryRecvError::Empty) => {}
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            match st.most_urgent() {
                Some(slot) => st.decode(slot, (&pool, loan), &mut pcm),
                None => break,
            }
            match rx.try_recv() {
                Ok(m) => next = Some(m),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => return,
            }
        }
        st.flush();
    }
}

/// A request's end: the sink's end, then the answer.
fn complete(mut a: Active) {
    let Some(end) = a.end.take() else { return };
    a.summary.generated = a.started.elapsed();
    let cancelled = a.cancel.load(Ordering::Acquire);
    if let Err(e) = a.sink.end(&a.cancel) {
        if !cancelled {
            a.error.get_or_insert(e.into());
        }
    }
    let EndMsg {
        result,
        segments,
        metrics: mut m,
        text_starved,
    } = *end;
    m.merge(&a.metrics);
    let mut s = a.summary;
    s.elapsed = a.started.elapsed();
    s.non_finite = a.non_finite;
    s.stop = if cancelled {
        StopReason::Cancelled
    } else {
        segments
            .last()
            .map(|r| r.stop)
            .unwrap_or(StopReason::Cancelled)
    };
    s.segments = segments;
    s.metrics = m;
    s.text_starved_frames = text_starved;
    let result = match (result, a.error) {
        (Err(e), _) => Err(e),
        (Ok(()), Some(e)) => Err(e),
        (Ok(()), None) => Ok(s),
    };
    let _ = a.done.send((result, a.sink));
}

/// A pool and the core loan its compute claims from.
type On<'a> = (&'a Threadpool, Option<&'a CoreLoan>);

impl Streams {
    /// Applies one message; returns the slot of a frame it took.
    fn handle(
        &mut self,
        msg: DecoderMsg,
        waited: std::time::Duration,
        primed: &mut super::prime::PrimeCache,
        on: On<'_>,
        pcm: &mut [f32],
        cfg: &EngineConfig,
    ) -> Option<usize> {
        match msg {
            DecoderMsg::Begin {
                slot,
                mut sink,
                cancel,
                started,
                keep_codes,
                done,
            } => {
                let error = sink.begin().err().map(EngineError::from);
                if let Some(a) = self.active.get_mut(slot) {
                    *a = Some(Active {
                        sink,
                        cancel,
                        started,
                        keep_codes,
                        done,
                        error,
                        pending: Vec::new(),
                        due: std::collections::VecDeque::new(),
                        decoded: 0,
                        summary: Summary::empty(),
                        metrics: Metrics::default(),
                        state: None,
                        non_finite: 0,
                        held: Vec::new(),
                        end: None,
                        first_audio: None,
                    });
                }
                None
            }
            DecoderMsg::SegmentStart(slot, reference) => {
                if self.active.get(slot).is_some_and(Option::is_some) {
                    // The previous utterance's chunks first.
                    self.drain(slot, on, pcm);
                    // The stream starts over: what the decoder holds is saved (another
                    // slot's) or dropped (this one's).
                    if self.loaded == Some(slot) {
                        if let Some(a) = self.active[slot].as_mut() {
                            a.non_finite += self.voc.non_finite();
                        }
                    } else {
                        let _ = self.switch(slot);
                    }
                    let started = primed.start(&mut self.voc, on.0, reference.as_ref());
                    self.loaded = Some(slot);
                    if let Some(a) = self.active[slot].as_mut() {
                        if let Err(e) = started {
                            a.error.get_or_insert(e);
                        }
                        a.state = None;
                        a.pending.clear();
                        a.decoded = 0;
                    }
                }
                None
            }
            DecoderMsg::Frame(slot, codes) | DecoderMsg::FirstFrame(slot, codes) => {
                let a = self.active.get_mut(slot)?.as_mut()?;
                record(&mut a.metrics.decoder_wait, waited);
                a.summary.frames += 1;
                if a.keep_codes {
                    a.summary.codes.push(codes);
                }
                a.pending.push(codes);
                if a.pending.len() >= cfg.chunk_after(a.decoded) {
                    a.decoded += a.pending.len();
                    let chunk = std::mem::take(&mut a.pending);
                    a.due.push_back(chunk);
                }
                Some(slot)
            }
            DecoderMsg::SegmentEnd(slot) => {
                if let Some(Some(a)) = self.active.get_mut(slot) {
                    if !a.pending.is_empty() {
                        let chunk = std::mem::take(&mut a.pending);
                        a.due.push_back(chunk);
                    }
                    self.drain(slot, on, pcm);
                }
                None
            }
            DecoderMsg::End(slot, end) => {
                self.drain(slot, on, pcm);
                if let Some(Some(a)) = self.active.get_mut(slot) {
                    a.end = Some(end);
                    self.finish(slot);
                }
                None
            }
        }
    }

    /// The stream with a chunk to decode that has the least audio ahead of its listener (the
    /// samples written less the time since its first one, as a listener that plays from its
    /// first sample hears them); one with no audio yet comes first. Streams whose sink is full
    /// wait.
    fn most_urgent(&self) -> Option<usize> {
        let now = Instant::now();
        let ahead = |a: &Active| match a.first_audio {
            None => f64::NEG_INFINITY,
            Some(t) => {
                a.summary.samples as f64 / crate::audio::SAMPLE_RATE as f64
                    - now.duration_since(t).as_secs_f64()
            }
        };
        self.active
            .iter()
            .enumerate()
            .filter_map(|(i, a)| a.as_ref().map(|a| (i, a)))
            .filter(|(_, a)| !a.due.is_empty() && a.held.is_empty())
            .min_by(|(_, a), (_, b)| ahead(a).total_cmp(&ahead(b)))
            .map(|(i, _)| i)
    }

    /// Decodes every chunk slot `slot` has due, in order.
    fn drain(&mut self, slot: usize, on: On<'_>, pcm: &mut [f32]) {
        while self.active[slot]
            .as_ref()
            .is_some_and(|a| !a.due.is_empty())
        {
            self.decode(slot, on, pcm);
        }
    }
}

fn decode_pending(
    voc: &mut Decoder,
    pool: &Threadpool,
    loan: Option<&CoreLoan>,
    a: &mut Active,
    chunk: &[[u32; 16]],
    pcm: &mut [f32],
    behind: &AtomicBool,
) {
    if a.error.is_none() && !a.cancel.load(Ordering::Acquire) && !chunk.is_empty() {
        match decode_frames(voc, pool, loan, chunk, pcm, &mut a.metrics) {
            Ok(n) => {
                a.held.extend_from_slice(&pcm[..n]);
                deliver(a, behind);
            }
            Err(e) => {
                a.error.get_or_insert(e);
            }
        }
    }
}

/// Writes a stream's held samples to its sink when the sink takes them without waiting; else
/// keeps them and marks the stream `behind`, so that a slow reader holds back its own stream
/// only (the talker skips it until its sink has room).
fn deliver(a: &mut Active, behind: &AtomicBool) {
    if a.held.is_empty() || a.sink.is_full() {
        behind.store(!a.held.is_empty(), Ordering::Release);
        return;
    }
    a.summary.playout.ready(Instant::now(), a.summary.samples);
    match a.sink.write(&a.held, &a.cancel) {
        Ok(()) | Err(AudioError::Cancelled) => {}
        Err(e) => {
            a.error.get_or_insert(e.into());
        }
    }
    a.summary.ttfa.get_or_insert_with(|| a.started.elapsed());
    a.first_audio.get_or_insert_with(Instant::now);
    a.summary.samples += a.held.len();
    if let Some(q) = a.sink.queued_ms() {
        let _ = a.metrics.ring_fill.record((q.round() as u64).max(1));
    }
    a.held.clear();
    behind.store(false, Ordering::Release);
}

/// How often the decoder looks again at a full sink while it holds that stream's samples.
const HELD_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Decodes `frames` into `pcm` and writes their samples to `sink`; records each frame's decoder
/// time, the first sample's time since `started`, the samples written and the sink's fill
/// (shared by the decoder thread and [`serial::Serial`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_and_write(
    voc: &mut Decoder,
    pool: &Threadpool,
    loan: Option<&CoreLoan>,
    frames: &[[u32; 16]],
    pcm: &mut [f32],
    sink: &mut dyn AudioSink,
    cancel: &AtomicBool,
    started: Instant,
    summary: &mut Summary,
    metrics: &mut Metrics,
) -> Result<(), EngineError> {
    let n = decode_frames(voc, pool, loan, frames, pcm, metrics)?;
    if n == 0 {
        return Ok(());
    }
    summary.playout.ready(Instant::now(), summary.samples);
    sink.write(&pcm[..n], cancel)?;
    summary.ttfa.get_or_insert_with(|| started.elapsed());
    summary.samples += n;
    if let Some(q) = sink.queued_ms() {
        let _ = metrics.ring_fill.record((q.round() as u64).max(1));
    }
    Ok(())
}

/// Decodes `frames` into `pcm`, recording each frame's decoder time; returns the samples made.
fn decode_frames(
    voc: &mut Decoder,
    pool: &Threadpool,
    loan: Option<&CoreLoan>,
    frames: &[[u32; 16]],
    pcm: &mut [f32],
    metrics: &mut Metrics,
) -> Result<usize, EngineError> {
    let n = frames.len();
    if n == 0 {
        return Ok(0);
    }
    let out = &mut pcm[..n * FRAME_SAMPLES];
    // The cores this stage lends, back for the frames' compute only (not the sink's write,
    // which may wait for the speaker).
    let t = Instant::now();
    let claim = loan.map(CoreLoan::claim);
    if loan.is_some() {
        record(&mut metrics.decoder_claim, t.elapsed());
    }
    let t = Instant::now();
    let d = voc.decode_frames(pool, frames, out);
    drop(claim);
    let d = d?;
    let per = t.elapsed() / n as u32;
    for _ in 0..n {
        record(&mut metrics.decoder_frame, per);
    }
    Ok(d.samples)
}
