//! The one owner of the broker's consumer-group state: the membership registry (classic
//! heartbeats), the queue lock table and the group coordinator (coordinated mode), behind one
//! short lock. Operations return [`GroupEffect`]s that the broker executes after the lock is
//! released (send a notice, log, persist); nothing here awaits.
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

use crate::broker::Clients;
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use shoal_group::coordinator::{
    Coordinator, CoordinatorConfig, CoordinatorSnapshot, Effect, HeartbeatRequest,
    HeartbeatResponse, JOIN_EPOCH,
};
use shoal_group::lock::QueueLockTable;
use shoal_group::membership::GroupChange;
use shoal_group::GroupError;
use shoal_proto::MessageQueue;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

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

/// What the broker does after a group-state operation, outside the lock.
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
        reason: shoal_group::coordinator::RemovalReason,
    },
    /// The coordinator state changed: persist it.
    Persist,
    /// Queue locks a member waited for are free: tell it (NOTIFY_LOCK_FREED, rebalance engine).
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
}

/// The broker's group state. See the [module documentation](self).
#[derive(Debug)]
pub struct GroupState {
    /// Members by connection (classic heartbeats).
    pub clients: Clients,
    /// Queue locks.
    pub locks: QueueLockTable,
    /// The coordinator of coordinated groups.
    pub coordinator: Coordinator,
    /// Per group: client ids that heartbeat the coordinator, with their connection and when
    /// they last did (so their classic registration does not make the group classic; kept for
    /// a session timeout, so a reconnecting client's classic heartbeat does not either).
    coordinated_clients: HashMap<String, HashMap<String, (u64, u64)>>,
    /// Groups in classic mode because of a classic-only member.
    classic: BTreeSet<String>,
    effects: Vec<GroupEffect>,
}

impl GroupState {
    /// Empty state.
    pub fn new(clients: Clients, locks: QueueLockTable, coordinator: CoordinatorConfig) -> Self {
        Self::with_coordinator(clients, locks, Coordinator::new(coordinator))
    }

    /// Empty registry and locks around a (restored) coordinator.
    pub fn with_coordinator(
        clients: Clients,
        locks: QueueLockTable,
        coordinator: Coordinator,
    ) -> Self {
        Self {
            clients,
            locks,
            coordinator,
            coordinated_clients: HashMap::new(),
            classic: BTreeSet::new(),
            effects: Vec::new(),
        }
    }

    /// The effects to execute, with the coordinator's broker-lock releases already applied.
    pub fn take_effects(&mut self) -> Vec<GroupEffect> {
        while let Some(e) = self.coordinator.poll_effect() {
            match e {
                Effect::Notify {
                    group,
                    member_id,
                    conn_id,
                } => self.effects.push(GroupEffect::NotifyMember {
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
                } => self.effects.push(GroupEffect::MemberRemoved {
                    group,
                    member_id,
                    reason,
                }),
                Effect::Persist { .. } => {
                    if !self.effects.contains(&GroupEffect::Persist) {
                        self.effects.push(GroupEffect::Persist);
                    }
                }
            }
        }
        std::mem::take(&mut self.effects)
    }

    /// The group's mode now.
    pub fn mode(&self, group: &str) -> GroupMode {
        if self.classic.contains(group) || self.has_classic_members(group) {
            GroupMode::Classic
        } else if self.coordinator.has_members(group) {
            GroupMode::Coordinated
        } else if self.clients.group(group).is_some() {
            // Only coordinated-capable clients, none joined yet.
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

    /// A coordinated heartbeat. `GroupError::InvalidRequest` with the text `classic mode` is
    /// never returned: classic mode is `Ok(None)`.
    pub fn coordinated_heartbeat(
        &mut self,
        mut req: HeartbeatRequest,
        now_ms: u64,
    ) -> Result<Option<HeartbeatResponse>, GroupError> {
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
            let client = req.client_id.clone();
            req.adoptable = req
                .owned
                .iter()
                .filter(|q| self.locks.owner(&group, q, now_ms) == Some(client.as_str()))
                .cloned()
                .collect();
        }
        self.coordinator.heartbeat(req, now_ms).map(Some)
    }

    /// A classic heartbeat says this client's consumer of `group` speaks coordinated mode: its
    /// classic registration does not make the group classic.
    pub fn mark_coordinated(&mut self, group: &str, client_id: &str, conn_id: u64, now_ms: u64) {
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
            self.coordinator.clear_group(group, now_ms);
            while let Some(e) = self.coordinator.poll_effect() {
                if let Effect::MemberRemoved { .. } | Effect::ReleaseLocks { .. } = e {
                    continue;
                }
                if let Effect::Persist { .. } = e {
                    self.effects.push(GroupEffect::Persist);
                }
            }
            self.effects.push(GroupEffect::ModeChanged {
                group: group.to_string(),
                mode: GroupMode::Classic,
                notify_conn_ids,
            });
        } else {
            self.classic.remove(group);
            self.effects.push(GroupEffect::ModeChanged {
                group: group.to_string(),
                mode: GroupMode::Coordinated,
                notify_conn_ids,
            });
        }
    }

    /// After a classic registry change (heartbeat, unregister, close, expiry): the group's
    /// mode is re-evaluated.
    pub fn after_registry_change(&mut self, change: &GroupChange, now_ms: u64) {
        self.refresh_mode(&change.group, now_ms);
        if self.clients.group(&change.group).is_none() {
            self.classic.remove(&change.group);
        }
    }

    /// Queue locks were freed (unlock, a member that left, the coordinator's release): the
    /// members refused one of them are told ([`GroupEffect::LockFreed`]).
    pub fn locks_freed(&mut self, group: &str, freed: &[MessageQueue]) {
        if freed.is_empty() {
            return;
        }
        for (client_id, queues) in self.locks.take_waiters(group, freed) {
            if let Some(conn_id) = self.clients.conn_of(group, &client_id) {
                self.effects.push(GroupEffect::LockFreed {
                    group: group.to_string(),
                    conn_id,
                    queues,
                });
            }
        }
    }

    /// A client left the group: its queue locks are freed (and their waiters told); returns
    /// how many it held.
    pub fn release_client_locks(&mut self, group: &str, client_id: &str) -> usize {
        let freed = self.locks.release_client(group, client_id);
        self.locks_freed(group, &freed);
        freed.len()
    }

    /// Queues released by a client's UNLOCK_BATCH_MQ: evidence for the coordinator.
    pub fn unlocked(&mut self, group: &str, client_id: &str, queues: &[MessageQueue], now_ms: u64) {
        self.coordinator
            .released_by_client(group, client_id, queues, now_ms);
    }

    /// The coordinator's timers; coordinated client ids not heard of for a session timeout
    /// and not members are forgotten (bounded by the coordinator's own limits in between).
    pub fn tick(&mut self, now_ms: u64) {
        self.coordinator.tick(now_ms);
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
    }

    /// The coordinator's persistent state.
    pub fn snapshot(&self) -> CoordinatorSnapshot {
        self.coordinator.snapshot()
    }
}

/// A view of one part of the shared [`GroupState`]: `lock()` takes the one group-state lock
/// and projects it. Lets code that used the former separate mutexes (`clients`, `locks`) keep
/// its shape while there is a single owner; never hold two views at once (same lock).
pub struct StatePart<T: 'static> {
    state: Arc<Mutex<GroupState>>,
    project: fn(&mut GroupState) -> &mut T,
}

impl<T> StatePart<T> {
    /// A view of `state` through `project`.
    pub fn new(state: Arc<Mutex<GroupState>>, project: fn(&mut GroupState) -> &mut T) -> Self {
        Self { state, project }
    }

    /// Locks the group state and gives this part.
    pub fn lock(&self) -> MappedMutexGuard<'_, T> {
        MutexGuard::map(self.state.lock(), self.project)
    }
}

impl<T> std::fmt::Debug for StatePart<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatePart(GroupState)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::ConsumerMeta;
    use shoal_group::membership::ClientChannel;
    use shoal_proto::body::{ConsumeFromWhere, ConsumeType, MessageModel};
    use std::collections::BTreeMap;

    fn meta() -> ConsumerMeta {
        ConsumerMeta {
            consume_type: ConsumeType::ConsumePassively,
            message_model: MessageModel::Clustering,
            consume_from_where: ConsumeFromWhere::ConsumeFromLastOffset,
        }
    }

    fn classic(s: &mut GroupState, conn: u64, client: &str, now: u64) {
        let ch = ClientChannel {
            conn_id: conn,
            client_id: client.into(),
            client_addr: "127.0.0.1:1".into(),
            language: "CPP".into(),
            version: 1,
        };
        let c = s
            .clients
            .consumer_heartbeat("G", ch, meta(), BTreeMap::new(), now);
        s.after_registry_change(&c, now);
    }

    fn coordinated(
        s: &mut GroupState,
        conn: u64,
        client: &str,
        owned: &[MessageQueue],
        now: u64,
    ) -> Option<HeartbeatResponse> {
        s.coordinated_heartbeat(
            HeartbeatRequest {
                group: "G".into(),
                member_id: format!("m-{client}"),
                member_epoch: 0,
                client_id: client.into(),
                conn_id: conn,
                subscriptions: ["T".to_string()].into(),
                owned: owned.iter().cloned().collect(),
                ..Default::default()
            },
            now,
        )
        .unwrap()
    }

    fn qs() -> Vec<MessageQueue> {
        (0..4).map(|i| MessageQueue::new("T", "b", i)).collect()
    }

    #[test]
    fn a_classic_member_switches_the_group_and_its_leave_switches_back() {
        let mut s = GroupState::new(
            Clients::new(),
            QueueLockTable::default(),
            CoordinatorConfig::default(),
        );
        s.coordinator.set_topic_queues("T", qs(), 0);
        let r = coordinated(&mut s, 1, "shoal-a", &[], 0).unwrap();
        assert_eq!(r.assignment.len(), 4);
        classic(&mut s, 1, "shoal-a", 0);
        assert_eq!(s.mode("G"), GroupMode::Coordinated);
        // shoal-a locks what it owns (it does in both modes).
        s.locks.lock_batch("G", &qs(), "shoal-a", 1);
        // An official client joins: classic mode, the coordinator lets go, locks stay.
        classic(&mut s, 2, "cpp", 2);
        assert_eq!(s.mode("G"), GroupMode::Classic);
        assert!(!s.coordinator.has_members("G"));
        assert_eq!(s.locks.owner("G", &qs()[0], 2), Some("shoal-a"));
        assert!(s.take_effects().iter().any(|e| matches!(
            e,
            GroupEffect::ModeChanged {
                mode: GroupMode::Classic,
                ..
            }
        )));
        assert!(coordinated(&mut s, 1, "shoal-a", &qs(), 3).is_none());
        // The official client leaves: coordinated again; shoal-a rejoins and keeps the queues it
        // holds the locks of.
        let c = s.clients.connection_closed(2, 4);
        s.after_registry_change(&c[0], 4);
        assert!(s.take_effects().iter().any(|e| matches!(
            e,
            GroupEffect::ModeChanged {
                mode: GroupMode::Coordinated,
                ..
            }
        )));
        let mut held = qs();
        held.truncate(2);
        s.locks.unlock_batch("G", &qs()[2..], "shoal-a");
        let r = coordinated(&mut s, 1, "shoal-a", &held, 5).unwrap();
        assert_eq!(r.assignment.len(), 4);
        assert_eq!(s.mode("G"), GroupMode::Coordinated);
    }

    /// A member the coordinator removes (its coordinator session ran out) while its broker
    /// session lives on (frozen, or its group heartbeats lost) keeps its queue locks: its
    /// lease rests on that session. They are freed when the session ends.
    #[test]
    fn a_member_removed_by_the_coordinator_keeps_its_locks_while_its_session_lives() {
        let cfg = CoordinatorConfig {
            session_timeout_ms: 1_000,
            ..CoordinatorConfig::default()
        };
        let mut s = GroupState::new(Clients::new(), QueueLockTable::default(), cfg);
        s.coordinator.set_topic_queues("T", qs(), 0);
        coordinated(&mut s, 1, "shoal-a", &[], 0).unwrap();
        classic(&mut s, 1, "shoal-a", 0);
        s.locks.lock_batch("G", &qs(), "shoal-a", 0);
        // No group heartbeat for the coordinator's session: removed.
        s.tick(2_000);
        let _ = s.take_effects();
        assert!(!s.coordinator.has_members("G"));
        assert_eq!(s.locks.owner("G", &qs()[0], 2_000), Some("shoal-a"));
        // Its broker session ends (here: the connection closes): the locks go.
        for c in s.clients.connection_closed(1, 2_100) {
            for id in &c.left_client_ids {
                s.release_client_locks("G", id);
            }
            s.after_registry_change(&c, 2_100);
        }
        assert_eq!(s.locks.owner("G", &qs()[0], 2_100), None);
    }
}
