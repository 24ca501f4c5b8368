//! Kafka leader epochs from a replicated broker group's master epochs.
//!
//! A partition's leader epoch is its broker group's master epoch (0 for a broker that does
//! not replicate). The group's log keeps `(master epoch, first commit-log offset)` entries
//! (Kafka's leader-epoch checkpoint); from them a record's leader epoch is the epoch of the
//! newest entry at or before its commit-log offset, and OffsetForLeaderEpoch answers where an
//! epoch's records end, in the partition's offsets, with Kafka's rules (KIP-101, KIP-320).

use kafka_protocol::ResponseError;

/// The master epochs of this broker's log and the newest one it knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderEpochs {
    /// The current leader epoch (the master epoch this broker knows; 0 without replication).
    pub current: i32,
    /// `(epoch, first commit-log offset)`, oldest first: epochs growing, offsets not falling.
    pub entries: Vec<(i32, u64)>,
}

/// Where a requested leader epoch's records end (OffsetForLeaderEpoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochEnd {
    /// The epoch is the current one: its records end at the log end.
    LogEnd {
        /// The epoch to answer.
        epoch: i32,
    },
    /// The records of `epoch` (the newest at or below the one asked for) end where the first
    /// record of a later epoch is, at commit-log offset `next_start`.
    Before {
        /// The epoch to answer.
        epoch: i32,
        /// The first commit-log offset of the next epoch.
        next_start: u64,
    },
    /// No such epoch here (newer than any this broker has): UNDEFINED_EPOCH and offset -1.
    Undefined,
}

impl LeaderEpochs {
    /// The leader epoch of the record at commit-log offset `phys`.
    pub fn epoch_at(&self, phys: u64) -> i32 {
        let i = self.entries.partition_point(|(_, start)| *start <= phys);
        match i {
            0 => self.entries.first().map_or(self.current, |(e, _)| *e),
            _ => self.entries[i - 1].0,
        }
    }

    /// The commit-log offset where the epoch of a record at `phys` ends (the next entry's
    /// start), if a later epoch has records.
    pub fn end_of_epoch_at(&self, phys: u64) -> Option<u64> {
        let i = self.entries.partition_point(|(_, start)| *start <= phys);
        self.entries.get(i).map(|(_, start)| *start)
    }

    /// A request's `current_leader_epoch` against this leader's (-1: the client does not
    /// say): FENCED_LEADER_EPOCH when the client's is older (it refreshes its metadata),
    /// UNKNOWN_LEADER_EPOCH when newer (this broker has not learned it yet; the client retries).
    pub fn check(&self, current_leader_epoch: i32) -> Result<(), ResponseError> {
        if current_leader_epoch < 0 || current_leader_epoch == self.current {
            Ok(())
        } else if current_leader_epoch < self.current {
            Err(ResponseError::FencedLeaderEpoch)
        } else {
            Err(ResponseError::UnknownLeaderEpoch)
        }
    }

    /// Where the records of leader epoch `requested` end, as Kafka's leader answers it: the
    /// current epoch ends at the log end; an older one where the first later epoch starts,
    /// answered with the newest epoch at or below it (or itself when older than every entry);
    /// an epoch newer than any known is undefined.
    pub fn end_of(&self, requested: i32) -> EpochEnd {
        let newest = self
            .entries
            .last()
            .map_or(self.current, |(e, _)| *e)
            .max(self.current);
        if requested < 0 || requested > newest {
            return EpochEnd::Undefined;
        }
        if requested == newest {
            return EpochEnd::LogEnd { epoch: requested };
        }
        let higher = self.entries.iter().find(|(e, _)| *e > requested);
        let floor = self.entries.iter().rev().find(|(e, _)| *e <= requested);
        match higher {
            Some((_, next_start)) => EpochEnd::Before {
                epoch: floor.map_or(requested, |(e, _)| *e),
                next_start: *next_start,
            },
            // Newer epochs known but none wrote yet (a master elected with no record since):
            // the asked epoch's records run to the log end.
            None => EpochEnd::LogEnd {
                epoch: floor.map_or(requested, |(e, _)| *e),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epochs() -> LeaderEpochs {
        LeaderEpochs {
            current: 5,
            entries: vec![(1, 0), (2, 100), (4, 250), (5, 400)],
        }
    }

    #[test]
    fn a_records_epoch_is_the_newest_entry_at_or_before_it() {
        let e = epochs();
        assert_eq!(e.epoch_at(0), 1);
        assert_eq!(e.epoch_at(99), 1);
        assert_eq!(e.epoch_at(100), 2);
        assert_eq!(e.epoch_at(300), 4);
        assert_eq!(e.epoch_at(10_000), 5);
        assert_eq!(e.end_of_epoch_at(120), Some(250));
        assert_eq!(e.end_of_epoch_at(400), None);
        let alone = LeaderEpochs::default();
        assert_eq!(alone.epoch_at(42), 0);
        assert_eq!(alone.end_of_epoch_at(42), None);
    }

    #[test]
    fn a_clients_epoch_is_checked_against_the_leaders() {
        let e = epochs();
        assert_eq!(e.check(-1), Ok(()));
        assert_eq!(e.check(5), Ok(()));
        assert_eq!(e.check(4), Err(ResponseError::FencedLeaderEpoch));
        assert_eq!(e.check(6), Err(ResponseError::UnknownLeaderEpoch));
    }

    #[test]
    fn an_epoch_ends_where_the_next_one_starts() {
        let e = epochs();
        assert_eq!(e.end_of(5), EpochEnd::LogEnd { epoch: 5 });
        assert_eq!(
            e.end_of(2),
            EpochEnd::Before {
                epoch: 2,
                next_start: 250
            }
        );
        // Epoch 3 wrote nothing here: epoch 2's end is answered.
        assert_eq!(
            e.end_of(3),
            EpochEnd::Before {
                epoch: 2,
                next_start: 250
            }
        );
        // Older than every entry: the first epoch's start.
        assert_eq!(
            e.end_of(0),
            EpochEnd::Before {
                epoch: 0,
                next_start: 0
            }
        );
        assert_eq!(e.end_of(6), EpochEnd::Undefined);
        assert_eq!(e.end_of(-1), EpochEnd::Undefined);
        // A master elected that wrote nothing yet: the last writer's epoch runs to the end.
        let quiet = LeaderEpochs {
            current: 7,
            entries: vec![(1, 0), (5, 400)],
        };
        assert_eq!(quiet.end_of(7), EpochEnd::LogEnd { epoch: 7 });
        assert_eq!(quiet.end_of(6), EpochEnd::LogEnd { epoch: 5 });
        assert_eq!(
            LeaderEpochs::default().end_of(0),
            EpochEnd::LogEnd { epoch: 0 }
        );
    }
}
