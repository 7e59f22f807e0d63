//! Following changes end to end: `GET /v1/events` (server-sent events, resumable by event id),
//! the gRPC `Jobs/Watch` stream, and `meridian jobs --watch` / `meridian job ID --watch`, against
//! a real gateway and agent.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meridian_cli::sse::{EventStream, SseMessage};
use meridian_e2e::{ClusterOptions, Federation, GATEWAY_CONFIG, Gateway, binaries};
use meridian_proto::pb;
use meridian_proto::pb::jobs_client::JobsClient;
use serde_json::Value;
use tokio_stream::StreamExt;

const WAIT: Duration = Duration::from_secs(30);

fn spec(name: &str, estimate: &str) -> String {
    format!(
        "name: {name}\ntenant: team-a\ngang: {{replicas: 1, resources: {{gpus: 2, cpu: 8, memoryGiB: 64}}}}\n\
         runtime: {{estimate: {estimate}}}\npayload: {{image: registry.local/train:1, command: [python, train.py]}}\n"
    )
}

async fn next(stream: &mut EventStream) -> SseMessage {
    tokio::time::timeout(WAIT, stream.next()).await.expect("an event in time").expect("stream readable").expect("open")
}

/// Reads job events of `id` until it reaches `last`, returning (event id, previous, state).
async fn job_events_until(stream: &mut EventStream, id: &str, last: &str) -> Vec<(String, Value, String)> {
    let mut seen = Vec::new();
    loop {
        let message = next(stream).await;
        assert_ne!(message.event, "reset", "no event may be missed here: {}", message.data);
        if message.event != "job" {
            continue;
        }
        let data: Value = serde_json::from_str(&message.data).unwrap();
        if data["job"]["id"] != id {
            continue;
        }
        let state = data["job"]["state"].as_str().unwrap().to_string();
        seen.push((message.id.clone().expect("job events carry an id"), data["previousState"].clone(), state.clone()));
        if state == last {
            return seen;
        }
    }
}

/// A child process whose stdout lines are collected as they come.
struct Watching {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Watching {
    fn start(gateway: &Gateway, args: &[&str]) -> Self {
        let mut child = Command::new(&binaries().meridian)
            .args(args)
            .env("MERIDIAN_GATEWAY", gateway.rest_url())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self { child, lines }
    }

    async fn wait_for_line(&self, needle: &str) -> String {
        meridian_e2e::poll(WAIT, || async { self.lines.lock().unwrap().iter().find(|l| l.contains(needle)).cloned() })
            .await
            .unwrap_or_else(|_| panic!("no line with {needle:?} in {:#?}", self.lines.lock().unwrap()))
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_is_followed_from_submit_to_success_on_every_watch_api_and_resumes_lose_nothing() {
    // One hour of job time lasts 3.6 s.
    let east = ClusterOptions::default().time_scale(0.001);
    let f = Federation::builder().cluster("east", east).start().await.unwrap();
    let gateway = &f.gateway;
    let client = gateway.client();

    // Every watcher is open before the submit.
    let mut sse = client.events("/v1/events?kinds=job", None).await.unwrap();
    let ready = next(&mut sse).await;
    assert_eq!(ready.event, "ready");
    let cursor: Value = serde_json::from_str(&ready.data).unwrap();
    assert!(cursor["cursor"].as_str().unwrap().contains('.'), "{}", ready.data);
    let mut grpc = JobsClient::connect(format!("http://{}", gateway.grpc)).await.unwrap();
    let mut grpc_events =
        grpc.watch(pb::WatchRequest { kinds: vec!["job".into()], ..Default::default() }).await.unwrap().into_inner();
    let first = tokio::time::timeout(WAIT, grpc_events.next()).await.unwrap().unwrap().unwrap();
    assert!(matches!(first.body, Some(pb::watch_event::Body::Ready(_))), "{first:?}");
    let list_watch = Watching::start(gateway, &["jobs", "--watch", "--tenant", "team-a"]);
    list_watch.wait_for_line("no jobs").await;

    let (job, _) = client.submit(&spec("watched", "1h")).await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let one_job = Watching::start(gateway, &["job", &id, "--watch"]);

    // REST: every state in order, each event's previous state the one before it.
    let seen = job_events_until(&mut sse, &id, "Succeeded").await;
    let states: Vec<&str> = seen.iter().map(|(_, _, s)| s.as_str()).collect();
    // A submit and the round that offers the job may share a commit: then the first event
    // already says Offered (one event per job per commit, with its latest record).
    assert!(matches!(states.first(), Some(&"Queued" | &"Offered")), "{states:?}");
    assert!(states.contains(&"Running"), "{states:?}");
    assert_eq!(seen[0].1, Value::Null, "a new job has no previous state");
    for pair in seen.windows(2) {
        assert_eq!(pair[1].1, pair[0].2.as_str(), "previousState chains: {seen:?}");
    }

    // gRPC: the same changes with the same ids.
    let mut grpc_seen = Vec::new();
    while grpc_seen.len() < seen.len() {
        let event = tokio::time::timeout(WAIT, grpc_events.next()).await.unwrap().unwrap().unwrap();
        if let Some(pb::watch_event::Body::Job(changed)) = event.body
            && changed.job.as_ref().is_some_and(|j| j.id == id)
        {
            grpc_seen.push(event.id);
        }
    }
    assert_eq!(grpc_seen, seen.iter().map(|(event_id, _, _)| event_id.clone()).collect::<Vec<_>>());

    // The CLI: the list watcher printed each change; the job watcher exited 0 on success.
    list_watch.wait_for_line("Running → Succeeded").await;
    one_job.wait_for_line(&id).await;
    let mut one_job = one_job;
    let status = tokio::task::spawn_blocking(move || {
        let status = one_job.child.wait().unwrap();
        (status, one_job.lines.lock().unwrap().clone())
    })
    .await
    .unwrap();
    assert!(status.0.success(), "job --watch exits 0 once the job succeeded: {:?}", status.1);
    assert!(status.1.iter().any(|l| l.contains("Succeeded")), "{:?}", status.1);

    // Resuming after the first event yields exactly the rest, in order, by Last-Event-ID and
    // by `after`.
    let rest: Vec<String> = seen.iter().skip(1).map(|(event_id, _, _)| event_id.clone()).collect();
    for resumed in [
        client.events("/v1/events?kinds=job", Some(&seen[0].0)).await.unwrap(),
        client.events(&format!("/v1/events?kinds=job&after={}", seen[0].0), None).await.unwrap(),
    ] {
        let mut resumed = resumed;
        assert_eq!(next(&mut resumed).await.event, "ready");
        let again = job_events_until(&mut resumed, &id, "Succeeded").await;
        assert_eq!(again.iter().map(|(event_id, _, _)| event_id.clone()).collect::<Vec<_>>(), rest);
    }

    // An id from another gateway process cannot be resumed: a reset says so first.
    let mut foreign = client.events("/v1/events", Some("1.1")).await.unwrap();
    assert_eq!(next(&mut foreign).await.event, "ready");
    let reset = next(&mut foreign).await;
    assert_eq!(reset.event, "reset");
    assert!(reset.data.contains("another gateway process"), "{}", reset.data);
}

#[tokio::test(flavor = "multi_thread")]
async fn watching_a_cancelled_job_exits_1_and_bad_watch_parameters_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let client = gateway.client();
    // No cluster: the job stays queued until it is cancelled.
    let (job, _) = client.submit(&spec("doomed", "1h")).await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let watching = Watching::start(&gateway, &["job", &id, "--watch"]);
    watching.wait_for_line("Queued").await;
    client.cancel(&id).await.unwrap();
    let mut watching = watching;
    let status = tokio::task::spawn_blocking(move || watching.child.wait().unwrap()).await.unwrap();
    assert_eq!(status.code(), Some(1), "a cancelled job ends the watch with status 1");

    for (query, field) in
        [("bogus=1", "bogus"), ("after=12", "after"), ("kinds=jobs,nodes", "kinds"), ("selector=%3D%3D", "selector")]
    {
        let error = client.events(&format!("/v1/events?{query}"), None).await.err().expect("refused");
        assert_eq!(error.status(), Some(400), "{query}: {error}");
        assert!(error.to_string().contains(field), "{query}: {error}");
    }
    let error = client.events("/v1/events?job=j-nope", None).await.err().expect("refused");
    assert_eq!(error.status(), Some(404), "{error}");
}
