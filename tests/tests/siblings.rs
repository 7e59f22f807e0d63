//! End to end: a queued job waits as sibling copies on two members and starts exactly once, on
//! the first whose own scheduler would start it.
//!
//! Two builtin clusters, `a` and `b`, each one 8-GPU node under the process runner, each fully
//! busy with a blocker job that runs until the test creates its file. The gateway keeps up to
//! two copies of a queued job (`placement.siblingCopies: 2`). An 8-GPU job is submitted: it
//! fits nowhere, so it waits as a copy on both members. The test ends `b`'s blocker; `b`'s
//! scheduler takes the node for its copy, asks for the start lock, and the gateway grants it
//! there and drops `a`'s copy. The job is its own witness: its command appends one line (its
//! cluster and fencing token) to a file, so "exactly once, on b, under b's binding" is read
//! from what really ran. `a`'s node is freed afterwards, and nothing of the job starts there.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use meridian_e2e::{ClusterOptions, Federation, GATEWAY_CONFIG, Gateway, free_port, poll, scrape};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// A member with one 8-GPU node ([`meridian_e2e::H100_NODE`]) that runs jobs as processes, and
/// serves its metrics on `metrics`.
fn member(metrics: SocketAddr) -> ClusterOptions {
    ClusterOptions::default().process_runner("2s").extra(format!("metrics: {{listen: {metrics}}}\n"))
}

/// A job of one 8-GPU replica running `sh -c script`, with `placement`.
fn job(name: &str, script: &str, placement: &str) -> String {
    let script = serde_json::to_string(script).unwrap();
    format!(
        "name: {name}\ntenant: t\ngang: {{replicas: 1, resources: {{gpus: 8}}}}\nruntime: {{estimate: 10m}}\n\
         payload: {{command: [sh, -c, {script}]}}\nplacement: {placement}\n"
    )
}

/// A job on `cluster` that holds its whole node until `end` exists.
fn blocker(cluster: &str, end: &Path) -> String {
    let script = format!("while [ ! -e {} ]; do sleep 0.1; done", end.display());
    job(&format!("blocker-{cluster}"), &script, &format!("{{clusters: {{include: [{cluster}]}}}}"))
}

async fn submit(gateway: &Gateway, spec: &str) -> String {
    let (job, created) = gateway.client().submit(spec).await.unwrap();
    assert!(created);
    job["id"].as_str().unwrap().to_string()
}

/// Waits until the agent serving metrics on `addr` shows `line`; panics with `context` after
/// [`WAIT`].
async fn wait_for_metric(addr: SocketAddr, line: &str, context: impl Fn() -> String) {
    let found = poll(WAIT, || async { scrape(addr).await.filter(|text| text.contains(line)) }).await;
    if found.is_err() {
        let text = scrape(addr).await.unwrap_or_default();
        panic!("the agent on {addr} never showed `{line}`:\n{text}\n{}", context());
    }
}

/// The witness file's lines (none while it does not exist).
fn witness_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_waiting_as_copies_on_two_members_runs_once_on_the_first_that_frees_up() {
    let (a_metrics, b_metrics) = (
        SocketAddr::from(([127, 0, 0, 1], free_port().unwrap())),
        SocketAddr::from(([127, 0, 0, 1], free_port().unwrap())),
    );
    let config = format!("{GATEWAY_CONFIG}placement: {{siblingCopies: 2}}\n");
    let f = Federation::builder()
        .gateway_config(config)
        .cluster("a", member(a_metrics))
        .cluster("b", member(b_metrics))
        .start()
        .await
        .unwrap();
    let logs = || {
        format!(
            "gateway log:\n{}\nagent a log:\n{}\nagent b log:\n{}",
            f.gateway.proc.log(),
            f.agent("a").proc.log(),
            f.agent("b").proc.log()
        )
    };
    let (end_a, end_b) = (f.dir().join("end-a"), f.dir().join("end-b"));
    let blocker_a = submit(&f.gateway, &blocker("a", &end_a)).await;
    let blocker_b = submit(&f.gateway, &blocker("b", &end_b)).await;
    for id in [&blocker_a, &blocker_b] {
        f.gateway.wait_for_state(id, "Running", WAIT).await.unwrap();
    }

    let witness = f.dir().join("witness");
    let script = format!("echo \"$MERIDIAN_CLUSTER $MERIDIAN_FENCING_TOKEN\" >> {}", witness.display());
    let id = submit(&f.gateway, &job("witnessed", &script, "{}")).await;
    // Both members hold a copy before either frees up (else the job would simply be placed).
    let queued = "meridian_agent_sibling_copies_total{outcome=\"queued\"} 1";
    wait_for_metric(a_metrics, queued, logs).await;
    wait_for_metric(b_metrics, queued, logs).await;
    let waiting = f.gateway.client().get(&id).await.unwrap();
    assert_eq!(waiting["state"], "Queued", "{waiting}");
    let explained = f.gateway.client().explain(&id).await.unwrap();
    let mut listed: Vec<&str> =
        explained["siblingCopies"].as_array().unwrap().iter().map(|c| c["cluster"].as_str().unwrap()).collect();
    listed.sort_unstable();
    assert_eq!(listed, ["a", "b"], "explain lists where it waits: {explained}");
    assert!(witness_lines(&witness).is_empty(), "nothing ran before a member freed up");

    std::fs::write(&end_b, "end").unwrap();
    f.gateway.wait_for_state(&blocker_b, "Succeeded", WAIT).await.unwrap();
    let done = f.gateway.wait_for_state(&id, "Succeeded", WAIT).await.unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert_eq!(done["cluster"], "b", "{done}");
    let token = done["fencingToken"].as_u64().unwrap_or_else(|| panic!("no fencing token in {done}"));
    assert_eq!(witness_lines(&witness), [format!("b {token}")], "ran once, on b, under b's binding");
    wait_for_metric(b_metrics, "meridian_agent_sibling_copies_total{outcome=\"granted\"} 1", logs).await;
    wait_for_metric(a_metrics, "meridian_agent_sibling_copies_total{outcome=\"dropped\"} 1", logs).await;

    // `a`'s node frees up too: its copy is gone, so nothing of the job starts there.
    std::fs::write(&end_a, "end").unwrap();
    f.gateway.wait_for_state(&blocker_a, "Succeeded", WAIT).await.unwrap();
    wait_for_metric(a_metrics, "meridian_agent_gpus{state=\"allocated\",gpu_type=\"h100\"} 0", logs).await;
    assert_eq!(witness_lines(&witness), [format!("b {token}")], "still exactly once");
    let after: Value = f.gateway.client().get(&id).await.unwrap();
    assert_eq!((&after["state"], &after["cluster"]), (&Value::from("Succeeded"), &Value::from("b")), "{after}");
    let a_text = scrape(a_metrics).await.unwrap_or_default();
    for outcome in ["ready", "granted"] {
        let line = format!("meridian_agent_sibling_copies_total{{outcome=\"{outcome}\"}}");
        assert!(!a_text.contains(&line), "a's copy never got to {outcome}:\n{a_text}");
    }
}
