//! Following changes: `GET /v1/events` (server-sent events) and the gRPC `Jobs/Watch` stream,
//! over the runtime's event stream (`runtime::events`), with the same filters and the same
//! authorization as a job list.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use meridian_proto::pb;
use serde_json::json;
use tokio_stream::Stream;

use super::error::{ApiError, Result};
use super::query::decode_query;
use super::redact::shown;
use super::rest::{RestState, authorized_job};
use crate::auth::{Caller, Role};
use crate::runtime::Handle;
use crate::runtime::events::{Event, EventId, EventKind, Subscription};

/// How often an idle stream sends a comment, so proxies and clients see it is alive.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// What a watcher asked for and may see.
#[derive(Debug, Clone)]
pub struct WatchQuery {
    /// Resume after this event.
    pub after: Option<EventId>,
    /// Job events wanted.
    pub jobs: bool,
    /// Cluster events wanted.
    pub clusters: bool,
    /// Only this tenant's jobs.
    pub tenant: Option<String>,
    /// Only these tenants' jobs (what a non-admin caller may see); None: every tenant.
    pub tenants: Option<BTreeSet<String>>,
    /// Only this job.
    pub job: Option<String>,
    /// Only jobs whose labels match.
    pub selector: Option<meridian_proto::selector::Selector>,
}

impl WatchQuery {
    /// Whether `event` goes to this watcher.
    pub fn admits(&self, event: &Event) -> bool {
        match &event.kind {
            EventKind::Job { job, .. } => {
                self.jobs
                    && self.tenant.as_ref().is_none_or(|t| *t == job.spec.tenant)
                    && self.tenants.as_ref().is_none_or(|set| set.contains(&job.spec.tenant))
                    && self.job.as_ref().is_none_or(|id| *id == job.id)
                    && self.selector.as_ref().is_none_or(|s| s.matches(&job.spec.labels))
            }
            EventKind::Cluster(_) => self.clusters && self.job.is_none(),
        }
    }
}

/// Reads the parameters of a watch (`after`, `kinds`, `tenant`, `job`, `selector`), naming any unknown or
/// invalid one, and limits it to what `caller` may read (as a job list does).
pub fn parse_watch_query(handle: &Handle, caller: &Caller, params: &HashMap<String, String>) -> Result<WatchQuery> {
    let bad = |field: &str, reason: String| ApiError::BadRequest { field: field.into(), reason };
    let mut query =
        WatchQuery { after: None, jobs: true, clusters: true, tenant: None, tenants: None, job: None, selector: None };
    for (key, value) in params {
        match key.as_str() {
            "after" if !value.is_empty() => {
                query.after =
                    Some(value.parse().map_err(|e: crate::runtime::events::BadEventId| bad("after", e.to_string()))?);
            }
            "kinds" if !value.is_empty() => {
                query.jobs = false;
                query.clusters = false;
                for kind in value.split(',').map(str::trim) {
                    match kind {
                        "job" | "jobs" => query.jobs = true,
                        "cluster" | "clusters" => query.clusters = true,
                        other => return Err(bad("kinds", format!("`{other}` is not an event kind; use job, cluster"))),
                    }
                }
            }
            "tenant" if !value.is_empty() => query.tenant = Some(value.clone()),
            "job" if !value.is_empty() => query.job = Some(value.clone()),
            "selector" if !value.is_empty() => {
                query.selector = Some(
                    value
                        .parse()
                        .map_err(|e: meridian_proto::selector::SelectorError| bad("selector", e.to_string()))?,
                );
            }
            "after" | "kinds" | "tenant" | "job" | "selector" => {}
            other => {
                return Err(bad(other, "unknown query parameter; use after, kinds, tenant, job or selector".into()));
            }
        }
    }
    match (&query.job, &query.tenant) {
        (Some(id), _) => {
            authorized_job(handle, caller, id, Role::Viewer, "watch")?;
        }
        (None, Some(tenant)) => caller.require(Role::Viewer, tenant, || format!("watch jobs of tenant {tenant}"))?,
        (None, None) => query.tenants = caller.visible_tenants(),
    }
    Ok(query)
}

/// What one event says, for either API.
pub enum Said {
    /// The stream starts after this position.
    Ready(EventId),
    /// An admitted event.
    Event(Arc<Event>),
    /// Events were missed.
    Reset(String),
}

/// The stream of what a watcher is told: `Ready` first, then admitted events and resets; it
/// ends when the gateway stops. A task feeds it; dropping the stream (the client went away)
/// stops the task.
pub fn said(mut subscription: Subscription, query: WatchQuery) -> impl Stream<Item = Said> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let task = tokio::spawn(async move {
        if tx.send(Said::Ready(subscription.cursor())).await.is_err() {
            return;
        }
        while let Some(next) = subscription.next().await {
            let said = match next {
                Ok(event) if query.admits(&event) => Said::Event(event),
                Ok(_) => continue,
                Err(gap) => Said::Reset(gap.reason),
            };
            if tx.send(said).await.is_err() {
                return;
            }
        }
    });
    Owned { inner: tokio_stream::wrappers::ReceiverStream::new(rx), task }
}

/// A receiver stream that owns its producer task: dropping the stream stops the task.
struct Owned {
    inner: tokio_stream::wrappers::ReceiverStream<Said>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Stream for Owned {
    type Item = Said;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.inner).poll_next(cx)
    }
}

/// `GET /v1/events`.
pub async fn events(
    State(state): State<RestState>,
    caller: Caller,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response> {
    let mut params: HashMap<String, String> = decode_query(raw.as_deref().unwrap_or_default())?.into_iter().collect();
    if !params.contains_key("after")
        && let Some(last) = headers.get("last-event-id")
    {
        let text = last.to_str().map_err(|_| ApiError::BadRequest {
            field: "Last-Event-ID".into(),
            reason: "the header is not ASCII".into(),
        })?;
        params.insert("after".into(), text.to_string());
    }
    let query = parse_watch_query(&state.handle, &caller, &params)?;
    let subscription = state.handle.subscribe(query.after);
    let handle = state.handle.clone();
    let stream = tokio_stream::StreamExt::map(said(subscription, query), move |said| {
        Ok::<_, Infallible>(sse_event(&said, &handle))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive")).into_response())
}

/// One message of the SSE stream; a job is shown as `GET /v1/jobs/{id}` shows it now (with its
/// GPU usage, which changes without events).
fn sse_event(said: &Said, handle: &Handle) -> SseEvent {
    match said {
        Said::Ready(cursor) => {
            SseEvent::default().event("ready").data(json!({ "cursor": cursor.to_string() }).to_string())
        }
        Said::Reset(reason) => SseEvent::default().event("reset").data(json!({ "reason": reason }).to_string()),
        Said::Event(event) => {
            let (name, data) = match &event.kind {
                EventKind::Job { job, previous } => (
                    "job",
                    json!({
                        "atMs": event.at_ms,
                        "previousState": previous,
                        "job": shown(job, &handle.view(), crate::runtime::now_ms()),
                    }),
                ),
                EventKind::Cluster(cluster) => ("cluster", json!({ "atMs": event.at_ms, "cluster": cluster })),
            };
            SseEvent::default().id(event.id.to_string()).event(name).data(data.to_string())
        }
    }
}

/// One event on the gRPC `Watch` stream.
pub fn grpc_event(said: &Said, job_to_wire: impl Fn(&meridian_core::JobRecord) -> pb::Job) -> pb::WatchEvent {
    use pb::watch_event::Body;
    match said {
        Said::Ready(cursor) => pb::WatchEvent {
            id: String::new(),
            at_ms: 0,
            body: Some(Body::Ready(pb::WatchReady { cursor: cursor.to_string() })),
        },
        Said::Reset(reason) => pb::WatchEvent {
            id: String::new(),
            at_ms: 0,
            body: Some(Body::Reset(pb::WatchReset { reason: reason.clone() })),
        },
        Said::Event(event) => {
            let body = match &event.kind {
                EventKind::Job { job, previous } => Body::Job(pb::JobChanged {
                    job: Some(job_to_wire(job)),
                    previous_state: previous.map_or(pb::JobState::Unspecified, pb::JobState::from) as i32,
                }),
                EventKind::Cluster(cluster) => Body::ClusterJson(serde_json::to_string(cluster).unwrap_or_default()),
            };
            pb::WatchEvent { id: event.id.to_string(), at_ms: event.at_ms, body: Some(body) }
        }
    }
}
