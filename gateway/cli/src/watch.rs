//! `meridian jobs --watch` and `meridian job ID --watch`: the current state, then each change as
//! it is committed, from the gateway's event stream (`GET /v1/events`). A broken connection is
//! resumed from the last event seen, so nothing is missed; when the gateway cannot resume (it
//! restarted, or this watcher fell too far behind) the list is printed again. With several
//! gateways, a broken stream is resumed at the next one (any gateway serves the stream, and the
//! one that broke it may be gone).

use std::io::Write;
use std::time::Duration;

use serde_json::Value;

use crate::client::{Client, percent_encode};
use crate::sse::SseMessage;
use crate::{CliError, OutputFormat, now_ms, render};

/// Pause between attempts to reconnect.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);
/// Pause before resuming at another gateway: it is likely up, so only a short one.
const RECONNECT_ELSEWHERE: Duration = Duration::from_millis(100);
/// A watcher that cannot reach the gateway this long gives up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// What is watched.
#[derive(Debug, Clone)]
pub enum Watched {
    /// A job list, with the list's filters.
    Jobs {
        /// Only this tenant.
        tenant: Option<String>,
        /// Only changes into or out of this state.
        state: Option<String>,
        /// Only jobs whose labels match.
        selector: Option<String>,
    },
    /// One job, until it ends.
    Job(String),
}

impl Watched {
    fn path(&self) -> String {
        let mut query = vec!["kinds=job".to_string()];
        match self {
            Watched::Jobs { tenant, selector, .. } => {
                if let Some(tenant) = tenant {
                    query.push(format!("tenant={}", percent_encode(tenant)));
                }
                if let Some(selector) = selector {
                    query.push(format!("selector={}", percent_encode(selector)));
                }
            }
            Watched::Job(id) => query.push(format!("job={}", percent_encode(id))),
        }
        format!("/v1/events?{}", query.join("&"))
    }
}

/// A job ended in a state other than `Succeeded` while `job ID --watch` followed it.
fn ended(job: &Value) -> Option<Result<(), CliError>> {
    let state = job.get("state").and_then(Value::as_str)?;
    match state {
        "Succeeded" => Some(Ok(())),
        "Failed" | "Cancelled" => Some(Err(CliError::JobEnded {
            id: job.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
            state: state.to_string(),
            message: job.get("message").and_then(Value::as_str).unwrap_or_default().to_string(),
        })),
        _ => None,
    }
}

/// Follows `watched`, printing to `out`, until the job ends (for one job) or the user stops it.
pub async fn run(
    client: &Client,
    watched: Watched,
    output: OutputFormat,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let path = watched.path();
    let mut last_id: Option<String> = None;
    let mut shown = false;
    let mut unreachable_since: Option<tokio::time::Instant> = None;
    loop {
        let mut stream = match client.events(&path, last_id.as_deref()).await {
            Ok(stream) => stream,
            Err(error) if error.is_unreachable() => {
                let since = *unreachable_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= GIVE_UP_AFTER {
                    return Err(error.into());
                }
                tokio::time::sleep(RECONNECT_EVERY).await;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        unreachable_since = None;
        loop {
            let message = match stream.next().await {
                Ok(Some(message)) => message,
                // The gateway closed the stream (it is stopping) or the connection broke:
                // resume from the last event seen.
                Ok(None) | Err(_) => {
                    eprintln!("meridian: the event stream from {} ended; reconnecting", stream.gateway());
                    if client.gateway_count() > 1 {
                        client.skip_gateway(stream.gateway());
                        tokio::time::sleep(RECONNECT_ELSEWHERE).await;
                    } else {
                        tokio::time::sleep(RECONNECT_EVERY).await;
                    }
                    break;
                }
            };
            if let Some(id) = &message.id {
                last_id = Some(id.clone());
            }
            if message.event == "ready" {
                // Where the stream starts: resuming from here later misses nothing.
                let cursor = serde_json::from_str::<Value>(&message.data)
                    .ok()
                    .and_then(|data| data.get("cursor").and_then(Value::as_str).map(str::to_string));
                last_id = cursor.or(last_id);
            }
            let fresh = !shown;
            shown = true;
            match handle(client, &watched, &message, fresh, output, out).await {
                Ok(Some(done)) => return done,
                Ok(None) => {}
                // `meridian jobs --watch | head`: stop quietly.
                Err(CliError::Output(error)) if error.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                Err(error) => return Err(error),
            }
        }
    }
}

/// Prints what one message means; Some(result) when watching is over.
async fn handle(
    client: &Client,
    watched: &Watched,
    message: &SseMessage,
    fresh: bool,
    output: OutputFormat,
    out: &mut impl Write,
) -> Result<Option<Result<(), CliError>>, CliError> {
    let data: Value = serde_json::from_str(&message.data).unwrap_or(Value::Null);
    match message.event.as_str() {
        // The stream starts here: print the state as of now (only the first time; a resumed
        // stream goes on where it was).
        "ready" if fresh => snapshot(client, watched, output, out).await,
        "reset" => {
            let reason = data.get("reason").and_then(Value::as_str).unwrap_or("events were missed");
            eprintln!("meridian: {reason}; showing the current state again");
            snapshot(client, watched, output, out).await
        }
        "job" => {
            let job = data.get("job").cloned().unwrap_or(Value::Null);
            if let Watched::Jobs { state: Some(state), .. } = watched {
                let now = job.get("state").and_then(Value::as_str);
                let before = data.get("previousState").and_then(Value::as_str);
                if now != Some(state.as_str()) && before != Some(state.as_str()) {
                    return Ok(None);
                }
            }
            let line = match output {
                OutputFormat::Table => render::job_change(&data),
                OutputFormat::Json => {
                    format!("{}\n", serde_json::json!({"event": "job", "id": message.id, "data": data}))
                }
            };
            print(out, &line)?;
            Ok(match watched {
                Watched::Job(_) => ended(&job),
                Watched::Jobs { .. } => None,
            })
        }
        _ => Ok(None),
    }
}

async fn snapshot(
    client: &Client,
    watched: &Watched,
    output: OutputFormat,
    out: &mut impl Write,
) -> Result<Option<Result<(), CliError>>, CliError> {
    let now = now_ms();
    match watched {
        Watched::Jobs { tenant, state, selector } => {
            let list = client.list(tenant.as_deref(), state.as_deref(), selector.as_deref()).await?;
            let text = match output {
                OutputFormat::Table => render::jobs(&list, now),
                OutputFormat::Json => format!("{}\n", serde_json::json!({"event": "list", "data": list})),
            };
            print(out, &text)?;
            Ok(None)
        }
        Watched::Job(id) => {
            let job = client.get(id).await?;
            let text = match output {
                OutputFormat::Table => render::job(&job, now),
                OutputFormat::Json => format!("{}\n", serde_json::json!({"event": "job", "data": {"job": job}})),
            };
            print(out, &text)?;
            Ok(ended(&job))
        }
    }
}

fn print(out: &mut impl Write, text: &str) -> Result<(), CliError> {
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(CliError::Output)
}
