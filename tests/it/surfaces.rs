//! The table of `tests/fixtures/surfaces/cases.json` through the Rust face: a
//! [`Worker`](qtts::engine::Worker) on the built-in model, a voice named as every face names it
//! ([`VoiceStore::named`]), refusals at `submit`.

use std::collections::HashMap;
use std::time::Duration;

use qtts::engine::{EngineConfig, EngineError, Request, ThreadPlan, Worker};
use qtts::sampling::SamplingOverrides;
use qtts::talker::Voice;
use qtts::voice::{VoiceError, VoiceStore};

use crate::cases::{self, number, Case, Outcome};
use crate::common;

/// The kind the table names an error by.
fn kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::Talker(_) | EngineError::EmptyText | EngineError::Sampling(_) => "request",
        _ => "other",
    }
}

fn run(worker: &Worker, store: &VoiceStore, mmproj: &std::path::Path, case: &Case) -> Outcome {
    let mut req = Request::text(case.text.clone());
    req.voice = match &case.voice {
        Some(name) => {
            match store.named(&worker.info().speakers, mmproj, name, case.language.clone()) {
                Ok(v) => v,
                Err(e @ VoiceError::UnknownName { .. }) => {
                    return Outcome::Error {
                        kind: "request".into(),
                        message: e.to_string(),
                    }
                }
                Err(e) => panic!("{}: {e}", case.name),
            }
        }
        None => Voice {
            language: case.language.clone(),
            ..Voice::default()
        },
    };
    req.overrides = SamplingOverrides {
        temperature: number(&case.temperature),
        top_k: number(&case.top_k),
        top_p: number(&case.top_p),
    };
    req.repetition_penalty = number(&case.repetition_penalty);
    req.max_frames = Some(case.frames);
    req.min_frames = case.frames;
    let mut job = match worker.submit(req) {
        Ok(j) => j,
        Err(e) => {
            return Outcome::Error {
                kind: kind(&e).into(),
                message: e.to_string(),
            }
        }
    };
    let mut samples = Vec::new();
    while let Some(c) = job.next_chunk(Some(Duration::from_secs(60))).unwrap() {
        samples.extend_from_slice(&c);
        if case.cancel {
            job.cancel();
        }
    }
    let summary = job.finish().unwrap();
    Outcome::Audio {
        samples,
        stop: summary.stop.name().into(),
    }
}

#[test]
fn the_shared_table_through_the_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let found =
        qtts::model::find::named(Some(qtts::model::find::BUILTIN.as_ref()), tmp.path()).unwrap();
    let config = EngineConfig {
        plan: ThreadPlan::default_for(2),
        ..EngineConfig::default()
    };
    let worker = Worker::load(&found.files, config, 0).unwrap();
    let store = VoiceStore::new(tmp.path().join("voices"));
    let cases = cases::cases(&common::root());
    let outcomes: HashMap<_, _> = cases
        .iter()
        .map(|c| (c.name.clone(), run(&worker, &store, &found.files.mmproj, c)))
        .collect();
    cases::check("rust", &cases, &outcomes);
}

/// Without a model, the library fails with what to give; it never falls back to the built-in
/// model's noise.
#[test]
fn no_model_is_an_error_that_says_what_to_give() {
    let tmp = tempfile::tempdir().unwrap();
    let e = qtts::model::find::named(None, tmp.path()).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("builtin") && text.contains("none given"),
        "{text}"
    );
}
