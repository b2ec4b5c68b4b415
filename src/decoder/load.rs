//! Reading the decoder's weights from the mmproj file: names, layouts and the transposed
//! convolutions split into this-block and next-block matrices.

use crate::error::ModelError;
use crate::ffi::Context;
use crate::gguf::{GgmlType, GgufFile};
use crate::kernels::{bf16, int8, panel};

/// Copies `n` elements of `es` bytes each: element `i` of the output is element `index(i)` of
/// `data`.
fn gather(data: &[u8], es: usize, n: usize, index: impl Fn(usize) -> usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * es);
    for i in 0..n {
        let j = index(i) * es;
        out.extend_from_slice(&data[j..j + es]);
    }
    out
}

/// The little-endian bytes of `v`.
fn bytes_of<T: Copy, const N: usize>(v: &[T], le: fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| le(x)).collect()
}

pub(super) struct Loader<'f> {
    pub(super) f: &'f GgufFile,
    pub(super) w: Context,
    /// Store conv, transposed-conv and linear matrices in this type when their rows are whole
    /// blocks (see [`Decoder::load_with`]).
    pub(super) matrices: Option<GgmlType>,
    /// Store the matrices of the host products (see [`Loader::conv`] and [`Loader::transposed`])
    /// as f32, convs in tap-major order.
    pub(super) host: bool,
    /// With `host`: store them as bf16 tiles ([`crate::kernels::bf16::pack`]) where they fit.
    pub(super) bf16: bool,
    /// With `host`: store the conv and transposed-conv matrices that [`super::int8_layer`] names
    /// as 8-bit integers ([`crate::kernels::int8::pack`]) where they fit.
    pub(super) int8: bool,
    /// With `host` and not `bf16`: store every conv and transposed-conv matrix whose columns fit
    /// as f32 panels ([`crate::kernels::panel::pack`]), marked by a `<name>.panel` stand-in, so
    /// that the graph computes all of them on the host (no packing per call: few rows pay too).
    pub(super) panel: bool,
    /// With `panel`: store the panel matrices [`super::f16_layer`] names as f16
    /// ([`crate::kernels::panel::pack_f16`]) where the tier's panel kernel reads them.
    pub(super) f16: bool,
    /// The tensor the previous [`Loader::source`] call read: each loading function reads one, so
    /// its pages are released (see [`GgufFile::release`]) when the next is read, and the file is
    /// never resident as a whole.
    pub(super) last: std::cell::RefCell<Option<String>>,
}

impl Loader<'_> {
    pub(super) fn source(&self, name: &str) -> Result<(GgmlType, &[u8], Vec<usize>), ModelError> {
        if let Some(prev) = self.last.replace(Some(name.to_string())) {
            self.f.release(&prev);
        }
        let missing = || ModelError::MissingTensor {
            path: self.f.path().into(),
            tensor: name.into(),
        };
        let t = self.f.header.tensor(name).ok_or_else(missing)?;
        let data = self.f.tensor_data(name).ok_or_else(missing)?;
        Ok((t.ty, data, t.ne.iter().map(|&x| x as usize).collect()))
    }

    pub(super) fn shape_err(&self, name: &str, expected: &[usize], found: &[usize]) -> ModelError {
        ModelError::WrongShape {
            path: self.f.path().into(),
            tensor: name.into(),
            expected: expected.iter().map(|&x| x as u64).collect(),
            found: found.iter().map(|&x| x as u64).collect(),
        }
    }

    pub(super) fn put(
        &self,
        name: &str,
        ty: GgmlType,
        ne: &[usize],
        bytes: &[u8],
    ) -> Result<(), ModelError> {
        let t = self.w.new_tensor(ty, ne).map_err(ModelError::from)?;
        t.write_bytes(bytes).map_err(ModelError::from)?;
        t.set_name(name);
        Ok(())
    }

    /// As [`Loader::put`] for a packed matrix `[k, n]`, its data starting at a multiple of
    /// `align` bytes (the kernels load whole cache lines).
    fn put_lines(
        &self,
        name: &str,
        ty: GgmlType,
        ne: [usize; 2],
        bytes: &[u8],
        align: usize,
    ) -> Result<(), ModelError> {
        let t = self
            .w
            .new_tensor_aligned(ty, &ne, align)
            .map_err(ModelError::from)?;
        t.write_bytes(bytes).map_err(ModelError::from)?;
        t.set_name(name);
        Ok(())
    }

    /// A host product's f32 matrix `v` (`[k, n]`): as 8-bit integers when [`Loader::int8`] and
    /// [`super::int8_layer`] name it and they fit, as bf16 tiles when [`Loader::bf16`] and the tiles fit its `k / taps` input
    /// channels, as f32 panels when [`Loader::panel`] and its
    /// columns fit them (f16 panels with [`Loader::f16`] where [`super::f16_layer`] names it),
    /// else as f32.
    pub(super) fn put_host(
        &self,
        name: &str,
        v: &[f32],
        k: usize,
        n: usize,
        taps: usize,
    ) -> Result<(), ModelError> {
        if self.int8 && super::int8_layer(name) && int8::fits(k / taps, n) {
            if let Some(p) = int8::pack(v, taps, k / taps, n) {
                // Panel lines on cache lines (see `int8::LINE`).
                let rows = p.len() / n;
                return self.put_lines(name, GgmlType::I8, [rows, n], &p, int8::LINE);
            }
        }
        if self.bf16 && bf16::fits(k / taps, n) {
            if let Some(p) = bf16::pack(v, k, n) {
                // Tile rows on cache lines (see `bf16::LINE`).
                let bytes = bytes_of(&p, u16::to_le_bytes);
                return self.put_lines(name, GgmlType::BF16, [k, n], &bytes, bf16::LINE);
            }
        }
        if self.panel && !self.bf16 {
            // f16 where asked and the kernel reads it (and every value is in f16's range),
            // else f32: panel rows on (half) cache lines, see `panel::LINE`.
            let f16 = self.f16
                && super::f16_layer(name)
                && panel::Kernel::active().is_some_and(panel::Kernel::reads_f16);
            let packed = match f16.then(|| panel::pack_f16(v, k, n)).flatten() {
                Some(p) => Some((GgmlType::F16, bytes_of(&p, u16::to_le_bytes))),
                None => {
                    panel::pack(v, k, n).map(|p| (GgmlType::F32, bytes_of(&p, f32::to_le_bytes)))
                }
            };
            if let Some((ty, bytes)) = packed {
                self.put_lines(name, ty, [k, n], &bytes, panel::LINE)?;
                return self.put(&format!("{name}.panel"), GgmlType::F32, &[1], &[0; 4]);
            }
        }
        self.put(name, GgmlType::F32, &[k, n], &bytes_of(v, f32::to_le_bytes))
    }

    /// A matrix `[cols, rows]`, converted to the requested matrix type when its rows are whole
    /// blocks of it and it is stored as f32 or f16; else as it is.
    pub(super) fn put_matrix(
        &self,
        name: &str,
        ty: GgmlType,
        ne: [usize; 2],
        data: &[u8],
    ) -> Result<(), ModelError> {
        if (self.bf16 || self.panel) && matches!(ty, GgmlType::F32 | GgmlType::F16) {
            let v = crate::ffi::dequantize(ty, data, ne[0] * ne[1]).map_err(ModelError::from)?;
            return self.put_host(name, &v, ne[0], ne[1], 1);
        }
        match self.matrices {
            Some(to)
                if to != ty
                    && matches!(ty, GgmlType::F32 | GgmlType::F16)
                    && (ne[0] as u64).is_multiple_of(to.block_size()) =>
            {
                let v =
                    crate::ffi::dequantize(ty, data, ne[0] * ne[1]).map_err(ModelError::from)?;
                let q = crate::ffi::quantize(to, &v, ne[0]).map_err(ModelError::from)?;
                self.put(name, to, &ne, &q)
            }
            _ => self.put(name, ty, &ne, data),
        }
    }

    /// A tensor copied as it is, with shape `ne` (same element count); 2-D matrices (not
    /// codebooks) go through [`Loader::put_matrix`].
    pub(super) fn copy(&self, name: &str, ne: &[usize]) -> Result<(), ModelError> {
        let (ty, data, found) = self.source(name)?;
        if found.iter().product::<usize>() != ne.iter().product::<usize>() {
            return Err(self.shape_err(name, ne, &found));
        }
        if ne.len() == 2 && ne[1] > 1 && !name.contains("codebook") {
            return self.put_matrix(name, ty, [ne[0], ne[1]], data);
        }
        self.put(name, ty, ne, data)
    }

    /// A stride-1 conv kernel (`[k, c_in, c_out]`) as the matrix `[k · c_in, c_out]`: for
    /// [`Context::im2col_1d`] columns (same bytes, with a `<name>.kshape` stand-in), or, when
    /// `host` and [`Loader::host`], as f32 in tap-major order (index `c + c_in · j`) for
    /// [`Context::conv_gemm`], which the graph picks by the stand-in's absence.
    pub(super) fn conv(
        &self,
        name: &str,
        k: usize,
        c_in: usize,
        c_out: usize,
        host: bool,
    ) -> Result<(), ModelError> {
        let (ty, data, found) = self.source(name)?;
        if found != [k, c_in, c_out] || !matches!(ty, GgmlType::F32 | GgmlType::F16) {
            return Err(self.shape_err(name, &[k, c_in, c_out], &found));
        }
        if (host || self.bf16 || self.panel || self.int8) && self.host {
            let v = crate::ffi::dequantize(ty, data, k * c_in * c_out).map_err(ModelError::from)?;
            // Element (c, j, o) of the output sits at c + c_in·(j + k·o); source at j + k·(c + c_in·o).
            let t: Vec<f32> = (0..k * c_in * c_out)
                .map(|i| {
                    let (c, rest) = (i % c_in, i / c_in);
                    let (j, o) = (rest % k, rest / k);
                    v[j + k * (c + c_in * o)]
                })
                .collect();
            return self.put_host(name, &t, k * c_in, c_out, k);
        }
        // im2col reads only the kernel's shape: a small f32 stand-in `[k, c_in]` carries it,
        // whatever the kernel matrix's type.
        let shape = vec![0u8; 4 * k * c_in];
        self.put(&format!("{name}.kshape"), GgmlType::F32, &[k, c_in], &shape)?;
        self.put_matrix(name, ty, [k * c_in, c_out], data)
    }

    /// A depthwise kernel (`[k, 1, c]`) as `k` f32 vectors `<name>.tap{j}` `[c]`.
    pub(super) fn depthwise(&self, name: &str, k: usize, c: usize) -> Result<(), ModelError> {
        let (ty, data, found) = self.source(name)?;
        if found != [k, 1, c] {
            return Err(self.shape_err(name, &[k, 1, c], &found));
        }
        let v = crate::ffi::dequantize(ty, data, k * c).map_err(ModelError::from)?;
        for j in 0..k {
            let tap: Vec<u8> = (0..c).flat_map(|i| v[j + k * i].to_le_bytes()).collect();
            self.put(&format!("{name}.tap{j}"), GgmlType::F32, &[c], &tap)?;
        }
        Ok(())
    }

    /// A transposed-conv kernel (`[k, c_out, c_in]`, stride `r`, `k` = `r` or `2r`) as matrices
    /// `<name>.cur` (taps `0..r`) and, when `k = 2r`, `<name>.prev` (taps `r..2r`), each
    /// `[c_in, r·c_out]` with output index `o + c_out·j`; as f32 when `host` and [`Loader::host`]
    /// (for [`Context::conv_gemm`]).
    pub(super) fn transposed(
        &self,
        name: &str,
        k: usize,
        r: usize,
        c_in: usize,
        c_out: usize,
        host: bool,
    ) -> Result<(), ModelError> {
        let (ty, data, found) = self.source(name)?;
        if found != [k, c_out, c_in] || !matches!(ty, GgmlType::F32 | GgmlType::F16) {
            return Err(self.shape_err(name, &[k, c_out, c_in], &found));
        }
        let es = ty.type_size() as usize;
        for (part, j0) in [("cur", 0), ("prev", r)] {
            if j0 + r > k {
                continue;
            }
            // Output element (c, o, j) sits at c + c_in·(o + c_out·j); source at j + k·(o + c_out·c).
            let bytes = gather(data, es, c_in * c_out * r, |i| {
                let (c, rest) = (i % c_in, i / c_in);
                let (o, j) = (rest % c_out, rest / c_out);
                (j0 + j) + k * (o + c_out * c)
            });
            let part = format!("{name}.{part}");
            let packed = self.bf16 || self.panel || self.int8;
            if (host || packed) && self.host && (ty != GgmlType::F32 || packed) {
                // f16 widened to f32, or f32 packed to bf16 or panels, for the host product.
                let v = crate::ffi::dequantize(ty, &bytes, c_in * r * c_out)
                    .map_err(ModelError::from)?;
                self.put_host(&part, &v, c_in, r * c_out, 1)?;
            } else {
                // `put_matrix` keeps f32 as it is in host mode (`matrices` is `None` there).
                self.put_matrix(&part, ty, [c_in, r * c_out], &bytes)?;
            }
        }
        Ok(())
    }
}
