//! A request and what comes back: [`Request`], the planned utterances, the handle of a running
//! request ([`Synthesis`], [`Canceller`]) and its [`Summary`].

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::error::EngineError;
use super::Engine;
use crate::audio::AudioSink;
use crate::metrics::Metrics;
use crate::sampling::{SamplingOverrides, SamplingParams};
use crate::talker::{
    GenOptions, Prompt, StopReason, Talker, TalkerError, TextInput, TextMode, Voice,
};
use crate::text::split::{normalize, split, Cut};

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
    /// Codebook-0 settings over [`Request::sampling`] (or the checkpoint's), one by one.
    pub overrides: SamplingOverrides,
    /// Codebooks 1..15 sampling; `None`: the checkpoint's `subtalker_*` settings.
    pub code_predictor_sampling: Option<SamplingParams>,
    /// Repetition penalty over codebook 0; `None`: the checkpoint's.
    pub repetition_penalty: Option<f32>,
    /// Seed; utterance `i` of a split text uses `seed + i`.
    pub seed: u64,
    /// Frame cap per utterance; `None`: the runaway guard scaled to its text.
    pub max_frames: Option<usize>,
    /// An upper bound on every utterance's frames that keeps the runaway guard below it (a
    /// server's cap); `max_frames`, when given, is bounded by it too.
    pub frame_limit: Option<usize>,
    /// Frames per utterance before end-of-speech may be sampled (at least
    /// [`crate::talker::MIN_FRAMES`]); with `max_frames`, forces a frame count (benches).
    pub min_frames: usize,
    /// Keep every frame's codes in the summary.
    pub keep_codes: bool,
    /// Text that arrives while it is spoken ([`super::feed`]): when set, it is the request's text
    /// and [`Request::input`] is not read.
    pub text_feed: Option<super::feed::TextFeedHandle>,
    /// When a fed request starts speaking ([`super::feed::FeedStart`]; not read without a feed).
    pub feed_start: super::feed::FeedStart,
}

impl Request {
    /// A request for `text` with the model's defaults.
    pub fn text(text: impl Into<String>) -> Self {
        Request {
            input: TextInput::Text(text.into()),
            voice: Voice::default(),
            mode: TextMode::Streaming,
            sampling: None,
            overrides: SamplingOverrides::default(),
            code_predictor_sampling: None,
            repetition_penalty: None,
            seed: 0,
            max_frames: None,
            frame_limit: None,
            min_frames: crate::talker::MIN_FRAMES,
            keep_codes: false,
            text_feed: None,
            feed_start: super::feed::FeedStart::Paced,
        }
    }

    /// A request whose text comes through `feed` ([`super::feed::text_feed`]'s handle) while it
    /// is spoken, with the model's defaults.
    pub fn fed(feed: super::feed::TextFeedHandle) -> Self {
        Request {
            text_feed: Some(feed),
            ..Request::text("")
        }
    }

    /// Greedy decoding of every codebook (reproduces the reference's greedy codes).
    pub fn greedy(mut self) -> Self {
        self.sampling = Some(SamplingParams::GREEDY);
        self.code_predictor_sampling = Some(SamplingParams::GREEDY);
        self
    }
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
    /// When the audio was ready against when it plays: [`Playout::gap_free_buffer`].
    pub playout: Playout,
    /// Frames that waited for their text token (a fed text that fell behind the speech).
    pub text_starved_frames: usize,
}

/// The smallest player buffer that plays a request from its first sample on without a gap, from
/// when each chunk of samples was ready to leave the engine (before the sink's write, which may
/// wait for the player): the largest lateness of a chunk against a player that starts at the
/// first sample and plays on at 1x.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Playout {
    first: Option<Instant>,
    worst: Duration,
}

impl Playout {
    /// A chunk is ready at `now` with `before` samples of the request ahead of it.
    pub fn ready(&mut self, now: Instant, before: usize) {
        let first = *self.first.get_or_insert(now);
        let due = Duration::from_secs_f64(before as f64 / crate::audio::SAMPLE_RATE as f64);
        let late = now.saturating_duration_since(first).saturating_sub(due);
        self.worst = self.worst.max(late);
    }

    /// The buffer a player that starts at the first sample needs for no gap (zero when every
    /// chunk was ready before the audio ahead of it had played out).
    pub fn gap_free_buffer(&self) -> Duration {
        self.worst
    }
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
            playout: Playout::default(),
            text_starved_frames: 0,
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

impl EngineInfo {
    /// The speaker a request without one gets: `vivian` where the model has her, else its first
    /// speaker; `None` for models without speakers (Base, VoiceDesign). The command, the C ABI,
    /// the Python package and the server all use it.
    pub fn default_speaker(&self) -> Option<&str> {
        if self.model_type != "custom_voice" {
            return None;
        }
        self.speakers
            .iter()
            .find(|s| s.eq_ignore_ascii_case("vivian"))
            .or(self.speakers.first())
            .map(String::as_str)
    }

    /// Gives `voice` the default speaker when it names no voice at all (no speaker, x-vector or
    /// reference): what a request without a voice means on every surface.
    pub fn default_voice(&self, voice: &mut Voice) {
        if voice.speaker.is_none() && voice.xvector.is_none() && voice.reference.is_none() {
            voice.speaker = self.default_speaker().map(str::to_owned);
        }
    }

    /// Checks what of `req` can be checked without running it, as
    /// [`Worker::submit`](super::Worker::submit) does before queueing: text with something to
    /// speak, a speaker and a language of this model, an instruction only where the model takes
    /// one, sampling settings in range. The engine checks the rest (token ids, a cloned voice's
    /// reference) when the request runs.
    pub fn check(&self, req: &Request) -> Result<(), EngineError> {
        if req.text_feed.is_some() {
            check_feed(req)?;
        } else if let TextInput::Text(t) = &req.input {
            if normalize(t).is_empty() {
                return Err(EngineError::EmptyText);
            }
        }
        let v = &req.voice;
        if let Some(s) = v.speaker.as_deref().filter(|s| !s.is_empty()) {
            if !self.speakers.iter().any(|k| k.eq_ignore_ascii_case(s)) {
                return Err(TalkerError::UnknownSpeaker {
                    speaker: s.to_owned(),
                    model: self.model_type,
                    supported: self.speakers.clone(),
                }
                .into());
            }
        }
        if let Some(l) = v.language.as_deref() {
            if !self.languages.iter().any(|k| k.eq_ignore_ascii_case(l)) {
                return Err(TalkerError::UnknownLanguage {
                    language: l.to_lowercase(),
                    supported: self.languages.clone(),
                }
                .into());
            }
        }
        if v.instruct.is_some() && !self.takes_instruct() {
            return Err(TalkerError::InstructUnsupported {
                model: self.model_type,
                size: self.size.clone(),
            }
            .into());
        }
        req.overrides.check()?;
        if let Some(r) = req.repetition_penalty {
            crate::sampling::check_repetition_penalty(r)?;
        }
        Ok(())
    }

    /// Whether the model takes a voice instruction: VoiceDesign models and the 1.7B CustomVoice.
    pub fn takes_instruct(&self) -> bool {
        crate::model::config::ModelType::from_name(self.model_type)
            .is_some_and(|t| t.takes_instruct(&self.size))
    }
}

/// Cancels a request from any thread.
#[derive(Debug, Clone)]
pub struct Canceller {
    flag: Arc<AtomicBool>,
    /// Wakes a reader waiting on a queued request ([`super::Job`]), which then answers itself.
    wake: Option<crossbeam_channel::Sender<()>>,
}

impl Canceller {
    pub(super) fn new(flag: Arc<AtomicBool>, wake: Option<crossbeam_channel::Sender<()>>) -> Self {
        Canceller { flag, wake }
    }

    /// Stops the request between frames and flushes playback.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Release);
        if let Some(w) = &self.wake {
            let _ = w.try_send(());
        }
    }

    /// Whether [`Canceller::cancel`] was called: the request is over, or soon will be (its text
    /// feed takes no more, as after its end).
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

/// A running request. Dropping it lets the request run to its end unseen: wait for it, or
/// cancel it.
#[derive(Debug)]
#[must_use = "a synthesis runs on after it is dropped; wait for it or cancel it"]
pub struct Synthesis<'e> {
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) progress: Arc<AtomicUsize>,
    pub(super) done: Receiver<Finished>,
    pub(super) _engine: std::marker::PhantomData<&'e Engine>,
}

/// A request's end: its summary (or error) and the sink it wrote to.
pub type Finished = (Result<Summary, EngineError>, Box<dyn AudioSink>);

/// What a request ends with when the decoder thread is gone before answering (its sink is lost).
pub(super) fn decoder_gone() -> Finished {
    (
        Err(EngineError::StageGone { stage: "decoder" }),
        Box::new(crate::audio::MemorySink::default()),
    )
}

impl Synthesis<'_> {
    /// A handle that cancels this request.
    pub fn canceller(&self) -> Canceller {
        Canceller::new(self.cancel.clone(), None)
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

/// One utterance, planned: its prompt, options and report.
pub(crate) struct Utterance {
    pub prompt: Prompt,
    pub opts: GenOptions,
    pub code_predictor_sampling: SamplingParams,
    pub report: SegmentReport,
}

/// What a fed request ([`Request::text_feed`]) must be: streaming text, no in-context reference.
pub(crate) fn check_feed(req: &Request) -> Result<(), EngineError> {
    if req.mode != TextMode::Streaming {
        return Err(EngineError::BadFeed {
            found: format!(
                "a request in the {:?} text mode: a text feed takes the streaming mode",
                req.mode
            ),
        });
    }
    if req.voice.reference.is_some() {
        return Err(EngineError::BadFeed {
            found: "a cloned voice with its in-context reference: not with a text feed yet; give \
                    the whole text, or clone from the x-vector alone"
                .into(),
        });
    }
    Ok(())
}

/// The utterance of a fed request ([`Request::text_feed`]) once its first text token is final:
/// the prompt of the whole text up to that token (the streaming layout needs no more), its
/// trailing text to come from the feed ([`super::feed`]).
pub(crate) fn plan_fed(
    talker: &Talker,
    req: &Request,
    reader: &super::feed::TextReader<'_>,
    segment_tokens: usize,
) -> Result<Utterance, EngineError> {
    let mut r = req.clone();
    r.text_feed = None;
    r.input = TextInput::TokenIds(reader.first_wrapped(talker.tokenizer()));
    let mut u = plan_request(talker, &r, segment_tokens)?
        .pop()
        .ok_or(EngineError::EmptyText)?;
    u.prompt.trailing.clear();
    // The cap follows the text's tokens as they come (`Session::set_text_tokens`).
    u.opts.max_frames = match (req.max_frames, req.frame_limit) {
        (Some(m), Some(l)) => Some(m.min(l)),
        (m, _) => m,
    };
    u.report.text = "(fed text)".into();
    u.report.cut = Some(Cut::End);
    Ok(u)
}

/// Splits and builds a request's utterances (shared by the engine and [`serial::Serial`]).
pub(crate) fn plan_request(
    talker: &Talker,
    req: &Request,
    segment_tokens: usize,
) -> Result<Vec<Utterance>, EngineError> {
    let g = talker.generation_config();
    let sampling = req
        .overrides
        .apply(req.sampling.unwrap_or_else(|| SamplingParams::talker(g)));
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
                    max_frames: match req.frame_limit {
                        None => req.max_frames,
                        Some(limit) => Some(
                            req.max_frames
                                .unwrap_or_else(|| talker.frame_cap(prompt.text_tokens))
                                .min(limit),
                        ),
                    },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_free_buffer_is_the_latest_chunk_against_playback() {
        let t0 = Instant::now();
        let ms = |m: u64| t0 + Duration::from_millis(m);
        let frame = 1920; // 80 ms
        let mut p = Playout::default();
        assert_eq!(p.gap_free_buffer(), Duration::ZERO);
        p.ready(ms(50), 0); // the first sample plays at once
        p.ready(ms(120), frame); // due at 130: early
        p.ready(ms(200), 2 * frame); // due at 210: early
        assert_eq!(p.gap_free_buffer(), Duration::ZERO);
        p.ready(ms(400), 3 * frame); // due at 290: 110 ms late
        p.ready(ms(420), 4 * frame); // due at 370: 50 ms late
        assert_eq!(p.gap_free_buffer(), Duration::from_millis(110));
    }
}
