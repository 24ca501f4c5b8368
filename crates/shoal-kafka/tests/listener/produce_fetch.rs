//! Produce and Fetch: round trips, long polling, idempotent producers, many partitions.

use crate::fixture::*;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder};
use shoal_kafka::KafkaConfig;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn api_versions_lists_what_is_implemented_and_answers_unknown_versions_with_v0() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let r: ApiVersionsResponse = c
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(r.error_code, 0);
    let produce = r
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::Produce as i16)
        .unwrap();
    assert_eq!((produce.min_version, produce.max_version), (3, 11));
    assert!(r
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::JoinGroup as i16));
    assert_eq!(r.api_keys.len(), shoal_kafka::supported_apis().len());
    // A version from the future: v0 answer with UNSUPPORTED_VERSION and the list (KIP-511).
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    buf.put_i16(ApiKey::ApiVersions as i16);
    buf.put_i16(99);
    buf.put_i32(7);
    buf.put_i16(-1);
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    c.stream.write_all(&buf).await.unwrap();
    let r: ApiVersionsResponse = c.recv(ApiKey::ApiVersions, 0, 7).await;
    assert_eq!(r.error_code, 35);
    assert!(!r.api_keys.is_empty());
}

#[tokio::test]
async fn produce_then_fetch_round_trips_compressed_records() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let r: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T1", 3)).await;
    assert_eq!(r.topics[0].error_code, 0);
    let recs: Vec<Record> = (0..3)
        .map(|i| record(i, &format!("k{i}"), &format!("v{i}")))
        .collect();
    for (n, comp) in [
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ]
    .into_iter()
    .enumerate()
    {
        let r: ProduceResponse = c
            .call(
                ApiKey::Produce,
                9,
                &produce_req("T1", 1, 1, batch(&recs, comp)),
            )
            .await;
        let p = &r.responses[0].partition_responses[0];
        assert_eq!(p.error_code, 0, "{comp:?}");
        assert_eq!(p.base_offset, 3 * n as i64);
    }
    let r: FetchResponse = c
        .call(ApiKey::Fetch, 12, &fetch_req("T1", 1, 0, 0, 1))
        .await;
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    assert_eq!(p.high_watermark, 12);
    let mut bytes = p.records.clone().unwrap();
    let sets = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
    let got: Vec<&Record> = sets.iter().flat_map(|s| s.records.iter()).collect();
    assert_eq!(got.len(), 12);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.offset, i as i64);
        let j = i % 3;
        assert_eq!(r.key.as_deref(), Some(format!("k{j}").as_bytes()));
        assert_eq!(r.value.as_deref(), Some(format!("v{j}").as_bytes()));
        assert_eq!(r.timestamp, 1_700_000_000_000 + j as i64);
        assert_eq!(
            r.headers
                .get(&StrBytes::from_static_str("h"))
                .cloned()
                .flatten(),
            Some(Bytes::from(format!("hv{j}")))
        );
    }
    // The messages are RocketMQ messages of queue 1: keys are indexed.
    assert_eq!(f.broker.store.max_offset("T1", 1), 12);
    assert_eq!(
        f.broker
            .store
            .query_by_key("T1", "k1", 10, 0, i64::MAX)
            .unwrap()
            .len(),
        4
    );
    // ListOffsets: earliest and latest.
    let mut lp = list_offsets_request::ListOffsetsPartition::default();
    lp.partition_index = 1;
    lp.timestamp = -1;
    let mut lt = list_offsets_request::ListOffsetsTopic::default();
    lt.name = TopicName(StrBytes::from_static_str("T1"));
    lt.partitions = vec![lp.clone(), {
        let mut e = lp.clone();
        e.timestamp = -2;
        e
    }];
    let mut lr = ListOffsetsRequest::default();
    lr.replica_id = BrokerId(-1);
    lr.topics = vec![lt];
    let r: ListOffsetsResponse = c.call(ApiKey::ListOffsets, 7, &lr).await;
    let offs: Vec<i64> = r.topics[0].partitions.iter().map(|p| p.offset).collect();
    assert_eq!(offs, vec![12, 0]);
    // Out of range and unknown topics get their error codes.
    let r: FetchResponse = c
        .call(ApiKey::Fetch, 12, &fetch_req("T1", 1, 99, 0, 1))
        .await;
    assert_eq!(
        r.responses[0].partitions[0].error_code, 1,
        "OFFSET_OUT_OF_RANGE"
    );
    let r: ProduceResponse = c
        .call(
            ApiKey::Produce,
            9,
            &produce_req("Nope", 0, 1, batch(&recs, Compression::None)),
        )
        .await;
    assert_eq!(
        r.responses[0].partition_responses[0].error_code, 3,
        "UNKNOWN_TOPIC_OR_PARTITION"
    );
}

/// Large and small sets take different paths (a large plain set and a fetch of many waiting
/// messages are worked on the blocking pool, small ones on the connection's task): both store
/// and read back the same records.
#[tokio::test]
async fn large_and_small_produces_and_fetches_agree() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("L1", 1)).await;
    let value = "v".repeat(300);
    // 300 records of about 320 bytes (past 64 KiB), then 20 (a few KiB).
    for (first, n) in [(0i64, 300i64), (300, 20)] {
        let recs: Vec<Record> = (first..first + n)
            .map(|i| record(i, &format!("k{i}"), &value))
            .collect();
        let r: ProduceResponse = c
            .call(
                ApiKey::Produce,
                9,
                &produce_req("L1", 0, 1, batch(&recs, Compression::None)),
            )
            .await;
        let p = &r.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (0, first));
    }
    // From 0: 320 messages wait (a read on the blocking pool); from 250: 70 (on the task).
    for from in [0i64, 250] {
        let r: FetchResponse = c
            .call(ApiKey::Fetch, 12, &fetch_req("L1", 0, from, 0, 1))
            .await;
        let p = &r.responses[0].partitions[0];
        assert_eq!((p.error_code, p.high_watermark), (0, 320));
        let mut bytes = p.records.clone().unwrap();
        let sets = RecordBatchDecoder::decode_all(&mut bytes).unwrap();
        let got: Vec<&Record> = sets.iter().flat_map(|s| s.records.iter()).collect();
        assert_eq!(got.len() as i64, 320 - from, "from {from}");
        for (r, i) in got.iter().zip(from..) {
            assert_eq!(r.offset, i);
            assert_eq!(r.key.as_deref(), Some(format!("k{i}").as_bytes()));
            assert_eq!(r.value.as_deref(), Some(value.as_bytes()));
        }
    }
}

#[tokio::test]
async fn a_fetch_waits_for_data_and_acks_zero_gets_no_answer() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T2", 1)).await;
    let mut waiter = f.client().await;
    let id = waiter
        .send(ApiKey::Fetch, 12, &fetch_req("T2", 0, 0, 20_000, 1))
        .await;
    let fetch = tokio::spawn(async move {
        let r: FetchResponse = waiter.recv(ApiKey::Fetch, 12, id).await;
        r
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !fetch.is_finished(),
        "the fetch is held while the partition is empty"
    );
    // acks=0: no response; the next request on the connection is answered in order.
    c.send(
        ApiKey::Produce,
        9,
        &produce_req("T2", 0, 0, batch(&[record(0, "k", "v")], Compression::None)),
    )
    .await;
    let r: ApiVersionsResponse = c
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(r.error_code, 0);
    let r = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .expect("woken by the produce")
        .unwrap();
    let mut bytes = r.responses[0].partitions[0].records.clone().unwrap();
    assert_eq!(
        RecordBatchDecoder::decode_all(&mut bytes).unwrap()[0]
            .records
            .len(),
        1
    );
}

/// A new idempotent producer id (InitProducerId without a transactional id).
async fn init_producer(c: &mut Client) -> InitProducerIdResponse {
    let init: InitProducerIdResponse = c
        .call(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
                .with_transaction_timeout_ms(60000),
        )
        .await;
    assert_eq!(init.error_code, 0);
    init
}

/// `n` records of the producer `init` named, sequences from `first`.
fn idempotent_batch(init: &InitProducerIdResponse, first: i32, n: i64) -> Bytes {
    let recs: Vec<Record> = (0..n)
        .map(|i| Record {
            producer_id: init.producer_id.0,
            producer_epoch: init.producer_epoch,
            sequence: first + i as i32,
            ..record(i, "k", "v")
        })
        .collect();
    batch(&recs, Compression::None)
}

#[tokio::test]
async fn idempotent_batches_are_stored_once_and_gaps_refused() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T3", 1)).await;
    let init = init_producer(&mut c).await;
    let idem = |first: i32, n: i64| idempotent_batch(&init, first, n);
    let r: ProduceResponse = c
        .call(ApiKey::Produce, 9, &produce_req("T3", 0, -1, idem(0, 3)))
        .await;
    assert_eq!(r.responses[0].partition_responses[0].base_offset, 0);
    let r: ProduceResponse = c
        .call(ApiKey::Produce, 9, &produce_req("T3", 0, -1, idem(3, 2)))
        .await;
    assert_eq!(r.responses[0].partition_responses[0].base_offset, 3);
    // A retry of the first batch: same offset, not stored again.
    let r: ProduceResponse = c
        .call(ApiKey::Produce, 9, &produce_req("T3", 0, -1, idem(0, 3)))
        .await;
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    assert_eq!(r.responses[0].partition_responses[0].base_offset, 0);
    assert_eq!(f.broker.store.max_offset("T3", 0), 5);
    // A gap.
    let r: ProduceResponse = c
        .call(ApiKey::Produce, 9, &produce_req("T3", 0, -1, idem(9, 1)))
        .await;
    assert_eq!(
        r.responses[0].partition_responses[0].error_code, 45,
        "OUT_OF_ORDER_SEQUENCE_NUMBER"
    );
    assert_eq!(
        f.server
            .as_ref()
            .unwrap()
            .counters()
            .duplicate_batches
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// A new listener over the same log (a restart; a new master after a failover is the same
/// case) knows no producer: the batch the old one stored, sent again, is answered with its
/// offset and not stored twice (the producer's batches are read back from the log), and the
/// producer goes on from its next sequence.
#[tokio::test]
async fn an_idempotent_batch_sent_again_to_a_new_leader_is_not_stored_twice() {
    let mut f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T7", 1)).await;
    let init = init_producer(&mut c).await;
    let idem = |first: i32, n: i64| idempotent_batch(&init, first, n);
    // Another producer's records between them: the scan picks this producer's out.
    for (first, n) in [(0, 3), (3, 2), (5, 4)] {
        let r: ProduceResponse = c
            .call(
                ApiKey::Produce,
                9,
                &produce_req("T7", 0, -1, idem(first, n)),
            )
            .await;
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
        let r: ProduceResponse = c
            .call(
                ApiKey::Produce,
                9,
                &produce_req(
                    "T7",
                    0,
                    -1,
                    batch(&[record(0, "o", "x")], Compression::None),
                ),
            )
            .await;
        assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
    }
    assert_eq!(f.broker.store.max_offset("T7", 0), 12);
    f.restart_listener(KafkaConfig::default()).await;
    let mut c = f.client().await;
    // The last two batches again (a retry after the leader changed): answered, not stored.
    for (first, n, at) in [(3, 2, 4), (5, 4, 7)] {
        let r: ProduceResponse = c
            .call(
                ApiKey::Produce,
                9,
                &produce_req("T7", 0, -1, idem(first, n)),
            )
            .await;
        let p = &r.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (0, at), "batch {first}");
    }
    assert_eq!(f.broker.store.max_offset("T7", 0), 12);
    let r: ProduceResponse = c
        .call(ApiKey::Produce, 9, &produce_req("T7", 0, -1, idem(9, 1)))
        .await;
    let p = &r.responses[0].partition_responses[0];
    assert_eq!((p.error_code, p.base_offset), (0, 12));
    // What the old listener wrote reads back without the bookkeeping property.
    let r: FetchResponse = c
        .call(ApiKey::Fetch, 12, &fetch_req("T7", 0, 0, 0, 1))
        .await;
    let mut bytes = r.responses[0].partitions[0].records.clone().unwrap();
    for b in kafka_protocol::records::RecordBatchDecoder::decode_all(&mut bytes).unwrap() {
        for rec in b.records {
            assert!(
                rec.headers.keys().all(|k| !k.contains("PRODUCER")),
                "{:?}",
                rec.headers
            );
        }
    }
}

/// The same idempotent batch sent at once on eight connections (a retry storm after
/// reconnects): it is stored once; every answer is its offset or the retriable
/// REQUEST_TIMED_OUT of a request that found another one writing the partition, and retrying
/// those answers the same offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_idempotent_batch_sent_on_many_connections_at_once_is_stored_once() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T5", 1)).await;
    let init = init_producer(&mut c).await;
    let recs: Vec<Record> = (0..3)
        .map(|i| Record {
            producer_id: init.producer_id.0,
            producer_epoch: init.producer_epoch,
            sequence: i as i32,
            ..record(i, "k", "v")
        })
        .collect();
    let req = produce_req("T5", 0, -1, batch(&recs, Compression::None));
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(f.client().await);
    }
    let mut ids = Vec::new();
    for c in &mut clients {
        ids.push(c.send(ApiKey::Produce, 9, &req).await);
    }
    let mut retry = Vec::new();
    for (c, id) in clients.iter_mut().zip(ids) {
        let r: ProduceResponse = c.recv(ApiKey::Produce, 9, id).await;
        let p = &r.responses[0].partition_responses[0];
        match p.error_code {
            0 => assert_eq!(p.base_offset, 0),
            7 => {
                let m = p.error_message.as_ref().expect("a message at v9");
                assert!(m.contains("still writing T5-0"), "{m}");
                retry.push(c);
            }
            e => panic!("unexpected error code {e}"),
        }
    }
    let counters = f.server.as_ref().unwrap().counters();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        load(&counters.duplicate_batches) + load(&counters.concurrent_writes_refused),
        7,
        "one request appended, the other seven were duplicates or turned away"
    );
    assert_eq!(
        load(&counters.concurrent_writes_refused),
        retry.len() as u64
    );
    for c in retry {
        let r: ProduceResponse = c.call(ApiKey::Produce, 9, &req).await;
        let p = &r.responses[0].partition_responses[0];
        assert_eq!(
            (p.error_code, p.base_offset),
            (0, 0),
            "a retry is a duplicate"
        );
    }
    assert_eq!(f.broker.store.max_offset("T5", 0), 3, "stored once");
}

/// A partition's answer: index, error code, base offset.
type Answer = (i32, i16, i64);

/// One request for several topics and partitions: every partition is answered in the
/// request's order, a bad partition only fails itself, and each stored its own records.
#[tokio::test]
async fn a_request_for_many_partitions_answers_each_in_order() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("M1", 3)).await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("M2", 2)).await;
    let recs = |n: i64| -> Bytes {
        let r: Vec<Record> = (0..n).map(|i| record(i, "k", "v")).collect();
        batch(&r, Compression::None)
    };
    let part = |index: i32, n: i64| {
        let mut p = produce_request::PartitionProduceData::default();
        p.index = index;
        p.records = Some(recs(n));
        p
    };
    let mut t1 = produce_request::TopicProduceData::default();
    t1.name = TopicName(StrBytes::from_static_str("M1"));
    t1.partition_data = vec![part(2, 1), part(0, 2), part(7, 1), part(1, 3)];
    let mut t2 = produce_request::TopicProduceData::default();
    t2.name = TopicName(StrBytes::from_static_str("M2"));
    t2.partition_data = vec![part(1, 4)];
    let mut req = ProduceRequest::default();
    req.acks = -1;
    req.timeout_ms = 5000;
    req.topic_data = vec![t1, t2];
    for round in 0..2i64 {
        let r: ProduceResponse = c.call(ApiKey::Produce, 9, &req).await;
        let got: Vec<(String, Vec<Answer>)> = r
            .responses
            .iter()
            .map(|t| {
                (
                    t.name.0.to_string(),
                    t.partition_responses
                        .iter()
                        .map(|p| (p.index, p.error_code, p.base_offset))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "M1".to_string(),
                    vec![
                        (2, 0, round),
                        (0, 0, 2 * round),
                        (7, 3, -1), // UNKNOWN_TOPIC_OR_PARTITION
                        (1, 0, 3 * round)
                    ]
                ),
                ("M2".to_string(), vec![(1, 0, 4 * round)]),
            ],
            "round {round}"
        );
    }
    let store = &f.broker.store;
    assert_eq!(
        [
            store.max_offset("M1", 0),
            store.max_offset("M1", 1),
            store.max_offset("M1", 2),
            store.max_offset("M2", 0),
            store.max_offset("M2", 1)
        ],
        [4, 6, 2, 0, 8]
    );
}

/// A fetch never returns a record at or past the high watermark (and last stable offset) it
/// reports, however the partition grows while it is read: librdkafka drops records past the
/// last stable offset and moves on, so such a record would be lost to the consumer. Producers
/// append on other connections while one consumer reads the partition from start to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_returns_no_record_past_the_high_watermark_it_reports() {
    const TOTAL: i64 = 3_000;
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("HW", 1)).await;
    let mut producers = Vec::new();
    for p in 0..2 {
        let mut pc = f.client().await;
        producers.push(tokio::spawn(async move {
            for i in 0..TOTAL / 2 {
                let recs = [record(i, &format!("p{p}-{i}"), "v")];
                let r: ProduceResponse = pc
                    .call(
                        ApiKey::Produce,
                        9,
                        &produce_req("HW", 0, 1, batch(&recs, Compression::None)),
                    )
                    .await;
                assert_eq!(r.responses[0].partition_responses[0].error_code, 0);
            }
        }));
    }
    let mut next = 0i64;
    let mut fetches = 0u32;
    while next < TOTAL {
        let r: FetchResponse = c
            .call(ApiKey::Fetch, 12, &fetch_req("HW", 0, next, 500, 1))
            .await;
        let p = &r.responses[0].partitions[0];
        assert_eq!(p.error_code, 0);
        assert_eq!(p.last_stable_offset, p.high_watermark);
        let mut bytes = p.records.clone().unwrap_or_default();
        if bytes.is_empty() {
            continue;
        }
        fetches += 1;
        for set in RecordBatchDecoder::decode_all(&mut bytes).unwrap() {
            for rec in &set.records {
                assert_eq!(rec.offset, next, "records follow one another");
                assert!(
                    rec.offset < p.high_watermark,
                    "record {} returned with high watermark {}",
                    rec.offset,
                    p.high_watermark
                );
                next += 1;
            }
        }
    }
    for p in producers {
        p.await.unwrap();
    }
    assert!(fetches > 1, "the consumer read while the producers wrote");
}

/// CreateTopics takes a replication factor up to the broker group's replica count (1 for this
/// broker, which does not replicate) or -1, and refuses a larger one with
/// INVALID_REPLICATION_FACTOR.
#[tokio::test]
async fn create_topics_takes_a_replication_factor_up_to_the_groups_replicas() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    for (topic, rf, code) in [("RfDefault", -1, 0), ("RfOne", 1, 0), ("RfThree", 3, 38)] {
        let mut req = create_req(topic, 2);
        req.topics[0].replication_factor = rf;
        let r: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &req).await;
        let t = &r.topics[0];
        assert_eq!(t.error_code, code, "rf {rf}: {:?}", t.error_message);
        if code == 0 {
            assert_eq!(t.replication_factor, 1, "rf {rf}: the copies it keeps");
        } else {
            let m = t.error_message.as_ref().unwrap().to_string();
            assert!(m.contains("keeps 1 copy"), "{m}");
        }
    }
}
