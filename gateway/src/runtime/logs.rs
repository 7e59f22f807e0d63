//! Logs requests waiting for their member's answer.
//!
//! The core sends a request to the stream of the cluster holding the job and names that
//! stream; the answer comes back on the agent's stream and goes straight to the waiting caller,
//! around the core (output changes no state). Only the stream that was asked may answer: an
//! answer from another stream is dropped, and one that arrives before the caller has learnt
//! which stream was asked is held until it has.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use meridian_core::ConnId;
use meridian_proto::protocol::LogChunk;
use tokio::sync::oneshot;

/// The member's answer: the output, or why not.
pub(super) type Answer = Result<LogChunk, String>;

/// Every logs request still waiting, by request id.
#[derive(Default)]
pub(super) struct Waiting {
    next: AtomicU64,
    entries: Mutex<HashMap<u64, Entry>>,
}

struct Entry {
    /// The stream asked, once the core has said.
    conn: Option<ConnId>,
    /// Where the answer goes; taken when it is sent.
    sender: Option<oneshot::Sender<Answer>>,
    /// An answer that came before `conn` was known, with the stream it came on.
    early: Option<(ConnId, Answer)>,
}

impl Waiting {
    /// A fresh request id and where its answer will arrive.
    pub(super) fn register(&self) -> (u64, oneshot::Receiver<Answer>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (sender, receiver) = oneshot::channel();
        self.lock().insert(id, Entry { conn: None, sender: Some(sender), early: None });
        (id, receiver)
    }

    /// The core sent request `id` to `conn`: only `conn` may answer it.
    pub(super) fn asked(&self, id: u64, conn: ConnId) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(&id) else { return };
        entry.conn = Some(conn);
        if let Some((from, answer)) = entry.early.take()
            && from == conn
            && let Some(sender) = entry.sender.take()
        {
            let _ = sender.send(answer);
        }
    }

    /// Stream `conn` answered request `id`.
    pub(super) fn answer(&self, conn: ConnId, id: u64, answer: Answer) {
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(&id) else {
            tracing::debug!(conn, request = id, "a logs answer nobody waits for (late or unknown)");
            return;
        };
        match entry.conn {
            None => entry.early = Some((conn, answer)),
            Some(asked) if asked == conn => {
                if let Some(sender) = entry.sender.take() {
                    let _ = sender.send(answer);
                }
            }
            Some(asked) => {
                tracing::warn!(conn, asked, request = id, "a logs answer from a stream that was not asked; dropped")
            }
        }
    }

    /// Request `id` is over (answered, timed out or refused).
    pub(super) fn forget(&self, id: u64) {
        self.lock().remove(&id);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(data: &str) -> Answer {
        Ok(LogChunk { data: data.into(), offset: 0, next_offset: data.len() as u64, complete: false })
    }

    #[test]
    fn only_the_stream_asked_may_answer() {
        let waiting = Waiting::default();
        let (id, mut receiver) = waiting.register();
        waiting.asked(id, 7);
        waiting.answer(8, id, chunk("forged"));
        assert!(receiver.try_recv().is_err(), "an answer from another stream is dropped");
        waiting.answer(7, id, chunk("real"));
        assert_eq!(receiver.try_recv().unwrap(), chunk("real"));
    }

    #[test]
    fn an_early_answer_is_held_until_the_stream_is_known() {
        let waiting = Waiting::default();
        let (id, mut receiver) = waiting.register();
        waiting.answer(7, id, chunk("fast"));
        assert!(receiver.try_recv().is_err());
        waiting.asked(id, 7);
        assert_eq!(receiver.try_recv().unwrap(), chunk("fast"));

        let (id, mut receiver) = waiting.register();
        waiting.answer(9, id, chunk("forged"));
        waiting.asked(id, 7);
        assert!(receiver.try_recv().is_err(), "an early answer from another stream is dropped");
    }

    #[test]
    fn forgotten_requests_take_no_answers() {
        let waiting = Waiting::default();
        let (id, mut receiver) = waiting.register();
        waiting.forget(id);
        waiting.answer(7, id, chunk("late"));
        assert!(receiver.try_recv().is_err());
        assert!(waiting.lock().is_empty());
    }
}
