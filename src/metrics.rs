//! Latency histograms of the stages (hdrhistogram), their percentile table and their log file.
//!
//! Every stage records into its own [`Metrics`] on its own thread (no sharing, no lock); a
//! request's summary merges them. Values are microseconds, except `ring_fill` (milliseconds of
//! audio queued after each write), from 1 µs to 1 hour at 3 significant digits.

use std::io::Write;
use std::time::Duration;

use hdrhistogram::Histogram;

/// The histograms of one request, or of several merged.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// Talker prefill of each utterance (µs).
    pub talker_prefill: Histogram<u64>,
    /// Talker step per frame (µs).
    pub talker_step: Histogram<u64>,
    /// Talker waiting for the code predictor's frame (µs): the CP's time as the talker sees it.
    pub talker_wait: Histogram<u64>,
    /// Code predictor per frame: 15 sub-steps, sampling and the feedback embedding (µs).
    pub cp_frame: Histogram<u64>,
    /// Code predictor blocked on a full queue to the decoder (µs): backpressure.
    pub cp_send_wait: Histogram<u64>,
    /// Decoder per frame (a call's time over its frames, µs).
    pub decoder_frame: Histogram<u64>,
    /// Decoder waiting for codes (µs): starvation.
    pub decoder_wait: Histogram<u64>,
    /// Audio queued in the sink after each write (ms), for sinks that queue.
    pub ring_fill: Histogram<u64>,
}

fn hist() -> Histogram<u64> {
    // 1 µs .. 1 h, 3 digits: fixed bounds, so recording never allocates.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("constant bounds are valid")
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            talker_prefill: hist(),
            talker_step: hist(),
            talker_wait: hist(),
            cp_frame: hist(),
            cp_send_wait: hist(),
            decoder_frame: hist(),
            decoder_wait: hist(),
            ring_fill: hist(),
        }
    }
}

/// Records a duration in microseconds (saturating at the bounds).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).clamp(1, h.high());
    let _ = h.record(us);
}

impl Metrics {
    /// The histograms with their names, in table order.
    pub fn named(&self) -> [(&'static str, &Histogram<u64>); 8] {
        [
            ("talker prefill", &self.talker_prefill),
            ("talker step", &self.talker_step),
            ("talker wait (cp)", &self.talker_wait),
            ("cp frame", &self.cp_frame),
            ("cp send wait", &self.cp_send_wait),
            ("decoder frame", &self.decoder_frame),
            ("decoder wait", &self.decoder_wait),
            ("ring fill (ms)", &self.ring_fill),
        ]
    }

    fn named_mut(&mut self) -> [&mut Histogram<u64>; 8] {
        [
            &mut self.talker_prefill,
            &mut self.talker_step,
            &mut self.talker_wait,
            &mut self.cp_frame,
            &mut self.cp_send_wait,
            &mut self.decoder_frame,
            &mut self.decoder_wait,
            &mut self.ring_fill,
        ]
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Metrics) {
        let theirs = other.named();
        for (mine, (_, h)) in self.named_mut().into_iter().zip(theirs) {
            let _ = mine.add(h);
        }
    }

    /// The percentile table: count, p50, p90, p99 and max per histogram, in ms (ring fill in ms of
    /// audio). Empty histograms are left out.
    pub fn table(&self) -> String {
        let mut s = format!(
            "{:<18} {:>7} {:>9} {:>9} {:>9} {:>9}\n",
            "stage", "count", "p50 ms", "p90 ms", "p99 ms", "max ms"
        );
        for (name, h) in self.named() {
            if h.is_empty() {
                continue;
            }
            let scale = if name.starts_with("ring") { 1.0 } else { 1e-3 };
            let q = |p: f64| h.value_at_quantile(p) as f64 * scale;
            s += &format!(
                "{:<18} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2}\n",
                name,
                h.len(),
                q(0.5),
                q(0.9),
                q(0.99),
                h.max() as f64 * scale
            );
        }
        s
    }

    /// Writes every non-empty histogram to `out` in HdrHistogram's interval-log format (one
    /// interval per histogram, tagged with its name), readable by HdrHistogram's tools
    /// (`HistogramLogProcessor`, HdrHistogramVisualizer).
    pub fn write_interval_log<W: Write>(
        &self,
        out: &mut W,
        start: std::time::SystemTime,
        elapsed: Duration,
    ) -> std::io::Result<()> {
        use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
        use hdrhistogram::serialization::V2DeflateSerializer;
        let mut serializer = V2DeflateSerializer::new();
        let mut builder = IntervalLogWriterBuilder::new();
        builder.add_comment("qtts stage latencies: microseconds; ring fill in milliseconds");
        builder.with_start_time(start);
        let mut writer = builder.begin_log_with(out, &mut serializer)?;
        for (name, h) in self.named() {
            if h.is_empty() {
                continue;
            }
            let tag = name.replace([' ', '(', ')'], "_");
            let tag = Tag::new(tag.trim_end_matches('_'));
            writer
                .write_histogram(h, Duration::ZERO, elapsed, tag)
                .map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        }
        Ok(())
    }
}
