//! A voter's Raft log: hard state, membership, the latest snapshot (the applied
//! [`super::Metadata`] at an index, serialized) and the entries after it.
//!
//! raft-rs's `MemStorage` keeps no snapshot data and no term for the compaction point, so a
//! compacted log could not bring a lagging voter back. This store keeps both. It is held in
//! memory behind one short lock; a clone is the same log (the simulator keeps a clone as the
//! voter's disk across crashes).
//!
//! A process keeps it in a file (see `journal.rs` for the records): a journaled store
//! ([`ControllerStorage::recover`], [`ControllerStorage::new_journaled`]) notes every change
//! as a record, and [`ControllerStorage::take_journal`] gives the driver the bytes to append
//! (or, after a compaction or a snapshot from the leader, the whole file to write again).

use super::journal::{self, Record, MAGIC, MAGIC_V1};
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct Log {
    hard_state: HardState,
    conf_state: ConfState,
    snapshot: Snapshot,
    entries: Vec<Entry>,
    /// Grows at every change, so a driver knows when to write the log to disk.
    version: u64,
    /// The changes not yet taken by the driver (a journaled store only).
    journal: Option<Pending>,
}

/// Changes of a journaled store since the driver last took them.
#[derive(Debug, Default)]
struct Pending {
    records: Vec<Record>,
    /// The file is to be written whole (new, compacted, or a snapshot installed).
    rewrite: bool,
}

/// What the driver writes to the log file, synced, before it sends anything.
#[derive(Debug, PartialEq, Eq)]
pub enum JournalWrite {
    /// Nothing changed.
    Nothing,
    /// Records to append.
    Append(Vec<u8>),
    /// The whole file, to write to a temporary file, sync and rename over the old one.
    Rewrite(Vec<u8>),
}

/// A log read back from its file.
#[derive(Debug)]
pub struct Recovered {
    /// The log, journaled.
    pub storage: ControllerStorage,
    /// Bytes of the file up to the end of its last good record: the writer truncates the
    /// file there before appending (0: write the file whole).
    pub valid_len: usize,
    /// Why the file's records stopped before its end (a torn tail after a crash), if they did.
    pub torn: Option<String>,
}

impl Log {
    fn first_index(&self) -> u64 {
        self.snapshot.get_metadata().index + 1
    }

    fn last_index(&self) -> u64 {
        self.entries
            .last()
            .map_or(self.snapshot.get_metadata().index, |e| e.index)
    }

    /// A journaled store records the hard state now.
    fn note_hard_state(&mut self) {
        let hs = self.hard_state.clone();
        if let Some(j) = &mut self.journal {
            j.records.push(Record::HardState(hs));
        }
    }

    /// A journaled store's file is to be written whole (what it holds is replaced).
    fn note_rewrite(&mut self) {
        if let Some(j) = &mut self.journal {
            j.records.clear();
            j.rewrite = true;
        }
    }
}

/// A voter's Raft log in memory.
#[derive(Debug, Clone, Default)]
pub struct ControllerStorage(Arc<Mutex<Log>>);

impl ControllerStorage {
    /// An empty log for a voter among `voters`.
    pub fn new(voters: Vec<u64>) -> Self {
        let s = Self::default();
        {
            let mut log = s.lock();
            log.conf_state = ConfState::from((voters.clone(), vec![]));
            log.snapshot
                .mut_metadata()
                .set_conf_state(ConfState::from((voters, vec![])));
        }
        s
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        // A panic while holding this lock leaves a log that is still consistent (every
        // change below is a single assignment or a truncate-then-extend).
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock, for a change.
    fn change(&self) -> MutexGuard<'_, Log> {
        let mut log = self.lock();
        log.version += 1;
        log
    }

    /// An empty log for a voter among `voters`, journaled: the first
    /// [`Self::take_journal`] gives the whole file.
    pub fn new_journaled(voters: Vec<u64>) -> Self {
        let s = Self::new(voters);
        s.lock().journal = Some(Pending {
            records: Vec::new(),
            rewrite: true,
        });
        s
    }

    /// The log in a file's bytes (written by [`Self::take_journal`], or whole by an earlier
    /// version), journaled; an empty file is a new log for a voter among `voters`. Recovery
    /// stops at the first record that is cut short, fails its checksum or does not decode.
    ///
    /// # Errors
    /// When the bytes are not a controller log.
    pub fn recover(bytes: &[u8], voters: &[u64]) -> Result<Recovered, super::WireError> {
        if bytes.starts_with(MAGIC_V1) {
            let storage = Self::from_bytes(bytes)?;
            storage.lock().journal = Some(Pending {
                records: Vec::new(),
                rewrite: true,
            });
            return Ok(Recovered {
                storage,
                valid_len: 0,
                torn: None,
            });
        }
        let replay = journal::replay(bytes)?;
        if replay.records.is_empty() {
            return Ok(Recovered {
                storage: Self::new_journaled(voters.to_vec()),
                valid_len: replay.valid_len,
                torn: replay.torn,
            });
        }
        let s = Self::default();
        {
            let mut log = s.lock();
            let mut gap = false;
            for r in replay.records {
                match r {
                    Record::HardState(hs) => log.hard_state = hs,
                    Record::ConfState(cs) => log.conf_state = cs,
                    Record::Snapshot(snap) => {
                        let index = snap.get_metadata().index;
                        log.entries.retain(|e| e.index > index);
                        if log.entries.first().is_some_and(|e| e.index != index + 1) {
                            log.entries.clear();
                        }
                        log.snapshot = snap;
                    }
                    Record::Entry(e) => {
                        if e.index < log.first_index() {
                            continue;
                        }
                        let keep = (e.index - log.first_index()) as usize;
                        if keep > log.entries.len() {
                            // A gap (never written so): keep what is contiguous, and write
                            // the file again from it.
                            gap = true;
                            break;
                        }
                        log.entries.truncate(keep);
                        log.entries.push(e);
                    }
                }
            }
            log.journal = Some(Pending {
                records: Vec::new(),
                rewrite: gap,
            });
        }
        Ok(Recovered {
            storage: s,
            valid_len: replay.valid_len,
            torn: replay.torn,
        })
    }

    /// The changes since the last call, as bytes for the file (a store that is not
    /// journaled has none).
    ///
    /// # Errors
    /// When protobuf refuses a message.
    pub fn take_journal(&self) -> Result<JournalWrite, super::WireError> {
        let mut log = self.lock();
        let Some(pending) = log.journal.take() else {
            return Ok(JournalWrite::Nothing);
        };
        log.journal = Some(Pending::default());
        if pending.rewrite {
            let mut out = MAGIC.to_vec();
            Record::Snapshot(log.snapshot.clone()).encode(&mut out)?;
            Record::ConfState(log.conf_state.clone()).encode(&mut out)?;
            for e in &log.entries {
                Record::Entry(e.clone()).encode(&mut out)?;
            }
            // After the entries, as in every append: a commit index never names an entry
            // that is not before it in the file.
            Record::HardState(log.hard_state.clone()).encode(&mut out)?;
            return Ok(JournalWrite::Rewrite(out));
        }
        if pending.records.is_empty() {
            return Ok(JournalWrite::Nothing);
        }
        let mut out = Vec::new();
        for r in &pending.records {
            r.encode(&mut out)?;
        }
        Ok(JournalWrite::Append(out))
    }

    /// Grows at every change of the log (a journaled store's changes are in
    /// [`Self::take_journal`]).
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// The whole log as bytes in the file format of earlier versions (written whole at every
    /// change, read by [`Self::recover`]): `SHOALCS1`, then the hard state, the membership,
    /// the snapshot and each entry, each as a big-endian `u32` length and its protobuf bytes.
    /// Two logs with the same bytes are the same log.
    ///
    /// # Errors
    /// When protobuf refuses a message.
    pub fn to_bytes(&self) -> Result<Vec<u8>, super::WireError> {
        use protobuf::Message as _;
        let log = self.lock();
        let mut out = Vec::with_capacity(64 + log.snapshot.get_data().len());
        out.extend_from_slice(MAGIC_V1);
        let mut put = |bytes: Vec<u8>| {
            out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
            out.extend_from_slice(&bytes);
        };
        put(log.hard_state.write_to_bytes()?);
        put(log.conf_state.write_to_bytes()?);
        put(log.snapshot.write_to_bytes()?);
        for e in &log.entries {
            put(e.write_to_bytes()?);
        }
        Ok(out)
    }

    /// The log [`Self::to_bytes`] wrote.
    ///
    /// # Errors
    /// When `bytes` is not such a log (another file, or one cut short).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, super::WireError> {
        use protobuf::Message as _;
        let bad = || super::WireError::Format("not a controller log, or cut short");
        let mut rest = bytes.strip_prefix(MAGIC_V1).ok_or_else(bad)?;
        let mut take = || -> Result<Option<&[u8]>, super::WireError> {
            if rest.is_empty() {
                return Ok(None);
            }
            let (len, tail) = rest.split_first_chunk::<4>().ok_or_else(bad)?;
            let len = u32::from_be_bytes(*len) as usize;
            let (item, tail) = tail.split_at_checked(len).ok_or_else(bad)?;
            rest = tail;
            Ok(Some(item))
        };
        let hard_state = HardState::parse_from_bytes(take()?.ok_or_else(bad)?)?;
        let conf_state = ConfState::parse_from_bytes(take()?.ok_or_else(bad)?)?;
        let snapshot = Snapshot::parse_from_bytes(take()?.ok_or_else(bad)?)?;
        let mut entries = Vec::new();
        while let Some(e) = take()? {
            entries.push(Entry::parse_from_bytes(e)?);
        }
        Ok(Self(Arc::new(Mutex::new(Log {
            hard_state,
            conf_state,
            snapshot,
            entries,
            version: 0,
            journal: None,
        }))))
    }

    /// Makes an empty log one of a voter among `voters` (a log that has them already stays).
    pub fn ensure_voters(&self, voters: &[u64]) {
        let mut log = self.change();
        if log.conf_state.voters.is_empty() {
            log.conf_state = ConfState::from((voters.to_vec(), vec![]));
            log.snapshot
                .mut_metadata()
                .set_conf_state(ConfState::from((voters.to_vec(), vec![])));
            log.note_rewrite();
        }
    }

    /// Appends entries from Raft, dropping any it overwrites.
    pub fn append(&self, entries: &[Entry]) {
        let Some(first) = entries.first() else {
            return;
        };
        let mut log = self.change();
        let from = first.index.max(log.first_index());
        let keep = from.saturating_sub(log.first_index()) as usize;
        log.entries.truncate(keep);
        let skip = (from - first.index) as usize;
        let new = entries.get(skip..).unwrap_or(&[]);
        log.entries.extend_from_slice(new);
        if let Some(j) = &mut log.journal {
            j.records.extend(new.iter().cloned().map(Record::Entry));
        }
    }

    /// Records Raft's hard state.
    pub fn set_hard_state(&self, hs: HardState) {
        let mut log = self.lock();
        if log.hard_state != hs {
            log.hard_state = hs;
            log.version += 1;
            log.note_hard_state();
        }
    }

    /// Records the commit index Raft reported after a `Ready`.
    pub fn set_commit(&self, commit: u64) {
        let mut log = self.lock();
        if log.hard_state.commit != commit {
            log.hard_state.commit = commit;
            log.version += 1;
            log.note_hard_state();
        }
    }

    /// Installs a snapshot from the leader: everything it covers goes.
    pub fn apply_snapshot(&self, snapshot: Snapshot) {
        let mut log = self.change();
        let meta = snapshot.get_metadata();
        if meta.index < log.first_index() {
            return;
        }
        log.hard_state.term = log.hard_state.term.max(meta.term);
        log.hard_state.commit = log.hard_state.commit.max(meta.index);
        log.conf_state = meta.get_conf_state().clone();
        let index = meta.index;
        log.entries.retain(|e| e.index > index);
        log.snapshot = snapshot;
        log.note_rewrite();
    }

    /// Replaces entries up to `index` (applied, with `data` the state after it) by a snapshot.
    pub fn compact(&self, index: u64, data: Vec<u8>) {
        let mut log = self.change();
        if index < log.first_index() || index > log.last_index() {
            return;
        }
        let Some(term) = log
            .entries
            .iter()
            .find(|e| e.index == index)
            .map(|e| e.term)
        else {
            return;
        };
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(log.conf_state.clone());
        let mut snapshot = Snapshot::default();
        snapshot.set_metadata(meta);
        snapshot.set_data(data.into());
        log.entries.retain(|e| e.index > index);
        log.snapshot = snapshot;
        log.note_rewrite();
    }

    /// The latest snapshot (empty data before the first compaction).
    pub fn latest_snapshot(&self) -> Snapshot {
        self.lock().snapshot.clone()
    }

    /// Entries held (after the snapshot).
    pub fn entry_count(&self) -> usize {
        self.lock().entries.len()
    }
}

impl Storage for ControllerStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let log = self.lock();
        Ok(RaftState::new(
            log.hard_state.clone(),
            log.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let log = self.lock();
        if low < log.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > log.last_index() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let offset = log.first_index();
        let slice = &log.entries[(low - offset) as usize..(high - offset) as usize];
        let max = max_size.into().unwrap_or(u64::MAX);
        let mut size = 0u64;
        let mut out = Vec::with_capacity(slice.len());
        for e in slice {
            size += (e.get_data().len() + e.get_context().len() + 24) as u64;
            if !out.is_empty() && size > max {
                break;
            }
            out.push(e.clone());
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let log = self.lock();
        let snap = log.snapshot.get_metadata();
        if idx == snap.index {
            return Ok(snap.term);
        }
        if idx < log.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > log.last_index() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(log.entries[(idx - log.first_index()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.lock().first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.lock().last_index())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let log = self.lock();
        if log.snapshot.get_metadata().index < request_index {
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(log.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Default::default()
        }
    }

    #[test]
    fn the_log_round_trips_through_bytes_and_a_cut_file_is_refused() {
        let s = ControllerStorage::new(vec![1, 2, 3]);
        let v0 = s.version();
        s.append(&(1..=6).map(|i| entry(i, 2)).collect::<Vec<_>>());
        s.set_hard_state(HardState {
            term: 2,
            vote: 1,
            commit: 5,
            ..Default::default()
        });
        s.compact(3, b"{\"groups\":{}}".to_vec());
        assert!(s.version() > v0);
        let v = s.version();
        s.set_commit(5);
        assert_eq!(s.version(), v, "no change, no new version");
        let bytes = s.to_bytes().unwrap();
        let back = ControllerStorage::from_bytes(&bytes).unwrap();
        assert_eq!(back.to_bytes().unwrap(), bytes);
        assert_eq!(back.first_index().unwrap(), 4);
        assert_eq!(back.last_index().unwrap(), 6);
        assert_eq!(back.term(3).unwrap(), 2);
        assert_eq!(back.initial_state().unwrap().hard_state.commit, 5);
        assert_eq!(back.latest_snapshot().get_data(), b"{\"groups\":{}}");
        assert!(ControllerStorage::from_bytes(&bytes[..bytes.len() - 3]).is_err());
        assert!(ControllerStorage::from_bytes(b"something else").is_err());
    }

    #[test]
    fn append_overwrites_and_compaction_keeps_the_term() {
        let s = ControllerStorage::new(vec![1, 2, 3]);
        s.append(&[entry(1, 1), entry(2, 1), entry(3, 1)]);
        s.append(&[entry(3, 2), entry(4, 2)]);
        assert_eq!(s.last_index().ok(), Some(4));
        assert_eq!(s.term(3).ok(), Some(2));
        s.compact(3, b"state".to_vec());
        assert_eq!(s.first_index().ok(), Some(4));
        assert_eq!(
            s.term(3).ok(),
            Some(2),
            "the compaction point keeps its term"
        );
        assert!(matches!(
            s.term(2),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert_eq!(s.latest_snapshot().get_data(), b"state");
        let got = s.entries(4, 5, None, GetEntriesContext::empty(false));
        assert_eq!(got.map(|v| v.len()).ok(), Some(1));
        assert!(s
            .entries(2, 5, None, GetEntriesContext::empty(false))
            .is_err());
        assert!(s
            .entries(4, 9, None, GetEntriesContext::empty(false))
            .is_err());
    }

    #[test]
    fn a_snapshot_from_the_leader_replaces_what_it_covers() {
        let s = ControllerStorage::new(vec![1, 2, 3]);
        s.append(&[entry(1, 1), entry(2, 1)]);
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 10;
        snap.mut_metadata().term = 3;
        snap.mut_metadata()
            .set_conf_state(ConfState::from((vec![1, 2, 3], vec![])));
        s.apply_snapshot(snap);
        assert_eq!(s.first_index().ok(), Some(11));
        assert_eq!(s.last_index().ok(), Some(10));
        assert_eq!(
            s.initial_state().map(|r| r.hard_state.commit).ok(),
            Some(10)
        );
        s.append(&[entry(11, 3)]);
        assert_eq!(s.last_index().ok(), Some(11));
    }
}
