//! `qtts voice add|list|rm` and `speak`/`synth --voice|--ref-audio` on the tiny Base fixture.

use crate::common;

use std::path::Path;

use crate::cli::{qtts, read_wav, stderr};

use qtts::model::convert::OutType;

/// Runs the command, which must fail saying `says`.
fn fails(args: &[&str], home: &Path, says: &str) {
    let o = qtts(args, home);
    assert!(
        !o.status.success() && stderr(&o).contains(says),
        "{args:?}: {}",
        stderr(&o)
    );
}

#[test]
fn a_voice_is_added_listed_spoken_and_removed() {
    let (tmp, out) = common::convert_tiny("voice", OutType::F32);
    let home = tmp.path();
    let model = out.talker.parent().unwrap().to_str().unwrap().to_owned();
    // The oracle's reference signal as a float WAV.
    let o = common::oracle(&common::fixture("voice").join("oracle/speaker_encoder.safetensors"));
    let reference = home.join("ref.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 24000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(&reference, spec).unwrap();
    for &x in &o["wav_24k"] {
        w.write_sample(x).unwrap();
    }
    w.finalize().unwrap();
    let voices = home.join("voices");
    let (r, v) = (reference.to_str().unwrap(), voices.to_str().unwrap());

    let add = qtts(
        &[
            "voice",
            "add",
            "anna",
            "--audio",
            r,
            "--text",
            "Hello there.",
            "--model",
            &model,
            "--voices",
            v,
        ],
        home,
    );
    assert!(add.status.success(), "{}", stderr(&add));
    assert!(stderr(&add).contains("in context"), "{}", stderr(&add));
    let list = qtts(&["voice", "list", "--voices", v], home);
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(listed.starts_with("anna\tbase"), "{listed}");

    // The saved voice and the same recording given for one run speak the same samples.
    let speak = |extra: &[&str], name: &str| {
        let wav = home.join(name);
        let mut args = vec![
            "synth",
            "How are you?",
            "--model",
            &model,
            "--greedy",
            "--max-frames",
            "4",
            "--language",
            "english",
            "--out",
            wav.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = qtts(&args, home);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        read_wav(&wav)
    };
    let saved = speak(&["--voice", "anna", "--voices", v], "saved.wav");
    let once = speak(
        &["--ref-audio", r, "--ref-text", "Hello there."],
        "once.wav",
    );
    assert_eq!(saved.len(), 4 * 1920);
    assert!(
        saved == once,
        "the saved voice speaks as its recording does"
    );
    let xvector_only = speak(&["--ref-audio", r], "xvec.wav");
    assert!(
        xvector_only != once,
        "without a transcript the voice is the x-vector alone"
    );
    // The non-official trailing layout speaks the saved voice, from another prompt.
    let trailing = speak(
        &["--voice", "anna", "--voices", v, "--text-mode", "trailing"],
        "trailing.wav",
    );
    assert_eq!(trailing.len(), 4 * 1920);
    assert!(trailing != saved, "the target text is not in the prompt");

    // Mistakes get a message.
    fails(
        &[
            "synth",
            "x",
            "--model",
            &model,
            "--voice",
            "anna",
            "--speaker",
            "vivian",
            "--voices",
            v,
            "--out",
            "/dev/null",
        ],
        home,
        "takes no --speaker",
    );
    let text = home.join("notes.wav");
    std::fs::write(&text, "not a recording").unwrap();
    fails(
        &[
            "voice",
            "add",
            "b",
            "--audio",
            text.to_str().unwrap(),
            "--model",
            &model,
            "--voices",
            v,
        ],
        home,
        "not audio",
    );
    let (_t2, cv) = common::convert_tiny("tiny", OutType::F32);
    let cv = cv.talker.parent().unwrap().to_str().unwrap().to_owned();
    fails(
        &[
            "voice", "add", "b", "--audio", r, "--model", &cv, "--voices", v,
        ],
        home,
        "needs a Base model",
    );

    let rm = qtts(&["voice", "rm", "anna", "--voices", v], home);
    assert!(rm.status.success(), "{}", stderr(&rm));
    fails(
        &[
            "synth",
            "x",
            "--model",
            &model,
            "--voice",
            "anna",
            "--voices",
            v,
            "--out",
            "/dev/null",
        ],
        home,
        "no saved voice \"anna\"",
    );
}
