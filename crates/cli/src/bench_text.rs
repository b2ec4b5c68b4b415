//! `qtts bench --text-rate`: an answer written at a pace, as a language model writes it, and
//! heard as one continuous stream by a paced listener. Each sentence is one request of an engine
//! of one stream, in order, either fed from its first character (what the live WebSocket and
//! Wyoming do, [`Cutter`]'s live cuts), starting as the engine's paced policy says or at its
//! first word ([`qtts::engine::FeedStart`]), or queued once complete (the sentence-at-a-time
//! path). All three run in the same `qtts bench` run, on the same sentences and seeds, so they
//! must give the same samples (checked by a hash of the audio).
//!
//! The writer's tokens are as a language model's English tokens mostly are: a word with its
//! leading space (a word over [`TOKEN_CHARS`] characters in several), or a punctuation mark;
//! the rate is in those tokens a second. (Qwen's tokenizer cuts these sentences about as finely:
//! the rate is about the talker's tokens a second too.) Random weights never end an utterance by themselves, so each sentence's
//! length is forced: [`FRAMES_PER_CHAR`] frames a character, about the pace of speech.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use qtts::audio::{ring, AudioError, AudioSink, PacedDevice, RingSink, SAMPLE_RATE};
use qtts::engine::{downcast_sink, EngineConfig, Request};
use qtts::model::ModelFiles;
use qtts_serve::sentences::{Cutter, Sentence};

use crate::bench::PERIOD_SAMPLES;

/// The answer's sentences, repeated until it is long enough.
const ANSWER: [&str; 6] = [
    "Sure, here is what I found about the weather for the rest of the week.",
    "Tomorrow starts cloudy, with light rain in the afternoon and a high of twelve degrees.",
    "Wednesday looks brighter.",
    "From Thursday on, a warm front brings sunshine and temperatures close to twenty degrees.",
    "The weekend should stay dry, although the wind picks up on Sunday evening.",
    "Would you like me to set a reminder to take an umbrella tomorrow?",
];

/// Frames of speech per character of text (80 ms frames; about 15 characters a second).
pub const FRAMES_PER_CHAR: f64 = 0.83;

/// Characters of one writer token, at most, its leading space included.
const TOKEN_CHARS: usize = 8;

/// When each sentence of the answer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum TextStart {
    /// Fed from its first character, started by the engine's paced policy (the default).
    Paced,
    /// Fed from its first character, started at its first word.
    FirstWord,
    /// Queued once complete.
    Sentence,
}

impl TextStart {
    fn name(self) -> &'static str {
        match self {
            TextStart::Paced => "paced",
            TextStart::FirstWord => "first-word",
            TextStart::Sentence => "sentence",
        }
    }
}

/// One run of an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextRateReport {
    /// Writer tokens a second.
    pub rate: f64,
    /// When each sentence started.
    pub start: TextStart,
    /// From the first piece written to the first sample made, ms.
    pub first_audio_ms: f64,
    /// Seconds the writer took for the whole answer.
    pub writing_s: f64,
    /// Seconds of audio.
    pub audio_s: f64,
    /// Sentences (requests).
    pub sentences: usize,
    /// Frames that waited for text not written yet, over every sentence.
    pub text_starved_frames: usize,
    /// Device periods (20 ms) the listener found empty between the answer's first and last
    /// sample (between sentences too: the answer is one stream to the listener).
    pub underruns: u64,
    /// When the first underruns came, seconds from the first piece written.
    pub underrun_s: Vec<f64>,
    /// When each sentence's request ended, seconds from the first piece written.
    pub ends_s: Vec<f64>,
    /// The worst sentence's generation time over its audio.
    pub rtf_max: f64,
    /// FNV-1a of every sample's bits, in order: the live and the sentence-at-a-time runs must
    /// agree.
    pub audio_hash: u64,
}

/// The answer: whole sentences of [`ANSWER`], in turn, until they make `frames` frames; with
/// each sentence's forced length, in order.
fn answer(frames: usize) -> (String, Vec<usize>) {
    let (mut text, mut lengths) = (String::new(), Vec::new());
    for s in ANSWER.iter().cycle() {
        if lengths.iter().sum::<usize>() >= frames {
            break;
        }
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(s);
        lengths.push(sentence_frames(s));
    }
    (text, lengths)
}

/// The forced length of a sentence.
fn sentence_frames(s: &str) -> usize {
    (s.chars().count() as f64 * FRAMES_PER_CHAR).ceil() as usize
}

/// `text` in writer tokens: each word with its leading white space (in pieces of at most
/// [`TOKEN_CHARS`] characters), each punctuation mark alone.
pub fn writer_tokens(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        let word = !cur.trim().is_empty();
        let mark = |x: char| !x.is_whitespace() && !x.is_alphanumeric();
        let ends = word
            && (c.is_whitespace()
                || mark(c)
                || cur.chars().any(mark)
                || cur.chars().count() >= TOKEN_CHARS);
        if ends {
            out.push(std::mem::take(&mut cur));
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The listener's sink for a whole answer: every request writes into one ring, which begins
/// with the first and never ends between sentences (a sentence's late start is an underrun, as
/// the listener hears it).
struct Answer {
    ring: RingSink,
    begun: bool,
    hash: u64,
}

impl AudioSink for Answer {
    fn begin(&mut self) -> Result<(), AudioError> {
        if !std::mem::replace(&mut self.begun, true) {
            self.ring.begin()?;
        }
        Ok(())
    }

    fn write(&mut self, pcm: &[f32], cancel: &AtomicBool) -> Result<(), AudioError> {
        for v in pcm {
            for b in v.to_bits().to_le_bytes() {
                self.hash = (self.hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        self.ring.write(pcm, cancel)
    }

    fn end(&mut self, _cancel: &AtomicBool) -> Result<(), AudioError> {
        Ok(())
    }

    fn queued_ms(&self) -> Option<f64> {
        self.ring.queued_ms()
    }
}

/// Loads an engine of one stream and speaks an answer of about `frames` frames written at
/// `rate` tokens a second, each sentence started as `start` says.
pub fn measure(
    files: &ModelFiles,
    config: EngineConfig,
    frames: usize,
    prebuffer_ms: f64,
    rate: f64,
    start: TextStart,
) -> anyhow::Result<TextRateReport> {
    anyhow::ensure!(
        rate > 0.0 && rate.is_finite(),
        "--text-rate {rate}: expected tokens a second above 0"
    );
    let config = EngineConfig {
        max_streams: 1,
        ..config
    };
    let (engine, forced) = crate::bench_streams::speaking_engine(files, config, "--text-rate")?;
    let (text, lengths) = answer(frames);
    let total: usize = lengths.iter().sum();
    let capacity_ms = (total * qtts::audio::FRAME_SAMPLES) as f64 * 1e3 / SAMPLE_RATE as f64;
    let (ring, player) = ring(capacity_ms + 1000.0, prebuffer_ms);
    let shared = ring.shared();
    let device = PacedDevice::start(player, PERIOD_SAMPLES, false);
    let device_started = Instant::now();
    let mut sink: Box<dyn AudioSink> = Box::new(Answer {
        ring,
        begun: false,
        hash: 0xcbf2_9ce4_8422_2325,
    });
    // The writer: tokens at the rate, cut into sentences; each sentence to the speaker (below)
    // as soon as it is queued (live: at its first character).
    let (tx, rx) = crossbeam_channel::bounded::<Sentence>(64);
    let t0 = Instant::now();
    // The device's periods count from its start, a little before the first piece.
    let device_lead = t0.duration_since(device_started).as_secs_f64();
    let writer = std::thread::spawn(move || {
        let mut cut = if start == TextStart::Sentence {
            Cutter::whole()
        } else {
            Cutter::live()
        };
        let period = Duration::from_secs_f64(1.0 / rate);
        for (k, token) in writer_tokens(&text).iter().enumerate() {
            if let Some(wait) = (period * k as u32).checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
            for s in cut.push(token) {
                if tx.send(s).is_err() {
                    return t0.elapsed();
                }
            }
        }
        if let Some(s) = cut.finish() {
            let _ = tx.send(s);
        }
        t0.elapsed()
    });
    let (mut first_audio, mut starved, mut audio_s, mut rtf_max) = (None, 0, 0.0, 0.0f64);
    let mut ends = Vec::new();
    for (k, sentence) in rx.iter().enumerate() {
        let frames = *lengths
            .get(k)
            .ok_or_else(|| anyhow::anyhow!("the writer cut more sentences than the answer has"))?;
        let req = match sentence {
            Sentence::Fed(feed) => {
                let mut r = Request::fed(feed);
                if start == TextStart::FirstWord {
                    r.feed_start = qtts::engine::FeedStart::FirstWord;
                }
                r
            }
            Sentence::Whole(t) => Request::text(t),
        };
        let started = t0.elapsed();
        let (summary, back) = engine
            .start(forced.request(req, frames, 1 + k as u64), sink)
            .wait();
        sink = back;
        let summary = summary?;
        if first_audio.is_none() {
            first_audio = summary.ttfa.map(|t| started + t);
        }
        starved += summary.text_starved_frames;
        audio_s += summary.audio_seconds();
        rtf_max = rtf_max.max(summary.generated.as_secs_f64() / summary.audio_seconds().max(1e-9));
        ends.push(t0.elapsed().as_secs_f64());
    }
    let writing = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the bench's writer thread panicked"))?;
    let mut answer = downcast_sink::<Answer>(sink)
        .ok_or_else(|| anyhow::anyhow!("the engine gave back another sink"))?;
    answer.ring.end_unwaited();
    while !shared.is_idle() {
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(device);
    Ok(TextRateReport {
        rate,
        start,
        first_audio_ms: first_audio.unwrap_or_default().as_secs_f64() * 1e3,
        writing_s: writing.as_secs_f64(),
        audio_s,
        sentences: ends.len(),
        text_starved_frames: starved,
        underruns: shared.underruns(),
        underrun_s: shared
            .underrun_periods()
            .iter()
            .map(|&p| p as f64 * PERIOD_SAMPLES as f64 / SAMPLE_RATE as f64 - device_lead)
            .collect(),
        ends_s: ends,
        rtf_max,
        audio_hash: answer.hash,
    })
}

/// `qtts bench --text-rate`: per round, configuration and rate, the live run and the
/// sentence-at-a-time run, each in a child; then the table.
pub(crate) fn rates(
    exe: &std::path::Path,
    dir: &std::path::Path,
    configs: &[crate::bench_cli::Config],
    a: &crate::bench_cli::BenchArgs,
) -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for round in 0..a.runs {
        for &c in configs {
            for &rate in &a.text_rate {
                for start in [TextStart::Paced, TextStart::FirstWord, TextStart::Sentence] {
                    let mut cmd = crate::bench_cli::child_command(exe, dir, c, a);
                    cmd.arg("--text-rate").arg(rate.to_string());
                    cmd.arg("--text-start").arg(start.name());
                    let line = crate::bench_cli::run_child(cmd, dir, c)?;
                    let r: TextRateReport = serde_json::from_str(line.trim())
                        .map_err(|e| anyhow::anyhow!("bench-run printed {line:?}: {e}"))?;
                    eprintln!(
                        "round {round} {:<30} {rate} tok/s {}: first audio {:.0} ms, {} underruns \
                         (at {:.2?} s; sentences ended at {:.2?} s), {} frames starved of text",
                        c.label(),
                        start.name(),
                        r.first_audio_ms,
                        r.underruns,
                        r.underrun_s,
                        r.ends_s,
                        r.text_starved_frames
                    );
                    rows.push((format!("{} r{round}", c.label()), r));
                }
            }
        }
    }
    print!("{}", table(&rows));
    Ok(())
}

/// The table of `qtts bench --text-rate`: per configuration and rate, the runs of each start
/// in the same round; `same`: whether their audio is the sentence-at-a-time run's.
pub fn table(rows: &[(String, TextRateReport)]) -> String {
    let mut s = format!(
        "{:<34} {:>6} {:<10} {:>11} {:>9} {:>8} {:>8} {:>9} {:>7} {:>6}\n",
        "configuration",
        "tok/s",
        "start",
        "first audio",
        "underrun",
        "starved",
        "RTF max",
        "audio s",
        "write s",
        "same"
    );
    for (label, r) in rows {
        let twin = rows
            .iter()
            .find(|(l, t)| {
                l == label && t.rate == r.rate && t.start == TextStart::Sentence && t != r
            })
            .map(|(_, t)| t.audio_hash == r.audio_hash);
        s += &format!(
            "{:<34} {:>6.0} {:<10} {:>9.0}ms {:>9} {:>8} {:>8.2} {:>9.1} {:>7.1} {:>6}\n",
            label,
            r.rate,
            r.start.name(),
            r.first_audio_ms,
            r.underruns,
            r.text_starved_frames,
            r.rtf_max,
            r.audio_s,
            r.writing_s,
            match twin {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use qtts_serve::sentences::Sentences;

    #[test]
    fn writer_tokens_cover_the_text_in_short_pieces() {
        let (text, lengths) = answer(600);
        let tokens = writer_tokens(&text);
        assert_eq!(tokens.concat(), text);
        assert!(tokens.iter().all(|t| t.chars().count() <= TOKEN_CHARS));
        assert!(tokens.iter().skip(1).all(|t| !t.trim().is_empty()));
        assert_eq!(
            writer_tokens("Sure, a reminder? Temperatures"),
            ["Sure", ",", " a", " reminde", "r", "?", " Tempera", "tures"]
        );
        // Whole sentences until the frames are reached, and no more; the lengths are those of
        // the sentences the cutter finds in the text.
        let mut s = Sentences::default();
        let mut all = s.push(&text);
        all.extend(s.finish());
        let frames: Vec<usize> = all.iter().map(|s| sentence_frames(s)).collect();
        assert_eq!(frames, lengths);
        let total: usize = frames.iter().sum();
        assert!(
            total >= 600 && total - frames.last().unwrap() < 600,
            "{frames:?}"
        );
        assert!(all.len() > ANSWER.len(), "the answer repeats its sentences");
    }
}
