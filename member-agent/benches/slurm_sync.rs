//! Agent overhead on Slurm: what the Slurm backend costs with 1,000 Meridian jobs held.
//!
//! Needs a real Slurm: `scripts/slurm/up.sh DIR`, then
//! `MERIDIAN_SLURM_ENV=DIR/env cargo bench -p meridian-agent --bench slurm_sync`.
//!
//! How it is built:
//! - 1,000 held jobs (`sbatch --hold`, 1 GPU each) carrying bench-only bindings in their comment
//!   (`mbench<pid>:bench-N:1`), submitted by four threads of `sbatch` calls. Not an array job: the
//!   tasks of an array share one comment, so they would be one binding, not 1,000.
//! - A [`SlurmBackend`] with that `jobTag` and the default `pollInterval`; one `list` adopts and
//!   tracks all 1,000 bindings, as a restarted agent does.
//! - Wall time of `sync_status` (one status poll: `squeue` over all jobs, diffed), `list`,
//!   `inventory` and `pressure`, 20 runs each; p50 and p99 (with 20 runs, p99 is the slowest).
//! - CPU per minute: the backend's own status loop runs alone for 60 s; the agent process's
//!   utime+stime and its reaped children's cutime+cstime (the `squeue` it runs) come from
//!   `/proc/self/stat`, the controller's from `/proc/<slurmctld>/stat`, before and after.
//! - The bench's jobs are cancelled at the end (also when a step fails).
//!
//! `MERIDIAN_BENCH_JOBS` and `MERIDIAN_BENCH_WINDOW_SECS` shrink the run for a quick check.
//! Run without cargo bench's `--bench` flag (`cargo test --bench '*'`, as the test suite does) it
//! makes one short pass: 20 jobs, 3 runs, a 3 s window. Without a Slurm it then fails like the
//! Slurm tests do, unless `MERIDIAN_SKIP_SLURM=1` says to skip it knowingly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use meridian_agent::backend::slurm::read_env_file;
use meridian_agent::backend::{InventorySource, LocalBackend, SlurmBackend, SlurmConfig};

const CLK_TCK: f64 = 100.0; // Linux's USER_HZ (`getconf CLK_TCK`).

fn main() {
    if let Err(e) = run() {
        eprintln!("slurm_sync: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let quick = !std::env::args().any(|a| a == "--bench");
    if quick {
        println!("(short pass: `cargo bench` runs the full bench; these figures are no result)\n");
    }
    let Ok(env_path) = std::env::var("MERIDIAN_SLURM_ENV") else {
        if quick && std::env::var("MERIDIAN_SKIP_SLURM").is_ok_and(|v| v == "1") {
            println!("slurm_sync: skipped (MERIDIAN_SKIP_SLURM=1)");
            return Ok(());
        }
        eprintln!(
            "slurm_sync: needs a real Slurm. Start one with `scripts/slurm/up.sh DIR` and run \
             `MERIDIAN_SLURM_ENV=DIR/env cargo bench -p meridian-agent --bench slurm_sync`"
        );
        std::process::exit(2);
    };
    let env = read_env(Path::new(&env_path))?;
    let (jobs, window, runs) = if quick { (20, 3, 3) } else { (1000, 60, 20) };
    let jobs: usize = number("MERIDIAN_BENCH_JOBS", jobs)?;
    let window = Duration::from_secs(number("MERIDIAN_BENCH_WINDOW_SECS", window)?);
    let field = |key: &str| env.get(key).with_context(|| format!("{env_path}: no {key}"));
    let dir = PathBuf::from(field("MERIDIAN_SLURM_DIR")?);
    let bin_dir = PathBuf::from(field("MERIDIAN_SLURM_BIN_DIR")?);
    let slurm_conf = PathBuf::from(field("SLURM_CONF")?);
    let partition = field("MERIDIAN_SLURM_PARTITION")?.clone();
    let tag = format!("mbench{}", std::process::id());

    let started = Instant::now();
    let (ids, failed) = submit_held(&bin_dir, &slurm_conf, &partition, &tag, jobs);
    let submitted = started.elapsed();
    let result = failed.map_or(Ok(()), Err).and_then(|()| {
        println!("submitted {} held jobs with tag `{tag}` in {:.1} s", ids.len(), submitted.as_secs_f64());
        let config = SlurmConfig {
            partition: Some(partition.clone()),
            gpu_types: [("a100".to_string(), "a100-80g".to_string())].into(),
            work_dir: dir.join("work"),
            bin_dir: Some(bin_dir.clone()),
            slurm_conf: Some(slurm_conf.clone()),
            job_tag: tag.clone(),
            ..SlurmConfig::default()
        };
        let controller_pid = std::fs::read_to_string(dir.join("run/slurmctld.pid")).ok();
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        runtime.block_on(measure(config, jobs, runs, window, controller_pid.as_deref().map(str::trim)))
    });
    cancel(&bin_dir, &slurm_conf, &ids);
    result
}

async fn measure(
    config: SlurmConfig,
    jobs: usize,
    runs: usize,
    window: Duration,
    controller_pid: Option<&str>,
) -> Result<()> {
    let poll_interval = config.poll_interval.0;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let backend = SlurmBackend::new(config, "bench".into(), tx)
        .await
        .map_err(|e| anyhow::anyhow!("starting the backend: {e}"))?;
    let held = backend.list().await.map_err(|e| anyhow::anyhow!("list: {e}"))?;
    if held.len() != jobs {
        bail!("the backend adopted {} bindings, not {jobs}", held.len());
    }

    let mut rows = Vec::new();
    let mut times = Vec::new();
    let mut events = 0;
    for _ in 0..runs {
        let t = Instant::now();
        events += backend.sync_status().await.map_err(|e| anyhow::anyhow!("sync_status: {e}"))?;
        times.push(t.elapsed());
    }
    rows.push(("status sync (sync_status)", times));
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let listed = backend.list().await.map_err(|e| anyhow::anyhow!("list: {e}"))?;
        times.push(t.elapsed());
        if listed.len() != jobs {
            bail!("list returned {} bindings, not {jobs}", listed.len());
        }
    }
    rows.push(("list", times));
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        backend.inventory().await.map_err(|e| anyhow::anyhow!("inventory: {e}"))?;
        times.push(t.elapsed());
    }
    rows.push(("inventory", times));
    let mut times = Vec::new();
    let mut pending = 0;
    for _ in 0..runs {
        let t = Instant::now();
        let pressure = backend.pressure().await.map_err(|e| anyhow::anyhow!("pressure: {e}"))?;
        times.push(t.elapsed());
        pending = pressure.pending_jobs();
    }
    rows.push(("pressure", times));

    // The status loop alone: nothing else runs in this process during the window.
    let before = (own_ticks()?, controller_pid.map(ticks_of).transpose()?);
    let t = Instant::now();
    tokio::time::sleep(window).await;
    let secs = t.elapsed().as_secs_f64();
    let after = (own_ticks()?, controller_pid.map(ticks_of).transpose()?);
    while rx.try_recv().is_ok() {
        events += 1;
    }
    drop(backend);

    println!("\n{jobs} held bindings, {runs} runs each (pressure counts {pending} pending jobs)\n");
    println!("| call | p50 | p99 | max |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, mut times) in rows {
        times.sort();
        println!(
            "| {name} | {} | {} | {} |",
            ms(pick(&times, 0.50)),
            ms(pick(&times, 0.99)),
            ms(times[times.len() - 1])
        );
    }
    let per_minute = |ticks: u64| ticks as f64 / CLK_TCK * 60.0 / secs;
    println!("\nstatus loop alone for {secs:.0} s at pollInterval {poll_interval:?} ({events} events sent in all):\n");
    println!("| CPU | seconds per minute |");
    println!("| --- | ---: |");
    println!("| agent process (utime+stime) | {:.2} |", per_minute(after.0.own - before.0.own));
    println!(
        "| its children: squeue, scontrol (cutime+cstime) | {:.2} |",
        per_minute(after.0.children - before.0.children)
    );
    if let (Some(b), Some(a)) = (before.1, after.1) {
        println!("| slurmctld (whole controller, for scale) | {:.2} |", per_minute(a - b));
    }
    Ok(())
}

struct Ticks {
    own: u64,
    children: u64,
}

/// utime, stime, cutime, cstime of this process (fields 14–17 of `/proc/self/stat`).
fn own_ticks() -> Result<Ticks> {
    let f = stat_fields("/proc/self/stat")?;
    Ok(Ticks { own: f[0] + f[1], children: f[2] + f[3] })
}

fn ticks_of(pid: &str) -> Result<u64> {
    let f = stat_fields(&format!("/proc/{pid}/stat"))?;
    Ok(f[0] + f[1])
}

/// Fields 14–17 of a `/proc/PID/stat` (after the parenthesised command name).
fn stat_fields(path: &str) -> Result<Vec<u64>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let rest = text.rsplit_once(')').map(|(_, r)| r).with_context(|| format!("{path}: no `)`"))?;
    // After `)`: state is field 3, so utime (14) is the 12th word.
    let words: Vec<&str> = rest.split_whitespace().collect();
    words
        .get(11..15)
        .with_context(|| format!("{path}: too few fields"))?
        .iter()
        .map(|w| w.parse::<u64>().with_context(|| format!("{path}: `{w}` is not a number")))
        .collect()
}

fn pick(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn number<T: std::str::FromStr>(key: &str, default: T) -> Result<T> {
    match std::env::var(key) {
        Ok(v) => v.parse().map_err(|_| anyhow::anyhow!("{key}: `{v}` is not a number")),
        Err(_) => Ok(default),
    }
}

fn read_env(path: &Path) -> Result<BTreeMap<String, String>> {
    read_env_file(path).with_context(|| format!("MERIDIAN_SLURM_ENV={}", path.display()))
}

fn slurm(bin_dir: &Path, slurm_conf: &Path, tool: &str) -> Command {
    let mut command = Command::new(bin_dir.join(tool));
    command.env("SLURM_CONF", slurm_conf);
    command
}

/// Submits `jobs` held 1-GPU jobs from four threads; returns the Slurm ids of those submitted,
/// and the first error if any `sbatch` failed.
fn submit_held(
    bin_dir: &Path,
    slurm_conf: &Path,
    partition: &str,
    tag: &str,
    jobs: usize,
) -> (Vec<String>, Option<anyhow::Error>) {
    const THREADS: usize = 4;
    let results: Vec<(Vec<String>, Result<()>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                scope.spawn(move || {
                    let mut ids = Vec::new();
                    let result = submit_some(bin_dir, slurm_conf, partition, tag, (t..jobs).step_by(THREADS), &mut ids);
                    (ids, result)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| (Vec::new(), Err(anyhow::anyhow!("a submitting thread panicked")))))
            .collect()
    });
    let mut ids = Vec::new();
    let mut failed = None;
    for (some, result) in results {
        ids.extend(some);
        if let Err(e) = result {
            failed.get_or_insert(e);
        }
    }
    (ids, failed)
}

fn submit_some(
    bin_dir: &Path,
    slurm_conf: &Path,
    partition: &str,
    tag: &str,
    which: impl Iterator<Item = usize>,
    ids: &mut Vec<String>,
) -> Result<()> {
    for i in which {
        let out = slurm(bin_dir, slurm_conf, "sbatch")
            .args(["--parsable", "--hold", "--mem=100", "--gres=gpu:a100:1", "--wrap=true"])
            .arg(format!("--partition={partition}"))
            .arg(format!("--comment={tag}:bench-{i}:1"))
            .arg(format!("--job-name=bench-{i}"))
            .output()
            .context("running sbatch")?;
        if !out.status.success() {
            bail!("sbatch: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let id = text.trim().split(';').next().unwrap_or("").to_string();
        if id.is_empty() {
            bail!("sbatch --parsable printed no job id: {text:?}");
        }
        ids.push(id);
    }
    Ok(())
}

fn cancel(bin_dir: &Path, slurm_conf: &Path, ids: &[String]) {
    for chunk in ids.chunks(200) {
        match slurm(bin_dir, slurm_conf, "scancel").args(chunk).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!("slurm_sync: scancel: {}", String::from_utf8_lossy(&out.stderr).trim()),
            Err(e) => eprintln!("slurm_sync: scancel: {e}"),
        }
    }
    println!("\ncancelled the bench's {} jobs", ids.len());
}
