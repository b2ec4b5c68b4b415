//! The real-time measurement of issue 7: one request through a real-time-paced sink, with its
//! real-time factor, time to first audio, underruns, peak RSS and per-stage percentiles; medians
//! over repeated runs; and the one table `qtts bench` prints.
//!
//! A run ([`measure_in`]) loads an [`Engine`], synthesizes a short warm-up request (the first touch of
//! the memory-mapped weights is load cost, not synthesis cost), then the measured request. Its
//! audio goes into a ring played by a [`PacedDevice`] in real time, 20 ms periods, after a
//! prebuffer; the ring holds the whole utterance, so production is never throttled by playback
//! and the RTF is the engine's own. Random weights never emit EOS, so the frame count is forced.
//!
//! Peak RSS is the process's high-water mark (`VmHWM`), so each run belongs in its own process:
//! `qtts bench` starts `qtts bench-run` once per (run, configuration).
//!
//! A run longer than [`MINUTE_FRAMES`] (one utterance cannot outlast the talker's context) is a
//! soak: requests of one minute each, one after the other into the same ring and device, each
//! starting when the previous one has played (as utterances spoken live one after another); the
//! report then also has each minute's stage percentiles and the resident set (`VmRSS`) after the
//! warm-up and at the end, to show whether anything grows.

use serde::{Deserialize, Serialize};

use qtts::audio::{ring, PacedDevice, FRAME_SAMPLES, SAMPLE_RATE};
use qtts::engine::{Engine, EngineConfig, Request};
use qtts::metrics::Metrics;
use qtts::model::ModelFiles;

/// Device period of the paced sink: 20 ms (480 samples), a common audio-server period.
pub const PERIOD_SAMPLES: usize = 480;

/// Frames of the warm-up request.
pub const WARMUP_FRAMES: usize = 4;

/// The text of every measured request (streaming-text mode; the frame count is forced).
pub const TEXT: &str = "The quick brown fox jumps over the lazy dog, twice.";

/// Frames of one request of a soak (60 s of audio; see the module's documentation).
pub const MINUTE_FRAMES: usize = 750;

/// The stages reported per run, as [`Metrics::named`] names them.
pub const STAGES: [&str; 4] = [
    "talker step",
    "code predictor frame",
    "decoder frame",
    "talker prefill",
];

/// One stage's percentiles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageStat {
    /// The histogram's name in [`Metrics::named`].
    pub name: String,
    /// Median, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
}

/// What one measured request gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Frames produced.
    pub frames: usize,
    /// Seconds of audio.
    pub audio_s: f64,
    /// Request to the last sample written, over the audio's duration.
    pub rtf: f64,
    /// Request to the first sample in the sink, ms.
    pub ttfa_ms: f64,
    /// The same for the warm-up request, the engine's first: mapped weights not yet touched and
    /// no prompt rows to reuse, ms.
    #[serde(default)]
    pub first_ttfa_ms: f64,
    /// Device periods that found the ring short after playback started.
    pub underruns: u64,
    /// Device periods played in all.
    pub periods: u64,
    /// The largest over the measured requests of the buffer a player starting at the first
    /// sample needs for no gap ([`qtts::engine::Playout`]), ms: what the bench's fixed prebuffer
    /// hides.
    #[serde(default)]
    pub gap_free_buffer_ms: f64,
    /// The process's peak resident set (`VmHWM`) at the end, MiB.
    pub peak_rss_mib: f64,
    /// Percentiles of [`STAGES`].
    pub stages: Vec<StageStat>,
    /// The kernel tier the run used ([`qtts::kernels::active`]).
    #[serde(default)]
    pub tier: String,
    /// A soak's resident set after the warm-up and at the end, MiB (`VmRSS`; 0 where there is
    /// none).
    #[serde(default)]
    pub rss_start_mib: f64,
    /// See `rss_start_mib`.
    #[serde(default)]
    pub rss_end_mib: f64,
    /// A soak's minutes (one request each), in order; empty for a run of one request.
    #[serde(default)]
    pub minutes: Vec<Minute>,
    /// Base models: the cloned voice every request speaks with.
    #[serde(default)]
    pub clone: Option<CloneReport>,
    /// Time to first audio of one more request, after the measured one, with the same voice and
    /// another text ([`OTHER_TEXT`]): only the prompt rows before the text are reused, ms.
    #[serde(default)]
    pub other_text_ttfa_ms: f64,
}

/// The text of the request after the measured one (`other_text_ttfa_ms`).
pub const OTHER_TEXT: &str = "A different sentence, so the prompt's text rows are new.";

/// Cloning on a Base model ([`measure_in`]): a synthetic speech-like reference of
/// [`CLONE_REFERENCE_S`] seconds and transcript [`CLONE_TEXT`] is encoded, then spoken with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloneReport {
    /// The reference's length, s.
    pub reference_s: f64,
    /// Both encoders over it (speaker encoder and codec encoder), ms.
    pub encode_ms: f64,
    /// Reference frames in the prompt.
    pub reference_frames: usize,
    /// Time to first audio of the first request with it (the decoder primed by decoding the
    /// reference, the whole in-context prompt prefilled), ms.
    pub fresh_ttfa_ms: f64,
    /// That request's RTF ([`CLONE_FRESH_FRAMES`] frames).
    pub fresh_rtf: f64,
    /// Time to first audio of a request with another text in the non-official trailing layout
    /// (`TextMode::Trailing`), after one with the measured text in it: the whole prompt is
    /// reused, ms.
    #[serde(default)]
    pub trailing_other_text_ttfa_ms: f64,
}

/// Seconds of the bench's clone reference.
pub const CLONE_REFERENCE_S: f64 = 10.0;
/// Its transcript (about 3 tokens a second, as speech has).
pub const CLONE_TEXT: &str =
    "This is the voice we are cloning today, speaking a few calm sentences for the encoder.";
/// Frames of the first request with a fresh reference.
pub const CLONE_FRESH_FRAMES: usize = 25;

/// A deterministic speech-like signal at 24 kHz: harmonics of a vibrato f0 gliding over 110–220
/// Hz, amplitude-modulated at syllable rate, with noise 30 dB down (what the encoders' cost does
/// not depend on, but a realistic level range).
pub fn speech_like(seconds: f64) -> Vec<f32> {
    let n = (seconds * SAMPLE_RATE as f64) as usize;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut phase = 0.0f64;
    (0..n)
        .map(|i| {
            let t = i as f64 / SAMPLE_RATE as f64;
            let f0 = 165.0
                + 55.0 * (std::f64::consts::TAU * 0.3 * t).sin()
                + 4.0 * (std::f64::consts::TAU * 5.5 * t).sin();
            phase += std::f64::consts::TAU * f0 / SAMPLE_RATE as f64;
            let voice: f64 = (1..=12).map(|h| (h as f64 * phase).sin() / h as f64).sum();
            let am = 0.5 + 0.5 * (std::f64::consts::TAU * 4.0 * t).sin().abs();
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let noise = (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
            (0.3 * am * voice + 0.03 * noise) as f32
        })
        .collect()
}

/// Clones [`speech_like`] with the model's encoders, timed.
fn clone_voice(
    files: &ModelFiles,
    threads: usize,
) -> Result<(qtts::voice::ClonedVoice, f64), qtts::voice::VoiceError> {
    let reference = speech_like(CLONE_REFERENCE_S);
    let mut cloner = qtts::voice::Cloner::load(files, threads)?;
    let t = std::time::Instant::now();
    let v = cloner.clone_voice(&reference, Some(CLONE_TEXT))?;
    Ok((v, t.elapsed().as_secs_f64() * 1e3))
}

/// One minute (one request) of a soak.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Minute {
    /// The resident set when its audio had played, MiB (`VmRSS`).
    pub rss_mib: f64,
    /// Its stage percentiles.
    pub stages: Vec<StageStat>,
}

/// The process's peak resident set in bytes, from `/proc/self/status` (`None` where there is none).
pub fn peak_rss_bytes() -> Option<u64> {
    status_kib("VmHWM:").map(|k| k * 1024)
}

/// The process's resident set now, in bytes (`VmRSS`; `None` where there is none).
pub fn rss_bytes() -> Option<u64> {
    status_kib("VmRSS:").map(|k| k * 1024)
}

fn status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

pub const MIB: f64 = 1024.0 * 1024.0;

pub fn stage_stats(m: &Metrics) -> Vec<StageStat> {
    let ms = |us: u64| us as f64 / 1e3;
    STAGES
        .iter()
        .filter_map(|&want| {
            let (name, h) = m.named().into_iter().find(|(n, _)| *n == want)?;
            (!h.is_empty()).then(|| StageStat {
                name: name.to_string(),
                p50_ms: ms(h.value_at_quantile(0.5)),
                p99_ms: ms(h.value_at_quantile(0.99)),
            })
        })
        .collect()
}

/// Loads the engine and measures `frames` frames played in real time after `prebuffer_ms` of
/// audio (see the module's documentation): one request, or, for a run longer than
/// `request_frames`, a soak of requests of that many frames ([`MINUTE_FRAMES`] by default).
pub fn measure_in(
    files: &ModelFiles,
    config: EngineConfig,
    frames: usize,
    request_frames: usize,
    prebuffer_ms: f64,
) -> anyhow::Result<RunReport> {
    let request_frames = request_frames.max(1);
    let threads = config.plan.all_cores().len().max(1);
    let mut engine = Engine::load(files, config)?;
    let speaker = engine.info().default_speaker().map(str::to_owned);
    // Base models speak with a cloned voice: encoded here (timed), then a warm-up with its
    // x-vector alone, a first request with the whole voice (the fresh reference), then the
    // measured requests with it (the decoder primed from the snapshot, the voice's prompt rows
    // reused).
    let cloned = if engine.info().model_type == "base" {
        let (v, encode_ms) = clone_voice(files, threads)?;
        let mm = qtts::gguf::GgufFile::open(&files.mmproj)?;
        let lang = Some("english".to_string());
        let mut xvector_only = v.clone();
        xvector_only.codes.clear();
        xvector_only.text = None;
        Some((
            qtts::voice::speaking_voice(&mm, &v, lang.clone())?,
            qtts::voice::speaking_voice(&mm, &xvector_only, lang)?,
            encode_ms,
            v.codes.len(),
        ))
    } else {
        None
    };
    let request = |frames: usize| {
        let mut req = Request::text(TEXT);
        req.voice.speaker = speaker.clone();
        req.voice.language = Some("english".into());
        if let Some((voice, ..)) = &cloned {
            req.voice = voice.clone();
        }
        req.max_frames = Some(frames);
        // Random weights may sample end-of-speech: the frame count is forced.
        req.min_frames = frames;
        req.seed = 1;
        req
    };
    let mut warmup = request(WARMUP_FRAMES);
    if let Some((_, xvector_only, ..)) = &cloned {
        warmup.voice = xvector_only.clone();
    }
    let (summary, _) = engine
        .synthesize(warmup, Box::new(qtts::audio::MemorySink::default()))
        .wait();
    let first_ttfa_ms = summary?.ttfa.unwrap_or_default().as_secs_f64() * 1e3;
    let clone = match &cloned {
        None => None,
        Some((_, _, encode_ms, reference_frames)) => {
            let (summary, _) = engine
                .synthesize(
                    request(CLONE_FRESH_FRAMES),
                    Box::new(qtts::audio::MemorySink::default()),
                )
                .wait();
            let s = summary?;
            Some(CloneReport {
                reference_s: CLONE_REFERENCE_S,
                encode_ms: *encode_ms,
                reference_frames: *reference_frames,
                fresh_ttfa_ms: s.ttfa.unwrap_or_default().as_secs_f64() * 1e3,
                fresh_rtf: s.generated.as_secs_f64() / s.audio_seconds().max(1e-9),
                // Measured after the measured requests (below).
                trailing_other_text_ttfa_ms: 0.0,
            })
        }
    };
    let rss_start = rss_bytes().unwrap_or(0) as f64 / MIB;
    // One request, or a soak of one-minute requests back to back.
    let parts: Vec<usize> = if frames > request_frames {
        (0..frames)
            .step_by(request_frames)
            .map(|f| (frames - f).min(request_frames))
            .collect()
    } else {
        vec![frames]
    };
    // The ring holds a whole request and a second more: the engine never waits for playback
    // within a request (and a request starts when the previous one has played, below).
    let longest = parts.iter().copied().max().unwrap_or(frames);
    let capacity_ms = (longest * FRAME_SAMPLES) as f64 * 1e3 / SAMPLE_RATE as f64 + 1000.0;
    let (sink, player) = ring(capacity_ms, prebuffer_ms);
    let device = PacedDevice::start(player, PERIOD_SAMPLES, false);
    let shared = device.shared();
    // Each request ends when its audio has played (the ring's `end`), as utterances spoken one
    // after another live; the RTF sums each one's generation only.
    let mut sink: Box<dyn qtts::audio::AudioSink> = Box::new(sink);
    let (mut metrics, mut minutes) = (Metrics::default(), Vec::new());
    let (mut produced, mut audio_s, mut ttfa_ms, mut generating) = (0, 0.0, None, 0.0);
    let mut gap_free_buffer_ms: f64 = 0.0;
    for n in &parts {
        let (summary, back) = engine.synthesize(request(*n), sink).wait();
        sink = back;
        let summary = summary?;
        ttfa_ms.get_or_insert(summary.ttfa.unwrap_or_default().as_secs_f64() * 1e3);
        produced += summary.frames;
        audio_s += summary.audio_seconds();
        gap_free_buffer_ms =
            gap_free_buffer_ms.max(summary.playout.gap_free_buffer().as_secs_f64() * 1e3);
        generating += summary.generated.as_secs_f64();
        metrics.merge(&summary.metrics);
        if parts.len() > 1 {
            minutes.push(Minute {
                rss_mib: rss_bytes().unwrap_or(0) as f64 / MIB,
                stages: stage_stats(&summary.metrics),
            });
        }
    }
    drop(device);
    let other_text_ttfa_ms = {
        let mut req = request(CLONE_FRESH_FRAMES);
        req.input = qtts::talker::TextInput::Text(OTHER_TEXT.into());
        let (summary, _) = engine
            .synthesize(req, Box::new(qtts::audio::MemorySink::default()))
            .wait();
        summary?.ttfa.unwrap_or_default().as_secs_f64() * 1e3
    };
    // The trailing layout: a request with the measured text makes its prompt (the voice's
    // alone), then one with another text reuses it whole.
    let mut clone = clone;
    if let Some(c) = clone.as_mut() {
        let mut ttfa_ms = 0.0;
        for text in [TEXT, OTHER_TEXT] {
            let mut req = request(CLONE_FRESH_FRAMES);
            req.input = qtts::talker::TextInput::Text(text.into());
            req.mode = qtts::talker::TextMode::Trailing;
            let (summary, _) = engine
                .synthesize(req, Box::new(qtts::audio::MemorySink::default()))
                .wait();
            ttfa_ms = summary?.ttfa.unwrap_or_default().as_secs_f64() * 1e3;
        }
        c.trailing_other_text_ttfa_ms = ttfa_ms;
    }
    Ok(RunReport {
        frames: produced,
        audio_s,
        rtf: if audio_s > 0.0 {
            generating / audio_s
        } else {
            0.0
        },
        ttfa_ms: ttfa_ms.unwrap_or_default(),
        first_ttfa_ms,
        underruns: shared.underruns(),
        periods: shared.periods(),
        gap_free_buffer_ms,
        peak_rss_mib: peak_rss_bytes().unwrap_or(0) as f64 / MIB,
        tier: qtts::kernels::active().name().to_string(),
        stages: stage_stats(&metrics),
        rss_start_mib: if parts.len() > 1 { rss_start } else { 0.0 },
        rss_end_mib: if parts.len() > 1 {
            rss_bytes().unwrap_or(0) as f64 / MIB
        } else {
            0.0
        },
        minutes,
        clone,
        other_text_ttfa_ms,
    })
}

/// The median of `v` (the upper one of an even count); `NaN` when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The medians over the runs of one configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Medians {
    /// Runs measured.
    pub runs: usize,
    /// Median RTF.
    pub rtf: f64,
    /// Median time to first audio, ms.
    pub ttfa_ms: f64,
    /// Median time to first audio of the engine's first request, ms.
    pub first_ttfa_ms: f64,
    /// Median underrun count.
    pub underruns: f64,
    /// Median gap-free buffer, ms.
    pub gap_free_buffer_ms: f64,
    /// Median peak RSS, MiB.
    pub peak_rss_mib: f64,
    /// Per stage of [`STAGES`]: (name, median p50, median p99), ms.
    pub stages: Vec<(String, f64, f64)>,
    /// Base models: the medians of each of [`CloneReport`]'s figures.
    pub clone: Option<CloneReport>,
    /// Median TTFA of the request with another text, ms.
    pub other_text_ttfa_ms: f64,
}

impl Medians {
    /// The medians of `runs` (stage by stage over the runs that recorded it).
    pub fn of(runs: &[RunReport]) -> Self {
        let over = |f: &dyn Fn(&RunReport) -> f64| median(runs.iter().map(f).collect());
        let stages = STAGES
            .iter()
            .map(|&name| {
                let of = |f: &dyn Fn(&StageStat) -> f64| {
                    median(
                        runs.iter()
                            .flat_map(|r| r.stages.iter().filter(|s| s.name == name).map(f))
                            .collect(),
                    )
                };
                (name.to_string(), of(&|s| s.p50_ms), of(&|s| s.p99_ms))
            })
            .collect();
        Medians {
            runs: runs.len(),
            rtf: over(&|r| r.rtf),
            ttfa_ms: over(&|r| r.ttfa_ms),
            first_ttfa_ms: over(&|r| r.first_ttfa_ms),
            underruns: over(&|r| r.underruns as f64),
            gap_free_buffer_ms: over(&|r| r.gap_free_buffer_ms),
            peak_rss_mib: over(&|r| r.peak_rss_mib),
            stages,
            other_text_ttfa_ms: over(&|r| r.other_text_ttfa_ms),
            clone: runs.iter().any(|r| r.clone.is_some()).then(|| {
                let c = |f: &dyn Fn(&CloneReport) -> f64| {
                    median(
                        runs.iter()
                            .filter_map(|r| r.clone.as_ref())
                            .map(f)
                            .collect(),
                    )
                };
                CloneReport {
                    reference_s: c(&|x| x.reference_s),
                    encode_ms: c(&|x| x.encode_ms),
                    reference_frames: c(&|x| x.reference_frames as f64) as usize,
                    fresh_ttfa_ms: c(&|x| x.fresh_ttfa_ms),
                    fresh_rtf: c(&|x| x.fresh_rtf),
                    trailing_other_text_ttfa_ms: c(&|x| x.trailing_other_text_ttfa_ms),
                }
            }),
        }
    }
}

/// The official package's figures on the same checkpoint (`bench_reference.py`'s JSON), the
/// fields the table uses.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReferenceReport {
    /// Frames generated.
    pub frames: usize,
    /// (generate + decode) over the audio's duration.
    pub rtf_total: f64,
    /// Prompt to the first frame's codes plus decoding one frame: what streaming would give, s.
    pub ttfa_streaming_estimate_s: f64,
    /// Talker step per frame.
    pub talker_step_ms: RefStat,
    /// Code predictor per frame.
    pub code_predictor_frame_ms: RefStat,
    /// Decoder per frame (all frames decoded at once).
    pub decode_ms_per_frame: f64,
}

/// A per-frame statistic of [`ReferenceReport`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RefStat {
    /// Median, ms.
    pub median_ms: f64,
    /// Max, ms.
    pub max_ms: f64,
}

/// One row of the table: a configuration's label and its medians.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// What was run (weights, decoder).
    pub label: String,
    /// Its medians.
    pub medians: Medians,
}

/// A soak's lines (a run of several one-minute requests, [`MINUTE_FRAMES`]): the resident set
/// after the warm-up and after each minute, and each stage's p50/p99 in the first minute and the
/// last.
/// Empty for a run of one request.
pub fn soak_lines(label: &str, r: &RunReport) -> String {
    let (Some(first), Some(last)) = (r.minutes.first(), r.minutes.last()) else {
        return String::new();
    };
    let rss: Vec<String> = r
        .minutes
        .iter()
        .map(|m| format!("{:.0}", m.rss_mib))
        .collect();
    let mut s = format!(
        "{label}: {} minutes, RSS {:.0} MiB after the warm-up, then after each minute {} MiB; \
         underruns {} of {} periods\n",
        r.minutes.len(),
        r.rss_start_mib,
        rss.join(", "),
        r.underruns,
        r.periods
    );
    for name in ["talker step", "code predictor frame", "decoder frame"] {
        let find = |m: &Minute| m.stages.iter().find(|st| st.name == name).cloned();
        if let (Some(a), Some(b)) = (find(first), find(last)) {
            s += &format!(
                "  {name:<14} p50/p99 ms: first minute {:.1}/{:.1}, last minute {:.1}/{:.1}\n",
                a.p50_ms, a.p99_ms, b.p50_ms, b.p99_ms
            );
            let each = |f: fn(&StageStat) -> f64| {
                r.minutes
                    .iter()
                    .map(|m| find(m).map_or("-".into(), |st| format!("{:.1}", f(&st))))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            s += &format!("    p50 by minute: {}\n", each(|st| st.p50_ms));
            s += &format!("    p99 by minute: {}\n", each(|st| st.p99_ms));
        }
    }
    s
}

/// The table: one line per configuration, then the reference and the ratio of its median RTF to
/// each configuration's.
pub fn table(rows: &[Row], reference: &[ReferenceReport]) -> String {
    let mut s = String::new();
    let stage_names = ["talker step", "code predictor frame", "decoder frame"];
    // The first column as wide as the longest label.
    let w = rows
        .iter()
        .map(|r| r.label.chars().count())
        .chain([22])
        .max()
        .unwrap_or(22);
    s += &format!(
        "{:<w$} {:>4} {:>7} {:>8} {:>8} {:>9} {:>9} {:>9} {:>13} {:>13} {:>13} {:>9}\n",
        "configuration",
        "runs",
        "RTF",
        "TTFA ms",
        "1st TTFA",
        "underruns",
        "buffer ms",
        "peak MiB",
        "talker p50/99",
        "cp p50/99",
        "decoder p50/99",
        "ref/ours"
    );
    let ref_rtf = median(reference.iter().map(|r| r.rtf_total).collect());
    for row in rows {
        let m = &row.medians;
        let stage = |name: &str| {
            m.stages
                .iter()
                .find(|(n, _, _)| n == name)
                .map_or("-".to_string(), |(_, p50, p99)| {
                    format!("{p50:.0}/{p99:.0}")
                })
        };
        let ratio = if reference.is_empty() {
            "-".to_string()
        } else {
            format!("{:.1}x", ref_rtf / m.rtf)
        };
        s += &format!(
            "{:<w$} {:>4} {:>7.2} {:>8.0} {:>8.0} {:>9.0} {:>9.0} {:>9.0} {:>13} {:>13} {:>13} {:>9}\n",
            row.label,
            m.runs,
            m.rtf,
            m.ttfa_ms,
            m.first_ttfa_ms,
            m.underruns,
            m.gap_free_buffer_ms,
            m.peak_rss_mib,
            stage(stage_names[0]),
            stage(stage_names[1]),
            stage(stage_names[2]),
            ratio
        );
    }
    if !reference.is_empty() {
        let med = |f: &dyn Fn(&ReferenceReport) -> f64| median(reference.iter().map(f).collect());
        s += &format!(
            "{:<w$} {:>4} {:>7.2} {:>8.0} {:>8} {:>9} {:>9} {:>9} {:>13} {:>13} {:>13} {:>9}\n",
            "reference (PyTorch)",
            reference.len(),
            ref_rtf,
            med(&|r| r.ttfa_streaming_estimate_s * 1e3),
            "-",
            "-",
            "-",
            "-",
            format!(
                "{:.0}/{:.0}",
                med(&|r| r.talker_step_ms.median_ms),
                med(&|r| r.talker_step_ms.max_ms)
            ),
            format!(
                "{:.0}/{:.0}",
                med(&|r| r.code_predictor_frame_ms.median_ms),
                med(&|r| r.code_predictor_frame_ms.max_ms)
            ),
            format!("{:.0}/-", med(&|r| r.decode_ms_per_frame)),
            "1.0x"
        );
    }
    for row in rows {
        s += &format!(
            "{}: TTFA of a request with another text after the measured one: {:.0} ms\n",
            row.label, row.medians.other_text_ttfa_ms
        );
        if let Some(c) = &row.medians.clone {
            s += &format!(
                "{}: cloning a {:.0} s reference: encode {:.0} ms; first request with it: TTFA \
                 {:.0} ms, RTF {:.2} (TTFA above: the same voice again); another text in the \
                 trailing layout (not official): TTFA {:.0} ms\n",
                row.label,
                c.reference_s,
                c.encode_ms,
                c.fresh_ttfa_ms,
                c.fresh_rtf,
                c.trailing_other_text_ttfa_ms
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rtf: f64, cp_p50: f64) -> RunReport {
        RunReport {
            frames: 10,
            audio_s: 0.8,
            rtf,
            ttfa_ms: 100.0 * rtf,
            first_ttfa_ms: 200.0 * rtf,
            underruns: rtf as u64,
            periods: 40,
            gap_free_buffer_ms: 0.0,
            peak_rss_mib: 500.0,
            stages: vec![StageStat {
                name: "code predictor frame".into(),
                p50_ms: cp_p50,
                p99_ms: 2.0 * cp_p50,
            }],
            tier: "scalar".into(),
            rss_start_mib: 0.0,
            rss_end_mib: 0.0,
            minutes: Vec::new(),
            clone: None,
            other_text_ttfa_ms: 0.0,
        }
    }

    #[test]
    fn medians_are_per_field_and_survive_missing_stages() {
        let m = Medians::of(&[report(3.0, 10.0), report(1.0, 30.0), report(2.0, 20.0)]);
        assert_eq!((m.rtf, m.ttfa_ms, m.underruns), (2.0, 200.0, 2.0));
        let cp = m
            .stages
            .iter()
            .find(|s| s.0 == "code predictor frame")
            .unwrap();
        assert_eq!((cp.1, cp.2), (20.0, 40.0));
        let talker = m.stages.iter().find(|s| s.0 == "talker step").unwrap();
        assert!(talker.1.is_nan());
    }

    #[test]
    fn the_ratio_is_the_reference_rtf_over_ours() {
        let rows = [Row {
            label: "q8_0".into(),
            medians: Medians::of(&[report(2.0, 10.0)]),
        }];
        let r: ReferenceReport = serde_json::from_str(
            r#"{"frames": 24, "rtf_total": 12.0, "ttfa_streaming_estimate_s": 1.5,
                "talker_step_ms": {"median_ms": 200.0, "max_ms": 250.0},
                "code_predictor_frame_ms": {"median_ms": 600.0, "max_ms": 700.0},
                "decode_ms_per_frame": 70.0, "extra": 1}"#,
        )
        .unwrap();
        let t = table(&rows, &[r]);
        let line = t.lines().find(|l| l.starts_with("q8_0")).unwrap();
        assert!(line.trim_end().ends_with("6.0x"), "{line}");
        assert!(t.contains("reference (PyTorch)"));
    }

    #[test]
    fn peak_rss_is_read_on_linux() {
        if cfg!(target_os = "linux") {
            let b = peak_rss_bytes().unwrap();
            assert!(b > 1024 * 1024, "{b}");
        }
    }
}
