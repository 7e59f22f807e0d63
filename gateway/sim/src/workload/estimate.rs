//! Estimate error: users' run-time estimates are not the truth.
//!
//! Each job's runtime estimate is its true duration times a log-normal factor
//! `exp(N(bias, sigma))`, drawn from its own stream of the workload seed, clamped to at least one
//! second. Philly, Helios and Slurm studies find most jobs run far shorter or longer than
//! requested; σ = 0.5 puts two thirds of estimates within a factor of 1.65 of the truth.

use std::fmt;
use std::str::FromStr;

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::sample;
use crate::Workload;

/// Mixed into the seed so estimate errors draw a stream independent of the generator's and the
/// decoration's: turning estimate error on changes no other property of the workload.
const SEED_MIX: u64 = 0xE571_3A7E_E770_0A5E;

/// Largest σ accepted: beyond it estimates are off by orders of magnitude for most jobs.
const MAX_SIGMA: f64 = 3.0;

/// Largest |bias| accepted (a median estimate e^5 ≈ 150 times the truth or less).
const MAX_BIAS: f64 = 5.0;

/// How wrong runtime estimates are: `ln(estimate / truth) ~ N(bias, sigma)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EstimateError {
    /// Standard deviation of the natural log of estimate ÷ truth (0 = exact estimates).
    pub sigma: f64,
    /// Mean of the natural log of estimate ÷ truth: positive over-estimates (as users who pad
    /// their requests do), negative under-estimates.
    pub bias: f64,
}

impl EstimateError {
    /// Exact estimates (σ = 0, no bias).
    pub const NONE: EstimateError = EstimateError { sigma: 0.0, bias: 0.0 };

    /// Whether estimates equal the truth.
    pub fn is_exact(&self) -> bool {
        self.sigma == 0.0 && self.bias == 0.0
    }
}

impl fmt::Display for EstimateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "σ {}", self.sigma)?;
        if self.bias != 0.0 {
            write!(f, ", bias {}", self.bias)?;
        }
        Ok(())
    }
}

impl FromStr for EstimateError {
    type Err = String;

    /// Parses `SIGMA` or `SIGMA,BIAS` (`0.5`, `0.5,-0.2`).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (sigma_text, bias_text) = match text.split_once(',') {
            Some((sigma, bias)) => (sigma.trim(), Some(bias.trim())),
            None => (text.trim(), None),
        };
        let sigma: f64 = sigma_text.parse().map_err(|_| {
            format!("SIGMA must be a number, got `{sigma_text}` (expected SIGMA or SIGMA,BIAS, e.g. 0.5)")
        })?;
        if !(sigma.is_finite() && (0.0..=MAX_SIGMA).contains(&sigma)) {
            return Err(format!("SIGMA must be between 0 and {MAX_SIGMA}, got {sigma_text}"));
        }
        let bias = match bias_text {
            None => 0.0,
            Some(bias_text) => {
                let bias: f64 = bias_text
                    .parse()
                    .map_err(|_| format!("BIAS must be a number, got `{bias_text}` (e.g. 0.5,-0.2)"))?;
                if !(bias.is_finite() && bias.abs() <= MAX_BIAS) {
                    return Err(format!("BIAS must be between -{MAX_BIAS} and {MAX_BIAS}, got {bias_text}"));
                }
                bias
            }
        };
        Ok(EstimateError { sigma, bias })
    }
}

/// Sets every job's [`estimate_secs`](crate::SimJob::estimate_secs) to its true duration times
/// `exp(N(error.bias, error.sigma))`, rounded, at least 1 s. Job `i`'s factor depends only on
/// `seed` and `i` (two uniform draws per job from the seed's own stream). With exact estimates
/// every estimate is the duration and nothing is drawn.
pub fn apply_estimate_error(workload: &mut Workload, error: EstimateError, seed: u64) {
    if error.is_exact() {
        for job in &mut workload.jobs {
            job.estimate_secs = job.duration_secs;
        }
        return;
    }
    let mut rng = StdRng::seed_from_u64(seed ^ SEED_MIX);
    for job in &mut workload.jobs {
        let factor = (error.bias + error.sigma * sample::standard_normal(&mut rng)).exp();
        let estimate = (job.duration_secs as f64 * factor).round();
        // `as` saturates at u64::MAX and maps NaN to 0; the clamp keeps at least a second.
        job.estimate_secs = (estimate as u64).max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SimJob, Tenant};

    fn workload(jobs: u32) -> Workload {
        let jobs = (0..jobs).map(|id| SimJob::plain(id, 0, u64::from(id), 600 + u64::from(id) * 37, 1)).collect();
        Workload { source: "test".into(), tenants: vec![Tenant { name: "t".into(), home: 0 }], jobs }
    }

    fn estimates(seed: u64, error: EstimateError) -> Vec<u64> {
        let mut w = workload(2_000);
        apply_estimate_error(&mut w, error, seed);
        w.jobs.iter().map(|j| j.estimate_secs).collect()
    }

    #[test]
    fn estimate_error_is_seeded_and_deterministic() {
        let error = EstimateError { sigma: 0.5, bias: 0.0 };
        assert_eq!(estimates(7, error), estimates(7, error));
        assert_ne!(estimates(7, error), estimates(8, error));
        // Truth is untouched and most estimates differ from it.
        let mut w = workload(2_000);
        apply_estimate_error(&mut w, error, 7);
        assert!(w.jobs.iter().enumerate().all(|(i, j)| j.duration_secs == 600 + i as u64 * 37));
        let differ = w.jobs.iter().filter(|j| j.estimate_secs != j.duration_secs).count();
        assert!(differ > 1_900, "{differ}");
    }

    #[test]
    fn log_errors_have_the_asked_spread_and_bias() {
        for error in [EstimateError { sigma: 0.5, bias: 0.0 }, EstimateError { sigma: 1.0, bias: -0.3 }] {
            let mut w = workload(20_000);
            apply_estimate_error(&mut w, error, 3);
            let logs: Vec<f64> =
                w.jobs.iter().map(|j| (j.estimate_secs as f64 / j.duration_secs as f64).ln()).collect();
            let mean = logs.iter().sum::<f64>() / logs.len() as f64;
            let sd = (logs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / logs.len() as f64).sqrt();
            assert!((mean - error.bias).abs() < 0.03, "{error}: mean {mean}");
            assert!((sd - error.sigma).abs() < 0.03, "{error}: sd {sd}");
        }
    }

    #[test]
    fn exact_estimates_are_the_durations_and_estimates_are_at_least_a_second() {
        let mut w = workload(10);
        for job in &mut w.jobs {
            job.estimate_secs = 1;
        }
        apply_estimate_error(&mut w, EstimateError::NONE, 1);
        assert!(w.jobs.iter().all(|j| j.estimate_secs == j.duration_secs));
        apply_estimate_error(&mut w, EstimateError { sigma: 0.1, bias: -MAX_BIAS }, 1);
        assert!(w.jobs.iter().all(|j| j.estimate_secs >= 1));
    }

    #[test]
    fn bad_values_are_refused_naming_the_part() {
        assert_eq!("0.5".parse(), Ok(EstimateError { sigma: 0.5, bias: 0.0 }));
        assert_eq!(" 0.25 , -0.2 ".parse(), Ok(EstimateError { sigma: 0.25, bias: -0.2 }));
        assert_eq!("0".parse::<EstimateError>().map(|e| e.is_exact()), Ok(true));
        for (text, needle) in [
            ("abc", "SIGMA"),
            ("-0.5", "SIGMA"),
            ("NaN", "SIGMA"),
            ("9", "SIGMA"),
            ("0.5,x", "BIAS"),
            ("0.5,inf", "BIAS"),
        ] {
            let err = text.parse::<EstimateError>().unwrap_err();
            assert!(err.contains(needle), "`{text}`: {err}");
        }
    }
}
