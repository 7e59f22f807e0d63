//! The process runner's lease watchdog: a process apart from the agent that stops the agent's
//! jobs when the agent cannot, because it is frozen (SIGSTOP, a hung runtime) or dead (SIGKILL,
//! a crash, a forced exit that skips its clean-up).
//!
//! The agent keeps a **state file** ([`LeaseState`], JSON, written atomically by a rename into a
//! private directory): the lease deadline the agent last learned (Unix ms, or none), the
//! `killGrace`, and the process group of every replica of every live run (added when it spawns,
//! removed when its run has ended). The watchdog is the agent binary itself, re-executed as
//! `meridian-agent lease-watchdog --state FILE --agent-pid PID` in a process group of its own
//! (so stopping the agent's group does not stop it). It uses no async runtime: every [`POLL`] it
//! reads the file and checks the agent, and
//!
//! - SIGKILLs every listed group `killGrace` after the lease deadline, the moment the agent's
//!   own stop (SIGTERM at the deadline, SIGKILL after `killGrace`) would have killed them; the
//!   watchdog sends no SIGTERM, so a healthy agent's jobs never get two;
//! - SIGKILLs every listed group at once and exits when the agent is gone (its parent is no
//!   longer the agent, or the agent's pid is gone or a zombie);
//! - exits when the agent removed the file (a clean shutdown, after the agent stopped its jobs).
//!
//! The deadline travels as wall-clock time, which the watchdog turns into its own monotonic
//! clock when it first reads it; a group is killed when *either* clock says the moment passed.
//! So a step of the wall clock after that read does not delay the kill (the monotonic clock
//! still fires), and neither does a suspend of the host (the wall clock still fires). Only a
//! backward step inside the ≤ [`POLL`] between the agent's write and the watchdog's read, or a
//! backward step together with a suspend, delays it.
//!
//! What it cannot do: kill a replica spawned and not yet listed (the agent writes the file right
//! after the spawn, so only a SIGKILL in that instant orphans it), or outlive a SIGKILL of its
//! own (the agent starts it again, at most every [`RESTART_EVERY`], when it finds it gone at its
//! next write).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::process::Pid;
use serde::{Deserialize, Serialize};

use super::group::ProcessGroup;

/// The first argument that runs the agent binary as the watchdog.
pub const MODE: &str = "lease-watchdog";
/// How often the watchdog reads the state file and checks the agent.
pub const POLL: Duration = Duration::from_millis(100);
/// A watchdog found dead is started again at most this often.
pub const RESTART_EVERY: Duration = Duration::from_secs(10);
/// The version of the state file's format this binary writes and reads.
const FORMAT_VERSION: u32 = 1;
/// The state file's name inside the agent's private directory.
const STATE_FILE: &str = "lease.json";

/// Why the watchdog could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The private directory that holds the state file could not be created.
    #[error("cannot create a directory for the lease watchdog's state under {}: {source}", parent.display())]
    CreateDir {
        /// Where it was to be created (`TMPDIR`).
        parent: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The state file could not be written.
    #[error("cannot write the lease watchdog's state file {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The watchdog process could not be started.
    #[error("cannot start the lease watchdog `{} {MODE}`: {source}", exe.display())]
    Spawn {
        /// The executable (the agent binary).
        exe: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The hidden mode's command line is wrong.
    #[error("{MODE}: {0}; usage: meridian-agent {MODE} --state FILE --agent-pid PID")]
    Usage(String),
}

/// Module result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the state file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseState {
    /// Format version ([`FORMAT_VERSION`]); a file of another version is not acted on.
    pub version: u32,
    /// When the agent's lease runs out, in Unix milliseconds; None: no lease, never kill for it.
    pub lease_deadline_ms: Option<u64>,
    /// The runner's `killGrace` in milliseconds: the groups die this long after the deadline.
    pub kill_grace_ms: u64,
    /// Process group ids of every replica of every live run.
    pub groups: BTreeSet<u32>,
}

/// The agent's side of the watchdog: the state file and the watchdog process. Clones share
/// one state; every change rewrites the file at once. [`stop`](Self::stop) (or dropping the
/// last clone) kills the watchdog and removes the file.
#[derive(Debug, Clone)]
pub struct Watchdog {
    keeper: Arc<Mutex<Keeper>>,
}

/// The hidden mode's command line: `--state FILE --agent-pid PID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchdogArgs {
    /// The state file the agent keeps.
    pub state: PathBuf,
    /// The agent's pid; the watchdog must be its child.
    pub agent_pid: u32,
}

/// What one read of the state file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// The agent's current state.
    State(LeaseState),
    /// No file: the agent shut down cleanly.
    Removed,
    /// A file that could not be read or understood; the last state read stays in force.
    Unreadable(String),
}

/// The watchdog's decision logic, without I/O: fed one [`Read`] and the clocks per poll, it
/// says what to kill. It remembers the last state read, the kill moment on the monotonic clock,
/// and the groups already killed (each is killed once while it is listed).
#[derive(Debug, Default)]
pub struct Watch {
    last: Option<LeaseState>,
    due: Option<Due>,
    killed: BTreeSet<u32>,
}

/// What the watchdog does after one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing now.
    Wait,
    /// The lease ran out `overdue` ago (plus `killGrace`): kill these groups, and keep
    /// watching, since the agent may come back with a new lease and new jobs.
    Kill {
        /// Group ids not killed before.
        groups: Vec<u32>,
        /// How long ago the kill moment passed (by the clock that saw it first).
        overdue: Duration,
    },
    /// The agent is gone: kill every group it listed and exit.
    KillAndExit {
        /// Every listed group id.
        groups: Vec<u32>,
    },
    /// The agent removed the state file (a clean shutdown): exit.
    Exit,
}

/// The kill moment of one deadline on this process's monotonic clock.
#[derive(Debug, Clone, Copy)]
struct Due {
    deadline_ms: u64,
    kill_grace_ms: u64,
    at: Instant,
}

/// The agent's side, behind the [`Watchdog`] handle's mutex.
#[derive(Debug)]
struct Keeper {
    /// The agent binary; None: keep the file only (tests run the watching loop in a thread).
    exe: Option<PathBuf>,
    /// The state file, alone in a private directory.
    path: PathBuf,
    deadline_ms: Option<u64>,
    kill_grace: Duration,
    /// Group ids by run.
    groups: BTreeMap<u64, Vec<u32>>,
    child: Option<Child>,
    last_start: Option<Instant>,
    /// The last write failed (logged once until one succeeds).
    failing: bool,
    stopped: bool,
}

impl Watchdog {
    /// Creates the state file in a private directory under `TMPDIR` (no lease, no groups) and
    /// starts `exe` (the agent binary) as the watchdog, in a process group of its own.
    pub fn start(exe: &Path, kill_grace: Duration) -> Result<Self> {
        let watchdog = Self::keep_in(&std::env::temp_dir(), kill_grace)?;
        {
            let mut keeper = watchdog.lock();
            let child = spawn(exe, &keeper.path)?;
            keeper.exe = Some(exe.to_path_buf());
            keeper.child = Some(child);
            keeper.last_start = Some(Instant::now());
        }
        Ok(watchdog)
    }

    /// Keeps the state file in a new private directory under `parent` without starting a
    /// watchdog process.
    fn keep_in(parent: &Path, kill_grace: Duration) -> Result<Self> {
        let dir = private_dir(parent)?;
        let path = dir.join(STATE_FILE);
        let keeper = Keeper {
            exe: None,
            path,
            deadline_ms: None,
            kill_grace,
            groups: BTreeMap::new(),
            child: None,
            last_start: None,
            failing: false,
            stopped: false,
        };
        write_atomically(&keeper.path, &keeper.state())?;
        Ok(Self { keeper: Arc::new(Mutex::new(keeper)) })
    }

    /// The state file's path.
    pub fn state_file(&self) -> PathBuf {
        self.lock().path.clone()
    }

    /// The lease now runs until `deadline` (None: no lease).
    pub fn set_deadline(&self, deadline: Option<SystemTime>) {
        let mut keeper = self.lock();
        keeper.deadline_ms = deadline.map(unix_ms);
        keeper.write();
    }

    /// Lists `group` as a replica of run `run_id`.
    pub fn add(&self, run_id: u64, group: ProcessGroup) {
        let mut keeper = self.lock();
        keeper.groups.entry(run_id).or_default().push(group.id());
        keeper.write();
    }

    /// Forgets the groups of run `run_id`, whose processes have all ended.
    pub fn remove_run(&self, run_id: u64) {
        let mut keeper = self.lock();
        if keeper.groups.remove(&run_id).is_some() {
            keeper.write();
        }
    }

    /// A clean shutdown, once the agent stopped its jobs: kills the watchdog and removes the
    /// state file. Later changes are ignored.
    pub fn stop(&self) {
        self.lock().stop();
    }

    fn lock(&self) -> MutexGuard<'_, Keeper> {
        // Every method leaves the keeper consistent between statements; keep serving.
        self.keeper.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl WatchdogArgs {
    /// Parses the arguments after [`MODE`].
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self> {
        let mut state = None;
        let mut agent_pid = None;
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| Error::Usage(format!("{} needs a value", flag.to_string_lossy())))?;
            match flag.to_str() {
                Some("--state") => state = Some(PathBuf::from(value)),
                Some("--agent-pid") => {
                    // 1 too: in a container the agent is often its namespace's init.
                    let pid = value.to_str().and_then(|v| v.parse::<u32>().ok()).filter(|&p| p > 0);
                    agent_pid = Some(pid.ok_or_else(|| {
                        Error::Usage(format!("--agent-pid: `{}` is not a process id", value.to_string_lossy()))
                    })?);
                }
                _ => return Err(Error::Usage(format!("unknown argument `{}`", flag.to_string_lossy()))),
            }
        }
        match (state, agent_pid) {
            (Some(state), Some(agent_pid)) => Ok(Self { state, agent_pid }),
            _ => Err(Error::Usage("--state and --agent-pid are required".into())),
        }
    }
}

impl Watch {
    /// One poll: what the file said, the wall clock and the monotonic clock now, and whether
    /// the agent is still alive.
    pub fn step(&mut self, read: Read, wall_now: SystemTime, now: Instant, agent_alive: bool) -> Action {
        let removed = match read {
            Read::State(state) if state.version == FORMAT_VERSION => {
                self.observe(state, wall_now, now);
                false
            }
            Read::State(_) | Read::Unreadable(_) => false,
            Read::Removed => true,
        };
        let listed: Vec<u32> = self.last.iter().flat_map(|s| s.groups.iter().copied()).collect();
        if !agent_alive {
            return Action::KillAndExit { groups: listed };
        }
        if removed {
            return Action::Exit;
        }
        self.killed.retain(|group| listed.contains(group));
        let Some(overdue) = self.overdue(wall_now, now) else { return Action::Wait };
        let groups: Vec<u32> = listed.into_iter().filter(|group| !self.killed.contains(group)).collect();
        if groups.is_empty() {
            return Action::Wait;
        }
        self.killed.extend(groups.iter().copied());
        Action::Kill { groups, overdue }
    }

    /// Takes in a state read; a deadline not seen before gets its kill moment on the monotonic
    /// clock, counted from now.
    fn observe(&mut self, state: LeaseState, wall_now: SystemTime, now: Instant) {
        self.due = state.lease_deadline_ms.map(|deadline_ms| match self.due {
            Some(due) if due.deadline_ms == deadline_ms && due.kill_grace_ms == state.kill_grace_ms => due,
            _ => {
                let kill_ms = deadline_ms.saturating_add(state.kill_grace_ms);
                let now_ms = unix_ms(wall_now);
                let at = if kill_ms >= now_ms {
                    now.checked_add(Duration::from_millis(kill_ms - now_ms))
                } else {
                    now.checked_sub(Duration::from_millis(now_ms - kill_ms))
                };
                Due { deadline_ms, kill_grace_ms: state.kill_grace_ms, at: at.unwrap_or(now) }
            }
        });
        self.last = Some(state);
    }

    /// How long ago the kill moment passed by whichever clock says it did; None while neither
    /// does (or there is no lease).
    fn overdue(&self, wall_now: SystemTime, now: Instant) -> Option<Duration> {
        let due = self.due?;
        let kill_ms = due.deadline_ms.saturating_add(due.kill_grace_ms);
        let now_ms = unix_ms(wall_now);
        let by_wall = (now_ms >= kill_ms).then(|| Duration::from_millis(now_ms - kill_ms));
        let by_monotonic = (now >= due.at).then(|| now.duration_since(due.at));
        by_wall.into_iter().chain(by_monotonic).max()
    }
}

impl Keeper {
    fn state(&self) -> LeaseState {
        LeaseState {
            version: FORMAT_VERSION,
            lease_deadline_ms: self.deadline_ms,
            kill_grace_ms: u64::try_from(self.kill_grace.as_millis()).unwrap_or(u64::MAX),
            groups: self.groups.values().flatten().copied().collect(),
        }
    }

    /// Rewrites the file, then starts the watchdog again if it is gone.
    fn write(&mut self) {
        if self.stopped {
            return;
        }
        match write_atomically(&self.path, &self.state()) {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!(path = %self.path.display(), "lease watchdog: the state file is written again");
            }
            Ok(()) => {}
            Err(error) if !self.failing => {
                self.failing = true;
                tracing::error!(%error, "lease watchdog: the watchdog acts on the last state it read until a write succeeds");
            }
            Err(_) => {}
        }
        self.restart_if_gone();
    }

    fn restart_if_gone(&mut self) {
        let Some(exe) = &self.exe else { return };
        let how = match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => return,
            Some(Ok(Some(status))) => status.to_string(),
            Some(Err(e)) => format!("cannot be waited for ({e})"),
            None => "is not running".to_string(),
        };
        if self.last_start.is_some_and(|at| at.elapsed() < RESTART_EVERY) {
            return;
        }
        self.last_start = Some(Instant::now());
        tracing::error!(how = %how, "lease watchdog: it ended while the agent runs; starting it again");
        match spawn(exe, &self.path) {
            Ok(child) => self.child = Some(child),
            Err(error) => {
                self.child = None;
                tracing::error!(%error, "lease watchdog: a frozen or killed agent's jobs keep running until it starts");
            }
        }
    }

    fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if let Some(mut child) = self.child.take() {
            // SIGKILL: it holds nothing, and waiting for it to notice the removed file would
            // take a poll.
            let _ = child.kill();
            let _ = child.wait();
        }
        remove_state(&self.path);
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `meridian-agent lease-watchdog …`: parses the arguments after [`MODE`], then watches until
/// the agent shuts down or is gone. Exit status 0, or 64 for a bad command line.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    meridian_process::init_logging("info");
    match WatchdogArgs::parse(args) {
        Ok(args) => {
            run(&args);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(64)
        }
    }
}

/// Watches the agent `args` names until it shuts down (removes the state file) or is gone
/// (after killing its jobs).
pub fn run(args: &WatchdogArgs) {
    tracing::info!(agent_pid = args.agent_pid, state = %args.state.display(), "lease watchdog: watching the agent");
    watch(&args.state, || agent_alive(args.agent_pid), POLL);
}

/// The polling loop, with the agent check given: reads `path` and asks `agent_alive` every
/// `poll`, and kills what [`Watch`] says.
fn watch(path: &Path, mut agent_alive: impl FnMut() -> bool, poll: Duration) {
    let mut watch = Watch::default();
    let mut complaint = None;
    loop {
        let alive = agent_alive();
        let read = read_state(path);
        if let Read::Unreadable(why) = &read
            && complaint.as_ref() != Some(why)
        {
            tracing::warn!(why = %why, "lease watchdog: acting on the last state read");
            complaint = Some(why.clone());
        }
        match watch.step(read, SystemTime::now(), Instant::now(), alive) {
            Action::Wait => {}
            Action::Kill { groups, overdue } => {
                kill(&groups);
                tracing::warn!(
                    groups = ?groups,
                    overdue_ms = overdue.as_millis(),
                    "lease watchdog: the agent's lease ran out (plus killGrace) and the agent did not stop these jobs; killed their process groups"
                );
            }
            Action::KillAndExit { groups } => {
                kill(&groups);
                remove_state(path);
                tracing::warn!(groups = ?groups, "lease watchdog: the agent is gone; killed its jobs' process groups");
                return;
            }
            Action::Exit => return,
        }
        std::thread::sleep(poll);
    }
}

/// SIGKILL to each group.
fn kill(groups: &[u32]) {
    for group in groups.iter().copied().filter_map(ProcessGroup::of) {
        group.kill();
    }
}

/// Whether the agent still runs: the watchdog is still its child (a dead parent's children are
/// re-parented), and its pid exists and is not a zombie.
fn agent_alive(agent_pid: u32) -> bool {
    let Some(pid) = i32::try_from(agent_pid).ok().and_then(Pid::from_raw) else { return false };
    if rustix::process::getppid() != Some(pid) {
        return false;
    }
    if rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH) {
        return false;
    }
    !is_zombie(agent_pid)
}

/// Whether `/proc` says `pid` is a zombie (or dead); false where it cannot tell.
fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // `pid (comm) S …`: the state follows the last `)`, since comm may hold one.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z' | 'X'))
}

fn read_state(path: &Path) -> Read {
    match std::fs::read(path) {
        Ok(bytes) => match serde_json::from_slice::<LeaseState>(&bytes) {
            Ok(state) if state.version == FORMAT_VERSION => Read::State(state),
            Ok(state) => Read::Unreadable(format!(
                "{}: format version {} is not {FORMAT_VERSION}",
                path.display(),
                state.version
            )),
            Err(e) => Read::Unreadable(format!("{}: {e}", path.display())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Read::Removed,
        Err(e) => Read::Unreadable(format!("{}: {e}", path.display())),
    }
}

/// Writes `state` to a temporary file beside `path` and renames it over `path`, so a reader
/// sees the old state or the new one, never a part.
fn write_atomically(path: &Path, state: &LeaseState) -> Result<()> {
    let error = |source| Error::Write { path: path.to_path_buf(), source };
    let bytes = serde_json::to_vec(state).map_err(|e| error(std::io::Error::other(e)))?;
    let temporary = path.with_extension("json.tmp");
    std::fs::write(&temporary, bytes).map_err(error)?;
    std::fs::rename(&temporary, path).map_err(error)
}

/// Removes the state file and its directory; what is already gone is fine.
fn remove_state(path: &Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path.with_extension("json.tmp"));
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir(dir);
    }
}

/// A new directory under `parent` that only this user can enter, so nobody else can write
/// the state file (it names processes to kill).
fn private_dir(parent: &Path) -> Result<PathBuf> {
    let pid = std::process::id();
    let mut last_error = None;
    for attempt in 0..16_u32 {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let dir = parent.join(format!("meridian-agent-{pid}-{nanos:09}{attempt}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last_error = Some(e),
            Err(source) => return Err(Error::CreateDir { parent: parent.to_path_buf(), source }),
        }
    }
    let source = last_error.unwrap_or_else(|| std::io::Error::other("no free name"));
    Err(Error::CreateDir { parent: parent.to_path_buf(), source })
}

/// Starts the watchdog: the agent binary in [`MODE`], in a process group of its own, its
/// stderr shared with the agent's (its log lines join the agent's).
fn spawn(exe: &Path, state: &Path) -> Result<Child> {
    Command::new(exe)
        .arg(MODE)
        .arg("--state")
        .arg(state)
        .arg("--agent-pid")
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|source| Error::Spawn { exe: exe.to_path_buf(), source })
}

/// Milliseconds since the Unix epoch (0 before it).
fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(20);

    fn state(deadline_ms: Option<u64>, kill_grace_ms: u64, groups: &[u32]) -> Read {
        Read::State(LeaseState {
            version: FORMAT_VERSION,
            lease_deadline_ms: deadline_ms,
            kill_grace_ms,
            groups: groups.iter().copied().collect(),
        })
    }

    /// A fixed starting point on both clocks, and a way to move each.
    struct Clocks {
        wall: SystemTime,
        mono: Instant,
    }

    impl Clocks {
        fn new() -> Self {
            Self { wall: UNIX_EPOCH + Duration::from_secs(1_700_000_000), mono: Instant::now() }
        }

        fn wall_ms(&self) -> u64 {
            unix_ms(self.wall)
        }

        /// Both clocks move on by `by`.
        fn advance(&mut self, by: Duration) {
            self.wall += by;
            self.mono += by;
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn without_a_lease_nothing_is_ever_killed() {
        let mut clocks = Clocks::new();
        let mut watch = Watch::default();
        for _ in 0..3 {
            assert_eq!(watch.step(state(None, 0, &[10, 11]), clocks.wall, clocks.mono, true), Action::Wait);
            clocks.advance(Duration::from_secs(86_400));
        }
    }

    #[test]
    fn groups_die_kill_grace_after_the_deadline_once_each() {
        let mut clocks = Clocks::new();
        let mut watch = Watch::default();
        let deadline = clocks.wall_ms() + 3000;
        assert_eq!(watch.step(state(Some(deadline), 500, &[10]), clocks.wall, clocks.mono, true), Action::Wait);
        clocks.advance(ms(3000));
        assert_eq!(
            watch.step(state(Some(deadline), 500, &[10]), clocks.wall, clocks.mono, true),
            Action::Wait,
            "the agent's own stop has killGrace"
        );
        clocks.advance(ms(600));
        assert_eq!(
            watch.step(state(Some(deadline), 500, &[10]), clocks.wall, clocks.mono, true),
            Action::Kill { groups: vec![10], overdue: ms(100) }
        );
        clocks.advance(ms(100));
        assert_eq!(
            watch.step(state(Some(deadline), 500, &[10]), clocks.wall, clocks.mono, true),
            Action::Wait,
            "a group is killed once"
        );
        assert_eq!(
            watch.step(state(Some(deadline), 500, &[10, 12]), clocks.wall, clocks.mono, true),
            Action::Kill { groups: vec![12], overdue: ms(200) },
            "a group listed after the deadline dies at once"
        );
    }

    #[test]
    fn a_renewed_lease_keeps_the_jobs_running() {
        let mut clocks = Clocks::new();
        let mut watch = Watch::default();
        for _ in 0..10 {
            let deadline = clocks.wall_ms() + 3000;
            assert_eq!(watch.step(state(Some(deadline), 0, &[10]), clocks.wall, clocks.mono, true), Action::Wait);
            clocks.advance(ms(2000));
        }
    }

    #[test]
    fn an_expired_lease_kills_at_once_and_a_new_lease_spares_new_jobs() {
        let mut clocks = Clocks::new();
        let mut watch = Watch::default();
        let past = clocks.wall_ms() - 1000;
        assert_eq!(
            watch.step(state(Some(past), 0, &[10]), clocks.wall, clocks.mono, true),
            Action::Kill { groups: vec![10], overdue: ms(1000) }
        );
        let renewed = clocks.wall_ms() + 3000;
        assert_eq!(watch.step(state(Some(renewed), 0, &[10, 11]), clocks.wall, clocks.mono, true), Action::Wait);
        clocks.advance(ms(2000));
        assert_eq!(watch.step(state(Some(renewed), 0, &[11]), clocks.wall, clocks.mono, true), Action::Wait);
    }

    #[test]
    fn a_wall_clock_stepping_back_does_not_delay_the_kill() {
        let mut clocks = Clocks::new();
        let mut watch = Watch::default();
        let deadline = clocks.wall_ms() + 3000;
        assert_eq!(watch.step(state(Some(deadline), 0, &[10]), clocks.wall, clocks.mono, true), Action::Wait);
        clocks.wall -= Duration::from_secs(3600);
        clocks.advance(ms(3100));
        assert_eq!(
            watch.step(state(Some(deadline), 0, &[10]), clocks.wall, clocks.mono, true),
            Action::Kill { groups: vec![10], overdue: ms(100) }
        );
    }

    #[test]
    fn a_suspended_monotonic_clock_does_not_delay_the_kill() {
        let mut clocks = Clocks::new();
        let mut watch = Watch::default();
        let deadline = clocks.wall_ms() + 3000;
        assert_eq!(watch.step(state(Some(deadline), 0, &[10]), clocks.wall, clocks.mono, true), Action::Wait);
        clocks.wall += Duration::from_secs(60);
        assert_eq!(
            watch.step(state(Some(deadline), 0, &[10]), clocks.wall, clocks.mono, true),
            Action::Kill { groups: vec![10], overdue: ms(57_000) }
        );
    }

    #[test]
    fn a_gone_agent_gets_every_listed_group_killed_lease_or_not() {
        let clocks = Clocks::new();
        let mut watch = Watch::default();
        assert_eq!(watch.step(state(None, 0, &[10, 11]), clocks.wall, clocks.mono, true), Action::Wait);
        assert_eq!(
            watch.step(state(None, 0, &[10, 11]), clocks.wall, clocks.mono, false),
            Action::KillAndExit { groups: vec![10, 11] }
        );
        let mut watch = Watch::default();
        assert_eq!(watch.step(state(None, 0, &[10]), clocks.wall, clocks.mono, true), Action::Wait);
        assert_eq!(
            watch.step(Read::Removed, clocks.wall, clocks.mono, false),
            Action::KillAndExit { groups: vec![10] },
            "the last state read when the file is gone too"
        );
    }

    #[test]
    fn a_removed_file_with_the_agent_alive_is_a_clean_shutdown() {
        let clocks = Clocks::new();
        let mut watch = Watch::default();
        let past = clocks.wall_ms() - 1000;
        assert_eq!(watch.step(state(None, 0, &[10]), clocks.wall, clocks.mono, true), Action::Wait);
        assert_eq!(watch.step(Read::Removed, clocks.wall, clocks.mono, true), Action::Exit);
        let mut watch = Watch::default();
        assert!(matches!(watch.step(state(Some(past), 0, &[10]), clocks.wall, clocks.mono, true), Action::Kill { .. }));
        assert_eq!(watch.step(Read::Removed, clocks.wall, clocks.mono, true), Action::Exit);
    }

    #[test]
    fn an_unreadable_file_leaves_the_last_state_in_force() {
        let mut clocks = Clocks::new();
        let mut watch = Watch::default();
        let deadline = clocks.wall_ms() + 1000;
        assert_eq!(watch.step(state(Some(deadline), 0, &[10]), clocks.wall, clocks.mono, true), Action::Wait);
        clocks.advance(ms(1500));
        let garbage = Read::Unreadable("not JSON".into());
        assert_eq!(
            watch.step(garbage, clocks.wall, clocks.mono, true),
            Action::Kill { groups: vec![10], overdue: ms(500) }
        );
        let mut newer = LeaseState {
            version: FORMAT_VERSION + 1,
            lease_deadline_ms: None,
            kill_grace_ms: 0,
            groups: BTreeSet::new(),
        };
        newer.groups.insert(99);
        assert_eq!(
            watch.step(Read::State(newer), clocks.wall, clocks.mono, false),
            Action::KillAndExit { groups: vec![10] }
        );
    }

    #[test]
    fn the_command_line_needs_both_flags_and_a_real_pid() {
        let args = |list: &[&str]| WatchdogArgs::parse(list.iter().map(OsString::from));
        assert_eq!(
            args(&["--state", "/s", "--agent-pid", "42"]).unwrap(),
            WatchdogArgs { state: "/s".into(), agent_pid: 42 }
        );
        assert_eq!(args(&["--agent-pid", "1", "--state", "/s"]).unwrap().agent_pid, 1, "a container's init");
        for bad in [&["--state", "/s"][..], &["--state", "/s", "--agent-pid", "0"], &["--agent-pid"], &["--x", "1"]] {
            assert!(matches!(args(bad), Err(Error::Usage(_))), "{bad:?}");
        }
    }

    #[test]
    fn the_keeper_writes_deadline_and_groups_and_removes_the_file_when_stopped() {
        let parent = tempfile::tempdir().unwrap();
        let keeper = Watchdog::keep_in(parent.path(), ms(2500)).unwrap();
        let path = keeper.state_file();
        let read = || match read_state(&path) {
            Read::State(state) => state,
            other => panic!("{other:?}"),
        };
        assert_eq!((read().lease_deadline_ms, read().kill_grace_ms), (None, 2500));
        keeper.set_deadline(Some(UNIX_EPOCH + ms(1234)));
        keeper.add(1, ProcessGroup::of(100).unwrap());
        keeper.add(1, ProcessGroup::of(101).unwrap());
        keeper.add(2, ProcessGroup::of(200).unwrap());
        assert_eq!(read().lease_deadline_ms, Some(1234));
        assert_eq!(read().groups, BTreeSet::from([100, 101, 200]));
        keeper.remove_run(1);
        assert_eq!(read().groups, BTreeSet::from([200]));
        keeper.stop();
        assert_eq!(read_state(&path), Read::Removed);
        assert!(!path.parent().unwrap().exists(), "its private directory goes too");
        keeper.add(3, ProcessGroup::of(300).unwrap());
        assert_eq!(read_state(&path), Read::Removed, "nothing is written after a stop");
    }

    /// A `sleep` in a process group of its own, as the runner starts replicas.
    fn replica() -> Child {
        Command::new("sleep").arg("1000").process_group(0).spawn().unwrap()
    }

    fn killed_within(child: &mut Child, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().unwrap() {
                use std::os::unix::process::ExitStatusExt;
                return status.signal() == Some(9);
            }
            std::thread::sleep(ms(20));
        }
        false
    }

    #[test]
    fn the_loop_kills_listed_groups_when_the_lease_runs_out_and_exits_on_a_clean_shutdown() {
        let parent = tempfile::tempdir().unwrap();
        let keeper = Watchdog::keep_in(parent.path(), ms(0)).unwrap();
        let (mut listed, mut unlisted) = (replica(), replica());
        keeper.add(7, ProcessGroup::of(listed.id()).unwrap());
        keeper.set_deadline(Some(SystemTime::now() + ms(300)));
        let path = keeper.state_file();
        let watching = std::thread::spawn(move || watch(&path, || true, ms(20)));
        assert!(killed_within(&mut listed, PATIENCE), "the listed replica is SIGKILLed");
        assert!(unlisted.try_wait().unwrap().is_none(), "an unlisted process is left alone");
        keeper.stop();
        watching.join().unwrap();
        unlisted.kill().unwrap();
        unlisted.wait().unwrap();
    }

    #[test]
    fn the_loop_kills_every_listed_group_at_once_when_the_agent_is_gone() {
        let parent = tempfile::tempdir().unwrap();
        let keeper = Watchdog::keep_in(parent.path(), ms(0)).unwrap();
        let mut listed = replica();
        keeper.add(7, ProcessGroup::of(listed.id()).unwrap());
        let path = keeper.state_file();
        let agent = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let alive = Arc::clone(&agent);
        let watching =
            std::thread::spawn(move || watch(&path, move || alive.load(std::sync::atomic::Ordering::SeqCst), ms(20)));
        std::thread::sleep(ms(100));
        assert!(listed.try_wait().unwrap().is_none(), "no lease and a live agent: it runs on");
        agent.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(killed_within(&mut listed, PATIENCE), "the agent is gone: SIGKILL");
        watching.join().unwrap();
        assert_eq!(read_state(&keeper.state_file()), Read::Removed, "the watchdog cleans up after a dead agent");
    }
}
