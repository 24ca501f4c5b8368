//! The client connections the broker may call back on (those of clients that heartbeated), and
//! where the broker's notices to clients go ([`NoticeSink`]): over those connections in a
//! running broker, into a list in the simulator's harness.

use parking_lot::Mutex;
use shoal_net::Connection;
use shoal_proto::RemotingCommand;
use std::collections::HashMap;
use tracing::debug;

/// Where oneway notices to clients go (NOTIFY_CONSUMER_IDS_CHANGED, NOTIFY_LOCK_FREED,
/// GROUP_ASSIGNMENT_CHANGED).
pub(crate) trait NoticeSink: Send + Sync + std::fmt::Debug {
    /// Sends `req` (oneway) to the client on connection `conn_id`; false when that client is
    /// gone. Never blocks.
    fn notify(&self, conn_id: u64, req: RemotingCommand) -> bool;
}

/// Connections of clients that heartbeated, by connection id.
#[derive(Debug, Default)]
pub(crate) struct Connections {
    map: Mutex<HashMap<u64, Connection>>,
}

impl Connections {
    /// Remembers a client's connection (so notices and admin requests can reach it).
    pub(crate) fn remember(&self, conn: &Connection) {
        self.map
            .lock()
            .entry(conn.id())
            .or_insert_with(|| conn.clone());
    }

    /// A connection closed.
    pub(crate) fn forget(&self, conn_id: u64) {
        self.map.lock().remove(&conn_id);
    }

    /// A client's connection, if it is still open.
    pub(crate) fn get(&self, conn_id: u64) -> Option<Connection> {
        self.map.lock().get(&conn_id).cloned()
    }

    /// How many are open.
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }
}

impl NoticeSink for Connections {
    fn notify(&self, conn_id: u64, req: RemotingCommand) -> bool {
        let Some(conn) = self.get(conn_id) else {
            return false;
        };
        tokio::spawn(async move {
            if let Err(e) = conn.oneway(req).await {
                debug!(peer = %conn.peer_addr(), error = %e, "a notice to a client was not sent");
            }
        });
        true
    }
}
