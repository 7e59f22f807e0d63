//! Turning submitted text into a valid [`JobSpec`], with every error naming its field path.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Serialize;

use crate::gpu::GpuCatalog;
use crate::inventory::{IMPLICIT_LABEL_PREFIX, LABEL_BACKEND, LABEL_CLUSTER, LABEL_REGION, LABEL_TIER};
pub use crate::names::{MAX_NAME_LEN, is_label_key, is_label_value};
use crate::selector::{Operator, Selector};
use crate::spec::{BurstPolicy, JobSpec};

/// Largest accepted spec text. Larger bodies are refused before parsing.
pub const MAX_SPEC_BYTES: usize = 256 * 1024;
/// Most replicas one gang may have.
pub const MAX_REPLICAS: u32 = 4_096;
/// Most GPUs one replica (one node) may ask for.
pub const MAX_GPUS_PER_REPLICA: u32 = 64;
/// Longest accepted run-time estimate or limit (one year).
pub const MAX_RUNTIME_SECS: u64 = 365 * 86_400;
/// Longest accepted `placement.burst.after` (30 days).
pub const MAX_BURST_AFTER_SECS: u64 = 30 * 86_400;
/// Largest accepted dataset (10 PiB, in GiB).
pub const MAX_DATA_GIB: f64 = 10.0 * 1024.0 * 1024.0;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// Dotted path such as `gang.resources.gpus` or `data[1].region`.
    pub field: String,
    /// What is wrong and what to do.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// Why a spec was refused. Every variant can name the field (or the place) at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The body is larger than [`MAX_SPEC_BYTES`].
    #[error("spec is {size} bytes; the limit is {limit} bytes")]
    TooLarge {
        /// Bytes received.
        size: usize,
        /// Bytes allowed.
        limit: usize,
    },
    /// The text is not well-formed YAML or JSON.
    #[error("spec is not valid {format}: {message}")]
    Syntax {
        /// `YAML` or `JSON`.
        format: &'static str,
        /// The parser's message, with line and column where it gives them.
        message: String,
    },
    /// Well-formed, but fields are wrong.
    #[error("{}", join(.0))]
    Invalid(Vec<FieldError>),
}

impl SpecError {
    /// The field errors (a single pseudo-field `spec` for size and syntax errors).
    pub fn field_errors(&self) -> Vec<FieldError> {
        match self {
            SpecError::Invalid(errors) => errors.clone(),
            other => vec![FieldError { field: "spec".into(), reason: other.to_string() }],
        }
    }
}

fn join(errors: &[FieldError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Parses YAML or JSON (JSON when the first non-blank character is `{`) into a spec, then
/// validates it. Unknown fields, wrong types and invalid values all come back with field paths.
pub fn parse_job_spec(text: &str, catalog: &GpuCatalog) -> Result<JobSpec, SpecError> {
    if text.len() > MAX_SPEC_BYTES {
        return Err(SpecError::TooLarge { size: text.len(), limit: MAX_SPEC_BYTES });
    }
    let value: serde_json::Value = if text.trim_start().starts_with('{') {
        // JSON, or a YAML document written in flow style: JSON's error is the one to show.
        match serde_json::from_str(text) {
            Ok(value) => value,
            Err(json_error) => serde_saphyr::from_str(text)
                .map_err(|_| SpecError::Syntax { format: "JSON", message: json_error.to_string() })?,
        }
    } else {
        serde_saphyr::from_str(text).map_err(|e| SpecError::Syntax { format: "YAML", message: yaml_message(&e) })?
    };
    if !value.is_object() {
        return Err(SpecError::Invalid(vec![FieldError {
            field: "spec".into(),
            reason: "expected a map of fields (name, tenant, gang, payload, ...)".into(),
        }]));
    }
    let spec: JobSpec = serde_path_to_error::deserialize(&value).map_err(|e| {
        let node = value_at(&value, e.path());
        let path = e.path().to_string();
        let reason = without_value(&e.into_inner().to_string(), node, &path);
        // The root is `.`; an unknown empty key at the top level prints as an empty path.
        let field = if path == "." || path.is_empty() { "spec".to_string() } else { path };
        SpecError::Invalid(vec![FieldError { field, reason }])
    })?;
    validate(&spec, catalog)?;
    Ok(spec)
}

/// The YAML parser's message without the excerpt of the input it appends (which would repeat
/// the lines around the error, secret values included): the first line keeps the line, column
/// and reason.
fn yaml_message(error: &serde_saphyr::Error) -> String {
    error.to_string().lines().next().unwrap_or_default().to_string()
}

/// The node of `root` that `path` leads to, if the path can be followed.
fn value_at<'a>(root: &'a serde_json::Value, path: &serde_path_to_error::Path) -> Option<&'a serde_json::Value> {
    use serde_path_to_error::Segment;
    path.iter().try_fold(root, |node, segment| match segment {
        Segment::Seq { index } => node.get(index),
        Segment::Map { key } => node.get(key),
        Segment::Enum { .. } | Segment::Unknown => None,
    })
}

/// serde's message for a value of the wrong type or an unaccepted value repeats the value
/// (``invalid type: integer `1234`, expected a string``), and the value may be a secret (an
/// unquoted `payload.env` number). This rewrites such a message to what was expected and what
/// kind of value was found, without the value; other messages pass unchanged.
fn without_value(message: &str, node: Option<&serde_json::Value>, path: &str) -> String {
    for (prefix, wrong_type) in [("invalid type: ", true), ("invalid value: ", false)] {
        let Some(rest) = message.strip_prefix(prefix) else { continue };
        let kind = node.map_or("a value", kind_of);
        let found = match (wrong_type, node) {
            (true, _) => kind.to_string(),
            (false, Some(serde_json::Value::Number(_))) => format!("{kind} out of range"),
            (false, _) => format!("{kind} that is not accepted"),
        };
        let Some(expected) = node.and_then(|node| expected_in(rest, node)) else {
            return format!("{}: found {found} (the value is not repeated)", prefix.trim_end_matches(": "));
        };
        let quote = wrong_type
            && path.starts_with("payload.env.")
            && matches!(
                node,
                Some(serde_json::Value::Number(_) | serde_json::Value::Bool(_) | serde_json::Value::Null)
            );
        let hint = if quote { "; quote the value in the spec to pass it as text" } else { "" };
        return format!("expected {expected}, found {found}{hint}");
    }
    message.to_string()
}

/// What serde expected, from the tail `{unexpected}, expected {expected}` of its message, where
/// `{unexpected}` describes `node` as serde_json does (`string "…"`, ``integer `1` ``, `map`).
fn expected_in<'m>(rest: &'m str, node: &serde_json::Value) -> Option<&'m str> {
    match node {
        // A string may itself hold ", expected ": strip exactly its description.
        serde_json::Value::String(text) => rest.strip_prefix(&format!("string {text:?}, expected ")),
        // Numbers, booleans, null, lists and maps are described without a comma.
        _ => rest.split_once(", expected ").map(|(_, expected)| expected),
    }
}

/// The kind of a JSON value, for messages that must not repeat the value.
fn kind_of(node: &serde_json::Value) -> &'static str {
    match node {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(n) if n.is_f64() => "a number with a fraction",
        serde_json::Value::Number(n) if n.as_i64().is_some_and(|n| n < 0) => "a negative integer",
        serde_json::Value::Number(_) => "an integer",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "a map",
    }
}

/// Checks every rule a spec must meet and reports all violations at once.
pub fn validate(spec: &JobSpec, catalog: &GpuCatalog) -> Result<(), SpecError> {
    let mut v = Collector::default();
    v.check_name("name", &spec.name);
    v.check_name("tenant", &spec.tenant);
    if spec.priority > 100 {
        v.push("priority", format!("{} is out of range: use 0 to 100 (higher runs first)", spec.priority));
    }
    v.0.extend(label_errors("labels", &spec.labels));
    if let Some(key) = &spec.idempotency_key
        && (key.is_empty() || key.chars().count() > 128 || key.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        v.push("idempotencyKey", "must be 1-128 characters without spaces");
    }

    let gang = &spec.gang;
    if gang.replicas == 0 || gang.replicas > MAX_REPLICAS {
        v.push("gang.replicas", format!("{} is out of range: use 1 to {MAX_REPLICAS}", gang.replicas));
    }
    let r = &gang.resources;
    if r.gpus == 0 {
        v.push("gang.resources.gpus", "must be at least 1: Meridian schedules GPU jobs");
    } else if r.gpus > MAX_GPUS_PER_REPLICA {
        v.push(
            "gang.resources.gpus",
            format!(
                "{} GPUs per replica is more than any node holds (max {MAX_GPUS_PER_REPLICA}); use more replicas",
                r.gpus
            ),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, gpu_type) in r.gpu_types.iter().enumerate() {
        let field = format!("gang.resources.gpuTypes[{i}]");
        if !catalog.contains(gpu_type) {
            v.push(&field, catalog.unknown_reason(gpu_type));
        } else if !seen.insert(gpu_type.as_str()) {
            v.push(&field, format!("`{gpu_type}` is listed twice"));
        }
    }
    if r.gpu_memory_gib > catalog.max_memory_gib() {
        v.push(
            "gang.resources.gpuMemoryGiB",
            format!("{} GiB is more than any known GPU has ({} GiB)", r.gpu_memory_gib, catalog.max_memory_gib()),
        );
    } else if r.gpu_memory_gib > 0
        && !r.gpu_types.is_empty()
        && r.gpu_types.iter().filter_map(|t| catalog.memory_gib(t)).all(|m| m < r.gpu_memory_gib)
        && r.gpu_types.iter().all(|t| catalog.contains(t))
    {
        v.push(
            "gang.resources.gpuMemoryGiB",
            format!("none of the listed gpuTypes has {} GiB per GPU", r.gpu_memory_gib),
        );
    }
    if r.cpu > 4_096 {
        v.push("gang.resources.cpu", format!("{} cores per replica is more than any node holds (max 4096)", r.cpu));
    }
    if r.memory_gib > 65_536 {
        v.push(
            "gang.resources.memoryGiB",
            format!("{} GiB per replica is more than any node holds (max 65536)", r.memory_gib),
        );
    }

    let estimate = spec.runtime.estimate.as_secs();
    if estimate == 0 {
        v.push("runtime.estimate", "must be at least 1s");
    } else if estimate > MAX_RUNTIME_SECS {
        v.push("runtime.estimate", "must be at most 365d");
    }
    if let Some(limit) = spec.runtime.limit {
        if limit.as_secs() > MAX_RUNTIME_SECS {
            v.push("runtime.limit", "must be at most 365d");
        } else if limit < spec.runtime.estimate {
            v.push("runtime.limit", format!("{limit} is shorter than runtime.estimate {}", spec.runtime.estimate));
        }
    }
    if let Some(deadline) = spec.runtime.deadline {
        if deadline.as_secs() > MAX_RUNTIME_SECS {
            v.push("runtime.deadline", "must be at most 365d");
        } else if deadline < spec.runtime.estimate {
            v.push(
                "runtime.deadline",
                format!(
                    "{deadline} is shorter than runtime.estimate {}: the job could not finish in time even if it \
                     started at once (raise the deadline or lower the estimate)",
                    spec.runtime.estimate
                ),
            );
        }
    }

    for (i, data) in spec.data.iter().enumerate() {
        match data.uri.split_once("://") {
            Some((scheme, rest)) if !scheme.is_empty() && !rest.is_empty() => {}
            _ => v.push(&format!("data[{i}].uri"), "must be a URI such as s3://bucket/prefix"),
        }
        if !data.size_gib.is_finite() || data.size_gib < 0.0 || data.size_gib > MAX_DATA_GIB {
            v.push(&format!("data[{i}].sizeGiB"), "must be a number from 0 to 10485760 (10 PiB)");
        }
        if data.region.trim().is_empty() {
            v.push(&format!("data[{i}].region"), "must name the region the data lives in");
        }
    }

    let placement = &spec.placement;
    for (i, region) in placement.regions.iter().enumerate() {
        if region.trim().is_empty() {
            v.push(&format!("placement.regions[{i}]"), "must not be empty");
        }
    }
    for name in &placement.clusters.include {
        if placement.clusters.exclude.contains(name) {
            v.push("placement.clusters", format!("`{name}` is both included and excluded"));
        }
    }
    v.check_selector("placement.clusterSelector", &placement.cluster_selector, IMPLICIT_CLUSTER_LABELS);
    v.check_selector("placement.nodeSelector", &placement.node_selector, &[]);
    if let BurstPolicy::After { after, max_usd_per_hour } = placement.burst {
        if after.as_secs() > MAX_BURST_AFTER_SECS {
            v.push("placement.burst.after", "must be at most 30d (use `burst: never` to never burst)");
        }
        if let Some(max) = max_usd_per_hour
            && (!max.is_finite() || max <= 0.0)
        {
            v.push(
                "placement.burst.maxUsdPerHour",
                "must be a positive number of US$ per hour (or use `burst: never`)",
            );
        }
    }

    let payload = &spec.payload;
    if payload.image.as_deref().is_none_or(|i| i.trim().is_empty()) && payload.command.is_empty() {
        v.push("payload", "needs an `image`, a `command`, or both");
    }
    if payload
        .image
        .as_deref()
        .is_some_and(|i| i.trim().is_empty() || i.contains(|c: char| c.is_whitespace() || c.is_control()))
    {
        v.push("payload.image", "must be an image reference without spaces or control characters");
    }
    for (i, argument) in payload.command.iter().enumerate() {
        if argument.contains('\0') {
            v.push(&format!("payload.command[{i}]"), NUL_REASON);
        }
    }
    for (key, value) in &payload.env {
        let ok = crate::job_env::is_env_name(key);
        // A bad name is shown escaped: it may hold a NUL or a line break.
        let field = format!("payload.env.{}", key.escape_debug());
        if !ok {
            v.push(&field, "environment variable names are letters, digits and `_`, not starting with a digit");
        } else if crate::job_env::is_contract_name(key) {
            v.push(
                &field,
                "is set by Meridian on every replica (the job environment in docs/job-spec.md); pick another name",
            );
        }
        if value.contains('\0') {
            v.push(&field, NUL_REASON);
        }
    }
    for (field, reason) in crate::job_env::problems(payload) {
        v.push(&field, &reason);
    }
    for name in &payload.secret_env {
        if !payload.env.contains_key(name) {
            v.push(
                &format!("payload.secretEnv.{}", name.escape_debug()),
                "names an environment variable that `payload.env` does not set; list only names of `env`",
            );
        }
    }
    v.finish()
}

/// Why a `payload.command` argument or a `payload.env` value with a NUL is refused.
const NUL_REASON: &str = "contains a NUL character (\\0), which no process argument or environment value can \
                          hold, so the job could never start; remove it";

#[derive(Default)]
struct Collector(Vec<FieldError>);

impl Collector {
    fn push(&mut self, field: &str, reason: impl Into<String>) {
        self.0.push(FieldError { field: field.to_string(), reason: reason.into() });
    }

    fn check_name(&mut self, field: &str, value: &str) {
        if value.is_empty() {
            self.push(field, "is required");
        } else if value.len() > MAX_NAME_LEN
            || !value.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            || !value.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            self.push(field, format!("`{value}` must be 1-63 characters of letters, digits, `-`, `_`, `.`, starting with a letter or digit"));
        }
    }

    /// Selectors parse at deserialization; what is left is a requirement on a `meridian.io/`
    /// label that does not exist (`implicit` lists those that do), which could never match.
    fn check_selector(&mut self, field: &str, selector: &Selector, implicit: &[&str]) {
        for (key, operator, _) in selector.iter() {
            let needs_label = matches!(operator, Operator::Equals | Operator::Exists);
            if needs_label && key.starts_with(IMPLICIT_LABEL_PREFIX) && !implicit.contains(&key) {
                let known = if implicit.is_empty() { "none".to_string() } else { implicit.join(", ") };
                self.push(
                    field,
                    format!("`{key}` is in the reserved `{IMPLICIT_LABEL_PREFIX}` namespace and is never set here, so the requirement never matches; implicit labels here: {known}"),
                );
            }
        }
    }

    fn finish(self) -> Result<(), SpecError> {
        if self.0.is_empty() { Ok(()) } else { Err(SpecError::Invalid(self.0)) }
    }
}

/// The labels every cluster has without configuring them (see
/// [`ClusterInfo::label`](crate::inventory::ClusterInfo::label)).
pub const IMPLICIT_CLUSTER_LABELS: &[&str] = &[LABEL_CLUSTER, LABEL_REGION, LABEL_TIER, LABEL_BACKEND];

/// Checks a label map (job, cluster or node labels): one error per bad key or value, with the
/// field path `{field}.{key}`.
pub fn label_errors(field: &str, labels: &BTreeMap<String, String>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (key, value) in labels {
        let field = format!("{field}.{key}");
        if !is_label_key(key) {
            errors.push(FieldError {
                field: field.clone(),
                reason: "label keys are 1-63 characters of letters, digits, `-`, `_`, `.`, `/`, starting with a letter or digit".into(),
            });
        }
        if !is_label_value(value) {
            errors.push(FieldError {
                field,
                reason: "label values are up to 63 characters of letters, digits, `-`, `_`, `.`".into(),
            });
        }
    }
    errors
}

/// [`label_errors`] for labels a member cluster declares (its own or its nodes'), which also may
/// not use the reserved `meridian.io/` prefix: Meridian sets those labels itself.
pub fn member_label_errors(field: &str, labels: &BTreeMap<String, String>) -> Vec<FieldError> {
    let mut errors = label_errors(field, labels);
    for key in labels.keys().filter(|key| key.starts_with(IMPLICIT_LABEL_PREFIX)) {
        errors.push(FieldError {
            field: format!("{field}.{key}"),
            reason: format!(
                "the `{IMPLICIT_LABEL_PREFIX}` prefix is reserved for the labels Meridian sets itself ({})",
                IMPLICIT_CLUSTER_LABELS.join(", ")
            ),
        });
    }
    errors
}

/// The documented example spec (`docs/job-spec.md`), shared by the tests of this crate.
#[cfg(test)]
pub(crate) const EXAMPLE_SPEC: &str = r#"
name: llama-ft-7b
tenant: nlp
priority: 50
labels: {project: llm, type: finetune}
idempotencyKey: 3f1c-run-7
gang:
  replicas: 2
  resources: {gpus: 8, gpuTypes: [h100, a100-80g], gpuMemoryGiB: 80, cpu: 32, memoryGiB: 256}
runtime: {estimate: 6h, limit: 12h}
data:
  - {uri: s3://corpus/pile, sizeGiB: 800, region: us-east}
placement:
  regions: [us-east, eu-west]
  clusters: {exclude: [cloud-spot]}
  burst: {after: 30m, maxUsdPerHour: 80}
payload: {image: ghcr.io/acme/train:1.4, command: [torchrun, train.py], env: {LR: "3e-4"}}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = EXAMPLE_SPEC;

    fn parse(text: &str) -> Result<JobSpec, SpecError> {
        parse_job_spec(text, &GpuCatalog::default())
    }

    fn fields(err: SpecError) -> Vec<String> {
        err.field_errors().into_iter().map(|e| e.field).collect()
    }

    /// Found by the `job_spec` fuzz target: serde_path_to_error prints a top-level key `""` as
    /// an empty path, and the error named no field.
    #[test]
    fn an_empty_top_level_key_is_reported_on_the_spec() {
        for text in ["{\"\": 1, \"name\": \"a\"}", "\"\": 1\nname: a\n"] {
            let errors = parse(text).unwrap_err().field_errors();
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_eq!(errors[0].field, "spec", "{errors:?}");
            assert!(errors[0].reason.contains("unknown field"), "{errors:?}");
        }
    }

    #[test]
    fn the_documented_example_parses() {
        let spec = parse(GOOD).unwrap();
        assert_eq!(spec.total_gpus(), 16);
        assert_eq!(spec.runtime.estimate.as_secs(), 6 * 3600);
        assert_eq!(
            spec.placement.burst,
            BurstPolicy::After { after: crate::duration::HumanDuration::from_secs(1800), max_usd_per_hour: Some(80.0) }
        );
        assert_eq!(spec.placement.clusters.exclude, vec!["cloud-spot".to_string()]);
    }

    #[test]
    fn json_and_yaml_give_the_same_spec() {
        let yaml = parse(GOOD).unwrap();
        let json = serde_json::to_string(&yaml).unwrap();
        assert_eq!(parse(&json).unwrap(), yaml);
    }

    #[test]
    fn burst_never_is_accepted_and_round_trips() {
        let text = GOOD.replace("burst: {after: 30m, maxUsdPerHour: 80}", "burst: never");
        let spec = parse(&text).unwrap();
        assert_eq!(spec.placement.burst, BurstPolicy::Never);
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["placement"]["burst"], "never");
    }

    #[test]
    fn unknown_fields_name_their_path() {
        let text = GOOD.replace("cpu: 32", "cpu: 32, gpuz: 1");
        let err = parse(&text).unwrap_err();
        assert_eq!(fields(err.clone()), vec!["gang.resources.gpuz"]);
        assert!(err.to_string().contains("gpuz"), "{err}");
    }

    #[test]
    fn zero_and_negative_gpus_are_refused() {
        let zero = parse(&GOOD.replace("gpus: 8", "gpus: 0")).unwrap_err();
        assert_eq!(fields(zero), vec!["gang.resources.gpus"]);
        let negative = parse(&GOOD.replace("gpus: 8", "gpus: -2")).unwrap_err();
        assert_eq!(fields(negative), vec!["gang.resources.gpus"]);
    }

    #[test]
    fn unknown_gpu_type_is_named() {
        let err = parse(&GOOD.replace("[h100, a100-80g]", "[h100, h10]")).unwrap_err();
        assert_eq!(fields(err.clone()), vec!["gang.resources.gpuTypes[1]"]);
        assert!(err.to_string().contains("h10"));
    }

    #[test]
    fn all_errors_are_reported_at_once() {
        let text = GOOD.replace("priority: 50", "priority: 150").replace("replicas: 2", "replicas: 0");
        let err = parse(&text).unwrap_err();
        assert_eq!(fields(err), vec!["priority", "gang.replicas"]);
    }

    #[test]
    fn malformed_yaml_is_a_syntax_error() {
        let err = parse("name: [unclosed").unwrap_err();
        assert!(matches!(err, SpecError::Syntax { format: "YAML", .. }), "{err:?}");
        let err = parse("{\"name\": ").unwrap_err();
        assert!(matches!(err, SpecError::Syntax { format: "JSON", .. }), "{err:?}");
    }

    #[test]
    fn oversize_bodies_are_refused_before_parsing() {
        let big = format!("name: x\n#{}\n", "a".repeat(MAX_SPEC_BYTES));
        assert!(matches!(parse(&big), Err(SpecError::TooLarge { .. })));
    }

    #[test]
    fn limit_shorter_than_estimate_is_refused() {
        let err = parse(&GOOD.replace("limit: 12h", "limit: 1h")).unwrap_err();
        assert_eq!(fields(err), vec!["runtime.limit"]);
    }

    #[test]
    fn a_deadline_parses_and_one_shorter_than_the_estimate_is_refused_by_name() {
        let spec = parse(&GOOD.replace("limit: 12h", "limit: 12h, deadline: 8h")).unwrap();
        assert_eq!(spec.runtime.deadline.map(|d| d.as_secs()), Some(8 * 3600));
        let err = parse(&GOOD.replace("limit: 12h", "limit: 12h, deadline: 2h")).unwrap_err();
        let errors = err.field_errors();
        assert_eq!(errors.len(), 1, "{err}");
        assert_eq!(errors[0].field, "runtime.deadline");
        assert!(errors[0].reason.contains("shorter than runtime.estimate 6h"), "{err}");
        let err = parse(&GOOD.replace("limit: 12h", "limit: 12h, deadline: 400d")).unwrap_err();
        assert_eq!(fields(err), vec!["runtime.deadline"]);
    }

    #[test]
    fn meridian_names_are_reserved_and_launcher_renames_are_checked() {
        let base = "name: a\ntenant: t\ngang: {resources: {gpus: 1}}\n";
        let err = parse(&format!("{base}payload: {{command: [x], env: {{MERIDIAN_REPLICA: '3'}}}}\n")).unwrap_err();
        assert_eq!(fields(err.clone()), ["payload.env.MERIDIAN_REPLICA"]);
        assert!(err.to_string().contains("set by Meridian"), "{err}");
        // Other names with the prefix stay the user's (specs written before the contract use some).
        parse(&format!("{base}payload: {{command: [x], env: {{MERIDIAN_WITNESS_DIR: /tmp/w}}}}\n")).unwrap();
        let err =
            parse(&format!("{base}payload: {{command: [x], launcherEnvNames: {{RANK: MERIDIAN_X}}}}\n")).unwrap_err();
        assert_eq!(fields(err), ["payload.launcherEnvNames.RANK"]);
        let err = parse(&format!("{base}payload: {{command: [x], launcherEnv: mpi}}\n")).unwrap_err();
        assert!(err.to_string().contains("launcherEnv"), "{err}");
        parse(&format!("{base}payload: {{command: [x], launcherEnv: none}}\n")).unwrap();
    }

    #[test]
    fn secret_env_must_name_variables_that_env_sets() {
        let base = "name: job1\ntenant: t\ngang: {resources: {gpus: 1}}\n";
        let ok = parse(&format!("{base}payload: {{command: [x], env: {{TOKEN: v}}, secretEnv: [TOKEN]}}\n")).unwrap();
        assert!(ok.payload.has_secrets());
        let err = parse(&format!("{base}payload: {{command: [x], env: {{A: v}}, secretEnv: [TOKEN]}}\n")).unwrap_err();
        assert_eq!(fields(err), ["payload.secretEnv.TOKEN"]);
    }

    #[test]
    fn a_nul_in_a_command_argument_or_an_env_value_is_refused_by_field_path() {
        let base = "name: job1\ntenant: t\ngang: {resources: {gpus: 1}}\n";
        let text = format!(
            "{base}payload: {{command: [python, train.py, \"--tag=a\\0b\"], env: {{FOO: \"x\\0\", OK: fine}}}}\n"
        );
        let err = parse(&text).unwrap_err();
        assert_eq!(fields(err.clone()), ["payload.command[2]", "payload.env.FOO"]);
        assert!(err.to_string().contains("NUL"), "{err}");
        // JSON too, and a NUL in an env name is shown escaped in the field path.
        let json = r#"{"name":"a","tenant":"t","gang":{"resources":{"gpus":1}},"payload":{"command":["x\u0000"],"env":{"A\u0000B":"1"}}}"#;
        assert_eq!(fields(parse(json).unwrap_err()), ["payload.command[0]", "payload.env.A\\0B"]);
        assert!(parse(&format!("{base}payload: {{command: [x], env: {{FOO: \"a\\tb\"}}}}\n")).is_ok(), "a tab is fine");
    }

    #[test]
    fn a_wrong_typed_secret_value_is_named_with_its_expected_type_but_never_repeated() {
        let base = "name: job1\ntenant: t\ngang: {resources: {gpus: 1}}\n";
        let cases = [
            ("{command: [x], env: {PIN: 904731}, secretEnv: [PIN]}", "payload.env.PIN", "904731", "an integer"),
            ("{command: [x], env: {PIN: 90473.15}, secretEnv: [PIN]}", "payload.env.PIN", "90473", "a number"),
            ("{command: [x], env: {PIN: true}, secretEnv: [PIN]}", "payload.env.PIN", "true", "a boolean"),
            ("{command: [x], env: {PIN: [hunter2]}, secretEnv: [PIN]}", "payload.env.PIN", "hunter2", "a list"),
            ("{command: [x], env: 'PIN=hunter2', secretEnv: [PIN]}", "payload.env", "hunter2", "a string"),
            ("{command: [x], env: {PIN: hunter2}, secretEnv: hunter2}", "payload.secretEnv", "hunter2", "a string"),
        ];
        for (payload, field, secret, found) in cases {
            let err = parse(&format!("{base}payload: {payload}\n")).unwrap_err();
            let errors = err.field_errors();
            assert_eq!(errors.len(), 1, "{payload}: {err}");
            assert_eq!(errors[0].field, field, "{payload}");
            assert!(errors[0].reason.starts_with("expected "), "{payload}: {err}");
            assert!(errors[0].reason.contains(&format!("found {found}")), "{payload}: {err}");
            assert!(!err.to_string().contains(secret), "{payload}: the value is repeated: {err}");
        }
        let json = r#"{"name":"a","tenant":"t","gang":{"resources":{"gpus":1}},"payload":{"command":["x"],"env":{"PIN":904731},"secretEnv":["PIN"]}}"#;
        let err = parse(json).unwrap_err();
        assert_eq!(
            err.field_errors(),
            [FieldError {
                field: "payload.env.PIN".into(),
                reason: "expected a string, found an integer; quote the value in the spec to pass it as text".into()
            }]
        );
    }

    #[test]
    fn type_errors_elsewhere_say_what_was_expected_without_the_value() {
        let err = parse(&GOOD.replace("gpus: 8", "gpus: \"eight, expected x\"")).unwrap_err();
        assert_eq!(
            err.field_errors(),
            [FieldError { field: "gang.resources.gpus".into(), reason: "expected u32, found a string".into() }]
        );
        let err = parse(&GOOD.replace("gpus: 8", "gpus: -2")).unwrap_err();
        assert_eq!(err.field_errors()[0].reason, "expected u32, found a negative integer out of range");
        let err = parse(&GOOD.replace("burst: {after: 30m, maxUsdPerHour: 80}", "burst: sometimes")).unwrap_err();
        let reason = &err.field_errors()[0].reason;
        assert!(reason.starts_with("expected `never` or a map") && !reason.contains("sometimes"), "{reason}");
    }

    #[test]
    fn a_yaml_syntax_error_gives_line_and_column_but_no_excerpt_of_the_input() {
        let text = "name: job1\ntenant: t\ngang: {resources: {gpus: 1}}\n\
                    payload: {command: [x], env: {TOKEN: \"hunter2}, secretEnv: [TOKEN]}\n";
        let err = parse(text).unwrap_err();
        let SpecError::Syntax { format: "YAML", message } = &err else { panic!("{err:?}") };
        assert!(message.contains("line 4 column"), "{message}");
        assert!(!message.contains("hunter2") && !message.contains('\n'), "{message}");
    }

    #[test]
    fn defaults_fill_optional_fields() {
        let spec =
            parse("name: a\ntenant: t\ngang: {resources: {gpus: 1}}\npayload: {command: [sleep, '1']}\n").unwrap();
        assert_eq!(spec.priority, 50);
        assert_eq!(spec.gang.replicas, 1);
        assert_eq!(spec.runtime.estimate.as_secs(), 3600);
        assert_eq!(spec.placement.burst, BurstPolicy::default());
    }

    #[test]
    fn missing_required_fields_are_named() {
        let err = parse("name: a\ntenant: t\npayload: {command: [x]}\n").unwrap_err();
        assert!(err.to_string().contains("gang"), "{err}");
        let err = parse("name: a\ntenant: t\ngang: {resources: {gpus: 1}}\npayload: {}\n").unwrap_err();
        assert_eq!(fields(err), vec!["payload"]);
    }

    #[test]
    fn selectors_are_parsed_and_stored_in_canonical_form() {
        let text = GOOD.replace(
            "burst: {after: 30m",
            "clusterSelector: 'gpu-fabric = ib, meridian.io/tier==owned'\n  nodeSelector: 'rack, !preemptible'\n  burst: {after: 30m",
        );
        let spec = parse(&text).unwrap();
        assert_eq!(spec.placement.cluster_selector().to_string(), "gpu-fabric=ib,meridian.io/tier=owned");
        assert_eq!(spec.placement.node_selector().to_string(), "rack,!preemptible");
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["placement"]["clusterSelector"], "gpu-fabric=ib,meridian.io/tier=owned");
        assert_eq!(json["placement"]["nodeSelector"], "rack,!preemptible");
        let yaml = serde_saphyr::to_string(&spec).unwrap();
        assert_eq!(parse(&yaml).unwrap(), spec);
        assert_eq!(parse(&serde_json::to_string(&spec).unwrap()).unwrap(), spec);
    }

    #[test]
    fn empty_selectors_are_left_out_when_written() {
        let spec = parse(GOOD).unwrap();
        assert!(spec.placement.node_selector().is_everything());
        let json = serde_json::to_value(&spec).unwrap();
        assert!(json["placement"].get("nodeSelector").is_none(), "{json}");
        assert!(json["placement"].get("clusterSelector").is_none(), "{json}");
    }

    #[test]
    fn a_selector_may_be_written_as_a_map_of_labels() {
        let text = GOOD.replace("burst: {after: 30m", "nodeSelector: {gpu-fabric: ib, rack: r1}\n  burst: {after: 30m");
        let spec = parse(&text).unwrap();
        assert_eq!(spec.placement.node_selector().to_string(), "gpu-fabric=ib,rack=r1");
    }

    #[test]
    fn a_bad_selector_names_its_field_and_requirement() {
        let text = GOOD.replace("burst: {after: 30m", "nodeSelector: 'gpu-fabric=ib,rack=r 1'\n  burst: {after: 30m");
        let err = parse(&text).unwrap_err();
        assert_eq!(fields(err.clone()), vec!["placement.nodeSelector"]);
        let message = err.to_string();
        assert!(
            message.starts_with("placement.nodeSelector: requirement 2 `rack=r 1`: `r 1` is not a valid label value"),
            "{message}"
        );

        let text = GOOD.replace("burst: {after: 30m", "clusterSelector: {bad key: x}\n  burst: {after: 30m");
        let err = parse(&text).unwrap_err();
        assert_eq!(fields(err.clone()), vec!["placement.clusterSelector"]);
        assert!(err.to_string().contains("`bad key` is not a valid label key"), "{err}");
    }

    #[test]
    fn a_selector_on_a_reserved_label_that_never_exists_is_refused() {
        let text = GOOD.replace(
            "burst: {after: 30m",
            "clusterSelector: meridian.io/zone=a\n  nodeSelector: meridian.io/cluster=x\n  burst: {after: 30m",
        );
        let err = parse(&text).unwrap_err();
        assert_eq!(fields(err.clone()), vec!["placement.clusterSelector", "placement.nodeSelector"]);
        assert!(err.to_string().contains("meridian.io/zone"), "{err}");
        // Requirements that the label be absent hold trivially and are fine; implicit labels too.
        let text = GOOD.replace(
            "burst: {after: 30m",
            "clusterSelector: 'meridian.io/region=us-east,!meridian.io/zone'\n  burst: {after: 30m",
        );
        parse(&text).unwrap();
    }

    #[test]
    fn gpu_slice_types_are_accepted_and_bad_ones_named() {
        let text = GOOD.replace(
            "gpus: 8, gpuTypes: [h100, a100-80g], gpuMemoryGiB: 80",
            "gpus: 1, gpuTypes: [a100-80g.1g.10gb], gpuMemoryGiB: 10",
        );
        let spec = parse(&text).unwrap();
        assert_eq!(spec.gang.resources.gpu_types, vec!["a100-80g.1g.10gb".to_string()]);

        let text = GOOD.replace(
            "gpus: 8, gpuTypes: [h100, a100-80g], gpuMemoryGiB: 80",
            "gpus: 1, gpuTypes: [a100-80g.1g.10gb], gpuMemoryGiB: 20",
        );
        assert_eq!(fields(parse(&text).unwrap_err()), vec!["gang.resources.gpuMemoryGiB"]);

        let text = GOOD.replace("[h100, a100-80g]", "[h100, a100-40g.4g.80gb]");
        let err = parse(&text).unwrap_err();
        assert_eq!(fields(err.clone()), vec!["gang.resources.gpuTypes[1]"]);
        assert!(err.to_string().contains("only 40 GiB"), "{err}");
    }

    #[test]
    fn member_labels_refuse_bad_entries_and_the_reserved_prefix() {
        let labels = BTreeMap::from([
            ("gpu-fabric".to_string(), "ib".to_string()),
            ("bad key".to_string(), "x".to_string()),
            ("meridian.io/region".to_string(), "x".to_string()),
            ("rack".to_string(), "r 1".to_string()),
        ]);
        let errors = member_label_errors("nodes[1].labels", &labels);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            vec!["nodes[1].labels.bad key", "nodes[1].labels.rack", "nodes[1].labels.meridian.io/region"]
        );
        assert!(label_errors("labels", &labels).len() == 2, "job labels may use any valid key");
    }
}
