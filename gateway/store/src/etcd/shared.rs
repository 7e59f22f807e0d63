//! [`Shared`]: one connection to etcd, and how requests on it are bounded and resent.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, GetOptions, GetResponse, KvClient, LeaseClient, WatchClient, WatchOptions, WatchStream};

use super::EtcdConfig;
use crate::Limits;
use crate::error::{Error, Result};

/// The largest response the client decodes (a scan page, a watch batch). etcd sends responses up
/// to 2 GiB (`math.MaxInt32`); tonic's default of 4 MiB would refuse a page of large values.
const MAX_RESPONSE_BYTES: usize = i32::MAX as usize;

/// How long to wait before resending a request that could not connect, at first and at most.
const RESEND_DELAY: (Duration, Duration) = (Duration::from_millis(10), Duration::from_millis(200));

/// What every handle, election and background task of one connection shares.
pub(crate) struct Shared {
    pub(crate) config: EtcdConfig,
    /// The endpoints as one string, for messages.
    pub(crate) endpoints: String,
    pub(crate) client: Client,
    kv: KvClient,
    watch: WatchClient,
    limits: Limits,
}

impl Shared {
    pub(crate) fn new(config: EtcdConfig, client: Client) -> Shared {
        Shared {
            kv: client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES),
            watch: client.watch_client().max_decoding_message_size(MAX_RESPONSE_BYTES),
            limits: config.limits(),
            endpoints: config.endpoints_text(),
            client,
            config,
        }
    }

    /// The largest batch a commit takes (see [`EtcdConfig`]).
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// An [`Error::Etcd`] naming the endpoints.
    pub(crate) fn error(&self, detail: impl Into<String>) -> Error {
        Error::Etcd { endpoints: self.endpoints.clone(), detail: detail.into() }
    }

    /// Runs one request, giving up after `request_timeout`; see [`Shared::request_within`].
    pub(crate) async fn request<T, F, Fut>(&self, what: &str, attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.request_within(what, self.config.request_timeout, attempt).await
    }

    /// Runs one request, giving up after `timeout`. An attempt that could not connect to the
    /// member it picked is sent again: it never left this process, so resending cannot apply it
    /// twice. (tonic's balancer keeps a dead member in rotation and fails the requests it routes
    /// there with "tcp connect error"; gRPC's transparent retry resends such requests the same
    /// way in etcd's Go client.)
    pub(crate) async fn request_within<T, F, Fut>(&self, what: &str, timeout: Duration, attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut unsent = None;
        let attempts = until_sent(attempt, &mut unsent);
        let answer = tokio::time::timeout(timeout, attempts).await;
        match answer {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(self.error(format!("{what}: {error}"))),
            Err(_) => Err(self.error(match unsent {
                Some(error) => format!("{what}: no member could be reached within {timeout:?}: {error}"),
                None => format!("{what}: no answer within {timeout:?}"),
            })),
        }
    }

    /// A read (linearizable unless `options` say otherwise), within `request_timeout`.
    pub(crate) async fn get(&self, what: &str, key: Vec<u8>, options: Option<GetOptions>) -> Result<GetResponse> {
        self.request(what, || {
            let (mut kv, key, options) = (self.kv(), key.clone(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    /// Opens a watch, within `request_timeout` (the watch itself then runs until dropped).
    pub(crate) async fn start_watch(&self, what: &str, key: Vec<u8>, options: WatchOptions) -> Result<WatchStream> {
        self.request(what, || {
            let (mut watch, key, options) = (self.watch(), key.clone(), options.clone());
            async move { watch.watch(key, Some(options)).await }
        })
        .await
    }

    /// Revokes a lease (which deletes the keys attached to it), within `request_timeout`.
    pub(crate) async fn revoke(&self, lease_id: i64) -> Result<()> {
        self.request("revoking the lease", || {
            let mut lease = self.lease();
            async move { lease.revoke(lease_id).await }
        })
        .await
        .map(drop)
    }

    pub(crate) fn kv(&self) -> KvClient {
        self.kv.clone()
    }

    pub(crate) fn watch(&self) -> WatchClient {
        self.watch.clone()
    }

    pub(crate) fn lease(&self) -> LeaseClient {
        self.client.lease_client()
    }

    /// The store's `key` as etcd holds it: under the data prefix (`<prefix>data/`).
    pub(crate) fn full_key(&self, key: &str) -> Vec<u8> {
        [self.config.data_prefix().as_bytes(), key.as_bytes()].concat()
    }

    /// The election `name`'s key: `<prefix>election/<name>`, beside the data.
    pub(crate) fn election_key(&self, name: &str) -> Vec<u8> {
        format!("{}election/{name}", self.config.prefix).into_bytes()
    }

    /// A key read from etcd without the configured prefix, or an error for a key that is not
    /// ours (or not UTF-8).
    pub(crate) fn strip_prefix(&self, key: &[u8]) -> Result<String> {
        let data_prefix = self.config.data_prefix();
        let prefix = data_prefix.as_bytes();
        let Some(rest) = key.strip_prefix(prefix) else {
            return Err(
                self.error(format!("etcd returned the key {:?}, outside the prefix", String::from_utf8_lossy(key)))
            );
        };
        String::from_utf8(rest.to_vec()).map_err(|_| {
            self.error(format!(
                "the key {:?} under the prefix is not UTF-8; it was not written by a gateway: remove it",
                String::from_utf8_lossy(key)
            ))
        })
    }
}

/// Runs `attempt` until it is answered or fails otherwise than by never being sent (those are
/// sent again, after a short growing delay); `unsent` holds such a failure while its resend
/// waits, for the message when the caller gives up waiting then.
pub(crate) async fn until_sent<T, F, Fut>(
    mut attempt: F,
    unsent: &mut Option<etcd_client::Error>,
) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let mut delay = RESEND_DELAY.0;
    loop {
        // Waiting on an attempt that was sent is waiting for etcd, whatever an earlier one met.
        *unsent = None;
        match attempt().await {
            Err(error) if never_sent(&error) => {
                *unsent = Some(error);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RESEND_DELAY.1);
            }
            answer => return answer,
        }
    }
}

/// Whether a request failed before it was sent to any member, so that sending it again cannot
/// apply it twice:
/// - no connection could be made (refused, or the TCP connect failed): tonic reports these as
///   `Unavailable` with hyper-util's "tcp connect error" among the causes;
/// - the connection closed while the request still waited to be written: hyper's "operation was
///   canceled" caused by "connection closed" (hyper's own pool resends these too).
///
/// Anything else (a reset or timeout after sending) may have reached etcd, so it is a failure.
/// The causes are matched by their text, so a change of wording in tonic or hyper only makes
/// such a request fail instead of being resent.
pub(crate) fn never_sent(error: &etcd_client::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = match error {
        etcd_client::Error::GRpcStatus(status) => std::error::Error::source(status),
        etcd_client::Error::TransportError(error) => Some(error),
        _ => None,
    };
    while let Some(error) = cause {
        let refused =
            error.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        let text = error.to_string();
        let closed_before_sending = text == "operation was canceled"
            && error.source().is_some_and(|source| source.to_string() == "connection closed");
        if refused || closed_before_sending || text.starts_with("tcp connect error") {
            return true;
        }
        cause = error.source();
    }
    false
}
