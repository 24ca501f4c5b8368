//! What a master and its replicas say to each other (the headers of RocketMQ's AutoSwitch HA
//! stream: handshake with epoch entries, transfer with epoch and confirm offset, ack).
//! The bytes of a batch travel beside its header; the state machines only see ranges.

use super::epoch::EpochEntry;
use crate::{BrokerId, Epoch};
use serde::{Deserialize, Serialize};

/// Master to replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToReplica {
    /// Answer to a handshake: cut your log at `to`, then expect batches from there.
    Truncate {
        /// The master's epoch.
        master_epoch: Epoch,
        /// Where the replica's log agrees with the master's.
        to: u64,
        /// The log end the handshake named: a replica whose log ends elsewhere (it restarted
        /// or moved on since) ignores this answer.
        for_end: u64,
    },
    /// The replica's log ends below the master's first offset (the master's retention
    /// deleted the segments it would need), or diverges below it: drop the whole log and
    /// start it afresh at `at` (a segment start), then expect batches from there.
    RestartAt {
        /// The master's epoch.
        master_epoch: Epoch,
        /// The master's first offset.
        at: u64,
        /// The log end the replica last reported: a replica whose log ends elsewhere ignores
        /// this answer.
        for_end: u64,
    },
    /// Commit-log bytes `[start, end)` written under `batch_epoch` (one epoch per batch); an
    /// empty range is a heartbeat carrying `confirmed`.
    Batch(BatchHeader),
}

/// The header of a batch of commit-log bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchHeader {
    /// The sender's master epoch.
    pub master_epoch: Epoch,
    /// The epoch the bytes were written under.
    pub batch_epoch: Epoch,
    /// First offset.
    pub start: u64,
    /// One past the last offset.
    pub end: u64,
    /// The master's confirmed offset (every in-sync member has the log up to here).
    pub confirmed: u64,
}

/// Replica to master.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToMaster {
    /// "I follow you from here": the replica's epoch entries and log end.
    Handshake {
        /// The replica.
        replica: BrokerId,
        /// The highest master epoch the replica knows.
        master_epoch: Epoch,
        /// Its log end.
        end: u64,
        /// Its epoch entries.
        epochs: Vec<EpochEntry>,
    },
    /// The replica's log (durably) ends at `end`. Also sent for a batch it could not take
    /// (a gap, or a stale sender: then `master_epoch` is newer than the sender's).
    Ack {
        /// The replica.
        replica: BrokerId,
        /// The highest master epoch the replica knows.
        master_epoch: Epoch,
        /// Its log end.
        end: u64,
    },
    /// The replica could not append a batch (its disk refused it: full, or an I/O error); its
    /// log ends at `end` and it handshakes again later. A hint, as a broken connection is:
    /// writes stop waiting for it.
    CannotAppend {
        /// The replica.
        replica: BrokerId,
        /// The highest master epoch the replica knows.
        master_epoch: Epoch,
        /// Its log end.
        end: u64,
    },
}

impl ToReplica {
    /// The sender's master epoch.
    pub fn master_epoch(&self) -> Epoch {
        match self {
            ToReplica::Truncate { master_epoch, .. }
            | ToReplica::RestartAt { master_epoch, .. } => *master_epoch,
            ToReplica::Batch(h) => h.master_epoch,
        }
    }
}

impl ToMaster {
    /// Who sent it.
    pub fn replica(&self) -> BrokerId {
        match self {
            ToMaster::Handshake { replica, .. }
            | ToMaster::Ack { replica, .. }
            | ToMaster::CannotAppend { replica, .. } => *replica,
        }
    }

    /// The master epoch the sender knows.
    pub fn master_epoch(&self) -> Epoch {
        match self {
            ToMaster::Handshake { master_epoch, .. }
            | ToMaster::Ack { master_epoch, .. }
            | ToMaster::CannotAppend { master_epoch, .. } => *master_epoch,
        }
    }
}
