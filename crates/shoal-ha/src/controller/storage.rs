//! A voter's Raft log: hard state, membership, the latest snapshot (the applied
//! [`super::Metadata`] at an index, serialized) and the entries after it.
//!
//! raft-rs's `MemStorage` keeps no snapshot data and no term for the compaction point, so a
//! compacted log could not bring a lagging voter back. This store keeps both. It is held in
//! memory behind one short lock; a clone is the same log (the simulator keeps a clone as the
//! voter's disk across crashes). A file-backed store with the same content is what a
//! controller process needs (see `docs/ha.md`).

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct Log {
    hard_state: HardState,
    conf_state: ConfState,
    snapshot: Snapshot,
    entries: Vec<Entry>,
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

    /// Makes an empty log one of a voter among `voters` (a log that has them already stays).
    pub fn ensure_voters(&self, voters: &[u64]) {
        let mut log = self.lock();
        if log.conf_state.voters.is_empty() {
            log.conf_state = ConfState::from((voters.to_vec(), vec![]));
            log.snapshot
                .mut_metadata()
                .set_conf_state(ConfState::from((voters.to_vec(), vec![])));
        }
    }

    /// Appends entries from Raft, dropping any it overwrites.
    pub fn append(&self, entries: &[Entry]) {
        let Some(first) = entries.first() else {
            return;
        };
        let mut log = self.lock();
        let from = first.index.max(log.first_index());
        let keep = from.saturating_sub(log.first_index()) as usize;
        log.entries.truncate(keep);
        let skip = (from - first.index) as usize;
        log.entries
            .extend_from_slice(entries.get(skip..).unwrap_or(&[]));
    }

    /// Records Raft's hard state.
    pub fn set_hard_state(&self, hs: HardState) {
        self.lock().hard_state = hs;
    }

    /// Records the commit index Raft reported after a `Ready`.
    pub fn set_commit(&self, commit: u64) {
        self.lock().hard_state.commit = commit;
    }

    /// Installs a snapshot from the leader: everything it covers goes.
    pub fn apply_snapshot(&self, snapshot: Snapshot) {
        let mut log = self.lock();
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
    }

    /// Replaces entries up to `index` (applied, with `data` the state after it) by a snapshot.
    pub fn compact(&self, index: u64, data: Vec<u8>) {
        let mut log = self.lock();
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
