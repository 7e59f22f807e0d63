//! [`Leadership`]: an elected term, valid until its deadline, and the task that renews its lease.
//!
//! The step-down rule is in the [module documentation](super).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use etcd_client::{EventType, LeaderKey, WatchOptions};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::Guard;
use super::shared::Shared;

/// How long to wait before reconnecting after etcd refused a keep-alive stream or the election
/// key's watch, at first and at most.
const RETRY_DELAY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(500));

/// How long before the deadline the timer flips `lost`: timers fire a little late (a few ms, more
/// on a loaded machine), and `lost` must not flip after the deadline.
const TIMER_LEAD: Duration = Duration::from_millis(20);

/// This gateway's term as leader of an [`Election`](super::Election), from
/// [`Election::campaign`](super::Election::campaign).
///
/// It is valid until [`deadline`](Leadership::deadline), which a background task pushes forward
/// with every keep-alive etcd acknowledges. Stop acting as leader when [`lost`](Leadership::lost)
/// flips, or check [`is_valid`](Leadership::is_valid) before each action. Dropping it stops the
/// keep-alives (the lease then expires within its TTL); [`resign`](Leadership::resign) hands over
/// at once.
pub struct Leadership {
    shared: Arc<Shared>,
    keeper: LeaseKeeper,
    key: Vec<u8>,
    create_revision: i64,
    /// etcd's handle on the entry, for resigning.
    leader_key: LeaderKey,
}

/// Owns the task that keeps a lease alive, and what the task reports.
pub(crate) struct LeaseKeeper {
    state: Arc<LeaseState>,
    task: JoinHandle<()>,
    lease_id: i64,
    /// Hands the election key to the task once elected, so that it watches it.
    key_sender: Mutex<Option<oneshot::Sender<WatchedKey>>>,
}

/// What the keep-alive task and the [`Leadership`] share.
struct LeaseState {
    view: Mutex<LeaseView>,
    lost: watch::Sender<bool>,
}

struct LeaseView {
    /// Before this instant the lease cannot have expired at etcd (less the step-down margin).
    deadline: Instant,
    /// Why validity ended; `None` while valid (up to the deadline).
    lost_reason: Option<String>,
}

struct WatchedKey {
    key: Vec<u8>,
    create_revision: i64,
    /// The first revision the watch must see.
    from_revision: i64,
}

impl Leadership {
    pub(crate) fn new(
        shared: Arc<Shared>,
        keeper: LeaseKeeper,
        key: Vec<u8>,
        create_revision: i64,
        leader_key: LeaderKey,
    ) -> Leadership {
        Leadership { shared, keeper, key, create_revision, leader_key }
    }

    /// The term's number: the election key's create revision, larger for every new term.
    pub fn epoch(&self) -> u64 {
        u64::try_from(self.create_revision).unwrap_or_default()
    }

    /// The guard for [`EtcdStore::with_guard`](super::EtcdStore::with_guard): commits apply only
    /// while this term's election key exists.
    pub fn guard(&self) -> Guard {
        Guard { key: self.key.clone(), create_revision: self.create_revision }
    }

    /// Whether this gateway may still act as leader: before the deadline, and not lost earlier
    /// (the lease or the election key reported gone, or resigned).
    pub fn is_valid(&self) -> bool {
        let view = self.keeper.state.view();
        view.lost_reason.is_none() && Instant::now() < view.deadline
    }

    /// The instant this term ends unless a keep-alive is acknowledged first: before it, etcd
    /// cannot have let the lease expire (with `step_down_margin` to spare).
    pub fn deadline(&self) -> Instant {
        self.keeper.state.view().deadline
    }

    /// Flips to `true` once, when validity ends: by timer just before the deadline (even when
    /// keep-alives hang), or earlier when etcd reports the lease expired, the election key is
    /// deleted, or the term is resigned or dropped.
    pub fn lost(&self) -> watch::Receiver<bool> {
        self.keeper.lost()
    }

    /// Why the term ended, once [`lost`](Leadership::lost) has flipped.
    pub fn lost_reason(&self) -> Option<String> {
        self.keeper.state.view().lost_reason.clone()
    }

    /// Ends the term now (for a clean shutdown): stops acting (`lost` flips), resigns the
    /// election and revokes the lease, so that another gateway wins at once. Best effort, within
    /// `request_timeout`: when etcd cannot be reached the lease expires within its TTL.
    pub async fn resign(self) {
        self.keeper.state.lose("resigned".to_string());
        self.keeper.task.abort();
        let shared = &self.shared;
        let resign = etcd_client::ResignOptions::new().with_leader(self.leader_key.clone());
        let release = async {
            let resigned = shared.request("resigning the election", || {
                let (mut election, resign) = (shared.client.election_client(), resign.clone());
                async move { election.resign(Some(resign)).await }
            });
            if let Err(error) = resigned.await {
                tracing::debug!(%error, "resigning the election failed; revoking the lease");
            }
            shared.revoke(self.keeper.lease_id).await
        };
        match tokio::time::timeout(shared.config.request_timeout, release).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "revoking the leader's lease failed; it expires within its TTL"),
            Err(_) => tracing::warn!("etcd did not answer the resignation in time; the lease expires within its TTL"),
        }
    }
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("epoch", &self.create_revision)
            .field("deadline", &self.deadline())
            .field("valid", &self.is_valid())
            .finish()
    }
}

impl LeaseKeeper {
    /// Starts keeping `lease_id` alive; `granted_at` is when its grant was sent.
    pub(crate) fn start(
        shared: Arc<Shared>,
        lease_id: i64,
        ttl: Duration,
        margin: Duration,
        granted_at: Instant,
    ) -> Self {
        let view = LeaseView { deadline: granted_at + ttl - margin, lost_reason: None };
        let state = Arc::new(LeaseState { view: Mutex::new(view), lost: watch::channel(false).0 });
        let (key_sender, key_receiver) = oneshot::channel();
        let task = tokio::spawn(keep_lease(shared, lease_id, ttl, margin, Arc::clone(&state), key_receiver));
        LeaseKeeper { state, task, lease_id, key_sender: Mutex::new(Some(key_sender)) }
    }

    pub(crate) fn lost(&self) -> watch::Receiver<bool> {
        self.state.lost.subscribe()
    }

    /// Why the lease was lost (or "still held").
    pub(crate) fn reason(&self) -> String {
        self.state.view().lost_reason.clone().unwrap_or_else(|| "the lease is still held".to_string())
    }

    /// From now on, also lose the lease when `key` is deleted (watching from `from_revision`).
    pub(crate) fn watch_key(&self, key: Vec<u8>, create_revision: i64, from_revision: i64) {
        let sender = self.key_sender.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(sender) = sender {
            // The task only stops after losing the lease, which the leadership reports anyway.
            let _ = sender.send(WatchedKey { key, create_revision, from_revision });
        }
    }

    /// Stops the keep-alives and revokes the lease, within `request_timeout` (after a failed
    /// campaign, so that the entry does not block others until the TTL runs out).
    pub(crate) async fn release(self, shared: &Shared) {
        self.state.lose("the campaign ended".to_string());
        self.task.abort();
        if let Err(error) = shared.revoke(self.lease_id).await {
            tracing::debug!(%error, "the lease of a failed campaign expires within its TTL");
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.state.lose("the leadership was dropped".to_string());
        self.task.abort();
    }
}

impl LeaseState {
    // Only plain assignments happen under the lock, so a poisoned lock is still consistent.
    fn view(&self) -> MutexGuard<'_, LeaseView> {
        self.view.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn deadline(&self) -> Instant {
        self.view().deadline
    }

    /// Moves the deadline to `deadline` if that is later.
    fn extend(&self, deadline: Instant) {
        let mut view = self.view();
        if view.lost_reason.is_none() && deadline > view.deadline {
            view.deadline = deadline;
        }
    }

    /// Ends validity (the first reason wins) and flips `lost`.
    fn lose(&self, reason: String) {
        {
            let mut view = self.view();
            if view.lost_reason.is_some() {
                return;
            }
            tracing::info!(%reason, "leadership lost");
            view.lost_reason = Some(reason);
        }
        self.lost.send_replace(true);
    }
}

/// The keep-alive task: renews until the lease is lost, reports why, then revokes the lease
/// (this gateway has stopped already, so another may take over without waiting for the TTL).
async fn keep_lease(
    shared: Arc<Shared>,
    lease_id: i64,
    ttl: Duration,
    margin: Duration,
    state: Arc<LeaseState>,
    key_receiver: oneshot::Receiver<WatchedKey>,
) {
    let reason = tokio::select! {
        reason = renew_lease(&shared, lease_id, ttl, margin, &state) => reason,
        reason = watch_key(&shared, key_receiver) => reason,
    };
    state.lose(reason);
    if let Err(error) = shared.revoke(lease_id).await {
        tracing::debug!(%error, "the lost lease expires within its TTL");
    }
}

/// When the timer ends validity: [`TIMER_LEAD`] before `deadline`.
fn step_down_time(deadline: Instant) -> Instant {
    deadline.checked_sub(TIMER_LEAD).unwrap_or(deadline)
}

fn tokio_instant(instant: Instant) -> tokio::time::Instant {
    tokio::time::Instant::from_std(instant)
}

/// Sends a keep-alive every `ttl / 4` (one at a time) and extends the deadline with each answer;
/// returns why the lease is lost: the deadline passed, or etcd says it expired.
async fn renew_lease(shared: &Shared, lease_id: i64, ttl: Duration, margin: Duration, state: &LeaseState) -> String {
    let interval = ttl / 4;
    let request_timeout = shared.config.request_timeout;
    let mut lease = shared.lease();
    let mut retry_delay = RETRY_DELAY.0;
    loop {
        let step_down = step_down_time(state.deadline());
        let sent = Instant::now();
        if sent >= step_down {
            return "no keep-alive was acknowledged in time: the deadline came".to_string();
        }
        // etcd-client sends the stream's first keep-alive itself and waits for its answer.
        let patience = tokio_instant(step_down.min(sent + request_timeout));
        let (mut keeper, mut answers) = match tokio::time::timeout_at(patience, lease.keep_alive(lease_id)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(detail))) => {
                return format!("etcd reports the lease expired ({detail})");
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, "opening a keep-alive stream failed; retrying in {retry_delay:?}");
                tokio::time::sleep_until(tokio_instant(step_down.min(Instant::now() + retry_delay))).await;
                retry_delay = (retry_delay * 2).min(RETRY_DELAY.1);
                continue;
            }
            Err(_) => continue,
        };
        retry_delay = RETRY_DELAY.0;
        state.extend(sent + ttl - margin);
        let mut next_send = sent + interval;
        let mut in_flight: Option<Instant> = None;
        loop {
            let step_down = step_down_time(state.deadline());
            let wake = in_flight.map_or(next_send, |sent| sent + request_timeout);
            tokio::select! {
                () = tokio::time::sleep_until(tokio_instant(step_down)) => break,
                () = tokio::time::sleep_until(tokio_instant(wake)) => {
                    if in_flight.is_some() {
                        tracing::debug!("a keep-alive went unanswered for {request_timeout:?}; reconnecting");
                        break;
                    }
                    let sent = Instant::now();
                    if keeper.keep_alive().await.is_err() {
                        break;
                    }
                    in_flight = Some(sent);
                }
                answer = answers.message() => match answer {
                    Ok(Some(answer)) if answer.ttl() > 0 => {
                        if let Some(sent) = in_flight.take() {
                            let granted = Duration::from_secs(answer.ttl().unsigned_abs()).min(ttl);
                            state.extend(sent + granted - margin.min(granted));
                            next_send = sent + interval;
                        }
                    }
                    Ok(Some(_)) => return "etcd reports the lease expired (a keep-alive answered TTL 0)".to_string(),
                    Ok(None) => break,
                    Err(error) => {
                        tracing::debug!(%error, "the keep-alive stream broke; reconnecting");
                        break;
                    }
                },
            }
        }
    }
}

/// Waits for the election key (sent once elected), then returns when it is deleted or replaced.
async fn watch_key(shared: &Shared, key_receiver: oneshot::Receiver<WatchedKey>) -> String {
    let Ok(watched) = key_receiver.await else {
        // Never elected: only the lease matters.
        return std::future::pending().await;
    };
    let mut from_revision = watched.from_revision;
    let mut retry_delay = RETRY_DELAY.0;
    loop {
        match watch_until_gone(shared, &watched, from_revision).await {
            Ok(reason) => return reason,
            Err(error) => {
                tracing::debug!(%error, "watching the election key failed; checking it again in {retry_delay:?}")
            }
        }
        tokio::time::sleep(retry_delay).await;
        retry_delay = (retry_delay * 2).min(RETRY_DELAY.1);
        match shared.get("reading the election key", watched.key.clone(), None).await {
            Ok(mut answer) => {
                let ours = answer.kvs().first().is_some_and(|kv| kv.create_revision() == watched.create_revision);
                if !ours {
                    return "the election key was deleted".to_string();
                }
                if let Some(header) = answer.take_header() {
                    from_revision = header.revision() + 1;
                }
            }
            Err(error) => tracing::debug!(%error, "reading the election key failed"),
        }
    }
}

/// Watches the election key from `from_revision`: `Ok(reason)` once it is deleted or replaced,
/// `Err` when the watch fails.
async fn watch_until_gone(shared: &Shared, watched: &WatchedKey, from_revision: i64) -> crate::Result<String> {
    let options = WatchOptions::new().with_start_revision(from_revision);
    let mut watch = shared.start_watch("watching the election key", watched.key.clone(), options).await?;
    loop {
        let response = match watch.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return Err(shared.error("etcd closed the election key's watch")),
            Err(error) => return Err(shared.error(format!("the election key's watch broke: {error}"))),
        };
        if response.canceled() || response.compact_revision() > 0 {
            return Err(shared.error(format!("etcd cancelled the election key's watch ({})", response.cancel_reason())));
        }
        for event in response.events() {
            match (event.event_type(), event.kv()) {
                (EventType::Delete, _) => return Ok("the election key was deleted".to_string()),
                (EventType::Put, Some(kv)) if kv.create_revision() != watched.create_revision => {
                    return Ok("the election key was replaced".to_string());
                }
                (EventType::Put, _) => {}
            }
        }
    }
}
