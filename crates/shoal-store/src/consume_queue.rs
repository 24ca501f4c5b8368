//! Consume queues: one per (topic, queue id), an array of 20-byte entries indexed by logical
//! (queue) offset: `commit log offset (i64) | size (i32) | tag hash code (i64)`, big-endian.
//!
//! Files live in `consumequeue/<topic>/<queueId>/`, each holding a fixed number of entries and
//! named (20 digits) by the byte offset of its first entry, as RocketMQ.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::backend::{Backend, StoreFile};
use crate::commitlog::{file_name, parse_file_name};
use crate::error::{io_err, Result};
use crate::StoreError;

/// Size of one consume-queue entry.
pub const CQ_ENTRY_SIZE: u64 = 20;

/// One consume-queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEntry {
    /// Commit log offset of the record.
    pub phys_offset: u64,
    /// Size of the record in bytes.
    pub size: u32,
    /// Tag hash code (Java `String.hashCode` of `TAGS`, sign-extended; 0 without a tag).
    pub tag_code: i64,
}

impl CqEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.phys_offset.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.tag_code.to_be_bytes());
    }

    fn decode(b: &[u8]) -> Option<CqEntry> {
        Some(CqEntry {
            phys_offset: u64::from_be_bytes(b.get(0..8)?.try_into().ok()?),
            size: u32::from_be_bytes(b.get(8..12)?.try_into().ok()?),
            tag_code: i64::from_be_bytes(b.get(12..20)?.try_into().ok()?),
        })
    }
}

#[derive(Debug)]
struct CqFile {
    /// Logical offset of the first entry.
    first: u64,
    file: Arc<dyn StoreFile>,
    path: PathBuf,
}

/// Entries appended but not yet written to the files (written in chunks: the queue is derived
/// data, re-created from the commit log by recovery, so buffering it loses nothing).
#[derive(Debug, Default)]
struct Pending {
    /// Entries below this logical offset are in the files.
    written: u64,
    entries: Vec<CqEntry>,
}

/// Buffered entries per queue before they are written out.
const PENDING_LIMIT: usize = 256;

/// A consume queue.
#[derive(Debug)]
pub(crate) struct ConsumeQueue {
    backend: Arc<dyn Backend>,
    dir: PathBuf,
    file_entries: u64,
    files: RwLock<Vec<Arc<CqFile>>>,
    /// Next logical offset to be written.
    max_offset: AtomicU64,
    /// First logical offset still readable.
    min_offset: AtomicU64,
    /// Entries below this logical offset are durable.
    flushed: AtomicU64,
    pending: Mutex<Pending>,
    /// Replicated stores: one past the highest queue offset given to a record in the commit
    /// log (by a put or a replicated append), dispatched or not. Puts number from
    /// [`Self::next_offset`]. 0 when unused.
    assigned: AtomicU64,
}

impl ConsumeQueue {
    /// Opens (or creates, lazily) the consume queue stored in `dir`.
    pub(crate) fn open(backend: Arc<dyn Backend>, dir: PathBuf, file_entries: u64) -> Result<Self> {
        let mut files = Vec::new();
        for name in backend.list(&dir).map_err(io_err("list", &dir))? {
            let Some(byte_off) = parse_file_name(&name) else {
                continue;
            };
            if byte_off % (file_entries * CQ_ENTRY_SIZE) != 0 {
                return Err(StoreError::Corrupt {
                    path: dir.join(&name),
                    reason: "consume queue file start does not match the configured file size"
                        .into(),
                });
            }
            let path = dir.join(&name);
            let file = backend
                .open(&path, false)
                .map_err(io_err("open consume queue", &path))?;
            files.push(Arc::new(CqFile {
                first: byte_off / CQ_ENTRY_SIZE,
                file,
                path,
            }));
        }
        files.sort_by_key(|f| f.first);
        let min = files.first().map_or(0, |f| f.first);
        Ok(ConsumeQueue {
            backend,
            dir,
            file_entries,
            files: RwLock::new(files),
            max_offset: AtomicU64::new(min),
            min_offset: AtomicU64::new(min),
            flushed: AtomicU64::new(min),
            pending: Mutex::new(Pending {
                written: min,
                entries: Vec::new(),
            }),
            assigned: AtomicU64::new(0),
        })
    }

    /// The queue offset the next put takes in a replicated store: past both the entries
    /// written and the records waiting in the commit log for their dispatch.
    pub(crate) fn next_offset(&self) -> u64 {
        self.max_offset().max(self.assigned.load(Ordering::Acquire))
    }

    /// A record with queue offset `next - 1` is in the commit log (not yet dispatched).
    pub(crate) fn note_assigned(&self, next: u64) {
        self.assigned.fetch_max(next, Ordering::AcqRel);
    }

    /// Forgets the offsets noted with [`Self::note_assigned`] (the log they came from was cut).
    pub(crate) fn clear_assigned(&self) {
        self.assigned.store(0, Ordering::Release);
    }

    /// Cuts the entries of records that end above `end` (a commit-log record boundary),
    /// durably: the file holding the first of them is shortened to the entries before it,
    /// later files go (the first file stays, even empty, so the queue keeps its numbering
    /// across a restart). Single writer, like [`Self::append`].
    pub(crate) fn truncate_phys(&self, end: u64) -> Result<()> {
        self.write_out()?;
        let (min, max) = (self.min_offset(), self.max_offset());
        // Entries are in commit-log order: the first one ending above `end`.
        let (mut lo, mut hi) = (min, max);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid)? {
                Some(e) if e.phys_offset + u64::from(e.size) <= end => lo = mid + 1,
                _ => hi = mid,
            }
        }
        let cut = lo;
        if cut >= max {
            return Ok(());
        }
        let mut p = self.pending.lock();
        let mut files = self.files.write();
        let mut keep = Vec::with_capacity(files.len());
        for (i, f) in files.drain(..).enumerate() {
            if f.first >= cut && !(i == 0 && f.first == cut) {
                self.backend
                    .remove_file(&f.path)
                    .map_err(io_err("remove consume queue", &f.path))?;
                continue;
            }
            if f.first + self.file_entries > cut {
                f.file
                    .set_len((cut - f.first) * CQ_ENTRY_SIZE)
                    .map_err(io_err("truncate consume queue", &f.path))?;
                f.file.sync().map_err(io_err("fsync", &f.path))?;
            }
            keep.push(f);
        }
        *files = keep;
        p.written = cut;
        p.entries.clear();
        self.max_offset.store(cut, Ordering::Release);
        self.min_offset.fetch_min(cut, Ordering::AcqRel);
        self.flushed.fetch_min(cut, Ordering::AcqRel);
        Ok(())
    }

    /// Next logical offset to be written (RocketMQ's max offset).
    pub(crate) fn max_offset(&self) -> u64 {
        self.max_offset.load(Ordering::Acquire)
    }

    /// First readable logical offset.
    pub(crate) fn min_offset(&self) -> u64 {
        self.min_offset.load(Ordering::Acquire)
    }

    /// Recovery: keeps the longest prefix of entries that are non-empty, increasing and end at
    /// or below `commit_log_end`; truncates the rest. Returns the number of entries dropped and
    /// whether the drop looks like damage rather than a torn tail (a valid-looking entry
    /// followed the first invalid one: the queue must then be rebuilt from the commit log).
    pub(crate) fn recover(&self, commit_log_min: u64, commit_log_end: u64) -> Result<(u64, bool)> {
        let mut files = self.files.write();
        let mut dropped = 0u64;
        let mut damaged = false;
        while let Some(last) = files.last().cloned() {
            let len = last.file.len().map_err(io_err("stat", &last.path))?;
            let n = (len / CQ_ENTRY_SIZE).min(self.file_entries);
            let mut buf = vec![0u8; (n * CQ_ENTRY_SIZE) as usize];
            last.file
                .read_exact_at(0, &mut buf)
                .map_err(io_err("read consume queue", &last.path))?;
            // Leading zero entries of the first file precede its min offset (see `reset_to`).
            let lead = if files.len() == 1 {
                buf.chunks_exact(CQ_ENTRY_SIZE as usize)
                    .take_while(|c| c.iter().all(|b| *b == 0))
                    .count() as u64
            } else {
                0
            };
            let lead = if lead == n { 0 } else { lead };
            let mut valid = lead;
            let mut prev_end = 0u64;
            for chunk in buf.chunks_exact(CQ_ENTRY_SIZE as usize).skip(lead as usize) {
                let Some(e) = CqEntry::decode(chunk) else {
                    break;
                };
                let end = e.phys_offset.saturating_add(u64::from(e.size));
                if e.size == 0 || end > commit_log_end || e.phys_offset < prev_end {
                    break;
                }
                prev_end = end;
                valid += 1;
            }
            // What follows the valid prefix: zeroes or entries past the log end are a torn or
            // lost tail; a later entry that points inside the log means damaged bytes.
            let rest = buf
                .chunks_exact(CQ_ENTRY_SIZE as usize)
                .skip(valid.max(lead) as usize + 1);
            for chunk in rest {
                if let Some(e) = CqEntry::decode(chunk) {
                    let end = e.phys_offset.saturating_add(u64::from(e.size));
                    if e.size > 0 && end <= commit_log_end && e.phys_offset >= prev_end {
                        damaged = true;
                        break;
                    }
                }
            }
            if valid == lead {
                valid = 0;
            }
            if lead > 0 && valid > 0 {
                self.min_offset.store(last.first + lead, Ordering::Release);
            }
            dropped += len / CQ_ENTRY_SIZE - valid;
            if valid == 0 && files.len() > 1 {
                self.backend
                    .remove_file(&last.path)
                    .map_err(io_err("remove consume queue", &last.path))?;
                files.pop();
                continue;
            }
            if len != valid * CQ_ENTRY_SIZE {
                last.file
                    .set_len(valid * CQ_ENTRY_SIZE)
                    .map_err(io_err("truncate consume queue", &last.path))?;
                last.file.sync().map_err(io_err("fsync", &last.path))?;
            }
            self.max_offset.store(last.first + valid, Ordering::Release);
            self.flushed.store(last.first + valid, Ordering::Release);
            self.pending.lock().written = last.first + valid;
            break;
        }
        drop(files);
        self.correct_min_offset(commit_log_min)?;
        Ok((dropped, damaged))
    }

    /// Start-up check of every stored entry: non-empty, increasing, inside the commit log
    /// `[commit_log_min, commit_log_end)`. Returns `Err(reason)` on the first bad entry, else
    /// samples (logical offset, entry) to compare with the commit log: the first and last
    /// entry of every file.
    pub(crate) fn check_entries(
        &self,
        commit_log_min: u64,
        commit_log_end: u64,
    ) -> Result<std::result::Result<Vec<(u64, CqEntry)>, String>> {
        const CHUNK: usize = 16 * 1024;
        let (min, max) = (self.min_offset(), self.max_offset());
        let mut samples = Vec::new();
        let mut prev_end = 0u64;
        let mut cur = min;
        while cur < max {
            let entries = self.read(cur, CHUNK)?;
            if entries.is_empty() {
                return Ok(Err(format!("entries {cur}..{max} cannot be read")));
            }
            for e in &entries {
                let end = e.phys_offset.saturating_add(u64::from(e.size));
                if e.size == 0
                    || e.phys_offset < prev_end
                    || e.phys_offset < commit_log_min
                    || end > commit_log_end
                {
                    return Ok(Err(format!(
                        "entry {cur} (commit log offset {}, size {}) is out of order or outside the commit log",
                        e.phys_offset, e.size
                    )));
                }
                if cur == min || cur % self.file_entries == 0 {
                    samples.push((cur, *e));
                }
                if (cur + 1) % self.file_entries == 0 || cur + 1 == max {
                    samples.push((cur, *e));
                }
                prev_end = end;
                cur += 1;
            }
        }
        Ok(Ok(samples))
    }

    /// Reads entries `[offset, offset + max)` clipped to what is stored.
    pub(crate) fn read(&self, offset: u64, max: usize) -> Result<Vec<CqEntry>> {
        let max_off = self.max_offset();
        let min_off = self.min_offset();
        let mut out = Vec::new();
        if offset < min_off || offset >= max_off {
            return Ok(out);
        }
        let want = (max as u64).min(max_off - offset);
        let to = offset + want;
        let (written, tail) = {
            let p = self.pending.lock();
            let from = offset.max(p.written);
            let tail: Vec<CqEntry> = if to > from {
                let a = (from - p.written) as usize;
                let b = ((to - p.written) as usize).min(p.entries.len());
                p.entries
                    .get(a..b)
                    .map(<[CqEntry]>::to_vec)
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            (p.written, tail)
        };
        let files = self.files.read().clone();
        let file_to = to.min(written).max(offset);
        let mut cur = offset;
        while cur < file_to {
            let idx = files.partition_point(|f| f.first <= cur);
            let Some(f) = idx.checked_sub(1).and_then(|i| files.get(i)) else {
                break;
            };
            let in_file = cur - f.first;
            if in_file >= self.file_entries {
                break;
            }
            let n = (self.file_entries - in_file).min(file_to - cur);
            let mut buf = vec![0u8; (n * CQ_ENTRY_SIZE) as usize];
            f.file
                .read_exact_at(in_file * CQ_ENTRY_SIZE, &mut buf)
                .map_err(io_err("read consume queue", &f.path))?;
            out.extend(
                buf.chunks_exact(CQ_ENTRY_SIZE as usize)
                    .filter_map(CqEntry::decode),
            );
            cur += n;
        }
        if cur == file_to {
            out.extend(tail);
        }
        Ok(out)
    }

    /// The entry at `offset`, if stored.
    pub(crate) fn get(&self, offset: u64) -> Result<Option<CqEntry>> {
        Ok(self.read(offset, 1)?.into_iter().next())
    }

    /// Appends entries at the current max offset (single writer). They are buffered and
    /// written out in chunks, on [`Self::flush`] and before retention.
    pub(crate) fn append(&self, entries: &[CqEntry]) -> Result<()> {
        let mut p = self.pending.lock();
        let old_len = p.entries.len();
        p.entries.extend_from_slice(entries);
        let new_max = p.written + p.entries.len() as u64;
        if p.entries.len() >= PENDING_LIMIT {
            if let Err(e) = self.write_pending(&mut p) {
                p.entries.truncate(old_len);
                return Err(e);
            }
        }
        self.max_offset.store(new_max, Ordering::Release);
        Ok(())
    }

    /// Writes the buffered entries to the files. On error the buffer is kept (a retry
    /// rewrites the same bytes).
    fn write_pending(&self, p: &mut Pending) -> Result<()> {
        let mut cur = p.written;
        let mut i = 0;
        let mut buf = Vec::with_capacity(p.entries.len() * CQ_ENTRY_SIZE as usize);
        while i < p.entries.len() {
            let first = cur - cur % self.file_entries;
            let f = self.file_at(first)?;
            let room = (self.file_entries - (cur - first)) as usize;
            let n = room.min(p.entries.len() - i);
            buf.clear();
            for e in &p.entries[i..i + n] {
                e.encode(&mut buf);
            }
            f.file
                .write_all_at((cur - first) * CQ_ENTRY_SIZE, &buf)
                .map_err(io_err("write consume queue", &f.path))?;
            cur += n as u64;
            i += n;
        }
        p.written = cur;
        p.entries.clear();
        Ok(())
    }

    /// Writes buffered entries to the files (not fsynced).
    pub(crate) fn write_out(&self) -> Result<()> {
        let mut p = self.pending.lock();
        self.write_pending(&mut p)
    }

    fn file_at(&self, first: u64) -> Result<Arc<CqFile>> {
        if let Some(f) = self.files.read().iter().rev().find(|f| f.first == first) {
            return Ok(f.clone());
        }
        self.backend
            .create_dir_all(&self.dir)
            .map_err(io_err("create consume queue dir", &self.dir))?;
        let path = self.dir.join(file_name(first * CQ_ENTRY_SIZE));
        let file = self
            .backend
            .open(&path, true)
            .map_err(io_err("create consume queue", &path))?;
        let f = Arc::new(CqFile { first, file, path });
        let mut files = self.files.write();
        files.push(f.clone());
        files.sort_by_key(|f| f.first);
        Ok(f)
    }

    /// Makes all written entries durable.
    pub(crate) fn flush(&self) -> Result<()> {
        let target = {
            let mut p = self.pending.lock();
            self.write_pending(&mut p)?;
            p.written
        };
        let from = self.flushed.load(Ordering::Acquire);
        if target <= from {
            return Ok(());
        }
        let files: Vec<Arc<CqFile>> = self
            .files
            .read()
            .iter()
            .filter(|f| f.first + self.file_entries > from && f.first < target)
            .cloned()
            .collect();
        for f in files {
            f.file
                .sync()
                .map_err(io_err("fsync consume queue", &f.path))?;
        }
        self.flushed.fetch_max(target, Ordering::AcqRel);
        Ok(())
    }

    /// Retention: removes files whose every entry points below `commit_log_min`, and moves
    /// the min offset to the first entry at or above it.
    pub(crate) fn correct_min_offset(&self, commit_log_min: u64) -> Result<()> {
        self.write_out()?;
        loop {
            let files = self.files.read().clone();
            let Some(first) = files.first() else {
                let max = self.max_offset();
                self.min_offset.store(max, Ordering::Release);
                return Ok(());
            };
            let max = self.max_offset();
            let file_end = (first.first + self.file_entries).min(max);
            // Whole file behind the commit log start (and not the file being written)?
            if files.len() > 1 && file_end > first.first {
                if let Some(last) = self.read_raw(first, file_end - 1)? {
                    if last.phys_offset < commit_log_min {
                        self.backend
                            .remove_file(&first.path)
                            .map_err(io_err("remove consume queue", &first.path))?;
                        self.files.write().retain(|f| f.first != first.first);
                        continue;
                    }
                }
            }
            // Binary search the first entry at or above commit_log_min in this file.
            let (mut lo, mut hi) = (first.first, file_end);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                match self.read_raw(first, mid)? {
                    Some(e) if e.phys_offset < commit_log_min => lo = mid + 1,
                    _ => hi = mid,
                }
            }
            self.min_offset
                .store(lo.max(self.min_offset()).min(max), Ordering::Release);
            return Ok(());
        }
    }

    fn read_raw(&self, f: &CqFile, offset: u64) -> Result<Option<CqEntry>> {
        let mut b = [0u8; CQ_ENTRY_SIZE as usize];
        match f
            .file
            .read_exact_at((offset - f.first) * CQ_ENTRY_SIZE, &mut b)
        {
            Ok(()) => Ok(CqEntry::decode(&b)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(io_err("read consume queue", &f.path)(e)),
        }
    }

    /// Recovery of an empty queue whose first surviving record in the commit log has queue
    /// offset `offset` (older ones were removed by retention): the queue restarts there.
    pub(crate) fn reset_to(&self, offset: u64) -> Result<()> {
        let mut p = self.pending.lock();
        p.written = offset;
        p.entries.clear();
        let mut files = self.files.write();
        for f in files.drain(..) {
            self.backend
                .remove_file(&f.path)
                .map_err(io_err("remove consume queue", &f.path))?;
        }
        self.max_offset.store(offset, Ordering::Release);
        self.min_offset.store(offset, Ordering::Release);
        self.flushed.store(offset, Ordering::Release);
        Ok(())
    }

    /// Removes every file of this queue (topic deletion).
    pub(crate) fn destroy(&self) -> Result<()> {
        self.pending.lock().entries.clear();
        self.files.write().clear();
        self.backend
            .remove_dir_all(&self.dir)
            .map_err(io_err("remove consume queue dir", &self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemBackend;

    fn e(phys: u64) -> CqEntry {
        CqEntry {
            phys_offset: phys,
            size: 100,
            tag_code: phys as i64 * -3,
        }
    }

    #[test]
    fn append_read_across_files_and_reopen() {
        let be: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let dir = PathBuf::from("/cq/T/0");
        let cq = ConsumeQueue::open(be.clone(), dir.clone(), 4).unwrap();
        let entries: Vec<CqEntry> = (0..10).map(|i| e(i * 100)).collect();
        cq.append(&entries[..3]).unwrap();
        cq.append(&entries[3..]).unwrap();
        assert_eq!(cq.max_offset(), 10);
        assert_eq!(cq.read(2, 100).unwrap(), entries[2..].to_vec());
        assert_eq!(cq.get(9).unwrap(), Some(entries[9]));
        assert_eq!(cq.get(10).unwrap(), None);
        assert!(be.list(&dir).unwrap().is_empty(), "buffered until flush");
        cq.flush().unwrap();
        assert_eq!(be.list(&dir).unwrap().len(), 3);
        let cq = ConsumeQueue::open(be.clone(), dir, 4).unwrap();
        // commit log ends inside entry 7: entries 7.. are dropped
        assert_eq!(cq.recover(0, 750).unwrap(), (3, false));
        assert_eq!(cq.max_offset(), 7);
        assert_eq!(cq.read(0, 100).unwrap(), entries[..7].to_vec());
        // retention moves the min offset and deletes a whole file
        cq.correct_min_offset(500).unwrap();
        assert_eq!(cq.min_offset(), 5);
        assert_eq!(cq.read(4, 10).unwrap(), vec![]);
        assert_eq!(cq.read(5, 10).unwrap(), entries[5..7].to_vec());
    }

    #[test]
    fn truncate_phys_cuts_entries_durably_and_keeps_the_numbering() {
        let be: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let dir = PathBuf::from("/cq/T/2");
        let cq = ConsumeQueue::open(be.clone(), dir.clone(), 4).unwrap();
        cq.append(&(0..10).map(|i| e(i * 100)).collect::<Vec<_>>())
            .unwrap();
        // Entry 6 (600..700) ends above 650: it and the later ones go, some still buffered.
        cq.truncate_phys(650).unwrap();
        assert_eq!(cq.max_offset(), 6);
        assert_eq!(cq.read(0, 100).unwrap().len(), 6);
        cq.truncate_phys(650).unwrap();
        assert_eq!(cq.max_offset(), 6);
        cq.append(&[e(650)]).unwrap();
        cq.flush().unwrap();
        let again = ConsumeQueue::open(be.clone(), dir.clone(), 4).unwrap();
        again.recover(0, 10_000).unwrap();
        assert_eq!(again.max_offset(), 7);
        assert_eq!(again.get(6).unwrap(), Some(e(650)));
        // At a file start: the file goes, the numbering stays.
        again.truncate_phys(400).unwrap();
        assert_eq!(again.max_offset(), 4);
        assert_eq!(be.list(&dir).unwrap().len(), 1);
        let again = ConsumeQueue::open(be.clone(), dir.clone(), 4).unwrap();
        again.recover(0, 10_000).unwrap();
        assert_eq!(again.max_offset(), 4);
        // Every entry of a queue whose older files retention removed: the first file stays
        // (empty), and the queue still numbers from its min offset after a reopen.
        let dir = PathBuf::from("/cq/T/3");
        let cq = ConsumeQueue::open(be.clone(), dir.clone(), 4).unwrap();
        cq.append(&(0..10).map(|i| e(i * 100)).collect::<Vec<_>>())
            .unwrap();
        cq.correct_min_offset(800).unwrap();
        assert_eq!(cq.min_offset(), 8);
        cq.truncate_phys(800).unwrap();
        assert_eq!((cq.min_offset(), cq.max_offset()), (8, 8));
        cq.flush().unwrap();
        let again = ConsumeQueue::open(be.clone(), dir, 4).unwrap();
        again.recover(800, 10_000).unwrap();
        assert_eq!(again.max_offset(), 8);
        // The replicated numbering: past what waits for its dispatch.
        assert_eq!(again.next_offset(), 8);
        again.note_assigned(11);
        assert_eq!(again.next_offset(), 11);
        again.clear_assigned();
        assert_eq!(again.next_offset(), 8);
    }

    #[test]
    fn recover_drops_garbage_files() {
        let be: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let dir = PathBuf::from("/cq/T/1");
        let cq = ConsumeQueue::open(be.clone(), dir.clone(), 4).unwrap();
        cq.append(&(0..6).map(|i| e(i * 100)).collect::<Vec<_>>())
            .unwrap();
        cq.write_out().unwrap();
        let cq = ConsumeQueue::open(be.clone(), dir.clone(), 4).unwrap();
        cq.recover(0, 300).unwrap();
        assert_eq!(cq.max_offset(), 3);
        assert_eq!(be.list(&dir).unwrap().len(), 1);
        cq.append(&[e(300)]).unwrap();
        assert_eq!(cq.read(0, 10).unwrap().len(), 4);
    }
}
