//! Where each stage runs: cores, threads, nice values and the core loans (a [`ThreadPlan`]), and
//! the calls that put a stage's thread and its ggml threadpool there.

use std::sync::Arc;

use super::config::EngineConfig;
use super::error::EngineError;
use crate::ffi::{CoreLoan, GgmlError, Threadpool};

/// Where one stage runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagePlan {
    /// Cores: the stage's ggml threadpool is pinned to them, one thread per core, the stage's own
    /// thread on the last one used (ggml's placement); empty: no pinning.
    pub cores: Vec<usize>,
    /// ggml threads (the stage's own thread counts as one).
    pub threads: usize,
    /// The nice value of the stage's threads: 0 leaves them as the process's; up to 19 lowers
    /// their share of a core they time-share with another stage; 20 puts them under Linux's
    /// `SCHED_IDLE` (they run only when nothing else on the core can). Raising priority (below
    /// 0) needs privileges: a refusal leaves the threads as they were.
    pub nice: i32,
    /// Cores of the decoder this stage borrows: each of its graphs runs one more ggml thread on
    /// each of them while the decoder is not decoding, and none while it is (the decoder claims
    /// them back for a whole frame, waiting at most for the graph in progress or reserved; see
    /// [`crate::ffi::CoreLoan`]). ggml puts a pool's calling thread on its highest core, so every
    /// borrowed core must be lower than the stage's own (checked at [`Engine::load`](super::Engine::load)).
    pub borrow: Vec<usize>,
}

/// Which stage runs on which cores with how many threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadPlan {
    /// The talker.
    pub talker: StagePlan,
    /// The code predictor.
    pub code_predictor: StagePlan,
    /// The decoder.
    pub decoder: StagePlan,
}

impl ThreadPlan {
    /// The split plan for `n` cores (the default before [`ThreadPlan::lending`], which keeps it on
    /// every core count but 2). The talker and the code predictor alternate, so they share the
    /// same cores without competing; the decoder gets the others. Never more ggml threads than
    /// cores in a stage's set: ggml threads plus another busy thread on the same core collapse
    /// throughput (10x, measured on the phone SoC engine this design comes from).
    /// - 1 core: everything on core 0, 1 thread each.
    /// - 2 cores: talker and CP on core 0, decoder on core 1, 1 thread each.
    /// - n ≥ 3: talker and CP on the first ⌈n/2⌉ cores, the decoder on the rest.
    pub fn for_cores(n: usize) -> Self {
        let one = |c: usize| StagePlan {
            cores: vec![c],
            threads: 1,
            nice: 0,
            borrow: Vec::new(),
        };
        match n {
            0 | 1 => ThreadPlan {
                talker: one(0),
                code_predictor: one(0),
                decoder: one(0),
            },
            2 => ThreadPlan {
                talker: one(0),
                code_predictor: one(0),
                decoder: one(1),
            },
            n => {
                let a = n.div_ceil(2);
                let first = StagePlan {
                    cores: (0..a).collect(),
                    threads: a,
                    nice: 0,
                    borrow: Vec::new(),
                };
                ThreadPlan {
                    talker: first.clone(),
                    code_predictor: first,
                    decoder: StagePlan {
                        cores: (a..n).collect(),
                        threads: n - a,
                        nice: 0,
                        borrow: Vec::new(),
                    },
                }
            }
        }
    }

    /// [`ThreadPlan::for_cores`] with the code predictor's ggml threads over every core and the
    /// decoder's thread under `SCHED_IDLE` ([`StagePlan::nice`] 20), so that the decoder runs in
    /// the talker's turns and yields its core the moment the code predictor's second thread
    /// wakes. Faster where the machine runs nothing else (RTF 1.69 against 2.13 on 2 cores,
    /// PERFORMANCE.md), but any other busy program starves the decoder, the stage that feeds the
    /// speaker: not the default. The same as `for_cores` on one core.
    pub fn code_predictor_on_every_core(n: usize) -> Self {
        let mut plan = Self::for_cores(n);
        if n >= 2 {
            plan.code_predictor = StagePlan {
                cores: (0..n).collect(),
                threads: n,
                nice: 0,
                borrow: Vec::new(),
            };
            plan.decoder.nice = 20;
        }
        plan
    }

    /// On 2 cores: the decoder on core 0, the talker and the code predictor on core 1, and both
    /// borrow core 0 for their graphs whenever the decoder is not decoding
    /// ([`StagePlan::borrow`]). The code predictor reserves it for the talker's next step before
    /// it hands the decoder a frame, so the decoder decodes beside the code predictor's first
    /// sub-steps rather than beside the talker's step. Nobody's priority changes and no two
    /// threads of ours share a core: the decoder gets its core back within one graph. Otherwise
    /// the same as [`ThreadPlan::for_cores`].
    pub fn lending(n: usize) -> Self {
        if n != 2 {
            return Self::for_cores(n);
        }
        let mut plan = Self::for_cores(2);
        plan.talker.cores = vec![1];
        plan.code_predictor.cores = vec![1];
        plan.code_predictor.borrow = vec![0];
        plan.talker.borrow = vec![0];
        plan.decoder.cores = vec![0];
        plan
    }

    /// Checks that what a stage borrows is the decoder's, not its own, and below its own cores
    /// (see [`StagePlan::borrow`]).
    pub(super) fn check_loans(&self) -> Result<(), EngineError> {
        for (stage, p) in [
            ("talker", &self.talker),
            ("code predictor", &self.code_predictor),
        ] {
            if p.borrow.is_empty() {
                continue;
            }
            let own_min = p.cores.iter().copied().min();
            let ok = p
                .borrow
                .iter()
                .all(|c| self.decoder.cores.contains(c) && own_min.is_some_and(|m| *c < m));
            if !ok {
                return Err(EngineError::Plan {
                    expected: format!(
                        "the {stage} borrowing decoder cores (of {:?}) below its own",
                        self.decoder.cores
                    ),
                    found: format!("borrow {:?}, own cores {:?}", p.borrow, p.cores),
                });
            }
        }
        Ok(())
    }

    /// Every core of the plan, sorted.
    pub fn all_cores(&self) -> Vec<usize> {
        let mut all: Vec<usize> = [&self.talker, &self.code_predictor, &self.decoder]
            .iter()
            .flat_map(|p| p.cores.iter().copied())
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// The default plan for `n` cores: [`ThreadPlan::lending`] (1.2-1.3x faster than the split
    /// plan on 2 cores, PERFORMANCE.md).
    pub fn default_for(n: usize) -> Self {
        Self::lending(n)
    }

    /// [`ThreadPlan::default_for`] the cores this process may use.
    pub fn detect() -> Self {
        Self::default_for(Self::available_cores())
    }

    /// The cores this process may use (at least 1).
    pub fn available_cores() -> usize {
        core_affinity::get_core_ids()
            .map(|c| c.len())
            .filter(|&n| n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1)
    }
}

pub(super) fn pin(plan: &StagePlan, loan: Option<&Arc<CoreLoan>>) -> Result<Threadpool, GgmlError> {
    // The talker and the code predictor share their cores: their idle workers must sleep, not
    // spin on the core the other stage is computing on. ggml places the pool's workers on the
    // first cores of the set and the calling thread (this stage's) on the last. The workers are
    // created by this thread and inherit its nice value.
    set_nice(plan.nice);
    let mut pool = Threadpool::with_poll(plan.threads.max(1), &plan.cores, Some(0))?;
    if let (Some(loan), false) = (loan, plan.borrow.is_empty()) {
        // The borrowed cores are below the stage's own (`ThreadPlan::check_loans`), so the wide
        // pool's extra workers go to them and its calling thread stays on the stage's last core.
        let all: Vec<usize> = plan.borrow.iter().chain(&plan.cores).copied().collect();
        let n = plan.threads.max(1) + plan.borrow.len();
        let wide = Threadpool::with_poll(n, &all, Some(0))?;
        pool = pool.borrowing(wide, loan.clone());
    }
    pin_thread(plan);
    Ok(pool)
}

/// Sets the calling thread's nice value (Linux keeps one per thread; threads it creates inherit
/// it), or `SCHED_IDLE` for 20 and above (see [`StagePlan::nice`]); a refusal (raising priority
/// without privileges) leaves it as it was.
fn set_nice(nice: i32) {
    if nice == 0 {
        return;
    }
    // SAFETY: plain syscalls on the calling thread's own id.
    #[cfg(target_os = "linux")]
    unsafe {
        if nice >= 20 {
            let p = libc::sched_param { sched_priority: 0 };
            // pid 0: the calling thread.
            let _ = libc::sched_setscheduler(0, libc::SCHED_IDLE, &p);
        } else {
            let tid = libc::gettid() as libc::id_t;
            let _ = libc::setpriority(libc::PRIO_PROCESS, tid, nice);
        }
    }
}

/// Pins the calling thread where ggml's strict pool of `plan` puts it: the last core it uses.
pub(super) fn pin_thread(plan: &StagePlan) {
    if let Some(&c) = plan
        .cores
        .get(plan.threads.max(1) - 1)
        .or(plan.cores.last())
    {
        // A failure to pin leaves the thread unpinned; it still runs.
        let _ = core_affinity::set_for_current(core_affinity::CoreId { id: c });
    }
}

/// The pool over every core of the plan for a stage's burst (see [`EngineConfig::burst`]), when
/// that is wider than the stage's own. Not strict: its workers go to whichever core is idle (the
/// decoder's, at the start of an utterance), and the stage's thread is pinned back to its own.
pub(super) fn burst_pool(
    cfg: &EngineConfig,
    own: &StagePlan,
) -> Result<Option<Threadpool>, GgmlError> {
    let all = cfg.plan.all_cores();
    if !cfg.burst || all.len() <= own.threads.max(1) {
        return Ok(None);
    }
    let pool = Threadpool::with_options(all.len(), &all, Some(0), false)?;
    pin_thread(own);
    Ok(Some(pool))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn code_predictor_on_every_core_shares_the_cores_and_idles_the_decoder() {
        assert_eq!(
            ThreadPlan::code_predictor_on_every_core(1),
            ThreadPlan::for_cores(1)
        );
        let (base, p) = (
            ThreadPlan::for_cores(2),
            ThreadPlan::code_predictor_on_every_core(2),
        );
        assert_eq!(p.talker, base.talker);
        assert_eq!(
            (p.code_predictor.cores.as_slice(), p.code_predictor.threads),
            (&[0, 1][..], 2)
        );
        assert_eq!(
            (&p.decoder.cores, p.decoder.nice),
            (&base.decoder.cores, 20)
        );
        assert_eq!(p.all_cores(), vec![0, 1]);
    }

    #[test]
    fn lending_gives_the_decoder_core_0_and_lends_it_to_the_talker_and_the_code_predictor() {
        for n in [1, 3, 4] {
            assert_eq!(ThreadPlan::lending(n), ThreadPlan::for_cores(n));
        }
        let p = ThreadPlan::lending(2);
        p.check_loans().unwrap();
        assert_eq!((p.decoder.cores.as_slice(), p.decoder.nice), (&[0][..], 0));
        assert_eq!(
            (p.code_predictor.cores.as_slice(), p.code_predictor.threads),
            (&[1][..], 1)
        );
        assert_eq!(p.code_predictor.borrow, vec![0]);
        assert_eq!(
            (p.talker.cores.as_slice(), p.talker.borrow.as_slice()),
            (&[1][..], &[0][..])
        );
        assert_eq!(p.all_cores(), vec![0, 1]);
    }

    /// This process's thread ids.
    fn tasks() -> Vec<u32> {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    }

    /// The name of thread `tid` (empty once it has exited).
    fn comm_of(tid: u32) -> String {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
            .map(|s| s.trim_end().to_owned())
            .unwrap_or_default()
    }

    /// The nice value of thread `tid`, from `/proc` (field 19 of `stat`).
    fn nice_of(tid: u32) -> i64 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split_whitespace().nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn a_stage_s_nice_value_reaches_its_thread_and_its_ggml_workers_only() {
        // SAFETY: plain syscalls on this thread.
        let (own, before) = unsafe { (libc::gettid() as u32, nice_of(libc::gettid() as u32)) };
        if before > 7 {
            eprintln!("skipped: the test runs at nice {before}, above the 7 it sets");
            return;
        }
        let plan = StagePlan {
            cores: Vec::new(),
            threads: 2,
            nice: 7,
            borrow: Vec::new(),
        };
        // Linux gives a new thread its creator's name: the pool's workers are the threads named
        // as this one (other tests of this binary make threads of their own meanwhile).
        std::thread::Builder::new()
            .name("qtts-nice-test".into())
            .spawn(move || {
                let _pool = pin(&plan, None).unwrap();
                // SAFETY: a plain syscall.
                let me = unsafe { libc::gettid() } as u32;
                assert_eq!(nice_of(me), 7, "the stage's thread");
                let workers: Vec<u32> = tasks()
                    .into_iter()
                    .filter(|&t| t != me && comm_of(t) == "qtts-nice-test")
                    .collect();
                assert!(!workers.is_empty(), "a pool of 2 threads has a worker");
                for w in workers {
                    assert_eq!(nice_of(w), 7, "ggml worker {w}");
                }
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(nice_of(own), before, "the caller's thread is untouched");
    }

    #[test]
    fn nice_20_is_sched_idle_for_the_stage_s_thread_only() {
        let plan = StagePlan {
            cores: Vec::new(),
            threads: 1,
            nice: 20,
            borrow: Vec::new(),
        };
        std::thread::spawn(move || {
            let _pool = pin(&plan, None).unwrap();
            // SAFETY: a plain syscall on the calling thread.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
        // SAFETY: as above.
        assert_ne!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_IDLE);
    }
}
