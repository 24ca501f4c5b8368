//! Between the gRPC messages and the broker's: statuses from remoting response codes, a
//! stored message as a `pb::Message` (system properties, user properties, digest, receipt),
//! a sent `pb::Message` as the broker's outgoing message, times and durations.

use crate::pb;
use pb::Code;
use shoal_broker::{OutgoingMessage, Refusal};
use shoal_proto::code::response_code as resp;
use shoal_proto::message::{property, MessageExt, Properties};
use std::time::Duration;

/// A status.
pub(crate) fn status(code: Code, message: impl Into<String>) -> pb::Status {
    pb::Status {
        code: code as i32,
        message: message.into(),
    }
}

/// OK.
pub(crate) fn ok() -> pb::Status {
    status(Code::Ok, "OK")
}

/// The gRPC code of a broker refusal (RocketMQ's proxy maps them the same way).
pub(crate) fn code_of(r: &Refusal) -> Code {
    match r.code {
        resp::TOPIC_NOT_EXIST => Code::TopicNotFound,
        resp::SUBSCRIPTION_GROUP_NOT_EXIST => Code::ConsumerGroupNotFound,
        resp::NO_PERMISSION => Code::Forbidden,
        resp::SUBSCRIPTION_PARSE_FAILED => Code::IllegalFilterExpression,
        resp::NO_MESSAGE => Code::InvalidReceiptHandle,
        resp::SYSTEM_BUSY | resp::SERVICE_NOT_AVAILABLE | resp::POLLING_FULL => {
            Code::TooManyRequests
        }
        resp::FLUSH_DISK_TIMEOUT => Code::MasterPersistenceTimeout,
        resp::MESSAGE_ILLEGAL if r.remark.contains("messages, not") => {
            Code::MessagePropertyConflictWithType
        }
        resp::MESSAGE_ILLEGAL if r.remark.contains("exceeds the limit") => {
            Code::MessageBodyTooLarge
        }
        resp::MESSAGE_ILLEGAL | resp::INVALID_PARAMETER => Code::BadRequest,
        _ => Code::InternalServerError,
    }
}

/// The status of a broker refusal.
pub(crate) fn refused(r: &Refusal) -> pb::Status {
    status(code_of(r), r.remark.clone())
}

pub(crate) fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

pub(crate) fn millis_of_timestamp(t: &prost_types::Timestamp) -> i64 {
    t.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(t.nanos) / 1_000_000)
}

pub(crate) fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// A protobuf duration as milliseconds (negative ones as 0).
pub(crate) fn millis_of(d: &prost_types::Duration) -> u64 {
    let ms = d
        .seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(d.nanos) / 1_000_000);
    ms.max(0) as u64
}

/// Java's `CRC32` value as RocketMQ 5 clients write and check it: upper-case hex, no padding.
pub(crate) fn crc32_checksum(body: &[u8]) -> String {
    format!("{:X}", crc32fast::hash(body))
}

/// Properties the broker or RocketMQ itself sets (RocketMQ's `MessageConst` names): carried
/// in system properties or not shown to the application, never as user properties.
fn is_system_property(k: &str) -> bool {
    matches!(
        k,
        property::KEYS
            | property::TAGS
            | property::WAIT
            | property::DELAY
            | property::RETRY_TOPIC
            | property::REAL_TOPIC
            | property::REAL_QID
            | property::TRAN_MSG
            | property::PGROUP
            | property::MIN_OFFSET
            | property::MAX_OFFSET
            | property::BUYER_ID
            | property::ORIGIN_MESSAGE_ID
            | property::TRANSFER_FLAG
            | property::CORRECTION_FLAG
            | property::MQ2_FLAG
            | property::RECONSUME_TIME
            | property::MSG_REGION
            | property::TRACE_ON
            | property::UNIQ_KEY
            | property::EXTEND_UNIQ_INFO
            | property::MAX_RECONSUME_TIMES
            | property::CONSUME_START_TIME
            | property::INNER_NUM
            | property::INNER_BASE
            | property::DUP_INFO
            | property::CHECK_IMMUNITY_TIME_IN_SECONDS
            | property::TRAN_PREPARED_QUEUE_OFFSET
            | property::TRANSACTION_ID
            | property::TRANSACTION_CHECK_TIMES
            | property::INSTANCE_ID
            | property::CORRELATION_ID
            | property::REPLY_TO_CLIENT
            | property::TTL
            | property::ARRIVE_TIME
            | property::PUSH_REPLY_TIME
            | property::CLUSTER
            | property::MSG_TYPE
            | property::POP_CK
            | property::POP_CK_OFFSET
            | property::FIRST_POP_TIME
            | property::SHARDING_KEY
            | property::FORWARD_QUEUE_ID
            | property::REDIRECT
            | property::INNER_MULTI_DISPATCH
            | property::INNER_MULTI_QUEUE_OFFSET
            | property::TRACE_CONTEXT
            | property::TIMER_DELAY_SEC
            | property::TIMER_DELIVER_MS
            | property::TIMER_DELAY_MS
            | property::TIMER_ENQUEUE_MS
            | property::TIMER_DEQUEUE_MS
            | property::TIMER_ROLL_TIMES
            | property::TIMER_OUT_MS
            | property::TIMER_DEL_UNIQKEY
            | property::TIMER_DELAY_LEVEL
            | property::BORN_HOST
            | "DLQ_ORIGIN_TOPIC"
            | "DLQ_ORIGIN_MESSAGE_ID"
    )
}

fn resource(name: &str) -> pb::Resource {
    pb::Resource {
        resource_namespace: String::new(),
        name: name.to_string(),
    }
}

pub(crate) fn named(name: &str) -> pb::Resource {
    resource(name)
}

/// The message type RocketMQ gives a stored message.
fn message_type_of(m: &MessageExt) -> pb::MessageType {
    use shoal_proto::body::TopicMessageType as T;
    match T::of_message(|k| m.property(k)) {
        T::Transaction => pb::MessageType::Transaction,
        T::Delay => pb::MessageType::Delay,
        T::Fifo => pb::MessageType::Fifo,
        _ => pb::MessageType::Normal,
    }
}

/// How a stored message is shown to a receiver.
pub(crate) struct Delivery<'a> {
    /// The topic the application subscribed to (a redelivery is stored in the retry topic).
    pub topic: &'a str,
    /// Receipt handle, when received under lease.
    pub receipt_handle: Option<String>,
    /// Lease length.
    pub invisible: Option<Duration>,
    /// Which delivery this is.
    pub attempt: Option<u32>,
}

/// A stored message as a `pb::Message`.
pub(crate) fn to_pb(m: &MessageExt, d: Delivery<'_>) -> pb::Message {
    let user_properties = m
        .properties
        .iter()
        .filter(|(k, _)| !is_system_property(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let message_id = m
        .uniq_key()
        .map(str::to_string)
        .unwrap_or_else(|| m.offset_msg_id());
    let keys = m
        .keys()
        .map(|k| {
            k.split(property::KEY_SEPARATOR)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let number = |k: &str| m.property(k).and_then(|v| v.trim().parse::<i64>().ok());
    let delivery_timestamp = number(property::TIMER_DELIVER_MS).map(timestamp);
    let system = pb::SystemProperties {
        tag: m.tags().map(str::to_string),
        keys,
        message_id,
        body_digest: Some(pb::Digest {
            r#type: pb::DigestType::Crc32 as i32,
            checksum: crc32_checksum(&m.body),
        }),
        body_encoding: pb::Encoding::Identity as i32,
        message_type: message_type_of(m) as i32,
        born_timestamp: Some(timestamp(m.born_timestamp)),
        born_host: m.born_host.ip().to_string(),
        store_timestamp: Some(timestamp(m.store_timestamp)),
        store_host: m.store_host.to_string(),
        delivery_timestamp,
        receipt_handle: d.receipt_handle,
        queue_id: m.queue_id,
        queue_offset: Some(m.queue_offset),
        invisible_duration: d.invisible.map(duration),
        delivery_attempt: d.attempt.map(|a| a as i32),
        message_group: m.property(property::SHARDING_KEY).map(str::to_string),
        trace_context: m.property(property::TRACE_CONTEXT).map(str::to_string),
        orphaned_transaction_recovery_duration: number(property::CHECK_IMMUNITY_TIME_IN_SECONDS)
            .map(|s| duration(Duration::from_secs(s.max(0) as u64))),
        dead_letter_queue: None,
        lite_topic: None,
        priority: None,
    };
    pb::Message {
        topic: Some(resource(d.topic)),
        user_properties,
        system_properties: Some(system),
        body: m.body.to_vec(),
    }
}

/// Longest a timed message may wait (RocketMQ's `timerMaxDelaySec`, 3 days).
pub(crate) const MAX_DELAY_MS: i64 = 3 * 24 * 3_600_000;

/// A sent `pb::Message` as the broker's outgoing message; `Err` with the status to answer.
pub(crate) fn from_pb(
    m: pb::Message,
    producer_group: &str,
    now_ms: i64,
) -> Result<OutgoingMessage, pb::Status> {
    let topic = m
        .topic
        .map(|t| t.name)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| status(Code::IllegalTopic, "the message names no topic"))?;
    let sys = m.system_properties.unwrap_or_default();
    let mut props = Properties::default();
    for (k, v) in m.user_properties {
        if is_system_property(&k) {
            return Err(status(
                Code::IllegalMessagePropertyKey,
                format!("property {k:?} is reserved by RocketMQ"),
            ));
        }
        props.insert(k, v);
    }
    if sys.message_id.is_empty() {
        return Err(status(Code::IllegalMessageId, "the message has no id"));
    }
    props.insert(property::UNIQ_KEY.into(), sys.message_id.clone());
    if let Some(tag) = sys.tag.filter(|t| !t.is_empty()) {
        if tag.contains('|') {
            return Err(status(
                Code::IllegalMessageTag,
                format!("tag {tag:?} holds '|'"),
            ));
        }
        props.insert(property::TAGS.into(), tag);
    }
    if !sys.keys.is_empty() {
        props.insert(
            property::KEYS.into(),
            sys.keys.join(property::KEY_SEPARATOR),
        );
    }
    if let Some(g) = sys.message_group.filter(|g| !g.is_empty()) {
        props.insert(property::SHARDING_KEY.into(), g);
    }
    if let Some(t) = sys.trace_context.filter(|t| !t.is_empty()) {
        props.insert(property::TRACE_CONTEXT.into(), t);
    }
    if let Some(at) = &sys.delivery_timestamp {
        let at = millis_of_timestamp(at);
        if at - now_ms > MAX_DELAY_MS {
            return Err(status(
                Code::IllegalDeliveryTime,
                format!(
                    "the delivery time is more than {} days ahead",
                    MAX_DELAY_MS / 86_400_000
                ),
            ));
        }
        if at > now_ms {
            props.insert(property::TIMER_DELIVER_MS.into(), at.to_string());
        }
    }
    let transactional = sys.message_type == pb::MessageType::Transaction as i32;
    if transactional {
        if let Some(d) = &sys.orphaned_transaction_recovery_duration {
            props.insert(
                property::CHECK_IMMUNITY_TIME_IN_SECONDS.into(),
                (millis_of(d) / 1000).to_string(),
            );
        }
    }
    let body = if sys.body_encoding == pb::Encoding::Gzip as i32 {
        gunzip(&m.body)?
    } else {
        m.body
    };
    let born = sys
        .born_timestamp
        .as_ref()
        .map_or(now_ms, millis_of_timestamp);
    Ok(OutgoingMessage {
        topic,
        queue_id: None,
        body: body.into(),
        properties: props,
        producer_group: producer_group.to_string(),
        transactional,
        born_timestamp: born,
    })
}

/// Most bytes a gzip body may grow to.
const MAX_GUNZIPPED: u64 = 64 * 1024 * 1024;

fn gunzip(body: &[u8]) -> Result<Vec<u8>, pb::Status> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(MAX_GUNZIPPED + 1)
        .read_to_end(&mut out)
        .map_err(|e| status(Code::MessageCorrupted, format!("gzip body: {e}")))?;
    if out.len() as u64 > MAX_GUNZIPPED {
        return Err(status(
            Code::MessageBodyTooLarge,
            "the gzip body inflates past 64 MiB",
        ));
    }
    Ok(out)
}

/// The message type a sent message declares, as the topic's types name them.
pub(crate) fn declared_type(m: &pb::Message) -> shoal_proto::body::TopicMessageType {
    use shoal_proto::body::TopicMessageType as T;
    let t = m.system_properties.as_ref().map_or(0, |s| s.message_type);
    match pb::MessageType::try_from(t) {
        Ok(pb::MessageType::Fifo) => T::Fifo,
        Ok(pb::MessageType::Delay) => T::Delay,
        Ok(pb::MessageType::Transaction) => T::Transaction,
        _ => T::Normal,
    }
}

/// The gRPC message type of a topic message type.
pub(crate) fn pb_type(t: shoal_proto::body::TopicMessageType) -> pb::MessageType {
    use shoal_proto::body::TopicMessageType as T;
    match t {
        T::Normal => pb::MessageType::Normal,
        T::Fifo => pb::MessageType::Fifo,
        T::Delay => pb::MessageType::Delay,
        T::Transaction => pb::MessageType::Transaction,
        T::Unspecified | T::Mixed => pb::MessageType::Unspecified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_as_java_writes_them() {
        // java.util.zip.CRC32 of "hello" is 907060870 = 0x3610A686.
        assert_eq!(crc32_checksum(b"hello"), "3610A686");
        // No zero padding (Long.toHexString).
        assert_eq!(crc32_checksum(b""), "0");
    }

    #[test]
    fn times_round_trip() {
        for ms in [0, 1, 999, 1_700_000_000_123, -1] {
            assert_eq!(millis_of_timestamp(&timestamp(ms)), ms);
        }
        assert_eq!(millis_of(&duration(Duration::from_millis(1_500))), 1_500);
        assert_eq!(
            millis_of(&prost_types::Duration {
                seconds: -3,
                nanos: 0
            }),
            0
        );
    }

    #[test]
    fn sent_messages_become_broker_messages() {
        let now = 1_700_000_000_000;
        let m = pb::Message {
            topic: Some(named("T")),
            user_properties: [("color".to_string(), "red".to_string())].into(),
            system_properties: Some(pb::SystemProperties {
                tag: Some("a".into()),
                keys: vec!["k1".into(), "k2".into()],
                message_id: "01ABC".into(),
                message_type: pb::MessageType::Fifo as i32,
                message_group: Some("g1".into()),
                delivery_timestamp: Some(timestamp(now + 5_000)),
                ..Default::default()
            }),
            body: b"hi".to_vec(),
        };
        let o = from_pb(m.clone(), "PG", now).unwrap();
        assert_eq!(o.topic, "T");
        assert_eq!(o.properties.get("UNIQ_KEY").unwrap(), "01ABC");
        assert_eq!(o.properties.get("TAGS").unwrap(), "a");
        assert_eq!(o.properties.get("KEYS").unwrap(), "k1 k2");
        assert_eq!(o.properties.get("__SHARDINGKEY").unwrap(), "g1");
        assert_eq!(
            o.properties.get("TIMER_DELIVER_MS").unwrap(),
            &(now + 5_000).to_string()
        );
        assert_eq!(o.properties.get("color").unwrap(), "red");
        assert!(!o.transactional);
        assert_eq!(declared_type(&m), shoal_proto::body::TopicMessageType::Fifo);
        // Reserved keys, a missing id and far delivery times are refused.
        let mut bad = m.clone();
        bad.user_properties.insert("UNIQ_KEY".into(), "x".into());
        assert_eq!(
            from_pb(bad, "PG", now).unwrap_err().code,
            Code::IllegalMessagePropertyKey as i32
        );
        let mut bad = m.clone();
        if let Some(s) = bad.system_properties.as_mut() {
            s.delivery_timestamp = Some(timestamp(now + MAX_DELAY_MS + 1_000));
        }
        assert_eq!(
            from_pb(bad, "PG", now).unwrap_err().code,
            Code::IllegalDeliveryTime as i32
        );
    }
}
