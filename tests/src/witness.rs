//! The job's own witness of how often and when it ran, kept outside the code under test.
//!
//! The `witness` binary of this crate runs as a job's `payload.command`. On start it writes
//! `<dir>/<job id>.<pid>`: a header line (job id, fencing token when the runner exports one, the
//! cluster of the agent that started it, pid, start time) and an `alive_ns=` field it overwrites
//! in place every [`TICK`] with the current time, until it is killed or its runtime is over.
//! Each file is one copy of the job, live over `[start_ns, alive_ns]`; [`Ledger::read`] reads
//! them all back and [`Ledger::overlaps`] finds any two copies of one job that were alive at the
//! same moment.
//!
//! Times are Unix nanoseconds from `SystemTime` (every process is on one machine, one clock).
//! A witness ends on SIGTERM's default action without a last stamp, so a copy's end is known to
//! within one tick (it cannot be earlier than `alive_ns`).
//!
//! This module uses only `std`: the binary includes it with `#[path]`, so the format is written
//! and read by the same code.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The payload `env` variable that names the directory witnesses write to.
pub const DIR_ENV: &str = "MERIDIAN_WITNESS_DIR";
/// The variable a test sets on an agent process so the jobs it starts (which inherit the
/// agent's environment) record which cluster ran them.
pub const CLUSTER_ENV: &str = "MERIDIAN_WITNESS_CLUSTER";
/// Variables a runner may export with the job's fencing token; the first one set is recorded.
pub const TOKEN_ENVS: [&str; 2] = ["MERIDIAN_FENCING_TOKEN", "MERIDIAN_BINDING"];
/// A file of this name in the witness directory makes every witness there exit (tear-down).
pub const STOP_FILE: &str = "STOP";
/// How often a witness stamps that it is alive.
pub const TICK: Duration = Duration::from_millis(5);

/// The field a witness overwrites in place; its value is always [`STAMP_WIDTH`] digits.
const ALIVE_KEY: &str = "alive_ns=";
/// Digits of a stamp (zero-padded, so the field never changes length).
const STAMP_WIDTH: usize = 20;

/// Why a witness file could not be read.
#[derive(Debug)]
pub enum WitnessError {
    /// The directory or a file could not be read.
    Io {
        /// What was being read.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// A file does not have the witness format.
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl fmt::Display for WitnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WitnessError::Io { path, source } => write!(f, "reading {}: {source}", path.display()),
            WitnessError::Malformed { path, reason } => {
                write!(f, "{} is not a witness file: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for WitnessError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WitnessError::Io { source, .. } => Some(source),
            WitnessError::Malformed { .. } => None,
        }
    }
}

/// Module result type.
pub type Result<T, E = WitnessError> = std::result::Result<T, E>;

/// One copy of a job: one process that ran it, as its witness file tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCopy {
    /// `MERIDIAN_JOB_ID` of the process.
    pub job_id: String,
    /// The fencing token, when the runner exported it.
    pub fencing_token: Option<u64>,
    /// The cluster of the agent that started it ([`CLUSTER_ENV`]), `-` when unset.
    pub cluster: String,
    /// Its process id.
    pub pid: u32,
    /// When it started (Unix ns).
    pub start_ns: u64,
    /// The last time it said it was alive (Unix ns).
    pub alive_ns: u64,
}

impl JobCopy {
    /// How long it was seen alive.
    pub fn lived(&self) -> Duration {
        Duration::from_nanos(self.alive_ns.saturating_sub(self.start_ns))
    }

    /// Whether it stamped within `within` before `now_ns` (a running copy stamps every [`TICK`]).
    pub fn alive_at(&self, now_ns: u64, within: Duration) -> bool {
        now_ns.saturating_sub(self.alive_ns) <= u64::try_from(within.as_nanos()).unwrap_or(u64::MAX)
    }

    /// `east pid 123 token 2 start +1.234s alive 0.500s`, times relative to `origin_ns`.
    pub fn describe(&self, origin_ns: u64) -> String {
        let token = self.fencing_token.map_or_else(|| "?".to_string(), |t| t.to_string());
        format!(
            "{} pid {} token {token} start {} alive {:.3}s (until {})",
            self.cluster,
            self.pid,
            relative(self.start_ns, origin_ns),
            self.lived().as_secs_f64(),
            relative(self.alive_ns, origin_ns),
        )
    }
}

/// Two copies of one job that were alive at the same moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The job.
    pub job_id: String,
    /// The copy that started first.
    pub first: JobCopy,
    /// The copy that started while `first` was alive.
    pub second: JobCopy,
}

impl Overlap {
    /// How long both were alive (zero when they met only at one instant).
    pub fn length(&self) -> Duration {
        let from = self.first.start_ns.max(self.second.start_ns);
        let until = self.first.alive_ns.min(self.second.alive_ns);
        Duration::from_nanos(until.saturating_sub(from))
    }
}

/// Every copy the witnesses of one directory recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Copies by job id, each job's in start order.
    copies: BTreeMap<String, Vec<JobCopy>>,
}

impl Ledger {
    /// Reads every witness file in `dir`. A file still being created (its temporary name) is
    /// not one yet; any other file that is not a witness file is an error.
    pub fn read(dir: &Path) -> Result<Self> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| WitnessError::Io { path, source }
        };
        let mut copies = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with('.') || name == STOP_FILE {
                continue;
            }
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            copies.push(parse(&text).map_err(|reason| WitnessError::Malformed { path: path.clone(), reason })?);
        }
        Ok(Self::from_copies(copies))
    }

    /// A ledger of the given copies.
    pub fn from_copies(copies: impl IntoIterator<Item = JobCopy>) -> Self {
        let mut by_job: BTreeMap<String, Vec<JobCopy>> = BTreeMap::new();
        for copy in copies {
            by_job.entry(copy.job_id.clone()).or_default().push(copy);
        }
        for list in by_job.values_mut() {
            list.sort_by_key(|c| (c.start_ns, c.pid));
        }
        Self { copies: by_job }
    }

    /// The jobs that ran at least once.
    pub fn jobs(&self) -> impl Iterator<Item = &str> {
        self.copies.keys().map(String::as_str)
    }

    /// The copies of `job_id`, in start order.
    pub fn copies(&self, job_id: &str) -> &[JobCopy] {
        self.copies.get(job_id).map_or(&[], Vec::as_slice)
    }

    /// Every copy of every job.
    pub fn all(&self) -> impl Iterator<Item = &JobCopy> {
        self.copies.values().flatten()
    }

    /// How many times `job_id` was started.
    pub fn starts(&self, job_id: &str) -> usize {
        self.copies(job_id).len()
    }

    /// Starts of every job together.
    pub fn total_starts(&self) -> usize {
        self.copies.values().map(Vec::len).sum()
    }

    /// Starts beyond what each job was allowed (`allowed(job)`: 1, or 2 for a job a fault
    /// caught that may be placed once more), summed over the jobs.
    pub fn reruns(&self, allowed: impl Fn(&str) -> usize) -> usize {
        self.copies.iter().map(|(job, list)| list.len().saturating_sub(allowed(job))).sum()
    }

    /// Every pair of copies of one job whose live intervals intersect.
    pub fn overlaps(&self) -> Vec<Overlap> {
        let mut found = Vec::new();
        for (job, list) in &self.copies {
            for (i, first) in list.iter().enumerate() {
                for second in &list[i + 1..] {
                    if second.start_ns <= first.alive_ns && first.start_ns <= second.alive_ns {
                        found.push(Overlap { job_id: job.clone(), first: first.clone(), second: second.clone() });
                    }
                }
            }
        }
        found
    }

    /// The copies that stamped within `within` before `now_ns`.
    pub fn alive(&self, now_ns: u64, within: Duration) -> Vec<&JobCopy> {
        self.all().filter(|c| c.alive_at(now_ns, within)).collect()
    }

    /// One line per job of `jobs` (every job when empty) with its copies, times relative to
    /// `origin_ns` (for failure messages).
    pub fn describe(&self, jobs: &[&str], origin_ns: u64) -> String {
        let mut text = String::new();
        for (job, list) in self.copies.iter().filter(|(job, _)| jobs.is_empty() || jobs.contains(&job.as_str())) {
            text.push_str(&format!("{job}: {} start(s)\n", list.len()));
            for copy in list {
                text.push_str(&format!("    {}\n", copy.describe(origin_ns)));
            }
        }
        text
    }
}

/// The current time in Unix nanoseconds.
pub fn now_ns() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
}

/// `+1.234s` or `-0.050s`: `at_ns` relative to `origin_ns`.
pub fn relative(at_ns: u64, origin_ns: u64) -> String {
    if at_ns >= origin_ns {
        format!("+{:.3}s", Duration::from_nanos(at_ns - origin_ns).as_secs_f64())
    } else {
        format!("-{:.3}s", Duration::from_nanos(origin_ns - at_ns).as_secs_f64())
    }
}

/// The name of the file a witness writes: `<job id>.<pid>`.
pub fn file_name(job_id: &str, pid: u32) -> String {
    format!("{job_id}.{pid}")
}

/// A witness file's first contents: the header line and the alive field set to the start.
pub fn render(copy: &JobCopy) -> String {
    let token = copy.fencing_token.map_or_else(|| "-".to_string(), |t| t.to_string());
    format!(
        "job={} token={token} cluster={} pid={} start_ns={}\n{ALIVE_KEY}{}\n",
        copy.job_id,
        copy.cluster,
        copy.pid,
        copy.start_ns,
        stamp(copy.alive_ns)
    )
}

/// Where the alive stamp sits in a file whose contents began as `rendered`.
pub fn alive_offset(rendered: &str) -> u64 {
    let at = rendered.find(ALIVE_KEY).map_or(0, |i| i + ALIVE_KEY.len());
    u64::try_from(at).unwrap_or(0)
}

/// A stamp as it is written: [`STAMP_WIDTH`] zero-padded digits.
pub fn stamp(ns: u64) -> String {
    format!("{ns:0width$}", width = STAMP_WIDTH)
}

/// Reads a witness file's text back.
pub fn parse(text: &str) -> Result<JobCopy, String> {
    let mut lines = text.lines();
    let header = lines.next().ok_or("empty")?;
    let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
    for part in header.split_whitespace() {
        let (key, value) = part.split_once('=').ok_or_else(|| format!("`{part}` is not key=value"))?;
        fields.insert(key, value);
    }
    let field = |key: &str| fields.get(key).copied().ok_or_else(|| format!("no `{key}` in `{header}`"));
    let number =
        |key: &str| -> Result<u64, String> { field(key)?.parse().map_err(|e| format!("`{key}` in `{header}`: {e}")) };
    let alive_line = lines.next().ok_or("no alive line")?;
    let alive = alive_line.strip_prefix(ALIVE_KEY).ok_or_else(|| format!("`{alive_line}` is not the alive field"))?;
    if alive.len() != STAMP_WIDTH {
        return Err(format!("alive stamp `{alive}` is not {STAMP_WIDTH} digits"));
    }
    let token = field("token")?;
    Ok(JobCopy {
        job_id: field("job")?.to_string(),
        fencing_token: if token == "-" {
            None
        } else {
            Some(token.parse().map_err(|e| format!("token `{token}`: {e}"))?)
        },
        cluster: field("cluster")?.to_string(),
        pid: u32::try_from(number("pid")?).map_err(|e| format!("pid: {e}"))?,
        start_ns: number("start_ns")?,
        alive_ns: alive.parse().map_err(|e| format!("alive stamp `{alive}`: {e}"))?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

    use super::*;

    const MS: u64 = 1_000_000;

    fn copy(job: &str, cluster: &str, pid: u32, start_ms: u64, alive_ms: u64) -> JobCopy {
        JobCopy {
            job_id: job.to_string(),
            fencing_token: Some(u64::from(pid % 7)),
            cluster: cluster.to_string(),
            pid,
            start_ns: start_ms * MS,
            alive_ns: alive_ms * MS,
        }
    }

    /// Writes `copy` as the witness binary does: rendered, then the stamp overwritten in place.
    fn write(dir: &Path, copy: &JobCopy) {
        use std::os::unix::fs::FileExt;
        let first = JobCopy { alive_ns: copy.start_ns, ..copy.clone() };
        let text = render(&first);
        let path = dir.join(file_name(&copy.job_id, copy.pid));
        std::fs::write(&path, &text).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_at(stamp(copy.alive_ns).as_bytes(), alive_offset(&text)).unwrap();
    }

    #[test]
    fn a_file_reads_back_as_the_copy_that_wrote_it_after_its_stamp_was_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let written = copy("job-1", "east", 4242, 1_000, 1_750);
        write(dir.path(), &written);
        let ledger = Ledger::read(dir.path()).unwrap();
        assert_eq!(ledger.copies("job-1"), std::slice::from_ref(&written));
        assert_eq!(ledger.copies("job-1")[0].lived(), Duration::from_millis(750));
    }

    #[test]
    fn a_runner_without_a_token_is_recorded_without_one() {
        let text = render(&JobCopy { fencing_token: None, ..copy("j", "west", 9, 5, 5) });
        assert!(text.contains(" token=- "), "{text}");
        assert_eq!(parse(&text).unwrap().fencing_token, None);
    }

    #[test]
    fn copies_that_follow_each_other_do_not_overlap_and_count_as_starts() {
        let ledger = Ledger::from_copies([
            copy("a", "east", 1, 0, 1_000),
            // Started 1 ms after the first stopped: a re-placement, not an overlap.
            copy("a", "west", 2, 1_001, 3_000),
            copy("b", "east", 3, 0, 500),
        ]);
        assert!(ledger.overlaps().is_empty());
        assert_eq!((ledger.starts("a"), ledger.starts("b"), ledger.total_starts()), (2, 1, 3));
        assert_eq!(ledger.jobs().collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn copies_alive_at_the_same_time_overlap_by_the_shared_interval() {
        let ledger = Ledger::from_copies([
            copy("a", "west", 2, 800, 3_000),
            copy("a", "east", 1, 0, 1_000),
            copy("other", "east", 3, 0, 5_000),
        ]);
        let overlaps = ledger.overlaps();
        assert_eq!(overlaps.len(), 1, "{overlaps:?}");
        assert_eq!(overlaps[0].first.cluster, "east", "ordered by start");
        assert_eq!(overlaps[0].second.cluster, "west");
        assert_eq!(overlaps[0].length(), Duration::from_millis(200));
    }

    #[test]
    fn a_copy_that_died_before_its_first_stamp_still_overlaps_one_alive_at_its_start() {
        // Killed within one tick of starting: its interval is a single instant.
        let ledger = Ledger::from_copies([copy("a", "east", 1, 0, 1_000), copy("a", "west", 2, 400, 400)]);
        let overlaps = ledger.overlaps();
        assert_eq!(overlaps.len(), 1);
        assert_eq!(overlaps[0].length(), Duration::ZERO);
    }

    #[test]
    fn three_copies_of_one_job_report_every_overlapping_pair() {
        let ledger = Ledger::from_copies([
            copy("a", "east", 1, 0, 1_000),
            copy("a", "west", 2, 500, 2_000),
            copy("a", "north", 3, 900, 950),
        ]);
        assert_eq!(ledger.overlaps().len(), 3);
    }

    #[test]
    fn reruns_are_starts_beyond_what_each_job_is_allowed() {
        let ledger = Ledger::from_copies([
            copy("caught", "east", 1, 0, 10),
            copy("caught", "west", 2, 20, 30),
            copy("spared", "east", 3, 0, 10),
            copy("spared", "west", 4, 20, 30),
            copy("spared", "east", 5, 40, 50),
        ]);
        let allowed = |job: &str| if job == "caught" { 2 } else { 1 };
        assert_eq!(ledger.reruns(allowed), 2);
        assert_eq!(ledger.reruns(|_| 1), 3);
    }

    #[test]
    fn alive_copies_are_those_that_stamped_recently() {
        let ledger = Ledger::from_copies([copy("a", "east", 1, 0, 1_000), copy("b", "east", 2, 0, 1_990)]);
        let alive = ledger.alive(2_000 * MS, Duration::from_millis(50));
        assert_eq!(alive.iter().map(|c| c.job_id.as_str()).collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn reading_skips_files_still_being_created_and_the_stop_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &copy("a", "east", 1, 0, 10));
        std::fs::write(dir.path().join(".a.2.tmp"), "job=a tok").unwrap();
        std::fs::write(dir.path().join(STOP_FILE), "").unwrap();
        assert_eq!(Ledger::read(dir.path()).unwrap().total_starts(), 1);
    }

    #[test]
    fn a_foreign_file_is_an_error_that_names_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("notes.txt"), "hello\n").unwrap();
        let error = Ledger::read(dir.path()).unwrap_err().to_string();
        assert!(error.contains("notes.txt") && error.contains("not a witness file"), "{error}");
    }

    #[test]
    fn a_torn_stamp_is_rejected_rather_than_misread() {
        let text = render(&copy("a", "east", 1, 0, 10)).replace("alive_ns=0000", "alive_ns=00");
        assert!(parse(&text).unwrap_err().contains("20 digits"));
    }

    #[test]
    fn a_description_names_each_copy_of_the_jobs_asked_for() {
        let ledger = Ledger::from_copies([copy("a", "east", 1, 1_000, 1_500), copy("b", "west", 2, 0, 10)]);
        let text = ledger.describe(&["a"], 0);
        assert!(text.contains("a: 1 start(s)") && text.contains("east pid 1") && text.contains("+1.000s"), "{text}");
        assert!(!text.contains("west"), "{text}");
        assert_eq!(ledger.describe(&[], 0).lines().count(), 4);
    }

    #[test]
    fn relative_times_read_with_a_sign() {
        assert_eq!(relative(1_500 * MS, 1_000 * MS), "+0.500s");
        assert_eq!(relative(1_000 * MS, 1_250 * MS), "-0.250s");
    }
}
