//! ggml's persistent worker pools, pinned to cores, and the loan of one stage's cores to another
//! between its computes.

use super::sys;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::GgmlError;

/// A persistent ggml worker pool, optionally pinned to a set of cores.
///
/// Create one per stage at engine start; creating a pool per call would spawn threads per call.
#[derive(Debug)]
pub struct Threadpool {
    pub(super) ptr: NonNull<sys::ggml_threadpool>,
    pub(super) n_threads: usize,
    /// A wider pool over cores on loan, and the loan (see [`Threadpool::borrowing`]).
    pub(super) wide: Option<(Box<Threadpool>, Arc<CoreLoan>)>,
}

/// Cores one stage lends another between its own computes: the owner (the decoder) claims them
/// back for a whole frame with [`CoreLoan::claim`]; a borrower's pool ([`Threadpool::borrowing`])
/// runs a graph over them only when the owner holds no claim, one graph at a time, so the two
/// never run threads on the same core at once. A claim waits at most for the borrower's graph
/// in progress, or for the one a [`Reservation`] holds the cores for (a code-predictor
/// sub-step is a few ms, a talker step tens).
#[derive(Debug, Default)]
pub struct CoreLoan {
    pub(super) state: Mutex<LoanState>,
    pub(super) returned: Condvar,
    pub(super) lent: AtomicU64,
    pub(super) kept: AtomicU64,
}

#[derive(Debug, Default)]
pub(super) struct LoanState {
    /// The owner holds a claim (or waits for one).
    pub(super) claimed: bool,
    /// A borrower's graph is running on the cores, or they are reserved for the next one.
    pub(super) out: bool,
    /// The cores are out for the next borrowing graph ([`CoreLoan::reserve`]).
    pub(super) reserved: bool,
}

impl CoreLoan {
    /// A loan with the cores at home and nobody waiting.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, LoanState> {
        // The state is three flags, valid whatever a panicking holder left.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The owner takes the cores back until the returned guard drops: blocks while a borrower's
    /// graph runs on them, and keeps any new one off them.
    pub fn claim(&self) -> Claim<'_> {
        let mut s = self.state();
        s.claimed = true;
        while s.out {
            s = self.returned.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        Claim { loan: self }
    }

    /// Graphs the borrower ran on the cores, and graphs it ran without them (the owner held a
    /// claim), since the loan was made.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.lent.load(Ordering::Relaxed),
            self.kept.load(Ordering::Relaxed),
        )
    }

    /// Takes the cores out now for the next borrowing graph, whoever runs it, so that a claim
    /// made meanwhile waits for that graph to end; `None` when the owner holds them or they are
    /// out already. Dropping the reservation unused gives them back.
    pub fn reserve(self: &Arc<Self>) -> Option<Reservation> {
        let mut s = self.state();
        if s.claimed || s.out {
            return None;
        }
        s.out = true;
        s.reserved = true;
        Some(Reservation { loan: self.clone() })
    }

    pub(super) fn try_borrow(&self) -> bool {
        let mut s = self.state();
        if s.reserved {
            // The reservation becomes this graph's loan.
            s.reserved = false;
            self.lent.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let ok = !s.claimed && !s.out;
        if ok {
            s.out = true;
            self.lent.fetch_add(1, Ordering::Relaxed);
        } else {
            self.kept.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    pub(super) fn give_back(&self) {
        self.bring_home(&mut self.state());
    }

    /// The cores back from a graph or an unused reservation: a waiting claim goes on.
    pub(super) fn bring_home(&self, s: &mut LoanState) {
        s.out = false;
        if s.claimed {
            self.returned.notify_all();
        }
    }
}

/// Cores taken out by [`CoreLoan::reserve`] for the next borrowing graph; dropping it before a
/// graph took them gives them back.
#[derive(Debug)]
pub struct Reservation {
    pub(super) loan: Arc<CoreLoan>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut s = self.loan.state();
        if s.reserved {
            s.reserved = false;
            self.loan.bring_home(&mut s);
        }
    }
}

/// The owner's hold on a [`CoreLoan`]'s cores; dropping it lends them again.
#[derive(Debug)]
pub struct Claim<'a> {
    pub(super) loan: &'a CoreLoan,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.loan.state().claimed = false;
    }
}

/// Which pool a graph runs on: the wide one while it is on loan.
pub(super) struct Lease<'a> {
    pub(super) pool: &'a Threadpool,
    pub(super) loan: Option<&'a CoreLoan>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.loan {
            l.give_back();
        }
    }
}

// SAFETY: the pool is driven by whichever single thread computes a graph with it.
unsafe impl Send for Threadpool {}

impl Threadpool {
    /// A pool of `n_threads` workers (the calling thread counts as one), pinned to `cores` when
    /// that is not empty.
    pub fn new(n_threads: usize, cores: &[usize]) -> Result<Self, GgmlError> {
        Self::with_poll(n_threads, cores, None)
    }

    /// As [`Threadpool::new`], with ggml's polling level (0: idle workers sleep at once instead of
    /// spinning; ggml's default, 50, spins a while for the next graph). Pools that share cores
    /// with another stage should not spin.
    pub fn with_poll(
        n_threads: usize,
        cores: &[usize],
        poll: Option<u32>,
    ) -> Result<Self, GgmlError> {
        Self::with_options(n_threads, cores, poll, true)
    }

    /// As [`Threadpool::with_poll`]; `strict` pins each thread to one core of `cores` (ggml gives
    /// the workers the first cores and the calling thread the last), else every thread, the
    /// calling one included, may run on any of them.
    pub fn with_options(
        n_threads: usize,
        cores: &[usize],
        poll: Option<u32>,
        strict: bool,
    ) -> Result<Self, GgmlError> {
        let err = || GgmlError::Threadpool {
            n_threads,
            cores: cores.to_vec(),
        };
        if n_threads == 0 || n_threads > 512 || cores.iter().any(|&c| c >= 512) {
            return Err(err());
        }
        // SAFETY: params is a plain struct initialised by ggml; the mask has 512 entries and every
        // index was checked above.
        let ptr = unsafe {
            let mut params = sys::ggml_threadpool_params_default(n_threads as i32);
            if let Some(p) = poll {
                params.poll = p;
            }
            if !cores.is_empty() {
                params.cpumask = [false; 512];
                for &c in cores {
                    params.cpumask[c] = true;
                }
                params.strict_cpu = strict;
            }
            sys::ggml_threadpool_new(&mut params)
        };
        NonNull::new(ptr)
            .map(|ptr| Threadpool {
                ptr,
                n_threads,
                wide: None,
            })
            .ok_or_else(err)
    }

    /// This pool, which runs a graph on `wide` instead whenever `loan`'s owner does not hold its
    /// cores: `wide` is this pool's cores and the owner's, and must put its calling thread where
    /// this pool does (ggml places a strict pool's calling thread on its highest core).
    pub fn borrowing(mut self, wide: Threadpool, loan: Arc<CoreLoan>) -> Self {
        self.wide = Some((Box::new(wide), loan));
        self
    }

    /// The pool the next graph runs on (see [`Threadpool::borrowing`]), until the lease drops.
    pub(super) fn lease(&self) -> Lease<'_> {
        match &self.wide {
            Some((wide, loan)) if loan.try_borrow() => Lease {
                pool: wide,
                loan: Some(loan),
            },
            _ => Lease {
                pool: self,
                loan: None,
            },
        }
    }

    /// Worker count.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// The raw pointer, for llama.cpp's `llama_attach_threadpool`.
    pub fn as_ptr(&self) -> *mut sys::ggml_threadpool {
        self.ptr.as_ptr()
    }
}

impl Drop for Threadpool {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_threadpool_new and is freed once.
        unsafe { sys::ggml_threadpool_free(self.ptr.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn a_claim_waits_for_the_graph_on_loan_and_keeps_new_ones_off() {
        let loan = CoreLoan::new();
        assert!(loan.try_borrow(), "nobody claims: lent");
        let claimed = Arc::new(AtomicU64::new(0));
        let owner = {
            let (loan, claimed) = (loan.clone(), claimed.clone());
            std::thread::spawn(move || {
                let _claim = loan.claim();
                claimed.store(1, Ordering::SeqCst);
                // Hold it until the borrower has tried again.
                while loan.counts().1 == 0 {
                    std::thread::yield_now();
                }
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            claimed.load(Ordering::SeqCst),
            0,
            "the claim waits for the loan"
        );
        loan.give_back();
        while claimed.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        assert!(!loan.try_borrow(), "claimed: kept off");
        owner.join().unwrap();
        assert!(loan.try_borrow(), "the claim dropped: lent again");
        loan.give_back();
        assert_eq!(loan.counts(), (2, 1));
    }

    #[test]
    pub(super) fn a_reservation_holds_a_claim_off_until_a_graph_used_it_or_it_dropped() {
        let loan = CoreLoan::new();
        let r = loan.reserve().unwrap();
        assert!(loan.reserve().is_none(), "out already");
        let claimed = Arc::new(AtomicU64::new(0));
        let owner = {
            let (loan, claimed) = (loan.clone(), claimed.clone());
            std::thread::spawn(move || {
                let _claim = loan.claim();
                claimed.store(1, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(
            claimed.load(Ordering::SeqCst),
            0,
            "reserved: the claim waits"
        );
        // The next borrowing graph takes the reservation, claim or not.
        assert!(loan.try_borrow());
        drop(r);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(claimed.load(Ordering::SeqCst), 0, "the graph still runs");
        loan.give_back();
        owner.join().unwrap();
        assert_eq!(claimed.load(Ordering::SeqCst), 1);
        // Unused, a reservation gives the cores back when it drops.
        let r = loan.reserve().unwrap();
        drop(r);
        let _claim = loan.claim();
        assert!(!loan.try_borrow());
    }
}
