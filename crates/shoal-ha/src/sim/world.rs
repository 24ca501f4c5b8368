//! The simulated world: controller voters and brokers (the shipped state machines), their
//! disks and clocks, a network that delays, reorders, drops and partitions, a producer, and
//! the fault schedule. Invariants are checked after every event ([`super::invariants`]).

use super::invariants::Checker;
use super::report::{SimReport, Violation};
use super::schedule::{Fault, Node, Schedule, SimConfig};
use crate::controller::{
    ControllerConfig, ControllerNode, ControllerStorage, GroupNotices, Request, Response,
};
use crate::replication::{
    BatchVerdict, DiskState, EpochCache, MasterConfig, Member, MemberConfig, PeerMessage,
    ReplicaAction, Role, ToReplica, Transmit,
};
use crate::time::{LeaseTiming, Millis, MAX_CLOCK_DRIFT_PPM};
use crate::BrokerId;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};

/// The group's name in the simulation.
pub const GROUP: &str = "broker-a";
static NO_CHECKER: Checker = Checker::empty();

/// How often the world looks at every process's timers.
const TICK_MS: Millis = 5;
/// Messages take 1 to this many ms (so they reorder).
const MAX_DELAY_MS: Millis = 15;
/// Controller calls to one voter without an answer for this long: try the next voter.
const ROTATE_MS: Millis = 600;

/// The bytes of write `id`: distinct per write, so a misplaced or lost byte shows, and of
/// varying length (16 to 80 bytes) with the length first, as RocketMQ's stored records begin
/// with their total size.
pub fn record(id: u64) -> Vec<u8> {
    let len = 16 + (id.wrapping_mul(7) % 65) as usize;
    let mut r = Vec::with_capacity(len);
    r.extend_from_slice(&(len as u32).to_be_bytes());
    r.extend_from_slice(&id.to_be_bytes());
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    while r.len() < len {
        r.push((x >> 56) as u8);
        x = x.rotate_left(8) ^ 0x5A;
    }
    r
}

/// Where a batch from `start` (a record boundary) asked to end at `end` ends on whole records:
/// the last boundary at or before `end`, or the end of the first record when it is larger.
pub(crate) fn whole_records_end(log: &[u8], start: u64, end: u64) -> u64 {
    let mut pos = start as usize;
    loop {
        let Some(len) = log
            .get(pos..pos + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(|b| u32::from_be_bytes(b) as usize)
        else {
            return pos as u64;
        };
        if len == 0 || pos + len > log.len() {
            return pos as u64;
        }
        if (pos + len) as u64 > end && pos as u64 > start {
            return pos as u64;
        }
        pos += len;
        if pos as u64 >= end {
            return pos as u64;
        }
    }
}

#[derive(Debug)]
pub(crate) enum Msg {
    Raft(Box<raft::eraftpb::Message>),
    Request {
        token: u64,
        req: Request,
    },
    Response {
        call: u64,
        resp: Response,
    },
    Peer {
        from_id: BrokerId,
        msg: PeerMessage,
        bytes: Vec<u8>,
    },
    /// The broker's connection to this controller closed (it crashed, or a partition broke
    /// the connection while the broker lives on).
    Disconnected {
        broker_id: BrokerId,
    },
    /// The controller's leader says the broker's group changed (a hint).
    Notice,
}

#[derive(Debug)]
enum Event {
    Deliver { from: Node, to: Node, msg: Msg },
    Fault(Fault),
    Restart(Node),
    Resume(usize),
    Unblock(Node, Node),
    LossEnd,
    Write,
    Tick,
    Retention,
}

pub(crate) struct SimController {
    pub(crate) node: Option<ControllerNode>,
    storage: ControllerStorage,
    drift_ppm: i64,
    notices: GroupNotices,
}

/// A broker's disk: the commit log, its epoch entries, its id and token.
#[derive(Debug, Default)]
pub(crate) struct Disk {
    /// The log from offset 0; the bytes below `log_start` are gone (zeros).
    pub(crate) log: Vec<u8>,
    /// The first offset still held (retention deleted what was below).
    pub(crate) log_start: u64,
    epochs: EpochCache,
    pub(crate) broker_id: Option<BrokerId>,
    token: String,
}

pub(crate) struct SimBroker {
    pub(crate) member: Option<Member>,
    pub(crate) disk: Disk,
    drift_ppm: i64,
    paused_until: Option<Millis>,
    /// Its disk refuses appends until then.
    disk_full_until: Option<Millis>,
    deferred: Vec<(Node, Msg)>,
    leader_guess: usize,
    last_answer: Millis,
    last_rotate: Millis,
    incarnation: u64,
}

impl SimBroker {
    pub(crate) fn is_paused(&self) -> bool {
        self.paused_until.is_some()
    }
}

pub(crate) struct World {
    pub(crate) cfg: SimConfig,
    rng: ChaCha8Rng,
    pub(crate) now: Millis,
    seq: u64,
    events: BTreeMap<(Millis, u64), Box<Event>>,
    pub(crate) controllers: Vec<SimController>,
    pub(crate) brokers: Vec<SimBroker>,
    blocked: BTreeMap<(Node, Node), u32>,
    loss_percent: u32,
    pub(crate) ids: BTreeMap<BrokerId, usize>,
    pub(crate) lost_ids: BTreeSet<BrokerId>,
    next_write: u64,
    pub(crate) writes: BTreeMap<u64, (usize, u64, u64)>,
    check: Option<Box<Checker>>,
    pub(crate) report: SimReport,
    ccfg: ControllerConfig,
}

fn local(now: Millis, drift_ppm: i64) -> Millis {
    // Runs are minutes long at most: no overflow in i64.
    let now = now as i64;
    (now + now * drift_ppm / 1_000_000) as Millis
}

pub(crate) fn member_config(cfg: &SimConfig, index: usize, token: String) -> MemberConfig {
    MemberConfig {
        group: GROUP.into(),
        addr: format!("127.0.0.1:{}", 10_911 + index),
        token,
        heartbeat_ms: 200,
        call_timeout_ms: 300,
        resend_ms: 200,
        master: MasterConfig {
            ack: cfg.ack,
            min_in_sync: cfg.min_in_sync,
            batch_max_bytes: 100,
            max_inflight_bytes: 8_192,
            max_inflight_batches: 2,
            max_lag_ms: 600,
            heartbeat_ms: 100,
            resend_ms: 300,
            ack_timeout_ms: 1_000,
            renew_ms: 150,
            renew_retry_ms: 50,
            max_pending: 10_000,
        },
    }
}

/// The controller settings of the simulation: 50 ms ticks, 1 s sessions, a 600 ms lease and
/// an 800 ms election delay.
pub fn controller_config(id: u64, voters: Vec<u64>) -> ControllerConfig {
    let mut c = ControllerConfig::new(id, voters);
    c.tick_ms = 50;
    c.election_ticks = 10;
    c.heartbeat_ticks = 2;
    c.session_timeout_ms = 1_000;
    c.lease = LeaseTiming::new(600, 800).unwrap_or_default();
    // Compact often, so restarts and lagging voters go through snapshots.
    c.compact_every = 8;
    c
}

impl World {
    pub(crate) fn new(cfg: SimConfig, mut rng: ChaCha8Rng, schedule: &Schedule) -> Self {
        let drift = |rng: &mut ChaCha8Rng| {
            let d = MAX_CLOCK_DRIFT_PPM as i64;
            rng.gen_range(-d..=d)
        };
        let voters: Vec<u64> = (1..=cfg.controllers as u64).collect();
        let ccfg = controller_config(1, voters.clone());
        let controllers = voters
            .iter()
            .map(|id| {
                let storage = ControllerStorage::default();
                let mut c = ccfg.clone();
                c.id = *id;
                let node = ControllerNode::new(c, storage.clone(), 0).ok();
                SimController {
                    node,
                    storage,
                    drift_ppm: drift(&mut rng),
                    notices: GroupNotices::new(),
                }
            })
            .collect();
        let brokers = (0..cfg.brokers)
            .map(|i| {
                let disk = Disk {
                    token: format!("b{i}-0"),
                    ..Disk::default()
                };
                let member = Member::new(
                    member_config(&cfg, i, disk.token.clone()),
                    DiskState::default(),
                    0,
                );
                SimBroker {
                    member: Some(member),
                    disk,
                    drift_ppm: drift(&mut rng),
                    paused_until: None,
                    disk_full_until: None,
                    deferred: Vec::new(),
                    leader_guess: i % cfg.controllers,
                    last_answer: 0,
                    last_rotate: 0,
                    incarnation: 0,
                }
            })
            .collect();
        let mut w = Self {
            check: Some(Box::new(Checker::new(&cfg))),
            report: SimReport {
                seed: cfg.seed,
                faults: schedule.faults.len(),
                ..SimReport::default()
            },
            cfg,
            rng,
            now: 0,
            seq: 0,
            events: BTreeMap::new(),
            controllers,
            brokers,
            blocked: BTreeMap::new(),
            loss_percent: 0,
            ids: BTreeMap::new(),
            lost_ids: BTreeSet::new(),
            next_write: 0,
            writes: BTreeMap::new(),
            ccfg,
        };
        for (at, f) in &schedule.faults {
            w.at(*at, Event::Fault(f.clone()));
        }
        w.at(0, Event::Tick);
        w.at(500, Event::Write);
        if let Some(every) = w.cfg.retention_every_ms {
            w.at(every, Event::Retention);
        }
        w
    }

    /// The checker, with read access to the world.
    fn with_check(&mut self, f: impl FnOnce(&mut Checker, &World)) {
        if let Some(mut c) = self.check.take() {
            f(&mut c, self);
            self.check = Some(c);
        }
    }

    /// The checker's findings.
    pub(crate) fn checker(&self) -> &Checker {
        self.check.as_deref().unwrap_or(&NO_CHECKER)
    }

    /// The checker, to take its findings at the end.
    pub(crate) fn checker_mut(&mut self) -> &mut Checker {
        self.check.get_or_insert_with(Box::default)
    }

    fn at(&mut self, at: Millis, e: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), Box::new(e));
    }

    pub(crate) fn local_of(&self, node: Node) -> Millis {
        match node {
            Node::Controller(i) => local(self.now, self.controllers[i].drift_ppm),
            Node::Broker(i) => local(self.now, self.brokers[i].drift_ppm),
            Node::Operator => self.now,
        }
    }

    /// Runs to `until`; false when a violation stopped it.
    pub(crate) fn run_until(&mut self, until: Millis) -> bool {
        while let Some(entry) = self.events.first_entry() {
            let (at, _) = *entry.key();
            if at > until {
                break;
            }
            let e = *entry.remove();
            self.now = at;
            self.report.steps += 1;
            if self.cfg.trace && !matches!(e, Event::Tick | Event::Write) {
                eprintln!("{at:>6} {e:?}");
            }
            self.step(e);
            self.with_check(|c, w| c.after_step(w));
            if !self.checker().violations.is_empty() {
                if self.cfg.trace {
                    eprintln!("{}", self.describe().replace("; ", "\n"));
                }
                return false;
            }
        }
        self.now = until;
        true
    }

    /// Ends every fault: partitions heal, losses stop, paused brokers resume and downed
    /// processes restart.
    pub(crate) fn heal(&mut self) {
        self.blocked.clear();
        self.loss_percent = 0;
        for i in 0..self.brokers.len() {
            if self.brokers[i].is_paused() {
                self.resume(i);
            }
            if self.brokers[i].member.is_none() {
                self.restart(Node::Broker(i));
            }
        }
        for i in 0..self.controllers.len() {
            if self.controllers[i].node.is_none() {
                self.restart(Node::Controller(i));
            }
        }
    }

    fn step(&mut self, e: Event) {
        match e {
            Event::Tick => {
                let until = self.now + TICK_MS;
                self.at(until, Event::Tick);
                for i in 0..self.controllers.len() {
                    let now = self.local_of(Node::Controller(i));
                    if let Some(n) = &mut self.controllers[i].node {
                        if now >= n.poll_timeout() {
                            n.handle_timeout(now);
                            self.flush_controller(i);
                        }
                    }
                }
                for i in 0..self.brokers.len() {
                    if self.brokers[i].is_paused() {
                        continue;
                    }
                    let now = self.local_of(Node::Broker(i));
                    if let Some(m) = &mut self.brokers[i].member {
                        if now >= m.poll_timeout() {
                            m.handle_timeout(now);
                            self.flush_broker(i);
                        }
                    }
                }
            }
            Event::Write => {
                let gap = self.rng.gen_range(1..=2 * self.cfg.write_every_ms);
                self.at(self.now + gap, Event::Write);
                self.write();
            }
            Event::Deliver { from, to, msg } => self.deliver(from, to, msg),
            Event::Fault(f) => self.fault(f),
            Event::Restart(node) => self.restart(node),
            Event::Resume(i) => self.resume(i),
            Event::Unblock(a, b) => {
                if let Some(n) = self.blocked.get_mut(&(a, b)) {
                    *n -= 1;
                    if *n == 0 {
                        self.blocked.remove(&(a, b));
                    }
                }
            }
            Event::LossEnd => self.loss_percent = 0,
            Event::Retention => {
                if let Some(every) = self.cfg.retention_every_ms {
                    self.at(self.now + every, Event::Retention);
                }
                for i in 0..self.brokers.len() {
                    self.retain(i);
                }
            }
        }
    }

    /// Broker `i`'s retention: its log below the last whole record it knows confirmed goes,
    /// as a broker's segments older than the retention time go (without regard to replicas).
    fn retain(&mut self, i: usize) {
        let b = &mut self.brokers[i];
        if b.is_paused() {
            return;
        }
        let Some(m) = &mut b.member else {
            return;
        };
        let confirmed = m.confirmed().min(b.disk.log.len() as u64);
        let mut start = b.disk.log_start;
        loop {
            let next = whole_records_end(&b.disk.log, start, start + 1);
            if next <= start || next > confirmed {
                break;
            }
            start = next;
        }
        if start > b.disk.log_start {
            let (from, to) = (b.disk.log_start as usize, start as usize);
            b.disk.log[from..to].fill(0);
            b.disk.log_start = start;
            m.handle_log_start(start);
        }
    }

    fn fault(&mut self, f: Fault) {
        match f {
            Fault::CrashBroker { broker, down_ms } => {
                if self.brokers[broker].member.is_some() {
                    self.crash_broker(broker);
                    self.at(self.now + down_ms, Event::Restart(Node::Broker(broker)));
                }
            }
            Fault::LoseDisk { broker, down_ms } => {
                let Some(id) = self.brokers[broker].disk.broker_id else {
                    return;
                };
                // One disk at a time, of a replica of a healthy group: every other broker up,
                // and in the in-sync set, no election under way. (Losing the disks of every
                // in-sync member loses data by definition; electing outside the set is not
                // supported.)
                let Some(view) = super::invariants::controller_view(self) else {
                    return;
                };
                let others_in_sync = self.brokers.iter().enumerate().all(|(j, b)| {
                    j == broker
                        || (b.member.is_some()
                            && !b.is_paused()
                            && b.disk
                                .broker_id
                                .is_some_and(|id| view.in_sync.contains(&id)))
                });
                let allowed = view.master.is_some()
                    && view.master != Some(id)
                    && view.fenced_epoch < view.master_epoch
                    && others_in_sync;
                if !allowed || self.brokers[broker].member.is_none() {
                    return;
                }
                self.crash_broker(broker);
                let b = &mut self.brokers[broker];
                b.incarnation += 1;
                b.disk = Disk {
                    token: format!("b{broker}-{}", b.incarnation),
                    ..Disk::default()
                };
                self.lost_ids.insert(id);
                self.at(self.now + down_ms, Event::Restart(Node::Broker(broker)));
            }
            Fault::DiskFull { broker, ms } => {
                let b = &mut self.brokers[broker];
                let until = b.disk_full_until.unwrap_or(0).max(self.now + ms);
                b.disk_full_until = Some(until);
            }
            Fault::PauseBroker { broker, ms } => {
                let b = &mut self.brokers[broker];
                if b.member.is_some() && b.paused_until.is_none() {
                    b.paused_until = Some(self.now + ms);
                    self.at(self.now + ms, Event::Resume(broker));
                }
            }
            Fault::CrashController {
                controller,
                down_ms,
            } => {
                if self.controllers[controller].node.take().is_some() {
                    self.at(
                        self.now + down_ms,
                        Event::Restart(Node::Controller(controller)),
                    );
                }
            }
            Fault::Partition {
                from,
                to,
                one_way,
                ms,
            } => {
                let mut pairs = vec![(from, to)];
                if !one_way {
                    pairs.push((to, from));
                }
                for (a, b) in pairs {
                    *self.blocked.entry((a, b)).or_default() += 1;
                    self.at(self.now + ms, Event::Unblock(a, b));
                    // A partition between a broker and a controller breaks their connection:
                    // the controller sees it closed although the broker lives on.
                    if let (Node::Broker(i), Node::Controller(_)) = (a, b) {
                        self.disconnected(i, b);
                    }
                }
            }
            Fault::Lossy { percent, ms } => {
                self.loss_percent = percent;
                self.at(self.now + ms, Event::LossEnd);
            }
            Fault::ManualElect { target } => {
                let target = target.and_then(|i| self.brokers[i].disk.broker_id);
                let to = self.rng.gen_range(0..self.controllers.len());
                self.send(
                    Node::Operator,
                    Node::Controller(to),
                    Msg::Request {
                        token: u64::MAX,
                        req: Request::ElectMaster {
                            group: GROUP.into(),
                            target,
                        },
                    },
                );
            }
        }
    }

    /// The controller `to` sees broker `i`'s connection close, after a network delay.
    fn disconnected(&mut self, i: usize, to: Node) {
        if let Some(broker_id) = self.brokers[i].disk.broker_id {
            let delay = self.rng.gen_range(1..=MAX_DELAY_MS);
            let msg = Msg::Disconnected { broker_id };
            let from = Node::Broker(i);
            self.at(self.now + delay, Event::Deliver { from, to, msg });
        }
    }

    fn crash_broker(&mut self, i: usize) {
        for c in 0..self.controllers.len() {
            self.disconnected(i, Node::Controller(c));
        }
        let b = &mut self.brokers[i];
        b.member = None;
        b.paused_until = None;
        b.deferred.clear();
        self.with_check(|c, _| c.broker_restarted(i));
    }

    fn restart(&mut self, node: Node) {
        match node {
            Node::Controller(i) => {
                if self.controllers[i].node.is_none() {
                    let mut c = self.ccfg.clone();
                    c.id = i as u64 + 1;
                    let now = self.local_of(node);
                    let storage = self.controllers[i].storage.clone();
                    self.controllers[i].node = ControllerNode::new(c, storage, now).ok();
                    self.controllers[i].notices = GroupNotices::new();
                    self.with_check(|c, _| c.controller_restarted(i));
                }
            }
            Node::Broker(i) => {
                if self.brokers[i].member.is_some() {
                    return;
                }
                let now = self.local_of(node);
                let b = &mut self.brokers[i];
                let disk = DiskState {
                    broker_id: b.disk.broker_id,
                    epochs: b.disk.epochs.clone(),
                    log_end: b.disk.log.len() as u64,
                };
                let cfg = member_config(&self.cfg, i, b.disk.token.clone());
                b.member = Some(Member::new(cfg, disk, now));
                self.with_check(|c, _| c.broker_restarted(i));
            }
            Node::Operator => {}
        }
    }

    fn resume(&mut self, i: usize) {
        let b = &mut self.brokers[i];
        if b.paused_until.take().is_none() {
            return;
        }
        let deferred = std::mem::take(&mut b.deferred);
        for (from, msg) in deferred {
            self.deliver(from, Node::Broker(i), msg);
        }
    }

    fn send(&mut self, from: Node, to: Node, msg: Msg) {
        if self.blocked.contains_key(&(from, to)) {
            return;
        }
        if self.loss_percent > 0 && self.rng.gen_range(0..100) < self.loss_percent {
            return;
        }
        let delay = self.rng.gen_range(1..=MAX_DELAY_MS);
        self.at(self.now + delay, Event::Deliver { from, to, msg });
    }

    fn deliver(&mut self, from: Node, to: Node, msg: Msg) {
        match to {
            Node::Operator => {}
            Node::Controller(i) => {
                let now = self.local_of(to);
                let Some(n) = &mut self.controllers[i].node else {
                    return;
                };
                match msg {
                    Msg::Raft(m) => n.handle_message(now, *m),
                    Msg::Request { token, req } => n.handle_request(now, token, req),
                    Msg::Disconnected { broker_id } => {
                        n.handle_broker_disconnected(now, GROUP, broker_id);
                    }
                    _ => return,
                }
                self.flush_controller(i);
            }
            Node::Broker(i) => {
                if self.brokers[i].member.is_none() {
                    return;
                }
                if self.brokers[i].is_paused() {
                    self.brokers[i].deferred.push((from, msg));
                    return;
                }
                let now = self.local_of(to);
                let b = &mut self.brokers[i];
                let Some(m) = &mut b.member else {
                    return;
                };
                match msg {
                    Msg::Response { call, resp } => {
                        b.last_answer = self.now;
                        if let Response::NotLeader { leader } = &resp {
                            b.leader_guess = match leader {
                                Some(id) => (*id as usize).saturating_sub(1),
                                None => (b.leader_guess + 1) % self.controllers.len(),
                            } % self.controllers.len();
                        }
                        m.handle_controller_response(now, call, resp);
                    }
                    Msg::Notice => m.handle_notice(now),
                    Msg::Peer {
                        from_id,
                        msg,
                        bytes,
                    } => {
                        if let BatchVerdict::Append { start, end } =
                            m.handle_peer(now, from_id, msg)
                        {
                            if b.disk_full_until.is_some_and(|t| self.now < t) {
                                m.handle_append_failed(now, b.disk.log.len() as u64);
                                self.flush_broker(i);
                                return;
                            }
                            if start != b.disk.log.len() as u64 || end - start != bytes.len() as u64
                            {
                                let v = Violation::InSyncLogDiverged {
                                    at: self.now,
                                    broker: i,
                                    offset: start,
                                };
                                self.with_check(|c, _| c.violations.push(v));
                                return;
                            }
                            b.disk.log.extend_from_slice(&bytes);
                        }
                    }
                    _ => return,
                }
                self.flush_broker(i);
            }
        }
    }

    fn flush_controller(&mut self, i: usize) {
        let from = Node::Controller(i);
        loop {
            let Some(n) = &mut self.controllers[i].node else {
                return;
            };
            if let Some(m) = n.poll_transmit() {
                let to = Node::Controller((m.to as usize).saturating_sub(1));
                self.send(from, to, Msg::Raft(Box::new(m)));
                continue;
            }
            if let Some((token, resp)) = n.poll_response() {
                if token == u64::MAX {
                    continue;
                }
                let broker = (token >> 32) as usize;
                let call = token & 0xFFFF_FFFF;
                if broker < self.brokers.len() {
                    self.send(from, Node::Broker(broker), Msg::Response { call, resp });
                }
                continue;
            }
            let c = &mut self.controllers[i];
            let Some(n) = &c.node else {
                return;
            };
            let notices = c.notices.poll(n);
            for notice in notices {
                for (id, _) in notice.to {
                    if let Some(&b) = self.ids.get(&id) {
                        self.send(from, Node::Broker(b), Msg::Notice);
                    }
                }
            }
            return;
        }
    }

    pub(crate) fn flush_broker(&mut self, i: usize) {
        let from = Node::Broker(i);
        let now = self.local_of(from);
        let down: Vec<bool> = self.brokers.iter().map(|b| b.member.is_none()).collect();
        loop {
            let b = &mut self.brokers[i];
            let Some(m) = &mut b.member else {
                return;
            };
            m.handle_log_start(b.disk.log_start);
            match m.poll_action() {
                Some(ReplicaAction::Truncate(to)) => {
                    let at = self.now;
                    self.with_check(|c, _| c.on_truncate(i, to, at));
                    let b = &mut self.brokers[i];
                    b.disk.log.truncate(to as usize);
                    // Below its start nothing stays (the driver restarts the log there).
                    b.disk.log_start = b.disk.log_start.min(to);
                    continue;
                }
                Some(ReplicaAction::RestartAt(start)) => {
                    let at = self.now;
                    self.with_check(|c, w| c.on_restart(w, i, start, at));
                    let b = &mut self.brokers[i];
                    b.disk.log = vec![0; start as usize];
                    b.disk.log_start = start;
                    continue;
                }
                None => {}
            }
            // Persist what the member wants durable before anything it sends.
            b.disk.epochs = m.epochs().clone();
            if b.disk.broker_id.is_none() {
                if let Some(id) = m.broker_id() {
                    b.disk.broker_id = Some(id);
                    self.ids.insert(id, i);
                }
            }
            if let Some(ack) = m.poll_ack() {
                self.with_check(|c, w| c.on_ack(w, i, ack));
                continue;
            }
            let Some(t) = m.poll_transmit(now) else {
                break;
            };
            match t {
                Transmit::Controller { call, req } => {
                    if self.now >= b.last_answer + ROTATE_MS
                        && self.now >= b.last_rotate + ROTATE_MS
                    {
                        b.leader_guess = (b.leader_guess + 1) % self.controllers.len();
                        b.last_rotate = self.now;
                    }
                    let to = Node::Controller(b.leader_guess);
                    let token = ((i as u64) << 32) | (call & 0xFFFF_FFFF);
                    self.send(from, to, Msg::Request { token, req });
                }
                Transmit::Peer { to, msg } => {
                    let Some(&j) = self.ids.get(&to) else {
                        continue;
                    };
                    if down[j] {
                        // Its port refuses the connection: what a broker's driver reports.
                        m.handle_peer_unreachable(now, to);
                        continue;
                    }
                    let Some(from_id) = b.disk.broker_id else {
                        continue;
                    };
                    let mut msg = msg;
                    let bytes = match &mut msg {
                        PeerMessage::ToReplica(ToReplica::Batch(h))
                            if h.start < b.disk.log_start =>
                        {
                            // Deleted: the driver's read fails and it sends nothing.
                            continue;
                        }
                        PeerMessage::ToReplica(ToReplica::Batch(h)) if h.start < h.end => {
                            // Whole records only, as a broker's driver ships them.
                            let end = whole_records_end(&b.disk.log, h.start, h.end);
                            if end != h.end {
                                h.end = end;
                                m.handle_shipped(to, h.start, end);
                            }
                            let (s, e) = (h.start as usize, h.end as usize);
                            match b.disk.log.get(s..e) {
                                Some(bytes) => bytes.to_vec(),
                                None => continue,
                            }
                        }
                        _ => Vec::new(),
                    };
                    self.send(
                        from,
                        Node::Broker(j),
                        Msg::Peer {
                            from_id,
                            msg,
                            bytes,
                        },
                    );
                }
            }
        }
        self.with_check(|c, w| c.after_broker(w, i));
    }

    fn write(&mut self) {
        let masters: Vec<usize> = (0..self.brokers.len())
            .filter(|&i| {
                let b = &self.brokers[i];
                !b.is_paused()
                    && matches!(b.member.as_ref().map(Member::role), Some(Role::Master(_)))
            })
            .collect();
        if masters.is_empty() {
            return;
        }
        let i = masters[self.rng.gen_range(0..masters.len())];
        let now = self.local_of(Node::Broker(i));
        self.report.writes.0 += 1;
        let b = &mut self.brokers[i];
        let Some(m) = &mut b.member else {
            return;
        };
        if m.check_writable(now).is_err() || b.disk_full_until.is_some_and(|t| self.now < t) {
            self.report.writes.3 += 1;
            return;
        }
        self.next_write += 1;
        let id = self.next_write;
        let start = b.disk.log.len() as u64;
        b.disk.log.extend_from_slice(&record(id));
        let end = b.disk.log.len() as u64;
        self.writes.insert(id, (i, start, end));
        self.report.writes.1 += 1;
        m.handle_appended(now, id, end);
        self.flush_broker(i);
    }

    /// The brokers' roles, for a stuck run's report.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!(
            "controller: {:?}; ",
            super::invariants::controller_view(self)
        );
        for (i, b) in self.brokers.iter().enumerate() {
            let role = match b.member.as_ref().map(Member::role) {
                None => "down".to_string(),
                Some(Role::Joining) => "joining".to_string(),
                Some(Role::Master(m)) => format!(
                    "master e{} lease {} isr {:?} {m:?}",
                    m.epoch(),
                    m.holds_lease(self.local_of(Node::Broker(i))),
                    m.in_sync()
                ),
                Some(Role::Replica(r)) => format!(
                    "replica e{} of {:?} following {}",
                    r.epoch(),
                    r.master(),
                    r.is_following()
                ),
            };
            s += &format!(
                "b{i} id {:?} log {} {role}; ",
                b.disk.broker_id,
                b.disk.log.len()
            );
        }
        s
    }
}
