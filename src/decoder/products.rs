//! How the decoder computes its heavy products ([`Products`]) and which matrices its 8-bit path
//! quantizes ([`int8_layer`]).

/// How the decoder computes the products of its residual units, post-conv and upsampling convs
/// that see at least [`HOST_MIN_ROWS`](super::HOST_MIN_ROWS) rows per frame (see [`Decoder::load_options`](super::Decoder::load_options)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Products {
    /// ggml's `im2col` and `mul_mat` in the file's type: the benches' baseline.
    Ggml,
    /// [`Context::conv_gemm`](crate::ffi::Context::conv_gemm) on f32 matrices (f16 files widened): exact, the default. Where the
    /// process's tier has a [`crate::kernels::panel::Kernel`] (AVX2 with FMA, AVX-512), every
    /// conv and transposed-conv matrix is packed in panels at load and computed by it, whatever
    /// its row count; elsewhere by `matrixmultiply`, as [`Products::HostF32Sgemm`].
    HostF32,
    /// [`Context::conv_gemm`](crate::ffi::Context::conv_gemm) on unpacked f32 matrices by `matrixmultiply`'s sgemm (which packs
    /// them per call, so products of fewer than [`HOST_MIN_ROWS`](super::HOST_MIN_ROWS) rows stay on ggml): the
    /// products before the panels, kept as the benches' baseline.
    HostF32Sgemm,
    /// [`Context::conv_gemm`](crate::ffi::Context::conv_gemm) on bf16 matrices, on AMX tiles or with AVX-512 BF16 dot products,
    /// where the shapes allow ([`crate::kernels::bf16::fits`]), f32 elsewhere: not exact (bf16
    /// keeps 8 significant bits, see PERFORMANCE.md), half the memory. Only where the process's
    /// kernel tier has a [`crate::kernels::bf16::Kernel`].
    HostBf16,
    /// [`Context::conv_gemm_int8`](crate::ffi::Context::conv_gemm_int8) on the matrices
    /// [`int8_layer`] names, quantized to 8 bits at load ([`crate::kernels::int8::pack`]), f32
    /// panels for the others: not exact (each input row and each weight run rounded to 8 bits,
    /// see [`crate::kernels::int8`]), a quarter of f32's memory for those. Only where the tier
    /// has an [`crate::kernels::int8::Kernel`] (AVX-512 VNNI, AVX-VNNI or NEON's `sdot`).
    /// The others are stored as [`Products::HostF16`] stores them.
    HostInt8,
    /// [`Products::HostF32`] with the matrices [`f16_layer`] names stored as f16 panels
    /// ([`crate::kernels::panel::pack_f16`]) where the tier's panel kernel reads f16 (AVX2 with
    /// F16C, AVX-512), widened exactly in registers: the products stay f32, of weights rounded
    /// to 11 significant bits. Half the bytes to stream per call, which the products of few rows
    /// spend their time on. Weights that were bf16 (the released checkpoints') are f16 values
    /// unless under 2^-14 in magnitude: on the full-size random decoder the waveform ends 109 dB
    /// from f32.
    HostF16,
}

/// The matrices that [`Products::HostInt8`] stores in 8 bits: the residual units' k = 7 convs,
/// about three quarters of the decoder's multiply-adds. Any error a product adds grows about
/// 3 dB through each later DAC block on the full-size random decoder, so the products are chosen
/// by what the waveform keeps: these alone end 31.6 dB from f32 (the gate is 30, bf16
/// measures 31.7); every DAC matrix in 8 bits ends at 25 dB, every matrix of the decoder at 16
/// (docs/perf-log/2026-12-07-int8-decoder.md). The others stay f32 (panels).
pub fn int8_layer(name: &str) -> bool {
    name.contains(".dac.blk.") && name.contains(".res.") && name.ends_with(".conv1.weight")
}

/// The matrices that [`Products::HostF16`] and [`Products::HostInt8`] store as f16 panels: those
/// read for at most 4 rows a frame (the quantizer's projections, the pre-conv, the transformer,
/// the ConvNeXt upsamplers, the DAC's entry conv and first transposed conv), about 80 M of the
/// decoder's 114 M values. Their products stream weights from memory, so half the bytes is
/// nearly half the time; the DAC's later products compute more than they read, and widening
/// costs them on AVX2 (docs/perf-log/2026-12-07-f16-panels.md).
pub fn f16_layer(name: &str) -> bool {
    !name.contains(".dac.blk.") || name.contains(".dac.blk.0.conv.")
}
