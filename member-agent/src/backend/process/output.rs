//! Job output kept in memory: one bounded ring per job with absolute byte offsets, and a store
//! that keeps the output of the last ended jobs so `meridian logs` works after the end.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::backend::LogChunk;
use crate::backend::logs::{LogRequest, log_chunk};

/// How many ended jobs' output the store keeps, oldest dropped first.
pub const ENDED_JOBS_KEPT: usize = 256;
/// How many bytes of ended jobs' output the store keeps in all, oldest jobs dropped first, so
/// 256 jobs of 1 MiB each do not pin 256 MiB.
pub const ENDED_BYTES_KEPT: usize = 64 << 20;

/// The output of one job run: the last `capacity` bytes of everything its replicas wrote.
///
/// Shared between the supervisor (which appends) and the backend (which reads).
#[derive(Debug)]
pub struct OutputLog {
    ring: Mutex<Ring>,
}

#[derive(Debug)]
struct Ring {
    bytes: VecDeque<u8>,
    /// Absolute offset of `bytes[0]` in everything written.
    start: u64,
    capacity: usize,
    /// The job ended: nothing more will be appended.
    ended: bool,
}

/// The output logs of current and recently ended jobs, by binding (job id, fencing token).
#[derive(Debug, Default)]
pub struct LogStore {
    logs: HashMap<(String, u64), Arc<OutputLog>>,
    /// Ended bindings, oldest first; past [`ENDED_JOBS_KEPT`] the oldest is forgotten.
    ended: VecDeque<(String, u64)>,
}

impl OutputLog {
    /// An empty log that keeps at most `capacity` bytes (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self { ring: Mutex::new(Ring { bytes: VecDeque::new(), start: 0, capacity: capacity.max(1), ended: false }) }
    }

    /// Appends `data`, dropping the oldest bytes beyond the capacity.
    pub fn append(&self, data: &[u8]) {
        let mut ring = self.lock();
        if ring.ended {
            return;
        }
        ring.bytes.extend(data);
        let excess = ring.bytes.len().saturating_sub(ring.capacity);
        if excess > 0 {
            ring.bytes.drain(..excess);
            ring.start += excess as u64;
        }
    }

    /// Bytes kept now.
    pub fn kept_bytes(&self) -> usize {
        self.lock().bytes.len()
    }

    /// Marks the log complete: the job ended and every byte it wrote was appended.
    pub fn end(&self) {
        self.lock().ended = true;
    }

    /// At most `max_bytes` from absolute offset `from` (or the last `max_bytes` when None); bytes
    /// no longer kept are answered from the oldest kept byte (the window rule of
    /// [`crate::backend::logs`]).
    pub fn read(&self, from: Option<u64>, max_bytes: usize) -> LogChunk {
        let ring = self.lock();
        let end = ring.start + ring.bytes.len() as u64;
        let range = LogRequest { from, max_bytes }.range(ring.start..end);
        let index = |offset: u64| usize::try_from(offset - ring.start).unwrap_or(ring.bytes.len());
        let data: Vec<u8> = ring.bytes.range(index(range.start)..index(range.end)).copied().collect();
        log_chunk(&data, range.start, end, ring.ended)
    }

    /// The last `max_lines` lines, at most `max_bytes` long (cut at a line start where possible),
    /// for a terminal event's message.
    pub fn last_lines(&self, max_lines: usize, max_bytes: usize) -> String {
        let ring = self.lock();
        let take = ring.bytes.len().min(max_bytes);
        let tail: Vec<u8> = ring.bytes.iter().skip(ring.bytes.len() - take).copied().collect();
        let text = String::from_utf8_lossy(&tail);
        let text = text.trim_end_matches('\n');
        let mut lines: Vec<&str> = text.split('\n').collect();
        // A cut in the middle of the first line leaves half a line: drop it unless it is all.
        if take < ring.bytes.len() && lines.len() > 1 {
            lines.remove(0);
        }
        let first = lines.len().saturating_sub(max_lines);
        lines[first..].join("\n")
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl LogStore {
    /// Starts the log of a binding, replacing an older log of the same binding.
    pub fn open(&mut self, job_id: &str, fencing_token: u64, capacity: usize) -> Arc<OutputLog> {
        let key = (job_id.to_string(), fencing_token);
        self.ended.retain(|k| *k != key);
        let log = Arc::new(OutputLog::new(capacity));
        self.logs.insert(key, Arc::clone(&log));
        log
    }

    /// Notes that a binding ended; keeps its log among the last [`ENDED_JOBS_KEPT`] ended jobs
    /// (and [`ENDED_BYTES_KEPT`] bytes; the newest ended job is always kept).
    pub fn ended(&mut self, job_id: &str, fencing_token: u64) {
        let key = (job_id.to_string(), fencing_token);
        if !self.logs.contains_key(&key) || self.ended.contains(&key) {
            return;
        }
        self.ended.push_back(key);
        let mut kept: usize = self.ended.iter().filter_map(|k| self.logs.get(k)).map(|log| log.kept_bytes()).sum();
        while self.ended.len() > 1 && (self.ended.len() > ENDED_JOBS_KEPT || kept > ENDED_BYTES_KEPT) {
            let Some(oldest) = self.ended.pop_front() else { break };
            if let Some(log) = self.logs.remove(&oldest) {
                kept = kept.saturating_sub(log.kept_bytes());
            }
        }
    }

    /// The log of a binding, if kept.
    pub fn get(&self, job_id: &str, fencing_token: u64) -> Option<Arc<OutputLog>> {
        self.logs.get(&(job_id.to_string(), fencing_token)).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_from_an_offset_and_the_tail() {
        let log = OutputLog::new(100);
        log.append(b"hello\nworld\n");
        let all = log.read(Some(0), 1000);
        assert_eq!((all.data.as_str(), all.offset, all.next_offset, all.complete), ("hello\nworld\n", 0, 12, false));
        let part = log.read(Some(6), 3);
        assert_eq!((part.data.as_str(), part.offset, part.next_offset), ("wor", 6, 9));
        let tail = log.read(None, 6);
        assert_eq!((tail.data.as_str(), tail.offset), ("world\n", 6));
        log.end();
        assert!(log.read(Some(6), 100).complete);
        assert!(!log.read(Some(0), 3).complete, "complete only once everything was read");
    }

    #[test]
    fn the_ring_drops_the_oldest_bytes_and_answers_from_the_oldest_kept() {
        let log = OutputLog::new(8);
        log.append(b"0123456789abcdef");
        let chunk = log.read(Some(0), 100);
        assert_eq!((chunk.data.as_str(), chunk.offset, chunk.next_offset), ("89abcdef", 8, 16));
        let beyond = log.read(Some(99), 100);
        assert_eq!((beyond.data.as_str(), beyond.offset, beyond.next_offset), ("", 16, 16));
    }

    #[test]
    fn last_lines_are_bounded_by_count_and_bytes() {
        let log = OutputLog::new(1000);
        for i in 0..20 {
            log.append(format!("line {i}\n").as_bytes());
        }
        assert_eq!(log.last_lines(3, 2048), "line 17\nline 18\nline 19");
        assert_eq!(log.last_lines(10, 12), "line 19", "a half line cut by the byte limit is dropped");
    }

    #[test]
    fn the_store_keeps_only_the_last_ended_jobs() {
        let mut store = LogStore::default();
        for i in 0..(ENDED_JOBS_KEPT + 2) {
            store.open(&format!("j-{i}"), 1, 10);
            store.ended(&format!("j-{i}"), 1);
        }
        assert!(store.get("j-0", 1).is_none());
        assert!(store.get("j-1", 1).is_none());
        assert!(store.get("j-2", 1).is_some());
        assert!(store.get(&format!("j-{}", ENDED_JOBS_KEPT + 1), 1).is_some());
    }

    #[test]
    fn the_store_bounds_the_bytes_of_ended_jobs() {
        let mut store = LogStore::default();
        let chunk = vec![b'x'; ENDED_BYTES_KEPT / 2];
        for i in 0..3 {
            store.open(&format!("j-{i}"), 1, ENDED_BYTES_KEPT).append(&chunk);
            store.ended(&format!("j-{i}"), 1);
        }
        assert!(store.get("j-0", 1).is_none(), "three halves are more than the whole");
        assert!(store.get("j-1", 1).is_some() && store.get("j-2", 1).is_some());
    }
}
