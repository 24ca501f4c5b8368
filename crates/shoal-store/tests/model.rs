//! Property tests: random appends (mixed topics, queues, sizes, batches), reads, flushes and
//! reopens (clean and after a crash that kept everything written) agree with an in-memory
//! model.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::collections::BTreeMap;

use common::*;
use proptest::prelude::*;
use shoal_proto::hash::tags_code;
use shoal_store::backend::MemBackend;
use shoal_store::{FlushMode, GetMessageStatus, MessageStore};

#[derive(Debug, Clone)]
enum Op {
    Put {
        t: u8,
        q: u8,
        size: u16,
        tag: u8,
    },
    Batch {
        t: u8,
        n: u8,
        size: u16,
        tag: u8,
    },
    Get {
        t: u8,
        q: u8,
        from: u8,
        max: u8,
        tag: Option<u8>,
    },
    Flush,
    Reopen {
        clean: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3u8, 0..3u8, 0..900u16, 0..3u8).prop_map(|(t, q, size, tag)| Op::Put { t, q, size, tag }),
        2 => (0..3u8, 1..8u8, 0..500u16, 0..3u8).prop_map(|(t, n, size, tag)| Op::Batch { t, n, size, tag }),
        4 => (0..3u8, 0..3u8, 0..40u8, 1..20u8, proptest::option::of(0..3u8))
            .prop_map(|(t, q, from, max, tag)| Op::Get { t, q, from, max, tag }),
        1 => Just(Op::Flush),
        1 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
    ]
}

type Model = BTreeMap<(String, i32), Vec<(String, u8)>>;

fn tag_name(t: u8) -> String {
    format!("tag{t}")
}

/// `prealloc`: segments reserve space ahead of their writes (1 KiB chunks), as memory-mapped
/// appends do on the real file system, so crash images hold zero-filled tails.
fn run(ops: Vec<Op>, mode: FlushMode, prealloc: bool) {
    let mut be = MemBackend::new();
    be.set_segment_preallocation(prealloc);
    let mem_config = |be: &MemBackend, mode| {
        let mut cfg = mem_config(be, mode);
        cfg.mmap_commit_log = true;
        cfg.mmap_chunk_size = 1024;
        cfg
    };
    let (mut store, _) = MessageStore::open(mem_config(&be, mode)).unwrap();
    let mut model: Model = BTreeMap::new();
    let mut n = 0u32;
    for op in ops {
        match op {
            Op::Put { t, q, size, tag } => {
                n += 1;
                let id = format!("p{n}");
                let m = msg(
                    &format!("T{t}"),
                    i32::from(q),
                    &id,
                    usize::from(size),
                    &tag_name(tag),
                );
                let r = store.put_message(&m).unwrap();
                let list = model.entry((m.topic.clone(), m.queue_id)).or_default();
                assert_eq!(r.messages[0].queue_offset, list.len() as u64);
                list.push((id, tag));
            }
            Op::Batch {
                t,
                n: count,
                size,
                tag,
            } => {
                let batch: Vec<_> = (0..count)
                    .map(|j| {
                        n += 1;
                        msg(
                            &format!("T{t}"),
                            i32::from(j % 2),
                            &format!("p{n}"),
                            usize::from(size),
                            &tag_name(tag),
                        )
                    })
                    .collect();
                let r = store.put_messages(&batch).unwrap();
                for (m, a) in batch.iter().zip(&r.messages) {
                    let list = model.entry((m.topic.clone(), m.queue_id)).or_default();
                    assert_eq!(a.queue_offset, list.len() as u64);
                    list.push((id_of(&m.body), tag));
                }
            }
            Op::Get {
                t,
                q,
                from,
                max,
                tag,
            } => {
                let topic = format!("T{t}");
                let qid = i32::from(q);
                let empty = Vec::new();
                let list = model.get(&(topic.clone(), qid)).unwrap_or(&empty);
                let offset = u64::from(from);
                let code = tag.map(|t| tags_code(Some(&tag_name(t))));
                let filter = move |c: i64| code.is_none_or(|x| x == c);
                let r = store
                    .get_messages(&topic, qid, offset, usize::from(max), 1 << 20, &filter)
                    .unwrap();
                let len = list.len() as u64;
                assert_eq!(r.max_offset, len);
                assert_eq!(r.min_offset, 0);
                if len == 0 {
                    assert_eq!(r.status, GetMessageStatus::NoMessageInQueue);
                } else if offset == len {
                    assert_eq!(
                        (r.status, r.next_begin_offset),
                        (GetMessageStatus::OffsetOverflowOne, len)
                    );
                } else if offset > len {
                    assert_eq!(
                        (r.status, r.next_begin_offset),
                        (GetMessageStatus::OffsetOverflowBadly, len)
                    );
                } else {
                    let mut expected = Vec::new();
                    let mut next = offset;
                    for (i, (id, tg)) in list.iter().enumerate().skip(offset as usize) {
                        if expected.len() == usize::from(max) {
                            break;
                        }
                        next = i as u64 + 1;
                        if tag.is_none_or(|t| t == *tg) {
                            expected.push(id.clone());
                        }
                    }
                    let got: Vec<String> = decode(&r.messages).into_iter().map(|m| m.id).collect();
                    assert_eq!(got, expected);
                    assert_eq!(r.next_begin_offset, next);
                    let status = if expected.is_empty() {
                        GetMessageStatus::NoMatchedMessage
                    } else {
                        GetMessageStatus::Found
                    };
                    assert_eq!(r.status, status);
                }
            }
            Op::Flush => {
                store.flush().unwrap();
            }
            Op::Reopen { clean } => {
                if clean {
                    store.shutdown().unwrap();
                    drop(store);
                } else {
                    // Power loss after everything was written to the OS (all bytes kept).
                    let img = be.crash_image(be.unsynced_bytes());
                    drop(store);
                    be = img;
                }
                let (s, report) = MessageStore::open(mem_config(&be, mode)).unwrap();
                assert_eq!(report.abnormal_shutdown, !clean);
                assert_eq!(report.truncated_bytes, 0);
                if prealloc && clean {
                    // The shutdown gave the reserved space back: the fast path applies.
                    assert!(!report.full_check, "{report:?}");
                }
                store = s;
            }
        }
    }
    // Final full comparison, then the same after a clean reopen.
    for pass in 0..2 {
        let all = read_all(&store);
        let got: Model = all
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| {
                let tags = v
                    .iter()
                    .map(|r| {
                        let t = r
                            .tags
                            .as_deref()
                            .and_then(|s| s.strip_prefix("tag"))
                            .and_then(|s| s.parse().ok());
                        (r.id.clone(), t.unwrap_or(u8::MAX))
                    })
                    .collect();
                (k, tags)
            })
            .collect();
        assert_eq!(got, model, "pass {pass}");
        assert_eq!(
            walk_commit_log(&store).len(),
            model.values().map(Vec::len).sum::<usize>()
        );
        if let Some((id, _)) = model.values().flatten().last() {
            let (topic, _) = model
                .iter()
                .find(|(_, v)| v.iter().any(|(i, _)| i == id))
                .map(|(k, v)| (k.0.clone(), v))
                .unwrap();
            assert_eq!(
                store
                    .query_by_uniq_key(&topic, &format!("U{id}"))
                    .unwrap()
                    .len(),
                1
            );
        }
        store.shutdown().unwrap();
        drop(store);
        store = MessageStore::open(mem_config(&be, mode)).unwrap().0;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn async_store_agrees_with_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops, FlushMode::Async, false);
    }

    #[test]
    fn sync_store_agrees_with_model(ops in proptest::collection::vec(op(), 1..40)) {
        run(ops, FlushMode::Sync, false);
    }

    #[test]
    fn store_with_reserved_segment_tails_agrees_with_model(
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        run(ops, FlushMode::Async, true);
    }
}
