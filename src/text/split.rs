//! Text clean-up and splitting of long input into utterances.
//!
//! One utterance's frames are capped (the runaway guard, and the context), so a long text must never
//! reach the talker whole and be cut silently at the cap. [`split`] cuts it into segments of at most
//! `max_tokens` tokens each, at the best boundary that keeps a segment within that limit: a
//! sentence end, else a clause mark, else a space, else between two characters (text without
//! spaces or punctuation). Every character of the input lands in exactly one segment, apart from
//! the whitespace at the cuts, and each segment says which kind of cut ended it.
//!
//! Contract: pure functions, no IO; they allocate in proportion to the text. [`split`] tokenizes
//! candidate segments to measure them, O(n · m) in the text length n and the segment length m.

use std::ops::Range;

use unicode_normalization::UnicodeNormalization;

use super::Tokenizer;

/// The default segment limit, in text tokens: about 30 s of speech, and with its frame cap
/// ([`crate::talker::Talker::frame_cap`]) well inside a 2048-position talker context.
pub const DEFAULT_MAX_TOKENS: usize = 150;

/// Cleans text for speaking: Unicode NFC; CRLF and CR become LF; control characters other than
/// whitespace, and the byte-order mark, are dropped; a whitespace run becomes one newline if it
/// holds a line break, else one space; leading and trailing whitespace goes.
pub fn normalize(text: &str) -> String {
    Normalizer::new().clean(text)
}

/// [`normalize`] of text that arrives in fragments: [`Normalizer::push`] returns the clean text
/// that no later fragment can change, [`Normalizer::finish`] the rest. The pieces, concatenated,
/// are `normalize` of the whole text, however it was split. Text is held back from the last
/// character that NFC could still combine with what comes next, and a white-space run until the
/// next character shows whether it is inside the text or trails it.
#[derive(Debug, Default)]
pub struct Normalizer {
    /// Raw text whose NFC is not settled (it starts at a normalization boundary).
    raw: String,
    /// The white space waiting for the next character (`' '` or `'\n'`).
    pending: Option<char>,
    /// Whether a character has been given out (leading white space is dropped).
    started: bool,
}

impl Normalizer {
    /// A normalizer with nothing pushed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes `text`; returns the clean text settled by it.
    pub fn push(&mut self, text: &str) -> String {
        self.raw.push_str(text);
        // The last boundary: NFC cannot reach across it from text still to come.
        let cut = self
            .raw
            .char_indices()
            .rev()
            .find(|&(_, c)| super::feed::boundary_before(c))
            .map_or(0, |(i, _)| i);
        let settled: String = self.raw.drain(..cut).collect();
        self.clean(&settled)
    }

    /// The rest: what was held back, its trailing white space dropped.
    pub fn finish(mut self) -> String {
        let rest = std::mem::take(&mut self.raw);
        self.clean(&rest)
    }

    /// The clean text of `text` (settled) after what was cleaned before; white space waits for
    /// the next character.
    fn clean(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.nfc() {
            if c.is_whitespace() {
                let newline = matches!(c, '\n' | '\r' | '\u{2028}' | '\u{2029}' | '\u{85}');
                self.pending = match (self.pending, newline) {
                    (Some('\n'), _) | (_, true) => Some('\n'),
                    _ => Some(' '),
                };
                continue;
            }
            if c.is_control() || c == '\u{feff}' {
                continue;
            }
            if let Some(p) = self.pending.take() {
                if self.started {
                    out.push(p);
                }
            }
            self.started = true;
            out.push(c);
        }
        out
    }
}

/// How a segment ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cut {
    /// The end of the text.
    End,
    /// After a sentence end (`.`, `!`, `?`, `…`, `。`, `！`, `？`, a line break).
    Sentence,
    /// After a clause mark (`,`, `;`, `:`, `，`, `；`, `：`, `、`, dashes).
    Clause,
    /// At a space inside a sentence too long for one segment.
    Space,
    /// Between two characters of a run with no space or punctuation.
    Hard,
}

/// One segment of a split text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Byte range in the text given to [`split`].
    pub range: Range<usize>,
    /// Its token count.
    pub tokens: usize,
    /// How it ends.
    pub cut: Cut,
}

fn is_closer(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | ')' | ']' | '}' | '”' | '’' | '»' | '」' | '』' | '）' | '】' | '》'
    )
}

/// The boundaries of `text` after byte `from`: (byte offset where the next segment may start, kind).
fn boundaries(text: &str, from: usize) -> Vec<(usize, Cut)> {
    let mut out = Vec::new();
    let chars: Vec<(usize, char)> = text[from..]
        .char_indices()
        .map(|(i, c)| (from + i, c))
        .collect();
    let end_of = |k: usize| chars.get(k).map_or(text.len(), |&(i, _)| i);
    let mut k = 0;
    while k < chars.len() {
        let (_, c) = chars[k];
        let ascii_sentence = matches!(c, '.' | '!' | '?');
        let wide_sentence = matches!(c, '…' | '。' | '！' | '？' | '｡');
        let ascii_clause = matches!(c, ',' | ';' | ':');
        let wide_clause = matches!(c, '，' | '；' | '：' | '、' | '—' | '–');
        if c == '\n' {
            out.push((end_of(k), Cut::Sentence));
        } else if ascii_sentence || wide_sentence || ascii_clause || wide_clause {
            let mut j = k + 1;
            while j < chars.len() && (is_closer(chars[j].1) || chars[j].1 == c) {
                j += 1;
            }
            let spaced = j == chars.len() || chars[j].1.is_whitespace();
            let kind = if ascii_sentence || wide_sentence {
                Cut::Sentence
            } else {
                Cut::Clause
            };
            if spaced || wide_sentence || wide_clause {
                out.push((end_of(j), kind));
            }
            k = j;
            continue;
        } else if c.is_whitespace() {
            out.push((chars[k].0, Cut::Space));
        }
        k += 1;
    }
    out
}

/// Splits `text` (best [`normalize`]d first) into segments of at most `max_tokens` tokens (at
/// least 1), preferring sentence ends, then clause marks, then spaces, then any character boundary.
/// A text that fits is one segment ending in [`Cut::End`]; whitespace-only text gives none.
pub fn split(text: &str, tok: &Tokenizer, max_tokens: usize) -> Vec<Segment> {
    let max = max_tokens.max(1);
    let count = |r: Range<usize>| tok.encode(&text[r]).len();
    let skip_ws = |mut i: usize| {
        while let Some(c) = text[i..].chars().next().filter(|c| c.is_whitespace()) {
            i += c.len_utf8();
        }
        i
    };
    let trim_end = |s: usize, mut e: usize| {
        while e > s {
            match text[..e].chars().next_back() {
                Some(c) if c.is_whitespace() => e -= c.len_utf8(),
                _ => break,
            }
        }
        e
    };
    let mut out = Vec::new();
    let mut s = skip_ws(0);
    while s < text.len() {
        let e = trim_end(s, text.len());
        let n = count(s..e);
        if n <= max {
            out.push(Segment {
                range: s..e,
                tokens: n,
                cut: Cut::End,
            });
            break;
        }
        // The farthest boundary of each kind that keeps the segment within the limit.
        let mut best: [Option<(usize, usize)>; 3] = [None; 3];
        for (b, kind) in boundaries(text, s) {
            let e = trim_end(s, b);
            if e <= s {
                continue;
            }
            let n = count(s..e);
            if n > max {
                break;
            }
            let slot = match kind {
                Cut::Sentence => 0,
                Cut::Clause => 1,
                _ => 2,
            };
            best[slot] = Some((e, n));
        }
        let kinds = [Cut::Sentence, Cut::Clause, Cut::Space];
        let (e, n, cut) = match best.iter().zip(kinds).find_map(|(b, k)| b.map(|b| (b, k))) {
            Some(((e, n), cut)) => (e, n, cut),
            None => {
                // The longest character prefix within the limit (at least one character).
                let ends: Vec<usize> = text[s..]
                    .char_indices()
                    .map(|(i, c)| s + i + c.len_utf8())
                    .collect();
                let (mut lo, mut hi) = (0, ends.len() - 1);
                while lo < hi {
                    let mid = (lo + hi).div_ceil(2);
                    if count(s..ends[mid]) <= max {
                        lo = mid;
                    } else {
                        hi = mid - 1;
                    }
                }
                (ends[lo], count(s..ends[lo]), Cut::Hard)
            }
        };
        out.push(Segment {
            range: s..e,
            tokens: n,
            cut,
        });
        s = skip_ws(e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normalizer_gives_normalize_in_any_fragmentation() {
        use rand::{Rng, SeedableRng};
        let texts = [
            "  Hello,\r\n  world!\t\u{feff}Caf\u{65}\u{301} \u{7}ok  \n\n ",
            "\u{1100}\u{1161}\u{11a8} a\u{300}\u{316} \u{2028} end",
            "no spaces at all",
            "   ",
        ];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for t in texts {
            let chars: Vec<char> = t.chars().collect();
            for _ in 0..200 {
                let mut n = Normalizer::new();
                let mut out = String::new();
                let mut i = 0;
                while i < chars.len() {
                    let k = rng.random_range(1..=3.min(chars.len() - i));
                    let piece: String = chars[i..i + k].iter().collect();
                    out += &n.push(&piece);
                    i += k;
                }
                out += &n.finish();
                assert_eq!(out, normalize(t), "{t:?}");
            }
        }
    }
}
