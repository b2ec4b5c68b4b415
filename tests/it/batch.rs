//! Several streams' steps in one batch (continuous batching): each stream's results are the bits
//! it gets alone, whoever runs beside it and whenever it joins or leaves.

use crate::common;

use common::max_abs;
use qtts::code_predictor::LayerKernel;
use qtts::model::convert::OutType;
use qtts::sampling::SamplingParams;
use qtts::talker::graph::Batch;
use qtts::talker::{GenOptions, Next, Runtime, Session, Talker, TextInput, TextMode, Voice};

/// The crate's kernels this process runs: scalar, and packed where the tier has them (the
/// tier without is named as skipped).
fn kernels() -> Vec<LayerKernel> {
    let mut v = vec![LayerKernel::Scalar];
    if LayerKernel::fastest() == LayerKernel::Packed {
        v.push(LayerKernel::Packed);
    } else {
        eprintln!(
            "packed kernels: skipped, kernel tier {} has none",
            qtts::kernels::active()
        );
    }
    v
}

/// A stream of the test: its text, seed and frame cap, and the step at which it joins.
struct Stream {
    text: &'static str,
    speaker: &'static str,
    seed: u64,
    frames: usize,
    joins: usize,
}

const STREAMS: [Stream; 3] = [
    Stream {
        text: "The first stream speaks a longer sentence than the others.",
        speaker: "Vivian",
        seed: 1,
        frames: 14,
        joins: 0,
    },
    Stream {
        text: "A second one joins.",
        speaker: "Ryan",
        seed: 2,
        frames: 6,
        joins: 2,
    },
    Stream {
        text: "And a third, later.",
        speaker: "Vivian",
        seed: 3,
        frames: 9,
        joins: 4,
    },
];

/// What one stream computed: per step its code, hidden state and raw logits.
#[derive(Debug, Default, PartialEq)]
struct Trace {
    codes: Vec<u32>,
    hidden: Vec<f32>,
    logits: Vec<f32>,
}

impl Trace {
    fn record(&mut self, s: &Session<'_>, code: u32) {
        self.codes.push(code);
        self.hidden.extend_from_slice(s.hidden());
        self.logits.extend_from_slice(s.raw_logits().unwrap());
    }

    fn same_bits(&self, other: &Trace) -> bool {
        let bits = |a: &[f32], b: &[f32]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        };
        self.codes == other.codes
            && bits(&self.hidden, &other.hidden)
            && bits(&self.logits, &other.logits)
    }
}

/// The frame fed back after `code` (a stand-in for the code predictor's embedding: any row does,
/// as long as both runs feed the same).
fn embedded(code: u32, step: usize, h: usize) -> Vec<f32> {
    (0..h)
        .map(|i| (((code as usize * 31 + step * 17 + i * 7) % 97) as f32 / 97.0 - 0.5) * 0.1)
        .collect()
}

fn options(s: &Stream, g: &qtts::model::config::GenerationConfig) -> GenOptions {
    let mut o = GenOptions::from_config(g, s.seed);
    o.max_frames = Some(s.frames);
    o.sampling = SamplingParams {
        temperature: 0.9,
        ..o.sampling
    };
    o
}

/// Talker sessions stepped together in one batch give each stream the codes, hidden states and
/// logits it gets stepped alone, to the bit: streams joining at different steps, leaving at
/// their caps at different steps, sampled with their own seeds; under the scalar and the
/// packed kernels.
#[test]
fn talker_steps_in_a_batch_are_each_streams_own() {
    let (_tmp, out) = common::random_converted(&common::tiny_talker_256(), 21, OutType::Q8_0);
    for kernel in kernels() {
        let talker = Talker::load_with(&out.talker, Runtime::Graph(kernel)).unwrap();
        let h = talker.n_embd();
        let g = talker.generation_config().clone();
        let pool = qtts::ffi::Threadpool::new(2, &[]).unwrap();
        let prompts: Vec<_> = STREAMS
            .iter()
            .map(|s| {
                let voice = Voice {
                    speaker: Some(s.speaker.into()),
                    language: Some("English".into()),
                    ..Voice::default()
                };
                talker
                    .prompt(&TextInput::Text(s.text.into()), &voice, TextMode::Streaming)
                    .unwrap()
            })
            .collect();
        let session = || Session::new(&talker, 128, 2, Some((&pool, None)), false).unwrap();

        // Alone.
        let alone: Vec<Trace> = STREAMS
            .iter()
            .zip(&prompts)
            .map(|(s, p)| {
                let mut ses = session();
                assert!(ses.batches(), "{kernel:?}: q8_0 caches batch");
                let mut t = Trace::default();
                let mut next = ses.start(p, &options(s, &g)).unwrap();
                while let Next::Code(c) = next {
                    t.record(&ses, c);
                    next = ses.feed(&embedded(c, t.codes.len(), h)).unwrap();
                }
                t
            })
            .collect();
        assert!(alone.iter().all(|t| t.codes.len() > 1));

        // Together: each joins at its step, all running ones stepped in one batch.
        let mut sessions: Vec<Session<'_>> = STREAMS.iter().map(|_| session()).collect();
        let mut traces: Vec<Trace> = STREAMS.iter().map(|_| Trace::default()).collect();
        let mut running = vec![false; STREAMS.len()];
        let mut last = vec![0u32; STREAMS.len()];
        let mut batch = Batch::default();
        let mut sizes = Vec::new();
        for step in 0.. {
            for (i, s) in STREAMS.iter().enumerate() {
                if s.joins == step {
                    match sessions[i].start(&prompts[i], &options(s, &g)).unwrap() {
                        Next::Code(c) => {
                            traces[i].record(&sessions[i], c);
                            (running[i], last[i]) = (true, c);
                        }
                        Next::Stop(_) => {}
                    }
                }
            }
            let ids: Vec<usize> = (0..STREAMS.len()).filter(|&i| running[i]).collect();
            if ids.is_empty() && step > STREAMS.iter().map(|s| s.joins).max().unwrap() {
                break;
            }
            let rows: Vec<Vec<f32>> = ids
                .iter()
                .map(|&i| embedded(last[i], traces[i].codes.len(), h))
                .collect();
            let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
            let mut picked: Vec<&mut Session<'_>> = sessions
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| running[*i])
                .map(|(_, s)| s)
                .collect();
            sizes.push(picked.len());
            let results = Session::feed_together(&mut picked, &refs, &mut batch);
            drop(picked);
            for (&i, r) in ids.iter().zip(results) {
                match r.unwrap() {
                    Next::Code(c) => {
                        traces[i].record(&sessions[i], c);
                        last[i] = c;
                    }
                    Next::Stop(_) => running[i] = false,
                }
            }
        }
        assert!(
            sizes.contains(&3),
            "{kernel:?}: three streams at once ({sizes:?})"
        );
        for (i, (a, b)) in alone.iter().zip(&traces).enumerate() {
            assert!(
                a.same_bits(b),
                "{kernel:?}: stream {i} differs in a batch: codes {:?} / {:?}, logits by {}",
                a.codes,
                b.codes,
                max_abs(&a.logits, &b.logits)
            );
        }
    }
}

/// Code-predictor frames of several streams in one batch give each row the codes and the logits
/// (to the bit) of its frame alone, sampled with its own seed: 2 to 5 rows, under the scalar and
/// packed kernels, with the sample heads on the host and packed in the graphs. On a code
/// predictor 256 wide (q8_0 layers: one graph for all rows), and on one 48 wide (its layers
/// stay f32, whose ggml products are not each row's own: the rows run one after the other).
#[test]
fn code_predictor_frames_in_a_batch_are_each_rows_own() {
    use qtts::code_predictor::CodePredictor;
    use qtts::gguf::GgufFile;
    use qtts::sampling::Sampler;
    let models = [
        (
            common::random_converted(&common::tiny_talker_256(), 22, OutType::Q8_0),
            true,
        ),
        (
            common::random_converted(&common::narrow_code_predictor(), 22, OutType::Q8_0),
            false,
        ),
    ];
    let pool = qtts::ffi::Threadpool::new(2, &[]).unwrap();
    let params = SamplingParams {
        do_sample: true,
        temperature: 0.9,
        top_k: 50,
        top_p: 1.0,
    };
    for (kernel, ((_tmp, out), batched)) in kernels()
        .into_iter()
        .flat_map(|k| models.iter().map(move |m| (k, m)))
    {
        let f = GgufFile::open(&out.mmproj).unwrap();
        for packed_heads in [false, true] {
            let mut cp = CodePredictor::load(&f).unwrap();
            cp.set_layer_kernel(kernel).unwrap();
            assert_eq!(cp.batches(), *batched, "{kernel:?}");
            if packed_heads && !cp.pack_heads() {
                eprintln!(
                    "packed heads: skipped ({} wide, kernel tier {}: f32 heads, or no packed \
                     kernel)",
                    cp.geometry().n_embd,
                    qtts::kernels::active()
                );
                continue;
            }
            let n_talker = cp.geometry().n_talker;
            let hidden: Vec<Vec<f32>> = (0..5)
                .map(|r| {
                    (0..n_talker)
                        .map(|i| (((i * 13 + r * 101) % 89) as f32 / 89.0 - 0.5) * 2.0)
                        .collect()
                })
                .collect();
            let code0 = |r: usize| (r * 397 % 2048) as u32;
            // Each row alone, twice (the frame before must not matter).
            let mut alone_logits = vec![Vec::new(); 5];
            let alone: Vec<[u32; 15]> = (0..5)
                .map(|r| {
                    let mut s = Sampler::new(100 + r as u64);
                    let logits = &mut alone_logits[r];
                    cp.frame(
                        &pool,
                        &hidden[r],
                        code0(r),
                        &mut |_, l| {
                            logits.extend(common::bits(l));
                            s.sample(l, &params)
                        },
                        None,
                    )
                    .unwrap()
                })
                .collect();
            for n in [2, 3, 5, 2] {
                let inputs: Vec<(&[f32], u32)> =
                    (0..n).map(|r| (hidden[r].as_slice(), code0(r))).collect();
                let mut samplers: Vec<Sampler> =
                    (0..n).map(|r| Sampler::new(100 + r as u64)).collect();
                let mut logits = vec![Vec::new(); n];
                let got = cp
                    .frames(&pool, &inputs, &mut |r, _, l| {
                        logits[r].extend(common::bits(l));
                        samplers[r].sample(l, &params)
                    })
                    .unwrap();
                let what = format!("{kernel:?}, batched {batched}, packed heads {packed_heads}");
                assert_eq!(got, alone[..n], "{what}: {n} rows");
                // A sampled pick can turn on a logit's last bit.
                for (r, l) in logits.iter().enumerate() {
                    let at = l.iter().zip(&alone_logits[r]).position(|(a, b)| a != b);
                    assert_eq!(at, None, "{what}: {n} rows, row {r}'s logits differ at");
                }
            }
            // Rows in another order are still each their own.
            let order = [3, 0, 4];
            let inputs: Vec<(&[f32], u32)> = order
                .iter()
                .map(|&r| (hidden[r].as_slice(), code0(r)))
                .collect();
            let mut samplers: Vec<Sampler> = order
                .iter()
                .map(|&r| Sampler::new(100 + r as u64))
                .collect();
            let got = cp
                .frames(&pool, &inputs, &mut |i, _, l| {
                    samplers[i].sample(l, &params)
                })
                .unwrap();
            let want: Vec<[u32; 15]> = order.iter().map(|&r| alone[r]).collect();
            assert_eq!(got, want, "{kernel:?}: rows reordered");
        }
    }
}

/// A request of the engine tests below: seeded sampling, its own text and frame cap.
fn request(text: &str, speaker: &str, seed: u64, frames: usize) -> qtts::engine::Request {
    let mut req = qtts::engine::Request::text(text);
    req.voice = Voice {
        speaker: Some(speaker.into()),
        language: Some("English".into()),
        ..Voice::default()
    };
    req.seed = seed;
    req.max_frames = Some(frames);
    req.keep_codes = true;
    req
}

fn batch_engine(out: &qtts::model::convert::Converted, streams: usize) -> qtts::engine::Engine {
    let cfg = qtts::engine::EngineConfig {
        plan: qtts::engine::ThreadPlan::for_cores(2),
        n_ctx: 256,
        max_streams: streams,
        ..qtts::engine::EngineConfig::default()
    };
    qtts::engine::Engine::load(&common::files(out), cfg).unwrap()
}

/// What a request gave: its codes, samples and stop.
type Outcome = (Vec<[u32; 16]>, Vec<f32>, qtts::talker::StopReason);

fn outcome(s: qtts::engine::Synthesis<'_>) -> Outcome {
    let (summary, sink) = s.wait();
    let summary = summary.unwrap();
    let sink: qtts::audio::MemorySink = qtts::engine::downcast_sink(sink).unwrap();
    let most = summary.metrics.streams.max();
    eprintln!(
        "{} frames, at most {most} streams in a step",
        summary.codes.len()
    );
    (summary.codes, sink.samples, summary.stop)
}

/// Waits until `s` has made `n` frames (the order of events, not their time, is the test's).
fn after_frames(s: &qtts::engine::Synthesis<'_>, n: usize) {
    while s.frames() < n {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn same_bits(a: &Outcome, b: &Outcome) -> bool {
    if a.0 != b.0 || a.1.len() != b.1.len() {
        let first = a.0.iter().zip(&b.0).position(|(x, y)| x != y);
        if let Some(f) = first {
            eprintln!("frame {f}: {:?}\n      vs {:?}", a.0[f], b.0[f]);
        }
        eprintln!(
            "codes {} / {} frames, first differing frame {first:?}; samples {} / {}; stops {:?} / {:?}",
            a.0.len(),
            b.0.len(),
            a.1.len(),
            b.1.len(),
            a.2,
            b.2
        );
    }
    a.0 == b.0
        && a.2 == b.2
        && a.1.len() == b.1.len()
        && a.1
            .iter()
            .zip(&b.1)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The engine with three slots: requests that join while others run (after 3 and 6 frames of
/// the first), one of them split into two utterances, get the codes and samples they get alone,
/// to the bit; a request cancelled while others run stops alone and the others play on, equal
/// to their runs alone.
#[test]
fn engine_streams_at_once_are_each_what_they_are_alone() {
    let (_tmp, out) = common::random_converted(&common::tiny_talker_256(), 23, OutType::Q8_0);
    let engine = batch_engine(&out, 3);
    let long = "The first request speaks the longest text of the three. \
                It has a second sentence, spoken as a second utterance.";
    let reqs = [
        request(long, "Vivian", 5, 20),
        request("A second voice joins in.", "Ryan", 6, 12),
        request("A third, a little later.", "Vivian", 7, 9),
    ];
    let mut split = reqs[0].clone();
    split.max_frames = None;
    split.frame_limit = Some(24);
    let reqs = [split, reqs[1].clone(), reqs[2].clone()];
    let alone: Vec<Outcome> = reqs
        .iter()
        .map(|r| outcome(engine.start(r.clone(), Box::new(qtts::audio::MemorySink::default()))))
        .collect();
    assert!(
        alone.iter().all(|o| o.0.len() > 3),
        "{:?}",
        alone.iter().map(|o| o.0.len()).collect::<Vec<_>>()
    );
    for round in 0..2 {
        let sink = || Box::new(qtts::audio::MemorySink::default());
        let a = engine.start(reqs[0].clone(), sink());
        after_frames(&a, 3);
        let b = engine.start(reqs[1].clone(), sink());
        after_frames(&b, 2);
        let c = engine.start(reqs[2].clone(), sink());
        let got = [outcome(a), outcome(b), outcome(c)];
        for (i, (x, y)) in alone.iter().zip(&got).enumerate() {
            assert!(
                same_bits(x, y),
                "round {round}, request {i}: {} / {} frames, by {}",
                x.0.len(),
                y.0.len(),
                max_abs(&x.1, &y.1)
            );
        }
    }
    // One cancelled while the others go on.
    let sink = || Box::new(qtts::audio::MemorySink::default());
    let a = engine.start(reqs[0].clone(), sink());
    let b = engine.start(reqs[1].clone(), sink());
    after_frames(&b, 2);
    b.cancel();
    let c = engine.start(reqs[2].clone(), sink());
    let (ga, gb, gc) = (outcome(a), outcome(b), outcome(c));
    assert_eq!(gb.2, qtts::talker::StopReason::Cancelled);
    assert!(gb.0.len() < alone[1].0.len());
    assert!(
        same_bits(&alone[0], &ga),
        "the first, beside a cancelled one"
    );
    assert!(
        same_bits(&alone[2], &gc),
        "the third, after a cancelled one"
    );
}

/// A worker with three streams: jobs read one after the other from one thread (each job's
/// chunk queue fills while another is read) all complete, each equal to its run alone: a
/// reader that is behind holds back its own stream, not the others.
#[test]
fn a_worker_runs_streams_at_once_and_a_slow_reader_holds_back_only_its_own() {
    let (_tmp, out) = common::random_converted(&common::tiny_talker_256(), 24, OutType::Q8_0);
    let reqs = [
        request(
            "The first of three, read last and longest of all.",
            "Vivian",
            8,
            60,
        ),
        request("The second one.", "Ryan", 9, 40),
        request("And the third.", "Vivian", 10, 50),
    ];
    let cfg = qtts::engine::EngineConfig {
        plan: qtts::engine::ThreadPlan::for_cores(2),
        n_ctx: 256,
        max_streams: 3,
        decoder_chunk: 1,
        ..qtts::engine::EngineConfig::default()
    };
    let alone: Vec<Outcome> = {
        let one = qtts::engine::EngineConfig {
            max_streams: 1,
            ..cfg.clone()
        };
        let engine = qtts::engine::Engine::load(&common::files(&out), one).unwrap();
        reqs.iter()
            .map(|r| outcome(engine.start(r.clone(), Box::new(qtts::audio::MemorySink::default()))))
            .collect()
    };
    let worker = qtts::engine::Worker::load(&common::files(&out), cfg, 4).unwrap();
    let jobs: Vec<_> = reqs
        .iter()
        .map(|r| worker.submit(r.clone()).unwrap())
        .collect();
    // Read the last first: the others' queues (16 chunks of one frame) fill meanwhile.
    let mut got: Vec<Option<(Vec<f32>, qtts::engine::Summary)>> = vec![None, None, None];
    for (i, job) in jobs.into_iter().enumerate().rev() {
        let (samples, summary) = job.collect();
        got[i] = Some((samples, summary.unwrap()));
    }
    let mut most = 0;
    for (i, (a, g)) in alone.iter().zip(got).enumerate() {
        let (samples, summary) = g.unwrap();
        most = most.max(summary.metrics.streams.max());
        let g: Outcome = (summary.codes, samples, summary.stop);
        assert!(same_bits(a, &g), "request {i}");
    }
    eprintln!("at most {most} streams in a step");
}

/// Cloned voices beside each other and beside an x-vector-only voice, on a Base model: each
/// stream's decoder is primed with its own reference (the primed snapshot shared, each stream's
/// state its own), and each request's codes and samples are those it gets alone.
#[test]
fn cloned_voices_at_once_are_each_what_they_are_alone() {
    use qtts::talker::IclReference;
    let (_tmp, out) = common::convert_tiny("voice", OutType::F32);
    let mm = qtts::gguf::GgufFile::open(&out.mmproj).unwrap();
    let mut reqs = Vec::new();
    for (run, mode, reference) in [
        ("icl_stream", TextMode::Streaming, true),
        ("icl_nonstream", TextMode::NonStreaming, true),
        ("icl_stream", TextMode::Streaming, false),
    ] {
        let o = common::oracle(&common::fixture("voice").join(format!("oracle/{run}.safetensors")));
        let codes = common::frames16(&o["ref_code"]);
        let embedded = qtts::voice::clone::embed_frames(&mm, &codes).unwrap();
        let mut req = qtts::engine::Request::text("").greedy();
        req.input = TextInput::TokenIds(o["input_ids"].iter().map(|&x| x as u32).collect());
        req.voice = Voice {
            language: Some("english".into()),
            xvector: Some(o["xvector"].clone()),
            reference: reference.then(|| {
                std::sync::Arc::new(IclReference {
                    text: TextInput::TokenIds(o["ref_ids"].iter().map(|&x| x as u32).collect()),
                    codes,
                    embedded,
                })
            }),
            ..Voice::default()
        };
        req.mode = mode;
        req.max_frames = Some(o["codes"].len() / 16 + 6);
        req.keep_codes = true;
        reqs.push(req);
    }
    let cfg = qtts::engine::EngineConfig {
        max_streams: 3,
        ..common::config()
    };
    let engine = qtts::engine::Engine::load(&common::files(&out), cfg).unwrap();
    let sink = || Box::new(qtts::audio::MemorySink::default());
    let alone: Vec<Outcome> = reqs
        .iter()
        .map(|r| outcome(engine.start(r.clone(), sink())))
        .collect();
    let a = engine.start(reqs[0].clone(), sink());
    after_frames(&a, 2);
    let b = engine.start(reqs[1].clone(), sink());
    let c = engine.start(reqs[2].clone(), sink());
    let got = [outcome(a), outcome(b), outcome(c)];
    for (i, (x, y)) in alone.iter().zip(&got).enumerate() {
        assert!(
            same_bits(x, y),
            "request {i}: {} / {} frames, by {}",
            x.0.len(),
            y.0.len(),
            max_abs(&x.1, &y.1)
        );
    }
}

/// A sink that takes nothing (reports itself full) until `open`.
struct Gated {
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
    samples: std::sync::Arc<std::sync::Mutex<Vec<f32>>>,
}

impl qtts::audio::AudioSink for Gated {
    fn write(
        &mut self,
        pcm: &[f32],
        _: &std::sync::atomic::AtomicBool,
    ) -> Result<(), qtts::audio::AudioError> {
        self.samples.lock().unwrap().extend_from_slice(pcm);
        Ok(())
    }

    fn is_full(&self) -> bool {
        !self.open.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// A request whose reader is behind when its end comes (the decoder holds its samples; its slot
/// is free for the next) is answered once its sink takes them, whole. Each round speaks one
/// frame into a sink that takes nothing yet: the talker ends the utterance after that frame
/// whatever the reader does (no burst, whose first frame the talker would wait for), and the
/// sink opens a while later.
#[test]
fn a_request_that_ends_while_its_reader_is_behind_is_answered_once_read() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let (_tmp, out) = common::random_converted(&common::tiny_talker_256(), 24, OutType::Q8_0);
    let cfg = qtts::engine::EngineConfig {
        plan: qtts::engine::ThreadPlan::for_cores(2),
        n_ctx: 256,
        max_streams: 2,
        burst: false,
        ..qtts::engine::EngineConfig::default()
    };
    let engine = qtts::engine::Engine::load(&common::files(&out), cfg).unwrap();
    let req = request("Short.", "Vivian", 3, 1);
    // A fresh engine's first run: the rounds reuse its prompt's prefix, and must not differ.
    let sink = || Box::new(qtts::audio::MemorySink::default());
    let alone = outcome(engine.start(req.clone(), sink()));
    for round in 0..5 {
        let open = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let sink = Gated {
            open: open.clone(),
            samples: samples.clone(),
        };
        let s = engine.start(req.clone(), Box::new(sink));
        after_frames(&s, 1);
        // Time for the end to reach the decoder (the test's outcome does not depend on it).
        std::thread::sleep(std::time::Duration::from_millis(200));
        open.store(true, Ordering::Release);
        let Ok((summary, _)) = s.wait_timeout(std::time::Duration::from_secs(120)) else {
            panic!("round {round}: never answered");
        };
        let summary = summary.unwrap();
        assert_eq!(summary.codes, alone.0, "round {round}");
        let got = samples.lock().unwrap().clone();
        assert_eq!(got.len(), alone.1.len(), "round {round}");
        assert_eq!(common::bits(&got), common::bits(&alone.1), "round {round}");
        assert_eq!(summary.samples, got.len(), "round {round}");
    }
}
