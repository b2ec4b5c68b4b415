//! One row's attention as one node: the f32 kernel of the model code, and the q8_0 row kernel of
//! `crate::kernels::attend`.

use super::{extra_params, set_extra_params, thread_share};
use crate::ffi::{sys, Context, GgmlError, Tensor};
use crate::gguf::GgmlType;
use crate::kernels::attend;

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
///
/// # Safety
/// Called by ggml only, on every thread of the graph computing the node this module built: `dst`
/// is that node, its sources and `userdata` are what the builder put there, and thread `ith` of
/// `nth` writes only its own share of `dst`.
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
///
/// # Safety
/// Called by ggml only, on every thread of the graph computing the node this module built: `dst`
/// is that node, its sources and `userdata` are what the builder put there, and thread `ith` of
/// `nth` writes only its own share of `dst`.
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
                let Ok(qb) = crate::ffi::quantize(GgmlType::Q8_0, &q[heads.clone()], hd) else {
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
