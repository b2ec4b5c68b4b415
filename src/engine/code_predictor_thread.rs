//! The code predictor's thread: codebooks 1..15 of each frame, handed back to the talker and on to
//! the decoder.

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
    let mut metrics = Metrics::default();
    let mut sampler = Sampler::new(0);
    let mut params = SamplingParams::GREEDY;
    while let Ok(msg) = rx.recv() {
        match msg {
            CodePredictorMsg::Collect => {
                let m = std::mem::take(&mut metrics);
                if reply
                    .send(CodePredictorReply::Metrics(Box::new(m)))
                    .is_err()
                {
                    return;
                }
            }
            CodePredictorMsg::Frame {
                hidden,
                mut embedded,
                code0,
                reseed,
            } => {
                // An utterance's first frame: nothing to decode yet, every core is free.
                let on = match (&reseed, &burst) {
                    (Some(_), Some(b)) => b,
                    _ => &pool,
                };
                if let Some((seed, p)) = reseed {
                    sampler = Sampler::new(seed);
                    params = p;
                }
                let t = Instant::now();
                let result = cp
                    .frame(
                        on,
                        &hidden,
                        code0,
                        &mut |_, l| sampler.sample(l, &params),
                        None,
                    )
                    .and_then(|rest| {
                        let mut codes = [code0; 16];
                        codes[1..].copy_from_slice(&rest);
                        cp.embed_frame(&codes, &mut embedded)?;
                        Ok(codes)
                    });
                record(&mut metrics.code_predictor_frame, t.elapsed());
                let codes = match result {
                    Ok(c) => c,
                    Err(e) => {
                        if reply
                            .send(CodePredictorReply::Failed(e.into(), hidden, embedded))
                            .is_err()
                        {
                            return;
                        }
                        continue;
                    }
                };
                let t = Instant::now();
                // With the burst, an utterance's first frame is decoded on every core next; the
                // talker and this stage wait for it rather than compete for the cores.
                let first = reseed.is_some() && burst.is_some();
                // A borrowing talker's next step gets the decoder's cores before the decoder
                // claims them for these codes (not for a burst frame, which the talker waits for).
                let mut cores = match (&loan, first) {
                    (Some(l), false) if !cfg.plan.talker.borrow.is_empty() => l.reserve(),
                    _ => None,
                };
                let msg = if first {
                    DecoderMsg::FirstFrame(codes)
                } else {
                    DecoderMsg::Frame(codes)
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
                record(&mut metrics.code_predictor_send_wait, t.elapsed());
                let frame = CodePredictorReply::Frame {
                    hidden,
                    embedded,
                    cores,
                };
                if reply.send(frame).is_err() {
                    return;
                }
            }
        }
    }
}
