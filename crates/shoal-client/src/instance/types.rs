//! The answers and arguments of an instance's calls to brokers.

use shoal_proto::message::MessageExt;
use shoal_proto::MessageQueue;
use std::time::Duration;

/// The outcome of a pull, as RocketMQ's `PullStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullStatus {
    /// Messages were found.
    Found,
    /// Nothing new at this offset.
    NoNewMsg,
    /// Entries were scanned but none matched the subscription.
    NoMatchedMsg,
    /// The offset is outside the queue; use `next_begin_offset`.
    OffsetIllegal,
}

/// A pull answer.
#[derive(Debug, Clone)]
pub struct PullResult {
    /// What happened.
    pub status: PullStatus,
    /// Where to pull next.
    pub next_begin_offset: i64,
    /// The queue's minimum offset.
    pub min_offset: i64,
    /// The queue's maximum offset (next to be written).
    pub max_offset: i64,
    /// The messages (with `Found`), bodies decompressed.
    pub messages: Vec<MessageExt>,
}

/// The arguments of a pull.
#[derive(Debug, Clone)]
pub struct PullArgs<'a> {
    /// Request code: PULL_MESSAGE (push consumer) or LITE_PULL_MESSAGE.
    pub code: i32,
    /// Consumer group.
    pub group: &'a str,
    /// Queue.
    pub mq: &'a MessageQueue,
    /// Offset to read from.
    pub offset: i64,
    /// Maximum number of messages.
    pub max_msgs: i32,
    /// PullSysFlag bits.
    pub sys_flag: i32,
    /// Offset to commit (with COMMIT_OFFSET).
    pub commit_offset: i64,
    /// Long-polling hold, ms.
    pub suspend_ms: i64,
    /// Subscription expression (sent with SUBSCRIPTION).
    pub subscription: Option<&'a str>,
    /// Subscription version.
    pub sub_version: i64,
    /// Expression type of `subscription`: `TAG` or `SQL92`.
    pub expression_type: &'a str,
    /// RPC timeout.
    pub timeout: Duration,
}

/// What kind of broker an address is (GET_BROKER_FEATURES).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerKind {
    /// A Shoal broker and the features it lists.
    Shoal(shoal_proto::ext::BrokerFeatures),
    /// A broker that does not know Shoal's extensions (Apache RocketMQ).
    RocketMq,
}

impl BrokerKind {
    /// True for a Shoal broker with session locks.
    pub fn has_session_locks(&self) -> bool {
        matches!(self, BrokerKind::Shoal(f) if f.has(shoal_proto::ext::feature::SESSION_LOCKS))
    }

    /// True for a Shoal broker that lists the feature `name` (`shoal_proto::ext::feature`).
    pub fn has(&self, name: &str) -> bool {
        matches!(self, BrokerKind::Shoal(f) if f.has(name))
    }

    /// True for a Shoal broker that coordinates groups (coordinated mode); Apache RocketMQ
    /// brokers and Shoal brokers with `[coordinator] enabled = false` do not.
    pub fn has_coordinator(&self) -> bool {
        matches!(self, BrokerKind::Shoal(f) if f.has(shoal_proto::ext::feature::COORDINATOR))
    }
}

/// What a LOCK_BATCH_MQ answered.
#[derive(Debug, Clone, Default)]
pub struct LockGrant {
    /// The queues held now.
    pub locked: Vec<MessageQueue>,
    /// The session they last for (session locks on a Shoal broker).
    pub session: Option<u64>,
    /// The group's committed offsets of granted queues (topic, queue id, offset), when asked
    /// for and the broker has `offsetOnGrant`.
    pub committed: Vec<(String, i32, i64)>,
}
