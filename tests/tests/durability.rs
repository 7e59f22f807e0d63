//! Acknowledged work survives `kill -9` of the gateway, exactly once, and one data directory
//! serves one gateway.
//!
//! `kill -9` keeps the page cache, so these tests cannot prove that data was fsynced (the store's
//! fault-injection tests do, at the disk seam); they prove that nothing acknowledged lives only
//! in the gateway's memory, and that a restart reads back every record once.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meridian_e2e::{Agent, Gateway, agent_config, binaries, free_port};

const CYCLES: usize = 20;
const CLIENTS: usize = 16;
/// One minute of job time; the agent runs it in 60 ms.
const JOB: &str = "name: load\ntenant: t\ngang: {replicas: 1, resources: {gpus: 1}}\nruntime: {estimate: 1m}\npayload: {command: [x]}\n";
const NODES: &str = "  - {shape: h100-node, count: 8, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";

/// Every job id the gateway lists, following pages; panics on a duplicate.
async fn all_ids(gateway: &Gateway) -> BTreeSet<String> {
    let client = gateway.client();
    let mut ids = BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let page = client.list_page(None, None, None, 500, after.as_deref()).await.expect("list");
        for job in page["jobs"].as_array().expect("jobs array") {
            let id = job["id"].as_str().expect("id").to_string();
            assert!(ids.insert(id.clone()), "job {id} listed twice");
        }
        match page["continue"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return ids,
        }
    }
}

/// Counts of jobs by state, following pages.
async fn states(gateway: &Gateway) -> std::collections::BTreeMap<String, usize> {
    let jobs = gateway.client().list(None, None, None).await.expect("list");
    let mut counts = std::collections::BTreeMap::new();
    for job in jobs["jobs"].as_array().expect("jobs array") {
        *counts.entry(job["state"].as_str().unwrap_or("?").to_string()).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_job_survives_kill_9_under_load_exactly_once_and_none_is_misreported() {
    let dir = tempfile::tempdir().unwrap();
    let (rest, grpc) = (format!("127.0.0.1:{}", free_port().unwrap()), format!("127.0.0.1:{}", free_port().unwrap()));
    let acknowledged: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    // One member runs the jobs while the gateway is killed again and again; its results must
    // all arrive, so every job ends Succeeded (none Failed because a result was lost).
    let agent_dir = tempfile::tempdir().unwrap();
    let config = agent_config("east", "us-east", "owned", "{h100: 2.0}", NODES, 0.001);
    let _agent = Agent::start_via(agent_dir.path(), "east", &config, grpc.parse().unwrap()).unwrap();
    // A fixed seed: kill moments vary between cycles but the test is reproducible.
    let mut seed: u64 = 0x5eed;
    for cycle in 0..=CYCLES {
        let gateway = Gateway::start_on(dir.path(), "placementInterval: 200ms\n", &rest, &grpc).await.unwrap();
        let listed = all_ids(&gateway).await;
        let missing: Vec<String> = acknowledged.lock().unwrap().difference(&listed).cloned().collect();
        assert!(missing.is_empty(), "cycle {cycle}: acknowledged jobs lost: {missing:?}\n{}", gateway.proc.log());
        if cycle == CYCLES {
            // Let the member finish everything, then count.
            let finished = |counts: &std::collections::BTreeMap<String, usize>| {
                counts
                    .iter()
                    .filter(|(s, _)| matches!(s.as_str(), "Succeeded" | "Failed" | "Cancelled"))
                    .map(|(_, n)| n)
                    .sum::<usize>()
            };
            let waited = meridian_e2e::poll(Duration::from_secs(120), || async {
                let counts = states(&gateway).await;
                (finished(&counts) == listed.len()).then_some(counts)
            })
            .await;
            let counts = match waited {
                Ok(counts) => counts,
                Err(_) => panic!("jobs did not finish: {:?}\n{}", states(&gateway).await, gateway.proc.log()),
            };
            eprintln!(
                "{} acknowledged jobs over {CYCLES} kill -9 cycles, none lost or doubled; final states {counts:?}",
                listed.len()
            );
            assert_eq!(counts.get("Succeeded").copied(), Some(listed.len()), "every job must succeed: {counts:?}");
            break;
        }
        let mut load = Vec::new();
        for _ in 0..CLIENTS {
            let client = gateway.client();
            let acknowledged = Arc::clone(&acknowledged);
            load.push(tokio::spawn(async move {
                loop {
                    match client.submit(JOB).await {
                        Ok((job, true)) => {
                            let id = job["id"].as_str().expect("id").to_string();
                            acknowledged.lock().unwrap().insert(id);
                        }
                        Ok((_, false)) => panic!("a fresh submit was answered as a repeat"),
                        Err(_) => return,
                    }
                }
            }));
        }
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let kill_after = Duration::from_millis(150 + (seed >> 33) % 500);
        tokio::time::sleep(kill_after).await;
        let mut gateway = gateway;
        gateway.proc.kill();
        for task in load {
            task.await.unwrap();
        }
    }
    assert!(acknowledged.lock().unwrap().len() > CYCLES, "the load generator hardly got anything acknowledged");
}

#[tokio::test]
async fn a_second_gateway_on_the_same_data_directory_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let first = Gateway::start(dir.path(), "").await.unwrap();
    let output = tokio::task::spawn_blocking({
        let data = dir.path().join("data");
        // The same (plain-text) config as the first, so only the data directory is in the way.
        let config = dir.path().join("gateway.yaml");
        move || {
            Command::new(&binaries().meridian)
                .arg("gateway")
                .arg("--config")
                .arg(config)
                .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--data-dir"])
                .arg(data)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(!output.status.success(), "the second gateway started");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let pid = first.proc.pid().to_string();
    assert!(stderr.contains(&pid), "the refusal names the holder (pid {pid}): {stderr}");
    // The first is unharmed.
    first.client().submit(JOB).await.unwrap();
}
