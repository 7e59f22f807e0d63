//! A submit load against several gateways, as a careful client drives it: every job carries
//! its own idempotency key and is sent again, to whichever gateway is the leader by then, until
//! a gateway acknowledges it (201, or 200 for a key it already holds). Every answer is counted
//! by kind, so a test can say what clients saw through a fault.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Result, bail};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::http::{Answer, exchange};
use crate::witness::now_ns;

/// How long one submit may take before it counts as timed out (and is sent again).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The pause between two tries of one submit. A real client would wait the `Retry-After` of a
/// 503 (1 s); the tests retry sooner so the first submit a new leader takes marks the failover
/// within a tenth of a second.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// After the load is stopped, how long a worker may still try to get its last submit
/// acknowledged before it gives up (and the key is reported as abandoned).
const FINISH_WITHIN: Duration = Duration::from_secs(60);

/// Builds the spec text of the job with a given idempotency key.
pub type SpecFor = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// One acknowledged submit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The idempotency key.
    pub key: String,
    /// The job id the gateway answered.
    pub id: String,
    /// When the acknowledgement came (Unix ns).
    pub at_ns: u64,
    /// Which gateway (index) acknowledged it.
    pub gateway: usize,
    /// How many requests the submit took.
    pub attempts: usize,
}

/// What the clients of a [`Load`] saw.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Every acknowledged submit, in the order acknowledged.
    pub acknowledged: Vec<Ack>,
    /// Answers by kind: `201`, `200`, `503 not_leader`, `refused`, `broken`, `timeout`, or the
    /// status of anything else.
    pub answers: BTreeMap<String, usize>,
    /// Answers a client cannot retry (anything but success, 503 or a connection failure), each
    /// described.
    pub unretryable: Vec<String>,
    /// 503 answers without `Retry-After`, each described (gateway, code, when).
    pub unavailable_without_retry_after: Vec<String>,
    /// Keys whose submit was never acknowledged by the time the load stopped.
    pub abandoned: Vec<String>,
}

impl Tally {
    /// Answers that were not a success, by kind (503s, refused, broken, timeout...).
    pub fn retried(&self) -> usize {
        self.answers.iter().filter(|(kind, _)| !matches!(kind.as_str(), "201" | "200")).map(|(_, n)| n).sum()
    }

    /// Acknowledgements that came at or after `since_ns`.
    pub fn acks_since(&self, since_ns: u64) -> usize {
        self.acknowledged.iter().filter(|ack| ack.at_ns >= since_ns).count()
    }

    /// `201=40 503 not_leader=3 refused=2`.
    pub fn summary(&self) -> String {
        self.answers.iter().map(|(kind, n)| format!("{}={n}", kind.replace(' ', "/"))).collect::<Vec<_>>().join(" ")
    }
}

/// Clients submitting continuously until [`Load::stop`].
pub struct Load {
    stop: watch::Sender<bool>,
    workers: JoinSet<()>,
    tally: Arc<Mutex<Tally>>,
}

impl Load {
    /// Starts `workers` clients, each submitting one job at a time (the next `pace` after the
    /// last was acknowledged) to the gateways at `gateways` (REST). Keys are
    /// `<prefix>-<worker>-<n>`; `spec` makes each job's spec text.
    pub fn start(gateways: Vec<SocketAddr>, workers: usize, pace: Duration, prefix: &str, spec: SpecFor) -> Load {
        let (stop, stopped) = watch::channel(false);
        let tally = Arc::new(Mutex::new(Tally::default()));
        let mut set = JoinSet::new();
        for worker in 0..workers {
            let client = Worker {
                gateways: gateways.clone(),
                preferred: worker % gateways.len().max(1),
                tally: Arc::clone(&tally),
                stopped: stopped.clone(),
            };
            let (prefix, spec) = (format!("{prefix}-{worker}"), Arc::clone(&spec));
            set.spawn(client.run(prefix, pace, spec));
        }
        Load { stop, workers: set, tally }
    }

    /// What the clients saw so far.
    pub fn tally(&self) -> Tally {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Waits until `count` submits were acknowledged at or after `since_ns`.
    pub async fn wait_acks(&self, count: usize, since_ns: u64, timeout: Duration) -> Result<()> {
        let waited =
            crate::poll(timeout, || async { (self.tally().acks_since(since_ns) >= count).then_some(()) }).await;
        if waited.is_err() {
            let tally = self.tally();
            bail!(
                "{count} submits were not acknowledged within {timeout:?} (only {}); answers so far: {}",
                tally.acks_since(since_ns),
                tally.summary()
            );
        }
        Ok(())
    }

    /// Stops submitting new jobs, lets every client finish the submit it is trying (within a
    /// minute), and returns what they saw.
    pub async fn stop(mut self) -> Tally {
        self.stop.send_replace(true);
        while self.workers.join_next().await.is_some() {}
        self.tally()
    }
}

/// One client.
struct Worker {
    gateways: Vec<SocketAddr>,
    /// The gateway tried first: the last that acknowledged, or the leader a standby named.
    preferred: usize,
    tally: Arc<Mutex<Tally>>,
    stopped: watch::Receiver<bool>,
}

impl Worker {
    async fn run(mut self, prefix: String, pace: Duration, spec: SpecFor) {
        let mut sequence = 0usize;
        while !*self.stopped.borrow() {
            let key = format!("{prefix}-{sequence}");
            sequence += 1;
            let text = spec(&key);
            self.submit(&key, &text).await;
            tokio::select! {
                () = tokio::time::sleep(pace) => {}
                _ = self.stopped.wait_for(|stop| *stop) => {}
            }
        }
    }

    /// Sends one job until it is acknowledged (or cannot be: an unretryable answer, or the
    /// load stopped more than [`FINISH_WITHIN`] ago).
    async fn submit(&mut self, key: &str, text: &str) {
        let mut attempts = 0;
        let mut stop_seen: Option<tokio::time::Instant> = None;
        loop {
            attempts += 1;
            let gateway = self.preferred;
            let addr = self.gateways[gateway];
            let answer =
                exchange(addr, "POST", "/v1/jobs", Some(("application/yaml", text.as_bytes())), REQUEST_TIMEOUT).await;
            match answer {
                Ok(answer) if answer.status == 201 || answer.status == 200 => {
                    let id = answer.json()["id"].as_str().unwrap_or_default().to_string();
                    let ack = Ack { key: key.to_string(), id, at_ns: now_ns(), gateway, attempts };
                    self.record(&answer.status.to_string(), |tally| tally.acknowledged.push(ack));
                    return;
                }
                Ok(answer) if answer.status == 503 => {
                    let code = answer.code().unwrap_or_else(|| "?".to_string());
                    let without = answer.header("retry-after").is_none().then(|| {
                        format!("gw index {gateway} ({addr}) answered 503 {code} without Retry-After at {}", now_ns())
                    });
                    self.record(&format!("503 {code}"), |tally| tally.unavailable_without_retry_after.extend(without));
                    self.preferred = self.named_leader(&answer).unwrap_or((gateway + 1) % self.gateways.len());
                }
                Ok(answer) => {
                    let text = String::from_utf8_lossy(&answer.body).chars().take(300).collect::<String>();
                    let what = format!("{key} at gw index {gateway} ({addr}): {} {text}", answer.status);
                    self.record(&answer.status.to_string(), |tally| {
                        tally.unretryable.push(what);
                        tally.abandoned.push(key.to_string());
                    });
                    return;
                }
                Err(failure) => {
                    self.record(failure.class(), |_| {});
                    self.preferred = (gateway + 1) % self.gateways.len();
                }
            }
            if *self.stopped.borrow() {
                let since = *stop_seen.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() > FINISH_WITHIN {
                    self.record("abandoned", |tally| tally.abandoned.push(key.to_string()));
                    return;
                }
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// The index of the gateway a standby's `meridian-leader` header names.
    fn named_leader(&self, answer: &Answer) -> Option<usize> {
        let leader = answer.header("meridian-leader")?;
        self.gateways.iter().position(|addr| leader.trim_end_matches('/') == format!("http://{addr}"))
    }

    fn record(&self, kind: &str, change: impl FnOnce(&mut Tally)) {
        let mut tally = self.tally.lock().unwrap_or_else(PoisonError::into_inner);
        *tally.answers.entry(kind.to_string()).or_default() += 1;
        change(&mut tally);
    }
}
