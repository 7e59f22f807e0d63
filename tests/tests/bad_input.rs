//! Bad input through REST and the CLI: each gets a 4xx (or a non-zero exit) naming the field and
//! the reason; nothing is stored; the gateway keeps serving.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use meridian_cli::client::ClientError;
use meridian_e2e::{ClusterOptions, Federation, GATEWAY_CONFIG, Gateway, agent_config};

const GOOD: &str = "name: ok\ntenant: t\ngang: {replicas: 1, resources: {gpus: 4, cpu: 4, memoryGiB: 16}}\n\
                    payload: {command: [python, train.py]}\n";

/// A gateway with one cluster, `solo`: two 8-GPU A100 nodes.
async fn gateway_with_one_cluster() -> Federation {
    let nodes = "  - {shape: a100-node, count: 2, gpuType: a100-80g, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
    let solo = ClusterOptions::default().prices("{a100-80g: 1.5}").nodes(nodes);
    Federation::builder().cluster("solo", solo).start().await.unwrap()
}

fn api_error(result: Result<(serde_json::Value, bool), ClientError>) -> (u16, String, Vec<String>, String) {
    match result {
        Err(ClientError::Api { status, code, message, fields }) => {
            (status, code, fields.into_iter().map(|f| f.field).collect(), message)
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_specs_are_refused_with_the_field_and_nothing_is_stored() {
    let f = gateway_with_one_cluster().await;
    let gateway = &f.gateway;
    let client = gateway.client();

    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("malformed YAML", "name: [unclosed\n".into(), 422, "spec"),
        ("unknown field", GOOD.replace("cpu: 4", "cpu: 4, gpuz: 2"), 422, "gang.resources.gpuz"),
        ("zero GPUs", GOOD.replace("gpus: 4", "gpus: 0"), 422, "gang.resources.gpus"),
        ("negative GPUs", GOOD.replace("gpus: 4", "gpus: -4"), 422, "gang.resources.gpus"),
        ("unknown GPU type", GOOD.replace("gpus: 4,", "gpus: 4, gpuTypes: [h10],"), 422, "gang.resources.gpuTypes[0]"),
        (
            "gang larger than any cluster",
            GOOD.replace("replicas: 1", "replicas: 3").replace("gpus: 4", "gpus: 8"),
            422,
            "clusters.solo",
        ),
        ("oversize body", format!("{GOOD}# {}\n", "x".repeat(300 * 1024)), 413, "spec"),
        ("not a map", "- just\n- a list\n".into(), 422, "spec"),
    ];
    for (what, body, status, field) in cases {
        let (got_status, code, fields, message) = api_error(client.submit(&body).await);
        assert_eq!(got_status, status, "{what}: {code} {message}");
        assert!(fields.iter().any(|f| f == field), "{what}: fields {fields:?} lack {field}; message: {message}");
        assert!(!message.is_empty(), "{what}");
    }

    // Nothing was stored and the gateway still serves.
    let jobs = client.list(None, None, None).await.unwrap();
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 0);
    let (job, created) = client.submit(GOOD).await.unwrap();
    assert!(created);
    assert_eq!(job["state"], "Queued");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nul_in_an_argument_or_env_value_and_a_wrong_typed_secret_get_422_without_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let client = gateway.client();

    // A NUL could never reach the process: refused at submit, by field path.
    let nul = GOOD.replace(
        "payload: {command: [python, train.py]}",
        "payload: {command: [python, train.py, \"--tag=a\\0b\"], env: {FOO: \"x\\0y\", LR: '1'}}",
    );
    let (status, code, fields, message) = api_error(client.submit(&nul).await);
    assert_eq!((status, code.as_str()), (422, "invalid_spec"), "{message}");
    assert_eq!(fields, ["payload.command[2]", "payload.env.FOO"], "{message}");
    assert!(message.contains("NUL"), "{message}");

    // An unquoted number as a secret value: the field and the expected type, never the value.
    let secret = GOOD.replace(
        "payload: {command: [python, train.py]}",
        "payload: {command: [python, train.py], env: {PIN: 904731}, secretEnv: [PIN]}",
    );
    match client.submit(&secret).await {
        Err(ClientError::Api { status, code, message, fields }) => {
            assert_eq!((status, code.as_str()), (422, "invalid_spec"), "{message}");
            assert_eq!(fields.len(), 1, "{fields:?}");
            assert_eq!(fields[0].field, "payload.env.PIN");
            assert!(fields[0].reason.starts_with("expected a string, found an integer"), "{fields:?}");
            let body = format!("{message} {fields:?}");
            assert!(!body.contains("904731"), "the secret is repeated: {body}");
        }
        other => panic!("expected a 422, got {other:?}"),
    }

    // Nothing was created.
    assert_eq!(client.list(None, None, None).await.unwrap()["jobs"].as_array().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_queries_name_the_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let client = gateway.client();
    for (selector, state) in [(Some("proj ect=x"), None), (Some("a=b,,"), None), (None, Some("Sleeping"))] {
        match client.list(None, state, selector).await {
            Err(ClientError::Api { status: 400, fields, .. }) => {
                let expected = if selector.is_some() { "selector" } else { "state" };
                assert_eq!(fields[0].field, expected);
            }
            other => panic!("{selector:?}/{state:?}: expected 400, got {other:?}"),
        }
    }
    match client.get("j-does-not-exist").await {
        Err(e) => assert_eq!(e.status(), Some(404)),
        Ok(v) => panic!("found {v}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_exits_non_zero_and_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, GOOD.replace("gpus: 4", "gpus: 0")).unwrap();
    let out = gateway.cli(&["submit", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("gang.resources.gpus"), "{stderr}");

    let out = gateway.cli(&["jobs", "-l", "bad key=x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("selector"));

    let missing = gateway.cli(&["job", "j-nope"]);
    assert!(!missing.status.success());
}

#[test]
fn an_agent_whose_cluster_name_breaks_the_grammar_exits_64_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = "  - {shape: a100-node, count: 1, gpuType: a100-80g, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
    for (name, reason) in [("West", "has `W` at character 1"), ("'../../etc'", "has `.` at character 1")] {
        let config = dir.path().join("agent.yaml");
        let text = agent_config(name, "us-east", "owned", "{a100-80g: 1.5}", nodes, 1.0);
        std::fs::write(&config, format!("insecure: true\n{text}")).unwrap();
        let output =
            std::process::Command::new(&meridian_e2e::binaries().agent).arg("--config").arg(&config).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{name}: {stderr}");
        assert!(stderr.contains(&format!("cluster: {reason}")), "{name}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_job_survives_a_gateway_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let (job, _) = gateway.client().submit(GOOD).await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    // SIGKILL: no orderly shutdown. The 201 promised the job was already on disk.
    gateway.proc.kill();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let again = gateway.client().get(&id).await.unwrap();
    assert_eq!(again["spec"]["name"], "ok");
    assert_eq!(again["state"], "Queued");
    drop(gateway);
}

#[tokio::test(flavor = "multi_thread")]
async fn resubmitting_with_the_same_idempotency_key_returns_the_same_job() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let spec = format!("{GOOD}idempotencyKey: run-7\n");
    let (first, created) = gateway.client().submit(&spec).await.unwrap();
    assert!(created);
    let (second, created_again) = gateway.client().submit(&spec).await.unwrap();
    assert!(!created_again);
    assert_eq!(first["id"], second["id"]);
    let changed = spec.replace("gpus: 4", "gpus: 2");
    let (status, code, _, _) = api_error(gateway.client().submit(&changed).await);
    assert_eq!((status, code.as_str()), (409, "conflict"));
    assert_eq!(gateway.client().list(None, None, None).await.unwrap()["jobs"].as_array().unwrap().len(), 1);
}
