//! The agent's lease on the gateway's jobs: how long it may keep running them without hearing
//! from the gateway.
//!
//! The welcome grants a lease counted from the moment the agent sent its hello; each
//! `Lease { heartbeat_seq, lease }` renews it, counted from the moment the agent *sent* heartbeat
//! `heartbeat_seq`. The gateway heard that heartbeat no earlier than it was sent, and it places
//! the jobs elsewhere only after `lease` (plus a margin) from when it last heard the agent, so
//! the agent's deadline always comes first, even when the network drops only one direction.
//!
//! Only fresh words count: a renewal must answer a heartbeat this process sent on the stream it
//! arrives on, and neither a welcome nor a renewal whose lease would already have run out by the
//! time it arrives grants anything (it was delayed in the network or while the agent was
//! frozen; the gateway may have placed the jobs elsewhere since).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// How many recent heartbeats' send instants are remembered. A renewal answering an older one
/// is ignored (the next renewal will do).
const REMEMBERED_HEARTBEATS: usize = 1024;

/// The lease and the send instants it is counted from.
#[derive(Debug)]
pub(crate) struct Lease {
    /// Send instant and stream (session) of recent heartbeats, by sequence number.
    sent: BTreeMap<u64, (Instant, u64)>,
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
    /// The lease it grants would already have run out: it arrived too late to count.
    Stale,
    /// The lease has expired; only a welcome grants a new one.
    Expired,
}

impl Lease {
    /// No lease yet.
    pub(crate) fn new() -> Self {
        Self { sent: BTreeMap::new(), state: State::Unlimited }
    }

    /// Remembers when heartbeat `seq` was sent, and on which stream.
    pub(crate) fn heartbeat_sent(&mut self, seq: u64, at: Instant, session: u64) {
        self.sent.insert(seq, (at, session));
        while self.sent.len() > REMEMBERED_HEARTBEATS {
            self.sent.pop_first();
        }
    }

    /// A welcome at `now`: `lease` counts from `hello_sent` (None or zero: no lease). Ends an
    /// expiry. Returns false, changing nothing, when that lease would already have run out: the
    /// welcome is stale.
    pub(crate) fn welcome(&mut self, lease: Option<Duration>, hello_sent: Instant, now: Instant) -> bool {
        let state = match lease.filter(|l| !l.is_zero()) {
            Some(length) => match hello_sent.checked_add(length) {
                Some(deadline) if deadline <= now => return false,
                Some(deadline) => State::Until { deadline, length, renewed_by: None },
                None => State::Unlimited,
            },
            None => State::Unlimited,
        };
        self.state = state;
        true
    }

    /// A renewal at `now` on stream `session`, answering heartbeat `seq`: the lease runs
    /// `length` from that heartbeat's send instant (zero: no lease).
    pub(crate) fn renew(&mut self, seq: u64, length: Duration, session: u64, now: Instant) -> Renewal {
        match self.state {
            State::Expired { .. } => return Renewal::Expired,
            State::Until { renewed_by: Some(last), .. } if seq < last => return Renewal::Outdated,
            _ => {}
        }
        let Some(&(sent, sent_on)) = self.sent.get(&seq) else { return Renewal::UnknownHeartbeat };
        if sent_on != session {
            return Renewal::UnknownHeartbeat;
        }
        if length.is_zero() {
            self.state = State::Unlimited;
            return Renewal::Applied(None);
        }
        self.state = match sent.checked_add(length) {
            Some(deadline) if deadline <= now => return Renewal::Stale,
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

    /// Whether the deadline has passed by `now` (whether or not its timer has fired yet).
    pub(crate) fn is_past(&self, now: Instant) -> bool {
        self.deadline().is_some_and(|deadline| deadline <= now)
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
        assert!(lease.welcome(Some(secs(60)), t0, t0));
        assert_eq!(lease.deadline(), Some(t0 + secs(60)));
        lease.heartbeat_sent(1, t0 + secs(2), 1);
        lease.heartbeat_sent(2, t0 + secs(4), 1);
        // The answer to heartbeat 1 may arrive late; it still counts from t0 + 2 s.
        assert_eq!(lease.renew(1, secs(60), 1, t0 + secs(5)), Renewal::Applied(Some(t0 + secs(62))));
        assert_eq!(lease.renew(2, secs(60), 1, t0 + secs(5)), Renewal::Applied(Some(t0 + secs(64))));
        assert_eq!(lease.renew(1, secs(60), 1, t0 + secs(5)), Renewal::Outdated);
        assert_eq!(lease.renew(9, secs(60), 1, t0 + secs(5)), Renewal::UnknownHeartbeat);
        assert_eq!(lease.deadline(), Some(t0 + secs(64)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_lease_is_renewed_only_by_a_welcome() {
        let t0 = Instant::now();
        let mut lease = Lease::new();
        assert!(lease.welcome(Some(secs(60)), t0, t0));
        lease.heartbeat_sent(1, t0 + secs(2), 1);
        assert_eq!(lease.expire(), Some(secs(60)));
        assert!(lease.is_expired());
        assert_eq!(lease.deadline(), None);
        assert_eq!(lease.renew(1, secs(60), 1, t0 + secs(5)), Renewal::Expired);
        assert!(lease.welcome(Some(secs(60)), t0 + secs(100), t0 + secs(100)));
        assert!(!lease.is_expired());
        assert_eq!(lease.deadline(), Some(t0 + secs(160)));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_lease_nothing_expires() {
        let mut lease = Lease::new();
        assert_eq!(lease.deadline(), None);
        assert_eq!(lease.expire(), None);
        assert!(lease.welcome(None, Instant::now(), Instant::now()));
        assert_eq!(lease.deadline(), None);
        assert!(!lease.is_expired());
    }

    #[tokio::test(start_paused = true)]
    async fn only_recent_heartbeats_are_remembered() {
        let t0 = Instant::now();
        let mut lease = Lease::new();
        for seq in 1..=(REMEMBERED_HEARTBEATS as u64 + 10) {
            lease.heartbeat_sent(seq, t0, 1);
        }
        assert_eq!(lease.renew(1, secs(60), 1, t0), Renewal::UnknownHeartbeat);
        assert_eq!(
            lease.renew(REMEMBERED_HEARTBEATS as u64 + 10, secs(60), 1, t0),
            Renewal::Applied(Some(t0 + secs(60)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_for_a_heartbeat_of_another_stream_is_not_applied() {
        let t0 = Instant::now();
        let mut lease = Lease::new();
        assert!(lease.welcome(Some(secs(60)), t0, t0));
        lease.heartbeat_sent(1, t0 + secs(1), 1);
        lease.heartbeat_sent(2, t0 + secs(2), 2);
        assert_eq!(lease.renew(1, secs(60), 2, t0 + secs(3)), Renewal::UnknownHeartbeat);
        assert_eq!(lease.deadline(), Some(t0 + secs(60)));
        assert_eq!(lease.renew(2, secs(60), 2, t0 + secs(3)), Renewal::Applied(Some(t0 + secs(62))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_welcome_or_renewal_that_arrives_after_its_lease_would_end_grants_nothing() {
        let t0 = Instant::now();
        let mut lease = Lease::new();
        // The hello went out at t0; a 20 s lease from it is over when the welcome comes at 25 s.
        assert!(!lease.welcome(Some(secs(20)), t0, t0 + secs(25)));
        assert_eq!(lease.deadline(), None, "a stale welcome changes nothing");
        assert!(lease.welcome(Some(secs(20)), t0, t0 + secs(5)));
        lease.heartbeat_sent(1, t0 + secs(6), 1);
        // A renewal held back (a frozen agent, a one-way cut) until after what it grants.
        assert_eq!(lease.renew(1, secs(20), 1, t0 + secs(30)), Renewal::Stale);
        assert_eq!(lease.deadline(), Some(t0 + secs(20)));
        assert!(lease.is_past(t0 + secs(30)));
        assert!(!lease.is_past(t0 + secs(19)));
    }
}
