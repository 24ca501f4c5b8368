//! Who sent a request, as the handlers need it: the connection id (sessions, notices,
//! fences), the peer's address (logs, registrations) and, over a socket, the connection
//! itself (to call the client back). The simulator's harness calls handlers with no socket.

use shoal_net::{Connection, RequestContext};
use std::net::SocketAddr;

/// The sender of a request. See the [module documentation](self).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller<'a> {
    /// The connection's id (unique in the broker's lifetime).
    pub(crate) conn_id: u64,
    /// The client's address.
    pub(crate) peer: SocketAddr,
    /// The connection, when the request came over one.
    pub(crate) conn: Option<&'a Connection>,
}

impl<'a> Caller<'a> {
    /// The sender of a request that came over a connection.
    pub(crate) fn of(ctx: &'a RequestContext) -> Self {
        Self {
            conn_id: ctx.connection().id(),
            peer: ctx.peer_addr(),
            conn: Some(ctx.connection()),
        }
    }

    /// A sender with no socket (the simulator's harness).
    #[cfg(test)]
    pub(crate) fn detached(conn_id: u64, peer: SocketAddr) -> Self {
        Self {
            conn_id,
            peer,
            conn: None,
        }
    }
}
