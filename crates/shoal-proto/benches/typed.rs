//! Criterion benchmarks of typed headers and JSON bodies: decoding the typical PULL_MESSAGE
//! and SEND_MESSAGE_V2 headers from extFields, and parsing heartbeat / route / consume-stats
//! bodies (standard JSON and fastjson forms).
//!
//! Run briefly with:
//! `cargo bench -p shoal-proto --bench typed -- --warm-up-time 1 --measurement-time 3`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "benchmark code (criterion's macros add undocumented functions); a failed unwrap ends the run"
)]

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use shoal_proto::body::{
    from_json_slice, to_json_bytes, ConsumeStats, HeartbeatData, TopicRouteData,
};
use shoal_proto::command::ExtFields;
use shoal_proto::header::{CommandHeader, PullMessageRequestHeader, SendMessageRequestHeaderV2};

fn ext(pairs: &[(&str, &str)]) -> ExtFields {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn headers(c: &mut Criterion) {
    let pull = ext(&[
        ("queueId", "0"),
        ("maxMsgBytes", "262144"),
        ("maxMsgNums", "32"),
        ("sysFlag", "3"),
        ("suspendTimeoutMillis", "15000"),
        ("commitOffset", "5"),
        ("bname", "broker-a"),
        ("topic", "T"),
        ("queueOffset", "0"),
        ("expressionType", "TAG"),
        ("subVersion", "1700000000000"),
        ("consumerGroup", "CG"),
    ]);
    let send = ext(&[
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
    ]);
    let mut g = c.benchmark_group("header");
    g.throughput(Throughput::Elements(1));
    g.bench_function("pull_request_decode", |b| {
        b.iter(|| PullMessageRequestHeader::from_ext_fields(black_box(&pull)))
    });
    let h = PullMessageRequestHeader::from_ext_fields(&pull).unwrap();
    g.bench_function("pull_request_encode", |b| {
        b.iter(|| black_box(&h).to_ext_fields())
    });
    g.bench_function("send_v2_decode", |b| {
        b.iter(|| SendMessageRequestHeaderV2::from_ext_fields(black_box(&send)))
    });
    g.finish();
}

const HEARTBEAT: &str = r#"{"clientID":"192.168.0.2@12345#123456789","consumerDataSet":[{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"CG","messageModel":"CLUSTERING","subscriptionDataSet":[{"classFilterMode":false,"codeSet":[],"expressionType":"TAG","subString":"*","subVersion":1700000000001,"tagsSet":[],"topic":"%RETRY%CG"},{"classFilterMode":false,"codeSet":[3552231,3552232],"expressionType":"TAG","subString":"tagA || tagB","subVersion":1700000000000,"tagsSet":["tagA","tagB"],"topic":"T"}],"unitMode":false}],"heartbeatFingerprint":0,"producerDataSet":[{"groupName":"CLIENT_INNER_PRODUCER"}],"withoutSub":false}"#;
const ROUTE_FASTJSON: &str = r#"{"brokerDatas":[{"brokerAddrs":{0:"192.168.0.1:10911",1:"192.168.0.3:10911"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}"#;

fn consume_stats_fastjson(queues: i32) -> String {
    let entries: Vec<String> = (0..queues)
        .map(|q| format!(r#"{{"brokerName":"broker-a","queueId":{q},"topic":"T"}}:{{"brokerOffset":10,"consumerOffset":7,"lastTimestamp":1700000000000,"pullOffset":8}}"#))
        .collect();
    format!(
        r#"{{"consumeTps":1.5,"offsetTable":{{{}}}}}"#,
        entries.join(",")
    )
}

fn bodies(c: &mut Criterion) {
    let mut g = c.benchmark_group("body");
    g.throughput(Throughput::Bytes(HEARTBEAT.len() as u64));
    g.bench_function("heartbeat_decode", |b| {
        b.iter(|| from_json_slice::<HeartbeatData>(black_box(HEARTBEAT.as_bytes())))
    });
    let hb: HeartbeatData = from_json_slice(HEARTBEAT.as_bytes()).unwrap();
    g.bench_function("heartbeat_encode", |b| {
        b.iter(|| to_json_bytes(black_box(&hb)))
    });
    g.throughput(Throughput::Bytes(ROUTE_FASTJSON.len() as u64));
    g.bench_function("route_fastjson_decode", |b| {
        b.iter(|| from_json_slice::<TopicRouteData>(black_box(ROUTE_FASTJSON.as_bytes())))
    });
    let stats = consume_stats_fastjson(64);
    g.throughput(Throughput::Bytes(stats.len() as u64));
    g.bench_function("consume_stats_64q_fastjson_decode", |b| {
        b.iter(|| from_json_slice::<ConsumeStats>(black_box(stats.as_bytes())))
    });
    g.finish();
}

criterion_group!(benches, headers, bodies);
criterion_main!(benches);
