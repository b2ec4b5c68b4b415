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
    pub code_predictor_frame: Histogram<u64>,
    /// Code predictor blocked on a full queue to the decoder (µs): backpressure.
    pub code_predictor_send_wait: Histogram<u64>,
    /// Decoder per frame (a call's time over its frames, µs).
    pub decoder_frame: Histogram<u64>,
    /// Decoder waiting for codes (µs): starvation.
    pub decoder_wait: Histogram<u64>,
    /// Decoder waiting for its cores to come back from a stage that borrows them (µs; see
    /// [`crate::engine::StagePlan::borrow`]).
    pub decoder_claim: Histogram<u64>,
    /// Audio queued in the sink after each write (ms), for sinks that queue.
    pub ring_fill: Histogram<u64>,
    /// Streams in each of the request's talker steps (1: alone; more: a batch with others'
    /// steps, [`crate::engine::EngineConfig::max_streams`]). A count, not a time: not in
    /// [`Metrics::named`].
    pub streams: Histogram<u64>,
    /// The talker's steps by batch size: `steps_by_streams[n - 1]` is `(steps, µs)`, the steps
    /// this request ran with `n` streams in the batch and their summed time (a fixed array:
    /// recording never allocates). A batch's step counts once in each of its requests.
    pub steps_by_streams: [(u64, u64); STEP_BATCHES],
}

/// The batch sizes [`Metrics::steps_by_streams`] tells apart: the engine's largest,
/// `crate::code_predictor::MAX_ROWS` (checked there at compile time).
pub const STEP_BATCHES: usize = 16;

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
            code_predictor_frame: hist(),
            code_predictor_send_wait: hist(),
            decoder_frame: hist(),
            decoder_wait: hist(),
            decoder_claim: hist(),
            ring_fill: hist(),
            streams: hist(),
            steps_by_streams: [(0, 0); STEP_BATCHES],
        }
    }
}

/// Signal-to-noise ratio in dB of `got` against `reference` (the noise is their difference).
pub fn snr_db(reference: &[f32], got: &[f32]) -> f64 {
    let noise: f64 = reference
        .iter()
        .zip(got)
        .map(|(a, b)| ((a - b) as f64).powi(2))
        .sum();
    let signal: f64 = reference.iter().map(|&a| (a as f64).powi(2)).sum();
    10.0 * (signal / noise.max(1e-30)).log10()
}

/// Records a duration in microseconds (saturating at the bounds).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).clamp(1, h.high());
    let _ = h.record(us);
}

impl Metrics {
    /// The histograms with their names, in table order.
    pub fn named(&self) -> [(&'static str, &Histogram<u64>); 9] {
        [
            ("talker prefill", &self.talker_prefill),
            ("talker step", &self.talker_step),
            ("talker wait (code predictor)", &self.talker_wait),
            ("code predictor frame", &self.code_predictor_frame),
            ("code predictor send wait", &self.code_predictor_send_wait),
            ("decoder frame", &self.decoder_frame),
            ("decoder wait", &self.decoder_wait),
            ("decoder claim", &self.decoder_claim),
            ("ring fill (ms)", &self.ring_fill),
        ]
    }

    fn named_mut(&mut self) -> [&mut Histogram<u64>; 9] {
        [
            &mut self.talker_prefill,
            &mut self.talker_step,
            &mut self.talker_wait,
            &mut self.code_predictor_frame,
            &mut self.code_predictor_send_wait,
            &mut self.decoder_frame,
            &mut self.decoder_wait,
            &mut self.decoder_claim,
            &mut self.ring_fill,
        ]
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &Metrics) {
        let theirs = other.named();
        for (mine, (_, h)) in self.named_mut().into_iter().zip(theirs) {
            let _ = mine.add(h);
        }
        let _ = self.streams.add(&other.streams);
        for (mine, theirs) in self
            .steps_by_streams
            .iter_mut()
            .zip(&other.steps_by_streams)
        {
            mine.0 += theirs.0;
            mine.1 += theirs.1;
        }
    }

    /// Records one talker step of `streams` streams (clamped to 1 ..= the array's length) that
    /// took `took`, into [`Metrics::steps_by_streams`].
    pub fn record_step_of(&mut self, streams: usize, took: Duration) {
        let i = streams.clamp(1, self.steps_by_streams.len()) - 1;
        self.steps_by_streams[i].0 += 1;
        self.steps_by_streams[i].1 += u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
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

/// Errors of [`Metrics::plot_svg`].
#[derive(Debug, thiserror::Error)]
#[error("latency plot {path}: {message}")]
pub struct PlotError {
    /// The file.
    pub path: std::path::PathBuf,
    /// What the plotting library said.
    pub message: String,
}

impl Metrics {
    /// Draws each stage's latency distribution (ms against percentile, HdrHistogram's classic
    /// plot: the tail stretched on a log axis) as an SVG file.
    pub fn plot_svg(&self, path: &std::path::Path, title: &str) -> Result<(), PlotError> {
        use plotters::prelude::*;
        let err = |e: &dyn std::fmt::Display| PlotError {
            path: path.into(),
            message: e.to_string(),
        };
        // x = 1 / (1 - q): 1 at the median's start (q = 0), 1000 at q = 0.999.
        let grid: Vec<f64> = (0..=60).map(|i| 10f64.powf(i as f64 / 20.0)).collect();
        let series: Vec<(&str, Vec<(f64, f64)>)> = self
            .named()
            .into_iter()
            .filter(|(name, h)| !h.is_empty() && !name.starts_with("ring"))
            .map(|(name, h)| {
                let pts = grid
                    .iter()
                    .map(|&x| (x, h.value_at_quantile(1.0 - 1.0 / x) as f64 / 1e3))
                    .collect();
                (name, pts)
            })
            .collect();
        let top = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|&(_, y)| y))
            .fold(1.0f64, f64::max)
            * 1.1;
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((1f64..1000f64).log_scale(), 0f64..top)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("latency (ms)")
            .x_label_formatter(&|x| format!("{:.1}%", (1.0 - 1.0 / x) * 100.0))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, (name, pts)) in series.into_iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }
}
