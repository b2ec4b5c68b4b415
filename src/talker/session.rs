//! One utterance at a time over a [`Talker`](super::Talker): the KV cache, the prompt's prefill,
//! the logits processors and the sampler, step by step.

use super::graph;
use super::GenOptions;
use super::Layers;
use super::Next;
use super::Prompt;
use super::StopReason;
use super::Talker;
use super::TalkerError;
use super::CODEC_VOCAB;
use super::MIN_FRAMES;
use super::N_CODES;
use crate::ffi::{EmbdBatch, GgmlError, LlamaContext, Threadpool};
use crate::sampling::Sampler;

/// The KV cache of one utterance at a time over a [`Talker`], the logits processors and the
/// codebook-0 sampler.
#[derive(Debug)]
pub struct Session<'t> {
    talker: &'t Talker,
    backend: Backend<'t>,
    n_ctx: usize,
    sampler: Sampler,
    options: Option<GenOptions>,
    /// Codebook-0 codes generated in this utterance (the repetition penalty's history).
    seen: Vec<bool>,
    logits: Vec<f32>,
    hidden: Vec<f32>,
    input: Vec<f32>,
    trailing: Vec<f32>,
    pos: usize,
    frames: usize,
    cap: usize,
    /// Whether the KV cache is f32 (the exact path, which always prefills the whole prompt).
    exact: bool,
    /// The step pool and the prefill pool, when given.
    pools: Option<(&'t Threadpool, &'t Threadpool)>,
    /// The rows of the prompt whose keys and values are at positions `0..` of the KV cache: the
    /// next prompt's rows equal to these are not computed again (prompts of one voice differ only
    /// in their last rows). Empty when the cache holds nothing reusable.
    cached: Vec<f32>,
    /// Prompt rows reused by the last [`Session::start`].
    reused: usize,
    /// Rows of the running utterance's prompt.
    prompt_len: usize,
}

impl<'t> Session<'t> {
    /// A session of `n_ctx` positions (prompt plus frames) with `n_threads` threads (llama.cpp's,
    /// or a ggml pool of the session's own for [`Runtime::Graph`](super::Runtime::Graph)), or `pool`'s threads when given
    /// (`pool.1`, when given, runs the prefill: a wider pool for the moment the other stages are
    /// idle). `exact` keeps the KV cache in f32 (with llama.cpp, flash attention off too; matches
    /// the f32 reference to 1e-5; 229 KB per position for 0.6B); otherwise llama.cpp keeps it in
    /// q8_0 and the own graph in f16.
    pub fn new(
        talker: &'t Talker,
        n_ctx: usize,
        n_threads: usize,
        pool: Option<(&'t Threadpool, Option<&'t Threadpool>)>,
        exact: bool,
    ) -> Result<Self, TalkerError> {
        let pools = pool.map(|(pool, batch)| (pool, batch.unwrap_or(pool)));
        let h = talker.n_embd;
        let backend = match &talker.layers {
            Layers::Llama(model) => {
                let mut ctx = LlamaContext::with_kv(model, n_ctx as u32, n_threads, exact)?;
                if let Some((pool, batch)) = pools {
                    ctx.attach_threadpools(pool, batch);
                }
                Backend::Llama {
                    ctx,
                    batch: EmbdBatch::new(64, h),
                }
            }
            Layers::Graph(layers) => Backend::Graph {
                state: graph::State::new(layers, n_ctx, exact)?,
                own_pool: match pools {
                    Some(_) => None,
                    None => Some(Threadpool::new(n_threads.max(1), &[])?),
                },
            },
        };
        Ok(Session {
            talker,
            backend,
            n_ctx,
            sampler: Sampler::new(0),
            options: None,
            seen: vec![false; CODEC_VOCAB],
            logits: vec![0.0; CODEC_VOCAB],
            hidden: vec![0.0; h],
            input: vec![0.0; h],
            trailing: Vec::new(),
            pos: 0,
            frames: 0,
            cap: 0,
            exact,
            pools,
            cached: Vec::new(),
            reused: 0,
            prompt_len: 0,
        })
    }

    /// Prompt rows the last [`Session::start`] took from the previous prompt's KV cache instead
    /// of computing them (0 in `exact` mode, for a new voice, or after an error).
    pub fn reused_rows(&self) -> usize {
        self.reused
    }

    /// The talker this session runs.
    pub fn talker(&self) -> &'t Talker {
        self.talker
    }

    /// The final-normed hidden state of the last position (the code predictor's input).
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }

    /// The raw codec logits of the last position, before any processor (3072 values).
    pub fn raw_logits(&self) -> Option<&[f32]> {
        match &self.backend {
            Backend::Llama { ctx, .. } => codec_logits(ctx),
            Backend::Graph { state, .. } => Some(state.logits()),
        }
    }

    /// The row fed at the last step (tests compare it with the reference's step inputs).
    pub fn last_input(&self) -> &[f32] {
        &self.input
    }

    /// Frames started in this utterance.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// This utterance's frame cap.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Starts an utterance: runs the prefill and picks the first code. Outside `exact` mode, the
    /// leading rows equal to the previous prompt's keep their keys and values from then (the
    /// cache is causal, so they are the same) and only the rest is computed; at least the last
    /// row always is. `exact` mode clears the cache and computes every row, as the reference does.
    pub fn start(&mut self, prompt: &Prompt, opts: &GenOptions) -> Result<Next, TalkerError> {
        let h = self.talker.n_embd;
        if prompt.n_embd != h || prompt.is_empty() || !prompt.trailing.len().is_multiple_of(h) {
            return Err(TalkerError::BadText {
                expected: format!("prompt rows of width {h}"),
                found: format!("{} values of width {}", prompt.rows.len(), prompt.n_embd),
            });
        }
        let n = prompt.len();
        if n + 1 > self.n_ctx {
            return Err(TalkerError::TooLong {
                prompt: n,
                n_ctx: self.n_ctx,
            });
        }
        let same = if self.exact {
            0
        } else {
            prompt
                .rows
                .chunks_exact(h)
                .zip(self.cached.chunks_exact(h))
                .take_while(|(a, b)| {
                    a.iter()
                        .zip(b.iter())
                        .all(|(x, y)| x.to_bits() == y.to_bits())
                })
                .count()
                .min(n - 1)
        };
        // Until this prefill succeeds the cache holds nothing reusable.
        self.cached.clear();
        self.reused = match &mut self.backend {
            Backend::Llama { ctx, .. } => {
                if same > 0 && ctx.truncate(same) {
                    same
                } else {
                    ctx.clear();
                    0
                }
            }
            // Positions past the kept rows are overwritten before they are read.
            Backend::Graph { .. } => same,
        };
        self.options = Some(*opts);
        self.sampler = Sampler::new(opts.seed);
        self.seen.iter_mut().for_each(|s| *s = false);
        self.trailing.clear();
        self.trailing.extend_from_slice(&prompt.trailing);
        let want = opts
            .max_frames
            .unwrap_or_else(|| self.talker.frame_cap(prompt.text_tokens));
        self.prompt_len = n;
        self.cap = self.within_context(want);
        self.frames = 0;
        if self.cap == 0 {
            self.options = None;
            return Ok(Next::Stop(StopReason::FrameCap { frames: 0 }));
        }
        match &mut self.backend {
            Backend::Llama { ctx, batch } => {
                if batch.capacity() < n {
                    *batch = EmbdBatch::new(n, h);
                }
                batch.clear();
                for (i, row) in prompt.rows.chunks_exact(h).enumerate().skip(self.reused) {
                    batch.push(row, i as i32, i + 1 == n)?;
                }
                // The whole prefill on the prefill pool, even a single remaining row (which
                // llama.cpp would otherwise give the step pool).
                if let Some((pool, prefill)) = self.pools {
                    ctx.attach_threadpools(prefill, prefill);
                    let r = ctx.decode(batch);
                    ctx.attach_threadpools(pool, prefill);
                    r?;
                } else {
                    ctx.decode(batch)?;
                }
            }
            Backend::Graph { state, own_pool } => {
                let pool = graph_pool(self.pools.map(|p| p.1), own_pool)?;
                state.prefill(&prompt.rows[self.reused * h..], self.reused, pool)?;
            }
        }
        if !self.exact {
            self.cached.extend_from_slice(&prompt.rows);
        }
        self.pos = n;
        self.next()
    }

    /// Feeds the frame just produced (`embedded`: [`CodePredictor::embed_frame`] of its 16 codes)
    /// plus the next text row, and picks the next code.
    ///
    /// [`CodePredictor::embed_frame`]: crate::code_predictor::CodePredictor::embed_frame
    pub fn feed(&mut self, embedded: &[f32]) -> Result<Next, TalkerError> {
        if let Some(stop) = self.prepare(embedded)? {
            return Ok(stop);
        }
        self.step_prepared()
    }

    /// The step of [`Session::feed`] once [`Session::prepare`] has written its row.
    fn step_prepared(&mut self) -> Result<Next, TalkerError> {
        match &mut self.backend {
            Backend::Llama { ctx, batch } => {
                batch.clear();
                batch.push(&self.input, self.pos as i32, true)?;
                ctx.decode(batch)?;
            }
            Backend::Graph { state, own_pool } => {
                let pool = graph_pool(self.pools.map(|p| p.0), own_pool)?;
                state.run(&self.input, self.pos, pool)?;
            }
        }
        self.pos += 1;
        self.next()
    }

    /// Feeds each session its frame (`embedded[i]` to `sessions[i]`) as [`Session::feed`]
    /// does, in one step for all (`batch`'s graph, on the first session's step pool) where
    /// their caches allow it ([`Session::batches`]), else one after the other. Each session's
    /// result is the one [`Session::feed`] gives it alone, to the bit.
    pub fn feed_together(
        sessions: &mut [&mut Session<'t>],
        embedded: &[&[f32]],
        batch: &mut graph::Batch,
    ) -> Vec<Result<Next, TalkerError>> {
        let mut out: Vec<Option<Result<Next, TalkerError>>> = Vec::new();
        out.resize_with(sessions.len(), || None);
        if sessions.len() != embedded.len() {
            let e = || {
                Err(TalkerError::BadText {
                    expected: format!("{} embedded frames", sessions.len()),
                    found: embedded.len().to_string(),
                })
            };
            return sessions.iter().map(|_| e()).collect();
        }
        // The sessions whose step runs: prepared, and not stopped by their cap.
        let mut run = Vec::new();
        for (i, (s, e)) in sessions.iter_mut().zip(embedded).enumerate() {
            match s.prepare(e) {
                Ok(None) => run.push(i),
                Ok(Some(stop)) => out[i] = Some(Ok(stop)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let together = run.len() > 1 && run.iter().all(|&i| sessions[i].batches());
        if together {
            let h = sessions[run[0]].talker.n_embd;
            let mut rows = Vec::with_capacity(run.len() * h);
            let mut pos = Vec::with_capacity(run.len());
            for &i in &run {
                rows.extend_from_slice(&sessions[i].input);
                pos.push(sessions[i].pos);
            }
            let pool = sessions[run[0]].pools.map(|p| p.0);
            let mut states: Vec<&mut graph::State<'t>> = Vec::with_capacity(run.len());
            let mut own = None;
            for (i, s) in sessions.iter_mut().enumerate() {
                if let (true, Backend::Graph { state, own_pool }) =
                    (run.contains(&i), &mut s.backend)
                {
                    own = own.or(own_pool.as_ref());
                    states.push(state);
                }
            }
            let result = match pool.or(own) {
                Some(pool) => batch.run(&mut states, &rows, &pos, pool),
                None => Err(GgmlError::Threadpool {
                    n_threads: 0,
                    cores: Vec::new(),
                }),
            };
            drop(states);
            for &i in &run {
                out[i] = Some(match &result {
                    Ok(()) => {
                        sessions[i].pos += 1;
                        sessions[i].next()
                    }
                    Err(e) => Err(TalkerError::Ggml(e.clone())),
                });
            }
        } else {
            for &i in &run {
                out[i] = Some(sessions[i].step_prepared());
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(TalkerError::NotRunning)))
            .collect()
    }

    /// Whether this session's steps can run in one [`graph::Batch`] with others' (the crate's own
    /// graph with q8_0 caches under the crate's kernels).
    pub fn batches(&self) -> bool {
        match (&self.backend, &self.talker.layers) {
            (Backend::Graph { state, .. }, Layers::Graph(layers)) => layers.batches(state),
            _ => false,
        }
    }

    /// The checks and input of [`Session::feed`]: `Some(stop)` when the utterance has reached
    /// its cap, else the step's row is in `self.input`.
    fn prepare(&mut self, embedded: &[f32]) -> Result<Option<Next>, TalkerError> {
        let h = self.talker.n_embd;
        if self.options.is_none() {
            return Err(TalkerError::NotRunning);
        }
        if embedded.len() != h {
            return Err(TalkerError::Ggml(GgmlError::Shape {
                what: "embedded frame",
                expected: h.to_string(),
                found: embedded.len().to_string(),
            }));
        }
        if self.frames >= self.cap {
            self.options = None;
            return Ok(Some(Next::Stop(StopReason::FrameCap { frames: self.cap })));
        }
        let step = self.frames - 1;
        let text = self
            .trailing
            .get(step * h..(step + 1) * h)
            .unwrap_or(&self.talker.tts_pad);
        for ((o, e), t) in self.input.iter_mut().zip(embedded).zip(text) {
            *o = e + t;
        }
        Ok(None)
    }

    /// Appends text rows ([`Talker::text_rows`]) to the running utterance's trailing text: the
    /// rows a fed text's later tokens give, one a frame (steps past the rows take `tts_pad`).
    pub fn push_text(&mut self, rows: &[f32]) {
        self.trailing.extend_from_slice(rows);
    }

    /// Trailing text rows the running utterance has (taken or not).
    pub fn text_rows(&self) -> usize {
        self.trailing.len() / self.talker.n_embd
    }

    /// Sets the running utterance's frame cap from its text tokens and the request's `limit`, as
    /// [`Session::start`] and the engine's plan do from a whole prompt's (a fed text's count
    /// grows; its cap with it). A cap the options give stays.
    pub fn set_text_tokens(&mut self, tokens: usize, limit: Option<usize>) {
        if let Some(opts) = &self.options {
            if opts.max_frames.is_none() {
                let want = self
                    .talker
                    .frame_cap(tokens)
                    .min(limit.unwrap_or(usize::MAX));
                self.cap = self.within_context(want);
            }
        }
    }

    /// `frames` as far as the context holds after the running utterance's prompt: frame f > 0
    /// is fed at position `prompt_len + f - 1`; the last needs no step after it.
    fn within_context(&self, frames: usize) -> usize {
        frames.min(self.n_ctx - self.prompt_len + 1)
    }

    /// Ends the running utterance early (its cache stays until the next start); returns the
    /// stop reason to report, [`StopReason::Cancelled`].
    pub fn cancel(&mut self) -> StopReason {
        self.options = None;
        StopReason::Cancelled
    }

    /// Reads the last position's outputs, applies the processors and picks a code.
    fn next(&mut self) -> Result<Next, TalkerError> {
        let Some(opts) = self.options else {
            return Err(TalkerError::NotRunning);
        };
        let missing = || {
            TalkerError::Ggml(GgmlError::Shape {
                what: "talker output",
                expected: "the last row's embeddings and logits".into(),
                found: "none".into(),
            })
        };
        let (hidden, raw) = match &self.backend {
            Backend::Llama { ctx, .. } => (
                ctx.embeddings(-1).ok_or_else(missing)?,
                codec_logits(ctx).ok_or_else(missing)?,
            ),
            Backend::Graph { state, .. } => (state.hidden(), state.logits()),
        };
        self.hidden.copy_from_slice(hidden);
        self.logits.copy_from_slice(raw);
        let eos = self.talker.config.talker_config.codec_eos_token_id as usize;
        process_logits(
            &mut self.logits,
            &self.seen,
            opts.repetition_penalty,
            eos,
            self.frames < opts.min_frames.max(MIN_FRAMES),
        );
        let code = self.sampler.sample(&self.logits, &opts.sampling);
        if code as usize == eos {
            self.options = None;
            return Ok(Next::Stop(StopReason::Eos));
        }
        self.seen[code as usize] = true;
        self.frames += 1;
        Ok(Next::Code(code))
    }
}

/// A session's KV cache and what computes it.
#[derive(Debug)]
enum Backend<'t> {
    Llama {
        ctx: LlamaContext<'t>,
        batch: EmbdBatch,
    },
    Graph {
        state: graph::State<'t>,
        /// The pool when the session was given none.
        own_pool: Option<Threadpool>,
    },
}

/// The given pool, else the session's own.
pub(super) fn graph_pool<'a>(
    given: Option<&'a Threadpool>,
    own: &'a Option<Threadpool>,
) -> Result<&'a Threadpool, GgmlError> {
    given.or(own.as_ref()).ok_or(GgmlError::Threadpool {
        n_threads: 0,
        cores: Vec::new(),
    })
}

/// The codec logits (the last 3072 of the vocabulary) of the context's last output row.
pub(super) fn codec_logits<'c>(ctx: &'c LlamaContext<'_>) -> Option<&'c [f32]> {
    let l = ctx.logits(-1)?;
    l.get(l.len().checked_sub(CODEC_VOCAB)?..)
}

/// The talker's logits processors, in the reference's order (HF `generate`): the repetition
/// penalty over the codes in `seen` (`x / p` if positive, else `x * p`), the suppression of every
/// id from 2048 up but `eos`, and, while `mask_eos` (the first [`MIN_FRAMES`] frames), `eos` too.
pub fn process_logits(logits: &mut [f32], seen: &[bool], penalty: f32, eos: usize, mask_eos: bool) {
    if penalty != 1.0 {
        for (x, _) in logits.iter_mut().zip(seen).filter(|(_, &s)| s) {
            *x = if *x < 0.0 { *x * penalty } else { *x / penalty };
        }
    }
    for (i, x) in logits.iter_mut().enumerate().skip(N_CODES) {
        if i != eos {
            *x = f32::NEG_INFINITY;
        }
    }
    if mask_eos {
        if let Some(x) = logits.get_mut(eos) {
            *x = f32::NEG_INFINITY;
        }
    }
}
