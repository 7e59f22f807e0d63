//! How busy each running job's GPUs are: sampled from a [`UtilizationSource`], mapped to jobs
//! through the devices the backend gave them, and averaged over a window for the heartbeat.
//!
//! Two real sources: [`nvml::NvmlUtilization`] (this host's GPUs through NVML, for the builtin
//! backend's process runner) and [`file::FileUtilization`] (a JSON or Prometheus-text file of
//! per-GPU utilisation, as a DCGM or node exporter textfile writes it: how a site without NVML
//! on the agent's host feeds it, and what the tests use). [`window::UsageWindow`] keeps the
//! samples and answers each job's mean.

use std::path::PathBuf;
use std::sync::Arc;

use meridian_proto::duration::HumanDuration;
use serde::{Deserialize, Serialize};

pub mod file;
pub mod nvml;
pub mod window;

pub use window::UsageWindow;

/// Module result type.
pub type Result<T, E = UsageError> = std::result::Result<T, E>;

/// One GPU's utilisation at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSample {
    /// The node the GPU is on; empty when the source does not say (a single-host agent): the
    /// sample then applies to that device id on every node.
    pub node: String,
    /// The device as the backend names it: the NVML index (`"0"`) for whole GPUs, as
    /// `CUDA_VISIBLE_DEVICES` takes it.
    pub gpu: String,
    /// Fraction of the last sample period a kernel ran, 0..=1.
    pub utilization: f64,
}

/// Where GPU utilisation samples come from.
///
/// `sample` blocks (it reads a file or calls NVML); the agent calls it on a blocking thread.
pub trait UtilizationSource: Send + Sync {
    /// Every GPU's utilisation now.
    fn sample(&self) -> Result<Vec<GpuSample>>;
}

/// Why utilisation could not be sampled.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The file source could not read its file.
    #[error("utilization.file `{path}`: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file's content is not what the file source reads.
    #[error("utilization.file `{path}` line {line}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line (1 for JSON errors without a position).
        line: usize,
        /// What was wrong, and what was expected.
        reason: String,
    },
    /// NVML failed.
    #[error("NVML utilisation: {0}")]
    Nvml(#[from] crate::backend::nvml::ProbeError),
    /// The sampling task died.
    #[error("utilisation sampling failed: {0}")]
    Task(String),
}

/// The agent's `utilization:` section: where samples come from, how often, and over how long a
/// job's mean is taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UtilizationConfig {
    /// A JSON or Prometheus-text file of per-GPU utilisation, read at every sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// Read this host's GPUs through NVML (builtin backend, process runner).
    #[serde(default)]
    pub nvml: bool,
    /// How often to sample.
    #[serde(default = "default_interval")]
    pub interval: HumanDuration,
    /// A job's utilisation is the mean of its samples over this long.
    #[serde(default = "default_window")]
    pub window: HumanDuration,
}

fn default_interval() -> HumanDuration {
    HumanDuration::from_secs(10)
}

fn default_window() -> HumanDuration {
    HumanDuration::from_secs(60)
}

impl UtilizationConfig {
    /// Appends what is wrong to `problems`, each naming its field.
    pub fn check(&self, problems: &mut Vec<String>) {
        match (&self.file, self.nvml) {
            (Some(_), true) => problems.push("utilization: set either `file` or `nvml: true`, not both".into()),
            (None, false) => problems.push("utilization: set `file: PATH` or `nvml: true`".into()),
            (Some(path), false) if path.as_os_str().is_empty() => {
                problems.push("utilization.file: must name a file".into())
            }
            _ => {}
        }
        if self.interval.0.is_zero() {
            problems.push("utilization.interval: must be longer than 0s".into());
        }
        if self.window.0 < self.interval.0 {
            problems.push(format!(
                "utilization.window: {} is shorter than utilization.interval ({}); a window holds at least one sample",
                self.window, self.interval
            ));
        }
    }
}

/// What the agent's event loop needs to sample: the source and its timing.
#[derive(Clone)]
pub struct Sampling {
    /// The source.
    pub source: Arc<dyn UtilizationSource>,
    /// How often to sample.
    pub interval: std::time::Duration,
    /// How long a job's mean reaches back.
    pub window: std::time::Duration,
}

impl std::fmt::Debug for Sampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampling").field("interval", &self.interval).field("window", &self.window).finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn config(text: &str) -> UtilizationConfig {
        meridian_proto::config_file::parse_yaml(text, std::path::Path::new("agent.yaml")).unwrap()
    }

    /// What every source must do: fractions 0..=1 for named devices, the same answer for the
    /// same state (sampling has no side effects), and `gpus` samples for this fixture.
    fn conformance(source: &dyn UtilizationSource, gpus: usize) {
        let samples = source.sample().unwrap();
        assert_eq!(samples.len(), gpus, "{samples:?}");
        for sample in &samples {
            assert!((0.0..=1.0).contains(&sample.utilization), "{sample:?}");
            assert!(!sample.gpu.is_empty(), "{sample:?}");
        }
        assert_eq!(source.sample().unwrap(), samples, "sampling twice reads the same state");
    }

    #[test]
    fn every_source_passes_the_conformance_checks() {
        let dir = tempfile::tempdir().unwrap();
        let prom = dir.path().join("gpu.prom");
        std::fs::write(
            &prom,
            "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",Hostname=\"n\"} 100\nDCGM_FI_DEV_GPU_UTIL{gpu=\"1\"} 0\n",
        )
        .unwrap();
        conformance(&file::FileUtilization::new(&prom), 2);
        let json = dir.path().join("gpu.json");
        std::fs::write(&json, r#"{"gpus": [{"node": "n", "gpu": 0, "utilization": 0.5}]}"#).unwrap();
        conformance(&file::FileUtilization::new(&json), 1);
        struct Recorded;
        impl crate::backend::nvml::GpuProbe for Recorded {
            fn read(&self) -> Result<Vec<crate::backend::nvml::GpuReading>, crate::backend::nvml::ProbeError> {
                Ok((0..2)
                    .map(|index| crate::backend::nvml::GpuReading {
                        index,
                        name: "NVIDIA L4".into(),
                        uuid: format!("GPU-{index}"),
                        memory_total_bytes: 1 << 34,
                        mig_enabled: false,
                        mig_instances: Vec::new(),
                        utilization_percent: Some(index * 100),
                    })
                    .collect())
            }
        }
        let devices = [("n".to_string(), vec!["0".to_string(), "1".to_string()])];
        conformance(&nvml::NvmlUtilization::with_probe(Box::new(Recorded), devices), 2);
    }

    #[test]
    fn defaults_sample_every_ten_seconds_over_a_minute() {
        let c = config("file: /run/gpu.prom\n");
        assert_eq!(c.interval.0.as_secs(), 10);
        assert_eq!(c.window.0.as_secs(), 60);
        let mut problems = Vec::new();
        c.check(&mut problems);
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn a_config_names_exactly_one_source_and_a_window_no_shorter_than_the_interval() {
        let mut problems = Vec::new();
        config("nvml: true\nfile: x\ninterval: 30s\nwindow: 10s\n").check(&mut problems);
        assert!(problems.iter().any(|p| p.contains("not both")), "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("utilization.window")), "{problems:?}");
        let mut problems = Vec::new();
        config("interval: 0s\n").check(&mut problems);
        assert!(problems.iter().any(|p| p.contains("`file: PATH` or `nvml: true`")), "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("utilization.interval")), "{problems:?}");
    }
}
