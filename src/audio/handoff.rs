//! The protocol between a ring's two halves: the sink (the decoder's thread) and the player (the
//! device's thread), in atomics only.
//!
//! Everything is counted in samples since the ring was made, so no flag can be read stale:
//! - the sink publishes `pushed` after each push, and marks an utterance's end at `end_mark` (the
//!   `pushed` of its last sample; [`OPEN`] while one is being written);
//! - a cancel marks `discard_until` (the `pushed` of the cancelled audio's last sample): the
//!   player drops those samples, and only those, so a request started right after a cancel is
//!   never cut, and never waits;
//! - the player publishes `consumed` (samples played or dropped); an utterance has played out
//!   once `consumed` reaches its end mark.
//!
//! The file is written against `crate::sync`, not `std::sync`: the library compiles it with
//! std's atomics, and the loom model of `tests/it/handoff_model.rs` with loom's, which checks
//! the protocol under every interleaving of the two threads.

use crate::sync::atomic::{AtomicU64, Ordering};

/// `end_mark` while an utterance is being written.
pub(crate) const OPEN: u64 = u64::MAX;
/// Underrun positions kept.
pub const UNDERRUN_LOG: usize = 64;

/// What the player needs of the ring's consumer half.
pub(crate) trait Source {
    /// Samples queued.
    fn queued(&self) -> usize;
    /// Pops into `out`; returns how many.
    fn pop(&mut self, out: &mut [f32]) -> usize;
    /// Drops up to `n` queued samples; returns how many.
    fn drop_queued(&mut self, n: usize) -> usize;
}

/// The counters both halves of a ring share ([`super::RingSink::shared`], [`super::Player::shared`]).
#[derive(Debug)]
pub struct Shared {
    prebuffer: u64,
    pushed: AtomicU64,
    end_mark: AtomicU64,
    discard_until: AtomicU64,
    consumed: AtomicU64,
    played: AtomicU64,
    periods: AtomicU64,
    underruns: AtomicU64,
    underrun_at: [AtomicU64; UNDERRUN_LOG],
}

impl Shared {
    /// Idle, with playback of each utterance waiting for `prebuffer` samples.
    pub(crate) fn new(prebuffer: usize) -> Self {
        Shared {
            prebuffer: prebuffer as u64,
            pushed: AtomicU64::new(0),
            end_mark: AtomicU64::new(0),
            discard_until: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            played: AtomicU64::new(0),
            periods: AtomicU64::new(0),
            underruns: AtomicU64::new(0),
            underrun_at: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    // The sink's side: one thread.

    /// An utterance starts.
    pub(crate) fn begin(&self) {
        self.end_mark.store(OPEN, Ordering::Release);
    }

    /// `n` samples were pushed into the ring.
    pub(crate) fn pushed(&self, n: usize) {
        // Only the sink writes `pushed`: load and store need no read-modify-write.
        let p = self.pushed.load(Ordering::Relaxed);
        self.pushed.store(p + n as u64, Ordering::Release);
    }

    /// The utterance is over: it plays out (see [`Shared::is_idle`]).
    pub(crate) fn end(&self) {
        let p = self.pushed.load(Ordering::Relaxed);
        self.end_mark.store(p, Ordering::Release);
    }

    /// The utterance is cancelled: what it pushed is dropped unplayed.
    pub(crate) fn cancel(&self) {
        let p = self.pushed.load(Ordering::Relaxed);
        self.discard_until.store(p, Ordering::Release);
        self.end_mark.store(p, Ordering::Release);
    }

    /// Whether the last utterance ended and everything it pushed was played or dropped.
    pub fn is_idle(&self) -> bool {
        let end = self.end_mark.load(Ordering::Acquire);
        end != OPEN && self.consumed.load(Ordering::Acquire) >= end
    }

    // The player's side: one thread, `playing` its own state.

    /// Fills one device period from `source`: queued audio, silence where there is none.
    /// Allocation-, lock- and syscall-free.
    pub(crate) fn fill(&self, source: &mut impl Source, playing: &mut bool, out: &mut [f32]) {
        let period = self.periods.fetch_add(1, Ordering::AcqRel);
        let mut consumed = self.consumed.load(Ordering::Relaxed);
        let discard = self.discard_until.load(Ordering::Acquire);
        if consumed < discard {
            // Every sample up to `discard` was pushed before the mark was published.
            consumed += source.drop_queued((discard - consumed) as usize) as u64;
            *playing = false;
        }
        // Read the end mark before the ring: the samples up to it are then all queued.
        let end = self.end_mark.load(Ordering::Acquire);
        let ended = end != OPEN;
        let played_out = ended && consumed >= end;
        if !*playing && !played_out {
            // Start once the prebuffer is queued, or at once when the utterance has ended.
            *playing = ended || source.queued() as u64 >= self.prebuffer;
        }
        let mut n = 0;
        if *playing {
            n = source.pop(out);
            consumed += n as u64;
            self.played.fetch_add(n as u64, Ordering::AcqRel);
            if ended && consumed >= end {
                *playing = false;
            } else if n < out.len() {
                let k = self.underruns.fetch_add(1, Ordering::AcqRel) as usize;
                if let Some(slot) = self.underrun_at.get(k) {
                    slot.store(period, Ordering::Release);
                }
            }
        }
        out[n..].fill(0.0);
        self.consumed.store(consumed, Ordering::Release);
    }

    // Counters, for anyone.

    /// Underruns so far.
    pub fn underruns(&self) -> u64 {
        self.underruns.load(Ordering::Acquire)
    }

    /// The periods (0-based) of the first [`UNDERRUN_LOG`] underruns.
    pub fn underrun_periods(&self) -> Vec<u64> {
        let n = (self.underruns() as usize).min(UNDERRUN_LOG);
        self.underrun_at[..n]
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .collect()
    }

    /// Device periods so far.
    pub fn periods(&self) -> u64 {
        self.periods.load(Ordering::Acquire)
    }

    /// Samples played so far (not those dropped by a cancel).
    pub fn played(&self) -> u64 {
        self.played.load(Ordering::Acquire)
    }
}
