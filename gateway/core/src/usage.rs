//! Running jobs' GPU utilisation as their members last measured it, and the idle rule: a job
//! holding GPUs whose utilisation stays under `idleGpu.threshold` for `idleGpu.after` is idle,
//! since its first low sample.
//!
//! Not durable (like queue pressure): after a gateway restart the next heartbeats refill it.
//! Samples come with job reports (heartbeats); a report without one leaves the last sample in
//! place, and a job that stops running (or is bound anew) drops its entry.

use std::sync::Arc;
use std::time::Duration;

use meridian_proto::protocol::GpuUsage;
use serde::Serialize;

use crate::record::JobRecord;

/// When a job holding GPUs counts as idle (`idleGpu` in the gateway config).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdleGpuConfig {
    /// Utilisation (0..1, mean over the job's GPUs) under which a sample is low.
    pub threshold: f64,
    /// How long samples must stay low before the job is idle.
    pub after: Duration,
}

impl Default for IdleGpuConfig {
    fn default() -> Self {
        Self { threshold: 0.05, after: Duration::from_secs(30 * 60) }
    }
}

/// What the core keeps per running job: the last sample and since when samples are low.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UsageEntry {
    fencing_token: u64,
    gpu_utilization: f64,
    window_secs: u64,
    sampled_at_ms: i64,
    /// The first sample of the current run of low samples; None while the last was not low.
    low_since_ms: Option<i64>,
}

/// A running job's GPU utilisation for readers (`"usage"` in the job's JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobUsage {
    /// Mean utilisation of the job's GPUs over the member's window, 0..1.
    pub gpu_utilization: f64,
    /// The job holds GPUs it has not used (under the threshold) for at least `idleGpu.after`.
    pub idle: bool,
    /// With `idle`: since when (Unix ms), the first low sample.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_since_ms: Option<i64>,
    /// When the gateway received the sample (Unix ms).
    pub sampled_at_ms: i64,
    /// How far back the member's mean reaches, in seconds.
    pub window_secs: u64,
}

impl UsageEntry {
    fn as_seen(&self, idle: &IdleGpuConfig, now_ms: i64) -> JobUsage {
        let after_ms = i64::try_from(idle.after.as_millis()).unwrap_or(i64::MAX);
        let idle_since_ms = self.low_since_ms.filter(|since| now_ms.saturating_sub(*since) >= after_ms);
        JobUsage {
            gpu_utilization: self.gpu_utilization,
            idle: idle_since_ms.is_some(),
            idle_since_ms,
            sampled_at_ms: self.sampled_at_ms,
            window_secs: self.window_secs,
        }
    }
}

/// The usage of every running job (shared with the read views).
#[derive(Clone, Default)]
pub(crate) struct UsageBook {
    entries: imbl::OrdMap<String, Arc<UsageEntry>>,
    idle: IdleGpuConfig,
}

impl UsageBook {
    /// An empty book that judges idleness by `idle`.
    pub(crate) fn new(idle: IdleGpuConfig) -> Self {
        Self { entries: imbl::OrdMap::new(), idle }
    }

    /// `job`'s usage at `now_ms`, if it runs and its current binding has a sample.
    pub(crate) fn of(&self, job: &JobRecord, now_ms: i64) -> Option<JobUsage> {
        let entry = self.entries.get(&job.id)?;
        job.runs_under(entry.fencing_token).then(|| entry.as_seen(&self.idle, now_ms))
    }

    /// The ids of the jobs with an entry.
    pub(crate) fn job_ids(&self) -> impl Iterator<Item = &String> + '_ {
        self.entries.keys()
    }

    /// Notes what a member said about the GPUs of job `job_id` under `fencing_token`, after its
    /// report was applied (`job`: the job's record now): kept while the job runs under that
    /// binding, dropped once it does not.
    pub(crate) fn note(
        &mut self,
        job: Option<&JobRecord>,
        job_id: &str,
        fencing_token: u64,
        usage: Option<GpuUsage>,
        now_ms: i64,
    ) {
        if !job.is_some_and(|job| job.runs_under(fencing_token)) {
            if self.entries.get(job_id).is_some_and(|e| e.fencing_token <= fencing_token) {
                self.entries.remove(job_id);
            }
            return;
        }
        let Some(usage) = usage else { return };
        let low = usage.gpu_utilization < self.idle.threshold;
        let previous = self.entries.get(job_id).filter(|e| e.fencing_token == fencing_token);
        let low_since_ms = match (low, previous.and_then(|e| e.low_since_ms)) {
            (false, _) => None,
            (true, Some(since)) => Some(since),
            (true, None) => Some(now_ms),
        };
        let entry = UsageEntry {
            fencing_token,
            gpu_utilization: usage.gpu_utilization,
            window_secs: usage.window.as_secs(),
            sampled_at_ms: now_ms,
            low_since_ms,
        };
        self.entries.insert(job_id.to_string(), Arc::new(entry));
    }

    /// Drops the entries of jobs that no longer run under the sampled binding (cancelled, lost
    /// with their cluster, finished without a report); `job` looks a job's record up by id.
    pub(crate) fn forget_stale<'a>(&mut self, job: impl Fn(&str) -> Option<&'a JobRecord>) {
        let stale: Vec<String> = self
            .entries
            .iter()
            .filter(|(id, entry)| !job(id.as_str()).is_some_and(|job| job.runs_under(entry.fencing_token)))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            self.entries.remove(&id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn entry(low_since_ms: Option<i64>) -> UsageEntry {
        UsageEntry { fencing_token: 1, gpu_utilization: 0.02, window_secs: 60, sampled_at_ms: 0, low_since_ms }
    }

    #[test]
    fn a_job_is_idle_once_its_samples_stayed_low_for_the_configured_time() {
        let idle = IdleGpuConfig { threshold: 0.05, after: Duration::from_secs(60) };
        let low = entry(Some(1_000));
        assert!(!low.as_seen(&idle, 60_999).idle);
        let seen = low.as_seen(&idle, 61_000);
        assert!(seen.idle);
        assert_eq!(seen.idle_since_ms, Some(1_000));
        assert!(!entry(None).as_seen(&idle, 1_000_000).idle);
        let json = serde_json::to_value(&seen).unwrap();
        assert_eq!(json["gpuUtilization"], 0.02);
        assert_eq!(json["idleSinceMs"], 1_000);
        assert!(entry(None).as_seen(&idle, 0).idle_since_ms.is_none());
    }
}
