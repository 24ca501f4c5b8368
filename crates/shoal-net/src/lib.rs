//! `shoal-net`: the tokio transport of the RocketMQ remoting protocol.
//!
//! - [`RemotingCodec`]: `tokio_util::codec` framing of [`RemotingCommand`]s with a frame limit.
//! - [`Connection`]: one TCP connection used the same way by both sides: requests correlated by
//!   `opaque` with timeouts, oneway requests, responses (also late ones, through a
//!   [`Responder`]), incoming requests handed to a [`Processor`], close notification.
//! - [`Server`]: accepts connections and dispatches their requests to a [`Processor`].
//! - [`RemotingClient`]: a connection pool keyed by `"ip:port"` with `invoke` / `invoke_oneway`.
//!
//! A frame over the limit or a frame that does not decode closes that connection only, with a
//! `warn` log line naming the peer and the reason.

pub mod client;
pub mod codec;
pub mod connection;
pub mod error;
pub mod server;

pub use client::RemotingClient;
pub use codec::RemotingCodec;
pub use connection::{
    processor_fn, request_code_not_supported, Connection, FnProcessor, NetConfig,
    NotSupportedProcessor, ProcessError, ProcessResult, Processor, RequestContext, Responder,
};
pub use error::{NetError, Result};
pub use server::Server;
pub use shoal_proto::RemotingCommand;
