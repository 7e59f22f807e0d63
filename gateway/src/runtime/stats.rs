//! What the driver measures about itself: round and commit durations, batch sizes. Read through
//! [`super::Handle::stats`] by benchmarks and (later) the metrics endpoint.

use std::collections::VecDeque;
use std::time::Duration;

/// How many recent samples each series keeps.
const WINDOW: usize = 4096;

/// Recent samples of one quantity.
#[derive(Debug, Clone, Default)]
pub struct Series {
    samples: VecDeque<f64>,
    /// Samples ever recorded.
    pub count: u64,
}

impl Series {
    pub(super) fn record(&mut self, value: f64) {
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(value);
        self.count += 1;
    }

    /// The `q` quantile (0..=1) of the recent samples, or 0 with none.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.samples.is_empty() {
            return 0.0;
        }
        let mut sorted: Vec<f64> = self.samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        sorted[((sorted.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
    }

    /// The largest recent sample.
    pub fn max(&self) -> f64 {
        self.samples.iter().copied().fold(0.0, f64::max)
    }
}

/// The driver's own measurements.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Seconds per placement round.
    pub round_secs: Series,
    /// Seconds per group commit.
    pub commit_secs: Series,
    /// Records per group commit (after keeping only the last write of each key).
    pub commit_records: Series,
    /// Commands per batch.
    pub batch_commands: Series,
}

impl Stats {
    pub(super) fn round(&mut self, took: Duration) {
        self.round_secs.record(took.as_secs_f64());
    }
}
