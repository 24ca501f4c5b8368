//! One classic group's state machine.

use super::{
    ClassicConfig, ClassicError, Covers, JoinRequest, JoinResponse, LeavingMember, Output,
    RequestId, SyncRequest, SyncResponse,
};
use std::collections::{BTreeMap, HashMap};

/// Kafka's group states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// No members.
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Joined; waiting for the leader's assignment.
    CompletingRebalance,
    /// Assignment delivered.
    Stable,
}

impl GroupState {
    /// The name Kafka tools show.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

#[derive(Debug, Clone)]
struct Member {
    instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: u64,
    rebalance_timeout_ms: u64,
    protocol_type: String,
    protocols: Vec<(String, Vec<u8>)>,
    assignment: Vec<u8>,
    /// Its assignment of the generation before `assignment`'s (the group's
    /// `prior_generation`): what it may still be committing when a new one is handed out.
    prior_assignment: Vec<u8>,
    awaiting_join: Option<RequestId>,
    awaiting_sync: Option<RequestId>,
    /// A held heartbeat and when it is answered at the latest.
    awaiting_heartbeat: Option<(RequestId, u64)>,
    last_heartbeat: u64,
    supports_skip_assignment: bool,
}

impl Member {
    fn metadata(&self, protocol: &str) -> Vec<u8> {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    /// Member id.
    pub member_id: String,
    /// Static member id.
    pub instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host.
    pub client_host: String,
    /// Metadata for the chosen protocol.
    pub metadata: Vec<u8>,
    /// Current assignment.
    pub assignment: Vec<u8>,
}

/// One classic group.
#[derive(Debug, Clone)]
pub struct ClassicGroup {
    id: String,
    config: ClassicConfig,
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// instance id -> member id.
    statics: HashMap<String, String>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, with when they expire.
    pending: HashMap<String, u64>,
    /// PreparingRebalance: when the join phase ends at the latest.
    join_deadline: Option<u64>,
    /// PreparingRebalance from Empty: the join phase does not end before this.
    initial_delay_until: Option<u64>,
    /// CompletingRebalance: members that have not synced by then are removed.
    sync_deadline: Option<u64>,
    /// PreparingRebalance started by new members: when the members are told (their held
    /// heartbeats and waiting syncs answered REBALANCE_IN_PROGRESS); `None` once told.
    tell_at: Option<u64>,
    /// When that new-member window opened (it is extended by each new member, up to ten
    /// windows).
    window_started: Option<u64>,
    /// The generation whose assignments the members hold (the last one the leader synced).
    assignment_generation: i32,
    /// The generation synced before that one (the members' `prior_assignment`).
    prior_generation: i32,
}

fn err_join(req: RequestId, e: ClassicError, member_id: &str) -> Output {
    Output::Join(
        req,
        JoinResponse {
            error: Some(e),
            generation: -1,
            member_id: member_id.to_string(),
            ..JoinResponse::default()
        },
    )
}

/// Kafka's answer to a heartbeat of a current member in `state`.
fn heartbeat_result(state: GroupState) -> Result<(), ClassicError> {
    match state {
        GroupState::Empty => Err(ClassicError::UnknownMemberId),
        GroupState::PreparingRebalance => Err(ClassicError::RebalanceInProgress),
        GroupState::CompletingRebalance | GroupState::Stable => Ok(()),
    }
}

fn err_sync(req: RequestId, e: ClassicError) -> Output {
    Output::Sync(
        req,
        SyncResponse {
            error: Some(e),
            ..SyncResponse::default()
        },
    )
}

impl ClassicGroup {
    /// A new, empty group.
    pub fn new(id: &str, config: ClassicConfig) -> ClassicGroup {
        ClassicGroup {
            id: id.to_string(),
            config,
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            statics: HashMap::new(),
            pending: HashMap::new(),
            join_deadline: None,
            initial_delay_until: None,
            sync_deadline: None,
            tell_at: None,
            window_started: None,
            assignment_generation: 0,
            prior_generation: 0,
        }
    }

    /// Group id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// State.
    pub fn state(&self) -> GroupState {
        self.state
    }
    /// Generation.
    pub fn generation(&self) -> i32 {
        self.generation
    }
    /// Protocol type (`consumer`), once a member joined.
    pub fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }
    /// The chosen protocol (assignor name) of the current generation.
    pub fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }
    /// The leader's member id.
    pub fn leader(&self) -> Option<&str> {
        self.leader.as_deref()
    }
    /// No members and none about to join.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.pending.is_empty()
    }
    /// Member ids.
    pub fn member_ids(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }
    /// The members with their metadata and assignments.
    pub fn members(&self) -> Vec<MemberView> {
        let proto = self.protocol.clone().unwrap_or_default();
        self.members
            .iter()
            .map(|(id, m)| MemberView {
                member_id: id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: m.metadata(&proto),
                assignment: m.assignment.clone(),
            })
            .collect()
    }

    /// The assignment of a member (empty before the first sync).
    pub fn assignment_of(&self, member_id: &str) -> Option<&[u8]> {
        self.members.get(member_id).map(|m| m.assignment.as_slice())
    }

    fn protocols_compatible(&self, join: &JoinRequest) -> bool {
        if self.members.is_empty() {
            return !join.protocol_type.is_empty() && !join.protocols.is_empty();
        }
        if self.protocol_type.as_deref() != Some(join.protocol_type.as_str()) {
            return false;
        }
        // Some protocol must be supported by every member and by the new one.
        join.protocols.iter().any(|(name, _)| {
            self.members
                .values()
                .all(|m| m.protocols.iter().any(|(n, _)| n == name))
        })
    }

    /// JoinGroup.
    pub(crate) fn join(&mut self, req: RequestId, join: JoinRequest, now: u64) -> Vec<Output> {
        if join.session_timeout_ms < self.config.min_session_timeout_ms
            || join.session_timeout_ms > self.config.max_session_timeout_ms
        {
            return vec![err_join(
                req,
                ClassicError::InvalidSessionTimeout,
                &join.member_id,
            )];
        }
        if !self.protocols_compatible(&join) {
            return vec![err_join(
                req,
                ClassicError::InconsistentGroupProtocol,
                &join.member_id,
            )];
        }
        if join.member_id.is_empty() {
            self.join_unknown(req, join, now)
        } else {
            self.join_known(req, join, now)
        }
    }

    fn join_unknown(&mut self, req: RequestId, join: JoinRequest, now: u64) -> Vec<Output> {
        let new_id = join.new_member_id.clone();
        if let Some(instance) = join.instance_id.clone() {
            if let Some(old_id) = self.statics.get(&instance).cloned() {
                return self.replace_static(req, join, &instance, &old_id, now);
            }
            if self.members.len() >= self.config.max_size {
                return vec![err_join(req, ClassicError::GroupMaxSizeReached, "")];
            }
            self.statics.insert(instance, new_id.clone());
            return self.add_and_rebalance(req, &new_id, join, now, "new static member joined");
        }
        if self.members.len() + self.pending.len() >= self.config.max_size {
            return vec![err_join(req, ClassicError::GroupMaxSizeReached, "")];
        }
        if join.require_known_member_id {
            self.pending
                .insert(new_id.clone(), now + join.session_timeout_ms);
            return vec![err_join(req, ClassicError::MemberIdRequired, &new_id)];
        }
        self.add_and_rebalance(req, &new_id, join, now, "new member joined")
    }

    /// A static member came back with a new incarnation: it takes the old member's place.
    fn replace_static(
        &mut self,
        req: RequestId,
        join: JoinRequest,
        instance: &str,
        old_id: &str,
        now: u64,
    ) -> Vec<Output> {
        let new_id = join.new_member_id.clone();
        let mut out = Vec::new();
        let Some(mut m) = self.members.remove(old_id) else {
            self.statics.remove(instance);
            return self.join_unknown(req, join, now);
        };
        // The old incarnation's waiting requests are fenced.
        if let Some(r) = m.awaiting_join.take() {
            out.push(err_join(r, ClassicError::FencedInstanceId, old_id));
        }
        if let Some(r) = m.awaiting_sync.take() {
            out.push(err_sync(r, ClassicError::FencedInstanceId));
        }
        if let Some((r, _)) = m.awaiting_heartbeat.take() {
            out.push(Output::Heartbeat(r, Err(ClassicError::FencedInstanceId)));
        }
        let same_protocols = m.protocols == join.protocols;
        m.client_id = join.client_id.clone();
        m.client_host = join.client_host.clone();
        m.session_timeout_ms = join.session_timeout_ms;
        m.rebalance_timeout_ms = join.rebalance_timeout_ms;
        m.last_heartbeat = now;
        m.supports_skip_assignment = join.supports_skip_assignment;
        self.statics.insert(instance.to_string(), new_id.clone());
        let was_leader = self.leader.as_deref() == Some(old_id);
        if was_leader {
            self.leader = Some(new_id.clone());
        }
        match self.state {
            GroupState::Stable if same_protocols => {
                // Nothing changed: give the current generation back, no rebalance.
                self.members.insert(new_id.clone(), m);
                let skip = was_leader && join.supports_skip_assignment;
                let members = if skip { self.member_list() } else { Vec::new() };
                out.push(Output::Join(
                    req,
                    self.generation_answer(new_id, members, skip),
                ));
                out
            }
            _ => {
                m.protocols = join.protocols.clone();
                m.awaiting_join = Some(req);
                self.members.insert(new_id, m);
                out.extend(self.prepare_rebalance(
                    now,
                    "static member rejoined with changes or during a rebalance",
                    false,
                ));
                out
            }
        }
    }

    fn add_and_rebalance(
        &mut self,
        req: RequestId,
        id: &str,
        join: JoinRequest,
        now: u64,
        reason: &'static str,
    ) -> Vec<Output> {
        if self.members.is_empty() {
            self.protocol_type = Some(join.protocol_type.clone());
        }
        self.members.insert(
            id.to_string(),
            Member {
                instance_id: join.instance_id,
                client_id: join.client_id,
                client_host: join.client_host,
                session_timeout_ms: join.session_timeout_ms,
                rebalance_timeout_ms: join.rebalance_timeout_ms,
                protocol_type: join.protocol_type,
                protocols: join.protocols,
                assignment: Vec::new(),
                prior_assignment: Vec::new(),
                awaiting_join: Some(req),
                awaiting_sync: None,
                awaiting_heartbeat: None,
                last_heartbeat: now,
                supports_skip_assignment: join.supports_skip_assignment,
            },
        );
        let mut out = if self.state == GroupState::PreparingRebalance {
            self.extend_window(now);
            Vec::new()
        } else {
            self.prepare_rebalance(now, reason, true)
        };
        out.extend(self.try_complete_join(now));
        out
    }

    fn join_known(&mut self, req: RequestId, join: JoinRequest, now: u64) -> Vec<Output> {
        let id = join.member_id.clone();
        if self.pending.remove(&id).is_some() {
            return self.add_and_rebalance(req, &id, join, now, "new member joined");
        }
        if let Some(e) = self.check_member(&id, join.instance_id.as_deref()) {
            return vec![err_join(req, e, &id)];
        }
        let mut out = Vec::new();
        let Some(m) = self.members.get_mut(&id) else {
            return vec![err_join(req, ClassicError::UnknownMemberId, &id)];
        };
        // A member that joins again while its previous join is waiting: the old one ends.
        if let Some(r) = m.awaiting_join.take() {
            out.push(err_join(r, ClassicError::RebalanceInProgress, &id));
        }
        if let Some((r, _)) = m.awaiting_heartbeat.take() {
            out.push(Output::Heartbeat(r, heartbeat_result(self.state)));
        }
        let same = m.protocols == join.protocols;
        m.last_heartbeat = now;
        m.session_timeout_ms = join.session_timeout_ms;
        m.rebalance_timeout_ms = join.rebalance_timeout_ms;
        m.supports_skip_assignment = join.supports_skip_assignment;
        let is_leader = self.leader.as_deref() == Some(id.as_str());
        match self.state {
            GroupState::PreparingRebalance => {
                m.protocols = join.protocols;
                m.awaiting_join = Some(req);
                out.extend(self.try_complete_join(now));
            }
            GroupState::CompletingRebalance | GroupState::Stable
                if same && !(is_leader && self.state == GroupState::Stable) =>
            {
                // Same metadata: the current generation stands.
                let members = if is_leader {
                    self.member_list()
                } else {
                    Vec::new()
                };
                out.push(Output::Join(
                    req,
                    self.generation_answer(id, members, false),
                ));
            }
            GroupState::CompletingRebalance | GroupState::Stable => {
                m.protocols = join.protocols;
                m.awaiting_join = Some(req);
                out.extend(self.prepare_rebalance(now, "member rejoined with new metadata", false));
                out.extend(self.try_complete_join(now));
            }
            GroupState::Empty => out.push(err_join(req, ClassicError::UnknownMemberId, &id)),
        }
        out
    }

    /// Checks that `id` is a member and, for a static member, the current incarnation.
    fn check_member(&self, id: &str, instance: Option<&str>) -> Option<ClassicError> {
        if let Some(inst) = instance {
            match self.statics.get(inst) {
                Some(current) if current != id => return Some(ClassicError::FencedInstanceId),
                None if self.members.contains_key(id) => {
                    return Some(ClassicError::FencedInstanceId)
                }
                _ => {}
            }
        }
        if !self.members.contains_key(id) {
            return Some(ClassicError::UnknownMemberId);
        }
        None
    }

    /// The answer to a join that the current generation completes: `members` for the leader
    /// (empty for the others).
    fn generation_answer(
        &self,
        member_id: String,
        members: Vec<(String, Option<String>, Vec<u8>)>,
        skip_assignment: bool,
    ) -> JoinResponse {
        JoinResponse {
            error: None,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id,
            members,
            skip_assignment,
        }
    }

    fn member_list(&self) -> Vec<(String, Option<String>, Vec<u8>)> {
        let proto = self.protocol.clone().unwrap_or_default();
        self.members
            .iter()
            .map(|(id, m)| (id.clone(), m.instance_id.clone(), m.metadata(&proto)))
            .collect()
    }

    /// Starts a join phase. Members are told at once (waiting syncs and held heartbeats
    /// answered REBALANCE_IN_PROGRESS), unless new members started it in a group that has
    /// others: then they are told once the new-member window closes.
    fn prepare_rebalance(
        &mut self,
        now: u64,
        _reason: &'static str,
        new_member: bool,
    ) -> Vec<Output> {
        let was = self.state;
        let timeout = self
            .members
            .values()
            .map(|m| m.rebalance_timeout_ms)
            .max()
            .unwrap_or(0);
        if was == GroupState::Empty && self.config.initial_rebalance_delay_ms > 0 {
            self.initial_delay_until =
                Some(now + self.config.initial_rebalance_delay_ms.min(timeout.max(1)));
        }
        self.state = GroupState::PreparingRebalance;
        self.sync_deadline = None;
        self.join_deadline = Some(now + timeout);
        let window = self.config.new_member_window_ms;
        if new_member && was != GroupState::Empty && window > 0 {
            self.window_started = Some(now);
            self.tell_at = Some(now + window);
            Vec::new()
        } else {
            self.tell(now)
        }
    }

    /// Another new member joined while the new-member window is open: it closes `window`
    /// after this one, at most ten windows after it opened.
    fn extend_window(&mut self, now: u64) {
        let window = self.config.new_member_window_ms;
        if let (Some(start), Some(_)) = (self.window_started, self.tell_at) {
            self.tell_at = Some((now + window).min(start + 10 * window));
        }
    }

    /// Tells every member that a rebalance runs: waiting syncs and held heartbeats are
    /// answered REBALANCE_IN_PROGRESS.
    fn tell(&mut self, now: u64) -> Vec<Output> {
        self.tell_at = None;
        self.window_started = None;
        let mut out = Vec::new();
        for m in self.members.values_mut() {
            if let Some(r) = m.awaiting_sync.take() {
                out.push(err_sync(r, ClassicError::RebalanceInProgress));
            }
            if let Some((r, _)) = m.awaiting_heartbeat.take() {
                m.last_heartbeat = now;
                out.push(Output::Heartbeat(r, Err(ClassicError::RebalanceInProgress)));
            }
        }
        out
    }

    fn all_joined(&self) -> bool {
        self.pending.is_empty() && self.members.values().all(|m| m.awaiting_join.is_some())
    }

    fn try_complete_join(&mut self, now: u64) -> Vec<Output> {
        if self.state != GroupState::PreparingRebalance {
            return Vec::new();
        }
        if self.initial_delay_until.is_some_and(|t| now < t) {
            return Vec::new();
        }
        if self.all_joined() || self.join_deadline.is_some_and(|t| now >= t) {
            self.complete_join(now)
        } else {
            Vec::new()
        }
    }

    fn remove_member(&mut self, id: &str, reason: &'static str, out: &mut Vec<Output>) {
        if let Some(mut m) = self.members.remove(id) {
            if let Some(r) = m.awaiting_join.take() {
                out.push(err_join(r, ClassicError::UnknownMemberId, id));
            }
            if let Some(r) = m.awaiting_sync.take() {
                out.push(err_sync(r, ClassicError::UnknownMemberId));
            }
            if let Some((r, _)) = m.awaiting_heartbeat.take() {
                out.push(Output::Heartbeat(r, Err(ClassicError::UnknownMemberId)));
            }
            if let Some(inst) = &m.instance_id {
                if self.statics.get(inst).map(String::as_str) == Some(id) {
                    self.statics.remove(inst);
                }
            }
            if self.leader.as_deref() == Some(id) {
                self.leader = None;
            }
            out.push(Output::MemberRemoved {
                group: self.id.clone(),
                member_id: id.to_string(),
                reason,
            });
        }
    }

    fn complete_join(&mut self, now: u64) -> Vec<Output> {
        let mut out = Vec::new();
        // Dynamic members that did not rejoin in time are out; static ones keep their place.
        let late: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.awaiting_join.is_none() && m.instance_id.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in late {
            self.remove_member(&id, "did not rejoin within the rebalance timeout", &mut out);
        }
        self.pending.clear();
        self.join_deadline = None;
        self.initial_delay_until = None;
        self.tell_at = None;
        self.window_started = None;
        self.generation += 1;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.protocol = None;
            self.protocol_type = None;
            self.leader = None;
            return out;
        }
        self.protocol = self.select_protocol();
        if self
            .leader
            .as_ref()
            .is_none_or(|l| !self.members.contains_key(l))
        {
            // Prefer a member that is waiting for the answer.
            self.leader = self
                .members
                .iter()
                .find(|(_, m)| m.awaiting_join.is_some())
                .or_else(|| self.members.iter().next())
                .map(|(id, _)| id.clone());
        }
        self.state = GroupState::CompletingRebalance;
        let sync_timeout = self
            .members
            .values()
            .map(|m| m.rebalance_timeout_ms)
            .max()
            .unwrap_or(0);
        self.sync_deadline = Some(now + sync_timeout);
        let waiting: Vec<(RequestId, String)> = self
            .members
            .iter_mut()
            .filter_map(|(id, m)| {
                m.last_heartbeat = now;
                m.awaiting_join.take().map(|r| (r, id.clone()))
            })
            .collect();
        for (r, id) in waiting {
            let members = if self.leader.as_deref() == Some(id.as_str()) {
                self.member_list()
            } else {
                Vec::new()
            };
            out.push(Output::Join(r, self.generation_answer(id, members, false)));
        }
        out.push(Output::Rebalanced {
            group: self.id.clone(),
            generation: self.generation,
            members: self.members.len(),
        });
        out
    }

    /// The protocol every member supports that most members prefer (ties: the first named,
    /// in member order).
    fn select_protocol(&self) -> Option<String> {
        let mut candidates: Vec<&str> = Vec::new();
        for m in self.members.values() {
            for (name, _) in &m.protocols {
                if !candidates.contains(&name.as_str())
                    && self
                        .members
                        .values()
                        .all(|o| o.protocols.iter().any(|(n, _)| n == name))
                {
                    candidates.push(name);
                }
            }
        }
        let mut votes: Vec<(usize, &str)> = candidates.iter().map(|c| (0, *c)).collect();
        for m in self.members.values() {
            if let Some((first, _)) = m
                .protocols
                .iter()
                .find(|(n, _)| candidates.contains(&n.as_str()))
            {
                if let Some(v) = votes.iter_mut().find(|(_, c)| *c == first) {
                    v.0 += 1;
                }
            }
        }
        let best = votes.iter().map(|(n, _)| *n).max()?;
        votes
            .into_iter()
            .find(|(n, _)| *n == best)
            .map(|(_, c)| c.to_string())
    }

    /// SyncGroup.
    pub(crate) fn sync(&mut self, req: RequestId, sync: SyncRequest, now: u64) -> Vec<Output> {
        let id = sync.member_id.clone();
        if let Some(e) = self.check_member(&id, sync.instance_id.as_deref()) {
            return vec![err_sync(req, e)];
        }
        if sync.generation != self.generation {
            return vec![err_sync(req, ClassicError::IllegalGeneration)];
        }
        if sync
            .protocol_type
            .as_ref()
            .is_some_and(|t| Some(t) != self.protocol_type.as_ref())
            || sync
                .protocol_name
                .as_ref()
                .is_some_and(|p| Some(p) != self.protocol.as_ref())
        {
            return vec![err_sync(req, ClassicError::InconsistentGroupProtocol)];
        }
        let (ptype, proto) = (self.protocol_type.clone(), self.protocol.clone());
        match self.state {
            GroupState::Empty => vec![err_sync(req, ClassicError::UnknownMemberId)],
            GroupState::PreparingRebalance => {
                vec![err_sync(req, ClassicError::RebalanceInProgress)]
            }
            GroupState::Stable => {
                let m = self.members.get_mut(&id);
                let assignment = m
                    .map(|m| {
                        m.last_heartbeat = now;
                        m.assignment.clone()
                    })
                    .unwrap_or_default();
                vec![Output::Sync(
                    req,
                    SyncResponse {
                        error: None,
                        protocol_type: ptype,
                        protocol_name: proto,
                        assignment,
                    },
                )]
            }
            GroupState::CompletingRebalance => {
                let mut out = Vec::new();
                if let Some(m) = self.members.get_mut(&id) {
                    if let Some(old) = m.awaiting_sync.replace(req) {
                        out.push(err_sync(old, ClassicError::RebalanceInProgress));
                    }
                    m.last_heartbeat = now;
                }
                if self.leader.as_deref() == Some(id.as_str()) {
                    for (mid, m) in self.members.iter_mut() {
                        let new = sync.assignments.get(mid).cloned().unwrap_or_default();
                        m.prior_assignment = std::mem::replace(&mut m.assignment, new);
                    }
                    self.prior_generation = self.assignment_generation;
                    self.assignment_generation = self.generation;
                    self.state = GroupState::Stable;
                    self.sync_deadline = None;
                    for m in self.members.values_mut() {
                        if let Some(r) = m.awaiting_sync.take() {
                            out.push(Output::Sync(
                                r,
                                SyncResponse {
                                    error: None,
                                    protocol_type: ptype.clone(),
                                    protocol_name: proto.clone(),
                                    assignment: m.assignment.clone(),
                                },
                            ));
                        }
                    }
                }
                out
            }
        }
    }

    /// Heartbeat: keeps the session alive; tells members to rejoin during a rebalance. In a
    /// Stable group it is held (see [`ClassicConfig::heartbeat_hold_ms`]) and answered when a
    /// rebalance starts, when the hold ends, or on [`ClassicGroup::release_heartbeat`]; while
    /// the new-member window is open it is held until the window closes.
    pub(crate) fn heartbeat(
        &mut self,
        req: RequestId,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: u64,
    ) -> Vec<Output> {
        if let Some(e) = self.check_member(member_id, instance_id) {
            return vec![Output::Heartbeat(req, Err(e))];
        }
        if generation != self.generation {
            return vec![Output::Heartbeat(req, Err(ClassicError::IllegalGeneration))];
        }
        let (state, tell_at) = (self.state, self.tell_at);
        let Some(m) = self.members.get_mut(member_id) else {
            return vec![Output::Heartbeat(req, Err(ClassicError::UnknownMemberId))];
        };
        m.last_heartbeat = now;
        let mut out = Vec::new();
        // One heartbeat of a member at a time: an earlier held one is answered first.
        if let Some((r, _)) = m.awaiting_heartbeat.take() {
            out.push(Output::Heartbeat(r, heartbeat_result(state)));
        }
        let hold = self.config.heartbeat_hold_ms.min(m.session_timeout_ms / 3);
        match state {
            GroupState::Stable if hold > 0 => m.awaiting_heartbeat = Some((req, now + hold)),
            GroupState::PreparingRebalance if tell_at.is_some_and(|t| now < t) => {
                m.awaiting_heartbeat = tell_at.map(|t| (req, t));
            }
            _ => out.push(Output::Heartbeat(req, heartbeat_result(state))),
        }
        out
    }

    /// Answers the held heartbeat `req` now, as the group's state says (nothing if it is not
    /// held).
    pub(crate) fn release_heartbeat(&mut self, req: RequestId, now: u64) -> Vec<Output> {
        let state = self.state;
        for m in self.members.values_mut() {
            if m.awaiting_heartbeat.is_some_and(|(r, _)| r == req) {
                m.awaiting_heartbeat = None;
                m.last_heartbeat = now;
                return vec![Output::Heartbeat(req, heartbeat_result(state))];
            }
        }
        Vec::new()
    }

    /// LeaveGroup.
    pub(crate) fn leave(
        &mut self,
        members: &[LeavingMember],
        now: u64,
    ) -> (Vec<Result<(), ClassicError>>, Vec<Output>) {
        let mut out = Vec::new();
        let mut results = Vec::new();
        let mut removed = false;
        for lm in members {
            let id = match &lm.instance_id {
                Some(inst) => match self.statics.get(inst).cloned() {
                    Some(current) if lm.member_id.is_empty() || lm.member_id == current => {
                        Ok(current)
                    }
                    Some(_) => Err(ClassicError::FencedInstanceId),
                    None => Err(ClassicError::UnknownMemberId),
                },
                None if self.pending.remove(&lm.member_id).is_some() => {
                    results.push(Ok(()));
                    continue;
                }
                None if self.members.contains_key(&lm.member_id) => Ok(lm.member_id.clone()),
                None => Err(ClassicError::UnknownMemberId),
            };
            match id {
                Ok(id) => {
                    self.remove_member(&id, "left the group", &mut out);
                    removed = true;
                    results.push(Ok(()));
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if removed {
            out.extend(self.after_removal(now));
        }
        (results, out)
    }

    fn after_removal(&mut self, now: u64) -> Vec<Output> {
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                if self.members.is_empty() {
                    self.generation += 1;
                    self.state = GroupState::Empty;
                    self.protocol = None;
                    self.protocol_type = None;
                    self.leader = None;
                    self.sync_deadline = None;
                    Vec::new()
                } else {
                    let mut out = self.prepare_rebalance(now, "member removed", false);
                    out.extend(self.try_complete_join(now));
                    out
                }
            }
            GroupState::PreparingRebalance => self.try_complete_join(now),
            GroupState::Empty => Vec::new(),
        }
    }

    /// Offset commit fencing (Kafka's rules): a commit without generation is allowed only in
    /// an empty group; otherwise member and generation must be current, and not while the
    /// group waits for the leader's assignment. One exception: a member may still commit with
    /// an older generation (the group moved on while it was committing what it revoked or
    /// releases on close) for partitions it was assigned in that generation that nobody else
    /// has been given since: with the generation whose assignment it holds while no newer
    /// one is out, or with the one before once the newer assignment gives the partitions to
    /// no other member. `covers` says how much of the committed partitions an assignment
    /// (protocol type, bytes) names.
    pub(crate) fn validate_commit(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: u64,
        covers: impl Fn(&str, &[u8]) -> Covers,
    ) -> Result<(), ClassicError> {
        if generation < 0 && member_id.is_empty() {
            return if self.members.is_empty() {
                Ok(())
            } else {
                Err(ClassicError::IllegalGeneration)
            };
        }
        if let Some(e) = self.check_member(member_id, instance_id) {
            return Err(e);
        }
        if generation != self.generation {
            let Some(m) = self
                .members
                .get(member_id)
                .filter(|_| generation < self.generation)
            else {
                return Err(ClassicError::IllegalGeneration);
            };
            let holds = generation == self.assignment_generation
                && covers(&m.protocol_type, &m.assignment) == Covers::All;
            let held_before = generation == self.prior_generation
                && generation < self.assignment_generation
                && covers(&m.protocol_type, &m.prior_assignment) == Covers::All
                && self.members.iter().all(|(id, o)| {
                    id == member_id || covers(&o.protocol_type, &o.assignment) == Covers::None
                });
            return if holds || held_before {
                Ok(())
            } else {
                Err(ClassicError::IllegalGeneration)
            };
        }
        if self.state == GroupState::CompletingRebalance {
            return Err(ClassicError::RebalanceInProgress);
        }
        if let Some(m) = self.members.get_mut(member_id) {
            m.last_heartbeat = now;
        }
        Ok(())
    }

    /// Timers: session expiry, the end of the join phase, the sync deadline.
    pub(crate) fn tick(&mut self, now: u64) -> Vec<Output> {
        let mut out = Vec::new();
        self.pending.retain(|_, until| *until > now);
        // A member waiting for a join or sync answer is alive; others must heartbeat.
        let expired: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.awaiting_join.is_none()
                    && m.awaiting_sync.is_none()
                    && m.awaiting_heartbeat.is_none()
                    && now >= m.last_heartbeat + m.session_timeout_ms
            })
            .map(|(id, _)| id.clone())
            .collect();
        let mut removed = false;
        for id in expired {
            self.remove_member(&id, "session timed out", &mut out);
            removed = true;
        }
        if self.state == GroupState::CompletingRebalance
            && self.sync_deadline.is_some_and(|t| now >= t)
        {
            let unsynced: Vec<String> = self
                .members
                .iter()
                .filter(|(_, m)| m.awaiting_sync.is_none())
                .map(|(id, _)| id.clone())
                .collect();
            for id in unsynced {
                self.remove_member(&id, "did not sync within the rebalance timeout", &mut out);
                removed = true;
            }
        }
        if self.state == GroupState::PreparingRebalance && self.tell_at.is_some_and(|t| now >= t) {
            out.extend(self.tell(now));
        }
        let state = self.state;
        for m in self.members.values_mut() {
            if m.awaiting_heartbeat.is_some_and(|(_, until)| now >= until) {
                if let Some((r, _)) = m.awaiting_heartbeat.take() {
                    m.last_heartbeat = now;
                    out.push(Output::Heartbeat(r, heartbeat_result(state)));
                }
            }
        }
        if removed {
            out.extend(self.after_removal(now));
        } else {
            out.extend(self.try_complete_join(now));
        }
        out
    }

    /// When [`ClassicGroup::tick`] next has something to do.
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        let sessions = self
            .members
            .values()
            .filter(|m| {
                m.awaiting_join.is_none()
                    && m.awaiting_sync.is_none()
                    && m.awaiting_heartbeat.is_none()
            })
            .map(|m| m.last_heartbeat + m.session_timeout_ms);
        let held = self
            .members
            .values()
            .filter_map(|m| m.awaiting_heartbeat.map(|(_, until)| until));
        let pending = self.pending.values().copied();
        let phase = [
            self.join_deadline,
            self.initial_delay_until,
            self.sync_deadline,
            self.tell_at,
        ]
        .into_iter()
        .flatten();
        sessions.chain(held).chain(pending).chain(phase).min()
    }

    /// The protocol type a member joined with (all members share it).
    pub fn member_protocol_type(&self, member_id: &str) -> Option<&str> {
        self.members
            .get(member_id)
            .map(|m| m.protocol_type.as_str())
    }
}
