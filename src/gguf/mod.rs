//! GGUF files: a validating reader and a streaming writer, in Rust, with no ggml call.
//!
//! Contract:
//! - [`parse`] reads a whole header (metadata and tensor table) from a byte slice and checks every
//!   count, length, offset and size against the slice before it allocates, so its memory stays a
//!   small multiple of the slice's length, and it returns a [`ModelError`](crate::error::ModelError) on any malformation.
//!   It never panics, never aborts and calls nothing outside Rust: it is the gate that every file
//!   passes before llama.cpp or ggml, which abort on some malformed files, may see it.
//! - [`GgufFile::open`] maps a file read-only and parses it; tensor data stays in the mapping.
//! - [`Writer`] writes a header first, then streams each tensor's bytes in order, so a converter only
//!   ever holds one tensor in memory.
//!
//! Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md> (version 3, little-endian).
//! The caps below are this crate's, chosen for Qwen3-TTS files (whose largest array is the 151,936
//! token strings); ggml's own caps (`GGUF_MAX_STRING_LENGTH`, `GGUF_MAX_ARRAY_ELEMENTS`) are 2^30.

mod read;
mod write;

pub use read::{parse, GgufFile};
pub use write::{encode_header, Plan, Writer};

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
