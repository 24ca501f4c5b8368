//! [`ClientError`]: the one error type of `shoal-client`.

use crate::offset_store::OffsetFileError;
use shoal_net::NetError;
use shoal_proto::ProtoError;

/// Everything the client can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The transport failed (connect, timeout, connection closed, ...).
    #[error("network: {0}")]
    Net(#[from] NetError),
    /// A frame, header, body or message could not be encoded or decoded.
    #[error("protocol: {0}")]
    Proto(#[from] ProtoError),
    /// A server answered with a code other than the expected one.
    #[error("{what}: server answered code {code} ({remark})")]
    Server {
        /// The request that failed.
        what: &'static str,
        /// The response code.
        code: i32,
        /// The response remark (empty if none).
        remark: String,
    },
    /// No name server knows a route for the topic.
    #[error("no route info of topic {0}")]
    NoRoute(String),
    /// No address is known for a broker name.
    #[error("no address known for broker {0}")]
    NoBrokerAddr(String),
    /// A configuration value or argument is unusable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The client was shut down, or was not started.
    #[error("client is not running: {0}")]
    NotRunning(&'static str),
    /// Every attempt to send a message failed; the last error is kept.
    #[error("send failed after {attempts} attempt(s): {last}")]
    SendFailed {
        /// How many attempts were made.
        attempts: usize,
        /// The error of the last attempt.
        last: Box<ClientError>,
    },
    /// The local offset file (broadcasting) could not be read or written.
    #[error("offset store: {0}")]
    OffsetFile(#[from] OffsetFileError),
    /// The allocation strategy rejected its input or is unknown.
    #[error("allocation: {0}")]
    Allocate(#[from] shoal_group::GroupError),
}

/// `Result` with [`ClientError`].
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

impl ClientError {
    /// A [`ClientError::Server`] from a response.
    pub(crate) fn server(what: &'static str, resp: &shoal_proto::RemotingCommand) -> Self {
        ClientError::Server {
            what,
            code: resp.code,
            remark: resp.remark.clone().unwrap_or_default(),
        }
    }

    /// The server response code, if this is a [`ClientError::Server`].
    pub fn server_code(&self) -> Option<i32> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            ClientError::SendFailed { last, .. } => last.server_code(),
            _ => None,
        }
    }
}
