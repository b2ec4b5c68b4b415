//! A WAV header's format chunk, checked before symphonia decodes the file: symphonia panics on
//! some impossible values (a rate of 0), and a reference upload must get an error, not a panic.

use super::audio_in::AudioInError;

/// Bytes of a file's start that [`check_wav_header`] looks at: 4 KiB.
pub const WAV_HEAD: usize = 4096;

/// Refuses a WAV whose format chunk (within the file's first [`WAV_HEAD`] bytes) has 0 channels,
/// a rate of 0, 0 bits or a block alignment of 0, before the decoder sees it (symphonia panics on
/// a rate of 0). Anything else, WAV or not, is left to the decoder.
pub fn check_wav_header(head: &[u8], what: &str) -> Result<(), AudioInError> {
    if head.len() < 12 || &head[0..4] != b"RIFF" || &head[8..12] != b"WAVE" {
        return Ok(());
    }
    let u16_at = |i: usize| u16::from_le_bytes([head[i], head[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let mut at = 12usize;
    while at + 8 <= head.len() {
        let size = u32_at(at + 4) as usize;
        if &head[at..at + 4] == b"fmt " {
            if size < 16 || at + 8 + 16 > head.len() {
                return Ok(());
            }
            let f = at + 8;
            let (channels, rate) = (u16_at(f + 2), u32_at(f + 4));
            let (align, bits) = (u16_at(f + 12), u16_at(f + 14));
            if rate == 0 {
                return Err(AudioInError::Rate {
                    what: what.into(),
                    found: 0,
                });
            }
            let bad = |field: &str| AudioInError::NotAudio {
                what: what.into(),
                reason: format!("the WAV format chunk says 0 {field}: the header is damaged"),
            };
            return match (channels, align, bits) {
                (0, _, _) => Err(bad("channels")),
                (_, 0, _) => Err(bad("bytes per block")),
                (_, _, 0) => Err(bad("bits per sample")),
                _ => Ok(()),
            };
        }
        at = at
            .saturating_add(8)
            .saturating_add(size)
            .saturating_add(size & 1);
    }
    Ok(())
}
