//! What quantization costs, teacher-forced against f32 on the same inputs (full-size random-weight
//! 0.6B CustomVoice): the talker's codec logits and the code predictor's logits, cosine similarity
//! (mean and worst row) and top-1 agreement, at q8_0, q6_k, q5_k and q4_k, the talker on llama.cpp (q8_0 KV
//! cache) and on its own graph (f16 KV cache, the engine's kernels); and the decoder's waveform SNR with
//! its matrices as bf16 (where the CPU has AMX) and q8_0 (`EngineConfig::decoder`); and, per type,
//! the SNR of the talker's and code predictor's quantized matrices themselves against f32.
//!
//! The f32 run generates `QTTS_BENCH_FRAMES` frames (16) greedily; its prompt rows, step inputs,
//! talker hidden states and codes are then fed to the quantized models.
//!
//! Run: `cargo bench --bench quality` (`QTTS_BENCH_TYPES=q4_k,q5_k` for only those types)

#[path = "common/mod.rs"]
mod common;

use qtts::code_predictor::{CodePredictor, LayerKernel};
use qtts::engine::DecoderWeights;
use qtts::ffi::{EmbdBatch, LlamaContext, Threadpool};
use qtts::gguf::GgufFile;
use qtts::model::convert::OutType;
use qtts::sampling::{argmax, SamplingParams};
use qtts::talker::{graph, GenOptions, Next, Session, Talker, TextInput, TextMode, Voice};

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-30)
}

/// Mean cosine, worst cosine and top-1 agreement of row-major `rows` of width `w`.
fn compare(reference: &[f32], got: &[f32], w: usize) -> (f64, f64, f64) {
    let n = reference.len() / w;
    let (mut sum, mut worst, mut same) = (0.0, 1.0f64, 0);
    for i in 0..n {
        let (a, b) = (&reference[i * w..(i + 1) * w], &got[i * w..(i + 1) * w]);
        let c = cosine(a, b);
        sum += c;
        worst = worst.min(c);
        same += usize::from(argmax(a) == argmax(b));
    }
    (sum / n as f64, worst, same as f64 / n as f64)
}

/// Signal-to-noise ratio (dB) of the quantized matrices of `q` whose names start with `prefix`
/// against the same tensors of `reference` (f32), both dequantized with ggml's own routine, and
/// how many matrices that is. Tensors left in f32 by the conversion are skipped.
fn weights_snr(reference: &GgufFile, q: &GgufFile, prefix: &str) -> (f64, usize) {
    let (mut signal, mut noise, mut count) = (0f64, 0f64, 0);
    for t in q
        .header
        .tensors
        .iter()
        .filter(|t| t.name.starts_with(prefix))
    {
        if t.ty == qtts::gguf::GgmlType::F32 {
            continue;
        }
        let r = reference.header.tensor(&t.name).unwrap();
        assert_eq!(t.ne, r.ne, "{}: the same shape in both files", t.name);
        let n = t.ne.iter().product::<u64>() as usize;
        let a = qtts::ffi::dequantize(r.ty, reference.tensor_data(&t.name).unwrap(), n).unwrap();
        let b = qtts::ffi::dequantize(t.ty, q.tensor_data(&t.name).unwrap(), n).unwrap();
        for (&x, &y) in a.iter().zip(&b) {
            signal += (x as f64).powi(2);
            noise += ((x - y) as f64).powi(2);
        }
        count += 1;
    }
    (10.0 * (signal / noise.max(1e-30)).log10(), count)
}

fn main() {
    let frames: usize = std::env::var("QTTS_BENCH_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let dir = common::models(&[
        OutType::F32,
        OutType::Q8_0,
        OutType::Q6K,
        OutType::Q5K,
        OutType::Q4K,
    ]);
    let path = |kind: &str, ty: OutType| dir.join(format!("{kind}-{}.gguf", ty.name()));
    let pool = Threadpool::new(2, &[]).unwrap();
    // `QTTS_BENCH_TYPES=q4_k,q8_0` measures only those (all four by default).
    let only = std::env::var("QTTS_BENCH_TYPES").ok();
    let types: Vec<OutType> = [OutType::Q8_0, OutType::Q6K, OutType::Q5K, OutType::Q4K]
        .into_iter()
        .filter(|t| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|n| n == t.name()))
        })
        .collect();

    // The f32 reference run.
    let talker = Talker::load(path("talker", OutType::F32)).unwrap();
    let h = talker.n_embd();
    let voice = Voice {
        speaker: Some("vivian".into()),
        language: Some("english".into()),
        ..Voice::default()
    };
    let prompt = talker
        .prompt(
            &TextInput::Text("The quick brown fox jumps over the lazy dog.".into()),
            &voice,
            TextMode::Streaming,
        )
        .unwrap();
    let mut cp =
        CodePredictor::load(&GgufFile::open(path("mmproj", OutType::F32)).unwrap()).unwrap();
    let mut session = Session::new(&talker, 512, 2, None, true).unwrap();
    let opts = GenOptions {
        sampling: SamplingParams::GREEDY,
        repetition_penalty: 1.05,
        seed: 0,
        max_frames: Some(frames + 1),
        min_frames: frames + 1,
    };
    // Greedy frames; the rows fed to the talker are kept as the teacher-forced inputs.
    let mut codes: Vec<[u32; 16]> = Vec::new();
    let mut rows = prompt.rows.clone();
    let mut e = vec![0.0; h];
    let mut next = session.start(&prompt, &opts).unwrap();
    while let Next::Code(c0) = next {
        let rest = cp
            .frame(&pool, session.hidden(), c0, &mut |_, l| argmax(l), None)
            .unwrap();
        let mut frame = [c0; 16];
        frame[1..].copy_from_slice(&rest);
        codes.push(frame);
        if codes.len() == frames {
            break;
        }
        cp.embed_frame(&frame, &mut e).unwrap();
        next = session.feed(&e).unwrap();
        rows.extend_from_slice(session.last_input());
    }
    let n_prompt = prompt.len();

    let forward = |ty: OutType| -> (Vec<f32>, Vec<f32>) {
        let model = qtts::ffi::LlamaModel::load(
            &qtts::model::validate::talker(&path("talker", ty)).unwrap(),
        )
        .unwrap();
        let mut ctx = LlamaContext::with_kv(&model, 512, 2, ty == OutType::F32).unwrap();
        let n = rows.len() / h;
        let mut batch = EmbdBatch::new(n, h);
        for t in 0..n {
            batch
                .push(&rows[t * h..(t + 1) * h], t as i32, t + 1 >= n_prompt)
                .unwrap();
        }
        ctx.decode(&mut batch).unwrap();
        let (mut logits, mut hidden) = (Vec::new(), Vec::new());
        for t in n_prompt - 1..n {
            let l = ctx.logits(t as i32).unwrap();
            logits.extend_from_slice(&l[l.len() - 3072..]);
            hidden.extend_from_slice(ctx.embeddings(t as i32).unwrap());
        }
        (logits, hidden)
    };
    let (ref_logits, ref_hidden) = forward(OutType::F32);
    // The same rows through the talker's own graph (the default where the CPU has AVX-512 VNNI):
    // the prompt as one prefill, then one row per step, f16 caches.
    let forward_graph = |ty: OutType| -> Vec<f32> {
        let f = GgufFile::open(path("talker", ty)).unwrap();
        let layers = graph::Layers::load(&f, LayerKernel::fastest()).unwrap();
        let mut state = graph::State::new(&layers, 512, false).unwrap();
        let n = rows.len() / h;
        state.run(&rows[..n_prompt * h], 0, &pool).unwrap();
        let mut logits = state.logits().to_vec();
        for t in n_prompt..n {
            state.run(&rows[t * h..(t + 1) * h], t, &pool).unwrap();
            logits.extend_from_slice(state.logits());
        }
        logits
    };
    let cp_logits = |ty: OutType| -> Vec<f32> {
        let mut cp = CodePredictor::load(&GgufFile::open(path("mmproj", ty)).unwrap()).unwrap();
        // As the engine runs it (`EngineConfig::code_predictor_kernel`): q8_0 heads packed where the CPU can.
        cp.pack_heads();
        let mut out = Vec::new();
        for (f, c) in codes.iter().enumerate() {
            cp.frame(
                &pool,
                &ref_hidden[f * h..(f + 1) * h],
                c[0],
                &mut |g, l| {
                    out.extend_from_slice(l);
                    c[g + 1]
                },
                None,
            )
            .unwrap();
        }
        out
    };
    let ref_cp = cp_logits(OutType::F32);
    println!("teacher-forced against f32, {frames} frames of the full-size random 0.6B model");
    println!(
        "{:<8} {:<16} {:>12} {:>12} {:>8}",
        "type", "logits", "mean cosine", "worst", "top-1"
    );
    for &ty in &types {
        let (l, _) = forward(ty);
        let (m, w, t) = compare(&ref_logits, &l, 3072);
        println!(
            "{:<8} {:<16} {m:>12.6} {w:>12.6} {:>7.1}%",
            ty.name(),
            "talker",
            t * 100.0
        );
        let (m, w, t) = compare(&ref_logits, &forward_graph(ty), 3072);
        println!(
            "{:<8} {:<16} {m:>12.6} {w:>12.6} {:>7.1}%",
            ty.name(),
            "talker (graph)",
            t * 100.0
        );
        let (m, w, t) = compare(&ref_cp, &cp_logits(ty), 2048);
        println!(
            "{:<8} {:<16} {m:>12.6} {w:>12.6} {:>7.1}%",
            ty.name(),
            "code predictor",
            t * 100.0
        );
    }
    // What the logits' cosines come from: the quantized matrices' own error.
    let references = [
        ("talker", "blk.", "talker layers"),
        ("mmproj", "a.gen.code.blk.", "code predictor layers"),
    ]
    .map(|(kind, prefix, what)| {
        let f = GgufFile::open(path(kind, OutType::F32)).unwrap();
        (kind, prefix, what, f)
    });
    for &ty in &types {
        for (kind, prefix, what, reference) in &references {
            let q = GgufFile::open(path(kind, ty)).unwrap();
            let (snr, n) = weights_snr(reference, &q, prefix);
            println!(
                "{:<8} {what} weights: SNR {snr:.2} dB against f32 ({n} quantized matrices)",
                ty.name()
            );
        }
    }

    // The decoder with bf16 and q8_0 matrices against f32, on the reference codes, before the
    // clamp (the random decoder saturates).
    let f = GgufFile::open(path("mmproj", OutType::F32)).unwrap();
    let decode_file = |f: &GgufFile, w: DecoderWeights| {
        let mut voc = w.load(f, false).unwrap();
        voc.set_capture(true);
        let mut out = vec![0f32; codes.len() * 1920];
        voc.decode_frames(&pool, &codes, &mut out).unwrap();
        voc.take_capture().remove("decoder.6").unwrap_or_default()
    };
    let decode = |w: DecoderWeights| decode_file(&f, w);
    let exact = decode(DecoderWeights::F32);
    let report = |label: &str, b: &[f32]| {
        println!(
            "decoder, {label}: SNR {:.1} dB against f32 (before the clamp, {} samples)",
            qtts::metrics::snr_db(&exact, b),
            exact.len()
        )
    };
    for k in [
        qtts::kernels::bf16::Kernel::Amx,
        qtts::kernels::bf16::Kernel::Avx512,
    ] {
        if !k.available() {
            println!("decoder, bf16 matrices by {k:?}: skipped, this CPU lacks the instructions");
            continue;
        }
        let mut voc = qtts::decoder::Decoder::load_bf16(&f, k).unwrap();
        voc.set_capture(true);
        let mut out = vec![0f32; codes.len() * 1920];
        voc.decode_frames(&pool, &codes, &mut out).unwrap();
        let b = voc.take_capture().remove("decoder.6").unwrap_or_default();
        report(&format!("bf16 matrices by {k:?}"), &b);
    }
    report("q8_0 matrices", &decode(DecoderWeights::Q8_0));
    report("f16 weights", &decode(DecoderWeights::F16));
    // Each file's decoder as the engine loads it by default: the matrices in the file's types.
    let default = DecoderWeights::fastest();
    for &ty in &types {
        let f = GgufFile::open(path("mmproj", ty)).unwrap();
        println!(
            "decoder of mmproj-{}.gguf, {} (the default): SNR {:.1} dB against f32",
            ty.name(),
            default.name(),
            qtts::metrics::snr_db(&exact, &decode_file(&f, default))
        );
    }
}
