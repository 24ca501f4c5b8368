//! Kafka records <-> stored RocketMQ messages (the mapping of `docs/kafka.md`).
//!
//! Produce: each record becomes one message of the partition's queue; value -> body, key ->
//! `KEYS` (or `KAFKA_KEY_B64` when the key is not plain text), timestamp -> born timestamp,
//! text headers -> user properties of the same name (`TAGS` sets the RocketMQ tag), other
//! headers -> `KAFKA_HEADERS` (JSON, base64 values), `KAFKA=1` marks the origin.
//! Fetch: the reverse, plus RocketMQ messages' `TAGS`, `KEYS` and user properties as headers.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Record, TimestampType};
use shoal_proto::message::property::{self, Properties};
use shoal_proto::message::{encode_properties, MessageExt};
use shoal_store::MessageExtBrokerInner;
use std::net::SocketAddr;

/// Marks a message produced over Kafka (`KAFKA=1`).
pub const PROP_ORIGIN: &str = "KAFKA";
/// Base64 of a record key that is not plain text.
pub const PROP_KEY_B64: &str = "KAFKA_KEY_B64";
/// [`PROP_KEY_B64`] of an empty key (a property value cannot be empty).
pub(crate) const EMPTY_KEY: &str = "-";
/// Set when the record value was null (a tombstone); the body is empty.
pub const PROP_NULL_VALUE: &str = "KAFKA_NULL_VALUE";
/// Headers that cannot be user properties: JSON array of `[name, base64 value or null]`.
pub const PROP_HEADERS: &str = "KAFKA_HEADERS";

/// Properties the broker and RocketMQ clients use for bookkeeping; never shown as headers,
/// and a Kafka header with one of these names goes into [`PROP_HEADERS`].
pub(crate) const HIDDEN: &[&str] = &[
    PROP_ORIGIN,
    PROP_KEY_B64,
    PROP_NULL_VALUE,
    PROP_HEADERS,
    property::CLUSTER,
    property::WAIT,
    property::MSG_REGION,
    property::TRACE_ON,
    property::DELAY,
    property::REAL_TOPIC,
    property::REAL_QID,
    property::RETRY_TOPIC,
    property::TRAN_MSG,
    property::PGROUP,
    property::MIN_OFFSET,
    property::MAX_OFFSET,
    property::TRANSACTION_ID,
    property::INNER_NUM,
    property::INNER_BASE,
    property::CRC32,
];

/// Names a Kafka header may not take as a user property (it would change how RocketMQ treats
/// the message). `TAGS` is allowed on purpose: it sets the tag.
fn reserved_for_header(name: &str) -> bool {
    HIDDEN.contains(&name) || name == property::KEYS || name == property::UNIQ_KEY
}

fn plain_text(s: &str) -> bool {
    !s.is_empty()
        && !s.contains(property::NAME_VALUE_SEPARATOR)
        && !s.contains(property::PROPERTY_SEPARATOR)
}

/// Converts one Kafka record to the message stored for (topic, partition).
pub fn record_to_message(
    record: &Record,
    topic: &str,
    partition: i32,
    born_host: SocketAddr,
    cluster: &str,
) -> Result<MessageExtBrokerInner, String> {
    let mut props = Properties::default();
    props.insert(PROP_ORIGIN.into(), "1".into());
    if let Some(key) = &record.key {
        match std::str::from_utf8(key) {
            Ok(k) if plain_text(k) => {
                props.insert(property::KEYS.into(), k.to_string());
            }
            _ if key.is_empty() => {
                props.insert(PROP_KEY_B64.into(), EMPTY_KEY.into());
            }
            _ => {
                props.insert(PROP_KEY_B64.into(), B64.encode(key));
            }
        }
    }
    if record.value.is_none() {
        props.insert(PROP_NULL_VALUE.into(), "true".into());
    }
    let mut packed: Vec<(String, Option<String>)> = Vec::new();
    for (name, value) in &record.headers {
        let text = value.as_ref().and_then(|v| std::str::from_utf8(v).ok());
        match text {
            Some(t)
                if plain_text(name.as_str())
                    && plain_text(t)
                    && !reserved_for_header(name.as_str())
                    && !props.contains_key(name.as_str()) =>
            {
                props.insert(name.to_string(), t.to_string());
            }
            _ => packed.push((name.to_string(), value.as_ref().map(|v| B64.encode(v)))),
        }
    }
    if !packed.is_empty() {
        let json = serde_json::to_string(&packed).map_err(|e| e.to_string())?;
        props.insert(PROP_HEADERS.into(), json);
    }
    props.insert(property::CLUSTER.into(), cluster.to_string());
    let properties = encode_properties(&props).map_err(|e| e.to_string())?;
    Ok(MessageExtBrokerInner {
        topic: topic.to_string(),
        queue_id: partition,
        flag: 0,
        sys_flag: 0,
        born_timestamp: record.timestamp,
        born_host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: record.value.clone().unwrap_or_default(),
        properties,
        known: None,
    })
}

/// Parses [`PROP_HEADERS`]; a malformed value yields no headers (it was not written by us).
fn parse_packed(s: &str) -> Vec<(String, Option<Bytes>)> {
    let Ok(list) = serde_json::from_str::<Vec<(String, Option<String>)>>(s) else {
        return Vec::new();
    };
    list.into_iter()
        .filter_map(|(name, v)| match v {
            None => Some((name, None)),
            Some(v) => B64.decode(v).ok().map(|b| (name, Some(Bytes::from(b)))),
        })
        .collect()
}

/// Builds the Kafka record a stored message is shown as.
pub fn message_to_record(msg: &MessageExt) -> Record {
    let props = &msg.properties;
    let from_kafka = props.contains_key(PROP_ORIGIN);
    let key = if let Some(b64) = props.get(PROP_KEY_B64) {
        if b64 == EMPTY_KEY {
            Some(Bytes::new())
        } else {
            B64.decode(b64).ok().map(Bytes::from)
        }
    } else {
        props
            .get(property::KEYS)
            .map(|k| Bytes::copy_from_slice(k.as_bytes()))
    };
    let value = if props.contains_key(PROP_NULL_VALUE) {
        None
    } else {
        Some(msg.body.clone())
    };
    let mut headers: IndexMap<StrBytes, Option<Bytes>> = IndexMap::new();
    for (name, v) in props {
        if HIDDEN.contains(&name.as_str()) || (from_kafka && name == property::KEYS) {
            continue;
        }
        headers.insert(
            StrBytes::from_string(name.clone()),
            Some(Bytes::copy_from_slice(v.as_bytes())),
        );
    }
    if let Some(packed) = props.get(PROP_HEADERS) {
        for (name, v) in parse_packed(packed) {
            headers.insert(StrBytes::from_string(name), v);
        }
    }
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: msg.queue_offset,
        sequence: -1,
        timestamp: msg.born_timestamp,
        key,
        value,
        headers,
    }
}

/// What [`stored_to_batch`] built.
#[derive(Debug)]
pub struct BuiltBatch {
    /// One magic-2 record batch (CRC-32C), uncompressed; empty when no message was given.
    pub bytes: Bytes,
    /// Records in it.
    pub records: usize,
    /// Offset after the last record (next fetch offset).
    pub next_offset: Option<i64>,
}

/// Rebuilds one record batch from stored message records (a `get_messages` answer): each
/// record is shown as [`message_to_record`] shows its message, read from the stored bytes
/// without decoding them into messages where it can be (see `batch_writer`). Bodies compressed
/// by RocketMQ producers are decompressed (up to `max_decompressed` bytes each).
pub fn stored_to_batch(stored: &Bytes, max_decompressed: usize) -> Result<BuiltBatch, String> {
    crate::batch_writer::write_batch(stored, max_decompressed)
}

/// The conversion [`stored_to_batch`] replaced, kept as its reference: every record decoded
/// into a message, converted by [`message_to_record`] and encoded by kafka-protocol.
#[cfg(test)]
pub(crate) fn stored_to_batch_via_messages(
    stored: &Bytes,
    max_decompressed: usize,
) -> Result<BuiltBatch, String> {
    use bytes::BytesMut;
    use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
    use shoal_proto::message::record::{decode_records, DecodeOptions};
    let run = decode_records(
        stored,
        &DecodeOptions {
            verify_crc: false,
            decompress_body: true,
            max_decompressed_size: max_decompressed,
        },
    );
    if let Some(e) = &run.error {
        if run.messages.is_empty() {
            return Err(format!("stored record undecodable: {e}"));
        }
        tracing::warn!(error = %e, "a stored record could not be decoded; the fetch stops before it");
    }
    if run.messages.is_empty() {
        return Ok(BuiltBatch {
            bytes: Bytes::new(),
            records: 0,
            next_offset: None,
        });
    }
    let base = run.messages[0].queue_offset;
    let mut records: Vec<Record> = run.messages.iter().map(message_to_record).collect();
    // One batch: the encoder keeps records together while offset - sequence is constant, so
    // number them from -1 (base sequence -1, "no sequence", as for non-idempotent batches).
    for r in &mut records {
        r.sequence = (r.offset - base) as i32 - 1;
    }
    let next_offset = records.last().map(|r| r.offset + 1);
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("record batch encoding failed: {e}"))?;
    Ok(BuiltBatch {
        bytes: buf.freeze(),
        records: records.len(),
        next_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::RecordBatchDecoder;
    use proptest::prelude::*;
    use shoal_proto::message::decode_properties;

    fn stored(inner: &MessageExtBrokerInner, offset: i64) -> MessageExt {
        MessageExt {
            store_size: 0,
            body_crc: 0,
            queue_id: inner.queue_id,
            flag: inner.flag,
            queue_offset: offset,
            commit_log_offset: 1000 + offset,
            sys_flag: inner.sys_flag,
            born_timestamp: inner.born_timestamp,
            born_host: inner.born_host,
            store_timestamp: inner.born_timestamp + 1,
            store_host: inner.born_host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: inner.body.clone(),
            topic: inner.topic.clone(),
            properties: decode_properties(&inner.properties),
        }
    }

    /// A record at offset 0.
    fn record(
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&str, Option<&[u8]>)],
    ) -> Record {
        crate::test_records::record(0, key, value, headers)
    }

    fn sbs(s: &str) -> StrBytes {
        StrBytes::from_string(s.to_string())
    }

    fn host() -> SocketAddr {
        "127.0.0.1:1234".parse().unwrap()
    }

    #[test]
    fn key_and_text_headers_become_properties() {
        let r = record(
            Some(b"order-1"),
            Some(b"v"),
            &[("trace", Some(b"abc")), ("TAGS", Some(b"red"))],
        );
        let m = record_to_message(&r, "T", 2, host(), "c").unwrap();
        let p = decode_properties(&m.properties);
        assert_eq!(p.get("KEYS").map(String::as_str), Some("order-1"));
        assert_eq!(p.get("trace").map(String::as_str), Some("abc"));
        assert_eq!(p.get("TAGS").map(String::as_str), Some("red"));
        assert_eq!(m.queue_id, 2);
        assert_eq!(m.born_timestamp, 1_700_000_000_000);
        let back = message_to_record(&stored(&m, 7));
        assert_eq!(back.key.as_deref(), Some(&b"order-1"[..]));
        assert_eq!(back.offset, 7);
        assert!(
            !back.headers.contains_key(&sbs("KEYS")),
            "a Kafka key is not repeated as a header"
        );
        assert_eq!(
            back.headers
                .get(&sbs("trace"))
                .cloned()
                .flatten()
                .as_deref(),
            Some(&b"abc"[..])
        );
    }

    #[test]
    fn rocketmq_tags_and_keys_appear_as_headers() {
        let mut props = Properties::default();
        props.insert("TAGS".into(), "tagA".into());
        props.insert("KEYS".into(), "k1".into());
        props.insert("UNIQ_KEY".into(), "ABC".into());
        props.insert("CLUSTER".into(), "DefaultCluster".into());
        let m = MessageExtBrokerInner {
            topic: "T".into(),
            queue_id: 0,
            flag: 0,
            sys_flag: 0,
            born_timestamp: 5,
            born_host: host(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: Bytes::from_static(b"hello"),
            properties: encode_properties(&props).unwrap(),
            known: None,
        };
        let r = message_to_record(&stored(&m, 0));
        assert_eq!(r.key.as_deref(), Some(&b"k1"[..]));
        assert_eq!(
            r.headers.get(&sbs("TAGS")).cloned().flatten().as_deref(),
            Some(&b"tagA"[..])
        );
        assert_eq!(
            r.headers.get(&sbs("KEYS")).cloned().flatten().as_deref(),
            Some(&b"k1"[..])
        );
        assert!(r.headers.contains_key(&sbs("UNIQ_KEY")));
        assert!(!r.headers.contains_key(&sbs("CLUSTER")));
    }

    fn arb_bytes() -> impl Strategy<Value = Option<Vec<u8>>> {
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40))
    }

    proptest! {
        #[test]
        fn records_survive_the_round_trip(
            key in arb_bytes(),
            value in arb_bytes(),
            headers in proptest::collection::btree_map("[ -~\u{1}\u{2}é]{1,12}", arb_bytes(), 0..5),
            ts in 0i64..4_000_000_000_000,
        ) {
            let hs: Vec<(&str, Option<&[u8]>)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_deref())).collect();
            let mut r = record(key.as_deref(), value.as_deref(), &hs);
            r.timestamp = ts;
            let m = record_to_message(&r, "T", 0, host(), "c").unwrap();
            let back = message_to_record(&stored(&m, 3));
            prop_assert_eq!(back.key, r.key.clone());
            prop_assert_eq!(back.value, r.value.clone());
            prop_assert_eq!(back.timestamp, ts);
            let mut want: Vec<_> = r.headers.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
            let mut got: Vec<_> = back.headers.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
            want.sort();
            got.sort();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn stored_messages_become_one_valid_batch() {
        let mut buf = Vec::new();
        for i in 0..5 {
            let r = record(Some(format!("k{i}").as_bytes()), Some(b"body"), &[]);
            let m = record_to_message(&r, "T", 0, host(), "c").unwrap();
            let mut ext = stored(&m, 10 + i);
            ext.store_timestamp = 1;
            ext.encode(&mut buf).unwrap();
        }
        let built = stored_to_batch(&Bytes::from(buf), 1 << 20).unwrap();
        assert_eq!(built.records, 5);
        assert_eq!(built.next_offset, Some(15));
        let mut b = built.bytes.clone();
        let sets = RecordBatchDecoder::decode_all(&mut b).unwrap();
        assert_eq!(sets.len(), 1, "one batch");
        let offsets: Vec<i64> = sets[0].records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![10, 11, 12, 13, 14]);
        assert_eq!(sets[0].records[4].key.as_deref(), Some(&b"k4"[..]));
    }
}
