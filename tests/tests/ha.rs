//! The highly available gateway, end to end: three real `meridian gateway` processes on a real
//! etcd, real agents that list all three, and witness jobs (see `meridian_e2e::witness`) whose
//! own files say how many copies of each job ran and when.
//!
//! Each test injects one kind of fault while clients submit (every job with its own idempotency
//! key, sent again until acknowledged: `meridian_e2e::ha::load`), then waits until every job is
//! over and judges the outcome the same way ([`settle`]): every acknowledged job exists exactly
//! once, every job whose witness ran to its end `Succeeded`, no job ran twice or two copies at
//! once. Each prints one summary line with its figures (`--nocapture`):
//!
//! ```text
//! ha leader_kill9: kills=10 failover_ms median=.. max=.. all=[..] jobs=.. answers: 201=.. ..
//! ```
//!
//! The tests run one at a time (they share two cores, and a starved gateway loses its 2 s lease
//! for the wrong reason). `MERIDIAN_SKIP_ETCD=1` skips them, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use meridian_e2e::ha::http::exchange;
use meridian_e2e::ha::load::{Load, Tally};
use meridian_e2e::ha::{GATEWAYS, HaFederation, find_line, tail, witness_member, witness_spec};
use meridian_e2e::witness::{now_ns, relative};
use meridian_e2e::{ProxyMode, poll};
use meridian_store::testing::etcd::skip;
use serde_json::Value;

/// One test at a time (see the module documentation).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The job every client submits: the witness for this long.
const JOB_SECONDS: f64 = 1.0;
/// The jobs that run through the whole cut from etcd.
const LONG_SECONDS: f64 = 8.0;
/// The longest wait for the federation to do something on its own.
const WAIT: Duration = Duration::from_secs(30);
/// The longest wait for every job to be over once the load stopped.
const SETTLE: Duration = Duration::from_secs(90);
/// Kills of the leader in the first test.
const KILLS: usize = 10;
/// Jobs listed per page when the tests read every job back (several pages each).
const PAGE: usize = 25;

const WITNESS: &str = env!("CARGO_BIN_EXE_witness");

/// Whether the etcd tests are skipped; says so.
fn skipped(test: &str) -> bool {
    let skipped = skip();
    if skipped {
        println!("ha {test}: skipped (MERIDIAN_SKIP_ETCD=1)");
    }
    skipped
}

/// Two member clusters: `east` (cheaper, where jobs go first) and `west`.
fn two_clusters(test: &str) -> meridian_e2e::ha::HaBuilder {
    HaFederation::builder(test)
        .cluster("east", witness_member("east", 1.0, 8))
        .cluster("west", witness_member("west", 2.0, 8))
}

/// `workers` clients submitting [`JOB_SECONDS`] witness jobs, one every `pace` each.
fn start_load(federation: &HaFederation, workers: usize, pace: Duration) -> Load {
    let witnesses = federation.witnesses().to_path_buf();
    let spec = Arc::new(move |key: &str| witness_spec(WITNESS, &witnesses, "short", JOB_SECONDS, key));
    Load::start(federation.rest_addrs(), workers, pace, "load", spec)
}

/// Every job the gateway `i` lists, read [`PAGE`] at a time.
async fn all_jobs(federation: &HaFederation, i: usize) -> Option<Vec<Value>> {
    let client = federation.client(i);
    let mut jobs = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut page = client.list_page(None, None, None, PAGE, after.as_deref()).await.ok()?;
        jobs.append(page.get_mut("jobs")?.as_array_mut()?);
        match page["continue"].as_str() {
            Some(next) if !next.is_empty() => after = Some(next.to_string()),
            _ => return Some(jobs),
        }
    }
}

fn is_over(job: &Value) -> bool {
    matches!(job["state"].as_str(), Some("Succeeded" | "Failed" | "Cancelled"))
}

/// What [`settle`] found.
struct Outcome {
    /// The idempotency keys of every job listed.
    keys: BTreeSet<String>,
    jobs: usize,
    states: BTreeMap<String, usize>,
    starts: usize,
    pages: usize,
}

impl Outcome {
    fn line(&self) -> String {
        let states: Vec<String> = self.states.iter().map(|(state, n)| format!("{state}={n}")).collect();
        format!("jobs={} ({}) starts={} pages={}", self.jobs, states.join(" "), self.starts, self.pages)
    }
}

/// After the load stopped: waits until every job is over, then checks what every HA test
/// promises. Panics with the evidence when a promise is broken.
async fn settle(federation: &HaFederation, tally: &Tally) -> Outcome {
    assert!(tally.unretryable.is_empty(), "answers a client cannot retry: {:#?}", tally.unretryable);
    assert!(tally.abandoned.is_empty(), "submits never acknowledged: {:?}\n{}", tally.abandoned, tally.summary());
    let (leader, _) = federation.leader().await.unwrap();
    let settled = poll(SETTLE, || async {
        let jobs = all_jobs(federation, leader).await?;
        jobs.iter().all(is_over).then_some(jobs)
    })
    .await;
    let jobs = match settled {
        Ok(jobs) => jobs,
        Err(e) => {
            let jobs = all_jobs(federation, leader).await.unwrap_or_default();
            let open: Vec<String> = jobs
                .iter()
                .filter(|job| !is_over(job))
                .map(|job| format!("{} {} {}", job["id"], job["state"], job["cluster"]))
                .take(20)
                .collect();
            panic!("jobs were not over within {SETTLE:?}: {e}; {open:#?}\n{}", federation.logs_tail(30));
        }
    };
    let ledger = federation.ledger().unwrap();

    // Exactly once: no idempotency key twice, every acknowledged id listed under its key.
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut by_id: BTreeMap<String, &Value> = BTreeMap::new();
    for job in &jobs {
        let id = job["id"].as_str().unwrap().to_string();
        assert!(by_id.insert(id.clone(), job).is_none(), "job {id} listed twice");
        if let Some(key) = job["spec"]["idempotencyKey"].as_str() {
            by_key.entry(key.to_string()).or_default().push(id);
        }
    }
    let doubled: Vec<(&String, &Vec<String>)> = by_key.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(doubled.is_empty(), "idempotency keys with more than one job: {doubled:?}");
    for ack in &tally.acknowledged {
        let listed = by_key.get(&ack.key).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(
            listed,
            std::slice::from_ref(&ack.id),
            "acknowledged job {} (key {}) is not the one job listed under its key",
            ack.id,
            ack.key
        );
    }

    // Never twice: no two copies of a job alive at once, no job started more than once (a
    // failover shorter than lostJobTimeout places nothing again), every acknowledged job ran.
    let origin = tally.acknowledged.first().map_or(0, |ack| ack.at_ns);
    let overlaps = ledger.overlaps();
    assert!(
        overlaps.is_empty(),
        "two copies of a job alive at once: {overlaps:#?}\n{}",
        ledger.describe(&overlaps.iter().map(|o| o.job_id.as_str()).collect::<Vec<_>>(), origin)
    );
    let rerun: Vec<&str> = ledger.jobs().filter(|job| ledger.starts(job) > 1).collect();
    assert!(
        rerun.is_empty(),
        "jobs started more than once:\n{}{}",
        ledger.describe(&rerun, origin),
        evidence(federation, &rerun)
    );
    let never_ran: Vec<&str> =
        tally.acknowledged.iter().map(|ack| ack.id.as_str()).filter(|id| ledger.starts(id) == 0).collect();
    assert!(
        never_ran.is_empty(),
        "acknowledged jobs that never ran: {never_ran:?}\n{}",
        evidence(federation, &never_ran)
    );
    let strays: Vec<&str> = ledger.jobs().filter(|job| !by_id.contains_key(*job)).collect();
    assert!(strays.is_empty(), "copies of jobs no gateway lists: {strays:?}");

    // Every job whose witness ran to its end succeeded.
    let full = Duration::from_secs_f64(JOB_SECONDS) - Duration::from_millis(50);
    let wrong: Vec<String> = ledger
        .all()
        .filter(|copy| copy.lived() >= full)
        .filter_map(|copy| {
            let state = by_id.get(&copy.job_id)?["state"].as_str().unwrap_or("?");
            (state != "Succeeded")
                .then(|| format!("{} ran {:.3}s but is {state}", copy.job_id, copy.lived().as_secs_f64()))
        })
        .collect();
    assert!(wrong.is_empty(), "jobs that ran to the end but did not succeed: {wrong:#?}");

    let mut states = BTreeMap::new();
    for job in &jobs {
        *states.entry(job["state"].as_str().unwrap_or("?").to_string()).or_insert(0) += 1;
    }
    Outcome {
        keys: by_key.into_keys().collect(),
        jobs: jobs.len(),
        states,
        starts: ledger.total_starts(),
        pages: jobs.len().div_ceil(PAGE),
    }
}

/// The log lines of every gateway start and agent that name one of `ids` (the last 30 per
/// process).
fn evidence(federation: &HaFederation, ids: &[&str]) -> String {
    let mut text = String::new();
    let mut logs: Vec<(String, String)> =
        (0..GATEWAYS).map(|i| (federation.gateway(i).name.clone(), federation.gateway(i).log())).collect();
    logs.extend(federation.clusters().into_iter().map(|name| {
        let log = federation.agent_log(&name);
        (name, log)
    }));
    for (name, log) in logs {
        let lines: Vec<&str> =
            log.lines().filter(|line| line.starts_with("===") || ids.iter().any(|id| line.contains(id))).collect();
        text.push_str(&format!("--- {name}\n{}\n", lines[lines.len().saturating_sub(30)..].join("\n")));
    }
    text
}

/// Waits until the current log of gateway `i` has a line with every one of `needles` stamped
/// at or after `after_ns`, and returns its time.
async fn wait_line(federation: &HaFederation, i: usize, needles: &[&str], after_ns: u64) -> u64 {
    let found = poll(WAIT, || async {
        let log = federation.gateway(i).current_log();
        find_line(&log, needles, after_ns).map(|(at, _)| at)
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "{} never logged {needles:?} after {}:\n{}",
            federation.gateway(i).name,
            relative(after_ns, 0),
            tail(&federation.gateway(i).current_log(), 40)
        )
    })
}

/// The first offer a new leader made after it started leading at or after `since_ns`: its
/// "leading" line and its first "offered" line.
async fn first_offer(federation: &HaFederation, leader: usize, since_ns: u64) -> (u64, u64) {
    let leading = wait_line(federation, leader, &[LEADING], since_ns).await;
    let offered = wait_line(federation, leader, &[OFFERED], leading).await;
    (leading, offered)
}

/// A leader's line once it has loaded the state and serves.
const LEADING: &str = "ha: leading";
/// The core's line for each offer it makes.
const OFFERED: &str = "offered job=";
/// What an agent logs when it refuses a message from a deposed leader.
const OLDER_EPOCH: &str = "older epoch";

fn ms(ns: u64) -> u64 {
    ns / 1_000_000
}

/// The lines of every agent that say it refused a deposed leader's message.
fn older_epoch_refusals(federation: &HaFederation) -> Vec<String> {
    federation
        .clusters()
        .iter()
        .flat_map(|name| {
            federation.agent_log(name).lines().filter(|l| l.contains(OLDER_EPOCH)).map(String::from).collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill9_under_submit_load_ten_times() {
    let _serial = SERIAL.lock().await;
    if skipped("leader_kill9") {
        return;
    }
    meridian_e2e::binaries();
    let started = std::time::Instant::now();
    let mut federation = two_clusters("leader-kill9").start().await.unwrap();
    let load = start_load(&federation, 2, Duration::from_millis(150));
    load.wait_acks(5, 0, WAIT).await.unwrap();
    let mut failovers = Vec::new();
    for kill in 0..KILLS {
        let (old, old_epoch) = federation.leader().await.unwrap();
        federation.wait_clusters(old).await.unwrap();
        for i in (0..GATEWAYS).filter(|i| *i != old) {
            federation.wait_standby(i).await.unwrap();
        }
        // Submits in flight and jobs running at every kill.
        load.wait_acks(2, now_ns(), WAIT).await.unwrap();
        let kill_ns = now_ns();
        federation.kill9(old);
        let (new, epoch) = federation.new_leader(old).await.unwrap();
        assert!(epoch > old_epoch, "kill {kill}: the new leader's epoch {epoch} is not above {old_epoch}");
        let (_, offered) = first_offer(&federation, new, kill_ns).await;
        failovers.push(ms(offered.saturating_sub(kill_ns)));
        federation.restart(old).await.unwrap();
        federation.wait_standby(old).await.unwrap();
    }
    let tally = load.stop().await;
    let outcome = settle(&federation, &tally).await;
    let refusals = older_epoch_refusals(&federation);
    assert!(refusals.is_empty(), "agents refused messages of deposed leaders: {refusals:#?}");

    let mut sorted = failovers.clone();
    sorted.sort_unstable();
    let median = (sorted[(sorted.len() - 1) / 2] + sorted[sorted.len() / 2]) / 2;
    let max = sorted.last().copied().unwrap_or(0);
    println!(
        "ha leader_kill9: kills={KILLS} failover_ms median={median} max={max} all={failovers:?} acknowledged={} {} \
         answers: {} runtime_s={:.0}",
        tally.acknowledged.len(),
        outcome.line(),
        tally.summary(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "failover (leader kill -9 -> first offer by the new leader), {KILLS} kills: median {median} ms, max {max} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_cut_from_etcd_stops_before_the_new_leaders_first_offer() {
    let _serial = SERIAL.lock().await;
    if skipped("leader_cut_from_etcd") {
        return;
    }
    meridian_e2e::binaries();
    let started = std::time::Instant::now();
    let federation = two_clusters("leader-cut").etcd_through_proxies().start().await.unwrap();
    let load = start_load(&federation, 1, Duration::from_millis(200));
    load.wait_acks(3, 0, WAIT).await.unwrap();
    let (old, old_epoch) = federation.leader().await.unwrap();
    federation.wait_clusters(old).await.unwrap();
    // Jobs that run through the whole cut: they must keep running, once.
    let witnesses = federation.witnesses().to_path_buf();
    let mut long = Vec::new();
    for n in 0..2 {
        let spec = witness_spec(WITNESS, &witnesses, "long", LONG_SECONDS, &format!("long-{n}"));
        let (job, created) = federation.client(old).submit(&spec).await.unwrap();
        assert!(created, "{job}");
        long.push(job["id"].as_str().unwrap().to_string());
    }
    poll(WAIT, || async {
        let ledger = federation.ledger().ok()?;
        long.iter().all(|id| ledger.starts(id) == 1).then_some(())
    })
    .await
    .unwrap();

    // Both directions, connections held open: the old leader hears nothing from etcd, its
    // agents keep their streams to it.
    let cut_ns = now_ns();
    federation.cut_from_etcd(old, ProxyMode::Blackhole).unwrap();
    let (new, epoch) = federation.new_leader(old).await.unwrap();
    assert!(epoch > old_epoch);
    let stopped = wait_line(&federation, old, &["leader term ended"], cut_ns).await;
    let lapsed =
        find_line(&federation.gateway(old).current_log(), &["leadership may have lapsed"], cut_ns).map(|(at, _)| at);
    let old_stopped = lapsed.map_or(stopped, |lapsed| lapsed.min(stopped));
    let (leading, offered) = first_offer(&federation, new, cut_ns).await;
    assert!(
        old_stopped < leading && old_stopped < offered,
        "the old leader stopped at {} but the new one led at {} and offered at {} (from the cut)\n{}",
        relative(old_stopped, cut_ns),
        relative(leading, cut_ns),
        relative(offered, cut_ns),
        federation.logs_tail(40)
    );
    // The long jobs ran on through the failover: their one copy, started before the cut, still
    // stamps after the new leader's first offer (a stamp comes every 5 ms while it runs).
    let ran_on = poll(Duration::from_secs(2), || async {
        let ledger = federation.ledger().ok()?;
        long.iter()
            .all(|id| {
                let copies = ledger.copies(id);
                copies.len() == 1 && copies[0].start_ns < cut_ns && copies[0].alive_ns > offered
            })
            .then_some(())
    })
    .await;
    if ran_on.is_err() {
        let ids: Vec<&str> = long.iter().map(String::as_str).collect();
        panic!(
            "the long jobs did not run on through the failover (offered at {}):\n{}{}",
            relative(offered, cut_ns),
            federation.ledger().unwrap().describe(&ids, cut_ns),
            evidence(&federation, &ids)
        );
    }

    // The load goes on with the new leader; the old one, healed, follows as a standby.
    load.wait_acks(5, offered, WAIT).await.unwrap();
    federation.cut_from_etcd(old, ProxyMode::Pass).unwrap();
    federation.wait_standby(old).await.unwrap();
    let tally = load.stop().await;
    let outcome = settle(&federation, &tally).await;
    let refusals = older_epoch_refusals(&federation);
    assert!(refusals.is_empty(), "agents refused messages of the deposed leader: {refusals:#?}");
    println!(
        "ha leader_cut_from_etcd: old_stopped_ms={} new_leading_ms={} new_first_offer_ms={} margin_ms={} {} \
         answers: {} runtime_s={:.0}",
        ms(old_stopped - cut_ns),
        ms(leading - cut_ns),
        ms(offered - cut_ns),
        ms(leading - old_stopped),
        outcome.line(),
        tally.summary(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_leader_sends_nothing_on_waking() {
    let _serial = SERIAL.lock().await;
    if skipped("paused_leader") {
        return;
    }
    meridian_e2e::binaries();
    let started = std::time::Instant::now();
    let federation = two_clusters("paused-leader").start().await.unwrap();
    let load = start_load(&federation, 1, Duration::from_millis(200));
    load.wait_acks(3, 0, WAIT).await.unwrap();
    let (old, old_epoch) = federation.leader().await.unwrap();
    federation.wait_clusters(old).await.unwrap();

    // Paused past its lease and a new leader's election: the agents still hold their streams
    // to it (nothing told them), and their heartbeats wait in its sockets.
    let stop_ns = now_ns();
    federation.sigstop(old).unwrap();
    let (new, epoch) = federation.new_leader(old).await.unwrap();
    assert!(epoch > old_epoch);
    wait_line(&federation, new, &[LEADING], stop_ns).await;
    let cont_ns = now_ns();
    federation.sigcont(old).unwrap();

    // On waking its lease is long gone: its term ends without a word to anyone.
    let ended = wait_line(&federation, old, &["leader term ended"], cont_ns).await;
    let line =
        find_line(&federation.gateway(old).current_log(), &["leader term ended"], cont_ns).unwrap().1.to_string();
    assert!(line.contains("LostLeadership"), "the woken leader's term ended for another reason: {line}");
    federation.wait_standby(old).await.unwrap();
    // The agents find the new leader; every job they start from now on is the new leader's.
    federation.wait_clusters(new).await.unwrap();
    load.wait_acks(5, cont_ns, WAIT).await.unwrap();
    let refusals = older_epoch_refusals(&federation);
    assert!(refusals.is_empty(), "agents refused messages of the woken leader: {refusals:#?}");
    for cluster in federation.clusters() {
        let log = federation.agent_log(&cluster);
        let welcome =
            find_line(&log, &["welcomed by the gateway", &format!("epoch={epoch}")], stop_ns).map(|(at, _)| at);
        let started_before = find_line(&log, &["gang started"], cont_ns)
            .filter(|(at, _)| welcome.is_none_or(|welcome| *at < welcome))
            .map(|(_, line)| line.to_string());
        assert!(
            started_before.is_none(),
            "{cluster} started a job after the old leader woke, before the new leader welcomed it: \
             {started_before:?}\n{}",
            tail(&log, 30)
        );
    }

    let tally = load.stop().await;
    let outcome = settle(&federation, &tally).await;
    println!(
        "ha paused_leader: paused_ms={} term_ended_after_waking_ms={} older_epoch_refusals=0 {} answers: {} \
         runtime_s={:.0}",
        ms(cont_ns - stop_ns),
        ms(ended.saturating_sub(cont_ns)),
        outcome.line(),
        tally.summary(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_member_faults() {
    let _serial = SERIAL.lock().await;
    if skipped("etcd_member_faults") {
        return;
    }
    meridian_e2e::binaries();
    let started = std::time::Instant::now();
    let mut federation = HaFederation::builder("etcd-faults")
        .private_etcd()
        .cluster("east", witness_member("east", 1.0, 8))
        .start()
        .await
        .unwrap();
    let load = start_load(&federation, 1, Duration::from_millis(250));
    load.wait_acks(3, 0, WAIT).await.unwrap();

    // One member down: a quorum remains; clients see at most retries.
    let one_ns = now_ns();
    federation.etcd().unwrap().kill(0);
    load.wait_acks(10, one_ns, Duration::from_secs(60)).await.unwrap();
    let one_down = load.tally();
    assert!(one_down.unretryable.is_empty(), "with one member down: {:#?}", one_down.unretryable);
    let retried_one_down = one_down.retried();

    // A job every gateway's view holds (standbys follow the store a moment behind the leader,
    // and one cut off mid-watch by the quorum loss keeps the view it had).
    let known = load.tally().acknowledged.last().cloned().unwrap();
    poll(WAIT, || async {
        for i in 0..GATEWAYS {
            federation.client(i).get(&known.id).await.ok()?;
        }
        Some(())
    })
    .await
    .unwrap_or_else(|_| panic!("not every gateway shows {} with a quorum:\n{}", known.id, federation.logs_tail(20)));

    // Two down: no quorum. No gateway may lead; writes answer 503 with Retry-After on every
    // gateway, reads answer from each one's view.
    let (leader, _) = federation.leader().await.unwrap();
    let witnesses = federation.witnesses().to_path_buf();
    let probe = |name: &str| witness_spec(WITNESS, &witnesses, name, JOB_SECONDS, &format!("probe-{name}"));
    let two_ns = now_ns();
    federation.etcd().unwrap().kill(1);
    // A write the leader takes within its last lease: its commit finds no quorum.
    let spec = probe("in-flight");
    let in_flight = exchange(
        federation.gateway(leader).rest,
        "POST",
        "/v1/jobs",
        Some(("application/yaml", spec.as_bytes())),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(in_flight.status, 503, "a write to the leader as the quorum went: {in_flight:?} {}", in_flight.json());
    assert!(
        in_flight.header("retry-after").is_some(),
        "503 without Retry-After from the leader as the quorum went: {:?} {}",
        in_flight.headers,
        in_flight.json()
    );
    poll(WAIT, || async {
        let mut standbys = 0;
        for i in 0..GATEWAYS {
            if federation.readyz(i).await?["role"] == "standby" {
                standbys += 1;
            }
        }
        (standbys == GATEWAYS).then_some(())
    })
    .await
    .unwrap_or_else(|_| panic!("a gateway still leads without an etcd quorum:\n{}", federation.logs_tail(30)));
    let no_quorum_ns = now_ns();
    // How many gateways show the last job acknowledged before the quorum went (for the record).
    let last = load.tally().acknowledged.last().cloned().unwrap();
    let mut last_visible = 0;
    for i in 0..GATEWAYS {
        if federation.client(i).get(&last.id).await.is_ok() {
            last_visible += 1;
        }
    }
    for i in 0..GATEWAYS {
        let rest = federation.gateway(i).rest;
        let spec = probe(&format!("no-quorum-{i}"));
        let answer =
            exchange(rest, "POST", "/v1/jobs", Some(("application/yaml", spec.as_bytes())), Duration::from_secs(10))
                .await
                .unwrap();
        assert_eq!(answer.status, 503, "a write to gw index {i} without quorum: {answer:?}");
        assert!(answer.header("retry-after").is_some(), "503 without Retry-After from gw index {i}: {answer:?}");
        let list = exchange(rest, "GET", "/v1/jobs?limit=50", None, Duration::from_secs(5)).await.unwrap();
        assert_eq!(list.status, 200, "listing on gw index {i} without quorum: {list:?}");
        assert!(!list.json()["jobs"].as_array().unwrap().is_empty(), "gw index {i} lists no jobs");
        let one = exchange(rest, "GET", &format!("/v1/jobs/{}", known.id), None, Duration::from_secs(5)).await.unwrap();
        assert_eq!(one.status, 200, "reading {} on gw index {i} without quorum: {one:?}", known.id);
        assert_eq!(one.json()["id"], known.id.as_str());
    }

    // Quorum back: a leader again, and nothing acknowledged before is lost.
    let back_ns = now_ns();
    {
        let etcd = federation.etcd().unwrap();
        etcd.start_again(0);
        etcd.start_again(1);
        etcd.wait_healthy(0).await;
        etcd.wait_healthy(1).await;
    }
    let (leader, _) = federation.leader().await.unwrap();
    let led_ns = now_ns();
    federation.wait_clusters(leader).await.unwrap();
    load.wait_acks(5, led_ns, Duration::from_secs(60)).await.unwrap();
    let tally = load.stop().await;
    assert!(
        tally.unavailable_without_retry_after.is_empty(),
        "503 answers without Retry-After: {:#?}",
        tally.unavailable_without_retry_after
    );
    let outcome = settle(&federation, &tally).await;
    // The in-flight write is answered 503 ("nothing was changed"), yet its transaction may wait
    // in the raft log of the member left alone and apply once the quorum is back: a commit that
    // timed out has an unknown outcome. Recorded here, not asserted, until the answer says so.
    let in_flight_applied = outcome.keys.contains("probe-in-flight");
    println!(
        "ha etcd_member_faults: one_down acks={} retried={retried_one_down}; no_quorum after_ms={} in_flight={} \
         in_flight_applied_later={in_flight_applied} writes=503+Retry-After on {GATEWAYS}/{GATEWAYS} reads=200 \
         last_ack_visible={last_visible}/{GATEWAYS}; quorum_back leader_after_ms={} acknowledged={} {} answers: {} \
         runtime_s={:.0}",
        one_down.acks_since(one_ns),
        ms(no_quorum_ns - two_ns),
        in_flight.code().unwrap_or_default(),
        ms(led_ns - back_ns),
        tally.acknowledged.len(),
        outcome.line(),
        tally.summary(),
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_under_load() {
    let _serial = SERIAL.lock().await;
    if skipped("rolling_restart") {
        return;
    }
    meridian_e2e::binaries();
    let started = std::time::Instant::now();
    let mut federation = two_clusters("rolling-restart").start().await.unwrap();
    let load = start_load(&federation, 3, Duration::from_millis(150));
    load.wait_acks(5, 0, WAIT).await.unwrap();
    let mut roles = Vec::new();
    let mut handoffs = Vec::new();
    for i in 0..GATEWAYS {
        let (leader, _) = federation.leader().await.unwrap();
        roles.push(if leader == i { "leader" } else { "standby" });
        let term_ns = now_ns();
        federation.sigterm(i).await.unwrap();
        if leader == i {
            // A leader that stops resigns, so the next one need not wait out its lease.
            let log = federation.gateway(i).current_log();
            assert!(
                find_line(&log, &["leadership lost", "reason=resigned"], term_ns).is_some()
                    && !log.contains("leadership is still shared"),
                "{} did not resign on SIGTERM:\n{}",
                federation.gateway(i).name,
                tail(&log, 20)
            );
            let (new, _) = federation.new_leader(i).await.unwrap();
            handoffs.push(ms(wait_line(&federation, new, &[LEADING], term_ns).await.saturating_sub(term_ns)));
        }
        federation.restart(i).await.unwrap();
        let (leader, _) = federation.leader().await.unwrap();
        for j in (0..GATEWAYS).filter(|j| *j != leader) {
            federation.wait_standby(j).await.unwrap();
        }
        federation.wait_clusters(leader).await.unwrap();
        load.wait_acks(5, now_ns(), WAIT).await.unwrap();
    }
    let tally = load.stop().await;
    let not_answers: BTreeSet<&str> = ["broken", "timeout"].into_iter().collect();
    let broken: usize =
        tally.answers.iter().filter(|(kind, _)| not_answers.contains(kind.as_str())).map(|(_, n)| n).sum();
    assert_eq!(broken, 0, "requests cut off or unanswered during a graceful restart: {}", tally.summary());
    let outcome = settle(&federation, &tally).await;
    println!(
        "ha rolling_restart: restarted={roles:?} leader_handoff_ms={handoffs:?} acknowledged={} retried={} {} \
         answers: {} runtime_s={:.0}",
        tally.acknowledged.len(),
        tally.retried(),
        outcome.line(),
        tally.summary(),
        started.elapsed().as_secs_f64()
    );
}
