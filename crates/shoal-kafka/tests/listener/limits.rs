//! What the listener refuses: oversized requests, declared lengths past the frame, and APIs
//! or versions it does not implement.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use crate::fixture::*;
use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::Compression;
use shoal_kafka::KafkaConfig;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn an_oversized_request_closes_the_connection() {
    let f = Fixture::start(KafkaConfig {
        max_request_bytes: 4096,
        ..KafkaConfig::default()
    })
    .await;
    let mut c = f.client().await;
    c.stream
        .write_all(&1_000_000i32.to_be_bytes())
        .await
        .unwrap();
    assert_closed(&mut c, "a frame over max_request_bytes").await;
    assert_eq!(
        f.server
            .as_ref()
            .unwrap()
            .counters()
            .requests_refused
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// The process's peak virtual size (`VmPeak` in /proc/self/status), kB.
fn vm_peak_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmPeak:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Writes a request frame with `body` as it is (header from kafka-protocol).
async fn send_raw(c: &mut Client, key: ApiKey, version: i16, body: &[u8]) {
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("evil")))
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    buf.put_slice(body);
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    c.stream.write_all(&buf).await.unwrap();
}

fn put_str(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

/// Bodies of a few bytes that declare arrays of 2^31-1 (or 2^32-2 compact) elements.
fn huge_array_bodies() -> Vec<(ApiKey, i16, BytesMut)> {
    let max = i32::MAX;
    let compact_max = [0xff, 0xff, 0xff, 0xff, 0x0f]; // u32::MAX: 2^32-2 elements
    let mut out = Vec::new();
    // Produce v3: one topic whose partition array is huge.
    let mut b = BytesMut::new();
    b.put_i16(-1); // transactional id
    b.put_i16(1);
    b.put_i32(1000);
    b.put_i32(1);
    put_str(&mut b, "t");
    b.put_i32(max);
    out.push((ApiKey::Produce, 3, b));
    // Produce v9 (flexible): topic array as a compact array.
    let mut b = BytesMut::new();
    b.put_u8(0); // transactional id null
    b.put_i16(1);
    b.put_i32(1000);
    b.put_slice(&compact_max);
    out.push((ApiKey::Produce, 9, b));
    // Fetch v4: replica, max wait, min bytes, max bytes, isolation, topics.
    let mut b = BytesMut::new();
    b.put_i32(-1);
    b.put_i32(500);
    b.put_i32(1);
    b.put_i32(1 << 20);
    b.put_i8(0);
    b.put_i32(max);
    out.push((ApiKey::Fetch, 4, b));
    // Metadata v1: topics.
    let mut b = BytesMut::new();
    b.put_i32(max);
    out.push((ApiKey::Metadata, 1, b));
    // JoinGroup v5: group, session and rebalance timeouts, member, instance, protocol type,
    // protocols.
    let mut b = BytesMut::new();
    put_str(&mut b, "g");
    b.put_i32(10_000);
    b.put_i32(10_000);
    put_str(&mut b, "");
    b.put_i16(-1);
    put_str(&mut b, "consumer");
    b.put_i32(max);
    out.push((ApiKey::JoinGroup, 5, b));
    // SyncGroup v3: group, generation, member, instance, assignments.
    let mut b = BytesMut::new();
    put_str(&mut b, "g");
    b.put_i32(1);
    put_str(&mut b, "m");
    b.put_i16(-1);
    b.put_i32(max);
    out.push((ApiKey::SyncGroup, 3, b));
    // OffsetCommit v2: group, generation, member, retention, topics.
    let mut b = BytesMut::new();
    put_str(&mut b, "g");
    b.put_i32(1);
    put_str(&mut b, "m");
    b.put_i64(-1);
    b.put_i32(max);
    out.push((ApiKey::OffsetCommit, 2, b));
    // DescribeGroups v0 (an array of strings) and CreateTopics v2.
    let mut b = BytesMut::new();
    b.put_i32(max);
    out.push((ApiKey::DescribeGroups, 0, b.clone()));
    out.push((ApiKey::CreateTopics, 2, b));
    // ConsumerGroupHeartbeat v0: group, member, epoch, instance, rack, rebalance timeout,
    // subscribed topic names.
    let mut b = BytesMut::new();
    b.put_slice(&[2, b'g', 1]);
    b.put_i32(0);
    b.put_slice(&[0, 0]);
    b.put_i32(10_000);
    b.put_slice(&compact_max);
    out.push((ApiKey::ConsumerGroupHeartbeat, 0, b));
    out
}

#[tokio::test]
async fn declared_lengths_past_the_frame_close_the_connection_and_reserve_nothing() {
    let f = Fixture::start(KafkaConfig {
        max_batch_decompressed_bytes: 1 << 20,
        ..KafkaConfig::default()
    })
    .await;
    let counters = || f.server.as_ref().unwrap().counters();
    let before = vm_peak_kb();
    let bodies = huge_array_bodies();
    for (key, version, body) in &bodies {
        let mut c = f.client().await;
        send_raw(&mut c, *key, *version, body).await;
        assert_closed(&mut c, &format!("{key:?} v{version}")).await;
        // The listener still answers on a new connection.
        let mut c = f.client().await;
        let r: ApiVersionsResponse = c
            .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
            .await;
        assert_eq!(r.error_code, 0, "after {key:?} v{version}");
    }
    assert_eq!(
        counters()
            .requests_malformed
            .load(std::sync::atomic::Ordering::Relaxed),
        bodies.len() as u64
    );

    // Inside a well-formed Produce: a batch declaring 2^31-1 records, and a gzip batch that
    // inflates past max_batch_decompressed_bytes. Both answered per partition; the
    // connection stays open.
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c
        .call(ApiKey::CreateTopics, 5, &create_req("Evil", 1))
        .await;
    let mut bomb = BytesMut::from(&batch(&[record(0, "k", "v")], Compression::None)[..]);
    bomb[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
    let zeros = "0".repeat(4 << 20);
    let inflating = batch(&[record(0, "k", &zeros)], Compression::Gzip);
    assert!(inflating.len() < 64 << 10);
    for (records, code) in [(bomb.freeze(), 2), (inflating, 18)] {
        let r: ProduceResponse = c
            .call(ApiKey::Produce, 9, &produce_req("Evil", 0, 1, records))
            .await;
        let p = &r.responses[0].partition_responses[0];
        assert_eq!(p.error_code, code, "{:?}", p.error_message);
        assert!(p
            .error_message
            .as_ref()
            .is_some_and(|m| m.contains("record batch rejected")));
    }
    // One malformed, one over the limit (counted as a limit hit).
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let c = counters();
    assert_eq!(
        (
            load(&c.batches_malformed),
            load(&c.limit_max_batch_decompressed_bytes)
        ),
        (1, 1)
    );

    // Without the checks, each frame above reserves 8 GiB to hundreds of GiB of address
    // space (or aborts the process where that fails); with them the peak barely moves (other
    // tests of this binary run in the same process, hence the generous bound).
    let grown_mib = vm_peak_kb().saturating_sub(before) / 1024;
    assert!(grown_mib < 4096, "VmPeak grew by {grown_mib} MiB");
}

/// Reads from `c` until the listener closes it; panics on an answer.
async fn assert_closed(c: &mut Client, what: &str) {
    let mut b = [0u8; 4];
    let n = tokio::time::timeout(Duration::from_secs(10), c.stream.read(&mut b))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "{what}: connection closed without an answer");
}

#[tokio::test]
async fn unsupported_apis_and_versions_are_answered_unsupported_version_or_closed_with_a_reason() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let counters = || f.server.as_ref().unwrap().counters();
    let mut c = f.client().await;
    // An API the listener does not implement: answered at the request's version with
    // UNSUPPORTED_VERSION and a message; the body is not read (here: none at all).
    send_raw(&mut c, ApiKey::DescribeAcls, 3, &[]).await;
    let r: DescribeAclsResponse = c.recv(ApiKey::DescribeAcls, 3, 7).await;
    assert_eq!(r.error_code, 35);
    let message = r.error_message.map(|m| m.to_string()).unwrap_or_default();
    assert!(
        message.contains("DescribeAcls (API key 29) is not supported"),
        "{message}"
    );
    // Implemented APIs at versions above what ApiVersions lists, on the same connection.
    send_raw(&mut c, ApiKey::ListGroups, 5, &[]).await;
    let r: ListGroupsResponse = c.recv(ApiKey::ListGroups, 5, 7).await;
    assert_eq!(r.error_code, 35);
    send_raw(&mut c, ApiKey::Metadata, 13, &[]).await;
    let r: MetadataResponse = c.recv(ApiKey::Metadata, 13, 7).await;
    assert_eq!(r.error_code, 35);
    assert!(r.topics.is_empty() && r.brokers.is_empty());
    // An old client without ApiVersions: EndTxn v0 (transactions are not implemented).
    send_raw(&mut c, ApiKey::EndTxn, 0, &[]).await;
    let r: EndTxnResponse = c.recv(ApiKey::EndTxn, 0, 7).await;
    assert_eq!(r.error_code, 35);
    // The connection still serves.
    let r: ApiVersionsResponse = c
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(r.error_code, 0);

    // Closed (the reason logged): a response with errors only per partition (an empty one
    // would read as success), a version the codec does not know, an unknown API key.
    let mut c = f.client().await;
    send_raw(&mut c, ApiKey::Produce, 12, &[]).await;
    assert_closed(&mut c, "Produce v12").await;
    let mut c = f.client().await;
    send_raw(&mut c, ApiKey::Heartbeat, 99, &[]).await;
    assert_closed(&mut c, "Heartbeat v99").await;
    let mut c = f.client().await;
    let mut frame = BytesMut::new();
    frame.put_i32(10);
    frame.put_i16(1000);
    frame.put_i16(0);
    frame.put_i32(7);
    frame.put_i16(-1);
    c.stream.write_all(&frame).await.unwrap();
    assert_closed(&mut c, "API key 1000").await;

    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(load(&counters().requests_unsupported), 7);
    assert_eq!(load(&counters().requests_refused), 3);
}
