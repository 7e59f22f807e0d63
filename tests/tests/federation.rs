//! End to end: the real `meridian gateway` and two `meridian-agent` processes on loopback.
//!
//! Cluster `east` (us-east) has one 8-GPU H100 node and four 4-GPU L4 nodes: 24 GPUs, but only
//! one node that can hold an 8-GPU replica. Cluster `west` (eu-west) has two 8-GPU A100 nodes.
//! Jobs run for `runtime.estimate × timeScale`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use meridian_e2e::{ClusterOptions, Federation, Gateway};
use serde_json::Value;

const EAST_NODES: &str = "  - {shape: h100-node, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n  \
                          - {shape: l4-node, count: 4, gpuType: l4, gpus: 4, cpu: 32, memoryGiB: 256}\n";
const WEST_NODES: &str = "  - {shape: a100-node, count: 2, gpuType: a100-80g, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
/// One hour of job time lasts 3.6 s.
const FAST: f64 = 0.001;
/// Jobs that must not end during a test: one hour of job time lasts an hour.
const SLOW: f64 = 1.0;
const WAIT: Duration = Duration::from_secs(30);

async fn federation(time_scale: f64) -> Federation {
    let east = ClusterOptions::default().prices("{h100: 2.0, l4: 0.4}").nodes(EAST_NODES).time_scale(time_scale);
    let west =
        ClusterOptions::default().region("eu-west").prices("{a100-80g: 1.5}").nodes(WEST_NODES).time_scale(time_scale);
    Federation::builder().cluster("east", east).cluster("west", west).start().await.unwrap()
}

fn job(name: &str, replicas: u32, gpus: u32, extra: &str) -> String {
    format!(
        "name: {name}\ntenant: team-a\ngang: {{replicas: {replicas}, resources: {{gpus: {gpus}, cpu: 8, memoryGiB: 64}}}}\n\
         runtime: {{estimate: 1h}}\npayload: {{image: registry.local/train:1, command: [python, train.py]}}\n{extra}"
    )
}

async fn submit(gateway: &Gateway, spec: &str) -> Value {
    let (job, created) = gateway.client().submit(spec).await.unwrap();
    assert!(created);
    job
}

/// The job's explanation once a placement round has judged it against both clusters.
async fn decided(gateway: &Gateway, id: &str) -> Value {
    let client = gateway.client();
    meridian_e2e::poll(WAIT, || async {
        let e = client.explain(id).await.ok()?;
        (e["candidates"].as_array()?.len() == 2).then_some(e)
    })
    .await
    .unwrap()
}

fn id(job: &Value) -> String {
    job["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_submitted_through_the_cli_runs_to_succeeded() {
    let f = federation(FAST).await;
    let file = f.gateway.dir.join("job.yaml");
    std::fs::write(&file, job("cli-job", 1, 1, "")).unwrap();
    let out = f.gateway.cli(&["submit", "-f", file.to_str().unwrap(), "-o", "json"]);
    assert!(out.status.success(), "submit failed: {}", String::from_utf8_lossy(&out.stderr));
    let submitted: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(submitted["state"], "Queued");
    let done = f.gateway.wait_for_state(&id(&submitted), "Succeeded", WAIT).await.unwrap();
    assert!(done["cluster"].is_string());
    assert!(done["startedAtMs"].as_i64().unwrap() <= done["finishedAtMs"].as_i64().unwrap());

    let listed = f.gateway.cli(&["jobs", "--state", "Succeeded"]);
    assert!(listed.status.success());
    assert!(String::from_utf8_lossy(&listed.stdout).contains("cli-job"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_two_by_eight_gang_lands_only_where_two_eight_gpu_nodes_are_free() {
    let f = federation(SLOW).await;
    // East has 24 GPUs but a single 8-GPU node: only west can hold the gang.
    let gang = submit(&f.gateway, &job("gang", 2, 8, "")).await;
    let running = f.gateway.wait_for_state(&id(&gang), "Running", WAIT).await.unwrap();
    assert_eq!(running["cluster"], "west");
    let nodes: Vec<&str> = running["nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert_eq!(nodes.len(), 2);
    assert_ne!(nodes[0], nodes[1], "each replica needs its own 8-GPU node");

    // With west full, a second such gang waits even though east still has 24 free GPUs.
    let second = submit(&f.gateway, &job("gang-2", 2, 8, "")).await;
    let explained = decided(&f.gateway, &id(&second)).await;
    let state = f.gateway.client().get(&id(&second)).await.unwrap();
    assert_eq!(state["state"], "Queued", "{explained}");
    let east = explained["candidates"].as_array().unwrap().iter().find(|c| c["cluster"] == "east").cloned();
    assert!(east.is_some_and(|c| c["verdict"] == "rejected"), "{explained}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_goes_to_the_region_of_its_data_when_both_could_run_it() {
    let f = federation(SLOW).await;
    let eu =
        submit(&f.gateway, &job("eu-data", 1, 1, "data: [{uri: s3://eu/set, sizeGiB: 500, region: eu-west}]\n")).await;
    let us =
        submit(&f.gateway, &job("us-data", 1, 1, "data: [{uri: s3://us/set, sizeGiB: 500, region: us-east}]\n")).await;
    let eu = f.gateway.wait_for_state(&id(&eu), "Running", WAIT).await.unwrap();
    let us = f.gateway.wait_for_state(&id(&us), "Running", WAIT).await.unwrap();
    assert_eq!(eu["cluster"], "west");
    assert_eq!(us["cluster"], "east");
    let why = f.gateway.client().explain(&id(&eu)).await.unwrap();
    let east = why["candidates"].as_array().unwrap().iter().find(|c| c["cluster"] == "east").unwrap().clone();
    assert!(east["score"]["transferSecs"].as_f64().unwrap() > 0.0, "{why}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_job_stops_on_its_member() {
    let f = federation(SLOW).await;
    let long = submit(&f.gateway, &job("long", 1, 8, "")).await;
    let running = f.gateway.wait_for_state(&id(&long), "Running", WAIT).await.unwrap();
    let cluster = running["cluster"].as_str().unwrap().to_string();
    let free_of = |clusters: &Value| {
        clusters["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["cluster"] == cluster || c["name"] == cluster)
            .unwrap()["gpusFree"]
            .as_u64()
            .unwrap()
    };
    let busy = free_of(&f.gateway.client().clusters().await.unwrap());

    let out = f.gateway.cli(&["cancel", &id(&long)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cancelled = f.gateway.client().get(&id(&long)).await.unwrap();
    assert_eq!(cancelled["state"], "Cancelled");
    // The member stops the gang and reports it; its 8 GPUs come back.
    let client = f.gateway.client();
    meridian_e2e::poll(WAIT, || async {
        let job = client.get(&id(&long)).await.ok()?;
        let clusters = client.clusters().await.ok()?;
        (job["message"].as_str()?.contains("stopped on") && free_of(&clusters) == busy + 8).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", f.gateway.proc.log()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_that_fits_nowhere_now_stays_queued_and_explains_each_cluster() {
    let f = federation(SLOW).await;
    // Fill west's two A100 nodes, then ask for A100s again.
    let filler = submit(&f.gateway, &job("filler", 2, 8, "")).await;
    f.gateway.wait_for_state(&id(&filler), "Running", WAIT).await.unwrap();
    let waiting = submit(
        &f.gateway,
        &job("waits", 1, 8, "placement: {burst: never}\n").replace("gpus: 8,", "gpus: 8, gpuTypes: [a100-80g],"),
    )
    .await;
    let client = f.gateway.client();
    let explained = decided(&f.gateway, &id(&waiting)).await;
    assert_eq!(client.get(&id(&waiting)).await.unwrap()["state"], "Queued");
    let candidates = explained["candidates"].as_array().unwrap();
    let east = candidates.iter().find(|c| c["cluster"] == "east").unwrap();
    assert_eq!(east["verdict"], "rejected");
    assert!(east["reasons"][0].as_str().unwrap().contains("gpuTypes"), "{explained}");
    let west = candidates.iter().find(|c| c["cluster"] == "west").unwrap();
    assert_eq!(west["score"]["fitsNow"], false, "{explained}");
    assert!(!explained["summary"].as_str().unwrap().is_empty());

    let out = f.gateway.cli(&["explain", &id(&waiting)]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("east") && text.contains("west"), "{text}");
}

/// A cluster with two 8-GPU A100 40 GB nodes and two 8-GPU A100 80 GB nodes, the gateway's
/// config appended with `placement`.
async fn two_a100s(placement: &str) -> Federation {
    let nodes = "  - {shape: a100-40, count: 2, gpuType: a100-40g, gpus: 8, cpu: 96, memoryGiB: 1024}\n  \
                 - {shape: a100-80, count: 2, gpuType: a100-80g, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
    let cluster = ClusterOptions::default().prices("{a100-40g: 1.1, a100-80g: 1.3}").nodes(nodes).time_scale(SLOW);
    let config = format!("{}{placement}", meridian_e2e::GATEWAY_CONFIG);
    Federation::builder().gateway_config(config).cluster("a100s", cluster).start().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gang_too_large_for_either_a100_runs_over_both_when_the_gateway_knows_they_run_alike() {
    let f = two_a100s("placement: {gpuSpeed: {a100-40g: 1.0, a100-80g: 1.0, h100: 2.5}}\n").await;
    let gang = submit(&f.gateway, &job("span", 3, 8, "")).await;
    let running = f.gateway.wait_for_state(&id(&gang), "Running", WAIT).await.unwrap();
    assert_eq!(running["gpuType"], "a100-40g+a100-80g", "{running}");
    // The member's own record of where the replicas run: three nodes, of both types.
    let mut nodes: Vec<String> =
        running["nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "{running}");
    assert!(
        nodes.iter().any(|n| n.starts_with("a100-40")) && nodes.iter().any(|n| n.starts_with("a100-80")),
        "{nodes:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_gpu_speeds_a_gang_never_spans_types_and_is_refused_where_no_type_holds_it() {
    let f = two_a100s("").await;
    let refused = f.gateway.client().submit(&job("span", 3, 8, "")).await.unwrap_err().to_string();
    assert!(refused.contains("a100s") && refused.contains("at most 2"), "{refused}");
}
