//! Host f32 arithmetic of the two encoders: convolutions and matrix products on `matrixmultiply`'s
//! packed sgemm, split over threads by rows of time, and the pointwise functions.
//!
//! Activations are time-major (`[t][c]`, channels fastest), as in the decoder's `conv_gemm`: the
//! `taps` input rows a stride-1, dilation-1 output row reads are `taps · c_in` consecutive values,
//! so one product with overlapping left rows computes every tap (no im2col buffer).

use crate::error::ModelError;
use crate::gguf::GgufFile;

/// A 1-D convolution's weights, repacked for the time-major product.
#[derive(Debug, Clone)]
pub(crate) struct Conv {
    /// `[taps · c_in][c_out]`: row `j · c_in + c` holds tap `j` of input channel `c`.
    w: Vec<f32>,
    bias: Option<Vec<f32>>,
    pub c_in: usize,
    pub c_out: usize,
    pub taps: usize,
}

/// Reads tensor `name` as f32 values with the expected ggml shape `ne`.
pub(crate) fn read(f: &GgufFile, name: &str, ne: &[u64]) -> Result<Vec<f32>, ModelError> {
    let missing = || ModelError::MissingTensor {
        path: f.path().into(),
        tensor: name.into(),
    };
    let t = f.header.tensor(name).ok_or_else(missing)?;
    if t.ne != ne {
        return Err(ModelError::WrongShape {
            path: f.path().into(),
            tensor: name.into(),
            expected: ne.to_vec(),
            found: t.ne.clone(),
        });
    }
    let data = f.tensor_data(name).ok_or_else(missing)?;
    let n = ne.iter().product::<u64>() as usize;
    let v = crate::ffi::dequantize(t.ty, data, n).map_err(ModelError::from)?;
    f.release(name);
    Ok(v)
}

impl Conv {
    /// Loads `{name}.weight` (ggml `[taps, c_in, c_out]`: PyTorch's `[c_out, c_in, taps]`) and,
    /// with `bias`, `{name}.bias`.
    pub fn load(
        f: &GgufFile,
        name: &str,
        c_in: usize,
        c_out: usize,
        taps: usize,
        bias: bool,
    ) -> Result<Self, ModelError> {
        let raw = read(
            f,
            &format!("{name}.weight"),
            &[taps as u64, c_in as u64, c_out as u64],
        )?;
        let bias = if bias {
            Some(read(f, &format!("{name}.bias"), &[c_out as u64])?)
        } else {
            None
        };
        Ok(Self::from_torch(&raw, bias, c_in, c_out, taps))
    }

    /// From PyTorch's `[c_out][c_in][taps]` values.
    pub fn from_torch(
        raw: &[f32],
        bias: Option<Vec<f32>>,
        c_in: usize,
        c_out: usize,
        taps: usize,
    ) -> Self {
        let mut w = vec![0.0; raw.len()];
        for o in 0..c_out {
            for c in 0..c_in {
                for j in 0..taps {
                    w[(j * c_in + c) * c_out + o] = raw[(o * c_in + c) * taps + j];
                }
            }
        }
        Conv {
            w,
            bias,
            c_in,
            c_out,
            taps,
        }
    }

    /// `y[t] = bias + Σ_j W_j · x[t · stride + j · dilation]` for `t < t_out`; `x` is `[≥ rows][c_in]`
    /// already padded, `y` is `[t_out][c_out]`.
    pub fn apply(
        &self,
        x: &[f32],
        stride: usize,
        dilation: usize,
        t_out: usize,
        y: &mut [f32],
        threads: usize,
    ) {
        let (ci, co) = (self.c_in, self.c_out);
        debug_assert!(
            t_out == 0 || x.len() >= ((t_out - 1) * stride + (self.taps - 1) * dilation + 1) * ci
        );
        debug_assert_eq!(y.len(), t_out * co);
        let per_tap = if dilation == 1 { self.taps } else { 1 };
        par_rows(y, co, t_out, threads, |r0, ys| {
            let rows = ys.len() / co;
            for j in (0..self.taps).step_by(per_tap) {
                // SAFETY: the product reads rows r0..r0+rows of the strided input view (the
                // debug assertion above bounds them inside `x`), `per_tap · c_in` weight rows
                // from row `j · c_in`, and writes `ys`, which is `rows × c_out`.
                unsafe {
                    matrixmultiply::sgemm(
                        rows,
                        per_tap * ci,
                        co,
                        1.0,
                        x.as_ptr().add((r0 * stride + j * dilation) * ci),
                        (stride * ci) as isize,
                        1,
                        self.w.as_ptr().add(j * ci * co),
                        co as isize,
                        1,
                        if j == 0 { 0.0 } else { 1.0 },
                        ys.as_mut_ptr(),
                        co as isize,
                        1,
                    );
                }
            }
            if let Some(b) = &self.bias {
                for row in ys.chunks_exact_mut(co) {
                    for (v, b) in row.iter_mut().zip(b) {
                        *v += b;
                    }
                }
            }
        });
    }
}

/// A Linear layer without bias: PyTorch weight `[out][in]`, ggml `[in, out]`.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    /// `[in][out]` (transposed once at load).
    w: Vec<f32>,
    pub n_in: usize,
    pub n_out: usize,
}

impl Linear {
    /// Loads `name` (ggml `[n_in, n_out]`).
    pub fn load(f: &GgufFile, name: &str, n_in: usize, n_out: usize) -> Result<Self, ModelError> {
        let raw = read(f, name, &[n_in as u64, n_out as u64])?;
        let mut w = vec![0.0; raw.len()];
        for o in 0..n_out {
            for i in 0..n_in {
                w[i * n_out + o] = raw[o * n_in + i];
            }
        }
        Ok(Linear { w, n_in, n_out })
    }

    /// `y = x · Wᵀ` for `x` `[rows][n_in]`, `y` `[rows][n_out]`.
    pub fn apply(&self, x: &[f32], y: &mut [f32], threads: usize) {
        let rows = x.len() / self.n_in;
        debug_assert_eq!(y.len(), rows * self.n_out);
        par_rows(y, self.n_out, rows, threads, |r0, ys| {
            let n = ys.len() / self.n_out;
            // SAFETY: rows r0..r0+n of x (each n_in values) and all of w (n_in × n_out) are read;
            // ys is n × n_out.
            unsafe {
                matrixmultiply::sgemm(
                    n,
                    self.n_in,
                    self.n_out,
                    1.0,
                    x.as_ptr().add(r0 * self.n_in),
                    self.n_in as isize,
                    1,
                    self.w.as_ptr(),
                    self.n_out as isize,
                    1,
                    0.0,
                    ys.as_mut_ptr(),
                    self.n_out as isize,
                    1,
                );
            }
        });
    }
}

/// Smallest number of output values worth a second thread.
const PAR_MIN: usize = 1 << 15;

/// Runs `f(first_row, rows)` over `y` (`n_rows × width`) split into `threads` contiguous row
/// ranges, on scoped threads when the product is large enough to pay for them.
pub(crate) fn par_rows<F>(y: &mut [f32], width: usize, n_rows: usize, threads: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    let threads = threads.clamp(1, n_rows.max(1));
    if threads == 1 || n_rows * width < PAR_MIN {
        if n_rows > 0 {
            f(0, y);
        }
        return;
    }
    let per = n_rows.div_ceil(threads);
    std::thread::scope(|s| {
        let mut rest = y;
        let mut r0 = 0;
        let f = &f;
        while r0 < n_rows {
            let n = per.min(n_rows - r0);
            let (head, tail) = rest.split_at_mut(n * width);
            rest = tail;
            let start = r0;
            if r0 + n >= n_rows {
                f(start, head);
            } else {
                s.spawn(move || f(start, head));
            }
            r0 += n;
        }
    });
}

/// ELU with α = 1, in place.
pub(crate) fn elu(x: &mut [f32]) {
    for v in x {
        if *v < 0.0 {
            *v = v.exp_m1();
        }
    }
}

/// ReLU in place.
pub(crate) fn relu(x: &mut [f32]) {
    for v in x {
        *v = v.max(0.0);
    }
}

/// GELU, the erf form (`nn.GELU()`), in place.
pub(crate) fn gelu_erf(x: &mut [f32]) {
    for v in x {
        *v = 0.5 * *v * (1.0 + libm::erff(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// LayerNorm with weight and bias over rows of `x` (`[rows][w.len()]`) into `y`.
pub(crate) fn layer_norm(x: &[f32], w: &[f32], b: &[f32], eps: f32, y: &mut [f32]) {
    let n = w.len();
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let mean = xr.iter().sum::<f32>() / n as f32;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for i in 0..n {
            yr[i] = (xr[i] - mean) * inv * w[i] + b[i];
        }
    }
}

/// `[rows][cols]` → `[cols][rows]`.
#[cfg(test)]
pub(crate) fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            y[c * rows + r] = x[r * cols + c];
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct definition of a strided, dilated 1-D convolution on `[c][t]` data.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        raw: &[f32],
        bias: &[f32],
        x_ct: &[f32],
        t_in: usize,
        ci: usize,
        co: usize,
        k: usize,
        s: usize,
        d: usize,
    ) -> Vec<f32> {
        let t_out = (t_in - (k - 1) * d - 1) / s + 1;
        let mut y = vec![0.0f64; t_out * co];
        for t in 0..t_out {
            for o in 0..co {
                let mut acc = bias[o] as f64;
                for c in 0..ci {
                    for j in 0..k {
                        acc += raw[(o * ci + c) * k + j] as f64
                            * x_ct[c * t_in + t * s + j * d] as f64;
                    }
                }
                y[t * co + o] = acc;
            }
        }
        y.into_iter().map(|v| v as f32).collect()
    }

    #[test]
    fn conv_matches_its_definition_for_strides_dilations_and_threads() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let mut g = move || rng.random::<f32>() * 2.0 - 1.0;
        for &(ci, co, k, s, d, t_in) in &[
            (1, 8, 7, 1, 1, 50),
            (6, 5, 3, 1, 3, 40),
            (4, 9, 8, 4, 1, 103),
            (16, 300, 3, 1, 1, 300),
        ] {
            let raw: Vec<f32> = (0..co * ci * k).map(|_| g()).collect();
            let bias: Vec<f32> = (0..co).map(|_| g()).collect();
            let x_ct: Vec<f32> = (0..ci * t_in).map(|_| g()).collect();
            let want = naive(&raw, &bias, &x_ct, t_in, ci, co, k, s, d);
            let conv = Conv::from_torch(&raw, Some(bias), ci, co, k);
            let x_tc = transpose(&x_ct, ci, t_in);
            let t_out = want.len() / co;
            for threads in [1, 2, 3] {
                let mut y = vec![f32::NAN; t_out * co];
                conv.apply(&x_tc, s, d, t_out, &mut y, threads);
                let err = y
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                assert!(
                    err < 1e-4,
                    "ci {ci} co {co} k {k} s {s} d {d} threads {threads}: {err}"
                );
            }
        }
    }
}
