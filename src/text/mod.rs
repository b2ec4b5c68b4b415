//! Text front-end: the Qwen2 byte-level BPE tokenizer of Qwen3-TTS.
//!
//! Contract: a [`Tokenizer`] is built once, from the checkpoint's tokenizer files
//! ([`Tokenizer::from_dir`], which reads three files and blocks on that IO) or from a GGUF's
//! `tokenizer.ggml.*` arrays ([`Tokenizer::from_parts`], no IO). Building checks every entry, so a
//! corrupt file is refused then, not met later; for the released vocabulary (151,643 tokens, 33
//! added tokens, 151,387 merges) it takes about half a second and peaks near 45 MB of memory.
//! The first build of the process also builds the Unicode class table of the pre-tokenizer (a few
//! KB, kept for the process).
//! After that the tokenizer is immutable, `Send` and `Sync`: share it by reference.
//! [`Tokenizer::encode`] and [`Tokenizer::decode`] allocate their output and scratch space in
//! proportion to their input, take no lock, do no IO and never panic, whatever the text; encoding
//! is O(n log n) in the longest word. Neither belongs on the audio thread.
//!
//! Reference: `transformers`' slow `Qwen2Tokenizer` (4.57.3, `models/qwen2/tokenization_qwen2.py`),
//! the class the official `qwen-tts` package loads; MODEL-NOTES.md §2.7. `encode` gives its ids:
//!
//! 1. NFC normalization of the whole text (`unicodedata.normalize("NFC", text)`).
//! 2. Added tokens (`<|im_start|>`, `<tts_pad>`, ...) are cut out as whole tokens, leftmost first and
//!    the longest of those that start there (its `Trie.split`, with `split_special_tokens=False`).
//! 3. Each piece between them is split by the Qwen2 pre-tokenizer ([`pre_tokenize`],
//!    [`QWEN2_PATTERN`]).
//! 4. Each word's UTF-8 bytes become byte-level symbols (GPT-2's byte-to-unicode map) and are merged
//!    by merge rank ([`bpe`]).
//!
//! No BOS or EOS is added (`add_bos_token` is false). Known gaps, none of which touches text a TTS
//! prompt plausibly holds: NFC here follows Unicode 18 (`unicode-normalization`) where the reference
//! runs Python's `unicodedata` (14.0 in CPython 3.11), so characters given canonical decompositions
//! since Unicode 15 may normalize differently; and letters and numbers assigned after Unicode 16
//! (`regex-syntax`'s tables) are classed as symbols here, where the `regex` module may know them
//! (17,480 code points for `regex` 2026.11.19; see the `classes_match_the_reference_regex_module`
//! test).

pub mod bpe;
pub mod feed;
mod pretokenize;
pub mod split;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use aho_corasick::{AhoCorasick, MatchKind};
use serde::Deserialize;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use bpe::{byte_chars, pair_key, Bpe, ByteDecoder, Merge, MergeTable, Scratch};
pub use feed::{NotUtf8, TextFeed};
pub use pretokenize::{pre_tokenize, PreTokens, QWEN2_PATTERN};

/// The largest token id a tokenizer may have. The ids of `vocab.json` and `tokenizer_config.json`
/// size the id table, so a hostile file could otherwise ask for gigabytes.
pub const MAX_TOKEN_ID: u32 = (1 << 24) - 1;

/// llama.cpp's token types, as `tokenizer.ggml.token_type` stores them.
const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;
const TYPE_UNUSED: i32 = 5;

/// A failure to build a [`Tokenizer`], or to decode ids it does not have.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// The operating system refused to read a tokenizer file (or it is not UTF-8).
    /// Check the path and its permissions, then retry.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`read`).
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A tokenizer JSON file does not parse, or does not have the expected shape.
    /// The file is corrupt: download it again.
    #[error("{path}: cannot parse: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the line and column.
        message: String,
    },

    /// An entry of the vocabulary, the merges or the added tokens is malformed or inconsistent
    /// (an id out of range or taken twice, a merge of unknown tokens, a token outside the
    /// byte-level alphabet, ...).
    /// The tokenizer is corrupt or not a byte-level BPE one: do not use it.
    #[error("{origin}: {entry}: expected {expected}, found {found}")]
    BadEntry {
        /// Where the entry is: a file path, or a GGUF key (`tokenizer.ggml.merges`).
        origin: String,
        /// Which entry (a token, a merge line, an id).
        entry: String,
        /// What was expected.
        expected: String,
        /// What was found.
        found: String,
    },

    /// [`Tokenizer::decode`] was given an id that names no token.
    /// The ids come from another vocabulary (codec ids passed as text ids?): fix the caller.
    #[error("token id {id} names no token of this tokenizer ({n_ids} ids)")]
    UnknownId {
        /// The id.
        id: u32,
        /// The size of the id space.
        n_ids: u32,
    },
}

/// What an id names.
#[derive(Clone, Debug)]
enum Entry {
    /// Nothing (a gap in the ids, or an unused GGUF slot such as `[PAD151700]`).
    Absent,
    /// A token of the BPE vocabulary, in the byte-level alphabet.
    Normal(Box<str>),
    /// An added token, matched whole in the text and decoded as written.
    Added(Box<str>),
}

/// The Qwen2 byte-level BPE tokenizer. See the [module docs](self) for its contract and reference.
pub struct Tokenizer {
    entries: Vec<Entry>,
    vocab: HashMap<Box<str>, u32>,
    added: HashMap<Box<str>, u32>,
    /// Matches the added tokens, leftmost-longest; pattern `i` is token `added_ids[i]`.
    added_matcher: Option<AhoCorasick>,
    added_ids: Vec<u32>,
    bpe: Bpe,
    byte_decoder: ByteDecoder,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("n_ids", &self.entries.len())
            .field("n_vocab", &self.vocab.len())
            .field("n_added", &self.added.len())
            .finish_non_exhaustive()
    }
}

/// One `added_tokens_decoder` entry of `tokenizer_config.json`.
#[derive(Deserialize)]
struct AddedTokenJson {
    content: String,
    #[serde(default)]
    lstrip: bool,
    #[serde(default)]
    rstrip: bool,
    #[serde(default)]
    single_word: bool,
}

#[derive(Deserialize)]
struct TokenizerConfigJson {
    #[serde(default)]
    added_tokens_decoder: BTreeMap<String, AddedTokenJson>,
}

/// Where the entries being checked come from, for the errors.
struct Origins {
    tokens: String,
    added: String,
    merges: String,
}

impl Tokenizer {
    /// Reads `vocab.json`, `merges.txt` and `tokenizer_config.json` (its `added_tokens_decoder`)
    /// from `dir`, as `Qwen2Tokenizer.from_pretrained(dir)` does.
    ///
    /// Added tokens with `lstrip`, `rstrip` or `single_word` set are refused (`BadEntry`): the
    /// Qwen tokenizers have none, and this tokenizer does not implement them.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        let vocab_path = dir.join("vocab.json");
        let vocab: HashMap<String, u64> = read_json(&vocab_path)?;
        let config_path = dir.join("tokenizer_config.json");
        let config: TokenizerConfigJson = read_json(&config_path)?;
        let merges_path = dir.join("merges.txt");
        let merges_text =
            std::fs::read_to_string(&merges_path).map_err(|source| TokenizerError::Io {
                path: merges_path.clone(),
                op: "read",
                source,
            })?;

        let bad = |origin: &Path, entry: String, expected: &str, found: String| {
            TokenizerError::BadEntry {
                origin: origin.display().to_string(),
                entry,
                expected: expected.to_owned(),
                found,
            }
        };
        let mut normal = Vec::with_capacity(vocab.len());
        for (token, id) in vocab {
            let id = u32::try_from(id)
                .ok()
                .filter(|&id| id <= MAX_TOKEN_ID)
                .ok_or_else(|| {
                    bad(
                        &vocab_path,
                        format!("token {token:?}"),
                        &format!("an id of at most {MAX_TOKEN_ID}"),
                        id.to_string(),
                    )
                })?;
            normal.push((id, token));
        }
        let mut added = Vec::with_capacity(config.added_tokens_decoder.len());
        for (key, token) in config.added_tokens_decoder {
            let entry = format!("added_tokens_decoder.{key}");
            let id = key
                .parse::<u32>()
                .ok()
                .filter(|&id| id <= MAX_TOKEN_ID)
                .ok_or_else(|| {
                    bad(
                        &config_path,
                        entry.clone(),
                        &format!("a decimal id of at most {MAX_TOKEN_ID}"),
                        format!("{key:?}"),
                    )
                })?;
            if token.lstrip || token.rstrip || token.single_word {
                return Err(bad(
                    &config_path,
                    entry,
                    "lstrip, rstrip and single_word false",
                    format!(
                        "lstrip {}, rstrip {}, single_word {}",
                        token.lstrip, token.rstrip, token.single_word
                    ),
                ));
            }
            added.push((id, token.content));
        }
        let mut merges = Vec::new();
        for (i, line) in merges_text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || (i == 0 && line.starts_with("#version:")) {
                continue;
            }
            let mut parts = line.split_whitespace();
            match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), None) => merges.push((a.to_owned(), b.to_owned())),
                _ => {
                    return Err(bad(
                        &merges_path,
                        format!("line {}", i + 1),
                        "two tokens separated by a space",
                        format!("{line:?}"),
                    ))
                }
            }
        }
        let origins = Origins {
            tokens: vocab_path.display().to_string(),
            added: config_path.display().to_string(),
            merges: merges_path.display().to_string(),
        };
        Tokenizer::build(normal, added, merges, &origins)
    }

    /// Builds the tokenizer from a GGUF's arrays: `tokenizer.ggml.tokens` (`tokens`, in id order),
    /// `tokenizer.ggml.token_type` (`types`: 1 normal, 3 control and 4 user-defined are added
    /// tokens, 5 unused) and `tokenizer.ggml.merges` (`"a b"`, in rank order).
    ///
    /// Pass the text vocabulary only: a talker GGUF of this engine appends 3072 codec tokens
    /// (`<|codec_0|>`, ...) after it, which must not be matched in text. Slice both arrays to the
    /// talker's `text_vocab_size` first.
    pub fn from_parts(
        tokens: &[String],
        types: &[i32],
        merges: &[String],
    ) -> Result<Tokenizer, TokenizerError> {
        let origins = Origins {
            tokens: "tokenizer.ggml.tokens".into(),
            added: "tokenizer.ggml.token_type".into(),
            merges: "tokenizer.ggml.merges".into(),
        };
        let bad = |origin: &str, entry: String, expected: String, found: String| {
            TokenizerError::BadEntry {
                origin: origin.to_owned(),
                entry,
                expected,
                found,
            }
        };
        if types.len() != tokens.len() {
            return Err(bad(
                &origins.added,
                "length".into(),
                format!("{} types, one per token", tokens.len()),
                types.len().to_string(),
            ));
        }
        if tokens.len() > MAX_TOKEN_ID as usize + 1 {
            return Err(bad(
                &origins.tokens,
                "length".into(),
                format!("at most {} tokens", MAX_TOKEN_ID as u64 + 1),
                tokens.len().to_string(),
            ));
        }
        let mut normal = Vec::with_capacity(tokens.len());
        let mut added = Vec::new();
        for ((id, token), &ty) in (0u32..).zip(tokens).zip(types) {
            match ty {
                TYPE_NORMAL => normal.push((id, token.clone())),
                TYPE_CONTROL | TYPE_USER_DEFINED => added.push((id, token.clone())),
                TYPE_UNUSED => {}
                _ => {
                    return Err(bad(
                        &origins.added,
                        format!("token {id} ({token:?})"),
                        "type 1 (normal), 3 (control), 4 (user-defined) or 5 (unused)".into(),
                        ty.to_string(),
                    ))
                }
            }
        }
        let mut pairs = Vec::with_capacity(merges.len());
        for (i, merge) in merges.iter().enumerate() {
            match merge.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => {
                    pairs.push((a.to_owned(), b.to_owned()))
                }
                _ => {
                    return Err(bad(
                        &origins.merges,
                        format!("merge {i}"),
                        "two tokens separated by a space".into(),
                        format!("{merge:?}"),
                    ))
                }
            }
        }
        Tokenizer::build(normal, added, pairs, &origins)
    }

    /// Checks the entries and builds the tables. `merges` are in rank order.
    fn build(
        normal: Vec<(u32, String)>,
        added: Vec<(u32, String)>,
        merges: Vec<(String, String)>,
        origins: &Origins,
    ) -> Result<Tokenizer, TokenizerError> {
        let bad =
            |origin: &str, entry: String, expected: &str, found: String| TokenizerError::BadEntry {
                origin: origin.to_owned(),
                entry,
                expected: expected.to_owned(),
                found,
            };
        let n_ids = normal
            .iter()
            .chain(&added)
            .map(|&(id, _)| id as usize + 1)
            .max()
            .unwrap_or(0);
        let mut entries = vec![Entry::Absent; n_ids];
        let byte_decoder = ByteDecoder::new();

        let mut vocab = HashMap::with_capacity(normal.len());
        for (id, token) in normal {
            if token.is_empty() || token.chars().any(|c| byte_decoder.byte(c).is_none()) {
                return Err(bad(
                    &origins.tokens,
                    format!("token {id}"),
                    "a non-empty string of the byte-level alphabet (GPT-2's byte-to-unicode map)",
                    format!("{token:?}"),
                ));
            }
            let token: Box<str> = token.into();
            if let Some(other) = vocab.insert(token.clone(), id) {
                return Err(bad(
                    &origins.tokens,
                    format!("token {token:?}"),
                    "one id per token",
                    format!("ids {other} and {id}"),
                ));
            }
            // `n_ids` covers every id.
            if let Some(slot) = entries.get_mut(id as usize) {
                if let Entry::Normal(other) = slot {
                    return Err(bad(
                        &origins.tokens,
                        format!("id {id}"),
                        "one token per id",
                        format!("{other:?} and {token:?}"),
                    ));
                }
                *slot = Entry::Normal(token);
            }
        }

        let mut added_map = HashMap::with_capacity(added.len());
        let mut added_ids = Vec::with_capacity(added.len());
        let mut patterns = Vec::with_capacity(added.len());
        for (id, token) in added {
            if token.is_empty() {
                return Err(bad(
                    &origins.added,
                    format!("added token {id}"),
                    "a non-empty string",
                    "\"\"".into(),
                ));
            }
            let token: Box<str> = token.into();
            if let Some(other) = added_map.insert(token.clone(), id) {
                return Err(bad(
                    &origins.added,
                    format!("added token {token:?}"),
                    "one id per token",
                    format!("ids {other} and {id}"),
                ));
            }
            if let Some(slot) = entries.get_mut(id as usize) {
                // A vocabulary token may be re-declared as added (GPT-2's `<|endoftext|>` is), but
                // an id cannot name two different strings.
                match slot {
                    Entry::Normal(other) | Entry::Added(other) if **other != *token => {
                        return Err(bad(
                            &origins.added,
                            format!("id {id}"),
                            "one token per id",
                            format!("{other:?} and {token:?}"),
                        ));
                    }
                    _ => {}
                }
                *slot = Entry::Added(token.clone());
            }
            added_ids.push(id);
            patterns.push(token);
        }
        let added_matcher = if patterns.is_empty() {
            None
        } else {
            let matcher = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(patterns.iter().map(|p| p.as_bytes()))
                .map_err(|e| {
                    bad(
                        &origins.added,
                        "added tokens".into(),
                        "a set of strings the matcher can hold",
                        e.to_string(),
                    )
                })?;
            Some(matcher)
        };

        // The id the reference gives a BPE symbol: added tokens first, then the vocabulary.
        let resolve = |s: &str| added_map.get(s).or_else(|| vocab.get(s)).copied();
        let mut byte_ids = [0u32; 256];
        for (b, c) in byte_chars().into_iter().enumerate() {
            byte_ids[b] = resolve(c.encode_utf8(&mut [0; 4])).ok_or_else(|| {
                bad(
                    &origins.tokens,
                    format!("byte 0x{b:02X}"),
                    "a token for each of the 256 bytes",
                    format!("no token {c:?}"),
                )
            })?;
        }
        let mut table = MergeTable::with_capacity_and_hasher(merges.len(), Default::default());
        for (rank, (a, b)) in (0u32..).zip(merges) {
            let entry = || format!("merge {rank} ({a:?} {b:?})");
            let missing = |what: &str, token: &str| {
                bad(
                    &origins.merges,
                    entry(),
                    &format!("its {what} in the vocabulary"),
                    format!("no token {token:?}"),
                )
            };
            let ia = resolve(&a).ok_or_else(|| missing("first half", &a))?;
            let ib = resolve(&b).ok_or_else(|| missing("second half", &b))?;
            let merged = format!("{a}{b}");
            let id = resolve(&merged).ok_or_else(|| missing("result", &merged))?;
            // A repeated pair takes its last rank, as `dict(zip(merges, range(...)))` does.
            table.insert(pair_key(ia, ib), Merge { rank, id });
        }

        Ok(Tokenizer {
            entries,
            vocab,
            added: added_map,
            added_matcher,
            added_ids,
            bpe: Bpe::new(table, byte_ids),
            byte_decoder,
        })
    }

    /// The ids of `text`, as the reference `Qwen2Tokenizer.encode(text)` gives them.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_into(text, &mut out);
        out
    }

    /// Appends the ids of `text` to `out`; [`Tokenizer::encode`] without its allocation.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        let text: Cow<'_, str> = match is_nfc_quick(text.chars()) {
            IsNormalized::Yes => Cow::Borrowed(text),
            _ => Cow::Owned(text.nfc().collect()),
        };
        self.encode_normalized_into(&text, out);
    }

    /// [`Tokenizer::encode_into`] of text already NFC-normalized (steps 2 to 4 of the module
    /// docs).
    fn encode_normalized_into(&self, text: &str, out: &mut Vec<u32>) {
        let mut scratch = Scratch::default();
        let mut last = 0;
        if let Some(matcher) = &self.added_matcher {
            for m in matcher.find_iter(text.as_bytes()) {
                self.encode_plain(text.get(last..m.start()).unwrap_or(""), out, &mut scratch);
                if let Some(&id) = self.added_ids.get(m.pattern().as_usize()) {
                    out.push(id);
                }
                last = m.end();
            }
        }
        self.encode_plain(text.get(last..).unwrap_or(""), out, &mut scratch);
    }

    /// Encodes text that holds no added token.
    fn encode_plain(&self, text: &str, out: &mut Vec<u32>, scratch: &mut Scratch) {
        for word in pre_tokenize(text) {
            self.bpe.encode_word(word.as_bytes(), out, scratch);
        }
    }

    /// The text of `ids`, as the reference `decode(ids)` gives it (special tokens kept, no spaces
    /// added around them, no clean-up). Byte sequences that are not UTF-8 (ids cut inside a
    /// character) become U+FFFD, each maximal invalid piece once, as Python's `errors="replace"`.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        let mut text = String::new();
        let mut bytes = Vec::new();
        for &id in ids {
            match self.entries.get(id as usize) {
                Some(Entry::Normal(token)) => bytes.extend(
                    token
                        .chars()
                        .map(|c| self.byte_decoder.byte(c).unwrap_or(b'?')),
                ),
                Some(Entry::Added(token)) => {
                    text.push_str(&String::from_utf8_lossy(&bytes));
                    bytes.clear();
                    text.push_str(token);
                }
                Some(Entry::Absent) | None => {
                    return Err(TokenizerError::UnknownId {
                        id,
                        n_ids: self.n_ids(),
                    })
                }
            }
        }
        text.push_str(&String::from_utf8_lossy(&bytes));
        Ok(text)
    }

    /// The id of a token string (an added token, or a vocabulary token in the byte-level alphabet:
    /// `"Ġworld"`, not `" world"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.added
            .get(token)
            .or_else(|| self.vocab.get(token))
            .copied()
    }

    /// The string of a token id, as stored (byte-level alphabet for vocabulary tokens).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        match self.entries.get(id as usize)? {
            Entry::Normal(t) | Entry::Added(t) => Some(t),
            Entry::Absent => None,
        }
    }

    /// Whether `id` is an added token (`<|im_start|>`, `<tts_pad>`, ...).
    pub fn is_added(&self, id: u32) -> bool {
        matches!(self.entries.get(id as usize), Some(Entry::Added(_)))
    }

    /// The size of the id space: one more than the largest id.
    pub fn n_ids(&self) -> u32 {
        self.entries.len() as u32
    }
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, TokenizerError> {
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
        path: path.to_owned(),
        op: "read",
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| TokenizerError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}
