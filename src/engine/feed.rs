//! Text that arrives while it is spoken: the caller's half ([`TextWriter`]) and the talker
//! thread's half (`TextReader`) of a request's text feed ([`Request::text_feed`]).
//!
//! Contract: a request fed with text in any fragmentation, at any pace, speaks the codes and
//! samples of the same request with the whole text ([`Request::text`]) in the streaming text
//! mode. The talker starts once the first text token is final and takes one token a frame; a
//! frame whose token is not final yet waits for it (counted in
//! [`Summary::text_starved_frames`](super::Summary::text_starved_frames)). The text is cleaned as
//! [`normalize`](crate::text::split::normalize) cleans whole text ([`Normalizer`]) and encoded by
//! [`TextFeed`], which gives each id as soon as no later text can change it.
//!
//! For now a fed request is one utterance: its text must stay within the engine's
//! `segment_tokens` (the whole text would be split beyond it); more ends the request with
//! [`EngineError::FeedTooLong`].
//!
//! [`Request::text_feed`]: super::Request::text_feed
//! [`Request::text`]: super::Request::text

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

use super::error::EngineError;
use crate::text::split::Normalizer;
use crate::text::{NotUtf8, TextFeed, Tokenizer};

/// Fragments queued between a writer and the talker: 4096, a whole answer's tokens (the talker
/// drains them all before each frame, every 80 ms or sooner, and not at all while the request
/// waits in a [`super::Worker`]'s queue; a writer that gets that far ahead waits).
pub const FEED_QUEUE: usize = 4096;

/// The role before the text, and the end after it, as the whole text is wrapped.
const BEFORE: &str = "<|im_start|>assistant\n";
const AFTER: &str = "<|im_end|>\n<|im_start|>assistant\n";
/// Ids of [`BEFORE`] and [`AFTER`].
const BEFORE_IDS: usize = 3;
const AFTER_IDS: usize = 5;

/// When a fed request ([`Request::text_feed`](super::Request::text_feed)) starts speaking. The
/// audio is the same whatever the start; only when it begins, and whether playback must wait
/// for text later, change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FeedStart {
    /// From the pace the text comes at: at the first word when it comes at least as fast as the
    /// talker takes it (one token a frame, 12.5 a second), else once enough of it is there that
    /// the rest, coming from now on at the pace seen so far, stays ahead of playback up to
    /// [`PACE_HORIZON`] tokens (a sentence: the live front ends cut there); at the text's end
    /// at the latest. The pace is the final tokens over the time from the first piece of text to
    /// the latest (whose last word is not final yet): text that came at once starts at once.
    #[default]
    Paced,
    /// At the first final token.
    FirstWord,
    /// Once this many tokens are final (or at the text's end).
    Tokens(usize),
    /// At the text's end.
    TextEnd,
}

impl FeedStart {
    /// The policies with a name, as every face spells them (`Tokens` is given as a number).
    pub const NAMED: [(&'static str, FeedStart); 3] = [
        ("paced", FeedStart::Paced),
        ("first_word", FeedStart::FirstWord),
        ("text_end", FeedStart::TextEnd),
    ];

    /// The policy named `name` ([`FeedStart::NAMED`]).
    pub fn by_name(name: &str) -> Option<FeedStart> {
        Self::NAMED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, s)| s)
    }

    /// Its name ([`FeedStart::NAMED`]); `None` for [`FeedStart::Tokens`].
    pub fn name(self) -> Option<&'static str> {
        Self::NAMED
            .iter()
            .find(|(_, s)| *s == self)
            .map(|&(n, _)| n)
    }
}

/// Tokens [`FeedStart::Paced`] keeps the text ahead of playback for: 24 (a sentence).
pub const PACE_HORIZON: usize = 24;

/// Seconds of playback a token gives: one frame.
const FRAME_SECONDS: f64 = 0.08;

/// Seconds from a token's arrival to its frame's audio, at most, that [`FeedStart::Paced`]
/// keeps in hand: the frame itself and the decoder's chunk of up to 4 frames, about 0.25 s. At
/// 10 tokens a second (`qtts bench --text-rate`, 20 s answers, 100 ms player buffer) starting
/// without it cost 5 underruns; with it 2 to 6 remain, about 0.4 s after the first audio, where
/// a sentence spoken once complete has them too on the avx512 tier (the first decoder calls'
/// ramp, docs/perf-log/2026-12-07-text-rate.md).
const PIPELINE_SECONDS: f64 = 0.25;

#[derive(Debug)]
enum Piece {
    Text(String),
    End,
}

/// A new text feed: the writer for the caller, the handle for [`Request::text_feed`].
///
/// [`Request::text_feed`]: super::Request::text_feed
pub fn text_feed() -> (TextWriter, TextFeedHandle) {
    let (tx, rx) = crossbeam_channel::bounded(FEED_QUEUE);
    (
        TextWriter {
            tx: Some(tx),
            partial: Vec::new(),
        },
        TextFeedHandle { rx: Arc::new(rx) },
    )
}

/// The request that reads this feed is over (finished, cancelled or failed): it takes no more
/// text. Start a new request for more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request this text was for is over: start a new request for more text")]
pub struct FeedClosed;

/// A failed [`TextWriter::push_bytes`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeedError {
    /// See [`FeedClosed`].
    #[error(transparent)]
    Closed(#[from] FeedClosed),
    /// See [`NotUtf8`].
    #[error(transparent)]
    NotUtf8(#[from] NotUtf8),
}

/// The caller's half of a text feed: push fragments as they come, then [`TextWriter::finish`].
/// Dropping it finishes the text too.
#[derive(Debug)]
pub struct TextWriter {
    tx: Option<Sender<Piece>>,
    /// The start of a character split across [`TextWriter::push_bytes`] calls.
    partial: Vec<u8>,
}

impl TextWriter {
    /// Adds `text` (any fragment: a word, part of one, a single character). Waits only when
    /// [`FEED_QUEUE`] fragments are already waiting for the talker.
    pub fn push(&mut self, text: &str) -> Result<(), FeedClosed> {
        if text.is_empty() {
            return Ok(());
        }
        let tx = self.tx.as_ref().ok_or(FeedClosed)?;
        match tx.try_send(Piece::Text(text.to_owned())) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(p)) => tx.send(p).map_err(|_| FeedClosed),
            Err(TrySendError::Disconnected(_)) => Err(FeedClosed),
        }
    }

    /// Adds UTF-8 bytes, which may end inside a character (the rest comes with the next call).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Result<(), FeedError> {
        let text = crate::text::feed::take_utf8(&mut self.partial, bytes).inspect_err(|_| {
            self.partial.clear();
        })?;
        Ok(self.push(&text)?)
    }

    /// Ends the text: the engine speaks what is left and ends the utterance.
    pub fn finish(mut self) -> Result<(), FeedError> {
        if !self.partial.is_empty() {
            let found = std::mem::take(&mut self.partial);
            self.end();
            return Err(NotUtf8 { found }.into());
        }
        self.end().ok_or(FeedClosed)?;
        Ok(())
    }

    fn end(&mut self) -> Option<()> {
        self.tx.take()?.send(Piece::End).ok()
    }
}

impl Drop for TextWriter {
    fn drop(&mut self) {
        self.end();
    }
}

/// The engine's half of a text feed, set as [`Request::text_feed`](super::Request::text_feed).
/// Requests are equal when they read the same feed.
#[derive(Debug, Clone)]
pub struct TextFeedHandle {
    rx: Arc<Receiver<Piece>>,
}

impl PartialEq for TextFeedHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.rx, &other.rx)
    }
}

/// [`FeedStart::Paced`]'s rule: with `tokens` final from pieces that came over `span` seconds,
/// the pace is `r = tokens / span` (endless when they came at once); speaking may start
/// now when the tokens still to come over the horizon, arriving from now on at that pace, come
/// no later than playback takes them (token `k` at frame `k − 1`, 80 ms each), with
/// [`PIPELINE_SECONDS`] in hand: `(H − tokens) / r ≤ 0.08 · (H − 1) − 0.25`.
pub(crate) fn paced_start(tokens: usize, span: f64) -> bool {
    if tokens >= PACE_HORIZON {
        return true;
    }
    if tokens == 0 {
        return false;
    }
    let to_come = (PACE_HORIZON - tokens) as f64;
    let budget = FRAME_SECONDS * (PACE_HORIZON - 1) as f64 - PIPELINE_SECONDS;
    // (H − tokens) / r ≤ budget, with r = tokens / span.
    to_come * span <= tokens as f64 * budget
}

/// What the talker thread reads: the feed's final text ids, as they become final.
pub(crate) struct TextReader<'t> {
    rx: Arc<Receiver<Piece>>,
    normalizer: Option<Normalizer>,
    feed: Option<TextFeed<'t>>,
    /// Every final id of the wrapped text so far (role first).
    ids: Vec<u32>,
    ended: bool,
    /// Text tokens at most (`segment_tokens`).
    limit: usize,
    /// When the first and the latest piece of text came.
    first_at: Option<Instant>,
    last_at: Option<Instant>,
}

impl<'t> TextReader<'t> {
    pub(crate) fn new(handle: &TextFeedHandle, tokenizer: &'t Tokenizer, limit: usize) -> Self {
        let mut feed = TextFeed::new(tokenizer);
        let ids = feed.push(BEFORE).to_vec();
        TextReader {
            rx: handle.rx.clone(),
            normalizer: Some(Normalizer::new()),
            feed: Some(feed),
            ids,
            ended: false,
            limit,
            first_at: None,
            last_at: None,
        }
    }

    /// Whether a request starting `start` may start: a final token at least, and what the
    /// policy asks for.
    pub(crate) fn may_start(&self, start: FeedStart) -> bool {
        let tokens = self.text().len();
        if tokens == 0 {
            return false;
        }
        match start {
            _ if self.ended => true,
            FeedStart::FirstWord => true,
            FeedStart::Tokens(n) => tokens >= n,
            FeedStart::TextEnd => false,
            FeedStart::Paced => {
                let span = match (self.first_at, self.last_at) {
                    (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
                    _ => 0.0,
                };
                paced_start(tokens, span)
            }
        }
    }

    /// The final text ids so far (without the role and the end).
    pub(crate) fn text(&self) -> &[u32] {
        let end = if self.ended {
            self.ids.len().saturating_sub(AFTER_IDS)
        } else {
            self.ids.len()
        };
        &self.ids[BEFORE_IDS.min(end)..end]
    }

    /// Whether the text is complete.
    pub(crate) fn ended(&self) -> bool {
        self.ended
    }

    /// Takes what the writer sent: waits up to `wait` for one fragment when none is there, then
    /// takes every fragment waiting. `false` when nothing came.
    pub(crate) fn poll(&mut self, wait: Duration) -> Result<bool, EngineError> {
        if self.ended {
            return Ok(false);
        }
        let first = match self.rx.try_recv() {
            Ok(p) => p,
            Err(_) => match self.rx.recv_timeout(wait) {
                Ok(p) => p,
                Err(RecvTimeoutError::Timeout) => return Ok(false),
                // Every writer gone without an end: the text ends there.
                Err(RecvTimeoutError::Disconnected) => Piece::End,
            },
        };
        self.take(first)?;
        while !self.ended {
            match self.rx.try_recv() {
                Ok(p) => self.take(p)?,
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => self.take(Piece::End)?,
            }
        }
        let tokens = self.text().len();
        if tokens > self.limit {
            return Err(EngineError::FeedTooLong {
                tokens,
                limit: self.limit,
            });
        }
        Ok(true)
    }

    fn take(&mut self, piece: Piece) -> Result<(), EngineError> {
        let (Some(n), Some(f)) = (self.normalizer.as_mut(), self.feed.as_mut()) else {
            return Ok(());
        };
        match piece {
            Piece::Text(t) => {
                if !t.trim().is_empty() {
                    let now = Instant::now();
                    self.first_at.get_or_insert(now);
                    self.last_at = Some(now);
                }
                let clean = n.push(&t);
                self.ids.extend_from_slice(f.push(&clean));
            }
            Piece::End => {
                let (n, mut f) = (self.normalizer.take(), self.feed.take());
                if let (Some(n), Some(f)) = (n, f.as_mut()) {
                    let clean = n.finish();
                    self.ids.extend_from_slice(f.push(&clean));
                    self.ids.extend_from_slice(f.push(AFTER));
                }
                if let Some(f) = f {
                    self.ids
                        .extend(f.finish().map_err(|e| EngineError::BadFeed {
                            found: e.to_string(),
                        })?);
                }
                self.ended = true;
                if self.text().is_empty() {
                    return Err(EngineError::EmptyText);
                }
            }
        }
        Ok(())
    }

    /// The wrapped ids of the text's first token alone, as
    /// [`crate::talker::Talker::prompt`] takes them: the role, the first text id, the end.
    /// Needs a first text id ([`TextReader::text`] not empty).
    pub(crate) fn first_wrapped(&self, tokenizer: &Tokenizer) -> Vec<u32> {
        let mut ids = self.ids[..BEFORE_IDS].to_vec();
        ids.extend(self.text().first());
        ids.extend(tokenizer.encode(AFTER));
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paced_start_waits_only_for_text_slower_than_the_talker() {
        // The first word final 50 ms after the first piece (20 a second): at once.
        assert!(paced_start(1, 0.05));
        // 12.5 a second, the talker's pace: the pipeline's latency first (5 tokens).
        assert!(!paced_start(4, 0.32));
        assert!(paced_start(5, 0.4));
        // 10 a second: at the ninth token (0.9 s), when the 15 to come arrive (1.5 s) by the
        // time the talker needs them (23 frames of 80 ms, less 0.25 s: 1.59 s).
        assert!(!paced_start(1, 0.1));
        assert!(!paced_start(8, 0.8));
        assert!(paced_start(9, 0.9));
        // A sentence written at 10 a second while another one was speaking: at once.
        assert!(paced_start(15, 1.5));
        // Text that came at once starts; no token, never; a horizon's worth always.
        assert!(paced_start(1, 0.0));
        assert!(paced_start(3, 0.0));
        assert!(!paced_start(0, 0.0));
        assert!(paced_start(PACE_HORIZON, 100.0));
        // 2 a second: nearly the whole horizon first.
        assert!(!paced_start(20, 10.0));
        assert!(paced_start(22, 11.0));
    }

    #[test]
    fn every_named_policy_is_found_by_its_name() {
        for (name, start) in FeedStart::NAMED {
            assert_eq!(FeedStart::by_name(name), Some(start));
            assert_eq!(start.name(), Some(name));
        }
        assert_eq!(FeedStart::by_name("soon"), None);
        assert_eq!(FeedStart::Tokens(3).name(), None);
    }
}
