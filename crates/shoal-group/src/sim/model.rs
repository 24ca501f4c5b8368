//! The broker as the simulator's members see it: the requests they send, the answers they
//! get and the notices the broker sends back ([`BrokerModel`]). Two models run the seeded
//! schedules: [`super::SimBroker`], built from this crate's shipped [`GroupState`] (with its
//! fences and effects) and an in-memory queue, and the real broker's request handlers on
//! virtual time (`shoal-broker`'s harness), so the schedules exercise the code that ships.
//!
//! [`GroupState`]: crate::state::GroupState

use crate::coordinator::GroupDescription;
use crate::rebalance::StartOffset;
use shoal_proto::MessageQueue;
use std::collections::BTreeMap;
use std::fmt;

/// The consumer group every simulated member joins.
pub const GROUP: &str = "G";
/// The topic it consumes.
pub const TOPIC: &str = "T";
/// The broker's name.
pub const BROKER: &str = "b";

/// Queue `i` of the simulated topic.
pub fn mq(i: i32) -> MessageQueue {
    MessageQueue::new(TOPIC, BROKER, i)
}

/// A request of a member to the broker.
#[derive(Debug, Clone)]
pub enum Req {
    /// HEART_BEAT (with the member's session timeout when it locks queues).
    Heartbeat {
        /// Its session timeout (Shoal members), ms.
        session_timeout_ms: Option<u64>,
    },
    /// The topic's queues and the group's members (classic allocation).
    View,
    /// LOCK_BATCH_MQ with session locks.
    Lock(Vec<MessageQueue>),
    /// UNLOCK_BATCH_MQ.
    Unlock(Vec<MessageQueue>),
    /// UNLOCK_BATCH_MQ carrying the final commit of the queue ([`super::SimConfig::extensions`]).
    CommitUnlock(MessageQueue, i64),
    /// QUERY_CONSUMER_OFFSET.
    QueryOffset(MessageQueue),
    /// UPDATE_CONSUMER_OFFSET.
    Commit(MessageQueue, i64),
    /// PULL_MESSAGE of up to [`PULL_BATCH`] messages from the offset (held when there is none).
    Pull(MessageQueue, i64),
    /// UNREGISTER_CLIENT.
    Unregister,
    /// GROUP_HEARTBEAT.
    GroupHeartbeat {
        /// The member id.
        member_id: String,
        /// Its member epoch.
        epoch: i32,
        /// Its static instance id.
        instance_id: Option<String>,
        /// The queues it holds.
        owned: Vec<MessageQueue>,
    },
    /// GROUP_LEAVE (not permanent).
    GroupLeave {
        /// The member id.
        member_id: String,
    },
}

/// Messages a pull returns at most.
pub const PULL_BATCH: i64 = 8;

/// What the coordinator answered a group heartbeat.
#[derive(Debug, Clone)]
pub enum GroupAnswer {
    /// The member's epoch, assignment and heartbeat interval.
    Assigned {
        /// Member epoch.
        epoch: i32,
        /// Assigned queues.
        queues: Vec<MessageQueue>,
        /// Heartbeat interval, ms.
        interval: u64,
    },
    /// FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID (why): drop everything, rejoin.
    Fenced(String),
    /// Another refusal (e.g. UNRELEASED_INSTANCE_ID): try again at the next interval.
    Refused,
}

/// The broker's answer to a request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// The member's session (0: none).
    Heartbeat(u64),
    /// The topic's queues and the group's client ids.
    View(Vec<MessageQueue>, Vec<String>),
    /// Granted, session, committed offsets of granted queues ([`super::SimConfig::extensions`]).
    Lock(Vec<MessageQueue>, Option<u64>, BTreeMap<MessageQueue, i64>),
    /// Unlocked (a carried commit is stored or refused silently).
    Unlocked,
    /// Where a queue starts.
    Offset(StartOffset),
    /// The commit was stored.
    Committed(bool),
    /// Queue offsets of the messages pulled.
    Pull(Vec<i64>),
    /// Done.
    Done,
    /// A group heartbeat's answer.
    Group(GroupAnswer),
    /// The member-epoch fence refused a lock, pull or commit.
    Fenced,
}

/// What the broker does with a request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Answer now.
    Reply(Reply),
    /// A pull that found nothing: held until a message arrives or the hold expires.
    Hold,
}

/// A member list a notice carries (feature `memberListNotice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberListNotice {
    /// Version (higher is newer).
    pub version: u64,
    /// The group's client ids.
    pub client_ids: Vec<String>,
}

/// What the broker sends after handling something.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Membership notices (NOTIFY_CONSUMER_IDS_CHANGED) to these connections, with the member
    /// list for those that take one.
    pub notify: Vec<(u64, Option<MemberListNotice>)>,
    /// Lock-freed notices: connection → queues.
    pub freed: Vec<(u64, Vec<MessageQueue>)>,
    /// The coordinator's assignment notices (heartbeat now) to these connections.
    pub assign: Vec<u64>,
}

/// The broker of a simulated run. See the [module documentation](self).
pub trait BrokerModel: fmt::Debug {
    /// Handles a request of `client_id` on `conn` at virtual `now`. `stamp` is the member id
    /// and epoch a coordinated member's locks, pulls and commits carry.
    fn handle(
        &mut self,
        now: u64,
        conn: u64,
        client_id: &str,
        req: &Req,
        stamp: Option<&(String, i32)>,
        out: &mut Outbox,
    ) -> Answer;

    /// The group's committed offset of a queue (the simulator checks it never moves back).
    fn committed_offset(&self, queue: &MessageQueue) -> Option<i64>;

    /// A member's connection closed.
    fn connection_closed(&mut self, now: u64, conn: u64, out: &mut Outbox);

    /// The broker's timers (client expiry, the coordinator's timeouts).
    fn tick(&mut self, now: u64, out: &mut Outbox);

    /// A producer stores one message in queue `queue`.
    fn produce(&mut self, now: u64, queue: i32);

    /// The topic grows by `more` queues.
    fn add_queues(&mut self, now: u64, more: i32, out: &mut Outbox);

    /// The topic's queues.
    fn queues(&self) -> Vec<MessageQueue>;

    /// Messages stored in a queue (its next offset).
    fn max_offset(&self, queue: &MessageQueue) -> i64;

    /// Queue offsets of up to `max` messages from `offset` (a held pull's answer).
    fn read(&mut self, queue: &MessageQueue, offset: i64, max: i64) -> Vec<i64>;

    /// The coordinator's own invariants.
    fn check_coordinator(&self) -> Result<(), String>;

    /// The coordinated group as the coordinator describes it.
    fn describe_group(&self, now: u64) -> Option<GroupDescription>;
}
