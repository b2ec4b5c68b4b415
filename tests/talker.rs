//! The talker through llama.cpp (`qwen3tts`, fed input embeddings with IMROPE positions) against
//! the oracle's `talker_forward` (tiny, tiny17): final-normed hidden states and codec logits of
//! every position within 1e-4.

mod common;

use common::max_abs;
use qtts::ffi::{EmbdBatch, LlamaContext, LlamaModel};
use qtts::model::convert::OutType;

#[test]
fn talker_forward_matches_the_oracle() {
    for name in ["tiny", "tiny17"] {
        let (_tmp, out) = common::convert_tiny(name, OutType::F32);
        let model = LlamaModel::load(&out.talker).unwrap();
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
    let model = LlamaModel::load(&out.talker).unwrap();
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
        let model = LlamaModel::load(&out.talker).unwrap();
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
