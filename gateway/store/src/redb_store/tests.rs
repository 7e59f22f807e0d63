use std::path::Path;

use super::*;
use crate::dir_lock::LOCK_FILE;
use crate::testing::conformance;

fn job_value(index: usize) -> Vec<u8> {
    format!("{{\"id\":\"job-{index:06}\",\"gpus\":8,\"state\":\"queued\",\"padding\":\"{}\"}}", "x".repeat(540))
        .into_bytes()
}

async fn fill(store: &RedbStore, records: usize, per_commit: usize) {
    for first in (0..records).step_by(per_commit) {
        let batch = (first..(first + per_commit).min(records))
            .map(|i| Write::put(format!("jobs/{i:06}"), job_value(i)))
            .collect();
        store.commit(batch).await.unwrap();
    }
}

#[tokio::test]
async fn redb_store_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path()).unwrap();
    conformance(&store).await;
    assert_eq!(store.describe(), format!("redb at {}", dir.path().join(DB_FILE).display()));
}

#[tokio::test]
async fn redb_store_on_a_simulated_disk_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open_with_backend(dir.path(), crate::testing::SimulatedDisk::new(1)).unwrap();
    conformance(&store).await;
}

#[tokio::test]
async fn committed_records_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path()).unwrap();
    fill(&store, 100, 16).await;
    store.commit(vec![Write::delete("jobs/000003")]).await.unwrap();
    drop(store);
    let store = RedbStore::open(dir.path()).unwrap();
    let entries = store.scan("jobs/").await.unwrap();
    assert_eq!(entries.len(), 99);
    assert_eq!(entries[3], ("jobs/000004".to_string(), job_value(4)));
}

#[test]
fn commits_and_scans_work_outside_a_tokio_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path()).unwrap();
    let runtime_free = async {
        store.commit(vec![Write::put("jobs/a", b"1".to_vec())]).await.unwrap();
        store.scan("jobs/").await.unwrap()
    };
    // A trivial executor: every future of RedbStore completes on its first poll outside a runtime.
    let mut future = std::pin::pin!(runtime_free);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut context) {
        std::task::Poll::Ready(entries) => assert_eq!(entries, vec![("jobs/a".to_string(), b"1".to_vec())]),
        std::task::Poll::Pending => panic!("expected the commit to run inline"),
    }
}

#[tokio::test]
async fn a_second_open_of_the_same_directory_is_refused_naming_the_holder_until_the_first_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let first = RedbStore::open(dir.path()).unwrap();
    match RedbStore::open(dir.path()).unwrap_err() {
        Error::Locked { path, holder } => {
            assert_eq!(path, dir.path().join(LOCK_FILE));
            assert!(holder.starts_with(&format!("pid={} host=", std::process::id())), "{holder}");
        }
        other => panic!("expected Locked, got {other}"),
    }
    drop(first);
    RedbStore::open(dir.path()).unwrap();
}

#[test]
fn a_file_that_is_not_a_database_refuses_to_open_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(DB_FILE), vec![b'x'; 64 * 1024]).unwrap();
    let error = RedbStore::open(dir.path()).unwrap_err();
    assert!(error.to_string().contains(&dir.path().join(DB_FILE).display().to_string()), "{error}");
}

/// Writes `records` records in batches of 16, closes the store and returns the file's length.
async fn written_store(dir: &Path, records: usize) -> u64 {
    let store = RedbStore::open(dir).unwrap();
    fill(&store, records, 16).await;
    drop(store);
    std::fs::metadata(dir.join(DB_FILE)).unwrap().len()
}

fn overwrite(path: &Path, offset: u64, bytes: &[u8]) {
    use std::io::{Seek, SeekFrom, Write as _};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

/// The offset of the first occurrence of `needle` in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

/// What an open of a damaged store did: refused naming the file, or opened with these entries.
enum Outcome {
    Refused(Error),
    Opened(Vec<(String, Vec<u8>)>),
}

async fn open_and_scan(open: impl FnOnce() -> Result<RedbStore>) -> Outcome {
    match open() {
        Ok(store) => Outcome::Opened(store.scan("jobs/").await.unwrap()),
        Err(error) => Outcome::Refused(error),
    }
}

fn all_intact(entries: &[(String, Vec<u8>)], records: usize) -> bool {
    entries.len() == records
        && entries.iter().enumerate().all(|(i, (key, value))| *key == format!("jobs/{i:06}") && *value == job_value(i))
}

#[tokio::test]
async fn damage_to_a_page_holding_records_refuses_to_open_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    written_store(dir.path(), 1000).await;
    let path = dir.path().join(DB_FILE);
    let offset = find(&std::fs::read(&path).unwrap(), b"job-000500").unwrap();
    overwrite(&path, offset as u64, b"JOB-000500");
    match open_and_scan(|| RedbStore::open(dir.path())).await {
        Outcome::Refused(Error::Corrupt { path: named, detail }) => {
            assert_eq!(named, path);
            assert!(!detail.is_empty());
        }
        Outcome::Refused(other) => panic!("expected Corrupt, got {other}"),
        Outcome::Opened(_) => panic!("a damaged record page was trusted"),
    }
}

#[tokio::test]
async fn damage_anywhere_in_a_closed_file_is_refused_as_corrupt_or_is_harmless() {
    // redb's file keeps free space, so damage can land where nothing lives: then every record must
    // still read back intact. Damage where something lives must refuse to open. Never a panic.
    let records = 1000;
    let original = tempfile::tempdir().unwrap();
    let len = written_store(original.path(), records).await;
    let image = std::fs::read(original.path().join(DB_FILE)).unwrap();
    let mut refused = 0;
    for twentieth in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DB_FILE);
        let mut damaged = image.clone();
        let offset = (len * twentieth / 20) as usize + 100;
        damaged[offset..offset + 256].iter_mut().for_each(|byte| *byte ^= 0x5a);
        std::fs::write(&path, damaged).unwrap();
        match open_and_scan(|| RedbStore::open(dir.path())).await {
            Outcome::Refused(Error::Corrupt { path: named, .. }) => {
                assert_eq!(named, path);
                refused += 1;
            }
            Outcome::Refused(other) => panic!("damage at {offset}: expected Corrupt, got {other}"),
            Outcome::Opened(entries) => assert!(all_intact(&entries, records), "damage at {offset} changed records"),
        }
    }
    assert!(refused >= 3, "only {refused} of 20 damaged files were refused");
}

#[tokio::test]
async fn after_a_power_loss_damage_to_older_pages_is_refused() {
    use crate::testing::SimulatedDisk;
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::new(3);
    let store = RedbStore::open_with_backend(dir.path(), disk.clone()).unwrap();
    fill(&store, 500, 16).await;
    store.commit(vec![Write::put("jobs/last", b"last".to_vec())]).await.unwrap();
    let mut image = disk.crash().durable_image();
    drop(store);
    let offset = find(&image, b"job-000100").unwrap();
    image[offset] ^= 0x5a;
    match open_and_scan(|| RedbStore::open_with_backend(dir.path(), SimulatedDisk::from_image(image, 1))).await {
        Outcome::Refused(Error::Corrupt { detail, .. }) => assert!(detail.contains("corrupted"), "{detail}"),
        Outcome::Refused(other) => panic!("expected Corrupt, got {other}"),
        Outcome::Opened(_) => panic!("a damaged record page was trusted"),
    }
}

#[tokio::test]
async fn after_a_power_loss_damage_to_the_last_acknowledged_commit_is_refused() {
    use crate::testing::SimulatedDisk;
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::new(3);
    let store = RedbStore::open_with_backend(dir.path(), disk.clone()).unwrap();
    fill(&store, 100, 16).await;
    store.commit(vec![Write::put("jobs/last", b"the last acknowledged commit".to_vec())]).await.unwrap();
    let mut image = disk.crash().durable_image();
    drop(store);
    let offset = find(&image, b"the last acknowledged commit").unwrap();
    image[offset] ^= 0x5a;
    match open_and_scan(|| RedbStore::open_with_backend(dir.path(), SimulatedDisk::from_image(image, 1))).await {
        Outcome::Refused(Error::Corrupt { detail, .. }) => assert!(detail.contains("corrupted"), "{detail}"),
        Outcome::Refused(other) => panic!("expected Corrupt, got {other}"),
        Outcome::Opened(entries) => {
            panic!("opened with {} records: the acknowledged commit was dropped", entries.len())
        }
    }

    // What two-phase commit buys: redb's default one-phase commit opens the same damage without
    // the last commit, as if it had been torn by the power loss.
    let disk = SimulatedDisk::new(3);
    let db = Builder::new().create_with_backend(disk.clone()).unwrap();
    for (key, value) in
        [("jobs/first", b"an earlier commit".as_slice()), ("jobs/last", b"the last acknowledged commit")]
    {
        let transaction = db.begin_write().unwrap();
        transaction.open_table(ENTRIES).unwrap().insert(key, value).unwrap();
        transaction.commit().unwrap();
    }
    let mut image = disk.crash().durable_image();
    drop(db);
    let offset = find(&image, b"the last acknowledged commit").unwrap();
    image[offset] ^= 0x5a;
    let mut builder = Builder::new();
    builder.set_check_integrity_on_open(true);
    let db = builder.create_with_backend(SimulatedDisk::from_image(image, 1)).unwrap();
    let transaction = db.begin_read().unwrap();
    let table = transaction.open_table(ENTRIES).unwrap();
    assert!(table.get("jobs/first").unwrap().is_some());
    assert!(table.get("jobs/last").unwrap().is_none(), "one-phase commit rolled the acknowledged commit back");
}

fn write_old_log(dir: &Path, text: &str) {
    std::fs::write(dir.join(OLD_LOG_FILE), text).unwrap();
}

const OLD_LOG: &str = concat!(
    "{\"key\":\"jobs/a\",\"value\":\"{\\\"gpus\\\":8}\"}\n",
    "{\"key\":\"jobs/b\",\"value\":\"b1\"}\n",
    "{\"key\":\"nodes/n1\",\"value\":\"ready\"}\n",
    "{\"key\":\"jobs/b\"}\n",
    "{\"key\":\"jobs/c\",\"value\":\"c1\"}\n",
    "{\"key\":\"jobs/d\",\"val",
);

#[tokio::test]
async fn the_old_log_is_imported_once_then_renamed() {
    let dir = tempfile::tempdir().unwrap();
    write_old_log(dir.path(), OLD_LOG);
    let store = RedbStore::open(dir.path()).unwrap();
    let expected: Vec<(String, Vec<u8>)> = vec![
        ("jobs/a".into(), b"{\"gpus\":8}".to_vec()),
        ("jobs/c".into(), b"c1".to_vec()),
        ("nodes/n1".into(), b"ready".to_vec()),
    ];
    assert_eq!(store.scan("").await.unwrap(), expected);
    assert!(!dir.path().join(OLD_LOG_FILE).exists());
    assert_eq!(std::fs::read_to_string(dir.path().join(IMPORTED_LOG_FILE)).unwrap(), OLD_LOG);
    assert!(!dir.path().join(IMPORTING_FILE).exists());

    store.commit(vec![Write::delete("jobs/a")]).await.unwrap();
    drop(store);
    let store = RedbStore::open(dir.path()).unwrap();
    assert_eq!(store.scan("").await.unwrap(), expected[1..].to_vec(), "the import does not run again");
}

#[tokio::test]
async fn a_corrupt_old_log_line_refuses_to_open_naming_the_line_and_imports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_old_log(
        dir.path(),
        "{\"key\":\"jobs/a\",\"value\":\"1\"}\n{\"key\":\"jobs/b\",\"value\":2}\n{\"key\":\"jobs/c\"}\n",
    );
    match RedbStore::open(dir.path()).unwrap_err() {
        Error::CorruptOldLog { path, line, detail } => {
            assert_eq!(path, dir.path().join(OLD_LOG_FILE));
            assert_eq!(line, 2);
            assert!(detail.contains("invalid type"), "{detail}");
        }
        other => panic!("expected CorruptOldLog, got {other}"),
    }
    assert!(dir.path().join(OLD_LOG_FILE).exists(), "the log is kept for the operator to fix");
    assert!(!dir.path().join(DB_FILE).exists(), "nothing was imported");
}

#[tokio::test]
async fn an_import_interrupted_before_its_rename_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    write_old_log(dir.path(), OLD_LOG);
    std::fs::write(dir.path().join(IMPORTING_FILE), b"half-written by a crashed import").unwrap();
    let store = RedbStore::open(dir.path()).unwrap();
    assert_eq!(store.scan("jobs/").await.unwrap().len(), 2);
}

#[tokio::test]
async fn an_import_interrupted_after_the_store_was_renamed_finishes_by_renaming_the_log() {
    let dir = tempfile::tempdir().unwrap();
    write_old_log(dir.path(), OLD_LOG);
    drop(RedbStore::open(dir.path()).unwrap());
    // As if the crash came between the two renames.
    std::fs::rename(dir.path().join(IMPORTED_LOG_FILE), dir.path().join(OLD_LOG_FILE)).unwrap();
    let store = RedbStore::open(dir.path()).unwrap();
    assert_eq!(store.scan("jobs/").await.unwrap().len(), 2);
    assert!(!dir.path().join(OLD_LOG_FILE).exists());
    assert!(dir.path().join(IMPORTED_LOG_FILE).exists());
}

#[tokio::test]
async fn a_different_old_log_beside_an_imported_store_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    write_old_log(dir.path(), OLD_LOG);
    drop(RedbStore::open(dir.path()).unwrap());
    let other_log = "{\"key\":\"jobs/z\",\"value\":\"restored from somewhere\"}\n";
    write_old_log(dir.path(), other_log);
    let store = RedbStore::open(dir.path()).unwrap();
    assert_eq!(store.scan("jobs/").await.unwrap().len(), 2, "the other log is not imported");
    assert_eq!(std::fs::read_to_string(dir.path().join(OLD_LOG_FILE)).unwrap(), other_log);
    assert_eq!(std::fs::read_to_string(dir.path().join(IMPORTED_LOG_FILE)).unwrap(), OLD_LOG);
}

#[tokio::test]
async fn an_old_log_beside_a_store_that_was_not_imported_from_it_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path()).unwrap();
    store.commit(vec![Write::put("jobs/new", b"1".to_vec())]).await.unwrap();
    drop(store);
    write_old_log(dir.path(), OLD_LOG);
    let store = RedbStore::open(dir.path()).unwrap();
    assert_eq!(store.scan("").await.unwrap(), vec![("jobs/new".to_string(), b"1".to_vec())]);
    assert!(dir.path().join(OLD_LOG_FILE).exists());
}

#[tokio::test]
async fn a_store_written_in_a_newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(RedbStore::open(dir.path()).unwrap());
    {
        let db = Database::create(dir.path().join(DB_FILE)).unwrap();
        let transaction = db.begin_write().unwrap();
        transaction.open_table(META).unwrap().insert(FORMAT_VERSION_KEY, FORMAT_VERSION + 1).unwrap();
        transaction.commit().unwrap();
    }
    match RedbStore::open(dir.path()).unwrap_err() {
        Error::UnsupportedFormat { found, supported, .. } => assert_eq!((found, supported), (2, 1)),
        other => panic!("expected UnsupportedFormat, got {other}"),
    }
}
