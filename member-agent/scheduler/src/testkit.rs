//! Fixtures the scheduler's unit tests share, and (feature `testing`) other crates' tests: an
//! H100 node and a job of a given size.

use std::time::Duration;

use super::{LocalJob, NodeSpec};

/// A node with `gpus` H100s, 64 cores and 512 GiB, of shape `h100x{gpus}`.
pub fn node(name: &str, gpus: u32) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        shape: format!("h100x{gpus}"),
        gpu_type: "h100".into(),
        gpu_memory_gib: 80,
        gpus,
        cpu: 64,
        memory_gib: 512,
        labels: Default::default(),
    }
}

/// A gang of `replicas` × `gpus` (4 cores, 32 GiB each) in `queue`, estimated to run
/// `run_secs`, that really runs that long.
pub fn job(id: &str, queue: &str, replicas: u32, gpus: u32, run_secs: u64) -> LocalJob {
    LocalJob {
        id: id.into(),
        queue: queue.into(),
        priority: 50,
        replicas,
        gpus,
        cpu: 4,
        memory_gib: 32,
        gpu_types: Vec::new(),
        gpu_memory_gib: 0,
        node_selector: Default::default(),
        run_for: Duration::from_secs(run_secs),
        actual: None,
        preemptible: false,
        last_preempted_at: None,
    }
}
