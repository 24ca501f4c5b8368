//! Opening a data directory: take its lock, find the end of the commit log (a fast path
//! after a clean shutdown, else a check of every record from the checkpoint on), cut the
//! consume queues and the index back to it, re-create what they miss, check every consume
//! queue against the commit log and rebuild those that do not match, and write a fresh
//! checkpoint. What it found goes in the [`RecoveryReport`].

use foldhash::{HashMap, HashMapExt};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use shoal_proto::message::record::RecordView;

use crate::backend::DirLock;
use crate::checkpoint::Checkpoints;
use crate::commitlog::CommitLog;
use crate::config::StoreConfig;
use crate::consume_queue::CqEntry;
use crate::error::{io_err, Result};
use crate::index::Index;
use crate::offsets::OffsetStore;
use crate::queues::QueueTable;
use crate::record::{now_ms, validate_topic};
use crate::scan::{scan_commit_log, ScannedRecord};
use crate::types::RecoveryReport;
use crate::StoreError;

/// Lock file of the data directory: held (flock) while the store is open, holds the owner's pid.
pub const LOCK_FILE: &str = "lock";

/// A recovered data directory: its parts, consistent and durable, ready to be the store's.
pub(crate) struct Recovered {
    pub(crate) dir_lock: DirLock,
    pub(crate) checkpoints: Checkpoints,
    pub(crate) commit_log: CommitLog,
    pub(crate) queues: QueueTable,
    pub(crate) index: Index,
    pub(crate) offsets: OffsetStore,
    /// Store timestamp of the newest record (0 if none): appends never go below it.
    pub(crate) last_store_timestamp: i64,
    /// Records below this offset are dispatched: the commit log end, or in a replicated store
    /// the persisted confirmed offset (records above it wait for `set_confirmed`).
    pub(crate) dispatched: u64,
}

/// Opens and recovers the data directory of `config` (see the module documentation).
pub(crate) fn recover(config: &StoreConfig) -> Result<(Recovered, RecoveryReport)> {
    let started = Instant::now();
    let backend = config.backend.clone();
    let dir = config.data_dir.clone();
    backend
        .create_dir_all(&dir)
        .map_err(io_err("create data dir", &dir))?;
    let lock_path = dir.join(LOCK_FILE);
    let owner = format!("pid {}, opened at {} ms", std::process::id(), now_ms());
    let dir_lock = match backend
        .try_lock(&lock_path, &owner)
        .map_err(io_err("lock data dir", &lock_path))?
    {
        Ok(l) => l,
        Err(current) => {
            return Err(StoreError::Locked {
                dir: dir.clone(),
                owner: if current.is_empty() {
                    "owner unknown".into()
                } else {
                    current
                },
            })
        }
    };
    let checkpoints = Checkpoints::new(backend.clone(), dir.clone());
    let abnormal = checkpoints.abnormal_shutdown();
    let checkpoint = checkpoints.read()?;
    let commit_log = CommitLog::open(
        backend.clone(),
        dir.join("commitlog"),
        config.commit_log_segment_size,
        config.mmap_commit_log.then_some(config.mmap_chunk_size),
    )?;
    let mut report = RecoveryReport {
        abnormal_shutdown: abnormal,
        ..RecoveryReport::default()
    };

    // 1. Find the end of the commit log.
    let mut scanned = Vec::new();
    let fast_end = match (&checkpoint, abnormal) {
        (Some(cp), false) => cp.clean_end.filter(|end| {
            // Fast path: the data must end exactly where the clean shutdown said.
            let segs = commit_log.segments();
            match segs.last() {
                None => *end == 0 || *end % config.commit_log_segment_size == 0,
                Some(last) => {
                    let len = CommitLog::segment_len(last).unwrap_or(u64::MAX);
                    last.base + len == *end || (*end == last.base + config.commit_log_segment_size)
                }
            }
        }),
        _ => None,
    };
    let mut last_store_timestamp = 0;
    let mut corrupt_found = Vec::new();
    let mut free_tail = 0;
    let end = match fast_end {
        Some(end) => end,
        None => {
            report.full_check = true;
            let from = checkpoint
                .as_ref()
                .map_or(0, |cp| cp.commit_log_flushed.min(cp.logics_flushed));
            let seg_size = config.commit_log_segment_size;
            let from = (from - from % seg_size).max(commit_log.min_offset());
            report.checked_from = from;
            // Only records the consume queues / index may miss are kept for re-dispatch.
            let collect_from = checkpoint.as_ref().map_or(0, |cp| cp.logics_flushed);
            let scan = scan_commit_log(&commit_log, from, collect_from, &mut |r| {
                scanned.push(r);
                Ok(())
            })?;
            report.truncation_reason = scan.reason;
            report.records_checked = scan.checked;
            last_store_timestamp = scan.last_store_timestamp;
            corrupt_found = scan.corrupt;
            free_tail = scan.free_tail;
            scan.end
        }
    };
    // Reserved zeros after the last record are given back too, but they were not data.
    report.truncated_bytes = commit_log.truncate_to(end)?.saturating_sub(free_tail);
    report.reserved_tail_bytes = free_tail;
    report.commit_log_end = end;
    let cl_min = commit_log.min_offset();
    // What may be visible: everything, or in a replicated store what the checkpoint says was
    // confirmed (a record boundary; a store that ran unreplicated had everything visible).
    let visible = if config.replicated {
        let c = match &checkpoint {
            None => 0,
            Some(cp) => cp.confirmed.unwrap_or(end),
        };
        c.min(end).max(cl_min)
    } else {
        end
    };

    // 2. Consume queues: cut entries past the end; note the damaged ones.
    let mut damaged: BTreeMap<(String, i32), String> = BTreeMap::new();
    let queues = QueueTable::open(
        backend.clone(),
        dir.join("consumequeue"),
        config.consume_queue_file_entries,
        |topic, queue_id, cq| {
            let (dropped, bad) = cq.recover(cl_min, visible)?;
            report.consume_queue_entries_dropped += dropped;
            if bad || (dropped > 0 && fast_end.is_some()) {
                damaged.insert(
                    (topic.to_string(), queue_id),
                    format!("{dropped} entries were invalid"),
                );
            }
            Ok(())
        },
    )?;

    // 3. Index: cut entries past the end.
    let (index, idx_dropped) = Index::open(
        backend.clone(),
        dir.join("keyindex"),
        &dir.join("index"),
        config.index_file_entries,
        visible,
    )?;
    report.index_entries_dropped = idx_dropped;

    let offsets = OffsetStore::open(backend.clone(), dir.join("config"))?;
    let mut recovered = Recovered {
        dir_lock,
        checkpoints,
        commit_log,
        queues,
        index,
        offsets,
        last_store_timestamp: 0,
        dispatched: visible,
    };

    // 4. Re-dispatch the checked records the consume queues or index miss.
    if report.full_check {
        let logics = checkpoint.as_ref().map_or(0, |cp| cp.logics_flushed);
        scanned.retain(|r| r.phys < visible);
        report.consume_queue_entries_rebuilt =
            recovered.redispatch(&scanned, logics, &mut damaged)?;
    }
    drop(scanned);
    // 4a. After a clean shutdown of a replicated store whose records above its confirmed
    // offset waited, opened now unreplicated (everything visible): dispatch them.
    if let Some(cp) = checkpoint.as_ref().filter(|_| !report.full_check) {
        let from = cp.logics_flushed.max(cl_min);
        if from < visible {
            let mut tail = Vec::new();
            scan_commit_log(&recovered.commit_log, from, from, &mut |r| {
                if r.phys < visible {
                    tail.push(r);
                }
                Ok(())
            })?;
            report.consume_queue_entries_rebuilt +=
                recovered.redispatch(&tail, from, &mut damaged)?;
        }
    }
    // 4b. Verify every consume queue against the commit log (on every start): entries in
    // order and inside the log, sampled entries pointing at their own records, and after a
    // clean shutdown every queue as long as it was. Rebuild what does not match.
    if let Some(expected) = checkpoint.as_ref().and_then(|cp| cp.queues.as_ref()) {
        if fast_end.is_some() {
            for (name, max) in expected {
                let Some((topic, qid)) = name
                    .rsplit_once('/')
                    .and_then(|(t, q)| q.parse::<i32>().ok().map(|q| (t.to_string(), q)))
                else {
                    continue;
                };
                let have = recovered
                    .queues
                    .get(&topic, qid, false)
                    .ok()
                    .flatten()
                    .map(|cq| cq.max_offset());
                if have != Some(*max) && validate_topic(&topic).is_ok() {
                    let why = match have {
                        None => format!("its files are missing (it had {max} entries)"),
                        Some(h) => format!("it has {h} entries, {max} at the clean shutdown"),
                    };
                    damaged.entry((topic, qid)).or_insert(why);
                }
            }
        }
    }
    recovered.verify_queues(&mut damaged)?;
    if !damaged.is_empty() {
        for ((topic, qid), why) in &damaged {
            tracing::warn!(%topic, queue_id = qid, reason = %why, "consume queue does not match the commit log; rebuilding it");
            report
                .consume_queues_rebuilt
                .push(format!("{topic}/{qid}: {why}"));
        }
        let set: HashSet<(String, i32)> = damaged.into_keys().collect();
        report.consume_queue_entries_rebuilt += recovered.rebuild_queues(&set, visible)?;
    }
    report.corrupt_records = corrupt_found;
    if last_store_timestamp == 0 && end > 0 {
        last_store_timestamp = recovered.last_record_timestamp().unwrap_or(0);
    }
    if visible < end {
        // 4c. Replicated: the records waiting for their dispatch still number their queues
        // (puts continue after them).
        let newest = recovered.note_waiting(visible)?;
        last_store_timestamp = last_store_timestamp.max(newest);
    }
    recovered.last_store_timestamp = last_store_timestamp;

    // 5. Everything consistent and durable: new checkpoint, then the abort marker.
    recovered.checkpoints.flush_logics(
        &AtomicU64::new(visible),
        &recovered.queues,
        &recovered.index,
        &recovered.commit_log,
        config.replicated,
    )?;
    recovered.checkpoints.mark_open()?;
    report.duration = started.elapsed();
    tracing::info!(?report, "message store recovered");
    Ok((recovered, report))
}

impl Recovered {
    /// Recovery: adds consume-queue and index entries for scanned records that lack them.
    /// Queues found with a hole are added to `broken` (to be rebuilt) and skipped.
    fn redispatch(
        &self,
        scanned: &[ScannedRecord],
        logics_flushed: u64,
        broken: &mut BTreeMap<(String, i32), String>,
    ) -> Result<u64> {
        let mut rebuilt = 0;
        let indexed_to = self.index.indexed_to();
        for r in scanned.iter().filter(|r| r.phys >= logics_flushed) {
            if r.phys >= indexed_to {
                for key in &r.keys {
                    self.index.put(&r.topic, key, r.phys, r.store_timestamp)?;
                }
            }
            if broken.contains_key(&(r.topic.clone(), r.queue_id)) {
                continue;
            }
            let Some(cq) = self.queues.get(&r.topic, r.queue_id, true)? else {
                continue;
            };
            let q = r.queue_offset as u64;
            let max = cq.max_offset();
            if q == max {
                cq.append(&[r.cq_entry()])?;
                rebuilt += 1;
            } else if q > max {
                // Entries are missing below the checkpoint (or the queue lost its files):
                // rebuild this queue from the whole commit log below.
                tracing::warn!(
                    topic = %r.topic,
                    queue_id = r.queue_id,
                    max,
                    next = q,
                    "consume queue has a hole; rebuilding it from the commit log"
                );
                broken.insert(
                    (r.topic.clone(), r.queue_id),
                    format!("entries {max}..{q} are missing below the checkpoint"),
                );
            }
        }
        Ok(rebuilt)
    }

    /// Start-up check of every consume queue against the commit log; adds the queues that do
    /// not match to `damaged`.
    fn verify_queues(&self, damaged: &mut BTreeMap<(String, i32), String>) -> Result<()> {
        let all = self.queues.named();
        let (cl_min, cl_end) = (self.commit_log.min_offset(), self.commit_log.write_pos());
        for (topic, qid, cq) in all {
            if damaged.contains_key(&(topic.clone(), qid)) {
                continue;
            }
            let samples = match cq.check_entries(cl_min, cl_end)? {
                Ok(samples) => samples,
                Err(why) => {
                    damaged.insert((topic, qid), why);
                    continue;
                }
            };
            for (logical, e) in samples {
                if let Some(why) = self.entry_mismatch(&topic, qid, logical, &e) {
                    damaged.insert((topic.clone(), qid), why);
                    break;
                }
            }
        }
        Ok(())
    }

    /// Why the consume-queue entry `logical` of (topic, queue id) does not point at its own
    /// record, if it does not.
    fn entry_mismatch(&self, topic: &str, qid: i32, logical: u64, e: &CqEntry) -> Option<String> {
        let rec = match self.commit_log.read(e.phys_offset, e.size as usize) {
            Ok(r) => r,
            Err(err) => return Some(format!("entry {logical} cannot be read: {err}")),
        };
        let ok = RecordView::parse(&rec).is_ok_and(|v| {
            v.total_size() as u32 == e.size
                && v.physical_offset() == e.phys_offset as i64
                && v.queue_offset() == logical as i64
                && v.queue_id() == qid
                && v.topic() == topic
        });
        (!ok).then(|| {
            format!(
                "entry {logical} points at commit log offset {} which is not its record",
                e.phys_offset
            )
        })
    }

    /// Replicated stores: notes the queue offsets of the records from `from` (the
    /// confirmed offset) to the log end, which wait for their dispatch. Returns the newest
    /// store timestamp among them.
    fn note_waiting(&self, from: u64) -> Result<i64> {
        let queues = &self.queues;
        let scan = scan_commit_log(&self.commit_log, from, from, &mut |r| {
            if let Some(cq) = queues.get(&r.topic, r.queue_id, true)? {
                cq.note_assigned(r.queue_offset as u64 + 1);
            }
            Ok(())
        })?;
        Ok(scan.last_store_timestamp)
    }

    /// Re-creates the given consume queues from every record in the commit log below
    /// `visible`.
    fn rebuild_queues(&self, queues: &HashSet<(String, i32)>, visible: u64) -> Result<u64> {
        let mut cqs = HashMap::new();
        for (topic, qid) in queues {
            if let Some(cq) = self.queues.get(topic, *qid, true)? {
                cq.reset_to(0)?;
                cqs.insert((topic.clone(), *qid), (cq, true));
            }
        }
        let mut rebuilt = 0u64;
        let from = self.commit_log.min_offset();
        scan_commit_log(&self.commit_log, from, from, &mut |r| {
            if r.phys >= visible {
                return Ok(());
            }
            let Some((cq, first)) = cqs.get_mut(&(r.topic.clone(), r.queue_id)) else {
                return Ok(());
            };
            let q = r.queue_offset as u64;
            if *first && q > 0 {
                cq.reset_to(q)?;
            }
            *first = false;
            if q == cq.max_offset() {
                cq.append(&[r.cq_entry()])?;
                rebuilt += 1;
            }
            Ok(())
        })?;
        Ok(rebuilt)
    }

    fn last_record_timestamp(&self) -> Option<i64> {
        // Newest consume-queue entry across queues gives a recent record.
        let best = self.queues.newest_entry();
        best.and_then(|p| self.commit_log.store_timestamp_at(p).ok())
    }
}
