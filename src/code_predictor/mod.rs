//! The code predictor ("sub-talker", MTP): codebooks 1..15 of a frame from the talker's hidden
//! state and codebook 0.
//!
//! Model: Qwen3-TTS-12Hz `Qwen3TTSTalkerCodePredictorModelForConditionalGeneration` (PyPI `qwen-tts`
//! 0.1.1, `qwen_tts/core/models/modeling_qwen3_tts.py`): 5 Qwen3 layers (pre-RMSNorm, per-head
//! q/k RMSNorm, GQA, NeoX RoPE θ = 1e6, SwiGLU), an input projection on the 1.7B models, a final
//! norm and 15 output heads. Weights: the `a.gen.code.*` tensors of the mmproj GGUF.
//!
//! Contract:
//! - [`CodePredictor::load`] copies the weights into a ggml context and builds the 15 graphs of a
//!   frame once (the prefill of positions 0 and 1, then one graph per position 2..15), each reading
//!   and writing a KV cache preallocated for 16 positions. Nothing is allocated per frame.
//! - [`CodePredictor::frame`] runs the 15 graphs on the caller's thread and threadpool; it blocks
//!   for the frame's compute and returns codebooks 1..15 via the caller's `pick` function, which
//!   sees each head's logits (greedy or sampled: the sampler belongs to the caller).
//! - The KV cache is overwritten from position 0 every frame: positions restart at 0 per frame,
//!   as in the reference (a fresh `DynamicCache` per `code_predictor.generate`).

mod batch;
mod graph;
pub mod heads;

pub use batch::MAX_ROWS;

use heads::Heads;

use crate::error::ModelError;
use crate::ffi::{Context, GgmlError, OwnedGraph, SharedContext, Threadpool};
use crate::gguf::{GgmlType, GgufFile, Value};
use crate::kernels::dot::Kernel;
pub use crate::qwen3::LayerKernel;
use crate::qwen3::{packed_type, repack, write_layer_joined, write_product_weight, JOINED};
use graph::build_step;
use graph::build_steps;
use graph::load_heads;
use graph::HEAD;

/// Positions per frame: the talker's hidden state, codebook 0, then codebooks 1..14 (15 is never
/// fed back).
pub const POSITIONS: usize = 16;

/// The code predictor's geometry, read from the mmproj file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    /// Width of the talker (of its hidden state and of the codec embeddings).
    pub n_talker: usize,
    /// Width of the code predictor.
    pub n_embd: usize,
    /// Layers.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// SwiGLU width.
    pub n_ff: usize,
    /// Codes per codebook (2048).
    pub n_codes: usize,
    /// Output heads (15).
    pub n_groups: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// RoPE base.
    pub theta: f32,
    /// Whether an input projection exists (talker and code predictor widths differ).
    pub proj_in: bool,
}

/// Where the code predictor's time went (`QTTS_PROFILE=1`), per sub-step of a frame, summed over
/// frames.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    /// Frames run.
    pub frames: u64,
    /// Loading: weight copies and building the 15 graphs (once).
    pub load: std::time::Duration,
    /// Writing inputs and reading outputs of the graphs.
    pub copies: [std::time::Duration; 15],
    /// ggml graph compute.
    pub compute: [std::time::Duration; 15],
    /// The host sample heads.
    pub heads: [std::time::Duration; 15],
    /// The caller's pick (sampling).
    pub pick: [std::time::Duration; 15],
}

impl Profile {
    /// A table of mean milliseconds per frame, per sub-step and in total.
    pub fn table(&self) -> String {
        let n = self.frames.max(1) as f64;
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3 / n;
        let mut s = format!(
            "code predictor: {} frames, load {:.1} ms; mean ms per frame\nstep  compute  heads  pick  copies\n",
            self.frames,
            self.load.as_secs_f64() * 1e3
        );
        let mut tot = [0f64; 4];
        for i in 0..15 {
            let row = [
                ms(self.compute[i]),
                ms(self.heads[i]),
                ms(self.pick[i]),
                ms(self.copies[i]),
            ];
            for (t, r) in tot.iter_mut().zip(row) {
                *t += r;
            }
            s += &format!(
                "{:>4} {:>8.3} {:>6.3} {:>5.3} {:>7.3}\n",
                i, row[0], row[1], row[2], row[3]
            );
        }
        s += &format!(
            "total {:>7.3} {:>6.3} {:>5.3} {:>7.3}  = {:.3} ms\n",
            tot[0],
            tot[1],
            tot[2],
            tot[3],
            tot.iter().sum::<f64>()
        );
        s
    }
}

/// The names of the weights [`layer_product`] may multiply by, for `n_layer` layers (the
/// `JOINED` (`qwen3::products`) matrices and their parts: a context holds one or the other).
fn product_names(n_layer: usize) -> Vec<String> {
    let mut names = vec!["a.gen.code.proj_in.weight".to_string()];
    for l in 0..n_layer {
        for m in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_qkv",
            "attn_out",
            "ffn_gate",
            "ffn_up",
            "ffn_gate_up",
            "ffn_down",
        ] {
            names.push(format!("a.gen.code.blk.{l}.{m}.weight"));
        }
    }
    names
}

/// The code predictor stage: weights, KV cache and the graphs of one frame.
#[derive(Debug)]
pub struct CodePredictor {
    geometry: Geometry,
    /// The frame's graphs (each holds the contexts it reads).
    steps: Vec<OwnedGraph>,
    /// With packed heads, one tensor per head over the packed bytes (`head.{k}`), which the
    /// graphs multiply by.
    heads_ctx: Option<SharedContext>,
    heads: Heads,
    logits: Vec<f32>,
    last: Vec<f32>,
    /// One embedding row, for [`CodePredictor::embed_frame`].
    row: Vec<f32>,
    profile: Option<Profile>,
    /// What computes the q4_K, q5_K and q8_0 layer products (and whether they are packed).
    kernel: LayerKernel,
    /// The weights and the KV cache, read by the graphs (which hold them too).
    weights: SharedContext,
    /// Several streams' frames at once ([`CodePredictor::frames`]).
    batched: batch::Batched,
}

impl Geometry {
    fn read(f: &GgufFile) -> Result<Self, ModelError> {
        crate::model::validate::check_mmproj(f.path(), &f.header)?;
        let h = &f.header;
        let u = |k: &str| h.get(k).and_then(Value::as_i64).unwrap_or(0) as usize;
        let head = h
            .tensor("a.gen.code.head.weight")
            .map(|t| t.ne.clone())
            .unwrap_or_default();
        let q = h
            .tensor("a.gen.code.blk.0.attn_q.weight")
            .map(|t| t.ne[1])
            .unwrap_or(0) as usize;
        let n_head = u("clip.gen.audio.attention.head_count").max(1);
        // llama.cpp hard-codes θ = 1e6; the checkpoint's own value travels in the carried config.
        let theta = h
            .get(crate::model::convert::KEY_HF_CONFIG)
            .and_then(Value::as_str)
            .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
            .and_then(|v| v["talker_config"]["code_predictor_config"]["rope_theta"].as_f64())
            .unwrap_or(1e6) as f32;
        let eps = match h.get("clip.gen.audio.attention.layer_norm_epsilon") {
            Some(Value::F32(e)) => *e,
            _ => 1e-6,
        };
        Ok(Geometry {
            n_talker: u("clip.gen.audio.projection_dim"),
            n_embd: u("clip.gen.audio.embedding_length"),
            n_layer: u("clip.gen.audio.block_count"),
            n_head,
            n_head_kv: u("clip.gen.audio.attention.head_count_kv"),
            head_dim: q / n_head,
            n_ff: u("clip.gen.audio.feed_forward_length"),
            n_codes: head.get(1).copied().unwrap_or(0) as usize,
            n_groups: head.get(2).copied().unwrap_or(0) as usize,
            eps,
            theta,
            proj_in: h.tensor("a.gen.code.proj_in.weight").is_some(),
        })
    }
}

impl CodePredictor {
    /// Loads the code predictor from a validated mmproj file.
    pub fn load(f: &GgufFile) -> Result<Self, ModelError> {
        Self::load_joining(f, true)
    }

    /// As [`CodePredictor::load`], with `join` false: each layer matrix multiplied on its own
    /// instead of the `JOINED` (`qwen3::products`) groups as one (the same values, more graph nodes; the baseline
    /// the joined products are tested against).
    pub fn load_joining(f: &GgufFile, join: bool) -> Result<Self, ModelError> {
        let started = std::time::Instant::now();
        let g = Geometry::read(f)?;
        let code: Vec<_> = f
            .header
            .tensors
            .iter()
            .filter(|t| t.name.starts_with("a.gen.code.") && t.name != HEAD)
            .collect();
        let weight_bytes: u64 = code.iter().map(|t| t.nbytes).sum();
        let cache_bytes = 2 * g.n_layer * g.head_dim * g.n_head_kv * POSITIONS * 4;
        let overhead = (code.len() + 2 * g.n_layer + 16) * 512;
        let weights = SharedContext::new(
            Context::new(weight_bytes as usize + cache_bytes + overhead + (1 << 20))
                .map_err(ModelError::from)?,
        );
        let kernel = LayerKernel::fastest();
        let products = product_names(g.n_layer);
        let mut joined = Vec::new();
        for l in (0..g.n_layer).filter(|_| join) {
            let name = |m: &str| format!("a.gen.code.blk.{l}.{m}");
            joined.extend(write_layer_joined(&weights, f, &name, &name, kernel)?);
        }
        for t in code.iter().filter(|t| !joined.contains(&t.name)) {
            let ne: Vec<usize> = t.ne.iter().map(|&x| x as usize).collect();
            let w = weights.new_tensor(t.ty, &ne).map_err(ModelError::from)?;
            // The validated header guarantees the data is inside the file.
            let data = f.tensor_data(&t.name).unwrap_or_default();
            if products.contains(&t.name) {
                write_product_weight(w, t.ty, data.into(), kernel).map_err(ModelError::from)?;
            } else {
                w.write_bytes(data).map_err(ModelError::from)?;
            }
            w.set_name(&t.name);
            f.release(&t.name);
        }
        for l in 0..g.n_layer {
            // Keys by position, values transposed (see `qwen3::Kv::Cache`).
            weights
                .new_f32(&[g.head_dim, g.n_head_kv, POSITIONS])
                .map_err(ModelError::from)?
                .set_name(&format!("cache.k.{l}"));
            weights
                .new_f32(&[POSITIONS, g.head_dim * g.n_head_kv])
                .map_err(ModelError::from)?
                .set_name(&format!("cache.v.{l}"));
        }
        let heads = load_heads(f, &g)?;
        f.release(HEAD);
        let steps = build_steps(&weights, None, &g, kernel)?;
        let profile = std::env::var_os("QTTS_PROFILE")
            .is_some_and(|v| v == "1")
            .then(|| Profile {
                load: started.elapsed(),
                ..Profile::default()
            });
        Ok(CodePredictor {
            geometry: g,
            steps,
            heads,
            logits: vec![0.0; g.n_codes],
            last: vec![0.0; g.n_embd],
            row: vec![0.0; g.n_talker],
            profile,
            kernel,
            heads_ctx: None,
            weights,
            batched: batch::Batched::default(),
        })
    }

    /// Computes the q4_K, q5_K and q8_0 layer products with `kernel` (default:
    /// [`LayerKernel::fastest`]): packs or unpacks the matrices as needed and rebuilds the frame's
    /// graphs. Packed kernels the process's kernel tier lacks are refused.
    pub fn set_layer_kernel(&mut self, kernel: LayerKernel) -> Result<(), ModelError> {
        kernel.check_available()?;
        if kernel == self.kernel {
            return Ok(());
        }
        // The graphs hold pointers into the weights, not their bytes: rearranging the bytes in
        // place needs no rebuild by itself, but the graphs pick the kernel.
        for name in product_names(self.geometry.n_layer) {
            let Some(w) = self.weights.get(&name) else {
                continue;
            };
            let (was, will) = (packed_type(self.kernel, w), packed_type(kernel, w));
            // Packed under one of the two kernels only: rearrange.
            let Some(ty) = was.xor(will) else {
                continue;
            };
            let mut bytes = w.read_bytes().map_err(ModelError::from)?;
            repack(ty, &mut bytes, w.ne()[1], will.is_some());
            w.write_bytes(&bytes).map_err(ModelError::from)?;
        }
        self.steps = build_steps(
            &self.weights,
            self.heads_ctx.as_ref(),
            &self.geometry,
            kernel,
        )?;
        self.batched.clear_graphs();
        self.kernel = kernel;
        Ok(())
    }

    /// How many `JOINED` (`qwen3::products`) matrices the layers hold (two a layer when the file's types allow).
    pub fn joined(&self) -> usize {
        (0..self.geometry.n_layer)
            .flat_map(|l| JOINED.map(|(n, _)| format!("a.gen.code.blk.{l}.{n}")))
            .filter(|n| self.weights.get(n).is_some())
            .count()
    }

    /// The kernel of the layer products.
    pub fn layer_kernel(&self) -> LayerKernel {
        self.kernel
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Stores the sample heads as q8_0 from now on (a quarter of their memory traffic; logits within
    /// quantization error of the f32 ones). Fails when the width is not a multiple of 32.
    pub fn use_q8_heads(&mut self) -> Result<(), ModelError> {
        if self.heads.is_packed() {
            // Packed heads are q8_0 already (and the graphs may read their bytes).
            return Ok(());
        }
        let q = self.heads.to_q8().ok_or_else(|| ModelError::Unsupported {
            what: "q8_0 sample heads".into(),
            expected: "a code-predictor width that is a multiple of 32".into(),
            found: self.geometry.n_embd.to_string(),
        })?;
        self.heads = q;
        Ok(())
    }

    /// Packs q8_0 sample heads for the tier's packed q8_0 kernel ([`Heads::to_packed`]): the
    /// heads several times faster, their input quantized to int8 as the layers' is (the same
    /// logits on every tier, not those of the unpacked heads). Does nothing to f32 heads (which
    /// stay exact) or on a tier without packed kernels; returns whether the heads are packed.
    ///
    /// Packed heads are multiplied by each sub-step's graph, as its last node, on the pool's
    /// threads; when those graphs cannot be built, by this thread between the graphs.
    pub fn pack_heads(&mut self) -> bool {
        if let Some(p) = self.heads.to_packed() {
            self.heads = p;
            // Without the graph heads the packed heads still run, on this thread.
            let _ = self.heads_in_graphs();
        }
        self.heads.is_packed()
    }

    /// Rebuilds the frame's graphs with the packed heads as their last node.
    fn heads_in_graphs(&mut self) -> Result<(), ModelError> {
        let g = self.geometry;
        let Some(bytes) = self.heads.packed_bytes() else {
            return Ok(());
        };
        let per_head = bytes.len() / g.n_groups.max(1);
        let views: Vec<_> = (0..g.n_groups)
            .map(|k| {
                let shape = vec![g.n_embd, g.n_codes];
                (format!("head.{k}"), GgmlType::Q8_0, shape, k * per_head)
            })
            .collect();
        // The heads' tensors view the packed bytes, which the context holds.
        let ctx = SharedContext::over_bytes(bytes, &views).map_err(ModelError::from)?;
        self.steps = build_steps(&self.weights, Some(&ctx), &g, self.kernel)?;
        self.batched.clear_graphs();
        self.heads_ctx = Some(ctx);
        Ok(())
    }

    /// Whether the sample heads run as the last node of each sub-step's graph (packed heads,
    /// [`CodePredictor::pack_heads`]).
    pub fn heads_in_graph(&self) -> bool {
        self.heads_ctx.is_some()
    }

    /// The sample heads.
    pub fn heads(&self) -> &Heads {
        &self.heads
    }

    /// Chooses the kernel of the sample heads that run on this thread (f32 and q8_0 heads).
    pub fn set_heads_kernel(&mut self, kernel: Kernel) {
        self.heads.set_kernel(kernel);
    }

    /// Runs one frame: `hidden` is the talker's final-normed hidden state (width `n_talker`),
    /// `code0` its codebook-0 code. For each of the 15 heads, `pick(group, logits)` chooses that
    /// codebook's code from the head's logits (2048 values). Returns the 15 codes; when `hidden_out`
    /// is given, it receives the code predictor's final-normed hidden state of positions 0..15
    /// (`16 × n_embd` values), for tests.
    pub fn frame(
        &mut self,
        pool: &Threadpool,
        hidden: &[f32],
        code0: u32,
        pick: &mut dyn FnMut(usize, &[f32]) -> u32,
        mut hidden_out: Option<&mut Vec<f32>>,
    ) -> Result<[u32; 15], ModelError> {
        let g = self.geometry;
        if hidden.len() != g.n_talker
            || code0 as usize >= crate::model::validate::CODEC_VOCAB as usize
        {
            return Err(ModelError::Unsupported {
                what: "code predictor input".into(),
                expected: format!("a hidden state of {} and a code below 3072", g.n_talker),
                found: format!("{} values and code {code0}", hidden.len()),
            });
        }
        let mut codes = [0u32; 15];
        let (logits, last) = (&mut self.logits, &mut self.last);
        if let Some(h) = hidden_out.as_deref_mut() {
            h.clear();
        }
        let mut code = code0;
        let profiling = self.profile.is_some();
        let mut clock = profiling.then(std::time::Instant::now);
        let mut lap = |slot: fn(&mut Profile) -> &mut [std::time::Duration; 15],
                       step: usize,
                       profile: &mut Option<Profile>| {
            if let (Some(t), Some(p)) = (clock.as_mut(), profile.as_mut()) {
                let now = std::time::Instant::now();
                slot(p)[step] += now - *t;
                *t = now;
            }
        };
        for (step, graph) in self.steps.iter_mut().enumerate() {
            let missing = |n: &str| {
                ModelError::from(GgmlError::Shape {
                    what: "graph tensor",
                    expected: n.to_owned(),
                    found: "none".into(),
                })
            };
            if step == 0 {
                let t = graph
                    .tensor("in.hidden")
                    .ok_or_else(|| missing("in.hidden"))?;
                t.write_f32(hidden).map_err(ModelError::from)?;
            }
            let t = graph.tensor("in.code").ok_or_else(|| missing("in.code"))?;
            t.write_i32(&[code as i32]).map_err(ModelError::from)?;
            lap(|p| &mut p.copies, step, &mut self.profile);
            graph.compute(pool).map_err(ModelError::from)?;
            lap(|p| &mut p.compute, step, &mut self.profile);
            if self.heads_ctx.is_some() {
                // The graph's last node was the head.
                let t = graph
                    .tensor("out.logits")
                    .ok_or_else(|| missing("out.logits"))?;
                t.read_f32(logits).map_err(ModelError::from)?;
                lap(|p| &mut p.copies, step, &mut self.profile);
            } else {
                let t = graph
                    .tensor("out.last")
                    .ok_or_else(|| missing("out.last"))?;
                t.read_f32(last).map_err(ModelError::from)?;
                lap(|p| &mut p.copies, step, &mut self.profile);
                self.heads.logits(step, last, logits);
            }
            lap(|p| &mut p.heads, step, &mut self.profile);
            if let Some(h) = hidden_out.as_deref_mut() {
                let t = graph
                    .tensor("out.hidden")
                    .ok_or_else(|| missing("out.hidden"))?;
                h.extend(t.to_vec());
            }
            code = pick(step, logits);
            lap(|p| &mut p.pick, step, &mut self.profile);
            if code as usize >= g.n_codes {
                return Err(ModelError::Unsupported {
                    what: format!("code picked for codebook {}", step + 1),
                    expected: format!("a code below {}", g.n_codes),
                    found: code.to_string(),
                });
            }
            codes[step] = code;
        }
        if let Some(p) = self.profile.as_mut() {
            p.frames += 1;
        }
        Ok(codes)
    }

    /// The time profile so far, when `QTTS_PROFILE=1` was set at load.
    pub fn profile(&self) -> Option<&Profile> {
        self.profile.as_ref()
    }

    /// The talker's input for the step after a frame, before its text part: the talker's codec
    /// embedding of `codes[0]` plus the code predictor's embedding of each of `codes[1..16]`
    /// (MODEL-NOTES.md §4.4: `C(c0) + Σ Ck(ck)`, summed in that order), written to `out`
    /// (`n_talker` values). Allocates nothing.
    pub fn embed_frame(&mut self, codes: &[u32; 16], out: &mut [f32]) -> Result<(), ModelError> {
        let g = self.geometry;
        let bad = |found: String| ModelError::Unsupported {
            what: "frame to embed".into(),
            expected: format!(
                "{} values and codes below 3072 (codebook 0), {} (others)",
                g.n_talker, g.n_codes
            ),
            found,
        };
        if out.len() != g.n_talker {
            return Err(bad(format!("{} values", out.len())));
        }
        if codes[0] as usize >= crate::model::validate::CODEC_VOCAB as usize
            || codes[1..].iter().any(|&c| c as usize >= g.n_codes)
        {
            return Err(bad(format!("codes {codes:?}")));
        }
        let missing = |n: &str| ModelError::MissingTensor {
            path: "code predictor context".into(),
            tensor: n.into(),
        };
        let c0 = self
            .weights
            .get("a.gen.code.out_embd.weight")
            .ok_or_else(|| missing("a.gen.code.out_embd.weight"))?;
        c0.read_row(codes[0] as usize, out)?;
        let tables = self
            .weights
            .get("a.gen.code.embd.weight")
            .ok_or_else(|| missing("a.gen.code.embd.weight"))?;
        self.row.resize(g.n_talker, 0.0);
        for (k, &c) in codes[1..].iter().enumerate() {
            tables.read_row(k * g.n_codes + c as usize, &mut self.row)?;
            for (o, x) in out.iter_mut().zip(&self.row) {
                *o += x;
            }
        }
        Ok(())
    }

    /// Returns the profile so far and starts a new one (at the end of an utterance).
    pub fn take_profile(&mut self) -> Option<Profile> {
        let load = self.profile.as_ref()?.load;
        self.profile.replace(Profile {
            load,
            ..Profile::default()
        })
    }
}

impl CodePredictor {
    /// [`CodePredictor::frame`] without the KV cache: each of the 15 steps builds a graph over all
    /// positions so far and recomputes them (allocating, and 15× the work). The reference the cached
    /// path is tested against; returns the codes and the 15 heads' logits.
    pub fn frame_recomputed(
        &mut self,
        pool: &Threadpool,
        hidden: &[f32],
        code0: u32,
        pick: &mut dyn FnMut(usize, &[f32]) -> u32,
    ) -> Result<([u32; 15], Vec<f32>), ModelError> {
        let g = self.geometry;
        let mut codes = vec![code0];
        let mut all = Vec::with_capacity(15 * g.n_codes);
        let mut last = vec![0f32; g.n_embd];
        let mut logits = vec![0f32; g.n_codes];
        for step in 0..POSITIONS - 1 {
            let mut graph = build_step(&self.weights, None, &g, step, false, self.kernel)
                .map_err(ModelError::from)?;
            let t = |n: &str| {
                graph.tensor(n).ok_or_else(|| {
                    ModelError::from(GgmlError::Shape {
                        what: "graph tensor",
                        expected: n.to_owned(),
                        found: "none".into(),
                    })
                })
            };
            t("in.hidden")?
                .write_f32(hidden)
                .map_err(ModelError::from)?;
            let ids: Vec<i32> = codes.iter().map(|&c| c as i32).collect();
            t("in.codes")?.write_i32(&ids).map_err(ModelError::from)?;
            graph.compute(pool).map_err(ModelError::from)?;
            let t = graph
                .tensor("out.last")
                .ok_or_else(|| ModelError::from(GgmlError::Compute { status: -1 }))?;
            t.read_f32(&mut last).map_err(ModelError::from)?;
            self.heads.logits(step, &last, &mut logits);
            all.extend_from_slice(&logits);
            codes.push(pick(step, &logits));
        }
        let mut out = [0u32; 15];
        out.copy_from_slice(&codes[1..]);
        Ok((out, all))
    }
}
