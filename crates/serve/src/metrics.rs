//! `/metrics`: the server's counters and histograms in the OpenMetrics text format
//! (prometheus-client), fed by each finished request's [`qtts::engine::Summary`].

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The `Content-Type` of `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of `qtts_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `http` or `wyoming`.
    pub frontend: &'static str,
    /// The response format (`pcm`, `mp3`, ...; `wyoming` for Wyoming).
    pub format: &'static str,
    /// The HTTP status, or `ok` / an error code for Wyoming.
    pub code: String,
}

/// A reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    /// Why.
    pub reason: &'static str,
}

/// Labels of `qtts_requests_cancelled_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CancelLabels {
    /// `client_disconnect`, `slow_client`, `audio_limit`, `shutdown`.
    pub reason: &'static str,
    /// `http` or `wyoming`.
    pub frontend: &'static str,
}

/// A stage label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Stage {
    /// The engine stage: `talker_prefill`, `talker_step`, `talker_wait`, `cp_frame`,
    /// `cp_send_wait`, `decoder_frame`, `decoder_wait`, `decoder_claim` (µs histograms of
    /// [`qtts::metrics::Metrics`], in seconds).
    pub stage: &'static str,
}

/// How a request ended, as metrics and SSE usage name it: `eos`, `frame_cap`, `cancelled`.
pub fn stop_label(stop: &qtts::talker::StopReason) -> &'static str {
    stop.name()
}

/// Every metric the server exports.
#[derive(Debug)]
pub struct ServerMetrics {
    registry: Registry,
    /// Requests answered, by front end, format and status.
    pub requests: Family<RequestLabels, Counter>,
    /// Requests running in the engine (its busy slots, up to `--max-streams`).
    pub running: Gauge,
    /// Requests in the queue.
    pub waiting: Gauge,
    /// Running plus waiting: the autoscaling signal.
    pub in_flight: Gauge,
    /// Requests refused before they ran.
    pub rejected: Family<Reason, Counter>,
    /// Requests stopped before their end.
    pub cancelled: Family<CancelLabels, Counter>,
    /// Requests cancelled while still queued (they never ran).
    pub queue_abandoned: Counter,
    /// How requests ended in the engine.
    pub stop_reason: Family<Reason, Counter>,
    /// Errors, by kind.
    pub errors: Family<Reason, Counter>,
    /// Admission to the first audio handed to the front end.
    pub ttfa: Histogram,
    /// Admission to the start in the engine.
    pub queue_wait: Histogram,
    /// Admission to the end.
    pub duration: Histogram,
    /// Generation time over audio time, per request.
    pub rtf: Histogram,
    /// Seconds of audio made.
    pub audio_seconds: Counter<f64, AtomicU64>,
    /// Frames made.
    pub frames: Counter,
    /// Non-finite samples the decoder replaced by 0.
    pub non_finite: Counter,
    /// Chunks that reached the front end after the audio sent before them had played out (a
    /// real-time listener would have heard a gap): the server's underruns.
    pub late_chunks: Counter,
    /// Per request (per slot while it runs), the most its chunks came after the audio before
    /// them had played out, seconds (0 when none did): the player buffer its listener needed,
    /// counted from the first chunk's arrival.
    pub lateness: Histogram,
    /// Engine stage latencies.
    pub stages: Family<Stage, Histogram>,
    /// The talker's steps by batch size (`streams`: requests in the step), as the requests saw
    /// them: a step of n streams counts once in each of its n requests.
    pub batch_steps: Family<Streams, Counter>,
    /// Their summed time, seconds: over `batch_steps`, the mean step time by batch size.
    pub batch_step_seconds: Family<Streams, Counter<f64, AtomicU64>>,
}

/// A batch size label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Streams {
    /// Requests in the talker's step.
    pub streams: u64,
}

fn stage_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28,
    ])
}

impl ServerMetrics {
    /// The metrics, registered, with the model's description in `qtts_model_info`.
    pub fn new(model: &qtts::engine::EngineInfo, description: &str) -> ServerMetrics {
        let mut registry = Registry::with_prefix("qtts");
        let m = ServerMetrics {
            requests: Family::default(),
            running: Gauge::default(),
            waiting: Gauge::default(),
            in_flight: Gauge::default(),
            rejected: Family::default(),
            cancelled: Family::default(),
            queue_abandoned: Counter::default(),
            stop_reason: Family::default(),
            errors: Family::default(),
            ttfa: Histogram::new([
                0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
            ]),
            queue_wait: Histogram::new([
                0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
            ]),
            duration: Histogram::new([0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0]),
            rtf: Histogram::new([0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0]),
            audio_seconds: Counter::default(),
            frames: Counter::default(),
            non_finite: Counter::default(),
            late_chunks: Counter::default(),
            lateness: Histogram::new([0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0]),
            stages: Family::new_with_constructor(stage_histogram),
            batch_steps: Family::default(),
            batch_step_seconds: Family::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register("requests", "Requests answered", m.requests.clone());
        r.register(
            "requests_running",
            "Requests running in the engine (busy slots, up to --max-streams)",
            m.running.clone(),
        );
        r.register(
            "requests_waiting",
            "Requests waiting in the queue",
            m.waiting.clone(),
        );
        r.register(
            "requests_in_flight",
            "Requests running or waiting (scale on this)",
            m.in_flight.clone(),
        );
        r.register(
            "requests_rejected",
            "Requests refused before they ran",
            m.rejected.clone(),
        );
        r.register(
            "requests_cancelled",
            "Requests stopped before their end",
            m.cancelled.clone(),
        );
        r.register(
            "queue_abandoned",
            "Requests cancelled while queued (never ran)",
            m.queue_abandoned.clone(),
        );
        r.register(
            "stop_reason",
            "How requests ended in the engine",
            m.stop_reason.clone(),
        );
        r.register("errors", "Errors by kind", m.errors.clone());
        r.register(
            "time_to_first_audio_seconds",
            "Admission to the first audio handed to the front end",
            m.ttfa.clone(),
        );
        r.register(
            "queue_wait_seconds",
            "Admission to the start in the engine",
            m.queue_wait.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Admission to the end",
            m.duration.clone(),
        );
        r.register(
            "rtf",
            "Generation time over audio time per request",
            m.rtf.clone(),
        );
        r.register(
            "audio_seconds",
            "Seconds of audio made",
            m.audio_seconds.clone(),
        );
        r.register("frames", "Codec frames made (80 ms each)", m.frames.clone());
        r.register(
            "non_finite_samples",
            "Non-finite samples replaced by 0",
            m.non_finite.clone(),
        );
        r.register(
            "late_chunks",
            "Chunks that came after the audio before them had played out in real time",
            m.late_chunks.clone(),
        );
        r.register(
            "request_lateness_seconds",
            "Per request, the most a chunk came after the audio before it had played out in \
             real time (the player buffer its listener needed; 0: none late)",
            m.lateness.clone(),
        );
        r.register(
            "stage_seconds",
            "Engine stage latencies (from its HdrHistograms, 3 significant digits)",
            m.stages.clone(),
        );
        r.register(
            "talker_batch_steps",
            "Talker steps by batch size (a step of n streams counts in each of its n requests)",
            m.batch_steps.clone(),
        );
        r.register(
            "talker_batch_step_seconds",
            "Summed time of those steps: over talker_batch_steps, the mean step by batch size",
            m.batch_step_seconds.clone(),
        );
        r.register(
            "model",
            "The model served",
            Info::new(vec![
                ("type", model.model_type.to_string()),
                ("size", model.size.clone()),
                ("description", description.to_string()),
            ]),
        );
        r.register(
            "build",
            "This server",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION").to_string())]),
        );
        ServerMetrics { registry, ..m }
    }

    /// Counts a request of front end `frontend` in `format` answered `code` (an HTTP status or
    /// an error code).
    pub fn count_request(&self, frontend: &'static str, format: &'static str, code: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                frontend,
                format,
                code: code.to_owned(),
            })
            .inc();
    }

    /// Adds a finished request's engine figures.
    pub fn record_summary(&self, s: &qtts::engine::Summary) {
        self.frames.inc_by(s.frames as u64);
        self.non_finite.inc_by(s.non_finite);
        let audio = s.samples as f64 / f64::from(qtts::audio::SAMPLE_RATE);
        self.audio_seconds.inc_by(audio);
        if audio > 0.0 {
            self.rtf.observe(s.generated.as_secs_f64() / audio);
        }
        let reason = stop_label(&s.stop);
        self.stop_reason.get_or_create(&Reason { reason }).inc();
        let m = &s.metrics;
        for (i, &(steps, micros)) in m.steps_by_streams.iter().enumerate() {
            if steps > 0 {
                let label = Streams {
                    streams: i as u64 + 1,
                };
                self.batch_steps.get_or_create(&label).inc_by(steps);
                self.batch_step_seconds
                    .get_or_create(&label)
                    .inc_by(micros as f64 / 1e6);
            }
        }
        let stages = [
            ("talker_prefill", &m.talker_prefill),
            ("talker_step", &m.talker_step),
            ("talker_wait", &m.talker_wait),
            ("cp_frame", &m.code_predictor_frame),
            ("cp_send_wait", &m.code_predictor_send_wait),
            ("decoder_frame", &m.decoder_frame),
            ("decoder_wait", &m.decoder_wait),
            ("decoder_claim", &m.decoder_claim),
        ];
        for (name, h) in stages {
            let family = self.stages.get_or_create(&Stage { stage: name });
            for v in h.iter_recorded() {
                let secs = v.value_iterated_to() as f64 / 1e6;
                for _ in 0..v.count_at_value() {
                    family.observe(secs);
                }
            }
        }
    }

    /// The text of `/metrics`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
