//! Memory-mapped commit-log appends on the real file system: segments reserve space ahead of
//! the writes, a process that dies leaves a zero-filled tail, and recovery finds exactly the
//! records appended.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use shoal_store::{
    AppendedMessage, MessageExtBrokerInner, MessageStore, StoreConfig, BLANK_MAGIC_CODE,
};

const SEGMENT: u64 = 64 * 1024;
const CHUNK: u64 = 16 * 1024;

fn fs_config(dir: &Path, mmap: bool) -> StoreConfig {
    let mut cfg = StoreConfig::new(dir);
    cfg.commit_log_segment_size = SEGMENT;
    cfg.mmap_commit_log = mmap;
    cfg.mmap_chunk_size = CHUNK;
    cfg.max_message_size = 4096;
    cfg.background_threads = false;
    cfg
}

fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join("commitlog").join(format!("{base:020}"))
}

fn disk_len(dir: &Path, base: u64) -> u64 {
    std::fs::metadata(segment_path(dir, base)).unwrap().len()
}

/// Appends `n` messages of varied sizes on 3 queues; returns the ids per queue in order.
fn append(store: &MessageStore, from: usize, n: usize, per_queue: &mut BTreeMap<i32, Vec<String>>) {
    for i in from..from + n {
        let q = (i % 3) as i32;
        let id = format!("m{i}");
        let r = store
            .put_message(&msg("M", q, &id, 100 + (i * 37) % 300, "t"))
            .unwrap();
        let list = per_queue.entry(q).or_default();
        assert_eq!(r.messages[0].queue_offset, list.len() as u64);
        list.push(id);
    }
}

fn recovered(store: &MessageStore) -> BTreeMap<i32, Vec<String>> {
    read_all(store)
        .into_iter()
        .map(|((_, q), recs)| (q, recs.into_iter().map(|r| r.id).collect()))
        .collect()
}

/// Every segment but the last is as long as its data, which ends with the blank marker.
fn assert_full_segments_sealed(dir: &Path, end: u64) {
    let last_base = end - end % SEGMENT;
    for base in (0..last_base).step_by(SEGMENT as usize) {
        let bytes = std::fs::read(segment_path(dir, base)).unwrap();
        assert!(bytes.len() >= 8 && (bytes.len() as u64) < SEGMENT);
        let marker = &bytes[bytes.len() - 8..];
        assert_eq!(
            u32::from_be_bytes(marker[0..4].try_into().unwrap()) as usize,
            SEGMENT as usize - (bytes.len() - 8),
            "segment {base}"
        );
        assert_eq!(&marker[4..8], &BLANK_MAGIC_CODE.to_be_bytes());
    }
}

#[cfg(target_os = "linux")]
#[test]
fn process_crash_leaves_a_reserved_tail_and_recovery_finds_exactly_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fs_config(dir.path(), true);
    let (store, _) = MessageStore::open(cfg.clone()).unwrap();
    let mut sent = BTreeMap::new();
    append(&store, 0, 400, &mut sent);
    let end = store.commit_log_max_offset();
    assert!(
        end > 2 * SEGMENT,
        "the test wants full segments behind the last"
    );
    let base = end - end % SEGMENT;
    // The segment being written is longer on disk than its data: whole chunks are reserved.
    let on_disk = disk_len(dir.path(), base);
    assert!(on_disk > end - base && (on_disk % CHUNK == 0 || on_disk == SEGMENT));
    assert_full_segments_sealed(dir.path(), end);

    // The process dies: no flush, no shutdown; the bytes are in the page cache.
    store.abandon();
    let (store, report) = MessageStore::open(cfg.clone()).unwrap();
    assert!(report.abnormal_shutdown && report.full_check);
    assert_eq!(report.commit_log_end, end);
    assert_eq!(report.truncation_reason, None, "{report:?}");
    assert_eq!(report.truncated_bytes, 0, "{report:?}");
    assert_eq!(report.reserved_tail_bytes, on_disk - (end - base));
    assert_eq!(disk_len(dir.path(), base), end - base);
    assert_eq!(recovered(&store), sent);
    assert_eq!(walk_commit_log(&store).len(), 400);

    // Appends go on after recovery; a clean shutdown leaves every file as long as its data,
    // so the next start takes the fast path.
    append(&store, 400, 300, &mut sent);
    let end = store.commit_log_max_offset();
    store.shutdown().unwrap();
    drop(store);
    assert_eq!(disk_len(dir.path(), end - end % SEGMENT), end % SEGMENT);
    assert_full_segments_sealed(dir.path(), end);
    let (store, report) = MessageStore::open(cfg).unwrap();
    assert!(
        !report.abnormal_shutdown && !report.full_check,
        "{report:?}"
    );
    assert_eq!(recovered(&store), sent);
    assert_eq!(walk_commit_log(&store).len(), 700);
}

/// A mapped store in `dir` that appended the `n` messages `make` gives one by one and then
/// crashed (no shutdown): its config, the last message appended and its segment's base.
#[cfg(target_os = "linux")]
fn crashed_after(
    dir: &Path,
    n: usize,
    make: impl Fn(usize) -> MessageExtBrokerInner,
) -> (StoreConfig, AppendedMessage, u64) {
    let cfg = fs_config(dir, true);
    let (store, _) = MessageStore::open(cfg.clone()).unwrap();
    let mut last = None;
    for i in 0..n {
        last = Some(store.put_message(&make(i)).unwrap().messages[0].clone());
    }
    store.abandon();
    let last = last.expect("at least one message");
    let base = last.physical_offset - last.physical_offset % SEGMENT;
    (cfg, last, base)
}

/// Overwrites `len` bytes at `at` of the segment starting at `base` with zeros (what a power
/// loss leaves of pages not written back, over reserved space).
#[cfg(target_os = "linux")]
fn zero_out(dir: &Path, base: u64, at: u64, len: u64) {
    let path = segment_path(dir, base);
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new().write(true).open(&path).unwrap(),
        &vec![0u8; len as usize],
        at,
    )
    .unwrap();
}

#[cfg(target_os = "linux")]
#[test]
fn torn_record_before_the_reserved_zeros_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, last, base) = crashed_after(dir.path(), 100, |i| {
        msg("U", (i % 3) as i32, &format!("u{i}"), 150, "")
    });
    // A power loss kept the first half of the last record: the rest is the reserved zeros.
    let half = u64::from(last.size) / 2;
    zero_out(
        dir.path(),
        base,
        last.physical_offset - base + half,
        u64::from(last.size) - half,
    );
    let (store, report) = MessageStore::open(cfg).unwrap();
    assert_eq!(report.commit_log_end, last.physical_offset);
    assert!(report.truncation_reason.is_some(), "{report:?}");
    assert_eq!(disk_len(dir.path(), base), last.physical_offset - base);
    assert_eq!(walk_commit_log(&store).len(), 99);
    let total: usize = read_all(&store).values().map(Vec::len).sum();
    assert_eq!(total, 99);
}

#[test]
fn without_mmap_files_are_as_long_as_their_data() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fs_config(dir.path(), false);
    let (store, _) = MessageStore::open(cfg.clone()).unwrap();
    let mut sent = BTreeMap::new();
    append(&store, 0, 300, &mut sent);
    let end = store.commit_log_max_offset();
    assert_eq!(disk_len(dir.path(), end - end % SEGMENT), end % SEGMENT);
    assert_full_segments_sealed(dir.path(), end);
    store.abandon();
    let (store, report) = MessageStore::open(cfg).unwrap();
    assert_eq!(
        (
            report.commit_log_end,
            report.truncated_bytes,
            report.reserved_tail_bytes
        ),
        (end, 0, 0)
    );
    assert_eq!(recovered(&store), sent);
}

#[cfg(target_os = "linux")]
#[test]
fn record_whose_properties_end_in_zeros_is_a_torn_write() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, last, base) =
        crashed_after(dir.path(), 20, |i| msg("P", 0, &format!("p{i}"), 200, "t"));
    // Only the last 5 bytes (inside the properties, after the body its CRC covers) were not
    // written back: the reserved zeros show through. Framing and body CRC are intact.
    zero_out(
        dir.path(),
        base,
        last.physical_offset - base + u64::from(last.size) - 5,
        5,
    );
    let (store, report) = MessageStore::open(cfg).unwrap();
    assert_eq!(report.commit_log_end, last.physical_offset, "{report:?}");
    assert!(report.truncation_reason.unwrap().contains("torn"));
    assert!(report.corrupt_records.is_empty());
    assert_eq!(store.max_offset("P", 0), 19);
    assert!(store.query_by_uniq_key("P", "Up19").unwrap().is_empty());
}

#[test]
fn a_zero_tail_shorter_than_a_record_header_is_free_space_too() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fs_config(dir.path(), false);
    let (store, _) = MessageStore::open(cfg.clone()).unwrap();
    let mut sent = BTreeMap::new();
    append(&store, 0, 10, &mut sent);
    let end = store.commit_log_max_offset();
    store.abandon();
    // The reserved space ended 5 bytes after the data.
    let path = segment_path(dir.path(), 0);
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(end + 5).unwrap();
    drop(f);
    let (store, report) = MessageStore::open(cfg).unwrap();
    assert_eq!(
        (
            report.commit_log_end,
            report.truncated_bytes,
            report.reserved_tail_bytes
        ),
        (end, 0, 5),
        "{report:?}"
    );
    assert_eq!(report.truncation_reason, None);
    assert_eq!(recovered(&store), sent);
}

/// A replicated pair on the real file system with memory-mapped appends: the replica's
/// segments (written through its maps, then sealed) hold the master's bytes exactly.
#[test]
fn replica_on_mapped_segments_matches_its_master() {
    let (mdir, rdir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cfg = |d: &Path| {
        let mut c = fs_config(d, true);
        c.replicated = true;
        c
    };
    let (master, _) = MessageStore::open(cfg(mdir.path())).unwrap();
    let (replica, _) = MessageStore::open(cfg(rdir.path())).unwrap();
    for i in 0..400 {
        let size = 100 + (i * 37) % 900;
        master
            .put_message(&msg(&format!("T{}", i % 2), 0, &format!("r{i}"), size, "t"))
            .unwrap();
    }
    let mut sizes = [700usize, 5000, 200, 30_000].iter().cycle();
    while replica.commit_log_max_offset() < master.commit_log_max_offset() {
        let at = replica.commit_log_max_offset();
        let bytes = master.read_log(at, *sizes.next().unwrap()).unwrap();
        replica.append_replicated(at, &bytes).unwrap();
    }
    let end = master.commit_log_max_offset();
    assert!(end > 3 * SEGMENT);
    master.set_confirmed(end);
    replica.set_confirmed(end);
    assert_eq!(read_all(&master), read_all(&replica));
    master.shutdown().unwrap();
    replica.shutdown().unwrap();
    let mut base = 0;
    while base < end {
        assert_eq!(
            std::fs::read(segment_path(mdir.path(), base)).unwrap(),
            std::fs::read(segment_path(rdir.path(), base)).unwrap(),
            "segment {base}"
        );
        base += SEGMENT;
    }
}
