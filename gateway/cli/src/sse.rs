//! Reading a server-sent event stream (`GET /v1/events`): the wire format's parser and a stream
//! of messages over one open HTTP response.

use std::future::Future;
use std::pin::Pin;

use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::client::{ClientError, Result};

/// The most bytes one message may take before the stream is refused as broken.
const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// One message of the stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseMessage {
    /// `event:` (default `message`).
    pub event: String,
    /// `id:`, when the message had one.
    pub id: Option<String>,
    /// The `data:` lines joined with newlines.
    pub data: String,
}

/// The incremental parser: feed bytes, take complete messages.
#[derive(Debug, Default)]
pub struct SseParser {
    pending: Vec<u8>,
}

impl SseParser {
    /// Adds bytes read from the stream.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<()> {
        self.pending.extend_from_slice(bytes);
        if self.pending.len() > MAX_MESSAGE_BYTES && self.next_boundary().is_none() {
            return Err(ClientError::Protocol(format!("an event larger than {MAX_MESSAGE_BYTES} bytes")));
        }
        Ok(())
    }

    /// The next complete message, if one has arrived (comments and empty messages are skipped).
    pub fn next_message(&mut self) -> Option<SseMessage> {
        while let Some((end, skip)) = self.next_boundary() {
            let block: Vec<u8> = self.pending.drain(..end + skip).take(end).collect();
            let text = String::from_utf8_lossy(&block);
            let mut message = SseMessage::default();
            let mut data: Vec<&str> = Vec::new();
            for line in text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)) {
                if line.is_empty() || line.starts_with(':') {
                    continue;
                }
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "event" => message.event = value.to_string(),
                    "id" => message.id = Some(value.to_string()),
                    "data" => data.push(value),
                    _ => {}
                }
            }
            if data.is_empty() && message.id.is_none() {
                continue;
            }
            message.data = data.join("\n");
            if message.event.is_empty() {
                message.event = "message".into();
            }
            return Some(message);
        }
        None
    }

    /// Where the first message ends (a blank line): its length and the separator's.
    fn next_boundary(&self) -> Option<(usize, usize)> {
        let bytes = &self.pending;
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'\n' {
                match (bytes.get(i + 1), bytes.get(i + 2)) {
                    (Some(b'\n'), _) => return Some((i, 2)),
                    (Some(b'\r'), Some(b'\n')) => return Some((i, 3)),
                    _ => {}
                }
            }
            i += 1;
        }
        None
    }
}

/// The connection task of a streaming response: it does the socket I/O.
pub(crate) type ConnectionFuture = Pin<Box<dyn Future<Output = std::result::Result<(), hyper::Error>> + Send>>;

/// The messages of one open event stream.
pub struct EventStream {
    pub(crate) authority: String,
    pub(crate) body: Incoming,
    pub(crate) connection: ConnectionFuture,
    pub(crate) connection_done: bool,
    pub(crate) parser: SseParser,
}

impl EventStream {
    /// The `host:port` of the gateway serving this stream.
    pub fn gateway(&self) -> &str {
        &self.authority
    }

    /// The next message; None when the gateway ended the stream (it stopped, or closed it).
    pub async fn next(&mut self) -> Result<Option<SseMessage>> {
        loop {
            if let Some(message) = self.parser.next_message() {
                return Ok(Some(message));
            }
            let http_error = |source| ClientError::Http { addr: self.authority.clone(), source };
            tokio::select! {
                frame = self.body.frame() => match frame {
                    None => return Ok(None),
                    Some(Err(error)) => return Err(http_error(error)),
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            self.parser.feed(data)?;
                        }
                    }
                },
                finished = &mut self.connection, if !self.connection_done => {
                    self.connection_done = true;
                    finished.map_err(http_error)?;
                }
            }
        }
    }
}

/// Feeds `chunks` one read at a time and collects the messages, for tests.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
fn feed_all(parser: &mut SseParser, chunks: &[&str]) -> Vec<SseMessage> {
    let mut out = Vec::new();
    for chunk in chunks {
        parser.feed(chunk.as_bytes()).unwrap();
        while let Some(message) = parser.next_message() {
            out.push(message);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn messages_split_across_reads_come_out_whole_and_comments_are_skipped() {
        let mut parser = SseParser::default();
        let got = feed_all(
            &mut parser,
            &[
                "event: ready\ndata: {\"cursor\"",
                ": \"1.0\"}\n\n: keep-alive\n\nid: 1.1\r\nevent: job\r\n",
                "data: a\r\ndata: b\r\n\r\n",
            ],
        );
        assert_eq!(
            got,
            [
                SseMessage { event: "ready".into(), id: None, data: "{\"cursor\": \"1.0\"}".into() },
                SseMessage { event: "job".into(), id: Some("1.1".into()), data: "a\nb".into() },
            ]
        );
    }

    #[test]
    fn a_message_without_an_event_name_is_a_plain_message() {
        let mut parser = SseParser::default();
        let got = feed_all(&mut parser, &["data:x\n\n"]);
        assert_eq!(got, [SseMessage { event: "message".into(), id: None, data: "x".into() }]);
    }
}
