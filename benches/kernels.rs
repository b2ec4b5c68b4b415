//! The code predictor's quantized kernels alone (packed q4_K, q5_K and q8_0 rows,
//! `code_predictor::q4k16::mat_vnni`, `mat_vnni5`, `code_predictor::q8::mat_packed`; q8_0 rows as
//! the file has them, `code_predictor::q8::mat_vnni`), one thread, one input, on working sets that stay in L2
//! (1 MiB), fit in this machine's L3 (48 MiB, about the code predictor's 45 MB of q4_K layers)
//! and come from memory (384 MiB, more than the talker's 236 MB); beside each, in the same run,
//! a plain AVX-512 summing loop over the same bytes: the read bandwidth the kernel could reach
//! from where its weights are.
//!
//! Run with: `cargo bench --bench kernels`. Criterion prints bytes per second (throughput);
//! the matrices are 3072 × 1024 (the code predictor's gate and up shape), copies of one
//! quantized matrix, read round-robin.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use qtts::code_predictor::{q4k16, q8};
use qtts::ffi::MatKernel;
use qtts::gguf::GgmlType;
use rand::{Rng, SeedableRng};

const ROWS: usize = 3072;
const K: usize = 1024;

/// Sums `bytes` as 64-byte vectors of i32 (so the loads cannot be skipped).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_bytes(bytes: &[u8]) -> i32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let chunks = bytes.chunks_exact(256);
    for c in chunks {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: 64 bytes of the 256-byte chunk.
            let v = unsafe { _mm512_loadu_si512(c.as_ptr().add(64 * i).cast()) };
            *a = _mm512_add_epi32(*a, v);
        }
    }
    let s = _mm512_add_epi32(
        _mm512_add_epi32(acc[0], acc[1]),
        _mm512_add_epi32(acc[2], acc[3]),
    );
    _mm512_reduce_add_epi32(s)
}

fn bench(c: &mut Criterion) {
    if !qtts::code_predictor::q4k::available() {
        eprintln!("kernels: no AVX-512 VNNI on this CPU, bench skipped");
        return;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let w: Vec<f32> = (0..ROWS * K)
        .map(|_| rng.random_range(-0.1f32..0.1))
        .collect();
    let x: Vec<f32> = (0..K).map(|_| rng.random_range(-2f32..2.0)).collect();
    let mut y = vec![0f32; ROWS];
    type Pack = fn(&mut [u8], usize, usize);
    for (label, ty, pack, kernel) in [
        (
            "q4_K packed",
            GgmlType::Q4K,
            q4k16::pack as Pack,
            q4k16::mat_vnni as MatKernel,
        ),
        ("q5_K packed", GgmlType::Q5K, q4k16::pack5, q4k16::mat_vnni5),
        ("q8_0 packed", GgmlType::Q8_0, q8::pack, q8::mat_packed),
        // q8_0 rows as the file has them: the packed kernel's baseline.
        ("q8_0 rows", GgmlType::Q8_0, |_, _, _| {}, q8::mat_vnni),
    ] {
        let mut one = qtts::ffi::quantize(ty, &w, K).unwrap();
        let row_bytes = one.len() / ROWS;
        pack(&mut one, ROWS, row_bytes);
        for (place, set) in [
            ("L2, 1 MiB", 1usize << 20),
            ("L3, 48 MiB", 48 << 20),
            ("memory, 384 MiB", 384 << 20),
        ] {
            let mats = set.div_ceil(one.len()).max(1);
            // Rows of the first matrix only when the set is smaller than one matrix.
            let rows = if set < one.len() {
                set / row_bytes / q4k16::GROUP * q4k16::GROUP
            } else {
                ROWS
            };
            let all: Vec<u8> = one[..rows * row_bytes].repeat(mats);
            let bytes = all.len();
            let mut g = c.benchmark_group(format!("{label}, 1 thread, {place}"));
            g.throughput(Throughput::Bytes(bytes as u64));
            g.sample_size(20);
            g.bench_function("sum of the bytes (read bandwidth)", |b| {
                // SAFETY: the CPU has AVX-512 F (checked above, with VNNI).
                b.iter(|| unsafe { sum_bytes(std::hint::black_box(&all)) })
            });
            g.bench_function("kernel, 1 input", |b| {
                b.iter(|| {
                    for m in all.chunks_exact(rows * row_bytes) {
                        // SAFETY: `rows` packed rows (whole groups) of K weights, one input of
                        // K, `rows` outputs; the CPU has VNNI (checked above).
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
            g.finish();
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
