//! A TCP proxy between an agent and the gateway that a test can cut, one way or both, to stage
//! partitions without touching either process.

use std::net::SocketAddr;

use anyhow::Result;

/// What a [`TcpProxy`] does with the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forwards bytes both ways.
    Pass,
    /// Keeps connections open but forwards nothing (a partition that sends no RST: both ends
    /// see only silence). Held bytes flow again on `Pass`.
    Blackhole,
    /// Holds what the client sends (agent → gateway) while the other direction flows: the
    /// upstream hears nothing, the client hears everything. Held bytes flow again on `Pass`.
    CutToUpstream,
    /// Holds what the upstream sends (gateway → agent) while the other direction flows: the
    /// client hears nothing, the upstream hears everything. Held bytes flow again on `Pass`.
    CutToClient,
    /// Closes every connection and closes new ones at once (a link that is down).
    Down,
}

impl ProxyMode {
    /// Whether bytes going `direction` are held in this mode.
    fn holds(self, direction: Direction) -> bool {
        match self {
            ProxyMode::Blackhole => true,
            ProxyMode::CutToUpstream => direction == Direction::ToUpstream,
            ProxyMode::CutToClient => direction == Direction::ToClient,
            ProxyMode::Pass | ProxyMode::Down => false,
        }
    }
}

/// Which way a [`TcpProxy`] pump copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// Client → upstream (agent → gateway).
    ToUpstream,
    /// Upstream → client (gateway → agent).
    ToClient,
}

/// A TCP proxy on `127.0.0.1:0` in front of `upstream` that a test can cut or blackhole.
pub struct TcpProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    mode: tokio::sync::watch::Sender<ProxyMode>,
    task: tokio::task::JoinHandle<()>,
}

impl TcpProxy {
    /// Starts forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, _) = tokio::sync::watch::channel(ProxyMode::Pass);
        let modes = mode.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                if *modes.borrow() == ProxyMode::Down {
                    drop(client);
                    continue;
                }
                let modes = modes.subscribe();
                connections.spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else { return };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    // Each side learns that the other closed only through its own direction,
                    // so a held direction hides the close too (as a real one-way partition
                    // would); the connection ends once both directions have ended.
                    let to_upstream = pump(client_read, server_write, Direction::ToUpstream, modes.clone());
                    let to_client = pump(server_read, client_write, Direction::ToClient, modes.clone());
                    let both = async { tokio::join!(to_upstream, to_client) };
                    tokio::select! {
                        _ = both => {}
                        () = wait_down(modes) => {}
                    }
                });
            }
        });
        Ok(Self { addr, mode, task })
    }

    /// Changes what the proxy does from now on.
    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn wait_down(mut modes: tokio::sync::watch::Receiver<ProxyMode>) {
    let _ = modes.wait_for(|m| *m == ProxyMode::Down).await;
}

/// Copies bytes one way, holding them (and the end of the stream) while the mode holds
/// `direction`; returning drops `to`, which closes that side's writing half.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    direction: Direction,
    mut modes: tokio::sync::watch::Receiver<ProxyMode>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        // A read error ends the stream as the end of the stream does.
        let read = from.read(&mut buffer).await.unwrap_or(0);
        if modes.wait_for(|m| !m.holds(direction)).await.map(|m| *m).unwrap_or(ProxyMode::Down) == ProxyMode::Down
            || read == 0
        {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}
