//! Placing one job: the pipeline run over every cluster of a snapshot. Filter each cluster
//! ([`filter`](crate::filter)), score those that pass ([`score`](crate::score)), apply the burst
//! gate once the best owned wait is known, weigh the deadline ([`deadline`](crate::deadline)), and
//! pick the lowest score, ties by cluster name, keeping every verdict in the [`Decision`].

use meridian_proto::inventory::Tier;
use meridian_proto::spec::{BurstPolicy, JobSpec};

use crate::config::PlacementConfig;
use crate::deadline::DeadlineOutlook;
use crate::decision::{Choice, Decision, JobLabel};
use crate::filter::{static_rejections, static_verdicts};
use crate::name::Name;
use crate::need::Need;
use crate::reasons::{Reasons, Rejection};
use crate::score::{RegionCosts, score};
use crate::snapshot::FederationSnapshot;
use crate::verdict::{Candidate, Verdict, rank};

/// Decides where `job` should run given `snapshot`, keeping every cluster's verdict.
///
/// Deterministic: the same inputs give the same decision, whatever the order of clusters.
pub fn place(job: &JobSpec, snapshot: &FederationSnapshot, config: &PlacementConfig) -> Decision {
    place_waited(job, snapshot, config, 0.0)
}

/// [`place`] for a job that has already waited `waited_secs` in the federation queue: the time
/// waited counts toward its burst threshold, so `burst.after` bounds the job's whole wait, not
/// only the wait expected from now on.
pub fn place_waited(
    job: &JobSpec,
    snapshot: &FederationSnapshot,
    config: &PlacementConfig,
    waited_secs: f64,
) -> Decision {
    decide(job, snapshot, config, waited_secs, Keep::Every)
}

/// The choice [`place_waited`] makes, without keeping the clusters it rejects: for callers that
/// read only the choice (a round's hold scan), which then cost nothing per rejected cluster.
pub(crate) fn choose_waited(
    job: &JobSpec,
    snapshot: &FederationSnapshot,
    config: &PlacementConfig,
    waited_secs: f64,
) -> Option<Choice> {
    decide(job, snapshot, config, waited_secs, Keep::Feasible).chosen
}

/// Which clusters' verdicts a decision keeps.
#[derive(Clone, Copy, PartialEq)]
enum Keep {
    /// Every cluster's, for explanations.
    Every,
    /// Only those that may take the job (the choice is the same).
    Feasible,
}

fn decide(
    job: &JobSpec,
    snapshot: &FederationSnapshot,
    config: &PlacementConfig,
    waited_secs: f64,
    keep: Keep,
) -> Decision {
    let waited_secs = if waited_secs.is_finite() { waited_secs.max(0.0) } else { 0.0 };
    let need = Need::of(job);
    let mut regions = RegionCosts::new(&job.data, &snapshot.network);
    let mut candidates = Vec::with_capacity(snapshot.clusters.len());
    // When compute could start on the best owned cluster: its queue wait or the copy of the
    // job's data to it, whichever is longer. The burst gate compares this, not the queue wait
    // alone: a job whose data sits next to a cloud cluster would otherwise be copied for an hour
    // to an owned cluster that "starts it now".
    let mut best_owned_start = f64::INFINITY;
    // What never changes with load, kept per class of job (see `statics.rs`).
    let statics = static_verdicts(&snapshot.statics, &need, &snapshot.clusters);

    for (cluster, fixed) in snapshot.clusters.iter().zip(statics.iter()) {
        let info = cluster.info();
        let feasible = cluster.connected && fixed.reasons.is_empty();
        let verdict = if feasible {
            let breakdown = score(&need, cluster, &fixed.options, &mut regions, config);
            if info.tier == Tier::Owned {
                best_owned_start = best_owned_start.min(breakdown.expected_start_secs);
            }
            Verdict::Scored(breakdown)
        } else if keep == Keep::Feasible {
            continue;
        } else if cluster.connected {
            Verdict::Rejected { reasons: fixed.reasons.clone() }
        } else {
            let mut reasons = Reasons::from(Rejection::Disconnected);
            reasons.extend(&fixed.reasons);
            Verdict::Rejected { reasons }
        };
        let (name, region) = (cluster.name().clone(), cluster.region().clone());
        candidates.push(Candidate { cluster: name, region, tier: info.tier, verdict });
    }

    let deadline = DeadlineOutlook::of(job, waited_secs, best_owned_start);
    // Burst gate, once the best owned wait is known. `burst: never` was already a static reason.
    if let BurstPolicy::After { after, .. } = job.placement.burst {
        let after_secs = after.as_secs();
        // Also true when no owned cluster fits.
        let owned_is_slow =
            waited_secs + best_owned_start > after_secs as f64 || deadline.is_some_and(|d| d.owned_would_miss());
        if owned_is_slow {
            // Past the threshold the owner values time more than money (within the budget), and
            // the more so the longer the owned clusters would keep the job waiting: a wait of k
            // times `burst.after` divides the weight of a dollar by k. When no owned cluster can
            // run the job, waiting buys nothing and dollars keep their burst weight.
            let owned_total = waited_secs + best_owned_start;
            let patience = if owned_total.is_finite() && owned_total > after_secs as f64 {
                after_secs as f64 / owned_total
            } else {
                1.0
            };
            let weight = config.usd_to_seconds * config.burst_usd_weight * patience;
            for candidate in &mut candidates {
                if let Verdict::Scored(score) = &mut candidate.verdict {
                    score.reweigh_cost(weight, config);
                }
            }
        } else {
            for candidate in candidates.iter_mut().filter(|c| c.tier == Tier::Cloud && c.score().is_some()) {
                candidate.verdict = Verdict::Rejected {
                    reasons: Rejection::BurstNotYet { owned_wait_secs: best_owned_start, waited_secs, after_secs }
                        .into(),
                };
            }
        }
    }

    if let Some(deadline) = &deadline {
        deadline.penalize(&mut candidates, config);
    }

    let best = candidates.iter().filter(|c| c.score().is_some()).min_by(|a, b| rank(a, b));
    let chosen = best.and_then(|candidate| {
        candidate.score().map(|s| Choice {
            cluster: candidate.cluster.clone(),
            gpu_type: s.gpu_type.clone(),
            // A start by preemption is offered now: the member queues the job and preempts.
            starts_now: s.fits_now || s.preempts,
            expected_start_secs: s.expected_start_secs,
            score: s.total,
        })
    });
    let label = JobLabel {
        name: Name::from(&job.name),
        replicas: job.gang.replicas,
        gpus: job.gang.resources.gpus,
        deadline: deadline.map(|outlook| (outlook, job.placement.burst != BurstPolicy::Never)),
    };
    Decision { chosen, candidates, job: label, omitted: None }
}

/// For submit-time rejection: `Some` with every (cluster, reason) when no known cluster could
/// ever run `job`, even empty and connected; `None` when at least one could, or when no cluster
/// is known yet (the job may wait for one to join).
pub fn never_fits(job: &JobSpec, snapshot: &FederationSnapshot) -> Option<Vec<(String, Rejection)>> {
    let need = Need::of(job);
    let mut all = Vec::new();
    for cluster in &snapshot.clusters {
        let mut reasons = Reasons::default();
        static_rejections(&need, cluster, &mut reasons);
        if reasons.is_empty() {
            return None;
        }
        all.extend(reasons.into_vec().into_iter().map(|r| (cluster.info().name.clone(), r)));
    }
    (!all.is_empty()).then_some(all)
}
