//! Custom ops: host kernels that ggml calls back on every thread of a graph (`ggml_custom_4d`),
//! with this crate's parameters in the node. ggml's side of each is a trampoline that splits the
//! work over the threads and calls a kernel of `crate::kernels`.

mod attention;
mod conv_gemm;
mod map_mat;

pub use attention::{AttendKernel, AttendOne};
pub(crate) use map_mat::rms_norm_row;

use super::{sys, Context, GgmlError, Tensor};
use crate::gguf::GgmlType;

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
    pub(super) unsafe fn custom_f32<'a>(
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
///
/// # Safety
/// Called by ggml only, on every thread of the graph computing the node this module built: `dst`
/// is that node, its sources and `userdata` are what the builder put there, and thread `ith` of
/// `nth` writes only its own share of `dst`.
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
///
/// # Safety
/// Called by ggml only, on every thread of the graph computing the node this module built: `dst`
/// is that node, its sources and `userdata` are what the builder put there, and thread `ith` of
/// `nth` writes only its own share of `dst`.
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
///
/// # Safety
/// Called by ggml only, on every thread of the graph computing the node this module built: `dst`
/// is that node, its sources and `userdata` are what the builder put there, and thread `ith` of
/// `nth` writes only its own share of `dst`.
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
