//! Deadlines: `--deadlines SHARE[,SLACK]` gives a seeded share of jobs a `runtime.deadline` of
//! SLACK × their runtime estimate after submission.
//!
//! The deadline is set from the estimate, the only run time a user knows, so with
//! `--estimate-error` a job whose estimate is too short may miss its deadline wherever it runs.

use std::fmt;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Workload;

/// Mixed into the seed so the draw of which jobs get deadlines is a stream of its own: turning
/// deadlines on changes no other property of the workload.
const SEED_MIX: u64 = 0xDEAD_11E5_F00D_5EED;

/// SLACK when `--deadlines` gives only a share: three times the estimate.
pub const DEFAULT_SLACK: f64 = 3.0;

/// Largest SLACK accepted: beyond it a deadline never binds.
const MAX_SLACK: f64 = 1_000.0;

/// Which jobs get deadlines and how tight they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeadlineShare {
    /// Share of jobs with a deadline, 0..=1.
    pub share: f64,
    /// Deadline ÷ runtime estimate, at least 1 (a deadline shorter than the estimate is refused
    /// by spec validation).
    pub slack: f64,
}

impl fmt::Display for DeadlineShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let percent = self.share * 100.0;
        // Whole percentages read without a decimal (`20%`), others with one (`12.5%`).
        let decimals = if (percent - percent.round()).abs() < 1e-9 { 0 } else { 1 };
        write!(f, "{percent:.decimals$}% of jobs, due {}× their estimate after submission", self.slack)
    }
}

impl FromStr for DeadlineShare {
    type Err = String;

    /// Parses `SHARE` or `SHARE,SLACK` (`0.2`, `0.2,3`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (share_text, slack_text) = match text.split_once(',') {
            Some((share, slack)) => (share.trim(), Some(slack.trim())),
            None => (text.trim(), None),
        };
        let share: f64 = share_text.parse().map_err(|_| {
            format!("SHARE must be a number, got `{share_text}` (expected SHARE or SHARE,SLACK, e.g. 0.2,3)")
        })?;
        if !(share.is_finite() && (0.0..=1.0).contains(&share)) {
            return Err(format!("SHARE must be between 0 and 1, got {share_text}"));
        }
        let slack = match slack_text {
            None => DEFAULT_SLACK,
            Some(slack_text) => {
                let slack: f64 = slack_text
                    .parse()
                    .map_err(|_| format!("SLACK must be a number, got `{slack_text}` (e.g. 0.2,3)"))?;
                if !(slack.is_finite() && (1.0..=MAX_SLACK).contains(&slack)) {
                    return Err(format!(
                        "SLACK must be between 1 and {MAX_SLACK} (a deadline is at least the estimate), got {slack_text}"
                    ));
                }
                slack
            }
        };
        Ok(DeadlineShare { share, slack })
    }
}

/// Gives each job, with probability `deadlines.share`, a deadline of `slack × estimate` seconds
/// after submission (rounded up, so never shorter than the estimate); clears every other job's.
/// Job `i`'s draw depends only on `seed` and `i`. Call it after the estimates are final.
pub fn apply_deadlines(workload: &mut Workload, deadlines: DeadlineShare, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ SEED_MIX);
    for job in &mut workload.jobs {
        let draw: f64 = rng.random();
        job.deadline_secs = (draw < deadlines.share).then(|| {
            let deadline = (job.estimate_secs as f64 * deadlines.slack).ceil();
            // `as` saturates; the max keeps a deadline never shorter than the estimate.
            (deadline as u64).max(job.estimate_secs)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimJob, Tenant};

    fn workload(jobs: u32) -> Workload {
        let jobs = (0..jobs)
            .map(|id| SimJob { estimate_secs: 500 + u64::from(id), ..SimJob::plain(id, 0, u64::from(id), 600, 1) })
            .collect();
        Workload { source: "test".into(), tenants: vec![Tenant { name: "t".into(), home: 0 }], jobs }
    }

    #[test]
    fn share_and_slack_parse_and_bad_values_say_which() {
        assert_eq!("0.2,3".parse::<DeadlineShare>(), Ok(DeadlineShare { share: 0.2, slack: 3.0 }));
        assert_eq!("0.5".parse::<DeadlineShare>(), Ok(DeadlineShare { share: 0.5, slack: DEFAULT_SLACK }));
        assert_eq!(
            "0.07,2.5".parse::<DeadlineShare>().unwrap().to_string(),
            "7% of jobs, due 2.5× their estimate after submission"
        );
        assert_eq!(
            "0.125".parse::<DeadlineShare>().unwrap().to_string(),
            "12.5% of jobs, due 3× their estimate after submission"
        );
        for (bad, word) in [("some", "SHARE"), ("1.5", "SHARE"), ("0.2,0.5", "SLACK"), ("0.2,tight", "SLACK")] {
            let err = bad.parse::<DeadlineShare>().unwrap_err();
            assert!(err.contains(word), "{bad}: {err}");
        }
    }

    #[test]
    fn the_share_is_seeded_and_deadlines_are_slack_times_the_estimate() {
        let deadlines = DeadlineShare { share: 0.2, slack: 2.5 };
        let mut a = workload(2_000);
        apply_deadlines(&mut a, deadlines, 7);
        let mut again = workload(2_000);
        apply_deadlines(&mut again, deadlines, 7);
        assert_eq!(a, again);
        let mut other = workload(2_000);
        apply_deadlines(&mut other, deadlines, 8);
        assert_ne!(a, other);

        let due: Vec<&SimJob> = a.jobs.iter().filter(|j| j.deadline_secs.is_some()).collect();
        assert!((300..500).contains(&due.len()), "about 20% of 2,000: {}", due.len());
        for job in due {
            let expected = (job.estimate_secs as f64 * 2.5).ceil() as u64;
            assert_eq!(job.deadline_secs, Some(expected));
        }

        apply_deadlines(&mut a, DeadlineShare { share: 0.0, slack: 3.0 }, 7);
        assert!(a.jobs.iter().all(|j| j.deadline_secs.is_none()));
    }
}
