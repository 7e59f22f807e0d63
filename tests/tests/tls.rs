//! End to end over TLS: the real gateway with `tls:` and real agents with client certificates.
//!
//! - An agent whose certificate names cluster A cannot attach as B, and B's jobs never reach it.
//! - No certificate, an expired one, or one from another CA is refused.
//! - A certificate or a hello whose cluster name breaks the grammar is refused with the reason.
//! - A second agent for a live cluster is refused; the first keeps its jobs.
//! - A certificate rotated on disk serves the next connection, without a restart.
//! - REST over https works with the CLI; plain http to the TLS port fails with a clear answer.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::time::Duration;

use meridian::certs::{Ca, Pair, Validity};
use meridian_e2e::{ClusterOptions, Federation, GATEWAY_CONFIG, Gateway, poll};
use meridian_gateway::tls::identity::cluster_uri;
use meridian_proto::pb;
use meridian_proto::testing::hello;
use time::OffsetDateTime;
use tokio_stream::StreamExt;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const WAIT: Duration = Duration::from_secs(30);
const JOB: &str = "name: long\ntenant: team-a\ngang: {replicas: 1, resources: {gpus: 4, cpu: 8, memoryGiB: 64}}\n\
                   runtime: {estimate: 1h}\npayload: {image: registry.local/train:1, command: [python, train.py]}\n";

/// A gateway over TLS (certificates in its directory, see [`meridian_e2e::Pki`]) and `clusters`
/// (one 8-GPU H100 node each; jobs last an hour), each agent with its cluster's certificate.
async fn federation(clusters: &[&str]) -> Federation {
    let mut builder = Federation::builder().tls();
    for cluster in clusters {
        builder = builder.cluster(*cluster, ClusterOptions::default());
    }
    builder.start().await.unwrap()
}

/// Replaces a file in one step, as a careful operator (or Kubernetes) does.
fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Attaches to the gateway's Federation stream as `cluster`, presenting `identity`; returns the
/// status the gateway answered (or the transport error as `Unavailable`).
async fn attach(gateway: &Gateway, ca_pem: &str, identity: Option<&Pair>, cluster: &str) -> Result<(), tonic::Status> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)).domain_name("localhost");
    if let Some(pair) = identity {
        tls = tls.identity(Identity::from_pem(&pair.cert_pem, &pair.key_pem));
    }
    let unavailable = |e: tonic::transport::Error| tonic::Status::unavailable(format!("{e:?}"));
    let channel = Endpoint::from_shared(format!("https://{}", gateway.grpc))
        .unwrap()
        .tls_config(tls)
        .map_err(unavailable)?
        .connect()
        .await
        .map_err(unavailable)?;
    let mut hello = hello(cluster, "test-client");
    hello.info.prices = Default::default();
    hello.agent_version = "0".into();
    let hello = pb::AgentMessage { body: Some(pb::agent_message::Body::Hello(pb::Hello::from(&hello))) };
    // Keep the stream open after the hello so the gateway answers rather than seeing an end.
    let outbound = tokio_stream::once(hello).chain(tokio_stream::pending());
    let mut client = pb::federation_client::FederationClient::new(channel);
    let response = tokio::time::timeout(WAIT, client.attach(outbound)).await.expect("the gateway answers")?;
    // The welcome (or the stream's failure) is the first message.
    let first = tokio::time::timeout(WAIT, response.into_inner().message()).await.expect("a first message")?;
    match first {
        Some(_) => Ok(()),
        None => Err(tonic::Status::unavailable("the stream ended without a welcome")),
    }
}

async fn wait_for_log(gateway: &Gateway, needles: &[&str]) -> String {
    poll(WAIT, || async {
        let log = gateway.proc.log();
        log.lines().find(|line| needles.iter().all(|n| line.contains(n))).map(str::to_string)
    })
    .await
    .unwrap_or_else(|_| panic!("no gateway log line with {needles:?}:\n{}", gateway.proc.log()))
}

/// The id of a job submitted to and running on the connected cluster `east`.
async fn east_running_a_job(gateway: &Gateway) -> String {
    let (job, _) = gateway.client().submit(JOB).await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let running = gateway.wait_for_state(&id, "Running", WAIT).await.unwrap();
    assert_eq!(running["cluster"], "east");
    id
}

#[tokio::test]
async fn an_agent_certified_for_one_cluster_cannot_speak_for_another() {
    let f = federation(&["east"]).await;
    let (gateway, pki) = (&f.gateway, f.pki());
    let id = east_running_a_job(gateway).await;
    let before = gateway.client().clusters().await.unwrap();

    // A real agent process holding west's certificate, configured to speak for east.
    let rogue = f.start_agent("rogue", "east", &ClusterOptions::default().certificate("west")).unwrap();
    let line = wait_for_log(gateway, &["refused an agent whose certificate names another cluster"]).await;
    assert!(line.contains("WARN") && line.contains("hello=east") && line.contains("certificate=west"), "{line}");
    let rogue_log = poll(WAIT, || async {
        let log = rogue.proc.log();
        log.contains("the gateway denied this agent's identity").then_some(log)
    })
    .await
    .unwrap_or_else(|_| panic!("the rogue agent was not told:\n{}", rogue.proc.log()));
    assert!(rogue_log.contains("not cluster `east`"), "{rogue_log}");
    assert!(!rogue_log.contains(&id), "east's job reached the rogue agent:\n{rogue_log}");

    // East is untouched: its job runs there, its inventory is its own.
    let job = gateway.client().get(&id).await.unwrap();
    assert_eq!((job["state"].as_str(), job["cluster"].as_str()), (Some("Running"), Some("east")), "{job}");
    let after = gateway.client().clusters().await.unwrap();
    assert_eq!(after["clusters"][0]["gpusTotal"], before["clusters"][0]["gpusTotal"]);
    assert_eq!(after["clusters"][0]["connected"], true);

    // The same certificate speaking for its own cluster is welcome.
    let ca = std::fs::read_to_string(pki.path("ca.pem")).unwrap();
    let west = Pair {
        cert_pem: std::fs::read_to_string(pki.path("west.pem")).unwrap(),
        key_pem: std::fs::read_to_string(pki.path("west.key")).unwrap(),
    };
    attach(gateway, &ca, Some(&west), "west").await.unwrap();
}

#[tokio::test]
async fn no_certificate_an_expired_one_or_one_from_another_ca_is_refused() {
    let f = federation(&[]).await;
    let (gateway, pki) = (&f.gateway, f.pki());
    let ca = std::fs::read_to_string(pki.path("ca.pem")).unwrap();

    let none = attach(gateway, &ca, None, "east").await.unwrap_err();
    assert_eq!(none.code(), tonic::Code::Unauthenticated, "{none:?}");
    assert!(none.message().contains("client certificate"), "{none:?}");

    let now = OffsetDateTime::now_utc();
    let past = Validity { from: now - time::Duration::days(30), until: now - time::Duration::days(1) };
    let expired = pki.ca.agent("east", past).unwrap();
    let refused = attach(gateway, &ca, Some(&expired), "east").await.unwrap_err();
    assert_ne!(refused.code(), tonic::Code::Ok);
    wait_for_log(gateway, &["TLS handshake failed", "certificate expired"]).await;

    let stranger = Ca::generate(Validity::days(1)).unwrap().agent("east", Validity::days(1)).unwrap();
    let refused = attach(gateway, &ca, Some(&stranger), "east").await.unwrap_err();
    assert_ne!(refused.code(), tonic::Code::Ok);
    // Development CAs share their name, so the stranger's certificate finds our CA by name and
    // fails on its signature; a differently named CA would be an unknown issuer.
    poll(WAIT, || async {
        let log = gateway.proc.log();
        log.lines()
            .filter(|l| l.contains("TLS handshake failed"))
            .any(|l| l.contains("BadSignature") || l.contains("UnknownIssuer"))
            .then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("no refusal of the stranger's certificate:\n{}", gateway.proc.log()));

    let clusters = gateway.client().clusters().await.unwrap();
    assert_eq!(clusters["clusters"].as_array().map(Vec::len), Some(0), "nobody attached: {clusters}");

    // Users' `Jobs` calls share the port and need no client certificate.
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca)).domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{}", gateway.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let answer = pb::jobs_client::JobsClient::new(channel).list_clusters(pb::ListClustersRequest {}).await.unwrap();
    assert!(answer.into_inner().clusters_json.contains("\"clusters\""));
}

#[tokio::test]
async fn a_cluster_name_outside_the_grammar_is_refused_in_a_certificate_and_in_a_hello() {
    let f = federation(&[]).await;
    let (gateway, pki) = (&f.gateway, f.pki());
    let ca = std::fs::read_to_string(pki.path("ca.pem")).unwrap();

    // Our CA signed it, but the name is a path: the certificate is refused with the reason,
    // whatever cluster the hello names.
    let traversal = pki.ca.client(&[cluster_uri("west/../east")], "rogue", Validity::days(1)).unwrap();
    for hello in ["east", "west/../east"] {
        let refused = attach(gateway, &ca, Some(&traversal), hello).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{hello}: {refused:?}");
        assert!(
            refused.message().contains("urn:meridian:cluster:west/../east")
                && refused.message().contains("has `/` at character 5"),
            "{hello}: {refused:?}"
        );
    }
    let line = wait_for_log(gateway, &["refused an agent certificate that names an invalid cluster"]).await;
    assert!(line.contains("WARN"), "{line}");

    // A valid certificate, and a hello whose name would forge a log line.
    let east = pki.ca.agent("east", Validity::days(1)).unwrap();
    let refused = attach(gateway, &ca, Some(&east), "east\nFAKE line").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().starts_with("hello.cluster: has U+000A at character 5;"), "{refused:?}");
    wait_for_log(gateway, &["refused an agent hello whose cluster name is invalid"]).await;
    assert!(!gateway.proc.log().lines().any(|line| line.starts_with("FAKE")), "{}", gateway.proc.log());

    let clusters = gateway.client().clusters().await.unwrap();
    assert_eq!(clusters["clusters"].as_array().map(Vec::len), Some(0), "nobody attached: {clusters}");
    // The same certificate with its own, valid name is welcome.
    attach(gateway, &ca, Some(&east), "east").await.unwrap();
}

#[tokio::test]
async fn a_second_agent_for_a_live_cluster_is_refused_and_the_first_keeps_its_jobs() {
    let f = federation(&["east"]).await;
    let gateway = &f.gateway;
    let id = east_running_a_job(gateway).await;

    // Same certificate, another process: a valid identity, but east already has a live agent.
    let second = f.start_agent("east-2", "east", &ClusterOptions::default()).unwrap();
    wait_for_log(gateway, &["refused a second agent for a connected cluster"]).await;
    poll(WAIT, || async { second.proc.log().contains("the gateway refused this agent").then_some(()) })
        .await
        .unwrap_or_else(|_| panic!("the second agent was not told:\n{}", second.proc.log()));
    let job = gateway.client().get(&id).await.unwrap();
    assert_eq!((job["state"].as_str(), job["cluster"].as_str()), (Some("Running"), Some("east")), "{job}");
    assert!(!gateway.proc.log().contains("agent disconnected"), "{}", gateway.proc.log());
}

#[tokio::test]
async fn a_certificate_rotated_on_disk_serves_the_next_connection_without_a_restart() {
    let f = federation(&[]).await;
    let (gateway, pki) = (&f.gateway, f.pki());
    let pid = gateway.proc.pid();
    gateway.client().clusters().await.unwrap();

    // Rotate to a certificate from a new CA; a client trusting only the new CA fails until the
    // gateway has reloaded, then succeeds; the old CA's clients are then refused.
    let new_ca = Ca::generate(Validity::days(1)).unwrap();
    let new_server = new_ca.server(&[], Validity::days(1)).unwrap();
    std::fs::write(pki.path("new-ca.pem"), &new_ca.pair.cert_pem).unwrap();
    let new_client = || {
        meridian_cli::client::Client::new(&format!("https://{}", gateway.rest))
            .unwrap()
            .with_ca_file(&pki.path("new-ca.pem"))
            .unwrap()
    };
    let err = new_client().clusters().await.unwrap_err();
    assert!(err.to_string().contains("TLS with the gateway"), "{err}");
    replace(&pki.path("gateway.key"), &new_server.key_pem);
    replace(&pki.path("gateway.pem"), &new_server.cert_pem);
    poll(WAIT, || async { new_client().clusters().await.ok() })
        .await
        .unwrap_or_else(|_| panic!("the new certificate was never served:\n{}", gateway.proc.log()));
    assert!(gateway.client().clusters().await.is_err(), "the old CA's certificate is no longer served");
    assert!(gateway.proc.log().contains("TLS certificate, key and client CA reloaded"));
    assert_eq!(gateway.proc.pid(), pid);
}

#[tokio::test]
async fn rest_over_https_works_with_the_cli_and_plain_http_to_the_tls_port_fails_clearly() {
    let f = federation(&[]).await;
    let gateway = &f.gateway;

    let output = gateway.cli(&["clusters", "-o", "json"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("\"clusters\""));

    // `meridian clusters` at `url`, trusting no CA of its own.
    let clusters_without_ca = |url: String| {
        std::process::Command::new(&meridian_e2e::binaries().meridian)
            .args(["clusters"])
            .env("MERIDIAN_GATEWAY", url)
            .env_remove("MERIDIAN_CA")
            .output()
            .unwrap()
    };
    let plain = clusters_without_ca(format!("http://{}", gateway.rest));
    assert!(!plain.status.success());
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert!(stderr.contains("HTTPS only") && stderr.contains("https://"), "{stderr}");

    let no_ca = clusters_without_ca(format!("https://{}", gateway.rest));
    assert!(!no_ca.status.success());
    let stderr = String::from_utf8_lossy(&no_ca.stderr);
    assert!(stderr.contains("--ca") && stderr.contains("MERIDIAN_CA"), "{stderr}");
}

#[tokio::test]
async fn a_gateway_without_tls_or_insecure_refuses_to_start_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, "placementInterval: 1s\n").unwrap();
    let output = std::process::Command::new(&meridian_e2e::binaries().meridian)
        .arg("gateway")
        .arg("--config")
        .arg(&config)
        .args(["--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tls:") && stderr.contains("meridian certs init") && stderr.contains("insecure: true"));
}

#[tokio::test]
async fn users_authenticate_with_bearer_tokens_over_https() {
    const TOKEN: &str = "viewer-token-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(&tokens, format!("tokens:\n- {{subject: vera, role: viewer, tenants: [nlp], token: {TOKEN}}}\n"))
        .unwrap();
    let config = format!("{GATEWAY_CONFIG}auth: {{tokensFile: {}}}\n", tokens.display());
    let f = Federation::builder().in_dir(dir).tls().gateway_config(config).start().await.unwrap();
    let (gateway, pki) = (&f.gateway, f.pki());
    let cli = |token: Option<&str>, args: &[&str]| {
        let mut command = std::process::Command::new(&meridian_e2e::binaries().meridian);
        command
            .args(args)
            .env("MERIDIAN_GATEWAY", gateway.rest_url())
            .env("MERIDIAN_CA", pki.path("ca.pem"))
            .env_remove("MERIDIAN_TOKEN")
            .env_remove("MERIDIAN_TOKEN_FILE");
        if let Some(token) = token {
            command.env("MERIDIAN_TOKEN", token);
        }
        command.output().unwrap()
    };
    // TLS alone is not enough: the gateway wants a token, and says so.
    let anonymous = cli(None, &["jobs", "-o", "json"]);
    assert!(!anonymous.status.success());
    let stderr = String::from_utf8_lossy(&anonymous.stderr);
    assert!(stderr.contains("authentication required") && stderr.contains("MERIDIAN_TOKEN"), "{stderr}");
    // With the token, over https, the viewer reads its tenant.
    let listed = cli(Some(TOKEN), &["jobs", "--tenant", "nlp", "-o", "json"]);
    assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
    assert!(String::from_utf8_lossy(&listed.stdout).contains("\"jobs\""));
    // ... but may not submit there.
    let spec = pki.path("job.yaml");
    std::fs::write(&spec, "name: j\ntenant: nlp\ngang: {replicas: 1, resources: {gpus: 1}}\npayload: {command: [x]}\n")
        .unwrap();
    let submitted = cli(Some(TOKEN), &["submit", "-f", spec.to_str().unwrap()]);
    assert!(!submitted.status.success());
    let stderr = String::from_utf8_lossy(&submitted.stderr);
    assert!(stderr.contains("vera may not submit"), "{stderr}");
}
