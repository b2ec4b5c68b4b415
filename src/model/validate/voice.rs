//! The voice-cloning encoders' tensors in an mmproj: the speaker encoder (`a.*`, `mm.a.fc`, the
//! names llama.cpp reads) and the codec encoder (`qtts.enc.*`, this crate's).

use super::Check;
use crate::error::ModelError;
use crate::gguf::GgmlType;
use crate::model::config::EncoderConfig;

pub(super) fn check_speaker_encoder(c: &Check<'_>, n_talker: u64) -> Result<(), ModelError> {
    c.str_is("clip.audio.projector_type", "qwen3tts_spkenc")?;
    for key in [
        "embedding_length",
        "attention.head_count",
        "feed_forward_length",
        "projection_dim",
    ] {
        c.u32_in(&format!("clip.audio.{key}"), 1..=1 << 16)?;
    }
    c.u32_in("clip.audio.block_count", 3..=3)?;
    c.u32_in("clip.audio.num_mel_bins", 1..=256)?;
    c.f32("clip.audio.attention.layer_norm_epsilon")?;
    for key in ["attention.head_count_kv", "attention.head_dim"] {
        c.optional_type(&format!("clip.audio.{key}"), "u32")?;
    }
    let any: &[GgmlType] = &[];
    // Widths from the tensors, as llama.cpp reads them: C (512 released), SE and attention
    // bottlenecks (128).
    let width = |name: &str| -> Result<u64, ModelError> {
        c.ne(name)?
            .get(2)
            .copied()
            .ok_or_else(|| ModelError::WrongShape {
                path: c.path.into(),
                tensor: name.into(),
                expected: vec![0, 0, 0],
                found: c.ne(name).map(|n| n.to_vec()).unwrap_or_default(),
            })
    };
    let (ch, mel) = (
        width("a.conv1d.0.weight")?,
        c.u32("clip.audio.num_mel_bins")?,
    );
    let (se, att) = (
        width("a.blk.1.se_conv1.weight")?,
        width("a.asp_tdnn.weight")?,
    );
    if ch == 0 || !ch.is_multiple_of(8) || se == 0 || att == 0 {
        return Err(ModelError::WrongShape {
            path: c.path.into(),
            tensor: "a.conv1d.0.weight".into(),
            expected: vec![5, mel, 512],
            found: c.ne("a.conv1d.0.weight")?.to_vec(),
        });
    }
    c.tensor("a.conv1d.0.weight", &[5, mel, ch], any)?;
    c.vector("a.conv1d.0.bias", ch)?;
    for b in 1..4 {
        let p = format!("a.blk.{b}");
        for (name, ne) in [
            ("conv_pw1", [1, ch, ch]),
            ("conv_pw2", [1, ch, ch]),
            ("se_conv1", [1, ch, se]),
            ("se_conv2", [1, se, ch]),
        ] {
            c.tensor(&format!("{p}.{name}.weight"), &ne, any)?;
            c.vector(&format!("{p}.{name}.bias"), ne[2])?;
        }
        for x in 0..7 {
            c.tensor(&format!("{p}.res2.{x}.weight"), &[3, ch / 8, ch / 8], any)?;
            c.vector(&format!("{p}.res2.{x}.bias"), ch / 8)?;
        }
    }
    for (name, ne) in [
        ("a.conv_out", [1, 3 * ch, 3 * ch]),
        ("a.asp_tdnn", [1, 9 * ch, att]),
        ("a.asp_attn", [1, att, 3 * ch]),
        ("mm.a.fc", [1, 6 * ch, n_talker]),
    ] {
        c.tensor(&format!("{name}.weight"), &ne, any)?;
        c.vector(&format!("{name}.bias"), ne[2])?;
    }
    Ok(())
}

/// The codec encoder's tensors (`layout::codec_encoder`) against the carried `encoder_config`.
pub(super) fn check_codec_encoder(c: &Check<'_>, e: &EncoderConfig) -> Result<(), ModelError> {
    const W: &[GgmlType] = &[GgmlType::F32, GgmlType::F16];
    let g = crate::model::layout::ENCODER_PREFIX;
    let conv = |name: &str, k: u64, cin: u64, cout: u64| -> Result<(), ModelError> {
        c.tensor(&format!("{name}.weight"), &[k, cin, cout], W)?;
        c.vector(&format!("{name}.bias"), cout)
    };
    let mut ch = e.num_filters as u64;
    conv(&format!("{g}.conv.0"), e.kernel_size as u64, 1, ch)?;
    let mut i = 1;
    for &r in e.upsampling_ratios.iter().rev() {
        let hidden = ch / e.compress as u64;
        conv(
            &format!("{g}.res.{i}.c1"),
            e.residual_kernel_size as u64,
            ch,
            hidden,
        )?;
        conv(&format!("{g}.res.{i}.c2"), 1, hidden, ch)?;
        conv(&format!("{g}.conv.{}", i + 2), 2 * r as u64, ch, 2 * ch)?;
        ch *= 2;
        i += 3;
    }
    let h = e.hidden_size as u64;
    conv(
        &format!("{g}.conv.{}", i + 1),
        e.last_kernel_size as u64,
        ch,
        h,
    )?;
    for l in 0..e.num_hidden_layers {
        let b = format!("{g}.blk.{l}");
        for n in [
            "ln1.weight",
            "ln1.bias",
            "ln2.weight",
            "ln2.bias",
            "attn_scale",
            "mlp_scale",
        ] {
            c.vector(&format!("{b}.{n}"), h)?;
        }
        for n in ["attn_q", "attn_k", "attn_v", "attn_out"] {
            c.tensor(&format!("{b}.{n}.weight"), &[h, h], W)?;
        }
        let ff = e.intermediate_size as u64;
        c.tensor(&format!("{b}.fc1.weight"), &[h, ff], W)?;
        c.tensor(&format!("{b}.fc2.weight"), &[ff, h], W)?;
    }
    c.tensor(&format!("{g}.down.weight"), &[4, h, h], W)?;
    let (d, n) = (
        e.vector_quantization_hidden_dimension as u64,
        e.codebook_size as u64,
    );
    for (half, levels) in [("sem", None), ("ac", Some(15))] {
        c.tensor(&format!("{g}.{half}.proj.weight"), &[1, h, d], W)?;
        let ne: Vec<u64> = [d, n].into_iter().chain(levels).collect();
        c.tensor(&format!("{g}.{half}.codebook"), &ne, &[GgmlType::F32])?;
    }
    Ok(())
}
