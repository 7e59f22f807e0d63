//! The gRPC `Jobs` service serves the same jobs, with the same validation, as REST.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use meridian_e2e::{GATEWAY_CONFIG, Gateway};
use meridian_proto::pb;
use meridian_proto::pb::jobs_client::JobsClient;

#[tokio::test(flavor = "multi_thread")]
async fn grpc_and_rest_see_the_same_jobs_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let mut grpc = JobsClient::connect(format!("http://{}", gateway.grpc)).await.unwrap();
    let spec =
        "name: via-grpc\ntenant: t\nlabels: {project: llm}\ngang: {resources: {gpus: 2}}\npayload: {command: [run]}\n";
    let job = grpc.submit(pb::SubmitRequest { spec_text: spec.into() }).await.unwrap().into_inner();
    assert_eq!(job.state, pb::JobState::Queued as i32);
    assert_eq!(job.spec.as_ref().map(|s| s.name.as_str()), Some("via-grpc"));

    let rest = gateway.client().get(&job.id).await.unwrap();
    assert_eq!(rest["spec"]["labels"]["project"], "llm");

    let listed = grpc
        .list(pb::ListJobsRequest { selector: "project=llm".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.jobs.len(), 1);

    let bad = grpc.submit(pb::SubmitRequest { spec_text: spec.replace("gpus: 2", "gpus: 0") }).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("gang.resources.gpus"), "{}", bad.message());

    let missing = grpc.get(pb::GetJobRequest { id: "j-nope".into() }).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);

    // Logs follow the same rules as `GET /v1/jobs/{id}/logs`: a queued job has none yet, and
    // a bad size names the field.
    let request = pb::JobLogsRequest { id: job.id.clone(), from: None, max_bytes: 100 };
    let not_started = grpc.logs(request).await.unwrap_err();
    assert_eq!(not_started.code(), tonic::Code::FailedPrecondition);
    assert!(not_started.message().contains("has not run on any cluster yet"), "{}", not_started.message());
    let too_big = grpc.logs(pb::JobLogsRequest { id: job.id.clone(), from: None, max_bytes: 10_000_000 }).await;
    let too_big = too_big.unwrap_err();
    assert_eq!(too_big.code(), tonic::Code::InvalidArgument);
    assert!(too_big.message().contains("maxBytes"), "{}", too_big.message());

    let cancelled = grpc.cancel(pb::CancelRequest { id: job.id.clone() }).await.unwrap().into_inner();
    assert_eq!(cancelled.state, pb::JobState::Cancelled as i32);
}
