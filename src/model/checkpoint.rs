//! The official Hugging Face checkpoint: which tensors it holds, with which shapes, and reading them.
//!
//! Model: Qwen3-TTS-12Hz, reference implementation PyPI `qwen-tts` 0.1.1
//! (`qwen_tts/core/models/modeling_qwen3_tts.py`, `core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`).
//! Names follow the PyTorch module tree; shapes are PyTorch order (`[out, in]` for Linear,
//! `[out, in, k]` for Conv1d, `[in, out, k]` for ConvTranspose1d).
//!
//! [`expected_tensors`] is derived from the configs alone, so a checkpoint whose files disagree with
//! its `config.json` is refused by [`Checkpoint::open`] before anything is converted.
//! The speech tokenizer's encoder (`encoder.*`, Mimi) is not listed: the engine does not use it
//! (voice cloning with reference codes is a later stage).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use safetensors::tensor::Dtype;

use super::config::{CheckpointConfig, EncoderConfig, ModelType, SpeakerEncoderConfig};
use crate::error::ModelError;

/// How a tensor is initialised by `qtts random-model` (the oracle's scheme, see
/// [`crate::model::random`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// N(0, 1) / sqrt(fan_in): Linear and Conv weights.
    FanIn(u64),
    /// 0.1 · N(0, 1): biases.
    Bias,
    /// N(0, 1): embeddings and codebook sums.
    Normal,
    /// 1 + 0.1 · N(0, 1): norms.
    Norm,
    /// 0.2 · N(0, 1): SnakeBeta log-parameters.
    Snake,
    /// U(0.5, 2): codebook usage counts.
    Usage,
    /// U(0.5, 1): LayerScale and ConvNeXt gamma.
    Scale,
}

/// One tensor of a checkpoint file.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Which file: `model.safetensors` or `speech_tokenizer/model.safetensors`.
    pub file: CheckpointFile,
    /// PyTorch name.
    pub name: String,
    /// PyTorch shape.
    pub shape: Vec<u64>,
    /// Random initialisation.
    pub init: Init,
}

/// The two weight files of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckpointFile {
    /// `model.safetensors`: talker and code predictor.
    Talker,
    /// `speech_tokenizer/model.safetensors`: the codec.
    SpeechTokenizer,
}

impl CheckpointFile {
    /// The path relative to the checkpoint directory.
    pub fn rel_path(self) -> &'static str {
        match self {
            CheckpointFile::Talker => "model.safetensors",
            CheckpointFile::SpeechTokenizer => "speech_tokenizer/model.safetensors",
        }
    }
}

struct Specs(Vec<Spec>, CheckpointFile);

impl Specs {
    fn add(&mut self, name: impl Into<String>, shape: &[u64], init: Init) {
        self.0.push(Spec {
            file: self.1,
            name: name.into(),
            shape: shape.to_vec(),
            init,
        });
    }

    fn linear(&mut self, name: &str, out: u64, inp: u64, bias: bool) {
        self.add(format!("{name}.weight"), &[out, inp], Init::FanIn(inp));
        if bias {
            self.add(format!("{name}.bias"), &[out], Init::Bias);
        }
    }

    fn conv(&mut self, name: &str, out: u64, inp: u64, k: u64) {
        self.add(
            format!("{name}.weight"),
            &[out, inp, k],
            Init::FanIn(inp * k),
        );
        self.add(format!("{name}.bias"), &[out], Init::Bias);
    }

    fn snake(&mut self, name: &str, c: u64) {
        self.add(format!("{name}.alpha"), &[c], Init::Snake);
        self.add(format!("{name}.beta"), &[c], Init::Snake);
    }

    /// A Qwen3 decoder layer: pre-RMSNorm attention with per-head q/k norms, then SwiGLU.
    fn qwen3_layer(&mut self, p: &str, h: u64, heads: u64, kv: u64, hd: u64, inter: u64) {
        self.add(format!("{p}.input_layernorm.weight"), &[h], Init::Norm);
        self.add(
            format!("{p}.post_attention_layernorm.weight"),
            &[h],
            Init::Norm,
        );
        self.linear(&format!("{p}.self_attn.q_proj"), heads * hd, h, false);
        self.linear(&format!("{p}.self_attn.k_proj"), kv * hd, h, false);
        self.linear(&format!("{p}.self_attn.v_proj"), kv * hd, h, false);
        self.linear(&format!("{p}.self_attn.o_proj"), h, heads * hd, false);
        self.add(format!("{p}.self_attn.q_norm.weight"), &[hd], Init::Norm);
        self.add(format!("{p}.self_attn.k_norm.weight"), &[hd], Init::Norm);
        self.linear(&format!("{p}.mlp.gate_proj"), inter, h, false);
        self.linear(&format!("{p}.mlp.up_proj"), inter, h, false);
        self.linear(&format!("{p}.mlp.down_proj"), h, inter, false);
    }
}

/// Every tensor the engine reads from a checkpoint with configs `cfg`, in a fixed order.
pub fn expected_tensors(cfg: &CheckpointConfig) -> Vec<Spec> {
    let t = &cfg.tts.talker_config;
    let cp = &t.code_predictor_config;
    let (h, hc) = (t.hidden_size as u64, cp.hidden_size as u64);
    let (tv, th) = (t.text_vocab_size as u64, t.text_hidden_size as u64);
    let n_groups = t.num_code_groups as u64;
    let mut s = Specs(Vec::new(), CheckpointFile::Talker);
    s.add(
        "talker.model.text_embedding.weight",
        &[tv, th],
        Init::Normal,
    );
    s.linear("talker.text_projection.linear_fc1", th, th, true);
    s.linear("talker.text_projection.linear_fc2", h, th, true);
    s.add(
        "talker.model.codec_embedding.weight",
        &[t.vocab_size as u64, h],
        Init::Normal,
    );
    for i in 0..t.num_hidden_layers {
        s.qwen3_layer(
            &format!("talker.model.layers.{i}"),
            h,
            t.num_attention_heads as u64,
            t.num_key_value_heads as u64,
            t.head_dim as u64,
            t.intermediate_size as u64,
        );
    }
    s.add("talker.model.norm.weight", &[h], Init::Norm);
    s.linear("talker.codec_head", t.vocab_size as u64, h, false);
    if hc != h {
        s.linear("talker.code_predictor.small_to_mtp_projection", hc, h, true);
    }
    for g in 0..n_groups - 1 {
        s.add(
            format!("talker.code_predictor.model.codec_embedding.{g}.weight"),
            &[cp.vocab_size as u64, h],
            Init::Normal,
        );
    }
    for i in 0..cp.num_hidden_layers {
        s.qwen3_layer(
            &format!("talker.code_predictor.model.layers.{i}"),
            hc,
            cp.num_attention_heads as u64,
            cp.num_key_value_heads as u64,
            cp.head_dim as u64,
            cp.intermediate_size as u64,
        );
    }
    s.add("talker.code_predictor.model.norm.weight", &[hc], Init::Norm);
    for g in 0..n_groups - 1 {
        s.linear(
            &format!("talker.code_predictor.lm_head.{g}"),
            cp.vocab_size as u64,
            hc,
            false,
        );
    }

    let d = &cfg.speech_tokenizer.decoder_config;
    let mut out = s.0;
    let mut s = Specs(Vec::new(), CheckpointFile::SpeechTokenizer);
    let (cd, half) = (d.codebook_dim as u64, d.codebook_dim as u64 / 2);
    let (lat, hs, dd) = (
        d.latent_dim as u64,
        d.hidden_size as u64,
        d.decoder_dim as u64,
    );
    let n_sem = d.num_semantic_quantizers as u64;
    for (rvq, n) in [
        ("rvq_first", n_sem),
        ("rvq_rest", d.num_quantizers as u64 - n_sem),
    ] {
        let p = format!("decoder.quantizer.{rvq}");
        for k in 0..n {
            let cb = format!("{p}.vq.layers.{k}._codebook");
            s.add(
                format!("{cb}.cluster_usage"),
                &[d.codebook_size as u64],
                Init::Usage,
            );
            s.add(
                format!("{cb}.embedding_sum"),
                &[d.codebook_size as u64, half],
                Init::Normal,
            );
        }
        s.add(
            format!("{p}.input_proj.weight"),
            &[half, cd, 1],
            Init::FanIn(cd),
        );
        s.add(
            format!("{p}.output_proj.weight"),
            &[cd, half, 1],
            Init::FanIn(half),
        );
    }
    s.conv("decoder.pre_conv.conv", lat, cd, 3);
    let p = "decoder.pre_transformer";
    s.linear(&format!("{p}.input_proj"), hs, lat, true);
    let (nh, hd) = (d.num_attention_heads as u64, d.head_dim as u64);
    for i in 0..d.num_hidden_layers {
        let l = format!("{p}.layers.{i}");
        s.add(format!("{l}.input_layernorm.weight"), &[hs], Init::Norm);
        s.add(
            format!("{l}.post_attention_layernorm.weight"),
            &[hs],
            Init::Norm,
        );
        s.linear(&format!("{l}.self_attn.q_proj"), nh * hd, hs, false);
        s.linear(
            &format!("{l}.self_attn.k_proj"),
            d.num_key_value_heads as u64 * hd,
            hs,
            false,
        );
        s.linear(
            &format!("{l}.self_attn.v_proj"),
            d.num_key_value_heads as u64 * hd,
            hs,
            false,
        );
        s.linear(&format!("{l}.self_attn.o_proj"), hs, nh * hd, false);
        s.linear(
            &format!("{l}.mlp.gate_proj"),
            d.intermediate_size as u64,
            hs,
            false,
        );
        s.linear(
            &format!("{l}.mlp.up_proj"),
            d.intermediate_size as u64,
            hs,
            false,
        );
        s.linear(
            &format!("{l}.mlp.down_proj"),
            hs,
            d.intermediate_size as u64,
            false,
        );
        s.add(
            format!("{l}.self_attn_layer_scale.scale"),
            &[hs],
            Init::Scale,
        );
        s.add(format!("{l}.mlp_layer_scale.scale"), &[hs], Init::Scale);
    }
    s.add(format!("{p}.norm.weight"), &[hs], Init::Norm);
    s.linear(&format!("{p}.output_proj"), lat, hs, true);
    for (j, &r) in d.upsampling_ratios.iter().enumerate() {
        let r = r as u64;
        let u = format!("decoder.upsample.{j}");
        // ConvTranspose1d weight is [in, out, k]; fan-in per output sample is in·k/stride.
        s.add(
            format!("{u}.0.conv.weight"),
            &[lat, lat, r],
            Init::FanIn(lat),
        );
        s.add(format!("{u}.0.conv.bias"), &[lat], Init::Bias);
        s.conv(&format!("{u}.1.dwconv.conv"), lat, 1, 7);
        s.add(format!("{u}.1.norm.weight"), &[lat], Init::Norm);
        s.add(format!("{u}.1.norm.bias"), &[lat], Init::Bias);
        s.linear(&format!("{u}.1.pwconv1"), 4 * lat, lat, true);
        s.linear(&format!("{u}.1.pwconv2"), lat, 4 * lat, true);
        s.add(format!("{u}.1.gamma"), &[lat], Init::Scale);
    }
    s.conv("decoder.decoder.0.conv", dd, lat, 7);
    let mut c_in = dd;
    for (i, &r) in d.upsample_rates.iter().enumerate() {
        let (r, c_out) = (r as u64, c_in / 2);
        let b = format!("decoder.decoder.{}.block", i + 1);
        s.snake(&format!("{b}.0"), c_in);
        s.add(
            format!("{b}.1.conv.weight"),
            &[c_in, c_out, 2 * r],
            Init::FanIn(c_in * 2),
        );
        s.add(format!("{b}.1.conv.bias"), &[c_out], Init::Bias);
        for u in 2..5 {
            s.snake(&format!("{b}.{u}.act1"), c_out);
            s.conv(&format!("{b}.{u}.conv1.conv"), c_out, c_out, 7);
            s.snake(&format!("{b}.{u}.act2"), c_out);
            s.conv(&format!("{b}.{u}.conv2.conv"), c_out, c_out, 1);
        }
        c_in = c_out;
    }
    let n = d.upsample_rates.len() + 1;
    s.snake(&format!("decoder.decoder.{n}"), c_in);
    s.conv(&format!("decoder.decoder.{}.conv", n + 1), 1, c_in, 7);
    out.extend(s.0);
    if let Some(e) = cfg.tts.speaker_encoder_config.enc_dim {
        out.extend(speaker_encoder_tensors(
            &cfg.tts.speaker_encoder_config,
            e as u64,
        ));
    }
    if cfg.tts.tts_model_type == ModelType::Base {
        if let Some(e) = &cfg.speech_tokenizer.encoder_config {
            out.extend(codec_encoder_tensors(e));
        }
    }
    out
}

/// The speech tokenizer's encoder (Mimi: SEANet, transformer, downsample, split RVQ) that voice
/// cloning needs: the 159 of its 225 tensors (real geometry) that compute the first 16 codebooks.
/// Listed for Base models only, the ones that clone; the CustomVoice and VoiceDesign files carry
/// the same weights, unused.
pub fn codec_encoder_tensors(e: &EncoderConfig) -> Vec<Spec> {
    let mut s = Specs(Vec::new(), CheckpointFile::SpeechTokenizer);
    let p = "encoder.encoder.layers";
    let mut c = e.num_filters as u64;
    s.conv(&format!("{p}.0.conv"), c, 1, e.kernel_size as u64);
    let mut i = 1;
    for &r in e.upsampling_ratios.iter().rev() {
        let hidden = c / e.compress as u64;
        s.conv(
            &format!("{p}.{i}.block.1.conv"),
            hidden,
            c,
            e.residual_kernel_size as u64,
        );
        s.conv(&format!("{p}.{i}.block.3.conv"), c, hidden, 1);
        s.conv(&format!("{p}.{}.conv", i + 2), 2 * c, c, 2 * r as u64);
        c *= 2;
        i += 3;
    }
    let h = e.hidden_size as u64;
    // Layer i is the ELU before the last conv.
    s.conv(
        &format!("{p}.{}.conv", i + 1),
        h,
        c,
        e.last_kernel_size as u64,
    );
    for l in 0..e.num_hidden_layers {
        let t = format!("encoder.encoder_transformer.layers.{l}");
        for n in ["input_layernorm", "post_attention_layernorm"] {
            s.add(format!("{t}.{n}.weight"), &[h], Init::Norm);
            s.add(format!("{t}.{n}.bias"), &[h], Init::Bias);
        }
        for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            s.linear(&format!("{t}.self_attn.{n}"), h, h, false);
        }
        let ff = e.intermediate_size as u64;
        s.linear(&format!("{t}.mlp.fc1"), ff, h, false);
        s.linear(&format!("{t}.mlp.fc2"), h, ff, false);
        s.add(
            format!("{t}.self_attn_layer_scale.scale"),
            &[h],
            Init::Scale,
        );
        s.add(format!("{t}.mlp_layer_scale.scale"), &[h], Init::Scale);
    }
    s.add(
        "encoder.downsample.conv.weight",
        &[h, h, 4],
        Init::FanIn(h * 4),
    );
    let d = e.vector_quantization_hidden_dimension as u64;
    for (rvq, n) in [("semantic", 1), ("acoustic", 15)] {
        let q = format!("encoder.quantizer.{rvq}_residual_vector_quantizer");
        s.add(format!("{q}.input_proj.weight"), &[d, h, 1], Init::FanIn(h));
        for k in 0..n {
            let cb = format!("{q}.layers.{k}.codebook");
            s.add(
                format!("{cb}.cluster_usage"),
                &[e.codebook_size as u64],
                Init::Usage,
            );
            s.add(
                format!("{cb}.embed_sum"),
                &[e.codebook_size as u64, e.codebook_dim as u64],
                Init::Normal,
            );
        }
    }
    s.0
}

/// The x-vector speaker encoder of Base models (ECAPA-TDNN, MODEL-NOTES.md §6.1), with the widths
/// of `speaker_encoder_config` (default 512/1536, attention 128, SE 128), 128 mels, Res2Net scale 8,
/// and kernel shapes as llama.cpp's loader reads them (`tools/mtmd/clip.cpp`).
fn speaker_encoder_tensors(cfg: &SpeakerEncoderConfig, enc_dim: u64) -> Vec<Spec> {
    let mut s = Specs(Vec::new(), CheckpointFile::Talker);
    let (c, mel, scale) = (cfg.channels() as u64, 128u64, 8u64);
    let (att, se) = (cfg.attention_channels() as u64, cfg.se_channels() as u64);
    let p = "speaker_encoder";
    s.conv(&format!("{p}.blocks.0.conv"), c, mel, 5);
    for b in 1..4 {
        s.conv(&format!("{p}.blocks.{b}.tdnn1.conv"), c, c, 1);
        for x in 0..scale - 1 {
            s.conv(
                &format!("{p}.blocks.{b}.res2net_block.blocks.{x}.conv"),
                c / scale,
                c / scale,
                3,
            );
        }
        s.conv(&format!("{p}.blocks.{b}.tdnn2.conv"), c, c, 1);
        s.conv(&format!("{p}.blocks.{b}.se_block.conv1"), se, c, 1);
        s.conv(&format!("{p}.blocks.{b}.se_block.conv2"), c, se, 1);
    }
    s.conv(&format!("{p}.mfa.conv"), 3 * c, 3 * c, 1);
    s.conv(&format!("{p}.asp.tdnn.conv"), att, 9 * c, 1);
    s.conv(&format!("{p}.asp.conv"), 3 * c, att, 1);
    s.conv(&format!("{p}.fc"), enc_dim, 6 * c, 1);
    s.0
}

/// A checkpoint directory with its configs checked and its weight files indexed.
///
/// Tensors are read with positioned reads, one at a time (or a range of rows), not mapped: a
/// conversion's memory then stays near the tensor being converted instead of growing with every
/// page of the source files it has touched.
#[derive(Debug)]
pub struct Checkpoint {
    /// The directory.
    pub dir: PathBuf,
    /// Its three JSON files.
    pub config: CheckpointConfig,
    files: HashMap<CheckpointFile, (PathBuf, File)>,
    index: HashMap<String, Entry>,
    specs: Vec<Spec>,
}

#[derive(Debug, Clone)]
struct Entry {
    file: CheckpointFile,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    range: std::ops::Range<u64>,
}

/// Longest safetensors header accepted (the real ones are under 200 KB).
const MAX_HEADER: u64 = 100 << 20;

#[derive(serde::Deserialize)]
struct HeaderEntry {
    dtype: Dtype,
    shape: Vec<usize>,
    data_offsets: (u64, u64),
}

fn read_index(
    file: CheckpointFile,
    path: &Path,
    f: &File,
) -> Result<Vec<(String, Entry)>, ModelError> {
    use std::os::unix::fs::FileExt;
    let parse = |message: String| ModelError::Parse {
        path: path.into(),
        message,
    };
    let len = f
        .metadata()
        .map_err(|e| ModelError::io(path, "stat", e))?
        .len();
    let mut n = [0u8; 8];
    f.read_exact_at(&mut n, 0)
        .map_err(|e| ModelError::io(path, "read", e))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || 8 + n > len {
        return Err(parse(format!("header of {n} bytes in a file of {len}")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact_at(&mut header, 8)
        .map_err(|e| ModelError::io(path, "read", e))?;
    let map: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| parse(e.to_string()))?;
    let data_start = 8 + n;
    let mut out = Vec::with_capacity(map.len());
    for (name, v) in map {
        if name == "__metadata__" {
            continue;
        }
        let e: HeaderEntry =
            serde_json::from_value(v).map_err(|e| parse(format!("tensor '{name}': {e}")))?;
        let (start, end) = e.data_offsets;
        let elems = e.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let bytes = elems.and_then(|n| n.checked_mul(e.dtype.bitsize() / 8));
        if start > end || data_start + end > len || bytes != Some((end - start) as usize) {
            return Err(parse(format!(
                "tensor '{name}': data {start}..{end} for shape {:?} of {:?} in a file of {len} bytes",
                e.shape, e.dtype
            )));
        }
        out.push((
            name,
            Entry {
                file,
                dtype: e.dtype,
                shape: e.shape,
                range: data_start + start..data_start + end,
            },
        ));
    }
    Ok(out)
}

/// A tensor's raw bytes as stored in the checkpoint.
#[derive(Debug, Clone)]
pub struct RawTensor {
    /// Element type.
    pub dtype: Dtype,
    /// PyTorch shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes.
    pub data: Vec<u8>,
}

impl RawTensor {
    /// The values as f32 (exact for f32, f16 and bf16 sources).
    pub fn to_f32(&self) -> Vec<f32> {
        let d = &self.data;
        match self.dtype {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::F16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::BF16 => d
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            // Checkpoint::open accepts only the three float types above.
            _ => Vec::new(),
        }
    }
}

impl Checkpoint {
    /// Reads the configs of `dir`, indexes its two weight files and checks that every tensor the
    /// configs imply is present with its shape and a float type.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, ModelError> {
        let dir = dir.as_ref().to_path_buf();
        let config = CheckpointConfig::read(&dir)?;
        let specs = expected_tensors(&config);
        let mut files = HashMap::new();
        let mut index = HashMap::new();
        for file in [CheckpointFile::Talker, CheckpointFile::SpeechTokenizer] {
            let path = dir.join(file.rel_path());
            let f = File::open(&path).map_err(|e| ModelError::io(&path, "open", e))?;
            index.extend(read_index(file, &path, &f)?);
            files.insert(file, (path, f));
        }
        for spec in &specs {
            let path = &files[&spec.file].0;
            let entry = index.get(&spec.name).filter(|e| e.file == spec.file);
            let Some(entry) = entry else {
                return Err(ModelError::MissingTensor {
                    path: path.clone(),
                    tensor: spec.name.clone(),
                });
            };
            let found: Vec<u64> = entry.shape.iter().map(|&x| x as u64).collect();
            if found != spec.shape {
                return Err(ModelError::WrongShape {
                    path: path.clone(),
                    tensor: spec.name.clone(),
                    expected: spec.shape.clone(),
                    found,
                });
            }
            if !matches!(entry.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
                return Err(ModelError::WrongType {
                    path: path.clone(),
                    tensor: spec.name.clone(),
                    expected: "F32, F16 or BF16".into(),
                    found: format!("{:?}", entry.dtype),
                });
            }
        }
        Ok(Checkpoint {
            dir,
            config,
            files,
            index,
            specs,
        })
    }

    /// The tensors [`expected_tensors`] lists for this checkpoint.
    pub fn specs(&self) -> &[Spec] {
        &self.specs
    }

    /// Rows `rows` (along the first PyTorch dimension) of tensor `name`, from either weight file.
    pub fn raw_rows(
        &self,
        name: &str,
        rows: std::ops::Range<usize>,
    ) -> Result<RawTensor, ModelError> {
        use std::os::unix::fs::FileExt;
        let Some(e) = self.index.get(name) else {
            return Err(ModelError::MissingTensor {
                path: self.dir.clone(),
                tensor: name.into(),
            });
        };
        let n_rows = e.shape.first().copied().unwrap_or(1).max(1);
        let row_bytes = (e.range.end - e.range.start) / n_rows as u64;
        if rows.start > rows.end || rows.end > n_rows {
            return Err(ModelError::WrongShape {
                path: self.dir.clone(),
                tensor: name.into(),
                expected: vec![n_rows as u64],
                found: vec![rows.end as u64],
            });
        }
        let (path, f) = &self.files[&e.file];
        let mut data = vec![0u8; (rows.len() as u64 * row_bytes) as usize];
        f.read_exact_at(&mut data, e.range.start + rows.start as u64 * row_bytes)
            .map_err(|err| ModelError::io(path, "read", err))?;
        let mut shape = e.shape.clone();
        if let Some(first) = shape.first_mut() {
            *first = rows.len();
        }
        Ok(RawTensor {
            dtype: e.dtype,
            shape,
            data,
        })
    }

    /// Tensor `name`, from either weight file.
    pub fn raw(&self, name: &str) -> Result<RawTensor, ModelError> {
        let rows = self
            .index
            .get(name)
            .and_then(|e| e.shape.first().copied())
            .unwrap_or(1);
        self.raw_rows(name, 0..rows)
    }

    /// Tensor `name` as f32 values (row-major, PyTorch order).
    pub fn f32(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        Ok(self.raw(name)?.to_f32())
    }
}
