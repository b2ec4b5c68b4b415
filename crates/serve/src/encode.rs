//! The engine's 24 kHz mono f32 audio as the bytes of one response format, chunk by chunk.
//!
//! Every encoder takes the audio as it is made and returns the bytes it can send at once, so a
//! response streams: [`Encoder::push`] per engine chunk, [`Encoder::finish`] at the end. The
//! samples are the same in every format; only the container and codec differ.
//!
//! | format | bytes |
//! |---|---|
//! | `pcm` | s16le, no header |
//! | `wav` | a 44-byte header whose sizes are 0xFFFFFFFF (streaming) or exact (buffered), then s16le |
//! | `mp3` | MPEG-2 Layer III 64 kbps CBR frames; no ID3 tag, no Xing/Info frame |
//! | `opus` | Ogg Opus: OpusHead and OpusTags pages, then 20 ms packets, one page per chunk |
//! | `flac` | one whole file at the end, streamed or not: STREAMINFO with its totals and MD5, then 1920-sample frames (a stream with unknown totals is refused by libsndfile's `read`, the usual Python reader) |

use flacenc::bitsink::MemSink;
use flacenc::component::BitRepr;
use flacenc::error::Verify;
use flacenc::source::MemSource;

/// The engine's sample rate.
pub const RATE: u32 = qtts::audio::SAMPLE_RATE;
/// Samples per FLAC block: one 80 ms frame.
const FLAC_BLOCK: usize = 1920;
/// Samples per Opus packet at 24 kHz: 20 ms.
const OPUS_FRAME: usize = 480;
/// The Ogg stream serial number (one logical stream per response).
const OGG_SERIAL: u32 = 0x7174_7473;

/// A response format (`response_format` of the OpenAI speech API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// s16le, 24 kHz, mono, no header.
    Pcm,
    /// RIFF WAVE, s16.
    Wav,
    /// MPEG-2 Layer III.
    Mp3,
    /// Ogg Opus.
    Opus,
    /// FLAC, 16 bits.
    Flac,
}

impl Format {
    /// The format named `s` (OpenAI's names); `None` for names this server does not make.
    pub fn parse(s: &str) -> Option<Format> {
        Some(match s {
            "pcm" => Format::Pcm,
            "wav" => Format::Wav,
            "mp3" => Format::Mp3,
            "opus" => Format::Opus,
            "flac" => Format::Flac,
            _ => return None,
        })
    }

    /// The name (as in requests and metric labels).
    pub fn name(self) -> &'static str {
        match self {
            Format::Pcm => "pcm",
            Format::Wav => "wav",
            Format::Mp3 => "mp3",
            Format::Opus => "opus",
            Format::Flac => "flac",
        }
    }

    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            // Not audio/L16: RFC 2586's L16 is big-endian.
            Format::Pcm => "audio/pcm",
            Format::Wav => "audio/wav",
            Format::Mp3 => "audio/mpeg",
            Format::Opus => "audio/ogg",
            Format::Flac => "audio/flac",
        }
    }
}

/// An encoder failed (only the codec libraries can).
#[derive(Debug, thiserror::Error)]
#[error("{format} encoder failed: {message}")]
pub struct EncodeError {
    /// Which format.
    pub format: &'static str,
    /// The codec's message.
    pub message: String,
}

fn err(format: &'static str, e: impl std::fmt::Display) -> EncodeError {
    EncodeError {
        format,
        message: e.to_string(),
    }
}

/// One sample as s16: clamped to ±1, scaled by 32767, rounded half to even (C's `lrintf`).
pub fn to_s16(x: f32) -> i16 {
    let x = if x.is_nan() { 0.0 } else { x.clamp(-1.0, 1.0) };
    (x * 32767.0).round_ties_even() as i16
}

/// Appends `samples` as s16le to `out`.
pub fn push_s16le(samples: &[f32], out: &mut Vec<u8>) {
    out.reserve(samples.len() * 2);
    for &x in samples {
        out.extend_from_slice(&to_s16(x).to_le_bytes());
    }
}

/// The 44-byte WAV header of 16-bit mono audio at [`RATE`]; `samples: None` writes 0xFFFFFFFF
/// for both sizes (a stream of unknown length: libsndfile and Python's `wave` read all of it,
/// whereas sizes of 0 read as empty).
pub fn wav_header(samples: Option<usize>) -> [u8; 44] {
    let (riff, data) = match samples {
        Some(n) => {
            let data = (n * 2).min(u32::MAX as usize - 36) as u32;
            (36 + data, data)
        }
        None => (u32::MAX, u32::MAX),
    };
    let mut h = [0u8; 44];
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&riff.to_le_bytes());
    h[8..12].copy_from_slice(b"WAVE");
    h[12..16].copy_from_slice(b"fmt ");
    h[16..20].copy_from_slice(&16u32.to_le_bytes());
    h[20..22].copy_from_slice(&1u16.to_le_bytes()); // PCM
    h[22..24].copy_from_slice(&1u16.to_le_bytes()); // mono
    h[24..28].copy_from_slice(&RATE.to_le_bytes());
    h[28..32].copy_from_slice(&(RATE * 2).to_le_bytes()); // bytes per second
    h[32..34].copy_from_slice(&2u16.to_le_bytes()); // block align
    h[34..36].copy_from_slice(&16u16.to_le_bytes()); // bits
    h[36..40].copy_from_slice(b"data");
    h[40..44].copy_from_slice(&data.to_le_bytes());
    h
}

/// Encodes one response's audio (see the module docs).
pub struct Encoder {
    inner: Inner,
}

enum Inner {
    Pcm,
    Wav {
        header_sent: bool,
    },
    /// Buffered WAV: everything at `finish`, with exact sizes.
    WavBuffered(Vec<f32>),
    Mp3(Box<rusty_mp3::Mp3Encoder>, bool),
    Opus(Box<OggOpus>),
    /// FLAC, always whole at `finish`: totals and MD5 in STREAMINFO.
    FlacBuffered(Vec<f32>),
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

impl Encoder {
    /// An encoder for `format`; `streaming: false` makes WAV, whose header states totals, write
    /// exact ones, at the cost of sending everything at [`Encoder::finish`]. FLAC is always sent
    /// whole, with its totals (see the module docs).
    pub fn new(format: Format, streaming: bool) -> Result<Encoder, EncodeError> {
        let inner = match (format, streaming) {
            (Format::Pcm, _) => Inner::Pcm,
            (Format::Wav, true) => Inner::Wav { header_sent: false },
            (Format::Wav, false) => Inner::WavBuffered(Vec::new()),
            (Format::Mp3, _) => Inner::Mp3(
                Box::new(rusty_mp3::Mp3Encoder::new(rusty_mp3::Mp3EncoderConfig {
                    bitrate_kbps: 64,
                    vbr_quality: None,
                })),
                false,
            ),
            (Format::Opus, _) => Inner::Opus(Box::new(OggOpus::new()?)),
            (Format::Flac, _) => Inner::FlacBuffered(Vec::new()),
        };
        Ok(Encoder { inner })
    }

    /// Encodes the next samples; returns the bytes ready to send (maybe none).
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        match &mut self.inner {
            Inner::Pcm => push_s16le(samples, &mut out),
            Inner::Wav { header_sent } => {
                if !*header_sent {
                    out.extend_from_slice(&wav_header(None));
                    *header_sent = true;
                }
                push_s16le(samples, &mut out);
            }
            Inner::WavBuffered(all) | Inner::FlacBuffered(all) => all.extend_from_slice(samples),
            Inner::Mp3(enc, tag_dropped) => {
                enc.push_pcm_f32(samples, 1, RATE)
                    .map_err(|e| err("mp3", format!("{e:?}")))?;
                drain_mp3(enc, tag_dropped, &mut out);
            }
            Inner::Opus(o) => o.push(samples, false, &mut out)?,
        }
        Ok(out)
    }

    /// Ends the stream: the bytes still held (codec tails, end pages, a buffered file).
    pub fn finish(&mut self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::new();
        match &mut self.inner {
            Inner::Pcm => {}
            Inner::Wav { header_sent } => {
                if !*header_sent {
                    out.extend_from_slice(&wav_header(None));
                    *header_sent = true;
                }
            }
            Inner::WavBuffered(all) => {
                out.extend_from_slice(&wav_header(Some(all.len())));
                push_s16le(all, &mut out);
                all.clear();
            }
            Inner::Mp3(enc, tag_dropped) => {
                if !*tag_dropped && enc.next_packet().is_err() {
                    // Nothing was pushed: a stream of silence frames the decoders accept.
                    enc.push_pcm_f32(&[], 1, RATE)
                        .map_err(|e| err("mp3", format!("{e:?}")))?;
                }
                enc.finish();
                drain_mp3(enc, tag_dropped, &mut out);
            }
            Inner::Opus(o) => o.push(&[], true, &mut out)?,
            Inner::FlacBuffered(all) => {
                out = flac_file(all)?;
                all.clear();
            }
        }
        Ok(out)
    }
}

/// Moves the encoder's finished frames to `out`, dropping its first packet: the LAME Info frame,
/// whose counts are only right once the stream has ended (a stray Info frame at the head of a
/// stream has broken hardware decoders).
fn drain_mp3(enc: &mut rusty_mp3::Mp3Encoder, tag_dropped: &mut bool, out: &mut Vec<u8>) {
    while let Ok(p) = enc.next_packet() {
        if !*tag_dropped {
            *tag_dropped = true;
            continue;
        }
        out.extend_from_slice(&p);
    }
}

/// Ogg Opus at 24 kHz (RFC 7845): one page per pushed chunk.
struct OggOpus {
    enc: opus::Encoder,
    ogg: ogg::PacketWriter<'static, Vec<u8>>,
    /// Samples not yet a whole packet.
    pending: Vec<i16>,
    /// The encoder's delay in 24 kHz samples.
    lookahead: usize,
    /// Input samples pushed.
    input: u64,
    /// Packets written.
    packets: u64,
    header_sent: bool,
}

impl OggOpus {
    fn new() -> Result<OggOpus, EncodeError> {
        let mut enc = opus::Encoder::new(RATE, opus::Channels::Mono, opus::Application::Audio)
            .map_err(|e| err("opus", e))?;
        enc.set_bitrate(opus::Bitrate::Bits(48_000))
            .map_err(|e| err("opus", e))?;
        let lookahead = enc.get_lookahead().map_err(|e| err("opus", e))?.max(0) as usize;
        Ok(OggOpus {
            enc,
            ogg: ogg::PacketWriter::new(Vec::new()),
            pending: Vec::new(),
            lookahead,
            input: 0,
            packets: 0,
            header_sent: false,
        })
    }

    /// Pre-skip in 48 kHz samples, as OpusHead states it.
    fn pre_skip(&self) -> u64 {
        self.lookahead as u64 * 2
    }

    fn push(&mut self, samples: &[f32], last: bool, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let io = |e: std::io::Error| err("opus", e);
        if !self.header_sent {
            let mut head = Vec::with_capacity(19);
            head.extend_from_slice(b"OpusHead");
            head.push(1); // version
            head.push(1); // channels
            head.extend_from_slice(&(self.pre_skip() as u16).to_le_bytes());
            head.extend_from_slice(&RATE.to_le_bytes()); // the input's rate
            head.extend_from_slice(&0i16.to_le_bytes()); // output gain
            head.push(0); // mapping family
            self.ogg
                .write_packet(head, OGG_SERIAL, ogg::PacketWriteEndInfo::EndPage, 0)
                .map_err(io)?;
            let vendor = concat!("qtts ", env!("CARGO_PKG_VERSION"));
            let mut tags = Vec::new();
            tags.extend_from_slice(b"OpusTags");
            tags.extend_from_slice(&(vendor.len() as u32).to_le_bytes());
            tags.extend_from_slice(vendor.as_bytes());
            tags.extend_from_slice(&0u32.to_le_bytes());
            self.ogg
                .write_packet(tags, OGG_SERIAL, ogg::PacketWriteEndInfo::EndPage, 0)
                .map_err(io)?;
            self.header_sent = true;
        }
        self.input += samples.len() as u64;
        self.pending.extend(samples.iter().map(|&x| to_s16(x)));
        if last {
            // Push the encoder's delay through, then pad to a whole packet.
            let total = self.pending.len() + self.lookahead;
            let padded = total.div_ceil(OPUS_FRAME).max(1) * OPUS_FRAME;
            self.pending.resize(padded, 0);
        }
        let whole = self.pending.len() / OPUS_FRAME;
        let mut packet = [0u8; 4000];
        for i in 0..whole {
            let frame = &self.pending[i * OPUS_FRAME..(i + 1) * OPUS_FRAME];
            let n = self
                .enc
                .encode(frame, &mut packet)
                .map_err(|e| err("opus", e))?;
            self.packets += 1;
            let end = i + 1 == whole;
            let (info, granule) = if last && end {
                // The end granule trims the padding: pre-skip plus the input, at 48 kHz.
                (
                    ogg::PacketWriteEndInfo::EndStream,
                    self.pre_skip() + self.input * 2,
                )
            } else if end {
                (
                    ogg::PacketWriteEndInfo::EndPage,
                    self.packets * OPUS_FRAME as u64 * 2,
                )
            } else {
                (
                    ogg::PacketWriteEndInfo::NormalPacket,
                    self.packets * OPUS_FRAME as u64 * 2,
                )
            };
            self.ogg
                .write_packet(packet[..n].to_vec(), OGG_SERIAL, info, granule)
                .map_err(io)?;
        }
        self.pending.drain(..whole * OPUS_FRAME);
        out.append(self.ogg.inner_mut());
        Ok(())
    }
}

/// A FLAC component's bytes.
fn flac_bytes(c: &impl BitRepr) -> Result<Vec<u8>, EncodeError> {
    let mut sink = MemSink::<u8>::with_capacity(c.count_bits());
    c.write(&mut sink)
        .map_err(|e| err("flac", format!("{e:?}")))?;
    Ok(sink.into_inner())
}

fn flac_config() -> Result<flacenc::error::Verified<flacenc::config::Encoder>, EncodeError> {
    let mut c = flacenc::config::Encoder::default();
    c.block_size = FLAC_BLOCK;
    c.into_verified()
        .map_err(|(_, e)| err("flac", format!("{e:?}")))
}

/// A whole FLAC file with exact totals and MD5.
fn flac_file(samples: &[f32]) -> Result<Vec<u8>, EncodeError> {
    let pcm: Vec<i32> = samples.iter().map(|&x| i32::from(to_s16(x))).collect();
    let source = MemSource::from_samples(&pcm, 1, 16, RATE as usize);
    let stream = flacenc::encode_with_fixed_block_size(&flac_config()?, source, FLAC_BLOCK)
        .map_err(|e| err("flac", format!("{e:?}")))?;
    flac_bytes(&stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| 0.5 * (i as f32 * 440.0 * std::f32::consts::TAU / RATE as f32).sin())
            .collect()
    }

    #[test]
    fn s16_rounds_and_clamps_like_lrintf() {
        assert_eq!(to_s16(1.0), 32767);
        assert_eq!(to_s16(2.0), 32767);
        assert_eq!(to_s16(-1.0), -32767);
        assert_eq!(to_s16(-7.0), -32767);
        assert_eq!(to_s16(f32::NAN), 0);
        // 0.5 / 32767 is exactly half a step: ties go to even (0), as lrintf does.
        assert_eq!(to_s16(0.5 / 32767.0), 0);
        assert_eq!(to_s16(1.5 / 32767.0), 2);
    }

    #[test]
    fn wav_header_bytes() {
        let h = wav_header(None);
        assert_eq!(&h[0..4], b"RIFF");
        assert_eq!(&h[4..8], &[0xff; 4]);
        assert_eq!(&h[40..44], &[0xff; 4]);
        assert_eq!(u32::from_le_bytes(h[24..28].try_into().unwrap()), 24_000);
        assert_eq!(u32::from_le_bytes(h[28..32].try_into().unwrap()), 48_000);
        let h = wav_header(Some(1920));
        assert_eq!(u32::from_le_bytes(h[4..8].try_into().unwrap()), 36 + 3840);
        assert_eq!(u32::from_le_bytes(h[40..44].try_into().unwrap()), 3840);
    }

    /// Streaming WAV is the header then exactly the PCM bytes; buffered has exact sizes.
    #[test]
    fn wav_is_header_plus_pcm() {
        let a = tone(3000);
        let mut pcm = Encoder::new(Format::Pcm, true).unwrap();
        let mut p = pcm.push(&a[..1000]).unwrap();
        p.extend(pcm.push(&a[1000..]).unwrap());
        p.extend(pcm.finish().unwrap());
        assert_eq!(p.len(), 6000);
        let mut wav = Encoder::new(Format::Wav, true).unwrap();
        let mut w = wav.push(&a).unwrap();
        w.extend(wav.finish().unwrap());
        assert_eq!(&w[44..], &p[..]);
        let mut buffered = Encoder::new(Format::Wav, false).unwrap();
        assert!(buffered.push(&a).unwrap().is_empty());
        let b = buffered.finish().unwrap();
        assert_eq!(&b[44..], &p[..]);
        assert_eq!(u32::from_le_bytes(b[40..44].try_into().unwrap()), 6000);
    }

    /// The MP3 stream has no tag up front and decodes (rusty_mp3's own decoder) to at least the
    /// input's length at 24 kHz; its frames start with a sync word.
    #[test]
    fn mp3_streams_frames_without_info_tag() {
        let a = tone(1920 * 5);
        let mut e = Encoder::new(Format::Mp3, true).unwrap();
        let mut bytes = Vec::new();
        for c in a.chunks(1920) {
            bytes.extend(e.push(c).unwrap());
        }
        bytes.extend(e.finish().unwrap());
        assert_eq!(bytes[0], 0xff);
        assert_eq!(bytes[1] & 0xe0, 0xe0);
        assert!(!bytes.starts_with(b"ID3"));
        assert!(!bytes.windows(4).any(|w| w == b"Xing" || w == b"Info"));
        let mut d = rusty_mp3::Mp3Decoder::new();
        d.push(&bytes);
        d.flush();
        let mut n = 0;
        while let Ok(f) = d.next_frame() {
            assert_eq!(f.sample_rate, 24_000);
            n += f.samples.len();
        }
        assert!(n >= a.len(), "{n} samples decoded from {} pushed", a.len());
    }

    /// Ogg pages: capture patterns and CRCs as the `ogg` crate's reader checks them; the first
    /// packet is OpusHead at 24 kHz; the last page ends the stream with a granule that trims the
    /// padding to the input's length.
    #[test]
    fn ogg_opus_pages_and_granules() {
        let a = tone(1920 * 3 + 100);
        let mut e = Encoder::new(Format::Opus, true).unwrap();
        let mut bytes = e.push(&a[..1920]).unwrap();
        assert!(
            bytes.starts_with(b"OggS"),
            "headers and the first page at once"
        );
        bytes.extend(e.push(&a[1920..]).unwrap());
        bytes.extend(e.finish().unwrap());
        let mut r = ogg::PacketReader::new(std::io::Cursor::new(bytes));
        let head = r.read_packet_expected().unwrap();
        assert_eq!(&head.data[..8], b"OpusHead");
        let pre_skip = u16::from_le_bytes([head.data[10], head.data[11]]) as u64;
        assert_eq!(
            u32::from_le_bytes(head.data[12..16].try_into().unwrap()),
            24_000
        );
        let tags = r.read_packet_expected().unwrap();
        assert_eq!(&tags.data[..8], b"OpusTags");
        let mut last = None;
        let mut packets = 0;
        while let Some(p) = r.read_packet().unwrap() {
            packets += 1;
            last = Some((p.absgp_page(), p.last_in_stream()));
        }
        let (granule, eos) = last.unwrap();
        assert!(eos);
        assert_eq!(granule, pre_skip + a.len() as u64 * 2);
        assert!(packets * 480 >= a.len() + pre_skip as usize / 2);
    }

    /// FLAC, streamed or not: one whole file at the end, STREAMINFO saying 24 kHz, 16 bits and
    /// the total, then one frame per 1920 samples.
    #[test]
    fn flac_is_whole_with_its_totals() {
        let a = tone(1920 * 2 + 100);
        for streaming in [true, false] {
            let mut e = Encoder::new(Format::Flac, streaming).unwrap();
            assert!(e.push(&a[..1920]).unwrap().is_empty());
            assert!(e.push(&a[1920..]).unwrap().is_empty());
            let bytes = e.finish().unwrap();
            assert_eq!(&bytes[..4], b"fLaC");
            let si = &bytes[8..8 + 34];
            assert_eq!(u16::from_be_bytes([si[2], si[3]]), 1920, "largest block");
            // 20 bits of rate, 3 of channels-1, 5 of bits-1, 36 of total samples.
            let packed = u64::from_be_bytes(si[10..18].try_into().unwrap());
            assert_eq!(packed >> 44, 24_000);
            assert_eq!((packed >> 41) & 7, 0);
            assert_eq!((packed >> 36) & 31, 15);
            assert_eq!(
                packed & ((1 << 36) - 1),
                a.len() as u64,
                "streaming {streaming}"
            );
        }
    }
}
