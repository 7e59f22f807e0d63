//! [`EtcdStore::snapshot`]: every key under a prefix, page by page, all at one revision.

use etcd_client::GetOptions;

use super::{EtcdStore, prefix_end};
use crate::error::Result;

impl EtcdStore {
    /// Every key under the configured prefix followed by `prefix` (keys returned without the
    /// configured prefix), in key order, and the etcd revision they were read at.
    ///
    /// It reads `page_size` keys per request, all at the revision of the first page, so the result
    /// is one consistent state even while others write; follow the changes after it with
    /// [`EtcdStore::follow`]. Each page must come within `request_timeout`; a page whose revision
    /// was compacted meanwhile fails (scan again). A failed handle refuses with
    /// [`Error::Failed`](crate::Error::Failed), like [`Store::scan`](crate::Store::scan).
    pub async fn snapshot(&self, prefix: &str) -> Result<(Vec<(String, Vec<u8>)>, i64)> {
        self.check_healthy()?;
        let shared = self.shared();
        let start = shared.full_key(prefix);
        let end = prefix_end(&start);
        let page_size = i64::try_from(shared.config.page_size).unwrap_or(i64::MAX);
        let mut entries = Vec::new();
        let mut next_key = start;
        // Zero asks for the newest revision; every later page reads the first page's.
        let mut revision = 0;
        loop {
            let options = GetOptions::new().with_range(end.clone()).with_limit(page_size).with_revision(revision);
            let mut page = shared.get("scan", next_key.clone(), Some(options)).await?;
            if revision == 0 {
                revision = match page.header() {
                    Some(header) => header.revision(),
                    None => return Err(shared.error("scan: etcd answered without a revision")),
                };
            }
            let more = page.more();
            let kvs = page.take_kvs();
            if let Some(last) = kvs.last() {
                // The next page starts right after the last key: the key followed by a zero byte.
                next_key = [last.key(), &[0]].concat();
            } else if more {
                return Err(shared.error("scan: etcd said there were more keys but sent none"));
            }
            for kv in kvs {
                let (key, value) = kv.into_key_value();
                entries.push((shared.strip_prefix(&key)?, value));
            }
            if !more {
                return Ok((entries, revision));
            }
        }
    }
}
