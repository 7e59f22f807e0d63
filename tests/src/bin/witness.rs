//! `witness [SECONDS]`: a job that records its own life, for tests that must know how many
//! copies of a job ran and when, without asking the code under test.
//!
//! Run as a job's `payload.command` with `MERIDIAN_WITNESS_DIR` in its environment. It writes
//! `<dir>/<job id>.<pid>` (see the `witness` module of this crate for the format), stamps the
//! time into it every 5 ms, and exits 0 after SECONDS (default 600), when `<dir>/STOP` appears
//! or `<dir>` is removed, or on SIGTERM/SIGKILL (the default actions; the last stamp is then at
//! most one tick old).

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[allow(dead_code)]
// the binary writes the format; reading it back is the tests' part
// The library's module, compiled in so this small binary does not link the whole test library;
// its `pub` items are the library's interface, unreachable only from here.
#[allow(unreachable_pub)]
#[path = "../witness.rs"]
mod witness;

use witness::JobCopy;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("witness: {message}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let seconds: f64 = match std::env::args().nth(1) {
        Some(text) => text.parse().map_err(|e| format!("runtime `{text}` is not a number of seconds: {e}"))?,
        None => 600.0,
    };
    let runtime = Duration::try_from_secs_f64(seconds).map_err(|e| format!("runtime {seconds}: {e}"))?;
    let dir =
        PathBuf::from(std::env::var_os(witness::DIR_ENV).ok_or_else(|| format!("{} is not set", witness::DIR_ENV))?);
    let job_id = std::env::var("MERIDIAN_JOB_ID").map_err(|e| format!("MERIDIAN_JOB_ID: {e}"))?;
    let fencing_token = witness::TOKEN_ENVS.iter().find_map(|name| std::env::var(name).ok()?.parse().ok());
    let cluster = std::env::var(witness::CLUSTER_ENV).unwrap_or_else(|_| "-".to_string());
    let started = Instant::now();
    let start_ns = witness::now_ns();
    let pid = std::process::id();
    let copy = JobCopy { job_id, fencing_token, cluster, pid, start_ns, alive_ns: start_ns };
    let text = witness::render(&copy);

    // Written under a temporary name and renamed, so a reader never sees half a header.
    let name = witness::file_name(&copy.job_id, pid);
    let temporary = dir.join(format!(".{name}.tmp"));
    let path = dir.join(&name);
    let mut file = std::fs::File::create(&temporary).map_err(|e| format!("creating {}: {e}", temporary.display()))?;
    file.write_all(text.as_bytes()).map_err(|e| format!("writing {}: {e}", temporary.display()))?;
    std::fs::rename(&temporary, &path).map_err(|e| format!("renaming to {}: {e}", path.display()))?;
    let offset = witness::alive_offset(&text);
    let stop = dir.join(witness::STOP_FILE);

    loop {
        std::thread::sleep(witness::TICK);
        let stamp = witness::stamp(witness::now_ns());
        file.write_at(stamp.as_bytes(), offset).map_err(|e| format!("stamping {}: {e}", path.display()))?;
        // The test that started it is over when it says so or its directory is gone.
        if started.elapsed() >= runtime || stop.exists() || !dir.exists() {
            return Ok(());
        }
    }
}
