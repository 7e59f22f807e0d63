//! The outcome of placing one job, with every cluster's verdict kept for `meridian explain`, and
//! the one-sentence summary made from it.

use meridian_proto::inventory::Tier;
use serde::{Deserialize, Serialize};

use crate::deadline::DeadlineOutlook;
use crate::name::Name;
use crate::reasons::Secs;
use crate::verdict::{Candidate, rank};

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

    /// One sentence for people, with the numbers that decided it. Made on each call, from the
    /// candidates: keep the text if you need it twice.
    pub fn summary(&self) -> String {
        let best = self.candidates.iter().filter(|c| c.score().is_some()).min_by(|a, b| rank(a, b));
        let shape = GangShape { replicas: self.job.replicas, gpus: self.job.gpus };
        let mut summary = summarize(&self.job.name, shape, best, &self.candidates);
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
) -> String {
    let feasible = candidates.iter().filter(|c| c.score().is_some()).count();
    let rejected = candidates.len() - feasible;
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
