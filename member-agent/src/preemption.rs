//! The agent config's `preemption` section: whether and how the member's builtin scheduler stops
//! preemptible jobs for higher-priority ones.
//!
//! ```yaml
//! preemption:
//!   enabled: true         # default
//!   graceSecs: 30         # SIGTERM, then stopped this long after (default 30)
//!   minIntervalSecs: 600  # never preempt a job again this soon after its last preemption
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use meridian_scheduler::PreemptionPolicy;

/// Longest grace or interval accepted: a day.
const MAX_SECS: u64 = 86_400;

/// The `preemption` section of the agent config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PreemptionConfig {
    /// Whether the member preempts at all.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Seconds between signalling a victim and stopping it.
    #[serde(default = "default_grace_secs")]
    pub grace_secs: u64,
    /// A job preempted less than this many seconds ago is not preempted again.
    #[serde(default = "default_min_interval_secs")]
    pub min_interval_secs: u64,
}

impl Default for PreemptionConfig {
    fn default() -> Self {
        Self { enabled: true, grace_secs: default_grace_secs(), min_interval_secs: default_min_interval_secs() }
    }
}

impl PreemptionConfig {
    /// Pushes every problem as `preemption.<field>: <reason>`.
    pub fn check(&self, problems: &mut Vec<String>) {
        if self.grace_secs > MAX_SECS {
            problems.push(format!("preemption.graceSecs: {} is longer than a day ({MAX_SECS})", self.grace_secs));
        }
        if self.min_interval_secs > MAX_SECS {
            problems.push(format!(
                "preemption.minIntervalSecs: {} is longer than a day ({MAX_SECS})",
                self.min_interval_secs
            ));
        }
    }

    /// The scheduler's policy. `kill_grace` is the process runner's SIGTERM → SIGKILL delay (zero
    /// for the simulated runner): a victim's GPUs are freed only once its processes are surely
    /// gone, so the grace is at least that long.
    pub fn policy(&self, kill_grace: Duration) -> PreemptionPolicy {
        PreemptionPolicy {
            enabled: self.enabled,
            grace: Duration::from_secs(self.grace_secs).max(kill_grace),
            min_interval: Duration::from_secs(self.min_interval_secs),
        }
    }
}

/// When a job was last preempted, on a scheduler clock whose `now` is `scheduler_now`, from the
/// gateway's Unix-ms time. A preemption from before the clock's epoch maps to the epoch: later than
/// the truth, so the job is protected at least as long as it should be.
pub fn last_preempted_on_clock(last_preempted_at_ms: Option<i64>, scheduler_now: Duration) -> Option<Duration> {
    let at_ms = last_preempted_at_ms?;
    let unix_now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let unix_now_ms = i64::try_from(unix_now_ms).unwrap_or(i64::MAX);
    let ago_ms = u64::try_from(unix_now_ms.saturating_sub(at_ms)).unwrap_or(0);
    Some(scheduler_now.saturating_sub(Duration::from_millis(ago_ms)))
}

fn yes() -> bool {
    true
}
fn default_grace_secs() -> u64 {
    30
}
fn default_min_interval_secs() -> u64 {
    600
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_the_kill_grace_floor() {
        let config: PreemptionConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(config, PreemptionConfig::default());
        let policy = config.policy(Duration::from_secs(45));
        assert_eq!(policy.grace, Duration::from_secs(45), "processes get their SIGKILL before the GPUs are freed");
        assert_eq!(policy.min_interval, Duration::from_secs(600));
        let mut problems = Vec::new();
        PreemptionConfig { grace_secs: 90_000, ..config }.check(&mut problems);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("preemption.graceSecs:"), "{problems:?}");
    }

    #[test]
    fn a_preemption_long_ago_maps_to_the_clock_epoch_and_a_recent_one_to_its_age() {
        let now_ms = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap();
        let now = Duration::from_secs(1_000);
        assert_eq!(last_preempted_on_clock(None, now), None);
        assert_eq!(last_preempted_on_clock(Some(now_ms - 5_000_000), now), Some(Duration::ZERO));
        let recent = last_preempted_on_clock(Some(now_ms - 100_000), now).unwrap();
        assert!(recent <= Duration::from_secs(900) && recent >= Duration::from_secs(899), "{recent:?}");
    }
}
