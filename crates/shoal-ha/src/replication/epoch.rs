//! The epoch entries a broker keeps beside its commit log: `(epoch, start offset)` of every
//! master epoch it has data from (RocketMQ's `EpochFile`, Kafka's leader-epoch checkpoint),
//! and the divergence point of two logs (Kafka KIP-101).

use crate::Epoch;
use serde::{Deserialize, Serialize};

/// The first offset written under a master epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EpochEntry {
    /// The master epoch.
    pub epoch: Epoch,
    /// The commit-log offset its first byte has.
    pub start: u64,
}

/// A log's epoch entries: epochs strictly growing, starts never decreasing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochCache {
    entries: Vec<EpochEntry>,
}

/// An entry that would make epochs go back or starts decrease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("epoch entry {new:?} after {last:?}")]
pub struct EpochOrder {
    /// The last entry held.
    pub last: EpochEntry,
    /// The entry refused.
    pub new: EpochEntry,
}

impl EpochCache {
    /// Entries read back from disk, checked for order.
    pub fn from_entries(entries: Vec<EpochEntry>) -> Result<Self, EpochOrder> {
        let mut cache = Self::default();
        for e in entries {
            cache.push(e.epoch, e.start)?;
        }
        Ok(cache)
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    /// The newest entry.
    pub fn last(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// The newest epoch (0 for an empty log).
    pub fn last_epoch(&self) -> Epoch {
        self.last().map_or(0, |e| e.epoch)
    }

    /// Records that data of `epoch` starts at `start`. The same epoch again is a no-op.
    pub fn push(&mut self, epoch: Epoch, start: u64) -> Result<(), EpochOrder> {
        let new = EpochEntry { epoch, start };
        if let Some(last) = self.last() {
            if epoch == last.epoch {
                return Ok(());
            }
            if epoch < last.epoch || start < last.start {
                return Err(EpochOrder { last, new });
            }
        }
        self.entries.push(new);
        Ok(())
    }

    /// The log was cut at `offset`: entries that start at or after it go.
    pub fn truncate_to(&mut self, offset: u64) {
        self.entries.retain(|e| e.start < offset);
    }

    /// Where data of `epoch` ends in a log that ends at `log_end`: the next entry's start, or
    /// `log_end` for the newest.
    pub fn end_of(&self, epoch: Epoch, log_end: u64) -> Option<u64> {
        let i = self.entries.iter().position(|e| e.epoch == epoch)?;
        Some(self.entries.get(i + 1).map_or(log_end, |next| next.start))
    }

    /// The epoch the byte at `offset` was written under.
    pub fn epoch_at(&self, offset: u64) -> Option<Epoch> {
        self.entries
            .iter()
            .rev()
            .find(|e| e.start <= offset)
            .map(|e| e.epoch)
    }

    /// Where a batch starting at `start` must end so that it holds one epoch only: the start
    /// of the next epoch after the one `start` is in, if any.
    pub fn epoch_boundary_after(&self, start: u64) -> Option<u64> {
        self.entries
            .iter()
            .find(|e| e.start > start)
            .map(|e| e.start)
    }

    /// The offset a log with entries `other` ending at `other_end` must be cut to so that it is
    /// a prefix of this log (ending at `log_end`): for the newest epoch both hold with the same
    /// start, the lesser of the two ends of that epoch; 0 when they share none. The oldest
    /// entry of a log restarted at a later offset (its master's retention had deleted what
    /// came before) starts where the log does, inside the epoch: it matches when the other
    /// log holds that epoch there (either log may be the restarted one).
    pub fn divergence(&self, log_end: u64, other: &[EpochEntry], other_end: u64) -> u64 {
        for (i, theirs) in other.iter().enumerate().rev() {
            let Some(mine) = self.entries.iter().find(|e| e.epoch == theirs.epoch) else {
                continue;
            };
            let their_end = other.get(i + 1).map_or(other_end, |next| next.start);
            let theirs_restarted_inside = i == 0
                && theirs.start > mine.start
                && theirs.start < self.end_of(mine.epoch, log_end).unwrap_or(log_end);
            let mine_restarted_inside = self.entries.first() == Some(mine)
                && mine.start > theirs.start
                && mine.start <= their_end;
            if mine.start != theirs.start && !theirs_restarted_inside && !mine_restarted_inside {
                continue;
            }
            let my_end = self.end_of(mine.epoch, log_end).unwrap_or(log_end);
            return their_end.min(my_end);
        }
        if other.is_empty() && other_end <= log_end {
            // A log restarted at `other_end` that has taken nothing since holds no bytes to
            // disagree with.
            return other_end;
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(entries: &[(Epoch, u64)]) -> EpochCache {
        EpochCache::from_entries(
            entries
                .iter()
                .map(|&(epoch, start)| EpochEntry { epoch, start })
                .collect(),
        )
        .expect("ordered")
    }

    #[test]
    fn order_is_enforced() {
        let mut c = cache(&[(1, 0), (3, 100)]);
        assert!(c.push(2, 200).is_err());
        assert!(c.push(4, 50).is_err());
        assert!(c.push(3, 500).is_ok());
        assert_eq!(c.entries().len(), 2);
        assert!(c.push(4, 100).is_ok());
    }

    #[test]
    fn boundaries_and_ends() {
        let c = cache(&[(1, 0), (2, 100), (4, 250)]);
        assert_eq!(c.end_of(1, 300), Some(100));
        assert_eq!(c.end_of(4, 300), Some(300));
        assert_eq!(c.end_of(3, 300), None);
        assert_eq!(c.epoch_boundary_after(0), Some(100));
        assert_eq!(c.epoch_boundary_after(100), Some(250));
        assert_eq!(c.epoch_boundary_after(260), None);
        assert_eq!(c.epoch_at(99), Some(1));
        assert_eq!(c.epoch_at(250), Some(4));
    }

    #[test]
    fn divergence_is_kip_101() {
        // The master wrote epoch 1 up to 100, epoch 3 from 100.
        let master = cache(&[(1, 0), (3, 100)]);
        // A replica that was master of epoch 2 after 120 bytes of epoch 1 it alone has.
        let replica = [
            EpochEntry { epoch: 1, start: 0 },
            EpochEntry {
                epoch: 2,
                start: 120,
            },
        ];
        assert_eq!(master.divergence(400, &replica, 180), 100);
        // A replica behind in epoch 1 keeps everything.
        assert_eq!(master.divergence(400, &replica[..1], 80), 80);
        // A replica ahead in epoch 3 (impossible for a real master, but bounded anyway).
        let ahead = [
            EpochEntry { epoch: 1, start: 0 },
            EpochEntry {
                epoch: 3,
                start: 100,
            },
        ];
        assert_eq!(master.divergence(400, &ahead, 500), 400);
        // Nothing shared: cut everything.
        assert_eq!(
            master.divergence(400, &[EpochEntry { epoch: 2, start: 0 }], 50),
            0
        );
        // Empty logs agree.
        assert_eq!(EpochCache::default().divergence(0, &[], 0), 0);
    }

    #[test]
    fn a_log_restarted_inside_an_epoch_matches_it() {
        let master = cache(&[(1, 0), (2, 100), (3, 300)]);
        // A replica restarted at 150 (inside epoch 2), then took epoch 2 and 3 data.
        let restarted = [
            EpochEntry {
                epoch: 2,
                start: 150,
            },
            EpochEntry {
                epoch: 3,
                start: 300,
            },
        ];
        assert_eq!(master.divergence(400, &restarted, 350), 350);
        // Restarted at 150 with epoch-2 data that runs past the master's epoch 2: cut at 300.
        assert_eq!(
            master.divergence(
                400,
                &[EpochEntry {
                    epoch: 2,
                    start: 150
                }],
                320
            ),
            300
        );
        // Its oldest entry starting past the master's epoch 2 is not the master's data.
        assert_eq!(
            master.divergence(
                400,
                &[EpochEntry {
                    epoch: 2,
                    start: 350
                }],
                380
            ),
            0
        );
        // The master is the restarted one: a replica with the whole history keeps it.
        let restarted_master = cache(&[(2, 150), (3, 300)]);
        let whole = [
            EpochEntry { epoch: 1, start: 0 },
            EpochEntry {
                epoch: 2,
                start: 100,
            },
        ];
        assert_eq!(restarted_master.divergence(400, &whole, 200), 200);
        // ... also when the master has nothing but its start, where the replica ends.
        assert_eq!(cache(&[(2, 200)]).divergence(200, &whole, 200), 200);
        // A log restarted at 150 that took nothing since: kept as it is.
        assert_eq!(master.divergence(400, &[], 150), 150);
        assert_eq!(master.divergence(400, &[], 500), 0);
    }

    #[test]
    fn truncation_drops_later_entries() {
        let mut c = cache(&[(1, 0), (2, 100), (4, 250)]);
        c.truncate_to(250);
        assert_eq!(
            c.last(),
            Some(EpochEntry {
                epoch: 2,
                start: 100
            })
        );
        c.truncate_to(0);
        assert_eq!(c.last(), None);
    }
}
