//! The window of a job's output that a [`LocalBackend::logs`](super::LocalBackend::logs) call
//! asks for, cut the same way by every backend.
//!
//! A backend keeps some of everything a job wrote: the bytes from absolute offset `kept.start`
//! (what came before was dropped) to `kept.end` (everything written so far). A call asks for at
//! most `max_bytes` from byte `from`, or for the last `max_bytes` when `from` is None:
//!
//! - the window starts at `from` (or `max_bytes` before the end), moved into the kept range:
//!   bytes no longer kept are answered from the oldest kept byte, an offset past the end from
//!   the end (an empty chunk);
//! - **`complete` is true exactly when the source is finished (the job ended: nothing more will
//!   be written) and the chunk reaches the end of what it wrote.** A running job's chunk is never
//!   complete, even when it is empty or reaches the end so far; a finished job's chunk that stops
//!   short of the end (the limit cut it) is not complete either: the caller asks again from
//!   `next_offset` (`docs/api.md`, Logs).
//!
//! A source that reads cheaply from any offset (a file) asks [`LogRequest::range`] which bytes
//! to read and hands them to [`log_chunk`]; one that holds its kept bytes in memory calls
//! [`LogRequest::window`].

use std::ops::Range;

use super::LogChunk;

/// What a `logs` call asks for: at most `max_bytes` from absolute byte `from`, or the last
/// `max_bytes` when `from` is None.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogRequest {
    /// The first byte wanted; None: the tail.
    pub(crate) from: Option<u64>,
    /// The most bytes to answer.
    pub(crate) max_bytes: usize,
}

impl LogRequest {
    /// Which bytes to read of a source that keeps the bytes `kept` (absolute offsets). The range
    /// lies in `kept`.
    pub(crate) fn range(self, kept: Range<u64>) -> Range<u64> {
        let max = u64::try_from(self.max_bytes).unwrap_or(u64::MAX);
        let wanted = self.from.unwrap_or_else(|| kept.end.saturating_sub(max));
        let start = wanted.clamp(kept.start, kept.end.max(kept.start));
        start..start.saturating_add(max).min(kept.end).max(start)
    }

    /// The chunk asked for of `kept`, the bytes a source keeps from absolute offset `kept_from`
    /// to the end of its output; `finished`: it will write no more.
    pub(crate) fn window(self, kept: &[u8], kept_from: u64, finished: bool) -> LogChunk {
        let end = kept_from.saturating_add(u64::try_from(kept.len()).unwrap_or(u64::MAX));
        let range = self.range(kept_from..end);
        let index = |offset: u64| usize::try_from(offset - kept_from).unwrap_or(kept.len()).min(kept.len());
        log_chunk(&kept[index(range.start)..index(range.end)], range.start, end, finished)
    }
}

/// The chunk for `bytes` read from absolute offset `offset` of a source whose output ends at
/// `end` so far; `finished`: the source will write no more. See the module's rule for
/// `complete`.
pub(crate) fn log_chunk(bytes: &[u8], offset: u64, end: u64, finished: bool) -> LogChunk {
    let next_offset = offset.saturating_add(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
    LogChunk {
        data: String::from_utf8_lossy(bytes).into_owned(),
        offset,
        next_offset,
        // `>=`: a file read may find bytes written after its length was taken.
        complete: finished && next_offset >= end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(data: &str, offset: u64, next_offset: u64, complete: bool) -> LogChunk {
        LogChunk { data: data.into(), offset, next_offset, complete }
    }

    fn log_window(kept: &[u8], kept_from: u64, from: Option<u64>, max_bytes: usize, finished: bool) -> LogChunk {
        LogRequest { from, max_bytes }.window(kept, kept_from, finished)
    }

    #[test]
    fn an_empty_source_answers_an_empty_chunk_complete_only_once_finished() {
        assert_eq!(log_window(b"", 0, None, 10, false), chunk("", 0, 0, false));
        assert_eq!(log_window(b"", 0, Some(0), 10, true), chunk("", 0, 0, true));
        assert_eq!(log_window(b"", 0, Some(5), 10, true), chunk("", 0, 0, true));
    }

    #[test]
    fn a_window_exactly_at_the_limit_reaches_the_end_and_one_byte_less_does_not() {
        assert_eq!(log_window(b"hello", 0, Some(0), 5, true), chunk("hello", 0, 5, true));
        assert_eq!(log_window(b"hello", 0, Some(0), 4, true), chunk("hell", 0, 4, false));
        assert_eq!(log_window(b"hello", 0, Some(4), 4, true), chunk("o", 4, 5, true));
    }

    #[test]
    fn without_an_offset_the_answer_is_the_tail() {
        assert_eq!(log_window(b"hello world", 0, None, 5, false), chunk("world", 6, 11, false));
        assert_eq!(log_window(b"hi", 0, None, 5, true), chunk("hi", 0, 2, true));
    }

    #[test]
    fn an_offset_past_the_end_answers_empty_at_the_end() {
        assert_eq!(log_window(b"hello", 0, Some(99), 5, false), chunk("", 5, 5, false));
        assert_eq!(log_window(b"hello", 0, Some(99), 5, true), chunk("", 5, 5, true));
    }

    #[test]
    fn a_running_source_is_never_complete_even_at_its_end() {
        assert_eq!(log_window(b"hello", 0, Some(0), 100, false), chunk("hello", 0, 5, false));
        assert_eq!(log_window(b"hello", 0, Some(5), 100, false), chunk("", 5, 5, false));
    }

    #[test]
    fn bytes_no_longer_kept_are_answered_from_the_oldest_kept_byte() {
        // Kept: "world" at offsets 6..11 of "hello world".
        assert_eq!(log_window(b"world", 6, Some(0), 3, false), chunk("wor", 6, 9, false));
        assert_eq!(log_window(b"world", 6, Some(8), 100, true), chunk("rld", 8, 11, true));
        assert_eq!(log_window(b"world", 6, None, 100, true), chunk("world", 6, 11, true));
    }

    #[test]
    fn log_chunks_follow_offsets_and_the_tail_is_bounded() {
        let all = "line one\nline two\n".as_bytes();
        let tail = log_window(all, 0, None, 9, true);
        assert_eq!((tail.data.as_str(), tail.offset, tail.next_offset, tail.complete), ("line two\n", 9, 18, true));
        let head = log_window(all, 0, Some(0), 5, true);
        assert_eq!((head.data.as_str(), head.next_offset, head.complete), ("line ", 5, false));
        let past = log_window(all, 0, Some(100), 5, false);
        assert_eq!((past.data.as_str(), past.offset), ("", 18));
    }

    #[test]
    fn a_file_read_that_found_more_than_its_length_is_still_complete_when_finished() {
        assert_eq!(LogRequest { from: Some(2), max_bytes: 10 }.range(0..5), 2..5);
        assert_eq!(log_chunk(b"llo!", 2, 5, true), chunk("llo!", 2, 6, true));
    }
}
