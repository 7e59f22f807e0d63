//! Signals to a replica's process group: each replica runs as the leader of a group of its own,
//! so a signal reaches everything it started (a shell's children too).

use rustix::process::{Pid, Signal, kill_process_group};

/// A replica's process group, named by its leader's pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessGroup(Pid);

impl ProcessGroup {
    /// The group led by `pid`. None for pids 0 and 1, which would address the caller's own
    /// group or every process.
    pub fn of(pid: u32) -> Option<Self> {
        let raw = i32::try_from(pid).ok().filter(|&p| p > 1)?;
        Pid::from_raw(raw).map(Self)
    }

    /// The group's id (its leader's pid), as [`of`](Self::of) takes it.
    pub fn id(self) -> u32 {
        self.0.as_raw_nonzero().get().unsigned_abs()
    }

    /// Asks the group to stop (SIGTERM).
    pub fn terminate(self) {
        self.signal(Signal::TERM);
    }

    /// Stops the group at once (SIGKILL).
    pub fn kill(self) {
        self.signal(Signal::KILL);
    }

    fn signal(self, signal: Signal) {
        // ESRCH: every process of the group is gone already, which is what we want.
        if let Err(e) = kill_process_group(self.0, signal)
            && e != rustix::io::Errno::SRCH
        {
            tracing::warn!(pgid = self.0.as_raw_nonzero().get(), error = %e, "could not signal a job's process group");
        }
    }
}

/// The name of a signal number, for messages (`SIGKILL`); `signal 42` for others.
pub fn signal_name(number: i32) -> String {
    let name = match number {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return format!("signal {number}"),
    };
    format!("{name} ({number})")
}
