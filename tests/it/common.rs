//! Paths shared by the integration tests.

use std::path::PathBuf;

/// The repository's root: this package's directory, or two above it for crates/cli (whose
/// tests include this file). Read when the test runs (cargo sets it then too), so a test binary
/// built from another checkout sharing the target directory still finds this one's fixtures.
pub fn root() -> PathBuf {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    if dir.join("tests/fixtures").is_dir() {
        dir
    } else {
        dir.join("../..")
    }
}

/// `tests/fixtures/<name>`: the oracle's outputs committed with the project.
pub fn fixture(name: &str) -> PathBuf {
    root().join("tests").join("fixtures").join(name)
}

/// The released Qwen3-TTS tokenizer (`vocab.json`, `merges.txt`, `tokenizer_config.json`):
/// `$QTTS_TOKENIZER`, else the copy in `tests/fixtures/tokenizer/released` (Apache-2.0, with its
/// notice). When neither holds it, the test fails saying where to get it: a test that needs the
/// real tokenizer never passes without it.
pub fn tokenizer_dir() -> PathBuf {
    let dir = match std::env::var_os("QTTS_TOKENIZER") {
        Some(d) => PathBuf::from(d),
        None => fixture("tokenizer/released"),
    };
    assert!(
        dir.join("vocab.json").is_file() && dir.join("merges.txt").is_file(),
        "this test needs the released Qwen3-TTS tokenizer and {} has no vocab.json and \
         merges.txt: copy them (with tokenizer_config.json) from any Qwen3-TTS checkpoint \
         (e.g. huggingface.co/Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice) into a directory and set \
         QTTS_TOKENIZER to it",
        dir.display()
    );
    dir
}

/// Writes the tiny fixtures' tokenizer into `dir` (see `qtts::model::testing`).
pub fn tiny_tokenizer(dir: &std::path::Path) {
    qtts::model::testing::write_tiny_tokenizer(dir).unwrap();
}

/// Converts fixture `name` (`tiny`, `tiny17`) to GGUF at `ty` in a temporary directory.
pub fn convert_tiny(
    name: &str,
    ty: qtts::model::convert::OutType,
) -> (tempfile::TempDir, qtts::model::convert::Converted) {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("tokenizer");
    tiny_tokenizer(&tok);
    let model = fixture(name).join("model");
    let out = qtts::model::convert::convert(
        &model,
        Some(&tok),
        &tmp.path().join("out"),
        ty,
        &mut |_, _| {},
    )
    .unwrap();
    (tmp, out)
}

/// The f32 (or int64, converted) tensors of an oracle safetensors file.
pub fn oracle(path: &std::path::Path) -> std::collections::HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            let f = match v.dtype() {
                safetensors::Dtype::F32 => v
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                safetensors::Dtype::I64 => v
                    .data()
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
                    .collect(),
                d => panic!("{n}: {d:?}"),
            };
            (n, f)
        })
        .collect()
}

/// The largest absolute difference of two equal-length slices.
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `preset`'s configs with a tiny talker and code predictor and the preset's decoder unchanged
/// (`qtts::model::testing::tiny_config`).
pub fn tiny_talker(preset: qtts::model::config::Preset) -> qtts::model::config::CheckpointConfig {
    qtts::model::testing::tiny_config(preset, false)
}

/// A random checkpoint of `preset`'s kind with the tiny talker ([`tiny_talker`]) and a small
/// decoder, converted to f32 GGUF in a temporary directory (a few seconds).
pub fn tiny_random(
    preset: qtts::model::config::Preset,
    seed: u64,
) -> (tempfile::TempDir, qtts::model::convert::Converted) {
    let cfg = qtts::model::testing::tiny_config(preset, true);
    random_converted(&cfg, seed, qtts::model::convert::OutType::F32)
}

/// The tiny 0.6B CustomVoice configs with a small decoder and the talker and code predictor
/// widened to 256 values a row (q4_K's block), so that a k-quant conversion stores their layers
/// in that type.
pub fn tiny_talker_256() -> qtts::model::config::CheckpointConfig {
    let mut cfg =
        qtts::model::testing::tiny_config(qtts::model::config::Preset::Small06CustomVoice, true);
    let t = &mut cfg.tts.talker_config;
    (t.hidden_size, t.intermediate_size, t.head_dim) = (256, 512, 64);
    t.rope_scaling.mrope_section = vec![12, 10, 10];
    // The code predictor as wide, so that q8_0 and the k-quants hold its layers too (at the tiny
    // config's 48 they stay f32): the crate's kernels multiply them, and streams batch in one
    // graph as the released models' do.
    let c = &mut t.code_predictor_config;
    (c.hidden_size, c.intermediate_size, c.head_dim) = (256, 512, 64);
    cfg
}

/// Each value's bits: what "the same to the bit" compares.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// [`tiny_talker_256`] with the tiny config's code predictor (48 wide: its layers stay f32).
pub fn narrow_code_predictor() -> qtts::model::config::CheckpointConfig {
    let mut cfg = tiny_talker_256();
    cfg.tts.talker_config.code_predictor_config =
        qtts::model::testing::tiny_config(qtts::model::config::Preset::Small06CustomVoice, true)
            .tts
            .talker_config
            .code_predictor_config;
    cfg
}

/// A random checkpoint of `cfg` (with the tiny tokenizer), converted to `ty` in a temporary
/// directory (`gguf/` in it).
pub fn random_converted(
    cfg: &qtts::model::config::CheckpointConfig,
    seed: u64,
    ty: qtts::model::convert::OutType,
) -> (tempfile::TempDir, qtts::model::convert::Converted) {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("tokenizer");
    tiny_tokenizer(&tok);
    let ckpt = tmp.path().join("ckpt");
    qtts::model::random::write_random_checkpoint_with(cfg, seed, &tok, &ckpt, &mut |_, _| {})
        .unwrap();
    let out =
        qtts::model::convert::convert(&ckpt, None, &tmp.path().join("gguf"), ty, &mut |_, _| {})
            .unwrap();
    (tmp, out)
}

/// Rewrites `src` into `dst` after `edit` changes its metadata and tensor table (tensor data is
/// copied where the size is unchanged, zeros elsewhere).
pub fn rewrite(
    src: &std::path::Path,
    dst: &std::path::Path,
    edit: impl FnOnce(
        &mut Vec<(String, qtts::gguf::Value)>,
        &mut Vec<(String, Vec<u64>, qtts::gguf::GgmlType)>,
    ),
) {
    let f = qtts::gguf::GgufFile::open(src).unwrap();
    let mut kv = f.header.kv.clone();
    let mut tensors: Vec<_> = f
        .header
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.ne.clone(), t.ty))
        .collect();
    edit(&mut kv, &mut tensors);
    let mut plan = qtts::gguf::Plan::default();
    for (k, v) in kv {
        plan.set(k, v);
    }
    for (n, ne, ty) in &tensors {
        plan.add_tensor(n.clone(), ne.clone(), *ty);
    }
    let mut w = qtts::gguf::Writer::create(dst, &plan).unwrap();
    for (n, ne, ty) in &tensors {
        let size = ty.nbytes(ne).unwrap() as usize;
        match f.tensor_data(n) {
            Some(d) if d.len() == size => w.write_tensor(n, d).unwrap(),
            _ => w.write_tensor(n, &vec![0u8; size]).unwrap(),
        }
    }
    w.finish().unwrap();
}

/// Runs test `name` (its path in this crate, e.g. `engine::some_test`) alone in a child process of
/// this test binary, with `env` added, for a test that reads process-wide state (the process's
/// thread count, an environment variable read at load) while the other tests of the crate run
/// beside it. Returns true in the child, where the caller goes on with the test's body, and false
/// in the parent once the child passed; panics with the child's output if it failed.
pub fn own_process(name: &str, env: &[(&str, &str)]) -> bool {
    const CHILD: &str = "QTTS_IT_OWN_PROCESS";
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name}, in a process of its own: {}\n{stdout}\n{stderr}",
        out.status
    );
    false
}

/// The model files of a conversion.
pub fn files(out: &qtts::model::convert::Converted) -> qtts::model::ModelFiles {
    qtts::model::ModelFiles {
        talker: out.talker.clone(),
        mmproj: out.mmproj.clone(),
    }
}

/// The engine settings of the end-to-end tests (`engine`, `worker`): 2 cores, exact, a short
/// context.
pub fn config() -> qtts::engine::EngineConfig {
    qtts::engine::EngineConfig {
        plan: qtts::engine::ThreadPlan::for_cores(2),
        exact: true,
        n_ctx: 256,
        ..qtts::engine::EngineConfig::default()
    }
}

/// An oracle's `[frames, 16]` codes (read as f32) as frames.
pub fn frames16(v: &[f32]) -> Vec<[u32; 16]> {
    v.chunks_exact(16)
        .map(|c| std::array::from_fn(|k| c[k] as u32))
        .collect()
}

/// What [`step_greedy`] recorded: the raw talker logits before each frame and after the last,
/// the talker's input of each step, and the codes (as f32, like the oracle's).
pub struct Stepped {
    /// `(frames + 1) × vocab` raw logits.
    pub logits: Vec<f32>,
    /// `frames × n_embd` step inputs.
    pub steps: Vec<f32>,
    /// `frames × 16` codes.
    pub codes: Vec<f32>,
}

/// Runs `frames` frames of `prompt` one at a time, codebooks 1..15 greedy, recording every
/// step (teacher-forced by construction: the codes are ours and must equal the oracle's).
pub fn step_greedy(
    session: &mut qtts::talker::Session,
    cp: &mut qtts::code_predictor::CodePredictor,
    pool: &qtts::ffi::Threadpool,
    prompt: &qtts::talker::Prompt,
    opts: &qtts::talker::GenOptions,
    frames: usize,
    name: &str,
) -> Stepped {
    use qtts::talker::Next;
    let mut next = session.start(prompt, opts).unwrap();
    let (mut logits, mut steps, mut codes) = (Vec::new(), Vec::new(), Vec::new());
    let mut embedded = vec![0.0; session.talker().n_embd()];
    for f in 0..frames {
        logits.extend_from_slice(session.raw_logits().unwrap());
        let Next::Code(c0) = next else {
            panic!("{name}: stopped at frame {f}: {next:?}")
        };
        let rest = cp
            .frame(
                pool,
                session.hidden(),
                c0,
                &mut |_, l| qtts::sampling::argmax(l),
                None,
            )
            .unwrap();
        let mut frame = [c0; 16];
        frame[1..].copy_from_slice(&rest);
        codes.extend(frame.iter().map(|&c| c as f32));
        cp.embed_frame(&frame, &mut embedded).unwrap();
        next = session.feed(&embedded).unwrap();
        steps.extend_from_slice(session.last_input());
    }
    logits.extend_from_slice(session.raw_logits().unwrap());
    Stepped {
        logits,
        steps,
        codes,
    }
}

/// Values spread over several binades, so that a kernel that rounded its products apart from
/// its sums (no fused multiply-add) or summed in another order would give other bits.
pub fn spread_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let m = (s % 20_001) as f32 / 10_000.0 - 1.0;
            m * [1.0, 0.37, 3.1, 0.011][(s >> 40) as usize % 4]
        })
        .collect()
}

/// `n` frames of codes below 2048, the same every call (a fixed xorshift sequence): the
/// full-size decoder tests' input.
pub fn random_codes(n: usize) -> Vec<[u32; qtts::decoder::CODEBOOKS]> {
    let mut state = 0x853c_49e6_748f_ea9bu64;
    (0..n)
        .map(|_| {
            std::array::from_fn(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % 2048) as u32
            })
        })
        .collect()
}
