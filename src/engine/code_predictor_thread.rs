//! The code predictor's thread: codebooks 1..15 of each step's frames (one row per running
//! stream, in one batch), handed back to the talker and on to the decoder.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use super::config::EngineConfig;
use super::error::EngineError;
use super::plan::burst_pool;
use super::plan::pin;
use super::protocol::announce;
use super::protocol::CodePredictorMsg;
use super::protocol::CodePredictorReply;
use super::protocol::DecoderMsg;
use super::protocol::FrameRow;
use super::protocol::Ready;
use crate::code_predictor::CodePredictor;
use crate::ffi::{CoreLoan, Threadpool};
use crate::gguf::GgufFile;
use crate::metrics::{record, Metrics};
use crate::model::ModelFiles;
use crate::sampling::{Sampler, SamplingParams};

#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    files: ModelFiles,
    cfg: EngineConfig,
    loan: Option<Arc<CoreLoan>>,
    ready: Ready,
    rx: Receiver<CodePredictorMsg>,
    reply: Sender<CodePredictorReply>,
    dec_tx: Sender<DecoderMsg>,
    first_done: Receiver<()>,
) {
    let setup = (|| -> Result<(Threadpool, Option<Threadpool>, CodePredictor), EngineError> {
        let pool = pin(&cfg.plan.code_predictor, loan.as_ref())?;
        let burst = burst_pool(&cfg, &cfg.plan.code_predictor)?;
        let cp = cfg.load_code_predictor(&GgufFile::open(&files.mmproj)?)?;
        Ok((pool, burst, cp))
    })();
    let Some((pool, burst, mut cp)) = announce(ready, setup) else {
        return;
    };
    let n = cfg.streams();
    // Per slot: the request's metrics, and its sampler.
    let mut metrics: Vec<Metrics> = (0..n).map(|_| Metrics::default()).collect();
    let mut samplers: Vec<(Sampler, SamplingParams)> = (0..n)
        .map(|_| (Sampler::new(0), SamplingParams::GREEDY))
        .collect();
    let mut slots = Vec::with_capacity(n);
    let mut codes = Vec::with_capacity(n);
    while let Ok(msg) = rx.recv() {
        let mut rows = match msg {
            CodePredictorMsg::Collect(slot) => {
                let m = metrics
                    .get_mut(slot)
                    .map(std::mem::take)
                    .unwrap_or_default();
                if reply
                    .send(CodePredictorReply::Metrics(Box::new(m)))
                    .is_err()
                {
                    return;
                }
                continue;
            }
            CodePredictorMsg::Frames(rows) => rows,
        };
        // An utterance's first frame alone: nothing to decode yet, every core is free.
        let first = rows.len() == 1 && rows[0].reseed.is_some() && burst.is_some();
        let on = match (&burst, first) {
            (Some(b), true) => b,
            _ => &pool,
        };
        slots.clear();
        for row in &mut rows {
            if let (Some((seed, p)), Some(s)) = (row.reseed, samplers.get_mut(row.slot)) {
                *s = (Sampler::new(seed), p);
            }
            slots.push(row.slot);
        }
        let t = Instant::now();
        let result = frames(&mut cp, on, &mut rows, &slots, &mut samplers, &mut codes);
        let took = t.elapsed();
        for &s in &slots {
            if let Some(m) = metrics.get_mut(s) {
                record(&mut m.code_predictor_frame, took);
            }
        }
        if let Err(e) = result {
            if reply.send(CodePredictorReply::Failed(e, rows)).is_err() {
                return;
            }
            continue;
        }
        let t = Instant::now();
        // A borrowing talker's next step gets the decoder's cores before the decoder claims
        // them for these codes (not for a burst frame, which the talker waits for).
        let mut cores = match (&loan, first) {
            (Some(l), false) if !cfg.plan.talker.borrow.is_empty() => l.reserve(),
            _ => None,
        };
        for (&slot, &c) in slots.iter().zip(&codes) {
            // With the burst, an utterance's first frame is decoded on every core next; the
            // talker and this stage wait for it rather than compete for the cores.
            let msg = if first {
                DecoderMsg::FirstFrame(slot, c)
            } else {
                DecoderMsg::Frame(slot, c)
            };
            // A full queue means the decoder is behind: it keeps its cores rather than wait
            // for the talker's step too.
            let sent = match dec_tx.try_send(msg) {
                Ok(()) => Ok(()),
                Err(TrySendError::Full(msg)) => {
                    cores = None;
                    dec_tx.send(msg).map_err(|_| ())
                }
                Err(TrySendError::Disconnected(_)) => Err(()),
            };
            if sent.is_err() || (first && first_done.recv().is_err()) {
                return;
            }
        }
        let waited = t.elapsed();
        for &s in &slots {
            if let Some(m) = metrics.get_mut(s) {
                record(&mut m.code_predictor_send_wait, waited);
            }
        }
        if reply
            .send(CodePredictorReply::Frames { rows, cores })
            .is_err()
        {
            return;
        }
    }
}

/// One batched frame of `rows` (their slots in `slots`), each sampled by its slot's sampler;
/// each row's 16 codes go to `codes` and its embedded frame to its buffer.
fn frames(
    cp: &mut CodePredictor,
    pool: &Threadpool,
    rows: &mut [FrameRow],
    slots: &[usize],
    samplers: &mut [(Sampler, SamplingParams)],
    codes: &mut Vec<[u32; 16]>,
) -> Result<(), EngineError> {
    codes.clear();
    let inputs: Vec<(&[f32], u32)> = rows
        .iter()
        .map(|r| (r.hidden.as_slice(), r.code0))
        .collect();
    let rest = cp.frames(pool, &inputs, &mut |r, _, l| {
        let (s, p) = &mut samplers[slots[r]];
        s.sample(l, p)
    })?;
    for (row, rest) in rows.iter_mut().zip(rest) {
        let mut c = [row.code0; 16];
        c[1..].copy_from_slice(&rest);
        cp.embed_frame(&c, &mut row.embedded)?;
        codes.push(c);
    }
    Ok(())
}
