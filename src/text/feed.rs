//! Text that arrives over time (a language model's answer, a few tokens at a time) turned into the
//! token ids the whole text would give, each one as soon as no later text can change it.
//!
//! Contract: [`TextFeed::push`] and [`TextFeed::push_bytes`] take any fragment (split mid-word,
//! and for bytes mid-character) and return the ids that became final with it;
//! [`TextFeed::finish`] returns the rest. Whatever the fragmentation, the ids given, in order, are
//! [`Tokenizer::encode`] of the concatenated text. An id is final once:
//! - NFC is settled: the text it comes from ends before a character with a normalization boundary
//!   before it (canonical combining class 0 and NFC quick check yes: nothing after such a
//!   character can recompose across it);
//! - its pre-tokenizer word is closed: a later word of the settled text has started, and the word
//!   ends in something other than white space (the Qwen2 pattern has no look-behind, so such a
//!   word never changes; the last word can still grow or split, and a word ending in white space
//!   can take more of the white space after it, `\s*[\r\n]+`);
//! - no added token (`<|im_start|>`, ...) could begin before the cut and end after it;
//! - and BPE merges only within a word, so a closed word's ids are final.
//!
//! Each push does work in proportion to the text held back (the unclosed word and what is not yet
//! settled), not to everything pushed. No IO, no lock, no panic.

use unicode_normalization::char::canonical_combining_class;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use super::{pre_tokenize, Tokenizer};

/// Bytes that are not UTF-8 given to [`TextFeed::push_bytes`] (or left unfinished at
/// [`TextFeed::finish`]). Send the text as UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("text fed is not UTF-8: expected a valid UTF-8 sequence, found bytes {found:02x?}")]
pub struct NotUtf8 {
    /// The bytes that do not form a character.
    pub found: Vec<u8>,
}

/// Appends `bytes` to `partial` and takes out the whole characters at its start; the start of a
/// character whose last bytes have not come yet stays in `partial`. A sequence that can never be
/// completed is an error (and stays in `partial`).
pub(crate) fn take_utf8(partial: &mut Vec<u8>, bytes: &[u8]) -> Result<String, NotUtf8> {
    partial.extend_from_slice(bytes);
    let valid = match std::str::from_utf8(partial) {
        Ok(s) => s.len(),
        Err(e) => match e.error_len() {
            Some(n) => {
                let at = e.valid_up_to();
                return Err(NotUtf8 {
                    found: partial[at..at + n].to_vec(),
                });
            }
            None => e.valid_up_to(),
        },
    };
    let rest = partial.split_off(valid);
    let text = std::mem::replace(partial, rest);
    // `text` is the valid prefix `from_utf8` measured.
    Ok(String::from_utf8(text).unwrap_or_default())
}

/// An incremental encoder over a [`Tokenizer`] (see the module docs).
#[derive(Debug)]
pub struct TextFeed<'t> {
    tokenizer: &'t Tokenizer,
    /// The end of a character split across [`TextFeed::push_bytes`] calls.
    partial: Vec<u8>,
    /// Text whose NFC is not settled yet (it starts at a normalization boundary).
    raw: String,
    /// NFC text whose ids are not final yet (it starts at a closed word's end).
    settled: String,
    /// Every final id so far.
    ids: Vec<u32>,
    /// The longest added token, in bytes.
    longest_added: usize,
}

/// Whether normalization can never reach across the start of `c`.
pub(super) fn boundary_before(c: char) -> bool {
    canonical_combining_class(c) == 0 && is_nfc_quick(std::iter::once(c)) == IsNormalized::Yes
}

impl<'t> TextFeed<'t> {
    /// A feed with nothing pushed yet.
    pub fn new(tokenizer: &'t Tokenizer) -> TextFeed<'t> {
        let longest_added = tokenizer.added.keys().map(|t| t.len()).max().unwrap_or(0);
        TextFeed {
            tokenizer,
            partial: Vec::new(),
            raw: String::new(),
            settled: String::new(),
            ids: Vec::new(),
            longest_added,
        }
    }

    /// Every id final so far, in order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Adds `text`; returns the ids that became final with it.
    pub fn push(&mut self, text: &str) -> &[u32] {
        let before = self.ids.len();
        self.raw.push_str(text);
        self.settle();
        &self.ids[before..]
    }

    /// Adds UTF-8 bytes, which may end (or begin) inside a character; returns the ids that became
    /// final with them.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Result<&[u32], NotUtf8> {
        let before = self.ids.len();
        let text = take_utf8(&mut self.partial, bytes)?;
        self.raw.push_str(&text);
        self.settle();
        Ok(&self.ids[before..])
    }

    /// Ends the text: the ids not given yet.
    pub fn finish(mut self) -> Result<Vec<u32>, NotUtf8> {
        if !self.partial.is_empty() {
            return Err(NotUtf8 {
                found: std::mem::take(&mut self.partial),
            });
        }
        let raw = std::mem::take(&mut self.raw);
        self.settled.extend(raw.nfc());
        let before = self.ids.len();
        self.tokenizer
            .encode_normalized_into(&self.settled, &mut self.ids);
        Ok(self.ids.split_off(before))
    }

    /// Moves the settled part of `raw` into `settled`, then the closed words of `settled` into
    /// `ids`.
    fn settle(&mut self) {
        // The last normalization boundary of `raw`: what is before it is settled.
        let Some(b) = self
            .raw
            .char_indices()
            .rev()
            .find(|&(_, c)| boundary_before(c))
            .map(|(i, _)| i)
        else {
            return;
        };
        if b > 0 {
            let rest = self.raw.split_off(b);
            let head = std::mem::replace(&mut self.raw, rest);
            self.settled.extend(head.nfc());
        }
        let cut = self.closed_end();
        if cut > 0 {
            let rest = self.settled.split_off(cut);
            let closed = std::mem::replace(&mut self.settled, rest);
            self.tokenizer
                .encode_normalized_into(&closed, &mut self.ids);
        }
    }

    /// Where the closed words of `settled` end: the start of its last pre-tokenizer word, or an
    /// earlier point if an added token could still begin before it and end after it.
    fn closed_end(&self) -> usize {
        let text = self.settled.as_str();
        let mut segment = 0;
        if let Some(m) = &self.tokenizer.added_matcher {
            if let Some(last) = m.find_iter(text.as_bytes()).last() {
                segment = last.end();
            }
        }
        // Where the words of the last segment start: the cuts that keep every word whole.
        let seg = &text[segment..];
        let mut starts = Vec::new();
        let mut at = segment;
        for w in pre_tokenize(seg) {
            starts.push(at);
            at += w.len();
        }
        // The last word may still grow.
        let cut = starts.last().copied().unwrap_or(text.len());
        // No added token may straddle the cut: back off to the last word start before any place
        // where one could begin.
        let lowest = cut.saturating_sub(self.longest_added);
        let mut limit = cut;
        for start in lowest..cut {
            if !text.is_char_boundary(start) {
                continue;
            }
            let head = &text[start..cut];
            if self
                .tokenizer
                .added
                .keys()
                .any(|t| t.len() > head.len() && t.starts_with(head))
            {
                limit = start;
                break;
            }
        }
        // A word that ends in white space can still grow into the white space after it (`\s*`
        // up to the run's last line end, `\s+(?!\S)`): cut only after a word that ends in
        // something else, or after an added token.
        let closed = |s: usize| s == segment || !text[..s].ends_with(char::is_whitespace);
        match starts.iter().rev().find(|&&s| s <= limit && closed(s)) {
            Some(&s) => s,
            None if limit >= segment => segment,
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries() {
        assert!(boundary_before('a'));
        assert!(boundary_before('你'));
        assert!(!boundary_before('\u{301}'), "a combining acute accent");
        assert!(
            !boundary_before('\u{1161}'),
            "a Hangul vowel jamo composes with the lead"
        );
    }
}
