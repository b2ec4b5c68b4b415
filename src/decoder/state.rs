//! Priming a stream with frames decoded before it (a cloned voice's reference), and snapshots of
//! a stream's state.

use super::{Decoder, DecoderError, CODEBOOKS};
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

impl Decoder {
    /// Primes the stream with `codes` decoded before it (a cloned voice's reference): the state
    /// becomes the one after decoding them, their samples are dropped, and the frame counter
    /// goes on from them, so the next frames decode as the tail of `reference ++ frames` does
    /// (the reference's `decode(ref_code ++ codes)` then the cut). Decodes every given frame:
    /// snapshot the result ([`Decoder::state`]) to prime again for free.
    pub fn prime(
        &mut self,
        pool: &Threadpool,
        codes: &[[u32; CODEBOOKS]],
    ) -> Result<(), DecoderError> {
        let spf = self.geometry.samples_per_frame;
        let mut scratch = vec![0.0f32; self.max_chunk().min(codes.len().max(1)) * spf];
        for chunk in codes.chunks(self.max_chunk()) {
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
