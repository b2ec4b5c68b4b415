//! A tensor of a [`Context`](super::Context): its shape, data, views and names.

use super::sys;
use std::ffi::CStr;
use std::ptr::NonNull;

use super::context::Tensor;
use super::quant::dequantize_into;
use super::GgmlError;

impl<'ctx> Tensor<'ctx> {
    /// The shape (ggml order, trailing ones included).
    pub fn ne(&self) -> [usize; 4] {
        // SAFETY: the tensor is live while its context is.
        let ne = unsafe { (*self.ptr.as_ptr()).ne };
        ne.map(|x| x as usize)
    }

    /// Names the tensor (at most 63 bytes; longer names are cut), for [`Context::get`](super::Context::get).
    pub fn set_name(&self, name: &str) -> Self {
        let mut bytes: Vec<u8> = name.bytes().filter(|&b| b != 0).take(63).collect();
        bytes.push(0);
        // SAFETY: a NUL-terminated name of at most 64 bytes, which ggml copies.
        unsafe { sys::ggml_set_name(self.ptr.as_ptr(), bytes.as_ptr().cast()) };
        *self
    }

    /// The tensor's name (empty when it has none; lossy where it is not UTF-8).
    pub fn name(&self) -> String {
        // SAFETY: the tensor is live; its name is NUL-terminated by ggml.
        let name = unsafe { CStr::from_ptr(sys::ggml_get_name(self.ptr.as_ptr())) };
        name.to_string_lossy().into_owned()
    }

    /// Whether the tensor's type is `ty`.
    pub fn is_type(&self, ty: crate::gguf::GgmlType) -> bool {
        // SAFETY: the tensor is live; its type is a field read.
        unsafe { (*self.ptr.as_ptr()).type_ == ty as u32 as sys::ggml_type }
    }

    /// Number of elements.
    pub fn n_elems(&self) -> usize {
        self.ne().iter().product()
    }

    /// The address of the tensor's data (0 while it has none), for alignment checks.
    pub fn data_address(&self) -> usize {
        // SAFETY: the tensor is live; its data pointer is a field read.
        unsafe { sys::ggml_get_data(self.ptr.as_ptr()) as usize }
    }

    /// Bytes of data.
    pub fn nbytes(&self) -> usize {
        // SAFETY: the tensor is live.
        unsafe { sys::ggml_nbytes(self.ptr.as_ptr()) }
    }

    /// Copies raw bytes (of the tensor's own type) into the tensor.
    pub fn write_bytes(&self, src: &[u8]) -> Result<(), GgmlError> {
        if src.len() != self.nbytes() {
            return Err(GgmlError::Shape {
                what: "tensor bytes",
                expected: format!("{} bytes", self.nbytes()),
                found: format!("{} bytes", src.len()),
            });
        }
        self.check_data()?;
        // SAFETY: sizes agree, the data exists; no reference into it exists while it is written.
        unsafe {
            let p = sys::ggml_get_data(self.ptr.as_ptr()).cast::<u8>();
            std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len());
        }
        Ok(())
    }

    /// Sets bytes `offset..offset + len` of the tensor's data to zero.
    pub fn zero_bytes(&self, offset: usize, len: usize) -> Result<(), GgmlError> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.nbytes())
        {
            return Err(GgmlError::Shape {
                what: "tensor byte range",
                expected: format!("a range inside {} bytes", self.nbytes()),
                found: format!("{len} bytes at {offset}"),
            });
        }
        self.check_data()?;
        // SAFETY: the range lies inside the data (checked above), which exists; no reference
        // into it exists while it is written.
        unsafe {
            let p = sys::ggml_get_data(self.ptr.as_ptr()).cast::<u8>();
            std::ptr::write_bytes(p.add(offset), 0, len);
        }
        Ok(())
    }

    /// The tensor's raw bytes (of its own type).
    pub fn read_bytes(&self) -> Result<Vec<u8>, GgmlError> {
        self.check_data()?;
        let mut out = vec![0u8; self.nbytes()];
        // SAFETY: the data exists and holds nbytes bytes; nothing writes it while it is copied
        // (graphs compute inside Graph::compute only).
        unsafe {
            let p = sys::ggml_get_data(self.ptr.as_ptr()).cast::<u8>();
            std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len());
        }
        Ok(out)
    }

    /// Writes i32 values (row indices, positions) into an i32 tensor.
    pub fn write_i32(&self, src: &[i32]) -> Result<(), GgmlError> {
        let bytes: Vec<u8> = src.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.write_bytes(&bytes)
    }

    /// Copies the values of an f32 tensor into `out`, which must have the tensor's length.
    pub fn read_f32(&self, out: &mut [f32]) -> Result<(), GgmlError> {
        self.check_len(out.len())?;
        // SAFETY: tensors of this module are f32, contiguous, allocated with data in a context that
        // is not Sync, and no reference into the data outlives a call of this module, so nothing
        // writes it while it is copied (graphs compute inside Graph::compute only).
        unsafe {
            let p = sys::ggml_get_data_f32(self.ptr.as_ptr());
            std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// The values of an f32 tensor.
    pub fn to_vec(&self) -> Vec<f32> {
        let mut v = vec![0.0; self.n_elems()];
        // The length matches by construction.
        let _ = self.read_f32(&mut v);
        v
    }

    /// Copies `src`, which must have the tensor's length, into an f32 tensor.
    pub fn write_f32(&self, src: &[f32]) -> Result<(), GgmlError> {
        self.check_len(src.len())?;
        // SAFETY: as in read_f32; no reference into the data exists while it is written.
        unsafe {
            let p = sys::ggml_get_data_f32(self.ptr.as_ptr());
            std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len());
        }
        Ok(())
    }

    /// Dequantizes row `row` (the rows of `ne[0]` values, counted over all higher dimensions) of
    /// a contiguous tensor of any type ggml converts to f32 into `out` (length `ne[0]`).
    pub fn read_row(&self, row: usize, out: &mut [f32]) -> Result<(), GgmlError> {
        let ne = self.ne();
        let rows = ne[1] * ne[2] * ne[3];
        // SAFETY: the tensor is live; these are field reads.
        let (ty, nb1) = unsafe { ((*self.ptr.as_ptr()).type_, (*self.ptr.as_ptr()).nb[1]) };
        // ggml_type is a C enum: u32 here, i32 on some targets.
        #[allow(clippy::unnecessary_cast)]
        let gty = crate::gguf::GgmlType::from_u32(ty as u32);
        let row_bytes = gty.and_then(|t| t.nbytes(&[ne[0] as u64]));
        match (gty, row_bytes) {
            (Some(gty), Some(rb)) if row < rows && out.len() == ne[0] && rb as usize == nb1 => {
                // SAFETY: the tensor is contiguous (nb[1] is one packed row) and holds `rows`
                // rows; the bytes are only read, and graphs never write weight tensors.
                let data = unsafe {
                    let p = sys::ggml_get_data(self.ptr.as_ptr()).cast::<u8>();
                    std::slice::from_raw_parts(p.add(row * nb1), nb1)
                };
                dequantize_into(gty, data, out)
            }
            _ => Err(GgmlError::Shape {
                what: "tensor row",
                expected: format!("a row below {rows} of {} values", ne[0]),
                found: format!("row {row} into {} values (type {ty})", out.len()),
            }),
        }
    }

    /// Tensors of a graph-allocated context that the graph does not use have no data.
    pub(super) fn check_data(&self) -> Result<(), GgmlError> {
        // SAFETY: the tensor is live; reading its data pointer is a field read.
        if unsafe { sys::ggml_get_data(self.ptr.as_ptr()) }.is_null() {
            return Err(GgmlError::Shape {
                what: "tensor data",
                expected: "a tensor with data".into(),
                found: format!(
                    "'{}', which has none (a graph-allocated tensor its graph does not use)",
                    self.name()
                ),
            });
        }
        Ok(())
    }

    pub(super) fn check_len(&self, n: usize) -> Result<(), GgmlError> {
        self.check_data()?;
        // SAFETY: the tensor is live; reading its type is a field read.
        let ty = unsafe { (*self.ptr.as_ptr()).type_ };
        if n != self.n_elems() || ty != sys::GGML_TYPE_F32 {
            return Err(GgmlError::Shape {
                what: "tensor data",
                expected: format!("{} f32 values", self.n_elems()),
                found: format!("{n} values (tensor type {ty})"),
            });
        }
        Ok(())
    }
}

/// A tensor handle without a lifetime: an output of [`OwnedGraph::build`](super::OwnedGraph::build).
#[derive(Debug, Clone, Copy)]
pub struct Node(pub(super) NonNull<sys::ggml_tensor>);

impl Tensor<'_> {
    /// This tensor as a graph output.
    pub fn node(self) -> Node {
        Node(self.ptr)
    }
}
