//! The pipelined engine: the talker, the code predictor and the decoder on three pinned threads,
//! joined by bounded channels, writing to an [`AudioSink`].
//!
//! ```text
//!  caller ──Job (cap 1)──▶ qtts-talker ──hidden, code0 (cap 1)──▶ qtts-cp
//!                              ▲  ◀──────embedded frame (cap 1)───────┘ │
//!                              │                                        │ codes (cap `codes_queue`,
//!                              └──Begin / SegmentEnd / End──▶ qtts-decoder ◀┘  4 frames = 320 ms)
//!                                                                │
//!                                                     AudioSink::write (ring: `ring_ms`)
//! ```
//!
//! The talker needs frame N's codes before it can start frame N+1, so the talker and the code
//! predictor alternate; the decoder overlaps them: frame N decodes while frame N+1 is predicted.
//!
//! Contract:
//! - [`Engine::load`] starts the three threads, each of which loads its stage, creates one
//!   persistent ggml threadpool pinned over its [`StagePlan`]'s cores, and pins itself where ggml
//!   puts the calling thread. Load errors come back from `load`; nothing runs until then.
//! - One request at a time: [`Engine::synthesize`] takes `&mut self` and returns a [`Synthesis`],
//!   whose [`Synthesis::wait`] gives the [`Summary`] and the sink back. [`Canceller::cancel`]
//!   (from any thread) stops the request between frames: playback is flushed, every stage goes
//!   idle, and the engine serves the next request.
//! - Backpressure, not buffering: every channel is bounded; a sink that does not take audio stops
//!   the decoder, which stops the code predictor, which stops the talker.
//! - Determinism: the codes of a request depend only on the request (seed included), never on
//!   thread timing; the decoder's chunking is fixed (1 frame, then `decoder_chunk` at a time), so
//!   the samples are too. [`serial::Serial`] computes the same samples on one thread.
//! - First frame: with [`EngineConfig::burst`], an utterance's first frame runs stage after stage
//!   on every core (prefill, code predictor, then decoder); the code predictor waits for the
//!   decoder's acknowledgement (the first-frame channel, capacity 1) before the talker may go on.
//! - Dropping the engine stops and joins its threads.

pub mod serial;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use crate::audio::{AudioError, AudioSink, FRAME_SAMPLES};
use crate::code_predictor::CodePredictor;
pub use crate::code_predictor::LayerKernel;
use crate::decoder::{Decoder, DecoderError};
use crate::error::ModelError;
use crate::ffi::{CoreLoan, GgmlError, Reservation, Threadpool};
use crate::gguf::{GgmlType, GgufFile};
use crate::metrics::{record, Metrics};
use crate::sampling::{Sampler, SamplingParams};
use crate::synth::code_predictor_seed;
pub use crate::talker::Runtime as TalkerRuntime;
use crate::talker::{
    GenOptions, Next, Prompt, Session, StopReason, Talker, TalkerError, TextInput, TextMode, Voice,
};
use crate::text::split::{normalize, split, Cut};

/// The two GGUF files of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// The talker (`general.architecture = qwen3tts`).
    pub talker: PathBuf,
    /// The code predictor and decoder (`mmproj`).
    pub mmproj: PathBuf,
}

impl ModelFiles {
    /// Refuses files that cannot give the exact path (`EngineConfig::exact`): every tensor of both
    /// files must be f32, as `qtts convert --type f32` writes them; quantized or f16 weights
    /// cannot reproduce the reference within its tolerance.
    pub fn check_exact(&self) -> Result<(), ModelError> {
        for path in [&self.talker, &self.mmproj] {
            let f = GgufFile::open(path)?;
            if let Some(t) = f.header.tensors.iter().find(|t| t.ty != GgmlType::F32) {
                return Err(ModelError::Unsupported {
                    what: format!("exact synthesis with {}", path.display()),
                    expected: "f32 weights in every tensor (`qtts convert --type f32`, or a \
                               checkpoint directory, converted to f32 once)"
                        .into(),
                    found: format!("{} stored as {:?}", t.name, t.ty),
                });
            }
        }
        Ok(())
    }
}

/// Where one stage runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    /// Cores: the stage's ggml threadpool is pinned to them, one thread per core, the stage's own
    /// thread on the last one used (ggml's placement); empty: no pinning.
    pub cores: Vec<usize>,
    /// ggml threads (the stage's own thread counts as one).
    pub threads: usize,
    /// The nice value of the stage's threads: 0 leaves them as the process's; up to 19 lowers
    /// their share of a core they time-share with another stage; 20 puts them under Linux's
    /// `SCHED_IDLE` (they run only when nothing else on the core can). Raising priority (below
    /// 0) needs privileges: a refusal leaves the threads as they were.
    pub nice: i32,
    /// Cores of the decoder this stage borrows: each of its graphs runs one more ggml thread on
    /// each of them while the decoder is not decoding, and none while it is (the decoder claims
    /// them back for a whole frame, waiting at most for the graph in progress or reserved; see
    /// [`crate::ffi::CoreLoan`]). ggml puts a pool's calling thread on its highest core, so every
    /// borrowed core must be lower than the stage's own (checked at [`Engine::load`]).
    pub borrow: Vec<usize>,
}

/// Which stage runs on which cores with how many threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadPlan {
    /// The talker.
    pub talker: StagePlan,
    /// The code predictor.
    pub code_predictor: StagePlan,
    /// The decoder.
    pub decoder: StagePlan,
}

impl ThreadPlan {
    /// The split plan for `n` cores (the default before [`ThreadPlan::lending`], which keeps it on
    /// every core count but 2). The talker and the code predictor alternate, so they share the
    /// same cores without competing; the decoder gets the others. Never more ggml threads than
    /// cores in a stage's set: ggml threads plus another busy thread on the same core collapse
    /// throughput (10x, `../shared/origin`).
    /// - 1 core: everything on core 0, 1 thread each.
    /// - 2 cores: talker and CP on core 0, decoder on core 1, 1 thread each.
    /// - n ≥ 3: talker and CP on the first ⌈n/2⌉ cores, the decoder on the rest.
    pub fn for_cores(n: usize) -> Self {
        let one = |c: usize| StagePlan {
            cores: vec![c],
            threads: 1,
            nice: 0,
            borrow: Vec::new(),
        };
        match n {
            0 | 1 => ThreadPlan {
                talker: one(0),
                code_predictor: one(0),
                decoder: one(0),
            },
            2 => ThreadPlan {
                talker: one(0),
                code_predictor: one(0),
                decoder: one(1),
            },
            n => {
                let a = n.div_ceil(2);
                let first = StagePlan {
                    cores: (0..a).collect(),
                    threads: a,
                    nice: 0,
                    borrow: Vec::new(),
                };
                ThreadPlan {
                    talker: first.clone(),
                    code_predictor: first,
                    decoder: StagePlan {
                        cores: (a..n).collect(),
                        threads: n - a,
                        nice: 0,
                        borrow: Vec::new(),
                    },
                }
            }
        }
    }

    /// [`ThreadPlan::for_cores`] with the code predictor's ggml threads over every core and the
    /// decoder's thread under `SCHED_IDLE` ([`StagePlan::nice`] 20), so that the decoder runs in
    /// the talker's turns and yields its core the moment the code predictor's second thread
    /// wakes. Faster where the machine runs nothing else (RTF 1.69 against 2.13 on 2 cores,
    /// PERFORMANCE.md), but any other busy program starves the decoder, the stage that feeds the
    /// speaker: not the default. The same as `for_cores` on one core.
    pub fn code_predictor_on_every_core(n: usize) -> Self {
        let mut plan = Self::for_cores(n);
        if n >= 2 {
            plan.code_predictor = StagePlan {
                cores: (0..n).collect(),
                threads: n,
                nice: 0,
                borrow: Vec::new(),
            };
            plan.decoder.nice = 20;
        }
        plan
    }

    /// On 2 cores: the decoder on core 0, the talker and the code predictor on core 1, and both
    /// borrow core 0 for their graphs whenever the decoder is not decoding
    /// ([`StagePlan::borrow`]). The code predictor reserves it for the talker's next step before
    /// it hands the decoder a frame, so the decoder decodes beside the code predictor's first
    /// sub-steps rather than beside the talker's step. Nobody's priority changes and no two
    /// threads of ours share a core: the decoder gets its core back within one graph. Otherwise
    /// the same as [`ThreadPlan::for_cores`].
    pub fn lending(n: usize) -> Self {
        if n != 2 {
            return Self::for_cores(n);
        }
        let mut plan = Self::for_cores(2);
        plan.talker.cores = vec![1];
        plan.code_predictor.cores = vec![1];
        plan.code_predictor.borrow = vec![0];
        plan.talker.borrow = vec![0];
        plan.decoder.cores = vec![0];
        plan
    }

    /// Checks that what a stage borrows is the decoder's, not its own, and below its own cores
    /// (see [`StagePlan::borrow`]).
    fn check_loans(&self) -> Result<(), EngineError> {
        for (stage, p) in [
            ("talker", &self.talker),
            ("code predictor", &self.code_predictor),
        ] {
            if p.borrow.is_empty() {
                continue;
            }
            let own_min = p.cores.iter().copied().min();
            let ok = p
                .borrow
                .iter()
                .all(|c| self.decoder.cores.contains(c) && own_min.is_some_and(|m| *c < m));
            if !ok {
                return Err(EngineError::Plan {
                    expected: format!(
                        "the {stage} borrowing decoder cores (of {:?}) below its own",
                        self.decoder.cores
                    ),
                    found: format!("borrow {:?}, own cores {:?}", p.borrow, p.cores),
                });
            }
        }
        Ok(())
    }

    /// Every core of the plan, sorted.
    pub fn all_cores(&self) -> Vec<usize> {
        let mut all: Vec<usize> = [&self.talker, &self.code_predictor, &self.decoder]
            .iter()
            .flat_map(|p| p.cores.iter().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The default plan for `n` cores: [`ThreadPlan::lending`] (1.2-1.3x faster than the split
    /// plan on 2 cores, PERFORMANCE.md).
    pub fn default_for(n: usize) -> Self {
        Self::lending(n)
    }

    /// [`ThreadPlan::default_for`] the cores this process may use.
    pub fn detect() -> Self {
        Self::default_for(Self::available_cores())
    }

    /// The cores this process may use (at least 1).
    pub fn available_cores() -> usize {
        core_affinity::get_core_ids()
            .map(|c| c.len())
            .filter(|&n| n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1)
    }
}

/// How the decoder stores its matrices and computes their products (PERFORMANCE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderWeights {
    /// f32, the heavy products on the host ([`crate::ffi::Context::conv_gemm`]): exact.
    F32,
    /// bf16 ([`crate::decoder::Products::HostBf16`]) on AMX tiles or with AVX-512 BF16 dot
    /// products: 2-3x faster than f32 where the kernel tier has either, about 32 dB from f32 on
    /// random weights; an error elsewhere.
    Bf16,
    /// q8_0 through ggml: a quarter of f32's memory, about 19 dB from f32 on random weights,
    /// slower than the host products.
    Q8_0,
}

impl DecoderWeights {
    /// [`DecoderWeights::fastest_for`] the process's kernel tier.
    pub fn fastest() -> Self {
        Self::fastest_for(crate::kernels::active())
    }

    /// bf16 where `tier` has a bf16 kernel that is faster than the f32 products (AMX tiles, or
    /// AVX-512 BF16 where `vdpbf16ps` outruns f32 FMA, [`crate::kernels::Features::bf16_dot_fast`]),
    /// else f32 (exact).
    pub fn fastest_for(tier: crate::kernels::Tier) -> Self {
        let caps = tier.caps();
        if caps.amx_bf16 || (caps.avx512_bf16 && caps.bf16_dot_fast) {
            DecoderWeights::Bf16
        } else {
            DecoderWeights::F32
        }
    }

    /// Loads the decoder from `f` this way (f32 when `exact`).
    pub fn load(self, f: &GgufFile, exact: bool) -> Result<Decoder, ModelError> {
        match (self, exact) {
            (_, true) | (DecoderWeights::F32, _) => Decoder::load(f),
            (DecoderWeights::Bf16, _) => {
                Decoder::load_options(f, None, crate::decoder::Products::HostBf16)
            }
            (DecoderWeights::Q8_0, _) => Decoder::load_with(f, Some(crate::gguf::GgmlType::Q8_0)),
        }
    }

    /// The name `qtts` takes and prints: `f32`, `bf16`, `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            DecoderWeights::F32 => "f32",
            DecoderWeights::Bf16 => "bf16",
            DecoderWeights::Q8_0 => "q8_0",
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Threads and cores.
    pub plan: ThreadPlan,
    /// Talker context in positions (prompt plus frames of one utterance): 2048.
    pub n_ctx: usize,
    /// f32 KV cache with flash attention off, and the f32 decoder whatever `decoder` says
    /// (matches the f32 reference; twice the KV memory).
    pub exact: bool,
    /// Frames queued between the code predictor and the decoder: 4 (320 ms of audio).
    pub codes_queue: usize,
    /// Frames per decoder call after the first frame of an utterance: 4 (audio in 320 ms
    /// pieces). The decoder reads its small-row products' weights once per call, so longer chunks
    /// hold its core for less time per frame, at the cost of activation memory (from 2 to 4:
    /// RTF 0.64 → 0.54, peak RSS 820 → 865 MiB over 60 s; PERFORMANCE.md, "Four frames per
    /// decoder call, measured again").
    pub decoder_chunk: usize,
    /// Text tokens per utterance when splitting long text: [`crate::text::split::DEFAULT_MAX_TOKENS`].
    pub segment_tokens: usize,
    /// The code predictor's output heads on q8_0 rows (faster, not bit-exact).
    pub q8_heads: bool,
    /// What computes the code predictor's q4_K, q5_K and q8_0 layer products:
    /// [`LayerKernel::fastest`] (rows packed for AVX-512 VNNI where the CPU has it, else
    /// ggml's). Files of f32 or f16 layers are not affected. Under [`LayerKernel::Packed`] the
    /// q8_0 sample heads of quantized files are packed too
    /// ([`crate::code_predictor::CodePredictor::pack_heads`]).
    pub code_predictor_kernel: LayerKernel,
    /// What runs the talker's layers: [`TalkerRuntime::fastest`] (the crate's own graph with the
    /// packed q4_K kernel where the CPU has AVX-512 VNNI, else llama.cpp).
    pub talker: TalkerRuntime,
    /// The decoder's matrices: [`DecoderWeights::fastest`] (bf16 where the CPU has AMX, else f32).
    /// `exact` overrides it with f32.
    pub decoder: DecoderWeights,
    /// Run each utterance's first frame on every core of the plan, one stage after the other: the
    /// talker's prefill, the code predictor, then the decoder while the others wait. A shorter
    /// time to first audio, for about one decoder frame of delay to the second frame.
    pub burst: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            plan: ThreadPlan::detect(),
            n_ctx: 2048,
            exact: false,
            codes_queue: 4,
            decoder_chunk: 4,
            segment_tokens: crate::text::split::DEFAULT_MAX_TOKENS,
            q8_heads: false,
            code_predictor_kernel: LayerKernel::fastest(),
            talker: TalkerRuntime::fastest(),
            decoder: DecoderWeights::fastest(),
            burst: true,
        }
    }
}

impl EngineConfig {
    /// The code predictor of `mmproj` as this configuration runs it: q8_0 heads when
    /// `q8_heads`, its layer products by `code_predictor_kernel`, and under [`LayerKernel::Packed`] its q8_0
    /// heads packed too.
    fn load_code_predictor(&self, mmproj: &GgufFile) -> Result<CodePredictor, EngineError> {
        let mut cp = CodePredictor::load(mmproj)?;
        if self.q8_heads {
            cp.use_q8_heads()?;
        }
        cp.set_layer_kernel(self.code_predictor_kernel)?;
        if self.code_predictor_kernel == LayerKernel::Packed {
            cp.pack_heads();
        }
        Ok(cp)
    }
}

/// One synthesis request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The text (split into utterances when long) or the token ids of one utterance.
    pub input: TextInput,
    /// Speaker, language, instruction, x-vector.
    pub voice: Voice,
    /// Streaming or non-streaming text.
    pub mode: TextMode,
    /// Codebook-0 sampling; `None`: the checkpoint's `generation_config.json`.
    pub sampling: Option<SamplingParams>,
    /// Codebooks 1..15 sampling; `None`: the checkpoint's `subtalker_*` settings.
    pub code_predictor_sampling: Option<SamplingParams>,
    /// Repetition penalty over codebook 0; `None`: the checkpoint's.
    pub repetition_penalty: Option<f32>,
    /// Seed; utterance `i` of a split text uses `seed + i`.
    pub seed: u64,
    /// Frame cap per utterance; `None`: the runaway guard scaled to its text.
    pub max_frames: Option<usize>,
    /// Frames per utterance before end-of-speech may be sampled (at least
    /// [`crate::talker::MIN_FRAMES`]); with `max_frames`, forces a frame count (benches).
    pub min_frames: usize,
    /// Keep every frame's codes in the summary.
    pub keep_codes: bool,
}

impl Request {
    /// A request for `text` with the model's defaults.
    pub fn text(text: impl Into<String>) -> Self {
        Request {
            input: TextInput::Text(text.into()),
            voice: Voice::default(),
            mode: TextMode::Streaming,
            sampling: None,
            code_predictor_sampling: None,
            repetition_penalty: None,
            seed: 0,
            max_frames: None,
            min_frames: crate::talker::MIN_FRAMES,
            keep_codes: false,
        }
    }

    /// Greedy decoding of every codebook (reproduces the reference's greedy codes).
    pub fn greedy(mut self) -> Self {
        self.sampling = Some(SamplingParams::GREEDY);
        self.code_predictor_sampling = Some(SamplingParams::GREEDY);
        self
    }
}

/// A failure of a request or of the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The request does not fit the model (see [`TalkerError`]).
    #[error(transparent)]
    Talker(#[from] TalkerError),
    /// A model file is wrong.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The decoder failed.
    #[error(transparent)]
    Decoder(#[from] DecoderError),
    /// ggml failed.
    #[error(transparent)]
    Ggml(#[from] GgmlError),
    /// The audio output failed.
    #[error(transparent)]
    Audio(#[from] AudioError),
    /// A stage thread is gone (it panicked or could not start).
    /// Drop the engine and load a new one; report the bug.
    #[error("the {stage} thread stopped unexpectedly")]
    StageGone {
        /// Which stage.
        stage: &'static str,
    },
    /// The text has nothing to speak.
    /// Give text with at least one letter, digit or symbol.
    #[error("the text is empty after clean-up; nothing to speak")]
    EmptyText,
    /// The thread plan cannot run.
    /// Fix [`EngineConfig::plan`] (or use [`ThreadPlan::default_for`]).
    #[error("thread plan: expected {expected}, found {found}")]
    Plan {
        /// What a plan needs.
        expected: String,
        /// What this one has.
        found: String,
    },
}

/// One utterance of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentReport {
    /// Its text (the token ids' count for token input).
    pub text: String,
    /// Text tokens.
    pub tokens: usize,
    /// How the text was cut after it (`None` for token input).
    pub cut: Option<Cut>,
    /// Frames produced.
    pub frames: usize,
    /// Why it ended.
    pub stop: StopReason,
}

/// The end of a request.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Frames produced.
    pub frames: usize,
    /// Samples written to the sink.
    pub samples: usize,
    /// The utterances, in order.
    pub segments: Vec<SegmentReport>,
    /// Why the request ended: that of its last utterance, or [`StopReason::Cancelled`].
    pub stop: StopReason,
    /// Request to the first sample written to the sink.
    pub ttfa: Option<Duration>,
    /// Request to the end of the sink's `end` (playback included for the ring).
    pub elapsed: Duration,
    /// Request to the last sample written (generation only).
    pub generated: Duration,
    /// Non-finite samples the decoder replaced by 0.
    pub non_finite: u64,
    /// Every frame's codes when asked.
    pub codes: Vec<[u32; 16]>,
    /// Per-stage latencies.
    pub metrics: Metrics,
}

impl Summary {
    /// A summary of nothing yet.
    pub(crate) fn empty() -> Self {
        Summary {
            frames: 0,
            samples: 0,
            segments: Vec::new(),
            stop: StopReason::Cancelled,
            ttfa: None,
            elapsed: Duration::ZERO,
            generated: Duration::ZERO,
            non_finite: 0,
            codes: Vec::new(),
            metrics: Metrics::default(),
        }
    }

    /// Seconds of audio.
    pub fn audio_seconds(&self) -> f64 {
        self.samples as f64 / crate::audio::SAMPLE_RATE as f64
    }

    /// Real-time factor of generation: time to the last sample over the audio's duration.
    pub fn rtf(&self) -> f64 {
        self.generated.as_secs_f64() / self.audio_seconds().max(1e-9)
    }
}

/// What the engine knows of its model, for messages and the CLI.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineInfo {
    /// `base`, `custom_voice` or `voice_design`.
    pub model_type: &'static str,
    /// `0b6`, `1b7`, ...
    pub size: String,
    /// The speakers (CustomVoice).
    pub speakers: Vec<String>,
    /// The languages, `auto` first.
    pub languages: Vec<String>,
    /// Talker hidden size.
    pub hidden: usize,
}

/// Cancels a request from any thread.
#[derive(Debug, Clone)]
pub struct Canceller(Arc<AtomicBool>);

impl Canceller {
    /// Stops the request between frames and flushes playback.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A running request.
#[derive(Debug)]
pub struct Synthesis<'e> {
    cancel: Arc<AtomicBool>,
    progress: Arc<AtomicUsize>,
    done: Receiver<Finished>,
    _engine: std::marker::PhantomData<&'e mut Engine>,
}

/// A request's end: its summary (or error) and the sink it wrote to.
pub type Finished = (Result<Summary, EngineError>, Box<dyn AudioSink>);

/// What a request ends with when the decoder thread is gone before answering (its sink is lost).
fn decoder_gone() -> Finished {
    (
        Err(EngineError::StageGone { stage: "decoder" }),
        Box::new(crate::audio::MemorySink::default()),
    )
}

impl Synthesis<'_> {
    /// A handle that cancels this request.
    pub fn canceller(&self) -> Canceller {
        Canceller(self.cancel.clone())
    }

    /// Frames generated so far (codes produced; the decoder may be behind).
    pub fn frames(&self) -> usize {
        self.progress.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` for the end of the request.
    pub fn wait_timeout(self, timeout: Duration) -> Result<Finished, Self> {
        match self.done.recv_timeout(timeout) {
            Ok(d) => Ok(d),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(self),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Ok(decoder_gone()),
        }
    }

    /// Cancels this request.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    /// Waits for the end of the request; returns its summary and the sink.
    pub fn wait(self) -> Finished {
        self.done.recv().unwrap_or_else(|_| decoder_gone())
    }
}

/// Recovers a sink's concrete type from what [`Synthesis::wait`] returns.
pub fn downcast_sink<S: AudioSink>(sink: Box<dyn AudioSink>) -> Option<S> {
    let any: Box<dyn std::any::Any> = sink;
    any.downcast::<S>().ok().map(|b| *b)
}

struct Job {
    req: Request,
    cancel: Arc<AtomicBool>,
    progress: Arc<AtomicUsize>,
    sink: Box<dyn AudioSink>,
    done: Sender<Finished>,
    started: Instant,
}

enum CpMsg {
    Frame {
        hidden: Vec<f32>,
        embedded: Vec<f32>,
        code0: u32,
        /// Set on an utterance's first frame: (seed, sampling).
        reseed: Option<(u64, SamplingParams)>,
    },
    /// Send back the metrics of this request.
    Collect,
}

enum CpReply {
    Frame {
        hidden: Vec<f32>,
        embedded: Vec<f32>,
        /// The decoder's cores, reserved for the talker's next step when it borrows them: the
        /// decoder decodes after that step instead of beside it. Dropped after the step.
        cores: Option<Reservation>,
    },
    Failed(EngineError, Vec<f32>, Vec<f32>),
    Metrics(Box<Metrics>),
}

enum DecMsg {
    Begin {
        sink: Box<dyn AudioSink>,
        cancel: Arc<AtomicBool>,
        started: Instant,
        keep_codes: bool,
        done: Sender<Finished>,
    },
    SegmentStart,
    Frame([u32; 16]),
    /// An utterance's first frame, sent with the burst on: decoded on every core while the code
    /// predictor waits (so the talker does too), then acknowledged on the first-frame channel.
    FirstFrame([u32; 16]),
    SegmentEnd,
    End(Box<EndMsg>),
}

struct EndMsg {
    result: Result<(), EngineError>,
    segments: Vec<SegmentReport>,
    metrics: Metrics,
}

/// The pipelined engine.
#[derive(Debug)]
pub struct Engine {
    jobs: Option<Sender<Box<Job>>>,
    threads: Vec<JoinHandle<()>>,
    info: EngineInfo,
    config: EngineConfig,
    generation: crate::model::config::GenerationConfig,
}

fn pin(plan: &StagePlan, loan: Option<&Arc<CoreLoan>>) -> Result<Threadpool, GgmlError> {
    // The talker and the code predictor share their cores: their idle workers must sleep, not
    // spin on the core the other stage is computing on. ggml places the pool's workers on the
    // first cores of the set and the calling thread (this stage's) on the last. The workers are
    // created by this thread and inherit its nice value.
    set_nice(plan.nice);
    let mut pool = Threadpool::with_poll(plan.threads.max(1), &plan.cores, Some(0))?;
    if let (Some(loan), false) = (loan, plan.borrow.is_empty()) {
        // The borrowed cores are below the stage's own (`ThreadPlan::check_loans`), so the wide
        // pool's extra workers go to them and its calling thread stays on the stage's last core.
        let all: Vec<usize> = plan.borrow.iter().chain(&plan.cores).copied().collect();
        let n = plan.threads.max(1) + plan.borrow.len();
        let wide = Threadpool::with_poll(n, &all, Some(0))?;
        pool = pool.borrowing(wide, loan.clone());
    }
    pin_thread(plan);
    Ok(pool)
}

/// Sets the calling thread's nice value (Linux keeps one per thread; threads it creates inherit
/// it), or `SCHED_IDLE` for 20 and above (see [`StagePlan::nice`]); a refusal (raising priority
/// without privileges) leaves it as it was.
fn set_nice(nice: i32) {
    if nice == 0 {
        return;
    }
    // SAFETY: plain syscalls on the calling thread's own id.
    #[cfg(target_os = "linux")]
    unsafe {
        if nice >= 20 {
            let p = libc::sched_param { sched_priority: 0 };
            // pid 0: the calling thread.
            let _ = libc::sched_setscheduler(0, libc::SCHED_IDLE, &p);
        } else {
            let tid = libc::gettid() as libc::id_t;
            let _ = libc::setpriority(libc::PRIO_PROCESS, tid, nice);
        }
    }
}

/// Pins the calling thread where ggml's strict pool of `plan` puts it: the last core it uses.
fn pin_thread(plan: &StagePlan) {
    if let Some(&c) = plan
        .cores
        .get(plan.threads.max(1) - 1)
        .or(plan.cores.last())
    {
        // A failure to pin leaves the thread unpinned; it still runs.
        let _ = core_affinity::set_for_current(core_affinity::CoreId { id: c });
    }
}

/// The pool over every core of the plan for a stage's burst (see [`EngineConfig::burst`]), when
/// that is wider than the stage's own. Not strict: its workers go to whichever core is idle (the
/// decoder's, at the start of an utterance), and the stage's thread is pinned back to its own.
fn burst_pool(cfg: &EngineConfig, own: &StagePlan) -> Result<Option<Threadpool>, GgmlError> {
    let all = cfg.plan.all_cores();
    if !cfg.burst || all.len() <= own.threads.max(1) {
        return Ok(None);
    }
    let pool = Threadpool::with_options(all.len(), &all, Some(0), false)?;
    pin_thread(own);
    Ok(Some(pool))
}

/// One utterance, planned: its prompt, options and report.
pub(crate) struct Utterance {
    pub prompt: Prompt,
    pub opts: GenOptions,
    pub code_predictor_sampling: SamplingParams,
    pub report: SegmentReport,
}

/// Splits and builds a request's utterances (shared by the engine and [`serial::Serial`]).
pub(crate) fn plan_request(
    talker: &Talker,
    req: &Request,
    segment_tokens: usize,
) -> Result<Vec<Utterance>, EngineError> {
    let g = talker.generation_config();
    let sampling = req.sampling.unwrap_or_else(|| SamplingParams::talker(g));
    let code_predictor_sampling = req
        .code_predictor_sampling
        .unwrap_or_else(|| SamplingParams::code_predictor(g));
    let penalty = req
        .repetition_penalty
        .unwrap_or(g.repetition_penalty as f32);
    let pieces: Vec<(TextInput, String, Option<Cut>)> = match &req.input {
        TextInput::TokenIds(ids) => vec![(
            TextInput::TokenIds(ids.clone()),
            format!("{} token ids", ids.len()),
            None,
        )],
        TextInput::Text(t) => {
            let clean = normalize(t);
            let segs = split(&clean, talker.tokenizer(), segment_tokens);
            if segs.is_empty() {
                return Err(EngineError::EmptyText);
            }
            segs.into_iter()
                .map(|s| {
                    let text = clean[s.range].to_owned();
                    (TextInput::Text(text.clone()), text, Some(s.cut))
                })
                .collect()
        }
    };
    pieces
        .into_iter()
        .enumerate()
        .map(|(i, (input, text, cut))| {
            let prompt = talker.prompt(&input, &req.voice, req.mode)?;
            Ok(Utterance {
                opts: GenOptions {
                    sampling,
                    repetition_penalty: penalty,
                    seed: req.seed.wrapping_add(i as u64),
                    max_frames: req.max_frames,
                    min_frames: req.min_frames,
                },
                code_predictor_sampling,
                report: SegmentReport {
                    text,
                    tokens: prompt.text_tokens,
                    cut,
                    frames: 0,
                    stop: StopReason::Cancelled,
                },
                prompt,
            })
        })
        .collect()
}

impl Engine {
    /// Starts the engine on `files` (see the module docs).
    pub fn load(files: &ModelFiles, config: EngineConfig) -> Result<Self, EngineError> {
        config.plan.check_loans()?;
        if config.exact {
            files.check_exact()?;
        }
        let lends =
            !(config.plan.talker.borrow.is_empty() && config.plan.code_predictor.borrow.is_empty());
        let loan = lends.then(CoreLoan::new);
        let (job_tx, job_rx) = bounded::<Box<Job>>(1);
        let (cp_tx, cp_rx) = bounded::<CpMsg>(1);
        let (reply_tx, reply_rx) = bounded::<CpReply>(1);
        let (dec_tx, dec_rx) = bounded::<DecMsg>(config.codes_queue.max(1));
        // Decoder → CP: "an utterance's first frame is written" (see `DecMsg::FirstFrame`).
        let (first_tx, first_rx) = bounded::<()>(1);
        let (ready_tx, ready_rx) = bounded::<Result<Option<StartInfo>, EngineError>>(3);
        let mut threads = Vec::new();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|_| EngineError::StageGone { stage: "spawn" })
        };
        {
            let (files, cfg, ready) = (files.clone(), config.clone(), ready_tx.clone());
            let (dec_tx, loan) = (dec_tx.clone(), loan.clone());
            threads.push(spawn(
                "qtts-talker",
                Box::new(move || {
                    talker_thread(files, cfg, loan, ready, job_rx, cp_tx, reply_rx, dec_tx)
                }),
            )?);
        }
        {
            let (files, cfg, ready) = (files.clone(), config.clone(), ready_tx.clone());
            let loan = loan.clone();
            threads.push(spawn(
                "qtts-cp",
                Box::new(move || {
                    cp_thread(files, cfg, loan, ready, cp_rx, reply_tx, dec_tx, first_rx)
                }),
            )?);
        }
        {
            let (files, cfg, ready) = (files.clone(), config.clone(), ready_tx);
            threads.push(spawn(
                "qtts-decoder",
                Box::new(move || decoder_thread(files, cfg, loan, ready, dec_rx, first_tx)),
            )?);
        }
        let mut info = None;
        let mut first_err = None;
        for _ in 0..3 {
            match ready_rx.recv() {
                Ok(Ok(Some(i))) => info = Some(i),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(EngineError::StageGone { stage: "loader" });
                }
            }
        }
        match (first_err, info) {
            (None, Some(start)) => Ok(Engine {
                jobs: Some(job_tx),
                threads,
                info: start.info,
                config,
                generation: start.generation,
            }),
            (e, _) => {
                // Closing the job channel stops the talker, and with it the others.
                drop(job_tx);
                for t in threads {
                    let _ = t.join();
                }
                Err(e.unwrap_or(EngineError::StageGone { stage: "talker" }))
            }
        }
    }

    /// What the model offers.
    pub fn info(&self) -> &EngineInfo {
        &self.info
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The checkpoint's sampling defaults.
    pub fn generation_config(&self) -> &crate::model::config::GenerationConfig {
        &self.generation
    }

    /// Starts a request writing to `sink`.
    pub fn synthesize(&mut self, req: Request, sink: Box<dyn AudioSink>) -> Synthesis<'_> {
        let cancel = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(AtomicUsize::new(0));
        let (done_tx, done_rx) = bounded(1);
        let job = Box::new(Job {
            req,
            cancel: cancel.clone(),
            progress: progress.clone(),
            sink,
            done: done_tx,
            started: Instant::now(),
        });
        if let Some(Err(e)) = self.jobs.as_ref().map(|j| j.send(job)) {
            // The talker is gone: answer the request here.
            let job = e.into_inner();
            let _ = job
                .done
                .send((Err(EngineError::StageGone { stage: "talker" }), job.sink));
        }
        Synthesis {
            cancel,
            progress,
            done: done_rx,
            _engine: std::marker::PhantomData,
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Closing the job channel stops the talker, whose channels' closing stops the others.
        self.jobs.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct StartInfo {
    info: EngineInfo,
    generation: crate::model::config::GenerationConfig,
}

type Ready = Sender<Result<Option<StartInfo>, EngineError>>;

/// Tells `Engine::load` how a stage's setup went; the stage runs on only if it succeeded.
fn announce<T>(ready: Ready, setup: Result<T, EngineError>) -> Option<T> {
    match setup {
        Ok(x) => {
            let _ = ready.send(Ok(None));
            Some(x)
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            None
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn talker_thread(
    files: ModelFiles,
    cfg: EngineConfig,
    loan: Option<Arc<CoreLoan>>,
    ready: Ready,
    jobs: Receiver<Box<Job>>,
    cp_tx: Sender<CpMsg>,
    reply_rx: Receiver<CpReply>,
    dec_tx: Sender<DecMsg>,
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
            .send(DecMsg::Begin {
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
        if cp_tx.send(CpMsg::Collect).is_ok() {
            if let Ok(CpReply::Metrics(m)) = reply_rx.recv() {
                metrics.merge(&m);
            }
        }
        let end = EndMsg {
            result,
            segments,
            metrics,
        };
        if dec_tx.send(DecMsg::End(Box::new(end))).is_err() {
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
    cp_tx: &Sender<CpMsg>,
    reply_rx: &Receiver<CpReply>,
    dec_tx: &Sender<DecMsg>,
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
            .send(DecMsg::SegmentStart)
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
            let (mut hidden, embedded) = bufs.take().ok_or(gone("cp"))?;
            hidden.copy_from_slice(session.hidden());
            let t = Instant::now();
            cp_tx
                .send(CpMsg::Frame {
                    hidden,
                    embedded,
                    code0,
                    reseed: reseed.take(),
                })
                .map_err(|_| gone("cp"))?;
            let (hidden, embedded, cores) = match reply_rx.recv().map_err(|_| gone("cp"))? {
                CpReply::Frame {
                    hidden,
                    embedded,
                    cores,
                } => (hidden, embedded, cores),
                CpReply::Failed(e, hidden, embedded) => {
                    *bufs = Some((hidden, embedded));
                    return Err(e);
                }
                CpReply::Metrics(_) => return Err(gone("cp")),
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
            .send(DecMsg::SegmentEnd)
            .map_err(|_| gone("decoder"))?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn cp_thread(
    files: ModelFiles,
    cfg: EngineConfig,
    loan: Option<Arc<CoreLoan>>,
    ready: Ready,
    rx: Receiver<CpMsg>,
    reply: Sender<CpReply>,
    dec_tx: Sender<DecMsg>,
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
            CpMsg::Collect => {
                let m = std::mem::take(&mut metrics);
                if reply.send(CpReply::Metrics(Box::new(m))).is_err() {
                    return;
                }
            }
            CpMsg::Frame {
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
                            .send(CpReply::Failed(e.into(), hidden, embedded))
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
                    DecMsg::FirstFrame(codes)
                } else {
                    DecMsg::Frame(codes)
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
                let frame = CpReply::Frame {
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

/// The decoder's state for one request.
struct Active {
    sink: Box<dyn AudioSink>,
    cancel: Arc<AtomicBool>,
    started: Instant,
    keep_codes: bool,
    done: Sender<Finished>,
    error: Option<EngineError>,
    pending: Vec<[u32; 16]>,
    chunk: usize,
    summary: Summary,
}

fn decoder_thread(
    files: ModelFiles,
    cfg: EngineConfig,
    loan: Option<Arc<CoreLoan>>,
    ready: Ready,
    rx: Receiver<DecMsg>,
    first_done: Sender<()>,
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
    let Some((pool, burst, mut voc)) = announce(ready, setup) else {
        return;
    };
    let chunk = cfg.decoder_chunk.max(1);
    let mut pcm = vec![0.0f32; chunk * FRAME_SAMPLES];
    let mut active: Option<Active> = None;
    let mut metrics = Metrics::default();
    loop {
        let t = Instant::now();
        let Ok(msg) = rx.recv() else { return };
        let waited = t.elapsed();
        match msg {
            DecMsg::Begin {
                mut sink,
                cancel,
                started,
                keep_codes,
                done,
            } => {
                let error = sink.begin().err().map(EngineError::from);
                metrics = Metrics::default();
                active = Some(Active {
                    sink,
                    cancel,
                    started,
                    keep_codes,
                    done,
                    error,
                    pending: Vec::with_capacity(chunk),
                    chunk: 1,
                    summary: Summary::empty(),
                });
            }
            DecMsg::SegmentStart => {
                if let Some(a) = active.as_mut() {
                    if let Err(e) = voc.reset() {
                        a.error.get_or_insert(e.into());
                    }
                    a.pending.clear();
                    a.chunk = 1;
                }
            }
            DecMsg::Frame(codes) | DecMsg::FirstFrame(codes) => {
                let first = matches!(msg, DecMsg::FirstFrame(_));
                if let Some(a) = active.as_mut() {
                    record(&mut metrics.decoder_wait, waited);
                    a.summary.frames += 1;
                    if a.keep_codes {
                        a.summary.codes.push(codes);
                    }
                    a.pending.push(codes);
                    if a.pending.len() >= a.chunk {
                        let on = match (&burst, first) {
                            (Some(b), true) => b,
                            _ => &pool,
                        };
                        let loan = loan.as_deref();
                        decode_pending(&mut voc, on, loan, a, &mut pcm, &mut metrics);
                        a.chunk = chunk;
                    }
                }
                // The code predictor waits for this, whatever became of the frame.
                if first && first_done.send(()).is_err() {
                    return;
                }
            }
            DecMsg::SegmentEnd => {
                if let Some(a) = active.as_mut() {
                    let loan = loan.as_deref();
                    decode_pending(&mut voc, &pool, loan, a, &mut pcm, &mut metrics);
                }
            }
            DecMsg::End(end) => {
                let Some(mut a) = active.take() else { continue };
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
                } = *end;
                m.merge(&metrics);
                let mut s = a.summary;
                s.elapsed = a.started.elapsed();
                s.non_finite = voc.non_finite();
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
                let result = match (result, a.error) {
                    (Err(e), _) => Err(e),
                    (Ok(()), Some(e)) => Err(e),
                    (Ok(()), None) => Ok(s),
                };
                let _ = a.done.send((result, a.sink));
            }
        }
    }
}

fn decode_pending(
    voc: &mut Decoder,
    pool: &Threadpool,
    loan: Option<&CoreLoan>,
    a: &mut Active,
    pcm: &mut [f32],
    metrics: &mut Metrics,
) {
    if a.error.is_none() && !a.cancel.load(Ordering::Acquire) {
        let sink = &mut *a.sink;
        let (cancel, started) = (&*a.cancel, a.started);
        match decode_and_write(
            voc,
            pool,
            loan,
            &a.pending,
            pcm,
            sink,
            cancel,
            started,
            &mut a.summary,
            metrics,
        ) {
            Ok(()) | Err(EngineError::Audio(AudioError::Cancelled)) => {}
            Err(e) => {
                a.error.get_or_insert(e);
            }
        }
    }
    a.pending.clear();
}

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
    let n = frames.len();
    if n == 0 {
        return Ok(());
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
    sink.write(&out[..d.samples], cancel)?;
    summary.ttfa.get_or_insert_with(|| started.elapsed());
    summary.samples += d.samples;
    if let Some(q) = sink.queued_ms() {
        let _ = metrics.ring_fill.record((q.round() as u64).max(1));
    }
    Ok(())
}

/// A request's audio as an iterator of chunks (one per decoder call: 80 or `decoder_chunk × 80`
/// ms of 24 kHz mono samples), from [`Engine::stream`].
#[derive(Debug)]
pub struct AudioStream<'e> {
    synthesis: Synthesis<'e>,
    rx: Receiver<Vec<f32>>,
    finished: Option<Result<Summary, EngineError>>,
}

impl AudioStream<'_> {
    /// A handle that cancels the request.
    pub fn canceller(&self) -> Canceller {
        self.synthesis.canceller()
    }

    /// Frames generated so far.
    pub fn frames(&self) -> usize {
        self.synthesis.frames()
    }

    /// The request's summary: waits for its end, dropping audio not yet taken.
    pub fn finish(mut self) -> Result<Summary, EngineError> {
        if let Some(r) = self.finished.take() {
            return r;
        }
        let (synthesis, rx) = (self.synthesis, self.rx);
        // Keep taking chunks so that the decoder never blocks on a full channel.
        loop {
            crossbeam_channel::select! {
                recv(rx) -> _ => {}
                recv(synthesis.done) -> d => {
                    return d.unwrap_or_else(|_| decoder_gone()).0;
                }
            }
        }
    }
}

impl Iterator for AudioStream<'_> {
    type Item = Vec<f32>;

    fn next(&mut self) -> Option<Vec<f32>> {
        if self.finished.is_some() {
            return self.rx.try_recv().ok();
        }
        crossbeam_channel::select! {
            recv(self.rx) -> chunk => chunk.ok(),
            recv(self.synthesis.done) -> d => {
                self.finished = Some(d.unwrap_or_else(|_| decoder_gone()).0);
                // Every chunk was sent before the end: what is left is in the channel.
                self.rx.try_recv().ok()
            }
        }
    }
}

impl Engine {
    /// Starts a request whose audio comes out of the returned iterator, chunk by chunk, as the
    /// decoder makes it; up to `queue` chunks wait before the engine blocks (backpressure).
    pub fn stream(&mut self, req: Request, queue: usize) -> AudioStream<'_> {
        let (sink, rx) = crate::audio::ChannelSink::new(queue);
        AudioStream {
            synthesis: self.synthesize(req, Box::new(sink)),
            rx,
            finished: None,
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn code_predictor_on_every_core_shares_the_cores_and_idles_the_decoder() {
        assert_eq!(
            ThreadPlan::code_predictor_on_every_core(1),
            ThreadPlan::for_cores(1)
        );
        let (base, p) = (
            ThreadPlan::for_cores(2),
            ThreadPlan::code_predictor_on_every_core(2),
        );
        assert_eq!(p.talker, base.talker);
        assert_eq!(
            (p.code_predictor.cores.as_slice(), p.code_predictor.threads),
            (&[0, 1][..], 2)
        );
        assert_eq!(
            (&p.decoder.cores, p.decoder.nice),
            (&base.decoder.cores, 20)
        );
        assert_eq!(p.all_cores(), vec![0, 1]);
    }

    #[test]
    fn lending_gives_the_decoder_core_0_and_lends_it_to_the_talker_and_the_code_predictor() {
        for n in [1, 3, 4] {
            assert_eq!(ThreadPlan::lending(n), ThreadPlan::for_cores(n));
        }
        let p = ThreadPlan::lending(2);
        p.check_loans().unwrap();
        assert_eq!((p.decoder.cores.as_slice(), p.decoder.nice), (&[0][..], 0));
        assert_eq!(
            (p.code_predictor.cores.as_slice(), p.code_predictor.threads),
            (&[1][..], 1)
        );
        assert_eq!(p.code_predictor.borrow, vec![0]);
        assert_eq!(
            (p.talker.cores.as_slice(), p.talker.borrow.as_slice()),
            (&[1][..], &[0][..])
        );
        assert_eq!(p.all_cores(), vec![0, 1]);
    }

    /// This process's thread ids.
    fn tasks() -> Vec<u32> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// The name of thread `tid` (empty once it has exited).
    fn comm_of(tid: u32) -> String {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
            .map(|s| s.trim_end().to_owned())
            .unwrap_or_default()
    }

    /// The nice value of thread `tid`, from `/proc` (field 19 of `stat`).
    fn nice_of(tid: u32) -> i64 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split_whitespace().nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn a_stage_s_nice_value_reaches_its_thread_and_its_ggml_workers_only() {
        // SAFETY: plain syscalls on this thread.
        let (own, before) = unsafe { (libc::gettid() as u32, nice_of(libc::gettid() as u32)) };
        if before > 7 {
            eprintln!("skipped: the test runs at nice {before}, above the 7 it sets");
            return;
        }
        let plan = StagePlan {
            cores: Vec::new(),
            threads: 2,
            nice: 7,
            borrow: Vec::new(),
        };
        // Linux gives a new thread its creator's name: the pool's workers are the threads named
        // as this one (other tests of this binary make threads of their own meanwhile).
        std::thread::Builder::new()
            .name("qtts-nice-test".into())
            .spawn(move || {
                let _pool = pin(&plan, None).unwrap();
                // SAFETY: a plain syscall.
                let me = unsafe { libc::gettid() } as u32;
                assert_eq!(nice_of(me), 7, "the stage's thread");
                let workers: Vec<u32> = tasks()
                    .into_iter()
                    .filter(|&t| t != me && comm_of(t) == "qtts-nice-test")
                    .collect();
                assert!(!workers.is_empty(), "a pool of 2 threads has a worker");
                for w in workers {
                    assert_eq!(nice_of(w), 7, "ggml worker {w}");
                }
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(nice_of(own), before, "the caller's thread is untouched");
    }

    #[test]
    fn nice_20_is_sched_idle_for_the_stage_s_thread_only() {
        let plan = StagePlan {
            cores: Vec::new(),
            threads: 1,
            nice: 20,
            borrow: Vec::new(),
        };
        std::thread::spawn(move || {
            let _pool = pin(&plan, None).unwrap();
            // SAFETY: a plain syscall on the calling thread.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
        // SAFETY: as above.
        assert_ne!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_IDLE);
    }
}
