//! `qtts convert` on the oracle's tiny checkpoints: llama.cpp accepts the files, and every tensor
//! read back equals its source (bit for bit at f32; the projected text rows within 1e-5 of an f64
//! reference computed here from the checkpoint).

use crate::common;

use common::bits;

use std::collections::HashMap;

use qtts::gguf::{GgmlType, GgufFile};
use qtts::model::convert::{convert, OutType};

fn read_safetensors(path: &std::path::Path) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            assert_eq!(v.dtype(), safetensors::Dtype::F32);
            let f = v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (n, f)
        })
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn f32_conversion_reads_back_exactly() {
    for name in ["tiny", "tiny17"] {
        let (_tmp, out) = common::convert_tiny(name, OutType::F32);
        let dir = common::fixture(name).join("model");
        let mut src = read_safetensors(&dir.join("model.safetensors"));
        src.extend(read_safetensors(
            &dir.join("speech_tokenizer/model.safetensors"),
        ));
        let talker = GgufFile::open(&out.talker).unwrap();
        let mmproj = GgufFile::open(&out.mmproj).unwrap();
        let get = |f: &GgufFile, n: &str| {
            let t = f
                .header
                .tensor(n)
                .unwrap_or_else(|| panic!("{name}: no {n}"));
            assert_eq!(t.ty, GgmlType::F32, "{name}: {n}");
            f32s(f.tensor_data(n).unwrap())
        };
        // Plain copies, a sample from every part of both files.
        for (gg, hf) in [
            ("output.weight", "talker.codec_head.weight"),
            (
                "blk.1.attn_q.weight",
                "talker.model.layers.1.self_attn.q_proj.weight",
            ),
            (
                "blk.0.ffn_down.weight",
                "talker.model.layers.0.mlp.down_proj.weight",
            ),
            (
                "blk.1.attn_k_norm.weight",
                "talker.model.layers.1.self_attn.k_norm.weight",
            ),
        ] {
            assert_eq!(bits(&get(&talker, gg)), bits(&src[hf]), "{name}: {gg}");
        }
        for (gg, hf) in [
            (
                "a.gen.code.out_embd.weight",
                "talker.model.codec_embedding.weight",
            ),
            (
                "a.gen.code.blk.1.attn_out.weight",
                "talker.code_predictor.model.layers.1.self_attn.o_proj.weight",
            ),
            ("a.gen.wav.pre_conv.weight", "decoder.pre_conv.conv.weight"),
            (
                "a.gen.wav.tfm.blk.1.ls2.weight",
                "decoder.pre_transformer.layers.1.mlp_layer_scale.scale",
            ),
            (
                "a.gen.wav.up.blk.1.conv.weight",
                "decoder.upsample.1.0.conv.weight",
            ),
            ("a.gen.wav.up.blk.0.gamma", "decoder.upsample.0.1.gamma"),
            (
                "a.gen.wav.dac.blk.3.conv.weight",
                "decoder.decoder.4.block.1.conv.weight",
            ),
            (
                "a.gen.wav.dac.blk.2.res.1.conv1.weight",
                "decoder.decoder.3.block.3.conv1.conv.weight",
            ),
            (
                "a.gen.wav.dac.post_conv.weight",
                "decoder.decoder.6.conv.weight",
            ),
            (
                "a.gen.wav.quant.rest.out_proj.weight",
                "decoder.quantizer.rvq_rest.output_proj.weight",
            ),
        ] {
            assert_eq!(bits(&get(&mmproj, gg)), bits(&src[hf]), "{name}: {gg}");
        }
        // Every tensor of both files against its source, by the layout's mapping; the values are
        // computed here from the safetensors, independently of the converter.
        use qtts::model::layout::Source;
        let ckpt = qtts::model::checkpoint::Checkpoint::open(&dir).unwrap();
        let lay = qtts::model::layout::layout(&ckpt.config, ckpt.specs());
        let mut checked = 0;
        for (file, list) in [(&talker, &lay.talker), (&mmproj, &lay.mmproj)] {
            assert_eq!(file.header.tensors.len(), list.len(), "{name}");
            for t in list {
                let expect: Vec<f32> = match &t.source {
                    Source::Copy(hf) => src[hf].clone(),
                    Source::Stack(hfs) => hfs.iter().flat_map(|h| src[h].clone()).collect(),
                    Source::Codebooks(ps) => ps
                        .iter()
                        .flat_map(|(sum, usage)| {
                            let (sum, usage) = (&src[sum], &src[usage]);
                            let dim = sum.len() / usage.len();
                            (0..sum.len())
                                .map(move |i| sum[i] / usage[i / dim].max(1e-5))
                                .collect::<Vec<_>>()
                        })
                        .collect(),
                    Source::SnakeAlpha(hf) => src[hf].iter().map(|x| x.exp()).collect(),
                    Source::SnakeBeta(hf) => {
                        src[hf].iter().map(|x| 1.0 / (x.exp() + 1e-9)).collect()
                    }
                    Source::TokenEmbd => continue,
                };
                assert_eq!(
                    bits(&get(file, &t.name)),
                    bits(&expect),
                    "{name}: {}",
                    t.name
                );
                checked += 1;
            }
        }
        assert_eq!(
            checked,
            talker.header.tensors.len() + mmproj.header.tensors.len() - 1
        );
        // Stacks: slice g is source g.
        let head = get(&mmproj, "a.gen.code.head.weight");
        let embd = get(&mmproj, "a.gen.code.embd.weight");
        for g in 0..15 {
            let h = &src[&format!("talker.code_predictor.lm_head.{g}.weight")];
            assert_eq!(
                bits(&head[g * h.len()..(g + 1) * h.len()]),
                bits(h),
                "{name}: head {g}"
            );
            let e = &src[&format!("talker.code_predictor.model.codec_embedding.{g}.weight")];
            assert_eq!(
                bits(&embd[g * e.len()..(g + 1) * e.len()]),
                bits(e),
                "{name}: embd {g}"
            );
        }
        // Codebooks: embedding_sum / clamp(cluster_usage, 1e-5), row by row.
        let rest = get(&mmproj, "a.gen.wav.quant.rest.codebook.weight");
        for k in 0..15 {
            let p = format!("decoder.quantizer.rvq_rest.vq.layers.{k}._codebook");
            let (sum, usage) = (
                &src[&format!("{p}.embedding_sum")],
                &src[&format!("{p}.cluster_usage")],
            );
            let dim = sum.len() / usage.len();
            let expect: Vec<f32> = (0..sum.len())
                .map(|i| sum[i] / usage[i / dim].max(1e-5))
                .collect();
            assert_eq!(
                bits(&rest[k * sum.len()..(k + 1) * sum.len()]),
                bits(&expect),
                "{name}: codebook {k}"
            );
        }
        // SnakeBeta parameters: exp(alpha), 1 / (exp(beta) + 1e-9).
        let a = &src["decoder.decoder.2.block.0.alpha"];
        let b = &src["decoder.decoder.2.block.0.beta"];
        let ea: Vec<f32> = a.iter().map(|x| x.exp()).collect();
        let eb: Vec<f32> = b.iter().map(|x| 1.0 / (x.exp() + 1e-9)).collect();
        assert_eq!(
            bits(&get(&mmproj, "a.gen.wav.dac.blk.1.snake.alpha")),
            bits(&ea)
        );
        assert_eq!(
            bits(&get(&mmproj, "a.gen.wav.dac.blk.1.snake.beta")),
            bits(&eb)
        );
        // 1.7B-like: the projection into the narrower code predictor.
        assert_eq!(
            mmproj.header.tensor("a.gen.code.proj_in.weight").is_some(),
            name == "tiny17"
        );
        // Token embedding: projected text rows, then the codec rows unchanged.
        let te = get(&talker, "token_embd.weight");
        let emb = &src["talker.model.text_embedding.weight"];
        let (w1, b1) = (
            &src["talker.text_projection.linear_fc1.weight"],
            &src["talker.text_projection.linear_fc1.bias"],
        );
        let (w2, b2) = (
            &src["talker.text_projection.linear_fc2.weight"],
            &src["talker.text_projection.linear_fc2.bias"],
        );
        let (th, h) = (b1.len(), b2.len());
        let n_text = emb.len() / th;
        let mut max_err = 0f64;
        for r in 0..n_text {
            let x = &emb[r * th..(r + 1) * th];
            let hid: Vec<f64> = (0..th)
                .map(|o| {
                    let z = b1[o] as f64
                        + (0..th)
                            .map(|i| w1[o * th + i] as f64 * x[i] as f64)
                            .sum::<f64>();
                    z / (1.0 + (-z).exp())
                })
                .collect();
            for o in 0..h {
                let y = b2[o] as f64 + (0..th).map(|i| w2[o * th + i] as f64 * hid[i]).sum::<f64>();
                max_err = max_err.max((y - te[r * h + o] as f64).abs());
            }
        }
        assert!(
            max_err < 1e-5,
            "{name}: projected text rows off by {max_err}"
        );
        let codec = &src["talker.model.codec_embedding.weight"];
        assert_eq!(bits(&te[n_text * h..]), bits(codec), "{name}: codec rows");
    }
}

#[test]
fn llama_cpp_loads_the_converted_talker() {
    for (name, ty) in [
        ("tiny", OutType::F32),
        ("tiny17", OutType::F16),
        ("tiny", OutType::Q8_0),
        ("tiny17", OutType::Q4K),
    ] {
        let (_tmp, out) = common::convert_tiny(name, ty);
        let model =
            qtts::ffi::LlamaModel::load(&qtts::model::validate::talker(&out.talker).unwrap())
                .unwrap();
        assert_eq!(model.n_embd(), 64, "{name} {ty:?}");
        assert_eq!(model.n_layer(), 2, "{name} {ty:?}");
        assert_eq!(model.n_vocab(), 1024 + 3072, "{name} {ty:?}");
        qtts::model::validate::mmproj_file(&out.mmproj).unwrap();
    }
}

#[test]
fn storage_types_follow_the_roles() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::Q8_0);
    let f = GgufFile::open(&out.mmproj).unwrap();
    let ty = |n: &str| f.header.tensor(n).unwrap().ty;
    assert_eq!(ty("a.gen.code.head.weight"), GgmlType::Q8_0);
    assert_eq!(ty("a.gen.code.output_norm.weight"), GgmlType::F32);
    assert_eq!(ty("a.gen.wav.quant.rest.codebook.weight"), GgmlType::F32);
    assert_eq!(ty("a.gen.wav.pre_conv.weight"), GgmlType::F16);
    assert_eq!(ty("a.gen.wav.up.blk.0.conv.weight"), GgmlType::F32);
    assert_eq!(ty("a.gen.wav.dac.blk.0.snake.alpha"), GgmlType::F32);
    // The decoder's matrices are f16 whatever the type asked for.
    for n in [
        "a.gen.wav.quant.first.out_proj.weight",
        "a.gen.wav.tfm.in_proj.weight",
        "a.gen.wav.tfm.blk.0.attn_q.weight",
        "a.gen.wav.tfm.blk.0.ffn_down.weight",
        "a.gen.wav.up.blk.1.pw2.weight",
    ] {
        assert_eq!(ty(n), GgmlType::F16, "{n}");
    }
    // q4_K needs rows of 256: the tiny model's rows of 64 fall back to q8_0.
    let (_tmp, out) = common::convert_tiny("tiny", OutType::Q4K);
    let f = GgufFile::open(&out.talker).unwrap();
    assert_eq!(
        f.header.tensor("blk.0.attn_q.weight").unwrap().ty,
        GgmlType::Q8_0
    );
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let f = GgufFile::open(&out.mmproj).unwrap();
    assert_eq!(
        f.header
            .tensor("a.gen.wav.tfm.blk.0.attn_q.weight")
            .unwrap()
            .ty,
        GgmlType::F32
    );
}

/// On a model whose rows are whole q4_K blocks (256): a k-quant file stores its matrices in its
/// type and its lookup tables (the talker's token embedding, the code predictor's codec
/// embeddings and its copy of the talker's) in q8_0 (`Role::Table`); q8_0, f16 and f32 files
/// store the tables in their own type.
#[test]
fn k_quant_files_keep_their_tables_in_q8_0() {
    let mut cfg = common::tiny_talker_256();
    let t = &mut cfg.tts.talker_config;
    let cp = &mut t.code_predictor_config;
    (cp.hidden_size, cp.intermediate_size, cp.head_dim) = (256, 512, 64);
    let tables = [
        "token_embd.weight",
        "a.gen.code.embd.weight",
        "a.gen.code.out_embd.weight",
    ];
    let matrices = [
        "output.weight",
        "blk.1.attn_v.weight",
        "blk.1.ffn_down.weight",
        "a.gen.code.head.weight",
        "a.gen.code.blk.0.attn_q.weight",
        "a.gen.code.blk.0.ffn_gate.weight",
    ];
    for (ty, table, matrix) in [
        (OutType::Q4K, GgmlType::Q8_0, GgmlType::Q4K),
        (OutType::Q5K, GgmlType::Q8_0, GgmlType::Q5K),
        (OutType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0),
        (OutType::F16, GgmlType::F16, GgmlType::F16),
    ] {
        let (_tmp, out) = common::random_converted(&cfg, 3, ty);
        let talker = GgufFile::open(&out.talker).unwrap();
        let mmproj = GgufFile::open(&out.mmproj).unwrap();
        let ty_of = |n: &str| {
            let f = if n.starts_with("a.gen.") {
                &mmproj
            } else {
                &talker
            };
            f.header.tensor(n).unwrap().ty
        };
        for n in tables {
            assert_eq!(ty_of(n), table, "{ty:?} {n}");
        }
        for n in matrices {
            assert_eq!(ty_of(n), matrix, "{ty:?} {n}");
        }
        qtts::model::validate::mmproj_file(&out.mmproj).unwrap();
    }
}

#[test]
fn failed_conversion_leaves_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    // No tokenizer files: refused before anything is written.
    let model = common::fixture("tiny").join("model");
    let out = tmp.path().join("out");
    let err = convert(&model, None, &out, OutType::F32, &mut |_, _| {}).unwrap_err();
    assert!(
        matches!(err, qtts::ModelError::Io { ref path, .. } if path.ends_with("vocab.json")),
        "{err:?}"
    );
    let left: Vec<_> = std::fs::read_dir(&out)
        .map(|d| d.count())
        .into_iter()
        .collect();
    assert!(left.is_empty() || left == [0], "files left: {left:?}");
}

/// A Base checkpoint small in every width that llama.cpp reads from tensors, but with the counts
/// llama.cpp's mmproj loader hard-codes (8 decoder layers of 16 heads, 3 speaker-encoder blocks):
/// both of llama.cpp's own loaders accept what `convert` writes from it.
#[test]
fn llama_cpp_and_mtmd_load_a_converted_base_model() {
    let mut cfg = common::tiny_talker(qtts::model::config::Preset::Small06Base);
    let d = &mut cfg.speech_tokenizer.decoder_config;
    (d.codebook_dim, d.latent_dim, d.decoder_dim, d.hidden_size) = (16, 48, 64, 32);
    (d.intermediate_size, d.head_dim) = (64, 4);

    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("tokenizer");
    common::tiny_tokenizer(&tok);
    let ckpt = tmp.path().join("ckpt");
    qtts::model::random::write_random_checkpoint_with(&cfg, 7, &tok, &ckpt, &mut |_, _| {})
        .unwrap();
    for ty in [OutType::F32, OutType::Q8_0] {
        let out = convert(&ckpt, None, &tmp.path().join(ty.name()), ty, &mut |_, _| {}).unwrap();
        let talker =
            qtts::ffi::LlamaModel::load(&qtts::model::validate::talker(&out.talker).unwrap())
                .unwrap();
        assert_eq!((talker.n_embd(), talker.n_vocab()), (64, 1024 + 3072));
        qtts::ffi::Mmproj::load(
            &qtts::model::validate::mmproj(&out.mmproj).unwrap(),
            &talker,
            1,
        )
        .unwrap();
    }
}
