//! The x-vector speaker encoder of Base models (ECAPA-TDNN: `Qwen3TTSSpeakerEncoder` in
//! `qwen_tts/core/models/modeling_qwen3_tts.py`), on the host in f32.
//!
//! log-mel `[F][128]` → TDNN k5 → three SE-Res2Net blocks (dilations 2, 3, 4) → MFA over the
//! blocks' outputs → attentive statistics pooling → `fc` → x-vector (the talker's width). Every
//! k > 1 convolution pads by reflection ("same"), every TDNN ends in a ReLU; the pooling's
//! attention is `conv(tanh(relu(tdnn(·))))`, its deviations are population deviations clamped at
//! 1e-12, and the x-vector is not normalised. Weights are the mmproj's `a.*` / `mm.a.fc` tensors,
//! the ones llama.cpp's `qwen3tts-spkenc` graph reads.

use super::mel::{self, MelFrontEnd};
use super::ops::{par_rows, relu, Conv};
use super::Trace;
use crate::error::ModelError;
use crate::gguf::GgufFile;

const SCALE: usize = 8;
const DILATIONS: [usize; 3] = [2, 3, 4];

#[derive(Debug)]
struct Block {
    tdnn1: Conv,
    res2: Vec<Conv>,
    tdnn2: Conv,
    se1: Conv,
    se2: Conv,
    dilation: usize,
}

/// The speaker encoder's weights and front end.
#[derive(Debug)]
pub struct SpeakerEncoder {
    mel: MelFrontEnd,
    c: usize,
    b0: Conv,
    blocks: Vec<Block>,
    mfa: Conv,
    asp_tdnn: Conv,
    asp_attn: Conv,
    fc: Conv,
}

impl SpeakerEncoder {
    /// Loads the encoder from an mmproj; `None` when the file has none (not a Base model).
    pub fn load(f: &GgufFile) -> Result<Option<Self>, ModelError> {
        let Some(t) = f.header.tensor("a.conv1d.0.weight") else {
            return Ok(None);
        };
        // Widths from the tensors, as the validator checked them.
        let c = t.ne[2] as usize;
        let se = f
            .header
            .tensor("a.blk.1.se_conv1.weight")
            .map_or(0, |t| t.ne[2] as usize);
        let att = f
            .header
            .tensor("a.asp_tdnn.weight")
            .map_or(0, |t| t.ne[2] as usize);
        let out = f
            .header
            .tensor("mm.a.fc.weight")
            .map_or(0, |t| t.ne[2] as usize);
        let w = c / SCALE;
        let mut blocks = Vec::new();
        for (b, &dilation) in DILATIONS.iter().enumerate() {
            let p = format!("a.blk.{}", b + 1);
            blocks.push(Block {
                tdnn1: Conv::load(f, &format!("{p}.conv_pw1"), c, c, 1, true)?,
                res2: (0..SCALE - 1)
                    .map(|x| Conv::load(f, &format!("{p}.res2.{x}"), w, w, 3, true))
                    .collect::<Result<_, _>>()?,
                tdnn2: Conv::load(f, &format!("{p}.conv_pw2"), c, c, 1, true)?,
                se1: Conv::load(f, &format!("{p}.se_conv1"), c, se, 1, true)?,
                se2: Conv::load(f, &format!("{p}.se_conv2"), se, c, 1, true)?,
                dilation,
            });
        }
        Ok(Some(SpeakerEncoder {
            mel: MelFrontEnd::new(),
            c,
            b0: Conv::load(f, "a.conv1d.0", mel::N_MELS, c, 5, true)?,
            blocks,
            mfa: Conv::load(f, "a.conv_out", 3 * c, 3 * c, 1, true)?,
            asp_tdnn: Conv::load(f, "a.asp_tdnn", 9 * c, att, 1, true)?,
            asp_attn: Conv::load(f, "a.asp_attn", att, 3 * c, 1, true)?,
            fc: Conv::load(f, "mm.a.fc", 6 * c, out, 1, true)?,
        }))
    }

    /// Width of the x-vector.
    pub fn dim(&self) -> usize {
        self.fc.c_out
    }

    /// Fewest samples the encoder takes: the reflection paddings need 5 mel frames.
    pub const MIN_SAMPLES: usize = 5 * mel::HOP;

    /// The x-vector of 24 kHz mono audio `y` (at least [`Self::MIN_SAMPLES`] samples, finite).
    /// With a `trace`, every stage is recorded under the oracle's names, time-major.
    pub fn embed(&self, y: &[f32], threads: usize, mut trace: Option<&mut Trace>) -> Vec<f32> {
        let mut rec = |name: &str, v: &[f32], width: usize| {
            if let Some(t) = trace.as_deref_mut() {
                t.push((name.to_owned(), v.to_vec(), width));
            }
        };
        let c = self.c;
        let mag = self.mel.magnitude(y);
        rec("stft_mag", &mag, mel::N_BINS);
        let x = self.mel.log_mel(&mag);
        rec("log_mel", &x, mel::N_MELS);
        let f = x.len() / mel::N_MELS;

        let mut h = tdnn(&self.b0, &x, f, 1, threads);
        rec("spk.blocks.0", &h, c);
        let mut outs = Vec::new();
        for (b, blk) in self.blocks.iter().enumerate() {
            let p = format!("spk.blocks.{}", b + 1);
            let u = tdnn(&blk.tdnn1, &h, f, 1, threads);
            rec(&format!("{p}.tdnn1"), &u, c);
            // Res2Net: chunk 0 passes; chunk i ≥ 1 is TDNN(u_i + y_{i−1}) (y_0 excluded).
            let w = c / SCALE;
            let mut r = vec![0.0f32; f * c];
            let mut prev: Vec<f32> = Vec::new();
            for i in 0..SCALE {
                let mut chunk: Vec<f32> = (0..f)
                    .flat_map(|t| u[t * c + i * w..t * c + (i + 1) * w].iter().copied())
                    .collect();
                if i >= 2 {
                    for (a, p) in chunk.iter_mut().zip(&prev) {
                        *a += p;
                    }
                }
                let out = if i == 0 {
                    chunk
                } else {
                    tdnn(&blk.res2[i - 1], &chunk, f, blk.dilation, threads)
                };
                for t in 0..f {
                    r[t * c + i * w..t * c + (i + 1) * w].copy_from_slice(&out[t * w..(t + 1) * w]);
                }
                prev = out;
            }
            rec(&format!("{p}.res2net"), &r, c);
            let mut v = tdnn(&blk.tdnn2, &r, f, 1, threads);
            rec(&format!("{p}.tdnn2"), &v, c);
            // Squeeze-excitation over the plain time mean.
            let mut m = vec![0.0f32; c];
            for row in v.chunks_exact(c) {
                for (a, x) in m.iter_mut().zip(row) {
                    *a += x;
                }
            }
            m.iter_mut().for_each(|a| *a /= f as f32);
            let mut s1 = vec![0.0f32; blk.se1.c_out];
            blk.se1.apply(&m, 1, 1, 1, &mut s1, 1);
            relu(&mut s1);
            let mut g = vec![0.0f32; c];
            blk.se2.apply(&s1, 1, 1, 1, &mut g, 1);
            g.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp()));
            rec(&format!("{p}.se_gate"), &g, c);
            for (row, res) in v.chunks_exact_mut(c).zip(h.chunks_exact(c)) {
                for ((x, g), r) in row.iter_mut().zip(&g).zip(res) {
                    *x = *x * g + r;
                }
            }
            rec(&p, &v, c);
            outs.push(v.clone());
            h = v;
        }

        // Multi-layer feature aggregation over blocks 1..3.
        let cat: Vec<f32> = (0..f)
            .flat_map(|t| {
                outs.iter()
                    .flat_map(move |o| o[t * c..(t + 1) * c].iter().copied())
            })
            .collect();
        let z = tdnn(&self.mfa, &cat, f, 1, threads);
        let c3 = 3 * c;
        rec("spk.mfa", &z, c3);

        // Attentive statistics pooling.
        let uniform = vec![1.0 / f as f32; f * c3];
        let (mu_g, sd_g) = stats(&z, &uniform, c3);
        rec("spk.asp.global_mean", &mu_g, c3);
        rec("spk.asp.global_std", &sd_g, c3);
        let a: Vec<f32> = (0..f)
            .flat_map(|t| {
                z[t * c3..(t + 1) * c3]
                    .iter()
                    .chain(&mu_g)
                    .chain(&sd_g)
                    .copied()
            })
            .collect();
        let mut e = tdnn(&self.asp_tdnn, &a, f, 1, threads);
        e.iter_mut().for_each(|x| *x = x.tanh());
        let mut logits = vec![0.0f32; f * c3];
        self.asp_attn.apply(&e, 1, 1, f, &mut logits, threads);
        rec("spk.asp.attn_logits", &logits, c3);
        // Softmax over time, per channel.
        let mut w = logits;
        for ch in 0..c3 {
            let max = (0..f)
                .map(|t| w[t * c3 + ch])
                .fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for t in 0..f {
                let v = (w[t * c3 + ch] - max).exp();
                w[t * c3 + ch] = v;
                sum += v;
            }
            for t in 0..f {
                w[t * c3 + ch] /= sum;
            }
        }
        let (mu, sd) = stats(&z, &w, c3);
        let pooled: Vec<f32> = mu.into_iter().chain(sd).collect();
        rec("spk.asp", &pooled, 2 * c3);
        let mut xv = vec![0.0f32; self.fc.c_out];
        self.fc.apply(&pooled, 1, 1, 1, &mut xv, 1);
        rec("xvector", &xv, self.fc.c_out);
        xv
    }
}

/// Weighted mean and deviation per channel: `μ = Σ_t w·z`, `σ = sqrt(max(Σ_t w·(z−μ)², 1e-12))`.
fn stats(z: &[f32], w: &[f32], c: usize) -> (Vec<f32>, Vec<f32>) {
    let mut mu = vec![0.0f32; c];
    for (zr, wr) in z.chunks_exact(c).zip(w.chunks_exact(c)) {
        for ((m, z), w) in mu.iter_mut().zip(zr).zip(wr) {
            *m += w * z;
        }
    }
    let mut var = vec![0.0f32; c];
    for (zr, wr) in z.chunks_exact(c).zip(w.chunks_exact(c)) {
        for (((v, z), w), m) in var.iter_mut().zip(zr).zip(wr).zip(&mu) {
            *v += w * (z - m) * (z - m);
        }
    }
    let sd = var.into_iter().map(|v| v.max(1e-12).sqrt()).collect();
    (mu, sd)
}

/// `Conv1d(padding="same", padding_mode="reflect")` + ReLU over `f` time-major rows.
fn tdnn(conv: &Conv, x: &[f32], f: usize, dilation: usize, threads: usize) -> Vec<f32> {
    let pad = dilation * (conv.taps - 1) / 2;
    let ci = conv.c_in;
    let padded;
    let input = if pad == 0 {
        x
    } else {
        let mut p = Vec::with_capacity((f + 2 * pad) * ci);
        for i in (1..=pad).rev() {
            p.extend_from_slice(&x[i * ci..(i + 1) * ci]);
        }
        p.extend_from_slice(x);
        for i in 0..pad {
            let r = f - 2 - i;
            p.extend_from_slice(&x[r * ci..(r + 1) * ci]);
        }
        padded = p;
        &padded
    };
    let mut y = vec![0.0f32; f * conv.c_out];
    conv.apply(input, 1, dilation, f, &mut y, threads);
    par_rows(&mut y, conv.c_out, f, threads, |_, ys| relu(ys));
    y
}
