//! Reading the previous release's `log.jsonl`, for a one-time import.
//!
//! That release appended one JSON object per change: `{"key":"jobs/…","value":"…"}` for a put (the
//! value as a UTF-8 string) and `{"key":"jobs/…"}` for a delete. A crash could tear the last line;
//! any other unreadable line means the file was damaged or edited, and importing around it would
//! silently resurrect or lose jobs, so it is refused.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// The old log's name inside the data directory.
pub(crate) const OLD_LOG_FILE: &str = "log.jsonl";
/// What the old log is renamed to once imported.
pub(crate) const IMPORTED_LOG_FILE: &str = "log.jsonl.imported";

#[derive(Deserialize)]
struct OldLogLine {
    key: String,
    /// Absent (or null) for a delete.
    #[serde(default)]
    value: Option<String>,
}

/// The live entries of the old log at `path`, after replaying every line in order, and the log's
/// length in bytes.
pub(crate) fn read_old_log(path: &Path) -> Result<(BTreeMap<String, Vec<u8>>, u64)> {
    let bytes = std::fs::read(path).map_err(Error::io(path))?;
    Ok((replay(path, &bytes)?, bytes.len() as u64))
}

fn replay(path: &Path, bytes: &[u8]) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut lines: Vec<&[u8]> = bytes.split(|byte| *byte == b'\n').collect();
    // A complete log ends with a newline, which leaves one empty piece after it.
    if lines.last().is_some_and(|last| last.is_empty()) {
        lines.pop();
    }
    let last_index = lines.len().saturating_sub(1);
    let mut entries = BTreeMap::new();
    for (index, line) in lines.iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<OldLogLine>(line) {
            Ok(OldLogLine { key, value: Some(value) }) => {
                entries.insert(key, value.into_bytes());
            }
            Ok(OldLogLine { key, value: None }) => {
                entries.remove(&key);
            }
            Err(error) if index == last_index => {
                tracing::warn!(
                    path = %path.display(),
                    line = index + 1,
                    %error,
                    "dropping the torn last line of the old log (the previous release crashed while writing it)"
                );
            }
            Err(error) => {
                return Err(Error::CorruptOldLog {
                    path: path.to_path_buf(),
                    line: index + 1,
                    detail: error.to_string(),
                });
            }
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay_text(text: &str) -> Result<BTreeMap<String, Vec<u8>>> {
        replay(Path::new("/data/log.jsonl"), text.as_bytes())
    }

    #[test]
    fn puts_overwrites_and_deletes_replay_in_order() {
        let entries = replay_text(concat!(
            "{\"key\":\"jobs/a\",\"value\":\"1\"}\n",
            "{\"key\":\"jobs/b\",\"value\":\"2\"}\n",
            "{\"key\":\"jobs/a\",\"value\":\"3\"}\n",
            "{\"key\":\"jobs/b\"}\n",
            "{\"key\":\"jobs/c\",\"value\":\"\u{e9}t\u{e9}\"}\n",
        ))
        .unwrap();
        let expected: BTreeMap<String, Vec<u8>> =
            [("jobs/a".to_string(), b"3".to_vec()), ("jobs/c".to_string(), "\u{e9}t\u{e9}".as_bytes().to_vec())].into();
        assert_eq!(entries, expected);
    }

    #[test]
    fn a_torn_last_line_is_dropped() {
        let entries = replay_text("{\"key\":\"jobs/a\",\"value\":\"1\"}\n{\"key\":\"jobs/b\",\"va").unwrap();
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["jobs/a"]);
    }

    #[test]
    fn a_corrupt_line_before_the_last_is_refused_naming_its_number() {
        let error =
            replay_text("{\"key\":\"jobs/a\",\"value\":\"1\"}\nnot json\n{\"key\":\"jobs/b\",\"value\":\"2\"}\n")
                .unwrap_err();
        match &error {
            Error::CorruptOldLog { line, .. } => assert_eq!(*line, 2),
            other => panic!("expected CorruptOldLog, got {other}"),
        }
        assert!(error.to_string().contains("/data/log.jsonl line 2"), "{error}");
    }

    #[test]
    fn an_empty_log_has_no_entries() {
        assert!(replay_text("").unwrap().is_empty());
    }
}
