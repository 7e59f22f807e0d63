//! What a REST client may hold and how fast it may ask: the accounting of open connections in
//! total and per client address, under the `limits:` section of the gateway config
//! ([`LimitsConfig`], kept with the rest of the config in `config/limits.rs`).
//!
//! Connections are admitted in two classes. Up to `maxConnections` (and `maxConnectionsPerClient`
//! per address) are served normally. Past either cap a connection may take one of a few
//! `reserveConnections` slots, where only `GET /healthz` is served and everything else gets the
//! JSON 503 (gateway full) or 429 (this client full); a reserve connection answers one request and
//! lives at most `reserveTimeout`, so slow clients cannot sit on the reserve. Past the reserve the
//! connection is closed at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

pub use crate::config::limits::LimitsConfig;

/// The longest request target (path and query) served; longer ones get the JSON 414.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// The largest request head (request line and headers, up to and including the blank line)
/// served; a larger one is answered by hyper itself (an empty 431) and the connection closed.
/// Also the most hyper buffers while reading one. Above [`MAX_URI_BYTES`] so that a long URI
/// reaches the gateway and gets the JSON 414.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Why a connection was put in the reserve rather than served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The gateway serves `maxConnections` already.
    GatewayFull,
    /// This client address holds `maxConnectionsPerClient` already.
    ClientFull,
}

/// What an accepted connection may do.
#[derive(Debug)]
pub enum Admission {
    /// Served normally; the slot is released when it drops.
    Serve(Slot),
    /// Only `/healthz`; anything else is refused for the reason given.
    Reserve(Slot, Refusal),
    /// No slot at all: close the connection.
    Refuse(Refusal),
}

/// Counts of open connections, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Served normally.
    pub served: usize,
    /// In the reserve.
    pub reserve: usize,
}

/// Open REST connections in total and per client address.
#[derive(Debug)]
pub struct ConnectionTracker {
    max_connections: usize,
    max_per_client: usize,
    reserve: usize,
    reserve_per_client: usize,
    state: Mutex<TrackerState>,
}

/// A connection's place in the counts; dropping it gives the place back.
#[derive(Debug)]
pub struct Slot {
    tracker: Arc<ConnectionTracker>,
    client: IpAddr,
    reserve: bool,
}

#[derive(Debug, Default)]
struct TrackerState {
    counts: ConnectionCounts,
    clients: HashMap<IpAddr, ConnectionCounts>,
}

impl ConnectionTracker {
    /// A tracker enforcing `limits`.
    pub fn new(limits: &LimitsConfig) -> Arc<Self> {
        Arc::new(Self {
            max_connections: limits.max_connections,
            max_per_client: limits.max_connections_per_client,
            reserve: limits.reserve_connections,
            reserve_per_client: limits.reserve_per_client(),
            state: Mutex::new(TrackerState::default()),
        })
    }

    /// Decides what a new connection from `client` may do, and counts it.
    pub fn admit(self: &Arc<Self>, client: IpAddr) -> Admission {
        let mut state = self.lock();
        let TrackerState { counts, clients } = &mut *state;
        let mine = clients.entry(client).or_default();
        let refusal = if counts.served >= self.max_connections {
            Refusal::GatewayFull
        } else if mine.served >= self.max_per_client {
            Refusal::ClientFull
        } else {
            counts.served += 1;
            mine.served += 1;
            return Admission::Serve(Slot { tracker: Arc::clone(self), client, reserve: false });
        };
        if counts.reserve < self.reserve && mine.reserve < self.reserve_per_client {
            counts.reserve += 1;
            mine.reserve += 1;
            return Admission::Reserve(Slot { tracker: Arc::clone(self), client, reserve: true }, refusal);
        }
        if *mine == ConnectionCounts::default() {
            clients.remove(&client);
        }
        Admission::Refuse(refusal)
    }

    /// Open connections now.
    pub fn counts(&self) -> ConnectionCounts {
        self.lock().counts
    }

    fn release(&self, client: IpAddr, reserve: bool) {
        let mut state = self.lock();
        let TrackerState { counts, clients } = &mut *state;
        let (total, mine) = match clients.get_mut(&client) {
            Some(mine) if reserve => (&mut counts.reserve, mine),
            Some(mine) => (&mut counts.served, mine),
            None => return,
        };
        *total = total.saturating_sub(1);
        let count = if reserve { &mut mine.reserve } else { &mut mine.served };
        *count = count.saturating_sub(1);
        if *mine == ConnectionCounts::default() {
            clients.remove(&client);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TrackerState> {
        // The state is plain counters, consistent after every statement: a panic elsewhere while
        // holding the lock leaves nothing half-done.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.tracker.release(self.client, self.reserve);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use meridian_proto::duration::HumanDuration;

    use super::*;

    fn limits(total: usize, per_client: usize, reserve: usize) -> LimitsConfig {
        LimitsConfig {
            max_connections: total,
            max_connections_per_client: per_client,
            reserve_connections: reserve,
            ..LimitsConfig::default()
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn past_the_total_cap_connections_go_to_the_reserve_then_are_refused() {
        let tracker = ConnectionTracker::new(&limits(2, 2, 2));
        let served: Vec<_> = (0..2).map(|i| tracker.admit(ip(i))).collect();
        assert!(served.iter().all(|a| matches!(a, Admission::Serve(_))));
        let reserve = [tracker.admit(ip(2)), tracker.admit(ip(3))];
        assert!(reserve.iter().all(|a| matches!(a, Admission::Reserve(_, Refusal::GatewayFull))), "{reserve:?}");
        assert!(matches!(tracker.admit(ip(4)), Admission::Refuse(Refusal::GatewayFull)));
        assert_eq!(tracker.counts(), ConnectionCounts { served: 2, reserve: 2 });

        drop(served);
        assert_eq!(tracker.counts(), ConnectionCounts { served: 0, reserve: 2 });
        assert!(matches!(tracker.admit(ip(4)), Admission::Serve(_)));
    }

    #[test]
    fn a_client_at_its_own_cap_is_refused_while_others_are_served() {
        let tracker = ConnectionTracker::new(&limits(10, 2, 8));
        let _mine = [tracker.admit(ip(1)), tracker.admit(ip(1))];
        assert!(matches!(tracker.admit(ip(1)), Admission::Reserve(_, Refusal::ClientFull)));
        assert!(matches!(tracker.admit(ip(2)), Admission::Serve(_)));
    }

    #[test]
    fn one_client_cannot_take_the_whole_reserve() {
        let tracker = ConnectionTracker::new(&limits(1, 1, 8));
        let _served = tracker.admit(ip(1));
        // A quarter of the reserve (2 of 8) per address; the rest stays for other clients.
        let held: Vec<_> = (0..2).map(|_| tracker.admit(ip(1))).collect();
        assert!(held.iter().all(|a| matches!(a, Admission::Reserve(..))));
        assert!(matches!(tracker.admit(ip(1)), Admission::Refuse(_)));
        assert!(matches!(tracker.admit(ip(2)), Admission::Reserve(_, Refusal::GatewayFull)));
    }

    #[test]
    fn released_clients_are_forgotten() {
        let tracker = ConnectionTracker::new(&limits(4, 4, 4));
        let admitted: Vec<_> = (0..50).map(|i| tracker.admit(ip(i))).collect();
        drop(admitted);
        assert_eq!(tracker.counts(), ConnectionCounts::default());
        assert!(tracker.lock().clients.is_empty());
    }

    #[test]
    fn every_bad_limit_is_named() {
        let bad = LimitsConfig {
            max_connections: 0,
            max_connections_per_client: 5,
            body_read_timeout: HumanDuration::from_secs(0),
            requests_per_second: f64::NAN,
            request_burst: 0,
            ..LimitsConfig::default()
        };
        let problems = bad.problems("limits.");
        for field in [
            "limits.maxConnections:",
            "limits.maxConnectionsPerClient:",
            "limits.bodyReadTimeout:",
            "limits.requestsPerSecond:",
            "limits.requestBurst:",
        ] {
            assert!(problems.iter().any(|p| p.starts_with(field)), "{field} missing from {problems:?}");
        }
        assert!(LimitsConfig::default().problems("limits.").is_empty());
    }
}
