//! The shared table (`tests/fixtures/surfaces/cases.json`) through the command:
//! `qtts synth --model builtin --out - --raw`, the samples read from standard output, the stop
//! reason from `--report`, a refusal from the exit status and standard error.

use std::collections::HashMap;

use crate::cli::{qtts, stderr};
use crate::{cases, common};

#[test]
fn the_shared_table_through_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    let table = cases::cases(&common::root());
    let report = tmp.path().join("report.json");
    let mut outcomes = HashMap::new();
    for case in &table {
        if case.cancel {
            // The command has no cancel (Ctrl-C ends the process).
            outcomes.insert(case.name.clone(), cases::Outcome::Skipped);
            continue;
        }
        let frames = case.frames.to_string();
        let mut args = vec![
            "synth".to_owned(),
            case.text.clone(),
            "--model".into(),
            "builtin".into(),
            "--out".into(),
            "-".into(),
            "--raw".into(),
            "--sample-format".into(),
            "f32".into(),
            "--max-frames".into(),
            frames.clone(),
            "--min-frames".into(),
            frames,
            "--report".into(),
            report.to_str().unwrap().into(),
        ];
        for (flag, value) in [
            ("--voice", &case.voice),
            ("--language", &case.language),
            ("--temperature", &case.temperature),
            ("--top-k", &case.top_k),
            ("--top-p", &case.top_p),
            ("--repetition-penalty", &case.repetition_penalty),
        ] {
            if let Some(v) = value {
                args.push(flag.into());
                args.push(v.clone());
            }
        }
        let _ = std::fs::remove_file(&report);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = qtts(&args, tmp.path());
        let outcome = if o.status.success() {
            let samples = o
                .stdout
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let r: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
            let utterances = r["utterances"].as_array().unwrap();
            assert_eq!(utterances.len(), 1, "{}: {r}", case.name);
            cases::Outcome::Audio {
                samples,
                stop: utterances[0]["stop"].as_str().unwrap().into(),
            }
        } else {
            assert!(o.stdout.is_empty(), "{}: audio before a refusal", case.name);
            // The command's errors are all one kind to its caller (exit status 1); which one it
            // was, the message says, as `request` errors say on the other faces.
            assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
            cases::Outcome::Error {
                kind: "request".into(),
                message: stderr(&o),
            }
        };
        outcomes.insert(case.name.clone(), outcome);
    }
    cases::check("command", &table, &outcomes);
}
