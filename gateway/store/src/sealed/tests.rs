use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::*;
use crate::testing::conformance;
use crate::{MemoryStore, RedbStore};

const SECRET: &[u8] = b"s3cr3t-hunter2-value";

fn record_with_secret() -> Vec<u8> {
    let mut record = b"{\"v\":1,\"data\":{\"payload\":{\"env\":{\"TOKEN\":\"".to_vec();
    record.extend_from_slice(SECRET);
    record.extend_from_slice(b"\"},\"secretEnv\":[\"TOKEN\"]}}}");
    record
}

fn ring(ids: &[(&str, u8)]) -> KeyRing {
    KeyRing::from_keys(ids.iter().map(|(id, fill)| (id.to_string(), [*fill; 32])).collect()).unwrap()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

fn sealing_detail(error: Error) -> String {
    match error {
        Error::Sealing { detail } => detail,
        other => panic!("expected Error::Sealing, got {other}"),
    }
}

// --- sealing and opening ------------------------------------------------------------------------

#[test]
fn a_sealed_value_opens_to_the_same_bytes() {
    let ring = ring(&[("k1", 1)]);
    for plain in [record_with_secret(), Vec::new(), vec![0, 255, b'\n', 0], vec![7; 1 << 20]] {
        let sealed = ring.seal("jobs/a", &plain).unwrap();
        assert_eq!(ring.open("jobs/a", &sealed).unwrap(), plain);
    }
}

#[test]
fn the_sealed_bytes_hold_no_run_of_the_secret() {
    let ring = ring(&[("k1", 1)]);
    let sealed = ring.seal("jobs/a", SECRET).unwrap();
    assert!(!contains(&sealed, SECRET));
    // Not even four bytes in a row of it (a chance match of random bytes is about 1 in 10^7).
    for run in SECRET.windows(4) {
        assert!(!contains(&sealed, run), "{:?} appears in the sealed bytes", String::from_utf8_lossy(run));
    }
    assert!(sealed.starts_with(MAGIC));
    assert_eq!(sealed.len(), SECRET.len() + MAGIC.len() + 1 + "k1".len() + NONCE_LEN + TAG_LEN);
}

#[test]
fn sealing_the_same_value_twice_gives_different_bytes() {
    let ring = ring(&[("k1", 1)]);
    let first = ring.seal("jobs/a", SECRET).unwrap();
    let second = ring.seal("jobs/a", SECRET).unwrap();
    assert_ne!(first, second, "each seal must use a fresh nonce");
    let nonce = |sealed: &[u8]| sealed[MAGIC.len() + 1 + 2..][..NONCE_LEN].to_vec();
    assert_ne!(nonce(&first), nonce(&second));
}

#[test]
fn a_value_moved_to_another_store_key_does_not_open() {
    let ring = ring(&[("k1", 1)]);
    let sealed = ring.seal("jobs/a", SECRET).unwrap();
    let detail = sealing_detail(ring.open("jobs/b", &sealed).unwrap_err());
    assert!(detail.contains("jobs/b") && detail.contains("key k1"), "{detail}");
    assert!(!contains(detail.as_bytes(), SECRET), "{detail}");
}

#[test]
fn any_flipped_byte_makes_a_sealed_value_fail_to_open() {
    let ring = ring(&[("k1", 1), ("k2", 2)]);
    let sealed = ring.seal("jobs/a", &record_with_secret()).unwrap();
    for position in 0..sealed.len() {
        for bit in [0x01, 0x80] {
            let mut damaged = sealed.clone();
            damaged[position] ^= bit;
            match ring.open("jobs/a", &damaged) {
                Err(error) => {
                    let detail = sealing_detail(error);
                    assert!(detail.contains("jobs/a"), "{detail}");
                    assert!(!contains(detail.as_bytes(), SECRET), "{detail}");
                }
                // Only the leading NUL marks a value as sealed: without it the bytes are taken as
                // a record from before sealing and handed on (where they do not parse as one).
                Ok(opened) => {
                    assert_eq!(position, 0, "flipping byte {position} went unnoticed");
                    assert_eq!(opened, damaged);
                }
            }
        }
    }
}

#[test]
fn a_value_sealed_with_an_unknown_key_fails_naming_that_key() {
    let old = ring(&[("old-key", 1)]);
    let new = ring(&[("new-key", 2)]);
    let sealed = old.seal("jobs/a", SECRET).unwrap();
    let detail = sealing_detail(new.open("jobs/a", &sealed).unwrap_err());
    assert!(detail.contains("key old-key") && detail.contains("jobs/a") && detail.contains("new-key"), "{detail}");
}

#[test]
fn a_key_with_a_known_id_but_other_bytes_does_not_open() {
    let sealed = ring(&[("k1", 1)]).seal("jobs/a", SECRET).unwrap();
    let detail = sealing_detail(ring(&[("k1", 9)]).open("jobs/a", &sealed).unwrap_err());
    assert!(detail.contains("jobs/a") && detail.contains("key k1"), "{detail}");
}

#[test]
fn a_value_written_before_sealing_is_returned_as_it_is() {
    let ring = ring(&[("k1", 1)]);
    let record = record_with_secret();
    assert_eq!(ring.open("jobs/a", &record).unwrap(), record);
    assert_eq!(ring.open("jobs/a", b"").unwrap(), b"");
}

#[test]
fn a_value_starting_with_nul_in_another_format_is_refused() {
    let ring = ring(&[("k1", 1)]);
    for stored in [&b"\0MRS2whatever-a-newer-gateway-wrote"[..], b"\0", b"\0MRS1", b"\0MRS1\x02k1short"] {
        let detail = sealing_detail(ring.open("jobs/a", stored).unwrap_err());
        assert!(detail.contains("jobs/a"), "{detail}");
    }
}

#[test]
fn the_overhead_is_the_most_sealing_adds() {
    assert_eq!(TAG_LEN, CHACHA20_POLY1305.tag_len());
    assert_eq!(NONCE_LEN, CHACHA20_POLY1305.nonce_len());
    assert_eq!(KeyRing::OVERHEAD, 66);
    let longest_id = "k".repeat(MAX_ID_LEN);
    let ring = KeyRing::from_keys(vec![(longest_id, [1; 32])]).unwrap();
    for len in [0, 1, 1000] {
        assert_eq!(ring.seal("jobs/a", &vec![b'x'; len]).unwrap().len(), len + KeyRing::OVERHEAD);
    }
}

// --- rotation -----------------------------------------------------------------------------------

#[test]
fn a_ring_with_a_new_primary_opens_values_sealed_with_the_old_key() {
    let before = ring(&[("old", 1)]);
    let after = ring(&[("new", 2), ("old", 1)]);
    let sealed_before = before.seal("jobs/a", SECRET).unwrap();
    assert_eq!(after.open("jobs/a", &sealed_before).unwrap(), SECRET);
    assert_eq!(after.primary_id(), "new");
    assert_eq!(after.ids().collect::<Vec<_>>(), ["new", "old"]);
    // New writes use the new key, which the old ring cannot open: hence step 1 of a rotation.
    let sealed_after = after.seal("jobs/a", SECRET).unwrap();
    assert!(before.open("jobs/a", &sealed_after).is_err());
}

#[test]
fn plain_and_old_key_values_need_a_reseal_and_primary_key_values_do_not() {
    let old = ring(&[("old", 1)]);
    let ring = ring(&[("new", 2), ("old", 1)]);
    assert!(ring.needs_reseal(&old.seal("jobs/a", SECRET).unwrap()));
    assert!(ring.needs_reseal(&record_with_secret()));
    assert!(ring.needs_reseal(b""));
    assert!(ring.needs_reseal(b"\0MRS1\x00"));
    assert!(!ring.needs_reseal(&ring.seal("jobs/a", SECRET).unwrap()));
}

#[test]
fn a_ring_refuses_no_keys_a_bad_id_and_a_repeated_id() {
    assert!(KeyRing::from_keys(Vec::new()).is_err());
    for bad in ["", "-k", "K1", "k_1", "k 1", &"k".repeat(33)] {
        let detail = sealing_detail(KeyRing::from_keys(vec![(bad.to_string(), [1; 32])]).unwrap_err());
        assert!(detail.contains("key 1 of 1"), "{detail}");
    }
    let twice = KeyRing::from_keys(vec![("k1".to_string(), [1; 32]), ("k1".to_string(), [2; 32])]);
    assert!(sealing_detail(twice.unwrap_err()).contains("k1 appears twice"));
}

#[test]
fn the_debug_form_shows_ids_and_no_key_bytes() {
    let ring = ring(&[("k1", 0xab), ("k0", 0xcd)]);
    let debug = format!("{ring:?}");
    assert!(debug.contains("k1") && debug.contains("k0"), "{debug}");
    for leak in ["171", "ab", "205", "cd", &STANDARD.encode([0xab; 32])] {
        assert!(!debug.contains(leak), "{debug}");
    }
}

// --- the key file -------------------------------------------------------------------------------

fn key_text(fill: u8) -> String {
    STANDARD.encode([fill; 32])
}

fn write_key_file(dir: &Path, text: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join("keys");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[test]
fn a_key_file_with_comments_and_blank_lines_loads_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "# primary first\n\n  k2026-new : {}  \r\n# an older key, still opening old values\nk1:{}\n\n",
        key_text(2),
        key_text(1)
    );
    let path = write_key_file(dir.path(), &text, 0o600);
    let loaded = KeyRing::load(&path).unwrap();
    assert_eq!(loaded.ids().collect::<Vec<_>>(), ["k2026-new", "k1"]);
    let expected = ring(&[("k2026-new", 2), ("k1", 1)]);
    assert_eq!(expected.open("jobs/a", &loaded.seal("jobs/a", SECRET).unwrap()).unwrap(), SECRET);
    assert_eq!(loaded.open("jobs/a", &ring(&[("k1", 1)]).seal("jobs/a", SECRET).unwrap()).unwrap(), SECRET);
}

#[test]
fn a_bad_key_file_is_refused_naming_the_line_without_the_key() {
    let short_key = STANDARD.encode([3u8; 16]);
    let cases: Vec<(String, &str, Vec<String>)> = vec![
        (format!("# c\nk1:{}\nk2:{}$$\n", key_text(1), key_text(2)), "line 3", vec![key_text(1), key_text(2)]),
        (format!("k1:{short_key}\n"), "line 1", vec![short_key.clone()]),
        (format!("k1:{}\n\nk1:{}\n", key_text(1), key_text(2)), "line 3", vec![key_text(1), key_text(2)]),
        (format!("Bad_Id:{}\n", key_text(4)), "line 1", vec![key_text(4), "Bad_Id".to_string()]),
        (format!("{}\n", key_text(5)), "line 1", vec![key_text(5)]),
        (format!("k1:{}\n", key_text(6).trim_end_matches('=')), "line 1", vec![key_text(6)[..40].to_string()]),
    ];
    let expected_problems = [
        "not valid base64",
        "16 bytes long",
        "already used on line 1",
        "key id is not valid",
        "not a key line",
        "not valid base64",
    ];
    for ((text, line, secrets), problem) in cases.into_iter().zip(expected_problems) {
        let dir = tempfile::tempdir().unwrap();
        let path = write_key_file(dir.path(), &text, 0o600);
        let detail = sealing_detail(KeyRing::load(&path).unwrap_err());
        assert!(detail.contains(&format!("{} {line}:", path.display())), "{detail}");
        assert!(detail.contains(problem), "{detail}");
        for secret in secrets {
            assert!(!detail.contains(&secret), "{detail} repeats {secret}");
        }
    }
}

#[test]
fn a_key_file_without_keys_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for text in ["", "# only a comment\n\n"] {
        let path = write_key_file(dir.path(), text, 0o600);
        let detail = sealing_detail(KeyRing::load(&path).unwrap_err());
        assert!(detail.contains(&format!("{} holds no key", path.display())), "{detail}");
    }
}

#[test]
fn a_key_file_that_is_not_utf8_is_refused_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let mut bytes = format!("k1:{}\n", key_text(1)).into_bytes();
    bytes.extend_from_slice(b"k2:\xff\xfe\n");
    std::fs::write(&path, bytes).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let detail = sealing_detail(KeyRing::load(&path).unwrap_err());
    assert!(detail.contains("line 2: is not UTF-8"), "{detail}");
}

#[test]
fn a_key_file_others_may_read_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    for mode in [0o644, 0o640, 0o606, 0o620] {
        let path = write_key_file(dir.path(), &format!("k1:{}\n", key_text(1)), mode);
        let detail = sealing_detail(KeyRing::load(&path).unwrap_err());
        assert!(detail.contains(&format!("chmod 600 {}", path.display())), "{detail}");
        assert!(detail.contains(&format!("{mode:04o}")), "{detail}");
        assert!(!detail.contains(&key_text(1)), "{detail}");
    }
}

#[test]
fn a_missing_key_file_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent");
    assert!(matches!(KeyRing::load(&path), Err(Error::Io { path: named, .. }) if named == path));
}

#[test]
fn load_or_create_creates_a_private_key_file_once() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-yet").join("secrets.keys");
    let created = KeyRing::load_or_create(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let id = created.primary_id().to_string();
    assert!(id.starts_with('k') && id.len() > 1 && id[1..].bytes().all(|byte| byte.is_ascii_digit()), "{id}");
    assert_eq!(created.ids().count(), 1);

    let text = std::fs::read_to_string(&path).unwrap();
    let loaded = KeyRing::load_or_create(&path).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "the second call must not rewrite the file");
    assert_eq!(loaded.primary_id(), id);
    assert_eq!(loaded.open("jobs/a", &created.seal("jobs/a", SECRET).unwrap()).unwrap(), SECRET);

    let names: Vec<_> =
        std::fs::read_dir(path.parent().unwrap()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(names, ["secrets.keys"], "no side file is left behind");
}

#[test]
fn load_or_create_loads_an_existing_file_and_keeps_its_checks() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_key_file(dir.path(), &format!("k7:{}\n", key_text(7)), 0o600);
    assert_eq!(KeyRing::load_or_create(&path).unwrap().primary_id(), "k7");
    let path = write_key_file(dir.path(), &format!("k7:{}\n", key_text(7)), 0o644);
    assert!(sealing_detail(KeyRing::load_or_create(&path).unwrap_err()).contains("chmod 600"));
}

// --- the sealed store ---------------------------------------------------------------------------

fn sealed_memory_store(ring: KeyRing) -> SealedStore<MemoryStore> {
    SealedStore::new(MemoryStore::new(), Arc::new(ring))
}

#[tokio::test]
async fn a_sealed_memory_store_passes_the_conformance_suite() {
    conformance(&sealed_memory_store(ring(&[("k1", 1)]))).await;
}

#[tokio::test]
async fn a_sealed_store_can_be_used_as_a_type_erased_store() {
    let store: Arc<dyn Store> = Arc::new(sealed_memory_store(ring(&[("k1", 1)])));
    store.commit(vec![Write::put("jobs/a", SECRET.to_vec())]).await.unwrap();
    assert_eq!(store.scan("jobs/").await.unwrap(), vec![("jobs/a".to_string(), SECRET.to_vec())]);
}

#[tokio::test]
async fn the_inner_store_holds_only_sealed_values() {
    let store = sealed_memory_store(ring(&[("k1", 1)]));
    store.commit(vec![Write::put("jobs/a", record_with_secret()), Write::put("jobs/b", b"x".to_vec())]).await.unwrap();
    store.commit(vec![Write::delete("jobs/b")]).await.unwrap();
    let inner = store.inner().scan("").await.unwrap();
    assert_eq!(inner.len(), 1);
    assert_eq!(inner[0].0, "jobs/a", "keys are stored as they are");
    assert!(inner[0].1.starts_with(MAGIC) && !contains(&inner[0].1, SECRET));
    assert_eq!(store.scan("jobs/").await.unwrap(), vec![("jobs/a".to_string(), record_with_secret())]);
}

#[tokio::test]
async fn a_scan_reads_records_from_before_sealing_and_refuses_damaged_ones() {
    let store = sealed_memory_store(ring(&[("k1", 1)]));
    store.inner().commit(vec![Write::put("jobs/old", b"{\"v\":1}".to_vec())]).await.unwrap();
    assert_eq!(store.scan("jobs/").await.unwrap(), vec![("jobs/old".to_string(), b"{\"v\":1}".to_vec())]);

    let mut damaged = store.keys().seal("jobs/bad", &record_with_secret()).unwrap();
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    store.inner().commit(vec![Write::put("jobs/bad", damaged)]).await.unwrap();
    let detail = sealing_detail(store.scan("jobs/").await.unwrap_err());
    assert!(detail.contains("jobs/bad") && detail.contains("key k1"), "{detail}");
    assert!(!contains(detail.as_bytes(), SECRET), "{detail}");
}

#[tokio::test]
async fn failure_and_describe_pass_through() {
    let store = sealed_memory_store(ring(&[("k9", 1), ("k1", 2)]));
    assert_eq!(store.describe(), "in memory (nothing survives a restart), sealed with key k9");
    assert_eq!(store.failure(), None);
    store.inner().fail_next_commit("disk on fire");
    assert!(matches!(store.commit(vec![Write::put("jobs/a", SECRET.to_vec())]).await, Err(Error::Failed { .. })));
    assert_eq!(store.failure().as_deref(), Some("disk on fire"));
    assert!(!format!("{store:?}").contains(&format!("{:?}", [1u8; 32])));
}

/// The strings check: what `strings` or `grep` on the data directory would find.
fn files_contain(dir: &Path, needle: &[u8]) -> bool {
    let mut found = false;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found |= files_contain(&path, needle);
        } else {
            found |= contains(&std::fs::read(&path).unwrap(), needle);
        }
    }
    found
}

#[tokio::test]
async fn a_sealed_redb_file_does_not_contain_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let ring = Arc::new(ring(&[("k1", 1)]));
    let store = SealedStore::new(RedbStore::open(dir.path()).unwrap(), Arc::clone(&ring));
    store.commit(vec![Write::put("jobs/a", record_with_secret())]).await.unwrap();
    drop(store);

    assert!(!files_contain(dir.path(), SECRET), "the secret is in the data directory");
    let reopened = SealedStore::new(RedbStore::open(dir.path()).unwrap(), ring);
    assert_eq!(reopened.scan("jobs/").await.unwrap(), vec![("jobs/a".to_string(), record_with_secret())]);
}

#[tokio::test]
async fn a_plain_redb_file_contains_the_secret_so_the_strings_check_can_fail() {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path()).unwrap();
    store.commit(vec![Write::put("jobs/a", record_with_secret())]).await.unwrap();
    drop(store);
    assert!(files_contain(dir.path(), SECRET));
}

// --- limits -------------------------------------------------------------------------------------

/// A memory store with limits, refusing what exceeds them as every store must.
struct LimitedStore {
    inner: MemoryStore,
    limits: Limits,
}

impl Store for LimitedStore {
    fn commit(&self, batch: Vec<Write>) -> BoxFuture<'_, Result<()>> {
        let bytes = batch.iter().map(Write::size).sum();
        if !self.limits.fits(batch.len(), bytes) {
            let error = Error::TooLarge {
                store: self.describe(),
                writes: batch.len(),
                bytes,
                max_writes: self.limits.max_writes,
                max_bytes: self.limits.max_bytes,
            };
            return Box::pin(async move { Err(error) });
        }
        self.inner.commit(batch)
    }

    fn scan(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, Vec<u8>)>>> {
        self.inner.scan(prefix)
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    fn describe(&self) -> String {
        "limited".to_string()
    }

    fn limits(&self) -> Limits {
        self.limits
    }
}

#[test]
fn the_byte_limit_shrinks_by_the_overhead_of_every_write() {
    assert_eq!(sealed_limits(Limits::UNLIMITED), Limits::UNLIMITED);
    assert_eq!(
        sealed_limits(Limits { max_writes: 128, max_bytes: 1_500_000 }),
        Limits { max_writes: 128, max_bytes: 1_500_000 - 128 * 66 }
    );
    assert_eq!(sealed_limits(Limits { max_writes: 10, max_bytes: 100 }), Limits { max_writes: 10, max_bytes: 0 });
    assert_eq!(
        sealed_limits(Limits { max_writes: usize::MAX, max_bytes: 1 << 20 }),
        Limits { max_writes: usize::MAX, max_bytes: 0 }
    );
    assert_eq!(
        sealed_limits(Limits { max_writes: 3, max_bytes: usize::MAX }),
        Limits { max_writes: 3, max_bytes: usize::MAX }
    );
}

#[tokio::test]
async fn a_batch_within_the_sealed_limits_fits_the_inner_store_once_sealed() {
    let inner = Limits { max_writes: 4, max_bytes: 1000 };
    let store = SealedStore::new(
        LimitedStore { inner: MemoryStore::new(), limits: inner },
        Arc::new(KeyRing::from_keys(vec![("k".repeat(MAX_ID_LEN), [1; 32])]).unwrap()),
    );
    let limits = store.limits();
    assert_eq!(limits, Limits { max_writes: 4, max_bytes: 1000 - 4 * KeyRing::OVERHEAD });

    // Four puts filling the sealed limit exactly, sealed with the longest key id: the inner store
    // (which checks its own limits) takes them.
    let value_len = limits.max_bytes / 4 - "jobs/0".len();
    let batch: Vec<Write> = (0..4).map(|index| Write::put(format!("jobs/{index}"), vec![b'x'; value_len])).collect();
    assert_eq!(batch.iter().map(Write::size).sum::<usize>(), limits.max_bytes);
    store.commit(batch).await.unwrap();
    assert_eq!(store.scan("jobs/").await.unwrap().len(), 4);

    // One byte more is refused by the sealed store itself, naming its own limits; nothing fails.
    let mut batch: Vec<Write> =
        (0..4).map(|index| Write::put(format!("jobs/{index}"), vec![b'x'; value_len])).collect();
    batch.push(Write::put("jobs/4", vec![b'x'; value_len + 1]));
    batch.remove(0);
    assert_eq!(batch.iter().map(Write::size).sum::<usize>(), limits.max_bytes + 1);
    let error = store.commit(batch).await.unwrap_err();
    assert!(
        matches!(&error, Error::TooLarge { store, max_bytes, .. } if store.contains("sealed with key") && *max_bytes == limits.max_bytes),
        "{error}"
    );
    assert_eq!(store.failure(), None);
}

// --- resealing ----------------------------------------------------------------------------------

#[tokio::test]
async fn reseal_rewrites_plain_and_old_key_values_with_the_primary_key() {
    let old = ring(&[("old", 1)]);
    let store = sealed_memory_store(ring(&[("new", 2), ("old", 1)]));
    store
        .inner()
        .commit(vec![
            Write::put("jobs/plain", record_with_secret()),
            Write::put("jobs/old", old.seal("jobs/old", b"sealed before the rotation").unwrap()),
        ])
        .await
        .unwrap();
    store.commit(vec![Write::put("jobs/new", b"sealed after".to_vec())]).await.unwrap();
    let before = store.scan("").await.unwrap();
    let untouched = store.inner().scan("jobs/new").await.unwrap();

    assert_eq!(store.reseal().await.unwrap(), 2);
    assert_eq!(store.scan("").await.unwrap(), before, "resealing changes no plain value");
    let inner = store.inner().scan("").await.unwrap();
    assert!(inner.iter().all(|(_, stored)| !store.keys().needs_reseal(stored)));
    assert!(!inner.iter().any(|(_, stored)| contains(stored, SECRET)));
    assert_eq!(
        store.inner().scan("jobs/new").await.unwrap(),
        untouched,
        "a value sealed with the primary is left alone"
    );
    assert_eq!(store.reseal().await.unwrap(), 0);

    // Step 4 of a rotation: without the old key, everything still opens.
    let without_old = ring(&[("new", 2)]);
    for (key, stored) in inner {
        without_old.open(&key, &stored).unwrap();
    }
}

#[tokio::test]
async fn reseal_writes_in_batches_within_the_store_limits() {
    let store = SealedStore::new(
        LimitedStore { inner: MemoryStore::new(), limits: Limits { max_writes: 2, max_bytes: 1 << 20 } },
        Arc::new(ring(&[("k1", 1)])),
    );
    let plain: Vec<Write> = (0..5).map(|index| Write::put(format!("jobs/{index}"), b"{}".to_vec())).collect();
    for pair in plain.chunks(2) {
        store.inner().commit(pair.to_vec()).await.unwrap();
    }
    assert_eq!(store.reseal().await.unwrap(), 5);
    assert_eq!(store.reseal().await.unwrap(), 0);
}

#[tokio::test]
async fn reseal_stops_at_a_value_that_does_not_open_naming_its_key() {
    let store = sealed_memory_store(ring(&[("k1", 1)]));
    let foreign = ring(&[("elsewhere", 3)]).seal("jobs/x", SECRET).unwrap();
    store.inner().commit(vec![Write::put("jobs/x", foreign)]).await.unwrap();
    let detail = sealing_detail(store.reseal().await.unwrap_err());
    assert!(detail.contains("jobs/x") && detail.contains("key elsewhere"), "{detail}");
}
