//! The placement policies a replay can run: Meridian's own and the baselines it is measured
//! against, each modelled on what the system it is named after does.

use std::fmt;
use std::str::FromStr;

use super::SimError;

/// A placement policy, as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Policy {
    /// No federation: every job runs on its tenant's home cluster, in that cluster's queue
    /// (the status quo of separate clusters).
    HomeOnly,
    /// Each job goes to the next cluster (in topology order) that could ever run it (a naive
    /// spreader; stands for no particular system).
    RoundRobin,
    /// Each job goes to a cluster drawn uniformly from those that could ever run it (a naive
    /// spreader; stands for no particular system).
    Random,
    /// Karmada's dynamic weighting by available replicas: the cluster where most replicas of
    /// *this* job fit now (its general estimator: per node of an acceptable GPU type and memory,
    /// free GPUs, CPU and memory over the per-replica request, summed; ties: more free acceptable
    /// GPUs, then topology order). Modelled: the estimate at submit and a binding that never
    /// moves. Not modelled: Karmada's rescheduling of unschedulable work (descheduler) and its
    /// splitting of one workload's replicas across clusters (a gang is never split here).
    LeastLoaded,
    /// Kueue MultiKueue with `AllAtOnce` dispatch: a copy of the job queues on every cluster that
    /// could run it; the first cluster that starts it wins and the other copies are withdrawn.
    /// Every copy moves its data as soon as it is made; a withdrawn copy's transfer stops and the
    /// bytes it moved are paid (egress) and counted. Not modelled: the manager's admission check
    /// round trips (copies appear and vanish instantly).
    FirstAdmit,
    /// SkyPilot's optimizer and failover: the cluster where the job costs least (GPU price ×
    /// GPUs × its run time on the cheapest acceptable GPU type there, plus egress for its data).
    /// If the job has not started there within its wait budget — the job's `burst.after`
    /// ([`SimConfig::burst_after_secs`](crate::engine::SimConfig), 30 min by default; SkyPilot's
    /// own Kubernetes provision timeout is far shorter) after reaching the cluster's queue, it is
    /// withdrawn and sent to the next cheapest cluster that could run it, moving its data again;
    /// the last one keeps it. Not modelled: spot instances and SkyPilot's per-zone retries.
    Cheapest,
    /// Data locality first (Volcano/Armada-style affinity to the data's region): a cluster in the
    /// data's region (most replicas of the job that fit now, as `least-loaded`); jobs without
    /// data, or whose data region has no cluster that could run them, fall back to the same
    /// ranking anywhere.
    LocalityFirst,
    /// Meridian: jobs wait in the federation queue (weighted fair share across tenants) and are
    /// offered, late-bound, to the cluster the production placement code scores best, once the
    /// whole gang can start there.
    Meridian,
}

impl Policy {
    /// Every policy, in the order `--compare` reports them (ours last, next to the ratios).
    pub const ALL: [Policy; 8] = [
        Policy::HomeOnly,
        Policy::RoundRobin,
        Policy::Random,
        Policy::LeastLoaded,
        Policy::FirstAdmit,
        Policy::Cheapest,
        Policy::LocalityFirst,
        Policy::Meridian,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::HomeOnly => "home-only",
            Policy::RoundRobin => "round-robin",
            Policy::Random => "random",
            Policy::LeastLoaded => "least-loaded",
            Policy::FirstAdmit => "first-admit",
            Policy::Cheapest => "cheapest",
            Policy::LocalityFirst => "locality-first",
            Policy::Meridian => "meridian",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = SimError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
            SimError::Invalid(format!("--policy: unknown policy `{s}`; expected one of: {}", names.join(", ")))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_choices() {
        for policy in Policy::ALL {
            assert_eq!(policy.name().parse::<Policy>().unwrap(), policy);
        }
        let err = "fastest".parse::<Policy>().unwrap_err().to_string();
        assert!(err.contains("--policy") && err.contains("`fastest`") && err.contains("least-loaded"), "{err}");
    }
}
