//! The outcome of placing one job, with every cluster's verdict kept for `meridian explain`, and
//! the one-sentence summary made from it.

use std::mem::Discriminant;

use meridian_proto::inventory::Tier;
use serde::{Deserialize, Serialize};

use crate::config::MAX_SIBLING_COPIES;
use crate::deadline::DeadlineOutlook;
use crate::name::Name;
use crate::reasons::{Rejection, Secs};
use crate::verdict::{Candidate, rank};

/// Feasible clusters the gateway keeps in the decision of a job that stays queued
/// ([`Decision::compact`]): enough for its sibling copies (at most [`MAX_SIBLING_COPIES`], on its
/// best-scored clusters) and for a reader, whatever the federation's size.
pub const KEPT_FEASIBLE: usize = 2 * MAX_SIBLING_COPIES as usize;

/// What placement decided for one job, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// The best-scored cluster, or None when no cluster may take the job now.
    pub chosen: Option<Choice>,
    /// One entry per cluster of the snapshot, in snapshot order.
    pub candidates: Vec<Candidate>,
    /// The job decided for, as its summary names it. The summary sentence itself is made only
    /// when asked ([`Decision::summary`]): most decisions of a placement round are never read.
    pub job: JobLabel,
    /// The verdicts [`Decision::compact`] dropped, counted; None while every cluster's verdict
    /// is in `candidates`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted: Option<Omitted>,
}

/// The verdicts a compacted decision no longer lists: how many clusters, and why.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Omitted {
    /// Feasible clusters that scored worse than every feasible one listed.
    pub feasible: u32,
    /// Rejected clusters not listed, by the kind of their first reason ([`Rejection::kind`]),
    /// in kind order; one cluster of each kind is still listed as its example.
    pub rejected: Vec<OmittedRejections>,
}

/// Rejected clusters of one kind that a compacted decision does not list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OmittedRejections {
    /// [`Rejection::kind`] of their first reason.
    pub reason: Name,
    /// How many.
    pub clusters: u32,
}

impl Omitted {
    /// Every rejected cluster it counts.
    pub fn rejected_clusters(&self) -> u32 {
        self.rejected.iter().map(|r| r.clusters).sum()
    }
}

/// The job a decision is for, as its summary names it: name and gang shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobLabel {
    /// The job's name.
    pub name: Name,
    /// Replicas of the gang.
    pub replicas: u32,
    /// GPUs per replica.
    pub gpus: u32,
    /// The job's deadline as this decision saw it, and whether the job may burst: the summary's
    /// last sentence. None for a job without a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<(DeadlineOutlook, bool)>,
}

/// The cluster placement picked. Late binding: the caller offers the job there only when
/// `starts_now`; otherwise the job stays queued, waiting for that cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Choice {
    /// Cluster name.
    pub cluster: Name,
    /// GPU type the gang would use there.
    pub gpu_type: Name,
    /// The whole gang fits on free nodes there now.
    pub starts_now: bool,
    /// When the job is expected to start there, seconds from now (waiting and data transfer).
    pub expected_start_secs: f64,
    /// Its score (lower is better).
    pub score: f64,
}

impl Decision {
    /// Candidates best first: scored by total (ties by name), then rejected by name. For display;
    /// `candidates` itself stays in snapshot order so placing does not pay for sorting.
    pub fn ranked(&self) -> Vec<&Candidate> {
        let mut ranked: Vec<&Candidate> = self.candidates.iter().collect();
        ranked.sort_by(|a, b| rank(a, b));
        ranked
    }

    /// The same decision keeping what a reader of a waiting job needs, in memory bounded by the
    /// kinds of reasons rather than the number of clusters: the `keep_feasible` best-scored
    /// feasible clusters (the chosen one among them), and for each kind of rejection the first
    /// rejected cluster by name as its example; the rest are counted in [`Decision::omitted`].
    /// Its summary is the full decision's. A decision with nothing to drop is returned as it is.
    pub fn compact(mut self, keep_feasible: usize) -> Decision {
        let keep_feasible = keep_feasible.max(1);
        // Per kind of first reason: (kind, the example's position, how many), and the feasible
        // clusters: counted first, since most decisions of a small federation have nothing to drop.
        let mut examples: Vec<(Discriminant<Rejection>, usize, u32)> = Vec::new();
        let mut feasible = 0;
        for (at, candidate) in self.candidates.iter().enumerate() {
            let Some(first) = candidate.reasons().first() else {
                feasible += usize::from(candidate.score().is_some());
                continue;
            };
            let kind = std::mem::discriminant(first);
            match examples.iter_mut().find(|(k, _, _)| *k == kind) {
                Some((_, example, count)) => {
                    *count += 1;
                    if candidate.cluster < self.candidates[*example].cluster {
                        *example = at;
                    }
                }
                None => examples.push((kind, at, 1)),
            }
        }
        if feasible <= keep_feasible && examples.iter().all(|(_, _, count)| *count == 1) {
            return self;
        }
        let mut scored: Vec<usize> =
            (0..self.candidates.len()).filter(|&at| self.candidates[at].score().is_some()).collect();
        scored.sort_by(|&a, &b| rank(&self.candidates[a], &self.candidates[b]));
        scored.truncate(keep_feasible);
        let mut keep = vec![false; self.candidates.len()];
        for at in scored.iter().copied().chain(examples.iter().map(|(_, example, _)| *example)) {
            keep[at] = true;
        }
        let mut omitted = self.omitted.take().unwrap_or_default();
        omitted.feasible += u32::try_from(feasible - scored.len()).unwrap_or(u32::MAX);
        for (_, example, count) in examples.into_iter().filter(|(_, _, count)| *count > 1) {
            let kind = self.candidates[example].reasons().first().map_or("", Rejection::kind);
            match omitted.rejected.iter_mut().find(|r| r.reason == kind) {
                Some(known) => known.clusters += count - 1,
                None => omitted.rejected.push(OmittedRejections { reason: Name::from(kind), clusters: count - 1 }),
            }
        }
        omitted.rejected.sort_by(|a, b| a.reason.cmp(&b.reason));
        self.candidates = std::mem::take(&mut self.candidates)
            .into_iter()
            .zip(keep)
            .filter_map(|(c, kept)| kept.then_some(c))
            .collect();
        self.candidates.shrink_to_fit();
        self.omitted = Some(omitted);
        self
    }

    /// One sentence for people, with the numbers that decided it. Made on each call, from the
    /// candidates: keep the text if you need it twice.
    pub fn summary(&self) -> String {
        let best = self.candidates.iter().filter(|c| c.score().is_some()).min_by(|a, b| rank(a, b));
        let shape = GangShape { replicas: self.job.replicas, gpus: self.job.gpus };
        let mut summary = summarize(&self.job.name, shape, best, &self.candidates, self.omitted.as_ref());
        if let Some((deadline, may_burst)) = &self.job.deadline {
            deadline.explain(&mut summary, best, *may_burst);
        }
        summary
    }

    /// The chosen cluster's candidate entry.
    pub fn chosen_candidate(&self) -> Option<&Candidate> {
        let chosen = self.chosen.as_ref()?;
        self.candidates.iter().find(|c| c.cluster == chosen.cluster)
    }
}

/// The one-sentence summary of a decision.
pub(crate) fn summarize(
    job_name: &str,
    shape: GangShape,
    chosen: Option<&Candidate>,
    candidates: &[Candidate],
    omitted: Option<&Omitted>,
) -> String {
    let listed_feasible = candidates.iter().filter(|c| c.score().is_some()).count();
    let rejected = candidates.len() - listed_feasible + omitted.map_or(0, |o| o.rejected_clusters() as usize);
    let feasible = listed_feasible + omitted.map_or(0, |o| o.feasible as usize);
    let GangShape { replicas, gpus } = shape;
    let Some(chosen) = chosen else {
        if candidates.is_empty() {
            return format!("No cluster is registered, so job '{job_name}' ({replicas}×{gpus} GPUs) waits.");
        }
        // Name one reason: the first rejected cluster by name, so the sentence is stable.
        let example = candidates.iter().min_by(|a, b| a.cluster.cmp(&b.cluster));
        let reason = example.and_then(|c| c.reasons().first().map(|r| (c.cluster.as_str(), r)));
        return match reason {
            Some((cluster, reason)) => format!(
                "No cluster can take job '{job_name}' ({replicas}×{gpus} GPUs) now: all {rejected} were rejected, \
                 e.g. {cluster}: {reason}."
            ),
            None => format!("No cluster can take job '{job_name}' ({replicas}×{gpus} GPUs) now."),
        };
    };
    let Some(score) = chosen.score() else {
        return format!("Chose {} for job '{job_name}'.", chosen.cluster);
    };
    let tier = match chosen.tier {
        Tier::Owned => "owned",
        Tier::Cloud => "cloud",
    };
    let (verb, when) = if score.fits_now {
        ("Chose", "starts now".to_owned())
    } else if score.preempts {
        (
            "Chose",
            format!(
                "starts in {} once {} preempts lower-priority preemptible jobs for it (its own plan)",
                Secs(score.expected_start_secs),
                chosen.cluster
            ),
        )
    } else {
        let basis = if score.quoted { format!(" by {}'s own plan", chosen.cluster) } else { String::new() };
        (
            "Waiting for",
            format!("expected to start in {}{basis}, so the job stays queued", Secs(score.expected_start_secs)),
        )
    };
    format!(
        "{verb} {} ({tier}, {}) for job '{job_name}' ({replicas}×{gpus} {}): {when}; data transfer {}, compute \
         ${:.2} + egress ${:.2}, fragmentation {:.2}, score {:.0}; best of {feasible} feasible, {rejected} rejected.",
        chosen.cluster,
        chosen.region,
        score.gpu_type,
        Secs(score.transfer_secs),
        score.compute_usd,
        score.egress_usd,
        score.fragmentation,
        score.total,
    )
}

/// Replicas × GPUs per replica, for the summary.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GangShape {
    pub(crate) replicas: u32,
    pub(crate) gpus: u32,
}
