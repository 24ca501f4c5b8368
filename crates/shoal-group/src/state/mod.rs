//! The broker's consumer-group state, with no I/O: the membership registry (classic
//! heartbeats), the queue lock table and the group coordinator (coordinated mode), their
//! fences, and every reaction to a membership change. The broker keeps one behind one short
//! lock; the simulator ([`crate::sim`]) drives the same type.
//!
//! Operations are `handle_*(now_ms, ..)` (one clock: milliseconds on the owner's monotonic
//! clock, comparable across the owner's restarts when it persists the coordinator); what they
//! ask the owner to do afterwards comes out of [`GroupState::poll_effect`] (notices, logs,
//! persistence), and [`GroupState::poll_timeout`] says when [`GroupState::handle_timeout`] has
//! work. Nothing here awaits, sleeps or reads a clock.
//!
//! **Modes.** A group is *coordinated* while every member in the registry is a client that
//! also heartbeats the coordinator (Shoal clients in coordinated mode send both heartbeats,
//! the coordinated one first). As soon as a member that only speaks the classic protocol (an
//! official RocketMQ client, or a Shoal client with `protocol = classic`) is in the group, the
//! group is *classic*: the coordinator lets go of it (its members are removed, their broker
//! locks are kept) and answers coordinated heartbeats with `GROUP_CLASSIC_MODE`, so Shoal
//! clients allocate client-side and hand over by locks, as official clients expect. When the
//! last classic-only member leaves, coordinated clients are told to heartbeat, rejoin, and
//! keep the queues whose broker locks they hold (adoption by evidence).

mod effect;
mod fence;
#[cfg(test)]
mod tests;

pub use effect::{GroupEffect, GroupMode, MemberList};
pub use fence::{CommitCheck, CommitRefused};

use crate::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorSnapshot, Effect, HeartbeatRequest,
    HeartbeatResponse, JOIN_EPOCH,
};
use crate::error::GroupError;
use crate::lock::{HeldLock, QueueLockTable};
use crate::membership::{ClientChannel, ClientRegistry, GroupChange, MemberSession};
use shoal_proto::body::{ConsumeFromWhere, ConsumeType, MessageModel, SubscriptionData};
use shoal_proto::ext::ConsumerIdsNotice;
use shoal_proto::MessageQueue;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// What a consumer group's heartbeat says about the group as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMeta {
    /// Push (passive) or pull (active).
    pub consume_type: ConsumeType,
    /// Clustering or broadcasting.
    pub message_model: MessageModel,
    /// Where a new group starts.
    pub consume_from_where: ConsumeFromWhere,
}

/// The broker's membership registry.
pub type Clients = ClientRegistry<ConsumerMeta, SubscriptionData>;

/// Settings of a [`GroupState`].
#[derive(Debug, Clone)]
pub struct GroupStateConfig {
    /// A classic client that does not heartbeat for this long leaves its groups (RocketMQ's
    /// channel expiry), unless it announced a shorter session.
    pub client_expiry_ms: u64,
    /// How long a TTL lock (RocketMQ's LOCK_BATCH_MQ) lasts without renewal.
    pub lock_ttl_ms: u64,
    /// The coordinator's settings.
    pub coordinator: CoordinatorConfig,
    /// First member session id: ids never repeat across the owner's restarts when it seeds
    /// this from the wall clock (a client must not take a new session for the one its locks
    /// belonged to).
    pub session_base: u64,
    /// First version of the member lists sent with notices (seeded from the wall clock in
    /// microseconds, so a restarted broker's lists are newer).
    pub member_list_version_base: u64,
    /// This broker's name: a joining member's claim to a queue of another broker (whose lock
    /// this broker cannot see) is adopted when nobody else owns it, so a group whose
    /// coordinator moved keeps its queues. `None`: every queue is this broker's.
    pub broker_name: Option<String>,
}

impl Default for GroupStateConfig {
    fn default() -> Self {
        Self {
            client_expiry_ms: 120_000,
            lock_ttl_ms: 60_000,
            coordinator: CoordinatorConfig::default(),
            session_base: 1,
            member_list_version_base: 0,
            broker_name: None,
        }
    }
}

/// A classic consumer heartbeat ([`GroupState::handle_consumer_heartbeat`]).
#[derive(Debug, Clone)]
pub struct ConsumerHeartbeat {
    /// The consumer group.
    pub group: String,
    /// Who sent it, on which connection.
    pub channel: ClientChannel,
    /// What it says of the group.
    pub meta: ConsumerMeta,
    /// Its subscriptions by topic; `None` keeps the ones it had (a heartbeat `withoutSub`).
    pub subscriptions: Option<BTreeMap<String, SubscriptionData>>,
    /// The session timeout it asked for (a Shoal member), already bounded by the broker.
    pub session_timeout_ms: Option<u64>,
    /// The client says this consumer also heartbeats the coordinator: its classic
    /// registration does not make the group classic.
    pub coordinated: bool,
}

/// What a consumer heartbeat changed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeartbeatOutcome {
    /// The member's session, when it has a timeout (a Shoal member).
    pub session: Option<MemberSession>,
    /// The member joined (or its connection changed identity).
    pub joined: bool,
    /// A subscription of the group changed.
    pub subscription_changed: bool,
}

/// A LOCK_BATCH_MQ ([`GroupState::handle_lock`]).
#[derive(Debug, Clone, Copy)]
pub struct LockRequest<'a> {
    /// The consumer group.
    pub group: &'a str,
    /// Queues asked for.
    pub queues: &'a [MessageQueue],
    /// The client asking.
    pub client_id: &'a str,
    /// Its connection.
    pub conn_id: u64,
    /// Session locks (a Shoal member: they last its session, it is told when a refused lock
    /// frees); otherwise RocketMQ's TTL locks.
    pub session: bool,
    /// The member consumes orderly.
    pub orderly: bool,
}

/// The answer to a lock request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOutcome {
    /// TTL locks: the queues the client holds now among those asked for.
    Ttl(BTreeSet<MessageQueue>),
    /// Session locks: the queues granted, and the session they last for.
    Session {
        /// Granted (or renewed).
        granted: BTreeSet<MessageQueue>,
        /// The member's session.
        session: u64,
    },
    /// Session locks asked on a connection with no session in the group: heartbeat first.
    NoSession,
}

/// The broker's group state. See the [module documentation](self).
#[derive(Debug)]
pub struct GroupState {
    clients: Clients,
    locks: QueueLockTable,
    coordinator: Coordinator,
    /// Per group: client ids that heartbeat the coordinator, with their connection and when
    /// they last did (so their classic registration does not make the group classic; kept for
    /// a session timeout, so a reconnecting client's classic heartbeat does not either).
    coordinated_clients: HashMap<String, HashMap<String, (u64, u64)>>,
    /// Groups in classic mode because of a classic-only member.
    classic: BTreeSet<String>,
    /// Version of the last member list sent with a notice.
    member_list_version: u64,
    client_expiry_ms: u64,
    broker_name: Option<String>,
    effects: VecDeque<GroupEffect>,
}

impl GroupState {
    /// Empty state.
    pub fn new(config: GroupStateConfig) -> Self {
        let coordinator = Coordinator::new(config.coordinator.clone());
        Self::with_coordinator(config, coordinator)
    }

    /// Empty registry and locks around the coordinator a snapshot restores (epochs move
    /// forward; members keep their sessions until they expire).
    pub fn restore(config: GroupStateConfig, snapshot: CoordinatorSnapshot, now_ms: u64) -> Self {
        let coordinator = Coordinator::restore(config.coordinator.clone(), snapshot, now_ms);
        Self::with_coordinator(config, coordinator)
    }

    fn with_coordinator(config: GroupStateConfig, coordinator: Coordinator) -> Self {
        Self {
            clients: ClientRegistry::with_session_base(config.session_base),
            locks: QueueLockTable::new(config.lock_ttl_ms),
            coordinator,
            coordinated_clients: HashMap::new(),
            classic: BTreeSet::new(),
            member_list_version: config.member_list_version_base,
            client_expiry_ms: config.client_expiry_ms,
            broker_name: config.broker_name,
            effects: VecDeque::new(),
        }
    }

    // ---- reads ----

    /// The membership registry.
    pub fn clients(&self) -> &Clients {
        &self.clients
    }

    /// The queue lock table.
    pub fn locks(&self) -> &QueueLockTable {
        &self.locks
    }

    /// The coordinator.
    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// The group's mode now.
    pub fn mode(&self, group: &str) -> GroupMode {
        if self.classic.contains(group) || self.has_classic_members(group) {
            GroupMode::Classic
        } else if self.coordinator.has_members(group) || self.clients.group(group).is_some() {
            // Coordinated members, or only coordinated-capable clients none of which joined
            // yet.
            GroupMode::Coordinated
        } else {
            GroupMode::Empty
        }
    }

    /// Client ids in the registry that never heartbeat the coordinator.
    pub fn classic_clients(&self, group: &str) -> Vec<String> {
        let coordinated = self.coordinated_clients.get(group);
        self.clients
            .client_ids(group)
            .into_iter()
            .filter(|c| !coordinated.is_some_and(|s| s.contains_key(c)))
            .collect()
    }

    fn has_classic_members(&self, group: &str) -> bool {
        !self.classic_clients(group).is_empty()
    }

    /// The coordinator's persistent state.
    pub fn snapshot(&self) -> CoordinatorSnapshot {
        self.coordinator.snapshot()
    }

    /// This broker takes over its replicated group's coordination (it became master): the
    /// coordinator is restored from `snapshot` (the master's state as replicated to it), every
    /// group's epoch first raised to this coordinator's own for the group (it may have been
    /// master before) and then moved forward by [`crate::coordinator::RESTORE_EPOCH_GAP`]
    /// (the last changes of the old master may not have reached this broker), so epochs only
    /// grow. Members keep their queues, with fresh sessions; every group is persisted.
    pub fn take_over_coordinator(&mut self, now_ms: u64, snapshot: CoordinatorSnapshot) {
        let mut snapshot = snapshot;
        snapshot.raise_epochs(&self.coordinator.group_epochs());
        let config = self.coordinator.config().clone();
        // The old coordinator's effects are for members it no longer coordinates.
        while self.coordinator.poll_effect().is_some() {}
        self.coordinator = Coordinator::restore(config, snapshot, now_ms);
        for group in self.coordinator.group_names() {
            self.persist(group);
        }
    }

    /// The live queue locks, for a replica to adopt if it becomes master (each held for its
    /// session's timeout, or the TTL).
    pub fn held_locks(&self, now_ms: u64) -> Vec<HeldLock> {
        self.locks.held(now_ms, |group, session| {
            self.clients.session_timeout(group, session)
        })
    }

    /// This broker became its replicated group's master: it adopts the old master's locks
    /// as its log replicated them, in place of its own ([`QueueLockTable::adopt`]).
    pub fn adopt_locks(&mut self, now_ms: u64, locks: Vec<HeldLock>) {
        self.locks.adopt(locks, now_ms);
    }

    // ---- outputs ----

    /// The next thing to do after an operation (in order). Must be drained after every
    /// operation: notices not sent leave members waiting for a timer.
    #[must_use]
    pub fn poll_effect(&mut self) -> Option<GroupEffect> {
        self.collect_coordinator_effects();
        self.effects.pop_front()
    }

    /// When [`Self::handle_timeout`] has coordinator work next (session or rebalance
    /// timeouts); client expiry is checked whenever it runs.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        self.coordinator.poll_timeout()
    }

    /// The coordinator's effects as group effects, with its broker-lock releases applied.
    fn collect_coordinator_effects(&mut self) {
        while let Some(e) = self.coordinator.poll_effect() {
            match e {
                Effect::Notify {
                    group,
                    member_id,
                    conn_id,
                } => self.effects.push_back(GroupEffect::NotifyMember {
                    group,
                    member_id,
                    conn_id,
                }),
                Effect::ReleaseLocks { group, client_id } => {
                    // A member the coordinator removed (session or rebalance timeout) may
                    // still be alive, frozen or stuck in its listener, with its locks' lease
                    // (its broker session) valid: its locks are freed when it unlocks them
                    // (it learns of the fence at its next group heartbeat) or its session
                    // ends, never before (the seeded simulator found the double delivery).
                    if self.clients.conn_of(&group, &client_id).is_none() {
                        let freed = self.locks.release_client(&group, &client_id);
                        self.locks_freed(&group, &freed);
                    }
                }
                Effect::MemberRemoved {
                    group,
                    member_id,
                    reason,
                } => self.effects.push_back(GroupEffect::MemberRemoved {
                    group,
                    member_id,
                    reason,
                }),
                Effect::Persist { group } => self.persist(group),
            }
        }
    }

    fn persist(&mut self, group: String) {
        let e = GroupEffect::Persist { group };
        if !self.effects.contains(&e) {
            self.effects.push_back(e);
        }
    }

    // ---- classic membership ----

    /// HEART_BEAT of one consumer group.
    pub fn handle_consumer_heartbeat(
        &mut self,
        now_ms: u64,
        hb: ConsumerHeartbeat,
    ) -> HeartbeatOutcome {
        let conn_id = hb.channel.conn_id;
        if hb.coordinated {
            self.mark_coordinated(&hb.group, &hb.channel.client_id, conn_id, now_ms);
        }
        let subs = match hb.subscriptions {
            Some(s) => s,
            None => self
                .clients
                .member_subscriptions(&hb.group, conn_id)
                .unwrap_or_default(),
        };
        let change = self
            .clients
            .consumer_heartbeat(&hb.group, hb.channel, hb.meta, subs, now_ms);
        let session = self
            .clients
            .set_session_timeout(&hb.group, conn_id, hb.session_timeout_ms)
            .filter(|s| s.timeout_ms.is_some());
        let outcome = HeartbeatOutcome {
            session,
            joined: change.membership_changed,
            subscription_changed: change.subscription_changed,
        };
        self.after_registry_change(&change, now_ms);
        outcome
    }

    /// HEART_BEAT of a producer group.
    pub fn handle_producer_heartbeat(&mut self, now_ms: u64, group: &str, channel: ClientChannel) {
        self.clients.producer_heartbeat(group, channel, now_ms);
    }

    /// UNREGISTER_CLIENT for a consumer group; true when the client was a member.
    pub fn handle_unregister_consumer(
        &mut self,
        now_ms: u64,
        group: &str,
        client_id: &str,
        conn_id: u64,
    ) -> bool {
        match self
            .clients
            .unregister_consumer(group, client_id, conn_id, now_ms)
        {
            Some(change) => {
                self.after_registry_change(&change, now_ms);
                true
            }
            None => false,
        }
    }

    /// UNREGISTER_CLIENT for a producer group.
    pub fn handle_unregister_producer(&mut self, group: &str, conn_id: u64) {
        self.clients.unregister_producer(group, conn_id);
    }

    /// A client connection closed: its consumers leave their groups at once, its coordinated
    /// members are marked away. Returns the changes (for logs).
    pub fn handle_connection_closed(&mut self, now_ms: u64, conn_id: u64) -> Vec<GroupChange> {
        let changes = self.clients.connection_closed(conn_id, now_ms);
        self.coordinator.handle_connection_closed(now_ms, conn_id);
        for c in &changes {
            self.after_registry_change(c, now_ms);
        }
        changes
    }

    /// Timers: classic clients whose heartbeats stopped leave (returned, for logs); the
    /// coordinator's session and rebalance timeouts; coordinated client ids not heard of for
    /// a session timeout and not members are forgotten.
    pub fn handle_timeout(&mut self, now_ms: u64) -> Vec<GroupChange> {
        let changes = self.clients.expire(now_ms, self.client_expiry_ms);
        for c in &changes {
            self.after_registry_change(c, now_ms);
        }
        self.coordinator.handle_timeout(now_ms);
        let keep_ms = self.coordinator.config().session_timeout_ms;
        let groups: Vec<String> = self.coordinated_clients.keys().cloned().collect();
        for g in groups {
            let members: BTreeSet<String> = self.coordinator.client_ids(&g).into_iter().collect();
            let Some(s) = self.coordinated_clients.get_mut(&g) else {
                continue;
            };
            s.retain(|c, (_, seen)| members.contains(c) || now_ms.saturating_sub(*seen) < keep_ms);
            if s.is_empty() {
                self.coordinated_clients.remove(&g);
            }
            self.refresh_mode(&g, now_ms);
        }
        changes
    }

    /// A topic's queues changed (created, resized, deleted: `None`): the coordinator
    /// allocates the new set, and every classic member of the groups that consume it is told
    /// to rebalance.
    pub fn handle_topic_changed(
        &mut self,
        now_ms: u64,
        topic: &str,
        queues: Option<Vec<MessageQueue>>,
    ) {
        self.set_topic_queues(now_ms, topic, queues);
        for group in self.clients.groups_of_topic(topic) {
            let conns: Vec<u64> = self
                .clients
                .members(&group)
                .into_iter()
                .map(|(c, _)| c.conn_id)
                .collect();
            self.after_registry_change(
                &GroupChange {
                    group,
                    subscription_changed: true,
                    notify_conn_ids: conns,
                    ..GroupChange::default()
                },
                now_ms,
            );
        }
    }

    /// The queues the coordinator allocates for a topic (`None`: the topic is gone).
    pub fn set_topic_queues(
        &mut self,
        now_ms: u64,
        topic: &str,
        queues: Option<Vec<MessageQueue>>,
    ) {
        match queues {
            Some(q) => self.coordinator.handle_topic_queues(now_ms, topic, q),
            None => self.coordinator.handle_topic_removed(now_ms, topic),
        }
    }

    /// Everything a classic membership change causes: the group's mode is re-evaluated, the
    /// locks of members that left are released (their waiters told), the change is observed,
    /// health changes are reported, and the remaining members are told to rebalance
    /// (with the member list for Shoal members when only members changed).
    fn after_registry_change(&mut self, change: &GroupChange, now_ms: u64) {
        self.refresh_mode(&change.group, now_ms);
        if self.clients.group(&change.group).is_none() {
            self.classic.remove(&change.group);
        }
        let group = &change.group;
        if change.needs_notify() {
            let members = self
                .clients
                .members(group)
                .into_iter()
                .map(|(c, _)| (c.conn_id, c.client_id.clone()))
                .collect();
            self.effects.push_back(GroupEffect::MembershipObserved {
                group: group.clone(),
                members,
                subscription_changed: change.subscription_changed,
            });
        }
        for id in &change.left_client_ids {
            let freed = self.locks.release_client(group, id);
            if !freed.is_empty() {
                self.effects.push_back(GroupEffect::ClientLocksReleased {
                    group: group.clone(),
                    client_id: id.clone(),
                    count: freed.len(),
                });
            }
            self.locks_freed(group, &freed);
        }
        if let Some(health) = self.clients.health_if_changed(group) {
            self.effects.push_back(GroupEffect::HealthChanged {
                group: group.clone(),
                health,
            });
        }
        if !change.needs_notify() {
            return;
        }
        let broadcasting = self
            .clients
            .group(group)
            .is_some_and(|g| g.meta.message_model == MessageModel::Broadcasting);
        if broadcasting {
            return;
        }
        // Shoal members (a session) get the member list with the notice when only members
        // changed: they need not ask for it. A higher version is a newer list.
        let member_list = (!change.subscription_changed).then(|| {
            let to: BTreeSet<u64> = change
                .notify_conn_ids
                .iter()
                .copied()
                .filter(|id| {
                    self.clients
                        .session(group, *id)
                        .is_some_and(|s| s.timeout_ms.is_some())
                })
                .collect();
            self.member_list_version += 1;
            MemberList {
                notice: ConsumerIdsNotice {
                    consumer_id_list: self.clients.client_ids(group),
                    version: self.member_list_version,
                },
                to,
            }
        });
        self.effects.push_back(GroupEffect::ConsumerIdsChanged {
            group: group.clone(),
            conn_ids: change.notify_conn_ids.clone(),
            member_list,
        });
    }

    // ---- locks ----

    /// LOCK_BATCH_MQ.
    pub fn handle_lock(&mut self, now_ms: u64, r: LockRequest<'_>) -> LockOutcome {
        if !r.session {
            return LockOutcome::Ttl(
                self.locks
                    .lock_batch(r.group, r.queues, r.client_id, now_ms),
            );
        }
        // The session is checked (and touched: a lock request counts as a heartbeat) and the
        // locks taken together.
        let Some(session) = self
            .clients
            .touch(r.group, r.conn_id, now_ms)
            .filter(|s| s.client_id == r.client_id)
        else {
            return LockOutcome::NoSession;
        };
        let granted = self.locks.lock_batch_session(
            r.group,
            r.queues,
            r.client_id,
            session.id,
            r.orderly,
            now_ms,
        );
        LockOutcome::Session {
            granted,
            session: session.id,
        }
    }

    /// UNLOCK_BATCH_MQ: the client's locks among `queues` are released (release evidence for
    /// the coordinator), and the members waiting for them are told.
    pub fn handle_unlock(
        &mut self,
        now_ms: u64,
        group: &str,
        client_id: &str,
        queues: &[MessageQueue],
    ) {
        let freed = self.locks.unlock_batch(group, queues, client_id);
        self.coordinator
            .handle_released_by_client(now_ms, group, client_id, queues);
        self.locks_freed(group, &freed);
    }

    /// Queue locks were freed: the members refused one of them are told
    /// ([`GroupEffect::LockFreed`]).
    fn locks_freed(&mut self, group: &str, freed: &[MessageQueue]) {
        if freed.is_empty() {
            return;
        }
        for (client_id, queues) in self.locks.take_waiters(group, freed) {
            if let Some(conn_id) = self.clients.conn_of(group, &client_id) {
                self.effects.push_back(GroupEffect::LockFreed {
                    group: group.to_string(),
                    conn_id,
                    queues,
                });
            }
        }
    }

    // ---- coordinated mode ----

    /// GROUP_HEARTBEAT. `topics` are the subscribed topics' queues in the cluster as the
    /// caller knows them (`None`: unknown, the coordinator keeps what it has). Classic mode
    /// is `Ok(None)`. A request without a session timeout takes the member's classic
    /// session's, as classic mode does.
    pub fn handle_group_heartbeat(
        &mut self,
        now_ms: u64,
        mut req: HeartbeatRequest,
        topics: Vec<(String, Option<Vec<MessageQueue>>)>,
    ) -> Result<Option<HeartbeatResponse>, GroupError> {
        for (t, q) in topics {
            if let Some(q) = q {
                self.coordinator.handle_topic_queues(now_ms, &t, q);
            }
        }
        if req.session_timeout_ms.is_none() {
            req.session_timeout_ms = self
                .clients
                .session(&req.group, req.conn_id)
                .and_then(|s| s.timeout_ms);
        }
        let group = req.group.clone();
        self.coordinated_clients
            .entry(group.clone())
            .or_default()
            .insert(req.client_id.clone(), (req.conn_id, now_ms));
        self.refresh_mode(&group, now_ms);
        if self.classic.contains(&group) {
            return Ok(None);
        }
        if req.member_epoch == JOIN_EPOCH {
            // What a joining member verifiably holds: the locks of this broker's queues; for
            // other brokers' queues (their locks are theirs to check) the member's word, which
            // the coordinator takes only where nobody else owns the queue. Either way the
            // queue's lock keeps consumption exclusive.
            let client = req.client_id.clone();
            let broker = self.broker_name.clone();
            req.adoptable = req
                .owned
                .iter()
                .filter(|q| {
                    let elsewhere = broker.as_deref().is_some_and(|b| q.broker_name != b);
                    elsewhere || self.locks.owner(&group, q, now_ms) == Some(client.as_str())
                })
                .cloned()
                .collect();
        }
        self.coordinator.handle_heartbeat(now_ms, req).map(Some)
    }

    /// GROUP_LEAVE (a static member's queues stay reserved unless `permanent`).
    pub fn handle_group_leave(
        &mut self,
        now_ms: u64,
        group: &str,
        member_id: &str,
        permanent: bool,
    ) -> Result<(), GroupError> {
        self.coordinator
            .handle_leave(now_ms, group, member_id, permanent)
    }

    /// Runs `f` on the coordinator for a protocol listener's group (Kafka's consumer groups),
    /// after giving it the topics' queues; refused when the group runs classic here.
    pub fn handle_listener_group<R>(
        &mut self,
        now_ms: u64,
        group: Option<&str>,
        topics: Vec<(String, Vec<MessageQueue>)>,
        f: impl FnOnce(&mut Coordinator, u64) -> R,
    ) -> Result<R, GroupMode> {
        if let Some(group) = group {
            if self.mode(group) == GroupMode::Classic {
                return Err(GroupMode::Classic);
            }
        }
        for (t, q) in topics {
            self.coordinator.handle_topic_queues(now_ms, &t, q);
        }
        Ok(f(&mut self.coordinator, now_ms))
    }

    /// A classic heartbeat says this client's consumer of `group` speaks coordinated mode: its
    /// classic registration does not make the group classic.
    fn mark_coordinated(&mut self, group: &str, client_id: &str, conn_id: u64, now_ms: u64) {
        self.coordinated_clients
            .entry(group.to_string())
            .or_default()
            .insert(client_id.to_string(), (conn_id, now_ms));
    }

    /// Re-evaluates a group's mode after a membership change; on a change, records a
    /// [`GroupEffect::ModeChanged`].
    fn refresh_mode(&mut self, group: &str, now_ms: u64) {
        let classic_now = self.has_classic_members(group);
        let was = self.classic.contains(group);
        if classic_now == was {
            return;
        }
        let notify_conn_ids: Vec<u64> = self
            .coordinated_clients
            .get(group)
            .map(|m| m.values().map(|(conn, _)| *conn).collect())
            .unwrap_or_default();
        if classic_now {
            self.classic.insert(group.to_string());
            // The coordinator lets go; members keep their broker locks (the evidence classic
            // hand-over runs on), so the coordinator must not release them.
            self.collect_coordinator_effects();
            self.coordinator.handle_clear_group(now_ms, group);
            while let Some(e) = self.coordinator.poll_effect() {
                if let Effect::Persist { group } = e {
                    self.persist(group);
                }
            }
            self.effects.push_back(GroupEffect::ModeChanged {
                group: group.to_string(),
                mode: GroupMode::Classic,
                notify_conn_ids,
            });
        } else {
            self.classic.remove(group);
            self.effects.push_back(GroupEffect::ModeChanged {
                group: group.to_string(),
                mode: GroupMode::Coordinated,
                notify_conn_ids,
            });
        }
    }
}
