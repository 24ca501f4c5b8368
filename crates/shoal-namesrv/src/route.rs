//! The name server's route table: which brokers exist, and which queues each serves per topic.
//!
//! Sans-IO: every method takes the current time in milliseconds, so expiry is tested without
//! sleeping. The table is owned by one lock in the server; nothing here blocks.

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use shoal_proto::body::KafkaListener;
use shoal_proto::constants::perm::PERM_WRITE;
pub use shoal_proto::constants::MASTER_ID;

/// Topics whose route changed (what a route watcher is told).
pub type ChangedTopics = BTreeSet<String>;

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
    /// Broker address → the Kafka listener that broker registered (Shoal brokers only).
    pub kafka_listeners: BTreeMap<String, KafkaListener>,
}

impl BrokerInfo {
    /// The Kafka listeners by broker id (as routes show them), for the ids that have one.
    pub fn kafka_by_id(&self) -> BTreeMap<i64, KafkaListener> {
        self.broker_addrs
            .iter()
            .filter_map(|(id, addr)| self.kafka_listeners.get(addr).map(|k| (*id, k.clone())))
            .collect()
    }
}

/// A topic's route: the broker groups serving it and their queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Broker name to queue info, sorted by broker name.
    pub queues: BTreeMap<String, QueueInfo>,
    /// The broker groups named in `queues`, sorted by broker name.
    pub brokers: Vec<BrokerInfo>,
    /// Broker groups that left while serving the topic, with their queue count (Kafka's
    /// partition numbering keeps their place; see [`RouteTable`]).
    pub departed: BTreeMap<String, i32>,
}

/// Most (topic, broker group) places of departed broker groups kept ([`RouteTable`]); past
/// it, a departure is not recorded (and logged).
pub const MAX_DEPARTED_SLOTS: usize = 100_000;

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
    /// The broker's Kafka listener, if it runs one (Shoal's extension).
    pub kafka: Option<KafkaListener>,
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
    /// Topics whose route this registration changed: a broker that was not registered, a
    /// broker group whose addresses changed, topics added to or removed from the broker, or
    /// their queue counts or permissions changed. Empty for a periodic registration that
    /// changed nothing.
    pub changed_topics: ChangedTopics,
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
    /// Topics whose route changed because it left (those its broker group served).
    pub changed_topics: ChangedTopics,
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
    /// Broker names whose write permission was wiped (WIPE_WRITE_PERM_OF_BROKER): their
    /// queues are served read-only until ADD_WRITE_PERM_OF_BROKER or until the broker group
    /// leaves the table (a restarted broker registers writable, as in RocketMQ). The topics'
    /// registered permissions are kept as registered, so restoring gives them back exactly.
    write_wiped: BTreeSet<String>,
    /// topic -> broker name -> queue count, for broker groups that left the table while
    /// serving the topic (expired, unregistered, connection closed): Kafka clients number a
    /// topic's partitions over its broker groups in name order, and a group that is gone
    /// keeps its place (its partitions reported without a leader) until it registers the
    /// topic again or the topic is deleted, so no other partition is renumbered.
    departed: BTreeMap<String, BTreeMap<String, i32>>,
    /// Entries of `departed`, at most [`MAX_DEPARTED_SLOTS`].
    departed_len: usize,
}

impl RouteTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or refreshes) a broker and, for a master, its topic table.
    pub fn register(&mut self, reg: BrokerRegistration, now_ms: u64) -> RegisterResult {
        let key = (reg.cluster.clone(), reg.broker_addr.clone());
        let info_before = self.brokers.get(&reg.broker_name).cloned();
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
                kafka_listeners: BTreeMap::new(),
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
        match &reg.kafka {
            Some(k) => {
                broker
                    .kafka_listeners
                    .insert(reg.broker_addr.clone(), k.clone());
            }
            None => {
                broker.kafka_listeners.remove(&reg.broker_addr);
            }
        }

        let previous = self.live.get(&key);
        // A broker that registered as a replica and now registers as the master (elected, or
        // restarted before it knew its role) brings its table as the master's, whatever its
        // data version (RocketMQ takes a master's topics the first time it takes that id).
        let data_changed = previous.is_none_or(|p| {
            p.data_version != reg.data_version
                || p.data_version.is_none()
                || p.broker_id != reg.broker_id
        });
        let mut changed_topics = ChangedTopics::new();
        if reg.broker_id == MASTER_ID && data_changed {
            changed_topics = self.replace_topics_of(&reg.broker_name, &reg.topics);
        }
        if info_before.as_ref() != self.brokers.get(&reg.broker_name) {
            // The broker group's addresses (or zone) changed: every route naming it changed.
            changed_topics.extend(self.topics_served_by(&reg.broker_name));
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
            return RegisterResult {
                changed_topics,
                ..RegisterResult::default()
            };
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
            changed_topics,
        }
    }

    /// Replaces a broker's topics with the registered ones; returns the topics whose queues
    /// on that broker changed (added, removed, other counts or permission).
    fn replace_topics_of(
        &mut self,
        broker_name: &str,
        topics: &[TopicRegistration],
    ) -> ChangedTopics {
        let mut changed = ChangedTopics::new();
        let wanted: BTreeSet<&str> = topics.iter().map(|t| t.topic.as_str()).collect();
        self.topic_queues.retain(|topic, by_broker| {
            if !wanted.contains(topic.as_str()) && by_broker.remove(broker_name).is_some() {
                changed.insert(topic.clone());
            }
            !by_broker.is_empty()
        });
        for t in topics {
            self.forget_departed(&t.topic, Some(broker_name));
            let by_broker = self.topic_queues.entry(t.topic.clone()).or_default();
            if by_broker.get(broker_name) != Some(&t.queues) {
                by_broker.insert(broker_name.to_string(), t.queues.clone());
                changed.insert(t.topic.clone());
            }
        }
        changed
    }

    /// Forgets departed places of `topic` (of one broker group, or all).
    fn forget_departed(&mut self, topic: &str, broker_name: Option<&str>) {
        let Some(slots) = self.departed.get_mut(topic) else {
            return;
        };
        let before = slots.len();
        match broker_name {
            Some(b) => {
                slots.remove(b);
            }
            None => slots.clear(),
        }
        self.departed_len -= before - slots.len();
        if slots.is_empty() {
            self.departed.remove(topic);
        }
    }

    /// Places of departed broker groups kept now (for the metric).
    pub fn departed_slots(&self) -> usize {
        self.departed_len
    }

    /// The topics a broker group serves queues of.
    fn topics_served_by(&self, broker_name: &str) -> ChangedTopics {
        self.topic_queues
            .iter()
            .filter(|(_, by_broker)| by_broker.contains_key(broker_name))
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Topics of a broker group whose registered permission lets producers write.
    fn writable_topics_of(&self, broker_name: &str) -> ChangedTopics {
        self.topic_queues
            .iter()
            .filter(|(_, by_broker)| {
                by_broker
                    .get(broker_name)
                    .is_some_and(|q| q.perm & PERM_WRITE != 0)
            })
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// WIPE_WRITE_PERM_OF_BROKER: the broker group's queues are served without the write
    /// permission (producers stop sending there, consumers keep reading), through every
    /// registration, until [`RouteTable::add_write_perm`] or until the group leaves the
    /// table. Returns the topics that lost the write permission (none when the broker is
    /// unknown or already wiped).
    pub fn wipe_write_perm(&mut self, broker_name: &str) -> ChangedTopics {
        if !self.brokers.contains_key(broker_name) || self.write_wiped.contains(broker_name) {
            return ChangedTopics::new();
        }
        self.write_wiped.insert(broker_name.to_string());
        self.writable_topics_of(broker_name)
    }

    /// ADD_WRITE_PERM_OF_BROKER: undoes [`RouteTable::wipe_write_perm`]; the topics get the
    /// permissions the broker registered back. Returns the topics that are writable again.
    pub fn add_write_perm(&mut self, broker_name: &str) -> ChangedTopics {
        if !self.write_wiped.remove(broker_name) {
            return ChangedTopics::new();
        }
        self.writable_topics_of(broker_name)
    }

    /// True while a broker group's write permission is wiped.
    pub fn is_write_wiped(&self, broker_name: &str) -> bool {
        self.write_wiped.contains(broker_name)
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
        let mut addr_gone = false;
        if let Some(b) = self.brokers.get_mut(broker_name) {
            if b.broker_addrs.get(&broker_id).map(String::as_str) == Some(broker_addr) {
                b.broker_addrs.remove(&broker_id);
                b.kafka_listeners.remove(broker_addr);
                addr_gone = true;
            }
            group_gone = b.broker_addrs.is_empty();
        }
        let changed_topics = if addr_gone || group_gone {
            self.topics_served_by(broker_name)
        } else {
            ChangedTopics::new()
        };
        if group_gone {
            self.brokers.remove(broker_name);
            self.write_wiped.remove(broker_name);
            if let Some(names) = self.clusters.get_mut(cluster) {
                names.remove(broker_name);
                if names.is_empty() {
                    self.clusters.remove(cluster);
                }
            }
            let departed = &mut self.departed;
            let departed_len = &mut self.departed_len;
            self.topic_queues.retain(|topic, by_broker| {
                if let Some(q) = by_broker.remove(broker_name) {
                    let slots = departed.entry(topic.clone()).or_default();
                    if slots.contains_key(broker_name) || *departed_len < MAX_DEPARTED_SLOTS {
                        if slots
                            .insert(
                                broker_name.to_string(),
                                q.read_queue_nums.max(q.write_queue_nums),
                            )
                            .is_none()
                        {
                            *departed_len += 1;
                        }
                    } else {
                        tracing::warn!(topic = %topic, broker = %broker_name, limit = MAX_DEPARTED_SLOTS, "departed broker group not remembered for Kafka's numbering: limit reached");
                    }
                    if slots.is_empty() {
                        departed.remove(topic);
                    }
                }
                !by_broker.is_empty()
            });
        }
        removed.then(|| RemovedBroker {
            cluster: cluster.to_string(),
            broker_addr: broker_addr.to_string(),
            broker_name: broker_name.to_string(),
            changed_topics,
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
        let queues = queues
            .iter()
            .map(|(name, q)| {
                let mut q = q.clone();
                if self.write_wiped.contains(name) {
                    q.perm &= !PERM_WRITE;
                }
                (name.clone(), q)
            })
            .collect();
        Some(Route {
            queues,
            brokers,
            departed: self.departed.get(topic).cloned().unwrap_or_default(),
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
        self.forget_departed(topic, None);
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
            kafka: None,
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
    fn topics(list: &[&str]) -> ChangedTopics {
        list.iter().map(|t| t.to_string()).collect()
    }

    /// A broker registered as a replica (id 1) while its group has no master, then as the
    /// master (id 0) with the same data version: its topics are the group's route.
    #[test]
    fn a_replica_that_registers_again_as_master_brings_its_topics() {
        let mut t = RouteTable::new();
        let mut a = reg("broker-a", "127.0.0.1:1", 1, &[("T", 4)]);
        a.data_version = Some((7, 7));
        assert!(t.register(a.clone(), 0).changed_topics.is_empty());
        a.broker_id = 0;
        assert_eq!(t.register(a.clone(), 10).changed_topics, topics(&["T"]));
        // Periodic registrations as master after that: nothing new.
        assert!(t.register(a, 20).changed_topics.is_empty());
    }

    #[test]
    fn registrations_report_the_topics_whose_route_changed() {
        let mut t = RouteTable::new();
        let mut a = reg("broker-a", "127.0.0.1:1", 0, &[("T", 4), ("U", 4)]);
        a.data_version = Some((1, 1));
        // A new broker: every topic it serves.
        assert_eq!(t.register(a.clone(), 0).changed_topics, topics(&["T", "U"]));
        // The periodic registration, same data version: nothing.
        assert!(t.register(a.clone(), 10).changed_topics.is_empty());
        // A new data version with the same table (no data version at all, likewise): nothing.
        a.data_version = Some((1, 2));
        assert!(t.register(a.clone(), 20).changed_topics.is_empty());
        let mut none = a.clone();
        none.data_version = None;
        assert!(t.register(none, 25).changed_topics.is_empty());
        // U grows, V is added, T leaves.
        let mut a2 = reg("broker-a", "127.0.0.1:1", 0, &[("U", 8), ("V", 1)]);
        a2.data_version = Some((1, 3));
        assert_eq!(
            t.register(a2.clone(), 30).changed_topics,
            topics(&["T", "U", "V"])
        );
        // A permission change is a change.
        a2.topics[0].queues.perm = 4;
        a2.data_version = Some((1, 4));
        assert_eq!(t.register(a2, 40).changed_topics, topics(&["U"]));
        // A second broker on U: only U (and its own new topic) changed.
        let b = reg("broker-b", "127.0.0.1:2", 0, &[("U", 2)]);
        assert_eq!(t.register(b, 50).changed_topics, topics(&["U"]));
        // A slave of broker-a joins: the broker group's addresses are in every route of it.
        let slave = reg("broker-a", "127.0.0.1:3", 1, &[]);
        assert_eq!(
            t.register(slave.clone(), 60).changed_topics,
            topics(&["U", "V"])
        );
        assert!(t.register(slave, 70).changed_topics.is_empty());
        // The slave leaves: the same routes change back.
        let gone = t
            .unregister("DefaultCluster", "127.0.0.1:3", "broker-a", 1)
            .unwrap();
        assert_eq!(gone.changed_topics, topics(&["U", "V"]));
        // The master expires: its topics.
        let expired = t.expire(40 + 120_001);
        let names: Vec<&str> = expired.iter().map(|b| b.broker_name.as_str()).collect();
        assert_eq!(names, ["broker-a"]);
        assert_eq!(expired[0].changed_topics, topics(&["U", "V"]));
        assert!(t.route("V").is_none());
    }

    #[test]
    fn wiped_write_permission_holds_through_registrations_until_restored() {
        let mut t = RouteTable::new();
        let mut a = reg("broker-a", "127.0.0.1:1", 0, &[("T", 4), ("R", 4)]);
        a.topics[1].queues.perm = 4; // R is read-only as registered
        t.register(a.clone(), 0);
        t.register(reg("broker-b", "127.0.0.1:2", 0, &[("T", 4)]), 0);
        assert!(t.wipe_write_perm("nope").is_empty());
        assert_eq!(t.wipe_write_perm("broker-a"), topics(&["T"]));
        assert!(t.is_write_wiped("broker-a"));
        // Wiping again changes nothing.
        assert!(t.wipe_write_perm("broker-a").is_empty());
        let perm = |t: &RouteTable, topic: &str, b: &str| t.route(topic).unwrap().queues[b].perm;
        assert_eq!(perm(&t, "T", "broker-a"), 4);
        assert_eq!(perm(&t, "T", "broker-b"), 6);
        // A registration with a new table (a topic created on the broker) keeps it read-only.
        let mut a2 = a.clone();
        a2.topics.push(TopicRegistration {
            topic: "N".into(),
            queues: a.topics[0].queues.clone(),
        });
        assert_eq!(t.register(a2.clone(), 10).changed_topics, topics(&["N"]));
        assert_eq!(perm(&t, "N", "broker-a"), 4);
        assert_eq!(perm(&t, "T", "broker-a"), 4);
        // Restored: the registered permissions come back (R stays read-only).
        assert_eq!(t.add_write_perm("broker-a"), topics(&["N", "T"]));
        assert!(t.add_write_perm("broker-a").is_empty());
        assert_eq!(perm(&t, "T", "broker-a"), 6);
        assert_eq!(perm(&t, "R", "broker-a"), 4);
        // Wiped, then the broker leaves and comes back: writable again.
        t.wipe_write_perm("broker-a");
        t.unregister("DefaultCluster", "127.0.0.1:1", "broker-a", 0);
        assert!(!t.is_write_wiped("broker-a"));
        t.register(a2, 20);
        assert_eq!(perm(&t, "T", "broker-a"), 6);
    }

    #[test]
    fn kafka_listeners_follow_the_broker_address_and_change_the_route() {
        let mut t = RouteTable::new();
        let mut a = reg("a", "1:1", 0, &[("T", 4)]);
        a.kafka = Some(KafkaListener {
            node_id: 5,
            addr: "1:9092".into(),
            ..Default::default()
        });
        let mut b = reg("a", "1:2", 2, &[("T", 4)]);
        b.kafka = Some(KafkaListener {
            node_id: 6,
            addr: "1:9093".into(),
            ..Default::default()
        });
        t.register(a.clone(), 0);
        let r = t.register(b.clone(), 0);
        assert_eq!(
            r.changed_topics,
            topics(&["T"]),
            "a new listener changes the route"
        );
        let info = t.route("T").unwrap().brokers[0].clone();
        let by_id = info.kafka_by_id();
        assert_eq!(by_id[&0].node_id, 5);
        assert_eq!(by_id[&2].node_id, 6);
        // The replica takes over: it registers as id 0 at its own address; the old master
        // is gone.
        t.unregister("DefaultCluster", "1:1", "a", 0);
        b.broker_id = 0;
        t.register(b, 0);
        let by_id = t.route("T").unwrap().brokers[0].kafka_by_id();
        assert_eq!(by_id.len(), 1);
        assert_eq!(by_id[&0].addr, "1:9093");
        // A registration without a listener drops it.
        let mut plain = reg("a", "1:2", 0, &[("T", 4)]);
        plain.data_version = Some((1, 1));
        let r = t.register(plain, 0);
        assert!(r.changed_topics.contains("T"));
        assert!(t.route("T").unwrap().brokers[0].kafka_by_id().is_empty());
    }

    #[test]
    fn a_departed_broker_group_keeps_its_place_until_it_returns_or_the_topic_goes() {
        let mut t = RouteTable::new();
        t.register(reg("a", "1:1", 0, &[("T", 4), ("U", 2)]), 0);
        t.register(reg("b", "1:2", 0, &[("T", 3)]), 0);
        assert!(t.route("T").unwrap().departed.is_empty());
        t.unregister("DefaultCluster", "1:1", "a", 0);
        let r = t.route("T").unwrap();
        assert_eq!(r.departed, BTreeMap::from([("a".to_string(), 4)]));
        assert!(!r.queues.contains_key("a"));
        assert_eq!(t.departed_slots(), 2, "T and U");
        // Back with T only: T's place is live again, U's stays departed.
        let mut back = reg("a", "1:1", 0, &[("T", 4)]);
        back.data_version = Some((2, 2));
        t.register(back, 0);
        assert!(t.route("T").unwrap().departed.is_empty());
        assert_eq!(t.departed_slots(), 1);
        // A topic deleted forgets every place.
        t.delete_topic("U", None);
        assert_eq!(t.departed_slots(), 0);
    }
}
