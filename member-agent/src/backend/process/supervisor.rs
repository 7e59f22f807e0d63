//! One job run under the process runner: spawns a child per replica, copies their output into
//! the job's log, and decides how the run ends (all exit 0, a replica fails, the runtime limit,
//! or a cancel), stopping the other replicas of the gang with SIGTERM and then SIGKILL.

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::group::{ProcessGroup, signal_name};
use super::output::OutputLog;
use super::watchdog::Watchdog;

/// Lines of output a terminal event's message repeats.
const MESSAGE_LINES: usize = 10;
/// Bytes of output a terminal event's message repeats at most.
const MESSAGE_BYTES: usize = 2048;
/// A line longer than this is written out in pieces, so one endless line cannot grow a buffer.
const MAX_LINE: usize = 4096;
/// How long output may still arrive after every process of the job was killed (a process that
/// left its group may hold a pipe open; its output is then cut).
const DRAIN: Duration = Duration::from_secs(2);

/// What the supervisor needs to run a job.
#[derive(Debug)]
pub struct Launch {
    /// Program and arguments, run directly (no shell).
    pub argv: Vec<String>,
    /// Extra environment of each replica, in replica order (the agent's environment is inherited).
    pub replicas: Vec<Vec<(String, String)>>,
    /// The job's runtime limit.
    pub limit: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when the run is stopped.
    pub kill_grace: Duration,
    /// Where output goes.
    pub log: Arc<OutputLog>,
    /// The process groups started so far, shared with the runner so dropping the backend can
    /// kill them at once.
    pub groups: Arc<Mutex<Vec<ProcessGroup>>>,
    /// The lease watchdog, told of each group as soon as it exists, as part of run `run_id`.
    pub watchdog: Option<Watchdog>,
    /// Which run this is, for the watchdog.
    pub run_id: u64,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every replica exited 0.
    Succeeded(String),
    /// A replica failed, could not start, or the runtime limit was reached.
    Failed(String),
    /// The run was cancelled; nobody is told.
    Cancelled,
}

/// Why the waiting stopped.
enum Ending {
    AllExited,
    ReplicaFailed { index: usize, how: String },
    Limit(Duration),
    Cancelled,
}

/// Runs `launch` to its end. `stop` fires (or is dropped) to cancel the run.
pub async fn supervise(launch: Launch, mut stop: oneshot::Receiver<()>) -> Outcome {
    let started = Instant::now();
    let count = launch.replicas.len();
    let mut waits: JoinSet<(usize, std::io::Result<ExitStatus>)> = JoinSet::new();
    let mut readers = JoinSet::new();
    let mut groups = Vec::new();
    let Some((program, args)) = launch.argv.split_first() else {
        return finish(&launch, Outcome::Failed("the payload has no command".into()));
    };
    for (index, env) in launch.replicas.iter().enumerate() {
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                let what = if count > 1 { format!("replica {index}: ") } else { String::new() };
                let message = format!("{what}cannot start `{program}`: {e}");
                launch.log.append(format!("{message}\n").as_bytes());
                stop_all(&groups, &mut waits, launch.kill_grace).await;
                return finish(&launch, Outcome::Failed(message));
            }
        };
        if let Some(group) = child.id().and_then(ProcessGroup::of) {
            groups.push(group);
            launch.groups.lock().unwrap_or_else(PoisonError::into_inner).push(group);
            if let Some(watchdog) = &launch.watchdog {
                watchdog.add(launch.run_id, group);
            }
        }
        let prefix = (count > 1).then(|| format!("[{index}] "));
        if let Some(stdout) = child.stdout.take() {
            readers.spawn(copy_lines(stdout, prefix.clone(), Arc::clone(&launch.log)));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.spawn(copy_lines(stderr, prefix, Arc::clone(&launch.log)));
        }
        waits.spawn(async move { (index, child.wait().await) });
    }

    let deadline = launch.limit.and_then(|limit| started.checked_add(limit));
    let mut exited = 0;
    let ending = loop {
        tokio::select! {
            joined = waits.join_next() => match joined {
                Some(Ok((_, Ok(status)))) if status.success() => {
                    exited += 1;
                    if exited == count {
                        break Ending::AllExited;
                    }
                }
                Some(Ok((index, Ok(status)))) => break Ending::ReplicaFailed { index, how: describe(status) },
                Some(Ok((index, Err(e)))) => {
                    break Ending::ReplicaFailed { index, how: format!("could not be waited for: {e}") };
                }
                Some(Err(e)) => break Ending::ReplicaFailed { index: 0, how: format!("lost its supervisor: {e}") },
                None => break Ending::AllExited,
            },
            () = meridian_process::sleep_until_opt(deadline) => break Ending::Limit(launch.limit.unwrap_or_default()),
            _ = &mut stop => break Ending::Cancelled,
        }
    };
    stop_all(&groups, &mut waits, launch.kill_grace).await;
    // Whatever a replica left running in its group goes with it.
    for group in &groups {
        group.kill();
    }
    if tokio::time::timeout(DRAIN, async { while readers.join_next().await.is_some() {} }).await.is_err() {
        readers.abort_all();
        launch.log.append(b"[meridian] output cut: a process outside the job's process groups kept its pipes open\n");
    }

    let ran = started.elapsed().as_secs_f64();
    let outcome = match ending {
        Ending::AllExited if count > 1 => Outcome::Succeeded(format!("all {count} replicas exited 0 after {ran:.1}s")),
        Ending::AllExited => Outcome::Succeeded(format!("exited 0 after {ran:.1}s")),
        Ending::ReplicaFailed { index, how } if count > 1 => {
            Outcome::Failed(format!("replica {index} {how} after {ran:.1}s; the other replicas were stopped"))
        }
        Ending::ReplicaFailed { how, .. } => Outcome::Failed(format!("{how} after {ran:.1}s")),
        Ending::Limit(limit) => Outcome::Failed(format!(
            "stopped at its runtime limit of {}",
            meridian_proto::duration::HumanDuration(limit)
        )),
        Ending::Cancelled => Outcome::Cancelled,
    };
    finish(&launch, outcome)
}

/// Closes the log and adds the last lines of output to a terminal message.
fn finish(launch: &Launch, outcome: Outcome) -> Outcome {
    launch.log.end();
    let tail = launch.log.last_lines(MESSAGE_LINES, MESSAGE_BYTES);
    let with_tail = |message: String| {
        if tail.is_empty() { message } else { format!("{message}; last output:\n{tail}") }
    };
    match outcome {
        Outcome::Succeeded(message) => Outcome::Succeeded(with_tail(message)),
        Outcome::Failed(message) => Outcome::Failed(with_tail(message)),
        Outcome::Cancelled => Outcome::Cancelled,
    }
}

/// Stops every replica still running: SIGTERM to each group, SIGKILL after `grace`.
async fn stop_all(groups: &[ProcessGroup], waits: &mut JoinSet<(usize, std::io::Result<ExitStatus>)>, grace: Duration) {
    if waits.is_empty() {
        return;
    }
    for group in groups {
        group.terminate();
    }
    let drain = async { while waits.join_next().await.is_some() {} };
    if tokio::time::timeout(grace, drain).await.is_ok() {
        return;
    }
    for group in groups {
        group.kill();
    }
    let drain = async { while waits.join_next().await.is_some() {} };
    if tokio::time::timeout(DRAIN, drain).await.is_err() {
        waits.abort_all();
    }
}

/// `exited with code 3`, `was killed by SIGKILL (9)`.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by {}", signal_name(signal)),
        (None, None) => format!("ended ({status})"),
    }
}

/// Copies one pipe into the log line by line (a line ends at `\n` or `\r`, or after
/// [`MAX_LINE`] bytes), each line prefixed with `prefix` (the replica index when the job has
/// several), so lines of different replicas and streams never interleave.
async fn copy_lines(mut pipe: impl AsyncRead + Unpin, prefix: Option<String>, log: Arc<OutputLog>) {
    let mut buffer = [0_u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    let write = |line: &[u8]| match &prefix {
        Some(prefix) => {
            let mut prefixed = Vec::with_capacity(prefix.len() + line.len());
            prefixed.extend_from_slice(prefix.as_bytes());
            prefixed.extend_from_slice(line);
            log.append(&prefixed);
        }
        None => log.append(line),
    };
    loop {
        let read = match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        for &byte in &buffer[..read] {
            line.push(byte);
            // `\r` ends a line too, so progress bars show up as they advance.
            if byte == b'\n' || byte == b'\r' || line.len() >= MAX_LINE {
                write(&line);
                line.clear();
            }
        }
    }
    if !line.is_empty() {
        if prefix.is_some() {
            line.push(b'\n');
        }
        write(&line);
    }
}
