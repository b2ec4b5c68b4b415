//! The Python package `qtts` (PyO3, abi3): an `Engine` on a [`qtts::engine::Worker`], one-shot
//! synthesis to a numpy array, streaming as an iterator of numpy chunks, cancellation.
//!
//! Contract:
//! - The GIL is released while the engine works: a synthesis never stops other Python threads,
//!   and another thread may cancel it (`Engine.cancel`, `Stream.cancel`).
//! - Waiting wakes every 100 ms to let Python handle signals: Ctrl-C raises `KeyboardInterrupt`
//!   and cancels the synthesis.
//! - Errors are typed: `qtts.ModelError` (files), `qtts.RequestError` (the request does not fit
//!   the model), `qtts.BusyError` (queue full), `qtts.VoiceError` (a reference recording or a
//!   saved voice that cannot be used), all `qtts.QttsError`, each with the Rust error's text;
//!   wrong argument types are `TypeError`, as for any Python function.
//! - Requests are checked when they are made: an unknown voice or language, empty text or a
//!   sampling setting out of range raises `RequestError` at once, before anything is queued.
//! - `voice=` means what it means in C, the command and the server: a speaker of the model (any
//!   case), else a voice saved under that name (`qtts voice add`, `ClonedVoice.save`); or a
//!   `ClonedVoice`. No voice: the model's default speaker.
//! - Text written while it is spoken: `Engine.stream(text, live=True)` returns a `Stream` whose
//!   text continues with `feed` (any pieces, bytes split mid-character included) and ends with
//!   `finish`; speech starts at the first word and is the audio the whole text gives.
//! - Cloning (Base models): `Engine.clone_voice` encodes a recording (a file, or samples with
//!   their rate) into a `ClonedVoice`, which `save` stores where `qtts voice` keeps voices and
//!   `Engine.load_voice` reads back.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::create_exception;
use pyo3::exceptions::{PyDeprecationWarning, PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use qtts::engine::{
    Canceller, EngineConfig, EngineError, EngineInfo, FeedError, FeedStart, Job, Request, Summary,
    TextWriter, ThreadPlan, Worker,
};
use qtts::model::ModelFiles;
use qtts::sampling::SamplingOverrides;
use qtts::talker::{StopReason, Voice};
use qtts::voice::{SharedCloner, VoiceStore};

create_exception!(
    qtts,
    QttsError,
    PyException,
    "A failure of the qtts engine."
);
create_exception!(
    qtts,
    ModelError,
    QttsError,
    "A model could not be found or loaded."
);
create_exception!(
    qtts,
    RequestError,
    QttsError,
    "The request does not fit the model (unknown voice or language, empty text, ...)."
);
create_exception!(
    qtts,
    BusyError,
    QttsError,
    "The engine's queue is full: retry later."
);
create_exception!(
    qtts,
    EndedError,
    QttsError,
    "The synthesis is over (ended, cancelled or failed): it takes no more text."
);
create_exception!(
    qtts,
    VoiceError,
    QttsError,
    "A reference recording or a saved voice cannot be used (not audio, too short, silent, \
     another model, damaged file, no such voice, not a Base model)."
);

/// How often a wait wakes to let Python handle signals.
const POLL: Duration = Duration::from_millis(100);

fn to_py(e: EngineError) -> PyErr {
    let text = e.to_string();
    match e {
        EngineError::Model(_) => ModelError::new_err(text),
        EngineError::Talker(_) | EngineError::EmptyText | EngineError::Sampling(_) => {
            RequestError::new_err(text)
        }
        EngineError::Busy { .. } => BusyError::new_err(text),
        _ => QttsError::new_err(text),
    }
}

fn voice_err(e: qtts::voice::VoiceError) -> PyErr {
    match e {
        // A name that is no voice at all is a bad request, as in C and the server.
        qtts::voice::VoiceError::UnknownName { .. } => RequestError::new_err(e.to_string()),
        _ => VoiceError::new_err(e.to_string()),
    }
}

fn summary_dict<'py>(py: Python<'py>, s: &Summary) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("frames", s.frames)?;
    d.set_item("samples", s.samples)?;
    d.set_item("cancelled", s.stop == StopReason::Cancelled)?;
    d.set_item("stop", s.stop.name())?;
    d.set_item("ttfa_ms", s.ttfa.map(|t| t.as_secs_f64() * 1e3))?;
    d.set_item("rtf", s.rtf())?;
    d.set_item("text_starved_frames", s.text_starved_frames)?;
    Ok(d)
}

/// Waits for `job`'s next chunk with the GIL released, waking to check for signals; a signal's
/// exception cancels the job.
fn next_chunk(py: Python<'_>, job: &mut Job) -> PyResult<Option<Vec<f32>>> {
    loop {
        match py.detach(|| job.next_chunk(Some(POLL))) {
            Ok(c) => return Ok(c),
            Err(_) => {
                if let Err(e) = py.check_signals() {
                    job.cancel();
                    return Err(e);
                }
            }
        }
    }
}

/// A model loaded on its own thread.
///
/// `Engine(model, *, cores=0, queue=0, cache_dir=None, max_streams=1)`: `model` is a directory with a
/// converted GGUF pair, a talker GGUF, an official checkpoint directory (converted once into
/// the cache), or `"builtin"` for the built-in test model (noise, not speech); without one,
/// `ModelError` says what to give (`qtts pull` fetches a model). `cores`: cores to use (0: all
/// this process may use). `queue`: syntheses that may wait behind the running ones before
/// `BusyError` (0: 8). `max_streams`: syntheses spoken at once (1 to 16), each frame's steps
/// run as one batch; each synthesis's audio is what it gets alone.
#[pyclass(module = "qtts", frozen)]
struct Engine {
    worker: Mutex<Option<Worker>>,
    info: EngineInfo,
    builtin: bool,
    description: String,
    files: ModelFiles,
    /// A Base model's encoders, loaded by the first `clone_voice`.
    cloner: SharedCloner,
}

/// `voice=`: a voice's name (a speaker, else a saved voice) or a cloned voice.
#[derive(FromPyObject)]
enum VoiceArg {
    Cloned(Py<ClonedVoice>),
    Name(String),
}

/// The sampling keywords of `synthesize` and `stream`; `None` keeps the model's setting.
#[derive(Debug, Clone, Copy, Default)]
struct Sampling {
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    repetition_penalty: Option<f32>,
}

/// `clone_voice`'s `audio`: a recording's path, or its samples (with `sample_rate`).
#[derive(FromPyObject)]
enum AudioArg<'py> {
    Path(PathBuf),
    Array(PyReadonlyArray1<'py, f32>),
    Samples(Vec<f32>),
}

impl Engine {
    fn submit(&self, req: Request) -> PyResult<Job> {
        let guard = self.worker.lock().unwrap_or_else(|e| e.into_inner());
        let worker = guard
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("this engine is closed"))?;
        worker.submit(req).map_err(to_py)
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        text: String,
        voice: Option<VoiceArg>,
        language: Option<String>,
        instruct: Option<String>,
        seed: u64,
        max_frames: Option<usize>,
        min_frames: Option<usize>,
        sampling: Sampling,
    ) -> PyResult<Request> {
        let mut req = Request::text(text);
        req.voice = match voice {
            Some(VoiceArg::Cloned(v)) => {
                if instruct.is_some() {
                    return Err(RequestError::new_err(
                        "a cloned voice takes no instruct: the recording gives the voice",
                    ));
                }
                let mmproj = qtts::gguf::GgufFile::open(&self.files.mmproj)
                    .map_err(|e| ModelError::new_err(e.to_string()))?;
                qtts::voice::speaking_voice(&mmproj, &v.get().inner, language).map_err(voice_err)?
            }
            Some(VoiceArg::Name(name)) if instruct.is_none() => store(None)
                .named(&self.info.speakers, &self.files.mmproj, &name, language)
                .map_err(voice_err)?,
            // An instruction goes with a speaker of the model (1.7B CustomVoice); no voice: the
            // model's default speaker (given by the engine).
            name => Voice {
                speaker: match name {
                    Some(VoiceArg::Name(s)) => Some(s),
                    _ => None,
                },
                language,
                instruct,
                xvector: None,
                reference: None,
            },
        };
        req.overrides = SamplingOverrides {
            temperature: sampling.temperature,
            top_k: sampling.top_k,
            top_p: sampling.top_p,
        };
        req.repetition_penalty = sampling.repetition_penalty;
        req.seed = seed;
        req.max_frames = max_frames;
        if let Some(m) = min_frames {
            req.min_frames = req.min_frames.max(m);
        }
        Ok(req)
    }
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (model=None, *, cores=0, queue=0, cache_dir=None, threads=None, max_streams=1))]
    fn new(
        py: Python<'_>,
        model: Option<PathBuf>,
        cores: usize,
        queue: usize,
        cache_dir: Option<PathBuf>,
        threads: Option<usize>,
        max_streams: usize,
    ) -> PyResult<Self> {
        let most = qtts::code_predictor::MAX_ROWS;
        if !(1..=most).contains(&max_streams) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "max_streams: expected 1 to {most}, found {max_streams}"
            )));
        }
        let cores = match threads {
            Some(t) => {
                PyErr::warn(
                    py,
                    &py.get_type::<PyDeprecationWarning>(),
                    c"qtts.Engine: `threads=` is now `cores=`",
                    1,
                )?;
                if cores == 0 {
                    t
                } else {
                    cores
                }
            }
            None => cores,
        };
        py.detach(|| {
            let cache = cache_dir.unwrap_or_else(qtts::model::find::cache_dir);
            let found =
                qtts::model::find::named(model.as_deref(), &cache).map_err(EngineError::Model)?;
            let mut config = EngineConfig::default();
            if cores > 0 {
                config.plan = ThreadPlan::default_for(cores);
            }
            config.max_streams = max_streams;
            let threads = config.plan.all_cores().len().max(1);
            let worker = Worker::load(&found.files, config, queue)?;
            Ok::<_, EngineError>(Engine {
                info: worker.info().clone(),
                worker: Mutex::new(Some(worker)),
                builtin: found.builtin,
                description: found.description,
                cloner: SharedCloner::new(found.files.clone(), threads),
                files: found.files,
            })
        })
        .map_err(to_py)
    }

    /// The named voices (CustomVoice speakers; empty for other models).
    #[getter]
    fn voices(&self) -> Vec<String> {
        self.info.speakers.clone()
    }

    /// The languages the model knows, `auto` first.
    #[getter]
    fn languages(&self) -> Vec<String> {
        self.info.languages.clone()
    }

    /// `custom_voice`, `voice_design` or `base`.
    #[getter]
    fn model_type(&self) -> &'static str {
        self.info.model_type
    }

    /// True for the built-in random-weight test model (noise, not speech).
    #[getter]
    fn builtin(&self) -> bool {
        self.builtin
    }

    /// Sample rate of all audio: 24000 Hz, mono float32.
    #[getter]
    fn sample_rate(&self) -> u32 {
        qtts::audio::SAMPLE_RATE
    }

    /// Speaks `text`; returns the whole audio as a float32 numpy array (24 kHz mono), or with
    /// `with_summary=True` the pair `(audio, summary)` (the summary as `Stream.summary` gives
    /// it: whether it was cancelled or capped). `temperature` (0: greedy), `top_k`, `top_p` and
    /// `repetition_penalty` override the model's sampling settings.
    #[pyo3(signature = (text, *, voice=None, language=None, instruct=None, seed=0, max_frames=None, min_frames=None, temperature=None, top_k=None, top_p=None, repetition_penalty=None, with_summary=false))]
    #[allow(clippy::too_many_arguments)]
    fn synthesize<'py>(
        &self,
        py: Python<'py>,
        text: String,
        voice: Option<VoiceArg>,
        language: Option<String>,
        instruct: Option<String>,
        seed: u64,
        max_frames: Option<usize>,
        min_frames: Option<usize>,
        temperature: Option<f32>,
        top_k: Option<usize>,
        top_p: Option<f32>,
        repetition_penalty: Option<f32>,
        with_summary: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sampling = Sampling {
            temperature,
            top_k,
            top_p,
            repetition_penalty,
        };
        let req = self.request(
            text, voice, language, instruct, seed, max_frames, min_frames, sampling,
        )?;
        let mut job = self.submit(req)?;
        let mut audio = Vec::new();
        while let Some(c) = next_chunk(py, &mut job)? {
            audio.extend_from_slice(&c);
        }
        let summary = py.detach(|| job.finish()).map_err(to_py)?;
        let audio = audio.into_pyarray(py).into_any();
        if with_summary {
            Ok((audio, summary_dict(py, &summary)?)
                .into_pyobject(py)?
                .into_any())
        } else {
            Ok(audio)
        }
    }

    /// Speaks `text`, yielding float32 numpy chunks as the engine makes them (a `Stream`); the
    /// keywords are `synthesize`'s. `live=True`: the text is written while it is spoken (a
    /// language model's answer): `text` is its first piece (`""` for none yet), `Stream.feed`
    /// adds the rest and `Stream.finish` ends it. One utterance (about 150 tokens) for now.
    /// `start`: when a live stream starts speaking: `"paced"` (the default: at the first word
    /// when the text comes at least as fast as speech takes it, 12.5 tokens a second, else once
    /// enough of it is there that playback will not wait for the rest), `"first_word"`,
    /// `"text_end"`, or a number of tokens.
    #[pyo3(signature = (text, *, voice=None, language=None, instruct=None, seed=0, max_frames=None, min_frames=None, temperature=None, top_k=None, top_p=None, repetition_penalty=None, live=false, start=None))]
    #[allow(clippy::too_many_arguments)]
    fn stream(
        &self,
        text: String,
        voice: Option<VoiceArg>,
        language: Option<String>,
        instruct: Option<String>,
        seed: u64,
        max_frames: Option<usize>,
        min_frames: Option<usize>,
        temperature: Option<f32>,
        top_k: Option<usize>,
        top_p: Option<f32>,
        repetition_penalty: Option<f32>,
        live: bool,
        start: Option<StartArg>,
    ) -> PyResult<Stream> {
        let start = match start {
            None => FeedStart::Paced,
            Some(StartArg::Tokens(n)) if n >= 1 => FeedStart::Tokens(n as usize),
            Some(StartArg::Name(s)) => FeedStart::by_name(&s).ok_or_else(|| {
                let names: Vec<&str> = FeedStart::NAMED.iter().map(|(n, _)| *n).collect();
                PyValueError::new_err(format!(
                    "start: expected {} or a number of tokens, found {s:?}",
                    names.join(", ")
                ))
            })?,
            Some(StartArg::Tokens(n)) => {
                return Err(PyValueError::new_err(format!(
                    "start: expected a number of tokens of at least 1, found {n}"
                )))
            }
        };
        let sampling = Sampling {
            temperature,
            top_k,
            top_p,
            repetition_penalty,
        };
        let (first, writer) = if live {
            let (mut w, feed) = qtts::engine::text_feed();
            // A fresh feed takes its first piece at once (nothing reads it yet).
            let _ = w.push(&text);
            (Some(feed), Some(w))
        } else {
            (None, None)
        };
        let mut req = self.request(
            text, voice, language, instruct, seed, max_frames, min_frames, sampling,
        )?;
        if let Some(feed) = first {
            req.text_feed = Some(feed);
            req.feed_start = start;
        }
        let job = self.submit(req)?;
        Ok(Stream {
            cancel: job.canceller(),
            job: Mutex::new(Some(job)),
            summary: Mutex::new(None),
            writer: Mutex::new(writer.ok_or(Unfed::Whole)),
        })
    }

    /// Clones the voice in `audio` (1 to 30 s; a Base model only): a recording's path (WAV,
    /// FLAC, MP3 or Ogg/Vorbis), or its mono samples (a float32 numpy array or a sequence of
    /// floats in [-1, 1]) with their `sample_rate`. With `text`, the words spoken in it, the voice
    /// speaks in context (the official default); without, from the speaker's x-vector alone. The
    /// encoders load on the first call; about half a second per 10 s of recording on 2 cores.
    #[pyo3(signature = (audio, text=None, *, sample_rate=None))]
    fn clone_voice(
        &self,
        py: Python<'_>,
        audio: AudioArg<'_>,
        text: Option<String>,
        sample_rate: Option<u32>,
    ) -> PyResult<ClonedVoice> {
        use qtts::voice::audio_in::{load_reference, reference_from_samples};
        let audio = match audio {
            AudioArg::Array(a) => AudioArg::Samples(a.as_array().iter().copied().collect()),
            other => other,
        };
        let samples = match (audio, sample_rate) {
            (AudioArg::Path(path), None) => py.detach(|| load_reference(&path)),
            (AudioArg::Samples(s), Some(rate)) => py.detach(|| reference_from_samples(&s, rate)),
            (_, Some(_)) => {
                return Err(PyValueError::new_err(
                    "sample_rate: expected none with a file (it gives its own rate), found one",
                ))
            }
            (_, None) => {
                return Err(PyValueError::new_err(
                    "sample_rate: expected the samples' rate in Hz, found none",
                ))
            }
        }
        .map_err(|e| voice_err(e.into()))?;
        py.detach(|| self.cloner.clone_voice(&samples, text.as_deref()))
            .map(|inner| ClonedVoice { inner })
            .map_err(voice_err)
    }

    /// The voice saved as `name` (by `ClonedVoice.save` or `qtts voice add`) in `voices_dir`
    /// (default: `qtts voice`'s directory), checked against this model.
    #[pyo3(signature = (name, voices_dir=None))]
    fn load_voice(&self, name: &str, voices_dir: Option<PathBuf>) -> PyResult<ClonedVoice> {
        let inner = store(voices_dir.as_deref()).get(name).map_err(voice_err)?;
        let mmproj = qtts::gguf::GgufFile::open(&self.files.mmproj)
            .map_err(|e| ModelError::new_err(e.to_string()))?;
        inner.check_for(&mmproj).map_err(voice_err)?;
        Ok(ClonedVoice { inner })
    }

    /// Cancels every synthesis started so far (running or queued), from any thread: each ends
    /// between frames, a `synthesize` returning the audio made until then.
    fn cancel(&self) {
        if let Some(w) = &*self.worker.lock().unwrap_or_else(|e| e.into_inner()) {
            w.cancel_all();
        }
    }

    /// Stops the engine and frees its model (also done when it is garbage-collected).
    fn close(&self, py: Python<'_>) {
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(move || drop(worker));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _ty: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("qtts.Engine({})", self.description)
    }

    /// The baseline of `bench_overhead.py`: `text` at exactly `frames` frames read to its end in
    /// Rust on this engine's worker, the GIL released; returns (seconds to the first chunk,
    /// seconds to the last, samples).
    #[pyo3(signature = (text, frames, seed=0))]
    fn _time_in_rust(
        &self,
        py: Python<'_>,
        text: String,
        frames: usize,
        seed: u64,
    ) -> PyResult<(f64, f64, usize)> {
        let req = self.request(
            text,
            None,
            None,
            None,
            seed,
            Some(frames),
            Some(frames),
            Sampling::default(),
        )?;
        let t = std::time::Instant::now();
        let mut job = self.submit(req)?;
        py.detach(|| {
            let mut first = None;
            let mut samples = 0;
            while let Some(c) = job
                .next_chunk(None)
                .map_err(|_| EngineError::StageGone { stage: "worker" })?
            {
                first.get_or_insert_with(|| t.elapsed().as_secs_f64());
                samples += c.len();
            }
            job.finish()?;
            Ok((
                first.unwrap_or(f64::NAN),
                t.elapsed().as_secs_f64(),
                samples,
            ))
        })
        .map_err(to_py)
    }
}

fn store(dir: Option<&Path>) -> VoiceStore {
    VoiceStore::new(dir.map_or_else(VoiceStore::default_dir, Path::to_path_buf))
}

/// A voice cloned from a recording (`Engine.clone_voice`, `Engine.load_voice`): pass it as
/// `voice=` to `synthesize` or `stream` on an engine of the model it was made with.
#[pyclass(module = "qtts", frozen)]
struct ClonedVoice {
    inner: qtts::voice::ClonedVoice,
}

#[pymethods]
impl ClonedVoice {
    /// The recording's transcript; None for an x-vector-only voice.
    #[getter]
    fn text(&self) -> Option<String> {
        self.inner.text.clone()
    }

    /// Whether it speaks in context (it has a transcript and the recording's codes).
    #[getter]
    fn in_context(&self) -> bool {
        self.inner.in_context()
    }

    /// The recording's length in seconds.
    #[getter]
    fn seconds(&self) -> f32 {
        self.inner.seconds
    }

    /// The model it was made for, as `qtts voice list` shows it (`base 0b6`).
    #[getter]
    fn model(&self) -> String {
        format!("{} {}", self.inner.model.model_type, self.inner.model.size)
    }

    /// Saves it as `name` in `voices_dir` (default: `qtts voice`'s directory, where `qtts
    /// speak --voice NAME` finds it), replacing a voice of that name; returns the file's path.
    #[pyo3(signature = (name, voices_dir=None))]
    fn save(&self, name: &str, voices_dir: Option<PathBuf>) -> PyResult<String> {
        let path = store(voices_dir.as_deref())
            .add(name, &self.inner)
            .map_err(voice_err)?;
        Ok(path.display().to_string())
    }

    fn __repr__(&self) -> String {
        format!(
            "qtts.ClonedVoice({}, {:.1} s, {})",
            self.model(),
            self.inner.seconds,
            match &self.inner.text {
                Some(t) => format!("in context: {t:?}"),
                None => "x-vector only".into(),
            }
        )
    }
}

/// A synthesis in progress: iterate for float32 numpy chunks; `cancel()` from any thread. Dropping
/// it unread (garbage collection, leaving a `with` block) cancels it, as dropping a Rust `Job`
/// and `qtts_synthesis_free` do.
#[pyclass(module = "qtts", frozen)]
struct Stream {
    job: Mutex<Option<Job>>,
    cancel: Canceller,
    summary: Mutex<Option<Summary>>,
    /// A live stream's text writer until `finish`.
    writer: Mutex<Result<TextWriter, Unfed>>,
}

/// Why a stream takes no text.
#[derive(Debug, Clone, Copy)]
enum Unfed {
    /// It was given its whole text (`live=False`).
    Whole,
    /// Its text was finished.
    Finished,
}

/// `Engine.stream`'s `start`.
#[derive(FromPyObject)]
enum StartArg {
    Tokens(i64),
    Name(String),
}

/// The text argument of `Stream.feed`.
#[derive(FromPyObject)]
enum TextPiece {
    Str(String),
    Bytes(Vec<u8>),
}

impl Stream {
    /// Runs `f` on the writer, with the GIL released (a writer far ahead waits for room).
    fn with_writer(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Result<TextWriter, Unfed>) -> Result<(), FeedError> + Send,
    ) -> PyResult<()> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        match &*w {
            Err(Unfed::Whole) => {
                return Err(RequestError::new_err(
                    "this stream was given its whole text: start it with live=True to feed it",
                ))
            }
            Err(Unfed::Finished) => {
                return Err(RequestError::new_err(
                    "this stream's text was finished: start a new stream for more",
                ))
            }
            Ok(_) if self.cancel.is_cancelled() => {
                return Err(EndedError::new_err(qtts::engine::FeedClosed.to_string()))
            }
            Ok(_) => {}
        }
        let w: &mut Result<TextWriter, Unfed> = &mut w;
        py.detach(move || f(w)).map_err(|e| match e {
            FeedError::Closed(c) => EndedError::new_err(c.to_string()),
            FeedError::NotUtf8(e) => PyValueError::new_err(format!("text: {e}")),
        })
    }
}

#[pymethods]
impl Stream {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray1<f32>>>> {
        let mut guard = self.job.lock().unwrap_or_else(|e| e.into_inner());
        let Some(job) = guard.as_mut() else {
            return Ok(None);
        };
        if let Some(c) = next_chunk(py, job)? {
            return Ok(Some(c.into_pyarray(py)));
        }
        let job = guard.take().expect("checked above");
        let summary = py.detach(|| job.finish()).map_err(to_py)?;
        *self.summary.lock().unwrap_or_else(|e| e.into_inner()) = Some(summary);
        Ok(None)
    }

    /// Stops the synthesis between frames; chunks made before still come, then the end.
    fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Adds a piece of a live stream's text (`live=True`): a `str`, or UTF-8 `bytes` that may end
    /// inside a character (the rest comes with the next piece). Raises `EndedError` once the
    /// synthesis is over (ended, cancelled, failed: stop writing), `RequestError` for a stream not
    /// live or already finished, `ValueError` for bytes that are not UTF-8.
    fn feed(&self, py: Python<'_>, text: TextPiece) -> PyResult<()> {
        self.with_writer(py, |w| match (w, text) {
            (Ok(w), TextPiece::Str(t)) => Ok(w.push(&t)?),
            (Ok(w), TextPiece::Bytes(b)) => w.push_bytes(&b),
            (Err(_), _) => Ok(()),
        })
    }

    /// Ends a live stream's text: the engine speaks what is left, then the stream ends. Raises as
    /// `feed` does (`ValueError` when the last bytes ended inside a character; the text ends
    /// all the same).
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        self.with_writer(py, |w| match std::mem::replace(w, Err(Unfed::Finished)) {
            Ok(writer) => writer.finish(),
            Err(_) => Ok(()),
        })
    }

    /// After the last chunk: frames, samples, cancelled, stop (`"eos"`: the speech ended,
    /// `"frame_cap"`: `max_frames` or the length cap, `"cancelled"`), ttfa_ms (None without
    /// audio), rtf; None before.
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        match &*self.summary.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(s) => summary_dict(py, s).map(Some),
            None => Ok(None),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block cancels what was not read.
    fn __exit__(
        &self,
        _ty: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> bool {
        self.cancel.cancel();
        false
    }
}

/// For the tests: writes the tiny byte-level tokenizer that the random test checkpoints (and
/// `tests/fixtures/`) use into `dir`, so that a fixture checkpoint loads as a user's does.
#[pyfunction]
fn _write_tiny_tokenizer(dir: PathBuf) -> PyResult<()> {
    qtts::model::testing::write_tiny_tokenizer(&dir).map_err(|e| ModelError::new_err(e.to_string()))
}

#[pymodule(name = "qtts")]
fn qtts_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<Stream>()?;
    m.add_class::<ClonedVoice>()?;
    m.add_function(wrap_pyfunction!(_write_tiny_tokenizer, m)?)?;
    m.add("QttsError", m.py().get_type::<QttsError>())?;
    m.add("ModelError", m.py().get_type::<ModelError>())?;
    m.add("RequestError", m.py().get_type::<RequestError>())?;
    m.add("BusyError", m.py().get_type::<BusyError>())?;
    m.add("EndedError", m.py().get_type::<EndedError>())?;
    m.add("VoiceError", m.py().get_type::<VoiceError>())?;
    m.add("SAMPLE_RATE", qtts::audio::SAMPLE_RATE)?;
    Ok(())
}
