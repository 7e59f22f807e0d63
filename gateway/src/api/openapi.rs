//! The REST API's OpenAPI document, served at `GET /openapi.json`.
//!
//! [`OPERATIONS`] is the one list of what the REST API serves: the router registers its paths
//! from it (see `rest::router`), and the document is built from it, so a route cannot be added
//! without being described. The tests check that every documented method is served, every
//! undocumented one is refused, and that the schemas list exactly the fields the gateway's
//! types serialise.

use serde_json::{Map, Value, json};

/// Where a parameter goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum In {
    /// A `{name}` segment of the path.
    Path,
    /// A query parameter.
    Query,
    /// A request header.
    Header,
}

/// One parameter of an operation.
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Its name.
    pub name: &'static str,
    /// Where it goes.
    pub location: In,
    /// What it does.
    pub description: &'static str,
    /// JSON-schema type (`string`, `integer`).
    pub kind: &'static str,
}

/// One REST operation.
#[derive(Debug, Clone, Copy)]
pub struct Operation {
    /// HTTP method, upper case.
    pub method: &'static str,
    /// Path template in axum's and OpenAPI's syntax (`/v1/jobs/{id}`).
    pub path: &'static str,
    /// Stable name (`listJobs`).
    pub id: &'static str,
    /// Group in the document.
    pub tag: &'static str,
    /// One line.
    pub summary: &'static str,
    /// Its parameters.
    pub params: &'static [Param],
    /// The request body's schema, if it takes one.
    pub body: Option<&'static str>,
    /// The success status and media type.
    pub success: (u16, &'static str),
    /// The success body's schema (a component name), or None for plain text.
    pub returns: Option<&'static str>,
    /// Error statuses it may answer besides those every call may (401, 403, 429, 503).
    pub errors: &'static [u16],
    /// Whether a bearer token is needed when `auth` is configured.
    pub authenticated: bool,
}

/// Operations described here but routed by their own module (with their own state): `/metrics`
/// (`crate::metrics::Metrics::router`), merged into the REST listener beside `rest::router`.
pub const SERVED_ELSEWHERE: &[&str] = &["metrics"];

const ID: Param = Param { name: "id", location: In::Path, description: "The job's id (`j-...`).", kind: "string" };

/// Every operation the REST listener serves.
pub const OPERATIONS: &[Operation] = &[
    Operation {
        method: "POST",
        path: "/v1/jobs",
        id: "submitJob",
        tag: "jobs",
        summary: "Submit a job spec (YAML or JSON); durable before the answer",
        params: &[],
        body: Some("JobSpec"),
        success: (201, "application/json"),
        returns: Some("Job"),
        errors: &[400, 413, 415, 422],
        authenticated: true,
    },
    Operation {
        method: "GET",
        path: "/v1/jobs",
        id: "listJobs",
        tag: "jobs",
        summary: "List jobs, oldest first, one page at a time",
        params: &[
            Param { name: "tenant", location: In::Query, description: "Only this tenant's jobs.", kind: "string" },
            Param { name: "state", location: In::Query, description: "Only jobs in this state.", kind: "string" },
            Param {
                name: "selector",
                location: In::Query,
                description: "Label selector (`project=llm`).",
                kind: "string",
            },
            Param {
                name: "limit",
                location: In::Query,
                description: "Jobs per page (1..=5000, default 500).",
                kind: "integer",
            },
            Param {
                name: "continue",
                location: In::Query,
                description: "The previous page's `continue`.",
                kind: "string",
            },
        ],
        body: None,
        success: (200, "application/json"),
        returns: Some("JobList"),
        errors: &[400],
        authenticated: true,
    },
    Operation {
        method: "GET",
        path: "/v1/jobs/{id}",
        id: "getJob",
        tag: "jobs",
        summary: "One job",
        params: &[ID],
        body: None,
        success: (200, "application/json"),
        returns: Some("Job"),
        errors: &[404],
        authenticated: true,
    },
    Operation {
        method: "DELETE",
        path: "/v1/jobs/{id}",
        id: "cancelJob",
        tag: "jobs",
        summary: "Cancel a job; durable before the answer",
        params: &[ID],
        body: None,
        success: (200, "application/json"),
        returns: Some("Job"),
        errors: &[404],
        authenticated: true,
    },
    Operation {
        method: "GET",
        path: "/v1/jobs/{id}/explain",
        id: "explainJob",
        tag: "jobs",
        summary: "Why the job is where it is: every cluster's verdict with numbers",
        params: &[ID],
        body: None,
        success: (200, "application/json"),
        returns: Some("Explanation"),
        errors: &[404],
        authenticated: true,
    },
    Operation {
        method: "GET",
        path: "/v1/jobs/{id}/logs",
        id: "jobLogs",
        tag: "jobs",
        summary: "Part of the job's output, from the member holding it",
        params: &[
            ID,
            Param {
                name: "from",
                location: In::Query,
                description: "Byte offset; none: the last `maxBytes`.",
                kind: "integer",
            },
            Param {
                name: "maxBytes",
                location: In::Query,
                description: "At most this many bytes (default 65536).",
                kind: "integer",
            },
        ],
        body: None,
        success: (200, "application/json"),
        returns: Some("LogChunk"),
        errors: &[400, 404, 409, 502, 504],
        authenticated: true,
    },
    Operation {
        method: "GET",
        path: "/v1/clusters",
        id: "listClusters",
        tag: "fleet",
        summary: "Member clusters: GPUs, queue pressure, prices, connection",
        params: &[],
        body: None,
        success: (200, "application/json"),
        returns: Some("ClusterList"),
        errors: &[],
        authenticated: true,
    },
    Operation {
        method: "GET",
        path: "/v1/tenants",
        id: "listTenants",
        tag: "fleet",
        summary: "Tenants' queues: running and queued GPUs, fair share, quota",
        params: &[],
        body: None,
        success: (200, "application/json"),
        returns: Some("TenantList"),
        errors: &[],
        authenticated: true,
    },
    Operation {
        method: "GET",
        path: "/v1/events",
        id: "watchEvents",
        tag: "events",
        summary: "Server-sent events: each job and cluster change after it is committed",
        params: &[
            Param {
                name: "after",
                location: In::Query,
                description: "Resume after this event id (`EPOCH.SEQ`).",
                kind: "string",
            },
            Param {
                name: "Last-Event-ID",
                location: In::Header,
                description: "Same as `after` (what EventSource sends).",
                kind: "string",
            },
            Param {
                name: "kinds",
                location: In::Query,
                description: "`job`, `cluster` or both, comma-separated.",
                kind: "string",
            },
            Param { name: "tenant", location: In::Query, description: "Only this tenant's jobs.", kind: "string" },
            Param {
                name: "job",
                location: In::Query,
                description: "Only this job (no cluster events).",
                kind: "string",
            },
            Param {
                name: "selector",
                location: In::Query,
                description: "Only jobs whose labels match.",
                kind: "string",
            },
        ],
        body: None,
        success: (200, "text/event-stream"),
        returns: Some("EventStream"),
        errors: &[400, 404],
        authenticated: true,
    },
    Operation {
        method: "GET",
        path: "/console/session",
        id: "consoleSession",
        tag: "console",
        summary: "Who the caller is (subject, role, tenants) and whether the gateway checks tokens",
        params: &[],
        body: None,
        success: (200, "application/json"),
        returns: Some("Session"),
        errors: &[],
        authenticated: true,
    },
    Operation {
        method: "GET",
        path: "/healthz",
        id: "health",
        tag: "operations",
        summary: "`ok`, or 503 once the store has failed; never rate-limited",
        params: &[],
        body: None,
        success: (200, "text/plain"),
        returns: None,
        errors: &[],
        authenticated: false,
    },
    Operation {
        method: "GET",
        path: "/readyz",
        id: "ready",
        tag: "operations",
        summary: "Whether this gateway serves, and as what: 200 `{\"role\":\"leader\",\"epoch\":N}` or `{\"role\":\"standby\",\"leader\":{…}}` (a standby with a loaded view answers reads); 503 while loading, without a store, or stopping",
        params: &[],
        body: None,
        success: (200, "application/json"),
        returns: None,
        errors: &[503],
        authenticated: false,
    },
    Operation {
        method: "GET",
        path: "/metrics",
        id: "metrics",
        tag: "operations",
        summary: "Prometheus metrics (OpenMetrics text); with `auth`: the scrape token or an admin's; 404 with `metrics.access: off`",
        params: &[],
        body: None,
        success: (200, "application/openmetrics-text"),
        returns: None,
        errors: &[401, 403, 404],
        authenticated: false,
    },
    Operation {
        method: "GET",
        path: "/openapi.json",
        id: "openapi",
        tag: "operations",
        summary: "This document",
        params: &[],
        body: None,
        success: (200, "application/json"),
        returns: None,
        errors: &[],
        authenticated: false,
    },
];

/// The OpenAPI 3.1 document of [`OPERATIONS`].
pub fn document() -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for op in OPERATIONS {
        let item = paths.entry(op.path.to_string()).or_insert_with(|| json!({}));
        item[op.method.to_ascii_lowercase()] = operation(op);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Meridian gateway REST API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Submit once to a federation of GPU clusters. Errors are `{\"error\": {\"code\", \"message\", \"fields\"}}`; see docs/api.md.",
        },
        "tags": [
            {"name": "jobs", "description": "Submit, list, inspect, explain and cancel jobs"},
            {"name": "fleet", "description": "Member clusters and tenants' queues"},
            {"name": "events", "description": "Following changes"},
            {"name": "console", "description": "What the web console (served at `/`) asks besides the API"},
            {"name": "operations", "description": "Health, metrics and this document"},
        ],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "A static token or a JWT, when the gateway has `auth` configured."}},
            "schemas": schemas(),
        },
    })
}

fn operation(op: &Operation) -> Value {
    let params: Vec<Value> = op
        .params
        .iter()
        .map(|p| {
            let location = match p.location {
                In::Path => "path",
                In::Query => "query",
                In::Header => "header",
            };
            json!({
                "name": p.name,
                "in": location,
                "required": p.location == In::Path,
                "description": p.description,
                "schema": {"type": p.kind},
            })
        })
        .collect();
    let (status, media) = op.success;
    let success_body = match op.returns {
        Some(schema) => json!({ media: {"schema": {"$ref": format!("#/components/schemas/{schema}")}} }),
        None => json!({ media: {"schema": {"type": if media == "application/json" { "object" } else { "string" }}} }),
    };
    let mut responses = Map::new();
    responses.insert(status.to_string(), json!({"description": "Success", "content": success_body}));
    let mut errors: Vec<u16> = op.errors.to_vec();
    if op.authenticated {
        errors.extend([401, 403, 429]);
    }
    errors.push(503);
    errors.sort_unstable();
    errors.dedup();
    for code in errors {
        responses.insert(
            code.to_string(),
            json!({"description": super::error::code_of(axum::http::StatusCode::from_u16(code).unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR)),
                   "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
        );
    }
    let mut value = json!({
        "operationId": op.id,
        "tags": [op.tag],
        "summary": op.summary,
        "parameters": params,
        "responses": responses,
    });
    if let Some(body) = op.body {
        value["requestBody"] = json!({
            "required": true,
            "content": {
                "application/yaml": {"schema": {"$ref": format!("#/components/schemas/{body}")}},
                "application/json": {"schema": {"$ref": format!("#/components/schemas/{body}")}},
            },
        });
    }
    if op.authenticated {
        value["security"] = json!([{"bearer": []}]);
    } else {
        value["security"] = json!([]);
    }
    value
}

fn object(required: &[&str], properties: Value) -> Value {
    json!({"type": "object", "required": required, "properties": properties})
}

fn list_of(key: &str, item: &str) -> Value {
    object(&[key], json!({ key: {"type": "array", "items": {"$ref": format!("#/components/schemas/{item}")}} }))
}

/// The response and request schemas. Their property names are checked against what the
/// gateway's types serialise (see the tests).
fn schemas() -> Value {
    let string = json!({"type": "string"});
    let opt_string = json!({"type": ["string", "null"]});
    let int = json!({"type": "integer"});
    let opt_int = json!({"type": ["integer", "null"]});
    let number = json!({"type": "number"});
    json!({
        "Error": object(&["error"], json!({"error": object(&["code", "message"], json!({
            "code": string, "message": string,
            "fields": {"type": "array", "items": object(&["field", "reason"], json!({"field": string, "reason": string}))},
        }))})),
        "JobSpec": {"type": "object", "description": "A job spec: see docs/job-spec.md for every field.",
            "required": ["name", "tenant", "gang", "payload"],
            "properties": {"name": string, "tenant": string, "priority": int, "labels": {"type": "object", "additionalProperties": string},
                "gang": {"type": "object"}, "payload": {"type": "object"}, "runtime": {"type": "object"},
                "data": {"type": "object"}, "placement": {"type": "object"}, "idempotencyKey": string}},
        "Job": object(&["id", "spec", "state", "submittedAtMs"], json!({
            "id": string, "spec": {"$ref": "#/components/schemas/JobSpec"},
            "state": {"type": "string", "enum": ["Queued", "Offered", "Bound", "Running", "Succeeded", "Failed", "Cancelled", "Unknown"]},
            "cluster": opt_string, "fencingToken": int, "message": string, "placement": string,
            "submittedAtMs": int, "startedAtMs": opt_int, "finishedAtMs": opt_int, "gpuType": string,
            "nodes": {"type": "array", "items": string}, "preemptions": int, "lastPreemptedAtMs": int,
            "usage": {"$ref": "#/components/schemas/JobUsage"},
        })),
        "JobUsage": object(&["gpuUtilization", "idle", "sampledAtMs", "windowSecs"], json!({
            "gpuUtilization": number, "idle": {"type": "boolean"}, "idleSinceMs": int, "sampledAtMs": int,
            "windowSecs": int,
        })),
        "JobList": {"allOf": [list_of("jobs", "Job"), {"properties": {"continue": string}}]},
        "Explanation": object(&["jobId", "state", "summary", "candidates"], json!({
            "jobId": string, "state": string, "cluster": opt_string, "decidedAtMs": opt_int, "summary": string,
            "memberSays": string,
            "siblingCopies": {"type": "array", "items": object(&["cluster", "gpuType", "ready"], json!({
                "cluster": string, "gpuType": string, "ready": {"type": "boolean"},
            }))},
            "candidates": {"type": "array", "items": object(&["cluster", "verdict"], json!({
                "cluster": string, "region": string, "tier": string,
                "verdict": {"type": "string", "enum": ["chosen", "feasible", "rejected"]},
                "reasons": {"type": "array", "items": string}, "score": {"type": ["object", "null"]},
            }))},
            "omittedCandidates": object(&["feasible", "rejected"], json!({
                "feasible": int,
                "rejected": {"type": "array", "items": object(&["reason", "clusters"], json!({
                    "reason": string, "clusters": int,
                }))},
            })),
        })),
        "LogChunk": object(&["data", "offset", "nextOffset", "complete"], json!({
            "data": string, "offset": int, "nextOffset": int, "complete": {"type": "boolean"},
        })),
        "Cluster": object(&["name", "region", "tier", "connected"], json!({
            "name": string, "region": string, "tier": {"type": "string", "enum": ["owned", "cloud"]}, "backend": string,
            "connected": {"type": "boolean"}, "lastSeenSecsAgo": {"type": ["number", "null"]},
            "gpusTotal": int, "gpusFree": int, "gpuTypes": {"type": "array", "items": string},
            "pendingJobs": int, "pendingGpus": int, "estimatedWaitSecs": int, "federatedJobs": int,
            "prices": {"type": "object", "additionalProperties": number},
            "labels": {"type": "object", "additionalProperties": string},
        })),
        "ClusterList": list_of("clusters", "Cluster"),
        "Tenant": object(&["tenant", "weight", "fairShare"], json!({
            "tenant": string, "weight": number, "fairShare": number, "runningJobs": int, "runningGpus": int,
            "queuedJobs": int, "queuedGpus": int, "gpuShare": number, "maxGpus": int, "maxQueuedJobs": int,
            "succeededJobs": int, "failedJobs": int,
        })),
        "TenantList": list_of("tenants", "Tenant"),
        "Session": object(&["subject", "role", "tenants", "authentication"], json!({
            "subject": string, "role": {"type": "string", "enum": ["viewer", "member", "admin"]},
            "tenants": {"type": "array", "items": string}, "authentication": {"type": "boolean"},
        })),
        "EventStream": {"type": "string", "description": "text/event-stream. `event: ready` (data `{cursor}`) first; then `event: job` (data `{atMs, previousState, job}`), `event: cluster` (data `{atMs, cluster}`), each with `id: EPOCH.SEQ`; `event: reset` (data `{reason}`) when resume was impossible; a `: keep-alive` comment every 15 s. See docs/api.md."},
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::{BTreeSet, HashMap};
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::{Method, Request, StatusCode};
    use meridian_core::{ClusterSummary, Core, CoreConfig, JobRecord, Loaded, TenantSummary};
    use meridian_proto::gpu::GpuCatalog;
    use meridian_proto::job::JobState;
    use meridian_proto::validate::parse_job_spec;
    use tower_service::Service;

    use super::*;
    use crate::api::rest::{RestState, router};
    use crate::auth::Authenticator;
    use crate::runtime::{Runtime, RuntimeConfig, now_ms};

    const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

    #[tokio::test]
    async fn every_documented_method_is_served_and_every_other_method_is_refused() {
        let (_stop, stop_rx) = tokio::sync::watch::channel(false);
        let core = Core::new(CoreConfig::default(), Loaded::default(), now_ms(), 1);
        let (_runtime, handle) =
            Runtime::start(core, Arc::new(meridian_store::MemoryStore::new()), RuntimeConfig::default(), stop_rx);
        let state = RestState {
            handle,
            catalog: GpuCatalog::default(),
            submit_rate: Arc::new(crate::api::SubmitRate::from_config(&crate::config::GatewayConfig::default())),
            auth: Arc::new(Authenticator::off()),
        };
        let access = crate::metrics::ScrapeAccess::load(&Default::default(), Arc::clone(&state.auth)).unwrap();
        let metrics = Arc::new(crate::metrics::Metrics::new(state.handle.clone(), access));
        // What the REST listener serves: the API's router and the metrics router beside it.
        let mut app = router(state).merge(metrics.router());
        let mut documented: HashMap<&str, BTreeSet<&str>> = HashMap::new();
        for op in OPERATIONS {
            documented.entry(op.path).or_default().insert(op.method);
        }
        for (path, methods) in &documented {
            let concrete = path.replace("{id}", "j-nope");
            for method in METHODS {
                let request = Request::builder()
                    .method(Method::from_bytes(method.as_bytes()).unwrap())
                    .uri(&concrete)
                    .body(Body::empty())
                    .unwrap();
                let status = app.call(request).await.unwrap().status();
                // 405: the path is routed but not for this method. (A 404 here is the handler's
                // own "no such job", never the router's: every documented path is routed.)
                let served = status != StatusCode::METHOD_NOT_ALLOWED;
                assert_eq!(served, methods.contains(method), "{method} {path}: {status}");
            }
        }
        // And nothing undocumented: an unknown path is the JSON 404.
        let request = Request::builder().uri("/v1/nodes").body(Body::empty()).unwrap();
        assert_eq!(app.call(request).await.unwrap().status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn operations_are_named_once_and_their_path_parameters_are_declared() {
        let mut ids = BTreeSet::new();
        for op in OPERATIONS {
            assert!(ids.insert(op.id), "operationId {} twice", op.id);
            let in_path: BTreeSet<&str> =
                op.path.split('/').filter_map(|s| s.strip_prefix('{')?.strip_suffix('}')).collect();
            let declared: BTreeSet<&str> =
                op.params.iter().filter(|p| p.location == In::Path).map(|p| p.name).collect();
            assert_eq!(in_path, declared, "{} {}", op.method, op.path);
        }
        let document = document();
        assert_eq!(document["openapi"], "3.1.0");
        for op in OPERATIONS {
            let node = &document["paths"][op.path][op.method.to_ascii_lowercase()];
            assert_eq!(node["operationId"], op.id);
            let text = node.to_string();
            for reference in text.split("#/components/schemas/").skip(1) {
                let name: String = reference.chars().take_while(|c| c.is_alphanumeric()).collect();
                assert!(document["components"]["schemas"].get(&name).is_some(), "{}: missing schema {name}", op.id);
            }
        }
    }

    fn properties(schema: &str) -> BTreeSet<String> {
        let schemas = schemas();
        schemas[schema]["properties"].as_object().unwrap().keys().cloned().collect()
    }

    fn keys(value: &impl serde::Serialize) -> BTreeSet<String> {
        serde_json::to_value(value).unwrap().as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn schemas_list_exactly_the_fields_the_gateway_serialises() {
        let spec = parse_job_spec(
            "name: job-a\ntenant: t\ngang: {resources: {gpus: 1}}\npayload: {command: [x]}\n",
            &GpuCatalog::default(),
        )
        .unwrap();
        let mut job = JobRecord::queued("j-1".into(), spec, "m", 1);
        job.state = JobState::Running;
        job.cluster = Some("east".into());
        job.placement = Some("p".into());
        job.started_at_ms = Some(2);
        job.finished_at_ms = Some(3);
        job.gpu_type = Some("h100".into());
        job.nodes = vec!["n0".into()];
        job.preemptions = 1;
        job.last_preempted_at_ms = Some(2);
        let mut job_keys = keys(&crate::api::redact::redacted(&job));
        // Present while the job runs and its member measures its GPUs.
        job_keys.insert("usage".into());
        assert_eq!(job_keys, properties("Job"));
        let usage = meridian_core::JobUsage {
            gpu_utilization: 0.02,
            idle: true,
            idle_since_ms: Some(1),
            sampled_at_ms: 2,
            window_secs: 60,
        };
        assert_eq!(keys(&usage), properties("JobUsage"));

        let cluster =
            ClusterSummary { last_seen_secs_ago: Some(1.0), ..crate::runtime::events::sample_cluster("east") };
        assert_eq!(keys(&cluster), properties("Cluster"));

        let tenant = TenantSummary {
            tenant: "t".into(),
            weight: 1.0,
            fair_share: 1.0,
            running_jobs: 0,
            running_gpus: 0,
            queued_jobs: 0,
            queued_gpus: 0,
            gpu_share: 0.0,
            max_gpus: Some(1),
            max_queued_jobs: Some(1),
            succeeded_jobs: 0,
            failed_jobs: 0,
        };
        assert_eq!(keys(&tenant), properties("Tenant"));

        let explanation = meridian_core::Explanation {
            job_id: "j".into(),
            state: JobState::Queued,
            cluster: None,
            decided_at_ms: None,
            summary: "s".into(),
            member_says: Some("m".into()),
            candidates: vec![],
            omitted_candidates: Some(meridian_placement::Omitted::default()),
            sibling_copies: vec![meridian_core::CopyView {
                cluster: "c".into(),
                gpu_type: "h100".into(),
                ready: false,
            }],
        };
        assert_eq!(keys(&explanation), properties("Explanation"));
    }
}
