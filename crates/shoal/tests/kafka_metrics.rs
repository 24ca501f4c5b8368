//! The Kafka listener's counters on `/metrics`: a live `shoal dev --kafka-port` is sent real
//! Kafka requests (ApiVersions, Metadata that auto-creates a topic, Produce, Fetch, then an
//! oversized frame) and the `shoal_kafka_*` series move by exactly what was done. Without the
//! listener (`--no-kafka`) there are none.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

#[path = "../../shoal-kafka/tests/support/records.rs"]
mod records;

use kafka_protocol::messages::*;
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::kafka_wire::{topic_name, Client};
use support::{sample, Dev};

/// Scrapes until `series` has the value `want` (the listener updates some counters after it
/// has written the answer, e.g. a closed connection's `connections_open`).
fn wait_for(dev: &Dev, series: &str, want: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, m) = dev.http_get("/metrics");
        assert_eq!(status, 200);
        if sample(&m, series) == Some(want) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is {:?}, not {want}:\n{m}",
            sample(&m, series)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kafka_counters_on_metrics_move_with_real_requests() {
    const N: i64 = 5;
    let (dev, kafka) = Dev::start_with_kafka();

    // Registered with the listener, zero before any Kafka client came.
    let (status, m) = dev.http_get("/metrics");
    assert_eq!(status, 200);
    assert!(
        m.contains("# TYPE shoal_kafka_connections_open gauge\n"),
        "{m}"
    );
    assert!(
        m.contains("# TYPE shoal_kafka_records_produced_total counter\n"),
        "{m}"
    );
    assert_eq!(sample(&m, "shoal_kafka_connections_open"), Some(0.0));
    assert_eq!(
        sample(&m, "shoal_kafka_connections_accepted_total"),
        Some(0.0)
    );
    assert_eq!(sample(&m, "shoal_kafka_requests_total"), Some(0.0));
    assert_eq!(sample(&m, "shoal_kafka_records_produced_total"), Some(0.0));

    let mut c = Client::connect(&kafka);
    let r: ApiVersionsResponse = c.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert_eq!(r.error_code, 0);

    // Metadata for an unknown topic creates it (shoal dev allows auto-creation) with the
    // broker's default queue count, 4.
    let mut t = metadata_request::MetadataRequestTopic::default();
    t.name = Some(topic_name("KMetrics"));
    let mut req = MetadataRequest::default();
    req.topics = Some(vec![t]);
    req.allow_auto_topic_creation = true;
    let r: MetadataResponse = c.call(ApiKey::Metadata, 9, &req);
    assert_eq!(r.topics.len(), 1);
    assert_eq!(r.topics[0].error_code, 0, "{:?}", r.topics[0]);
    assert_eq!(r.topics[0].partitions.len(), 4);

    // Produce N records to partition 0.
    let recs: Vec<_> = (0..N)
        .map(|i| {
            let v = format!("v{i}");
            records::record(i, Some(&b"k"[..]), Some(v.as_bytes()), &[])
        })
        .collect();
    let mut p = produce_request::PartitionProduceData::default();
    p.index = 0;
    p.records = Some(records::batch(&recs, Compression::None).freeze());
    let mut t = produce_request::TopicProduceData::default();
    t.name = topic_name("KMetrics");
    t.partition_data = vec![p];
    let mut req = ProduceRequest::default();
    req.acks = 1;
    req.timeout_ms = 5000;
    req.topic_data = vec![t];
    let r: ProduceResponse = c.call(ApiKey::Produce, 9, &req);
    let part = &r.responses[0].partition_responses[0];
    assert_eq!(part.error_code, 0, "{part:?}");
    assert_eq!(part.base_offset, 0);

    // Fetch them back.
    let mut fp = fetch_request::FetchPartition::default();
    fp.partition = 0;
    fp.fetch_offset = 0;
    fp.partition_max_bytes = 1 << 20;
    let mut ft = fetch_request::FetchTopic::default();
    ft.topic = topic_name("KMetrics");
    ft.partitions = vec![fp];
    let mut req = FetchRequest::default();
    req.replica_id = BrokerId(-1);
    req.max_wait_ms = 500;
    req.min_bytes = 1;
    req.max_bytes = 1 << 20;
    req.session_epoch = -1;
    req.topics = vec![ft];
    let r: FetchResponse = c.call(ApiKey::Fetch, 11, &req);
    let part = &r.responses[0].partitions[0];
    assert_eq!(part.error_code, 0);
    let mut bytes = part.records.clone().expect("records");
    let fetched: usize = RecordBatchDecoder::decode_all(&mut bytes)
        .unwrap()
        .iter()
        .map(|b| b.records.len())
        .sum();
    assert_eq!(fetched as i64, N);

    // The connection is open and four requests were answered.
    let m = wait_for(&dev, "shoal_kafka_connections_open", 1.0);
    assert_eq!(
        sample(&m, "shoal_kafka_connections_accepted_total"),
        Some(1.0)
    );
    assert_eq!(sample(&m, "shoal_kafka_requests_total"), Some(4.0), "{m}");
    assert_eq!(
        sample(&m, "shoal_kafka_records_produced_total"),
        Some(N as f64)
    );
    assert_eq!(
        sample(&m, "shoal_kafka_records_fetched_total"),
        Some(N as f64)
    );
    assert_eq!(sample(&m, "shoal_kafka_requests_refused_total"), Some(0.0));

    // A frame over max_request_bytes closes the connection and is counted as refused (it is
    // not read, so not counted in requests).
    c.stream.write_all(&i32::MAX.to_be_bytes()).unwrap();
    assert!(support::closed_within(
        &mut c.stream,
        Duration::from_secs(10)
    ));
    let m = wait_for(&dev, "shoal_kafka_connections_open", 0.0);
    assert_eq!(sample(&m, "shoal_kafka_requests_refused_total"), Some(1.0));
    // ... and as a hit of its limit, in the `*_limit_hits_total` style of the other listeners.
    assert_eq!(
        sample(
            &m,
            "shoal_kafka_limit_hits_total{limit=\"kafka.max_request_bytes\",action=\"closed\"}"
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(sample(&m, "shoal_kafka_requests_total"), Some(4.0));
    assert_eq!(
        sample(&m, "shoal_kafka_connections_accepted_total"),
        Some(1.0)
    );
    for zero in [
        "shoal_kafka_limit_hits_total{limit=\"kafka.max_connections\",action=\"refused\"}",
        "shoal_kafka_requests_malformed_total",
        "shoal_kafka_batches_malformed_total",
        "shoal_kafka_duplicate_batches_total",
        "shoal_kafka_sequence_errors_total",
    ] {
        assert_eq!(sample(&m, zero), Some(0.0), "{zero}");
    }

    // Every family the listener exports is in docs/operations.md, as the broker's are.
    let docs =
        std::fs::read_to_string(support::external::repo_root().join("docs/operations.md")).unwrap();
    let mut families = 0;
    for line in m.lines() {
        let Some(rest) = line.strip_prefix("# TYPE shoal_kafka_") else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let (Some(name), Some(kind)) = (it.next(), it.next()) else {
            continue;
        };
        let documented = if kind == "counter" && !name.ends_with("_total") {
            format!("`shoal_kafka_{name}_total`")
        } else {
            format!("`shoal_kafka_{name}`")
        };
        assert!(
            docs.contains(&documented),
            "{documented} ({kind}) is not documented in docs/operations.md"
        );
        families += 1;
    }
    assert_eq!(families, 15, "{m}");
}

#[test]
fn no_kafka_series_without_the_listener() {
    let dev = Dev::start();
    let (status, m) = dev.http_get("/metrics");
    assert_eq!(status, 200);
    assert!(m.contains("shoal_broker_connections"), "{m}");
    assert!(!m.contains("shoal_kafka_"), "{m}");
}

/// `shoal dev -c FILE` takes the listener's settings from the file's `[kafka]` table: with
/// `max_connections = 1` a second connection is closed at accept and counted as a hit of that
/// limit. A mistake in the table stops `shoal broker -c` before anything starts, naming the
/// file, the line and the key.
#[test]
fn the_kafka_table_of_the_config_file_sets_the_listener() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.toml");
    std::fs::write(&file, "[kafka]\nmax_connections = 1\n").unwrap();
    let port = support::free_port().to_string();
    let dev = Dev::start_with(&["-c", file.to_str().unwrap(), "--kafka-port", &port]);
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(&dev.http).is_err() {
        assert!(
            Instant::now() < deadline,
            "shoal dev's HTTP port did not open"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let first = Client::connect(&addr);
    wait_for(&dev, "shoal_kafka_connections_open", 1.0);
    let mut second = TcpStream::connect(&addr).unwrap();
    assert!(support::closed_within(&mut second, Duration::from_secs(10)));
    wait_for(
        &dev,
        "shoal_kafka_limit_hits_total{limit=\"kafka.max_connections\",action=\"refused\"}",
        1.0,
    );
    drop(first);

    std::fs::write(
        &file,
        "broker_name = \"b\"\n[kafka]\nlisten_addr = \"127.0.0.1:1\"\nmax_conections = 1\n",
    )
    .unwrap();
    let out = std::process::Command::new(support::shoal())
        .args(["broker", "-c", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(file.to_str().unwrap())
            && err.contains("line 4")
            && err.contains("unknown field `max_conections`"),
        "{err}"
    );
}
