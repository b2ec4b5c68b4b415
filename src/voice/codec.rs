//! The speech tokenizer's encoder (transformers' `MimiModel` encoder half, as
//! `Qwen3TTSTokenizerV2Model.encode` runs it): 24 kHz mono → `[T][16]` codes at 12.5 Hz.
//!
//! SEANet (causal convs, ratios walked in reverse: 4, 5, 6, 8; zero left padding `k − stride`
//! and zero right padding up to a whole stride at the end) → an 8-layer pre-norm transformer
//! (LayerNorm with bias, NeoX RoPE, full causal attention: the config's `sliding_window` is not
//! applied by the reference's eager attention, GELU(erf), LayerScale) → a k4/s2 downsample with
//! replicate padding → split RVQ: codebook 0 from the semantic projection, codebooks 1..15 from a
//! residual chain on the acoustic projection, each the Euclidean nearest codeword.
//!
//! The SEANet runs over the signal in chunks with each causal conv's history carried, so the
//! 24 kHz activations stay in cache whatever the reference's length; the result is the one-shot
//! result, since every conv is causal.

use super::ops::{elu, gelu_erf, layer_norm, par_rows, read, Conv, Linear};
use super::Trace;
use crate::error::ModelError;
use crate::gguf::GgufFile;
use crate::model::layout::ENCODER_PREFIX as P;

/// Codebooks kept: 1 semantic + 15 acoustic.
pub const CODEBOOKS: usize = 16;
/// Samples per SEANet chunk (0.4 s at 24 kHz).
const CHUNK: usize = 9600;

/// A causal strided convolution over a stream: the last `k − stride` input rows (zeros at the
/// start) are kept between chunks; [`CausalConv::finish`] pads with zeros to a whole stride.
#[derive(Debug)]
struct CausalConv {
    conv: Conv,
    stride: usize,
    pending: Vec<f32>,
    seen: usize,
}

impl CausalConv {
    fn new(conv: Conv, stride: usize) -> Self {
        let mut c = CausalConv {
            conv,
            stride,
            pending: Vec::new(),
            seen: 0,
        };
        c.reset();
        c
    }

    fn reset(&mut self) {
        self.pending = vec![0.0; (self.conv.taps - self.stride) * self.conv.c_in];
        self.seen = 0;
    }

    fn push(&mut self, x: &[f32], threads: usize) -> Vec<f32> {
        self.pending.extend_from_slice(x);
        self.seen += x.len() / self.conv.c_in;
        self.drain(threads)
    }

    fn drain(&mut self, threads: usize) -> Vec<f32> {
        let (ci, k, s) = (self.conv.c_in, self.conv.taps, self.stride);
        let rows = self.pending.len() / ci;
        if rows < k {
            return Vec::new();
        }
        let n = (rows - k) / s + 1;
        let mut y = vec![0.0; n * self.conv.c_out];
        self.conv.apply(&self.pending, s, 1, n, &mut y, threads);
        self.pending.drain(..n * s * ci);
        y
    }

    /// Zeros up to `ceil(seen / stride) · stride` input rows, then the last outputs.
    fn finish(&mut self, threads: usize) -> Vec<f32> {
        let extra = self.seen.div_ceil(self.stride) * self.stride - self.seen;
        self.pending
            .extend(std::iter::repeat_n(0.0, extra * self.conv.c_in));
        self.drain(threads)
    }
}

/// `x + conv2(elu(conv1(elu(x))))`, conv1 causal k3, conv2 1×1.
#[derive(Debug)]
struct ResUnit {
    c1: CausalConv,
    c2: Conv,
}

#[derive(Debug)]
enum Stage {
    Conv(CausalConv),
    Res(ResUnit),
    Elu,
}

/// Rows a stage gathers before computing: the products of the 25 Hz and 200 Hz layers would
/// otherwise have a handful of rows per 24 kHz chunk, and repack their weights each time.
const MIN_ROWS: usize = 256;

/// A stage and the input rows it has not computed yet.
#[derive(Debug)]
struct Staged {
    /// The checkpoint's layer index.
    index: usize,
    stage: Stage,
    inbox: Vec<f32>,
}

impl Staged {
    fn width_in(&self) -> usize {
        match &self.stage {
            Stage::Conv(c) => c.conv.c_in,
            Stage::Res(r) => r.c2.c_out,
            Stage::Elu => 1,
        }
    }

    /// Takes `x`; computes once [`MIN_ROWS`] rows are in (or at `flush`), causally, so the
    /// result is the one-shot result whatever the chunking.
    fn push(&mut self, x: &[f32], flush: bool, threads: usize) -> Vec<f32> {
        self.inbox.extend_from_slice(x);
        if !flush && self.inbox.len() < MIN_ROWS * self.width_in() {
            return Vec::new();
        }
        let input = std::mem::take(&mut self.inbox);
        self.stage.push(input, threads)
    }
}

/// ELU over `x` on `threads` threads.
fn elu_par(x: &mut [f32], threads: usize) {
    let n = x.len();
    par_rows(x, 1, n, threads, |_, part| elu(part));
}

impl Stage {
    fn push(&mut self, mut x: Vec<f32>, threads: usize) -> Vec<f32> {
        match self {
            Stage::Conv(c) => c.push(&x, threads),
            Stage::Elu => {
                elu_par(&mut x, threads);
                x
            }
            Stage::Res(r) => {
                let mut e = x.clone();
                elu_par(&mut e, threads);
                let mut h = r.c1.push(&e, threads);
                elu_par(&mut h, threads);
                let n = h.len() / r.c2.c_in;
                let mut y = vec![0.0; n * r.c2.c_out];
                r.c2.apply(&h, 1, 1, n, &mut y, threads);
                for (y, x) in y.iter_mut().zip(&x) {
                    *y += x;
                }
                y
            }
        }
    }

    fn finish(&mut self, threads: usize) -> Vec<f32> {
        match self {
            // Stride-1 convs (the residual units' k3) have nothing left to give.
            Stage::Conv(c) => c.finish(threads),
            Stage::Res(_) | Stage::Elu => Vec::new(),
        }
    }

    fn reset(&mut self) {
        match self {
            Stage::Conv(c) => c.reset(),
            Stage::Res(r) => r.c1.reset(),
            Stage::Elu => {}
        }
    }
}

#[derive(Debug)]
struct Layer {
    ln1: (Vec<f32>, Vec<f32>),
    ln2: (Vec<f32>, Vec<f32>),
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attn_scale: Vec<f32>,
    fc1: Linear,
    fc2: Linear,
    mlp_scale: Vec<f32>,
}

/// One RVQ half: input projection and codebooks `[levels][n][d]` with their squared norms.
#[derive(Debug)]
struct Quantizer {
    proj: Conv,
    codebooks: Vec<f32>,
    norms: Vec<f32>,
    levels: usize,
}

/// The codec encoder's weights.
#[derive(Debug)]
pub struct CodecEncoder {
    stages: Vec<Staged>,
    layers: Vec<Layer>,
    down: Conv,
    sem: Quantizer,
    ac: Quantizer,
    hidden: usize,
    heads: usize,
    head_dim: usize,
    eps: f32,
    rope_theta: f32,
    n_codes: usize,
    dim: usize,
}

impl CodecEncoder {
    /// Loads the encoder from an mmproj that carries it (`qtts.enc.*`); `None` when the file has
    /// none (converted by an older qtts, or not a Base model).
    pub fn load(f: &GgufFile) -> Result<Option<Self>, ModelError> {
        if f.header.tensor(&format!("{P}.conv.0.weight")).is_none() {
            return Ok(None);
        }
        let key = crate::model::convert::KEY_HF_SPEECH_TOKENIZER;
        let st: crate::model::config::SpeechTokenizerConfig = match f.header.get(key) {
            Some(crate::gguf::Value::Str(json)) => {
                crate::model::config::parse_json(json, f.path())?
            }
            _ => {
                return Err(ModelError::MissingKey {
                    path: f.path().into(),
                    key: key.into(),
                })
            }
        };
        let Some(e) = &st.encoder_config else {
            return Err(ModelError::MissingKey {
                path: f.path().into(),
                key: format!("{key} → encoder_config"),
            });
        };
        let mut stages = Vec::new();
        let mut c = e.num_filters as usize;
        stages.push((
            0,
            Stage::Conv(CausalConv::new(
                Conv::load(
                    f,
                    &format!("{P}.conv.0"),
                    1,
                    c,
                    e.kernel_size as usize,
                    true,
                )?,
                1,
            )),
        ));
        let mut i = 1;
        for &r in e.upsampling_ratios.iter().rev() {
            let (r, hidden) = (r as usize, c / e.compress as usize);
            let c1 = Conv::load(
                f,
                &format!("{P}.res.{i}.c1"),
                c,
                hidden,
                e.residual_kernel_size as usize,
                true,
            )?;
            let c2 = Conv::load(f, &format!("{P}.res.{i}.c2"), hidden, c, 1, true)?;
            stages.push((
                i,
                Stage::Res(ResUnit {
                    c1: CausalConv::new(c1, 1),
                    c2,
                }),
            ));
            stages.push((i + 1, Stage::Elu));
            let down = Conv::load(f, &format!("{P}.conv.{}", i + 2), c, 2 * c, 2 * r, true)?;
            stages.push((i + 2, Stage::Conv(CausalConv::new(down, r))));
            c *= 2;
            i += 3;
        }
        let h = e.hidden_size as usize;
        stages.push((i, Stage::Elu));
        let last = Conv::load(
            f,
            &format!("{P}.conv.{}", i + 1),
            c,
            h,
            e.last_kernel_size as usize,
            true,
        )?;
        stages.push((i + 1, Stage::Conv(CausalConv::new(last, 1))));

        let ff = e.intermediate_size as usize;
        let mut layers = Vec::new();
        for l in 0..e.num_hidden_layers {
            let b = format!("{P}.blk.{l}");
            let v = |n: &str| read(f, &format!("{b}.{n}"), &[h as u64]);
            let lin =
                |n: &str, i: usize, o: usize| Linear::load(f, &format!("{b}.{n}.weight"), i, o);
            layers.push(Layer {
                ln1: (v("ln1.weight")?, v("ln1.bias")?),
                ln2: (v("ln2.weight")?, v("ln2.bias")?),
                q: lin("attn_q", h, h)?,
                k: lin("attn_k", h, h)?,
                v: lin("attn_v", h, h)?,
                o: lin("attn_out", h, h)?,
                attn_scale: v("attn_scale")?,
                fc1: lin("fc1", h, ff)?,
                fc2: lin("fc2", ff, h)?,
                mlp_scale: v("mlp_scale")?,
            });
        }
        let (d, n) = (
            e.vector_quantization_hidden_dimension as usize,
            e.codebook_size as usize,
        );
        let quantizer = |half: &str, levels: usize| -> Result<Quantizer, ModelError> {
            let mut ne = vec![d as u64, n as u64];
            if levels > 1 {
                ne.push(levels as u64);
            }
            let codebooks = read(f, &format!("{P}.{half}.codebook"), &ne)?;
            let norms = codebooks
                .chunks_exact(d)
                .map(|r| r.iter().map(|x| x * x).sum())
                .collect();
            Ok(Quantizer {
                proj: Conv::load(f, &format!("{P}.{half}.proj"), h, d, 1, false)?,
                codebooks,
                norms,
                levels,
            })
        };
        let stages = stages
            .into_iter()
            .map(|(index, stage)| Staged {
                index,
                stage,
                inbox: Vec::new(),
            })
            .collect();
        Ok(Some(CodecEncoder {
            stages,
            layers,
            down: Conv::load(f, &format!("{P}.down"), h, h, 4, false)?,
            sem: quantizer("sem", 1)?,
            ac: quantizer("ac", CODEBOOKS - 1)?,
            hidden: h,
            heads: e.num_attention_heads as usize,
            head_dim: e.head_dim as usize,
            eps: e.norm_eps as f32,
            rope_theta: e.rope_theta as f32,
            n_codes: n,
            dim: d,
        }))
    }

    /// Frames for `n` samples: `ceil(n / 1920)`.
    pub fn frames(n: usize) -> usize {
        n.div_ceil(1920)
    }

    /// The codes `[frames][16]` of 24 kHz mono audio `y` (finite, non-empty). With a `trace`,
    /// every stage is recorded under the oracle's names, time-major.
    pub fn encode(
        &mut self,
        y: &[f32],
        threads: usize,
        mut trace: Option<&mut Trace>,
    ) -> Vec<[u32; CODEBOOKS]> {
        let tracing = trace.is_some();
        let mut rec = |name: &str, v: &[f32], width: usize| {
            if let Some(t) = trace.as_deref_mut() {
                t.push((name.to_owned(), v.to_vec(), width));
            }
        };
        // SEANet, chunk by chunk; with a trace, each stage's whole output is kept.
        for s in &mut self.stages {
            s.stage.reset();
            s.inbox.clear();
        }
        let n_stages = self.stages.len();
        let mut stage_out: Vec<Vec<f32>> = vec![Vec::new(); n_stages];
        let mut x25 = Vec::new();
        // Pushes `x` through stages `from..`; `flush` computes what each has gathered.
        let run = |stages: &mut [Staged],
                   from: usize,
                   mut x: Vec<f32>,
                   flush: bool,
                   out: &mut Vec<Vec<f32>>| {
            for (j, s) in stages.iter_mut().enumerate().skip(from) {
                x = s.push(&x, flush, threads);
                if tracing {
                    out[j].extend_from_slice(&x);
                }
            }
            x
        };
        for chunk in y.chunks(CHUNK) {
            let z = run(&mut self.stages, 0, chunk.to_vec(), false, &mut stage_out);
            x25.extend_from_slice(&z);
        }
        // The end: each stage in turn computes its gathered rows and its last outputs (the
        // strided convs' right padding), which flow on through the stages after it.
        for j in 0..n_stages {
            let mut tail = self.stages[j].push(&[], true, threads);
            let end = self.stages[j].stage.finish(threads);
            tail.extend_from_slice(&end);
            if tracing {
                stage_out[j].extend_from_slice(&tail);
            }
            let z = if j + 1 < n_stages {
                run(&mut self.stages, j + 1, tail, false, &mut stage_out)
            } else {
                tail
            };
            x25.extend_from_slice(&z);
        }
        if tracing {
            for (j, s) in self.stages.iter().enumerate() {
                let width = match &s.stage {
                    Stage::Conv(c) => c.conv.c_out,
                    Stage::Res(r) => r.c2.c_out,
                    Stage::Elu => continue,
                };
                rec(&format!("seanet.layers.{}", s.index), &stage_out[j], width);
            }
        }

        // Transformer at 25 Hz.
        let h = self.hidden;
        let t25 = x25.len() / h;
        let mut x = x25;
        for (l, layer) in self.layers.iter().enumerate() {
            self.layer(layer, &mut x, t25, threads);
            rec(&format!("tfm.layer.{l}"), &x, h);
        }

        // Downsample k4/s2 with replicate padding: 2 copies of the first row on the left, the last
        // row up to a whole stride on the right.
        let t12 = t25.div_ceil(2);
        let mut padded = Vec::with_capacity((t25 + 3) * h);
        for _ in 0..2 {
            padded.extend_from_slice(&x[..h]);
        }
        padded.extend_from_slice(&x);
        for _ in 0..(t12 * 2 - t25) {
            padded.extend_from_slice(&x[(t25 - 1) * h..]);
        }
        let mut down = vec![0.0; t12 * h];
        self.down.apply(&padded, 2, 1, t12, &mut down, threads);
        rec("downsample", &down, h);

        // Split RVQ.
        let d = self.dim;
        let mut codes = vec![[0u32; CODEBOOKS]; t12];
        let mut r = vec![0.0; t12 * d];
        self.sem.proj.apply(&down, 1, 1, t12, &mut r, threads);
        rec("proj_sem", &r, d);
        for (t, c) in self
            .nearest(&self.sem, 0, &r, threads)
            .into_iter()
            .enumerate()
        {
            codes[t][0] = c;
        }
        self.ac.proj.apply(&down, 1, 1, t12, &mut r, threads);
        rec("proj_ac", &r, d);
        for k in 0..self.ac.levels {
            rec(&format!("residual_ac.{k}"), &r, d);
            let best = self.nearest(&self.ac, k, &r, threads);
            for (t, &c) in best.iter().enumerate() {
                codes[t][k + 1] = c;
                let e = &self.ac.codebooks[(k * self.n_codes + c as usize) * d..][..d];
                for (x, e) in r[t * d..(t + 1) * d].iter_mut().zip(e) {
                    *x -= e;
                }
            }
        }
        codes
    }

    /// The codes of codebook `level` (0: semantic, 1..15: acoustic) for that level's input rows
    /// `x` (`[rows][codebook_dim]`): for teacher-forced parity tests.
    pub fn nearest_codes(&self, level: usize, x: &[f32], threads: usize) -> Vec<u32> {
        match level {
            0 => self.nearest(&self.sem, 0, x, threads),
            k => self.nearest(&self.ac, k - 1, x, threads),
        }
    }

    /// Nearest codeword of level `k` of `q` for each row of `x` (`[rows][d]`): the argmin of
    /// `‖e‖² − 2 x·e`, first index on ties.
    fn nearest(&self, q: &Quantizer, k: usize, x: &[f32], threads: usize) -> Vec<u32> {
        let (d, n) = (self.dim, self.n_codes);
        let rows = x.len() / d;
        let book = &q.codebooks[k * n * d..(k + 1) * n * d];
        let norms = &q.norms[k * n..(k + 1) * n];
        let mut dots = vec![0.0f32; rows * n];
        par_rows(&mut dots, n, rows, threads, |r0, ys| {
            let m = ys.len() / n;
            // SAFETY: rows r0..r0+m of x (d values each) and the level's n × d codebook (read
            // transposed through its strides) are in bounds; ys is m × n.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    d,
                    n,
                    1.0,
                    x.as_ptr().add(r0 * d),
                    d as isize,
                    1,
                    book.as_ptr(),
                    1,
                    d as isize,
                    0.0,
                    ys.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
        });
        dots.chunks_exact(n)
            .map(|row| {
                let mut best = (f32::INFINITY, 0u32);
                for (j, (&dot, &e2)) in row.iter().zip(norms).enumerate() {
                    let dist = e2 - 2.0 * dot;
                    if dist < best.0 {
                        best = (dist, j as u32);
                    }
                }
                best.1
            })
            .collect()
    }

    /// One pre-norm transformer layer over `x` (`[t][hidden]`), in place.
    fn layer(&self, l: &Layer, x: &mut [f32], t: usize, threads: usize) {
        let (h, nh, hd) = (self.hidden, self.heads, self.head_dim);
        let mut n = vec![0.0; t * h];
        layer_norm(x, &l.ln1.0, &l.ln1.1, self.eps, &mut n);
        let (mut q, mut k, mut v) = (vec![0.0; t * h], vec![0.0; t * h], vec![0.0; t * h]);
        l.q.apply(&n, &mut q, threads);
        l.k.apply(&n, &mut k, threads);
        l.v.apply(&n, &mut v, threads);
        self.rope(&mut q, t);
        self.rope(&mut k, t);
        let mut att = vec![0.0; t * h];
        let scale = 1.0 / (hd as f32).sqrt();
        let mut s = vec![0.0f32; t * t];
        for head in 0..nh {
            let off = head * hd;
            // SAFETY: Q and K rows are h wide, the head's hd columns start at `off`; S is t × t.
            unsafe {
                matrixmultiply::sgemm(
                    t,
                    hd,
                    t,
                    scale,
                    q.as_ptr().add(off),
                    h as isize,
                    1,
                    k.as_ptr().add(off),
                    1,
                    h as isize,
                    0.0,
                    s.as_mut_ptr(),
                    t as isize,
                    1,
                );
            }
            for (i, row) in s.chunks_exact_mut(t).enumerate() {
                let max = row[..=i].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                for v in &mut row[..=i] {
                    *v = (*v - max).exp();
                    sum += *v;
                }
                for v in &mut row[..=i] {
                    *v /= sum;
                }
                row[i + 1..].fill(0.0);
            }
            // SAFETY: P is t × t; V's head columns as above; the output head columns likewise.
            unsafe {
                matrixmultiply::sgemm(
                    t,
                    t,
                    hd,
                    1.0,
                    s.as_ptr(),
                    t as isize,
                    1,
                    v.as_ptr().add(off),
                    h as isize,
                    1,
                    0.0,
                    att.as_mut_ptr().add(off),
                    h as isize,
                    1,
                );
            }
        }
        let mut o = vec![0.0; t * h];
        l.o.apply(&att, &mut o, threads);
        for (row, orow) in x.chunks_exact_mut(h).zip(o.chunks_exact(h)) {
            for ((x, o), s) in row.iter_mut().zip(orow).zip(&l.attn_scale) {
                *x += s * o;
            }
        }
        layer_norm(x, &l.ln2.0, &l.ln2.1, self.eps, &mut n);
        let ff = l.fc1.n_out;
        let mut f1 = vec![0.0; t * ff];
        l.fc1.apply(&n, &mut f1, threads);
        par_rows(&mut f1, ff, t, threads, |_, ys| gelu_erf(ys));
        l.fc2.apply(&f1, &mut o, threads);
        for (row, orow) in x.chunks_exact_mut(h).zip(o.chunks_exact(h)) {
            for ((x, o), s) in row.iter_mut().zip(orow).zip(&l.mlp_scale) {
                *x += s * o;
            }
        }
    }

    /// NeoX (rotate-half) RoPE over every head of `x` (`[t][hidden]`), positions 0..t, computed
    /// in f32 as the reference does.
    fn rope(&self, x: &mut [f32], t: usize) {
        let (hd, half) = (self.head_dim, self.head_dim / 2);
        let inv: Vec<f32> = (0..half)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f32 / hd as f32))
            .collect();
        for p in 0..t {
            let row = &mut x[p * self.hidden..(p + 1) * self.hidden];
            for head in row.chunks_exact_mut(hd) {
                for i in 0..half {
                    let a = p as f32 * inv[i];
                    let (sin, cos) = a.sin_cos();
                    let (x0, x1) = (head[i], head[i + half]);
                    head[i] = x0 * cos - x1 * sin;
                    head[i + half] = x1 * cos + x0 * sin;
                }
            }
        }
    }
}
