//! The epoch gate: the agent acts only on the newest leader it has heard of.
//!
//! Gateways that share a store elect a leader; each leader's epoch (its election revision) is
//! higher than every earlier one, and every message a gateway sends carries its epoch. A message
//! with an epoch older than the newest this agent has seen comes from a deposed leader (one that
//! has not yet noticed, or whose words were delayed): acting on it could start a job the new
//! leader placed elsewhere, or stop one it keeps here. The gate belongs to the agent, not to a
//! stream, so it holds across reconnects.

/// Admits messages whose epoch is at least the newest seen, and remembers the newest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EpochGate {
    newest: u64,
}

impl EpochGate {
    /// Whether a message of `epoch` may be acted on; an admitted epoch becomes the newest when
    /// it is newer.
    pub(crate) fn admit(&mut self, epoch: u64) -> bool {
        if epoch < self.newest {
            return false;
        }
        self.newest = epoch;
        true
    }

    /// The newest epoch admitted so far (0 before any, and with gateways without election).
    pub(crate) fn newest(&self) -> u64 {
        self.newest
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn equal_and_newer_epochs_pass_and_older_ones_do_not() {
        let mut gate = EpochGate::default();
        assert!(gate.admit(0), "a gateway without election sends epoch 0");
        assert!(gate.admit(7));
        assert!(gate.admit(7), "the same leader keeps talking");
        assert!(!gate.admit(6));
        assert!(!gate.admit(0));
        assert_eq!(gate.newest(), 7, "a refused epoch changes nothing");
        assert!(gate.admit(9));
        assert_eq!(gate.newest(), 9);
    }

    proptest! {
        #[test]
        fn the_gate_admits_exactly_the_epochs_at_or_above_the_running_maximum(
            epochs in prop::collection::vec(0u64..6, 0..40)
        ) {
            let mut gate = EpochGate::default();
            let mut newest = 0;
            for epoch in epochs {
                prop_assert_eq!(gate.admit(epoch), epoch >= newest);
                newest = newest.max(epoch);
                prop_assert_eq!(gate.newest(), newest);
            }
        }
    }
}
