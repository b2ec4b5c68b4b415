//! The packed quantized kernels alone (`qtts::kernels::quant`: q4_K, q5_K and q8_0 rows packed
//! 16 at a time), for every kernel tier this CPU runs, one thread, one input, on working sets
//! that stay in L2 (1 MiB), fit in L3 (48 MiB, about the code predictor's 45 MB of q4_K layers)
//! and come from memory (384 MiB, more than the talker's 236 MB); beside each, in the same run,
//! a plain summing loop over the same bytes (`qtts::kernels::read_all`): the read bandwidth the
//! kernel could reach from where its weights are.
//!
//! Run with: `cargo bench --bench kernels`. Criterion prints bytes per second (throughput);
//! the matrices are 3072 × 1024 (the code predictor's gate and up shape), copies of one
//! quantized matrix, read round-robin.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qtts::kernels::quant::{self, QType, GROUP};
use rand::{Rng, SeedableRng};

const ROWS: usize = 3072;
const K: usize = 1024;

fn bench(c: &mut Criterion) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let w: Vec<f32> = (0..ROWS * K)
        .map(|_| rng.random_range(-0.1f32..0.1))
        .collect();
    let x: Vec<f32> = (0..K).map(|_| rng.random_range(-2f32..2.0)).collect();
    let mut y = vec![0f32; ROWS];
    let mut tiers = Vec::new();
    qtts::kernels::for_each_tier(|t| tiers.push(t));
    for ty in QType::ALL {
        let mut one = qtts::ffi::quantize(ty.ggml(), &w, K).unwrap();
        let row_bytes = one.len() / ROWS;
        quant::pack(ty, &mut one, ROWS);
        for (place, set) in [
            ("L2, 1 MiB", 1usize << 20),
            ("L3, 48 MiB", 48 << 20),
            ("memory, 384 MiB", 384 << 20),
        ] {
            let mats = set.div_ceil(one.len()).max(1);
            // Rows of the first matrix only when the set is smaller than one matrix.
            let rows = if set < one.len() {
                set / row_bytes / GROUP * GROUP
            } else {
                ROWS
            };
            let all: Vec<u8> = one[..rows * row_bytes].repeat(mats);
            let bytes = all.len();
            let mut g = c.benchmark_group(format!("{ty:?} packed, 1 thread, {place}"));
            g.throughput(Throughput::Bytes(bytes as u64));
            g.sample_size(20);
            g.bench_function("sum of the bytes (read bandwidth)", |b| {
                b.iter(|| qtts::kernels::read_all(std::hint::black_box(&all)))
            });
            for &tier in &tiers {
                let Some(kernel) = quant::packed_kernel(ty, tier.caps()) else {
                    continue;
                };
                g.bench_function(format!("{tier} kernel, 1 input"), |b| {
                    b.iter(|| {
                        for m in all.chunks_exact(rows * row_bytes) {
                            // SAFETY: `rows` packed rows (whole groups) of K weights, one input
                            // of K, `rows` outputs; the kernel is a tier's this CPU runs.
                            unsafe {
                                kernel(
                                    m.as_ptr(),
                                    row_bytes,
                                    rows,
                                    K,
                                    x.as_ptr(),
                                    1,
                                    y.as_mut_ptr(),
                                    rows,
                                )
                            }
                        }
                        std::hint::black_box(&y);
                    })
                });
            }
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
