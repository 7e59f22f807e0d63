//! The runtime's promises, through its handle: durable before answered or sent, one commit for
//! what arrives together, reads that never wait on writes, and a failed store that never acks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use meridian_core::{Core, CoreConfig, Loaded};
use meridian_proto::gpu::GpuCatalog;
use meridian_proto::inventory::ClusterInfo;
use meridian_proto::job::JobState;
use meridian_proto::protocol::{AgentEvent, AgentHello, GatewayCommand};
use meridian_proto::testing;
use meridian_proto::validate::parse_job_spec;
use meridian_store::{BoxFuture, MemoryStore, Store, Write};
use tokio::sync::watch;

use super::*;

const JOB: &str = "name: j\ntenant: t\ngang: {replicas: 1, resources: {gpus: 8}}\npayload: {command: [x]}\n";

/// A memory store that counts commits, can hold them until the test lets them through, and
/// declares limits (and counts any batch beyond them).
struct GatedStore {
    inner: MemoryStore,
    commits: AtomicUsize,
    open: watch::Sender<bool>,
    limits: meridian_store::Limits,
    batches: std::sync::Mutex<Vec<usize>>,
    oversize: AtomicUsize,
}

impl GatedStore {
    fn open() -> Arc<Self> {
        Self::limited(meridian_store::Limits::UNLIMITED)
    }

    fn limited(limits: meridian_store::Limits) -> Arc<Self> {
        Arc::new(Self {
            inner: MemoryStore::new(),
            commits: AtomicUsize::new(0),
            open: watch::Sender::new(true),
            limits,
            batches: std::sync::Mutex::new(Vec::new()),
            oversize: AtomicUsize::new(0),
        })
    }

    /// Holds every commit from now on until `open_gate`.
    async fn close_gate(&self) {
        self.open.send_replace(false);
    }

    fn open_gate(&self) {
        self.open.send_replace(true);
    }
}

impl Store for GatedStore {
    fn commit(&self, batch: Vec<Write>) -> BoxFuture<'_, meridian_store::Result<()>> {
        Box::pin(async move {
            let mut open = self.open.subscribe();
            let _ = open.wait_for(|open| *open).await;
            self.commits.fetch_add(1, Ordering::SeqCst);
            let bytes = batch.iter().map(Write::size).sum();
            if !self.limits.fits(batch.len(), bytes) {
                self.oversize.fetch_add(1, Ordering::SeqCst);
            }
            self.batches.lock().unwrap().push(batch.len());
            self.inner.commit(batch).await
        })
    }

    fn scan(&self, prefix: &str) -> BoxFuture<'_, meridian_store::Result<Vec<(String, Vec<u8>)>>> {
        self.inner.scan(prefix)
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    fn describe(&self) -> String {
        "gated memory".into()
    }

    fn limits(&self) -> meridian_store::Limits {
        self.limits
    }
}

fn spec(name: &str) -> meridian_proto::spec::JobSpec {
    parse_job_spec(&JOB.replace("name: j", &format!("name: {name}")), &GpuCatalog::default()).unwrap()
}

fn start(store: Arc<dyn Store>) -> (Runtime, Handle, watch::Sender<bool>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let core = Core::new(CoreConfig::default(), Loaded::default(), now_ms(), 1);
    let (runtime, handle) = Runtime::start(core, store, RuntimeConfig::default(), stop_rx);
    (runtime, handle, stop_tx)
}

/// The fixture hello of cluster `east`, without prices.
fn hello() -> AgentHello {
    AgentHello {
        info: ClusterInfo { prices: BTreeMap::new(), ..testing::cluster_info("east") },
        ..testing::hello("east", "a1")
    }
}

/// One 8-GPU node, all free.
fn inventory() -> AgentEvent {
    testing::inventory_event(&[8])
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), future).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

#[tokio::test]
async fn submits_that_arrive_together_share_one_commit() {
    let store = GatedStore::open();
    let (runtime, handle, stop) = start(store.clone());
    store.close_gate().await;
    // The first submits' commit waits at the gate; the rest queue up behind it.
    let sent = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for i in 0..64 {
        let (handle, sent) = (handle.clone(), Arc::clone(&sent));
        calls.push(tokio::spawn(async move {
            // The channel has room, so the request is queued within this same poll.
            sent.fetch_add(1, Ordering::SeqCst);
            handle.submit(spec(&format!("j{i}"))).await
        }));
    }
    while sent.load(Ordering::SeqCst) < 64 {
        tokio::task::yield_now().await;
    }
    tokio::task::yield_now().await;
    store.open_gate();
    for call in calls {
        let (job, created) = within("submit", call).await.unwrap().unwrap();
        assert!(created);
        assert!(handle.view().job(&job.id).is_some(), "answered jobs are visible to readers");
    }
    let commits = store.commits.load(Ordering::SeqCst);
    assert!(commits <= 3, "64 submits took {commits} commits");
    assert_eq!(store.scan("jobs/").await.unwrap().len(), 64, "every acknowledged job is stored");
    let _ = stop.send(true);
    runtime.join().await;
}

#[tokio::test]
async fn reads_do_not_wait_on_a_slow_commit() {
    let store = GatedStore::open();
    let (runtime, handle, stop) = start(store.clone());
    let (first, _) = within("submit", handle.submit(spec("a"))).await.unwrap();
    store.close_gate().await;
    let pending = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.submit(spec("b")).await })
    };
    // The write is stuck at the disk; readers still answer, and see only what is durable.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let view = handle.view();
    assert!(view.job(&first.id).is_some());
    assert_eq!(view.job_count(), 1, "a job not yet durable is not shown");
    assert!(!pending.is_finished(), "no answer before the commit");
    store.open_gate();
    within("second submit", pending).await.unwrap().unwrap();
    assert_eq!(handle.view().job_count(), 2);
    let _ = stop.send(true);
    runtime.join().await;
}

#[tokio::test]
async fn an_offer_reaches_the_agent_only_after_its_record_is_durable() {
    let store = GatedStore::open();
    let (runtime, handle, stop) = start(store.clone());
    let conn = handle.next_conn();
    let mut outbox = within("attach", handle.attach(conn, hello())).await.unwrap();
    assert!(matches!(within("welcome", outbox.recv()).await, Some(GatewayCommand::Welcome { .. })));
    handle.agent_event(conn, inventory()).await.unwrap();
    store.close_gate().await;
    let submit = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.submit(spec("a")).await })
    };
    // Submit and the round that offers the job are in the gated commit: nothing may reach the agent.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    assert!(outbox.try_recv().is_err(), "an offer was sent before its record was durable");
    store.open_gate();
    let (job, _) = within("submit", submit).await.unwrap().unwrap();
    let offer = loop {
        match within("offer", outbox.recv()).await {
            Some(GatewayCommand::Offer(offer)) => break offer,
            Some(_) => continue,
            None => panic!("stream closed"),
        }
    };
    assert_eq!(offer.job_id, job.id);
    let stored = store.scan(&format!("jobs/{}", job.id)).await.unwrap();
    let record: meridian_core::JobRecord = meridian_core::record::decode(&stored[0].0, &stored[0].1).unwrap();
    assert_eq!((record.state, record.fencing_token), (JobState::Offered, offer.fencing_token));
    let _ = stop.send(true);
    runtime.join().await;
}

#[tokio::test]
async fn a_failed_commit_is_never_acknowledged_and_later_writes_are_refused() {
    let store = Arc::new(MemoryStore::new());
    let (runtime, handle, stop) = start(store.clone());
    let (kept, _) = within("submit", handle.submit(spec("kept"))).await.unwrap();
    store.fail_next_commit("injected: fsync failed");
    let lost = within("submit", handle.submit(spec("lost"))).await;
    assert!(matches!(lost, Err(CallError::Core(meridian_core::Error::Unavailable(_)))), "{lost:?}");
    let later = within("submit", handle.submit(spec("later"))).await;
    assert!(matches!(later, Err(CallError::Core(meridian_core::Error::Unavailable(_)))), "{later:?}");
    let view = handle.view();
    let failure = view.failure().expect("the view reports the failure");
    assert!(!failure.contains('/'), "the public message names no paths: {failure}");
    assert_eq!(view.job_count(), 1, "readers never see the change that failed");
    assert!(view.job(&kept.id).is_some());
    let _ = stop.send(true);
    runtime.join().await;
}

/// The whole write path (runtime, group commit, redb) over a simulated disk that fails: a failed
/// fsync, a torn write, a full disk, each at several moments of a concurrent submit load. After
/// a power loss (only synced data survives), every job that got an answer is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_disk_faults_every_acknowledged_job_survives_a_power_loss() {
    use meridian_store::RedbStore;
    use meridian_store::testing::SimulatedDisk;

    #[derive(Debug, Clone, Copy)]
    enum Fault {
        Fsync,
        TornWrite,
        DiskFull,
    }
    let mut cases = 0;
    for fault in [Fault::Fsync, Fault::TornWrite, Fault::DiskFull] {
        for at in [1u64, 2, 3, 5, 8, 13] {
            let dir = tempfile::tempdir().unwrap();
            let disk = SimulatedDisk::new(at * 31 + fault as u64);
            let store = Arc::new(RedbStore::open_with_backend(dir.path(), disk.clone()).unwrap());
            let (runtime, handle, stop) = start(store.clone());
            // Some jobs before the fault is armed.
            let mut acknowledged = Vec::new();
            for i in 0..5 {
                acknowledged
                    .push(within("submit", handle.submit(spec(&format!("early{i}")))).await.unwrap().0.id.clone());
            }
            match fault {
                Fault::Fsync => disk.fail_sync(at),
                Fault::TornWrite => disk.tear_write(at),
                Fault::DiskFull => disk.fill_after_writes(at),
            }
            // Waves of concurrent submits (each wave a few group commits) until the fault fires.
            let mut refused = 0;
            for wave in 0..20 {
                let mut calls = Vec::new();
                for i in 0..12 {
                    let handle = handle.clone();
                    calls.push(tokio::spawn(async move { handle.submit(spec(&format!("load{wave}-{i}"))).await }));
                }
                for call in calls {
                    match within("submit", call).await.unwrap() {
                        Ok((job, _)) => acknowledged.push(job.id.clone()),
                        Err(CallError::Core(meridian_core::Error::Unavailable(_))) => refused += 1,
                        Err(other) => panic!("{fault:?}@{at}: unexpected {other}"),
                    }
                }
                if refused > 0 {
                    break;
                }
            }
            assert!(refused > 0, "{fault:?}@{at}: the fault never surfaced");
            let _ = stop.send(true);
            runtime.join().await;
            drop(handle);
            drop(store);
            let rebooted = disk.crash();
            let reopened = RedbStore::open_with_backend(dir.path(), rebooted).unwrap();
            let stored: Vec<String> = reopened
                .scan("jobs/")
                .await
                .unwrap()
                .into_iter()
                .map(|(key, _)| key.trim_start_matches("jobs/").to_string())
                .collect();
            for id in &acknowledged {
                assert!(stored.contains(id), "{fault:?}@{at}: acknowledged job {id} lost after the power loss");
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 18);
}

/// During a store failure, a client that retries an acknowledged submit (same tenant, key and
/// spec) gets its job back from the last durable view; anything new is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_submit_replayed_during_a_store_failure_answers_with_the_stored_job() {
    use meridian_store::RedbStore;
    use meridian_store::testing::SimulatedDisk;

    let keyed = |name: &str, key: &str| {
        let mut spec = spec(name);
        spec.idempotency_key = Some(key.to_string());
        spec
    };
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::new(7);
    let store = Arc::new(RedbStore::open_with_backend(dir.path(), disk.clone()).unwrap());
    let (runtime, handle, stop) = start(store.clone());
    let (acknowledged, created) = within("submit", handle.submit(keyed("kept", "key-1"))).await.unwrap();
    assert!(created);
    disk.fail_sync(1);
    let mut failed = false;
    for i in 0..20 {
        match within("submit", handle.submit(keyed(&format!("new{i}"), &format!("key-new{i}")))).await {
            Err(CallError::Core(meridian_core::Error::Unavailable(_))) => {
                failed = true;
                break;
            }
            Ok(_) => {}
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert!(failed, "the fault never surfaced");
    let (replayed, created) = within("replay", handle.submit(keyed("kept", "key-1"))).await.unwrap();
    assert!(!created);
    assert_eq!(replayed.id, acknowledged.id, "the stored job, not a new one");
    let changed = within("changed replay", handle.submit(keyed("other-spec", "key-1"))).await;
    assert!(matches!(changed, Err(CallError::Core(meridian_core::Error::Unavailable(_)))), "{changed:?}");
    let _ = stop.send(true);
    runtime.join().await;
}

#[tokio::test]
async fn the_first_read_after_a_start_already_sees_the_stored_jobs() {
    let store = Arc::new(MemoryStore::new());
    let (runtime, handle, stop) = start(store.clone());
    within("submit", handle.submit(spec("kept"))).await.unwrap();
    let _ = stop.send(true);
    runtime.join().await;
    drop(handle);

    let core = crate::server::load(&crate::config::GatewayConfig::default(), store.as_ref()).await.unwrap();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (runtime, handle) = Runtime::start(core, store, RuntimeConfig::default(), stop_rx);
    // No yield between the start and the read: the driver task has not run yet.
    assert_eq!(handle.view().job_count(), 1);
    let _ = stop_tx.send(true);
    runtime.join().await;
}

#[tokio::test]
async fn a_logs_request_goes_to_the_cluster_holding_the_job_and_only_it_may_answer() {
    let store = Arc::new(MemoryStore::new());
    let (runtime, handle, stop) = start(store);
    let queued = within("submit", handle.submit(spec("waits"))).await.unwrap().0;
    let early = within("logs", handle.logs(&queued.id, None, 100)).await;
    assert!(
        matches!(early, Err(LogsError::Call(CallError::Core(meridian_core::Error::NotStarted(_))))),
        "a job not yet placed has no output: {early:?}"
    );
    let unknown = within("logs", handle.logs("j-nope", None, 100)).await;
    assert!(matches!(unknown, Err(LogsError::Call(CallError::Core(meridian_core::Error::NotFound(_))))));

    let conn = handle.next_conn();
    let mut outbox = within("attach", handle.attach(conn, hello())).await.unwrap();
    handle.agent_event(conn, inventory()).await.unwrap();
    let offer = loop {
        match within("offer", outbox.recv()).await {
            Some(GatewayCommand::Offer(offer)) => break offer,
            Some(_) => continue,
            None => panic!("stream closed"),
        }
    };
    let accepted = AgentEvent::OfferReply {
        job_id: offer.job_id.clone(),
        fencing_token: offer.fencing_token,
        accepted: true,
        reason: String::new(),
        permanent: false,
    };
    handle.agent_event(conn, accepted).await.unwrap();
    let asking = {
        let handle = handle.clone();
        let id = offer.job_id.clone();
        tokio::spawn(async move { handle.logs(&id, Some(5), 1000).await })
    };
    let (request_id, job_id, token, from, max_bytes) = loop {
        match within("logs request", outbox.recv()).await {
            Some(GatewayCommand::Logs { request_id, job_id, fencing_token, from, max_bytes }) => {
                break (request_id, job_id, fencing_token, from, max_bytes);
            }
            Some(_) => continue,
            None => panic!("stream closed"),
        }
    };
    assert_eq!((job_id.as_str(), token, from, max_bytes), (offer.job_id.as_str(), offer.fencing_token, Some(5), 1000));
    let chunk = LogChunk { data: "step 10 loss 0.3\n".into(), offset: 5, next_offset: 22, complete: false };
    // Another stream cannot answer for this cluster.
    handle.agent_event(conn + 100, AgentEvent::Logs { request_id, result: Ok(LogChunk::default()) }).await.unwrap();
    handle.agent_event(conn, AgentEvent::Logs { request_id, result: Ok(chunk.clone()) }).await.unwrap();
    assert_eq!(within("logs answer", asking).await.unwrap().unwrap(), chunk);

    // The member's own error reaches the caller in its words.
    let asking = {
        let handle = handle.clone();
        let id = offer.job_id.clone();
        tokio::spawn(async move { handle.logs(&id, None, 10).await })
    };
    let request_id = loop {
        if let Some(GatewayCommand::Logs { request_id, .. }) = within("logs request", outbox.recv()).await {
            break request_id;
        }
    };
    handle.agent_event(conn, AgentEvent::Logs { request_id, result: Err("output file gone".into()) }).await.unwrap();
    let answer = within("logs answer", asking).await.unwrap();
    assert!(matches!(&answer, Err(LogsError::Member(m)) if m == "output file gone"), "{answer:?}");

    // With the agent gone, the cluster is unreachable and the caller hears so at once.
    handle.agent_gone(conn).await;
    let gone = within("logs", handle.logs(&offer.job_id, None, 10)).await;
    assert!(
        matches!(gone, Err(LogsError::Call(CallError::Core(meridian_core::Error::ClusterUnreachable { .. })))),
        "{gone:?}"
    );
    let _ = stop.send(true);
    runtime.join().await;
}

#[tokio::test]
async fn watchers_see_each_committed_job_change_and_cluster_change_in_order() {
    let (runtime, handle, stop) = start(Arc::new(MemoryStore::new()));
    let mut watcher = handle.subscribe(None);
    let conn = handle.next_conn();
    let mut outbox = within("attach", handle.attach(conn, hello())).await.unwrap();
    handle.agent_event(conn, inventory()).await.unwrap();
    let (job, _) = within("submit", handle.submit(spec("a"))).await.unwrap();
    let mut cluster_seen = false;
    let mut states = Vec::new();
    while states.last() != Some(&JobState::Offered) {
        let event = within("event", watcher.next()).await.expect("open").expect("no gap");
        match &event.kind {
            events::EventKind::Cluster(c) => {
                assert_eq!(c.name, "east");
                cluster_seen |= c.gpus_total == 8;
            }
            events::EventKind::Job { job: record, previous } => {
                assert_eq!(record.id, job.id);
                assert_eq!(*previous, states.last().copied(), "previous is the state of the event before");
                // What an event tells is already in the view.
                assert!(handle.view().job(&record.id).is_some());
                states.push(record.state);
            }
        }
    }
    assert!(cluster_seen, "the cluster's new inventory was an event");
    assert_eq!(states, [JobState::Queued, JobState::Offered]);
    // Resuming from the start yields the same job changes again.
    let mut replay = handle.subscribe(Some(events::EventId { epoch: watcher.cursor().epoch, seq: 0 }));
    let mut replayed = Vec::new();
    while replayed.len() < states.len() {
        if let events::EventKind::Job { job, .. } = &within("replay", replay.next()).await.unwrap().unwrap().kind {
            replayed.push(job.state);
        }
    }
    assert_eq!(replayed, states);
    let _ = outbox.try_recv();
    let _ = stop.send(true);
    runtime.join().await;
    // The driver is gone: the watcher reads what was published last, then ends instead of hanging.
    while within("end", watcher.next()).await.is_some() {}
}

#[tokio::test]
async fn batches_never_exceed_the_stores_limits_and_everything_is_answered() {
    let store = GatedStore::limited(meridian_store::Limits { max_writes: 4, max_bytes: 64 * 1024 });
    let (runtime, handle, stop) = start(store.clone());
    store.close_gate().await;
    // Forty submits wait together while the first commit is held: without limits they would
    // share one or two commits.
    let submits: Vec<_> = (0..40)
        .map(|i| {
            tokio::spawn({
                let handle = handle.clone();
                async move { handle.submit(spec(&format!("j{i}"))).await }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.open_gate();
    for submit in submits {
        within("submit", submit).await.unwrap().unwrap();
    }
    let batches = store.batches.lock().unwrap().clone();
    assert_eq!(store.oversize.load(Ordering::SeqCst), 0, "a batch beyond the limits: {batches:?}");
    assert!(batches.len() >= 10, "forty submits cannot fit in fewer than ten commits of four: {batches:?}");
    assert_eq!(store.inner.scan("jobs/").await.unwrap().len(), 40);
    let _ = stop.send(true);
    assert_eq!(runtime.join().await, TermEnd::Shutdown);
}

#[test]
fn a_step_larger_than_the_limits_is_split_into_batches_that_fit() {
    let writes: Vec<Write> = (0..10).map(|i| Write::put(format!("k{i}"), vec![0u8; 100])).collect();
    let limits = meridian_store::Limits { max_writes: 4, max_bytes: 250 };
    let batches = driver::split(writes.into_iter(), limits);
    assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 2, 2, 2], "bytes bind first");
    for batch in &batches {
        assert!(limits.fits(batch.len(), batch.iter().map(Write::size).sum()));
    }
    let keys: Vec<_> = batches.iter().flatten().map(|w| w.key().to_string()).collect();
    assert_eq!(keys, (0..10).map(|i| format!("k{i}")).collect::<Vec<_>>(), "in order, none lost");
}

#[tokio::test]
async fn a_term_whose_fence_lapses_sends_nothing_more_and_hands_back_to_standby() {
    let valid = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (_lapse, lapsed) = watch::channel(false);
    let fence = Fence::elected(
        7,
        {
            let valid = Arc::clone(&valid);
            Arc::new(move || valid.load(Ordering::SeqCst))
        },
        lapsed,
    );
    let core = Core::new(CoreConfig::default(), Loaded::default(), now_ms(), 1);
    let handle =
        Handle::new(RuntimeConfig::default(), Core::new(CoreConfig::default(), Loaded::default(), now_ms(), 1).view());
    let (_stop, stop_rx) = watch::channel(false);
    let runtime = Runtime::start_term(core, Arc::new(MemoryStore::new()), &handle, fence, true, stop_rx);
    assert_eq!(handle.role(), Role::Leader { epoch: 7 });
    let conn = handle.next_conn();
    let (mut outbox, term_fence) = within("attach", handle.attach_fenced(conn, hello())).await.unwrap();
    assert_eq!(term_fence.epoch(), 7);
    assert!(matches!(outbox.recv().await, Some(GatewayCommand::Welcome { .. })));
    handle.agent_event(conn, inventory()).await.unwrap();
    // The lease may have run out: the job's offer must never reach the agent.
    valid.store(false, Ordering::SeqCst);
    let submitted = handle.submit(spec("after")).await;
    assert_eq!(within("term end", runtime.join()).await, TermEnd::LostLeadership);
    while let Some(command) = outbox.recv().await {
        assert!(!matches!(command, GatewayCommand::Offer(_)), "an offer left a lapsed term: {command:?}");
    }
    // The submit was durable before the term noticed (the store took it), or refused; either
    // way the caller got an answer, and calls now name no leader instead of waiting.
    let _ = submitted;
    assert!(matches!(handle.role(), Role::Standby { .. }), "{:?}", handle.role());
    assert!(matches!(handle.submit(spec("later")).await, Err(CallError::NotLeader { leader: None })));
}
