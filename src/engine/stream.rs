//! A request's audio as an iterator of chunks.

use crossbeam_channel::Receiver;

use super::error::EngineError;
use super::synthesis::decoder_gone;
use super::synthesis::Canceller;
use super::synthesis::Request;
use super::synthesis::Summary;
use super::synthesis::Synthesis;
use super::Engine;

/// A request's audio as an iterator of chunks (one per decoder call: 80, 80, 160, then
/// `decoder_chunk × 80` ms of 24 kHz mono samples), from [`Engine::stream`].
#[derive(Debug)]
pub struct AudioStream<'e> {
    synthesis: Synthesis<'e>,
    rx: Receiver<Vec<f32>>,
    finished: Option<Result<Summary, EngineError>>,
}

impl AudioStream<'_> {
    /// A handle that cancels the request.
    pub fn canceller(&self) -> Canceller {
        self.synthesis.canceller()
    }

    /// Frames generated so far.
    pub fn frames(&self) -> usize {
        self.synthesis.frames()
    }

    /// The request's summary: waits for its end, dropping audio not yet taken.
    pub fn finish(mut self) -> Result<Summary, EngineError> {
        if let Some(r) = self.finished.take() {
            return r;
        }
        let (synthesis, rx) = (self.synthesis, self.rx);
        // Keep taking chunks so that the decoder never blocks on a full channel.
        loop {
            crossbeam_channel::select! {
                recv(rx) -> _ => {}
                recv(synthesis.done) -> d => {
                    return d.unwrap_or_else(|_| decoder_gone()).0;
                }
            }
        }
    }
}

impl Iterator for AudioStream<'_> {
    type Item = Vec<f32>;

    fn next(&mut self) -> Option<Vec<f32>> {
        if self.finished.is_some() {
            return self.rx.try_recv().ok();
        }
        crossbeam_channel::select! {
            recv(self.rx) -> chunk => chunk.ok(),
            recv(self.synthesis.done) -> d => {
                self.finished = Some(d.unwrap_or_else(|_| decoder_gone()).0);
                // Every chunk was sent before the end: what is left is in the channel.
                self.rx.try_recv().ok()
            }
        }
    }
}

impl Engine {
    /// Starts a request whose audio comes out of the returned iterator, chunk by chunk, as the
    /// decoder makes it; up to `queue` chunks wait before the engine blocks (backpressure).
    pub fn stream(&mut self, req: Request, queue: usize) -> AudioStream<'_> {
        let (sink, rx) = crate::audio::ChannelSink::new(queue);
        AudioStream {
            synthesis: self.synthesize(req, Box::new(sink)),
            rx,
            finished: None,
        }
    }
}
