//! [`EtcdStore::follow`]: the changes after a revision, one commit at a time.

use std::sync::Arc;

use etcd_client::{EventType, WatchOptions, WatchResponse};
use tokio::sync::mpsc;

use super::shared::Shared;
use super::{Change, EtcdStore, prefix_end};
use crate::error::Result;

/// Revision batches buffered between the watch and a slow reader.
const FOLLOW_BUFFER: usize = 64;

impl EtcdStore {
    /// Every change under the configured prefix after `after_revision` (e.g. a
    /// [`snapshot`](EtcdStore::snapshot)'s revision), as they happen.
    ///
    /// Each item holds the changes of one etcd revision (one commit) in order, deletes with
    /// `value: None`. Keys under `election/` are the elections' and are reported too. When the
    /// watch cannot continue (the revision was compacted, etcd cancelled the watch, the
    /// connection broke) it yields one `Err` and ends: take a new snapshot and follow from its
    /// revision. The background task ends when the receiver is dropped.
    pub fn follow(&self, after_revision: i64) -> mpsc::Receiver<Result<Vec<Change>>> {
        let (sender, receiver) = mpsc::channel(FOLLOW_BUFFER);
        let shared = Arc::clone(self.shared());
        tokio::spawn(async move {
            tokio::select! {
                () = sender.closed() => {}
                () = forward_changes(&shared, after_revision, &sender) => {}
            }
        });
        receiver
    }
}

/// Watches the prefix and sends each revision's changes until the watch ends, then one error.
async fn forward_changes(shared: &Shared, after_revision: i64, sender: &mpsc::Sender<Result<Vec<Change>>>) {
    let error = match watch_changes(shared, after_revision, sender).await {
        Ok(()) => return,
        Err(error) => error,
    };
    // The reader may be gone already; then there is nobody to tell.
    let _ = sender.send(Err(error)).await;
}

/// Sends revision batches until the watch fails (returned) or the reader is gone (`Ok`).
async fn watch_changes(shared: &Shared, after_revision: i64, sender: &mpsc::Sender<Result<Vec<Change>>>) -> Result<()> {
    let prefix = shared.config.data_prefix().into_bytes();
    let options = WatchOptions::new().with_range(prefix_end(&prefix)).with_start_revision(after_revision + 1);
    let mut watch = shared.start_watch("follow: starting the watch", prefix, options).await?;
    loop {
        let response = match watch.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return Err(shared.error("follow: etcd closed the watch; snapshot again")),
            Err(error) => return Err(shared.error(format!("follow: the watch broke: {error}; snapshot again"))),
        };
        if response.compact_revision() > 0 {
            return Err(shared.error(format!(
                "follow: revision {} was compacted (etcd keeps history from {}); snapshot again",
                after_revision + 1,
                response.compact_revision()
            )));
        }
        if response.canceled() {
            return Err(shared
                .error(format!("follow: etcd cancelled the watch ({}); snapshot again", response.cancel_reason())));
        }
        for batch in revision_batches(shared, &response)? {
            if sender.send(Ok(batch)).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// The response's events as one list per revision, in order.
fn revision_batches(shared: &Shared, response: &WatchResponse) -> Result<Vec<Vec<Change>>> {
    let mut batches: Vec<Vec<Change>> = Vec::new();
    for event in response.events() {
        let Some(kv) = event.kv() else {
            return Err(shared.error("follow: etcd sent an event without its key"));
        };
        let change = Change {
            key: shared.strip_prefix(kv.key())?,
            value: match event.event_type() {
                EventType::Put => Some(kv.value().to_vec()),
                EventType::Delete => None,
            },
            revision: kv.mod_revision(),
        };
        match batches.last_mut() {
            Some(batch) if batch.last().is_some_and(|last| last.revision == change.revision) => batch.push(change),
            _ => batches.push(vec![change]),
        }
    }
    Ok(batches)
}
