//! `shoal-net`: the tokio transport of the RocketMQ remoting protocol.
//!
//! - [`RemotingCodec`]: `tokio_util::codec` framing of [`RemotingCommand`]s with a frame limit.
//! - [`Connection`]: one connection (TCP, or any stream such as TLS over TCP) used the same way
//!   by both sides: requests correlated by `opaque` with timeouts, oneway requests, responses
//!   (also late ones, through a [`Responder`]), incoming requests handed to a [`Processor`],
//!   close notification. One task per connection reads, runs the requests and writes every
//!   answer ready at once with one vectored write.
//! - Limits ([`NetConfig`]): requests in flight and answers waiting per connection
//!   (backpressure: the connection stops reading), frame size, bytes of incomplete frames,
//!   idle time, connections per IP address; [`NetStats`] counts when each is hit.
//! - [`Server`]: accepts connections and dispatches their requests to a [`Processor`].
//! - [`RemotingClient`]: a connection pool keyed by `"ip:port"` with `invoke` / `invoke_oneway`.
//! - TLS ([`tls`]): servers in RocketMQ's modes disabled / permissive / enforcing
//!   ([`ServerTls`], [`Server::bind_with_tls`]), clients speaking TLS to every address
//!   ([`ClientTls`], [`RemotingClient::with_tls`]); rustls with the ring provider.
//!
//! A frame over the limit or a frame that does not decode closes that connection only, with a
//! `warn` log line naming the peer and the reason.

pub mod client;
pub mod codec;
mod config;
pub mod connection;
mod driver;
pub mod error;
mod outbuf;
pub mod processor;
pub mod server;
mod state;
pub mod stats;
pub mod tls;

pub use client::RemotingClient;
pub use codec::RemotingCodec;
pub use connection::{Connection, NetConfig, PendingResponse};
pub use error::{NetError, Result};
pub use processor::{
    processor_fn, request_code_not_supported, FnProcessor, NotSupportedProcessor, ProcessError,
    ProcessResult, Processor, RequestContext, Responder,
};
pub use server::Server;
pub use shoal_proto::RemotingCommand;
pub use stats::{NetStats, NetStatsSnapshot};
pub use tls::{Accepted, ClientTls, ServerTls, TlsMode, TrustRoots};
