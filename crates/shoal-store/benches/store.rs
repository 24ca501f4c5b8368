//! Store benchmarks on the real file system: append throughput (async / sync flush, single /
//! batched / concurrent writers) and a 32-message pull.
//!
//! Run: `cargo bench -p shoal-store --bench store -- --warm-up-time 1 --measurement-time 3`
//!
//! `SHOAL_BENCH_MMAP=1` appends through a memory map instead of one `pwrite` per append
//! (`StoreConfig::mmap_commit_log`: appends under a page through the map, larger ones still
//! with `pwrite`), to compare the two in one session.
#![allow(
    missing_docs,
    reason = "benchmark code (criterion's macros add undocumented functions); a failed unwrap ends the run"
)]

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use shoal_store::{FlushMode, MessageExtBrokerInner, MessageStore, StoreConfig};

fn message(topic: &str, queue_id: i32, body_size: usize, n: u64) -> MessageExtBrokerInner {
    let born: SocketAddr = SocketAddr::from(([192, 168, 0, 2], 53000));
    MessageExtBrokerInner {
        topic: topic.to_string(),
        queue_id,
        flag: 0,
        sys_flag: 0,
        born_timestamp: 1_700_000_000_000,
        born_host: born,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: Bytes::from(vec![b'x'; body_size]),
        properties: format!(
            "TAGS\u{1}tagA\u{2}UNIQ_KEY\u{1}C0A800020F8A18B4AAC27E0E{n:08X}\u{2}WAIT\u{1}true\u{2}"
        ),
        known: None,
    }
}

fn open(dir: &std::path::Path, mode: FlushMode) -> MessageStore {
    let mut cfg = StoreConfig::new(dir);
    cfg.flush_mode = mode;
    cfg.commit_log_segment_size = 256 << 20;
    cfg.mmap_commit_log =
        cfg!(target_os = "linux") && std::env::var("SHOAL_BENCH_MMAP").is_ok_and(|v| v == "1");
    match MessageStore::open(cfg) {
        Ok((s, _)) => s,
        Err(e) => panic!("open store: {e}"),
    }
}

fn tempdir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    }
}

fn put(store: &MessageStore, m: &MessageExtBrokerInner) {
    if let Err(e) = store.put_message(m) {
        panic!("put: {e}");
    }
}

fn concurrent(store: &Arc<MessageStore>, writers: u64, iters: u64, size: usize) -> Duration {
    let per = iters.div_ceil(writers);
    let start = Instant::now();
    std::thread::scope(|s| {
        for w in 0..writers {
            let store = store.clone();
            s.spawn(move || {
                let m = message("bench", (w % 8) as i32, size, w);
                for _ in 0..per {
                    put(&store, &m);
                }
            });
        }
    });
    start.elapsed()
}

fn append(c: &mut Criterion) {
    for size in [128usize, 1024] {
        let mut g = c.benchmark_group("append_async");
        g.throughput(Throughput::Elements(1));
        let dir = tempdir();
        let store = Arc::new(open(dir.path(), FlushMode::Async));
        let m = message("bench", 0, size, 1);
        g.bench_function(BenchmarkId::new("single", size), |b| {
            b.iter(|| put(&store, &m))
        });
        g.throughput(Throughput::Elements(32));
        let batch: Vec<_> = (0..32).map(|i| message("bench", 1, size, i)).collect();
        g.bench_function(BenchmarkId::new("batch32", size), |b| {
            b.iter(|| black_box(store.put_messages(&batch).map(|r| r.messages.len())))
        });
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("16_writers", size), |b| {
            b.iter_custom(|iters| concurrent(&store, 16, iters, size))
        });
        g.finish();
        drop(store);

        let mut g = c.benchmark_group("append_sync");
        g.sample_size(10);
        g.throughput(Throughput::Elements(1));
        let dir = tempdir();
        let store = Arc::new(open(dir.path(), FlushMode::Sync));
        g.bench_function(BenchmarkId::new("1_writer", size), |b| {
            b.iter(|| put(&store, &m))
        });
        g.bench_function(BenchmarkId::new("16_writers", size), |b| {
            b.iter_custom(|iters| concurrent(&store, 16, iters, size))
        });
        g.throughput(Throughput::Elements(32));
        g.bench_function(BenchmarkId::new("batch32", size), |b| {
            b.iter(|| black_box(store.put_messages(&batch).map(|r| r.messages.len())))
        });
        g.finish();
    }
}

fn pull(c: &mut Criterion) {
    let mut g = c.benchmark_group("pull");
    for size in [128usize, 1024] {
        let dir = tempdir();
        let store = open(dir.path(), FlushMode::Async);
        let n = 20_000u64;
        let batch: Vec<_> = (0..100).map(|i| message("pull", 0, size, i)).collect();
        for _ in 0..n / 100 {
            if let Err(e) = store.put_messages(&batch) {
                panic!("prefill: {e}");
            }
        }
        g.throughput(Throughput::Elements(32));
        let mut off = 0u64;
        g.bench_function(BenchmarkId::new("32_messages", size), |b| {
            b.iter(|| {
                off = (off + 32) % (n - 32);
                let r = store.get_messages("pull", 0, off, 32, 256 * 1024, &|_| true);
                black_box(r.map(|r| r.messages.len()))
            })
        });
    }
    g.finish();
}

criterion_group!(benches, append, pull);
criterion_main!(benches);
