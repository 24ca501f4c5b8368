//! The command codec's tests: round trips, Java's byte-exact vectors, and the decoders'
//! leniencies and errors.

use super::decode::*;
use super::encode::*;
use super::rocketmq_header::*;
use super::*;
use crate::{ProtoError, Result};
use bytes::{Bytes, BytesMut};

#[test]
fn language_codes_round_trip() {
    for code in 0..14u8 {
        let l = LanguageCode::from_code(code).unwrap();
        assert_eq!(l.code(), code);
        assert_eq!(LanguageCode::from_name(l.name()), Some(l));
    }
    assert_eq!(LanguageCode::from_code(14), None);
    assert_eq!(LanguageCode::from_name("COBOL"), None);
    assert_eq!(LanguageCode::Rust.code(), 12);
    assert_eq!(LanguageCode::NodeJs.name(), "NODE_JS");
}

#[test]
fn response_to_copies_opaque_and_sets_flag() {
    let req = RemotingCommand::request(10).with_opaque(42);
    let resp = RemotingCommand::response_to(&req, 0, None);
    assert!(resp.is_response());
    assert!(!resp.is_oneway());
    assert_eq!(resp.opaque, 42);
}

// --- frame codec -------------------------------------------------------------------------

use proptest::prelude::*;

const SPEC_JSON_REQUEST: &str = r#"{"code":310,"extFields":{"a":"PG","b":"T","c":"TBW102","d":"4","e":"1","f":"0","g":"1700000000000","h":"0","i":"UNIQ_KEY\u0001ABC\u0002WAIT\u0001true\u0002TAGS\u0001tagA\u0002","j":"0","k":"false","m":"false","n":"broker-a"},"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}"#;
const SPEC_JSON_RESPONSE: &str = r#"{"code":0,"extFields":{"queueId":"1","transactionId":"ABC","msgId":"7F00000100002A9F0000000000000000","TRACE_ON":"true","MSG_REGION":"DefaultRegion","queueOffset":"0"},"flag":1,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":479}"#;

fn ext(pairs: &[(&str, &str)]) -> ExtFields {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn spec_send_request() -> RemotingCommand {
    RemotingCommand {
        code: 310,
        language: LanguageCode::Java,
        version: 479,
        opaque: 7,
        flag: 0,
        remark: None,
        ext_fields: Some(ext(&[
            ("a", "PG"),
            ("b", "T"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "1"),
            ("f", "0"),
            ("g", "1700000000000"),
            ("h", "0"),
            (
                "i",
                "UNIQ_KEY\u{1}ABC\u{2}WAIT\u{1}true\u{2}TAGS\u{1}tagA\u{2}",
            ),
            ("j", "0"),
            ("k", "false"),
            ("m", "false"),
            ("n", "broker-a"),
        ])),
        ext_fields_raw: None,
        serialize_type: SerializeType::Json,
        body: Some(Bytes::from_static(b"hi")),
    }
}

fn spec_send_response() -> RemotingCommand {
    RemotingCommand {
        code: 0,
        language: LanguageCode::Java,
        version: 479,
        opaque: 7,
        flag: 1,
        remark: None,
        ext_fields: Some(ext(&[
            ("queueId", "1"),
            ("transactionId", "ABC"),
            ("msgId", "7F00000100002A9F0000000000000000"),
            ("TRACE_ON", "true"),
            ("MSG_REGION", "DefaultRegion"),
            ("queueOffset", "0"),
        ])),
        ext_fields_raw: None,
        serialize_type: SerializeType::Json,
        body: None,
    }
}

/// Splits a whole frame (with its length field) and decodes it.
fn decode_whole(frame: &[u8]) -> Result<RemotingCommand> {
    let mut buf = BytesMut::from(frame);
    let inner = split_frame(&mut buf, MAX_FRAME_LEN)?
        .ok_or_else(|| ProtoError::Invalid("incomplete".into()))?;
    assert!(buf.is_empty());
    RemotingCommand::decode(inner)
}

fn json_frame(header: &str, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&((4 + header.len() + body.len()) as i32).to_be_bytes());
    v.extend_from_slice(&(header.len() as u32).to_be_bytes());
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(body);
    v
}

#[test]
fn spec_json_request_encodes_byte_for_byte() {
    let frame = spec_send_request().to_frame().unwrap();
    assert_eq!(SPEC_JSON_REQUEST.len(), 310);
    assert_eq!(&frame[..8], &[0, 0, 0x01, 0x3c, 0, 0, 0x01, 0x36]);
    assert_eq!(&frame[8..318], SPEC_JSON_REQUEST.as_bytes());
    assert_eq!(&frame[318..], b"hi");
    assert_eq!(
        frame.as_ref(),
        json_frame(SPEC_JSON_REQUEST, b"hi").as_slice()
    );
    assert_eq!(decode_whole(&frame).unwrap(), spec_send_request());
}

#[test]
fn json_headers_with_escapes_beyond_the_room_asked_for() {
    // Every byte of these strings needs an escape (6 bytes for a control character, 2 for
    // a quote): the header outgrows the room reserved for plain strings many times over.
    let mut ext = ExtFields::new();
    ext.insert("\u{1}\"key", "\u{2}".repeat(5000));
    ext.insert("plain", "value");
    let mut cmd = RemotingCommand::request(310).with_ext_fields(ext);
    cmd.remark = Some("\"\\\n".repeat(700));
    let mut header = BytesMut::from(&b"before"[..]);
    cmd.encode_header(&mut header).unwrap();
    assert_eq!(&header[..6], b"before");
    let text = std::str::from_utf8(&header[6..]).unwrap();
    assert!(text.ends_with('}'), "no bytes left over after the header");
    let back: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(back["remark"], cmd.remark.clone().unwrap());
    assert_eq!(back["extFields"]["\u{1}\"key"], "\u{2}".repeat(5000));
    assert_eq!(back["extFields"]["plain"], "value");
    let frame = cmd.to_frame().unwrap();
    assert_eq!(decode_whole(&frame).unwrap(), cmd);
}

#[test]
fn spec_json_response_both_ways() {
    let mut header = BytesMut::new();
    spec_send_response().encode_header(&mut header).unwrap();
    assert_eq!(&header[..], SPEC_JSON_RESPONSE.as_bytes());
    let decoded = decode_whole(&json_frame(SPEC_JSON_RESPONSE, b"")).unwrap();
    assert_eq!(decoded, spec_send_response());
    // extFields keep the order of the wire.
    let keys: Vec<&str> = decoded.ext_fields.as_ref().unwrap().keys().collect();
    assert_eq!(keys[0], "queueId");
    assert_eq!(keys[5], "queueOffset");
}

fn spec_binary_frame() -> Vec<u8> {
    let mut entries = Vec::new();
    for (k, v) in spec_send_request().ext_fields.unwrap() {
        entries.extend_from_slice(&(k.len() as i16).to_be_bytes());
        entries.extend_from_slice(k.as_bytes());
        entries.extend_from_slice(&(v.len() as i32).to_be_bytes());
        entries.extend_from_slice(v.as_bytes());
    }
    assert_eq!(entries.len(), 169);
    let mut v = vec![
        0x00, 0x00, 0x00, 0xc4, 0x01, 0x00, 0x00, 0xbe, 0x01, 0x36, 0x00, 0x01, 0xdf, 0x00, 0x00,
        0x00, 0x07, // len=196, type 1, hdr=190; code=310 lang=0 ver=479 opaque=7
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa9,
    ];
    assert_eq!(
        &entries[..18],
        &[
            0x00, 0x01, 0x61, 0x00, 0x00, 0x00, 0x02, 0x50, 0x47, 0x00, 0x01, 0x62, 0x00, 0x00,
            0x00, 0x01, 0x54, 0x00
        ]
    );
    v.extend_from_slice(&entries);
    v.extend_from_slice(b"hi");
    v
}

#[test]
fn spec_binary_example_both_ways() {
    let mut cmd = spec_send_request();
    cmd.serialize_type = SerializeType::RocketMq;
    let expected = spec_binary_frame();
    assert_eq!(cmd.to_frame().unwrap().as_ref(), expected.as_slice());
    assert_eq!(decode_whole(&expected).unwrap(), cmd);
}

#[test]
fn json_decoding_is_lenient_like_java() {
    let minimal = decode_whole(&json_frame(r#"{"code":0,"flag":1,"opaque":7}"#, b"")).unwrap();
    assert_eq!(minimal.code, 0);
    assert!(minimal.is_response());
    assert_eq!(minimal.opaque, 7);
    assert_eq!(minimal.language, LanguageCode::Java);
    assert_eq!(minimal.version, 0);
    assert_eq!(minimal.remark, None);
    assert_eq!(minimal.ext_fields, None);
    assert_eq!(minimal.body, None);

    // Section 10: C++ client: no serializeTypeCurrentRPC, scalar values, trailing newline,
    // keys in another order, unknown keys.
    let cpp = "{\"version\":63,\"unknown\":[1,{\"x\":2}],\"opaque\":-5,\"language\":\"CPP\",\
        \"extFields\":{\"queueId\":1,\"unitMode\":false,\"big\":12345678901234,\"neg\":-3,\
        \"f\":1.5,\"gone\":null,\"AccessKey\":\"\",\"obj\":{\"k\":[1,\"v\"]}},\"remark\":\"\",\"code\":11,\"flag\":0}\n\n";
    let c = decode_whole(&json_frame(cpp, b"body")).unwrap();
    assert_eq!(c.code, 11);
    assert_eq!(c.version, 63);
    assert_eq!(c.opaque, -5);
    assert_eq!(c.language, LanguageCode::Cpp);
    assert_eq!(c.remark.as_deref(), Some(""));
    assert_eq!(c.ext("queueId"), Some("1"));
    assert_eq!(c.ext("unitMode"), Some("false"));
    assert_eq!(c.ext("big"), Some("12345678901234"));
    assert_eq!(c.ext("neg"), Some("-3"));
    assert_eq!(c.ext("f"), Some("1.5"));
    assert_eq!(c.ext("gone"), None);
    assert_eq!(c.ext("AccessKey"), Some(""));
    assert_eq!(c.ext("obj"), Some(r#"{"k":[1,"v"]}"#));
    assert_eq!(c.body.as_deref(), Some(&b"body"[..]));

    let odd = decode_whole(&json_frame(
        r#"{"code":"310","language":"COBOL","flag":null,"remark":null,"extFields":{}}"#,
        b"",
    ))
    .unwrap();
    assert_eq!(odd.code, 310);
    assert_eq!(odd.language, UNKNOWN_LANGUAGE);
    assert_eq!(odd.flag, 0);
    assert_eq!(odd.ext_fields, Some(ExtFields::new()));
    let numeric_lang =
        RemotingCommand::decode_header(SerializeType::Json, br#"{"language":12}"#).unwrap();
    assert_eq!(numeric_lang.language, LanguageCode::Rust);
}

#[test]
fn json_escapes_like_standard_json() {
    let mut cmd = RemotingCommand::response(
        1,
        Some("a\"b\\c/d\n\r\t\u{8}\u{c}\u{0}\u{1f}é😀\u{7f}".into()),
    );
    cmd.ext_fields = Some(ext(&[("k\u{1}", "v\u{2}")]));
    let mut h = BytesMut::new();
    cmd.encode_header(&mut h).unwrap();
    let text = std::str::from_utf8(&h).unwrap();
    assert!(
        text.contains(r#""remark":"a\"b\\c/d\n\r\t\b\f\u0000\u001fé😀"#),
        "{text}"
    );
    assert!(
        text.contains(r#""extFields":{"k\u0001":"v\u0002"}"#),
        "{text}"
    );
    assert_eq!(
        RemotingCommand::decode_header(SerializeType::Json, &h).unwrap(),
        cmd
    );
}

#[test]
fn binary_quirks() {
    // Empty remark and empty values decode as absent; an empty map decodes as None.
    let mut cmd = RemotingCommand::request(10).with_ext_fields(ext(&[("a", ""), ("b", "x")]));
    cmd.serialize_type = SerializeType::RocketMq;
    cmd.remark = Some(String::new());
    let d = decode_whole(&cmd.to_frame().unwrap()).unwrap();
    assert_eq!(d.remark, None);
    assert_eq!(d.ext_fields, Some(ext(&[("b", "x")])));
    cmd.ext_fields = Some(ExtFields::new());
    assert_eq!(
        decode_whole(&cmd.to_frame().unwrap()).unwrap().ext_fields,
        None
    );
    // An area whose entries are all dropped (empty keys or values) is no map either, so the
    // decoded command encodes back to itself (libFuzzer's header_binary found Some({})).
    cmd.ext_fields = Some(ext(&[("a", ""), ("", "b")]));
    let d = decode_whole(&cmd.to_frame().unwrap()).unwrap();
    assert_eq!(d.ext_fields, None);
    assert_eq!(decode_whole(&d.to_frame().unwrap()).unwrap(), d);
    // Negative codes are legal and read back signed; unknown language codes are kept as Other.
    cmd.code = -2;
    let mut frame = BytesMut::from(&cmd.to_frame().unwrap()[..]);
    frame[10] = 200; // language byte
    let d = decode_whole(&frame).unwrap();
    assert_eq!(d.code, -2);
    assert_eq!(d.language, UNKNOWN_LANGUAGE);
}

/// A binary frame (code 10, nothing else) whose extFields area holds `entries` as given,
/// bytes not checked.
fn binary_frame_with(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut area = Vec::new();
    for (k, v) in entries {
        area.extend_from_slice(&(k.len() as i16).to_be_bytes());
        area.extend_from_slice(k);
        area.extend_from_slice(&(v.len() as i32).to_be_bytes());
        area.extend_from_slice(v);
    }
    let mut header = vec![
        0x00, 0x0a, 12, 0x01, 0xdf, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    header.extend_from_slice(&(area.len() as i32).to_be_bytes());
    header.extend_from_slice(&area);
    let mut v = Vec::new();
    v.extend_from_slice(&((4 + header.len()) as i32).to_be_bytes());
    v.extend_from_slice(&(0x0100_0000 | header.len() as u32).to_be_bytes());
    v.extend_from_slice(&header);
    v
}

#[test]
fn binary_ext_fields_are_utf8_string_by_string() {
    // "é" is 0xc3 0xa9: split between a key and its value, the text as a whole is UTF-8
    // but neither string is.
    let split: &[(&[u8], &[u8])] = &[(b"ok", b"fine"), (b"k\xc3", b"\xa9v")];
    assert!(std::str::from_utf8(b"okfinek\xc3\xa9v").is_ok());
    assert!(matches!(
        decode_whole(&binary_frame_with(split)),
        Err(ProtoError::Utf8("extFields key"))
    ));
    let bad_value: &[(&[u8], &[u8])] = &[(b"k", b"\xff")];
    assert!(matches!(
        decode_whole(&binary_frame_with(bad_value)),
        Err(ProtoError::Utf8("extFields value"))
    ));
    // Whole characters anywhere are fine.
    let fine: &[(&[u8], &[u8])] = &[("ké".as_bytes(), "é".as_bytes()), (b"x", b"y")];
    let d = decode_whole(&binary_frame_with(fine)).unwrap();
    assert_eq!(d.ext_fields, Some(ext(&[("ké", "é"), ("x", "y")])));
}

#[test]
fn binary_ext_fields_repeated_keys_keep_the_last_value() {
    // Replaced values are most of the text (it is compacted once every entry is in).
    let big: Vec<Vec<u8>> = (0..6).map(|i| vec![b'a' + i; 3000]).collect();
    let mut entries: Vec<(&[u8], &[u8])> = Vec::new();
    for v in &big {
        entries.push((b"k", v));
        entries.push((b"other", b"o"));
    }
    entries.push((b"last", b"z"));
    let d = decode_whole(&binary_frame_with(&entries)).unwrap();
    let ext_fields = d.ext_fields.unwrap();
    let want = "f".repeat(3000);
    assert_eq!(
        ext_fields.iter().collect::<Vec<_>>(),
        vec![("k", want.as_str()), ("other", "o"), ("last", "z")]
    );
    assert!(
        ext_fields.text_len() < 2 * 3000 + 100,
        "{}",
        ext_fields.text_len()
    );
}

#[test]
fn binary_encoding_refuses_what_does_not_fit() {
    let mut cmd = RemotingCommand::request(200_050); // POP family
    cmd.serialize_type = SerializeType::RocketMq;
    let mut dst = BytesMut::from(&b"keep"[..]);
    let err = cmd.encode(&mut dst).unwrap_err();
    assert!(
        matches!(err, ProtoError::InvalidField { field: "code", .. }),
        "{err}"
    );
    assert_eq!(&dst[..], b"keep", "nothing appended on error");
    cmd.code = 32_768;
    assert!(cmd.to_frame().is_err());
    cmd.code = 32_767;
    assert!(cmd.to_frame().is_ok());
    cmd.code = -32_769;
    assert!(cmd.to_frame().is_err());
    cmd.code = 10;
    cmd.version = 40_000;
    assert!(matches!(
        cmd.to_frame().unwrap_err(),
        ProtoError::InvalidField {
            field: "version",
            ..
        }
    ));
    cmd.version = 479;
    cmd.ext_fields = Some(ext(&[(&"k".repeat(40_000), "v")]));
    assert!(matches!(
        cmd.to_frame().unwrap_err(),
        ProtoError::InvalidField {
            field: "extFields",
            ..
        }
    ));
    // The same command is fine with JSON.
    cmd.serialize_type = SerializeType::Json;
    cmd.code = 200_050;
    assert_eq!(decode_whole(&cmd.to_frame().unwrap()).unwrap(), cmd);
}

#[test]
fn split_frame_waits_for_whole_frames_and_checks_lengths() {
    let frame = spec_send_request().to_frame().unwrap();
    let mut buf = BytesMut::new();
    for (i, b) in frame.iter().enumerate() {
        assert_eq!(
            split_frame(&mut buf, MAX_FRAME_LEN).unwrap(),
            None,
            "byte {i}"
        );
        buf.extend_from_slice(&[*b]);
    }
    buf.extend_from_slice(&frame[..3]); // start of a second frame stays buffered
    let inner = split_frame(&mut buf, MAX_FRAME_LEN).unwrap().unwrap();
    assert_eq!(inner.len(), frame.len() - 4);
    assert_eq!(&buf[..], &frame[..3]);

    let err = |bytes: &[u8], max| split_frame(&mut BytesMut::from(bytes), max).unwrap_err();
    assert!(matches!(
        err(&[0xff, 0xff, 0xff, 0xfe], MAX_FRAME_LEN),
        ProtoError::BadLength(_)
    ));
    assert!(matches!(
        err(&[0, 0, 0, 3, 0, 0, 0], MAX_FRAME_LEN),
        ProtoError::BadLength(_)
    ));
    assert_eq!(
        err(&[0x01, 0x00, 0x00, 0x00], MAX_FRAME_LEN),
        ProtoError::FrameTooLarge {
            len: 16_777_220,
            max: MAX_FRAME_LEN
        }
    );
    // Exactly at the limit (length field included) is accepted.
    let mut at_limit = BytesMut::from(&[0u8, 0, 0, 12][..]);
    at_limit.extend_from_slice(&[0; 12]);
    assert!(split_frame(&mut at_limit, 16).unwrap().is_some());
    assert!(matches!(
        split_frame(&mut BytesMut::from(&[0u8, 0, 0, 13][..]), 16).unwrap_err(),
        ProtoError::FrameTooLarge { len: 17, max: 16 }
    ));
}

#[test]
fn malformed_frames_are_errors() {
    let dec = |b: &'static [u8]| RemotingCommand::decode(Bytes::from_static(b)).unwrap_err();
    assert!(matches!(dec(b"\0\0"), ProtoError::Truncated { .. }));
    assert!(matches!(dec(b"\0\0\0\x05{}"), ProtoError::BadLength(_)));
    assert!(matches!(
        dec(b"\x02\0\0\x02{}"),
        ProtoError::UnknownSerializeType(2)
    ));
    assert!(matches!(dec(b"\0\0\0\x02{\xff"), ProtoError::Utf8(_)));
    assert!(matches!(dec(b"\0\0\0\x03{\"\xc3"), ProtoError::Utf8(_)));
    assert!(matches!(dec(b"\0\0\0\x02[]"), ProtoError::Json { .. }));
    assert!(matches!(dec(b"\0\0\0\x01{"), ProtoError::Json { .. }));
    assert!(matches!(dec(b"\0\0\0\x00"), ProtoError::Json { .. }));
    let json = |h: &str| decode_whole(&json_frame(h, b"")).unwrap_err();
    for bad in [
        r#"{"code":1e400}"#,
        r#"{"code":1.5}"#,
        r#"{"code":2147483648}"#,
        r#"{"opaque":"x"}"#,
        r#"{"extFields":[1]}"#,
        r#"{"extFields":{"a":"b",}}"#,
        r#"{"remark":5}"#,
        "{}    xxxx",
        "{\"remark\":\"\\ud800\"}",
    ] {
        assert!(matches!(json(bad), ProtoError::Json { .. }), "{bad}");
    }
    // Binary: truncated fixed part, negative and lying lengths, bad UTF-8.
    assert!(matches!(
        dec(b"\x01\0\0\x03\0\x01\0"),
        ProtoError::Truncated { .. }
    ));
    let binary = |remark_len: i32, remark: &[u8], ext_len: i32, ext: &[u8]| {
        let mut h = vec![0, 10, 12, 1, 0xdf, 0, 0, 0, 1, 0, 0, 0, 0];
        h.extend_from_slice(&remark_len.to_be_bytes());
        h.extend_from_slice(remark);
        h.extend_from_slice(&ext_len.to_be_bytes());
        h.extend_from_slice(ext);
        RemotingCommand::decode_header(SerializeType::RocketMq, &h)
    };
    assert!(binary(0, b"", 0, b"").is_ok());
    assert!(matches!(
        binary(-1, b"", 0, b"").unwrap_err(),
        ProtoError::BadLength(_)
    ));
    assert!(matches!(
        binary(9, b"abc", 0, b"").unwrap_err(),
        ProtoError::Truncated { .. }
    ));
    assert!(matches!(
        binary(2, b"\xff\xfe", 0, b"").unwrap_err(),
        ProtoError::Utf8(_)
    ));
    assert!(matches!(
        binary(0, b"", -7, b"").unwrap_err(),
        ProtoError::BadLength(_)
    ));
    assert!(matches!(
        binary(0, b"", 100, b"\0\x01a").unwrap_err(),
        ProtoError::Truncated { .. }
    ));
    assert!(matches!(
        binary(0, b"", 3, b"\0\x01a").unwrap_err(),
        ProtoError::Truncated { .. }
    ));
    assert!(matches!(
        binary(0, b"", 8, b"\0\x01a\xff\xff\xff\xff\0").unwrap_err(),
        ProtoError::BadLength(_)
    ));
    assert!(matches!(
        binary(0, b"", 8, b"\xff\xffa\0\0\0\0\0").unwrap_err(),
        ProtoError::BadLength(_)
    ));
    assert!(matches!(
        binary(0, b"", 8, b"\0\x01a\0\0\0\x01\xff").unwrap_err(),
        ProtoError::Utf8(_)
    ));
}

fn arb_ext() -> impl Strategy<Value = Option<ExtFields>> {
    proptest::option::of(
        proptest::collection::vec((any::<String>(), any::<String>()), 0..8)
            .prop_map(|v| v.into_iter().collect::<ExtFields>()),
    )
}

prop_compose! {
    fn arb_command(serialize_type: SerializeType)(
        code in any::<i32>(),
        language in 0u8..14,
        version in any::<i32>(),
        opaque in any::<i32>(),
        flag in any::<i32>(),
        remark in proptest::option::of(any::<String>()),
        ext_fields in arb_ext(),
        body in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
    ) -> RemotingCommand {
        let (code, version) = match serialize_type {
            SerializeType::Json => (code, version),
            SerializeType::RocketMq => (i32::from(code as i16), i32::from(version as i16)),
        };
        RemotingCommand {
            code,
            language: LanguageCode::from_code(language).unwrap_or_default(),
            version,
            opaque,
            flag,
            remark,
            ext_fields,
            ext_fields_raw: None,
            serialize_type,
            body: body.map(Bytes::from),
        }
    }
}

/// What a decoder gives back for `cmd`: empty bodies are absent, and binary headers lose
/// empty strings and empty maps.
fn normalised(mut cmd: RemotingCommand) -> RemotingCommand {
    if cmd.body.as_ref().is_some_and(|b| b.is_empty()) {
        cmd.body = None;
    }
    if cmd.serialize_type == SerializeType::RocketMq {
        cmd.remark = cmd.remark.filter(|r| !r.is_empty());
        cmd.ext_fields = cmd
            .ext_fields
            .map(|m| {
                m.into_iter()
                    .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                    .collect::<ExtFields>()
            })
            .filter(|m| !m.is_empty());
    }
    cmd
}

proptest! {
    #[test]
    fn json_round_trip(cmd in arb_command(SerializeType::Json)) {
        let frame = cmd.to_frame().unwrap();
        prop_assert_eq!(decode_whole(&frame).unwrap(), normalised(cmd.clone()));
        // The header is standard JSON (serde_json agrees on every string).
        let mut h = BytesMut::new();
        cmd.encode_header(&mut h).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&h).unwrap();
        prop_assert_eq!(v["remark"].as_str(), cmd.remark.as_deref());
    }

    #[test]
    fn binary_round_trip(cmd in arb_command(SerializeType::RocketMq)) {
        let frame = cmd.to_frame().unwrap();
        prop_assert_eq!(decode_whole(&frame).unwrap(), normalised(cmd));
    }

    #[test]
    fn binary_ext_fields_decode_as_entry_by_entry(
        entries in proptest::collection::vec(
            (
                proptest::collection::vec(prop_oneof![Just(b'k'), Just(0xc3u8), Just(0xa9u8), any::<u8>()], 0..4),
                proptest::collection::vec(prop_oneof![Just(b'v'), Just(0xc3u8), Just(0xa9u8), any::<u8>()], 0..6),
            ),
            // Past `INDEX_FROM` entries too: the one-pass decoder hands over to the map's
            // general path there, as it does at a key seen before.
            0..24,
        ),
        cut in any::<Option<proptest::sample::Index>>(),
        bad_len in any::<Option<(proptest::sample::Index, i32)>>(),
    ) {
        let mut area = Vec::new();
        let mut len_fields = Vec::new();
        for (k, v) in &entries {
            len_fields.push((area.len(), 2));
            area.extend_from_slice(&(k.len() as i16).to_be_bytes());
            area.extend_from_slice(k);
            len_fields.push((area.len(), 4));
            area.extend_from_slice(&(v.len() as i32).to_be_bytes());
            area.extend_from_slice(v);
        }
        // Malformed areas: a length field rewritten (negative, too long), or cut short.
        if let (Some((i, n)), false) = (bad_len, len_fields.is_empty()) {
            let (at, width) = len_fields[i.index(len_fields.len())];
            if width == 2 {
                area[at..at + 2].copy_from_slice(&(n as i16).to_be_bytes());
            } else {
                area[at..at + 4].copy_from_slice(&n.to_be_bytes());
            }
        }
        if let (Some(c), false) = (cut, area.is_empty()) {
            area.truncate(c.index(area.len()));
        }
        // The model: the area's layout first (its first malformed entry is the error),
        // then entry by entry, each string checked by itself.
        let model = (|| -> Result<Option<ExtFields>> {
            let mut e = HeaderReader { buf: &area };
            let mut all = Vec::new();
            while !e.buf.is_empty() {
                all.push(next_rocketmq_entry(&mut e)?);
            }
            let mut map = ExtFields::new();
            for (k, v) in all {
                if k.is_empty() || v.is_empty() {
                    continue;
                }
                let k = std::str::from_utf8(k).map_err(|_| ProtoError::Utf8("extFields key"))?;
                let v = std::str::from_utf8(v).map_err(|_| ProtoError::Utf8("extFields value"))?;
                map.insert(k, v);
            }
            Ok((!map.is_empty()).then_some(map))
        })();
        let got = decode_rocketmq_ext_fields(&area);
        match (got, model) {
            (Ok(g), Ok(m)) => prop_assert_eq!(g, m),
            (Err(g), Err(m)) => prop_assert_eq!(g.to_string(), m.to_string()),
            (g, m) => prop_assert!(false, "decoder {:?}, model {:?}", g, m),
        }
    }

    #[test]
    fn decimals_are_written_as_to_string_writes_them(v in any::<i64>(), w in any::<i32>()) {
        let mut out = Vec::new();
        push_decimal(&mut out, v);
        prop_assert_eq!(out, v.to_string().into_bytes());
        let mut dst = BytesMut::new();
        put_decimal(&mut dst, w);
        let want = w.to_string();
        prop_assert_eq!(&dst[..], want.as_bytes());
        for edge in [i64::MIN, i64::MAX, 0, -1] {
            let mut out = Vec::new();
            push_decimal(&mut out, edge);
            prop_assert_eq!(out, edge.to_string().into_bytes());
        }
    }

    #[test]
    fn json_strings_escape_like_serde_json(s in any::<String>()) {
        let mut out = BytesMut::new();
        put_json_str(&mut out, s.as_bytes());
        let expected = serde_json::to_string(&s).unwrap();
        prop_assert_eq!(&out[..], expected.as_bytes());
    }

    /// The run-copying `put_json_str` writes what the byte-at-a-time one did, and serde
    /// reads it back as the same string; strings dense in characters to escape, of
    /// lengths around the eight-byte steps, after text already in the buffer.
    #[test]
    fn json_strings_as_before(
        s in prop_oneof![
            any::<String>(),
            r#"[a-z"\\/\x00-\x1f\x7fé😀]{0,40}"#,
            r#"[a-z]{0,20}["\\\x00-\x1f][a-z]{0,20}"#,
        ],
        before in "[a-z]{0,3}",
    ) {
        let mut new = BytesMut::from(before.as_bytes());
        put_json_str(&mut new, s.as_bytes());
        let mut old = BytesMut::from(before.as_bytes());
        put_json_str_reference(&mut old, &s);
        prop_assert_eq!(&new[..], &old[..]);
        let back: String = serde_json::from_slice(&new[before.len()..]).unwrap();
        prop_assert_eq!(back, s);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = RemotingCommand::decode(Bytes::from(bytes.clone()));
        let _ = RemotingCommand::decode_header(SerializeType::Json, &bytes);
        let _ = RemotingCommand::decode_header(SerializeType::RocketMq, &bytes);
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(frame)) = split_frame(&mut buf, 1024) {
            let _ = RemotingCommand::decode(frame);
        }
    }

    #[test]
    fn mutated_frames_never_panic(
        cmd in arb_command(SerializeType::RocketMq),
        json in any::<bool>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut cmd = cmd;
        if json {
            cmd.serialize_type = SerializeType::Json;
        }
        let mut frame = cmd.to_frame().unwrap().to_vec();
        for (i, b) in flips {
            let i = i.index(frame.len());
            frame[i] = b;
        }
        let mut buf = BytesMut::from(&frame[..]);
        if let Ok(Some(inner)) = split_frame(&mut buf, MAX_FRAME_LEN) {
            let _ = RemotingCommand::decode(inner);
        }
    }
}

// --- extFields as a decoder builds them ------------------------------------------------------

#[test]
fn letter_values_reads_one_letter_keys_shared_or_decoded() {
    // `a` plain (a span of the frame), `b` written with an escape (decoded into the map's
    // own text), `bb` and `n` not among the letters asked for, `c` replaced by a later entry.
    let header = br#"{"code":310,"extFields":{"a":"G","\u0062":"T\u0001x","bb":"no","c":"1","n":"broker","c":"2"}}"#;
    let cmd = RemotingCommand::decode_header(SerializeType::Json, header).unwrap();
    let ext = cmd.ext_fields.as_ref().unwrap();
    let found: [Option<&str>; 4] = ext.letter_values(b'a');
    assert_eq!(found, [Some("G"), Some("T\u{1}x"), Some("2"), None]);
    // Letters below `first` are not folded into the table.
    let found: [Option<&str>; 2] = ext.letter_values(b'b');
    assert_eq!(found, [Some("T\u{1}x"), Some("2")]);
}

proptest! {
    /// The map behaves as an `IndexMap` would, below and above the index threshold, with
    /// repeated keys and removals.
    #[test]
    fn behaves_like_an_index_map(
        initial in proptest::collection::vec((0u8..40, any::<bool>(), "[a-c\n]{0,3}"), 0..20),
        ops in proptest::collection::vec((0u8..40, any::<bool>(), "[a-c]{0,3}"), 0..120),
    ) {
        // The map starts as decoded from a frame's JSON header: plain keys and values
        // shared with the header, escaped ones (a `\n`, a key written with `\u006b`) in
        // the map's own text.
        let mut model: indexmap::IndexMap<String, String> = indexmap::IndexMap::new();
        let mut json = String::from(r#"{"extFields":{"#);
        for (i, (k, escaped, v)) in initial.iter().enumerate() {
            let key = format!("k{k}");
            let written = if *escaped { format!("\\u006b{k}") } else { key.clone() };
            if i > 0 {
                json.push(',');
            }
            json.push_str(&format!(r#""{written}":"{}""#, v.replace('\n', "\\n")));
            model.insert(key, v.clone());
        }
        json.push_str("}}");
        let decoded = decode_json_header_fast(json.as_bytes())
            .expect("takes the fast path");
        let mut ours = decoded.ext_fields.expect("extFields");
        prop_assert_eq!(ours.len(), model.len());
        for (k, remove, v) in ops {
            let key = format!("k{k}");
            if remove {
                prop_assert_eq!(ours.remove(&key), model.shift_remove(&key));
            } else {
                ours.insert(&key, &v);
                model.insert(key, v);
            }
            prop_assert_eq!(ours.len(), model.len());
        }
        let got: Vec<(String, String)> = ours.clone().into_iter().collect();
        let want: Vec<(String, String)> = model.clone().into_iter().collect();
        prop_assert_eq!(got, want);
        for (k, v) in &model {
            prop_assert_eq!(ours.get(k), Some(v.as_str()));
        }
        prop_assert_eq!(ours.get("absent"), None);
    }
}
