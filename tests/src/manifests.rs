//! Rendering the Helm charts in `deploy/helm/` and checking the manifests the way `kubeconform`
//! would, plus the cross-references a schema cannot see: every document parses into its typed
//! Kubernetes struct with no field lost on the way (a misspelt field fails), Service selectors
//! pick a workload's pods and their target ports exist, every ConfigMap, Secret, ServiceAccount,
//! Role and volume a manifest names is rendered or supplied by the user, and files named in a
//! config resolve to mounted volumes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `helm` binary the chart tests run: `MERIDIAN_HELM` (which `scripts/test.sh` sets from
/// `scripts/helm/ensure.sh`). `Ok(None)` when it is missing and `MERIDIAN_SKIP_HELM=1` says to
/// skip knowingly; an error naming the fix otherwise.
pub fn helm() -> Result<Option<PathBuf>> {
    match std::env::var_os("MERIDIAN_HELM") {
        Some(path) => {
            let path = PathBuf::from(path);
            let version = Command::new(&path).args(["version", "--short"]).output();
            match version {
                Ok(out) if out.status.success() => Ok(Some(path)),
                other => bail!("MERIDIAN_HELM={} does not run (`helm version`: {other:?})", path.display()),
            }
        }
        None if std::env::var("MERIDIAN_SKIP_HELM").as_deref() == Ok("1") => Ok(None),
        None => bail!(
            "no helm binary: run `export MERIDIAN_HELM=$(scripts/helm/ensure.sh)` (scripts/test.sh does), \
             or set MERIDIAN_SKIP_HELM=1 to skip the chart tests knowingly"
        ),
    }
}

/// One `helm template` run: the chart, the release and the values files given.
#[derive(Debug, Clone)]
pub struct Render {
    /// The chart directory.
    pub chart: PathBuf,
    /// Release name.
    pub release: String,
    /// Release namespace.
    pub namespace: String,
    /// Values files (YAML text), applied in order after the chart's `values.yaml`.
    pub values: Vec<String>,
}

impl Render {
    /// A render of `chart` (a directory under `deploy/helm/`) as release `release` in namespace
    /// `meridian`.
    pub fn new(chart: &str, release: &str) -> Self {
        Self {
            chart: repo_root().join("deploy/helm").join(chart),
            release: release.into(),
            namespace: "meridian".into(),
            values: Vec::new(),
        }
    }

    /// Adds a values file.
    pub fn values(mut self, yaml: &str) -> Self {
        self.values.push(yaml.into());
        self
    }

    fn args(&self, dir: &Path, command: &str) -> Result<Vec<String>> {
        let mut args = vec![command.to_string()];
        if command == "lint" {
            args.push("--strict".to_string());
        }
        if command == "template" {
            args.push(self.release.clone());
        }
        args.push(self.chart.display().to_string());
        args.extend(["--namespace".to_string(), self.namespace.clone()]);
        for (i, values) in self.values.iter().enumerate() {
            let file = dir.join(format!("values-{i}.yaml"));
            std::fs::write(&file, values).with_context(|| format!("writing {}", file.display()))?;
            args.extend(["--values".to_string(), file.display().to_string()]);
        }
        Ok(args)
    }

    fn run(&self, helm: &Path, command: &str) -> Result<std::process::Output> {
        let dir = tempfile::tempdir()?;
        let args = self.args(dir.path(), command)?;
        Command::new(helm).args(&args).output().with_context(|| format!("running {} {args:?}", helm.display()))
    }

    /// `helm lint --strict`; the error holds helm's output.
    pub fn lint(&self, helm: &Path) -> Result<()> {
        let out = self.run(helm, "lint")?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() || text.contains("[ERROR]") || text.contains("[WARNING]") {
            bail!("helm lint {} failed:\n{text}", self.chart.display());
        }
        Ok(())
    }

    /// `helm template`, parsed; the error holds helm's message (a `fail` in a template).
    pub fn template(&self, helm: &Path) -> Result<Manifests> {
        let out = self.run(helm, "template")?;
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let text = String::from_utf8(out.stdout).context("helm template printed non-UTF-8")?;
        Manifests::parse(&text)
    }
}

/// What the user supplies outside the chart (named in the values), so references to it are not
/// dangling.
#[derive(Debug, Clone, Copy, Default)]
pub struct External<'a> {
    /// Secrets the values tell the user to create.
    pub secrets: &'a [&'a str],
    /// ConfigMaps the user's values mount (`extraVolumes`).
    pub config_maps: &'a [&'a str],
    /// ServiceAccounts that exist already (`serviceAccount.create=false`).
    pub service_accounts: &'a [&'a str],
}

/// The documents of a rendered chart.
#[derive(Debug, Clone)]
pub struct Manifests {
    /// Each non-empty document, as JSON.
    pub docs: Vec<Value>,
}

/// A file inside a container, traced to where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// Key `key` of ConfigMap `name`.
    ConfigMap {
        /// ConfigMap name.
        name: String,
        /// Key in its data.
        key: String,
    },
    /// Key `key` of Secret `name`.
    Secret {
        /// Secret name.
        name: String,
        /// Key in its data.
        key: String,
    },
    /// A writable volume (a claim template, PersistentVolumeClaim, emptyDir, hostPath or NFS
    /// volume mounted read-write) named `volume`.
    Writable {
        /// The volume's name.
        volume: String,
    },
}

impl Manifests {
    /// Parses multi-document YAML as `helm template` prints it.
    pub fn parse(text: &str) -> Result<Self> {
        let docs: Vec<Value> = serde_saphyr::from_multiple(text).context("rendered YAML does not parse")?;
        Ok(Self { docs: docs.into_iter().filter(|d| !d.is_null()).collect() })
    }

    /// Documents of `kind`.
    pub fn of_kind<'a, 'k>(&'a self, kind: &'k str) -> impl Iterator<Item = &'a Value> + use<'a, 'k> {
        self.docs.iter().filter(move |d| d["kind"] == kind)
    }

    /// The one document of `kind` named `name`.
    pub fn get(&self, kind: &str, name: &str) -> Option<&Value> {
        self.of_kind(kind).find(|d| d["metadata"]["name"] == name)
    }

    /// The document of `kind` named `name`, typed.
    pub fn typed<T: DeserializeOwned>(&self, kind: &str, name: &str) -> Result<T> {
        let doc = self.get(kind, name).with_context(|| format!("no {kind} {name} rendered"))?;
        Ok(serde_json::from_value(doc.clone())?)
    }

    /// The one document of `kind`, typed.
    pub fn only<T: DeserializeOwned>(&self, kind: &str) -> Result<T> {
        let docs: Vec<&Value> = self.of_kind(kind).collect();
        match docs.as_slice() {
            [doc] => Ok(serde_json::from_value((*doc).clone())?),
            _ => bail!("expected one {kind}, found {}", docs.len()),
        }
    }

    /// Every problem a schema validator and a reference checker would report; references to
    /// what `external` names are not problems.
    pub fn problems(&self, external: External<'_>) -> Vec<String> {
        let mut problems = Vec::new();
        for doc in &self.docs {
            problems.extend(schema_problems(doc));
        }
        problems.extend(self.workload_problems(external));
        problems.extend(self.service_problems());
        problems.extend(self.rbac_problems());
        problems.extend(self.monitoring_problems());
        problems
    }

    /// Pod templates by workload (`Kind/name`), with the workload's claim template names.
    pub fn pods(&self) -> Vec<(String, PodTemplate)> {
        let mut pods = Vec::new();
        for doc in self.of_kind("Deployment") {
            if let Ok(d) = serde_json::from_value::<Deployment>(doc.clone())
                && let Some(spec) = d.spec
            {
                pods.push((format!("Deployment/{}", name_of(doc)), PodTemplate::new(spec.template, Vec::new())));
            }
        }
        for doc in self.of_kind("StatefulSet") {
            if let Ok(s) = serde_json::from_value::<StatefulSet>(doc.clone())
                && let Some(spec) = s.spec
            {
                let claims = spec
                    .volume_claim_templates
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|c| c.metadata.name)
                    .collect();
                pods.push((format!("StatefulSet/{}", name_of(doc)), PodTemplate::new(spec.template, claims)));
            }
        }
        pods
    }

    fn names(&self, kind: &str) -> BTreeSet<String> {
        self.of_kind(kind).map(|d| name_of(d).to_string()).collect()
    }

    fn workload_problems(&self, external: External<'_>) -> Vec<String> {
        let mut problems = Vec::new();
        let config_maps = self.names("ConfigMap");
        let accounts = self.names("ServiceAccount");
        let services = self.names("Service");
        for doc in self.of_kind("Deployment").chain(self.of_kind("StatefulSet")) {
            let at = format!("{}/{}", doc["kind"].as_str().unwrap_or("?"), name_of(doc));
            let spec = &doc["spec"];
            let selector = string_map(&spec["selector"]["matchLabels"]);
            let labels = string_map(&spec["template"]["metadata"]["labels"]);
            if selector.is_empty() {
                problems.push(format!("{at}: spec.selector.matchLabels is empty"));
            }
            if !is_subset(&selector, &labels) {
                problems.push(format!("{at}: selector {selector:?} does not match the pod labels {labels:?}"));
            }
            if let Some(service) = spec["serviceName"].as_str()
                && !services.contains(service)
            {
                problems.push(format!("{at}: serviceName {service} is not a rendered Service"));
            }
        }
        for (at, pod) in self.pods() {
            let spec = &pod.spec;
            match spec.service_account_name.as_deref() {
                Some(account) if !accounts.contains(account) && !external.service_accounts.contains(&account) => {
                    problems.push(format!("{at}: serviceAccountName {account} is neither rendered nor set by the user"))
                }
                _ => {}
            }
            let mut volume_names: BTreeSet<String> = pod.claims.iter().cloned().collect();
            for volume in spec.volumes.iter().flatten() {
                if !volume_names.insert(volume.name.clone()) {
                    problems.push(format!("{at}: volume {} is declared twice", volume.name));
                }
                if let Some(cm) = &volume.config_map
                    && !config_maps.contains(&cm.name)
                    && !external.config_maps.contains(&cm.name.as_str())
                {
                    problems
                        .push(format!("{at}: volume {} names ConfigMap {} that is not rendered", volume.name, cm.name));
                }
                if let Some(secret) = &volume.secret {
                    let name = secret.secret_name.as_deref().unwrap_or_default();
                    if !external.secrets.contains(&name) {
                        problems.push(format!(
                            "{at}: volume {} names Secret {name}, which is not one the values tell the user to create",
                            volume.name
                        ));
                    }
                }
            }
            for container in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
                let ports: BTreeSet<&str> =
                    container.ports.iter().flatten().filter_map(|p| p.name.as_deref()).collect();
                for mount in container.volume_mounts.iter().flatten() {
                    if !volume_names.contains(&mount.name) {
                        problems.push(format!(
                            "{at}: container {} mounts {}, which is no volume of the pod",
                            container.name, mount.name
                        ));
                    }
                }
                for (which, probe) in
                    [("livenessProbe", &container.liveness_probe), ("readinessProbe", &container.readiness_probe)]
                {
                    if let Some(IntOrString::String(port)) =
                        probe.as_ref().and_then(|p| p.http_get.as_ref()).map(|h| &h.port)
                        && !ports.contains(port.as_str())
                    {
                        problems.push(format!(
                            "{at}: {which} of {} names port {port}, which it does not have",
                            container.name
                        ));
                    }
                }
            }
        }
        problems
    }

    fn service_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let pods = self.pods();
        for doc in self.of_kind("Service") {
            let at = format!("Service/{}", name_of(doc));
            let Ok(service) = serde_json::from_value::<Service>(doc.clone()) else { continue };
            let spec = service.spec.unwrap_or_default();
            let selector = spec.selector.unwrap_or_default();
            if selector.is_empty() {
                problems.push(format!("{at}: no selector"));
                continue;
            }
            let selected: Vec<&PodTemplate> =
                pods.iter().filter(|(_, pod)| is_subset(&selector, &pod.labels())).map(|(_, pod)| pod).collect();
            if selected.is_empty() {
                problems.push(format!("{at}: selector {selector:?} picks no rendered workload's pods"));
            }
            for port in spec.ports.unwrap_or_default() {
                let target = port.target_port.clone().unwrap_or(IntOrString::Int(port.port));
                for pod in &selected {
                    let found =
                        pod.spec.containers.iter().flat_map(|c| c.ports.iter().flatten()).any(|p| match &target {
                            IntOrString::Int(n) => p.container_port == *n,
                            IntOrString::String(name) => p.name.as_deref() == Some(name.as_str()),
                        });
                    if !found {
                        problems
                            .push(format!("{at}: targetPort {target:?} is no container port of the pods it selects"));
                    }
                }
            }
        }
        problems
    }

    fn rbac_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let accounts: BTreeSet<(String, String)> = self
            .of_kind("ServiceAccount")
            .map(|d| (d["metadata"]["namespace"].as_str().unwrap_or_default().to_string(), name_of(d).to_string()))
            .collect();
        for doc in self.of_kind("RoleBinding").chain(self.of_kind("ClusterRoleBinding")) {
            let at = format!("{}/{}", doc["kind"].as_str().unwrap_or("?"), name_of(doc));
            let role_kind = doc["roleRef"]["kind"].as_str().unwrap_or_default();
            let role = doc["roleRef"]["name"].as_str().unwrap_or_default();
            let rendered = self.of_kind(role_kind).any(|r| {
                name_of(r) == role
                    && (role_kind == "ClusterRole" || r["metadata"]["namespace"] == doc["metadata"]["namespace"])
            });
            if !rendered {
                problems.push(format!("{at}: roleRef {role_kind}/{role} is not rendered (in the binding's namespace)"));
            }
            for subject in doc["subjects"].as_array().into_iter().flatten() {
                let key = (
                    subject["namespace"].as_str().unwrap_or_default().to_string(),
                    subject["name"].as_str().unwrap_or_default().to_string(),
                );
                if subject["kind"] == "ServiceAccount" && !accounts.contains(&key) {
                    problems.push(format!("{at}: subject ServiceAccount {}/{} is not rendered", key.0, key.1));
                }
            }
        }
        problems
    }

    fn monitoring_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for doc in self.of_kind("ServiceMonitor") {
            let at = format!("ServiceMonitor/{}", name_of(doc));
            let selector = string_map(&doc["spec"]["selector"]["matchLabels"]);
            let services: Vec<&Value> = self
                .of_kind("Service")
                .filter(|s| is_subset(&selector, &string_map(&s["metadata"]["labels"])))
                .collect();
            if services.is_empty() {
                problems.push(format!("{at}: selector {selector:?} picks no rendered Service"));
            }
            for endpoint in doc["spec"]["endpoints"].as_array().into_iter().flatten() {
                let port = endpoint["port"].as_str().unwrap_or_default();
                let has_port =
                    |s: &&Value| s["spec"]["ports"].as_array().into_iter().flatten().any(|p| p["name"] == port);
                if !services.iter().any(has_port) {
                    problems.push(format!("{at}: endpoint port {port} is no port of the Services it selects"));
                }
            }
        }
        for doc in self.of_kind("PrometheusRule") {
            let at = format!("PrometheusRule/{}", name_of(doc));
            let groups = doc["spec"]["groups"].as_array().cloned().unwrap_or_default();
            if groups.is_empty() {
                problems.push(format!("{at}: spec.groups is empty"));
            }
            for (g, group) in groups.iter().enumerate() {
                if group["name"].as_str().is_none_or(str::is_empty) {
                    problems.push(format!("{at}: spec.groups[{g}].name is missing"));
                }
                for (r, rule) in group["rules"].as_array().into_iter().flatten().enumerate() {
                    let named = rule["alert"].is_string() || rule["record"].is_string();
                    if !named || !rule["expr"].is_string() && !rule["expr"].is_number() {
                        problems
                            .push(format!("{at}: spec.groups[{g}].rules[{r}] needs `alert` or `record`, and `expr`"));
                    }
                }
            }
        }
        problems
    }
}

/// A workload's pod template with the names of its volume claim templates.
#[derive(Debug, Clone)]
pub struct PodTemplate {
    /// The pod's labels.
    pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    /// The pod spec.
    pub spec: PodSpec,
    /// Names of the StatefulSet's volume claim templates (writable volumes).
    pub claims: Vec<String>,
}

impl PodTemplate {
    fn new(template: k8s_openapi::api::core::v1::PodTemplateSpec, claims: Vec<String>) -> Self {
        Self { metadata: template.metadata.unwrap_or_default(), spec: template.spec.unwrap_or_default(), claims }
    }

    /// The pod's labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata.labels.clone().unwrap_or_default()
    }

    /// The container named `name`.
    pub fn container(&self, name: &str) -> Option<&Container> {
        self.spec.containers.iter().find(|c| c.name == name)
    }

    /// Where file `path` inside `container` comes from: the volume mounted at the longest prefix
    /// of the path, and for ConfigMaps and Secrets the key (the rest of the path; items mapping
    /// keys to other paths are followed).
    pub fn file(&self, container: &Container, path: &str) -> Option<FileSource> {
        let mount = container
            .volume_mounts
            .iter()
            .flatten()
            .filter(|m| path == m.mount_path || path.starts_with(&format!("{}/", m.mount_path.trim_end_matches('/'))))
            .max_by_key(|m| m.mount_path.len())?;
        let rest = path[mount.mount_path.len()..].trim_start_matches('/');
        let rest = match &mount.sub_path {
            Some(sub) if !sub.is_empty() => {
                if rest.is_empty() {
                    sub.clone()
                } else {
                    format!("{sub}/{rest}")
                }
            }
            _ => rest.to_string(),
        };
        if self.claims.contains(&mount.name) {
            return (mount.read_only != Some(true)).then(|| FileSource::Writable { volume: mount.name.clone() });
        }
        let volume = self.spec.volumes.iter().flatten().find(|v| v.name == mount.name)?;
        let key_of = |items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>| match items {
            Some(items) => items.iter().find(|i| i.path == rest).map(|i| i.key.clone()),
            None => Some(rest.clone()),
        };
        if let Some(cm) = &volume.config_map {
            return Some(FileSource::ConfigMap { name: cm.name.clone(), key: key_of(cm.items.as_ref())? });
        }
        if let Some(secret) = &volume.secret {
            return Some(FileSource::Secret {
                name: secret.secret_name.clone().unwrap_or_default(),
                key: key_of(secret.items.as_ref())?,
            });
        }
        let writable_kind = volume.empty_dir.is_some()
            || volume.persistent_volume_claim.is_some()
            || volume.host_path.is_some()
            || volume.nfs.is_some();
        if writable_kind && mount.read_only != Some(true) {
            return Some(FileSource::Writable { volume: mount.name.clone() });
        }
        None
    }
}

/// Schema problems of one document: its kind is one the charts may render, it parses into the
/// typed struct, and serialising that struct back loses nothing (so no field is unknown or
/// misplaced).
pub fn schema_problems(doc: &Value) -> Vec<String> {
    let kind = doc["kind"].as_str().unwrap_or_default();
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let at = format!("{kind}/{}", name_of(doc));
    let mut problems = Vec::new();
    let name = name_of(doc);
    if !is_dns_name(name) {
        problems.push(format!("{at}: metadata.name {name:?} is not a DNS-1123 name of at most 63 characters"));
    }
    for (key, value) in string_map(&doc["metadata"]["labels"]) {
        if value.len() > 63 {
            problems.push(format!("{at}: label {key} value is longer than 63 characters"));
        }
    }
    let round_trip = match (api_version, kind) {
        ("v1", "ConfigMap") => round_trip::<ConfigMap>(doc),
        ("v1", "Service") => round_trip::<Service>(doc),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(doc),
        ("apps/v1", "Deployment") => round_trip::<Deployment>(doc),
        ("apps/v1", "StatefulSet") => round_trip::<StatefulSet>(doc),
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<Role>(doc),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<RoleBinding>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => round_trip::<ClusterRoleBinding>(doc),
        // Prometheus Operator CRDs: no typed struct here; monitoring_problems checks their shape.
        ("monitoring.coreos.com/v1", "ServiceMonitor" | "PrometheusRule") => Ok(()),
        _ => Err(format!("{api_version} {kind} is not a kind the charts are checked for")),
    };
    if let Err(reason) = round_trip {
        problems.push(format!("{at}: {reason}"));
    }
    problems
}

fn round_trip<T: DeserializeOwned + serde::Serialize>(doc: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(doc.clone()).map_err(|e| format!("does not parse: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut lost = Vec::new();
    missing(doc, &back, String::new(), &mut lost);
    if lost.is_empty() { Ok(()) } else { Err(format!("fields not in the schema (or of the wrong type): {lost:?}")) }
}

/// Paths of `original` that `back` does not hold with the same value.
fn missing(original: &Value, back: &Value, path: String, out: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                match b.get(key) {
                    Some(other) => missing(value, other, at, out),
                    None if value.is_null() => {}
                    None => out.push(at),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                missing(x, y, format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        // Numbers may come back in another representation (1 vs 1.0); compare as f64.
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        _ => out.push(path),
    }
}

fn name_of(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

fn string_map(value: &Value) -> BTreeMap<String, String> {
    value
        .as_object()
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

fn is_subset(small: &BTreeMap<String, String>, big: &BTreeMap<String, String>) -> bool {
    small.iter().all(|(k, v)| big.get(k) == Some(v))
}

fn is_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_field_is_reported() {
        let doc = serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"selector": {"a": "b"}, "ports": [{"port": 80, "targtPort": "http"}]}
        });
        let problems = schema_problems(&doc);
        assert!(problems.iter().any(|p| p.contains("spec.ports[0].targtPort")), "{problems:?}");
    }

    #[test]
    fn a_field_of_the_wrong_type_is_reported() {
        let doc = serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": "one", "selector": {}, "template": {}}
        });
        assert!(schema_problems(&doc).iter().any(|p| p.contains("does not parse")));
    }

    #[test]
    fn an_unknown_kind_is_reported() {
        let doc = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
        assert!(schema_problems(&doc).iter().any(|p| p.contains("not a kind")));
    }

    #[test]
    fn a_service_that_selects_nothing_is_reported() {
        let text =
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  selector: {app: x}\n  ports: [{port: 80}]\n";
        let manifests = Manifests::parse(text).unwrap();
        assert!(manifests.problems(External::default()).iter().any(|p| p.contains("picks no rendered workload")));
    }
}
