//! The bounded history of a group's rebalances (`shoal group history`).

use serde::{Deserialize, Serialize};
use shoal_proto::mq::MessageQueue;
use std::collections::VecDeque;

/// Why a group's epoch was bumped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum RebalanceCause {
    /// A member joined.
    Join {
        /// The member.
        member: String,
    },
    /// A member left.
    Leave {
        /// The member.
        member: String,
    },
    /// Members' sessions expired.
    SessionExpired {
        /// The members.
        members: Vec<String>,
    },
    /// Members did not release revoked queues within their rebalance timeout.
    RebalanceTimeout {
        /// The members.
        members: Vec<String>,
    },
    /// A dynamic member's connection closed.
    ConnectionClosed {
        /// The members.
        members: Vec<String>,
    },
    /// A member's subscriptions changed.
    SubscriptionChanged {
        /// The member.
        member: String,
    },
    /// The group's assignor changed (the one most members ask for).
    AssignorChanged {
        /// The new assignor.
        assignor: String,
    },
    /// A subscribed topic's queues changed.
    TopicChanged {
        /// The topic.
        topic: String,
    },
    /// The coordinator restarted from a snapshot (epoch moved forward, nothing moved).
    Restored,
    /// All members were removed at once.
    Cleared,
}

impl std::fmt::Display for RebalanceCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Join { member } => write!(f, "join {member}"),
            Self::Leave { member } => write!(f, "leave {member}"),
            Self::SessionExpired { members } => write!(f, "session expired {}", members.join(",")),
            Self::RebalanceTimeout { members } => {
                write!(f, "rebalance timeout {}", members.join(","))
            }
            Self::ConnectionClosed { members } => {
                write!(f, "connection closed {}", members.join(","))
            }
            Self::SubscriptionChanged { member } => write!(f, "subscription changed {member}"),
            Self::AssignorChanged { assignor } => write!(f, "assignor {assignor}"),
            Self::TopicChanged { topic } => write!(f, "topic changed {topic}"),
            Self::Restored => write!(f, "coordinator restored"),
            Self::Cleared => write!(f, "group cleared"),
        }
    }
}

/// One queue whose target owner changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMove {
    /// The queue.
    pub queue: MessageQueue,
    /// Its target owner before (none: the queue is new or had no owner).
    pub from: Option<String>,
    /// Its target owner after (none: the queue is gone or nobody subscribes it).
    pub to: Option<String>,
}

/// One rebalance: a group epoch bump.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RebalanceRecord {
    /// The group epoch it created.
    pub group_epoch: i32,
    /// When, coordinator time (ms).
    pub at_ms: u64,
    /// Why.
    pub cause: RebalanceCause,
    /// Queues whose target owner changed.
    pub moves: Vec<QueueMove>,
    /// Members in the group after the change.
    pub members: usize,
    /// When every member owned exactly its target (none while reconciling, or when a newer
    /// rebalance came first).
    pub reconciled_at_ms: Option<u64>,
    /// A newer rebalance started before this one was reconciled.
    pub superseded: bool,
}

impl RebalanceRecord {
    /// Queues that changed from one member to another (not counting first or last owners).
    pub fn moved(&self) -> usize {
        self.moves
            .iter()
            .filter(|m| m.from.is_some() && m.to.is_some())
            .count()
    }

    /// Milliseconds from the change to reconciliation, once reconciled.
    pub fn reconcile_ms(&self) -> Option<u64> {
        self.reconciled_at_ms.map(|r| r.saturating_sub(self.at_ms))
    }
}

/// The last rebalances of a group, at most `limit`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct History {
    records: VecDeque<RebalanceRecord>,
}

impl History {
    pub(crate) fn push(&mut self, record: RebalanceRecord, limit: usize) {
        if let Some(last) = self.records.back_mut() {
            if last.reconciled_at_ms.is_none() {
                last.superseded = true;
            }
        }
        self.records.push_back(record);
        while self.records.len() > limit.max(1) {
            self.records.pop_front();
        }
    }

    /// Marks the newest rebalance reconciled at `now_ms` if it is not yet.
    pub(crate) fn reconciled(&mut self, epoch: i32, now_ms: u64) {
        if let Some(last) = self.records.back_mut() {
            if last.group_epoch == epoch && last.reconciled_at_ms.is_none() && !last.superseded {
                last.reconciled_at_ms = Some(now_ms);
            }
        }
    }

    pub(crate) fn records(&self) -> &VecDeque<RebalanceRecord> {
        &self.records
    }
}
