//! ggml's own quantizers and dequantizers, and its table of type layouts.

use super::sys;

use super::GgmlError;

/// Quantizes `rows` rows of `n_per_row` f32 values to ggml type `ty` with ggml's own quantizer.
///
/// Returns the quantized bytes; `src.len()` must be `rows · n_per_row` and `n_per_row` a multiple of
/// the type's block size.
pub fn quantize(
    ty: crate::gguf::GgmlType,
    src: &[f32],
    n_per_row: usize,
) -> Result<Vec<u8>, GgmlError> {
    let bad = |found: String| GgmlError::Shape {
        what: "quantize",
        expected: format!("rows of a multiple of {} values", ty.block_size()),
        found,
    };
    if n_per_row == 0
        || !src.len().is_multiple_of(n_per_row)
        || !(n_per_row as u64).is_multiple_of(ty.block_size())
    {
        return Err(bad(format!("{} values in rows of {n_per_row}", src.len())));
    }
    // SAFETY: pure query on a valid type id.
    if unsafe { sys::ggml_quantize_requires_imatrix(ty as u32 as sys::ggml_type) } {
        return Err(bad(format!("{ty}, which needs an importance matrix")));
    }
    let rows = src.len() / n_per_row;
    let nbytes = ty
        .nbytes(&[n_per_row as u64, rows as u64])
        .ok_or_else(|| bad("overflow".into()))? as usize;
    let mut dst = vec![0u8; nbytes];
    // SAFETY: src holds rows·n_per_row floats, dst holds exactly the bytes ggml writes for them
    // (ty.nbytes agrees with ggml_row_size, checked by this crate's tests); no importance matrix is
    // passed, so only types that do not require one may be used (the caller's types: q8_0, q4_K...).
    let written = unsafe {
        sys::ggml_quantize_chunk(
            ty as u32 as sys::ggml_type,
            src.as_ptr(),
            dst.as_mut_ptr().cast(),
            0,
            rows as i64,
            n_per_row as i64,
            std::ptr::null(),
        )
    };
    if written != nbytes {
        return Err(bad(format!(
            "ggml wrote {written} bytes, expected {nbytes}"
        )));
    }
    Ok(dst)
}

/// ggml's own block size and bytes per block for type id `id`, to check this crate's table.
pub fn ggml_type_layout(id: u32) -> (i64, usize) {
    // SAFETY: callers pass ids below GGML_TYPE_COUNT (checked here); ggml's trait table has an
    // entry for each.
    unsafe {
        if id >= sys::GGML_TYPE_COUNT {
            return (0, 0);
        }
        (
            sys::ggml_blck_size(id as sys::ggml_type),
            sys::ggml_type_size(id as sys::ggml_type),
        )
    }
}

/// Dequantizes `data` (whole rows of ggml type `ty`, `n` values) to f32 with ggml's own routine.
pub fn dequantize(ty: crate::gguf::GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, GgmlError> {
    let mut out = vec![0f32; n];
    dequantize_into(ty, data, &mut out)?;
    Ok(out)
}

/// [`dequantize`] into a caller's buffer, whose length is the number of values; allocates nothing.
pub fn dequantize_into(
    ty: crate::gguf::GgmlType,
    data: &[u8],
    out: &mut [f32],
) -> Result<(), GgmlError> {
    let n = out.len();
    let expected = ty.nbytes(&[n as u64]);
    if n == 0 || expected != Some(data.len() as u64) {
        return Err(GgmlError::Shape {
            what: "dequantize",
            expected: format!("{expected:?} bytes for {n} values of {ty}"),
            found: format!("{} bytes", data.len()),
        });
    }
    match ty {
        crate::gguf::GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        _ => {
            // SAFETY: the traits table has an entry for every known type; to_float reads exactly
            // the bytes of n values (checked above) and writes n floats.
            unsafe {
                let traits = sys::ggml_get_type_traits(ty as u32 as sys::ggml_type);
                let Some(f) = traits.as_ref().and_then(|t| t.to_float) else {
                    return Err(GgmlError::Shape {
                        what: "dequantize",
                        expected: "a type ggml converts to f32".into(),
                        found: ty.name().into(),
                    });
                };
                f(data.as_ptr().cast(), out.as_mut_ptr(), n as i64);
            }
        }
    }
    Ok(())
}
