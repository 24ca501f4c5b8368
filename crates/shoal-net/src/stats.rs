//! [`NetStats`]: counters of a server's (or client's) connections, and how often each
//! transport limit was hit.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Counters shared by the connections of one [`Server`](crate::Server) or
/// [`RemotingClient`](crate::RemotingClient). Plain atomics, read with [`NetStats::snapshot`].
#[derive(Debug, Default)]
pub struct NetStats {
    pub(crate) connections_opened: AtomicU64,
    pub(crate) connections_closed: AtomicU64,
    pub(crate) refused_per_ip: AtomicU64,
    pub(crate) closed_idle: AtomicU64,
    pub(crate) closed_partial_budget: AtomicU64,
    pub(crate) closed_bad_frame: AtomicU64,
    pub(crate) paused_inflight: AtomicU64,
    pub(crate) paused_write_queue: AtomicU64,
    pub(crate) requests_received: AtomicU64,
    pub(crate) requests_binary_header: AtomicU64,
    pub(crate) responses_too_large: AtomicU64,
    pub(crate) read_calls: AtomicU64,
    pub(crate) write_calls: AtomicU64,
    pub(crate) tls_handshakes: AtomicU64,
    pub(crate) tls_handshake_failures: AtomicU64,
    pub(crate) tls_handshake_timeouts: AtomicU64,
    pub(crate) plaintext_accepted: AtomicU64,
    pub(crate) plaintext_refused: AtomicU64,
    /// Bytes held right now by incomplete incoming frames, over all connections (the budget
    /// `max_partial_frame_bytes` is checked against this).
    pub(crate) partial_frame_bytes: AtomicUsize,
}

/// A copy of [`NetStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStatsSnapshot {
    /// Connections started.
    pub connections_opened: u64,
    /// Connections ended.
    pub connections_closed: u64,
    /// Connections refused at accept because their IP address had `max_connections_per_ip`.
    pub refused_per_ip: u64,
    /// Connections closed after `idle_timeout` without traffic.
    pub closed_idle: u64,
    /// Connections closed because their incomplete frame would exceed
    /// `max_partial_frame_bytes` (over all connections).
    pub closed_partial_budget: u64,
    /// Connections closed on a frame over the limit or one that does not decode.
    pub closed_bad_frame: u64,
    /// Times a connection stopped reading because `max_inflight_requests` requests were being
    /// processed (backpressure).
    pub paused_inflight: u64,
    /// Times a connection stopped reading because `max_pending_write_bytes` were waiting to
    /// be written (backpressure: the peer does not read its answers).
    pub paused_write_queue: u64,
    /// Requests received (oneway included).
    pub requests_received: u64,
    /// Requests among them whose header came in RocketMQ's binary encoding (the others came
    /// as JSON).
    pub requests_binary_header: u64,
    /// Answers that did not fit the frame limit and were replaced by SYSTEM_ERROR.
    pub responses_too_large: u64,
    /// Read calls on sockets (a read takes every byte available, many frames at once).
    pub read_calls: u64,
    /// Write calls on sockets (one write carries every frame ready at that moment).
    pub write_calls: u64,
    /// Bytes of incomplete incoming frames held now.
    pub partial_frame_bytes: u64,
    /// TLS handshakes completed (server side: connections served over TLS).
    pub tls_handshakes: u64,
    /// TLS handshakes that failed (bad client hello, no common cipher, client refused our
    /// certificate, ...); the connection was closed.
    pub tls_handshake_failures: u64,
    /// TLS handshakes (or the wait for a connection's first byte) that took longer than the
    /// handshake timeout; the connection was closed.
    pub tls_handshake_timeouts: u64,
    /// Plaintext connections served by a server in permissive mode.
    pub plaintext_accepted: u64,
    /// Plaintext connections closed by a server in enforcing mode.
    pub plaintext_refused: u64,
}

impl NetStats {
    /// The counters now.
    pub fn snapshot(&self) -> NetStatsSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        NetStatsSnapshot {
            connections_opened: g(&self.connections_opened),
            connections_closed: g(&self.connections_closed),
            refused_per_ip: g(&self.refused_per_ip),
            closed_idle: g(&self.closed_idle),
            closed_partial_budget: g(&self.closed_partial_budget),
            closed_bad_frame: g(&self.closed_bad_frame),
            paused_inflight: g(&self.paused_inflight),
            paused_write_queue: g(&self.paused_write_queue),
            requests_received: g(&self.requests_received),
            requests_binary_header: g(&self.requests_binary_header),
            responses_too_large: g(&self.responses_too_large),
            read_calls: g(&self.read_calls),
            write_calls: g(&self.write_calls),
            partial_frame_bytes: self.partial_frame_bytes.load(Ordering::Relaxed) as u64,
            tls_handshakes: g(&self.tls_handshakes),
            tls_handshake_failures: g(&self.tls_handshake_failures),
            tls_handshake_timeouts: g(&self.tls_handshake_timeouts),
            plaintext_accepted: g(&self.plaintext_accepted),
            plaintext_refused: g(&self.plaintext_refused),
        }
    }

    /// Connections open now.
    pub fn open_connections(&self) -> u64 {
        let s = self.snapshot();
        s.connections_opened.saturating_sub(s.connections_closed)
    }
}

impl NetStatsSnapshot {
    /// Each transport limit hit so far as (config key, what the server did, count), the key
    /// being the one of the `[net]` table that sets the limit (`net.max_connections_per_ip`,
    /// ...) and the action `refused` (closed at accept), `closed`, `paused` (reading stopped
    /// until answers drained) or `answer_replaced` (an answer over the frame limit sent as
    /// SYSTEM_ERROR). Broker and name server export these rows as their limit-hit metric.
    pub fn limit_hits(&self) -> [(&'static str, &'static str, u64); 7] {
        [
            ("net.max_connections_per_ip", "refused", self.refused_per_ip),
            ("net.idle_timeout_secs", "closed", self.closed_idle),
            (
                "net.max_partial_frame_bytes",
                "closed",
                self.closed_partial_budget,
            ),
            ("net.max_frame_bytes", "closed", self.closed_bad_frame),
            (
                "net.max_frame_bytes",
                "answer_replaced",
                self.responses_too_large,
            ),
            ("net.max_inflight_requests", "paused", self.paused_inflight),
            (
                "net.max_pending_write_bytes",
                "paused",
                self.paused_write_queue,
            ),
        ]
    }
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
