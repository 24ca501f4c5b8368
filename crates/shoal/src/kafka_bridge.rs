//! The Kafka listener's view of a running broker: `shoal_kafka::BrokerHandle` over
//! `shoal_broker::BrokerInner` (its store, topic table, subscription groups, the
//! long-polling hold service that RocketMQ pulls use, and the group coordinator of its
//! `GroupState`, so Kafka consumer-protocol groups and Shoal coordinated groups share one).

use futures::future::BoxFuture;
use shoal_broker::broker::wall_ms;
use shoal_broker::group_state::GroupMode;
use shoal_broker::BrokerInner;
use shoal_group::coordinator::Coordinator;
use shoal_kafka::{BrokerHandle, KafkaError, TopicInfo, WaitPosition};
use shoal_proto::body::TopicConfig;
use shoal_proto::constants::{
    is_dlq_topic, is_retry_topic, perm, AUTO_CREATE_TOPIC_KEY_TOPIC, SCHEDULE_TOPIC,
};
use shoal_store::MessageStore;
use std::sync::Arc;
use std::time::Duration;

/// A running broker as the Kafka listener sees it.
#[derive(Debug, Clone)]
pub struct BrokerBridge {
    broker: Arc<BrokerInner>,
}

impl BrokerBridge {
    /// Wraps a broker's shared state.
    pub fn new(broker: Arc<BrokerInner>) -> Self {
        BrokerBridge { broker }
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

impl BrokerHandle for BrokerBridge {
    fn store(&self) -> Arc<MessageStore> {
        self.broker.store.clone()
    }

    fn topics(&self) -> Vec<TopicInfo> {
        self.broker.topics.lock().all().values().map(info).collect()
    }

    fn topic(&self, name: &str) -> Option<TopicInfo> {
        self.broker.topics.lock().get(name).map(info)
    }

    fn auto_create_topics(&self) -> bool {
        self.broker.config.auto_create_topic
    }

    fn default_partitions(&self) -> i32 {
        self.broker.config.default_topic_queue_nums
    }

    fn create_topic(&self, name: &str, partitions: i32) -> Result<TopicInfo, KafkaError> {
        let b = &self.broker;
        let created = {
            let mut topics = b.topics.lock();
            if topics.get(name).is_some() {
                return Err(KafkaError::TopicExists(name.into()));
            }
            let c = topics
                .ensure(name, partitions, perm::PERM_READ_WRITE, wall_ms())
                .map_err(|e| KafkaError::InvalidTopic(e.to_string()))?;
            topics
                .persist()
                .map_err(|e| KafkaError::Broker(format!("topic table not persisted: {e}")))?;
            c
        };
        b.register_now.notify_one();
        Ok(info(&created))
    }

    fn delete_topic(&self, name: &str) -> Result<(), KafkaError> {
        let b = &self.broker;
        if b.topics.lock().remove(name, wall_ms()).is_none() {
            return Err(KafkaError::UnknownTopic(name.into()));
        }
        b.store.delete_topic(name)?;
        b.topics
            .lock()
            .persist()
            .map_err(|e| KafkaError::Broker(format!("topic table not persisted: {e}")))?;
        b.register_now.notify_one();
        Ok(())
    }

    fn set_partitions(&self, name: &str, count: i32) -> Result<(), KafkaError> {
        let b = &self.broker;
        {
            let mut topics = b.topics.lock();
            let mut c = topics
                .get(name)
                .cloned()
                .ok_or_else(|| KafkaError::UnknownTopic(name.into()))?;
            if count <= c.read_queue_nums.max(c.write_queue_nums) {
                return Err(KafkaError::InvalidRequest(format!(
                    "topic {name} already has {} queues",
                    c.read_queue_nums.max(c.write_queue_nums)
                )));
            }
            c.read_queue_nums = count;
            c.write_queue_nums = count;
            topics
                .upsert(c, wall_ms())
                .map_err(|e| KafkaError::InvalidRequest(e.to_string()))?;
            topics
                .persist()
                .map_err(|e| KafkaError::Broker(format!("topic table not persisted: {e}")))?;
        }
        // Name servers first, then RocketMQ consumers rebalance onto the new queues.
        let b = b.clone();
        let topic = name.to_string();
        tokio::spawn(async move {
            b.register_all().await;
            b.notify_consumers_of_topic(&topic);
        });
        Ok(())
    }

    fn ensure_group(&self, group: &str) -> Result<(), KafkaError> {
        if group.is_empty()
            || group.len() > 255
            || !group
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-'))
        {
            return Err(KafkaError::InvalidGroup(format!(
                "{group:?}: RocketMQ group names hold letters, digits and % | _ - only"
            )));
        }
        let mut groups = self.broker.groups.lock();
        if groups.get(group).is_some() {
            return Ok(());
        }
        groups.ensure(group, wall_ms());
        groups
            .persist()
            .map_err(|e| KafkaError::Broker(format!("group table not persisted: {e}")))
    }

    fn delete_group(&self, group: &str) -> Result<(), KafkaError> {
        let mut groups = self.broker.groups.lock();
        groups.remove(group, wall_ms());
        groups
            .persist()
            .map_err(|e| KafkaError::Broker(format!("group table not persisted: {e}")))?;
        drop(groups);
        self.broker.store.remove_group_offsets(group);
        Ok(())
    }

    fn broker_name(&self) -> String {
        self.broker.config.broker_name.clone()
    }

    fn cluster_name(&self) -> String {
        self.broker.config.cluster_name.clone()
    }

    fn max_message_bytes(&self) -> usize {
        self.broker.config.max_message_bytes
    }

    fn retention_hours(&self) -> u64 {
        self.broker.config.retention_hours
    }

    fn with_coordinator(
        &self,
        group: Option<&str>,
        topics: &[String],
        f: &mut dyn FnMut(&mut Coordinator, u64),
    ) -> Result<(), KafkaError> {
        let b = &self.broker;
        // Computed before the group-state lock (they take the topic table's and the route
        // cache's), so no lock is taken inside another.
        let queues: Vec<(&String, Vec<shoal_proto::MessageQueue>)> = topics
            .iter()
            .filter_map(|t| b.known_topic_queues(t).map(|q| (t, q)))
            .collect();
        b.with_group_state(|g, now| {
            if let Some(group) = group {
                if g.mode(group) == GroupMode::Classic {
                    return Err(KafkaError::ClassicGroup(group.to_string()));
                }
            }
            for (t, q) in queues {
                g.coordinator.set_topic_queues(t, q, now);
            }
            f(&mut g.coordinator, now);
            Ok(())
        })
    }

    fn wait_for_messages(
        &self,
        positions: Vec<WaitPosition>,
        timeout: Duration,
    ) -> BoxFuture<'static, ()> {
        let b = self.broker.clone();
        Box::pin(async move {
            let list: Vec<(String, i32, u64)> = positions
                .iter()
                .map(|p| (p.topic.clone(), p.partition, p.offset))
                .collect();
            let ticket = b.holds.hold_any(&list);
            // Close the race between the empty read and the hold.
            for (topic, q, _) in &list {
                b.holds.recheck(topic, *q, b.store.max_offset(topic, *q));
            }
            b.holds.wait_any(ticket, timeout).await;
        })
    }
}
