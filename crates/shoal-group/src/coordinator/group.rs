//! One coordinated group: members, epochs, target assignment and per-member reconciliation.

use super::history::{History, QueueMove, RebalanceCause, RebalanceRecord};
use super::{
    CoordinatorConfig, Effect, HeartbeatRequest, HeartbeatResponse, RemovalReason, JOIN_EPOCH,
    RESTORE_EPOCH_GAP,
};
use crate::allocate::{strategy_by_name, AllocateStrategy, AllocationContext, AllocationInput};
use crate::allocate::{Assignment, Sticky};
use crate::error::{GroupError, Result};
use serde::{Deserialize, Serialize};
use shoal_proto::mq::MessageQueue;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// What a group operation needs from the coordinator around it.
pub(crate) struct Ctx<'a> {
    pub(crate) config: &'a CoordinatorConfig,
    pub(crate) topics: &'a BTreeMap<String, Vec<MessageQueue>>,
    pub(crate) effects: &'a mut VecDeque<Effect>,
    pub(crate) now_ms: u64,
}

/// The epoch recorded in [`Member::released`] for a queue a member reported at its join
/// without being given it: any later report of it is stale (it is on its way out).
const RELEASING_AT_JOIN: i32 = i32::MAX;

/// Where a member is in its reconciliation (Kafka's member states, plus `Away`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MemberState {
    /// It owns exactly its target at the target epoch.
    Stable,
    /// It must release queues first; its epoch stays until it reports them released.
    UnrevokedQueues,
    /// It is at the target epoch but some of its target queues are still held by others.
    UnreleasedQueues,
    /// A static member that left or lost its connection: its queues are reserved for the
    /// next instance with its instance id until its session times out.
    Away,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Member {
    id: String,
    instance_id: Option<String>,
    client_id: String,
    conn_id: u64,
    subscriptions: BTreeSet<String>,
    assignor: Option<String>,
    epoch: i32,
    /// Queue -> the epoch it was given at.
    #[serde(with = "super::queue_map")]
    assigned: BTreeMap<MessageQueue, i32>,
    /// Queues it must release, with the epoch they were given at.
    #[serde(with = "super::queue_map")]
    pending: BTreeMap<MessageQueue, i32>,
    /// Queues it gave up by evidence (the broker saw it unlock them), with its member epoch
    /// at that moment. A heartbeat built before the unlock may still name them; such a report
    /// is stale, not a claim (see [`Group::stale_claim`]). An entry is forgotten once a
    /// heartbeat no longer names the queue or the queue is given to this member again, so the
    /// map never holds more than the queues of its topics.
    #[serde(default, with = "super::queue_map")]
    released: BTreeMap<MessageQueue, i32>,
    state: MemberState,
    rebalance_timeout_ms: u64,
    /// Its own session timeout (from its heartbeat); the coordinator's default when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session_timeout_ms: Option<u64>,
    session_deadline_ms: u64,
    revoke_deadline_ms: Option<u64>,
    /// Its last heartbeat answer carried its current assignment.
    #[serde(default)]
    told: bool,
}

impl Member {
    /// How long it may go without a heartbeat: its own session timeout, or the coordinator's.
    fn session_timeout(&self, cfg: &CoordinatorConfig) -> u64 {
        self.session_timeout_ms.unwrap_or(cfg.session_timeout_ms)
    }
}

/// A member as `shoal group describe` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberDescription {
    /// The member id.
    pub member_id: String,
    /// The static instance id, if any.
    pub instance_id: Option<String>,
    /// The client id.
    pub client_id: String,
    /// The member epoch.
    pub member_epoch: i32,
    /// Its reconciliation state.
    pub state: MemberState,
    /// Subscribed topics.
    pub subscriptions: Vec<String>,
    /// Queues it may own now.
    pub owned: Vec<MessageQueue>,
    /// Queues it is asked to release.
    pub revoking: Vec<MessageQueue>,
    /// Its queues in the target assignment.
    pub target: Vec<MessageQueue>,
    /// Milliseconds until its session expires.
    pub session_expires_in_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Group {
    name: String,
    assignor: String,
    epoch: i32,
    target_epoch: i32,
    target: BTreeMap<String, BTreeSet<MessageQueue>>,
    members: BTreeMap<String, Member>,
    instances: BTreeMap<String, String>,
    /// Queue -> the member that has it assigned or pending revocation (derived).
    #[serde(skip)]
    owners: HashMap<MessageQueue, String>,
    history: History,
    last_change_ms: u64,
}

/// What a reconciliation changed for the member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Changed {
    /// Its assigned set changed or it was asked to revoke: it must hear about it.
    visible: bool,
    /// Anything changed (epoch, state): persist.
    any: bool,
}

fn strategy_for(assignor: &str) -> Box<dyn AllocateStrategy> {
    // Reconciliation already revokes before it assigns, so the cooperative assignor's
    // two-round target is the sticky one here.
    if assignor == "COOPERATIVE_STICKY" {
        return Box::new(Sticky);
    }
    strategy_by_name(assignor).unwrap_or_else(|_| Box::new(Sticky))
}

impl Group {
    pub(crate) fn new(name: &str, assignor: &str) -> Self {
        Self {
            name: name.to_string(),
            assignor: assignor.to_string(),
            epoch: 0,
            target_epoch: 0,
            target: BTreeMap::new(),
            members: BTreeMap::new(),
            instances: BTreeMap::new(),
            owners: HashMap::new(),
            history: History::default(),
            last_change_ms: 0,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn member_count(&self) -> usize {
        self.members.len()
    }

    pub(crate) fn has_member(&self, id: &str) -> bool {
        self.members.contains_key(id)
    }

    /// What live member `id` last reported ([`super::Coordinator::member_report`]).
    pub(crate) fn member_report(&self, id: &str) -> Option<super::MemberReport> {
        let m = self
            .members
            .get(id)
            .filter(|m| m.state != MemberState::Away)?;
        Some(super::MemberReport {
            subscriptions: m.subscriptions.clone(),
            held: m.assigned.keys().chain(m.pending.keys()).cloned().collect(),
            assignor: m.assignor.clone(),
            rebalance_timeout_ms: m.rebalance_timeout_ms,
        })
    }

    pub(crate) fn epoch(&self) -> i32 {
        self.epoch
    }

    /// Moves the group epoch up to `floor` (never down): a group taken over from another
    /// coordinator continues above what this one had given.
    pub(crate) fn raise_epoch(&mut self, floor: i32) {
        self.epoch = self.epoch.max(floor);
    }

    pub(crate) fn last_change_ms(&self) -> u64 {
        self.last_change_ms
    }

    pub(crate) fn history(&self) -> Vec<RebalanceRecord> {
        self.history.records().iter().cloned().collect()
    }

    pub(crate) fn subscribes(&self, topic: &str) -> bool {
        self.members
            .values()
            .any(|m| m.subscriptions.contains(topic))
    }

    pub(crate) fn members_of_client(&self, client_id: &str) -> Vec<String> {
        self.members
            .values()
            .filter(|m| m.client_id == client_id && m.state != MemberState::Away)
            .map(|m| m.id.clone())
            .collect()
    }

    pub(crate) fn client_ids(&self) -> Vec<String> {
        let ids: BTreeSet<String> = self.members.values().map(|m| m.client_id.clone()).collect();
        ids.into_iter().collect()
    }

    pub(crate) fn owner_of(&self, queue: &MessageQueue) -> Option<&str> {
        self.owners.get(queue).map(String::as_str)
    }

    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.members
            .values()
            .flat_map(|m| [Some(m.session_deadline_ms), m.revoke_deadline_ms])
            .flatten()
            .min()
    }

    fn persist(&self, ctx: &mut Ctx<'_>) {
        let e = Effect::Persist {
            group: self.name.clone(),
        };
        if ctx.effects.back() != Some(&e) {
            ctx.effects.push_back(e);
        }
    }

    fn notify(&self, id: &str, ctx: &mut Ctx<'_>) {
        if let Some(m) = self.members.get(id) {
            if m.state != MemberState::Away {
                ctx.effects.push_back(Effect::Notify {
                    group: self.name.clone(),
                    member_id: id.to_string(),
                    conn_id: m.conn_id,
                });
            }
        }
    }

    pub(crate) fn heartbeat(
        &mut self,
        req: HeartbeatRequest,
        assignor: Option<String>,
        ctx: &mut Ctx<'_>,
    ) -> Result<HeartbeatResponse> {
        let cfg = ctx.config;
        let now = ctx.now_ms;
        let id = req.member_id.clone();
        let mut cause: Option<RebalanceCause> = None;
        if req.member_epoch == JOIN_EPOCH {
            if let Some(inst) = &req.instance_id {
                if let Some(holder) = self.instances.get(inst).cloned() {
                    if holder != id {
                        let away = self
                            .members
                            .get(&holder)
                            .is_none_or(|h| h.state == MemberState::Away);
                        if !away {
                            return Err(GroupError::UnreleasedInstanceId {
                                group: self.name.clone(),
                                instance: inst.clone(),
                                holder,
                            });
                        }
                        self.replace_member(&holder, &id, ctx);
                    }
                }
            }
            match self.members.get_mut(&id) {
                Some(m) => {
                    if m.instance_id != req.instance_id {
                        return Err(GroupError::InvalidRequest(format!(
                            "member {id:?} rejoined with another instance id"
                        )));
                    }
                    if m.state == MemberState::Away {
                        m.state = MemberState::Stable;
                    }
                }
                None => {
                    if self.members.len() >= cfg.max_members_per_group {
                        return Err(GroupError::GroupFull {
                            group: self.name.clone(),
                            max: cfg.max_members_per_group,
                        });
                    }
                    if let Some(inst) = &req.instance_id {
                        self.instances.insert(inst.clone(), id.clone());
                    }
                    self.members.insert(
                        id.clone(),
                        Member {
                            id: id.clone(),
                            instance_id: req.instance_id.clone(),
                            client_id: req.client_id.clone(),
                            conn_id: req.conn_id,
                            subscriptions: req.subscriptions.clone(),
                            assignor: assignor.clone(),
                            // A member of the group's previous coordinator keeps its epoch
                            // until it reaches the target: a Kafka member answered epoch 0
                            // would take that for a join and leave out its subscription.
                            epoch: req.last_epoch.unwrap_or(0).max(0),
                            assigned: BTreeMap::new(),
                            pending: BTreeMap::new(),
                            released: BTreeMap::new(),
                            state: MemberState::Stable,
                            rebalance_timeout_ms: cfg.rebalance_timeout_ms,
                            session_timeout_ms: None,
                            session_deadline_ms: now,
                            revoke_deadline_ms: None,
                            told: false,
                        },
                    );
                    cause = Some(RebalanceCause::Join { member: id.clone() });
                }
            }
            self.adopt(&id, &req.adoptable);
            self.releasing(&id, &req.owned);
            // The group's coordinator moved here: its epochs continue above the member's
            // epoch under the previous one (members ignore targets older than theirs).
            if let Some(e) = req.last_epoch {
                self.epoch = self.epoch.max(e);
            }
        } else {
            let m = self
                .members
                .get(&id)
                .filter(|m| m.state != MemberState::Away)
                .ok_or_else(|| GroupError::UnknownMember {
                    group: self.name.clone(),
                    member: id.clone(),
                })?;
            if req.member_epoch > m.epoch {
                return Err(self.fenced(m, req.member_epoch, String::new()));
            }
            if let Some(q) = req.owned.iter().find(|q| {
                !m.assigned.contains_key(*q)
                    && !m.pending.contains_key(*q)
                    && !self.stale_claim(m, req.member_epoch, q)
            }) {
                let detail = match self.owners.get(q) {
                    Some(other) => format!(": it reports owning {q}, which {other} owns"),
                    None => format!(": it reports owning {q}, which it was not given"),
                };
                return Err(self.fenced(m, req.member_epoch, detail));
            }
        }
        let m = self
            .members
            .get_mut(&id)
            .ok_or_else(|| GroupError::InvalidRequest("member vanished".into()))?;
        // A report without a released queue shows the member caught up with its unlock: from
        // now on naming it again would be a claim.
        m.released.retain(|q, _| req.owned.contains(q));
        m.client_id = req.client_id;
        m.conn_id = req.conn_id;
        m.rebalance_timeout_ms = req
            .rebalance_timeout_ms
            .unwrap_or(cfg.rebalance_timeout_ms)
            .clamp(1, cfg.max_rebalance_timeout_ms);
        m.session_timeout_ms = req.session_timeout_ms.map(|t| t.max(1));
        m.session_deadline_ms = now.saturating_add(m.session_timeout(cfg));
        if m.subscriptions != req.subscriptions {
            m.subscriptions = req.subscriptions;
            cause = cause.or(Some(RebalanceCause::SubscriptionChanged {
                member: id.clone(),
            }));
        }
        m.assignor = assignor;
        // The assignor most members ask for; when none asks, the coordinator's default (also
        // after the last member that asked for another one left).
        let a = self
            .preferred_assignor()
            .unwrap_or_else(|| cfg.default_assignor.clone());
        if a != self.assignor {
            self.assignor = a.clone();
            cause = cause.or(Some(RebalanceCause::AssignorChanged { assignor: a }));
        }
        let bumped = cause.is_some();
        if let Some(c) = cause {
            self.bump_skipping(c, Some(&id), ctx);
        }
        let changed = self.reconcile(&id, Some(&req.owned), ctx);
        if let Some(m) = self.members.get_mut(&id) {
            m.told = true;
        }
        self.settle(Some(&id), ctx);
        self.check_reconciled(ctx);
        if bumped || changed.any {
            self.persist(ctx);
        }
        let m = self
            .members
            .get(&id)
            .ok_or_else(|| GroupError::InvalidRequest("member vanished".into()))?;
        let reconciling = !self.is_reconciled(m);
        Ok(HeartbeatResponse {
            member_id: id,
            member_epoch: m.epoch,
            group_epoch: self.epoch,
            assignment: m.assigned.keys().cloned().collect(),
            reconciling,
            // At least three heartbeats per session (Kafka's advice for
            // heartbeat.interval.ms), so a short session is not lost to one late heartbeat.
            heartbeat_interval_ms: cfg
                .heartbeat_interval_ms
                .min(m.session_timeout(cfg) / 3)
                .max(1),
        })
    }

    /// Whether the member owns exactly its target at the target epoch with nothing to release
    /// and nothing to wait for: until the group changes, nothing is left for it to do.
    fn is_reconciled(&self, m: &Member) -> bool {
        let empty = BTreeSet::new();
        m.state == MemberState::Stable
            && m.pending.is_empty()
            && m.epoch == self.target_epoch
            && m.assigned
                .keys()
                .eq(self.target.get(&m.id).unwrap_or(&empty).iter())
    }

    /// Whether `member` naming `queue` (neither assigned nor pending) in a heartbeat stamped
    /// `epoch` is a stale report rather than a claim, as Kafka reconciles owned partitions
    /// instead of fencing on them: the member held the queue at an earlier epoch and the
    /// broker saw it unlock it, and either the heartbeat was built before that unlock (its
    /// epoch is not past the one the member had when it unlocked) or nobody else owns the
    /// queue now. The queue stays out of its assignment; ownership is unchanged. A report of a
    /// queue the member never released by evidence, or of one another member owns when the
    /// report is newer than the unlock, is a real conflict and fenced.
    fn stale_claim(&self, member: &Member, epoch: i32, queue: &MessageQueue) -> bool {
        member
            .released
            .get(queue)
            .is_some_and(|at| epoch <= *at || !self.owners.contains_key(queue))
    }

    fn fenced(&self, m: &Member, received: i32, detail: String) -> GroupError {
        GroupError::FencedMemberEpoch {
            group: self.name.clone(),
            member: m.id.clone(),
            received,
            current: m.epoch,
            detail,
        }
    }

    /// Queues a joining member reports holding but was not given (another member owns them,
    /// or it could not show it holds them) are queues it will release: its reports of them
    /// are stale until it stops naming them, not claims to fence it for. Their next owner
    /// gets them only through their locks, once it has let go.
    fn releasing(&mut self, id: &str, owned: &BTreeSet<MessageQueue>) {
        let Some(m) = self.members.get_mut(id) else {
            return;
        };
        for q in owned {
            if !m.assigned.contains_key(q) && !m.pending.contains_key(q) {
                m.released.insert(q.clone(), RELEASING_AT_JOIN);
            }
        }
    }

    /// Queues a joining member verifiably holds and nobody else owns become its own.
    fn adopt(&mut self, id: &str, adoptable: &BTreeSet<MessageQueue>) {
        let Some(m) = self.members.get_mut(id) else {
            return;
        };
        for q in adoptable {
            if m.subscriptions.contains(&q.topic) && !self.owners.contains_key(q) {
                self.owners.insert(q.clone(), id.to_string());
                m.assigned.insert(q.clone(), m.epoch);
            }
        }
    }

    /// A new instance (`new_id`) of a static member takes over the away member `old_id`: its
    /// reserved queues, target and epoch. Queues the old one was revoking are free (it holds
    /// nothing while away).
    fn replace_member(&mut self, old_id: &str, new_id: &str, ctx: &mut Ctx<'_>) {
        let Some(mut m) = self.members.remove(old_id) else {
            return;
        };
        for q in m.pending.keys() {
            self.owners.remove(q);
        }
        m.pending.clear();
        for q in m.assigned.keys() {
            self.owners.insert(q.clone(), new_id.to_string());
        }
        if let Some(t) = self.target.remove(old_id) {
            self.target.insert(new_id.to_string(), t);
        }
        if let Some(inst) = &m.instance_id {
            self.instances.insert(inst.clone(), new_id.to_string());
        }
        ctx.effects.push_back(Effect::ReleaseLocks {
            group: self.name.clone(),
            client_id: m.client_id.clone(),
        });
        ctx.effects.push_back(Effect::MemberRemoved {
            group: self.name.clone(),
            member_id: old_id.to_string(),
            reason: RemovalReason::Replaced,
        });
        m.id = new_id.to_string();
        m.state = MemberState::Stable;
        m.revoke_deadline_ms = None;
        self.members.insert(new_id.to_string(), m);
    }

    /// The assignor most members ask for (ties: the smallest name); none if nobody asks.
    fn preferred_assignor(&self) -> Option<String> {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = &m.assignor {
                *votes.entry(a.as_str()).or_default() += 1;
            }
        }
        let best = votes.values().copied().max()?;
        votes
            .into_iter()
            .find(|(_, n)| *n == best)
            .map(|(a, _)| a.to_string())
    }

    pub(crate) fn leave(&mut self, id: &str, permanent: bool, ctx: &mut Ctx<'_>) {
        let Some(m) = self.members.get(id) else {
            return;
        };
        if m.instance_id.is_some() && !permanent {
            self.go_away(id, ctx);
            self.settle(None, ctx);
            self.check_reconciled(ctx);
            self.persist(ctx);
        } else {
            self.remove_member(id, RemovalReason::Left, ctx);
            self.bump(
                RebalanceCause::Leave {
                    member: id.to_string(),
                },
                ctx,
            );
        }
    }

    /// A static member is away: it holds nothing, its assigned queues stay reserved.
    fn go_away(&mut self, id: &str, ctx: &mut Ctx<'_>) {
        let Some(m) = self.members.get_mut(id) else {
            return;
        };
        if m.state == MemberState::Away {
            return;
        }
        for q in m.pending.keys() {
            self.owners.remove(q);
        }
        m.pending.clear();
        m.state = MemberState::Away;
        m.revoke_deadline_ms = None;
        m.session_deadline_ms = ctx.now_ms.saturating_add(m.session_timeout(ctx.config));
        ctx.effects.push_back(Effect::ReleaseLocks {
            group: self.name.clone(),
            client_id: m.client_id.clone(),
        });
    }

    fn remove_member(&mut self, id: &str, reason: RemovalReason, ctx: &mut Ctx<'_>) {
        let Some(m) = self.members.remove(id) else {
            return;
        };
        for q in m.assigned.keys().chain(m.pending.keys()) {
            self.owners.remove(q);
        }
        self.target.remove(id);
        if let Some(inst) = &m.instance_id {
            if self.instances.get(inst).map(String::as_str) == Some(id) {
                self.instances.remove(inst);
            }
        }
        ctx.effects.push_back(Effect::ReleaseLocks {
            group: self.name.clone(),
            client_id: m.client_id.clone(),
        });
        ctx.effects.push_back(Effect::MemberRemoved {
            group: self.name.clone(),
            member_id: id.to_string(),
            reason,
        });
    }

    pub(crate) fn released(&mut self, id: &str, queues: &[MessageQueue], ctx: &mut Ctx<'_>) {
        let Some(m) = self.members.get_mut(id) else {
            return;
        };
        let mut any = false;
        for q in queues {
            if m.pending.remove(q).is_some() {
                self.owners.remove(q);
                m.released.insert(q.clone(), m.epoch);
                any = true;
            }
        }
        if !any {
            return;
        }
        if self.reconcile(id, None, ctx).visible {
            self.notify(id, ctx);
        }
        self.settle(Some(id), ctx);
        self.check_reconciled(ctx);
        self.persist(ctx);
    }

    pub(crate) fn connection_closed(&mut self, conn_id: u64, ctx: &mut Ctx<'_>) {
        let on_conn: Vec<(String, bool)> = self
            .members
            .values()
            .filter(|m| m.conn_id == conn_id && m.state != MemberState::Away)
            .map(|m| (m.id.clone(), m.instance_id.is_some()))
            .collect();
        if on_conn.is_empty() {
            return;
        }
        let mut removed = Vec::new();
        for (id, is_static) in on_conn {
            if is_static {
                self.go_away(&id, ctx);
            } else {
                self.remove_member(&id, RemovalReason::ConnectionClosed, ctx);
                removed.push(id);
            }
        }
        if removed.is_empty() {
            self.settle(None, ctx);
            self.check_reconciled(ctx);
            self.persist(ctx);
        } else {
            self.bump(RebalanceCause::ConnectionClosed { members: removed }, ctx);
        }
    }

    pub(crate) fn tick(&mut self, ctx: &mut Ctx<'_>) {
        let now = ctx.now_ms;
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| m.session_deadline_ms <= now)
            .map(|m| m.id.clone())
            .collect();
        for id in &expired {
            self.remove_member(id, RemovalReason::SessionExpired, ctx);
        }
        if !expired.is_empty() {
            self.bump(RebalanceCause::SessionExpired { members: expired }, ctx);
        }
        let stuck: Vec<String> = self
            .members
            .values()
            .filter(|m| m.revoke_deadline_ms.is_some_and(|d| d <= now))
            .map(|m| m.id.clone())
            .collect();
        for id in &stuck {
            self.remove_member(id, RemovalReason::RebalanceTimeout, ctx);
        }
        if !stuck.is_empty() {
            self.bump(RebalanceCause::RebalanceTimeout { members: stuck }, ctx);
        }
    }

    pub(crate) fn clear(&mut self, ctx: &mut Ctx<'_>) {
        let ids: Vec<String> = self.members.keys().cloned().collect();
        if ids.is_empty() {
            return;
        }
        for id in &ids {
            self.remove_member(id, RemovalReason::Left, ctx);
        }
        self.bump(RebalanceCause::Cleared, ctx);
    }

    /// Bumps the group epoch and computes a new target given the current assignment, then
    /// reconciles every member towards it.
    pub(crate) fn bump(&mut self, cause: RebalanceCause, ctx: &mut Ctx<'_>) {
        self.bump_skipping(cause, None, ctx);
    }

    /// [`bump`](Self::bump), not notifying `skip` (the member whose heartbeat this answers).
    fn bump_skipping(&mut self, cause: RebalanceCause, skip: Option<&str>, ctx: &mut Ctx<'_>) {
        self.epoch = self.epoch.saturating_add(1);
        let new_target = self.compute_target(ctx);
        let moves = target_moves(&self.target, &new_target);
        self.target = new_target;
        self.target_epoch = self.epoch;
        self.history.push(
            RebalanceRecord {
                group_epoch: self.epoch,
                at_ms: ctx.now_ms,
                cause,
                moves,
                members: self.members.len(),
                reconciled_at_ms: None,
                superseded: false,
            },
            ctx.config.history_limit,
        );
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in &ids {
            if self.reconcile(id, None, ctx).visible && skip != Some(id.as_str()) {
                self.notify(id, ctx);
            }
        }
        self.settle(skip, ctx);
        self.check_reconciled(ctx);
        self.last_change_ms = ctx.now_ms;
        self.persist(ctx);
    }

    /// The assignment the new target should stay close to: each queue with its current
    /// owner, or else its target owner (a queue on its way to a member).
    fn current_view(&self) -> BTreeMap<String, BTreeSet<MessageQueue>> {
        let mut view: BTreeMap<String, BTreeSet<MessageQueue>> = BTreeMap::new();
        for (q, o) in &self.owners {
            view.entry(o.clone()).or_default().insert(q.clone());
        }
        for (m, qs) in &self.target {
            if !self.members.contains_key(m) {
                continue;
            }
            for q in qs {
                if !self.owners.contains_key(q) {
                    view.entry(m.clone()).or_default().insert(q.clone());
                }
            }
        }
        view
    }

    /// The target: per topic (as RocketMQ allocates), the group's strategy over the topic's
    /// queues and the members that subscribe it, given the current assignment.
    fn compute_target(&self, ctx: &Ctx<'_>) -> BTreeMap<String, BTreeSet<MessageQueue>> {
        let strategy = strategy_for(&self.assignor);
        let previous = self.current_view();
        let mut out: BTreeMap<String, BTreeSet<MessageQueue>> = self
            .members
            .keys()
            .map(|k| (k.clone(), BTreeSet::new()))
            .collect();
        let topics: BTreeSet<&String> = self
            .members
            .values()
            .flat_map(|m| m.subscriptions.iter())
            .collect();
        for t in topics {
            let Some(queues) = ctx.topics.get(t.as_str()).filter(|q| !q.is_empty()) else {
                continue;
            };
            let subs: Vec<String> = self
                .members
                .values()
                .filter(|m| m.subscriptions.contains(t.as_str()))
                .map(|m| m.id.clone())
                .collect();
            let mut prev = Assignment::new();
            for m in &subs {
                let mine: Vec<MessageQueue> = previous
                    .get(m)
                    .map(|s| s.iter().filter(|q| &q.topic == t).cloned().collect())
                    .unwrap_or_default();
                prev.insert(m.clone(), mine);
            }
            let actx = AllocationContext {
                previous: Some(prev),
                ..AllocationContext::default()
            };
            let input =
                AllocationInput::new(&self.name, queues.iter().cloned(), subs).with_context(&actx);
            let a = strategy
                .allocate_all(&input)
                .or_else(|_| Sticky.allocate_all(&input));
            if let Ok(a) = a {
                for (m, qs) in a.iter() {
                    out.entry(m.clone()).or_default().extend(qs.iter().cloned());
                }
            }
        }
        out
    }

    /// Moves one member a step towards its target (Kafka's reconciliation): cancel
    /// revocations the target gave back; ask for the queues it must lose and wait, keeping its
    /// epoch, until it no longer holds them (`owned`: what its heartbeat reports; none: assume
    /// it still holds them); then move it to the target epoch with those target queues that
    /// are free.
    fn reconcile(
        &mut self,
        id: &str,
        owned: Option<&BTreeSet<MessageQueue>>,
        ctx: &mut Ctx<'_>,
    ) -> Changed {
        let Group {
            members,
            owners,
            target,
            target_epoch,
            ..
        } = self;
        let Some(m) = members.get_mut(id) else {
            return Changed::default();
        };
        let empty = BTreeSet::new();
        let tgt = target.get(id).unwrap_or(&empty);
        let away = m.state == MemberState::Away;
        let before_epoch = m.epoch;
        let before_state = m.state;
        let before_assigned: Vec<MessageQueue> = m.assigned.keys().cloned().collect();
        let before_pending = m.pending.len();

        let back: Vec<MessageQueue> = m
            .pending
            .keys()
            .filter(|q| tgt.contains(*q))
            .cloned()
            .collect();
        for q in back {
            if let Some(e) = m.pending.remove(&q) {
                m.assigned.insert(q, e);
            }
        }
        let lose: Vec<MessageQueue> = m
            .assigned
            .keys()
            .filter(|q| !tgt.contains(*q))
            .cloned()
            .collect();
        let grew = !lose.is_empty();
        for q in lose {
            if let Some(e) = m.assigned.remove(&q) {
                m.pending.insert(q, e);
            }
        }
        let gone: Vec<MessageQueue> = m
            .pending
            .keys()
            .filter(|q| away || owned.is_some_and(|o| !o.contains(*q)))
            .cloned()
            .collect();
        for q in gone {
            m.pending.remove(&q);
            owners.remove(&q);
        }
        if !m.pending.is_empty() {
            if grew || m.revoke_deadline_ms.is_none() {
                m.revoke_deadline_ms = Some(ctx.now_ms.saturating_add(m.rebalance_timeout_ms));
            }
            m.state = MemberState::UnrevokedQueues;
        } else {
            m.revoke_deadline_ms = None;
            let mut unreleased = false;
            for q in tgt {
                if m.assigned.contains_key(q) {
                    continue;
                }
                if owners.contains_key(q) {
                    unreleased = true;
                } else {
                    owners.insert(q.clone(), id.to_string());
                    m.assigned.insert(q.clone(), *target_epoch);
                }
            }
            m.epoch = m.epoch.max(*target_epoch);
            m.state = if away {
                MemberState::Away
            } else if unreleased {
                MemberState::UnreleasedQueues
            } else {
                MemberState::Stable
            };
        }
        let Member {
            assigned,
            pending,
            released,
            ..
        } = &mut *m;
        released.retain(|q, _| !assigned.contains_key(q) && !pending.contains_key(q));
        let assigned_changed = !m.assigned.keys().eq(before_assigned.iter());
        let visible = assigned_changed || m.pending.len() > before_pending;
        if visible {
            m.told = false;
        }
        Changed {
            visible,
            any: visible
                || m.epoch != before_epoch
                || m.state != before_state
                || m.pending.len() != before_pending,
        }
    }

    /// Gives waiting members the queues that became free.
    fn settle(&mut self, skip: Option<&str>, ctx: &mut Ctx<'_>) {
        let waiting: Vec<String> = self
            .members
            .values()
            .filter(|m| m.pending.is_empty())
            .filter(|m| {
                self.target
                    .get(&m.id)
                    .is_some_and(|t| t.iter().any(|q| !m.assigned.contains_key(q)))
            })
            .map(|m| m.id.clone())
            .collect();
        for id in waiting {
            let c = self.reconcile(&id, None, ctx);
            if c.visible && skip != Some(id.as_str()) {
                self.notify(&id, ctx);
            }
        }
    }

    fn check_reconciled(&mut self, ctx: &mut Ctx<'_>) {
        let empty = BTreeSet::new();
        let done = self.members.values().all(|m| {
            (m.told || m.state == MemberState::Away)
                && m.pending.is_empty()
                && m.epoch == self.target_epoch
                && m.assigned
                    .keys()
                    .eq(self.target.get(&m.id).unwrap_or(&empty).iter())
        });
        if done {
            self.history.reconciled(self.target_epoch, ctx.now_ms);
        }
    }

    pub(crate) fn validate(&self, id: &str, epoch: i32, queue: &MessageQueue) -> Result<()> {
        let m = self
            .members
            .get(id)
            .filter(|m| m.state != MemberState::Away)
            .ok_or_else(|| GroupError::UnknownMember {
                group: self.name.clone(),
                member: id.to_string(),
            })?;
        if epoch > m.epoch {
            return Err(self.fenced(m, epoch, String::new()));
        }
        match m.assigned.get(queue).or_else(|| m.pending.get(queue)) {
            Some(given) if *given <= epoch => Ok(()),
            // Reported at its join while another member had been given it: it is releasing
            // the queue, and its final commit (its pulls too) must go through, or the next
            // owner starts from an older offset. The queue's lock, checked after this fence,
            // is what keeps the consumption exclusive.
            None if m.released.get(queue) == Some(&RELEASING_AT_JOIN) => Ok(()),
            Some(given) => Err(self.fenced(
                m,
                epoch,
                format!(": {queue} was given to it at epoch {given}"),
            )),
            None => Err(GroupError::QueueNotAssigned {
                group: self.name.clone(),
                member: id.to_string(),
                queue: queue.to_string(),
            }),
        }
    }

    pub(crate) fn describe(&self, now_ms: u64) -> super::GroupDescription {
        let empty = BTreeSet::new();
        let members = self
            .members
            .values()
            .map(|m| MemberDescription {
                member_id: m.id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                member_epoch: m.epoch,
                state: m.state,
                subscriptions: m.subscriptions.iter().cloned().collect(),
                owned: m.assigned.keys().cloned().collect(),
                revoking: m.pending.keys().cloned().collect(),
                target: self
                    .target
                    .get(&m.id)
                    .unwrap_or(&empty)
                    .iter()
                    .cloned()
                    .collect(),
                session_expires_in_ms: m.session_deadline_ms.saturating_sub(now_ms),
            })
            .collect();
        let reconciled = self.members.values().all(|m| {
            m.pending.is_empty()
                && m.assigned
                    .keys()
                    .eq(self.target.get(&m.id).unwrap_or(&empty).iter())
        });
        super::GroupDescription {
            group: self.name.clone(),
            group_epoch: self.epoch,
            target_epoch: self.target_epoch,
            assignor: self.assignor.clone(),
            assignor_source: if self.preferred_assignor().is_some() {
                super::AssignorSource::Members
            } else {
                super::AssignorSource::Default
            },
            reconciled,
            members,
        }
    }

    /// After a restore: rebuild the owner index, move the epoch forward, fresh sessions.
    pub(crate) fn restored(&mut self, ctx: &mut Ctx<'_>) {
        self.owners.clear();
        let now = ctx.now_ms;
        for m in self.members.values_mut() {
            for q in m.assigned.keys().chain(m.pending.keys()) {
                self.owners.insert(q.clone(), m.id.clone());
            }
            // Connection ids are the process's own (another process, or another broker of a
            // replicated group, gave these): none until the member heartbeats again.
            m.conn_id = 0;
            m.session_deadline_ms = now.saturating_add(m.session_timeout(ctx.config));
            if m.revoke_deadline_ms.is_some() {
                m.revoke_deadline_ms = Some(now.saturating_add(m.rebalance_timeout_ms));
            }
        }
        self.epoch = self.epoch.saturating_add(RESTORE_EPOCH_GAP);
        self.target_epoch = self.epoch;
        self.history.push(
            RebalanceRecord {
                group_epoch: self.epoch,
                at_ms: now,
                cause: RebalanceCause::Restored,
                moves: Vec::new(),
                members: self.members.len(),
                reconciled_at_ms: None,
                superseded: false,
            },
            ctx.config.history_limit,
        );
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in &ids {
            self.reconcile(id, None, ctx);
        }
        self.settle(None, ctx);
        self.check_reconciled(ctx);
    }

    pub(crate) fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut seen: HashMap<&MessageQueue, &str> = HashMap::new();
        for m in self.members.values() {
            for q in m.assigned.keys().chain(m.pending.keys()) {
                if let Some(other) = seen.insert(q, m.id.as_str()) {
                    return Err(format!(
                        "group {}: {q} owned by {other} and {}",
                        self.name, m.id
                    ));
                }
                if self.owners.get(q).map(String::as_str) != Some(m.id.as_str()) {
                    return Err(format!(
                        "group {}: owner index of {q} is {:?}, member {} has it",
                        self.name,
                        self.owners.get(q),
                        m.id
                    ));
                }
            }
            if let Some(q) = m
                .released
                .keys()
                .find(|q| m.assigned.contains_key(*q) || m.pending.contains_key(*q))
            {
                return Err(format!(
                    "group {}: {} holds {q} and remembers releasing it",
                    self.name, m.id
                ));
            }
            if m.state == MemberState::Away && !m.pending.is_empty() {
                return Err(format!("group {}: away member {} revokes", self.name, m.id));
            }
        }
        if seen.len() != self.owners.len() {
            return Err(format!(
                "group {}: owner index has {} queues, members {}",
                self.name,
                self.owners.len(),
                seen.len()
            ));
        }
        Ok(())
    }
}

/// Queues whose target owner differs between two targets.
fn target_moves(
    before: &BTreeMap<String, BTreeSet<MessageQueue>>,
    after: &BTreeMap<String, BTreeSet<MessageQueue>>,
) -> Vec<QueueMove> {
    let owner = |t: &BTreeMap<String, BTreeSet<MessageQueue>>| {
        let mut m: BTreeMap<MessageQueue, String> = BTreeMap::new();
        for (id, qs) in t {
            for q in qs {
                m.insert(q.clone(), id.clone());
            }
        }
        m
    };
    let (b, a) = (owner(before), owner(after));
    let queues: BTreeSet<&MessageQueue> = b.keys().chain(a.keys()).collect();
    queues
        .into_iter()
        .filter_map(|q| {
            let (from, to) = (b.get(q), a.get(q));
            (from != to).then(|| QueueMove {
                queue: q.clone(),
                from: from.cloned(),
                to: to.cloned(),
            })
        })
        .collect()
}
