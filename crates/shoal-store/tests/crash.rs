//! Crash tests: post-crash disk images cut at many points through the fault-injecting backend.
//!
//! A crash image keeps every fsynced write plus a prefix (in issue order, the last write
//! possibly torn) of the writes not yet fsynced. For each image we recover and check:
//! every acknowledged-durable message is there exactly once, nothing was invented, each
//! queue holds a prefix of what was sent to it (no holes, order kept), and the consume queues
//! agree with the commit log.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

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

/// Chunk of the reserved space ahead of memory-mapped appends, on backends that model it
/// ([`MemBackend::set_segment_preallocation`]): a quarter of a 4 KiB segment.
const CHUNK: u64 = 1024;

fn cfg_on(be: &MemBackend, mode: FlushMode) -> StoreConfig {
    let mut cfg = mem_config(be, mode);
    cfg.mmap_commit_log = true;
    cfg.mmap_chunk_size = CHUNK;
    cfg
}

/// A fresh backend; `prealloc`: segments reserve space ahead of their writes, as with
/// memory-mapped appends on the real file system, so crash images can end in zeros.
fn backend(prealloc: bool) -> MemBackend {
    let be = MemBackend::new();
    be.set_segment_preallocation(prealloc);
    be
}

/// Recovers `image` and checks the invariants. Returns the recovered ids.
fn check_image(
    image: MemBackend,
    mode: FlushMode,
    sent: &Sent,
    durable: &HashSet<String>,
) -> HashSet<String> {
    check_image_report(image, mode, sent, durable).0
}

/// As [`check_image`], with the recovery report.
fn check_image_report(
    image: MemBackend,
    mode: FlushMode,
    sent: &Sent,
    durable: &HashSet<String>,
) -> (HashSet<String>, shoal_store::RecoveryReport) {
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
    // The key index agrees with the log: a recovered message is found by its unique key once,
    // one that was not recovered is not found (its entries past the log end were cut).
    for (id, m) in &sent.by_id {
        let found = store
            .query_by_uniq_key(&m.topic, &format!("U{id}"))
            .expect("query by key");
        let want = usize::from(seen.contains(id));
        assert_eq!(found.len(), want, "key lookups of {id} ({report:?})");
    }
    // The store keeps working: the next message of a queue lands at its max offset.
    let next = msg("T0", 0, "after-crash", 60, "");
    let max = store.max_offset("T0", 0);
    let r = store.put_message(&next).expect("append after recovery");
    assert_eq!(r.messages[0].queue_offset, max);
    (seen, report)
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
    sync_scenario_on(false, seed, acked_puts, final_batch, final_size).0
}

/// Returns whether the final batch crossed a segment boundary, and how many images recovered
/// with a reserved zero tail.
fn sync_scenario_on(
    prealloc: bool,
    seed: u64,
    acked_puts: usize,
    final_batch: usize,
    final_size: usize,
) -> (bool, usize) {
    let be = backend(prealloc);
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
    let mut zero_tails = 0;
    for cut in cut_points(total, tail) {
        let (seen, report) =
            check_image_report(be.crash_image(cut), FlushMode::Sync, &sent, &durable);
        torn_seen |= seen.len() > durable.len();
        zero_tails += usize::from(report.reserved_tail_bytes > 0);
    }
    // Some image kept (part of) the unsynced put: the torn states were really exercised.
    assert!(torn_seen, "no image kept part of the unsynced put");
    drop(store);
    (crosses, zero_tails)
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
fn sync_flush_crash_with_reserved_zero_tails() {
    let mut crossed = false;
    let mut zero_tails = 0;
    for seed in 1..6 {
        let (c, z) = sync_scenario_on(true, seed, 5 + seed as usize, 1 + seed as usize % 4, 700);
        crossed |= c;
        zero_tails += z;
    }
    assert!(crossed, "no final batch across a segment boundary");
    assert!(
        zero_tails > 0,
        "no image recovered with a reserved zero tail"
    );
}

#[test]
fn async_flush_only_flushed_survives_fsync_not_reached() {
    async_scenario(false);
}

#[test]
fn async_flush_crash_with_reserved_zero_tails() {
    async_scenario(true);
}

fn async_scenario(prealloc: bool) {
    let be = backend(prealloc);
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
    recovery_scenario(false);
}

#[test]
fn recovery_is_itself_crash_safe_with_reserved_zero_tails() {
    recovery_scenario(true);
}

fn recovery_scenario(prealloc: bool) {
    let be = backend(prealloc);
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

/// Six records on T1/0, durable; a byte of record `victim`'s body is flipped on disk.
fn image_with_flipped_body(victim: usize) -> (MemBackend, Vec<u64>) {
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
    // Flip a byte in the body (durable data, so only the CRC can tell).
    let seg = std::path::PathBuf::from("/data/commitlog/00000000000000000000");
    assert!(img.corrupt(&seg, offsets[victim] + 100, b"Z"));
    (img, offsets)
}

fn pull_ids(store: &MessageStore, topic: &str, q: i32) -> (Vec<String>, usize) {
    let (mut ids, mut skipped, mut off) = (Vec::new(), 0, 0);
    while off < store.max_offset(topic, q) {
        let r = store
            .get_messages(topic, q, off, 32, 1 << 20, &|_| true)
            .unwrap();
        ids.extend(decode(&r.messages).into_iter().map(|m| m.id));
        skipped += r.corrupt_skipped;
        off = r.next_begin_offset;
    }
    (ids, skipped)
}

#[test]
fn one_corrupt_record_does_not_take_the_following_ones_with_it() {
    let (img, offsets) = image_with_flipped_body(2);
    let (store, report) = MessageStore::open(cfg_on(&img, FlushMode::Sync)).unwrap();
    assert!(report.full_check);
    assert_eq!(report.truncated_bytes, 0, "{report:?}");
    assert_eq!(report.corrupt_records, vec![offsets[2]]);
    // The corrupt record keeps its queue offset; reads skip it and serve the rest.
    assert_eq!(store.max_offset("T1", 0), 6);
    let (ids, skipped) = pull_ids(&store, "T1", 0);
    assert_eq!(ids, ["c0", "c1", "c3", "c4", "c5"]);
    assert_eq!(skipped, 1);
    assert_eq!(store.corrupt_records_read(), 1);
    // The next message gets the next offset: nothing is reused.
    let r = store.put_message(&msg("T1", 0, "c6", 100, "")).unwrap();
    assert_eq!(r.messages[0].queue_offset, 6);
}

#[test]
fn corrupt_record_under_the_error_policy_is_refused_after_the_good_prefix() {
    let (img, offsets) = image_with_flipped_body(2);
    let mut cfg = cfg_on(&img, FlushMode::Sync);
    cfg.corrupt_record_policy = shoal_store::CorruptRecordPolicy::Error;
    let (store, _) = MessageStore::open(cfg).unwrap();
    let r = store
        .get_messages("T1", 0, 0, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(r.message_count, 2);
    assert_eq!(r.next_begin_offset, 2);
    let err = store
        .get_messages("T1", 0, 2, 32, 1 << 20, &|_| true)
        .unwrap_err();
    assert!(
        matches!(err, shoal_store::StoreError::CorruptRecord { phys_offset, queue_offset: 2, .. } if phys_offset == offsets[2]),
        "{err}"
    );
    let r = store
        .get_messages("T1", 0, 3, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!(r.message_count, 3);
}

#[test]
fn corrupt_last_record_is_a_torn_tail_and_is_cut() {
    let (img, offsets) = image_with_flipped_body(5);
    let (store, report) = MessageStore::open(cfg_on(&img, FlushMode::Sync)).unwrap();
    assert_eq!(report.commit_log_end, offsets[5]);
    assert!(report.truncation_reason.unwrap().contains("CRC"));
    assert!(report.corrupt_records.is_empty());
    assert_eq!(store.max_offset("T1", 0), 5);
}

#[test]
fn bit_rot_is_caught_on_read_after_a_clean_restart() {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(cfg_on(&be, FlushMode::Sync)).unwrap();
    let mut offsets = Vec::new();
    for i in 0..6 {
        let r = store
            .put_message(&msg("T2", 0, &format!("r{i}"), 100, ""))
            .unwrap();
        offsets.push(r.messages[0].physical_offset);
    }
    store.shutdown().unwrap();
    drop(store);
    let seg = std::path::PathBuf::from("/data/commitlog/00000000000000000000");
    assert!(be.corrupt(&seg, offsets[3] + 100, b"Z"));
    // Clean shutdown: the fast path does not scan the log, the read checks the CRC.
    let (store, report) = MessageStore::open(cfg_on(&be, FlushMode::Sync)).unwrap();
    assert!(!report.full_check);
    let (ids, skipped) = pull_ids(&store, "T2", 0);
    assert_eq!(ids, ["r0", "r1", "r2", "r4", "r5"]);
    assert_eq!(skipped, 1);
    // With the check off, the bytes are served as they are (what the switch is for).
    store.shutdown().unwrap();
    drop(store);
    let mut cfg = cfg_on(&be, FlushMode::Sync);
    cfg.check_crc_on_read = false;
    let (store, _) = MessageStore::open(cfg).unwrap();
    let r = store
        .get_messages("T2", 0, 0, 32, 1 << 20, &|_| true)
        .unwrap();
    assert_eq!((r.message_count, r.corrupt_skipped), (6, 0));
}

/// Twenty messages on Q/0 and Q/1 (consume-queue files of 16 entries), cleanly shut down.
fn clean_store_with_two_queues() -> MemBackend {
    let be = MemBackend::new();
    let (store, _) = MessageStore::open(cfg_on(&be, FlushMode::Async)).unwrap();
    for i in 0..40 {
        store
            .put_message(&msg("Q", i % 2, &format!("q{i}"), 60, ""))
            .unwrap();
    }
    store.shutdown().unwrap();
    be
}

fn assert_queue_served_whole(store: &MessageStore, q: i32) {
    let all = read_all(store);
    let ids: Vec<String> = all[&("Q".to_string(), q)]
        .iter()
        .map(|r| r.id.clone())
        .collect();
    let expected: Vec<String> = (0..40)
        .filter(|i| i % 2 == q)
        .map(|i| format!("q{i}"))
        .collect();
    assert_eq!(ids, expected);
    let r = store.put_message(&msg("Q", q, "next", 60, "")).unwrap();
    assert_eq!(r.messages[0].queue_offset, 20, "an offset was reused");
}

#[test]
fn damaged_consume_queue_is_rebuilt_after_a_clean_shutdown() {
    let be = clean_store_with_two_queues();
    // 200 garbage bytes at the start of the first consume-queue file of Q/1.
    let f = std::path::PathBuf::from("/data/consumequeue/Q/1/00000000000000000000");
    assert!(be.corrupt(&f, 0, &[0xAB; 200]));
    let (store, report) = MessageStore::open(cfg_on(&be, FlushMode::Async)).unwrap();
    assert!(!report.full_check, "clean shutdown: fast path for the log");
    assert_eq!(report.consume_queues_rebuilt.len(), 1, "{report:?}");
    assert!(report.consume_queues_rebuilt[0].starts_with("Q/1"));
    assert_queue_served_whole(&store, 1);
    assert_queue_served_whole(&store, 0);
}

#[test]
fn damage_in_an_older_consume_queue_file_is_found() {
    let be = clean_store_with_two_queues();
    // Entry 5 of the first file (the queue has two files) points somewhere else.
    let f = std::path::PathBuf::from("/data/consumequeue/Q/0/00000000000000000000");
    let e = be.file_contents(&f).unwrap()[20 * 4..20 * 5].to_vec();
    assert!(be.corrupt(&f, 20 * 5, &e));
    let (store, report) = MessageStore::open(cfg_on(&be, FlushMode::Async)).unwrap();
    assert_eq!(report.consume_queues_rebuilt.len(), 1, "{report:?}");
    assert_queue_served_whole(&store, 0);
}

#[test]
fn missing_or_truncated_consume_queue_is_rebuilt_after_a_clean_shutdown() {
    let be = clean_store_with_two_queues();
    be.remove_dir_all(std::path::Path::new("/data/consumequeue/Q/1"))
        .unwrap();
    let f = std::path::PathBuf::from("/data/consumequeue/Q/0/00000000000000000320");
    let file = be.open(&f, false).unwrap();
    file.set_len(20).unwrap();
    file.sync().unwrap();
    let (store, report) = MessageStore::open(cfg_on(&be, FlushMode::Async)).unwrap();
    assert_eq!(report.consume_queues_rebuilt.len(), 2, "{report:?}");
    assert_queue_served_whole(&store, 0);
    assert_queue_served_whole(&store, 1);
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
