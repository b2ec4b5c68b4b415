//! Which code multiplies a Qwen3 layer's matrices, and how the matrices are stored for it: the
//! code predictor's and the talker's own graph share this.
//!
//! Under [`LayerKernel::Packed`], q4_K, q5_K and q8_0 matrices whose rows come in whole packing
//! groups are rearranged at load ([`crate::kernels::quant::pack`]) and multiplied by the kernel
//! tier's packed kernel ([`crate::kernels::quant::packed_kernel`]) in a custom node
//! ([`Context::map_mat_with`]); everything else goes to ggml's `mul_mat`. A layer's q, k and v
//! matrices, and its gate and up, are joined row after row into one matrix each where they
//! can be ([`JOINED`]).

use crate::error::ModelError;
use crate::ffi::{Context, GgmlError, Tensor};
use crate::gguf::{GgmlType, GgufFile, TensorInfo};
use crate::kernels::quant::{self, QType};
use crate::kernels::MatKernel;

/// Which code computes the q4_K, q5_K and q8_0 layer products. Under the crate's kernels
/// (`Scalar` and `Packed`), a single row also attends in one node of the crate's own
/// ([`crate::ffi::Context::attend_one`]), so the two give the same frame to the bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKernel {
    /// ggml's `mul_mat`: the benches' baseline, and the default on the scalar tier.
    Ggml,
    /// The crate's scalar kernels on the file's rows ([`crate::kernels::quant::rows_kernel`]):
    /// the definition the packed kernels reproduce, on every tier; the tests' reference (slow).
    Scalar,
    /// q4_K, q5_K and q8_0 matrices packed 16 rows at a time at load and multiplied by the
    /// kernel tier's packed kernels (AVX-512 VNNI, AVX2, NEON): the default where the tier has
    /// them. Their results are [`LayerKernel::Scalar`]'s bits on every tier.
    Packed,
}

impl LayerKernel {
    /// Refuses the packed kernels where the process's kernel tier has none (the others run
    /// everywhere).
    pub fn check_available(self) -> Result<(), ModelError> {
        let tier = crate::kernels::selected()?;
        if self == LayerKernel::Packed && Self::fastest_for(tier) != LayerKernel::Packed {
            return Err(ModelError::Unsupported {
                what: "packed q4_K, q5_K and q8_0 products".into(),
                expected: "a kernel tier with SIMD (avx2, avxvnni, avx512, amx or neon)".into(),
                found: format!("kernel tier {tier}"),
            });
        }
        Ok(())
    }

    /// The fastest the process's kernel tier runs.
    pub fn fastest() -> Self {
        Self::fastest_for(crate::kernels::active())
    }

    /// The fastest `tier` runs: packed where it has packed kernels, else ggml's.
    pub fn fastest_for(tier: crate::kernels::Tier) -> Self {
        if quant::packed_kernel(QType::Q4K, tier.caps()).is_some() {
            LayerKernel::Packed
        } else {
            LayerKernel::Ggml
        }
    }
}

/// Whether a weight of type `ty` and shape `ne` is packed under `kernel`.
pub(crate) fn packs(kernel: LayerKernel, ty: GgmlType, ne: &[usize]) -> bool {
    kernel == LayerKernel::Packed
        && ne.len() >= 2
        && QType::of(ty).is_some_and(|q| quant::fits(q, ne[1], ne[0]))
}

/// The type of weight `w` when [`packs`] packs it under `kernel`.
pub(crate) fn packed_type(kernel: LayerKernel, w: Tensor<'_>) -> Option<QType> {
    let ty = QType::ALL.into_iter().find(|t| w.is_type(t.ggml()))?;
    packs(kernel, ty.ggml(), &w.ne()).then_some(ty)
}

/// Packs (`forward`) or unpacks the `n` rows of a q4_K, q5_K or q8_0 weight, in place.
pub(crate) fn repack(ty: QType, bytes: &mut [u8], n: usize, forward: bool) {
    if forward {
        quant::pack(ty, bytes, n)
    } else {
        quant::unpack(ty, bytes, n)
    }
}

/// Layer matrices that multiply the same input, joined row after row into one matrix (named
/// first) when their file tensors allow it (one packed type, rows in whole
/// packing groups): one product and one graph node where there were three or two, the
/// input quantized once, and the feed-forward's `silu(gate) · up` read from one output
/// ([`Context::swiglu_halves`]). The Qwen3 layer takes the joined matrix where it exists.
pub const JOINED: [(&str, &[&str]); 2] = [
    (
        "attn_qkv.weight",
        &["attn_q.weight", "attn_k.weight", "attn_v.weight"],
    ),
    ("ffn_gate_up.weight", &["ffn_gate.weight", "ffn_up.weight"]),
];

/// The file's tensors `parts` of a [`JOINED`] group, when they can be joined: one type that the
/// packed kernels take, rows of the same length, and each part's rows in whole packing groups,
/// so that packing the joined matrix packs each part as it would alone (any kernel then reads
/// it: ggml sees the parts' rows one after the other).
fn joinable<'h>(f: &'h GgufFile, parts: &[String]) -> Option<Vec<&'h TensorInfo>> {
    let infos = parts
        .iter()
        .map(|n| f.header.tensor(n))
        .collect::<Option<Vec<_>>>()?;
    let first = infos.first()?;
    let ok = QType::of(first.ty).is_some()
        && infos.iter().all(|t| {
            let ne: Vec<usize> = t.ne.iter().map(|&x| x as usize).collect();
            t.ty == first.ty
                && ne.len() == 2
                && t.ne[0] == first.ne[0]
                && packs(LayerKernel::Packed, t.ty, &ne)
        });
    ok.then_some(infos)
}

/// Writes one layer's [`JOINED`] matrices into `ctx`, each where [`joinable`] allows: `file(m)`
/// is the file's name of the layer's matrix `m` (`attn_q.weight`, ...), `name(m)` the context's;
/// packed when `kernel` packs them. Returns the file names of the parts written (the caller
/// copies the layer's other tensors) and releases their pages.
pub(crate) fn write_layer_joined(
    ctx: &Context,
    f: &GgufFile,
    file: &dyn Fn(&str) -> String,
    name: &dyn Fn(&str) -> String,
    kernel: LayerKernel,
) -> Result<Vec<String>, ModelError> {
    let mut written = Vec::new();
    for (joined, parts) in JOINED {
        let parts: Vec<String> = parts.iter().map(|p| file(p)).collect();
        let Some(infos) = joinable(f, &parts) else {
            continue;
        };
        let (ty, k) = (infos[0].ty, infos[0].ne[0] as usize);
        let n: usize = infos.iter().map(|t| t.ne[1] as usize).sum();
        let mut bytes = Vec::with_capacity(infos.iter().map(|t| t.nbytes as usize).sum());
        for t in &infos {
            let missing = || ModelError::MissingTensor {
                path: f.path().into(),
                tensor: t.name.clone(),
            };
            bytes.extend_from_slice(f.tensor_data(&t.name).ok_or_else(missing)?);
            f.release(&t.name);
        }
        let w = ctx.new_tensor(ty, &[k, n]).map_err(ModelError::from)?;
        write_product_weight(w, ty, bytes.into(), kernel).map_err(ModelError::from)?;
        w.set_name(&name(joined));
        written.extend(parts);
    }
    Ok(written)
}

/// Writes a layer product's weight `w` from the file's bytes `data`, packed when [`packs`] says
/// so under `kernel`.
pub(crate) fn write_product_weight(
    w: Tensor<'_>,
    ty: GgmlType,
    data: std::borrow::Cow<'_, [u8]>,
    kernel: LayerKernel,
) -> Result<(), GgmlError> {
    let ne = w.ne();
    match QType::of(ty) {
        Some(q) if packs(kernel, ty, &ne) && data.len() == w.nbytes() => {
            let mut packed = data.into_owned();
            repack(q, &mut packed, ne[1], true);
            w.write_bytes(&packed)
        }
        _ => w.write_bytes(&data),
    }
}

/// `mul_mat(w, x)` of a layer, by `kernel`: packed rows by the tier's packed kernel (packed at
/// load or by a stage's `set_layer_kernel`, see [`packs`]), everything else by ggml.
pub(crate) fn layer_product<'a>(
    c: &'a Context,
    w: Tensor<'a>,
    x: Tensor<'a>,
    kernel: LayerKernel,
) -> Result<Tensor<'a>, GgmlError> {
    match rust_kernel(kernel, w) {
        Some(f) => product_by(c, f, w, x, None, None),
        None => c.mul_mat(w, x),
    }
}

/// The Rust kernel [`layer_product`] multiplies by `w` with under `kernel`, and the rows it
/// takes at a time (whole packed groups, or single rows); `None` for ggml's `mul_mat`.
pub(crate) fn rust_kernel(kernel: LayerKernel, w: Tensor<'_>) -> Option<(MatKernel, usize)> {
    match kernel {
        LayerKernel::Ggml => None,
        LayerKernel::Packed => {
            let ty = packed_type(kernel, w)?;
            Some((
                quant::packed_kernel(ty, crate::kernels::caps())?,
                quant::GROUP,
            ))
        }
        LayerKernel::Scalar => {
            let ty = QType::ALL.into_iter().find(|t| w.is_type(t.ggml()))?;
            w.ne()[0]
                .is_multiple_of(ty.block())
                .then(|| (quant::rows_kernel(ty), 1))
        }
    }
}

/// `w · x` by a kernel of [`rust_kernel`], `x` normed first and `residual` added as
/// [`Context::map_mat_with`] folds them.
pub(crate) fn product_by<'a>(
    c: &'a Context,
    (f, rows): (MatKernel, usize),
    w: Tensor<'a>,
    x: Tensor<'a>,
    norm: Option<(Tensor<'a>, f32)>,
    residual: Option<Tensor<'a>>,
) -> Result<Tensor<'a>, GgmlError> {
    if rows == quant::GROUP {
        c.map_mat_with::<{ quant::GROUP }>(w, x, norm, residual, f)
    } else {
        c.map_mat_with::<1>(w, x, norm, residual, f)
    }
}
