//! The speaker encoder's log-mel front end, as the reference's `mel_spectrogram` is called by
//! `extract_speaker_embedding` (`qwen_tts/core/models/modeling_qwen3_tts.py`): 24 kHz, n_fft 1024,
//! hop 256, periodic Hann window of 1024, reflect padding of 384 on each side with no centering,
//! magnitude `sqrt(re² + im² + 1e-9)`, 128 Slaney mel filters (librosa's `filters.mel` with
//! `htk=False`, `norm="slaney"`, 0..12 kHz, built in f64 and cast to f32), `ln(max(mel, 1e-5))`.

use std::sync::Arc;

use realfft::{RealFftPlanner, RealToComplex};

/// FFT length.
pub const N_FFT: usize = 1024;
/// Hop between frames.
pub const HOP: usize = 256;
/// Mel bins.
pub const N_MELS: usize = 128;
/// FFT bins kept (one-sided).
pub const N_BINS: usize = N_FFT / 2 + 1;
/// Reflect padding on each side.
pub const PAD: usize = (N_FFT - HOP) / 2;

/// Frames for `n` samples: `⌊(n + 2·PAD − N_FFT) / HOP⌋ + 1 = ⌊n / HOP⌋`.
pub fn frames(n: usize) -> usize {
    if n + 2 * PAD < N_FFT {
        0
    } else {
        (n + 2 * PAD - N_FFT) / HOP + 1
    }
}

/// The front end: window, filterbank and FFT plan, built once.
pub struct MelFrontEnd {
    window: Vec<f32>,
    /// `[N_MELS][N_BINS]`.
    basis: Vec<f32>,
    fft: Arc<dyn RealToComplex<f32>>,
}

impl std::fmt::Debug for MelFrontEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MelFrontEnd").finish_non_exhaustive()
    }
}

impl Default for MelFrontEnd {
    fn default() -> Self {
        Self::new()
    }
}

impl MelFrontEnd {
    /// Builds the window, the filterbank and the FFT plan.
    pub fn new() -> Self {
        let window = (0..N_FFT)
            .map(|i| (0.5 - 0.5 * (std::f64::consts::TAU * i as f64 / N_FFT as f64).cos()) as f32)
            .collect();
        MelFrontEnd {
            window,
            basis: slaney_mel_basis(24000.0, N_FFT, N_MELS, 0.0, 12000.0),
            fft: RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT),
        }
    }

    /// The filterbank, `[N_MELS][N_BINS]`.
    pub fn basis(&self) -> &[f32] {
        &self.basis
    }

    /// The magnitude spectrogram `[frames][N_BINS]` of `y` (at least `PAD + 1` samples: the
    /// reflection needs them; the caller checks).
    pub fn magnitude(&self, y: &[f32]) -> Vec<f32> {
        let n = y.len();
        let f = frames(n);
        let mut padded = Vec::with_capacity(n + 2 * PAD);
        padded.extend((1..=PAD).rev().map(|i| y[i]));
        padded.extend_from_slice(y);
        padded.extend((0..PAD).map(|i| y[n - 2 - i]));
        let mut input = self.fft.make_input_vec();
        let mut spec = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut out = vec![0.0f32; f * N_BINS];
        for (t, row) in out.chunks_exact_mut(N_BINS).enumerate() {
            let frame = &padded[t * HOP..t * HOP + N_FFT];
            for ((i, &x), &w) in input.iter_mut().zip(frame).zip(&self.window) {
                *i = x * w;
            }
            // The lengths are the plan's own, so processing cannot fail.
            let _ = self
                .fft
                .process_with_scratch(&mut input, &mut spec, &mut scratch);
            for (m, c) in row.iter_mut().zip(&spec) {
                *m = (c.re * c.re + c.im * c.im + 1e-9).sqrt();
            }
        }
        out
    }

    /// The log-mel spectrogram `[frames][N_MELS]` of magnitudes `mag` (`[frames][N_BINS]`).
    pub fn log_mel(&self, mag: &[f32]) -> Vec<f32> {
        let f = mag.len() / N_BINS;
        let mut out = vec![0.0f32; f * N_MELS];
        for (m_row, out_row) in mag.chunks_exact(N_BINS).zip(out.chunks_exact_mut(N_MELS)) {
            for (o, b_row) in out_row.iter_mut().zip(self.basis.chunks_exact(N_BINS)) {
                let mel: f32 = b_row.iter().zip(m_row).map(|(b, m)| b * m).sum();
                *o = mel.max(1e-5).ln();
            }
        }
        out
    }
}

/// Slaney-scale mel frequency (librosa `hz_to_mel`, `htk=False`).
fn hz_to_mel(f: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let (min_log_hz, min_log_mel) = (1000.0, 1000.0 / f_sp);
    let logstep = 6.4f64.ln() / 27.0;
    if f >= min_log_hz {
        min_log_mel + (f / min_log_hz).ln() / logstep
    } else {
        f / f_sp
    }
}

/// Inverse of [`hz_to_mel`] (librosa `mel_to_hz`, `htk=False`).
fn mel_to_hz(m: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let (min_log_hz, min_log_mel) = (1000.0, 1000.0 / f_sp);
    let logstep = 6.4f64.ln() / 27.0;
    if m >= min_log_mel {
        min_log_hz * (logstep * (m - min_log_mel)).exp()
    } else {
        f_sp * m
    }
}

/// librosa's `filters.mel(sr, n_fft, n_mels, fmin, fmax, htk=False, norm="slaney")`: triangular
/// filters on the Slaney mel scale, area-normalised, computed in f64, returned as f32
/// `[n_mels][n_fft/2 + 1]`.
pub fn slaney_mel_basis(sr: f64, n_fft: usize, n_mels: usize, fmin: f64, fmax: f64) -> Vec<f32> {
    let n_bins = n_fft / 2 + 1;
    let fft_freqs: Vec<f64> = (0..n_bins)
        .map(|i| i as f64 * (sr / 2.0) / (n_bins - 1) as f64)
        .collect();
    let (lo, hi) = (hz_to_mel(fmin), hz_to_mel(fmax));
    let mel_f: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut w = vec![0.0f32; n_mels * n_bins];
    for m in 0..n_mels {
        let (d0, d1) = (mel_f[m + 1] - mel_f[m], mel_f[m + 2] - mel_f[m + 1]);
        let enorm = 2.0 / (mel_f[m + 2] - mel_f[m]);
        for (k, &f) in fft_freqs.iter().enumerate() {
            let lower = -(mel_f[m] - f) / d0;
            let upper = (mel_f[m + 2] - f) / d1;
            w[m * n_bins + k] = (lower.min(upper).max(0.0) * enorm) as f32;
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_count_is_floor_of_n_over_hop() {
        for n in [385, 1000, 1024, 24000, 24001, 31497] {
            assert_eq!(frames(n), n / HOP, "n {n}");
        }
    }

    #[test]
    fn a_tone_peaks_in_the_mel_bin_of_its_frequency() {
        // 1 kHz: Slaney mel 15, which lies in the filter whose centre is nearest.
        let fe = MelFrontEnd::new();
        let y: Vec<f32> = (0..4800)
            .map(|i| (std::f32::consts::TAU * 1000.0 * i as f32 / 24000.0).sin() * 0.5)
            .collect();
        let mel = fe.log_mel(&fe.magnitude(&y));
        let row = &mel[5 * N_MELS..6 * N_MELS];
        let best = (0..N_MELS)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap();
        let (lo, hi) = (hz_to_mel(0.0), hz_to_mel(12000.0));
        let centre = |m: usize| mel_to_hz(lo + (hi - lo) * (m + 1) as f64 / (N_MELS + 1) as f64);
        let nearest = (0..N_MELS)
            .min_by(|&a, &b| {
                (centre(a) - 1000.0)
                    .abs()
                    .total_cmp(&(centre(b) - 1000.0).abs())
            })
            .unwrap();
        assert_eq!(best, nearest);
        assert!((mel_to_hz(hz_to_mel(3210.0)) - 3210.0).abs() < 1e-9);
    }
}
