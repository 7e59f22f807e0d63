//! [`Election`]: one leader among the gateways, with etcd's election API.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{GetOptions, LeaderKey, SortOrder, SortTarget, WatchOptions};
use tokio::sync::watch;

use super::leadership::{Leadership, LeaseKeeper};
use super::prefix_end;
use super::shared::{Shared, never_sent};
use crate::error::Result;

/// The longest election name, so that a guard's compare fits the framing that
/// [`Store::limits`](crate::Store::limits) reserves.
pub(crate) const MAX_ELECTION_NAME_BYTES: usize = 128;

/// The shortest lease: etcd grants at least `1.5 × election timeout` (1.5 s with default flags)
/// whatever is asked, and a shorter TTL leaves no time to renew.
const MIN_TTL: Duration = Duration::from_secs(2);

/// How long to wait before resending a campaign that could not connect.
const CAMPAIGN_RESEND_DELAY: Duration = Duration::from_millis(50);

/// How long the observer waits before reading again after etcd failed, at first and at most.
const OBSERVE_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(2));

/// An election among gateways sharing one etcd prefix: [`campaign`](Election::campaign) blocks
/// until this gateway leads; [`leader`](Election::leader) and [`observe`](Election::observe) say
/// who leads.
///
/// Each campaigner holds a lease of `ttl` and an entry `<prefix>election/<name>/<lease id>`; the
/// entry with the lowest create revision leads. See the [module](super) for when a leader must
/// stop (`step_down_margin` before its lease could expire).
#[derive(Clone)]
pub struct Election {
    shared: Arc<Shared>,
    /// `<prefix>election/<name>`: etcd's election name; entries are under it plus `/`.
    name: Vec<u8>,
    ttl: Duration,
    step_down_margin: Duration,
}

/// Who leads an election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// What the leader campaigned with (e.g. its address).
    pub value: Vec<u8>,
    /// The leader entry's create revision: it grows with every new term.
    pub epoch: u64,
}

/// Why [`EtcdStore::election`](super::EtcdStore::election) refused its arguments.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ElectionConfigError {
    /// The name is empty, too long, or holds a `/`.
    #[error("election name {name:?}: give 1 to {MAX_ELECTION_NAME_BYTES} bytes without '/' (e.g. \"gateway\")")]
    InvalidName {
        /// The name given.
        name: String,
    },
    /// The TTL is under 2 s or not a whole number of seconds (etcd's leases count seconds).
    #[error("election ttl {ttl:?}: give a whole number of seconds, at least 2 s (e.g. 10 s)")]
    InvalidTtl {
        /// The TTL given.
        ttl: Duration,
    },
    /// The margin leaves a leader less than half its TTL.
    #[error(
        "election step_down_margin {margin:?}: must be less than half the ttl ({ttl:?}), e.g. ttl 10 s with a margin of 2 s"
    )]
    MarginTooLarge {
        /// The margin given.
        margin: Duration,
        /// The TTL given.
        ttl: Duration,
    },
}

impl Election {
    pub(crate) fn new(
        shared: Arc<Shared>,
        name: &str,
        ttl: Duration,
        step_down_margin: Duration,
    ) -> Result<Election, ElectionConfigError> {
        if name.is_empty() || name.len() > MAX_ELECTION_NAME_BYTES || name.contains('/') {
            return Err(ElectionConfigError::InvalidName { name: name.to_string() });
        }
        if ttl < MIN_TTL || ttl.subsec_nanos() != 0 {
            return Err(ElectionConfigError::InvalidTtl { ttl });
        }
        if step_down_margin >= ttl / 2 {
            return Err(ElectionConfigError::MarginTooLarge { margin: step_down_margin, ttl });
        }
        let name = shared.election_key(name);
        Ok(Election { shared, name, ttl, step_down_margin })
    }

    /// Campaigns with `value` (what [`Leader::value`] will say) and returns once this gateway
    /// leads.
    ///
    /// It grants a lease of `ttl` and keeps it alive while waiting, so it may wait for as long as
    /// another gateway leads. It fails with [`Error::Etcd`](crate::Error::Etcd) when etcd cannot
    /// be reached, or when the lease could not be kept alive while waiting (then try again).
    /// Dropping the future withdraws the candidacy (etcd removes the entry; the lease expires
    /// within `ttl`).
    pub async fn campaign(&self, value: Vec<u8>) -> Result<Leadership> {
        let shared = &self.shared;
        let ttl_seconds = i64::try_from(self.ttl.as_secs()).unwrap_or(i64::MAX);
        let sent = Instant::now();
        let grant = shared.request("campaign: granting a lease", || {
            let mut lease = shared.lease();
            async move { lease.grant(ttl_seconds, None).await }
        });
        let grant = grant.await?;
        if grant.ttl() < ttl_seconds {
            return Err(
                shared.error(format!("campaign: etcd granted a lease of {} s, not {ttl_seconds} s", grant.ttl()))
            );
        }
        let keeper = LeaseKeeper::start(Arc::clone(shared), grant.id(), self.ttl, self.step_down_margin, sent);
        match self.win(&keeper, grant.id(), value).await {
            Ok((key, create_revision, leader_key)) => {
                Ok(Leadership::new(Arc::clone(shared), keeper, key, create_revision, leader_key))
            }
            Err(error) => {
                keeper.release(shared).await;
                Err(error)
            }
        }
    }

    /// Campaigns with the lease `keeper` keeps alive; returns the election key, its create
    /// revision and etcd's handle on it.
    async fn win(&self, keeper: &LeaseKeeper, lease_id: i64, value: Vec<u8>) -> Result<(Vec<u8>, i64, LeaderKey)> {
        let shared = &self.shared;
        let mut lost = keeper.lost();
        let mut election = shared.client.election_client();
        let won = loop {
            tokio::select! {
                won = election.campaign(self.name.clone(), value.clone(), lease_id) => match won {
                    // Not sent (the member it picked is down): resending cannot campaign twice.
                    Err(error) if never_sent(&error) => tokio::time::sleep(CAMPAIGN_RESEND_DELAY).await,
                    won => break won.map_err(|error| shared.error(format!("campaign: {error}")))?,
                },
                () = wait_lost(&mut lost) => {
                    return Err(shared.error(format!("campaign: {}; campaign again", keeper.reason())));
                }
            }
        };
        let Some(leader_key) = won.leader().cloned() else {
            return Err(shared.error("campaign: etcd answered without the leader key"));
        };
        let key = leader_key.key().to_vec();
        let create_revision = leader_key.rev();
        // etcd 3.4 answers a campaign once the earlier entries are gone, without checking that
        // ours survived the wait: check that it exists and is still the one we created.
        let mut check = shared.get("campaign: reading the election key", key.clone(), None).await?;
        let ours =
            check.kvs().first().is_some_and(|kv| kv.create_revision() == create_revision && kv.lease() == lease_id);
        if !ours {
            return Err(shared.error(format!(
                "campaign: the election key {} vanished while campaigning (its lease expired); campaign again",
                String::from_utf8_lossy(&key)
            )));
        }
        let Some(header) = check.take_header() else {
            return Err(shared.error("campaign: etcd answered without a revision"));
        };
        keeper.watch_key(key.clone(), create_revision, header.revision() + 1);
        Ok((key, create_revision, leader_key))
    }

    /// Who leads now (a linearizable read), or `None` when nobody does.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(read_leader(&self.shared, &self.name).await?.0)
    }

    /// Who leads, kept current by a background task that watches the election (and reads it
    /// again, after a short backoff, when etcd fails). `None` when nobody leads, and until the
    /// first read; while etcd cannot be reached it keeps the last value read. For information
    /// only: a gateway acts as leader on its own [`Leadership`], never on this. The task ends
    /// when the last receiver is dropped.
    pub fn observe(&self) -> watch::Receiver<Option<Leader>> {
        let (sender, receiver) = watch::channel(None);
        let shared = Arc::clone(&self.shared);
        let name = self.name.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = sender.closed() => {}
                () = observe_leader(&shared, &name, &sender) => {}
            }
        });
        receiver
    }
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &String::from_utf8_lossy(&self.name))
            .field("ttl", &self.ttl)
            .field("step_down_margin", &self.step_down_margin)
            .finish()
    }
}

/// Returns once `lost` is `true` (or its sender is gone, which also means lost).
async fn wait_lost(lost: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`: drop it at once.
    let _ = lost.wait_for(|lost| *lost).await.map(drop);
}

/// The entries' prefix: etcd puts each candidate at `<name>/<lease id in hex>`.
fn entries_prefix(name: &[u8]) -> Vec<u8> {
    [name, b"/"].concat()
}

/// The leader (the entry with the lowest create revision) and the revision it was read at.
async fn read_leader(shared: &Shared, name: &[u8]) -> Result<(Option<Leader>, i64)> {
    let prefix = entries_prefix(name);
    let options = GetOptions::new()
        .with_range(prefix_end(&prefix))
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let mut answer = shared.get("reading the election leader", prefix, Some(options)).await?;
    let Some(revision) = answer.header().map(|header| header.revision()) else {
        return Err(shared.error("reading the election leader: etcd answered without a revision"));
    };
    let leader = answer.take_kvs().into_iter().next().map(|kv| Leader {
        epoch: u64::try_from(kv.create_revision()).unwrap_or_default(),
        value: kv.into_key_value().1,
    });
    Ok((leader, revision))
}

/// Keeps `sender` current forever, reading again after each failure.
async fn observe_leader(shared: &Shared, name: &[u8], sender: &watch::Sender<Option<Leader>>) {
    let mut backoff = OBSERVE_BACKOFF.0;
    loop {
        let error = follow_leader(shared, name, sender, &mut backoff).await;
        tracing::debug!(%error, "observing the election failed; reading it again in {backoff:?}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(OBSERVE_BACKOFF.1);
    }
}

/// Reads the leader, then again after every change of the election's entries, until etcd fails.
async fn follow_leader(
    shared: &Shared,
    name: &[u8],
    sender: &watch::Sender<Option<Leader>>,
    backoff: &mut Duration,
) -> crate::Error {
    let publish = |leader: Option<Leader>| {
        sender.send_if_modified(|current| {
            let changed = *current != leader;
            *current = leader;
            changed
        });
    };
    let (leader, revision) = match read_leader(shared, name).await {
        Ok(read) => read,
        Err(error) => return error,
    };
    publish(leader);
    let prefix = entries_prefix(name);
    let options = WatchOptions::new().with_range(prefix_end(&prefix)).with_start_revision(revision + 1);
    let mut watch = match shared.start_watch("watching the election", prefix, options).await {
        Ok(watch) => watch,
        Err(error) => return error,
    };
    loop {
        match watch.message().await {
            Ok(Some(response)) if response.canceled() || response.compact_revision() > 0 => {
                return shared.error(format!("the election's watch was cancelled: {}", response.cancel_reason()));
            }
            Ok(Some(response)) if response.events().is_empty() => {}
            Ok(Some(_)) => match read_leader(shared, name).await {
                Ok((leader, _)) => {
                    publish(leader);
                    *backoff = OBSERVE_BACKOFF.0;
                }
                Err(error) => return error,
            },
            Ok(None) => return shared.error("etcd closed the election's watch"),
            Err(error) => return shared.error(format!("the election's watch broke: {error}")),
        }
    }
}
