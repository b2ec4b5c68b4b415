//! Text fed in fragments (`TextFeed`): whatever the split (mid-word, mid-character, one byte at a
//! time), the ids given are those of the whole text, checked against the reference tokenizer's
//! ids of the corpus in `tests/fixtures/tokenizer/corpus.json`; and ids become final before the
//! text ends.

use crate::common;
use qtts::text::{TextFeed, Tokenizer};

/// A fixed pseudo-random sequence (xorshift64*), so that every run splits alike.
struct Splits(u64);

impl Splits {
    fn next(&mut self, max: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % max + 1
    }
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&common::tokenizer_dir()).unwrap()
}

/// The ids of `text` fed as bytes in pieces of 1 to `max` bytes.
fn fed_bytes(tok: &Tokenizer, text: &str, splits: &mut Splits, max: usize) -> Vec<u32> {
    let mut feed = TextFeed::new(tok);
    let mut got = Vec::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let end = (at + splits.next(max)).min(bytes.len());
        got.extend_from_slice(feed.push_bytes(&bytes[at..end]).unwrap());
        at = end;
    }
    got.extend(feed.finish().unwrap());
    got
}

/// The ids of `text` fed as string pieces of 1 to `max` characters.
fn fed_chars(tok: &Tokenizer, text: &str, splits: &mut Splits, max: usize) -> Vec<u32> {
    let mut feed = TextFeed::new(tok);
    let mut got = Vec::new();
    let cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let mut k = 0;
    while k < cuts.len() {
        let next = (k + splits.next(max)).min(cuts.len());
        let end = cuts.get(next).copied().unwrap_or(text.len());
        got.extend_from_slice(feed.push(&text[cuts[k]..end]));
        k = next;
    }
    got.extend(feed.finish().unwrap());
    got
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[test]
fn any_fragmentation_gives_the_whole_texts_ids() {
    let tok = tokenizer();
    let path = common::fixture("tokenizer/corpus.json");
    let corpus: Vec<Case> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut texts: Vec<(String, Vec<u32>)> = corpus.into_iter().map(|c| (c.text, c.ids)).collect();
    // Texts whose pieces interact across a cut: combining marks after a cut (NFC), Hangul jamo,
    // added tokens split anywhere, runs of white space and line ends, contractions.
    for t in [
        "e\u{301}te\u{301} cafe\u{301}, Cafe\u{300}\u{301}s",
        "\u{1100}\u{1161}\u{11a8} \u{1100}\u{1161} 한국어",
        "<|im_start|>assistant\nHi.<|im_end|><|endoftext|> <|im_",
        "a  b\t\t c \r\n\r\n  d   \n",
        "We're here, aren't we? They'll've gone. 'S 'st",
    ] {
        texts.push((t.to_owned(), tok.encode(t)));
    }
    let all: String = texts.iter().map(|(t, _)| t.as_str()).collect();
    texts.push((all.clone(), tok.encode(&all)));
    let mut splits = Splits(0x9e37_79b9_7f4a_7c15);
    for (text, want) in &texts {
        assert_eq!(&tok.encode(text), want, "the corpus ids: {text:?}");
        for max in [1, 3, 8] {
            assert_eq!(
                &fed_bytes(&tok, text, &mut splits, max),
                want,
                "bytes ≤ {max}: {text:?}"
            );
            assert_eq!(
                &fed_chars(&tok, text, &mut splits, max),
                want,
                "chars ≤ {max}: {text:?}"
            );
        }
    }
}

/// Random texts over the characters whose words interact (white space and line ends,
/// apostrophes and contractions, numbers, combining marks, jamo, CJK, the pieces of added tokens),
/// each fed in three random fragmentations.
#[test]
fn random_texts_of_the_hard_characters_give_the_whole_texts_ids() {
    let tok = tokenizer();
    let alphabet: Vec<&str> = vec![
        " ",
        " ",
        "\n",
        "\r",
        "\t",
        "\u{a0}",
        "a",
        "B",
        "é",
        "e",
        "\u{301}",
        "\u{308}",
        "'",
        "s",
        "re",
        "ll",
        "1",
        "²",
        ".",
        ",",
        "!",
        "-",
        "你",
        "。",
        "\u{1100}",
        "\u{1161}",
        "\u{11a8}",
        "<",
        "|",
        ">",
        "im_",
        "end",
        "<|im_end|>",
        "<|endoftext|>",
        "😀",
    ];
    let mut splits = Splits(0x0123_4567_89ab_cdef);
    for _ in 0..400 {
        let n = splits.next(40);
        let text: String = (0..n)
            .map(|_| alphabet[splits.next(alphabet.len()) - 1])
            .collect();
        let want = tok.encode(&text);
        for max in [1, 2, 5] {
            assert_eq!(
                fed_bytes(&tok, &text, &mut splits, max),
                want,
                "bytes ≤ {max}: {text:?}"
            );
            assert_eq!(
                fed_chars(&tok, &text, &mut splits, max),
                want,
                "chars ≤ {max}: {text:?}"
            );
        }
    }
}

#[test]
fn ids_become_final_before_the_text_ends() {
    let tok = tokenizer();
    // A word is final once the next one has started in settled text: a character after it has
    // come that no combining mark can change (the first character after a word could still take
    // one, so the word closes one character later).
    let mut feed = TextFeed::new(&tok);
    assert!(feed.push("Hello").is_empty(), "the word may still grow");
    assert_eq!(feed.push(" the"), tok.encode("Hello"));
    assert!(feed.push("re,").is_empty(), "the comma is not settled");
    feed.push(" how");
    assert_eq!(feed.ids(), tok.encode("Hello there,"));
    assert_eq!(feed.finish().unwrap(), tok.encode(" how"));
    // Chinese: a run of letters is one word, closed by the punctuation after it.
    let mut feed = TextFeed::new(&tok);
    for c in ["你", "好", "世", "界", "。"] {
        assert!(feed.push(c).is_empty());
    }
    assert_eq!(feed.push("再"), tok.encode("你好世界"));
}

#[test]
fn bytes_that_are_not_utf8_are_refused() {
    let tok = tokenizer();
    let mut feed = TextFeed::new(&tok);
    let e = feed.push_bytes(b"ok \xff").unwrap_err();
    assert_eq!(e.found, vec![0xff]);
    let mut feed = TextFeed::new(&tok);
    feed.push_bytes("你".as_bytes()).unwrap();
    feed.push_bytes(&"好".as_bytes()[..2]).unwrap();
    assert_eq!(
        feed.finish().unwrap_err().found,
        "好".as_bytes()[..2].to_vec()
    );
}
