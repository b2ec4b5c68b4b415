//! `qtts bench --streams`: several listeners on one engine (continuous batching). Each stream
//! is a request of the bench's text played by a paced device of its own from its first sample
//! (after the prebuffer), counting underruns; stream `k` starts `k` staggers after the first, so
//! the last one joins a batch of all the others. The same requests one after the other on an
//! engine of one stream are the baseline, measured in the same `qtts bench` run.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use qtts::audio::{ring, AudioError, AudioSink, PacedDevice, RingSink, FRAME_SAMPLES, SAMPLE_RATE};
use qtts::engine::{Engine, EngineConfig, Request};
use qtts::metrics::Metrics;
use qtts::model::ModelFiles;

use crate::bench::{peak_rss_bytes, stage_stats, StageStat, MIB, PERIOD_SAMPLES, TEXT};

/// One stream of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamStat {
    /// When it started, after the first, ms.
    pub joined_ms: f64,
    /// Its generation time over its audio.
    pub rtf: f64,
    /// Time to its first audio from its start, ms.
    pub ttfa_ms: f64,
    /// Device periods (20 ms) its listener found empty after its first sample.
    pub underruns: u64,
}

/// What a run of several streams gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamsReport {
    /// Streams.
    pub streams: usize,
    /// One after the other on an engine of one stream (the baseline), or all at once.
    pub sequential: bool,
    /// Each stream, in start order.
    pub each: Vec<StreamStat>,
    /// Audio made per second of wall time, from the first start to the last end.
    pub audio_per_wall: f64,
    /// The process's peak resident set, MiB.
    pub peak_rss_mib: f64,
    /// Stage percentiles over every stream's requests.
    pub stages: Vec<StageStat>,
    /// Talker steps by the streams in them: (streams, steps).
    pub batch_sizes: Vec<(u64, u64)>,
}

/// A ring sink whose end does not wait for the playout (the engine's decoder serves the other
/// streams meanwhile); the bench waits for it on the player's side.
struct PlayOn(RingSink);

impl AudioSink for PlayOn {
    fn begin(&mut self) -> Result<(), AudioError> {
        self.0.begin()
    }

    fn write(
        &mut self,
        pcm: &[f32],
        cancel: &std::sync::atomic::AtomicBool,
    ) -> Result<(), AudioError> {
        self.0.write(pcm, cancel)
    }

    fn end(&mut self, _cancel: &std::sync::atomic::AtomicBool) -> Result<(), AudioError> {
        self.0.end_unwaited();
        Ok(())
    }

    fn queued_ms(&self) -> Option<f64> {
        self.0.queued_ms()
    }
}

/// Requests of a forced length in the default speaker's voice: random weights may sample
/// end-of-speech at any frame, so the benches force the frame count.
pub struct Forced {
    speaker: Option<String>,
}

impl Forced {
    /// `req` in the default speaker's voice, in English, of exactly `frames` frames, seeded.
    pub fn request(&self, mut req: Request, frames: usize, seed: u64) -> Request {
        req.voice.speaker = self.speaker.clone();
        req.voice.language = Some("english".into());
        req.max_frames = Some(frames);
        req.min_frames = frames;
        req.seed = seed;
        req
    }
}

/// Loads an engine for a bench of a model with speakers (`flag` names the bench's option in
/// the refusal of a Base model) and warms it up with one short request.
pub fn speaking_engine(
    files: &ModelFiles,
    config: EngineConfig,
    flag: &str,
) -> anyhow::Result<(Engine, Forced)> {
    let engine = Engine::load(files, config)?;
    anyhow::ensure!(
        engine.info().model_type != "base",
        "{flag} measures a model with speakers (CustomVoice or VoiceDesign)"
    );
    let forced = Forced {
        speaker: engine.info().default_speaker().map(str::to_owned),
    };
    let warm = forced.request(Request::text(TEXT), crate::bench::WARMUP_FRAMES, 0);
    let (done, _) = engine
        .start(warm, Box::new(qtts::audio::MemorySink::default()))
        .wait();
    done?;
    Ok((engine, forced))
}

/// Loads an engine of `streams` streams (one with `sequential`) and speaks `streams` requests of
/// `frames` frames, started `stagger` apart (one after the other's end with `sequential`).
pub fn measure(
    files: &ModelFiles,
    config: EngineConfig,
    streams: usize,
    frames: usize,
    prebuffer_ms: f64,
    stagger: Duration,
    sequential: bool,
) -> anyhow::Result<StreamsReport> {
    let streams = streams.max(1);
    let config = EngineConfig {
        max_streams: if sequential { 1 } else { streams },
        ..config
    };
    let (engine, forced) = speaking_engine(files, config, "--streams")?;
    let request = |frames: usize, seed: u64| forced.request(Request::text(TEXT), frames, seed);
    let capacity_ms = (frames * FRAME_SAMPLES) as f64 * 1e3 / SAMPLE_RATE as f64 + 1000.0;
    let t0 = Instant::now();
    let mut running = Vec::new();
    let mut done = Vec::new();
    for k in 0..streams {
        if !sequential {
            let at = stagger * k as u32;
            if let Some(wait) = at.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let (sink, player) = ring(capacity_ms, prebuffer_ms);
        let device = PacedDevice::start(player, PERIOD_SAMPLES, false);
        let joined = t0.elapsed();
        let s = engine.start(request(frames, 1 + k as u64), Box::new(PlayOn(sink)));
        if sequential {
            let (summary, _) = s.wait();
            done.push((joined, summary?, device));
        } else {
            running.push((joined, s, device));
        }
    }
    for (joined, s, device) in running {
        let (summary, _) = s.wait();
        done.push((joined, summary?, device));
    }
    let mut metrics = Metrics::default();
    let (mut audio_s, mut end) = (0.0, Duration::ZERO);
    let mut each = Vec::new();
    for (joined, summary, device) in done {
        // The listener plays its stream out.
        let shared = device.shared();
        while !shared.is_idle() {
            std::thread::sleep(Duration::from_millis(10));
        }
        audio_s += summary.audio_seconds();
        end = end.max(joined + summary.elapsed);
        metrics.merge(&summary.metrics);
        each.push(StreamStat {
            joined_ms: joined.as_secs_f64() * 1e3,
            rtf: summary.generated.as_secs_f64() / summary.audio_seconds().max(1e-9),
            ttfa_ms: summary.ttfa.unwrap_or_default().as_secs_f64() * 1e3,
            underruns: shared.underruns(),
        });
    }
    let batch_sizes = (1..=streams as u64)
        .map(|n| (n, metrics.streams.count_between(n, n)))
        .filter(|&(_, c)| c > 0)
        .collect();
    Ok(StreamsReport {
        streams,
        sequential,
        each,
        audio_per_wall: audio_s / end.as_secs_f64().max(1e-9),
        peak_rss_mib: peak_rss_bytes().unwrap_or(0) as f64 / MIB,
        stages: stage_stats(&metrics),
        batch_sizes,
    })
}

/// The table of `qtts bench --streams`: per run, the streams' worst RTF and underruns, the
/// joining streams' TTFA, the aggregate, and the ratio to the baseline's aggregate.
pub fn table(rows: &[(String, StreamsReport)]) -> String {
    let mut s = format!(
        "{:<40} {:>3} {:>9} {:>9} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8}\n",
        "configuration",
        "n",
        "RTF max",
        "underrun",
        "join p50",
        "join max",
        "audio/s",
        "x seq",
        "step p50",
        "peak MiB"
    );
    for (label, r) in rows {
        let base = rows
            .iter()
            .find(|(l, b)| l == label && b.sequential && b.streams == r.streams)
            .map(|(_, b)| b.audio_per_wall);
        let rtf = r.each.iter().map(|e| e.rtf).fold(0.0, f64::max);
        let underruns: u64 = r.each.iter().map(|e| e.underruns).sum();
        let joins: Vec<f64> = r.each.iter().skip(1).map(|e| e.ttfa_ms).collect();
        let p50 = if joins.is_empty() {
            r.each.first().map_or(0.0, |e| e.ttfa_ms)
        } else {
            crate::bench::median(joins.clone())
        };
        let max = joins.iter().copied().fold(p50, f64::max);
        let step = r
            .stages
            .iter()
            .find(|st| st.name == "talker step")
            .map_or(0.0, |st| st.p50_ms);
        s += &format!(
            "{:<40} {:>3} {:>9.2} {:>9} {:>8.0}ms {:>8.0}ms {:>10.2} {:>8} {:>6.1}ms {:>8.0}\n",
            format!(
                "{label}{}",
                if r.sequential { " one at a time" } else { "" }
            ),
            r.streams,
            rtf,
            underruns,
            p50,
            max,
            r.audio_per_wall,
            base.map_or("-".into(), |b| format!(
                "{:.2}",
                r.audio_per_wall / b.max(1e-9)
            )),
            step,
            r.peak_rss_mib
        );
    }
    s
}
