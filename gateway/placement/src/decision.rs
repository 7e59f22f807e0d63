//! The outcome of placing one job, with every cluster's verdict kept for `meridian explain`.

use std::cmp::Ordering;
use std::fmt;

use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::Tier;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::deadline::DeadlineOutlook;
use super::filter::Rejection;
use super::name::Name;
use super::score::ScoreBreakdown;

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

/// One cluster's verdict for the job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// Cluster name.
    pub cluster: Name,
    /// Cluster region.
    pub region: Name,
    /// Owned or cloud.
    pub tier: Tier,
    /// Why not, or how good.
    pub verdict: Verdict,
}

/// Whether a cluster may take the job and, if so, its score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Verdict {
    /// The cluster may not take the job now; every reason is listed.
    Rejected {
        /// Why not.
        reasons: Reasons,
    },
    /// The cluster may take the job; lower `total` is better.
    Scored(ScoreBreakdown),
}

/// Every reason one cluster was rejected, in the order found. Reads like a slice and serializes
/// as a JSON array. Most rejected clusters have exactly one reason, which is kept inline: a
/// decision rejects dozens of clusters and a `Vec` each was one allocation apiece.
#[derive(Clone, Default)]
pub struct Reasons(ReasonsRepr);

#[derive(Clone)]
enum ReasonsRepr {
    One(Rejection),
    Many(Vec<Rejection>),
}

/// Seconds shown the human way (`1h5m`), for messages.
pub(crate) struct Secs(pub(crate) f64);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.0.is_finite() {
            return f.write_str("never");
        }
        // Seconds are enough precision for a person; the cast saturates on huge values.
        let whole = self.0.max(0.0).round() as u64;
        write!(f, "{}", HumanDuration::from_secs(whole))
    }
}

impl Default for ReasonsRepr {
    fn default() -> Self {
        Self::Many(Vec::new())
    }
}

impl Reasons {
    /// Adds a reason.
    pub fn push(&mut self, reason: Rejection) {
        match &mut self.0 {
            ReasonsRepr::Many(list) if !list.is_empty() => list.push(reason),
            ReasonsRepr::Many(_) => self.0 = ReasonsRepr::One(reason),
            ReasonsRepr::One(_) => {
                if let ReasonsRepr::One(first) = std::mem::take(&mut self.0) {
                    self.0 = ReasonsRepr::Many(vec![first, reason]);
                }
            }
        }
    }

    /// Replaces the first reason equal to `old` with `new`.
    pub fn replace(&mut self, old: &Rejection, new: Rejection) {
        match &mut self.0 {
            ReasonsRepr::One(reason) if reason == old => *reason = new,
            ReasonsRepr::Many(list) => {
                if let Some(reason) = list.iter_mut().find(|r| *r == old) {
                    *reason = new;
                }
            }
            ReasonsRepr::One(_) => {}
        }
    }

    /// The reasons as a `Vec`.
    pub fn into_vec(self) -> Vec<Rejection> {
        match self.0 {
            ReasonsRepr::One(reason) => vec![reason],
            ReasonsRepr::Many(list) => list,
        }
    }
}

impl std::ops::Deref for Reasons {
    type Target = [Rejection];

    fn deref(&self) -> &[Rejection] {
        match &self.0 {
            ReasonsRepr::One(reason) => std::slice::from_ref(reason),
            ReasonsRepr::Many(list) => list,
        }
    }
}

impl From<Rejection> for Reasons {
    fn from(reason: Rejection) -> Self {
        Self(ReasonsRepr::One(reason))
    }
}

impl From<Vec<Rejection>> for Reasons {
    fn from(list: Vec<Rejection>) -> Self {
        Self(ReasonsRepr::Many(list))
    }
}

impl PartialEq for Reasons {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Reasons {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Reasons {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Rejection>::deserialize(deserializer).map(Self::from)
    }
}

impl Candidate {
    /// The score breakdown, if the cluster was not rejected.
    pub fn score(&self) -> Option<&ScoreBreakdown> {
        match &self.verdict {
            Verdict::Scored(score) => Some(score),
            Verdict::Rejected { .. } => None,
        }
    }

    /// The reasons the cluster was rejected (empty when it was scored).
    pub fn reasons(&self) -> &[Rejection] {
        match &self.verdict {
            Verdict::Rejected { reasons } => reasons,
            Verdict::Scored(_) => &[],
        }
    }
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

/// Order for ranking: better score first, then name; rejected last.
pub(crate) fn rank(a: &Candidate, b: &Candidate) -> Ordering {
    match (a.score(), b.score()) {
        (Some(x), Some(y)) => x.total.total_cmp(&y.total).then_with(|| a.cluster.cmp(&b.cluster)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cluster.cmp(&b.cluster),
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
    } else {
        ("Waiting for", format!("expected to start in {}, so the job stays queued", Secs(score.expected_start_secs)))
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
