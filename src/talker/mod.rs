//! The talker: a 28-layer Qwen3 LM that turns the prompt into codebook 0, one code per 80 ms
//! frame, and the prompt it is fed; run by llama.cpp or by this crate's own graph of the same
//! layers ([`Runtime`]).
//!
//! Model: Qwen3-TTS-12Hz `Qwen3TTSTalkerForConditionalGeneration` and the prompt built by
//! `Qwen3TTSForConditionalGeneration.generate` (PyPI `qwen-tts` 0.1.1,
//! `qwen_tts/core/models/modeling_qwen3_tts.py`); MODEL-NOTES.md §4. Weights: the talker GGUF
//! (`general.architecture = qwen3tts`), whose `token_embd` rows are the projected text embeddings
//! `P(t)` followed by the codec embeddings `C(c)`, so every prompt row is a sum of at most two of
//! its rows, read from the mapped file.
//!
//! Contract:
//! - [`Talker::load`] validates and loads the file, reads the checkpoint's config and tokenizer
//!   carried in it, and computes the constant `tts_pad`, `tts_bos` and `tts_eos` rows once.
//! - [`Talker::prompt`] builds an utterance's prefill rows and trailing text rows; an unknown
//!   speaker, language or instruction for the loaded model is a typed [`TalkerError`].
//! - A [`Session`] holds the KV cache of one utterance at a time (a llama.cpp context, or a
//!   [`graph::State`]) and the logits processors and sampler of codebook 0. [`Session::start`]
//!   clears the cache and runs the prefill; [`Session::feed`] takes the embedded codes of the
//!   frame just produced (see [`crate::code_predictor::CodePredictor::embed_frame`]) and runs one
//!   step. Each returns the next codebook-0 code or why the utterance stopped. After [`Session::new`], neither allocates
//!   except the prefill batch of a longer prompt than any before.
//! - Threads: a session runs on the calling thread and a caller's [`Threadpool`](crate::ffi::Threadpool), or, without
//!   one, on llama.cpp's own threads or a ggml pool the session makes (its `n_threads`); nothing
//!   else here spawns a thread.

pub mod graph;
mod icl;
mod prompt;
pub use icl::IclReference;
mod session;

pub use session::Session;

use std::path::{Path, PathBuf};

use crate::error::ModelError;
use crate::ffi::{GgmlError, LlamaModel};
use crate::gguf::{GgmlType, GgufFile, Value};
use crate::model::config::{parse_json, Dialect, GenerationConfig, ModelType, TtsConfig};
use crate::qwen3::LayerKernel;
use crate::sampling::SamplingParams;
use crate::text::Tokenizer;

/// Codebook-0 ids that are acoustic codes (`0..2048`); the rest of the codec vocabulary is
/// specials, languages and speakers, never sampled except end-of-speech.
pub const N_CODES: usize = 2048;
/// The codec vocabulary of the talker's head.
pub const CODEC_VOCAB: usize = 3072;
/// Frames at the start of an utterance that cannot end it (`min_new_tokens = 2` in the reference).
pub const MIN_FRAMES: usize = 2;

/// Why an utterance (or a request) can not be built or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TalkerError {
    /// The speaker is not one of the loaded model's.
    /// Pick one of `supported` (CustomVoice models), or use a model that has named speakers.
    #[error(
        "unknown speaker '{speaker}' for this {model} model; it supports: {}",
        list(supported)
    )]
    UnknownSpeaker {
        /// What was asked.
        speaker: String,
        /// The loaded model's type.
        model: &'static str,
        /// The model's speakers (empty: it has none).
        supported: Vec<String>,
    },
    /// The language is not one of the loaded model's.
    /// Pick one of `supported`, or `auto`.
    #[error(
        "unknown language '{language}'; this model supports: {}",
        list(supported)
    )]
    UnknownLanguage {
        /// What was asked.
        language: String,
        /// The model's languages, `auto` included.
        supported: Vec<String>,
    },
    /// An instruction was given to a model that takes none.
    /// Drop the instruction, or use a VoiceDesign or 1.7B CustomVoice model.
    #[error(
        "this {model} model ({size}) takes no instruction; VoiceDesign and 1.7B CustomVoice models do"
    )]
    InstructUnsupported {
        /// The loaded model's type.
        model: &'static str,
        /// Its size tag (`0b6`, `1b7`).
        size: String,
    },
    /// A speaker vector was given to a model without an x-vector slot, or with the wrong width.
    /// Speaker vectors go to Base models, with the talker's hidden size.
    #[error("speaker vector: expected {expected}, found {found}")]
    SpeakerVector {
        /// What fits.
        expected: String,
        /// What was given.
        found: String,
    },
    /// The text has no token to speak, or the given token ids are not a wrapped prompt.
    /// Give non-empty text; token ids must be the whole
    /// `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n` string's.
    #[error("text input: expected {expected}, found {found}")]
    BadText {
        /// What fits.
        expected: String,
        /// What was given.
        found: String,
    },
    /// The prompt leaves no room for a frame in the context.
    /// Split the text (see [`crate::text::split`]) or create the session with a larger context.
    #[error(
        "prompt of {prompt} positions does not fit a context of {n_ctx} with room for a frame"
    )]
    TooLong {
        /// Prefill rows.
        prompt: usize,
        /// The session's context.
        n_ctx: usize,
    },
    /// [`Session::feed`] was called when no utterance was running.
    /// Call [`Session::start`] first, and stop feeding once a [`Next::Stop`] came.
    #[error("no utterance is running: start one before feeding frames")]
    NotRunning,
    /// The model files are wrong (see [`ModelError`]).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// llama.cpp or ggml failed at run time.
    #[error(transparent)]
    Ggml(#[from] GgmlError),
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// What voice to speak with; every field is optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Voice {
    /// A CustomVoice speaker name (case-insensitive).
    pub speaker: Option<String>,
    /// A language name (case-insensitive), or `auto` / `None` for the model to choose.
    pub language: Option<String>,
    /// A voice instruction (VoiceDesign, 1.7B CustomVoice).
    pub instruct: Option<String>,
    /// A speaker x-vector for Base models (the talker's hidden size).
    pub xvector: Option<Vec<f32>>,
    /// A reference recording's transcript and codes for the in-context (ICL) prompt of a Base
    /// model; needs the x-vector of the same recording.
    pub reference: Option<std::sync::Arc<IclReference>>,
}

/// How the text enters the prompt (MODEL-NOTES.md §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum TextMode {
    /// One text token per frame, starting one ahead of the audio: the first frame comes after a
    /// short prefill (the reference's `non_streaming_mode=False`).
    #[default]
    Streaming,
    /// The whole text in the prefill (`non_streaming_mode=True`, the wrapper's default for
    /// CustomVoice and VoiceDesign).
    NonStreaming,
    /// As [`TextMode::Streaming`], except that with a cloned voice's reference the target text
    /// does not enter the in-context prompt: the reference's transcript alone lies over its codes
    /// and the target text follows one token per frame. The prompt then depends on the voice
    /// alone, so a saved voice's prompt is reused whole by the next request and its first audio
    /// comes as soon as a CustomVoice speaker's. **Not the official layout** (which overlays the
    /// target text on the reference's codes); its quality
    /// is unverified without real weights. Without a reference it is [`TextMode::Streaming`].
    Trailing,
}

/// The text of one utterance.
#[derive(Debug, Clone, PartialEq)]
pub enum TextInput {
    /// Plain text, tokenized inside `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n`
    /// as the official wrapper does.
    Text(String),
    /// The ids of that whole wrapped string (as the wrapper passes them to `generate`).
    TokenIds(Vec<u32>),
}

/// The talker's input for one utterance: prefill rows and the text rows added to later steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// Prefill rows, `len() × n_embd` values.
    pub rows: Vec<f32>,
    /// Text rows added to the step inputs in order (streaming text: the text after its first
    /// token, then `tts_eos`); steps past them add `tts_pad`.
    pub trailing: Vec<f32>,
    /// Row width.
    pub n_embd: usize,
    /// Text tokens spoken.
    pub text_tokens: usize,
}

impl Prompt {
    /// Prefill rows.
    pub fn len(&self) -> usize {
        self.rows.len() / self.n_embd.max(1)
    }

    /// Whether the prompt has no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// Why an utterance ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The talker emitted end-of-speech.
    Eos,
    /// The frame cap was reached (the runaway guard, a request's `max_frames`, or the context).
    FrameCap {
        /// The cap.
        frames: usize,
    },
    /// The request was cancelled.
    Cancelled,
}

impl StopReason {
    /// The name every surface gives it (the C ABI's `QTTS_STOP_*`, Python's summary, the
    /// command, the server's metrics and SSE usage): `eos`, `frame_cap`, `cancelled`.
    pub fn name(&self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::FrameCap { .. } => "frame_cap",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// What the talker does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// A frame starts with this codebook-0 code; [`Session::hidden`] holds the state for the code
    /// predictor.
    Code(u32),
    /// The utterance is over.
    Stop(StopReason),
}

/// Codebook-0 generation settings of one utterance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenOptions {
    /// Temperature, top-k, top-p, or greedy.
    pub sampling: SamplingParams,
    /// HF repetition penalty over the codes generated so far (1.0: none).
    pub repetition_penalty: f32,
    /// Seed of the codebook-0 sampler.
    pub seed: u64,
    /// Frame cap; `None`: [`Talker::frame_cap`] of the text length.
    pub max_frames: Option<usize>,
    /// Frames before end-of-speech may be sampled: at least [`MIN_FRAMES`] (benches force a
    /// frame count with `min_frames = max_frames`).
    pub min_frames: usize,
}

impl GenOptions {
    /// The checkpoint's `generation_config.json` settings.
    pub fn from_config(g: &GenerationConfig, seed: u64) -> Self {
        GenOptions {
            sampling: SamplingParams::talker(g),
            repetition_penalty: g.repetition_penalty as f32,
            seed,
            max_frames: None,
            min_frames: MIN_FRAMES,
        }
    }
}

/// What runs the talker's layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// llama.cpp's `qwen3tts` graph and its kernels.
    LlamaCpp,
    /// This crate's graph of the same layers ([`graph`]), with its products by `LayerKernel`
    /// (q4_K and q8_0 matrices; f16 and f32 ones by ggml's `mul_mat` under every kernel).
    Graph(LayerKernel),
}

impl Runtime {
    /// The fastest the process's kernel tier runs ([`Runtime::fastest_for`]).
    pub fn fastest() -> Self {
        Self::fastest_for(crate::kernels::active())
    }

    /// The fastest `tier` runs: the own graph with the packed kernels where the tier has them,
    /// else llama.cpp.
    pub fn fastest_for(tier: crate::kernels::Tier) -> Self {
        match LayerKernel::fastest_for(tier) {
            LayerKernel::Packed => Runtime::Graph(LayerKernel::Packed),
            _ => Runtime::LlamaCpp,
        }
    }
}

/// The talker's layers, as loaded for their runtime.
#[derive(Debug)]
enum Layers {
    Llama(LlamaModel),
    Graph(graph::Layers),
}

/// The talker model, its tokenizer and its constant rows.
#[derive(Debug)]
pub struct Talker {
    layers: Layers,
    file: GgufFile,
    config: TtsConfig,
    generation: GenerationConfig,
    tokenizer: Tokenizer,
    n_embd: usize,
    n_text: usize,
    embd_ty: GgmlType,
    embd_row: usize,
    tts_pad: Vec<f32>,
    tts_bos: Vec<f32>,
    tts_eos: Vec<f32>,
}

fn missing_key(path: &Path, key: &str) -> ModelError {
    ModelError::MissingKey {
        path: path.into(),
        key: key.into(),
    }
}

/// The config of a talker GGUF that does not carry the checkpoint's (llama.cpp's published
/// conversions): the special ids, codec ids and languages read from the token names of its
/// unified vocabulary (`<tts_pad>`, `<|codec_bos|>`, `<|codec_language_english|>`, ...), the rest
/// from the released Base config of its width (llama.cpp's helper speaks with Base models only;
/// there are no named speakers), and the released `generation_config.json` (the same for all five
/// checkpoints).
fn config_from_vocab(
    path: &Path,
    tokens: &[String],
    n_embd: usize,
) -> Result<(TtsConfig, GenerationConfig), ModelError> {
    use crate::model::config::Preset;
    let n_text = tokens
        .len()
        .checked_sub(CODEC_VOCAB)
        .filter(|&n| n > 0)
        .ok_or_else(|| ModelError::BadKey {
            path: path.into(),
            key: "tokenizer.ggml.tokens".into(),
            expected: format!("text tokens followed by {CODEC_VOCAB} codec tokens"),
            found: format!("{} tokens", tokens.len()),
        })?;
    let preset = if n_embd >= 2048 {
        Preset::Large17Base
    } else {
        Preset::Small06Base
    };
    let mut cfg = preset.config();
    let find = |name: &str, range: std::ops::Range<usize>| {
        tokens[range.clone()]
            .iter()
            .position(|t| t == name)
            .map(|i| i as u32)
            .ok_or_else(|| ModelError::BadKey {
                path: path.into(),
                key: "tokenizer.ggml.tokens".into(),
                expected: format!("a token {name}"),
                found: "none".into(),
            })
    };
    let text = 0..n_text;
    let codec = n_text..tokens.len();
    let tts = &mut cfg.tts;
    tts.im_start_token_id = find("<|im_start|>", text.clone())?;
    tts.im_end_token_id = find("<|im_end|>", text.clone())?;
    tts.assistant_token_id = find("assistant", text.clone())?;
    tts.tts_pad_token_id = find("<tts_pad>", text.clone())?;
    tts.tts_bos_token_id = find("<tts_text_bos>", text.clone())?;
    tts.tts_eos_token_id = find("<tts_text_eod>", text)?;
    tts.tts_model_size = if n_embd >= 2048 { "1b7" } else { "0b6" }.into();
    let t = &mut tts.talker_config;
    t.text_vocab_size = n_text as u32;
    t.hidden_size = n_embd as u32;
    t.codec_pad_id = find("<|codec_pad|>", codec.clone())?;
    t.codec_bos_id = find("<|codec_bos|>", codec.clone())?;
    t.codec_eos_token_id = find("<|codec_eos_token|>", codec.clone())?;
    t.codec_think_id = find("<|codec_think|>", codec.clone())?;
    t.codec_nothink_id = find("<|codec_nothink|>", codec.clone())?;
    t.codec_think_bos_id = find("<|codec_think_bos|>", codec.clone())?;
    t.codec_think_eos_id = find("<|codec_think_eos|>", codec.clone())?;
    t.codec_language_id = tokens[codec]
        .iter()
        .enumerate()
        .filter_map(|(i, tok)| {
            let name = tok.strip_prefix("<|codec_language_")?.strip_suffix("|>")?;
            Some((name.to_owned(), i as u32))
        })
        .collect();
    t.spk_id.clear();
    t.spk_is_dialect.clear();
    Ok((cfg.tts, cfg.generation))
}

impl Talker {
    /// Loads a talker GGUF for [`Runtime::fastest`]: one written by `qtts convert` carries the
    /// checkpoint's config JSON (speakers, languages, special ids); for one without it
    /// (llama.cpp's own conversions) they are read from the vocabulary's token names (see
    /// `config_from_vocab`).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        Self::load_with(path, Runtime::fastest())
    }

    /// As [`Talker::load`], for `runtime`. Packed kernels the process's kernel tier lacks are
    /// refused.
    pub fn load_with(path: impl AsRef<Path>, runtime: Runtime) -> Result<Self, ModelError> {
        let path = path.as_ref();
        if let Runtime::Graph(kernel) = runtime {
            kernel.check_available()?;
        }
        let file = GgufFile::open(path)?;
        let geometry = crate::model::validate::check_talker(path, &file.header)?;
        let layers = match runtime {
            Runtime::LlamaCpp => {
                Layers::Llama(LlamaModel::load(&crate::model::validate::talker(path)?)?)
            }
            Runtime::Graph(kernel) => Layers::Graph(graph::Layers::load(&file, kernel)?),
        };
        let h = &file.header;
        let text = |key: &str| {
            h.get(key)
                .and_then(Value::as_str)
                .ok_or_else(|| missing_key(path, key))
        };
        let n_embd = geometry.n_embd as usize;
        let strings = |key: &str| match h.get(key).and_then(Value::as_array) {
            Some(crate::gguf::Array::Str(v)) => Ok(v),
            _ => Err(missing_key(path, key)),
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let (config, generation) = match h.get(crate::model::convert::KEY_HF_CONFIG) {
            Some(_) => (
                parse_json::<TtsConfig>(text(crate::model::convert::KEY_HF_CONFIG)?, path)?,
                parse_json::<GenerationConfig>(
                    text(crate::model::convert::KEY_HF_GENERATION)?,
                    path,
                )?,
            ),
            // A file without the checkpoint's config (llama.cpp's own conversions).
            None => config_from_vocab(path, tokens, n_embd)?,
        };
        let n_text = config.talker_config.text_vocab_size as usize;
        let merges = strings("tokenizer.ggml.merges")?;
        let types = match h.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
            Some(crate::gguf::Array::I32(v)) => v,
            _ => return Err(missing_key(path, "tokenizer.ggml.token_type")),
        };
        if tokens.len() < n_text || types.len() < n_text {
            return Err(ModelError::BadKey {
                path: path.into(),
                key: "tokenizer.ggml.tokens".into(),
                expected: format!("at least text_vocab_size = {n_text} tokens"),
                found: tokens.len().min(types.len()).to_string(),
            });
        }
        let tokenizer = Tokenizer::from_parts(&tokens[..n_text], &types[..n_text], merges)
            .map_err(|e| ModelError::Parse {
                path: path.into(),
                message: format!("tokenizer: {e}"),
            })?;
        let info = h
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor {
                path: path.into(),
                tensor: "token_embd.weight".into(),
            })?;
        let embd_ty = info.ty;
        let embd_row = embd_ty.nbytes(&[n_embd as u64]).unwrap_or(0) as usize;
        let mut t = Talker {
            layers,
            file,
            config,
            generation,
            tokenizer,
            n_embd,
            n_text,
            embd_ty,
            embd_row,
            tts_pad: Vec::new(),
            tts_bos: Vec::new(),
            tts_eos: Vec::new(),
        };
        let c = &t.config;
        let (pad, bos, eos) = (c.tts_pad_token_id, c.tts_bos_token_id, c.tts_eos_token_id);
        t.tts_pad = t.text_row(pad)?;
        t.tts_bos = t.text_row(bos)?;
        t.tts_eos = t.text_row(eos)?;
        Ok(t)
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.file.path().to_path_buf()
    }

    /// The checkpoint's `config.json`.
    pub fn config(&self) -> &TtsConfig {
        &self.config
    }

    /// The checkpoint's `generation_config.json` (the sampling defaults).
    pub fn generation_config(&self) -> &GenerationConfig {
        &self.generation
    }

    /// The text tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The hidden size.
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// What runs the layers.
    pub fn runtime(&self) -> Runtime {
        match &self.layers {
            Layers::Llama(_) => Runtime::LlamaCpp,
            Layers::Graph(l) => Runtime::Graph(l.kernel()),
        }
    }

    /// The runaway guard: the most frames an utterance of `text_tokens` tokens may take, 40 plus 8
    /// per token (speech runs at about 4 frames per token in English and Chinese alike, so this
    /// allows half-speed speech and a 3 s tail), bounded by `max_new_tokens` of the checkpoint.
    pub fn frame_cap(&self, text_tokens: usize) -> usize {
        (40 + 8 * text_tokens).min(self.generation.max_new_tokens as usize)
    }

    /// The trailing text rows of `ids` in the streaming layout (a fed text's tokens after its
    /// first), then `tts_eos` when `end`.
    pub fn text_rows(
        &self,
        ids: &[u32],
        end: bool,
        rows: &mut Vec<f32>,
    ) -> Result<(), TalkerError> {
        self.check_text_ids(ids)?;
        for &id in ids {
            self.push_row(rows, Some(id as usize), None)?;
        }
        if end {
            rows.extend_from_slice(&self.tts_eos);
        }
        Ok(())
    }

    /// The speakers of the loaded model, sorted.
    pub fn speakers(&self) -> Vec<String> {
        self.config.talker_config.spk_id.keys().cloned().collect()
    }

    /// The languages of the loaded model, sorted, `auto` first.
    pub fn languages(&self) -> Vec<String> {
        std::iter::once("auto".to_owned())
            .chain(self.config.talker_config.codec_language_id.keys().cloned())
            .collect()
    }

    /// Adds `token_embd` row `id` (text ids first, then `n_text + codec id`) to `out`.
    fn add_row(&self, id: usize, out: &mut [f32]) -> Result<(), ModelError> {
        let data = self
            .file
            .tensor_data("token_embd.weight")
            .unwrap_or_default();
        let start = id * self.embd_row;
        let Some(bytes) = data.get(start..start + self.embd_row) else {
            return Err(ModelError::Unsupported {
                what: "token embedding row".into(),
                expected: format!("a row below {}", data.len() / self.embd_row.max(1)),
                found: id.to_string(),
            });
        };
        let mut row = vec![0.0; self.n_embd];
        crate::ffi::dequantize_into(self.embd_ty, bytes, &mut row)?;
        for (o, x) in out.iter_mut().zip(&row) {
            *o += x;
        }
        Ok(())
    }

    /// `P(id)`, the projected text embedding of `id`.
    fn text_row(&self, id: u32) -> Result<Vec<f32>, ModelError> {
        let mut row = vec![0.0; self.n_embd];
        self.add_row(id as usize, &mut row)?;
        Ok(row)
    }

    /// Appends `P(t)` (+ `C(codec)` when given) as a new row of `rows`.
    fn push_row(
        &self,
        rows: &mut Vec<f32>,
        text: Option<usize>,
        codec: Option<u32>,
    ) -> Result<(), ModelError> {
        let at = rows.len();
        rows.resize(at + self.n_embd, 0.0);
        if let Some(t) = text {
            self.add_row(t, &mut rows[at..])?;
        }
        if let Some(c) = codec {
            self.add_row(self.n_text + c as usize, &mut rows[at..])?;
        }
        Ok(())
    }
}
