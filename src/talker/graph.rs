//! The talker's layers on this crate's own ggml graphs ([`super::Runtime::Graph`]): the same
//! Qwen3 layers as llama.cpp's `qwen3tts` graph (`qwen3::layer`), with the products by
//! the code predictor's kernels, so that a quantized talker step runs the tier's packed kernels
//! instead of llama.cpp's.
//!
//! Contract:
//! - [`Layers::load`] copies the layer matrices, the final norm and the codec rows of the head
//!   (the last 3072 rows of `output.weight`) out of the mapped file (packing q4_K, q5_K and q8_0
//!   matrices for [`LayerKernel::Packed`]) and releases their pages.
//! - A [`State`] is one session's KV cache and its step graph: for the exact path f32 keys by
//!   position and values transposed, attended by ggml's products and softmax; else q8_0 keys and
//!   values by position (llama.cpp's runtime's choice, half of f16's bytes), attended by ggml's
//!   flash attention (which skips the masked keys), or, for a step under
//!   [`LayerKernel::Packed`], by one node of the crate's own (`ffi::Context::attend_q8_row`,
//!   which reads each key and value row once for the query heads that share it). [`State::run`] computes rows at positions `p0..`, leaving
//!   the last row's final-normed hidden state and codec logits in [`State::hidden`] and
//!   [`State::logits`]. A one-row step runs a graph built for every position of its block of
//!   `BLOCK` (64) positions (the cache writes' positions are inputs, the block's later keys masked),
//!   rebuilt when the position enters a new block; a prefill of several rows builds a graph for
//!   its positions. Both are placed by ggml's graph allocator. A step allocates nothing between
//!   blocks.

use super::CODEC_VOCAB;
use crate::error::ModelError;
use crate::ffi::{Context, GgmlError, OwnedGraph, SharedContext, Tensor, Threadpool};
use crate::gguf::{GgmlType, GgufFile, Value};
use crate::qwen3::{
    self, layer_product, write_layer_joined, write_product_weight, Dims, Kv, LayerKernel, Names,
    JOINED,
};

/// llama.cpp's names of the talker's layer tensors that the code predictor names differently.
const NAMES: Names = Names {
    attn_norm: "attn_norm.weight",
    attn_out: "attn_output.weight",
    ffn_norm: "ffn_norm.weight",
};

/// The layer matrices (the products [`layer_product`] computes).
const MATRICES: [&str; 7] = [
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "ffn_gate.weight",
    "ffn_up.weight",
    "ffn_down.weight",
];

/// The talker's weights in a ggml context, and how its products run.
#[derive(Debug)]
pub struct Layers {
    dims: Dims,
    n_layer: usize,
    n_embd: usize,
    kernel: LayerKernel,
    /// One context per layer (tensors named as in a layer: `attn_q.weight`, ...), then one for
    /// `output_norm.weight` and the codec head's `output.weight`.
    weights: Vec<SharedContext>,
    /// Whether every product is the crate's kernels' ([`qwen3::own_products`]).
    own: bool,
}

impl Layers {
    /// Copies the talker's layers, final norm and codec head out of `f` (a validated talker
    /// file), packing q4_K, q5_K and q8_0 matrices when `kernel` is [`LayerKernel::Packed`].
    pub fn load(f: &GgufFile, kernel: LayerKernel) -> Result<Self, ModelError> {
        Self::load_joining(f, kernel, true)
    }

    /// As [`Layers::load`], with `join` false: each layer matrix multiplied on its own instead
    /// of the `JOINED` (`qwen3::products`) groups as one (the baseline the joined products are tested against).
    pub fn load_joining(f: &GgufFile, kernel: LayerKernel, join: bool) -> Result<Self, ModelError> {
        let h = &f.header;
        let a = "qwen3tts";
        let u = |k: &str| {
            h.get(&format!("{a}.{k}"))
                .and_then(Value::as_i64)
                .unwrap_or(0) as usize
        };
        let fl = |k: &str, default: f32| match h.get(&format!("{a}.{k}")) {
            Some(Value::F32(x)) => *x,
            _ => default,
        };
        let dims = Dims {
            n_head: u("attention.head_count"),
            n_head_kv: u("attention.head_count_kv"),
            head_dim: u("attention.key_length"),
            eps: fl("attention.layer_norm_rms_epsilon", 1e-6),
            theta: fl("rope.freq_base", 1e6),
        };
        let (n_layer, n_embd) = (u("block_count"), u("embedding_length"));
        // Per layer, the names in the file and in the layer's context.
        let layer_names: Vec<&str> = [
            NAMES.attn_norm,
            NAMES.ffn_norm,
            "attn_q_norm.weight",
            "attn_k_norm.weight",
        ]
        .into_iter()
        .chain(MATRICES)
        .collect();
        let missing = |n: &str| ModelError::MissingTensor {
            path: f.path().into(),
            tensor: n.into(),
        };
        let head = h
            .tensor("output.weight")
            .ok_or_else(|| missing("output.weight"))?;
        let head_ne: Vec<usize> = head.ne.iter().map(|&x| x as usize).collect();
        if head_ne.len() != 2 || head_ne[0] != n_embd || head_ne[1] < CODEC_VOCAB {
            return Err(ModelError::WrongShape {
                path: f.path().into(),
                tensor: "output.weight".into(),
                expected: vec![n_embd as u64, CODEC_VOCAB as u64],
                found: head.ne.clone(),
            });
        }
        // One context per layer (and one for the rest): a graph build looks each weight up by
        // name, and ggml's lookup scans its context.
        let mut weights = Vec::with_capacity(n_layer + 1);
        for l in 0..n_layer {
            let file_name = |n: &str| format!("blk.{l}.{n}");
            let mut bytes = 0u64;
            for n in &layer_names {
                bytes += h
                    .tensor(&file_name(n))
                    .ok_or_else(|| missing(&file_name(n)))?
                    .nbytes;
            }
            let ctx = Context::new(bytes as usize + (layer_names.len() + 4) * 1024 + (64 << 10))
                .map_err(ModelError::from)?;
            let joined = if join {
                write_layer_joined(&ctx, f, &file_name, &|m| m.to_string(), kernel)?
            } else {
                Vec::new()
            };
            for n in &layer_names {
                let name = file_name(n);
                if joined.contains(&name) {
                    continue;
                }
                let t = h.tensor(&name).ok_or_else(|| missing(&name))?;
                let ne: Vec<usize> = t.ne.iter().map(|&x| x as usize).collect();
                let w = ctx.new_tensor(t.ty, &ne).map_err(ModelError::from)?;
                // The validated header guarantees the data is inside the file.
                let data = f.tensor_data(&name).ok_or_else(|| missing(&name))?;
                if MATRICES.contains(n) {
                    write_product_weight(w, t.ty, data.into(), kernel).map_err(ModelError::from)?;
                } else {
                    w.write_bytes(data).map_err(ModelError::from)?;
                }
                w.set_name(n);
                f.release(&name);
            }
            weights.push(SharedContext::new(ctx));
        }
        let norm = h
            .tensor("output_norm.weight")
            .ok_or_else(|| missing("output_norm.weight"))?;
        let top = Context::new((norm.nbytes + head.nbytes) as usize + (64 << 10))
            .map_err(ModelError::from)?;
        let w = top
            .new_tensor(norm.ty, &[n_embd])
            .map_err(ModelError::from)?;
        w.write_bytes(
            f.tensor_data("output_norm.weight")
                .ok_or_else(|| missing("output_norm.weight"))?,
        )
        .map_err(ModelError::from)?;
        w.set_name("output_norm.weight");
        // Only the codec rows of the head: llama.cpp's own conversions carry a row per token of
        // the unified vocabulary, of which the codec's are the last 3072.
        let data = f
            .tensor_data("output.weight")
            .ok_or_else(|| missing("output.weight"))?;
        let row = data.len() / head_ne[1];
        let codec = &data[(head_ne[1] - CODEC_VOCAB) * row..];
        let w = top
            .new_tensor(head.ty, &[n_embd, CODEC_VOCAB])
            .map_err(ModelError::from)?;
        write_product_weight(w, head.ty, codec.into(), kernel).map_err(ModelError::from)?;
        w.set_name("output.weight");
        f.release("output.weight");
        weights.push(SharedContext::new(top));
        let products: Vec<&str> = MATRICES
            .into_iter()
            .chain(JOINED.iter().map(|(n, _)| *n))
            .collect();
        let own = weights[..n_layer]
            .iter()
            .all(|c| qwen3::own_products(kernel, c, products.iter().copied()))
            && qwen3::own_products(kernel, &weights[n_layer], ["output.weight"]);
        Ok(Layers {
            dims,
            n_layer,
            n_embd,
            kernel,
            weights,
            own,
        })
    }

    /// What a graph over these layers and `cache` reads: every weight context, then the cache.
    fn reads<'a>(&'a self, cache: &'a SharedContext) -> Vec<&'a SharedContext> {
        self.weights.iter().chain([cache]).collect()
    }

    /// How many `JOINED` (`qwen3::products`) matrices the layers hold (two a layer when the file's types allow).
    pub fn joined(&self) -> usize {
        self.weights
            .iter()
            .map(|c| JOINED.iter().filter(|(n, _)| c.get(n).is_some()).count())
            .sum()
    }

    /// The kernel of the products.
    pub fn kernel(&self) -> LayerKernel {
        self.kernel
    }

    /// Whether a graph of `rows` rows over q8_0 caches attends in one node of the engine's own
    /// ([`Context::attend_q8_row`], reading the position, no mask) rather than by ggml's flash
    /// attention: a step under the crate's kernels ([`LayerKernel::Scalar`], [`LayerKernel::Packed`]).
    fn attends_row_itself(&self, rows: usize) -> bool {
        rows == 1 && self.kernel != LayerKernel::Ggml
    }

    /// Bytes of one position's keys and values in `ty`.
    fn kv_bytes(&self, ty: GgmlType) -> usize {
        let width = (self.dims.head_dim * self.dims.n_head_kv) as u64;
        2 * self.n_layer * ty.nbytes(&[width]).unwrap_or(4 * width) as usize
    }

    /// The graph of `rows` rows over the cache in `cache`, written at `at`; returns its outputs
    /// (cache writes first, then `out.hidden` and `out.logits`). Inputs: `in.rows`, `in.pos`,
    /// `in.mask` (f16 under flash attention, unless a step's row attends in one node; f32 on the
    /// exact path for more than one row or [`At::Block`]'s positions), and `in.vidx` for
    /// [`At::Block`] (see [`Kv::Indexed`]).
    fn build<'a>(
        &'a self,
        c: &'a Context,
        cache: &'a Context,
        rows: usize,
        at: At,
        flash: bool,
    ) -> Result<Vec<Tensor<'a>>, GgmlError> {
        let get = |ctx: &'a Context, n: &str| {
            ctx.get(n).ok_or(GgmlError::Shape {
                what: "talker tensor",
                expected: n.to_owned(),
                found: "none".into(),
            })
        };
        let (h, d) = (self.n_embd, self.dims);
        let input = c.new_tensor(GgmlType::F32, &[h, rows])?.set_name("in.rows");
        let pos = c.new_i32(rows)?.set_name("in.pos");
        let n_kv = match at {
            At::Fixed(p0) => p0 + rows,
            At::Block { n_kv } => n_kv,
        };
        // A step's row may attend in one node; a prefill's rows always go to flash attention.
        let step = matches!(at, At::Block { .. });
        let mask = if flash && step && self.attends_row_itself(rows) {
            None
        } else if flash {
            Some(
                c.new_tensor(GgmlType::F16, &[n_kv, rows])?
                    .set_name("in.mask"),
            )
        } else if rows > 1 || matches!(at, At::Block { .. }) {
            Some(
                c.new_tensor(GgmlType::F32, &[n_kv, rows])?
                    .set_name("in.mask"),
            )
        } else {
            None
        };
        let v_idx = match at {
            At::Block { .. } if !flash => Some(
                c.new_i32(rows * d.head_dim * d.n_head_kv)?
                    .set_name("in.vidx"),
            ),
            _ => None,
        };
        let mut outs = Vec::new();
        let mut x = input;
        for l in 0..self.n_layer {
            let w = |n: &str| get(&self.weights[l], n);
            let (k, v) = (
                get(cache, &format!("cache.k.{l}"))?,
                get(cache, &format!("cache.v.{l}"))?,
            );
            let kv = match (at, v_idx) {
                _ if flash => Kv::Flash { k, v, n_kv },
                (At::Block { n_kv }, Some(v_idx)) => Kv::Indexed { k, v, v_idx, n_kv },
                (At::Fixed(p0), _) => Kv::Cache { k, v, p0 },
                (At::Block { .. }, None) => return Err(port("in.vidx")),
            };
            x = qwen3::layer(c, &w, NAMES, d, x, pos, mask, kv, self.kernel, &mut outs)?;
        }
        let last = if rows > 1 {
            let nb = [4, 4 * h, 4 * h];
            c.cont(c.view(x, [h, 1, 1], nb, (rows - 1) * 4 * h)?)?
        } else {
            x
        };
        self.output(c, last, &mut outs)?;
        Ok(outs)
    }
}

impl Layers {
    /// Whether sessions' steps over these layers can run as one [`Batch`]: q8_0 caches attended
    /// row by row in the crate's own node, and every product by the crate's kernels, whose
    /// results for a row do not depend on the other rows.
    pub(super) fn batches(&self, state: &State<'_>) -> bool {
        std::ptr::eq(state.layers, self) && state.flash && self.attends_row_itself(1) && self.own
    }

    /// The step graph of one row per cache of `caches` (row `r` at position `in.pos[r]` of
    /// `caches[r]`): each row's layer as [`Layers::build`] makes it for one row
    /// ([`qwen3::layer_groups`]), the products over all rows at once.
    fn build_batch<'a>(
        &'a self,
        c: &'a Context,
        caches: &[&'a Context],
    ) -> Result<Vec<Tensor<'a>>, GgmlError> {
        let get = |ctx: &'a Context, n: &str| {
            ctx.get(n).ok_or(GgmlError::Shape {
                what: "talker tensor",
                expected: n.to_owned(),
                found: "none".into(),
            })
        };
        let (h, d, rows) = (self.n_embd, self.dims, caches.len());
        let input = c.new_tensor(GgmlType::F32, &[h, rows])?.set_name("in.rows");
        let pos = c.new_i32(rows)?.set_name("in.pos");
        let mut outs = Vec::new();
        let mut x = input;
        for l in 0..self.n_layer {
            let w = |n: &str| get(&self.weights[l], n);
            let mut groups = Vec::with_capacity(rows);
            for cache in caches {
                let (k, v) = (
                    get(cache, &format!("cache.k.{l}"))?,
                    get(cache, &format!("cache.v.{l}"))?,
                );
                let n_kv = k.ne()[1];
                groups.push(qwen3::Group {
                    rows: 1,
                    mask: None,
                    kv: Kv::Flash { k, v, n_kv },
                });
            }
            x = qwen3::layer_groups(c, &w, NAMES, d, x, pos, &groups, self.kernel, &mut outs)?;
        }
        self.output(c, x, &mut outs)?;
        Ok(outs)
    }
}

/// One step of several sessions at once: one row each, at its own position in its own cache
/// (continuous batching). The graph is built for a list of caches and kept while the list
/// stays the same (a stream joining or leaving rebuilds it); positions are inputs. Each row's
/// hidden state and logits are the bits of the same step run alone ([`State::run`]).
#[derive(Debug, Default)]
pub struct Batch {
    /// The caches the graph was built for (their addresses), and the graph.
    graph: Option<(Vec<usize>, OwnedGraph)>,
    pos: Vec<i32>,
    hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl Batch {
    /// Runs `rows` (one row of the talker's width per state) at `pos` (one each) in `states`,
    /// which must all be over one [`Layers`] whose [`Layers::batches`] holds for them; each
    /// state's [`State::hidden`] and [`State::logits`] are then its row's.
    pub(super) fn run(
        &mut self,
        states: &mut [&mut State<'_>],
        rows: &[f32],
        pos: &[usize],
        pool: &Threadpool,
    ) -> Result<(), GgmlError> {
        let Some(first) = states.first() else {
            return Ok(());
        };
        let layers = first.layers;
        let (h, n) = (layers.n_embd, states.len());
        let fits = states.iter().zip(pos).all(|(s, &p)| p < s.n_ctx);
        if rows.len() != n * h || pos.len() != n || !fits {
            return Err(GgmlError::Shape {
                what: "talker batch",
                expected: format!("{n} rows of {h} at positions within their contexts"),
                found: format!("{} values at positions {pos:?}", rows.len()),
            });
        }
        if !states.iter().all(|s| layers.batches(s)) {
            return Err(GgmlError::Shape {
                what: "talker batch",
                expected: "q8_0 caches over one set of layers under the crate's kernels".into(),
                found: "another cache or kernel".into(),
            });
        }
        let key: Vec<usize> = states
            .iter()
            .map(|s| &*s.cache as *const Context as usize)
            .collect();
        if self.graph.as_ref().map(|g| &g.0) != Some(&key) {
            self.graph = None;
            let mut reads = layers.reads(&states[0].cache);
            reads.extend(states[1..].iter().map(|s| &s.cache));
            let caches: Vec<&Context> = states.iter().map(|s| &*s.cache).collect();
            // About 20 nodes a row and 10 more a layer.
            let nodes = layers.n_layer * (10 + 24 * n) + 64;
            let g = OwnedGraph::build_allocated_nodes(None, &reads, nodes, |c| {
                let outs = layers.build_batch(c, &caches)?;
                Ok(outs.into_iter().map(Tensor::node).collect())
            })?;
            self.graph = Some((key, g));
        }
        let Some((_, g)) = self.graph.as_mut() else {
            return Err(port("batch graph"));
        };
        self.pos.clear();
        self.pos.extend(pos.iter().map(|&p| p as i32));
        let t = |name: &'static str| g.tensor(name).ok_or_else(|| port(name));
        t("in.rows")?.write_f32(rows)?;
        t("in.pos")?.write_i32(&self.pos)?;
        g.compute(pool)?;
        let t = |name: &'static str| g.tensor(name).ok_or_else(|| port(name));
        self.hidden.resize(n * h, 0.0);
        self.logits.resize(n * CODEC_VOCAB, 0.0);
        t("out.hidden")?.read_f32(&mut self.hidden)?;
        t("out.logits")?.read_f32(&mut self.logits)?;
        for (i, s) in states.iter_mut().enumerate() {
            s.hidden.copy_from_slice(&self.hidden[i * h..(i + 1) * h]);
            s.logits
                .copy_from_slice(&self.logits[i * CODEC_VOCAB..(i + 1) * CODEC_VOCAB]);
        }
        Ok(())
    }

    /// Drops the graph (and its hold on the caches it was built for).
    pub fn clear(&mut self) {
        self.graph = None;
    }
}

impl Layers {
    /// The final norm of `x`'s rows (`out.hidden`) and their codec logits (`out.logits`), pushed
    /// to `outs` in that order.
    fn output<'a>(
        &'a self,
        c: &'a Context,
        x: Tensor<'a>,
        outs: &mut Vec<Tensor<'a>>,
    ) -> Result<(), GgmlError> {
        let top = &self.weights[self.n_layer];
        let get = |n: &str| top.get(n).ok_or_else(|| port_of("talker tensor", n));
        let hidden = c
            .mul(c.rms_norm(x, self.dims.eps)?, get("output_norm.weight")?)?
            .set_name("out.hidden");
        let logits =
            layer_product(c, get("output.weight")?, hidden, self.kernel)?.set_name("out.logits");
        outs.push(hidden);
        outs.push(logits);
        Ok(())
    }
}

/// A tensor `name` missing where `what` should have it.
fn port_of(what: &'static str, name: &str) -> GgmlError {
    GgmlError::Shape {
        what,
        expected: name.to_owned(),
        found: "none".into(),
    }
}

/// Where a graph writes its rows' keys and values.
#[derive(Debug, Clone, Copy)]
enum At {
    /// At positions `p0..`, fixed in the graph (a prefill's graph, built for it).
    Fixed(usize),
    /// At positions given by the inputs, attending over `n_kv` keys with a mask (a step graph,
    /// built once for every position of a block).
    Block {
        /// Keys attended: the end of the block.
        n_kv: usize,
    },
}

/// Positions served by one step graph: a step graph is built when the position enters a new
/// block, and attends over the keys up to the block's end (the rest masked).
const BLOCK: usize = 64;

/// One session's KV cache and step graph (see the module's contract), over the layers it was
/// made for (its step graph reads their weights between calls).
#[derive(Debug)]
pub struct State<'l> {
    layers: &'l Layers,
    n_ctx: usize,
    /// The step graph and the block of positions it serves.
    step: Option<(usize, OwnedGraph)>,
    /// The step graph's mask and value indices, rewritten at every step.
    mask: Vec<f32>,
    /// The caches hold one position a row in f16 or q8_0, attended by flash attention
    /// ([`Kv::Flash`]); else f32, the values transposed ([`Kv::Cache`], [`Kv::Indexed`]).
    flash: bool,
    vidx: Vec<i32>,
    hidden: Vec<f32>,
    logits: Vec<f32>,
    /// `cache.k.{l}` (`[head_dim, n_head_kv, n_ctx]`) and `cache.v.{l}` (`[n_ctx, head_dim ·
    /// n_head_kv]`); the graphs hold it too.
    cache: SharedContext,
}

impl<'l> State<'l> {
    /// A cache of `n_ctx` positions for `layers`: f32 when `exact`, else q8_0 attended by flash
    /// attention (see the module's contract).
    pub fn new(layers: &'l Layers, n_ctx: usize, exact: bool) -> Result<Self, GgmlError> {
        let d = layers.dims;
        // q8_0 as llama.cpp's runtime keeps them: half of f16's bytes, values summed in f32.
        let (ty, flash) = if exact {
            (GgmlType::F32, false)
        } else {
            (GgmlType::Q8_0, true)
        };
        let width = d.head_dim * d.n_head_kv;
        let cache = SharedContext::new(Context::new(
            n_ctx * layers.kv_bytes(ty) + layers.n_layer * 2048 + 4096,
        )?);
        for l in 0..layers.n_layer {
            if flash {
                cache
                    .new_tensor(ty, &[width, n_ctx])?
                    .set_name(&format!("cache.k.{l}"));
                cache
                    .new_tensor(ty, &[width, n_ctx])?
                    .set_name(&format!("cache.v.{l}"));
                continue;
            }
            cache
                .new_tensor(ty, &[d.head_dim, d.n_head_kv, n_ctx])?
                .set_name(&format!("cache.k.{l}"));
            cache
                .new_tensor(ty, &[n_ctx, width])?
                .set_name(&format!("cache.v.{l}"));
        }
        Ok(State {
            layers,
            n_ctx,
            step: None,
            mask: Vec::with_capacity(n_ctx),
            flash,
            vidx: vec![0; d.head_dim * d.n_head_kv],
            hidden: vec![0.0; layers.n_embd],
            logits: vec![0.0; CODEC_VOCAB],
            cache,
        })
    }

    /// Positions the cache holds.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Computes `rows` (whole rows of the talker's width) at positions `p0..` on `pool`; their
    /// keys and values replace the cache's at those positions, and attention reads positions
    /// `0..p0 + rows`. One row is a step (its block's graph).
    pub fn run(&mut self, rows: &[f32], p0: usize, pool: &Threadpool) -> Result<(), GgmlError> {
        self.compute(rows, p0, pool, true)
    }

    /// [`State::run`] for a prefill's rows, one or many, always by a graph of their own
    /// positions (ggml's flash attention with a mask): a prefill after a reused prefix gives its
    /// rows the bits that the whole prompt's prefill gives them, even when one row is left.
    pub fn prefill(&mut self, rows: &[f32], p0: usize, pool: &Threadpool) -> Result<(), GgmlError> {
        self.compute(rows, p0, pool, false)
    }

    fn compute(
        &mut self,
        rows: &[f32],
        p0: usize,
        pool: &Threadpool,
        step: bool,
    ) -> Result<(), GgmlError> {
        let layers = self.layers;
        let h = layers.n_embd;
        let n = rows.len() / h.max(1);
        if n == 0 || n * h != rows.len() || p0 + n > self.n_ctx {
            return Err(GgmlError::Shape {
                what: "talker rows",
                expected: format!(
                    "whole rows of {h} within a context of {} positions",
                    self.n_ctx
                ),
                found: format!("{} values at position {p0}", rows.len()),
            });
        }
        let pos = [p0 as i32];
        if n == 1 && step {
            let block = p0 / BLOCK;
            let n_kv = ((block + 1) * BLOCK).min(self.n_ctx);
            if self.step.as_ref().map(|s| s.0) != Some(block) {
                self.step = None;
                self.zero_from(layers, p0, n_kv)?;
                let flash = self.flash;
                let reads = layers.reads(&self.cache);
                let g = OwnedGraph::build_allocated(None, &reads, |c| {
                    let outs = layers.build(c, &self.cache, 1, At::Block { n_kv }, flash)?;
                    Ok(outs.into_iter().map(Tensor::node).collect())
                })?;
                self.step = Some((block, g));
            }
            let Some((_, g)) = self.step.as_mut() else {
                return Err(port("step graph"));
            };
            // The block's keys up to this position; built only for a graph that reads a mask.
            let fill_mask = |mask: &mut Vec<f32>| {
                mask.clear();
                mask.extend((0..n_kv).map(|k| if k <= p0 { 0.0 } else { f32::NEG_INFINITY }));
            };
            let t = |name: &'static str| g.tensor(name).ok_or_else(|| port(name));
            t("in.rows")?.write_f32(rows)?;
            t("in.pos")?.write_i32(&pos)?;
            if self.flash {
                if !layers.attends_row_itself(1) {
                    fill_mask(&mut self.mask);
                    t("in.mask")?.write_bytes(&f16_mask(&self.mask))?;
                }
            } else {
                for (j, v) in self.vidx.iter_mut().enumerate() {
                    *v = (p0 + self.n_ctx * j) as i32;
                }
                t("in.vidx")?.write_i32(&self.vidx)?;
                fill_mask(&mut self.mask);
                t("in.mask")?.write_f32(&self.mask)?;
            }
            g.compute(pool)?;
            return read_outputs(g, &mut self.hidden, &mut self.logits);
        }
        let flash = self.flash;
        let reads = layers.reads(&self.cache);
        let mut g = OwnedGraph::build_allocated(None, &reads, |c| {
            let outs = layers.build(c, &self.cache, n, At::Fixed(p0), flash)?;
            Ok(outs.into_iter().map(Tensor::node).collect())
        })?;
        let t = |name: &'static str| g.tensor(name).ok_or_else(|| port(name));
        t("in.rows")?.write_f32(rows)?;
        let pos: Vec<i32> = (p0..p0 + n).map(|p| p as i32).collect();
        t("in.pos")?.write_i32(&pos)?;
        let mask = qwen3::causal_mask(n, p0);
        if self.flash {
            t("in.mask")?.write_bytes(&f16_mask(&mask))?;
        } else if n > 1 {
            t("in.mask")?.write_f32(&mask)?;
        }
        g.compute(pool)?;
        read_outputs(&g, &mut self.hidden, &mut self.logits)
    }

    /// Zeroes positions `from..to` of every layer's keys and values: a step graph attends over
    /// its whole block, the positions not written yet masked, and a masked key's weight (0)
    /// times a value left non-finite by the allocator would still be NaN.
    fn zero_from(&self, layers: &Layers, from: usize, to: usize) -> Result<(), GgmlError> {
        let d = layers.dims;
        let width = d.head_dim * d.n_head_kv;
        for l in 0..layers.n_layer {
            let get = |n: String| self.cache.get(&n).ok_or_else(|| port("cache"));
            let (k, v) = (get(format!("cache.k.{l}"))?, get(format!("cache.v.{l}"))?);
            if self.flash {
                // One position a row, in either cache.
                let row = k.nbytes() / self.n_ctx;
                k.zero_bytes(from * row, (to - from) * row)?;
                v.zero_bytes(from * row, (to - from) * row)?;
                continue;
            }
            let esz = k.nbytes() / k.n_elems();
            k.zero_bytes(from * width * esz, (to - from) * width * esz)?;
            for j in 0..width {
                v.zero_bytes((j * self.n_ctx + from) * esz, (to - from) * esz)?;
            }
        }
        Ok(())
    }

    /// The final-normed hidden state of the last row run.
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }

    /// The codec logits (3072) of the last row run.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }
}

/// A mask of 0 and −∞ as f16 bytes (flash attention's mask type).
fn f16_mask(mask: &[f32]) -> Vec<u8> {
    mask.iter()
        .flat_map(|&m| if m == 0.0 { 0u16 } else { 0xfc00 }.to_le_bytes())
        .collect()
}

/// A missing graph port (a bug in the graph's construction).
fn port(name: &'static str) -> GgmlError {
    GgmlError::Shape {
        what: "talker graph port",
        expected: name.into(),
        found: "none".into(),
    }
}

/// Reads a talker graph's outputs.
fn read_outputs(g: &OwnedGraph, hidden: &mut [f32], logits: &mut [f32]) -> Result<(), GgmlError> {
    let t = |name: &'static str| g.tensor(name).ok_or_else(|| port(name));
    t("out.hidden")?.read_f32(hidden)?;
    t("out.logits")?.read_f32(logits)
}
