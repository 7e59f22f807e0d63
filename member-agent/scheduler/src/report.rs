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
        QueuePressure { queues, releases: bucket(exact), estimated_wait_secs }
    }

    /// Releases per whole second from `now` (rounded up), ascending, one entry per second.
    fn exact_releases(&self, now: Duration) -> Vec<GpuRelease> {
        let mut releases: Vec<GpuRelease> = Vec::new();
        // `completions` is ordered by end time, so the output comes out ascending.
        for (ends_at, id) in &self.completions {
            let Some(running) = self.running.get(id) else { continue };
            let after_secs = ceil_secs(ends_at.saturating_sub(now));
            let gpus = saturate(running.view.job.total_gpus());
            match releases.last_mut() {
                Some(last) if last.after_secs == after_secs => last.gpus = last.gpus.saturating_add(gpus),
                _ => releases.push(GpuRelease { after_secs, gpus }),
            }
        }
        releases
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

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

fn saturate(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
// Tests may panic on a broken expectation; that is how they fail.
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::{LocalJob, NodeSpec, QueueSpec};
    use super::*;

    fn scheduler() -> BuiltinScheduler {
        let node = |name: &str, shape: &str, gpus| NodeSpec {
            name: name.into(),
            shape: shape.into(),
            gpu_type: if shape == "dgx" { "h100".into() } else { "l4".into() },
            gpu_memory_gib: 80,
            gpus,
            cpu: 64,
            memory_gib: 512,
            labels: Default::default(),
        };
        BuiltinScheduler::new(
            vec![node("a", "dgx", 8), node("b", "small", 2), node("c", "dgx", 8)],
            vec![QueueSpec::new("default", 1.0), QueueSpec::new("research", 3.0)],
        )
        .unwrap()
    }

    fn job(id: &str, queue: &str, replicas: u32, gpus: u32, secs: u64) -> LocalJob {
        LocalJob {
            id: id.into(),
            queue: queue.into(),
            priority: 50,
            replicas,
            gpus,
            cpu: 1,
            memory_gib: 4,
            gpu_types: Vec::new(),
            gpu_memory_gib: 0,
            node_selector: Default::default(),
            run_for: Duration::from_secs(secs),
        }
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
