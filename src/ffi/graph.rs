//! Computation graphs: one built over a borrowed context ([`Graph`]) and one that owns its
//! context ([`OwnedGraph`]), computed on a [`Threadpool`](super::Threadpool).

use super::sys;
use std::ffi::CStr;
use std::ptr::NonNull;

use super::context::Context;
use super::context::Tensor;
use super::tensor::Node;
use super::threadpool::Threadpool;
use super::GgmlError;

/// A computation graph of a [`Context`].
#[derive(Debug)]
pub struct Graph<'ctx> {
    pub(super) ptr: NonNull<sys::ggml_cgraph>,
    pub(super) work: Vec<u8>,
    pub(super) _ctx: std::marker::PhantomData<&'ctx Context>,
}

impl Graph<'_> {
    /// Computes the graph on `pool`; the work buffer grows once and is reused.
    pub fn compute(&mut self, pool: &Threadpool) -> Result<(), GgmlError> {
        let mut work = std::mem::take(&mut self.work);
        let r = self.compute_with(pool, &mut work);
        self.work = work;
        r
    }

    /// As [`Graph::compute`], with the caller's work buffer (grown as needed): for graphs built
    /// anew at every step in a reused context, so that the buffer outlives them.
    pub fn compute_with(&mut self, pool: &Threadpool, work: &mut Vec<u8>) -> Result<(), GgmlError> {
        // SAFETY: the graph is live for 'ctx.
        unsafe { compute_graph(self.ptr, pool, work) }
    }
}

/// Computes `graph` on `pool` (or the wider pool it borrows, see [`Threadpool::borrowing`]) with
/// `work` as ggml's work buffer, grown as needed.
///
/// # Safety
/// `graph` is a live graph whose tensors' memory stays allocated for the call.
pub(super) unsafe fn compute_graph(
    graph: NonNull<sys::ggml_cgraph>,
    pool: &Threadpool,
    work: &mut Vec<u8>,
) -> Result<(), GgmlError> {
    let lease = pool.lease();
    let pool = lease.pool;
    // SAFETY: the caller's graph and a live pool; the plan's work buffer points into `work`,
    // which is at least work_size bytes and outlives the compute call.
    let status = unsafe {
        let mut plan = sys::ggml_graph_plan(graph.as_ptr(), pool.n_threads() as i32, pool.as_ptr());
        if work.len() < plan.work_size {
            work.resize(plan.work_size, 0);
        }
        plan.work_data = work.as_mut_ptr();
        sys::ggml_graph_compute(graph.as_ptr(), &mut plan)
    };
    drop(lease);
    if status != sys::GGML_STATUS_SUCCESS {
        return Err(GgmlError::Compute { status });
    }
    Ok(())
}

/// A context and one graph over it, built once and computed many times.
///
/// Inputs and outputs are found by name ([`Tensor::set_name`]); the graph's tensors may read
/// tensors of other contexts (weights), which must outlive it: the caller keeps those contexts
/// next to this one and drops them after it.
#[derive(Debug)]
pub struct OwnedGraph {
    /// The graph allocator's buffer holding every tensor of `ctx`, when built with
    /// [`OwnedGraph::build_allocated`]; freed before `ctx`.
    pub(super) galloc: Option<NonNull<sys::ggml_gallocr>>,
    pub(super) ctx: Context,
    pub(super) graph: NonNull<sys::ggml_cgraph>,
    pub(super) work: Vec<u8>,
    /// The tensors named `in.*` and `out.*`, found once at build.
    pub(super) ports: Vec<(String, NonNull<sys::ggml_tensor>)>,
}

// SAFETY: the graph lives in the owned context; used by one thread at a time (not Sync).
unsafe impl Send for OwnedGraph {}

impl Drop for OwnedGraph {
    fn drop(&mut self) {
        if let Some(g) = self.galloc.take() {
            // SAFETY: made by ggml_gallocr_new and freed once; ctx (dropped after) only holds
            // tensor headers pointing into its buffer, which nothing reads after this.
            unsafe { sys::ggml_gallocr_free(g.as_ptr()) }
        }
    }
}

impl OwnedGraph {
    /// Bytes of the graph allocator's buffer (0 when built with [`OwnedGraph::build`]).
    pub fn buffer_bytes(&self) -> usize {
        match self.galloc {
            // SAFETY: the allocator is live.
            Some(g) => unsafe { sys::ggml_gallocr_get_buffer_size(g.as_ptr(), 0) },
            None => 0,
        }
    }
}

impl OwnedGraph {
    /// Builds a graph in a new context of `mem_bytes`: `build` returns the output nodes, which
    /// are computed in the order given (put cache writes before the nodes that read the cache).
    ///
    /// # Safety
    ///
    /// The graph may read tensors of other contexts (weights, caches). Every such context must
    /// outlive the returned `OwnedGraph` and must not be reset while it lives.
    pub unsafe fn build(
        mem_bytes: usize,
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
    ) -> Result<Self, GgmlError> {
        // SAFETY: the caller's contract.
        unsafe { Self::build_in(Context::new(mem_bytes)?, build, None) }
    }

    /// As [`OwnedGraph::build`], with ggml's graph allocator placing the context's tensors in one
    /// buffer where a tensor's memory is reused once its last reader has run: the buffer is the
    /// graph's peak of live intermediates, not their sum. `in.*` tensors are graph inputs, `out.*`
    /// outputs, both kept whole, and so are the tensors whose names start with `keep` (to read
    /// intermediates); tensors the graph does not reach get no memory.
    ///
    /// # Safety
    ///
    /// As [`OwnedGraph::build`].
    pub unsafe fn build_allocated(
        keep: Option<&str>,
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
    ) -> Result<Self, GgmlError> {
        // Tensor headers and the graph only: 8192 tensors of overhead plus the graph's.
        // SAFETY: pure functions.
        let meta = unsafe {
            8192 * sys::ggml_tensor_overhead() + sys::ggml_graph_overhead_custom(2048, false)
        };
        // SAFETY: the caller's contract.
        unsafe {
            Self::build_in(
                Context::with_alloc(meta, true)?,
                build,
                Some(keep.unwrap_or("out.")),
            )
        }
    }

    /// `allocate`: use the graph allocator, keeping tensors named with this prefix as outputs.
    ///
    /// # Safety
    /// As [`OwnedGraph::build`].
    pub(super) unsafe fn build_in(
        ctx: Context,
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
        allocate: Option<&str>,
    ) -> Result<Self, GgmlError> {
        let outs: Vec<Tensor<'_>> = build(&ctx)?
            .into_iter()
            .map(|n| Tensor {
                ptr: n.0,
                _ctx: std::marker::PhantomData,
            })
            .collect();
        let graph = ctx.graph_of(&outs)?.ptr;
        let mut ports = Vec::new();
        // SAFETY: walking the live context's tensor list; names are NUL-terminated by ggml.
        unsafe {
            let mut t = sys::ggml_get_first_tensor(ctx.ptr.as_ptr());
            while let Some(p) = NonNull::new(t) {
                let name = CStr::from_ptr(sys::ggml_get_name(p.as_ptr())).to_string_lossy();
                let is_leaf = (*p.as_ptr()).op == sys::GGML_OP_NONE;
                if name.starts_with("in.") {
                    // ggml asserts that inputs are leaves; an op named in.* is an ordinary node.
                    if allocate.is_some() && is_leaf {
                        sys::ggml_set_input(p.as_ptr());
                    }
                    ports.push((name.into_owned(), p));
                } else if name.starts_with("out.") {
                    if allocate.is_some() {
                        sys::ggml_set_output(p.as_ptr());
                    }
                    ports.push((name.into_owned(), p));
                } else if allocate.is_some_and(|k| name.starts_with(k)) {
                    sys::ggml_set_output(p.as_ptr());
                }
                t = sys::ggml_get_next_tensor(ctx.ptr.as_ptr(), p.as_ptr());
            }
        }
        let mut galloc = None;
        if allocate.is_some() {
            // SAFETY: a CPU buffer type is static; the allocator is freed in Drop, before ctx; the
            // graph and its tensors live in ctx.
            unsafe {
                let g = NonNull::new(sys::ggml_gallocr_new(sys::ggml_backend_cpu_buffer_type()))
                    .ok_or(GgmlError::Alloc {
                        what: "ggml graph allocator",
                        bytes: 0,
                    })?;
                if !sys::ggml_gallocr_alloc_graph(g.as_ptr(), graph.as_ptr()) {
                    let bytes = sys::ggml_gallocr_get_buffer_size(g.as_ptr(), 0);
                    sys::ggml_gallocr_free(g.as_ptr());
                    return Err(GgmlError::Alloc {
                        what: "ggml graph buffer",
                        bytes,
                    });
                }
                galloc = Some(g);
            }
        }
        Ok(OwnedGraph {
            galloc,
            ctx,
            graph,
            work: Vec::new(),
            ports,
        })
    }

    /// The graph's tensor named `name`: an `in.*` or `out.*` port without allocating or scanning
    /// the context, any other name through [`Context::get`].
    pub fn tensor(&self, name: &str) -> Option<Tensor<'_>> {
        match self.ports.iter().find(|(n, _)| n == name) {
            Some((_, p)) => Some(Tensor {
                ptr: *p,
                _ctx: std::marker::PhantomData,
            }),
            None => self.ctx.get(name),
        }
    }

    /// Computes the graph on `pool`.
    pub fn compute(&mut self, pool: &Threadpool) -> Result<(), GgmlError> {
        // SAFETY: the graph lives in self.ctx, which outlives the call.
        unsafe { compute_graph(self.graph, pool, &mut self.work) }
    }
}
