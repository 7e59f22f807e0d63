//! Secrets at rest: every value the gateway stores is encrypted ("sealed") before it reaches the
//! store, so the redb file, etcd's data directory and their backups never hold a job's
//! `payload.secretEnv` values in plain text.
//!
//! [`KeyRing`] holds the keys (read from a key file, see [`KeyRing::load`]) and seals and opens
//! single values; [`SealedStore`] wraps any [`Store`] and seals every value it commits and opens
//! every value it scans. Keys (`jobs/…`) stay in plain text: stores order and scan by them.
//!
//! # The sealed format
//!
//! ```text
//! "\0MRS1" | id length (1 byte) | key id (1..=32 bytes) | nonce (12 bytes) | ciphertext | tag (16 bytes)
//! ```
//!
//! The cipher is ChaCha20-Poly1305 (`ring`), with a random nonce per value and the store *key* as
//! associated data, so a value copied under another key does not open. A value that does not start
//! with a NUL byte is a record written before sealing existed (the gateway's records are JSON, and
//! JSON never starts with NUL): it is returned as it is, and [`KeyRing::needs_reseal`] says it
//! should be rewritten.
//!
//! ```
//! use std::sync::Arc;
//! use meridian_store::{KeyRing, MemoryStore, SealedStore, Store, Write};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> meridian_store::Result<()> {
//! let ring = Arc::new(KeyRing::from_keys(vec![("k1".to_string(), [7; 32])])?);
//! let store = SealedStore::new(MemoryStore::new(), ring);
//! store.commit(vec![Write::put("jobs/1", b"{\"token\":\"s3cr3t\"}".to_vec())]).await?;
//! // The inner store holds ciphertext; the sealed store hands the plain value back.
//! assert_ne!(store.inner().scan("jobs/").await?[0].1, b"{\"token\":\"s3cr3t\"}");
//! assert_eq!(store.scan("jobs/").await?[0].1, b"{\"token\":\"s3cr3t\"}");
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::sync::Arc;

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, MAX_TAG_LEN, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use crate::error::{Error, Result};
use crate::{BoxFuture, Limits, Store, Write};

mod key_file;
#[cfg(test)]
mod tests;

/// The start of every sealed value: a NUL (which no JSON record starts with), "MRS" (Meridian
/// sealed) and the format version.
const MAGIC: &[u8] = b"\0MRS1";

/// The longest key id, in bytes.
const MAX_ID_LEN: usize = 32;

/// The Poly1305 tag's length.
const TAG_LEN: usize = MAX_TAG_LEN;

/// The keys that seal and open stored values: the first (primary) key seals new values, every
/// key opens the values it sealed.
///
/// Its `Debug` form shows the key ids only, never key bytes.
pub struct KeyRing {
    primary: RingKey,
    /// The other keys, in key-file order: they only open values sealed before a rotation.
    older: Vec<RingKey>,
    random: SystemRandom,
}

/// A [`Store`] that seals every value before the inner store sees it and opens every value it
/// scans: the inner store (a redb file, etcd) only ever holds ciphertext.
///
/// Wrap the concrete store, then erase the type if needed:
/// `Arc::new(SealedStore::new(redb, keys)) as Arc<dyn Store>`.
pub struct SealedStore<S> {
    inner: S,
    ring: Arc<KeyRing>,
}

/// One key of a [`KeyRing`].
struct RingKey {
    id: String,
    aead: LessSafeKey,
}

/// The parts of a sealed value.
struct SealedParts<'a> {
    key_id: &'a str,
    nonce: [u8; NONCE_LEN],
    /// Ciphertext followed by the tag.
    ciphertext: &'a [u8],
}

impl KeyRing {
    /// The most bytes sealing adds to a value: the magic prefix (5), the id length (1), the
    /// longest key id (32), the nonce (12) and the tag (16), 66 in all. A value sealed with a
    /// shorter key id grows by less.
    pub const OVERHEAD: usize = MAGIC.len() + 1 + MAX_ID_LEN + NONCE_LEN + TAG_LEN;

    /// A ring of `keys` (id, key bytes); the first is the primary key. For tests and benchmarks;
    /// the gateway reads its keys from a file ([`KeyRing::load`]).
    ///
    /// Fails when `keys` is empty, an id is not valid (1 to 32 characters of `a-z`, `0-9` and
    /// `-`, not starting with `-`) or an id appears twice.
    pub fn from_keys(keys: Vec<(String, [u8; 32])>) -> Result<KeyRing> {
        let count = keys.len();
        let mut ring: Vec<RingKey> = Vec::with_capacity(count);
        for (index, (id, bytes)) in keys.into_iter().enumerate() {
            // The id is not repeated: a caller that mixed up id and key would see key material.
            if let Err(problem) = check_key_id(&id) {
                return Err(sealing(format!("the id of key {} of {count} is not valid: {problem}", index + 1)));
            }
            if ring.iter().any(|known| known.id == id) {
                return Err(sealing(format!("key id {id} appears twice; key ids must be unique")));
            }
            ring.push(RingKey::new(id, &bytes)?);
        }
        let mut keys = ring.into_iter();
        let Some(primary) = keys.next() else {
            return Err(sealing("a key ring needs at least one key"));
        };
        Ok(KeyRing { primary, older: keys.collect(), random: SystemRandom::new() })
    }

    /// The id of the key that seals new values.
    pub fn primary_id(&self) -> &str {
        &self.primary.id
    }

    /// Every key id, the primary first, in key-file order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys().map(|key| key.id.as_str())
    }

    /// Seals `plaintext`, to be stored under `store_key`, with the primary key and a fresh random
    /// nonce (so sealing the same value twice gives different bytes).
    pub fn seal(&self, store_key: &str, plaintext: &[u8]) -> Result<Vec<u8>> {
        let key = &self.primary;
        let id_len = u8::try_from(key.id.len())
            .map_err(|_| sealing(format!("key id {} is longer than {MAX_ID_LEN} bytes", key.id)))?;
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| sealing("the operating system's random number generator failed; nothing was written"))?;

        let header_len = MAGIC.len() + 1 + key.id.len() + NONCE_LEN;
        let mut sealed = Vec::with_capacity(header_len + plaintext.len() + TAG_LEN);
        sealed.extend_from_slice(MAGIC);
        sealed.push(id_len);
        sealed.extend_from_slice(key.id.as_bytes());
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(plaintext);
        let tag = key
            .aead
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(store_key.as_bytes()),
                &mut sealed[header_len..],
            )
            .map_err(|_| sealing(format!("cannot seal the value of {store_key}: it is too large to encrypt")))?;
        sealed.extend_from_slice(tag.as_ref());
        Ok(sealed)
    }

    /// The plain value of `stored`, read from under `store_key`.
    ///
    /// A value written before sealing existed (one that does not start with a NUL byte) is
    /// returned as it is. A sealed value must open with the key its header names, under this
    /// `store_key`; otherwise the error names the store key and the key id, never value bytes.
    pub fn open(&self, store_key: &str, stored: &[u8]) -> Result<Vec<u8>> {
        if !looks_sealed(stored) {
            return Ok(stored.to_vec());
        }
        let parts = parse_sealed(store_key, stored)?;
        let Some(key) = self.keys().find(|key| key.id == parts.key_id) else {
            return Err(sealing(format!(
                "the value of {store_key} is sealed with key {}, which is not in the key file (it holds {}); add that key's line back to the key file",
                parts.key_id,
                self.ids().collect::<Vec<_>>().join(", ")
            )));
        };
        let mut buffer = parts.ciphertext.to_vec();
        let plain_len = key
            .aead
            .open_in_place(Nonce::assume_unique_for_key(parts.nonce), Aad::from(store_key.as_bytes()), &mut buffer)
            .map_err(|_| {
                sealing(format!(
                    "the value of {store_key} does not open with key {}: it was changed or damaged, copied from another store key, or sealed by another key with the same id",
                    key.id
                ))
            })?
            .len();
        buffer.truncate(plain_len);
        Ok(buffer)
    }

    /// Whether `stored` should be sealed again: it is plain (written before sealing existed), or
    /// sealed with a key other than the primary (after a rotation), or not readable as sealed.
    pub fn needs_reseal(&self, stored: &[u8]) -> bool {
        if !looks_sealed(stored) {
            return true;
        }
        match parse_sealed("", stored) {
            Ok(parts) => parts.key_id != self.primary_id(),
            Err(_) => true,
        }
    }

    /// Every key, the primary first.
    fn keys(&self) -> impl Iterator<Item = &RingKey> {
        std::iter::once(&self.primary).chain(&self.older)
    }
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("primary", &self.primary_id())
            .field("ids", &self.ids().collect::<Vec<_>>())
            .finish()
    }
}

impl RingKey {
    fn new(id: String, bytes: &[u8; 32]) -> Result<RingKey> {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .map_err(|_| sealing(format!("key {id} cannot be used as a ChaCha20-Poly1305 key")))?;
        Ok(RingKey { id, aead: LessSafeKey::new(unbound) })
    }
}

impl<S: Store> SealedStore<S> {
    /// Wraps `inner`: values are sealed with `keys`' primary key on commit and opened with any
    /// of its keys on scan.
    pub fn new(inner: S, keys: Arc<KeyRing>) -> SealedStore<S> {
        SealedStore { inner, ring: keys }
    }

    /// The keys this store seals and opens with.
    pub fn keys(&self) -> &Arc<KeyRing> {
        &self.ring
    }

    /// The wrapped store, which holds the sealed bytes.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Seals again, with the primary key, every stored value that [`KeyRing::needs_reseal`]:
    /// records written before sealing existed and values sealed with an older key (step 3 of a
    /// key rotation). Returns how many values it rewrote; 0 when there was nothing to do.
    ///
    /// It reads every value (`scan("")`) and writes back in batches within [`Store::limits`].
    /// Run it before anything else writes to the store (the leader runs it at start-up, once the
    /// state is loaded): a value changed between its read and its rewrite would be overwritten
    /// with the older one. A value that does not open stops it with that error; the values
    /// rewritten before it stay rewritten, and a second run carries on.
    pub async fn reseal(&self) -> Result<usize> {
        let entries = self.inner.scan("").await?;
        let limits = self.limits();
        let mut rewritten = 0;
        let mut batch = Vec::new();
        let mut batch_bytes = 0;
        for (key, stored) in entries {
            if !self.ring.needs_reseal(&stored) {
                continue;
            }
            let write = Write::put(key.as_str(), self.ring.open(&key, &stored)?);
            let size = write.size();
            if !batch.is_empty() && !limits.fits(batch.len() + 1, batch_bytes + size) {
                rewritten += batch.len();
                self.commit(std::mem::take(&mut batch)).await?;
                batch_bytes = 0;
            }
            batch_bytes += size;
            batch.push(write);
        }
        if !batch.is_empty() {
            rewritten += batch.len();
            self.commit(batch).await?;
        }
        Ok(rewritten)
    }

    fn seal_batch(&self, batch: Vec<Write>) -> Result<Vec<Write>> {
        batch
            .into_iter()
            .map(|write| match write {
                Write::Put { key, value } => {
                    let sealed = self.ring.seal(&key, &value)?;
                    Ok(Write::Put { key, value: sealed })
                }
                delete @ Write::Delete { .. } => Ok(delete),
            })
            .collect()
    }
}

impl<S: Store> Store for SealedStore<S> {
    fn commit(&self, batch: Vec<Write>) -> BoxFuture<'_, Result<()>> {
        // Checked here rather than left to the inner store: a batch within the inner store's
        // limits before sealing may not be after, and the error should give this store's limits.
        let limits = self.limits();
        let bytes = batch.iter().map(Write::size).sum::<usize>();
        if !limits.fits(batch.len(), bytes) {
            let error = Error::TooLarge {
                store: self.describe(),
                writes: batch.len(),
                bytes,
                max_writes: limits.max_writes,
                max_bytes: limits.max_bytes,
            };
            return Box::pin(async move { Err(error) });
        }
        // Sealing runs on the caller's task: ChaCha20-Poly1305 seals about a gigabyte per second,
        // small next to the fsync every commit waits for.
        match self.seal_batch(batch) {
            Ok(sealed) => self.inner.commit(sealed),
            Err(error) => Box::pin(async move { Err(error) }),
        }
    }

    fn scan(&self, prefix: &str) -> BoxFuture<'_, Result<Vec<(String, Vec<u8>)>>> {
        let scanning = self.inner.scan(prefix);
        Box::pin(async move {
            let entries = scanning.await?;
            entries
                .into_iter()
                .map(|(key, stored)| {
                    let value = self.ring.open(&key, &stored)?;
                    Ok((key, value))
                })
                .collect()
        })
    }

    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    fn describe(&self) -> String {
        format!("{}, sealed with key {}", self.inner.describe(), self.ring.primary_id())
    }

    fn limits(&self) -> Limits {
        let inner = self.inner.limits();
        sealed_limits(inner)
    }
}

impl<S: Store> fmt::Debug for SealedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealedStore").field("inner", &self.inner.describe()).field("ring", &self.ring).finish()
    }
}

/// The limits of a sealed store over a store with `inner` limits: every write may grow by
/// [`KeyRing::OVERHEAD`] bytes, so the byte limit shrinks by that much per write it allows.
fn sealed_limits(inner: Limits) -> Limits {
    if inner.max_bytes == usize::MAX {
        return inner;
    }
    let overhead = inner.max_writes.saturating_mul(KeyRing::OVERHEAD);
    Limits { max_writes: inner.max_writes, max_bytes: inner.max_bytes.saturating_sub(overhead) }
}

/// Whether `stored` claims to be sealed. Any value starting with NUL does (not only one with
/// [`MAGIC`]), so that a damaged prefix or a newer format is an error rather than bytes handed
/// on as a plain record.
fn looks_sealed(stored: &[u8]) -> bool {
    stored.first() == Some(&0)
}

/// Splits a value that [`looks_sealed`] into its parts; `store_key` only words errors.
fn parse_sealed<'a>(store_key: &str, stored: &'a [u8]) -> Result<SealedParts<'a>> {
    let Some(rest) = stored.strip_prefix(MAGIC) else {
        return Err(sealing(format!(
            "the value of {store_key} is not in the sealed format this gateway reads (\"\\0MRS1\"): it is damaged, or was written by a newer gateway"
        )));
    };
    let damaged = || sealing(format!("the value of {store_key} is sealed but its header is damaged or cut short"));
    let (&id_len, rest) = rest.split_first().ok_or_else(damaged)?;
    let id_len = usize::from(id_len);
    if id_len == 0 || id_len > MAX_ID_LEN || rest.len() < id_len + NONCE_LEN + TAG_LEN {
        return Err(damaged());
    }
    let (id_bytes, rest) = rest.split_at(id_len);
    let key_id = std::str::from_utf8(id_bytes).ok().filter(|id| check_key_id(id).is_ok()).ok_or_else(damaged)?;
    let (nonce_bytes, ciphertext) = rest.split_at(NONCE_LEN);
    let nonce = <[u8; NONCE_LEN]>::try_from(nonce_bytes).map_err(|_| damaged())?;
    Ok(SealedParts { key_id, nonce, ciphertext })
}

/// Checks a key id: 1 to 32 characters of `a-z`, `0-9` and `-`, not starting with `-`. The
/// error says what is wrong without repeating the id (a malformed line may hold key material).
fn check_key_id(id: &str) -> Result<(), &'static str> {
    const GRAMMAR: &str = "a key id is 1 to 32 characters of a-z, 0-9 and -, starting with a letter or digit";
    let Some(first) = id.bytes().next() else {
        return Err(GRAMMAR);
    };
    let allowed = |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-';
    if id.len() > MAX_ID_LEN || first == b'-' || !id.bytes().all(allowed) {
        return Err(GRAMMAR);
    }
    Ok(())
}

fn sealing(detail: impl Into<String>) -> Error {
    Error::Sealing { detail: detail.into() }
}
