//! What a [`GroupState`](super::GroupState) operation asks its owner to do once the lock is
//! released, and the group modes it reports.

use crate::coordinator::RemovalReason;
use crate::membership::GroupHealth;
use shoal_proto::ext::ConsumerIdsNotice;
use shoal_proto::MessageQueue;
use std::collections::BTreeSet;

/// Which protocol a group runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum GroupMode {
    /// The broker coordinates it.
    Coordinated,
    /// Members allocate client-side (RocketMQ's model).
    Classic,
    /// No members.
    Empty,
    /// Kafka classic-protocol members (JoinGroup/SyncGroup) of the Kafka listener; only in
    /// GROUP_DESCRIBE answers (the broker's group state does not hold these groups).
    KafkaClassic,
}

impl std::fmt::Display for GroupMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Coordinated => "coordinated",
            Self::Classic => "classic",
            Self::Empty => "empty",
            Self::KafkaClassic => "kafkaClassic",
        })
    }
}

/// The member list a NOTIFY_CONSUMER_IDS_CHANGED carries to the members that asked for it
/// (Shoal members with a session: feature `memberListNotice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberList {
    /// The list and its version.
    pub notice: ConsumerIdsNotice,
    /// Connections that get the list with the notice; the others get a plain notice.
    pub to: BTreeSet<u64>,
}

/// What the owner of a [`GroupState`](super::GroupState) does after an operation, outside
/// the lock. Every reaction to a membership change is one of these, so the simulator sees the
/// same decisions the broker executes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupEffect {
    /// Tell a coordinated member to heartbeat now (GROUP_ASSIGNMENT_CHANGED).
    NotifyMember {
        /// The group.
        group: String,
        /// The member.
        member_id: String,
        /// Its connection.
        conn_id: u64,
    },
    /// A coordinated member left for good (log, count).
    MemberRemoved {
        /// The group.
        group: String,
        /// The member.
        member_id: String,
        /// Why.
        reason: RemovalReason,
    },
    /// The coordinator's state of `group` changed: persist it (and, in a replicated broker
    /// group, replicate it).
    Persist {
        /// The group.
        group: String,
    },
    /// Queue locks a member waited for are free: tell it (NOTIFY_LOCK_FREED).
    LockFreed {
        /// The group.
        group: String,
        /// The waiting member's connection.
        conn_id: u64,
        /// The freed queues it had asked for.
        queues: Vec<MessageQueue>,
    },
    /// A group changed mode.
    ModeChanged {
        /// The group.
        group: String,
        /// Its mode now.
        mode: GroupMode,
        /// Connections of coordinated members to tell (they heartbeat and learn the mode).
        notify_conn_ids: Vec<u64>,
    },
    /// A classic group's members or subscriptions changed: tell every remaining member to
    /// rebalance (NOTIFY_CONSUMER_IDS_CHANGED). Not produced for broadcasting groups. The
    /// owner skips it for a group whose subscription config switches notices off.
    ConsumerIdsChanged {
        /// The group.
        group: String,
        /// Connections to notify.
        conn_ids: Vec<u64>,
        /// The member list for those that take it (only when just members changed).
        member_list: Option<MemberList>,
    },
    /// A classic group's membership changed (for the rebalance timeline).
    MembershipObserved {
        /// The group.
        group: String,
        /// Its members now: connection and client id.
        members: Vec<(u64, String)>,
        /// A subscription changed (not only members).
        subscription_changed: bool,
    },
    /// The queue locks of a client that left were released (log).
    ClientLocksReleased {
        /// The group.
        group: String,
        /// The client that left.
        client_id: String,
        /// How many locks it held.
        count: usize,
    },
    /// A group's health changed: duplicate client ids or inconsistent subscriptions appeared
    /// or went away (log).
    HealthChanged {
        /// The group.
        group: String,
        /// Its health now.
        health: GroupHealth,
    },
}
