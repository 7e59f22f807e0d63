//! The event stream: what changed after each group commit, for watchers (`GET /v1/events`, the
//! gRPC `Watch`, the console, metrics).
//!
//! The driver publishes one [`Event`] per job record a commit wrote and per cluster whose
//! summary changed, after the commit and after the new view is published: an event never tells
//! of a change that a crash could take back, and a reader that sees an event finds at least
//! that state in the view. The hub keeps the last [`RETAINED`] events so that a watcher can
//! resume after a short break with no loss; ids carry the gateway process's epoch, so an id from
//! another process (or one the hub no longer keeps) is answered with a [`Gap`]: reload a
//! snapshot, then go on.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use meridian_core::{ClusterSummary, JobRecord};
use meridian_proto::job::JobState;
use tokio::sync::watch;

/// Events the hub keeps for watchers that resume.
pub const RETAINED: usize = 16_384;

/// Where an event is in the stream: the gateway process (`epoch`) and its place in it (`seq`,
/// from 1). Written `EPOCH.SEQ`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId {
    /// Identifies the gateway process that numbered the event.
    pub epoch: u64,
    /// The event's number in that process (0: before the first event).
    pub seq: u64,
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch, self.seq)
    }
}

/// Why an event id could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an event id (EPOCH.SEQ, as sent in an event's `id`)")]
pub struct BadEventId(pub String);

impl FromStr for EventId {
    type Err = BadEventId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadEventId(text.chars().take(64).collect());
        let (epoch, seq) = text.trim().split_once('.').ok_or_else(bad)?;
        Ok(EventId { epoch: epoch.parse().map_err(|_| bad())?, seq: seq.parse().map_err(|_| bad())? })
    }
}

/// What changed.
#[derive(Debug, Clone)]
pub enum EventKind {
    /// A job's record changed (or a job was created).
    Job {
        /// The record as committed.
        job: Arc<JobRecord>,
        /// Its state before this change; None for a new job.
        previous: Option<JobState>,
    },
    /// A cluster's summary changed (joined, connected, lost, new inventory or pressure).
    Cluster(ClusterSummary),
}

/// One change, as watchers see it.
#[derive(Debug, Clone)]
pub struct Event {
    /// Its place in the stream.
    pub id: EventId,
    /// When it was committed (Unix ms).
    pub at_ms: i64,
    /// What changed.
    pub kind: EventKind,
}

impl Event {
    /// The tenant whose data the event carries (None: a cluster event, for every caller).
    pub fn tenant(&self) -> Option<&str> {
        match &self.kind {
            EventKind::Job { job, .. } => Some(&job.spec.tenant),
            EventKind::Cluster(_) => None,
        }
    }
}

/// A watcher missed events: it must reload what it shows, then go on from here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Gap {
    /// Why, in words.
    pub reason: String,
}

/// The retained events, shared by the driver (the only writer) and every subscription.
#[derive(Debug)]
pub(crate) struct Hub {
    epoch: u64,
    capacity: usize,
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<Arc<Event>>,
    /// The seq of the latest event (0: none yet).
    latest: u64,
}

/// The driver's side: publishes events and wakes subscriptions. Dropping it ends every
/// subscription (once it has read what was published), which is how watchers learn that the
/// gateway stopped.
pub(crate) struct Publisher {
    hub: Arc<Hub>,
    latest: watch::Sender<u64>,
}

impl Hub {
    /// A hub for one gateway process, numbered under `epoch`, and its publisher.
    pub(crate) fn new(epoch: u64, capacity: usize) -> (Arc<Hub>, Publisher, watch::Receiver<u64>) {
        let hub = Arc::new(Hub { epoch, capacity: capacity.max(1), ring: Mutex::new(Ring::default()) });
        let (latest, receiver) = watch::channel(0);
        (Arc::clone(&hub), Publisher { hub, latest }, receiver)
    }

    fn with<R>(&self, f: impl FnOnce(&mut Ring) -> R) -> R {
        match self.ring.lock() {
            Ok(mut ring) => f(&mut ring),
            Err(poisoned) => f(&mut poisoned.into_inner()),
        }
    }

    fn id(&self, seq: u64) -> EventId {
        EventId { epoch: self.epoch, seq }
    }

    /// A subscription that yields events after `after` (None: after the latest, so only new
    /// ones). An id the hub cannot resume from yields a [`Gap`] first.
    pub(crate) fn subscribe(self: &Arc<Self>, after: Option<EventId>, wake: watch::Receiver<u64>) -> Subscription {
        let (latest, oldest) = self.with(|ring| (ring.latest, ring.events.front().map(|e| e.id.seq)));
        let (position, gap) = match after {
            None => (latest, None),
            Some(id) if id.epoch != self.epoch => (
                latest,
                Some(Gap {
                    reason: format!("event {id} is from another gateway process (this one numbers {}.N)", self.epoch),
                }),
            ),
            Some(id) if id.seq > latest => {
                (latest, Some(Gap { reason: format!("event {id} is ahead of the latest event ({})", self.id(latest)) }))
            }
            Some(id) if oldest.is_some_and(|oldest| id.seq + 1 < oldest) => (
                latest,
                Some(Gap {
                    reason: format!(
                        "events after {id} are no longer kept (the oldest kept is {})",
                        self.id(oldest.unwrap_or(0))
                    ),
                }),
            ),
            Some(id) => (id.seq, None),
        };
        Subscription { hub: Arc::clone(self), position, gap, buffered: VecDeque::new(), wake }
    }
}

impl Publisher {
    /// Numbers and retains `changes` (in order) and wakes subscriptions.
    pub(crate) fn publish(&self, at_ms: i64, changes: impl IntoIterator<Item = EventKind>) {
        let latest = self.hub.with(|ring| {
            for kind in changes {
                ring.latest += 1;
                let id = self.hub.id(ring.latest);
                ring.events.push_back(Arc::new(Event { id, at_ms, kind }));
                if ring.events.len() > self.hub.capacity {
                    ring.events.pop_front();
                }
            }
            ring.latest
        });
        self.latest.send_if_modified(|seen| {
            let changed = *seen != latest;
            *seen = latest;
            changed
        });
    }
}

/// Tells watchers what changed between two views: each job in `changed_jobs` (once, as `after`
/// holds it) and each cluster whose summary changed (the time it last reported aside).
pub(crate) fn publish_changes<'a>(
    publisher: &Publisher,
    before: &meridian_core::ReadView,
    after: &meridian_core::ReadView,
    changed_jobs: impl IntoIterator<Item = &'a str>,
    at_ms: i64,
) {
    let mut changes = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for id in changed_jobs {
        if !seen.insert(id) {
            continue;
        }
        if let Some(current) = after.job(id) {
            changes.push(EventKind::Job { previous: before.job(id).map(|j| j.state), job: current });
        }
    }
    if !after.same_clusters(before) {
        let old: std::collections::HashMap<&str, &ClusterSummary> =
            before.cluster_summaries().iter().map(|c| (c.name.as_str(), c)).collect();
        for cluster in after.cluster_summaries().iter() {
            let changed = old.get(cluster.name.as_str()).is_none_or(|previous| {
                let mut previous = (*previous).clone();
                previous.last_seen_ms = cluster.last_seen_ms;
                previous != *cluster
            });
            if changed {
                changes.push(EventKind::Cluster(cluster.clone()));
            }
        }
    }
    if !changes.is_empty() {
        publisher.publish(at_ms, changes);
    }
}

/// One watcher's place in the stream.
pub struct Subscription {
    hub: Arc<Hub>,
    /// The seq of the last event yielded (or the start).
    position: u64,
    gap: Option<Gap>,
    buffered: VecDeque<Arc<Event>>,
    wake: watch::Receiver<u64>,
}

impl Subscription {
    /// Where the subscription is: the id of the last event it yielded, or of the event it
    /// started after. Resuming from it misses nothing.
    pub fn cursor(&self) -> EventId {
        self.hub.id(self.position)
    }

    /// The next event, or a [`Gap`] when events were missed (then the subscription goes on from
    /// the latest event); None once the gateway stopped and every published event was yielded.
    pub async fn next(&mut self) -> Option<Result<Arc<Event>, Gap>> {
        loop {
            if let Some(gap) = self.gap.take() {
                return Some(Err(gap));
            }
            if let Some(event) = self.buffered.pop_front() {
                self.position = event.id.seq;
                return Some(Ok(event));
            }
            // Marked seen before reading the ring, so a publish after the read wakes us.
            self.wake.borrow_and_update();
            if self.refill() {
                continue;
            }
            // The driver stopped: yield what it published last, then end.
            if self.wake.changed().await.is_err() && !self.refill() {
                return None;
            }
        }
    }

    /// Takes the retained events after `position`; true if there were any (or a gap).
    fn refill(&mut self) -> bool {
        let position = self.position;
        let taken = self.hub.with(|ring| {
            let Some(oldest) = ring.events.front().map(|e| e.id.seq) else { return Ok(Vec::new()) };
            if position + 1 < oldest {
                return Err(ring.latest);
            }
            let skip = usize::try_from(position + 1 - oldest).unwrap_or(usize::MAX);
            Ok(ring.events.iter().skip(skip).take(256).cloned().collect::<Vec<_>>())
        });
        match taken {
            Ok(events) => {
                let any = !events.is_empty();
                self.buffered.extend(events);
                any
            }
            Err(latest) => {
                self.gap = Some(Gap {
                    reason: format!(
                        "this watcher fell more than {} events behind; events after {} are no longer kept",
                        self.hub.capacity,
                        self.hub.id(position)
                    ),
                });
                self.position = latest;
                true
            }
        }
    }
}

/// A connected 8-GPU builtin cluster summary, for tests here and elsewhere in the crate.
#[cfg(test)]
pub(crate) fn sample_cluster(name: &str) -> ClusterSummary {
    ClusterSummary {
        name: name.into(),
        region: "r".into(),
        tier: meridian_proto::inventory::Tier::Owned,
        backend: meridian_proto::inventory::BackendKind::Builtin,
        connected: true,
        last_seen_ms: 0,
        last_seen_secs_ago: None,
        gpus_total: 8,
        gpus_free: 8,
        gpu_types: vec![],
        pending_jobs: 0,
        pending_gpus: 0,
        estimated_wait_secs: 0,
        federated_jobs: 0,
        prices: Default::default(),
        labels: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn cluster(name: &str) -> EventKind {
        EventKind::Cluster(sample_cluster(name))
    }

    fn name(event: &Event) -> &str {
        match &event.kind {
            EventKind::Cluster(c) => &c.name,
            EventKind::Job { job, .. } => &job.id,
        }
    }

    async fn next(subscription: &mut Subscription) -> Option<Result<Arc<Event>, Gap>> {
        tokio::time::timeout(Duration::from_secs(5), subscription.next()).await.expect("an event in time")
    }

    #[test]
    fn ids_read_back_what_they_write_and_refuse_anything_else() {
        let id = EventId { epoch: 1_764_000_000_000, seq: 42 };
        assert_eq!(id.to_string().parse::<EventId>(), Ok(id));
        for bad in ["", "42", "a.b", "1.-2", "1.2.3"] {
            assert!(bad.parse::<EventId>().is_err(), "{bad} parsed");
        }
    }

    #[tokio::test]
    async fn a_new_subscription_sees_only_what_is_published_after_it() {
        let (hub, publisher, wake) = Hub::new(7, 100);
        publisher.publish(1, [cluster("old")]);
        let mut watcher = hub.subscribe(None, wake);
        assert_eq!(watcher.cursor(), EventId { epoch: 7, seq: 1 });
        publisher.publish(2, [cluster("a"), cluster("b")]);
        let a = next(&mut watcher).await.unwrap().unwrap();
        let b = next(&mut watcher).await.unwrap().unwrap();
        assert_eq!((name(&a), name(&b)), ("a", "b"));
        assert_eq!((a.id.seq, b.id.seq, b.at_ms), (2, 3, 2));
        assert_eq!(watcher.cursor(), b.id);
    }

    #[tokio::test]
    async fn resuming_from_an_id_yields_exactly_the_events_after_it() {
        let (hub, publisher, wake) = Hub::new(7, 100);
        publisher.publish(1, ["a", "b", "c", "d"].map(cluster));
        let mut watcher = hub.subscribe(Some(EventId { epoch: 7, seq: 2 }), wake);
        let seen: Vec<String> = [next(&mut watcher).await, next(&mut watcher).await]
            .into_iter()
            .map(|e| name(&e.unwrap().unwrap()).to_string())
            .collect();
        assert_eq!(seen, ["c", "d"]);
    }

    #[tokio::test]
    async fn an_id_from_another_process_or_the_future_or_too_old_is_a_gap_then_new_events_follow() {
        let (hub, publisher, wake) = Hub::new(7, 3);
        publisher.publish(1, ["a", "b", "c", "d", "e"].map(cluster));
        for (after, says) in [
            (EventId { epoch: 6, seq: 1 }, "another gateway process"),
            (EventId { epoch: 7, seq: 99 }, "ahead of the latest"),
            (EventId { epoch: 7, seq: 1 }, "no longer kept"),
        ] {
            let mut watcher = hub.subscribe(Some(after), wake.clone());
            let gap = next(&mut watcher).await.unwrap().unwrap_err();
            assert!(gap.reason.contains(says), "{after}: {}", gap.reason);
            assert_eq!(watcher.cursor().seq, 5, "goes on from the latest event");
        }
        // The oldest kept is 3: resuming after 2 loses nothing.
        let mut watcher = hub.subscribe(Some(EventId { epoch: 7, seq: 2 }), wake);
        assert_eq!(name(&next(&mut watcher).await.unwrap().unwrap()), "c");
    }

    #[tokio::test]
    async fn a_watcher_that_falls_behind_the_ring_gets_a_gap_not_a_silent_hole() {
        let (hub, publisher, wake) = Hub::new(7, 4);
        let mut watcher = hub.subscribe(None, wake);
        publisher.publish(1, ["a", "b", "c", "d", "e", "f"].map(cluster));
        let gap = next(&mut watcher).await.unwrap().unwrap_err();
        assert!(gap.reason.contains("fell more than 4 events behind"), "{}", gap.reason);
        publisher.publish(2, [cluster("g")]);
        assert_eq!(name(&next(&mut watcher).await.unwrap().unwrap()), "g");
    }

    #[tokio::test]
    async fn subscriptions_end_after_the_last_event_once_the_publisher_is_gone() {
        let (hub, publisher, wake) = Hub::new(7, 100);
        let mut watcher = hub.subscribe(None, wake);
        publisher.publish(1, [cluster("last")]);
        drop(publisher);
        assert_eq!(name(&next(&mut watcher).await.unwrap().unwrap()), "last");
        assert!(next(&mut watcher).await.is_none());
    }
}
