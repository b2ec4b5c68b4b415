//! The talker's thread: takes a request, splits it into utterances, runs the talker's steps and
//! hands each frame's hidden state and code 0 to the code predictor.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::config::EngineConfig;
use super::error::EngineError;
use super::feed::TextReader;
use super::plan::burst_pool;
use super::plan::pin;
use super::protocol::CodePredictorMsg;
use super::protocol::CodePredictorReply;
use super::protocol::DecoderMsg;
use super::protocol::EndMsg;
use super::protocol::Job;
use super::protocol::Ready;
use super::protocol::StartInfo;
use super::synthesis::check_feed;
use super::synthesis::plan_fed;
use super::synthesis::plan_request;
use super::synthesis::EngineInfo;
use super::synthesis::Request;
use super::synthesis::SegmentReport;
use super::synthesis::Utterance;
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
        let mut text_starved = 0;
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
            &mut text_starved,
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
            text_starved,
        };
        if dec_tx.send(DecoderMsg::End(Box::new(end))).is_err() {
            return;
        }
    }
}

/// The channels and buffers of the talker's side of the pipeline, for one request.
struct Stages<'a> {
    cancel: &'a AtomicBool,
    progress: &'a AtomicUsize,
    cp_tx: &'a Sender<CodePredictorMsg>,
    reply_rx: &'a Receiver<CodePredictorReply>,
    dec_tx: &'a Sender<DecoderMsg>,
    bufs: &'a mut Option<(Vec<f32>, Vec<f32>)>,
    metrics: &'a mut Metrics,
}

fn gone(stage: &'static str) -> EngineError {
    EngineError::StageGone { stage }
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
    text_starved: &mut usize,
) -> Result<(), EngineError> {
    let mut st = Stages {
        cancel,
        progress,
        cp_tx,
        reply_rx,
        dec_tx,
        bufs,
        metrics,
    };
    if let Some(feed) = &req.text_feed {
        check_feed(req)?;
        let talker = session.talker();
        let mut fed = Fed {
            reader: TextReader::new(feed, talker.tokenizer(), cfg.segment_tokens),
            pushed: 0,
            ended: false,
            limit: req.frame_limit,
            starved: 0,
            rows: Vec::new(),
        };
        // The first text token, then the prompt that ends with it.
        while fed.reader.text().is_empty() {
            if cancel.load(Ordering::Acquire) {
                return Ok(());
            }
            fed.reader.poll(POLL)?;
        }
        let u = plan_fed(talker, req, &fed.reader, cfg.segment_tokens)?;
        let result = speak(session, u, req, &mut st, Some(&mut fed));
        *text_starved = fed.starved;
        segments.push(result?);
        return Ok(());
    }
    let utterances = plan_request(session.talker(), req, cfg.segment_tokens)?;
    for u in utterances {
        if cancel.load(Ordering::Acquire) {
            let mut report = u.report;
            report.stop = StopReason::Cancelled;
            segments.push(report);
            continue;
        }
        segments.push(speak(session, u, req, &mut st, None)?);
    }
    Ok(())
}

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

    /// Before a step: the row it takes must be there, unless the text has ended (then
    /// `tts_pad`, as for a whole text). Waits for it, counting the frame as starved.
    fn before_step(
        &mut self,
        session: &mut Session<'_>,
        cancel: &AtomicBool,
    ) -> Result<(), EngineError> {
        self.reader.poll(Duration::ZERO)?;
        self.give(session)?;
        let mut waited = false;
        while !self.ended && session.text_rows() < session.frames() {
            if cancel.load(Ordering::Acquire) {
                return Ok(());
            }
            waited = true;
            self.reader.poll(POLL)?;
            self.give(session)?;
        }
        self.starved += waited as usize;
        Ok(())
    }
}

/// Speaks one utterance: the prefill, then a frame at a time until it stops.
fn speak(
    session: &mut Session<'_>,
    u: Utterance,
    req: &Request,
    st: &mut Stages<'_>,
    mut fed: Option<&mut Fed<'_>>,
) -> Result<SegmentReport, EngineError> {
    let mut report = u.report;
    st.dec_tx
        .send(DecoderMsg::SegmentStart(req.voice.reference.clone()))
        .map_err(|_| gone("decoder"))?;
    let t = Instant::now();
    let mut next = session.start(&u.prompt, &u.opts);
    record(&mut st.metrics.talker_prefill, t.elapsed());
    let mut reseed = Some((code_predictor_seed(u.opts.seed), u.code_predictor_sampling));
    let stop = loop {
        let code0 = match next? {
            Next::Code(c) => c,
            Next::Stop(r) => break r,
        };
        if st.cancel.load(Ordering::Acquire) {
            break session.cancel();
        }
        let (mut hidden, embedded) = st.bufs.take().ok_or(gone("code predictor"))?;
        hidden.copy_from_slice(session.hidden());
        let t = Instant::now();
        st.cp_tx
            .send(CodePredictorMsg::Frame {
                hidden,
                embedded,
                code0,
                reseed: reseed.take(),
            })
            .map_err(|_| gone("code predictor"))?;
        let (hidden, embedded, cores) =
            match st.reply_rx.recv().map_err(|_| gone("code predictor"))? {
                CodePredictorReply::Frame {
                    hidden,
                    embedded,
                    cores,
                } => (hidden, embedded, cores),
                CodePredictorReply::Failed(e, hidden, embedded) => {
                    *st.bufs = Some((hidden, embedded));
                    return Err(e);
                }
                CodePredictorReply::Metrics(_) => return Err(gone("code predictor")),
            };
        record(&mut st.metrics.talker_wait, t.elapsed());
        report.frames += 1;
        st.progress.fetch_add(1, Ordering::AcqRel);
        if let Some(f) = fed.as_deref_mut() {
            let waited = f.before_step(session, st.cancel);
            if let Err(e) = waited {
                *st.bufs = Some((hidden, embedded));
                return Err(e);
            }
            if st.cancel.load(Ordering::Acquire) {
                *st.bufs = Some((hidden, embedded));
                break session.cancel();
            }
        }
        // llama.cpp's talker computes on its own pools: the reservation would only hold the
        // decoder back.
        let cores = cores.filter(|_| session.talker().runtime() != TalkerRuntime::LlamaCpp);
        let t = Instant::now();
        next = session.feed(&embedded);
        drop(cores);
        record(&mut st.metrics.talker_step, t.elapsed());
        *st.bufs = Some((hidden, embedded));
    };
    report.stop = stop;
    if let Some(f) = fed {
        report.tokens = f.reader.text().len();
    }
    st.dec_tx
        .send(DecoderMsg::SegmentEnd)
        .map_err(|_| gone("decoder"))?;
    Ok(report)
}
