//! The commands of the controller's replicated log and what applying one answers.
//!
//! Every change to the replication metadata is one [`Command`], proposed by the controller
//! leader, committed through Raft and applied in log order by every voter to its
//! [`super::Metadata`]. Applying is deterministic (no clock, no randomness): each check that
//! fences a stale sender (master epoch, in-sync-set epoch, a fenced lease) happens at apply
//! time, so a command decided on an outdated view is refused rather than applied.

use super::limits::MetadataLimits;
use crate::{BrokerId, Epoch};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One entry of the controller's log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A broker of `group` with no id yet asks for one (RocketMQ's
    /// CONTROLLER_APPLY_BROKER_ID); ids start at 1 and are never reused.
    ApplyBrokerId {
        /// The broker group (`brokerName`).
        group: String,
        /// The broker's address for remoting.
        addr: String,
        /// A nonce the broker wrote to its disk before asking (RocketMQ's register check
        /// code): asking again with it answers the same id, so a retry is harmless, and a
        /// broker that lost its disk gets a new id (and so is in no in-sync set).
        token: String,
    },
    /// A broker with an id (re)registers its address (CONTROLLER_REGISTER_BROKER).
    RegisterBroker {
        /// The broker group.
        group: String,
        /// The id the controller gave it.
        broker_id: BrokerId,
        /// Its current address.
        addr: String,
    },
    /// The master changes the in-sync set (CONTROLLER_ALTER_SYNC_STATE_SET); fenced by both
    /// epochs it names.
    AlterInSyncSet {
        /// The broker group.
        group: String,
        /// The master asking.
        master: BrokerId,
        /// The master epoch it holds.
        master_epoch: Epoch,
        /// The in-sync-set epoch its proposal is based on.
        in_sync_epoch: Epoch,
        /// The proposed set; must hold the master.
        in_sync: BTreeSet<BrokerId>,
    },
    /// The master renews its write lease.
    GrantLease {
        /// The broker group.
        group: String,
        /// The master asking.
        master: BrokerId,
        /// The master epoch it holds.
        master_epoch: Epoch,
    },
    /// No more leases for `master_epoch`: the first step of every election after the first.
    FenceLeases {
        /// The broker group.
        group: String,
        /// The epoch whose leases end.
        master_epoch: Epoch,
    },
    /// Elect `master` (CONTROLLER_ELECT_MASTER): refused unless the group is still at
    /// `expect_master_epoch`, that epoch's leases are fenced (or the group never had a master)
    /// and `master` is in the in-sync set (any member for a group that never had one). The
    /// old master leaves the in-sync set; the other members stay.
    ElectMaster {
        /// The broker group.
        group: String,
        /// The broker to make master.
        master: BrokerId,
        /// The master epoch the decision was taken at.
        expect_master_epoch: Epoch,
    },
    /// The leader's configured limits become every voter's. Limits are part of the
    /// deterministic apply, so they change in log order, never from a voter's own file.
    SetLimits {
        /// The limits from here on.
        limits: MetadataLimits,
    },
}

impl Command {
    /// The broker group the command is about (empty for [`Command::SetLimits`]).
    pub fn group(&self) -> &str {
        match self {
            Command::ApplyBrokerId { group, .. }
            | Command::RegisterBroker { group, .. }
            | Command::AlterInSyncSet { group, .. }
            | Command::GrantLease { group, .. }
            | Command::FenceLeases { group, .. }
            | Command::ElectMaster { group, .. } => group,
            Command::SetLimits { .. } => "",
        }
    }
}

/// The replication metadata of one broker group, as every voter holds it after applying.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// Members by broker id.
    pub members: BTreeMap<BrokerId, Member>,
    /// The master, once one was elected.
    pub master: Option<BrokerId>,
    /// Grows by one at every election; 0 before the first.
    pub master_epoch: Epoch,
    /// The in-sync set (RocketMQ's SyncStateSet, Kafka's ISR); holds the master.
    pub in_sync: BTreeSet<BrokerId>,
    /// Grows by one at every change of the in-sync set.
    pub in_sync_epoch: Epoch,
    /// Grows by one at every lease granted.
    pub lease_generation: u64,
    /// Leases of this master epoch and below are no longer granted.
    pub fenced_epoch: Epoch,
    /// The id the next broker applying for one gets.
    pub next_broker_id: BrokerId,
}

/// One broker of a group, as registered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its remoting address.
    pub addr: String,
    /// The nonce it applied for its id with.
    pub token: String,
}

/// Why a command was not applied. Each names the fence that stopped it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// No broker of this group ever registered.
    #[error("unknown broker group")]
    UnknownGroup,
    /// The broker id was never given in this group.
    #[error("unknown broker id {0}")]
    UnknownBroker(BrokerId),
    /// The sender's master epoch is not the group's.
    #[error("stale master epoch, the group is at {current}")]
    StaleMasterEpoch {
        /// The group's master epoch.
        current: Epoch,
    },
    /// The proposal was based on another in-sync-set epoch.
    #[error("stale in-sync-set epoch, the group is at {current}")]
    StaleInSyncEpoch {
        /// The group's in-sync-set epoch.
        current: Epoch,
    },
    /// The sender is not the group's master.
    #[error("not the master")]
    NotMaster,
    /// The candidate is not in the in-sync set.
    #[error("broker {0} is not in the in-sync set")]
    NotInSync(BrokerId),
    /// The proposed in-sync set lacks the master or names a non-member.
    #[error("invalid in-sync set")]
    InvalidInSyncSet,
    /// Leases of this epoch were fenced for an election.
    #[error("leases of master epoch {0} are fenced")]
    LeaseFenced(Epoch),
    /// The old master's leases are not fenced yet.
    #[error("the master's leases are not fenced")]
    NotFenced,
    /// A configured limit (groups, members of a group) is reached.
    #[error("limit reached: {0}")]
    Limit(String),
}

/// What applying a command answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// A broker id was given.
    BrokerId(BrokerId),
    /// The command changed (or confirmed) the group; its state after applying.
    Group(GroupInfo),
    /// A lease was granted for `master_epoch`.
    LeaseGranted {
        /// The epoch the lease is for.
        master_epoch: Epoch,
        /// The group's lease generation after the grant.
        generation: u64,
    },
    /// The limits changed.
    LimitsSet,
    /// Refused, and why.
    Refused(Refusal),
}
