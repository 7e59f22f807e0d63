//! Test support, not for production use: the conformance suite every [`Store`] must pass, and
//! [`SimulatedDisk`], a redb storage backend that injects disk faults and power loss.
//!
//! ```
//! use meridian_store::testing::SimulatedDisk;
//! use meridian_store::{RedbStore, Store, Write};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> meridian_store::Result<()> {
//! let dir = tempfile::tempdir().map_err(|e| meridian_store::Error::Io { path: "tmp".into(), source: e })?;
//! let disk = SimulatedDisk::new(7);
//! let store = RedbStore::open_with_backend(dir.path(), disk.clone())?;
//! store.commit(vec![Write::put("jobs/a", b"1".to_vec())]).await?;
//! disk.fail_sync(1); // the next fsync fails
//! assert!(store.commit(vec![Write::put("jobs/b", b"2".to_vec())]).await.is_err());
//!
//! // Power loss: only what was synced survives.
//! let rebooted = disk.crash();
//! drop(store);
//! let store = RedbStore::open_with_backend(dir.path(), rebooted)?;
//! assert_eq!(store.scan("jobs/").await?[0], ("jobs/a".to_string(), b"1".to_vec()));
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeSet;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::{Store, Write};

#[cfg(feature = "etcd")]
pub mod etcd;

/// A port that was free a moment ago on 127.0.0.1, for test servers (etcd members here, the
/// gateways and agents of the end-to-end tests).
///
/// The port is taken from just below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), where nothing that binds port 0 (a process under
/// test, any outgoing connection) can take it between this call and the caller's bind, or while a
/// server that was stopped waits to start again on it; a port handed out by the kernel for port
/// 0 could be taken again that way, which once left an agent without its metrics port and an
/// etcd member unable to restart. Successive calls in one process walk the range, so they repeat
/// a port only after thousands of calls; calls in different processes start at different places.
pub fn free_port() -> io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let low = ephemeral_low.saturating_sub(12_000).max(1_024);
    let span = ephemeral_low.saturating_sub(low).max(1);
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let step = NEXT.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(low + (start + step) % span) else { continue };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Runs the behaviour every [`Store`] implementation must show, panicking on the first deviation.
///
/// `store` must hold no keys under `conformance/`. Atomicity under failure needs a way to make a
/// commit fail, so it is tested per implementation (see [`SimulatedDisk`]).
pub async fn conformance(store: &dyn Store) {
    let describe = store.describe();
    assert!(!describe.is_empty(), "describe() must say what the store is");
    assert_eq!(store.failure(), None, "a new store must not be failed");
    assert_eq!(scan(store, "conformance/").await, vec![], "the store must start empty under conformance/");

    commit(
        store,
        vec![
            Write::put("conformance/jobs/b", b"b1".to_vec()),
            Write::put("conformance/jobs/a", b"a1".to_vec()),
            Write::put("conformance/nodes/x", b"x1".to_vec()),
            Write::put("conformance/jobsx", b"j".to_vec()),
        ],
    )
    .await;
    assert_eq!(
        scan(store, "conformance/jobs/").await,
        entries(&[("conformance/jobs/a", b"a1"), ("conformance/jobs/b", b"b1")]),
        "a scan returns exactly the keys under the prefix, in key order"
    );
    assert_eq!(
        scan(store, "conformance/").await,
        entries(&[
            ("conformance/jobs/a", b"a1"),
            ("conformance/jobs/b", b"b1"),
            ("conformance/jobsx", b"j"),
            ("conformance/nodes/x", b"x1"),
        ]),
        "a scan returns every key under the prefix, in key order"
    );
    assert_eq!(
        scan(store, "conformance/jobs/a").await,
        entries(&[("conformance/jobs/a", b"a1")]),
        "a key equal to the prefix is included"
    );
    assert_eq!(scan(store, "conformance/none/").await, vec![], "a prefix without keys scans empty");

    commit(store, vec![Write::put("conformance/jobs/a", b"a2".to_vec())]).await;
    assert_eq!(
        scan(store, "conformance/jobs/").await,
        entries(&[("conformance/jobs/a", b"a2"), ("conformance/jobs/b", b"b1")]),
        "a put replaces the value"
    );

    commit(store, vec![Write::delete("conformance/jobs/b"), Write::delete("conformance/jobs/never-written")]).await;
    assert_eq!(
        scan(store, "conformance/jobs/").await,
        entries(&[("conformance/jobs/a", b"a2")]),
        "a delete removes the key; deleting an absent key is not an error"
    );

    commit(
        store,
        vec![
            Write::put("conformance/order/c", b"c1".to_vec()),
            Write::delete("conformance/order/c"),
            Write::delete("conformance/order/d"),
            Write::put("conformance/order/d", b"d1".to_vec()),
            Write::put("conformance/order/d", b"d2".to_vec()),
        ],
    )
    .await;
    assert_eq!(
        scan(store, "conformance/order/").await,
        entries(&[("conformance/order/d", b"d2")]),
        "the writes of a batch apply in order"
    );

    commit(store, vec![]).await;

    commit(
        store,
        vec![
            Write::put("conformance/bytes/binary", vec![0, 255, b'\n', 0]),
            Write::put("conformance/bytes/empty", Vec::new()),
            Write::put("conformance/bytes/large", vec![7; 1 << 20]),
            Write::put("conformance/bytes/z", b"z".to_vec()),
            Write::put("conformance/bytes/\u{e9}", b"e".to_vec()),
        ],
    )
    .await;
    let bytes = scan(store, "conformance/bytes/").await;
    let keys: Vec<&str> = bytes.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "conformance/bytes/binary",
            "conformance/bytes/empty",
            "conformance/bytes/large",
            "conformance/bytes/z",
            "conformance/bytes/\u{e9}"
        ],
        "keys sort by their UTF-8 bytes"
    );
    assert_eq!(bytes[0].1, vec![0, 255, b'\n', 0], "values are stored byte for byte");
    assert_eq!(bytes[1].1, Vec::<u8>::new(), "an empty value is kept");
    assert_eq!(bytes[2].1.len(), 1 << 20, "a 1 MiB value is kept whole");

    let many: Vec<Write> =
        (0..1000).map(|index| Write::put(format!("conformance/many/{index:04}"), index.to_string())).collect();
    commit(store, many).await;
    let scanned = scan(store, "conformance/many/").await;
    assert_eq!(scanned.len(), 1000, "one batch of 1,000 writes applies whole");
    assert!(scanned.windows(2).all(|pair| pair[0].0 < pair[1].0), "a scan is in key order");
    assert_eq!(scanned[999], ("conformance/many/0999".to_string(), b"999".to_vec()));

    assert_eq!(store.failure(), None, "successful commits leave the store healthy");
}

async fn commit(store: &dyn Store, batch: Vec<Write>) {
    if let Err(error) = store.commit(batch).await {
        panic!("commit failed on {}: {error}", store.describe());
    }
}

async fn scan(store: &dyn Store, prefix: &str) -> Vec<(String, Vec<u8>)> {
    match store.scan(prefix).await {
        Ok(entries) => entries,
        Err(error) => panic!("scan({prefix:?}) failed on {}: {error}", store.describe()),
    }
}

fn entries(pairs: &[(&str, &[u8])]) -> Vec<(String, Vec<u8>)> {
    pairs.iter().map(|(key, value)| (key.to_string(), value.to_vec())).collect()
}

/// The durability unit of [`SimulatedDisk`]: a page of the file is persisted whole or not at all.
const CHUNK_BYTES: usize = 4096;

/// A simulated disk for redb, with a page cache that power loss empties.
///
/// It keeps a *durable image* (what survives power loss) and the *current* contents (what reads
/// see). Writes change the current contents only; `sync_data` copies every page written since the
/// last sync into the durable image. [`SimulatedDisk::crash`] models a power loss: it returns the
/// disk after a reboot, holding the durable image only. (`kill -9` cannot model this: the kernel
/// keeps the page cache of a killed process.)
///
/// Faults, each counted from the call that arms it:
/// - [`fail_sync`](SimulatedDisk::fail_sync): the n-th `sync_data` fails with `EIO`. Like Linux
///   after a failed `fsync`, an arbitrary (seeded) subset of the unsynced pages reached the disk,
///   and the rest are forgotten: a later successful sync does not write them.
/// - [`tear_write`](SimulatedDisk::tear_write): the n-th `write` stores only a prefix of its buffer
///   (seeded length), then fails with `EIO`.
/// - [`fill_after_writes`](SimulatedDisk::fill_after_writes): the disk is full after n more writes;
///   every later write fails with `ENOSPC` and stores nothing.
///
/// Handles are cheap clones of one disk: give one to [`RedbStore::open_with_backend`] and keep
/// another to arm faults and crash it.
///
/// [`RedbStore::open_with_backend`]: crate::RedbStore::open_with_backend
#[derive(Clone)]
pub struct SimulatedDisk {
    state: Arc<Mutex<DiskState>>,
}

/// How many operations a [`SimulatedDisk`] has seen, to aim faults at each of them in turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskCounts {
    /// Calls to `write`.
    pub writes: u64,
    /// Calls to `sync_data`.
    pub syncs: u64,
}

struct DiskState {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Pages of `current` changed since they were last persisted.
    unsynced: BTreeSet<usize>,
    counts: DiskCounts,
    /// The number (in `counts.syncs`) of the sync that fails.
    failing_sync: Option<u64>,
    /// The number (in `counts.writes`) of the write that is torn.
    torn_write: Option<u64>,
    /// Writes numbered above this fail with `ENOSPC`.
    full_after_write: Option<u64>,
    /// Set by `crash`: this handle is the machine before the power loss.
    powered_off: bool,
    random: SplitMix64,
}

impl SimulatedDisk {
    /// An empty disk; `seed` decides the length of torn writes and which pages a failed sync or
    /// [`crash_with_writeback`](SimulatedDisk::crash_with_writeback) persists.
    pub fn new(seed: u64) -> Self {
        Self::from_image(Vec::new(), seed)
    }

    /// A disk holding `image`, as if synced (e.g. an altered [`durable_image`](Self::durable_image)).
    pub fn from_image(image: Vec<u8>, seed: u64) -> Self {
        let state = DiskState {
            current: image.clone(),
            durable: image,
            unsynced: BTreeSet::new(),
            counts: DiskCounts::default(),
            failing_sync: None,
            torn_write: None,
            full_after_write: None,
            powered_off: false,
            random: SplitMix64(seed),
        };
        SimulatedDisk { state: Arc::new(Mutex::new(state)) }
    }

    /// Makes the `nth` `sync_data` from now (1 = the next one) fail.
    pub fn fail_sync(&self, nth: u64) {
        let mut state = self.lock();
        state.failing_sync = Some(state.counts.syncs + nth);
    }

    /// Makes the `nth` `write` from now (1 = the next one) store only part of its buffer and fail.
    pub fn tear_write(&self, nth: u64) {
        let mut state = self.lock();
        state.torn_write = Some(state.counts.writes + nth);
    }

    /// Lets `writes` more writes succeed, then fails every later one with `ENOSPC` (disk full).
    pub fn fill_after_writes(&self, writes: u64) {
        let mut state = self.lock();
        state.full_after_write = Some(state.counts.writes + writes);
    }

    /// The operations seen so far.
    pub fn counts(&self) -> DiskCounts {
        self.lock().counts
    }

    /// Power loss: this disk stops answering (every operation fails), and the returned disk is the
    /// same one after a reboot, holding exactly what was synced, with no faults armed.
    pub fn crash(&self) -> SimulatedDisk {
        let mut state = self.lock();
        state.powered_off = true;
        let seed = state.random.next();
        Self::from_image(state.durable.clone(), seed)
    }

    /// Power loss after the kernel wrote back an arbitrary (seeded) subset of the unsynced pages,
    /// as it may at any time: otherwise like [`crash`](SimulatedDisk::crash).
    pub fn crash_with_writeback(&self) -> SimulatedDisk {
        let mut state = self.lock();
        state.powered_off = true;
        let mut image = state.durable.clone();
        let written_back = state.random_unsynced_subset();
        persist_pages(&state.current, &mut image, &written_back);
        let seed = state.random.next();
        Self::from_image(image, seed)
    }

    /// The durable image's bytes (what a reboot would find).
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    // A panic under this lock leaves the state consistent (each operation checks before it
    // changes anything), so a poisoned lock is still safe to use.
    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl DiskState {
    fn check_powered(&self) -> io::Result<()> {
        if self.powered_off {
            return Err(io::Error::other("simulated disk: the machine lost power"));
        }
        Ok(())
    }

    fn mark_unsynced(&mut self, start: usize, end: usize) {
        if start < end {
            self.unsynced.extend(start / CHUNK_BYTES..=(end - 1) / CHUNK_BYTES);
        }
    }

    fn random_unsynced_subset(&mut self) -> Vec<usize> {
        let pages: Vec<usize> = self.unsynced.iter().copied().collect();
        pages.into_iter().filter(|_| self.random.next().is_multiple_of(2)).collect()
    }
}

/// Copies `pages` of `current` into `durable`, which takes `current`'s length if it grows.
fn persist_pages(current: &[u8], durable: &mut Vec<u8>, pages: &[usize]) {
    for &page in pages {
        let start = page * CHUNK_BYTES;
        let end = current.len().min(start + CHUNK_BYTES);
        if start >= end {
            continue;
        }
        if durable.len() < end {
            durable.resize(end, 0);
        }
        durable[start..end].copy_from_slice(&current[start..end]);
    }
}

impl std::fmt::Debug for SimulatedDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        write!(f, "a simulated disk ({} bytes, {} unsynced pages)", state.current.len(), state.unsynced.len())
    }
}

impl redb::StorageBackend for SimulatedDisk {
    fn len(&self) -> io::Result<u64> {
        let state = self.lock();
        state.check_powered()?;
        Ok(state.current.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let state = self.lock();
        state.check_powered()?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        match state.current.get(start..start.saturating_add(out.len())) {
            Some(bytes) => {
                out.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "simulated disk: read past the end")),
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.lock();
        state.check_powered()?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        let old_len = state.current.len();
        state.current.resize(len, 0);
        state.mark_unsynced(old_len.min(len), old_len.max(len));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.lock();
        state.check_powered()?;
        state.counts.syncs += 1;
        if state.failing_sync == Some(state.counts.syncs) {
            let persisted = state.random_unsynced_subset();
            let DiskState { current, durable, .. } = &mut *state;
            persist_pages(current, durable, &persisted);
            state.unsynced.clear();
            return Err(io::Error::other("simulated disk: fsync failed (EIO)"));
        }
        let pages: Vec<usize> = state.unsynced.iter().copied().collect();
        let DiskState { current, durable, .. } = &mut *state;
        persist_pages(current, durable, &pages);
        durable.resize(current.len(), 0);
        state.unsynced.clear();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        state.check_powered()?;
        state.counts.writes += 1;
        let number = state.counts.writes;
        if state.full_after_write.is_some_and(|last_allowed| number > last_allowed) {
            return Err(io::Error::from(io::ErrorKind::StorageFull));
        }
        let torn = state.torn_write == Some(number);
        let stored = if torn {
            usize::try_from(state.random.next() % data.len().max(1) as u64).map_err(io::Error::other)?
        } else {
            data.len()
        };
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let end = start + stored;
        if state.current.len() < end {
            state.current.resize(end, 0);
        }
        state.current[start..end].copy_from_slice(&data[..stored]);
        state.mark_unsynced(start, end);
        if torn {
            return Err(io::Error::other("simulated disk: write torn (EIO)"));
        }
        Ok(())
    }
}

/// A small deterministic generator (SplitMix64), so test runs repeat exactly from their seed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
