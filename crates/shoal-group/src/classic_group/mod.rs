//! Kafka's classic consumer-group protocol (JoinGroup / SyncGroup / Heartbeat / LeaveGroup)
//! as a sans-IO state machine: events with a time in (`handle_*`), [`Output`]s polled out
//! ([`ClassicGroups::poll_output`]), no I/O and no clock of its own. The Kafka listener
//! (`shoal-kafka`) owns a [`ClassicGroups`] behind one short lock, hands each waiting request
//! an id, delivers the outputs to the requests they name, and calls
//! [`ClassicGroups::handle_timeout`] when [`ClassicGroups::poll_timeout`] says (session expiry,
//! rebalance and sync deadlines, the initial rebalance delay).
//!
//! The rules are Kafka's: generations, a leader that computes the assignment with a
//! client-side assignor (eager or cooperative alike: the coordinator only carries the opaque
//! metadata and assignments), `MEMBER_ID_REQUIRED` on a first join, session and rebalance
//! timeouts, and static membership (`group.instance.id`): a static member that restarts
//! within its session timeout with the same subscription gets its assignment back without
//! a rebalance, and its old incarnation is fenced.

mod describe;
mod group;
#[cfg(test)]
mod tests;

pub use describe::{ClassicGroupDescription, ClassicMemberDescription};
pub use group::{ClassicGroup, GroupState, MemberView};

use std::collections::{BTreeMap, VecDeque};

/// Identifies a request waiting for a JoinGroup or SyncGroup answer (chosen by the driver).
pub type RequestId = u64;

/// Why a classic-group request failed (mapped to Kafka error codes by the listener).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassicError {
    /// The member id is not a member of the group.
    UnknownMemberId,
    /// The generation is not the group's current one.
    IllegalGeneration,
    /// A rebalance is in progress: rejoin.
    RebalanceInProgress,
    /// Protocol type or protocols do not match the group's.
    InconsistentGroupProtocol,
    /// First join of a dynamic member: retry with the member id given.
    MemberIdRequired,
    /// The session timeout is outside the allowed range.
    InvalidSessionTimeout,
    /// The group has the maximum number of members.
    GroupMaxSizeReached,
    /// Another incarnation of this static member (`group.instance.id`) replaced this one.
    FencedInstanceId,
    /// The group is being deleted.
    CoordinatorNotAvailable,
    /// The group still has members (delete refused).
    NonEmptyGroup,
    /// The group does not exist.
    GroupIdNotFound,
    /// Too many groups are held.
    TooManyGroups,
}

/// A JoinGroup request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinRequest {
    /// Member id; empty for a first join.
    pub member_id: String,
    /// `group.instance.id` of a static member.
    pub instance_id: Option<String>,
    /// Client id (for DescribeGroups).
    pub client_id: String,
    /// Client host (for DescribeGroups).
    pub client_host: String,
    /// Session timeout, ms.
    pub session_timeout_ms: u64,
    /// Rebalance timeout, ms.
    pub rebalance_timeout_ms: u64,
    /// Protocol type (`consumer` for consumers).
    pub protocol_type: String,
    /// Supported protocols (assignor names) in order of preference, with their metadata.
    pub protocols: Vec<(String, Vec<u8>)>,
    /// JoinGroup v4+: a dynamic member without an id is answered MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
    /// The id to give the member if it needs a new one (the driver makes it unique).
    pub new_member_id: String,
    /// JoinGroup v9+: the leader may be told to skip the assignment (static leader rejoin).
    pub supports_skip_assignment: bool,
}

/// A JoinGroup answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JoinResponse {
    /// Error, if any.
    pub error: Option<ClassicError>,
    /// The generation joined.
    pub generation: i32,
    /// The group's protocol type.
    pub protocol_type: Option<String>,
    /// The chosen protocol (assignor).
    pub protocol_name: Option<String>,
    /// The leader's member id.
    pub leader: String,
    /// This member's id.
    pub member_id: String,
    /// Members with their metadata for the chosen protocol (leader only):
    /// (member id, instance id, metadata).
    pub members: Vec<(String, Option<String>, Vec<u8>)>,
    /// The leader keeps the current assignment (static leader rejoin).
    pub skip_assignment: bool,
}

/// A SyncGroup request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRequest {
    /// Member id.
    pub member_id: String,
    /// Static member id.
    pub instance_id: Option<String>,
    /// Generation.
    pub generation: i32,
    /// Protocol type (v5+), checked when given.
    pub protocol_type: Option<String>,
    /// Protocol name (v5+), checked when given.
    pub protocol_name: Option<String>,
    /// The leader's assignment: member id -> assignment bytes.
    pub assignments: BTreeMap<String, Vec<u8>>,
}

/// A SyncGroup answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SyncResponse {
    /// Error, if any.
    pub error: Option<ClassicError>,
    /// Protocol type.
    pub protocol_type: Option<String>,
    /// Protocol name.
    pub protocol_name: Option<String>,
    /// This member's assignment.
    pub assignment: Vec<u8>,
}

/// One member of a LeaveGroup request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeavingMember {
    /// Member id (may be empty for a static member leaving by instance id).
    pub member_id: String,
    /// Static member id.
    pub instance_id: Option<String>,
}

/// What the state machine decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Answer a waiting JoinGroup.
    Join(RequestId, JoinResponse),
    /// Answer a waiting SyncGroup.
    Sync(RequestId, SyncResponse),
    /// Answer a (held) Heartbeat.
    Heartbeat(RequestId, Result<(), ClassicError>),
    /// A new generation started with these members.
    Rebalanced {
        /// Group.
        group: String,
        /// Generation.
        generation: i32,
        /// Members.
        members: usize,
    },
    /// A member was removed.
    MemberRemoved {
        /// Group.
        group: String,
        /// Member id.
        member_id: String,
        /// Why.
        reason: &'static str,
    },
}

/// How many of the partitions an offset commit names an assignment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Covers {
    /// Every one.
    All,
    /// Some, not all.
    Some,
    /// None.
    None,
}

/// Limits and timing rules of the groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassicConfig {
    /// `group.initial.rebalance.delay.ms`.
    pub initial_rebalance_delay_ms: u64,
    /// `group.min.session.timeout.ms`.
    pub min_session_timeout_ms: u64,
    /// `group.max.session.timeout.ms`.
    pub max_session_timeout_ms: u64,
    /// `group.max.size`.
    pub max_size: usize,
    /// Most groups held.
    pub max_groups: usize,
    /// How long a heartbeat of a member of a Stable group is held before it is answered
    /// (at most a third of the member's session timeout; 0: answered at once, as Kafka does).
    /// A held heartbeat is answered REBALANCE_IN_PROGRESS as soon as a rebalance starts, so
    /// members learn of it at once instead of at their next heartbeat. Best a little below
    /// the clients' heartbeat interval (3 s by default), so the next heartbeat follows the
    /// answer at once.
    pub heartbeat_hold_ms: u64,
    /// When new members join a group that has members, those are told of the rebalance only
    /// once no new member joined for this long (at most ten times this after the first), so
    /// members that start together join one generation (0: told at once).
    pub new_member_window_ms: u64,
}

impl Default for ClassicConfig {
    fn default() -> Self {
        ClassicConfig {
            initial_rebalance_delay_ms: 3_000,
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            max_size: 1_000,
            max_groups: 10_000,
            heartbeat_hold_ms: 2_750,
            new_member_window_ms: 200,
        }
    }
}

/// All classic groups of one coordinator.
#[derive(Debug, Default)]
pub struct ClassicGroups {
    config: ClassicConfig,
    groups: BTreeMap<String, ClassicGroup>,
    outputs: VecDeque<Output>,
}

impl ClassicGroups {
    /// No groups yet.
    pub fn new(config: ClassicConfig) -> ClassicGroups {
        ClassicGroups {
            config,
            groups: BTreeMap::new(),
            outputs: VecDeque::new(),
        }
    }

    /// A group, if held.
    pub fn get(&self, group: &str) -> Option<&ClassicGroup> {
        self.groups.get(group)
    }

    /// Every group held.
    pub fn iter(&self) -> impl Iterator<Item = &ClassicGroup> {
        self.groups.values()
    }

    fn group_mut(&mut self, group: &str) -> Result<&mut ClassicGroup, ClassicError> {
        if !self.groups.contains_key(group) {
            if self.groups.len() >= self.config.max_groups {
                // Make room by forgetting an empty group (its offsets stay in the store).
                let empty = self
                    .groups
                    .iter()
                    .find(|(_, g)| g.is_empty())
                    .map(|(k, _)| k.clone());
                match empty {
                    Some(k) => {
                        self.groups.remove(&k);
                    }
                    None => return Err(ClassicError::TooManyGroups),
                }
            }
            self.groups
                .insert(group.to_string(), ClassicGroup::new(group, self.config));
        }
        self.groups
            .get_mut(group)
            .ok_or(ClassicError::GroupIdNotFound)
    }

    /// The next answer or event to deliver, if any (answers to requests, maybe later than
    /// the request that asked: a join waits for the rebalance).
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// JoinGroup. The answer comes as an [`Output::Join`] for `req` (maybe later).
    pub fn handle_join(&mut self, now: u64, group: &str, req: RequestId, join: JoinRequest) {
        let out = match self.group_mut(group) {
            Ok(g) => g.join(req, join, now),
            Err(e) => vec![Output::Join(
                req,
                JoinResponse {
                    error: Some(e),
                    member_id: join.member_id,
                    generation: -1,
                    ..JoinResponse::default()
                },
            )],
        };
        self.outputs.extend(out);
    }

    /// SyncGroup. The answer comes as an [`Output::Sync`] for `req` (maybe later).
    pub fn handle_sync(&mut self, now: u64, group: &str, req: RequestId, sync: SyncRequest) {
        let out = match self.groups.get_mut(group) {
            Some(g) => g.sync(req, sync, now),
            None => vec![Output::Sync(
                req,
                SyncResponse {
                    error: Some(ClassicError::UnknownMemberId),
                    ..SyncResponse::default()
                },
            )],
        };
        self.outputs.extend(out);
    }

    /// Heartbeat. The answer comes as an [`Output::Heartbeat`] for `req`: at once, or, for a
    /// member of a Stable group, when a rebalance starts, when the hold ends
    /// ([`ClassicConfig::heartbeat_hold_ms`]) or when the driver calls
    /// [`ClassicGroups::handle_heartbeat_release`].
    pub fn handle_heartbeat(
        &mut self,
        now: u64,
        group: &str,
        req: RequestId,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) {
        let out = match self.groups.get_mut(group) {
            Some(g) => g.heartbeat(req, member_id, instance_id, generation, now),
            None => vec![Output::Heartbeat(req, Err(ClassicError::UnknownMemberId))],
        };
        self.outputs.extend(out);
    }

    /// Answers a held heartbeat now (the member sent another request on its connection, or
    /// the connection closed); nothing if it was answered already.
    pub fn handle_heartbeat_release(&mut self, now: u64, group: &str, req: RequestId) {
        if let Some(g) = self.groups.get_mut(group) {
            let out = g.release_heartbeat(req, now);
            self.outputs.extend(out);
        }
    }

    /// LeaveGroup: one result per member (answers of requests it completes are outputs).
    pub fn handle_leave(
        &mut self,
        now: u64,
        group: &str,
        members: &[LeavingMember],
    ) -> Vec<Result<(), ClassicError>> {
        match self.groups.get_mut(group) {
            Some(g) => {
                let (results, out) = g.leave(members, now);
                self.outputs.extend(out);
                results
            }
            None => members
                .iter()
                .map(|_| Err(ClassicError::UnknownMemberId))
                .collect(),
        }
    }

    /// Checks an offset commit against the group (and counts it as a heartbeat); `covers`
    /// says how many of the committed partitions a member's assignment (protocol type,
    /// bytes) names.
    pub fn validate_commit(
        &mut self,
        group: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: u64,
        covers: impl Fn(&str, &[u8]) -> Covers,
    ) -> Result<(), ClassicError> {
        match self.groups.get_mut(group) {
            Some(g) => g.validate_commit(member_id, instance_id, generation, now, covers),
            None if generation < 0 => Ok(()),
            None => Err(ClassicError::IllegalGeneration),
        }
    }

    /// Deletes an empty group.
    pub fn delete(&mut self, group: &str) -> Result<(), ClassicError> {
        match self.groups.get(group) {
            Some(g) if !g.is_empty() => Err(ClassicError::NonEmptyGroup),
            Some(_) => {
                self.groups.remove(group);
                Ok(())
            }
            None => Err(ClassicError::GroupIdNotFound),
        }
    }

    /// Runs the timers of every group due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        for g in self.groups.values_mut() {
            self.outputs.extend(g.tick(now));
        }
    }

    /// The earliest time [`ClassicGroups::handle_timeout`] has something to do, if any.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        self.groups
            .values()
            .filter_map(ClassicGroup::next_deadline)
            .min()
    }
}
