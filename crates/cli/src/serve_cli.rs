//! `qtts serve`: the OpenAI speech API and Wyoming over one engine (crates/serve).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

/// `qtts serve` options.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The model (as `speak --model`; default: the best under models/, else the built-in one).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The HTTP address of the OpenAI-compatible API (`none` to turn it off; port 0: any).
    #[arg(long, default_value = "127.0.0.1:8880")]
    http: String,
    /// The Wyoming address for Home Assistant (`none` to turn it off; port 0: any).
    #[arg(long, default_value = "127.0.0.1:10200")]
    wyoming: String,
    /// Requests that may wait behind the running ones; past it, 503 with Retry-After.
    #[arg(long, default_value_t = 4)]
    queue: usize,
    /// Requests spoken at once (continuous batching: each frame, their steps run as one batch;
    /// each request's audio is what it gets alone). Default: what the kernel tier keeps real
    /// time on 2 cores, measured: 2 with AMX, else 1.
    #[arg(long)]
    max_streams: Option<usize>,
    /// Seconds a request may wait in the queue before it is answered 503.
    #[arg(long, default_value_t = 30.0)]
    queue_timeout: f64,
    /// Voice profiles: a directory of NAME.json ({"speaker","language","instruct","xvector"}), or
    /// of voices saved by `qtts voice add` (Base models), or both.
    #[arg(long)]
    voices: Option<PathBuf>,
    /// How a request's text enters the prompt unless it gives `non_streaming_mode`: `trailing`
    /// makes a saved voice's first audio as fast as a speaker's, in a layout that is not the
    /// official one (see `qtts speak --help`).
    #[arg(long, value_enum, default_value = "streaming")]
    text_mode: qtts::talker::TextMode,
    /// Require `Authorization: Bearer KEY` on /v1 (default: no key, the header is ignored).
    #[arg(long)]
    api_key: Option<String>,
    /// Refuse requests whose `model` is not the served model's id (404).
    #[arg(long)]
    strict_model: bool,
    /// Answer a full queue with 429 instead of 503.
    #[arg(long)]
    overload_429: bool,
    /// Characters of input per request (and per Wyoming connection).
    #[arg(long, default_value_t = 4096)]
    max_input_chars: usize,
    /// Cap on `max_new_tokens` (frames of 80 ms per utterance).
    #[arg(long, default_value_t = 1125)]
    max_frames: usize,
    /// Audio per request in seconds; past it the request is cut.
    #[arg(long, default_value_t = 600.0)]
    max_audio_seconds: f64,
    /// Audio buffered per request for a client that reads slower than real time, in seconds.
    #[arg(long, default_value_t = 120.0)]
    buffer_seconds: f64,
    /// Seconds a client may take nothing while its buffer is full before its request is cancelled
    /// (and a Wyoming client that reads nothing for this long is disconnected).
    #[arg(long, default_value_t = 20.0)]
    write_stall_timeout: f64,
    /// Seconds an HTTP request body may take, whole (past it, 408).
    #[arg(long, default_value_t = 60.0)]
    body_timeout: f64,
    /// Seconds an HTTP request body may stall between two pieces (past it, 408).
    #[arg(long, default_value_t = 10.0)]
    body_idle_timeout: f64,
    /// Seconds running and queued requests get after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 25.0)]
    drain_timeout: f64,
    /// Plan threads for this many cores (default: the machine's).
    #[arg(long)]
    cores: Option<usize>,
}

fn addr(s: &str, flag: &str) -> anyhow::Result<Option<SocketAddr>> {
    if s == "none" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .with_context(|| format!("--{flag} {s}: expected HOST:PORT (an IP address) or none"))
}

fn secs(x: f64, flag: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(x)
        .ok()
        .filter(|_| x > 0.0)
        .with_context(|| format!("--{flag} {x}: expected a positive number of seconds"))
}

/// The id `/v1/models` lists: `qwen3-tts-12hz-0.6b-customvoice`, ...
fn model_id(info: &qtts::engine::EngineInfo) -> String {
    let size = match info.size.as_str() {
        "0b6" => "0.6b".to_string(),
        "1b7" => "1.7b".to_string(),
        other => other.to_string(),
    };
    format!("qwen3-tts-12hz-{size}-{}", info.model_type.replace('_', ""))
}

/// A panic the server survives (one caught around a request's work) is logged as one line, not
/// a backtrace per request.
fn log_panics_in_one_line() {
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        eprintln!(
            "qtts serve: internal error{at}: {}; the request it hit got an error (please report this)",
            msg.replace('\n', " ")
        );
    }));
}

/// Runs the server until SIGTERM or Ctrl-C.
pub fn run(a: &ServeArgs) -> anyhow::Result<()> {
    use qtts::engine::{EngineConfig, ThreadPlan, Worker};
    log_panics_in_one_line();
    let http = addr(&a.http, "http")?;
    let wyoming = addr(&a.wyoming, "wyoming")?;
    anyhow::ensure!(
        http.is_some() || wyoming.is_some(),
        "--http none and --wyoming none: nothing to serve"
    );
    anyhow::ensure!(
        a.queue >= 1,
        "--queue 0: at least 1 request must be able to wait"
    );
    let limits = qtts_serve::Limits {
        max_input_chars: a.max_input_chars,
        max_frames: a.max_frames,
        max_audio_seconds: a.max_audio_seconds,
        queue_timeout: secs(a.queue_timeout, "queue-timeout")?,
        buffer_seconds: a.buffer_seconds,
        write_stall: secs(a.write_stall_timeout, "write-stall-timeout")?,
    };
    anyhow::ensure!(
        a.buffer_seconds > 0.0 && a.max_audio_seconds > 0.0,
        "--buffer-seconds and --max-audio-seconds must be above 0"
    );
    let model = crate::pick_model(a.model.as_deref(), false)?;
    let cores = a.cores.unwrap_or_else(ThreadPlan::available_cores);
    let max_streams = a
        .max_streams
        .unwrap_or_else(|| EngineConfig::serve_streams_for(qtts::kernels::active(), cores));
    anyhow::ensure!(
        (1..=qtts::code_predictor::MAX_ROWS).contains(&max_streams),
        "--max-streams {max_streams}: expected 1 to {}",
        qtts::code_predictor::MAX_ROWS
    );
    let config = EngineConfig {
        plan: ThreadPlan::default_for(cores),
        max_streams,
        ..EngineConfig::default()
    };
    let threads = config.plan.all_cores().len().max(1);
    let worker = Worker::load(&model.files, config, a.queue).context("loading the engine")?;
    let voices = match &a.voices {
        Some(dir) => {
            let mm = qtts::gguf::GgufFile::open(&model.files.mmproj)?;
            qtts_serve::voices::Voices::load(dir, worker.info(), Some(&mm))?
        }
        None => Default::default(),
    };
    let id = model_id(worker.info());
    let base = worker.info().model_type == "base";
    let mut svc = qtts_serve::Service::new(worker, limits, voices, id, model.description.clone())
        .with_text_mode(a.text_mode);
    if base {
        let cloner = qtts_serve::clone::RefCloner::new(model.files.clone(), threads)
            .context("opening the model's voice encoders for ref_audio")?;
        svc = svc.with_cloner(cloner);
    }
    let svc = std::sync::Arc::new(svc);
    let opts = qtts_serve::Options {
        http,
        wyoming,
        http_options: qtts_serve::http::HttpOptions {
            api_key: a.api_key.clone(),
            strict_model: a.strict_model,
            overload_429: a.overload_429,
            body_times: qtts_serve::http::BodyTimes {
                whole: secs(a.body_timeout, "body-timeout")?,
                idle: secs(a.body_idle_timeout, "body-idle-timeout")?,
            },
        },
        drain_timeout: secs(a.drain_timeout, "drain-timeout")?,
        no_warmup: false,
    };
    qtts_serve::run(svc, opts, |bound| {
        use std::io::Write;
        // The one line on stdout: scripts and tests wait for it.
        println!("{bound}");
        let _ = std::io::stdout().flush();
    })?;
    eprintln!("qtts serve: stopped");
    Ok(())
}
