use qtts::code_predictor::q4k;
fn main() {
    let n = std::env::args().nth(1).unwrap().parse::<usize>().unwrap();
    let reps = std::env::args().nth(2).unwrap().parse::<usize>().unwrap();
    let k = 1024;
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4)
        .collect();
    let q = qtts::ffi::quantize(qtts::gguf::GgmlType::Q4K, &w, k).unwrap();
    let x: Vec<f32> = (0..k).map(|i| (i as f32).sin()).collect();
    let mut y = vec![0f32; n];
    let rb = k / 256 * 144;
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = std::time::Instant::now();
        unsafe { q4k::mat_vnni(q.as_ptr(), rb, n, k, x.as_ptr(), 1, y.as_mut_ptr(), n) };
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "{} KB: {:.3} ms, {:.1} GB/s, {:.1} ns/block",
        q.len() >> 10,
        best * 1e3,
        q.len() as f64 / best / 1e9,
        best * 1e9 / (q.len() / 144) as f64
    );
}
