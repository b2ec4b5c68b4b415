//! The validating reader: every offset, count and size checked against the file before use.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::Array;
use super::GgmlType;
use super::Header;
use super::TensorInfo;
use super::Value;
use super::DEFAULT_ALIGNMENT;
use super::KEY_ALIGNMENT;
use super::MAGIC;
use super::MAX_ALIGNMENT;
use super::MAX_ARRAY;
use super::MAX_DIMS;
use super::MAX_KV;
use super::MAX_STRING;
use super::MAX_TENSORS;
use super::MAX_TENSOR_NAME;
use crate::error::ModelError;

pub(super) struct Cursor<'a> {
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

pub(super) fn scalar_size(code: u32) -> Option<u64> {
    Some(match code {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8, // a string: at least its length field
        _ => return None,
    })
}

pub(super) fn read_scalar(c: &mut Cursor<'_>, code: u32, key: &str) -> Result<Value, ModelError> {
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

pub(super) fn read_array(c: &mut Cursor<'_>, key: &str) -> Result<Array, ModelError> {
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

pub(super) fn align(x: u64, a: u64) -> u64 {
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
