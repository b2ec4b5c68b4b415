//! A frame of several streams at once (continuous batching): the 15 sub-steps over one row per
//! stream (two in the first, the hidden state and code 0), the products once over all rows,
//! each row's attention on a KV cache of its own.
//!
//! The cache holds nothing between frames (every frame rewrites it from position 0), so a row of
//! a batch needs no stream's state: row 0 uses the single frame's cache, rows 1.. caches of
//! their own, made at the first batch. Each row's codes are the ones [`CodePredictor::frame`]
//! gives it alone, to the bit: the crate's kernels compute each row of a product on its own,
//! and a row's attention is the single frame's on views of its rows (`qwen3::layer_groups`).

use super::graph::{head_logits, step_bytes, NAMES};
use super::{CodePredictor, Geometry, POSITIONS};
use crate::error::ModelError;
use crate::ffi::{Context, GgmlError, OwnedGraph, SharedContext, Threadpool};
use crate::qwen3::{self, layer_product, LayerKernel};

/// The most streams one batched frame takes.
pub const MAX_ROWS: usize = 16;
// The metrics keep the talker's step times for every batch size up to this one.
const _: () = assert!(MAX_ROWS == crate::metrics::STEP_BATCHES);

/// The batched frames' graphs and the caches of rows 1.. (made at the first batch).
#[derive(Debug, Default)]
pub(super) struct Batched {
    /// `cache.k.{l}.{r}` and `cache.v.{l}.{r}` for rows `1..MAX_ROWS`.
    caches: Option<SharedContext>,
    /// For `n` rows, at `n - 2`: the frame's 15 graphs.
    graphs: Vec<Option<Vec<OwnedGraph>>>,
    logits: Vec<f32>,
    last: Vec<f32>,
    hidden: Vec<f32>,
    codes: Vec<i32>,
}

impl Batched {
    /// Drops the graphs (the kernel or the heads changed); the caches stay.
    pub(super) fn clear_graphs(&mut self) {
        self.graphs.clear();
    }
}

impl CodePredictor {
    /// [`CodePredictor::frame`] for several streams at once: `inputs[r]` is row `r`'s hidden
    /// state and code 0, and `pick(r, group, logits)` chooses row `r`'s code of each head.
    /// Returns each row's 15 codes: the ones [`CodePredictor::frame`] gives it alone. One row
    /// runs [`CodePredictor::frame`] itself; up to [`MAX_ROWS`] run in one graph a sub-step
    /// (built at a row count's first use, and kept) where [`CodePredictor::batches`], else one
    /// after the other.
    pub fn frames(
        &mut self,
        pool: &Threadpool,
        inputs: &[(&[f32], u32)],
        pick: &mut dyn FnMut(usize, usize, &[f32]) -> u32,
    ) -> Result<Vec<[u32; 15]>, ModelError> {
        let g = self.geometry;
        let n = inputs.len();
        if n == 1 {
            let (hidden, code0) = inputs[0];
            return Ok(vec![self.frame(
                pool,
                hidden,
                code0,
                &mut |k, l| pick(0, k, l),
                None,
            )?]);
        }
        let bad = inputs.iter().any(|(h, c)| {
            h.len() != g.n_talker || *c as usize >= crate::model::validate::CODEC_VOCAB as usize
        });
        if n > MAX_ROWS || bad {
            return Err(ModelError::Unsupported {
                what: "code predictor batch".into(),
                expected: format!(
                    "up to {MAX_ROWS} rows of a hidden state of {} and a code below 3072",
                    g.n_talker
                ),
                found: format!("{n} rows"),
            });
        }
        if n == 0 {
            return Ok(Vec::new());
        }
        if !self.batches() {
            // ggml's products may sum a row in another order beside other rows: each row alone.
            return (0..n)
                .map(|r| {
                    let (hidden, code0) = inputs[r];
                    self.frame(pool, hidden, code0, &mut |k, l| pick(r, k, l), None)
                })
                .collect();
        }
        self.batch_graphs(n)?;
        let b = &mut self.batched;
        let missing = |n: &str| {
            ModelError::from(GgmlError::Shape {
                what: "graph tensor",
                expected: n.to_owned(),
                found: "none".into(),
            })
        };
        b.hidden.clear();
        b.codes.clear();
        for (h, c) in inputs {
            b.hidden.extend_from_slice(h);
            b.codes.push(*c as i32);
        }
        b.logits.resize(n * g.n_codes, 0.0);
        b.last.resize(n * g.n_embd, 0.0);
        let mut out = vec![[0u32; 15]; n];
        let Some(graphs) = b.graphs.get_mut(n - 2).and_then(Option::as_mut) else {
            return Err(missing("batch graphs"));
        };
        let in_graph = self.heads_ctx.is_some();
        for (step, graph) in graphs.iter_mut().enumerate() {
            if step == 0 {
                let t = graph
                    .tensor("in.hidden")
                    .ok_or_else(|| missing("in.hidden"))?;
                t.write_f32(&b.hidden).map_err(ModelError::from)?;
            }
            let t = graph.tensor("in.code").ok_or_else(|| missing("in.code"))?;
            t.write_i32(&b.codes).map_err(ModelError::from)?;
            graph.compute(pool).map_err(ModelError::from)?;
            if in_graph {
                let t = graph
                    .tensor("out.logits")
                    .ok_or_else(|| missing("out.logits"))?;
                t.read_f32(&mut b.logits).map_err(ModelError::from)?;
            } else {
                let t = graph
                    .tensor("out.last")
                    .ok_or_else(|| missing("out.last"))?;
                t.read_f32(&mut b.last).map_err(ModelError::from)?;
                for (last, logits) in b
                    .last
                    .chunks_exact(g.n_embd)
                    .zip(b.logits.chunks_exact_mut(g.n_codes))
                {
                    self.heads.logits(step, last, logits);
                }
            }
            for (r, logits) in b.logits.chunks_exact(g.n_codes).enumerate() {
                let code = pick(r, step, logits);
                if code as usize >= g.n_codes {
                    return Err(ModelError::Unsupported {
                        what: format!("code picked for codebook {}", step + 1),
                        expected: format!("a code below {}", g.n_codes),
                        found: code.to_string(),
                    });
                }
                out[r][step] = code;
                b.codes[r] = code as i32;
            }
        }
        Ok(out)
    }

    /// Whether several rows run in one graph ([`CodePredictor::frames`]): every layer product is
    /// the crate's kernels' (quantized layers under [`LayerKernel::Scalar`] or
    /// [`LayerKernel::Packed`]), whose result for a row does not depend on the other rows.
    /// f32 and f16 layers (ggml's products) run a frame at a time.
    pub fn batches(&self) -> bool {
        let names = super::product_names(self.geometry.n_layer);
        qwen3::own_products(self.kernel, &self.weights, names.iter().map(String::as_str))
    }

    /// Builds the caches of rows 1.. and the graphs of `n` rows, where they are not yet.
    fn batch_graphs(&mut self, n: usize) -> Result<(), ModelError> {
        let g = self.geometry;
        if self.batched.caches.is_none() {
            let per_row = 2 * g.n_layer * g.head_dim * g.n_head_kv * POSITIONS * 4;
            let ctx = Context::new(MAX_ROWS * (per_row + 2 * g.n_layer * 512) + (1 << 16))
                .map_err(ModelError::from)?;
            for r in 1..MAX_ROWS {
                for l in 0..g.n_layer {
                    ctx.new_f32(&[g.head_dim, g.n_head_kv, POSITIONS])
                        .map_err(ModelError::from)?
                        .set_name(&format!("cache.k.{l}.{r}"));
                    ctx.new_f32(&[POSITIONS, g.head_dim * g.n_head_kv])
                        .map_err(ModelError::from)?
                        .set_name(&format!("cache.v.{l}.{r}"));
                }
            }
            self.batched.caches = Some(SharedContext::new(ctx));
        }
        if self.batched.graphs.len() < n - 1 {
            self.batched.graphs.resize_with(n - 1, || None);
        }
        if self.batched.graphs[n - 2].is_some() {
            return Ok(());
        }
        let caches = self
            .batched
            .caches
            .as_ref()
            .ok_or(ModelError::Unsupported {
                what: "code predictor batch caches".into(),
                expected: "made".into(),
                found: "none".into(),
            })?;
        let graphs = (0..POSITIONS - 1)
            .map(|step| {
                let heads = self.heads_ctx.as_ref();
                build_batch_step(&self.weights, caches, heads, &g, step, n, self.kernel)
                    .map_err(ModelError::from)
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.batched.graphs[n - 2] = Some(graphs);
        Ok(())
    }
}

/// Sub-step `step` of a frame (as `graph::build_step` makes it, cached) for `n` rows: `in.code`
/// holds each row's input code, `in.hidden` (step 0) each row's hidden state; `out.last` and,
/// with packed heads, `out.logits` hold each row's.
fn build_batch_step(
    w: &SharedContext,
    caches: &SharedContext,
    heads: Option<&SharedContext>,
    g: &Geometry,
    step: usize,
    n: usize,
    kernel: LayerKernel,
) -> Result<OwnedGraph, GgmlError> {
    let (t_len, p0) = if step == 0 { (2, 0) } else { (1, step + 1) };
    let rows = n * t_len;
    let n_kv = p0 + t_len;
    let mem = step_bytes(g, rows, n_kv, step)
        // The groups' outputs joined row after row, and each group's views.
        + g.n_layer * 4 * (n * n * g.head_dim * g.n_head + rows * 4 * 1024);
    fn get<'c>(ctx: &'c SharedContext, name: &str) -> Result<crate::ffi::Tensor<'c>, GgmlError> {
        ctx.get(name).ok_or(GgmlError::Shape {
            what: "weight",
            expected: name.to_owned(),
            found: "none".into(),
        })
    }
    let cache = |kv: &str, l: usize, r: usize| {
        if r == 0 {
            get(w, &format!("cache.{kv}.{l}"))
        } else {
            get(caches, &format!("cache.{kv}.{l}.{r}"))
        }
    };
    let mut reads = vec![w, caches];
    reads.extend(heads);
    OwnedGraph::build(mem, &reads, |c| {
        let codes = c.new_i32(n)?.set_name("in.code");
        let mut x = if step > 0 {
            let table = c.slice2d(get(w, "a.gen.code.embd.weight")?, step - 1)?;
            c.get_rows(table, codes)?
        } else {
            // Each row's hidden state, then its code 0's embedding.
            let nt = g.n_talker;
            let hidden = c.new_f32(&[nt, n])?.set_name("in.hidden");
            let emb = c.get_rows(get(w, "a.gen.code.out_embd.weight")?, codes)?;
            let col = |t, r: usize| c.view(t, [nt, 1, 1], [4, 4 * nt, 4 * nt], r * 4 * nt);
            let mut x = c.concat(col(hidden, 0)?, col(emb, 0)?, 1)?;
            for r in 1..n {
                x = c.concat(x, c.concat(col(hidden, r)?, col(emb, r)?, 1)?, 1)?;
            }
            x
        };
        if g.proj_in {
            x = layer_product(c, get(w, "a.gen.code.proj_in.weight")?, x, kernel)?;
            x = c.add(x, get(w, "a.gen.code.proj_in.bias")?)?;
        }
        let pos = c.new_i32(rows)?;
        let at: Vec<i32> = (0..n)
            .flat_map(|_| (p0..p0 + t_len).map(|p| p as i32))
            .collect();
        pos.write_i32(&at)?;
        let mask = if t_len > 1 {
            let m = c.new_f32(&[n_kv, t_len])?;
            m.write_f32(&qwen3::causal_mask(t_len, p0))?;
            Some(m)
        } else {
            None
        };
        let dims = g.dims();
        let mut outs = Vec::new();
        for l in 0..g.n_layer {
            let p = |name: &str| get(w, &format!("a.gen.code.blk.{l}.{name}"));
            let groups = (0..n)
                .map(|r| {
                    Ok(qwen3::Group {
                        rows: t_len,
                        mask,
                        kv: qwen3::Kv::Cache {
                            k: cache("k", l, r)?,
                            v: cache("v", l, r)?,
                            p0,
                        },
                    })
                })
                .collect::<Result<Vec<_>, GgmlError>>()?;
            x = qwen3::layer_groups(c, &p, NAMES, dims, x, pos, &groups, kernel, &mut outs)?;
        }
        let hidden = c.mul(
            c.rms_norm(x, g.eps)?,
            get(w, "a.gen.code.output_norm.weight")?,
        )?;
        // Each row's last position.
        let row = 4 * g.n_embd;
        let nb = [4, row * t_len, row * rows];
        let last = c.view(hidden, [g.n_embd, n, 1], nb, (t_len - 1) * row)?;
        let last = c.cont(last)?.set_name("out.last");
        outs.push(last);
        if let Some(h) = heads {
            outs.push(head_logits(c, h, step, last)?);
        }
        Ok(outs.into_iter().map(|t| t.node()).collect())
    })
}
