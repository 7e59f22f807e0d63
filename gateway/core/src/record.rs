//! What the core keeps durable: job records, known clusters and placement decisions, their
//! keys in the store, and their versioned encoding.
//!
//! The core never writes; it returns [`Record`]s in its effects and the runtime commits them (one
//! group commit for everything a batch of inputs produced) before any send or reply of that batch.

use std::sync::Arc;

use meridian_placement::{Decision, Verdict};
use meridian_proto::inventory::{ClusterInfo, Inventory, Tier};
use meridian_proto::job::JobState;
use meridian_proto::protocol::Assignment;
use meridian_proto::spec::JobSpec;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Schema version written with every stored object; a newer one is refused, not misread.
pub const SCHEMA_VERSION: u32 = 1;
/// Key prefix of job records.
pub const JOB_PREFIX: &str = "jobs/";
/// Key prefix of known clusters.
pub const CLUSTER_PREFIX: &str = "clusters/";
/// Key prefix of placement decisions (the one that placed each job).
pub const DECISION_PREFIX: &str = "decisions/";

/// A job as the gateway keeps it: the spec plus where it is in its life.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    /// Gateway-assigned id (`j-…`); ids sort in submission order.
    pub id: String,
    /// The validated spec as submitted.
    pub spec: JobSpec,
    /// Current state.
    pub state: JobState,
    /// Cluster the job is offered to, bound to or ran on.
    pub cluster: Option<String>,
    /// Generation of the current binding; bumps on every offer so stale copies can be fenced off.
    pub fencing_token: u64,
    /// Last human-readable note (placement summary, failure reason).
    pub message: String,
    /// The placement decision that sent the job to its cluster, in one sentence with numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// Unix milliseconds.
    pub submitted_at_ms: i64,
    /// When all replicas started (Unix ms).
    pub started_at_ms: Option<i64>,
    /// When it reached a terminal state (Unix ms).
    pub finished_at_ms: Option<i64>,
    /// GPU type placement chose on `cluster` (the offer pins the member to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Nodes the replicas run on, as the member reported.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// How often members preempted the job (each time it went back to the queue).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub preemptions: u32,
    /// When a member last preempted it (Unix ms); offers carry it so members do not preempt it
    /// again within their minimum interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_preempted_at_ms: Option<i64>,
}

// serde's `skip_serializing_if` takes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// A cluster the gateway has seen, remembered across restarts so jobs that could never run
/// anywhere are still refused while agents reconnect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KnownCluster {
    /// Identity and prices.
    pub info: ClusterInfo,
    /// Last reported inventory (its shapes say what could ever fit).
    pub inventory: Inventory,
}

/// A cluster's verdict in a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerdictKind {
    /// The cluster the job went to (or would go to once it can start).
    Chosen,
    /// It could run the job, but scored worse.
    Feasible,
    /// It cannot run the job now; `reasons` say why.
    Rejected,
}

/// One cluster's verdict in an explanation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CandidateView {
    /// Cluster name.
    pub cluster: String,
    /// Its region.
    pub region: String,
    /// `owned` or `cloud`.
    pub tier: Tier,
    /// Chosen, feasible or rejected.
    pub verdict: VerdictKind,
    /// Why not (rejected only), as sentences.
    pub reasons: Vec<String>,
    /// The score terms (feasible and chosen only).
    pub score: Option<meridian_placement::ScoreBreakdown>,
}

/// A placement decision as stored and explained: when, the one-sentence summary and every
/// cluster's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StoredDecision {
    /// When it was made (Unix ms).
    pub at_ms: i64,
    /// One sentence with numbers.
    pub summary: String,
    /// Every cluster considered, or those a compacted decision keeps.
    pub candidates: Vec<CandidateView>,
    /// The clusters a compacted decision counts instead of listing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted: Option<meridian_placement::Omitted>,
}

/// One durable change the core asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// Write a job's record (the one the core's table now holds, shared rather than copied).
    Job(Arc<JobRecord>),
    /// Forget a job (retention).
    DeleteJob(String),
    /// Remember a cluster.
    Cluster(KnownCluster),
    /// The decision that placed a job.
    Decision(String, DecisionToStore),
    /// Forget a job's decision.
    DeleteDecision(String),
}

/// A record as a key and bytes (None: delete the key).
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    /// Store key.
    pub key: String,
    /// The value, or None for a delete.
    pub value: Option<Vec<u8>>,
}

/// Why a stored value could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The bytes are not the expected JSON.
    #[error("stored value under `{key}` does not decode: {source}")]
    Codec {
        /// The key.
        key: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// Written by a newer Meridian.
    #[error(
        "stored value under `{key}` has schema version {found}; this gateway reads up to {SCHEMA_VERSION} (upgrade the gateway)"
    )]
    TooNew {
        /// The key.
        key: String,
        /// Version found.
        found: u32,
    },
}

#[derive(Serialize, Deserialize)]
struct Versioned<T> {
    v: u32,
    #[serde(flatten)]
    data: T,
}

#[derive(Deserialize)]
struct VersionOnly {
    v: u32,
}

impl JobRecord {
    /// A job just accepted: `Queued` with `message`, submitted at `submitted_at_ms`, never
    /// offered, placed or started.
    pub fn queued(id: String, spec: JobSpec, message: impl Into<String>, submitted_at_ms: i64) -> Self {
        Self {
            id,
            spec,
            state: JobState::Queued,
            cluster: None,
            fencing_token: 0,
            message: message.into(),
            placement: None,
            submitted_at_ms,
            started_at_ms: None,
            finished_at_ms: None,
            gpu_type: None,
            nodes: Vec::new(),
            preemptions: 0,
            last_preempted_at_ms: None,
        }
    }

    /// Whether the job holds (or is about to hold) GPUs on its cluster: offered, bound, running,
    /// or `Unknown` (its cluster is away, so it may still hold them).
    pub(crate) fn holds_gpus(&self) -> bool {
        matches!(self.state, JobState::Offered | JobState::Bound | JobState::Running | JobState::Unknown)
    }

    /// Whether the job is currently bound to `cluster` under `token`: a report or reply about
    /// any other binding describes a stale copy.
    pub(crate) fn is_bound_to(&self, cluster: &str, token: u64) -> bool {
        self.cluster.as_deref() == Some(cluster) && self.fencing_token == token
    }

    /// Whether the job runs under the binding of `token` (usage samples count only then).
    pub(crate) fn runs_under(&self, token: u64) -> bool {
        self.state == JobState::Running && self.fencing_token == token
    }

    /// The assignment of the job's current binding, its spec pinned to the GPU type placement
    /// chose (or the types of its span) so the member cannot pick another type than the one that
    /// was costed.
    pub(crate) fn assignment(&self) -> Assignment {
        let mut spec = self.spec.clone();
        if let Some(gpu_type) = &self.gpu_type {
            spec.gang.resources.gpu_types = meridian_proto::gpu::pinned_types(gpu_type);
        }
        Assignment {
            job_id: self.id.clone(),
            fencing_token: self.fencing_token,
            spec,
            last_preempted_at_ms: self.last_preempted_at_ms,
        }
    }

    /// Back to the federation queue, unbound: no cluster, GPU type, nodes or start. The fencing
    /// token and `submitted_at_ms` are kept (the next offer bumps the token; the time the job
    /// already waited still counts for its place in line). The caller sets the message.
    pub(crate) fn back_to_queue(&mut self) {
        self.state = JobState::Queued;
        self.cluster = None;
        self.gpu_type = None;
        self.nodes.clear();
        self.started_at_ms = None;
    }

    /// The job as a restarted gateway holds it: offered, bound and running jobs are `Unknown`
    /// until their cluster reports them. An offer in flight at the last stop may have been
    /// accepted and started, so it is adopted like a bound job, never voided and placed again
    /// while its member may run it.
    pub(crate) fn after_restart(&mut self) {
        match self.state {
            JobState::Offered => {
                self.state = JobState::Unknown;
                self.message = format!(
                    "the gateway restarted with this offer in flight; waiting for {} to report it",
                    self.cluster.as_deref().unwrap_or("its cluster")
                );
            }
            JobState::Bound | JobState::Running => self.state = JobState::Unknown,
            JobState::Queued | JobState::Unknown | JobState::Succeeded | JobState::Failed | JobState::Cancelled => {}
        }
    }
}

impl CandidateView {
    /// Every cluster's verdict of `decision`, for explanations and the store.
    pub(crate) fn all_of(decision: &Decision) -> Vec<CandidateView> {
        let chosen = decision.chosen.as_ref().map(|c| c.cluster.as_str());
        decision
            .candidates
            .iter()
            .map(|c| match &c.verdict {
                Verdict::Rejected { reasons } => CandidateView {
                    cluster: c.cluster.to_string(),
                    region: c.region.to_string(),
                    tier: c.tier,
                    verdict: VerdictKind::Rejected,
                    reasons: reasons.iter().map(ToString::to_string).collect(),
                    score: None,
                },
                Verdict::Scored(score) => CandidateView {
                    cluster: c.cluster.to_string(),
                    region: c.region.to_string(),
                    tier: c.tier,
                    verdict: if chosen == Some(c.cluster.as_str()) {
                        VerdictKind::Chosen
                    } else {
                        VerdictKind::Feasible
                    },
                    reasons: Vec::new(),
                    score: Some(score.clone()),
                },
            })
            .collect()
    }
}

/// A decision on its way to the store, as the round made it. Its stored form
/// ([`StoredDecision`]: every cluster's verdict as text) is made only when the record is
/// encoded: a consumer that never encodes records (the simulator counts them) does not pay for
/// the text, and the core's step does not either.
#[derive(Debug, Clone)]
pub struct DecisionToStore {
    /// The decision as the job table keeps it (shared with it).
    pub decided: Arc<dyn ToStored>,
    /// Its summary, made once for the offer as well.
    pub summary: String,
}

/// A decision that can be put in its stored form (the job table's decisions are).
pub trait ToStored: std::fmt::Debug + Send + Sync {
    /// The stored form, summarised by `summary`.
    fn to_stored(&self, summary: String) -> StoredDecision;
}

impl DecisionToStore {
    /// The stored form.
    pub fn stored(&self) -> StoredDecision {
        self.decided.to_stored(self.summary.clone())
    }
}

impl PartialEq for DecisionToStore {
    fn eq(&self, other: &Self) -> bool {
        self.summary == other.summary && self.stored() == other.stored()
    }
}

impl Record {
    /// The store key this record writes.
    pub fn key(&self) -> String {
        match self {
            Record::Job(job) => format!("{JOB_PREFIX}{}", job.id),
            Record::DeleteJob(id) => format!("{JOB_PREFIX}{id}"),
            Record::Cluster(cluster) => format!("{CLUSTER_PREFIX}{}", cluster.info.name),
            Record::Decision(id, _) | Record::DeleteDecision(id) => format!("{DECISION_PREFIX}{id}"),
        }
    }

    /// Key and bytes. Serialising these plain data types cannot fail; should it ever, the
    /// error is returned rather than a half-written value.
    pub fn encode(&self) -> Result<Encoded, serde_json::Error> {
        fn versioned<T: Serialize>(data: &T) -> Result<Vec<u8>, serde_json::Error> {
            serde_json::to_vec(&Versioned { v: SCHEMA_VERSION, data })
        }
        let value = match self {
            Record::Job(job) => Some(versioned(job)?),
            Record::Cluster(cluster) => Some(versioned(cluster)?),
            Record::Decision(_, decision) => Some(versioned(&decision.stored())?),
            Record::DeleteJob(_) | Record::DeleteDecision(_) => None,
        };
        Ok(Encoded { key: self.key(), value })
    }
}

/// Decodes one stored value, refusing newer schema versions as such.
pub fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, DecodeError> {
    let codec = |source| DecodeError::Codec { key: key.to_string(), source };
    let VersionOnly { v } = serde_json::from_slice(bytes).map_err(codec)?;
    if v > SCHEMA_VERSION {
        return Err(DecodeError::TooNew { key: key.to_string(), found: v });
    }
    let versioned: Versioned<T> = serde_json::from_slice(bytes).map_err(codec)?;
    Ok(versioned.data)
}

/// Everything the core starts from, read back from the store.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// Every job record.
    pub jobs: Vec<JobRecord>,
    /// Every known cluster.
    pub clusters: Vec<KnownCluster>,
    /// Stored decisions by job id.
    pub decisions: Vec<(String, StoredDecision)>,
}

impl Loaded {
    /// Decodes the entries of a store scan (any prefix mix); unknown prefixes are ignored.
    pub fn decode(entries: impl IntoIterator<Item = (String, Vec<u8>)>) -> Result<Self, DecodeError> {
        let mut loaded = Loaded::default();
        for (key, bytes) in entries {
            if key.starts_with(JOB_PREFIX) {
                loaded.jobs.push(decode(&key, &bytes)?);
            } else if key.starts_with(CLUSTER_PREFIX) {
                loaded.clusters.push(decode(&key, &bytes)?);
            } else if let Some(id) = key.strip_prefix(DECISION_PREFIX) {
                loaded.decisions.push((id.to_string(), decode(&key, &bytes)?));
            }
        }
        Ok(loaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_schema_versions_are_refused_as_such() {
        let err = decode::<KnownCluster>("clusters/x", br#"{"v":99}"#).unwrap_err();
        assert!(matches!(err, DecodeError::TooNew { found: 99, .. }), "{err}");
    }

    #[test]
    fn a_decision_round_trips_through_its_encoding() {
        use crate::decision::Decided;
        use meridian_placement::{Candidate, JobLabel, Name, Rejection, Verdict};
        let decision = Decision {
            chosen: None,
            candidates: vec![Candidate {
                cluster: Name::from("east"),
                region: Name::from("us-east"),
                tier: Tier::Owned,
                verdict: Verdict::Rejected { reasons: Rejection::Disconnected.into() },
            }],
            job: JobLabel { name: Name::from("train"), replicas: 1, gpus: 8, deadline: None },
            omitted: Some(meridian_placement::Omitted {
                feasible: 3,
                rejected: vec![meridian_placement::OmittedRejections {
                    reason: "gpu_type_unavailable".into(),
                    clusters: 40,
                }],
            }),
        };
        let live = |decision: Decision| Arc::new(Decided::Live { at_ms: 5, decision });
        let to_store = DecisionToStore { decided: live(decision.clone()), summary: "east: disconnected".into() };
        let stored = to_store.stored();
        assert_eq!((stored.at_ms, stored.summary.as_str()), (5, "east: disconnected"));
        assert_eq!(stored.candidates.len(), 1);
        assert_eq!(stored.candidates[0].verdict, VerdictKind::Rejected);
        assert_eq!(stored.candidates[0].reasons, vec![Rejection::Disconnected.to_string()]);
        let encoded = Record::Decision("j-1".into(), to_store.clone()).encode().unwrap();
        assert_eq!(encoded.key, "decisions/j-1");
        let loaded = Loaded::decode([(encoded.key, encoded.value.unwrap())]).unwrap();
        assert_eq!(loaded.decisions, vec![("j-1".to_string(), stored)]);

        // A full decision is stored without `omitted`, as every decision was before compaction.
        let plain = DecisionToStore { decided: live(Decision { omitted: None, ..decision }), ..to_store };
        let encoded = Record::Decision("j-2".into(), plain.clone()).encode().unwrap();
        let value = encoded.value.unwrap();
        assert!(!String::from_utf8_lossy(&value).contains("omitted"));
        let loaded = Loaded::decode([(encoded.key, value)]).unwrap();
        assert_eq!(loaded.decisions, vec![("j-2".to_string(), plain.stored())]);
    }
}
