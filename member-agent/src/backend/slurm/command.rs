//! Running Slurm's command-line tools with a deadline.
//!
//! Every call spawns the tool (from `binDir` or `PATH`, with `SLURM_CONF` when configured), feeds
//! it optional stdin, and kills it when the deadline passes: a hung controller gives a
//! [`BackendError::Transient`], never a hung call.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::super::BackendError;

/// How to start Slurm's tools.
#[derive(Debug, Clone)]
pub(crate) struct Runner {
    /// Directory of the tools; None: `PATH`.
    pub(crate) bin_dir: Option<PathBuf>,
    /// `SLURM_CONF` to set; None: inherited.
    pub(crate) slurm_conf: Option<PathBuf>,
    /// Deadline of one command.
    pub(crate) timeout: Duration,
}

/// What a finished command said.
#[derive(Debug, Clone)]
pub(crate) struct Output {
    /// Exit status (None: killed by a signal).
    pub(crate) code: Option<i32>,
    /// Standard output, lossily decoded.
    pub(crate) stdout: String,
    /// Standard error, lossily decoded.
    pub(crate) stderr: String,
}

impl Output {
    /// Whether the command exited 0.
    pub(crate) fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Standard error without the tools' `sbatch: error: ` prefixes, lines joined by `; `.
    pub(crate) fn message(&self) -> String {
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .map(|line| {
                let line = line.trim();
                match line.split_once(": error: ") {
                    Some((_, rest)) => rest,
                    None => line,
                }
            })
            .filter(|line| !line.is_empty())
            .collect();
        if lines.is_empty() { format!("exit status {:?}", self.code) } else { lines.join("; ") }
    }

    /// Whether the message says the controller could not be reached or was busy.
    pub(crate) fn is_transient(&self) -> bool {
        is_transient_message(&self.stderr)
    }
}

/// Messages of Slurm's tools that mean "try again later" rather than "no".
pub(crate) fn is_transient_message(text: &str) -> bool {
    const MARKERS: &[&str] = &[
        "Unable to contact slurm controller",
        "Socket timed out",
        "Connection refused",
        "temporarily unavailable",
        "Slurm temporarily unable",
        "Zero Bytes were transmitted",
        "Communication connection failure",
        "Munge encode failed",
        "Unable to establish",
        "try again",
    ];
    MARKERS.iter().any(|m| text.to_ascii_lowercase().contains(&m.to_ascii_lowercase()))
}

impl Runner {
    /// Runs `tool args…` with `stdin`, within the deadline.
    ///
    /// A tool that cannot be started is permanent (the config points at the wrong place); one
    /// that outlives the deadline is transient. A non-zero exit is returned as an [`Output`]
    /// for the caller to judge.
    pub(crate) async fn run(&self, tool: &str, args: &[String], stdin: Option<&str>) -> Result<Output, BackendError> {
        let program = match &self.bin_dir {
            Some(dir) => dir.join(tool),
            None => PathBuf::from(tool),
        };
        let mut command = Command::new(&program);
        command
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(conf) = &self.slurm_conf {
            command.env("SLURM_CONF", conf);
        }
        let mut child = command.spawn().map_err(|e| BackendError::Permanent {
            message: format!(
                "cannot run `{}` (set slurm.binDir to the directory of Slurm's commands)",
                program.display()
            ),
            source: Some(Box::new(e)),
        })?;
        let input = stdin.map(str::to_owned);
        let mut pipe = child.stdin.take();
        let work = async move {
            if let (Some(pipe), Some(text)) = (pipe.as_mut(), input) {
                // A tool that exits without reading its stdin is judged by its exit status.
                let _ = pipe.write_all(text.as_bytes()).await;
            }
            drop(pipe);
            child.wait_with_output().await
        };
        match tokio::time::timeout(self.timeout, work).await {
            Err(_) => Err(BackendError::transient(format!(
                "`{tool}` did not answer within {:?} (slurm.commandTimeout); is slurmctld up?",
                self.timeout
            ))),
            Ok(Err(e)) => Err(BackendError::Transient {
                message: format!("`{tool}` failed while running"),
                source: Some(Box::new(e)),
            }),
            Ok(Ok(out)) => Ok(Output {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }),
        }
    }

    /// Runs a read-only query: any failure is transient (the controller may come back).
    pub(crate) async fn query(&self, tool: &str, args: &[String]) -> Result<String, BackendError> {
        let out = self.run(tool, args, None).await?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(BackendError::transient(format!("`{tool}` failed: {}", out.message())))
        }
    }
}

/// `&str` arguments as the owned strings [`Runner::run`] takes.
pub(crate) fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_bin(script: &str) -> (tempfile::TempDir, Runner) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sbatch");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let runner =
            Runner { bin_dir: Some(dir.path().to_path_buf()), slurm_conf: None, timeout: Duration::from_millis(500) };
        (dir, runner)
    }

    #[tokio::test]
    async fn a_hung_command_is_a_transient_error_at_its_deadline() {
        let (_dir, runner) = fake_bin("#!/bin/sh\nexec sleep 30\n");
        let started = std::time::Instant::now();
        let err = runner.run("sbatch", &[], Some("#!/bin/sh\n")).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(err.to_string().contains("commandTimeout"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "the call returned at its deadline");
    }

    #[tokio::test]
    async fn stdin_is_fed_and_errors_lose_their_prefix() {
        let (_dir, runner) = fake_bin(
            "#!/bin/sh\ncat >/dev/null\necho 'sbatch: error: Batch job submission failed: Nope' >&2\nexit 1\n",
        );
        let out = runner.run("sbatch", &[], Some("script")).await.unwrap();
        assert!(!out.success());
        assert_eq!(out.message(), "Batch job submission failed: Nope");
        assert!(!out.is_transient());
    }

    #[tokio::test]
    async fn a_missing_tool_is_permanent_and_names_bin_dir() {
        let runner = Runner {
            bin_dir: Some("/nonexistent/slurm/bin".into()),
            slurm_conf: None,
            timeout: Duration::from_secs(1),
        };
        let err = runner.run("squeue", &[], None).await.unwrap_err();
        assert!(!err.is_transient());
        assert!(err.to_string().contains("slurm.binDir"), "{err}");
    }

    #[test]
    fn controller_outages_are_transient() {
        assert!(is_transient_message(
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
        ));
        assert!(!is_transient_message(
            "sbatch: error: Batch job submission failed: Requested node configuration is not available"
        ));
    }
}
