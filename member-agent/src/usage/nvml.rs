//! This host's GPUs' utilisation through NVML, for the builtin backend's process runner: NVML
//! indices are the device ids the runner hands out in `CUDA_VISIBLE_DEVICES`, so each sample
//! names the node whose device table holds that index.
//!
//! Whole GPUs only: NVML gives no utilisation for a MIG instance, so jobs on MIG slices have no
//! samples (their usage stays unknown).

use std::collections::BTreeMap;

use super::{GpuSample, Result, UtilizationSource};
use crate::backend::nvml::{GpuProbe, GpuReading, NvmlProbe};

/// [`UtilizationSource`] over NVML (or any [`GpuProbe`]).
pub struct NvmlUtilization {
    probe: Box<dyn GpuProbe + Send + Sync>,
    /// Device id → node, from the process runner's device table.
    nodes: BTreeMap<String, String>,
}

impl NvmlUtilization {
    /// Opens NVML; fails cleanly where there is no driver. `devices` lists each node's device
    /// ids, as the process runner's device table has them.
    pub fn init(devices: impl IntoIterator<Item = (String, Vec<String>)>) -> Result<Self> {
        Ok(Self::with_probe(Box::new(NvmlProbe::init()?), devices))
    }

    /// The same over another probe (tests use recorded readings).
    pub fn with_probe(
        probe: Box<dyn GpuProbe + Send + Sync>,
        devices: impl IntoIterator<Item = (String, Vec<String>)>,
    ) -> Self {
        let nodes =
            devices.into_iter().flat_map(|(node, ids)| ids.into_iter().map(move |id| (id, node.clone()))).collect();
        Self { probe, nodes }
    }
}

impl UtilizationSource for NvmlUtilization {
    fn sample(&self) -> Result<Vec<GpuSample>> {
        Ok(samples(&self.probe.read()?, &self.nodes))
    }
}

/// One sample per whole GPU that NVML measured and the device table knows; MIG GPUs and GPUs
/// without a reading are left out.
pub fn samples(readings: &[GpuReading], nodes: &BTreeMap<String, String>) -> Vec<GpuSample> {
    readings
        .iter()
        .filter(|gpu| !gpu.mig_enabled)
        .filter_map(|gpu| {
            let id = gpu.index.to_string();
            let node = nodes.get(&id)?.clone();
            let percent = gpu.utilization_percent?;
            Some(GpuSample { node, gpu: id, utilization: f64::from(percent.min(100)) / 100.0 })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::backend::nvml::ProbeError;

    fn reading(index: u32, utilization_percent: Option<u32>, mig_enabled: bool) -> GpuReading {
        GpuReading {
            index,
            name: "NVIDIA L4".into(),
            uuid: format!("GPU-{index}"),
            memory_total_bytes: 23034 << 20,
            mig_enabled,
            mig_instances: Vec::new(),
            utilization_percent,
        }
    }

    struct Recorded(Vec<GpuReading>);

    impl GpuProbe for Recorded {
        fn read(&self) -> Result<Vec<GpuReading>, ProbeError> {
            Ok(self.0.clone())
        }
    }

    #[test]
    fn nvml_indices_map_to_the_node_that_holds_them_in_the_device_table() {
        let readings = vec![
            reading(0, Some(3), false),
            reading(1, Some(95), false),
            reading(2, None, false),
            reading(3, Some(50), true),
            reading(9, Some(10), false),
        ];
        let source = NvmlUtilization::with_probe(
            Box::new(Recorded(readings)),
            [
                ("a".to_string(), vec!["0".to_string(), "1".to_string()]),
                ("b".to_string(), vec!["2".into(), "3".into()]),
            ],
        );
        let samples = source.sample().unwrap();
        assert_eq!(
            samples,
            vec![
                GpuSample { node: "a".into(), gpu: "0".into(), utilization: 0.03 },
                GpuSample { node: "a".into(), gpu: "1".into(), utilization: 0.95 },
            ],
            "no reading, MIG mode and unknown devices are left out"
        );
    }

    #[test]
    fn without_a_driver_init_fails_with_an_error_rather_than_a_panic() {
        if NvmlProbe::init().is_ok() {
            return; // A host with a driver: nothing to show here.
        }
        let err = NvmlUtilization::init(Vec::new()).err().unwrap();
        assert!(err.to_string().contains("NVML"), "{err}");
    }
}
