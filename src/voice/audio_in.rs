//! Reference audio in: a file (or its bytes) decoded by symphonia (WAV, FLAC, MP3, Ogg/Vorbis),
//! mixed to mono by averaging the channels, and resampled to 24 kHz by libsoxr's HQ recipe, as
//! the official code does (`librosa.load(sr=None, mono=True)` then `librosa.resample(...,
//! res_type="soxr_hq")`, whose length is `ceil(n · 24000 / rate)` computed in f64), then checked.
//!
//! Limits: a reference of [`MIN_REFERENCE_SECONDS`] to [`MAX_REFERENCE_SECONDS`] (the official
//! code has none; every second adds 12.5 rows to each utterance's prompt, and 3 to 10 s of clear
//! speech clones best), rates of 8 to 192 kHz, finite samples, not silent (peak at least 1e-4,
//! −80 dBFS). A file over the limit is refused from its header when it declares its length, else
//! as soon as the decoded audio passes it: ten minutes are never decoded whole.

use std::path::Path;

use super::wav_header::{check_wav_header, WAV_HEAD};
use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::{MediaSource, MediaSourceStream};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

/// The encoders' rate.
pub const RATE: u32 = 24000;
/// Shortest reference accepted, seconds.
pub const MIN_REFERENCE_SECONDS: f64 = 1.0;
/// Longest reference accepted, seconds.
pub const MAX_REFERENCE_SECONDS: f64 = 30.0;
/// Lowest and highest input rates accepted, Hz.
pub const RATES: std::ops::RangeInclusive<u32> = 8000..=192_000;
/// Peak below which a reference is silence (−80 dBFS).
pub const SILENCE_PEAK: f32 = 1e-4;

/// Why a reference recording cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AudioInError {
    /// The file could not be read.
    #[error("{what}: {source}")]
    Io {
        /// The file.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// Not a format this build decodes.
    #[error("{what}: not audio in a format qtts reads (WAV, FLAC, MP3, Ogg/Vorbis): {reason}")]
    NotAudio {
        /// The file.
        what: String,
        /// What the decoder said.
        reason: String,
    },
    /// The file stops or breaks before its audio ends.
    #[error(
        "{what}: truncated or corrupt: expected {expected}, found {found}; export the recording \
         again"
    )]
    Corrupt {
        /// The file.
        what: String,
        /// What the header promised.
        expected: String,
        /// What was there.
        found: String,
    },
    /// A length outside the limits.
    #[error(
        "{what}: {found} of audio; a reference takes {MIN_REFERENCE_SECONDS} to \
         {MAX_REFERENCE_SECONDS} s (3 to 10 s of clear speech is best): {hint}"
    )]
    Length {
        /// The file.
        what: String,
        /// The length found.
        found: String,
        /// What to do.
        hint: &'static str,
    },
    /// A sample rate outside [`RATES`].
    #[error("{what}: sample rate {found} Hz; a reference takes 8000 to 192000 Hz")]
    Rate {
        /// The file.
        what: String,
        /// The rate.
        found: u32,
    },
    /// Silence.
    #[error("{what}: silent (peak {peak_dbfs:.0} dBFS, below −80): record the speaker again")]
    Silent {
        /// The file.
        what: String,
        /// Its peak level.
        peak_dbfs: f32,
    },
    /// NaN or infinite samples (a float WAV can carry them).
    #[error("{what}: sample {at} is {value} (not finite): the file is damaged; export it again")]
    NonFinite {
        /// The file.
        what: String,
        /// The first such sample (per channel frame).
        at: usize,
        /// Its value.
        value: f32,
    },
    /// Resampling is needed and this build has no resampler, or libsoxr failed.
    #[error("{what}: {found} Hz audio needs resampling to 24000 Hz: {reason}")]
    Resample {
        /// The file.
        what: String,
        /// The input rate.
        found: u32,
        /// Why it could not be done.
        reason: String,
    },
}

/// Decoded audio, mixed to mono, at its own rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// Mono samples in [−1, 1] (channel mean).
    pub samples: Vec<f32>,
    /// Sample rate, Hz.
    pub rate: u32,
    /// Channels of the file.
    pub channels: usize,
}

/// A reference file → 24 kHz mono samples for the encoders, checked.
pub fn load_reference(path: &Path) -> Result<Vec<f32>, AudioInError> {
    let what = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| AudioInError::Io {
        what: what.clone(),
        source: e,
    })?;
    let mut hint = Hint::new();
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    let audio = decode(Box::new(file), hint, &what)?;
    prepare(audio, &what)
}

/// Reference bytes (an upload) → 24 kHz mono samples, checked; `extension` (`wav`, `mp3`, ...)
/// helps the format probe.
pub fn load_reference_bytes(
    bytes: Vec<u8>,
    extension: Option<&str>,
) -> Result<Vec<f32>, AudioInError> {
    let mut hint = Hint::new();
    if let Some(ext) = extension {
        hint.with_extension(ext);
    }
    let what = "reference audio".to_string();
    let audio = decode(Box::new(std::io::Cursor::new(bytes)), hint, &what)?;
    prepare(audio, &what)
}

/// Samples a caller recorded (mono f32 at `rate` Hz: the C ABI's and Python's cloning from
/// samples) → 24 kHz mono samples for the encoders, with the checks a file gets: the rate in
/// [`RATES`], 1 to 30 s, finite values, not silent.
pub fn reference_from_samples(samples: &[f32], rate: u32) -> Result<Vec<f32>, AudioInError> {
    let what = "reference samples";
    if !RATES.contains(&rate) {
        return Err(AudioInError::Rate {
            what: what.into(),
            found: rate,
        });
    }
    let seconds = samples.len() as f64 / f64::from(rate);
    if seconds > MAX_REFERENCE_SECONDS {
        return Err(AudioInError::Length {
            what: what.into(),
            found: format!("{seconds:.1} s"),
            hint: "give at most 30 s",
        });
    }
    if let Some(i) = samples.iter().position(|v| !v.is_finite()) {
        return Err(AudioInError::NotAudio {
            what: what.into(),
            reason: format!(
                "sample {i} is {} (expected finite values in [-1, 1])",
                samples[i]
            ),
        });
    }
    let audio = Audio {
        samples: samples.to_vec(),
        rate,
        channels: 1,
    };
    prepare(audio, what)
}

/// Resampling, length, silence checks.
fn prepare(audio: Audio, what: &str) -> Result<Vec<f32>, AudioInError> {
    let y = resample(&audio.samples, audio.rate, what)?;
    let seconds = y.len() as f64 / RATE as f64;
    if seconds < MIN_REFERENCE_SECONDS {
        return Err(AudioInError::Length {
            what: what.into(),
            found: format!("{seconds:.2} s"),
            hint: "give a longer recording",
        });
    }
    let peak = y.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if peak < SILENCE_PEAK {
        return Err(AudioInError::Silent {
            what: what.into(),
            peak_dbfs: 20.0 * peak.max(1e-12).log10(),
        });
    }
    Ok(y)
}

/// Decodes a whole stream to mono at its own rate, refusing more than
/// [`MAX_REFERENCE_SECONDS`] without decoding past them. A decoder that panics on a damaged
/// file is reported as [`AudioInError::Corrupt`].
pub fn decode(
    mut source: Box<dyn MediaSource>,
    hint: Hint,
    what: &str,
) -> Result<Audio, AudioInError> {
    // A WAV's format chunk is checked before the decoder sees it (`check_wav_header`).
    if source.is_seekable() {
        use std::io::{Read, Seek};
        let io = |e| AudioInError::Io {
            what: what.into(),
            source: e,
        };
        let mut head = Vec::with_capacity(WAV_HEAD);
        (&mut source)
            .take(WAV_HEAD as u64)
            .read_to_end(&mut head)
            .map_err(io)?;
        source.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
        check_wav_header(&head, what)?;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        decode_inner(source, hint, what)
    })) {
        Ok(r) => r,
        Err(_) => Err(AudioInError::Corrupt {
            what: what.into(),
            expected: "a file the decoder can read".into(),
            found: "data that made the decoder fail".into(),
        }),
    }
}

fn decode_inner(
    source: Box<dyn MediaSource>,
    hint: Hint,
    what: &str,
) -> Result<Audio, AudioInError> {
    let not_audio = |e: SymError| AudioInError::NotAudio {
        what: what.into(),
        reason: e.to_string(),
    };
    let mss = MediaSourceStream::new(source, Default::default());
    let probed = symphonia::default::get_probe()
        .format(
            &hint,
            mss,
            &FormatOptions::default(),
            &MetadataOptions::default(),
        )
        .map_err(not_audio)?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
        .ok_or_else(|| AudioInError::NotAudio {
            what: what.into(),
            reason: "no audio track".into(),
        })?
        .clone();
    let params = &track.codec_params;
    let rate = params.sample_rate.ok_or_else(|| AudioInError::NotAudio {
        what: what.into(),
        reason: "no sample rate".into(),
    })?;
    if !RATES.contains(&rate) {
        return Err(AudioInError::Rate {
            what: what.into(),
            found: rate,
        });
    }
    let too_long = |seconds: f64| AudioInError::Length {
        what: what.into(),
        found: format!("{seconds:.1} s"),
        hint: "trim it to the best 3 to 10 s",
    };
    // A length over an hour is a streaming header's placeholder (a WAV written as it was
    // recorded says 0xFFFFFFFF bytes): unknown, so the running cap below applies.
    let declared = params
        .n_frames
        .filter(|&n| (n as f64 / rate as f64) < 3600.0);
    if let Some(n) = declared {
        if n as f64 / rate as f64 > MAX_REFERENCE_SECONDS + 0.5 {
            return Err(too_long(n as f64 / rate as f64));
        }
    }
    let limit = ((MAX_REFERENCE_SECONDS + 0.5) * rate as f64) as usize;
    let mut decoder = symphonia::default::get_codecs()
        .make(params, &DecoderOptions::default())
        .map_err(not_audio)?;
    let mut mono: Vec<f32> = Vec::new();
    let mut channels = params.channels.map_or(0, |c| c.count());
    let mut buf: Option<SampleBuffer<f32>> = None;
    loop {
        let packet = match format.next_packet() {
            Ok(p) => p,
            // The end of the stream (or of a cut file: checked against the header below).
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => {
                return Err(AudioInError::Corrupt {
                    what: what.into(),
                    expected: "readable packets to the end".into(),
                    found: format!("{e} after {:.2} s", mono.len() as f64 / rate as f64),
                })
            }
        };
        if packet.track_id() != track.id {
            continue;
        }
        let decoded = match decoder.decode(&packet) {
            Ok(d) => d,
            Err(e) => {
                return Err(AudioInError::Corrupt {
                    what: what.into(),
                    expected: "decodable audio to the end".into(),
                    found: format!("{e} after {:.2} s", mono.len() as f64 / rate as f64),
                })
            }
        };
        let spec = *decoded.spec();
        channels = spec.channels.count().max(1);
        let b = match &mut buf {
            Some(b) if b.capacity() >= decoded.capacity() * channels => b,
            _ => buf.insert(SampleBuffer::new(decoded.capacity() as u64, spec)),
        };
        b.copy_interleaved_ref(decoded);
        for frame in b.samples().chunks_exact(channels) {
            mono.push(frame.iter().sum::<f32>() / channels as f32);
        }
        if mono.len() > limit {
            return Err(too_long(mono.len() as f64 / rate as f64));
        }
    }
    if mono.is_empty() {
        return Err(AudioInError::Length {
            what: what.into(),
            found: "no samples".into(),
            hint: "the file holds no audio",
        });
    }
    if let Some(n) = declared {
        if (mono.len() as u64) < n {
            return Err(AudioInError::Corrupt {
                what: what.into(),
                expected: format!("{n} samples (the header's)"),
                found: format!("{}", mono.len()),
            });
        }
    }
    if let Some(at) = mono.iter().position(|v| !v.is_finite()) {
        return Err(AudioInError::NonFinite {
            what: what.into(),
            at,
            value: mono[at],
        });
    }
    Ok(Audio {
        samples: mono,
        rate,
        channels,
    })
}

/// `x` at `rate` → 24 kHz, librosa's length (`ceil(n · 24000 / rate)` in f64; zeros pad, extra
/// samples are cut).
pub fn resample(x: &[f32], rate: u32, what: &str) -> Result<Vec<f32>, AudioInError> {
    if rate == RATE {
        return Ok(x.to_vec());
    }
    let n_out = (x.len() as f64 * (RATE as f64 / rate as f64)).ceil() as usize;
    let mut y = soxr_hq(x, rate).map_err(|reason| AudioInError::Resample {
        what: what.into(),
        found: rate,
        reason,
    })?;
    y.resize(n_out, 0.0);
    Ok(y)
}

/// libsoxr, HQ recipe (20-bit, the default of python-soxr that librosa calls), f32, one channel.
#[cfg(feature = "resample")]
fn soxr_hq(x: &[f32], rate: u32) -> Result<Vec<f32>, String> {
    use soxr::format::Mono;
    use soxr::params::{QualityRecipe, QualitySpec, RuntimeSpec};
    use soxr::Soxr;
    let mut s = Soxr::<Mono<f32>>::new_with_params(
        rate as f64,
        RATE as f64,
        QualitySpec::new(QualityRecipe::high()),
        RuntimeSpec::new(1),
    )
    .map_err(|e| e.as_str().to_owned())?;
    let room = (x.len() as f64 * RATE as f64 / rate as f64) as usize + 4096;
    let mut out = vec![0.0f32; room];
    let mut produced = 0;
    let mut consumed = 0;
    while consumed < x.len() {
        if produced == out.len() {
            out.resize(out.len() * 2, 0.0);
        }
        let p = s
            .process(&x[consumed..], &mut out[produced..])
            .map_err(|e| e.as_str().to_owned())?;
        consumed += p.input_frames;
        produced += p.output_frames;
    }
    loop {
        if produced == out.len() {
            out.resize(out.len() * 2, 0.0);
        }
        let n = s
            .drain(&mut out[produced..])
            .map_err(|e| e.as_str().to_owned())?;
        if n == 0 {
            break;
        }
        produced += n;
    }
    out.truncate(produced);
    Ok(out)
}

#[cfg(not(feature = "resample"))]
fn soxr_hq(_: &[f32], _: u32) -> Result<Vec<f32>, String> {
    Err(
        "this build has no resampler (feature `resample`): convert the recording to 24 kHz \
         (e.g. `sox in.wav -r 24000 out.wav`) or build with the feature"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(rel: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/voice")
            .join(rel)
    }

    #[cfg(feature = "resample")]
    fn oracle() -> std::collections::HashMap<String, (Vec<usize>, Vec<f32>)> {
        let bytes = std::fs::read(fixture("oracle/resample.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensors()
            .into_iter()
            .filter(|(_, v)| v.dtype() == safetensors::Dtype::F32)
            .map(|(n, v)| {
                let f = v
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                (n, (v.shape().to_vec(), f))
            })
            .collect()
    }

    fn max_abs(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    }

    /// librosa's `soxr_hq` resampling (python-soxr's own libsoxr build) against Debian's libsoxr
    /// through this module: lengths exact, samples within 1e-5 (measured: see the log line).
    #[cfg(feature = "resample")]
    #[test]
    fn resampling_matches_librosa() {
        let o = oracle();
        for sr in [8000u32, 16000, 22050, 44100, 48000] {
            let x = &o[&format!("in_{sr}")].1;
            let want = &o[&format!("out_{sr}")].1;
            let y = resample(x, sr, "test").unwrap();
            assert_eq!(y.len(), want.len(), "{sr} Hz: length");
            let e = max_abs(&y, want);
            eprintln!("resample {sr} Hz: max |Δ| {e:.2e}");
            assert!(e < 1e-5, "{sr} Hz: {e:e}");
        }
        // Stereo: the channel mean, then the same resampling.
        let (shape, x) = &o["in_48000_stereo"];
        let n = shape[1];
        let mono: Vec<f32> = (0..n).map(|i| (x[i] + x[n + i]) / 2.0).collect();
        let y = resample(&mono, 48000, "test").unwrap();
        let e = max_abs(&y, &o["out_48000_stereo"].1);
        assert!(e < 1e-5, "stereo: {e:e}");
    }

    fn write_wav(path: &Path, rate: u32, channels: u16, bits: u16, float: bool, frames: &[f32]) {
        let spec = hound::WavSpec {
            channels,
            sample_rate: rate,
            bits_per_sample: bits,
            sample_format: if float {
                hound::SampleFormat::Float
            } else {
                hound::SampleFormat::Int
            },
        };
        let mut w = hound::WavWriter::create(path, spec).unwrap();
        for &x in frames {
            if float {
                w.write_sample(x).unwrap();
            } else {
                let scale = (1i64 << (bits - 1)) as f32;
                w.write_sample(
                    ((x * scale).round() as i32).clamp(-(scale as i32), scale as i32 - 1),
                )
                .unwrap();
            }
        }
        w.finalize().unwrap();
    }

    fn tone(rate: u32, seconds: f64) -> Vec<f32> {
        (0..(rate as f64 * seconds) as usize)
            .map(|i| 0.5 * (std::f32::consts::TAU * 220.0 * i as f32 / rate as f32).sin())
            .collect()
    }

    #[test]
    fn wav_flavours_decode_to_24_khz_mono() {
        let dir = tempfile::tempdir().unwrap();
        // 24 kHz: no resampling, so the samples are the file's (16-bit exact to 1/32768).
        for (bits, float) in [(16, false), (24, false), (32, true)] {
            let p = dir.path().join(format!("t{bits}.wav"));
            let x = tone(24000, 1.5);
            write_wav(&p, 24000, 1, bits, float, &x);
            let y = load_reference(&p).unwrap();
            assert_eq!(y.len(), x.len());
            let tol = if float {
                0.0
            } else {
                1.0 / (1u32 << (bits - 1)) as f32
            };
            assert!(max_abs(&y, &x) <= tol, "{bits}-bit");
        }
        // Stereo 24 kHz: the channel mean.
        let p = dir.path().join("stereo.wav");
        let x = tone(24000, 1.2);
        let inter: Vec<f32> = x.iter().flat_map(|&v| [v, -0.5 * v]).collect();
        write_wav(&p, 24000, 2, 32, true, &inter);
        let y = load_reference(&p).unwrap();
        let want: Vec<f32> = x.iter().map(|v| (v - 0.5 * v) / 2.0).collect();
        assert!(max_abs(&y, &want) < 1e-7);
        // 8 kHz mono and 96 kHz stereo: librosa's lengths.
        for (rate, ch) in [(8000u32, 1u16), (96000, 2)] {
            let p = dir.path().join(format!("r{rate}.wav"));
            let x = tone(rate, 1.3);
            let inter: Vec<f32> = x
                .iter()
                .flat_map(|&v| std::iter::repeat_n(v, ch as usize))
                .collect();
            write_wav(&p, rate, ch, 16, false, &inter);
            match load_reference(&p) {
                Ok(y) => assert_eq!(
                    y.len(),
                    (x.len() as f64 * 24000.0 / rate as f64).ceil() as usize,
                    "{rate} Hz"
                ),
                Err(AudioInError::Resample { .. }) if !cfg!(feature = "resample") => {}
                Err(e) => panic!("{rate} Hz: {e}"),
            }
        }
    }

    fn source() -> Vec<f32> {
        std::fs::read(fixture("audio/source.f32"))
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// Signal-to-noise ratio of `y` against `x` at the best lag in 0..max_lag (lossy codecs
    /// delay the signal), dB.
    fn snr(x: &[f32], y: &[f32], max_lag: usize) -> f64 {
        (0..max_lag)
            .map(|lag| {
                let n = x.len().min(y.len().saturating_sub(lag));
                let (mut s, mut e) = (0.0f64, 0.0f64);
                for i in 0..n {
                    s += (x[i] as f64).powi(2);
                    e += (x[i] as f64 - y[i + lag] as f64).powi(2);
                }
                10.0 * (s / e.max(1e-30)).log10()
            })
            .fold(f64::NEG_INFINITY, f64::max)
    }

    #[test]
    fn flac_mp3_and_vorbis_decode() {
        let x = source();
        let open = |name: &str| {
            let p = fixture(&format!("audio/{name}"));
            let f = std::fs::File::open(&p).unwrap();
            let mut hint = Hint::new();
            hint.with_extension(p.extension().unwrap().to_str().unwrap());
            decode(Box::new(f), hint, name).unwrap()
        };
        // FLAC, 16-bit stereo (the signal and 0.6× its reverse): exact to the rounding.
        let a = open("stereo.flac");
        assert_eq!((a.rate, a.channels, a.samples.len()), (22050, 2, x.len()));
        let n = x.len();
        let want: Vec<f32> = (0..n).map(|i| (x[i] + 0.6 * x[n - 1 - i]) / 2.0).collect();
        assert!(max_abs(&a.samples, &want) < 2.0 / 32768.0);
        // Lossy: the length within the codecs' padding, the waveform by its SNR.
        for name in ["mono.mp3", "mono.ogg"] {
            let a = open(name);
            assert_eq!((a.rate, a.channels), (22050, 1), "{name}");
            assert!(
                a.samples.len().abs_diff(n) < 3000,
                "{name}: {} samples",
                a.samples.len()
            );
            let s = snr(&x, &a.samples, 2500);
            eprintln!("{name}: SNR {s:.1} dB");
            assert!(s > 10.0, "{name}: SNR {s:.1} dB");
        }
        if cfg!(feature = "resample") {
            let y = load_reference(&fixture("audio/mono.ogg")).unwrap();
            assert!(y.len() > 24000);
        }
    }

    #[test]
    fn bad_references_get_their_error() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let p = |n: &str| d.join(n);
        std::fs::write(
            p("noise.bin"),
            (0..5000u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect::<Vec<_>>(),
        )
        .unwrap();
        assert!(matches!(
            load_reference(&p("noise.bin")),
            Err(AudioInError::NotAudio { .. })
        ));
        std::fs::write(p("text.wav"), "this is not a recording\n").unwrap();
        assert!(matches!(
            load_reference(&p("text.wav")),
            Err(AudioInError::NotAudio { .. })
        ));
        assert!(matches!(
            load_reference(&p("missing.wav")),
            Err(AudioInError::Io { .. })
        ));

        // Truncated: a WAV cut in its data, a FLAC cut in half.
        write_wav(&p("whole.wav"), 24000, 1, 16, false, &tone(24000, 2.0));
        let bytes = std::fs::read(p("whole.wav")).unwrap();
        std::fs::write(p("cut.wav"), &bytes[..bytes.len() / 2]).unwrap();
        assert!(matches!(
            load_reference(&p("cut.wav")),
            Err(AudioInError::Corrupt { .. })
        ));
        let flac = std::fs::read(fixture("audio/stereo.flac")).unwrap();
        std::fs::write(p("cut.flac"), &flac[..flac.len() / 2]).unwrap();
        assert!(matches!(
            load_reference(&p("cut.flac")),
            Err(AudioInError::Corrupt { .. })
        ));

        // 0 samples, too short, silence, NaN and infinity.
        write_wav(&p("empty.wav"), 24000, 1, 16, false, &[]);
        assert!(matches!(
            load_reference(&p("empty.wav")),
            Err(AudioInError::Length { .. })
        ));
        write_wav(&p("short.wav"), 24000, 1, 16, false, &tone(24000, 0.5));
        assert!(matches!(
            load_reference(&p("short.wav")),
            Err(AudioInError::Length { .. })
        ));
        write_wav(&p("silent.wav"), 24000, 1, 16, false, &vec![0.0; 48000]);
        assert!(matches!(
            load_reference(&p("silent.wav")),
            Err(AudioInError::Silent { .. })
        ));
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x = tone(24000, 2.0);
            x[1000] = bad;
            write_wav(&p("nan.wav"), 24000, 1, 32, true, &x);
            match load_reference(&p("nan.wav")) {
                Err(AudioInError::NonFinite { at: 1000, .. }) => {}
                other => panic!("{bad}: {other:?}"),
            }
        }
        // A WAV written while recording (sizes 0xFFFFFFFF, as `qtts serve` streams them):
        // decoded to its end, not refused from its placeholder length.
        let mut streamed = std::fs::read(p("whole.wav")).unwrap();
        streamed[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        streamed[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(p("streamed.wav"), &streamed).unwrap();
        assert_eq!(load_reference(&p("streamed.wav")).unwrap().len(), 48000);
        // Zeros in the WAV format chunk, refused from the header (a rate of 0 made symphonia
        // panic), from a file and from bytes.
        let wav = std::fs::read(p("whole.wav")).unwrap();
        for (at, len) in [(24, 4), (22, 2), (32, 2), (34, 2)] {
            let mut b = wav.clone();
            b[at..at + len].fill(0);
            std::fs::write(p("zero.wav"), &b).unwrap();
            let from_file = load_reference(&p("zero.wav"));
            let from_bytes = load_reference_bytes(b, Some("wav"));
            for r in [from_file, from_bytes] {
                match (at, r) {
                    (24, Err(AudioInError::Rate { found: 0, .. })) => {}
                    (22 | 32 | 34, Err(AudioInError::NotAudio { reason, .. }))
                        if reason.contains("format chunk") => {}
                    (_, other) => panic!("zero at {at}: {other:?}"),
                }
            }
        }
        // A rate outside 8..192 kHz.
        write_wav(&p("4k.wav"), 4000, 1, 16, false, &tone(4000, 2.0));
        assert!(matches!(
            load_reference(&p("4k.wav")),
            Err(AudioInError::Rate { found: 4000, .. })
        ));
        // Ten minutes at 8 kHz: refused from the header, before decoding.
        write_wav(&p("long.wav"), 8000, 1, 16, false, &tone(8000, 600.0));
        let t = std::time::Instant::now();
        assert!(matches!(
            load_reference(&p("long.wav")),
            Err(AudioInError::Length { .. })
        ));
        assert!(
            t.elapsed().as_secs_f64() < 1.0,
            "decoded instead of refused"
        );
        // The same stream without a declared length (bytes with no hint still probe as WAV;
        // an MP3-like stream would be cut as soon as it passes the limit).
        let long = std::fs::read(p("long.wav")).unwrap();
        assert!(matches!(
            load_reference_bytes(long, None),
            Err(AudioInError::Length { .. })
        ));
    }
}
