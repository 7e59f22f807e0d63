//! The exclusive lock on a data directory: `<dir>/LOCK`, held for the store's lifetime.
//!
//! Two gateways writing one directory would each believe their own acknowledged state, so the
//! second refuses to start. The holder writes who it is into the file so the refusal can say whom
//! to stop. The lock is an OS file lock (`flock` on Linux), so it disappears with the process,
//! even after `kill -9`; a stale `LOCK` file is harmless.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

/// The lock file's name inside the data directory.
pub(crate) const LOCK_FILE: &str = "LOCK";

/// A held lock on a data directory; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct DirLock {
    // Never read: holding the open, locked file is what keeps the lock.
    _file: File,
}

impl DirLock {
    /// Takes the exclusive lock on `dir` without waiting, and records this process as its holder.
    pub(crate) fn acquire(dir: &Path) -> Result<DirLock> {
        let path = dir.join(LOCK_FILE);
        // No truncation before the lock is ours: the file names the current holder.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(Error::io(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Locked { holder: read_holder(&mut file), path });
            }
            Err(std::fs::TryLockError::Error(source)) => return Err(Error::Io { path, source }),
        }
        write_holder(&mut file, &holder_text()).map_err(Error::io(&path))?;
        Ok(DirLock { _file: file })
    }
}

/// `pid=<pid> host=<hostname> since=<unix seconds>`.
fn holder_text() -> String {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_secs()).unwrap_or(0);
    format!("pid={} host={} since={since}", std::process::id(), hostname())
}

fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(PathBuf::from(path)).ok())
        .map(|name| name.trim().to_string())
        .find(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

fn write_holder(file: &mut File, text: &str) -> std::io::Result<()> {
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(text.as_bytes())?;
    file.write_all(b"\n")
}

/// The holder's self-description, or why it is unknown. Best effort: it only words an error.
fn read_holder(file: &mut File) -> String {
    let mut text = String::new();
    match file.read_to_string(&mut text) {
        Ok(_) if !text.trim().is_empty() => text.trim().to_string(),
        // The holder has locked but not yet written, or wrote before a crash of an older version.
        Ok(_) => "unknown: the lock file is empty".to_string(),
        Err(error) => format!("unknown: cannot read the lock file: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path()).unwrap();
        let error = DirLock::acquire(dir.path()).unwrap_err();
        match error {
            Error::Locked { path, holder } => {
                assert_eq!(path, dir.path().join(LOCK_FILE));
                assert!(holder.starts_with(&format!("pid={} host=", std::process::id())), "{holder}");
                assert!(holder.contains(" since="), "{holder}");
            }
            other => panic!("expected Locked, got {other}"),
        }
        drop(first);
        DirLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn a_stale_lock_file_from_a_dead_process_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), "pid=1 host=gone since=0\n").unwrap();
        let _lock = DirLock::acquire(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert!(text.starts_with(&format!("pid={} ", std::process::id())), "{text}");
    }
}
