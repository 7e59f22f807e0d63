//! The synthetic workload generator: seeded workloads shaped like the Philly trace, like LLM
//! training, or a mix of both, offered at a chosen load.
//!
//! Job shapes come from published figures (`shared/traces/README.md`): Philly's GPU counts are
//! drawn from the trace's own histogram, and its run times from the trace's run-time percentiles
//! per job size (multi-GPU jobs run far longer, which is why 6.5 % of the jobs hold 68 % of the
//! GPU-time). Arrivals are bursty the way the trace is: a day/night cycle of the submission rate,
//! and tenants that submit batches of jobs within minutes. Finally all submit times are stretched
//! so the workload offers exactly the requested load.

use std::fmt;
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::sample;
use crate::{RawJob, SimError};

/// A synthetic workload profile, as named on the command line (`--profile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Like the Philly trace: mostly 1-GPU jobs, heavy-tailed run times, 15 tenants.
    Philly,
    /// LLM training: fewer, much larger gangs (up to 512 GPUs) running hours, 6 tenants.
    Llm,
    /// About 70 % Philly-like and 30 % LLM-like jobs, 10 tenants.
    Mixed,
}

/// GPUs per job in the Philly trace and how many of its 82,247 jobs asked for that many.
const PHILLY_GPUS: [(u32, f64); 10] = [
    (1, 76_627.0),
    (2, 1_818.0),
    (4, 1_870.0),
    (8, 1_643.0),
    (12, 7.0),
    (16, 199.0),
    (24, 7.0),
    (32, 67.0),
    (64, 6.0),
    (128, 3.0),
];

/// Run-time quantiles `(probability, seconds)` of the trace's 1-GPU jobs (its p10 … p99.9, with
/// the ends pinned).
const PHILLY_SECS_ONE_GPU: [(f64, f64); 10] = [
    (0.0, 10.0),
    (0.1, 62.0),
    (0.25, 122.0),
    (0.5, 1_117.0),
    (0.75, 2_716.0),
    (0.9, 8_512.0),
    (0.95, 19_137.0),
    (0.99, 135_404.0),
    (0.999, 868_927.0),
    (1.0, 2_592_000.0),
];

/// Run-time quantiles of the trace's 2–8 GPU jobs.
const PHILLY_SECS_ONE_NODE: [(f64, f64); 10] = [
    (0.0, 10.0),
    (0.1, 17.0),
    (0.25, 36.0),
    (0.5, 4_398.0),
    (0.75, 82_106.0),
    (0.9, 206_789.0),
    (0.95, 363_108.0),
    (0.99, 906_798.0),
    (0.999, 2_582_803.0),
    (1.0, 2_592_000.0),
];

/// Run-time quantiles of the trace's jobs of more than 8 GPUs (only 289 jobs, so no p99.9).
const PHILLY_SECS_MULTI_NODE: [(f64, f64); 9] = [
    (0.0, 10.0),
    (0.1, 69.0),
    (0.25, 566.0),
    (0.5, 21_137.0),
    (0.75, 104_218.0),
    (0.9, 252_560.0),
    (0.95, 446_126.0),
    (0.99, 1_152_387.0),
    (1.0, 1_710_643.0),
];

/// Shortest and longest Philly-like run time, in seconds (30 s .. 30 days).
const PHILLY_SECS_RANGE: (f64, f64) = (30.0, 2_592_000.0);

/// GPUs per LLM-like job, in per-mille: 40 % up to one node, 35 % 16–64, 20 % 128–256, 5 % more.
const LLM_GPUS: [(u32, f64); 14] = [
    (1, 100.0),
    (2, 50.0),
    (4, 100.0),
    (8, 150.0),
    (16, 120.0),
    (24, 30.0),
    (32, 120.0),
    (48, 30.0),
    (64, 50.0),
    (128, 120.0),
    (192, 20.0),
    (256, 60.0),
    (384, 20.0),
    (512, 30.0),
];

/// Median LLM-like run time: 2 hours.
const LLM_MEDIAN_SECS: f64 = 7_200.0;

/// Log-normal sigma of LLM-like run times. A pure log-normal's mean is the median times
/// exp(σ²/2); 1.58 gives a mean of about 6 hours once clamped to [`LLM_SECS_RANGE`].
const LLM_SIGMA: f64 = 1.58;

/// Shortest and longest LLM-like run time, in seconds (2 minutes .. 3 days).
const LLM_SECS_RANGE: (f64, f64) = (120.0, 259_200.0);

/// LLM gangs larger than a node come in multiples of this many GPUs (one node).
const LLM_GANG_STEP: u32 = 8;

/// Chance that a submission is a batch (a sweep, a retry storm) rather than one job.
const BATCH_PROBABILITY: f64 = 0.1;

/// Jobs in a batch.
const BATCH_JOBS: std::ops::RangeInclusive<usize> = 5..=50;

/// Mean gap between the jobs of a batch, in seconds: a batch of 50 spans about 8 minutes.
const BATCH_GAP_SECS: f64 = 10.0;

/// Relative swing of the submission rate over a day: peak / trough = (1 + a) / (1 - a) = 3.
const DIURNAL_AMPLITUDE: f64 = 0.5;

/// Seconds in a day, the period of the rate cycle.
const DAY_SECS: f64 = 86_400.0;

/// Mean gap between submissions when no load is given to derive it from, in seconds.
const DEFAULT_SUBMISSION_GAP_SECS: f64 = 60.0;

/// Mixed into the seed for the stream that draws GPU-memory needs.
const MEMORY_SEED_MIX: u64 = 0x6B1B_0000_6B1B_0000;

/// GPU memory per GPU that Philly-like jobs need, in GiB, with weights: the trace ran on 12–24 GB
/// P100/P40 GPUs, so nearly all fit 24 GiB (an L4); a few need a 32 GiB V100 or more.
const PHILLY_GPU_MEMORY: [(u32, f64); 4] = [(0, 0.5), (16, 0.3), (24, 0.15), (40, 0.05)];

/// GPU memory that LLM-like jobs of up to one node need: fine-tuning and small models fit
/// 24–40 GiB, larger ones want 80 GiB.
const LLM_SMALL_GPU_MEMORY: [(u32, f64); 3] = [(24, 0.3), (40, 0.4), (80, 0.3)];

/// GPU memory that LLM-like gangs of more than one node need: sharded pre-training of large
/// models mostly wants 80 GiB GPUs (A100 80 GB, H100), some fits 40 GiB.
const LLM_LARGE_GPU_MEMORY: [(u32, f64); 2] = [(40, 0.4), (80, 0.6)];

/// GPU memory per GPU a job of `gpus` GPUs needs, in GiB (0: any GPU). Decoration lowers a need
/// no GPU type of the job's home can meet.
fn gpu_memory_need(rng: &mut impl Rng, llm: bool, gpus: u32) -> u32 {
    let table: &[(u32, f64)] = match (llm, gpus > LLM_GANG_STEP) {
        (false, _) => &PHILLY_GPU_MEMORY,
        (true, false) => &LLM_SMALL_GPU_MEMORY,
        (true, true) => &LLM_LARGE_GPU_MEMORY,
    };
    let weights: Vec<f64> = table.iter().map(|(_, w)| *w).collect();
    sample::weighted_index(rng, &weights).and_then(|i| table.get(i)).map_or(0, |(gib, _)| *gib)
}

/// A job drawn before its submit time is known: which submission it belongs to and how far into
/// that submission's batch it comes.
struct Drawn {
    submission: usize,
    offset_secs: f64,
    job: RawJob,
}

impl Profile {
    /// Every profile, in the order help text lists them.
    pub const ALL: [Profile; 3] = [Profile::Philly, Profile::Llm, Profile::Mixed];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Philly => "philly",
            Profile::Llm => "llm",
            Profile::Mixed => "mixed",
        }
    }

    /// Jobs drawn when the command line does not say.
    pub fn default_jobs(self) -> usize {
        match self {
            Profile::Philly => 20_000,
            Profile::Llm => 2_000,
            Profile::Mixed => 10_000,
        }
    }

    fn tenants(self) -> usize {
        match self {
            Profile::Philly => 15,
            Profile::Llm => 6,
            Profile::Mixed => 10,
        }
    }

    /// Exponent of the Zipf-like tenant shares: with 15 tenants, 1.6 gives the largest tenant
    /// about half the submissions, as in the trace.
    fn tenant_skew(self) -> f64 {
        match self {
            Profile::Philly => 1.6,
            Profile::Llm => 1.0,
            Profile::Mixed => 1.2,
        }
    }

    /// Share of LLM-like jobs.
    fn llm_share(self) -> f64 {
        match self {
            Profile::Philly => 0.0,
            Profile::Llm => 1.0,
            Profile::Mixed => 0.3,
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Profile {
    type Err = SimError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Profile::ALL.iter().map(|p| p.name()).collect();
            SimError::Invalid(format!("unknown profile `{s}`; expected one of: {}", names.join(", ")))
        })
    }
}

/// Draws `jobs` jobs of `profile` from `seed`.
///
/// Submit times are scaled so the workload offers `load`: its GPU-seconds divided by
/// (last submit time × `capacity_gpus`) equals `load` (up to rounding to whole seconds; the span
/// is at least 1 s). Without a usable load or capacity (not positive, not finite) or with a single
/// job, the times are left at a mean of one submission a minute. No gang exceeds `max_gang_gpus`
/// (0 counts as 1). Jobs come sorted by submit time, the first at 0; tenants are `t01`, `t02`, ….
/// The same arguments always give the same jobs.
pub fn synthesize(
    profile: Profile,
    jobs: usize,
    load: f64,
    capacity_gpus: u64,
    max_gang_gpus: u32,
    seed: u64,
) -> Vec<RawJob> {
    if jobs == 0 {
        return Vec::new();
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let max_gang_gpus = max_gang_gpus.max(1);
    let skew = profile.tenant_skew();
    let tenant_weights: Vec<f64> = (1..=profile.tenants()).map(|rank| (rank as f64).powf(-skew)).collect();

    // Memory needs come from a stream of their own, so the jobs' shapes and times are the same
    // draws as without them.
    let mut memory_rng = StdRng::seed_from_u64(seed ^ MEMORY_SEED_MIX);
    let mut drawn: Vec<Drawn> = Vec::with_capacity(jobs);
    let mut submissions = 0;
    while drawn.len() < jobs {
        let tenant = sample::weighted_index(&mut rng, &tenant_weights).unwrap_or(0);
        let tenant = format!("t{:02}", tenant + 1);
        let batch = if sample::chance(&mut rng, BATCH_PROBABILITY) { rng.random_range(BATCH_JOBS) } else { 1 };
        let mut offset_secs = 0.0;
        for position in 0..batch.min(jobs - drawn.len()) {
            if position > 0 {
                offset_secs += sample::exponential(&mut rng, BATCH_GAP_SECS);
            }
            let llm = sample::chance(&mut rng, profile.llm_share());
            let (gpus, duration_secs) =
                if llm { llm_job(&mut rng, max_gang_gpus) } else { philly_job(&mut rng, max_gang_gpus) };
            let gpu_memory_gib = gpu_memory_need(&mut memory_rng, llm, gpus);
            let job = RawJob { submit_secs: 0, duration_secs, gpus, tenant: tenant.clone(), gpu_memory_gib };
            drawn.push(Drawn { submission: submissions, offset_secs, job });
        }
        submissions += 1;
    }

    let gpu_secs: f64 = drawn.iter().map(|d| f64::from(d.job.gpus) * d.job.duration_secs as f64).sum();
    let span_secs = target_span_secs(gpu_secs, jobs, load, capacity_gpus);
    let mean_gap_secs = span_secs.map_or(DEFAULT_SUBMISSION_GAP_SECS, |span| span / submissions as f64);
    let starts = diurnal_arrivals(&mut rng, submissions, mean_gap_secs);

    let mut timed: Vec<(f64, RawJob)> =
        drawn.into_iter().map(|d| (starts.get(d.submission).copied().unwrap_or(0.0) + d.offset_secs, d.job)).collect();
    // Stable, so jobs drawn at the same instant keep their draw order.
    timed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let first = timed.first().map_or(0.0, |(at, _)| *at);
    let last = timed.last().map_or(0.0, |(at, _)| *at);
    let stretch = match span_secs {
        Some(span) if last > first => span / (last - first),
        _ => 1.0,
    };
    timed
        .into_iter()
        .map(|(at, mut job)| {
            job.submit_secs = ((at - first) * stretch).round() as u64;
            job
        })
        .collect()
}

/// The arrival window that makes `gpu_secs` a `load` of `capacity_gpus`, when that is defined.
fn target_span_secs(gpu_secs: f64, jobs: usize, load: f64, capacity_gpus: u64) -> Option<f64> {
    if jobs < 2 || !load.is_finite() || load <= 0.0 || capacity_gpus == 0 {
        return None;
    }
    let span = gpu_secs / (load * capacity_gpus as f64);
    (span.is_finite() && span > 0.0).then_some(span.max(1.0))
}

/// A Philly-like job: GPUs from the trace's histogram (capped at `max_gang_gpus`) and a run time
/// from the trace's percentiles for that job size.
fn philly_job(rng: &mut impl Rng, max_gang_gpus: u32) -> (u32, u64) {
    let gpus = pick(rng, &PHILLY_GPUS);
    let quantiles: &[(f64, f64)] = match gpus {
        0..=1 => &PHILLY_SECS_ONE_GPU,
        2..=8 => &PHILLY_SECS_ONE_NODE,
        _ => &PHILLY_SECS_MULTI_NODE,
    };
    let secs = sample::from_quantiles(rng, quantiles).clamp(PHILLY_SECS_RANGE.0, PHILLY_SECS_RANGE.1);
    (gpus.min(max_gang_gpus), secs.round() as u64)
}

/// An LLM-like job: a gang size from [`LLM_GPUS`] (capped at `max_gang_gpus`, in whole nodes when
/// the cap allows) and a log-normal run time.
fn llm_job(rng: &mut impl Rng, max_gang_gpus: u32) -> (u32, u64) {
    let mut gpus = pick(rng, &LLM_GPUS);
    if gpus > max_gang_gpus {
        gpus =
            if max_gang_gpus >= LLM_GANG_STEP { max_gang_gpus / LLM_GANG_STEP * LLM_GANG_STEP } else { max_gang_gpus };
    }
    let secs = sample::log_normal(rng, LLM_MEDIAN_SECS, LLM_SIGMA).clamp(LLM_SECS_RANGE.0, LLM_SECS_RANGE.1);
    (gpus, secs.round() as u64)
}

/// A value from `(value, weight)` pairs, with probability proportional to the weight.
fn pick(rng: &mut impl Rng, table: &[(u32, f64)]) -> u32 {
    let weights: Vec<f64> = table.iter().map(|&(_, weight)| weight).collect();
    sample::weighted_index(rng, &weights).and_then(|index| table.get(index)).map_or(1, |&(value, _)| value)
}

/// Start times of `count` submissions: a Poisson process whose rate follows a day/night cycle
/// (peak three times the trough) and averages one submission per `mean_gap_secs`. Drawn by
/// thinning: candidates come at the peak rate and each is kept with probability rate / peak.
fn diurnal_arrivals(rng: &mut impl Rng, count: usize, mean_gap_secs: f64) -> Vec<f64> {
    let peak_gap_secs = mean_gap_secs / (1.0 + DIURNAL_AMPLITUDE);
    let phase = rng.random::<f64>() * std::f64::consts::TAU;
    let mut starts = Vec::with_capacity(count);
    let mut now = 0.0;
    while starts.len() < count {
        now += sample::exponential(rng, peak_gap_secs);
        let angle = std::f64::consts::TAU * now / DAY_SECS + phase;
        let keep = (1.0 + DIURNAL_AMPLITUDE * angle.sin()) / (1.0 + DIURNAL_AMPLITUDE);
        // The rate never drops below a third of the peak, so this ends; a NaN (a clock gone
        // infinite) keeps the candidate rather than loop forever.
        if keep.is_nan() || sample::chance(rng, keep) {
            starts.push(now);
        }
    }
    starts
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn offered_load(jobs: &[RawJob], capacity_gpus: u64) -> f64 {
        let gpu_secs: f64 = jobs.iter().map(|j| f64::from(j.gpus) * j.duration_secs as f64).sum();
        let span = jobs.last().unwrap().submit_secs as f64;
        gpu_secs / (span * capacity_gpus as f64)
    }

    fn assert_sorted_from_zero(jobs: &[RawJob]) {
        assert_eq!(jobs.first().unwrap().submit_secs, 0);
        assert!(jobs.windows(2).all(|w| w[0].submit_secs <= w[1].submit_secs));
    }

    #[test]
    fn profile_names_round_trip_and_unknown_names_list_the_choices() {
        for profile in Profile::ALL {
            assert_eq!(profile.name().parse::<Profile>().unwrap(), profile);
            assert_eq!(profile.to_string(), profile.name());
        }
        let err = "huge".parse::<Profile>().unwrap_err().to_string();
        assert_eq!(err, "unknown profile `huge`; expected one of: philly, llm, mixed");
        assert_eq!(Profile::Philly.default_jobs(), 20_000);
        assert_eq!(Profile::Llm.default_jobs(), 2_000);
        assert_eq!(Profile::Mixed.default_jobs(), 10_000);
    }

    #[test]
    fn the_same_seed_gives_the_same_jobs_and_another_seed_does_not() {
        for profile in Profile::ALL {
            let a = synthesize(profile, 500, 1.0, 256, 512, 7);
            assert_eq!(a, synthesize(profile, 500, 1.0, 256, 512, 7));
            assert_ne!(a, synthesize(profile, 500, 1.0, 256, 512, 8));
        }
    }

    #[test]
    fn submit_times_offer_the_requested_load() {
        for profile in Profile::ALL {
            for (load, capacity) in [(0.5, 1_000), (1.0, 512), (2.5, 4_096)] {
                let jobs = synthesize(profile, 3_000, load, capacity, 256, 11);
                assert_eq!(jobs.len(), 3_000);
                assert_sorted_from_zero(&jobs);
                let measured = offered_load(&jobs, capacity);
                assert!((measured / load - 1.0).abs() < 0.02, "{profile} load {load}: measured {measured}");
            }
        }
    }

    #[test]
    fn philly_jobs_are_mostly_one_gpu_with_heavy_tailed_run_times() {
        let jobs = synthesize(Profile::Philly, 20_000, 1.0, 1_000, 128, 3);
        let one_gpu = jobs.iter().filter(|j| j.gpus == 1).count() as f64 / jobs.len() as f64;
        assert!(one_gpu >= 0.85, "{one_gpu}");
        assert!(jobs.iter().any(|j| j.gpus > 8));
        assert!(jobs.iter().all(|j| (30..=2_592_000).contains(&j.duration_secs)));
        let mut secs: Vec<u64> = jobs.iter().map(|j| j.duration_secs).collect();
        secs.sort_unstable();
        let at = |q: f64| secs[(secs.len() as f64 * q) as usize] as f64;
        assert!((600.0..2_000.0).contains(&at(0.5)), "p50 {}", at(0.5));
        assert!((6_000.0..20_000.0).contains(&at(0.9)), "p90 {}", at(0.9));
        assert!((100_000.0..600_000.0).contains(&at(0.99)), "p99 {}", at(0.99));

        let mut per_tenant: BTreeMap<&str, usize> = BTreeMap::new();
        for job in &jobs {
            *per_tenant.entry(job.tenant.as_str()).or_default() += 1;
        }
        assert!(per_tenant.len() <= 15 && per_tenant.len() >= 12, "{per_tenant:?}");
        let largest = per_tenant.values().max().copied().unwrap() as f64 / jobs.len() as f64;
        assert!((0.35..0.65).contains(&largest), "{largest}");
        assert!(per_tenant.contains_key("t01"));
    }

    #[test]
    fn llm_gangs_are_large_but_never_above_the_cap() {
        let jobs = synthesize(Profile::Llm, 2_000, 1.0, 4_096, 512, 5);
        assert!(jobs.iter().any(|j| j.gpus >= 128));
        assert!(jobs.iter().all(|j| j.gpus <= 512 && j.gpus >= 1));
        assert!(jobs.iter().all(|j| j.gpus <= 8 || j.gpus % 8 == 0));
        let mean_hours = jobs.iter().map(|j| j.duration_secs as f64).sum::<f64>() / jobs.len() as f64 / 3_600.0;
        assert!((4.0..8.0).contains(&mean_hours), "{mean_hours}");

        let capped = synthesize(Profile::Llm, 2_000, 1.0, 4_096, 100, 5);
        assert!(capped.iter().all(|j| j.gpus <= 100));
        assert!(capped.iter().any(|j| j.gpus == 96));
        let tiny = synthesize(Profile::Mixed, 500, 1.0, 64, 0, 5);
        assert!(tiny.iter().all(|j| j.gpus == 1));
    }

    #[test]
    fn mixed_has_both_kinds_of_jobs() {
        let jobs = synthesize(Profile::Mixed, 10_000, 1.0, 2_048, 512, 9);
        let large = jobs.iter().filter(|j| j.gpus >= 128).count() as f64 / jobs.len() as f64;
        let one_gpu = jobs.iter().filter(|j| j.gpus == 1).count() as f64 / jobs.len() as f64;
        assert!((0.04..0.1).contains(&large), "{large}");
        assert!((0.6..0.75).contains(&one_gpu), "{one_gpu}");
    }

    #[test]
    fn arrivals_are_bursty() {
        let jobs = synthesize(Profile::Philly, 20_000, 1.0, 1_000, 128, 4);
        let mut gaps: Vec<u64> = jobs.windows(2).map(|w| w[1].submit_secs - w[0].submit_secs).collect();
        gaps.sort_unstable();
        let median = gaps[gaps.len() / 2] as f64;
        let mean = gaps.iter().sum::<u64>() as f64 / gaps.len() as f64;
        assert!(mean > 3.0 * median.max(1.0), "median {median}, mean {mean}");
    }

    #[test]
    fn degenerate_arguments_do_not_panic() {
        assert!(synthesize(Profile::Philly, 0, 1.0, 100, 8, 1).is_empty());
        let one = synthesize(Profile::Llm, 1, 1.0, 100, 8, 1);
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].submit_secs, 0);
        for (load, capacity) in [(0.0, 100), (-1.0, 100), (f64::NAN, 100), (f64::INFINITY, 100), (1.0, 0), (1e-300, 1)]
        {
            let jobs = synthesize(Profile::Mixed, 50, load, capacity, 64, 1);
            assert_eq!(jobs.len(), 50);
            assert_sorted_from_zero(&jobs);
        }
        let packed = synthesize(Profile::Philly, 50, 1e12, 1, 8, 1);
        assert_sorted_from_zero(&packed);
        assert!(packed.last().unwrap().submit_secs <= 1);
    }
}
