//! What the builtin scheduler reports to the gateway: inventory and queue pressure.

use std::time::Duration;

use meridian_proto::inventory::{GpuRelease, Inventory, NodeShape, QueueLoad, QueuePressure};

use super::BuiltinScheduler;

/// Most entries in a pressure report's release profile; more are merged so reports stay small
/// however many jobs run.
pub const MAX_RELEASE_BUCKETS: usize = 32;

impl BuiltinScheduler {
    /// Nodes grouped by shape (shapes in order of first declaration), one [`NodeFree`] per node
    /// in declaration order.
    ///
    /// [`NodeFree`]: meridian_proto::inventory::NodeFree
    pub fn inventory(&self) -> Inventory {
        let shapes = self
            .shapes
            .iter()
            .filter_map(|(name, members)| {
                let first = &self.nodes.get(*members.first()?)?.spec;
                Some(NodeShape {
                    name: name.clone(),
                    gpu_type: first.gpu_type.clone(),
                    gpu_memory_gib: first.gpu_memory_gib,
                    gpus_per_node: first.gpus,
                    cpu_per_node: first.cpu,
                    memory_gib_per_node: first.memory_gib,
                    free: members.iter().filter_map(|&i| self.nodes.get(i)).map(|n| n.free).collect(),
                    labels: first.labels.clone(),
                })
            })
            .collect();
        Inventory { shapes }
    }

    /// [`inventory`](Self::inventory) as the agent reports it to the gateway: while a sibling
    /// copy holds the member's reservation, a node held for it shows only its spare (see
    /// `free_for_offers`), so the gateway offers nothing the member would have to decline to
    /// keep it.
    pub fn inventory_for_offers(&self) -> Inventory {
        let mut inventory = self.inventory();
        if self.reservation.as_ref().is_some_and(|held| self.copies.contains(&held.job_id)) {
            for ((_, members), shape) in self.shapes.iter().zip(&mut inventory.shapes) {
                for (slot, &i) in shape.free.iter_mut().zip(members) {
                    *slot = self.free_for_offers(i);
                }
            }
        }
        inventory
    }

    /// How busy the queues are at `now`: per-queue load, when running jobs give GPUs back
    /// (ascending, at most [`MAX_RELEASE_BUCKETS`] entries), and an estimated wait for a new
    /// 1-GPU job.
    ///
    /// Merged release entries are reported at the latest time of what they merge, so the profile
    /// never promises GPUs earlier than they come back.
    ///
    /// The wait estimate assumes a new job queues behind every pending GPU in every queue (fair
    /// share may let it go sooner): it is the time until free GPUs plus releases cover the
    /// pending demand plus one GPU. When running jobs alone cannot cover it, the rest of the
    /// pending work (its GPU-seconds, proportionally) is spread over the whole cluster.
    pub fn pressure(&self, now: Duration) -> QueuePressure {
        let queues = self
            .queues
            .iter()
            .map(|q| QueueLoad {
                queue: q.name.clone(),
                weight: q.weight,
                pending_jobs: saturate(q.pending.len() as u64),
                pending_gpus: saturate(q.pending_gpus),
                running_gpus: saturate(q.used.gpus),
            })
            .collect();
        let exact = self.exact_releases(now);
        let estimated_wait_secs = self.estimated_wait_secs(&exact);
        QueuePressure { queues, releases: bucket(exact), estimated_wait_secs, preemptible: self.preemptible_gpus() }
    }

    /// Releases per whole second from `now` (rounded up), ascending, one entry per second.
    ///
    /// Each running job releases after its [expected remaining
    /// time](super::RunningJob::expected_remaining): the rest of its estimate, or for an overdue
    /// job the remaining-time model, never "now". Only what the member believes is used, never a
    /// job's true end.
    pub(super) fn exact_releases(&self, now: Duration) -> Vec<GpuRelease> {
        self.releases.at(now)
    }

    fn estimated_wait_secs(&self, releases: &[GpuRelease]) -> u64 {
        let pending_gpus: u64 = self.queues.iter().map(|q| q.pending_gpus).sum();
        let needed = pending_gpus.saturating_add(1);
        let mut available = self.free_gpus;
        if available >= needed {
            return 0;
        }
        for release in releases {
            available = available.saturating_add(u64::from(release.gpus));
            if available >= needed {
                return release.after_secs;
            }
        }
        // Running jobs all done and demand is left: that leftover's share of the pending
        // GPU-seconds, run on the whole cluster.
        let last = releases.last().map_or(0, |r| r.after_secs);
        let pending_gpu_secs: u64 = self.queues.iter().map(|q| q.pending_gpu_secs).sum();
        let deficit = needed - available.min(needed);
        let leftover_work = pending_gpu_secs as f64 * (deficit as f64 / needed as f64);
        let extra = leftover_work / self.totals.gpus.max(1) as f64;
        last.saturating_add(extra.ceil() as u64)
    }
}

/// Merges `exact` (ascending) into at most [`MAX_RELEASE_BUCKETS`] consecutive groups of nearly
/// equal entry counts, each reported at its last time with its GPUs summed.
fn bucket(exact: Vec<GpuRelease>) -> Vec<GpuRelease> {
    if exact.len() <= MAX_RELEASE_BUCKETS {
        return exact;
    }
    let len = exact.len();
    (0..MAX_RELEASE_BUCKETS)
        .filter_map(|b| {
            let group = exact.get(b * len / MAX_RELEASE_BUCKETS..(b + 1) * len / MAX_RELEASE_BUCKETS)?;
            let last = group.last()?;
            Some(GpuRelease {
                after_secs: last.after_secs,
                gpus: group.iter().fold(0u32, |s, r| s.saturating_add(r.gpus)),
            })
        })
        .collect()
}

fn saturate(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::{LocalJob, NodeSpec, QueueSpec, testkit};
    use super::*;

    fn scheduler() -> BuiltinScheduler {
        let node = |name: &str, shape: &str, gpus| NodeSpec {
            shape: shape.into(),
            gpu_type: if shape == "dgx" { "h100".into() } else { "l4".into() },
            ..testkit::node(name, gpus)
        };
        BuiltinScheduler::new(
            vec![node("a", "dgx", 8), node("b", "small", 2), node("c", "dgx", 8)],
            vec![QueueSpec::new("default", 1.0), QueueSpec::new("research", 3.0)],
        )
        .unwrap()
    }

    fn job(id: &str, queue: &str, replicas: u32, gpus: u32, secs: u64) -> LocalJob {
        LocalJob { cpu: 1, memory_gib: 4, ..testkit::job(id, queue, replicas, gpus, secs) }
    }

    #[test]
    fn a_node_held_for_the_reservation_reports_only_its_spare_and_a_copy_is_never_preempted_for() {
        let mut s = scheduler();
        s.start_now(job("hog", "default", 1, 6, 100), Duration::ZERO).unwrap();
        s.start_now(job("other", "default", 1, 8, 1_000), Duration::ZERO).unwrap();
        // A copy of a gang of two whole dgx nodes waits for hog (100 s) and for `other`: it
        // holds the reservation on a and c at 1,000 s.
        s.submit_copy(job("copy", "default", 2, 8, 100), Duration::from_secs(1)).unwrap();
        assert!(s.schedule(Duration::from_secs(1)).is_empty());
        assert!(s.is_pending_copy("copy"));
        assert_eq!(s.reservation().map(|r| r.job_id), Some("copy".to_string()));
        // a has 2 GPUs free, but every one of them is the gang's at 1,000 s: none is offered.
        let dgx = &s.inventory_for_offers().shapes[0];
        assert_eq!(dgx.free.iter().map(|f| f.gpus).collect::<Vec<_>>(), [0, 0]);
        assert_eq!(s.inventory().shapes[0].free.iter().map(|f| f.gpus).collect::<Vec<_>>(), [2, 0]);
        assert!(s.preempt(Duration::from_secs(2)).is_empty(), "nothing preempts for a copy");
        // Once it starts (takes its nodes), it is no longer a pending copy.
        s.cancel("hog");
        s.cancel("other");
        let started = s.schedule(Duration::from_secs(3));
        assert_eq!(started.iter().map(|s| s.job_id.as_str()).collect::<Vec<_>>(), ["copy"]);
        assert!(!s.is_pending_copy("copy"));
    }

    #[test]
    fn inventory_groups_nodes_by_shape_in_declaration_order() {
        let mut s = scheduler();
        s.start_now(job("j", "default", 1, 8, 60), Duration::ZERO).unwrap();
        let inventory = s.inventory();
        let names: Vec<&str> = inventory.shapes.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["dgx", "small"]);
        assert_eq!(inventory.shapes[0].free.len(), 2);
        assert_eq!(inventory.gpus_total(), 18);
        assert_eq!(inventory.gpus_free(), 10);
        // The 8-GPU replica took a whole dgx node; which one is fixed (the first, best fit tie).
        assert_eq!(inventory.shapes[0].free[0].gpus, 0);
    }

    #[test]
    fn pressure_reports_queue_load_and_ascending_releases() {
        let mut s = scheduler();
        let t0 = Duration::from_secs(100);
        s.start_now(job("long", "default", 1, 8, 600), t0).unwrap();
        s.start_now(job("short", "research", 1, 2, 30), t0).unwrap();
        s.submit(job("waiting", "research", 2, 8, 100), t0).unwrap();
        let pressure = s.pressure(t0 + Duration::from_millis(500));
        assert_eq!(pressure.queues[0].running_gpus, 8);
        assert_eq!(pressure.queues[1].pending_gpus, 16);
        assert_eq!(pressure.pending_jobs(), 1);
        assert_eq!(
            pressure.releases,
            vec![GpuRelease { after_secs: 30, gpus: 2 }, GpuRelease { after_secs: 600, gpus: 8 }]
        );
        // 8 free now + 2 + 8 released covers the 16 pending GPUs plus one only after 600 s.
        assert_eq!(pressure.estimated_wait_secs, 600);
    }

    #[test]
    fn releases_and_waits_follow_the_estimate_and_completion_follows_the_truth() {
        let mut s = scheduler();
        let mut longer = job("longer", "default", 1, 8, 100);
        longer.actual = Some(Duration::from_secs(400));
        let mut shorter = job("shorter", "default", 1, 8, 300);
        shorter.actual = Some(Duration::from_secs(50));
        s.start_now(longer, Duration::ZERO).unwrap();
        s.start_now(shorter, Duration::ZERO).unwrap();
        s.submit(job("waiting", "research", 1, 8, 60), Duration::ZERO).unwrap();
        let pressure = s.pressure(Duration::ZERO);
        // The member reports what it believes: 100 s and 300 s, never the true 400 s and 50 s.
        assert_eq!(
            pressure.releases,
            vec![GpuRelease { after_secs: 100, gpus: 8 }, GpuRelease { after_secs: 300, gpus: 8 }]
        );
        // 2 free + 8 (after 100 s) covers the 8 pending GPUs plus one.
        assert_eq!(pressure.estimated_wait_secs, 100);
        // Jobs end when they really end.
        assert_eq!(s.next_completion(), Some(Duration::from_secs(50)));
        assert_eq!(s.complete_due(Duration::from_secs(100)), ["shorter"]);
        assert_eq!(s.running().map(|r| r.job.id.as_str()).collect::<Vec<_>>(), ["longer"]);
    }

    #[test]
    fn an_overdue_job_is_reported_to_free_its_gpus_later_not_now() {
        let mut s = scheduler();
        let mut late = job("late", "default", 1, 8, 100);
        late.actual = Some(Duration::from_secs(1_000));
        s.start_now(late, Duration::ZERO).unwrap();
        s.submit(job("waiting", "research", 2, 8, 60), Duration::ZERO).unwrap();
        // At 300 s the job is 200 s past its estimate: expected to run on for half its age.
        let now = Duration::from_secs(300);
        assert!(s.running().all(|r| r.is_overdue(now)));
        let pressure = s.pressure(now);
        assert_eq!(pressure.releases, vec![GpuRelease { after_secs: 150, gpus: 8 }]);
        assert!(pressure.estimated_wait_secs >= 150, "{}", pressure.estimated_wait_secs);
        // Just past a short estimate, the floor applies.
        let mut s = scheduler();
        let mut brief = job("brief", "default", 1, 8, 5);
        brief.actual = Some(Duration::from_secs(1_000));
        s.start_now(brief, Duration::ZERO).unwrap();
        let releases = s.pressure(Duration::from_secs(6)).releases;
        assert_eq!(releases, vec![GpuRelease { after_secs: crate::OVERDUE_FLOOR.as_secs(), gpus: 8 }]);
    }

    #[test]
    fn idle_cluster_has_no_wait() {
        assert_eq!(scheduler().pressure(Duration::ZERO).estimated_wait_secs, 0);
    }

    #[test]
    fn release_profile_is_capped_and_never_reports_gpus_early() {
        let exact: Vec<GpuRelease> = (1..=100).map(|s| GpuRelease { after_secs: s, gpus: 1 }).collect();
        let merged = bucket(exact);
        assert_eq!(merged.len(), MAX_RELEASE_BUCKETS);
        assert_eq!(merged.iter().map(|r| r.gpus).sum::<u32>(), 100);
        assert!(merged.windows(2).all(|w| w[0].after_secs < w[1].after_secs));
        assert_eq!(merged.last().map(|r| r.after_secs), Some(100));
        assert_eq!(merged[0], GpuRelease { after_secs: 3, gpus: 3 });
    }
}
