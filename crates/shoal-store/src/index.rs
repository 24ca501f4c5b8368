//! Message index by key: `topic#key` (each of the `KEYS` and the `UNIQ_KEY`) to commit log
//! offsets, for QUERY_MESSAGE and VIEW_MESSAGE_BY_ID by unique key.
//!
//! Design: index files of a fixed number of 32-byte entries, each with its own hash slot
//! table (RocketMQ's index file model). An entry is, big-endian: `key hash (u64, FNV-1a 64 of
//! "topic#key") | commit log offset (u64) | store timestamp (i64) | previous entry of the same
//! slot in the same file (local entry number + 1, 0 = none)`. A key's slot is `hash % slots`;
//! the slot table holds, per slot, the file's newest entry in that slot (local number + 1).
//! Files in `keyindex/` are named (20 digits) by the global number of their first entry.
//!
//! The newest file is the *active* one: its entries are appended (buffered, written in
//! chunks and on flush) and its slot table lives in memory. When it is full, its table is
//! written after its entries, followed by a trailer (magic, entry count, slot count, CRC32 of
//! the table), and the file is *sealed*. So the memory the index holds is one slot table
//! (`slots * 4` bytes), whatever the number of keys, and opening reads only the trailers of
//! sealed files and the entries of the active one.
//!
//! A lookup walks the files newest first, each from its slot through the slot's chain; slots
//! and hashes collide, so the store checks every candidate against the record in the commit
//! log. The index is derived data: on open, entries past the commit log end are cut and
//! missing ones are re-added by re-dispatching the commit log tail. The format of earlier
//! versions (`index/`, one chain per hash with every chain head in memory) is converted on
//! open.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::backend::{Backend, StoreFile};
use crate::commitlog::{file_name, parse_file_name};
use crate::error::{io_err, Result};
use crate::StoreError;

/// Size of one index entry.
pub const INDEX_ENTRY_SIZE: u64 = 32;

/// Size of the trailer after a sealed file's slot table.
const TRAILER_SIZE: u64 = 16;

/// "SHIX": the trailer's magic number.
const TRAILER_MAGIC: u32 = 0x5348_4958;

/// Entries buffered before they are written.
const WRITE_CHUNK: usize = 4096;

/// Most entries a lookup visits (a guard against a corrupt chain).
const MAX_LOOKUP_STEPS: usize = 1_000_000;

/// FNV-1a 64-bit hash of `topic#key`.
pub(crate) fn key_hash(topic: &str, key: &str) -> u64 {
    key_hash_continue(key_hash_prefix(topic), key)
}

/// The state of [`key_hash`] after `topic#`, for many keys of one topic.
pub(crate) fn key_hash_prefix(topic: &str) -> u64 {
    fnv1a(fnv1a(0xcbf2_9ce4_8422_2325, topic.as_bytes()), b"#")
}

/// [`key_hash`] of `key` from the state [`key_hash_prefix`] gave for its topic.
#[inline]
pub(crate) fn key_hash_continue(prefix: u64, key: &str) -> u64 {
    fnv1a(prefix, key.as_bytes())
}

#[inline]
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Slots of a file of `entries` entries: a quarter of its entries (RocketMQ: 5 M slots for
/// 20 M entries), at least one.
fn slots_for(entries: u64) -> u64 {
    (entries / 4).max(1)
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

/// Where a sealed file's slot table is, and how many entries the file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sealed {
    entries: u64,
    slots: u64,
}

impl Sealed {
    fn table_offset(&self) -> u64 {
        self.entries * INDEX_ENTRY_SIZE
    }
    fn file_len(&self) -> u64 {
        self.table_offset() + self.slots * 4 + TRAILER_SIZE
    }
}

/// The slot table and trailer of a sealed file.
fn encode_table(slots: &[u32], entries: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(slots.len() * 4 + TRAILER_SIZE as usize);
    for s in slots {
        out.extend_from_slice(&s.to_be_bytes());
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out);
    crc.update(&(entries as u32).to_be_bytes());
    crc.update(&(slots.len() as u32).to_be_bytes());
    let crc = crc.finalize();
    out.extend_from_slice(&TRAILER_MAGIC.to_be_bytes());
    out.extend_from_slice(&(entries as u32).to_be_bytes());
    out.extend_from_slice(&(slots.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

#[derive(Debug)]
struct IndexFile {
    first: u64,
    file: Arc<dyn StoreFile>,
    path: PathBuf,
    /// `Some` once the file is full and its slot table written.
    sealed: Option<Sealed>,
}

#[derive(Debug, Default)]
struct IndexState {
    /// Oldest first. All but the last are sealed; the last is sealed or the active file.
    files: Vec<IndexFile>,
    /// Global number of the active file's first entry (the file may not exist yet).
    active_first: u64,
    /// The active file's slot table.
    slots: Vec<u32>,
    /// Number of the next entry.
    next: u64,
    /// Entries `[written, next)` are in `pending`, not yet written to the active file.
    written: u64,
    pending: Vec<IndexEntry>,
    /// Entries below this number are durable.
    synced: u64,
    /// Commit log offset of the newest entry + 1 (records below were indexed).
    indexed_to: u64,
    /// `put_all`'s list of (hash, commit log offset), kept for the next call.
    batch: Vec<(u64, u64)>,
}

impl IndexState {
    /// Entries of `f` (sealed: its count; active: those numbered so far).
    fn count(&self, f: &IndexFile) -> u64 {
        f.sealed.map_or(self.next - f.first, |s| s.entries)
    }
}

/// The key index.
#[derive(Debug)]
pub(crate) struct Index {
    backend: Arc<dyn Backend>,
    dir: PathBuf,
    file_entries: u64,
    state: Mutex<IndexState>,
}

/// Whether an entry read back is plausible after the entries before it: it points below the
/// commit log end, not below the previous entry's record, and links backwards in its file.
fn valid_after(e: &IndexEntry, local: u64, commit_log_end: u64, indexed_to: u64) -> bool {
    e.phys_offset < commit_log_end
        && e.phys_offset >= indexed_to.saturating_sub(1)
        && e.prev <= local
}

impl Index {
    /// Opens the index in `dir` (the data directory's `keyindex/`; a legacy `index/` beside it
    /// is converted), keeping only entries that point below `commit_log_end`. Returns the
    /// index and the number of entries dropped.
    pub(crate) fn open(
        backend: Arc<dyn Backend>,
        dir: PathBuf,
        legacy_dir: &Path,
        file_entries: u64,
        commit_log_end: u64,
    ) -> Result<(Self, u64)> {
        if file_entries == 0 || file_entries > u64::from(u32::MAX) {
            return Err(StoreError::InvalidArgument(format!(
                "index_file_entries must be between 1 and {}, not {file_entries}",
                u32::MAX
            )));
        }
        let legacy = backend.exists(legacy_dir);
        if legacy {
            // A conversion that did not finish left a partial new index: start it again.
            backend
                .remove_dir_all(&dir)
                .map_err(io_err("remove partial index", &dir))?;
        }
        backend
            .create_dir_all(&dir)
            .map_err(io_err("create index dir", &dir))?;
        let nslots = slots_for(file_entries) as usize;
        let idx = Index {
            backend,
            dir,
            file_entries,
            state: Mutex::new(IndexState {
                slots: vec![0; nslots],
                ..IndexState::default()
            }),
        };
        let mut dropped = idx.load(commit_log_end)?;
        if legacy {
            dropped += idx.convert_legacy(legacy_dir, commit_log_end)?;
        }
        {
            // The newest record may have only some of its keys written (a crash between two
            // writes, one of them sealing a file): recovery indexes it again from the log,
            // and lookups drop the repeated candidates.
            let mut st = idx.state.lock();
            st.indexed_to = st.indexed_to.saturating_sub(1);
        }
        Ok((idx, dropped))
    }

    fn sorted_files(&self, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
        let mut names: Vec<(u64, PathBuf)> = self
            .backend
            .list(dir)
            .map_err(io_err("list", dir))?
            .into_iter()
            .filter_map(|n| parse_file_name(&n).map(|f| (f, dir.join(n))))
            .collect();
        names.sort();
        Ok(names)
    }

    /// Reads the files of `keyindex/`: sealed ones by their trailer, the active one entry by
    /// entry. Returns the number of entries dropped.
    fn load(&self, commit_log_end: u64) -> Result<u64> {
        let mut st = self.state.lock();
        self.load_locked(&mut st, commit_log_end)
    }

    /// Cuts the entries of records at or above `end` (durably), as opening with a commit log
    /// ending at `end` does: the buffered entries are written, the files read again and cut.
    pub(crate) fn truncate(&self, end: u64) -> Result<()> {
        let mut st = self.state.lock();
        if st.indexed_to < end {
            return Ok(());
        }
        self.write_pending(&mut st)?;
        let nslots = st.slots.len();
        *st = IndexState {
            slots: vec![0; nslots],
            ..IndexState::default()
        };
        self.load_locked(&mut st, end)?;
        Ok(())
    }

    /// Removes every index file: the index starts empty.
    pub(crate) fn clear(&self) -> Result<()> {
        let mut st = self.state.lock();
        for f in st.files.drain(..) {
            self.backend
                .remove_file(&f.path)
                .map_err(io_err("remove index", &f.path))?;
        }
        // Files not yet known (never written) cannot exist; any other is stale.
        for (_, path) in self.sorted_files(&self.dir)? {
            self.backend
                .remove_file(&path)
                .map_err(io_err("remove index", &path))?;
        }
        let nslots = st.slots.len();
        *st = IndexState {
            slots: vec![0; nslots],
            ..IndexState::default()
        };
        Ok(())
    }

    fn load_locked(&self, st: &mut IndexState, commit_log_end: u64) -> Result<u64> {
        let mut dropped = 0u64;
        let mut stop = false;
        let files = self.sorted_files(&self.dir)?;
        let last_sealed_candidate = files.len().saturating_sub(1);
        for (i, (first, path)) in files.into_iter().enumerate() {
            let file = self
                .backend
                .open(&path, false)
                .map_err(io_err("open index", &path))?;
            let len = file.len().map_err(io_err("stat", &path))?;
            if stop || (!st.files.is_empty() && first != st.next) {
                // After a cut, or a gap: later files are unusable.
                dropped += len / INDEX_ENTRY_SIZE;
                self.backend
                    .remove_file(&path)
                    .map_err(io_err("remove index", &path))?;
                stop = true;
                continue;
            }
            if st.files.is_empty() {
                st.next = first;
                st.active_first = first;
            }
            // The two newest files have their table checked too (the newest sealed one may
            // have been sealed after the last flush and torn by a crash); older sealed files
            // were flushed before a newer one filled.
            let check_table = i + 1 >= last_sealed_candidate;
            if let Some(sealed) =
                self.sealed_trailer(&*file, len, commit_log_end, st, check_table)?
            {
                let last = first + sealed.entries - 1;
                if let Some(e) = read_entry(&*file, &path, sealed.entries - 1)? {
                    st.indexed_to = e.phys_offset + 1;
                }
                st.next = last + 1;
                st.active_first = st.next;
                st.files.push(IndexFile {
                    first,
                    file,
                    path,
                    sealed: Some(sealed),
                });
                continue;
            }
            // The active file, or a full one whose table is missing or torn (its entries are
            // read and its table built again).
            let entries_len = len.min(self.file_entries * INDEX_ENTRY_SIZE);
            let n = entries_len / INDEX_ENTRY_SIZE;
            let mut buf = vec![0u8; (n * INDEX_ENTRY_SIZE) as usize];
            file.read_exact_at(0, &mut buf)
                .map_err(io_err("read index", &path))?;
            st.slots.fill(0);
            let nslots = st.slots.len() as u64;
            let mut valid = 0u64;
            for chunk in buf.chunks_exact(INDEX_ENTRY_SIZE as usize) {
                let Some(e) = IndexEntry::decode(chunk) else {
                    break;
                };
                if !valid_after(&e, valid, commit_log_end, st.indexed_to) {
                    break;
                }
                st.slots[(e.hash % nslots) as usize] = (valid + 1) as u32;
                st.indexed_to = e.phys_offset + 1;
                valid += 1;
            }
            if valid * INDEX_ENTRY_SIZE != len {
                dropped += n - valid;
                file.set_len(valid * INDEX_ENTRY_SIZE)
                    .map_err(io_err("truncate index", &path))?;
                file.sync().map_err(io_err("fsync index", &path))?;
            }
            st.next = first + valid;
            st.active_first = first;
            st.files.push(IndexFile {
                first,
                file,
                path,
                sealed: None,
            });
            if valid == self.file_entries {
                st.written = st.next;
                self.seal(st)?;
            } else {
                // The active file is the last one kept.
                stop = true;
            }
        }
        st.written = st.next;
        st.synced = st.next;
        Ok(dropped)
    }

    /// The trailer of a sealed file, if it has a valid one and its entries stay below the
    /// commit log end; `check_table` also checks the table's CRC.
    fn sealed_trailer(
        &self,
        file: &dyn StoreFile,
        len: u64,
        commit_log_end: u64,
        st: &IndexState,
        check_table: bool,
    ) -> Result<Option<Sealed>> {
        if len < TRAILER_SIZE + INDEX_ENTRY_SIZE {
            return Ok(None);
        }
        let mut t = [0u8; TRAILER_SIZE as usize];
        if file.read_exact_at(len - TRAILER_SIZE, &mut t).is_err() {
            return Ok(None);
        }
        let word = |i: usize| u32::from_be_bytes([t[i], t[i + 1], t[i + 2], t[i + 3]]);
        let sealed = Sealed {
            entries: u64::from(word(4)),
            slots: u64::from(word(8)),
        };
        if word(0) != TRAILER_MAGIC
            || sealed.entries == 0
            || sealed.slots == 0
            || sealed.file_len() != len
        {
            return Ok(None);
        }
        // The first and last entries must fit the log (a cut log cuts the file too).
        let (Ok(Some(first)), Ok(Some(last))) = (
            read_entry(file, Path::new(""), 0),
            read_entry(file, Path::new(""), sealed.entries - 1),
        ) else {
            return Ok(None);
        };
        if !valid_after(&first, 0, commit_log_end, st.indexed_to)
            || !valid_after(
                &last,
                sealed.entries - 1,
                commit_log_end,
                first.phys_offset + 1,
            )
        {
            return Ok(None);
        }
        if check_table {
            let mut table = vec![0u8; (sealed.slots * 4) as usize];
            if file
                .read_exact_at(sealed.table_offset(), &mut table)
                .is_err()
            {
                return Ok(None);
            }
            let mut crc = crc32fast::Hasher::new();
            crc.update(&table);
            crc.update(&t[4..12]);
            if crc.finalize() != word(12) {
                return Ok(None);
            }
        }
        Ok(Some(sealed))
    }

    /// Converts the index of earlier versions (`index/`: the same entries, chained by hash)
    /// into this format, then removes it. Returns the number of its entries dropped (past the
    /// commit log end).
    fn convert_legacy(&self, legacy_dir: &Path, commit_log_end: u64) -> Result<u64> {
        let files = self.sorted_files(legacy_dir)?;
        let mut dropped = 0u64;
        let mut expected: Option<u64> = None;
        let mut converted = 0u64;
        {
            let mut st = self.state.lock();
            let mut stop = false;
            for (first, path) in files {
                let file = self
                    .backend
                    .open(&path, false)
                    .map_err(io_err("open legacy index", &path))?;
                let len = file.len().map_err(io_err("stat", &path))?;
                if stop || expected.is_some_and(|e| e != first) {
                    dropped += len / INDEX_ENTRY_SIZE;
                    stop = true;
                    continue;
                }
                let n = len / INDEX_ENTRY_SIZE;
                let mut buf = vec![0u8; (n * INDEX_ENTRY_SIZE) as usize];
                file.read_exact_at(0, &mut buf)
                    .map_err(io_err("read legacy index", &path))?;
                let mut valid = 0u64;
                for chunk in buf.chunks_exact(INDEX_ENTRY_SIZE as usize) {
                    let Some(e) = IndexEntry::decode(chunk) else {
                        break;
                    };
                    if e.phys_offset >= commit_log_end
                        || e.phys_offset < st.indexed_to.saturating_sub(1)
                    {
                        break;
                    }
                    self.push(&mut st, e.hash, e.phys_offset, e.store_timestamp)?;
                    valid += 1;
                }
                converted += valid;
                if valid < n {
                    dropped += n - valid;
                    stop = true;
                }
                expected = Some(first + n);
            }
        }
        self.flush()?;
        self.backend
            .remove_dir_all(legacy_dir)
            .map_err(io_err("remove legacy index", legacy_dir))?;
        tracing::info!(
            converted,
            dropped,
            "key index converted to per-file slot tables (keyindex/); the old index/ is removed"
        );
        Ok(dropped)
    }

    /// Records at or above this commit log offset may not be (wholly) indexed yet.
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
        self.push(&mut st, hash, phys_offset, store_timestamp)
    }

    /// [`Index::put`] for many keys of one store time, under one lock: `fill` pushes each
    /// key's `(hash, commit log offset)` ([`key_hash`]) onto the list it is given.
    pub(crate) fn put_all(
        &self,
        fill: impl FnOnce(&mut Vec<(u64, u64)>),
        store_timestamp: i64,
    ) -> Result<()> {
        let mut st = self.state.lock();
        let mut batch = std::mem::take(&mut st.batch);
        fill(&mut batch);
        let result = self.put_batch(&mut st, &batch, store_timestamp);
        batch.clear();
        if batch.capacity() > WRITE_CHUNK {
            batch = Vec::new();
        }
        st.batch = batch;
        result
    }

    fn put_batch(
        &self,
        st: &mut IndexState,
        keys: &[(u64, u64)],
        store_timestamp: i64,
    ) -> Result<()> {
        // The slot table is large (one u32 per slot) and keys land anywhere in it: read every
        // slot first, so the cache misses of a batch overlap instead of coming one by one;
        // the pushes then find the slots in the cache.
        let n = st.slots.len() as u64;
        let mut touched = 0u32;
        for (hash, _) in keys {
            touched ^= st.slots[(hash % n) as usize];
        }
        std::hint::black_box(touched);
        for &(hash, phys_offset) in keys {
            self.push(st, hash, phys_offset, store_timestamp)?;
        }
        Ok(())
    }

    fn push(
        &self,
        st: &mut IndexState,
        hash: u64,
        phys_offset: u64,
        store_timestamp: i64,
    ) -> Result<()> {
        let local = st.next - st.active_first;
        let slot = (hash % st.slots.len() as u64) as usize;
        let prev = u64::from(st.slots[slot]);
        st.pending.push(IndexEntry {
            hash,
            phys_offset,
            store_timestamp,
            prev,
        });
        st.slots[slot] = (local + 1) as u32;
        st.next += 1;
        st.indexed_to = st.indexed_to.max(phys_offset + 1);
        if st.next - st.active_first >= self.file_entries {
            self.seal(st)?;
        } else if st.pending.len() >= WRITE_CHUNK {
            self.write_pending(st)?;
        }
        Ok(())
    }

    /// Writes the buffered entries to the active file (created on its first write).
    fn write_pending(&self, st: &mut IndexState) -> Result<()> {
        if st.pending.is_empty() {
            return Ok(());
        }
        let first = st.active_first;
        let exists = st
            .files
            .last()
            .is_some_and(|f| f.sealed.is_none() && f.first == first);
        if !exists {
            let path = self.dir.join(file_name(first));
            let file = self
                .backend
                .open(&path, true)
                .map_err(io_err("create index", &path))?;
            st.files.push(IndexFile {
                first,
                file,
                path,
                sealed: None,
            });
        }
        let mut buf = Vec::with_capacity(st.pending.len() * INDEX_ENTRY_SIZE as usize);
        for e in &st.pending {
            e.encode(&mut buf);
        }
        if let Some(f) = st.files.last() {
            f.file
                .write_all_at((st.written - first) * INDEX_ENTRY_SIZE, &buf)
                .map_err(io_err("write index", &f.path))?;
        }
        st.written += st.pending.len() as u64;
        st.pending.clear();
        Ok(())
    }

    /// Seals the full active file: its entries, then its slot table and trailer; the next
    /// entry begins a new file.
    fn seal(&self, st: &mut IndexState) -> Result<()> {
        self.write_pending(st)?;
        let entries = st.next - st.active_first;
        let bytes = encode_table(&st.slots, entries);
        let sealed = Sealed {
            entries,
            slots: st.slots.len() as u64,
        };
        if let Some(f) = st.files.last_mut() {
            f.file
                .write_all_at(sealed.table_offset(), &bytes)
                .map_err(io_err("write index table", &f.path))?;
            f.sealed = Some(sealed);
        }
        st.slots.fill(0);
        st.active_first = st.next;
        Ok(())
    }

    /// Writes buffered entries and makes them durable.
    pub(crate) fn flush(&self) -> Result<()> {
        let mut st = self.state.lock();
        self.write_pending(&mut st)?;
        let synced = st.synced;
        for f in st.files.iter().filter(|f| f.first + st.count(f) > synced) {
            f.file.sync().map_err(io_err("fsync index", &f.path))?;
        }
        st.synced = st.written;
        Ok(())
    }

    /// Entry `local` of the active file: buffered, or written to its file.
    fn active_entry(&self, st: &IndexState, local: u64) -> Result<Option<IndexEntry>> {
        let number = st.active_first + local;
        if number >= st.written {
            return Ok(st.pending.get((number - st.written) as usize).copied());
        }
        match st.files.last() {
            Some(f) if f.sealed.is_none() && f.first == st.active_first => {
                read_entry(&*f.file, &f.path, local)
            }
            _ => Ok(None),
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
        let mut out = Vec::new();
        let mut steps = 0usize;
        // Follows one file's chain from `link`; false once the lookup is done.
        let mut walk = |mut link: u64,
                        count: u64,
                        entry: &dyn Fn(u64) -> Result<Option<IndexEntry>>|
         -> Result<bool> {
            while link > 0 && link <= count {
                if out.len() >= max_candidates || steps >= MAX_LOOKUP_STEPS {
                    return Ok(false);
                }
                let Some(e) = entry(link - 1)? else {
                    break;
                };
                if e.prev >= link {
                    break; // corrupt chain: links must go backwards
                }
                if e.hash == hash
                    && e.store_timestamp >= begin
                    && e.store_timestamp <= end
                    && !out.contains(&e.phys_offset)
                {
                    out.push(e.phys_offset);
                }
                link = e.prev;
                steps += 1;
            }
            Ok(true)
        };
        let head = u64::from(st.slots[(hash % st.slots.len() as u64) as usize]);
        let active = st.next - st.active_first;
        if !walk(head, active, &|local| self.active_entry(&st, local))? {
            return Ok(out);
        }
        for f in st.files.iter().rev() {
            let Some(sealed) = f.sealed else { continue };
            let mut b = [0u8; 4];
            f.file
                .read_exact_at(sealed.table_offset() + (hash % sealed.slots) * 4, &mut b)
                .map_err(io_err("read index table", &f.path))?;
            let head = u64::from(u32::from_be_bytes(b));
            if !walk(head, sealed.entries, &|local| {
                read_entry(&*f.file, &f.path, local)
            })? {
                break;
            }
        }
        Ok(out)
    }

    /// Retention: deletes sealed index files whose every entry points below `commit_log_min`.
    pub(crate) fn delete_before(&self, commit_log_min: u64) -> Result<usize> {
        let mut st = self.state.lock();
        let mut deleted = 0;
        while st.files.len() > 1 {
            let Some(f) = st.files.first() else { break };
            let Some(sealed) = f.sealed else { break };
            let Some(last) = read_entry(&*f.file, &f.path, sealed.entries - 1)? else {
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
        Ok(deleted)
    }
}

/// Entry `local` of a file (`None` past its end).
fn read_entry(file: &dyn StoreFile, path: &Path, local: u64) -> Result<Option<IndexEntry>> {
    let mut b = [0u8; INDEX_ENTRY_SIZE as usize];
    match file.read_exact_at(local * INDEX_ENTRY_SIZE, &mut b) {
        Ok(()) => Ok(IndexEntry::decode(&b)),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(io_err("read index", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemBackend;

    #[test]
    fn key_hash_is_fnv1a_of_topic_hash_key() {
        // The hash is stored in index files: it must not change. FNV-1a 64 of
        // "TopicTest#7F0000010C6318B4AAC2191FD5F80000", computed independently.
        assert_eq!(
            key_hash("TopicTest", "7F0000010C6318B4AAC2191FD5F80000"),
            0x81d1_b989_0b40_12ad
        );
        assert_eq!(
            key_hash("", ""),
            (0xcbf2_9ce4_8422_2325_u64 ^ 0x23).wrapping_mul(0x100_0000_01b3)
        );
    }

    fn open(be: &Arc<dyn Backend>, entries: u64, end: u64) -> (Index, u64) {
        Index::open(
            be.clone(),
            PathBuf::from("/keyindex"),
            Path::new("/index"),
            entries,
            end,
        )
        .unwrap()
    }

    #[test]
    fn truncate_cuts_sealed_and_active_entries_and_puts_go_on() {
        let be: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let (idx, _) = open(&be, 4, 0);
        for i in 0..10u64 {
            let key = if i % 2 == 0 { "even" } else { "odd" };
            idx.put("T", key, i * 100, i as i64).unwrap();
        }
        // Nothing at or above 1000: nothing to cut.
        idx.truncate(1000).unwrap();
        assert_eq!(idx.lookup("T", "odd", 100, 0, i64::MAX).unwrap().len(), 5);
        // Into the second (sealed) file: it becomes the active one again, the third goes.
        idx.truncate(550).unwrap();
        assert_eq!(
            idx.lookup("T", "even", 100, 0, i64::MAX).unwrap(),
            vec![400, 200, 0]
        );
        assert_eq!(
            idx.lookup("T", "odd", 100, 0, i64::MAX).unwrap(),
            vec![500, 300, 100]
        );
        idx.put("T", "odd", 560, 6).unwrap();
        idx.put("T", "even", 600, 7).unwrap();
        idx.put("T", "even", 700, 8).unwrap();
        assert_eq!(
            idx.lookup("T", "even", 100, 0, i64::MAX).unwrap(),
            vec![700, 600, 400, 200, 0]
        );
        idx.flush().unwrap();
        let (idx, dropped) = open(&be, 4, 800);
        assert_eq!(dropped, 0);
        assert_eq!(
            idx.lookup("T", "odd", 100, 0, i64::MAX).unwrap(),
            vec![560, 500, 300, 100]
        );
        idx.clear().unwrap();
        assert!(idx.lookup("T", "odd", 100, 0, i64::MAX).unwrap().is_empty());
        idx.put("T", "odd", 5000, 9).unwrap();
        idx.flush().unwrap();
        let (idx, _) = open(&be, 4, 6000);
        assert_eq!(idx.lookup("T", "odd", 10, 0, i64::MAX).unwrap(), vec![5000]);
    }

    #[test]
    fn chains_survive_reopen_and_cut() {
        let be: Arc<dyn Backend> = Arc::new(MemBackend::new());
        let (idx, _) = open(&be, 3, 0);
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
        let (idx, dropped) = open(&be, 3, 650);
        assert_eq!(dropped, 3);
        assert_eq!(idx.indexed_to(), 600, "the newest record is indexed again");
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

    #[test]
    fn memory_is_one_slot_table_and_sealed_files_open_by_their_trailer() {
        let mem = Arc::new(MemBackend::new());
        let be: Arc<dyn Backend> = mem.clone();
        let (idx, _) = open(&be, 64, u64::MAX);
        for i in 0..1000u64 {
            idx.put("T", &format!("k{}", i % 300), i, i as i64).unwrap();
        }
        {
            let st = idx.state.lock();
            assert_eq!(st.slots.len(), 16, "a quarter of the file's entries");
            assert_eq!(st.files.iter().filter(|f| f.sealed.is_some()).count(), 15);
            assert!(st.pending.len() < 64);
        }
        let want = |k: u64| -> Vec<u64> { (0..1000).rev().filter(|i| i % 300 == k).collect() };
        assert_eq!(idx.lookup("T", "k7", 100, 0, i64::MAX).unwrap(), want(7));
        idx.flush().unwrap();
        drop(idx);
        let (idx, dropped) = open(&be, 64, u64::MAX);
        assert_eq!(dropped, 0);
        assert_eq!(idx.indexed_to(), 999);
        for k in [0, 7, 299] {
            assert_eq!(
                idx.lookup("T", &format!("k{k}"), 100, 0, i64::MAX).unwrap(),
                want(k)
            );
        }
        // A torn table in the newest sealed file is found and rebuilt from its entries.
        let newest_sealed = {
            let st = idx.state.lock();
            st.files
                .iter()
                .rev()
                .find(|f| f.sealed.is_some())
                .unwrap()
                .path
                .clone()
        };
        drop(idx);
        assert!(mem.corrupt(&newest_sealed, 64 * INDEX_ENTRY_SIZE + 8, &[0xff; 4]));
        let (idx, _) = open(&be, 64, u64::MAX);
        for k in [0, 7, 299] {
            assert_eq!(
                idx.lookup("T", &format!("k{k}"), 100, 0, i64::MAX).unwrap(),
                want(k)
            );
        }
    }

    #[test]
    fn legacy_index_is_converted_and_removed() {
        let be: Arc<dyn Backend> = Arc::new(MemBackend::new());
        // The earlier format: entries chained by hash, global links, files of 3 entries.
        be.create_dir_all(Path::new("/index")).unwrap();
        let keys = ["a", "b", "a", "c", "a", "b", "x"];
        let mut heads = std::collections::HashMap::new();
        let mut bytes = Vec::new();
        for (n, k) in keys.iter().enumerate() {
            let hash = key_hash("T", k);
            let prev = heads.insert(hash, n as u64 + 1).unwrap_or(0);
            IndexEntry {
                hash,
                phys_offset: n as u64 * 10,
                store_timestamp: n as i64,
                prev,
            }
            .encode(&mut bytes);
        }
        for (i, chunk) in bytes.chunks(3 * INDEX_ENTRY_SIZE as usize).enumerate() {
            let f = be
                .open(&Path::new("/index").join(file_name(i as u64 * 3)), true)
                .unwrap();
            f.write_all_at(0, chunk).unwrap();
        }
        // The commit log ends at 55: the last entry (60, "x") points past it.
        let (idx, dropped) = open(&be, 4, 55);
        assert_eq!(dropped, 1, "the entry at 60 points past the log end");
        assert!(!be.exists(Path::new("/index")));
        assert_eq!(
            idx.lookup("T", "a", 10, 0, i64::MAX).unwrap(),
            vec![40, 20, 0]
        );
        assert_eq!(idx.lookup("T", "b", 10, 0, i64::MAX).unwrap(), vec![50, 10]);
        assert!(idx.lookup("T", "x", 10, 0, i64::MAX).unwrap().is_empty());
        assert_eq!(idx.indexed_to(), 50);
        drop(idx);
        let (idx, dropped) = open(&be, 4, 55);
        assert_eq!(dropped, 0);
        assert_eq!(
            idx.lookup("T", "a", 10, 0, i64::MAX).unwrap(),
            vec![40, 20, 0]
        );
    }
}

#[cfg(test)]
mod key_tests {
    use crate::record::index_keys;

    #[test]
    fn a_record_is_indexed_under_its_keys_then_its_unique_key_once() {
        let props =
            |keys: &str, uniq: &str| format!("KEYS\u{1}{keys}\u{2}UNIQ_KEY\u{1}{uniq}\u{2}");
        fn keys(p: &str) -> Vec<&str> {
            index_keys(p).collect()
        }
        assert_eq!(keys(&props("a  b", "U1")), ["a", "b", "U1"]);
        assert_eq!(
            keys(&props("a b", "b")),
            ["a", "b"],
            "the unique key is among the keys"
        );
        assert_eq!(keys(&props("", "U1")), ["U1"]);
        assert_eq!(keys("UNIQ_KEY\u{1}\u{2}"), Vec::<&str>::new());
        assert_eq!(keys("TAGS\u{1}t\u{2}"), Vec::<&str>::new());
    }

    proptest::proptest! {
        /// The appender's loop gives the keys (and hashes) the iterator gives, in its order.
        #[test]
        fn the_appenders_loop_matches_the_iterator(
            keys in proptest::option::of("[ ab]{0,8}"),
            uniq in proptest::option::of("[ab]{0,2}"),
            topic in "[A-Za-z#]{0,6}",
        ) {
            use crate::index::{key_hash, key_hash_continue, key_hash_prefix};
            use crate::record::{for_each_index_key, index_keys_of};
            let want: Vec<&str> = index_keys_of(keys.as_deref(), uniq.as_deref()).collect();
            let mut got = Vec::new();
            for_each_index_key(keys.as_deref(), uniq.as_deref(), |k| got.push(k));
            proptest::prop_assert_eq!(&got, &want);
            let prefix = key_hash_prefix(&topic);
            for k in got {
                proptest::prop_assert_eq!(key_hash_continue(prefix, k), key_hash(&topic, k));
            }
        }
    }
}
