//! Prometheus metrics end to end: a real gateway with two real agents (`east`, owned, one 8-GPU
//! H100 node; `west`, cloud, one 8-GPU A100 node). A job runs on `east`, a second one waits for
//! it; the scrape of `GET /metrics` must show exactly that. Every metric the Grafana dashboard
//! (`deploy/grafana/meridian.json`) and the Prometheus rules (`deploy/prometheus/rules.yaml`)
//! query must exist in the gateway's or an agent's exposition, and the exposition must parse.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use meridian_e2e::{ClusterOptions, Federation, GATEWAY_CONFIG, Gateway, free_port, poll};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WEST_NODES: &str = "  - {shape: a100-node, count: 1, gpuType: a100-80g, gpus: 8, cpu: 96, memoryGiB: 1024}\n";
const WAIT: Duration = Duration::from_secs(30);

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// A gateway with `east` (owned, one 8-GPU H100 node) and `west` (cloud) connected; jobs last
/// an hour of real time. The agents serve their own `/metrics` (the address returned) once the
/// agent part is merged.
async fn federation() -> (Federation, Option<SocketAddr>) {
    let dir = tempfile::tempdir().unwrap();
    let agent_metrics = Some(SocketAddr::from(([127, 0, 0, 1], free_port().unwrap())));
    let mut east = ClusterOptions::default();
    if let Some(addr) = agent_metrics {
        // The agent's metrics, with a utilisation source so its GPU samples are there too.
        let samples = dir.path().join("gpu.prom");
        std::fs::write(&samples, "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\"} 50\n").unwrap();
        east = east.extra(format!(
            "metrics: {{listen: '{addr}'}}\nutilization: {{file: '{}', interval: 200ms}}\n",
            samples.display()
        ));
    }
    let west = ClusterOptions::default().region("eu-west").tier("cloud").prices("{a100-80g: 3.5}").nodes(WEST_NODES);
    let federation = Federation::builder().in_dir(dir).cluster("east", east).cluster("west", west).start().await;
    (federation.unwrap(), agent_metrics)
}

fn h100_job(name: &str) -> String {
    format!(
        "name: {name}\ntenant: vision\ngang: {{replicas: 1, resources: {{gpus: 8, gpuTypes: [h100]}}}}\n\
         runtime: {{estimate: 1h}}\npayload: {{command: [python, train.py]}}\n"
    )
}

/// `GET /metrics` over a plain HTTP/1.1 connection: (status, content type, body).
async fn scrape(addr: SocketAddr, token: Option<&str>) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim()))
            .map(str::to_string)
    };
    assert!(header("transfer-encoding").is_none(), "a chunked answer: {head}");
    (status, header("content-type").unwrap_or_default(), body.to_string())
}

/// One sample of an exposition.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A parsed exposition: its samples, and the names each `# TYPE` line declares (with the
/// suffixes its samples take: `_total` for counters, `_bucket`, `_sum`, `_count` for histograms).
#[derive(Debug, Default)]
struct Exposition {
    samples: Vec<Sample>,
    declared: BTreeSet<String>,
}

impl Exposition {
    /// Parses the OpenMetrics text format strictly: every line is a comment (`# HELP`, `# TYPE`,
    /// `# UNIT`, `# EOF` last) or `name{labels} value`; panics naming the first bad line.
    fn parse(text: &str) -> Self {
        let mut exposition = Exposition::default();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.last(), Some(&"# EOF"), "the exposition must end with # EOF");
        for line in &lines[..lines.len() - 1] {
            if let Some(comment) = line.strip_prefix("# ") {
                let mut words = comment.splitn(3, ' ');
                let (kind, name, rest) = (words.next().unwrap(), words.next(), words.next());
                assert!(matches!(kind, "HELP" | "TYPE" | "UNIT"), "unknown comment line: {line}");
                let name = name.unwrap_or_else(|| panic!("a comment without a metric name: {line}"));
                assert!(is_metric_name(name), "bad metric name in: {line}");
                if kind == "TYPE" {
                    let suffixes: &[&str] = match rest {
                        Some("counter") => &["_total"],
                        Some("histogram") => &["_bucket", "_sum", "_count"],
                        Some("gauge" | "unknown" | "info" | "stateset") => &[""],
                        other => panic!("unknown metric type {other:?} in: {line}"),
                    };
                    for suffix in suffixes {
                        exposition.declared.insert(format!("{name}{suffix}"));
                    }
                }
                continue;
            }
            exposition.samples.push(parse_sample(line));
        }
        exposition
    }

    /// Every metric name a query may use: declared families and sample names.
    fn names(&self) -> BTreeSet<String> {
        self.declared.iter().cloned().chain(self.samples.iter().map(|s| s.name.clone())).collect()
    }

    /// The value of the one sample named `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .collect();
        assert!(matching.len() <= 1, "{name}{labels:?} matches {} samples: {matching:?}", matching.len());
        matching.first().map(|s| s.value)
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// `name{k="v",...} value`, panicking with the line when it is anything else.
fn parse_sample(line: &str) -> Sample {
    let bad = || -> ! { panic!("not a sample line (`name{{labels}} value`): {line:?}") };
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| bad());
    let name = &line[..name_end];
    if !is_metric_name(name) {
        bad();
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let mut end = None;
        while let Some((at, c)) = chars.next() {
            if c == '}' {
                end = Some(at);
                break;
            }
            let key_start = at;
            let mut key_end = at;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    key_end = i;
                    break;
                }
            }
            let key = inner[key_start..key_end].trim_start_matches(',');
            if !is_metric_name(key) || chars.next().map(|(_, c)| c) != Some('"') {
                bad();
            }
            let mut value = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => value.push(chars.next().map(|(_, c)| c).unwrap_or_else(|| bad())),
                    '"' => {
                        closed = true;
                        break;
                    }
                    '\n' => bad(),
                    c => value.push(c),
                }
            }
            if !closed {
                bad();
            }
            labels.insert(key.to_string(), value);
            if chars.peek().map(|(_, c)| *c) == Some(',') {
                chars.next();
            }
        }
        let end = end.unwrap_or_else(|| bad());
        rest = &inner[end + 1..];
    }
    let value_text = rest.strip_prefix(' ').unwrap_or_else(|| bad());
    // An exemplar or timestamp would follow a space; the gateway writes neither.
    let value = match value_text {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        text => text.parse::<f64>().unwrap_or_else(|_| bad()),
    };
    Sample { name: name.to_string(), labels, value }
}

/// Metric names a PromQL expression reads: identifiers that are not functions or aggregations
/// (followed by `(`), not keywords, not label names (inside `{}` or a `by (...)`-style list), not
/// in strings, durations or numbers.
fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    // Binary operators, modifiers, and aggregations (which may take `by (...)` before their
    // parenthesis, so "followed by `(`" does not catch them).
    const KEYWORDS: [&str; 28] = [
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "inf",
        "nan",
        "atan2",
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
        "limitk",
        "limit_ratio",
    ];
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let skip_to =
        |from: usize, close: char| chars[from..].iter().position(|c| *c == close).map_or(chars.len(), |p| from + p + 1);
    let next_non_space = |from: usize| chars[from..].iter().position(|c| !c.is_whitespace()).map(|p| from + p);
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_to(i + 1, c),
            '{' => i = skip_to(i + 1, '}'),
            '[' => i = skip_to(i + 1, ']'),
            c if c.is_ascii_digit() || c == '.' || c == '$' => {
                i += 1;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = next_non_space(i);
                let followed_by_paren = next.is_some_and(|n| chars[n] == '(');
                if LABEL_LISTS.contains(&word.as_str()) {
                    if let Some(n) = next.filter(|_| followed_by_paren) {
                        i = skip_to(n + 1, ')');
                    }
                } else if !followed_by_paren && !KEYWORDS.contains(&word.to_ascii_lowercase().as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Every PromQL expression of the dashboard: panel targets' `expr`, and the metric of each
/// `label_values(metric, label)` variable query.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut queries = Vec::new();
    fn walk(value: &Value, queries: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", Value::String(expr)) => queries.push(expr.clone()),
                        ("definition" | "query", Value::String(query)) if query.starts_with("label_values(") => {
                            let inner = &query["label_values(".len()..];
                            let metric = inner.split([',', ')']).next().unwrap_or_default().trim();
                            queries.push(metric.to_string());
                        }
                        _ => walk(value, queries),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, queries)),
            _ => {}
        }
    }
    walk(dashboard, &mut queries);
    queries
}

/// The rule file's expressions and the names its recording rules define.
fn rule_queries(rules: &Value) -> (Vec<String>, BTreeSet<String>) {
    let mut exprs = Vec::new();
    let mut recorded = BTreeSet::new();
    for group in rules["groups"].as_array().expect("rules.yaml has groups") {
        for rule in group["rules"].as_array().expect("each group has rules") {
            exprs.push(rule["expr"].as_str().expect("each rule has an expr").to_string());
            match (rule["record"].as_str(), rule["alert"].as_str()) {
                (Some(record), None) => {
                    recorded.insert(record.to_string());
                }
                (None, Some(_)) => {}
                other => panic!("a rule must be a record or an alert: {other:?} in {rule}"),
            }
        }
    }
    (exprs, recorded)
}

#[test]
fn metric_names_are_pulled_out_of_promql_and_nothing_else() {
    let names = promql_metric_names(
        r#"histogram_quantile(0.95, sum by (tenant, le) (rate(meridian_x_bucket{priority="high", tenant=~"$tenant"}[$__rate_interval]))) > 0.5 and on (cluster) meridian_up == 1 / ignoring(a) group_left(b) c:rec:ratio offset 5m"#,
    );
    assert_eq!(names, BTreeSet::from(["meridian_x_bucket".into(), "meridian_up".into(), "c:rec:ratio".into()]));
}

#[test]
fn the_exposition_parser_reads_labels_with_escapes_and_refuses_junk() {
    let sample = parse_sample(r#"m_total{a="x\"y",b="2"} 3.5"#);
    assert_eq!(sample.labels["a"], "x\"y");
    assert_eq!(sample.value, 3.5);
    assert!(std::panic::catch_unwind(|| parse_sample("m{a=x} 1")).is_err());
    assert!(std::panic::catch_unwind(|| parse_sample("m 1 2")).is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_the_job_that_runs_the_job_that_waits_and_every_name_the_dashboard_and_rules_use() {
    let (f, agent_metrics) = federation().await;
    let client = f.gateway.client();
    let (first, _) = client.submit(&h100_job("first")).await.unwrap();
    let first = first["id"].as_str().unwrap().to_string();
    f.gateway.wait_for_state(&first, "Running", WAIT).await.unwrap();
    let (second, _) = client.submit(&h100_job("second")).await.unwrap();
    let second = second["id"].as_str().unwrap().to_string();
    // The second job has been decided (east chosen, full; west rejected for its GPU type).
    poll(WAIT, || async {
        let explained = client.explain(&second).await.ok()?;
        (explained["candidates"].as_array()?.len() == 2).then_some(())
    })
    .await
    .unwrap();

    // (a) The values match what happened (polled: the agent's next inventory shows the run).
    let (status, content_type, text) = scrape(f.gateway.rest, None).await;
    assert_eq!(status, 200, "{text}");
    assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
    let exposition = poll(WAIT, || async {
        let (_, _, text) = scrape(f.gateway.rest, None).await;
        let exposition = Exposition::parse(&text);
        let allocated = exposition.value("meridian_cluster_gpus", &[("cluster", "east"), ("state", "allocated")]);
        (allocated == Some(8.0)).then_some(exposition)
    })
    .await
    .unwrap_or_else(|e| panic!("east never showed 8 GPUs allocated: {e}\ngateway log:\n{}", f.gateway.proc.log()));
    let v = |name: &str, labels: &[(&str, &str)]| {
        exposition.value(name, labels).unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
    };
    assert_eq!(v("meridian_cluster_gpus", &[("cluster", "east"), ("state", "total")]), 8.0);
    assert_eq!(v("meridian_cluster_gpus", &[("cluster", "east"), ("state", "free")]), 0.0);
    assert_eq!(v("meridian_cluster_gpus", &[("cluster", "west"), ("state", "allocated")]), 0.0);
    assert_eq!(v("meridian_cluster_connected", &[("cluster", "west")]), 1.0);
    assert_eq!(v("meridian_cluster_info", &[("cluster", "west"), ("tier", "cloud"), ("region", "eu-west")]), 1.0);
    assert_eq!(v("meridian_cluster_gpu_price_usd_per_hour", &[("cluster", "west"), ("gpu_type", "a100-80g")]), 3.5);
    assert_eq!(v("meridian_burst_gpus", &[("cluster", "west")]), 0.0);
    assert_eq!(v("meridian_tenant_queued_jobs", &[("tenant", "vision")]), 1.0);
    assert_eq!(v("meridian_tenant_queued_gpus", &[("tenant", "vision")]), 8.0);
    assert_eq!(v("meridian_tenant_running_gpus", &[("tenant", "vision")]), 8.0);
    assert_eq!(v("meridian_pending_jobs", &[("tenant", "vision"), ("reason", "waiting_for_capacity")]), 1.0);
    assert_eq!(v("meridian_jobs", &[("state", "running")]), 1.0);
    assert_eq!(v("meridian_placement_decisions_total", &[("outcome", "placed")]), 1.0);
    assert!(v("meridian_placement_decisions_total", &[("outcome", "waiting")]) >= 1.0);
    assert!(v("meridian_placement_rejections_total", &[("reason", "gpu_type_unavailable")]) >= 2.0);
    let delay = [("tenant", "vision"), ("priority", "normal")];
    assert_eq!(v("meridian_queueing_delay_seconds_count", &delay), 1.0);
    assert_eq!(v("meridian_queueing_delay_seconds_bucket", &[delay[0], delay[1], ("le", "+Inf")]), 1.0);
    assert!(v("meridian_store_commit_seconds_count", &[]) >= 3.0);
    assert_eq!(v("meridian_gateway_store_failed", &[]), 0.0);

    // (b) Every metric the dashboard and the rules use exists (declared by the gateway or an
    // agent, or recorded by a rule), but for the names of the part not merged yet.
    let mut available = exposition.names();
    if let Some(addr) = agent_metrics {
        // Once the agent has counted the running job and sampled its GPUs.
        let (status, _, text) = poll(WAIT, || async {
            tokio::net::TcpStream::connect(addr).await.ok()?;
            let scraped = scrape(addr, None).await;
            let names = Exposition::parse(&scraped.2).names();
            (names.contains("meridian_agent_jobs") && names.contains("meridian_agent_gpu_utilization_ratio"))
                .then_some(scraped)
        })
        .await
        .unwrap();
        assert_eq!(status, 200, "{text}");
        available.extend(Exposition::parse(&text).names());
    }
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file("deploy/grafana/meridian.json")).unwrap()).unwrap();
    let rules: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(repo_file("deploy/prometheus/rules.yaml")).unwrap()).unwrap();
    let (rule_exprs, recorded) = rule_queries(&rules);
    available.extend(recorded.iter().cloned());
    let dashboard_exprs = dashboard_queries(&dashboard);
    assert!(dashboard_exprs.len() >= 30 && rule_exprs.len() >= 10, "too few queries found");
    let mut used: BTreeMap<String, String> = BTreeMap::new();
    for (file, exprs) in [("meridian.json", &dashboard_exprs), ("rules.yaml", &rule_exprs)] {
        for expr in exprs {
            for name in promql_metric_names(expr) {
                used.entry(name).or_insert_with(|| format!("{file}: {expr}"));
            }
        }
    }
    let missing: Vec<String> = used
        .iter()
        .filter(|(name, _)| !available.contains(*name))
        .map(|(name, expr)| format!("{name} (in {expr})"))
        .collect();
    assert!(missing.is_empty(), "metrics used but not exported:\n{}", missing.join("\n"));
    for name in used.keys() {
        assert!(name.starts_with("meridian_") || name.starts_with("meridian:"), "{name} is not a Meridian metric");
    }
}

/// Runs `promtool` with `args`, panicking with its output when it fails. `promtool` comes with
/// Debian's `prometheus` package (`apt-get install --no-install-recommends prometheus`).
fn promtool(args: &[&str]) {
    let output = std::process::Command::new("promtool").args(args).output().unwrap_or_else(|e| {
        panic!(
            "promtool is needed to check the PromQL of the dashboard and rules ({e}); install Debian's \
             `prometheus` package (apt-get install -y --no-install-recommends prometheus)"
        )
    });
    assert!(
        output.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_dashboard_and_rules_are_valid_promql_and_the_alerts_fire_as_their_unit_tests_say() {
    promtool(&["check", "rules", repo_file("deploy/prometheus/rules.yaml").to_str().unwrap()]);
    promtool(&["test", "rules", repo_file("deploy/prometheus/rules.test.yaml").to_str().unwrap()]);
    // The dashboard's queries, with Grafana's variables filled in, checked as recording rules.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file("deploy/grafana/meridian.json")).unwrap()).unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in dashboard_queries(&dashboard).iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "1m")
            .replace("$__range", "6h")
            .replace("$cluster", ".*")
            .replace("$tenant", ".*");
        assert!(!expr.contains('$'), "a Grafana variable the test does not fill in: {expr}");
        rules.push_str(&format!("      - record: dashboard:query_{i}\n        expr: {}\n", serde_json::json!(expr)));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-rules.yaml");
    std::fs::write(&file, rules).unwrap();
    promtool(&["check", "rules", file.to_str().unwrap()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_auth_metrics_need_the_scrape_token_or_an_admin() {
    const SCRAPE: &str = "scrape-token-0123456789";
    const ROOT: &str = "root-token-admin-000001";
    const ALICE: &str = "alice-token-vision-0001";
    let dir = tempfile::tempdir().unwrap();
    let digest = |token: &str| -> String {
        ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    std::fs::write(
        dir.path().join("tokens.yaml"),
        format!(
            "tokens:\n- {{subject: root, role: admin, sha256: {}}}\n\
             - {{subject: alice, role: member, tenants: [vision], sha256: {}}}\n",
            digest(ROOT),
            digest(ALICE)
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("scrape-token"), format!("{SCRAPE}\n")).unwrap();
    let config = format!(
        "{GATEWAY_CONFIG}auth: {{tokensFile: {}}}\nmetrics: {{tokenFile: {}}}\n",
        dir.path().join("tokens.yaml").display(),
        dir.path().join("scrape-token").display()
    );
    let gateway = Gateway::start(dir.path(), &config).await.unwrap();
    let (status, _, body) = scrape(gateway.rest, None).await;
    assert_eq!(status, 401, "{body}");
    let (status, _, body) = scrape(gateway.rest, Some("not-the-token")).await;
    assert_eq!(status, 401, "{body}");
    let (status, _, body) = scrape(gateway.rest, Some(ALICE)).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("role admin"), "{body}");
    for token in [SCRAPE, ROOT] {
        let (status, _, body) = scrape(gateway.rest, Some(token)).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("meridian_cluster_gpus"), "{body}");
    }
    // The scrape token opens nothing else.
    let api = gateway.client().with_token(Some(SCRAPE.to_string()));
    let refused = api.list(None, None, None).await.unwrap_err();
    assert_eq!(refused.status(), Some(401), "{refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start(dir.path(), &format!("{GATEWAY_CONFIG}metrics: {{access: 'off'}}\n")).await.unwrap();
    let (status, _, body) = scrape(gateway.rest, None).await;
    assert_eq!(status, 404, "{body}");
}
