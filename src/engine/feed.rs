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
use std::time::Duration;

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
