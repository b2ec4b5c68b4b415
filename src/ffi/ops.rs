//! More ggml operations for [`Context`]: the elementwise and normalisation ops of the decoder
//! (code2wav).
//!
//! Each method checks what ggml would abort on before calling it, as the ops of the parent module
//! do; the semantics are those of the vendored ggml (`ggml/src/ggml-cpu/ops.cpp`, `vec.h`).

use super::{sys, Context, GgmlError, Tensor};
use crate::gguf::GgmlType;
use crate::kernels::{attend, bf16, MatKernel};

impl Context {
    /// Refuses what ggml's CPU kernels of elementwise and row ops assert on at compute time: a
    /// type other than f32, or a non-contiguous tensor (checked stricter than ggml, simply).
    fn dense_f32(what: &'static str, x: Tensor<'_>) -> Result<(), GgmlError> {
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

/// Rows `r0..r1` of `n`, thread `ith` of a custom op's `nth`: contiguous shares in thread order,
/// the last ones shorter or empty.
fn thread_share(n: usize, ith: std::os::raw::c_int, nth: std::os::raw::c_int) -> (usize, usize) {
    let (ith, nth) = (ith.max(0) as usize, nth.max(1) as usize);
    let per = n.div_ceil(nth);
    ((ith * per).min(n), ((ith + 1) * per).min(n))
}

/// ggml's side of a custom op: called on every thread of the graph with the node, the thread's
/// index and count, and the op's `userdata`.
type Trampoline = unsafe extern "C" fn(
    *mut sys::ggml_tensor,
    std::os::raw::c_int,
    std::os::raw::c_int,
    *mut std::os::raw::c_void,
);

impl Context {
    /// A new f32 tensor of shape `ne` computed by `fun` from the sources `args` (in that order)
    /// with `userdata`, on every thread of the graph.
    ///
    /// # Safety
    /// `fun` reads the sources and writes the output only as their shapes, checked by the
    /// caller, allow, and takes `userdata` for what it is.
    unsafe fn custom_f32<'a>(
        &'a self,
        ne: [usize; 4],
        args: &[Tensor<'a>],
        fun: Trampoline,
        userdata: *mut std::os::raw::c_void,
    ) -> Result<Tensor<'a>, GgmlError> {
        let mut srcs: Vec<*mut sys::ggml_tensor> = args.iter().map(|t| t.ptr.as_ptr()).collect();
        // SAFETY: the sources are live tensors; ggml copies their pointers into the node; the
        // caller vouches for `fun`.
        self.op(ne.iter().product(), |ctx| unsafe {
            sys::ggml_custom_4d(
                ctx,
                sys::GGML_TYPE_F32,
                ne[0] as i64,
                ne[1] as i64,
                ne[2] as i64,
                ne[3] as i64,
                srcs.as_mut_ptr(),
                srcs.len() as i32,
                Some(fun),
                -1, // GGML_N_TASKS_MAX: every thread of the graph
                userdata,
            )
        })
    }
}

/// Where a custom op of ours keeps its own parameters: `op_params` (16 i32) from index 8 on.
/// ggml's `ggml_custom_4d` stores its `ggml_custom_op_params` (a function pointer, an int and a
/// pointer: 24 bytes on 64-bit targets, `ggml-impl.h`) in the first 32 bytes and reads no more.
/// Parameters in the node itself, not in a tensor, also hold in graphs placed by ggml's
/// allocator, whose tensors have no data when the graph is built.
const EXTRA_PARAMS: usize = 8;

/// Writes `vals` (at most 8) as a custom node's own parameters (see [`EXTRA_PARAMS`]).
fn set_extra_params(t: Tensor<'_>, vals: &[i32]) {
    // SAFETY: the node is live; indices EXTRA_PARAMS.. of its 16 op_params are unused by ggml
    // for a custom op (see EXTRA_PARAMS), and vals has at most 8 values (the callers' 2 and 6).
    unsafe {
        let p = &mut (*t.ptr.as_ptr()).op_params;
        p[EXTRA_PARAMS..EXTRA_PARAMS + vals.len()].copy_from_slice(vals);
    }
}

/// A custom node's own parameters (see [`EXTRA_PARAMS`]).
///
/// # Safety
/// `dst` is a live node.
unsafe fn extra_params(dst: *const sys::ggml_tensor) -> [i32; 8] {
    // SAFETY: the caller passes a live node; op_params has 16 values.
    unsafe {
        let all: &[i32; 16] = &(*dst).op_params;
        let mut out = [0i32; 8];
        out.copy_from_slice(&all[EXTRA_PARAMS..EXTRA_PARAMS + 8]);
        out
    }
}

/// A row kernel for [`Context::rows3`]: `(x, b, c, y)`, each one row of `ne0` values.
pub type RowKernel3 = fn(&[f32], &[f32], &[f32], &mut [f32]);

/// ggml's side of [`Context::rows3`]: splits the rows of `a` over the graph's threads and calls
/// the kernel carried in `userdata` on each.
unsafe extern "C" fn rows3_trampoline(
    dst: *mut sys::ggml_tensor,
    a: *const sys::ggml_tensor,
    b: *const sys::ggml_tensor,
    c: *const sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    userdata: *mut std::os::raw::c_void,
) {
    // SAFETY: `rows3` built this node: `userdata` is a `RowKernel3`, `a` and `dst` are contiguous
    // f32 tensors of the same shape, `b` and `c` contiguous f32 rows of `a`'s row length, all
    // allocated by the time ggml computes the node.
    unsafe {
        let ne = (*a).ne;
        let (ne0, rows) = (ne[0] as usize, (ne[1] * ne[2] * ne[3]) as usize);
        let (r0, r1) = thread_share(rows, ith, nth);
        let y = (*dst).data as *mut f32;
        kernel_rows(
            userdata,
            (*a).data as *const f32,
            b,
            c,
            ne0,
            r0..r1,
            y.add(r0 * ne0),
        );
    }
}

/// The row kernel carried in `userdata` on rows `rows` of `x` (rows of `ne0`), with the single
/// rows `b` and `c`, written from `y` on.
///
/// # Safety
/// `userdata` is a [`RowKernel3`]; `x` holds the rows, `b` and `c` are allocated contiguous f32
/// tensors of `ne0` values, `y` has room for the rows.
unsafe fn kernel_rows(
    userdata: *mut std::os::raw::c_void,
    x: *const f32,
    b: *const sys::ggml_tensor,
    c: *const sys::ggml_tensor,
    ne0: usize,
    rows: std::ops::Range<usize>,
    y: *mut f32,
) {
    // SAFETY: the caller's contract.
    unsafe {
        let kernel: RowKernel3 =
            std::mem::transmute::<*mut std::os::raw::c_void, RowKernel3>(userdata);
        let bv = std::slice::from_raw_parts((*b).data as *const f32, ne0);
        let cv = std::slice::from_raw_parts((*c).data as *const f32, ne0);
        for (i, r) in rows.enumerate() {
            let xr = std::slice::from_raw_parts(x.add(r * ne0), ne0);
            let yr = std::slice::from_raw_parts_mut(y.add(i * ne0), ne0);
            // A panic must not unwind into ggml; the kernels here do not panic on rows of
            // matching lengths, and a caught one leaves the row as it was.
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| kernel(xr, bv, cv, yr)));
        }
    }
}

impl Context {
    /// Checks that each of a row kernel's single-row parameters is one contiguous f32 row of
    /// `ne0` values.
    fn row_params<const N: usize>(
        params: [(&'static str, Tensor<'_>); N],
        ne0: usize,
    ) -> Result<(), GgmlError> {
        for (what, t) in params {
            Self::dense_f32(what, t)?;
            if t.n_elems() != ne0 {
                return Err(GgmlError::Shape {
                    what,
                    expected: format!("one row of {ne0} values"),
                    found: format!("{:?}", t.ne()),
                });
            }
        }
        Ok(())
    }

    /// `y = kernel(x, b, c)` row by row: a new tensor shaped as `x`, whose every row (of `ne0`
    /// values) is computed by `kernel` from that row of `x` and the single rows `b` and `c`;
    /// rows are split over the graph's threads. For fused elementwise ops ggml lacks.
    pub fn rows3<'a>(
        &'a self,
        x: Tensor<'a>,
        b: Tensor<'a>,
        c: Tensor<'a>,
        kernel: RowKernel3,
    ) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("rows3 x", x)?;
        Self::row_params([("rows3 b", b), ("rows3 c", c)], x.ne()[0])?;
        // SAFETY: the tensors are live, contiguous f32 and shaped as the trampoline expects; the
        // kernel is a plain function pointer, valid for the program's life.
        self.op(x.n_elems(), |ctx| unsafe {
            sys::ggml_map_custom3(
                ctx,
                x.ptr.as_ptr(),
                b.ptr.as_ptr(),
                c.ptr.as_ptr(),
                Some(rows3_trampoline),
                -1, // GGML_N_TASKS_MAX: every thread of the graph
                kernel as *mut std::os::raw::c_void,
            )
        })
    }
}

/// ggml's side of [`Context::rows3_after`]: splits the rows of `dst` over the graph's threads;
/// the first rows are copies of `head`'s, the others the kernel of `x`'s rows.
unsafe extern "C" fn rows3_after_trampoline(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    userdata: *mut std::os::raw::c_void,
) {
    // SAFETY: `rows3_after` built this node: `userdata` is a `RowKernel3`; the sources are, in
    // order, `x` (contiguous f32, rows of ne0), `b` and `c` (one row of ne0 each) and `head`
    // (contiguous f32, rows of ne0); `dst` is contiguous f32 with head's rows then x's; all are
    // allocated by the time ggml computes the node.
    unsafe {
        let [x, b, c, head] = [0, 1, 2, 3].map(|i| (*dst).src[i]);
        let ne0 = (*dst).ne[0] as usize;
        let rows = ((*dst).ne[1] * (*dst).ne[2] * (*dst).ne[3]) as usize;
        let h = ((*head).ne[1] * (*head).ne[2] * (*head).ne[3]) as usize;
        let (r0, r1) = thread_share(rows, ith, nth);
        let y = (*dst).data as *mut f32;
        let copied = r1.min(h).max(r0);
        if copied > r0 {
            let hv = (*head).data as *const f32;
            std::ptr::copy_nonoverlapping(hv.add(r0 * ne0), y.add(r0 * ne0), (copied - r0) * ne0);
        }
        // Row r of dst is row r − h of x (copied ≥ h whenever rows are left).
        if copied < r1 {
            let xs = (*x).data as *const f32;
            kernel_rows(
                userdata,
                xs,
                b,
                c,
                ne0,
                copied - h..r1 - h,
                y.add(copied * ne0),
            );
        }
    }
}

impl Context {
    /// `head`'s rows, then [`Context::rows3`]`(x, b, c, kernel)`'s, in one new tensor of `ne0 ×
    /// (h + t)` (`head` is `ne0 × h`, `x` is `ne0 × t`): a causal conv's left context in front of
    /// its fused activation, with no separate copy of the activation for the concatenation.
    pub fn rows3_after<'a>(
        &'a self,
        head: Tensor<'a>,
        x: Tensor<'a>,
        b: Tensor<'a>,
        c: Tensor<'a>,
        kernel: RowKernel3,
    ) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("rows3_after head", head)?;
        Self::dense_f32("rows3_after x", x)?;
        let (ne0, nh, nx) = (x.ne()[0], head.ne(), x.ne());
        Self::row_params([("rows3_after b", b), ("rows3_after c", c)], ne0)?;
        if nh[0] != ne0 || nh[2..] != [1, 1] || nx[2..] != [1, 1] {
            return Err(GgmlError::Shape {
                what: "rows3_after head",
                expected: format!("[{ne0}, h] after x of {nx:?}"),
                found: format!("{nh:?}"),
            });
        }
        // SAFETY: the tensors are live, contiguous f32 and shaped as the trampoline expects
        // (checked above); the kernel is a plain function pointer, valid for the program's life.
        unsafe {
            self.custom_f32(
                [ne0, nh[1] + nx[1], 1, 1],
                &[x, b, c, head],
                rows3_after_trampoline,
                kernel as *mut std::os::raw::c_void,
            )
        }
    }
}

/// ggml's side of [`Context::append`]: the output's bytes split evenly over the graph's threads,
/// each thread copying its share from the first source's bytes, then the second's.
unsafe extern "C" fn append_trampoline(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    _userdata: *mut std::os::raw::c_void,
) {
    // SAFETY: `append` built this node: its two sources are contiguous f32 tensors, `dst` a fresh
    // contiguous f32 tensor of as many bytes as both; every copy below stays inside one source
    // and `dst`.
    unsafe {
        let (a, b) = ((*dst).src[0], (*dst).src[1]);
        let (na, nb) = (sys::ggml_nbytes(a), sys::ggml_nbytes(b));
        let (s0, s1) = thread_share(na + nb, ith, nth);
        let out = (*dst).data as *mut u8;
        if s0 < na {
            let end = s1.min(na);
            std::ptr::copy_nonoverlapping(((*a).data as *const u8).add(s0), out.add(s0), end - s0);
        }
        if s1 > na {
            let start = s0.max(na);
            std::ptr::copy_nonoverlapping(
                ((*b).data as *const u8).add(start - na),
                out.add(start),
                s1 - start,
            );
        }
    }
}

impl Context {
    /// `a` and `b` joined along dimension `dim` as two copies, when both are contiguous f32 and
    /// `dim` is their outermost (every dimension above it 1, the others equal: checked by
    /// [`Context::concat`], which calls this); `None` when they are not such tensors.
    pub(super) fn append<'a>(
        &'a self,
        a: Tensor<'a>,
        b: Tensor<'a>,
        dim: usize,
    ) -> Result<Option<Tensor<'a>>, GgmlError> {
        let (na, nb) = (a.ne(), b.ne());
        // SAFETY: the tensors are live; the contiguity tests read only their shapes and strides.
        let dense = unsafe {
            sys::ggml_is_contiguous(a.ptr.as_ptr()) && sys::ggml_is_contiguous(b.ptr.as_ptr())
        };
        if !dense
            || !a.is_type(GgmlType::F32)
            || !b.is_type(GgmlType::F32)
            || (dim + 1..4).any(|i| na[i] != 1 || nb[i] != 1)
        {
            return Ok(None);
        }
        let mut ne = na;
        ne[dim] += nb[dim];
        // SAFETY: the tensors are live, contiguous f32, and the output holds both.
        let t = unsafe { self.custom_f32(ne, &[a, b], append_trampoline, std::ptr::null_mut())? };
        Ok(Some(t))
    }
}

/// The largest tap count and dilation [`Context::conv_gemm`] takes: both travel in the op's
/// `userdata` word, 14 bits each, beside the epilogue's two flags.
const CONV_GEMM_MAX: usize = (1 << 14) - 1;
/// `userdata` flag of [`Context::conv_gemm_then`]: a bias is the node's next source.
const CONV_GEMM_BIAS: usize = 1 << 28;
/// `userdata` flag of [`Context::conv_gemm_then`]: a residual is the node's last source.
const CONV_GEMM_RESIDUAL: usize = 1 << 29;
/// `userdata` flag of [`Context::conv_gemm_by`]: a bf16 kernel runs on AVX-512 BF16 (else on
/// AMX tiles).
const CONV_GEMM_AVX512_BF16: usize = 1 << 30;

/// What [`Context::conv_gemm_then`] adds to the product's rows as each part is stored: the bias,
/// then the residual.
struct Epilogue {
    /// `bias_len` values; column `c` adds `bias[c % bias_len]`. Null: none.
    bias: *const f32,
    bias_len: usize,
    /// The contiguous rows of the residual, as many and as long as the output's. Null: none.
    residual: *const f32,
}

impl Epilogue {
    /// Adds the bias, then the residual, to rows `rows` and columns `cols` of `y` (rows of `n`),
    /// in place; nothing when there is neither.
    ///
    /// # Safety
    /// `y` holds those rows, the bias `bias_len` values and the residual rows as long as `y`'s;
    /// no one else writes them during the call.
    unsafe fn apply(
        &self,
        y: *mut f32,
        n: usize,
        rows: std::ops::Range<usize>,
        cols: std::ops::Range<usize>,
    ) {
        if self.bias.is_null() && self.residual.is_null() {
            return;
        }
        // SAFETY: `bias_len` values at `bias` when it is not null.
        let bias = (!self.bias.is_null())
            .then(|| unsafe { std::slice::from_raw_parts(self.bias, self.bias_len) });
        for t in rows {
            // SAFETY: the caller's contract; `cols` lies within the row.
            let out =
                unsafe { std::slice::from_raw_parts_mut(y.add(t * n + cols.start), cols.len()) };
            if let Some(bias) = bias {
                // Runs of columns that do not wrap around the bias.
                let (mut c, mut done) = (cols.start, 0);
                while done < out.len() {
                    let b = c % bias.len();
                    let run = (out.len() - done).min(bias.len() - b);
                    for (o, v) in out[done..done + run].iter_mut().zip(&bias[b..b + run]) {
                        *o += v;
                    }
                    (c, done) = (c + run, done + run);
                }
            }
            if !self.residual.is_null() {
                // SAFETY: the residual's row t, as long as `y`'s.
                let res = unsafe {
                    std::slice::from_raw_parts(self.residual.add(t * n + cols.start), out.len())
                };
                for (o, v) in out.iter_mut().zip(res) {
                    *o += v;
                }
            }
        }
    }
}

/// ggml's side of [`Context::conv_gemm`]: an f32 kernel splits the output rows over the graph's
/// threads, each thread one `sgemm` per tap (one in all when the taps are adjacent); a bf16 kernel
/// splits the 32 × 32 output blocks of [`bf16::conv`]. Each thread adds the epilogue to its own
/// rows or blocks.
unsafe extern "C" fn conv_gemm_trampoline(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    userdata: *mut std::os::raw::c_void,
) {
    let word = userdata as usize;
    let (taps, dilation) = ((word >> 14) & CONV_GEMM_MAX, word & CONV_GEMM_MAX);
    // SAFETY: `conv_gemm_then` built this node: its sources are the contiguous kernel
    // `[taps · c_in, c_out]` (f32, or bf16 packed by `bf16::pack` when a bf16 kernel is available and the
    // shape fits), the f32 input `[c_in, t_out + (taps − 1) · dilation]`, then, as the word's
    // flags say, the contiguous f32 bias (a length dividing `c_out`) and the contiguous f32
    // residual `[c_out, t_out]`; `dst` is a fresh contiguous f32 `[c_out, t_out]` (ggml never
    // computes a custom op in place), all allocated by the time ggml computes the node. Every
    // read stays inside the input: row `t + j · dilation` for `t < t_out` and `j < taps`, `c_in`
    // values long.
    unsafe {
        let (w, x) = ((*dst).src[0], (*dst).src[1]);
        let c_in = (*x).ne[0] as usize;
        let (c_out, t_out) = ((*dst).ne[0] as usize, (*dst).ne[1] as usize);
        let mut next = 2;
        let mut epilogue = Epilogue {
            bias: std::ptr::null(),
            bias_len: 1,
            residual: std::ptr::null(),
        };
        if word & CONV_GEMM_BIAS != 0 {
            let b = (*dst).src[next];
            (epilogue.bias, epilogue.bias_len) = ((*b).data as *const f32, (*b).ne[0] as usize);
            next += 1;
        }
        if word & CONV_GEMM_RESIDUAL != 0 {
            epilogue.residual = (*(*dst).src[next]).data as *const f32;
        }
        let y = (*dst).data as *mut f32;
        if (*w).type_ == sys::GGML_TYPE_BF16 {
            // `conv_gemm_by` built a bf16 node only with the kernel available.
            let kernel = if word & CONV_GEMM_AVX512_BF16 != 0 {
                bf16::Kernel::Avx512
            } else {
                bf16::Kernel::Amx
            };
            let s = bf16::Conv {
                c_in,
                taps,
                dilation,
                t_out,
                n: c_out,
            };
            bf16::conv(
                kernel,
                (*w).data as *const u16,
                (*x).data as *const f32,
                y,
                s,
                thread_share(bf16::blocks(t_out, c_out), ith, nth),
                |rows, cols| epilogue.apply(y, c_out, rows, cols),
            );
            return;
        }
        let (r0, r1) = thread_share(t_out, ith, nth);
        if r0 == r1 {
            return;
        }
        let xs = ((*x).data as *const f32).add(r0 * c_in);
        let ws = (*w).data as *const f32;
        let ys = y.add(r0 * c_out);
        let k = taps * c_in;
        // Row t of the product reads input rows t..t + taps (dilation 1): `taps · c_in`
        // consecutive values, so one product whose left rows overlap covers every tap.
        let per_tap = if dilation == 1 { taps } else { 1 };
        // A panic must not unwind into ggml; sgemm does not panic on these sizes, and a caught
        // one leaves the output rows unfinished.
        let _ = std::panic::catch_unwind(|| {
            for j in (0..taps).step_by(per_tap) {
                matrixmultiply::sgemm(
                    r1 - r0,
                    per_tap * c_in,
                    c_out,
                    1.0,
                    xs.add(j * dilation * c_in),
                    c_in as isize,
                    1,
                    ws.add(j * c_in),
                    1,
                    k as isize,
                    if j == 0 { 0.0 } else { 1.0 },
                    ys,
                    c_out as isize,
                    1,
                );
            }
        });
        epilogue.apply(y, c_out, r0..r1, 0..c_out);
    }
}

impl Context {
    /// The causal 1-D convolution of `x` (`[c_in, t]`, channels fastest, f32) by the kernel `w`
    /// (`[taps · c_in, c_out]`, f32, index `c + c_in · j` for channel `c` and tap `j`) with
    /// `dilation`, unpadded: `[c_out, t − (taps − 1) · dilation]`. With one tap it is
    /// `mul_mat(w, x)`. Computed by `matrixmultiply`'s packed sgemm instead of ggml's `im2col`
    /// and `mul_mat`; each output value sums its products in the same order whatever the row
    /// count and thread count, so results do not depend on how a signal is chunked.
    ///
    /// A bf16 kernel (`[taps · c_in, c_out]` packed by [`bf16::pack`], where the process's tier
    /// has a [`bf16::Kernel`] and [`bf16::fits`]`(c_in, c_out)`) is computed by that kernel (AMX
    /// tiles or AVX-512 BF16 dot products) from a bf16 copy of the input:
    /// not exact (bf16 keeps 8 significant bits), also independent of the chunking.
    pub fn conv_gemm<'a>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        taps: usize,
        dilation: usize,
    ) -> Result<Tensor<'a>, GgmlError> {
        self.conv_gemm_then(w, x, taps, dilation, None, None)
    }

    /// [`Context::conv_gemm`], then `+ bias` (contiguous f32 of a length `b` dividing `c_out`:
    /// column `c` adds `bias[c % b]`) and `+ residual` (contiguous f32 `[c_out, t_out]`), without
    /// ggml's two passes over the output: they are added to each part of the output (a thread's
    /// rows, or an AMX block) as it is stored, while it is in cache. The same values, bit for
    /// bit, as the product followed by ggml's `add` of the bias and then of the residual.
    pub fn conv_gemm_then<'a>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        taps: usize,
        dilation: usize,
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        self.conv_gemm_by(bf16::Kernel::active(), w, x, taps, dilation, bias, residual)
    }

    /// [`Context::conv_gemm_then`] with a bf16 weight computed by `kernel` (the benches' and
    /// tests' way to compare the bf16 kernels in one process; `conv_gemm_then` takes the
    /// process's tier's). An f32 weight ignores `kernel`.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_gemm_by<'a>(
        &'a self,
        kernel: Option<bf16::Kernel>,
        w: Tensor<'a>,
        x: Tensor<'a>,
        taps: usize,
        dilation: usize,
        bias: Option<Tensor<'a>>,
        residual: Option<Tensor<'a>>,
    ) -> Result<Tensor<'a>, GgmlError> {
        let bf16 = w.is_type(GgmlType::BF16);
        if bf16 {
            // SAFETY: the tensor is live; the contiguity test reads only its shape and strides.
            let dense = unsafe { sys::ggml_is_contiguous(w.ptr.as_ptr()) };
            let usable = kernel.is_some_and(bf16::Kernel::available);
            if !usable || !dense || !bf16::fits(x.ne()[0], w.ne()[1]) {
                return Err(GgmlError::Shape {
                    what: "conv_gemm bf16 kernel",
                    expected: "a contiguous kernel packed by bf16::pack, c_in a multiple of 32, \
                               c_out of 32, on a kernel tier with AMX-BF16 or AVX-512 BF16 (else \
                               an f32 kernel)"
                        .into(),
                    found: format!(
                        "kernel {:?}, contiguous {dense}, input {:?}, bf16 kernel {kernel:?}",
                        w.ne(),
                        x.ne(),
                    ),
                });
            }
        } else {
            Self::dense_f32("conv_gemm kernel", w)?;
        }
        Self::dense_f32("conv_gemm input", x)?;
        let (nw, nx) = (w.ne(), x.ne());
        let span = taps.saturating_sub(1) * dilation;
        if taps == 0
            || dilation == 0
            || taps > CONV_GEMM_MAX
            || dilation > CONV_GEMM_MAX
            || nw[0] != taps * nx[0]
            || nw[2] != 1
            || nw[3] != 1
            || nx[2] != 1
            || nx[3] != 1
            || nx[1] <= span
        {
            return Err(GgmlError::Shape {
                what: "conv_gemm",
                expected: format!(
                    "kernel [{taps} · c_in, c_out], input [c_in, t > {span}], \
                     1 <= taps, dilation <= {CONV_GEMM_MAX}"
                ),
                found: format!("kernel {nw:?}, input {nx:?}, taps {taps}, dilation {dilation}"),
            });
        }
        let (c_out, t_out) = (nw[1], nx[1] - span);
        let mut args = vec![w, x];
        let mut word = (taps << 14) | dilation;
        if w.is_type(GgmlType::BF16) && kernel == Some(bf16::Kernel::Avx512) {
            word |= CONV_GEMM_AVX512_BF16;
        }
        if let Some(b) = bias {
            Self::dense_f32("conv_gemm bias", b)?;
            let len = b.n_elems();
            if len == 0 || c_out % len != 0 {
                return Err(GgmlError::Shape {
                    what: "conv_gemm bias",
                    expected: format!("a length dividing the {c_out} output columns"),
                    found: format!("{:?}", b.ne()),
                });
            }
            args.push(b);
            word |= CONV_GEMM_BIAS;
        }
        if let Some(r) = residual {
            Self::dense_f32("conv_gemm residual", r)?;
            if r.n_elems() != c_out * t_out {
                return Err(GgmlError::Shape {
                    what: "conv_gemm residual",
                    expected: format!("{c_out} × {t_out} values, as the product"),
                    found: format!("{:?}", r.ne()),
                });
            }
            args.push(r);
            word |= CONV_GEMM_RESIDUAL;
        }
        // SAFETY: the tensors are live, contiguous f32 and shaped as the trampoline expects
        // (checked above); the word's flags name the sources after the first two.
        unsafe {
            self.custom_f32(
                [c_out, t_out, 1, 1],
                &args,
                conv_gemm_trampoline,
                word as *mut std::os::raw::c_void,
            )
        }
    }
}

/// ggml's side of [`Context::map_mat_in`]: splits the weight rows over the graph's threads in
/// whole groups of `G` rows.
unsafe extern "C" fn map_mat_trampoline<const G: usize>(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    userdata: *mut std::os::raw::c_void,
) {
    // SAFETY: `map_mat` built this node: `userdata` is a `MatKernel`, source 0 the weights
    // (`ne[1]` rows of `nb[1]` bytes), source 1 the contiguous f32 input `[k, m]`, `dst` a fresh
    // contiguous f32 `[n, m]`; the rows given to the kernel are this thread's share.
    unsafe {
        let kernel = std::mem::transmute::<*mut std::os::raw::c_void, MatKernel>(userdata);
        let (w, x) = ((*dst).src[0], (*dst).src[1]);
        let (k, n, m) = (
            (*w).ne[0] as usize,
            (*w).ne[1] as usize,
            (*x).ne[1] as usize,
        );
        let row_bytes = (*w).nb[1];
        let (g0, g1) = thread_share(n / G, ith, nth);
        let (r0, r1) = (g0 * G, g1 * G);
        if r0 == r1 {
            return;
        }
        let wp = ((*w).data as *const u8).add(r0 * row_bytes);
        let yp = ((*dst).data as *mut f32).add(r0);
        // `map_mat_with`'s parameters [flags, eps bits]; sources 2.. are the norm's weights
        // (flag 1), then the residual (flag 2).
        let p = extra_params(dst);
        let (flags, eps) = (p[0], f32::from_bits(p[1] as u32));
        let mut next = 2;
        let mut source = |on: bool| {
            on.then(|| {
                next += 1;
                (*(*dst).src[next - 1]).data as *const f32
            })
        };
        let (norm, residual) = (source(flags & 1 != 0), source(flags & 2 != 0));
        let x = std::slice::from_raw_parts((*x).data as *const f32, k * m);
        // A panic must not unwind into ggml; a caught one leaves the rows unfinished.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match norm {
            Some(g) => NORMED.with_borrow_mut(|xn| {
                rms_norm_rows(x, std::slice::from_raw_parts(g, k), eps, xn);
                kernel(wp, row_bytes, r1 - r0, k, xn.as_ptr(), m, yp, n)
            }),
            None => kernel(wp, row_bytes, r1 - r0, k, x.as_ptr(), m, yp, n),
        }));
        if let Some(res) = residual {
            for j in 0..m {
                for r in r0..r1 {
                    *(*dst).data.cast::<f32>().add(j * n + r) += *res.add(j * n + r);
                }
            }
        }
    }
}

std::thread_local! {
    /// [`map_mat_trampoline`]'s normed input, per thread (grows to the largest input, once).
    static NORMED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Each row of `x` (rows of `g.len()` values) RMS-normed and times `g`, into `out` (resized).
fn rms_norm_rows(x: &[f32], g: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    for (row, o) in x.chunks_exact(g.len()).zip(out.chunks_exact_mut(g.len())) {
        rms_norm_row(row, g, eps, o);
    }
}

/// `row` RMS-normed and times `g`, into `out`, as ggml's `rms_norm` then `mul` compute it (the
/// sum of squares in f64): the norm the Rust kernels fold into their nodes.
pub(crate) fn rms_norm_row(row: &[f32], g: &[f32], eps: f32, out: &mut [f32]) {
    let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
    let scale = 1.0 / ((sum / row.len() as f64) as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(row).zip(g) {
        *o = v * scale * w;
    }
}

impl Context {
    /// Writes row `i` of `src` (f32 `[n, rows]`) into row `idx[i]` of `dst` (f32, f16 or q8_0
    /// `[n, dst_rows]`, rows contiguous) when the graph runs; `idx` is an i32 tensor of `rows`
    /// values, each below `dst_rows` when the graph runs (ggml aborts otherwise). Returns the
    /// write's node (a view of `dst`).
    pub fn set_rows<'a>(
        &'a self,
        dst: Tensor<'a>,
        src: Tensor<'a>,
        idx: Tensor<'a>,
    ) -> Result<Tensor<'a>, GgmlError> {
        let (nd, ns, ni) = (dst.ne(), src.ne(), idx.ne());
        // SAFETY: the tensors are live; these read their type fields and shapes.
        let (dst_ok, src_ok, idx_ok) = unsafe {
            let ty = |t: Tensor<'_>| (*t.ptr.as_ptr()).type_;
            (
                [sys::GGML_TYPE_F32, sys::GGML_TYPE_F16, sys::GGML_TYPE_Q8_0].contains(&ty(dst))
                    && sys::ggml_is_contiguous_rows(dst.ptr.as_ptr()),
                ty(src) == sys::GGML_TYPE_F32 && sys::ggml_is_contiguous_rows(src.ptr.as_ptr()),
                ty(idx) == sys::GGML_TYPE_I32,
            )
        };
        if !(dst_ok && src_ok && idx_ok)
            || nd[0] != ns[0]
            || ns[1] != ni[0]
            || nd[2..] != [1, 1]
            || ns[2..] != [1, 1]
            || ni[1..] != [1, 1, 1]
        {
            return Err(GgmlError::Shape {
                what: "set_rows",
                expected: "f32/f16/q8_0 dst [n, rows] (n whole q8_0 blocks), f32 src [n, k], i32 \
                           indices [k]"
                    .into(),
                found: format!(
                    "dst {nd:?} (ok {dst_ok}), src {ns:?} (ok {src_ok}), indices {ni:?} (ok {idx_ok})"
                ),
            });
        }
        // SAFETY: types and shapes checked above.
        self.op(0, |c| unsafe {
            sys::ggml_set_rows(c, dst.ptr.as_ptr(), src.ptr.as_ptr(), idx.ptr.as_ptr())
        })
    }

    /// `mul_mat(w, x)` computed by `kernel` instead of ggml: `w` is `[k, n]` in any type whose
    /// rows the kernel reads (it is given the raw rows), `x` the contiguous f32 `[k, m]`; the
    /// result is `[n, m]`, the weight rows split over the graph's threads.
    pub fn map_mat<'a>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        kernel: MatKernel,
    ) -> Result<Tensor<'a>, GgmlError> {
        self.map_mat_in::<1>(w, x, kernel)
    }

    /// As [`Context::map_mat`], for a kernel that reads the rows in groups of `G` (packed
    /// together): each thread gets whole groups, `kernel` is called with `w` at a group's start
    /// and `n` a multiple of `G`, which the weights' row count must be.
    pub fn map_mat_in<'a, const G: usize>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        kernel: MatKernel,
    ) -> Result<Tensor<'a>, GgmlError> {
        self.map_mat_with::<G>(w, x, None, None, kernel)
    }

    /// As [`Context::map_mat_in`], with the ops around a layer's product folded into its node:
    /// `norm = Some((g, eps))` multiplies `rms_norm(x, eps) · g` (each thread norms the input
    /// rows it reads, as ggml's `rms_norm` and `mul` would), and `residual` (f32, the output's
    /// shape) is added to each output as it is stored. One graph node where there were up to
    /// four.
    pub fn map_mat_with<'a, const G: usize>(
        &'a self,
        w: Tensor<'a>,
        x: Tensor<'a>,
        norm: Option<(Tensor<'a>, f32)>,
        residual: Option<Tensor<'a>>,
        kernel: MatKernel,
    ) -> Result<Tensor<'a>, GgmlError> {
        Self::dense_f32("map_mat input", x)?;
        let mut args = vec![w, x];
        let flags = i32::from(norm.is_some()) | (i32::from(residual.is_some()) << 1);
        let eps = norm.map_or(0.0, |(_, e)| e);
        if let Some((g, _)) = norm {
            Self::dense_f32("map_mat norm", g)?;
            if g.n_elems() != x.ne()[0] {
                return Err(GgmlError::Shape {
                    what: "map_mat norm",
                    expected: format!("{} weights", x.ne()[0]),
                    found: format!("{:?}", g.ne()),
                });
            }
            args.push(g);
        }
        if let Some(r) = residual {
            Self::dense_f32("map_mat residual", r)?;
            if r.ne()[..2] != [w.ne()[1], x.ne()[1]] {
                return Err(GgmlError::Shape {
                    what: "map_mat residual",
                    expected: format!("[{}, {}]", w.ne()[1], x.ne()[1]),
                    found: format!("{:?}", r.ne()),
                });
            }
            args.push(r);
        }
        let (nw, nx) = (w.ne(), x.ne());
        // SAFETY: the tensor is live; contiguity reads its shape and strides.
        let dense = unsafe { sys::ggml_is_contiguous(w.ptr.as_ptr()) };
        if !dense
            || nw[0] != nx[0]
            || nw[2] != 1
            || nw[3] != 1
            || nx[2] != 1
            || nx[3] != 1
            || G == 0
            || !nw[1].is_multiple_of(G)
        {
            return Err(GgmlError::Shape {
                what: "map_mat",
                expected: format!(
                    "contiguous 2-D weights [k, n] (n a multiple of {G}) and input [k, m]"
                ),
                found: format!("weights {nw:?} (contiguous {dense}), input {nx:?}"),
            });
        }
        // SAFETY: the tensors are live and shaped as the trampoline expects (checked above); the
        // kernel is a plain function pointer, valid for the program's life.
        let y = unsafe {
            self.custom_f32(
                [nw[1], nx[1], 1, 1],
                &args,
                map_mat_trampoline::<G>,
                kernel as *mut std::os::raw::c_void,
            )
        }?;
        set_extra_params(y, &[flags, eps.to_bits() as i32]);
        Ok(y)
    }
}

/// One row's attention, for [`Context::attend_one`]: what the kernel reads and writes, as ggml
/// holds it when the graph runs.
#[derive(Debug, Clone, Copy)]
pub struct AttendOne {
    /// The row's joined product `[q (n_head heads), k (n_head_kv), v (n_head_kv)]`, `head_dim`
    /// values a head.
    pub qkv: *const f32,
    /// The per-head RMSNorm weights of queries and keys (`head_dim` each).
    pub q_norm: *const f32,
    /// See `q_norm`.
    pub k_norm: *const f32,
    /// Keys by position, `[head_dim, n_head_kv, n_ctx]`.
    pub k_cache: *mut f32,
    /// Values transposed, `[n_ctx, head_dim · n_head_kv]`.
    pub v_cache: *mut f32,
    /// The output, `head_dim · n_head` values.
    pub out: *mut f32,
    /// Positions the caches hold.
    pub n_ctx: usize,
    /// The row's position: keys and values are written there, positions `0..=pos` attended.
    pub pos: usize,
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

/// The kernel of [`Context::attend_one`]: query heads `h0..h1` of `a` (whole key/value groups),
/// on one thread of the graph, which writes those groups' key and value at `a.pos` and reads
/// no other group's entries.
///
/// # Safety
/// The pointers of `a` are valid for the shapes it names, and no two calls of one node take
/// the same groups.
pub type AttendKernel = unsafe fn(a: &AttendOne, h0: usize, h1: usize);

/// ggml's side of [`Context::attend_one`]: splits the query heads over the graph's threads.
unsafe extern "C" fn attend_one_trampoline(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    userdata: *mut std::os::raw::c_void,
) {
    // SAFETY: `attend_one` built this node: `userdata` is an `AttendKernel`, sources 0-4 are
    // the joined product, the two norm weights and the two f32 caches, its extra parameters
    // the geometry, all shaped as `attend_one` checked; each thread gets whole key/value groups,
    // so a group's cache entries are written and read by one thread only.
    unsafe {
        let kernel = std::mem::transmute::<*mut std::os::raw::c_void, AttendKernel>(userdata);
        let src = |i: usize| (*dst).src[i];
        let p = extra_params(dst);
        let (n_head, n_head_kv, head_dim) = (p[0] as usize, p[1] as usize, p[2] as usize);
        let a = AttendOne {
            qkv: (*src(0)).data as *const f32,
            q_norm: (*src(1)).data as *const f32,
            k_norm: (*src(2)).data as *const f32,
            k_cache: (*src(3)).data as *mut f32,
            v_cache: (*src(4)).data as *mut f32,
            out: (*dst).data as *mut f32,
            n_ctx: (*src(3)).ne[2] as usize,
            pos: p[3] as usize,
            n_head,
            n_head_kv,
            head_dim,
            eps: f32::from_bits(p[4] as u32),
            theta: f32::from_bits(p[5] as u32),
        };
        // Whole groups of query heads per thread, so each key/value head has one writer.
        let group = n_head / n_head_kv;
        let (g0, g1) = thread_share(n_head_kv, ith, nth);
        if g0 == g1 {
            return;
        }
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            kernel(&a, g0 * group, g1 * group)
        }));
    }
}

impl Context {
    /// One row's attention at position `pos` in one graph node: the row's queries and keys
    /// RMS-normed per head and NeoX-roped, its key and value written into the caches at `pos`,
    /// and each query head's softmax-weighted sum of the values of positions `0..=pos` (scaled
    /// by `1/√head_dim`), computed by `kernel` over whole key/value heads per thread. `qkv` is
    /// the row's contiguous f32 `[q, k, v]` (`head_dim · (n_head + 2 n_head_kv)` values), the
    /// caches f32 as `qwen3::Kv::Cache` lays them out. Returns `[head_dim · n_head, 1]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_one<'a>(
        &'a self,
        qkv: Tensor<'a>,
        norms: [Tensor<'a>; 2],
        caches: [Tensor<'a>; 2],
        pos: usize,
        heads: [usize; 3],
        eps: f32,
        theta: f32,
        kernel: AttendKernel,
    ) -> Result<Tensor<'a>, GgmlError> {
        let [n_head, n_head_kv, head_dim] = heads;
        for t in [qkv, norms[0], norms[1], caches[0], caches[1]] {
            Self::dense_f32("attend_one", t)?;
        }
        let (k, v) = (caches[0].ne(), caches[1].ne());
        let ok = n_head_kv > 0
            && head_dim > 0
            && head_dim.is_multiple_of(2)
            && n_head.is_multiple_of(n_head_kv)
            && qkv.n_elems() == head_dim * (n_head + 2 * n_head_kv)
            && norms.iter().all(|t| t.n_elems() == head_dim)
            && k[..3] == [head_dim, n_head_kv, k[2]]
            && v[..2] == [k[2], head_dim * n_head_kv]
            && pos < k[2];
        if !ok {
            return Err(GgmlError::Shape {
                what: "attend_one",
                expected: format!(
                    "a row of {} values, norms of {head_dim}, caches [{head_dim}, {n_head_kv}, n] \
                     and [n, {}] with n > {pos}",
                    head_dim * (n_head + 2 * n_head_kv),
                    head_dim * n_head_kv
                ),
                found: format!(
                    "row {:?}, norms {:?} {:?}, caches {k:?} {v:?}",
                    qkv.ne(),
                    norms[0].ne(),
                    norms[1].ne()
                ),
            });
        }
        // SAFETY: the tensors are live, contiguous f32 and shaped as the trampoline reads them
        // (checked above); the kernel is a plain function pointer.
        let y = unsafe {
            self.custom_f32(
                [head_dim * n_head, 1, 1, 1],
                &[qkv, norms[0], norms[1], caches[0], caches[1]],
                attend_one_trampoline,
                kernel as *mut std::os::raw::c_void,
            )
        }?;
        set_extra_params(
            y,
            &[
                n_head as i32,
                n_head_kv as i32,
                head_dim as i32,
                pos as i32,
                eps.to_bits() as i32,
                theta.to_bits() as i32,
            ],
        );
        Ok(y)
    }
}

use attend::{MAX_GROUP, Q8_0_BLOCK};

impl Context {
    /// One row's attention over q8_0 caches, in one node: the query heads `q` (f32
    /// `[head_dim, n_head, 1]`, normed and roped) over positions `0..=pos[0]` of the key and
    /// value caches (`[head_dim · n_head_kv, n_ctx]`, q8_0, one position a row, as
    /// [`Context::flash_attn_cache`] reads them), scores scaled by `scale`. Each thread takes
    /// whole key/value heads and reads each key and value row once for all the query heads it
    /// serves (ggml's flash attention reads them once per query head), in AVX-512 where the CPU
    /// has it (BW), else in a scalar twin. The queries are rounded to q8_0 first, as ggml's
    /// flash attention rounds them, so that a step agrees with a prefill's attention within
    /// float rounding. `pos` is an i32 tensor of one value, read when the graph runs (clamped to
    /// the cache). Returns `[head_dim · n_head, 1]`.
    pub fn attend_q8_row<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        pos: Tensor<'a>,
        n_head_kv: usize,
        scale: f32,
    ) -> Result<Tensor<'a>, GgmlError> {
        let [hd, nh, rows, q3] = q.ne();
        let [width, _, k2, k3] = k.ne();
        // SAFETY: the tensors are live; these read their strides and types.
        let dense = unsafe {
            sys::ggml_is_contiguous(q.ptr.as_ptr()) && sys::ggml_is_contiguous(k.ptr.as_ptr())
        };
        let ok = dense
            && q.is_type(GgmlType::F32)
            && [rows, q3] == [1, 1]
            && k.is_type(GgmlType::Q8_0)
            && v.is_type(GgmlType::Q8_0)
            && v.ne() == k.ne()
            && [k2, k3] == [1, 1]
            && hd > 0
            && hd.is_multiple_of(32)
            && hd <= attend::MAX_HEAD_DIM
            && n_head_kv > 0
            && nh.is_multiple_of(n_head_kv)
            && nh / n_head_kv <= MAX_GROUP
            && width == hd * n_head_kv
            && pos.is_type(GgmlType::I32)
            && pos.n_elems() == 1;
        if !ok {
            return Err(GgmlError::Shape {
                what: "attend_q8_row",
                expected: format!(
                    "contiguous f32 q [d, heads, 1] with d a multiple of 32 up to {}, and at \
                     most {MAX_GROUP} heads per key head, q8_0 caches [d · {n_head_kv}, n_ctx], one \
                     i32 position",
                    attend::MAX_HEAD_DIM
                ),
                found: format!(
                    "q {:?}, k {:?}, v {:?}, position {:?}",
                    q.ne(),
                    k.ne(),
                    v.ne(),
                    pos.ne()
                ),
            });
        }
        // SAFETY: the sources are live and shaped as the trampoline reads them (checked above).
        let y = unsafe {
            self.custom_f32(
                [hd * nh, 1, 1, 1],
                &[q, k, v, pos],
                attend_q8_trampoline,
                std::ptr::null_mut(),
            )
        }?;
        set_extra_params(y, &[nh as i32, n_head_kv as i32, scale.to_bits() as i32]);
        Ok(y)
    }
}

/// ggml's side of [`Context::attend_q8_row`]: splits the key/value heads over the threads.
unsafe extern "C" fn attend_q8_trampoline(
    dst: *mut sys::ggml_tensor,
    ith: std::os::raw::c_int,
    nth: std::os::raw::c_int,
    _userdata: *mut std::os::raw::c_void,
) {
    // SAFETY: `attend_q8_row` built this node: sources are the contiguous f32 queries
    // `[d, n_head]`, the q8_0 caches `[d · n_head_kv, n_ctx]` (whole rows of `nb[1]` bytes) and
    // one i32 position; `dst` is `[d · n_head]` f32. Each thread writes only its own heads'
    // outputs, and reads cache rows below the clamped position.
    unsafe {
        let p = extra_params(dst);
        let (nh, nkv, scale) = (p[0] as usize, p[1] as usize, f32::from_bits(p[2] as u32));
        let (q, k, v, pos) = ((*dst).src[0], (*dst).src[1], (*dst).src[2], (*dst).src[3]);
        let hd = (*q).ne[0] as usize;
        let (row, n_ctx) = ((*k).nb[1], (*k).ne[1] as usize);
        let n = (*((*pos).data as *const i32)).clamp(0, n_ctx as i32 - 1) as usize + 1;
        let q = std::slice::from_raw_parts((*q).data as *const f32, hd * nh);
        let out = std::slice::from_raw_parts_mut((*dst).data as *mut f32, hd * nh);
        let group = nh / nkv;
        let (g0, g1) = thread_share(nkv, ith, nth);
        let caches = ((*k).data as *const u8, (*v).data as *const u8);
        let kernel = attend::kernel(crate::kernels::caps());
        SCORES.with_borrow_mut(|scores| {
            for g in g0..g1 {
                let heads = g * group * hd..(g + 1) * group * hd;
                let at = g * (hd / 32) * Q8_0_BLOCK;
                // The group's queries rounded to q8_0, as ggml's flash attention rounds them.
                let Ok(qb) = super::quantize(GgmlType::Q8_0, &q[heads.clone()], hd) else {
                    return;
                };
                kernel(
                    &qb,
                    hd,
                    (caches.0.add(at), caches.1.add(at)),
                    row,
                    n,
                    scale,
                    scores,
                    &mut out[heads],
                );
            }
        });
    }
}

std::thread_local! {
    /// [`Context::attend_q8_row`]'s scores, per thread (grows to the longest attention, once).
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}
