//! [`EtcdStore`]: the [`Store`] on etcd, one transaction per commit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

use super::election::{Election, ElectionConfigError};
use super::shared::{Shared, until_sent};
use super::{EtcdConfig, Guard};
use crate::error::{Error, Result};
use crate::{BoxFuture, Limits, Store, Write};

/// A [`Store`] on an etcd cluster: every key lives under [`EtcdConfig::prefix`].
///
/// A commit is one etcd transaction (so a batch is all or nothing, and at most
/// [`Store::limits`]); a scan reads page by page at one revision. Clones share the connection and
/// the failure state; [`EtcdStore::with_guard`] makes a handle with its own.
///
/// A commit that fails for any reason but [`Error::TooLarge`] fails the handle: it may still be
/// applied by etcd later (a timed-out request is not withdrawn), so nothing more is written
/// through it, and later commits and scans return [`Error::Failed`] naming the first cause.
#[derive(Clone)]
pub struct EtcdStore {
    shared: Arc<Shared>,
    guard: Option<Guard>,
    failure: Arc<Mutex<Option<String>>>,
}

impl EtcdStore {
    /// Connects to etcd and checks that it answers: a linearizable read under the prefix, which
    /// needs a quorum (etcd-client's own connect succeeds with nothing listening).
    ///
    /// Errors: [`Error::Etcd`] naming the endpoints when the configuration is invalid or etcd does
    /// not answer within `dial_timeout + request_timeout`; [`Error::Io`] naming the file when a TLS
    /// or password file cannot be read.
    pub async fn connect(config: EtcdConfig) -> Result<EtcdStore> {
        let endpoints = config.endpoints_text();
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(Error::Etcd { endpoints, detail: format!("invalid configuration: {}", problems.join("; ")) });
        }
        let options = config.connect_options()?;
        let patience = config.dial_timeout + config.request_timeout;
        // With a user, connecting already asks etcd for a token.
        let mut unsent = None;
        let connecting = until_sent(|| Client::connect(config.endpoints.clone(), Some(options.clone())), &mut unsent);
        let client = match tokio::time::timeout(patience, connecting).await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => return Err(Error::Etcd { endpoints, detail: format!("cannot connect: {error}") }),
            Err(_) => {
                let last = unsent.map(|error| format!(": {error}")).unwrap_or_default();
                return Err(Error::Etcd {
                    endpoints,
                    detail: format!("no answer within {patience:?} while connecting{last}"),
                });
            }
        };
        let shared = Arc::new(Shared::new(config, client));
        let prefix = shared.config.prefix.clone().into_bytes();
        let range = etcd_client::GetOptions::new().with_range(super::prefix_end(&prefix)).with_count_only();
        let health = shared.request_within("health check (a read under the prefix)", patience, || {
            let (mut kv, prefix, range) = (shared.kv(), prefix.clone(), range.clone());
            async move { kv.get(prefix, Some(range)).await }
        });
        if let Err(error) = health.await {
            let detail = match error {
                Error::Etcd { detail, .. } => detail,
                other => other.to_string(),
            };
            return Err(shared.error(format!("{detail}; check that etcd runs, has a quorum, and accepts this client")));
        }
        Ok(EtcdStore { shared, guard: None, failure: Arc::new(Mutex::new(None)) })
    }

    /// A handle whose commits apply only while `guard`'s key still has its create revision
    /// (this gateway is still the leader), with its own failure state: a new leader term starts
    /// unfailed even if the previous term's handle failed.
    pub fn with_guard(&self, guard: Guard) -> EtcdStore {
        EtcdStore { shared: Arc::clone(&self.shared), guard: Some(guard), failure: Arc::new(Mutex::new(None)) }
    }

    /// The election `name` among the gateways sharing this prefix (its key is
    /// `<prefix>election/<name>`); see [`Election`] for `ttl` and `step_down_margin`.
    pub fn election(
        &self,
        name: &str,
        ttl: Duration,
        step_down_margin: Duration,
    ) -> Result<Election, ElectionConfigError> {
        Election::new(Arc::clone(&self.shared), name, ttl, step_down_margin)
    }

    /// The endpoints, for messages: `http://a:2379,http://b:2379`.
    pub fn endpoints(&self) -> String {
        self.shared.endpoints.clone()
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// [`Error::Failed`] when this handle has failed.
    pub(crate) fn check_healthy(&self) -> Result<()> {
        match &*self.lock_failure() {
            Some(cause) => Err(Error::Failed { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    fn fail(&self, cause: &Error) {
        self.lock_failure().get_or_insert_with(|| cause.to_string());
    }

    // The lock guards one Option that is replaced whole, so a poisoned lock is still consistent.
    fn lock_failure(&self) -> MutexGuard<'_, Option<String>> {
        self.failure.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn commit_now(&self, batch: Vec<Write>) -> Result<()> {
        self.check_healthy()?;
        let writes = batch.len();
        let bytes = batch.iter().map(Write::size).sum();
        let limits = self.shared.limits();
        if !limits.fits(writes, bytes) {
            return Err(Error::TooLarge {
                store: self.describe(),
                writes,
                bytes,
                max_writes: limits.max_writes,
                max_bytes: limits.max_bytes,
            });
        }
        if batch.is_empty() {
            return Ok(());
        }
        let operations = transaction_ops(&self.shared.config.data_prefix(), batch);
        let transaction = match &self.guard {
            Some(guard) => Txn::new()
                .when([Compare::create_revision(guard.key.clone(), CompareOp::Equal, guard.create_revision)])
                .and_then(operations),
            None => Txn::new().and_then(operations),
        };
        let commit = self.shared.request("commit", || {
            let (mut kv, transaction) = (self.shared.kv(), transaction.clone());
            async move { kv.txn(transaction).await }
        });
        let result = match commit.await {
            Ok(response) if response.succeeded() => return Ok(()),
            Ok(_) => {
                let key = self.guard.as_ref().map(|guard| String::from_utf8_lossy(&guard.key).into_owned());
                Error::NotLeader { key: key.unwrap_or_default() }
            }
            Err(error) => error,
        };
        self.fail(&result);
        Err(result)
    }
}

/// The transaction's operations for `batch`. etcd refuses a transaction that changes one key
/// twice, and the batch's writes apply in order, so only each key's last write is kept.
fn transaction_ops(prefix: &str, batch: Vec<Write>) -> Vec<TxnOp> {
    let mut last_write: HashMap<String, Write> = HashMap::with_capacity(batch.len());
    let mut order = Vec::with_capacity(batch.len());
    for write in batch {
        let key = write.key().to_string();
        if last_write.insert(key.clone(), write).is_none() {
            order.push(key);
        }
    }
    order
        .into_iter()
        .filter_map(|key| last_write.remove(&key))
        .map(|write| match write {
            Write::Put { key, value } => TxnOp::put(format!("{prefix}{key}"), value, None),
            Write::Delete { key } => TxnOp::delete(format!("{prefix}{key}"), None),
        })
        .collect()
}

impl Store for EtcdStore {
    fn commit(&self, batch: Vec<Write>) -> BoxFuture<'_, Result<()>> {
        Box::pin(self.commit_now(batch))
    }

    fn scan(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, Vec<u8>)>>> {
        let prefix = prefix.to_string();
        Box::pin(async move { Ok(self.snapshot(&prefix).await?.0) })
    }

    fn failure(&self) -> Option<String> {
        self.lock_failure().clone()
    }

    fn describe(&self) -> String {
        format!("etcd at {} under {}", self.shared.endpoints, self.shared.config.prefix)
    }

    /// `max_txn_ops` writes, and `max_request_bytes` less a margin for the request's framing:
    /// 1 KiB, plus per write 64 bytes and the prefix (which goes in front of every key), plus the
    /// prefix and user name once (see [`EtcdConfig`]).
    fn limits(&self) -> Limits {
        self.shared.limits()
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.shared.endpoints)
            .field("prefix", &self.shared.config.prefix)
            .field("guard", &self.guard)
            .field("failure", &self.failure())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(ops: Vec<TxnOp>) -> Vec<String> {
        ops.into_iter().map(|op| format!("{op:?}")).collect()
    }

    #[test]
    fn only_the_last_write_of_each_key_reaches_the_transaction() {
        let batch = vec![
            Write::put("c", b"c1".to_vec()),
            Write::delete("c"),
            Write::delete("d"),
            Write::put("d", b"d1".to_vec()),
            Write::put("e", b"e1".to_vec()),
            Write::put("d", b"d2".to_vec()),
        ];
        let expected = vec![
            TxnOp::delete("/p/c", None),
            TxnOp::put("/p/d", b"d2".to_vec(), None),
            TxnOp::put("/p/e", b"e1".to_vec(), None),
        ];
        assert_eq!(described(transaction_ops("/p/", batch)), described(expected));
    }
}
