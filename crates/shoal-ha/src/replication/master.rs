//! The master side of a broker group's replication, sans-IO.
//!
//! The master owns its commit log (the caller appends) and decides, from replicas' acks, the
//! controller's answers and `now`: which byte ranges to ship to whom, which writes to
//! acknowledge, what the confirmed offset is, when to change the in-sync set, when to renew
//! its lease and when to step down.
//!
//! The rules that keep acknowledged writes safe:
//! - a write is acknowledged only when every member of the in-sync set *as the controller may
//!   have it* (the current set and any proposal in flight together: Kafka's "maximal ISR")
//!   has it durably, or under [`AckMode::Master`] when the master has it;
//! - and only while the lease holds at that instant (`now < lease_until`, counted from when
//!   the renewal was sent), so an old master has stopped before the controller elects another;
//! - a replica joins the in-sync set only once its log reaches the confirmed offset and the
//!   log end the master began with (what earlier masters, or this broker before a restart,
//!   acknowledged is below that), so every acknowledged write is on every member of every
//!   in-sync set the controller applies;
//! - anything carrying a newer master epoch (a replica's ack, the controller's refusal) makes
//!   the master step down: it acknowledges nothing more and fails what waits.

use super::epoch::{EpochCache, EpochOrder};
use super::message::{BatchHeader, ToMaster, ToReplica};
use crate::controller::{GroupInfo, Refusal, Request, Response};
use crate::time::Millis;
use crate::{BrokerId, Epoch};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// When a send is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckMode {
    /// After every member of the in-sync set has it (RocketMQ's `allAckInSyncStateSet`,
    /// Kafka's `acks=all`): a failover loses no acknowledged write.
    #[default]
    InSyncSet,
    /// After the master has it: a failover may lose what was acknowledged but not yet
    /// replicated to the replica that takes over.
    Master,
}

/// The master's settings.
#[derive(Debug, Clone)]
pub struct MasterConfig {
    /// When a send is acknowledged.
    pub ack: AckMode,
    /// Under [`AckMode::InSyncSet`], sends are refused while the in-sync set is smaller.
    pub min_in_sync: usize,
    /// Bytes of one batch at most.
    pub batch_max_bytes: u64,
    /// Bytes shipped and not acknowledged per replica at most.
    pub max_inflight_bytes: u64,
    /// Batches shipped and not acknowledged per replica at most. Writes that arrive while
    /// this many are in flight wait and go together in the next batch: under concurrent
    /// sends, one batch (one message to the replica, one ack back) carries many of them.
    pub max_inflight_batches: usize,
    /// An in-sync replica that has not caught up with the log end for this long is dropped
    /// from the set (RocketMQ's `haMaxTimeSlaveNotCatchup`).
    pub max_lag_ms: Millis,
    /// An empty batch (carrying the confirmed offset) at least this often.
    pub heartbeat_ms: Millis,
    /// Bytes unacknowledged for this long are shipped again.
    pub resend_ms: Millis,
    /// A write not acknowledged within this is answered with a timeout (its bytes stay).
    pub ack_timeout_ms: Millis,
    /// Renew the lease this often at most; a master renews at least three times per lease
    /// the controller grants, whatever this says.
    pub renew_ms: Millis,
    /// A renewal that no voter granted (none answered as the leader: the voters are electing
    /// one, or none is reachable) is asked again this much later, not at the next renewal:
    /// the lease then lapses only for as long as the voters take to elect a leader.
    pub renew_retry_ms: Millis,
    /// Writes waiting for their acknowledgement at most.
    pub max_pending: usize,
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            ack: AckMode::InSyncSet,
            min_in_sync: 1,
            batch_max_bytes: 256 * 1024,
            max_inflight_bytes: 4 * 1024 * 1024,
            max_inflight_batches: 2,
            max_lag_ms: 5_000,
            heartbeat_ms: 500,
            resend_ms: 1_000,
            ack_timeout_ms: 5_000,
            renew_ms: 1_000,
            renew_retry_ms: 100,
            max_pending: 65_536,
        }
    }
}

/// Why a write is not (or no longer) accepted. At the processor boundary, as RocketMQ's send
/// processor does: `InSyncReplicasNotEnough` is SYSTEM_ERROR with the remark "in-sync replicas
/// not enough" (Kafka: NOT_ENOUGH_REPLICAS, 19), `Timeout` is FLUSH_SLAVE_TIMEOUT (the bytes
/// stay on the master), `LeaseExpired` and `NotMaster` are SERVICE_NOT_AVAILABLE (Kafka:
/// NOT_LEADER_OR_FOLLOWER), `Busy` is SYSTEM_BUSY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WriteRefusal {
    /// The in-sync set is below `min_in_sync`.
    #[error("in-sync replicas not enough: {have} < {need}")]
    InSyncReplicasNotEnough {
        /// Members now.
        have: usize,
        /// Members needed.
        need: usize,
    },
    /// No valid lease at this instant.
    #[error("the master's lease has expired")]
    LeaseExpired,
    /// This broker is no longer master (a newer epoch exists).
    #[error("not the master")]
    NotMaster,
    /// Too many writes wait for their acknowledgement.
    #[error("too many writes waiting")]
    Busy,
    /// Not acknowledged in time; the bytes may or may not survive a failover.
    #[error("replicas did not acknowledge in time")]
    Timeout,
}

/// Something the master wants sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MasterTransmit {
    /// To a replica; for a [`ToReplica::Batch`], the bytes of its range go along.
    Replica {
        /// The replica.
        to: BrokerId,
        /// The message.
        msg: ToReplica,
    },
    /// To the controller; answer with [`Master::handle_controller_response`] and the same `call`.
    Controller {
        /// The master's handle for the call.
        call: u64,
        /// The request.
        req: Request,
    },
}

/// The outcome of one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acked {
    /// The caller's handle for the write.
    pub ticket: u64,
    /// The master epoch it was answered under.
    pub epoch: Epoch,
    /// Acknowledged, or why not.
    pub result: Result<(), WriteRefusal>,
}

#[derive(Debug, Clone)]
struct Follower {
    /// Durable end the replica reported; `None` until it handshook in this epoch.
    acked: Option<u64>,
    /// Next offset to ship.
    next: u64,
    last_caught_up: Millis,
    last_ack_at: Millis,
    /// When its acknowledged end last grew (or the master last shipped again from it).
    last_progress_at: Millis,
    /// The acknowledged end the master last shipped again from after a repeated ack: once per
    /// point, so the many acks a reordered window brings back do not each resend the window.
    rewound_to: Option<u64>,
    last_sent_at: Millis,
    /// Sent anything yet: a new master says so to every member at once (an empty batch of
    /// its epoch), so that a replica whose handshake came before it was master, or that has
    /// not heard of the election yet, handshakes again without waiting.
    greeted: bool,
    /// The driver could not reach it (its connection refused or failed) at this time, and
    /// nothing came from it since: a hint that it is down.
    unreachable_since: Option<Millis>,
    /// The ends of the batches shipped and not yet acknowledged, in order.
    inflight: VecDeque<u64>,
}

/// An in-sync set sent to the controller and not known to be applied or refused.
#[derive(Debug, Clone)]
struct Proposal {
    set: BTreeSet<BrokerId>,
    based_on: Epoch,
    sent_at: Millis,
}

#[derive(Debug, Clone, Copy)]
enum Call {
    Lease { sent_at: Millis },
    InSync,
}

/// A master of one epoch. A new epoch is a new `Master`.
#[derive(Debug)]
pub struct Master {
    cfg: MasterConfig,
    group: String,
    me: BrokerId,
    epoch: Epoch,
    epochs: EpochCache,
    log_end: u64,
    in_sync: BTreeSet<BrokerId>,
    in_sync_epoch: Epoch,
    proposal: Option<Proposal>,
    followers: BTreeMap<BrokerId, Follower>,
    lease_until: Millis,
    next_renew: Millis,
    /// The length of the last lease granted (0 before the first).
    granted_ms: Millis,
    calls: BTreeMap<u64, Call>,
    next_call: u64,
    pending: VecDeque<(u64, u64, Millis)>,
    acked: VecDeque<Acked>,
    confirmed: u64,
    /// The log end when this master began: everything acknowledged before (by an earlier
    /// master, or this broker before a restart) is below it.
    start_end: u64,
    out: VecDeque<MasterTransmit>,
    newer_epoch: Option<Epoch>,
    /// The log's first offset (retention deletes segments below it).
    log_start: u64,
}

impl Master {
    /// Becomes master of `epoch` over a log ending at `log_end` with `epochs`, with the
    /// controller's in-sync set and the group's other members. Records `(epoch, log_end)`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: MasterConfig,
        group: String,
        me: BrokerId,
        epoch: Epoch,
        mut epochs: EpochCache,
        log_end: u64,
        in_sync: BTreeSet<BrokerId>,
        in_sync_epoch: Epoch,
        members: impl IntoIterator<Item = BrokerId>,
        now: Millis,
    ) -> Result<Self, EpochOrder> {
        epochs.push(epoch, log_end)?;
        let followers = members
            .into_iter()
            .filter(|b| *b != me)
            .map(|b| {
                (
                    b,
                    Follower {
                        acked: None,
                        next: log_end,
                        last_caught_up: now,
                        last_ack_at: now,
                        last_progress_at: now,
                        rewound_to: None,
                        last_sent_at: now,
                        greeted: false,
                        unreachable_since: None,
                        inflight: VecDeque::new(),
                    },
                )
            })
            .collect();
        let mut master = Self {
            cfg,
            group,
            me,
            epoch,
            epochs,
            log_end,
            in_sync,
            in_sync_epoch,
            proposal: None,
            followers,
            lease_until: 0,
            next_renew: now,
            granted_ms: 0,
            calls: BTreeMap::new(),
            next_call: 0,
            pending: VecDeque::new(),
            acked: VecDeque::new(),
            confirmed: 0,
            start_end: log_end,
            out: VecDeque::new(),
            newer_epoch: None,
            log_start: 0,
        };
        // Ask for a lease at once.
        master.advance(now);
        Ok(master)
    }

    /// Its master epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Its epoch entries (the new one included); to be persisted beside the log.
    pub fn epochs(&self) -> &EpochCache {
        &self.epochs
    }

    /// Its log end.
    pub fn log_end(&self) -> u64 {
        self.log_end
    }

    /// Everything below is on every in-sync member: consumers may see it.
    pub fn confirmed(&self) -> u64 {
        self.confirmed
    }

    /// The in-sync set as the controller last confirmed it, and its epoch.
    pub fn in_sync(&self) -> (&BTreeSet<BrokerId>, Epoch) {
        (&self.in_sync, self.in_sync_epoch)
    }

    /// Whether the lease holds at `now`.
    pub fn holds_lease(&self, now: Millis) -> bool {
        self.newer_epoch.is_none() && now < self.lease_until
    }

    /// A newer epoch this master learned of: it must step down and follow.
    pub fn stepped_down(&self) -> Option<Epoch> {
        self.newer_epoch
    }

    /// Replicas and the offset each acknowledged (`None`: not following this epoch yet).
    pub fn replica_offsets(&self) -> impl Iterator<Item = (BrokerId, Option<u64>)> + '_ {
        self.followers.iter().map(|(b, f)| (*b, f.acked))
    }

    /// Whether a write may be appended now.
    pub fn check_writable(&self, now: Millis) -> Result<(), WriteRefusal> {
        if self.newer_epoch.is_some() {
            return Err(WriteRefusal::NotMaster);
        }
        if !self.holds_lease(now) {
            return Err(WriteRefusal::LeaseExpired);
        }
        if self.cfg.ack == AckMode::InSyncSet && self.in_sync.len() < self.cfg.min_in_sync {
            return Err(WriteRefusal::InSyncReplicasNotEnough {
                have: self.in_sync.len(),
                need: self.cfg.min_in_sync,
            });
        }
        if self.pending.len() >= self.cfg.max_pending {
            return Err(WriteRefusal::Busy);
        }
        Ok(())
    }

    /// The log's first offset is now `start`: a replica whose log diverges or ends below it
    /// cannot be shipped what it lacks, and is told to restart its log at `start`.
    pub fn handle_log_start(&mut self, start: u64) {
        self.log_start = self.log_start.max(start);
    }

    /// The caller appended a write (after [`Self::check_writable`]); the log now ends at
    /// `end`. Its acknowledgement comes from [`Self::poll_ack`] with `ticket`.
    pub fn handle_appended(&mut self, now: Millis, ticket: u64, end: u64) {
        self.log_end = self.log_end.max(end);
        self.pending.push_back((ticket, end, now));
        self.advance(now);
    }

    /// A message from a replica.
    pub fn handle_message(&mut self, now: Millis, msg: ToMaster) {
        if msg.master_epoch() > self.epoch {
            self.step_down(msg.master_epoch());
            return;
        }
        if self.newer_epoch.is_some() {
            return;
        }
        let replica = msg.replica();
        let Some(f) = self.followers.get_mut(&replica) else {
            return;
        };
        f.unreachable_since = None;
        match msg {
            ToMaster::Handshake { end, epochs, .. } => {
                let to = self.epochs.divergence(self.log_end, &epochs, end);
                f.acked = None;
                f.inflight.clear();
                f.rewound_to = None;
                f.last_progress_at = now;
                f.last_sent_at = now;
                let msg = if to < self.log_start {
                    // The logs agree only below what this master still has.
                    f.next = self.log_start;
                    ToReplica::RestartAt {
                        master_epoch: self.epoch,
                        at: self.log_start,
                        for_end: end,
                    }
                } else {
                    f.next = to;
                    ToReplica::Truncate {
                        master_epoch: self.epoch,
                        to,
                        for_end: end,
                    }
                };
                self.out
                    .push_back(MasterTransmit::Replica { to: replica, msg });
            }
            ToMaster::CannotAppend { master_epoch, .. } => {
                if master_epoch == self.epoch {
                    // Nothing more is shipped to it until it handshakes again, and writes
                    // stop waiting for it, as for a replica that cannot be reached.
                    f.acked = None;
                    f.inflight.clear();
                    f.unreachable_since = Some(now);
                }
            }
            ToMaster::Ack {
                end, master_epoch, ..
            } => {
                if master_epoch != self.epoch || end > self.log_end {
                    // Sent before it followed this epoch, or from a log that has not been
                    // truncated to ours yet: says nothing about our log.
                    return;
                }
                // Every batch is acknowledged with the replica's log end, so while a window
                // is in flight most acks are below `next`. An ack that does not move the end
                // is what says a batch was lost or overtaken (the replica answers a gap with
                // its log end): ship again from there, once per point. A window lost whole
                // is shipped again after `resend_ms` without progress (see `ship`).
                f.last_ack_at = now;
                if f.acked.is_some_and(|a| end < a) {
                    // Overtaken by a later ack: a replica's log end only falls through a
                    // handshake, which resets `acked`.
                    return;
                }
                let progress = f.acked.is_none_or(|a| end > a);
                f.acked = Some(end);
                while f.inflight.front().is_some_and(|e| *e <= end) {
                    f.inflight.pop_front();
                }
                if progress {
                    f.last_progress_at = now;
                }
                if end > f.next {
                    f.next = end;
                } else if end < f.next && !progress && f.rewound_to != Some(end) {
                    f.next = end;
                    f.inflight.clear();
                    f.rewound_to = Some(end);
                }
                if end >= self.log_end {
                    f.last_caught_up = now;
                }
            }
        }
        self.advance(now);
    }

    /// The controller answered `call`.
    pub fn handle_controller_response(&mut self, now: Millis, call: u64, response: Response) {
        let Some(kind) = self.calls.remove(&call) else {
            return;
        };
        match (kind, response) {
            (
                Call::Lease { sent_at },
                Response::LeaseGranted {
                    master_epoch,
                    lease_ms,
                },
            ) if master_epoch == self.epoch => {
                self.lease_until = self.lease_until.max(sent_at + lease_ms);
                self.granted_ms = lease_ms;
                // The first renewal was scheduled before any lease length was known
                // (`renew_ms`): renew within a third of this lease, so that it never lapses
                // while the controller answers (a lapse re-registers this master under its own
                // id for a moment, and routes lose their master).
                let every = self.cfg.renew_ms.min((lease_ms / 3).max(1));
                self.next_renew = self.next_renew.min(sent_at + every);
            }
            (_, Response::Group(info)) => self.learn(&info),
            (_, Response::Refused(refusal)) => match refusal {
                Refusal::StaleMasterEpoch { current } if current > self.epoch => {
                    self.step_down(current)
                }
                Refusal::NotMaster => self.step_down(self.epoch + 1),
                Refusal::StaleInSyncEpoch { current } => {
                    // Only this master changes the set in its epoch, one proposal at a time:
                    // the epoch after the one the proposal was based on is that proposal.
                    if let Some(p) = self.proposal.take() {
                        if current == p.based_on + 1 && self.in_sync_epoch == p.based_on {
                            self.in_sync = p.set;
                            self.in_sync_epoch = current;
                        } else {
                            self.proposal = Some(p);
                        }
                    }
                }
                Refusal::InvalidInSyncSet if matches!(kind, Call::InSync) => {
                    self.proposal = None;
                }
                _ => {}
            },
            // NotLeader, Busy: the entry may still apply; the proposal stays counted and is
            // sent again.
            _ => {}
        }
        self.advance(now);
    }

    /// The group's metadata as the controller answered it (to a heartbeat or a call): a newer
    /// epoch or another master makes this one step down; a newer in-sync set is adopted;
    /// members that joined are followed.
    pub fn handle_group_info(&mut self, now: Millis, info: &GroupInfo) {
        self.learn(info);
        for b in info.members.keys() {
            if *b != self.me && !self.followers.contains_key(b) {
                self.followers.insert(
                    *b,
                    Follower {
                        acked: None,
                        next: self.log_end,
                        last_caught_up: now,
                        last_ack_at: now,
                        last_progress_at: now,
                        rewound_to: None,
                        last_sent_at: now,
                        greeted: false,
                        unreachable_since: None,
                        inflight: VecDeque::new(),
                    },
                );
            }
        }
        self.advance(now);
    }

    fn learn(&mut self, info: &GroupInfo) {
        if info.master_epoch > self.epoch {
            self.step_down(info.master_epoch);
            return;
        }
        if info.master_epoch < self.epoch {
            return;
        }
        if info.master != Some(self.me) {
            self.step_down(self.epoch + 1);
            return;
        }
        if info.in_sync_epoch > self.in_sync_epoch {
            self.in_sync.clone_from(&info.in_sync);
            self.in_sync_epoch = info.in_sync_epoch;
            if self
                .proposal
                .as_ref()
                .is_some_and(|p| p.based_on < info.in_sync_epoch)
            {
                self.proposal = None;
            }
        }
    }

    /// A call got no answer (the driver's timeout, or no voter answered as the leader);
    /// forget it. A proposal of the in-sync set stays counted (it may still apply) and is sent
    /// again. A lease renewal is asked again `renew_retry_ms` later.
    pub fn handle_controller_timeout(&mut self, now: Millis, call: u64) {
        if let Some(Call::Lease { .. }) = self.calls.remove(&call) {
            self.next_renew = self.next_renew.min(now + self.cfg.renew_retry_ms);
        }
        self.advance(now);
    }

    /// The driver shipped a batch to `to` from `start` ending at `end` rather than where the
    /// master asked: commit logs are shipped in whole records, so the driver moves a batch's
    /// end to a record boundary (down, or up when one record is larger than a batch) and says
    /// so before polling again. Records never span two epochs, so neither does the batch.
    pub fn handle_shipped(&mut self, to: BrokerId, start: u64, end: u64) {
        if let Some(f) = self.followers.get_mut(&to) {
            if f.acked.is_some() && start <= end && end <= self.log_end {
                f.next = end;
                if let Some(last) = f.inflight.back_mut() {
                    *last = end;
                }
            }
        }
    }

    /// The driver could not send to replica `to` (its connection was refused or failed): a
    /// hint that it is down, never evidence. An in-sync replica that is also behind the log
    /// end (writes wait for it) is proposed out of the in-sync set at once rather than after
    /// `max_lag_ms`; the controller's answer is what makes it count, as for any change of the
    /// set. Anything that comes from the replica clears the hint.
    pub fn handle_unreachable(&mut self, now: Millis, to: BrokerId) {
        if let Some(f) = self.followers.get_mut(&to) {
            f.unreachable_since.get_or_insert(now);
        }
        self.advance(now);
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Millis) {
        self.advance(now);
    }

    /// What to send next.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Millis) -> Option<MasterTransmit> {
        if self.out.is_empty() {
            self.ship(now);
        }
        self.out.pop_front()
    }

    /// The next write acknowledged (or failed).
    #[must_use]
    pub fn poll_ack(&mut self) -> Option<Acked> {
        self.acked.pop_front()
    }

    /// When to call [`Self::handle_timeout`] next.
    #[must_use]
    pub fn poll_timeout(&self) -> Millis {
        let mut t = self.next_renew;
        for f in self.followers.values() {
            if f.greeted {
                t = t.min(f.last_sent_at + self.cfg.heartbeat_ms);
            } else {
                t = t.min(f.last_sent_at);
            }
            if f.acked.is_some_and(|a| a < f.next) {
                t = t.min(f.last_progress_at + self.cfg.resend_ms);
            }
        }
        if let Some((_, _, at)) = self.pending.front() {
            t = t.min(at + self.cfg.ack_timeout_ms);
            if self.lease_until > 0 {
                t = t.min(self.lease_until);
            }
        }
        t
    }

    /// Takes the writes still waiting, without an answer (the caller answers them).
    pub fn drain_pending(&mut self, into: &mut Vec<u64>) {
        into.extend(self.pending.drain(..).map(|(ticket, _, _)| ticket));
    }

    fn step_down(&mut self, newer: Epoch) {
        if self.newer_epoch.is_none() {
            self.newer_epoch = Some(newer);
            for (ticket, _, _) in self.pending.drain(..) {
                self.acked.push_back(Acked {
                    ticket,
                    epoch: self.epoch,
                    result: Err(WriteRefusal::NotMaster),
                });
            }
        }
    }

    /// The members whose acks a write needs: the set and any proposal in flight.
    fn ack_set(&self) -> BTreeSet<BrokerId> {
        let mut set = self.in_sync.clone();
        if let Some(p) = &self.proposal {
            set.extend(p.set.iter().copied());
        }
        set
    }

    fn acked_by(&self, b: BrokerId) -> u64 {
        if b == self.me {
            self.log_end
        } else {
            self.followers.get(&b).and_then(|f| f.acked).unwrap_or(0)
        }
    }

    fn advance(&mut self, now: Millis) {
        if self.newer_epoch.is_some() {
            return;
        }
        let set = self.ack_set();
        let replicated = set
            .iter()
            .map(|b| self.acked_by(*b))
            .min()
            .unwrap_or(self.log_end);
        self.confirmed = self.confirmed.max(replicated.min(self.log_end));
        let ack_to = match self.cfg.ack {
            AckMode::InSyncSet => replicated,
            AckMode::Master => self.log_end,
        };
        let lease = self.holds_lease(now);
        while let Some(&(ticket, end, at)) = self.pending.front() {
            if lease && end <= ack_to {
                self.acked.push_back(Acked {
                    ticket,
                    epoch: self.epoch,
                    result: Ok(()),
                });
            } else if now >= at + self.cfg.ack_timeout_ms {
                self.acked.push_back(Acked {
                    ticket,
                    epoch: self.epoch,
                    result: Err(WriteRefusal::Timeout),
                });
            } else {
                break;
            }
            self.pending.pop_front();
        }
        // Lease renewal.
        if now >= self.next_renew {
            let every = match self.granted_ms {
                0 => self.cfg.renew_ms,
                lease => self.cfg.renew_ms.min((lease / 3).max(1)),
            };
            self.next_renew = now + every;
            let call = self.call(Call::Lease { sent_at: now });
            self.out.push_back(MasterTransmit::Controller {
                call,
                req: Request::RenewLease {
                    group: self.group.clone(),
                    broker_id: self.me,
                    master_epoch: self.epoch,
                },
            });
        }
        // In-sync set changes: one proposal at a time, sent again until it is known applied
        // or refused.
        if let Some(p) = &self.proposal {
            if now >= p.sent_at + self.cfg.resend_ms {
                let set = p.set.clone();
                let based_on = p.based_on;
                self.propose(now, set, based_on);
            }
            return;
        }
        let mut next = self.in_sync.clone();
        for (b, f) in &self.followers {
            let in_set = self.in_sync.contains(b);
            let behind = f.acked.is_none_or(|a| a < self.log_end);
            if in_set
                && (now >= f.last_caught_up + self.cfg.max_lag_ms
                    || (f.unreachable_since.is_some() && behind))
            {
                next.remove(b);
            } else if !in_set
                && f.unreachable_since.is_none()
                && f.acked
                    .is_some_and(|a| a >= self.confirmed.max(self.start_end))
                && now < f.last_ack_at + self.cfg.max_lag_ms
            {
                next.insert(*b);
            }
        }
        if next != self.in_sync {
            let based_on = self.in_sync_epoch;
            self.propose(now, next, based_on);
        }
    }

    fn propose(&mut self, now: Millis, set: BTreeSet<BrokerId>, based_on: Epoch) {
        let call = self.call(Call::InSync);
        self.out.push_back(MasterTransmit::Controller {
            call,
            req: Request::AlterInSyncSet {
                group: self.group.clone(),
                master: self.me,
                master_epoch: self.epoch,
                in_sync_epoch: based_on,
                in_sync: set.clone(),
            },
        });
        self.proposal = Some(Proposal {
            set,
            based_on,
            sent_at: now,
        });
    }

    fn call(&mut self, kind: Call) -> u64 {
        self.next_call += 1;
        // Bounded: an unanswered call older than the newest 16 can only be a lost one.
        while self.calls.len() >= 16 {
            self.calls.pop_first();
        }
        self.calls.insert(self.next_call, kind);
        self.next_call
    }

    fn ship(&mut self, now: Millis) {
        if self.newer_epoch.is_some() {
            return;
        }
        for (b, f) in self.followers.iter_mut() {
            // Bytes only to a replica that acknowledged in this epoch; heartbeats to all, so
            // one whose acknowledgement was lost says again where its log ends.
            if let Some(acked) = f.acked {
                if acked < f.next && now >= f.last_progress_at + self.cfg.resend_ms {
                    f.next = acked;
                    f.inflight.clear();
                    f.last_progress_at = now;
                    f.rewound_to = Some(acked);
                }
                if f.next < self.log_start {
                    // Retention deleted what it still lacks: it starts its log afresh at our
                    // first offset, and acknowledges from there.
                    f.acked = None;
                    f.next = self.log_start;
                    f.inflight.clear();
                    f.rewound_to = None;
                    f.last_progress_at = now;
                    f.last_sent_at = now;
                    self.out.push_back(MasterTransmit::Replica {
                        to: *b,
                        msg: ToReplica::RestartAt {
                            master_epoch: self.epoch,
                            at: self.log_start,
                            for_end: acked,
                        },
                    });
                    return;
                }
                if f.next < self.log_end
                    && f.next.saturating_sub(acked) < self.cfg.max_inflight_bytes
                    && f.inflight.len() < self.cfg.max_inflight_batches.max(1)
                {
                    let start = f.next;
                    let mut end = self.log_end.min(start + self.cfg.batch_max_bytes);
                    if let Some(boundary) = self.epochs.epoch_boundary_after(start) {
                        end = end.min(boundary);
                    }
                    let batch_epoch = self.epochs.epoch_at(start).unwrap_or(self.epoch);
                    f.next = end;
                    f.inflight.push_back(end);
                    f.last_sent_at = now;
                    self.out.push_back(MasterTransmit::Replica {
                        to: *b,
                        msg: ToReplica::Batch(BatchHeader {
                            master_epoch: self.epoch,
                            batch_epoch,
                            start,
                            end,
                            confirmed: self.confirmed,
                        }),
                    });
                    return;
                }
            }
            if !f.greeted || now >= f.last_sent_at + self.cfg.heartbeat_ms {
                f.greeted = true;
                f.last_sent_at = now;
                self.out.push_back(MasterTransmit::Replica {
                    to: *b,
                    msg: ToReplica::Batch(BatchHeader {
                        master_epoch: self.epoch,
                        batch_epoch: self.epoch,
                        start: f.next,
                        end: f.next,
                        confirmed: self.confirmed,
                    }),
                });
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
