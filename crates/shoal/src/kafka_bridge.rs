//! The Kafka listener's view of a running broker: `shoal_kafka::BrokerHandle` over
//! `shoal_broker::BrokerApi` (its store, topics, subscription groups, the long-polling hold
//! service that RocketMQ pulls use, and the group coordinator of its group state, so Kafka
//! consumer-protocol groups and Shoal coordinated groups share one).

use futures::future::BoxFuture;
use shoal_broker::{ApiError, BrokerApi};
use shoal_group::coordinator::Coordinator;
use shoal_kafka::cluster::{GroupReplicas, KafkaNode, Leader, Slot, TopicLayout};
use shoal_kafka::epochs::LeaderEpochs;
use shoal_kafka::{BrokerHandle, KafkaError, ReplicaRefusal, TopicInfo, WaitPosition};
use shoal_proto::body::BrokerData;
use shoal_proto::body::TopicConfig;
use shoal_proto::constants::{
    is_dlq_topic, is_retry_topic, perm, AUTO_CREATE_TOPIC_KEY_TOPIC, SCHEDULE_TOPIC,
};
use shoal_store::MessageStore;
use std::sync::Arc;
use std::time::Duration;

/// A running broker as the Kafka listener sees it.
#[derive(Debug, Clone)]
pub(crate) struct BrokerBridge {
    broker: BrokerApi,
}

impl BrokerBridge {
    /// Wraps a broker's API.
    pub(crate) fn new(broker: BrokerApi) -> Self {
        BrokerBridge { broker }
    }
}

/// A broker refusal as the Kafka listener reports it.
fn kafka_error(e: ApiError) -> KafkaError {
    match e {
        ApiError::TopicExists(t) => KafkaError::TopicExists(t),
        ApiError::UnknownTopic(t) => KafkaError::UnknownTopic(t),
        ApiError::Invalid(why) => KafkaError::InvalidRequest(why),
        ApiError::ClassicGroup(g) => KafkaError::ClassicGroup(g),
        ApiError::Broker(why) => KafkaError::Broker(why),
        ApiError::NotCoordinator(why) => KafkaError::NotCoordinator(why),
        ApiError::CoordinatorLoading(why) => KafkaError::CoordinatorLoading(why),
        ApiError::NotMaster(why) => KafkaError::NotController(why),
    }
}

fn internal(name: &str) -> bool {
    name == SCHEDULE_TOPIC
        || name == AUTO_CREATE_TOPIC_KEY_TOPIC
        || is_retry_topic(name)
        || is_dlq_topic(name)
        || name.starts_with("RMQ_SYS_")
        || name.starts_with("rmq_sys_")
}

fn info(c: &TopicConfig) -> TopicInfo {
    TopicInfo {
        name: c.topic_name.clone(),
        partitions: c.read_queue_nums.max(c.write_queue_nums),
        readable: perm::is_readable(c.perm),
        writable: perm::is_writeable(c.perm),
        internal: internal(&c.topic_name),
    }
}

/// A replicated group's refusal as the Kafka listener reports it.
fn replica_refusal(r: shoal_ha::replication::WriteRefusal) -> ReplicaRefusal {
    use shoal_ha::replication::WriteRefusal as W;
    match r {
        W::NotMaster | W::LeaseExpired => ReplicaRefusal::NotLeader,
        W::InSyncReplicasNotEnough { .. } => ReplicaRefusal::NotEnoughReplicas,
        W::Timeout => ReplicaRefusal::NotEnoughReplicasAfterAppend,
        W::Busy => ReplicaRefusal::Busy,
    }
}

/// The leader of a broker group's partitions: its master's Kafka listener.
/// A broker group's listeners, in-sync set and leader epoch as its registrations name them
/// (the master's names the epoch and the in-sync set).
fn replicas_of(b: Option<&BrokerData>) -> GroupReplicas {
    let Some(listeners) = b.and_then(|b| b.kafka_listeners.as_ref()) else {
        return GroupReplicas::default();
    };
    let master = listeners.get(&shoal_proto::constants::MASTER_ID);
    GroupReplicas {
        leader_epoch: master.and_then(|m| m.leader_epoch).unwrap_or(0),
        // Broker ids sort the master (0) first.
        nodes: listeners.values().map(|l| l.node_id).collect(),
        in_sync: master
            .and_then(|m| m.in_sync.as_ref())
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| listeners.get(id).map(|l| l.node_id))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

fn leader_of(b: Option<&BrokerData>) -> Leader {
    b.and_then(BrokerData::master_kafka)
        .and_then(|k| KafkaNode::parse(k.node_id, &k.addr))
        .map_or(Leader::Unknown, Leader::At)
}

impl BrokerBridge {
    /// Whether broker group `name` is in this broker's cluster (name servers may serve
    /// several): only those are Kafka nodes and coordinators of this listener's cluster.
    fn in_my_cluster(&self, c: &shoal_proto::body::ClusterInfo, name: &str) -> bool {
        c.cluster_addr_table
            .get(&self.broker.config().cluster_name)
            .is_none_or(|names| names.contains(name))
    }

    /// This broker's own group's replicas: as the route or the cluster list shows them, with
    /// the epoch and in-sync set this broker has while it is master (fresher than its
    /// registration).
    fn own_replicas(&self, route: Option<&shoal_proto::body::TopicRouteData>) -> GroupReplicas {
        let name = &self.broker.config().broker_name;
        let cluster;
        let data = match route.and_then(|r| r.broker_datas.iter().find(|b| &b.broker_name == name))
        {
            Some(b) => Some(b),
            None => {
                cluster = self.broker.known_cluster();
                cluster.as_ref().and_then(|c| c.broker_addr_table.get(name))
            }
        };
        let mut r = replicas_of(data);
        if let Some((epoch, in_sync)) = self.broker.leadership() {
            r.leader_epoch = i32::try_from(epoch).unwrap_or(i32::MAX);
            // Itself as 0, whatever the route says yet; the replicas by their registrations.
            let listeners = data.and_then(|b| b.kafka_listeners.as_ref());
            r.in_sync = in_sync
                .iter()
                .filter_map(|id| match id {
                    0 => self.broker.kafka_node_id(),
                    id => listeners.and_then(|l| l.get(id)).map(|l| l.node_id),
                })
                .collect();
            if let Some(own) = self.broker.kafka_node_id() {
                r.nodes.retain(|n| *n != own);
                r.nodes.insert(0, own);
            }
        }
        r
    }

    /// This broker's own group as a slot leader: this listener while master, else the
    /// master's listener as the route or the cluster list shows it.
    fn own_leader(&self, route: Option<&shoal_proto::body::TopicRouteData>) -> Leader {
        if self.broker.is_route_master() {
            return Leader::Here;
        }
        let name = &self.broker.config().broker_name;
        let from_route = route.and_then(|r| r.broker_datas.iter().find(|b| &b.broker_name == name));
        match leader_of(from_route) {
            Leader::Unknown => {
                let cluster = self.broker.known_cluster();
                leader_of(cluster.as_ref().and_then(|c| c.broker_addr_table.get(name)))
            }
            l => l,
        }
    }
}

impl BrokerHandle for BrokerBridge {
    fn topic_layout(&self, name: &str) -> Option<TopicLayout> {
        let own_name = &self.broker.config().broker_name;
        let local = self.broker.topic(name).as_ref().map(info);
        let route = self.broker.known_route(name);
        let mut slots: Vec<Slot> = Vec::new();
        if let Some(r) = &route {
            for q in &r.queue_datas {
                if &q.broker_name == own_name
                    || slots.iter().any(|s| s.broker_name == q.broker_name)
                {
                    continue;
                }
                let b = r
                    .broker_datas
                    .iter()
                    .find(|b| b.broker_name == q.broker_name);
                slots.push(Slot {
                    broker_name: q.broker_name.clone(),
                    partitions: q.read_queue_nums.max(q.write_queue_nums),
                    leader: leader_of(b),
                    replicas: replicas_of(b),
                });
            }
        }
        // Broker groups that left keep their place (no leader), so nothing is renumbered.
        for (name, n) in route.iter().flat_map(|r| r.kafka_departed.iter().flatten()) {
            if name != own_name && !slots.iter().any(|s| &s.broker_name == name) {
                slots.push(Slot {
                    broker_name: name.clone(),
                    partitions: *n,
                    leader: Leader::Unknown,
                    replicas: GroupReplicas::default(),
                });
            }
        }
        if let Some(t) = &local {
            slots.push(Slot {
                broker_name: own_name.clone(),
                partitions: t.partitions,
                leader: self.own_leader(route.as_deref()),
                replicas: self.own_replicas(route.as_deref()),
            });
        }
        if slots.is_empty() {
            return None;
        }
        slots.sort_by(|a, b| a.broker_name.cmp(&b.broker_name));
        Some(TopicLayout { slots, local })
    }

    fn leader_epochs(&self) -> LeaderEpochs {
        let Some((entries, current)) = self.broker.master_epochs() else {
            return LeaderEpochs::default();
        };
        let epoch = |e: u32| i32::try_from(e).unwrap_or(i32::MAX);
        LeaderEpochs {
            current: epoch(current),
            entries: entries.into_iter().map(|(e, s)| (epoch(e), s)).collect(),
        }
    }

    fn offsets_replicated(&self) -> BoxFuture<'static, bool> {
        Box::pin(self.broker.offsets_replicated())
    }

    fn refresh_routes(&self, topics: Vec<String>) -> BoxFuture<'static, ()> {
        Box::pin(self.broker.refresh_routes(topics))
    }

    fn cluster_nodes(&self) -> Vec<KafkaNode> {
        let Some(c) = self.broker.known_cluster() else {
            return Vec::new();
        };
        c.broker_addr_table
            .iter()
            .filter(|(name, _)| self.in_my_cluster(&c, name))
            .flat_map(|(_, b)| b.kafka_listeners.iter().flatten())
            .filter_map(|(_, k)| KafkaNode::parse(k.node_id, &k.addr))
            .collect()
    }

    fn kafka_masters(&self) -> Vec<(String, Leader)> {
        let own = &self.broker.config().broker_name;
        if !self.broker.has_name_servers() {
            return Vec::new();
        }
        // Every broker group with a Kafka listener counts, also while it has no master (a
        // failover): its groups wait for the new master (COORDINATOR_NOT_AVAILABLE) instead of
        // moving to another broker group and back, and no replica coordinates them.
        let mut masters: Vec<(String, Leader)> = self
            .broker
            .known_cluster()
            .iter()
            .flat_map(|c| {
                c.broker_addr_table
                    .iter()
                    .filter(|(name, _)| *name != own && self.in_my_cluster(c, name))
                    .filter(|(_, b)| b.kafka_listeners.as_ref().is_some_and(|l| !l.is_empty()))
                    .map(|(name, b)| (name.clone(), leader_of(Some(b))))
                    .collect::<Vec<_>>()
            })
            .collect();
        let own_leader = if self.broker.is_route_master() {
            Leader::Here
        } else {
            self.own_leader(None)
        };
        masters.push((own.clone(), own_leader));
        masters.sort_by(|a, b| a.0.cmp(&b.0));
        masters
    }

    fn refresh_cluster(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.broker.refresh_cluster())
    }

    fn coordinator_ready(&self, limit: std::time::Duration) -> BoxFuture<'static, ()> {
        Box::pin(self.broker.coordinator_ready(limit))
    }

    fn commit_offset_at(
        &self,
        broker_name: &str,
        group: &str,
        topic: &str,
        queue: i32,
        offset: i64,
    ) -> BoxFuture<'static, Result<(), KafkaError>> {
        let call = self
            .broker
            .commit_offset_at(broker_name, group, topic, queue, offset);
        Box::pin(async move { call.await.map_err(KafkaError::Broker) })
    }

    fn query_offset_at(
        &self,
        broker_name: &str,
        group: &str,
        topic: &str,
        queue: i32,
    ) -> BoxFuture<'static, Result<Option<i64>, KafkaError>> {
        let call = self
            .broker
            .query_offset_at(broker_name, group, topic, queue);
        Box::pin(async move { call.await.map_err(KafkaError::Broker) })
    }

    fn store(&self) -> Arc<MessageStore> {
        self.broker.store()
    }

    fn check_replicated_write(&self) -> Result<(), ReplicaRefusal> {
        self.broker
            .check_replicated_write()
            .map_err(replica_refusal)
    }

    fn replicated_write(&self, end: u64) -> BoxFuture<'static, Result<(), ReplicaRefusal>> {
        let wait = self.broker.replicated_write(end);
        Box::pin(async move { wait.await.map_err(replica_refusal) })
    }

    fn topics(&self) -> Vec<TopicInfo> {
        self.broker.topics().iter().map(info).collect()
    }

    fn topic(&self, name: &str) -> Option<TopicInfo> {
        self.broker.topic(name).as_ref().map(info)
    }

    fn auto_create_topics(&self) -> bool {
        self.broker.config().auto_create_topic
    }

    fn replica_count(&self) -> usize {
        // A master knows its group from the controller; the name servers' list may lag.
        self.broker
            .group_size()
            .unwrap_or_else(|| self.own_replicas(None).nodes.len())
            .max(1)
    }

    fn default_partitions(&self) -> i32 {
        self.broker.config().default_topic_queue_nums
    }

    fn create_topic(&self, name: &str, partitions: i32) -> Result<TopicInfo, KafkaError> {
        match self.broker.create_topic(name, partitions) {
            Ok(c) => Ok(info(&c)),
            Err(ApiError::Invalid(why)) => Err(KafkaError::InvalidTopic(why)),
            Err(e) => Err(kafka_error(e)),
        }
    }

    fn delete_topic(&self, name: &str) -> Result<(), KafkaError> {
        self.broker.delete_topic(name).map_err(kafka_error)
    }

    fn set_partitions(&self, name: &str, count: i32) -> Result<(), KafkaError> {
        self.broker.add_queues(name, count).map_err(kafka_error)
    }

    fn ensure_group(&self, group: &str) -> Result<(), KafkaError> {
        self.broker.ensure_group(group).map_err(|e| match e {
            ApiError::Invalid(why) => KafkaError::InvalidGroup(why),
            e => kafka_error(e),
        })
    }

    fn delete_group(&self, group: &str) -> Result<(), KafkaError> {
        self.broker.delete_group(group).map_err(kafka_error)
    }

    fn broker_name(&self) -> String {
        self.broker.config().broker_name.clone()
    }

    fn cluster_name(&self) -> String {
        self.broker.config().cluster_name.clone()
    }

    fn max_message_bytes(&self) -> usize {
        self.broker.config().max_message_bytes
    }

    fn retention_hours(&self) -> u64 {
        self.broker.config().retention_hours
    }

    fn with_coordinator(
        &self,
        group: Option<&str>,
        topics: &[String],
        f: &mut dyn FnMut(&mut Coordinator, u64),
    ) -> Result<(), KafkaError> {
        self.broker
            .with_coordinator(group, topics, |c, now| f(c, now))
            .map_err(kafka_error)
    }

    fn wait_for_messages(
        &self,
        positions: Vec<WaitPosition>,
        timeout: Duration,
    ) -> BoxFuture<'static, ()> {
        let list: Vec<(String, i32, u64)> = positions
            .into_iter()
            .map(|p| (p.topic, p.partition, p.offset))
            .collect();
        Box::pin(self.broker.wait_for_messages(list, timeout))
    }
}
