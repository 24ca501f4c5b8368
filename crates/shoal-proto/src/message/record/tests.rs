//! The record format's tests: the spec's worked example, round trips, and the checks a
//! decoder makes.

use super::*;
use crate::message::property;

/// The spec §4.1 worked example. The spec's hex dump is cut after `UNIQ_`; the properties
/// length 52 means the UNIQ_KEY value has 32 chars, and we use the §4.6 example key
/// `C0A800020F8A18B4AAC27E0E0E4C0000` (it starts with `C0A8` as the cut line shows).
pub(crate) fn spec_example_bytes() -> Vec<u8> {
    let mut v = vec![
        0x00, 0x00, 0x00, 0x95, 0xda, 0xa3, 0x20, 0xa7, 0x36, 0x10, 0xa6, 0x86, 0x00, 0x00, 0x00,
        0x01, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00,
        0x00, //
        0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68,
        0x00, //
        0xc0, 0xa8, 0x00, 0x02, 0x00, 0x00, 0xcf, 0x08, 0x00, 0x00, 0x01, 0x8b, 0xcf, 0xe5, 0x68,
        0x05, //
        0xc0, 0xa8, 0x00, 0x01, 0x00, 0x00, 0x2a, 0x9f, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x01, 0x54,
        0x00, //
        0x34, 0x54, 0x41, 0x47, 0x53, 0x01, 0x74, 0x61, 0x67, 0x41, 0x02, 0x55, 0x4e, 0x49, 0x51,
        0x5f,
    ];
    v.extend_from_slice(b"KEY\x01C0A800020F8A18B4AAC27E0E0E4C0000\x02");
    v
}

pub(crate) fn spec_example_message() -> MessageExt {
    let mut properties = Properties::default();
    properties.insert(property::TAGS.into(), "tagA".into());
    properties.insert(
        property::UNIQ_KEY.into(),
        "C0A800020F8A18B4AAC27E0E0E4C0000".into(),
    );
    MessageExt {
        store_size: 149,
        body_crc: 0x3610_A686,
        queue_id: 1,
        flag: 0,
        queue_offset: 3,
        commit_log_offset: 4096,
        sys_flag: 0,
        born_timestamp: 0x018b_cfe5_6800,
        born_host: "192.168.0.2:53000".parse().unwrap(),
        store_timestamp: 0x018b_cfe5_6805,
        store_host: "192.168.0.1:10911".parse().unwrap(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: Bytes::from_static(b"hello"),
        topic: "T".into(),
        properties,
    }
}

#[test]
fn spec_example_encodes_byte_exact() {
    let bytes = spec_example_bytes();
    assert_eq!(bytes.len(), 149);
    let msg = spec_example_message();
    let mut out = bytes::BytesMut::new();
    let layout = msg.encode(&mut out).unwrap();
    assert_eq!(&out[..], &bytes[..]);
    assert_eq!(layout.range(), 0..149);
    assert_eq!(layout.store_timestamp_at, 56);
}

#[test]
fn spec_example_decodes() {
    let bytes = Bytes::from(spec_example_bytes());
    let (msg, len) = decode_record(&bytes, 0, &DecodeOptions::client()).unwrap();
    assert_eq!(len, 149);
    assert_eq!(msg, spec_example_message());
    assert_eq!(msg.tags(), Some("tagA"));
    assert_eq!(msg.msg_id(), "C0A800020F8A18B4AAC27E0E0E4C0000");
    assert_eq!(msg.offset_msg_id(), "C0A8000100002A9F0000000000001000");
    assert_eq!(msg.tags_code(), 3552231);

    let view = RecordView::parse(&bytes).unwrap();
    assert_eq!(view.version(), MessageVersion::V1);
    assert_eq!(view.total_size(), 149);
    assert_eq!(view.queue_offset(), 3);
    assert_eq!(view.physical_offset(), 4096);
    assert_eq!(view.topic(), "T");
    assert_eq!(view.body(), b"hello");
    assert_eq!(view.tags(), Some("tagA"));
    assert_eq!(view.uniq_key(), Some("C0A800020F8A18B4AAC27E0E0E4C0000"));
    assert_eq!(view.properties_range(), 97..149);
    assert_eq!(view.tags_code(), 3552231);
    view.verify_crc().unwrap();
}

#[test]
fn patch_fills_append_time_fields() {
    let mut msg = spec_example_message();
    msg.queue_offset = 0;
    msg.commit_log_offset = 0;
    msg.store_timestamp = 0;
    let mut out = vec![0xEE; 10]; // some earlier bytes in the buffer
    let layout = msg.encode(&mut out).unwrap();
    assert_eq!(layout.start, 10);
    layout.patch(&mut out, 3, 4096, 0x018b_cfe5_6805).unwrap();
    assert_eq!(&out[10..], &spec_example_bytes()[..]);

    let mut rec = msg.to_bytes().unwrap().to_vec();
    patch_record(&mut rec, 3, 4096, 0x018b_cfe5_6805).unwrap();
    assert_eq!(rec, spec_example_bytes());
    assert!(patch_record(&mut rec[..50], 1, 2, 3).is_err());

    let props = msg.properties_string().unwrap();
    let mut seg = [0u8; 200];
    let l = encode_record_to_slice(&msg.fields(&props), &mut seg[20..]).unwrap();
    assert_eq!(l.range(), 0..149);
    patch_record(&mut seg[20..], 3, 4096, 0x018b_cfe5_6805).unwrap();
    assert_eq!(&seg[20..169], &spec_example_bytes()[..]);
    assert!(seg[169..].iter().all(|b| *b == 0) && seg[..20].iter().all(|b| *b == 0));
    assert!(matches!(
        encode_record_to_slice(&msg.fields(&props), &mut seg[..148]),
        Err(ProtoError::Truncated { need: 149, .. })
    ));
    assert!(layout.patch(&mut out[..100], 1, 2, 3).is_err());
}

#[test]
fn ipv6_hosts_set_sys_flag_bits() {
    let mut msg = spec_example_message();
    msg.born_host = "[2001:db8::2]:53000".parse().unwrap();
    let bytes = msg.to_bytes().unwrap();
    assert_eq!(bytes.len(), 149 + 12);
    let view = RecordView::parse(&bytes).unwrap();
    assert_eq!(view.sys_flag(), BORNHOST_V6_FLAG);
    assert_eq!(view.born_host(), msg.born_host);
    assert_eq!(store_timestamp_pos(view.sys_flag()), 68);
    msg.store_host = "[::1]:10911".parse().unwrap();
    let bytes = msg.to_bytes().unwrap();
    let (back, _) = decode_record(&bytes, 0, &DecodeOptions::default()).unwrap();
    assert_eq!(back.sys_flag, BORNHOST_V6_FLAG | STOREHOST_V6_FLAG);
    assert_eq!(back.store_host, msg.store_host);
}

#[test]
fn long_topic_uses_v2_and_limits_are_errors() {
    let mut msg = spec_example_message();
    msg.topic = "t".repeat(127);
    let v1 = msg.to_bytes().unwrap();
    assert_eq!(
        RecordView::parse(&v1).unwrap().version(),
        MessageVersion::V1
    );
    msg.topic = "t".repeat(128);
    let v2 = msg.to_bytes().unwrap();
    assert_eq!(v2.len(), v1.len() + 2);
    let view = RecordView::parse(&v2).unwrap();
    assert_eq!(view.magic_code(), MAGIC_CODE_V2);
    assert_eq!(view.topic(), msg.topic);
    msg.topic = "t".repeat(MAX_TOPIC_LEN + 1);
    assert!(matches!(msg.to_bytes(), Err(ProtoError::BadLength(_))));
    msg.topic = String::new();
    assert!(matches!(msg.to_bytes(), Err(ProtoError::BadLength(_))));
    msg.topic = "T".into();
    msg.properties
        .insert("BIG".into(), "x".repeat(MAX_PROPERTIES_LEN));
    let mut out = Vec::new();
    assert!(matches!(
        msg.encode(&mut out),
        Err(ProtoError::BadLength(_))
    ));
    assert!(out.is_empty(), "nothing written on error");
}

#[test]
fn malformed_records_are_errors() {
    let good = spec_example_bytes();
    for cut in 0..good.len() {
        assert!(RecordView::parse(&good[..cut]).is_err(), "cut at {cut}");
    }
    let mut bad = good.clone();
    bad[4] = 0;
    assert!(matches!(
        RecordView::parse(&bad),
        Err(ProtoError::BadMagic(_))
    ));
    let mut bad = good.clone();
    bad[3] = 0x96; // TOTALSIZE one larger than the fields (and the buffer)
    assert!(RecordView::parse(&bad).is_err());
    bad.push(0);
    let r = RecordView::parse(&bad);
    assert!(matches!(r, Err(ProtoError::BadLength(_))), "{r:?}");
    let mut bad = good.clone();
    bad[3] = 0x94; // one smaller
    assert!(matches!(
        RecordView::parse(&bad),
        Err(ProtoError::BadLength(_))
    ));
    let mut bad = good.clone();
    bad[87] = 0x06; // body length 6
    assert!(RecordView::parse(&bad).is_err());
    let mut bad = good.clone();
    bad[84] = 0x80; // negative body length
    assert!(matches!(
        RecordView::parse(&bad),
        Err(ProtoError::BadLength(_))
    ));
    let mut bad = good.clone();
    bad[95] = 0x80; // negative properties length
    assert!(matches!(
        RecordView::parse(&bad),
        Err(ProtoError::BadLength(_))
    ));
    let mut bad = good.clone();
    bad[52] = 0x7f; // born port 0x7f00cf08
    assert!(matches!(
        RecordView::parse(&bad),
        Err(ProtoError::Invalid(_))
    ));
    let mut bad = good.clone();
    bad[94] = 0xff; // topic not UTF-8
    assert!(matches!(RecordView::parse(&bad), Err(ProtoError::Utf8(_))));
    let mut bad = good.clone();
    bad[92] ^= 1; // body changed: CRC mismatch
    let view = RecordView::parse(&bad).unwrap();
    assert!(matches!(view.verify_crc(), Err(ProtoError::BadCrc { .. })));
    let bad = Bytes::from(bad);
    assert!(decode_record(&bad, 0, &DecodeOptions::client()).is_err());
    assert!(decode_record(&bad, 0, &DecodeOptions::default()).is_ok());
    assert!(decode_record(&bad, 500, &DecodeOptions::default()).is_err());
}

#[test]
fn runs_stop_at_first_bad_record() {
    let one = spec_example_bytes();
    let mut buf = one.repeat(3);
    let run = decode_records(&Bytes::from(buf.clone()), &DecodeOptions::client());
    assert_eq!(
        (run.messages.len(), run.consumed, run.stopped_early()),
        (3, 447, false)
    );
    buf.extend_from_slice(&blank_marker(1000));
    buf.extend_from_slice(&one);
    let run = decode_records(&Bytes::from(buf.clone()), &DecodeOptions::client());
    assert_eq!(run.messages.len(), 3);
    assert_eq!(run.consumed, 447);
    assert_eq!(run.error, Some(ProtoError::BadMagic(BLANK_MAGIC_CODE)));
    assert_eq!(
        peek_record_prefix(&buf[447..]).unwrap(),
        (1000, BLANK_MAGIC_CODE)
    );
    let mut it = iter_records(&buf);
    assert_eq!(it.by_ref().take(3).filter(Result::is_ok).count(), 3);
    assert_eq!(it.consumed(), 447);
    assert!(it.next().unwrap().is_err());
    assert!(it.next().is_none());
    assert_eq!(iter_records(&[]).count(), 0);
}

#[test]
fn compressed_bodies_are_decompressed_on_request() {
    use crate::message::compression::CompressionType;
    let mut msg = spec_example_message();
    let plain = b"hello hello hello hello hello".repeat(20);
    for ty in [
        CompressionType::Zlib,
        CompressionType::Lz4,
        CompressionType::Zstd,
    ] {
        msg.body = Bytes::from(ty.compress(&plain, 5).unwrap());
        msg.sys_flag = ty.sys_flag_bits() | crate::message::sys_flag::MULTI_TAGS_FLAG;
        let bytes = msg.to_bytes().unwrap();
        let (raw, _) = decode_record(&bytes, 0, &DecodeOptions::default()).unwrap();
        assert_eq!(raw.body, msg.body);
        let (m, _) = decode_record(&bytes, 0, &DecodeOptions::client()).unwrap();
        assert_eq!(&m.body[..], &plain[..]);
        assert_eq!(m.sys_flag, ty.sys_flag_bits() & !COMPRESSED_FLAG | 0x2);
        let opts = DecodeOptions {
            max_decompressed_size: plain.len() - 1,
            ..DecodeOptions::client()
        };
        assert!(matches!(
            decode_record(&bytes, 0, &opts),
            Err(ProtoError::Compression(_))
        ));
        let mut m = raw.clone();
        m.decompress_body(1 << 20).unwrap();
        assert_eq!(&m.body[..], &plain[..]);
    }
}
