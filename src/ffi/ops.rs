//! More ggml operations for [`Context`]: the elementwise and normalisation ops of the decoder
//! (code2wav).
//!
//! Each method checks what ggml would abort on before calling it, as the ops of the parent module
//! do; the semantics are those of the vendored ggml (`ggml/src/ggml-cpu/ops.cpp`, `vec.h`).

use super::{sys, Context, GgmlError, Tensor};

impl Context {
    /// Refuses what ggml's CPU kernels of elementwise and row ops assert on at compute time: a
    /// type other than f32, or a non-contiguous tensor (checked stricter than ggml, simply).
    pub(super) fn dense_f32(what: &'static str, x: Tensor<'_>) -> Result<(), GgmlError> {
        // SAFETY: the tensor is live; reading its type is a field read and the contiguity test
        // reads only its shape and strides.
        let (ty, dense) = unsafe {
            (
                (*x.ptr.as_ptr()).type_,
                sys::ggml_is_contiguous(x.ptr.as_ptr()),
            )
        };
        if ty != sys::GGML_TYPE_F32 || !dense {
            return Err(GgmlError::Shape {
                what,
                expected: "a contiguous f32 tensor".into(),
                found: format!("ggml type {ty}, contiguous {dense}"),
            });
        }
        Ok(())
    }

    /// `silu(gate) ⊙ up`, elementwise, in one op (ggml's `swiglu_split`, as llama.cpp's Qwen3
    /// feed-forward): one graph node, so one barrier between the threads, where `silu` then `mul`
    /// take two.
    pub fn swiglu<'a>(&'a self, gate: Tensor<'a>, up: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("swiglu", gate)?;
        Self::dense_f32("swiglu", up)?;
        if gate.ne() != up.ne() {
            return Err(GgmlError::Shape {
                what: "swiglu",
                expected: format!("up of the gate's shape {:?}", gate.ne()),
                found: format!("{:?}", up.ne()),
            });
        }
        // SAFETY: both tensors are live, contiguous f32 of the same shape (checked above).
        self.op(gate.n_elems(), |c| unsafe {
            sys::ggml_swiglu_split(c, gate.ptr.as_ptr(), up.ptr.as_ptr())
        })
    }

    /// `silu(a) ⊙ b` for each row `[a, b]` of `x` (`[2n, rows]` → `[n, rows]`; ggml's `swiglu`):
    /// the feed-forward of a gate and an up matrix joined into one product.
    pub fn swiglu_halves<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("swiglu_halves", x)?;
        if !x.ne()[0].is_multiple_of(2) {
            return Err(GgmlError::Shape {
                what: "swiglu_halves",
                expected: "rows of an even length".into(),
                found: format!("{:?}", x.ne()),
            });
        }
        // SAFETY: the tensor is live, contiguous f32 with rows of an even length (checked above).
        self.op(x.n_elems() / 2, |c| unsafe {
            sys::ggml_swiglu(c, x.ptr.as_ptr())
        })
    }

    /// `sin(x)`, elementwise (`sinf`).
    pub fn sin<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("sin", x)?;
        // SAFETY: the tensor is live and f32.
        self.op(x.n_elems(), |c| unsafe { sys::ggml_sin(c, x.ptr.as_ptr()) })
    }

    /// `x²`, elementwise.
    pub fn sqr<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("sqr", x)?;
        // SAFETY: the tensor is live and f32.
        self.op(x.n_elems(), |c| unsafe { sys::ggml_sqr(c, x.ptr.as_ptr()) })
    }

    /// `0.5 · x · (1 + erf(x / √2))`, elementwise: the exact GELU (`erff`).
    pub fn gelu_erf<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("gelu_erf", x)?;
        // SAFETY: the tensor is live and f32.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_gelu_erf(c, x.ptr.as_ptr())
        })
    }

    /// `(x − mean(x)) / √(var(x) + eps)` over dimension 0 (LayerNorm without its affine part).
    pub fn norm<'a>(&'a self, x: Tensor<'a>, eps: f32) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("norm", x)?;
        if eps.is_nan() || eps < 0.0 {
            return Err(GgmlError::Shape {
                what: "norm eps",
                expected: "a non-negative epsilon".into(),
                found: eps.to_string(),
            });
        }
        // SAFETY: the tensor is live and f32; eps is non-negative (ggml asserts it).
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_norm(c, x.ptr.as_ptr(), eps)
        })
    }

    /// `x` clamped to `[min, max]`, elementwise.
    pub fn clamp<'a>(&'a self, x: Tensor<'a>, min: f32, max: f32) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("clamp", x)?;
        if min.is_nan() || max.is_nan() || min > max {
            return Err(GgmlError::Shape {
                what: "clamp bounds",
                expected: "min <= max".into(),
                found: format!("[{min}, {max}]"),
            });
        }
        // SAFETY: the tensor is live and f32; the bounds are ordered.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_clamp(c, x.ptr.as_ptr(), min, max)
        })
    }

    /// Sums over dimension 0: `[n, a, b, c]` gives `[1, a, b, c]`.
    pub fn sum_rows<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("sum_rows", x)?;
        let ne = x.ne();
        // SAFETY: the tensor is live and f32.
        self.op(ne[1] * ne[2] * ne[3], |c| unsafe {
            sys::ggml_sum_rows(c, x.ptr.as_ptr())
        })
    }

    /// A view of rows `first..first + n` of a contiguous 2-D tensor `x` (`[ne0, rows]`).
    pub fn rows<'a>(
        &'a self,
        x: Tensor<'a>,
        first: usize,
        n: usize,
    ) -> Result<Tensor<'a>, GgmlError> {
        let ne = x.ne();
        if n == 0 || first + n > ne[1] || ne[2] != 1 || ne[3] != 1 {
            return Err(GgmlError::Shape {
                what: "rows",
                expected: format!("a non-empty row range inside the 2-D tensor {ne:?}"),
                found: format!("rows {first}..{}", first + n),
            });
        }
        // SAFETY: the tensor is live; its strides are read to check contiguity.
        let nb = unsafe { (*x.ptr.as_ptr()).nb };
        // SAFETY: as above; the element size of its type.
        let es = unsafe { sys::ggml_element_size(x.ptr.as_ptr()) };
        if nb[0] != es || nb[1] != es * ne[0] {
            return Err(GgmlError::Shape {
                what: "rows",
                expected: "a contiguous tensor".into(),
                found: format!("strides {nb:?}"),
            });
        }
        // SAFETY: the view covers rows first..first + n, inside x (checked above).
        self.op(0, |c| unsafe {
            sys::ggml_view_2d(
                c,
                x.ptr.as_ptr(),
                ne[0] as i64,
                n as i64,
                nb[1],
                first * nb[1],
            )
        })
    }
}

impl super::OwnedGraph {
    /// Nodes in the graph (ggml's graphs built here hold at most 2048).
    pub fn n_nodes(&self) -> usize {
        // SAFETY: the graph lives in the owned context.
        unsafe { sys::ggml_graph_n_nodes(self.graph.as_ptr()) as usize }
    }
}

impl Context {
    /// The columns of a stride-1, unpadded 1-D convolution: `x` is `[t, c_in]` (time fastest, f32),
    /// `kernel` any tensor shaped `[k, c_in, ..]` (only its shape is read); the result is
    /// `[c_in · k, t − (k − 1) · dilation]` with index `c · k + j` in each column, so that
    /// `mul_mat(kernel as [k · c_in, c_out], columns)` is the convolution, `[c_out, t_out]`.
    pub fn im2col_1d<'a>(
        &'a self,
        kernel: Tensor<'a>,
        x: Tensor<'a>,
        dilation: usize,
    ) -> Result<Tensor<'a>, GgmlError> {
        let (nk, nx) = (kernel.ne(), x.ne());
        // SAFETY: the tensor is live; reading its type is a field read.
        let ty = unsafe { (*x.ptr.as_ptr()).type_ };
        if ty != sys::GGML_TYPE_F32 {
            return Err(GgmlError::Shape {
                what: "im2col_1d input",
                expected: "an f32 tensor".into(),
                found: format!("ggml type {ty}"),
            });
        }
        let span = (nk[0] - 1) * dilation;
        // SAFETY: the tensor is live; its first stride is a field read.
        let nb0 = unsafe { (*x.ptr.as_ptr()).nb[0] };
        if nx[1] != nk[1] || nx[2] != 1 || nx[3] != 1 || nx[0] <= span || dilation == 0 || nb0 != 4
        {
            return Err(GgmlError::Shape {
                what: "im2col_1d",
                expected: format!(
                    "input [t > {span}, {}] with unit stride in time, dilation >= 1",
                    nk[1]
                ),
                found: format!("{nx:?}, dilation {dilation}, time stride {nb0}"),
            });
        }
        let t_out = nx[0] - span;
        // SAFETY: shapes checked above (ggml asserts b.ne[1] == a.ne[1], b.ne[3] == 1, OW > 0 and
        // an f32 input with unit stride); stride 1, no padding, 1-D, f32 output.
        self.op(nk[0] * nk[1] * t_out, |c| unsafe {
            sys::ggml_im2col(
                c,
                kernel.ptr.as_ptr(),
                x.ptr.as_ptr(),
                1,
                0,
                0,
                0,
                dilation as i32,
                0,
                false,
                sys::GGML_TYPE_F32,
            )
        })
    }
}

/// In-place variants: the result is a view of the first operand's memory, which the op
/// overwrites when the graph runs, so nothing computed later may read that operand's old values.
impl Context {
    /// `a + b` written into `a`, with `b` broadcast over `a`.
    pub fn add_inplace<'a>(
        &'a self,
        a: Tensor<'a>,
        b: Tensor<'a>,
    ) -> Result<Tensor<'a>, GgmlError> {
        Self::same_shape("add_inplace", a, b)?;
        // SAFETY: both tensors are live and b repeats into a.
        self.op(0, |c| unsafe {
            sys::ggml_add_inplace(c, a.ptr.as_ptr(), b.ptr.as_ptr())
        })
    }

    /// `a ⊙ b` written into `a`, with `b` broadcast over `a`.
    pub fn mul_inplace<'a>(
        &'a self,
        a: Tensor<'a>,
        b: Tensor<'a>,
    ) -> Result<Tensor<'a>, GgmlError> {
        Self::same_shape("mul_inplace", a, b)?;
        // SAFETY: both tensors are live and b repeats into a.
        self.op(0, |c| unsafe {
            sys::ggml_mul_inplace(c, a.ptr.as_ptr(), b.ptr.as_ptr())
        })
    }

    /// `sin(x)` written into `x`.
    pub fn sin_inplace<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("sin_inplace", x)?;
        // SAFETY: the tensor is live and f32.
        self.op(0, |c| unsafe { sys::ggml_sin_inplace(c, x.ptr.as_ptr()) })
    }

    /// `x²` written into `x`.
    pub fn sqr_inplace<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("sqr_inplace", x)?;
        // SAFETY: the tensor is live and f32.
        self.op(0, |c| unsafe { sys::ggml_sqr_inplace(c, x.ptr.as_ptr()) })
    }
}
