//! The C ABI called as C calls it: the audio read through `qtts_read` in any buffer size equals
//! the engine's; bad arguments are statuses with messages, never a crash; a full queue is busy;
//! cancel from another thread ends a blocked read; the structs of every header version are
//! written only up to their size; the shared table of requests gives what every face gives.

#[allow(dead_code)]
#[path = "../../../tests/it/cases.rs"]
mod cases;
mod common;

use common::*;
use std::collections::HashMap;
use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use qtts::audio::MemorySink;
use qtts::engine::{downcast_sink, Engine, EngineConfig, Request};
use qtts::talker::Voice;
use qtts_c::*;

fn load(queue: u32) -> *mut QttsEngine {
    let mut opts = builtin_options();
    opts.queue = queue;
    let engine = load_with(&opts).unwrap_or_else(|e| panic!("{e}: {}", last_error()));
    assert!(!engine.is_null());
    engine
}

#[test]
fn versions_and_rate() {
    assert_eq!(qtts_abi_version(), QTTS_ABI_VERSION);
    assert_eq!(qtts_sample_rate(), 24_000);
}

#[test]
fn audio_read_in_any_buffer_equals_the_engines() {
    let text = CString::new("Read me through the C ABI.").unwrap();
    // The reference: the Rust engine on the same model and request.
    let model = qtts::model::find::builtin(cache().0.path()).unwrap();
    let config = EngineConfig {
        plan: qtts::engine::ThreadPlan::for_cores(2),
        ..EngineConfig::default()
    };
    let mut engine = Engine::load(&model.files, config).unwrap();
    let mut req = Request::text(text.to_str().unwrap());
    req.voice = Voice {
        speaker: engine.info().default_speaker().map(str::to_owned),
        ..Voice::default()
    };
    req.seed = 7;
    req.max_frames = Some(12);
    let (done, sink) = engine
        .synthesize(req, Box::new(MemorySink::default()))
        .wait();
    let frames = done.unwrap().frames;
    let want = downcast_sink::<MemorySink>(sink).unwrap().samples;
    drop(engine);
    assert!(!want.is_empty());

    let e = load(2);
    // SAFETY: a live engine.
    unsafe {
        assert_eq!(qtts_engine_is_builtin(e), 1);
        let n = qtts_engine_voice_count(e);
        assert!(n > 0);
        assert!(!qtts_engine_voice_name(e, 0).is_null());
        assert!(qtts_engine_voice_name(e, n).is_null());
        assert!(last_error().contains("out of range"));
    }
    for cap in [1, 500, 1920, 1 << 20] {
        let s = start(e, &request(&text, 12)).unwrap();
        let (got, end) = read_all(s, cap);
        assert_eq!(end, 0, "{}", last_error());
        assert!(
            got == want,
            "buffer of {cap}: audio differs from the engine's"
        );
        let sum = summary(s).unwrap();
        // SAFETY: a live synthesis, freed once.
        unsafe { qtts_synthesis_free(s) };
        assert_eq!(sum.frames as usize, frames);
        assert_eq!(sum.samples as usize, want.len());
        assert_eq!(sum.cancelled, 0);
        assert!(sum.ttfa_ms > 0.0);
    }
    // SAFETY: the engine is not used after.
    unsafe { qtts_engine_free(e) };
}

#[test]
fn bad_arguments_are_statuses_with_messages() {
    let e = load(1);
    let text = CString::new("Hello.").unwrap();
    // SAFETY: every call below passes what its contract allows (nulls included).
    unsafe {
        let mut s = null_mut();
        assert_eq!(
            qtts_synthesize(e, null(), &mut s),
            QTTS_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("req"), "{}", last_error());
        assert_eq!(
            qtts_synthesize(null(), &request(&text, 0), &mut s),
            QTTS_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            qtts_synthesize(e, &request(&text, 0), null_mut()),
            QTTS_ERR_INVALID_ARGUMENT
        );
        // No text.
        let mut r = request(&text, 0);
        r.text = null();
        assert_eq!(qtts_synthesize(e, &r, &mut s), QTTS_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("req.text"), "{}", last_error());
        // Not UTF-8.
        let bad = [b'a', 0xff, 0xfe, 0];
        r.text = bad.as_ptr().cast::<c_char>();
        assert_eq!(qtts_synthesize(e, &r, &mut s), QTTS_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("UTF-8"), "{}", last_error());
        // A struct from no known version.
        let mut r = request(&text, 0);
        r.size = 8;
        assert_eq!(qtts_synthesize(e, &r, &mut s), QTTS_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("size"), "{}", last_error());
        assert!(s.is_null());
        // A summary before the end.
        let s = start(e, &fixed(&text, 2)).unwrap();
        assert_eq!(summary(s).unwrap_err(), QTTS_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("still running"), "{}", last_error());
        assert_eq!(
            qtts_synthesis_summary_sized(s, null_mut()),
            QTTS_ERR_INVALID_ARGUMENT
        );
        // Read to its end, so that the queue of 1 has room for the next.
        assert_eq!(read_all(s, 4096).1, 0);
        qtts_synthesis_free(s);
        // Reads with no room.
        let s = start(e, &request(&text, 2)).unwrap();
        assert_eq!(
            qtts_read(s, null_mut(), 10, 0),
            i64::from(QTTS_ERR_INVALID_ARGUMENT)
        );
        let mut one = 0f32;
        assert_eq!(
            qtts_read(s, &mut one, 0, 0),
            i64::from(QTTS_ERR_INVALID_ARGUMENT)
        );
        assert_eq!(
            qtts_read(null_mut(), &mut one, 1, 0),
            i64::from(QTTS_ERR_INVALID_ARGUMENT)
        );
        assert_eq!(qtts_cancel(null()), QTTS_ERR_INVALID_ARGUMENT);
        qtts_synthesis_free(s);
        qtts_synthesis_free(null_mut());
        qtts_engine_free(e);
        qtts_engine_free(null_mut());
        assert_eq!(qtts_options_init(null_mut()), QTTS_ERR_INVALID_ARGUMENT);
        assert_eq!(qtts_request_init(null_mut()), QTTS_ERR_INVALID_ARGUMENT);
        assert_eq!(
            qtts_options_defaults(null_mut(), 64),
            QTTS_ERR_INVALID_ARGUMENT
        );
        let mut small = [0u8; 16];
        assert_eq!(
            qtts_request_defaults(small.as_mut_ptr().cast(), small.len()),
            QTTS_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("found 16"), "{}", last_error());
        assert_eq!(small, [0; 16], "nothing written into a struct too small");
    }
}

#[test]
fn a_missing_model_is_a_model_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = CString::new(dir.path().join("nothing-here").to_str().unwrap()).unwrap();
    let mut e = null_mut();
    // SAFETY: valid pointers.
    unsafe {
        let mut opts = options();
        // No model: no look in the working directory, no built-in model unless named.
        assert_eq!(qtts_engine_load(&opts, &mut e), QTTS_ERR_MODEL);
        assert!(
            last_error().contains("builtin") && last_error().contains("none given"),
            "{}",
            last_error()
        );
        opts.model = path.as_ptr();
        assert_eq!(qtts_engine_load(&opts, &mut e), QTTS_ERR_MODEL);
        assert!(last_error().contains("nothing-here"), "{}", last_error());
        assert_eq!(
            qtts_engine_load(&opts, null_mut()),
            QTTS_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("out"), "{}", last_error());
    }
    assert!(e.is_null());
}

#[test]
fn a_full_queue_is_busy_and_cancel_ends_a_blocked_read() {
    let e = load(1);
    let text = CString::new("A long request that nobody reads for a while.").unwrap();
    let running = start(e, &fixed(&text, 200)).unwrap();
    // Wait until the worker runs it (audio comes), so that the next one is queued.
    let mut buf = vec![0f32; 1920];
    // SAFETY: a live synthesis and writable floats.
    assert!(unsafe { qtts_read(running, buf.as_mut_ptr(), buf.len(), 60_000) } > 0);
    let queued = start(e, &fixed(&text, 200)).unwrap();
    assert_eq!(start(e, &fixed(&text, 200)), Err(QTTS_ERR_BUSY));
    assert!(last_error().contains("busy"), "{}", last_error());
    // The queued one has nothing yet.
    // SAFETY: as above.
    let n = unsafe { qtts_read(queued, buf.as_mut_ptr(), buf.len(), 10) };
    assert_eq!(n, i64::from(QTTS_ERR_TIMEOUT));
    // Cancel the queued one from another thread while this one blocks reading it.
    let handle = queued as usize;
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        // SAFETY: the synthesis lives until freed below, after this thread is joined.
        unsafe { qtts_cancel(handle as *const QttsSynthesis) }
    });
    // SAFETY: as above; -1: wait as long as it takes, which the cancel ends.
    let n = unsafe { qtts_read(queued, buf.as_mut_ptr(), buf.len(), -1) };
    assert_eq!(canceller.join().unwrap(), QTTS_OK);
    assert_eq!(n, 0);
    // SAFETY: live handles; the engine is freed last.
    unsafe {
        let sum = summary(queued).unwrap();
        assert_eq!((sum.frames, sum.cancelled), (0, 1));
        assert_eq!((sum.stop, sum.ttfa_ms), (QTTS_STOP_CANCELLED, -1.0));
        assert_eq!(qtts_cancel(running), QTTS_OK);
        let (_, end) = read_all(running, 4096);
        assert_eq!(end, 0);
        let sum = summary(running).unwrap();
        assert_eq!((sum.cancelled, sum.stop), (1, QTTS_STOP_CANCELLED));
        assert!(sum.frames < 200);
        qtts_synthesis_free(queued);
        qtts_synthesis_free(running);
        qtts_engine_free(e);
    }
}

#[test]
fn freeing_the_engine_ends_its_syntheses() {
    let e = load(2);
    let text = CString::new("Freed while speaking.").unwrap();
    let s = start(e, &fixed(&text, 200)).unwrap();
    // SAFETY: the synthesis outlives its engine by the ABI's contract; freed last.
    unsafe {
        qtts_engine_free(e);
        let (_, end) = read_all(s, 4096);
        assert_eq!(end, 0);
        qtts_synthesis_free(s);
    }
}

/// Loads the model at `dir` (any path `qtts_engine_load` takes).
fn load_model(dir: &CStr) -> *mut QttsEngine {
    let mut opts = options();
    opts.model = dir.as_ptr();
    opts.cache_dir = cache().1.as_ptr();
    opts.cores = 2;
    let mut engine = null_mut();
    // SAFETY: valid options and out pointer.
    let status = unsafe { qtts_engine_load(&opts, &mut engine) };
    assert_eq!(status, QTTS_OK, "{}", last_error());
    engine
}

/// A voiced, speech-like 2.5 s recording at 24 kHz (a 120 Hz harmonic series under a 4 Hz
/// syllable envelope), as a 16-bit WAV.
fn write_reference(path: &std::path::Path) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    let tau = 2.0 * std::f64::consts::PI;
    for i in 0..60_000 {
        let t = f64::from(i) / 24_000.0;
        let h: f64 = (1..12)
            .map(|k| (tau * 120.0 * f64::from(k) * t).sin() / f64::from(k))
            .sum();
        let envelope = 0.5 + 0.5 * (tau * 4.0 * t).sin().powi(2);
        w.write_sample((h * envelope * 4000.0) as i16).unwrap();
    }
    w.finalize().unwrap();
}

/// Cloning through the ABI on the voice oracle's tiny Base checkpoint: a voice cloned, saved,
/// loaded and spoken gives the same samples as the one cloned (the x-vector-only voice does not);
/// bad input and a voice of another model are statuses; an old caller's smaller request never
/// reads the new field.
#[test]
fn a_cloned_voice_is_saved_loaded_and_spoken() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("tokenizer");
    qtts::model::testing::write_tiny_tokenizer(&tok).unwrap();
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/voice/model");
    let out = qtts::model::convert::convert(
        &fixture,
        Some(&tok),
        &tmp.path().join("gguf"),
        qtts::model::convert::OutType::F32,
        &mut |_, _| {},
    )
    .unwrap();
    let dir = CString::new(out.talker.parent().unwrap().to_str().unwrap()).unwrap();
    let base = load_model(&dir);
    let wav = tmp.path().join("ref.wav");
    write_reference(&wav);
    let wav = CString::new(wav.to_str().unwrap()).unwrap();
    let said = CString::new("Hello there.").unwrap();
    let voices = CString::new(tmp.path().join("voices").to_str().unwrap()).unwrap();
    let name = CString::new("anna").unwrap();
    let text = CString::new("How are you?").unwrap();
    let speak = |engine: *mut QttsEngine, v: *const QttsVoice| -> Result<Vec<f32>, i32> {
        let mut r = fixed(&text, 4);
        r.cloned_voice = v;
        let s = start(engine, &r)?;
        let (audio, end) = read_all(s, 4096);
        // SAFETY: a live synthesis, freed once.
        unsafe { qtts_synthesis_free(s) };
        assert_eq!(end, 0, "{}", last_error());
        Ok(audio)
    };
    // SAFETY: live handles and NUL-terminated strings throughout; each voice freed once.
    unsafe {
        let (mut v, mut x, mut back) = (null_mut(), null_mut(), null_mut());
        assert_eq!(
            qtts_voice_clone(base, wav.as_ptr(), said.as_ptr(), &mut v),
            QTTS_OK,
            "{}",
            last_error()
        );
        assert_eq!(
            qtts_voice_clone(base, wav.as_ptr(), null(), &mut x),
            QTTS_OK
        );
        assert_eq!((qtts_voice_in_context(v), qtts_voice_in_context(x)), (1, 0));
        assert_eq!(
            qtts_voice_save(v, name.as_ptr(), voices.as_ptr()),
            QTTS_OK,
            "{}",
            last_error()
        );
        assert_eq!(
            qtts_voice_load(base, name.as_ptr(), voices.as_ptr(), &mut back),
            QTTS_OK
        );
        let spoken = speak(base, v).unwrap();
        assert_eq!(spoken.len(), 4 * 1920);
        assert!(
            speak(base, back).unwrap() == spoken,
            "saved and loaded, the same voice"
        );
        assert!(
            speak(base, x).unwrap() != spoken,
            "x-vector only is another voice"
        );
        // The same recording as samples with their rate: the same voice.
        let pcm: Vec<f32> = hound::WavReader::open(tmp.path().join("ref.wav"))
            .unwrap()
            .samples::<i16>()
            .map(|x| f32::from(x.unwrap()) / 32768.0)
            .collect();
        let mut from_samples = null_mut();
        assert_eq!(
            qtts_voice_clone_samples(
                base,
                pcm.as_ptr(),
                pcm.len(),
                24_000,
                said.as_ptr(),
                &mut from_samples
            ),
            QTTS_OK,
            "{}",
            last_error()
        );
        assert!(
            speak(base, from_samples).unwrap() == spoken,
            "samples and file, the same voice"
        );
        qtts_voice_free(from_samples);
        let mut none = null_mut();
        assert_eq!(
            qtts_voice_clone_samples(base, pcm.as_ptr(), pcm.len(), 0, null(), &mut none),
            QTTS_ERR_VOICE
        );
        assert!(last_error().contains("rate"), "{}", last_error());
        assert_eq!(
            qtts_voice_clone_samples(base, pcm.as_ptr(), 2400, 24_000, null(), &mut none),
            QTTS_ERR_VOICE
        );
        assert_eq!(
            qtts_voice_clone_samples(base, null(), 10, 24_000, null(), &mut none),
            QTTS_ERR_INVALID_ARGUMENT
        );
        assert!(none.is_null());

        // Bad input: statuses with messages, NULL left in `out`.
        let junk = tmp.path().join("notes.wav");
        std::fs::write(&junk, "this is not a recording\n").unwrap();
        let junk = CString::new(junk.to_str().unwrap()).unwrap();
        let mut none = null_mut();
        assert_eq!(
            qtts_voice_clone(base, junk.as_ptr(), null(), &mut none),
            QTTS_ERR_VOICE
        );
        assert!(
            none.is_null() && last_error().contains("not audio"),
            "{}",
            last_error()
        );
        let nobody = CString::new("nobody").unwrap();
        assert_eq!(
            qtts_voice_load(base, nobody.as_ptr(), voices.as_ptr(), &mut none),
            QTTS_ERR_VOICE
        );
        assert!(last_error().contains("nobody"), "{}", last_error());
        assert_eq!(
            qtts_voice_clone(base, null(), null(), &mut none),
            QTTS_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            qtts_voice_save(null(), name.as_ptr(), null()),
            QTTS_ERR_INVALID_ARGUMENT
        );
        assert_eq!(qtts_voice_in_context(null()), -1);
        qtts_voice_free(null_mut());
        let whisper = CString::new("whisper").unwrap();
        let mut r = fixed(&text, 4);
        r.cloned_voice = v;
        r.instruct = whisper.as_ptr();
        assert_eq!(start(base, &r).unwrap_err(), QTTS_ERR_REQUEST);

        // A CustomVoice engine clones nothing and refuses a Base voice; a request of the first
        // version's size (before `cloned_voice`) does not read it.
        let cv = load(2);
        assert_eq!(
            qtts_voice_clone(cv, wav.as_ptr(), null(), &mut none),
            QTTS_ERR_VOICE
        );
        assert!(last_error().contains("Base model"), "{}", last_error());
        assert_eq!(speak(cv, v).unwrap_err(), QTTS_ERR_VOICE);
        assert!(last_error().contains("made for"), "{}", last_error());
        assert_eq!(
            qtts_voice_load(cv, name.as_ptr(), voices.as_ptr(), &mut none),
            QTTS_ERR_VOICE
        );
        let mut old = fixed(&text, 4);
        old.cloned_voice = v;
        old.size = std::mem::offset_of!(QttsRequest, cloned_voice);
        let s = start(cv, &old).unwrap();
        assert_eq!(read_all(s, 4096).0.len(), 4 * 1920);
        qtts_synthesis_free(s);
        qtts_engine_free(cv);

        assert!(speak(base, v).unwrap() == spoken, "the engine goes on");
        for voice in [v, x, back] {
            qtts_voice_free(voice);
        }
        qtts_engine_free(base);
    }
}

/// Version 1's exported functions write version 1's structs and nothing past them; the sized
/// functions fill what the caller declares, zeroing bytes past this library's struct; a summary
/// declared smaller than its first sized version is refused untouched.
#[test]
fn every_struct_is_written_up_to_the_callers_size_only() {
    const GUARD: u8 = 0xAA;
    let mut buf = [GUARD; 256];
    // SAFETY: 256 writable bytes, more than any version's struct.
    unsafe {
        assert_eq!(qtts_options_init(buf.as_mut_ptr().cast()), QTTS_OK);
        let v1 = std::mem::size_of::<OptionsV1>();
        assert_eq!(std::ptr::read_unaligned(buf.as_ptr().cast::<usize>()), v1);
        assert!(buf[v1..].iter().all(|&b| b == GUARD), "options past {v1}");
        buf.fill(GUARD);
        assert_eq!(qtts_request_init(buf.as_mut_ptr().cast()), QTTS_OK);
        let v1 = std::mem::size_of::<RequestV1>();
        assert_eq!(std::ptr::read_unaligned(buf.as_ptr().cast::<usize>()), v1);
        assert!(buf[v1..].iter().all(|&b| b == GUARD), "request past {v1}");
        let r = std::ptr::read_unaligned(buf.as_ptr().cast::<RequestV1>());
        assert!(r.text.is_null() && r.voice.is_null() && r.seed == 0 && r.max_frames == 0);

        // A newer caller's larger struct: this library's fields, then zeros up to its size.
        for (size, own) in [
            (200usize, std::mem::size_of::<QttsRequest>()),
            (
                std::mem::size_of::<QttsRequest>(),
                std::mem::size_of::<QttsRequest>(),
            ),
        ] {
            buf.fill(GUARD);
            assert_eq!(
                qtts_request_defaults(buf.as_mut_ptr().cast(), size),
                QTTS_OK
            );
            assert_eq!(std::ptr::read_unaligned(buf.as_ptr().cast::<usize>()), size);
            assert!(
                buf[own..size].iter().all(|&b| b == 0),
                "zeroed up to {size}"
            );
            assert!(
                buf[size..].iter().all(|&b| b == GUARD),
                "request past {size}"
            );
            let r = std::ptr::read_unaligned(buf.as_ptr().cast::<QttsRequest>());
            assert_eq!((r.temperature, r.top_k, r.top_p), (-1.0, -1, -1.0));
        }
        buf.fill(GUARD);
        assert_eq!(qtts_options_defaults(buf.as_mut_ptr().cast(), 100), QTTS_OK);
        assert!(buf[100..].iter().all(|&b| b == GUARD));
        let o = std::ptr::read_unaligned(buf.as_ptr().cast::<QttsOptions>());
        assert!(o.model.is_null() && o.cores == 0 && o.queue == 0);
    }

    // The summary: a version-1 caller's, a smaller sized one (refused), a larger one.
    let e = load(1);
    let text = CString::new("Sizes.").unwrap();
    let s = start(e, &fixed(&text, 2)).unwrap();
    assert_eq!(read_all(s, 4096).1, 0);
    // SAFETY: a live synthesis; buffers of the sizes declared; freed once.
    unsafe {
        buf.fill(GUARD);
        assert_eq!(qtts_synthesis_summary(s, buf.as_mut_ptr().cast()), QTTS_OK);
        let v1 = std::mem::size_of::<SummaryV1>();
        assert!(buf[v1..].iter().all(|&b| b == GUARD), "summary past {v1}");
        let old = std::ptr::read_unaligned(buf.as_ptr().cast::<SummaryV1>());
        assert_eq!((old.frames, old.samples, old.cancelled), (2, 2 * 1920, 0));

        buf.fill(GUARD);
        std::ptr::write_unaligned(buf.as_mut_ptr().cast::<usize>(), 16);
        assert_eq!(
            qtts_synthesis_summary_sized(s, buf.as_mut_ptr().cast()),
            QTTS_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("found 16"), "{}", last_error());
        assert!(
            buf[8..].iter().all(|&b| b == GUARD),
            "a refused summary is untouched"
        );

        buf.fill(GUARD);
        std::ptr::write_unaligned(buf.as_mut_ptr().cast::<usize>(), 96);
        assert_eq!(
            qtts_synthesis_summary_sized(s, buf.as_mut_ptr().cast()),
            QTTS_OK
        );
        let own = std::mem::size_of::<QttsSummary>();
        let sum = std::ptr::read_unaligned(buf.as_ptr().cast::<QttsSummary>());
        assert_eq!(sum.size, own, "the bytes filled");
        assert_eq!((sum.frames, sum.stop), (2, QTTS_STOP_FRAME_CAP));
        assert!(buf[own..96].iter().all(|&b| b == 0) && buf[96..].iter().all(|&b| b == GUARD));
        qtts_synthesis_free(s);
        qtts_engine_free(e);
    }
}

/// The shared table (`tests/fixtures/surfaces/cases.json`) through the C ABI.
#[test]
fn the_shared_table_through_the_c_abi() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let table = cases::cases(&root);
    let e = load(2);
    let cstr = |s: &Option<String>| s.as_deref().map(|s| CString::new(s).unwrap());
    let mut outcomes = HashMap::new();
    for case in &table {
        let text = CString::new(case.text.as_str()).unwrap();
        let (voice, language) = (cstr(&case.voice), cstr(&case.language));
        let mut r = fixed(&text, case.frames as u32);
        r.seed = 0;
        r.voice = voice.as_ref().map_or(null(), |v| v.as_ptr());
        r.language = language.as_ref().map_or(null(), |v| v.as_ptr());
        // Unset: negative, the model's setting.
        r.temperature = cases::number(&case.temperature).unwrap_or(-1.0);
        r.top_k = cases::number(&case.top_k).unwrap_or(-1);
        r.top_p = cases::number(&case.top_p).unwrap_or(-1.0);
        r.repetition_penalty = cases::number(&case.repetition_penalty).unwrap_or(-1.0);
        let outcome = match start(e, &r) {
            Err(code) => cases::Outcome::Error {
                kind: if code == QTTS_ERR_REQUEST {
                    "request".into()
                } else {
                    format!("status {code}")
                },
                message: last_error(),
            },
            Ok(s) => {
                let mut samples = Vec::new();
                let mut buf = vec![0f32; 4096];
                // SAFETY: a live synthesis, freed once below.
                unsafe {
                    loop {
                        let n = qtts_read(s, buf.as_mut_ptr(), buf.len(), 60_000);
                        assert!(n >= 0, "{}: {}", case.name, last_error());
                        if n == 0 {
                            break;
                        }
                        samples.extend_from_slice(&buf[..n as usize]);
                        if case.cancel {
                            assert_eq!(qtts_cancel(s), QTTS_OK);
                        }
                    }
                    let sum = summary(s).unwrap();
                    qtts_synthesis_free(s);
                    assert_eq!(sum.cancelled == 1, sum.stop == QTTS_STOP_CANCELLED);
                    cases::Outcome::Audio {
                        samples,
                        stop: match sum.stop {
                            QTTS_STOP_EOS => "eos",
                            QTTS_STOP_FRAME_CAP => "frame_cap",
                            QTTS_STOP_CANCELLED => "cancelled",
                            other => panic!("stop {other}"),
                        }
                        .into(),
                    }
                }
            }
        };
        outcomes.insert(case.name.clone(), outcome);
    }
    // SAFETY: no synthesis left.
    unsafe { qtts_engine_free(e) };
    cases::check("c", &table, &outcomes);
}

/// The model's type, languages and voices in C are the Rust engine's, in its order.
#[test]
fn model_info_is_the_engines() {
    let found = qtts::model::find::builtin(cache().0.path()).unwrap();
    let worker = qtts::engine::Worker::load(&found.files, EngineConfig::default(), 1).unwrap();
    let info = worker.info().clone();
    drop(worker);
    let e = load(1);
    let text = |p: *const c_char| {
        assert!(!p.is_null(), "{}", last_error());
        // SAFETY: a NUL-terminated string the engine keeps alive.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned()
    };
    // SAFETY: a live engine, freed last; NULLs where the contract allows them.
    unsafe {
        assert_eq!(text(qtts_engine_model_type(e)), "custom_voice");
        assert_eq!(info.model_type, "custom_voice");
        let languages: Vec<String> = (0..qtts_engine_language_count(e))
            .map(|i| text(qtts_engine_language_name(e, i)))
            .collect();
        assert_eq!(languages, info.languages);
        assert_eq!(languages[0], "auto");
        assert!(languages.iter().any(|l| l == "english"));
        assert!(qtts_engine_language_name(e, languages.len()).is_null());
        assert!(last_error().contains("out of range"), "{}", last_error());
        let voices: Vec<String> = (0..qtts_engine_voice_count(e))
            .map(|i| text(qtts_engine_voice_name(e, i)))
            .collect();
        assert_eq!(voices, info.speakers);
        assert!(qtts_engine_model_type(null()).is_null());
        assert_eq!(qtts_engine_language_count(null()), 0);
        qtts_engine_free(e);
    }
}
