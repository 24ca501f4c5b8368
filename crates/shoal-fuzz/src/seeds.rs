//! Valid inputs for every target, built with Shoal's own encoders: what official clients and
//! brokers send (JSON and ROCKETMQ headers, the short V2 send header, heartbeats, batches,
//! compressed records, IPv6 hosts, fastjson bodies), so mutations start from the shapes that
//! reach the deep parts of each decoder.

use bytes::{Bytes, BytesMut};
use shoal_proto::code::request_code as rc;
use shoal_proto::command::ExtFields;
use shoal_proto::message::{
    compress_body, encode_batch, encode_properties, CompressionType, Message, MessageExt,
    Properties,
};
use shoal_proto::{RemotingCommand, SerializeType};
use std::net::SocketAddr;

fn ext(pairs: &[(&str, &str)]) -> ExtFields {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn props(pairs: &[(&str, &str)]) -> Properties {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

const HEARTBEAT: &str = r#"{"clientID":"10.0.0.1@4242#1","consumerDataSet":[{"groupName":"cg","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[{"classFilterMode":false,"topic":"TopicA","subString":"a||b","tagsSet":["a","b"],"codeSet":[97,98],"subVersion":1700000000000,"expressionType":"TAG"}],"unitMode":false}],"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"},{"groupName":"pg"}],"heartbeatFingerprint":0,"withoutSub":false}"#;

const LOCK_BODY: &str = r#"{"consumerGroup":"cg","clientId":"c1","mqSet":[{"topic":"TopicA","brokerName":"broker-a","queueId":0},{"topic":"TopicA","brokerName":"broker-a","queueId":1}]}"#;

/// fastjson's map with MessageQueue keys (what RESET_OFFSET bodies look like from Java).
const FASTJSON_BODY: &str = r#"{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"TopicA"}:5,{"brokerName":"broker-a","queueId":1,"topic":"TopicA"}:7}}"#;

fn commands() -> Vec<RemotingCommand> {
    let send_props = encode_properties(&props(&[
        ("TAGS", "a"),
        ("KEYS", "k1 k2"),
        ("UNIQ_KEY", "0A0000010F2A18B4AAC2123412340000"),
        ("WAIT", "true"),
    ]))
    .unwrap_or_default();
    let send_v2 = RemotingCommand::request(rc::SEND_MESSAGE_V2)
        .with_ext_fields(ext(&[
            ("a", "pg"),
            ("b", "TopicA"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "1"),
            ("f", "0"),
            ("g", "1700000000000"),
            ("h", "0"),
            ("i", &send_props),
            ("j", "0"),
            ("k", "false"),
            ("m", "false"),
        ]))
        .with_body(Bytes::from_static(b"hello shoal"))
        .with_opaque(7);
    let pull = RemotingCommand::request(rc::PULL_MESSAGE)
        .with_ext_fields(ext(&[
            ("consumerGroup", "cg"),
            ("topic", "TopicA"),
            ("queueId", "0"),
            ("queueOffset", "0"),
            ("maxMsgNums", "32"),
            ("sysFlag", "6"),
            ("commitOffset", "0"),
            ("suspendTimeoutMillis", "15000"),
            ("subscription", "*"),
            ("subVersion", "0"),
            ("expressionType", "TAG"),
            ("maxMsgBytes", "1048576"),
        ]))
        .with_opaque(8);
    let heartbeat = RemotingCommand::request(rc::HEART_BEAT)
        .with_body(Bytes::from_static(HEARTBEAT.as_bytes()))
        .with_opaque(9);
    let offsets = RemotingCommand::request(rc::UPDATE_CONSUMER_OFFSET).with_ext_fields(ext(&[
        ("consumerGroup", "cg"),
        ("topic", "TopicA"),
        ("queueId", "3"),
        ("commitOffset", "42"),
    ]));
    let mut binary = RemotingCommand::request(rc::QUERY_CONSUMER_OFFSET).with_ext_fields(ext(&[
        ("consumerGroup", "cg"),
        ("topic", "TopicA"),
        ("queueId", "1"),
    ]));
    binary.serialize_type = SerializeType::RocketMq;
    let mut response = RemotingCommand::response(0, Some("ok".into()));
    response.ext_fields = Some(ext(&[
        ("msgId", "0A00000100002A9F0000000000000000"),
        ("queueId", "1"),
        ("queueOffset", "12"),
    ]));
    let mut binary_response = response.clone();
    binary_response.serialize_type = SerializeType::RocketMq;
    let create = RemotingCommand::request(rc::UPDATE_AND_CREATE_TOPIC).with_ext_fields(ext(&[
        ("topic", "TopicB"),
        ("defaultTopic", "TBW102"),
        ("readQueueNums", "8"),
        ("writeQueueNums", "8"),
        ("perm", "6"),
        ("topicFilterType", "SINGLE_TAG"),
        ("topicSysFlag", "0"),
        ("order", "false"),
    ]));
    let batch_body = encode_batch(&[
        Message::new("TopicA", Bytes::from_static(b"one")),
        Message::new("TopicA", Bytes::from_static(b"two")),
    ])
    .unwrap_or_default();
    let batch = RemotingCommand::request(rc::SEND_BATCH_MESSAGE)
        .with_ext_fields(ext(&[
            ("a", "pg"),
            ("b", "TopicA"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "0"),
            ("f", "0"),
            ("g", "1700000000000"),
            ("h", "0"),
            ("m", "false"),
            ("z", "true"),
        ]))
        .with_body(batch_body);
    let lock = RemotingCommand::request(rc::LOCK_BATCH_MQ)
        .with_body(Bytes::from_static(LOCK_BODY.as_bytes()));
    let end_tx = RemotingCommand::request(rc::END_TRANSACTION).with_ext_fields(ext(&[
        ("producerGroup", "pg"),
        ("tranStateTableOffset", "3"),
        ("commitLogOffset", "1024"),
        ("commitOrRollback", "8"),
        ("fromTransactionCheck", "false"),
        ("msgId", "0A00000100002A9F0000000000000400"),
    ]));
    vec![
        send_v2,
        pull,
        heartbeat,
        offsets,
        binary,
        response,
        binary_response,
        create,
        batch,
        lock,
        end_tx,
    ]
}

fn frame(cmd: &RemotingCommand) -> Vec<u8> {
    let mut out = BytesMut::new();
    match cmd.encode(&mut out) {
        Ok(()) => out.to_vec(),
        Err(_) => Vec::new(),
    }
}

/// Byte streams of frames: single frames, and several frames back to back (with a chunk-size
/// byte first, as [`crate::targets::frame_stream`] reads it).
pub fn frame_stream() -> Vec<Vec<u8>> {
    let cmds = commands();
    let mut out = Vec::new();
    for (i, c) in cmds.iter().enumerate() {
        let mut s = vec![(i * 5) as u8];
        s.extend(frame(c));
        out.push(s);
    }
    let mut all = vec![3u8];
    for c in &cmds {
        all.extend(frame(c));
    }
    out.push(all);
    out
}

fn headers(ty: SerializeType) -> Vec<Vec<u8>> {
    commands()
        .into_iter()
        .map(|mut c| {
            c.serialize_type = ty;
            c.body = None;
            let mut out = BytesMut::new();
            match c.encode_header(&mut out) {
                Ok(()) => out.to_vec(),
                Err(_) => Vec::new(),
            }
        })
        .collect()
}

/// JSON headers (what Java clients send by default).
pub fn header_json() -> Vec<Vec<u8>> {
    let mut out = headers(SerializeType::Json);
    // fastjson's quirks: numbers as numbers in extFields, nulls, language by number.
    out.push(
        br#"{"code":11,"language":0,"version":"401","opaque":3,"flag":0,"remark":null,"extFields":{"queueId":1,"maxMsgNums":32,"x":null,"b":true},"serializeTypeCurrentRPC":"JSON"}"#
            .to_vec(),
    );
    out.push(b"{}\n".to_vec());
    // What the JSON fast path takes and what it leaves to serde: escapes and surrogate pairs,
    // whitespace, integers as strings, a repeated extFields key, other keys; then -0, floats,
    // nested values, a lone surrogate and a repeated field.
    out.push(
        b" {\"code\" : \" 310\" ,\"extFields\":{\"i\":\"K\\u0001v\\u0002\\ud83d\\ude00\\/\\\"\",\"n\":-12,\"i\":\"again\",\"t\":true},\"language\":\"GO\",\"x\":\"y\"}\r\n"
            .to_vec(),
    );
    out.push(
        br#"{"code":-0,"extFields":{"f":1.5e3,"o":{"k":[1]},"s":"\ud800"},"remark":"r","remark":null}"#
            .to_vec(),
    );
    out
}

/// ROCKETMQ binary headers (what the C++ client and RocketMQ 5 may send).
pub fn header_binary() -> Vec<Vec<u8>> {
    let mut out = headers(SerializeType::RocketMq);
    // Found by libFuzzer: an extFields area whose entries all have an empty key or value
    // (dropped on decode) once decoded as an empty map that encoded back as no map.
    let mut h = vec![
        0x0c, 0x01, 0xdf, 0, 0, 0, 0, 0, 0, 0xea, 0, 0, 0, 0, 0, 0, 0,
    ];
    let mut ext = Vec::new();
    for key in ["consumerGroup", ""] {
        ext.extend_from_slice(&(key.len() as i16).to_be_bytes());
        ext.extend_from_slice(key.as_bytes());
        ext.extend_from_slice(&0i32.to_be_bytes());
    }
    ext.extend_from_slice(&0i16.to_be_bytes());
    ext.extend_from_slice(&1i32.to_be_bytes());
    ext.push(b'v');
    h.extend_from_slice(&(ext.len() as i32).to_be_bytes());
    h.extend_from_slice(&ext);
    out.push(h);
    out
}

fn stored(topic: &str, body: &[u8], v6: bool, compressed: bool) -> Vec<u8> {
    let (born, store): (SocketAddr, SocketAddr) = if v6 {
        (
            SocketAddr::from(([0xfd00, 0, 0, 0, 0, 0, 0, 1], 40000)),
            SocketAddr::from(([0xfd00, 0, 0, 0, 0, 0, 0, 2], 10911)),
        )
    } else {
        (
            SocketAddr::from(([10, 0, 0, 1], 40000)),
            SocketAddr::from(([10, 0, 0, 2], 10911)),
        )
    };
    let (body, sys_flag) = if compressed {
        compress_body(body, CompressionType::Zlib, 5).unwrap_or((body.to_vec(), 0))
    } else {
        (body.to_vec(), 0)
    };
    let msg = MessageExt {
        store_size: 0,
        body_crc: 0,
        queue_id: 1,
        flag: 0,
        queue_offset: 5,
        commit_log_offset: 4096,
        sys_flag,
        born_timestamp: 1_700_000_000_000,
        born_host: born,
        store_timestamp: 1_700_000_000_100,
        store_host: store,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: Bytes::from(body),
        topic: topic.to_owned(),
        properties: props(&[
            ("TAGS", "a"),
            ("UNIQ_KEY", "0A0000010F2A18B4AAC2123412340000"),
        ]),
    };
    msg.to_bytes().map(|b| b.to_vec()).unwrap_or_default()
}

/// Stored records as pull answers carry them: IPv4 and IPv6 hosts, a compressed body, runs.
pub fn records() -> Vec<Vec<u8>> {
    let a = stored("TopicA", b"first body", false, false);
    let b = stored("TopicA", b"second body, stored from IPv6", true, false);
    let c = stored("TopicA", &[b'z'; 300], false, true);
    let run = [a.clone(), b.clone(), c.clone()].concat();
    vec![a, b, c, run]
}

/// SEND_BATCH_MESSAGE bodies.
pub fn batch() -> Vec<Vec<u8>> {
    let mut m = Message::new("TopicA", Bytes::from_static(b"with properties"));
    m.properties = props(&[("TAGS", "t"), ("KEYS", "k")]);
    vec![
        encode_batch(&[m.clone()]).unwrap_or_default(),
        encode_batch(&[
            Message::new("TopicA", Bytes::from_static(b"")),
            m,
            Message::new("TopicA", Bytes::from_static(b"third")),
        ])
        .unwrap_or_default(),
    ]
}

/// Message properties strings (`name\x01value\x02...`).
pub fn properties() -> Vec<Vec<u8>> {
    vec![
        b"TAGS\x01a\x02KEYS\x01k1 k2\x02UNIQ_KEY\x010A0000010F2A18B4AAC2123412340000\x02".to_vec(),
        b"DELAY\x013\x02WAIT\x01false".to_vec(),
        b"a\x01\x02\x01b\x02c\x01d\x01e\x02".to_vec(),
    ]
}

/// JSON bodies, each after the selector byte [`crate::targets::json_bodies`] reads.
pub fn json_bodies() -> Vec<Vec<u8>> {
    let with = |sel: u8, body: &str| {
        let mut v = vec![sel];
        v.extend_from_slice(body.as_bytes());
        v
    };
    vec![
        with(0, HEARTBEAT),
        with(1, LOCK_BODY),
        with(2, FASTJSON_BODY),
        with(
            3,
            r#"{"topicConfigTable":{"TopicA":{"topicName":"TopicA","readQueueNums":4,"writeQueueNums":4,"perm":6,"topicFilterType":"SINGLE_TAG","topicSysFlag":0,"order":false}},"dataVersion":{"timestamp":1700000000000,"counter":3}}"#,
        ),
        with(
            4,
            r#"{"brokerDatas":[{"cluster":"c","brokerName":"broker-a","brokerAddrs":{0:"10.0.0.2:10911"}}],"queueDatas":[{"brokerName":"broker-a","readQueueNums":4,"writeQueueNums":4,"perm":6,"topicSysFlag":0}]}"#,
        ),
        with(5, r#"[1,{"a":[true,null,"x"]},{2:3}]"#),
    ]
}

/// Text fields, each after the selector byte [`crate::targets::text_fields`] reads.
pub fn text_fields() -> Vec<Vec<u8>> {
    let with = |sel: u8, s: &str| {
        let mut v = vec![sel];
        v.extend_from_slice(s.as_bytes());
        v
    };
    vec![
        with(0, "0A0000010F2A18B4AAC2123412340000"),
        with(1, "0 2 1700000000000"),
        with(2, "0 2 5;1 3 9"),
        with(3, "0 1700000000000 60000 1 TopicA broker-a 2 5 0"),
        with(4, "TopicA 4 4 6 SINGLE_TAG"),
        with(5, "1s 5s 10s 30s 1m 2m 1h 2h 1d"),
        with(6, "0A00000100002A9F0000000000000400"),
        with(7, "192.168.1.{1,2,3},10.0.0.0/8,fd00::/8,192.168.*"),
    ]
}

/// ACL requests in the layout [`crate::targets::acl_request`] reads: code selector, flags,
/// `key\0value\0...` extFields, `\xff`, body.
pub fn acl_request() -> Vec<Vec<u8>> {
    let with = |code: u8, flags: u8, ext: &[u8], body: &[u8]| {
        let mut v = vec![code, flags];
        v.extend_from_slice(ext);
        v.push(0xff);
        v.extend_from_slice(body);
        v
    };
    vec![
        with(0, 1, b"b\0TopicA\0a\0pg", b"body"),
        with(1, 2, b"topic\0TopicA\0consumerGroup\0cg", b""),
        with(2, 1, b"", HEARTBEAT.as_bytes()),
        with(3, 4, b"topic\0TopicB", b""),
        with(4, 0, b"AccessKey\0admin-key\0Signature\0AAAA", b"x"),
        with(5, 3, b"consumerGroup\0cg\0topic\0%RETRY%cg", b""),
    ]
}

/// ACL files (TOML with RocketMQ's plain_acl keys).
pub fn acl_config() -> Vec<Vec<u8>> {
    vec![
        br#"globalWhiteRemoteAddresses = ["10.10.103.*", "192.168.0.{1,2}"]

[[accounts]]
accessKey = "app-orders"
secretKey = "change-me-please"
whiteRemoteAddress = "192.168.0.*"
admin = false
defaultTopicPerm = "DENY"
defaultGroupPerm = "SUB"
topicPerms = ["Orders=PUB|SUB", "Audit=SUB"]
groupPerms = ["cg=SUB", "legacy=DENY"]
"#
        .to_vec(),
    ]
}

/// The seeds of the target named `name` (see [`crate::TARGETS`]); none for an unknown name.
pub fn for_target(name: &str) -> Vec<Vec<u8>> {
    match name {
        "frame_stream" => frame_stream(),
        "header_json" => header_json(),
        "header_binary" => header_binary(),
        "records" => records(),
        "batch" => batch(),
        "properties" => properties(),
        "json_bodies" => json_bodies(),
        "text_fields" => text_fields(),
        "acl_request" => acl_request(),
        "acl_config" => acl_config(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use shoal_proto::command::{decode_json_header_fast, decode_json_header_reference};

    /// The JSON header seeds start the fuzzer on both sides of the fast path: some it takes,
    /// some it leaves to serde that serde accepts, some that serde refuses.
    #[test]
    fn json_header_seeds_cover_both_paths() {
        let seeds = super::header_json();
        let fast = seeds
            .iter()
            .filter(|s| decode_json_header_fast(s).is_some())
            .count();
        let slow_ok = seeds
            .iter()
            .filter(|s| decode_json_header_fast(s).is_none())
            .filter(|s| decode_json_header_reference(s).is_ok())
            .count();
        let refused = seeds
            .iter()
            .filter(|s| decode_json_header_reference(s).is_err())
            .count();
        assert!(
            fast >= 2 && slow_ok >= 1 && refused >= 1,
            "{fast} {slow_ok} {refused}"
        );
        // The hand-written seed with escapes, spaces and a repeated extFields key is taken.
        let spaced = seeds
            .iter()
            .find(|s| s.starts_with(b" {\"code\" : \" 310\""))
            .expect("seed present");
        let cmd = decode_json_header_fast(spaced).expect("taken by the fast path");
        assert_eq!(cmd.ext("i"), Some("again"));
        assert_eq!(cmd.code, 310);
    }
}
