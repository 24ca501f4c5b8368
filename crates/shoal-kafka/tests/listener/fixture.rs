//! The listener tests' fixture: the shared in-test broker, listener and client of
//! `support/broker.rs`, and request builders.

pub(crate) use crate::support::broker::{Client, Fixture};
use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record};

/// Record `i` with `key`, `value` and header `h` = `hv{i}`.
pub(crate) fn record(i: i64, key: &str, value: &str) -> Record {
    let header = format!("hv{i}");
    crate::support::records::record(
        i,
        Some(key.as_bytes()),
        Some(value.as_bytes()),
        &[("h", Some(header.as_bytes()))],
    )
}

pub(crate) fn batch(records: &[Record], compression: Compression) -> Bytes {
    crate::support::records::batch(records, compression).freeze()
}

pub(crate) fn produce_req(
    topic: &str,
    partition: i32,
    acks: i16,
    records: Bytes,
) -> ProduceRequest {
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

pub(crate) fn fetch_req(
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

pub(crate) fn create_req(topic: &str, partitions: i32) -> CreateTopicsRequest {
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(topic.into()));
    t.num_partitions = partitions;
    t.replication_factor = 1;
    let mut r = CreateTopicsRequest::default();
    r.topics = vec![t];
    r.timeout_ms = 5000;
    r
}
