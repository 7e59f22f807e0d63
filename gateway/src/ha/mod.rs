//! Several gateways on etcd, one leader (built with feature `etcd`).
//!
//! Every gateway campaigns in an etcd election. While it waits it is a **standby**: it follows
//! the store into a read view ([`follower`]) and refuses writes and agents with the leader's
//! address. The winner runs a **leader term**: it loads the state from etcd through a store
//! handle whose every commit is guarded by its election key, rewrites values sealed with an
//! old secrets key, and runs the runtime with a [`Fence`] that carries its epoch (the election
//! key's revision) and turns false before its lease can expire. A term ends when the fence
//! turns false (the lease could not be renewed: a cut from etcd, a pause), when a commit fails,
//! or at shutdown (the leader then resigns, so another takes over at once). After a term the
//! gateway is a standby again and campaigns anew.
//!
//! See `docs/operations.md#high-availability` for what clients and agents see in each failure.

pub mod follower;

use std::sync::Arc;
use std::time::Duration;

use meridian_store::etcd::{EtcdStore, Leader, Leadership};
use meridian_store::{KeyRing, SealedStore};
use tokio::sync::watch;

use crate::config::GatewayConfig;
use crate::runtime::now_ms;
use crate::runtime::{Fence, Handle, LeaderAddrs, Runtime, TermEnd};
use crate::server::{BoundAddrs, ServeError};
use meridian_core::{Core, Loaded};
use std::future::Future;

/// What an elected gateway needs beyond its configuration.
pub struct Elected {
    /// The etcd store (unguarded; each term guards its own handle).
    pub store: EtcdStore,
    /// The key that seals stored values.
    pub keys: Arc<KeyRing>,
}

/// The election's name under the store prefix.
const ELECTION: &str = "leader";

/// How long to wait before campaigning again after etcd refused or could not be reached.
const RETRY: Duration = Duration::from_millis(500);

/// Serves as one of several gateways on etcd: binds both listeners, answers reads as a standby
/// from a view it follows from etcd, and campaigns; while elected it runs leader terms (see
/// this module).
pub async fn serve_elected(
    config: GatewayConfig,
    elected: Elected,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_bound: impl FnOnce(BoundAddrs, Handle),
) -> Result<(), ServeError> {
    let prepared = crate::server::Prepared::new(&config)?;
    let empty = Core::follower(config.core_config(), Loaded::default(), now_ms()).view();
    let handle = Handle::new(config.runtime_config(), empty);
    let ha_config = config.clone();
    let terms = move |handle: Handle, addrs: BoundAddrs, stop: watch::Receiver<bool>| {
        run(ha_config, elected, handle, addrs, stop)
    };
    crate::server::serve_with(config, prepared, handle, terms, shutdown, on_bound).await
}

/// Runs standby phases and leader terms until `stop` flips.
pub(crate) async fn run(
    config: GatewayConfig,
    elected: Elected,
    handle: Handle,
    addrs: BoundAddrs,
    mut stop: watch::Receiver<bool>,
) {
    let me = advertised(&config, addrs);
    let value = match serde_json::to_vec(&me) {
        Ok(value) => value,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode this gateway's address for the election");
            return;
        }
    };
    let election = match elected.store.election(ELECTION, config.ha.lease_ttl.0, config.ha.step_down_margin.0) {
        Ok(election) => election,
        Err(e) => {
            tracing::error!(error = %e, "cannot take part in the election");
            return;
        }
    };
    let observer = tokio::spawn(observe(election.observe(), handle.clone(), stop.clone()));
    loop {
        // A standby: follow the store into the read view while campaigning.
        let (follower_stop, follower_stopped) = watch::channel(false);
        let follower = tokio::spawn(follower::run(
            elected.store.clone(),
            Arc::clone(&elected.keys),
            config.core_config(),
            handle.clone(),
            follower_stopped,
        ));
        let campaign = tokio::select! {
            result = election.campaign(value.clone()) => Some(result),
            _ = stop.wait_for(|s| *s) => None,
        };
        let _ = follower_stop.send(true);
        if let Err(e) = follower.await {
            tracing::error!(error = %e, "the standby's follower ended abnormally");
        }
        let leadership = match campaign {
            None => break,
            Some(Ok(leadership)) => Arc::new(leadership),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "campaign failed; trying again");
                if sleep_or_stop(RETRY, &mut stop).await {
                    break;
                }
                continue;
            }
        };
        tracing::info!(epoch = leadership.epoch(), name = %me.name, "elected leader; loading the state");
        let end = lead(&config, &elected, &handle, &leadership, &mut stop).await;
        let epoch = leadership.epoch();
        match Arc::try_unwrap(leadership) {
            // Resigning lets another gateway take over at once instead of after the lease.
            Ok(leadership) => leadership.resign().await,
            Err(_) => tracing::warn!(epoch, "the leadership is still shared; letting its lease run out"),
        }
        if end == TermEnd::Shutdown || *stop.borrow() {
            break;
        }
    }
    observer.abort();
}

/// One leader term: load, reseal, run the runtime until the fence lapses, a commit fails or
/// shutdown.
async fn lead(
    config: &GatewayConfig,
    elected: &Elected,
    handle: &Handle,
    leadership: &Arc<Leadership>,
    stop: &mut watch::Receiver<bool>,
) -> TermEnd {
    let epoch = leadership.epoch();
    let store = SealedStore::new(elected.store.with_guard(leadership.guard()), Arc::clone(&elected.keys));
    let started = std::time::Instant::now();
    // One read of the whole state: opened for the core, and checked for values sealed with an
    // older key (rewritten only when there are some, which is rare: after a key rotation).
    let core = match load_sealed(config, &store).await {
        Ok((core, 0)) => core,
        Ok((core, _stale)) => match store.reseal().await {
            Ok(n) => {
                tracing::info!(
                    epoch,
                    values = n,
                    key = store.keys().primary_id(),
                    "resealed values with the primary key"
                );
                core
            }
            Err(e) => {
                tracing::error!(epoch, error = %e, "resealing stored values failed; stepping down");
                return TermEnd::StoreFailed(e.to_string());
            }
        },
        Err(e) => {
            tracing::error!(epoch, error = %e, "the new leader cannot load the state; stepping down");
            return TermEnd::StoreFailed(e.to_string());
        }
    };
    tracing::info!(
        epoch,
        jobs = core.job_count(),
        active = core.active_count(),
        took_ms = started.elapsed().as_millis() as u64,
        "leading"
    );
    // Held weakly: agent streams end a moment after the runtime, and their copies of the fence
    // must not keep the leadership shared, or the term could not resign (a clean shutdown would
    // then leave the next leader waiting out the lease).
    let valid = {
        let leadership = Arc::downgrade(leadership);
        Arc::new(move || leadership.upgrade().is_some_and(|leadership| leadership.is_valid()))
    };
    let (term_stop, term_stopped) = watch::channel(false);
    let runtime = Runtime::start_term(
        core,
        Arc::new(store),
        handle,
        Fence::elected(epoch, valid, leadership.lost()),
        true,
        term_stopped,
    );
    let mut joined = std::pin::pin!(runtime.join());
    let mut lost = leadership.lost();
    let end = tokio::select! {
        end = &mut joined => {
            tracing::info!(epoch, reason = ?end, "leader term ended");
            return end;
        }
        _ = lost.wait_for(|lost| *lost) => TermEnd::LostLeadership,
        _ = stop.wait_for(|s| *s) => TermEnd::Shutdown,
    };
    if end == TermEnd::LostLeadership {
        // The fence turned false when the leadership was lost: from that moment this gateway
        // sends nothing, whatever its runtime still finishes (a commit to an unreachable etcd
        // waits out requestTimeout, and etcd refuses it by the guard if it ever arrives).
        let lost = leadership.lost_reason().unwrap_or_default();
        tracing::info!(epoch, reason = ?end, %lost, "leader term ended");
    }
    let _ = term_stop.send(true);
    let stopped = joined.await;
    match end {
        TermEnd::LostLeadership => tracing::info!(epoch, runtime = ?stopped, "the ended term's runtime stopped"),
        _ => tracing::info!(epoch, reason = ?end, "leader term ended"),
    }
    end
}

/// The core from the sealed store's state, read once, and how many values need resealing.
async fn load_sealed(config: &GatewayConfig, store: &SealedStore<EtcdStore>) -> Result<(Core, usize), ServeError> {
    let described = meridian_store::Store::describe(store);
    let failed = |source| ServeError::Store { store: described.clone(), source };
    let raw = meridian_store::Store::scan(store.inner(), "").await.map_err(failed)?;
    let keys = store.keys();
    let stale = raw.iter().filter(|(_, value)| keys.needs_reseal(value)).count();
    let mut entries = Vec::with_capacity(raw.len());
    for (key, value) in raw {
        let opened = keys.open(&key, &value).map_err(failed)?;
        entries.push((key, opened));
    }
    Ok((crate::server::load_entries(config, entries, &described)?, stale))
}

/// Keeps the standby's idea of the leader current.
async fn observe(mut leaders: watch::Receiver<Option<Leader>>, handle: Handle, mut stop: watch::Receiver<bool>) {
    loop {
        let leader = leaders.borrow_and_update().clone();
        let addrs = leader.and_then(|leader| serde_json::from_slice::<LeaderAddrs>(&leader.value).ok());
        handle.set_standby_leader(addrs);
        tokio::select! {
            changed = leaders.changed() => if changed.is_err() { break },
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

/// Sleeps `pause`; true when `stop` flipped meanwhile.
async fn sleep_or_stop(pause: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(pause) => {}
        _ = stop.wait_for(|s| *s) => return true,
    }
    *stop.borrow()
}

/// This gateway's name and addresses, as the leader advertises them.
fn advertised(config: &GatewayConfig, addrs: BoundAddrs) -> LeaderAddrs {
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let name =
        config.ha.name.clone().unwrap_or_else(|| rustix::system::uname().nodename().to_string_lossy().into_owned());
    LeaderAddrs {
        rest: config.ha.advertise_rest.clone().unwrap_or_else(|| format!("{scheme}://{}", addrs.rest)),
        grpc: config.ha.advertise_grpc.clone().unwrap_or_else(|| format!("{scheme}://{}", addrs.grpc)),
        name,
    }
}
