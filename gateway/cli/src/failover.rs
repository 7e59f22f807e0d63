//! Several gateways, one leader: which gateway a request goes to, and when it may go to another.
//!
//! Gateways that share a store elect one leader; the others (standbys) answer reads and refuse
//! writes with `503` and the code `not_leader` (naming the leader in the `meridian-leader` header
//! when they know it) or `no_leader` (while none is elected). A request goes first to the gateway
//! that answered last (at first, the first one given), then to the others in order:
//!
//! - a gateway that cannot be reached (nothing was sent) is passed over for the next one;
//! - a `503 not_leader`/`no_leader` is followed to the leader it names (only one reached with the
//!   same scheme), else passed over; nothing was done there, so it is safe for any request;
//! - a failure after the request was sent (a timeout, a connection reset mid-answer) is passed
//!   over only for reads: a write may have been applied, so it is reported, not repeated.
//!
//! When a pass over every gateway found no leader but some gateway said one is being elected,
//! another pass follows after its `Retry-After`, within a retry budget. When every gateway was
//! unreachable, nothing is running to elect one: the pass's errors are returned at once.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::HeaderMap;
use tokio::time::Instant;

use crate::client::{ClientError, GatewayAttempt, Result, parse_address};

/// The response header in which a standby names the leader's REST address
/// (`https://10.0.0.7:7070`).
pub const LEADER_HEADER: &str = "meridian-leader";

/// The API error codes of a gateway that is not the leader: nothing was done there.
pub const NOT_LEADER_CODES: [&str; 2] = ["not_leader", "no_leader"];

/// How long retries may go on, all passes together, by default.
pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(15);

/// The pause between passes when a gateway said no leader is elected yet but gave no
/// `Retry-After`.
const DEFAULT_PAUSE: Duration = Duration::from_millis(500);

/// The shortest pause between passes (a `Retry-After: 0` must not spin).
const MIN_PAUSE: Duration = Duration::from_millis(100);

/// One gateway's REST address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Gateway {
    /// `host:port`, as connected to and sent in the `Host` header.
    pub(crate) authority: String,
    /// Whether it is `https://`.
    pub(crate) https: bool,
}

impl Gateway {
    /// Parses one address (`host:port`, `http://...`, `https://...`).
    pub(crate) fn parse(address: &str) -> std::result::Result<Self, String> {
        let authority = parse_address(address)?;
        let https = address.trim().get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
        Ok(Self { authority, https })
    }

    fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }
}

/// The gateways a client may ask, and the one that answered last. Clones share the latter.
#[derive(Debug, Clone)]
pub(crate) struct Gateways {
    list: Arc<[Gateway]>,
    current: Arc<Mutex<Option<Gateway>>>,
}

impl Gateways {
    /// The gateways in `text`, comma-separated, in order (at least one).
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let list = text
            .split(',')
            .map(|address| {
                Gateway::parse(address)
                    .map_err(|reason| ClientError::InvalidAddress { addr: address.trim().to_owned(), reason })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { list: list.into(), current: Arc::default() })
    }

    /// How many gateways were given.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The gateway the next request goes to first.
    pub(crate) fn current(&self) -> Gateway {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner).clone();
        current.unwrap_or_else(|| self.list[0].clone())
    }

    /// `gateway` answered: later requests go there first.
    pub(crate) fn answered(&self, gateway: &Gateway) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(gateway.clone());
    }

    /// The gateway at `authority` stopped serving (a broken event stream): later requests go
    /// first to the one after it.
    pub(crate) fn skip(&self, authority: &str) {
        let next = match self.list.iter().position(|g| g.authority == authority) {
            Some(index) => self.list[(index + 1) % self.list.len()].clone(),
            None => self.list[0].clone(),
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(next);
    }

    /// One pass: the current gateway, then the others in order from the one after it.
    fn pass_order(&self) -> VecDeque<Gateway> {
        let current = self.current();
        let start = self.list.iter().position(|g| *g == current).map_or(0, |index| index + 1);
        let mut order = VecDeque::with_capacity(self.list.len() + 1);
        order.push_back(current.clone());
        order.extend(self.list[start..].iter().chain(&self.list[..start]).filter(|g| **g != current).cloned());
        order
    }
}

/// What one attempt at one gateway came to.
pub(crate) enum Outcome<T> {
    /// The gateway answered (an error status included): done.
    Answered(T),
    /// The gateway is not the leader and did nothing.
    NotLeader {
        /// The leader's address from the [`LEADER_HEADER`], if it sent one.
        leader: Option<String>,
        /// Its `Retry-After`.
        retry_after: Option<Duration>,
        /// Its answer, as an error.
        error: ClientError,
    },
    /// Nothing reached the gateway (it could not be connected to).
    NotSent(ClientError),
    /// The request was sent, then the exchange failed: it may have been acted on.
    MaybeSent(ClientError),
    /// A failure no other gateway would change (no CA for https, a request that cannot be built).
    Fatal(ClientError),
}

/// The leader and `Retry-After` of a 503 answer's headers.
pub(crate) fn not_leader_headers(headers: &HeaderMap) -> (Option<String>, Option<Duration>) {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty());
    let leader = text(LEADER_HEADER).map(str::to_owned);
    let retry_after =
        text(hyper::header::RETRY_AFTER.as_str()).and_then(|v| v.parse::<u64>().ok()).map(Duration::from_secs);
    (leader, retry_after)
}

/// Runs `attempt` against the gateways until one answers, as the module says. `idempotent`:
/// whether a request that may have been acted on can be sent again (reads). `method` and
/// `path` name the request in errors.
pub(crate) async fn run<T, F, Fut>(
    gateways: &Gateways,
    budget: Duration,
    idempotent: bool,
    request: (&str, &str),
    mut attempt: F,
) -> Result<T>
where
    F: FnMut(Gateway) -> Fut,
    Fut: Future<Output = Outcome<T>>,
{
    let started = Instant::now();
    let mut attempts: Vec<GatewayAttempt> = Vec::new();
    let mut tries = 0usize;
    let mut last_error: Option<ClientError> = None;
    loop {
        let mut queue = gateways.pass_order();
        let mut seen: HashSet<Gateway> = HashSet::new();
        // Set when a gateway said a leader is (being) elected: worth another pass.
        let mut pause: Option<Duration> = None;
        while let Some(gateway) = queue.pop_front() {
            if !seen.insert(gateway.clone()) {
                continue;
            }
            tries += 1;
            let (answer, error) = match attempt(gateway.clone()).await {
                Outcome::Answered(answer) => {
                    gateways.answered(&gateway);
                    return Ok(answer);
                }
                Outcome::Fatal(error) => return Err(error),
                Outcome::MaybeSent(error) if !idempotent => {
                    let (method, path) = request;
                    return Err(ClientError::MaybeApplied {
                        method: method.to_owned(),
                        path: path.to_owned(),
                        addr: gateway.authority,
                        source: Box::new(error),
                    });
                }
                Outcome::MaybeSent(error) | Outcome::NotSent(error) => (describe(&error), error),
                Outcome::NotLeader { leader, retry_after, error } => {
                    let wait = retry_after.unwrap_or(DEFAULT_PAUSE).max(MIN_PAUSE);
                    pause = Some(pause.map_or(wait, |p| p.min(wait)));
                    let mut answer = describe(&error);
                    match leader.as_deref().map(|leader| leader_of(leader, &gateway)) {
                        Some(Ok(leader)) if !seen.contains(&leader) => {
                            answer.push_str(&format!(" (sent on to the leader {})", leader.authority));
                            queue.push_front(leader);
                        }
                        Some(Ok(_)) | None => {}
                        Some(Err(reason)) => answer.push_str(&format!(" (not followed: {reason})")),
                    }
                    (answer, error)
                }
            };
            record(&mut attempts, &gateway.authority, answer);
            last_error = Some(error);
        }
        let Some(pause) = pause else { break };
        if started.elapsed() + pause > budget {
            break;
        }
        tokio::time::sleep(pause).await;
    }
    let last = last_error.unwrap_or_else(|| ClientError::Protocol("no gateway was tried".into()));
    if tries == 1 {
        // One gateway, asked once: its own error, worded as when there was only ever one.
        return Err(last);
    }
    Err(ClientError::NoGateway { attempts, retried_for: started.elapsed(), last: Box::new(last) })
}

/// The leader a standby named, if it may be asked: the same scheme as the standby (a TLS
/// client never downgrades to plain text, nor the reverse).
fn leader_of(leader: &str, standby: &Gateway) -> std::result::Result<Gateway, String> {
    let scheme = leader.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
    if scheme.as_deref() != Some(standby.scheme()) {
        return Err(format!("`{leader}` is not an {}:// address like the gateway that named it", standby.scheme()));
    }
    Gateway::parse(leader).map_err(|reason| format!("`{leader}`: {reason}"))
}

/// Keeps the latest answer of each gateway, in the order they were first tried.
fn record(attempts: &mut Vec<GatewayAttempt>, gateway: &str, answer: String) {
    match attempts.iter_mut().find(|a| a.gateway == gateway) {
        Some(attempt) => attempt.answer = answer,
        None => attempts.push(GatewayAttempt { gateway: gateway.to_owned(), answer }),
    }
}

/// A short account of one gateway's failure, for the list of attempts.
fn describe(error: &ClientError) -> String {
    match error {
        ClientError::Connect { source, .. } => format!("cannot connect: {source}"),
        ClientError::Timeout { after, .. } => format!("no answer within {after:?}"),
        ClientError::Tls { source, .. } => format!("TLS failed: {source}"),
        ClientError::Http { source, .. } => format!("the exchange broke off: {source}"),
        ClientError::Api { status, code, message, .. } => format!("{status} {code}: {message}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn gateways(text: &str) -> Gateways {
        Gateways::parse(text).unwrap()
    }

    fn authorities(order: VecDeque<Gateway>) -> Vec<String> {
        order.into_iter().map(|g| g.authority).collect()
    }

    #[test]
    fn a_list_is_comma_separated_and_each_entry_is_checked() {
        let list = gateways("https://gw-1:7070, gw-2:7070 ,http://gw-3");
        assert_eq!(authorities(list.pass_order()), ["gw-1:7070", "gw-2:7070", "gw-3:80"]);
        assert!(list.list[0].https && !list.list[1].https);
        let error = Gateways::parse("gw-1:7070,gw-2:99999").unwrap_err();
        assert!(error.to_string().starts_with("invalid gateway address `gw-2:99999`"), "{error}");
        assert!(Gateways::parse("gw-1:7070,").is_err(), "an empty entry is refused");
    }

    #[test]
    fn a_pass_starts_at_the_gateway_that_answered_last_and_goes_round() {
        let list = gateways("a:1,b:1,c:1");
        list.answered(&list.list[1].clone());
        assert_eq!(authorities(list.pass_order()), ["b:1", "c:1", "a:1"]);
        list.skip("b:1");
        assert_eq!(authorities(list.pass_order()), ["c:1", "a:1", "b:1"]);
        // A leader that was not in the list comes first, then the list from its start.
        list.answered(&Gateway::parse("leader:1").unwrap());
        assert_eq!(authorities(list.pass_order()), ["leader:1", "a:1", "b:1", "c:1"]);
    }

    #[test]
    fn a_leader_is_followed_only_with_the_standbys_scheme() {
        let https = Gateway::parse("https://gw-1:7070").unwrap();
        assert_eq!(leader_of("https://gw-2:7070", &https).unwrap().authority, "gw-2:7070");
        assert!(leader_of("http://gw-2:7070", &https).unwrap_err().contains("not an https://"));
        assert!(leader_of("gw-2:7070", &https).is_err());
        let http = Gateway::parse("gw-1:7070").unwrap();
        assert_eq!(leader_of("HTTP://gw-2:8080/", &http).unwrap().authority, "gw-2:8080");
    }

    #[test]
    fn retry_after_and_the_leader_come_from_the_headers() {
        let mut headers = HeaderMap::new();
        assert_eq!(not_leader_headers(&headers), (None, None));
        headers.insert(LEADER_HEADER, "http://127.0.0.1:8080".parse().unwrap());
        headers.insert(hyper::header::RETRY_AFTER, "1".parse().unwrap());
        assert_eq!(not_leader_headers(&headers), (Some("http://127.0.0.1:8080".into()), Some(Duration::from_secs(1))));
    }
}
