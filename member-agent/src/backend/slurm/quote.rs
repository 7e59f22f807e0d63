//! Start quotes on Slurm: when the controller would start a gang of a given shape.
//!
//! A quote is `sbatch --test-only` of the very batch job a submit would hand to `sbatch` (same
//! options, same script, see [`script::batch_job`]), once per GPU type of the cluster that the
//! gang accepts, pinned to that type. The controller answers with the time its own scheduler
//! expects to start the job (running jobs' time limits, jobs pending ahead of it) and submits
//! nothing. A type it says can never be satisfied (`Requested node configuration is not
//! available`) is left out.
//!
//! Each `--test-only` is one RPC to the controller (and uses up a Slurm job id), so the calls go
//! through a [`QuoteGate`]: one at a time per backend, at least [`QUOTE_MIN_INTERVAL`] apart; a
//! call that would wait more than [`QUOTE_MAX_WAIT`] for its turn is a transient "busy".
//!
//! Slurm prints the start time in the local time zone of `sbatch`, in a format the
//! `SLURM_TIME_FORMAT` environment variable may change. The agent cannot set an environment
//! variable for one call through the shared runner, so it runs `sbatch` through `env` with
//! `SLURM_TIME_FORMAT=%s` (Unix seconds) and `TZ=UTC0` (should the format be ignored, the
//! standard format is then in UTC).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use meridian_proto::gpu;
use meridian_proto::protocol::{Assignment, StartQuote, TypeStart};
use tokio::time::Instant;

use super::Shared;
use super::command::Output;
use super::script::{self, BatchJob};
use crate::backend::BackendError;

/// What a Slurm member's quote says it is based on.
pub(crate) const QUOTE_BASIS: &str = "sbatch --test-only";

/// The least time between the end of one `sbatch --test-only` and the start of the next, per
/// backend. One call costs the controller well under a millisecond and `sbatch` about 10 ms on
/// the test cluster (see `docs/backends.md#start-quotes`); 200 ms caps a member at five quote
/// calls a second whatever the gateway asks.
pub(crate) const QUOTE_MIN_INTERVAL: Duration = Duration::from_millis(200);

/// How long a quote call waits for its turn before it answers "busy" (transient) instead.
pub(crate) const QUOTE_MAX_WAIT: Duration = Duration::from_secs(2);

/// The program that runs `sbatch` with the environment the parser needs.
const ENV_PROGRAM: &str = "/usr/bin/env";

/// What one `sbatch --test-only` said about one GPU type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TestOnly {
    /// The controller expects to start the job at this time (Unix seconds), and whether it would
    /// preempt running jobs for it (a `Preempts:` line).
    StartsAt(u64, bool),
    /// The request can never be satisfied here; Slurm's reason.
    Never(String),
}

/// Admits `sbatch --test-only` calls one at a time, at least `min_interval` apart, and turns
/// away a call that would wait more than `max_wait` for its turn.
#[derive(Debug)]
pub(crate) struct QuoteGate {
    min_interval: Duration,
    max_wait: Duration,
    /// Held for the length of one call; when the last call ended.
    last_end: tokio::sync::Mutex<Option<Instant>>,
    /// Calls that hold or wait for a turn.
    queued: AtomicUsize,
}

/// A turn at the gate: while it lives no other call runs; dropping it starts the interval.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    last_end: tokio::sync::MutexGuard<'a, Option<Instant>>,
    _queued: Queued<'a>,
}

/// One place in the gate's count of calls holding or waiting for a turn.
#[derive(Debug)]
struct Queued<'a>(&'a AtomicUsize);

impl Shared {
    /// When a gang shaped like `job` could start here (see [`LocalBackend::quote`]).
    ///
    /// [`LocalBackend::quote`]: crate::backend::LocalBackend::quote
    pub(super) async fn quote_now(&self, job: &Assignment) -> Result<StartQuote, BackendError> {
        let types = self.quotable_types(job).await?;
        if types.is_empty() {
            return Ok(StartQuote {
                starts: Vec::new(),
                basis: format!("{QUOTE_BASIS}: no GPU type here fits the gang"),
            });
        }
        let excluded = self.excluded_by_selector(job).await?;
        let port = self.coordinator_port(&job.job_id, job.fencing_token);
        let contract = script::Contract { cluster: &self.cluster, port };
        let mut starts = Vec::new();
        let mut never = Vec::new();
        // Types whose sbatch calls are the same (a gang without GPUs) are asked once.
        let mut answered: Vec<(Vec<String>, TestOnly)> = Vec::new();
        for gpu_type in types {
            let mut pinned = job.clone();
            pinned.spec.gang.resources.gpu_types = vec![gpu_type.clone()];
            let batch = match script::batch_job(&pinned, &self.config, &excluded, &contract) {
                Ok(batch) => batch,
                // A submit would refuse it for good: it can never start here.
                Err(e) => return Ok(StartQuote { starts: Vec::new(), basis: format!("{QUOTE_BASIS}: {e}") }),
            };
            let answer = match answered.iter().find(|(args, _)| *args == batch.args) {
                Some((_, answer)) => answer.clone(),
                None => {
                    let answer = self.test_only(&batch).await?;
                    answered.push((batch.args.clone(), answer.clone()));
                    answer
                }
            };
            match answer {
                TestOnly::StartsAt(at, preempts) => {
                    starts.push(TypeStart { gpu_type, after_secs: seconds_until(at, SystemTime::now()), preempts });
                }
                TestOnly::Never(reason) => never.push(format!("{gpu_type}: {reason}")),
            }
        }
        let basis = if never.is_empty() {
            QUOTE_BASIS.to_string()
        } else {
            format!("{QUOTE_BASIS} (never here: {})", never.join("; "))
        };
        Ok(StartQuote { starts, basis })
    }

    /// The Meridian GPU types of this cluster (its inventory) that `job` accepts: those its
    /// `gpuTypes` lists, or every whole-GPU type when it lists none, with enough GPU memory.
    async fn quotable_types(&self, job: &Assignment) -> Result<Vec<String>, BackendError> {
        let resources = &job.spec.gang.resources;
        let inventory = self.inventory_now().await?;
        let mut types: Vec<String> = Vec::new();
        for shape in inventory.shapes {
            let type_ok = if resources.gpu_types.is_empty() {
                !gpu::is_slice(&shape.gpu_type)
            } else {
                resources.gpu_types.contains(&shape.gpu_type)
            };
            if type_ok && shape.gpu_memory_gib >= resources.gpu_memory_gib && !types.contains(&shape.gpu_type) {
                types.push(shape.gpu_type);
            }
        }
        Ok(types)
    }

    /// Runs `sbatch --test-only` for `batch` at its turn of the gate.
    async fn test_only(&self, batch: &BatchJob) -> Result<TestOnly, BackendError> {
        let sbatch = match &self.config.bin_dir {
            Some(dir) => dir.join("sbatch"),
            None => PathBuf::from("sbatch"),
        };
        let mut args = vec!["TZ=UTC0".to_string(), "SLURM_TIME_FORMAT=%s".to_string(), sbatch.display().to_string()];
        args.extend(batch.args.iter().cloned());
        args.push("--test-only".to_string());
        let _turn = self.quote_gate.turn().await?;
        let out = self.runner.run(ENV_PROGRAM, &args, Some(&batch.script)).await?;
        judge(&out)
    }
}

impl QuoteGate {
    /// A gate that spaces calls `min_interval` apart and lets none wait longer than `max_wait`.
    pub(crate) fn new(min_interval: Duration, max_wait: Duration) -> Self {
        Self { min_interval, max_wait, last_end: tokio::sync::Mutex::new(None), queued: AtomicUsize::new(0) }
    }

    /// Waits for this call's turn: no other call running, and `min_interval` since the last one
    /// ended. A transient "busy" error when that would take longer than `max_wait`.
    pub(crate) async fn turn(&self) -> Result<Turn<'_>, BackendError> {
        let asked = Instant::now();
        let deadline = asked + self.max_wait;
        let ahead = self.queued.fetch_add(1, Ordering::SeqCst);
        let queued = Queued(&self.queued);
        // Each call ahead takes at least one interval: fail fast rather than wait to fail.
        let at_least = self.min_interval.saturating_mul(u32::try_from(ahead).unwrap_or(u32::MAX));
        if at_least > self.max_wait {
            return Err(self.busy(ahead));
        }
        let last_end = tokio::time::timeout_at(deadline, self.last_end.lock()).await.map_err(|_| self.busy(ahead))?;
        if let Some(ended) = *last_end {
            let ready = ended + self.min_interval;
            if ready > deadline {
                return Err(self.busy(ahead));
            }
            tokio::time::sleep_until(ready).await;
        }
        Ok(Turn { last_end, _queued: queued })
    }

    fn busy(&self, ahead: usize) -> BackendError {
        BackendError::transient(format!(
            "Slurm start quotes are busy: {ahead} `sbatch --test-only` call(s) of this agent run or wait, and this one \
             would wait more than {:?} for its turn (one call at a time, {:?} apart); ask again later",
            self.max_wait, self.min_interval
        ))
    }
}

impl Default for QuoteGate {
    /// [`QUOTE_MIN_INTERVAL`] apart, at most [`QUOTE_MAX_WAIT`] of waiting.
    fn default() -> Self {
        Self::new(QUOTE_MIN_INTERVAL, QUOTE_MAX_WAIT)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.last_end = Some(Instant::now());
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What `sbatch --test-only` (run through `env`) said: a start time, "never", or an error.
///
/// - Exit 0 with `Job N to start at T …`: [`TestOnly::StartsAt`].
/// - A controller that cannot be reached or is busy: [`BackendError::Transient`].
/// - `env` could not run `sbatch` (exit 126, 127): [`BackendError::Permanent`] naming
///   `slurm.binDir`.
/// - Any other refusal (`Requested node configuration is not available`, an unknown feature,
///   account or partition): [`TestOnly::Never`], as a submit would be refused for good.
/// - Exit 0 without a start time it can read: [`BackendError::Permanent`] quoting the output.
pub(crate) fn judge(out: &Output) -> Result<TestOnly, BackendError> {
    if out.success() {
        return match parse_start(&out.stderr).or_else(|| parse_start(&out.stdout)) {
            Some(at) => {
                let preempts = [&out.stderr, &out.stdout]
                    .iter()
                    .flat_map(|text| text.lines())
                    .any(|line| line.trim_start().starts_with("Preempts:"));
                Ok(TestOnly::StartsAt(at, preempts))
            }
            None => Err(BackendError::permanent(format!(
                "`sbatch --test-only` succeeded but printed no start time this agent can read (expected \
                 `Job N to start at <unix seconds or YYYY-MM-DDTHH:MM:SS> …`); stderr: {:?}, stdout: {:?}",
                out.stderr.trim(),
                out.stdout.trim()
            ))),
        };
    }
    if out.is_transient() {
        return Err(BackendError::transient(format!("`sbatch --test-only`: {}", reason(out))));
    }
    if matches!(out.code, Some(126 | 127)) {
        return Err(BackendError::permanent(format!(
            "cannot run `sbatch` for a start quote (set slurm.binDir to the directory of Slurm's commands): {}",
            reason(out)
        )));
    }
    if out.code.is_none() {
        return Err(BackendError::transient("`sbatch --test-only` was killed by a signal"));
    }
    Ok(TestOnly::Never(reason(out)))
}

/// Slurm's reason without the `allocation failure: ` that `--test-only` puts before it.
fn reason(out: &Output) -> String {
    out.message()
        .split("; ")
        .map(|line| line.strip_prefix("allocation failure: ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The start time in `sbatch --test-only`'s `Job N to start at T using …` line, as Unix
/// seconds: `T` is Unix seconds (`SLURM_TIME_FORMAT=%s`) or `YYYY-MM-DDTHH:MM:SS` in UTC.
pub(crate) fn parse_start(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (_, rest) = line.split_once(" to start at ")?;
        let when = rest.split_whitespace().next()?;
        if when.bytes().all(|b| b.is_ascii_digit()) { when.parse().ok() } else { parse_utc(when) }
    })
}

/// `YYYY-MM-DDTHH:MM:SS` in UTC as Unix seconds (None before 1970 or malformed).
fn parse_utc(text: &str) -> Option<u64> {
    let (date, time) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(str::parse::<u32>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let mut time = time.splitn(3, ':').map(str::parse::<u32>);
    let (hour, minute, second) = (time.next()?.ok()?, time.next()?.ok()?, time.next()?.ok()?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = u64::try_from(days_from_civil(i64::from(year), month, day)).ok()?;
    Some(days * 86_400 + u64::from(hour) * 3_600 + u64::from(minute) * 60 + u64::from(second))
}

/// Days from 1970-01-01 to the given date of the proleptic Gregorian calendar (Howard
/// Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month = i64::from(month);
    let day_of_year = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Whole seconds from `now` until `start_unix_secs`; 0 when it is not later. `now` is taken
/// after the controller answered, in whole seconds rounded down like the controller's own
/// clock, so a gang the controller would start at once is quoted 0.
pub(crate) fn seconds_until(start_unix_secs: u64, now: SystemTime) -> u64 {
    let now = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    start_unix_secs.saturating_sub(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(code: i32, stderr: &str) -> Output {
        Output { code: Some(code), stdout: String::new(), stderr: stderr.to_string() }
    }

    #[test]
    fn a_start_in_unix_seconds_is_read_from_the_line_sbatch_prints() {
        let out = output(0, "sbatch: Job 6 to start at 1796395041 using 1 processors on nodes n1 in partition gpu\n");
        assert_eq!(judge(&out).unwrap(), TestOnly::StartsAt(1_796_395_041, false));
    }

    #[test]
    fn a_start_in_slurms_standard_format_is_read_as_utc() {
        let out = output(
            0,
            "sbatch: Job 1234 to start at 2026-12-04T15:00:00 using 16 processors on nodes n[1-2] in partition debug\n",
        );
        // 2026-12-04T15:00:00Z.
        assert_eq!(judge(&out).unwrap(), TestOnly::StartsAt(1_796_396_400, false));
        assert_eq!(parse_start("Job 1 to start at 1970-01-01T00:00:00 using"), Some(0));
        assert_eq!(parse_start("Job 1 to start at 2000-02-29T12:34:56 using"), Some(951_827_696));
    }

    #[test]
    fn warnings_around_the_start_are_ignored_and_a_preempts_line_marks_the_quote() {
        let out = output(
            0,
            "sbatch: warning: can't honor --ntasks-per-node set to 1 which doesn't match the requested tasks\n\
             sbatch: Job 213 to start at 2026-12-05T01:43:40 using 2 processors on nodes n[1-2] in partition gpu\n  \
             Preempts: 17,18\n",
        );
        assert_eq!(judge(&out).unwrap(), TestOnly::StartsAt(1_796_435_020, true));
    }

    #[test]
    fn an_unsatisfiable_request_is_never_with_slurms_reason() {
        for (stderr, expected) in [
            (
                "allocation failure: Requested node configuration is not available\n",
                "Requested node configuration is not available",
            ),
            ("allocation failure: Invalid feature specification\n", "Invalid feature specification"),
            (
                "sbatch: error: invalid partition specified: nope\nallocation failure: Invalid partition name specified\n",
                "invalid partition specified: nope; Invalid partition name specified",
            ),
        ] {
            assert_eq!(judge(&output(1, stderr)).unwrap(), TestOnly::Never(expected.to_string()), "{stderr}");
        }
    }

    #[test]
    fn an_unreachable_controller_is_transient() {
        let out = output(1, "allocation failure: Unable to contact slurm controller (connect failure)\n");
        let err = judge(&out).unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(err.to_string().contains("Unable to contact slurm controller"), "{err}");
    }

    #[test]
    fn a_missing_sbatch_is_permanent_and_names_bin_dir() {
        let out = output(127, "/usr/bin/env: '/opt/slurm/bin/sbatch': No such file or directory\n");
        let err = judge(&out).unwrap_err();
        assert!(!err.is_transient() && err.to_string().contains("slurm.binDir"), "{err}");
    }

    #[test]
    fn a_success_without_a_readable_time_is_permanent_and_quotes_the_output() {
        for stderr in ["sbatch: Job 8 to start at 14:37:21 using 1 processors on nodes n1 in partition gpu\n", ""] {
            let err = judge(&output(0, stderr)).unwrap_err();
            assert!(!err.is_transient(), "{err}");
            assert!(err.to_string().contains("printed no start time"), "{err}");
        }
        assert_eq!(parse_start("Job 1 to start at 2026-13-01T00:00:00 using"), None);
        assert_eq!(parse_start("Job 1 to start at Tomorrow using"), None);
    }

    #[test]
    fn seconds_until_a_start_clamp_at_zero() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_000_500);
        assert_eq!(seconds_until(1_000_600, now), 600);
        // The controller's "now" is this second: start at once.
        assert_eq!(seconds_until(1_000_000, now), 0);
        assert_eq!(seconds_until(10, now), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn calls_are_spaced_by_the_minimum_interval() {
        let gate = QuoteGate::new(Duration::from_millis(200), Duration::from_secs(2));
        let began = Instant::now();
        drop(gate.turn().await.unwrap());
        drop(gate.turn().await.unwrap());
        assert_eq!(began.elapsed(), Duration::from_millis(200));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let later = Instant::now();
        drop(gate.turn().await.unwrap());
        assert_eq!(later.elapsed(), Duration::ZERO, "an interval that has passed costs nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_would_wait_too_long_is_busy_not_queued() {
        let gate = QuoteGate::new(Duration::from_millis(200), Duration::from_secs(2));
        let held = gate.turn().await.unwrap();
        let began = Instant::now();
        let err = gate.turn().await.unwrap_err();
        assert!(err.is_transient() && err.to_string().contains("busy"), "{err}");
        assert_eq!(began.elapsed(), Duration::from_secs(2), "it waited its 2 s, no more");
        drop(held);
        assert!(gate.turn().await.is_ok(), "the gate is free again after the interval");
    }

    #[tokio::test(start_paused = true)]
    async fn with_many_calls_ahead_a_call_is_busy_at_once() {
        let gate = std::sync::Arc::new(QuoteGate::new(Duration::from_millis(500), Duration::from_secs(2)));
        let held = gate.turn().await.unwrap();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move { gate.turn().await.map(drop) })
            })
            .collect();
        tokio::task::yield_now().await;
        let began = Instant::now();
        let err = gate.turn().await.unwrap_err();
        assert!(err.to_string().contains("busy"), "{err}");
        assert_eq!(began.elapsed(), Duration::ZERO, "five calls ahead, 500 ms apart, cannot fit in 2 s");
        drop(held);
        for waiter in waiters {
            let _ = waiter.await.unwrap();
        }
    }
}
