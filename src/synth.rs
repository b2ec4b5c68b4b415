//! One utterance's codes on the calling thread: the talker and the code predictor alternating,
//! frame by frame (MODEL-NOTES.md §4.4).
//!
//! Contract: [`generate_codes`] runs the whole loop serially and hands each frame's 16 codes to the
//! caller as soon as they exist; the caller may stop it after any frame. It is the reference the
//! threaded pipeline is tested against and the serial baseline it is benchmarked against.
//! Seeds: codebook 0 draws from `GenOptions::seed`, codebooks 1..15 from [`code_predictor_seed`] of it, each
//! stream on its own generator, so a seed gives the same codes however the stages are threaded.

use crate::code_predictor::CodePredictor;
use crate::ffi::Threadpool;
use crate::sampling::{Sampler, SamplingParams};
use crate::talker::{GenOptions, Next, Prompt, Session, StopReason, TalkerError};

/// Whether generation goes on after a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Produce the next frame.
    Continue,
    /// Stop now (reported as [`StopReason::Cancelled`]).
    Stop,
}

/// The seed of the code predictor's sampler for an utterance seeded with `seed`.
pub fn code_predictor_seed(seed: u64) -> u64 {
    seed ^ 0x9E37_79B9_7F4A_7C15
}

/// Generates one utterance: `on_frame` gets each frame's codes `[c0, .., c15]` in order.
/// Returns why it stopped.
pub fn generate_codes(
    session: &mut Session<'_>,
    cp: &mut CodePredictor,
    pool: &Threadpool,
    prompt: &Prompt,
    opts: &GenOptions,
    code_predictor_sampling: &SamplingParams,
    on_frame: &mut dyn FnMut(&[u32; 16]) -> Flow,
) -> Result<StopReason, TalkerError> {
    let mut sampler = Sampler::new(code_predictor_seed(opts.seed));
    let mut embedded = vec![0.0; session.talker().n_embd()];
    let mut next = session.start(prompt, opts)?;
    loop {
        let code0 = match next {
            Next::Code(c) => c,
            Next::Stop(reason) => return Ok(reason),
        };
        let rest = cp.frame(
            pool,
            session.hidden(),
            code0,
            &mut |_, logits| sampler.sample(logits, code_predictor_sampling),
            None,
        )?;
        let mut codes = [0u32; 16];
        codes[0] = code0;
        codes[1..].copy_from_slice(&rest);
        if on_frame(&codes) == Flow::Stop {
            return Ok(session.cancel());
        }
        cp.embed_frame(&codes, &mut embedded)?;
        next = session.feed(&embedded)?;
    }
}
