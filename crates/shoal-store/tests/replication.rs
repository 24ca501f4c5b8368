//! Replication support: a master's commit log shipped to a replica in chunks of whole records,
//! the confirmed offset gating what reads see, truncation, restarting a log, bad input, crash
//! recovery of a replicated store, and a property test of master and replica staying equal.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use shoal_store::backend::{Backend, Faults, MemBackend};
use shoal_store::{
    FlushMode, GetMessageStatus, MessageExtBrokerInner, MessageStore, StoreConfig, StoreError,
};

fn repl_config(be: &MemBackend) -> StoreConfig {
    let mut c = mem_config(be, FlushMode::Async);
    c.replicated = true;
    c
}

fn open(be: &MemBackend) -> MessageStore {
    MessageStore::open(repl_config(be)).unwrap().0
}

/// The `i`-th test message: 3 topics x 2 queues, sizes 60..700 (several per 4 KiB segment).
fn nth(i: usize) -> MessageExtBrokerInner {
    let size = 60 + (i * 131) % 640;
    msg(
        &format!("T{}", i % 3),
        (i / 3 % 2) as i32,
        &format!("m{i}"),
        size,
        if i % 2 == 0 { "even" } else { "odd" },
    )
}

/// Puts messages `from..to` one put at a time; returns the end of each record.
fn put_range(store: &MessageStore, from: usize, to: usize) -> Vec<u64> {
    (from..to)
        .map(|i| {
            let r = store.put_message(&nth(i)).unwrap();
            let m = &r.messages[0];
            m.physical_offset + u64::from(m.size)
        })
        .collect()
}

/// Ships the master's log to the replica in chunks of the given sizes (cycled).
fn ship(master: &MessageStore, replica: &MessageStore, sizes: &[usize]) -> usize {
    let mut batches = 0;
    loop {
        let start = replica.commit_log_max_offset();
        if start == master.commit_log_max_offset() {
            return batches;
        }
        let max = sizes[batches % sizes.len()];
        let bytes = master.read_log(start, max).unwrap();
        assert!(!bytes.is_empty(), "no progress at {start}");
        let seg = master.config().commit_log_segment_size;
        assert!(
            start % seg + bytes.len() as u64 <= seg,
            "a batch never leaves its segment"
        );
        let end = replica.append_replicated(start, &bytes).unwrap();
        assert_eq!(
            end,
            start + bytes.len() as u64,
            "as long as the range it covers"
        );
        batches += 1;
    }
}

/// Every commit-log segment file with its bytes.
fn log_files(be: &MemBackend) -> BTreeMap<String, Vec<u8>> {
    let dir = PathBuf::from("/data/commitlog");
    be.list(&dir)
        .unwrap()
        .into_iter()
        .map(|n| {
            let bytes = be.file_contents(&dir.join(&n)).unwrap();
            (n, bytes)
        })
        .collect()
}

/// Every queue's max offset (queues that never had a visible record left out: a store
/// creates a queue when a record for it is written, and a cut may leave it empty).
fn max_offsets(store: &MessageStore) -> BTreeMap<(String, i32), u64> {
    let mut out = BTreeMap::new();
    for t in store.topics() {
        for q in store.queue_ids(&t) {
            let max = store.max_offset(&t, q);
            if max > 0 {
                out.insert((t.clone(), q), max);
            }
        }
    }
    out
}

/// [`read_all`] without the empty queues, as record ids per queue.
fn visible(store: &MessageStore) -> BTreeMap<(String, i32), Vec<Rec>> {
    read_all(store)
        .into_iter()
        .filter(|(_, recs)| !recs.is_empty())
        .collect()
}

/// Every record a pull can see ends at or below `limit`.
fn assert_nothing_above(store: &MessageStore, limit: u64) -> usize {
    let mut n = 0;
    for recs in read_all(store).values() {
        for r in recs {
            let rec = store
                .message_by_physical_offset(r.physical_offset as u64)
                .unwrap()
                .expect("a visible record is found by its offset");
            assert!(r.physical_offset as u64 + rec.len() as u64 <= limit);
            n += 1;
        }
    }
    n
}

#[test]
fn replica_built_from_read_log_is_identical_and_visible_only_when_confirmed() {
    let (mbe, rbe) = (MemBackend::new(), MemBackend::new());
    let (master, replica) = (open(&mbe), open(&rbe));
    let arrived = Arc::new(AtomicUsize::new(0));
    let a = arrived.clone();
    replica.add_arrival_listener(Arc::new(move |_| {
        a.fetch_add(1, Ordering::Relaxed);
    }));
    let ends = put_range(&master, 0, 90);
    let end = master.commit_log_max_offset();
    assert!(end > 5 * 4096, "crosses several segments");
    // Nothing is visible on the master before the group confirms it.
    assert_eq!(master.confirmed(), 0);
    assert!(max_offsets(&master).values().all(|m| *m == 0));
    assert_eq!(
        master
            .get_messages("T0", 0, 0, 10, 1 << 20, &|_| true)
            .unwrap()
            .status,
        GetMessageStatus::NoMessageInQueue
    );
    assert!(master.message_by_physical_offset(0).unwrap().is_none());
    assert!(master.query_by_uniq_key("T0", "Um0").unwrap().is_empty());

    let batches = ship(&master, &replica, &[1, 300, 1000, 5000, 64 << 10]);
    assert!(batches > 10);
    assert_eq!(replica.commit_log_max_offset(), end);
    assert_eq!(log_files(&mbe), log_files(&rbe), "byte-identical logs");
    assert_eq!(arrived.load(Ordering::Relaxed), 0);
    assert!(max_offsets(&replica).values().all(|m| *m == 0));

    // Part of the log confirmed: exactly the records ending at or below it are visible.
    let c = ends[40];
    for s in [&master, &replica] {
        s.set_confirmed(c);
        s.set_confirmed(c - 1); // never moves back
        assert_eq!(s.confirmed(), c);
        assert_eq!(assert_nothing_above(s, c), 41);
    }
    assert_eq!(arrived.load(Ordering::Relaxed), 41);
    assert_eq!(replica.query_by_uniq_key("T0", "Um0").unwrap().len(), 1);
    assert!(replica.query_by_uniq_key("T0", "Um42").unwrap().is_empty());

    for s in [&master, &replica] {
        s.set_confirmed(end);
    }
    assert_eq!(arrived.load(Ordering::Relaxed), 90);
    assert_eq!(read_all(&master), read_all(&replica));
    assert_eq!(max_offsets(&master), max_offsets(&replica));
    assert_eq!(max_offsets(&master).values().sum::<u64>(), 90);
    assert_eq!(walk_commit_log(&replica).len(), 90);
    assert_eq!(replica.query_by_uniq_key("T1", "Um43").unwrap().len(), 1);

    // Reopened after a clean shutdown, both agree still.
    drop(master);
    drop(replica);
    let (master, replica) = (open(&mbe), open(&rbe));
    assert_eq!(master.confirmed(), end);
    assert_eq!(read_all(&master), read_all(&replica));
}

#[test]
fn a_replica_that_becomes_master_continues_every_queues_numbering() {
    let (mbe, rbe) = (MemBackend::new(), MemBackend::new());
    let (master, replica) = (open(&mbe), open(&rbe));
    put_range(&master, 0, 40);
    ship(&master, &replica, &[700]);
    // Nothing confirmed yet: the replica's own put still numbers after the waiting records.
    let r = replica.put_message(&nth(0)).unwrap();
    let waiting_t0_q0 = (0..40).filter(|i| i % 3 == 0 && i / 3 % 2 == 0).count() as u64;
    assert_eq!(r.messages[0].queue_offset, waiting_t0_q0);
    let r = replica.put_message(&nth(1)).unwrap();
    let waiting_t1_q0 = (0..40).filter(|i| i % 3 == 1 && i / 3 % 2 == 0).count() as u64;
    assert_eq!(r.messages[0].queue_offset, waiting_t1_q0);
    replica.set_confirmed(replica.commit_log_max_offset());
    let all = read_all(&replica);
    assert_eq!(all[&("T0".to_string(), 0)].len() as u64, waiting_t0_q0 + 1);

    // Confirmed first, then promoted: the same.
    let (mbe2, rbe2) = (MemBackend::new(), MemBackend::new());
    let (master, replica) = (open(&mbe2), open(&rbe2));
    put_range(&master, 0, 40);
    ship(&master, &replica, &[2000]);
    replica.set_confirmed(replica.commit_log_max_offset());
    for i in 0..6 {
        let m = nth(i);
        let want = replica.max_offset(&m.topic, m.queue_id);
        let r = replica.put_message(&m).unwrap();
        assert_eq!(r.messages[0].queue_offset, want);
    }
}

#[test]
fn truncate_log_cuts_dispatched_and_waiting_records_and_appends_go_on() {
    for (confirm_at, cut_at) in [(30, 15), (15, 30), (20, 20), (0, 5), (45, 49)] {
        let (mbe, rbe) = (MemBackend::new(), MemBackend::new());
        let (master, replica) = (open(&mbe), open(&rbe));
        let ends = put_range(&master, 0, 50);
        ship(&master, &replica, &[900]);
        let c = if confirm_at == 0 {
            0
        } else {
            ends[confirm_at - 1]
        };
        let t = ends[cut_at - 1];
        for s in [&master, &replica] {
            s.set_confirmed(c);
            s.truncate_log(t).unwrap();
            assert_eq!(s.commit_log_max_offset(), t);
            assert!(s.confirmed() <= t);
            assert_eq!(assert_nothing_above(s, c.min(t)), confirm_at.min(cut_at));
        }
        assert_eq!(log_files(&mbe), log_files(&rbe));
        // The master goes on: numbering continues after what stayed, the replica follows.
        let more = put_range(&master, cut_at, 60);
        ship(&master, &replica, &[333]);
        assert_eq!(log_files(&mbe), log_files(&rbe));
        let end = *more.last().unwrap();
        for s in [&master, &replica] {
            s.set_confirmed(end);
        }
        let (a, b) = (visible(&master), visible(&replica));
        assert!(a == b, "same records ({confirm_at}, {cut_at})");
        let ids: Vec<String> = a.values().flatten().map(|r| r.id.clone()).collect();
        assert_eq!(ids.len(), 60, "each message once ({confirm_at}, {cut_at})");
        assert_eq!(max_offsets(&master), max_offsets(&replica));
        // And after a restart.
        drop(replica);
        let replica = open(&rbe);
        assert!(visible(&replica) == a);
    }
}

#[test]
fn truncate_log_refuses_offsets_that_are_not_boundaries() {
    let be = MemBackend::new();
    let s = open(&be);
    let ends = put_range(&s, 0, 10);
    let end = s.commit_log_max_offset();
    assert!(matches!(
        s.truncate_log(end + 1),
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.truncate_log(ends[3] + 5),
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.read_log(ends[3] + 5, 100),
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        s.read_log(end + 1, 100),
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(s.read_log(end, 100).unwrap().is_empty());
    assert_eq!(s.commit_log_max_offset(), end);
    s.truncate_log(end).unwrap();
    assert_eq!(s.commit_log_max_offset(), end);
}

#[test]
fn restart_log_at_starts_afresh_and_queues_number_from_the_first_record() {
    let (mbe, rbe) = (MemBackend::new(), MemBackend::new());
    let (master, replica) = (open(&mbe), open(&rbe));
    let seg = master.config().commit_log_segment_size;
    // The replica has a little of its own, and a consumer offset.
    put_range(&replica, 100, 104);
    replica.set_confirmed(replica.commit_log_max_offset());
    replica.commit_offset("G", "T0", 0, 1);
    put_range(&master, 0, 90);
    let base = 3 * seg;
    assert!(master.commit_log_max_offset() > base + seg);
    replica.restart_log_at(base).unwrap();
    assert_eq!(replica.commit_log_max_offset(), base);
    assert_eq!(replica.commit_log_min_offset(), base);
    assert_eq!(replica.confirmed(), base);
    assert!(replica.topics().is_empty());
    assert_eq!(replica.query_offset("G", "T0", 0), Some(1));
    assert!(matches!(
        master.read_log(base - 1, 10),
        Err(StoreError::InvalidArgument(_))
    ));
    ship(&master, &replica, &[1500]);
    let end = master.commit_log_max_offset();
    master.set_confirmed(end);
    replica.set_confirmed(end);
    let (m, r) = (read_all(&master), read_all(&replica));
    for ((topic, q), recs) in &r {
        let min = replica.min_offset(topic, *q);
        assert!(min > 0, "{topic}/{q} starts above 0");
        assert_eq!(recs[0].queue_offset as u64, min);
        let theirs = &m[&(topic.clone(), *q)];
        assert_eq!(&theirs[theirs.len() - recs.len()..], &recs[..]);
        assert!(recs.iter().all(|x| x.physical_offset as u64 >= base));
        assert_eq!(replica.max_offset(topic, *q), master.max_offset(topic, *q));
    }
    // The replica promoted: numbering goes on; and it survives a restart.
    let before = replica.max_offset("T0", 0);
    let p = replica.put_message(&nth(0)).unwrap();
    assert_eq!(p.messages[0].queue_offset, before);
    replica.set_confirmed(replica.commit_log_max_offset());
    drop(replica);
    let replica = open(&rbe);
    assert_eq!(replica.commit_log_min_offset(), base);
    assert_eq!(replica.max_offset("T0", 0), before + 1);
    // A master whose retention removed the start: the caller is told where the log starts.
    drop(master);
    let m2 = open(&mbe);
    assert!(m2.read_log(0, 10).is_ok());
    assert!(matches!(
        replica.read_log(0, 10),
        Err(StoreError::LogOffsetGone { offset: 0, min }) if min == base
    ));
}

/// Bytes of the segment file `n` of a backend.
fn segment(be: &MemBackend, base: u64) -> Vec<u8> {
    be.file_contents(&Path::new("/data/commitlog").join(format!("{base:020}")))
        .unwrap_or_default()
}

#[test]
fn bad_replicated_bytes_are_refused_and_nothing_is_written() {
    let (mbe, rbe) = (MemBackend::new(), MemBackend::new());
    let (master, replica) = (open(&mbe), open(&rbe));
    put_range(&master, 0, 30);
    let seg = master.config().commit_log_segment_size;
    let first = master.read_log(0, 1000).unwrap();
    let refused = |start: u64, bytes: &[u8], what: &str| {
        let before = (replica.commit_log_max_offset(), log_files(&rbe));
        let e = replica.append_replicated(start, bytes).unwrap_err();
        assert!(
            matches!(e, StoreError::InvalidLogBytes { .. }),
            "{what}: {e}"
        );
        assert_eq!(
            (replica.commit_log_max_offset(), log_files(&rbe)),
            before,
            "{what}: nothing written"
        );
    };
    refused(5, &first, "wrong start");
    refused(0, &first[..first.len() - 3], "torn record");
    refused(0, &first[..4], "torn header");
    let mut bad_crc = first.to_vec();
    let body_at = bad_crc.len() - 1 - 60; // inside the last record's body or properties
    bad_crc[body_at] ^= 0x55;
    refused(0, &bad_crc, "bad crc");
    let mut wrong_phys = first.to_vec();
    wrong_phys[28 + 7] ^= 0x01; // PHYSICALOFFSET of the first record
    refused(0, &wrong_phys, "wrong physical offset");
    // Accepted as it is.
    replica.append_replicated(0, &first).unwrap();
    // Up to the blank marker at the end of the first segment.
    let mut at = replica.commit_log_max_offset();
    // One unit at a time up to the blank marker at the end of the first segment.
    let blank: Vec<u8> = loop {
        let unit = master.read_log(at, 1).unwrap();
        let magic = u32::from_be_bytes(unit[4..8].try_into().unwrap());
        if magic == shoal_store::BLANK_MAGIC_CODE {
            break unit.to_vec();
        }
        replica.append_replicated(at, &unit).unwrap();
        at += unit.len() as u64;
    };
    // It travels as long as the rest of its segment: its header, then zeros.
    assert_eq!(at + blank.len() as u64, seg);
    assert!(blank.len() > 8 && blank[8..].iter().all(|b| *b == 0));
    let mut short = blank.clone();
    short[3] = short[3].wrapping_sub(8); // says 8 bytes fewer than its segment has left
    refused(at, &short, "blank marker not filling its segment");
    refused(at, &blank[..8], "blank marker without its padding");
    refused(
        at,
        &blank[..blank.len() - 1],
        "blank marker short of its segment end",
    );
    let mut dirty = blank.clone();
    *dirty.last_mut().unwrap() = 1;
    refused(
        at,
        &dirty,
        "blank marker padded with something else than zeros",
    );
    let mut garbage = blank.clone();
    garbage[4] ^= 0xff;
    refused(at, &garbage, "unknown magic code");
    assert_eq!(replica.append_replicated(at, &blank).unwrap(), seg);
    assert_eq!(segment(&rbe, 0), segment(&mbe, 0));
    ship(&master, &replica, &[4096]);
    assert_eq!(log_files(&mbe), log_files(&rbe));
}

/// Crash images of `be` at about `n` cut points through its unsynced writes.
fn images(be: &MemBackend, n: u64) -> Vec<MemBackend> {
    let unsynced = be.unsynced_bytes();
    let step = (unsynced / n).max(1);
    let mut cuts: Vec<u64> = (0..unsynced).step_by(step as usize).collect();
    cuts.push(unsynced);
    cuts.into_iter().map(|c| be.crash_image(c)).collect()
}

/// Recovers a crash image of a replicated store and checks that exactly `visible` records,
/// all ending at or below `confirmed`, can be read, that appending goes on with each queue's
/// numbering, and that once everything is confirmed the queues and the log agree. Returns
/// the ids of every record then readable.
fn check_replicated_image(image: &MemBackend, confirmed: u64, visible: usize) -> Vec<String> {
    let (r, report) = MessageStore::open(repl_config(image)).unwrap();
    assert!(report.abnormal_shutdown);
    assert_eq!(r.confirmed(), confirmed);
    assert_eq!(r.dispatched_offset(), confirmed);
    assert_eq!(assert_nothing_above(&r, confirmed), visible);
    assert!(r.commit_log_max_offset() >= confirmed);
    let end_before = r.commit_log_max_offset();
    let next = nth(0);
    let p = r.put_message(&next).unwrap();
    assert!(p.messages[0].physical_offset >= end_before);
    r.set_confirmed(r.commit_log_max_offset());
    let all = read_all(&r); // queue offsets contiguous from the min
    let q = &all[&(next.topic.clone(), next.queue_id)];
    assert_eq!(q.last().unwrap().id, "m0");
    assert_eq!(
        q.last().unwrap().queue_offset as u64,
        p.messages[0].queue_offset
    );
    let walked = walk_commit_log(&r);
    assert_eq!(walked.len(), all.values().map(Vec::len).sum::<usize>());
    walked.into_iter().map(|x| x.id).collect()
}

#[test]
fn crash_of_a_replicated_store_shows_nothing_above_the_persisted_confirmed_offset() {
    let be = MemBackend::new();
    let s = open(&be);
    let ends = put_range(&s, 0, 60);
    let c = ends[25];
    s.set_confirmed(c);
    // Persists the commit log, the dispatched entries and the confirmed offset.
    s.flush().unwrap();
    // Confirmed further, not persisted: after a crash, a lower confirmed offset is fine.
    s.set_confirmed(ends[40]);
    put_range(&s, 60, 70);
    let imgs = images(&be, 30);
    s.abandon();
    assert!(imgs.len() > 10);
    for image in &imgs {
        let ids = check_replicated_image(image, c, 26);
        assert!(ids.len() >= 61, "everything flushed is kept");
    }
}

#[test]
fn crash_after_a_truncation_never_shows_the_cut_records() {
    let be = MemBackend::new();
    let s = open(&be);
    let ends = put_range(&s, 0, 60);
    s.set_confirmed(ends[40]);
    s.flush().unwrap();
    // Cut below the confirmed offset (durably lowered), then new records, confirmed but
    // never persisted.
    let t = ends[20];
    s.truncate_log(t).unwrap();
    let more = put_range(&s, 100, 110);
    s.set_confirmed(more[5]);
    let imgs = images(&be, 30);
    s.abandon();
    for image in &imgs {
        let ids = check_replicated_image(image, t, 21);
        for cut in 21..60 {
            assert!(!ids.contains(&format!("m{cut}")), "m{cut} was cut");
        }
    }
}

#[test]
fn concurrent_puts_and_confirmations_make_every_record_arrive_once_in_order() {
    use std::sync::Mutex;
    let be = MemBackend::new();
    let s = Arc::new(open(&be));
    type Arrived = BTreeMap<(String, i32), Vec<u64>>;
    let seen: Arc<Mutex<Arrived>> = Arc::default();
    let sink = seen.clone();
    s.add_arrival_listener(Arc::new(move |a| {
        sink.lock()
            .unwrap()
            .entry((a.topic.to_string(), a.queue_id))
            .or_default()
            .push(a.queue_offset);
    }));
    let done = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for t in 0..2 {
        let (s, done) = (s.clone(), done.clone());
        threads.push(std::thread::spawn(move || {
            for i in 0..150 {
                s.put_message(&nth(t * 1000 + i)).unwrap();
            }
            done.fetch_add(1, Ordering::Release);
        }));
    }
    let confirmer = {
        let (s, done) = (s.clone(), done.clone());
        std::thread::spawn(move || {
            while done.load(Ordering::Acquire) < 2 {
                s.set_confirmed(s.commit_log_max_offset());
                std::thread::yield_now();
            }
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    confirmer.join().unwrap();
    s.set_confirmed(s.commit_log_max_offset());
    assert_eq!(s.dispatched_offset(), s.commit_log_max_offset());
    let seen = seen.lock().unwrap();
    let mut total = 0;
    for ((topic, q), offsets) in seen.iter() {
        let want: Vec<u64> = (0..offsets.len() as u64).collect();
        assert_eq!(offsets, &want, "{topic}/{q}: each offset once, in order");
        assert_eq!(s.max_offset(topic, *q), offsets.len() as u64);
        total += offsets.len();
    }
    assert_eq!(total, 300);
    assert_eq!(read_all(&s).values().map(Vec::len).sum::<usize>(), 300);
}

#[test]
fn a_replicated_append_that_cannot_be_made_durable_stops_the_store_until_reopened() {
    let (mbe, rbe) = (MemBackend::new(), MemBackend::new());
    let (master, replica) = (open(&mbe), open(&rbe));
    put_range(&master, 0, 20);
    let first = master.read_log(0, 2000).unwrap();
    let end = replica.append_replicated(0, &first).unwrap();
    rbe.set_faults(Faults {
        fail_sync: true,
        ..Faults::default()
    });
    let next = master.read_log(end, 2000).unwrap();
    assert!(replica.append_replicated(end, &next).is_err());
    rbe.set_faults(Faults::default());
    let after = replica.commit_log_max_offset();
    assert!(matches!(
        replica.append_replicated(after, &master.read_log(after, 2000).unwrap()),
        Err(StoreError::WriteFailed(_))
    ));
    assert!(matches!(
        replica.truncate_log(end),
        Err(StoreError::WriteFailed(_))
    ));
    // Reopened (the process restarts): the durable part is there, shipping goes on.
    let image = rbe.crash_image(0);
    replica.abandon();
    let replica = open(&image);
    assert_eq!(replica.commit_log_max_offset(), end);
    ship(&master, &replica, &[1000]);
    let e = master.commit_log_max_offset();
    master.set_confirmed(e);
    replica.set_confirmed(e);
    assert!(visible(&master) == visible(&replica));
}

#[test]
fn a_replicated_store_reopened_unreplicated_shows_its_waiting_records() {
    let be = MemBackend::new();
    let s = open(&be);
    let ends = put_range(&s, 0, 30);
    s.set_confirmed(ends[9]);
    drop(s);
    let (s, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    assert_eq!(read_all(&s).values().map(Vec::len).sum::<usize>(), 30);
    let m = nth(0);
    let want = (0..30).filter(|i| i % 3 == 0 && i / 3 % 2 == 0).count() as u64;
    assert_eq!(s.put_message(&m).unwrap().messages[0].queue_offset, want);
    // And back: an unreplicated checkpoint means everything was visible.
    drop(s);
    let s = open(&be);
    assert_eq!(s.confirmed(), s.commit_log_max_offset());
    assert_eq!(read_all(&s).values().map(Vec::len).sum::<usize>(), 31);
}

#[test]
fn unreplicated_store_ignores_set_confirmed() {
    let be = MemBackend::new();
    let (s, _) = MessageStore::open(mem_config(&be, FlushMode::Async)).unwrap();
    put_range(&s, 0, 5);
    s.set_confirmed(1);
    assert_eq!(s.confirmed(), s.commit_log_max_offset());
    assert_eq!(assert_nothing_above(&s, u64::MAX), 5);
    // Its log can feed a replica all the same.
    let rbe = MemBackend::new();
    let r = open(&rbe);
    ship(&s, &r, &[10_000]);
    assert_eq!(log_files(&be), log_files(&rbe));
}

#[derive(Debug, Clone)]
enum Op {
    /// Messages put on the master (a batch).
    Put(Vec<usize>),
    /// A batch of at most this many bytes shipped.
    Ship(usize),
    /// The replica's end confirmed on both.
    Confirm,
    /// Both cut at the n-th known record boundary from the end (among those still there).
    Truncate(usize),
    /// The master (true) or the replica restarts: cleanly, or killed (every write kept, no
    /// shutdown: recovery runs).
    Restart(bool, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => proptest::collection::vec(0..500usize, 1..6).prop_map(Op::Put),
        4 => (1..6000usize).prop_map(Op::Ship),
        2 => Just(Op::Confirm),
        1 => (0..8usize).prop_map(Op::Truncate),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(m, k)| Op::Restart(m, k)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn replica_stays_identical_to_master(ops in proptest::collection::vec(op(), 1..40)) {
        let (mut mbe, mut rbe) = (MemBackend::new(), MemBackend::new());
        let (mut master, mut replica) = (open(&mbe), open(&rbe));
        // Record boundaries of the master's log (ends of its records).
        let mut bounds: Vec<u64> = Vec::new();
        for op in ops {
            match op {
                Op::Put(ids) => {
                    let batch: Vec<_> = ids.iter().map(|&i| nth(i)).collect();
                    let r = master.put_messages(&batch).unwrap();
                    bounds.extend(r.messages.iter().map(|m| m.physical_offset + u64::from(m.size)));
                }
                Op::Ship(max) => {
                    let start = replica.commit_log_max_offset();
                    if start < master.commit_log_max_offset() {
                        let b = master.read_log(start, max).unwrap();
                        replica.append_replicated(start, &b).unwrap();
                    }
                }
                Op::Confirm => {
                    let c = replica.commit_log_max_offset();
                    master.set_confirmed(c);
                    replica.set_confirmed(c);
                }
                Op::Restart(which, killed) => {
                    let (store, be) = if which {
                        (&mut master, &mut mbe)
                    } else {
                        (&mut replica, &mut rbe)
                    };
                    let confirmed = store.confirmed();
                    let old = std::mem::replace(store, open(&MemBackend::new()));
                    if killed {
                        *be = be.crash_image(be.unsynced_bytes());
                        old.abandon();
                    } else {
                        drop(old);
                    }
                    *store = open(be);
                    // What was confirmed and persisted, at most.
                    prop_assert!(store.confirmed() <= confirmed.min(store.commit_log_max_offset()));
                }
                Op::Truncate(back) => {
                    let limit = replica.commit_log_max_offset();
                    let candidates: Vec<u64> = bounds.iter().copied().filter(|b| *b <= limit).collect();
                    if let Some(&t) = candidates.iter().rev().nth(back) {
                        master.truncate_log(t).unwrap();
                        replica.truncate_log(t).unwrap();
                        bounds.retain(|b| *b <= t);
                    }
                }
            }
            // Never anything above the confirmed offset.
            for s in [&master, &replica] {
                let c = s.confirmed().min(s.commit_log_max_offset());
                assert_nothing_above(s, c);
            }
        }
        ship(&master, &replica, &[3000]);
        let end = master.commit_log_max_offset();
        master.set_confirmed(end);
        replica.set_confirmed(end);
        prop_assert_eq!(log_files(&mbe), log_files(&rbe));
        prop_assert!(visible(&master) == visible(&replica), "same records");
        prop_assert_eq!(max_offsets(&master), max_offsets(&replica));
        prop_assert_eq!(
            max_offsets(&master).values().sum::<u64>() as usize,
            walk_commit_log(&master).len()
        );
    }
}
