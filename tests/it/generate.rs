//! Prompts and generation against the oracle's `generate_stream` and `generate_nonstream` (tiny,
//! tiny17: language english, speaker vivian, greedy, repetition penalty 1.05): the built prefill and
//! every step input within 1e-4, the raw talker logits within 1e-4, and the greedy codes exact.

use crate::common;

use common::max_abs;
use qtts::code_predictor::CodePredictor;
use qtts::code_predictor::LayerKernel;
use qtts::ffi::Threadpool;
use qtts::gguf::GgufFile;
use qtts::model::convert::OutType;
use qtts::sampling::SamplingParams;
use qtts::synth::{generate_codes, Flow};
use qtts::talker::{
    GenOptions, Next, Runtime, Session, StopReason, Talker, TalkerError, TextInput, TextMode, Voice,
};

/// Every talker runtime this process runs: llama.cpp, the own graph on ggml's products, on the
/// crate's scalar kernels, and on the packed kernels where the kernel tier has them.
fn runtimes() -> Vec<Runtime> {
    let mut v = vec![
        Runtime::LlamaCpp,
        Runtime::Graph(LayerKernel::Ggml),
        Runtime::Graph(LayerKernel::Scalar),
    ];
    if LayerKernel::fastest() == LayerKernel::Packed {
        v.push(Runtime::Graph(LayerKernel::Packed));
    } else {
        eprintln!(
            "packed kernels: skipped, kernel tier {} has none",
            qtts::kernels::active()
        );
    }
    v
}

fn vivian() -> Voice {
    Voice {
        speaker: Some("Vivian".into()),
        language: Some("English".into()),
        ..Voice::default()
    }
}

fn greedy(max_frames: usize) -> GenOptions {
    GenOptions {
        sampling: SamplingParams::GREEDY,
        repetition_penalty: 1.05,
        seed: 0,
        max_frames: Some(max_frames),
        min_frames: qtts::talker::MIN_FRAMES,
    }
}

#[test]
fn greedy_generation_reproduces_the_oracle() {
    for (name, runtime) in ["tiny", "tiny17"]
        .into_iter()
        .flat_map(|n| runtimes().into_iter().map(move |r| (n, r)))
    {
        let (_tmp, out) = common::convert_tiny(name, OutType::F32);
        let talker = Talker::load_with(&out.talker, runtime).unwrap();
        let fixture = name;
        let name = &format!("{name} {runtime:?}");
        let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
        let pool = Threadpool::new(1, &[]).unwrap();
        for (run, mode) in [
            ("generate_stream", TextMode::Streaming),
            ("generate_nonstream", TextMode::NonStreaming),
        ] {
            let o =
                common::oracle(&common::fixture(fixture).join(format!("oracle/{run}.safetensors")));
            let ids: Vec<u32> = o["input_ids"].iter().map(|&x| x as u32).collect();
            let prompt = talker
                .prompt(&TextInput::TokenIds(ids.clone()), &vivian(), mode)
                .unwrap();
            let ep = max_abs(&prompt.rows, &o["prefill_embeds"]);
            let codes = &o["codes"];
            let frames = codes.len() / 16;

            // Teacher-forced by construction: one step past the oracle's frames, so that all
            // its step inputs are built.
            let mut session = Session::new(&talker, 64, 1, None, true).unwrap();
            let common::Stepped {
                logits,
                steps,
                codes: ours,
            } = common::step_greedy(
                &mut session,
                &mut cp,
                &pool,
                &prompt,
                &greedy(frames + 1),
                frames,
                &format!("{name} {run}"),
            );
            let es = max_abs(&steps, &o["step_embeds"]);
            let el = max_abs(&logits, &o["talker_logits_raw"]);
            eprintln!("{name} {run}: prefill {ep:e}, steps {es:e}, talker logits {el:e}");
            assert!(ep < 1e-4 && es < 1e-4 && el < 1e-4, "{name} {run}");
            assert_eq!(&ours, codes, "{name} {run}: codes");

            // The whole loop, capped at the oracle's frame count.
            let mut got = Vec::new();
            let stop = generate_codes(
                &mut session,
                &mut cp,
                &pool,
                &prompt,
                &greedy(frames),
                &SamplingParams::GREEDY,
                &mut |c| {
                    got.extend(c.iter().map(|&c| c as f32));
                    Flow::Continue
                },
            )
            .unwrap();
            assert_eq!(&got, codes, "{name} {run}: generate_codes");
            assert_eq!(stop, StopReason::FrameCap { frames });
        }
    }
}

/// Text given as text is wrapped and tokenized as the official wrapper does, so it builds the same
/// prompt as its token ids.
#[test]
fn text_and_token_ids_build_the_same_prompt() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let talker = Talker::load(&out.talker).unwrap();
    let text = "Hello, world!";
    // The tiny tokenizer is byte-level: one id per byte.
    let mut ids = vec![1000, 1002, 1003];
    ids.extend(text.bytes().map(|b| {
        let c = qtts::text::bpe::byte_chars()[b as usize];
        talker.tokenizer().token_to_id(&c.to_string()).unwrap()
    }));
    ids.extend([1001, 1003, 1000, 1002, 1003]);
    for mode in [TextMode::Streaming, TextMode::NonStreaming] {
        let a = talker
            .prompt(&TextInput::Text(text.into()), &vivian(), mode)
            .unwrap();
        let b = talker
            .prompt(&TextInput::TokenIds(ids.clone()), &vivian(), mode)
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.text_tokens, text.len());
    }
}

/// The codec prefix rules of the reference: `auto` uses no-think without a language row, a dialect
/// speaker replaces chinese and auto by its dialect, and a missing speaker drops the slot.
#[test]
fn prompt_layout_follows_the_reference_rules() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let talker = Talker::load(&out.talker).unwrap();
    let h = talker.n_embd();
    let text = TextInput::Text("abc".into());
    let rows = |v: Voice| {
        talker
            .prompt(&text, &v, TextMode::Streaming)
            .unwrap()
            .rows
            .len()
            / h
    };
    let voice = |s: Option<&str>, l: Option<&str>| Voice {
        speaker: s.map(Into::into),
        language: l.map(Into::into),
        ..Voice::default()
    };
    // role 3 + prefix (4 with a language, 3 for auto) + speaker + pad/bos pair (1) + first text.
    assert_eq!(
        rows(voice(Some("vivian"), Some("english"))),
        3 + 4 + 1 + 1 + 1
    );
    assert_eq!(rows(voice(Some("vivian"), None)), 3 + 3 + 1 + 1 + 1);
    assert_eq!(rows(voice(None, Some("auto"))), 3 + 3 + 1 + 1);
    // eric speaks Sichuan dialect for chinese and auto: the same rows as asking for it directly.
    let p = |v: Voice| talker.prompt(&text, &v, TextMode::Streaming).unwrap();
    assert_eq!(
        p(voice(Some("eric"), Some("chinese"))),
        p(voice(Some("eric"), Some("sichuan_dialect")))
    );
    assert_eq!(
        p(voice(Some("eric"), None)),
        p(voice(Some("eric"), Some("sichuan_dialect")))
    );
    assert_ne!(
        p(voice(Some("eric"), Some("english"))),
        p(voice(Some("eric"), Some("sichuan_dialect")))
    );
    // Non-streaming: every text token plus tts_eos and the final pad/bos row in the prefill.
    let n = talker
        .prompt(
            &text,
            &voice(Some("vivian"), Some("english")),
            TextMode::NonStreaming,
        )
        .unwrap();
    assert_eq!(n.len(), 3 + 4 + 1 + 1 + 3 + 1 + 1);
    assert!(n.trailing.is_empty());
    let s = p(voice(Some("vivian"), Some("english")));
    assert_eq!(s.trailing.len() / h, 3); // "bc" then tts_eos
}

#[test]
fn bad_voices_and_texts_are_typed_errors() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let talker = Talker::load(&out.talker).unwrap();
    let text = TextInput::Text("abc".into());
    let v = |s: &str, l: &str| Voice {
        speaker: Some(s.into()),
        language: Some(l.into()),
        ..Voice::default()
    };
    let err = talker
        .prompt(&text, &v("nobody", "english"), TextMode::Streaming)
        .unwrap_err();
    match &err {
        TalkerError::UnknownSpeaker { supported, .. } => {
            assert_eq!(supported.len(), 9);
            assert!(supported.contains(&"vivian".to_string()));
        }
        e => panic!("{e}"),
    }
    assert!(err.to_string().contains("vivian"), "{err}");
    match talker.prompt(&text, &v("vivian", "klingon"), TextMode::Streaming) {
        Err(TalkerError::UnknownLanguage { supported, .. }) => {
            assert!(supported.contains(&"auto".into()) && supported.contains(&"english".into()))
        }
        r => panic!("{r:?}"),
    }
    for bad in [
        TextInput::Text(String::new()),
        TextInput::TokenIds(vec![1000, 1002, 1003]),
        TextInput::TokenIds(vec![
            1000, 1002, 1003, 97, 1001, 1003, 1000, 1002, 1003, 5000,
        ]),
    ] {
        match talker.prompt(&bad, &Voice::default(), TextMode::Streaming) {
            Err(TalkerError::BadText { .. }) => {}
            r => panic!("{bad:?}: {r:?}"),
        }
    }
    let xv = Voice {
        xvector: Some(vec![0.0; talker.n_embd()]),
        ..Voice::default()
    };
    assert!(matches!(
        talker.prompt(&text, &xv, TextMode::Streaming),
        Err(TalkerError::SpeakerVector { .. })
    ));
}

/// Base models take an x-vector of the hidden size and no named speaker or instruction.
#[test]
fn base_models_take_a_speaker_vector_and_no_instruction() {
    use qtts::model::config::Preset;
    let (_tmp, out) = common::tiny_random(Preset::Small06Base, 11);
    let talker = Talker::load(&out.talker).unwrap();
    let h = talker.n_embd();
    let text = TextInput::Text("abc".into());
    let base = talker
        .prompt(&text, &Voice::default(), TextMode::Streaming)
        .unwrap();
    let x: Vec<f32> = (0..h).map(|i| (i as f32 * 0.37).sin()).collect();
    let with = talker
        .prompt(
            &text,
            &Voice {
                xvector: Some(x.clone()),
                ..Voice::default()
            },
            TextMode::Streaming,
        )
        .unwrap();
    // One more row (the slot after the 3-row auto prefix: tts_pad + x), the rest unchanged.
    assert_eq!(with.len(), base.len() + 1);
    assert_eq!(&with.rows[..6 * h], &base.rows[..6 * h]);
    assert_eq!(&with.rows[7 * h..], &base.rows[6 * h..]);
    let twice = talker
        .prompt(
            &text,
            &Voice {
                xvector: Some(x.iter().map(|v| 2.0 * v).collect()),
                ..Voice::default()
            },
            TextMode::Streaming,
        )
        .unwrap();
    let diff: Vec<f32> = (6 * h..7 * h)
        .map(|i| twice.rows[i] - with.rows[i])
        .collect();
    assert!(max_abs(&diff, &x) < 1e-6);
    for bad in [vec![0.0; h - 1], vec![f32::NAN; h]] {
        let v = Voice {
            xvector: Some(bad),
            ..Voice::default()
        };
        assert!(matches!(
            talker.prompt(&text, &v, TextMode::Streaming),
            Err(TalkerError::SpeakerVector { .. })
        ));
    }
    let v = Voice {
        instruct: Some("Speak slowly.".into()),
        ..Voice::default()
    };
    assert!(matches!(
        talker.prompt(&text, &v, TextMode::Streaming),
        Err(TalkerError::InstructUnsupported { .. })
    ));
    let v = Voice {
        speaker: Some("vivian".into()),
        ..Voice::default()
    };
    match talker.prompt(&text, &v, TextMode::Streaming) {
        Err(TalkerError::UnknownSpeaker { supported, .. }) => assert!(supported.is_empty()),
        r => panic!("{r:?}"),
    }
}

/// VoiceDesign puts the instruction's rows first, text-only.
#[test]
fn voice_design_prepends_the_instruction() {
    use qtts::model::config::Preset;
    let (_tmp, out) = common::tiny_random(Preset::Large17VoiceDesign, 12);
    let talker = Talker::load(&out.talker).unwrap();
    let h = talker.n_embd();
    let text = TextInput::Text("abc".into());
    let plain = talker
        .prompt(&text, &Voice::default(), TextMode::NonStreaming)
        .unwrap();
    let instruct = "Calm.";
    let v = Voice {
        instruct: Some(instruct.into()),
        ..Voice::default()
    };
    let with = talker.prompt(&text, &v, TextMode::NonStreaming).unwrap();
    // <|im_start|> "user" "\n" "Calm." <|im_end|> "\n": byte-level, so 1 + 4 + 1 + 5 + 1 + 1 ids.
    let n = talker
        .tokenizer()
        .encode(&format!("<|im_start|>user\n{instruct}<|im_end|>\n"))
        .len();
    assert_eq!(n, 13);
    assert_eq!(with.len(), plain.len() + n);
    assert_eq!(&with.rows[n * h..], &plain.rows[..]);
}

/// The same seed gives the same codes; another seed other codes; the frame cap is reported.
#[test]
fn seeds_reproduce_sampled_codes() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let talker = Talker::load(&out.talker).unwrap();
    let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
    let pool = Threadpool::new(1, &[]).unwrap();
    let prompt = talker
        .prompt(
            &TextInput::Text("Hello there.".into()),
            &vivian(),
            TextMode::Streaming,
        )
        .unwrap();
    let mut session = Session::new(&talker, 128, 1, None, false).unwrap();
    let g = talker.generation_config().clone();
    let mut run = |seed: u64| {
        let mut opts = GenOptions::from_config(&g, seed);
        opts.max_frames = Some(12);
        let mut codes = Vec::new();
        let stop = generate_codes(
            &mut session,
            &mut cp,
            &pool,
            &prompt,
            &opts,
            &SamplingParams::code_predictor(&g),
            &mut |c| {
                codes.push(*c);
                Flow::Continue
            },
        )
        .unwrap();
        (codes, stop)
    };
    let (a, sa) = run(7);
    let (b, _) = run(7);
    let (c, _) = run(8);
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Random weights rarely emit EOS: the cap ends the utterance, and says so.
    if sa != StopReason::Eos {
        assert_eq!(sa, StopReason::FrameCap { frames: 12 });
        assert_eq!(a.len(), 12);
    }
    assert!(a.iter().flatten().all(|&c| c < 2048));
}

/// A talker GGUF without the checkpoint's config (as llama.cpp's own conversions are) is read
/// from its token names: the same special and codec ids, so the same prompt and the same greedy
/// codes as the file that carries the config; a Base model without named speakers.
#[test]
fn a_talker_without_the_carried_config_reads_its_ids_from_the_vocabulary() {
    let (tmp, out) = common::convert_tiny("tiny", OutType::F32);
    let bare = tmp.path().join("bare-talker.gguf");
    common::rewrite(&out.talker, &bare, |kv, _| {
        kv.retain(|(k, _)| !k.starts_with("qtts.hf."))
    });
    let full = Talker::load(&out.talker).unwrap();
    let talker = Talker::load(&bare).unwrap();
    let (a, b) = (full.config(), talker.config());
    assert_eq!(b.tts_model_type, qtts::model::config::ModelType::Base);
    assert!(talker.speakers().is_empty());
    assert_eq!(talker.languages(), full.languages());
    assert_eq!(
        (
            a.tts_pad_token_id,
            a.tts_bos_token_id,
            a.tts_eos_token_id,
            a.im_start_token_id
        ),
        (
            b.tts_pad_token_id,
            b.tts_bos_token_id,
            b.tts_eos_token_id,
            b.im_start_token_id
        )
    );
    let (ta, tb) = (&a.talker_config, &b.talker_config);
    assert_eq!(
        (
            ta.codec_pad_id,
            ta.codec_bos_id,
            ta.codec_eos_token_id,
            ta.codec_think_id
        ),
        (
            tb.codec_pad_id,
            tb.codec_bos_id,
            tb.codec_eos_token_id,
            tb.codec_think_id
        )
    );
    assert_eq!(ta.codec_language_id, tb.codec_language_id);
    assert_eq!(talker.generation_config(), full.generation_config());
    let voice = Voice {
        language: Some("english".into()),
        ..Voice::default()
    };
    let text = TextInput::Text("Same ids.".into());
    for mode in [TextMode::Streaming, TextMode::NonStreaming] {
        let p = talker.prompt(&text, &voice, mode).unwrap();
        assert_eq!(p, full.prompt(&text, &voice, mode).unwrap());
    }
    let p = talker.prompt(&text, &voice, TextMode::Streaming).unwrap();
    let mut cp = CodePredictor::load(&GgufFile::open(&out.mmproj).unwrap()).unwrap();
    let pool = Threadpool::new(1, &[]).unwrap();
    let mut codes = Vec::new();
    for t in [&full, &talker] {
        let mut s = Session::new(t, 64, 1, None, true).unwrap();
        let mut got = Vec::new();
        generate_codes(
            &mut s,
            &mut cp,
            &pool,
            &p,
            &greedy(4),
            &SamplingParams::GREEDY,
            &mut |c| {
                got.push(*c);
                Flow::Continue
            },
        )
        .unwrap();
        codes.push(got);
    }
    assert_eq!(codes[0], codes[1]);
}

#[test]
fn a_shared_prompt_prefix_is_reused_and_changes_nothing() {
    let (_tmp, out) = common::convert_tiny("tiny", OutType::F32);
    for runtime in runtimes() {
        eprintln!("{runtime:?}");
        shared_prefix_is_reused(&Talker::load_with(&out.talker, runtime).unwrap());
    }
}

/// Two streaming prompts of one voice, "Hello there." and "Goodbye now.": they differ in their
/// last row only.
fn two_prompts(talker: &Talker) -> (qtts::talker::Prompt, qtts::talker::Prompt) {
    let prompt = |text: &str| {
        talker
            .prompt(
                &TextInput::Text(text.into()),
                &vivian(),
                TextMode::Streaming,
            )
            .unwrap()
    };
    (prompt("Hello there."), prompt("Goodbye now."))
}

fn shared_prefix_is_reused(talker: &Talker) {
    let (a, b) = two_prompts(talker);
    let h = talker.n_embd();
    // Prompts of one voice in streaming mode differ in their last row only.
    let shared = a
        .rows
        .chunks_exact(h)
        .zip(b.rows.chunks_exact(h))
        .take_while(|(x, y)| x == y)
        .count();
    assert_eq!(shared, b.len() - 1, "rows of {} and {}", a.len(), b.len());
    let g = talker.generation_config().clone();
    let opts = GenOptions::from_config(&g, 3);
    let row = vec![0.01f32; h];

    // A fresh session's prefill of b: the reference.
    let mut fresh = Session::new(talker, 128, 1, None, false).unwrap();
    fresh.start(&b, &opts).unwrap();
    assert_eq!(fresh.reused_rows(), 0);
    let (logits, hidden) = (
        fresh.raw_logits().unwrap().to_vec(),
        fresh.hidden().to_vec(),
    );

    // a, three frames of it, then b: all of b but its last row comes from a's cache.
    let mut warm = Session::new(talker, 128, 1, None, false).unwrap();
    warm.start(&a, &opts).unwrap();
    for _ in 0..3 {
        warm.feed(&row).unwrap();
    }
    warm.start(&b, &opts).unwrap();
    assert_eq!(warm.reused_rows(), b.len() - 1);
    let el = common::max_abs(warm.raw_logits().unwrap(), &logits);
    let eh = common::max_abs(warm.hidden(), &hidden);
    // The reused prompt's last row runs alone: ggml's products (this f32 model's) may sum it in
    // another order than beside the prompt's other rows (quantized layers give the same bits:
    // `a_reused_prefix_gives_a_quantized_talker_the_bits_of_a_fresh_prefill`).
    let scale = logits.iter().fold(1f32, |a, v| a.max(v.abs()));
    let tol = match talker.runtime() {
        Runtime::LlamaCpp => 1e-4,
        Runtime::Graph(_) => 2e-4 * scale,
    };
    assert!(
        el < tol && eh < tol,
        "logits {el}, hidden {eh}, tolerance {tol}"
    );
    // Its frames go on from the right position: the next step equals the fresh session's.
    fresh.feed(&row).unwrap();
    warm.feed(&row).unwrap();
    let el = common::max_abs(warm.raw_logits().unwrap(), fresh.raw_logits().unwrap());
    assert!(el < 1e-4, "step logits {el}");

    // The exact path never reuses.
    let mut exact = Session::new(talker, 128, 1, None, true).unwrap();
    exact.start(&a, &opts).unwrap();
    exact.start(&b, &opts).unwrap();
    assert_eq!(exact.reused_rows(), 0);
}

/// With quantized layers (the crate's kernels: each row its own), a prefill after a reused
/// prompt prefix gives its last row the bits that a fresh prefill of the whole prompt gives it.
#[test]
fn a_reused_prefix_gives_a_quantized_talker_the_bits_of_a_fresh_prefill() {
    let (_tmp, out) = common::random_converted(&common::tiny_talker_256(), 31, OutType::Q8_0);
    let mut kernels = vec![LayerKernel::Scalar];
    if LayerKernel::fastest() == LayerKernel::Packed {
        kernels.push(LayerKernel::Packed);
    }
    for kernel in kernels {
        let talker = Talker::load_with(&out.talker, Runtime::Graph(kernel)).unwrap();
        let (a, b) = two_prompts(&talker);
        let opts = GenOptions::from_config(&talker.generation_config().clone(), 3);
        let mut fresh = Session::new(&talker, 128, 1, None, false).unwrap();
        fresh.start(&b, &opts).unwrap();
        let mut warm = Session::new(&talker, 128, 1, None, false).unwrap();
        warm.start(&a, &opts).unwrap();
        warm.feed(&vec![0.01f32; talker.n_embd()]).unwrap();
        warm.start(&b, &opts).unwrap();
        assert_eq!(warm.reused_rows(), b.len() - 1, "{kernel:?}");
        assert_eq!(
            common::bits(warm.raw_logits().unwrap()),
            common::bits(fresh.raw_logits().unwrap()),
            "{kernel:?}: logits"
        );
        assert_eq!(
            common::bits(warm.hidden()),
            common::bits(fresh.hidden()),
            "{kernel:?}: hidden"
        );
    }
}

/// The own graph's q4_K talker steps against llama.cpp's on the same file: with f32 caches, the
/// same codes and logits to 1e-4 (the same ggml products); with the default caches (q8_0 and
/// flash attention in both) and either kernel, the same greedy codes and logits within the
/// caches' rounding until the codes part.
/// A talker of width 256 (q4_K's block) so that its layers are q4_K; 120 steps, so that the own
/// graph's steps cross two blocks of positions.
#[test]
fn graph_talker_steps_follow_llama_cpp_at_q4k() {
    let cfg = common::tiny_talker_256();
    let (_tmp, out) = common::random_converted(&cfg, 11, OutType::Q4K);
    let f = GgufFile::open(&out.talker).unwrap();
    let q4k = f
        .header
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("blk.") && t.ty == qtts::gguf::GgmlType::Q4K)
        .count();
    assert!(q4k >= 14, "{q4k} q4_K layer matrices");
    let run = |runtime: Runtime, exact: bool| {
        let talker = Talker::load_with(&out.talker, runtime).unwrap();
        let prompt = talker
            .prompt(
                &TextInput::Text("Hello there, how are you?".into()),
                &vivian(),
                TextMode::NonStreaming,
            )
            .unwrap();
        let h = talker.n_embd();
        let mut s = Session::new(&talker, 256, 2, None, exact).unwrap();
        let mut next = s.start(&prompt, &greedy(130)).unwrap();
        let (mut codes, mut logits) = (Vec::new(), Vec::new());
        // Past position 64 and 128: the own graph's step graphs serve blocks of 64 positions.
        assert!(prompt.len() < 64 && prompt.len() + 120 > 128);
        for step in 0..120 {
            logits.extend_from_slice(s.raw_logits().unwrap());
            let Next::Code(c) = next else {
                panic!("{runtime:?}: stopped at step {step}: {next:?}")
            };
            codes.push(c);
            // A deterministic frame embedding that depends on the code picked.
            let row: Vec<f32> = (0..h)
                .map(|i| (((i * 31 + c as usize * 7) % 97) as f32 / 97.0 - 0.5) * 0.2)
                .collect();
            next = s.feed(&row).unwrap();
        }
        (codes, logits)
    };
    // Exact (f32 caches, no flash attention): the same ggml products in both graphs.
    let llama = run(Runtime::LlamaCpp, true);
    let graph = run(Runtime::Graph(LayerKernel::Ggml), true);
    let scale = llama.1.iter().fold(0f32, |a, v| a.max(v.abs()));
    let e = max_abs(&graph.1, &llama.1);
    eprintln!("exact: graph vs llama.cpp: logits max {e:e} of {scale}");
    assert_eq!(graph.0, llama.0, "exact: codes");
    assert!(e <= 1e-4 * scale, "exact: logits {e} of {scale}");

    let llama = run(Runtime::LlamaCpp, false);
    let e = max_abs(&llama.1[..3072], &graph.1[..3072]);
    eprintln!("llama.cpp vs the exact graph: prefill logits max {e:e} of {scale}");
    let mut others = vec![Runtime::Graph(LayerKernel::Ggml)];
    if LayerKernel::fastest() == LayerKernel::Packed {
        others.push(Runtime::Graph(LayerKernel::Packed));
    }
    // Both keep q8_0 caches attended by ggml's flash attention, but their roundings are not the
    // same (measured: each 1.7-1.8 % of the largest logit from the exact prefill, and as far
    // from each other), so a greedy pick may differ within a few steps, and the fed rows with
    // it. Compared: the steps up to the first code that differs, at least the prefill and
    // three steps, each within the caches' rounding of llama.cpp's.
    for r in others {
        let got = run(r, false);
        let same = got
            .0
            .iter()
            .zip(&llama.0)
            .take_while(|(a, b)| a == b)
            .count();
        assert!(
            same >= 4,
            "{r:?}: codes {:?} against {:?}",
            &got.0[..8],
            &llama.0[..8]
        );
        let e = max_abs(&got.1[..same * 3072], &llama.1[..same * 3072]);
        eprintln!("{r:?} vs llama.cpp: logits max {e:e} of {scale} over {same} steps");
        assert!(e <= 0.05 * scale, "{r:?}: logits {e} of {scale}");
        // The prefill's logits no further from the exact ones than llama.cpp's, within a margin.
        let e = max_abs(&got.1[..3072], &graph.1[..3072]);
        eprintln!("{r:?} vs the exact graph: prefill logits max {e:e} of {scale}");
        assert!(e <= 0.03 * scale, "{r:?}: prefill logits {e} of {scale}");
    }
}
