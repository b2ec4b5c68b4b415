//! Priming a stream with frames decoded before it (a cloned voice's reference), and snapshots of
//! a stream's state.

use super::{Decoder, DecoderError, Geometry, CODEBOOKS, K7};
use crate::error::GgmlError;
use crate::ffi::Threadpool;

/// A snapshot of a decoder stream's state ([`Decoder::state`]): about 2.5 MB at the released
/// geometry, most of it the transformer's 72-frame cache.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderState {
    pos: usize,
    tensors: Vec<Vec<f32>>,
}

impl DecoderState {
    /// Frames decoded before the snapshot.
    pub fn frames(&self) -> usize {
        self.pos
    }
}

impl Geometry {
    /// How many frames before a sample the decoder's conv stack (everything after the
    /// transformer) looks back to, at most: the first sample after frame `T` depends on the
    /// transformer's outputs of frames `T − prime_frames()` on and no earlier (10 at the released
    /// geometry). Walks the stack back from that sample, stage by stage, to the first input row
    /// it reads.
    pub fn prime_frames(&self) -> usize {
        let k = K7 as i64 - 1;
        // Row 0 is the first sample after the primed frames; rows before it are negative.
        let mut row = -k; // the post-conv's history
        for &r in self.upsample_rates.iter().rev() {
            // The residual units' dilated convs.
            row -= k * (1 + 3 + 9);
            // The transposed conv (kernel 2r, stride r): output row o reads input rows ⌊o/r⌋
            // and the one before.
            row = row.div_euclid(r as i64) - 1;
        }
        row -= k; // the first conv
        for &r in self.upsampling_ratios.iter().rev() {
            row -= k; // the ConvNeXt's depthwise conv
            row = row.div_euclid(r as i64); // the transposed conv, kernel = stride
        }
        row.unsigned_abs() as usize
    }
}

impl Decoder {
    /// Primes the stream with `codes` decoded before it (a cloned voice's reference): the state
    /// becomes the one after decoding them, their samples are dropped, and the frame counter
    /// goes on from them, so the next frames decode as the tail of `reference ++ frames` does
    /// (the reference's `decode(ref_code ++ codes)` then the cut).
    ///
    /// Exact and cheap: every frame goes through the transformer (whose cache reaches back
    /// `window − 1` frames), but only the last [`Geometry::prime_frames`] go on through the conv
    /// stack, whose state depends on no earlier frame. That is about a tenth of decoding a 10 s
    /// reference. Snapshot the result ([`Decoder::state`]) to prime again for free.
    pub fn prime(
        &mut self,
        pool: &Threadpool,
        codes: &[[u32; CODEBOOKS]],
    ) -> Result<(), DecoderError> {
        self.prime_with_tail(pool, codes, self.geometry.prime_frames())
    }

    /// [`Decoder::prime`] with the last `tail` frames through the conv stack (the tests' way to
    /// show that fewer than [`Geometry::prime_frames`] is not exact).
    #[doc(hidden)]
    pub fn prime_with_tail(
        &mut self,
        pool: &Threadpool,
        codes: &[[u32; CODEBOOKS]],
        tail: usize,
    ) -> Result<(), DecoderError> {
        self.check_codes(codes)?;
        let (head, rest) = codes.split_at(codes.len().saturating_sub(tail));
        for chunk in head.chunks(self.max_chunk()) {
            self.run_chunk(pool, chunk, None)?;
        }
        let spf = self.geometry.samples_per_frame;
        let mut scratch = vec![0.0f32; self.max_chunk().min(rest.len().max(1)) * spf];
        for chunk in rest.chunks(self.max_chunk()) {
            let non_finite = self.non_finite;
            self.decode_frames(pool, chunk, &mut scratch[..chunk.len() * spf])?;
            // The dropped samples are not the stream's.
            self.non_finite = non_finite;
        }
        Ok(())
    }

    /// A copy of the stream's state (every conv's history, the transformer's cache and the
    /// frame counter), for [`Decoder::restore`].
    pub fn state(&self) -> Result<DecoderState, GgmlError> {
        let mut tensors = Vec::with_capacity(self.state_names.len());
        for name in &self.state_names {
            let t = self.state.get(name).ok_or_else(|| GgmlError::Shape {
                what: "decoder state tensor",
                expected: name.clone(),
                found: "none".into(),
            })?;
            let mut v = vec![0.0; t.n_elems()];
            t.read_f32(&mut v)?;
            tensors.push(v);
        }
        Ok(DecoderState {
            pos: self.pos,
            tensors,
        })
    }

    /// Makes the stream's state `s` (taken by [`Decoder::state`] from a decoder of the same
    /// file), as if the frames before it had just been decoded.
    pub fn restore(&mut self, s: &DecoderState) -> Result<(), GgmlError> {
        if s.tensors.len() != self.state_names.len() {
            return Err(GgmlError::Shape {
                what: "decoder state",
                expected: format!("{} tensors", self.state_names.len()),
                found: format!("{} tensors", s.tensors.len()),
            });
        }
        for (name, v) in self.state_names.iter().zip(&s.tensors) {
            if let Some(t) = self.state.get(name) {
                t.write_f32(v)?;
            }
        }
        self.pos = s.pos;
        self.non_finite = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the released rates the conv stack looks back 9.4 frames (`voice-clone.md` §4.5, summed
    /// stage by stage), so priming needs the last 10.
    #[test]
    fn the_released_conv_stack_looks_back_ten_frames() {
        let g = Geometry {
            codebook_size: 2048,
            half: 256,
            codebook_dim: 512,
            latent: 1024,
            hidden: 512,
            ff: 1024,
            n_layer: 8,
            n_head: 16,
            n_head_kv: 16,
            head_dim: 64,
            eps: 1e-5,
            theta: 1e4,
            window: 72,
            decoder_dim: 1536,
            upsampling_ratios: vec![2, 2],
            upsample_rates: vec![8, 5, 4, 3],
            samples_per_frame: 1920,
        };
        assert_eq!(g.prime_frames(), 10);
    }
}
