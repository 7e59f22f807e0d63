//! One cluster's verdict for a job: rejected with every reason, or scored with its breakdown; and
//! the order that ranks verdicts (best score first, ties by cluster name).

use std::cmp::Ordering;

use meridian_proto::inventory::Tier;
use serde::{Deserialize, Serialize};

use crate::breakdown::ScoreBreakdown;
use crate::name::Name;
use crate::reasons::{Reasons, Rejection};

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

/// Order for ranking: better score first, then name; rejected last.
pub(crate) fn rank(a: &Candidate, b: &Candidate) -> Ordering {
    match (a.score(), b.score()) {
        (Some(x), Some(y)) => x.total.total_cmp(&y.total).then_with(|| a.cluster.cmp(&b.cluster)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cluster.cmp(&b.cluster),
    }
}
