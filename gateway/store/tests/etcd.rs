//! The etcd store and leader election against a real etcd (three members, default limits).
//!
//! Tests that do not kill members use the cluster of `MERIDIAN_ETCD_ENDPOINTS` when it is set
//! (scripts/test.sh starts one), else start their own; tests that kill members always start
//! their own. `MERIDIAN_SKIP_ETCD=1` skips them, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use meridian_store::etcd::{Change, EtcdConfig, EtcdStore, EtcdTls, Guard, Leader};
use meridian_store::testing::conformance;
use meridian_store::testing::etcd::{EtcdCluster, ServerTls, shared_endpoints, skip, unique_prefix};
use meridian_store::{Error, Store, Write};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long a condition may take before a test gives up.
const PATIENCE: Duration = Duration::from_secs(20);

/// The etcd endpoints for a test that kills no member, and the cluster to keep alive meanwhile
/// (`None` with the shared cluster); `None` when etcd tests are skipped.
async fn cluster(test: &str) -> Option<(Option<EtcdCluster>, Vec<String>)> {
    if skip() {
        println!("skipped {test}: MERIDIAN_SKIP_ETCD=1");
        return None;
    }
    if let Some(endpoints) = shared_endpoints() {
        return Some((None, endpoints));
    }
    let cluster = EtcdCluster::start(3).await;
    let endpoints = cluster.endpoints();
    Some((Some(cluster), endpoints))
}

/// A cluster of its own, for a test that kills members.
async fn own_cluster(test: &str) -> Option<EtcdCluster> {
    if skip() {
        println!("skipped {test}: MERIDIAN_SKIP_ETCD=1");
        return None;
    }
    Some(EtcdCluster::start(3).await)
}

fn config(endpoints: &[String], test: &str) -> EtcdConfig {
    EtcdConfig { endpoints: endpoints.to_vec(), prefix: unique_prefix(test), ..EtcdConfig::default() }
}

/// A raw etcd client, to look behind the store's back.
async fn raw_client(endpoints: &[String]) -> etcd_client::Client {
    etcd_client::Client::connect(endpoints, None).await.unwrap()
}

/// Polls `condition` every 20 ms until it holds, panicking with `what` after [`PATIENCE`].
async fn wait_until(what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !condition().await {
        assert!(started.elapsed() < PATIENCE, "gave up after {PATIENCE:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn puts(keys: impl IntoIterator<Item = String>, value: &[u8]) -> Vec<Write> {
    keys.into_iter().map(|key| Write::put(key, value.to_vec())).collect()
}

// The suite commits 1,000 writes in one batch, beyond etcd's default --max-txn-ops (128): this
// cluster takes 1,000 and the store is told so. The default limits are proven against default
// flags by `a_batch_exactly_at_the_limits_commits_on_an_etcd_with_default_flags`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_store_passes_the_conformance_suite() {
    if skip() {
        println!("skipped etcd_store_passes_the_conformance_suite: MERIDIAN_SKIP_ETCD=1");
        return;
    }
    let cluster = EtcdCluster::start_with_flags(3, &["--max-txn-ops", "1000"]).await;
    let store = EtcdStore::connect(EtcdConfig { max_txn_ops: 1000, ..config(&cluster.endpoints(), "conformance") })
        .await
        .unwrap();
    conformance(&store).await;
    assert!(store.describe().starts_with("etcd at http://127.0.0.1:"), "{}", store.describe());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paged_scan_reads_every_page_at_the_first_pages_revision_while_others_write() {
    let Some((_cluster, endpoints)) = cluster("paged_scan").await else { return };
    let config = EtcdConfig { page_size: 100, ..config(&endpoints, "paged-scan") };
    // Where the store keeps its keys: under the data prefix.
    let prefix = format!("{}scan/", config.data_prefix());
    let store = EtcdStore::connect(config).await.unwrap();
    let key = |index: usize| format!("scan/k{index:04}");
    for chunk in (0..2500).collect::<Vec<_>>().chunks(100) {
        store.commit(puts(chunk.iter().map(|&index| key(index)), b"v0")).await.unwrap();
    }

    // A writer adds keys between the existing ones and overwrites others, all over the key
    // range, noting each write's revision, until the scan is done.
    let mut writer_client = raw_client(&endpoints).await;
    let scanning = Arc::new(AtomicBool::new(true));
    let first_write_done = Arc::new(tokio::sync::Notify::new());
    let writer = tokio::spawn({
        let scanning = Arc::clone(&scanning);
        let first_write_done = Arc::clone(&first_write_done);
        async move {
            let mut writes = Vec::new();
            let mut round = 0usize;
            while scanning.load(Ordering::SeqCst) {
                let position = (round * 997) % 2500;
                let (name, value) = if round.is_multiple_of(2) {
                    (format!("k{position:04}+{round}"), format!("new{round}"))
                } else {
                    (format!("k{position:04}"), format!("v{round}"))
                };
                let put = writer_client.put(format!("{prefix}{name}"), value.clone(), None).await.unwrap();
                writes.push((format!("scan/{name}"), value.into_bytes(), put.header().unwrap().revision()));
                if round == 0 {
                    first_write_done.notify_one();
                }
                round += 1;
            }
            writes
        }
    });
    first_write_done.notified().await;
    let (scanned, revision) = store.snapshot("scan/").await.unwrap();
    scanning.store(false, Ordering::SeqCst);
    let writes = writer.await.unwrap();

    let later = writes.iter().filter(|(_, _, written_at)| *written_at > revision).count();
    assert!(
        later > 0,
        "no write landed during the scan (revision {revision}, {} writes); it proves nothing",
        writes.len()
    );
    let mut expected: BTreeMap<String, Vec<u8>> = (0..2500).map(|index| (key(index), b"v0".to_vec())).collect();
    for (key, value, written_at) in &writes {
        if *written_at <= revision {
            expected.insert(key.clone(), value.clone());
        }
    }
    let expected: Vec<(String, Vec<u8>)> = expected.into_iter().collect();
    assert_eq!(scanned.len(), expected.len(), "the scan holds every key of revision {revision}, and no later one");
    assert!(scanned == expected, "the scan is the state at revision {revision}, in key order");
    println!(
        "paged scan: {} keys in {} pages at revision {revision}; {} concurrent writes, {later} after it",
        scanned.len(),
        scanned.len().div_ceil(100),
        writes.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_commit_applies_nothing_once_the_guard_key_is_gone() {
    let Some((_cluster, endpoints)) = cluster("guard").await else { return };
    let config = config(&endpoints, "guard");
    let guard_key = format!("{}election/manual/1", config.prefix).into_bytes();
    let store = EtcdStore::connect(config).await.unwrap();
    let mut client = raw_client(&endpoints).await;
    let created = client.put(guard_key.clone(), "leader", None).await.unwrap().header().unwrap().revision();
    store.commit(vec![Write::put("jobs/kept", b"1".to_vec())]).await.unwrap();

    let guarded = store.with_guard(Guard { key: guard_key.clone(), create_revision: created });
    guarded.commit(vec![Write::put("jobs/a", b"a".to_vec())]).await.unwrap();

    let wrong = store.with_guard(Guard { key: guard_key.clone(), create_revision: created - 1 });
    let refused = wrong.commit(vec![Write::put("jobs/b", b"b".to_vec()), Write::delete("jobs/kept")]).await;
    assert!(matches!(refused, Err(Error::NotLeader { .. })), "{refused:?}");

    client.delete(guard_key.clone(), None).await.unwrap();
    let batch =
        vec![Write::put("jobs/c", b"c".to_vec()), Write::delete("jobs/kept"), Write::put("jobs/a", b"a2".to_vec())];
    let refused = guarded.commit(batch).await;
    match refused {
        Err(Error::NotLeader { key }) => assert!(key.ends_with("election/manual/1"), "{key}"),
        other => panic!("expected NotLeader, got {other:?}"),
    }
    assert_eq!(
        store.scan("jobs/").await.unwrap(),
        vec![("jobs/a".to_string(), b"a".to_vec()), ("jobs/kept".to_string(), b"1".to_vec())],
        "nothing of a refused batch is visible"
    );
    assert!(guarded.failure().is_some(), "a deposed leader's handle is failed");
    let later = guarded.commit(vec![Write::put("jobs/d", b"d".to_vec())]).await;
    assert!(matches!(later, Err(Error::Failed { .. })), "{later:?}");

    // A new term gets a new handle, which starts unfailed.
    let recreated = client.put(guard_key.clone(), "leader", None).await.unwrap().header().unwrap().revision();
    let next_term = store.with_guard(Guard { key: guard_key, create_revision: recreated });
    next_term.commit(vec![Write::put("jobs/e", b"e".to_vec())]).await.unwrap();
    assert_eq!(store.failure(), None, "the unguarded store never failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_beyond_the_limits_is_refused_without_failing_the_store() {
    let Some((_cluster, endpoints)) = cluster("too_large").await else { return };
    let store = EtcdStore::connect(config(&endpoints, "too-large")).await.unwrap();
    let limits = store.limits();
    assert_eq!(limits.max_writes, 128);

    let too_many = puts((0..=limits.max_writes).map(|index| format!("big/{index:04}")), b"x");
    let refused = store.commit(too_many).await;
    assert!(matches!(refused, Err(Error::TooLarge { writes: 129, .. })), "{refused:?}");
    let too_big = vec![Write::put("big/one", vec![0; limits.max_bytes + 1 - "big/one".len()])];
    let refused = store.commit(too_big).await;
    assert!(matches!(&refused, Err(Error::TooLarge { bytes, .. }) if *bytes == limits.max_bytes + 1), "{refused:?}");

    assert_eq!(store.failure(), None, "a refused batch does not fail the store");
    assert_eq!(store.scan("big/").await.unwrap(), vec![], "nothing of a refused batch was written");
    store.commit(vec![Write::put("big/after", b"ok".to_vec())]).await.unwrap();
    assert_eq!(store.scan("big/").await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_exactly_at_the_limits_commits_on_an_etcd_with_default_flags() {
    let Some((_cluster, endpoints)) = cluster("at_limit").await else { return };
    let config = config(&endpoints, "at-limit");
    let guard_key = format!("{}election/limit/1", config.prefix).into_bytes();
    let store = EtcdStore::connect(config).await.unwrap();
    let limits = store.limits();
    let keys: Vec<String> = (0..limits.max_writes).map(|index| format!("limit/{index:04}")).collect();
    let key_bytes: usize = keys.iter().map(String::len).sum();
    let value_bytes = limits.max_bytes - key_bytes;
    let batch: Vec<Write> = keys
        .iter()
        .enumerate()
        .map(|(index, key)| {
            let share = value_bytes / keys.len() + usize::from(index < value_bytes % keys.len());
            Write::put(key.clone(), vec![u8::try_from(index % 251).unwrap(); share])
        })
        .collect();
    assert_eq!(batch.iter().map(Write::size).sum::<usize>(), limits.max_bytes);
    assert_eq!(batch.len(), limits.max_writes);
    let created = raw_client(&endpoints).await.put(guard_key.clone(), "x", None).await.unwrap();
    let guarded = store.with_guard(Guard { key: guard_key, create_revision: created.header().unwrap().revision() });

    guarded.commit(batch.clone()).await.unwrap();
    let scanned = store.scan("limit/").await.unwrap();
    let expected: Vec<(String, Vec<u8>)> = batch
        .into_iter()
        .map(|write| match write {
            Write::Put { key, value } => (key, value),
            Write::Delete { .. } => unreachable!(),
        })
        .collect();
    assert!(scanned == expected, "the whole batch at the limits was written");
    println!("limits: {} writes, {} bytes (of etcd's 1,572,864) committed whole", limits.max_writes, limits.max_bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_without_a_quorum_fails_within_the_request_timeout_and_fails_the_handle() {
    let Some(mut cluster) = own_cluster("no_quorum").await else { return };
    let endpoints = cluster.endpoints();
    let request_timeout = Duration::from_secs(2);
    let config = EtcdConfig { request_timeout, ..config(&endpoints, "no-quorum") };
    let store = EtcdStore::connect(config.clone()).await.unwrap();
    let acknowledged = puts((0..50).map(|index| format!("jobs/{index:02}")), b"before");
    store.commit(acknowledged.clone()).await.unwrap();

    cluster.kill(1);
    cluster.kill(2);
    let started = Instant::now();
    let failed = store.commit(vec![Write::put("jobs/during", b"?".to_vec())]).await;
    let took = started.elapsed();
    match &failed {
        Err(Error::Etcd { endpoints: named, .. }) => assert_eq!(named, &endpoints.join(",")),
        other => panic!("expected an etcd error, got {other:?}"),
    }
    let later = store.commit(vec![Write::put("jobs/later", b"?".to_vec())]).await;
    assert!(matches!(later, Err(Error::Failed { .. })), "{later:?}");
    assert!(matches!(store.scan("jobs/").await, Err(Error::Failed { .. })));
    println!("no quorum: the commit failed after {took:?} (request_timeout {request_timeout:?}): {failed:?}");

    cluster.start_again(1);
    cluster.start_again(2);
    for member in 0..3 {
        cluster.wait_healthy(member).await;
    }
    let fresh = EtcdStore::connect(config).await.unwrap();
    fresh.commit(vec![Write::put("jobs/after", b"after".to_vec())]).await.unwrap();
    let scanned: BTreeMap<String, Vec<u8>> = fresh.scan("jobs/").await.unwrap().into_iter().collect();
    for write in &acknowledged {
        assert_eq!(
            scanned.get(write.key()).map(Vec::as_slice),
            Some(&b"before"[..]),
            "{} was acknowledged",
            write.key()
        );
    }
    assert_eq!(scanned.get("jobs/after").map(Vec::as_slice), Some(&b"after"[..]));
}

// Killing a member costs at most the one commit that was on its way to it: the client may still
// hold a connection to the dead member, and a request written there has an unknown outcome, so
// that commit fails and fails its handle (the gateway then steps down and the next leader opens a
// fresh one). Killing the raft leader also stalls writes until the others elect a new one: the
// test waits for that through the health of the remaining members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_and_scans_keep_working_with_one_member_of_three_killed() {
    let Some(mut cluster) = own_cluster("one_down").await else { return };
    let endpoints = cluster.endpoints();
    let config = config(&endpoints, "one-down");
    let mut store = EtcdStore::connect(config.clone()).await.unwrap();
    store.commit(vec![Write::put("jobs/0", b"0".to_vec())]).await.unwrap();
    let leader = raft_leader(&endpoints).await;
    for (round, killed) in [(leader + 1) % 3, leader].into_iter().enumerate() {
        cluster.kill(killed);
        if killed == leader {
            for member in (0..3).filter(|member| *member != killed) {
                cluster.wait_healthy(member).await;
            }
        }
        let mut failed = 0;
        for number in 1..=20 {
            let key = format!("jobs/{round}-{number:02}");
            while let Err(error) = store.commit(vec![Write::put(key.clone(), b"x".to_vec())]).await {
                failed += 1;
                assert!(
                    failed == 1 && matches!(error, Error::Etcd { .. }),
                    "commit {number} after killing member {killed} (raft leader: {}) failed ({failed} failures): {error}",
                    killed == leader
                );
                // As a new leader term would: a fresh handle, and the same (idempotent) write.
                store = EtcdStore::connect(config.clone()).await.unwrap();
            }
            let scanned = store.scan("jobs/").await.unwrap();
            assert!(scanned.iter().any(|(scanned_key, _)| *scanned_key == key), "{key} is visible");
        }
        println!("member {killed} killed (raft leader: {}): {failed} commit(s) failed", killed == leader);
        cluster.restart(killed).await;
    }
    assert_eq!(store.scan("jobs/").await.unwrap().len(), 41);
}

/// Which member (index into `endpoints`) is the raft leader.
async fn raft_leader(endpoints: &[String]) -> usize {
    for (index, endpoint) in endpoints.iter().enumerate() {
        let status = raw_client(std::slice::from_ref(endpoint)).await.status().await.unwrap();
        if status.header().map(|header| header.member_id()) == Some(status.leader()) {
            return index;
        }
    }
    panic!("no member of {endpoints:?} says it leads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_reports_each_commit_after_a_snapshot_in_order() {
    let Some((_cluster, endpoints)) = cluster("follow").await else { return };
    let store = EtcdStore::connect(config(&endpoints, "follow")).await.unwrap();
    store.commit(vec![Write::put("jobs/old", b"0".to_vec())]).await.unwrap();
    let (entries, revision) = store.snapshot("").await.unwrap();
    assert_eq!(entries, vec![("jobs/old".to_string(), b"0".to_vec())]);
    let mut changes = store.follow(revision);

    store.commit(vec![Write::put("jobs/a", b"1".to_vec()), Write::put("jobs/b", b"2".to_vec())]).await.unwrap();
    store.commit(vec![Write::delete("jobs/old")]).await.unwrap();
    store
        .commit(vec![Write::put("jobs/c", b"3".to_vec()), Write::delete("jobs/b"), Write::put("jobs/a", b"4".to_vec())])
        .await
        .unwrap();

    let mut batches = Vec::new();
    for _ in 0..3 {
        let batch = tokio::time::timeout(PATIENCE, changes.recv()).await.expect("a change within 20 s");
        batches.push(batch.expect("the follow channel is open").unwrap());
    }
    type Shape<'a> = Vec<Vec<(&'a str, Option<&'a [u8]>)>>;
    let shape: Shape<'_> = batches
        .iter()
        .map(|batch| batch.iter().map(|change| (change.key.as_str(), change.value.as_deref())).collect())
        .collect();
    assert_eq!(
        shape,
        vec![
            vec![("jobs/a", Some(&b"1"[..])), ("jobs/b", Some(&b"2"[..]))],
            vec![("jobs/old", None)],
            vec![("jobs/c", Some(&b"3"[..])), ("jobs/b", None), ("jobs/a", Some(&b"4"[..]))],
        ]
    );
    let revisions: Vec<i64> = batches.iter().map(|batch| batch[0].revision).collect();
    assert!(revisions[0] > revision && revisions.windows(2).all(|pair| pair[0] < pair[1]), "{revisions:?}");
    assert!(batches.iter().all(|batch| batch.iter().all(|change: &Change| change.revision == batch[0].revision)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_from_a_compacted_revision_yields_one_error_and_ends() {
    // A cluster of its own: compacting a shared one would break other tests' watches.
    if skip() {
        println!("skipped follow_compacted: MERIDIAN_SKIP_ETCD=1");
        return;
    }
    let cluster = EtcdCluster::start(1).await;
    let endpoints = cluster.endpoints();
    let store = EtcdStore::connect(config(&endpoints, "follow-compacted")).await.unwrap();
    let (_, revision) = store.snapshot("").await.unwrap();
    store.commit(vec![Write::put("jobs/a", b"1".to_vec())]).await.unwrap();
    store.commit(vec![Write::put("jobs/a", b"2".to_vec())]).await.unwrap();
    let (_, now) = store.snapshot("").await.unwrap();
    raw_client(&endpoints).await.compact(now, None).await.unwrap();

    let mut changes = store.follow(revision);
    let first = tokio::time::timeout(PATIENCE, changes.recv()).await.expect("an answer within 20 s");
    match first {
        Some(Err(Error::Etcd { detail, .. })) => assert!(detail.contains("compacted"), "{detail}"),
        other => panic!("expected one compaction error, got {other:?}"),
    }
    let end = tokio::time::timeout(PATIENCE, changes.recv()).await.expect("the end within 20 s");
    assert!(end.is_none(), "after the error the channel ends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_campaigner_waits_for_the_first_to_resign_then_wins_at_once() {
    let Some((_cluster, endpoints)) = cluster("election").await else { return };
    let config = config(&endpoints, "election");
    let entries = format!("{}election/gateway/", config.prefix);
    let store = EtcdStore::connect(config).await.unwrap();
    let ttl = Duration::from_secs(4);
    let election = store.election("gateway", ttl, Duration::from_secs(1)).unwrap();
    let observed = election.observe();
    assert_eq!(election.leader().await.unwrap(), None);

    let first = election.campaign(b"gateway-a".to_vec()).await.unwrap();
    assert!(first.is_valid());
    let first_leader = Leader { value: b"gateway-a".to_vec(), epoch: first.epoch() };
    assert_eq!(election.leader().await.unwrap(), Some(first_leader.clone()));
    wait_until("observe reports gateway-a", async || *observed.borrow() == Some(first_leader.clone())).await;
    let first_store = store.with_guard(first.guard());
    first_store.commit(vec![Write::put("jobs/a", b"by a".to_vec())]).await.unwrap();

    let second = tokio::spawn({
        let election = election.clone();
        async move { election.campaign(b"gateway-b".to_vec()).await }
    });
    // The second candidate's entry is in etcd (it waits behind the first), and keep-alives
    // carry the first leader's deadline forward twice while it still waits.
    let mut client = raw_client(&endpoints).await;
    wait_until("the second candidate is queued", async || {
        let options = etcd_client::GetOptions::new().with_prefix().with_count_only();
        client.get(entries.clone(), Some(options)).await.unwrap().count() == 2
    })
    .await;
    for _ in 0..2 {
        let deadline = first.deadline();
        wait_until("a keep-alive moves the deadline", async || first.deadline() > deadline).await;
    }
    assert!(!second.is_finished(), "the second campaign waits while the first leads");
    assert_eq!(election.leader().await.unwrap(), Some(first_leader));

    let first_epoch = first.epoch();
    let mut first_lost = first.lost();
    let resigned_at = Instant::now();
    first.resign().await;
    let second = tokio::time::timeout(PATIENCE, second).await.expect("elected within 20 s").unwrap().unwrap();
    let handover = resigned_at.elapsed();
    assert!(*first_lost.borrow_and_update(), "resigning flips lost");
    assert!(handover < ttl / 2, "the second gateway won {handover:?} after the resignation (ttl {ttl:?})");
    assert!(second.epoch() > first_epoch, "epochs grow");
    let second_leader = Leader { value: b"gateway-b".to_vec(), epoch: second.epoch() };
    wait_until("observe reports gateway-b", async || *observed.borrow() == Some(second_leader.clone())).await;

    let refused = first_store.commit(vec![Write::put("jobs/a", b"late".to_vec())]).await;
    assert!(matches!(refused, Err(Error::NotLeader { .. })), "{refused:?}");
    store.with_guard(second.guard()).commit(vec![Write::put("jobs/b", b"by b".to_vec())]).await.unwrap();

    // Someone deletes the leader's entry: the term ends at once, long before its deadline.
    let mut second_lost = second.lost();
    let deleted_at = Instant::now();
    client.delete(entries.clone(), Some(etcd_client::DeleteOptions::new().with_prefix())).await.unwrap();
    tokio::time::timeout(PATIENCE, second_lost.wait_for(|lost| *lost)).await.expect("lost within 20 s").unwrap();
    let noticed = deleted_at.elapsed();
    assert!(!second.is_valid());
    assert!(second.lost_reason().unwrap().contains("deleted"), "{:?}", second.lost_reason());
    assert!(Instant::now() < second.deadline(), "lost before the deadline, by the watch");
    wait_until("observe reports no leader", async || observed.borrow().is_none()).await;
    println!(
        "election: handover after resign took {handover:?}; a deleted key was noticed after {noticed:?} (ttl {ttl:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_steps_down_at_its_deadline_before_its_lease_expires() {
    let Some((_cluster, endpoints)) = cluster("step_down").await else { return };
    let mut proxies = Vec::new();
    for endpoint in &endpoints {
        proxies.push(Blackhole::start(endpoint).await);
    }
    let proxied: Vec<String> = proxies.iter().map(Blackhole::endpoint).collect();
    let direct_config = config(&endpoints, "step-down");
    let prefix = direct_config.prefix.clone();
    let direct = EtcdStore::connect(direct_config).await.unwrap();
    let leader_store =
        EtcdStore::connect(EtcdConfig { prefix: prefix.clone(), ..config(&proxied, "step-down") }).await.unwrap();
    let ttl = Duration::from_secs(2);
    let margin = Duration::from_millis(500);
    let election = leader_store.election("gateway", ttl, margin).unwrap();
    let leadership = election.campaign(b"cut-off".to_vec()).await.unwrap();
    let deadline = leadership.deadline();
    wait_until("a keep-alive moves the deadline", async || leadership.deadline() > deadline).await;

    // The election lives beside the store's data (under `<prefix>election/`), so it is read and
    // watched with a plain client.
    drop(direct);
    let mut watcher = raw_client(&endpoints).await;
    let candidates = watcher
        .get(format!("{prefix}election/gateway/"), Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    assert_eq!(candidates.kvs().len(), 1, "one candidate");
    let election_key = String::from_utf8(candidates.kvs()[0].key().to_vec()).unwrap();
    let lease = candidates.kvs()[0].lease();
    let revision = candidates.header().unwrap().revision();
    let mut changes = watcher
        .watch(election_key.clone(), Some(etcd_client::WatchOptions::new().with_start_revision(revision + 1)))
        .await
        .unwrap();
    let mut lost = leadership.lost();
    for proxy in &proxies {
        proxy.cut();
    }
    let cut_at = Instant::now();
    tokio::time::timeout(PATIENCE, lost.wait_for(|lost| *lost)).await.expect("lost within 20 s").unwrap();
    let lost_at = Instant::now();
    let deadline = leadership.deadline();
    assert!(!leadership.is_valid());
    assert!(lost_at <= deadline, "lost flipped {:?} after the deadline", lost_at - deadline);
    // It flipped because the deadline came (keep-alives unanswered), not for another reason.
    let reason = leadership.lost_reason().unwrap_or_default();
    assert!(reason.contains("the deadline came"), "lost for another reason: {reason}");
    // etcd still holds the lease and the key: the leader stopped before anyone else could lead.
    let remaining = watcher.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!(remaining >= 0, "etcd had let the lease expire when the leader stepped down ({remaining})");
    assert_eq!(watcher.get(election_key.clone(), None).await.unwrap().kvs().len(), 1, "the key still exists");

    let expired_at = loop {
        let response = tokio::time::timeout(PATIENCE, changes.message()).await.expect("the lease expires within 20 s");
        let response = response.unwrap().expect("the watch is open");
        if response.events().iter().any(|event| event.event_type() == etcd_client::EventType::Delete) {
            break Instant::now();
        }
    };
    assert!(expired_at > deadline, "etcd deleted the election key {:?} before the deadline", deadline - expired_at);
    println!(
        "step-down: cut {:?} before the deadline; lost flipped {:?} before it; etcd deleted the key {:?} after it \
         (margin {margin:?}, ttl {ttl:?})",
        deadline.saturating_duration_since(cut_at),
        deadline - lost_at,
        expired_at - deadline,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_elections_are_refused_with_what_to_change() {
    let Some((_cluster, endpoints)) = cluster("invalid_election").await else { return };
    let store = EtcdStore::connect(config(&endpoints, "invalid-election")).await.unwrap();
    let second = Duration::from_secs(1);
    for (name, ttl, margin, says) in [
        ("gateway", second, Duration::ZERO, "at least 2 s"),
        ("gateway", Duration::from_millis(2500), Duration::ZERO, "whole number of seconds"),
        ("gateway", 10 * second, 5 * second, "less than half the ttl"),
        ("a/b", 10 * second, second, "without '/'"),
        ("", 10 * second, second, "1 to 128 bytes"),
    ] {
        match store.election(name, ttl, margin) {
            Err(error) => assert!(error.to_string().contains(says), "{error}"),
            Ok(_) => panic!("{name:?} {ttl:?} {margin:?} was accepted"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_nothing_fails_naming_the_endpoints() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let config = EtcdConfig {
        endpoints: vec![endpoint.clone()],
        dial_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(500),
        ..EtcdConfig::default()
    };
    match EtcdStore::connect(config).await {
        Err(Error::Etcd { endpoints, detail }) => {
            assert_eq!(endpoints, endpoint);
            assert!(detail.contains("health check"), "{detail}");
        }
        other => panic!("expected an etcd error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_tls_file_is_an_io_error_naming_it() {
    let config = EtcdConfig {
        endpoints: vec!["https://127.0.0.1:1".to_string()],
        tls: Some(EtcdTls { ca: "/nonexistent/etcd-ca.pem".into(), cert: None, key: None }),
        ..EtcdConfig::default()
    };
    match EtcdStore::connect(config).await {
        Err(Error::Io { path, .. }) => assert_eq!(path, std::path::PathBuf::from("/nonexistent/etcd-ca.pem")),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_signed_by_the_ca_connects_over_tls_and_none_is_refused() {
    if skip() {
        println!("skipped the TLS test: MERIDIAN_SKIP_ETCD=1");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let files = certificates(dir.path());
    let cluster = EtcdCluster::start_tls(1, files.server).await;
    let endpoints = cluster.endpoints();
    assert!(endpoints[0].starts_with("https://"), "{endpoints:?}");
    let config = EtcdConfig { tls: Some(files.client.clone()), ..config(&endpoints, "tls") };
    let store = EtcdStore::connect(config.clone()).await.unwrap();
    store.commit(vec![Write::put("jobs/a", b"over tls".to_vec())]).await.unwrap();
    assert_eq!(store.scan("jobs/").await.unwrap(), vec![("jobs/a".to_string(), b"over tls".to_vec())]);

    let without_certificate = EtcdConfig { tls: Some(EtcdTls { cert: None, key: None, ..files.client }), ..config };
    match EtcdStore::connect(without_certificate).await {
        Err(Error::Etcd { detail, .. }) => assert!(detail.contains("health check"), "{detail}"),
        other => panic!("expected etcd to refuse a client without a certificate, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_a_password_file_connects_when_etcd_requires_authentication() {
    if skip() {
        println!("skipped the authentication test: MERIDIAN_SKIP_ETCD=1");
        return;
    }
    // A cluster of its own: enabling authentication on a shared one would lock other tests out.
    let cluster = EtcdCluster::start(1).await;
    let endpoints = cluster.endpoints();
    let mut admin = raw_client(&endpoints).await;
    admin.user_add("root", "s3cret", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let password_file = dir.path().join("etcd-password");
    std::fs::write(&password_file, "s3cret\n").unwrap();
    let config = EtcdConfig {
        username: Some("root".to_string()),
        password_file: Some(password_file.clone()),
        ..config(&endpoints, "auth")
    };
    let store = EtcdStore::connect(config.clone()).await.unwrap();
    store.commit(vec![Write::put("jobs/a", b"1".to_vec())]).await.unwrap();
    assert_eq!(store.scan("jobs/").await.unwrap().len(), 1);
    let leadership = store.election("gateway", Duration::from_secs(2), Duration::ZERO).unwrap();
    leadership.campaign(b"authenticated".to_vec()).await.unwrap().resign().await;

    std::fs::write(&password_file, "wrong\n").unwrap();
    match EtcdStore::connect(config.clone()).await {
        Err(Error::Etcd { detail, .. }) => assert!(detail.contains("authentication failed"), "{detail}"),
        other => panic!("expected a refused password, got {other:?}"),
    }
    let missing = EtcdConfig { password_file: Some(dir.path().join("missing")), ..config };
    assert!(matches!(EtcdStore::connect(missing).await, Err(Error::Io { .. })));
}

/// The CA, server and client certificates for a TLS test, made with the `openssl` command.
struct Certificates {
    server: ServerTls,
    client: EtcdTls,
}

fn certificates(dir: &std::path::Path) -> Certificates {
    let openssl = |args: &[&str]| {
        let status = std::process::Command::new("openssl").args(args).current_dir(dir).output();
        match status {
            Ok(output) if output.status.success() => {}
            Ok(output) => panic!("openssl {args:?} failed: {}", String::from_utf8_lossy(&output.stderr)),
            Err(error) => panic!("cannot run openssl ({error}); the TLS test needs it: apt-get install openssl"),
        }
    };
    let key = |name: &str| {
        let (key, csr) = (format!("{name}.key"), format!("{name}.csr"));
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ]);
    };
    openssl(
        &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem"]
            .into_iter()
            .chain(["-days", "2", "-subj", "/CN=meridian-test-ca"])
            .collect::<Vec<_>>(),
    );
    for (name, extensions) in [
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        key(name);
        std::fs::write(dir.join(format!("{name}.ext")), extensions).unwrap();
        let (csr, pem, ext) = (format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
        openssl(
            &["x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", &pem]
                .into_iter()
                .chain(["-days", "2", "-extfile", &ext])
                .collect::<Vec<_>>(),
        );
    }
    Certificates {
        server: ServerTls { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server.key") },
        client: EtcdTls {
            ca: dir.join("ca.pem"),
            cert: Some(dir.join("client.pem")),
            key: Some(dir.join("client.key")),
        },
    }
}

/// A TCP proxy to one etcd member that can be cut: from then on it forwards nothing either way
/// and keeps connections open, like a network partition (no reset, no answer).
struct Blackhole {
    port: u16,
    cut: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Blackhole {
    async fn start(endpoint: &str) -> Blackhole {
        let target = endpoint.trim_start_matches("http://").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let cut = Arc::clone(&cut);
            async move {
                let mut connections = tokio::task::JoinSet::new();
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(&target).await else { continue };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    connections.spawn(pump(client_read, server_write, Arc::clone(&cut)));
                    connections.spawn(pump(server_read, client_write, Arc::clone(&cut)));
                }
            }
        });
        Blackhole { port, cut, task }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` until either closes; once `cut`, reads and drops everything.
async fn pump(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, cut: Arc<AtomicBool>) {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if cut.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
