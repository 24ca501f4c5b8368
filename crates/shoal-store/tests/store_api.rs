//! Behaviour of the public `MessageStore` API.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use shoal_proto::hash::tags_code;
use shoal_store::backend::{Faults, MemBackend};
use shoal_store::{
    BoundaryType, FlushMode, FlushStatus, GetMessageStatus, MessageArrival, MessageStore,
    StoreConfig, StoreError,
};

#[test]
fn put_and_pull_with_status_rules() {
    let be = MemBackend::new();
    let (store, report) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    assert!(!report.abnormal_shutdown);
    // (topic, queue id, queue offset, tag code) of each arrival.
    type Heard = (String, i32, u64, i64);
    let arrivals: Arc<Mutex<Vec<Heard>>> = Arc::default();
    let a2 = arrivals.clone();
    store.add_arrival_listener(Arc::new(move |a: &MessageArrival<'_>| {
        let heard = (a.topic.to_string(), a.queue_id, a.queue_offset, a.tag_code);
        a2.lock().unwrap().push(heard)
    }));

    // Empty / unknown queue.
    let r = store
        .get_messages("T", 0, 0, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(r.status, GetMessageStatus::NoMessageInQueue);
    assert_eq!(r.next_begin_offset, 0);

    for i in 0..10 {
        let tag = if i % 2 == 0 { "even" } else { "odd" };
        let res = store
            .put_message(&msg("T", 1, &format!("m{i}"), 100, tag))
            .unwrap();
        assert_eq!(res.flush, FlushStatus::NotFlushed);
        assert_eq!(res.messages[0].queue_offset, i);
        assert_eq!(res.messages[0].offset_msg_id().len(), 32);
    }
    assert_eq!(arrivals.lock().unwrap().len(), 10);
    assert_eq!(
        arrivals.lock().unwrap()[3],
        ("T".to_string(), 1, 3, tags_code(Some("odd")))
    );
    assert_eq!(store.max_offset("T", 1), 10);
    assert_eq!(store.min_offset("T", 1), 0);
    assert_eq!(store.topics(), vec!["T".to_string()]);

    let r = store
        .get_messages("T", 1, 2, 3, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(r.status, GetMessageStatus::Found);
    assert_eq!(r.message_count, 3);
    assert_eq!(r.next_begin_offset, 5);
    let recs = decode(&r.messages);
    assert_eq!(
        recs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["m2", "m3", "m4"]
    );

    // Tag filter: only odd.
    let odd = tags_code(Some("odd"));
    let r = store
        .get_messages("T", 1, 0, 32, 1 << 20, &|c| c == odd)
        .unwrap();
    assert_eq!(r.message_count, 5);
    assert_eq!(r.queue_offsets, vec![1, 3, 5, 7, 9]);
    assert_eq!(r.next_begin_offset, 10);
    // Nothing matches: entries scanned, none matched.
    let r = store
        .get_messages("T", 1, 0, 32, 1 << 20, &|_| false)
        .unwrap();
    assert_eq!(r.status, GetMessageStatus::NoMatchedMessage);
    assert_eq!(r.next_begin_offset, 10);
    // max_bytes: always at least one message.
    let r = store.get_messages("T", 1, 0, 32, 1, &|_| true).unwrap();
    assert_eq!(r.message_count, 1);
    assert_eq!(r.next_begin_offset, 1);
    // Offset rules.
    let r = store
        .get_messages("T", 1, 10, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(
        (r.status, r.next_begin_offset),
        (GetMessageStatus::OffsetOverflowOne, 10)
    );
    let r = store
        .get_messages("T", 1, 15, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(
        (r.status, r.next_begin_offset),
        (GetMessageStatus::OffsetOverflowBadly, 10)
    );
    assert_eq!((r.min_offset, r.max_offset), (0, 10));
}

#[test]
fn batches_straddle_segments_and_survive_clean_reopen() {
    let be = MemBackend::new();
    let cfg = mem_config(&be, FlushMode::Async);
    let (store, _) = MessageStore::open(cfg.clone()).unwrap();
    let batch: Vec<_> = (0..30)
        .map(|i| msg("B", i % 3, &format!("b{i}"), 300, "t"))
        .collect();
    let res = store.put_messages(&batch).unwrap();
    assert_eq!(res.messages.len(), 30);
    // Queue offsets per queue in order.
    assert_eq!(res.messages[0].queue_offset, 0);
    assert_eq!(res.messages[3].queue_offset, 1);
    assert_eq!(res.messages[29].queue_offset, 9);
    // Several segments, no record straddles one.
    for m in &res.messages {
        let seg = 4096;
        assert!(m.physical_offset % seg + u64::from(m.size) + 8 <= seg);
    }
    assert!(store.commit_log_max_offset() > 2 * 4096);
    store.commit_offset("g", "B", 1, 4);
    store.set_schedule_offset(2, 17);
    let before = read_all(&store);
    store.shutdown().unwrap();
    assert!(matches!(
        store.put_message(&msg("B", 0, "late", 10, "")),
        Err(StoreError::Closed)
    ));
    drop(store);

    let (store, report) = MessageStore::open(cfg).unwrap();
    assert!(!report.abnormal_shutdown);
    assert!(!report.full_check);
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(read_all(&store), before);
    assert_eq!(walk_commit_log(&store).len(), 30);
    assert_eq!(store.query_offset("g", "B", 1), Some(4));
    assert_eq!(store.offsets_of_group("g"), vec![("B".to_string(), 1, 4)]);
    assert_eq!(store.schedule_offset(2), Some(17));
    let r = store.put_message(&msg("B", 2, "after", 10, "")).unwrap();
    assert_eq!(r.messages[0].queue_offset, 10);
}

#[test]
fn search_by_timestamp_and_earliest_time() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    assert_eq!(
        store
            .offset_by_timestamp("S", 0, 0, BoundaryType::Lower)
            .unwrap(),
        0
    );
    let mut times = Vec::new();
    for i in 0..12 {
        let r = store
            .put_message(&msg("S", 0, &format!("s{i}"), 50, ""))
            .unwrap();
        times.push(r.messages[0].store_timestamp);
        if i % 3 == 2 {
            std::thread::sleep(Duration::from_millis(3));
        }
    }
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(store.earliest_store_time("S", 0).unwrap(), Some(times[0]));
    for (i, &t) in times.iter().enumerate() {
        let lower = store
            .offset_by_timestamp("S", 0, t, BoundaryType::Lower)
            .unwrap() as usize;
        let upper = store
            .offset_by_timestamp("S", 0, t, BoundaryType::Upper)
            .unwrap() as usize;
        assert_eq!(lower, times.iter().position(|&x| x >= t).unwrap());
        assert_eq!(upper, times.iter().rposition(|&x| x <= t).unwrap());
        assert!(lower <= i && i <= upper);
    }
    assert_eq!(
        store
            .offset_by_timestamp("S", 0, 0, BoundaryType::Upper)
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .offset_by_timestamp("S", 0, i64::MAX, BoundaryType::Lower)
            .unwrap(),
        12
    );
    assert_eq!(store.store_time_of("S", 0, 4).unwrap(), Some(times[4]));
}

#[test]
fn index_queries_and_view_by_offset() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    let mut phys = Vec::new();
    for i in 0..40 {
        let topic = if i % 2 == 0 { "A" } else { "Z" };
        let r = store
            .put_message(&msg(topic, 0, &format!("q{i}"), 80, ""))
            .unwrap();
        phys.push(r.messages[0].physical_offset);
    }
    let hits = store.query_by_uniq_key("A", "Uq4").unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(decode(&hits[0])[0].id, "q4");
    assert!(store.query_by_uniq_key("Z", "Uq4").unwrap().is_empty());
    let hits = store.query_by_key("A", "k-q6", 10, 0, i64::MAX).unwrap();
    assert_eq!(decode(&hits[0])[0].id, "q6");
    let shared = store.query_by_key("Z", "shared", 5, 0, i64::MAX).unwrap();
    assert_eq!(shared.len(), 5);
    assert_eq!(decode(&shared[0])[0].id, "q39");
    assert!(store
        .query_by_key("A", "shared", 100, i64::MIN, 0)
        .unwrap()
        .is_empty());

    let rec = store.message_by_physical_offset(phys[7]).unwrap().unwrap();
    assert_eq!(decode(&rec)[0].id, "q7");
    // Offsets that are not a record start, or out of range, give None, never a panic.
    for bad in [
        phys[7] + 1,
        phys[7] + 20,
        u64::MAX - 5,
        store.commit_log_max_offset(),
    ] {
        assert!(
            store.message_by_physical_offset(bad).unwrap().is_none(),
            "{bad}"
        );
    }
    // Index survives an unclean restart (rebuilt from the commit log tail if needed).
    let img = be.crash_image(be.unsynced_bytes());
    drop(store);
    let (store, report) = MessageStore::open(mem_config(&img, FlushMode::Async)).unwrap();
    assert!(report.abnormal_shutdown);
    assert_eq!(store.query_by_uniq_key("Z", "Uq39").unwrap().len(), 1);
    assert_eq!(
        store
            .query_by_key("A", "shared", 100, 0, i64::MAX)
            .unwrap()
            .len(),
        20
    );
}

#[test]
fn retention_deletes_old_segments_and_moves_min_offsets() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    for i in 0..100 {
        store
            .put_message(&msg("R", i % 2, &format!("r{i}"), 200, ""))
            .unwrap();
    }
    let segs_before = store.commit_log_max_offset() / 4096;
    assert!(segs_before >= 4);
    // Nothing is old yet.
    let now = shoal_store_now();
    assert!(store
        .delete_expired(now)
        .unwrap()
        .deleted_segments
        .is_empty());
    let later = now + store.config().retention.as_millis() as i64 + 1000;
    let report = store.delete_expired(later).unwrap();
    // Every segment but the one being written goes.
    assert_eq!(report.deleted_segments.len() as u64, segs_before);
    assert_eq!(store.commit_log_min_offset(), segs_before * 4096);
    let min = store.min_offset("R", 0);
    assert!(min > 0);
    let r = store
        .get_messages("R", 0, 0, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(
        (r.status, r.next_begin_offset),
        (GetMessageStatus::OffsetTooSmall, min)
    );
    let r = store
        .get_messages("R", 0, min, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(r.status, GetMessageStatus::Found);
    assert!(decode(&r.messages)
        .iter()
        .all(|m| m.physical_offset as u64 >= segs_before * 4096));
    assert!(store.query_by_uniq_key("R", "Ur0").unwrap().is_empty());
    read_all(&store);
    // Survives a crash.
    store.flush().unwrap();
    let img = be.crash_image(0);
    drop(store);
    let (store, _) = MessageStore::open(mem_config(&img, FlushMode::Async)).unwrap();
    assert_eq!(store.min_offset("R", 0), min);
    assert_eq!(store.max_offset("R", 0), 50);
    read_all(&store);
}

fn shoal_store_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn limits_full_disk_and_fsync_failure() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Sync)).unwrap();
    let big = msg("L", 0, "big", 3000, "");
    assert!(matches!(
        store.put_message(&big),
        Err(StoreError::MessageTooLarge { .. })
    ));
    assert!(matches!(
        store.put_message(&msg("bad/topic", 0, "x", 10, "")),
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.put_message(&msg("..", 0, "x", 10, "")),
        Err(StoreError::InvalidArgument(_))
    ));
    for i in 0..5 {
        let r = store
            .put_message(&msg("L", 0, &format!("ok{i}"), 100, ""))
            .unwrap();
        assert_eq!(r.flush, FlushStatus::Flushed);
    }
    // Disk full in the middle of a record.
    be.set_faults(Faults {
        write_budget: Some(50),
        ..Faults::default()
    });
    let err = store
        .put_message(&msg("L", 0, "full", 100, ""))
        .unwrap_err();
    assert!(
        matches!(err, StoreError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::StorageFull),
        "{err}"
    );
    // What was written before is still readable; nothing half-written is visible.
    assert_eq!(store.max_offset("L", 0), 5);
    assert_eq!(read_all(&store)[&("L".to_string(), 0)].len(), 5);
    // Space comes back: appends work again, the torn bytes are overwritten.
    be.set_faults(Faults::default());
    let r = store.put_message(&msg("L", 0, "again", 100, "")).unwrap();
    assert_eq!(r.messages[0].queue_offset, 5);
    assert_eq!(walk_commit_log(&store).len(), 6);
    // fsync failure: reported, then the store refuses appends.
    be.set_faults(Faults {
        fail_sync: true,
        ..Faults::default()
    });
    let r = store.put_message(&msg("L", 0, "nosync", 100, "")).unwrap();
    assert_eq!(r.flush, FlushStatus::FlushFailed);
    assert!(matches!(
        store.put_message(&msg("L", 0, "x", 10, "")),
        Err(StoreError::WriteFailed(_))
    ));
    assert_eq!(read_all(&store)[&("L".to_string(), 0)].len(), 7);
    // Closing a failed store leaves the abort marker: the next open runs the full check.
    store.shutdown().unwrap();
    drop(store);
    be.set_faults(Faults::default());
    let (store, report) = MessageStore::open(mem_config(&be, FlushMode::Sync)).unwrap();
    assert!(report.abnormal_shutdown && report.full_check);
    assert_eq!(store.max_offset("L", 0), 7);
    assert!(matches!(
        store.delete_topic("../L"),
        Err(StoreError::InvalidArgument(_))
    ));
}

#[test]
fn sync_flush_group_commit_with_concurrent_writers() {
    let be = MemBackend::new();
    let mut cfg = mem_config(&be, FlushMode::Sync);
    cfg.commit_log_segment_size = 1 << 20;
    let (store, _) = MessageStore::open(cfg.clone()).unwrap();
    let store = Arc::new(store);
    let syncs_before = be.sync_count();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..50 {
                    let r = store
                        .put_message(&msg("G", t % 4, &format!("g{t}-{i}"), 64, ""))
                        .unwrap();
                    assert_eq!(r.flush, FlushStatus::Flushed);
                    assert!(
                        store.commit_log_flushed_offset()
                            >= r.messages[0].physical_offset + u64::from(r.messages[0].size)
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let syncs = be.sync_count() - syncs_before;
    assert!(syncs <= 800, "{syncs} fsyncs for 800 appends");
    for q in 0..4 {
        assert_eq!(store.max_offset("G", q), 200, "queue {q}");
    }
    let all = read_all(&store);
    assert_eq!(all.values().map(Vec::len).sum::<usize>(), 800);
    let img = be.crash_image(0);
    // Reopening with another segment size is refused, not "repaired".
    assert!(MessageStore::open(mem_config(&img, FlushMode::Sync)).is_err());
    cfg.backend = Arc::new(img);
    let (s2, _) = MessageStore::open(cfg).unwrap();
    assert_eq!(read_all(&s2).values().map(Vec::len).sum::<usize>(), 800);
}

#[test]
fn delete_topic_removes_queues_and_offsets() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    store.put_message(&msg("D", 0, "d0", 50, "")).unwrap();
    store.put_message(&msg("E", 0, "e0", 50, "")).unwrap();
    store.commit_offset("g", "D", 0, 1);
    store.delete_topic("D").unwrap();
    assert_eq!(store.topics(), vec!["E".to_string()]);
    assert_eq!(store.max_offset("D", 0), 0);
    assert_eq!(store.query_offset("g", "D", 0), None);
    // A crash does not bring it back.
    let img = be.crash_image(be.unsynced_bytes());
    drop(store);
    let (store, _) = MessageStore::open(mem_config(&img, FlushMode::Async)).unwrap();
    assert_eq!(store.topics(), vec!["E".to_string()]);
    // Re-created topic starts from 0.
    let r = store.put_message(&msg("D", 0, "d1", 50, "")).unwrap();
    assert_eq!(r.messages[0].queue_offset, 0);
}

#[test]
fn real_file_system_with_background_threads() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = StoreConfig::new(dir.path());
    cfg.commit_log_segment_size = 64 * 1024;
    cfg.max_message_size = 16 * 1024;
    cfg.flush_interval = Duration::from_millis(10);
    let (store, report) = MessageStore::open(cfg.clone()).unwrap();
    assert_eq!(report.commit_log_end, 0);
    for i in 0..500 {
        store
            .put_message(&msg("F", i % 4, &format!("f{i}"), 300, "tag"))
            .unwrap();
    }
    store.commit_offset("g", "F", 0, 3);
    // The flusher thread catches up on its own.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.commit_log_flushed_offset() < store.commit_log_max_offset() {
        assert!(
            std::time::Instant::now() < deadline,
            "flusher thread did not flush"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(store);
    assert!(!dir.path().join("abort").exists());
    let (store, report) = MessageStore::open(cfg).unwrap();
    assert!(!report.abnormal_shutdown && !report.full_check);
    assert_eq!(read_all(&store).values().map(Vec::len).sum::<usize>(), 500);
    assert_eq!(store.query_offset("g", "F", 0), Some(3));
    assert!(dir
        .path()
        .join("commitlog")
        .join("00000000000000065536")
        .exists());
}

#[test]
fn failure_after_commit_log_write_poisons_then_recovers() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    let mut size = 0;
    // Consume-queue entries are buffered (256 per queue); fill the buffer to one short.
    for i in 0..255 {
        let r = store
            .put_message(&msg("P", 0, &format!("p{i}"), 100, ""))
            .unwrap();
        size = u64::from(r.messages[0].size);
    }
    // Room for the commit log record, not for writing out the consume-queue entries.
    be.set_faults(Faults {
        write_budget: Some(size + 5),
        ..Faults::default()
    });
    assert!(store.put_message(&msg("P", 0, "px", 100, "")).is_err());
    be.set_faults(Faults::default());
    assert!(matches!(
        store.put_message(&msg("P", 0, "py", 100, "")),
        Err(StoreError::WriteFailed(_))
    ));
    // Readers still see what was there before.
    assert_eq!(store.max_offset("P", 0), 255);
    assert_eq!(read_all(&store)[&("P".to_string(), 0)].len(), 255);
    drop(store);
    let (store, report) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    assert!(report.full_check);
    // The record that reached the log is re-dispatched (the producer saw an error and may
    // retry: at-least-once), and the queue stays consistent with the log.
    let all = read_all(&store);
    let ids: Vec<_> = all[&("P".to_string(), 0)]
        .iter()
        .map(|r| r.id.clone())
        .collect();
    assert_eq!(ids.len(), 256);
    assert_eq!(ids[255], "px");
    assert_eq!(walk_commit_log(&store).len(), 256);
    let r = store.put_message(&msg("P", 0, "pz", 100, "")).unwrap();
    assert_eq!(r.messages[0].queue_offset, 256);
}

#[test]
fn wait_false_skips_the_sync_flush_wait() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Sync)).unwrap();
    let mut m = msg("W", 0, "w0", 50, "");
    m.properties = m.properties.replace("WAIT\u{1}true", "WAIT\u{1}false");
    assert_eq!(
        store.put_message(&m).unwrap().flush,
        FlushStatus::NotFlushed
    );
    let m = msg("W", 0, "w1", 50, "");
    assert_eq!(store.put_message(&m).unwrap().flush, FlushStatus::Flushed);
}

#[test]
fn concurrent_writers_and_readers_see_consistent_queues() {
    let be = MemBackend::new();
    let mut cfg = mem_config(&be, FlushMode::Async);
    cfg.commit_log_segment_size = 64 * 1024;
    let (store, _) = MessageStore::open(cfg).unwrap();
    let store = Arc::new(store);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..400 {
                    let batch: Vec<_> = (0..1 + i % 3)
                        .map(|j| {
                            msg(
                                "C",
                                (i + j) % 2,
                                &format!("c{w}-{i}-{j}"),
                                40 + (i as usize * 7) % 200,
                                "t",
                            )
                        })
                        .collect();
                    store.put_messages(&batch).unwrap();
                    if i % 97 == 0 {
                        store.flush().unwrap();
                    }
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|q| {
            let store = store.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let mut off = 0u64;
                let mut seen = 0usize;
                while !done.load(std::sync::atomic::Ordering::Acquire)
                    || off < store.max_offset("C", q)
                {
                    let r = store
                        .get_messages("C", q, off, 32, 1 << 20, &|_| true)
                        .unwrap();
                    let recs = decode(&r.messages);
                    for (i, rec) in recs.iter().enumerate() {
                        assert_eq!(rec.queue_offset as u64, off + i as u64);
                        assert_eq!(rec.queue_id, q);
                    }
                    seen += recs.len();
                    if r.status == GetMessageStatus::Found {
                        off = r.next_begin_offset;
                    } else {
                        std::thread::yield_now();
                    }
                }
                seen
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let seen: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert_eq!(seen, 4 * (134 + 133 * 2 + 133 * 3));
    assert_eq!(walk_commit_log(&store).len(), seen);
}

#[test]
fn real_file_system_unclean_stop_and_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = StoreConfig::new(dir.path());
    cfg.commit_log_segment_size = 16 * 1024;
    cfg.max_message_size = 4096;
    cfg.background_threads = false;
    let (store, _) = MessageStore::open(cfg.clone()).unwrap();
    let mut last = None;
    for i in 0..100 {
        let r = store
            .put_message(&msg("U", i % 3, &format!("u{i}"), 150, ""))
            .unwrap();
        last = Some(r.messages[0].clone());
    }
    // The process dies: no shutdown, nothing flushed, but the bytes are in the OS.
    store.abandon();
    let last = last.unwrap();
    let seg_base = last.physical_offset - last.physical_offset % 16384;
    let seg = dir.path().join("commitlog").join(format!("{seg_base:020}"));
    // Tear the last record in half.
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(last.physical_offset - seg_base + u64::from(last.size) / 2)
        .unwrap();
    drop(f);
    let (store, report) = MessageStore::open(cfg).unwrap();
    assert!(report.abnormal_shutdown && report.full_check);
    assert_eq!(report.commit_log_end, last.physical_offset);
    assert_eq!(report.truncated_bytes, u64::from(last.size) / 2);
    let total: usize = read_all(&store).values().map(Vec::len).sum();
    assert_eq!(total, 99);
    assert_eq!(walk_commit_log(&store).len(), 99);
}

#[test]
fn second_store_on_the_same_directory_is_refused_until_the_first_closes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = StoreConfig::new(dir.path());
    cfg.commit_log_segment_size = 16 * 1024;
    cfg.max_message_size = 4096;
    cfg.background_threads = false;
    let (store, _) = MessageStore::open(cfg.clone()).unwrap();
    store.put_message(&msg("L", 0, "l0", 100, "")).unwrap();
    let err = MessageStore::open(cfg.clone()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, shoal_store::StoreError::Locked { .. }),
        "{err}"
    );
    assert!(
        text.contains(&format!("pid {}", std::process::id())) && text.contains("in use"),
        "{text}"
    );
    let lock = std::fs::read_to_string(dir.path().join(shoal_store::LOCK_FILE)).unwrap();
    assert!(lock.contains(&std::process::id().to_string()), "{lock}");
    store.shutdown().unwrap();
    let (again, _) = MessageStore::open(cfg).unwrap();
    assert_eq!(again.max_offset("L", 0), 1);
}

#[test]
fn properties_ending_in_nul_are_refused() {
    // Recovery would take such a record for a torn write (see docs/storage.md).
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Sync)).unwrap();
    let mut m = msg("N", 0, "n0", 100, "");
    m.properties.push('\0');
    let err = store.put_message(&m).unwrap_err();
    assert!(matches!(err, StoreError::InvalidArgument(_)), "{err}");
    assert_eq!(store.max_offset("N", 0), 0);
    // A NUL inside a value is stored as it is.
    let mut m = msg("N", 0, "n1", 100, "");
    m.properties.push_str("X\u{1}a\0b\u{2}");
    store.put_message(&m).unwrap();
    assert_eq!(store.max_offset("N", 0), 1);
}

#[test]
fn search_by_commit_log_offset() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    assert_eq!(store.offset_at_physical("P", 0, 0).unwrap(), 0);
    let mut phys = Vec::new();
    for i in 0..10 {
        // Another queue's messages in between: commit-log offsets of this queue skip.
        store.put_message(&msg("P", 1, "other", 20, "")).unwrap();
        let r = store
            .put_message(&msg("P", 0, &format!("p{i}"), 20, ""))
            .unwrap();
        phys.push(r.messages[0].physical_offset);
    }
    for (i, &p) in phys.iter().enumerate() {
        assert_eq!(store.offset_at_physical("P", 0, p).unwrap(), i as u64);
        assert_eq!(
            store.offset_at_physical("P", 0, p + 1).unwrap(),
            i as u64 + 1
        );
    }
    assert_eq!(store.offset_at_physical("P", 0, 0).unwrap(), 0);
    assert_eq!(store.offset_at_physical("P", 0, u64::MAX).unwrap(), 10);
}
