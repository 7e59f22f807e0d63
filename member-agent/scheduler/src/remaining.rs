//! How long a running job is expected to keep its GPUs: its estimate while it is within it, and a
//! remaining-time model once it has run past it (it is *overdue*).
//!
//! Users' run-time estimates are famously wrong (Philly, Helios and Slurm studies: most jobs run
//! far shorter or longer than requested). A job past its estimate does not free its GPUs "now":
//! reporting it so would promise GPUs that are not coming, so holds would keep waiting on them and
//! a burst gate would see no wait. Run times are heavy tailed, and for heavy tails the expected
//! remaining time *grows* with the time already run: for a Pareto tail of shape α it is
//! `age / (α − 1)`. We take α = 3, i.e. an overdue job is expected to run for another half of
//! what it has run so far, and at least [`OVERDUE_FLOOR`]. As a check, with log-normal estimate
//! error of σ = 0.5 a job that reaches its estimate runs on for about 0.57 × its estimate on
//! average; the model says 0.5 ×.
//!
//! The model only depends on what the member knows (start time, estimate, clock), so the agent
//! and the simulator compute the same thing.

use std::time::Duration;

use super::RunningJob;

/// Fraction of the time already run that an overdue job is expected to run on for (Pareto tail
/// of shape 3: mean residual life = age / 2).
pub const OVERDUE_RUN_ON_FRACTION: f64 = 0.5;

/// Least remaining time an overdue job is expected to have, so a job that just passed a short
/// estimate is not reported as freeing its GPUs within a second or two.
pub const OVERDUE_FLOOR: Duration = Duration::from_secs(60);

impl RunningJob {
    /// Whether the job has run past its estimate at `now` (its expected end has come and it is
    /// still running). A job that has not run at all is not overdue: one with a zero estimate,
    /// started at this very instant, is expected to end now, not in [`OVERDUE_FLOOR`] (a plan
    /// made in the same instant would otherwise move a reservation for nothing).
    pub fn is_overdue(&self, now: Duration) -> bool {
        is_overdue(self.started_at, self.ends_at, now)
    }

    /// How much longer the job is expected to hold its GPUs at `now`: the rest of its estimate
    /// while within it; once overdue, `max(OVERDUE_FLOOR, OVERDUE_RUN_ON_FRACTION × time run)`
    /// (see the module docs). Never zero for a running job, but for one with a zero estimate at
    /// the instant it starts.
    pub fn expected_remaining(&self, now: Duration) -> Duration {
        expected_remaining(self.started_at, self.ends_at, now)
    }
}

/// [`RunningJob::is_overdue`] for a job started at `started_at` and expected to end at `ends_at`.
pub(super) fn is_overdue(started_at: Duration, ends_at: Duration, now: Duration) -> bool {
    now >= ends_at && now > started_at
}

/// [`RunningJob::expected_remaining`] for a job started at `started_at` and expected to end at
/// `ends_at`. For jobs within their estimate it grows with `ends_at`; for overdue ones it shrinks
/// as `started_at` grows (the release index relies on both).
pub(super) fn expected_remaining(started_at: Duration, ends_at: Duration, now: Duration) -> Duration {
    if !is_overdue(started_at, ends_at, now) {
        return ends_at.saturating_sub(now);
    }
    let age = now.saturating_sub(started_at);
    age.mul_f64(OVERDUE_RUN_ON_FRACTION).max(OVERDUE_FLOOR)
}

#[cfg(test)]
mod tests {
    use super::super::LocalJob;
    use super::*;

    fn running(started: u64, estimate: u64) -> RunningJob {
        let job = LocalJob {
            id: "j".into(),
            queue: "default".into(),
            priority: 50,
            replicas: 1,
            gpus: 1,
            cpu: 1,
            memory_gib: 1,
            gpu_types: Vec::new(),
            gpu_memory_gib: 0,
            node_selector: Default::default(),
            run_for: Duration::from_secs(estimate),
            actual: Some(Duration::from_secs(estimate * 10)),
            preemptible: false,
            last_preempted_at: None,
        };
        RunningJob {
            job,
            nodes: vec!["n".into()],
            started_at: Duration::from_secs(started),
            ends_at: Duration::from_secs(started + estimate),
            completes_at: Duration::from_secs(started + estimate * 10),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn within_its_estimate_a_job_has_the_rest_of_its_estimate_left() {
        let job = running(100, 1_000);
        assert!(!job.is_overdue(secs(100)));
        assert_eq!(job.expected_remaining(secs(100)), secs(1_000));
        assert_eq!(job.expected_remaining(secs(700)), secs(400));
        assert!(!job.is_overdue(secs(1_099)));
    }

    #[test]
    fn an_overdue_job_is_expected_to_run_on_for_half_its_age_never_zero() {
        let job = running(100, 1_000);
        // Exactly at its expected end it is overdue, not "done in 0 s".
        assert!(job.is_overdue(secs(1_100)));
        assert_eq!(job.expected_remaining(secs(1_100)), secs(500));
        // The longer it has run, the longer it is expected to run on.
        assert_eq!(job.expected_remaining(secs(4_100)), secs(2_000));
        assert!(job.expected_remaining(secs(4_100)) > job.expected_remaining(secs(2_100)));
    }

    #[test]
    fn a_short_overdue_job_gets_at_least_the_floor() {
        let job = running(0, 10);
        assert_eq!(job.expected_remaining(secs(10)), OVERDUE_FLOOR);
        assert_eq!(job.expected_remaining(secs(30)), OVERDUE_FLOOR);
        assert_eq!(job.expected_remaining(secs(600)), secs(300));
    }
}
