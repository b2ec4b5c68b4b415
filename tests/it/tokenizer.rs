//! The text tokenizer against the reference `Qwen2Tokenizer` (transformers 4.57.3, slow), on the
//! real Qwen3-TTS tokenizer files in `tests/fixtures/tokenizer/released/`.
//! The expected ids are in `tests/fixtures/tokenizer/` (`tools/make_tokenizer_fixture.py`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use fancy_regex::Regex;
use qtts::text::{pre_tokenize, Tokenizer, TokenizerError, QWEN2_PATTERN};
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use unicode_normalization::UnicodeNormalization;

/// The text vocabulary size of the released checkpoints (`text_vocab_size`).
const TEXT_VOCAB: usize = 151_936;

fn tokenizer_dir() -> PathBuf {
    crate::common::tokenizer_dir()
}

fn fixture(name: &str) -> PathBuf {
    crate::common::root()
        .join("tests/fixtures/tokenizer")
        .join(name)
}

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_dir(&tokenizer_dir()).unwrap())
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct DecodeCase {
    ids: Vec<u32>,
    text: String,
}

fn corpus() -> &'static [Case] {
    static CORPUS: OnceLock<Vec<Case>> = OnceLock::new();
    CORPUS.get_or_init(|| {
        let text = std::fs::read_to_string(fixture("corpus.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

/// Encodes every corpus text and lists every disagreement with the reference.
fn mismatches(tok: &Tokenizer) -> Vec<String> {
    let mut bad = Vec::new();
    for case in corpus() {
        let got = tok.encode(&case.text);
        if got != case.ids {
            let at = got
                .iter()
                .zip(&case.ids)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(case.ids.len()));
            let show = |ids: &[u32]| {
                ids.iter()
                    .skip(at.saturating_sub(2))
                    .take(8)
                    .map(|&id| format!("{id}:{:?}", tok.id_to_token(id).unwrap_or("?")))
                    .collect::<Vec<_>>()
            };
            bad.push(format!(
                "{:?}: first difference at {at}: got {:?}, expected {:?}",
                case.text,
                show(&got),
                show(&case.ids)
            ));
        }
    }
    bad
}

#[test]
fn corpus_ids_equal_the_reference() {
    let bad = mismatches(tokenizer());
    let n = corpus().len();
    assert!(
        bad.is_empty(),
        "{} of {n} strings disagree:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(n >= 250, "corpus has {n} strings");
    eprintln!("{n}/{n} strings agree");
}

/// The two checks of MODEL-NOTES.md §2.7.
#[test]
fn model_notes_checks() {
    fn check(text: &str, expect: &[u32]) {
        assert_eq!(tokenizer().encode(text), expect, "{text:?}");
    }
    check(
        "<|im_start|>assistant\nHello world, this is Qwen3-TTS.<|im_end|>\n<|im_start|>assistant\n",
        &[
            151644, 77091, 198, 9707, 1879, 11, 419, 374, 1207, 16948, 18, 9285, 9951, 13, 151645,
            198, 151644, 77091, 198,
        ],
    );
    check(
        "<|im_start|>user\nSpeak happily.<|im_end|>\n",
        &[151644, 872, 198, 95845, 36775, 13, 151645, 198],
    );
}

#[test]
fn special_token_ids() {
    let tok = tokenizer();
    for (token, id) in [
        ("<|endoftext|>", 151643),
        ("<|im_start|>", 151644),
        ("<|im_end|>", 151645),
        ("<tts_pad>", 151671),
        ("<tts_text_bos>", 151672),
        ("<tts_text_eod>", 151673),
        ("<tts_text_bos_single>", 151674),
        ("assistant", 77091),
        ("Ċ", 198),
    ] {
        assert_eq!(tok.token_to_id(token), Some(id), "{token}");
        assert_eq!(tok.id_to_token(id), Some(token), "{id}");
    }
    assert!(tok.is_added(151671));
    assert!(!tok.is_added(77091));
    assert_eq!(tok.token_to_id(" world"), None);
    assert_eq!(tok.id_to_token(151_700), None);
    assert_eq!(tok.n_ids(), 151_676);
}

#[test]
fn decode_of_encode_is_nfc_text() {
    let tok = tokenizer();
    let mut bad = Vec::new();
    for case in corpus() {
        let nfc: String = case.text.nfc().collect();
        match tok.decode(&case.ids) {
            Ok(text) if text == nfc => {}
            other => bad.push(format!("{:?}: {other:?}", case.text)),
        }
    }
    assert!(
        bad.is_empty(),
        "{} round trips fail:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn decode_equals_the_reference() {
    let text = std::fs::read_to_string(fixture("decode.json")).unwrap();
    let cases: Vec<DecodeCase> = serde_json::from_str(&text).unwrap();
    let tok = tokenizer();
    let bad: Vec<String> = cases
        .iter()
        .filter_map(|c| match tok.decode(&c.ids) {
            Ok(t) if t == c.text => None,
            got => Some(format!("{:?}: got {got:?}, expected {:?}", c.ids, c.text)),
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{} of {}:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

#[test]
fn decode_refuses_unknown_ids() {
    let tok = tokenizer();
    for id in [151_676, 151_935, 151_936, u32::MAX] {
        match tok.decode(&[9707, id]) {
            Err(TokenizerError::UnknownId { id: got, n_ids }) => {
                assert_eq!((got, n_ids), (id, 151_676))
            }
            other => panic!("{id}: {other:?}"),
        }
    }
}

/// The GGUF arrays `qtts convert` writes for the text vocabulary: tokens in id order with
/// `[PAD{i}]` for the ids no file names, their llama.cpp types, and the merges.
struct Parts {
    tokens: Vec<String>,
    types: Vec<i32>,
    merges: Vec<String>,
}

fn gguf_parts() -> Parts {
    #[derive(Deserialize)]
    struct Added {
        content: String,
        special: bool,
    }
    #[derive(Deserialize)]
    struct Config {
        added_tokens_decoder: BTreeMap<String, Added>,
    }
    let dir = tokenizer_dir();
    let vocab: BTreeMap<String, usize> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("vocab.json")).unwrap()).unwrap();
    let config: Config =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap())
            .unwrap();
    let mut tokens: Vec<String> = (0..TEXT_VOCAB).map(|i| format!("[PAD{i}]")).collect();
    let mut types = vec![5; TEXT_VOCAB];
    for (token, id) in vocab {
        tokens[id] = token;
        types[id] = 1;
    }
    for (id, added) in config.added_tokens_decoder {
        let id: usize = id.parse().unwrap();
        tokens[id] = added.content;
        types[id] = if added.special { 3 } else { 4 };
    }
    let merges = std::fs::read_to_string(dir.join("merges.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("#version") && !l.is_empty())
        .map(str::to_owned)
        .collect();
    Parts {
        tokens,
        types,
        merges,
    }
}

#[test]
fn gguf_parts_give_the_same_ids() {
    let parts = gguf_parts();
    let tok = Tokenizer::from_parts(&parts.tokens, &parts.types, &parts.merges).unwrap();
    let bad = mismatches(&tok);
    assert!(
        bad.is_empty(),
        "{} disagree:\n{}",
        bad.len(),
        bad.join("\n")
    );
    let dir_tok = tokenizer();
    for case in corpus() {
        assert_eq!(
            tok.decode(&case.ids).unwrap(),
            dir_tok.decode(&case.ids).unwrap()
        );
    }
    // The unused slots are not tokens.
    assert_eq!(tok.id_to_token(151_700), None);
    assert_eq!(tok.token_to_id("[PAD151700]"), None);
    assert!(tok.decode(&[151_700]).is_err());
}

/// Input a voice assistant may be handed by accident or malice. Each must finish, without panic,
/// and round-trip.
#[test]
fn hostile_text() {
    let tok = tokenizer();
    let n = if cfg!(miri) { 100 } else { 100_000 };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let letters: Vec<char> = "abcdefghijklmnopqrstuvwxyzäößАБВ".chars().collect();
    let texts = [
        "\0".repeat(n),
        "a\0b\0".repeat(n / 4),
        "\u{FFFD}".repeat(n),
        "a".repeat(n),
        "ab".repeat(n / 2),
        (0..n)
            .map(|_| letters[rng.random_range(0..letters.len())])
            .collect(),
        "你".repeat(n),
        "😀".repeat(n),
        "👨‍👩‍👧‍👦".repeat(n / 7),
        "9".repeat(n),
        "!".repeat(n),
        "'".repeat(n),
        "'s".repeat(n / 2),
        " ".repeat(n),
        "\n".repeat(n),
        " \t\r\n\u{3000}\u{a0}".repeat(n / 6),
        "\u{301}".repeat(n),
        "e\u{301}".repeat(n / 2),
        "<|im_start|".repeat(n / 11),
        "<|im_start|>".repeat(n / 12),
        "\u{10FFFF}\u{E000}\u{FEFF}\u{200B}".repeat(n / 4),
        String::new(),
    ];
    for text in &texts {
        let start = std::time::Instant::now();
        let ids = tok.encode(text);
        let elapsed = start.elapsed();
        let back = tok.decode(&ids).unwrap();
        assert_eq!(
            back,
            text.nfc().collect::<String>(),
            "{:?}",
            &text[..text.len().min(40)]
        );
        eprintln!(
            "{:>9} bytes of {:?}...: {} ids in {elapsed:?}",
            text.len(),
            text.chars().take(4).collect::<String>(),
            ids.len()
        );
    }
}

/// The hand-written pre-tokenizer against the reference pattern in a backtracking regex engine,
/// on the corpus and on random strings of the characters the pattern distinguishes.
#[test]
fn pre_tokenizer_equals_the_regex() {
    let re = Regex::new(QWEN2_PATTERN).unwrap();
    let by_regex = |text: &str| -> Vec<String> {
        re.find_iter(text)
            .map(|m| m.unwrap().as_str().to_owned())
            .collect()
    };
    let ours = |text: &str| -> Vec<String> { pre_tokenize(text).map(str::to_owned).collect() };
    for case in corpus() {
        let text: String = case.text.nfc().collect();
        assert_eq!(ours(&text), by_regex(&text), "{text:?}");
    }
    let alphabet: Vec<&str> = vec![
        "a", "Z", "é", "ſ", "Ж", "你", "ー", "s", "S", "t", "T", "r", "R", "e", "E", "v", "V", "m",
        "M", "l", "L", "d", "D", "'", "’", "1", "٣", "½", "Ⅻ", " ", "  ", "\t", "\n", "\r", "\r\n",
        "\u{b}", "\u{c}", "\u{85}", "\u{a0}", "\u{2028}", "\u{3000}", "\u{1c}", "\u{200b}", "!",
        ".", "?", "-", "😀", "\u{301}", "\u{94d}", "\0", "\u{fffd}", "_", "$",
    ];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let rounds = if cfg!(miri) { 50 } else { 20_000 };
    for _ in 0..rounds {
        let len = rng.random_range(0..16);
        let text: String = (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        assert_eq!(ours(&text), by_regex(&text), "{text:?}");
    }
}

fn expect_bad_entry(
    result: Result<Tokenizer, TokenizerError>,
    want_origin: &str,
    want_entry: &str,
) {
    match result {
        Err(TokenizerError::BadEntry { origin, entry, .. }) => {
            assert!(
                origin.ends_with(want_origin) && entry.contains(want_entry),
                "origin {origin:?}, entry {entry:?}; expected {want_origin:?}, {want_entry:?}"
            );
        }
        other => panic!("expected BadEntry {want_origin} {want_entry}, got {other:?}"),
    }
}

/// A minimal valid GGUF-style vocabulary: the 256 byte tokens, `ab`, and `<s>`.
fn small_parts() -> Parts {
    let mut tokens: Vec<String> = qtts::text::bpe::byte_chars()
        .iter()
        .map(|c| c.to_string())
        .collect();
    tokens.push("ab".into());
    tokens.push("<s>".into());
    let mut types = vec![1; tokens.len()];
    types[257] = 3;
    Parts {
        tokens,
        types,
        merges: vec!["a b".into()],
    }
}

#[test]
fn small_parts_work() {
    let p = small_parts();
    let tok = Tokenizer::from_parts(&p.tokens, &p.types, &p.merges).unwrap();
    assert_eq!(tok.encode("ab<s>aab"), [256, 257, 97, 256]);
    assert_eq!(tok.decode(&[256, 257, 97, 256]).unwrap(), "ab<s>aab");
}

#[test]
fn bad_parts_are_refused() {
    let build = |f: &dyn Fn(&mut Parts)| {
        let mut p = small_parts();
        f(&mut p);
        Tokenizer::from_parts(&p.tokens, &p.types, &p.merges)
    };
    let origin_tokens = "tokenizer.ggml.tokens";
    let origin_types = "tokenizer.ggml.token_type";
    let origin_merges = "tokenizer.ggml.merges";
    expect_bad_entry(
        build(&|p| {
            p.types.pop();
        }),
        origin_types,
        "length",
    );
    expect_bad_entry(build(&|p| p.types[10] = 7), origin_types, "token 10");
    expect_bad_entry(
        build(&|p| p.merges[0] = "ab".into()),
        origin_merges,
        "merge 0",
    );
    expect_bad_entry(
        build(&|p| p.merges[0] = "a b c".into()),
        origin_merges,
        "merge 0",
    );
    expect_bad_entry(
        build(&|p| p.merges.push("a x y".into())),
        origin_merges,
        "merge 1",
    );
    expect_bad_entry(
        build(&|p| p.merges.push("ab ab".into())),
        origin_merges,
        "merge 1",
    );
    expect_bad_entry(
        build(&|p| p.merges.push("q ab".into())),
        origin_merges,
        "merge 1",
    );
    expect_bad_entry(
        build(&|p| p.tokens[256] = "a".into()),
        origin_tokens,
        "\"a\"",
    );
    expect_bad_entry(
        build(&|p| p.tokens[256] = "a b".into()),
        origin_tokens,
        "token 256",
    );
    expect_bad_entry(
        build(&|p| p.tokens[256] = String::new()),
        origin_tokens,
        "token 256",
    );
    expect_bad_entry(build(&|p| p.types[65] = 5), origin_tokens, "byte 0x41");
    expect_bad_entry(
        build(&|p| p.tokens[257] = String::new()),
        origin_types,
        "added token 257",
    );
    expect_bad_entry(
        build(&|p| {
            p.tokens.push("<s>".into());
            p.types.push(4);
        }),
        origin_types,
        "<s>",
    );
}

#[test]
fn bad_files_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    match Tokenizer::from_dir(dir) {
        Err(TokenizerError::Io {
            path, op: "read", ..
        }) => assert!(path.ends_with("vocab.json")),
        other => panic!("{other:?}"),
    }
    let mut vocab = serde_json::Map::new();
    for (i, c) in qtts::text::bpe::byte_chars().iter().enumerate() {
        vocab.insert(c.to_string(), i.into());
    }
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    write("vocab.json", "{\"a\": ");
    write("tokenizer_config.json", "{}");
    write("merges.txt", "#version: 0.2\n");
    match Tokenizer::from_dir(dir) {
        Err(TokenizerError::Parse { path, .. }) => assert!(path.ends_with("vocab.json")),
        other => panic!("{other:?}"),
    }
    write(
        "vocab.json",
        &serde_json::Value::Object(vocab.clone()).to_string(),
    );
    let tok = Tokenizer::from_dir(dir).unwrap();
    assert_eq!(tok.encode("hi"), [104, 105]);

    write("merges.txt", "#version: 0.2\nh i\n");
    expect_bad_entry(Tokenizer::from_dir(dir), "merges.txt", "merge 0");
    write("merges.txt", "#version: 0.2\nh\n");
    expect_bad_entry(Tokenizer::from_dir(dir), "merges.txt", "line 2");
    write("merges.txt", "");

    let mut huge = vocab.clone();
    huge.insert("hi".into(), (1u64 << 40).into());
    write("vocab.json", &serde_json::Value::Object(huge).to_string());
    expect_bad_entry(Tokenizer::from_dir(dir), "vocab.json", "\"hi\"");
    write("vocab.json", &serde_json::Value::Object(vocab).to_string());

    for (config, entry) in [
        (
            r#"{"added_tokens_decoder": {"x": {"content": "<a>"}}}"#,
            "added_tokens_decoder.x",
        ),
        (
            r#"{"added_tokens_decoder": {"300": {"content": "<a>", "rstrip": true}}}"#,
            "added_tokens_decoder.300",
        ),
        (
            r#"{"added_tokens_decoder": {"5": {"content": "<a>"}}}"#,
            "id 5",
        ),
        (
            r#"{"added_tokens_decoder": {"99999999": {"content": "<a>"}}}"#,
            "added_tokens_decoder.99999999",
        ),
    ] {
        write("tokenizer_config.json", config);
        expect_bad_entry(Tokenizer::from_dir(dir), "tokenizer_config.json", entry);
    }
    write(
        "tokenizer_config.json",
        r#"{"added_tokens_decoder": {"300": {"content": "<a>"}}}"#,
    );
    let tok = Tokenizer::from_dir(dir).unwrap();
    assert_eq!(tok.encode("h<a>"), [104, 300]);
    assert_eq!(tok.n_ids(), 301);
}

/// Informal speed figures on long texts (printed, not asserted).
#[test]
fn encode_speed() {
    let tok = tokenizer();
    let corpus: String = corpus()
        .iter()
        .map(|c| c.text.as_str())
        .filter(|t| !t.contains("<|"))
        .collect::<Vec<_>>()
        .join(" ");
    let english = "It was the best of times, it was the worst of times, it was the age of wisdom, \
        it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity. ";
    let chinese =
        "今天天气很好，我们去公园散步吧。机器学习是人工智能的一个分支，它让计算机从数据中学习。";
    for (name, text) in [
        ("corpus", corpus.repeat(4)),
        ("English", english.repeat(1000)),
        ("Chinese", chinese.repeat(1000)),
    ] {
        // The best of five runs: the machine may be busy.
        let mut elapsed = std::time::Duration::MAX;
        let mut ids = Vec::new();
        for _ in 0..5 {
            let start = std::time::Instant::now();
            ids = tok.encode(&text);
            elapsed = elapsed.min(start.elapsed());
        }
        eprintln!(
            "encode {name}: {} bytes, {} ids in {elapsed:?} ({:.1} MB/s)",
            text.len(),
            ids.len(),
            text.len() as f64 / elapsed.as_secs_f64() / 1e6
        );
    }
}
