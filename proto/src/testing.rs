//! Test fixtures shared by every crate's unit tests, benches and end-to-end tests (feature
//! `testing`): one owned cluster, one DGX-style node shape, a hello, a job report and a parsed
//! job spec. Tests that need a different value change one field of these rather than writing the
//! whole record again.

use std::collections::BTreeMap;

use crate::gpu::GpuCatalog;
use crate::inventory::{BackendKind, ClusterInfo, Inventory, NodeFree, NodeShape, Tier};
use crate::job::JobState;
use crate::protocol::{AgentEvent, AgentHello, JobReport};
use crate::spec::JobSpec;
use crate::validate::parse_job_spec;

/// A one-replica, 8-GPU job spec in tenant `t` (YAML), the smallest job most tests need.
pub const JOB: &str = "name: j\ntenant: t\ngang: {replicas: 1, resources: {gpus: 8}}\npayload: {command: [x]}\n";

/// Parses `text` as a job spec with the default GPU catalog; panics on invalid text (tests only).
pub fn spec(text: &str) -> JobSpec {
    match parse_job_spec(text, &GpuCatalog::default()) {
        Ok(spec) => spec,
        Err(error) => panic!("test job spec does not parse: {error}\n{text}"),
    }
}

/// A builtin, owned cluster in `us-east` pricing H100s at US$2 an hour.
pub fn cluster_info(name: &str) -> ClusterInfo {
    ClusterInfo {
        name: name.into(),
        region: "us-east".into(),
        tier: Tier::Owned,
        backend: BackendKind::Builtin,
        prices: BTreeMap::from([("h100".to_string(), 2.0)]),
        supports_containers: true,
        supports_bare_commands: true,
        labels: Default::default(),
    }
}

/// The hello of agent instance `instance` of cluster `name` ([`cluster_info`]).
pub fn hello(name: &str, instance: &str) -> AgentHello {
    AgentHello { info: cluster_info(name), instance_id: instance.into(), agent_version: "test".into() }
}

/// What one node of a DGX-style shape has free when `gpus` of its 8 GPUs are free (and all its
/// CPUs and memory).
pub fn node_free(gpus: u32) -> NodeFree {
    NodeFree { gpus, cpu: 96, memory_gib: 1024 }
}

/// A DGX-style shape `dgx` (8 × H100 80 GiB, 96 CPUs, 1 TiB) with one node per entry of
/// `free_gpus`, each with that many GPUs free.
pub fn dgx_shape(free_gpus: &[u32]) -> NodeShape {
    NodeShape {
        name: "dgx".into(),
        gpu_type: "h100".into(),
        gpu_memory_gib: 80,
        gpus_per_node: 8,
        cpu_per_node: 96,
        memory_gib_per_node: 1024,
        free: free_gpus.iter().map(|&gpus| node_free(gpus)).collect(),
        labels: Default::default(),
    }
}

/// An inventory of one [`dgx_shape`].
pub fn inventory(free_gpus: &[u32]) -> Inventory {
    Inventory { shapes: vec![dgx_shape(free_gpus)] }
}

/// An agent's inventory event of one [`dgx_shape`].
pub fn inventory_event(free_gpus: &[u32]) -> AgentEvent {
    AgentEvent::Inventory(inventory(free_gpus))
}

/// A report of `job` (fencing token `token`) in `state` on node `dgx-0`, with no message.
pub fn report(job: &str, token: u64, state: JobState) -> JobReport {
    JobReport {
        job_id: job.into(),
        fencing_token: token,
        state,
        message: String::new(),
        nodes: vec!["dgx-0".into()],
        requeue: false,
        preempted: false,
        usage: None,
    }
}
