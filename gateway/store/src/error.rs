//! Errors of the store, worded for operators, plus a path-free text for clients.

use std::path::PathBuf;

/// The result of store operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a store operation failed.
///
/// `Display` is written for operators: what went wrong, where (the path) and what to do. It can
/// name paths and hosts, so never send it to HTTP clients; use [`Error::public_message`] there.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or directory of the store could not be created, read, written or renamed.
    #[error(
        "cannot access {}: {source}; check that the data directory exists, that the gateway's user may read and write it, and that its disk is healthy",
        path.display()
    )]
    Io {
        /// The file or directory the operation was on.
        path: PathBuf,
        /// What the operating system reported.
        #[source]
        source: std::io::Error,
    },

    /// Another process holds the data directory's lock.
    #[error(
        "the data directory's lock {} is held by another process ({holder}); stop that gateway, or give this one another data directory",
        path.display()
    )]
    Locked {
        /// The lock file (`<data dir>/LOCK`), or the database file when a process that does not use
        /// the lock file has it open.
        path: PathBuf,
        /// What the holder wrote into the lock file: `pid=… host=… since=…`.
        holder: String,
    },

    /// The database file is damaged, so the store refuses to open it.
    #[error(
        "the store {} is damaged: {detail}; the gateway will not start on it: move the file aside and restore the data directory from a backup",
        path.display()
    )]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What the database engine reported.
        detail: String,
    },

    /// A line of the previous release's `log.jsonl` cannot be read, so it was not imported.
    #[error(
        "cannot import {} line {line}: {detail}; nothing was imported: fix or remove that line (keep a copy of the file), then start the gateway again",
        path.display()
    )]
    CorruptOldLog {
        /// The old log file.
        path: PathBuf,
        /// The line's number, counted from 1.
        line: usize,
        /// Why the line was refused.
        detail: String,
    },

    /// The database was written by a newer gateway in a format this one cannot read.
    #[error(
        "the store {} has format version {found}, but this gateway reads version {supported}; run a gateway release that supports it",
        path.display()
    )]
    UnsupportedFormat {
        /// The database file.
        path: PathBuf,
        /// The format version recorded in the file.
        found: u64,
        /// The format version this build reads and writes.
        supported: u64,
    },

    /// An earlier commit failed, so the store refuses every write until it is reopened.
    ///
    /// Every commit acknowledged before the failure is durable; the failed one may or may not be.
    #[error(
        "the store failed and refuses writes until the gateway is restarted: {cause}; fix that cause (disk space, disk health), then restart the gateway"
    )]
    Failed {
        /// The first failure, worded for operators.
        cause: String,
    },

    /// A batch is larger than the store takes in one transaction; nothing was written and the
    /// store has not failed.
    #[error(
        "a batch of {writes} writes and {bytes} bytes is larger than {store} takes in one transaction ({max_writes} writes, {max_bytes} bytes); nothing was written"
    )]
    TooLarge {
        /// What the store is.
        store: String,
        /// Writes in the batch.
        writes: usize,
        /// Bytes in the batch.
        bytes: usize,
        /// The store's limit on writes.
        max_writes: usize,
        /// The store's limit on bytes.
        max_bytes: usize,
    },

    /// etcd could not be reached or refused a request.
    #[error("etcd at {endpoints}: {detail}")]
    Etcd {
        /// The endpoints asked.
        endpoints: String,
        /// What etcd or the connection reported.
        detail: String,
    },

    /// This gateway is no longer the leader, so its commit was refused (etcd's compare on the
    /// election key failed); nothing was written.
    #[error("this gateway is no longer the leader (election key {key} is gone or newer); nothing was written")]
    NotLeader {
        /// The election key this gateway held.
        key: String,
    },

    /// A sealed (encrypted) value or the key file could not be used.
    #[error("secrets at rest: {detail}")]
    Sealing {
        /// What is wrong, worded for operators (names the key file or key id, never a secret).
        detail: String,
    },

    /// The database engine reported an error not covered above.
    #[error("the database {} reported an error: {source}", path.display())]
    Database {
        /// The database file.
        path: PathBuf,
        /// The engine's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl Error {
    /// A short text for clients (HTTP bodies, gRPC statuses): what happened, without paths, hosts
    /// or process ids.
    pub fn public_message(&self) -> &'static str {
        match self {
            Error::Io { .. } => "the gateway's store cannot access its disk",
            Error::Locked { .. } => "the gateway's store is in use by another process",
            Error::Corrupt { .. } | Error::CorruptOldLog { .. } => "the gateway's store is damaged",
            Error::UnsupportedFormat { .. } => "the gateway's store was written by a newer release",
            Error::Failed { .. } => "the gateway's store failed to write; it refuses writes until restarted",
            Error::Database { .. } => "the gateway's store reported an internal error",
            Error::TooLarge { .. } => "the change is larger than the gateway's store takes at once",
            Error::Etcd { .. } => "the gateway cannot reach its store (etcd)",
            Error::NotLeader { .. } => "this gateway is no longer the leader",
            Error::Sealing { .. } => "the gateway cannot encrypt or decrypt a stored secret",
        }
    }

    /// Wraps an I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_messages_name_the_path_and_public_messages_do_not() {
        let errors = [
            Error::Io { path: "/data/meridian.redb".into(), source: std::io::Error::other("boom") },
            Error::Locked { path: "/data/LOCK".into(), holder: "pid=7 host=a since=1".into() },
            Error::Corrupt { path: "/data/meridian.redb".into(), detail: "bad checksum".into() },
            Error::CorruptOldLog { path: "/data/log.jsonl".into(), line: 3, detail: "not JSON".into() },
            Error::UnsupportedFormat { path: "/data/meridian.redb".into(), found: 9, supported: 1 },
            Error::Failed { cause: "commit to /data/meridian.redb failed".into() },
            Error::Database { path: "/data/meridian.redb".into(), source: "engine".into() },
        ];
        for error in errors {
            assert!(error.to_string().contains("/data/"), "{error}");
            assert!(!error.public_message().contains('/'), "{}", error.public_message());
        }
    }

    #[test]
    fn etcd_errors_name_hosts_and_keys_for_operators_only() {
        let errors = [
            Error::Etcd { endpoints: "http://10.0.0.1:2379".into(), detail: "commit: no answer within 3s".into() },
            Error::NotLeader { key: "/meridian/election/gateway/694d".into() },
            Error::TooLarge {
                store: "etcd at http://10.0.0.1:2379 under /meridian/".into(),
                writes: 129,
                bytes: 10,
                max_writes: 128,
                max_bytes: 1_000_000,
            },
        ];
        for error in errors {
            let text = error.to_string();
            assert!(text.contains("10.0.0.1") || text.contains("/meridian/election/gateway/694d"), "{text}");
            let public = error.public_message();
            assert!(!public.contains('/') && !public.contains("10.0.0.1"), "{public}");
        }
    }

    #[test]
    fn a_too_large_error_says_the_batch_and_the_limits() {
        let error = Error::TooLarge { store: "etcd".into(), writes: 129, bytes: 10, max_writes: 128, max_bytes: 99 };
        assert_eq!(
            error.to_string(),
            "a batch of 129 writes and 10 bytes is larger than etcd takes in one transaction (128 writes, 99 bytes); nothing was written"
        );
    }

    #[test]
    fn a_lock_error_names_the_holder() {
        let error = Error::Locked { path: "/data/LOCK".into(), holder: "pid=42 host=gw-1 since=5".into() };
        assert!(error.to_string().contains("pid=42 host=gw-1"));
    }
}
