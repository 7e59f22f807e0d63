//! `meridian sim`: the command line over the simulator.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use meridian_proto::config_file;
use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::Tier;

use super::engine::{self, SimConfig};
use super::metrics;
use super::plot::{self, PlotSeries};
use super::policy::Policy;
use super::preemption::{self, JobClass, PreemptionMix};
use super::progress::ReplayProgress;
use super::report::{self, Report};
use super::topology::Topology;
use super::workload::{self, DeadlineShare, EstimateError, FleetFacts, HomeCluster, HomeGpuType, Profile};
use super::{RunResult, SimError, Workload};
use meridian_cli::OutputFormat;
use meridian_placement::PlacementConfig;
use meridian_scheduler::QueuePolicy;

/// Largest `--jobs` accepted: beyond this a replay's memory grows past what a laptop offers.
const MAX_JOBS: usize = 5_000_000;
/// How often the progress bars read the replays' counters.
const PROGRESS_POLL: Duration = Duration::from_millis(200);

/// Replays a workload over a simulated federation in virtual time and reports what each
/// placement policy achieved.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// The simulated fleet: clusters, node shapes, prices and network (YAML; see deploy/sim/).
    #[arg(long, value_name = "FILE")]
    pub topology: PathBuf,
    /// Replay a trace in the Philly CSV format (timestamp,duration,num_gpus,gpu_time,cluster).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["profile", "load", "jobs"], required_unless_present = "profile")]
    pub trace: Option<PathBuf>,
    /// Generate a synthetic workload: philly, llm or mixed.
    #[arg(long, value_name = "NAME", requires = "load")]
    pub profile: Option<String>,
    /// Offered load of the synthetic workload: GPU-hours offered ÷ GPU-hours the owned clusters
    /// have over the arrival window (1.0 = exactly full), both in reference-GPU hours (each GPU
    /// weighted by its type's `gpuSpeed`).
    #[arg(long, value_name = "X")]
    pub load: Option<f64>,
    /// Number of synthetic jobs (default: the profile's).
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Seed of everything random: the generator, the decoration (datasets, GPU pins), estimate
    /// error, `random`.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Runtime estimates are wrong: each job's estimate is its true duration × exp(N(BIAS, SIGMA))
    /// (seeded, at least 1 s). The gateway and the members see only estimates; the true duration
    /// only decides when a job ends. Without it, estimates are exact (σ = 0).
    #[arg(long, value_name = "SIGMA[,BIAS]")]
    pub estimate_error: Option<EstimateError>,
    /// Give a seeded SHARE (0..1) of jobs a `runtime.deadline` of SLACK (default 3) × their
    /// runtime estimate after submission, and report deadline misses and the cloud dollars spent
    /// on those jobs per policy. Only `meridian` reads deadlines; the baselines ignore them.
    #[arg(long, value_name = "SHARE[,SLACK]")]
    pub deadlines: Option<DeadlineShare>,
    /// The placement policy to replay.
    #[arg(long, value_name = "NAME", required_unless_present = "compare", conflicts_with = "compare")]
    pub policy: Option<String>,
    /// Replay every policy on the same workload and compare them with `meridian`.
    #[arg(long)]
    pub compare: bool,
    /// Also write an SVG chart: queueing-delay CDF and cost per policy.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Also write every job's outcome under every policy replayed, one CSV row each (the
    /// per-job data behind the report's tables; columns in the header).
    #[arg(long, value_name = "FILE.csv")]
    pub jobs_out: Option<PathBuf>,
    /// Expected owned-cluster wait after which Meridian may burst a job to the cloud (each
    /// simulated job's `placement.burst.after`).
    #[arg(long, value_name = "DURATION", default_value = "30m")]
    pub burst_after: HumanDuration,
    /// Meridian's placement weights (YAML, the gateway config's `placement` section; see
    /// docs/operations.md). Without it, the gateway's defaults.
    #[arg(long, value_name = "FILE")]
    pub placement: Option<PathBuf>,
    /// Check after every event that no node is over-committed (slower).
    #[arg(long)]
    pub check: bool,
    /// Queue policy of every member, overriding the topology's `memberPolicy`: strict,
    /// bestEffort or backfill.
    #[arg(long, value_name = "POLICY")]
    pub member_policy: Option<QueuePolicy>,
    /// Mark a seeded share of jobs high priority and a share of the others preemptible (e.g.
    /// 0.1,0.5); members preempt for high-priority jobs and a table of their waits and the
    /// GPU-hours lost follows the report (table output).
    #[arg(long, value_name = "SHARE_HIGH,SHARE_PREEMPTIBLE")]
    pub preemption: Option<PreemptionMix>,
    /// With --preemption: members never preempt (the comparison without preemption).
    #[arg(long, requires = "preemption")]
    pub no_member_preemption: bool,
}

/// Runs the command, writing the report to `out` and progress to stderr.
pub fn run(args: &SimArgs, output: OutputFormat, out: &mut dyn Write) -> Result<(), SimError> {
    let mut topology = Topology::load(&args.topology)?;
    if let Some(policy) = args.member_policy {
        topology.clusters.iter_mut().for_each(|cluster| cluster.member_policy = policy);
    }
    let policies = policies(args)?;
    let placement = match &args.placement {
        Some(path) => {
            let placement = config_file::parse_yaml::<PlacementConfig>(&config_file::read(path)?, path)?;
            config_file::check(path, placement.problems(""))?;
            placement
        }
        None => PlacementConfig::default(),
    };
    let workload = build_workload(args, &topology)?;
    let started = Instant::now();
    let results = replay_all(&topology, &workload, args, &placement, &policies)?;
    let elapsed = started.elapsed();

    let runs: Vec<metrics::Metrics> = results.iter().map(|r| metrics::compute(&workload, r)).collect();
    let report = Report {
        topology: topology.name.clone(),
        workload: workload.source.clone(),
        seed: args.seed,
        jobs: workload.jobs.len(),
        tenants: workload.tenants.len(),
        offered_load: offered_load(&workload, &topology),
        runs,
    };
    if let Some(path) = &args.plot {
        let series: Vec<PlotSeries> = results
            .iter()
            .zip(&report.runs)
            .map(|(run, m)| PlotSeries {
                policy: run.policy.clone(),
                sorted_delays: metrics::sorted_delays(&workload, run),
                compute_usd: m.compute_usd,
                egress_usd: m.egress_usd,
            })
            .collect();
        let title = format!("{} on {}", workload.source, topology.name);
        write_file(path, &plot::render_svg(&title, &series)?)?;
    }
    if let Some(path) = &args.jobs_out {
        write_file(path, &jobs_csv(&workload, &results, args.preemption.as_ref(), args.seed))?;
    }
    let mut text = match output {
        OutputFormat::Json => report::to_json(&report).map_err(|e| SimError::Invalid(format!("JSON: {e}")))?,
        OutputFormat::Table => report::render_table(&report),
    };
    if let (Some(mix), OutputFormat::Table) = (&args.preemption, output) {
        let rows: Vec<_> = results.iter().map(|run| preemption::row(&workload, run, mix, args.seed)).collect();
        text.push_str(&preemption::render_table(mix, !args.no_member_preemption, &rows));
    }
    let io = |source| SimError::Io { path: PathBuf::from("<stdout>"), source };
    out.write_all(text.as_bytes()).map_err(io)?;
    out.flush().map_err(io)?;
    eprintln!(
        "replayed {} jobs under {} {} in {:.1} s",
        workload.jobs.len(),
        policies.len(),
        if policies.len() == 1 { "policy" } else { "policies" },
        elapsed.as_secs_f64()
    );
    Ok(())
}

fn policies(args: &SimArgs) -> Result<Vec<Policy>, SimError> {
    match (&args.policy, args.compare) {
        (_, true) => Ok(Policy::ALL.to_vec()),
        (Some(name), false) => Ok(vec![name.parse()?]),
        (None, false) => Err(SimError::Invalid("give --policy NAME or --compare".into())),
    }
}

/// The clusters tenants may call home: the owned ones, or every cluster of an all-cloud fleet.
pub fn home_clusters(topology: &Topology) -> Vec<HomeCluster> {
    let owned = topology.clusters.iter().any(|c| c.info.tier == Tier::Owned);
    topology
        .clusters
        .iter()
        .enumerate()
        .filter(|(_, c)| !owned || c.info.tier == Tier::Owned)
        .map(|(index, c)| HomeCluster {
            cluster: index,
            region: c.info.region.clone(),
            gpu_types: c
                .gpu_types()
                .into_iter()
                .map(|(name, gpus, gpus_per_node)| HomeGpuType { name, gpus, gpus_per_node })
                .collect(),
        })
        .collect()
}

/// GPUs the load factor is measured against: the owned tier (what is paid for already), or
/// the whole fleet when it has no owned cluster, in reference-GPU equivalents. Durations are
/// defined on the reference type (`gpuSpeed` 1.0), so a V100 at 0.4 offers 0.4 of a GPU-hour
/// per hour, and load 1.0 means the owned GPUs can just serve the demand.
pub fn capacity_gpus(topology: &Topology) -> u64 {
    match topology.owned_gpus() {
        0 => topology.reference_gpus_all(),
        _ => topology.owned_reference_gpus(),
    }
}

/// Reads or generates the workload named by `args` and decorates it for `topology`.
pub fn build_workload(args: &SimArgs, topology: &Topology) -> Result<Workload, SimError> {
    let homes = home_clusters(topology);
    let (raw, source) = match (&args.trace, &args.profile) {
        (Some(path), _) => (workload::read_philly(path)?, file_name(path)),
        (None, Some(name)) => {
            let profile: Profile = name.parse()?;
            let load = args.load.ok_or_else(|| SimError::Invalid("--load is required with --profile".into()))?;
            if !(load.is_finite() && load > 0.0 && load <= 20.0) {
                return Err(SimError::Invalid(format!("--load: expected a number in (0, 20], got {load}")));
            }
            let jobs = args.jobs.unwrap_or(profile.default_jobs());
            if jobs == 0 || jobs > MAX_JOBS {
                return Err(SimError::Invalid(format!("--jobs: expected 1 to {MAX_JOBS}, got {jobs}")));
            }
            // A gang runs on one GPU type: the largest one-type pool of any home bounds it.
            let max_gang = homes.iter().flat_map(|h| h.gpu_types.iter().map(|t| t.gpus)).max().unwrap_or(0);
            let max_gang = u32::try_from(max_gang).unwrap_or(u32::MAX);
            let raw = workload::synthesize(profile, jobs, load, capacity_gpus(topology), max_gang, args.seed);
            (raw, format!("{profile} profile, load {load}, {jobs} jobs"))
        }
        (None, None) => return Err(SimError::Invalid("give --trace FILE or --profile NAME --load X".into())),
    };
    let facts = FleetFacts { homes, regions: topology.regions() };
    let mut workload = workload::decorate(raw, &facts, args.seed, source);
    if let (None, Some(load)) = (&args.trace, args.load) {
        // Decoration shrinks gangs that do not fit their tenant's home; keep the load asked for.
        workload.scale_to_load(load, capacity_gpus(topology));
    }
    let error = args.estimate_error.unwrap_or(EstimateError::NONE);
    workload::apply_estimate_error(&mut workload, error, args.seed);
    if !error.is_exact() {
        workload.source = format!("{}, estimate error {error}", workload.source);
    }
    if let Some(mix) = &args.preemption {
        workload.source = format!("{}, {mix}", workload.source);
    }
    if let Some(deadlines) = args.deadlines {
        // After the estimate error: a deadline is set from the estimate the user gave.
        workload::apply_deadlines(&mut workload, deadlines, args.seed);
        workload.source = format!("{}, deadlines for {deadlines}", workload.source);
    }
    Ok(workload)
}

/// Offered GPU-seconds over the arrival window's capacity (see [`capacity_gpus`]).
pub fn offered_load(workload: &Workload, topology: &Topology) -> f64 {
    workload.offered_load(capacity_gpus(topology))
}

/// Replays every policy, on as many threads as there are cores, drawing one progress bar per
/// policy on a terminal's stderr. Results come back in `policies` order.
fn replay_all(
    topology: &Topology,
    workload: &Workload,
    args: &SimArgs,
    placement: &PlacementConfig,
    policies: &[Policy],
) -> Result<Vec<RunResult>, SimError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(policies.len()).max(1);
    let progress: Vec<AtomicU64> = policies.iter().map(|_| AtomicU64::new(0)).collect();
    // Longest first: `meridian` drives the whole gateway core and takes several times longer
    // than any baseline, so it starts at once while the others share the remaining cores.
    let mut start_order: Vec<usize> = (0..policies.len()).collect();
    start_order.sort_by_key(|&i| policies.get(i) != Some(&Policy::Meridian));
    let next = AtomicUsize::new(0);
    let mut slots: Vec<Option<Result<RunResult, SimError>>> = policies.iter().map(|_| None).collect();
    let draw = std::io::stderr().is_terminal();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    while let Some(&i) = start_order.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let (Some(&policy), Some(counter)) = (policies.get(i), progress.get(i)) else { break };
                        let config = SimConfig {
                            seed: args.seed,
                            burst_after_secs: args.burst_after.as_secs(),
                            check_invariants: args.check,
                            placement: placement.clone(),
                            preemption: args.preemption,
                            member_preemption: !args.no_member_preemption,
                            ..SimConfig::new(policy)
                        };
                        mine.push((i, engine::run(topology, workload, &config, counter)));
                    }
                    mine
                })
            })
            .collect();
        if draw {
            let bars = ReplayProgress::new(policies, workload.jobs.len() as u64, draw);
            // Until every worker is done, even one whose replay died partway.
            while !workers.iter().all(|w| w.is_finished()) {
                bars.update(&progress);
                std::thread::sleep(PROGRESS_POLL);
            }
            bars.clear();
        }
        for worker in workers {
            if let Ok(results) = worker.join() {
                for (i, result) in results {
                    if let Some(slot) = slots.get_mut(i) {
                        *slot = Some(result);
                    }
                }
            }
        }
    });
    slots
        .into_iter()
        .zip(policies)
        .map(|(slot, policy)| match slot {
            Some(Err(e)) => Err(SimError::Invalid(format!("policy {policy}: {e}"))),
            Some(ok) => ok,
            None => Err(SimError::Invalid(format!("policy {policy}: the replay thread died"))),
        })
        .collect()
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// Header of `--jobs-out`.
const JOBS_CSV_HEADER: &str = "policy,job,tenant,gpus,replicas,gpu_type,data_gib,data_region,submit_secs,\
estimate_secs,cluster,tier,start_secs,end_secs,queue_secs,moved_gb,compute_usd,egress_usd,priority,preemptible\n";

/// Every job's outcome under every run, as `--jobs-out` writes it, with its priority class under
/// `mix` (`--preemption`). Jobs without an outcome (which the engine never leaves) are skipped.
fn jobs_csv(workload: &Workload, results: &[RunResult], mix: Option<&PreemptionMix>, seed: u64) -> String {
    use std::fmt::Write as _;
    let mut text = String::from(JOBS_CSV_HEADER);
    for run in results {
        for outcome in &run.outcomes {
            let Some(job) = workload.jobs.get(outcome.job as usize) else { continue };
            let tenant = workload.tenants.get(job.tenant as usize).map_or("", |t| t.name.as_str());
            let cluster = run.clusters.get(outcome.cluster as usize);
            let (cluster, tier) =
                cluster.map_or(("", ""), |c| (c.name.as_str(), if c.tier == Tier::Cloud { "cloud" } else { "owned" }));
            let (data_gib, data_region) = job.dataset.as_ref().map_or((0.0, ""), |d| (d.size_gib, d.region.as_str()));
            let class = mix.map_or(JobClass::DEFAULT, |mix| mix.class_of(seed, job.id));
            let _ = writeln!(
                text,
                "{},{},{},{},{},{},{:.1},{},{},{},{},{},{},{},{},{:.1},{:.2},{:.2},{},{}",
                run.policy,
                job.id,
                tenant,
                u64::from(job.replicas) * u64::from(job.gpus_per_replica),
                job.replicas,
                job.gpu_type.as_deref().unwrap_or(""),
                data_gib,
                data_region,
                job.submit_secs,
                job.estimate_secs,
                cluster,
                tier,
                outcome.start_secs,
                outcome.end_secs,
                outcome.start_secs.saturating_sub(job.submit_secs),
                outcome.moved_gb,
                outcome.compute_usd,
                outcome.egress_usd,
                class.priority,
                class.preemptible,
            );
        }
    }
    text
}

fn write_file(path: &Path, text: &str) -> Result<(), SimError> {
    std::fs::write(path, text).map_err(|source| SimError::Io { path: path.to_path_buf(), source })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const HYBRID: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/sim/hybrid-3region.yaml");
    const PHILLY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/philly.csv");

    /// `--compare --check` of a synthetic `profile` over the hybrid fleet, every option at its
    /// default.
    pub(crate) fn args(profile: &str, load: f64, jobs: usize, seed: u64) -> SimArgs {
        SimArgs {
            topology: PathBuf::from(HYBRID),
            trace: None,
            profile: Some(profile.to_owned()),
            load: Some(load),
            jobs: Some(jobs),
            seed,
            estimate_error: None,
            deadlines: None,
            policy: None,
            compare: true,
            plot: None,
            jobs_out: None,
            burst_after: HumanDuration::from_secs(1800),
            placement: None,
            check: true,
            member_policy: None,
            preemption: None,
            no_member_preemption: false,
        }
    }

    fn output(args: &SimArgs, format: OutputFormat) -> Result<String, SimError> {
        let mut out = Vec::new();
        run(args, format, &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    #[test]
    fn same_seed_gives_identical_json_and_another_seed_differs() {
        let first = output(&args("mixed", 1.0, 300, 7), OutputFormat::Json).unwrap();
        let again = output(&args("mixed", 1.0, 300, 7), OutputFormat::Json).unwrap();
        assert_eq!(first, again);
        let other = output(&args("mixed", 1.0, 300, 8), OutputFormat::Json).unwrap();
        assert_ne!(first, other);

        let report: serde_json::Value = serde_json::from_str(&first).unwrap();
        let runs = report["runs"].as_array().unwrap();
        let names: Vec<&str> = runs.iter().map(|r| r["policy"].as_str().unwrap()).collect();
        assert_eq!(names, Policy::ALL.map(Policy::name));
        for run in runs {
            assert_eq!(run["overall"]["jobs"], 300, "every job finished once under {}", run["policy"]);
        }
        let load = report["offeredLoad"].as_f64().unwrap();
        assert!((load - 1.0).abs() < 0.01, "offered load {load}");
    }

    #[test]
    fn jobs_out_has_one_row_per_job_and_policy_matching_the_report() {
        let path = std::env::temp_dir().join(format!("meridian-jobs-out-{}.csv", std::process::id()));
        let with_file = SimArgs { jobs_out: Some(path.clone()), ..args("mixed", 1.0, 120, 3) };
        let report: serde_json::Value = serde_json::from_str(&output(&with_file, OutputFormat::Json).unwrap()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split(',').collect();
        let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.len(), 120 * Policy::ALL.len(), "one row per job and policy");
        for run in report["runs"].as_array().unwrap() {
            let policy = run["policy"].as_str().unwrap();
            let mine: Vec<&Vec<&str>> = rows.iter().filter(|r| r[column("policy")] == policy).collect();
            assert_eq!(mine.len(), 120, "{policy}");
            // The report's mean queueing delay is the mean of the rows' queue_secs.
            let mean = mine.iter().map(|r| r[column("queue_secs")].parse::<f64>().unwrap()).sum::<f64>() / 120.0;
            let reported = run["overall"]["queueMeanSecs"].as_f64().unwrap();
            assert!((mean - reported).abs() < 1e-6 * reported.max(1.0), "{policy}: {mean} vs {reported}");
            for row in mine {
                assert!(["owned", "cloud"].contains(&row[column("tier")]), "{row:?}");
                let (start, end) = (
                    row[column("start_secs")].parse::<u64>().unwrap(),
                    row[column("end_secs")].parse::<u64>().unwrap(),
                );
                assert!(end > start, "{row:?}");
            }
        }
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn estimate_error_flag_takes_sigma_and_bias_and_bad_values_name_the_flag() {
        use clap::Parser;
        let parse = |value: &str| {
            let argv = ["sim", "--topology", "f.yaml", "--profile", "llm", "--load", "1", "--compare"];
            let flag = format!("--estimate-error={value}");
            Cli::try_parse_from(argv.into_iter().chain([flag.as_str()])).map(|c| c.sim.estimate_error)
        };
        assert_eq!(parse("0.5").unwrap(), Some(EstimateError { sigma: 0.5, bias: 0.0 }));
        assert_eq!(parse("0.5,-0.2").unwrap(), Some(EstimateError { sigma: 0.5, bias: -0.2 }));
        for bad in ["lots", "-1", "0.5,high"] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains("--estimate-error") && (err.contains("SIGMA") || err.contains("BIAS")), "{err}");
        }
    }

    #[test]
    fn estimate_error_is_seeded_and_named_in_the_report() {
        let noisy = |seed| SimArgs {
            estimate_error: Some(EstimateError { sigma: 0.5, bias: 0.0 }),
            ..args("llm", 1.0, 60, seed)
        };
        let first = output(&noisy(4), OutputFormat::Json).unwrap();
        assert_eq!(first, output(&noisy(4), OutputFormat::Json).unwrap());
        assert!(first.contains("estimate error σ 0.5"), "{first}");
        let topology = Topology::load(Path::new(HYBRID)).unwrap();
        let estimates = |a: &SimArgs| -> Vec<u64> {
            build_workload(a, &topology).unwrap().jobs.iter().map(|j| j.estimate_secs).collect()
        };
        let exact = build_workload(&args("llm", 1.0, 60, 4), &topology).unwrap();
        assert!(exact.jobs.iter().all(|j| j.estimate_secs == j.duration_secs), "no flag: exact estimates");
        assert_ne!(estimates(&noisy(4)), estimates(&noisy(5)));
        // The error changes estimates only: the jobs themselves are those of the flag-less run.
        let noisy_jobs = build_workload(&noisy(4), &topology).unwrap().jobs;
        for (a, b) in exact.jobs.iter().zip(&noisy_jobs) {
            assert_eq!((a.submit_secs, a.duration_secs, a.gpus()), (b.submit_secs, b.duration_secs, b.gpus()));
        }
    }

    #[test]
    fn deadlines_are_seeded_and_reported_only_when_asked_for() {
        let due = |seed| SimArgs { deadlines: Some("0.3,2".parse().unwrap()), ..args("llm", 1.2, 80, seed) };
        let table = output(&due(2), OutputFormat::Table).unwrap();
        assert_eq!(table, output(&due(2), OutputFormat::Table).unwrap());
        assert!(table.contains("deadlines for 30% of jobs, due 2× their estimate"), "{table}");
        let section = table.split("\ndeadlines (only meridian").nth(1).unwrap_or_default();
        for policy in Policy::ALL {
            assert!(section.lines().any(|line| line.starts_with(policy.name())), "no {policy} row:\n{table}");
        }
        let json: serde_json::Value = serde_json::from_str(&output(&due(2), OutputFormat::Json).unwrap()).unwrap();
        let jobs = json["runs"][0]["deadlines"]["jobs"].as_u64().unwrap();
        assert!((10..=40).contains(&jobs), "about 30% of 80 jobs: {jobs}");

        let plain = output(&args("llm", 1.2, 80, 2), OutputFormat::Json).unwrap();
        assert!(!plain.contains("deadline"), "no --deadlines, no deadline output");
    }

    #[test]
    fn compare_table_and_plot_name_every_policy() {
        let dir = tempfile::tempdir().unwrap();
        let plot = dir.path().join("chart.svg");
        let mut a = args("llm", 0.8, 120, 1);
        a.plot = Some(plot.clone());
        let table = output(&a, OutputFormat::Table).unwrap();
        let svg = std::fs::read_to_string(&plot).unwrap();
        for policy in Policy::ALL {
            assert!(table.contains(policy.name()), "table lacks {policy}:\n{table}");
            assert!(svg.contains(policy.name()), "chart lacks {policy}");
        }
        assert!(table.contains("ratio to meridian"), "{table}");
    }

    #[test]
    fn bad_arguments_are_refused_with_the_flag_named() {
        let cases: Vec<(SimArgs, &str)> = vec![
            (SimArgs { load: Some(0.0), ..args("llm", 1.0, 10, 1) }, "--load"),
            (SimArgs { load: Some(f64::NAN), ..args("llm", 1.0, 10, 1) }, "--load"),
            (SimArgs { jobs: Some(0), ..args("llm", 1.0, 10, 1) }, "--jobs"),
            (SimArgs { profile: Some("bert".into()), ..args("llm", 1.0, 10, 1) }, "bert"),
            (SimArgs { compare: false, policy: Some("fastest".into()), ..args("llm", 1.0, 10, 1) }, "--policy"),
            (SimArgs { topology: PathBuf::from("/nonexistent/fleet.yaml"), ..args("llm", 1.0, 10, 1) }, "fleet.yaml"),
            (
                SimArgs {
                    trace: Some(PathBuf::from("/nonexistent/trace.csv")),
                    profile: None,
                    ..args("llm", 1.0, 10, 1)
                },
                "trace.csv",
            ),
        ];
        for (a, needle) in cases {
            let err = output(&a, OutputFormat::Table).unwrap_err().to_string();
            assert!(err.contains(needle), "expected `{needle}` in: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("placement.yaml");
        std::fs::write(&bad, "usdToSeconds: -1\n").unwrap();
        let err = output(&SimArgs { placement: Some(bad), ..args("llm", 1.0, 10, 1) }, OutputFormat::Table)
            .unwrap_err()
            .to_string();
        assert!(err.contains("usdToSeconds"), "{err}");
    }

    #[test]
    fn the_philly_trace_replays_with_every_job_once_and_gpu_seconds_conserved() {
        if !Path::new(PHILLY).exists() {
            println!("skipped: {PHILLY} is not present (see ../shared/traces/README.md)");
            return;
        }
        let topology = Topology::load(Path::new(HYBRID)).unwrap();
        let a = SimArgs {
            trace: Some(PathBuf::from(PHILLY)),
            profile: None,
            load: None,
            jobs: None,
            ..args("x", 1.0, 1, 1)
        };
        let mut workload = build_workload(&a, &topology).unwrap();
        assert_eq!(workload.jobs.len(), 82_247);
        // A debug build replays the first 3,000 jobs (a busy fortnight); release runs all of them.
        workload.jobs.truncate(3_000);
        for policy in Policy::ALL {
            let config = SimConfig { check_invariants: true, ..SimConfig::new(policy) };
            let run = engine::run(&topology, &workload, &config, &AtomicU64::new(0)).unwrap();
            assert_eq!(run.outcomes.len(), workload.jobs.len(), "{policy}");
            // Run time depends on the GPU type a job lands on (`gpuSpeed`), so the busy time the
            // clusters count must equal what the outcomes ran, job by job.
            let used: u64 = run.clusters.iter().map(|c| c.busy_gpu_secs).sum();
            let ran: u64 =
                run.outcomes.iter().map(|o| workload.jobs[o.job as usize].gpus() * (o.end_secs - o.start_secs)).sum();
            assert_eq!(used, ran, "{policy}");
        }
    }
}
