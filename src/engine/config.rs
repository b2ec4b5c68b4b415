//! The engine's settings: [`EngineConfig`] and the decoder's weight format.

use super::error::EngineError;
use super::plan::ThreadPlan;
use crate::code_predictor::CodePredictor;
use crate::code_predictor::LayerKernel;
use crate::decoder::Decoder;
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::talker::Runtime as TalkerRuntime;

/// How the decoder stores its matrices and computes their products (PERFORMANCE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderWeights {
    /// f32, the heavy products on the host ([`crate::ffi::Context::conv_gemm`]): exact.
    F32,
    /// f32 products of weights stored as f16 ([`crate::decoder::Products::HostF16`]) where the
    /// tier's panel kernel reads them (AVX2, AVX-512; elsewhere the same as f32): half the
    /// weight bytes, 109 dB from f32 on random weights (bf16 checkpoints' weights are f16
    /// values but for the smallest).
    F16,
    /// bf16 ([`crate::decoder::Products::HostBf16`]) on AMX tiles or with AVX-512 BF16 dot
    /// products: 2-3x faster than f32 where the kernel tier has either, about 32 dB from f32 on
    /// random weights; an error elsewhere.
    Bf16,
    /// q8_0 through ggml: a quarter of f32's memory, about 19 dB from f32 on random weights,
    /// slower than the host products.
    Q8_0,
    /// The residual units' k = 7 convs in 8-bit integers ([`crate::decoder::Products::HostInt8`],
    /// `vpdpbusd` on AVX-512 VNNI or AVX-VNNI), the rest as [`DecoderWeights::F16`]: about
    /// 31.6 dB from f32 on random weights (bf16: 31.7); an error on a tier without either.
    Int8,
}

impl DecoderWeights {
    /// [`DecoderWeights::fastest_for`] the process's kernel tier.
    pub fn fastest() -> Self {
        Self::fastest_for(crate::kernels::active())
    }

    /// The fastest decoder of `tier` that keeps the quality gate (the waveform at least 30 dB
    /// from f32 on the full-size random decoder): bf16 where `tier` has a bf16 kernel that
    /// outruns the others (AMX tiles, or AVX-512 BF16 where `vdpbf16ps` outruns f32 FMA,
    /// [`crate::kernels::Features::bf16_dot_fast`]), else int8 where it has integer dot products
    /// (AVX-512 VNNI or AVX-VNNI: an Intel Xeon without AMX, Alder Lake and later, N100), else
    /// f16 weights (the same as f32 where the panel kernel reads f32 only: NEON, the scalar
    /// tier). PERFORMANCE.md has the measurements behind each choice; on ARM the int8
    /// decoder (`sdot`) runs on request only, its speed not yet measured there.
    pub fn fastest_for(tier: crate::kernels::Tier) -> Self {
        let caps = tier.caps();
        if caps.amx_bf16 || (caps.avx512_bf16 && caps.bf16_dot_fast) {
            DecoderWeights::Bf16
        } else if matches!(
            crate::kernels::int8::Kernel::for_caps(caps),
            Some(crate::kernels::int8::Kernel::Avx512Vnni | crate::kernels::int8::Kernel::AvxVnni)
        ) {
            DecoderWeights::Int8
        } else {
            DecoderWeights::F16
        }
    }

    /// Whether the products of this type have a kernel on `tier` (bf16 needs AMX-BF16 or
    /// AVX-512 BF16, int8 AVX-512 VNNI, AVX-VNNI or NEON's `sdot`; f32, f16 and q8_0 run
    /// everywhere).
    pub fn runs_on(self, tier: crate::kernels::Tier) -> bool {
        match self {
            DecoderWeights::Bf16 => crate::kernels::bf16::Kernel::for_caps(tier.caps()).is_some(),
            DecoderWeights::Int8 => crate::kernels::int8::Kernel::for_caps(tier.caps()).is_some(),
            DecoderWeights::F32 | DecoderWeights::F16 | DecoderWeights::Q8_0 => true,
        }
    }

    /// Loads the decoder from `f` this way (f32 when `exact`).
    pub fn load(self, f: &GgufFile, exact: bool) -> Result<Decoder, ModelError> {
        match (self, exact) {
            (_, true) | (DecoderWeights::F32, _) => Decoder::load(f),
            (DecoderWeights::Bf16, _) => {
                Decoder::load_options(f, None, crate::decoder::Products::HostBf16)
            }
            (DecoderWeights::F16, _) => {
                Decoder::load_options(f, None, crate::decoder::Products::HostF16)
            }
            (DecoderWeights::Q8_0, _) => Decoder::load_with(f, Some(crate::gguf::GgmlType::Q8_0)),
            (DecoderWeights::Int8, _) => {
                Decoder::load_options(f, None, crate::decoder::Products::HostInt8)
            }
        }
    }

    /// The name `qtts` takes and prints: `f32`, `f16`, `bf16`, `q8_0`, `int8`.
    pub fn name(self) -> &'static str {
        match self {
            DecoderWeights::F32 => "f32",
            DecoderWeights::F16 => "f16",
            DecoderWeights::Bf16 => "bf16",
            DecoderWeights::Q8_0 => "q8_0",
            DecoderWeights::Int8 => "int8",
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Threads and cores.
    pub plan: ThreadPlan,
    /// Talker context in positions (prompt plus frames of one utterance): 2048.
    pub n_ctx: usize,
    /// f32 KV cache with flash attention off, and the f32 decoder whatever `decoder` says
    /// (matches the f32 reference; twice the KV memory).
    pub exact: bool,
    /// Frames queued between the code predictor and the decoder: 4 (320 ms of audio).
    pub codes_queue: usize,
    /// Frames per decoder call once an utterance is under way: 4 (audio in 320 ms pieces). The
    /// decoder reads its small-row products' weights once per call, so longer chunks hold its
    /// core for less time per frame, at the cost of activation memory (from 2 to 4: RTF 0.64 →
    /// 0.54, peak RSS 820 → 865 MiB over 60 s; PERFORMANCE.md, "Four frames per decoder call,
    /// measured again"). An utterance's first chunks ramp up to it ([`EngineConfig::chunk_after`]:
    /// 1, 1, 2, 4 frames), so that a player that starts at the first sample does not run dry
    /// while the first long chunk is made.
    pub decoder_chunk: usize,
    /// Text tokens per utterance when splitting long text: [`crate::text::split::DEFAULT_MAX_TOKENS`].
    pub segment_tokens: usize,
    /// The code predictor's output heads on q8_0 rows (faster, not bit-exact).
    pub q8_heads: bool,
    /// What computes the code predictor's q4_K, q5_K and q8_0 layer products:
    /// [`LayerKernel::fastest`] (the kernel tier's packed kernels where it has them, else
    /// ggml's). Files of f32 or f16 layers are not affected. Under [`LayerKernel::Packed`] the
    /// q8_0 sample heads of quantized files are packed too
    /// ([`crate::code_predictor::CodePredictor::pack_heads`]).
    pub code_predictor_kernel: LayerKernel,
    /// What runs the talker's layers: [`TalkerRuntime::fastest`] (the crate's own graph with the
    /// packed kernels where the kernel tier has them, else llama.cpp).
    pub talker: TalkerRuntime,
    /// The decoder's matrices: [`DecoderWeights::fastest`] (bf16 on AMX, or where `vdpbf16ps`
    /// outruns f32 FMA; else int8 where the tier has VNNI; else f32).
    /// `exact` overrides it with f32.
    pub decoder: DecoderWeights,
    /// Run each utterance's first frame on every core of the plan, one stage after the other: the
    /// talker's prefill, the code predictor, then the decoder while the others wait. A shorter
    /// time to first audio, for about one decoder frame of delay to the second frame.
    pub burst: bool,
    /// Requests synthesized at once (continuous batching): 1, one at a time. Each running
    /// request has a slot of its own (talker KV cache, sampler, decoder state); every frame,
    /// their talker steps run as one batch and so do their code-predictor frames, and each
    /// request's codes and samples are those it gets alone. At most
    /// [`crate::code_predictor::MAX_ROWS`].
    pub max_streams: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            plan: ThreadPlan::detect(),
            n_ctx: 2048,
            exact: false,
            codes_queue: 4,
            decoder_chunk: 4,
            segment_tokens: crate::text::split::DEFAULT_MAX_TOKENS,
            q8_heads: false,
            code_predictor_kernel: LayerKernel::fastest(),
            talker: TalkerRuntime::fastest(),
            decoder: DecoderWeights::fastest(),
            burst: true,
            max_streams: 1,
        }
    }
}

impl EngineConfig {
    /// The requests `qtts serve` speaks at once unless told (`--max-streams`), for kernel tier
    /// `tier` on `cores` cores: the most that played with no underrun in `qtts bench --streams`
    /// (60 s streams on 2 cores, PERFORMANCE.md "Several streams at once on the AMX Xeon"). 2
    /// where the tier has AMX; 1 elsewhere (the avx512 tier played 2 streams of 20 s with 7 %
    /// to spare, too little for a default) and below 2 cores.
    pub fn serve_streams_for(tier: crate::kernels::Tier, cores: usize) -> usize {
        if cores >= 2 && tier.caps().amx_bf16 {
            2
        } else {
            1
        }
    }

    /// Frames in the next decoder call of an utterance of which `decoded` frames are out: as
    /// many as are out already, at least 1 and at most [`EngineConfig::decoder_chunk`] (1, 1,
    /// 2, 4, 4, ...). Each chunk is then at most the audio already playing, so it can be made
    /// while that plays.
    pub fn chunk_after(&self, decoded: usize) -> usize {
        decoded.clamp(1, self.decoder_chunk.max(1))
    }

    /// [`EngineConfig::max_streams`] within 1 ..= [`crate::code_predictor::MAX_ROWS`].
    pub fn streams(&self) -> usize {
        self.max_streams.clamp(1, crate::code_predictor::MAX_ROWS)
    }

    /// The code predictor of `mmproj` as this configuration runs it: q8_0 heads when
    /// `q8_heads`, its layer products by `code_predictor_kernel`, and under [`LayerKernel::Packed`] its q8_0
    /// heads packed too.
    pub(super) fn load_code_predictor(
        &self,
        mmproj: &GgufFile,
    ) -> Result<CodePredictor, EngineError> {
        let mut cp = CodePredictor::load(mmproj)?;
        if self.q8_heads {
            cp.use_q8_heads()?;
        }
        cp.set_layer_kernel(self.code_predictor_kernel)?;
        if self.code_predictor_kernel == LayerKernel::Packed {
            cp.pack_heads();
        }
        Ok(cp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Tier;

    /// Every tier's defaults: a decoder that has its kernels there and keeps the quality gate
    /// (never q8_0, 19 dB; never plain f32 now that f16 panels are lossless on bf16 weights),
    /// and one stream at a time for `serve` on one core and without AMX (the only tier whose 2
    /// cores played two streams with room to spare).
    #[test]
    fn each_tiers_defaults_run_there_and_keep_the_gates() {
        for tier in Tier::ALL {
            let d = DecoderWeights::fastest_for(tier);
            assert!(d.runs_on(tier), "{tier}: {d:?} has no kernel there");
            assert!(
                !matches!(d, DecoderWeights::Q8_0 | DecoderWeights::F32),
                "{tier}: {d:?}"
            );
            assert_eq!(EngineConfig::serve_streams_for(tier, 1), 1, "{tier}");
            for cores in [2, 16] {
                let n = EngineConfig::serve_streams_for(tier, cores);
                assert!((1..=crate::code_predictor::MAX_ROWS).contains(&n), "{tier}");
                assert!(
                    n == 1 || tier.caps().amx_bf16,
                    "{tier}: {n} streams without AMX"
                );
            }
        }
    }
}
