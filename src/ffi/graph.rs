//! Computation graphs: one built over a borrowed context ([`Graph`]) and one that owns its
//! context ([`OwnedGraph`]), computed on a [`Threadpool`](super::Threadpool).

use super::sys;
use std::ffi::CStr;
use std::ptr::NonNull;

use super::context::Tensor;
use super::context::{Context, SharedContext};
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
/// Inputs and outputs are found by name ([`Tensor::set_name`]). The graph may read tensors of
/// other contexts (weights, caches, a stream's state) only if they are [`SharedContext`]s it was
/// given at build: it holds each of them, so they live as long as it does whatever order its
/// owner drops things in, and the build refuses a graph that reads any other context. It stays
/// on the thread that built it (not `Send`), as the contexts it shares do.
#[derive(Debug)]
pub struct OwnedGraph {
    /// The contexts the graph reads, held for its whole life.
    pub(super) _reads: Vec<SharedContext>,
    /// The graph allocator's buffer holding every tensor of `ctx`, when built with
    /// [`OwnedGraph::build_allocated`]; freed before `ctx`.
    pub(super) galloc: Option<NonNull<sys::ggml_gallocr>>,
    pub(super) ctx: Context,
    pub(super) graph: NonNull<sys::ggml_cgraph>,
    pub(super) work: Vec<u8>,
    /// The tensors named `in.*` and `out.*`, found once at build.
    pub(super) ports: Vec<(String, NonNull<sys::ggml_tensor>)>,
}

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

/// Nodes a graph may have unless its builder says otherwise.
pub const GRAPH_NODES: usize = 2048;

impl OwnedGraph {
    /// Builds a graph in a new context of `mem_bytes`: `build` returns the output nodes, which
    /// are computed in the order given (put cache writes before the nodes that read the cache).
    /// The graph may read tensors of `reads` (which it holds) and of its own context only; any
    /// other is refused with [`GgmlError::Shape`].
    pub fn build(
        mem_bytes: usize,
        reads: &[&SharedContext],
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
    ) -> Result<Self, GgmlError> {
        Self::build_in(Context::new(mem_bytes)?, reads, build, None, GRAPH_NODES)
    }

    /// As [`OwnedGraph::build`], with ggml's graph allocator placing the context's tensors in one
    /// buffer where a tensor's memory is reused once its last reader has run: the buffer is the
    /// graph's peak of live intermediates, not their sum. `in.*` tensors are graph inputs, `out.*`
    /// outputs, both kept whole, and so are the tensors whose names start with `keep` (to read
    /// intermediates); tensors the graph does not reach get no memory.
    pub fn build_allocated(
        keep: Option<&str>,
        reads: &[&SharedContext],
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
    ) -> Result<Self, GgmlError> {
        Self::build_allocated_nodes(keep, reads, GRAPH_NODES, build)
    }

    /// [`OwnedGraph::build_allocated`] for a graph of up to `nodes` nodes (instead of 2048), with
    /// room for four tensors a node.
    pub fn build_allocated_nodes(
        keep: Option<&str>,
        reads: &[&SharedContext],
        nodes: usize,
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
    ) -> Result<Self, GgmlError> {
        let nodes = nodes.max(GRAPH_NODES);
        // Tensor headers and the graph only: four tensors of overhead a node plus the graph's.
        // SAFETY: pure functions.
        let meta = unsafe {
            4 * nodes * sys::ggml_tensor_overhead() + sys::ggml_graph_overhead_custom(nodes, false)
        };
        Self::build_in(
            Context::with_alloc(meta, true)?,
            reads,
            build,
            Some(keep.unwrap_or("out.")),
            nodes,
        )
    }

    /// `allocate`: use the graph allocator, keeping tensors named with this prefix as outputs.
    pub(super) fn build_in(
        ctx: Context,
        reads: &[&SharedContext],
        build: impl FnOnce(&Context) -> Result<Vec<Node>, GgmlError>,
        allocate: Option<&str>,
        nodes: usize,
    ) -> Result<Self, GgmlError> {
        let outs: Vec<Tensor<'_>> = build(&ctx)?
            .into_iter()
            .map(|n| Tensor {
                ptr: n.0,
                _ctx: std::marker::PhantomData,
            })
            .collect();
        let graph = ctx.graph_of_nodes(&outs, nodes)?.ptr;
        reads_only(graph, &ctx, reads)?;
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
            _reads: reads.iter().map(|&c| c.clone()).collect(),
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
        // SAFETY: the graph lives in self.ctx, and every context it reads is in self._reads
        // (checked at build), all of which outlive the call.
        unsafe { compute_graph(self.graph, pool, &mut self.work) }
    }
}

/// Refuses a graph whose nodes read a tensor outside `own` and `reads`: a ggml tensor's header
/// lives in its context's memory pool, so its address says which context it belongs to.
fn reads_only(
    graph: NonNull<sys::ggml_cgraph>,
    own: &Context,
    reads: &[&SharedContext],
) -> Result<(), GgmlError> {
    let pools: Vec<(usize, usize)> = std::iter::once(own)
        .chain(reads.iter().map(|c| &***c))
        .map(|c| {
            // SAFETY: a live context; both calls only read its header.
            let (base, size) = unsafe {
                (
                    sys::ggml_get_mem_buffer(c.ptr.as_ptr()) as usize,
                    sys::ggml_get_mem_size(c.ptr.as_ptr()),
                )
            };
            (base, base + size)
        })
        .collect();
    let known = |t: *mut sys::ggml_tensor| {
        let a = t as usize;
        pools.iter().any(|&(lo, hi)| lo <= a && a < hi)
    };
    // SAFETY: the graph was just built in `own`; its nodes and their sources are live tensors.
    unsafe {
        for i in 0..sys::ggml_graph_n_nodes(graph.as_ptr()) {
            let node = sys::ggml_graph_node(graph.as_ptr(), i);
            let srcs = (*node).src;
            for t in std::iter::once(node).chain(srcs.into_iter().filter(|s| !s.is_null())) {
                if !known(t) {
                    let name = CStr::from_ptr(sys::ggml_get_name(t)).to_string_lossy();
                    return Err(GgmlError::Shape {
                        what: "graph",
                        expected: "tensors of its own context or of the contexts it holds".into(),
                        found: format!("tensor '{name}' of another context"),
                    });
                }
            }
        }
    }
    Ok(())
}
