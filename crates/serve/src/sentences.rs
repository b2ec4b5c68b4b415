//! Streamed text cut into sentences, for Wyoming's `synthesize-chunk` and the live WebSocket:
//! each sentence one request, queued once complete ([`Sentences`]) or from its first character
//! as a fed request ([`Live`]), as [`Cutter`] chooses by the text mode.

use qtts::engine::{TextFeedHandle, TextWriter};
use qtts::talker::TextMode;

/// Cuts complete sentences off streamed text, holding back the unfinished tail: a sentence ends
/// at `.`, `!`, `?`, `…` or `;` followed by white space, or at `。！？；` (which need none).
#[derive(Debug, Default)]
pub struct Sentences {
    tail: String,
}

impl Sentences {
    /// Adds `text`; returns the sentences it completed.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        self.tail.push_str(text);
        let mut out = Vec::new();
        loop {
            let chars: Vec<(usize, char)> = self.tail.char_indices().collect();
            let mut cut = None;
            for (k, &(i, c)) in chars.iter().enumerate() {
                if matches!(c, '。' | '！' | '？' | '；') {
                    cut = Some(i + c.len_utf8());
                    break;
                }
                if matches!(c, '.' | '!' | '?' | '…' | ';') {
                    if let Some(&(_, next)) = chars.get(k + 1) {
                        if next.is_whitespace() {
                            cut = Some(i + c.len_utf8());
                            break;
                        }
                    }
                }
            }
            let Some(at) = cut else { break };
            let sentence = self.tail[..at].trim().to_owned();
            self.tail = self.tail[at..].to_owned();
            if !sentence.is_empty() {
                out.push(sentence);
            }
        }
        out
    }

    /// The rest, at the end of the text.
    pub fn finish(&mut self) -> Option<String> {
        let t = std::mem::take(&mut self.tail);
        let t = t.trim();
        (!t.is_empty()).then(|| t.to_owned())
    }

    /// Characters held.
    pub fn held(&self) -> usize {
        self.tail.chars().count()
    }
}

/// What [`Live::push`] gives, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LivePiece {
    /// A sentence begins (at its first character that is not white space).
    Start,
    /// More of the current sentence.
    Text(String),
    /// The current sentence is complete.
    End,
}

/// The cuts of [`Sentences`] for text spoken while it streams: each sentence's characters as they
/// come, then its end, so that a sentence can be spoken from its first word. The characters
/// between a [`LivePiece::Start`] and its [`LivePiece::End`], trimmed, are the sentence
/// [`Sentences`] gives.
#[derive(Debug, Default)]
pub struct Live {
    /// The last character was `.`, `!`, `?`, `…` or `;` (a sentence ends if white space follows).
    after_mark: bool,
    /// A sentence is open.
    open: bool,
}

impl Live {
    /// Adds `text`; returns the pieces it makes.
    pub fn push(&mut self, text: &str) -> Vec<LivePiece> {
        let mut out = Vec::new();
        let mut cur = String::new();
        let flush = |cur: &mut String, out: &mut Vec<LivePiece>| {
            if !cur.is_empty() {
                out.push(LivePiece::Text(std::mem::take(cur)));
            }
        };
        for c in text.chars() {
            if self.after_mark && c.is_whitespace() && self.open {
                flush(&mut cur, &mut out);
                out.push(LivePiece::End);
                self.open = false;
            }
            self.after_mark = matches!(c, '.' | '!' | '?' | '…' | ';');
            if !self.open {
                if c.is_whitespace() {
                    continue;
                }
                out.push(LivePiece::Start);
                self.open = true;
            }
            cur.push(c);
            if matches!(c, '。' | '！' | '？' | '；') {
                flush(&mut cur, &mut out);
                out.push(LivePiece::End);
                self.open = false;
                self.after_mark = false;
            }
        }
        flush(&mut cur, &mut out);
        out
    }

    /// The end of the text: the open sentence's end, if one is open.
    pub fn finish(&mut self) -> Option<LivePiece> {
        std::mem::take(&mut self.open).then_some(LivePiece::End)
    }
}

/// A sentence for a front end to queue, as [`Cutter`] hands it out.
#[derive(Debug)]
pub enum Sentence {
    /// A complete sentence.
    Whole(String),
    /// A sentence still being written: its text arrives through the feed
    /// ([`qtts::engine::Request::fed`]).
    Fed(TextFeedHandle),
}

/// How a stream of text is cut into requests: each sentence a fed request from its first
/// character where the text mode takes a feed (the streaming mode), else each sentence once it
/// is complete.
#[derive(Debug)]
pub enum Cutter {
    /// Each sentence a request once complete.
    Whole(Sentences),
    /// Each sentence a fed request from its first character; the open sentence's writer.
    Live(Live, Option<TextWriter>),
}

impl Cutter {
    /// The cutter for requests in text mode `mode`: [`Cutter::live`] for the streaming mode (the
    /// one a text feed takes), else [`Cutter::whole`].
    pub fn new(mode: TextMode) -> Cutter {
        if mode == TextMode::Streaming {
            Cutter::live()
        } else {
            Cutter::whole()
        }
    }

    /// Each sentence a fed request from its first character.
    pub fn live() -> Cutter {
        Cutter::Live(Live::default(), None)
    }

    /// Each sentence a request once complete.
    pub fn whole() -> Cutter {
        Cutter::Whole(Sentences::default())
    }

    /// Takes more text: returns the sentences to queue (complete ones, or fed ones begun), in
    /// order, and feeds the open sentence.
    pub fn push(&mut self, text: &str) -> Vec<Sentence> {
        match self {
            Cutter::Whole(s) => s.push(text).into_iter().map(Sentence::Whole).collect(),
            Cutter::Live(live, writer) => {
                let mut out = Vec::new();
                for piece in live.push(text) {
                    match piece {
                        LivePiece::Start => {
                            let (w, feed) = qtts::engine::text_feed();
                            *writer = Some(w);
                            out.push(Sentence::Fed(feed));
                        }
                        // A request that ended (an error, the audio limit) takes no more; the
                        // front end hears why from its request.
                        LivePiece::Text(t) => {
                            if let Some(w) = writer.as_mut() {
                                let _ = w.push(&t);
                            }
                        }
                        LivePiece::End => {
                            if let Some(w) = writer.take() {
                                let _ = w.finish();
                            }
                        }
                    }
                }
                out
            }
        }
    }

    /// Ends the sentence in progress, as the end of the text does (what follows starts a new
    /// one): the rest to queue, when the sentences are queued whole.
    pub fn finish(&mut self) -> Option<Sentence> {
        match self {
            Cutter::Whole(s) => s.finish().map(Sentence::Whole),
            Cutter::Live(live, writer) => {
                live.finish();
                if let Some(w) = writer.take() {
                    let _ = w.finish();
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_pieces_make_the_same_sentences() {
        let texts = [
            "Hello there. How are you?  Fine... thanks!\nNext; 你好。再见3.5 km. Ok",
            "  . a.b  ? ;x 。。 end",
            "",
            "one sentence without a mark",
        ];
        for t in texts {
            let mut whole = Sentences::default();
            let mut want = whole.push(t);
            want.extend(whole.finish());
            let chars: Vec<char> = t.chars().collect();
            for step in 1..=4 {
                let mut live = Live::default();
                let mut pieces = Vec::new();
                for chunk in chars.chunks(step) {
                    pieces.extend(live.push(&chunk.iter().collect::<String>()));
                }
                pieces.extend(live.finish());
                let mut got = Vec::new();
                let mut cur: Option<String> = None;
                for p in pieces {
                    match p {
                        LivePiece::Start => {
                            assert!(cur.is_none());
                            cur = Some(String::new());
                        }
                        LivePiece::Text(x) => cur.as_mut().unwrap().push_str(&x),
                        LivePiece::End => got.push(cur.take().unwrap().trim().to_owned()),
                    }
                }
                assert!(cur.is_none());
                assert_eq!(got, want, "{t:?} in pieces of {step}");
            }
        }
    }

    #[test]
    fn sentences_hold_back_the_tail() {
        let mut s = Sentences::default();
        assert!(s.push("Hel").is_empty());
        assert_eq!(s.push("lo there. How a"), vec!["Hello there."]);
        assert!(s.push("re you?").is_empty(), "no space after '?' yet");
        assert_eq!(s.finish().as_deref(), Some("How are you?"));
        assert_eq!(s.push("你好。再见"), vec!["你好。"]);
        assert_eq!(s.held(), 2);
        assert_eq!(s.push("3.5 km. Ok"), vec!["再见3.5 km."]);
    }
}
