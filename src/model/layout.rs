//! llama.cpp's Qwen3-TTS GGUF layout: which GGUF tensor comes from which checkpoint tensor.
//!
//! The layout is the one of the llama.cpp vendored by `llama-cpp-sys-2` 0.1.161 (upstream PR 26254):
//! a talker file of architecture `qwen3tts` (`src/models/qwen3vl.cpp`, `src/llama-arch.cpp`) and an
//! `mmproj` file holding the code predictor (`a.gen.code.*`), the decoder (`a.gen.wav.*`) and, for
//! Base models, the speaker encoder (`a.*`, `mm.a.fc.*`) (`tools/mtmd/clip.cpp`, `clip-impl.h`,
//! `models/qwen3tts-gen.cpp`).
//!
//! Shapes are ggml order: a PyTorch `[a, b, c]` tensor is ggml `[c, b, a]` with the same bytes, so
//! every copy is a byte copy; stacks concatenate along the slowest axis. Three transforms happen at
//! conversion, as llama.cpp's own converter does them: the text rows of `token_embd` are the text
//! embedding already passed through `text_projection`; codebooks are `embedding_sum / clamp(usage,
//! 1e-5)`; SnakeBeta parameters are stored as `exp(alpha)` and `1 / (exp(beta) + 1e-9)`.

use super::checkpoint::Spec;
use super::config::{CheckpointConfig, ModelType};
use crate::gguf::GgmlType;

/// How a GGUF tensor's values are computed from the checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// The checkpoint tensor's values, unchanged.
    Copy(String),
    /// Several equal-shape checkpoint tensors, concatenated (PyTorch `torch.stack`).
    Stack(Vec<String>),
    /// Codebooks: `sum / clamp(usage, 1e-5)` for each `(sum, usage)` pair of tensors, stacked.
    Codebooks(Vec<(String, String)>),
    /// SnakeBeta `alpha`, stored as `exp(alpha)`.
    SnakeAlpha(String),
    /// SnakeBeta `beta`, stored as `1 / (exp(beta) + 1e-9)`.
    SnakeBeta(String),
    /// `text_projection(text_embedding)` rows followed by the codec embedding rows.
    TokenEmbd,
}

/// What a tensor is, which decides its storage type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A matrix multiplied by: stored in the requested type.
    Matrix,
    /// A lookup table (the embeddings): rows are gathered, a few a frame, never streamed, so a
    /// coarse type saves file bytes and no time. Stored in the requested type down to q8_0, and
    /// in q8_0 when a k-quant is asked: at q4_K the code predictor's tables had been a fifth of
    /// its logits' error (PERFORMANCE.md, "Lookup tables in q8_0").
    Table,
    /// A norm weight, bias, scale or other 1-D tensor: always f32.
    Vector,
    /// Codebooks and the small speaker encoder: always f32.
    Small,
    /// A stride-1 decoder convolution: f16, or f32 when f32 is requested (ggml's im2col takes
    /// only these kernel types).
    Conv,
    /// A transposed decoder convolution: always f32 (llama.cpp transposes it at run time).
    ConvTranspose,
    /// A weight of the speech tokenizer's encoder (voice cloning; `qtts.enc.*`, read by this
    /// crate only): f16, or f32 when f32 is requested. The released weights are bf16, which f16
    /// holds exactly in its normal range.
    EncoderWeight,
    /// A decoder matrix (a Linear or a 1×1 conv): f16, or f32 when f32 is requested, whatever
    /// the type asked for the talker and the code predictor. The decoder's error is heard as it
    /// is: at q4_K its waveform was 8.5 dB from f32, against 32 dB for bf16 from f16, for 3 % of
    /// the file's bytes (PERFORMANCE.md, "The decoder's matrices in f16 in every file").
    DecoderMatrix,
}

/// One tensor of an output GGUF file.
#[derive(Debug, Clone, PartialEq)]
pub struct OutTensor {
    /// GGUF name.
    pub name: String,
    /// ggml shape.
    pub ne: Vec<u64>,
    /// Where its values come from.
    pub source: Source,
    /// What it is.
    pub role: Role,
}

impl OutTensor {
    /// The storage type of this tensor when `requested` is asked for.
    pub fn storage_type(&self, requested: GgmlType) -> GgmlType {
        match self.role {
            Role::Vector | Role::Small | Role::ConvTranspose => GgmlType::F32,
            Role::Conv | Role::DecoderMatrix | Role::EncoderWeight
                if requested == GgmlType::F32 =>
            {
                GgmlType::F32
            }
            Role::Conv | Role::DecoderMatrix | Role::EncoderWeight => GgmlType::F16,
            Role::Matrix | Role::Table => {
                let coarse = !matches!(requested, GgmlType::F32 | GgmlType::F16);
                let requested = if self.role == Role::Table && coarse {
                    GgmlType::Q8_0
                } else {
                    requested
                };
                // Rows that are not whole blocks fall back to a coarser block, then to f16.
                let fits = |t: GgmlType| self.ne[0].is_multiple_of(t.block_size());
                [requested, GgmlType::Q8_0, GgmlType::F16]
                    .into_iter()
                    .find(|&t| fits(t))
                    .unwrap_or(GgmlType::F32)
            }
        }
    }
}

/// The two output files' tensors, in write order.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The talker GGUF (`qwen3tts`).
    pub talker: Vec<OutTensor>,
    /// The mmproj GGUF (`clip`, `qwen3tts_gen` and `qwen3tts_spkenc`).
    pub mmproj: Vec<OutTensor>,
}

struct Out<'a> {
    list: Vec<OutTensor>,
    specs: &'a [Spec],
}

impl Out<'_> {
    fn shape(&self, hf: &str) -> Vec<u64> {
        // The spec list is derived from the same config, so every name used below is in it.
        let s = self.specs.iter().find(|s| s.name == hf);
        s.map(|s| s.shape.iter().rev().copied().collect())
            .unwrap_or_default()
    }

    fn copy(&mut self, name: impl Into<String>, hf: impl Into<String>, role: Role) {
        let hf = hf.into();
        let mut ne = self.shape(&hf);
        // Squeeze trailing ggml dimensions of 1 from k=1 kernels that llama.cpp reads as matrices.
        if matches!(role, Role::Matrix | Role::DecoderMatrix) {
            while ne.len() > 2 && ne[0] == 1 {
                ne.remove(0);
            }
        }
        self.list.push(OutTensor {
            name: name.into(),
            ne,
            source: Source::Copy(hf),
            role,
        });
    }

    /// One transformer layer: `g.<gguf suffix>` from `h.<checkpoint suffix>` for each table row.
    fn layer(&mut self, g: &str, h: &str, table: &[(&str, &str, Role)]) {
        for (gs, hs, role) in table {
            self.copy(format!("{g}.{gs}"), format!("{h}.{hs}"), *role);
        }
    }

    /// `name.weight` and `name.bias` from `hf.weight` and `hf.bias`.
    fn conv(&mut self, name: &str, hf: &str, role: Role) {
        self.copy(format!("{name}.weight"), format!("{hf}.weight"), role);
        self.copy(format!("{name}.bias"), format!("{hf}.bias"), Role::Vector);
    }

    fn stack(&mut self, name: &str, hf: Vec<String>, role: Role) {
        let mut ne = self.shape(&hf[0]);
        ne.push(hf.len() as u64);
        self.list.push(OutTensor {
            name: name.into(),
            ne,
            source: Source::Stack(hf),
            role,
        });
    }

    fn snake(&mut self, name: &str, hf: &str) {
        let ne = self.shape(&format!("{hf}.alpha"));
        self.list.push(OutTensor {
            name: format!("{name}.alpha"),
            ne: ne.clone(),
            source: Source::SnakeAlpha(format!("{hf}.alpha")),
            role: Role::Vector,
        });
        self.list.push(OutTensor {
            name: format!("{name}.beta"),
            ne,
            source: Source::SnakeBeta(format!("{hf}.beta")),
            role: Role::Vector,
        });
    }

    /// Stacked codebooks from `(embedding sum, usage)` tensor pairs.
    fn codebooks(&mut self, name: &str, pairs: Vec<(String, String)>) {
        let mut ne = self.shape(&pairs[0].0);
        if pairs.len() > 1 {
            ne.push(pairs.len() as u64);
        }
        self.list.push(OutTensor {
            name: name.into(),
            ne,
            source: Source::Codebooks(pairs),
            role: Role::Small,
        });
    }
}

use Role::{DecoderMatrix as D, Matrix as M, Vector as V};

/// A talker layer (`src/llama-arch.cpp` names).
const TALKER_LAYER: &[(&str, &str, Role)] = &[
    ("attn_norm.weight", "input_layernorm.weight", V),
    ("attn_q.weight", "self_attn.q_proj.weight", M),
    ("attn_k.weight", "self_attn.k_proj.weight", M),
    ("attn_v.weight", "self_attn.v_proj.weight", M),
    ("attn_output.weight", "self_attn.o_proj.weight", M),
    ("attn_q_norm.weight", "self_attn.q_norm.weight", V),
    ("attn_k_norm.weight", "self_attn.k_norm.weight", V),
    ("ffn_norm.weight", "post_attention_layernorm.weight", V),
    ("ffn_gate.weight", "mlp.gate_proj.weight", M),
    ("ffn_up.weight", "mlp.up_proj.weight", M),
    ("ffn_down.weight", "mlp.down_proj.weight", M),
];

/// A code-predictor layer (`tools/mtmd/clip-impl.h` names).
const CP_LAYER: &[(&str, &str, Role)] = &[
    ("ln1.weight", "input_layernorm.weight", V),
    ("attn_q.weight", "self_attn.q_proj.weight", M),
    ("attn_q_norm.weight", "self_attn.q_norm.weight", V),
    ("attn_k.weight", "self_attn.k_proj.weight", M),
    ("attn_k_norm.weight", "self_attn.k_norm.weight", V),
    ("attn_v.weight", "self_attn.v_proj.weight", M),
    ("attn_out.weight", "self_attn.o_proj.weight", M),
    ("ln2.weight", "post_attention_layernorm.weight", V),
    ("ffn_gate.weight", "mlp.gate_proj.weight", M),
    ("ffn_up.weight", "mlp.up_proj.weight", M),
    ("ffn_down.weight", "mlp.down_proj.weight", M),
];

/// A decoder transformer layer, with its two LayerScales.
const DECODER_LAYER: &[(&str, &str, Role)] = &[
    ("ln1.weight", "input_layernorm.weight", V),
    ("attn_q.weight", "self_attn.q_proj.weight", D),
    ("attn_k.weight", "self_attn.k_proj.weight", D),
    ("attn_v.weight", "self_attn.v_proj.weight", D),
    ("attn_out.weight", "self_attn.o_proj.weight", D),
    ("ls1.weight", "self_attn_layer_scale.scale", V),
    ("ln2.weight", "post_attention_layernorm.weight", V),
    ("ffn_gate.weight", "mlp.gate_proj.weight", D),
    ("ffn_up.weight", "mlp.up_proj.weight", D),
    ("ffn_down.weight", "mlp.down_proj.weight", D),
    ("ls2.weight", "mlp_layer_scale.scale", V),
];

/// The GGUF layout of a checkpoint with configs `cfg` and tensors `specs`
/// (from [`super::checkpoint::expected_tensors`]).
pub fn layout(cfg: &CheckpointConfig, specs: &[Spec]) -> Layout {
    let t = &cfg.tts.talker_config;
    let cp = &t.code_predictor_config;
    let d = &cfg.speech_tokenizer.decoder_config;
    let n_vocab = t.text_vocab_size as u64 + t.vocab_size as u64;

    let mut o = Out {
        list: Vec::new(),
        specs,
    };
    o.list.push(OutTensor {
        name: "token_embd.weight".into(),
        ne: vec![t.hidden_size as u64, n_vocab],
        source: Source::TokenEmbd,
        role: Role::Table,
    });
    o.copy(
        "output_norm.weight",
        "talker.model.norm.weight",
        Role::Vector,
    );
    o.copy("output.weight", "talker.codec_head.weight", Role::Matrix);
    for i in 0..t.num_hidden_layers {
        o.layer(
            &format!("blk.{i}"),
            &format!("talker.model.layers.{i}"),
            TALKER_LAYER,
        );
    }
    let talker = std::mem::take(&mut o.list);

    // Code predictor.
    let c = "talker.code_predictor";
    if cp.hidden_size != t.hidden_size {
        o.copy(
            "a.gen.code.proj_in.weight",
            format!("{c}.small_to_mtp_projection.weight"),
            Role::Matrix,
        );
        o.copy(
            "a.gen.code.proj_in.bias",
            format!("{c}.small_to_mtp_projection.bias"),
            Role::Vector,
        );
    }
    let groups = t.num_code_groups - 1;
    let embd = (0..groups)
        .map(|g| format!("{c}.model.codec_embedding.{g}.weight"))
        .collect();
    o.stack("a.gen.code.embd.weight", embd, Role::Table);
    let heads = (0..groups)
        .map(|g| format!("{c}.lm_head.{g}.weight"))
        .collect();
    o.stack("a.gen.code.head.weight", heads, Role::Matrix);
    o.copy(
        "a.gen.code.out_embd.weight",
        "talker.model.codec_embedding.weight",
        Role::Table,
    );
    o.copy(
        "a.gen.code.output_norm.weight",
        format!("{c}.model.norm.weight"),
        Role::Vector,
    );
    for l in 0..cp.num_hidden_layers {
        o.layer(
            &format!("a.gen.code.blk.{l}"),
            &format!("{c}.model.layers.{l}"),
            CP_LAYER,
        );
    }

    // Decoder (code2wav).
    let q = "decoder.quantizer";
    let n_sem = d.num_semantic_quantizers;
    for (g, h, n) in [
        ("first", "rvq_first", n_sem),
        ("rest", "rvq_rest", d.num_quantizers - n_sem),
    ] {
        let w = format!("a.gen.wav.quant.{g}");
        o.copy(
            format!("{w}.in_proj.weight"),
            format!("{q}.{h}.input_proj.weight"),
            Role::DecoderMatrix,
        );
        o.copy(
            format!("{w}.out_proj.weight"),
            format!("{q}.{h}.output_proj.weight"),
            Role::DecoderMatrix,
        );
        let pairs = (0..n)
            .map(|k| {
                let p = format!("{q}.{h}.vq.layers.{k}._codebook");
                (format!("{p}.embedding_sum"), format!("{p}.cluster_usage"))
            })
            .collect();
        o.codebooks(&format!("{w}.codebook.weight"), pairs);
    }
    o.conv("a.gen.wav.pre_conv", "decoder.pre_conv.conv", Role::Conv);
    let p = "decoder.pre_transformer";
    o.conv(
        "a.gen.wav.tfm.in_proj",
        &format!("{p}.input_proj"),
        Role::DecoderMatrix,
    );
    o.conv(
        "a.gen.wav.tfm.out_proj",
        &format!("{p}.output_proj"),
        Role::DecoderMatrix,
    );
    o.copy(
        "a.gen.wav.tfm.output_norm.weight",
        format!("{p}.norm.weight"),
        Role::Vector,
    );
    for i in 0..d.num_hidden_layers {
        o.layer(
            &format!("a.gen.wav.tfm.blk.{i}"),
            &format!("{p}.layers.{i}"),
            DECODER_LAYER,
        );
    }
    for u in 0..d.upsampling_ratios.len() {
        let (g, h) = (
            format!("a.gen.wav.up.blk.{u}"),
            format!("decoder.upsample.{u}"),
        );
        o.conv(
            &format!("{g}.conv"),
            &format!("{h}.0.conv"),
            Role::ConvTranspose,
        );
        o.conv(
            &format!("{g}.dwconv"),
            &format!("{h}.1.dwconv.conv"),
            Role::Conv,
        );
        o.conv(&format!("{g}.norm"), &format!("{h}.1.norm"), Role::Vector);
        o.conv(
            &format!("{g}.pw1"),
            &format!("{h}.1.pwconv1"),
            Role::DecoderMatrix,
        );
        o.conv(
            &format!("{g}.pw2"),
            &format!("{h}.1.pwconv2"),
            Role::DecoderMatrix,
        );
        o.copy(format!("{g}.gamma"), format!("{h}.1.gamma"), Role::Vector);
    }
    o.conv("a.gen.wav.dac.entry", "decoder.decoder.0.conv", Role::Conv);
    for b in 0..d.upsample_rates.len() {
        let (g, h) = (
            format!("a.gen.wav.dac.blk.{b}"),
            format!("decoder.decoder.{}.block", b + 1),
        );
        o.snake(&format!("{g}.snake"), &format!("{h}.0"));
        o.conv(
            &format!("{g}.conv"),
            &format!("{h}.1.conv"),
            Role::ConvTranspose,
        );
        for j in 0..3 {
            let (gr, hr) = (format!("{g}.res.{j}"), format!("{h}.{}", j + 2));
            o.snake(&format!("{gr}.act1"), &format!("{hr}.act1"));
            o.conv(
                &format!("{gr}.conv1"),
                &format!("{hr}.conv1.conv"),
                Role::Conv,
            );
            o.snake(&format!("{gr}.act2"), &format!("{hr}.act2"));
            o.conv(
                &format!("{gr}.conv2"),
                &format!("{hr}.conv2.conv"),
                Role::Conv,
            );
        }
    }
    let n = d.upsample_rates.len() + 1;
    o.snake("a.gen.wav.dac.post_snake", &format!("decoder.decoder.{n}"));
    o.conv(
        "a.gen.wav.dac.post_conv",
        &format!("decoder.decoder.{}.conv", n + 1),
        Role::Conv,
    );

    // Speaker encoder (Base models).
    if cfg.tts.tts_model_type == ModelType::Base && cfg.tts.speaker_encoder_config.enc_dim.is_some()
    {
        let s = "speaker_encoder";
        o.conv("a.conv1d.0", &format!("{s}.blocks.0.conv"), Role::Small);
        for b in 1..4 {
            let (g, h) = (format!("a.blk.{b}"), format!("{s}.blocks.{b}"));
            o.conv(
                &format!("{g}.conv_pw1"),
                &format!("{h}.tdnn1.conv"),
                Role::Small,
            );
            for x in 0..7 {
                o.conv(
                    &format!("{g}.res2.{x}"),
                    &format!("{h}.res2net_block.blocks.{x}.conv"),
                    Role::Small,
                );
            }
            o.conv(
                &format!("{g}.conv_pw2"),
                &format!("{h}.tdnn2.conv"),
                Role::Small,
            );
            o.conv(
                &format!("{g}.se_conv1"),
                &format!("{h}.se_block.conv1"),
                Role::Small,
            );
            o.conv(
                &format!("{g}.se_conv2"),
                &format!("{h}.se_block.conv2"),
                Role::Small,
            );
        }
        o.conv("a.conv_out", &format!("{s}.mfa.conv"), Role::Small);
        o.conv("a.asp_tdnn", &format!("{s}.asp.tdnn.conv"), Role::Small);
        o.conv("a.asp_attn", &format!("{s}.asp.conv"), Role::Small);
        o.conv("mm.a.fc", &format!("{s}.fc"), Role::Small);
    }
    // The speech tokenizer's encoder (Base models), under a prefix llama.cpp does not read.
    if cfg.tts.tts_model_type == ModelType::Base {
        if let Some(e) = &cfg.speech_tokenizer.encoder_config {
            codec_encoder(&mut o, e);
        }
    }
    Layout {
        talker,
        mmproj: o.list,
    }
}

/// Prefix of the speech tokenizer's encoder in the mmproj (voice cloning, `crate::voice`).
pub const ENCODER_PREFIX: &str = "qtts.enc";

/// The codec encoder's tensors (`checkpoint::codec_encoder_tensors`): SEANet convs
/// `qtts.enc.conv.{i}` and residual units `qtts.enc.res.{i}.{c1,c2}` (i: the checkpoint's layer
/// index), transformer layers `qtts.enc.blk.{l}.*`, `qtts.enc.down`, and per RVQ half
/// (`sem`, `ac`) its input projection and its codebooks as `E = sum / clamp(usage, 1e-5)`.
fn codec_encoder(o: &mut Out<'_>, e: &super::config::EncoderConfig) {
    let (g, h) = (ENCODER_PREFIX, "encoder.encoder.layers");
    let w = Role::EncoderWeight;
    o.conv(&format!("{g}.conv.0"), &format!("{h}.0.conv"), w);
    let mut i = 1;
    for _ in &e.upsampling_ratios {
        o.conv(
            &format!("{g}.res.{i}.c1"),
            &format!("{h}.{i}.block.1.conv"),
            w,
        );
        o.conv(
            &format!("{g}.res.{i}.c2"),
            &format!("{h}.{i}.block.3.conv"),
            w,
        );
        o.conv(
            &format!("{g}.conv.{}", i + 2),
            &format!("{h}.{}.conv", i + 2),
            w,
        );
        i += 3;
    }
    o.conv(
        &format!("{g}.conv.{}", i + 1),
        &format!("{h}.{}.conv", i + 1),
        w,
    );
    for l in 0..e.num_hidden_layers {
        let (b, t) = (
            format!("{g}.blk.{l}"),
            format!("encoder.encoder_transformer.layers.{l}"),
        );
        for (gn, hn) in [
            ("ln1", "input_layernorm"),
            ("ln2", "post_attention_layernorm"),
        ] {
            o.copy(
                format!("{b}.{gn}.weight"),
                format!("{t}.{hn}.weight"),
                Role::Vector,
            );
            o.copy(
                format!("{b}.{gn}.bias"),
                format!("{t}.{hn}.bias"),
                Role::Vector,
            );
        }
        for (gn, hn) in [
            ("attn_q", "self_attn.q_proj"),
            ("attn_k", "self_attn.k_proj"),
            ("attn_v", "self_attn.v_proj"),
            ("attn_out", "self_attn.o_proj"),
            ("fc1", "mlp.fc1"),
            ("fc2", "mlp.fc2"),
        ] {
            o.copy(format!("{b}.{gn}.weight"), format!("{t}.{hn}.weight"), w);
        }
        o.copy(
            format!("{b}.attn_scale"),
            format!("{t}.self_attn_layer_scale.scale"),
            Role::Vector,
        );
        o.copy(
            format!("{b}.mlp_scale"),
            format!("{t}.mlp_layer_scale.scale"),
            Role::Vector,
        );
    }
    o.copy(
        format!("{g}.down.weight"),
        "encoder.downsample.conv.weight",
        w,
    );
    for (gn, rvq, n) in [("sem", "semantic", 1), ("ac", "acoustic", 15)] {
        let q = format!("encoder.quantizer.{rvq}_residual_vector_quantizer");
        o.copy(
            format!("{g}.{gn}.proj.weight"),
            format!("{q}.input_proj.weight"),
            w,
        );
        let pairs = (0..n)
            .map(|k| {
                let p = format!("{q}.layers.{k}.codebook");
                (format!("{p}.embed_sum"), format!("{p}.cluster_usage"))
            })
            .collect();
        o.codebooks(&format!("{g}.{gn}.codebook"), pairs);
    }
}
