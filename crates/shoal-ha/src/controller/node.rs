//! One controller voter: raft-rs's [`RawNode`] with the [`Metadata`] it applies, and the
//! leader's decisions (who is alive, when a lease has certainly expired, whom to elect).
//!
//! Sans-IO, in quinn-proto's shape: `handle_*` take events and `now`, `poll_*` give what to do.
//! After any `handle_*` call, drain [`ControllerNode::poll_transmit`] (Raft messages to other
//! voters) and [`ControllerNode::poll_response`] (answers to brokers), then sleep until
//! [`ControllerNode::poll_timeout`] and call [`ControllerNode::handle_timeout`].
//!
//! The Raft log lives in a [`ControllerStorage`], which the caller owns and hands in: it is
//! the voter's disk (everything in it was persisted before any message that depends on it was
//! handed out, as raft-rs's `Ready` contract asks). Every `compact_every` applied entries the
//! voter replaces its log up to there by a snapshot of the metadata, which also brings a
//! lagging voter back. A restarted voter gets the same storage back, restores the snapshot and
//! re-applies the committed entries after it.
//!
//! What is not in the log, and why that is safe: broker liveness (heartbeats) is the leader's
//! own view; a new leader starts with every broker unseen and every lease just granted, so it
//! waits a whole session and a whole election delay before electing anyone.

use super::command::{Command, GroupInfo, Outcome, Refusal};
use super::metadata::{Metadata, MetadataLimits};
use super::storage::ControllerStorage;
use crate::time::{LeaseTiming, Millis};
use crate::{BrokerId, Epoch};
use raft::eraftpb::{Entry, EntryType, Message};
use raft::{RawNode, StateRole};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// A request from a broker or an operator to the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Ask for a broker id (idempotent per token).
    ApplyBrokerId {
        /// The broker group.
        group: String,
        /// The broker's address.
        addr: String,
        /// The nonce on the broker's disk.
        token: String,
    },
    /// Register an address under an id.
    Register {
        /// The broker group.
        group: String,
        /// Its id.
        broker_id: BrokerId,
        /// Its address.
        addr: String,
    },
    /// Liveness and replication progress; answered at once with the group's metadata as the
    /// leader last applied it (RocketMQ's BROKER_HEARTBEAT and GET_REPLICA_INFO in one).
    Heartbeat {
        /// The broker group.
        group: String,
        /// Its id.
        broker_id: BrokerId,
        /// The epoch of the last entry in its log.
        last_epoch: Epoch,
        /// The end offset of its commit log.
        end_offset: u64,
    },
    /// The master renews its write lease (also a heartbeat).
    RenewLease {
        /// The broker group.
        group: String,
        /// The master.
        broker_id: BrokerId,
        /// Its master epoch.
        master_epoch: Epoch,
    },
    /// The master changes the in-sync set.
    AlterInSyncSet {
        /// The broker group.
        group: String,
        /// The master.
        master: BrokerId,
        /// Its master epoch.
        master_epoch: Epoch,
        /// The in-sync-set epoch the proposal is based on.
        in_sync_epoch: Epoch,
        /// The proposed set.
        in_sync: std::collections::BTreeSet<BrokerId>,
    },
    /// An operator's switch-over: elect `target` (or the best in-sync replica) once the
    /// current master's lease has certainly expired.
    ElectMaster {
        /// The broker group.
        group: String,
        /// The replica to elect, or `None` for the best one.
        target: Option<BrokerId>,
    },
}

/// The controller's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The broker's id.
    BrokerId(BrokerId),
    /// The group's metadata after the request.
    Group(GroupInfo),
    /// The lease is granted: the master may acknowledge writes for `lease_ms` counted from
    /// when it sent the request.
    LeaseGranted {
        /// The epoch the lease is for.
        master_epoch: Epoch,
        /// Its length.
        lease_ms: Millis,
    },
    /// Refused by a fence or a limit.
    Refused(Refusal),
    /// This voter is not the leader; ask `leader` (a voter id) if known.
    NotLeader {
        /// The leader this voter knows of.
        leader: Option<u64>,
    },
    /// Too many requests in flight; retry later.
    Busy,
}

/// Who sent a request; the caller's own handle, given back with the answer.
pub type ClientToken = u64;

/// How a voter is set up.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// This voter's id (non-zero).
    pub id: u64,
    /// Every voter's id, this one included.
    pub voters: Vec<u64>,
    /// One Raft tick.
    pub tick_ms: Millis,
    /// Raft's election timeout in ticks (each voter adds its own offset, see
    /// [`ControllerNode::new`]).
    pub election_ticks: usize,
    /// Raft's heartbeat interval in ticks.
    pub heartbeat_ticks: usize,
    /// A broker not heard from for this long is dead.
    pub session_timeout_ms: Millis,
    /// Lease and election delay.
    pub lease: LeaseTiming,
    /// What the metadata may hold.
    pub limits: MetadataLimits,
    /// Requests waiting for their entry to apply, at most.
    pub max_pending: usize,
    /// Replace the applied log by a snapshot every this many entries.
    pub compact_every: u64,
}

impl ControllerConfig {
    /// A voter with the defaults: 100 ms ticks, 1 s election timeout, 3 s session.
    pub fn new(id: u64, voters: Vec<u64>) -> Self {
        Self {
            id,
            voters,
            tick_ms: 100,
            election_ticks: 10,
            heartbeat_ticks: 2,
            session_timeout_ms: 3_000,
            lease: LeaseTiming::default(),
            limits: MetadataLimits::default(),
            max_pending: 1_024,
            compact_every: 10_000,
        }
    }
}

/// Errors building a voter.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// raft-rs refused the configuration or the storage.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// This voter's id is not among the voters.
    #[error("voter {0} is not in the voter list")]
    NotAVoter(u64),
    /// The snapshot on disk does not decode.
    #[error("snapshot: {0}")]
    Snapshot(#[from] serde_json::Error),
}

/// What a proposal was for, to answer when its entry applies.
#[derive(Debug, Clone, Copy)]
enum Waiter {
    Client(ClientToken),
    /// The leader's own election step for a group; nobody to answer unless `manual`.
    Election {
        manual: Option<ClientToken>,
    },
}

/// What the leader knows of a broker, outside the log.
#[derive(Debug, Clone, Copy)]
struct Live {
    seen: Millis,
    last_epoch: Epoch,
    end_offset: u64,
}

/// An election the leader is running for one group.
#[derive(Debug, Clone)]
struct Election {
    target: Option<BrokerId>,
    manual: Option<ClientToken>,
    /// A proposal is in the log and not applied yet; retried after this time.
    inflight_until: Option<Millis>,
}

/// One controller voter.
pub struct ControllerNode {
    cfg: ControllerConfig,
    raw: RawNode<ControllerStorage>,
    storage: ControllerStorage,
    metadata: Metadata,
    next_tick: Millis,
    now: Millis,
    seq: u64,
    pending: BTreeMap<u64, Waiter>,
    outbox: VecDeque<Message>,
    responses: VecDeque<(ClientToken, Response)>,
    leader_since: Option<Millis>,
    live: BTreeMap<(String, BrokerId), Live>,
    /// When the leader last saw a lease granted per group, by its clock.
    lease_seen: BTreeMap<String, Millis>,
    elections: BTreeMap<String, Election>,
    elections_done: u64,
    snapshots_installed: u64,
    /// The metadata at `compact_mark`, to cut the log at the next mark.
    pending_snapshot: Option<(u64, Vec<u8>)>,
    compact_mark: u64,
}

impl std::fmt::Debug for ControllerNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerNode")
            .field("id", &self.cfg.id)
            .field("role", &self.raw.raft.state)
            .field("term", &self.raw.raft.term)
            .field("applied", &self.raw.raft.raft_log.applied)
            .finish_non_exhaustive()
    }
}

/// How long an election proposal may stay unapplied before the leader proposes again.
const ELECTION_RETRY_MS: Millis = 1_000;

impl ControllerNode {
    /// A voter on `storage` (empty for a new voter, the same one after a restart), at `now`.
    ///
    /// Raft's randomized election timeout is replaced by a fixed one per voter (`election_ticks`
    /// plus twice the voter's position among the voters): distinct voters time out at distinct
    /// ticks, split votes resolve, and a run is a pure function of its inputs.
    pub fn new(
        cfg: ControllerConfig,
        storage: ControllerStorage,
        now: Millis,
    ) -> Result<Self, ControllerError> {
        let position = cfg
            .voters
            .iter()
            .position(|v| *v == cfg.id)
            .ok_or(ControllerError::NotAVoter(cfg.id))?;
        storage.ensure_voters(&cfg.voters);
        let snapshot = storage.latest_snapshot();
        let metadata = if snapshot.get_data().is_empty() {
            Metadata::new(cfg.limits)
        } else {
            serde_json::from_slice(snapshot.get_data())?
        };
        let applied = snapshot.get_metadata().index;
        let min_election_tick = cfg.election_ticks + 2 * position;
        let raft_cfg = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            min_election_tick,
            max_election_tick: min_election_tick + 1,
            check_quorum: true,
            pre_vote: true,
            max_inflight_msgs: 256,
            max_size_per_msg: 1 << 20,
            applied,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&raft_cfg, storage.clone(), &logger)?;
        let lease_seen = metadata.groups().keys().map(|g| (g.clone(), now)).collect();
        let mut node = Self {
            next_tick: now + cfg.tick_ms,
            metadata,
            cfg,
            raw,
            storage,
            now,
            seq: 0,
            pending: BTreeMap::new(),
            outbox: VecDeque::new(),
            responses: VecDeque::new(),
            leader_since: None,
            live: BTreeMap::new(),
            lease_seen,
            elections: BTreeMap::new(),
            elections_done: 0,
            snapshots_installed: 0,
            pending_snapshot: None,
            compact_mark: applied,
        };
        node.pump();
        Ok(node)
    }

    /// This voter's id.
    pub fn id(&self) -> u64 {
        self.cfg.id
    }

    /// Whether this voter believes it leads.
    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// The leader this voter knows of.
    pub fn leader(&self) -> Option<u64> {
        match self.raw.raft.leader_id {
            0 => None,
            id => Some(id),
        }
    }

    /// The Raft term this voter is at.
    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// The metadata as this voter applied it.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The index of the last entry applied.
    pub fn applied_index(&self) -> u64 {
        self.raw.raft.raft_log.applied
    }

    /// Elections this voter decided while leading (applied).
    pub fn elections_done(&self) -> u64 {
        self.elections_done
    }

    /// The brokers of `group` this leader heard from within the session (none on a follower).
    pub fn alive(&self, group: &str) -> Vec<BrokerId> {
        let session = self.cfg.session_timeout_ms;
        let live = self
            .live
            .iter()
            .filter(|((g, _), l)| g == group && self.now < l.seen + session);
        live.map(|((_, b), _)| *b).collect()
    }

    /// Snapshots received from a leader and installed.
    pub fn snapshots_installed(&self) -> u64 {
        self.snapshots_installed
    }

    /// A Raft message from another voter.
    pub fn handle_message(&mut self, now: Millis, msg: Message) {
        self.now = self.now.max(now);
        // A message from a voter we do not know, or garbage, is dropped (raft-rs says why).
        let _ = self.raw.step(msg);
        self.pump();
    }

    /// A request from a broker or an operator; answered through [`Self::poll_response`].
    pub fn handle_request(&mut self, now: Millis, from: ClientToken, req: Request) {
        self.now = self.now.max(now);
        if !self.is_leader() {
            let leader = self.leader();
            self.responses
                .push_back((from, Response::NotLeader { leader }));
            return;
        }
        match req {
            Request::Heartbeat {
                group,
                broker_id,
                last_epoch,
                end_offset,
            } => {
                // Liveness is kept only for registered brokers (bounded by the metadata).
                let answer = match self.metadata.group(&group) {
                    Some(info) if info.members.contains_key(&broker_id) => {
                        self.live.insert(
                            (group.clone(), broker_id),
                            Live {
                                seen: self.now,
                                last_epoch,
                                end_offset,
                            },
                        );
                        Response::Group(info.clone())
                    }
                    Some(_) => Response::Refused(Refusal::UnknownBroker(broker_id)),
                    None => Response::Refused(Refusal::UnknownGroup),
                };
                self.responses.push_back((from, answer));
            }
            Request::ElectMaster { group, target } => {
                if self.metadata.group(&group).is_none() {
                    self.responses
                        .push_back((from, Response::Refused(Refusal::UnknownGroup)));
                    return;
                }
                if let Some(old) = self.elections.insert(
                    group,
                    Election {
                        target,
                        manual: Some(from),
                        inflight_until: None,
                    },
                ) {
                    if let Some(token) = old.manual {
                        self.responses.push_back((token, Response::Busy));
                    }
                }
                self.drive_elections();
            }
            other => {
                let cmd = match other {
                    Request::ApplyBrokerId { group, addr, token } => {
                        Command::ApplyBrokerId { group, addr, token }
                    }
                    Request::Register {
                        group,
                        broker_id,
                        addr,
                    } => Command::RegisterBroker {
                        group,
                        broker_id,
                        addr,
                    },
                    Request::RenewLease {
                        group,
                        broker_id,
                        master_epoch,
                    } => {
                        let known = self
                            .metadata
                            .group(&group)
                            .is_some_and(|g| g.members.contains_key(&broker_id));
                        if known {
                            let live =
                                self.live.entry((group.clone(), broker_id)).or_insert(Live {
                                    seen: self.now,
                                    last_epoch: master_epoch,
                                    end_offset: 0,
                                });
                            live.seen = self.now;
                        }
                        Command::GrantLease {
                            group,
                            master: broker_id,
                            master_epoch,
                        }
                    }
                    Request::AlterInSyncSet {
                        group,
                        master,
                        master_epoch,
                        in_sync_epoch,
                        in_sync,
                    } => Command::AlterInSyncSet {
                        group,
                        master,
                        master_epoch,
                        in_sync_epoch,
                        in_sync,
                    },
                    // Answered above.
                    Request::Heartbeat { .. } | Request::ElectMaster { .. } => return,
                };
                self.propose(cmd, Waiter::Client(from));
            }
        }
        self.pump();
    }

    /// Time passed: ticks Raft and runs the leader's election checks.
    pub fn handle_timeout(&mut self, now: Millis) {
        self.now = self.now.max(now);
        while self.next_tick <= self.now {
            self.raw.tick();
            self.next_tick += self.cfg.tick_ms;
        }
        self.pump();
        if self.is_leader() {
            self.drive_elections();
            self.pump();
        }
    }

    /// When [`Self::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Millis {
        self.next_tick
    }

    /// A Raft message for another voter (`msg.to`).
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Message> {
        self.outbox.pop_front()
    }

    /// An answer for a client.
    #[must_use]
    pub fn poll_response(&mut self) -> Option<(ClientToken, Response)> {
        self.responses.pop_front()
    }

    fn propose(&mut self, cmd: Command, waiter: Waiter) {
        if self.pending.len() >= self.cfg.max_pending {
            self.answer(waiter, Response::Busy);
            return;
        }
        self.seq += 1;
        let mut context = Vec::with_capacity(16);
        context.extend_from_slice(&self.cfg.id.to_be_bytes());
        context.extend_from_slice(&self.seq.to_be_bytes());
        let data = match serde_json::to_vec(&cmd) {
            Ok(data) => data,
            Err(_) => return self.answer(waiter, Response::Busy),
        };
        match self.raw.propose(context, data) {
            Ok(()) => {
                self.pending.insert(self.seq, waiter);
            }
            Err(_) => {
                let leader = self.leader();
                self.answer(waiter, Response::NotLeader { leader });
            }
        }
    }

    fn answer(&mut self, waiter: Waiter, response: Response) {
        match waiter {
            Waiter::Client(token) => self.responses.push_back((token, response)),
            Waiter::Election { manual } => {
                if let Some(token) = manual {
                    self.responses.push_back((token, response));
                }
            }
        }
    }

    /// The leader's election step for every group that needs one: fence the old master's
    /// leases, wait until the last lease seen has certainly expired, then elect the in-sync
    /// replica with the highest epoch and offset.
    fn drive_elections(&mut self) {
        let Some(since) = self.leader_since else {
            return;
        };
        let now = self.now;
        let session = self.cfg.session_timeout_ms;
        let alive = |live: &BTreeMap<(String, BrokerId), Live>, g: &str, b: BrokerId| {
            live.get(&(g.to_string(), b))
                .filter(|l| now < l.seen + session)
                .copied()
        };
        // Automatic failovers: a group whose master is not alive (a new leader first waits a
        // whole session, as it has seen nobody yet), or a group with no master yet.
        if now >= since + session {
            for (name, info) in self.metadata.groups() {
                if self.elections.contains_key(name) {
                    continue;
                }
                // A fenced master (an election a former leader began) cannot renew its
                // lease: finish that election (the master itself is a candidate again).
                let needs = match info.master {
                    Some(m) => {
                        alive(&self.live, name, m).is_none()
                            || info.fenced_epoch >= info.master_epoch
                    }
                    None => info
                        .members
                        .keys()
                        .any(|b| alive(&self.live, name, *b).is_some()),
                };
                if needs {
                    self.elections.insert(
                        name.clone(),
                        Election {
                            target: None,
                            manual: None,
                            inflight_until: None,
                        },
                    );
                }
            }
        }
        let names: Vec<String> = self.elections.keys().cloned().collect();
        for name in names {
            let Some(info) = self.metadata.group(&name).cloned() else {
                self.elections.remove(&name);
                continue;
            };
            let Some(election) = self.elections.get(&name).cloned() else {
                continue;
            };
            if election.inflight_until.is_some_and(|until| now < until) {
                continue;
            }
            let waiter = Waiter::Election {
                manual: election.manual,
            };
            let first = info.master.is_none() && info.in_sync.is_empty();
            if !first && info.fenced_epoch < info.master_epoch {
                self.mark_inflight(&name);
                self.propose(
                    Command::FenceLeases {
                        group: name.clone(),
                        master_epoch: info.master_epoch,
                    },
                    Waiter::Election { manual: None },
                );
                continue;
            }
            let seen = self.lease_seen.get(&name).copied().unwrap_or(0).max(since);
            if !first && now < seen + self.cfg.lease.election_delay_ms() {
                continue;
            }
            // Candidates: alive members of the in-sync set (any alive member the first time),
            // the best by (epoch, offset) descending, then the lowest id.
            let pool: Vec<BrokerId> = if first {
                info.members.keys().copied().collect()
            } else {
                info.in_sync.iter().copied().collect()
            };
            let mut best: Option<(Epoch, u64, std::cmp::Reverse<BrokerId>)> = None;
            for b in pool {
                if election.target.is_some_and(|t| t != b) {
                    continue;
                }
                if let Some(l) = alive(&self.live, &name, b) {
                    let key = (l.last_epoch, l.end_offset, std::cmp::Reverse(b));
                    if best.is_none_or(|k| key > k) {
                        best = Some(key);
                    }
                }
            }
            let Some((_, _, std::cmp::Reverse(master))) = best else {
                // Nobody electable is alive: keep waiting (the fence stays, so the old master
                // cannot acknowledge; it is a candidate again once it is heard from).
                continue;
            };
            self.mark_inflight(&name);
            self.propose(
                Command::ElectMaster {
                    group: name.clone(),
                    master,
                    expect_master_epoch: info.master_epoch,
                },
                waiter,
            );
        }
    }

    fn mark_inflight(&mut self, name: &str) {
        if let Some(e) = self.elections.get_mut(name) {
            e.inflight_until = Some(self.now + ELECTION_RETRY_MS);
        }
    }

    /// Handles raft-rs's `Ready` as its contract asks: send messages, persist entries and hard
    /// state, send the messages that needed them persisted, apply committed entries, advance.
    fn pump(&mut self) {
        while self.raw.has_ready() {
            let mut ready = self.raw.ready();
            if let Some(ss) = ready.ss() {
                self.on_role(ss.raft_state);
            }
            self.outbox.extend(ready.take_messages());
            if !ready.snapshot().is_empty() {
                self.install(ready.snapshot().clone());
            }
            let committed = ready.take_committed_entries();
            self.apply(committed);
            self.storage.append(ready.entries());
            if let Some(hs) = ready.hs() {
                self.storage.set_hard_state(hs.clone());
            }
            self.outbox.extend(ready.take_persisted_messages());
            let mut light = self.raw.advance(ready);
            if let Some(commit) = light.commit_index() {
                self.storage.set_commit(commit);
            }
            self.outbox.extend(light.take_messages());
            let committed = light.take_committed_entries();
            self.apply(committed);
            self.raw.advance_apply();
        }
        self.maybe_compact();
    }

    /// A snapshot from the leader replaces the metadata. Every lease in it counts as granted
    /// now (it was granted before the snapshot was taken).
    fn install(&mut self, snapshot: raft::eraftpb::Snapshot) {
        let metadata = serde_json::from_slice::<Metadata>(snapshot.get_data()).ok();
        self.storage.apply_snapshot(snapshot);
        // A snapshot without data (none was taken yet) holds no metadata to install.
        if let Some(metadata) = metadata {
            for g in metadata.groups().keys() {
                self.lease_seen.insert(g.clone(), self.now);
            }
            self.metadata = metadata;
            self.snapshots_installed += 1;
            self.pending_snapshot = None;
            self.compact_mark = self.raw.raft.raft_log.applied.max(self.compact_mark);
        }
    }

    /// Every `compact_every` applied entries, the log is cut at the snapshot taken at the
    /// previous mark, so the newest `compact_every` entries or more stay for voters that are
    /// only a little behind (a cut at `applied` would send them snapshots all the time).
    fn maybe_compact(&mut self) {
        let applied = self.raw.raft.raft_log.applied;
        if applied < self.compact_mark + self.cfg.compact_every {
            return;
        }
        if let Some((index, data)) = self.pending_snapshot.take() {
            self.storage.compact(index, data);
        }
        if let Ok(data) = serde_json::to_vec(&self.metadata) {
            self.pending_snapshot = Some((applied, data));
        }
        self.compact_mark = applied;
    }

    fn on_role(&mut self, role: StateRole) {
        if role == StateRole::Leader {
            if self.leader_since.is_none() {
                self.leader_since = Some(self.now);
                self.live.clear();
                self.elections.clear();
            }
        } else if self.leader_since.take().is_some() {
            let pending = std::mem::take(&mut self.pending);
            let leader = self.leader();
            for (_, waiter) in pending {
                self.answer(waiter, Response::NotLeader { leader });
            }
            let elections = std::mem::take(&mut self.elections);
            for (_, e) in elections {
                if let Some(token) = e.manual {
                    self.responses
                        .push_back((token, Response::NotLeader { leader }));
                }
            }
            self.live.clear();
        }
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        for entry in entries {
            if entry.get_entry_type() != EntryType::EntryNormal || entry.get_data().is_empty() {
                continue;
            }
            // Entries are written only by `propose` from a `Command`; one that does not decode
            // was written by another version and is skipped by every voter alike.
            let Ok(cmd) = serde_json::from_slice::<Command>(entry.get_data()) else {
                continue;
            };
            let outcome = self.metadata.apply(&cmd);
            if let (Command::GrantLease { group, .. }, Outcome::LeaseGranted { .. }) =
                (&cmd, &outcome)
            {
                self.lease_seen.insert(group.clone(), self.now);
            }
            let waiter = self.waiter_of(entry.get_context());
            if let Command::ElectMaster { group, .. } = &cmd {
                if matches!(outcome, Outcome::Group(_)) {
                    if self.is_leader() {
                        self.elections_done += 1;
                    }
                    self.elections.remove(group);
                } else if waiter.is_some() {
                    // Refused: the view it was decided on is gone; decide again.
                    if let Some(e) = self.elections.get_mut(group) {
                        e.inflight_until = None;
                        if e.manual.is_some() {
                            self.elections.remove(group);
                        }
                    }
                }
            }
            if let Command::FenceLeases { group, .. } = &cmd {
                if let Some(e) = self.elections.get_mut(group) {
                    e.inflight_until = None;
                }
            }
            if let Some(waiter) = waiter {
                let response = match outcome {
                    Outcome::BrokerId(id) => Response::BrokerId(id),
                    Outcome::Group(info) => Response::Group(info),
                    Outcome::LeaseGranted { master_epoch, .. } => Response::LeaseGranted {
                        master_epoch,
                        lease_ms: self.cfg.lease.lease_ms(),
                    },
                    Outcome::Refused(r) => Response::Refused(r),
                };
                if let (Waiter::Election { manual: None }, _) = (waiter, &response) {
                    continue;
                }
                self.answer(waiter, response);
            }
        }
    }

    fn waiter_of(&mut self, context: &[u8]) -> Option<Waiter> {
        let (node, seq) = context.split_at_checked(8)?;
        let node = u64::from_be_bytes(node.try_into().ok()?);
        let seq = u64::from_be_bytes(seq.try_into().ok()?);
        if node != self.cfg.id {
            return None;
        }
        self.pending.remove(&seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    const G: &str = "broker-a";

    /// Three voters wired to each other with no delay.
    struct Cluster {
        nodes: Vec<ControllerNode>,
        now: Millis,
        answers: Vec<(ClientToken, Response)>,
    }

    impl Cluster {
        fn new() -> Self {
            let voters = vec![1, 2, 3];
            let nodes = voters
                .iter()
                .map(|id| {
                    let cfg = ControllerConfig::new(*id, voters.clone());
                    ControllerNode::new(cfg, ControllerStorage::default(), 0).expect("voter")
                })
                .collect();
            let mut c = Self {
                nodes,
                now: 0,
                answers: Vec::new(),
            };
            c.run_for(3_000);
            c
        }

        fn pump(&mut self) {
            loop {
                let mut moved = false;
                for i in 0..self.nodes.len() {
                    while let Some(m) = self.nodes[i].poll_transmit() {
                        let to = m.to as usize - 1;
                        let now = self.now;
                        self.nodes[to].handle_message(now, m);
                        moved = true;
                    }
                    while let Some(a) = self.nodes[i].poll_response() {
                        self.answers.push(a);
                    }
                }
                if !moved {
                    return;
                }
            }
        }

        fn run_for(&mut self, ms: Millis) {
            let until = self.now + ms;
            while self.now < until {
                self.now += 10;
                for n in &mut self.nodes {
                    n.handle_timeout(self.now);
                }
                self.pump();
            }
        }

        fn leader(&self) -> usize {
            self.nodes
                .iter()
                .position(ControllerNode::is_leader)
                .expect("a leader")
        }

        fn ask(&mut self, token: ClientToken, req: Request) -> Response {
            let l = self.leader();
            let now = self.now;
            self.nodes[l].handle_request(now, token, req);
            self.pump();
            let i = self
                .answers
                .iter()
                .position(|(t, _)| *t == token)
                .expect("answered");
            self.answers.remove(i).1
        }

        fn heartbeat(&mut self, broker_id: BrokerId, end_offset: u64) -> Response {
            let req = Request::Heartbeat {
                group: G.into(),
                broker_id,
                last_epoch: 0,
                end_offset,
            };
            self.ask(1_000 + broker_id, req)
        }

        fn group(&self) -> GroupInfo {
            self.nodes[self.leader()]
                .metadata()
                .group(G)
                .cloned()
                .expect("group")
        }
    }

    #[test]
    fn a_follower_answers_not_leader() {
        let mut c = Cluster::new();
        let l = c.leader();
        let f = (l + 1) % 3;
        let now = c.now;
        c.nodes[f].handle_request(
            now,
            9,
            Request::ElectMaster {
                group: G.into(),
                target: None,
            },
        );
        let leader = Some(l as u64 + 1);
        assert_eq!(
            c.nodes[f].poll_response(),
            Some((9, Response::NotLeader { leader }))
        );
    }

    #[test]
    fn elects_the_best_replica_then_fails_over_only_after_the_lease() {
        let mut c = Cluster::new();
        for b in 1..=3u64 {
            let req = Request::ApplyBrokerId {
                group: G.into(),
                addr: format!("a{b}"),
                token: format!("t{b}"),
            };
            assert_eq!(c.ask(b, req), Response::BrokerId(b));
        }
        // Broker 2 has the most data: the first election picks it once a session passed.
        for _ in 0..20 {
            for b in 1..=3 {
                c.heartbeat(b, if b == 2 { 100 } else { 0 });
            }
            c.run_for(200);
        }
        let g = c.group();
        assert_eq!((g.master, g.master_epoch), (Some(2), 1));
        // The master grows the set and holds a lease.
        let alter = Request::AlterInSyncSet {
            group: G.into(),
            master: 2,
            master_epoch: 1,
            in_sync_epoch: g.in_sync_epoch,
            in_sync: BTreeSet::from([1, 2, 3]),
        };
        assert!(matches!(c.ask(50, alter), Response::Group(_)));
        let renew = Request::RenewLease {
            group: G.into(),
            broker_id: 2,
            master_epoch: 1,
        };
        assert!(matches!(
            c.ask(51, renew.clone()),
            Response::LeaseGranted { .. }
        ));
        let last_grant = c.now;
        // The master goes silent; the others keep beating (broker 3 has more).
        let mut elected_at = None;
        for _ in 0..100 {
            c.heartbeat(1, 100);
            c.heartbeat(3, 120);
            c.run_for(100);
            if elected_at.is_none() && c.group().master_epoch == 2 {
                elected_at = Some(c.now);
            }
        }
        let g = c.group();
        assert_eq!(g.master, Some(3));
        assert_eq!(g.in_sync, BTreeSet::from([1, 3]));
        let cfg = ControllerConfig::new(1, vec![1]);
        let at = elected_at.expect("elected");
        assert!(
            at >= last_grant + cfg.lease.election_delay_ms(),
            "elected at {at}, lease granted at {last_grant}"
        );
        // The old master's lease and proposals are refused now.
        assert_eq!(
            c.ask(52, renew),
            Response::Refused(Refusal::StaleMasterEpoch { current: 2 })
        );
    }

    #[test]
    fn a_manual_switch_over_waits_for_the_lease_and_answers() {
        let mut c = Cluster::new();
        for b in 1..=2u64 {
            let req = Request::ApplyBrokerId {
                group: G.into(),
                addr: format!("a{b}"),
                token: format!("t{b}"),
            };
            c.ask(b, req);
        }
        for _ in 0..20 {
            c.heartbeat(1, 10);
            c.heartbeat(2, 0);
            c.run_for(200);
        }
        assert_eq!(c.group().master, Some(1));
        let e = c.group().in_sync_epoch;
        let alter = Request::AlterInSyncSet {
            group: G.into(),
            master: 1,
            master_epoch: 1,
            in_sync_epoch: e,
            in_sync: BTreeSet::from([1, 2]),
        };
        c.ask(60, alter);
        let l = c.leader();
        let now = c.now;
        c.nodes[l].handle_request(
            now,
            61,
            Request::ElectMaster {
                group: G.into(),
                target: Some(2),
            },
        );
        c.pump();
        let mut answer = None;
        for _ in 0..100 {
            // The master keeps renewing: refused once the fence is applied.
            let renew = Request::RenewLease {
                group: G.into(),
                broker_id: 1,
                master_epoch: 1,
            };
            c.ask(62, renew);
            c.heartbeat(1, 10);
            c.heartbeat(2, 10);
            c.run_for(100);
            if let Some(i) = c.answers.iter().position(|(t, _)| *t == 61) {
                answer = Some(c.answers.remove(i).1);
                break;
            }
        }
        let Some(Response::Group(g)) = answer else {
            panic!("switch-over answered {answer:?}")
        };
        assert_eq!((g.master, g.master_epoch), (Some(2), 2));
    }
}

#[cfg(test)]
mod snapshot_tests {
    use super::*;

    #[test]
    fn a_voter_behind_the_compaction_point_catches_up_from_a_snapshot() {
        let voters = vec![1, 2, 3];
        let storages: Vec<ControllerStorage> =
            (0..3).map(|_| ControllerStorage::default()).collect();
        let mut nodes: Vec<Option<ControllerNode>> = (0..3)
            .map(|i| {
                let mut cfg = ControllerConfig::new(i as u64 + 1, voters.clone());
                cfg.compact_every = 8;
                ControllerNode::new(cfg, storages[i].clone(), 0).ok()
            })
            .collect();
        let mut now = 0;
        let mut answers = Vec::new();
        let step = |nodes: &mut Vec<Option<ControllerNode>>, now: Millis, answers: &mut Vec<_>| {
            for n in nodes.iter_mut().flatten() {
                n.handle_timeout(now);
            }
            loop {
                let mut moved = false;
                for i in 0..nodes.len() {
                    let mut out = Vec::new();
                    if let Some(n) = &mut nodes[i] {
                        while let Some(m) = n.poll_transmit() {
                            out.push(m);
                        }
                        while let Some(a) = n.poll_response() {
                            answers.push(a);
                        }
                    }
                    for m in out {
                        let to = m.to as usize - 1;
                        if let Some(t) = &mut nodes[to] {
                            t.handle_message(now, m);
                            moved = true;
                        }
                    }
                }
                if !moved {
                    break;
                }
            }
        };
        for _ in 0..300 {
            now += 10;
            step(&mut nodes, now, &mut answers);
        }
        // Voter 3 goes down; the others apply many entries and compact.
        nodes[2] = None;
        for b in 0..40u64 {
            now += 10;
            if let Some(l) = nodes.iter_mut().flatten().find(|n| n.is_leader()) {
                let req = Request::ApplyBrokerId {
                    group: "g".into(),
                    addr: format!("a{b}"),
                    token: format!("t{b}"),
                };
                l.handle_request(now, b, req);
            }
            step(&mut nodes, now, &mut answers);
        }
        assert!(
            storages[0].latest_snapshot().get_metadata().index > 8,
            "compacted"
        );
        let mut cfg = ControllerConfig::new(3, voters.clone());
        cfg.compact_every = 8;
        nodes[2] = ControllerNode::new(cfg, storages[2].clone(), now).ok();
        for _ in 0..300 {
            now += 10;
            step(&mut nodes, now, &mut answers);
        }
        let caught_up = nodes[2].as_ref().expect("voter 3");
        assert!(caught_up.snapshots_installed() >= 1);
        let leader = nodes
            .iter()
            .flatten()
            .find(|n| n.is_leader())
            .expect("leader");
        assert_eq!(caught_up.metadata(), leader.metadata());
        assert_eq!(
            caught_up.metadata().group("g").map(|g| g.members.len()),
            Some(16),
            "max_members of the default limits"
        );
        // A restart from its own snapshot and log gives the same metadata.
        let mut cfg = ControllerConfig::new(3, voters);
        cfg.compact_every = 8;
        let restarted = ControllerNode::new(cfg, storages[2].clone(), now).expect("restart");
        assert_eq!(
            restarted.metadata().group("g").map(|g| g.members.len()),
            Some(16)
        );
    }
}
