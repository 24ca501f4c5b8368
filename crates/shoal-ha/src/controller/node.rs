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
//!
//! This file holds the voter's state and its inputs and outputs; the leader's decisions are in
//! `election.rs`, the handling of raft-rs's `Ready` (apply, snapshots) in `ready.rs`.

use super::command::{Command, Refusal};
use super::config::{ControllerConfig, ControllerError};
use super::metadata::{Metadata, MetadataLimits};
use super::request::{ClientToken, Request, Response};
use super::storage::ControllerStorage;
use crate::time::Millis;
use crate::{BrokerId, Epoch};
use raft::eraftpb::Message;
use raft::{RawNode, StateRole};
use std::collections::{BTreeMap, VecDeque};

/// What a proposal was for, to answer when its entry applies.
#[derive(Debug, Clone, Copy)]
pub(super) enum Waiter {
    Client(ClientToken),
    /// A command of the leader's own with nobody to answer ([`Command::SetLimits`]).
    Nobody,
    /// The leader's own election step for a group; nobody to answer unless `manual`.
    Election {
        manual: Option<ClientToken>,
    },
}

/// What the leader knows of a broker, outside the log.
#[derive(Debug, Clone, Copy)]
pub(super) struct Live {
    pub(super) seen: Millis,
    /// The connection its requests came on closed after `seen`: not alive until it is heard
    /// from again.
    pub(super) disconnected: bool,
    pub(super) last_epoch: Epoch,
    pub(super) end_offset: u64,
}

impl Live {
    pub(super) fn alive(&self, now: Millis, session: Millis) -> bool {
        !self.disconnected && now < self.seen + session
    }
}

/// What the leader last heard from one broker ([`ControllerNode::heard`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    /// The broker.
    pub broker_id: BrokerId,
    /// How long ago, by the leader's clock.
    pub ago_ms: Millis,
    /// Heard within the session and its connection open since.
    pub alive: bool,
    /// Its connection closed after it was last heard.
    pub disconnected: bool,
    /// The epoch of the last entry of its log (its last heartbeat).
    pub last_epoch: Epoch,
    /// The end of its commit log (its last heartbeat; 0 for a master heard only through
    /// lease renewals).
    pub end_offset: u64,
}

/// An election the leader is running for one group.
#[derive(Debug, Clone)]
pub(super) struct Election {
    pub(super) target: Option<BrokerId>,
    pub(super) manual: Option<ClientToken>,
    /// A proposal is in the log and not applied yet; retried after this time.
    pub(super) inflight_until: Option<Millis>,
}

/// How long an election proposal may stay unapplied before the leader proposes again.
pub(super) const ELECTION_RETRY_MS: Millis = 1_000;

/// One controller voter.
pub struct ControllerNode {
    pub(super) cfg: ControllerConfig,
    pub(super) raw: RawNode<ControllerStorage>,
    pub(super) storage: ControllerStorage,
    pub(super) metadata: Metadata,
    pub(super) next_tick: Millis,
    pub(super) now: Millis,
    pub(super) seq: u64,
    pub(super) pending: BTreeMap<u64, Waiter>,
    pub(super) outbox: VecDeque<Message>,
    pub(super) responses: VecDeque<(ClientToken, Response)>,
    pub(super) leader_since: Option<Millis>,
    pub(super) live: BTreeMap<(String, BrokerId), Live>,
    /// When the leader last saw a lease granted per group, by its clock.
    pub(super) lease_seen: BTreeMap<String, Millis>,
    pub(super) elections: BTreeMap<String, Election>,
    pub(super) elections_done: u64,
    pub(super) snapshots_installed: u64,
    /// The metadata at `compact_mark`, to cut the log at the next mark.
    pub(super) pending_snapshot: Option<(u64, Vec<u8>)>,
    pub(super) compact_mark: u64,
    /// A [`Command::SetLimits`] of this leader is in the log; proposed again after this time.
    pub(super) limits_inflight_until: Option<Millis>,
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
            // The defaults on every voter alike; the leader proposes its configured ones.
            Metadata::new(MetadataLimits::default())
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
            limits_inflight_until: None,
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

    /// The brokers of `group` this leader heard from within the session and whose connection
    /// has not closed since (none on a follower).
    pub fn alive(&self, group: &str) -> Vec<BrokerId> {
        let live = self
            .live
            .iter()
            .filter(|((g, _), l)| g == group && l.alive(self.now, self.cfg.session_timeout_ms));
        live.map(|((_, b), _)| *b).collect()
    }

    /// What this leader last heard from each broker of `group` (none on a follower).
    pub fn heard(&self, group: &str) -> Vec<Heard> {
        let session = self.cfg.session_timeout_ms;
        self.live
            .iter()
            .filter(|((g, _), _)| g == group)
            .map(|((_, b), l)| Heard {
                broker_id: *b,
                ago_ms: self.now.saturating_sub(l.seen),
                alive: l.alive(self.now, session),
                disconnected: l.disconnected,
                last_epoch: l.last_epoch,
                end_offset: l.end_offset,
            })
            .collect()
    }

    /// How long the last lease of `group` this leader saw granted lasts yet, by its clock: the
    /// lease counted from when the grant applied here (or this voter became leader, which
    /// counts as a grant). The master counts from when it asked, so its own lease ends no
    /// later. `None` on a follower or for an unknown group.
    pub fn lease_left_ms(&self, group: &str) -> Option<Millis> {
        let since = self.leader_since?;
        self.metadata.group(group)?;
        let seen = self.lease_seen.get(group).copied().unwrap_or(0).max(since);
        Some((seen + self.cfg.lease.lease_ms()).saturating_sub(self.now))
    }

    /// The connection a broker's requests came on closed (the caller maps connections to
    /// brokers, see [`super::BrokerConnections`]). On the leader the broker is not alive from
    /// now until it is heard from again; if it is a group's master, the election begins at once
    /// (fenced, then held until the last lease seen has certainly expired). A follower ignores
    /// it, as it ignores heartbeats.
    pub fn handle_broker_disconnected(&mut self, now: Millis, group: &str, broker_id: BrokerId) {
        self.now = self.now.max(now);
        if !self.is_leader() {
            return;
        }
        if let Some(l) = self.live.get_mut(&(group.to_string(), broker_id)) {
            l.disconnected = true;
        }
        self.drive_elections();
        self.pump();
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
                                disconnected: false,
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
                                    disconnected: false,
                                    last_epoch: master_epoch,
                                    end_offset: 0,
                                });
                            live.seen = self.now;
                            live.disconnected = false;
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
            self.drive_limits();
            self.drive_elections();
            self.pump();
        }
    }

    /// The leader proposes its configured limits when the applied ones differ (retried while
    /// the proposal is not applied).
    fn drive_limits(&mut self) {
        if self.metadata.limits() == self.cfg.limits
            || self
                .limits_inflight_until
                .is_some_and(|until| self.now < until)
        {
            return;
        }
        self.limits_inflight_until = Some(self.now + ELECTION_RETRY_MS);
        let limits = self.cfg.limits;
        self.propose(Command::SetLimits { limits }, Waiter::Nobody);
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

    pub(super) fn propose(&mut self, cmd: Command, waiter: Waiter) {
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

    pub(super) fn answer(&mut self, waiter: Waiter, response: Response) {
        match waiter {
            Waiter::Client(token) => self.responses.push_back((token, response)),
            Waiter::Election { manual } => {
                if let Some(token) = manual {
                    self.responses.push_back((token, response));
                }
            }
            Waiter::Nobody => {}
        }
    }
}
