//! The Qwen2 pre-tokenizer: the split of text into the words that BPE encodes one by one.
//!
//! Contract: [`pre_tokenize`] borrows the text and allocates nothing; the character classes it reads
//! are built once per process, on first use (a few KB), from the Unicode tables of `regex-syntax`.
//! It never blocks after that first use and never panics.
//!
//! The split is the one `transformers`' `Qwen2Tokenizer` makes with the `regex` module and
//! [`QWEN2_PATTERN`], written by hand (no backtracking, one pass, linear time).
//! At each position the first alternative of the pattern that matches wins, as in the regex:
//!
//! 1. `(?i:'s|'t|'re|'ve|'m|'ll|'d)`: an ASCII apostrophe and a contraction, any case
//!    (`ſ`, U+017F, folds to `s`).
//! 2. `[^\r\n\p{L}\p{N}]?\p{L}+`: a run of letters, with the one character before it if that is
//!    neither CR, LF, a letter nor a number.
//! 3. `\p{N}`: a single number character.
//! 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*`: a run of "other" characters (neither white space, letter nor
//!    number), with one space before it, and the CR and LF characters after it.
//! 5. `\s*[\r\n]+`: white space up to and including its last CR or LF.
//! 6. `\s+(?!\S)`: white space that ends the text, or all of a run but its last character.
//! 7. `\s+`: the one white-space character left before a non-space.
//!
//! Every character is in exactly one word, so the words concatenate to the text.

use std::sync::OnceLock;

/// The pre-tokenization regex of `transformers`' `tokenization_qwen2.py` (4.57.3), verbatim.
/// [`pre_tokenize`] implements it without a regex engine; the tests compare the two.
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The class of a character, as the pattern sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Class {
    /// `\p{L}`: General_Category Letter.
    Letter,
    /// `\p{N}`: General_Category Number.
    Number,
    /// `\s`: the White_Space property (the `regex` module's `\s`, which is not Python's `str.isspace`).
    Space,
    /// Everything else: punctuation, symbols, marks, controls, unassigned.
    Other,
}

/// Sorted, disjoint code-point ranges with their class, and a table for ASCII.
struct Classes {
    ascii: [Class; 128],
    ranges: Vec<(u32, u32, Class)>,
}

impl Classes {
    fn get() -> &'static Classes {
        static CLASSES: OnceLock<Classes> = OnceLock::new();
        CLASSES.get_or_init(Classes::build)
    }

    fn build() -> Classes {
        let mut ranges = Vec::new();
        for (pattern, class) in [
            (r"\p{L}", Class::Letter),
            (r"\p{N}", Class::Number),
            (r"\s", Class::Space),
        ] {
            ranges.extend(
                unicode_ranges(pattern)
                    .into_iter()
                    .map(|(lo, hi)| (lo, hi, class)),
            );
        }
        ranges.sort_unstable_by_key(|r| r.0);
        let mut classes = Classes {
            ascii: [Class::Other; 128],
            ranges,
        };
        let mut ascii = [Class::Other; 128];
        for (b, slot) in ascii.iter_mut().enumerate() {
            *slot = classes.lookup(b as u32);
        }
        classes.ascii = ascii;
        classes
    }

    fn lookup(&self, c: u32) -> Class {
        // The three classes are disjoint (letters and numbers are never white space), so the range
        // that starts last at or before `c` is the only one that can hold it.
        let i = self.ranges.partition_point(|r| r.0 <= c);
        match i.checked_sub(1).map(|i| self.ranges[i]) {
            Some((_, hi, class)) if c <= hi => class,
            _ => Class::Other,
        }
    }

    #[inline]
    fn of(&self, c: char) -> Class {
        match self.ascii.get(c as usize) {
            Some(&class) => class,
            None => self.lookup(c as u32),
        }
    }
}

/// The code-point ranges of a Unicode class, from `regex-syntax`'s tables (those of `fancy-regex`
/// and `regex` too). The patterns are constants, so the parse cannot fail; if it did, the class
/// would be empty and the tests would say so.
fn unicode_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class as HirClass, HirKind};
    match regex_syntax::Parser::new()
        .parse(pattern)
        .map(|h| h.into_kind())
    {
        Ok(HirKind::Class(HirClass::Unicode(class))) => class
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        _ => Vec::new(),
    }
}

/// Splits `text` into the words of the Qwen2 pre-tokenizer, in order.
/// The words concatenate to `text`; none is empty.
///
/// `text` should already be NFC-normalized and free of added tokens, as [`super::Tokenizer::encode`]
/// makes it; this function does neither.
pub fn pre_tokenize(text: &str) -> PreTokens<'_> {
    PreTokens {
        rest: text,
        classes: Classes::get(),
    }
}

/// The iterator of [`pre_tokenize`].
pub struct PreTokens<'a> {
    rest: &'a str,
    classes: &'static Classes,
}

impl std::fmt::Debug for PreTokens<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreTokens")
            .field("rest", &self.rest)
            .finish()
    }
}

impl<'a> Iterator for PreTokens<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.rest.is_empty() {
            return None;
        }
        // `word_len` is at least one character and ends on a character boundary.
        let n = word_len(self.rest, self.classes).clamp(1, self.rest.len());
        let (word, rest) = self.rest.split_at_checked(n).unwrap_or((self.rest, ""));
        self.rest = rest;
        Some(word)
    }
}

impl std::iter::FusedIterator for PreTokens<'_> {}

/// The byte length of the word at the start of `s` (non-empty).
fn word_len(s: &str, classes: &Classes) -> usize {
    let mut chars = s.chars();
    let Some(c) = chars.next() else {
        return 0;
    };
    let c_len = c.len_utf8();
    let next = chars.next();
    let class = classes.of(c);

    // 1. Contractions.
    if c == '\'' {
        if let Some(n) = next {
            match n {
                's' | 'S' | 'ſ' | 't' | 'T' | 'm' | 'M' | 'd' | 'D' => return 1 + n.len_utf8(),
                'r' | 'R' | 'v' | 'V' => {
                    if matches!(chars.next(), Some('e' | 'E')) {
                        return 3;
                    }
                }
                'l' | 'L' => {
                    if matches!(chars.next(), Some('l' | 'L')) {
                        return 3;
                    }
                }
                _ => {}
            }
        }
    }

    // 2. Letters, with one leading character that is not CR, LF, a letter or a number.
    if class == Class::Letter {
        return c_len + run(&s[c_len..], |x| classes.of(x) == Class::Letter);
    }
    let next_class = next.map(|n| classes.of(n));
    if class != Class::Number && c != '\r' && c != '\n' && next_class == Some(Class::Letter) {
        return c_len + run(&s[c_len..], |x| classes.of(x) == Class::Letter);
    }

    // 3. One number.
    if class == Class::Number {
        return c_len;
    }

    // 4. Other characters, with one leading space and the line breaks after them.
    let start = if class == Class::Other {
        Some(0)
    } else if c == ' ' && next_class == Some(Class::Other) {
        Some(1)
    } else {
        None
    };
    if let Some(start) = start {
        let end = start + run(&s[start..], |x| classes.of(x) == Class::Other);
        return end + run(&s[end..], |x| x == '\r' || x == '\n');
    }

    // `c` is white space: find its run, the end of the run's last line break, and its last character.
    let mut end = 0;
    let mut after_break = 0;
    let mut last_start = 0;
    for (i, x) in s.char_indices() {
        if classes.of(x) != Class::Space {
            break;
        }
        last_start = i;
        end = i + x.len_utf8();
        if x == '\r' || x == '\n' {
            after_break = end;
        }
    }
    // 5. White space through its last line break.
    if after_break > 0 {
        return after_break;
    }
    // 6. White space at the end of the text, or all of the run but its last character.
    if end == s.len() {
        return end;
    }
    if last_start > 0 {
        return last_start;
    }
    // 7. A single white-space character before a non-space.
    end
}

/// The byte length of the longest prefix of `s` whose characters all satisfy `f`.
fn run(s: &str, f: impl Fn(char) -> bool) -> usize {
    s.char_indices()
        .find(|&(_, x)| !f(x))
        .map_or(s.len(), |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<&str> {
        pre_tokenize(text).collect()
    }

    #[test]
    fn examples() {
        let cases: &[(&str, &[&str])] = &[
            ("", &[]),
            ("Hello world", &["Hello", " world"]),
            ("it's", &["it", "'s"]),
            ("IT'LL 'ſ", &["IT", "'LL", " '", "ſ"]),
            ("a   b", &["a", "  ", " b"]),
            ("a  \n\n  b", &["a", "  \n\n", " ", " b"]),
            ("!!hello", &["!!", "hello"]),
            (" !!\r\n\r\nx", &[" !!\r\n\r\n", "x"]),
            ("\t!", &["\t", "!"]),
            ("  !", &[" ", " !"]),
            ("123", &["1", "2", "3"]),
            ("x  ", &["x", "  "]),
            ("¿Qué?", &["¿Qué", "?"]),
        ];
        for (text, want) in cases {
            assert_eq!(split(text), *want, "{text:?}");
        }
    }

    /// The classes against those of the `regex` module that the reference tokenizer used
    /// (`tests/fixtures/tokenizer/classes.json`, from `tools/make_tokenizer_fixture.py`).
    #[test]
    fn classes_match_the_reference_regex_module() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tokenizer/classes.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut reference = vec![Class::Other; 0x110000];
        for (key, class) in [
            ("L", Class::Letter),
            ("N", Class::Number),
            ("S", Class::Space),
        ] {
            for r in json[key].as_array().unwrap() {
                let lo = r[0].as_u64().unwrap() as usize;
                let hi = r[1].as_u64().unwrap() as usize;
                reference[lo..=hi].fill(class);
            }
        }
        let unassigned = unicode_ranges(r"\p{Cn}");
        let is_unassigned = |c: u32| unassigned.iter().any(|&(lo, hi)| lo <= c && c <= hi);
        let classes = Classes::get();
        let mut newer = 0;
        let mut wrong = Vec::new();
        for (c, &want) in reference.iter().enumerate() {
            let Some(ch) = char::from_u32(c as u32) else {
                continue;
            };
            let got = classes.of(ch);
            if got == want {
                continue;
            }
            // FIXME: regex-syntax's tables are Unicode 16; the reference `regex` module may know
            // characters assigned since. Those are `Other` here. Anything else is a bug.
            if got == Class::Other && is_unassigned(c as u32) {
                newer += 1;
            } else {
                wrong.push(format!("U+{c:04X}: {got:?}, reference {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "{} disagreements: {wrong:?}", wrong.len());
        eprintln!(
            "{newer} code points are classified by the reference but unassigned here ({})",
            json["unicode"]
        );
    }
}
