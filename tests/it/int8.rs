//! The decoder's 8-bit products (`qtts::kernels::int8`, `Products::HostInt8`): through
//! `Context::conv_gemm_int8` (ggml's threads, the bias and residual epilogue) the scalar twin's
//! bits; on the full-size random-weight decoder, every stage against the exact f32 decoder on
//! the same codes, held to the quality gate (the waveform at least 30 dB from f32, where
//! bf16 measures about 32).

use std::collections::BTreeMap;

use qtts::decoder::{Decoder, Products};
use qtts::ffi::{Context, Threadpool};
use qtts::gguf::{GgmlType, GgufFile};
use qtts::kernels::int8::{self, Conv, Kernel};
use qtts::model::convert::OutType;

use crate::common;
use common::spread_values as values;

/// Least SNR of the int8 decoder's waveform (the last stage before the clamp) against f32, dB:
/// the gate.
const WAVEFORM_MIN_SNR_DB: f64 = 30.0;
/// Least SNR of any earlier stage, dB (each later DAC block loses about 3 dB of the errors
/// before it, so the earlier stages are far above the waveform's).
const STAGE_MIN_SNR_DB: f64 = 30.0;
/// Least SNR of the stages before the DAC's residual units, whose only rounding is their f16
/// weights (`qtts::decoder::f16_layer`), dB: `panel.rs`'s bound for them.
const F16_MIN_SNR_DB: f64 = 100.0;

/// `conv_gemm_int8` on 1 and 2 ggml threads: the scalar twin's bits plus the bias, then the
/// residual, as separate adds. The kernel is the tier's (the twin itself where it has none).
#[test]
fn conv_gemm_int8_is_the_twin_then_bias_then_residual() {
    eprintln!("int8 kernel {:?}", Kernel::active());
    for (c_in, taps, dilation, n, t_out) in
        [(24, 7, 3, 64, 33), (40, 1, 1, 96, 5), (96, 2, 1, 32, 70)]
    {
        let s = Conv {
            c_in,
            taps,
            dilation,
            t_out,
            n,
        };
        let k = taps * c_in;
        let w = int8::pack(&values(k * n, 5), taps, c_in, n).unwrap();
        let x = values((t_out + (taps - 1) * dilation) * c_in, 6);
        let bias = values(n, 7);
        let residual = values(t_out * n, 8);
        let mut twin = vec![f32::NAN; t_out * n];
        // SAFETY: the scalar twin runs everywhere; `w` is packed for `s`, `x` holds the input
        // rows, `twin` the output rows.
        unsafe {
            int8::conv(
                Kernel::Scalar,
                w.as_ptr(),
                x.as_ptr(),
                twin.as_mut_ptr(),
                s,
                (0, int8::blocks(t_out, n)),
                |_, _| {},
            )
        };
        let want: Vec<f32> = twin
            .iter()
            .enumerate()
            .map(|(i, v)| (v + bias[i % n]) + residual[i])
            .collect();
        let ctx = Context::new(16 << 20).unwrap();
        let rows = w.len() / n;
        let tw = ctx
            .new_tensor_aligned(GgmlType::I8, &[rows, n], int8::LINE)
            .unwrap();
        tw.write_bytes(&w).unwrap();
        let tx = ctx.new_f32(&[c_in, x.len() / c_in]).unwrap();
        tx.write_f32(&x).unwrap();
        let tb = ctx.new_f32(&[n]).unwrap();
        tb.write_f32(&bias).unwrap();
        let tr = ctx.new_f32(&[n, t_out]).unwrap();
        tr.write_f32(&residual).unwrap();
        let y = ctx
            .conv_gemm_int8(tw, tx, taps, dilation, Some(tb), Some(tr))
            .unwrap();
        for threads in [1, 2] {
            let pool = Threadpool::new(threads, &[]).unwrap();
            ctx.graph(y).unwrap().compute(&pool).unwrap();
            let same = y
                .to_vec()
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{s:?}, {threads} threads: not the twin's bits");
        }
        // A kernel of another packing is refused with its shapes.
        let tf = ctx.new_f32(&[k, n]).unwrap();
        let err = ctx.conv_gemm_int8(tf, tx, taps, dilation, None, None);
        assert!(format!("{:?}", err.unwrap_err()).contains("int8"));
    }
}

/// Frames of random codes decoded (past the transformer's 72-frame window).
const N: usize = 100;

/// Every stage of `voc` over `N` frames of random codes, 4 frames a call (the engine's chunk).
pub(crate) fn stages(voc: &mut Decoder, pool: &Threadpool) -> BTreeMap<&'static str, Vec<f32>> {
    let codes = common::random_codes(N);
    voc.set_max_chunk(4);
    voc.reset().unwrap();
    voc.set_capture(true);
    let mut out = vec![0f32; N * 1920];
    for (i, c) in codes.chunks(4).enumerate() {
        voc.decode_frames(pool, c, &mut out[i * 4 * 1920..][..c.len() * 1920])
            .unwrap();
    }
    assert_eq!(voc.non_finite(), 0);
    let captured = voc.take_capture();
    voc.set_capture(false);
    captured
}

/// The int8 decoder of the full 0.6B geometry (random weights) against its f32 products on the
/// same codes: each stage before the DAC's k = 7 convs within the f16 panels' bound (its only
/// rounding there), each after within the gate; decoding again gives the same bits.
#[test]
fn full_size_int8_decoder_keeps_the_quality_gate() {
    use qtts::model::config::Preset;
    if Kernel::active().is_none() {
        eprintln!("int8 decoder: skipped, this CPU or tier lacks AVX-512 VNNI and AVX-VNNI");
        return;
    }
    let cfg = common::tiny_talker(Preset::Small06CustomVoice);
    let (_tmp, out) = common::random_converted(&cfg, 3, OutType::F32);
    let f = GgufFile::open(&out.mmproj).unwrap();
    let pool = Threadpool::new(2, &[]).unwrap();
    let exact = stages(
        &mut Decoder::load_options(&f, None, Products::HostF32).unwrap(),
        &pool,
    );
    let mut voc = Decoder::load_options(&f, None, Products::HostInt8).unwrap();
    let int8 = stages(&mut voc, &pool);
    for stage in qtts::decoder::STAGES {
        let snr = qtts::metrics::snr_db(&exact[stage], &int8[stage]);
        eprintln!("full-size decoder, {stage}: int8 products {snr:.1} dB from f32");
        if !stage.starts_with("decoder.") || *stage == "decoder.0" {
            // f16 weights only there (`f16_layer`).
            assert!(snr >= F16_MIN_SNR_DB, "{stage}: {snr:.1} dB");
            assert!(exact[stage] != int8[stage], "{stage}: nothing in f16");
        } else if *stage == "decoder.6" {
            assert!(snr >= WAVEFORM_MIN_SNR_DB, "{stage}: {snr:.1} dB");
        } else {
            assert!(snr >= STAGE_MIN_SNR_DB, "{stage}: {snr:.1} dB");
            assert!(exact[stage] != int8[stage], "{stage}: nothing in 8 bits");
        }
    }
    assert_eq!(stages(&mut voc, &pool), int8, "decoded again");
}
