//! The cluster as Kafka clients see it through any broker's listener: every broker group that
//! serves a topic contributes its queues as a run of partitions, broker groups in name order
//! (a topic with 4 queues on `broker-a` and 4 on `broker-b` has partitions 0-3 on `broker-a`
//! and 4-7 on `broker-b`), each led by the Kafka listener of its group's master. Produce and
//! Fetch of a partition go to its leader; another broker answers NOT_LEADER_OR_FOLLOWER and
//! the client asks for metadata again. A group's coordinator is one listener chosen from the
//! group name, the same on every broker.

use crate::host::TopicInfo;
use shoal_proto::mq::MessageQueue;

/// A Kafka listener clients can connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaNode {
    /// Node id (unique in the cluster).
    pub node_id: i32,
    /// Host clients connect to.
    pub host: String,
    /// Port clients connect to.
    pub port: i32,
}

impl KafkaNode {
    /// A node from `host:port` as brokers register it; `None` when it does not parse.
    pub fn parse(node_id: i32, addr: &str) -> Option<KafkaNode> {
        let (host, port) = addr.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        (!host.is_empty()).then(|| KafkaNode {
            node_id,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
            port: i32::from(port),
        })
    }
}

/// Who leads a broker group's partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leader {
    /// This listener (its broker is the group's master, or alone).
    Here,
    /// Another broker's listener.
    At(KafkaNode),
    /// Nobody clients can reach now (no master, or its master runs no Kafka listener).
    Unknown,
}

/// One broker group's run of a topic's partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The broker group (`brokerName`).
    pub broker_name: String,
    /// How many partitions (the group's queues of the topic).
    pub partitions: i32,
    /// Who leads them.
    pub leader: Leader,
    /// The group's replicas, in-sync set and leader epoch.
    pub replicas: GroupReplicas,
}

/// A broker group's replicas as Kafka metadata shows them: every broker of a replicated group
/// that runs a Kafka listener is a replica of its partitions, its in-sync set is their ISR and
/// its master epoch their leader epoch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupReplicas {
    /// The leader epoch (the group's master epoch; 0 for a broker that does not replicate).
    pub leader_epoch: i32,
    /// Node ids of the group's listeners, the master's first (empty: the leader alone).
    pub nodes: Vec<i32>,
    /// Node ids of the in-sync set (empty: the leader alone).
    pub in_sync: Vec<i32>,
}

/// Where a topic's partitions are. See the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicLayout {
    /// Broker groups in name order.
    pub slots: Vec<Slot>,
    /// This broker's own queues of the topic, when it has the topic.
    pub local: Option<TopicInfo>,
}

/// A partition of a topic as this listener serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placed {
    /// On this broker, queue `queue`.
    Here {
        /// The queue id.
        queue: i32,
        /// The topic as this broker has it.
        info: TopicInfo,
    },
    /// On another broker group, or on this one's master when this broker is a replica.
    Elsewhere,
    /// No such partition.
    Unknown,
}

impl TopicLayout {
    /// A topic only this broker serves.
    pub fn alone(broker_name: &str, info: TopicInfo) -> TopicLayout {
        TopicLayout {
            slots: vec![Slot {
                broker_name: broker_name.to_string(),
                partitions: info.partitions,
                leader: Leader::Here,
                replicas: GroupReplicas::default(),
            }],
            local: Some(info),
        }
    }

    /// Number of partitions.
    pub fn partitions(&self) -> i32 {
        self.slots.iter().map(|s| s.partitions.max(0)).sum()
    }

    /// The slot and queue id of partition `index`.
    pub fn locate(&self, index: i32) -> Option<(&Slot, i32)> {
        if index < 0 {
            return None;
        }
        let mut base = 0;
        for s in &self.slots {
            let n = s.partitions.max(0);
            if index < base + n {
                return Some((s, index - base));
            }
            base += n;
        }
        None
    }

    /// The partition of queue `queue` of broker group `broker_name`.
    pub fn index_of(&self, broker_name: &str, queue: i32) -> Option<i32> {
        let mut base = 0;
        for s in &self.slots {
            let n = s.partitions.max(0);
            if s.broker_name == broker_name {
                return (queue >= 0 && queue < n).then_some(base + queue);
            }
            base += n;
        }
        None
    }

    /// The queue of partition `index` (any broker group).
    pub fn queue_of(&self, topic: &str, index: i32) -> Option<MessageQueue> {
        self.locate(index)
            .map(|(s, q)| MessageQueue::new(topic, s.broker_name.clone(), q))
    }

    /// Where partition `index` is served from, as this listener sees it.
    pub(crate) fn place(&self, index: i32) -> Placed {
        match self.locate(index) {
            None => Placed::Unknown,
            Some((s, queue)) => match (&s.leader, &self.local) {
                (Leader::Here, Some(info)) => Placed::Here {
                    queue,
                    info: info.clone(),
                },
                _ => Placed::Elsewhere,
            },
        }
    }
}

/// Partition `index` of a topic laid out as `layout` (none: no broker serves it) as a queue of
/// this broker, or the error its request gets: NOT_LEADER_OR_FOLLOWER when another broker
/// leads it (the client asks for metadata again), UNKNOWN_TOPIC_OR_PARTITION when nobody has it.
pub(crate) fn local_queue(
    layout: Option<&TopicLayout>,
    index: i32,
) -> Result<(i32, TopicInfo), kafka_protocol::ResponseError> {
    use kafka_protocol::ResponseError as E;
    match layout.map(|l| l.place(index)) {
        Some(Placed::Here { queue, info }) => Ok((queue, info)),
        Some(Placed::Elsewhere) => Err(E::NotLeaderOrFollower),
        Some(Placed::Unknown) | None => Err(E::UnknownTopicOrPartition),
    }
}

/// A group's coordinator among the brokers whose masters run a Kafka listener, sorted by
/// broker name: the one at the group name's Java hash modulo their count (Shoal members pick
/// their coordinator the same way among the brokers of their topics).
pub(crate) fn coordinator_of<'a>(
    group: &str,
    masters: &'a [(String, Leader)],
) -> Option<&'a Leader> {
    if masters.is_empty() {
        return None;
    }
    let h = shoal_proto::hash::java_string_hash(group).unsigned_abs() as usize;
    masters.get(h % masters.len()).map(|(_, l)| l)
}

/// A node id for a listener that was given none: derived from the address clients connect
/// to, so it is the same after a restart and differs between the brokers of a cluster.
pub(crate) fn derived_node_id(advertised: &str) -> i32 {
    (shoal_proto::message::body_crc(advertised.as_bytes()) & 0x3fff_ffff) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(n: i32) -> TopicInfo {
        TopicInfo {
            name: "T".into(),
            partitions: n,
            readable: true,
            writable: true,
            internal: false,
        }
    }

    fn node(id: i32) -> KafkaNode {
        KafkaNode {
            node_id: id,
            host: "127.0.0.1".into(),
            port: 9000 + id,
        }
    }

    #[test]
    fn partitions_run_over_the_broker_groups_in_name_order() {
        let layout = TopicLayout {
            slots: vec![
                Slot {
                    broker_name: "a".into(),
                    partitions: 4,
                    leader: Leader::At(node(1)),
                    replicas: GroupReplicas::default(),
                },
                Slot {
                    broker_name: "b".into(),
                    partitions: 2,
                    leader: Leader::Here,
                    replicas: GroupReplicas::default(),
                },
                Slot {
                    broker_name: "c".into(),
                    partitions: 3,
                    leader: Leader::Unknown,
                    replicas: GroupReplicas::default(),
                },
            ],
            local: Some(info(2)),
        };
        assert_eq!(layout.partitions(), 9);
        assert_eq!(layout.place(0), Placed::Elsewhere);
        assert_eq!(
            layout.place(5),
            Placed::Here {
                queue: 1,
                info: info(2)
            }
        );
        assert_eq!(layout.place(6), Placed::Elsewhere);
        assert_eq!(layout.place(9), Placed::Unknown);
        assert_eq!(layout.place(-1), Placed::Unknown);
        assert_eq!(layout.index_of("b", 1), Some(5));
        assert_eq!(layout.index_of("b", 2), None);
        assert_eq!(layout.index_of("d", 0), None);
        assert_eq!(
            layout.queue_of("T", 8),
            Some(MessageQueue::new("T", "c".to_string(), 2))
        );
        for p in 0..layout.partitions() {
            let q = layout.queue_of("T", p).unwrap();
            assert_eq!(layout.index_of(&q.broker_name, q.queue_id), Some(p));
        }
    }

    #[test]
    fn a_replica_serves_none_of_its_own_queues() {
        let mut layout = TopicLayout::alone("a", info(4));
        layout.slots[0].leader = Leader::At(node(2));
        assert_eq!(layout.place(1), Placed::Elsewhere);
    }

    #[test]
    fn every_broker_picks_the_same_coordinator() {
        let masters = vec![
            ("a".to_string(), Leader::At(node(1))),
            ("b".to_string(), Leader::Here),
        ];
        let seen_from_b = coordinator_of("g1", &masters).cloned();
        let masters_from_a = vec![
            ("a".to_string(), Leader::Here),
            ("b".to_string(), Leader::At(node(2))),
        ];
        let seen_from_a = coordinator_of("g1", &masters_from_a).cloned();
        // The same index: if a sees itself, b sees a, and the other way round.
        assert_eq!(
            seen_from_a == Some(Leader::Here),
            seen_from_b == Some(Leader::At(node(1)))
        );
        assert_eq!(coordinator_of("g", &[]), None);
    }

    #[test]
    fn node_ids_come_from_registered_addresses() {
        assert_eq!(
            KafkaNode::parse(3, "127.0.0.1:9092"),
            Some(KafkaNode {
                node_id: 3,
                host: "127.0.0.1".into(),
                port: 9092
            })
        );
        assert_eq!(KafkaNode::parse(3, "[::1]:9092").unwrap().host, "::1");
        assert_eq!(KafkaNode::parse(3, "nohost"), None);
        let a = derived_node_id("127.0.0.1:9092");
        assert!(a >= 0);
        assert_eq!(a, derived_node_id("127.0.0.1:9092"));
        assert_ne!(a, derived_node_id("127.0.0.1:9093"));
    }
}
