//! The Helm charts in `deploy/helm/` and the container files in `deploy/docker/`, checked without
//! a cluster: `helm lint` and `helm template` for each chart with its default values and the
//! value combinations that change what is rendered; every manifest parses into its typed
//! Kubernetes struct with nothing lost and its references resolve (`meridian_e2e::manifests`);
//! and the gateway and agent configs inside the rendered ConfigMaps are loaded by the binaries'
//! own loaders, so a chart can never ship a config the binary refuses.
//!
//! Needs a helm binary in `MERIDIAN_HELM` (`scripts/test.sh` gets one with
//! `scripts/helm/ensure.sh`); without it the tests fail, unless `MERIDIAN_SKIP_HELM=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Container;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use meridian_agent::config::AgentConfig;
use meridian_e2e::manifests::{External, FileSource, Manifests, PodTemplate, Render, helm, repo_root};
use meridian_gateway::config::GatewayConfig;
use meridian_gateway::config::store::StoreKind;
use serde_json::Value;

/// The Secret names the charts derive when the values name none (release `meridian-gateway`,
/// and agent release `east`).
const GATEWAY_TLS: &str = "meridian-gateway-tls";
const AGENT_TLS: &str = "east-meridian-agent-tls";

fn helm_or_skip() -> Option<PathBuf> {
    match helm() {
        Ok(Some(path)) => Some(path),
        Ok(None) => {
            eprintln!("skipped: no helm binary and MERIDIAN_SKIP_HELM=1");
            None
        }
        Err(e) => panic!("{e:#}"),
    }
}

fn assert_clean(manifests: &Manifests, external: External<'_>, case: &str) {
    let mut problems = manifests.problems(external);
    // `Manifests::problems` has no typed struct for PodDisruptionBudgets (the gateway chart's,
    // with etcd): each is checked here instead, and the "not a kind" problem set aside.
    for doc in manifests.of_kind("PodDisruptionBudget") {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        assert_eq!(doc["apiVersion"], "policy/v1", "{case}: PodDisruptionBudget/{name}");
        let typed: PodDisruptionBudget = serde_json::from_value(doc.clone())
            .unwrap_or_else(|e| panic!("{case}: PodDisruptionBudget/{name} does not parse: {e}"));
        assert_eq!(
            &serde_json::to_value(&typed).unwrap(),
            doc,
            "{case}: PodDisruptionBudget/{name} has fields not in the schema"
        );
        let selector = typed.spec.and_then(|s| s.selector).and_then(|s| s.match_labels).unwrap_or_default();
        assert!(!selector.is_empty(), "{case}: PodDisruptionBudget/{name} selects every pod of the namespace");
        let picked = manifests.pods().iter().any(|(_, pod)| {
            let labels = pod.labels();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        });
        assert!(picked, "{case}: PodDisruptionBudget/{name} picks no rendered workload's pods");
        problems.retain(|p| {
            !p.starts_with(&format!("PodDisruptionBudget/{name}: policy/v1 PodDisruptionBudget is not a kind"))
        });
    }
    assert!(problems.is_empty(), "{case}: the rendered manifests have problems:\n{}", problems.join("\n"));
}

/// The path after `--config` in a container's args.
fn config_arg(container: &Container) -> String {
    let args = container.args.clone().unwrap_or_default();
    let at = args.iter().position(|a| a == "--config").unwrap_or_else(|| panic!("no --config in {args:?}"));
    args.get(at + 1).cloned().unwrap_or_else(|| panic!("--config without a path in {args:?}"))
}

/// The text of the ConfigMap key a file inside the container comes from.
fn config_text(manifests: &Manifests, pod: &PodTemplate, container: &Container, path: &str) -> String {
    match pod.file(container, path) {
        Some(FileSource::ConfigMap { name, key }) => {
            let cm = manifests.get("ConfigMap", &name).unwrap_or_else(|| panic!("ConfigMap {name} not rendered"));
            cm["data"][&key].as_str().unwrap_or_else(|| panic!("ConfigMap {name} has no key {key}")).to_string()
        }
        other => panic!("{path} does not come from a rendered ConfigMap but from {other:?}"),
    }
}

fn assert_secret_file(pod: &PodTemplate, container: &Container, path: &Path, secret: &str, field: &str) {
    let path = path.display().to_string();
    match pod.file(container, &path) {
        Some(FileSource::Secret { name, key }) => {
            assert_eq!(name, secret, "{field} ({path}) comes from Secret {name}, expected {secret}");
            assert!(!key.is_empty(), "{field} ({path}) is the Secret's mount directory, not one of its keys");
        }
        other => panic!("{field} ({path}) is not a mounted Secret key but {other:?}"),
    }
}

fn port_named(container: &Container, name: &str) -> i32 {
    container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("container {} has no port {name}", container.name))
        .container_port
}

struct GatewayRender {
    manifests: Manifests,
    pod: PodTemplate,
    config: GatewayConfig,
    /// The StatefulSet's replicas.
    replicas: Option<i32>,
}

impl GatewayRender {
    fn container(&self) -> &Container {
        self.pod.container("gateway").expect("the gateway container")
    }

    /// The path of the HTTP GET of a probe (`liveness` or `readiness`) of the gateway container.
    fn probe_path(&self, which: &str) -> String {
        let container = self.container();
        let probe = if which == "liveness" { &container.liveness_probe } else { &container.readiness_probe };
        probe.as_ref().and_then(|p| p.http_get.as_ref()).and_then(|g| g.path.clone()).expect("an HTTP probe")
    }
}

/// A file the chart's `prepare` init container writes: from which source file, and how.
#[derive(Debug)]
struct Prepared {
    /// The file it is made from, as the init container sees it.
    source: String,
    /// `sed` (the config: `{pod}` replaced by the pod's name) or `install` (copied, mode 0600).
    how: &'static str,
}

/// What the gateway pod's `prepare` init container writes, by destination path, read from its
/// script (`sed "s/{pod}/${POD_NAME}/g" SRC > DST`, `install -m 0600 SRC DST`); empty without one.
fn prepared_files(pod: &PodTemplate) -> Vec<(String, Prepared, Container)> {
    let Some(init) = pod.spec.init_containers.iter().flatten().find(|c| c.name == "prepare") else {
        return Vec::new();
    };
    let script = init.args.clone().unwrap_or_default().join("\n");
    let mut files = Vec::new();
    for line in script.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["sed", expression, source, ">", destination] => {
                assert_eq!(*expression, "\"s/{pod}/${POD_NAME}/g\"", "the config gets the pod's name");
                files.push((
                    destination.to_string(),
                    Prepared { source: source.to_string(), how: "sed" },
                    init.clone(),
                ));
            }
            ["install", "-m", "0600", source, destination] => {
                files.push((
                    destination.to_string(),
                    Prepared { source: source.to_string(), how: "install" },
                    init.clone(),
                ));
            }
            ["set", "-eu"] | [] => {}
            other => panic!("the prepare init container runs a line the test does not know: {other:?}"),
        }
    }
    let pod_name = init.env.iter().flatten().find(|e| e.name == "POD_NAME").expect("POD_NAME in the init container");
    let field = pod_name.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str());
    assert_eq!(field, Some("metadata.name"), "POD_NAME comes from the downward API");
    files
}

/// The volume mounted at the longest prefix of `path` in `container` (read-only or not).
fn mounted_volume(container: &Container, path: &str) -> Option<String> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| path == m.mount_path || path.starts_with(&format!("{}/", m.mount_path.trim_end_matches('/'))))
        .max_by_key(|m| m.mount_path.len())
        .map(|m| m.name.clone())
}

/// The gateway config the container reads: the ConfigMap key mounted at `path`, or, when the
/// `prepare` init container writes `path` into a volume both share, the ConfigMap text it starts
/// from with `{pod}` replaced by `pod_name`.
fn gateway_config_text(
    manifests: &Manifests,
    pod: &PodTemplate,
    container: &Container,
    path: &str,
    pod_name: &str,
) -> String {
    if let Some(FileSource::ConfigMap { .. }) = pod.file(container, path) {
        return config_text(manifests, pod, container, path);
    }
    let files = prepared_files(pod);
    let (_, prepared, init) = files
        .iter()
        .find(|(destination, _, _)| destination == path)
        .unwrap_or_else(|| panic!("{path} comes neither from a ConfigMap nor from the prepare init container"));
    assert_eq!(prepared.how, "sed");
    let Some(FileSource::Writable { volume: written }) = pod.file(init, path) else {
        panic!("{path}: not on a volume the init container writes");
    };
    assert_eq!(
        mounted_volume(container, path),
        Some(written),
        "{path}: the gateway reads what the init container wrote"
    );
    config_text(manifests, pod, init, &prepared.source).replace("{pod}", pod_name)
}

/// Renders the gateway chart and checks what every value combination must satisfy, whatever the
/// store: the config the gateway reads (as pod `pod_name` of the StatefulSet) loads, ports and
/// addresses agree, probes speak the ports' scheme, and a secrets key file is this pod's copy
/// (mode 0600) of the Secret `key_secret`.
fn render_gateway_pod(
    helm: &Path,
    values: &str,
    secrets: &[&str],
    key_secret: Option<&str>,
    case: &str,
) -> GatewayRender {
    let manifests = Render::new("meridian-gateway", "meridian-gateway")
        .values(values)
        .template(helm)
        .unwrap_or_else(|e| panic!("{case}: helm template failed: {e:#}"));
    assert_clean(&manifests, External { secrets, ..External::default() }, case);
    let statefulset: k8s_openapi::api::apps::v1::StatefulSet = manifests.only("StatefulSet").unwrap();
    let pod_name = format!("{}-0", statefulset.metadata.name.as_deref().unwrap());
    let replicas = statefulset.spec.as_ref().and_then(|s| s.replicas);
    let (_, pod) = manifests.pods().into_iter().find(|(at, _)| at.starts_with("StatefulSet/")).unwrap();
    let container = pod.container("gateway").unwrap_or_else(|| panic!("{case}: no container named gateway"));
    let path = config_arg(container);
    let text = gateway_config_text(&manifests, &pod, container, &path, &pod_name);
    let config = GatewayConfig::parse(&text, Path::new(&path))
        .unwrap_or_else(|e| panic!("{case}: the gateway refuses the rendered config:\n{e}\n--- config ---\n{text}"));
    assert_eq!(config.listen.port() as i32, port_named(container, "rest"), "{case}: listen vs the rest port");
    assert_eq!(config.grpc_listen.port() as i32, port_named(container, "grpc"), "{case}: grpcListen vs the grpc port");
    assert!(
        config.listen.ip().is_unspecified() && config.grpc_listen.ip().is_unspecified(),
        "{case}: must listen on all addresses in a pod"
    );
    match (&config.secrets.key_file, key_secret) {
        (None, None) => {}
        (Some(key_file), Some(secret)) => {
            let key_file = key_file.display().to_string();
            let files = prepared_files(&pod);
            let (_, prepared, init) = files
                .iter()
                .find(|(destination, _, _)| *destination == key_file)
                .unwrap_or_else(|| panic!("{case}: secrets.keyFile {key_file} is not written by the init container"));
            assert_eq!(prepared.how, "install", "{case}: the key is copied with mode 0600");
            assert_secret_file(&pod, init, Path::new(&prepared.source), secret, "secrets.keyFile (source)");
            let Some(FileSource::Writable { volume: written }) = pod.file(init, &key_file) else {
                panic!("{case}: secrets.keyFile {key_file} is not on a volume the init container writes");
            };
            assert_eq!(
                mounted_volume(container, &key_file).as_ref(),
                Some(&written),
                "{case}: the gateway reads the key copy the init container writes"
            );
            let volume = pod.spec.volumes.iter().flatten().find(|v| v.name == written).unwrap();
            let medium = volume.empty_dir.as_ref().and_then(|e| e.medium.as_deref());
            assert_eq!(medium, Some("Memory"), "{case}: the key's copy never touches the node's disk");
        }
        (key_file, secret) => panic!("{case}: secrets.keyFile {key_file:?} vs the Secret expected {secret:?}"),
    }
    let container = container.clone();
    let scheme = if config.tls.is_some() { "HTTPS" } else { "HTTP" };
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("an HTTP probe");
        assert_eq!(get.scheme.as_deref(), Some(scheme), "{case}: probe scheme");
    }
    GatewayRender { manifests, pod, config, replicas }
}

/// Renders the gateway chart with the embedded store: one replica, its data on a writable
/// volume, both probes on `/healthz`.
fn render_gateway(helm: &Path, values: &str, secrets: &[&str], case: &str) -> GatewayRender {
    render_gateway_keyed(helm, values, secrets, None, case)
}

fn render_gateway_keyed(
    helm: &Path,
    values: &str,
    secrets: &[&str],
    key_secret: Option<&str>,
    case: &str,
) -> GatewayRender {
    let render = render_gateway_pod(helm, values, secrets, key_secret, case);
    assert_eq!(render.config.store.kind, StoreKind::Embedded, "{case}");
    assert_eq!(render.replicas, Some(1), "{case}: one writer of the store");
    let data_dir = render.config.data_dir.display().to_string();
    assert!(
        matches!(render.pod.file(render.container(), &data_dir), Some(FileSource::Writable { .. })),
        "{case}: dataDir {data_dir} is not a writable volume"
    );
    assert_eq!(render.probe_path("liveness"), "/healthz", "{case}");
    assert_eq!(render.probe_path("readiness"), "/healthz", "{case}");
    assert_eq!(render.manifests.of_kind("PodDisruptionBudget").count(), 0, "{case}: no budget for one pod");
    render
}

/// Renders the gateway chart with `store.kind: etcd`: several gateways, no volume for data, a
/// readiness probe on `/readyz`, a PodDisruptionBudget, and each pod advertising its own address.
fn render_gateway_on_etcd(helm: &Path, values: &str, secrets: &[&str], key_secret: &str, case: &str) -> GatewayRender {
    let render = render_gateway_pod(helm, values, secrets, Some(key_secret), case);
    assert_eq!(render.config.store.kind, StoreKind::Etcd, "{case}");
    assert_eq!(render.probe_path("liveness"), "/healthz", "{case}: liveness stays /healthz");
    assert_eq!(render.probe_path("readiness"), "/readyz", "{case}: ready = leader or warm standby");
    let statefulset = render.manifests.get("StatefulSet", "meridian-gateway").unwrap();
    assert!(statefulset["spec"]["volumeClaimTemplates"].is_null(), "{case}: the state lives in etcd, no volume");
    let headless = statefulset["spec"]["serviceName"].as_str().unwrap();
    let service = render.manifests.get("Service", headless).expect("the headless Service");
    assert_eq!(service["spec"]["clusterIP"], "None", "{case}: {headless} is headless");
    assert_eq!(render.config.ha.name.as_deref(), Some("meridian-gateway-0"), "{case}: ha.name is the pod's name");
    let pdb: PodDisruptionBudget = render.manifests.only("PodDisruptionBudget").unwrap();
    assert_eq!(pdb.spec.and_then(|s| s.max_unavailable), Some(IntOrString::Int(1)), "{case}: one gateway at a time");
    render
}

#[test]
fn gateway_chart_lints_and_renders_with_its_defaults() {
    let Some(helm) = helm_or_skip() else { return };
    Render::new("meridian-gateway", "meridian-gateway").lint(&helm).unwrap();
    let render = render_gateway(&helm, "{}", &[GATEWAY_TLS], "defaults");
    let tls = render.config.tls.clone().expect("TLS is on by default");
    for (field, path) in [("tls.cert", &tls.cert), ("tls.key", &tls.key), ("tls.clientCa", &tls.client_ca)] {
        assert_secret_file(&render.pod, render.container(), path, GATEWAY_TLS, field);
    }
    assert!(render.config.auth.is_none());
    assert!(
        render.manifests.get("StatefulSet", "meridian-gateway").unwrap()["spec"]["volumeClaimTemplates"].is_array()
    );
    let services: BTreeSet<&str> =
        render.manifests.of_kind("Service").filter_map(|s| s["metadata"]["name"].as_str()).collect();
    assert_eq!(
        services,
        BTreeSet::from(["meridian-gateway-headless", "meridian-gateway-rest", "meridian-gateway-grpc"])
    );
    assert_eq!(
        render.manifests.of_kind("ServiceMonitor").count() + render.manifests.of_kind("PrometheusRule").count(),
        0
    );
}

#[test]
fn gateway_chart_renders_plain_text_without_a_volume() {
    let Some(helm) = helm_or_skip() else { return };
    let render = render_gateway(&helm, "tls: {enabled: false}\npersistence: {enabled: false}\n", &[], "no TLS");
    assert!(render.config.insecure && render.config.tls.is_none());
    let pod_volumes = render.pod.spec.volumes.clone().unwrap_or_default();
    assert!(
        pod_volumes.iter().any(|v| v.name == "data" && v.empty_dir.is_some()),
        "an emptyDir stands in for the volume"
    );
    assert!(pod_volumes.iter().all(|v| v.secret.is_none()), "no Secret without TLS or auth");
}

#[test]
fn gateway_chart_wires_auth_secrets_tenants_and_monitoring() {
    let Some(helm) = helm_or_skip() else { return };
    let values = r#"
tls: {existingSecret: gw-certs, certKey: gateway.pem, keyKey: gateway.key, clientCaKey: ca.pem}
auth:
  tokensSecret: gw-tokens
  jwt: {enabled: true, issuer: "https://idp.example", audience: meridian, jwksSecret: gw-jwks}
config:
  tenants:
    nlp: {weight: 2, quota: {maxGpus: 64, submitsPerSecond: 5}}
    vision: {weight: 1}
  defaultQuota: {maxQueuedJobs: 100}
  retention: 72h
serviceMonitor:
  enabled: true
  labels: {release: prometheus}
  bearerTokenSecret: {name: gw-scrape}
  tlsConfig: {ca: {secret: {name: gw-certs, key: ca.pem}}, serverName: meridian-gateway-rest.meridian.svc}
service:
  grpc: {type: LoadBalancer}
"#;
    let render = render_gateway(&helm, values, &["gw-certs", "gw-tokens", "gw-jwks"], "auth + monitoring");
    let tls = render.config.tls.clone().unwrap();
    assert_secret_file(&render.pod, render.container(), &tls.cert, "gw-certs", "tls.cert");
    assert!(tls.cert.ends_with("gateway.pem"), "the key named in the values: {}", tls.cert.display());
    assert_secret_file(&render.pod, render.container(), &tls.client_ca, "gw-certs", "tls.clientCa");
    let auth = render.config.auth.clone().expect("auth rendered");
    assert_secret_file(
        &render.pod,
        render.container(),
        auth.tokens_file.as_ref().unwrap(),
        "gw-tokens",
        "auth.tokensFile",
    );
    let jwt = auth.jwt.expect("jwt rendered");
    assert_secret_file(&render.pod, render.container(), &jwt.jwks_file, "gw-jwks", "auth.jwt.jwksFile");
    assert_eq!(render.config.tenant_weight("nlp"), 2.0);
    assert_eq!(render.config.quota("nlp").0.max_gpus, Some(64));
    let monitor = render.manifests.of_kind("ServiceMonitor").next().expect("a ServiceMonitor");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https");
    assert_eq!(endpoint["authorization"]["credentials"]["name"], "gw-scrape");
    assert_eq!(endpoint["tlsConfig"]["ca"]["secret"]["key"], "ca.pem", "the CA of the values, not insecureSkipVerify");
    assert!(endpoint["tlsConfig"]["insecureSkipVerify"].is_null());
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    let grpc = render.manifests.get("Service", "meridian-gateway-grpc").unwrap();
    assert_eq!(grpc["spec"]["type"], "LoadBalancer");
}

/// A copy of the gateway chart with a rules file in `files/`: the project's own
/// `deploy/prometheus/rules.yaml` when it exists, else a small one.
fn chart_with_rules() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&repo_root().join("deploy/helm/meridian-gateway"), &dir.path().join("meridian-gateway"));
    let project_rules = repo_root().join("deploy/prometheus/rules.yaml");
    let rules = std::fs::read_to_string(&project_rules).unwrap_or_else(|_| {
        "groups:\n  - name: meridian\n    rules:\n      - alert: MeridianClusterLost\n        expr: meridian_cluster_connected == 0\n        for: 1m\n".into()
    });
    std::fs::write(dir.path().join("meridian-gateway/files/rules.yaml"), rules).unwrap();
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn gateway_chart_renders_the_rules_file_as_a_prometheus_rule() {
    let Some(helm) = helm_or_skip() else { return };
    let copy = chart_with_rules();
    let mut render = Render::new("meridian-gateway", "meridian-gateway").values("prometheusRule: {enabled: true}\n");
    render.chart = copy.path().join("meridian-gateway");
    render.lint(&helm).unwrap();
    let manifests = render.template(&helm).unwrap();
    assert_clean(&manifests, External { secrets: &[GATEWAY_TLS], ..External::default() }, "prometheusRule");
    let rule = manifests.of_kind("PrometheusRule").next().expect("a PrometheusRule");
    let file: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(render.chart.join("files/rules.yaml")).unwrap()).unwrap();
    assert_eq!(rule["spec"]["groups"], file["groups"], "the groups of files/rules.yaml, unchanged");
}

#[test]
fn gateway_chart_runs_three_gateways_on_etcd_with_a_budget_and_role_aware_probes() {
    let Some(helm) = helm_or_skip() else { return };
    let values = r#"
store:
  kind: etcd
  etcd:
    endpoints: [https://etcd-0.etcd:2379, https://etcd-1.etcd:2379, https://etcd-2.etcd:2379]
    prefix: /meridian/prod/
    tls: {enabled: true, existingSecret: etcd-client}
    username: meridian
    passwordSecret: etcd-password
config:
  tenants: {nlp: {weight: 2}}
"#;
    let secrets = [GATEWAY_TLS, "meridian-gateway-secrets", "etcd-client", "etcd-password"];
    let render = render_gateway_on_etcd(&helm, values, &secrets, "meridian-gateway-secrets", "etcd");
    assert_eq!(render.replicas, Some(3), "three gateways by default with etcd");
    let etcd = render.config.store.etcd.clone().expect("store.etcd rendered");
    assert_eq!(
        etcd.endpoints,
        ["https://etcd-0.etcd:2379", "https://etcd-1.etcd:2379", "https://etcd-2.etcd:2379"],
        "the endpoints of the values, in order"
    );
    assert_eq!(etcd.prefix, "/meridian/prod/");
    assert_eq!((etcd.max_txn_ops, etcd.max_request_bytes), (1024, 8 * 1024 * 1024), "the gateway's defaults");
    let tls = etcd.tls.expect("etcd TLS rendered");
    for (field, path) in [
        ("store.etcd.tls.ca", Some(&tls.ca)),
        ("store.etcd.tls.cert", tls.cert.as_ref()),
        ("store.etcd.tls.key", tls.key.as_ref()),
    ] {
        assert_secret_file(&render.pod, render.container(), path.expect(field), "etcd-client", field);
    }
    assert_eq!(etcd.username.as_deref(), Some("meridian"));
    let password = etcd.password_file.expect("passwordFile rendered");
    assert_secret_file(&render.pod, render.container(), &password, "etcd-password", "store.etcd.passwordFile");
    let pod_host = "meridian-gateway-0.meridian-gateway-headless.meridian.svc.cluster.local";
    assert_eq!(render.config.ha.advertise_rest.as_deref(), Some(&*format!("https://{pod_host}:7070")));
    assert_eq!(render.config.ha.advertise_grpc.as_deref(), Some(&*format!("https://{pod_host}:7071")));
    assert_eq!(render.config.tenant_weight("nlp"), 2.0, "the rest of the config as it was");
    let gateway_tls = render.config.tls.clone().expect("TLS on the gateway's ports");
    assert_secret_file(&render.pod, render.container(), &gateway_tls.cert, GATEWAY_TLS, "tls.cert");
    let statefulset = render.manifests.get("StatefulSet", "meridian-gateway").unwrap();
    assert_eq!(statefulset["spec"]["podManagementPolicy"], "Parallel", "gateways start together");
    let anti = &statefulset["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
    assert!(anti["preferredDuringSchedulingIgnoredDuringExecution"].is_array(), "gateways spread over nodes");
}

#[test]
fn gateway_chart_on_plain_etcd_takes_replicas_and_advertised_hosts_from_the_values() {
    let Some(helm) = helm_or_skip() else { return };
    let values = r#"
replicas: 5
tls: {enabled: false}
store: {kind: etcd, etcd: {endpoints: [http://10.0.0.1:2379], maxTxnOps: 2048}}
secrets: {existingSecret: gw-key, key: key-file}
ha: {leaseTtl: 4s, stepDownMargin: 1s, advertiseHost: "{pod}.gw.example.com"}
podDisruptionBudget: {maxUnavailable: 1}
"#;
    let render = render_gateway_on_etcd(&helm, values, &["gw-key"], "gw-key", "plain etcd");
    assert_eq!(render.replicas, Some(5));
    assert!(render.config.insecure);
    let etcd = render.config.store.etcd.clone().unwrap();
    assert_eq!(etcd.endpoints, ["http://10.0.0.1:2379"]);
    assert_eq!(etcd.max_txn_ops, 2048);
    assert!(etcd.tls.is_none() && etcd.username.is_none());
    assert_eq!(render.config.ha.advertise_rest.as_deref(), Some("http://meridian-gateway-0.gw.example.com:7070"));
    assert_eq!(render.config.ha.advertise_grpc.as_deref(), Some("http://meridian-gateway-0.gw.example.com:7071"));
    assert_eq!(render.config.ha.lease_ttl.0.as_secs(), 4);
    assert!(render.config.secrets.key_file.as_ref().unwrap().ends_with("key-file"));
}

#[test]
fn gateway_chart_with_the_embedded_store_can_take_its_secrets_key_from_a_secret() {
    let Some(helm) = helm_or_skip() else { return };
    let render = render_gateway_keyed(
        &helm,
        "secrets: {existingSecret: gw-key}\n",
        &[GATEWAY_TLS, "gw-key"],
        Some("gw-key"),
        "embedded with a key Secret",
    );
    assert!(render.config.secrets.key_file.is_some());
    // Without one, the gateway makes the key on its volume: no init container at all.
    let plain = render_gateway(&helm, "{}", &[GATEWAY_TLS], "embedded");
    assert!(plain.config.secrets.key_file.is_none() && plain.pod.spec.init_containers.is_none());
}

#[test]
fn gateway_chart_refuses_values_it_cannot_run_with() {
    let Some(helm) = helm_or_skip() else { return };
    for (values, expected) in [
        ("store: {kind: etcd}\n", "store.etcd.endpoints"),
        ("store: {kind: postgres}\n", "/store/kind"),
        ("replicas: 2\n", "replicas: 2 with store.kind embedded: the embedded store has one writer"),
        (
            "store: {kind: etcd, etcd: {endpoints: ['http://e:2379'], tls: {enabled: true}}}\n",
            "store.etcd.endpoints[0]",
        ),
        ("store: {kind: etcd, etcd: {endpoints: ['http://e:2379'], username: u}}\n", "store.etcd.passwordSecret"),
        (
            "store: {kind: etcd, etcd: {endpoints: ['http://e:2379']}}\nha: {advertiseHost: gw.example.com}\n",
            "ha.advertiseHost",
        ),
        ("config: {store: {kind: etcd}}\n", "config.store"),
        ("config: {listen: '0.0.0.0:80'}\n", "config.listen"),
        ("prometheusRule: {enabled: true}\n", "files/rules.yaml"),
        ("auth: {jwt: {enabled: true, issuer: x, audience: meridian}}\n", "auth.jwt.jwksSecret"),
        ("persistance: {size: 1Gi}\n", "persistance"),
    ] {
        let error = Render::new("meridian-gateway", "meridian-gateway")
            .values(values)
            .template(&helm)
            .map(|_| ())
            .expect_err(values);
        assert!(format!("{error:#}").contains(expected), "{values}: the error should name {expected}: {error:#}");
    }
}

struct AgentRender {
    manifests: Manifests,
    pod: PodTemplate,
    config: AgentConfig,
}

fn render_agent(helm: &Path, values: &str, external: External<'_>, case: &str) -> AgentRender {
    render_agent_as(helm, "east", values, external, case)
}

fn render_agent_as(helm: &Path, release: &str, values: &str, external: External<'_>, case: &str) -> AgentRender {
    let render = Render::new("meridian-agent", release).values(values);
    render.lint(helm).unwrap_or_else(|e| panic!("{case}: {e:#}"));
    let manifests = render.template(helm).unwrap_or_else(|e| panic!("{case}: helm template failed: {e:#}"));
    assert_clean(&manifests, external, case);
    let deployment: k8s_openapi::api::apps::v1::Deployment = manifests.only("Deployment").unwrap();
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(1), "{case}: one agent speaks for the cluster");
    assert_eq!(spec.strategy.and_then(|s| s.type_).as_deref(), Some("Recreate"), "{case}");
    let (_, pod) = manifests.pods().into_iter().next().unwrap();
    let container = pod.container("agent").unwrap_or_else(|| panic!("{case}: no container named agent")).clone();
    let path = config_arg(&container);
    let text = config_text(&manifests, &pod, &container, &path);
    let config = AgentConfig::parse(&text, Path::new(&path))
        .unwrap_or_else(|e| panic!("{case}: the agent refuses the rendered config:\n{e}\n--- config ---\n{text}"));
    if let Some(tls) = &config.tls {
        let secret = external.secrets.first().expect("the TLS secret");
        for (field, path) in [("tls.ca", &tls.ca), ("tls.cert", &tls.cert), ("tls.key", &tls.key)] {
            assert_secret_file(&pod, &container, path, secret, field);
        }
    }
    let kubernetes = config.backend == meridian_proto::inventory::BackendKind::Kubernetes;
    assert_eq!(pod.spec.automount_service_account_token, Some(kubernetes), "{case}: API token only for kubernetes");
    AgentRender { manifests, pod, config }
}

fn tls_only<'a>(secrets: &'a [&'a str]) -> External<'a> {
    External { secrets, ..External::default() }
}

/// The rules of the ClusterRole and the Role in an example RBAC file of
/// `deploy/examples/kubernetes/`.
fn example_rules(file: &str) -> (Vec<PolicyRule>, Vec<PolicyRule>) {
    let text = std::fs::read_to_string(repo_root().join("deploy/examples/kubernetes").join(file)).unwrap();
    let example = Manifests::parse(&text).unwrap();
    let cluster: ClusterRole = example.only("ClusterRole").unwrap();
    let role: Role = example.only("Role").unwrap();
    (cluster.rules.unwrap_or_default(), role.rules.unwrap_or_default())
}

fn assert_rbac_matches_example(render: &AgentRender, file: &str, jobs_namespace: &str) {
    let (cluster_rules, role_rules) = example_rules(file);
    let cluster: ClusterRole = render.manifests.only("ClusterRole").unwrap();
    let role: Role = render.manifests.only("Role").unwrap();
    assert_eq!(cluster.rules.unwrap_or_default(), cluster_rules, "ClusterRole rules vs {file}");
    assert_eq!(role.rules.unwrap_or_default(), role_rules, "Role rules vs {file}");
    assert_eq!(role.metadata.namespace.as_deref(), Some(jobs_namespace), "the Role sits where the jobs are created");
    let binding = render.manifests.of_kind("RoleBinding").next().unwrap();
    assert_eq!(binding["metadata"]["namespace"], jobs_namespace);
    assert_eq!(binding["subjects"][0]["namespace"], "meridian", "the ServiceAccount lives in the release namespace");
}

#[test]
fn agent_chart_renders_volcano_with_the_rbac_the_backend_calls() {
    let Some(helm) = helm_or_skip() else { return };
    let values = r#"
cluster: k8s-east
region: us-east
kubernetes:
  mode: volcano
  queues: {vision: vision, nlp: nlp}
  gpuTypes: {NVIDIA-H100-NVL: h100}
  priorityClasses: [{minPriority: 80, name: meridian-high}, {minPriority: 0, name: meridian-normal}]
config:
  prices: {h100: 2.40}
  labels: {gpu-fabric: ib}
"#;
    let render = render_agent(&helm, values, tls_only(&[AGENT_TLS]), "volcano");
    assert_eq!(render.config.cluster, "k8s-east");
    let kubernetes = render.config.kubernetes.clone().expect("the kubernetes section");
    assert_eq!(kubernetes.namespace, "meridian", "jobs go to the release namespace by default");
    assert_eq!(kubernetes.queue_for("nlp"), "nlp");
    assert_rbac_matches_example(&render, "rbac-volcano.yaml", "meridian");
    assert_eq!(
        render.pod.spec.service_account_name.as_deref(),
        render.manifests.of_kind("ServiceAccount").next().and_then(|s| s["metadata"]["name"].as_str())
    );
}

#[test]
fn agent_chart_renders_kueue_with_jobs_in_another_namespace() {
    let Some(helm) = helm_or_skip() else { return };
    let values = r#"
cluster: k8s-west
region: us-west
tier: cloud
tls: {existingSecret: west-certs}
kubernetes: {mode: kueue, namespace: batch-jobs, queues: {vision: vision-lq}, defaultQueue: meridian-lq, startLockCheck: meridian-start-lock}
"#;
    let render = render_agent(&helm, values, tls_only(&["west-certs"]), "kueue");
    assert_eq!(render.config.kubernetes.as_ref().map(|k| k.namespace.as_str()), Some("batch-jobs"));
    assert_rbac_matches_example(&render, "rbac-kueue.yaml", "batch-jobs");
}

#[test]
fn agent_chart_renders_slurm_and_builtin_without_kubernetes_rbac() {
    let Some(helm) = helm_or_skip() else { return };
    let slurm = r#"
cluster: hpc
backend: slurm
slurm: {partition: gpu, gpuTypes: {a100: a100-80g}, workDir: /shared/meridian/work, pollInterval: 2s}
config: {supportsContainers: false}
extraVolumes:
  - {name: slurm-conf, configMap: {name: slurm-conf}}
  - {name: shared, nfs: {server: nfs.example, path: /export/meridian}}
extraVolumeMounts:
  - {name: slurm-conf, mountPath: /etc/slurm, readOnly: true}
  - {name: shared, mountPath: /shared/meridian}
"#;
    let builtin = r#"
backend: builtin
gateway: http://meridian-gateway-grpc.meridian.svc:7071
tls: {enabled: false}
config:
  runner: simulated
  timeScale: 0.01
  nodes: [{shape: dgx, count: 2, gpuType: h100, gpus: 8, cpu: 96, memoryGiB: 1024}]
  queues: [{name: default, weight: 1}]
"#;
    let slurm_external = External { secrets: &[AGENT_TLS], config_maps: &["slurm-conf"], ..External::default() };
    for (values, external, case) in [(slurm, slurm_external, "slurm"), (builtin, External::default(), "builtin")] {
        let render = render_agent(&helm, values, external, case);
        for kind in ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"] {
            assert_eq!(render.manifests.of_kind(kind).count(), 0, "{case}: no {kind} without the kubernetes backend");
        }
        assert!(render.config.kubernetes.is_none(), "{case}");
        let account = render.manifests.of_kind("ServiceAccount").next().expect("a ServiceAccount");
        assert_eq!(account["automountServiceAccountToken"], false, "{case}: no API token for the ServiceAccount");
    }
    let render = render_agent(&helm, slurm, slurm_external, "slurm");
    let work_dir = render.config.slurm.as_ref().unwrap().work_dir.display().to_string();
    let container = render.pod.container("agent").unwrap();
    assert!(
        matches!(render.pod.file(container, &work_dir), Some(FileSource::Writable { .. })),
        "slurm.workDir {work_dir} is on the shared volume"
    );
    let error = Render::new("meridian-agent", "east").values("backend: slurm\n").template(&helm).unwrap_err();
    assert!(format!("{error:#}").contains("slurm.workDir"), "a Slurm agent without a shared work dir: {error:#}");
    let render = render_agent(&helm, builtin, External::default(), "builtin");
    assert!(render.config.insecure && render.config.tls.is_none());
    assert_eq!(render.config.node_specs().len(), 2, "the node group of the values");
}

#[test]
fn agent_chart_lints_and_renders_with_its_defaults_and_refuses_bad_values() {
    let Some(helm) = helm_or_skip() else { return };
    let render = render_agent(&helm, "{}", tls_only(&[AGENT_TLS]), "defaults");
    assert_eq!(render.config.cluster, "east", "the release name names the cluster by default");
    assert_rbac_matches_example(&render, "rbac-volcano.yaml", "meridian");
    for (values, expected) in [
        ("backend: pbs\n", "backend"),
        ("kubernetes: {mode: flux}\n", "/kubernetes/mode"),
        ("tier: onprem\n", "/tier"),
        ("config: {cluster: other}\n", "config.cluster"),
        ("region: ''\n", "region"),
    ] {
        let error = Render::new("meridian-agent", "east").values(values).template(&helm).map(|_| ()).expect_err(values);
        assert!(format!("{error:#}").contains(expected), "{values}: the error should name {expected}: {error:#}");
    }
    // A value the agent itself refuses is caught by its loader, not shipped.
    let manifests =
        Render::new("meridian-agent", "east").values("config: {prices: {h100: -1}}\n").template(&helm).unwrap();
    let (_, pod) = manifests.pods().into_iter().next().unwrap();
    let container = pod.container("agent").unwrap().clone();
    let path = config_arg(&container);
    let error = AgentConfig::parse(&config_text(&manifests, &pod, &container, &path), Path::new(&path)).unwrap_err();
    assert!(error.to_string().contains("prices.h100"), "{error}");
}

#[test]
fn agent_chart_exposes_the_agents_metrics_when_asked() {
    let Some(helm) = helm_or_skip() else { return };
    let values = "metrics: {enabled: true, port: 9500, serviceMonitor: {enabled: true}}\n";
    let render = render_agent(&helm, values, tls_only(&[AGENT_TLS]), "metrics");
    let container = render.pod.container("agent").unwrap();
    assert_eq!(port_named(container, "metrics"), 9500);
    let service = render.manifests.get("Service", "east-meridian-agent-metrics").expect("a metrics Service");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    assert_eq!(render.manifests.of_kind("ServiceMonitor").count(), 1);
}

fn example_values(file: &str) -> String {
    std::fs::read_to_string(repo_root().join("deploy/helm/examples").join(file)).unwrap()
}

#[test]
fn the_documented_example_values_install_a_gateway_and_two_member_clusters() {
    let Some(helm) = helm_or_skip() else { return };
    let gateway = render_gateway(
        &helm,
        &example_values("gateway-values.yaml"),
        &["meridian-gateway-tls", "meridian-tokens"],
        "gateway-values.yaml",
    );
    assert!(gateway.config.auth.is_some() && gateway.config.tls.is_some());
    let east = render_agent_as(
        &helm,
        "k8s-east",
        &example_values("east-values.yaml"),
        tls_only(&["k8s-east-meridian-agent-tls"]),
        "east-values.yaml",
    );
    assert_rbac_matches_example(&east, "rbac-volcano.yaml", "meridian");
    let west = render_agent_as(
        &helm,
        "k8s-west",
        &example_values("west-values.yaml"),
        tls_only(&["k8s-west-meridian-agent-tls"]),
        "west-values.yaml",
    );
    assert_rbac_matches_example(&west, "rbac-kueue.yaml", "batch-jobs");
    for (agent, cluster) in [(&east, "k8s-east"), (&west, "k8s-west")] {
        assert_eq!(agent.config.cluster, cluster);
        assert!(agent.config.gateway.ends_with(":7071"), "agents dial the gateway's gRPC port");
    }
}

/// One Dockerfile, instruction by instruction (continuation lines joined).
struct Dockerfile {
    instructions: Vec<(String, String)>,
}

impl Dockerfile {
    fn read(name: &str) -> Self {
        let text = std::fs::read_to_string(repo_root().join("deploy/docker").join(name)).unwrap();
        let mut instructions = Vec::new();
        let mut current = String::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
                continue;
            }
            match trimmed.strip_suffix('\\') {
                Some(part) => {
                    current.push_str(part);
                    current.push(' ');
                }
                None => {
                    current.push_str(trimmed);
                    let (word, rest) = current.split_once(' ').unwrap_or((&current, ""));
                    instructions.push((word.to_uppercase(), rest.trim().to_string()));
                    current.clear();
                }
            }
        }
        Self { instructions }
    }

    /// Arguments of the last instruction `word` (the runtime stage's, for a multi-stage file).
    fn last(&self, word: &str) -> &str {
        self.instructions
            .iter()
            .rev()
            .find(|(w, _)| w == word)
            .map(|(_, a)| a.as_str())
            .unwrap_or_else(|| panic!("no {word}"))
    }

    /// A JSON-array instruction (exec form).
    fn exec_form(&self, word: &str) -> Vec<String> {
        serde_json::from_str(self.last(word)).unwrap_or_else(|e| panic!("{word} is not in exec (JSON) form: {e}"))
    }

    /// `(package, binary)` of the `cargo build` line.
    fn cargo_target(&self) -> (String, String) {
        let run = self
            .instructions
            .iter()
            .find(|(w, a)| w == "RUN" && a.contains("cargo build"))
            .map(|(_, a)| a.clone())
            .expect("a cargo build");
        let words: Vec<&str> = run.split_whitespace().collect();
        let after = |flag: &str| {
            let at = words.iter().position(|w| *w == flag).unwrap_or_else(|| panic!("cargo build without {flag}"));
            words[at + 1].to_string()
        };
        assert!(words.contains(&"--locked"), "the image builds with the checked-in Cargo.lock");
        (after("-p"), after("--bin"))
    }
}

/// `(package, binary)` pairs of the workspace, from `cargo metadata`.
fn workspace_binaries() -> BTreeSet<(String, String)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo_root())
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline"])
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut binaries = BTreeSet::new();
    for package in metadata["packages"].as_array().unwrap() {
        for target in package["targets"].as_array().unwrap() {
            if target["kind"].as_array().unwrap().iter().any(|k| k == "bin") {
                binaries.insert((package["name"].as_str().unwrap().into(), target["name"].as_str().unwrap().into()));
            }
        }
    }
    binaries
}

fn check_image(dockerfile: &Dockerfile, binaries: &BTreeSet<(String, String)>) -> String {
    let (package, binary) = dockerfile.cargo_target();
    assert!(
        binaries.contains(&(package.clone(), binary.clone())),
        "the workspace has no binary {binary} in package {package}"
    );
    let entrypoint = dockerfile.exec_form("ENTRYPOINT");
    assert_eq!(entrypoint, vec![format!("/usr/local/bin/{binary}")]);
    assert!(
        dockerfile.last("COPY").ends_with(&format!("/usr/local/bin/{binary}")),
        "the binary is copied where ENTRYPOINT runs it"
    );
    assert!(dockerfile.last("FROM").starts_with("debian:bookworm-slim"), "slim runtime image");
    let user = dockerfile.last("USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("USER {user} must be numeric (runAsNonRoot checks it)"));
    assert_ne!(uid, 0, "the image runs as a non-root user");
    user.to_string()
}

#[test]
fn container_files_build_binaries_that_exist_and_agree_with_the_charts() {
    let binaries = workspace_binaries();
    let gateway = Dockerfile::read("gateway.Dockerfile");
    let agent = Dockerfile::read("agent.Dockerfile");
    let gateway_user = check_image(&gateway, &binaries);
    let agent_user = check_image(&agent, &binaries);
    // One image for both stores: the gateway is built with the etcd store, whose build script
    // (etcd-client's) needs protoc and the protobuf includes in the build stage.
    let build = gateway.instructions.iter().find(|(w, a)| w == "RUN" && a.contains("cargo build")).unwrap();
    assert!(build.1.contains("--features etcd"), "the gateway image can run store.kind: etcd: {}", build.1);
    let build_at = gateway.instructions.iter().position(|i| i == build).unwrap();
    assert!(
        gateway.instructions[..build_at]
            .iter()
            .any(|(w, a)| w == "RUN" && a.contains("protobuf-compiler") && a.contains("libprotobuf-dev")),
        "protobuf-compiler and libprotobuf-dev are installed before the cargo build"
    );
    let defaults = GatewayConfig::default();
    let exposed: BTreeSet<u16> = gateway.last("EXPOSE").split_whitespace().map(|p| p.parse().unwrap()).collect();
    assert_eq!(
        exposed,
        BTreeSet::from([defaults.listen.port(), defaults.grpc_listen.port()]),
        "EXPOSE vs the gateway's default ports"
    );
    assert!(
        !agent.instructions.iter().any(|(w, _)| w == "EXPOSE"),
        "the agent listens on nothing; it dials the gateway"
    );

    let Some(helm) = helm_or_skip() else { return };
    let gateway_render = render_gateway(&helm, "{}", &[GATEWAY_TLS], "image");
    let container = gateway_render.container();
    assert_eq!(gateway.exec_form("CMD"), container.args.clone().unwrap(), "the image's default command is the chart's");
    let etcd_values = "store: {kind: etcd, etcd: {endpoints: ['http://etcd:2379']}}\n";
    let etcd_secrets = [GATEWAY_TLS, "meridian-gateway-secrets"];
    let on_etcd = render_gateway_on_etcd(&helm, etcd_values, &etcd_secrets, "meridian-gateway-secrets", "image, etcd");
    assert_eq!(gateway.exec_form("CMD"), on_etcd.container().args.clone().unwrap(), "the same command with etcd");
    let prepare = on_etcd.pod.spec.init_containers.iter().flatten().find(|c| c.name == "prepare").unwrap();
    assert_eq!(prepare.image, on_etcd.container().image, "the init container runs the gateway's image");
    assert_eq!(
        prepare.command.clone().unwrap_or_default().first().map(String::as_str),
        Some("/bin/sh"),
        "the runtime stage (debian slim) has a shell, sed and install"
    );
    let ports: BTreeSet<u16> = container.ports.iter().flatten().map(|p| p.container_port as u16).collect();
    assert_eq!(exposed, ports, "EXPOSE vs the chart's container ports");
    assert_eq!(
        gateway.exec_form("VOLUME"),
        vec![gateway_render.config.data_dir.display().to_string()],
        "VOLUME vs dataDir"
    );
    let run_as = gateway_render.pod.spec.security_context.as_ref().and_then(|s| s.run_as_user);
    assert_eq!(Some(gateway_user.split(':').next().unwrap().parse::<i64>().unwrap()), run_as, "USER vs runAsUser");

    let agent_render = render_agent(&helm, "{}", tls_only(&[AGENT_TLS]), "image");
    let container = agent_render.pod.container("agent").unwrap();
    assert_eq!(agent.exec_form("CMD"), container.args.clone().unwrap(), "the image's default command is the chart's");
    let run_as = agent_render.pod.spec.security_context.as_ref().and_then(|s| s.run_as_user);
    assert_eq!(Some(agent_user.split(':').next().unwrap().parse::<i64>().unwrap()), run_as, "USER vs runAsUser");
}
