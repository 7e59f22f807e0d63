//! Turns API answers (as JSON) into the text the user commands print.
//!
//! Every function takes the API's JSON and returns the whole text, so the output can be tested
//! without a gateway. Missing or null fields print as `-`, so an older or newer gateway still
//! renders.

use serde_json::Value;

use super::format;
use super::table::{Table, key_values};

/// Placeholder for a missing value.
const NONE: &str = "-";

/// `meridian submit`: `job j-... submitted (Queued)`, or `already submitted` when the gateway
/// returned an existing job for the same idempotency key.
pub fn submitted(job: &Value, created: bool) -> String {
    let verb = if created { "submitted" } else { "already submitted" };
    format!("job {} {verb} ({})\n", text(job, "/id"), text(job, "/state"))
}

/// `meridian cancel`: `job j-... Cancelled`, or what state the job had already reached.
pub fn cancelled(job: &Value) -> String {
    let id = text(job, "/id");
    match str_at(job, "/state") {
        Some("Cancelled") => format!("job {id} Cancelled\n"),
        Some(state @ ("Succeeded" | "Failed")) => format!("job {id} had already {state}; nothing to cancel\n"),
        _ => {
            let message = str_at(job, "/message").filter(|m| !m.is_empty());
            match message {
                Some(message) => format!("job {id} {}: {message}\n", text(job, "/state")),
                None => format!("job {id} {}\n", text(job, "/state")),
            }
        }
    }
}

/// `meridian jobs`: ID, NAME, TENANT, STATE, CLUSTER, GPUS (replicas×GPUs), AGE.
pub fn jobs(list: &Value, now_ms: i64) -> String {
    let jobs = list.get("jobs").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if jobs.is_empty() {
        return "no jobs\n".to_owned();
    }
    let mut table = Table::new(["ID", "NAME", "TENANT", "STATE", "CLUSTER", "GPUS", "AGE"]);
    for job in jobs {
        table.row([
            text(job, "/id"),
            text(job, "/spec/name"),
            text(job, "/spec/tenant"),
            state_and_idle(job),
            text(job, "/cluster"),
            gang_gpus(job),
            time_ago(job, "/submittedAtMs", now_ms),
        ]);
    }
    table.render()
}

/// One line of `--watch`: `HH:MM:SS  ID  TENANT  BEFORE → NOW  CLUSTER  MESSAGE` (UTC), from a
/// job event's data (`{atMs, previousState, job}`).
pub fn job_change(data: &Value) -> String {
    let at = int_at(data, "/atMs").map_or_else(|| NONE.to_owned(), clock_utc);
    let job = data.get("job").unwrap_or(&Value::Null);
    let change = match str_at(data, "/previousState") {
        Some(before) if Some(before) != str_at(job, "/state") => format!("{before} → {}", text(job, "/state")),
        Some(_) => text(job, "/state"),
        None => format!("new → {}", text(job, "/state")),
    };
    let message = str_at(job, "/message").filter(|m| !m.is_empty()).unwrap_or(NONE);
    format!(
        "{at}  {}  {}  {change}  {}  {message}\n",
        text(job, "/id"),
        text(job, "/spec/tenant"),
        text(job, "/cluster")
    )
}

/// `HH:MM:SS` (UTC) of a Unix time in milliseconds.
fn clock_utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// `meridian job ID`: the job's status as a key/value block, then a summary of its spec.
pub fn job(job: &Value, now_ms: i64) -> String {
    let mut status = vec![
        ("ID", text(job, "/id")),
        ("Name", text(job, "/spec/name")),
        ("Tenant", text(job, "/spec/tenant")),
        ("State", text(job, "/state")),
        ("Cluster", text(job, "/cluster")),
        replicas(job),
        ("Fencing token", text(job, "/fencingToken")),
        ("Submitted", ago(job, "/submittedAtMs", now_ms)),
        ("Started", ago(job, "/startedAtMs", now_ms)),
        ("Finished", ago(job, "/finishedAtMs", now_ms)),
    ];
    if let (Some(started), end) = (int_at(job, "/startedAtMs"), int_at(job, "/finishedAtMs")) {
        let end = end.unwrap_or(now_ms);
        status.push(("Run time", format::age(end, started)));
    }
    if let Some(count) = int_at(job, "/preemptions").filter(|n| *n > 0) {
        status.push(("Preempted", format!("{count} times, last {}", ago(job, "/lastPreemptedAtMs", now_ms))));
    }
    if let Some(message) = str_at(job, "/message").filter(|m| !m.is_empty()) {
        status.push(("Message", message.to_owned()));
    }
    if let Some(used) = gpu_use(job, now_ms) {
        status.push(("GPU use", used));
    }
    let mut out = key_values(&status);
    let Some(spec) = job.get("spec").filter(|s| s.is_object()) else {
        return out;
    };
    out.push_str("\nSpec:\n");
    for line in key_values(&spec_summary(spec)).lines() {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Where each replica runs, by rank (the job contract's `RANK`/`MERIDIAN_REPLICA`: the member
/// reports replica `i`'s node at position `i`), rank 0 marked as the coordinator; `Nodes: -`
/// before the job runs anywhere.
fn replicas(job: &Value) -> (&'static str, String) {
    let nodes: Vec<&str> =
        job.get("nodes").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    if nodes.is_empty() {
        return ("Nodes", NONE.to_owned());
    }
    let mut table = Table::new(["RANK", "NODE", ""]);
    for (rank, node) in nodes.iter().enumerate() {
        table.row([
            rank.to_string(),
            (*node).to_owned(),
            if rank == 0 { "coordinator".to_owned() } else { String::new() },
        ]);
    }
    ("Replicas", table.render().lines().map(str::trim_end).collect::<Vec<_>>().join("\n"))
}

/// `meridian explain ID`: the summary sentence, a table of every candidate cluster with its
/// score, and why each rejected cluster was rejected.
pub fn explain(explanation: &Value) -> String {
    let mut out = String::new();
    match str_at(explanation, "/summary").filter(|s| !s.is_empty()) {
        Some(summary) => out.push_str(summary),
        None => {
            out.push_str(&format!("job {} is {}", text(explanation, "/jobId"), text(explanation, "/state")));
        }
    }
    out.push('\n');
    if let Some(now) = str_at(explanation, "/memberSays").filter(|s| !s.is_empty()) {
        out.push_str(&format!("now: {now}\n"));
    }
    let copies = explanation.get("siblingCopies").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if !copies.is_empty() {
        let listed: Vec<String> = copies
            .iter()
            .map(|copy| {
                let gpu_type = str_at(copy, "/gpuType").filter(|t| !t.is_empty()).map(|t| format!(" ({t})"));
                let ready = copy.get("ready").and_then(Value::as_bool) == Some(true);
                format!(
                    "{}{}{}",
                    text(copy, "/cluster"),
                    gpu_type.unwrap_or_default(),
                    if ready { ": ready, asked for the start lock" } else { "" }
                )
            })
            .collect();
        out.push_str(&format!("waiting as sibling copies on: {}\n", listed.join(", ")));
    }
    let candidates = explanation.get("candidates").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if candidates.is_empty() {
        out.push_str("\nno member clusters were considered\n");
        return out;
    }
    let mut table = Table::new(["CLUSTER", "REGION", "TIER", "VERDICT", "WAIT", "TRANSFER", "COST($)", "SCORE"]);
    for candidate in candidates {
        let score = candidate.get("score").filter(|s| s.is_object());
        let wait = score.map(|score| {
            let wait = num_at(score, "/expectedWaitSecs");
            match (score.get("fitsNow").and_then(Value::as_bool), wait) {
                (Some(true), None | Some(0.0)) => "now".to_owned(),
                // A member's own start quote, not the gateway's estimate from its releases.
                (_, Some(wait)) if score.get("quoted").and_then(Value::as_bool) == Some(true) => {
                    format!("{} (quoted)", format::duration(wait))
                }
                (_, Some(wait)) => format::duration(wait),
                (_, None) => NONE.to_owned(),
            }
        });
        let transfer = score.and_then(|s| num_at(s, "/transferSecs")).map(format::duration);
        let cost = score.and_then(|s| {
            let egress = num_at(s, "/egressUsd");
            let compute = num_at(s, "/computeUsd");
            (egress.is_some() || compute.is_some()).then(|| format::usd(egress.unwrap_or(0.0) + compute.unwrap_or(0.0)))
        });
        let total = score.and_then(|s| num_at(s, "/total")).map(|total| format!("{total:.1}"));
        table.row([
            text(candidate, "/cluster"),
            text(candidate, "/region"),
            text(candidate, "/tier"),
            text(candidate, "/verdict"),
            or_none(wait),
            or_none(transfer),
            or_none(cost),
            or_none(total),
        ]);
    }
    out.push('\n');
    out.push_str(&table.render());

    let mut rejections = String::new();
    for candidate in candidates.iter().filter(|c| str_at(c, "/verdict") == Some("rejected")) {
        let cluster = text(candidate, "/cluster");
        let reasons: Vec<&str> = candidate
            .get("reasons")
            .and_then(Value::as_array)
            .map(|reasons| reasons.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if reasons.is_empty() {
            rejections.push_str(&format!("  {cluster}: no reason given\n"));
        }
        for reason in reasons {
            rejections.push_str(&format!("  {cluster}: {reason}\n"));
        }
    }
    if !rejections.is_empty() {
        out.push_str("\nrejected:\n");
        out.push_str(&rejections);
    }
    if let Some(omitted) = explanation.get("omittedCandidates").filter(|o| o.is_object()) {
        out.push_str(&omitted_line(omitted));
    }
    out
}

/// `meridian clusters`: NAME, REGION, TIER, BACKEND, UP, GPUS (free/total), PENDING (jobs and
/// their GPUs), WAIT (estimated), PRICE (per GPU-hour by type).
pub fn clusters(list: &Value) -> String {
    let clusters = list.get("clusters").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if clusters.is_empty() {
        return "no member clusters\n".to_owned();
    }
    let mut table = Table::new(["NAME", "REGION", "TIER", "BACKEND", "UP", "GPUS", "PENDING", "WAIT", "PRICE"]);
    for cluster in clusters {
        let up = match cluster.get("connected").and_then(Value::as_bool) {
            Some(true) => "yes".to_owned(),
            Some(false) => match num_at(cluster, "/lastSeenSecsAgo") {
                Some(ago) => format!("no ({} ago)", format::duration(ago)),
                None => "no".to_owned(),
            },
            None => NONE.to_owned(),
        };
        let gpus = format!("{}/{}", text(cluster, "/gpusFree"), text(cluster, "/gpusTotal"));
        let pending = match int_at(cluster, "/pendingGpus") {
            Some(gpus) => format!("{} ({gpus} GPUs)", text(cluster, "/pendingJobs")),
            None => text(cluster, "/pendingJobs"),
        };
        let wait = num_at(cluster, "/estimatedWaitSecs").map(format::duration);
        let prices = cluster.get("prices").and_then(Value::as_object).map(|prices| {
            join(prices.iter().filter_map(|(gpu, price)| price.as_f64().map(|p| format!("{gpu} ${}", format::usd(p)))))
        });
        table.row([
            text(cluster, "/name"),
            text(cluster, "/region"),
            text(cluster, "/tier"),
            text(cluster, "/backend"),
            up,
            gpus,
            pending,
            or_none(wait),
            or_none(prices.filter(|p| !p.is_empty())),
        ]);
    }
    table.render()
}

/// The spec lines of `meridian job ID`.
fn spec_summary(spec: &Value) -> Vec<(&'static str, String)> {
    let mut lines = vec![("Priority", text(spec, "/priority"))];
    if let Some(labels) = spec.get("labels").and_then(Value::as_object).filter(|l| !l.is_empty()) {
        lines.push(("Labels", join(labels.iter().map(|(key, value)| format!("{key}={}", scalar(value))))));
    }
    if let Some(key) = str_at(spec, "/idempotencyKey") {
        lines.push(("Idempotency key", key.to_owned()));
    }

    let resources = spec.pointer("/gang/resources");
    let mut gang = format!(
        "{} replica(s) × {} GPU",
        int_at(spec, "/gang/replicas").unwrap_or(1),
        text(spec, "/gang/resources/gpus")
    );
    if let Some(types) = resources.and_then(|r| r.get("gpuTypes")).and_then(Value::as_array).filter(|t| !t.is_empty()) {
        gang.push_str(&format!(" ({})", join(types.iter().map(scalar))));
    }
    for (pointer, unit) in [("/gpuMemoryGiB", "GiB per GPU"), ("/cpu", "CPU"), ("/memoryGiB", "GiB memory")] {
        if let Some(amount) = resources.and_then(|r| r.pointer(pointer)).and_then(Value::as_u64).filter(|&a| a > 0) {
            gang.push_str(&format!(", {amount} {unit}"));
        }
    }
    lines.push(("Gang", gang));

    if spec.get("runtime").is_some() {
        let mut runtime = format!("estimate {}", text(spec, "/runtime/estimate"));
        if let Some(limit) = str_at(spec, "/runtime/limit") {
            runtime.push_str(&format!(", limit {limit}"));
        }
        lines.push(("Runtime", runtime));
    }
    if let Some(data) = spec.get("data").and_then(Value::as_array).filter(|d| !d.is_empty()) {
        let data =
            data.iter().map(|d| format!("{} ({} GiB in {})", text(d, "/uri"), text(d, "/sizeGiB"), text(d, "/region")));
        lines.push(("Data", data.collect::<Vec<_>>().join("\n")));
    }
    if let Some(placement) = spec.get("placement") {
        let mut rules = Vec::new();
        for (pointer, name) in [("/regions", "regions"), ("/clusters/include", "only"), ("/clusters/exclude", "never")]
        {
            if let Some(list) = placement.pointer(pointer).and_then(Value::as_array).filter(|l| !l.is_empty()) {
                rules.push(format!("{name} {}", join(list.iter().map(scalar))));
            }
        }
        for (pointer, name) in [("/clusterSelector", "clusters matching"), ("/nodeSelector", "nodes matching")] {
            if let Some(selector) = str_at(placement, pointer).filter(|s| !s.is_empty()) {
                rules.push(format!("{name} {selector}"));
            }
        }
        match placement.get("burst") {
            Some(Value::String(never)) => rules.push(format!("burst {never}")),
            Some(burst @ Value::Object(_)) => {
                let mut rule = format!("burst after {}", text(burst, "/after"));
                if let Some(cap) = num_at(burst, "/maxUsdPerHour") {
                    rule.push_str(&format!(" up to ${}/h", format::usd(cap)));
                }
                rules.push(rule);
            }
            _ => {}
        }
        if !rules.is_empty() {
            lines.push(("Placement", rules.join("; ")));
        }
    }
    if let Some(image) = str_at(spec, "/payload/image") {
        lines.push(("Image", image.to_owned()));
    }
    if let Some(command) = spec.pointer("/payload/command").and_then(Value::as_array).filter(|c| !c.is_empty()) {
        lines.push(("Command", command.iter().map(scalar).collect::<Vec<_>>().join(" ")));
    }
    let launcher = str_at(spec, "/payload/launcherEnv").unwrap_or("torch");
    let renames: Vec<String> = spec
        .pointer("/payload/launcherEnvNames")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(from, to)| format!("{from} as {}", to.as_str().unwrap_or_default()))
        .collect();
    if launcher != "torch" || !renames.is_empty() {
        let renamed = if renames.is_empty() { String::new() } else { format!(" ({})", renames.join(", ")) };
        lines.push(("Launcher", format!("{launcher}{renamed}")));
    }
    lines
}

/// `replicas×gpus` of a job, such as `2×8`.
/// The job's state, with `IDLE` when its GPUs sit unused.
fn state_and_idle(job: &Value) -> String {
    let state = text(job, "/state");
    if job.pointer("/usage/idle").and_then(Value::as_bool) == Some(true) { format!("{state} IDLE") } else { state }
}

/// `3% of its GPUs (last 1m); IDLE since 40m ago`, when the member measures utilisation.
fn gpu_use(job: &Value, now_ms: i64) -> Option<String> {
    let utilization = num_at(job, "/usage/gpuUtilization")?;
    let mut line = format!("{:.0}% of its GPUs", utilization * 100.0);
    if let Some(window) = int_at(job, "/usage/windowSecs").filter(|w| *w > 0) {
        line.push_str(&format!(" (mean of the last {})", format::age(window.saturating_mul(1000), 0)));
    }
    if job.pointer("/usage/idle").and_then(Value::as_bool) == Some(true) {
        line.push_str(&format!("; IDLE since {}", ago(job, "/usage/idleSinceMs", now_ms)));
    }
    Some(line)
}

fn gang_gpus(job: &Value) -> String {
    match int_at(job, "/spec/gang/resources/gpus") {
        Some(gpus) => format!("{}×{gpus}", int_at(job, "/spec/gang/replicas").unwrap_or(1)),
        None => NONE.to_owned(),
    }
}

/// The age of a millisecond timestamp, `-` when absent.
fn time_ago(value: &Value, pointer: &str, now_ms: i64) -> String {
    int_at(value, pointer).map(|then| format::age(now_ms, then)).unwrap_or_else(|| NONE.to_owned())
}

/// Like [`time_ago`], with ` ago` appended.
fn ago(value: &Value, pointer: &str, now_ms: i64) -> String {
    match int_at(value, pointer) {
        Some(then) => format!("{} ago", format::age(now_ms, then)),
        None => NONE.to_owned(),
    }
}

fn str_at<'v>(value: &'v Value, pointer: &str) -> Option<&'v str> {
    value.pointer(pointer).and_then(Value::as_str)
}

fn int_at(value: &Value, pointer: &str) -> Option<i64> {
    let found = value.pointer(pointer)?;
    found.as_i64().or_else(|| found.as_f64().map(|f| f as i64))
}

fn num_at(value: &Value, pointer: &str) -> Option<f64> {
    value.pointer(pointer).and_then(Value::as_f64)
}

/// A scalar at `pointer` as text; `-` when missing or null.
fn text(value: &Value, pointer: &str) -> String {
    value.pointer(pointer).map(scalar).unwrap_or_else(|| NONE.to_owned())
}

/// Strings without quotes, numbers and booleans as written, null as `-`, anything else as JSON.
fn scalar(value: &Value) -> String {
    match value {
        Value::Null => NONE.to_owned(),
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn or_none(value: Option<String>) -> String {
    value.unwrap_or_else(|| NONE.to_owned())
}

fn join<I, S>(items: I) -> String
where
    I: Iterator<Item = S>,
    S: AsRef<str>,
{
    items.map(|item| item.as_ref().to_owned()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests;

/// The clusters a compacted decision counts instead of listing, as one line.
fn omitted_line(omitted: &Value) -> String {
    let feasible = num_at(omitted, "/feasible").unwrap_or(0.0) as u64;
    let rejected: Vec<String> = omitted
        .get("rejected")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|group| format!("{} {}", num_at(group, "/clusters").unwrap_or(0.0) as u64, text(group, "/reason")))
        .collect();
    let mut parts = Vec::new();
    if feasible > 0 {
        parts.push(format!("{feasible} more feasible, each scored worse than those listed"));
    }
    if !rejected.is_empty() {
        parts.push(format!("more rejected like the examples above: {}", rejected.join(", ")));
    }
    if parts.is_empty() {
        return String::new();
    }
    format!("\nnot listed: {}\n", parts.join("; "))
}
