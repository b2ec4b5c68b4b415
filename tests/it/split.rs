//! Text clean-up and splitting, with the released Qwen2 tokenizer (`tests/fixtures/tokenizer/released`): a 5,000-character
//! paragraph is cut into segments within the token limit, at the best boundary available, and
//! nothing but whitespace is lost.

use crate::common;

use qtts::text::split::{normalize, split, Cut, Segment};
use qtts::text::Tokenizer;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&common::tokenizer_dir()).unwrap()
}

/// Segments are in order, each within the limit and counted right, and the text between them is
/// whitespace only: together they hold every other character of the text.
fn check_cover(text: &str, segs: &[Segment], tok: &Tokenizer, max: usize) {
    let mut at = 0;
    for s in segs {
        assert!(text[at..s.range.start].chars().all(char::is_whitespace));
        let piece = &text[s.range.clone()];
        assert!(!piece.is_empty() && piece.trim() == piece, "{piece:?}");
        assert_eq!(tok.encode(piece).len(), s.tokens);
        assert!(s.tokens <= max, "{} > {max}", s.tokens);
        at = s.range.end;
    }
    assert!(text[at..].chars().all(char::is_whitespace));
    assert_eq!(segs.last().map(|s| s.cut), Some(Cut::End));
}

fn sentences(n_chars: usize) -> String {
    let words = [
        "the",
        "engine",
        "speaks",
        "every",
        "sentence",
        "as",
        "soon",
        "as",
        "its",
        "first",
        "frame",
        "exists",
        "while",
        "playback",
        "continues",
        "on",
        "the",
        "other",
        "core",
    ];
    let mut s = String::new();
    let mut i = 0usize;
    while s.len() < n_chars {
        let len = 6 + (i * 7) % 11;
        for w in 0..len {
            if w > 0 {
                s.push(' ');
            }
            s.push_str(words[(i * 3 + w * 5) % words.len()]);
        }
        s.push_str(if i % 5 == 4 { "? " } else { ". " });
        i += 1;
    }
    s.truncate(n_chars);
    s
}

#[test]
fn long_text_splits_at_sentences() {
    let tok = tokenizer();
    let text = normalize(&sentences(5000));
    assert!(text.chars().count() >= 4990);
    let segs = split(&text, &tok, 150);
    check_cover(&text, &segs, &tok, 150);
    let total = tok.encode(&text).len();
    assert!(
        segs.len() >= total.div_ceil(150),
        "{} segments, {total} tokens",
        segs.len()
    );
    for s in &segs[..segs.len() - 1] {
        assert_eq!(s.cut, Cut::Sentence, "{:?}", &text[s.range.clone()]);
        assert!(text[s.range.clone()].ends_with(['.', '?']));
        // Greedy: the next sentence would not have fitted.
        assert!(s.tokens > 150 - 40, "{} tokens only", s.tokens);
    }
}

#[test]
fn long_text_without_punctuation_splits_at_spaces() {
    let tok = tokenizer();
    let text = normalize(&sentences(5000).replace(['.', '?'], ""));
    let segs = split(&text, &tok, 150);
    check_cover(&text, &segs, &tok, 150);
    let total = tok.encode(&text).len();
    assert!(
        segs.len() >= total.div_ceil(150),
        "{} segments, {total} tokens",
        segs.len()
    );
    assert!(segs[..segs.len() - 1].iter().all(|s| s.cut == Cut::Space));
}

#[test]
fn text_without_spaces_or_punctuation_is_cut_between_characters() {
    let tok = tokenizer();
    // 5,000 CJK characters, no punctuation at all.
    let base = "语音合成引擎在第一帧生成后立即播放声音同时继续预测下一帧";
    let text: String = base.chars().cycle().take(5000).collect();
    let segs = split(&text, &tok, 150);
    check_cover(&text, &segs, &tok, 150);
    assert!(segs[..segs.len() - 1].iter().all(|s| s.cut == Cut::Hard));
    // Hard cuts are as long as the limit allows: one more character would not fit.
    for s in &segs[..segs.len() - 1] {
        let next = text[s.range.end..].chars().next().unwrap();
        let longer = &text[s.range.start..s.range.end + next.len_utf8()];
        assert!(tok.encode(longer).len() > 150);
    }
    // With Chinese punctuation it cuts at the full stops and commas instead.
    let punct: String = base
        .chars()
        .cycle()
        .take(5000)
        .enumerate()
        .map(|(i, c)| match i % 40 {
            39 => '。',
            19 => '，',
            _ => c,
        })
        .collect();
    let segs = split(&punct, &tok, 150);
    check_cover(&punct, &segs, &tok, 150);
    assert!(segs[..segs.len() - 1]
        .iter()
        .all(|s| s.cut == Cut::Sentence));
}

#[test]
fn clause_marks_are_the_second_choice() {
    let tok = tokenizer();
    let clause = "one clause after another, ".repeat(60);
    let segs = split(clause.trim(), &tok, 50);
    check_cover(clause.trim(), &segs, &tok, 50);
    assert!(segs[..segs.len() - 1].iter().all(|s| s.cut == Cut::Clause));
    // Decimal points and abbreviations without a following space are no sentence end.
    let t = "Pi is 3.14159 and e is 2.71828 today";
    assert_eq!(split(t, &tok, 150).len(), 1);
}

#[test]
fn short_and_empty_texts() {
    let tok = tokenizer();
    assert!(split("", &tok, 150).is_empty());
    assert!(split(" \n\t ", &tok, 150).is_empty());
    let segs = split("Hello.", &tok, 150);
    assert_eq!(segs.len(), 1);
    assert_eq!((segs[0].range.clone(), segs[0].cut), (0..6, Cut::End));
}

#[test]
fn normalize_cleans_what_users_paste() {
    assert_eq!(normalize("  Hello,\t\tworld!  "), "Hello, world!");
    assert_eq!(
        normalize("one\r\ntwo\rthree\n\n\nfour"),
        "one\ntwo\nthree\nfour"
    );
    assert_eq!(normalize("a \n b"), "a\nb");
    assert_eq!(normalize("\u{feff}bell\u{7}s\u{0}"), "bells");
    // NFC: e + combining acute becomes é.
    assert_eq!(normalize("cafe\u{301}"), "caf\u{e9}");
    assert_eq!(normalize("a\u{a0}b\u{3000}c"), "a b c");
    // Emoji sequences (joiners are format characters, not controls) stay whole.
    let family = "\u{1f468}\u{200d}\u{1f469}\u{200d}\u{1f467}";
    assert_eq!(normalize(family), family);
}
