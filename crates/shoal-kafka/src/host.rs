//! What the broker hands the Kafka listener: its store, its topic table, its subscription
//! groups and its long-polling hold service. `shoal-kafka` does not depend on `shoal-broker`;
//! the `shoal` binary implements [`BrokerHandle`] over a running broker.

use crate::cluster::{KafkaNode, Leader, TopicLayout};
use crate::KafkaError;
use futures::future::BoxFuture;
use shoal_group::coordinator::Coordinator;
use shoal_store::MessageStore;
use std::sync::Arc;
use std::time::Duration;

/// A topic as the listener sees it: a Kafka topic whose partitions are the broker's queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    /// Name.
    pub name: String,
    /// Number of partitions (the topic's queue count).
    pub partitions: i32,
    /// Reads allowed (RocketMQ perm bit).
    pub readable: bool,
    /// Writes allowed (RocketMQ perm bit).
    pub writable: bool,
    /// A broker-internal topic (retry, dead-letter, schedule and system topics).
    pub internal: bool,
}

/// A queue position a fetch waits beyond: woken when a message at or after `offset` is
/// stored in (`topic`, `partition`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitPosition {
    /// Topic.
    pub topic: String,
    /// Partition (queue id).
    pub partition: i32,
    /// Offset the fetch asked for.
    pub offset: u64,
}

/// Why a replicated broker group did not take a produce (the Kafka error each maps to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaRefusal {
    /// This broker is not the group's master, or its lease lapsed
    /// (NOT_LEADER_OR_FOLLOWER: the client refreshes its metadata).
    NotLeader,
    /// The in-sync set is below `min_insync_replicas` (NOT_ENOUGH_REPLICAS).
    NotEnoughReplicas,
    /// Written, but the in-sync set did not acknowledge it in time
    /// (NOT_ENOUGH_REPLICAS_AFTER_APPEND).
    NotEnoughReplicasAfterAppend,
    /// Too many writes wait for their acknowledgement (REQUEST_TIMED_OUT; the client retries).
    Busy,
}

/// The broker services the Kafka listener uses. Implementations must be cheap to call from
/// async code: every method except [`BrokerHandle::wait_for_messages`] takes at most a short
/// lock.
pub trait BrokerHandle: Send + Sync + 'static {
    /// The message store shared with the RocketMQ side.
    fn store(&self) -> Arc<MessageStore>;
    /// In a replicated broker group: whether this broker may append a produce now (only the
    /// master may). Unreplicated brokers always may.
    fn check_replicated_write(&self) -> Result<(), ReplicaRefusal> {
        Ok(())
    }
    /// In a replicated broker group: resolves once the write that ended the commit log at
    /// `end` is acknowledged by the in-sync set (what `acks=all` promises), or with why not.
    fn replicated_write(&self, end: u64) -> BoxFuture<'static, Result<(), ReplicaRefusal>> {
        let _ = end;
        Box::pin(async { Ok(()) })
    }
    /// Where `name`'s partitions are in the cluster as last learned (no request): every
    /// broker group serving the topic, in name order ([`crate::cluster`]). Default: this
    /// broker alone.
    fn topic_layout(&self, name: &str) -> Option<TopicLayout> {
        self.topic(name)
            .map(|t| TopicLayout::alone(&self.broker_name(), t))
    }
    /// Learns fresher routes of `topics` from the name servers (before a Metadata answer).
    fn refresh_routes(&self, topics: Vec<String>) -> BoxFuture<'static, ()> {
        let _ = topics;
        Box::pin(async {})
    }
    /// The other Kafka listeners of the cluster (every broker group's master and replicas),
    /// as last learned. Default: none.
    fn cluster_nodes(&self) -> Vec<KafkaNode> {
        Vec::new()
    }
    /// The broker groups that run Kafka listeners, sorted by name, each with its master's
    /// listener ([`Leader::Unknown`] while it has none, as in a failover), this broker's own
    /// as [`Leader::Here`] while it is master; empty when the broker is the whole cluster (no
    /// name servers). Group coordinators are chosen among them.
    fn kafka_masters(&self) -> Vec<(String, Leader)> {
        Vec::new()
    }
    /// This broker's leader epochs (its replicated group's master epochs; default: epoch 0,
    /// no entries, for a broker that does not replicate). See [`crate::epochs`].
    fn leader_epochs(&self) -> crate::epochs::LeaderEpochs {
        crate::epochs::LeaderEpochs::default()
    }
    /// How many replicas this broker's group keeps of every partition it leads: its Kafka
    /// listeners (1 for a broker that does not replicate). CreateTopics accepts a
    /// replication factor up to it.
    fn replica_count(&self) -> usize {
        1
    }
    /// Resolves with `true` once the consumer offsets committed and the topic-table changes
    /// made before the call are as durable as the broker makes them (a replicated group's
    /// in-sync set has them), `false` when they were not in time. Default: at once.
    fn offsets_replicated(&self) -> BoxFuture<'static, bool> {
        Box::pin(async { true })
    }
    /// Resolves once the broker's group coordinator answers members (a new master took over
    /// its group's state), at once when it will not (a replica, a broker without
    /// replication), or after `limit`. Default: at once.
    fn coordinator_ready(&self, limit: std::time::Duration) -> BoxFuture<'static, ()> {
        let _ = limit;
        Box::pin(async {})
    }
    /// Learns a fresher list of the cluster's brokers (before FindCoordinator and Metadata).
    fn refresh_cluster(&self) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }
    /// Commits `offset` for `group` on queue `queue` of `topic` at broker group
    /// `broker_name`'s master (a coordinator commits partitions of every broker).
    fn commit_offset_at(
        &self,
        broker_name: &str,
        group: &str,
        topic: &str,
        queue: i32,
        offset: i64,
    ) -> BoxFuture<'static, Result<(), KafkaError>> {
        let _ = (group, topic, queue, offset);
        let why = format!("broker {broker_name} is not reachable from this listener");
        Box::pin(async move { Err(KafkaError::Broker(why)) })
    }
    /// The committed offset of `group` on queue `queue` of `topic` at broker group
    /// `broker_name`'s master; `None` when it has none.
    fn query_offset_at(
        &self,
        broker_name: &str,
        group: &str,
        topic: &str,
        queue: i32,
    ) -> BoxFuture<'static, Result<Option<i64>, KafkaError>> {
        let _ = (group, topic, queue);
        let why = format!("broker {broker_name} is not reachable from this listener");
        Box::pin(async move { Err(KafkaError::Broker(why)) })
    }
    /// Every topic of this broker.
    fn topics(&self) -> Vec<TopicInfo>;
    /// One topic.
    fn topic(&self, name: &str) -> Option<TopicInfo>;
    /// Whether unknown topics may be created on a client's Metadata request.
    fn auto_create_topics(&self) -> bool;
    /// The broker's default number of queues for a new topic.
    fn default_partitions(&self) -> i32;
    /// Creates a topic with `partitions` queues (read and write), registers it with the name
    /// servers. [`KafkaError::TopicExists`] when it exists.
    fn create_topic(&self, name: &str, partitions: i32) -> Result<TopicInfo, KafkaError>;
    /// Deletes a topic and its messages.
    fn delete_topic(&self, name: &str) -> Result<(), KafkaError>;
    /// Raises a topic's queue count to `count` (never lowers it).
    fn set_partitions(&self, name: &str, count: i32) -> Result<(), KafkaError>;
    /// Makes sure the subscription group exists, so that Kafka groups are listed with the
    /// RocketMQ ones (`shoal group list`).
    fn ensure_group(&self, group: &str) -> Result<(), KafkaError>;
    /// Deletes a subscription group and its committed offsets.
    fn delete_group(&self, group: &str) -> Result<(), KafkaError>;
    /// The broker's name (the coordinator's queues are named by broker).
    fn broker_name(&self) -> String;
    /// The broker's cluster name (written into stored messages as RocketMQ does).
    fn cluster_name(&self) -> String;
    /// Largest message body the broker accepts, bytes.
    fn max_message_bytes(&self) -> usize;
    /// Message retention, hours (for DescribeConfigs `retention.ms`).
    fn retention_hours(&self) -> u64;
    /// Runs `f` exactly once on the broker's group coordinator, the one that also serves
    /// Shoal's coordinated groups (so KIP-848 Kafka groups and Shoal groups live in one
    /// coordinator), under the broker's group-state lock, with the coordinator's clock in ms.
    /// Before `f`, the coordinator learns the queues of `topics` as the broker knows them
    /// (without waiting for a name server). The broker executes the coordinator's effects
    /// after the lock is released; `f` must neither block nor await.
    ///
    /// With `group`: [`KafkaError::ClassicGroup`] (and `f` is not run) when RocketMQ members of
    /// that group allocate client-side (the classic protocol); [`KafkaError::NotCoordinator`]
    /// when the broker is a replica, [`KafkaError::CoordinatorLoading`] when it is a master
    /// still taking over its group's state.
    fn with_coordinator(
        &self,
        group: Option<&str>,
        topics: &[String],
        f: &mut dyn FnMut(&mut Coordinator, u64),
    ) -> Result<(), KafkaError>;
    /// Waits until a message arrives at or after one of `positions`, or `timeout` passes;
    /// the same hold service that long-polls RocketMQ pulls. Holds are released either way.
    fn wait_for_messages(
        &self,
        positions: Vec<WaitPosition>,
        timeout: Duration,
    ) -> BoxFuture<'static, ()>;
}
