//! Authentication and authorization end to end: a real gateway with a tokens file and a JWT key
//! set, a real agent, and callers of two tenants on REST, gRPC and the CLI. Tenant A cannot
//! read, list, explain, read the logs of or cancel tenant B's jobs; a viewer cannot submit or
//! cancel; an admin sees all; no token or a bad one is 401; a secret env value never appears in
//! any answer or in the gateway's log.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use meridian_cli::client::{Client, ClientError};
use meridian_e2e::{ClusterOptions, Federation, GATEWAY_CONFIG, Gateway, poll};
use meridian_proto::pb;
use meridian_proto::pb::jobs_client::JobsClient;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

const SECRET: &str = "s3cr3t-API-value-7f1c";
const ALICE: &str = "alice-token-vision-0001"; // member of vision
const BOB: &str = "bob-token-nlp-00000001"; // member of nlp
const VIC: &str = "vic-token-viewer-vision"; // viewer of vision
const ROOT: &str = "root-token-admin-000001"; // admin
const NODES: &str = "  - {shape: a100-node, count: 2, gpuType: a100-80g, gpus: 8, cpu: 96, memoryGiB: 1024}\n";

fn sha256_hex(token: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// An ES256 key made for this test, and tokens signed with it.
struct Issuer {
    key: EcdsaKeyPair,
}

impl Issuer {
    fn new() -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        Issuer { key: EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap() }
    }

    fn jwks(&self) -> String {
        let point = self.key.public_key().as_ref();
        json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "test-1", "use": "sig",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..65])}]})
        .to_string()
    }

    fn token(&self, header: &Value, claims: &Value) -> String {
        let signed =
            format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
        let signature = self.key.sign(&SystemRandom::new(), signed.as_bytes()).unwrap();
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.as_ref()))
    }
}

fn claims(subject: &str, tenants: &[&str], role: &str, expires_in: i64) -> Value {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    json!({"iss": "https://idp.test", "aud": "meridian", "sub": subject, "exp": now + expires_in,
           "meridian_role": role, "meridian_tenants": tenants})
}

fn write_auth_files(dir: &Path, issuer: &Issuer) -> String {
    let tokens = format!(
        "tokens:\n\
         - {{subject: alice, role: member, tenants: [vision], sha256: {}}}\n\
         - {{subject: bob, role: member, tenants: [nlp], sha256: {}}}\n\
         - {{subject: vic, role: viewer, tenants: [vision], sha256: {}}}\n\
         - {{subject: root, role: admin, token: {ROOT}}}\n",
        sha256_hex(ALICE),
        sha256_hex(BOB),
        sha256_hex(VIC),
    );
    std::fs::write(dir.join("tokens.yaml"), tokens).unwrap();
    std::fs::write(dir.join("jwks.json"), issuer.jwks()).unwrap();
    format!(
        "{GATEWAY_CONFIG}auth:\n  tokensFile: {}\n  reloadInterval: 200ms\n  jwt:\n    issuer: https://idp.test\n    \
         audience: meridian\n    jwksFile: {}\n",
        dir.join("tokens.yaml").display(),
        dir.join("jwks.json").display()
    )
}

fn spec(name: &str, tenant: &str) -> String {
    format!(
        "name: {name}\ntenant: {tenant}\ngang: {{resources: {{gpus: 1}}}}\nruntime: {{estimate: 1h}}\n\
         payload: {{command: [train], env: {{API_KEY: {SECRET}, LR: '3e-4'}}, secretEnv: [API_KEY]}}\n"
    )
}

/// Every answer body a test saw, to be searched for the secret at the end.
#[derive(Default)]
struct Seen(Vec<String>);

impl Seen {
    fn ok(&mut self, answer: Result<Value, ClientError>) -> Value {
        let value = answer.unwrap();
        self.0.push(value.to_string());
        value
    }

    /// The error status of `answer` (which must be an error), keeping its message.
    fn status(&mut self, answer: Result<Value, ClientError>) -> (u16, String) {
        let error = answer.expect_err("expected an error answer");
        self.0.push(error.to_string());
        (error.status().unwrap_or(0), error.to_string())
    }
}

/// A raw HTTP/1.1 request, for what the client does not show (headers of an error answer).
async fn raw(addr: std::net::SocketAddr, request: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_see_and_change_only_their_own_jobs_and_secrets_never_leave_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new();
    let config = write_auth_files(dir.path(), &issuer);
    // The harness asks as the admin whether `east` is connected.
    let f = Federation::builder()
        .in_dir(dir)
        .gateway_config(config)
        .token(ROOT)
        .cluster("east", ClusterOptions::default().prices("{a100-80g: 1.5}").nodes(NODES))
        .start()
        .await
        .unwrap();
    let (gateway, dir) = (&f.gateway, f.dir());
    assert!(!gateway.proc.log().contains("authentication is off"), "{}", gateway.proc.log());
    let as_user = |token: &str| gateway.client().with_token(Some(token.to_owned()));
    let (alice, bob, vic, root) = (as_user(ALICE), as_user(BOB), as_user(VIC), as_user(ROOT));
    let mut seen = Seen::default();

    // --- REST: submit in one's own tenant; a job's answer hides the secret.
    let (job_a, created) = alice.submit(&spec("vision-train", "vision")).await.unwrap();
    seen.0.push(job_a.to_string());
    assert!(created);
    assert_eq!(job_a["spec"]["payload"]["env"]["API_KEY"], "<secret: set>");
    assert_eq!(job_a["spec"]["payload"]["env"]["LR"], "3e-4");
    let a = job_a["id"].as_str().unwrap().to_owned();
    let (job_b, _) = bob.submit(&spec("nlp-train", "nlp")).await.unwrap();
    seen.0.push(job_b.to_string());
    let b = job_b["id"].as_str().unwrap().to_owned();

    // --- REST: bob (member of nlp) against alice's vision job, endpoint by endpoint.
    let (status, message) = seen.status(bob.submit(&spec("intruder", "vision")).await.map(|(v, _)| v));
    assert_eq!(status, 403);
    assert!(
        message.starts_with("bob may not submit a job to tenant vision: needs role member in tenant vision"),
        "{message}"
    );
    let (status, message) = seen.status(bob.get(&a).await);
    assert_eq!(status, 403);
    assert_eq!(
        message,
        format!("bob may not read job {a} of tenant vision: needs role viewer in tenant vision; bob is member in nlp")
    );
    assert_eq!(seen.status(bob.explain(&a).await).0, 403);
    assert_eq!(seen.status(bob.logs(&a, None, 1024).await).0, 403);
    assert_eq!(seen.status(bob.cancel(&a).await).0, 403);
    assert_eq!(seen.status(bob.list(Some("vision"), None, None).await).0, 403);
    let bobs = seen.ok(bob.list(None, None, None).await);
    let ids: Vec<&str> = bobs["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [b.as_str()], "an unfiltered list shows only the caller's tenants");
    // And alice against bob's job.
    assert_eq!(seen.status(alice.get(&b).await).0, 403);
    assert_eq!(seen.status(alice.cancel(&b).await).0, 403);
    // Still there and not cancelled.
    assert_eq!(seen.ok(root.get(&a).await)["spec"]["tenant"], "vision");

    // --- REST: a viewer reads but neither submits nor cancels.
    assert_eq!(seen.ok(vic.get(&a).await)["id"], a.as_str());
    seen.ok(vic.explain(&a).await);
    assert_eq!(seen.ok(vic.list(Some("vision"), None, None).await)["jobs"].as_array().unwrap().len(), 1);
    let (status, message) = seen.status(vic.submit(&spec("viewer-job", "vision")).await.map(|(v, _)| v));
    assert_eq!(status, 403);
    assert!(message.contains("vic is viewer in vision"), "{message}");
    let (status, message) = seen.status(vic.cancel(&a).await);
    assert_eq!(status, 403);
    assert!(message.contains(&format!("vic may not cancel job {a} of tenant vision")), "{message}");
    seen.ok(vic.clusters().await);
    // The owner's logs call is not refused for authorization (the member may not have output).
    if let Err(error) = alice.logs(&a, None, 1024).await {
        assert_ne!(error.status(), Some(403), "{error}");
    }

    // --- REST: an admin sees every tenant.
    let all = seen.ok(root.list(None, None, None).await);
    assert_eq!(all["jobs"].as_array().unwrap().len(), 2);

    // --- REST: no token or a bad one is 401 with the JSON body and `WWW-Authenticate: Bearer`.
    let anonymous = gateway.client();
    let (status, message) = seen.status(anonymous.list(None, None, None).await);
    assert_eq!(status, 401);
    assert!(message.contains("MERIDIAN_TOKEN"), "{message}");
    assert_eq!(seen.status(as_user("not-a-known-token").get(&a).await).0, 401);
    assert_eq!(seen.status(anonymous.clusters().await).0, 401);
    let answer = raw(gateway.rest, &format!("GET /v1/jobs/{a} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("www-authenticate: bearer"), "{answer}");
    assert!(answer.contains("\"code\":\"unauthenticated\""), "{answer}");
    let health = raw(gateway.rest, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert!(health.starts_with("HTTP/1.1 200"), "/healthz stays open: {health}");

    // --- JWTs: carol (member of nlp) sees bob's job only; expired and unsigned tokens are 401.
    let carol =
        as_user(&issuer.token(&json!({"alg": "ES256", "kid": "test-1"}), &claims("carol", &["nlp"], "member", 300)));
    let carols = seen.ok(carol.list(None, None, None).await);
    assert_eq!(carols["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(seen.status(carol.get(&a).await).0, 403);
    let expired = issuer.token(&json!({"alg": "ES256", "kid": "test-1"}), &claims("carol", &["nlp"], "member", -3600));
    let (status, message) = seen.status(as_user(&expired).list(None, None, None).await);
    assert_eq!(status, 401);
    assert!(message.contains("expired"), "{message}");
    let body = URL_SAFE_NO_PAD.encode(claims("mallory", &[], "admin", 300).to_string());
    let unsigned = format!("{}.{body}.", URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#));
    assert_eq!(seen.status(as_user(&unsigned).list(None, None, None).await).0, 401);

    // --- gRPC: the same rules on the Jobs service.
    let mut grpc = JobsClient::connect(format!("http://{}", gateway.grpc)).await.unwrap();
    let denied = |status: tonic::Status, seen: &mut Seen| {
        seen.0.push(status.message().to_owned());
        status.code()
    };
    let get_a = || pb::GetJobRequest { id: a.clone() };
    let status = grpc.get(authed(get_a(), BOB)).await.unwrap_err();
    assert!(status.message().contains("bob may not read job"), "{}", status.message());
    assert_eq!(denied(status, &mut seen), Code::PermissionDenied);
    let explain = pb::ExplainRequest { id: a.clone() };
    assert_eq!(denied(grpc.explain(authed(explain, BOB)).await.unwrap_err(), &mut seen), Code::PermissionDenied);
    let logs = pb::JobLogsRequest { id: a.clone(), from: None, max_bytes: 1024 };
    assert_eq!(denied(grpc.logs(authed(logs, BOB)).await.unwrap_err(), &mut seen), Code::PermissionDenied);
    let cancel = pb::CancelRequest { id: a.clone() };
    assert_eq!(denied(grpc.cancel(authed(cancel, BOB)).await.unwrap_err(), &mut seen), Code::PermissionDenied);
    let foreign_list = pb::ListJobsRequest { tenant: "vision".into(), ..Default::default() };
    assert_eq!(denied(grpc.list(authed(foreign_list, BOB)).await.unwrap_err(), &mut seen), Code::PermissionDenied);
    let intrude = pb::SubmitRequest { spec_text: spec("intruder", "vision") };
    assert_eq!(denied(grpc.submit(authed(intrude, BOB)).await.unwrap_err(), &mut seen), Code::PermissionDenied);
    let viewer_submit = pb::SubmitRequest { spec_text: spec("viewer-job", "vision") };
    assert_eq!(denied(grpc.submit(authed(viewer_submit, VIC)).await.unwrap_err(), &mut seen), Code::PermissionDenied);
    let viewer_cancel = pb::CancelRequest { id: a.clone() };
    assert_eq!(denied(grpc.cancel(authed(viewer_cancel, VIC)).await.unwrap_err(), &mut seen), Code::PermissionDenied);
    let unauthenticated = grpc.list(pb::ListJobsRequest::default()).await.unwrap_err();
    assert_eq!(denied(unauthenticated, &mut seen), Code::Unauthenticated);
    let bad = grpc.list_clusters(authed(pb::ListClustersRequest {}, "nope-nope-nope")).await.unwrap_err();
    assert_eq!(denied(bad, &mut seen), Code::Unauthenticated);
    let listed = grpc.list(authed(pb::ListJobsRequest::default(), BOB)).await.unwrap().into_inner();
    assert_eq!(listed.jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), [b.as_str()]);
    seen.0.push(format!("{listed:?}"));
    let mine = grpc.get(authed(get_a(), ALICE)).await.unwrap().into_inner();
    let env = &mine.spec.as_ref().unwrap().payload.as_ref().unwrap().env;
    assert_eq!(env["API_KEY"], "<secret: set>");
    seen.0.push(format!("{mine:?}"));
    let all = grpc.list(authed(pb::ListJobsRequest::default(), ROOT)).await.unwrap().into_inner();
    assert_eq!(all.jobs.len(), 2);
    seen.0.push(format!("{all:?}"));
    let explained = grpc.explain(authed(pb::ExplainRequest { id: a.clone() }, VIC)).await.unwrap().into_inner();
    seen.0.push(explained.explanation_json);
    let submitted = grpc.submit(authed(pb::SubmitRequest { spec_text: spec("via-grpc", "nlp") }, BOB)).await;
    seen.0.push(format!("{:?}", submitted.unwrap().into_inner()));

    // --- CLI: the token comes from MERIDIAN_TOKEN or a file; refusals print the server's message.
    let cli = |args: &[&str], token: Option<&str>| {
        let mut command = std::process::Command::new(&meridian_e2e::binaries().meridian);
        command.args(args).env("MERIDIAN_GATEWAY", gateway.rest.to_string()).env_remove("MERIDIAN_TOKEN_FILE");
        match token {
            Some(token) => command.env("MERIDIAN_TOKEN", token),
            None => command.env_remove("MERIDIAN_TOKEN"),
        };
        command.output().unwrap()
    };
    let out = cli(&["jobs", "-o", "json"], Some(BOB));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(listed["jobs"].as_array().unwrap().iter().all(|j| j["spec"]["tenant"] == "nlp"));
    let out = cli(&["job", &a], Some(BOB));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("bob may not read job {a}")));
    let out = cli(&["jobs"], None);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("authentication required"));
    std::fs::write(dir.join("alice.token"), format!("{ALICE}\n")).unwrap();
    let token_file = dir.join("alice.token");
    for args in
        [vec!["job", a.as_str(), "-o", "json"], vec!["job", a.as_str()], vec!["jobs"], vec!["explain", a.as_str()]]
    {
        let mut args = args;
        args.extend(["--token-file", token_file.to_str().unwrap()]);
        let out = cli(&args, None);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        seen.0.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }

    // --- Finally each owner cancels its own job, and the answers hide the secret too.
    seen.ok(alice.cancel(&a).await);
    seen.ok(bob.cancel(&b).await);

    for body in &seen.0 {
        assert!(!body.contains(SECRET), "an answer showed the secret: {body}");
    }
    assert!(seen.0.len() > 40, "only {} answers were searched", seen.0.len());
    let log = gateway.proc.log();
    assert!(!log.contains(SECRET), "the gateway logged the secret");
    assert!(log.contains("request denied") && log.contains("subject=bob"), "denials are logged with the subject");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_auth_the_gateway_warns_and_everyone_is_an_admin() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), GATEWAY_CONFIG).await.unwrap();
    let client: Client = gateway.client();
    let (job, _) = client.submit(&spec("open", "anyone")).await.unwrap();
    assert_eq!(job["spec"]["payload"]["env"]["API_KEY"], "<secret: set>");
    assert!(gateway.proc.log().contains("authentication is off"), "{}", gateway.proc.log());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_token_works_without_a_restart_and_a_bad_tokens_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = Issuer::new();
    let config = write_auth_files(dir.path(), &issuer);
    let gateway = Gateway::start(dir.path(), &config).await.unwrap();
    let new_token = "alice-token-rotated-0002";
    let tokens = std::fs::read_to_string(dir.path().join("tokens.yaml")).unwrap();
    std::fs::write(dir.path().join("tokens.yaml"), tokens.replace(&sha256_hex(ALICE), &sha256_hex(new_token))).unwrap();
    let rotated = gateway.client().with_token(Some(new_token.to_owned()));
    poll(Duration::from_secs(10), || async { rotated.list(None, None, None).await.ok() }).await.unwrap();
    let old = gateway.client().with_token(Some(ALICE.to_owned())).list(None, None, None).await.unwrap_err();
    assert_eq!(old.status(), Some(401));
    drop(gateway);

    let other = tempfile::tempdir().unwrap();
    let config = write_auth_files(other.path(), &issuer);
    std::fs::write(other.path().join("tokens.yaml"), "tokens: [{subject: x, role: member, token: short}]\n").unwrap();
    let err = Gateway::start(other.path(), &config).await.err().unwrap().to_string();
    assert!(err.contains("tokens[0].token: must be at least 16 characters"), "{err}");
}
