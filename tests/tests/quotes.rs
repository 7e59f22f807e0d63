//! End to end: members' start quotes decide where a gang waits.
//!
//! Two builtin clusters, same region and prices, with jobs that must not end during the test.
//! - `a` has three 8-GPU H100 nodes: an 8-GPU job for 1 h on the first, and a 1-GPU job for 3 h
//!   on each of the others. 14 GPUs are free and 8 come back in an hour, so by its release
//!   profile a 2 × 8 gang "fits" there in an hour; but only one node is whole then, and the gang
//!   needs two whole nodes: its plan starts the gang in 3 h.
//! - `b` has two 8-GPU H100 nodes, each running an 8-GPU job for 2 h: by profile and by plan,
//!   the gang starts there in 2 h.
//!
//! With quotes the gang waits for `b`, where the member's own plan starts it first; with quotes
//! off (`placement.quoteCandidates: 0`) the gateway's guess sends it to wait for `a`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use meridian_e2e::{ClusterOptions, Federation, GATEWAY_CONFIG, Gateway};
use serde_json::Value;

const A_NODES: &str = "  - {shape: one, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024, labels: {slot: one}}\n  \
                       - {shape: two, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024, labels: {slot: two}}\n  \
                       - {shape: three, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024, labels: {slot: three}}\n";
const B_NODES: &str = "  - {shape: h100-node, count: 2, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
/// Jobs that must not end during a test: one hour of job time lasts an hour.
const SLOW: f64 = 1.0;
const WAIT: Duration = Duration::from_secs(30);

async fn federation(gateway_config: &str) -> Federation {
    let a = ClusterOptions::default().prices("{h100: 2.0}").nodes(A_NODES).time_scale(SLOW);
    let b = ClusterOptions::default().prices("{h100: 2.0}").nodes(B_NODES).time_scale(SLOW);
    Federation::builder().gateway_config(gateway_config).cluster("a", a).cluster("b", b).start().await.unwrap()
}

fn job(name: &str, replicas: u32, gpus: u32, hours: u32, placement: &str) -> String {
    format!(
        "name: {name}\ntenant: team-a\ngang: {{replicas: {replicas}, resources: {{gpus: {gpus}, cpu: 4, memoryGiB: 32}}}}\n\
         runtime: {{estimate: {hours}h}}\npayload: {{image: registry.local/train:1, command: [python, train.py]}}\n\
         placement: {placement}\n"
    )
}

async fn submit(gateway: &Gateway, spec: &str) -> String {
    let (job, _) = gateway.client().submit(spec).await.unwrap();
    job["id"].as_str().unwrap().to_string()
}

async fn run(gateway: &Gateway, spec: &str) -> String {
    let id = submit(gateway, spec).await;
    gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();
    id
}

/// Job `id`'s explanation once `ready` holds for it.
async fn explained_when(gateway: &Gateway, id: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let client = gateway.client();
    meridian_e2e::poll(WAIT, || async {
        let e = client.explain(id).await.ok()?;
        ready(&e).then_some(e)
    })
    .await
    .unwrap_or_else(|e| panic!("no such decision: {e}\n{}", gateway.proc.log()))
}

/// Occupies the clusters as the module's doc says.
async fn occupy(gateway: &Gateway) {
    run(gateway, &job("a-whole", 1, 8, 1, "{clusters: {include: [a]}, nodeSelector: slot=one}")).await;
    run(gateway, &job("a-two", 1, 1, 3, "{clusters: {include: [a]}, nodeSelector: slot=two}")).await;
    run(gateway, &job("a-three", 1, 1, 3, "{clusters: {include: [a]}, nodeSelector: slot=three}")).await;
    run(gateway, &job("b-first", 1, 8, 2, "{clusters: {include: [b]}}")).await;
    run(gateway, &job("b-second", 1, 8, 2, "{clusters: {include: [b]}}")).await;
}

/// (expected wait, quoted) of `cluster` in the explanation `e`.
fn wait_on(e: &Value, cluster: &str) -> Option<(f64, bool)> {
    let candidate = e["candidates"].as_array()?.iter().find(|c| c["cluster"] == cluster)?;
    let score = &candidate["score"];
    Some((score["expectedWaitSecs"].as_f64()?, score["quoted"].as_bool().unwrap_or(false)))
}

/// The chosen cluster of `e`, if any.
fn chosen(e: &Value) -> Option<String> {
    let candidate = e["candidates"].as_array()?.iter().find(|c| c["verdict"] == "chosen")?;
    candidate["cluster"].as_str().map(str::to_string)
}

fn near(secs: f64, expected: f64) -> bool {
    (secs - expected).abs() < 120.0
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gang_waits_where_the_members_own_plan_starts_it_first() {
    let f = federation(GATEWAY_CONFIG).await;
    occupy(&f.gateway).await;
    let id = submit(&f.gateway, &job("gang", 2, 8, 1, "{}")).await;
    // Both members answer within a round or two; the decision then rests on their plans.
    let quoted = |e: &Value, c| wait_on(e, c).is_some_and(|(_, quoted)| quoted);
    let explained = explained_when(&f.gateway, &id, |e| quoted(e, "a") && quoted(e, "b")).await;
    let (a_wait, _) = wait_on(&explained, "a").unwrap();
    let (b_wait, _) = wait_on(&explained, "b").unwrap();
    assert!(near(a_wait, 3.0 * 3600.0), "a's plan: whole nodes in 3 h, got {a_wait} s\n{explained}");
    assert!(near(b_wait, 2.0 * 3600.0), "b's plan: 2 h, got {b_wait} s\n{explained}");
    assert_eq!(chosen(&explained).as_deref(), Some("b"), "{explained}");
    assert_eq!(explained["state"], "Queued");
    let summary = explained["summary"].as_str().unwrap();
    assert!(summary.contains("by b's own plan"), "{summary}");

    // `meridian explain` marks the quoted waits.
    let out = f.gateway.cli(&["explain", &id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(quoted)"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_quotes_the_release_profile_sends_the_gang_to_wait_for_the_fragmented_cluster() {
    let config = format!("{GATEWAY_CONFIG}placement: {{quoteCandidates: 0}}\n");
    let f = federation(&config).await;
    occupy(&f.gateway).await;
    let id = submit(&f.gateway, &job("gang", 2, 8, 1, "{}")).await;
    let decided = |e: &Value| e["candidates"].as_array().is_some_and(|c| c.len() == 2) && chosen(e).is_some();
    let explained = explained_when(&f.gateway, &id, decided).await;
    assert_eq!(chosen(&explained).as_deref(), Some("a"), "{explained}");
    let (a_wait, quoted) = wait_on(&explained, "a").unwrap();
    assert!(!quoted && near(a_wait, 3600.0), "a's profile says 1 h: {explained}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_high_priority_job_is_offered_where_its_member_preempts_for_it() {
    // `a` runs a preemptible low-priority job on its one node, `b` a job that may not be
    // preempted. Neither has room; `a`'s plan starts an urgent job once it preempts (after a 2 s
    // grace), `b`'s only in 2 h.
    let node = "  - {shape: h100-node, count: 1, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
    let a = ClusterOptions::default()
        .prices("{h100: 2.0}")
        .nodes(node)
        .time_scale(SLOW)
        .extra("preemption: {graceSecs: 2}\n");
    let b = ClusterOptions::default().prices("{h100: 2.0}").nodes(node).time_scale(SLOW);
    let f = Federation::builder().cluster("a", a).cluster("b", b).start().await.unwrap();
    let victim = job("victim", 1, 8, 3, "{clusters: {include: [a]}}")
        .replace("tenant: team-a\n", "tenant: team-a\npriority: 10\npreemptible: true\n");
    let victim_id = run(&f.gateway, &victim).await;
    run(&f.gateway, &job("steady", 1, 8, 2, "{clusters: {include: [b]}}")).await;

    let urgent = job("urgent", 1, 8, 1, "{}").replace("tenant: team-a\n", "tenant: team-a\npriority: 90\n");
    let id = submit(&f.gateway, &urgent).await;
    let running = f.gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();
    assert_eq!(running["cluster"], "a", "{running}");

    let explained = f.gateway.client().explain(&id).await.unwrap();
    let summary = explained["summary"].as_str().unwrap();
    assert!(summary.contains("once a preempts lower-priority preemptible jobs"), "{summary}");
    let (_, quoted) = wait_on(&explained, "a").unwrap();
    assert!(quoted, "{explained}");

    // The victim went back to the federation queue, preempted, and waits there.
    let victim = f.gateway.client().get(&victim_id).await.unwrap();
    assert_eq!(victim["state"], "Queued", "{victim}");
}
