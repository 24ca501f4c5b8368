//! One broker of a replicated group, sans-IO: its controller session (broker id, registration,
//! heartbeats) and its role, a [`Master`] or a [`Replica`], switched as the controller's
//! answers and the replicas' messages say. This is the whole of a broker's replication
//! decisions; its driver only moves bytes, messages and time.

use super::epoch::{EpochCache, EpochOrder};
use super::master::{Acked, Master, MasterConfig, MasterTransmit, WriteRefusal};
use super::message::{ToMaster, ToReplica};
use super::replica::{BatchVerdict, Replica, ReplicaAction};
use crate::controller::{GroupInfo, Request, Response};
use crate::time::Millis;
use crate::{BrokerId, Epoch};
use std::collections::{BTreeMap, VecDeque};

/// A message between two brokers of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerMessage {
    /// From a master.
    ToReplica(ToReplica),
    /// From a replica.
    ToMaster(ToMaster),
}

/// Something the member wants sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transmit {
    /// To the controller (its leader); answer with [`Member::handle_controller_response`] or
    /// [`Member::handle_controller_timeout`] and the same `call`.
    Controller {
        /// The member's handle for the call.
        call: u64,
        /// The request.
        req: Request,
    },
    /// To another broker of the group; the bytes of a batch's range go along.
    Peer {
        /// The broker.
        to: BrokerId,
        /// The message.
        msg: PeerMessage,
    },
}

/// A member's settings.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// The broker group (`brokerName`).
    pub group: String,
    /// This broker's address.
    pub addr: String,
    /// The nonce on this broker's disk it applies for its id with.
    pub token: String,
    /// Heartbeat to the controller this often.
    pub heartbeat_ms: Millis,
    /// A controller call without answer for this long has failed.
    pub call_timeout_ms: Millis,
    /// A handshake without answer is sent again after this.
    pub resend_ms: Millis,
    /// The master's settings, when it is master.
    pub master: MasterConfig,
}

/// What a broker's disk holds for replication, read at start.
#[derive(Debug, Clone, Default)]
pub struct DiskState {
    /// The broker id, once given.
    pub broker_id: Option<BrokerId>,
    /// The epoch entries.
    pub epochs: EpochCache,
    /// The commit log's end.
    pub log_end: u64,
}

/// A member's role now.
#[derive(Debug)]
pub enum Role {
    /// No id or no answer from the controller yet.
    Joining,
    /// Master of an epoch.
    Master(Box<Master>),
    /// Replica.
    Replica(Replica),
}

#[derive(Debug, Clone, Copy)]
enum CallKind {
    Apply,
    Register,
    Heartbeat,
    Master { call: u64, epoch: Epoch },
}

/// One broker of a replicated group.
#[derive(Debug)]
pub struct Member {
    cfg: MemberConfig,
    broker_id: Option<BrokerId>,
    role: Role,
    /// Epoch entries and log end while not master or replica.
    idle: (EpochCache, u64),
    registered: bool,
    next_heartbeat: Millis,
    /// The controller said the group changed while a session call was in flight: call again
    /// as soon as it is answered (its answer may predate the change).
    notice_pending: bool,
    calls: BTreeMap<u64, (CallKind, Millis)>,
    next_call: u64,
    out: VecDeque<Transmit>,
    acked: VecDeque<Acked>,
    known_epoch: Epoch,
}

impl Member {
    /// A member starting from `disk` at `now`.
    pub fn new(cfg: MemberConfig, disk: DiskState, now: Millis) -> Self {
        Self {
            cfg,
            broker_id: disk.broker_id,
            role: Role::Joining,
            known_epoch: disk.epochs.last_epoch(),
            idle: (disk.epochs, disk.log_end),
            registered: false,
            next_heartbeat: now,
            notice_pending: false,
            calls: BTreeMap::new(),
            next_call: 0,
            out: VecDeque::new(),
            acked: VecDeque::new(),
        }
    }

    /// Its broker id, once given (persist it beside the token).
    pub fn broker_id(&self) -> Option<BrokerId> {
        self.broker_id
    }

    /// Its role.
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The log end it knows.
    pub fn log_end(&self) -> u64 {
        match &self.role {
            Role::Master(m) => m.log_end(),
            Role::Replica(r) => r.log_end(),
            Role::Joining => self.idle.1,
        }
    }

    /// Its epoch entries (persist them beside the log after every change).
    pub fn epochs(&self) -> &EpochCache {
        match &self.role {
            Role::Master(m) => m.epochs(),
            Role::Replica(r) => r.epochs(),
            Role::Joining => &self.idle.0,
        }
    }

    /// What consumers of this broker may see: nothing above this offset.
    pub fn confirmed(&self) -> u64 {
        match &self.role {
            Role::Master(m) => m.confirmed(),
            Role::Replica(r) => r.confirmed(),
            Role::Joining => 0,
        }
    }

    /// The highest master epoch it knows.
    pub fn known_epoch(&self) -> Epoch {
        self.known_epoch
    }

    /// Whether a write may be appended now (only on a master holding its lease).
    pub fn check_writable(&self, now: Millis) -> Result<(), WriteRefusal> {
        match &self.role {
            Role::Master(m) => m.check_writable(now),
            _ => Err(WriteRefusal::NotMaster),
        }
    }

    /// The caller appended a write after [`Self::check_writable`]; the log ends at `end`.
    pub fn handle_appended(&mut self, now: Millis, ticket: u64, end: u64) {
        match &mut self.role {
            Role::Master(m) => m.handle_appended(now, ticket, end),
            _ => self.acked.push_back(Acked {
                ticket,
                epoch: self.known_epoch,
                result: Err(WriteRefusal::NotMaster),
            }),
        }
        self.settle(now);
    }

    /// The bytes of the last [`BatchVerdict::Append`] could not be appended; the log ends at
    /// `log_end` (see [`Replica::handle_append_failed`]).
    pub fn handle_append_failed(&mut self, now: Millis, log_end: u64) {
        if let Role::Replica(r) = &mut self.role {
            r.handle_append_failed(now, log_end);
        }
        self.settle(now);
    }

    /// A message from another broker of the group; for a batch, what to do with its bytes.
    pub fn handle_peer(&mut self, now: Millis, from: BrokerId, msg: PeerMessage) -> BatchVerdict {
        let verdict = match (&mut self.role, msg) {
            (Role::Master(m), PeerMessage::ToMaster(msg)) => {
                m.handle_message(now, msg);
                BatchVerdict::Ignore
            }
            (Role::Replica(r), PeerMessage::ToReplica(msg)) => r.handle_message(now, from, msg),
            (Role::Master(m), PeerMessage::ToReplica(msg)) => {
                // Another master: if its epoch is newer, this one is stale.
                let epoch = msg.master_epoch();
                if epoch > m.epoch() {
                    self.known_epoch = self.known_epoch.max(epoch);
                    let (epochs, end) = (m.epochs().clone(), m.log_end());
                    let mut r = Replica::new(
                        self.broker_id.unwrap_or(0),
                        epoch,
                        epochs,
                        end,
                        self.cfg.resend_ms,
                    );
                    let v = r.handle_message(now, from, msg);
                    self.fail_pending_of_master();
                    self.role = Role::Replica(r);
                    v
                } else {
                    BatchVerdict::Ignore
                }
            }
            _ => BatchVerdict::Ignore,
        };
        self.settle(now);
        verdict
    }

    /// The log's first offset is now `start` (retention deleted what was below it): a master
    /// tells a replica that needs bytes below it to restart its log there.
    pub fn handle_log_start(&mut self, start: u64) {
        if let Role::Master(m) = &mut self.role {
            m.handle_log_start(start);
        }
    }

    /// The driver shipped a batch to `to` as `[start, end)` rather than the range it was
    /// given (see [`Master::handle_shipped`]).
    pub fn handle_shipped(&mut self, to: BrokerId, start: u64, end: u64) {
        if let Role::Master(m) = &mut self.role {
            m.handle_shipped(to, start, end);
        }
    }

    /// The controller answered `call`.
    pub fn handle_controller_response(&mut self, now: Millis, call: u64, response: Response) {
        let Some((kind, _)) = self.calls.remove(&call) else {
            return;
        };
        match kind {
            CallKind::Apply => {
                if let Response::BrokerId(id) = response {
                    self.broker_id = Some(id);
                    self.next_heartbeat = now;
                }
            }
            CallKind::Register | CallKind::Heartbeat => {
                if std::mem::take(&mut self.notice_pending) {
                    self.next_heartbeat = now;
                }
                if let Response::Group(info) = response {
                    self.registered = true;
                    self.learn(now, &info);
                }
            }
            CallKind::Master { call, epoch } => {
                if let Role::Master(m) = &mut self.role {
                    if m.epoch() == epoch {
                        m.handle_controller_response(now, call, response);
                    }
                }
            }
        }
        self.settle(now);
    }

    /// The driver could not send to broker `to` (see [`Master::handle_unreachable`]).
    pub fn handle_peer_unreachable(&mut self, now: Millis, to: BrokerId) {
        if let Role::Master(m) = &mut self.role {
            m.handle_unreachable(now, to);
        }
        self.settle(now);
    }

    /// The controller says the group changed (an election, a new in-sync set: RocketMQ's
    /// NOTIFY_BROKER_ROLE_CHANGED). Only a hint, never evidence: the member asks the
    /// controller for the group at once (a heartbeat) instead of at its next interval, and
    /// acts on that answer. At most one session call is in flight, so notices cannot make it
    /// call more often than once per round trip.
    pub fn handle_notice(&mut self, now: Millis) {
        let in_flight = self
            .calls
            .values()
            .any(|(k, _)| !matches!(k, CallKind::Master { .. }));
        if in_flight {
            self.notice_pending = true;
        } else {
            self.next_heartbeat = now;
            self.handle_timeout(now);
        }
    }

    /// A controller call got no answer in time (or the driver could not send it).
    pub fn handle_controller_timeout(&mut self, now: Millis, call: u64) {
        if let Some((CallKind::Master { call, epoch }, _)) = self.calls.remove(&call) {
            if let Role::Master(m) = &mut self.role {
                if m.epoch() == epoch {
                    m.handle_controller_timeout(now, call);
                }
            }
        }
        self.settle(now);
    }

    /// Time passed.
    pub fn handle_timeout(&mut self, now: Millis) {
        let expired: Vec<u64> = self
            .calls
            .iter()
            .filter(|(_, (_, at))| now >= at + self.cfg.call_timeout_ms)
            .map(|(c, _)| *c)
            .collect();
        for call in expired {
            self.handle_controller_timeout(now, call);
        }
        match &mut self.role {
            Role::Master(m) => m.handle_timeout(now),
            Role::Replica(r) => r.handle_timeout(now),
            Role::Joining => {}
        }
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + self.cfg.heartbeat_ms;
            self.session_call(now);
        }
        self.settle(now);
    }

    /// When to call [`Self::handle_timeout`] next.
    #[must_use]
    pub fn poll_timeout(&self) -> Millis {
        let mut t = self.next_heartbeat;
        for (_, at) in self.calls.values() {
            t = t.min(at + self.cfg.call_timeout_ms);
        }
        match &self.role {
            Role::Master(m) => t = t.min(m.poll_timeout()),
            Role::Replica(r) => {
                if let Some(r) = r.poll_timeout() {
                    t = t.min(r);
                }
            }
            Role::Joining => {}
        }
        t
    }

    /// What to send next.
    #[must_use]
    pub fn poll_transmit(&mut self, now: Millis) -> Option<Transmit> {
        if let Some(t) = self.out.pop_front() {
            return Some(t);
        }
        match &mut self.role {
            Role::Master(m) => {
                let t = m.poll_transmit(now)?;
                let epoch = m.epoch();
                Some(match t {
                    MasterTransmit::Replica { to, msg } => Transmit::Peer {
                        to,
                        msg: PeerMessage::ToReplica(msg),
                    },
                    MasterTransmit::Controller { call, req } => {
                        let call = self.call(CallKind::Master { call, epoch }, now);
                        Transmit::Controller { call, req }
                    }
                })
            }
            Role::Replica(r) => {
                let (to, msg) = r.poll_transmit()?;
                Some(Transmit::Peer {
                    to,
                    msg: PeerMessage::ToMaster(msg),
                })
            }
            Role::Joining => None,
        }
    }

    /// What to do to the log before sending anything polled after it.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<ReplicaAction> {
        match &mut self.role {
            Role::Replica(r) => r.poll_action(),
            _ => None,
        }
    }

    /// The next write acknowledged (or failed).
    #[must_use]
    pub fn poll_ack(&mut self) -> Option<Acked> {
        if let Some(a) = self.acked.pop_front() {
            return Some(a);
        }
        match &mut self.role {
            Role::Master(m) => m.poll_ack(),
            _ => None,
        }
    }

    fn call(&mut self, kind: CallKind, now: Millis) -> u64 {
        self.next_call += 1;
        self.calls.insert(self.next_call, (kind, now));
        self.next_call
    }

    fn session_call(&mut self, now: Millis) {
        let group = self.cfg.group.clone();
        let (kind, req) = match self.broker_id {
            None => (
                CallKind::Apply,
                Request::ApplyBrokerId {
                    group,
                    addr: self.cfg.addr.clone(),
                    token: self.cfg.token.clone(),
                },
            ),
            Some(broker_id) if !self.registered => (
                CallKind::Register,
                Request::Register {
                    group,
                    broker_id,
                    addr: self.cfg.addr.clone(),
                },
            ),
            Some(broker_id) => (
                CallKind::Heartbeat,
                Request::Heartbeat {
                    group,
                    broker_id,
                    last_epoch: self.epochs().last_epoch(),
                    end_offset: self.log_end(),
                },
            ),
        };
        // One session call at a time; a lost one times out first.
        if self
            .calls
            .values()
            .any(|(k, _)| !matches!(k, CallKind::Master { .. }))
        {
            return;
        }
        let call = self.call(kind, now);
        self.out.push_back(Transmit::Controller { call, req });
    }

    /// The controller's view of the group: switch role if it says so.
    fn learn(&mut self, now: Millis, info: &GroupInfo) {
        let Some(me) = self.broker_id else {
            return;
        };
        if info.master_epoch < self.known_epoch {
            return;
        }
        self.known_epoch = info.master_epoch;
        let Some(master) = info.master else {
            return;
        };
        if master == me {
            if let Role::Master(m) = &mut self.role {
                if m.epoch() == info.master_epoch {
                    m.handle_group_info(now, info);
                    return;
                }
            }
            let (epochs, end) = self.take_log();
            match Master::new(
                self.cfg.master.clone(),
                self.cfg.group.clone(),
                me,
                info.master_epoch,
                epochs.clone(),
                end,
                info.in_sync.clone(),
                info.in_sync_epoch,
                info.members.keys().copied(),
                now,
            ) {
                Ok(m) => self.role = Role::Master(Box::new(m)),
                Err(EpochOrder { .. }) => {
                    // Our log has data of a newer epoch than we are made master of: cannot
                    // happen with one controller; stay out of the way.
                    self.idle = (epochs, end);
                    self.role = Role::Joining;
                }
            }
        } else {
            if let Role::Replica(r) = &mut self.role {
                r.handle_master(now, master, info.master_epoch);
                return;
            }
            let (epochs, end) = self.take_log();
            let mut r = Replica::new(me, info.master_epoch, epochs, end, self.cfg.resend_ms);
            r.handle_master(now, master, info.master_epoch);
            self.role = Role::Replica(r);
        }
    }

    /// Leaves the current role, failing a master's waiting writes; gives the log back.
    fn take_log(&mut self) -> (EpochCache, u64) {
        self.fail_pending_of_master();
        let role = std::mem::replace(&mut self.role, Role::Joining);
        match role {
            Role::Master(m) => (m.epochs().clone(), m.log_end()),
            Role::Replica(r) => (r.epochs().clone(), r.log_end()),
            Role::Joining => std::mem::take(&mut self.idle),
        }
    }

    fn fail_pending_of_master(&mut self) {
        if let Role::Master(m) = &mut self.role {
            while let Some(a) = m.poll_ack() {
                self.acked.push_back(a);
            }
            // The rest were not acknowledged: their fate is the new master's.
            let mut pending = Vec::new();
            m.drain_pending(&mut pending);
            let epoch = m.epoch();
            for ticket in pending {
                self.acked.push_back(Acked {
                    ticket,
                    epoch,
                    result: Err(WriteRefusal::NotMaster),
                });
            }
        }
    }

    /// A master that learned of a newer epoch becomes a replica of it.
    fn settle(&mut self, now: Millis) {
        let newer = match &self.role {
            Role::Master(m) => m.stepped_down(),
            _ => None,
        };
        if let Some(epoch) = newer {
            self.known_epoch = self.known_epoch.max(epoch);
            let (epochs, end) = self.take_log();
            let me = self.broker_id.unwrap_or(0);
            self.role = Role::Replica(Replica::new(me, epoch, epochs, end, self.cfg.resend_ms));
            // Learn the new master from the controller now rather than at the next beat.
            self.next_heartbeat = now;
        }
    }
}
