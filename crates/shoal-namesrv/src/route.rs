//! The name server's route table: which brokers exist, and which queues each serves per topic.
//!
//! Sans-IO: every method takes the current time in milliseconds, so expiry is tested without
//! sleeping. The table is owned by one lock in the server; nothing here blocks.

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use shoal_proto::constants::MASTER_ID;

/// The queues one broker serves for one topic (RocketMQ's `QueueData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueInfo {
    /// Readable queues (consumers).
    pub read_queue_nums: i32,
    /// Writable queues (producers).
    pub write_queue_nums: i32,
    /// Permission bits (`PERM_READ` 4, `PERM_WRITE` 2, `PERM_INHERIT` 1).
    pub perm: i32,
    /// Topic system flag.
    pub topic_sys_flag: i32,
}

/// One topic as a broker registers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRegistration {
    /// Topic name.
    pub topic: String,
    /// Its queues on the registering broker.
    pub queues: QueueInfo,
}

/// A broker group (one name, a master and maybe slaves) as routes show it (`BrokerData`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerInfo {
    /// Cluster the broker belongs to.
    pub cluster: String,
    /// Broker name.
    pub broker_name: String,
    /// Broker id (0 = master) to `ip:port`.
    pub broker_addrs: BTreeMap<i64, String>,
    /// Zone, if the broker registered one.
    pub zone_name: Option<String>,
    /// RocketMQ 5 acting-master switch, passed through.
    pub enable_acting_master: bool,
}

/// A topic's route: the broker groups serving it and their queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Broker name to queue info, sorted by broker name.
    pub queues: BTreeMap<String, QueueInfo>,
    /// The broker groups named in `queues`, sorted by broker name.
    pub brokers: Vec<BrokerInfo>,
}

/// What a broker sends when it registers (REGISTER_BROKER header and body, decoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRegistration {
    /// Cluster name.
    pub cluster: String,
    /// Broker address `ip:port`.
    pub broker_addr: String,
    /// Broker name.
    pub broker_name: String,
    /// Broker id (0 = master).
    pub broker_id: i64,
    /// HA address (reported back as is).
    pub ha_server_addr: String,
    /// Zone, if any (`__ZONE_NAME` ext field).
    pub zone_name: Option<String>,
    /// Expiry for this broker: it is dropped after this long without registering.
    pub heartbeat_timeout_ms: u64,
    /// Acting-master switch.
    pub enable_acting_master: bool,
    /// The broker's whole topic table (authoritative: topics missing here leave its routes).
    pub topics: Vec<TopicRegistration>,
    /// The broker's data version counter, to skip rewriting identical tables.
    pub data_version: Option<(i64, i64)>,
    /// The transport connection it came on, so a closed connection can expire it at once.
    pub connection_id: Option<u64>,
}

/// The answer to a registration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegisterResult {
    /// The master's address of this broker group, for a slave (empty for a master).
    pub master_addr: Option<String>,
    /// The master's HA address, for a slave.
    pub ha_server_addr: Option<String>,
}

#[derive(Debug, Clone)]
struct LiveBroker {
    last_update_ms: u64,
    timeout_ms: u64,
    ha_server_addr: String,
    data_version: Option<(i64, i64)>,
    connection_id: Option<u64>,
    broker_name: String,
    broker_id: i64,
}

/// A broker that left the table (expired, unregistered, connection closed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedBroker {
    /// Cluster name.
    pub cluster: String,
    /// Address.
    pub broker_addr: String,
    /// Broker name.
    pub broker_name: String,
}

/// The route table (RocketMQ's `RouteInfoManager`).
#[derive(Debug, Default)]
pub struct RouteTable {
    /// topic -> broker name -> queues.
    topic_queues: BTreeMap<String, BTreeMap<String, QueueInfo>>,
    /// broker name -> broker group.
    brokers: BTreeMap<String, BrokerInfo>,
    /// cluster -> broker names.
    clusters: BTreeMap<String, BTreeSet<String>>,
    /// (cluster, broker address) -> liveness.
    live: HashMap<(String, String), LiveBroker>,
}

impl RouteTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or refreshes) a broker and, for a master, its topic table.
    pub fn register(&mut self, reg: BrokerRegistration, now_ms: u64) -> RegisterResult {
        let key = (reg.cluster.clone(), reg.broker_addr.clone());
        self.clusters
            .entry(reg.cluster.clone())
            .or_default()
            .insert(reg.broker_name.clone());

        let broker = self
            .brokers
            .entry(reg.broker_name.clone())
            .or_insert_with(|| BrokerInfo {
                cluster: reg.cluster.clone(),
                broker_name: reg.broker_name.clone(),
                broker_addrs: BTreeMap::new(),
                zone_name: reg.zone_name.clone(),
                enable_acting_master: reg.enable_acting_master,
            });
        broker.enable_acting_master = reg.enable_acting_master;
        if reg.zone_name.is_some() {
            broker.zone_name = reg.zone_name.clone();
        }
        // One address has one id: a broker that changed role replaces its old entry.
        broker
            .broker_addrs
            .retain(|id, addr| *addr != reg.broker_addr || *id == reg.broker_id);
        broker
            .broker_addrs
            .insert(reg.broker_id, reg.broker_addr.clone());

        let previous = self.live.get(&key);
        let changed =
            previous.is_none_or(|p| p.data_version != reg.data_version || p.data_version.is_none());
        if reg.broker_id == MASTER_ID && changed {
            self.replace_topics_of(&reg.broker_name, &reg.topics);
        }
        self.live.insert(
            key,
            LiveBroker {
                last_update_ms: now_ms,
                timeout_ms: reg.heartbeat_timeout_ms,
                ha_server_addr: reg.ha_server_addr.clone(),
                data_version: reg.data_version,
                connection_id: reg.connection_id,
                broker_name: reg.broker_name.clone(),
                broker_id: reg.broker_id,
            },
        );

        if reg.broker_id == MASTER_ID {
            return RegisterResult::default();
        }
        let master_addr = self
            .brokers
            .get(&reg.broker_name)
            .and_then(|b| b.broker_addrs.get(&MASTER_ID))
            .cloned();
        let ha = master_addr.as_ref().and_then(|m| {
            self.live
                .get(&(reg.cluster.clone(), m.clone()))
                .map(|l| l.ha_server_addr.clone())
        });
        RegisterResult {
            master_addr,
            ha_server_addr: ha,
        }
    }

    fn replace_topics_of(&mut self, broker_name: &str, topics: &[TopicRegistration]) {
        let wanted: BTreeSet<&str> = topics.iter().map(|t| t.topic.as_str()).collect();
        self.topic_queues.retain(|topic, by_broker| {
            if !wanted.contains(topic.as_str()) {
                by_broker.remove(broker_name);
            }
            !by_broker.is_empty()
        });
        for t in topics {
            self.topic_queues
                .entry(t.topic.clone())
                .or_default()
                .insert(broker_name.to_string(), t.queues.clone());
        }
    }

    /// Refreshes a broker's liveness without changing its topics (BROKER_HEARTBEAT).
    pub fn touch(&mut self, cluster: &str, broker_addr: &str, now_ms: u64) -> bool {
        match self
            .live
            .get_mut(&(cluster.to_string(), broker_addr.to_string()))
        {
            Some(l) => {
                l.last_update_ms = now_ms;
                true
            }
            None => false,
        }
    }

    /// Removes one broker address; a broker group with no address left leaves every route.
    pub fn unregister(
        &mut self,
        cluster: &str,
        broker_addr: &str,
        broker_name: &str,
        broker_id: i64,
    ) -> Option<RemovedBroker> {
        let removed = self
            .live
            .remove(&(cluster.to_string(), broker_addr.to_string()))
            .is_some();
        let mut group_gone = false;
        if let Some(b) = self.brokers.get_mut(broker_name) {
            if b.broker_addrs.get(&broker_id).map(String::as_str) == Some(broker_addr) {
                b.broker_addrs.remove(&broker_id);
            }
            group_gone = b.broker_addrs.is_empty();
        }
        if group_gone {
            self.brokers.remove(broker_name);
            if let Some(names) = self.clusters.get_mut(cluster) {
                names.remove(broker_name);
                if names.is_empty() {
                    self.clusters.remove(cluster);
                }
            }
            self.topic_queues.retain(|_, by_broker| {
                by_broker.remove(broker_name);
                !by_broker.is_empty()
            });
        }
        removed.then(|| RemovedBroker {
            cluster: cluster.to_string(),
            broker_addr: broker_addr.to_string(),
            broker_name: broker_name.to_string(),
        })
    }

    /// Drops every broker whose last registration is older than its timeout.
    pub fn expire(&mut self, now_ms: u64) -> Vec<RemovedBroker> {
        let dead: Vec<(String, String, String, i64)> = self
            .live
            .iter()
            .filter(|(_, l)| now_ms.saturating_sub(l.last_update_ms) > l.timeout_ms)
            .map(|((c, a), l)| (c.clone(), a.clone(), l.broker_name.clone(), l.broker_id))
            .collect();
        dead.into_iter()
            .filter_map(|(c, a, n, id)| self.unregister(&c, &a, &n, id))
            .collect()
    }

    /// Drops the brokers that registered over a connection that has closed.
    pub fn connection_closed(&mut self, connection_id: u64) -> Vec<RemovedBroker> {
        let dead: Vec<(String, String, String, i64)> = self
            .live
            .iter()
            .filter(|(_, l)| l.connection_id == Some(connection_id))
            .map(|((c, a), l)| (c.clone(), a.clone(), l.broker_name.clone(), l.broker_id))
            .collect();
        dead.into_iter()
            .filter_map(|(c, a, n, id)| self.unregister(&c, &a, &n, id))
            .collect()
    }

    /// The route of a topic, or `None` when no live broker serves it.
    pub fn route(&self, topic: &str) -> Option<Route> {
        let queues = self.topic_queues.get(topic)?;
        let brokers: Vec<BrokerInfo> = queues
            .keys()
            .filter_map(|name| self.brokers.get(name).cloned())
            .collect();
        if brokers.is_empty() {
            return None;
        }
        Some(Route {
            queues: queues.clone(),
            brokers,
        })
    }

    /// True when a broker group of this name is registered.
    pub fn has_broker(&self, broker_name: &str) -> bool {
        self.brokers.contains_key(broker_name)
    }

    /// Every topic with at least one broker.
    pub fn topics(&self) -> Vec<String> {
        self.topic_queues.keys().cloned().collect()
    }

    /// Topics served by brokers of one cluster.
    pub fn topics_of_cluster(&self, cluster: &str) -> Vec<String> {
        let Some(names) = self.clusters.get(cluster) else {
            return Vec::new();
        };
        self.topic_queues
            .iter()
            .filter(|(_, by_broker)| by_broker.keys().any(|b| names.contains(b)))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Removes a topic from the routes (of the brokers of `cluster`, or of every broker).
    pub fn delete_topic(&mut self, topic: &str, cluster: Option<&str>) -> bool {
        match cluster {
            None => self.topic_queues.remove(topic).is_some(),
            Some(c) => {
                let Some(names) = self.clusters.get(c) else {
                    return false;
                };
                let Some(by_broker) = self.topic_queues.get_mut(topic) else {
                    return false;
                };
                let before = by_broker.len();
                by_broker.retain(|b, _| !names.contains(b));
                let changed = by_broker.len() != before;
                if by_broker.is_empty() {
                    self.topic_queues.remove(topic);
                }
                changed
            }
        }
    }

    /// Broker groups by name, and broker names by cluster (GET_BROKER_CLUSTER_INFO).
    pub fn cluster_info(
        &self,
    ) -> (
        BTreeMap<String, BrokerInfo>,
        BTreeMap<String, BTreeSet<String>>,
    ) {
        (self.brokers.clone(), self.clusters.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(name: &str, addr: &str, id: i64, topics: &[(&str, i32)]) -> BrokerRegistration {
        BrokerRegistration {
            cluster: "DefaultCluster".into(),
            broker_addr: addr.into(),
            broker_name: name.into(),
            broker_id: id,
            ha_server_addr: format!("{addr}-ha"),
            zone_name: None,
            heartbeat_timeout_ms: 120_000,
            enable_acting_master: false,
            topics: topics
                .iter()
                .map(|(t, n)| TopicRegistration {
                    topic: (*t).into(),
                    queues: QueueInfo {
                        read_queue_nums: *n,
                        write_queue_nums: *n,
                        perm: 6,
                        topic_sys_flag: 0,
                    },
                })
                .collect(),
            data_version: None,
            connection_id: Some(1),
        }
    }

    #[test]
    fn route_lists_every_broker_of_a_topic() {
        let mut t = RouteTable::new();
        t.register(reg("broker-b", "127.0.0.1:2", 0, &[("T", 8)]), 0);
        t.register(reg("broker-a", "127.0.0.1:1", 0, &[("T", 4), ("U", 1)]), 0);
        let r = t.route("T").unwrap();
        assert_eq!(r.brokers.len(), 2);
        assert_eq!(r.brokers[0].broker_name, "broker-a");
        assert_eq!(r.queues["broker-b"].write_queue_nums, 8);
        assert!(t.route("nope").is_none());
        assert_eq!(t.topics(), ["T", "U"]);
    }

    #[test]
    fn slave_learns_master_and_does_not_change_topics() {
        let mut t = RouteTable::new();
        t.register(reg("broker-a", "127.0.0.1:1", 0, &[("T", 4)]), 0);
        let r = t.register(reg("broker-a", "127.0.0.1:3", 1, &[("X", 4)]), 0);
        assert_eq!(r.master_addr.as_deref(), Some("127.0.0.1:1"));
        assert_eq!(r.ha_server_addr.as_deref(), Some("127.0.0.1:1-ha"));
        assert!(t.route("X").is_none());
        assert_eq!(t.route("T").unwrap().brokers[0].broker_addrs.len(), 2);
    }

    #[test]
    fn registration_is_authoritative_for_the_topic_table() {
        let mut t = RouteTable::new();
        t.register(reg("broker-a", "127.0.0.1:1", 0, &[("T", 4), ("U", 4)]), 0);
        t.register(reg("broker-a", "127.0.0.1:1", 0, &[("T", 4)]), 10);
        assert!(t.route("U").is_none());
        assert!(t.route("T").is_some());
    }

    #[test]
    fn expiry_and_unregister_remove_routes() {
        let mut t = RouteTable::new();
        t.register(reg("broker-a", "127.0.0.1:1", 0, &[("T", 4)]), 0);
        t.register(reg("broker-b", "127.0.0.1:2", 0, &[("T", 4)]), 100_000);
        assert!(t.expire(120_000).is_empty());
        let gone = t.expire(120_001);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].broker_name, "broker-a");
        let r = t.route("T").unwrap();
        assert_eq!(r.brokers.len(), 1);
        assert!(!r.queues.contains_key("broker-a"));
        assert!(t
            .unregister("DefaultCluster", "127.0.0.1:2", "broker-b", 0)
            .is_some());
        assert!(t.route("T").is_none());
        assert!(t.cluster_info().1.is_empty());
    }

    #[test]
    fn closed_connection_removes_its_brokers() {
        let mut t = RouteTable::new();
        let mut r = reg("broker-a", "127.0.0.1:1", 0, &[("T", 4)]);
        r.connection_id = Some(7);
        t.register(r, 0);
        assert!(t.connection_closed(8).is_empty());
        assert_eq!(t.connection_closed(7).len(), 1);
        assert!(t.route("T").is_none());
    }

    #[test]
    fn delete_topic_by_cluster() {
        let mut t = RouteTable::new();
        t.register(reg("broker-a", "127.0.0.1:1", 0, &[("T", 4)]), 0);
        assert!(!t.delete_topic("T", Some("Other")));
        assert!(t.delete_topic("T", Some("DefaultCluster")));
        assert!(t.route("T").is_none());
        assert_eq!(t.topics_of_cluster("DefaultCluster"), Vec::<String>::new());
    }
}
