//! Durable state behind the gateway.
//!
//! [`Store`] is a small key-value interface (put, delete, scan by prefix) so that an etcd
//! implementation can sit behind it later; [`FileStore`] is the embedded default: an append-only
//! JSON-lines log, fsynced on every write, replayed on open and compacted when it grows.
//! Typed helpers ([`JobRecord`] and [`KnownCluster`]) wrap values with a schema version marker.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use meridian_proto::inventory::{ClusterInfo, Inventory};
use meridian_proto::job::JobState;
use meridian_proto::spec::JobSpec;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Schema version written with every stored object.
pub const SCHEMA_VERSION: u32 = 1;
const JOB_PREFIX: &str = "jobs/";
const CLUSTER_PREFIX: &str = "clusters/";
/// Compact once the log holds this many more records than live keys.
const COMPACT_SLACK: usize = 10_000;

/// What went wrong with the store.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the data directory failed.
    #[error("store I/O on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A log line in the middle of the file is not a valid record.
    #[error("store log {path} line {line} is corrupt: {reason}")]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What the parser said.
        reason: String,
    },
    /// A stored value could not be encoded or decoded.
    #[error("stored value under `{key}` does not decode: {source}")]
    Codec {
        /// The key.
        key: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// A stored object was written by a newer Meridian.
    #[error("stored value under `{key}` has schema version {found}; this gateway reads up to {SCHEMA_VERSION}")]
    TooNew {
        /// The key.
        key: String,
        /// Version found.
        found: u32,
    },
    /// The store's lock was poisoned by a panic in another thread.
    #[error("store lock poisoned")]
    Poisoned,
}

/// Module result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Durable key-value storage. Writes are durable when they return.
pub trait Store: Send + Sync {
    /// Writes `value` under `key`.
    fn put(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Removes `key` (no error when absent).
    fn delete(&self, key: &str) -> Result<()>;
    /// All entries whose key starts with `prefix`, in key order.
    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>>;
}

/// A job as the gateway keeps it: the spec plus where it is in its life.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    /// Gateway-assigned id (`j-…`).
    pub id: String,
    /// The validated spec as submitted.
    pub spec: JobSpec,
    /// Current state.
    pub state: JobState,
    /// Cluster the job is offered to, bound to or ran on.
    pub cluster: Option<String>,
    /// Generation of the current binding; bumps on every offer so stale copies can be fenced off.
    pub fencing_token: u64,
    /// Last human-readable note (placement summary, failure reason).
    pub message: String,
    /// The placement decision that sent the job to its cluster, in one sentence with numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// Unix milliseconds.
    pub submitted_at_ms: i64,
    /// When all replicas started (Unix ms).
    pub started_at_ms: Option<i64>,
    /// When it reached a terminal state (Unix ms).
    pub finished_at_ms: Option<i64>,
    /// GPU type placement chose on `cluster` (the offer pins the member to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Nodes the replicas run on, as the member reported.
    #[serde(default)]
    pub nodes: Vec<String>,
}

/// A cluster the gateway has seen, remembered across restarts so jobs that could never run
/// anywhere are still refused while agents reconnect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KnownCluster {
    /// Identity and prices.
    pub info: ClusterInfo,
    /// Last reported inventory (its shapes say what could ever fit).
    pub inventory: Inventory,
}

#[derive(Serialize, Deserialize)]
struct Versioned<T> {
    v: u32,
    #[serde(flatten)]
    data: T,
}

fn encode<T: Serialize>(key: &str, data: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(&Versioned { v: SCHEMA_VERSION, data })
        .map_err(|source| Error::Codec { key: key.to_string(), source })
}

#[derive(Deserialize)]
struct VersionOnly {
    v: u32,
}

fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T> {
    let codec = |source| Error::Codec { key: key.to_string(), source };
    // The version first: a newer layout must be refused as such, not misread as corrupt.
    let VersionOnly { v } = serde_json::from_slice(bytes).map_err(codec)?;
    if v > SCHEMA_VERSION {
        return Err(Error::TooNew { key: key.to_string(), found: v });
    }
    let versioned: Versioned<T> = serde_json::from_slice(bytes).map_err(codec)?;
    Ok(versioned.data)
}

/// Saves a job record.
pub fn save_job(store: &dyn Store, job: &JobRecord) -> Result<()> {
    let key = format!("{JOB_PREFIX}{}", job.id);
    store.put(&key, &encode(&key, job)?)
}

/// Loads every job record.
pub fn load_jobs(store: &dyn Store) -> Result<Vec<JobRecord>> {
    store.scan(JOB_PREFIX)?.into_iter().map(|(key, bytes)| decode(&key, &bytes)).collect()
}

/// Saves what the gateway knows of a cluster.
pub fn save_cluster(store: &dyn Store, cluster: &KnownCluster) -> Result<()> {
    let key = format!("{CLUSTER_PREFIX}{}", cluster.info.name);
    store.put(&key, &encode(&key, cluster)?)
}

/// Loads every known cluster.
pub fn load_clusters(store: &dyn Store) -> Result<Vec<KnownCluster>> {
    store.scan(CLUSTER_PREFIX)?.into_iter().map(|(key, bytes)| decode(&key, &bytes)).collect()
}

#[derive(Serialize, Deserialize)]
struct LogRecord {
    key: String,
    /// Absent for a delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
}

/// The embedded store: one directory with an append-only log.
pub struct FileStore {
    inner: Mutex<FileInner>,
}

struct FileInner {
    dir: PathBuf,
    log: File,
    records: usize,
    entries: BTreeMap<String, Vec<u8>>,
    compact_slack: usize,
}

impl FileStore {
    /// Opens (creating if needed) the store in `dir`, replaying its log. A torn last line (a
    /// crash mid-write) is dropped; a corrupt line elsewhere is an error naming its line.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_with_slack(dir, COMPACT_SLACK)
    }

    fn open_with_slack(dir: impl AsRef<Path>, compact_slack: usize) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(|source| Error::Io { path: dir.clone(), source })?;
        let path = dir.join("log.jsonl");
        let mut entries = BTreeMap::new();
        let mut records = 0;
        if path.exists() {
            let file = File::open(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
            let lines: Vec<String> = BufReader::new(file)
                .lines()
                .collect::<std::io::Result<_>>()
                .map_err(|source| Error::Io { path: path.clone(), source })?;
            let count = lines.len();
            for (index, line) in lines.into_iter().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<LogRecord>(&line) {
                    Ok(record) => {
                        records += 1;
                        match record.value {
                            Some(value) => entries.insert(record.key, value.into_bytes()),
                            None => entries.remove(&record.key),
                        };
                    }
                    Err(_) if index + 1 == count => {
                        tracing::warn!(path = %path.display(), line = index + 1, "dropping torn last log line");
                    }
                    Err(e) => {
                        return Err(Error::Corrupt { path, line: index + 1, reason: e.to_string() });
                    }
                }
            }
        }
        let log = open_append(&path)?;
        let mut inner = FileInner { dir, log, records, entries, compact_slack };
        // Rewrite on open: drops a torn tail and history, so the log starts clean.
        inner.compact()?;
        Ok(Self { inner: Mutex::new(inner) })
    }
}

fn open_append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

impl FileInner {
    fn log_path(&self) -> PathBuf {
        self.dir.join("log.jsonl")
    }

    fn append(&mut self, record: &LogRecord) -> Result<()> {
        let path = self.log_path();
        let mut line = serde_json::to_vec(record).map_err(|source| Error::Codec { key: record.key.clone(), source })?;
        line.push(b'\n');
        self.log.write_all(&line).map_err(|source| Error::Io { path: path.clone(), source })?;
        self.log.sync_data().map_err(|source| Error::Io { path, source })?;
        self.records += 1;
        if self.records > self.entries.len() + self.compact_slack {
            self.compact()?;
        }
        Ok(())
    }

    /// Writes the live entries to a new file, fsyncs it and renames it over the log.
    fn compact(&mut self) -> Result<()> {
        let path = self.log_path();
        let tmp = self.dir.join("log.jsonl.tmp");
        let io = |source| Error::Io { path: tmp.clone(), source };
        let mut out = std::io::BufWriter::new(File::create(&tmp).map_err(io)?);
        for (key, value) in &self.entries {
            let record = LogRecord { key: key.clone(), value: Some(String::from_utf8_lossy(value).into_owned()) };
            serde_json::to_writer(&mut out, &record).map_err(|source| Error::Codec { key: key.clone(), source })?;
            out.write_all(b"\n").map_err(io)?;
        }
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        fs::rename(&tmp, &path).map_err(|source| Error::Io { path: path.clone(), source })?;
        if let Ok(dir) = File::open(&self.dir) {
            // Make the rename itself durable; not all platforms allow fsync on a directory.
            let _ = dir.sync_all();
        }
        self.log = open_append(&path)?;
        self.records = self.entries.len();
        Ok(())
    }
}

impl Store for FileStore {
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut inner = self.inner.lock().map_err(|_| Error::Poisoned)?;
        let text = String::from_utf8_lossy(value).into_owned();
        inner.append(&LogRecord { key: key.to_string(), value: Some(text) })?;
        inner.entries.insert(key.to_string(), value.to_vec());
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<()> {
        let mut inner = self.inner.lock().map_err(|_| Error::Poisoned)?;
        if inner.entries.contains_key(key) {
            inner.append(&LogRecord { key: key.to_string(), value: None })?;
            inner.entries.remove(key);
        }
        Ok(())
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let inner = self.inner.lock().map_err(|_| Error::Poisoned)?;
        Ok(inner
            .entries
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

/// A store that forgets everything when dropped: for the demo and tests that do not need a disk.
#[derive(Default)]
pub struct MemoryStore {
    entries: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl Store for MemoryStore {
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.entries.lock().map_err(|_| Error::Poisoned)?.insert(key.to_string(), value.to_vec());
        Ok(())
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.entries.lock().map_err(|_| Error::Poisoned)?.remove(key);
        Ok(())
    }

    fn scan(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let entries = self.entries.lock().map_err(|_| Error::Poisoned)?;
        Ok(entries
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conformance suite every `Store` implementation must pass.
    fn conformance(store: &dyn Store) {
        store.put("jobs/a", b"1").unwrap();
        store.put("jobs/b", b"2").unwrap();
        store.put("clusters/x", b"3").unwrap();
        store.put("jobs/a", b"4").unwrap();
        assert_eq!(
            store.scan("jobs/").unwrap(),
            vec![("jobs/a".into(), b"4".to_vec()), ("jobs/b".into(), b"2".to_vec())]
        );
        store.delete("jobs/a").unwrap();
        store.delete("jobs/missing").unwrap();
        assert_eq!(store.scan("jobs/").unwrap(), vec![("jobs/b".into(), b"2".to_vec())]);
        assert_eq!(store.scan("").unwrap().len(), 2);
    }

    #[test]
    fn memory_store_passes_conformance() {
        conformance(&MemoryStore::default());
    }

    #[test]
    fn file_store_passes_conformance() {
        let dir = tempfile::tempdir().unwrap();
        conformance(&FileStore::open(dir.path()).unwrap());
    }

    #[test]
    fn file_store_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = FileStore::open(dir.path()).unwrap();
            store.put("jobs/a", b"{\"x\":1}").unwrap();
            store.put("jobs/b", b"2").unwrap();
            store.delete("jobs/b").unwrap();
        }
        let store = FileStore::open(dir.path()).unwrap();
        assert_eq!(store.scan("jobs/").unwrap(), vec![("jobs/a".into(), b"{\"x\":1}".to_vec())]);
    }

    #[test]
    fn a_torn_last_line_is_dropped_but_earlier_corruption_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = FileStore::open(dir.path()).unwrap();
            store.put("jobs/a", b"1").unwrap();
        }
        let log = dir.path().join("log.jsonl");
        let mut text = fs::read_to_string(&log).unwrap();
        text.push_str("{\"key\":\"jobs/b\",\"val");
        fs::write(&log, &text).unwrap();
        let store = FileStore::open(dir.path()).unwrap();
        assert_eq!(store.scan("jobs/").unwrap().len(), 1);
        drop(store);

        fs::write(&log, format!("garbage\n{}", fs::read_to_string(&log).unwrap())).unwrap();
        match FileStore::open(dir.path()) {
            Err(Error::Corrupt { line, .. }) => assert_eq!(line, 1),
            other => panic!("expected corruption error, got {:?}", other.err()),
        }
    }

    #[test]
    fn compaction_keeps_only_live_entries() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open_with_slack(dir.path(), 20).unwrap();
        for i in 0..70 {
            store.put("jobs/hot", i.to_string().as_bytes()).unwrap();
        }
        let lines = fs::read_to_string(dir.path().join("log.jsonl")).unwrap().lines().count();
        assert!(lines <= 21, "log kept {lines} lines");
        drop(store);
        let store = FileStore::open(dir.path()).unwrap();
        let expected = 69.to_string().into_bytes();
        assert_eq!(store.scan("jobs/").unwrap(), vec![("jobs/hot".into(), expected)]);
    }

    #[test]
    fn newer_schema_versions_are_refused() {
        let store = MemoryStore::default();
        store.put("jobs/x", br#"{"v":99}"#).unwrap();
        assert!(matches!(load_jobs(&store), Err(Error::TooNew { found: 99, .. })));
    }
}
