//! The simulated world: members (each a [`Rebalancer`] with the driver the client has), the
//! broker model, a network that delays, reorders and loses, and a virtual clock; the invariants
//! are checked at every delivery and commit.

use super::coordinated::Membership;
use super::model::{mq, Answer, BrokerModel, Outbox, Reply, Req, BROKER, GROUP, PULL_BATCH, TOPIC};
use super::{SimConfig, SimEvent, Violation};
use crate::rebalance::{Action, Handover, Lease, LockAnswer, Rebalancer, RebalancerConfig};
use crate::strategy_by_name;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use shoal_proto::MessageQueue;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::sync::Arc;

#[derive(Clone, Copy)]
pub(super) enum Kind {
    Fence,
    Other,
}

#[derive(Debug, Clone)]
pub(super) enum Ev {
    /// A request (or oneway, `req == None`) reaches the broker.
    ToBroker {
        conn: u64,
        member: usize,
        req: Option<u64>,
        body: Req,
        /// Coordinated mode: the member id and epoch the request carries.
        stamp: Option<(String, i32)>,
    },
    /// A connection's close reaches the broker.
    Closed {
        conn: u64,
    },
    /// Something reaches a member.
    ToMember {
        member: usize,
        msg: Inbound,
    },
    RpcTimeout {
        member: usize,
        req: u64,
    },
    ListenerDone {
        member: usize,
        queue: MessageQueue,
        token: u64,
    },
    HoldExpired {
        queue: MessageQueue,
        req: u64,
    },
    Resume {
        member: usize,
    },
    Produce,
    Housekeeping,
}

#[derive(Debug, Clone)]
pub(super) enum Inbound {
    Reply {
        req: u64,
        reply: Reply,
    },
    Notice,
    /// A membership notice with the member list and its version ([`SimConfig::extensions`]).
    Members(u64, Vec<String>),
    LockFreed(Vec<MessageQueue>),
    /// The coordinator has news for the member (GROUP_ASSIGNMENT_CHANGED).
    Assign,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Life {
    Alive,
    Paused,
    Leaving,
    Gone,
}

#[derive(Debug)]
pub(super) struct Runner {
    pub(super) token: u64,
    pub(super) lease_until: Option<u64>,
    pub(super) next_pull: i64,
    pub(super) delivered_next: i64,
    pub(super) cached: VecDeque<i64>,
    pub(super) pull_in_flight: bool,
    pub(super) in_flight: Option<i64>,
    pub(super) stopping: Option<bool>, // Some(true) = fence
}

#[derive(Debug, Clone)]
pub(super) enum Pending {
    Heartbeat {
        sent: u64,
    },
    View,
    Lock {
        queues: Vec<MessageQueue>,
        sent: u64,
    },
    Unlock(Vec<MessageQueue>),
    Offset(MessageQueue),
    Commit(MessageQueue),
    Pull {
        queue: MessageQueue,
        token: u64,
    },
    Unregister,
    GroupHeartbeat {
        epoch: i32,
    },
    GroupLeave,
}

#[derive(Debug)]
pub(super) struct Member {
    pub(super) id: String,
    pub(super) conn: u64,
    pub(super) rb: Rebalancer,
    pub(super) life: Life,
    pub(super) inbox: VecDeque<Inbound>,
    pub(super) runners: BTreeMap<MessageQueue, Runner>,
    pub(super) pending: BTreeMap<u64, Pending>,
    pub(super) next_heartbeat: u64,
    pub(super) next_persist: u64,
    pub(super) listener_ms: u64,
    /// Timers that fired while paused (they run on resume).
    pub(super) deferred: Vec<Ev>,
    pub(super) subscribed: bool,
    /// Coordinated mode: the membership of the coordinated group.
    pub(super) coord: Option<Membership>,
}

/// A pull held until a message arrives or it times out.
#[derive(Debug, Clone)]
pub(super) struct HeldPull {
    pub(super) conn: u64,
    pub(super) req: u64,
    pub(super) offset: i64,
}

pub(super) struct World {
    pub(super) cfg: SimConfig,
    pub(super) rng: ChaCha8Rng,
    pub(super) now: u64,
    pub(super) seq: u64,
    pub(super) heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    pub(super) events: Vec<Option<Ev>>,
    pub(super) broker: Box<dyn BrokerModel>,
    /// Pulls the broker holds.
    pub(super) held: BTreeMap<MessageQueue, Vec<HeldPull>>,
    pub(super) members: Vec<Member>,
    pub(super) next_conn: u64,
    pub(super) closed: BTreeSet<u64>,
    pub(super) next_req: u64,
    pub(super) next_token: u64,
    pub(super) lose_notices_until: u64,
    pub(super) faults: bool,
    pub(super) producing: bool,
    /// Deliveries per (queue id, offset).
    pub(super) deliveries: BTreeMap<(i32, i64), u32>,
    pub(super) violations: Vec<Violation>,
    pub(super) produced: u64,
}

impl World {
    pub(super) fn schedule(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Some(ev));
        self.heap
            .push(Reverse((at, self.seq, self.events.len() - 1)));
    }

    pub(super) fn delay(&mut self) -> u64 {
        self.rng.gen_range(1..=self.cfg.max_delay_ms.max(1))
    }

    pub(super) fn lost(&mut self) -> bool {
        self.faults && self.cfg.loss > 0.0 && self.rng.gen_bool(self.cfg.loss)
    }

    pub(super) fn trace(&self, what: impl FnOnce() -> String) {
        if self.cfg.trace {
            println!("{:>7} {}", self.now, what());
        }
    }

    // ---- members --------------------------------------------------------------------

    pub(super) fn add_member(&mut self) {
        let instance = (self.cfg.coordinated
            && self.cfg.static_share > 0.0
            && self.rng.gen_bool(self.cfg.static_share.min(1.0)))
        .then(|| format!("i{:02}", self.members.len()));
        self.add_member_with(instance);
    }

    /// A new member (coordinated mode: with this static instance id, if any).
    pub(super) fn add_member_with(&mut self, instance: Option<String>) {
        let idx = self.members.len();
        let id = format!("m{idx:02}");
        let strategy: Arc<dyn crate::AllocateStrategy> = match strategy_by_name(&self.cfg.strategy)
        {
            Ok(s) => Arc::from(s),
            Err(_) => return,
        };
        let mut rc = RebalancerConfig::new(GROUP, id.clone());
        rc.handover = self.cfg.handover;
        let mut rb = Rebalancer::new(rc, strategy);
        let coord = self.cfg.coordinated.then(|| {
            // As the client does before its first coordinator answer: hold nothing, fetch no
            // views (the group may be coordinated).
            rb.handle_rejoin(self.now);
            Membership::new(
                format!("{id}#1"),
                instance,
                self.now,
                self.cfg.heartbeat_ms,
                self.cfg.session_timeout_ms,
            )
        });
        self.next_conn += 1;
        self.members.push(Member {
            id,
            conn: self.next_conn,
            rb,
            life: Life::Alive,
            inbox: VecDeque::new(),
            runners: BTreeMap::new(),
            pending: BTreeMap::new(),
            next_heartbeat: self.now,
            next_persist: self.now + 1_000,
            listener_ms: 1,
            deferred: Vec::new(),
            subscribed: false,
            coord,
        });
        // As the client does: heartbeat first, subscribe once it was answered.
        self.send_heartbeat(idx);
    }

    pub(super) fn live(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|i| matches!(self.members[*i].life, Life::Alive | Life::Paused))
            .collect()
    }

    pub(super) fn request(&mut self, m: usize, body: Req, pending: Pending) {
        self.next_req += 1;
        let req = self.next_req;
        self.members[m].pending.insert(req, pending);
        let conn = self.members[m].conn;
        let timeout = self.now + self.cfg.rpc_timeout_ms;
        self.schedule(timeout, Ev::RpcTimeout { member: m, req });
        if self.lost() {
            return;
        }
        let at = self.now + self.delay();
        let stamp = self.members[m].coord.as_ref().and_then(Membership::stamp);
        self.schedule(
            at,
            Ev::ToBroker {
                conn,
                member: m,
                req: Some(req),
                body,
                stamp,
            },
        );
    }

    pub(super) fn oneway(&mut self, m: usize, body: Req) {
        if self.lost() {
            return;
        }
        let conn = self.members[m].conn;
        let at = self.now + self.delay();
        let stamp = self.members[m].coord.as_ref().and_then(Membership::stamp);
        self.schedule(
            at,
            Ev::ToBroker {
                conn,
                member: m,
                req: None,
                body,
                stamp,
            },
        );
    }

    pub(super) fn send_heartbeat(&mut self, m: usize) {
        let sent = self.now;
        self.members[m].next_heartbeat = self.now + self.cfg.heartbeat_ms;
        let session_timeout_ms = self.locks().then_some(self.cfg.session_timeout_ms);
        self.request(
            m,
            Req::Heartbeat { session_timeout_ms },
            Pending::Heartbeat { sent },
        );
    }

    pub(super) fn lease(&self, sent: u64, session: Option<u64>) -> Lease {
        let t = self.cfg.session_timeout_ms;
        Lease {
            until: sent + t,
            renew_at: sent + t * 2 / 3,
            session,
        }
    }

    pub(super) fn locks(&self) -> bool {
        self.cfg.handover == Handover::Locks
    }

    /// Executes the rebalancer's actions and moves the member's queues along.
    pub(super) fn pump(&mut self, m: usize) {
        if self.members[m].life == Life::Paused || self.members[m].life == Life::Gone {
            return;
        }
        loop {
            self.take_actions(m);
            if !self.run_queues(m) {
                break;
            }
        }
        self.publish_held(m);
    }

    pub(super) fn take_actions(&mut self, m: usize) {
        while let Some(action) = self.members[m].rb.poll_action() {
            self.trace(|| format!("{} {:?}", self.members[m].id, action));
            let action_kind = if matches!(action, Action::Fence { .. }) {
                Kind::Fence
            } else {
                Kind::Other
            };
            match action {
                Action::FetchView { .. } => self.request(m, Req::View, Pending::View),
                Action::Lock { queues, .. } => {
                    let sent = self.now;
                    self.request(m, Req::Lock(queues.clone()), Pending::Lock { queues, sent })
                }
                Action::QueryStartOffset { mq } => {
                    self.request(m, Req::QueryOffset(mq.clone()), Pending::Offset(mq))
                }
                Action::Start {
                    mq,
                    offset,
                    lease_until,
                } => {
                    self.next_token += 1;
                    let until = lease_until;
                    self.members[m].runners.insert(
                        mq,
                        Runner {
                            token: self.next_token,
                            lease_until: until,
                            next_pull: offset,
                            delivered_next: offset,
                            cached: VecDeque::new(),
                            pull_in_flight: false,
                            in_flight: None,
                            stopping: None,
                        },
                    );
                }
                Action::Lease { mq, until } => {
                    if let Some(r) = self.members[m].runners.get_mut(&mq) {
                        r.lease_until = Some(until);
                    }
                }
                Action::Stop { mq } | Action::Fence { mq } => {
                    let fence = matches!(action_kind, Kind::Fence);
                    if let Some(r) = self.members[m].runners.get_mut(&mq) {
                        r.stopping = Some(fence);
                        r.cached.clear();
                    } else {
                        let now = self.now;
                        self.members[m].rb.handle_drained(now, &mq, None);
                    }
                }
                Action::Commit { mq, offset, .. } => {
                    self.request(m, Req::Commit(mq.clone(), offset), Pending::Commit(mq))
                }
                Action::Unlock { queues, .. } => {
                    self.request(m, Req::Unlock(queues.clone()), Pending::Unlock(queues))
                }
                Action::CommitAndUnlock { mq, offset, .. } => self.request(
                    m,
                    Req::CommitUnlock(mq.clone(), offset),
                    Pending::Unlock(vec![mq]),
                ),
            }
        }
    }

    /// Pulls, deliveries and drains of one member; true when the rebalancer heard of a drain
    /// (it may have actions).
    pub(super) fn run_queues(&mut self, m: usize) -> bool {
        let now = self.now;
        let mut drained = Vec::new();
        let mut pulls = Vec::new();
        let mut deliver = Vec::new();
        for (q, r) in self.members[m].runners.iter_mut() {
            if let Some(fence) = r.stopping {
                if r.in_flight.is_none() {
                    drained.push((q.clone(), (!fence).then_some(r.delivered_next)));
                }
                continue;
            }
            if r.in_flight.is_none() && r.lease_until.is_none_or(|u| u > now) {
                if let Some(o) = r.cached.pop_front() {
                    r.in_flight = Some(o);
                    deliver.push((q.clone(), o, r.token));
                }
            }
            if !r.pull_in_flight && r.cached.len() < 8 {
                r.pull_in_flight = true;
                pulls.push((q.clone(), r.next_pull, r.token));
            }
        }
        let any_drained = !drained.is_empty();
        for (q, offset) in drained {
            self.members[m].runners.remove(&q);
            let t = now;
            self.members[m].rb.handle_drained(t, &q, offset);
        }
        for (q, o, token) in deliver {
            self.on_deliver(m, &q, o);
            let done = now + self.members[m].listener_ms;
            self.schedule(
                done,
                Ev::ListenerDone {
                    member: m,
                    queue: q,
                    token,
                },
            );
        }
        for (q, offset, token) in pulls {
            self.request(
                m,
                Req::Pull(q.clone(), offset),
                Pending::Pull { queue: q, token },
            );
        }
        any_drained
    }

    /// The exclusive-delivery invariant, at the moment member `m` hands `queue:offset` over.
    pub(super) fn on_deliver(&mut self, m: usize, queue: &MessageQueue, offset: i64) {
        *self.deliveries.entry((queue.queue_id, offset)).or_default() += 1;
        for (j, other) in self.members.iter().enumerate() {
            if j == m || other.life == Life::Gone {
                continue;
            }
            if let Some(r) = other.runners.get(queue) {
                if r.stopping.is_none() && r.lease_until.is_none_or(|u| u > self.now) {
                    self.violations.push(Violation::TwoDispatchers {
                        at: self.now,
                        queue: queue.queue_id,
                        member: self.members[m].id.clone(),
                        other: other.id.clone(),
                    });
                }
            }
        }
    }

    pub(super) fn member_timer(&mut self, m: usize) -> Option<u64> {
        let mem = &self.members[m];
        if mem.life != Life::Alive && mem.life != Life::Leaving {
            return None;
        }
        let mut t = mem.rb.poll_timeout();
        let mut take = |x: u64| t = Some(t.map_or(x, |t| t.min(x)));
        take(mem.next_heartbeat);
        if mem.life == Life::Alive {
            take(mem.next_persist);
        }
        if let Some(x) = self.membership_timer(m) {
            take(x);
        }
        // A lease running out must stop deliveries: wake at it.
        for r in mem.runners.values() {
            if r.stopping.is_none() && !r.cached.is_empty() && r.in_flight.is_none() {
                if let Some(u) = r.lease_until {
                    if u > self.now {
                        take(u);
                    }
                }
            }
        }
        t
    }

    pub(super) fn on_member_timer(&mut self, m: usize) {
        let now = self.now;
        if self.members[m].next_heartbeat <= now {
            self.send_heartbeat(m);
        }
        if self.members[m].life == Life::Alive && self.members[m].next_persist <= now {
            self.members[m].next_persist = now + 1_000;
            let commits: Vec<(MessageQueue, i64)> = self.members[m]
                .runners
                .iter()
                .filter(|(_, r)| r.stopping.is_none() && r.lease_until.is_none_or(|u| u > now))
                .map(|(q, r)| (q.clone(), r.in_flight.unwrap_or(r.delivered_next)))
                .collect();
            for (q, o) in commits {
                self.oneway(m, Req::Commit(q, o));
            }
        }
        self.on_membership_timer(m);
        let t = now;
        self.members[m].rb.handle_timeout(t);
        self.pump(m);
    }

    pub(super) fn on_inbound(&mut self, m: usize, msg: Inbound) {
        let t = self.now;
        match msg {
            Inbound::Notice => {
                // A member may have joined or left a group that runs classic: ask again.
                self.member_wake(m);
                self.members[m].rb.handle_notice(t)
            }
            Inbound::Members(version, members) => {
                self.member_wake(m);
                self.members[m]
                    .rb
                    .handle_members(t, BROKER, version, members)
            }
            Inbound::Assign => self.member_wake(m),
            Inbound::LockFreed(queues) => self.members[m].rb.handle_lock_freed(t, &queues),
            Inbound::Reply { req, reply } => {
                let Some(p) = self.members[m].pending.remove(&req) else {
                    return;
                };
                self.on_reply(m, p, Some(reply));
            }
        }
        self.pump(m);
    }

    /// An answer (or, with `None`, a timeout) of a pending request.
    pub(super) fn on_reply(&mut self, m: usize, p: Pending, reply: Option<Reply>) {
        let t = self.now;
        let locks = self.locks();
        match (p, reply) {
            (Pending::Heartbeat { sent }, Some(Reply::Heartbeat(session))) => {
                if !self.members[m].subscribed {
                    self.members[m].subscribed = true;
                    self.members[m].rb.handle_subscribe(t, TOPIC);
                }
                if locks {
                    let lease = self.lease(sent, Some(session));
                    self.members[m].rb.handle_lease(t, BROKER, lease);
                }
            }
            (Pending::View, Some(Reply::View(queues, members))) => {
                self.members[m].rb.handle_view(t, TOPIC, queues, members)
            }
            (Pending::View, _) => self.members[m].rb.handle_view_failed(t, TOPIC),
            (Pending::Lock { queues, sent }, Some(Reply::Lock(granted, session, committed))) => {
                let granted: BTreeSet<MessageQueue> = granted.into_iter().collect();
                let lease = self.lease(sent, session);
                let answer = LockAnswer {
                    granted,
                    lease: Some(lease),
                    notice_expected: session.is_some(),
                    committed,
                    commit_on_unlock: self.cfg.extensions && session.is_some(),
                };
                self.members[m].rb.handle_lock_answer(t, &queues, answer);
            }
            (Pending::Lock { queues, .. }, _) => {
                self.members[m]
                    .rb
                    .handle_lock_result(t, &queues, &BTreeSet::new(), None, false)
            }
            (Pending::Unlock(queues), r) => {
                for q in &queues {
                    self.members[m].rb.handle_unlocked(t, q, r.is_some());
                }
            }
            (Pending::Offset(q), Some(Reply::Offset(o))) => {
                self.members[m].rb.handle_start_offset(t, &q, Some(o))
            }
            (Pending::Offset(q), _) => self.members[m].rb.handle_start_offset(t, &q, None),
            (Pending::Commit(q), r) => {
                let ok = matches!(r, Some(Reply::Committed(true)));
                self.members[m].rb.handle_committed(t, &q, ok)
            }
            (Pending::Pull { queue, token }, r) => {
                if let Some(run) = self.members[m].runners.get_mut(&queue) {
                    if run.token == token {
                        run.pull_in_flight = false;
                        if let Some(Reply::Pull(msgs)) = r {
                            if run.stopping.is_none() {
                                if let Some(last) = msgs.last() {
                                    run.next_pull = last + 1;
                                }
                                run.cached.extend(msgs);
                            }
                        }
                    }
                }
            }
            (Pending::GroupHeartbeat { epoch }, r) => {
                let a = match r {
                    Some(Reply::Group(a)) => Some(a),
                    _ => None,
                };
                self.on_group_answer(m, epoch, a);
            }
            (Pending::Unregister | Pending::GroupLeave, _) => {}
            _ => {}
        }
    }

    // ---- the broker ----------------------------------------------------------------------

    pub(super) fn send_to_conn(&mut self, conn: u64, msg: Inbound, droppable: bool) {
        let Some(m) = self.members.iter().position(|x| x.conn == conn) else {
            return;
        };
        if self.members[m].life == Life::Gone {
            return;
        }
        if (droppable && self.faults && self.now < self.lose_notices_until) || self.lost() {
            return;
        }
        let at = self.now + self.delay();
        self.schedule(at, Ev::ToMember { member: m, msg });
    }

    pub(super) fn flush(&mut self, out: Outbox) {
        for (conn, list) in out.notify {
            let msg = match list {
                Some(l) => Inbound::Members(l.version, l.client_ids),
                None => Inbound::Notice,
            };
            self.send_to_conn(conn, msg, true);
        }
        for (conn, queues) in out.freed {
            self.send_to_conn(conn, Inbound::LockFreed(queues), true);
        }
        for conn in out.assign {
            self.send_to_conn(conn, Inbound::Assign, true);
        }
        self.check_coordinator();
    }

    pub(super) fn on_broker(
        &mut self,
        conn: u64,
        member: usize,
        req: Option<u64>,
        body: Req,
        stamp: Option<(String, i32)>,
    ) {
        let now = self.now;
        let mut out = Outbox::default();
        let client_id = self.members[member].id.clone();
        // Offsets never move back: the committed offset before and after a commit.
        let committing = match &body {
            Req::Commit(q, _) | Req::CommitUnlock(q, _) => {
                Some((q.clone(), self.broker.committed_offset(q)))
            }
            _ => None,
        };
        let answer = self
            .broker
            .handle(now, conn, &client_id, &body, stamp.as_ref(), &mut out);
        if let Some((q, Some(from))) = committing {
            if let Some(to) = self.broker.committed_offset(&q).filter(|to| *to < from) {
                self.violations.push(Violation::OffsetMovedBack {
                    at: now,
                    queue: q.queue_id,
                    from,
                    to,
                });
            }
        }
        let reply = match answer {
            Answer::Reply(r) => r,
            Answer::Hold => {
                if let (Some(req), Req::Pull(q, offset)) = (req, &body) {
                    self.held.entry(q.clone()).or_default().push(HeldPull {
                        conn,
                        req,
                        offset: *offset,
                    });
                    self.schedule(
                        now + 500,
                        Ev::HoldExpired {
                            queue: q.clone(),
                            req,
                        },
                    );
                }
                self.flush(out);
                return;
            }
        };
        self.flush(out);
        if let Some(req) = req {
            self.send_to_conn(conn, Inbound::Reply { req, reply }, false);
        }
    }

    pub(super) fn answer_held(&mut self, queue: &MessageQueue, only: Option<u64>) {
        let Some(list) = self.held.remove(queue) else {
            return;
        };
        let mut keep = Vec::new();
        for h in list {
            if only.is_some_and(|r| r != h.req) {
                keep.push(h);
                continue;
            }
            let msgs = self.broker.read(queue, h.offset, PULL_BATCH);
            if msgs.is_empty() && only.is_none() {
                keep.push(h);
                continue;
            }
            self.send_to_conn(
                h.conn,
                Inbound::Reply {
                    req: h.req,
                    reply: Reply::Pull(msgs),
                },
                false,
            );
        }
        if !keep.is_empty() {
            self.held.insert(queue.clone(), keep);
        }
    }

    pub(super) fn produce(&mut self) {
        let n = self.broker.queues().len() as i32;
        let i = self.rng.gen_range(0..n);
        self.broker.produce(self.now, i);
        let q = mq(i);
        self.produced += 1;
        self.answer_held(&q, None);
    }

    // ---- schedule events -------------------------------------------------------------------

    pub(super) fn pick(&self, who: usize) -> Option<usize> {
        let live: Vec<usize> = self
            .live()
            .into_iter()
            .filter(|i| self.members[*i].life == Life::Alive)
            .collect();
        (!live.is_empty()).then(|| live[who % live.len()])
    }

    pub(super) fn on_schedule(&mut self, ev: SimEvent) {
        self.trace(|| format!("== {ev:?}"));
        match ev {
            SimEvent::Join => self.add_member(),
            SimEvent::Leave(w) => {
                if let Some(m) = self.pick(w) {
                    if self.live().len() > 1 {
                        self.members[m].life = Life::Leaving;
                        let t = self.now;
                        self.members[m].rb.handle_shutdown(t);
                        self.pump(m);
                    }
                }
            }
            SimEvent::Kill(w) => {
                if let Some(m) = self.pick(w) {
                    if self.live().len() > 1 {
                        self.kill(m);
                    }
                }
            }
            SimEvent::Restart(w) => {
                if let Some(m) = self.pick(w) {
                    self.restart(m);
                }
            }
            SimEvent::Pause(w, d) => {
                if let Some(m) = self.pick(w) {
                    self.members[m].life = Life::Paused;
                    let until = (self.now + d).min(self.cfg.duration_ms);
                    self.schedule(until, Ev::Resume { member: m });
                }
            }
            SimEvent::LoseNotices(d) => self.lose_notices_until = self.now + d,
            SimEvent::SlowListener(w, ms) => {
                if let Some(m) = self.pick(w) {
                    self.members[m].listener_ms = ms;
                }
            }
            SimEvent::AddQueues(k) => {
                let mut out = Outbox::default();
                self.broker.add_queues(self.now, k, &mut out);
                self.flush(out);
            }
        }
    }

    pub(super) fn kill(&mut self, m: usize) {
        self.members[m].life = Life::Gone;
        self.members[m].runners.clear();
        let conn = self.members[m].conn;
        // After everything already sent on the connection (TCP keeps order).
        let at = self.now + self.cfg.max_delay_ms + 1;
        self.schedule(at, Ev::Closed { conn });
    }

    pub(super) fn step_leaving(&mut self) {
        for m in 0..self.members.len() {
            if self.members[m].life == Life::Leaving && self.members[m].rb.is_idle() {
                // Released everything: leave the coordinated group, unregister, close.
                self.send_group_leave(m);
                self.request(m, Req::Unregister, Pending::Unregister);
                self.members[m].life = Life::Gone;
                let conn = self.members[m].conn;
                let at = self.now + self.cfg.max_delay_ms + 1;
                self.schedule(at, Ev::Closed { conn });
            }
        }
    }

    pub(super) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::ToBroker {
                conn,
                member,
                req,
                body,
                stamp,
            } => {
                // Nothing arrives on a connection after its close.
                if !self.closed.contains(&conn) {
                    self.on_broker(conn, member, req, body, stamp);
                }
            }
            Ev::Closed { conn } => {
                self.closed.insert(conn);
                let mut out = Outbox::default();
                self.broker.connection_closed(self.now, conn, &mut out);
                self.flush(out);
            }
            Ev::ToMember { member, msg } => match self.members[member].life {
                Life::Gone => {}
                Life::Paused => self.members[member].inbox.push_back(msg),
                _ => self.on_inbound(member, msg),
            },
            Ev::RpcTimeout { member, req } => {
                if self.members[member].life == Life::Paused {
                    // Its timers fire when it resumes; the request may be answered before.
                    self.members[member]
                        .deferred
                        .push(Ev::RpcTimeout { member, req });
                    return;
                }
                if let Some(p) = self.members[member].pending.remove(&req) {
                    if self.members[member].life != Life::Gone {
                        self.on_reply(member, p, None);
                        self.pump(member);
                    }
                }
            }
            Ev::ListenerDone {
                member,
                queue,
                token,
            } => {
                if self.members[member].life == Life::Paused {
                    self.members[member].deferred.push(Ev::ListenerDone {
                        member,
                        queue,
                        token,
                    });
                    return;
                }
                if let Some(r) = self.members[member].runners.get_mut(&queue) {
                    if r.token == token {
                        if let Some(o) = r.in_flight.take() {
                            r.delivered_next = o + 1;
                        }
                    }
                }
                self.pump(member);
            }
            Ev::HoldExpired { queue, req } => self.answer_held(&queue, Some(req)),
            Ev::Resume { member } => {
                if self.members[member].life == Life::Paused {
                    self.members[member].life = Life::Alive;
                    // On resume, the process runs what queued up: either the inbox or its
                    // timers first.
                    if self.rng.gen_bool(0.5) {
                        self.run_queues(member);
                    }
                    while let Some(msg) = self.members[member].inbox.pop_front() {
                        self.on_inbound(member, msg);
                    }
                    for ev in std::mem::take(&mut self.members[member].deferred) {
                        self.schedule(self.now, ev);
                    }
                    self.on_member_timer(member);
                }
            }
            Ev::Produce => {
                if self.producing {
                    self.produce();
                    let next = self.now + self.cfg.produce_every_ms.max(1);
                    self.schedule(next, Ev::Produce);
                }
            }
            Ev::Housekeeping => {
                let mut out = Outbox::default();
                self.broker.tick(self.now, &mut out);
                self.flush(out);
                self.schedule(self.now + 250, Ev::Housekeeping);
            }
        }
    }

    pub(super) fn settled(&self) -> Result<(), Vec<i32>> {
        let mut bad = Vec::new();
        for q in self.broker.queues() {
            let owners = self
                .members
                .iter()
                .filter(|m| m.life == Life::Alive)
                .filter(|m| m.runners.get(&q).is_some_and(|r| r.stopping.is_none()))
                .count();
            if owners != 1 {
                bad.push(q.queue_id);
            }
        }
        let all_settled = self
            .members
            .iter()
            .filter(|m| m.life == Life::Alive)
            .all(|m| m.rb.is_settled());
        if bad.is_empty() && all_settled && self.coordinator_settled() {
            Ok(())
        } else {
            Err(bad)
        }
    }

    pub(super) fn all_delivered(&self) -> bool {
        self.deliveries.len() as u64 == self.produced
    }

    pub(super) fn missing(&self) -> Vec<(i32, i64)> {
        let mut out = Vec::new();
        for q in self.broker.queues() {
            for o in 0..self.broker.max_offset(&q) {
                if !self.deliveries.contains_key(&(q.queue_id, o)) {
                    out.push((q.queue_id, o));
                }
            }
        }
        out
    }
}
