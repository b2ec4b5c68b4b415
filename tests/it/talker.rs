//! The talker through llama.cpp (`qwen3tts`, fed input embeddings with IMROPE positions) against
//! the oracle's `talker_forward` (tiny, tiny17): final-normed hidden states and codec logits of
//! every position within 1e-4.

use crate::common;

use common::max_abs;
use qtts::ffi::{EmbdBatch, LlamaContext, LlamaModel};
use qtts::model::convert::OutType;

#[test]
fn talker_forward_matches_the_oracle() {
    for name in ["tiny", "tiny17"] {
        let (_tmp, out) = common::convert_tiny(name, OutType::F32);
        let model = LlamaModel::load(&qtts::model::validate::talker(&out.talker).unwrap()).unwrap();
        let o = common::oracle(&common::fixture(name).join("oracle/talker_forward.safetensors"));
        let h = model.n_embd();
        let x = &o["inputs_embeds"];
        let n = x.len() / h;
        for threads in [1, 2] {
            let mut ctx = LlamaContext::with_kv(&model, 64, threads, true).unwrap();
            let mut batch = EmbdBatch::new(n, h);
            for t in 0..n {
                batch.push(&x[t * h..(t + 1) * h], t as i32, true).unwrap();
            }
            ctx.decode(&mut batch).unwrap();
            let mut hidden = Vec::new();
            let mut logits = Vec::new();
            for t in 0..n as i32 {
                hidden.extend_from_slice(ctx.embeddings(t).unwrap());
                let l = ctx.logits(t).unwrap();
                logits.extend_from_slice(&l[l.len() - 3072..]);
            }
            let (eh, el) = (
                max_abs(&hidden, &o["last_hidden"]),
                max_abs(&logits, &o["logits"]),
            );
            eprintln!("{name}, {threads} threads: last_hidden {eh:e}, logits {el:e}");
            assert!(eh < 1e-4 && el < 1e-4, "{name}: hidden {eh}, logits {el}");
        }
    }
}

/// The same positions fed one step at a time through the KV cache give the same outputs, and
/// clearing the cache starts over.
#[test]
fn talker_steps_through_the_kv_cache() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let model = LlamaModel::load(&qtts::model::validate::talker(&out.talker).unwrap()).unwrap();
    let o = common::oracle(&common::fixture("tiny").join("oracle/talker_forward.safetensors"));
    let h = model.n_embd();
    let x = &o["inputs_embeds"];
    let n = x.len() / h;
    let mut ctx = LlamaContext::with_kv(&model, 64, 1, true).unwrap();
    let mut batch = EmbdBatch::new(n, h);
    for round in 0..2 {
        let mut hidden = Vec::new();
        // A prefill of 5 rows, then one row per step.
        for t in 0..5 {
            batch
                .push(&x[t * h..(t + 1) * h], t as i32, t == 4)
                .unwrap();
        }
        ctx.decode(&mut batch).unwrap();
        batch.clear();
        let h4 = ctx.embeddings(-1).unwrap().to_vec();
        for t in 5..n {
            batch.push(&x[t * h..(t + 1) * h], t as i32, true).unwrap();
            ctx.decode(&mut batch).unwrap();
            batch.clear();
            hidden.extend_from_slice(ctx.embeddings(-1).unwrap());
        }
        let e = max_abs(&h4, &o["last_hidden"][4 * h..5 * h])
            .max(max_abs(&hidden, &o["last_hidden"][5 * h..]));
        assert!(e < 1e-4, "round {round}: {e}");
        ctx.clear();
    }
}

/// Teacher-forced `generate_stream` and `generate_nonstream` (the oracle's own prefill and step
/// embeddings fed to the talker, its codes to the code predictor): every raw talker logit row,
/// every talker hidden state and every code-predictor logit within 1e-4, and the greedy choice of
/// each code predictor head is the oracle's code.
#[test]
fn generate_teacher_forced_matches_the_oracle() {
    use qtts::code_predictor::CodePredictor;
    use qtts::ffi::Threadpool;
    use qtts::gguf::GgufFile;
    for name in ["tiny", "tiny17"] {
        let (_tmp, out) = common::convert_tiny(name, OutType::F32);
        let model = LlamaModel::load(&qtts::model::validate::talker(&out.talker).unwrap()).unwrap();
        let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
        let pool = Threadpool::new(1, &[]).unwrap();
        let h = model.n_embd();
        for run in ["generate_stream", "generate_nonstream"] {
            let o =
                common::oracle(&common::fixture(name).join(format!("oracle/{run}.safetensors")));
            let (prefill, steps) = (&o["prefill_embeds"], &o["step_embeds"]);
            let (p, s) = (prefill.len() / h, steps.len() / h);
            let mut ctx = LlamaContext::with_kv(&model, 256, 1, true).unwrap();
            let mut batch = EmbdBatch::new(p.max(1), h);
            for t in 0..p {
                batch
                    .push(&prefill[t * h..(t + 1) * h], t as i32, t + 1 == p)
                    .unwrap();
            }
            ctx.decode(&mut batch).unwrap();
            let mut logits = Vec::new();
            let mut hidden = Vec::new();
            for step in 0..=s {
                if step > 0 {
                    batch.clear();
                    batch
                        .push(
                            &steps[(step - 1) * h..step * h],
                            (p + step - 1) as i32,
                            true,
                        )
                        .unwrap();
                    ctx.decode(&mut batch).unwrap();
                }
                let l = ctx.logits(-1).unwrap();
                logits.extend_from_slice(&l[l.len() - 3072..]);
                hidden.extend_from_slice(ctx.embeddings(-1).unwrap());
            }
            let el = max_abs(&logits, &o["talker_logits_raw"]);
            let frames = o["codes"].len() / 16;
            let eh = max_abs(&hidden[..frames * h], &o["talker_hidden"]);
            // The code predictor on each frame, teacher-forced with the oracle's codes.
            let mut cp_logits = Vec::new();
            for f in 0..frames {
                let codes = &o["codes"][f * 16..(f + 1) * 16];
                let greedy = cp
                    .frame(
                        &pool,
                        &o["talker_hidden"][f * h..(f + 1) * h],
                        codes[0] as u32,
                        &mut |g, l| {
                            cp_logits.extend_from_slice(l);
                            assert_eq!(
                                qtts::sampling::argmax(l),
                                codes[g + 1] as u32,
                                "{name} {run}: frame {f} group {}",
                                g + 1
                            );
                            codes[g + 1] as u32
                        },
                        None,
                    )
                    .unwrap();
                assert_eq!(greedy.len(), 15);
            }
            let ec = max_abs(&cp_logits, &o["cp_logits_raw"][..cp_logits.len()]);
            eprintln!("{name} {run}: talker logits {el:e}, talker hidden {eh:e}, cp logits {ec:e} ({frames} frames)");
            assert!(
                el < 1e-4 && eh < 1e-4 && ec < 1e-4,
                "{name} {run}: {el} {eh} {ec}"
            );
        }
    }
}

/// The talker's own graph with its q/k/v and gate/up matrices joined (the default, see
/// `code_predictor::JOINED`) gives the logits of the matrices multiplied one by one, to the bit,
/// in a prefill of several rows and in single-row steps, under every kernel.
#[test]
fn joined_products_give_the_logits_of_separate_ones() {
    use qtts::code_predictor::LayerKernel;
    use qtts::gguf::GgufFile;
    use qtts::talker::graph::{Layers, State};
    let cfg = common::tiny_talker_256();
    let t = &cfg.tts.talker_config;
    let (n_layer, h) = (t.num_hidden_layers as usize, t.hidden_size as usize);
    let (_tmp, out) = common::random_converted(&cfg, 13, OutType::Q8_0);
    let f = GgufFile::open(&out.talker).unwrap();
    let pool = qtts::ffi::Threadpool::new(2, &[]).unwrap();
    let rows: Vec<f32> = (0..6 * h)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let mut kernels = vec![LayerKernel::Ggml, LayerKernel::Scalar];
    if LayerKernel::fastest() == LayerKernel::Packed {
        kernels.push(LayerKernel::Packed);
    } else {
        eprintln!(
            "packed kernels: skipped, kernel tier {} has none",
            qtts::kernels::active()
        );
    }
    for kernel in kernels {
        let run = |join: bool| {
            let layers = Layers::load_joining(&f, kernel, join).unwrap();
            assert_eq!(layers.joined(), if join { 2 * n_layer } else { 0 });
            let mut state = State::new(&layers, 64, false).unwrap();
            state.run(&rows[..3 * h], 0, &pool).unwrap();
            let mut logits = state.logits().to_vec();
            for p in 3..6 {
                state.run(&rows[p * h..(p + 1) * h], p, &pool).unwrap();
                logits.extend_from_slice(state.logits());
            }
            logits
        };
        let (a, b) = (run(true), run(false));
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{kernel:?}: logits differ by up to {}",
            max_abs(&a, &b)
        );
    }
}
