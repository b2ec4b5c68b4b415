//! The cost of the Rust GGUF gate on a full-size 0.6B talker header (155,008 tokens, 151,387
//! merges, 311 tensors at q4_K; tensor data sparse), against llama.cpp's own GGUF parser
//! (`gguf_init_from_file`, metadata only) on the same file, measured in the same run.
//!
//! Run with: `cargo bench --bench gguf_gate`. The figure is the ratio gate / llama.cpp.

use std::ffi::CString;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use qtts::gguf::{Array, GgmlType, Plan, Value};

fn write_talker_like(path: &Path) {
    let (h, layers, ff, heads, kv, hd) = (1024u64, 28u32, 3072u64, 16u64, 8u64, 128u64);
    let n_text = 151_936usize;
    let mut tokens: Vec<String> = (0..n_text).map(|i| format!("tok{i}")).collect();
    for (i, s) in [
        "<|im_start|>",
        "<|im_end|>",
        "<tts_pad>",
        "<tts_text_bos>",
        "<tts_text_eod>",
    ]
    .iter()
    .enumerate()
    {
        tokens[151_644 + i] = s.to_string();
    }
    let mut names = std::collections::HashMap::from([
        (2148, "<|codec_pad|>"),
        (2149, "<|codec_bos|>"),
        (2150, "<|codec_eos_token|>"),
    ]);
    for c in 0..3072u32 {
        tokens.push(
            names
                .remove(&c)
                .map_or_else(|| format!("<|codec_{c}|>"), str::to_owned),
        );
    }
    let n_vocab = tokens.len() as u64;
    let mut p = Plan::default();
    p.set("general.architecture", Value::Str("qwen3tts".into()));
    for (k, v) in [
        ("context_length", 32768),
        ("embedding_length", h as u32),
        ("block_count", layers),
        ("feed_forward_length", ff as u32),
        ("attention.head_count", heads as u32),
        ("attention.head_count_kv", kv as u32),
        ("attention.key_length", hd as u32),
        ("attention.value_length", hd as u32),
    ] {
        p.set(format!("qwen3tts.{k}"), Value::U32(v));
    }
    p.set(
        "qwen3tts.attention.layer_norm_rms_epsilon",
        Value::F32(1e-6),
    );
    p.set("qwen3tts.rope.freq_base", Value::F32(1e6));
    p.set(
        "qwen3tts.rope.dimension_sections",
        Value::Array(Array::I32(vec![24, 20, 20, 0])),
    );
    p.set("tokenizer.ggml.model", Value::Str("gpt2".into()));
    p.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vec![1; tokens.len()])),
    );
    p.set("tokenizer.ggml.tokens", Value::Array(Array::Str(tokens)));
    p.set(
        "tokenizer.ggml.merges",
        Value::Array(Array::Str(
            (0..151_387).map(|i| format!("m{i} x")).collect(),
        )),
    );
    let q = GgmlType::Q4K;
    p.add_tensor("token_embd.weight", vec![h, n_vocab], q);
    p.add_tensor("output_norm.weight", vec![h], GgmlType::F32);
    p.add_tensor("output.weight", vec![h, 3072], q);
    for i in 0..layers {
        for (n, ne, t) in [
            ("attn_norm", vec![h], GgmlType::F32),
            ("attn_q", vec![h, heads * hd], q),
            ("attn_k", vec![h, kv * hd], q),
            ("attn_v", vec![h, kv * hd], q),
            ("attn_output", vec![heads * hd, h], q),
            ("attn_q_norm", vec![hd], GgmlType::F32),
            ("attn_k_norm", vec![hd], GgmlType::F32),
            ("ffn_norm", vec![h], GgmlType::F32),
            ("ffn_gate", vec![h, ff], q),
            ("ffn_up", vec![h, ff], q),
            ("ffn_down", vec![ff, h], q),
        ] {
            p.add_tensor(format!("blk.{i}.{n}.weight"), ne, t);
        }
    }
    let (header, infos) = qtts::gguf::encode_header(&p, 32).unwrap();
    let last = infos.last().unwrap();
    let len = header.len() as u64 + last.offset + last.nbytes;
    std::fs::write(path, &header).unwrap();
    // Sparse tensor data: the gate reads the header and checks sizes against the file length.
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("talker.gguf");
    write_talker_like(&path);
    qtts::model::validate::talker_file(&path).expect("the synthetic talker passes the gate");
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let mut g = c.benchmark_group("talker header 0.6B");
    g.sample_size(20);
    g.bench_function("llama.cpp gguf_init_from_file (baseline)", |b| {
        b.iter(|| {
            // SAFETY: a valid path; no_alloc keeps the parse to metadata; the context is freed.
            unsafe {
                let params = llama_cpp_sys_2::gguf_init_params {
                    no_alloc: true,
                    ctx: std::ptr::null_mut(),
                };
                let ctx = llama_cpp_sys_2::gguf_init_from_file(cpath.as_ptr(), params);
                assert!(!ctx.is_null());
                llama_cpp_sys_2::gguf_free(ctx);
            }
        })
    });
    g.bench_function("qtts gate: parse + Qwen3-TTS checks", |b| {
        b.iter(|| qtts::model::validate::talker_file(&path).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
