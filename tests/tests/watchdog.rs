//! The process runner's lease watchdog with real processes: the real `meridian gateway` with a
//! short lease and one `meridian-agent` (builtin backend, process runner) running a job whose
//! shell and its child write their pids to files. The agent is then frozen (SIGSTOP), killed
//! (SIGKILL) or stopped cleanly (SIGTERM), and the test watches the job's processes through
//! `/proc`: a process that is gone or a zombie no longer runs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use meridian_e2e::{ProcessHost, poll};

/// Lease = `lostJobTimeout - leaseMargin` = 3 s; the gateway places lost jobs again after 6 s.
const GATEWAY: &str =
    "placementInterval: 200ms\nofferTimeout: 10s\nclusterTimeout: 2s\nlostJobTimeout: 6s\nleaseMargin: 3s\n";
const LEASE: Duration = Duration::from_secs(3);
const KILL_GRACE: Duration = Duration::from_millis(500);
/// How much later than the kill moment the processes may be seen gone: the watchdog polls every
/// 100 ms, this test every 50 ms, and the host may be busy.
const SLACK: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(30);

async fn host() -> ProcessHost {
    ProcessHost::start(GATEWAY, "500ms").await.unwrap()
}

/// Submits a job whose shell starts a child and waits; returns both pids once it runs.
async fn running_job(h: &ProcessHost) -> Vec<u32> {
    let (shell, child) = (h.dir.path().join("shell.pid"), h.dir.path().join("child.pid"));
    let script = format!("sleep 1000 & echo $! > {}; echo $$ > {}; wait", child.display(), shell.display());
    let spec = format!(
        "name: long\ntenant: t\ngang: {{replicas: 1, resources: {{gpus: 1}}}}\nruntime: {{estimate: 1h}}\n\
         payload: {{command: [sh, -c, {}]}}\n",
        serde_json::to_string(&script).unwrap()
    );
    let (job, created) = h.gateway.client().submit(&spec).await.unwrap();
    assert!(created);
    let id = job["id"].as_str().unwrap().to_string();
    h.gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();
    let pids = poll(WAIT, || async { Some(vec![read_pid(&shell)?, read_pid(&child)?]) }).await.unwrap();
    assert!(pids.iter().all(|&pid| !gone(pid)), "the job runs: {pids:?}");
    pids
}

fn read_pid(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Whether `pid` no longer runs: no such process, or a zombie (its parent has not reaped it,
/// as a frozen agent cannot).
fn gone(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z' | 'X'))
}

/// The pid and state file of the lease watchdog watching `agent_pid`.
fn watchdog_of(agent_pid: u32) -> Option<(u32, PathBuf)> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let watches_it = args.get(1).is_some_and(|mode| mode == "lease-watchdog")
            && args.windows(2).any(|pair| pair[0] == "--agent-pid" && pair[1] == agent_pid.to_string());
        if !watches_it || gone(pid) {
            continue;
        }
        let state = args.windows(2).find(|pair| pair[0] == "--state").map(|pair| PathBuf::from(&pair[1]))?;
        return Some((pid, state));
    }
    None
}

/// The watchdog of `agent_pid`, once it runs (the agent starts it with its runner).
async fn watchdog(agent_pid: u32) -> (u32, PathBuf) {
    poll(WAIT, || async { watchdog_of(agent_pid) }).await.expect("the agent runs a lease watchdog")
}

/// What the watchdog says it killed (its log goes to the agent's stderr).
fn watchdog_kills(log: &str) -> String {
    log.lines().filter(|line| line.contains("lease watchdog") && line.contains("killed")).collect::<Vec<_>>().join("\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_agents_job_is_killed_when_its_lease_runs_out() {
    let h = host().await;
    let pids = running_job(&h).await;
    let agent_pid = h.agent.proc.pid();
    let (watchdog_pid, _) = watchdog(agent_pid).await;

    h.agent.proc.signal("STOP").unwrap();
    // The last renewal answered a heartbeat sent before this instant, so the lease runs out at
    // most LEASE after it, and the watchdog kills KILL_GRACE after that.
    let frozen = Instant::now();
    let bound = LEASE + KILL_GRACE + SLACK;
    let outcome = poll(bound, || async { pids.iter().all(|&pid| gone(pid)).then(|| frozen.elapsed()) }).await;
    let log = h.agent.proc.log();
    let killed_after = outcome.unwrap_or_else(|e| {
        panic!("{e}: the job {pids:?} still runs {bound:?} after the agent froze; agent log:\n{log}")
    });
    eprintln!("job killed {killed_after:?} after the agent froze; {}", watchdog_kills(&log));
    // Heartbeats go every 300 ms, so the lease ran at least LEASE - 300 ms past the freeze.
    assert!(killed_after >= LEASE / 2, "killed {killed_after:?} after the freeze, while the lease held; log:\n{log}");
    assert!(!gone(watchdog_pid), "the watchdog keeps watching a frozen agent");

    h.agent.proc.signal("CONT").unwrap();
    // Thawed, the agent finds its lease expired and its job gone, and connects again (the
    // gateway marked it disconnected after `clusterTimeout`).
    h.gateway.wait_for_clusters(1).await.unwrap();
    assert!(!gone(agent_pid), "the watchdog never kills the agent");
}

#[tokio::test(flavor = "multi_thread")]
async fn killing_the_agent_with_sigkill_kills_its_job_and_the_watchdog_exits() {
    let mut h = host().await;
    let pids = running_job(&h).await;
    let (watchdog_pid, state_file) = watchdog(h.agent.proc.pid()).await;
    assert!(state_file.exists());

    h.agent.proc.kill();
    let killed = Instant::now();
    let outcome = poll(SLACK, || async { pids.iter().all(|&pid| gone(pid)).then(|| killed.elapsed()) }).await;
    let log = h.agent.proc.log();
    let gone_after = outcome.unwrap_or_else(|e| {
        panic!("{e}: the job {pids:?} outlived its SIGKILLed agent by {SLACK:?}; agent log:\n{log}")
    });
    eprintln!("job killed {gone_after:?} after the agent; {}", watchdog_kills(&log));
    poll(SLACK, || async { gone(watchdog_pid).then_some(()) }).await.expect("the watchdog exits after the agent");
    assert!(!state_file.exists(), "the watchdog removes the state file of a dead agent");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clean_shutdown_stops_the_job_and_the_watchdog_and_removes_the_state_file() {
    let h = host().await;
    let pids = running_job(&h).await;
    let agent_pid = h.agent.proc.pid();
    let (watchdog_pid, state_file) = watchdog(agent_pid).await;

    h.agent.proc.signal("TERM").unwrap();
    // The test is the agent's parent and has not reaped it: a zombie once it exits.
    poll(WAIT, || async { gone(agent_pid).then_some(()) }).await.expect("the agent exits on SIGTERM");
    let log = h.agent.proc.log();
    assert!(pids.iter().all(|&pid| gone(pid)), "the job stops with the agent; log:\n{log}");
    poll(SLACK, || async { gone(watchdog_pid).then_some(()) }).await.expect("the watchdog exits with the agent");
    assert!(!state_file.exists(), "the state file goes at a clean shutdown");
    assert!(!log.contains("the agent is gone"), "a clean shutdown leaves the watchdog nothing to kill; log:\n{log}");
}
