//! Kafka records and record batches as a producer sends them, for the crate's tests and
//! benches (unit tests, `tests/listener/` and `benches/convert.rs` include this file with
//! `#[path]`, so it is not part of the library; so does the `shoal` crate's
//! `tests/kafka_metrics.rs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]
// Each includer uses a part of it.
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

/// The creation time of the record at offset 0 (later offsets: one millisecond each).
pub const BASE_TIMESTAMP: i64 = 1_700_000_000_000;

/// A record of a non-idempotent producer at `offset` (creation time
/// `BASE_TIMESTAMP + offset`), with `headers` in order.
pub fn record(
    offset: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[(&str, Option<&[u8]>)],
) -> Record {
    let mut h = IndexMap::new();
    for (name, v) in headers {
        h.insert(
            StrBytes::from_string(name.to_string()),
            v.map(Bytes::copy_from_slice),
        );
    }
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: 0,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset,
        sequence: -1,
        timestamp: BASE_TIMESTAMP + offset,
        key: key.map(Bytes::copy_from_slice),
        value: value.map(Bytes::copy_from_slice),
        headers: h,
    }
}

/// A record's headers as a list, in its map's order.
pub fn headers_of(r: &Record) -> Vec<(String, Option<Bytes>)> {
    r.headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// One magic-2 record batch of `records` (CRC-32C, `compression`).
pub fn batch(records: &[Record], compression: Compression) -> BytesMut {
    let mut buf = BytesMut::new();
    let opts = RecordEncodeOptions {
        version: 2,
        compression,
    };
    RecordBatchEncoder::encode(&mut buf, records.iter(), &opts)
        .expect("kafka-protocol encodes a batch of test records");
    buf
}
