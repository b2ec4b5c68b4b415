//! The decoder (code2wav) against the oracle's `decoder.safetensors` (tiny and tiny17): every
//! stage and the waveform within 1e-4; streaming in any chunk sizes equals one-shot decoding; bad
//! codes give a typed error before any compute.

use crate::common;

use common::max_abs;

use std::collections::BTreeMap;

use qtts::decoder::{Decoder, DecoderError, Products, CODEBOOKS};
use qtts::ffi::Threadpool;
use qtts::gguf::GgufFile;
use qtts::model::convert::OutType;

/// Least signal-to-noise ratio of each decoder stage with bf16 products against f32, in dB.
const BF16_MIN_SNR_DB: f64 = 25.0;

const FRAMES: usize = 20;

/// The oracle's codes as frames (they are stored codebook-major, `codes[k * FRAMES + t]`).
fn frames(o: &BTreeMap<String, Vec<f32>>) -> Vec<[u32; CODEBOOKS]> {
    let c = &o["codes"];
    assert_eq!(c.len(), CODEBOOKS * FRAMES);
    (0..FRAMES)
        .map(|t| std::array::from_fn(|k| c[k * FRAMES + t] as u32))
        .collect()
}

/// `[channels, rows]` time-major to the oracle's channel-major `[channels, rows]`.
fn channel_major(v: &[f32], rows: usize) -> Vec<f32> {
    let ch = v.len() / rows;
    let mut out = vec![0.0; v.len()];
    for t in 0..rows {
        for c in 0..ch {
            out[c * rows + t] = v[t * ch + c];
        }
    }
    out
}

fn load(name: &str) -> (tempfile::TempDir, Decoder, BTreeMap<String, Vec<f32>>) {
    let (tmp, out) = common::convert_tiny(name, OutType::F32);
    let voc = Decoder::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
    let o = common::oracle(&common::fixture(name).join("oracle/decoder.safetensors"));
    (tmp, voc, o.into_iter().collect())
}

/// Decodes `codes` from a fresh state in chunks of the given sizes (cycled).
fn decode(
    voc: &mut Decoder,
    pool: &Threadpool,
    codes: &[[u32; CODEBOOKS]],
    sizes: &[usize],
) -> Vec<f32> {
    voc.reset().unwrap();
    let spf = voc.samples_per_frame();
    let mut wav = vec![f32::NAN; codes.len() * spf];
    let (mut i, mut s) = (0, 0);
    while i < codes.len() {
        let n = sizes[s % sizes.len()].min(codes.len() - i);
        let d = voc
            .decode_frames(pool, &codes[i..i + n], &mut wav[i * spf..(i + n) * spf])
            .unwrap();
        assert_eq!(d.samples, n * spf);
        assert_eq!(d.non_finite, 0);
        i += n;
        s += 1;
    }
    assert_eq!(voc.frames(), codes.len());
    wav
}

#[test]
fn stages_and_waveform_match_the_oracle() {
    let pool = Threadpool::new(2, &[]).unwrap();
    for name in ["tiny", "tiny17"] {
        let (_tmp, mut voc, o) = load(name);
        let g = voc.geometry().clone();
        let codes = frames(&o);
        voc.set_max_chunk(FRAMES);
        voc.set_capture(true);
        let wav = decode(&mut voc, &pool, &codes, &[FRAMES]);
        let got = voc.take_capture();
        // Rows of each stage over the utterance.
        let mut rows: BTreeMap<&str, usize> = BTreeMap::new();
        rows.insert("quantized", FRAMES);
        rows.insert("pre_conv", FRAMES);
        let mut r = FRAMES;
        for u in 0..g.upsampling_ratios.len() {
            r *= g.upsampling_ratios[u];
            rows.insert(["upsample.0.transconv", "upsample.1.transconv"][u], r);
            rows.insert(["upsample.0.convnext", "upsample.1.convnext"][u], r);
        }
        rows.insert("decoder.0", r);
        for (i, &rate) in g.upsample_rates.iter().enumerate() {
            r *= rate;
            rows.insert(["decoder.1", "decoder.2", "decoder.3", "decoder.4"][i], r);
        }
        rows.insert("decoder.5", r);
        rows.insert("decoder.6", r);
        let mut report = Vec::new();
        for (stage, v) in &got {
            // pre_transformer is stored time-major by the oracle, every other stage channel-major.
            let mine = if *stage == "pre_transformer" {
                v.clone()
            } else {
                channel_major(v, rows[stage])
            };
            let e = max_abs(&mine, &o[*stage]);
            let peak = o[*stage].iter().fold(0f32, |m, x| m.max(x.abs()));
            report.push((stage, e, peak));
        }
        for (stage, e, peak) in report {
            eprintln!("{name}: {stage:<22} max abs error {e:.2e} (peak {peak:.2})");
            // The decoder's inner stages grow to |x| ~ 10: within 1e-4 relative to their peak.
            assert!(
                e < 1e-4 * peak.max(1.0),
                "{name}: stage {stage} off by {e} (peak {peak})"
            );
        }
        assert_eq!(got.len(), qtts::decoder::STAGES.len());
        let e_pre = max_abs(&got["decoder.6"], &o["wav_preclamp"]);
        let e = max_abs(&wav, &o["wav"]);
        eprintln!("{name}: wav_preclamp {e_pre:.2e}; wav {e:.2e}");
        assert!(e < 1e-4, "{name}: waveform off by {e}");
    }
}

#[test]
fn streaming_in_any_chunks_equals_one_shot() {
    let pool = Threadpool::new(1, &[]).unwrap();
    let (_tmp, mut voc, o) = load("tiny");
    let codes = frames(&o);
    voc.set_max_chunk(FRAMES);
    let whole = decode(&mut voc, &pool, &codes, &[FRAMES]);
    // Chunk patterns: frame by frame, a fixed xorshift draw of sizes 1..=7, and lengths on both
    // sides of the window (4 frames).
    let mut x = 0x9e37_79b9u32;
    let random: Vec<usize> = (0..32)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            1 + (x % 7) as usize
        })
        .collect();
    let mut worst = 0f32;
    for sizes in [&[1][..], &random, &[6, 1, 13]] {
        let got = decode(&mut voc, &pool, &codes, sizes);
        let e = max_abs(&got, &whole);
        worst = worst.max(e);
        assert!(e <= 1e-5, "chunks {sizes:?}: off by {e}");
    }
    // A call longer than max_chunk is split; the samples do not change.
    voc.set_max_chunk(3);
    let got = decode(&mut voc, &pool, &codes, &[FRAMES]);
    worst = worst.max(max_abs(&got, &whole));
    eprintln!("streaming vs one-shot: max abs difference {worst:e}");
    assert!(worst <= 1e-5);
    // The same decoder, reset, gives the same samples again.
    voc.set_max_chunk(FRAMES);
    assert_eq!(decode(&mut voc, &pool, &codes, &[FRAMES]), whole);
}

#[test]
fn out_of_range_codes_are_rejected_before_compute() {
    let pool = Threadpool::new(1, &[]).unwrap();
    let (_tmp, mut voc, o) = load("tiny");
    let codes = frames(&o);
    let spf = voc.samples_per_frame();
    let mut out = vec![0.0; 3 * spf];
    voc.decode_frames(&pool, &codes[..1], &mut out[..spf])
        .unwrap();
    let mut bad = codes[1..4].to_vec();
    bad[2][7] = 2048;
    assert_eq!(
        voc.decode_frames(&pool, &bad, &mut out),
        Err(DecoderError::CodeOutOfRange {
            frame: 2,
            codebook: 7,
            code: 2048,
            codebook_size: 2048
        })
    );
    assert_eq!(voc.frames(), 1, "the state did not move");
    assert_eq!(
        voc.decode_frames(&pool, &codes[1..4], &mut out[..spf]),
        Err(DecoderError::OutputTooShort {
            expected: 3 * spf,
            found: spf
        })
    );
    // The stream continues as if the bad calls never happened.
    voc.decode_frames(&pool, &codes[1..4], &mut out).unwrap();
    voc.reset().unwrap();
    let mut clean = vec![0.0; 4 * spf];
    voc.decode_frames(&pool, &codes[..4], &mut clean).unwrap();
    // Chunks of other lengths may round differently (ggml's matrix kernels tile by length).
    assert!(max_abs(&clean[spf..], &out) <= 1e-5);
}

#[test]
fn graph_fits_ggml_node_limit() {
    let (_tmp, mut voc, _) = load("tiny17");
    let g = voc.geometry().clone();
    let one = voc.graph_nodes(1).unwrap();
    voc.set_max_chunk(2);
    let two = voc.graph_nodes(2).unwrap();
    eprintln!(
        "graph nodes: {one} (1 frame), {two} (2 frames), {} layers",
        g.n_layer
    );
    assert_eq!(one, two, "node count does not depend on the chunk length");
    // ggml aborts past 2048 nodes; each transformer layer adds about 40, and the full-size
    // decoder (8 layers) measured 747.
    assert!(one + 40 * (8 - g.n_layer.min(8)) < 1024, "{one} nodes");
}

#[test]
fn reduced_precision_files_decode_close_to_the_oracle() {
    let pool = Threadpool::new(1, &[]).unwrap();
    let o: BTreeMap<String, Vec<f32>> =
        common::oracle(&common::fixture("tiny").join("oracle/decoder.safetensors"))
            .into_iter()
            .collect();
    let codes = frames(&o);
    // f16 convs and matrices; q8_0 matrices where rows are whole blocks (else f16). The random
    // weights amplify rounding: the manifest puts the oracle's own bf16 run 0.105 off its f32 run.
    for (ty, tol) in [(OutType::F16, 2e-2), (OutType::Q8_0, 0.15)] {
        let (_tmp, out) = common::convert_tiny("tiny", ty);
        let mut voc = Decoder::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
        let wav = decode(&mut voc, &pool, &codes, &[1, 4]);
        let e = max_abs(&wav, &o["wav"]);
        eprintln!("{ty:?}: wav max abs error {e:.2e}");
        assert!(e < tol, "{ty:?}: waveform off by {e}");
    }
    // Every matrix as q8_0 at load (convs included), from the f32 file: close to the oracle, and
    // its signal-to-noise ratio against the exact decode reported.
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let f = GgufFile::open(&out.mmproj).unwrap();
    let exact = decode(&mut Decoder::load(&f).unwrap(), &pool, &codes, &[1, 4]);
    let mut q8 = Decoder::load_with(&f, Some(qtts::gguf::GgmlType::Q8_0)).unwrap();
    let wav = decode(&mut q8, &pool, &codes, &[1, 4]);
    let e = max_abs(&wav, &o["wav"]);
    let snr = qtts::metrics::snr_db(&exact, &wav);
    eprintln!("q8_0 matrices at load: wav max abs error {e:.2e}, SNR {snr:.1} dB against f32");
    assert!(
        e < 0.15 && snr > 20.0,
        "q8_0 matrices: off by {e}, SNR {snr} dB"
    );
    assert!(wav != exact, "the matrices were not quantized");
    // q8_0 products are not chunk-exact (ggml picks its kernels by length and they sum in other
    // orders; random weights amplify that), but far below the quantization error. The engine's
    // chunking is fixed per utterance, so its samples still never depend on timing.
    let again = decode(&mut q8, &pool, &codes, &[3, 2, 5]);
    let snr_chunks = qtts::metrics::snr_db(&wav, &again);
    eprintln!("q8_0 matrices: another chunking is {snr_chunks:.1} dB from the first");
    assert!(snr_chunks > snr + 10.0, "another chunking: {snr_chunks} dB");
}

/// At the full-size decoder geometry (8 layers of 16 heads, widths 512/1024/1536, window 72),
/// 200 frames of random codes (more than twice the window) decoded one frame per call, and in
/// random chunks of 1 to 8, equal one call over all 200 (whose graph fits in memory because the
/// graph allocator reuses activations). The talker and code predictor of this model are tiny: only the
/// decoder's size matters here, and it keeps the test's checkpoint small.
#[test]
fn full_size_decoder_streams_the_same_in_any_chunking() {
    use qtts::model::config::Preset;
    let cfg = common::tiny_talker(Preset::Small06CustomVoice);
    assert_eq!(
        cfg.speech_tokenizer,
        Preset::Small06CustomVoice.config().speech_tokenizer
    );

    let (_tmp, out) = common::random_converted(&cfg, 3, OutType::F32);
    let f = GgufFile::open(&out.mmproj).unwrap();
    let pool = Threadpool::new(2, &[]).unwrap();
    const N: usize = 200;
    let codes = common::random_codes(N);
    // The random decoder is not calibrated like the oracle's (its final conv is not rescaled),
    // so most output samples clamp at ±1: compare every stage before the clamp, relative to its
    // peak, from the capture.
    let chunks = |sizes: &mut dyn FnMut() -> usize| {
        let mut v = Vec::new();
        let mut left = N;
        while left > 0 {
            let c = sizes().min(left);
            v.push(c);
            left -= c;
        }
        v
    };
    let run = |voc: &mut Decoder, sizes: &[usize]| {
        voc.set_max_chunk(*sizes.iter().max().unwrap());
        voc.reset().unwrap();
        voc.set_capture(true);
        let mut out = vec![0f32; N * 1920];
        let mut at = 0;
        for &c in sizes {
            voc.decode_frames(
                &pool,
                &codes[at..at + c],
                &mut out[at * 1920..(at + c) * 1920],
            )
            .unwrap();
            at += c;
        }
        assert_eq!(voc.non_finite(), 0);
        let captured = voc.take_capture();
        voc.set_capture(false);
        captured
    };
    let mut rng = 0x9e37_79b9u64;
    let random = chunks(&mut || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        1 + (rng % 8) as usize
    });
    let mut exact: Option<BTreeMap<&str, Vec<f32>>> = None;
    use qtts::kernels::bf16::Kernel;
    for products in [None, Some(Kernel::Amx), Some(Kernel::Avx512)] {
        let mut voc = match products {
            None => Decoder::load_options(&f, None, Products::HostF32).unwrap(),
            Some(k) if !k.available() => {
                eprintln!("bf16 products by {k:?}: skipped, this CPU lacks the instructions");
                continue;
            }
            Some(k) => Decoder::load_bf16(&f, k).unwrap(),
        };
        let whole = run(&mut voc, &[N]);
        // bf16 products: every stage close to the exact one (8 significant bits per factor,
        // compounded through the stages), and not equal to it (the matrices were packed).
        let mut vs_f32 = BTreeMap::new();
        if let Some(exact) = &exact {
            for stage in qtts::decoder::STAGES {
                let snr = qtts::metrics::snr_db(&exact[stage], &whole[stage]);
                eprintln!("full-size decoder, {stage}: bf16 products {snr:.1} dB from f32");
                assert!(
                    snr > BF16_MIN_SNR_DB,
                    "{stage}: bf16 products {snr} dB from f32"
                );
                assert!(exact[stage] != whole[stage], "{stage}: nothing in bf16");
                vs_f32.insert(*stage, snr);
            }
        }
        for (label, sizes) in [
            ("1 per call", vec![1; N]),
            ("random chunks", random.clone()),
        ] {
            let got = run(&mut voc, &sizes);
            for stage in qtts::decoder::STAGES {
                let (a, b) = (&whole[stage], &got[stage]);
                assert_eq!(a.len(), b.len(), "{stage}");
                let peak = a.iter().fold(0f32, |m, x| m.max(x.abs()));
                let e = max_abs(a, b) / peak.max(1.0);
                eprintln!("full-size decoder, {products:?}, {N} frames, {stage}: one call vs {label}, max abs / peak {e:e} (peak {peak:e})");
                match vs_f32.get(stage) {
                    None => assert!(e < 1e-5, "{products:?}, {stage}, {label}: {e}"),
                    // The bf16 products themselves do not depend on the chunking (the first
                    // stages, all bf16 products, are equal), but ggml's f32 attention ops between
                    // them do, by about 1e-7 (as the f32 run shows), and a value that close to a
                    // bf16 rounding boundary rounds the other way; each later rounding spreads
                    // it, until two chunkings differ as two bf16 runs would: by the bf16 error
                    // itself, 3 dB more for two independent errors. The engine's chunking is
                    // fixed per utterance, so its samples still never depend on timing.
                    Some(snr) => {
                        let chunks = qtts::metrics::snr_db(a, b);
                        eprintln!("  bf16: {chunks:.1} dB between chunkings, {snr:.1} dB from f32");
                        assert!(chunks > snr - 4.0, "{stage}, {label}: {chunks} dB");
                    }
                }
            }
        }
        exact.get_or_insert(whole);
    }
}

/// The waveforms of the oracle's whole greedy generations (`generate_stream`,
/// `generate_nonstream`), decoded here frame by frame from the oracle's codes, within 1e-4.
#[test]
fn generated_codes_decode_to_the_oracle_waveforms() {
    for name in ["tiny", "tiny17"] {
        let (_tmp, mut voc, _) = load(name);
        let pool = Threadpool::new(1, &[]).unwrap();
        for run in ["generate_stream", "generate_nonstream"] {
            let o =
                common::oracle(&common::fixture(name).join(format!("oracle/{run}.safetensors")));
            let codes: Vec<[u32; CODEBOOKS]> = o["codes"]
                .chunks_exact(CODEBOOKS)
                .map(|f| std::array::from_fn(|k| f[k] as u32))
                .collect();
            voc.reset().unwrap();
            let mut wav = vec![0f32; codes.len() * 1920];
            for (t, f) in codes.iter().enumerate() {
                voc.decode_frames(
                    &pool,
                    std::slice::from_ref(f),
                    &mut wav[t * 1920..(t + 1) * 1920],
                )
                .unwrap();
            }
            let e = max_abs(&wav, &o["wav"]);
            eprintln!(
                "{name} {run}: waveform of {} frames off by {e:e}",
                codes.len()
            );
            assert!(e < 1e-4, "{name} {run}: {e}");
        }
    }
}
