//! Voice cloning against the official implementation (`tests/fixtures/voice`, made by
//! `tools/oracle/make_voice.py`: a tiny Base checkpoint with a narrow ECAPA, the tiny Mimi encoder
//! with `sliding_window` 16, and every stage of both encoders).
//!
//! Tolerances (`../shared/design/voice-clone.md` §5.2): each stage within 1e-4 of its peak;
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
    common::oracle(&common::fixture("voice").join(format!("oracle/{name}.safetensors")))
}

/// Shapes of an oracle file's tensors.
fn shapes(name: &str) -> HashMap<String, Vec<usize>> {
    let bytes =
        std::fs::read(common::fixture("voice").join(format!("oracle/{name}.safetensors"))).unwrap();
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
    let mut enc = CodecEncoder::load(&f).unwrap().expect("the Base mmproj carries the encoder");
    for case in ["codec_encoder_aligned", "codec_encoder_ragged", "codec_encoder_long"] {
        let o = oracle(case);
        let sh = shapes(case);
        for threads in [1, 2] {
            let mut trace = Trace::new();
            let codes = enc.encode(&o["input_values"], threads, Some(&mut trace));
            let mut checked = 0;
            for (name, v, width) in &trace {
                let want = o.get(name).unwrap_or_else(|| panic!("{case}: oracle has no {name}"));
                let cm = name.starts_with("seanet.") || name == "downsample";
                let err = stage_error(v, *width, want, cm);
                assert!(err <= 1e-4, "{case} threads {threads} {name}: {err:e} of peak");
                if threads == 2 {
                    eprintln!("{case} {name}: {err:.2e} of peak");
                }
                checked += 1;
            }
            let expect_stages = sh.keys().filter(|k| {
                k.starts_with("seanet.") || k.starts_with("tfm.") || k.starts_with("residual_ac.")
                    || ["downsample", "proj_sem", "proj_ac"].contains(&k.as_str())
            });
            assert_eq!(checked, expect_stages.count(), "{case}: every oracle stage traced");

            // Free-running codes: exact on every frame whose 16 margins all exceed τ.
            let (want, best, second) = (&o["codes"], &o["d2_best"], &o["d2_second"]);
            let frames = sh["codes"][0];
            assert_eq!(codes.len(), frames, "{case}: ceil(N / 1920) frames");
            let mut exact = 0;
            for t in 0..frames {
                let clear = (0..16).all(|k| {
                    let i = t * 16 + k;
                    second[i] - best[i] > TAU * (1.0 + best[i])
                });
                let same = (0..16).all(|k| codes[t][k] as f32 == want[t * 16 + k]);
                if clear {
                    assert!(same, "{case}: frame {t}: {:?} vs {:?}", codes[t], &want[t * 16..t * 16 + 16]);
                }
                exact += same as usize;
            }
            eprintln!("{case} threads {threads}: {exact}/{frames} frames exact");
        }

        // Teacher-forced: each level from the oracle's own input.
        let d = sh["proj_sem"][1];
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
                if s - b > TAU * (1.0 + b) {
                    assert_eq!(c as f32, o["codes"][i], "{case}: level {level} frame {t}");
                }
            }
            assert_eq!(got.len() * d, input.len());
        }
    }
}
