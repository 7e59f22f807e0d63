//! End to end: cluster and node labels from the agents' configs reach the gateway, and jobs'
//! `placement.clusterSelector` and `placement.nodeSelector` steer them, with the reasons shown by
//! `meridian explain`.
//!
//! Cluster `roce` (us-east) has two 8-GPU H100 nodes on a RoCE fabric. Cluster `ib` (eu-west) has
//! one 8-GPU H100 node on InfiniBand (node label `rack: r1`) and one without.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use meridian_e2e::{ClusterOptions, Federation};
use serde_json::Value;

const ROCE_NODES: &str = "  - {shape: h100-node, count: 2, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
const IB_NODES: &str = "  - {shape: h100-r1, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024, \
                        labels: {rack: r1}}\n  \
                        - {shape: h100-r2, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
/// Jobs that must not end during a test: one hour of job time lasts an hour.
const SLOW: f64 = 1.0;
const WAIT: Duration = Duration::from_secs(30);

async fn federation() -> Federation {
    let roce = ClusterOptions::default().nodes(ROCE_NODES).time_scale(SLOW).extra("labels: {gpu-fabric: roce}\n");
    let ib = ClusterOptions::default()
        .region("eu-west")
        .nodes(IB_NODES)
        .time_scale(SLOW)
        .extra("labels: {gpu-fabric: ib}\n");
    Federation::builder().cluster("roce", roce).cluster("ib", ib).start().await.unwrap()
}

fn job(name: &str, placement: &str) -> String {
    format!(
        "name: {name}\ntenant: team-a\ngang: {{replicas: 1, resources: {{gpus: 8, cpu: 8, memoryGiB: 64}}}}\n\
         runtime: {{estimate: 1h}}\npayload: {{image: registry.local/train:1, command: [python, train.py]}}\n\
         placement: {placement}\n"
    )
}

fn id(job: &Value) -> String {
    job["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_selector_picks_the_labelled_cluster_and_explain_says_why_not_the_other() {
    let f = federation().await;
    let clusters = f.gateway.client().clusters().await.unwrap();
    let ib = clusters["clusters"].as_array().unwrap().iter().find(|c| c["name"] == "ib").unwrap().clone();
    assert_eq!(ib["labels"]["gpu-fabric"], "ib", "{clusters}");
    assert_eq!(ib["labels"]["meridian.io/region"], "eu-west", "{clusters}");

    let (submitted, _) =
        f.gateway.client().submit(&job("on-ib", "{clusterSelector: 'gpu-fabric = ib'}")).await.unwrap();
    assert_eq!(submitted["spec"]["placement"]["clusterSelector"], "gpu-fabric=ib", "stored in canonical form");
    let running = f.gateway.wait_for_state(&id(&submitted), "Running", WAIT).await.unwrap();
    assert_eq!(running["cluster"], "ib");

    let out = f.gateway.cli(&["explain", &id(&submitted)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("clusterSelector gpu-fabric=ib does not match the cluster's labels (gpu-fabric=roce, "),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_selector_lands_on_the_matching_node_or_is_refused_when_none_matches() {
    let f = federation().await;
    let (submitted, _) = f.gateway.client().submit(&job("on-r1", "{nodeSelector: rack=r1}")).await.unwrap();
    let running = f.gateway.wait_for_state(&id(&submitted), "Running", WAIT).await.unwrap();
    assert_eq!(running["cluster"], "ib");
    assert_eq!(running["nodes"], serde_json::json!(["h100-r1-0"]));

    // No node anywhere has rack=r9: refused at submit, each cluster naming the selector.
    let err = f.gateway.client().submit(&job("nowhere", "{nodeSelector: rack=r9}")).await.unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("no node with an acceptable GPU type matches nodeSelector rack=r9"), "{message}");

    // A selector that does not parse names its field and requirement.
    let err = f.gateway.client().submit(&job("bad", "{nodeSelector: 'rack=r1,=x'}")).await.unwrap_err();
    let message = format!("{err:#}");
    assert!(message.contains("placement.nodeSelector"), "{message}");
    assert!(message.contains("requirement 2 `=x`"), "{message}");
}
