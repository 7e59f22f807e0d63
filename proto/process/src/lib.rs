//! Process plumbing shared by Meridian's binaries (`meridian`, `meridian-agent`): logging set-up
//! and shutdown signals, so every binary logs and stops the same way.

use std::io::IsTerminal;

/// Starts `tracing` output on stderr. `MERIDIAN_LOG` (or `RUST_LOG`) sets the filter, else
/// `default_filter`. Colours only when stderr is a terminal, so log files and collectors get
/// plain text.
pub fn init_logging(default_filter: &str) {
    let filter = std::env::var("MERIDIAN_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default_filter.to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
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
