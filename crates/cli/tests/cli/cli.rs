//! The `qtts` binary: `synth` against the oracle through the whole pipeline, standard input,
//! `speak` through cpal on ALSA's `null` device, and the messages users get.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::max_abs;
use qtts::model::convert::OutType;

/// Runs the command with `home` as its home and cache, and no voice store of the user's.
pub(crate) fn qtts(args: &[&str], home: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_qtts"))
        .args(args)
        .env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env_remove("QTTS_VOICES")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The samples of a WAV file as f32: float files as they are, 16-bit PCM scaled by 1/32768.
pub(crate) fn read_wav(p: &Path) -> Vec<f32> {
    let mut r = hound::WavReader::open(p).unwrap();
    match r.spec().sample_format {
        hound::SampleFormat::Float => r.samples::<f32>().map(Result::unwrap).collect(),
        hound::SampleFormat::Int => r
            .samples::<i16>()
            .map(|s| f32::from(s.unwrap()) / 32768.0)
            .collect(),
    }
}

#[test]
fn synth_token_ids_reproduces_the_oracle() {
    synth_reproduces_the_oracle(None);
}

/// `--exact` synthesis under every kernel tier this CPU runs (`--kernels`), the others reported
/// as skipped by name: the oracle's codes exactly and its waveforms within 1e-4 (the exact path
/// runs the tier's heads, SnakeBeta and attention kernels with ggml's f32 products).
#[test]
fn exact_synthesis_reproduces_the_oracle_under_every_kernel_tier() {
    qtts::kernels::for_each_tier(|tier| synth_reproduces_the_oracle(Some(tier)));
}

fn synth_reproduces_the_oracle(tier: Option<qtts::kernels::Tier>) {
    for name in ["tiny", "tiny17"] {
        let (tmp, out) = common::convert_tiny(name, OutType::F32);
        let dir = out.talker.parent().unwrap().to_str().unwrap().to_owned();
        for (run, mode) in [
            ("generate_stream", "streaming"),
            ("generate_nonstream", "non-streaming"),
        ] {
            let o =
                common::oracle(&common::fixture(name).join(format!("oracle/{run}.safetensors")));
            let ids: Vec<String> = o["input_ids"]
                .iter()
                .map(|&x| (x as u32).to_string())
                .collect();
            let frames = (o["codes"].len() / 16).to_string();
            let wav = tmp.path().join(format!("{run}.wav"));
            let codes = tmp.path().join(format!("{run}.json"));
            let ids = ids.join(",");
            // The non-streaming run also puts the code predictor on every core (exact too).
            let mut args = vec![
                "synth",
                "--sample-format",
                "f32",
                "--model",
                &dir,
                "--token-ids",
                &ids,
                "--speaker",
                "vivian",
                "--language",
                "english",
                "--text-mode",
                mode,
                "--greedy",
                "--exact",
                "--max-frames",
                &frames,
                "--out",
                wav.to_str().unwrap(),
                "--codes-out",
                codes.to_str().unwrap(),
            ];
            if mode == "non-streaming" {
                args.extend(["--cores", "2", "--code-predictor-on-every-core"]);
            }
            if let Some(t) = tier {
                args.extend(["--kernels", t.name()]);
            }
            let r = qtts(&args, tmp.path());
            assert!(r.status.success(), "{name} {run} {tier:?}: {}", stderr(&r));
            let got: Vec<Vec<u32>> =
                serde_json::from_str(&std::fs::read_to_string(&codes).unwrap()).unwrap();
            let got: Vec<f32> = got.iter().flatten().map(|&c| c as f32).collect();
            assert_eq!(got, o["codes"], "{name} {run} {tier:?}");
            let e = max_abs(&read_wav(&wav), &o["wav"]);
            assert!(e < 1e-4, "{name} {run} {tier:?}: wav off by {e}");
        }
    }
}

/// A run longer than `--request-frames` is a soak: requests spoken one after another, each
/// minute's stage percentiles and the resident set at the start and the end reported (here on
/// the tiny model, with "minutes" of 4 frames).
#[test]
fn a_long_bench_run_is_a_soak_reported_minute_by_minute() {
    let (tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let models = out.talker.parent().unwrap().to_str().unwrap().to_owned();
    let json = tmp.path().join("soak.json");
    let r = qtts(
        &[
            "bench",
            "--models",
            &models,
            "--types",
            "f32",
            "--decoder",
            "f32",
            "--frames",
            "12",
            "--request-frames",
            "4",
            "--runs",
            "1",
            "--prebuffer-ms",
            "100",
            "--json",
            json.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(r.status.success(), "{}", stderr(&r));
    let table = String::from_utf8_lossy(&r.stdout);
    assert!(
        table.contains("3 minutes, RSS") && table.contains("first minute"),
        "{table}"
    );
    assert!(table.contains("then after each minute"), "{table}");
    let all: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let run = &all[0]["runs"][0];
    assert_eq!(run["frames"], 12);
    assert_eq!(run["minutes"].as_array().unwrap().len(), 3);
    assert!(run["rss_start_mib"].as_f64().unwrap() > 1.0, "{run}");
    assert!(run["rss_end_mib"].as_f64().unwrap() > 1.0, "{run}");
    for minute in run["minutes"].as_array().unwrap() {
        assert!(minute["rss_mib"].as_f64().unwrap() > 1.0, "{minute}");
        let names: Vec<&str> = minute["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"decoder frame"), "{names:?}");
    }
}

/// A misspelt `QTTS_KERNELS`, or a tier this CPU lacks, is refused before anything loads, with
/// the tiers that do run here; never a silent fallback.
#[test]
fn kernel_tiers_the_cpu_lacks_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let wav = tmp.path().join("x.wav");
    let args = ["synth", "Hello.", "--out", wav.to_str().unwrap()];
    let r = Command::new(env!("CARGO_BIN_EXE_qtts"))
        .args(args)
        .env("HOME", tmp.path())
        .env("QTTS_KERNELS", "avx9")
        .output()
        .unwrap();
    assert!(!r.status.success());
    assert!(
        stderr(&r).contains("unknown kernel tier \"avx9\""),
        "{}",
        stderr(&r)
    );
    let missing = qtts::kernels::Tier::ALL
        .into_iter()
        .find(|t| !t.available())
        .expect("no CPU runs both x86 and aarch64 tiers");
    let mut with = vec!["--kernels", missing.name()];
    with.extend(args);
    let r = qtts(&with, tmp.path());
    assert!(!r.status.success());
    let err = stderr(&r);
    assert!(
        err.contains(&format!("kernel tier {missing} needs")),
        "{err}"
    );
    assert!(err.contains("available here: scalar"), "{err}");
    assert!(!wav.exists());
}

/// 50,000 characters of mixed scripts through `synth` as one request: split into utterances of at
/// most 150 tokens, never cut, every one spoken in order (`--report`), and the frames reported
/// are the frames written.
#[test]
fn fifty_thousand_characters_of_mixed_scripts_are_spoken_whole_and_in_order() {
    let pieces = [
        "The quick brown fox jumps over the lazy dog. ",
        "Voix ambiguë d'un cœur qui, au zéphyr, préfère les jattes de kiwis; ",
        "Съешь же ещё этих мягких французских булок, да выпей чаю! ",
        "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. ",
        "我能吞下玻璃而不伤身体，天地玄黄宇宙洪荒日月盈昃辰宿列张。",
        "いろはにほへとちりぬるをわかよたれそつねならむ",
        "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق. ",
        "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम। ",
        "12,345.67 — 89% 🙂🚀 ",
        "\n",
    ];
    let mut text = String::new();
    for p in pieces.iter().cycle() {
        if text.chars().count() >= 50_000 {
            break;
        }
        text.push_str(p);
    }
    let text: String = text.chars().take(50_000).collect();
    let tmp = tempfile::tempdir().unwrap();
    let (wav, report) = (tmp.path().join("long.wav"), tmp.path().join("long.json"));
    let r = qtts(
        &[
            "synth",
            &text,
            "--max-frames",
            "1",
            "--out",
            wav.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(r.status.success(), "{}", stderr(&r));
    let rep: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let utts = rep["utterances"].as_array().unwrap();
    assert!(utts.len() > 300, "{} utterances", utts.len());
    // Every character, in order, exactly once: only the whitespace at the cuts goes.
    let spoken: String = utts
        .iter()
        .map(|u| u["text"].as_str().unwrap())
        .collect::<String>()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let want: String = qtts::text::split::normalize(&text)
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    assert!(spoken == want, "the utterances are not the text, in order");
    for u in utts {
        assert!(u["tokens"].as_u64().unwrap() <= 150, "{u}");
        assert_eq!(u["frames"], 1, "{u}");
    }
    let frames = rep["frames"].as_u64().unwrap() as usize;
    assert_eq!(frames, utts.len());
    assert_eq!(read_wav(&wav).len(), frames * 1920);
    let err = stderr(&r);
    assert!(err.contains(&format!("{} utterances", utts.len())), "{err}");
    assert!(err.contains(&format!("{frames} frames")), "{err}");
}

#[test]
fn synth_reads_standard_input_line_by_line() {
    let tmp = tempfile::tempdir().unwrap();
    let wav = tmp.path().join("lines.wav");
    let mut child = Command::new(env!("CARGO_BIN_EXE_qtts"))
        .args([
            "synth",
            "-",
            "--max-frames",
            "3",
            "--sample-format",
            "s16",
            "--out",
        ])
        .arg(&wav)
        .env("HOME", tmp.path())
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"first line\n\nsecond line\nthird\n")
            .unwrap();
    }
    let r = child.wait_with_output().unwrap();
    let err = stderr(&r);
    assert!(r.status.success(), "{err}");
    assert!(
        err.contains("built-in"),
        "the built-in model is announced: {err}"
    );
    let reader = hound::WavReader::open(&wav).unwrap();
    assert_eq!(reader.spec().bits_per_sample, 16);
    assert_eq!(reader.spec().sample_rate, 24_000);
    assert_eq!(
        reader.len() as usize,
        3 * 3 * 1920,
        "three lines of 3 frames"
    );
}

/// `synth -`: standard input cut into sentences as it is read (a line's end ends one too), each
/// fed to the engine as it is written, here a few bytes at a time with pauses (mid-word,
/// mid-character), gives the very samples of the same sentences read whole, one a line
/// (`--lines`); `--live`, the old name of the default, still does the same.
#[test]
fn standard_input_speaks_each_sentence_as_read_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], input: &[u8]| {
        let wav = tmp.path().join("stdin.wav");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_qtts"));
        cmd.args([
            "synth",
            "-",
            "--greedy",
            "--max-frames",
            "6",
            "--sample-format",
            "f32",
        ])
        .args(extra)
        .arg("--out")
        .arg(&wav)
        .env("HOME", tmp.path())
        .env("XDG_CACHE_HOME", tmp.path().join("cache"))
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            for piece in input.chunks(3) {
                stdin.write_all(piece).unwrap();
                stdin.flush().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let r = child.wait_with_output().unwrap();
        assert!(r.status.success(), "{}", stderr(&r));
        (read_wav(&wav), stderr(&r))
    };
    let (whole, _) = run(
        &["--lines"],
        "Hello there, general.\nCafé, déjà vu!\nthird\n".as_bytes(),
    );
    assert_eq!(whole.len(), 3 * 6 * 1920, "three lines of 6 frames");
    let streamed = "Hello there, general. Café, déjà vu!\n\nthird\n".as_bytes();
    let (live, err) = run(&[], streamed);
    assert!(
        live == whole,
        "sentences differ from the same sentences read whole: {err}"
    );
    let (old, err) = run(&["--live"], streamed);
    assert!(old == whole, "--live differs: {err}");
}

#[cfg(feature = "playback")]
#[test]
fn speak_plays_through_alsa_null_device() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join(".asoundrc"), "pcm.!default { type null }\n").unwrap();
    let r = qtts(
        &["speak", "Hello there.", "--max-frames", "10", "--stats"],
        tmp.path(),
    );
    let err = stderr(&r);
    assert!(r.status.success(), "{err}");
    assert!(err.contains("playing on"), "{err}");
    assert!(err.contains("10 frames"), "{err}");
    assert!(err.contains("decoder frame"), "stats table: {err}");
    assert!(!err.contains("ALSA lib"), "{err}");
}

/// A build without playback says so, and what to do instead.
#[cfg(not(feature = "playback"))]
#[test]
fn speak_without_playback_says_to_write_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let r = qtts(&["speak", "Hello."], tmp.path());
    let err = stderr(&r);
    assert!(!r.status.success());
    assert!(err.contains("built without playback"), "{err}");
    assert!(err.contains("--out file.wav"), "{err}");
}

#[cfg(feature = "playback")]
#[test]
fn no_sound_card_gets_a_clear_message() {
    let cards = std::fs::read_to_string("/proc/asound/cards").unwrap_or_default();
    if !cards.contains("no soundcards") && !cards.is_empty() {
        eprintln!("this machine has a sound card: the no-device message cannot be provoked");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let r = qtts(&["speak", "Hello."], tmp.path());
    let err = stderr(&r);
    assert!(!r.status.success());
    assert!(err.contains("no audio output device"), "{err}");
    assert!(err.contains("--out file.wav"), "{err}");
    assert!(!err.contains("ALSA lib"), "ALSA's own dump leaked: {err}");
    // And the suggestion works.
    let wav = tmp.path().join("x.wav");
    let r = qtts(
        &[
            "speak",
            "Hello.",
            "--max-frames",
            "2",
            "--out",
            wav.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(read_wav(&wav).len(), 2 * 1920);
    // By default the file is plain 16-bit PCM (format tag 1, a 16-byte fmt chunk): what every
    // reader opens, Python's `wave` included (it refuses float and WAVE_FORMAT_EXTENSIBLE).
    let bytes = std::fs::read(&wav).unwrap();
    let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
    assert_eq!(&bytes[12..16], b"fmt ");
    assert_eq!(u32::from_le_bytes(bytes[16..20].try_into().unwrap()), 16);
    assert_eq!((u16_at(20), u16_at(22), u16_at(34)), (1, 1, 16));
    // ffmpeg (Debian's; `.ci/run` installs it) reads the same samples.
    match std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(&wav)
        .args(["-f", "s16le", "-"])
        .output()
    {
        Ok(o) => {
            assert!(o.status.success() && o.stderr.is_empty(), "{}", stderr(&o));
            assert_eq!(o.stdout, bytes[44..], "ffmpeg reads the WAV's samples");
        }
        Err(e) => eprintln!("skipped: ffmpeg's reading of the WAV (ffmpeg: {e})"),
    }
}

#[test]
fn bad_requests_are_explained() {
    let tmp = tempfile::tempdir().unwrap();
    let wav = tmp.path().join("x.wav");
    let w = wav.to_str().unwrap();
    let r = qtts(
        &["synth", "hi", "--speaker", "nobody", "--out", w],
        tmp.path(),
    );
    assert!(!r.status.success());
    let err = stderr(&r);
    assert!(
        err.contains("unknown speaker 'nobody'") && err.contains("vivian"),
        "{err}"
    );
    let r = qtts(
        &["synth", "hi", "--language", "klingon", "--out", w],
        tmp.path(),
    );
    assert!(
        stderr(&r).contains("unknown language 'klingon'"),
        "{}",
        stderr(&r)
    );
    let r = qtts(
        &["synth", "hi", "--model", "/nonexistent", "--out", w],
        tmp.path(),
    );
    assert!(
        stderr(&r).contains("nothing at that path"),
        "{}",
        stderr(&r)
    );
    let r = qtts(&["synth", "--token-ids", "1,x", "--out", w], tmp.path());
    assert!(
        stderr(&r).contains("'x' is not a token id"),
        "{}",
        stderr(&r)
    );
    let r = qtts(&["synth", "   ", "--out", w], tmp.path());
    assert!(stderr(&r).contains("nothing to speak"), "{}", stderr(&r));
}

#[test]
fn bench_skips_a_decoder_type_the_tier_has_no_kernel_for_by_name() {
    let (tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let models = out.talker.parent().unwrap().to_str().unwrap().to_owned();
    let bench = |decoders: &str| {
        qtts(
            &[
                "bench",
                "--models",
                &models,
                "--types",
                "f32",
                "--decoder",
                decoders,
                "--tiers",
                "scalar",
                "--frames",
                "2",
                "--runs",
                "1",
                "--prebuffer-ms",
                "100",
            ],
            tmp.path(),
        )
    };
    // The scalar tier has no bf16 kernel: bf16 is named as skipped, f32 is measured.
    let r = bench("f32,bf16");
    assert!(r.status.success(), "{}", stderr(&r));
    let table = String::from_utf8_lossy(&r.stdout);
    assert!(
        table.contains("skipped: decoder bf16 on kernel tier scalar"),
        "{table}"
    );
    assert!(
        table.lines().any(|l| l.starts_with("f32 (dec f32")),
        "{table}"
    );
    assert!(
        !table.lines().any(|l| l.starts_with("f32 (dec bf16")),
        "{table}"
    );
    // Nothing left to measure is an error that says why.
    let r = bench("bf16");
    assert!(!r.status.success());
    assert!(
        stderr(&r).contains("skipped: decoder bf16") && stderr(&r).contains("nothing to measure"),
        "{}",
        stderr(&r)
    );
}

#[test]
fn bench_prints_one_table_of_medians_and_the_runs_as_json() {
    let (tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let models = out.talker.parent().unwrap().to_str().unwrap().to_owned();
    let json = tmp.path().join("runs.json");
    let r = qtts(
        &[
            "bench",
            "--models",
            &models,
            "--types",
            "f32",
            "--decoder",
            "f32",
            "--plan",
            "default,code-predictor-shared",
            "--tiers",
            &format!("{},scalar", qtts::kernels::active()),
            "--frames",
            "6",
            "--runs",
            "2",
            "--prebuffer-ms",
            "100",
            "--json",
            json.to_str().unwrap(),
        ],
        tmp.path(),
    );
    assert!(r.status.success(), "{}", stderr(&r));
    let table = String::from_utf8_lossy(&r.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("f32 (dec f32)"))
        .unwrap_or_else(|| panic!("no f32 row in\n{table}"));
    assert_eq!(
        row.split_whitespace().nth(3),
        Some("2"),
        "runs column: {row}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("f32 (dec f32, code-predictor-shared)")),
        "no code-predictor-shared row in\n{table}"
    );
    assert!(
        !table.contains("reference"),
        "no reference without --python: {table}"
    );
    // Each configuration under each tier, in its own child process: a tier other than the
    // process's (`QTTS_KERNELS`, else the CPU's best) is named.
    let best = qtts::kernels::active();
    if best != qtts::kernels::Tier::Scalar {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("f32 (dec f32, tier scalar)")),
            "no scalar-tier row in\n{table}"
        );
    }
    let all: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n_tiers = if best == qtts::kernels::Tier::Scalar {
        1
    } else {
        2
    };
    assert_eq!(all.as_array().unwrap().len(), 2 * n_tiers);
    assert_eq!(all[0]["plan"], "default");
    assert_eq!(all[n_tiers]["plan"], "code-predictor-shared");
    assert_eq!(all[0]["tier"], best.name());
    for c in all.as_array().unwrap() {
        for run in c["runs"].as_array().unwrap() {
            assert_eq!(run["tier"], c["tier"], "the child ran the tier asked");
        }
    }
    let runs = all[0]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        // The frame count is forced, 6 frames are 0.48 s, and the paced device played them all.
        assert_eq!(run["frames"], 6);
        assert!((run["audio_s"].as_f64().unwrap() - 0.48).abs() < 1e-9);
        let (underruns, periods) = (
            run["underruns"].as_u64().unwrap(),
            run["periods"].as_u64().unwrap(),
        );
        assert!(periods >= 24 && underruns <= periods, "{run}");
        assert!(run["rtf"].as_f64().unwrap() > 0.0 && run["ttfa_ms"].as_f64().unwrap() > 0.0);
        assert!(run["peak_rss_mib"].as_f64().unwrap() > 1.0);
        let stages: Vec<&str> = run["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        for want in [
            "talker step",
            "code predictor frame",
            "decoder frame",
            "talker prefill",
        ] {
            assert!(stages.contains(&want), "{want} missing from {stages:?}");
        }
    }
    // A directory without the weights, and a tokenizer directory without the files to make them
    // with: a clear error, before any weight is written.
    let no_tokenizer = tmp.path().join("no-tokenizer");
    std::fs::create_dir_all(&no_tokenizer).unwrap();
    let r = qtts(
        &[
            "bench",
            "--models",
            tmp.path().join("empty").to_str().unwrap(),
            "--tokenizer",
            no_tokenizer.to_str().unwrap(),
            "--types",
            "q8_0",
        ],
        tmp.path(),
    );
    assert!(!r.status.success());
    assert!(
        stderr(&r).contains("tokenizer file missing"),
        "{}",
        stderr(&r)
    );
}
