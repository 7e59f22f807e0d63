//! The key file: where a [`KeyRing`]'s keys live, how it is read, and how a fresh one is made.
//!
//! ```text
//! # comments and blank lines are ignored
//! k1767225600:<44 characters of base64>   <- primary: seals new values
//! k1735689600:<44 characters of base64>   <- older: only opens
//! ```
//!
//! Each key line is `<id>:<base64 of exactly 32 bytes>`. Errors name the file and the line and
//! never repeat what the line holds beyond a valid key id: a malformed line may be key material.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write as _};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::rand::{SecureRandom, SystemRandom};

use super::{KeyRing, check_key_id, sealing};
use crate::error::{Error, Result};

/// What a key line looks like, for error messages.
const LINE_FORMAT: &str = "`<id>:<base64 of 32 random bytes>` (make a key with `head -c 32 /dev/urandom | base64`)";

impl KeyRing {
    /// Reads the key file at `path`: lines `<id>:<base64 of exactly 32 bytes>`, `#` comments and
    /// blank lines ignored; the first key is the primary. Ids are 1 to 32 characters of `a-z`,
    /// `0-9` and `-`, not starting with `-`, and unique.
    ///
    /// On Unix a file that its group or others may read or write is refused (run
    /// `chmod 600 FILE`). Errors name the file and the line, never key material.
    pub fn load(path: &Path) -> Result<KeyRing> {
        let mut file = File::open(path).map_err(Error::io(path))?;
        // The mode is read from the open file, so it is the mode of the file that is read.
        let metadata = file.metadata().map_err(Error::io(path))?;
        check_private(path, &metadata)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(Error::io(path))?;
        let text = std::str::from_utf8(&bytes).map_err(|error| {
            let line = line_of_offset(&bytes, error.valid_up_to());
            sealing(format!("{} line {line}: is not UTF-8 text; a key line is {LINE_FORMAT}", path.display()))
        })?;
        let keys = parse_key_file(path, text)?;
        KeyRing::from_keys(keys).map_err(|error| match error {
            Error::Sealing { detail } => sealing(format!("{}: {detail}", path.display())),
            other => other,
        })
    }

    /// Loads the key file at `path`, or, when there is none, creates it with one fresh random key
    /// (id `k<unix seconds>`): the embedded store's default, so that a new gateway seals from its
    /// first write.
    ///
    /// The file is created with mode 0600 (its parent directory too, when missing), written
    /// whole to a side file first and then linked into place, so a crash leaves either no key
    /// file or a complete one, and two gateways starting at once end up with the same key.
    pub fn load_or_create(path: &Path) -> Result<KeyRing> {
        match fs::symlink_metadata(path) {
            Ok(_) => return KeyRing::load(path),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { path: path.to_path_buf(), source }),
        }
        let random = SystemRandom::new();
        let (id, key) = fresh_key(&random)?;
        if create_key_file(path, &key_file_text(&id, &key), &random)? {
            tracing::warn!(
                path = %path.display(),
                key_id = %id,
                "created a new key file for secrets at rest; keep a backup of it apart from the data: without it the stored secret values cannot be read"
            );
            KeyRing::from_keys(vec![(id, key)])
        } else {
            // Another process created it between our look and our link: use its key.
            KeyRing::load(path)
        }
    }
}

/// The keys of a key file's `text`, in file order; `path` only words errors.
fn parse_key_file(path: &Path, text: &str) -> Result<Vec<(String, [u8; 32])>> {
    let mut keys: Vec<(String, [u8; 32], usize)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let at = |problem: String| sealing(format!("{} line {number}: {problem}", path.display()));
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((id, encoded)) = line.split_once(':') else {
            return Err(at(format!("is not a key line; a key line is {LINE_FORMAT}")));
        };
        let id = id.trim();
        check_key_id(id).map_err(|problem| at(format!("the key id is not valid: {problem}")))?;
        if let Some((_, _, first)) = keys.iter().find(|(known, _, _)| known == id) {
            return Err(at(format!("key id {id} is already used on line {first}; key ids must be unique")));
        }
        // The decoder's own message names the offending character, which is key material.
        let decoded = STANDARD
            .decode(encoded.trim())
            .map_err(|_| at(format!("the key of {id} is not valid base64 (standard alphabet, with padding)")))?;
        let key = <[u8; 32]>::try_from(decoded.as_slice()).map_err(|_| {
            at(format!("the key of {id} is {} bytes long; it must be exactly 32: {LINE_FORMAT}", decoded.len()))
        })?;
        keys.push((id.to_string(), key, number));
    }
    if keys.is_empty() {
        return Err(sealing(format!("{} holds no key; add a line {LINE_FORMAT}", path.display())));
    }
    Ok(keys.into_iter().map(|(id, key, _)| (id, key)).collect())
}

/// Refuses a key file that anyone but its owner may read or write.
#[cfg(unix)]
fn check_private(path: &Path, metadata: &fs::Metadata) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(sealing(format!(
            "{} has mode {mode:04o}: users other than its owner may read or change the keys; run `chmod 600 {}`",
            path.display(),
            path.display()
        )));
    }
    Ok(())
}

/// Other systems have no Unix mode bits to check.
#[cfg(not(unix))]
fn check_private(_path: &Path, _metadata: &fs::Metadata) -> Result<()> {
    Ok(())
}

/// The 1-based line that the byte at `offset` of `bytes` is on.
fn line_of_offset(bytes: &[u8], offset: usize) -> usize {
    bytes.iter().take(offset).filter(|&&byte| byte == b'\n').count() + 1
}

/// A new key: 32 bytes from the operating system's generator, id `k<unix seconds>`.
fn fresh_key(random: &SystemRandom) -> Result<(String, [u8; 32])> {
    let mut key = [0u8; 32];
    random.fill(&mut key).map_err(|_| sealing("the operating system's random number generator failed"))?;
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_secs()).unwrap_or(0);
    Ok((format!("k{seconds}"), key))
}

/// The text of a new key file holding one key.
fn key_file_text(id: &str, key: &[u8; 32]) -> String {
    format!(
        "# Meridian: keys that seal stored values (secrets at rest); see docs/security.md#secrets-at-rest.\n\
         # One key per line, <id>:<base64 of 32 bytes>; the first seals new values, the others only open.\n\
         # Keep a backup of this file apart from the data: without it the stored secrets are lost.\n\
         {id}:{}\n",
        STANDARD.encode(key)
    )
}

/// Creates `path` holding `text`, mode 0600, unless it exists; returns whether it was created.
///
/// The text goes to a side file first, which is then hard-linked to `path`. Unlike a rename, a
/// link never replaces an existing file, so when two processes race the first key stays and
/// nothing sealed with it is lost.
fn create_key_file(path: &Path, text: &str, random: &SystemRandom) -> Result<bool> {
    let file_name = path
        .file_name()
        .ok_or_else(|| sealing(format!("the key file path {} does not name a file", path.display())))?;
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(Error::io(&dir))?;

    let mut suffix = [0u8; 8];
    random.fill(&mut suffix).map_err(|_| sealing("the operating system's random number generator failed"))?;
    let mut side_name = file_name.to_os_string();
    side_name.push(format!(".{}.tmp", u64::from_le_bytes(suffix)));
    let side_path = dir.join(side_name);

    let written = write_private(&side_path, text.as_bytes());
    let linked = written.and_then(|()| fs::hard_link(&side_path, path).map_err(|source| (path.to_path_buf(), source)));
    // Best effort: a side file left behind holds a key that seals nothing.
    let _ = fs::remove_file(&side_path);
    match linked {
        Ok(()) => {
            sync_dir(&dir)?;
            Ok(true)
        }
        Err((_, source)) if source.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err((path, source)) => Err(Error::Io { path, source }),
    }
}

/// Writes `bytes` to a new file at `path` with mode 0600 and syncs it.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), (PathBuf, io::Error)> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let write = || -> io::Result<()> {
        let mut file = options.open(path)?;
        file.write_all(bytes)?;
        file.sync_all()
    };
    write().map_err(|source| (path.to_path_buf(), source))
}

/// Makes a new entry in `dir` durable.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|handle| handle.sync_all()).map_err(Error::io(dir))
}

/// Directories cannot be opened for syncing here; the link is as durable as the system makes it.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<()> {
    Ok(())
}
