//! The connection seam of the listeners: what happens to an accepted TCP stream before HTTP is
//! spoken on it. Plain text passes it through; TLS (this module's parent) runs the handshake.
//! The handshake runs on the connection's own task, under the header-read timeout, so a client
//! that stalls mid-handshake holds only its own connection.

use std::future::Future;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Turns an accepted TCP stream into the stream HTTP is served on.
pub trait Handshake: Clone + Send + Sync + 'static {
    /// The stream after the handshake.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Runs the handshake; an error drops the connection.
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

/// No handshake: HTTP in plain text (only with `insecure: true`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;

    async fn handshake(&self, tcp: TcpStream) -> std::io::Result<TcpStream> {
        Ok(tcp)
    }
}
