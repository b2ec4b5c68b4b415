//! Live playback through cpal: the device's output callback drives a [`Player`].
//!
//! The callback pops 24 kHz mono samples from the ring, resamples them linearly when the device
//! runs at another rate, copies them to every channel and converts to the device's sample format
//! (f32 or i16). Its buffers are allocated when the stream is built; the callback itself allocates
//! nothing, takes no lock, logs nothing and never blocks. cpal's `Stream` stays on the thread that
//! opened it (it is not `Send` on every platform): keep the [`CpalOutput`] there.

use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};

use super::{AudioError, Player, Shared, SAMPLE_RATE};
use std::sync::Arc;

/// Source samples pulled from the ring per refill: 1024 (43 ms).
const BLOCK: usize = 1024;

/// An open output stream playing a [`Player`].
pub struct CpalOutput {
    _stream: cpal::Stream,
    shared: Arc<Shared>,
    /// The device's name and stream settings, for messages.
    pub description: String,
}

impl std::fmt::Debug for CpalOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpalOutput")
            .field("description", &self.description)
            .finish()
    }
}

/// Maps the player's 24 kHz mono stream to the device's rate and channels.
struct Adapter {
    player: Player,
    src: Box<[f32]>,
    read: usize,
    len: usize,
    step: f64,
    frac: f64,
    cur: f32,
    next: f32,
    channels: usize,
}

impl Adapter {
    fn source(&mut self) -> f32 {
        if self.read == self.len {
            self.player.fill(&mut self.src[..BLOCK]);
            self.read = 0;
            self.len = BLOCK;
        }
        let x = self.src[self.read];
        self.read += 1;
        x
    }

    /// Writes interleaved frames of the device with `put(sample, slot)`.
    fn render(&mut self, frames: usize, mut put: impl FnMut(usize, f32)) {
        if self.step == 1.0 {
            let mut done = 0;
            while done < frames {
                let n = (frames - done).min(self.src.len());
                self.player.fill(&mut self.src[..n]);
                for i in 0..n {
                    for c in 0..self.channels {
                        put((done + i) * self.channels + c, self.src[i]);
                    }
                }
                done += n;
            }
            return;
        }
        for i in 0..frames {
            let y = self.cur + (self.next - self.cur) * self.frac as f32;
            for c in 0..self.channels {
                put(i * self.channels + c, y);
            }
            self.frac += self.step;
            while self.frac >= 1.0 {
                self.frac -= 1.0;
                self.cur = self.next;
                self.next = self.source();
            }
        }
    }
}

impl CpalOutput {
    /// Opens the default output device and starts playing `player`. A machine without a usable
    /// device gets [`AudioError::NoDevice`], with the audio system's reason.
    pub fn open(player: Player) -> Result<Self, AudioError> {
        // alsa-lib prints its errors to stderr unless a handler takes them: keep them for the
        // error message instead (thread-local; cpal opens the device on this thread).
        #[cfg(target_os = "linux")]
        let alsa_log = alsa::Output::local_error_handler().ok();
        #[cfg(not(target_os = "linux"))]
        let alsa_log: Option<()> = None;
        let last_alsa_line = || {
            #[cfg(target_os = "linux")]
            {
                alsa_log
                    .as_ref()
                    .map(|o| o.borrow().to_string())
                    .and_then(|s| s.lines().last().map(str::to_owned))
            }
            #[cfg(not(target_os = "linux"))]
            {
                let _ = &alsa_log;
                None::<String>
            }
        };
        let result = Self::open_default(player);
        match result {
            Err(AudioError::NoDevice { reason }) => Err(AudioError::NoDevice {
                reason: match last_alsa_line() {
                    Some(l) => format!("{} (ALSA: {})", reason.trim_end_matches('.'), l.trim()),
                    None => reason.trim_end_matches('.').to_owned(),
                },
            }),
            r => r,
        }
    }

    fn open_default(player: Player) -> Result<Self, AudioError> {
        let host = cpal::default_host();
        let device = host
            .default_output_device()
            .ok_or_else(|| AudioError::NoDevice {
                reason: "the audio host has no default output device".into(),
            })?;
        let no_device = |e: &dyn std::fmt::Display| AudioError::NoDevice {
            reason: e.to_string(),
        };
        // Prefer a native 24 kHz configuration, mono first, then f32; else the default one.
        let mut best: Option<cpal::SupportedStreamConfig> = None;
        if let Ok(configs) = device.supported_output_configs() {
            let mut ranked: Vec<_> = configs
                .filter(|c| {
                    matches!(
                        c.sample_format(),
                        cpal::SampleFormat::F32 | cpal::SampleFormat::I16
                    ) && c.min_sample_rate() <= SAMPLE_RATE
                        && SAMPLE_RATE <= c.max_sample_rate()
                })
                .collect();
            ranked.sort_by_key(|c| (c.channels(), c.sample_format() != cpal::SampleFormat::F32));
            best = ranked
                .into_iter()
                .next()
                .map(|c| c.with_sample_rate(SAMPLE_RATE));
        }
        let supported = match best {
            Some(c) => c,
            None => device.default_output_config().map_err(|e| no_device(&e))?,
        };
        let format = supported.sample_format();
        let config: cpal::StreamConfig = supported.into();
        let description = format!(
            "{} ({} Hz, {} ch, {format:?})",
            device
                .description()
                .map(|d| d.to_string())
                .unwrap_or_else(|_| "default device".into()),
            config.sample_rate,
            config.channels
        );
        let shared = player.shared();
        let mut adapter = Adapter {
            player,
            src: vec![0.0; BLOCK.max(4096)].into_boxed_slice(),
            read: 0,
            len: 0,
            step: SAMPLE_RATE as f64 / config.sample_rate as f64,
            frac: 0.0,
            cur: 0.0,
            next: 0.0,
            channels: config.channels.max(1) as usize,
        };
        let on_error = |_e: cpal::Error| {};
        let stream = match format {
            cpal::SampleFormat::F32 => device.build_output_stream(
                config,
                move |data: &mut [f32], _: &cpal::OutputCallbackInfo| {
                    let frames = data.len() / adapter.channels;
                    adapter.render(frames, |i, x| data[i] = x);
                },
                on_error,
                None,
            ),
            cpal::SampleFormat::I16 => device.build_output_stream(
                config,
                move |data: &mut [i16], _: &cpal::OutputCallbackInfo| {
                    let frames = data.len() / adapter.channels;
                    adapter.render(frames, |i, x| {
                        data[i] = (x.clamp(-1.0, 1.0) * 32767.0) as i16
                    });
                },
                on_error,
                None,
            ),
            other => {
                return Err(AudioError::Format {
                    found: format!("{other:?}"),
                })
            }
        }
        .map_err(|e| no_device(&e))?;
        stream
            .play()
            .map_err(|e| AudioError::Stream(e.to_string()))?;
        Ok(CpalOutput {
            _stream: stream,
            shared,
            description,
        })
    }

    /// The counters shared with the player.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }
}
