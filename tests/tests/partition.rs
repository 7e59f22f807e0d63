//! The link between an agent and the gateway fails; no job is lost, misreported or run twice.
//!
//! Agent `east` reaches the gateway through a TCP proxy the test controls; `west` dials it
//! directly. Time stamps come from the processes' own logs (one machine, one clock).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use meridian_e2e::{ClusterOptions, Federation, Gateway, ProxyMode, log_time, seconds_between};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(40);

fn job(name: &str, estimate: &str) -> String {
    format!(
        "name: {name}\ntenant: team-a\ngang: {{replicas: 1, resources: {{gpus: 8}}}}\n\
         runtime: {{estimate: {estimate}}}\npayload: {{command: [train]}}\n"
    )
}

/// A gateway with `config` and cluster `east` (one 8-GPU H100 node, jobs at `time_scale`)
/// behind a proxy the test controls.
async fn east_behind_a_proxy(config: &str, time_scale: f64) -> Federation {
    let east = ClusterOptions::default().time_scale(time_scale).behind_proxy();
    Federation::builder().gateway_config(config).cluster("east", east).start().await.unwrap()
}

async fn submit(gateway: &Gateway, spec: &str) -> String {
    let (job, created) = gateway.client().submit(spec).await.unwrap();
    assert!(created);
    job["id"].as_str().unwrap().to_string()
}

async fn wait_running_on(gateway: &Gateway, id: &str, cluster: &str) -> Value {
    let client = gateway.client();
    meridian_e2e::poll(WAIT, || async {
        let job = client.get(id).await.ok()?;
        (job["state"] == "Running" && job["cluster"] == cluster).then_some(job)
    })
    .await
    .unwrap_or_else(|e| panic!("{id} never ran on {cluster}: {e}\n{}", gateway.proc.log()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_cluster_stops_its_copy_before_the_gateway_starts_another() {
    // Lease 3 s (6 s - 3 s margin); the gateway re-places 6 s after it last heard the agent.
    let config = "placementInterval: 200ms\nclusterTimeout: 2s\nlostJobTimeout: 6s\nleaseMargin: 3s\n";
    let mut f = east_behind_a_proxy(config, 1.0).await;
    let id = submit(&f.gateway, &job("long", "10h")).await;
    wait_running_on(&f.gateway, &id, "east").await;
    f.join("west", ClusterOptions::default()).await.unwrap();
    let (gateway, proxy) = (&f.gateway, f.proxy("east"));

    proxy.set(ProxyMode::Blackhole);
    let moved = wait_running_on(gateway, &id, "west").await;
    assert_eq!(moved["fencingToken"], 2, "the new copy runs under a new token");

    let east_log = f.agent("east").proc.log();
    let west_log = f.agent("west").proc.log();
    let stopped =
        log_time(&east_log, &["lease expired"]).unwrap_or_else(|| panic!("east never stopped its copy:\n{east_log}"));
    let started = log_time(&west_log, &["gang started", &id])
        .unwrap_or_else(|| panic!("west never started the job:\n{west_log}"));
    let gap = seconds_between(&stopped, &started).unwrap();
    eprintln!("east stopped its copy at {stopped}; west started the new one at {started}, {gap:.3} s later");
    assert!(gap >= 1.0, "east stopped its copy at {stopped}, west started one at {started}: {gap:.3}s apart");

    // The link heals: east learns the job is no longer its own; the job stays with west.
    proxy.set(ProxyMode::Pass);
    let client = gateway.client();
    meridian_e2e::poll(WAIT, || async {
        let clusters = client.clusters().await.ok()?;
        let east = clusters["clusters"].as_array()?.iter().find(|c| c["name"] == "east")?.clone();
        (east["connected"] == true).then_some(())
    })
    .await
    .unwrap();
    let job = client.get(&id).await.unwrap();
    assert_eq!((job["state"].as_str(), job["cluster"].as_str()), (Some("Running"), Some("west")), "{job}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_finishes_while_the_link_is_down_ends_succeeded() {
    // One hour of job time lasts 3.6 s.
    let f = east_behind_a_proxy("placementInterval: 200ms\n", 0.001).await;
    let (gateway, proxy, east) = (&f.gateway, f.proxy("east"), f.agent("east"));
    let id = submit(gateway, &job("short", "1h")).await;
    wait_running_on(gateway, &id, "east").await;

    proxy.set(ProxyMode::Down);
    gateway.wait_for_state(&id, "Unknown", WAIT).await.unwrap();
    meridian_e2e::poll(WAIT, || async { log_time(&east.proc.log(), &["job finished", &id]) })
        .await
        .unwrap_or_else(|_| panic!("the job never finished on east:\n{}", east.proc.log()));
    assert_eq!(gateway.client().get(&id).await.unwrap()["state"], "Unknown", "nothing reached the gateway yet");

    proxy.set(ProxyMode::Pass);
    let job = gateway.wait_for_state(&id, "Succeeded", WAIT).await.unwrap();
    assert_eq!(job["cluster"], "east");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_claiming_a_connected_cluster_is_refused_and_the_first_keeps_its_jobs() {
    let f = Federation::builder()
        .gateway_config("placementInterval: 200ms\n")
        .cluster("east", ClusterOptions::default())
        .start()
        .await
        .unwrap();
    let gateway = &f.gateway;
    let id = submit(gateway, &job("long", "10h")).await;
    wait_running_on(gateway, &id, "east").await;

    // Another process says it is `east`, with one small node: it must not take over.
    let tiny = "  - {shape: l4-node, count: 1, gpuType: l4, gpus: 1, cpu: 8, memoryGiB: 64}\n";
    let rogue = f.start_agent("rogue", "east", &ClusterOptions::default().prices("{l4: 0.4}").nodes(tiny)).unwrap();
    meridian_e2e::poll(WAIT, || async { log_time(&rogue.proc.log(), &["the gateway refused this agent"]) })
        .await
        .unwrap_or_else(|_| panic!("the second agent was not refused:\n{}", rogue.proc.log()));
    // Two more heartbeats of the real agent pass (300 ms each): nothing changed.
    let client = gateway.client();
    let before = log_time(&rogue.proc.log(), &["the gateway refused this agent"]).unwrap();
    meridian_e2e::poll(WAIT, || async {
        let again = rogue.proc.log().lines().filter(|l| l.contains("the gateway refused this agent")).count();
        (again >= 2).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("the second agent stopped retrying after {before}:\n{}", rogue.proc.log()));
    let job = client.get(&id).await.unwrap();
    assert_eq!((job["state"].as_str(), job["cluster"].as_str()), (Some("Running"), Some("east")), "{job}");
    let clusters = client.clusters().await.unwrap();
    let east = &clusters["clusters"][0];
    assert_eq!((east["gpusTotal"].as_u64(), east["connected"].as_bool()), (Some(8), Some(true)), "{clusters}");
    assert!(gateway.proc.log().contains("refused a second agent"), "the gateway logs the refusal");
}
