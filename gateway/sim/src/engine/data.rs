//! Copying a job's dataset to the region of the cluster it was sent to over the shared links
//! (`links.rs`): a copy's predicted time and cost, and the GB and US$ it is booked for.

use super::Replay;
use crate::SimJob;

impl Replay<'_> {
    /// Starts copying `job`'s data to `cluster`'s region over the shared link; false (and nothing
    /// to copy) when the data is already there. The copy lands as an event of its own.
    pub(super) fn start_copy(&mut self, job: &SimJob, cluster: usize, now: u64) -> bool {
        let (Some(data), Some(target)) = (&job.dataset, self.topology.clusters.get(cluster)) else { return false };
        if data.region == target.info.region {
            return false;
        }
        let network = &self.topology.network;
        let copy = network.copy(&data.region, &target.info.region, data.size_gib);
        let gbps = network.gbps(&data.region, &target.info.region);
        self.links.start(job.id, cluster, (&data.region, &target.info.region), copy.gb, gbps, now);
        true
    }

    /// Books a copy made for `job` that landed or was withdrawn: into its outcome when it has
    /// started, else kept until it does.
    pub(super) fn book_copy(&mut self, job: u32, gb: f64, usd: f64) {
        if let Some(Some(outcome)) = self.outcomes.get_mut(job as usize) {
            outcome.moved_gb += gb;
            outcome.egress_usd += usd;
            return;
        }
        let entry = self.copied.entry(job).or_default();
        entry.0 += gb;
        entry.1 += usd;
    }

    /// (seconds, GB, US$) to copy the job's data to the cluster's region: the seconds are a
    /// prediction (a fair share of the link as loaded now, plus this copy), the GB and US$ those
    /// of the whole copy. Nothing when the data is already there.
    pub(super) fn transfer(&self, job: &SimJob, cluster: usize) -> (u64, f64, f64) {
        let (Some(data), Some(target)) = (&job.dataset, self.topology.clusters.get(cluster)) else {
            return (0, 0.0, 0.0);
        };
        if data.region == target.info.region {
            return (0, 0.0, 0.0);
        }
        let network = &self.topology.network;
        let copy = network.copy(&data.region, &target.info.region, data.size_gib);
        let gbps = network.gbps(&data.region, &target.info.region);
        let secs = self.links.predict_secs((&data.region, &target.info.region), copy.gb, gbps);
        (secs, copy.gb, copy.usd)
    }
}
