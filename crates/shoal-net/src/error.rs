//! [`NetError`]: the one error type of `shoal-net`.

use shoal_proto::ProtoError;
use std::net::SocketAddr;
use std::time::Duration;

/// Everything that can go wrong on a remoting connection.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// No response arrived within the request's timeout. The pending entry has been removed; a
    /// late response is dropped. The connection stays open (as in RocketMQ).
    #[error("request to {peer} timed out after {timeout:?} (opaque {opaque})")]
    Timeout {
        /// The peer the request went to.
        peer: SocketAddr,
        /// The opaque the request was sent with.
        opaque: i32,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// The connection was closed (by either side, or after an I/O or decode error) before the
    /// operation completed, or was already closed.
    #[error("connection to {peer} is closed")]
    ConnectionClosed {
        /// The peer of the closed connection.
        peer: SocketAddr,
    },
    /// Establishing a TCP connection took longer than the connect timeout.
    #[error("connecting to {addr} timed out after {timeout:?}")]
    ConnectTimeout {
        /// The address as given (`"ip:port"`).
        addr: String,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// Establishing a TCP connection failed (refused, unreachable, unresolvable address, ...).
    #[error("cannot connect to {addr}: {source}")]
    ConnectFailed {
        /// The address as given (`"ip:port"`).
        addr: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An I/O error outside connecting (binding a listener, reading, writing).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A frame could not be encoded or decoded (malformed input, frame over the limit, a
    /// command that does not fit a binary header, ...).
    #[error("protocol error: {0}")]
    Protocol(#[from] ProtoError),
    /// TLS settings that cannot be used: a certificate, key or CA file that cannot be read, a
    /// key that does not fit its certificate, a bad server name.
    #[error("TLS: {0}")]
    Tls(String),
    /// The TLS handshake with a server failed (untrusted or wrong certificate, the server
    /// does not speak TLS, ...).
    #[error("TLS handshake with {addr} failed: {reason}")]
    TlsHandshake {
        /// The address as given (`"ip:port"`).
        addr: String,
        /// What went wrong, in words.
        reason: String,
    },
    /// The client or server has been shut down.
    #[error("shut down")]
    Shutdown,
}

/// `Result` with [`NetError`].
pub type Result<T, E = NetError> = std::result::Result<T, E>;
