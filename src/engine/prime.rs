//! Starting a decoder stream for an utterance: cold, or primed with a cloned voice's reference.

use std::sync::Arc;

use crate::decoder::{Decoder, DecoderState};
use crate::ffi::Threadpool;
use crate::talker::IclReference;

use super::EngineError;

/// The decoder state after the last reference primed, kept so that the next utterance with the
/// same reference (a split text, the next request with a saved voice) restores it instead of
/// decoding the reference again. One entry: about 2.5 MB at the released geometry.
#[derive(Debug, Default)]
pub(super) struct PrimeCache(Option<(Arc<IclReference>, DecoderState)>);

impl PrimeCache {
    /// Resets `voc` for a new utterance; with a reference, leaves it as after decoding the
    /// reference's codes (the official output is `decode(ref ++ codes)` with the reference's
    /// samples cut), from the cache when the codes are the same.
    pub(super) fn start(
        &mut self,
        voc: &mut Decoder,
        pool: &Threadpool,
        reference: Option<&Arc<IclReference>>,
    ) -> Result<(), EngineError> {
        voc.reset()?;
        let Some(r) = reference else {
            return Ok(());
        };
        if let Some((cached, state)) = &self.0 {
            if Arc::ptr_eq(cached, r) || cached.codes == r.codes {
                voc.restore(state)?;
                return Ok(());
            }
        }
        voc.prime(pool, &r.codes)?;
        self.0 = Some((r.clone(), voc.state()?));
        Ok(())
    }
}
