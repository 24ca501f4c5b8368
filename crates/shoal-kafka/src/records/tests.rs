//! Checked decoding agrees with kafka-protocol's on well-formed sets (every compression) and
//! refuses what would make it reserve or inflate without bound.

use super::*;
use bytes::BytesMut;
use kafka_protocol::records::Record;

use crate::test_records as support;
use support::batch;

/// Record `i`: key `k{i}` on even offsets, header `h` = `v{i}`.
fn record(i: i64, value: Vec<u8>) -> Record {
    let key = format!("k{i}");
    let header = format!("v{i}");
    support::record(
        i,
        (i % 2 == 0).then_some(key.as_bytes()),
        Some(&value),
        &[("h", Some(header.as_bytes()))],
    )
}

const COMPRESSIONS: [Compression; 5] = [
    Compression::None,
    Compression::Gzip,
    Compression::Snappy,
    Compression::Lz4,
    Compression::Zstd,
];

#[test]
fn well_formed_sets_decode_as_kafka_protocol_decodes_them() {
    for c in COMPRESSIONS {
        let mut set = BytesMut::new();
        for b in 0..3 {
            let recs: Vec<Record> = (0..5)
                .map(|i| record(b * 5 + i, vec![b as u8; 300]))
                .collect();
            set.extend_from_slice(&batch(&recs, c));
        }
        let set = set.freeze();
        let ours = decode_record_set(set.clone(), 1 << 20).unwrap();
        let theirs = RecordBatchDecoder::decode_all(&mut set.clone()).unwrap();
        assert_eq!(ours.len(), theirs.len(), "{c:?}");
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a.set.records, b.records, "{c:?}");
            assert_eq!(a.set.compression, c);
            // The headers read here are the records' (no name repeats in these).
            let from_map: Vec<HeaderList> = b
                .records
                .iter()
                .map(|r| {
                    r.headers
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.clone()))
                        .collect()
                })
                .collect();
            assert_eq!(a.headers, from_map, "{c:?}");
        }
    }
}

#[test]
fn compressed_batches_are_found_from_their_headers() {
    let plain = batch(&[record(0, b"x".to_vec())], Compression::None);
    assert!(!any_compressed(&plain));
    assert!(!any_compressed(&[]));
    for c in &COMPRESSIONS[1..] {
        let packed = batch(&[record(1, b"y".to_vec())], *c);
        assert!(any_compressed(&packed), "{c:?}");
        // Behind a plain batch, and ahead of one.
        let mut set = BytesMut::from(&plain[..]);
        set.extend_from_slice(&packed);
        assert!(any_compressed(&set), "{c:?} second");
        let mut set = BytesMut::from(&packed[..]);
        set.extend_from_slice(&plain);
        assert!(any_compressed(&set), "{c:?} first");
    }
    let mut two = BytesMut::from(&plain[..]);
    two.extend_from_slice(&plain);
    assert!(!any_compressed(&two));
    // A set that is not well framed is left to the decoder, which refuses it.
    let mut bad = BytesMut::from(&plain[..]);
    bad[8..12].copy_from_slice(&(-1i32).to_be_bytes());
    assert!(!any_compressed(&bad));
    assert!(!any_compressed(&plain[..30]));
}

#[test]
fn declared_counts_past_the_end_are_refused() {
    let one = batch(&[record(0, b"x".to_vec())], Compression::None);
    // Record count.
    let mut b = one.clone();
    b[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    let e = decode_record_set(b.freeze(), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("declares 2147483647 records"), "{e}");
    // Batch length.
    let mut b = one.clone();
    b[8..12].copy_from_slice(&i32::MAX.to_be_bytes());
    let e = decode_record_set(b.freeze(), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("declares 2147483647 bytes"), "{e}");
    // Header count: the record's last varint before its one header is the count (1 -> zigzag 2).
    let mut b = one.clone();
    let count_at = b.len() - 6; // then key len, "h", value len, "v0"
    assert_eq!(b[count_at], 2);
    b[count_at] = 0x7e; // 63 headers in the 5 bytes left
    let e = decode_record_set(b.freeze(), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("63 headers declared"), "{e}");
    // Legacy magic.
    let mut b = one;
    b[16] = 1;
    assert_eq!(
        decode_record_set(b.freeze(), 1 << 20).unwrap_err(),
        BatchError::LegacyFormat(1)
    );
}

#[test]
fn inflating_stops_at_the_limit() {
    let big = vec![7u8; 300_000];
    for c in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ] {
        let b = batch(&[record(0, big.clone())], c).freeze();
        assert!(b.len() < 100_000, "{c:?} compresses");
        assert_eq!(
            decode_record_set(b.clone(), 100_000).unwrap_err(),
            BatchError::TooLarge { limit: 100_000 },
            "{c:?}"
        );
        assert_eq!(
            decode_record_set(b, 400_000).unwrap()[0].set.records.len(),
            1
        );
    }
    // Raw snappy declaring 4 GiB in its length prefix: refused from the prefix.
    let mut b = batch(&[record(0, b"x".to_vec())], Compression::None);
    b.truncate(HEADER);
    b[22] |= 2;
    b.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0]);
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    assert_eq!(
        decode_record_set(b.freeze(), 1 << 20).unwrap_err(),
        BatchError::TooLarge { limit: 1 << 20 }
    );
}
