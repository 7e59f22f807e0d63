//! Tenant quotas end to end, with the real gateway and agent processes: a job over its tenant's
//! GPU quota waits `Queued` with an explanation naming the limit while GPUs are free, and runs
//! once the tenant frees GPUs; a tenant over its submit rate gets 429 with `Retry-After`, and the
//! refused submit stores nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use meridian_cli::client::ClientError;
use meridian_e2e::{ClusterOptions, Federation, GATEWAY_CONFIG, poll};
use meridian_proto::pb;
use meridian_proto::pb::jobs_client::JobsClient;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(30);
/// Two 8-GPU nodes: room for two 8-GPU jobs at once.
const NODES: &str = "  - {shape: h100-node, count: 2, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}\n";

fn job(tenant: &str, replicas: u32, gpus: u32) -> String {
    format!(
        "name: q\ntenant: {tenant}\ngang: {{replicas: {replicas}, resources: {{gpus: {gpus}, cpu: 8, memoryGiB: 64}}}}\n\
         runtime: {{estimate: 1h}}\npayload: {{command: [python, train.py]}}\n"
    )
}

/// A gateway with `extra` config and one 16-GPU cluster whose jobs run for an hour.
async fn federation(extra: &str) -> Federation {
    let east = ClusterOptions::default().nodes(NODES);
    Federation::builder()
        .gateway_config(format!("{GATEWAY_CONFIG}{extra}"))
        .cluster("east", east)
        .start()
        .await
        .unwrap()
}

fn id(job: &Value) -> String {
    job["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_over_the_gpu_quota_waits_with_an_explanation_and_runs_once_the_tenant_frees_gpus() {
    let f = federation("tenants: {nlp: {quota: {maxGpus: 8}}}\n").await;
    let gateway = &f.gateway;
    let client = gateway.client();

    let (first, _) = client.submit(&job("nlp", 1, 8)).await.unwrap();
    gateway.wait_for_state(&id(&first), "Running", WAIT).await.unwrap();
    let (second, _) = client.submit(&job("nlp", 1, 8)).await.unwrap();
    let second = id(&second);

    // Rounds run every 200 ms; wait for one to explain the second job.
    let explanation = poll(WAIT, || async {
        let e = client.explain(&second).await.ok()?;
        e["summary"].as_str()?.contains("maxGpus").then_some(e)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; gateway log:\n{}", gateway.proc.log()));
    assert_eq!(explanation["state"], "Queued");
    assert_eq!(
        explanation["summary"],
        "waiting for quota: tenant nlp holds 8 of its 8 GPUs (tenants.nlp.quota.maxGpus); \
         this job needs 8 more, so 8 must be released first"
    );
    // It waits for the quota, not for room: the cluster has 8 GPUs free.
    let clusters = client.clusters().await.unwrap();
    assert_eq!(clusters["clusters"][0]["gpusFree"], 8, "{clusters}");
    // `meridian explain` says which limit.
    let out = gateway.cli(&["explain", &second]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("tenants.nlp.quota.maxGpus"));
    // Still queued a few rounds later: over quota is waiting, not failing.
    let again = client.get(&second).await.unwrap();
    assert_eq!(again["state"], "Queued");

    // Another tenant is not held back by nlp's quota.
    let (other, _) = client.submit(&job("vision", 1, 8)).await.unwrap();
    gateway.wait_for_state(&id(&other), "Running", WAIT).await.unwrap();
    client.cancel(&id(&other)).await.unwrap();

    // A gang larger than the whole quota could never start: refused at submit.
    match client.submit(&job("nlp", 2, 8)).await {
        Err(ClientError::Api { status: 422, code, fields, .. }) => {
            assert_eq!(code, "exceeds_quota");
            assert_eq!(fields.iter().map(|f| f.field.as_str()).collect::<Vec<_>>(), ["tenants.nlp.quota.maxGpus"]);
        }
        other => panic!("expected 422, got {other:?}"),
    }

    client.cancel(&id(&first)).await.unwrap();
    gateway.wait_for_state(&second, "Running", WAIT).await.unwrap();
}

/// Sends `POST /v1/jobs` with `spec` over a plain HTTP/1.1 connection; returns the status, the
/// `Retry-After` header and the body (the client library does not expose headers).
async fn raw_submit(rest: SocketAddr, spec: &str) -> (u16, Option<String>, Value) {
    let mut stream = tokio::net::TcpStream::connect(rest).await.unwrap();
    let request = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: {rest}\r\nContent-Type: application/yaml\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{spec}",
        spec.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut answer)).await.unwrap().unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let retry_after = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after").then(|| value.trim().to_string())
    });
    (status, retry_after, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_over_its_submit_rate_gets_429_with_retry_after_and_nothing_is_stored() {
    // Two submits at once, then one every 100 s: the test cannot refill the bucket by accident.
    let quota = "tenants: {nlp: {quota: {submitsPerSecond: 0.01, submitBurst: 2}}}\n";
    let f = federation(quota).await;
    let gateway = &f.gateway;
    let client = gateway.client();
    for _ in 0..2 {
        let (status, _, body) = raw_submit(gateway.rest, &job("nlp", 1, 1)).await;
        assert_eq!(status, 201, "{body}");
    }

    let (status, retry_after, body) = raw_submit(gateway.rest, &job("nlp", 1, 1)).await;
    assert_eq!(status, 429, "{body}");
    let retry_after: u64 = retry_after.expect("a 429 carries Retry-After").parse().unwrap();
    assert!((1..=100).contains(&retry_after), "Retry-After: {retry_after}");
    assert_eq!(body["error"]["code"], "rate_limited");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("tenants.nlp.quota.submitsPerSecond"), "{message}");

    // gRPC shares the tenant's bucket and says the same with its own code.
    let mut grpc = JobsClient::connect(format!("http://{}", gateway.grpc)).await.unwrap();
    let refused = grpc.submit(pb::SubmitRequest { spec_text: job("nlp", 1, 1) }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("submitsPerSecond"), "{}", refused.message());

    // Other tenants have no limit; the refused submits stored nothing.
    let (status, _, _) = raw_submit(gateway.rest, &job("vision", 1, 1)).await;
    assert_eq!(status, 201);
    let listed = client.list(Some("nlp"), None, None).await.unwrap();
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 2, "{listed}");
}
