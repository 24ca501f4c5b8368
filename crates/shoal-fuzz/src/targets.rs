//! The fuzz targets. Each takes arbitrary bytes, must never panic on them, and panics only when
//! a property of the decoder it drives is violated (the message says which).

use bytes::{Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;
use shoal_proto::acl::{
    parse_perm, sign_request, AccessControl, AccessRequest, AccountConfig, AddressPattern,
    PlainAclConfig, SessionCredentials, ADMIN_REQUEST_CODES,
};
use shoal_proto::body::{
    from_json_slice, normalize_fastjson, to_json_bytes, HeartbeatData, LockBatchRequestBody,
    ResetOffsetBody, TopicConfig, TopicConfigSerializeWrapper, TopicRouteData,
};
use shoal_proto::code::request_code as rc;
use shoal_proto::command::{
    decode_json_header_fast, decode_json_header_reference, split_frame, ExtFields,
};
use shoal_proto::header::{
    build_msg_offset_info, build_start_offset_info, parse_msg_offset_info, parse_start_offset_info,
    AckMessageRequestHeader, ConsumerSendMsgBackRequestHeader, CreateTopicRequestHeader,
    EndTransactionRequestHeader, GetMaxOffsetRequestHeader, PopExtraInfo, PopMessageRequestHeader,
    PullMessageRequestHeader, QueryConsumerOffsetRequestHeader, QueryMessageRequestHeader,
    RegisterBrokerRequestHeader, ResetOffsetRequestHeader, SearchOffsetRequestHeader,
    SendMessageRequestHeader, SendMessageRequestHeaderV2, UpdateConsumerOffsetRequestHeader,
    ViewMessageByIdRequestHeader,
};
use shoal_proto::message::property::find_property;
use shoal_proto::message::record::{decode_record, decode_records, iter_records, DecodeOptions};
use shoal_proto::message::{
    decode_batch, decode_properties, encode_batch_item, encode_properties, OffsetMsgId, Properties,
    UniqKey,
};
use shoal_proto::{RemotingCommand, SerializeType};
use std::net::IpAddr;
use std::sync::OnceLock;

/// The frame limit the stream target splits with (small, so that mutated lengths hit it).
pub const FUZZ_MAX_FRAME: usize = 1 << 20;

/// Largest decompressed body the record target accepts.
pub const FUZZ_MAX_DECOMPRESSED: usize = 1 << 20;

/// Encodes `cmd` and decodes it again: it must come back equal (the decoders' normalisations,
/// such as absent-vs-empty fields, are applied once, on the way in).
fn assert_round_trip(cmd: &RemotingCommand) {
    let mut out = BytesMut::new();
    // Some decodable commands cannot be encoded (e.g. a JSON-decoded version beyond int16 in a
    // binary header); that is a refusal, not a bug.
    if cmd.encode(&mut out).is_err() {
        return;
    }
    let frame = match split_frame(&mut out, i32::MAX as usize) {
        Ok(Some(f)) => f,
        other => panic!("an encoded command does not split as one frame: {other:?}"),
    };
    assert!(out.is_empty(), "bytes left after an encoded frame");
    let back = match RemotingCommand::decode(frame) {
        Ok(c) => c,
        Err(e) => panic!("an encoded command does not decode: {e}\n{cmd:?}"),
    };
    assert_eq!(&back, cmd, "a command changed through encode and decode");
}

/// Every typed view the broker and name server take of a request: headers, bodies, ACL.
fn typed_views(cmd: &RemotingCommand) {
    if let Ok(v2) = cmd.decode_command_header::<SendMessageRequestHeaderV2>() {
        let _ = SendMessageRequestHeader::from(v2);
    }
    let _ = cmd.decode_command_header::<SendMessageRequestHeader>();
    let _ = cmd.decode_command_header::<PullMessageRequestHeader>();
    let _ = cmd.decode_command_header::<UpdateConsumerOffsetRequestHeader>();
    let _ = cmd.decode_command_header::<QueryConsumerOffsetRequestHeader>();
    let _ = cmd.decode_command_header::<ConsumerSendMsgBackRequestHeader>();
    let _ = cmd.decode_command_header::<CreateTopicRequestHeader>();
    let _ = cmd.decode_command_header::<EndTransactionRequestHeader>();
    let _ = cmd.decode_command_header::<RegisterBrokerRequestHeader>();
    let _ = cmd.decode_command_header::<PopMessageRequestHeader>();
    let _ = cmd.decode_command_header::<AckMessageRequestHeader>();
    let _ = cmd.decode_command_header::<ResetOffsetRequestHeader>();
    let _ = cmd.decode_command_header::<GetMaxOffsetRequestHeader>();
    let _ = cmd.decode_command_header::<SearchOffsetRequestHeader>();
    let _ = cmd.decode_command_header::<ViewMessageByIdRequestHeader>();
    let _ = cmd.decode_command_header::<QueryMessageRequestHeader>();
    if let Some(body) = &cmd.body {
        json_views(body);
        let _ = decode_batch(body);
    }
    let access = AccessRequest::parse(cmd, IpAddr::from([192, 0, 2, 1]));
    assert!(
        acl().check(&access, ADMIN_REQUEST_CODES).is_err(),
        "a request from the wire passed the ACL without being signed by a known account"
    );
}

/// A command that decoded: round trip and typed views.
fn decoded_command(cmd: &RemotingCommand) {
    assert_round_trip(cmd);
    typed_views(cmd);
}

fn split_all(data: &[u8], chunk: usize) -> Vec<Result<Bytes, String>> {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for piece in data.chunks(chunk.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match split_frame(&mut buf, FUZZ_MAX_FRAME) {
                Ok(Some(frame)) => {
                    assert!(frame.len() + 4 <= FUZZ_MAX_FRAME, "a frame over the limit");
                    frames.push(Ok(frame));
                }
                Ok(None) => break,
                Err(e) => {
                    frames.push(Err(e.to_string()));
                    return frames;
                }
            }
        }
    }
    frames
}

/// A byte stream as a connection reads it: the first byte picks the size of the pieces the
/// rest arrives in. The frames (and where the stream goes out of sync) must not depend on how
/// the bytes arrive; every frame that decodes round-trips and goes through the typed views.
pub fn frame_stream(data: &[u8]) {
    let Some((&first, stream)) = data.split_first() else {
        return;
    };
    let chunked = split_all(stream, usize::from(first % 64) + 1);
    let whole = split_all(stream, stream.len());
    assert_eq!(chunked, whole, "frames depend on how the bytes arrived");
    for frame in chunked.into_iter().flatten() {
        if let Ok(cmd) = RemotingCommand::decode(frame) {
            decoded_command(&cmd);
        }
    }
}

/// A JSON header (the bytes after the header-length word). The decoder answers exactly as
/// serde alone does (the same command with its extFields in the same order, or the same
/// error), and so does its hand-written fast path whenever it takes the header.
pub fn header_json(data: &[u8]) {
    let reference = decode_json_header_reference(data);
    if let Some(fast) = decode_json_header_fast(data) {
        match &reference {
            Ok(r) => assert_same_command(&fast, r, "the JSON fast path"),
            Err(e) => panic!("the JSON fast path took a header serde refuses ({e}): {fast:?}"),
        }
    }
    let decoded = RemotingCommand::decode_header(SerializeType::Json, data);
    match (&decoded, &reference) {
        (Ok(d), Ok(r)) => assert_same_command(d, r, "the JSON decoder"),
        (Err(d), Err(r)) => assert_eq!(d, r, "the JSON decoder and serde fail differently"),
        (d, r) => panic!("the JSON decoder gave {d:?}, serde alone {r:?}"),
    }
    if let Ok(cmd) = decoded {
        decoded_command(&cmd);
    }
}

/// `got` equals `want`, extFields in the same order.
fn assert_same_command(got: &RemotingCommand, want: &RemotingCommand, what: &str) {
    assert_eq!(got, want, "{what} disagrees with serde");
    let order = |c: &RemotingCommand| {
        c.ext_fields.as_ref().map(|m| {
            m.iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(
        order(got),
        order(want),
        "{what} orders extFields differently from serde"
    );
}

/// A ROCKETMQ binary header.
pub fn header_binary(data: &[u8]) {
    if let Ok(cmd) = RemotingCommand::decode_header(SerializeType::RocketMq, data) {
        decoded_command(&cmd);
    }
}

/// Stored records (a pull answer's body, a commit-log region): decoding stops at the first
/// bad record and says so; every record that decodes re-encodes to the same message; the
/// framing-only iterator never stops earlier than full decoding; decompression is bounded.
pub fn records(data: &[u8]) {
    let buf = Bytes::copy_from_slice(data);
    let exact = DecodeOptions {
        verify_crc: true,
        decompress_body: false,
        max_decompressed_size: FUZZ_MAX_DECOMPRESSED,
    };
    let run = decode_records(&buf, &exact);
    assert!(run.consumed <= buf.len(), "consumed more than the buffer");
    assert_eq!(
        run.error.is_none(),
        run.consumed == buf.len(),
        "an error must be reported exactly when decoding stopped early"
    );
    for m in &run.messages {
        let Ok(bytes) = m.to_bytes() else { continue };
        let (again, len) = match decode_record(&bytes, 0, &exact) {
            Ok(r) => r,
            Err(e) => panic!("a re-encoded record does not decode: {e}"),
        };
        assert_eq!(len, bytes.len(), "re-encoded record length");
        // The stored size follows the re-encoded properties (normalised once).
        let mut expected = m.clone();
        expected.store_size = again.store_size;
        assert_eq!(
            again, expected,
            "a record changed through encode and decode"
        );
    }
    let framed = iter_records(data).take_while(Result::is_ok).count();
    assert!(
        framed >= run.messages.len(),
        "the framing iterator stopped before full decoding did"
    );
    let client = DecodeOptions {
        verify_crc: true,
        decompress_body: true,
        max_decompressed_size: FUZZ_MAX_DECOMPRESSED,
    };
    for m in decode_records(&buf, &client).messages {
        assert!(
            m.body.len() <= FUZZ_MAX_DECOMPRESSED.max(data.len()),
            "a body decompressed beyond the limit"
        );
    }
}

/// A SEND_BATCH_MESSAGE body: items that decode re-encode to the same items.
pub fn batch(data: &[u8]) {
    let Ok(items) = decode_batch(&Bytes::copy_from_slice(data)) else {
        return;
    };
    let mut out = Vec::new();
    for it in &items {
        let Ok(props) = encode_properties(&it.properties) else {
            return;
        };
        if encode_batch_item(it.flag, &it.body, &props, &mut out).is_err() {
            return;
        }
    }
    match decode_batch(&Bytes::from(out)) {
        Ok(again) => assert_eq!(
            again, items,
            "batch items changed through encode and decode"
        ),
        Err(e) => panic!("a re-encoded batch does not decode: {e}"),
    }
}

/// A properties string: the decoded map survives an encode, and the one-property lookup
/// agrees with the map (last occurrence wins).
pub fn properties(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let props: Properties = decode_properties(text);
    for (k, v) in &props {
        assert_eq!(
            find_property(text, k),
            Some(v.as_str()),
            "find_property disagrees with decode_properties for {k:?}"
        );
    }
    if let Ok(encoded) = encode_properties(&props) {
        assert_eq!(
            decode_properties(&encoded),
            props,
            "properties changed through encode and decode"
        );
    }
}

fn json_round_trip<T>(body: &[u8])
where
    T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
{
    let Ok(v) = from_json_slice::<T>(body) else {
        return;
    };
    let Ok(json) = to_json_bytes(&v) else { return };
    match from_json_slice::<T>(&json) {
        Ok(again) => assert_eq!(again, v, "a JSON body changed through encode and decode"),
        Err(e) => panic!(
            "Shoal's own JSON for {} does not decode: {e}",
            std::any::type_name::<T>()
        ),
    }
}

fn json_views(body: &[u8]) {
    json_round_trip::<HeartbeatData>(body);
    json_round_trip::<LockBatchRequestBody>(body);
    json_round_trip::<ResetOffsetBody>(body);
    json_round_trip::<TopicConfigSerializeWrapper>(body);
    json_round_trip::<TopicRouteData>(body);
}

/// JSON bodies (the first byte only varies the seeds): fastjson normalisation leaves
/// standard JSON byte for byte as it is and is idempotent; typed bodies round-trip.
pub fn json_bodies(data: &[u8]) {
    let Some((_, body)) = data.split_first() else {
        return;
    };
    if let Ok(normal) = normalize_fastjson(body) {
        if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() {
            assert_eq!(normal, body, "normalisation changed standard JSON");
        }
        match normalize_fastjson(&normal) {
            Ok(twice) => assert_eq!(twice, normal, "normalisation is not idempotent"),
            Err(e) => panic!("normalised JSON does not normalise again: {e}"),
        }
    }
    json_views(body);
}

/// Text fields parsed out of headers and properties, selected by the first byte: message ids,
/// POP offset infos, topic config text, delay levels, address patterns. Parsed values
/// re-encode to text that parses to the same value.
pub fn text_fields(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let s = String::from_utf8_lossy(rest);
    match sel % 8 {
        0 => {
            let _ = UniqKey::parse(&s);
        }
        1 => {
            if let Ok(v) = parse_start_offset_info(&s) {
                let again = parse_start_offset_info(&build_start_offset_info(&v));
                assert_eq!(again.ok(), Some(v), "start offset info round trip");
            }
        }
        2 => {
            if let Ok(v) = parse_msg_offset_info(&s) {
                let again = parse_msg_offset_info(&build_msg_offset_info(&v));
                assert_eq!(again.ok(), Some(v), "msg offset info round trip");
            }
        }
        3 => {
            if let Ok(v) = PopExtraInfo::parse(&s) {
                let again = PopExtraInfo::parse(&v.to_extra_info());
                assert_eq!(again.ok(), Some(v), "POP extra info round trip");
            }
        }
        4 => {
            if let Ok(v) = TopicConfig::decode_text(&s) {
                let again = TopicConfig::decode_text(&v.encode_text());
                assert_eq!(again.ok(), Some(v), "topic config text round trip");
            }
        }
        5 => {
            let _ = shoal_proto::constants::parse_delay_levels(&s);
        }
        6 => {
            if let Ok(id) = OffsetMsgId::parse(&s) {
                assert_eq!(
                    OffsetMsgId::parse(&id.to_string()).ok(),
                    Some(id),
                    "offset message id round trip"
                );
            }
        }
        _ => {
            if let Ok(p) = AddressPattern::parse(&s) {
                for ip in probe_ips() {
                    let _ = p.matches(ip);
                }
            }
        }
    }
}

fn probe_ips() -> [IpAddr; 5] {
    [
        IpAddr::from([127, 0, 0, 1]),
        IpAddr::from([192, 168, 1, 2]),
        IpAddr::from([10, 255, 0, 9]),
        IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, 1]),
        IpAddr::from([0u16; 8]),
    ]
}

const ADMIN_AK: &str = "fuzz-admin";
const ADMIN_SK: &str = "fuzz-admin-secret";
const READER_AK: &str = "fuzz-reader";
const READER_SK: &str = "fuzz-reader-secret";
const WHITE_IP: [u8; 4] = [10, 9, 8, 7];

/// The ACL the request target checks against: an admin with every permission, a reader with
/// SUB on every topic and group, and one allow-listed address.
fn acl() -> &'static AccessControl {
    static ACL: OnceLock<AccessControl> = OnceLock::new();
    ACL.get_or_init(|| {
        let config = PlainAclConfig {
            global_white_remote_addresses: vec!["10.9.8.7".into()],
            accounts: vec![
                AccountConfig {
                    access_key: ADMIN_AK.into(),
                    secret_key: ADMIN_SK.into(),
                    admin: true,
                    ..AccountConfig::default()
                },
                AccountConfig {
                    access_key: READER_AK.into(),
                    secret_key: READER_SK.into(),
                    default_topic_perm: Some("SUB".into()),
                    default_group_perm: Some("SUB".into()),
                    ..AccountConfig::default()
                },
            ],
        };
        match AccessControl::new(&config) {
            Ok(a) => a,
            Err(e) => panic!("the fuzz ACL does not compile: {e}"),
        }
    })
}

/// Request codes the ACL treats differently (resources, admin), in selector order.
const ACL_CODES: &[i32] = &[
    rc::SEND_MESSAGE_V2,
    rc::PULL_MESSAGE,
    rc::HEART_BEAT,
    rc::UPDATE_AND_CREATE_TOPIC,
    rc::QUERY_MESSAGE,
    rc::UPDATE_CONSUMER_OFFSET,
    rc::SEND_MESSAGE,
    rc::SEND_BATCH_MESSAGE,
    rc::CONSUMER_SEND_MSG_BACK,
    rc::LITE_PULL_MESSAGE,
    rc::UNREGISTER_CLIENT,
    rc::QUERY_CONSUMER_OFFSET,
    rc::GET_CONSUMER_LIST_BY_GROUP,
    rc::DELETE_TOPIC_IN_BROKER,
    rc::END_TRANSACTION,
    rc::GET_ROUTEINFO_BY_TOPIC,
];

fn check(cmd: &RemotingCommand, ip: IpAddr) -> (AccessRequest, bool) {
    let access = AccessRequest::parse(cmd, ip);
    let ok = acl().check(&access, ADMIN_REQUEST_CODES).is_ok();
    (access, ok)
}

/// A request for the ACL: byte 0 picks the code, byte 1 holds flags (bit 0: sign as the
/// admin, bit 1: sign as the reader, bit 2: come from the allow-listed address, bit 3: flip a
/// byte after signing), then `key\0value\0...` extFields up to a `\xff`, then the body.
///
/// Properties: an unsigned request (whatever `AccessKey`/`Signature` it carries) is refused
/// unless it comes from the allow-listed address; a request signed by the admin passes
/// exactly when its resources can be read, also after going over the wire as JSON; the
/// reader never passes an admin request nor one that needs PUB (message traces aside); a
/// request changed after signing is refused.
pub fn acl_request(data: &[u8]) {
    let (code_sel, flags, rest) = match data {
        [c, f, rest @ ..] => (*c, *f, rest),
        _ => return,
    };
    let code = ACL_CODES[usize::from(code_sel) % ACL_CODES.len()];
    let (ext_part, body) = match rest.iter().position(|b| *b == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let mut ext = ExtFields::new();
    let mut parts = ext_part.split(|b| *b == 0);
    while let (Some(k), Some(v)) = (parts.next(), parts.next()) {
        ext.insert(String::from_utf8_lossy(k), String::from_utf8_lossy(v));
    }
    let mut cmd = RemotingCommand::request(code).with_ext_fields(ext);
    if !body.is_empty() {
        cmd = cmd.with_body(Bytes::copy_from_slice(body));
    }
    let outside = IpAddr::from([192, 0, 2, 1]);
    if flags & 4 != 0 {
        assert!(
            check(&cmd, IpAddr::from(WHITE_IP)).1,
            "the allow-listed address was refused"
        );
    }
    let signer = if flags & 1 != 0 {
        Some(SessionCredentials::new(ADMIN_AK, ADMIN_SK))
    } else if flags & 2 != 0 {
        Some(SessionCredentials::new(READER_AK, READER_SK))
    } else {
        None
    };
    let Some(creds) = signer else {
        assert!(
            !check(&cmd, outside).1,
            "an unsigned request passed the ACL"
        );
        return;
    };
    sign_request(&mut cmd, &creds);
    let (access, ok) = check(&cmd, outside);
    if creds.access_key == ADMIN_AK {
        assert_eq!(
            ok,
            access.parse_error.is_none(),
            "the admin's signed request: {:?}",
            access
        );
        // Over the wire (JSON header) the signature still holds.
        if let Ok(frame) = cmd.to_frame() {
            let mut buf = BytesMut::from(&frame[..]);
            if let Ok(Some(f)) = split_frame(&mut buf, i32::MAX as usize) {
                if let Ok(wire) = RemotingCommand::decode(f) {
                    assert_eq!(
                        check(&wire, outside).1,
                        ok,
                        "the signature did not survive the wire"
                    );
                }
            }
        }
    } else {
        let pub_bit = parse_perm("PUB").unwrap_or(0);
        let needs_pub = access
            .resources
            .iter()
            .any(|(r, p)| r != "RMQ_SYS_TRACE_TOPIC" && p & pub_bit != 0);
        if ADMIN_REQUEST_CODES.contains(&code) || needs_pub {
            assert!(!ok, "the reader passed an admin or PUB request: {access:?}");
        }
    }
    if flags & 8 != 0 && ok {
        let mut tampered = cmd.clone();
        match tampered.body.as_ref().map(|b| b.to_vec()) {
            Some(mut b) if !b.is_empty() => {
                b[0] ^= 1;
                tampered.body = Some(Bytes::from(b));
            }
            _ => {
                let ext = tampered.ext_fields.get_or_insert_with(ExtFields::new);
                let changed = format!("{}x", ext.get("tampered").unwrap_or(""));
                ext.insert("tampered", changed);
            }
        }
        assert!(
            !check(&tampered, outside).1,
            "a request changed after signing passed"
        );
    }
}

/// An ACL file: it loads or is refused with an error; a loaded one answers for any address.
pub fn acl_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = toml::from_str::<PlainAclConfig>(text) else {
        return;
    };
    if let Ok(acl) = AccessControl::new(&config) {
        let cmd = RemotingCommand::request(rc::PULL_MESSAGE);
        for ip in probe_ips() {
            let _ = acl.check(&AccessRequest::parse(&cmd, ip), ADMIN_REQUEST_CODES);
        }
    }
}
