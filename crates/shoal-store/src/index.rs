//! Message index by key: `topic#key` (each of the `KEYS` and the `UNIQ_KEY`) to commit log
//! offsets, for QUERY_MESSAGE and VIEW_MESSAGE_BY_ID by unique key.
//!
//! Design: an append-only *hash-chain log*. Each entry is 32 bytes, big-endian:
//! `key hash (u64, FNV-1a 64 of "topic#key") | commit log offset (u64) | store timestamp (i64)
//! | previous entry with the same hash (entry number + 1, 0 = none)`. Files in `index/` hold a
//! fixed number of entries and are named (20 digits) by their first entry number. The head of
//! every chain (hash -> newest entry) is kept in memory and rebuilt on open by one sequential
//! scan of the index files. A lookup walks the chain newest first; hashes can collide, so the
//! store checks every candidate against the record in the commit log. The index is derived
//! data: on recovery, entries past the commit log end are cut and missing ones are re-added by
//! re-dispatching the commit log tail.

use foldhash::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::{Backend, StoreFile};
use crate::commitlog::{file_name, parse_file_name};
use crate::error::{io_err, Result};

/// Size of one index entry.
pub const INDEX_ENTRY_SIZE: u64 = 32;

/// FNV-1a 64-bit hash of `topic#key`.
pub(crate) fn key_hash(topic: &str, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in topic
        .bytes()
        .chain(std::iter::once(b'#'))
        .chain(key.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IndexEntry {
    hash: u64,
    phys_offset: u64,
    store_timestamp: i64,
    prev: u64,
}

impl IndexEntry {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.hash.to_be_bytes());
        out.extend_from_slice(&self.phys_offset.to_be_bytes());
        out.extend_from_slice(&self.store_timestamp.to_be_bytes());
        out.extend_from_slice(&self.prev.to_be_bytes());
    }
    fn decode(b: &[u8]) -> Option<IndexEntry> {
        let word = |i: usize| -> Option<[u8; 8]> { b.get(i * 8..i * 8 + 8)?.try_into().ok() };
        Some(IndexEntry {
            hash: u64::from_be_bytes(word(0)?),
            phys_offset: u64::from_be_bytes(word(1)?),
            store_timestamp: i64::from_be_bytes(word(2)?),
            prev: u64::from_be_bytes(word(3)?),
        })
    }
}

#[derive(Debug)]
struct IndexFile {
    first: u64,
    file: Arc<dyn StoreFile>,
    path: PathBuf,
}

#[derive(Debug, Default)]
struct IndexState {
    files: Vec<IndexFile>,
    heads: HashMap<u64, u64>,
    /// Number of the next entry.
    next: u64,
    /// Entries `[written, next)` are in `pending`, not yet written to files.
    written: u64,
    pending: Vec<IndexEntry>,
    /// Entries below this number are durable.
    synced: u64,
    /// Commit log offset of the newest entry + 1 (records below were indexed).
    indexed_to: u64,
}

/// The key index.
#[derive(Debug)]
pub(crate) struct Index {
    backend: Arc<dyn Backend>,
    dir: PathBuf,
    file_entries: u64,
    state: Mutex<IndexState>,
}

impl Index {
    /// Opens the index in `dir`, keeping only entries that point below `commit_log_end`.
    /// Returns the index and the number of entries dropped.
    pub(crate) fn open(
        backend: Arc<dyn Backend>,
        dir: PathBuf,
        file_entries: u64,
        commit_log_end: u64,
    ) -> Result<(Self, u64)> {
        backend
            .create_dir_all(&dir)
            .map_err(io_err("create index dir", &dir))?;
        let mut st = IndexState::default();
        let mut names: Vec<(u64, String)> = backend
            .list(&dir)
            .map_err(io_err("list", &dir))?
            .into_iter()
            .filter_map(|n| parse_file_name(&n).map(|f| (f, n)))
            .collect();
        names.sort();
        let mut dropped = 0u64;
        let mut stop = false;
        for (first, name) in names {
            let path = dir.join(&name);
            if stop || (!st.files.is_empty() && first != st.next) {
                // After a cut, or a gap: later files are unusable.
                let file = backend
                    .open(&path, false)
                    .map_err(io_err("open index", &path))?;
                dropped += file.len().map_err(io_err("stat", &path))? / INDEX_ENTRY_SIZE;
                backend
                    .remove_file(&path)
                    .map_err(io_err("remove index", &path))?;
                stop = true;
                continue;
            }
            let file = backend
                .open(&path, false)
                .map_err(io_err("open index", &path))?;
            let len = file.len().map_err(io_err("stat", &path))?;
            let n = (len / INDEX_ENTRY_SIZE).min(file_entries);
            let mut buf = vec![0u8; (n * INDEX_ENTRY_SIZE) as usize];
            file.read_exact_at(0, &mut buf)
                .map_err(io_err("read index", &path))?;
            if st.files.is_empty() {
                st.next = first;
            }
            let mut valid = 0u64;
            for chunk in buf.chunks_exact(INDEX_ENTRY_SIZE as usize) {
                let Some(e) = IndexEntry::decode(chunk) else {
                    break;
                };
                if e.phys_offset >= commit_log_end
                    || (e.phys_offset < st.indexed_to.saturating_sub(1))
                    || e.prev > st.next
                {
                    break;
                }
                st.heads.insert(e.hash, st.next + 1);
                st.indexed_to = e.phys_offset + 1;
                st.next += 1;
                valid += 1;
            }
            if valid * INDEX_ENTRY_SIZE != len {
                dropped += len / INDEX_ENTRY_SIZE - valid;
                file.set_len(valid * INDEX_ENTRY_SIZE)
                    .map_err(io_err("truncate index", &path))?;
                file.sync().map_err(io_err("fsync index", &path))?;
                stop = valid < n || n < file_entries;
            }
            st.files.push(IndexFile { first, file, path });
        }
        st.written = st.next;
        st.synced = st.next;
        Ok((
            Index {
                backend,
                dir,
                file_entries,
                state: Mutex::new(st),
            },
            dropped,
        ))
    }

    /// Records at or above this commit log offset may not be indexed yet.
    pub(crate) fn indexed_to(&self) -> u64 {
        self.state.lock().indexed_to
    }

    /// Adds `topic#key -> phys_offset` (buffered; written on [`Self::flush`] or when the
    /// buffer grows).
    pub(crate) fn put(
        &self,
        topic: &str,
        key: &str,
        phys_offset: u64,
        store_timestamp: i64,
    ) -> Result<()> {
        let hash = key_hash(topic, key);
        let mut st = self.state.lock();
        let prev = st.heads.get(&hash).copied().unwrap_or(0);
        let number = st.next;
        st.pending.push(IndexEntry {
            hash,
            phys_offset,
            store_timestamp,
            prev,
        });
        st.heads.insert(hash, number + 1);
        st.next += 1;
        st.indexed_to = st.indexed_to.max(phys_offset + 1);
        if st.pending.len() >= 4096 {
            self.write_pending(&mut st)?;
        }
        Ok(())
    }

    fn write_pending(&self, st: &mut IndexState) -> Result<()> {
        let mut buf = Vec::new();
        while !st.pending.is_empty() {
            let cur = st.written;
            let first = cur - cur % self.file_entries;
            if st.files.last().map(|f| f.first) != Some(first) {
                let path = self.dir.join(file_name(first));
                let file = self
                    .backend
                    .open(&path, true)
                    .map_err(io_err("create index", &path))?;
                st.files.push(IndexFile { first, file, path });
            }
            let room = (self.file_entries - (cur - first)) as usize;
            let n = room.min(st.pending.len());
            buf.clear();
            for e in &st.pending[..n] {
                e.encode(&mut buf);
            }
            if let Some(f) = st.files.last() {
                f.file
                    .write_all_at((cur - first) * INDEX_ENTRY_SIZE, &buf)
                    .map_err(io_err("write index", &f.path))?;
            }
            st.pending.drain(..n);
            st.written += n as u64;
        }
        Ok(())
    }

    /// Writes buffered entries and makes them durable.
    pub(crate) fn flush(&self) -> Result<()> {
        let mut st = self.state.lock();
        self.write_pending(&mut st)?;
        let synced = st.synced;
        for f in st
            .files
            .iter()
            .filter(|f| f.first + self.file_entries > synced)
        {
            f.file.sync().map_err(io_err("fsync index", &f.path))?;
        }
        st.synced = st.written;
        Ok(())
    }

    fn entry(&self, st: &IndexState, number: u64) -> Result<Option<IndexEntry>> {
        if number >= st.written {
            return Ok(st.pending.get((number - st.written) as usize).copied());
        }
        let idx = st.files.partition_point(|f| f.first <= number);
        let Some(f) = idx.checked_sub(1).and_then(|i| st.files.get(i)) else {
            return Ok(None);
        };
        let mut b = [0u8; INDEX_ENTRY_SIZE as usize];
        match f
            .file
            .read_exact_at((number - f.first) * INDEX_ENTRY_SIZE, &mut b)
        {
            Ok(()) => Ok(IndexEntry::decode(&b)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(io_err("read index", &f.path)(e)),
        }
    }

    /// Candidate commit log offsets for `topic#key`, newest first, with store timestamp in
    /// `[begin, end]`, at most `max_candidates`. Candidates must be verified against the log.
    pub(crate) fn lookup(
        &self,
        topic: &str,
        key: &str,
        max_candidates: usize,
        begin: i64,
        end: i64,
    ) -> Result<Vec<u64>> {
        let hash = key_hash(topic, key);
        let st = self.state.lock();
        let first_kept = st.files.first().map_or(st.written, |f| f.first);
        let mut out = Vec::new();
        let mut link = st.heads.get(&hash).copied().unwrap_or(0);
        let mut steps = 0usize;
        while link > 0 && out.len() < max_candidates && steps < 1_000_000 {
            let number = link - 1;
            if number < first_kept {
                break;
            }
            let Some(e) = self.entry(&st, number)? else {
                break;
            };
            if e.prev >= link {
                break; // corrupt chain: links must go backwards
            }
            if e.hash == hash && e.store_timestamp >= begin && e.store_timestamp <= end {
                out.push(e.phys_offset);
            }
            link = e.prev;
            steps += 1;
        }
        Ok(out)
    }

    /// Retention: deletes index files whose every entry points below `commit_log_min`.
    pub(crate) fn delete_before(&self, commit_log_min: u64) -> Result<usize> {
        let mut st = self.state.lock();
        let mut deleted = 0;
        while st.files.len() > 1 {
            let Some(f) = st.files.first() else { break };
            let last_number = f.first + self.file_entries - 1;
            let Some(last) = self.entry(&st, last_number)? else {
                break;
            };
            if last.phys_offset >= commit_log_min {
                break;
            }
            self.backend
                .remove_file(&f.path)
                .map_err(io_err("remove index", &f.path))?;
            st.files.remove(0);
            deleted += 1;
        }
        if deleted > 0 {
            let first_kept = st.files.first().map_or(st.written, |f| f.first);
            st.heads.retain(|_, link| *link > first_kept);
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemBackend;

    #[test]
    fn chains_survive_reopen_and_cut() {
        let be: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let dir = PathBuf::from("/idx");
        let (idx, _) = Index::open(be.clone(), dir.clone(), 3, 0).unwrap();
        for i in 0..10u64 {
            idx.put(
                "T",
                if i % 2 == 0 { "even" } else { "odd" },
                i * 100,
                i as i64,
            )
            .unwrap();
        }
        assert_eq!(
            idx.lookup("T", "even", 100, 0, i64::MAX).unwrap(),
            vec![800, 600, 400, 200, 0]
        );
        assert_eq!(
            idx.lookup("T", "odd", 2, 0, i64::MAX).unwrap(),
            vec![900, 700]
        );
        assert_eq!(idx.lookup("T", "odd", 10, 2, 5).unwrap(), vec![500, 300]);
        assert!(idx.lookup("U", "odd", 10, 0, i64::MAX).unwrap().is_empty());
        idx.flush().unwrap();
        // reopen with the commit log cut at 650: entries >= 650 are dropped
        let (idx, dropped) = Index::open(be.clone(), dir.clone(), 3, 650).unwrap();
        assert_eq!(dropped, 3);
        assert_eq!(idx.indexed_to(), 601);
        assert_eq!(
            idx.lookup("T", "even", 100, 0, i64::MAX).unwrap(),
            vec![600, 400, 200, 0]
        );
        idx.put("T", "even", 700, 7).unwrap();
        assert_eq!(idx.lookup("T", "even", 1, 0, i64::MAX).unwrap(), vec![700]);
        idx.flush().unwrap();
        assert_eq!(idx.delete_before(350).unwrap(), 1);
        assert_eq!(
            idx.lookup("T", "even", 100, 0, i64::MAX).unwrap(),
            vec![700, 600, 400]
        );
    }
}
