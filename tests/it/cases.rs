//! The table of `tests/fixtures/surfaces/cases.json`: the same requests run through every face
//! (Rust here in `surfaces.rs`, the C ABI, the command; Python reads the same file), each face
//! reporting what happened as an [`Outcome`] and [`check`] judging them all alike.

use std::collections::HashMap;
use std::path::Path;

/// Samples per 80 ms frame.
pub const FRAME: usize = 1920;

/// One request of the table.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub text: String,
    pub voice: Option<String>,
    pub language: Option<String>,
    /// Sampling settings as written (a face parses them as it parses a user's).
    pub temperature: Option<String>,
    pub top_k: Option<String>,
    pub top_p: Option<String>,
    pub repetition_penalty: Option<String>,
    /// Frames spoken, exactly (max and min).
    pub frames: usize,
    /// Cancel after the first audio.
    pub cancel: bool,
    expect: Value,
}

/// What a face saw.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Audio, and the stop reason by its name (`eos`, `frame_cap`, `cancelled`).
    Audio { samples: Vec<f32>, stop: String },
    /// Refused: the error's kind (`request`, ...) and message.
    Error { kind: String, message: String },
    /// Not run on this face (the command cannot cancel).
    Skipped,
}

use serde_json::Value;

/// The table's cases, under `root` (the repository).
pub fn cases(root: &Path) -> Vec<Case> {
    let path = root.join("tests/fixtures/surfaces/cases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(table["model"], "builtin");
    let frames = table["frames"].as_u64().unwrap() as usize;
    let s = |c: &Value, k: &str| c.get(k).map(|v| v.as_str().unwrap().to_owned());
    table["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: s(c, "name").unwrap(),
            text: s(c, "text").unwrap(),
            voice: s(c, "voice"),
            language: s(c, "language"),
            temperature: s(c, "temperature"),
            top_k: s(c, "top_k"),
            top_p: s(c, "top_p"),
            repetition_penalty: s(c, "repetition_penalty"),
            frames: c
                .get("frames")
                .map_or(frames, |f| f.as_u64().unwrap() as usize),
            cancel: c.get("cancel").is_some_and(|b| b.as_bool().unwrap()),
            expect: c.clone(),
        })
        .collect()
}

/// Parses a table number as Rust parses a user's (`"NaN"`, `"inf"` included).
pub fn number<T: std::str::FromStr>(s: &Option<String>) -> Option<T>
where
    T::Err: std::fmt::Debug,
{
    s.as_deref().map(|v| v.parse().unwrap())
}

/// Checks what `face` saw against the table: every case has an outcome, each the one expected.
pub fn check(face: &str, cases: &[Case], outcomes: &HashMap<String, Outcome>) {
    let mut failures = Vec::new();
    let audio = |name: &str| match outcomes.get(name) {
        Some(Outcome::Audio { samples, .. }) => samples.clone(),
        other => panic!("{face}: case {name} is referred to but gave {other:?}"),
    };
    for case in cases {
        let e = &case.expect;
        let got = outcomes
            .get(&case.name)
            .unwrap_or_else(|| panic!("{face}: no outcome for {}", case.name));
        match (e["expect"].as_str().unwrap(), got) {
            (_, Outcome::Skipped) => {}
            ("ok", Outcome::Audio { samples, stop }) => {
                if stop != e["stop"].as_str().unwrap() {
                    failures.push(format!(
                        "{}: stop {stop}, expected {}",
                        case.name, e["stop"]
                    ));
                }
                let whole = case.frames * FRAME;
                let fits = if case.cancel {
                    !samples.is_empty() && samples.len() < whole && samples.len() % FRAME == 0
                } else {
                    samples.len() == whole
                };
                if !fits {
                    failures.push(format!(
                        "{}: {} samples for {} frames{}",
                        case.name,
                        samples.len(),
                        case.frames,
                        if case.cancel { ", cancelled" } else { "" }
                    ));
                }
                if samples.iter().any(|x| !x.is_finite()) {
                    failures.push(format!("{}: non-finite samples", case.name));
                }
                if let Some(other) = e.get("same_as").and_then(Value::as_str) {
                    if *samples != audio(other) {
                        failures.push(format!("{}: audio differs from {other}'s", case.name));
                    }
                }
                if let Some(other) = e.get("differs_from").and_then(Value::as_str) {
                    if *samples == audio(other) {
                        failures.push(format!("{}: audio equals {other}'s", case.name));
                    }
                }
            }
            ("error", Outcome::Error { kind, message }) => {
                let want = e["message"].as_str().unwrap();
                if kind != e["kind"].as_str().unwrap() || !message.contains(want) {
                    failures.push(format!(
                        "{}: {kind} error {message:?}, expected {} error with {want:?}",
                        case.name, e["kind"]
                    ));
                }
            }
            (want, got) => failures.push(format!("{}: expected {want}, got {got:?}", case.name)),
        }
    }
    assert!(failures.is_empty(), "{face}:\n{}", failures.join("\n"));
}
