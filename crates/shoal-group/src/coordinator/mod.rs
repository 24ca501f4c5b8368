//! The group coordinator of coordinated mode (as Kafka's KIP-848 consumer groups), sans-IO.
//!
//! The broker feeds [`Coordinator`] events with a time (heartbeats, leaves, queue releases,
//! closed connections, topic queue changes, timer ticks) and executes the [`Effect`]s it
//! returns through [`Coordinator::poll_effect`] (tell a member to heartbeat now, release the
//! broker locks of a member that is gone, persist the state). Nothing here sleeps or does I/O,
//! so every race replays on virtual time.
//!
//! Per group it keeps the members (member id, optional static instance id, client id,
//! subscribed topics, assigned queues, queues pending revocation, member epoch, session
//! deadline), the **group epoch**, the assignor and the **target assignment**.
//!
//! - A change (a member joins or leaves, a session expires, a member is fenced, a subscription,
//!   the assignor or a topic's queues change) bumps the group epoch and computes a new target
//!   with the group's strategy *given the current target*, topic by topic (as RocketMQ
//!   allocates), so `STICKY` and `COOPERATIVE_STICKY` move exactly the minimum.
//! - **Reconciliation is per member** (Kafka's `CurrentAssignmentBuilder` states): a member
//!   first gives up what it must lose (its epoch stays until it reports them released); then it
//!   moves to the target epoch and receives those of its target queues that are free. A queue
//!   is free only once its previous owner reported it released (heartbeat without it, or the
//!   broker saw it unlocked), left, was fenced, or its session expired. A member that does not
//!   release within its rebalance timeout is fenced. Members are reconciled independently, so
//!   one slow member never stalls the others; a member whose assignment changed is told to
//!   heartbeat at once ([`Effect::Notify`]), so a hand-over takes round trips, not heartbeat
//!   intervals.
//! - **Exclusive by construction**: a queue is in at most one member's assigned or
//!   pending-revocation set at any time ([`Coordinator::check_invariants`]).
//! - **Fencing**: pulls, commits and lock renewals carry the member epoch and are checked with
//!   [`Coordinator::validate`]: the member must exist, its epoch must not be ahead, and the
//!   queue must have been given to it at or before that epoch. A heartbeat is fenced when
//!   its epoch is ahead or it claims a queue it was not given; a queue the member released by
//!   evidence (the broker saw the unlock) that a heartbeat built before the unlock still
//!   names is a stale report and ignored, as Kafka reconciles owned partitions.
//! - **Static membership**: a member with an instance id that leaves gracefully (or whose
//!   connection closes) keeps its queues reserved until its session times out; a new member
//!   with the same instance id takes over its queues and epoch, and nothing moves.
//! - A bounded **history** of rebalances (time, cause, queues moved from/to, time until
//!   reconciled).
//! - [`Coordinator::snapshot`] / [`Coordinator::restore`]: the state a restarted coordinator
//!   needs so that members keep their queues and epochs never go backwards;
//!   [`CoordinatorUpdate`] / [`CoordinatorFollower`]: the same state carried from a replicated
//!   broker group's master to its replicas, so a replica that takes over continues above it.

mod group;
mod history;
mod queue_map;
mod replicated;
#[cfg(test)]
mod tests;

pub use group::{MemberDescription, MemberState};
pub use history::{QueueMove, RebalanceCause, RebalanceRecord};
pub use replicated::{CoordinatorFollower, CoordinatorUpdate};

use crate::error::{GroupError, Result};
use group::Group;
use serde::{Deserialize, Serialize};
use shoal_proto::mq::MessageQueue;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The member epoch a member sends to join (or rejoin after being fenced).
pub const JOIN_EPOCH: i32 = 0;

/// Epochs added to every group when a coordinator restores a snapshot: updates after the
/// snapshot may have been lost in a crash, and epochs must never go backwards.
pub const RESTORE_EPOCH_GAP: i32 = 1000;

/// Assignors a coordinated group may use: those that need no context beyond queues, members
/// and the previous assignment (`MACHINE_ROOM*` and `CONFIG` need per-client configuration,
/// which only classic mode has).
pub const COORDINATED_ASSIGNORS: &[&str] = &[
    "AVG",
    "AVG_BY_CIRCLE",
    "CONSISTENT_HASH",
    "RANGE",
    "ROUND_ROBIN",
    "STICKY",
    "COOPERATIVE_STICKY",
    "BALANCED_STICKY",
];

/// Limits and timers of the coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// The broker coordinates groups (advertises `coordinator` in GET_BROKER_FEATURES and
    /// answers GROUP_HEARTBEAT); `false`: every group allocates client-side (classic).
    pub enabled: bool,
    /// A member that does not heartbeat for this long is removed (Kafka
    /// `group.consumer.session.timeout.ms`, 45 s), unless its heartbeat names its own session
    /// timeout ([`HeartbeatRequest::session_timeout_ms`]).
    pub session_timeout_ms: u64,
    /// How often members heartbeat when nothing changes (Kafka
    /// `group.consumer.heartbeat.interval.ms` is 5 s; Shoal also pushes notices).
    pub heartbeat_interval_ms: u64,
    /// How long a member may take to release revoked queues when it does not say (Shoal uses
    /// RocketMQ's 60 s lock lifetime).
    pub rebalance_timeout_ms: u64,
    /// The largest rebalance timeout a member may ask for (Kafka's `max.poll.interval.ms`
    /// default, 300 s).
    pub max_rebalance_timeout_ms: u64,
    /// Rebalances kept per group for `shoal group history`.
    pub history_limit: usize,
    /// Members per group.
    pub max_members_per_group: usize,
    /// Groups per coordinator (empty groups are evicted first).
    pub max_groups: usize,
    /// Topics one member may subscribe.
    pub max_subscriptions: usize,
    /// Queues one heartbeat may report owned.
    pub max_owned: usize,
    /// Longest member id, instance id, client id or group name.
    pub max_id_len: usize,
    /// Assignor of a group whose members name none: `STICKY`, balanced (loads differ by at
    /// most one) and moving the fewest queues when members come and go, given the current
    /// assignment (as KIP-848's default assignor is sticky).
    pub default_assignor: String,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            rebalance_timeout_ms: 60_000,
            max_rebalance_timeout_ms: 300_000,
            history_limit: 64,
            max_members_per_group: 1024,
            max_groups: 10_000,
            max_subscriptions: 256,
            max_owned: 16_384,
            max_id_len: 255,
            default_assignor: "STICKY".to_string(),
        }
    }
}

/// A member's heartbeat (join when `member_epoch` is [`JOIN_EPOCH`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeartbeatRequest {
    /// The consumer group.
    pub group: String,
    /// The member id, chosen by the client, unique per client incarnation.
    pub member_id: String,
    /// The member epoch the client holds ([`JOIN_EPOCH`] to join).
    pub member_epoch: i32,
    /// A stable instance id (static membership), if any.
    pub instance_id: Option<String>,
    /// The client id (`ip@instance`), as in the classic heartbeat.
    pub client_id: String,
    /// The transport connection the heartbeat came on (for notices and closed connections).
    pub conn_id: u64,
    /// Topics the member subscribes.
    pub subscriptions: BTreeSet<String>,
    /// Queues the member holds now (it reports a revoked queue released by leaving it out).
    pub owned: BTreeSet<MessageQueue>,
    /// Of `owned`, queues the caller verified the member holds exclusively (its broker lock);
    /// a joining member keeps those that no other member owns (mode change, lost state).
    pub adoptable: BTreeSet<MessageQueue>,
    /// The member's rebalance timeout; the configured default when absent.
    pub rebalance_timeout_ms: Option<u64>,
    /// The member's session timeout (the client's, bounded by the broker); the configured
    /// `session_timeout_ms` when absent. A member that does not heartbeat for this long is
    /// removed and its queues go to others.
    pub session_timeout_ms: Option<u64>,
    /// The assignor the member asks for (the group uses the one most members ask for).
    pub assignor: Option<String>,
    /// A joining member's epoch under the group's previous coordinator (the group's
    /// coordinator moved): the group's epoch continues above it, so epochs never move back.
    pub last_epoch: Option<i32>,
}

/// What a member last told the coordinator, and the queues it holds: a transport that keeps
/// each member's last heartbeat fields (Kafka heartbeats leave out what did not change) and has
/// none for a member the coordinator has (the group's state came with it from another broker)
/// fills them from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberReport {
    /// Topics the member subscribes.
    pub subscriptions: BTreeSet<String>,
    /// Queues it holds: those assigned to it and those it is asked to release.
    pub held: BTreeSet<MessageQueue>,
    /// The assignor it asks for.
    pub assignor: Option<String>,
    /// Its rebalance timeout.
    pub rebalance_timeout_ms: u64,
}

/// The coordinator's answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatResponse {
    /// The member id.
    pub member_id: String,
    /// The member's epoch now.
    pub member_epoch: i32,
    /// The group epoch.
    pub group_epoch: i32,
    /// The queues the member may own now, sorted; it releases every other queue it holds.
    pub assignment: Vec<MessageQueue>,
    /// When to heartbeat next if nothing happens, ms.
    pub heartbeat_interval_ms: u64,
    /// The member has work left after this answer: queues to release, target queues still
    /// held by others, or an epoch below the target's. A member told of its changes by push
    /// (Shoal's coordinated mode) waits for the notice; one that only learns by heartbeating
    /// (Kafka's consumer protocol) should be asked back soon, and given the steady interval
    /// again once this is false.
    #[serde(default)]
    pub reconciling: bool,
}

/// What the broker must do after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The member's assignment or epoch changed: tell it to heartbeat now.
    Notify {
        /// The group.
        group: String,
        /// The member.
        member_id: String,
        /// Its connection.
        conn_id: u64,
    },
    /// A member is gone (fenced, expired, left, replaced, or away as a static member): release
    /// the broker queue locks its client holds in the group.
    ReleaseLocks {
        /// The group.
        group: String,
        /// The client id whose locks go.
        client_id: String,
    },
    /// A member left the group for good (to log and count).
    MemberRemoved {
        /// The group.
        group: String,
        /// The member.
        member_id: String,
        /// Why.
        reason: RemovalReason,
    },
    /// The group's state changed: persist it ([`Coordinator::snapshot`]).
    Persist {
        /// The group.
        group: String,
    },
}

/// Why a member left a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RemovalReason {
    /// It sent a leave.
    Left,
    /// No heartbeat within the session timeout.
    SessionExpired,
    /// It did not release revoked queues within its rebalance timeout.
    RebalanceTimeout,
    /// Its connection closed (dynamic members only).
    ConnectionClosed,
    /// A new instance with the same instance id took over.
    Replaced,
}

/// Where a coordinated group's assignor comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AssignorSource {
    /// No member asks for one: the coordinator's `default_assignor` (`STICKY`: balanced, and
    /// moves the fewest queues when members come and go).
    Default,
    /// The one most members ask for (a strategy chosen in the client's configuration).
    Members,
}

/// The group as `shoal group describe` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupDescription {
    /// The group.
    pub group: String,
    /// The group epoch.
    pub group_epoch: i32,
    /// The epoch of the target assignment.
    pub target_epoch: i32,
    /// The assignor in use.
    pub assignor: String,
    /// Why that one: the members asked for it, or none did and it is the coordinator's
    /// default.
    pub assignor_source: AssignorSource,
    /// True when every member owns exactly its target and nothing is pending.
    pub reconciled: bool,
    /// The members, by member id.
    pub members: Vec<MemberDescription>,
}

/// Everything a restarted coordinator needs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CoordinatorSnapshot {
    groups: Vec<Group>,
    #[serde(default)]
    topics: BTreeMap<String, Vec<MessageQueue>>,
}

/// The coordinator of every coordinated group of one broker.
#[derive(Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    groups: BTreeMap<String, Group>,
    topics: BTreeMap<String, Vec<MessageQueue>>,
    /// Raised whenever `topics` changes (the replicated state carries the map when it did).
    topics_version: u64,
    effects: VecDeque<Effect>,
}

impl Coordinator {
    /// An empty coordinator.
    pub fn new(config: CoordinatorConfig) -> Self {
        Self {
            config,
            groups: BTreeMap::new(),
            topics: BTreeMap::new(),
            topics_version: 1,
            effects: VecDeque::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    /// The next effect to execute, if any.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// Sets the queues of a topic (sorted and de-duplicated here). Groups that subscribe it
    /// rebalance when the set changed.
    pub fn handle_topic_queues(&mut self, now_ms: u64, topic: &str, queues: Vec<MessageQueue>) {
        let mut queues = queues;
        queues.sort_by(crate::allocate::queue_cmp);
        queues.dedup();
        if self.topics.get(topic) == Some(&queues) {
            return;
        }
        self.topics.insert(topic.to_string(), queues);
        self.topics_version += 1;
        self.topic_changed(topic, now_ms);
    }

    /// Forgets a topic (deleted): groups that subscribe it rebalance without its queues.
    pub fn handle_topic_removed(&mut self, now_ms: u64, topic: &str) {
        if self.topics.remove(topic).is_some() {
            self.topics_version += 1;
            self.topic_changed(topic, now_ms);
        }
    }

    fn topic_changed(&mut self, topic: &str, now_ms: u64) {
        let ctx = group::Ctx {
            config: &self.config,
            topics: &self.topics,
            effects: &mut self.effects,
            now_ms,
        };
        let mut ctx = ctx;
        for g in self.groups.values_mut() {
            if g.subscribes(topic) {
                g.bump(
                    RebalanceCause::TopicChanged {
                        topic: topic.to_string(),
                    },
                    &mut ctx,
                );
            }
        }
    }

    /// The queues known for a topic.
    pub fn topic_queues(&self, topic: &str) -> Option<&[MessageQueue]> {
        self.topics.get(topic).map(Vec::as_slice)
    }

    /// A heartbeat (or a join, with epoch [`JOIN_EPOCH`]).
    pub fn handle_heartbeat(
        &mut self,
        now_ms: u64,
        req: HeartbeatRequest,
    ) -> Result<HeartbeatResponse> {
        self.check_request(&req)?;
        let assignor = match req.assignor.as_deref() {
            Some(a) => Some(canonical_assignor(a)?),
            None => None,
        };
        if !self.groups.contains_key(&req.group) {
            if req.member_epoch != JOIN_EPOCH {
                return Err(GroupError::UnknownMember {
                    group: req.group.clone(),
                    member: req.member_id.clone(),
                });
            }
            self.make_room_for_group()?;
            let a = assignor
                .clone()
                .unwrap_or_else(|| self.config.default_assignor.clone());
            self.groups
                .insert(req.group.clone(), Group::new(&req.group, &a));
        }
        let mut ctx = group::Ctx {
            config: &self.config,
            topics: &self.topics,
            effects: &mut self.effects,
            now_ms,
        };
        let g = self
            .groups
            .get_mut(&req.group)
            .ok_or_else(|| GroupError::InvalidRequest("group vanished".into()))?;
        g.heartbeat(req, assignor, &mut ctx)
    }

    /// A member leaves. A static member's leave is temporary unless `permanent`: its queues
    /// stay reserved until its session times out. Leaving twice is not an error.
    pub fn handle_leave(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: &str,
        permanent: bool,
    ) -> Result<()> {
        let Some(g) = self.groups.get_mut(group) else {
            return Ok(());
        };
        let mut ctx = group::Ctx {
            config: &self.config,
            topics: &self.topics,
            effects: &mut self.effects,
            now_ms,
        };
        g.leave(member_id, permanent, &mut ctx);
        Ok(())
    }

    /// Evidence that a member released queues (the broker saw it unlock them): revoked queues
    /// among them are free for their new owners at once.
    pub fn handle_released(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: &str,
        queues: &[MessageQueue],
    ) {
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        let mut ctx = group::Ctx {
            config: &self.config,
            topics: &self.topics,
            effects: &mut self.effects,
            now_ms,
        };
        g.released(member_id, queues, &mut ctx);
    }

    /// [`handle_released`](Self::handle_released) by client id (the broker's unlock names the client, not
    /// the member).
    pub fn handle_released_by_client(
        &mut self,
        now_ms: u64,
        group: &str,
        client_id: &str,
        queues: &[MessageQueue],
    ) {
        let ids: Vec<String> = self
            .groups
            .get(group)
            .map(|g| g.members_of_client(client_id))
            .unwrap_or_default();
        for id in ids {
            self.handle_released(now_ms, group, &id, queues);
        }
    }

    /// A transport connection closed: its dynamic members are removed, its static members
    /// are away (queues reserved until the session times out).
    pub fn handle_connection_closed(&mut self, now_ms: u64, conn_id: u64) {
        let mut ctx = group::Ctx {
            config: &self.config,
            topics: &self.topics,
            effects: &mut self.effects,
            now_ms,
        };
        for g in self.groups.values_mut() {
            g.connection_closed(conn_id, &mut ctx);
        }
    }

    /// Runs the timers due at `now_ms`: session expiry and rebalance timeouts.
    pub fn handle_timeout(&mut self, now_ms: u64) {
        let mut ctx = group::Ctx {
            config: &self.config,
            topics: &self.topics,
            effects: &mut self.effects,
            now_ms,
        };
        for g in self.groups.values_mut() {
            g.tick(&mut ctx);
        }
    }

    /// The earliest time [`handle_timeout`](Self::handle_timeout) has something to do.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        self.groups.values().filter_map(Group::next_deadline).min()
    }

    /// Checks a pull, offset commit or lock renewal of `queue` by `member_id` at
    /// `member_epoch`: the member must exist (and not be away), its epoch must not be ahead of
    /// the coordinator's, and the queue must have been given to it at or before that epoch
    /// (a queue being revoked still counts: the member commits before it releases).
    pub fn validate(
        &self,
        group: &str,
        member_id: &str,
        member_epoch: i32,
        queue: &MessageQueue,
    ) -> Result<()> {
        let g = self
            .groups
            .get(group)
            .ok_or_else(|| GroupError::UnknownMember {
                group: group.to_string(),
                member: member_id.to_string(),
            })?;
        g.validate(member_id, member_epoch, queue)
    }

    /// The group as operators see it.
    pub fn describe(&self, group: &str, now_ms: u64) -> Option<GroupDescription> {
        self.groups.get(group).map(|g| g.describe(now_ms))
    }

    /// The group's last rebalances, oldest first.
    pub fn history(&self, group: &str) -> Vec<RebalanceRecord> {
        self.groups
            .get(group)
            .map(|g| g.history().to_vec())
            .unwrap_or_default()
    }

    /// Names of the groups the coordinator knows (with or without members).
    pub fn group_names(&self) -> Vec<String> {
        self.groups.keys().cloned().collect()
    }

    /// True when the coordinator knows `group` (with or without members).
    pub fn knows_group(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    /// True when `group` has a member `member_id` (live or away).
    pub fn has_member(&self, group: &str, member_id: &str) -> bool {
        self.groups
            .get(group)
            .is_some_and(|g| g.has_member(member_id))
    }

    /// What member `member_id` of `group` last told the coordinator (a live member only).
    pub fn member_report(&self, group: &str, member_id: &str) -> Option<MemberReport> {
        self.groups.get(group)?.member_report(member_id)
    }

    /// True when `group` has members.
    pub fn has_members(&self, group: &str) -> bool {
        self.groups.get(group).is_some_and(|g| g.member_count() > 0)
    }

    /// True when a live (not away) member of `group` has client id `client_id`.
    pub fn is_member_client(&self, group: &str, client_id: &str) -> bool {
        self.groups
            .get(group)
            .is_some_and(|g| !g.members_of_client(client_id).is_empty())
    }

    /// Client ids of the group's members (live or away), sorted.
    pub fn client_ids(&self, group: &str) -> Vec<String> {
        self.groups
            .get(group)
            .map(Group::client_ids)
            .unwrap_or_default()
    }

    /// The member that owns `queue` (assigned or being revoked), if any.
    pub fn owner_of(&self, group: &str, queue: &MessageQueue) -> Option<&str> {
        self.groups.get(group)?.owner_of(queue)
    }

    /// Removes every member of a group at once (an operator action, or the group moving to
    /// classic mode); queues are free, the epoch is kept.
    pub fn handle_clear_group(&mut self, now_ms: u64, group: &str) {
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        let mut ctx = group::Ctx {
            config: &self.config,
            topics: &self.topics,
            effects: &mut self.effects,
            now_ms,
        };
        g.clear(&mut ctx);
    }

    /// Checks the coordinator's own invariants: every queue in at most one member's assigned
    /// or pending set, the owner index agreeing with the members. For tests and debug builds.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        for g in self.groups.values() {
            g.check_invariants()?;
        }
        Ok(())
    }

    /// The state a restarted coordinator needs ([`restore`](Self::restore)).
    pub fn snapshot(&self) -> CoordinatorSnapshot {
        CoordinatorSnapshot {
            groups: self.groups.values().cloned().collect(),
            topics: self.topics.clone(),
        }
    }

    /// The snapshot of one group only (to persist what changed).
    pub fn snapshot_group(&self, group: &str) -> Option<CoordinatorSnapshot> {
        self.groups.get(group).map(|g| CoordinatorSnapshot {
            groups: vec![g.clone()],
            topics: BTreeMap::new(),
        })
    }

    /// A coordinator resumed from a snapshot at `now_ms`: every group's epoch moves forward
    /// by [`RESTORE_EPOCH_GAP`] (updates after the snapshot may be lost, epochs never go
    /// backwards), members keep their queues and get a fresh session; nothing moves.
    pub fn restore(config: CoordinatorConfig, snapshot: CoordinatorSnapshot, now_ms: u64) -> Self {
        let mut c = Self::new(config);
        c.topics = snapshot.topics;
        for mut g in snapshot.groups {
            let mut ctx = group::Ctx {
                config: &c.config,
                topics: &c.topics,
                effects: &mut c.effects,
                now_ms,
            };
            g.restored(&mut ctx);
            c.groups.insert(g.name().to_string(), g);
        }
        c
    }

    fn check_request(&self, req: &HeartbeatRequest) -> Result<()> {
        let cfg = &self.config;
        let bad = |what: String| Err(GroupError::InvalidRequest(what));
        if req.group.is_empty() || req.member_id.is_empty() {
            return bad("group and member id must not be empty".into());
        }
        for (what, s) in [
            ("group", req.group.as_str()),
            ("member id", req.member_id.as_str()),
            ("client id", req.client_id.as_str()),
            ("instance id", req.instance_id.as_deref().unwrap_or("")),
        ] {
            if s.len() > cfg.max_id_len {
                return bad(format!(
                    "{what} is {} bytes, more than {}",
                    s.len(),
                    cfg.max_id_len
                ));
            }
        }
        if req.instance_id.as_deref() == Some("") {
            return bad("instance id must not be empty when given".into());
        }
        if req.member_epoch < 0 {
            return bad(format!(
                "member epoch {} is negative (leave with a leave request)",
                req.member_epoch
            ));
        }
        if req.subscriptions.len() > cfg.max_subscriptions {
            return bad(format!(
                "{} subscriptions, more than {}",
                req.subscriptions.len(),
                cfg.max_subscriptions
            ));
        }
        if req.owned.len() > cfg.max_owned {
            return bad(format!(
                "{} owned queues, more than {}",
                req.owned.len(),
                cfg.max_owned
            ));
        }
        if !req.adoptable.is_subset(&req.owned) {
            return bad("adoptable queues must be owned".into());
        }
        Ok(())
    }

    fn make_room_for_group(&mut self) -> Result<()> {
        if self.groups.len() < self.config.max_groups {
            return Ok(());
        }
        let evict = self
            .groups
            .iter()
            .filter(|(_, g)| g.member_count() == 0)
            .min_by_key(|(_, g)| g.last_change_ms())
            .map(|(n, _)| n.clone());
        match evict {
            Some(name) => {
                self.groups.remove(&name);
                Ok(())
            }
            None => Err(GroupError::TooManyGroups(self.config.max_groups)),
        }
    }
}

/// The canonical name of an assignor a coordinated group may use, or why not.
pub fn canonical_assignor(name: &str) -> Result<String> {
    let s = crate::allocate::strategy_by_name(name)?;
    let canonical = s.name();
    let base = canonical.split(':').next().unwrap_or("");
    if !COORDINATED_ASSIGNORS.contains(&base) {
        return Err(GroupError::InvalidRequest(format!(
            "assignor {canonical} needs per-client configuration; coordinated groups use one of {}",
            COORDINATED_ASSIGNORS.join(", ")
        )));
    }
    // A strategy that leaves queues unowned (CONSISTENT_HASH:0) cannot serve a group.
    let queues: Vec<MessageQueue> = (0..4).map(|i| MessageQueue::new("t", "b", i)).collect();
    let input = crate::allocate::AllocationInput::new("g", queues.clone(), ["a", "b"]);
    let complete = s
        .allocate_all(&input)
        .map(|a| a.coverage(&queues).is_exclusive_and_complete())
        .unwrap_or(false);
    if !complete {
        return Err(GroupError::InvalidRequest(format!(
            "assignor {name} does not give every queue an owner"
        )));
    }
    Ok(if base == "CONSISTENT_HASH" {
        name.trim().to_ascii_uppercase().replace('-', "_")
    } else {
        canonical
    })
}
