//! The talker's thread: takes a request, splits it into utterances, runs the talker's steps and
//! hands each frame's hidden state and code 0 to the code predictor.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};

use super::config::EngineConfig;
use super::error::EngineError;
use super::plan::burst_pool;
use super::plan::pin;
use super::protocol::CodePredictorMsg;
use super::protocol::CodePredictorReply;
use super::protocol::DecoderMsg;
use super::protocol::EndMsg;
use super::protocol::Job;
use super::protocol::Ready;
use super::protocol::StartInfo;
use super::synthesis::plan_request;
use super::synthesis::EngineInfo;
use super::synthesis::Request;
use super::synthesis::SegmentReport;
use crate::ffi::{CoreLoan, Threadpool};
use crate::metrics::{record, Metrics};
use crate::model::ModelFiles;
use crate::synth::code_predictor_seed;
use crate::talker::Runtime as TalkerRuntime;
use crate::talker::{Next, Session, StopReason, Talker};

#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    files: ModelFiles,
    cfg: EngineConfig,
    loan: Option<Arc<CoreLoan>>,
    ready: Ready,
    jobs: Receiver<Box<Job>>,
    cp_tx: Sender<CodePredictorMsg>,
    reply_rx: Receiver<CodePredictorReply>,
    dec_tx: Sender<DecoderMsg>,
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
    let mut session = match Session::new(
        &talker,
        cfg.n_ctx,
        cfg.plan.talker.threads,
        Some((&pool, burst.as_ref())),
        cfg.exact,
    ) {
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
    let h = talker.n_embd();
    let mut bufs = Some((vec![0.0f32; h], vec![0.0f32; h]));
    while let Ok(job) = jobs.recv() {
        let Job {
            req,
            cancel,
            progress,
            sink,
            done,
            started,
        } = *job;
        let keep_codes = req.keep_codes;
        if dec_tx
            .send(DecoderMsg::Begin {
                sink,
                cancel: cancel.clone(),
                started,
                keep_codes,
                done,
            })
            .is_err()
        {
            return;
        }
        let mut metrics = Metrics::default();
        let mut segments = Vec::new();
        let result = run_job(
            &mut session,
            &req,
            &cfg,
            &cancel,
            &progress,
            &cp_tx,
            &reply_rx,
            &dec_tx,
            &mut bufs,
            &mut metrics,
            &mut segments,
        );
        // Collect the code predictor's metrics of this request.
        if cp_tx.send(CodePredictorMsg::Collect).is_ok() {
            if let Ok(CodePredictorReply::Metrics(m)) = reply_rx.recv() {
                metrics.merge(&m);
            }
        }
        let end = EndMsg {
            result,
            segments,
            metrics,
        };
        if dec_tx.send(DecoderMsg::End(Box::new(end))).is_err() {
            return;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_job(
    session: &mut Session<'_>,
    req: &Request,
    cfg: &EngineConfig,
    cancel: &AtomicBool,
    progress: &AtomicUsize,
    cp_tx: &Sender<CodePredictorMsg>,
    reply_rx: &Receiver<CodePredictorReply>,
    dec_tx: &Sender<DecoderMsg>,
    bufs: &mut Option<(Vec<f32>, Vec<f32>)>,
    metrics: &mut Metrics,
    segments: &mut Vec<SegmentReport>,
) -> Result<(), EngineError> {
    let gone = |stage| EngineError::StageGone { stage };
    let utterances = plan_request(session.talker(), req, cfg.segment_tokens)?;
    for u in utterances {
        let mut report = u.report;
        if cancel.load(Ordering::Acquire) {
            report.stop = StopReason::Cancelled;
            segments.push(report);
            continue;
        }
        dec_tx
            .send(DecoderMsg::SegmentStart(req.voice.reference.clone()))
            .map_err(|_| gone("decoder"))?;
        let t = Instant::now();
        let mut next = session.start(&u.prompt, &u.opts);
        record(&mut metrics.talker_prefill, t.elapsed());
        let mut reseed = Some((code_predictor_seed(u.opts.seed), u.code_predictor_sampling));
        let stop = loop {
            let code0 = match next? {
                Next::Code(c) => c,
                Next::Stop(r) => break r,
            };
            if cancel.load(Ordering::Acquire) {
                break session.cancel();
            }
            let (mut hidden, embedded) = bufs.take().ok_or(gone("code predictor"))?;
            hidden.copy_from_slice(session.hidden());
            let t = Instant::now();
            cp_tx
                .send(CodePredictorMsg::Frame {
                    hidden,
                    embedded,
                    code0,
                    reseed: reseed.take(),
                })
                .map_err(|_| gone("code predictor"))?;
            let (hidden, embedded, cores) =
                match reply_rx.recv().map_err(|_| gone("code predictor"))? {
                    CodePredictorReply::Frame {
                        hidden,
                        embedded,
                        cores,
                    } => (hidden, embedded, cores),
                    CodePredictorReply::Failed(e, hidden, embedded) => {
                        *bufs = Some((hidden, embedded));
                        return Err(e);
                    }
                    CodePredictorReply::Metrics(_) => return Err(gone("code predictor")),
                };
            record(&mut metrics.talker_wait, t.elapsed());
            report.frames += 1;
            progress.fetch_add(1, Ordering::AcqRel);
            // llama.cpp's talker computes on its own pools: the reservation would only hold the
            // decoder back.
            let cores = cores.filter(|_| session.talker().runtime() != TalkerRuntime::LlamaCpp);
            let t = Instant::now();
            next = session.feed(&embedded);
            drop(cores);
            record(&mut metrics.talker_step, t.elapsed());
            *bufs = Some((hidden, embedded));
        };
        report.stop = stop;
        segments.push(report);
        dec_tx
            .send(DecoderMsg::SegmentEnd)
            .map_err(|_| gone("decoder"))?;
    }
    Ok(())
}
