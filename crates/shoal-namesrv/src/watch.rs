//! Which client connections watch which topics' routes (Shoal's pushed routes,
//! `shoal_proto::route_watch`), and who is told when routes change.
//!
//! Sans-IO: the table keeps a handle per connection (`C`, a `shoal_net::Connection` in the
//! server) and answers "whom to tell about these topics"; the server sends. Bounded by
//! construction: at most `max_total` (connection, topic) watches in all and
//! `max_per_connection` per connection; a watch over either limit is refused (the client keeps
//! its periodic route poll) and counted.

use std::collections::{BTreeSet, HashMap};

/// The two limits of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchLimit {
    /// `max_route_watches`: watches over every connection.
    Total,
    /// `max_route_watches_per_connection`.
    PerConnection,
}

impl WatchLimit {
    /// The configuration key of the limit (the metric's label).
    pub fn key(self) -> &'static str {
        match self {
            WatchLimit::Total => "max_route_watches",
            WatchLimit::PerConnection => "max_route_watches_per_connection",
        }
    }
}

/// The outcome of a watch request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// The connection watches the topic now (or did already).
    Watching,
    /// Refused by a limit.
    Refused(WatchLimit),
}

#[derive(Debug)]
struct Watcher<C> {
    handle: C,
    topics: BTreeSet<String>,
}

/// The watch table.
#[derive(Debug)]
pub struct RouteWatches<C> {
    by_conn: HashMap<u64, Watcher<C>>,
    by_topic: HashMap<String, BTreeSet<u64>>,
    total: usize,
    max_total: usize,
    max_per_connection: usize,
    refused_total: u64,
    refused_per_connection: u64,
}

impl<C: Clone> RouteWatches<C> {
    /// An empty table with these limits.
    pub fn new(max_total: usize, max_per_connection: usize) -> Self {
        Self {
            by_conn: HashMap::new(),
            by_topic: HashMap::new(),
            total: 0,
            max_total,
            max_per_connection,
            refused_total: 0,
            refused_per_connection: 0,
        }
    }

    /// Connection `conn_id` (reachable through `handle`) watches `topic`.
    pub fn watch(&mut self, conn_id: u64, handle: &C, topic: &str) -> Watch {
        let held = self.by_conn.get(&conn_id).map_or(0, |w| w.topics.len());
        if self
            .by_conn
            .get(&conn_id)
            .is_some_and(|w| w.topics.contains(topic))
        {
            return Watch::Watching;
        }
        if held >= self.max_per_connection {
            self.refused_per_connection += 1;
            return Watch::Refused(WatchLimit::PerConnection);
        }
        if self.total >= self.max_total {
            self.refused_total += 1;
            return Watch::Refused(WatchLimit::Total);
        }
        self.by_conn
            .entry(conn_id)
            .or_insert_with(|| Watcher {
                handle: handle.clone(),
                topics: BTreeSet::new(),
            })
            .topics
            .insert(topic.to_string());
        self.by_topic
            .entry(topic.to_string())
            .or_default()
            .insert(conn_id);
        self.total += 1;
        Watch::Watching
    }

    /// A connection closed: its watches end.
    pub fn forget(&mut self, conn_id: u64) {
        let Some(w) = self.by_conn.remove(&conn_id) else {
            return;
        };
        self.total -= w.topics.len();
        for t in w.topics {
            if let Some(conns) = self.by_topic.get_mut(&t) {
                conns.remove(&conn_id);
                if conns.is_empty() {
                    self.by_topic.remove(&t);
                }
            }
        }
    }

    /// Whom to tell that `changed` topics' routes changed: each watching connection once,
    /// with the changed topics it watches (sorted).
    pub fn notices<'a>(
        &self,
        changed: impl IntoIterator<Item = &'a String>,
    ) -> Vec<(C, Vec<String>)> {
        let mut per_conn: HashMap<u64, Vec<String>> = HashMap::new();
        for topic in changed {
            for conn in self.by_topic.get(topic).into_iter().flatten() {
                per_conn.entry(*conn).or_default().push(topic.clone());
            }
        }
        let mut out: Vec<(u64, C, Vec<String>)> = per_conn
            .into_iter()
            .filter_map(|(conn, mut topics)| {
                let w = self.by_conn.get(&conn)?;
                topics.sort();
                topics.dedup();
                Some((conn, w.handle.clone(), topics))
            })
            .collect();
        out.sort_by_key(|(conn, _, _)| *conn);
        out.into_iter().map(|(_, h, t)| (h, t)).collect()
    }

    /// Watches held now (connection, topic pairs).
    pub fn len(&self) -> usize {
        self.total
    }

    /// True when nothing is watched.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Connections watching something.
    pub fn connections(&self) -> usize {
        self.by_conn.len()
    }

    /// Watches refused so far by `limit`.
    pub fn refused(&self, limit: WatchLimit) -> u64 {
        match limit {
            WatchLimit::Total => self.refused_total,
            WatchLimit::PerConnection => self.refused_per_connection,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(topics: &[&str]) -> Vec<String> {
        topics.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn notices_go_to_the_watchers_of_changed_topics_once_each() {
        let mut w = RouteWatches::new(100, 10);
        assert_eq!(w.watch(1, &"c1", "A"), Watch::Watching);
        assert_eq!(w.watch(1, &"c1", "B"), Watch::Watching);
        assert_eq!(w.watch(1, &"c1", "B"), Watch::Watching);
        assert_eq!(w.watch(2, &"c2", "B"), Watch::Watching);
        assert_eq!(w.len(), 3);
        let n = w.notices(&set(&["B", "A", "C"]));
        assert_eq!(n, vec![("c1", set(&["A", "B"])), ("c2", set(&["B"]))]);
        assert!(w.notices(&set(&["C"])).is_empty());
        w.forget(1);
        assert_eq!(w.len(), 1);
        assert_eq!(w.connections(), 1);
        assert_eq!(w.notices(&set(&["A", "B"])), vec![("c2", set(&["B"]))]);
        w.forget(2);
        assert!(w.is_empty());
        assert!(w.by_topic.is_empty());
    }

    #[test]
    fn limits_refuse_and_count() {
        let mut w = RouteWatches::new(3, 2);
        assert_eq!(w.watch(1, &1, "A"), Watch::Watching);
        assert_eq!(w.watch(1, &1, "B"), Watch::Watching);
        assert_eq!(
            w.watch(1, &1, "C"),
            Watch::Refused(WatchLimit::PerConnection)
        );
        // A topic already watched is no new watch.
        assert_eq!(w.watch(1, &1, "A"), Watch::Watching);
        assert_eq!(w.watch(2, &2, "A"), Watch::Watching);
        assert_eq!(w.watch(3, &3, "A"), Watch::Refused(WatchLimit::Total));
        assert_eq!(w.refused(WatchLimit::PerConnection), 1);
        assert_eq!(w.refused(WatchLimit::Total), 1);
        assert_eq!(w.len(), 3);
        w.forget(1);
        assert_eq!(w.watch(3, &3, "A"), Watch::Watching);
    }
}
