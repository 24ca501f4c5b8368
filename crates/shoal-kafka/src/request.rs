//! What a request handler gets and gives back: the request's context (API, version,
//! correlation id, client, peer), the reply it hands the connection, and the framing of a
//! response. Every handler module uses this; routing (`api.rs`) decides which handler runs.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::ResponseError;
use std::net::SocketAddr;

/// What a connection handler knows about its peer.
#[derive(Debug)]
pub(crate) struct ConnInfo {
    /// Peer address.
    pub peer: SocketAddr,
    /// The client matches answers to requests by correlation id, so a held heartbeat answer
    /// need not hold back the answers to its later requests: set from ApiVersions (v3+) for
    /// librdkafka, which looks each answer up by correlation id. Kafka's Java client needs
    /// answers in request order.
    pub answers_by_correlation_id: std::sync::atomic::AtomicBool,
}

/// What a handler hands back to the connection.
#[derive(Debug)]
pub(crate) enum Reply {
    /// A response frame, size prefix included.
    Frame(Bytes),
    /// No response (Produce with acks=0).
    Nothing,
    /// Close the connection; the reason is logged.
    Close(String),
}

/// Per-request facts handlers need.
#[derive(Debug, Clone)]
pub(crate) struct RequestCtx {
    pub key: ApiKey,
    pub version: i16,
    pub correlation_id: i32,
    pub client_id: StrBytes,
    pub peer: std::net::SocketAddr,
    /// Notified when the connection's next request arrives (holdable requests only).
    pub next_request: Option<std::sync::Arc<tokio::sync::Notify>>,
}

impl RequestCtx {
    /// Resolves when the connection's next request has arrived or the connection closed
    /// (never, for a request whose answer may not be held).
    pub(crate) async fn next_request(&self) {
        match &self.next_request {
            Some(n) => n.notified().await,
            None => std::future::pending().await,
        }
    }

    pub(crate) fn reply<R: Encodable>(&self, body: &R) -> Reply {
        frame(self.key, self.version, self.correlation_id, body)
    }
}

/// Encodes a response frame: size, header (version by API), body.
pub(crate) fn frame<R: Encodable>(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
) -> Reply {
    match try_frame(key, version, correlation_id, body) {
        Ok(frame) => Reply::Frame(frame),
        Err(reason) => {
            tracing::error!(api = ?key, version, reason = %reason, "kafka response encoding failed");
            Reply::Close(reason)
        }
    }
}

/// [`frame`] without the logging: the encoder's refusal (a version the response type does
/// not have, a field set that the version lacks) as the reason.
pub(crate) fn try_frame<R: Encodable>(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &R,
) -> Result<Bytes, String> {
    let header_version = key.response_header_version(version);
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    header
        .encode(&mut buf, header_version)
        .map_err(|e| format!("{key:?} v{version}: response header encoding failed: {e}"))?;
    body.encode(&mut buf, version)
        .map_err(|e| format!("{key:?} v{version}: response encoding failed: {e}"))?;
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

/// `Some(StrBytes)` from a `&str`.
pub(crate) fn sb(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// The error code of a [`ResponseError`].
pub(crate) fn code(e: ResponseError) -> i16 {
    e.code()
}
