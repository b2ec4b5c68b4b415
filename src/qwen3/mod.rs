//! The Qwen3 decoder layer, as a ggml graph: the block both the talker (28 layers) and the code
//! predictor (5 layers) stack.
//!
//! Model: `Qwen3TTSTalkerDecoderLayer` and `Qwen3TTSDecoderLayer` (PyPI `qwen-tts` 0.1.1,
//! `qwen_tts/core/models/modeling_qwen3_tts.py`); MODEL-NOTES.md §4.5 and §6: pre-RMSNorm, per-head
//! q/k RMSNorm before NeoX RoPE over the whole head, grouped-query attention, SwiGLU, no biases.
//! The talker's interleaved M-RoPE gives every section the same position, so it is this RoPE too.
//!
//! Contract: [`layer`] appends one layer to a graph under construction and returns the new
//! residual stream; the caller owns the weights, the KV cache and the positions. A cached layer
//! writes its keys and values into the caller's cache (the returned `writes` must be computed
//! before the nodes that read them, so the caller lists them first among the graph's outputs).
//! Under the crate's kernels ([`LayerKernel::Scalar`], [`LayerKernel::Packed`]), one row at a
//! position fixed in the graph over f32 caches (the code predictor's sub-steps) attends in one
//! custom node instead, [`attend`], which writes the cache itself; the products by Rust kernels
//! fold the input's norm and the residual add into their own nodes. The products are the
//! crate's modules' ([`products`]).

mod products;

pub use products::LayerKernel;
pub(crate) use products::{
    layer_product, packed_type, repack, write_layer_joined, write_product_weight, JOINED,
};
use products::{product_by, rust_kernel};

use crate::ffi::{AttendOne, Context, GgmlError, Tensor};
use crate::gguf::GgmlType;

/// Whether every product weight of `ctx` among `names` is multiplied by the crate's kernels under
/// `kernel` (whose result for a row does not depend on the other rows of the product), not by
/// ggml's `mul_mat` (which may change its algorithm with the number of rows): what a batch of
/// several streams needs to give each stream its own bits.
pub(crate) fn own_products<'a>(
    kernel: LayerKernel,
    ctx: &Context,
    names: impl IntoIterator<Item = &'a str>,
) -> bool {
    names
        .into_iter()
        .filter_map(|n| ctx.get(n))
        .all(|w| rust_kernel(kernel, w).is_some())
}

/// The attention geometry of a layer stack.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Dims {
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
}

/// The names of a layer's three tensors that the two files name differently (llama.cpp's talker
/// names, the mmproj's code-predictor names); the others are `attn_{q,k,v}`, `attn_{q,k}_norm`,
/// `ffn_{gate,up,down}` in both.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Names {
    /// The attention's input norm.
    pub attn_norm: &'static str,
    /// The attention's output projection.
    pub attn_out: &'static str,
    /// The feed-forward's input norm.
    pub ffn_norm: &'static str,
}

/// Where a layer's keys and values come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kv<'a> {
    /// From this graph's rows only (no cache): the reference the cached graphs are tested
    /// against.
    Inline,
    /// Written into a cache at positions `p0..p0 + rows`, then read back for positions
    /// `0..p0 + rows`. `k` is `[head_dim, n_head_kv, n_ctx]`; `v` is stored transposed,
    /// `[n_ctx, head_dim · n_head_kv]`, so that the weighted sum of values reads whole rows
    /// (f32 or f16, either).
    Cache {
        /// Key cache.
        k: Tensor<'a>,
        /// Value cache, transposed.
        v: Tensor<'a>,
        /// The first position this graph writes.
        p0: usize,
    },
    /// As `Cache`, with the positions written given at run time: row `i`'s keys go to position
    /// `pos[i]` (the layer's positions) and its values to the elements
    /// `v_idx[i · hd · n_head_kv + j]` of the transposed cache seen as one row
    /// (`pos[i] + n_ctx · j`); attention reads positions `0..n_kv`, of which the caller's mask
    /// hides those past each row's. One graph then serves every position below `n_kv`.
    Indexed {
        /// Key cache.
        k: Tensor<'a>,
        /// Value cache, transposed.
        v: Tensor<'a>,
        /// i32 element indices, `hd · n_head_kv` per row.
        v_idx: Tensor<'a>,
        /// Keys attended.
        n_kv: usize,
    },
    /// Written at the rows' positions (`pos`) into caches of one position a row (`k` and `v`
    /// both `[head_dim · n_head_kv, n_ctx]`, f16 or q8_0), then attended over positions
    /// `0..n_kv` by ggml's flash attention ([`Context::flash_attn_cache`]) with the caller's f16
    /// mask; without a mask, one row attends positions `0..=pos` of q8_0 caches in one node
    /// ([`Context::attend_q8_row`]).
    Flash {
        /// Key cache.
        k: Tensor<'a>,
        /// Value cache.
        v: Tensor<'a>,
        /// Keys attended.
        n_kv: usize,
    },
}

/// Appends one layer to a graph: `x` is the residual stream (`[n_embd, rows]`), `pos` the rows'
/// positions (i32), `mask` the causal mask when `rows > 1` (`[n_kv, rows]`), `w(name)` the layer's
/// tensor of that name (the joined `attn_qkv.weight` and `ffn_gate_up.weight` of
/// [`JOINED`] where they exist, else their parts). Returns the new residual
/// stream; cache writes are pushed to `writes` (none when a single row attends in one node,
/// [`attend`], which writes the cache itself).
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer<'a>(
    c: &'a Context,
    w: &dyn Fn(&str) -> Result<Tensor<'a>, GgmlError>,
    names: Names,
    d: Dims,
    x: Tensor<'a>,
    pos: Tensor<'a>,
    mask: Option<Tensor<'a>>,
    kv: Kv<'a>,
    kernel: LayerKernel,
    writes: &mut Vec<Tensor<'a>>,
) -> Result<Tensor<'a>, GgmlError> {
    let rows = x.ne()[1];
    let group = Group { rows, mask, kv };
    layer_groups(c, w, names, d, x, pos, &[group], kernel, writes)
}

/// Consecutive rows of a batched layer that attend together, on their own cache: one stream's
/// rows in a step of several streams ([`layer_groups`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Group<'a> {
    /// Rows in the group.
    pub rows: usize,
    /// The group's causal mask, as [`layer`] takes it.
    pub mask: Option<Tensor<'a>>,
    /// The group's keys and values.
    pub kv: Kv<'a>,
}

/// [`layer`] over groups of rows, each attending only its own keys and values (`groups`, in
/// the order of `x`'s rows; `pos` holds every row's position): the products run once over all
/// rows, the attention once per group. Each group's rows get the bits [`layer`] gives them
/// alone, since the products compute each row on its own (the crate's kernels, whatever the
/// number of rows) and a group's attention is [`layer`]'s on views of its rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_groups<'a>(
    c: &'a Context,
    w: &dyn Fn(&str) -> Result<Tensor<'a>, GgmlError>,
    names: Names,
    d: Dims,
    x: Tensor<'a>,
    pos: Tensor<'a>,
    groups: &[Group<'a>],
    kernel: LayerKernel,
    writes: &mut Vec<Tensor<'a>>,
) -> Result<Tensor<'a>, GgmlError> {
    let rows = x.ne()[1];
    if groups.is_empty() || groups.iter().map(|g| g.rows).sum::<usize>() != rows {
        return Err(GgmlError::Shape {
            what: "layer row groups",
            expected: format!("groups of {rows} rows in all"),
            found: format!("{:?}", groups.iter().map(|g| g.rows).collect::<Vec<_>>()),
        });
    }
    let h = Normed::new(c, x, w(names.attn_norm)?, d.eps);
    // The crate's kernels multiply the layer's q (or joined qkv) matrix: f32 layers (the exact
    // path) stay with ggml's products and attention.
    let own = w("attn_qkv.weight")
        .or_else(|_| w("attn_q.weight"))
        .is_ok_and(|m| rust_kernel(kernel, m).is_some());
    let qkv = match w("attn_qkv.weight") {
        // One product of the joined matrix ([`JOINED`]), each row `[q, k, v]`.
        Ok(qkv) => Qkv::Joined(h.product(qkv, kernel)?),
        Err(_) => Qkv::Split(
            h.product(w("attn_q.weight")?, kernel)?,
            h.product(w("attn_k.weight")?, kernel)?,
            h.product(w("attn_v.weight")?, kernel)?,
        ),
    };
    let mut o: Option<Tensor<'a>> = None;
    let mut r0 = 0;
    for g in groups {
        let (part, pos) = if groups.len() == 1 {
            (qkv, pos)
        } else {
            let n = g.rows;
            let pos = c.view(pos, [n, 1, 1], [4, 4 * n, 4 * n], 4 * r0)?;
            (qkv.rows(c, r0, n)?, pos)
        };
        let og = attend_group(c, w, d, part, g.rows, pos, g.mask, g.kv, own, writes)?;
        o = Some(match o {
            None => og,
            Some(p) => c.concat(p, og, 1)?,
        });
        r0 += g.rows;
    }
    let o = o.ok_or_else(|| GgmlError::Shape {
        what: "layer row groups",
        expected: "at least one".into(),
        found: "none".into(),
    })?;
    feed_forward(c, w, names, d, x, o, kernel)
}

/// A layer's query, key and value products: the joined matrix's (each row `[q, k, v]`) or the
/// three matrices'.
#[derive(Debug, Clone, Copy)]
enum Qkv<'a> {
    Joined(Tensor<'a>),
    Split(Tensor<'a>, Tensor<'a>, Tensor<'a>),
}

impl<'a> Qkv<'a> {
    /// Rows `r0..r0 + n` of the products, as views.
    fn rows(self, c: &'a Context, r0: usize, n: usize) -> Result<Self, GgmlError> {
        let cols = |t: Tensor<'a>| {
            let row = 4 * t.ne()[0];
            c.view(t, [t.ne()[0], n, 1], [4, row, row * n], r0 * row)
        };
        Ok(match self {
            Qkv::Joined(y) => Qkv::Joined(cols(y)?),
            Qkv::Split(q, k, v) => Qkv::Split(cols(q)?, cols(k)?, cols(v)?),
        })
    }
}

/// One group's attention (see [`layer_groups`]) from its rows' products: `[hd · n_head, rows]`.
#[allow(clippy::too_many_arguments)]
fn attend_group<'a>(
    c: &'a Context,
    w: &dyn Fn(&str) -> Result<Tensor<'a>, GgmlError>,
    d: Dims,
    qkv: Qkv<'a>,
    rows: usize,
    pos: Tensor<'a>,
    mask: Option<Tensor<'a>>,
    kv: Kv<'a>,
    own: bool,
    writes: &mut Vec<Tensor<'a>>,
) -> Result<Tensor<'a>, GgmlError> {
    let (hd, nh, nkv) = (d.head_dim, d.n_head, d.n_head_kv);
    if let (Kv::Cache { k: ck, v: cv, p0 }, 1, true) = (kv, rows, own) {
        let fits = p0 < MAX_ATTEND && hd <= MAX_HEAD_DIM;
        if fits && ck.is_type(GgmlType::F32) && cv.is_type(GgmlType::F32) {
            // One row through the crate's kernels: its whole attention is one node, reading
            // `[q, k, v]` as one row (the joined matrix's product, or the three joined).
            let y = match qkv {
                Qkv::Joined(y) => y,
                Qkv::Split(q, k, v) => c.concat(c.concat(q, k, 0)?, v, 0)?,
            };
            let norms = [w("attn_q_norm.weight")?, w("attn_k_norm.weight")?];
            return c.attend_one(
                y,
                norms,
                [ck, cv],
                p0,
                [nh, nkv, hd],
                d.eps,
                d.theta,
                attend,
            );
        }
    }
    let (q, k, v) = match qkv {
        Qkv::Joined(y) => {
            let (f, row) = (4, 4 * y.ne()[0]);
            let nb = [f, f * hd, row];
            let v = c.view(
                y,
                [hd * nkv, rows, 1],
                [f, row, row * rows],
                f * hd * (nh + nkv),
            )?;
            (
                c.view(y, [hd, nh, rows], nb, 0)?,
                c.view(y, [hd, nkv, rows], nb, f * hd * nh)?,
                // One row's values are contiguous; several rows' are not.
                if rows > 1 { c.cont(v)? } else { v },
            )
        }
        Qkv::Split(q, k, v) => (
            c.reshape(q, [hd, nh, rows])?,
            c.reshape(k, [hd, nkv, rows])?,
            v,
        ),
    };
    let q = c.mul(c.rms_norm(q, d.eps)?, w("attn_q_norm.weight")?)?;
    let q = c.rope_neox(q, pos, hd, d.theta)?;
    let k = c.mul(c.rms_norm(k, d.eps)?, w("attn_k_norm.weight")?)?;
    let k = c.rope_neox(k, pos, hd, d.theta)?;
    let scale = 1.0 / (hd as f32).sqrt();
    let o = match kv {
        Kv::Inline => {
            let keys = c.permute(k, [0, 2, 1, 3])?;
            let vals = c.cont(c.permute(c.reshape(v, [hd, nkv, rows])?, [1, 2, 0, 3])?)?;
            softmax_attention(c, q, (keys, vals), mask, scale)?
        }
        Kv::Cache { k: ck, v: cv, p0 } => {
            let n_ctx = ck.ne()[2];
            let esz = ck.nbytes() / ck.n_elems();
            let kb = [esz, esz * hd, esz * hd * nkv];
            writes.push(c.copy_into(k, c.view(ck, [hd, nkv, rows], kb, p0 * kb[2])?)?);
            let vsz = cv.nbytes() / cv.n_elems();
            let vt = c.permute(c.reshape(v, [hd * nkv, rows, 1])?, [1, 0, 2, 3])?;
            let vb = [vsz, vsz * n_ctx, vsz * n_ctx * hd * nkv];
            writes.push(c.copy_into(vt, c.view(cv, [rows, hd * nkv, 1], vb, p0 * vsz)?)?);
            softmax_attention(c, q, read_cache(c, ck, cv, p0 + rows, d)?, mask, scale)?
        }
        Kv::Indexed {
            k: ck,
            v: cv,
            v_idx,
            n_kv,
        } => {
            let n_ctx = ck.ne()[2];
            let esz = ck.nbytes() / ck.n_elems();
            let row = esz * hd * nkv;
            let keys_2d = c.view(ck, [hd * nkv, n_ctx, 1], [esz, row, row * n_ctx], 0)?;
            writes.push(c.set_rows(keys_2d, c.reshape(k, [hd * nkv, rows, 1])?, pos)?);
            let vsz = cv.nbytes() / cv.n_elems();
            let all = n_ctx * hd * nkv;
            let vals_1 = c.view(cv, [1, all, 1], [vsz, vsz, vsz * all], 0)?;
            writes.push(c.set_rows(vals_1, c.reshape(v, [1, hd * nkv * rows, 1])?, v_idx)?);
            softmax_attention(c, q, read_cache(c, ck, cv, n_kv, d)?, mask, scale)?
        }
        Kv::Flash { k: ck, v: cv, n_kv } => {
            let rows_of = |t: Tensor<'a>| c.reshape(t, [hd * nkv, rows, 1]);
            writes.push(c.set_rows(ck, rows_of(k)?, pos)?);
            writes.push(c.set_rows(cv, rows_of(v)?, pos)?);
            match mask {
                Some(mask) => c.flash_attn_cache(q, ck, cv, n_kv, nkv, mask, scale)?,
                // One row under the engine's kernels: the keys up to its position, in one node.
                None => c.attend_q8_row(q, ck, cv, pos, nkv, scale)?,
            }
        }
    };
    Ok(o)
}

/// `softmax(keys · q · scale + mask) · vals` for the query heads `q` (`[hd, n_head, rows]`),
/// keys as `[hd, n_kv, n_head_kv]` and values as `[n_kv, hd, n_head_kv]` (positions first, for
/// the sum), by ggml's products: `[hd · n_head, rows]`.
fn softmax_attention<'a>(
    c: &'a Context,
    q: Tensor<'a>,
    (keys, vals): (Tensor<'a>, Tensor<'a>),
    mask: Option<Tensor<'a>>,
    scale: f32,
) -> Result<Tensor<'a>, GgmlError> {
    let [hd, nh, rows, _] = q.ne();
    let kq = c.mul_mat(keys, c.permute(q, [0, 2, 1, 3])?)?;
    let kq = c.soft_max(kq, mask, scale)?;
    let kqv = c.mul_mat(vals, kq)?;
    c.reshape(c.cont(c.permute(kqv, [0, 2, 1, 3])?)?, [hd * nh, rows, 1])
}

/// The rest of a layer from the attention's output `o`: its projection added to the residual
/// stream `x`, then the feed-forward added.
fn feed_forward<'a>(
    c: &'a Context,
    w: &dyn Fn(&str) -> Result<Tensor<'a>, GgmlError>,
    names: Names,
    d: Dims,
    x: Tensor<'a>,
    o: Tensor<'a>,
    kernel: LayerKernel,
) -> Result<Tensor<'a>, GgmlError> {
    let x = residual_product(c, w(names.attn_out)?, o, x, kernel)?;
    let h = Normed::new(c, x, w(names.ffn_norm)?, d.eps);
    let act = match w("ffn_gate_up.weight") {
        Ok(gate_up) => c.swiglu_halves(h.product(gate_up, kernel)?)?,
        Err(_) => c.swiglu(
            h.product(w("ffn_gate.weight")?, kernel)?,
            h.product(w("ffn_up.weight")?, kernel)?,
        )?,
    };
    residual_product(c, w("ffn_down.weight")?, act, x, kernel)
}

/// A layer's input `x` and its RMSNorm by `g`, for the products that read it: a product by a
/// Rust kernel norms the input in its own node ([`Context::map_mat_with`]); ggml's products
/// share one norm, made on first use.
struct Normed<'a> {
    c: &'a Context,
    x: Tensor<'a>,
    g: Tensor<'a>,
    eps: f32,
    h: std::cell::Cell<Option<Tensor<'a>>>,
}

impl<'a> Normed<'a> {
    fn new(c: &'a Context, x: Tensor<'a>, g: Tensor<'a>, eps: f32) -> Self {
        Normed {
            c,
            x,
            g,
            eps,
            h: std::cell::Cell::new(None),
        }
    }

    /// `w · (rms_norm(x) ⊙ g)`.
    fn product(&self, w: Tensor<'a>, kernel: LayerKernel) -> Result<Tensor<'a>, GgmlError> {
        if let Some(f) = rust_kernel(kernel, w) {
            return product_by(self.c, f, w, self.x, Some((self.g, self.eps)), None);
        }
        let h = match self.h.get() {
            Some(h) => h,
            None => {
                let h = self.c.mul(self.c.rms_norm(self.x, self.eps)?, self.g)?;
                self.h.set(Some(h));
                h
            }
        };
        self.c.mul_mat(w, h)
    }
}

/// `x + w · o`, the sum folded into the product's node where a Rust kernel computes it.
fn residual_product<'a>(
    c: &'a Context,
    w: Tensor<'a>,
    o: Tensor<'a>,
    x: Tensor<'a>,
    kernel: LayerKernel,
) -> Result<Tensor<'a>, GgmlError> {
    match rust_kernel(kernel, w) {
        Some(f) => product_by(c, f, w, o, None, Some(x)),
        None => c.add(x, c.mul_mat(w, o)?),
    }
}

/// Keys as `[hd, n_kv, nkv]` and values as `[n_kv, hd, nkv]` of positions `0..n_kv` of a cache
/// laid out as [`Kv::Cache`] says.
fn read_cache<'a>(
    c: &'a Context,
    ck: Tensor<'a>,
    cv: Tensor<'a>,
    n_kv: usize,
    d: Dims,
) -> Result<(Tensor<'a>, Tensor<'a>), GgmlError> {
    let (hd, nkv, n_ctx) = (d.head_dim, d.n_head_kv, ck.ne()[2]);
    let esz = ck.nbytes() / ck.n_elems();
    let vsz = cv.nbytes() / cv.n_elems();
    Ok((
        c.permute(
            c.view(ck, [hd, nkv, n_kv], [esz, esz * hd, esz * hd * nkv], 0)?,
            [0, 2, 1, 3],
        )?,
        c.view(cv, [n_kv, hd, nkv], [vsz, vsz * n_ctx, vsz * n_ctx * hd], 0)?,
    ))
}

/// The causal mask of `rows` rows at positions `p0..p0 + rows` over keys `0..p0 + rows`
/// (`[n_kv, rows]` values, 0 where a row sees a key, −∞ where it does not).
pub(crate) fn causal_mask(rows: usize, p0: usize) -> Vec<f32> {
    let n_kv = p0 + rows;
    let mut v = vec![0f32; n_kv * rows];
    for t in 0..rows {
        for n in p0 + t + 1..n_kv {
            v[t * n_kv + n] = f32::NEG_INFINITY;
        }
    }
    v
}

/// [`Context::attend_one`]'s kernel: query heads `h0..h1` (whole key/value groups) of one row, in
/// f32, as the graph's ops compute them (RMSNorm with an f64 sum, NeoX RoPE with ggml's angle
/// recurrence, softmax of the scaled scores less their maximum).
///
/// # Safety
/// As [`crate::ffi::AttendKernel`] says.
unsafe fn attend(a: &AttendOne, h0: usize, h1: usize) {
    let (hd, nkv, n_ctx, pos) = (a.head_dim, a.n_head_kv, a.n_ctx, a.pos);
    let group = a.n_head / nkv;
    // SAFETY: the pointers are valid for the shapes `a` names (the op checked them); this thread
    // writes only its own heads' outputs and the cache entries at `pos` of its own key/value
    // heads, and reads other positions' entries, which no thread writes during the node.
    unsafe {
        let qkv = std::slice::from_raw_parts(a.qkv, hd * (a.n_head + 2 * nkv));
        let q_norm = std::slice::from_raw_parts(a.q_norm, hd);
        let k_norm = std::slice::from_raw_parts(a.k_norm, hd);
        let mut k = [0f32; MAX_HEAD_DIM];
        let mut q = [0f32; MAX_HEAD_DIM];
        let mut scores = [0f32; MAX_ATTEND];
        let (k, q) = (&mut k[..hd], &mut q[..hd]);
        let scale = 1.0 / (hd as f32).sqrt();
        for g in h0 / group..h1 / group {
            let (k_at, v_at) = (hd * (a.n_head + g), hd * (a.n_head + nkv + g));
            norm_rope(&qkv[k_at..k_at + hd], k_norm, a.eps, a.theta, pos, k);
            let v = &qkv[v_at..v_at + hd];
            let k_row = a.k_cache.add(hd * (g + nkv * pos));
            for i in 0..hd {
                *k_row.add(i) = k[i];
                *a.v_cache.add(pos + n_ctx * (g * hd + i)) = v[i];
            }
            for h in g * group..(g + 1) * group {
                norm_rope(&qkv[h * hd..(h + 1) * hd], q_norm, a.eps, a.theta, pos, q);
                let mut max = f32::NEG_INFINITY;
                for (t, s) in scores[..=pos].iter_mut().enumerate() {
                    let kt = std::slice::from_raw_parts(a.k_cache.add(hd * (g + nkv * t)), hd);
                    *s = dot(q, kt) * scale;
                    max = max.max(*s);
                }
                let mut sum = 0f64;
                for s in &mut scores[..=pos] {
                    *s = (*s - max).exp();
                    sum += *s as f64;
                }
                let inv = (1.0 / sum) as f32;
                let out = std::slice::from_raw_parts_mut(a.out.add(h * hd), hd);
                for (i, o) in out.iter_mut().enumerate() {
                    let vi =
                        std::slice::from_raw_parts(a.v_cache.add(n_ctx * (g * hd + i)), pos + 1);
                    *o = dot(&scores[..=pos], vi) * inv;
                }
            }
        }
    }
}

/// The widest head [`attend`] takes.
const MAX_HEAD_DIM: usize = 256;
/// The most positions [`attend`] attends (the code predictor's 16).
const MAX_ATTEND: usize = 64;

/// `x` RMS-normed, times `w`, NeoX-roped at `pos`, into `out`.
fn norm_rope(x: &[f32], w: &[f32], eps: f32, theta: f32, pos: usize, out: &mut [f32]) {
    let n = x.len();
    crate::ffi::rms_norm_row(x, w, eps, out);
    let half = n / 2;
    let step = theta.powf(-2.0 / n as f32);
    let mut angle = pos as f32;
    for i in 0..half {
        let (sin, cos) = angle.sin_cos();
        let (x0, x1) = (out[i], out[i + half]);
        out[i] = x0 * cos - x1 * sin;
        out[i + half] = x0 * sin + x1 * cos;
        angle *= step;
    }
}

/// `Σ a·b` in 16 lanes.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..16 {
            acc[j] = x[j].mul_add(y[j], acc[j]);
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}
