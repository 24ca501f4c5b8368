//! [`NetConfig`]: the settings of servers, clients and their connections.

use shoal_proto::command::MAX_FRAME_LEN;
use std::time::Duration;

/// Settings shared by servers, clients and their connections. Every limit bounds what a peer
/// can make this side hold; see `docs/configuration.md` (`[net]`) for the broker's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// Largest frame accepted or sent, in bytes including the length field
    /// (default [`MAX_FRAME_LEN`], 16 MiB, as Java).
    pub max_frame_len: usize,
    /// Time allowed to establish a TCP connection (default 3 s, Java's `connectTimeoutMillis`).
    pub connect_timeout: Duration,
    /// Incoming requests of one connection being processed or waiting for a late answer at
    /// once (default 4096). At the limit the connection stops reading from its socket until
    /// one completes (backpressure: TCP flow control then slows the peer down).
    pub max_inflight_requests: usize,
    /// Bytes of encoded frames waiting to be written on one connection (default 4 MiB). Over
    /// it the connection stops reading (a peer that sends but does not read its answers is
    /// slowed down instead of growing memory) and local senders of requests wait. A single
    /// frame larger than this is still accepted when nothing else waits.
    pub max_pending_write_bytes: usize,
    /// A connection with no byte read or written for this long, and no request in flight in
    /// either direction, is closed (default 120 s, RocketMQ's
    /// `serverChannelMaxIdleTimeSeconds`). `None`: never.
    pub idle_timeout: Option<Duration>,
    /// Bytes of incomplete incoming frames held by all connections of one server or client
    /// together (default 256 MiB). A connection whose partial frame would take the total over
    /// it is closed. Frame buffers grow with the bytes that arrive, not with the length a frame
    /// declares.
    pub max_partial_frame_bytes: usize,
    /// Connections a [`Server`](crate::Server) accepts at once from one IP address (default
    /// 1024); more are closed at accept.
    pub max_connections_per_ip: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            max_frame_len: MAX_FRAME_LEN,
            connect_timeout: Duration::from_secs(3),
            max_inflight_requests: 4096,
            max_pending_write_bytes: 4 << 20,
            idle_timeout: Some(Duration::from_secs(120)),
            max_partial_frame_bytes: 256 << 20,
            max_connections_per_ip: 1024,
        }
    }
}
