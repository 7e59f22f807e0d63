//! Process plumbing shared by Meridian's binaries (`meridian`, `meridian-agent`): logging set-up,
//! shutdown signals and an optional deadline for `select!` loops, so every binary logs, stops and
//! waits the same way.

use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::{DefaultFields, DefaultVisitor, Writer};

/// Starts `tracing` output on stderr. `MERIDIAN_LOG` (or `RUST_LOG`) sets the filter, else
/// `default_filter`. Colours only when stderr is a terminal, so log files and collectors get
/// plain text. Field values and messages are written through [`EscapedFields`], so that text an
/// agent or a client sent can never start a line of its own.
pub fn init_logging(default_filter: &str) {
    let filter = std::env::var("MERIDIAN_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default_filter.to_string());
    let _ = subscriber(&filter, std::io::stderr().is_terminal(), std::io::stderr).try_init();
}

/// The subscriber [`init_logging`] installs, writing to `writer`.
fn subscriber<W>(
    filter: &str,
    ansi: bool,
    writer: W,
) -> tracing_subscriber::fmt::SubscriberBuilder<
    EscapedFields,
    tracing_subscriber::fmt::format::Format,
    tracing_subscriber::EnvFilter,
    W,
>
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(ansi)
        .with_writer(writer)
        .fmt_fields(EscapedFields::default())
}

/// Formats event and span fields as tracing-subscriber's [`DefaultFields`] does, but with every
/// control character in a value or message escaped: `\n` as `\\n`, `\r` as `\\r`, `\t` as
/// `\\t`, any other as `\\u{..}`.
///
/// tracing-subscriber 0.3 escapes only terminal escape sequences, and only in the message; a
/// `%`-formatted field (`cluster = %name`) or a message built from a string that holds a
/// newline writes it as is, so an agent's hello, a member's failure reason or a request path
/// could forge a whole log line. Escaping here, where every field of every event and span is
/// written, covers them all at once.
#[derive(Debug, Default)]
pub struct EscapedFields {
    inner: DefaultFields,
}

/// The visitor of [`EscapedFields`]: escapes each value, then lets the default visitor lay the
/// fields out.
#[derive(Debug)]
pub struct EscapedVisitor<'a> {
    inner: DefaultVisitor<'a>,
}

impl<'a> MakeVisitor<Writer<'a>> for EscapedFields {
    type Visitor = EscapedVisitor<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> Self::Visitor {
        EscapedVisitor { inner: self.inner.make_visitor(target) }
    }
}

impl Visit for EscapedVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.inner.record_debug(field, &Escaped(&format_args!("{value}")));
        } else {
            // `Debug` of a string quotes it and escapes control characters already.
            self.inner.record_debug(field, &Escaped(&value));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.inner.record_debug(field, &Escaped(&format_args!("{}", ErrorChain(value))));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.inner.record_debug(field, &Escaped(value));
    }
}

impl VisitOutput<fmt::Result> for EscapedVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.inner.finish()
    }
}

impl VisitFmt for EscapedVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        self.inner.writer()
    }
}

/// A value whose `Debug` output has its control characters escaped.
struct Escaped<'a>(&'a dyn fmt::Debug);

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        write!(ControlEscaper(f), "{:?}", self.0)
    }
}

/// Passes text through with control characters escaped.
struct ControlEscaper<'a, 'b>(&'a mut fmt::Formatter<'b>);

impl fmt::Write for ControlEscaper<'_, '_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let mut rest = text;
        while let Some(at) = rest.find(char::is_control) {
            self.0.write_str(&rest[..at])?;
            let mut chars = rest[at..].chars();
            match chars.next() {
                Some('\n') => self.0.write_str("\\n")?,
                Some('\r') => self.0.write_str("\\r")?,
                Some('\t') => self.0.write_str("\\t")?,
                Some(control) => write!(self.0, "\\u{{{:x}}}", u32::from(control))?,
                None => {}
            }
            rest = chars.as_str();
        }
        self.0.write_str(rest)
    }
}

/// An error and its sources, `outer: inner: innermost`.
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(error) = source {
            write!(f, ": {error}")?;
            source = error.source();
        }
        Ok(())
    }
}

/// Sleeps until `deadline`, or forever when there is none: a `select!` arm that never fires
/// while no deadline is set.
pub async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Resolves on the first SIGINT or SIGTERM; a second signal exits the process at once (status
/// 130), for an operator who does not want to wait for the drain.
pub async fn shutdown_signal() {
    wait_for_signal().await;
    tracing::info!("shutting down (signal again to force)");
    // Lives until the process exits; it only ever ends the process.
    tokio::spawn(async {
        wait_for_signal().await;
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// What `log` writes through the subscriber [`init_logging`] installs.
    fn logged(log: impl FnOnce()) -> String {
        let captured = Captured::default();
        let subscriber = subscriber("info", false, captured.clone()).finish();
        tracing::subscriber::with_default(subscriber, log);
        String::from_utf8(captured.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn a_value_holding_a_newline_is_logged_on_one_line() {
        let hostile = "east\nFAKE line INFO meridian: all good";
        let text = logged(|| {
            let span = tracing::info_span!("agent", cluster = %hostile);
            let _entered = span.enter();
            tracing::warn!(
                hello = %hostile,
                reason = hostile,
                debug = ?hostile,
                "refused {hostile}"
            );
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.ends_with('\n'), "{text}");
        assert!(!text.lines().any(|line| line.starts_with("FAKE")), "{text}");
        assert!(text.contains(r"hello=east\nFAKE line"), "{text}");
        assert!(text.contains(r"refused east\nFAKE line"), "{text}");
        assert!(text.contains(r"cluster=east\nFAKE line"), "{text}");
    }

    #[test]
    fn other_control_characters_are_escaped_and_plain_text_is_unchanged() {
        let text = logged(|| {
            tracing::info!(path = %"/v1/jobs\r\x1b[2J\u{85}\0", plain = %"onprem-east", count = 3, "tab\there");
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(r"path=/v1/jobs\r\u{1b}[2J\u{85}\u{0}"), "{text}");
        assert!(text.contains("plain=onprem-east count=3"), "{text}");
        assert!(text.contains(r"tab\there"), "{text}");
    }

    #[test]
    fn an_error_is_logged_with_its_sources_on_one_line() {
        let inner = std::io::Error::other("disk\nFAKE line");
        let text = logged(|| {
            let error: &(dyn std::error::Error + 'static) = &inner;
            tracing::error!(error, "store failed");
        });
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(r"error=disk\nFAKE line"), "{text}");
    }
}
