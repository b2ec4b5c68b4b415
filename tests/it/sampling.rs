//! The sampler against the mathematics of temperature, top-k and top-p: empirical frequencies of
//! many draws match the expected distributions; seeds reproduce and differ.

use qtts::sampling::{argmax, Sampler, SamplingParams};

fn freqs(logits: &[f32], p: SamplingParams, draws: usize, seed: u64) -> Vec<f64> {
    let mut s = Sampler::new(seed);
    let mut f = vec![0f64; logits.len()];
    for _ in 0..draws {
        f[s.sample(logits, &p) as usize] += 1.0;
    }
    f.iter().map(|x| x / draws as f64).collect()
}

fn check(name: &str, logits: &[f32], p: SamplingParams, expect: &[f64]) {
    let got = freqs(logits, p, 60_000, 7);
    for (i, (g, e)) in got.iter().zip(expect).enumerate() {
        // 60,000 draws: the standard error is at most 0.002; allow 5 of them.
        assert!(
            (g - e).abs() < 0.01,
            "{name}: code {i}: {g:.4} vs {e:.4} ({got:?})"
        );
        if *e == 0.0 {
            assert_eq!(*g, 0.0, "{name}: code {i} is outside the support");
        }
    }
}

fn sampled(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
    SamplingParams {
        do_sample: true,
        temperature,
        top_k,
        top_p,
    }
}

#[test]
fn distributions_follow_temperature_top_k_and_top_p() {
    let l = [0.0, 2f32.ln(), 3f32.ln(), f32::NEG_INFINITY];
    check(
        "plain",
        &l,
        sampled(1.0, 0, 1.0),
        &[1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0, 0.0],
    );
    check(
        "temperature 0.5",
        &l,
        sampled(0.5, 0, 1.0),
        &[1.0 / 14.0, 4.0 / 14.0, 9.0 / 14.0, 0.0],
    );
    check("top-k 2", &l, sampled(1.0, 2, 1.0), &[0.0, 0.4, 0.6, 0.0]);
    let p = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
    check(
        "top-p 0.7",
        &p,
        sampled(1.0, 0, 0.7),
        &[5.0 / 8.0, 3.0 / 8.0, 0.0],
    );
    check(
        "top-p 0.5 keeps the most likely",
        &p,
        sampled(1.0, 0, 0.5),
        &[1.0, 0.0, 0.0],
    );
    // After top-k 2 the mass is renormalised: [0.625, 0.375]; top-p 0.6 then drops 0.375 (<= 0.4).
    check(
        "top-k then top-p 0.6",
        &p,
        sampled(1.0, 2, 0.6),
        &[1.0, 0.0, 0.0],
    );
    check(
        "top-k then top-p 0.7",
        &p,
        sampled(1.0, 2, 0.7),
        &[5.0 / 8.0, 3.0 / 8.0, 0.0],
    );
    // Ties at the k-th value are kept, as Hugging Face's `logits < kth` keeps them.
    check(
        "tie at k",
        &[1.0, 1.0, 1.0, 0.0],
        sampled(1.0, 1, 1.0),
        &[1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0],
    );
}

#[test]
fn greedy_and_degenerate_cases() {
    let mut s = Sampler::new(1);
    let l = [0.5, 3.0, 3.0, -1.0];
    assert_eq!(
        s.sample(&l, &SamplingParams::GREEDY),
        1,
        "first of equal maxima"
    );
    assert_eq!(argmax(&l), 1);
    for seed in 0..20 {
        assert_eq!(
            Sampler::new(seed).sample(&[0.1, 0.9, 0.3], &sampled(0.9, 1, 1.0)),
            1
        );
    }
    let nan = [f32::NAN, 1.0, f32::INFINITY, 0.0];
    for _ in 0..100 {
        let c = s.sample(&nan, &sampled(1.0, 0, 1.0));
        assert!(c == 1 || c == 3, "non-finite logits are never drawn: {c}");
    }
    assert_eq!(s.sample(&[f32::NEG_INFINITY; 3], &sampled(1.0, 0, 1.0)), 0);
    assert_eq!(s.sample(&[], &sampled(1.0, 0, 1.0)), 0);
}

#[test]
fn seeds_reproduce_and_differ() {
    let logits: Vec<f32> = (0..2048)
        .map(|i| ((i * 7919 % 2048) as f32 / 512.0).sin())
        .collect();
    let p = sampled(0.9, 50, 1.0);
    let run = |seed| {
        let mut s = Sampler::new(seed);
        (0..64).map(|_| s.sample(&logits, &p)).collect::<Vec<_>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
}

/// The draw of the whole vocabulary sorted (descending, ties by index), as Hugging Face's
/// warpers define the kept set: the reference the sampler's partial selection is held to.
fn full_sort_draw(logits: &[f32], p: &SamplingParams, u: f64) -> u32 {
    let key = |i: u32| logits[i as usize] / p.temperature;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    let kth = key(order[p.top_k - 1]);
    let mut keep = order.iter().take_while(|&&i| key(i) >= kth).count();
    let max = key(order[0]);
    let mut probs: Vec<f64> = order[..keep]
        .iter()
        .map(|&i| ((key(i) - max) as f64).exp() as f32 as f64)
        .collect();
    let total: f64 = probs.iter().sum();
    let (mut cum, mut drop) = (0f64, 0);
    for &e in probs.iter().rev() {
        cum += e;
        if cum > (1.0 - p.top_p as f64) * total {
            break;
        }
        drop += 1;
    }
    keep = (keep - drop).max(1);
    probs.truncate(keep);
    let mut u = u * probs.iter().sum::<f64>();
    for (j, &e) in probs.iter().enumerate() {
        u -= e;
        if u < 0.0 {
            return order[j];
        }
    }
    order[keep - 1]
}

/// Top-k by partial selection draws what a sort of the whole vocabulary would, tied logits
/// included (the logits are rounded to few values, so many tie with the k-th).
#[test]
fn top_k_selection_draws_as_a_full_sort_would() {
    use rand::{Rng, SeedableRng};
    let mut gen = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    for case in 0..300u64 {
        let n = 2048;
        let levels = [4.0, 16.0, 1e6][case as usize % 3];
        let logits: Vec<f32> = (0..n)
            .map(|_| (gen.random::<f32>() * levels).round() / levels * 8.0)
            .collect();
        let p = sampled(0.9, 50, [1.0, 0.8][case as usize % 2]);
        let mut s = Sampler::new(case);
        let mut draws = rand_chacha::ChaCha8Rng::seed_from_u64(case);
        for _ in 0..4 {
            let u = draws.random::<f64>();
            assert_eq!(
                s.sample(&logits, &p),
                full_sort_draw(&logits, &p, u),
                "case {case}"
            );
        }
    }
}
