//! The same stages run one after the other on the calling thread: the reference the pipelined
//! engine's output is tested against (bit for bit) and the baseline it is benchmarked against.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::{
    decode_and_write, plan_request, EngineConfig, EngineError, ModelFiles, Request, Summary,
};
use crate::audio::{AudioSink, FRAME_SAMPLES};
use crate::code_predictor::CodePredictor;
use crate::decoder::Decoder;
use crate::ffi::Threadpool;
use crate::gguf::GgufFile;
use crate::metrics::Metrics;
use crate::synth::{generate_codes, Flow};
use crate::talker::{Session, Talker};

/// The three stages on one thread.
#[derive(Debug)]
pub struct Serial {
    talker: Talker,
    cp: CodePredictor,
    voc: Decoder,
    pool: Threadpool,
    config: EngineConfig,
    primed: super::prime::PrimeCache,
}

impl Serial {
    /// Loads the stages; ggml runs on `threads` threads (no pinning).
    pub fn load(
        files: &ModelFiles,
        config: EngineConfig,
        threads: usize,
    ) -> Result<Self, EngineError> {
        if config.exact {
            files.check_exact()?;
        }
        let mmproj = GgufFile::open(&files.mmproj)?;
        let cp = config.load_code_predictor(&mmproj)?;
        let mut voc = config.decoder.load(&mmproj, config.exact)?;
        voc.set_max_chunk(config.decoder_chunk.max(1));
        Ok(Serial {
            talker: Talker::load_with(&files.talker, config.talker)?,
            cp,
            voc,
            pool: Threadpool::new(threads.max(1), &[])?,
            config,
            primed: super::prime::PrimeCache::default(),
        })
    }

    /// Runs `req` to the end, writing to `sink`, with the engine's decoder chunking
    /// ([`EngineConfig::chunk_after`], per utterance).
    pub fn run(&mut self, req: &Request, sink: &mut dyn AudioSink) -> Result<Summary, EngineError> {
        if req.text_feed.is_some() {
            return Err(EngineError::BadFeed {
                found: "a fed request on the serial engine, which takes whole text: run it on \
                        the pipelined engine"
                    .into(),
            });
        }
        let cfg = &self.config;
        let mut session = Session::new(
            &self.talker,
            cfg.n_ctx,
            self.pool.n_threads(),
            None,
            cfg.exact,
        )?;
        let started = Instant::now();
        let never = AtomicBool::new(false);
        let utterances = plan_request(&self.talker, req, cfg.segment_tokens)?;
        let mut metrics = Metrics::default();
        let mut summary = Summary::empty();
        let chunk = cfg.decoder_chunk.max(1);
        let mut pcm = vec![0.0; chunk * FRAME_SAMPLES];
        let mut non_finite = 0;
        sink.begin()?;
        for u in utterances {
            self.primed
                .start(&mut self.voc, &self.pool, req.voice.reference.as_ref())?;
            let mut pending: Vec<[u32; 16]> = Vec::with_capacity(chunk);
            let mut decoded = 0;
            let mut failed = None;
            let (voc, pool) = (&mut self.voc, &self.pool);
            let mut flush = |pending: &mut Vec<[u32; 16]>,
                             summary: &mut Summary,
                             metrics: &mut Metrics|
             -> Result<(), EngineError> {
                let written = decode_and_write(
                    voc, pool, None, pending, &mut pcm, sink, &never, started, summary, metrics,
                );
                pending.clear();
                written
            };
            let mut report = u.report;
            let stop = generate_codes(
                &mut session,
                &mut self.cp,
                pool,
                &u.prompt,
                &u.opts,
                &u.code_predictor_sampling,
                &mut |codes| {
                    summary.frames += 1;
                    report.frames += 1;
                    if req.keep_codes {
                        summary.codes.push(*codes);
                    }
                    pending.push(*codes);
                    if pending.len() >= cfg.chunk_after(decoded) {
                        decoded += pending.len();
                        if let Err(e) = flush(&mut pending, &mut summary, &mut metrics) {
                            failed = Some(e);
                            return Flow::Stop;
                        }
                    }
                    Flow::Continue
                },
            )?;
            if let Some(e) = failed {
                return Err(e);
            }
            flush(&mut pending, &mut summary, &mut metrics)?;
            non_finite += voc.non_finite();
            report.stop = stop;
            summary.stop = stop;
            summary.segments.push(report);
        }
        summary.generated = started.elapsed();
        sink.end(&never)?;
        summary.elapsed = started.elapsed();
        summary.non_finite = non_finite;
        summary.metrics = metrics;
        Ok(summary)
    }
}
