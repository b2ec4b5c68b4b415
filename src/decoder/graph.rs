//! The graph of a chunk of frames: split-RVQ, causal convolutions, the windowed transformer, the
//! upsamplers and the SnakeBeta blocks, with the stream's state read and written back.

use crate::ffi::{Context, GgmlError, Node, OwnedGraph, SharedContext, Tensor};
use crate::gguf::GgmlType;
use crate::kernels::bf16;

use super::{Geometry, CODEBOOKS, HOST_MIN_ROWS, K7};

/// Graph-building helpers: the weights, the state and the state writes of one graph.
struct Builder<'a> {
    pub(super) c: &'a Context,
    pub(super) w: &'a Context,
    pub(super) s: &'a Context,
    pub(super) writes: Vec<Tensor<'a>>,
    pub(super) fused_snake: bool,
    pub(super) host: bool,
    /// The kernel of the bf16 products ([`Decoder::bf16_kernel`]).
    pub(super) bf16: Option<bf16::Kernel>,
}

impl<'a> Builder<'a> {
    pub(super) fn find(ctx: &'a Context, name: &str) -> Result<Tensor<'a>, GgmlError> {
        ctx.get(name).ok_or(GgmlError::Shape {
            what: "decoder tensor",
            expected: name.to_owned(),
            found: "none".into(),
        })
    }

    pub(super) fn wt(&self, name: &str) -> Result<Tensor<'a>, GgmlError> {
        Self::find(self.w, name)
    }

    pub(super) fn st(&self, name: &str) -> Result<Tensor<'a>, GgmlError> {
        Self::find(self.s, name)
    }

    /// `x` (`[c, t]`) after the state's left context `hist` (`[c, h]`); the last `h` rows of the
    /// result become the new context when the graph's writes run.
    pub(super) fn with_context(
        &mut self,
        x: Tensor<'a>,
        hist: &str,
    ) -> Result<Tensor<'a>, GgmlError> {
        let c = self.c;
        let h = self.st(hist)?;
        let xp = c.concat(h, x, 1)?;
        self.keep_context(xp, h)
    }

    /// Queues the write of `xp`'s last rows (as many as the state tensor `h` holds) into `h`,
    /// the next chunk's left context; returns `xp`.
    pub(super) fn keep_context(
        &mut self,
        xp: Tensor<'a>,
        h: Tensor<'a>,
    ) -> Result<Tensor<'a>, GgmlError> {
        let c = self.c;
        let keep = h.ne()[1];
        self.writes
            .push(c.copy_into(c.rows(xp, xp.ne()[1] - keep, keep)?, h)?);
        Ok(xp)
    }

    /// Causal conv `name` of kernel `k` and dilation `d` over `x` (`[c_in, t]`), with its left
    /// context in state tensor `hist` (none for k = 1), plus `residual` (`[c_out, t]`) if any:
    /// im2col columns times the kernel matrix.
    pub(super) fn conv(
        &mut self,
        x: Tensor<'a>,
        name: &str,
        hist: Option<&str>,
        (k, d): (usize, usize),
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        let xp = match hist {
            Some(h) => self.with_context(x, h)?,
            None => x,
        };
        self.conv_on(xp, name, hist.is_some(), (k, d), residual)
    }

    /// [`Builder::conv`] on its input `xp` with the left context already in front of it when
    /// `context` (see [`Builder::snake_with_context`]). The host product adds the bias and the
    /// residual as it stores its output ([`Context::conv_gemm_then`]).
    pub(super) fn conv_on(
        &mut self,
        xp: Tensor<'a>,
        name: &str,
        context: bool,
        (k, d): (usize, usize),
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        let c = self.c;
        let w = self.wt(&format!("{name}.weight"))?;
        let bias = self.wt(&format!("{name}.bias"))?;
        if self.w.get(&format!("{name}.weight.kshape")).is_none() {
            // Stored for the host product (see `Loader::conv`).
            return self.host_product(w, xp, (k, d), Some(bias), residual);
        }
        let y = if context {
            let shape = self.wt(&format!("{name}.weight.kshape"))?;
            if shape.ne()[0] != k {
                return Err(GgmlError::Shape {
                    what: "conv kernel",
                    expected: format!("{k} taps"),
                    found: format!("{:?}", shape.ne()),
                });
            }
            let cols = c.im2col_1d(shape, c.cont(c.permute(xp, [1, 0, 2, 3])?)?, d)?;
            c.mul_mat(w, cols)?
        } else {
            c.mul_mat(w, xp)?
        };
        self.ggml_then(y, Some(bias), residual)
    }

    /// The conv of `x` by a weight matrix stored for the host ([`Context::conv_gemm_then`]): by
    /// [`Context::conv_gemm_panel`] when it is in panels ([`Builder::panel`]), by
    /// [`Context::conv_gemm_int8`] when it is 8-bit (`i8`), else by
    /// [`Context::conv_gemm_by`] with the decoder's bf16 kernel (which ignores an f32 matrix).
    pub(super) fn host_product(
        &self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        (k, d): (usize, usize),
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        if self.panel(w) {
            return self.c.conv_gemm_panel(w, x, k, d, bias, residual);
        }
        if w.is_type(GgmlType::I8) {
            return self.c.conv_gemm_int8(w, x, k, d, bias, residual);
        }
        self.c.conv_gemm_by(self.bf16, w, x, k, d, bias, residual)
    }

    /// Whether the weight matrix `w` is stored in f32 panels ([`crate::kernels::panel`]; its
    /// `<name>.panel` stand-in marks it), which only [`Context::conv_gemm_panel`] reads.
    pub(super) fn panel(&self, w: Tensor<'a>) -> bool {
        (w.is_type(GgmlType::F32) || w.is_type(GgmlType::F16))
            && self.w.get(&format!("{}.panel", w.name())).is_some()
    }

    /// SnakeBeta `name` of `x`, after the left context in state tensor `hist`: as
    /// [`Builder::snake`] then [`Builder::with_context`], in one pass when the snake is fused
    /// ([`Context::rows3_after`]: the activation is written once, behind the context).
    pub(super) fn snake_with_context(
        &mut self,
        x: Tensor<'a>,
        name: &str,
        hist: &str,
    ) -> Result<Tensor<'a>, GgmlError> {
        if !self.fused_snake {
            let y = self.snake(x, name)?;
            return self.with_context(y, hist);
        }
        let c = self.c;
        let h = self.st(hist)?;
        let alpha = self.wt(&format!("{name}.alpha"))?;
        let inv_beta = self.wt(&format!("{name}.beta"))?;
        let xp = c.rows3_after(h, x, alpha, inv_beta, crate::kernels::snake::row)?;
        self.keep_context(xp, h)
    }

    /// SnakeBeta `name`: `x + β⁻¹ · sin²(α · x)` (α and β⁻¹ stored as such), in one new buffer.
    /// One fused pass (`crate::kernels::snake::row`).
    pub(super) fn snake(&self, x: Tensor<'a>, name: &str) -> Result<Tensor<'a>, GgmlError> {
        let c = self.c;
        let alpha = self.wt(&format!("{name}.alpha"))?;
        let inv_beta = self.wt(&format!("{name}.beta"))?;
        if !self.fused_snake {
            let a = c.mul(x, alpha)?;
            let sin2 = c.sqr_inplace(c.sin_inplace(a)?)?;
            let y = c.mul_inplace(sin2, inv_beta)?;
            return c.add_inplace(y, x);
        }
        c.rows3(x, alpha, inv_beta, crate::kernels::snake::row)
    }

    /// `mul_mat(w, x)`: by [`Builder::host_product`] for weights packed at load (panels, bf16),
    /// and for unpacked f32 weights in host mode when `x` has at least [`HOST_MIN_ROWS`] rows
    /// (fewer rows would spend more on packing `w` per call than on the product), else by ggml.
    /// Then `+ bias` (broadcast: its length divides the output's width), then `+ residual`, as
    /// [`Context::conv_gemm_then`].
    pub(super) fn matmul_then(
        &self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        if self.panel(w)
            || w.is_type(GgmlType::BF16)
            || w.is_type(GgmlType::I8)
            || (self.host && w.is_type(GgmlType::F32) && x.ne()[1] >= HOST_MIN_ROWS)
        {
            return self.host_product(w, x, (1, 1), bias, residual);
        }
        self.ggml_then(self.c.mul_mat(w, x)?, bias, residual)
    }

    /// `y + bias + residual` by ggml's adds, in that order, for the products ggml computes.
    pub(super) fn ggml_then(
        &self,
        y: Tensor<'a>,
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        let c = self.c;
        let y = match bias {
            // A bias shorter than the rows broadcasts over their repeats (`[b, t]` viewed as
            // `[b, t · c_out / b]`).
            Some(b) if b.n_elems() != y.ne()[0] => {
                let (n, t) = (y.ne()[0], y.ne()[1]);
                let r = n / b.n_elems();
                c.reshape(
                    c.add_inplace(c.reshape(y, [b.n_elems(), t * r, 1])?, b)?,
                    [n, t, 1],
                )?
            }
            Some(b) => c.add_inplace(y, b)?,
            None => y,
        };
        match residual {
            Some(r) => c.add_inplace(y, r),
            None => Ok(y),
        }
    }

    /// `mul_mat(w, x)` for a weight matrix `w`: by [`Builder::host_product`] when `w` was packed
    /// at load (panels or bf16, which ggml cannot read), else by ggml. Then `+ bias`, as
    /// [`Builder::matmul_then`].
    pub(super) fn product_then(
        &self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        bias: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        if self.panel(w) || w.is_type(GgmlType::BF16) || w.is_type(GgmlType::I8) {
            return self.host_product(w, x, (1, 1), bias, None);
        }
        self.ggml_then(self.c.mul_mat(w, x)?, bias, None)
    }

    /// `mul_mat(w, x)`, as [`Builder::product_then`] without a bias.
    pub(super) fn product(&self, w: Tensor<'a>, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        self.product_then(w, x, None)
    }

    /// `w · x + b` for Linear `name`.
    pub(super) fn linear(&self, x: Tensor<'a>, name: &str) -> Result<Tensor<'a>, GgmlError> {
        self.product_then(
            self.wt(&format!("{name}.weight"))?,
            x,
            Some(self.wt(&format!("{name}.bias"))?),
        )
    }
}

/// Builds the graph of a chunk of `n` frames: inputs `in.codes0` (`n` codes of codebook 0),
/// `in.codes_rest` (`15n` row indices into the stacked codebooks 1..15, frame-major), `in.pos`
/// (the frames' positions) and `in.mask` (`[window − 1 + n, n]` attention mask); output `out.wav`
/// (`n · samples_per_frame` samples), stages `stage.*`; the state is written back last.
///
/// With `head`, the graph stops after the transformer and has no output: it advances the state
/// of the pre-conv and the transformer only, for [`super::Decoder::prime`].
/// `(w, s)`: the weights and the stream's state; `(host, bf16)`: how products are computed.
pub(super) fn build_chunk(
    (w, s): (&SharedContext, &SharedContext),
    g: &Geometry,
    n: usize,
    keep_stages: bool,
    head: bool,
    fused_snake: bool,
    (host, bf16): (bool, Option<bf16::Kernel>),
) -> Result<OwnedGraph, GgmlError> {
    // The graph reads the weights of `w`, and reads and writes the stream's state in `s`.
    OwnedGraph::build_allocated(keep_stages.then_some("stage."), &[w, s], |c| {
        build_nodes(
            &mut Builder {
                c,
                w,
                s,
                writes: Vec::new(),
                fused_snake,
                host,
                bf16,
            },
            g,
            n,
            head,
        )
    })
}

fn build_nodes(
    b: &mut Builder<'_>,
    g: &Geometry,
    n: usize,
    head: bool,
) -> Result<Vec<Node>, GgmlError> {
    let c = b.c;
    let p = "a.gen.wav";

    // Split-RVQ dequantization.
    let codes0 = c.new_i32(n)?.set_name("in.codes0");
    let rest_ids = c.new_i32((CODEBOOKS - 1) * n)?.set_name("in.codes_rest");
    let e0 = c.get_rows(b.wt(&format!("{p}.quant.first.codebook.weight"))?, codes0)?;
    let er = c.get_rows(b.wt(&format!("{p}.quant.rest.codebook.weight"))?, rest_ids)?;
    let er = c.reshape(er, [g.half, CODEBOOKS - 1, n])?;
    let er = c.sum_rows(c.cont(c.permute(er, [1, 0, 2, 3])?)?)?;
    let er = c.reshape(er, [g.half, n, 1])?;
    let z = c.add(
        b.product(b.wt(&format!("{p}.quant.first.out_proj.weight"))?, e0)?,
        b.product(b.wt(&format!("{p}.quant.rest.out_proj.weight"))?, er)?,
    )?;
    z.set_name("stage.quantized");
    let x = b.conv(
        z,
        &format!("{p}.pre_conv"),
        Some("hist.pre_conv"),
        (3, 1),
        None,
    )?;
    x.set_name("stage.pre_conv");

    // Transformer.
    let t = format!("{p}.tfm");
    let mut x = b.linear(x, &format!("{t}.in_proj"))?;
    let pos = c.new_i32(n)?.set_name("in.pos");
    let n_kv = g.window - 1 + n;
    let mask = c.new_f32(&[n_kv, n])?.set_name("in.mask");
    let (hd, nh, nkv) = (g.head_dim, g.n_head, g.n_head_kv);
    for l in 0..g.n_layer {
        let lw = |name: &str| b.wt(&format!("{t}.blk.{l}.{name}"));
        let h = c.mul(c.rms_norm(x, g.eps)?, lw("ln1.weight")?)?;
        let q = c.reshape(b.product(lw("attn_q.weight")?, h)?, [hd, nh, n])?;
        let q = c.rope_neox(q, pos, hd, g.theta)?;
        let k = c.reshape(b.product(lw("attn_k.weight")?, h)?, [hd, nkv, n])?;
        let k = c.rope_neox(k, pos, hd, g.theta)?;
        let v = c.reshape(b.product(lw("attn_v.weight")?, h)?, [hd, nkv, n])?;
        let (ck, cv) = (
            b.st(&format!("cache.k.{l}"))?,
            b.st(&format!("cache.v.{l}"))?,
        );
        let keys = c.concat(ck, k, 2)?;
        let vals = c.concat(cv, v, 2)?;
        let nb = [4, 4 * hd, 4 * hd * nkv];
        let keep = [hd, nkv, g.window - 1];
        let wk = c.copy_into(c.view(keys, keep, nb, n * nb[2])?, ck)?;
        let wv = c.copy_into(c.view(vals, keep, nb, n * nb[2])?, cv)?;
        let keys = c.permute(keys, [0, 2, 1, 3])?;
        let vals = c.cont(c.permute(vals, [1, 2, 0, 3])?)?;
        let kq = c.mul_mat(keys, c.permute(q, [0, 2, 1, 3])?)?;
        let kq = c.soft_max(kq, Some(mask), 1.0 / (hd as f32).sqrt())?;
        let kqv = c.mul_mat(vals, kq)?;
        let o = c.reshape(c.cont(c.permute(kqv, [0, 2, 1, 3])?)?, [hd * nh, n, 1])?;
        let o = c.mul(b.product(lw("attn_out.weight")?, o)?, lw("ls1.weight")?)?;
        x = c.add(x, o)?;
        let h = c.mul(c.rms_norm(x, g.eps)?, lw("ln2.weight")?)?;
        let gate = c.silu(b.product(lw("ffn_gate.weight")?, h)?)?;
        let up = b.product(lw("ffn_up.weight")?, h)?;
        let ff = b.product(lw("ffn_down.weight")?, c.mul(gate, up)?)?;
        x = c.add(x, c.mul(ff, lw("ls2.weight")?)?)?;
        b.writes.push(wk);
        b.writes.push(wv);
    }
    let x = c.mul(
        c.rms_norm(x, g.eps)?,
        b.wt(&format!("{t}.output_norm.weight"))?,
    )?;
    let mut x = b.linear(x, &format!("{t}.out_proj"))?;
    x.set_name("stage.pre_transformer");
    if head {
        return Ok(b.writes.iter().map(|t| t.node()).collect());
    }

    // ConvNeXt upsamplers.
    let mut rows = n;
    for (u, &r) in g.upsampling_ratios.iter().enumerate() {
        let ub = format!("{p}.up.blk.{u}");
        let y = b.product_then(
            b.wt(&format!("{ub}.conv.weight.cur"))?,
            x,
            Some(b.wt(&format!("{ub}.conv.bias"))?),
        )?;
        rows *= r;
        let y = c.reshape(y, [g.latent, rows, 1])?;
        y.set_name(&format!("stage.upsample.{u}.transconv"));
        let yp = b.with_context(y, &format!("hist.up.{u}"))?;
        let mut h = c.mul(
            c.rows(yp, 0, rows)?,
            b.wt(&format!("{ub}.dwconv.weight.tap0"))?,
        )?;
        for j in 1..K7 {
            let tap = b.wt(&format!("{ub}.dwconv.weight.tap{j}"))?;
            h = c.add(h, c.mul(c.rows(yp, j, rows)?, tap)?)?;
        }
        let h = c.add(h, b.wt(&format!("{ub}.dwconv.bias"))?)?;
        let h = c.mul(c.norm(h, 1e-6)?, b.wt(&format!("{ub}.norm.weight"))?)?;
        let h = c.add(h, b.wt(&format!("{ub}.norm.bias"))?)?;
        let h = c.gelu_erf(b.linear(h, &format!("{ub}.pw1"))?)?;
        let h = b.linear(h, &format!("{ub}.pw2"))?;
        let h = c.mul(h, b.wt(&format!("{ub}.gamma"))?)?;
        x = c.add(y, h)?;
        x.set_name(&format!("stage.upsample.{u}.convnext"));
    }

    // The DAC decoder.
    let d = format!("{p}.dac");
    let mut x = b.conv(x, &format!("{d}.entry"), Some("hist.entry"), (K7, 1), None)?;
    x.set_name("stage.decoder.0");
    let mut ch = g.decoder_dim;
    for (i, &r) in g.upsample_rates.iter().enumerate() {
        let db = format!("{d}.blk.{i}");
        let cout = ch / 2;
        let s = b.snake(x, &format!("{db}.snake"))?;
        // Input row t gives output rows t·r..t·r + 2r: its first r taps land in block t, its
        // last r in block t + 1 (the tail), and the last block's tail is trimmed until the next
        // chunk.
        let prev = b.matmul_then(b.wt(&format!("{db}.conv.weight.prev"))?, s, None, None)?;
        let tail = b.st(&format!("tail.blk.{i}"))?;
        let shifted = if rows > 1 {
            c.concat(tail, c.rows(prev, 0, rows - 1)?, 1)?
        } else {
            tail
        };
        b.writes
            .push(c.copy_into(c.rows(prev, rows - 1, 1)?, tail)?);
        let y = b.matmul_then(
            b.wt(&format!("{db}.conv.weight.cur"))?,
            s,
            Some(b.wt(&format!("{db}.conv.bias"))?),
            Some(shifted),
        )?;
        rows *= r;
        let mut y = c.reshape(y, [cout, rows, 1])?;
        for (j, dil) in [1, 3, 9].into_iter().enumerate() {
            let rb = format!("{db}.res.{j}");
            let hist = format!("hist.blk.{i}.res.{j}");
            let hp = b.snake_with_context(y, &format!("{rb}.act1"), &hist)?;
            let h = b.conv_on(hp, &format!("{rb}.conv1"), true, (K7, dil), None)?;
            let h = b.snake(h, &format!("{rb}.act2"))?;
            y = b.conv(h, &format!("{rb}.conv2"), None, (1, 1), Some(y))?;
        }
        x = y;
        x.set_name(&format!("stage.decoder.{}", i + 1));
        ch = cout;
    }
    let x = b.snake(x, &format!("{d}.post_snake"))?;
    x.set_name("stage.decoder.5");
    let x = b.conv(
        x,
        &format!("{d}.post_conv"),
        Some("hist.post"),
        (K7, 1),
        None,
    )?;
    x.set_name("stage.decoder.6");
    let wav = c.clamp(x, -1.0, 1.0)?.set_name("out.wav");
    // The state writes run after everything that reads the old state.
    let mut outs = vec![wav.node()];
    outs.extend(b.writes.iter().map(|t| t.node()));
    Ok(outs)
}
