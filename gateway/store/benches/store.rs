//! Store throughput and recovery on the real disk, printed as Markdown.
//!
//! `cargo bench -p meridian-store --bench store`. The data goes under `$MERIDIAN_BENCH_DIR`, else
//! Cargo's target `tmp` directory (not `/tmp`, which may be a tmpfs with no real fsync).
//!
//! A shared disk's fsync rate swings by several times from one second to the next, so the
//! throughput rows are interleaved: every round gives each row a short slice, and the table shows
//! each row's median slice and its range. Rows measured side by side are then comparable even when
//! the absolute figures move. The whole run takes about half a minute.

use std::error::Error;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use meridian_store::{RedbStore, Store, Write};

type BenchResult<T = ()> = Result<T, Box<dyn Error>>;

/// The sizes of one run: the full bench (`cargo bench` passes `--bench`), or one short pass
/// under `cargo test --benches`, which the test suite runs so that the bench cannot rot unseen.
#[derive(Clone, Copy)]
struct Scale {
    /// Rounds of the interleaved throughput rows.
    rounds: usize,
    /// How long each row runs in each round.
    slice: Duration,
    /// Records in the recovery and import rows.
    recovery_records: usize,
}

impl Scale {
    fn from_args() -> Self {
        if std::env::args().any(|a| a == "--bench") {
            Self { rounds: 8, slice: Duration::from_millis(250), recovery_records: 100_000 }
        } else {
            println!("(short pass: `cargo bench` runs the full bench; these figures are no result)\n");
            Self { rounds: 1, slice: Duration::from_millis(20), recovery_records: 2_000 }
        }
    }
}
/// Size of a job-like value.
const VALUE_BYTES: usize = 600;

/// One throughput row: a step (one sync or commit of `per_step` records) and its measured rates.
struct Row<'a> {
    what: String,
    per_step: usize,
    step: Box<dyn FnMut(usize) -> BenchResult + 'a>,
    steps_done: usize,
    /// Steps per second, one per round.
    rates: Vec<f64>,
}

impl<'a> Row<'a> {
    fn new(what: &str, per_step: usize, step: impl FnMut(usize) -> BenchResult + 'a) -> Self {
        Row { what: what.to_string(), per_step, step: Box::new(step), steps_done: 0, rates: Vec::new() }
    }

    fn run_slice(&mut self, slice: Duration) -> BenchResult {
        let start = Instant::now();
        let mut steps = 0;
        while start.elapsed() < slice {
            (self.step)(self.steps_done)?;
            self.steps_done += 1;
            steps += 1;
        }
        self.rates.push(steps as f64 / start.elapsed().as_secs_f64());
        Ok(())
    }

    fn print(&mut self) {
        self.rates.sort_by(f64::total_cmp);
        let median = self.rates[self.rates.len() / 2];
        let (low, high) = (self.rates[0], self.rates[self.rates.len() - 1]);
        let records = |rate: f64| rate * self.per_step as f64;
        println!(
            "| {} | {} | {} | {} | {} – {} |",
            self.what,
            self.per_step,
            thousands(median),
            thousands(records(median)),
            thousands(records(low)),
            thousands(records(high))
        );
    }
}

fn main() -> BenchResult {
    let scale = Scale::from_args();
    let base = match std::env::var_os("MERIDIAN_BENCH_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
    };
    std::fs::create_dir_all(&base)?;
    let scratch = tempfile::Builder::new().prefix("store-bench-").tempdir_in(&base)?;
    let dir = scratch.path();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    println!("data in {} (filesystem: {})", dir.display(), filesystem_of(dir));
    println!();

    let mut rows = vec![Row::new("raw `fdatasync` after a 600-byte append", 1, fdatasync_step(dir)?)];
    for per_commit in [1, 16, 64] {
        let store = RedbStore::open(&dir.join(format!("redb-{per_commit}")))?;
        let runtime = &runtime;
        rows.push(Row::new("`RedbStore::commit` (redb, two-phase commit)", per_commit, move |commit| {
            runtime.block_on(store.commit(job_batch(commit, per_commit)))?;
            Ok(())
        }));
    }
    for per_commit in [1, 64] {
        let step = one_phase_step(&dir.join(format!("redb-1pc-{per_commit}")), per_commit)?;
        rows.push(Row::new("redb, one-phase commit (redb's default; comparison only)", per_commit, step));
    }
    for per_sync in [1, 64] {
        let step = old_log_step(&dir.join(format!("log-{per_sync}.jsonl")), per_sync)?;
        rows.push(Row::new("old log: JSON lines appended, then `sync_data`", per_sync, step));
    }
    for _ in 0..scale.rounds {
        for row in &mut rows {
            row.run_slice(scale.slice)?;
        }
    }
    println!(
        "| what | records per sync or commit | median syncs or commits/s | median records/s | records/s, \
         slowest – fastest of {} slices |",
        scale.rounds
    );
    println!("| --- | ---: | ---: | ---: | ---: |");
    for row in &mut rows {
        row.print();
    }
    drop(rows);

    println!();
    runtime.block_on(recovery(&dir.join("recovery"), scale.recovery_records))?;
    runtime.block_on(import(&dir.join("import"), scale.recovery_records))?;
    Ok(())
}

fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A 600-byte JSON value shaped like a job record.
fn job_value(index: usize) -> Vec<u8> {
    let mut value = format!(
        "{{\"id\":\"job-{index:08}\",\"tenant\":\"team-{}\",\"gang\":{{\"replicas\":4,\"gpus_per_replica\":8}},\
         \"state\":\"queued\",\"priority\":{},\"submitted_at\":\"2026-12-03T10:00:00Z\",\"padding\":\"",
        index % 17,
        index % 5
    );
    while value.len() < VALUE_BYTES - 2 {
        value.push('x');
    }
    value.push_str("\"}");
    value.into_bytes()
}

/// The `commit`-th batch of `per_commit` new job records.
fn job_batch(commit: usize, per_commit: usize) -> Vec<Write> {
    (0..per_commit)
        .map(|offset| {
            let index = commit * per_commit + offset;
            Write::put(format!("jobs/{index:08}"), job_value(index))
        })
        .collect()
}

fn fdatasync_step(dir: &Path) -> BenchResult<impl FnMut(usize) -> BenchResult + use<>> {
    let mut file = OpenOptions::new().create(true).append(true).open(dir.join("fdatasync.bin"))?;
    let record = vec![b'x'; VALUE_BYTES];
    Ok(move |_| {
        file.write_all(&record)?;
        file.sync_data()?;
        Ok(())
    })
}

/// A commit as `RedbStore` makes it, but with redb's default one-phase commit.
fn one_phase_step(dir: &Path, per_commit: usize) -> BenchResult<impl FnMut(usize) -> BenchResult + use<>> {
    const TABLE: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("entries");
    std::fs::create_dir_all(dir)?;
    let db = redb::Database::create(dir.join("one-phase.redb"))?;
    Ok(move |commit| {
        let transaction = db.begin_write()?;
        {
            let mut table = transaction.open_table(TABLE)?;
            for write in job_batch(commit, per_commit) {
                if let Write::Put { key, value } = write {
                    table.insert(key.as_str(), value.as_slice())?;
                }
            }
        }
        transaction.commit()?;
        Ok(())
    })
}

fn old_log_line(index: usize) -> BenchResult<Vec<u8>> {
    let value = String::from_utf8(job_value(index))?;
    let mut line = serde_json::to_vec(&serde_json::json!({ "key": format!("jobs/{index:08}"), "value": value }))?;
    line.push(b'\n');
    Ok(line)
}

fn old_log_step(path: &Path, per_sync: usize) -> BenchResult<impl FnMut(usize) -> BenchResult + use<>> {
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    Ok(move |sync: usize| {
        for offset in 0..per_sync {
            file.write_all(&old_log_line(sync * per_sync + offset)?)?;
        }
        file.sync_data()?;
        Ok(())
    })
}

async fn recovery(dir: &Path, records: usize) -> BenchResult {
    let store = RedbStore::open(dir)?;
    for commit in 0..records / 1000 {
        store.commit(job_batch(commit, 1000)).await?;
    }
    drop(store);
    let file_bytes = std::fs::metadata(dir.join("meridian.redb"))?.len();

    // Three rounds, each a fresh open of the closed file (the OS page cache stays warm).
    for round in 1..=3 {
        let start = Instant::now();
        let store = RedbStore::open(dir)?;
        let opened = start.elapsed();
        let entries = store.scan("").await?;
        let total = start.elapsed();
        if entries.len() != records {
            return Err(format!("expected {records} records, scanned {}", entries.len()).into());
        }
        println!(
            "recovery {round}/3: {} records of {VALUE_BYTES} B ({:.0} MiB file): open (with integrity check) {:.0} ms \
             + full scan {:.0} ms = {:.0} ms",
            thousands(records as f64),
            file_bytes as f64 / (1024.0 * 1024.0),
            opened.as_secs_f64() * 1000.0,
            (total - opened).as_secs_f64() * 1000.0,
            total.as_secs_f64() * 1000.0
        );
    }
    Ok(())
}

async fn import(dir: &Path, records: usize) -> BenchResult {
    std::fs::create_dir_all(dir)?;
    let mut log = Vec::new();
    for index in 0..records {
        log.extend(old_log_line(index)?);
    }
    std::fs::write(dir.join("log.jsonl"), &log)?;
    let start = Instant::now();
    let store = RedbStore::open(dir)?;
    let imported = store.scan("").await?.len();
    println!(
        "one-time import of a {:.0} MiB log.jsonl ({} records) + open + full scan: {:.0} ms",
        log.len() as f64 / (1024.0 * 1024.0),
        thousands(imported as f64),
        start.elapsed().as_secs_f64() * 1000.0
    );
    Ok(())
}

/// The filesystem type holding `path`, from /proc/mounts (longest matching mount point).
fn filesystem_of(path: &Path) -> String {
    let Ok(path) = path.canonicalize() else { return "unknown".to_string() };
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else { return "unknown".to_string() };
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let device = fields.next()?;
            let mount_point = fields.next()?;
            let kind = fields.next()?;
            path.starts_with(mount_point).then(|| (mount_point.len(), format!("{kind} on {device}")))
        })
        .max_by_key(|(length, _)| *length)
        .map(|(_, description)| description)
        .unwrap_or_else(|| "unknown".to_string())
}
