//! Matrix products of the quantized layer kernels (`crate::kernels::quant`) as graph nodes, with
//! the RMS norm of their input fused.

use super::{extra_params, set_extra_params, thread_share};
use crate::ffi::{sys, Context, GgmlError, Tensor};
use crate::kernels::MatKernel;

/// ggml's side of [`Context::map_mat_in`]: splits the weight rows over the graph's threads in
/// whole groups of `G` rows.
///
/// # Safety
/// Called by ggml only, on every thread of the graph computing the node this module built: `dst`
/// is that node, its sources and `userdata` are what the builder put there, and thread `ith` of
/// `nth` writes only its own share of `dst`.
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
