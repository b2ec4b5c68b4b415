//! The GGUF reader and writer against ggml's own tables and against each other.

use std::path::Path;

use qtts::gguf::{self, Array, GgmlType, Plan, Value, Writer};

/// This crate's block sizes and bytes per block are ggml's, for every type it knows.
#[test]
fn type_table_matches_ggml() {
    for t in GgmlType::ALL {
        let (blck, size) = qtts::ffi::ggml_type_layout(t as u32);
        assert_eq!(
            (t.block_size(), t.type_size()),
            (blck as u64, size as u64),
            "{t}"
        );
    }
}

/// What the writer writes, the reader reads back: every value type, alignment and data.
#[test]
fn write_then_read_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("x.gguf");
    let mut plan = Plan::default();
    let values = [
        ("u8", Value::U8(7)),
        ("i16", Value::I16(-3)),
        ("u32", Value::U32(1 << 31)),
        ("f32", Value::F32(0.5)),
        ("bool", Value::Bool(true)),
        ("str", Value::Str("héllo".into())),
        ("u64", Value::U64(u64::MAX)),
        ("f64", Value::F64(-1e300)),
        (
            "strs",
            Value::Array(Array::Str(vec!["a".into(), "".into(), "ü".into()])),
        ),
        ("i32s", Value::Array(Array::I32(vec![1, -2, 3]))),
    ];
    for (k, v) in &values {
        plan.set(*k, v.clone());
    }
    plan.add_tensor("a", vec![3, 2], GgmlType::F32);
    plan.add_tensor("b", vec![32, 2], GgmlType::Q8_0);
    let a: Vec<u8> = (0..24).collect();
    let b: Vec<u8> = (0..68).map(|i| i as u8 ^ 0x5a).collect();
    let mut w = Writer::create(&path, &plan).unwrap();
    w.write_tensor("a", &a).unwrap();
    w.begin_tensor("b").unwrap();
    w.write_bytes(&b[..10]).unwrap();
    w.write_bytes(&b[10..]).unwrap();
    w.end_tensor().unwrap();
    w.finish().unwrap();
    let f = gguf::GgufFile::open(&path).unwrap();
    for (k, v) in &values {
        assert_eq!(f.header.get(k), Some(v), "{k}");
    }
    assert_eq!(f.tensor_data("a").unwrap(), &a[..]);
    assert_eq!(f.tensor_data("b").unwrap(), &b[..]);
    assert_eq!(f.header.data_offset % 32, 0);
    assert_eq!(f.header.tensor("b").unwrap().offset % 32, 0);
}

/// A writer dropped before `finish` leaves nothing behind, and one given the wrong tensor or size
/// refuses it.
#[test]
fn unfinished_or_wrong_writes_leave_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("x.gguf");
    let mut plan = Plan::default();
    plan.add_tensor("a", vec![4], GgmlType::F32);
    plan.add_tensor("b", vec![4], GgmlType::F32);
    {
        let mut w = Writer::create(&path, &plan).unwrap();
        assert!(w.write_tensor("b", &[0; 16]).is_err(), "out of order");
        assert!(w.write_tensor("a", &[0; 15]).is_err(), "short");
        w.write_tensor("a", &[0; 16]).unwrap();
        assert!(
            matches!(w.finish(), Err(qtts::ModelError::MissingTensor { tensor, .. }) if tensor == "b")
        );
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(gguf::GgufFile::open(Path::new(&path)).is_err());
}
