//! GGUF files: a validating reader and a streaming writer, in Rust, with no ggml call.
//!
//! Contract:
//! - [`parse`] reads a whole header (metadata and tensor table) from a byte slice and checks every
//!   count, length, offset and size against the slice before it allocates, so its memory stays a
//!   small multiple of the slice's length, and it returns a [`ModelError`] on any malformation.
//!   It never panics, never aborts and calls nothing outside Rust: it is the gate that every file
//!   passes before llama.cpp or ggml, which abort on some malformed files, may see it.
//! - [`GgufFile::open`] maps a file read-only and parses it; tensor data stays in the mapping.
//! - [`Writer`] writes a header first, then streams each tensor's bytes in order, so a converter only
//!   ever holds one tensor in memory.
//!
//! Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md> (version 3, little-endian).
//! The caps below are this crate's, chosen for Qwen3-TTS files (whose largest array is the 151,936
//! token strings); ggml's own caps (`GGUF_MAX_STRING_LENGTH`, `GGUF_MAX_ARRAY_ELEMENTS`) are 2^30.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::ModelError;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The version this crate writes.
pub const VERSION: u32 = 3;
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key of the alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";

/// Most tensors a file may declare (a Qwen3-TTS pair has under 1,000).
pub const MAX_TENSORS: u64 = 1 << 16;
/// Most metadata pairs a file may declare.
pub const MAX_KV: u64 = 1 << 16;
/// Longest string (key, value or array item), in bytes.
pub const MAX_STRING: u64 = 1 << 24;
/// Longest array, in items (the largest real one, the token list, has 151,936).
pub const MAX_ARRAY: u64 = 1 << 24;
/// Longest tensor name, in bytes (ggml's `GGML_MAX_NAME` is 64 with the terminating NUL).
pub const MAX_TENSOR_NAME: u64 = 63;
/// Highest tensor rank (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Largest alignment accepted.
pub const MAX_ALIGNMENT: u64 = 1 << 16;

/// A ggml tensor type this crate knows the layout of.
///
/// The discriminants are ggml's `enum ggml_type` values; `tests` check the block sizes against ggml.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    IQ4NL = 20,
    IQ4XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    BF16 = 30,
}

impl GgmlType {
    /// Every known type.
    pub const ALL: [GgmlType; 20] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::BF16,
    ];

    /// The type with ggml id `id`, if this crate knows it.
    pub fn from_u32(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| *t as u32 == id)
    }

    /// Elements per block.
    pub fn block_size(self) -> u64 {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4NL => 32,
            Q2K | Q3K | Q4K | Q5K | Q6K | IQ4XS => 256,
        }
    }

    /// Bytes per block.
    pub const fn type_size(self) -> u64 {
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            I8 => 1,
            I64 | F64 => 8,
            Q4_0 | IQ4NL => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q2K => 84,
            Q3K => 110,
            Q4K => 144,
            Q5K => 176,
            Q6K => 210,
            IQ4XS => 136,
        }
    }

    /// ggml's name for the type (`f32`, `q8_0`, `q4_K`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q2K => "q2_K",
            Q3K => "q3_K",
            Q4K => "q4_K",
            Q5K => "q5_K",
            Q6K => "q6_K",
            IQ4NL => "iq4_nl",
            IQ4XS => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            BF16 => "bf16",
        }
    }

    /// Bytes of a tensor of this type and shape, or `None` when the shape is not a whole number of
    /// blocks per row or the size overflows.
    pub fn nbytes(self, ne: &[u64]) -> Option<u64> {
        let first = *ne.first()?;
        if first % self.block_size() != 0 {
            return None;
        }
        let mut n = (first / self.block_size()).checked_mul(self.type_size())?;
        for &d in &ne[1..] {
            n = n.checked_mul(d)?;
        }
        Some(n)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(Array),
}

/// A metadata array: GGUF arrays hold one scalar or string type (nested arrays are rejected).
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Array {
    /// Number of items.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether the array has no item.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn type_code(&self) -> u32 {
        match self {
            Array::U8(_) => 0,
            Array::I8(_) => 1,
            Array::U16(_) => 2,
            Array::I16(_) => 3,
            Array::U32(_) => 4,
            Array::I32(_) => 5,
            Array::F32(_) => 6,
            Array::Bool(_) => 7,
            Array::Str(_) => 8,
            Array::U64(_) => 10,
            Array::I64(_) => 11,
            Array::F64(_) => 12,
        }
    }

    /// The items as `i64`, when they are integers.
    pub fn to_i64s(&self) -> Option<Vec<i64>> {
        Some(match self {
            Array::U8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I8(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I16(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I32(v) => v.iter().map(|&x| x as i64).collect(),
            Array::U64(v) => v.iter().map(|&x| x as i64).collect(),
            Array::I64(v) => v.clone(),
            _ => return None,
        })
    }
}

impl Value {
    fn type_code(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::Str(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// A short name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// The value as an integer, for any integer type.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(x) => x as i64,
            Value::I8(x) => x as i64,
            Value::U16(x) => x as i64,
            Value::I16(x) => x as i64,
            Value::U32(x) => x as i64,
            Value::I32(x) => x as i64,
            Value::U64(x) => i64::try_from(x).ok()?,
            Value::I64(x) => x,
            _ => return None,
        })
    }

    /// The value as a float, for `f32` and `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(x) => Some(x as f64),
            Value::F64(x) => Some(x),
            _ => None,
        }
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// The shape in ggml order (`ne[0]` is the contiguous dimension).
    pub ne: Vec<u64>,
    /// The element type.
    pub ty: GgmlType,
    /// The data's offset from the start of the data section.
    pub offset: u64,
    /// The data's size in bytes.
    pub nbytes: u64,
}

/// A parsed GGUF header: metadata, tensor table and where the data section starts.
#[derive(Debug, Clone)]
pub struct Header {
    /// The format version.
    pub version: u32,
    /// Metadata in file order.
    pub kv: Vec<(String, Value)>,
    /// The tensor table in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section and of each tensor in it.
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

impl Header {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The table entry of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], ModelError> {
        let remain = (self.buf.len() - self.pos) as u64;
        if n > remain {
            return Err(ModelError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos as u64,
                end: (self.pos as u64).saturating_add(n),
                file_len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], ModelError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Checks that `n` items of at least `min_size` bytes each can still be in the buffer, so that
    /// a hostile count is refused before anything is allocated for it.
    fn check_room(
        &self,
        n: u64,
        min_size: u64,
        what: &dyn Fn() -> String,
    ) -> Result<(), ModelError> {
        let remain = (self.buf.len() - self.pos) as u64;
        match n.checked_mul(min_size) {
            Some(need) if need <= remain => Ok(()),
            need => Err(ModelError::Truncated {
                path: self.path.to_path_buf(),
                what: what(),
                offset: self.pos as u64,
                end: need
                    .and_then(|x| x.checked_add(self.pos as u64))
                    .unwrap_or(u64::MAX),
                file_len: self.buf.len() as u64,
            }),
        }
    }

    fn string(&mut self, limit: u64, what: &dyn Fn() -> String) -> Result<String, ModelError> {
        let start = self.pos as u64;
        let len = self.u64(what)?;
        if len > limit {
            return Err(ModelError::LimitExceeded {
                path: self.path.to_path_buf(),
                what: format!("length of {}", what()),
                limit,
                found: len,
            });
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(ModelError::BadString {
                path: self.path.to_path_buf(),
                what: what(),
                offset: start,
            }),
        }
    }
}

fn scalar_size(code: u32) -> Option<u64> {
    Some(match code {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8, // a string: at least its length field
        _ => return None,
    })
}

fn read_scalar(c: &mut Cursor<'_>, code: u32, key: &str) -> Result<Value, ModelError> {
    let what = || format!("value of '{key}'");
    Ok(match code {
        0 => Value::U8(c.array::<1>(&what)?[0]),
        1 => Value::I8(c.array::<1>(&what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        3 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        4 => Value::U32(c.u32(&what)?),
        5 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        6 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        7 => {
            let b = c.array::<1>(&what)?[0];
            if b > 1 {
                return Err(ModelError::BadKey {
                    path: c.path.to_path_buf(),
                    key: key.to_owned(),
                    expected: "a bool (0 or 1)".into(),
                    found: b.to_string(),
                });
            }
            Value::Bool(b == 1)
        }
        8 => Value::Str(c.string(MAX_STRING, &what)?),
        10 => Value::U64(c.u64(&what)?),
        11 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        12 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        _ => {
            return Err(ModelError::BadValueType {
                path: c.path.to_path_buf(),
                key: key.to_owned(),
                found: code,
            })
        }
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str) -> Result<Array, ModelError> {
    let what = || format!("array of '{key}'");
    let code = c.u32(&what)?;
    let n = c.u64(&what)?;
    let Some(min) = scalar_size(code) else {
        return Err(ModelError::BadValueType {
            path: c.path.to_path_buf(),
            key: key.to_owned(),
            found: code,
        });
    };
    if n > MAX_ARRAY {
        return Err(ModelError::LimitExceeded {
            path: c.path.to_path_buf(),
            what: format!("array length of '{key}'"),
            limit: MAX_ARRAY,
            found: n,
        });
    }
    c.check_room(n, min, &what)?;
    macro_rules! items {
        ($variant:ident, $conv:expr) => {{
            let mut v = Vec::with_capacity(n as usize);
            for _ in 0..n {
                let x = read_scalar(c, code, key)?;
                v.push($conv(x));
            }
            Array::$variant(v)
        }};
    }
    // NB: read_scalar returns the variant matching `code`, so each closure's other arm is unreachable
    // by construction; it maps to a default instead of panicking.
    Ok(match code {
        0 => items!(U8, |x| if let Value::U8(x) = x { x } else { 0 }),
        1 => items!(I8, |x| if let Value::I8(x) = x { x } else { 0 }),
        2 => items!(U16, |x| if let Value::U16(x) = x { x } else { 0 }),
        3 => items!(I16, |x| if let Value::I16(x) = x { x } else { 0 }),
        4 => items!(U32, |x| if let Value::U32(x) = x { x } else { 0 }),
        5 => items!(I32, |x| if let Value::I32(x) = x { x } else { 0 }),
        6 => items!(F32, |x| if let Value::F32(x) = x { x } else { 0.0 }),
        7 => items!(Bool, |x| matches!(x, Value::Bool(true))),
        8 => items!(Str, |x| if let Value::Str(x) = x {
            x
        } else {
            String::new()
        }),
        10 => items!(U64, |x| if let Value::U64(x) = x { x } else { 0 }),
        11 => items!(I64, |x| if let Value::I64(x) = x { x } else { 0 }),
        _ => items!(F64, |x| if let Value::F64(x) = x { x } else { 0.0 }),
    })
}

/// Parses and checks a GGUF header held in `buf` (the whole file, or at least its header and data).
///
/// `path` only names the file in errors. Checks: magic, version, caps on every count and length,
/// UTF-8 strings, no duplicate key or tensor, value types, alignment, tensor rank, shape, type,
/// byte size, and that the tensors lie back to back, aligned, in file order, inside `buf`.
pub fn parse(buf: &[u8], path: &Path) -> Result<Header, ModelError> {
    let mut c = Cursor { buf, pos: 0, path };
    let magic: [u8; 4] = c.array(&|| "magic".into())?;
    if magic != MAGIC {
        return Err(ModelError::BadMagic {
            path: path.into(),
            found: magic,
        });
    }
    let version = c.u32(&|| "version".into())?;
    if !(2..=3).contains(&version) {
        return Err(ModelError::UnsupportedVersion {
            path: path.into(),
            found: version,
        });
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;
    for (what, n, limit) in [
        ("n_tensors", n_tensors, MAX_TENSORS),
        ("n_kv", n_kv, MAX_KV),
    ] {
        if n > limit {
            return Err(ModelError::LimitExceeded {
                path: path.into(),
                what: what.into(),
                limit,
                found: n,
            });
        }
    }
    // A pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor entry 8 + 4 + 4 + 8.
    c.check_room(n_kv, 13, &|| format!("{n_kv} metadata pairs"))?;

    let mut kv: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    let mut seen = HashSet::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key_at = c.pos as u64;
        let key = c.string(MAX_STRING, &|| format!("key #{i}"))?;
        if key.is_empty() {
            return Err(ModelError::BadString {
                path: path.into(),
                what: format!("key #{i} (empty)"),
                offset: key_at,
            });
        }
        if !seen.insert(key.clone()) {
            return Err(ModelError::Duplicate {
                path: path.into(),
                what: "key",
                name: key,
            });
        }
        let code = c.u32(&|| format!("type of '{key}'"))?;
        let value = if code == 9 {
            Value::Array(read_array(&mut c, &key)?)
        } else {
            read_scalar(&mut c, code, &key)?
        };
        kv.push((key, value));
    }

    let alignment = match kv.iter().find(|(k, _)| k == KEY_ALIGNMENT) {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() && (*a as u64) <= MAX_ALIGNMENT => {
            *a as u64
        }
        Some((_, v)) => {
            return Err(ModelError::BadAlignment {
                path: path.into(),
                found: v.as_i64().map(|x| x as u64).unwrap_or(0),
            })
        }
    };

    c.check_room(n_tensors, 24, &|| format!("{n_tensors} tensor entries"))?;
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(MAX_STRING, &|| format!("name of tensor #{i}"))?;
        let bad = |problem: String| ModelError::BadTensorInfo {
            path: path.into(),
            tensor: name.clone(),
            problem,
        };
        if name.len() as u64 > MAX_TENSOR_NAME || name.is_empty() {
            return Err(bad(format!(
                "name is {} bytes, expected 1..={MAX_TENSOR_NAME}",
                name.len()
            )));
        }
        let n_dims = c.u32(&|| format!("rank of '{name}'"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(bad(format!("rank {n_dims}, expected 1..={MAX_DIMS}")));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(c.u64(&|| format!("shape of '{name}'"))?);
        }
        if ne.iter().any(|&d| d == 0 || d > i64::MAX as u64) {
            return Err(bad(format!(
                "shape {ne:?} has a dimension of 0 or over 2^63"
            )));
        }
        let code = c.u32(&|| format!("type of '{name}'"))?;
        let Some(ty) = GgmlType::from_u32(code) else {
            return Err(bad(format!(
                "ggml type {code} is not one this engine reads"
            )));
        };
        if ne[0] % ty.block_size() != 0 {
            return Err(bad(format!(
                "row of {} elements is not a whole number of {ty} blocks of {}",
                ne[0],
                ty.block_size()
            )));
        }
        let n_elems = ne.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let nbytes = ty.nbytes(&ne);
        let (Some(n_elems), Some(nbytes)) = (n_elems, nbytes) else {
            return Err(bad(format!("shape {ne:?} of {ty} overflows 64 bits")));
        };
        if n_elems > i64::MAX as u64 {
            return Err(bad(format!("shape {ne:?} has over 2^63 elements")));
        }
        if nbytes > buf.len() as u64 {
            // Larger than the whole file: the file is cut short (or the shape is hostile).
            return Err(ModelError::Truncated {
                path: path.into(),
                what: format!("data of tensor '{name}' ({nbytes} bytes for shape {ne:?} of {ty})"),
                offset: 0,
                end: nbytes,
                file_len: buf.len() as u64,
            });
        }
        let offset = c.u64(&|| format!("offset of '{name}'"))?;
        if !names.insert(name.clone()) {
            return Err(ModelError::Duplicate {
                path: path.into(),
                what: "tensor",
                name,
            });
        }
        tensors.push(TensorInfo {
            name,
            ne,
            ty,
            offset,
            nbytes,
        });
    }

    let data_offset = align(c.pos as u64, alignment);
    let mut expected = 0u64;
    for t in &tensors {
        if t.offset != expected {
            return Err(ModelError::BadTensorOffset {
                path: path.into(),
                tensor: t.name.clone(),
                expected,
                found: t.offset,
            });
        }
        // Both terms are at most the file length (checked above), so this cannot overflow.
        expected = align(expected + t.nbytes, alignment);
        let end = data_offset + t.offset + t.nbytes;
        if end > buf.len() as u64 {
            return Err(ModelError::Truncated {
                path: path.into(),
                what: format!("data of tensor '{}'", t.name),
                offset: data_offset + t.offset,
                end,
                file_len: buf.len() as u64,
            });
        }
    }

    Ok(Header {
        version,
        kv,
        tensors,
        alignment,
        data_offset,
    })
}

fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// A GGUF file mapped read-only, with its checked header.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: memmap2::Mmap,
    /// The checked header.
    pub header: Header,
}

impl GgufFile {
    /// Maps `path` and parses its header with [`parse`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| ModelError::io(path, "open", e))?;
        let len = file
            .metadata()
            .map_err(|e| ModelError::io(path, "stat", e))?
            .len();
        if len < 24 {
            return Err(ModelError::Truncated {
                path: path.into(),
                what: "GGUF header".into(),
                offset: 0,
                end: 24,
                file_len: len,
            });
        }
        // SAFETY: the mapping is read-only and private to this struct. Another process truncating
        // the file while it is mapped would fault on access; that is the usual contract of mapped
        // model files (llama.cpp maps them the same way).
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| ModelError::io(path, "mmap", e))?;
        let header = parse(&map, path)?;
        Ok(GgufFile {
            path: path.into(),
            map,
            header,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The raw bytes of tensor `name`.
    pub fn tensor_data(&self, name: &str) -> Option<&[u8]> {
        let t = self.header.tensor(name)?;
        let start = (self.header.data_offset + t.offset) as usize;
        // parse() checked that the range lies inside the file.
        self.map.get(start..start + t.nbytes as usize)
    }

    /// Drops the pages of tensor `name`'s data from this process's resident set, once its bytes
    /// have been copied elsewhere: loading then never holds a whole file resident. A later
    /// [`GgufFile::tensor_data`] faults the same bytes back in from the file.
    pub fn release(&self, name: &str) {
        #[cfg(unix)]
        if let Some(t) = self.header.tensor(name) {
            const PAGE: usize = 4096;
            let start = (self.header.data_offset + t.offset) as usize;
            let first = start / PAGE * PAGE;
            let end = (start + t.nbytes as usize).min(self.map.len());
            // SAFETY: the mapping is private and read-only, so the dropped pages hold nothing
            // that the file does not: a later access maps the same bytes again. Rounding to whole
            // pages may touch a neighbour's pages, which is harmless for the same reason.
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    first,
                    end.saturating_sub(first),
                )
            };
        }
    }
}

/// Writes a GGUF file: the whole header first, then each tensor's data in declared order.
///
/// The file is written under a temporary name beside `path` and renamed into place by
/// [`Writer::finish`], so an interrupted conversion never leaves a file that looks complete.
#[derive(Debug)]
pub struct Writer {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    tensors: Vec<TensorInfo>,
    next: usize,
    open: Option<u64>,
    written: u64,
}

/// The metadata and tensor table of a file to write.
#[derive(Debug, Default, Clone)]
pub struct Plan {
    kv: BTreeMap<String, Value>,
    order: Vec<String>,
    tensors: Vec<(String, Vec<u64>, GgmlType)>,
}

impl Plan {
    /// Sets metadata `key`; a later set of the same key replaces the value in place.
    pub fn set(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        if self.kv.insert(key.clone(), value).is_none() {
            self.order.push(key);
        }
    }

    /// Declares a tensor; its data must later be written in declaration order.
    pub fn add_tensor(&mut self, name: impl Into<String>, ne: Vec<u64>, ty: GgmlType) {
        self.tensors.push((name.into(), ne, ty));
    }

    /// The declared tensors.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &[u64], GgmlType)> {
        self.tensors
            .iter()
            .map(|(n, ne, t)| (n.as_str(), ne.as_slice(), *t))
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_scalar(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::Str(s) => put_string(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            out.extend_from_slice(&a.type_code().to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            macro_rules! each {
                ($v:expr, $wrap:ident) => {
                    for x in $v {
                        put_scalar(out, &Value::$wrap(x.clone()));
                    }
                };
            }
            match a {
                Array::U8(v) => each!(v, U8),
                Array::I8(v) => each!(v, I8),
                Array::U16(v) => each!(v, U16),
                Array::I16(v) => each!(v, I16),
                Array::U32(v) => each!(v, U32),
                Array::I32(v) => each!(v, I32),
                Array::F32(v) => each!(v, F32),
                Array::Bool(v) => each!(v, Bool),
                Array::Str(v) => each!(v, Str),
                Array::U64(v) => each!(v, U64),
                Array::I64(v) => each!(v, I64),
                Array::F64(v) => each!(v, F64),
            }
        }
    }
}

/// Serializes a header for `plan` (tensor offsets computed back to back at `alignment`).
pub fn encode_header(
    plan: &Plan,
    alignment: u64,
) -> Result<(Vec<u8>, Vec<TensorInfo>), ModelError> {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(plan.tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(plan.order.len() as u64).to_le_bytes());
    for key in &plan.order {
        let v = &plan.kv[key];
        put_string(&mut out, key);
        out.extend_from_slice(&v.type_code().to_le_bytes());
        put_scalar(&mut out, v);
    }
    let mut infos = Vec::with_capacity(plan.tensors.len());
    let mut offset = 0u64;
    for (name, ne, ty) in &plan.tensors {
        let nbytes = ty.nbytes(ne).ok_or_else(|| ModelError::Unsupported {
            what: format!("tensor '{name}'"),
            expected: format!("rows that are whole {ty} blocks of {}", ty.block_size()),
            found: format!("shape {ne:?}"),
        })?;
        put_string(&mut out, name);
        out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
        for d in ne {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&(*ty as u32).to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        infos.push(TensorInfo {
            name: name.clone(),
            ne: ne.clone(),
            ty: *ty,
            offset,
            nbytes,
        });
        offset = align(offset + nbytes, alignment);
    }
    let padded = align(out.len() as u64, alignment) as usize;
    out.resize(padded, 0);
    Ok((out, infos))
}

impl Writer {
    /// Creates `path`'s temporary sibling and writes the header of `plan` to it.
    pub fn create(path: impl AsRef<Path>, plan: &Plan) -> Result<Self, ModelError> {
        let path = path.as_ref().to_path_buf();
        let mut tmp = path.clone().into_os_string();
        tmp.push(".partial");
        let tmp = PathBuf::from(tmp);
        let (header, tensors) = encode_header(plan, DEFAULT_ALIGNMENT)?;
        let file = File::create(&tmp).map_err(|e| ModelError::io(&tmp, "create", e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&header)
            .map_err(|e| ModelError::io(&tmp, "write", e))?;
        Ok(Writer {
            path,
            tmp,
            out: Some(out),
            tensors,
            next: 0,
            open: None,
            written: header.len() as u64,
        })
    }

    /// The table entry of the tensor whose data is due next, if any.
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.tensors.get(self.next)
    }

    /// Writes the data of the next declared tensor, which must be `name` with exactly its size.
    pub fn write_tensor(&mut self, name: &str, data: &[u8]) -> Result<(), ModelError> {
        // Refuse a wrong size before any byte goes out, so the writer stays usable.
        if let Some(t) = self
            .tensors
            .get(self.next)
            .filter(|t| t.nbytes != data.len() as u64)
        {
            return Err(ModelError::Unsupported {
                what: format!("writing tensor '{name}' to {}", self.path.display()),
                expected: format!("'{}' of {} bytes", t.name, t.nbytes),
                found: format!("'{name}' of {} bytes", data.len()),
            });
        }
        self.begin_tensor(name)?;
        self.write_bytes(data)?;
        self.end_tensor()
    }

    /// Starts the data of the next declared tensor, which must be `name`; its bytes then come in
    /// any number of [`Writer::write_bytes`] calls, closed by [`Writer::end_tensor`].
    pub fn begin_tensor(&mut self, name: &str) -> Result<(), ModelError> {
        match self.tensors.get(self.next) {
            Some(t) if t.name == name && self.open.is_none() => {
                self.open = Some(0);
                Ok(())
            }
            t => Err(ModelError::Unsupported {
                what: format!("writing tensor '{name}' to {}", self.path.display()),
                expected: t.map_or("no more tensors".into(), |t| {
                    format!("tensor '{}' next", t.name)
                }),
                found: format!("'{name}'"),
            }),
        }
    }

    /// Appends bytes to the tensor begun by [`Writer::begin_tensor`].
    pub fn write_bytes(&mut self, data: &[u8]) -> Result<(), ModelError> {
        let (Some(done), Some(t)) = (self.open, self.tensors.get(self.next)) else {
            return Err(ModelError::Unsupported {
                what: format!("writing bytes to {}", self.path.display()),
                expected: "a begun tensor".into(),
                found: "none".into(),
            });
        };
        if done + data.len() as u64 > t.nbytes {
            return Err(ModelError::Unsupported {
                what: format!("writing tensor '{}' to {}", t.name, self.path.display()),
                expected: format!("{} bytes", t.nbytes),
                found: format!("{} bytes", done + data.len() as u64),
            });
        }
        let out = self.out.as_mut().expect("writer is open until finish");
        out.write_all(data)
            .map_err(|e| ModelError::io(&self.tmp, "write", e))?;
        self.open = Some(done + data.len() as u64);
        Ok(())
    }

    /// Closes the tensor begun by [`Writer::begin_tensor`], checking its size, and pads it.
    pub fn end_tensor(&mut self) -> Result<(), ModelError> {
        let Some(t) = self.tensors.get(self.next) else {
            return Err(ModelError::Unsupported {
                what: format!("closing a tensor of {}", self.path.display()),
                expected: "a begun tensor".into(),
                found: "none".into(),
            });
        };
        if self.open != Some(t.nbytes) {
            return Err(ModelError::Unsupported {
                what: format!("writing tensor '{}' to {}", t.name, self.path.display()),
                expected: format!("{} bytes", t.nbytes),
                found: format!("{:?} bytes", self.open),
            });
        }
        let pad = align(t.nbytes, DEFAULT_ALIGNMENT) - t.nbytes;
        let out = self.out.as_mut().expect("writer is open until finish");
        out.write_all(&[0u8; DEFAULT_ALIGNMENT as usize][..pad as usize])
            .map_err(|e| ModelError::io(&self.tmp, "write", e))?;
        self.written += t.nbytes + pad;
        self.next += 1;
        self.open = None;
        Ok(())
    }

    /// Checks that every declared tensor was written, flushes, syncs and renames the file into place.
    pub fn finish(mut self) -> Result<PathBuf, ModelError> {
        if self.next != self.tensors.len() {
            let missing = self.tensors[self.next].name.clone();
            return Err(ModelError::MissingTensor {
                path: self.tmp.clone(),
                tensor: missing,
            });
        }
        let out = self.out.take().expect("writer is open until finish");
        let file = out
            .into_inner()
            .map_err(|e| ModelError::io(&self.tmp, "flush", e.into_error()))?;
        file.sync_all()
            .map_err(|e| ModelError::io(&self.tmp, "sync", e))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path)
            .map_err(|e| ModelError::io(&self.path, "rename", e))?;
        Ok(self.path.clone())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Not finished: remove the partial file so nothing incomplete is left behind.
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
