//! The Kafka listener over TCP on 127.0.0.1 (a free port), driven with the `kafka-protocol`
//! crate's client-side codecs, on a real `MessageStore` in a temporary directory. The broker
//! side is the in-test `BrokerHandle` of `support/broker.rs` (topics in a map, arrivals from
//! the store's listener, a group coordinator of its own as the broker's `GroupState` owns one).

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder};
use shoal_kafka::KafkaConfig;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support;
use support::broker::{Client, Fixture};

/// Record `i` with `key`, `value` and header `h` = `hv{i}`.
fn record(i: i64, key: &str, value: &str) -> Record {
    let header = format!("hv{i}");
    support::records::record(
        i,
        Some(key.as_bytes()),
        Some(value.as_bytes()),
        &[("h", Some(header.as_bytes()))],
    )
}

fn batch(records: &[Record], compression: Compression) -> Bytes {
    support::records::batch(records, compression).freeze()
}

fn produce_req(topic: &str, partition: i32, acks: i16, records: Bytes) -> ProduceRequest {
    let mut p = produce_request::PartitionProduceData::default();
    p.index = partition;
    p.records = Some(records);
    let mut t = produce_request::TopicProduceData::default();
    t.name = TopicName(StrBytes::from_string(topic.into()));
    t.partition_data = vec![p];
    let mut r = ProduceRequest::default();
    r.acks = acks;
    r.timeout_ms = 5000;
    r.topic_data = vec![t];
    r
}

fn fetch_req(
    topic: &str,
    partition: i32,
    offset: i64,
    wait_ms: i32,
    min_bytes: i32,
) -> FetchRequest {
    let mut p = fetch_request::FetchPartition::default();
    p.partition = partition;
    p.fetch_offset = offset;
    p.partition_max_bytes = 1 << 20;
    let mut t = fetch_request::FetchTopic::default();
    t.topic = TopicName(StrBytes::from_string(topic.into()));
    t.partitions = vec![p];
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_wait_ms = wait_ms;
    r.min_bytes = min_bytes;
    r.max_bytes = 50 << 20;
    r.session_epoch = -1;
    r.topics = vec![t];
    r
}

fn create_req(topic: &str, partitions: i32) -> CreateTopicsRequest {
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(topic.into()));
    t.num_partitions = partitions;
    t.replication_factor = 1;
    let mut r = CreateTopicsRequest::default();
    r.topics = vec![t];
    r.timeout_ms = 5000;
    r
}

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

#[tokio::test]
async fn idempotent_batches_are_stored_once_and_gaps_refused() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T3", 1)).await;
    let init = init_producer(&mut c).await;
    let idem = |first: i32, n: i64| -> Bytes {
        let recs: Vec<Record> = (0..n)
            .map(|i| Record {
                producer_id: init.producer_id.0,
                producer_epoch: init.producer_epoch,
                sequence: first + i as i32,
                ..record(i, "k", "v")
            })
            .collect();
        batch(&recs, Compression::None)
    };
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

#[tokio::test]
async fn a_classic_group_forms_and_commits_offsets() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T4", 2)).await;
    let mut fc = FindCoordinatorRequest::default();
    fc.key = StrBytes::from_static_str("G");
    let r: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 3, &fc).await;
    assert_eq!(r.error_code, 0);
    assert_eq!(
        r.port as u16,
        f.server.as_ref().unwrap().local_addr().port()
    );
    let mut jr = JoinGroupRequest::default();
    jr.group_id = GroupId(StrBytes::from_static_str("G"));
    jr.session_timeout_ms = 10_000;
    jr.rebalance_timeout_ms = 10_000;
    jr.protocol_type = StrBytes::from_static_str("consumer");
    let mut proto = join_group_request::JoinGroupRequestProtocol::default();
    proto.name = StrBytes::from_static_str("range");
    proto.metadata = Bytes::from_static(b"meta");
    jr.protocols = vec![proto];
    let r: JoinGroupResponse = c.call(ApiKey::JoinGroup, 7, &jr).await;
    assert_eq!(r.error_code, 79, "MEMBER_ID_REQUIRED");
    jr.member_id = r.member_id.clone();
    let r: JoinGroupResponse = c.call(ApiKey::JoinGroup, 7, &jr).await;
    assert_eq!(r.error_code, 0);
    assert_eq!(r.generation_id, 1);
    assert_eq!(r.leader, jr.member_id);
    assert_eq!(r.members.len(), 1);
    let mut sr = SyncGroupRequest::default();
    sr.group_id = jr.group_id.clone();
    sr.generation_id = 1;
    sr.member_id = jr.member_id.clone();
    let mut a = sync_group_request::SyncGroupRequestAssignment::default();
    a.member_id = jr.member_id.clone();
    // A consumer-protocol assignment (version 3) of both partitions of T4.
    let mut tp = consumer_protocol_assignment::TopicPartition::default();
    tp.topic = TopicName(StrBytes::from_static_str("T4"));
    tp.partitions = vec![0, 1];
    let mut cpa = ConsumerProtocolAssignment::default();
    cpa.assigned_partitions = vec![tp];
    let mut both = BytesMut::new();
    both.put_i16(3);
    cpa.encode(&mut both, 3).unwrap();
    let both = both.freeze();
    a.assignment = both.clone();
    sr.assignments = vec![a];
    let r: SyncGroupResponse = c.call(ApiKey::SyncGroup, 4, &sr).await;
    assert_eq!((r.error_code, &r.assignment), (0, &both));
    // What `shoal group describe` shows (through the broker's GROUP_DESCRIBE).
    let describe = f.server.as_ref().unwrap().classic_group_describer();
    let d = describe("G").expect("the group is described");
    assert_eq!(
        (
            d.state,
            d.generation,
            d.protocol.as_deref(),
            d.leader.as_deref()
        ),
        ("Stable", 1, Some("range"), Some(jr.member_id.as_str()))
    );
    assert_eq!(d.members.len(), 1);
    assert!(d.members[0].leader);
    let owned: Vec<(String, i32)> = d.members[0]
        .owned
        .iter()
        .map(|q| (q.topic.clone(), q.queue_id))
        .collect();
    assert_eq!(owned, [("T4".to_string(), 0), ("T4".to_string(), 1)]);
    assert!(describe("unknown").is_none());
    let mut hb = HeartbeatRequest::default();
    hb.group_id = jr.group_id.clone();
    hb.generation_id = 1;
    hb.member_id = jr.member_id.clone();
    let r: HeartbeatResponse = c.call(ApiKey::Heartbeat, 4, &hb).await;
    assert_eq!(r.error_code, 0);
    // Commit fenced by generation.
    let mut oc = OffsetCommitRequest::default();
    oc.group_id = jr.group_id.clone();
    oc.generation_id_or_member_epoch = 1;
    oc.member_id = jr.member_id.clone();
    let mut op = offset_commit_request::OffsetCommitRequestPartition::default();
    op.partition_index = 1;
    op.committed_offset = 42;
    let mut ot = offset_commit_request::OffsetCommitRequestTopic::default();
    ot.name = TopicName(StrBytes::from_static_str("T4"));
    ot.partitions = vec![op];
    oc.topics = vec![ot];
    let r: OffsetCommitResponse = c.call(ApiKey::OffsetCommit, 8, &oc).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    oc.generation_id_or_member_epoch = 7;
    let r: OffsetCommitResponse = c.call(ApiKey::OffsetCommit, 8, &oc).await;
    assert_eq!(
        r.topics[0].partitions[0].error_code, 22,
        "ILLEGAL_GENERATION"
    );
    assert_eq!(f.broker.store.query_offset("G", "T4", 1), Some(42));
    assert_eq!(f.broker.groups.lock().as_slice(), ["G".to_string()]);
    let mut of = OffsetFetchRequest::default();
    of.group_id = jr.group_id.clone();
    of.topics = None;
    let r: OffsetFetchResponse = c.call(ApiKey::OffsetFetch, 7, &of).await;
    assert_eq!(r.topics[0].partitions[0].committed_offset, 42);
    // Leave: the group is empty and can be deleted.
    let mut lg = LeaveGroupRequest::default();
    lg.group_id = jr.group_id.clone();
    let mut m = leave_group_request::MemberIdentity::default();
    m.member_id = jr.member_id.clone();
    lg.members = vec![m];
    let r: LeaveGroupResponse = c.call(ApiKey::LeaveGroup, 4, &lg).await;
    assert_eq!(r.members[0].error_code, 0);
    let mut dg = DeleteGroupsRequest::default();
    dg.groups_names = vec![jr.group_id.clone()];
    let r: DeleteGroupsResponse = c.call(ApiKey::DeleteGroups, 2, &dg).await;
    assert_eq!(r.results[0].error_code, 0);
    assert_eq!(f.broker.store.query_offset("G", "T4", 1), None);
}

fn cg_heartbeat(
    member: &str,
    epoch: i32,
    subscribe: Option<&str>,
    owned: Option<Vec<i32>>,
) -> ConsumerGroupHeartbeatRequest {
    let mut r = ConsumerGroupHeartbeatRequest::default();
    r.group_id = GroupId(StrBytes::from_static_str("KG"));
    r.member_id = StrBytes::from_string(member.into());
    r.member_epoch = epoch;
    r.rebalance_timeout_ms = 30_000;
    r.subscribed_topic_names = subscribe.map(|t| vec![TopicName(StrBytes::from_string(t.into()))]);
    r.topic_partitions = owned.map(|ps| {
        let mut tp = consumer_group_heartbeat_request::TopicPartitions::default();
        tp.topic_id = shoal_kafka::topic_id("T5");
        tp.partitions = ps;
        vec![tp]
    });
    r
}

fn partitions(r: &ConsumerGroupHeartbeatResponse) -> Option<Vec<i32>> {
    r.assignment.as_ref().map(|a| {
        let mut ps: Vec<i32> = a
            .topic_partitions
            .iter()
            .flat_map(|t| t.partitions.clone())
            .collect();
        ps.sort_unstable();
        ps
    })
}

#[tokio::test]
async fn consumer_protocol_members_live_in_the_brokers_coordinator() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T5", 4)).await;
    // A joins and gets every partition.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-a", 0, Some("T5"), Some(vec![])),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let epoch_a = r.member_epoch;
    assert_eq!(partitions(&r), Some(vec![0, 1, 2, 3]));
    // The member is in the broker's coordinator, not in one of the listener's own.
    {
        let coord = f.broker.coordinator.lock();
        assert!(coord.has_member("KG", "member-a"));
        let d = coord.describe("KG", 0).unwrap();
        assert_eq!(d.members.len(), 1);
        assert_eq!(d.members[0].client_id, "test");
    }
    // B joins: nothing for it until A gives up what moves to B.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-b", 0, Some("T5"), Some(vec![])),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(partitions(&r), Some(vec![]));
    let epoch_b = r.member_epoch;
    // A heartbeats (what it owns left out: unchanged) and is told to keep two.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-a", epoch_a, None, None),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let kept = partitions(&r).expect("a new assignment for A");
    assert_eq!(kept.len(), 2);
    // A reports it released the others; then B gets them.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-a", r.member_epoch, None, Some(kept.clone())),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-b", epoch_b, None, None),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let got = partitions(&r).expect("an assignment for B");
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|p| !kept.contains(p)));
    f.broker.coordinator.lock().check_invariants().unwrap();
    // ConsumerGroupDescribe answers from the same coordinator.
    let mut d = ConsumerGroupDescribeRequest::default();
    d.group_ids = vec![GroupId(StrBytes::from_static_str("KG"))];
    let r: ConsumerGroupDescribeResponse = c.call(ApiKey::ConsumerGroupDescribe, 0, &d).await;
    assert_eq!(r.groups[0].error_code, 0);
    assert_eq!(r.groups[0].members.len(), 2);
    // A leaves; the coordinator forgets it.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-a", -1, None, None),
        )
        .await;
    assert_eq!(r.error_code, 0);
    assert!(!f.broker.coordinator.lock().has_member("KG", "member-a"));
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
    assert_eq!(
        counters()
            .batches_malformed
            .load(std::sync::atomic::Ordering::Relaxed),
        2
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
