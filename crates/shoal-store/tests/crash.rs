//! Crash tests: post-crash disk images cut at many points through the fault-injecting backend.
//!
//! A crash image keeps every fsynced write plus a prefix (in issue order, the last write
//! possibly torn) of the writes not yet fsynced. For each image we recover and check:
//! every acknowledged-durable message is there exactly once, nothing was invented, each
//! queue holds a prefix of what was sent to it (no holes, order kept), and the consume queues
//! agree with the commit log.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};

use common::*;
use shoal_store::backend::Backend;
use shoal_store::backend::{Faults, MemBackend};
use shoal_store::{FlushMode, FlushStatus, MessageExtBrokerInner, MessageStore, StoreConfig};

/// What was sent: id -> message, and per queue the ids in send order.
#[derive(Default)]
struct Sent {
    by_id: HashMap<String, MessageExtBrokerInner>,
    per_queue: BTreeMap<(String, i32), Vec<String>>,
}

impl Sent {
    fn add(&mut self, m: &MessageExtBrokerInner) -> String {
        let id = id_of(&m.body);
        self.by_id.insert(id.clone(), m.clone());
        self.per_queue
            .entry((m.topic.clone(), m.queue_id))
            .or_default()
            .push(id.clone());
        id
    }
}

fn cfg_on(be: &MemBackend, mode: FlushMode) -> StoreConfig {
    mem_config(be, mode)
}

/// Recovers `image` and checks the invariants. Returns the recovered ids.
fn check_image(
    image: MemBackend,
    mode: FlushMode,
    sent: &Sent,
    durable: &HashSet<String>,
) -> HashSet<String> {
    let (store, report) = MessageStore::open(cfg_on(&image, mode)).expect("recovery must succeed");
    assert!(report.abnormal_shutdown);
    let all = read_all(&store);
    let mut seen = HashSet::new();
    let mut total = 0;
    for ((topic, q), recs) in &all {
        let sent_ids = sent
            .per_queue
            .get(&(topic.clone(), *q))
            .cloned()
            .unwrap_or_default();
        let got: Vec<String> = recs.iter().map(|r| r.id.clone()).collect();
        // A prefix of what was sent to this queue: nothing invented, no hole, no reordering.
        assert!(got.len() <= sent_ids.len(), "{topic}/{q}: more than sent");
        assert_eq!(
            got[..],
            sent_ids[..got.len()],
            "{topic}/{q} is not a prefix of the sends"
        );
        for r in recs {
            let m = &sent.by_id[&r.id];
            assert_eq!(&r.body[..], &m.body[..], "body of {}", r.id);
            assert!(seen.insert(r.id.clone()), "{} recovered twice", r.id);
            total += 1;
        }
    }
    for id in durable {
        assert!(
            seen.contains(id),
            "acknowledged-durable {id} lost ({report:?})"
        );
    }
    // Consume queues agree with the commit log: same records, each once.
    let walked = walk_commit_log(&store);
    assert_eq!(
        walked.len(),
        total,
        "commit log has records no queue points to"
    );
    let walked_ids: HashSet<String> = walked.iter().map(|r| r.id.clone()).collect();
    assert_eq!(walked_ids, seen);
    // The store keeps working: the next message of a queue lands at its max offset.
    let next = msg("T0", 0, "after-crash", 60, "");
    let max = store.max_offset("T0", 0);
    let r = store.put_message(&next).expect("append after recovery");
    assert_eq!(r.messages[0].queue_offset, max);
    seen
}

fn cut_points(total: u64, tail: u64) -> Vec<u64> {
    let tail_start = total.saturating_sub(tail);
    let mut cuts: Vec<u64> = (tail_start..=total).step_by(2).collect();
    cuts.push(total);
    let step = (tail_start / 60).max(1);
    cuts.extend((0..tail_start).step_by(step as usize));
    cuts
}

fn sync_scenario(seed: u64, acked_puts: usize, final_batch: usize, final_size: usize) -> bool {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(cfg_on(&be, FlushMode::Sync)).unwrap();
    let mut sent = Sent::default();
    let mut durable = HashSet::new();
    let mut n = 0usize;
    for p in 0..acked_puts {
        let k = 1 + (p + seed as usize) % 3;
        let batch: Vec<_> = (0..k)
            .map(|_| {
                n += 1;
                let size = 40 + (n * 97 + seed as usize * 31) % 420;
                msg(
                    &format!("T{}", n % 3),
                    (n % 2) as i32,
                    &format!("s{seed}-{n}"),
                    size,
                    "t",
                )
            })
            .collect();
        let r = store.put_messages(&batch).unwrap();
        assert_eq!(r.flush, FlushStatus::Flushed);
        for m in &batch {
            durable.insert(sent.add(m));
        }
    }
    // The final put: written, but its fsync never happens.
    be.set_faults(Faults {
        fail_sync: true,
        ..Faults::default()
    });
    let batch: Vec<_> = (0..final_batch)
        .map(|j| {
            msg(
                &format!("T{}", j % 3),
                (j % 2) as i32,
                &format!("s{seed}-last{j}"),
                final_size,
                "t",
            )
        })
        .collect();
    let r = store.put_messages(&batch).unwrap();
    assert_eq!(r.flush, FlushStatus::FlushFailed);
    for m in &batch {
        sent.add(m);
    }
    let seg = 4096;
    let first = r.messages[0].physical_offset;
    let crosses = r
        .messages
        .iter()
        .any(|m| m.physical_offset / seg != first / seg)
        || first % seg == 0;
    be.set_faults(Faults::default());
    let total = be.unsynced_bytes();
    let tail = (final_batch * (final_size + 200) + 400) as u64;
    let mut torn_seen = false;
    for cut in cut_points(total, tail) {
        let seen = check_image(be.crash_image(cut), FlushMode::Sync, &sent, &durable);
        torn_seen |= seen.len() > durable.len();
    }
    // Some image kept (part of) the unsynced put: the torn states were really exercised.
    assert!(torn_seen, "no image kept part of the unsynced put");
    drop(store);
    crosses
}

#[test]
fn sync_flush_crash_mid_segment_single_message() {
    sync_scenario(1, 6, 1, 300);
}

#[test]
fn sync_flush_crash_torn_batches_and_segment_boundaries() {
    let mut crossed = false;
    for seed in 2..6 {
        crossed |= sync_scenario(seed, 5 + seed as usize, 4, 700);
    }
    assert!(
        crossed,
        "no scenario put its final batch across a segment boundary"
    );
}

#[test]
fn async_flush_only_flushed_survives_fsync_not_reached() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(cfg_on(&be, FlushMode::Async)).unwrap();
    let mut sent = Sent::default();
    let mut flushed = HashSet::new();
    for i in 0..25 {
        let m = msg(
            &format!("T{}", i % 3),
            i % 2,
            &format!("a{i}"),
            50 + (i as usize * 53) % 300,
            "x",
        );
        assert_eq!(
            store.put_message(&m).unwrap().flush,
            FlushStatus::NotFlushed
        );
        flushed.insert(sent.add(&m));
    }
    store.flush().unwrap();
    for i in 25..45 {
        let batch: Vec<_> = (0..2)
            .map(|j| {
                msg(
                    &format!("T{}", (i + j) % 3),
                    (i + j) % 2,
                    &format!("a{i}-{j}"),
                    120,
                    "x",
                )
            })
            .collect();
        store.put_messages(&batch).unwrap();
        for m in &batch {
            sent.add(m);
        }
    }
    // fsync never reached: exactly the flushed messages survive.
    let seen = check_image(be.crash_image(0), FlushMode::Async, &sent, &flushed);
    assert_eq!(seen, flushed);
    // Any other cut: at least the flushed ones, consistent, nothing invented.
    let total = be.unsynced_bytes();
    let mut max_seen = 0;
    for cut in cut_points(total, 600) {
        let seen = check_image(be.crash_image(cut), FlushMode::Async, &sent, &flushed);
        max_seen = max_seen.max(seen.len());
    }
    assert_eq!(
        max_seen,
        sent.by_id.len(),
        "the full image must keep everything written"
    );
}

#[test]
fn recovery_is_itself_crash_safe_and_reports_truncation() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(cfg_on(&be, FlushMode::Sync)).unwrap();
    let mut sent = Sent::default();
    let mut durable = HashSet::new();
    for i in 0..20 {
        let m = msg("T0", 0, &format!("r{i}"), 200, "");
        store.put_message(&m).unwrap();
        durable.insert(sent.add(&m));
    }
    be.set_faults(Faults {
        fail_sync: true,
        ..Faults::default()
    });
    let m = msg("T0", 0, "torn", 200, "");
    store.put_message(&m).unwrap();
    sent.add(&m);
    be.set_faults(Faults::default());
    // Cut inside the torn record's body.
    let cut = be.unsynced_bytes() - 100;
    let img = be.crash_image(cut);
    drop(store);
    let (s1, report) = MessageStore::open(cfg_on(&img, FlushMode::Sync)).unwrap();
    assert!(report.full_check);
    assert!(report.truncated_bytes > 0, "{report:?}");
    assert!(report.truncation_reason.is_some());
    // Crash right after recovery: the second recovery finds the same state.
    let img2 = img.crash_image(0);
    drop(s1);
    let seen = check_image(img2, FlushMode::Sync, &sent, &durable);
    assert_eq!(seen, durable);
}

#[test]
fn corrupted_record_body_is_cut_by_crc() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(cfg_on(&be, FlushMode::Sync)).unwrap();
    let mut offsets = Vec::new();
    for i in 0..6 {
        let r = store
            .put_message(&msg("T1", 0, &format!("c{i}"), 100, ""))
            .unwrap();
        offsets.push(r.messages[0].physical_offset);
    }
    let img = be.crash_image(0);
    drop(store);
    // Flip a byte in the body of the 5th record (durable data, so only the CRC can tell).
    let seg = std::path::PathBuf::from("/data/commitlog/00000000000000000000");
    assert!(img.corrupt(&seg, offsets[4] + 100, b"Z"));
    let (store, report) = MessageStore::open(cfg_on(&img, FlushMode::Sync)).unwrap();
    assert_eq!(report.commit_log_end, offsets[4]);
    assert!(report.truncation_reason.unwrap().contains("CRC"));
    assert_eq!(store.max_offset("T1", 0), 4);
}

#[test]
fn lost_consume_queue_files_are_rebuilt_from_the_whole_log() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(cfg_on(&be, FlushMode::Async)).unwrap();
    for i in 0..40 {
        store
            .put_message(&msg("H", i % 2, &format!("h{i}"), 150, ""))
            .unwrap();
    }
    store.flush().unwrap();
    for i in 40..50 {
        store
            .put_message(&msg("H", i % 2, &format!("h{i}"), 150, ""))
            .unwrap();
    }
    store.flush().unwrap();
    // Queue H/1 loses its files (disk damage, an operator's rm), then more messages arrive
    // and the machine crashes: the queue has a hole below the checkpoint.
    be.remove_dir_all(std::path::Path::new("/data/consumequeue/H/1"))
        .unwrap();
    for i in 50..60 {
        store
            .put_message(&msg("H", i % 2, &format!("h{i}"), 150, ""))
            .unwrap();
    }
    let img = be.crash_image(be.unsynced_bytes());
    drop(store);
    let (store, report) = MessageStore::open(cfg_on(&img, FlushMode::Async)).unwrap();
    assert!(report.consume_queue_entries_rebuilt >= 30, "{report:?}");
    let all = read_all(&store);
    let ids: Vec<String> = all[&("H".to_string(), 1)]
        .iter()
        .map(|r| r.id.clone())
        .collect();
    let expected: Vec<String> = (0..60)
        .filter(|i| i % 2 == 1)
        .map(|i| format!("h{i}"))
        .collect();
    assert_eq!(ids, expected);
    assert_eq!(all[&("H".to_string(), 0)].len(), 30);
    assert_eq!(walk_commit_log(&store).len(), 60);
}
