//! Which connection each broker's requests came on, so that a closed connection is seen as
//! that broker's death at once (DESIGN.md section 7), not a session later.
//!
//! A broker calls every voter on one connection per voter, for all of its requests, so the
//! connection a broker's latest request came on stands for the broker. When a connection
//! closes, the brokers whose latest request came on it are reported (for
//! [`super::ControllerNode::handle_broker_disconnected`]); a broker that has already spoken on
//! a newer connection (a restarted process, a reconnect) is not.
//!
//! Bounded: at most `max_per_connection` brokers per connection (a broker process is one
//! broker; more on one connection are not tracked, and are then seen dead after the session
//! timeout as before), and an entry per broker only while its connection is open. The caller
//! records only brokers the metadata knows, so the number of brokers is bounded by the
//! metadata's limits and the number of connections by the listener's.

use crate::BrokerId;
use std::collections::{BTreeSet, HashMap};

/// A connection's id, unique within the process.
pub type ConnectionId = u64;

/// Brokers by the connection their latest request came on (sans-IO).
#[derive(Debug, Clone)]
pub struct BrokerConnections {
    by_conn: HashMap<ConnectionId, BTreeSet<(String, BrokerId)>>,
    latest: HashMap<(String, BrokerId), ConnectionId>,
    max_per_connection: usize,
}

impl BrokerConnections {
    /// Tracks at most `max_per_connection` brokers per connection.
    pub fn new(max_per_connection: usize) -> Self {
        Self {
            by_conn: HashMap::new(),
            latest: HashMap::new(),
            max_per_connection,
        }
    }

    /// A request of broker `broker` of `group` came on `conn`.
    pub fn seen(&mut self, conn: ConnectionId, group: &str, broker: BrokerId) {
        let key = (group.to_string(), broker);
        if self.latest.get(&key) == Some(&conn) {
            return;
        }
        let set = self.by_conn.entry(conn).or_default();
        if set.len() >= self.max_per_connection {
            return;
        }
        set.insert(key.clone());
        if let Some(old) = self.latest.insert(key.clone(), conn) {
            if let Some(s) = self.by_conn.get_mut(&old) {
                s.remove(&key);
                if s.is_empty() {
                    self.by_conn.remove(&old);
                }
            }
        }
    }

    /// `conn` closed: the brokers whose latest request came on it, now forgotten.
    #[must_use]
    pub fn closed(&mut self, conn: ConnectionId) -> Vec<(String, BrokerId)> {
        let Some(set) = self.by_conn.remove(&conn) else {
            return Vec::new();
        };
        for key in &set {
            self.latest.remove(key);
        }
        set.into_iter().collect()
    }

    /// The connection broker `broker` of `group` last spoke on, while it is open.
    pub fn connection_of(&self, group: &str, broker: BrokerId) -> Option<ConnectionId> {
        self.latest.get(&(group.to_string(), broker)).copied()
    }

    /// Connections tracked now.
    pub fn connections(&self) -> usize {
        self.by_conn.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_connection_names_the_brokers_last_heard_on_it() {
        let mut c = BrokerConnections::new(4);
        c.seen(1, "a", 1);
        c.seen(1, "a", 1);
        c.seen(2, "a", 2);
        assert_eq!(c.closed(1), vec![("a".to_string(), 1)]);
        assert!(c.closed(1).is_empty());
        assert_eq!(c.connections(), 1);
        assert_eq!(c.closed(2), vec![("a".to_string(), 2)]);
        assert_eq!(c.connections(), 0);
    }

    #[test]
    fn a_broker_that_moved_to_a_newer_connection_is_not_reported() {
        let mut c = BrokerConnections::new(4);
        c.seen(1, "a", 1);
        c.seen(1, "b", 1);
        // Broker a/1 restarted: its new connection spoke before the old one's close was seen.
        c.seen(7, "a", 1);
        assert_eq!(c.connection_of("a", 1), Some(7));
        assert_eq!(c.closed(1), vec![("b".to_string(), 1)]);
        assert_eq!(c.closed(7), vec![("a".to_string(), 1)]);
        assert!(c.closed(9).is_empty());
    }

    #[test]
    fn brokers_beyond_the_bound_of_a_connection_are_not_tracked() {
        let mut c = BrokerConnections::new(2);
        for b in 1..=5 {
            c.seen(1, "a", b);
        }
        assert_eq!(c.closed(1).len(), 2);
    }
}
