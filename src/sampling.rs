//! Choosing a code from logits: greedy, or temperature, top-k and top-p sampling with a seeded RNG.
//!
//! Semantics and order are those of Hugging Face `generate` as the official `qwen-tts` package runs
//! it (`TemperatureLogitsWarper`, `TopKLogitsWarper`, `TopPLogitsWarper`, then a draw from the
//! softmax): temperature divides the logits; top-k keeps the logits at or above the k-th largest
//! (ties kept); top-p sorts ascending and drops the tokens whose cumulative probability is at most
//! `1 - top_p`, always keeping the most likely one. The draw itself uses this crate's ChaCha8
//! generator, so a seed reproduces a run of this engine, not a run of PyTorch.
//! The processors that come before (repetition penalty, suppressed ids, EOS masking) belong to the
//! talker; the code predictor uses none (MODEL-NOTES.md §4).
//!
//! Contract: a [`Sampler`] owns its scratch buffers, sized on first use; after that
//! [`Sampler::sample`] allocates nothing, takes no lock and runs in O(n + k log k) of the
//! vocabulary `n` and top-k's `k` (O(n log n) without top-k).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sampling settings for one codebook group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Sample (true) or take the argmax (false).
    pub do_sample: bool,
    /// Divides the logits; must be above 0 when sampling.
    pub temperature: f32,
    /// Keep the k most likely (0: all).
    pub top_k: usize,
    /// Keep the smallest most-likely set of probability above `top_p` (1.0: all).
    pub top_p: f32,
}

impl SamplingParams {
    /// Greedy decoding.
    pub const GREEDY: SamplingParams = SamplingParams {
        do_sample: false,
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
    };
}

/// Codebook-0 sampling settings a caller may set one by one over the model's
/// (`generation_config.json`): what the C ABI, the Python package and the server take. Each `None`
/// keeps the model's value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingOverrides {
    /// Divides the logits; 0 means greedy (the argmax). Finite, 0 or at least
    /// [`SamplingOverrides::MIN_TEMPERATURE`].
    pub temperature: Option<f32>,
    /// Keep the k most likely (0: all).
    pub top_k: Option<usize>,
    /// Keep the smallest most-likely set of probability above `top_p`: in (0, 1].
    pub top_p: Option<f32>,
}

/// A sampling setting out of its range.
/// Give a value in the range the message states, or leave the setting out for the model's.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{setting}: expected {expected}, found {}", shown(*found))]
pub struct SamplingError {
    /// The setting (`temperature`, `top_p`, `repetition_penalty`).
    pub setting: &'static str,
    /// Its range.
    pub expected: &'static str,
    /// The value given.
    pub found: f32,
}

/// A number as an error message shows it: as written when that is short (`0.5`, `1000`), in
/// scientific notation when it is not (`1e308`, `1e-40`, where plain notation has hundreds of
/// digits).
pub fn shown<T: std::fmt::Display + std::fmt::LowerExp>(x: T) -> String {
    let plain = format!("{x}");
    if plain.len() <= 12 {
        plain
    } else {
        format!("{x:e}")
    }
}

impl SamplingOverrides {
    /// The smallest temperature above 0: dividing logits by less overflows them.
    pub const MIN_TEMPERATURE: f32 = 1e-3;

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Checks every setting's range.
    pub fn check(&self) -> Result<(), SamplingError> {
        if let Some(t) = self.temperature {
            if !(t.is_finite() && (t == 0.0 || t >= Self::MIN_TEMPERATURE)) {
                return Err(SamplingError {
                    setting: "temperature",
                    expected: "0 (greedy) or a finite value of at least 0.001",
                    found: t,
                });
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(SamplingError {
                    setting: "top_p",
                    expected: "a value in (0, 1]",
                    found: p,
                });
            }
        }
        Ok(())
    }

    /// `base` (the model's) with these settings over it; temperature 0 is greedy.
    pub fn apply(&self, base: SamplingParams) -> SamplingParams {
        if self.temperature == Some(0.0) {
            return SamplingParams::GREEDY;
        }
        let mut p = base;
        if let Some(t) = self.temperature {
            p.do_sample = true;
            p.temperature = t;
        }
        if let Some(k) = self.top_k {
            p.top_k = k;
        }
        if let Some(top) = self.top_p {
            p.top_p = top;
        }
        p
    }
}

/// Checks a repetition penalty: finite and above 0 (1: none).
pub fn check_repetition_penalty(r: f32) -> Result<(), SamplingError> {
    if r.is_finite() && r > 0.0 {
        Ok(())
    } else {
        Err(SamplingError {
            setting: "repetition_penalty",
            expected: "a finite value above 0 (1: no penalty)",
            found: r,
        })
    }
}

/// A seeded sampler with its scratch space.
#[derive(Debug, Clone)]
pub struct Sampler {
    rng: ChaCha8Rng,
    order: Vec<u32>,
    probs: Vec<f32>,
}

/// The index of the largest value (the first of equal ones), as Hugging Face's argmax.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    /// A sampler whose draws are determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Sampler {
            rng: ChaCha8Rng::seed_from_u64(seed),
            order: Vec::new(),
            probs: Vec::new(),
        }
    }

    /// Picks a code from `logits` with `p`. Non-finite logits count as -inf; when every logit is
    /// -inf the argmax (index 0) is returned.
    pub fn sample(&mut self, logits: &[f32], p: &SamplingParams) -> u32 {
        if !p.do_sample || logits.is_empty() {
            return argmax(logits);
        }
        let t = if p.temperature > 0.0 {
            p.temperature
        } else {
            1.0
        };
        let n = logits.len();
        self.order.clear();
        self.order.extend(0..n as u32);
        let key = |i: u32| {
            let x = logits[i as usize];
            if x.is_finite() {
                x / t
            } else {
                f32::NEG_INFINITY
            }
        };
        // Descending by logit, ties by index: a total, deterministic order.
        let cmp = |a: &u32, b: &u32| key(*b).total_cmp(&key(*a)).then(a.cmp(b));
        let mut keep = n;
        if p.top_k > 0 && p.top_k < n {
            // Only the kept head needs its order: the k-th found in linear time, the logits
            // equal to it moved up behind it (ties kept), then that head sorted. The same head,
            // in the same order, as a sort of the whole vocabulary.
            self.order.select_nth_unstable_by(p.top_k - 1, cmp);
            let kth = key(self.order[p.top_k - 1]);
            keep = p.top_k;
            for j in p.top_k..n {
                if key(self.order[j]) >= kth {
                    self.order.swap(j, keep);
                    keep += 1;
                }
            }
            self.order[..keep].sort_unstable_by(cmp);
        } else {
            self.order.sort_unstable_by(cmp);
        }
        let max = key(self.order[0]);
        if max == f32::NEG_INFINITY {
            return argmax(logits);
        }
        self.probs.clear();
        let mut sum = 0f64;
        for &i in &self.order[..keep] {
            let e = ((key(i) - max) as f64).exp();
            sum += e;
            self.probs.push(e as f32);
        }
        if p.top_p < 1.0 {
            // Ascending cumulative mass; drop while it stays at or under 1 - top_p.
            let drop_mass = (1.0 - p.top_p as f64) * sum;
            let mut cum = 0f64;
            let mut drop = 0;
            for &e in self.probs.iter().rev() {
                cum += e as f64;
                if cum <= drop_mass {
                    drop += 1;
                } else {
                    break;
                }
            }
            keep = (keep - drop).max(1);
            self.probs.truncate(keep);
            sum = self.probs.iter().map(|&e| e as f64).sum();
        }
        let mut u = self.rng.random::<f64>() * sum;
        for (j, &e) in self.probs.iter().enumerate() {
            u -= e as f64;
            if u < 0.0 {
                return self.order[j];
            }
        }
        self.order[keep - 1]
    }
}

impl SamplingParams {
    /// The talker's codebook-0 settings of a checkpoint's `generation_config.json`.
    pub fn talker(g: &crate::model::config::GenerationConfig) -> Self {
        SamplingParams {
            do_sample: g.do_sample,
            temperature: g.temperature as f32,
            top_k: g.top_k as usize,
            top_p: g.top_p as f32,
        }
    }

    /// The code predictor's codebooks 1..15 settings (`subtalker_*`).
    pub fn code_predictor(g: &crate::model::config::GenerationConfig) -> Self {
        SamplingParams {
            do_sample: g.subtalker_dosample,
            temperature: g.subtalker_temperature as f32,
            top_k: g.subtalker_top_k as usize,
            top_p: g.subtalker_top_p as f32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_messages_stay_short() {
        assert_eq!(shown(0.5), "0.5");
        assert_eq!(shown(1000.0), "1000");
        assert_eq!(shown(1e308), "1e308");
        assert_eq!(shown(1e-40), "1e-40");
        assert_eq!(shown(f64::INFINITY), "inf");
        let e = SamplingOverrides {
            temperature: Some(1e-38),
            ..Default::default()
        }
        .check()
        .unwrap_err();
        assert!(e.to_string().ends_with("found 1e-38"), "{e}");
    }
}
