//! End to end: a running job's GPU utilisation travels from the agent's utilisation file to the
//! gateway, which flags the job idle once its GPUs stay under `idleGpu.threshold` for
//! `idleGpu.after`; the flag shows in the REST JSON, the CLI and the gateway's `/metrics`, and
//! clears when the GPUs get busy. The agent's own `/metrics` shows its stream and GPUs.
//!
//! The real `meridian gateway` and `meridian-agent` (builtin backend, process runner with two
//! declared GPUs, a file utilisation source as a DCGM exporter textfile would write it).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use meridian_e2e::{ClusterOptions, Federation, GATEWAY_CONFIG, free_port, poll, scrape};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// The GPU host (two declared L4s, process runner) with a file utilisation source and its own
/// `/metrics` on `metrics_port`.
fn gpu_host(utilization_file: &Path, metrics_port: u16) -> ClusterOptions {
    ClusterOptions::process_host("1s").report_interval("200ms").extra(format!(
        "utilization: {{file: {}, interval: 100ms, window: 300ms}}\nmetrics: {{listen: 127.0.0.1:{metrics_port}}}\n",
        utilization_file.display()
    ))
}

/// Writes a DCGM-style textfile (percent per GPU) the way an exporter does: whole, by rename.
fn write_utilization(path: &Path, percent: [u32; 2]) {
    let text = format!(
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n\
         DCGM_FI_DEV_GPU_UTIL{{gpu=\"0\",UUID=\"GPU-a\"}} {}\nDCGM_FI_DEV_GPU_UTIL{{gpu=\"1\",UUID=\"GPU-b\"}} {}\n",
        percent[0], percent[1]
    );
    let staging = path.with_extension("tmp");
    std::fs::write(&staging, text).unwrap();
    std::fs::rename(&staging, path).unwrap();
}

fn stdout(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_whose_gpus_sit_at_two_percent_is_flagged_idle_everywhere_until_they_get_busy() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpu.prom");
    write_utilization(&file, [2, 2]);
    let metrics_port = free_port().unwrap();
    let f = Federation::builder()
        .in_dir(dir)
        .gateway_config(format!("{GATEWAY_CONFIG}idleGpu: {{threshold: 0.05, after: 1s}}\n"))
        .cluster("gpu-host", gpu_host(&file, metrics_port))
        .start()
        .await
        .unwrap();
    let (gateway, agent) = (&f.gateway, f.agent("gpu-host"));

    let spec = "name: idle\ntenant: t\ngang: {replicas: 1, resources: {gpus: 1}}\nruntime: {estimate: 1h}\n\
                payload: {command: [sleep, '600']}\n";
    let (job, created) = gateway.client().submit(spec).await.unwrap();
    assert!(created);
    let id = job["id"].as_str().unwrap().to_string();
    gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();

    // REST: the usage appears, then the idle flag once the low samples have lasted 1s.
    let client = gateway.client();
    let idle: Value = poll(WAIT, || async {
        let job = client.get(&id).await.ok()?;
        (job["usage"]["idle"] == true).then_some(job)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: job never idle; agent log:\n{}", agent.proc.log()));
    let usage = &idle["usage"];
    assert!((usage["gpuUtilization"].as_f64().unwrap() - 0.02).abs() < 1e-9, "{usage}");
    let since = usage["idleSinceMs"].as_i64().unwrap();
    assert!(since >= idle["startedAtMs"].as_i64().unwrap(), "{idle}");
    assert!(usage["sampledAtMs"].as_i64().unwrap() >= since, "{usage}");
    let listed = client.list(Some("t"), None, None).await.unwrap();
    assert_eq!(listed["jobs"][0]["usage"]["idle"], true, "{listed}");
    // gRPC: the same usage on the typed job.
    let mut grpc =
        meridian_proto::pb::jobs_client::JobsClient::connect(format!("http://{}", gateway.grpc)).await.unwrap();
    let request = meridian_proto::pb::GetJobRequest { id: idle["id"].as_str().unwrap().to_string() };
    let wire = grpc.get(request).await.unwrap().into_inner();
    let wire_usage = wire.usage.expect("gRPC carries the usage");
    assert!(wire_usage.idle && (wire_usage.gpu_utilization - 0.02).abs() < 1e-9, "{wire_usage:?}");
    assert_eq!(wire_usage.idle_since_ms, Some(since));

    // CLI: the list flags it and the detail says how long.
    let list = stdout(&gateway.cli(&["jobs"]));
    assert!(list.contains("Running IDLE"), "{list}");
    let detail = stdout(&gateway.cli(&["job", &id]));
    assert!(
        detail.contains("GPU use:") && detail.contains("2% of its GPUs") && detail.contains("IDLE since"),
        "{detail}"
    );

    // The gateway's metrics.
    let labels = format!("job=\"{id}\",tenant=\"t\",cluster=\"gpu-host\"");
    let text = scrape(gateway.rest).await.expect("the gateway serves /metrics");
    for line in [
        format!("meridian_job_gpu_utilization_ratio{{{labels}}} 0.02"),
        format!("meridian_job_idle{{{labels}}} 1"),
        "meridian_idle_gpus{cluster=\"gpu-host\",tenant=\"t\"} 1".to_string(),
    ] {
        assert!(text.contains(&line), "missing `{line}` in\n{text}");
    }

    // The agent's metrics: connected, one of two GPUs allocated, the samples, the running job.
    let agent_metrics = SocketAddr::from(([127, 0, 0, 1], metrics_port));
    let text = poll(WAIT, || async {
        let text = scrape(agent_metrics).await?;
        text.contains("meridian_agent_gpus{state=\"allocated\",gpu_type=\"l4\"} 1").then_some(text)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: agent metrics never showed the allocation; agent log:\n{}", agent.proc.log()));
    for line in [
        "meridian_agent_stream_connected 1",
        "meridian_agent_gpus{state=\"total\",gpu_type=\"l4\"} 2",
        "meridian_agent_gpu_utilization_ratio{node=\"\",gpu=\"0\"} 0.02",
        "meridian_agent_jobs{state=\"Running\"} 1",
        "meridian_agent_results_unacknowledged 0",
        "meridian_agent_stream_reconnects_total 0",
    ] {
        assert!(text.contains(line), "missing `{line}` in\n{text}");
    }
    assert!(text.contains("meridian_agent_last_report_age_seconds "), "{text}");

    // Busy GPUs clear the flag everywhere.
    write_utilization(&file, [90, 90]);
    let busy: Value = poll(WAIT, || async {
        let job = client.get(&id).await.ok()?;
        (job["usage"]["idle"] == false && job["usage"]["gpuUtilization"].as_f64()? > 0.5).then_some(job)
    })
    .await
    .unwrap();
    assert!(busy["usage"].get("idleSinceMs").is_none(), "{busy}");
    let list = stdout(&gateway.cli(&["jobs"]));
    assert!(!list.contains("IDLE"), "{list}");
    let text = scrape(gateway.rest).await.unwrap();
    assert!(text.contains(&format!("meridian_job_idle{{{labels}}} 0")), "{text}");
    assert!(!text.contains("meridian_idle_gpus{"), "no idle GPUs left: {text}");

    // Once it ends, its usage is gone.
    client.cancel(&id).await.unwrap();
    let cancelled = gateway.wait_for_state(&id, "Cancelled", WAIT).await.unwrap();
    assert!(cancelled.get("usage").is_none(), "{cancelled}");
}
