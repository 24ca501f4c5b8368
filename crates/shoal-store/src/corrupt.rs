//! Records whose body CRC failed: found by recovery, or by reads that check CRCs.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use shoal_proto::message::record::RecordView;

use crate::consume_queue::CqEntry;

/// The corrupt records known so far (commit log offsets), and how many reads met one.
pub(crate) struct CorruptRecords {
    known: RwLock<HashSet<u64>>,
    /// Corrupt records met by reads (skipped or refused), for the broker's counters.
    reads: AtomicU64,
}

impl CorruptRecords {
    /// Starts with the records recovery found.
    pub(crate) fn new(found: &[u64]) -> Self {
        CorruptRecords {
            known: RwLock::new(found.iter().copied().collect()),
            reads: AtomicU64::new(0),
        }
    }

    /// Which of the records a pull read (`picked`, their bytes back to back in `buf`) are
    /// corrupt: the known ones, and with `check_crc` those whose CRC fails. Their indices in
    /// `picked`; empty at once when nothing is known and nothing is to be checked.
    pub(crate) fn find(&self, check_crc: bool, picked: &[CqEntry], buf: &[u8]) -> Vec<usize> {
        let mut bad = Vec::new();
        let known = self.known.read();
        if !check_crc && known.is_empty() {
            return bad;
        }
        let mut at = 0usize;
        for (i, e) in picked.iter().enumerate() {
            let end = at + e.size as usize;
            let rec = buf.get(at..end).unwrap_or(&[]);
            let corrupt = known.contains(&e.phys_offset)
                || (check_crc && RecordView::parse(rec).and_then(|v| v.verify_crc()).is_err());
            if corrupt {
                bad.push(i);
            }
            at = end;
        }
        bad
    }

    /// Counts the corrupt records a read met (`bad`, indices in `picked`) and remembers them;
    /// `newly` is told of each one not known before.
    pub(crate) fn note_read(
        &self,
        bad: &[usize],
        picked: &[CqEntry],
        mut newly: impl FnMut(usize),
    ) {
        self.reads.fetch_add(bad.len() as u64, Ordering::Relaxed);
        let mut known = self.known.write();
        for &i in bad {
            if known.insert(picked[i].phys_offset) {
                newly(i);
            }
        }
    }

    /// Forgets the records at or above `end` (the log was cut there).
    pub(crate) fn forget_from(&self, end: u64) {
        self.known.write().retain(|&phys| phys < end);
    }

    /// Corrupt records met by reads so far.
    pub(crate) fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}
