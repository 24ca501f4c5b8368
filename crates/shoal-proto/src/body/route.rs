//! Route bodies: TopicRouteData (3.2), ClusterInfo (3.4), TopicList, KVTable.

use crate::constants::{perm, MASTER_ID};
use crate::MessageQueue;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// GET_ROUTEINFO_BY_TOPIC body: where a topic's queues live.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicRouteData {
    /// Brokers serving the topic (always sent, the Java client iterates it).
    pub broker_datas: Vec<BrokerData>,
    /// Broker address → filter server addresses (always sent, usually `{}`).
    pub filter_server_table: BTreeMap<String, Vec<String>>,
    /// `"brokerName:queueNums;…"` for ordered topics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_topic_conf: Option<String>,
    /// Queue layout per broker (always sent).
    pub queue_datas: Vec<QueueData>,
    /// Static-topic mapping per broker, passed through untyped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic_queue_mapping_by_broker: Option<BTreeMap<String, serde_json::Value>>,
    /// Shoal only, and only to a request that asked for the Kafka view
    /// ([`crate::kafka_cluster`]): broker groups that left while serving the topic, with
    /// their queue count, so Kafka's partition numbering keeps their place.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka_departed: Option<BTreeMap<String, i32>>,
}

impl TopicRouteData {
    /// The queues a producer may send to (spec 3.2): for each writable QueueData whose broker
    /// has a master, ids `0..writeQueueNums`, brokers in name order.
    pub fn publish_queues(&self, topic: &str) -> Vec<MessageQueue> {
        let mut datas: Vec<&QueueData> = self.queue_datas.iter().collect();
        datas.sort_by(|a, b| a.broker_name.cmp(&b.broker_name));
        datas
            .into_iter()
            .filter(|q| perm::is_writeable(q.perm))
            .filter(|q| {
                self.broker_datas
                    .iter()
                    .any(|b| b.broker_name == q.broker_name && b.master_addr().is_some())
            })
            .flat_map(|q| {
                (0..q.write_queue_nums.max(0))
                    .map(move |id| MessageQueue::new(topic, q.broker_name.clone(), id))
            })
            .collect()
    }

    /// The queues a consumer subscribes to (spec 3.2): for each readable QueueData, ids
    /// `0..readQueueNums`.
    pub fn subscribe_queues(&self, topic: &str) -> Vec<MessageQueue> {
        self.queue_datas
            .iter()
            .filter(|q| perm::is_readable(q.perm))
            .flat_map(|q| {
                (0..q.read_queue_nums.max(0))
                    .map(move |id| MessageQueue::new(topic, q.broker_name.clone(), id))
            })
            .collect()
    }
}

/// One broker's queue layout for a topic.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QueueData {
    /// Broker name.
    pub broker_name: String,
    /// Permission bits.
    pub perm: i32,
    /// Number of readable queues.
    pub read_queue_nums: i32,
    /// Topic sysFlag.
    pub topic_sys_flag: i32,
    /// Number of writable queues.
    pub write_queue_nums: i32,
}

/// A broker (master and slaves) by name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BrokerData {
    /// Broker id → `ip:port`; id 0 is the master.
    pub broker_addrs: BTreeMap<i64, String>,
    /// Broker name.
    pub broker_name: String,
    /// Cluster name.
    pub cluster: String,
    /// Acting-master mode.
    pub enable_acting_master: bool,
    /// Zone name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone_name: Option<String>,
    /// Shoal only, and only to a request that asked for it ([`crate::kafka_cluster`]): broker
    /// id → the Kafka listener of that broker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kafka_listeners: Option<BTreeMap<i64, KafkaListener>>,
}

/// A broker's Kafka listener as it registered it with the name servers (Shoal only).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KafkaListener {
    /// The listener's Kafka node id.
    pub node_id: i32,
    /// `host:port` Kafka clients connect to.
    pub addr: String,
    /// A replicated group's master only: its master epoch, the partitions' Kafka leader epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_epoch: Option<i32>,
    /// A replicated group's master only: the broker ids (as registered: 0 for the master) of
    /// its in-sync set, the partitions' ISR.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_sync: Option<Vec<i64>>,
}

impl BrokerData {
    /// The master's address (broker id 0), if registered.
    pub fn master_addr(&self) -> Option<&str> {
        self.broker_addrs.get(&MASTER_ID).map(String::as_str)
    }

    /// The Kafka listener of the master, when the route carries listeners and it has one.
    pub fn master_kafka(&self) -> Option<&KafkaListener> {
        self.kafka_listeners.as_ref()?.get(&MASTER_ID)
    }
}

/// GET_BROKER_CLUSTER_INFO body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClusterInfo {
    /// Broker name → broker.
    pub broker_addr_table: BTreeMap<String, BrokerData>,
    /// Cluster name → broker names.
    pub cluster_addr_table: BTreeMap<String, BTreeSet<String>>,
}

/// A list of topic names (GET_ALL_TOPIC_LIST_FROM_NAMESERVER, GET_TOPICS_BY_CLUSTER, …).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicList {
    /// Broker address (some answers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker_addr: Option<String>,
    /// Topic names.
    pub topic_list: BTreeSet<String>,
}

/// A string table (GET_BROKER_RUNTIME_INFO, GET_KVLIST_BY_NAMESPACE, REGISTER_BROKER reply).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct KVTable {
    /// The entries.
    pub table: BTreeMap<String, String>,
}
