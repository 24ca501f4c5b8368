//! Each strategy at 1000 members x 10,000 queues (whole assignment).
#![allow(
    missing_docs,
    reason = "benchmark code (criterion's macros add undocumented functions); a failed unwrap ends the run"
)]

use criterion::{criterion_group, criterion_main, Criterion};
use shoal_group::{strategy_by_name, AllocationContext, AllocationInput, Assignment};
use shoal_proto::MessageQueue;

fn strategies(c: &mut Criterion) {
    let queues: Vec<MessageQueue> = (0..10_000)
        .map(|i| MessageQueue::new(format!("topic-{}", i % 10), "hz@broker-a", i / 10))
        .collect();
    let members: Vec<String> = (0..1000)
        .map(|i| format!("10.0.{}.{}@{i}", i / 256, i % 256))
        .collect();
    let mut ctx = AllocationContext::default();
    for m in &members {
        ctx.member_zones.insert(m.clone(), "hz".into());
    }
    ctx.consume_rooms.insert("hz".into());
    ctx.previous = Some(Assignment::new());
    let mut g = c.benchmark_group("allocate_all_1000x10000");
    g.sample_size(10);
    for name in [
        "AVG",
        "AVG_BY_CIRCLE",
        "CONSISTENT_HASH",
        "MACHINE_ROOM",
        "MACHINE_ROOM_NEARBY",
        "RANGE",
        "ROUND_ROBIN",
        "STICKY",
        "COOPERATIVE_STICKY",
        "BALANCED_STICKY",
    ] {
        let Ok(s) = strategy_by_name(name) else {
            continue;
        };
        let input = AllocationInput::new("g", queues.clone(), members.clone()).with_context(&ctx);
        g.bench_function(name, |b| b.iter(|| s.allocate_all(&input)));
    }
    g.finish();
}

criterion_group!(benches, strategies);
criterion_main!(benches);
