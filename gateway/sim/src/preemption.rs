//! Priority and preemption in the lab: which jobs are high priority or preemptible
//! (`meridian sim --preemption SHARE_HIGH,SHARE_PREEMPTIBLE`), and what it did to them.
//!
//! **Classes.** Each job is drawn, from the seed and its id alone (so every policy sees the same
//! classes), as high priority ([`HIGH_PRIORITY`], never preemptible) with probability
//! `SHARE_HIGH`, else preemptible with probability `SHARE_PREEMPTIBLE`; the others keep the
//! default priority. Preemptible jobs keep the default priority too, so only high-priority jobs
//! may preempt, and only preemptible ones are preempted.
//!
//! **Members.** Every member runs the builtin scheduler's preemption with the agent's default
//! policy (30 s grace, 10 min minimum interval), unless `--no-member-preemption`. A victim has no
//! checkpoint: it restarts from scratch, and the GPU time it ran before it was stopped is lost
//! (it counts as busy GPU time, and as [`PreemptionCounts::lost_gpu_secs`]). Its queueing delay
//! counts from its submission to its last start, so the time it ran and lost counts as waiting.

use std::fmt;
use std::str::FromStr;

use meridian_cli::table::Table;
use meridian_proto::spec::DEFAULT_PRIORITY;
use serde::Serialize;

use crate::{RunResult, Workload};

/// Priority of the lab's high-priority jobs.
pub const HIGH_PRIORITY: u32 = 90;

/// The shares of `--preemption SHARE_HIGH,SHARE_PREEMPTIBLE`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreemptionMix {
    /// Share of jobs that are high priority.
    pub share_high: f64,
    /// Share of the other jobs that are preemptible.
    pub share_preemptible: f64,
}

/// A job's class under a mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobClass {
    /// Its spec's priority.
    pub priority: u32,
    /// Its spec's `preemptible`.
    pub preemptible: bool,
}

impl JobClass {
    /// The class of every job without `--preemption`.
    pub const DEFAULT: JobClass = JobClass { priority: DEFAULT_PRIORITY, preemptible: false };
}

/// What preemption did in one replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionCounts {
    /// Jobs stopped by a member's preemption (a job stopped twice counts twice).
    pub preemptions: u64,
    /// GPU-seconds victims ran before they were stopped: work lost, to be redone.
    pub lost_gpu_secs: u64,
}

impl PreemptionMix {
    /// The class of job `id` under seed `seed` (see the module docs).
    pub fn class_of(&self, seed: u64, id: u32) -> JobClass {
        let first = unit(mix(seed ^ 0x7072_6565_6d70_7431 ^ u64::from(id)));
        let second = unit(mix(seed ^ 0x7072_6565_6d70_7432 ^ (u64::from(id) << 20)));
        if first < self.share_high {
            JobClass { priority: HIGH_PRIORITY, preemptible: false }
        } else {
            JobClass { priority: DEFAULT_PRIORITY, preemptible: second < self.share_preemptible }
        }
    }
}

impl fmt::Display for PreemptionMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} high priority, {} preemptible", self.share_high, self.share_preemptible)
    }
}

impl FromStr for PreemptionMix {
    type Err = String;

    /// `SHARE_HIGH,SHARE_PREEMPTIBLE`, each between 0 and 1 (`0.1,0.5`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let Some((high, preemptible)) = text.split_once(',') else {
            return Err(format!("expected SHARE_HIGH,SHARE_PREEMPTIBLE (e.g. 0.1,0.5), got `{text}`"));
        };
        let share = |name: &str, value: &str| -> Result<f64, String> {
            let share: f64 = value.trim().parse().map_err(|_| format!("{name} must be a number, got `{value}`"))?;
            if (0.0..=1.0).contains(&share) {
                Ok(share)
            } else {
                Err(format!("{name} must be between 0 and 1, got {value}"))
            }
        };
        Ok(Self { share_high: share("SHARE_HIGH", high)?, share_preemptible: share("SHARE_PREEMPTIBLE", preemptible)? })
    }
}

/// One policy's line of the preemption table.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionRow {
    /// The policy.
    pub policy: String,
    /// High-priority jobs.
    pub high_jobs: usize,
    /// Their mean queueing delay (last start − submit), seconds.
    pub high_queue_mean_secs: f64,
    /// Their 99th-percentile queueing delay (nearest rank), seconds.
    pub high_queue_p99_secs: f64,
    /// Jobs preempted (times).
    pub preemptions: u64,
    /// GPU-hours victims ran before they were stopped.
    pub lost_gpu_hours: f64,
}

/// The row of `run` under `mix` and `seed`.
pub fn row(workload: &Workload, run: &RunResult, mix: &PreemptionMix, seed: u64) -> PreemptionRow {
    let mut delays: Vec<f64> = run
        .outcomes
        .iter()
        .filter(|o| mix.class_of(seed, o.job).priority == HIGH_PRIORITY)
        .filter_map(|o| workload.jobs.get(o.job as usize).map(|j| o.start_secs.saturating_sub(j.submit_secs) as f64))
        .collect();
    delays.sort_by(f64::total_cmp);
    let mean = if delays.is_empty() { 0.0 } else { delays.iter().sum::<f64>() / delays.len() as f64 };
    let p99 = match delays.len() {
        0 => 0.0,
        n => delays.get(((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1).copied().unwrap_or(0.0),
    };
    PreemptionRow {
        policy: run.policy.clone(),
        high_jobs: delays.len(),
        high_queue_mean_secs: mean,
        high_queue_p99_secs: p99,
        preemptions: run.preemption.preemptions,
        lost_gpu_hours: run.preemption.lost_gpu_secs as f64 / 3600.0,
    }
}

/// The preemption table, one line per policy, after the main report.
pub fn render_table(mix: &PreemptionMix, member_preemption: bool, rows: &[PreemptionRow]) -> String {
    let mut out = format!(
        "\nPriority and preemption ({mix}; member preemption {}; victims restart from scratch)\n",
        if member_preemption { "on" } else { "off" }
    );
    let mut table = Table::new(["POLICY", "HIGH JOBS", "HIGH MEAN (h)", "HIGH P99 (h)", "PREEMPTIONS", "GPU-h LOST"]);
    (1..=5).for_each(|column| table.align_right(column));
    for row in rows {
        table.row([
            row.policy.clone(),
            row.high_jobs.to_string(),
            format!("{:.2}", row.high_queue_mean_secs / 3600.0),
            format!("{:.2}", row.high_queue_p99_secs / 3600.0),
            row.preemptions.to_string(),
            format!("{:.1}", row.lost_gpu_hours),
        ]);
    }
    out.push_str(&table.render());
    out
}

/// SplitMix64's finaliser: a well-mixed 64-bit value from any input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A value in [0, 1) from 53 random bits.
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_right_aligns_its_numbers_under_their_headers() {
        let row = |policy: &str, high_jobs, preemptions, lost_gpu_hours| PreemptionRow {
            policy: policy.to_owned(),
            high_jobs,
            high_queue_mean_secs: 1_800.0,
            high_queue_p99_secs: 36_000.0,
            preemptions,
            lost_gpu_hours,
        };
        let mix = PreemptionMix { share_high: 0.1, share_preemptible: 0.5 };
        let text = render_table(&mix, true, &[row("meridian", 120, 7, 12.25), row("random", 9, 1_234, 0.0)]);
        let lines: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("POLICY") && lines[0].ends_with("GPU-h LOST"), "{text}");
        // Right-aligned: every line ends at the same column, and so do the preemption counts.
        assert!(lines.iter().all(|line| line.chars().count() == lines[0].chars().count()), "{text}");
        let column_end = |line: &str, needle: &str| line.find(needle).map(|at| at + needle.len());
        assert_eq!(column_end(lines[1], " 7 "), column_end(lines[2], " 1234 "), "{text}");
        assert!(lines[1].starts_with("meridian") && lines[1].ends_with("12.2"), "{text}");
    }

    #[test]
    fn the_flag_takes_two_shares_and_bad_values_name_the_share() {
        assert_eq!("0.1,0.5".parse(), Ok(PreemptionMix { share_high: 0.1, share_preemptible: 0.5 }));
        assert!(PreemptionMix::from_str("0.1").unwrap_err().contains("SHARE_HIGH,SHARE_PREEMPTIBLE"));
        assert!(PreemptionMix::from_str("1.5,0.5").unwrap_err().contains("SHARE_HIGH must be between 0 and 1"));
        assert!(PreemptionMix::from_str("0.1,x").unwrap_err().contains("SHARE_PREEMPTIBLE must be a number"));
    }

    #[test]
    fn classes_are_seeded_and_follow_the_shares() {
        let mix = PreemptionMix { share_high: 0.1, share_preemptible: 0.5 };
        let classes: Vec<JobClass> = (0..10_000).map(|id| mix.class_of(7, id)).collect();
        assert_eq!(classes, (0..10_000).map(|id| mix.class_of(7, id)).collect::<Vec<_>>());
        assert_ne!(classes, (0..10_000).map(|id| mix.class_of(8, id)).collect::<Vec<_>>());
        let high = classes.iter().filter(|c| c.priority == HIGH_PRIORITY).count();
        let preemptible = classes.iter().filter(|c| c.preemptible).count();
        assert!((900..1100).contains(&high), "{high}");
        assert!((4200..4800).contains(&preemptible), "{preemptible} of the 9000 others");
        assert!(classes.iter().all(|c| !(c.preemptible && c.priority == HIGH_PRIORITY)));
    }
}
