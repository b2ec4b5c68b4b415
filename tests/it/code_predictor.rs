//! The code predictor against the oracle's `cp_frame` (tiny and tiny17): hidden states and every
//! head's logits within 1e-4, the 15 greedy codes exact.

use crate::common;

use common::max_abs;

use qtts::code_predictor::CodePredictor;
use qtts::ffi::Threadpool;
use qtts::gguf::GgufFile;
use qtts::model::convert::OutType;

/// The heads' dot kernel of every kernel tier this CPU runs (the others reported as skipped).
fn dot_kernels() -> Vec<qtts::code_predictor::heads::Kernel> {
    let mut v = Vec::new();
    qtts::kernels::for_each_tier(|t| {
        v.push(qtts::code_predictor::heads::Kernel::for_caps(t.caps()))
    });
    v
}

/// Whether the process's kernel tier has packed kernels, else a line saying the test is skipped.
fn packed_available() -> bool {
    use qtts::code_predictor::LayerKernel;
    let ok = LayerKernel::fastest() == LayerKernel::Packed;
    if !ok {
        eprintln!(
            "skipped: kernel tier {} has no packed kernels",
            qtts::kernels::active()
        );
    }
    ok
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn cp_frame_matches_the_oracle() {
    for name in ["tiny", "tiny17"] {
        let (_tmp, out) = common::convert_tiny(name, OutType::F32);
        let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
        let o = common::oracle(&common::fixture(name).join("oracle/cp_frame.safetensors"));
        let codes: Vec<u32> = o["codes"].iter().map(|&c| c as u32).collect();
        for threads in [1, 2] {
            let pool = Threadpool::new(threads, &[]).unwrap();
            // Teacher-forced with the oracle's codes, recording every head's logits.
            let mut logits = Vec::new();
            let mut hidden = Vec::new();
            let got = cp
                .frame(
                    &pool,
                    &o["past_hidden"],
                    o["code0"][0] as u32,
                    &mut |g, l| {
                        logits.extend_from_slice(l);
                        codes[g]
                    },
                    Some(&mut hidden),
                )
                .unwrap();
            assert_eq!(got.to_vec(), codes);
            let e = max_abs(&logits, &o["logits"]);
            eprintln!(
                "{name}, {threads} threads: logits max abs error {e:e}, hidden {:e}",
                max_abs(&hidden, &o["hidden"])
            );
            assert!(e < 1e-4, "{name}: logits off by {e}");
            let e = max_abs(&hidden, &o["hidden"]);
            assert!(e < 1e-4, "{name}: hidden off by {e}");
            // Greedy on our own logits gives the oracle's codes (smallest margin 0.002).
            let greedy = cp
                .frame(
                    &pool,
                    &o["past_hidden"],
                    o["code0"][0] as u32,
                    &mut |_, l| argmax(l),
                    None,
                )
                .unwrap();
            assert_eq!(greedy.to_vec(), codes, "{name}: greedy codes");
        }
    }
}

#[test]
fn frames_do_not_leak_state_into_each_other() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
    let o = common::oracle(&common::fixture("tiny").join("oracle/cp_frame.safetensors"));
    let pool = Threadpool::new(1, &[]).unwrap();
    let run = |cp: &mut CodePredictor, code0: u32| {
        cp.frame(&pool, &o["past_hidden"], code0, &mut |_, l| argmax(l), None)
            .unwrap()
    };
    let first = run(&mut cp, o["code0"][0] as u32);
    let other = run(&mut cp, 7);
    assert_ne!(first, other);
    assert_eq!(
        run(&mut cp, o["code0"][0] as u32),
        first,
        "the KV cache is rewritten each frame"
    );
    assert!(cp
        .frame(&pool, &o["past_hidden"][1..], 0, &mut |_, _| 0, None)
        .is_err());
    assert!(cp
        .frame(&pool, &o["past_hidden"], 5000, &mut |_, _| 0, None)
        .is_err());
    assert!(cp
        .frame(&pool, &o["past_hidden"], 0, &mut |_, _| 4096, None)
        .is_err());
}

/// Every SIMD kernel the CPU has gives the scalar kernel's bits: on 1,000 random vector pairs of
/// assorted lengths, and on the fixtures' whole frames.
#[test]
fn simd_heads_are_bit_identical_to_scalar() {
    use qtts::code_predictor::heads::Kernel;
    let kernels = dot_kernels();
    eprintln!("kernels of the tiers on this CPU: {kernels:?}");
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    };
    for i in 0..1000 {
        let n = [1024, 2048, 64, 48, 1, 63, 65, 1000][i % 8];
        let a: Vec<f32> = (0..n).map(|_| rnd()).collect();
        let b: Vec<f32> = (0..n).map(|_| rnd()).collect();
        let want = Kernel::Scalar.dot(&a, &b);
        let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!(
            (want as f64 - exact).abs() < 1e-3,
            "scalar dot is a dot product"
        );
        for k in &kernels {
            assert_eq!(k.dot(&a, &b).to_bits(), want.to_bits(), "{k:?}, n = {n}");
        }
    }
    for name in ["tiny", "tiny17"] {
        let (_tmp, out) = common::convert_tiny(name, OutType::F32);
        let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
        let o = common::oracle(&common::fixture(name).join("oracle/cp_frame.safetensors"));
        let pool = Threadpool::new(1, &[]).unwrap();
        let mut per_kernel = Vec::new();
        for k in &kernels {
            cp.set_heads_kernel(*k);
            let mut logits = Vec::new();
            cp.frame(
                &pool,
                &o["past_hidden"],
                o["code0"][0] as u32,
                &mut |_, l| {
                    logits.extend(l.iter().map(|x| x.to_bits()));
                    argmax(l)
                },
                None,
            )
            .unwrap();
            per_kernel.push(logits);
        }
        for (k, l) in kernels.iter().zip(&per_kernel) {
            assert_eq!(l, &per_kernel[0], "{name}: {k:?} vs scalar");
        }
    }
}

/// The KV-cached frame equals recomputing every position at every step, on the oracle's frame
/// and on a frame of other codes.
#[test]
fn kv_cached_frame_equals_full_recompute() {
    for name in ["tiny", "tiny17"] {
        let (_tmp, out) = common::convert_tiny(name, OutType::F32);
        let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
        let o = common::oracle(&common::fixture(name).join("oracle/cp_frame.safetensors"));
        let pool = Threadpool::new(2, &[]).unwrap();
        for code0 in [o["code0"][0] as u32, 2049, 11] {
            let (codes, full) = cp
                .frame_recomputed(&pool, &o["past_hidden"], code0, &mut |_, l| argmax(l))
                .unwrap();
            let mut cached = Vec::new();
            let got = cp
                .frame(
                    &pool,
                    &o["past_hidden"],
                    code0,
                    &mut |_, l| {
                        cached.extend_from_slice(l);
                        argmax(l)
                    },
                    None,
                )
                .unwrap();
            assert_eq!(got, codes, "{name}, code0 {code0}");
            let e = max_abs(&cached, &full);
            eprintln!("{name}, code0 {code0}: cached vs recomputed logits {e:e}");
            assert!(e < 1e-5, "{name}, code0 {code0}: {e}");
        }
    }
}

/// `QTTS_PROFILE=1` splits each frame's time by sub-step and kind, and counts frames.
#[test]
fn profile_accounts_for_every_frame() {
    // Read once, at load: set in a process of its own.
    if !common::own_process(
        "code_predictor::profile_accounts_for_every_frame",
        &[("QTTS_PROFILE", "1")],
    ) {
        return;
    }
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
    let o = common::oracle(&common::fixture("tiny").join("oracle/cp_frame.safetensors"));
    let pool = Threadpool::new(1, &[]).unwrap();
    for _ in 0..3 {
        cp.frame(&pool, &o["past_hidden"], 5, &mut |_, l| argmax(l), None)
            .unwrap();
    }
    let p = cp.take_profile().unwrap();
    assert_eq!(p.frames, 3);
    assert!(p.compute.iter().all(|d| !d.is_zero()), "{p:?}");
    assert!(p.table().contains("total"));
    assert_eq!(cp.profile().unwrap().frames, 0, "taken");
}

/// Values in [-1, 1) from a xorshift generator seeded with `state`.
fn uniform(mut state: u64) -> impl FnMut() -> f32 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
    }
}

/// Packed q8_0 heads (`Heads::to_packed`, the engine's default under `LayerKernel::Packed`): each
/// logit within what rounding the input to int8 can move it from the fixed-order q8_0 heads' (the
/// same weights), and the same greedy code in nearly every case; f32 heads are never packed.
#[test]
fn packed_q8_heads_stay_within_the_input_rounding() {
    use qtts::code_predictor::heads::{Heads, Kernel};
    if !packed_available() {
        return;
    }
    let mut rnd = uniform(0x2545_f491_4f6c_dd1d);
    let (codes, width) = (64, 1024);
    let w: Vec<f32> = (0..15 * codes * width).map(|_| rnd()).collect();
    let f32_heads = Heads::new(w, codes, width, Kernel::Scalar);
    assert!(f32_heads.to_packed().is_none(), "f32 heads stay exact");
    let q8 = f32_heads.to_q8().unwrap();
    let packed = q8.to_packed().unwrap();
    assert!(packed.is_packed() && packed.is_q8() && !q8.is_packed());
    let (mut want, mut got) = (vec![0f32; codes], vec![0f32; codes]);
    let (mut same, mut cases) = (0, 0);
    for _ in 0..20 {
        let h: Vec<f32> = (0..width).map(|_| rnd()).collect();
        let amax = h.iter().fold(0f32, |a, v| a.max(v.abs()));
        for g in [0, 7, 14] {
            q8.logits(g, &h, &mut want);
            packed.logits(g, &h, &mut got);
            for (r, (a, b)) in want.iter().zip(&got).enumerate() {
                // Each input moves by at most half a step (max|h| / 254 per block of 32, at most
                // the row's max), times the row's weights (|w| ≤ 1): 1024 / 254 · amax at worst;
                // the sum of such errors is far smaller, but a bound must hold for any input.
                let bound = width as f32 * amax / 254.0;
                assert!((a - b).abs() <= bound, "head {g} row {r}: {a} vs {b}");
            }
            let rms = |v: &[f32]| (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt();
            let diff: Vec<f32> = want.iter().zip(&got).map(|(a, b)| a - b).collect();
            assert!(
                rms(&diff) < 0.02 * rms(&want),
                "head {g}: rms {} of {}",
                rms(&diff),
                rms(&want)
            );
            same += (qtts::sampling::argmax(&want) == qtts::sampling::argmax(&got)) as usize;
            cases += 1;
        }
    }
    assert!(
        same * 10 >= cases * 9,
        "greedy codes agree in {same} of {cases}"
    );
}

/// q8_0 heads: every kernel gives the scalar kernel's bits, and the logits stay close to the f32
/// ones (quantization error only) with the same greedy codes on the fixtures.
#[test]
fn q8_heads_are_bit_identical_across_kernels_and_close_to_f32() {
    use qtts::code_predictor::heads::{Heads, Kernel};
    let kernels = dot_kernels();
    let mut rnd = uniform(0x9e37_79b9_7f4a_7c15);
    let (codes, width) = (64, 1024);
    let w: Vec<f32> = (0..15 * codes * width).map(|_| rnd()).collect();
    let f32_heads = Heads::new(w, codes, width, Kernel::Scalar);
    let q8 = f32_heads.to_q8().unwrap();
    assert!(q8.is_q8());
    for _ in 0..20 {
        let h: Vec<f32> = (0..width).map(|_| rnd()).collect();
        let mut want = vec![0f32; codes];
        let mut exact = vec![0f32; codes];
        let mut got = vec![0f32; codes];
        for g in [0, 7, 14] {
            let mut scalar = q8.clone();
            scalar.set_kernel(Kernel::Scalar);
            scalar.logits(g, &h, &mut want);
            f32_heads.logits(g, &h, &mut exact);
            for (a, b) in want.iter().zip(&exact) {
                // Weight rounding of at most d/2 = max/254 per value: a std of about 0.04 over
                // 1024 products of U(-1, 1) values; 0.3 is over 7 of them.
                assert!((a - b).abs() < 0.3, "q8 {a} vs f32 {b}");
            }
            for k in &kernels {
                let mut hk = q8.clone();
                hk.set_kernel(*k);
                hk.logits(g, &h, &mut got);
                assert_eq!(common::bits(&got), common::bits(&want), "{k:?}");
            }
        }
    }
    for name in ["tiny", "tiny17"] {
        let (_tmp, out) = common::convert_tiny(name, OutType::F32);
        let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
        let o = common::oracle(&common::fixture(name).join("oracle/cp_frame.safetensors"));
        let pool = Threadpool::new(1, &[]).unwrap();
        if name == "tiny17" {
            // A width of 48 is not whole q8_0 blocks: refused, the f32 heads stay.
            assert!(matches!(
                cp.use_q8_heads(),
                Err(qtts::ModelError::Unsupported { .. })
            ));
            continue;
        }
        cp.use_q8_heads().unwrap();
        let mut logits = Vec::new();
        cp.frame(
            &pool,
            &o["past_hidden"],
            o["code0"][0] as u32,
            &mut |g, l| {
                logits.extend_from_slice(l);
                o["codes"][g] as u32
            },
            None,
        )
        .unwrap();
        let (a, b) = (&logits, &o["logits"]);
        let dot: f64 = a
            .iter()
            .zip(b.iter())
            .map(|(x, y)| *x as f64 * *y as f64)
            .sum();
        let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let top1 = (0..15)
            .filter(|g| argmax(&a[g * 2048..(g + 1) * 2048]) == o["codes"][*g] as u32)
            .count();
        eprintln!(
            "{name}: q8_0 heads vs oracle: cosine {:.6}, top-1 {top1}/15, max abs {:e}",
            dot / (na * nb),
            max_abs(a, b)
        );
        assert!(
            dot / (na * nb) > 0.999,
            "{name}: cosine {}",
            dot / (na * nb)
        );
    }
}

/// Sampled frames with the checkpoint's code-predictor settings: a seed reproduces its codes,
/// another seed gives others, and greedy settings give the oracle's codes.
#[test]
fn sampled_frames_follow_the_seed() {
    use qtts::model::config::Preset;
    use qtts::sampling::{Sampler, SamplingParams};
    let gen = Preset::Small06CustomVoice.config().generation;
    let p = SamplingParams::code_predictor(&gen);
    assert_eq!((p.do_sample, p.top_k, p.temperature), (true, 50, 0.9));
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
    let o = common::oracle(&common::fixture("tiny").join("oracle/cp_frame.safetensors"));
    let pool = Threadpool::new(1, &[]).unwrap();
    let mut run = |seed: u64, p: SamplingParams| {
        let mut s = Sampler::new(seed);
        cp.frame(
            &pool,
            &o["past_hidden"],
            o["code0"][0] as u32,
            &mut |_, l| s.sample(l, &p),
            None,
        )
        .unwrap()
    };
    assert_eq!(run(1, p), run(1, p));
    assert_ne!(run(1, p), run(2, p));
    let greedy: Vec<u32> = run(1, SamplingParams::GREEDY).to_vec();
    assert_eq!(
        greedy,
        o["codes"].iter().map(|&c| c as u32).collect::<Vec<_>>()
    );
}

/// A frame's codes and logits with the layer kernels `Packed`, `Scalar`, `Ggml` and `Packed`
/// again, switched in place, on a random code predictor of width 256 (a k-quant's block) whose
/// layers are `ty`; `None` where the kernel tier has no packed kernels.
#[allow(clippy::type_complexity)]
fn frames_by_kernel(ty: OutType) -> Option<[([u32; 15], Vec<f32>); 4]> {
    use qtts::code_predictor::LayerKernel;
    if !packed_available() {
        return None;
    }
    let mut cfg =
        qtts::model::testing::tiny_config(qtts::model::config::Preset::Small06CustomVoice, true);
    let cp = &mut cfg.tts.talker_config.code_predictor_config;
    (cp.hidden_size, cp.intermediate_size, cp.head_dim) = (256, 512, 64);
    let (_tmp, out) = common::random_converted(&cfg, 5, ty);
    let f = GgufFile::open(&out.mmproj).unwrap();
    let layers = f
        .header
        .tensors
        .iter()
        .filter(|t| t.name.contains(".blk.") && t.ty == ty.ggml())
        .count();
    assert!(layers >= 7, "{layers} {} layer matrices", ty.name());
    let mut cp = CodePredictor::load(&f).unwrap();
    assert_eq!(cp.layer_kernel(), LayerKernel::Packed);
    let pool = Threadpool::new(2, &[]).unwrap();
    let hidden: Vec<f32> = (0..64)
        .map(|i| ((i * 37 % 64) as f32 / 32.0) - 1.0)
        .collect();
    let mut run = |kernel| greedy_frame(&mut cp, kernel, &pool, &hidden, 7);
    Some([
        run(LayerKernel::Packed),
        run(LayerKernel::Scalar),
        run(LayerKernel::Ggml),
        run(LayerKernel::Packed),
    ])
}

/// One greedy frame of `cp` with its layer products by `kernel`: the codes and every head's
/// logits.
fn greedy_frame(
    cp: &mut CodePredictor,
    kernel: qtts::code_predictor::LayerKernel,
    pool: &Threadpool,
    hidden: &[f32],
    code0: u32,
) -> ([u32; 15], Vec<f32>) {
    cp.set_layer_kernel(kernel).unwrap();
    let mut logits = Vec::new();
    let codes = cp
        .frame(
            pool,
            hidden,
            code0,
            &mut |_, l| {
                logits.extend_from_slice(l);
                argmax(l)
            },
            None,
        )
        .unwrap();
    (codes, logits)
}

/// The largest difference between two frames' logits up to the first step whose picked codes
/// differ (that step included): after it, each frame's steps see other inputs. Greedy picks on a
/// random model have near-ties, so two kernels that round differently (ggml quantizes its inputs
/// its own way) can part there.
fn max_abs_until_parted(a: &([u32; 15], Vec<f32>), b: &([u32; 15], Vec<f32>)) -> f32 {
    let n = a.1.len() / 15;
    let mut e = 0f32;
    for step in 0..15 {
        let at = step * n..(step + 1) * n;
        e = e.max(max_abs(&a.1[at.clone()], &b.1[at]));
        if a.0[step] != b.0[step] {
            break;
        }
    }
    e
}

/// The frames of `frames_by_kernel(ty)`: the packed kernels give the scalar kernels' frame on
/// the file's rows to the bit (the same integer products and the same float steps, see
/// `qtts::kernels::quant`, and the same one-node attention), switching kernels packs and unpacks
/// the matrices in place (back on the packed kernel, the frame is the same to the bit), and
/// ggml, which quantizes the inputs its own way and attends by its own ops, is close until the
/// picks part.
///
/// The two sides of an exact comparison must share every float operation upstream of each
/// quantized product: the products round their inputs to int8, so a rounding difference of one
/// ulp upstream (ggml's attention against the crate's one-node attention, or ggml built for
/// another CPU) moves an input across a rounding boundary now and then, and the outputs by a
/// step of the input's scale. That is what failed on a Zen 4 when this test compared the packed
/// kernel (one-node attention) with the row kernel (ggml's attention) within 1e-4.
fn check_packed_against_scalar(ty: OutType) {
    let Some([packed, scalar, ggml, again]) = frames_by_kernel(ty) else {
        return;
    };
    let scale = packed.1.iter().fold(0f32, |a, v| a.max(v.abs()));
    eprintln!(
        "packed {ty:?} vs scalar: max {:e} of {scale}",
        max_abs(&packed.1, &scalar.1)
    );
    assert_eq!(packed.0, scalar.0, "codes, packed vs scalar");
    assert!(
        common::bits(&packed.1) == common::bits(&scalar.1),
        "logits, packed vs scalar: max {}",
        max_abs(&packed.1, &scalar.1)
    );
    assert_eq!(packed, again, "packed, unpacked for ggml, packed again");
    let e = max_abs_until_parted(&packed, &ggml);
    eprintln!("packed {ty:?} vs ggml: max {e:e} of {scale} until the picks part");
    assert!(e <= 0.05 * scale, "packed vs ggml: {e} of {scale}");
}

/// q4_K layers packed 16 rows at a time (the default where the kernel tier has packed kernels)
/// against the scalar kernel on the file's rows and against ggml (`check_packed_against_scalar`).
#[test]
fn packed_q4k_layers_give_the_frame_of_the_scalar_kernel() {
    check_packed_against_scalar(OutType::Q4K);
}

/// q5_K layers, as `packed_q4k_layers_give_the_frame_of_the_scalar_kernel`.
#[test]
fn packed_q5k_layers_give_the_frame_of_the_scalar_kernel() {
    check_packed_against_scalar(OutType::Q5K);
}

/// q8_0 layers, as `packed_q4k_layers_give_the_frame_of_the_scalar_kernel`.
#[test]
fn packed_q8_0_layers_give_the_frame_of_the_scalar_kernel() {
    check_packed_against_scalar(OutType::Q8_0);
}

/// The layers' q/k/v and gate/up matrices joined into one product each (the default) give the
/// frame of the matrices multiplied one by one, to the bit, under every kernel: each output row
/// is the same dot product of the same quantized input, and the attention and feed-forward read
/// the same values from views of one output (under the crate's kernels, a single row's one-node
/// attention reads the three products joined).
#[test]
fn joined_products_give_the_frame_of_separate_ones() {
    use qtts::code_predictor::LayerKernel;
    let mut cfg =
        qtts::model::testing::tiny_config(qtts::model::config::Preset::Small06CustomVoice, true);
    let cp = &mut cfg.tts.talker_config.code_predictor_config;
    (cp.hidden_size, cp.intermediate_size, cp.head_dim) = (256, 512, 64);
    let n_layer = cp.num_hidden_layers as usize;
    let pool = Threadpool::new(2, &[]).unwrap();
    let hidden: Vec<f32> = (0..64)
        .map(|i| ((i * 29 % 64) as f32 / 32.0) - 1.0)
        .collect();
    let mut kernels = vec![LayerKernel::Ggml, LayerKernel::Scalar];
    if packed_available() {
        kernels.push(LayerKernel::Packed);
    }
    for ty in [OutType::Q8_0, OutType::Q4K, OutType::F32] {
        let (_tmp, out) = common::random_converted(&cfg, 11, ty);
        let f = GgufFile::open(&out.mmproj).unwrap();
        let mut joined = CodePredictor::load(&f).unwrap();
        let mut separate = CodePredictor::load_joining(&f, false).unwrap();
        // f32 matrices are never joined: the exact path stays ggml's products one by one.
        let expected = if ty == OutType::F32 { 0 } else { 2 * n_layer };
        assert_eq!(joined.joined(), expected, "{ty:?}");
        assert_eq!(separate.joined(), 0, "{ty:?}");
        for &kernel in &kernels {
            let run = |cp: &mut CodePredictor| greedy_frame(cp, kernel, &pool, &hidden, 3);
            let (a, b) = (run(&mut joined), run(&mut separate));
            assert_eq!(a.0, b.0, "{ty:?} {kernel:?}: codes");
            assert!(
                a.1.iter()
                    .zip(&b.1)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{ty:?} {kernel:?}: logits differ by up to {}",
                max_abs(&a.1, &b.1)
            );
        }
    }
}

/// Packed heads run as the last node of each sub-step's graph, on the pool's threads: every
/// step's logits are, to the bit, the packed heads' own on that step's final hidden state (the
/// same kernel on the same row, whatever the thread split).
#[test]
fn packed_heads_in_the_graphs_give_the_heads_own_logits() {
    if !packed_available() {
        return;
    }
    let mut cfg =
        qtts::model::testing::tiny_config(qtts::model::config::Preset::Small06CustomVoice, true);
    let cp = &mut cfg.tts.talker_config.code_predictor_config;
    (cp.hidden_size, cp.intermediate_size, cp.head_dim) = (256, 512, 64);
    let (_tmp, out) = common::random_converted(&cfg, 17, OutType::Q8_0);
    let f = GgufFile::open(&out.mmproj).unwrap();
    let mut cp = CodePredictor::load(&f).unwrap();
    assert!(!cp.heads_in_graph());
    assert!(cp.pack_heads());
    assert!(cp.heads_in_graph());
    let pool = Threadpool::new(2, &[]).unwrap();
    let hidden: Vec<f32> = (0..64)
        .map(|i| ((i * 13 % 64) as f32 / 32.0) - 1.0)
        .collect();
    let mut logits = Vec::new();
    let mut states = Vec::new();
    cp.frame(
        &pool,
        &hidden,
        5,
        &mut |_, l| {
            logits.extend_from_slice(l);
            argmax(l)
        },
        Some(&mut states),
    )
    .unwrap();
    let (w, n) = (256, logits.len() / 15);
    let mut own = vec![0f32; n];
    for step in 0..15 {
        // Step 0 sees positions 0 and 1, step k position k + 1: its last row is k + 1's.
        let last = &states[(step + 1) * w..(step + 2) * w];
        cp.heads().logits(step, last, &mut own);
        let graph = &logits[step * n..(step + 1) * n];
        assert!(
            graph
                .iter()
                .zip(&own)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "step {step}: {}",
            max_abs(graph, &own)
        );
    }
}

/// A frame's logits do not depend on the pool's thread count: the engine's code predictor
/// computes on one thread or, with the decoder's cores on loan, on more, and may change between
/// two sub-steps of a frame. Every layer kernel, with f32, q8_0 and packed heads.
#[test]
fn a_frames_logits_are_the_same_on_any_number_of_threads() {
    use qtts::code_predictor::LayerKernel;
    let pools: Vec<Threadpool> = [1, 2]
        .iter()
        .map(|&n| Threadpool::new(n, &[]).unwrap())
        .collect();
    // A code predictor 48 wide (f32 layers and heads), and one 256 wide (q8_0).
    let models = [
        common::random_converted(&common::narrow_code_predictor(), 24, OutType::Q8_0),
        common::random_converted(&common::tiny_talker_256(), 25, OutType::Q8_0),
    ];
    let cases = [(0, "f32"), (1, "f32"), (1, "q8_0"), (1, "packed")];
    for (m, heads) in cases {
        let f = GgufFile::open(&models[m].1.mmproj).unwrap();
        let mut cp = CodePredictor::load(&f).unwrap();
        match heads {
            "q8_0" => cp.use_q8_heads().unwrap(),
            "packed" if !packed_available() => continue,
            "packed" => assert!(cp.pack_heads()),
            _ => {}
        }
        let n = cp.geometry().n_talker;
        let hidden: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 64) as f32 / 32.0) - 1.0)
            .collect();
        for kernel in [LayerKernel::Ggml, LayerKernel::Scalar, LayerKernel::Packed] {
            if kernel.check_available().is_err() {
                eprintln!(
                    "{kernel:?}: skipped on kernel tier {}",
                    qtts::kernels::active()
                );
                continue;
            }
            let runs: Vec<_> = pools
                .iter()
                .map(|p| greedy_frame(&mut cp, kernel, p, &hidden, 7))
                .collect();
            for (t, r) in runs.iter().enumerate().skip(1) {
                assert!(
                    r.0 == runs[0].0 && common::bits(&r.1) == common::bits(&runs[0].1),
                    "model {m}, {heads} heads, {kernel:?}: {} threads differ from 1 by {}",
                    t + 1,
                    max_abs(&r.1, &runs[0].1)
                );
            }
        }
    }
}
