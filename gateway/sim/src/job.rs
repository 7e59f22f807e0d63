//! The simulator's shared vocabulary: jobs of a workload, what became of them, and per-cluster
//! usage. Every other `sim` module speaks these types.

use std::fmt;

use meridian_proto::inventory::Tier;
use serde::Serialize;

pub use super::engine::GatewayCounts;

/// A job as read from a trace or drawn by the generator, before the fleet decorates it.
#[derive(Debug, Clone, PartialEq)]
pub struct RawJob {
    /// Seconds from the start of the workload (the earliest job submits at 0).
    pub submit_secs: u64,
    /// Run time once started, in seconds (at least 1).
    pub duration_secs: u64,
    /// GPUs of the whole job (at least 1).
    pub gpus: u32,
    /// Tenant (the Philly `cluster` column).
    pub tenant: String,
    /// GPU memory each GPU must have, in GiB (0: any GPU will do; traces carry none).
    pub gpu_memory_gib: u32,
}

/// A dataset a job reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Size in GiB.
    pub size_gib: f64,
    /// Home region of the data (a region of the topology).
    pub region: String,
}

/// One job of a decorated workload: what placement and the local schedulers see.
#[derive(Debug, Clone, PartialEq)]
pub struct SimJob {
    /// Index in [`Workload::jobs`]; jobs are in submit order (ties keep trace order).
    pub id: u32,
    /// Seconds from the start of the workload.
    pub submit_secs: u64,
    /// True run time once started on a GPU of relative speed 1.0 (the topology's reference
    /// type), in seconds (at least 1); on another type it runs
    /// [`Topology::run_secs`](crate::topology::Topology::run_secs). Only decides when the job
    /// ends (and what its GPUs cost); the gateway and the members never see it.
    pub duration_secs: u64,
    /// The job's runtime estimate in seconds (at least 1): its spec's `runtime.estimate`, all the
    /// gateway and the members know of its run time. Equals `duration_secs` unless
    /// `--estimate-error` is given (see [`crate::workload::apply_estimate_error`]).
    pub estimate_secs: u64,
    /// Replicas of the gang (at least 1); each lands on one node.
    pub replicas: u32,
    /// GPUs per replica (at least 1).
    pub gpus_per_replica: u32,
    /// Index into [`Workload::tenants`].
    pub tenant: u32,
    /// Pinned GPU type; `None` accepts any type.
    pub gpu_type: Option<String>,
    /// GPU memory each GPU must have, in GiB (0: any).
    pub gpu_memory_gib: u32,
    /// The dataset it reads, if any.
    pub dataset: Option<Dataset>,
    /// Its spec's `runtime.deadline`: seconds after submission by which it should have ended.
    /// None unless `--deadlines` gave it one (see [`crate::workload::apply_deadlines`]).
    pub deadline_secs: Option<u64>,
}

impl SimJob {
    /// A test job: `id` of `tenant`, submitted at `submit_secs`, one replica of `gpus` GPUs of
    /// any type, running `duration_secs` with an exact estimate, no data, no deadline.
    #[cfg(test)]
    pub(crate) fn plain(id: u32, tenant: u32, submit_secs: u64, duration_secs: u64, gpus: u32) -> Self {
        Self {
            id,
            submit_secs,
            duration_secs,
            estimate_secs: duration_secs,
            replicas: 1,
            gpus_per_replica: gpus,
            tenant,
            gpu_type: None,
            gpu_memory_gib: 0,
            dataset: None,
            deadline_secs: None,
        }
    }

    /// GPUs of the whole gang.
    pub fn gpus(&self) -> u64 {
        u64::from(self.replicas) * u64::from(self.gpus_per_replica)
    }

    /// GPU-seconds the job demands on the reference GPU (GPUs × duration).
    pub fn gpu_secs(&self) -> u64 {
        self.gpus() * self.duration_secs
    }
}

/// A tenant of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// Name (as in the trace).
    pub name: String,
    /// Index into the topology's clusters of the tenant's home cluster (an owned one when the
    /// topology has any): where `home-only` runs its jobs.
    pub home: usize,
}

/// A decorated workload, ready to replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Where it came from (`philly.csv`, `llm profile, load 1.0, seed 7`), for reports.
    pub source: String,
    /// Tenants, in name order.
    pub tenants: Vec<Tenant>,
    /// Jobs in submit order; `jobs[i].id == i`.
    pub jobs: Vec<SimJob>,
}

impl Workload {
    /// GPU-seconds all jobs demand.
    pub fn gpu_secs(&self) -> u64 {
        self.jobs.iter().map(SimJob::gpu_secs).sum()
    }

    /// Seconds from the first submit to the last (at least 1).
    pub fn arrival_window_secs(&self) -> u64 {
        let first = self.jobs.first().map_or(0, |j| j.submit_secs);
        let last = self.jobs.last().map_or(0, |j| j.submit_secs);
        last.saturating_sub(first).max(1)
    }

    /// Offered load against `capacity_gpus`: GPU-seconds demanded over what that many GPUs give
    /// during the arrival window.
    pub fn offered_load(&self, capacity_gpus: u64) -> f64 {
        self.gpu_secs() as f64 / (self.arrival_window_secs() as f64 * capacity_gpus.max(1) as f64)
    }

    /// Stretches or squeezes the arrival times (not the jobs) so the offered load against
    /// `capacity_gpus` becomes `load`. Submit order is kept.
    pub fn scale_to_load(&mut self, load: f64, capacity_gpus: u64) {
        let current = self.offered_load(capacity_gpus);
        if !(load.is_finite() && load > 0.0 && current > 0.0) {
            return;
        }
        let factor = current / load;
        for job in &mut self.jobs {
            job.submit_secs = (job.submit_secs as f64 * factor).round() as u64;
        }
    }
}

/// Job-size buckets used by the per-bucket metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum SizeBucket {
    /// 1 GPU.
    #[serde(rename = "1")]
    One,
    /// 2–8 GPUs (one node).
    #[serde(rename = "2-8")]
    Node,
    /// 9–64 GPUs.
    #[serde(rename = "9-64")]
    Multi,
    /// More than 64 GPUs.
    #[serde(rename = "65+")]
    Large,
}

impl SizeBucket {
    /// All buckets, smallest first.
    pub const ALL: [SizeBucket; 4] = [SizeBucket::One, SizeBucket::Node, SizeBucket::Multi, SizeBucket::Large];

    /// The bucket of a job of `gpus` GPUs.
    pub fn of(gpus: u64) -> Self {
        match gpus {
            0..=1 => SizeBucket::One,
            2..=8 => SizeBucket::Node,
            9..=64 => SizeBucket::Multi,
            _ => SizeBucket::Large,
        }
    }
}

impl fmt::Display for SizeBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SizeBucket::One => "1 GPU",
            SizeBucket::Node => "2-8 GPUs",
            SizeBucket::Multi => "9-64 GPUs",
            SizeBucket::Large => "65+ GPUs",
        })
    }
}

/// What became of one job in a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The job ([`SimJob::id`]).
    pub job: u32,
    /// Index into the topology's clusters of where it ran.
    pub cluster: u32,
    /// When its GPUs were taken (its data had arrived by then).
    pub start_secs: u64,
    /// When it finished and gave its GPUs back (`start +` its run time on the GPU type it got).
    pub end_secs: u64,
    /// GB (10^9 bytes) of its data that crossed region links: the copy to where it ran, plus
    /// every copy made for it elsewhere and withdrawn (first-admit's losing copies, cheapest's
    /// failed-over ones), each counted for the bytes it moved before it stopped.
    pub moved_gb: f64,
    /// US$ of egress for all those bytes.
    pub egress_usd: f64,
    /// US$ for the GPUs: GPUs × hours × the cluster's price of the GPU type it ran on.
    pub compute_usd: f64,
}

/// One cluster's part in a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterUsage {
    /// Cluster name.
    pub name: String,
    /// Owned or cloud.
    pub tier: Tier,
    /// GPUs the cluster has.
    pub gpus: u64,
    /// GPU-seconds jobs held on it (at their run time on the GPU type they got).
    pub busy_gpu_secs: u64,
}

/// Everything one policy's replay produced; the metrics are computed from it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// Policy name as given on the command line.
    pub policy: String,
    /// One per job, indexed by job id.
    pub outcomes: Vec<Outcome>,
    /// One per topology cluster, in topology order.
    pub clusters: Vec<ClusterUsage>,
    /// Scheduling events the engine processed (arrivals, data arrivals, completions).
    pub events: u64,
    /// GB that crossed region links during the run, counted by the links themselves; equals the
    /// sum of [`Outcome::moved_gb`] (copy accounting conserves bytes).
    pub link_gb: f64,
    /// `meridian`: what crossed the agent protocol (offers, refusals, rounds...).
    pub gateway: Option<GatewayCounts>,
    /// Jobs preempted and the GPU time they lost (all zero without `--preemption`).
    pub preemption: crate::preemption::PreemptionCounts,
}
