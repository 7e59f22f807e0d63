//! What the driver measures about itself: round and commit durations, batch sizes, agent
//! streams ended. Read through [`super::Handle::stats`] by benchmarks and the metrics endpoint
//! (recent samples for quantiles, histograms over the process's life for Prometheus).

use std::collections::VecDeque;
use std::time::Duration;

use meridian_core::tally::Histogram;

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

/// Upper bounds (seconds) of the store-commit histogram: an fsync on local disk takes about a
/// millisecond, an etcd transaction a few, a struggling disk or quorum seconds.
pub const COMMIT_BUCKETS_SECS: [f64; 14] =
    [0.000_5, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0, 2.5, 5.0];

/// Upper bounds (seconds) of the placement-round histogram.
pub const ROUND_BUCKETS_SECS: [f64; 12] =
    [0.000_1, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// The driver's own measurements.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Seconds per placement round.
    pub round_secs: Series,
    /// Seconds per group commit.
    pub commit_secs: Series,
    /// Records per group commit (after keeping only the last write of each key).
    pub commit_records: Series,
    /// Commands per batch.
    pub batch_commands: Series,
    /// Seconds per group commit, every commit of the process.
    pub commit_histogram: Histogram,
    /// Seconds per placement round, every round of the process.
    pub round_histogram: Histogram,
    /// Agent streams that ended (the agent went away or its connection broke).
    pub agent_streams_ended: u64,
    /// Agent streams the gateway dropped because their task had ended under it.
    pub agent_streams_dropped: u64,
    /// Messages for agents dropped because their stream's buffer was full. The stream stays:
    /// each such message is repeated when it matters (see the driver).
    pub agent_messages_dropped: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            round_secs: Series::default(),
            commit_secs: Series::default(),
            commit_records: Series::default(),
            batch_commands: Series::default(),
            commit_histogram: Histogram::new(&COMMIT_BUCKETS_SECS),
            round_histogram: Histogram::new(&ROUND_BUCKETS_SECS),
            agent_streams_ended: 0,
            agent_streams_dropped: 0,
            agent_messages_dropped: 0,
        }
    }
}

impl Stats {
    pub(super) fn round(&mut self, took: Duration) {
        self.round_secs.record(took.as_secs_f64());
        self.round_histogram.observe(took.as_secs_f64());
    }

    /// One group commit of `records` records that took `took`.
    pub(super) fn commit(&mut self, took: Duration, records: usize) {
        self.commit_secs.record(took.as_secs_f64());
        self.commit_histogram.observe(took.as_secs_f64());
        self.commit_records.record(records as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_is_kept_as_a_sample_and_in_the_histogram() {
        let mut stats = Stats::default();
        stats.commit(Duration::from_micros(1_500), 3);
        assert_eq!(stats.commit_secs.count, 1);
        assert_eq!(stats.commit_records.max(), 3.0);
        assert_eq!(stats.commit_histogram.count(), 1);
        let buckets = stats.commit_histogram.buckets();
        assert_eq!(buckets.iter().find(|(_, n)| *n == 1).map(|(le, _)| *le), Some(0.002));
    }
}
