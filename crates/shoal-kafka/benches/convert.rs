//! The cost of one storage format: Kafka records -> stored RocketMQ messages (produce) and
//! stored messages -> a record batch (fetch), per record, beside the Kafka codec alone.
//! `cargo bench -p shoal-kafka --bench convert`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "benchmark code (criterion's macros add undocumented functions); a failed unwrap ends the run"
)]

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kafka_protocol::records::{Compression, Record, RecordBatchDecoder};
use shoal_kafka::convert::{message_to_record, record_to_message, stored_to_batch};
use shoal_proto::message::record::{decode_records, encode_record, DecodeOptions, RecordFields};

const N: usize = 100;

#[path = "../tests/support/records.rs"]
mod support;

/// `N` records of `size`-byte values, key `key-{i}`, one header.
fn records(size: usize) -> Vec<Record> {
    let value = vec![b'x'; size];
    (0..N as i64)
        .map(|i| {
            let key = format!("key-{i}");
            support::record(
                i,
                Some(key.as_bytes()),
                Some(&value),
                &[("trace", Some(b"abc123"))],
            )
        })
        .collect()
}

fn batch(recs: &[Record]) -> Bytes {
    support::batch(recs, Compression::None).freeze()
}

/// Encodes `m` as the store holds a message at `queue_offset`, stored at `store_timestamp`.
fn encode_stored(
    m: &shoal_store::MessageExtBrokerInner,
    queue_offset: i64,
    store_timestamp: i64,
    host: std::net::SocketAddr,
    out: &mut Vec<u8>,
) {
    encode_record(
        &RecordFields {
            topic: &m.topic,
            queue_id: 0,
            flag: 0,
            queue_offset,
            physical_offset: 0,
            sys_flag: 0,
            born_timestamp: m.born_timestamp,
            born_host: host,
            store_timestamp,
            store_host: host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: &m.body,
            properties: &m.properties,
        },
        out,
    )
    .unwrap();
}

/// Stored records as the store would hold them (queue offsets 0..N).
fn stored(recs: &[Record]) -> Bytes {
    let host = "127.0.0.1:9".parse().unwrap();
    let mut out: Vec<u8> = Vec::new();
    for (i, r) in recs.iter().enumerate() {
        let m = record_to_message(r, &support::headers_of(r), "T", 0, host, "c").unwrap();
        encode_stored(&m, i as i64, m.born_timestamp, host, &mut out);
    }
    Bytes::from(out)
}

fn bench(c: &mut Criterion) {
    let host = "127.0.0.1:9".parse().unwrap();
    for size in [128usize, 1024] {
        let recs = records(size);
        let kbatch = batch(&recs);
        let st = stored(&recs);
        let mut g = c.benchmark_group(format!("convert_{size}B"));
        g.throughput(Throughput::Elements(N as u64));
        g.bench_function("kafka_decode_only", |b| {
            b.iter_batched(
                || kbatch.clone(),
                |mut x| RecordBatchDecoder::decode_all(&mut x).unwrap(),
                BatchSize::SmallInput,
            )
        });
        g.bench_function("produce_decode_convert_encode", |b| {
            b.iter_batched(
                || kbatch.clone(),
                |mut x| {
                    let sets = RecordBatchDecoder::decode_all(&mut x).unwrap();
                    let mut out: Vec<u8> = Vec::with_capacity(N * (size + 200));
                    for r in &sets[0].records {
                        let m = record_to_message(r, &support::headers_of(r), "T", 0, host, "c")
                            .unwrap();
                        encode_stored(&m, 0, 0, host, &mut out);
                    }
                    out
                },
                BatchSize::SmallInput,
            )
        });
        g.bench_function("kafka_encode_only", |b| b.iter(|| batch(&recs)));
        g.bench_function("fetch_stored_to_batch", |b| {
            b.iter(|| stored_to_batch(&st, 1 << 24, &Default::default()).unwrap())
        });
        g.bench_function("fetch_decode_stored_only", |b| {
            b.iter(|| decode_records(&st, &DecodeOptions::default()))
        });
        g.bench_function("fetch_message_to_record_only", |b| {
            let msgs = decode_records(&st, &DecodeOptions::default()).messages;
            b.iter(|| msgs.iter().map(message_to_record).count())
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
