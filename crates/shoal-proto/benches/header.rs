//! Criterion benchmarks of the frame codec: encoding and decoding a typical SEND_MESSAGE_V2
//! request and a typical PULL_MESSAGE response, with JSON and ROCKETMQ binary headers; and the
//! JSON header alone (no frame, no body) of a send request and its response.
//!
//! Run briefly with:
//! `cargo bench -p shoal-proto --bench header -- --warm-up-time 1 --measurement-time 3`
//! (add a filter such as `json_header` to run one group).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "benchmark code (criterion's macros add undocumented functions); a failed unwrap ends the run"
)]

use bytes::{Bytes, BytesMut};
use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use shoal_proto::command::{split_frame, ExtFields, MAX_FRAME_LEN};
use shoal_proto::{LanguageCode, RemotingCommand, SerializeType};

fn ext(pairs: &[(&str, &str)]) -> ExtFields {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// SEND_MESSAGE_V2 (310) as a Java producer sends it (spec 1.3), with a 128-byte body.
fn send_message_v2() -> RemotingCommand {
    RemotingCommand {
        code: 310,
        language: LanguageCode::Java,
        version: 479,
        opaque: 7,
        flag: 0,
        remark: None,
        ext_fields: Some(ext(&[
            ("a", "please_rename_unique_group_name"),
            ("b", "TopicTest"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "1"),
            ("f", "0"),
            ("g", "1700000000000"),
            ("h", "0"),
            (
                "i",
                "UNIQ_KEY\u{1}7F0000010C6318B4AAC2191FD5F80000\u{2}WAIT\u{1}true\u{2}TAGS\u{1}TagA\u{2}",
            ),
            ("j", "0"),
            ("k", "false"),
            ("m", "false"),
            ("n", "broker-a"),
        ])),
        serialize_type: SerializeType::Json,
        ext_fields_raw: None,
        body: Some(Bytes::from(vec![b'x'; 128])),
    }
}

/// A PULL_MESSAGE (11) SUCCESS response header (spec 2.3), without its message body.
fn pull_response() -> RemotingCommand {
    RemotingCommand {
        code: 0,
        language: LanguageCode::Java,
        version: 479,
        opaque: 1234,
        flag: 1,
        remark: Some("FOUND".into()),
        ext_fields: Some(ext(&[
            ("suggestWhichBrokerId", "0"),
            ("nextBeginOffset", "1032"),
            ("minOffset", "0"),
            ("maxOffset", "1032"),
            ("topicSysFlag", "0"),
            ("groupSysFlag", "0"),
        ])),
        serialize_type: SerializeType::Json,
        ext_fields_raw: None,
        body: None,
    }
}

fn bench_codec(c: &mut Criterion) {
    let cases = [
        ("send_v2", send_message_v2()),
        ("pull_response", pull_response()),
    ];
    let mut group = c.benchmark_group("header");
    for (name, base) in cases {
        for (kind, st) in [
            ("json", SerializeType::Json),
            ("binary", SerializeType::RocketMq),
        ] {
            let mut cmd = base.clone();
            cmd.serialize_type = st;
            let frame = cmd.to_frame().expect("benchmark command encodes");
            group.throughput(Throughput::Elements(1));
            let mut buf = BytesMut::with_capacity(frame.len() * 2);
            group.bench_function(format!("{name}/{kind}/encode"), |b| {
                b.iter(|| {
                    buf.clear();
                    black_box(&cmd).encode(&mut buf).expect("encodes");
                    black_box(buf.len())
                })
            });
            let inner = frame.slice(4..);
            group.bench_function(format!("{name}/{kind}/decode"), |b| {
                b.iter(|| RemotingCommand::decode(black_box(inner.clone())).expect("decodes"))
            });
            group.bench_function(format!("{name}/{kind}/split_and_decode"), |b| {
                b.iter(|| {
                    let mut src = BytesMut::from(black_box(&frame[..]));
                    let f = split_frame(&mut src, MAX_FRAME_LEN)
                        .expect("valid")
                        .expect("whole");
                    RemotingCommand::decode(f).expect("decodes")
                })
            });
        }
    }
    group.finish();
}

/// SEND_MESSAGE_V2 (310) as the Java producer of RocketMQ 5 sends it: fields `a` to `m`, and
/// properties (`i`) with a unique key, WAIT and TAGS between \u0001/\u0002 separators.
fn send_v2_request_header() -> RemotingCommand {
    RemotingCommand {
        code: 310,
        language: LanguageCode::Java,
        version: 479,
        opaque: 1_048_576,
        flag: 0,
        remark: None,
        ext_fields: Some(ext(&[
            ("a", "please_rename_unique_group_name"),
            ("b", "TopicTest"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "3"),
            ("f", "0"),
            ("g", "1700000000123"),
            ("h", "0"),
            (
                "i",
                "UNIQ_KEY\u{1}7F0000010C6318B4AAC2191FD5F80000\u{2}WAIT\u{1}true\u{2}TAGS\u{1}TagA\u{2}",
            ),
            ("j", "0"),
            ("k", "false"),
            ("l", "16"),
            ("m", "false"),
        ])),
        serialize_type: SerializeType::Json,
        ext_fields_raw: None,
        body: None,
    }
}

/// The broker's SUCCESS answer to a send (SendMessageResponseHeader).
fn send_response_header() -> RemotingCommand {
    RemotingCommand {
        code: 0,
        language: LanguageCode::Java,
        version: 479,
        opaque: 1_048_576,
        flag: 1,
        remark: None,
        ext_fields: Some(ext(&[
            ("msgId", "7F00000100002A9F00000000000A3C2E"),
            ("queueId", "3"),
            ("queueOffset", "123456"),
            ("MSG_REGION", "DefaultRegion"),
            ("TRACE_ON", "true"),
        ])),
        serialize_type: SerializeType::Json,
        ext_fields_raw: None,
        body: None,
    }
}

/// The JSON header alone: `decode_header` of its bytes and `encode_header` of the command.
fn bench_json_header(c: &mut Criterion) {
    let mut group = c.benchmark_group("json_header");
    group.throughput(Throughput::Elements(1));
    for (name, cmd) in [
        ("send_v2_request", send_v2_request_header()),
        ("send_response", send_response_header()),
    ] {
        let mut header = BytesMut::new();
        cmd.encode_header(&mut header)
            .expect("benchmark command encodes");
        let header = header.freeze();
        assert_eq!(
            RemotingCommand::decode_header(SerializeType::Json, &header).expect("decodes"),
            cmd
        );
        group.bench_function(format!("{name}/decode"), |b| {
            b.iter(|| {
                RemotingCommand::decode_header(SerializeType::Json, black_box(&header[..]))
                    .expect("decodes")
            })
        });
        let mut buf = BytesMut::with_capacity(header.len() * 2);
        group.bench_function(format!("{name}/encode"), |b| {
            b.iter(|| {
                buf.clear();
                black_box(&cmd).encode_header(&mut buf).expect("encodes");
                black_box(buf.len())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_codec, bench_json_header);
criterion_main!(benches);
