//! Property tests of the message format: round trips and malformed input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;

use super::batch::{decode_batch, decode_batch_raw, encode_batch, BatchItem};
use super::compression::CompressionType;
use super::msg_id::OffsetMsgId;
use super::property::{decode_properties, encode_properties, Properties};
use super::record::{
    decode_record, decode_records, iter_records, DecodeOptions, MessageVersion, RecordView,
    MAX_PROPERTIES_LEN,
};
use super::sys_flag::{BORNHOST_V6_FLAG, STOREHOST_V6_FLAG};
use super::uniq_key::UniqKey;
use super::{body_crc, Message, MessageExt};
use crate::ProtoError;

fn host() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port)),
        (any::<[u8; 16]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
    ]
}

fn topic() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9_%|-]{1,30}",
        "\\PC{1,40}",
        "[a-z]{120,140}",
        "\\PC{100,300}",
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        vec(any::<u8>(), 0..100),
        vec(any::<u8>(), 4000..70_000),
    ]
}

/// Arbitrary unicode keys and values without separators; empty keys and values included.
fn properties() -> impl Strategy<Value = Properties> {
    vec(("[^\\x01\\x02]{0,12}", "[^\\x01\\x02]{0,24}"), 0..12)
        .prop_map(|pairs| pairs.into_iter().collect())
}

/// What the decoder gives back for `p`: pairs with an empty key or value are dropped.
fn kept(p: &Properties) -> Properties {
    p.iter()
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

prop_compose! {
    fn message_ext()(
        topic in topic(),
        queue_id in any::<i32>(),
        flag in any::<i32>(),
        queue_offset in any::<i64>(),
        commit_log_offset in any::<i64>(),
        sys_flag in any::<i32>(),
        born_timestamp in any::<i64>(),
        born_host in host(),
        store_timestamp in any::<i64>(),
        store_host in host(),
        reconsume_times in any::<i32>(),
        prepared_transaction_offset in any::<i64>(),
        body in body(),
        properties in properties(),
    ) -> MessageExt {
        MessageExt {
            store_size: 0,
            body_crc: 0,
            queue_id,
            flag,
            queue_offset,
            commit_log_offset,
            sys_flag,
            born_timestamp,
            born_host,
            store_timestamp,
            store_host,
            reconsume_times,
            prepared_transaction_offset,
            body: Bytes::from(body),
            topic,
            properties,
        }
    }
}

/// The message the decoder should return for an encoded `m` of `len` bytes.
fn expected(m: &MessageExt, len: usize) -> MessageExt {
    let mut e = m.clone();
    e.store_size = len as i32;
    e.body_crc = body_crc(&m.body);
    e.sys_flag &= !(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG);
    if m.born_host.is_ipv6() {
        e.sys_flag |= BORNHOST_V6_FLAG;
    }
    if m.store_host.is_ipv6() {
        e.sys_flag |= STOREHOST_V6_FLAG;
    }
    e.properties = kept(&m.properties);
    e
}

/// Java's property decoding written plainly (split at 0x02, then at the first 0x01; both
/// halves non-empty): the model [`super::property::iter_properties`] must follow.
fn model_properties(s: &str) -> Vec<(&str, &str)> {
    s.split('\u{2}')
        .filter_map(|segment| segment.split_once('\u{1}'))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn property_pairs_follow_the_plain_model(
        s in "[ab\u{1}\u{2}é]{0,24}"
    ) {
        let pairs: Vec<(&str, &str)> = super::property::iter_properties(&s).collect();
        prop_assert_eq!(pairs, model_properties(&s));
    }

    #[test]
    fn record_round_trip(m in message_ext()) {
        let bytes = m.to_bytes().unwrap();
        let (back, len) = decode_record(&bytes, 0, &DecodeOptions::default()).unwrap();
        prop_assert_eq!(len, bytes.len());
        prop_assert_eq!(&back, &expected(&m, len));
        let view = RecordView::parse(&bytes).unwrap();
        view.verify_crc().unwrap();
        let version = if m.topic.len() > 127 { MessageVersion::V2 } else { MessageVersion::V1 };
        prop_assert_eq!(view.version(), version);
        prop_assert_eq!(view.topic(), m.topic.as_str());
        prop_assert_eq!(view.body(), &m.body[..]);
        prop_assert_eq!(view.to_message_ext(&DecodeOptions::default()).unwrap(), back.clone());
        for (k, v) in &back.properties {
            prop_assert_eq!(view.property(k), Some(v.as_str()));
        }
        // Re-encoding the decoded message gives the same bytes (properties are canonical
        // once empty pairs are gone).
        if back.properties.len() == m.properties.len() {
            prop_assert_eq!(back.to_bytes().unwrap(), bytes);
        }
    }

    #[test]
    fn patch_equals_encoding_with_the_values(
        m in message_ext(), qo in any::<i64>(), po in any::<i64>(), ts in any::<i64>()
    ) {
        let mut rec = m.to_bytes().unwrap().to_vec();
        super::record::patch_record(&mut rec, qo, po, ts).unwrap();
        let mut m2 = m.clone();
        m2.queue_offset = qo;
        m2.commit_log_offset = po;
        m2.store_timestamp = ts;
        prop_assert_eq!(rec, m2.to_bytes().unwrap().to_vec());
    }

    #[test]
    fn run_round_trip(ms in vec(message_ext(), 0..6), tail in vec(any::<u8>(), 0..40)) {
        let mut buf = Vec::new();
        for m in &ms {
            m.encode(&mut buf).unwrap();
        }
        let valid = buf.len();
        // Not `client()`: the arbitrary sysFlag may claim a compressed body.
        let checked = DecodeOptions { verify_crc: true, ..DecodeOptions::default() };
        let run = decode_records(&Bytes::from(buf.clone()), &checked);
        prop_assert!(!run.stopped_early());
        prop_assert_eq!(run.consumed, valid);
        prop_assert_eq!(run.messages.len(), ms.len());
        for (got, m) in run.messages.iter().zip(&ms) {
            prop_assert_eq!(got.topic.as_str(), m.topic.as_str());
            prop_assert_eq!(got.queue_offset, m.queue_offset);
        }
        // A tail with a bad magic code stops the run there.
        let mut bad = buf;
        bad.extend_from_slice(&[0, 0, 0, 100, 0xDE, 0xAD, 0xBE, 0xEF]);
        bad.extend_from_slice(&tail);
        let run = decode_records(&Bytes::from(bad.clone()), &DecodeOptions::default());
        prop_assert_eq!(run.messages.len(), ms.len());
        prop_assert_eq!(run.consumed, valid);
        prop_assert_eq!(run.error, Some(ProtoError::BadMagic(0xDEAD_BEEF)));
        let views: Vec<_> = iter_records(&bad).collect();
        prop_assert_eq!(views.len(), ms.len() + 1);
    }

    #[test]
    fn batch_round_trip(items in vec((any::<i32>(), body(), properties()), 0..6)) {
        let messages: Vec<Message> = items
            .iter()
            .map(|(flag, body, props)| Message {
                topic: "T".into(),
                flag: *flag,
                properties: props.clone(),
                body: Bytes::from(body.clone()),
            })
            .collect();
        let encoded = encode_batch(&messages).unwrap();
        let decoded = decode_batch(&Bytes::from(encoded.clone())).unwrap();
        let want: Vec<BatchItem> = messages
            .iter()
            .map(|m| BatchItem { flag: m.flag, body: m.body.clone(), properties: kept(&m.properties) })
            .collect();
        prop_assert_eq!(decoded, want);
        // The raw items carry each item's encoded properties as they were sent.
        let raw = decode_batch_raw(&Bytes::from(encoded.clone())).unwrap();
        prop_assert_eq!(raw.len(), messages.len());
        for (r, m) in raw.iter().zip(&messages) {
            prop_assert_eq!(r.flag, m.flag);
            prop_assert_eq!(&r.body, &m.body);
            let sent = encode_properties(&m.properties).unwrap();
            prop_assert_eq!(&r.properties[..], sent.as_bytes());
        }
        // Every strict prefix that cuts an item is an error, never a panic, for both.
        for cut in [1usize, 7, 21, 23] {
            if cut < encoded.len() {
                let cut = Bytes::copy_from_slice(&encoded[..encoded.len() - cut]);
                prop_assert_eq!(decode_batch(&cut).is_ok(), decode_batch_raw(&cut).is_ok());
            }
        }
    }

    #[test]
    fn properties_round_trip(p in properties()) {
        let s = encode_properties(&p).unwrap();
        prop_assert_eq!(decode_properties(&s), kept(&p));
    }

    #[test]
    fn separators_are_rejected(
        p in properties(), k in "[a-z]{0,4}", v in "[a-z]{0,4}", sep in prop::sample::select(vec!['\u{1}', '\u{2}']), in_key in any::<bool>()
    ) {
        let mut p = p;
        let (k, v) = if in_key { (format!("{k}{sep}x"), v) } else { (format!("K{k}"), format!("{v}{sep}")) };
        p.insert(k, v);
        prop_assert!(matches!(encode_properties(&p), Err(ProtoError::BadProperty(_))));
        let mut m = Message::new("T", "b");
        let bad_value = "a\u{2}b";
        prop_assert!(m.put_property("K", bad_value).is_err());
        prop_assert!(m.properties.is_empty());
    }

    #[test]
    fn compression_round_trip(data in body(), level in 1i32..10) {
        for ty in [CompressionType::Zlib, CompressionType::Lz4, CompressionType::Zstd] {
            let c = ty.compress(&data, level).unwrap();
            prop_assert_eq!(ty.decompress(&c, data.len()).unwrap(), data.clone());
            if !data.is_empty() {
                prop_assert!(ty.decompress(&c, data.len() - 1).is_err());
            }
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..400)) {
        let b = Bytes::from(bytes.clone());
        let run = decode_records(&b, &DecodeOptions::client());
        prop_assert!(run.consumed <= bytes.len());
        prop_assert_eq!(run.consumed == bytes.len(), !run.stopped_early());
        let _ = iter_records(&bytes).count();
        let _ = decode_batch(&b);
        let _ = super::property::decode_properties_bytes(&bytes);
        let _ = super::record::patch_record(&mut bytes.clone(), 1, 2, 3);
        for ty in [CompressionType::Zlib, CompressionType::Lz4, CompressionType::Zstd] {
            let _ = ty.decompress(&bytes, 1 << 16);
        }
    }

    #[test]
    fn random_ids_never_panic(s in "\\PC{0,60}", hex in "[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}") {
        let _ = OffsetMsgId::parse(&s);
        let _ = UniqKey::parse(&s);
        let id = OffsetMsgId::parse(&hex);
        // Valid hex of the right length parses unless the port is out of range.
        if let Ok(id) = id {
            prop_assert_eq!(id.to_string(), hex.to_uppercase());
        }
        prop_assert!(UniqKey::parse(&hex).is_ok());
    }

    #[test]
    fn corrupted_records_never_panic(
        m in message_ext(),
        edits in vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let good = m.to_bytes().unwrap().to_vec();
        let mut bad = good.clone();
        for (at, byte) in &edits {
            let i = at.index(bad.len());
            bad[i] = *byte;
        }
        let b = Bytes::from(bad.clone());
        let checked = DecodeOptions { verify_crc: true, ..DecodeOptions::default() };
        if let Ok((msg, len)) = decode_record(&b, 0, &checked) {
            // Whatever survives the corruption is self-consistent.
            prop_assert_eq!(len, msg.store_size as usize);
            prop_assert!(len <= bad.len());
            prop_assert_eq!(body_crc(&msg.body), msg.body_crc);
        }
        let _ = decode_record(&b, 0, &DecodeOptions::client());
        let _ = decode_records(&b, &DecodeOptions::default());
        // Any strict prefix of a valid record is an error.
        let n = cut.index(good.len());
        prop_assert!(RecordView::parse(&good[..n]).is_err());
        let run = decode_records(&Bytes::copy_from_slice(&good[..n]), &DecodeOptions::default());
        prop_assert!(run.messages.is_empty());
        prop_assert_eq!(run.stopped_early(), n > 0);
    }

    #[test]
    fn lying_total_size_is_always_an_error(
        m in message_ext(), claimed in any::<i32>(), trailing in vec(any::<u8>(), 0..200)
    ) {
        let mut rec = m.to_bytes().unwrap().to_vec();
        let real = rec.len() as i32;
        prop_assume!(claimed != real);
        rec[..4].copy_from_slice(&claimed.to_be_bytes());
        rec.extend_from_slice(&trailing);
        prop_assert!(RecordView::parse(&rec).is_err());
        let run = decode_records(&Bytes::from(rec), &DecodeOptions::default());
        prop_assert!(run.messages.is_empty() && run.stopped_early());
    }

    #[test]
    fn body_corruption_is_caught_by_crc(m in message_ext(), at in any::<prop::sample::Index>(), x in 1u8..) {
        prop_assume!(!m.body.is_empty());
        let mut rec = m.to_bytes().unwrap().to_vec();
        let view_range = RecordView::parse(&rec).unwrap().body_range();
        let i = view_range.start + at.index(view_range.len());
        rec[i] ^= x;
        let view = RecordView::parse(&rec).unwrap();
        prop_assert!(matches!(view.verify_crc(), Err(ProtoError::BadCrc { .. })), "CRC must detect a single-byte change");
    }
}

#[test]
fn oversized_properties_are_rejected() {
    let mut m = Message::new("T", "b");
    m.put_property("K", "v".repeat(MAX_PROPERTIES_LEN)).unwrap();
    assert!(encode_batch([&m]).is_err());
}
