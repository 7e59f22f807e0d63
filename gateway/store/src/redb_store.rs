//! [`RedbStore`]: the store in an embedded redb file, `<data dir>/meridian.redb`.
//!
//! Each batch is one redb write transaction with the default durability (`Immediate`: the commit
//! returns once it is fsynced), committed in two phases: redb fsyncs the new pages, then writes
//! and fsyncs the header that points at them. A power loss before the second fsync leaves the
//! previous commit in force, which is normal crash recovery.
//!
//! Why not redb's default one-phase commit (one fsync, then checksums decide after a crash): it
//! cannot tell a torn last commit from an acknowledged one whose pages were damaged later, and
//! silently rolls the acknowledged one back. With two phases the header is trusted, so the same
//! damage refuses to open (the test `after_a_power_loss_damage_to_the_last_acknowledged_commit_is_refused`
//! shows both). The second fsync cost 39–52 % of the single-record commit rate and 10–37 % of the
//! records/s at 64 records per commit in our runs (see `## Store` in `docs/benchmarks.md`); group
//! commit keeps batches large exactly when that matters. To trade this back, remove
//! `set_two_phase_commit` in `begin_write` and change that test.
//!
//! Every open verifies the checksums of the whole file (`set_check_integrity_on_open`): without
//! that, redb trusts a cleanly closed file and, by its documentation, may panic or return garbage
//! on a damaged page later. The check reads the file once, which start-up's full scan does anyway.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use redb::{
    Builder, Database, DatabaseError, ReadableDatabase, StorageBackend, StorageError, TableDefinition, TableError,
    WriteTransaction,
};

use crate::dir_lock::DirLock;
use crate::error::{Error, Result};
use crate::old_log::{IMPORTED_LOG_FILE, OLD_LOG_FILE, read_old_log};
use crate::{BoxFuture, Store, Write};

/// The database file's name inside the data directory.
pub(crate) const DB_FILE: &str = "meridian.redb";
/// Where an import of the old log builds the database before renaming it to [`DB_FILE`].
const IMPORTING_FILE: &str = "meridian.redb.importing";

/// The gateway's keys and values.
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
/// Facts about the file itself: its format version and whether it came from the old log.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const FORMAT_VERSION_KEY: &str = "format_version";
/// Unix seconds at which the old log was imported into this file.
const IMPORTED_OLD_LOG_AT_KEY: &str = "imported_old_log_at";
/// The imported old log's length in bytes: a log found beside the store is renamed away as
/// imported only if it still has this length.
const IMPORTED_OLD_LOG_BYTES_KEY: &str = "imported_old_log_bytes";
/// The layout of [`ENTRIES`] and [`META`] this build reads and writes.
const FORMAT_VERSION: u64 = 1;

/// A durable [`Store`] in a redb file, holding the data directory's `LOCK` while open.
///
/// Commits and scans run on Tokio's blocking pool, so they never stall async workers (outside a
/// Tokio runtime they run on the calling thread). Clones share the open file, the lock and the
/// failed state; once the last clone and any commit still running are gone, the file is closed and
/// then the lock released.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    /// The database file, or the data directory when the store runs on a caller's backend.
    path: PathBuf,
    description: String,
    /// The first failure's cause; set once, never cleared.
    failure: OnceLock<String>,
    // Declared last so that it is dropped last: the lock is released only after the file is closed.
    _lock: DirLock,
}

impl RedbStore {
    /// Opens (or creates) the store in the data directory `dir`, creating the directory if needed.
    ///
    /// - Takes the exclusive lock `dir/LOCK` first; if another process holds it, returns
    ///   [`Error::Locked`] with what that process wrote there (`pid=… host=… since=…`).
    /// - If `dir/meridian.redb` does not exist but the previous release's `dir/log.jsonl` does,
    ///   imports the log's live entries in one transaction, then renames the log to
    ///   `log.jsonl.imported`. A damaged line other than a torn last one fails the open with
    ///   [`Error::CorruptOldLog`], importing nothing.
    /// - Verifies the file: damage fails the open with [`Error::Corrupt`] naming the file, while an
    ///   unfinished last transaction (a crash during a commit) is rolled back as usual.
    ///
    /// This blocks (file I/O, and reading the whole file): call it before serving, or from
    /// `spawn_blocking`.
    pub fn open(dir: &Path) -> Result<RedbStore> {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        let lock = DirLock::acquire(dir)?;
        let db_path = dir.join(DB_FILE);
        let log_path = dir.join(OLD_LOG_FILE);
        let db_exists = db_path.try_exists().map_err(Error::io(&db_path))?;
        let log_exists = log_path.try_exists().map_err(Error::io(&log_path))?;
        if !db_exists && log_exists {
            import_old_log(dir)?;
        }
        let db = open_database(&db_path, |builder| builder.create(&db_path))?;
        let imported_log_bytes = ensure_format(&db, &db_path)?;
        if log_exists {
            finish_old_log(dir, imported_log_bytes)?;
        }
        let description = format!("redb at {}", db_path.display());
        Ok(RedbStore::from_parts(db, db_path, description, lock))
    }

    /// Opens (or creates) the store on a caller-supplied redb storage backend instead of
    /// `dir/meridian.redb`, still holding `dir/LOCK`. Test support: this is how
    /// `testing::SimulatedDisk` (feature `testing`) injects disk faults. No old log is imported.
    pub fn open_with_backend(dir: &Path, backend: impl StorageBackend) -> Result<RedbStore> {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        let lock = DirLock::acquire(dir)?;
        let path = dir.to_path_buf();
        let description = format!("redb on {backend:?} (lock in {})", dir.display());
        let db = open_database(&path, |builder| builder.create_with_backend(backend))?;
        ensure_format(&db, &path)?;
        Ok(RedbStore::from_parts(db, path, description, lock))
    }

    fn from_parts(db: Database, path: PathBuf, description: String, lock: DirLock) -> RedbStore {
        RedbStore { inner: Arc::new(Inner { db, path, description, failure: OnceLock::new(), _lock: lock }) }
    }
}

impl Store for RedbStore {
    fn commit(&self, batch: Vec<Write>) -> BoxFuture<'_, Result<()>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return inner.commit_now(batch);
            };
            let task_inner = Arc::clone(&inner);
            match runtime.spawn_blocking(move || task_inner.commit_now(batch)).await {
                Ok(result) => result,
                // The outcome is unknown: treat it as an I/O failure.
                Err(join_error) => {
                    Err(inner.fail(format!("the commit to {} did not finish ({join_error})", inner.path.display())))
                }
            }
        })
    }

    fn scan(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, Vec<u8>)>>> {
        let inner = Arc::clone(&self.inner);
        let prefix = prefix.to_string();
        Box::pin(async move {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return inner.scan_now(&prefix);
            };
            let task_inner = Arc::clone(&inner);
            match runtime.spawn_blocking(move || task_inner.scan_now(&prefix)).await {
                Ok(result) => result,
                Err(join_error) => Err(Error::Database { path: inner.path.clone(), source: Box::new(join_error) }),
            }
        })
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure.get().cloned()
    }

    fn describe(&self) -> String {
        self.inner.description.clone()
    }
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("at", &self.inner.description)
            .field("failure", &self.inner.failure.get())
            .finish()
    }
}

impl Inner {
    fn commit_now(&self, batch: Vec<Write>) -> Result<()> {
        if let Some(cause) = self.failure.get() {
            return Err(Error::Failed { cause: cause.clone() });
        }
        if batch.is_empty() {
            return Ok(());
        }
        apply(&self.db, batch)
            .map_err(|error| self.fail(format!("the commit to {} failed: {error}", self.path.display())))
    }

    fn scan_now(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        if let Some(cause) = self.failure.get() {
            return Err(Error::Failed { cause: cause.clone() });
        }
        scan_entries(&self.db, prefix).map_err(|error| {
            if matches!(error, redb::Error::Io(_)) {
                // redb refuses every later write after an I/O error; keep this cause, not its echo.
                self.fail(format!("reading {} failed: {error}", self.path.display()));
            }
            Error::Database { path: self.path.clone(), source: Box::new(error) }
        })
    }

    /// Puts the store into the failed state, unless it already is, and returns the error for it.
    fn fail(&self, cause: String) -> Error {
        let mut newly_failed = false;
        let first = self.failure.get_or_init(|| {
            newly_failed = true;
            cause
        });
        if newly_failed {
            tracing::error!(store = %self.description, cause = %first, "the store failed; it refuses writes until restarted");
        }
        Error::Failed { cause: first.clone() }
    }
}

/// Starts a write transaction that commits in two phases (see the module documentation).
fn begin_write(db: &Database) -> Result<WriteTransaction, redb::Error> {
    let mut transaction = db.begin_write()?;
    transaction.set_two_phase_commit(true);
    Ok(transaction)
}

/// Applies `batch` in one durable transaction.
fn apply(db: &Database, batch: Vec<Write>) -> Result<(), redb::Error> {
    let transaction = begin_write(db)?;
    {
        let mut table = transaction.open_table(ENTRIES)?;
        for write in batch {
            match write {
                Write::Put { key, value } => {
                    table.insert(key.as_str(), value.as_slice())?;
                }
                Write::Delete { key } => {
                    table.remove(key.as_str())?;
                }
            }
        }
    }
    transaction.commit()?;
    Ok(())
}

fn scan_entries(db: &Database, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, redb::Error> {
    let transaction = db.begin_read()?;
    let table = match transaction.open_table(ENTRIES) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(error) => return Err(error.into()),
    };
    let mut entries = Vec::new();
    for entry in table.range(prefix..)? {
        let (key, value) = entry?;
        let key = key.value();
        if !key.starts_with(prefix) {
            break;
        }
        entries.push((key.to_string(), value.value().to_vec()));
    }
    Ok(entries)
}

/// Opens a database with the store's settings, naming `path` in errors.
fn open_database(
    path: &Path,
    open: impl FnOnce(&Builder) -> std::result::Result<Database, DatabaseError>,
) -> Result<Database> {
    let mut builder = Builder::new();
    builder.set_check_integrity_on_open(true);
    open(&builder).map_err(|error| open_error(path, error))
}

fn open_error(path: &Path, error: DatabaseError) -> Error {
    let path = path.to_path_buf();
    match error {
        DatabaseError::DatabaseAlreadyOpen => Error::Locked {
            path,
            holder: "a process that does not use the data directory's LOCK file (a redb tool?) has the database open"
                .to_string(),
        },
        DatabaseError::Storage(StorageError::Corrupted(detail)) => Error::Corrupt { path, detail },
        DatabaseError::Storage(StorageError::Io(source)) => Error::Io { path, source },
        other => Error::Database { path, source: Box::new(other) },
    }
}

/// Checks the file's format version, recording it in a new file; returns the length of the old
/// log the file was imported from, if it was.
fn ensure_format(db: &Database, path: &Path) -> Result<Option<u64>> {
    let database_error = |error: redb::Error| Error::Database { path: path.to_path_buf(), source: Box::new(error) };
    let (version, imported) = read_meta(db).map_err(database_error)?;
    match version {
        Some(FORMAT_VERSION) => Ok(imported),
        Some(found) => Err(Error::UnsupportedFormat { path: path.to_path_buf(), found, supported: FORMAT_VERSION }),
        None => {
            initialize(db, &[]).map_err(database_error)?;
            Ok(imported)
        }
    }
}

/// The format version and the imported old log's length, where recorded.
fn read_meta(db: &Database) -> Result<(Option<u64>, Option<u64>), redb::Error> {
    let transaction = db.begin_read()?;
    let meta = match transaction.open_table(META) {
        Ok(meta) => meta,
        Err(TableError::TableDoesNotExist(_)) => return Ok((None, None)),
        Err(error) => return Err(error.into()),
    };
    let version = meta.get(FORMAT_VERSION_KEY)?.map(|version| version.value());
    let imported_log_bytes = meta.get(IMPORTED_OLD_LOG_BYTES_KEY)?.map(|bytes| bytes.value());
    Ok((version, imported_log_bytes))
}

/// Records the format version and creates the tables, with `meta` and `entries`, in one transaction.
fn initialize(db: &Database, meta: &[(&str, u64)]) -> Result<(), redb::Error> {
    initialize_with(db, meta, std::iter::empty())
}

fn initialize_with<'a>(
    db: &Database,
    meta: &[(&str, u64)],
    entries: impl Iterator<Item = (&'a String, &'a Vec<u8>)>,
) -> Result<(), redb::Error> {
    let transaction = begin_write(db)?;
    {
        let mut meta_table = transaction.open_table(META)?;
        meta_table.insert(FORMAT_VERSION_KEY, FORMAT_VERSION)?;
        for (key, value) in meta {
            meta_table.insert(*key, *value)?;
        }
        let mut table = transaction.open_table(ENTRIES)?;
        for (key, value) in entries {
            table.insert(key.as_str(), value.as_slice())?;
        }
    }
    transaction.commit()?;
    Ok(())
}

/// Builds `meridian.redb` from the old log: in a side file first, renamed into place only once
/// committed, so a crash during the import leaves the log to be imported again.
fn import_old_log(dir: &Path) -> Result<()> {
    let log_path = dir.join(OLD_LOG_FILE);
    let importing_path = dir.join(IMPORTING_FILE);
    let db_path = dir.join(DB_FILE);
    let (entries, log_bytes) = read_old_log(&log_path)?;
    match std::fs::remove_file(&importing_path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(Error::Io { path: importing_path, source: error }),
    }
    let db = open_database(&importing_path, |builder| builder.create(&importing_path))?;
    let imported_at = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_secs()).unwrap_or(0);
    let meta = [(IMPORTED_OLD_LOG_AT_KEY, imported_at), (IMPORTED_OLD_LOG_BYTES_KEY, log_bytes)];
    initialize_with(&db, &meta, entries.iter())
        .map_err(|error| Error::Database { path: importing_path.clone(), source: Box::new(error) })?;
    db.close().map_err(|error| open_error(&importing_path, error))?;
    std::fs::rename(&importing_path, &db_path).map_err(Error::io(&db_path))?;
    sync_directory(dir)?;
    tracing::info!(
        from = %log_path.display(),
        into = %db_path.display(),
        entries = entries.len(),
        "imported the previous release's log"
    );
    Ok(())
}

/// Renames the old log away once imported (an interrupted import's last step); leaves, and
/// reports, a log that this store was not imported from.
fn finish_old_log(dir: &Path, imported_log_bytes: Option<u64>) -> Result<()> {
    let log_path = dir.join(OLD_LOG_FILE);
    let log_bytes = std::fs::metadata(&log_path).map_err(Error::io(&log_path))?.len();
    if imported_log_bytes != Some(log_bytes) {
        tracing::warn!(
            log = %log_path.display(),
            "ignoring the previous release's log: this data directory already has a store that was not imported from it; move the log away to silence this warning"
        );
        return Ok(());
    }
    let imported_path = dir.join(IMPORTED_LOG_FILE);
    std::fs::rename(&log_path, &imported_path).map_err(Error::io(&imported_path))?;
    sync_directory(dir)
}

/// Makes renames in `dir` durable.
fn sync_directory(dir: &Path) -> Result<()> {
    std::fs::File::open(dir).and_then(|directory| directory.sync_all()).map_err(Error::io(dir))
}

#[cfg(test)]
mod fault_injection_tests;
#[cfg(test)]
mod tests;
