//! The graphs of a frame's 15 sub-steps: prefill of the hidden state and code 0, then one
//! cached step per codebook, with the sample heads as the last node when they are packed.

use super::heads::Heads;
use super::Geometry;
use super::POSITIONS;
use crate::error::ModelError;
use crate::ffi::{Context, GgmlError, OwnedGraph, SharedContext, Tensor};
use crate::gguf::{GgmlType, GgufFile};
use crate::kernels::dot::Kernel;
use crate::kernels::quant::{self, QType};
use crate::qwen3::LayerKernel;
use crate::qwen3::{self, layer_product};

/// The code predictor's names of the layer tensors the talker names differently.
pub(super) const NAMES: qwen3::Names = qwen3::Names {
    attn_norm: "ln1.weight",
    attn_out: "attn_out.weight",
    ffn_norm: "ln2.weight",
};

/// The 15 sample heads' tensor (`[width, n_codes, 15]`): used on the host only (see [`Heads`]).
pub(super) const HEAD: &str = "a.gen.code.head.weight";

/// The sample heads from the file: q8_0 rows when the file stores them quantized (the model was
/// converted lossy, and q8_0 is a quarter of f32's memory traffic per sub-step), else exact f32
/// rows. Dequantized one head at a time, so loading never holds all 15 in f32.
pub(super) fn load_heads(f: &GgufFile, g: &Geometry) -> Result<Heads, ModelError> {
    let missing = || ModelError::MissingTensor {
        path: f.path().into(),
        tensor: HEAD.into(),
    };
    let head = f.header.tensor(HEAD).ok_or_else(missing)?;
    let data = f.tensor_data(HEAD).ok_or_else(missing)?;
    let per_head = g.n_codes * g.n_embd;
    let n = head.ne.iter().product::<u64>() as usize;
    let quantized = !matches!(head.ty, GgmlType::F32 | GgmlType::F16);
    if !quantized || !g.n_embd.is_multiple_of(32) || per_head == 0 || !n.is_multiple_of(per_head) {
        let w = crate::ffi::dequantize(head.ty, data, n).map_err(ModelError::from)?;
        return Ok(Heads::new(w, g.n_codes, g.n_embd, Kernel::active()));
    }
    let bytes_per_head = data.len() / (n / per_head);
    let mut q8 = Vec::with_capacity(n / 32 * 34);
    for chunk in data.chunks_exact(bytes_per_head) {
        let w = crate::ffi::dequantize(head.ty, chunk, per_head).map_err(ModelError::from)?;
        q8.extend(crate::ffi::quantize(GgmlType::Q8_0, &w, g.n_embd).map_err(ModelError::from)?);
    }
    Ok(Heads::from_q8_bytes(
        &q8,
        g.n_codes,
        g.n_embd,
        Kernel::active(),
    ))
}

/// The graph of step `step` of a frame: step 0 is the prefill of positions 0 and 1 (hidden state
/// and codebook 0) and predicts codebook 1; step k ≥ 1 feeds codebook k at position k + 1 and
/// predicts codebook k + 1, reading positions 0..k from the KV cache.
///
/// With `cached` false the graph instead recomputes every position 0..=k+1 from its input codes
/// (`in.codes`: codebooks 0..=k) without touching the cache: the reference the cached graphs are
/// tested against.
pub(super) fn build_step(
    w: &SharedContext,
    heads: Option<&SharedContext>,
    g: &Geometry,
    step: usize,
    cached: bool,
    kernel: LayerKernel,
) -> Result<OwnedGraph, GgmlError> {
    let (t_len, p0) = match (cached, step) {
        (false, _) => (step + 2, 0),
        (true, 0) => (2, 0),
        (true, _) => (1, step + 1),
    };
    let n_kv = p0 + t_len;
    let mem = step_bytes(g, t_len, n_kv, step);
    let get = |n: &str| {
        w.get(n).ok_or(GgmlError::Shape {
            what: "weight",
            expected: n.to_owned(),
            found: "none".into(),
        })
    };
    // The graph reads the weights and the KV cache in `w`, and the packed heads' tensors.
    let mut reads = vec![w];
    reads.extend(heads.filter(|_| cached));
    {
        OwnedGraph::build(mem, &reads, |c| {
            // The input rows: the hidden state and codebook 0 at positions 0 and 1, then
            // codebook k at position k + 1.
            let mut x = if cached && step > 0 {
                let code = c.new_i32(1)?.set_name("in.code");
                let table = c.slice2d(get("a.gen.code.embd.weight")?, step - 1)?;
                c.get_rows(table, code)?
            } else {
                let n_codes = if cached { 1 } else { step + 1 };
                let codes =
                    c.new_i32(n_codes)?
                        .set_name(if cached { "in.code" } else { "in.codes" });
                let hidden = c.new_f32(&[g.n_talker, 1])?.set_name("in.hidden");
                let one = |k: usize| c.view(codes, [1, 1, 1], [4, 4, 4], 4 * k);
                let mut x = c.concat(
                    hidden,
                    c.get_rows(get("a.gen.code.out_embd.weight")?, one(0)?)?,
                    1,
                )?;
                for k in 1..n_codes {
                    let table = c.slice2d(get("a.gen.code.embd.weight")?, k - 1)?;
                    x = c.concat(x, c.get_rows(table, one(k)?)?, 1)?;
                }
                x
            };
            if g.proj_in {
                x = layer_product(c, get("a.gen.code.proj_in.weight")?, x, kernel)?;
                x = c.add(x, get("a.gen.code.proj_in.bias")?)?;
            }
            let pos = c.new_i32(t_len)?;
            pos.write_i32(&(p0..p0 + t_len).map(|p| p as i32).collect::<Vec<_>>())?;
            let mask = if t_len > 1 {
                let m = c.new_f32(&[n_kv, t_len])?;
                m.write_f32(&qwen3::causal_mask(t_len, p0))?;
                Some(m)
            } else {
                None
            };
            let mut outs = Vec::new();
            let dims = g.dims();
            for l in 0..g.n_layer {
                let p = |n: &str| get(&format!("a.gen.code.blk.{l}.{n}"));
                let kv = if cached {
                    qwen3::Kv::Cache {
                        k: get(&format!("cache.k.{l}"))?,
                        v: get(&format!("cache.v.{l}"))?,
                        p0,
                    }
                } else {
                    qwen3::Kv::Inline
                };
                x = qwen3::layer(c, &p, NAMES, dims, x, pos, mask, kv, kernel, &mut outs)?;
            }
            let hidden = c
                .mul(c.rms_norm(x, g.eps)?, get("a.gen.code.output_norm.weight")?)?
                .set_name("out.hidden");
            let nb = [4, 4 * g.n_embd, 4 * g.n_embd];
            let last = c.view(hidden, [g.n_embd, 1, 1], nb, (t_len - 1) * 4 * g.n_embd)?;
            let last = c.cont(last)?.set_name("out.last");
            outs.push(hidden);
            outs.push(last);
            // The step's sample head as the graph's last node, on the pool's threads
            // (`CodePredictor::pack_heads`).
            if let Some(h) = heads.filter(|_| cached) {
                outs.push(head_logits(c, h, step, last)?);
            }
            Ok(outs.into_iter().map(|t| t.node()).collect())
        })
    }
}

/// Bytes of a sub-step graph's context: `rows` rows attending `n_kv` positions at step `step`
/// (weights and caches live elsewhere).
pub(super) fn step_bytes(g: &Geometry, rows: usize, n_kv: usize, step: usize) -> usize {
    2 * 1024 * 1024
        + g.n_layer
            * 4
            * rows
            * (12 * g.n_embd
                + 4 * g.n_ff
                + 3 * g.n_head * n_kv
                + 2 * g.head_dim * g.n_head_kv * n_kv)
        + 4 * (g.n_talker * 3 + g.n_codes) * rows * (step + 2)
}

/// Step `step`'s packed sample head times `last` (`[n_embd, rows]`), as a graph node named
/// `out.logits`: `[n_codes, rows]`.
pub(super) fn head_logits<'a>(
    c: &'a Context,
    heads: &'a SharedContext,
    step: usize,
    last: Tensor<'a>,
) -> Result<Tensor<'a>, GgmlError> {
    let head = heads.get(&format!("head.{step}")).ok_or(GgmlError::Shape {
        what: "sample head",
        expected: format!("head.{step}"),
        found: "none".into(),
    })?;
    // Packed heads exist only where the tier has the kernel (`Heads::to_packed`).
    let kernel =
        quant::packed_kernel(QType::Q8_0, crate::kernels::caps()).ok_or(GgmlError::Shape {
            what: "packed sample heads",
            expected: "a kernel tier with a packed q8_0 kernel".into(),
            found: crate::kernels::active().to_string(),
        })?;
    Ok(c.map_mat_in::<{ quant::GROUP }>(head, last, kernel)?
        .set_name("out.logits"))
}

impl Geometry {
    /// The attention geometry of the layers.
    pub(super) fn dims(&self) -> qwen3::Dims {
        qwen3::Dims {
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            eps: self.eps,
            theta: self.theta,
        }
    }
}

/// The cached graphs of a frame's 15 steps (see [`build_step`]).
pub(super) fn build_steps(
    w: &SharedContext,
    heads: Option<&SharedContext>,
    g: &Geometry,
    kernel: LayerKernel,
) -> Result<Vec<OwnedGraph>, ModelError> {
    (0..POSITIONS - 1)
        .map(|step| build_step(w, heads, g, step, true, kernel).map_err(ModelError::from))
        .collect()
}
