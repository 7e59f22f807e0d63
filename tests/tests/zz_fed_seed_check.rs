//! Scratch check (to be deleted): the fixture-built seeds equal the checked-in ones.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::collections::BTreeMap;

use meridian_e2e::fuzzing;
use meridian_proto::inventory::{BackendKind, ClusterInfo, Inventory, NodeFree};
use meridian_proto::job::JobState;
use meridian_proto::pb;
use meridian_proto::protocol::{AgentEvent, AgentHello, JobReport};
use meridian_proto::testing::{self, cluster_info, dgx_shape, hello};
use prost::Message;

#[test]
fn seeds_match() {
    let read = |t: &str, n: &str| std::fs::read(fuzzing::seed_dir(t).join(n)).unwrap();
    let report = |state| JobReport {
        message: "done".into(),
        nodes: vec!["n-0".into(), "n-1".into()],
        ..testing::report("j-1", 3, state)
    };
    let info = ClusterInfo {
        backend: BackendKind::Slurm,
        prices: BTreeMap::from([("h100".into(), 2.5), ("a100-80g".into(), 1.25)]),
        supports_bare_commands: false,
        labels: BTreeMap::from([("gpu-fabric".into(), "ib".into())]),
        ..cluster_info("gpu-east")
    };
    let hello = AgentHello { info, agent_version: "0.1.0".into(), ..hello("gpu-east", "i-7f3a") };
    let hello = pb::AgentMessage { body: Some(pb::agent_message::Body::Hello(pb::Hello::from(&hello))) };
    assert_eq!(hello.encode_to_vec(), read("agent_message", "hello.pb"));
    let mut shape = dgx_shape(&[8, 2]);
    shape.free[1] = NodeFree { gpus: 2, cpu: 10, memory_gib: 64 };
    shape.labels = BTreeMap::from([("rack".into(), "r1".into())]);
    let inv = AgentEvent::Inventory(Inventory { shapes: vec![shape] });
    assert_eq!(pb::AgentMessage::from(&inv).encode_to_vec(), read("agent_message", "inventory.pb"));
    let st = AgentEvent::Status(report(JobState::Succeeded));
    assert_eq!(pb::AgentMessage::from(&st).encode_to_vec(), read("agent_message", "status.pb"));
    let hb = AgentEvent::Heartbeat { seq: 9, jobs: vec![report(JobState::Running), report(JobState::Failed)] };
    assert_eq!(pb::AgentMessage::from(&hb).encode_to_vec(), read("agent_message", "heartbeat.pb"));
}
