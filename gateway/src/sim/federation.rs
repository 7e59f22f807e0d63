//! Meridian's side of a replay: the federation queue, and the gateway's view of the members.
//!
//! The gateway's view is a [`FederationSnapshot`] built from each member scheduler's own
//! `inventory()` and `pressure()` reports, which are what an agent sends. A member is reported
//! again only when it changed; the others' release times are aged.
//!
//! Each round decides holds and jobs through the same [`crate::placement::Holds`] calls as
//! `server::place_queue`. The queue itself keeps [`crate::queue::FairQueue`]'s order, but is kept
//! from event to event instead of rebuilt and sorted each round as the gateway does: a replay runs
//! a round at every one of hundreds of thousands of events, over queues thousands of jobs long.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::time::Duration;

use meridian_proto::duration::HumanDuration;
use meridian_proto::inventory::QueuePressure;
use meridian_proto::spec::{
    BurstPolicy, DEFAULT_PRIORITY, DataRef, GangSpec, JobSpec, Payload, PlacementRules, Resources, RuntimeSpec,
};

use super::engine::Member;
use super::topology::{SimCluster, Topology};
use super::{SimJob, Workload};
use crate::placement::{ClusterSnapshot, FederationSnapshot, Holds};

/// Meridian's federation queue and its view of the members.
pub(super) struct Gateway {
    pub(super) snapshot: FederationSnapshot,
    /// When each cluster's snapshot was taken.
    pub(super) reported_at: Vec<u64>,
    /// Queued jobs per tenant, oldest first (all simulated jobs share one priority).
    pub(super) queued: Vec<BTreeSet<(u64, u32)>>,
    /// GPUs each tenant holds: bound, in transit or running.
    pub(super) usage: Vec<u64>,
    /// Specs of queued jobs.
    pub(super) specs: HashMap<u32, JobSpec>,
    /// Jobs bound to a cluster whose data is still being copied there, with their spec: the
    /// snapshot keeps their GPUs reserved until they arrive (as the gateway does for offers the
    /// agent has not yet accepted).
    pub(super) in_transit: BTreeMap<u32, (usize, JobSpec)>,
    /// Cluster index by name.
    pub(super) index: HashMap<String, usize>,
    /// Queued jobs, oldest first, to find gangs that have waited long enough to hold a cluster.
    pub(super) by_age: BTreeSet<(u64, u32)>,
    /// Clusters held for long-waiting gangs.
    pub(super) holds: Holds<u32>,
}

impl Gateway {
    pub(super) fn new(topology: &Topology, workload: &Workload, members: &[Member]) -> Self {
        let clusters = topology
            .clusters
            .iter()
            .zip(members)
            .map(|(c, m)| {
                ClusterSnapshot::new(
                    c.info.clone(),
                    m.scheduler.inventory(),
                    m.scheduler.pressure(Duration::ZERO),
                    true,
                )
            })
            .collect();
        Self {
            snapshot: FederationSnapshot::new(clusters, topology.network.clone()),
            reported_at: vec![0; topology.clusters.len()],
            queued: vec![BTreeSet::new(); workload.tenants.len()],
            usage: vec![0; workload.tenants.len()],
            specs: HashMap::new(),
            in_transit: BTreeMap::new(),
            index: topology.clusters.iter().enumerate().map(|(i, c)| (c.info.name.clone(), i)).collect(),
            by_age: BTreeSet::new(),
            holds: Holds::new(topology.clusters.len()),
        }
    }

    pub(super) fn enqueue(&mut self, job: &SimJob, workload: &Workload, burst_after_secs: u64) {
        let tenant = workload.tenants.get(job.tenant as usize).map_or("default", |t| t.name.as_str());
        if let Some(queue) = self.queued.get_mut(job.tenant as usize) {
            queue.insert((job.submit_secs, job.id));
            self.by_age.insert((job.submit_secs, job.id));
            self.specs.insert(job.id, spec_of(job, tenant, burst_after_secs));
        }
    }

    /// A refused offer: the job queues again, and its tenant no longer holds its GPUs.
    pub(super) fn unbind(&mut self, job: &SimJob, workload: &Workload, burst_after_secs: u64) {
        self.in_transit.remove(&job.id);
        if let Some(usage) = self.usage.get_mut(job.tenant as usize) {
            *usage = usage.saturating_sub(job.gpus());
        }
        self.enqueue(job, workload, burst_after_secs);
    }

    /// Takes `job` out of the queue, bound to `cluster`; `in_transit` is the GPU type its offer
    /// pins when its data must first be copied there.
    pub(super) fn bind(&mut self, job: &SimJob, cluster: usize, in_transit: Option<Vec<String>>) {
        if let Some(queue) = self.queued.get_mut(job.tenant as usize) {
            queue.remove(&(job.submit_secs, job.id));
        }
        self.by_age.remove(&(job.submit_secs, job.id));
        self.holds.release(&job.id);
        if let Some(usage) = self.usage.get_mut(job.tenant as usize) {
            *usage += job.gpus();
        }
        if let Some(mut spec) = self.specs.remove(&job.id)
            && let Some(pinned) = in_transit
        {
            spec.gang.resources.gpu_types = pinned;
            self.in_transit.insert(job.id, (cluster, spec));
        }
    }

    /// The next job in the federation queue's order (as [`crate::queue::FairQueue`] yields it):
    /// the tenant holding the fewest GPUs (equal weights; ties by name), then its oldest job not
    /// yet tried in this pass.
    pub(super) fn next_fair(&self, cursors: &mut [Option<(u64, u32)>], done: &mut [bool]) -> Option<u32> {
        loop {
            let tenant = (0..self.queued.len())
                .filter(|&t| !done.get(t).copied().unwrap_or(true))
                .min_by_key(|&t| (self.usage.get(t).copied().unwrap_or(0), t))?;
            let queue = self.queued.get(tenant)?;
            let cursor = cursors.get_mut(tenant)?;
            let next = match *cursor {
                None => queue.iter().next(),
                Some(after) => queue.range((Bound::Excluded(after), Bound::Unbounded)).next(),
            };
            match next {
                Some(&key) => {
                    *cursor = Some(key);
                    return Some(key.1);
                }
                None => {
                    if let Some(d) = done.get_mut(tenant) {
                        *d = true;
                    }
                }
            }
        }
    }

    /// Brings the snapshot up to `now`: clusters that changed report again; the others' release
    /// times move closer by the time that passed.
    pub(super) fn refresh(&mut self, clusters: &[SimCluster], members: &[Member], dirty: &mut [bool], now: u64) {
        for (i, ((cluster, member), snapshot)) in
            clusters.iter().zip(members).zip(self.snapshot.clusters.iter_mut()).enumerate()
        {
            let (Some(dirty), Some(reported_at)) = (dirty.get_mut(i), self.reported_at.get_mut(i)) else { continue };
            if *dirty {
                let at = Duration::from_secs(now);
                *snapshot = ClusterSnapshot::new(
                    cluster.info.clone(),
                    member.scheduler.inventory(),
                    member.scheduler.pressure(at),
                    true,
                );
                for (_, spec) in self.in_transit.values().filter(|(c, _)| *c == i) {
                    snapshot.reserve(spec);
                }
                *dirty = false;
            } else if *reported_at < now {
                age(&mut snapshot.pressure, now - *reported_at);
            }
            *reported_at = now;
        }
    }
}

/// Moves a pressure report `secs` into the future.
fn age(pressure: &mut QueuePressure, secs: u64) {
    for release in &mut pressure.releases {
        release.after_secs = release.after_secs.saturating_sub(secs);
    }
    pressure.estimated_wait_secs = pressure.estimated_wait_secs.saturating_sub(secs);
}

/// Free GPUs per cluster in the snapshot (total and on the emptiest node), to skip jobs that
/// cannot start anywhere without asking placement.
pub(super) struct FreeRoom {
    clusters: Vec<(u64, u32)>,
}

impl FreeRoom {
    pub(super) fn of(snapshot: &FederationSnapshot) -> Self {
        Self { clusters: snapshot.clusters.iter().map(Self::room).collect() }
    }

    pub(super) fn room(cluster: &ClusterSnapshot) -> (u64, u32) {
        let shapes = &cluster.inventory().shapes;
        let total = shapes.iter().map(|s| u64::from(s.gpus_free())).sum();
        let most = shapes.iter().flat_map(|s| s.free.iter().map(|n| n.gpus)).max().unwrap_or(0);
        (total, most)
    }

    pub(super) fn update(&mut self, index: usize, cluster: &ClusterSnapshot) {
        if let Some(slot) = self.clusters.get_mut(index) {
            *slot = Self::room(cluster);
        }
    }

    pub(super) fn any(&self) -> bool {
        self.clusters.iter().any(|&(total, _)| total > 0)
    }

    pub(super) fn might_fit(&self, job: &SimJob) -> bool {
        self.clusters.iter().any(|&(total, most)| total >= job.gpus() && most >= job.gpus_per_replica)
    }
}

/// The job spec a user would have submitted for `job`.
pub fn spec_of(job: &SimJob, tenant: &str, burst_after_secs: u64) -> JobSpec {
    JobSpec {
        name: format!("job-{}", job.id),
        tenant: tenant.to_owned(),
        priority: DEFAULT_PRIORITY,
        labels: BTreeMap::new(),
        idempotency_key: None,
        gang: GangSpec {
            replicas: job.replicas,
            resources: Resources {
                gpus: job.gpus_per_replica,
                gpu_types: job.gpu_type.iter().cloned().collect(),
                gpu_memory_gib: 0,
                cpu: 0,
                memory_gib: 0,
            },
        },
        runtime: RuntimeSpec { estimate: HumanDuration::from_secs(job.duration_secs), limit: None },
        data: job
            .dataset
            .iter()
            .map(|d| DataRef {
                uri: format!("s3://sim/job-{}", job.id),
                size_gib: d.size_gib,
                region: d.region.clone(),
            })
            .collect(),
        placement: PlacementRules {
            burst: BurstPolicy::After { after: HumanDuration::from_secs(burst_after_secs), max_usd_per_hour: None },
            ..PlacementRules::default()
        },
        payload: Payload { image: Some("sim".to_owned()), ..Payload::default() },
    }
}
