//! A ggml context: the memory of its tensors, and the tensors and ops built in it (the ops of
//! ggml itself; the host kernels ggml calls back are in `ops`).

use super::sys;
use std::ffi::CString;
use std::ptr::NonNull;

use super::graph::Graph;
use super::install_logging;
use super::GgmlError;

/// A ggml context that owns the memory of its tensors (weights, inputs and activations).
#[derive(Debug)]
pub struct Context {
    pub(super) ptr: NonNull<sys::ggml_context>,
    /// Tensors get no data here (a graph allocator places them later).
    pub(super) no_alloc: bool,
}

// SAFETY: the context is used by one thread at a time (not Sync).
unsafe impl Send for Context {}

/// A context that graphs read (weights, caches, a stream's state): shared by its owner and every
/// [`OwnedGraph`](super::OwnedGraph) built over it, and freed when the last of them drops, so no
/// graph outlives the tensors it reads. It gives the context by shared reference only (so it is
/// never reset under a graph), and stays on one thread (`Rc`), as the graphs do.
#[derive(Debug, Clone)]
pub struct SharedContext(std::rc::Rc<Held>);

#[derive(Debug)]
struct Held {
    ctx: Context,
    /// Bytes the context's tensors view in place ([`SharedContext::over_bytes`]).
    _bytes: Option<std::rc::Rc<Vec<u8>>>,
}

impl SharedContext {
    /// Shares `ctx`.
    pub fn new(ctx: Context) -> Self {
        SharedContext(std::rc::Rc::new(Held { ctx, _bytes: None }))
    }

    /// A context whose tensors are views of `bytes`, which it holds: `(name, type, shape,
    /// offset)` each, the tensor's bytes starting at `offset`. Refused when a view does not fit.
    pub fn over_bytes(
        bytes: std::rc::Rc<Vec<u8>>,
        views: &[(String, crate::gguf::GgmlType, Vec<usize>, usize)],
    ) -> Result<Self, GgmlError> {
        let ctx = Context::unallocated(views.len())?;
        for (name, ty, ne, offset) in views {
            let dims: Vec<u64> = ne.iter().map(|&d| d as u64).collect();
            let size = ty.nbytes(&dims).unwrap_or(u64::MAX) as usize;
            if offset.checked_add(size).is_none_or(|end| end > bytes.len()) {
                return Err(GgmlError::Shape {
                    what: "over_bytes",
                    expected: format!("{name}: {size} bytes from {offset}"),
                    found: format!("{} bytes in all", bytes.len()),
                });
            }
            // SAFETY: the bytes are inside `bytes` (checked above), which the returned context
            // holds for as long as it and every graph over it live; an `Rc<Vec<u8>>` shared with it
            // can no longer be written (`Rc::get_mut` fails while it is shared).
            let t =
                unsafe { ctx.tensor_over(*ty, ne, bytes.as_ptr().add(*offset).cast_mut(), size)? };
            t.set_name(name);
        }
        Ok(SharedContext(std::rc::Rc::new(Held {
            ctx,
            _bytes: Some(bytes),
        })))
    }
}

impl std::ops::Deref for SharedContext {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.0.ctx
    }
}

/// A tensor of a [`Context`]; valid while the context lives.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'ctx> {
    pub(super) ptr: NonNull<sys::ggml_tensor>,
    pub(super) _ctx: std::marker::PhantomData<&'ctx Context>,
}

impl Context {
    /// A context with `mem_bytes` of tensor and graph memory.
    pub fn new(mem_bytes: usize) -> Result<Self, GgmlError> {
        Self::with_alloc(mem_bytes, false)
    }

    pub(super) fn with_alloc(mem_bytes: usize, no_alloc: bool) -> Result<Self, GgmlError> {
        install_logging();
        let params = sys::ggml_init_params {
            mem_size: mem_bytes,
            mem_buffer: std::ptr::null_mut(),
            no_alloc,
        };
        // SAFETY: ggml_init allocates its own buffer of mem_size bytes (or returns null).
        let ptr = unsafe { sys::ggml_init(params) };
        NonNull::new(ptr)
            .map(|ptr| Context { ptr, no_alloc })
            .ok_or(GgmlError::Alloc {
                what: "ggml context",
                bytes: mem_bytes,
            })
    }

    pub(super) fn wrap(
        &self,
        p: *mut sys::ggml_tensor,
        bytes: usize,
    ) -> Result<Tensor<'_>, GgmlError> {
        NonNull::new(p)
            .map(|ptr| Tensor {
                ptr,
                _ctx: std::marker::PhantomData,
            })
            .ok_or(GgmlError::Alloc {
                what: "ggml tensor",
                bytes,
            })
    }

    pub(super) fn room(&self, bytes: usize) -> Result<(), GgmlError> {
        // SAFETY: the context is live.
        let free = unsafe {
            sys::ggml_get_mem_size(self.ptr.as_ptr()) - sys::ggml_used_mem(self.ptr.as_ptr())
        };
        // ggml aborts when a context runs out of memory; refuse before that.
        let bytes = if self.no_alloc { 0 } else { bytes };
        // SAFETY: pure function.
        let need = bytes + unsafe { sys::ggml_tensor_overhead() } + 64;
        if need > free {
            return Err(GgmlError::Alloc {
                what: "ggml tensor (context full)",
                bytes: need,
            });
        }
        Ok(())
    }

    /// A new f32 tensor of shape `ne` (ggml order, 1 to 4 dimensions), zeroed; in a graph-allocated
    /// context ([`OwnedGraph::build_allocated`](super::OwnedGraph::build_allocated)) it has no data until the graph is allocated.
    pub fn new_f32(&self, ne: &[usize]) -> Result<Tensor<'_>, GgmlError> {
        if ne.is_empty() || ne.len() > 4 || ne.contains(&0) {
            return Err(GgmlError::Shape {
                what: "tensor shape",
                expected: "1 to 4 non-zero dimensions".into(),
                found: format!("{ne:?}"),
            });
        }
        let bytes = ne.iter().product::<usize>() * 4;
        self.room(bytes)?;
        let ne64: Vec<i64> = ne.iter().map(|&x| x as i64).collect();
        // SAFETY: the context has room (checked above) and ne64 holds ne.len() dimensions.
        let p = unsafe {
            sys::ggml_new_tensor(
                self.ptr.as_ptr(),
                sys::GGML_TYPE_F32,
                ne64.len() as i32,
                ne64.as_ptr(),
            )
        };
        let t = self.wrap(p, bytes)?;
        if !self.no_alloc {
            t.write_f32(&vec![0.0; bytes / 4])?;
        }
        Ok(t)
    }

    /// `a · b` in ggml's convention: `a` is `[k, m]`, `b` is `[k, n]`, the result `[m, n]`.
    pub fn mul_mat<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        if a.ne()[0] != b.ne()[0] {
            return Err(GgmlError::Shape {
                what: "mul_mat",
                expected: format!("inner dimensions equal ({})", a.ne()[0]),
                found: format!("{}", b.ne()[0]),
            });
        }
        let bytes = a.ne()[1] * b.ne()[1] * 4;
        self.room(bytes)?;
        // SAFETY: both tensors belong to this live context and their shapes agree.
        let p = unsafe { sys::ggml_mul_mat(self.ptr.as_ptr(), a.ptr.as_ptr(), b.ptr.as_ptr()) };
        self.wrap(p, bytes)
    }

    /// `a + b`, with `b` broadcast over `a` (a bias vector over rows).
    pub fn add<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        let (na, nb) = (a.ne(), b.ne());
        if (0..4).any(|i| na[i] % nb[i] != 0) {
            return Err(GgmlError::Shape {
                what: "add",
                expected: format!("a shape that repeats into {na:?}"),
                found: format!("{nb:?}"),
            });
        }
        let bytes = na.iter().product::<usize>() * 4;
        self.room(bytes)?;
        // SAFETY: both tensors are live and b repeats into a (checked above).
        let p = unsafe { sys::ggml_add(self.ptr.as_ptr(), a.ptr.as_ptr(), b.ptr.as_ptr()) };
        self.wrap(p, bytes)
    }

    /// `x · sigmoid(x)`, elementwise.
    pub fn silu<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        let bytes = x.ne().iter().product::<usize>() * 4;
        self.room(bytes)?;
        // SAFETY: the tensor is live.
        let p = unsafe { sys::ggml_silu(self.ptr.as_ptr(), x.ptr.as_ptr()) };
        self.wrap(p, bytes)
    }

    /// A new tensor of ggml type `ty` (any type; data uninitialised), for weights copied in bytes.
    pub fn new_tensor(
        &self,
        ty: crate::gguf::GgmlType,
        ne: &[usize],
    ) -> Result<Tensor<'_>, GgmlError> {
        let ne64: Vec<u64> = ne.iter().map(|&x| x as u64).collect();
        let bytes = match ty.nbytes(&ne64) {
            Some(b) if !ne.is_empty() && ne.len() <= 4 && !ne.contains(&0) => b as usize,
            _ => {
                return Err(GgmlError::Shape {
                    what: "tensor shape",
                    expected: format!("1 to 4 non-zero dimensions, rows of whole {ty} blocks"),
                    found: format!("{ne:?}"),
                })
            }
        };
        self.room(bytes)?;
        let ne64: Vec<i64> = ne.iter().map(|&x| x as i64).collect();
        // SAFETY: the context has room, the shape is valid for the type (checked above).
        let p = unsafe {
            sys::ggml_new_tensor(
                self.ptr.as_ptr(),
                ty as u32 as sys::ggml_type,
                ne64.len() as i32,
                ne64.as_ptr(),
            )
        };
        self.wrap(p, bytes)
    }

    /// As [`Context::new_tensor`] for a type of one value per block (f32, f16, bf16), with its
    /// data at a multiple of `align` bytes (a power of two) where ggml places tensors at 16: a
    /// view into a tensor `align` bytes longer. For kernels that load whole cache lines (AMX
    /// tiles: a 64-byte tile row that straddles two lines costs two loads).
    pub fn new_tensor_aligned(
        &self,
        ty: crate::gguf::GgmlType,
        ne: &[usize],
        align: usize,
    ) -> Result<Tensor<'_>, GgmlError> {
        let es = ty.type_size() as usize;
        if self.no_alloc
            || ty.block_size() != 1
            || !align.is_power_of_two()
            || ne.is_empty()
            || ne.len() > 3
        {
            return Err(GgmlError::Shape {
                what: "aligned tensor",
                expected: "a type of one value per block, 1 to 3 dimensions, a power-of-two \
                           alignment, in a context that allocates"
                    .into(),
                found: format!("{ty}, shape {ne:?}, alignment {align}"),
            });
        }
        let n: usize = ne.iter().product();
        let base = self.new_tensor(ty, &[n + align.div_ceil(es)])?;
        // SAFETY: the tensor is live and has data (`new_tensor` on an allocating context).
        let addr = unsafe { sys::ggml_get_data(base.ptr.as_ptr()) } as usize;
        let offset = addr.next_multiple_of(align) - addr;
        let mut shape = [1; 3];
        shape[..ne.len()].copy_from_slice(ne);
        let nb = [es, es * shape[0], es * shape[0] * shape[1]];
        self.view(base, shape, nb, offset)
    }

    /// A context of at most `n_tensors` tensors that get no memory of their own: views of the
    /// caller's (see `SharedContext::over_bytes`).
    pub fn unallocated(n_tensors: usize) -> Result<Self, GgmlError> {
        // SAFETY: pure function.
        let per = unsafe { sys::ggml_tensor_overhead() } + 64;
        Self::with_alloc(n_tensors * per + 1024, true)
    }

    /// A tensor of type `ty` and shape `ne` whose data are the `len` bytes at `data`, in place
    /// (an [`Context::unallocated`] context's; refused elsewhere, or when `len` is not the
    /// tensor's size).
    ///
    /// # Safety
    /// The bytes stay valid, and nothing else writes them, for as long as a graph that uses the
    /// tensor may run.
    pub(super) unsafe fn tensor_over(
        &self,
        ty: crate::gguf::GgmlType,
        ne: &[usize],
        data: *mut u8,
        len: usize,
    ) -> Result<Tensor<'_>, GgmlError> {
        if !self.no_alloc {
            return Err(GgmlError::Shape {
                what: "tensor_over",
                expected: "a context without memory of its own (Context::unallocated)".into(),
                found: "an allocating context".into(),
            });
        }
        let t = self.new_tensor(ty, ne)?;
        if t.nbytes() != len || data.is_null() {
            return Err(GgmlError::Shape {
                what: "tensor_over",
                expected: format!("{} bytes for {ty} {ne:?}", t.nbytes()),
                found: format!("{len} bytes"),
            });
        }
        // SAFETY: the tensor is live and has no data of its own; the caller vouches for the
        // bytes, which are exactly its size.
        unsafe { (*t.ptr.as_ptr()).data = data.cast() };
        Ok(t)
    }

    /// A new i32 tensor of `n` values (row indices, positions).
    pub fn new_i32(&self, n: usize) -> Result<Tensor<'_>, GgmlError> {
        self.new_tensor(crate::gguf::GgmlType::I32, &[n])
    }

    pub(super) fn op<'a>(
        &'a self,
        out_elems: usize,
        f: impl FnOnce(*mut sys::ggml_context) -> *mut sys::ggml_tensor,
    ) -> Result<Tensor<'a>, GgmlError> {
        let bytes = out_elems * 4;
        self.room(bytes)?;
        self.wrap(f(self.ptr.as_ptr()), bytes)
    }

    pub(super) fn same_shape(
        what: &'static str,
        a: Tensor<'_>,
        b: Tensor<'_>,
    ) -> Result<(), GgmlError> {
        let (na, nb) = (a.ne(), b.ne());
        if (0..4).any(|i| na[i] % nb[i] != 0) {
            return Err(GgmlError::Shape {
                what,
                expected: format!("a shape that repeats into {na:?}"),
                found: format!("{nb:?}"),
            });
        }
        Ok(())
    }

    /// `a ⊙ b`, with `b` broadcast over `a`.
    pub fn mul<'a>(&'a self, a: Tensor<'a>, b: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        Self::same_shape("mul", a, b)?;
        // SAFETY: both tensors are live and b repeats into a.
        self.op(a.n_elems(), |c| unsafe {
            sys::ggml_mul(c, a.ptr.as_ptr(), b.ptr.as_ptr())
        })
    }

    /// `x / rms(x)` over dimension 0 (no weight), with `eps`.
    pub fn rms_norm<'a>(&'a self, x: Tensor<'a>, eps: f32) -> Result<Tensor<'a>, GgmlError> {
        // SAFETY: the tensor is live.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_rms_norm(c, x.ptr.as_ptr(), eps)
        })
    }

    /// `x · s`.
    pub fn scale<'a>(&'a self, x: Tensor<'a>, s: f32) -> Result<Tensor<'a>, GgmlError> {
        // SAFETY: the tensor is live.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_scale(c, x.ptr.as_ptr(), s)
        })
    }

    /// Rows `ids` (an i32 tensor) of matrix `a` (`[n, rows]`), dequantized to f32: `[n, len(ids)]`.
    pub fn get_rows<'a>(&'a self, a: Tensor<'a>, ids: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        // SAFETY: both tensors are live; ggml checks nothing more than types at build time, and ids
        // are checked in range by the callers before compute.
        self.op(a.ne()[0] * ids.n_elems(), |c| unsafe {
            sys::ggml_get_rows(c, a.ptr.as_ptr(), ids.ptr.as_ptr())
        })
    }

    /// NeoX rotary embedding of `x` (`[head_dim, heads, tokens]`) at positions `pos` (i32, one per
    /// token), over the first `n_dims` dimensions with base `theta`.
    pub fn rope_neox<'a>(
        &'a self,
        x: Tensor<'a>,
        pos: Tensor<'a>,
        n_dims: usize,
        theta: f32,
    ) -> Result<Tensor<'a>, GgmlError> {
        if pos.ne()[0] != x.ne()[2] || n_dims > x.ne()[0] || !n_dims.is_multiple_of(2) {
            return Err(GgmlError::Shape {
                what: "rope",
                expected: format!(
                    "{} positions and an even n_dims <= {}",
                    x.ne()[2],
                    x.ne()[0]
                ),
                found: format!("{} positions, n_dims {n_dims}", pos.ne()[0]),
            });
        }
        // SAFETY: shapes checked above; mode 2 is GGML_ROPE_TYPE_NEOX; no frequency factors.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_rope_ext(
                c,
                x.ptr.as_ptr(),
                pos.ptr.as_ptr(),
                std::ptr::null_mut(),
                n_dims as i32,
                2,
                0,
                theta,
                1.0,
                0.0,
                1.0,
                0.0,
                0.0,
            )
        })
    }

    /// `softmax(x · scale + mask)` over dimension 0; `mask` (f32, `[ne0, ne1]`) may be absent.
    pub fn soft_max<'a>(
        &'a self,
        x: Tensor<'a>,
        mask: Option<Tensor<'a>>,
        scale: f32,
    ) -> Result<Tensor<'a>, GgmlError> {
        if let Some(m) = mask {
            if m.ne()[0] != x.ne()[0] || m.ne()[1] < x.ne()[1] {
                return Err(GgmlError::Shape {
                    what: "soft_max mask",
                    expected: format!("[{}, >= {}]", x.ne()[0], x.ne()[1]),
                    found: format!("{:?}", m.ne()),
                });
            }
        }
        let m = mask.map_or(std::ptr::null_mut(), |m| m.ptr.as_ptr());
        // SAFETY: shapes checked above.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_soft_max_ext(c, x.ptr.as_ptr(), m, scale, 0.0)
        })
    }

    /// The attention of the query heads `q` (f32 `[head_dim, n_head, rows]`) over the first
    /// `n_kv` positions of the key and value caches `k` and `v` (`[head_dim · n_head_kv,
    /// n_ctx]`, one position a row, both f16 or both q8_0; `n_head_kv` divides `n_head`), with
    /// `mask` (f16 `[n_kv, rows]`: 0 where a row sees a key, −∞ where it does not; a masked key
    /// is skipped, not read) and `scale` on the scores, by ggml's flash attention: `[head_dim ·
    /// n_head, rows]`. Values are summed in f32 for q8_0, in f16 for f16 (ggml's CPU kernel).
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_cache<'a>(
        &'a self,
        q: Tensor<'a>,
        k: Tensor<'a>,
        v: Tensor<'a>,
        n_kv: usize,
        n_head_kv: usize,
        mask: Tensor<'a>,
        scale: f32,
    ) -> Result<Tensor<'a>, GgmlError> {
        use crate::gguf::GgmlType;
        let [hd, nh, rows, q3] = q.ne();
        let [width, n_ctx, k2, k3] = k.ne();
        let ty = [GgmlType::F16, GgmlType::Q8_0]
            .into_iter()
            .find(|&t| k.is_type(t) && v.is_type(t));
        let ok = q.is_type(GgmlType::F32)
            && q3 == 1
            && ty.is_some_and(|t| (hd as u64).is_multiple_of(t.block_size()))
            && v.ne() == k.ne()
            && [k2, k3] == [1, 1]
            && n_head_kv > 0
            && nh.is_multiple_of(n_head_kv)
            && width == hd * n_head_kv
            && (1..=n_ctx).contains(&n_kv)
            && mask.is_type(GgmlType::F16)
            && mask.ne() == [n_kv, rows, 1, 1]
            // SAFETY: the tensor is live; a pure query of its strides.
            && unsafe { sys::ggml_is_contiguous(mask.ptr.as_ptr()) };
        if !ok {
            return Err(GgmlError::Shape {
                what: "flash attention",
                expected: format!(
                    "f32 q [d, heads, rows], f16 or q8_0 caches [d · {n_head_kv}, n_ctx >= \
                     {n_kv}] with d whole blocks, an f16 mask [{n_kv}, rows]"
                ),
                found: format!(
                    "q {:?}, k {:?}, v {:?}, mask {:?}",
                    q.ne(),
                    k.ne(),
                    v.ne(),
                    mask.ne()
                ),
            });
        }
        // Whole blocks per head: a position's row is `n_head_kv` heads of equal bytes.
        let row = k.nbytes() / n_ctx;
        let head = row / n_head_kv;
        let view = |t: Tensor<'a>| {
            // SAFETY: the view lies inside the cache: n_kv positions of `row` bytes, `n_head_kv`
            // heads of `head` bytes each (checked above).
            self.op(0, |c| unsafe {
                sys::ggml_view_3d(
                    c,
                    t.ptr.as_ptr(),
                    hd as i64,
                    n_kv as i64,
                    n_head_kv as i64,
                    row,
                    head,
                    0,
                )
            })
        };
        let (kv, vv) = (view(k)?, view(v)?);
        let qp = self.permute(q, [0, 2, 1, 3])?;
        // SAFETY: the shapes satisfy ggml_flash_attn_ext's asserts (checked above: q's width is
        // the keys', its heads a multiple of theirs, the mask f16 and contiguous; q's permuted
        // view keeps each row contiguous).
        let out = self.op(hd * nh * rows, |c| unsafe {
            sys::ggml_flash_attn_ext(
                c,
                qp.ptr.as_ptr(),
                kv.ptr.as_ptr(),
                vv.ptr.as_ptr(),
                mask.ptr.as_ptr(),
                scale,
                0.0,
                0.0,
            )
        })?;
        self.reshape(out, [hd * nh, rows, 1])
    }

    /// A view of `x` with shape `ne` and byte strides `nb` (`nb[0]` is the element size) at byte
    /// `offset`; checked to stay inside `x`'s data.
    pub fn view<'a>(
        &'a self,
        x: Tensor<'a>,
        ne: [usize; 3],
        nb: [usize; 3],
        offset: usize,
    ) -> Result<Tensor<'a>, GgmlError> {
        let last = offset + (ne[0] - 1) * nb[0] + (ne[1] - 1) * nb[1] + (ne[2] - 1) * nb[2] + nb[0];
        if ne.contains(&0) || last > x.nbytes() {
            return Err(GgmlError::Shape {
                what: "view",
                expected: format!("a view inside {} bytes", x.nbytes()),
                found: format!("ne {ne:?}, nb {nb:?}, offset {offset}"),
            });
        }
        // SAFETY: the view lies inside x's data (checked above).
        self.op(0, |c| unsafe {
            sys::ggml_view_3d(
                c,
                x.ptr.as_ptr(),
                ne[0] as i64,
                ne[1] as i64,
                ne[2] as i64,
                nb[1],
                nb[2],
                offset,
            )
        })
    }

    /// `x` with shape `ne` (same element count; `x` contiguous).
    pub fn reshape<'a>(&'a self, x: Tensor<'a>, ne: [usize; 3]) -> Result<Tensor<'a>, GgmlError> {
        if ne.iter().product::<usize>() != x.n_elems() {
            return Err(GgmlError::Shape {
                what: "reshape",
                expected: format!("{} elements", x.n_elems()),
                found: format!("{ne:?}"),
            });
        }
        // SAFETY: element counts agree; ggml requires x contiguous, which callers ensure with cont.
        self.op(0, |c| unsafe {
            sys::ggml_reshape_3d(c, x.ptr.as_ptr(), ne[0] as i64, ne[1] as i64, ne[2] as i64)
        })
    }

    /// `x` with its axes permuted (ggml's convention: axis i of x goes to position `axes[i]`).
    pub fn permute<'a>(&'a self, x: Tensor<'a>, axes: [i32; 4]) -> Result<Tensor<'a>, GgmlError> {
        let mut seen = [false; 4];
        for &a in &axes {
            if !(0..4).contains(&a) || std::mem::replace(&mut seen[a as usize], true) {
                return Err(GgmlError::Shape {
                    what: "permute",
                    expected: "a permutation of 0..4".into(),
                    found: format!("{axes:?}"),
                });
            }
        }
        // SAFETY: a valid permutation.
        self.op(0, |c| unsafe {
            sys::ggml_permute(c, x.ptr.as_ptr(), axes[0], axes[1], axes[2], axes[3])
        })
    }

    /// A contiguous copy of `x`.
    pub fn cont<'a>(&'a self, x: Tensor<'a>) -> Result<Tensor<'a>, GgmlError> {
        // SAFETY: the tensor is live.
        self.op(x.n_elems(), |c| unsafe {
            sys::ggml_cont(c, x.ptr.as_ptr())
        })
    }

    /// Copies `src` into `dst` (same element count) when the graph runs; returns the copy node.
    pub fn copy_into<'a>(
        &'a self,
        src: Tensor<'a>,
        dst: Tensor<'a>,
    ) -> Result<Tensor<'a>, GgmlError> {
        if src.n_elems() != dst.n_elems() {
            return Err(GgmlError::Shape {
                what: "copy",
                expected: format!("{} elements", dst.n_elems()),
                found: format!("{}", src.n_elems()),
            });
        }
        // SAFETY: element counts agree.
        self.op(0, |c| unsafe {
            sys::ggml_cpy(c, src.ptr.as_ptr(), dst.ptr.as_ptr())
        })
    }

    /// `a` and `b` joined along dimension `dim` (their other dimensions equal). Contiguous f32
    /// tensors joined along their outermost dimension (the rows of a matrix, the last matrix of
    /// a stack) are two copies (`Context::append`); others go through ggml's `concat`, which
    /// computes every element's index.
    pub fn concat<'a>(
        &'a self,
        a: Tensor<'a>,
        b: Tensor<'a>,
        dim: usize,
    ) -> Result<Tensor<'a>, GgmlError> {
        let (na, nb) = (a.ne(), b.ne());
        if dim > 3 || (0..4).any(|i| i != dim && na[i] != nb[i]) {
            return Err(GgmlError::Shape {
                what: "concat",
                expected: format!("shapes equal but in dimension {dim}: {na:?}"),
                found: format!("{nb:?}"),
            });
        }
        if let Some(joined) = self.append(a, b, dim)? {
            return Ok(joined);
        }
        // SAFETY: shapes checked above.
        self.op(a.n_elems() + b.n_elems(), |c| unsafe {
            sys::ggml_concat(c, a.ptr.as_ptr(), b.ptr.as_ptr(), dim as i32)
        })
    }

    /// Matrix `i` of a stack of matrices `x` (`[ne0, ne1, n]`, any type) as a 2-D view.
    pub fn slice2d<'a>(&'a self, x: Tensor<'a>, i: usize) -> Result<Tensor<'a>, GgmlError> {
        let ne = x.ne();
        if i >= ne[2] || ne[3] != 1 {
            return Err(GgmlError::Shape {
                what: "slice2d",
                expected: format!("an index below {} of a 3-D stack", ne[2]),
                found: format!("index {i} of {ne:?}"),
            });
        }
        // SAFETY: the tensor is live; its strides describe its own data and slice i lies inside.
        let (nb1, nb2) = unsafe { ((*x.ptr.as_ptr()).nb[1], (*x.ptr.as_ptr()).nb[2]) };
        // SAFETY: the view covers exactly slice i (checked above).
        self.op(0, |c| unsafe {
            sys::ggml_view_2d(c, x.ptr.as_ptr(), ne[0] as i64, ne[1] as i64, nb1, i * nb2)
        })
    }

    /// The tensor of this context named `name`, if any.
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        let c = CString::new(name).ok()?;
        // SAFETY: the context is live; the name is NUL-terminated.
        let p = unsafe { sys::ggml_get_tensor(self.ptr.as_ptr(), c.as_ptr()) };
        NonNull::new(p).map(|ptr| Tensor {
            ptr,
            _ctx: std::marker::PhantomData,
        })
    }

    /// Frees every tensor and graph of the context at once (their handles must be gone: `&mut`).
    pub fn reset(&mut self) {
        // SAFETY: the context is live and no tensor borrows it (exclusive borrow).
        unsafe { sys::ggml_reset(self.ptr.as_ptr()) }
    }

    /// A graph whose output is `out`, with a reusable work buffer.
    pub fn graph<'a>(&'a self, out: Tensor<'a>) -> Result<Graph<'a>, GgmlError> {
        self.graph_of(&[out])
    }

    /// A graph computing all of `outs` (in order), with a reusable work buffer.
    pub fn graph_of<'a>(&'a self, outs: &[Tensor<'a>]) -> Result<Graph<'a>, GgmlError> {
        self.graph_of_nodes(outs, super::graph::GRAPH_NODES)
    }

    /// [`Context::graph_of`] with room for `nodes` nodes.
    pub fn graph_of_nodes<'a>(
        &'a self,
        outs: &[Tensor<'a>],
        nodes: usize,
    ) -> Result<Graph<'a>, GgmlError> {
        // SAFETY: the context is live; the graph is allocated in it (room checked by ggml's
        // overhead function first).
        let size = unsafe { sys::ggml_graph_overhead_custom(nodes, false) };
        self.room(size)?;
        // SAFETY: as above; `out` belongs to this context.
        let g = unsafe {
            let g = sys::ggml_new_graph_custom(self.ptr.as_ptr(), nodes, false);
            if !g.is_null() {
                for out in outs {
                    sys::ggml_build_forward_expand(g, out.ptr.as_ptr());
                }
            }
            g
        };
        let ptr = NonNull::new(g).ok_or(GgmlError::Alloc {
            what: "ggml graph",
            bytes: size,
        })?;
        Ok(Graph {
            ptr,
            work: Vec::new(),
            _ctx: std::marker::PhantomData,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_init and is freed once; tensors borrow the context.
        unsafe { sys::ggml_free(self.ptr.as_ptr()) }
    }
}
