//! The batch written from slices is byte for byte the batch the message conversion and
//! kafka-protocol's encoder build, for Kafka-produced and RocketMQ messages alike.

use super::*;
use crate::convert::{record_to_message, stored_to_batch_via_messages};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use proptest::prelude::*;
use shoal_proto::message::compression::{compress_body, CompressionType};
use shoal_proto::message::record::{encode_record, RecordFields};
use std::net::SocketAddr;

fn host() -> SocketAddr {
    "127.0.0.1:1234".parse().unwrap()
}

/// One stored record: `properties` as encoded, at `queue_offset`.
fn put_stored(
    out: &mut Vec<u8>,
    queue_offset: i64,
    born_timestamp: i64,
    sys_flag: i32,
    body: &[u8],
    properties: &str,
) {
    encode_record(
        &RecordFields {
            topic: "T",
            queue_id: 0,
            flag: 0,
            queue_offset,
            physical_offset: 1000 + queue_offset,
            sys_flag,
            born_timestamp,
            born_host: host(),
            store_timestamp: born_timestamp + 1,
            store_host: host(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body,
            properties,
        },
        out,
    )
    .unwrap();
}

/// Properties as RocketMQ encodes them: `name 0x01 value 0x02` each.
fn props(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}\u{1}{v}\u{2}"))
        .collect()
}

/// Both conversions of `stored` agree: same bytes, count and next offset (or both fail).
fn assert_same(stored: &Bytes) -> Option<BuiltBatch> {
    let ours = write_batch(stored, 1 << 20, &LeaderEpochs::default());
    let reference = stored_to_batch_via_messages(stored, 1 << 20);
    match (ours, reference) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.bytes, b.bytes, "batch bytes");
            assert_eq!(a.records, b.records);
            assert_eq!(a.next_offset, b.next_offset);
            Some(a)
        }
        (Err(_), Err(_)) => None,
        (a, b) => panic!("one conversion failed: {:?} vs {:?}", a.err(), b.err()),
    }
}

#[test]
fn rocketmq_messages_of_every_kind_are_shown_as_the_conversion_shows_them() {
    let mut out = Vec::new();
    let plain = props(&[
        ("TAGS", "red"),
        ("KEYS", "k1 k2"),
        ("UNIQ_KEY", "AB01"),
        ("user", "u"),
    ]);
    put_stored(&mut out, 10, 1_700_000_000_500, 0, b"hello", &plain);
    // Bookkeeping properties are hidden.
    let hidden = props(&[
        ("CLUSTER", "c"),
        ("WAIT", "true"),
        ("TRACE_ON", "true"),
        ("x", "1"),
    ]);
    put_stored(&mut out, 11, 1_700_000_000_100, 0, b"", &hidden);
    // No properties at all; an older timestamp (the batch's first timestamp is the smallest).
    put_stored(&mut out, 12, 1_600_000_000_000, 0, b"b", "");
    // A property given twice (the later value wins, at the first one's place).
    let twice = props(&[("a", "1"), ("b", "2"), ("a", "3")]);
    put_stored(&mut out, 13, 1_700_000_000_000, 0, b"t", &twice);
    // More properties than the slices path compares.
    let many: Vec<(String, String)> = (0..20)
        .map(|i| (format!("p{i}"), format!("v{i}")))
        .collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    put_stored(&mut out, 14, 1_700_000_000_000, 0, b"m", &props(&many));
    // A body compressed by a RocketMQ producer.
    let (zbody, bits) = compress_body(&[b'z'; 5000], CompressionType::Zlib, 5).unwrap();
    put_stored(
        &mut out,
        15,
        1_700_000_000_000,
        bits,
        &zbody,
        &props(&[("TAGS", "z")]),
    );
    // Malformed segments are skipped as Java skips them.
    put_stored(
        &mut out,
        16,
        1_700_000_000_000,
        0,
        b"s",
        "\u{1}x\u{2}k\u{1}\u{2}good\u{1}1\u{2}",
    );
    let batch = assert_same(&Bytes::from(out)).unwrap();
    assert_eq!(batch.records, 7);
    assert_eq!(batch.next_offset, Some(17));
    let mut b = batch.bytes.clone();
    let sets = RecordBatchDecoder::decode_all(&mut b).unwrap();
    assert_eq!(sets.len(), 1);
    let r = &sets[0].records;
    assert_eq!(r[0].key.as_deref(), Some(&b"k1 k2"[..]));
    assert!(r[0]
        .headers
        .contains_key(&StrBytes::from_static_str("TAGS")));
    assert_eq!(r[1].headers.len(), 1, "only x: {:?}", r[1].headers);
    assert_eq!(r[5].value.as_deref(), Some(&[b'z'; 5000][..]));
}

#[test]
fn kafka_produced_messages_round_trip_through_the_slices() {
    let mut out = Vec::new();
    let records = [
        crate::test_records::record(0, Some(b"key"), Some(b"v"), &[("h", Some(b"1"))]),
        crate::test_records::record(1, Some(b""), None, &[]),
        crate::test_records::record(
            2,
            Some(&[0xff, 0x00]),
            Some(b""),
            &[("bin", Some(&[0, 1, 2]))],
        ),
        crate::test_records::record(3, None, Some(b"x"), &[("KEYS", Some(b"k")), ("n", None)]),
    ];
    for (i, r) in records.iter().enumerate() {
        let headers = crate::test_records::headers_of(r);
        let m = record_to_message(r, &headers, "T", 0, host(), "c").unwrap();
        put_stored(
            &mut out,
            40 + i as i64,
            m.born_timestamp,
            0,
            &m.body,
            &m.properties,
        );
    }
    // A key whose base64 does not decode (not written by Shoal): no key, as the conversion.
    put_stored(
        &mut out,
        44,
        5,
        0,
        b"q",
        &props(&[("KAFKA", "1"), ("KAFKA_KEY_B64", "%%")]),
    );
    let batch = assert_same(&Bytes::from(out)).unwrap();
    let mut b = batch.bytes.clone();
    let got = &RecordBatchDecoder::decode_all(&mut b).unwrap()[0].records;
    for (g, want) in got.iter().zip(&records) {
        assert_eq!(g.key, want.key);
        assert_eq!(g.value, want.value);
        assert_eq!(g.timestamp, want.timestamp);
    }
    assert_eq!(got[4].key, None);
}

#[test]
fn an_undecodable_record_ends_the_batch_before_it() {
    let mut out = Vec::new();
    put_stored(&mut out, 0, 1, 0, b"a", &props(&[("TAGS", "t")]));
    put_stored(&mut out, 1, 2, 0, b"b", "");
    let good = out.len();
    put_stored(&mut out, 2, 3, 0, b"c", "");
    // A torn third record: its magic code is wrong.
    out[good + 4] ^= 0xff;
    let batch = assert_same(&Bytes::from(out.clone())).unwrap();
    assert_eq!((batch.records, batch.next_offset), (2, Some(2)));
    // Undecodable from the first record: an error, as before.
    assert!(assert_same(&Bytes::from(out[good..].to_vec())).is_none());
    assert!(write_batch(
        &Bytes::from(out[good..].to_vec()),
        1 << 20,
        &LeaderEpochs::default()
    )
    .is_err());
    // A compressed body that does not inflate ends the batch too.
    let mut out2 = Vec::new();
    put_stored(&mut out2, 0, 1, 0, b"a", "");
    put_stored(&mut out2, 1, 1, 1, b"not zlib", "");
    let batch = assert_same(&Bytes::from(out2)).unwrap();
    assert_eq!(batch.records, 1);
    // Nothing stored: an empty batch.
    let empty = write_batch(&Bytes::new(), 1 << 20, &LeaderEpochs::default()).unwrap();
    assert_eq!((empty.records, empty.bytes.len()), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Any run of Kafka records and RocketMQ property sets: the same batch both ways.
    #[test]
    fn the_batch_is_the_one_the_conversion_builds(
        items in proptest::collection::vec(
            (
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..12)),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                proptest::collection::vec(("[A-Za-z_]{1,6}|KEYS|TAGS|KAFKA|KAFKA_HEADERS|CLUSTER", proptest::option::of("[ -~\u{1}é]{0,8}")), 0..6),
                0i64..4_000_000_000_000,
                any::<bool>(),
            ),
            1..12,
        ),
    ) {
        let mut out = Vec::new();
        for (i, (key, value, headers, ts, raw)) in items.iter().enumerate() {
            if *raw {
                // RocketMQ properties straight from the pairs (names may repeat).
                let pairs: Vec<(&str, &str)> = headers
                    .iter()
                    .filter_map(|(k, v)| v.as_deref().filter(|v| !v.is_empty() && !v.contains('\u{1}')).map(|v| (k.as_str(), v)))
                    .collect();
                put_stored(&mut out, i as i64, *ts, 0, value.as_deref().unwrap_or_default(), &props(&pairs));
            } else {
                let hs: Vec<(&str, Option<&[u8]>)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_deref().map(str::as_bytes))).collect();
                let mut r = crate::test_records::record(i as i64, key.as_deref(), value.as_deref(), &hs);
                r.timestamp = *ts;
                let m = record_to_message(&r, &crate::test_records::headers_of(&r), "T", 0, host(), "c").unwrap();
                put_stored(&mut out, i as i64, m.born_timestamp, 0, &m.body, &m.properties);
            }
        }
        let ours = write_batch(&Bytes::from(out.clone()), 1 << 20, &LeaderEpochs::default()).unwrap();
        let reference = stored_to_batch_via_messages(&Bytes::from(out), 1 << 20).unwrap();
        prop_assert_eq!(ours.bytes, reference.bytes);
        prop_assert_eq!(ours.records, reference.records);
        prop_assert_eq!(ours.next_offset, reference.next_offset);
    }
}

/// The records section of a batch written by [`write_batch`], compressed with gzip: the batch
/// a producer with `compression.type=gzip` sends (attributes, length and CRC-32C rewritten).
fn gzipped(batch: &Bytes) -> Bytes {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&batch[61..]).unwrap();
    let records = gz.finish().unwrap();
    let mut out = BytesMut::from(&batch[..61]);
    out.extend_from_slice(&records);
    let len = (out.len() - 12) as i32;
    out[8..12].copy_from_slice(&len.to_be_bytes());
    out[21..23].copy_from_slice(&1i16.to_be_bytes());
    let crc = crc32c::crc32c(&out[21..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    out.freeze()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

    /// Random header lists (names repeat; values null, empty, binary, text with RocketMQ's
    /// separators) through both paths: produce (the records read as sent, plain and gzip) ->
    /// stored message -> fetch (the batch written) -> the records read again: the same list,
    /// in the same order.
    #[test]
    fn header_lists_come_back_exactly_through_produce_and_fetch(
        lists in proptest::collection::vec(crate::convert::tests::arb_headers(), 1..6),
        gzip in any::<bool>(),
    ) {
        let mut out = Vec::new();
        for (i, headers) in lists.iter().enumerate() {
            let r = crate::test_records::record(i as i64, Some(b"k"), Some(b"v"), &[]);
            let m = record_to_message(&r, headers, "T", 0, host(), "c").unwrap();
            put_stored(&mut out, i as i64, m.born_timestamp, 0, &m.body, &m.properties);
        }
        let fetched = write_batch(&Bytes::from(out), 1 << 20, &LeaderEpochs::default()).unwrap().bytes;
        // What a consumer decodes (it reads the header list as sent, as the produce side).
        let bytes = if gzip { gzipped(&fetched) } else { fetched };
        let sets = crate::records::decode_record_set(bytes, 1 << 20).unwrap();
        prop_assert_eq!(sets.len(), 1);
        prop_assert_eq!(&sets[0].headers, &lists);
        // And stored again from what was read: the same message.
        let again: Vec<String> = sets[0].set.records.iter().zip(&sets[0].headers).map(|(r, h)| {
            record_to_message(r, h, "T", 0, host(), "c").unwrap().properties
        }).collect();
        let first: Vec<String> = lists.iter().enumerate().map(|(i, h)| {
            let r = crate::test_records::record(i as i64, Some(b"k"), Some(b"v"), &[]);
            record_to_message(&r, h, "T", 0, host(), "c").unwrap().properties
        }).collect();
        prop_assert_eq!(again, first);
    }
}

/// A batch carries the leader epoch its first record was written in and ends before the
/// first record of a later epoch; the next one starts there with that epoch.
#[test]
fn a_batch_holds_the_records_of_one_leader_epoch() {
    let mut out = Vec::new();
    for i in 0..4 {
        put_stored(&mut out, i, 1, 0, b"v", "");
    }
    // Records are at commit-log offsets 1000-1003; epoch 2 starts at 1002.
    let epochs = LeaderEpochs {
        current: 2,
        entries: vec![(1, 0), (2, 1002)],
    };
    let first = write_batch(&Bytes::from(out.clone()), 1 << 20, &epochs).unwrap();
    assert_eq!((first.records, first.next_offset), (2, Some(2)));
    let mut bytes = first.bytes.clone();
    let decoded = RecordBatchDecoder::decode_all(&mut bytes)
        .unwrap()
        .remove(0);
    assert!(decoded
        .records
        .iter()
        .all(|r| r.partition_leader_epoch == 1));
    // The rest, as the next fetch reads it.
    let mut rest = Vec::new();
    for i in 2..4 {
        put_stored(&mut rest, i, 1, 0, b"v", "");
    }
    let second = write_batch(&Bytes::from(rest), 1 << 20, &epochs).unwrap();
    assert_eq!((second.records, second.next_offset), (2, Some(4)));
    let mut bytes = second.bytes.clone();
    let decoded = RecordBatchDecoder::decode_all(&mut bytes)
        .unwrap()
        .remove(0);
    assert!(decoded
        .records
        .iter()
        .all(|r| r.partition_leader_epoch == 2));
}
