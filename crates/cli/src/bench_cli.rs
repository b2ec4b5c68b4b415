//! `qtts bench`: issue 7's table. Each (run, configuration) is a child process (`qtts bench-run`)
//! so that its peak RSS is its own; the official package (`bench_reference.py`) runs interleaved
//! with ours, once per round, when a Python with `qwen-tts` is given.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::bench::{self, Medians, ReferenceReport, Row, RunReport};
use anyhow::Context as _;
use qtts::engine::{DecoderWeights, EngineConfig, LayerKernel, TalkerRuntime, ThreadPlan};
use qtts::kernels::Tier;
use qtts::model::config::Preset;
use qtts::model::convert::OutType;

/// Options of `qtts bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// The geometry of the random-weight model to make when `--models` has none.
    #[arg(long, value_enum, default_value = "0.6b-customvoice")]
    pub preset: Preset,
    /// Directory of the bench models (`talker-<type>.gguf`, `mmproj-<type>.gguf`, `checkpoint/`);
    /// what is missing is made there. Default: `~/.cache/qtts/bench/<preset>`.
    #[arg(long)]
    pub models: Option<PathBuf>,
    /// Tokenizer directory (vocab.json, merges.txt, tokenizer_config.json) for writing the random
    /// checkpoint, as found in every downloaded checkpoint. Default: the released tokenizer in the
    /// repository this `qtts` was built from (`tests/fixtures/tokenizer/released`), when it is
    /// there.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Weight types of the talker and code predictor to measure, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "q4_k,q8_0,f16"
    )]
    pub types: Vec<OutType>,
    /// Decoder matrices, comma-separated: auto (the engine's default for each tier), f32
    /// (exact), bf16, q8_0; each is measured with each type, interleaved in every round.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "auto")]
    pub decoder: Vec<DecoderArg>,
    /// Streams at once, comma-separated (continuous batching): each count runs as paced
    /// listeners started `--stagger-ms` apart, then as the same requests one after the other
    /// (the baseline); `--frames` is each stream's length.
    #[arg(long, value_delimiter = ',')]
    pub streams: Vec<usize>,
    /// Milliseconds between two streams' starts (`--streams`).
    #[arg(long, default_value_t = 1000.0)]
    pub stagger_ms: f64,
    /// Tokens a second of a simulated language model, comma-separated: an answer of `--frames`
    /// written at each rate, spoken sentence by sentence from the first word and, in the same
    /// run, a sentence at a time once each is complete (`bench_text`).
    #[arg(long, value_delimiter = ',')]
    pub text_rate: Vec<f64>,
    /// Frames per measured run (80 ms each): 750 is 60 s; a longer run is a soak of one-minute
    /// requests spoken one after another (`--request-frames`), reported minute by minute.
    #[arg(long, default_value_t = 750)]
    pub frames: usize,
    /// Frames per request of a soak (a run longer than this).
    #[arg(long, default_value_t = bench::MINUTE_FRAMES)]
    pub request_frames: usize,
    /// Rounds; each runs every configuration once, then the reference.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Audio queued before the paced sink starts playing, ms.
    #[arg(long, default_value_t = 300.0)]
    pub prebuffer_ms: f64,
    /// Python with the official `qwen-tts` package (the oracle's venv) to time the reference on
    /// the same checkpoint; default: `$QTTS_REFERENCE_PYTHON`, else no reference.
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The oracle's `bench_reference.py`, a development tool that is not shipped (only with
    /// `--python`).
    #[arg(long)]
    pub reference_script: Option<PathBuf>,
    /// Frames of each reference run (it runs about 10x slower than real time).
    #[arg(long, default_value_t = 24)]
    pub reference_frames: usize,
    /// Frames per decoder call after an utterance's first, comma-separated; each is measured
    /// with each type, decoder and plan (default: the engine's).
    #[arg(long, value_delimiter = ',')]
    pub decoder_chunk: Vec<usize>,
    /// The code predictor's layer kernels, comma-separated: auto (the engine's), ggml, scalar,
    /// packed;
    /// each is measured with each type, decoder and plan.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "auto")]
    pub code_predictor_kernel: Vec<CodePredictorKernelArg>,
    /// What runs the talker, comma-separated: auto (the engine's), llama (llama.cpp), graph (the
    /// crate's graph, packed kernels), graph-ggml (the crate's graph, ggml's products).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "auto")]
    pub talker: Vec<TalkerArg>,
    /// Thread plans, comma-separated; each is measured with each type and decoder.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "default")]
    pub plan: Vec<PlanArg>,
    /// Kernel tiers, comma-separated (scalar, avx2, avxvnni, avx512, amx, neon; default: the process's,
    /// `--kernels` or `$QTTS_KERNELS` or the CPU's best): each configuration runs under each, in
    /// a child process of its own. Tiers this CPU lacks are refused.
    #[arg(long = "tiers", value_delimiter = ',', value_parser = crate::parse_tier)]
    pub tiers: Vec<Tier>,
    /// Write every run's report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The decoder's matrices on the command line (the engine's `DecoderWeights`, or auto).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DecoderArg {
    /// The engine's default for the tier: bf16 where it has AMX, or AVX-512 BF16 on AMD (where
    /// it outruns f32), else int8 where it has VNNI, else f16.
    Auto,
    /// 32-bit floats, products on the host: exact.
    F32,
    /// f32 products of weights stored as f16 (AVX2, AVX-512): half the bytes, 109 dB from f32
    /// on random weights.
    F16,
    /// bf16 on AMX tiles or AVX-512 BF16: 2-3x faster than f32, about 32 dB from it on random
    /// weights.
    Bf16,
    /// q8_0 blocks through ggml: about 19 dB from f32 on random weights (PERFORMANCE.md).
    #[value(name = "q8_0")]
    Q8_0,
    /// The residual units' k = 7 convs in 8-bit integers (AVX-512 VNNI or AVX-VNNI), the rest
    /// as f16: about 31.6 dB from f32 on random weights.
    Int8,
}

impl DecoderArg {
    /// What the engine takes, under `tier`.
    pub fn weights(self, tier: Tier) -> DecoderWeights {
        match self {
            DecoderArg::Auto => DecoderWeights::fastest_for(tier),
            DecoderArg::F32 => DecoderWeights::F32,
            DecoderArg::F16 => DecoderWeights::F16,
            DecoderArg::Bf16 => DecoderWeights::Bf16,
            DecoderArg::Q8_0 => DecoderWeights::Q8_0,
            DecoderArg::Int8 => DecoderWeights::Int8,
        }
    }
}

/// The released tokenizer in the repository `qtts` was built from, when it is still there.
fn repository_tokenizer() -> Option<PathBuf> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer/released");
    dir.join("vocab.json").is_file().then_some(dir)
}

/// The name of `v` on the command line.
fn arg_name(v: impl clap::ValueEnum) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_string())
        .unwrap_or_default()
}

/// The code predictor's layer kernel on the command line (the engine's `LayerKernel`, or auto).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CodePredictorKernelArg {
    /// The engine's default ([`LayerKernel::fastest`]).
    Auto,
    /// ggml's `mul_mat`.
    Ggml,
    /// The crate's scalar kernels on the file's rows (the tests' reference, slow).
    Scalar,
    /// The kernel tier's kernels on q4_K, q5_K and q8_0 rows packed 16 at a time.
    Packed,
}

impl CodePredictorKernelArg {
    /// What the engine takes, under `tier`.
    pub fn kernel(self, tier: Tier) -> LayerKernel {
        match self {
            CodePredictorKernelArg::Auto => LayerKernel::fastest_for(tier),
            CodePredictorKernelArg::Ggml => LayerKernel::Ggml,
            CodePredictorKernelArg::Scalar => LayerKernel::Scalar,
            CodePredictorKernelArg::Packed => LayerKernel::Packed,
        }
    }

    /// The argument naming `k`.
    fn of(k: LayerKernel) -> Self {
        match k {
            LayerKernel::Ggml => CodePredictorKernelArg::Ggml,
            LayerKernel::Scalar => CodePredictorKernelArg::Scalar,
            LayerKernel::Packed => CodePredictorKernelArg::Packed,
        }
    }

    fn name(self) -> String {
        arg_name(self)
    }
}

/// What runs the talker on the command line (the engine's `TalkerRuntime`, or auto).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TalkerArg {
    /// The engine's default ([`TalkerRuntime::fastest`]).
    Auto,
    /// llama.cpp.
    Llama,
    /// The crate's graph with the code predictor's fastest kernel.
    Graph,
    /// The crate's graph with ggml's products.
    GraphGgml,
}

impl TalkerArg {
    /// What the engine takes, under `tier`.
    pub fn runtime(self, tier: Tier) -> TalkerRuntime {
        match self {
            TalkerArg::Auto => TalkerRuntime::fastest_for(tier),
            TalkerArg::Llama => TalkerRuntime::LlamaCpp,
            TalkerArg::Graph => TalkerRuntime::Graph(LayerKernel::fastest_for(tier)),
            TalkerArg::GraphGgml => TalkerRuntime::Graph(LayerKernel::Ggml),
        }
    }

    /// The argument naming `r`.
    fn of(r: TalkerRuntime) -> Self {
        match r {
            TalkerRuntime::LlamaCpp => TalkerArg::Llama,
            TalkerRuntime::Graph(LayerKernel::Ggml) => TalkerArg::GraphGgml,
            TalkerRuntime::Graph(_) => TalkerArg::Graph,
        }
    }

    fn name(self) -> String {
        arg_name(self)
    }
}

/// Thread plans to compare (2 or more cores; on one core every plan is the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PlanArg {
    /// The engine's: [`ThreadPlan::default_for`] (the same as `lend`).
    Default,
    /// Talker and code predictor on one core, the decoder on the other ([`ThreadPlan::for_cores`],
    /// the default before `lend`).
    Split,
    /// The code predictor's ggml threads over every core; the decoder keeps its own at nice 19,
    /// so that it yields the core whenever the code predictor's second thread has work.
    CodePredictorShared,
    /// As `code-predictor-shared`, the talker's threads too.
    TalkerCodePredictorShared,
    /// The code predictor over every core, the decoder at the same priority (what `code-predictor-shared`
    /// is measured against).
    CodePredictorSharedEqual,
    /// As `code-predictor-shared`, the decoder under `SCHED_IDLE` ([`ThreadPlan::code_predictor_on_every_core`], `qtts
    /// speak --code-predictor-on-every-core`).
    CodePredictorSharedIdle,
    /// As `code-predictor-shared-idle`, the talker's threads over every core too.
    TalkerCodePredictorSharedIdle,
    /// The talker and the code predictor borrow the decoder's core between the decoder's
    /// frames, nobody's priority changed ([`ThreadPlan::lending`], the default).
    Lend,
    /// As `lend`, the code predictor alone borrowing.
    CodePredictorLend,
}

impl PlanArg {
    /// The plan on `cores` cores.
    pub fn plan(self, cores: usize) -> ThreadPlan {
        if cores < 2 {
            return ThreadPlan::for_cores(cores);
        }
        // Every plan below but the first three shares the code predictor over every core; they
        // differ in the decoder's priority and the talker's cores.
        let mut plan = ThreadPlan::code_predictor_on_every_core(cores);
        match self {
            PlanArg::Default => return ThreadPlan::default_for(cores),
            PlanArg::Split => return ThreadPlan::for_cores(cores),
            PlanArg::Lend => return ThreadPlan::lending(cores),
            PlanArg::CodePredictorLend => {
                let mut plan = ThreadPlan::lending(cores);
                plan.talker.borrow.clear();
                return plan;
            }
            PlanArg::CodePredictorSharedIdle => {}
            PlanArg::CodePredictorShared => plan.decoder.nice = 19,
            PlanArg::CodePredictorSharedEqual => plan.decoder.nice = 0,
            PlanArg::TalkerCodePredictorShared => {
                plan.talker = plan.code_predictor.clone();
                plan.decoder.nice = 19;
            }
            PlanArg::TalkerCodePredictorSharedIdle => plan.talker = plan.code_predictor.clone(),
        }
        plan
    }

    fn name(self) -> String {
        arg_name(self)
    }
}

/// Options of the hidden `qtts bench-run`: one measured run, its report as one JSON line.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[arg(long)]
    talker: PathBuf,
    #[arg(long)]
    mmproj: PathBuf,
    #[arg(long)]
    frames: usize,
    #[arg(long, default_value_t = bench::MINUTE_FRAMES)]
    request_frames: usize,
    #[arg(long)]
    prebuffer_ms: f64,
    #[arg(long, value_enum)]
    decoder: DecoderArg,
    #[arg(long)]
    decoder_chunk: Option<usize>,
    #[arg(long, value_enum, default_value = "default")]
    plan: PlanArg,
    #[arg(long, value_enum, default_value = "auto")]
    code_predictor_kernel: CodePredictorKernelArg,
    #[arg(long = "talker-runtime", value_enum, default_value = "auto")]
    talker_runtime: TalkerArg,
    /// Streams at once (`bench_streams`); 0: one request (`bench::measure_in`).
    #[arg(long, default_value_t = 0)]
    streams: usize,
    #[arg(long, default_value_t = 1000.0)]
    stagger_ms: f64,
    /// The streams one after the other on an engine of one stream.
    #[arg(long)]
    sequential: bool,
    /// An answer written at this many tokens a second (`bench_text`).
    #[arg(long)]
    text_rate: Option<f64>,
    /// With `--text-rate`: when each sentence starts.
    #[arg(long, value_enum, default_value = "paced")]
    text_start: crate::bench_text::TextStart,
}

/// `qtts bench-run`.
pub fn run_one(a: &RunArgs) -> anyhow::Result<()> {
    let files = qtts::model::ModelFiles {
        talker: a.talker.clone(),
        mmproj: a.mmproj.clone(),
    };
    let default = EngineConfig::default();
    let tier = qtts::kernels::active();
    let config = EngineConfig {
        decoder: a.decoder.weights(tier),
        decoder_chunk: a.decoder_chunk.unwrap_or(default.decoder_chunk),
        plan: a.plan.plan(ThreadPlan::available_cores()),
        code_predictor_kernel: a.code_predictor_kernel.kernel(tier),
        talker: a.talker_runtime.runtime(tier),
        ..default
    };
    if let Some(rate) = a.text_rate {
        let start = a.text_start;
        let r = crate::bench_text::measure(&files, config, a.frames, a.prebuffer_ms, rate, start)?;
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    if a.streams > 0 {
        let stagger = std::time::Duration::from_secs_f64(a.stagger_ms.max(0.0) / 1e3);
        let report = crate::bench_streams::measure(
            &files,
            config,
            a.streams,
            a.frames,
            a.prebuffer_ms,
            stagger,
            a.sequential,
        )?;
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    let report = bench::measure_in(&files, config, a.frames, a.request_frames, a.prebuffer_ms)?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// One measured configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Config {
    ty: OutType,
    decoder: DecoderWeights,
    plan: PlanArg,
    code_predictor_kernel: LayerKernel,
    talker: TalkerRuntime,
    decoder_chunk: usize,
    tier: Tier,
}

impl Config {
    /// The configuration's label: the plan and the kernels are named when they are not the
    /// defaults.
    pub(crate) fn label(&self) -> String {
        let mut l = format!("{} (dec {}", self.ty.name(), self.decoder.name());
        if self.tier != qtts::kernels::active() {
            l += &format!(", tier {}", self.tier);
        }
        if self.plan != PlanArg::Default {
            l += &format!(", {}", self.plan.name());
        }
        if self.code_predictor_kernel != LayerKernel::fastest_for(self.tier) {
            l += &format!(
                ", cp {}",
                CodePredictorKernelArg::of(self.code_predictor_kernel).name()
            );
        }
        if self.talker != TalkerRuntime::fastest_for(self.tier) {
            l += &format!(", talker {}", TalkerArg::of(self.talker).name());
        }
        if self.decoder_chunk != EngineConfig::default().decoder_chunk {
            l += &format!(", chunk {}", self.decoder_chunk);
        }
        l + ")"
    }
}

fn child(exe: &Path, dir: &Path, c: Config, a: &BenchArgs) -> anyhow::Result<RunReport> {
    let line = run_child(child_command(exe, dir, c, a), dir, c)?;
    serde_json::from_str(line.trim()).with_context(|| format!("bench-run printed {line:?}"))
}

/// A run of `n` streams at once (or one after the other, `sequential`) in a child.
fn child_streams(
    exe: &Path,
    dir: &Path,
    c: Config,
    a: &BenchArgs,
    n: usize,
    sequential: bool,
) -> anyhow::Result<crate::bench_streams::StreamsReport> {
    let mut cmd = child_command(exe, dir, c, a);
    cmd.arg("--streams").arg(n.to_string());
    cmd.arg("--stagger-ms").arg(a.stagger_ms.to_string());
    if sequential {
        cmd.arg("--sequential");
    }
    let line = run_child(cmd, dir, c)?;
    serde_json::from_str(line.trim()).with_context(|| format!("bench-run printed {line:?}"))
}

/// Runs a child's command; its one line of JSON.
pub(crate) fn run_child(mut cmd: Command, dir: &Path, c: Config) -> anyhow::Result<String> {
    let out = cmd.output().context("starting qtts bench-run")?;
    anyhow::ensure!(
        out.status.success(),
        "qtts bench-run on {} failed ({}): {}",
        qtts::model::ModelFiles::converted_in(dir, c.ty)
            .talker
            .display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `qtts bench-run` command of configuration `c`.
pub(crate) fn child_command(exe: &Path, dir: &Path, c: Config, a: &BenchArgs) -> Command {
    let files = qtts::model::ModelFiles::converted_in(dir, c.ty);
    let files = &files;
    let mut cmd = Command::new(exe);
    cmd.arg("bench-run")
        .arg("--talker")
        .arg(&files.talker)
        .arg("--mmproj")
        .arg(&files.mmproj)
        .arg("--frames")
        .arg(a.frames.to_string())
        .arg("--request-frames")
        .arg(a.request_frames.to_string())
        .arg("--prebuffer-ms")
        .arg(a.prebuffer_ms.to_string());
    // The parent resolves `auto`, so that the table names what ran.
    cmd.arg("--decoder").arg(c.decoder.name());
    cmd.arg("--plan").arg(c.plan.name());
    cmd.arg("--code-predictor-kernel")
        .arg(CodePredictorKernelArg::of(c.code_predictor_kernel).name());
    cmd.arg("--talker-runtime")
        .arg(TalkerArg::of(c.talker).name());
    cmd.arg("--decoder-chunk").arg(c.decoder_chunk.to_string());
    cmd.arg("--kernels").arg(c.tier.name());
    cmd
}

fn reference(
    python: &Path,
    script: &Path,
    checkpoint: &Path,
    frames: usize,
    json: &Path,
) -> anyhow::Result<ReferenceReport> {
    let out = Command::new(python)
        .arg(script)
        .arg("--model")
        .arg(checkpoint)
        .args([
            "--frames",
            &frames.to_string(),
            "--threads",
            "2",
            "--streaming-text",
        ])
        .arg("--json")
        .arg(json)
        .output()
        .with_context(|| format!("starting {}", python.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} {} failed ({}): {}",
        python.display(),
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text =
        std::fs::read_to_string(json).with_context(|| format!("reading {}", json.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", json.display()))
}

/// `qtts bench`.
pub fn run(a: &BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.runs >= 1 && a.frames >= 1,
        "--runs and --frames must be at least 1"
    );
    anyhow::ensure!(
        !a.types.is_empty(),
        "--types: name at least one weight type"
    );
    let preset_name = arg_name(a.preset);
    let dir = a.models.clone().unwrap_or_else(|| {
        qtts::model::find::cache_dir()
            .join("bench")
            .join(&preset_name)
    });
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut printer = crate::progress_printer("bench models");
    let checkpoint = qtts::model::random::ensure_models(
        a.preset,
        a.tokenizer.clone().or_else(repository_tokenizer).as_deref(),
        &dir,
        &a.types,
        &mut |what, d, t| {
            if t == 0 {
                eprintln!("bench: {what}");
            } else {
                printer(d, t)
            }
        },
    )?;
    // The children run a copy of this executable: rebuilding qtts during a bench (cargo replaces
    // the file) must not change what the later runs measure. The reference writes its JSON there
    // too.
    let exe = std::env::current_exe().context("finding the qtts executable")?;
    let copy = tempfile::Builder::new()
        .prefix("qtts-bench-")
        .tempdir()
        .context("making a temporary directory for the bench's copy of qtts")?;
    let exe = {
        let to = copy.path().join("qtts");
        std::fs::copy(&exe, &to)
            .with_context(|| format!("copying {} to {}", exe.display(), to.display()))?;
        to
    };
    let python = a
        .python
        .clone()
        .or_else(|| std::env::var_os("QTTS_REFERENCE_PYTHON").map(PathBuf::from));
    let script = a.reference_script.clone().unwrap_or_default();
    if let Some(p) = &python {
        anyhow::ensure!(
            script.is_file(),
            "--python {} given, but the reference script {} does not exist: pass --reference-script",
            p.display(),
            script.display()
        );
    }
    let cores = ThreadPlan::available_cores();
    let mut tiers: Vec<Tier> = Vec::new();
    for &t in &a.tiers {
        qtts::kernels::check(t)?;
        if !tiers.contains(&t) {
            tiers.push(t);
        }
    }
    if tiers.is_empty() {
        tiers.push(qtts::kernels::active());
    }
    let mut chunks: Vec<usize> = Vec::new();
    for &n in &a.decoder_chunk {
        anyhow::ensure!(
            n >= 1,
            "--decoder-chunk: frames per call must be at least 1, not {n}"
        );
        if !chunks.contains(&n) {
            chunks.push(n);
        }
    }
    if chunks.is_empty() {
        chunks.push(EngineConfig::default().decoder_chunk);
    }
    // Every combination, types outermost, tiers innermost; `auto` resolved for each tier (so
    // that the table names what ran), duplicates dropped.
    let mut configs: Vec<Config> = Vec::new();
    // A decoder type the tier has no kernel for is skipped by name, not run (nor silently left).
    let mut skipped: Vec<String> = Vec::new();
    for &ty in &a.types {
        for d in &a.decoder {
            for &plan in &a.plan {
                for k in &a.code_predictor_kernel {
                    for t in &a.talker {
                        for &decoder_chunk in &chunks {
                            for &tier in &tiers {
                                let c = Config {
                                    ty,
                                    decoder: d.weights(tier),
                                    plan,
                                    code_predictor_kernel: k.kernel(tier),
                                    talker: t.runtime(tier),
                                    decoder_chunk,
                                    tier,
                                };
                                if !c.decoder.runs_on(tier) {
                                    let why = format!(
                                        "skipped: decoder {} on kernel tier {}: no {} kernel on \
                                         this tier (CPU features: {})",
                                        c.decoder.name(),
                                        tier.name(),
                                        c.decoder.name(),
                                        qtts::kernels::Features::get().names().join(" ")
                                    );
                                    if !skipped.contains(&why) {
                                        skipped.push(why);
                                    }
                                } else if !configs.contains(&c) {
                                    configs.push(c);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for why in &skipped {
        eprintln!("bench: {why}");
    }
    anyhow::ensure!(
        !configs.is_empty(),
        "nothing to measure: every combination asked for was skipped"
    );
    let mut decoders: Vec<DecoderWeights> = Vec::new();
    for c in &configs {
        if !decoders.contains(&c.decoder) {
            decoders.push(c.decoder);
        }
    }
    let names: Vec<&str> = decoders.iter().map(|d| d.name()).collect();
    eprintln!(
        "bench: {preset_name} random weights in {}, {} frames ({:.1} s of audio) per run, {} rounds, \
         prebuffer {} ms, decoder {}, {cores} cores, kernel tiers {} (CPU features: {}){}",
        dir.display(),
        a.frames,
        a.frames as f64 * 0.08,
        a.runs,
        a.prebuffer_ms,
        names.join(", "),
        tiers.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "),
        qtts::kernels::Features::get().names().join(" "),
        if python.is_some() { ", with the reference" } else { "" }
    );
    if !a.streams.is_empty() {
        return streams(&exe, &dir, &configs, a);
    }
    if !a.text_rate.is_empty() {
        return crate::bench_text::rates(&exe, &dir, &configs, a);
    }
    let mut reports: Vec<Vec<RunReport>> = vec![Vec::new(); configs.len()];
    let mut refs = Vec::new();
    for round in 0..a.runs {
        for (i, &c) in configs.iter().enumerate() {
            let r = child(&exe, &dir, c, a)?;
            eprintln!(
                "round {round} {:<36}: RTF {:.3}  TTFA {:.0} ms  underruns {}/{}  peak {:.0} MiB",
                c.label(),
                r.rtf,
                r.ttfa_ms,
                r.underruns,
                r.periods,
                r.peak_rss_mib
            );
            reports[i].push(r);
        }
        if let Some(p) = &python {
            let json = copy.path().join("reference.json");
            let r = reference(p, &script, &checkpoint, a.reference_frames, &json)?;
            eprintln!("round {round} reference: RTF {:.3}", r.rtf_total);
            refs.push(r);
        }
    }
    let rows: Vec<Row> = configs
        .iter()
        .zip(&reports)
        .map(|(c, runs)| Row {
            label: c.label(),
            medians: Medians::of(runs),
        })
        .collect();
    println!(
        "{preset_name}, {} frames per run, medians of {} runs, prebuffer {} ms, {cores} cores",
        a.frames, a.runs, a.prebuffer_ms
    );
    print!("{}", bench::table(&rows, &refs));
    for why in &skipped {
        println!("{why}");
    }
    for (c, runs) in configs.iter().zip(&reports) {
        for (i, r) in runs.iter().enumerate() {
            print!(
                "{}",
                bench::soak_lines(&format!("{} run {}", c.label(), i + 1), r)
            );
        }
    }
    if let Some(path) = &a.json {
        let all: Vec<serde_json::Value> = configs
            .iter()
            .zip(&reports)
            .map(|(c, runs)| {
                serde_json::json!({
                    "type": c.ty.name(),
                    "decoder": c.decoder.name(),
                    "plan": c.plan.name(),
                    "code_predictor_kernel": CodePredictorKernelArg::of(c.code_predictor_kernel).name(),
                    "talker": TalkerArg::of(c.talker).name(),
                    "decoder_chunk": c.decoder_chunk,
                    "tier": c.tier.name(),
                    "runs": runs,
                })
            })
            .collect();
        std::fs::write(path, serde_json::to_string_pretty(&all)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `qtts bench --streams`: per configuration and round, each stream count at once and then one
/// at a time (the baseline of the same run), in children.
fn streams(exe: &Path, dir: &Path, configs: &[Config], a: &BenchArgs) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for round in 0..a.runs {
        for &c in configs {
            for &n in &a.streams {
                anyhow::ensure!(
                    (1..=qtts::code_predictor::MAX_ROWS).contains(&n),
                    "--streams {n}: expected 1 to {}",
                    qtts::code_predictor::MAX_ROWS
                );
                for sequential in [false, true] {
                    let r = child_streams(exe, dir, c, a, n, sequential)?;
                    let rtf = r.each.iter().map(|e| e.rtf).fold(0.0, f64::max);
                    eprintln!(
                        "round {round} {:<30} {n} {}: RTF max {rtf:.3}, {:.2} s of audio a second, \
                         steps by streams {:?}",
                        c.label(),
                        if sequential { "one at a time" } else { "at once" },
                        r.audio_per_wall,
                        r.batch_sizes
                    );
                    rows.push((format!("{} r{round}", c.label()), r));
                }
            }
        }
    }
    print!("{}", crate::bench_streams::table(&rows));
    Ok(())
}
