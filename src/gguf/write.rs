//! The streaming writer: the whole header first, then each tensor's data in declared order.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::read::align;
use super::Array;
use super::GgmlType;
use super::TensorInfo;
use super::Value;
use super::DEFAULT_ALIGNMENT;
use super::MAGIC;
use super::VERSION;
use crate::error::ModelError;

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

pub(super) fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

pub(super) fn put_scalar(out: &mut Vec<u8>, v: &Value) {
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
