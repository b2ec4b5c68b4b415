//! Corrupted and inconsistent model files, generated here, each rejected with the expected error
//! variant before llama.cpp or ggml sees it, and without an abort (this process survives them all,
//! through the same `LlamaModel::load` / `Mmproj::load` gates the engine uses).

use crate::common;

use std::path::{Path, PathBuf};

use qtts::gguf::{self, GgmlType, GgufFile, Value};
use qtts::model::convert::{convert, OutType};
use qtts::ModelError;

/// Raw GGUF bytes, written field by field so that any field can be wrong.
#[derive(Default, Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn u32(mut self, x: u32) -> Self {
        self.0.extend(x.to_le_bytes());
        self
    }
    fn u64(mut self, x: u64) -> Self {
        self.0.extend(x.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend(b);
        self
    }
    fn str(self, s: &str) -> Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// A header: magic, version, counts.
    fn header(n_tensors: u64, n_kv: u64) -> Self {
        Raw::default()
            .bytes(b"GGUF")
            .u32(3)
            .u64(n_tensors)
            .u64(n_kv)
    }
    /// A u32 metadata pair.
    fn kv_u32(self, key: &str, x: u32) -> Self {
        self.str(key).u32(4).u32(x)
    }
    /// A tensor entry.
    fn tensor(self, name: &str, ne: &[u64], ty: u32, offset: u64) -> Self {
        let mut r = self.str(name).u32(ne.len() as u32);
        for &d in ne {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    /// Pads to 32 bytes and appends `n` bytes of tensor data.
    fn data(mut self, n: usize) -> Self {
        while !self.0.len().is_multiple_of(32) {
            self.0.push(0);
        }
        self.0.extend(std::iter::repeat_n(0u8, n));
        self
    }
}

/// A valid two-tensor file that the corruptions below start from.
fn valid() -> Raw {
    Raw::header(2, 1)
        .kv_u32("general.alignment", 32)
        .tensor("a", &[8, 2], 0, 0)
        .tensor("b", &[32], 8, 64)
        .data(64 + 34)
}

/// The variant name of an error, for table comparisons.
fn variant(e: &ModelError) -> &'static str {
    match e {
        ModelError::Io { .. } => "Io",
        ModelError::Truncated { .. } => "Truncated",
        ModelError::BadMagic { .. } => "BadMagic",
        ModelError::UnsupportedVersion { .. } => "UnsupportedVersion",
        ModelError::LimitExceeded { .. } => "LimitExceeded",
        ModelError::BadValueType { .. } => "BadValueType",
        ModelError::BadString { .. } => "BadString",
        ModelError::Duplicate { .. } => "Duplicate",
        ModelError::BadAlignment { .. } => "BadAlignment",
        ModelError::BadTensorInfo { .. } => "BadTensorInfo",
        ModelError::BadTensorOffset { .. } => "BadTensorOffset",
        ModelError::MissingKey { .. } => "MissingKey",
        ModelError::BadKey { .. } => "BadKey",
        ModelError::MissingTensor { .. } => "MissingTensor",
        ModelError::WrongShape { .. } => "WrongShape",
        ModelError::WrongType { .. } => "WrongType",
        ModelError::BadField { .. } => "BadField",
        ModelError::Parse { .. } => "Parse",
        ModelError::LoaderRefused { .. } => "LoaderRefused",
        _ => "other",
    }
}

fn check(name: &str, bytes: &[u8], expect: &str) {
    let got = gguf::parse(bytes, Path::new(name));
    match got {
        Err(e) => assert_eq!(variant(&e), expect, "{name}: {e}"),
        Ok(_) => panic!("{name}: accepted, expected {expect}"),
    }
}

#[test]
fn the_valid_base_file_parses() {
    let h = gguf::parse(&valid().0, Path::new("valid")).unwrap();
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.tensors[1].ty, GgmlType::Q8_0);
    assert_eq!(h.tensors[1].nbytes, 34);
}

#[test]
fn malformed_files_are_rejected_with_the_expected_variant() {
    let v = valid().0;
    let mut bad_magic = v.clone();
    bad_magic[0] = b'X';
    let with_version = |x: u32| {
        let mut b = v.clone();
        b[4..8].copy_from_slice(&x.to_le_bytes());
        b
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "Truncated"),
        ("3 bytes", b"GGU".to_vec(), "Truncated"),
        ("bad magic", bad_magic, "BadMagic"),
        ("version 0", with_version(0), "UnsupportedVersion"),
        ("version 1", with_version(1), "UnsupportedVersion"),
        ("future version", with_version(4), "UnsupportedVersion"),
        (
            "byte-swapped version",
            with_version(0x0300_0000),
            "UnsupportedVersion",
        ),
        (
            "n_tensors u64::MAX",
            Raw::header(u64::MAX, 0).0,
            "LimitExceeded",
        ),
        ("n_kv u64::MAX", Raw::header(0, u64::MAX).0, "LimitExceeded"),
        ("n_kv past the end", Raw::header(0, 1000).0, "Truncated"),
        (
            "n_tensors past the end",
            Raw::header(1000, 0).0,
            "Truncated",
        ),
        (
            "key length u64::MAX",
            Raw::header(0, 1).u64(u64::MAX).bytes(&[0; 16]).0,
            "LimitExceeded",
        ),
        (
            "key past the end",
            Raw::header(0, 1).u64(100).bytes(b"abc").0,
            "Truncated",
        ),
        (
            "string value length 2^62",
            Raw::header(0, 1).str("k").u32(8).u64(1 << 62).0,
            "LimitExceeded",
        ),
        (
            "array length 2^63",
            Raw::header(0, 1).str("k").u32(9).u32(4).u64(1 << 63).0,
            "LimitExceeded",
        ),
        (
            "array past the end",
            Raw::header(0, 1).str("k").u32(9).u32(4).u64(1 << 20).0,
            "Truncated",
        ),
        (
            "string array past the end",
            Raw::header(0, 1)
                .str("k")
                .u32(9)
                .u32(8)
                .u64(1000)
                .str("x")
                .0,
            "Truncated",
        ),
        (
            "value type 13",
            Raw::header(0, 1).str("k").u32(13).u32(0).0,
            "BadValueType",
        ),
        (
            "nested array",
            Raw::header(0, 1).str("k").u32(9).u32(9).u64(1).0,
            "BadValueType",
        ),
        (
            "bool of 2",
            Raw::header(0, 1).str("k").u32(7).bytes(&[2]).0,
            "BadKey",
        ),
        (
            "empty key",
            Raw::header(0, 1).str("").u32(4).u32(1).0,
            "BadString",
        ),
        (
            "key not UTF-8",
            Raw::header(0, 1)
                .u64(2)
                .bytes(&[0xff, 0xfe])
                .u32(4)
                .u32(1)
                .0,
            "BadString",
        ),
        (
            "duplicate key",
            Raw::header(0, 2).kv_u32("k", 1).kv_u32("k", 2).0,
            "Duplicate",
        ),
        (
            "alignment 3",
            Raw::header(0, 1).kv_u32("general.alignment", 3).0,
            "BadAlignment",
        ),
        (
            "alignment 0",
            Raw::header(0, 1).kv_u32("general.alignment", 0).0,
            "BadAlignment",
        ),
        (
            "alignment as string",
            Raw::header(0, 1)
                .str("general.alignment")
                .u32(8)
                .str("32")
                .0,
            "BadAlignment",
        ),
        (
            "rank 5",
            Raw::header(1, 0)
                .tensor("t", &[1, 1, 1, 1, 1], 0, 0)
                .data(4)
                .0,
            "BadTensorInfo",
        ),
        (
            "rank 0",
            Raw::header(1, 0).tensor("t", &[], 0, 0).data(4).0,
            "BadTensorInfo",
        ),
        (
            "removed type 4",
            Raw::header(1, 0).tensor("t", &[32], 4, 0).data(64).0,
            "BadTensorInfo",
        ),
        (
            "type 1000",
            Raw::header(1, 0).tensor("t", &[32], 1000, 0).data(64).0,
            "BadTensorInfo",
        ),
        (
            "zero dimension",
            Raw::header(1, 0).tensor("t", &[0], 0, 0).data(4).0,
            "BadTensorInfo",
        ),
        (
            "dimension over 2^63",
            Raw::header(1, 0).tensor("t", &[1 << 63], 0, 0).data(4).0,
            "BadTensorInfo",
        ),
        (
            "shape overflows",
            Raw::header(1, 0)
                .tensor("t", &[1 << 32, 1 << 32, 1 << 32], 0, 0)
                .data(4)
                .0,
            "BadTensorInfo",
        ),
        (
            "size past the file",
            Raw::header(1, 0).tensor("t", &[1 << 40], 0, 0).data(4).0,
            "Truncated",
        ),
        (
            "row not whole q8_0 blocks",
            Raw::header(1, 0).tensor("t", &[33], 8, 0).data(64).0,
            "BadTensorInfo",
        ),
        (
            "name of 64 bytes",
            Raw::header(1, 0)
                .tensor(&"n".repeat(64), &[1], 0, 0)
                .data(4)
                .0,
            "BadTensorInfo",
        ),
        (
            "empty tensor name",
            Raw::header(1, 0).tensor("", &[1], 0, 0).data(4).0,
            "BadTensorInfo",
        ),
        (
            "duplicate tensor",
            Raw::header(2, 0)
                .tensor("t", &[8], 0, 0)
                .tensor("t", &[8], 0, 32)
                .data(64)
                .0,
            "Duplicate",
        ),
        (
            "misaligned offset",
            Raw::header(2, 0)
                .tensor("a", &[8], 0, 0)
                .tensor("b", &[8], 0, 33)
                .data(96)
                .0,
            "BadTensorOffset",
        ),
        (
            "overlapping tensors",
            Raw::header(2, 0)
                .tensor("a", &[16], 0, 0)
                .tensor("b", &[8], 0, 32)
                .data(96)
                .0,
            "BadTensorOffset",
        ),
        (
            "first tensor not at 0",
            Raw::header(1, 0).tensor("a", &[8], 0, 32).data(96).0,
            "BadTensorOffset",
        ),
        (
            "data past the end",
            Raw::header(1, 0).tensor("a", &[8], 0, 0).data(16).0,
            "Truncated",
        ),
    ];
    assert!(cases.len() >= 25);
    for (name, bytes, expect) in &cases {
        check(name, bytes, expect);
    }
}

#[test]
fn truncation_at_every_point_is_reported_as_truncation() {
    let v = valid().0;
    for cut in 0..v.len() {
        check(&format!("cut at {cut}"), &v[..cut], "Truncated");
    }
}

/// The tiny fixture converted, with a function to rewrite its header.
struct Converted {
    _tmp: tempfile::TempDir,
    talker: PathBuf,
    mmproj: PathBuf,
    dir: PathBuf,
}

fn tiny() -> Converted {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tmp.path().join("tokenizer");
    common::tiny_tokenizer(&tok);
    let out = convert(
        &common::fixture("tiny").join("model"),
        Some(&tok),
        &tmp.path().join("out"),
        OutType::F32,
        &mut |_, _| {},
    )
    .unwrap();
    let dir = tmp.path().to_path_buf();
    Converted {
        _tmp: tmp,
        talker: out.talker,
        mmproj: out.mmproj,
        dir,
    }
}

fn set(kv: &mut [(String, Value)], key: &str, v: Value) {
    kv.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

#[test]
fn inconsistent_models_are_rejected_before_llama_cpp() {
    let c = tiny();
    type Edit = Box<dyn FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, Vec<u64>, GgmlType)>)>;
    let talker_cases: Vec<(&str, Edit, &str)> = vec![
        (
            "missing tensor",
            Box::new(|_, t| t.retain(|x| x.0 != "blk.0.ffn_up.weight")),
            "MissingTensor",
        ),
        (
            "wrong shape",
            Box::new(|_, t| {
                t.iter_mut().find(|x| x.0 == "output.weight").unwrap().1 = vec![64, 3000]
            }),
            "WrongShape",
        ),
        (
            "norm stored as f16",
            Box::new(|_, t| {
                t.iter_mut()
                    .find(|x| x.0 == "output_norm.weight")
                    .unwrap()
                    .2 = GgmlType::F16
            }),
            "WrongType",
        ),
        (
            "extra tensor",
            Box::new(|_, t| t.push(("blk.9.extra.weight".into(), vec![64], GgmlType::F32))),
            "BadKey",
        ),
        (
            "architecture llama",
            Box::new(|kv, _| set(kv, "general.architecture", Value::Str("llama".into()))),
            "BadKey",
        ),
        (
            "head_count as string",
            Box::new(|kv, _| set(kv, "qwen3tts.attention.head_count", Value::Str("4".into()))),
            "BadKey",
        ),
        (
            "head_count_kv not a divisor",
            Box::new(|kv, _| set(kv, "qwen3tts.attention.head_count_kv", Value::U32(3))),
            "BadKey",
        ),
        (
            "block_count missing",
            Box::new(|kv, _| kv.retain(|x| x.0 != "qwen3tts.block_count")),
            "MissingKey",
        ),
        (
            "block_count 0",
            Box::new(|kv, _| set(kv, "qwen3tts.block_count", Value::U32(0))),
            "BadKey",
        ),
        (
            "three rope sections",
            Box::new(|kv, _| {
                set(
                    kv,
                    "qwen3tts.rope.dimension_sections",
                    Value::Array(gguf::Array::I32(vec![6, 5, 5])),
                )
            }),
            "BadKey",
        ),
        (
            "eos id out of range",
            Box::new(|kv, _| set(kv, "tokenizer.ggml.eos_token_id", Value::U32(1 << 30))),
            "BadKey",
        ),
        (
            "duplicate token",
            Box::new(|kv, _| {
                let toks = kv
                    .iter_mut()
                    .find(|x| x.0 == "tokenizer.ggml.tokens")
                    .unwrap();
                if let Value::Array(gguf::Array::Str(t)) = &mut toks.1 {
                    t[5] = t[6].clone();
                }
            }),
            "BadKey",
        ),
        (
            "codec tokens not last",
            Box::new(|kv, _| {
                let toks = kv
                    .iter_mut()
                    .find(|x| x.0 == "tokenizer.ggml.tokens")
                    .unwrap();
                if let Value::Array(gguf::Array::Str(t)) = &mut toks.1 {
                    t.rotate_left(1);
                }
            }),
            "BadKey",
        ),
        (
            "token types shorter than tokens",
            Box::new(|kv, _| {
                set(
                    kv,
                    "tokenizer.ggml.token_type",
                    Value::Array(gguf::Array::I32(vec![1; 10])),
                )
            }),
            "BadKey",
        ),
        (
            "deepstack layers",
            Box::new(|kv, _| kv.push(("qwen3tts.n_deepstack_layers".into(), Value::U32(2)))),
            "BadKey",
        ),
    ];
    let mmproj_cases: Vec<(&str, Edit, &str)> = vec![
        (
            "8 code groups",
            Box::new(|_, t| {
                t.iter_mut()
                    .find(|x| x.0 == "a.gen.code.head.weight")
                    .unwrap()
                    .1 = vec![64, 2048, 7]
            }),
            "WrongShape",
        ),
        (
            "codebook of 1024",
            Box::new(|_, t| {
                t.iter_mut()
                    .find(|x| x.0 == "a.gen.wav.quant.rest.codebook.weight")
                    .unwrap()
                    .1 = vec![8, 1024, 15]
            }),
            "WrongShape",
        ),
        (
            "CP heads of 1024 codes",
            Box::new(|_, t| {
                t.iter_mut()
                    .find(|x| x.0 == "a.gen.code.head.weight")
                    .unwrap()
                    .1 = vec![64, 1024, 15]
            }),
            "WrongShape",
        ),
        (
            "bf16 conv (im2col takes f16/f32)",
            Box::new(|_, t| {
                t.iter_mut()
                    .find(|x| x.0 == "a.gen.wav.pre_conv.weight")
                    .unwrap()
                    .2 = GgmlType::BF16
            }),
            "WrongType",
        ),
        (
            "missing decoder layer",
            Box::new(|_, t| t.retain(|x| x.0 != "a.gen.wav.tfm.blk.1.ffn_down.weight")),
            "MissingTensor",
        ),
        (
            "block_count as f32",
            Box::new(|kv, _| set(kv, "clip.gen.audio.block_count", Value::F32(2.0))),
            "BadKey",
        ),
        (
            "generic projector type",
            Box::new(|kv, _| {
                kv.push((
                    "clip.projector_type".into(),
                    Value::Str("qwen3tts_gen".into()),
                ))
            }),
            "BadKey",
        ),
        (
            "wrong projector",
            Box::new(|kv, _| {
                set(
                    kv,
                    "clip.gen.audio.projector_type",
                    Value::Str("pocket_tts".into()),
                )
            }),
            "BadKey",
        ),
        (
            "vision encoder declared",
            Box::new(|kv, _| kv.push(("clip.has_vision_encoder".into(), Value::Bool(true)))),
            "BadKey",
        ),
        (
            "speaker encoder declared, absent",
            Box::new(|kv, _| kv.push(("clip.has_audio_encoder".into(), Value::Bool(true)))),
            "MissingKey",
        ),
        (
            "config json not a string",
            Box::new(|kv, _| set(kv, "qtts.hf.speech_tokenizer_config_json", Value::U32(1))),
            "BadKey",
        ),
        (
            "config json with 8 codebooks",
            Box::new(|kv, _| {
                let e = kv
                    .iter_mut()
                    .find(|x| x.0 == "qtts.hf.speech_tokenizer_config_json")
                    .unwrap();
                if let Value::Str(s) = &mut e.1 {
                    *s = s.replace("\"num_quantizers\": 16", "\"num_quantizers\": 8");
                }
            }),
            "BadKey",
        ),
    ];
    let mut n = 0;
    for (src, cases, is_talker) in [
        (&c.talker, talker_cases, true),
        (&c.mmproj, mmproj_cases, false),
    ] {
        for (name, edit, expect) in cases {
            let dst = c.dir.join(format!("case{n}.gguf"));
            n += 1;
            common::rewrite(src, &dst, edit);
            let err = if is_talker {
                qtts::model::validate::talker(&dst)
                    .and_then(|v| qtts::ffi::LlamaModel::load(&v))
                    .map(|_| ())
                    .unwrap_err()
            } else {
                qtts::model::validate::mmproj_file(&dst).unwrap_err()
            };
            assert_eq!(variant(&err), expect, "{name}: {err}");
            // Every error names the file it is about.
            assert!(
                err.to_string().contains(dst.to_str().unwrap()),
                "{name}: {err}"
            );
        }
    }
    assert!(n >= 25, "{n} cases");
}

#[test]
fn truncated_real_files_are_rejected_at_64_points() {
    let c = tiny();
    for src in [&c.talker, &c.mmproj] {
        let bytes = std::fs::read(src).unwrap();
        let dst = c.dir.join("cut.gguf");
        for i in 0..64u64 {
            let cut = (bytes.len() as u64 * i / 64) as usize + i as usize;
            std::fs::write(&dst, &bytes[..cut.min(bytes.len() - 1)]).unwrap();
            let err = GgufFile::open(&dst).unwrap_err();
            assert_eq!(variant(&err), "Truncated", "cut at {cut}: {err}");
        }
    }
}
