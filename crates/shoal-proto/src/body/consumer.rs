//! Consumer-group bodies (spec 3.4, 3.6, 3.7, 8): member lists, locks, connections, stats,
//! offset resets, running info, assignments.

use super::enums::{
    language_code, ConsumeFromWhere, ConsumeResult, ConsumeType, MessageModel, MessageRequestMode,
};
use super::heartbeat::SubscriptionData;
use super::mq_key_map;
use super::topic::DataVersion;
use crate::{LanguageCode, MessageQueue};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// GET_CONSUMER_LIST_BY_GROUP response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GetConsumerListByGroupResponseBody {
    /// Client ids of the group's consumers.
    pub consumer_id_list: Vec<String>,
}

/// LOCK_BATCH_MQ request body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LockBatchRequestBody {
    /// Requesting client.
    pub client_id: String,
    /// Consumer group.
    pub consumer_group: String,
    /// Queues to lock (a Java set; order kept as received).
    pub mq_set: Vec<MessageQueue>,
    /// Only lock on this broker (no forwarding).
    pub only_this_broker: bool,
}

/// UNLOCK_BATCH_MQ request body (same shape as [`LockBatchRequestBody`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UnlockBatchRequestBody {
    /// Requesting client.
    pub client_id: String,
    /// Consumer group.
    pub consumer_group: String,
    /// Queues to unlock.
    pub mq_set: Vec<MessageQueue>,
    /// Only unlock on this broker.
    pub only_this_broker: bool,
}

/// LOCK_BATCH_MQ response body (required on SUCCESS).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LockBatchResponseBody {
    /// Queues now locked by the requester.
    #[serde(rename = "lockOKMQSet")]
    pub lock_ok_mq_set: Vec<MessageQueue>,
}

/// GET_CONSUMER_CONNECTION_LIST response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumerConnection {
    /// The group's connections.
    pub connection_set: Vec<Connection>,
    /// Where the group starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consume_from_where: Option<ConsumeFromWhere>,
    /// Consume type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consume_type: Option<ConsumeType>,
    /// Message model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_model: Option<MessageModel>,
    /// Topic → subscription.
    pub subscription_table: BTreeMap<String, SubscriptionData>,
}

/// One client connection as the broker sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Connection {
    /// Remote address `ip:port`.
    pub client_addr: String,
    /// Client id.
    pub client_id: String,
    /// Client language.
    #[serde(with = "language_code")]
    pub language: LanguageCode,
    /// Client version ordinal.
    pub version: i32,
}

/// GET_CONSUME_STATS response body.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumeStats {
    /// Consume TPS.
    pub consume_tps: f64,
    /// Queue → offsets.
    #[serde(with = "mq_key_map")]
    pub offset_table: BTreeMap<MessageQueue, OffsetWrapper>,
}

/// Offsets of one queue for one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OffsetWrapper {
    /// Queue max offset.
    pub broker_offset: i64,
    /// Committed offset.
    pub consumer_offset: i64,
    /// Store time of the last consumed message, ms.
    pub last_timestamp: i64,
    /// Last pulled offset.
    pub pull_offset: i64,
}

/// RESET_CONSUMER_CLIENT_OFFSET / INVOKE_BROKER_TO_RESET_OFFSET body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResetOffsetBody {
    /// Queue → new offset.
    #[serde(with = "mq_key_map")]
    pub offset_table: BTreeMap<MessageQueue, i64>,
}

/// GET_CONSUMER_RUNNING_INFO reply body.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumerRunningInfo {
    /// Thread dump (when asked for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jstack: Option<String>,
    /// POP queues.
    #[serde(with = "mq_key_map")]
    pub mq_pop_table: BTreeMap<MessageQueue, PopProcessQueueInfo>,
    /// Pulled queues.
    #[serde(with = "mq_key_map")]
    pub mq_table: BTreeMap<MessageQueue, ProcessQueueInfo>,
    /// Consumer properties (`PROP_CONSUMER_START_TIMESTAMP`, `consumeType`, …); scalar
    /// values of other JSON types are read as their text.
    #[serde(deserialize_with = "super::lenient::string_map")]
    pub properties: BTreeMap<String, String>,
    /// Topic → consume status.
    pub status_table: BTreeMap<String, ConsumeStatus>,
    /// Subscriptions.
    pub subscription_set: Vec<SubscriptionData>,
    /// User-defined info.
    #[serde(deserialize_with = "super::lenient::string_map")]
    pub user_consumer_info: BTreeMap<String, String>,
}

/// Client-side state of one pulled queue. Numbers and booleans are also read from strings:
/// the C++ client writes its 64-bit fields as JSON strings (`"cachedMsgMaxOffset" : "0"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessQueueInfo {
    /// Cached message count.
    #[serde(deserialize_with = "super::lenient::i32_or_string")]
    pub cached_msg_count: i32,
    /// Highest cached offset.
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub cached_msg_max_offset: i64,
    /// Lowest cached offset.
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub cached_msg_min_offset: i64,
    /// Cached size, MiB.
    #[serde(rename = "cachedMsgSizeInMiB")]
    #[serde(deserialize_with = "super::lenient::i32_or_string")]
    pub cached_msg_size_in_mib: i32,
    /// Committed offset.
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub commit_offset: i64,
    /// Dropped (Java's spelling).
    #[serde(deserialize_with = "super::lenient::bool_or_string")]
    pub droped: bool,
    /// Last consume time, ms.
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub last_consume_timestamp: i64,
    /// Last lock time, ms.
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub last_lock_timestamp: i64,
    /// Last pull time, ms.
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub last_pull_timestamp: i64,
    /// Locked (orderly).
    #[serde(deserialize_with = "super::lenient::bool_or_string")]
    pub locked: bool,
    /// Transaction message count.
    #[serde(deserialize_with = "super::lenient::i32_or_string")]
    pub transaction_msg_count: i32,
    /// Highest transaction message offset.
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub transaction_msg_max_offset: i64,
    /// Lowest transaction message offset.
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub transaction_msg_min_offset: i64,
    /// Unlock attempts.
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub try_unlock_times: i64,
}

/// Client-side state of one POP queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PopProcessQueueInfo {
    /// Dropped.
    pub droped: bool,
    /// Last pop time, ms.
    pub last_pop_timestamp: i64,
    /// Messages waiting for ack.
    pub wait_ack_count: i32,
}

/// Consume statistics of one topic.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ConsumeStatus {
    /// Failed messages.
    #[serde(rename = "consumeFailedMsgs")]
    #[serde(deserialize_with = "super::lenient::i64_or_string")]
    pub consume_failed_msgs: i64,
    /// Failed TPS.
    #[serde(rename = "consumeFailedTPS")]
    #[serde(deserialize_with = "super::lenient::f64_or_string")]
    pub consume_failed_tps: f64,
    /// OK TPS.
    #[serde(rename = "consumeOKTPS")]
    #[serde(deserialize_with = "super::lenient::f64_or_string")]
    pub consume_ok_tps: f64,
    /// Consume response time.
    #[serde(rename = "consumeRT")]
    #[serde(deserialize_with = "super::lenient::f64_or_string")]
    pub consume_rt: f64,
    /// Pull response time.
    #[serde(rename = "pullRT")]
    #[serde(deserialize_with = "super::lenient::f64_or_string")]
    pub pull_rt: f64,
    /// Pull TPS.
    #[serde(rename = "pullTPS")]
    #[serde(deserialize_with = "super::lenient::f64_or_string")]
    pub pull_tps: f64,
}

/// GET_TOPIC_STATS_INFO response body.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicStatsTable {
    /// Queue → offsets.
    #[serde(with = "mq_key_map")]
    pub offset_table: BTreeMap<MessageQueue, TopicOffset>,
    /// Put TPS of the topic.
    pub topic_put_tps: f64,
}

/// Offsets of one queue of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicOffset {
    /// Store time of the last message, ms.
    pub last_update_timestamp: i64,
    /// Max offset.
    pub max_offset: i64,
    /// Min offset.
    pub min_offset: i64,
}

/// A set of group names (QUERY_TOPIC_CONSUME_BY_WHO body).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GroupList {
    /// Group names.
    pub group_list: BTreeSet<String>,
}

/// CONSUME_MESSAGE_DIRECTLY reply body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumeMessageDirectlyResult {
    /// Auto commit (Java default true).
    pub auto_commit: bool,
    /// Outcome.
    pub consume_result: ConsumeResult,
    /// Orderly listener.
    pub order: bool,
    /// Details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remark: Option<String>,
    /// Time spent, ms (Java's spelling).
    pub spent_time_mills: i64,
}

impl Default for ConsumeMessageDirectlyResult {
    fn default() -> Self {
        Self {
            auto_commit: true,
            consume_result: ConsumeResult::Success,
            order: false,
            remark: None,
            spent_time_mills: 0,
        }
    }
}

/// GET_ALL_CONSUMER_OFFSET body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumerOffsetSerializeWrapper {
    /// Data version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_version: Option<DataVersion>,
    /// `topic@group` → queue id → offset.
    pub offset_table: BTreeMap<String, BTreeMap<i32, i64>>,
}

/// A consumer group's configuration on a broker (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SubscriptionGroupConfig {
    /// Attributes.
    pub attributes: BTreeMap<String, String>,
    /// Broker id to consume from.
    pub broker_id: i64,
    /// Broadcast consumption allowed.
    pub consume_broadcast_enable: bool,
    /// Consumption allowed.
    pub consume_enable: bool,
    /// Start from min offset for a new group.
    pub consume_from_min_enable: bool,
    /// Orderly consumption.
    pub consume_message_orderly: bool,
    /// Consume timeout, minutes.
    pub consume_timeout_minute: i32,
    /// Group name.
    pub group_name: String,
    /// Retry policy (passed through untyped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_retry_policy: Option<serde_json::Value>,
    /// Group sysFlag.
    pub group_sys_flag: i32,
    /// Send NOTIFY_CONSUMER_IDS_CHANGED on membership changes.
    pub notify_consumer_ids_changed_enable: bool,
    /// Max reconsume times before the DLQ.
    pub retry_max_times: i32,
    /// Retry topic queue count.
    pub retry_queue_nums: i32,
    /// Static subscriptions (passed through untyped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscription_data_set: Option<serde_json::Value>,
    /// Broker to use when consumption is slow.
    pub which_broker_when_consume_slowly: i64,
}

impl Default for SubscriptionGroupConfig {
    fn default() -> Self {
        Self {
            attributes: BTreeMap::new(),
            broker_id: 0,
            consume_broadcast_enable: true,
            consume_enable: true,
            consume_from_min_enable: true,
            consume_message_orderly: false,
            consume_timeout_minute: 15,
            group_name: String::new(),
            group_retry_policy: None,
            group_sys_flag: 0,
            notify_consumer_ids_changed_enable: true,
            retry_max_times: 16,
            retry_queue_nums: 1,
            subscription_data_set: None,
            which_broker_when_consume_slowly: 1,
        }
    }
}

/// GET_ALL_SUBSCRIPTIONGROUP_CONFIG body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SubscriptionGroupWrapper {
    /// Data version.
    pub data_version: DataVersion,
    /// Group → topic → forbidden bits.
    pub forbidden_table: BTreeMap<String, BTreeMap<String, i32>>,
    /// Group name → config.
    pub subscription_group_table: BTreeMap<String, SubscriptionGroupConfig>,
}

/// QUERY_ASSIGNMENT (400) request body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QueryAssignmentRequestBody {
    /// Client id.
    pub client_id: String,
    /// Consumer group.
    pub consumer_group: String,
    /// Message model.
    pub message_model: MessageModel,
    /// Allocation strategy name (`AVG`, …).
    pub strategy_name: String,
    /// Topic.
    pub topic: String,
}

/// QUERY_ASSIGNMENT response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QueryAssignmentResponseBody {
    /// Assigned queues.
    pub message_queue_assignments: Vec<MessageQueueAssignment>,
}

/// One assigned queue and how to consume it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MessageQueueAssignment {
    /// Extra attachments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attachments: Option<BTreeMap<String, String>>,
    /// The queue.
    pub message_queue: MessageQueue,
    /// PULL or POP.
    pub mode: MessageRequestMode,
}

impl Default for MessageQueueAssignment {
    fn default() -> Self {
        Self {
            attachments: None,
            message_queue: MessageQueue::new("", "", 0),
            mode: MessageRequestMode::Pull,
        }
    }
}

/// SET_MESSAGE_REQUEST_MODE (401) request body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SetMessageRequestModeRequestBody {
    /// Consumer group.
    pub consumer_group: String,
    /// PULL or POP.
    pub mode: MessageRequestMode,
    /// Number of clients sharing a POP queue.
    pub pop_share_queue_num: i32,
    /// Topic.
    pub topic: String,
}

/// One entry of BATCH_ACK_MESSAGE (200151): the acknowledged messages of one pop of one queue,
/// as a bit set over offsets from `startOffset` (bit `i` acknowledges `startOffset + i`).
/// RocketMQ writes short names (`c`, `t`, ...) and reads the long ones too; so does this.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchAck {
    /// Java's `BitSet.toByteArray()` (little-endian bytes; bit `j` of byte `i` is bit
    /// `8i + j`), written by fastjson as an array of signed bytes or a base64 string.
    #[serde(rename = "b", alias = "bitSet", with = "bit_set")]
    pub bit_set: Vec<u8>,
    /// Consumer group.
    #[serde(rename = "c", alias = "consumerGroup")]
    pub consumer_group: String,
    /// Invisible time of the receipts, ms.
    #[serde(rename = "it", alias = "invisibleTime")]
    pub invisible_time: i64,
    /// Pop time of the receipts, ms.
    #[serde(rename = "pt", alias = "popTime")]
    pub pop_time: i64,
    /// Queue id.
    #[serde(rename = "q", alias = "queueId")]
    pub queue_id: i32,
    /// `"1"` for the POP retry topic (`"0"` or absent: the topic itself).
    #[serde(rename = "r", alias = "retry")]
    pub retry: Option<String>,
    /// Revive queue id of the receipts.
    #[serde(rename = "rq", alias = "reviveQueueId")]
    pub revive_queue_id: i32,
    /// Offset of bit 0.
    #[serde(rename = "so", alias = "startOffset")]
    pub start_offset: i64,
    /// Topic (the subscribed one; `retry` says whether the queue is its POP retry topic's).
    #[serde(rename = "t", alias = "topic")]
    pub topic: String,
}

impl BatchAck {
    /// The acknowledged offsets, ascending; at most `limit` (a larger set is cut there).
    pub fn offsets(&self, limit: usize) -> Vec<i64> {
        let mut out = Vec::new();
        for (i, byte) in self.bit_set.iter().enumerate() {
            for j in 0..8 {
                if byte & (1 << j) != 0 {
                    if out.len() >= limit {
                        return out;
                    }
                    out.push(self.start_offset.saturating_add((i * 8 + j) as i64));
                }
            }
        }
        out
    }

    /// Sets the bits of `offsets` (each at or above `start_offset`).
    pub fn set_offsets(&mut self, offsets: &[i64]) {
        for &o in offsets {
            let Ok(bit) = usize::try_from(o - self.start_offset) else {
                continue;
            };
            if self.bit_set.len() <= bit / 8 {
                self.bit_set.resize(bit / 8 + 1, 0);
            }
            self.bit_set[bit / 8] |= 1 << (bit % 8);
        }
    }
}

/// BATCH_ACK_MESSAGE (200151) request body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BatchAckMessageRequestBody {
    /// The acks.
    pub acks: Vec<BatchAck>,
    /// The broker the receipts name.
    pub broker_name: String,
}

/// A Java `BitSet` as fastjson writes it: an array of signed bytes (written so) or a base64
/// string (read too).
mod bit_set {
    use serde::de::{self, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|b| *b as i8))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array of bytes or a base64 string")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = seq.next_element::<i64>()? {
                    if !(-128..=255).contains(&b) {
                        return Err(de::Error::custom(format!("{b} is not a byte")));
                    }
                    // At most 4 KiB of bits (32,768 offsets) per ack.
                    if out.len() >= 4096 {
                        return Err(de::Error::custom("bit set longer than 4096 bytes"));
                    }
                    out.push(b as u8);
                }
                Ok(out)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Vec<u8>, E> {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .ok()
                    .filter(|b| b.len() <= 4096)
                    .ok_or_else(|| E::custom("not a base64 bit set of at most 4096 bytes"))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Vec<u8>, E> {
                Ok(Vec::new())
            }
        }
        d.deserialize_any(V)
    }
}
