//! The agent's lease on the gateway's jobs: how long it may keep running them without hearing
//! from the gateway.
//!
//! The welcome grants a lease counted from the moment the agent sent its hello; each
//! `Lease { heartbeat_seq, lease }` renews it, counted from the moment the agent *sent* heartbeat
//! `heartbeat_seq`. The gateway heard that heartbeat no earlier than it was sent, and it places
//! the jobs elsewhere only after `lease` (plus a margin) from when it last heard the agent, so
//! the agent's deadline always comes first, even when the network drops only one direction.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// How many recent heartbeats' send instants are remembered. A renewal answering an older one
/// is ignored (the next renewal will do).
const REMEMBERED_HEARTBEATS: usize = 1024;

/// The lease and the send instants it is counted from.
#[derive(Debug)]
pub(crate) struct Lease {
    /// Send instant of recent heartbeats, by sequence number.
    sent: BTreeMap<u64, Instant>,
    state: State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No lease: before the first welcome, or the gateway grants none. Nothing is ever stopped.
    Unlimited,
    /// Valid until `deadline`.
    Until {
        /// When the jobs must be stopped.
        deadline: Instant,
        /// The lease length granted last (for messages).
        length: Duration,
        /// The heartbeat the last renewal answered (None: the welcome).
        renewed_by: Option<u64>,
    },
    /// Ran out after `length` without renewal; only a new welcome grants a new one.
    Expired {
        /// The lease length that ran out.
        length: Duration,
    },
}

/// What became of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The lease now runs until this instant (None: unlimited).
    Applied(Option<Instant>),
    /// It answers a heartbeat this process never sent or no longer remembers.
    UnknownHeartbeat,
    /// It answers an older heartbeat than a renewal already applied.
    Outdated,
    /// The lease has expired; only a welcome grants a new one.
    Expired,
}

impl Lease {
    /// No lease yet.
    pub(crate) fn new() -> Self {
        Self { sent: BTreeMap::new(), state: State::Unlimited }
    }

    /// Remembers when heartbeat `seq` was sent.
    pub(crate) fn heartbeat_sent(&mut self, seq: u64, at: Instant) {
        self.sent.insert(seq, at);
        while self.sent.len() > REMEMBERED_HEARTBEATS {
            self.sent.pop_first();
        }
    }

    /// A welcome: `lease` counts from `hello_sent` (None or zero: no lease). Ends an expiry.
    pub(crate) fn welcome(&mut self, lease: Option<Duration>, hello_sent: Instant) {
        self.state = match lease.filter(|l| !l.is_zero()) {
            Some(length) => match hello_sent.checked_add(length) {
                Some(deadline) => State::Until { deadline, length, renewed_by: None },
                None => State::Unlimited,
            },
            None => State::Unlimited,
        };
    }

    /// A renewal answering heartbeat `seq`: the lease runs `length` from that heartbeat's send
    /// instant (zero: no lease).
    pub(crate) fn renew(&mut self, seq: u64, length: Duration) -> Renewal {
        match self.state {
            State::Expired { .. } => return Renewal::Expired,
            State::Until { renewed_by: Some(last), .. } if seq < last => return Renewal::Outdated,
            _ => {}
        }
        let Some(&sent) = self.sent.get(&seq) else { return Renewal::UnknownHeartbeat };
        if length.is_zero() {
            self.state = State::Unlimited;
            return Renewal::Applied(None);
        }
        self.state = match sent.checked_add(length) {
            Some(deadline) => State::Until { deadline, length, renewed_by: Some(seq) },
            None => State::Unlimited,
        };
        Renewal::Applied(self.deadline())
    }

    /// When the held jobs must be stopped, if ever.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.state {
            State::Until { deadline, .. } => Some(deadline),
            State::Unlimited | State::Expired { .. } => None,
        }
    }

    /// Marks the lease run out; returns its length. Unlimited leases never expire (returns None).
    pub(crate) fn expire(&mut self) -> Option<Duration> {
        let State::Until { length, .. } = self.state else { return None };
        self.state = State::Expired { length };
        Some(length)
    }

    /// Whether the lease ran out and no welcome has come since.
    pub(crate) fn is_expired(&self) -> bool {
        matches!(self.state, State::Expired { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_counts_from_when_the_answered_heartbeat_was_sent() {
        let t0 = Instant::now();
        let mut lease = Lease::new();
        lease.welcome(Some(secs(60)), t0);
        assert_eq!(lease.deadline(), Some(t0 + secs(60)));
        lease.heartbeat_sent(1, t0 + secs(2));
        lease.heartbeat_sent(2, t0 + secs(4));
        // The answer to heartbeat 1 may arrive late; it still counts from t0 + 2 s.
        assert_eq!(lease.renew(1, secs(60)), Renewal::Applied(Some(t0 + secs(62))));
        assert_eq!(lease.renew(2, secs(60)), Renewal::Applied(Some(t0 + secs(64))));
        assert_eq!(lease.renew(1, secs(60)), Renewal::Outdated);
        assert_eq!(lease.renew(9, secs(60)), Renewal::UnknownHeartbeat);
        assert_eq!(lease.deadline(), Some(t0 + secs(64)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_lease_is_renewed_only_by_a_welcome() {
        let t0 = Instant::now();
        let mut lease = Lease::new();
        lease.welcome(Some(secs(60)), t0);
        lease.heartbeat_sent(1, t0 + secs(2));
        assert_eq!(lease.expire(), Some(secs(60)));
        assert!(lease.is_expired());
        assert_eq!(lease.deadline(), None);
        assert_eq!(lease.renew(1, secs(60)), Renewal::Expired);
        lease.welcome(Some(secs(60)), t0 + secs(100));
        assert!(!lease.is_expired());
        assert_eq!(lease.deadline(), Some(t0 + secs(160)));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_lease_nothing_expires() {
        let mut lease = Lease::new();
        assert_eq!(lease.deadline(), None);
        assert_eq!(lease.expire(), None);
        lease.welcome(None, Instant::now());
        assert_eq!(lease.deadline(), None);
        assert!(!lease.is_expired());
    }

    #[tokio::test(start_paused = true)]
    async fn only_recent_heartbeats_are_remembered() {
        let t0 = Instant::now();
        let mut lease = Lease::new();
        for seq in 1..=(REMEMBERED_HEARTBEATS as u64 + 10) {
            lease.heartbeat_sent(seq, t0);
        }
        assert_eq!(lease.renew(1, secs(60)), Renewal::UnknownHeartbeat);
        assert_eq!(lease.renew(REMEMBERED_HEARTBEATS as u64 + 10, secs(60)), Renewal::Applied(Some(t0 + secs(60))));
    }
}
