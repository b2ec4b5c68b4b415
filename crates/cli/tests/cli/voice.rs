//! `qtts voice add|list|rm` and `speak`/`synth --voice|--ref-audio` on the tiny Base fixture.

use crate::common;

use std::path::Path;

use crate::cli::{qtts, read_wav, stderr};

use qtts::model::convert::OutType;

/// What [`serve`] gives back: each answer's status line and body, and the server's stderr.
type Answers = (Vec<(String, Vec<u8>)>, String);

/// Starts `qtts serve` on `model` (trailing text mode) with the voices of `voices`, posts each
/// of `bodies` to `/v1/audio/speech`, and returns each answer's status line and body.
fn serve(model: &str, voices: &str, home: &Path, bodies: &[String]) -> Answers {
    use std::io::{BufRead, Read, Write};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_qtts"))
        .args([
            "serve",
            "--model",
            model,
            "--voices",
            voices,
            "--http",
            "127.0.0.1:0",
            "--wyoming",
            "none",
            "--cores",
            "1",
            "--text-mode",
            "trailing",
        ])
        .env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    let answers = bodies
        .iter()
        .map(|body| {
            let mut tcp = std::net::TcpStream::connect(&addr).unwrap();
            write!(
                tcp,
                "POST /v1/audio/speech HTTP/1.1\r\nHost: {addr}\r\nContent-Type: \
                 application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            let mut answer = Vec::new();
            tcp.read_to_end(&mut answer).unwrap();
            let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let head = String::from_utf8_lossy(&answer[..split]);
            let status = head.lines().next().unwrap_or("").to_owned();
            (status, answer[split + 4..].to_vec())
        })
        .collect();
    child.kill().unwrap();
    child.wait().unwrap();
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    (answers, err)
}

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
        "give --voice or --speaker, not both",
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

    // `qtts serve --voices` speaks the saved voice by name, and the same recording sent with a
    // request (`ref_audio`) speaks the same samples; a server of another model refuses the voice.
    use base64::Engine as _;
    let data_url = format!(
        "data:audio/wav;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&reference).unwrap())
    );
    let body = |extra: &str| {
        format!(
            r#"{{"model":"tts-1","input":"How are you?","response_format":"pcm","stream":false,"max_new_tokens":4,"language":"english","temperature":0,"seed":1,{extra}}}"#
        )
    };
    // A WAV whose format chunk says 0 Hz (symphonia panics on it, and each one logged a
    // backtrace).
    let mut zero_rate = std::fs::read(&reference).unwrap();
    zero_rate[24..28].fill(0);
    let zero_rate = base64::engine::general_purpose::STANDARD.encode(zero_rate);
    let (answers, log) = serve(
        &model,
        v,
        home,
        &[
            // The first request prefills the prompt whole; the next ones reuse it alike.
            body(r#""voice":"anna""#),
            body(r#""voice":"anna""#),
            body(&format!(
                r#""ref_audio":"{data_url}","ref_text":"Hello there.""#
            )),
            body(&format!(
                r#""ref_audio":"{data_url}","x_vector_only_mode":true"#
            )),
            body(&format!(r#""ref_audio":"{data_url}""#)),
            body(r#""ref_audio":"https://example.com/a.wav","x_vector_only_mode":true"#),
            body(r#""ref_audio":"data:audio/wav;base64,bm90IGF1ZGlv","ref_text":"x""#),
            body(&format!(
                r#""ref_audio":"data:audio/wav;base64,{zero_rate}","ref_text":"x""#
            )),
            body(&format!(
                r#""ref_audio":"{data_url}","ref_text":"{}""#,
                "word ".repeat(1000)
            )),
        ],
    );
    assert!(
        !log.contains("panicked") && !log.contains("backtrace"),
        "{log}"
    );
    for (i, (status, pcm)) in answers[..4].iter().enumerate() {
        assert!(
            status.contains(" 200"),
            "{i}: {status} {}",
            String::from_utf8_lossy(pcm)
        );
        assert_eq!(pcm.len(), 4 * 1920 * 2, "{i}: 4 frames of s16");
    }
    assert!(
        answers[2].1 == answers[1].1,
        "ref_audio speaks as the saved voice"
    );
    assert!(
        answers[3].1 != answers[2].1,
        "x_vector_only_mode is another voice"
    );
    for ((status, body), code) in answers[4..].iter().zip([
        "missing_ref_text",
        "unsupported_ref_audio",
        "invalid_ref_audio",
        "invalid_ref_audio",
        "ref_text_too_long",
    ]) {
        let body = String::from_utf8_lossy(body);
        assert!(
            status.contains(" 400") && body.contains(code),
            "{status} {body}"
        );
    }
    fails(
        &[
            "serve",
            "--model",
            &cv,
            "--voices",
            v,
            "--http",
            "127.0.0.1:0",
            "--wyoming",
            "none",
        ],
        home,
        "saved voice",
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
        "unknown voice \"anna\"",
    );
}
