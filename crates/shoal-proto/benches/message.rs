//! Criterion benchmarks of the stored message format: decoding a pull body of 32 messages of
//! 1 KiB (full decode and the light header view) and encoding one record.
//!
//! Run briefly: `cargo bench -p shoal-proto --bench message -- --warm-up-time 1 --measurement-time 3`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs,
    reason = "benchmark code (criterion's macros add undocumented functions); a failed unwrap ends the run"
)]

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shoal_proto::message::{
    decode_records, encode_record, iter_records, property, DecodeOptions, MessageExt, Properties,
    RecordFields,
};

fn sample_message(i: i64) -> MessageExt {
    let mut properties = Properties::default();
    properties.insert(property::TAGS.into(), "tagA".into());
    properties.insert(property::KEYS.into(), format!("order-{i}"));
    properties.insert(
        property::UNIQ_KEY.into(),
        format!("C0A800020F8A18B4AAC27E0E0E4C{:04X}", i & 0xffff),
    );
    properties.insert(property::WAIT.into(), "true".into());
    MessageExt {
        store_size: 0,
        body_crc: 0,
        queue_id: 3,
        flag: 0,
        queue_offset: 1000 + i,
        commit_log_offset: 1_048_576 + i * 1200,
        sys_flag: 0,
        born_timestamp: 1_700_000_000_000 + i,
        born_host: "192.168.0.2:53000".parse().expect("literal address"),
        store_timestamp: 1_700_000_000_005 + i,
        store_host: "192.168.0.1:10911".parse().expect("literal address"),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: Bytes::from(vec![b'x'; 1024]),
        topic: "BenchTopic".into(),
        properties,
    }
}

fn pull_body() -> Bytes {
    let mut buf = BytesMut::new();
    for i in 0..32 {
        sample_message(i).encode(&mut buf).expect("valid message");
    }
    buf.freeze()
}

fn bench_decode(c: &mut Criterion) {
    let body = pull_body();
    let mut g = c.benchmark_group("pull_body_32x1KiB");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("decode_full", |b| {
        b.iter(|| {
            let run = decode_records(black_box(&body), &DecodeOptions::default());
            assert_eq!(run.messages.len(), 32);
            run
        })
    });
    g.bench_function("decode_full_crc", |b| {
        b.iter(|| {
            let run = decode_records(black_box(&body), &DecodeOptions::client());
            assert_eq!(run.messages.len(), 32);
            run
        })
    });
    g.bench_function("header_view", |b| {
        b.iter(|| {
            let mut n = 0i64;
            for view in iter_records(black_box(&body)) {
                let view = view.expect("valid record");
                n += view.queue_offset() + view.physical_offset() + view.tags_code();
                n += view.topic().len() as i64 + view.properties_range().len() as i64;
            }
            n
        })
    });
    g.finish();
}

fn bench_encode(c: &mut Criterion) {
    let msg = sample_message(7);
    let props = msg.properties_string().expect("valid properties");
    let mut g = c.benchmark_group("encode_1KiB");
    let mut buf = BytesMut::with_capacity(4096);
    g.bench_function("message_ext_encode", |b| {
        b.iter(|| {
            buf.clear();
            black_box(&msg).encode(&mut buf).expect("valid message")
        })
    });
    g.bench_function("fields_encode_and_patch", |b| {
        b.iter(|| {
            buf.clear();
            let fields: RecordFields<'_> = msg.fields(&props);
            let layout = encode_record(black_box(&fields), &mut buf).expect("valid message");
            layout
                .patch(&mut buf, 42, 1 << 30, 1_700_000_000_000)
                .expect("in range");
            layout
        })
    });
    g.finish();
}

criterion_group!(benches, bench_decode, bench_encode);
criterion_main!(benches);
