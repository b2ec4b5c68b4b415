//! What the embedding layers cost: the same request through the Rust API (`Engine::stream`), the
//! owning worker (`Worker`, Rust) and the C ABI (`qtts_synthesize` + `qtts_read`), interleaved,
//! reporting median time to first audio and median time to the last sample, with ratios to the
//! Rust API in the same run.
//!
//!     cargo bench -p qtts-c --bench overhead [-- MODEL [FRAMES [RUNS]]]
//!
//! MODEL: a model path (`qtts random-model` makes full-size ones); absent: the built-in tiny
//! model, whose frames are so cheap that the ratios show the layers' cost per frame at its
//! largest. Audio is consumed as it comes (as a player would), never stored.

use std::ffi::CString;
use std::time::{Duration, Instant};

use qtts::engine::{Engine, EngineConfig, Request, Worker, DEFAULT_QUEUE};
use qtts::talker::Voice;
use qtts_c::*;

struct Timing {
    ttfa: Duration,
    total: Duration,
    samples: usize,
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let cache = tempfile::tempdir().unwrap();
    let found = match args.first() {
        Some(p) => qtts::model::find::resolve(
            p.as_ref(),
            &qtts::model::find::cache_dir(),
            false,
            &mut |_| {},
            &mut |_, _| {},
        )
        .unwrap(),
        None => qtts::model::find::builtin(cache.path()).unwrap(),
    };
    let frames: usize = args.get(1).map_or(125, |f| f.parse().unwrap());
    let runs: usize = args.get(2).map_or(7, |r| r.parse().unwrap());
    let text = "The quick brown fox jumps over the lazy dog, then naps in the sun.";
    eprintln!(
        "model {} ({}), {frames} frames, {runs} runs",
        found.description,
        found.files.talker.display()
    );

    let mut engine = Engine::load(&found.files, EngineConfig::default()).unwrap();
    let speaker = engine.info().default_speaker().map(str::to_owned);
    let mut req = Request::text(text);
    req.voice = Voice {
        speaker,
        ..Voice::default()
    };
    req.max_frames = Some(frames);
    req.min_frames = frames;

    let rust = |engine: &mut Engine| {
        let t = Instant::now();
        let mut ttfa = None;
        let mut samples = 0;
        let mut stream = engine.stream(req.clone(), 16);
        for c in &mut stream {
            ttfa.get_or_insert_with(|| t.elapsed());
            samples += c.len();
        }
        stream.finish().unwrap();
        Timing {
            ttfa: ttfa.unwrap(),
            total: t.elapsed(),
            samples,
        }
    };

    let worker = Worker::load(&found.files, EngineConfig::default(), DEFAULT_QUEUE).unwrap();
    let via_worker = || {
        let t = Instant::now();
        let mut ttfa = None;
        let mut samples = 0;
        let mut job = worker.submit(req.clone()).unwrap();
        while let Some(c) = job.next_chunk(None).unwrap() {
            ttfa.get_or_insert_with(|| t.elapsed());
            samples += c.len();
        }
        job.finish().unwrap();
        Timing {
            ttfa: ttfa.unwrap(),
            total: t.elapsed(),
            samples,
        }
    };

    let model = CString::new(found.files.talker.to_str().unwrap()).unwrap();
    let mut opts = std::mem::MaybeUninit::<QttsOptions>::uninit();
    let mut c_engine = std::ptr::null_mut();
    // SAFETY: a writable struct, then valid options and out pointer.
    unsafe {
        qtts_options_init(opts.as_mut_ptr());
        let mut opts = opts.assume_init();
        opts.model = model.as_ptr();
        assert_eq!(qtts_engine_load(&opts, &mut c_engine), QTTS_OK);
    }
    let c_text = CString::new(text).unwrap();
    let via_c = || {
        let mut r = std::mem::MaybeUninit::<QttsRequest>::uninit();
        let mut s = std::ptr::null_mut();
        let mut buf = vec![0f32; 4096];
        let t = Instant::now();
        let mut ttfa = None;
        let mut samples = 0;
        // SAFETY: valid structs, a live engine, `buf.len()` writable floats.
        unsafe {
            qtts_request_init(r.as_mut_ptr());
            let mut r = r.assume_init();
            r.text = c_text.as_ptr();
            r.max_frames = frames as u32;
            r.min_frames = frames as u32;
            assert_eq!(qtts_synthesize(c_engine, &r, &mut s), QTTS_OK);
            loop {
                let n = qtts_read(s, buf.as_mut_ptr(), buf.len(), -1);
                if n <= 0 {
                    assert_eq!(n, 0);
                    break;
                }
                ttfa.get_or_insert_with(|| t.elapsed());
                samples += n as usize;
            }
            qtts_synthesis_free(s);
        }
        Timing {
            ttfa: ttfa.unwrap(),
            total: t.elapsed(),
            samples,
        }
    };

    // One warm-up each, then interleaved runs.
    rust(&mut engine);
    via_worker();
    via_c();
    let mut results: [(Vec<Duration>, Vec<Duration>); 3] = Default::default();
    for _ in 0..runs {
        for (i, r) in [rust(&mut engine), via_worker(), via_c()]
            .into_iter()
            .enumerate()
        {
            assert_eq!(r.samples, frames * 1920);
            results[i].0.push(r.ttfa);
            results[i].1.push(r.total);
        }
    }
    let audio = frames as f64 * 0.08;
    let (base_ttfa, base_total) = (median(results[0].0.clone()), median(results[0].1.clone()));
    println!("| path | TTFA ms (median) | RTF (median) | TTFA - Rust API | RTF / Rust API |");
    println!("|---|---|---|---|---|");
    for (name, (ttfa, total)) in ["Rust API (Engine::stream)", "Worker (Rust)", "C ABI"]
        .iter()
        .zip(results)
    {
        let (t, tot) = (median(ttfa), median(total));
        println!(
            "| {name} | {:.2} | {:.4} | {:+.2} ms | {:.3} |",
            t.as_secs_f64() * 1e3,
            tot.as_secs_f64() / audio,
            (t.as_secs_f64() - base_ttfa.as_secs_f64()) * 1e3,
            tot.as_secs_f64() / base_total.as_secs_f64()
        );
    }
    // SAFETY: the engine is not used after.
    unsafe { qtts_engine_free(c_engine) };
}
