//! Voice cloning against the official implementation (`tests/fixtures/voice`, made by
//! `tools/oracle/make_voice.py`: a tiny Base checkpoint with a narrow ECAPA, the tiny Mimi encoder
//! with `sliding_window` 16, and every stage of both encoders).
//!
//! Tolerances: each stage within 1e-4 of its peak;
//! log-mel within 1e-3 where the mel is at least 1e-3; codes exact wherever the nearest-neighbour
//! margin exceeds τ·(1 + d²) with τ = 1e-4, teacher-forced level by level and free-running.

use std::collections::HashMap;

use crate::common;
use qtts::gguf::GgufFile;
use qtts::model::convert::OutType;
use qtts::voice::{CodecEncoder, SpeakerEncoder, Trace};

/// τ of the code-margin rule.
const TAU: f32 = 1e-4;

fn oracle(name: &str) -> HashMap<String, Vec<f32>> {
    oracle_in(&common::fixture("voice"), name)
}

fn oracle_in(dir: &std::path::Path, name: &str) -> HashMap<String, Vec<f32>> {
    common::oracle(&dir.join(format!("oracle/{name}.safetensors")))
}

/// Shapes of an oracle file's tensors.
fn shapes(dir: &std::path::Path, name: &str) -> HashMap<String, Vec<usize>> {
    let bytes = std::fs::read(dir.join(format!("oracle/{name}.safetensors"))).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, v.shape().to_vec()))
        .collect()
}

/// A traced stage against the oracle's tensor, which is `[C, T]` when `channel_major`, else
/// `[T, C]` like the trace: the largest error relative to the oracle's peak.
fn stage_error(ours: &[f32], width: usize, want: &[f32], channel_major: bool) -> f32 {
    assert_eq!(ours.len(), want.len(), "length");
    let rows = ours.len() / width;
    let peak = want.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    let mut err = 0.0f32;
    for t in 0..rows {
        for c in 0..width {
            let w = if channel_major {
                want[c * rows + t]
            } else {
                want[t * width + c]
            };
            err = err.max((ours[t * width + c] - w).abs());
        }
    }
    err / peak
}

fn mmproj() -> (tempfile::TempDir, GgufFile) {
    let (tmp, out) = common::convert_tiny("voice", OutType::F32);
    let f = GgufFile::open(&out.mmproj).unwrap();
    (tmp, f)
}

#[test]
fn codec_encoder_stages_and_codes_match_the_oracle() {
    let (_tmp, f) = mmproj();
    let mut enc = CodecEncoder::load(&f)
        .unwrap()
        .expect("the Base mmproj carries the encoder");
    let dir = common::fixture("voice");
    for case in [
        "codec_encoder_aligned",
        "codec_encoder_ragged",
        "codec_encoder_long",
    ] {
        check_codec(&mut enc, &dir, case, 1e-4, TAU);
    }
}

/// One codec-encoder oracle file: every stage within `tol` of its peak on 1 and 2 threads, the
/// free-running codes exact on frames whose margins all exceed `tau`·(1 + d²), the
/// teacher-forced codes likewise level by level.
fn check_codec(enc: &mut CodecEncoder, dir: &std::path::Path, case: &str, tol: f32, tau: f32) {
    let o = oracle_in(dir, case);
    let sh = shapes(dir, case);
    {
        for threads in [1, 2] {
            let mut trace = Trace::new();
            let codes = enc.encode(&o["input_values"], threads, Some(&mut trace));
            let mut checked = 0;
            for (name, v, width) in &trace {
                let want = o
                    .get(name)
                    .unwrap_or_else(|| panic!("{case}: oracle has no {name}"));
                let cm = name.starts_with("seanet.") || name == "downsample";
                let err = stage_error(v, *width, want, cm);
                assert!(
                    err <= tol,
                    "{case} threads {threads} {name}: {err:e} of peak"
                );
                if threads == 2 {
                    eprintln!("{case} {name}: {err:.2e} of peak");
                }
                checked += 1;
            }
            let expect_stages = sh.keys().filter(|k| {
                k.starts_with("seanet.")
                    || k.starts_with("tfm.")
                    || k.starts_with("residual_ac.")
                    || ["downsample", "proj_sem", "proj_ac"].contains(&k.as_str())
            });
            assert_eq!(
                checked,
                expect_stages.count(),
                "{case}: every oracle stage traced"
            );

            // Free-running codes: exact on every frame whose 16 margins all exceed τ.
            let (want, best, second) = (&o["codes"], &o["d2_best"], &o["d2_second"]);
            let frames = sh["codes"][0];
            assert_eq!(codes.len(), frames, "{case}: ceil(N / 1920) frames");
            let mut exact = 0;
            for t in 0..frames {
                let clear = (0..16).all(|k| {
                    let i = t * 16 + k;
                    second[i] - best[i] > tau * (1.0 + best[i])
                });
                let same = (0..16).all(|k| codes[t][k] as f32 == want[t * 16 + k]);
                if clear {
                    assert!(
                        same,
                        "{case}: frame {t}: {:?} vs {:?}",
                        codes[t],
                        &want[t * 16..t * 16 + 16]
                    );
                }
                exact += same as usize;
            }
            eprintln!("{case} threads {threads}: {exact}/{frames} frames exact");
        }

        // Teacher-forced: each level from the oracle's own input.
        let d = sh["proj_sem"][1];
        let (mut under, mut agree, mut total) = (0, 0, 0);
        for level in 0..16 {
            let input = if level == 0 {
                &o["proj_sem"]
            } else {
                &o[&format!("residual_ac.{}", level - 1)]
            };
            let got = enc.nearest_codes(level, input, 1);
            for (t, &c) in got.iter().enumerate() {
                let i = t * 16 + level;
                let (b, s) = (o["d2_best"][i], o["d2_second"][i]);
                if s - b > tau * (1.0 + b) {
                    assert_eq!(c as f32, o["codes"][i], "{case}: level {level} frame {t}");
                } else {
                    under += 1;
                }
                agree += (c as f32 == o["codes"][i]) as usize;
                total += 1;
            }
            assert_eq!(got.len() * d, input.len());
        }
        eprintln!(
            "{case}: teacher-forced codes {agree}/{total} equal, {under} under the margin τ = {tau:e}"
        );
    }
}

#[test]
fn speaker_encoder_stages_match_the_oracle() {
    let (_tmp, f) = mmproj();
    let enc = SpeakerEncoder::load(&f)
        .unwrap()
        .expect("a Base mmproj has the speaker encoder");
    check_speaker(&enc, &oracle("speaker_encoder"), 1e-4);
}

/// The speaker-encoder oracle: the mel basis, every stage within `tol` of its peak, the log-mel
/// by the non-floor rule, the x-vector's cosine.
fn check_speaker(enc: &SpeakerEncoder, o: &HashMap<String, Vec<f32>>, tol: f32) {
    assert_eq!(enc.dim(), o["xvector"].len());
    let basis = qtts::voice::mel::MelFrontEnd::new();
    let eb = common::max_abs(basis.basis(), &o["mel_basis"]);
    assert!(eb < 1e-7, "mel basis {eb:e}");
    for threads in [1, 2] {
        let mut trace = Trace::new();
        let xv = enc.embed(&o["wav_24k"], threads, Some(&mut trace));
        for (name, v, width) in &trace {
            let want = &o[name];
            if name == "log_mel" {
                // Absolute, where the mel is clear of the 1e-5 floor (ln 1e-3 ≈ −6.9).
                let mut err = 0.0f32;
                for (a, b) in v.iter().zip(want) {
                    let tol = if *b >= (1e-3f32).ln() { 1e-3 } else { 2e-2 };
                    assert!((a - b).abs() <= tol, "log_mel {a} vs {b}");
                    err = err.max((a - b).abs());
                }
                eprintln!("speaker log_mel: {err:.2e} absolute");
                continue;
            }
            let channel_major = name.starts_with("spk.blocks.") && !name.ends_with("se_gate")
                || name == "spk.mfa"
                || name == "spk.asp.attn_logits";
            let err = stage_error(v, *width, want, channel_major);
            if threads == 2 {
                eprintln!("speaker {name}: {err:.2e} of peak");
            }
            assert!(err <= tol, "threads {threads} {name}: {err:e} of peak");
        }
        assert_eq!(trace.len(), 24, "every stage traced");
        let cos = {
            let w = &o["xvector"];
            let dot: f32 = xv.iter().zip(w).map(|(a, b)| a * b).sum();
            let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            dot / (n(&xv) * n(w))
        };
        assert!(cos >= 0.99999, "x-vector cosine {cos}");
    }
}

/// The real geometry (0.6B Base: full ECAPA, the released Mimi encoder) against
/// `tools/oracle/make_voice.py --full DIR` (bf16 weights computed in f32; 2.4 GB, not committed):
/// every stage within 5e-4 of its peak, codes exact where the margin exceeds τ = 1e-6·(1 + d²)
/// (random 256-wide codebooks put d² near 1e3, so the tiny fixture's τ would excuse too much).
/// Skipped, and said so, without `QTTS_VOICE_FULL=DIR`.
#[test]
fn full_size_encoders_match_the_oracle() {
    let Some(dir) = std::env::var_os("QTTS_VOICE_FULL").map(std::path::PathBuf::from) else {
        eprintln!(
            "full-size voice oracle: skipped (set QTTS_VOICE_FULL to the output directory of \
             tools/oracle/make_voice.py --full)"
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = qtts::model::convert::convert(
        &dir.join("model"),
        Some(&common::tokenizer_dir()),
        &tmp.path().join("out"),
        OutType::F32,
        &mut |_, _| {},
    )
    .unwrap();
    let f = GgufFile::open(&out.mmproj).unwrap();
    let spk = SpeakerEncoder::load(&f).unwrap().unwrap();
    check_speaker(&spk, &oracle_in(&dir, "speaker_encoder"), 5e-4);
    let mut enc = CodecEncoder::load(&f).unwrap().unwrap();
    check_codec(&mut enc, &dir, "codec_encoder_long", 5e-4, 1e-6);
}

/// The ICL prompt (both text modes, both streaming branches) and the x-vector-only prompt built
/// from the oracle's reference codes and x-vector: prefill and step inputs within 1e-5, raw
/// talker logits within 1e-4, greedy codes exact; then the decoder primed with the reference
/// gives the official output after its cut.
#[test]
fn cloned_generation_reproduces_the_oracle() {
    use qtts::code_predictor::CodePredictor;
    use qtts::decoder::Decoder;
    use qtts::ffi::Threadpool;
    use qtts::sampling::SamplingParams;
    use qtts::synth::{generate_codes, Flow};
    use qtts::talker::{GenOptions, IclReference, Session, Talker, TextInput, TextMode, Voice};

    let (_tmp, out) = common::convert_tiny("voice", OutType::F32);
    let talker = Talker::load(&out.talker).unwrap();
    let mm = GgufFile::open(&out.mmproj).unwrap();
    let mut cp = CodePredictor::load(&mm).unwrap();
    let mut dec = Decoder::load(&mm).unwrap();
    let pool = Threadpool::new(1, &[]).unwrap();
    let h = talker.n_embd();
    let greedy = |frames| GenOptions {
        sampling: SamplingParams::GREEDY,
        repetition_penalty: 1.05,
        seed: 0,
        max_frames: Some(frames),
        min_frames: qtts::talker::MIN_FRAMES,
    };
    for (case, mode, icl) in [
        ("icl_stream", TextMode::Streaming, true),
        ("icl_stream_longtext", TextMode::Streaming, true),
        ("icl_nonstream", TextMode::NonStreaming, true),
        ("xvec_stream", TextMode::Streaming, false),
        ("xvec_nonstream", TextMode::NonStreaming, false),
    ] {
        let o = oracle(case);
        let ids: Vec<u32> = o["input_ids"].iter().map(|&x| x as u32).collect();
        let mut voice = Voice {
            language: Some("english".into()),
            xvector: Some(o["xvector"].clone()),
            ..Voice::default()
        };
        let ref_codes = if icl {
            common::frames16(&o["ref_code"])
        } else {
            Vec::new()
        };
        if icl {
            let ref_ids: Vec<u32> = o["ref_ids"].iter().map(|&x| x as u32).collect();
            let mut embedded = vec![0.0; ref_codes.len() * h];
            for (f, row) in ref_codes.iter().zip(embedded.chunks_exact_mut(h)) {
                cp.embed_frame(f, row).unwrap();
            }
            voice.reference = Some(std::sync::Arc::new(IclReference {
                text: TextInput::TokenIds(ref_ids),
                codes: ref_codes.clone(),
                embedded,
            }));
        }
        let prompt = talker
            .prompt(&TextInput::TokenIds(ids), &voice, mode)
            .unwrap();
        let ep = common::max_abs(&prompt.rows, &o["prefill_embeds"]);
        let codes = &o["codes"];
        let frames = codes.len() / 16;

        let mut session = Session::new(&talker, 256, 1, None, true).unwrap();
        let common::Stepped {
            logits,
            steps,
            codes: ours,
        } = common::step_greedy(
            &mut session,
            &mut cp,
            &pool,
            &prompt,
            &greedy(frames + 1),
            frames,
            case,
        );
        let n_steps = o["step_embeds"].len();
        let es = common::max_abs(&steps[..n_steps], &o["step_embeds"]);
        let el = common::max_abs(&logits, &o["talker_logits_raw"]);
        eprintln!("{case}: prefill {ep:.2e}, steps {es:.2e}, talker logits {el:.2e}");
        assert!(ep < 1e-5 && es < 1e-5 && el < 1e-4, "{case}");
        assert_eq!(&ours, codes, "{case}: codes");

        // The whole loop.
        let mut got = Vec::new();
        generate_codes(
            &mut session,
            &mut cp,
            &pool,
            &prompt,
            &greedy(frames),
            &SamplingParams::GREEDY,
            &mut |c| {
                got.extend(c.iter().map(|&c| c as f32));
                Flow::Continue
            },
        )
        .unwrap();
        assert_eq!(&got, codes, "{case}: generate_codes");

        // The waveform: the decoder primed with the reference, then the generated frames.
        dec.reset().unwrap();
        dec.prime(&pool, &ref_codes).unwrap();
        let gen = common::frames16(codes);
        let mut wav = vec![0.0; gen.len() * 1920];
        dec.decode_frames(&pool, &gen, &mut wav).unwrap();
        let ew = common::max_abs(&wav, &o["wav"]);
        eprintln!("{case}: waveform {ew:.2e}");
        assert!(ew < 1e-4, "{case}: waveform {ew:e}");
        if icl {
            assert_eq!(
                o["cut"][0] as usize,
                ref_codes.len() * 1920,
                "{case}: the cut is whole frames"
            );
        }
    }
}

/// A decoder primed with 70 reference frames, directly or from a snapshot of that state, decodes
/// the next 12 as the tail of the official one-shot decode of all 82.
#[test]
fn a_primed_decoder_continues_the_one_shot_decode() {
    use qtts::decoder::Decoder;
    use qtts::ffi::Threadpool;
    let (_tmp, f) = mmproj();
    let o = oracle("decoder_primed");
    let (r, g) = (
        common::frames16(&o["ref_codes"]),
        common::frames16(&o["gen_codes"]),
    );
    let want = &o["wav_full"][r.len() * 1920..];
    let pool = Threadpool::new(1, &[]).unwrap();
    let mut dec = Decoder::load(&f).unwrap();
    dec.prime(&pool, &r).unwrap();
    let snapshot = dec.state().unwrap();
    assert_eq!(snapshot.frames(), r.len());
    let mut wav = vec![0.0; g.len() * 1920];
    dec.decode_frames(&pool, &g, &mut wav).unwrap();
    let e = common::max_abs(&wav, want);
    eprintln!("primed decode: {e:.2e}");
    assert!(e < 1e-4, "primed: {e:e}");
    // Another stream, then the snapshot: the same samples.
    dec.reset().unwrap();
    dec.decode_frames(&pool, &g, &mut wav).unwrap();
    assert!(
        common::max_abs(&wav, want) > 1e-3,
        "a cold decoder differs (the test can fail)"
    );
    dec.restore(&snapshot).unwrap();
    let mut again = vec![0.0; g.len() * 1920];
    dec.decode_frames(&pool, &g, &mut again).unwrap();
    assert!(common::max_abs(&again, want) < 1e-4);
    // Priming runs only the last `prime_frames` reference frames through the conv stack: that
    // gives the samples of a prime through the whole stack up to round-off, and one frame fewer
    // does not (so the count is the least that is exact, and the test can fail).
    let tail = dec.geometry().prime_frames();
    assert!(
        tail < r.len(),
        "the reference is longer than the primed tail"
    );
    let mut whole = vec![0.0; g.len() * 1920];
    dec.reset().unwrap();
    dec.prime_with_tail(&pool, &r, r.len()).unwrap();
    dec.decode_frames(&pool, &g, &mut whole).unwrap();
    for (t, exact) in [(tail, true), (tail - 1, false)] {
        dec.reset().unwrap();
        dec.prime_with_tail(&pool, &r, t).unwrap();
        dec.decode_frames(&pool, &g, &mut again).unwrap();
        let e = common::max_abs(&again, &whole);
        eprintln!("primed through the last {t} frames: {e:.2e} from the whole prime");
        assert_eq!(e < 1e-6, exact, "tail {t}: {e:e}");
    }
}

/// The non-official trailing layout is the official streaming one for a transcript padded with
/// `tts_pad` tokens to the reference's codec rows (so the target text trails them all): its rows
/// depend on the voice alone, and a session reuses all of them but the last for another text.
#[test]
fn the_trailing_layout_is_the_official_one_with_a_padded_transcript() {
    use qtts::code_predictor::CodePredictor;
    use qtts::talker::{GenOptions, IclReference, Session, Talker, TextInput, TextMode, Voice};
    use std::sync::Arc;

    let (_tmp, out) = common::convert_tiny("voice", OutType::F32);
    let talker = Talker::load(&out.talker).unwrap();
    let mm = GgufFile::open(&out.mmproj).unwrap();
    let mut cp = CodePredictor::load(&mm).unwrap();
    let h = talker.n_embd();
    let o = oracle("icl_stream");
    let ids: Vec<u32> = o["input_ids"].iter().map(|&x| x as u32).collect();
    let ref_ids: Vec<u32> = o["ref_ids"].iter().map(|&x| x as u32).collect();
    let codes = common::frames16(&o["ref_code"]);
    let mut embedded = vec![0.0; codes.len() * h];
    for (f, row) in codes.iter().zip(embedded.chunks_exact_mut(h)) {
        cp.embed_frame(f, row).unwrap();
    }
    let voice = |transcript: Vec<u32>| Voice {
        language: Some("english".into()),
        xvector: Some(o["xvector"].clone()),
        reference: Some(Arc::new(IclReference {
            text: TextInput::TokenIds(transcript),
            codes: codes.clone(),
            embedded: embedded.clone(),
        })),
        ..Voice::default()
    };
    // The wrapped transcript (`<|im_start|>assistant\n{R}<|im_end|>\n`) padded up to the codec
    // track's `1 + frames` rows.
    let (lr, lc) = (ref_ids.len() - 5, codes.len() + 1);
    assert!(
        lr < lc,
        "the fixture's transcript is shorter than its codes"
    );
    let mut padded = ref_ids.clone();
    let pad = talker.config().tts_pad_token_id;
    padded.splice(ref_ids.len() - 2..ref_ids.len() - 2, vec![pad; lc - lr]);

    let text = TextInput::TokenIds(ids);
    let trailing = talker
        .prompt(&text, &voice(ref_ids.clone()), TextMode::Trailing)
        .unwrap();
    let official = talker
        .prompt(&text, &voice(padded), TextMode::Streaming)
        .unwrap();
    assert_eq!(trailing, official);
    // The official layout overlays the text on the reference: fewer rows, no trailing text.
    let overlaid = talker
        .prompt(&text, &voice(ref_ids.clone()), TextMode::Streaming)
        .unwrap();
    assert!(
        overlaid.trailing.is_empty() && trailing.trailing.len() / h == o["input_ids"].len() - 7
    );

    // Another text: the same rows, so all but the last are reused.
    let other = talker
        .prompt(
            &TextInput::Text("Something else entirely.".into()),
            &voice(ref_ids),
            TextMode::Trailing,
        )
        .unwrap();
    assert_eq!(other.rows, trailing.rows);
    assert_ne!(other.trailing, trailing.trailing);
    let opts = GenOptions::from_config(talker.generation_config(), 3);
    let mut session = Session::new(&talker, 512, 1, None, false).unwrap();
    session.start(&trailing, &opts).unwrap();
    session.feed(&vec![0.01; h]).unwrap();
    session.start(&other, &opts).unwrap();
    assert_eq!(session.reused_rows(), other.len() - 1);
}
