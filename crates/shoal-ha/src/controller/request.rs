//! What brokers and operators ask a controller voter, and what it answers.

use super::command::{GroupInfo, Refusal};
use crate::time::Millis;
use crate::{BrokerId, Epoch};
use serde::{Deserialize, Serialize};

/// A request from a broker or an operator to the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Ask for a broker id (idempotent per token).
    ApplyBrokerId {
        /// The broker group.
        group: String,
        /// The broker's address.
        addr: String,
        /// The nonce on the broker's disk.
        token: String,
    },
    /// Register an address under an id.
    Register {
        /// The broker group.
        group: String,
        /// Its id.
        broker_id: BrokerId,
        /// Its address.
        addr: String,
    },
    /// Liveness and replication progress; answered at once with the group's metadata as the
    /// leader last applied it (RocketMQ's BROKER_HEARTBEAT and GET_REPLICA_INFO in one).
    Heartbeat {
        /// The broker group.
        group: String,
        /// Its id.
        broker_id: BrokerId,
        /// The epoch of the last entry in its log.
        last_epoch: Epoch,
        /// The end offset of its commit log.
        end_offset: u64,
    },
    /// The master renews its write lease (also a heartbeat).
    RenewLease {
        /// The broker group.
        group: String,
        /// The master.
        broker_id: BrokerId,
        /// Its master epoch.
        master_epoch: Epoch,
    },
    /// The master changes the in-sync set.
    AlterInSyncSet {
        /// The broker group.
        group: String,
        /// The master.
        master: BrokerId,
        /// Its master epoch.
        master_epoch: Epoch,
        /// The in-sync-set epoch the proposal is based on.
        in_sync_epoch: Epoch,
        /// The proposed set.
        in_sync: std::collections::BTreeSet<BrokerId>,
    },
    /// An operator's switch-over: elect `target` (or the best in-sync replica) once the
    /// current master's lease has certainly expired.
    ElectMaster {
        /// The broker group.
        group: String,
        /// The replica to elect, or `None` for the best one.
        target: Option<BrokerId>,
    },
}

impl Request {
    /// The remoting request code it travels with: RocketMQ's controller codes where one exists,
    /// Shoal's CONTROLLER_RENEW_LEASE (9081) for the lease.
    pub fn request_code(&self) -> i32 {
        use shoal_proto::code::request_code as rc;
        match self {
            Request::ApplyBrokerId { .. } => rc::CONTROLLER_APPLY_BROKER_ID,
            Request::Register { .. } => rc::CONTROLLER_REGISTER_BROKER,
            Request::Heartbeat { .. } => rc::BROKER_HEARTBEAT,
            Request::RenewLease { .. } => shoal_proto::ext::request_code::CONTROLLER_RENEW_LEASE,
            Request::AlterInSyncSet { .. } => rc::CONTROLLER_ALTER_SYNC_STATE_SET,
            Request::ElectMaster { .. } => rc::CONTROLLER_ELECT_MASTER,
        }
    }

    /// The broker that sent it, for requests only a broker sends (the group and its id; the
    /// master for an in-sync-set change): what [`super::BrokerConnections`] records.
    pub fn broker(&self) -> Option<(&str, BrokerId)> {
        match self {
            Request::Register {
                group, broker_id, ..
            }
            | Request::Heartbeat {
                group, broker_id, ..
            }
            | Request::RenewLease {
                group, broker_id, ..
            } => Some((group, *broker_id)),
            Request::AlterInSyncSet { group, master, .. } => Some((group, *master)),
            Request::ApplyBrokerId { .. } | Request::ElectMaster { .. } => None,
        }
    }
}

/// The controller's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The broker's id.
    BrokerId(BrokerId),
    /// The group's metadata after the request.
    Group(GroupInfo),
    /// The lease is granted: the master may acknowledge writes for `lease_ms` counted from
    /// when it sent the request.
    LeaseGranted {
        /// The epoch the lease is for.
        master_epoch: Epoch,
        /// Its length.
        lease_ms: Millis,
    },
    /// Refused by a fence or a limit.
    Refused(Refusal),
    /// This voter is not the leader; ask `leader` (a voter id) if known.
    NotLeader {
        /// The leader this voter knows of.
        leader: Option<u64>,
    },
    /// Too many requests in flight; retry later.
    Busy,
}

/// Who sent a request; the caller's own handle, given back with the answer.
pub type ClientToken = u64;
