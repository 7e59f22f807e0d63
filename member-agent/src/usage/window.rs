//! Each running job's utilisation samples over a sliding window, and their mean for the
//! heartbeat.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use meridian_proto::protocol::GpuUsage;
use tokio::time::Instant;

use super::GpuSample;

/// A running job as the window needs it.
#[derive(Debug, Clone, Copy)]
pub struct RunningJob<'a> {
    /// The job.
    pub job_id: &'a str,
    /// Its binding; a new binding starts a new window.
    pub fencing_token: u64,
    /// Node of each replica (from its report).
    pub nodes: &'a [String],
    /// The devices the backend gave it, (node, device ids) per replica; None when the backend
    /// does not name devices (the simulated runner, Slurm, Kubernetes): then every sampled GPU
    /// of its nodes counts, which is right for jobs that hold whole nodes.
    pub devices: Option<&'a [(String, Vec<String>)]>,
}

/// Per-job means of the job's GPUs, one per sample, within the window.
#[derive(Debug)]
pub struct UsageWindow {
    window: Duration,
    jobs: HashMap<(String, u64), VecDeque<(Instant, f64)>>,
}

impl UsageWindow {
    /// An empty window reaching `window` back.
    pub fn new(window: Duration) -> Self {
        Self { window, jobs: HashMap::new() }
    }

    /// Adds one round of `samples` at `now` for every job in `running`; jobs no longer running
    /// are forgotten. A job none of whose GPUs was sampled gets nothing this round.
    pub fn record<'a>(
        &mut self,
        now: Instant,
        samples: &[GpuSample],
        running: impl IntoIterator<Item = RunningJob<'a>>,
    ) {
        let by_gpu: HashMap<(&str, &str), f64> =
            samples.iter().map(|s| ((s.node.as_str(), s.gpu.as_str()), s.utilization)).collect();
        let lookup = |node: &str, gpu: &str| by_gpu.get(&(node, gpu)).or_else(|| by_gpu.get(&("", gpu))).copied();
        let mut seen = Vec::new();
        for job in running {
            let key = (job.job_id.to_string(), job.fencing_token);
            let values: Vec<f64> = match job.devices {
                Some(replicas) => {
                    replicas.iter().flat_map(|(node, ids)| ids.iter().filter_map(|id| lookup(node, id))).collect()
                }
                None => samples
                    .iter()
                    .filter(|s| !s.node.is_empty() && job.nodes.contains(&s.node))
                    .map(|s| s.utilization)
                    .collect(),
            };
            if !values.is_empty() {
                let mean = values.iter().sum::<f64>() / values.len() as f64;
                let entries = self.jobs.entry(key.clone()).or_default();
                entries.push_back((now, mean));
                prune(entries, now, self.window);
            }
            seen.push(key);
        }
        self.jobs.retain(|key, _| seen.contains(key));
    }

    /// The mean of (`job_id`, `fencing_token`)'s samples within the window at `now`, or None
    /// when it has none.
    pub fn usage(&mut self, job_id: &str, fencing_token: u64, now: Instant) -> Option<GpuUsage> {
        let entries = self.jobs.get_mut(&(job_id.to_string(), fencing_token))?;
        prune(entries, now, self.window);
        let (oldest, _) = *entries.front()?;
        let samples = u32::try_from(entries.len()).unwrap_or(u32::MAX);
        let mean = entries.iter().map(|(_, v)| v).sum::<f64>() / entries.len() as f64;
        Some(GpuUsage { gpu_utilization: mean.clamp(0.0, 1.0), window: now.saturating_duration_since(oldest), samples })
    }
}

fn prune(entries: &mut VecDeque<(Instant, f64)>, now: Instant, window: Duration) {
    while entries.front().is_some_and(|(at, _)| now.saturating_duration_since(*at) > window) {
        entries.pop_front();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn sample(node: &str, gpu: &str, utilization: f64) -> GpuSample {
        GpuSample { node: node.into(), gpu: gpu.into(), utilization }
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_gets_the_mean_of_its_own_devices_over_the_window() {
        let mut window = UsageWindow::new(Duration::from_secs(60));
        let nodes = vec!["n0".to_string()];
        let devices = vec![("n0".to_string(), vec!["1".to_string(), "2".to_string()])];
        let job = RunningJob { job_id: "j", fencing_token: 1, nodes: &nodes, devices: Some(&devices) };
        let t0 = Instant::now();
        let round = |a: f64, b: f64| vec![sample("n0", "0", 1.0), sample("n0", "1", a), sample("n0", "2", b)];
        window.record(t0, &round(0.0, 0.2), [job]);
        window.record(t0 + Duration::from_secs(30), &round(0.4, 0.6), [job]);
        let usage = window.usage("j", 1, t0 + Duration::from_secs(30)).unwrap();
        assert!((usage.gpu_utilization - 0.3).abs() < 1e-9, "{usage:?}");
        assert_eq!((usage.samples, usage.window), (2, Duration::from_secs(30)));
        // The first round falls out of the window.
        let later = window.usage("j", 1, t0 + Duration::from_secs(75)).unwrap();
        assert!((later.gpu_utilization - 0.5).abs() < 1e-9, "{later:?}");
        assert_eq!(later.samples, 1);
        assert_eq!(window.usage("j", 1, t0 + Duration::from_secs(200)), None, "no sample left");
        assert_eq!(window.usage("j", 2, t0), None, "another binding has its own window");
    }

    #[tokio::test(start_paused = true)]
    async fn without_devices_every_sampled_gpu_of_the_jobs_nodes_counts() {
        let mut window = UsageWindow::new(Duration::from_secs(60));
        let nodes = vec!["n1".to_string()];
        let job = RunningJob { job_id: "j", fencing_token: 1, nodes: &nodes, devices: None };
        let now = Instant::now();
        window.record(now, &[sample("n0", "0", 0.9), sample("n1", "0", 0.1), sample("n1", "1", 0.3)], [job]);
        let usage = window.usage("j", 1, now).unwrap();
        assert!((usage.gpu_utilization - 0.2).abs() < 1e-9, "{usage:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn samples_without_a_node_match_the_device_on_any_node_and_finished_jobs_are_forgotten() {
        let mut window = UsageWindow::new(Duration::from_secs(60));
        let nodes = vec!["n0".to_string()];
        let devices = vec![("n0".to_string(), vec!["0".to_string()])];
        let job = RunningJob { job_id: "j", fencing_token: 1, nodes: &nodes, devices: Some(&devices) };
        let now = Instant::now();
        window.record(now, &[sample("", "0", 0.02)], [job]);
        assert_eq!(window.usage("j", 1, now).map(|u| u.gpu_utilization), Some(0.02));
        window.record(now, &[sample("", "0", 0.02)], []);
        assert_eq!(window.usage("j", 1, now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_job_whose_gpus_were_not_sampled_has_no_usage() {
        let mut window = UsageWindow::new(Duration::from_secs(60));
        let nodes = vec!["n0".to_string()];
        let devices = vec![("n0".to_string(), vec!["3".to_string()])];
        let job = RunningJob { job_id: "j", fencing_token: 1, nodes: &nodes, devices: Some(&devices) };
        window.record(Instant::now(), &[sample("n0", "0", 0.5)], [job]);
        assert_eq!(window.usage("j", 1, Instant::now()), None);
    }
}
