//! Audio output: where decoded samples go.
//!
//! The decoder thread writes each decoded frame to an [`AudioSink`]. Three sinks ship:
//! - [`RingSink`], the producer half of a lock-free SPSC ring (`ringbuf`) whose consumer half, a
//!   [`Player`], is driven by an audio device: the cpal output callback ([`cpal_out`]) or the
//!   real-time-paced test device ([`PacedDevice`]);
//! - [`WavSink`], a WAV file (`hound`), f32 or 16-bit;
//! - [`ChannelSink`], a bounded channel of sample chunks (the library's iterator API).
//!
//! Contract of the ring:
//! - [`ring`] sizes it in milliseconds; [`RingSink::write`] blocks while it is full (backpressure
//!   reaches the decoder, the code predictor and the talker in turn), polling the request's cancel
//!   flag every 2 ms.
//! - [`Player::fill`] runs on the device's thread: it only pops, writes silence where the ring is
//!   short, and updates atomics. It never allocates, locks, logs or makes a system call (tested
//!   with `assert_no_alloc`).
//! - Playback of an utterance starts once `prebuffer` samples are queued (or the utterance ended):
//!   a start-up buffer against the onset underrun. A period the ring cannot fill while the
//!   utterance is still being produced is an underrun: counted, and its period index recorded
//!   (the first [`UNDERRUN_LOG`]).
//! - Cancelling flushes the ring: the next device period is silent, and drops the cancelled audio
//!   only (a request started right after plays whole). The two halves share counters only
//!   ([`Shared`], `handoff`), checked under every interleaving by a loom model.

#[cfg(feature = "playback")]
pub mod cpal_out;
mod handoff;

pub use handoff::{Shared, UNDERRUN_LOG};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringbuf::traits::{Consumer, Observer, Producer, Split};
use ringbuf::{HeapCons, HeapProd, HeapRb};

/// Output sample rate of every Qwen3-TTS-12Hz model.
pub const SAMPLE_RATE: u32 = 24_000;
/// Samples per 80 ms frame.
pub const FRAME_SAMPLES: usize = 1920;

/// Milliseconds of `samples` at 24 kHz.
pub fn samples_to_ms(samples: usize) -> f64 {
    samples as f64 * 1000.0 / SAMPLE_RATE as f64
}

/// Samples in `ms` milliseconds at 24 kHz.
pub fn ms_to_samples(ms: f64) -> usize {
    (ms * SAMPLE_RATE as f64 / 1000.0).round() as usize
}

/// A failure of an audio output.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AudioError {
    /// There is no usable output device.
    /// Write to a file instead (`--out file.wav`), or check the sound setup (`aplay -l`).
    #[error("no audio output device: {reason}. Write a file instead: --out file.wav")]
    NoDevice {
        /// What the audio system said.
        reason: String,
    },
    /// The device takes no sample format this engine writes (f32, i16).
    /// Pick another device, or write to a file (`--out file.wav`).
    #[error("audio device: expected an f32 or i16 output format, found {found}")]
    Format {
        /// The device's formats.
        found: String,
    },
    /// The output stream failed after it started.
    /// Check the device; the request can be retried.
    #[error("audio stream: {0}")]
    Stream(String),
    /// Writing the file failed.
    /// Check the path, permissions and free space.
    #[error("audio file: {0}")]
    File(#[from] hound::Error),
    /// Writing a stream (standard output, a pipe) failed: the reader went away, or the disk.
    /// Keep the reader (`| aplay`) open until the audio ends, or write a file.
    #[error("audio output: {0}")]
    Output(#[source] std::io::Error),
    /// The consumer of a channel sink went away.
    /// Keep the stream's receiver until the request ends.
    #[error("the audio receiver was dropped")]
    Disconnected,
    /// The request was cancelled while writing.
    #[error("cancelled")]
    Cancelled,
}

/// Where the decoder thread puts audio: 24 kHz mono f32 samples, one utterance at a time.
pub trait AudioSink: Send + std::any::Any {
    /// An utterance starts.
    fn begin(&mut self) -> Result<(), AudioError> {
        Ok(())
    }

    /// Writes samples; may block while the output is full, but must return within a few
    /// milliseconds once `cancel` is set (with [`AudioError::Cancelled`] or `Ok`).
    fn write(&mut self, pcm: &[f32], cancel: &AtomicBool) -> Result<(), AudioError>;

    /// The utterance is over: play out what is queued (blocking until then, or until `cancel`),
    /// or, when `cancel` is set, drop it.
    fn end(&mut self, cancel: &AtomicBool) -> Result<(), AudioError> {
        let _ = cancel;
        Ok(())
    }

    /// Milliseconds of audio queued and not yet played, for sinks that queue.
    fn queued_ms(&self) -> Option<f64> {
        None
    }

    /// Whether a write now would wait for the consumer (a bounded queue that is full). An engine
    /// running several streams holds such a stream's samples, and its frames, until the queue
    /// has room, instead of waiting with every stream.
    fn is_full(&self) -> bool {
        false
    }
}

/// Makes a ring of `capacity_ms` and its two halves; playback of each utterance waits for
/// `prebuffer_ms` (at most the capacity).
pub fn ring(capacity_ms: f64, prebuffer_ms: f64) -> (RingSink, Player) {
    let capacity = ms_to_samples(capacity_ms).max(FRAME_SAMPLES);
    let prebuffer = ms_to_samples(prebuffer_ms).min(capacity);
    let (prod, cons) = HeapRb::<f32>::new(capacity).split();
    let shared = Arc::new(Shared::new(prebuffer));
    (
        RingSink {
            prod,
            shared: shared.clone(),
            capacity,
        },
        Player {
            cons,
            shared,
            playing: false,
        },
    )
}

/// The decoder's half of the ring.
pub struct RingSink {
    prod: HeapProd<f32>,
    shared: Arc<Shared>,
    capacity: usize,
}

impl std::fmt::Debug for RingSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingSink")
            .field("capacity", &self.capacity)
            .field("queued", &self.prod.occupied_len())
            .finish()
    }
}

impl std::fmt::Debug for Player {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Player")
            .field("queued", &self.cons.occupied_len())
            .finish()
    }
}

impl RingSink {
    /// The state shared with the player (counters).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// The ring's capacity in samples.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

const POLL: Duration = Duration::from_millis(2);

impl RingSink {
    /// Marks the utterance's end without waiting for it to play out: what is queued plays on.
    /// (An engine running several streams must not wait in one stream's [`AudioSink::end`]; a
    /// caller that needs the playout waits on [`Player::shared`]'s `is_idle`.)
    pub fn end_unwaited(&mut self) {
        self.shared.end();
    }
}

impl AudioSink for RingSink {
    fn begin(&mut self) -> Result<(), AudioError> {
        // A tail of the previous utterance still playing keeps playing; else wait to prebuffer.
        self.shared.begin();
        Ok(())
    }

    fn write(&mut self, mut pcm: &[f32], cancel: &AtomicBool) -> Result<(), AudioError> {
        loop {
            let n = self.prod.push_slice(pcm);
            self.shared.pushed(n);
            pcm = &pcm[n..];
            if pcm.is_empty() {
                return Ok(());
            }
            if cancel.load(Ordering::Acquire) {
                return Err(AudioError::Cancelled);
            }
            std::thread::sleep(POLL);
        }
    }

    fn end(&mut self, cancel: &AtomicBool) -> Result<(), AudioError> {
        self.shared.end();
        loop {
            if cancel.load(Ordering::Acquire) {
                self.shared.cancel();
                return Ok(());
            }
            if self.shared.is_idle() {
                return Ok(());
            }
            std::thread::sleep(POLL);
        }
    }

    fn queued_ms(&self) -> Option<f64> {
        Some(samples_to_ms(self.prod.occupied_len()))
    }
}

/// The device's half of the ring: called once per device period.
pub struct Player {
    cons: HeapCons<f32>,
    shared: Arc<Shared>,
    /// Whether an utterance is playing (else idle, or waiting for its prebuffer).
    playing: bool,
}

impl Player {
    /// The state shared with the sink (counters).
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Fills one device period of mono samples: queued audio, silence where there is none.
    /// Allocation-, lock- and syscall-free.
    pub fn fill(&mut self, out: &mut [f32]) {
        self.shared
            .fill(&mut Queue(&mut self.cons), &mut self.playing, out);
    }
}

/// The ring's consumer half as the player's [`handoff::Source`].
struct Queue<'a>(&'a mut HeapCons<f32>);

impl handoff::Source for Queue<'_> {
    fn queued(&self) -> usize {
        self.0.occupied_len()
    }

    fn pop(&mut self, out: &mut [f32]) -> usize {
        self.0.pop_slice(out)
    }

    fn drop_queued(&mut self, n: usize) -> usize {
        self.0.skip(n)
    }
}

/// A device that plays a [`Player`] in real time on its own thread (`qtts-paced`), one period
/// every `period` samples' worth of wall time, recording what it played. For tests and benches
/// on machines without a sound card.
#[derive(Debug)]
pub struct PacedDevice {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<f32>>>,
    shared: Arc<Shared>,
}

impl PacedDevice {
    /// Starts playing `player` in periods of `period` samples; `record` keeps the samples played.
    pub fn start(mut player: Player, period: usize, record: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let shared = player.shared();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("qtts-paced".into())
            .spawn(move || {
                let mut buf = vec![0.0; period.max(1)];
                let mut recorded = Vec::new();
                let step = Duration::from_secs_f64(buf.len() as f64 / SAMPLE_RATE as f64);
                let mut next = Instant::now();
                while !flag.load(Ordering::Acquire) {
                    player.fill(&mut buf);
                    if record {
                        recorded.extend_from_slice(&buf);
                    }
                    next += step;
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                }
                recorded
            })
            .ok();
        PacedDevice {
            stop,
            thread,
            shared,
        }
    }

    /// The shared counters.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Stops the device and returns what it played (empty unless recording).
    pub fn stop(mut self) -> Vec<f32> {
        self.stop.store(true, Ordering::Release);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for PacedDevice {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sample format of a [`WavSink`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum SampleFormat {
    /// 32-bit float (exact).
    #[default]
    F32,
    /// 16-bit PCM (clamped, rounded).
    S16,
}

/// A WAV file, 24 kHz mono; every utterance is appended. Call [`WavSink::finish`] at the end.
pub struct WavSink {
    writer: Option<hound::WavWriter<std::io::BufWriter<std::fs::File>>>,
    format: SampleFormat,
    samples: u64,
}

impl std::fmt::Debug for WavSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WavSink")
            .field("format", &self.format)
            .field("samples", &self.samples)
            .finish()
    }
}

impl WavSink {
    /// Creates (truncates) `path`.
    pub fn create(
        path: impl AsRef<std::path::Path>,
        format: SampleFormat,
    ) -> Result<Self, AudioError> {
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: SAMPLE_RATE,
            bits_per_sample: match format {
                SampleFormat::F32 => 32,
                SampleFormat::S16 => 16,
            },
            sample_format: match format {
                SampleFormat::F32 => hound::SampleFormat::Float,
                SampleFormat::S16 => hound::SampleFormat::Int,
            },
        };
        Ok(WavSink {
            writer: Some(hound::WavWriter::create(path, spec)?),
            format,
            samples: 0,
        })
    }

    /// Samples written.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Writes the header's lengths and closes the file.
    pub fn finish(mut self) -> Result<(), AudioError> {
        match self.writer.take() {
            Some(w) => Ok(w.finalize()?),
            None => Ok(()),
        }
    }
}

impl AudioSink for WavSink {
    fn write(&mut self, pcm: &[f32], _cancel: &AtomicBool) -> Result<(), AudioError> {
        let Some(w) = self.writer.as_mut() else {
            return Err(AudioError::Disconnected);
        };
        for &x in pcm {
            match self.format {
                SampleFormat::F32 => w.write_sample(x)?,
                SampleFormat::S16 => w.write_sample(to_s16(x))?,
            }
        }
        self.samples += pcm.len() as u64;
        Ok(())
    }
}

/// One sample as a file's s16: clamped to ±1, scaled by 32767, rounded (WAV and stream sinks).
fn to_s16(x: f32) -> i16 {
    (x.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

/// What a [`StreamSink`] writes before its samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamHeader {
    /// A WAV header whose lengths say "unknown" (0xFFFFFFFF, as sox and ffmpeg write to a pipe):
    /// players read to the end of the stream.
    Wav,
    /// None: raw little-endian samples, 24 kHz mono (`aplay -f FLOAT_LE -r 24000`,
    /// `ffplay -f f32le -ar 24000 -ac 1`).
    Raw,
}

/// Audio written as it is made to a stream that cannot seek (standard output, a pipe): every
/// chunk is written and flushed at once, so that a player reading the pipe plays it live.
pub struct StreamSink {
    out: std::io::BufWriter<Box<dyn std::io::Write + Send>>,
    format: SampleFormat,
    header: Option<StreamHeader>,
    samples: u64,
}

impl std::fmt::Debug for StreamSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamSink")
            .field("format", &self.format)
            .field("header", &self.header)
            .field("samples", &self.samples)
            .finish()
    }
}

impl StreamSink {
    /// A sink writing `format` samples to `out` after `header` (written with the first samples,
    /// or by [`StreamSink::finish`] when there are none).
    pub fn new(
        out: Box<dyn std::io::Write + Send>,
        format: SampleFormat,
        header: StreamHeader,
    ) -> Self {
        StreamSink {
            out: std::io::BufWriter::new(out),
            format,
            header: Some(header),
            samples: 0,
        }
    }

    /// Samples written.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Writes the header if no sample came, and flushes.
    pub fn finish(mut self) -> Result<(), AudioError> {
        self.write_header()?;
        std::io::Write::flush(&mut self.out).map_err(AudioError::Output)
    }

    fn write_header(&mut self) -> Result<(), AudioError> {
        use std::io::Write;
        if self.header.take() != Some(StreamHeader::Wav) {
            return Ok(());
        }
        let (tag, bits): (u16, u16) = match self.format {
            SampleFormat::F32 => (3, 32), // WAVE_FORMAT_IEEE_FLOAT
            SampleFormat::S16 => (1, 16), // WAVE_FORMAT_PCM
        };
        let block = bits / 8;
        let mut h = Vec::with_capacity(44);
        h.extend_from_slice(b"RIFF");
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        h.extend_from_slice(b"WAVEfmt ");
        h.extend_from_slice(&16u32.to_le_bytes());
        h.extend_from_slice(&tag.to_le_bytes());
        h.extend_from_slice(&1u16.to_le_bytes());
        h.extend_from_slice(&SAMPLE_RATE.to_le_bytes());
        h.extend_from_slice(&(SAMPLE_RATE * u32::from(block)).to_le_bytes());
        h.extend_from_slice(&block.to_le_bytes());
        h.extend_from_slice(&bits.to_le_bytes());
        h.extend_from_slice(b"data");
        h.extend_from_slice(&u32::MAX.to_le_bytes());
        self.out.write_all(&h).map_err(AudioError::Output)
    }
}

impl AudioSink for StreamSink {
    fn write(&mut self, pcm: &[f32], _cancel: &AtomicBool) -> Result<(), AudioError> {
        use std::io::Write;
        self.write_header()?;
        for &x in pcm {
            let r = match self.format {
                SampleFormat::F32 => self.out.write_all(&x.to_le_bytes()),
                SampleFormat::S16 => self.out.write_all(&to_s16(x).to_le_bytes()),
            };
            r.map_err(AudioError::Output)?;
        }
        self.out.flush().map_err(AudioError::Output)?;
        self.samples += pcm.len() as u64;
        Ok(())
    }
}

/// Sends each decoded chunk over a bounded channel (capacity in chunks, one chunk per decoder
/// call); blocks while it is full.
#[derive(Debug)]
pub struct ChannelSink {
    tx: crossbeam_channel::Sender<Vec<f32>>,
}

impl ChannelSink {
    /// A sink and the receiver of its chunks; `capacity` chunks may wait.
    pub fn new(capacity: usize) -> (Self, crossbeam_channel::Receiver<Vec<f32>>) {
        let (tx, rx) = crossbeam_channel::bounded(capacity.max(1));
        (ChannelSink { tx }, rx)
    }
}

impl AudioSink for ChannelSink {
    fn is_full(&self) -> bool {
        self.tx.is_full()
    }

    fn write(&mut self, pcm: &[f32], cancel: &AtomicBool) -> Result<(), AudioError> {
        let mut chunk = pcm.to_vec();
        loop {
            match self.tx.send_timeout(chunk, POLL) {
                Ok(()) => return Ok(()),
                Err(crossbeam_channel::SendTimeoutError::Timeout(c)) => {
                    if cancel.load(Ordering::Acquire) {
                        return Err(AudioError::Cancelled);
                    }
                    chunk = c;
                }
                Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => {
                    return Err(AudioError::Disconnected)
                }
            }
        }
    }
}

/// A sink that keeps everything in memory (tests, `--codes-out` runs).
#[derive(Debug, Default)]
pub struct MemorySink {
    /// The samples written.
    pub samples: Vec<f32>,
}

impl AudioSink for MemorySink {
    fn write(&mut self, pcm: &[f32], _cancel: &AtomicBool) -> Result<(), AudioError> {
        self.samples.extend_from_slice(pcm);
        Ok(())
    }
}
