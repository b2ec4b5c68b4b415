//! The ring's handoff protocol (`src/audio/handoff.rs`, compiled here against loom's atomics)
//! under every interleaving of the sink's thread and the device's: a request started right after
//! a cancel plays whole and in order, nothing of the cancelled audio plays after it, and the end
//! of an utterance is reported only once it has played out.

use std::collections::VecDeque;

use loom::sync::{Arc, Mutex};

#[path = "../../src/audio/handoff.rs"]
#[allow(dead_code)]
mod handoff;

use handoff::{Shared, Source};

/// The ring's consumer half: a queue whose push and pop are each one step, as an SPSC ring's are.
struct Queue(Arc<Mutex<VecDeque<f32>>>);

impl Source for Queue {
    fn queued(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn pop(&mut self, out: &mut [f32]) -> usize {
        let mut q = self.0.lock().unwrap();
        let n = out.len().min(q.len());
        for o in &mut out[..n] {
            *o = q.pop_front().unwrap();
        }
        n
    }

    fn drop_queued(&mut self, n: usize) -> usize {
        let mut q = self.0.lock().unwrap();
        let n = n.min(q.len());
        q.drain(..n);
        n
    }
}

fn push(shared: &Shared, queue: &Mutex<VecDeque<f32>>, samples: &[f32]) {
    queue.lock().unwrap().extend(samples);
    shared.pushed(samples.len());
}

/// Plays one period of one sample; returns it (0 for silence).
fn period(shared: &Shared, queue: &Arc<Mutex<VecDeque<f32>>>, playing: &mut bool) -> f32 {
    let mut out = [0.0f32];
    shared.fill(&mut Queue(queue.clone()), playing, &mut out);
    out[0]
}

#[test]
fn a_request_started_right_after_a_cancel_plays_whole_under_every_interleaving() {
    loom::model(|| {
        let shared = Arc::new(Shared::new(0));
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        // Utterance A starts; the device plays beside the rest.
        shared.begin();
        push(&shared, &queue, &[1.0, 2.0]);
        let device = {
            let (shared, queue) = (shared.clone(), queue.clone());
            loom::thread::spawn(move || {
                let mut playing = false;
                let played: Vec<f32> = (0..2)
                    .map(|_| period(&shared, &queue, &mut playing))
                    .collect();
                (played, playing)
            })
        };
        // A is cancelled, and B starts at once and ends.
        shared.cancel();
        shared.begin();
        push(&shared, &queue, &[10.0, 11.0]);
        shared.end();
        let (mut played, mut playing) = device.join().unwrap();
        // The device plays on until B has played out.
        for _ in 0..4 {
            played.push(period(&shared, &queue, &mut playing));
        }
        assert!(shared.is_idle(), "B never played out: {played:?}");
        let sound: Vec<f32> = played.into_iter().filter(|&x| x != 0.0).collect();
        let b = sound.iter().position(|&x| x >= 10.0).unwrap_or(sound.len());
        assert!(
            [1.0, 2.0].starts_with(&sound[..b]) && sound[b..] == [10.0, 11.0],
            "played {sound:?}: A's start, then B whole and in order"
        );
    });
}

#[test]
fn an_utterance_is_idle_only_once_it_has_played_out_under_every_interleaving() {
    loom::model(|| {
        let shared = Arc::new(Shared::new(2));
        let queue = Arc::new(Mutex::new(VecDeque::new()));
        let device = {
            let (shared, queue) = (shared.clone(), queue.clone());
            loom::thread::spawn(move || {
                let mut playing = false;
                let mut played = Vec::new();
                for _ in 0..3 {
                    played.push(period(&shared, &queue, &mut playing));
                }
                played
            })
        };
        shared.begin();
        push(&shared, &queue, &[1.0]);
        push(&shared, &queue, &[2.0, 3.0]);
        shared.end();
        // What the sink's `end` waits for: once idle, everything has played.
        if shared.is_idle() {
            assert_eq!(shared.played(), 3, "idle before the utterance played out");
        }
        let played = device.join().unwrap();
        let sound: Vec<f32> = played.iter().copied().filter(|&x| x != 0.0).collect();
        assert!([1.0, 2.0, 3.0].starts_with(&sound), "{played:?}");
        assert_eq!(shared.is_idle(), sound.len() == 3, "{played:?}");
        assert_eq!(
            shared.underruns(),
            0,
            "{played:?}: a short ring before the end of a prebuffered start"
        );
    });
}
