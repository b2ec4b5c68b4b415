//! The owning worker (`engine::Worker`): pulled audio equals the engine's, whatever the reader's
//! buffer; a full queue answers `Busy` at once; cancelling (queued or running) and dropping a job
//! leave the worker serving the next request exactly; dropping the worker answers every job.

use crate::common;
use common::{config, files};

use std::time::Duration;

use qtts::audio::MemorySink;
use qtts::engine::{downcast_sink, Engine, EngineError, Read, Request, Worker};
use qtts::model::convert::OutType;
use qtts::model::ModelFiles;
use qtts::talker::{StopReason, Voice};

fn request(seed: u64, frames: usize) -> Request {
    let mut req = Request::text("The worker speaks for whoever asks.");
    req.voice = Voice {
        speaker: Some("vivian".into()),
        language: Some("english".into()),
        ..Voice::default()
    };
    req.seed = seed;
    // Forced length: long enough to fill the job's chunk queue when nobody reads.
    req.max_frames = Some(frames);
    req.min_frames = frames;
    req
}

/// The engine's samples for `req`, through `Engine::synthesize` (the reference).
fn reference(files: &ModelFiles, req: &Request) -> Vec<f32> {
    let mut engine = Engine::load(files, config()).unwrap();
    let (summary, sink) = engine
        .synthesize(req.clone(), Box::new(MemorySink::default()))
        .wait();
    summary.unwrap();
    downcast_sink::<MemorySink>(sink).unwrap().samples
}

/// Reads `job` to its end with a buffer of `cap` samples.
fn read_all(job: &mut qtts::engine::Job, cap: usize) -> Vec<f32> {
    let mut out = Vec::new();
    let mut buf = vec![0f32; cap];
    loop {
        match job.read(&mut buf, Some(Duration::from_secs(60))) {
            Read::Samples(n) => {
                assert!(n > 0 && n <= cap);
                out.extend_from_slice(&buf[..n]);
            }
            Read::End => return out,
            Read::Timeout => panic!("no audio for 60 s"),
        }
    }
}

/// Waits until the worker has taken every queued request (the running one is then its own).
fn until_taken(worker: &Worker) {
    for _ in 0..2000 {
        if worker.queued() == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the worker took no request in 10 s");
}

#[test]
fn pulled_audio_equals_the_engines_in_any_buffer_size() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let req = request(5, 30);
    let want = reference(&files(&out), &req);
    assert_eq!(want.len(), 30 * 1920);
    let worker = Worker::load(&files(&out), config(), 2).unwrap();
    assert_eq!(worker.info().model_type, "custom_voice");
    // 1 sample, an odd size, exactly a frame, more than the whole request.
    for cap in [1, 333, 1920, 100_000] {
        let mut job = worker.submit(req.clone()).unwrap();
        let got = read_all(&mut job, cap);
        assert!(got == want, "buffer of {cap}: audio differs");
        assert!(job.is_done());
        let summary = job.finish().unwrap();
        assert_eq!(summary.samples, want.len());
        assert_eq!(summary.frames, 30);
    }
    // Chunk by chunk, then collected whole: the same.
    let mut job = worker.submit(req.clone()).unwrap();
    let mut chunks = Vec::new();
    while let Some(c) = job.next_chunk(None).unwrap() {
        chunks.extend_from_slice(&c);
    }
    assert!(chunks == want);
    let (all, summary) = worker.submit(req).unwrap().collect();
    assert!(all == want);
    assert_eq!(summary.unwrap().samples, want.len());
}

#[test]
fn a_full_queue_is_busy_and_cancels_leave_the_worker_exact() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let last = request(9, 20);
    let want = reference(&files(&out), &last);
    let worker = Worker::load(&files(&out), config(), 1).unwrap();

    // Nobody reads the first job: the engine blocks once its chunk queue is full.
    let mut running = worker.submit(request(1, 60)).unwrap();
    until_taken(&worker);
    let mut queued = worker.submit(request(2, 60)).unwrap();
    assert_eq!(worker.queued(), 1);
    // The first request this worker took; the second is not taken yet.
    let (first, second) = (running.order(), queued.order());
    assert_eq!((first.seq(), first.after()), (1, Some(0)));
    assert_eq!((second.seq(), second.after()), (2, None));
    match worker.submit(request(3, 60)) {
        Err(EngineError::Busy { queue: 1 }) => {}
        other => panic!("expected Busy {{ queue: 1 }}, got {other:?}"),
    }
    // The queued one waits: nothing to read yet.
    let mut buf = [0f32; 64];
    assert_eq!(
        queued.read(&mut buf, Some(Duration::from_millis(20))),
        Read::Timeout
    );
    // Cancelled while queued: never runs.
    queued.cancel();
    // Cancelled while running: what was made stays readable, then the end.
    running.cancel();
    let audio = read_all(&mut running, 4096);
    let summary = running.finish().unwrap();
    assert_eq!(summary.stop, StopReason::Cancelled);
    assert!(summary.frames < 60);
    assert_eq!(audio.len(), summary.samples);
    let summary = queued.finish().unwrap();
    assert_eq!((summary.frames, summary.stop), (0, StopReason::Cancelled));
    // Answered by its reader (never taken), or taken and answered by the worker right after the
    // first: whichever came first.
    let second_taken = second.after().is_some();
    if second_taken {
        assert_eq!(second.after(), Some(1));
    }

    // A job dropped mid-request (its reader went away) is cancelled, not left blocking.
    let mut dropped = worker.submit(request(4, 60)).unwrap();
    let mut one = [0f32; 1920];
    assert!(matches!(
        dropped.read(&mut one, Some(Duration::from_secs(60))),
        Read::Samples(_)
    ));
    // Taken right after the second if the worker answered it, else after the first (the refused
    // third took seq 3 and was never queued).
    let fourth = dropped.order();
    let before = if second_taken { 2 } else { 1 };
    assert_eq!((fourth.seq(), fourth.after()), (4, Some(before)));
    drop(dropped);

    // The next request is served as if nothing had happened.
    let mut job = worker.submit(last).unwrap();
    assert!(read_all(&mut job, 1000) == want);
    assert_eq!(job.order().after(), Some(4));
    assert_eq!(
        job.finish().unwrap().stop,
        StopReason::FrameCap { frames: 20 }
    );
}

#[test]
fn dropping_the_worker_answers_every_job() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let worker = Worker::load(&files(&out), config(), 2).unwrap();
    let running = worker.submit(request(1, 60)).unwrap();
    until_taken(&worker);
    let queued = worker.submit(request(2, 60)).unwrap();
    drop(worker);
    let (_, r) = running.collect();
    assert_eq!(r.unwrap().stop, StopReason::Cancelled);
    let (audio, r) = queued.collect();
    let r = r.unwrap();
    assert_eq!(
        (audio.len(), r.frames, r.stop),
        (0, 0, StopReason::Cancelled)
    );
}

#[test]
fn load_errors_come_back_from_load() {
    let dir = tempfile::tempdir().unwrap();
    let missing = ModelFiles {
        talker: dir.path().join("talker-f32.gguf"),
        mmproj: dir.path().join("mmproj-f32.gguf"),
    };
    let err = Worker::load(&missing, config(), 1).unwrap_err();
    assert!(
        err.to_string().contains("talker-f32.gguf"),
        "the error names the file: {err}"
    );
}

#[test]
fn cancel_all_stops_what_was_submitted_before_it_only() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let worker = Worker::load(&files(&out), config(), 2).unwrap();
    let running = worker.submit(request(1, 60)).unwrap();
    until_taken(&worker);
    let queued = worker.submit(request(2, 60)).unwrap();
    worker.cancel_all();
    let after = worker.submit(request(3, 5)).unwrap();
    let (_, r) = running.collect();
    let r = r.unwrap();
    assert_eq!(r.stop, StopReason::Cancelled);
    assert!(r.frames < 60);
    let (audio, r) = queued.collect();
    let r = r.unwrap();
    assert_eq!(
        (audio.len(), r.frames, r.stop),
        (0, 0, StopReason::Cancelled)
    );
    let (audio, r) = after.collect();
    assert_eq!(r.unwrap().stop, StopReason::FrameCap { frames: 5 });
    assert_eq!(audio.len(), 5 * 1920);
}

/// `Request::frame_limit` bounds both the runaway guard (no `max_frames`) and a larger
/// `max_frames`; `Job::is_queued` holds until the worker takes the job.
#[test]
fn frame_limit_bounds_the_guard_and_max_frames() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let worker = Worker::load(&files(&out), config(), 2).unwrap();
    let mut guard_only = request(1, 0);
    guard_only.max_frames = None;
    guard_only.min_frames = qtts::talker::MIN_FRAMES;
    let mut limited = guard_only.clone();
    limited.frame_limit = Some(7);
    let mut both = request(1, 10);
    both.min_frames = qtts::talker::MIN_FRAMES;
    both.frame_limit = Some(7);
    let running = worker.submit(request(4, 40)).unwrap();
    until_taken(&worker);
    let queued = worker.submit(limited).unwrap();
    assert!(queued.is_queued() && !running.is_queued());
    running.finish().unwrap();
    let (audio, r) = queued.collect();
    assert_eq!(r.unwrap().stop, StopReason::FrameCap { frames: 7 });
    assert_eq!(audio.len(), 7 * 1920);
    let (audio, _) = worker.submit(both).unwrap().collect();
    assert_eq!(audio.len(), 7 * 1920);
    // Without the limit the guard allows more than 7 frames (random weights never stop early).
    let r = worker.submit(guard_only).unwrap().finish().unwrap();
    assert!(r.frames > 7, "{} frames", r.frames);
}
