//! The on-disk form of a voter's log: `SHOALCL2`, then records, each its own length, a CRC32
//! and a kind, appended as the log changes.
//!
//! A record is `len: u32 BE`, `crc: u32 BE` (CRC32 of the kind byte and the payload), `kind: u8`
//! and `len - 1` payload bytes (protobuf). Replaying the records in order rebuilds the log:
//!
//! - a hard state or a membership replaces the one before;
//! - a snapshot replaces everything it covers (the log's start moves to its index + 1);
//! - an entry at index `i` drops every entry from `i` on, then is appended (Raft overwrites a
//!   follower's uncommitted tail this way).
//!
//! A crash can leave the last record cut short (or, with a disk that reorders writes, garbage
//! after the last good one): recovery stops at the first record that is short, fails its
//! checksum or does not decode, says where and why, and the writer truncates the file there.
//! Nothing after such a record was acknowledged: every write is synced before anything that
//! depends on it is sent.

use super::wire::WireError;
use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};

/// The first bytes of a log file.
pub(super) const MAGIC: &[u8] = b"SHOALCL2";
/// The first bytes of the log files of earlier versions (written whole at every change).
pub(super) const MAGIC_V1: &[u8] = b"SHOALCS1";

/// Bytes of a record before its kind: length and checksum.
const HEADER: usize = 8;
/// A record longer than this is garbage (a snapshot of the largest metadata is far smaller).
const MAX_RECORD: usize = 256 << 20;

/// One change of the log.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Record {
    /// Raft's hard state (term, vote, commit).
    HardState(HardState),
    /// The voters.
    ConfState(ConfState),
    /// A snapshot replacing everything up to its index.
    Snapshot(Snapshot),
    /// An entry, replacing any at its index and after.
    Entry(Entry),
}

impl Record {
    fn kind(&self) -> u8 {
        match self {
            Record::HardState(_) => 1,
            Record::ConfState(_) => 2,
            Record::Snapshot(_) => 3,
            Record::Entry(_) => 4,
        }
    }

    /// Appends the framed record to `out`.
    pub(super) fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let payload = match self {
            Record::HardState(m) => m.write_to_bytes()?,
            Record::ConfState(m) => m.write_to_bytes()?,
            Record::Snapshot(m) => m.write_to_bytes()?,
            Record::Entry(m) => m.write_to_bytes()?,
        };
        let kind = self.kind();
        let mut crc = crc32fast::Hasher::new();
        crc.update(&[kind]);
        crc.update(&payload);
        let len = u32::try_from(payload.len() + 1)
            .map_err(|_| WireError::Format("a log record over 4 GiB"))?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&crc.finalize().to_be_bytes());
        out.push(kind);
        out.extend_from_slice(&payload);
        Ok(())
    }

    fn decode(kind: u8, payload: &[u8]) -> Option<Self> {
        Some(match kind {
            1 => Record::HardState(HardState::parse_from_bytes(payload).ok()?),
            2 => Record::ConfState(ConfState::parse_from_bytes(payload).ok()?),
            3 => Record::Snapshot(Snapshot::parse_from_bytes(payload).ok()?),
            4 => Record::Entry(Entry::parse_from_bytes(payload).ok()?),
            _ => return None,
        })
    }
}

/// What a log file holds up to its first bad record.
#[derive(Debug)]
pub(super) struct Replay {
    /// The good records, in order.
    pub records: Vec<Record>,
    /// Bytes from the file's start to the end of the last good record (the magic included).
    pub valid_len: usize,
    /// Why the records stop before the end of the file, if they do.
    pub torn: Option<String>,
}

/// The records of a log file's bytes (`MAGIC` first).
pub(super) fn replay(bytes: &[u8]) -> Result<Replay, WireError> {
    // A file cut inside its magic was being created: it holds nothing yet.
    if bytes.len() < MAGIC.len() && MAGIC.starts_with(bytes) {
        return Ok(Replay {
            records: Vec::new(),
            valid_len: 0,
            torn: (!bytes.is_empty()).then(|| "cut inside the file's header".to_string()),
        });
    }
    let mut at = MAGIC.len();
    if bytes.get(..at) != Some(MAGIC) {
        return Err(WireError::Format("not a controller log"));
    }
    let mut records = Vec::new();
    let torn = loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            break None;
        }
        let Some((head, body)) = rest.split_at_checked(HEADER) else {
            break Some(format!("record at byte {at} cut short in its header"));
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if len == 0 || len > MAX_RECORD {
            break Some(format!("record at byte {at} has a bad length {len}"));
        }
        let Some(body) = body.get(..len) else {
            break Some(format!(
                "record at byte {at} cut short ({} of {len} bytes)",
                body.len()
            ));
        };
        if crc32fast::hash(body) != crc {
            break Some(format!("record at byte {at} fails its checksum"));
        }
        let Some(record) = Record::decode(body[0], &body[1..]) else {
            break Some(format!("record at byte {at} does not decode"));
        };
        records.push(record);
        at += HEADER + len;
    };
    Ok(Replay {
        records,
        valid_len: at,
        torn,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::{
        ControllerConfig, ControllerNode, ControllerStorage, JournalWrite, Metadata,
    };
    use raft::Storage as _;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: vec![index as u8].into(),
            ..Default::default()
        }
    }

    fn hard_state(term: u64, commit: u64) -> HardState {
        HardState {
            term,
            vote: 1,
            commit,
            ..Default::default()
        }
    }

    /// The file as a driver keeps it: records appended, or the whole file written again.
    fn write(file: &mut Vec<u8>, s: &ControllerStorage) {
        match s.take_journal().unwrap() {
            JournalWrite::Nothing => {}
            JournalWrite::Append(b) => file.extend_from_slice(&b),
            JournalWrite::Rewrite(b) => *file = b,
        }
    }

    /// A journaled log through appends, an overwritten tail, a compaction (the file written
    /// again) and more appends.
    fn history() -> (Vec<u8>, usize) {
        let s = ControllerStorage::new_journaled(vec![1]);
        let mut file = Vec::new();
        write(&mut file, &s);
        s.append(&(1..=4).map(|i| entry(i, 1)).collect::<Vec<_>>());
        s.set_hard_state(hard_state(1, 2));
        write(&mut file, &s);
        s.compact(2, serde_json::to_vec(&Metadata::default()).unwrap());
        write(&mut file, &s);
        s.append(&[entry(5, 2), entry(6, 2)]);
        s.append(&[entry(6, 3)]);
        s.set_hard_state(hard_state(3, 5));
        write(&mut file, &s);
        let before_last = file.len();
        s.append(&[entry(7, 3)]);
        write(&mut file, &s);
        assert_eq!(s.take_journal().unwrap(), JournalWrite::Nothing);
        (file, before_last)
    }

    #[test]
    fn a_log_cut_at_any_byte_recovers_a_prefix_and_the_voter_starts() {
        let (file, before_last) = history();
        let full = ControllerStorage::recover(&file, &[1]).unwrap();
        assert_eq!((full.valid_len, full.torn.as_deref()), (file.len(), None));
        let log = &full.storage;
        assert_eq!(
            (log.first_index().unwrap(), log.last_index().unwrap()),
            (3, 7)
        );
        assert_eq!(log.term(6).unwrap(), 3, "the overwritten entry");
        assert_eq!(log.term(2).unwrap(), 1, "the compaction point's term");
        assert_eq!(log.initial_state().unwrap().hard_state.commit, 5);
        let before = ControllerStorage::recover(&file[..before_last], &[1]).unwrap();
        for cut in 0..file.len() {
            let r = ControllerStorage::recover(&file[..cut], &[1]).unwrap();
            assert!(r.valid_len <= cut, "cut {cut}");
            assert_eq!(
                r.torn.is_some(),
                r.valid_len < cut,
                "cut {cut}: {:?}",
                r.torn
            );
            if cut >= before_last {
                // Inside the last record: the log before it.
                assert_eq!(r.valid_len, before_last, "cut {cut}");
                assert_eq!(
                    r.storage.to_bytes().unwrap(),
                    before.storage.to_bytes().unwrap(),
                    "cut {cut}"
                );
            }
            let last = r.storage.last_index().unwrap();
            let commit = r.storage.initial_state().unwrap().hard_state.commit;
            assert!(
                commit <= last,
                "cut {cut}: commit {commit} after the last entry {last}"
            );
            let node = ControllerNode::new(ControllerConfig::new(1, vec![1]), r.storage, 0);
            assert!(node.is_ok(), "cut {cut}: {:?}", node.err());
        }
    }

    #[test]
    fn recovery_stops_at_a_bad_checksum_and_the_next_write_is_whole_if_nothing_was_good() {
        let (mut file, before_last) = history();
        let good = ControllerStorage::recover(&file[..before_last], &[1]).unwrap();
        // A flipped byte in the last record's payload.
        let at = file.len() - 1;
        file[at] ^= 0xff;
        let r = ControllerStorage::recover(&file, &[1]).unwrap();
        assert_eq!(r.valid_len, before_last);
        assert!(
            r.torn.as_deref().is_some_and(|t| t.contains("checksum")),
            "{:?}",
            r.torn
        );
        assert_eq!(
            r.storage.to_bytes().unwrap(),
            good.storage.to_bytes().unwrap()
        );
        // A recovered log appends from where it stopped.
        r.storage.append(&[entry(7, 4)]);
        let JournalWrite::Append(tail) = r.storage.take_journal().unwrap() else {
            panic!("an append")
        };
        file.truncate(r.valid_len);
        file.extend_from_slice(&tail);
        let again = ControllerStorage::recover(&file, &[1]).unwrap();
        assert_eq!(again.torn, None);
        assert_eq!(again.storage.term(7).unwrap(), 4);
        // Another file, and an empty one.
        assert!(ControllerStorage::recover(b"something else", &[1]).is_err());
        let empty = ControllerStorage::recover(b"", &[1, 2, 3]).unwrap();
        assert!(matches!(
            empty.storage.take_journal().unwrap(),
            JournalWrite::Rewrite(_)
        ));
        assert_eq!(
            empty.storage.initial_state().unwrap().conf_state.voters,
            vec![1, 2, 3]
        );
    }

    #[test]
    fn a_log_of_the_earlier_format_is_read_and_written_again_whole() {
        let s = ControllerStorage::new(vec![1]);
        s.append(&[entry(1, 1), entry(2, 1)]);
        let v1 = s.to_bytes().unwrap();
        let r = ControllerStorage::recover(&v1, &[1]).unwrap();
        assert_eq!(r.storage.last_index().unwrap(), 2);
        let JournalWrite::Rewrite(file) = r.storage.take_journal().unwrap() else {
            panic!("a rewrite")
        };
        let back = ControllerStorage::recover(&file, &[1]).unwrap();
        assert_eq!(back.storage.to_bytes().unwrap(), v1);
    }
}
