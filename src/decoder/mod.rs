//! The speech-tokenizer decoder ("code2wav"): 16 codes per 80 ms frame to 1920 samples at 24 kHz.
//!
//! Model: Qwen3-TTS-Tokenizer-12Hz `Qwen3TTSTokenizerV2Decoder` (PyPI `qwen-tts` 0.1.1,
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`; MODEL-NOTES.md §5): split-RVQ
//! dequantization, a causal k=3 conv, a sliding-window transformer, two ConvNeXt upsamplers and a
//! causal DAC-style decoder of SnakeBeta, transposed convs and dilated residual units.
//! Weights: the `a.gen.wav.*` tensors of the mmproj GGUF; geometry from the speech tokenizer config
//! the file carries (`qtts.hf.speech_tokenizer_config_json`), else the released one.
//!
//! Contract:
//! - The decoder is causal with zero lookahead, and [`Decoder`] is stateful: each frame's samples
//!   are final when the frame is decoded, and decoding frame by frame or in chunks of any size gives
//!   the same samples as decoding the whole utterance at once (MODEL-NOTES.md §5.1).
//!   The state is the left context of every causal conv (its last `(k − 1)·dilation` input rows),
//!   the overlap tail of every transposed conv whose kernel is longer than its stride, the keys and
//!   values of the transformer's last `window − 1` frames, and the frame counter (RoPE positions).
//!   It lives in a ggml context of its own; each graph reads it and writes it back.
//! - [`Decoder::load`] copies the weights into a ggml context (in the file's types; transposed-conv
//!   kernels split into the matrices of their current and next output blocks) and builds the graph
//!   of a one-frame chunk. Graphs of longer chunks (up to [`Decoder::max_chunk`] frames) are built
//!   the first time such a chunk is decoded, which allocates. Per call, [`Decoder::decode_frames`]
//!   allocates only the short name strings of ggml's tensor lookups (and the recorded stages when
//!   capturing), never activation memory.
//! - [`Decoder::decode_frames`] blocks the calling thread for the compute, on the caller's
//!   threadpool, and writes into the caller's buffer.
//! - Convs and transposed convs are products on the host ([`Context::conv_gemm`]: f32 panels of
//!   [`crate::kernels::panel`] where the tier has AVX2 or AVX-512, bf16 tiles for [`Products::HostBf16`],
//!   else `matrixmultiply`), or ggml's im2col columns times the kernel matrix ([`Products::Ggml`]);
//!   depthwise convs are sums of shifted rows; SnakeBeta is one fused pass ([`crate::kernels::snake`]). Intermediate
//!   tensors share one buffer sized to the graph's peak (ggml's graph allocator).
//! - Speed: PERFORMANCE.md (about 5 GFLOP per frame; not yet real time on 2 AVX2 cores).

mod state;
pub use state::DecoderState;
mod graph;
mod load;
mod products;
pub use products::{f16_layer, int8_layer, Products};

use graph::build_chunk;
use load::Loader;

use std::collections::BTreeMap;

use crate::error::ModelError;
use crate::ffi::{Context, GgmlError, OwnedGraph, SharedContext, Threadpool};
use crate::gguf::{GgmlType, GgufFile, Value};
use crate::kernels::bf16;
use crate::model::config::{parse_json, Preset, SpeechTokenizerConfig};
use crate::model::convert::KEY_HF_SPEECH_TOKENIZER;

/// Codebooks per frame.
pub const CODEBOOKS: usize = 16;

/// Kernel of the causal convs of the ConvNeXt blocks, the decoder's entry and exit, and the
/// residual units.
const K7: usize = 7;

/// Fewest rows per frame (and per product) for which a matrix product runs on the host
/// ([`Context::conv_gemm`]): below it, packing the weights costs more than the product saves, and
/// ggml's unpacked products stay.
pub const HOST_MIN_ROWS: usize = 32;

/// Stages a capture records (see [`Decoder::set_capture`]), each `[channels, rows]` with the
/// channel index fastest (time-major), so chunks concatenate.
pub const STAGES: &[&str] = &[
    "quantized",
    "pre_conv",
    "pre_transformer",
    "upsample.0.transconv",
    "upsample.0.convnext",
    "upsample.1.transconv",
    "upsample.1.convnext",
    "decoder.0",
    "decoder.1",
    "decoder.2",
    "decoder.3",
    "decoder.4",
    "decoder.5",
    "decoder.6",
];

/// Failures of [`Decoder::decode_frames`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecoderError {
    /// A code is not below the codebook size.
    /// The codes come from a broken upstream stage: fix it; the decoder's state is unchanged.
    #[error("frame {frame}, codebook {codebook}: code {code} is not below {codebook_size}")]
    CodeOutOfRange {
        /// Index of the frame in the call.
        frame: usize,
        /// Codebook (0..16).
        codebook: usize,
        /// The code.
        code: u32,
        /// Codes per codebook.
        codebook_size: usize,
    },
    /// The output buffer is too short for the frames.
    /// Fix the caller: pass `frames × samples_per_frame` samples.
    #[error("output buffer of {found} samples, need {expected}")]
    OutputTooShort {
        /// Samples needed.
        expected: usize,
        /// Samples given.
        found: usize,
    },
    /// ggml failed; the stream's state may be partly updated: [`Decoder::reset`] before reuse.
    #[error(transparent)]
    Ggml(#[from] GgmlError),
}

/// What one [`Decoder::decode_frames`] call wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decoded {
    /// Samples written (frames × samples per frame).
    pub samples: usize,
    /// Non-finite samples, written as 0.
    pub non_finite: usize,
}

/// The decoder's geometry (`decoder_config` of the speech tokenizer config).
#[derive(Debug, Clone, PartialEq)]
pub struct Geometry {
    /// Codes per codebook (2048).
    pub codebook_size: usize,
    /// Width of one half-codebook's vectors (codebook_dim / 2).
    pub half: usize,
    /// Split-RVQ output width (512).
    pub codebook_dim: usize,
    /// Pre-conv and upsampler width (1024).
    pub latent: usize,
    /// Transformer width (512).
    pub hidden: usize,
    /// Transformer SwiGLU width.
    pub ff: usize,
    /// Transformer layers.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE base.
    pub theta: f32,
    /// Attention window in frames (a query sees itself and `window − 1` earlier frames).
    pub window: usize,
    /// Width of the first decoder conv (1536).
    pub decoder_dim: usize,
    /// ConvNeXt upsampler ratios (2, 2).
    pub upsampling_ratios: Vec<usize>,
    /// DecoderBlock rates (8, 5, 4, 3).
    pub upsample_rates: Vec<usize>,
    /// Samples per frame (1920).
    pub samples_per_frame: usize,
}

impl Geometry {
    /// The geometry carried by `f`, or the released one when the file carries none.
    pub fn read(f: &GgufFile) -> Result<Self, ModelError> {
        let st: SpeechTokenizerConfig = match f.header.get(KEY_HF_SPEECH_TOKENIZER) {
            Some(Value::Str(json)) => parse_json(json, f.path())?,
            Some(v) => {
                return Err(ModelError::Unsupported {
                    what: format!("{}: key {KEY_HF_SPEECH_TOKENIZER}", f.path().display()),
                    expected: "a string".into(),
                    found: v.type_name().into(),
                })
            }
            None => Preset::Small06CustomVoice.config().speech_tokenizer,
        };
        let d = &st.decoder_config;
        let g = Geometry {
            codebook_size: d.codebook_size as usize,
            half: d.codebook_dim as usize / 2,
            codebook_dim: d.codebook_dim as usize,
            latent: d.latent_dim as usize,
            hidden: d.hidden_size as usize,
            ff: d.intermediate_size as usize,
            n_layer: d.num_hidden_layers as usize,
            n_head: d.num_attention_heads as usize,
            n_head_kv: d.num_key_value_heads as usize,
            head_dim: d.head_dim as usize,
            eps: d.rms_norm_eps as f32,
            theta: d.rope_theta as f32,
            window: d.sliding_window as usize,
            decoder_dim: d.decoder_dim as usize,
            upsampling_ratios: d.upsampling_ratios.iter().map(|&r| r as usize).collect(),
            upsample_rates: d.upsample_rates.iter().map(|&r| r as usize).collect(),
            samples_per_frame: st.decode_upsample_rate as usize,
        };
        let product: usize = g.upsampling_ratios.iter().product::<usize>()
            * g.upsample_rates.iter().product::<usize>();
        let bad = |expected: String, found: String| ModelError::Unsupported {
            what: format!("{}: speech tokenizer decoder_config", f.path().display()),
            expected,
            found,
        };
        if product != g.samples_per_frame {
            return Err(bad(
                format!(
                    "rates whose product is decode_upsample_rate {}",
                    g.samples_per_frame
                ),
                format!("{product}"),
            ));
        }
        if d.num_quantizers as usize != CODEBOOKS || d.num_semantic_quantizers != 1 {
            return Err(bad(
                format!("{CODEBOOKS} codebooks, 1 semantic"),
                format!("{}, {}", d.num_quantizers, d.num_semantic_quantizers),
            ));
        }
        if g.window < 2
            || g.n_head_kv == 0
            || !g.n_head.is_multiple_of(g.n_head_kv)
            || !g.head_dim.is_multiple_of(2)
            || !g.decoder_dim.is_multiple_of(1 << g.upsample_rates.len())
        {
            return Err(bad(
                "a window >= 2, heads a multiple of kv heads, an even head_dim, a decoder_dim that halves per block".into(),
                format!(
                    "window {}, heads {}/{}, head_dim {}, decoder_dim {}",
                    g.window, g.n_head, g.n_head_kv, g.head_dim, g.decoder_dim
                ),
            ));
        }
        Ok(g)
    }
}

/// The stateful decoder of one stream: weights, graphs and the stream's state.
#[derive(Debug)]
pub struct Decoder {
    geometry: Geometry,
    /// Graph of a chunk of `i + 1` frames, once built.
    graphs: Vec<Option<OwnedGraph>>,
    /// Graph of the head of a chunk of `i + 1` frames (up to the transformer, for
    /// [`Decoder::prime`]), once built.
    heads: Vec<Option<OwnedGraph>>,
    /// Names of the state tensors in `state`, for [`Decoder::reset`].
    state_names: Vec<String>,
    /// Frames decoded since the last reset (the next frame's RoPE position).
    pos: usize,
    /// Non-finite samples written as 0 since the last reset.
    non_finite: u64,
    /// Recorded stages when capturing.
    capture: Option<BTreeMap<&'static str, Vec<f32>>>,
    /// SnakeBeta as one fused pass (default) or as five ggml ops (the benches' baseline).
    fused_snake: bool,
    /// Products by [`Context::conv_gemm`] where the weights allow (see [`Decoder::load_options`]).
    host: bool,
    /// The kernel of the bf16 products, when the matrices are bf16.
    bf16: Option<bf16::Kernel>,
    /// Scratch of a chunk's inputs (reused).
    scratch_i32: Vec<i32>,
    scratch_f32: Vec<f32>,
    /// The stream's state, read and written by the graphs (which hold it too).
    state: SharedContext,
    /// The weights, read by the graphs (which hold them too).
    weights: SharedContext,
}

impl Decoder {
    /// Loads the decoder from a validated mmproj file (see [`crate::model::validate::check_mmproj`]),
    /// with a fresh stream state.
    pub fn load(f: &GgufFile) -> Result<Self, ModelError> {
        Self::load_with(f, None)
    }

    /// As [`Decoder::load`], storing the conv, transposed-conv and linear matrices as `matrices`
    /// (`Some(GgmlType::Q8_0)`: ggml's integer dot products, a quarter of f32's memory, not exact;
    /// see PERFORMANCE.md) where their rows are whole blocks and the file has them as f32 or f16.
    /// Norms, biases, SnakeBeta, codebooks and depthwise taps stay f32.
    pub fn load_with(f: &GgufFile, matrices: Option<GgmlType>) -> Result<Self, ModelError> {
        let products = match matrices {
            None => Products::HostF32,
            Some(_) => Products::Ggml,
        };
        Self::load_options(f, matrices, products)
    }

    /// As [`Decoder::load_with`], choosing how the products of the residual units, the
    /// post-conv and the upsampling convs that see at least [`HOST_MIN_ROWS`] rows per frame are
    /// computed ([`Products`]; [`Products::HostF32`] is the default when `matrices` is `None`: 2-3x
    /// faster than ggml's f32 products here, see PERFORMANCE.md). `products` is ignored where
    /// `matrices` converts a matrix.
    ///
    /// [`Products::HostBf16`] on a kernel tier without a bf16 kernel (AMX-BF16 or AVX-512 BF16)
    /// is [`ModelError::Unsupported`].
    pub fn load_options(
        f: &GgufFile,
        matrices: Option<GgmlType>,
        products: Products,
    ) -> Result<Self, ModelError> {
        let tier = crate::kernels::selected()?;
        Self::load_by(f, matrices, products, bf16::Kernel::active(), tier)
    }

    /// The decoder with bf16 products ([`Products::HostBf16`]) by `kernel` rather than the
    /// process's tier's: the tests' and benches' way to compare the bf16 kernels in one process.
    /// A kernel this CPU lacks is [`ModelError::Unsupported`].
    pub fn load_bf16(f: &GgufFile, kernel: bf16::Kernel) -> Result<Self, ModelError> {
        let tier = crate::kernels::selected()?;
        let kernel = Some(kernel).filter(|k| k.available());
        Self::load_by(f, None, Products::HostBf16, kernel, tier)
    }

    /// [`Decoder::load_options`] with the bf16 products by `kernel` (`None`: this CPU or tier has
    /// none).
    fn load_by(
        f: &GgufFile,
        matrices: Option<GgmlType>,
        products: Products,
        kernel: Option<bf16::Kernel>,
        tier: crate::kernels::Tier,
    ) -> Result<Self, ModelError> {
        crate::model::validate::check_mmproj(f.path(), &f.header)?;
        if products == Products::HostInt8 && crate::kernels::int8::Kernel::active().is_none() {
            return Err(ModelError::Unsupported {
                what: "int8 decoder products".into(),
                expected: "a kernel tier with AVX-512 VNNI, AVX-VNNI (`--kernels avx512` or \
                           `avxvnni`) or NEON with `sdot`; elsewhere use the f32 products"
                    .into(),
                found: format!(
                    "kernel tier {tier}, CPU features {}",
                    crate::kernels::Features::get().names().join(" ")
                ),
            });
        }
        if products == Products::HostBf16 && kernel.is_none() {
            return Err(ModelError::Unsupported {
                what: "bf16 decoder products".into(),
                expected: "a kernel tier with AMX-BF16 (Intel Sapphire Rapids or later, Linux \
                           5.16 or later) or AVX-512 BF16 (AMD Zen 4 or later, Intel Cooper Lake \
                           or later); elsewhere use the f32 products"
                    .into(),
                found: format!(
                    "kernel tier {tier}, CPU features {}",
                    crate::kernels::Features::get().names().join(" ")
                ),
            });
        }
        let host = products != Products::Ggml && matrices.is_none();
        let g = Geometry::read(f)?;
        let wav: Vec<_> = f
            .header
            .tensors
            .iter()
            .filter(|t| t.name.starts_with("a.gen.wav."))
            .collect();
        let bytes: u64 = wav.iter().map(|t| t.nbytes).sum();
        // Every tensor is copied at most once in its own type, but depthwise taps become f32 and
        // kernels split into up to 7 tensors: room for those and each tensor's header.
        let depthwise: u64 = wav
            .iter()
            .filter(|t| t.name.ends_with("dwconv.weight"))
            .map(|t| 4 * t.ne.iter().product::<u64>())
            .sum();
        // Each tensor's header, and for a bf16 tiled matrix a view's and its alignment.
        let overhead = (wav.len() + 64) * 2048;
        // Kernel-shape stand-ins: at most 7 × 1536 floats per conv.
        let shapes = 64 * 7 * 1536 * 4;
        // Host matrices stored as f16 become f32: at most twice the file's bytes.
        let widened = if host { bytes } else { 0 };
        let w =
            Context::new((bytes + widened + depthwise) as usize + shapes + overhead + (1 << 20))
                .map_err(ModelError::from)?;
        let l = Loader {
            f,
            w,
            matrices,
            host,
            bf16: host && products == Products::HostBf16,
            int8: host && products == Products::HostInt8,
            panel: host
                && matches!(
                    products,
                    Products::HostF32 | Products::HostF16 | Products::HostInt8
                )
                && crate::kernels::panel::Kernel::active().is_some(),
            f16: host && matches!(products, Products::HostF16 | Products::HostInt8),
            last: Default::default(),
        };
        let p = "a.gen.wav";
        let (half, cd, lat, dd) = (g.half, g.codebook_dim, g.latent, g.decoder_dim);
        l.copy(
            &format!("{p}.quant.first.codebook.weight"),
            &[half, g.codebook_size],
        )?;
        l.copy(
            &format!("{p}.quant.rest.codebook.weight"),
            &[half, g.codebook_size * (CODEBOOKS - 1)],
        )?;
        for q in ["first", "rest"] {
            l.copy(&format!("{p}.quant.{q}.out_proj.weight"), &[half, cd])?;
        }
        l.conv(&format!("{p}.pre_conv.weight"), 3, cd, lat, false)?;
        l.copy(&format!("{p}.pre_conv.bias"), &[lat])?;
        let t = format!("{p}.tfm");
        l.copy(&format!("{t}.in_proj.weight"), &[lat, g.hidden])?;
        l.copy(&format!("{t}.in_proj.bias"), &[g.hidden])?;
        l.copy(&format!("{t}.out_proj.weight"), &[g.hidden, lat])?;
        l.copy(&format!("{t}.out_proj.bias"), &[lat])?;
        l.copy(&format!("{t}.output_norm.weight"), &[g.hidden])?;
        let (q, kv) = (g.n_head * g.head_dim, g.n_head_kv * g.head_dim);
        for i in 0..g.n_layer {
            let b = format!("{t}.blk.{i}");
            for (n, ne) in [
                ("ln1.weight", [g.hidden, 1]),
                ("attn_q.weight", [g.hidden, q]),
                ("attn_k.weight", [g.hidden, kv]),
                ("attn_v.weight", [g.hidden, kv]),
                ("attn_out.weight", [q, g.hidden]),
                ("ls1.weight", [g.hidden, 1]),
                ("ln2.weight", [g.hidden, 1]),
                ("ffn_gate.weight", [g.hidden, g.ff]),
                ("ffn_up.weight", [g.hidden, g.ff]),
                ("ffn_down.weight", [g.ff, g.hidden]),
                ("ls2.weight", [g.hidden, 1]),
            ] {
                let ne = if ne[1] == 1 { &ne[..1] } else { &ne[..] };
                l.copy(&format!("{b}.{n}"), ne)?;
            }
        }
        for (u, &r) in g.upsampling_ratios.iter().enumerate() {
            let b = format!("{p}.up.blk.{u}");
            l.transposed(&format!("{b}.conv.weight"), r, r, lat, lat, false)?;
            l.depthwise(&format!("{b}.dwconv.weight"), K7, lat)?;
            for n in [
                "conv.bias",
                "dwconv.bias",
                "norm.weight",
                "norm.bias",
                "pw2.bias",
                "gamma",
            ] {
                l.copy(&format!("{b}.{n}"), &[lat])?;
            }
            l.copy(&format!("{b}.pw1.weight"), &[lat, 4 * lat])?;
            l.copy(&format!("{b}.pw1.bias"), &[4 * lat])?;
            l.copy(&format!("{b}.pw2.weight"), &[4 * lat, lat])?;
        }
        l.conv(&format!("{p}.dac.entry.weight"), K7, lat, dd, false)?;
        l.copy(&format!("{p}.dac.entry.bias"), &[dd])?;
        let mut cin = dd;
        // Rows per frame entering the DAC's next block.
        let mut rows: usize = g.upsampling_ratios.iter().product();
        for (i, &r) in g.upsample_rates.iter().enumerate() {
            let (b, cout) = (format!("{p}.dac.blk.{i}"), cin / 2);
            l.copy(&format!("{b}.snake.alpha"), &[cin])?;
            l.copy(&format!("{b}.snake.beta"), &[cin])?;
            let host = rows >= HOST_MIN_ROWS;
            l.transposed(&format!("{b}.conv.weight"), 2 * r, r, cin, cout, host)?;
            rows *= r;
            l.copy(&format!("{b}.conv.bias"), &[cout])?;
            for j in 0..3 {
                let rb = format!("{b}.res.{j}");
                for n in [
                    "act1.alpha",
                    "act1.beta",
                    "act2.alpha",
                    "act2.beta",
                    "conv1.bias",
                    "conv2.bias",
                ] {
                    l.copy(&format!("{rb}.{n}"), &[cout])?;
                }
                l.conv(&format!("{rb}.conv1.weight"), K7, cout, cout, true)?;
                l.conv(&format!("{rb}.conv2.weight"), 1, cout, cout, true)?;
            }
            cin = cout;
        }
        l.copy(&format!("{p}.dac.post_snake.alpha"), &[cin])?;
        l.copy(&format!("{p}.dac.post_snake.beta"), &[cin])?;
        l.conv(&format!("{p}.dac.post_conv.weight"), K7, cin, 1, true)?;
        l.copy(&format!("{p}.dac.post_conv.bias"), &[1])?;
        if let Some(last) = l.last.take() {
            f.release(&last);
        }
        let weights = SharedContext::new(l.w);

        // The stream's state.
        let mut shapes: Vec<(String, Vec<usize>)> = Vec::new();
        shapes.push(("hist.pre_conv".into(), vec![cd, 2]));
        for i in 0..g.n_layer {
            for kv in ["k", "v"] {
                shapes.push((
                    format!("cache.{kv}.{i}"),
                    vec![g.head_dim, g.n_head_kv, g.window - 1],
                ));
            }
        }
        for u in 0..g.upsampling_ratios.len() {
            shapes.push((format!("hist.up.{u}"), vec![lat, K7 - 1]));
        }
        shapes.push(("hist.entry".into(), vec![lat, K7 - 1]));
        let mut c = dd;
        for (i, &r) in g.upsample_rates.iter().enumerate() {
            c /= 2;
            shapes.push((format!("tail.blk.{i}"), vec![r * c, 1]));
            for (j, d) in [1, 3, 9].into_iter().enumerate() {
                shapes.push((format!("hist.blk.{i}.res.{j}"), vec![c, (K7 - 1) * d]));
            }
        }
        shapes.push(("hist.post".into(), vec![c, K7 - 1]));
        let state_bytes: usize = shapes
            .iter()
            .map(|(_, ne)| ne.iter().product::<usize>() * 4 + 512)
            .sum();
        let state = Context::new(state_bytes + (1 << 16)).map_err(ModelError::from)?;
        for (name, ne) in &shapes {
            state.new_f32(ne).map_err(ModelError::from)?.set_name(name);
        }
        let state = SharedContext::new(state);
        let mut v = Decoder {
            geometry: g,
            graphs: Vec::new(),
            heads: Vec::new(),
            state_names: shapes.into_iter().map(|(n, _)| n).collect(),
            pos: 0,
            non_finite: 0,
            capture: None,
            fused_snake: true,
            host,
            bf16: kernel.filter(|_| products == Products::HostBf16),
            scratch_i32: Vec::new(),
            scratch_f32: Vec::new(),
            state,
            weights,
        };
        v.set_max_chunk(4);
        v.ensure_graph(1).map_err(ModelError::from)?;
        Ok(v)
    }

    /// The kernel of the bf16 products, when the matrices are bf16 ([`Products::HostBf16`]).
    pub fn bf16_kernel(&self) -> Option<bf16::Kernel> {
        self.bf16
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Samples per frame (1920).
    pub fn samples_per_frame(&self) -> usize {
        self.geometry.samples_per_frame
    }

    /// The longest chunk decoded by one graph; longer calls are split into chunks of this size.
    pub fn max_chunk(&self) -> usize {
        self.graphs.len()
    }

    /// Sets the longest chunk (at least 1, default 4). Graphs of chunks longer than `n` are dropped.
    /// The samples do not depend on it beyond rounding (ggml's matrix kernels tile by length);
    /// longer chunks compute faster per frame but their graphs take memory.
    pub fn set_max_chunk(&mut self, n: usize) {
        self.graphs.resize_with(n.max(1), || None);
        self.heads.resize_with(n.max(1), || None);
    }

    /// Frames decoded since the last reset.
    pub fn frames(&self) -> usize {
        self.pos
    }

    /// Non-finite samples written as 0 since the last reset.
    pub fn non_finite(&self) -> u64 {
        self.non_finite
    }

    /// Starts a new stream: clears the state (zeros, as the causal convs' padding) and the frame
    /// counter. There is no `flush`: with zero lookahead, every decoded frame's samples are
    /// already out.
    pub fn reset(&mut self) -> Result<(), GgmlError> {
        for name in &self.state_names {
            if let Some(t) = self.state.get(name) {
                t.write_f32(&vec![0.0; t.n_elems()])?;
            }
        }
        self.pos = 0;
        self.non_finite = 0;
        Ok(())
    }

    /// Records every stage's output of the following calls (see [`STAGES`]) when `on`; this
    /// allocates and is meant for tests.
    pub fn set_capture(&mut self, on: bool) {
        if on != self.capture.is_some() {
            // Graphs keep the stage tensors whole only when capturing (else their memory is
            // reused): rebuild them on next use.
            self.graphs.iter_mut().for_each(|g| *g = None);
        }
        self.capture = on.then(BTreeMap::new);
    }

    /// SnakeBeta as one fused pass ([`crate::kernels::snake::row`], the default) or, with `false`, as the five
    /// ggml ops it replaced (mul, sin, sqr, mul, add): the in-run baseline of the benches.
    pub fn set_fused_snake(&mut self, on: bool) {
        if on != self.fused_snake {
            self.graphs.iter_mut().for_each(|g| *g = None);
            self.heads.iter_mut().for_each(|g| *g = None);
        }
        self.fused_snake = on;
    }

    /// The stages recorded since capture was switched on, each `[channels, rows]` time-major.
    pub fn take_capture(&mut self) -> BTreeMap<&'static str, Vec<f32>> {
        self.capture
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    fn ensure_graph(&mut self, n: usize) -> Result<(), GgmlError> {
        self.ensure(n, false)
    }

    /// Builds the graph of a chunk of `n` frames if needed: the whole decoder, or only its head
    /// (`head`: up to the transformer, for [`Decoder::prime`]).
    fn ensure(&mut self, n: usize, head: bool) -> Result<(), GgmlError> {
        let slot = if head { &self.heads } else { &self.graphs };
        if slot[n - 1].is_none() {
            let keep = self.capture.is_some() && !head;
            let g = build_chunk(
                (&self.weights, &self.state),
                &self.geometry,
                n,
                keep,
                head,
                self.fused_snake,
                (self.host, self.bf16),
            )?;
            let slot = if head {
                &mut self.heads
            } else {
                &mut self.graphs
            };
            slot[n - 1] = Some(g);
        }
        Ok(())
    }

    /// Nodes in the graph of a chunk of `n` frames (built if needed); ggml's limit is 2048.
    pub fn graph_nodes(&mut self, n: usize) -> Result<usize, GgmlError> {
        if n == 0 || n > self.max_chunk() {
            return Err(GgmlError::Shape {
                what: "chunk length",
                expected: format!("1..={}", self.max_chunk()),
                found: n.to_string(),
            });
        }
        self.ensure_graph(n)?;
        Ok(self.graphs[n - 1].as_ref().map_or(0, |g| g.n_nodes()))
    }

    /// Decodes `codes` (one `[c0..c15]` per frame) into `out`, `samples_per_frame` samples per
    /// frame, continuing the stream. Non-finite samples are written as 0 and counted.
    ///
    /// Codes are checked before any compute; on [`DecoderError::CodeOutOfRange`] nothing changes.
    pub fn decode_frames(
        &mut self,
        pool: &Threadpool,
        codes: &[[u32; CODEBOOKS]],
        out: &mut [f32],
    ) -> Result<Decoded, DecoderError> {
        let spf = self.geometry.samples_per_frame;
        self.check_codes(codes)?;
        if out.len() < codes.len() * spf {
            return Err(DecoderError::OutputTooShort {
                expected: codes.len() * spf,
                found: out.len(),
            });
        }
        let mut done = Decoded::default();
        for chunk in codes.chunks(self.max_chunk()) {
            let n = chunk.len();
            let dst = &mut out[done.samples..done.samples + n * spf];
            done.non_finite += self.run_chunk(pool, chunk, Some(dst))?;
            done.samples += n * spf;
        }
        Ok(done)
    }

    /// Every code within the codebooks, else the first that is not.
    fn check_codes(&self, codes: &[[u32; CODEBOOKS]]) -> Result<(), DecoderError> {
        let size = self.geometry.codebook_size;
        for (frame, f) in codes.iter().enumerate() {
            if let Some((codebook, &code)) = f.iter().enumerate().find(|(_, &c)| c as usize >= size)
            {
                return Err(DecoderError::CodeOutOfRange {
                    frame,
                    codebook,
                    code,
                    codebook_size: size,
                });
            }
        }
        Ok(())
    }

    /// Decodes a chunk into `out`; or, without `out`, runs only the head of the decoder on it (up
    /// to the transformer, whose state it advances, for [`Decoder::prime`]). Returns the
    /// non-finite samples written as 0.
    fn run_chunk(
        &mut self,
        pool: &Threadpool,
        codes: &[[u32; CODEBOOKS]],
        out: Option<&mut [f32]>,
    ) -> Result<usize, GgmlError> {
        let n = codes.len();
        self.ensure(n, out.is_none())?;
        let g = &self.geometry;
        let (w, p0) = (g.window, self.pos);
        let missing = |name: &str| GgmlError::Shape {
            what: "graph tensor",
            expected: name.to_owned(),
            found: "none".into(),
        };
        let slot = if out.is_some() {
            &mut self.graphs
        } else {
            &mut self.heads
        };
        let Some(graph) = slot[n - 1].as_mut() else {
            return Err(missing("graph"));
        };
        let input = |name: &str| graph.tensor(name).ok_or_else(|| missing(name));
        let ids = &mut self.scratch_i32;
        ids.clear();
        ids.extend(codes.iter().map(|f| f[0] as i32));
        input("in.codes0")?.write_i32(ids)?;
        ids.clear();
        for f in codes {
            for (k, &c) in f.iter().enumerate().skip(1) {
                ids.push(((k - 1) * g.codebook_size) as i32 + c as i32);
            }
        }
        input("in.codes_rest")?.write_i32(ids)?;
        ids.clear();
        ids.extend((p0..p0 + n).map(|p| p as i32));
        input("in.pos")?.write_i32(ids)?;
        // Key j of the window holds frame p0 + j − (w − 1); query i is frame p0 + i.
        let mask = &mut self.scratch_f32;
        mask.clear();
        let n_kv = w - 1 + n;
        for i in 0..n {
            let qp = (p0 + i) as i64;
            for j in 0..n_kv {
                let kp = (p0 + j) as i64 - (w as i64 - 1);
                let seen = kp >= 0 && kp <= qp && qp - kp < w as i64;
                mask.push(if seen { 0.0 } else { f32::NEG_INFINITY });
            }
        }
        input("in.mask")?.write_f32(mask)?;
        graph.compute(pool)?;
        let Some(out) = out else {
            self.pos += n;
            return Ok(0);
        };
        graph
            .tensor("out.wav")
            .ok_or_else(|| missing("out.wav"))?
            .read_f32(out)?;
        let mut bad = 0;
        for s in out.iter_mut() {
            if !s.is_finite() {
                *s = 0.0;
                bad += 1;
            }
        }
        if let Some(cap) = self.capture.as_mut() {
            for &s in STAGES {
                if let Some(t) = graph.tensor(&format!("stage.{s}")) {
                    cap.entry(s).or_default().extend(t.to_vec());
                }
            }
        }
        self.pos += n;
        self.non_finite += bad as u64;
        Ok(bad)
    }
}
