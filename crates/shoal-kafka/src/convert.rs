//! Kafka records <-> stored RocketMQ messages (the mapping of `docs/kafka.md`).
//!
//! Produce: each record becomes one message of the partition's queue; value -> body, key ->
//! `KEYS` (or `KAFKA_KEY_B64` when the key is not plain text), timestamp -> born timestamp,
//! `KAFKA=1` marks the origin. Headers are an ordered list in which a name may repeat and a
//! value may be binary, empty or null, and a fetch gives them back exactly: when every header
//! is plain text under a distinct name, each is a user property of that name, in order
//! (`TAGS` sets the RocketMQ tag); otherwise the whole list is kept in `KAFKA_HEADER_LIST`
//! (JSON `[[name, base64 value or null], ...]`), and the plain-text ones are also user
//! properties (a repeated name: its last value, as Kafka's `lastHeader`) for RocketMQ
//! consumers.
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
/// Headers that could not be user properties, as written before [`PROP_HEADER_LIST`]: JSON
/// array of `[name, base64 value or null]`, shown after the user properties. Still read.
pub const PROP_HEADERS: &str = "KAFKA_HEADERS";
/// Every header of a record, in order, when the user properties cannot show them exactly (a
/// repeated name, a value that is binary, empty or null, a name taken by RocketMQ): JSON array
/// of `[name, base64 value or null]`. A fetch shows exactly this list.
pub const PROP_HEADER_LIST: &str = "KAFKA_HEADER_LIST";
/// The first record of an idempotent producer's batch: `producer id:epoch:first sequence:last
/// sequence` (read back by a leader that has no state for the producer: `producer_log.rs`).
pub(crate) const PROP_PRODUCER: &str = "KAFKA_PRODUCER";

/// A record's headers in order: a name may repeat, a value may be null.
pub type HeaderList = Vec<(String, Option<Bytes>)>;

/// Properties the broker and RocketMQ clients use for bookkeeping; never shown as headers,
/// and a Kafka header with one of these names goes into [`PROP_HEADERS`].
pub(crate) const HIDDEN: &[&str] = &[
    PROP_ORIGIN,
    PROP_PRODUCER,
    PROP_KEY_B64,
    PROP_NULL_VALUE,
    PROP_HEADERS,
    PROP_HEADER_LIST,
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

/// Converts one Kafka record, whose headers are `headers` (as sent: kafka-protocol's map
/// keeps one value per name), to the message stored for (topic, partition).
pub fn record_to_message(
    record: &Record,
    headers: &[(String, Option<Bytes>)],
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
    // A header a property can carry: plain text under a name RocketMQ leaves to users.
    let as_property = |name: &str, value: &Option<Bytes>| -> Option<String> {
        let t = std::str::from_utf8(value.as_deref()?).ok()?;
        (plain_text(name) && plain_text(t) && !reserved_for_header(name)).then(|| t.to_string())
    };
    let distinct = headers
        .iter()
        .enumerate()
        .all(|(i, (n, _))| headers[..i].iter().all(|(m, _)| m != n));
    let exact = distinct && headers.iter().all(|(n, v)| as_property(n, v).is_some());
    for (name, value) in headers {
        // Reserved names never pass, so nothing set above is replaced; a repeated name keeps
        // its last value (`insert` replaces in place).
        if let Some(t) = as_property(name, value) {
            props.insert(name.clone(), t);
        }
    }
    if !exact {
        let list: Vec<(&str, Option<String>)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_ref().map(|v| B64.encode(v))))
            .collect();
        let json = serde_json::to_string(&list).map_err(|e| e.to_string())?;
        props.insert(PROP_HEADER_LIST.into(), json);
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

/// Parses [`PROP_HEADER_LIST`] or [`PROP_HEADERS`]; a malformed value yields no headers (it
/// was not written by us).
fn parse_packed(s: &str) -> HeaderList {
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

/// A stored message as a fetch shows it (the fields of a Kafka record that vary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownRecord {
    /// The message's queue offset.
    pub offset: i64,
    /// Creation time (the born timestamp).
    pub timestamp: i64,
    /// The record key (`None`: null).
    pub key: Option<Bytes>,
    /// The record value (`None`: null, a tombstone).
    pub value: Option<Bytes>,
    /// In order; a name may repeat.
    pub headers: HeaderList,
}

impl ShownRecord {
    /// As kafka-protocol's record (whose header map keeps one value per name).
    pub fn to_record(&self) -> Record {
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: self.offset,
            sequence: -1,
            timestamp: self.timestamp,
            key: self.key.clone(),
            value: self.value.clone(),
            headers: self
                .headers
                .iter()
                .map(|(k, v)| (StrBytes::from_string(k.clone()), v.clone()))
                .collect::<IndexMap<_, _>>(),
        }
    }
}

/// Builds the Kafka record a stored message is shown as.
pub fn message_to_record(msg: &MessageExt) -> ShownRecord {
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
    let headers = match props.get(PROP_HEADER_LIST) {
        Some(list) => parse_packed(list),
        None => {
            let mut headers: HeaderList = props
                .iter()
                .filter(|(name, _)| {
                    !(HIDDEN.contains(&name.as_str()) || (from_kafka && *name == property::KEYS))
                })
                .map(|(name, v)| (name.clone(), Some(Bytes::copy_from_slice(v.as_bytes()))))
                .collect();
            if let Some(packed) = props.get(PROP_HEADERS) {
                headers.extend(parse_packed(packed));
            }
            headers
        }
    };
    ShownRecord {
        offset: msg.queue_offset,
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
/// by RocketMQ producers are decompressed (up to `max_decompressed` bytes each). The batch
/// carries the leader epoch its first record was written in (`epochs`) and ends before the
/// first record of a later epoch (the next fetch starts there).
pub fn stored_to_batch(
    stored: &Bytes,
    max_decompressed: usize,
    epochs: &crate::epochs::LeaderEpochs,
) -> Result<BuiltBatch, String> {
    crate::batch_writer::write_batch(stored, max_decompressed, epochs)
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
    let mut records: Vec<Record> = run
        .messages
        .iter()
        .map(|m| message_to_record(m).to_record())
        .collect();
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
pub(crate) mod tests {
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

    /// The message stored for `r` (its headers as its map holds them).
    fn convert(r: &Record, partition: i32) -> MessageExtBrokerInner {
        let headers = crate::test_records::headers_of(r);
        record_to_message(r, &headers, "T", partition, host(), "c").unwrap()
    }

    /// The value of the first header named `name`.
    fn header<'a>(r: &'a ShownRecord, name: &str) -> Option<&'a Option<Bytes>> {
        r.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v)
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
        let m = convert(&r, 2);
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
            header(&back, "KEYS").is_none(),
            "a Kafka key is not repeated as a header"
        );
        assert_eq!(
            back.headers,
            vec![
                ("trace".to_string(), Some(Bytes::from_static(b"abc"))),
                ("TAGS".to_string(), Some(Bytes::from_static(b"red")))
            ]
        );
        assert!(
            p.get(PROP_HEADER_LIST).is_none(),
            "plain headers: properties only"
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
            header(&r, "TAGS").cloned().flatten().as_deref(),
            Some(&b"tagA"[..])
        );
        assert_eq!(
            header(&r, "KEYS").cloned().flatten().as_deref(),
            Some(&b"k1"[..])
        );
        assert!(header(&r, "UNIQ_KEY").is_some());
        assert!(header(&r, "CLUSTER").is_none());
    }

    fn arb_bytes() -> impl Strategy<Value = Option<Vec<u8>>> {
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40))
    }

    /// The case users reported: a repeated name, binary, ordered.
    #[test]
    fn repeated_binary_empty_and_null_headers_come_back_exactly() {
        let headers: HeaderList = vec![
            ("seq".into(), Some(Bytes::from_static(b"0"))),
            ("codec".into(), Some(Bytes::from_static(b"gzip"))),
            ("bin".into(), Some(Bytes::from_static(b"\x00\xff\x00\n\r"))),
            ("dup".into(), Some(Bytes::from_static(b"first"))),
            ("dup".into(), Some(Bytes::from_static(b"second"))),
            ("empty".into(), Some(Bytes::new())),
            ("null".into(), None),
        ];
        let r = record(Some(b"k"), Some(b"v"), &[]);
        let m = record_to_message(&r, &headers, "T", 0, host(), "c").unwrap();
        let back = message_to_record(&stored(&m, 0));
        assert_eq!(back.headers, headers);
        // A RocketMQ consumer sees the plain-text ones as properties (the last `dup`), and
        // the whole list in KAFKA_HEADER_LIST.
        let p = decode_properties(&m.properties);
        assert_eq!(p.get("seq").map(String::as_str), Some("0"));
        assert_eq!(p.get("codec").map(String::as_str), Some("gzip"));
        assert_eq!(p.get("dup").map(String::as_str), Some("second"));
        assert!(p.get("bin").is_none() && p.get("empty").is_none() && p.get("null").is_none());
        assert!(p.get(PROP_HEADER_LIST).is_some());
    }

    /// Header lists as produced: names from a few (so that they repeat), values null, empty,
    /// binary or text (with RocketMQ's property separators too).
    pub(crate) fn arb_headers() -> impl Strategy<Value = HeaderList> {
        let name = "[a-c]|TAGS|KEYS|KAFKA|KAFKA_HEADER_LIST|[ -~\u{1}\u{2}é]{1,8}";
        let value = proptest::option::of(prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..24),
            "[a-z0-9 \u{1}\u{2}]{0,10}".prop_map(String::into_bytes),
        ]);
        proptest::collection::vec(
            (name, value).prop_map(|(n, v)| (n, v.map(Bytes::from))),
            0..8,
        )
    }

    proptest! {
        #[test]
        fn records_survive_the_round_trip(
            key in arb_bytes(),
            value in arb_bytes(),
            headers in arb_headers(),
            ts in 0i64..4_000_000_000_000,
        ) {
            let mut r = record(key.as_deref(), value.as_deref(), &[]);
            r.timestamp = ts;
            let m = record_to_message(&r, &headers, "T", 0, host(), "c").unwrap();
            let back = message_to_record(&stored(&m, 3));
            prop_assert_eq!(back.key, r.key.clone());
            prop_assert_eq!(back.value, r.value.clone());
            prop_assert_eq!(back.timestamp, ts);
            prop_assert_eq!(&back.headers, &headers);
            // Every plain-text header under a name left to users is a property with the last
            // value of that name.
            let p = decode_properties(&m.properties);
            for (name, v) in &headers {
                let Some(t) = v.as_deref().and_then(|v| std::str::from_utf8(v).ok()) else {
                    continue;
                };
                if plain_text(name) && plain_text(t) && !reserved_for_header(name) {
                    let last = headers.iter().rev().find(|(n, v)| {
                        n == name && v.as_deref().and_then(|v| std::str::from_utf8(v).ok()).is_some_and(plain_text)
                    });
                    let want = last.and_then(|(_, v)| v.as_deref()).and_then(|v| std::str::from_utf8(v).ok());
                    prop_assert_eq!(p.get(name.as_str()).map(String::as_str), want);
                }
            }
        }
    }

    #[test]
    fn stored_messages_become_one_valid_batch() {
        let mut buf = Vec::new();
        for i in 0..5 {
            let r = record(Some(format!("k{i}").as_bytes()), Some(b"body"), &[]);
            let m = convert(&r, 0);
            let mut ext = stored(&m, 10 + i);
            ext.store_timestamp = 1;
            ext.encode(&mut buf).unwrap();
        }
        let built = stored_to_batch(&Bytes::from(buf), 1 << 20, &Default::default()).unwrap();
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
