//! The rebalancer's inputs and outputs: its settings, how queues change hands, leases, the
//! actions a driver executes and the answers it feeds back.

use shoal_proto::MessageQueue;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Attempts at releasing a lock before the rebalancer forgets it.
pub const MAX_UNLOCK_ATTEMPTS: u32 = 10;

/// How a queue changes hands between members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handover {
    /// By evidence: the gainer locks the queue and reads the start offset only once it holds
    /// the lock; the loser unlocks right after its final commit was acknowledged (Shoal's
    /// clustering consumers).
    Locks,
    /// By time (what Shoal did before the rebalance engine, kept so the simulator can show the
    /// race it had): the gainer waits this long after the target changed and then reads the
    /// start offset; nothing is locked. Not exclusive.
    Delay(Duration),
    /// No exclusivity at all: every member owns every queue it is given at once (broadcasting).
    Unguarded,
}

/// Settings of a [`Rebalancer`].
#[derive(Debug, Clone)]
pub struct RebalancerConfig {
    /// Consumer group.
    pub group: String,
    /// This member's client id (what the group's member list contains).
    pub client_id: String,
    /// How queues change hands.
    pub handover: Handover,
    /// Safety-net period: every topic's view is fetched again this long after the last one
    /// (RocketMQ's rebalance interval, 20 s); notices trigger fetches at once.
    pub refresh_interval: Duration,
    /// Wait before fetching a view again after a failed fetch.
    pub refresh_retry: Duration,
    /// First wait before asking again for a lock that was refused; it doubles up to
    /// `lock_retry_max` (for brokers that do not tell when a lock frees).
    pub lock_retry_min: Duration,
    /// Longest wait between two requests for a refused lock.
    pub lock_retry_max: Duration,
    /// Wait before asking again for a refused lock when the broker promised to tell us the
    /// moment it frees (a safety net for a lost notice).
    pub lock_retry_notified: Duration,
    /// Wait before a failed start-offset query is made again.
    pub start_retry: Duration,
    /// How many views in a row may be discarded because a notice arrived while they were
    /// fetched (they are stale); the next one is applied anyway.
    pub max_stale_views: u32,
}

impl RebalancerConfig {
    /// Defaults for `group` and `client_id`: hand-over by locks, 20 s safety net.
    pub fn new(group: impl Into<String>, client_id: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            client_id: client_id.into(),
            handover: Handover::Locks,
            refresh_interval: Duration::from_secs(20),
            refresh_retry: Duration::from_millis(500),
            lock_retry_min: Duration::from_millis(20),
            lock_retry_max: Duration::from_secs(1),
            lock_retry_notified: Duration::from_secs(1),
            start_retry: Duration::from_millis(500),
            max_stale_views: 3,
        }
    }
}

/// How long a member may consume a queue on the strength of one piece of evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Deliveries are allowed strictly before this time.
    pub until: u64,
    /// When the lease should be renewed (a LOCK_BATCH_MQ for these queues is emitted then).
    pub renew_at: u64,
    /// The broker session the evidence belongs to (Shoal brokers); `None` for brokers whose
    /// locks simply expire (Apache RocketMQ).
    pub session: Option<u64>,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Fetch the topic's queues (route) and the group's member ids, then call
    /// [`Rebalancer::handle_view`] (or [`Rebalancer::handle_view_failed`]).
    FetchView {
        /// Topic.
        topic: String,
    },
    /// Lock (or renew) these queues on `broker`, then call [`Rebalancer::handle_lock_result`].
    Lock {
        /// Broker name.
        broker: String,
        /// Queues, sorted.
        queues: Vec<MessageQueue>,
    },
    /// Find where the queue starts (committed offset, else consume-from-where), then call
    /// [`Rebalancer::handle_start_offset`].
    QueryStartOffset {
        /// Queue.
        mq: MessageQueue,
    },
    /// Start pulling and delivering the queue from `offset`.
    Start {
        /// Queue.
        mq: MessageQueue,
        /// First offset to deliver.
        offset: i64,
        /// Deliveries allowed strictly before this time (`None`: no limit).
        lease_until: Option<u64>,
    },
    /// The lease of an owned queue moved.
    Lease {
        /// Queue.
        mq: MessageQueue,
        /// Deliveries allowed strictly before this time.
        until: u64,
    },
    /// Stop the queue gracefully: no new deliveries, let in-flight ones finish, then call
    /// [`Rebalancer::handle_drained`] with the offset to commit.
    Stop {
        /// Queue.
        mq: MessageQueue,
    },
    /// The lease ran out or the lock was lost: stop delivering at once, drop the cached
    /// messages, commit nothing; call [`Rebalancer::handle_drained`] once in-flight
    /// deliveries ended.
    Fence {
        /// Queue.
        mq: MessageQueue,
    },
    /// Commit the offset synchronously, then call [`Rebalancer::handle_committed`].
    Commit {
        /// Queue.
        mq: MessageQueue,
        /// Next offset to consume.
        offset: i64,
        /// The offset may be below the stored one on purpose (an offset reset).
        rewind: bool,
    },
    /// Release the locks, then call [`Rebalancer::handle_unlocked`] for each queue.
    Unlock {
        /// Broker name.
        broker: String,
        /// Queues, sorted.
        queues: Vec<MessageQueue>,
    },
    /// The end of a graceful release in one request (a broker whose grant said
    /// [`LockAnswer::commit_on_unlock`]): UNLOCK_BATCH_MQ carrying the final offset; the broker
    /// stores it (commit fence as for any commit) and then frees the lock. Then call
    /// [`Rebalancer::handle_unlocked`].
    CommitAndUnlock {
        /// Broker name.
        broker: String,
        /// Queue.
        mq: MessageQueue,
        /// Next offset to consume.
        offset: i64,
    },
}

/// Where a queue starts, as the driver found it: the answer to [`Action::QueryStartOffset`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOffset {
    /// The group's committed offset.
    Committed(i64),
    /// The group has no offset for the queue: where consume-from-where puts it. The position
    /// is this member's choice until it is committed: a queue released before it started
    /// commits it (as a Kafka consumer commits the reset position of an assigned partition on
    /// close), so the group keeps it rather than leaving the next owner's consume-from-where
    /// to decide.
    Resolved(i64),
}

impl StartOffset {
    /// The offset, whatever its origin.
    pub fn offset(self) -> i64 {
        match self {
            StartOffset::Committed(o) | StartOffset::Resolved(o) => o,
        }
    }
}

/// A broker's answer to an [`Action::Lock`], for [`Rebalancer::handle_lock_answer`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockAnswer {
    /// The queues the broker says we hold now.
    pub granted: BTreeSet<MessageQueue>,
    /// Their lease; `None` when the request failed (nothing is known).
    pub lease: Option<Lease>,
    /// The broker tells us when a refused lock frees (NOTIFY_LOCK_FREED).
    pub notice_expected: bool,
    /// The group's committed offsets of granted queues, read by the broker after it granted
    /// them (feature `offsetOnGrant`): such a queue starts there without a start-offset query.
    /// A granted queue not listed (nothing committed, or a broker without the feature) is
    /// queried as usual.
    pub committed: BTreeMap<MessageQueue, i64>,
    /// The broker applies a final commit carried on UNLOCK_BATCH_MQ (feature
    /// `commitOnUnlock`): releases end with [`Action::CommitAndUnlock`].
    pub commit_on_unlock: bool,
}

/// Counters of one rebalancer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RebalanceStats {
    /// Times the target changed.
    pub rounds: u64,
    /// Queues started.
    pub started: u64,
    /// Queues released after a graceful hand-over.
    pub released: u64,
    /// Queues fenced (lease ran out, lock lost).
    pub fenced: u64,
    /// Lock requests answered with the queue refused.
    pub lock_refused: u64,
    /// Views discarded because a notice arrived while they were fetched.
    pub stale_views: u64,
    /// Views whose member list did not contain this member (fetched again soon).
    pub views_without_self: u64,
    /// Queues that started at the committed offset the lock grant carried (no query).
    pub offsets_on_grant: u64,
    /// Member lists taken from membership notices (no view fetch).
    pub member_lists: u64,
    /// Locked queues held back for a fresh view because a notice came after theirs.
    pub held_for_view: u64,
}
