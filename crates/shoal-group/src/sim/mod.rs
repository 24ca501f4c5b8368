//! A deterministic simulator of classic-mode rebalancing: N [`Rebalancer`]s, each with a small
//! driver that pulls, delivers to a listener, commits and heartbeats as `shoal-client` does,
//! against a simulated broker built from [`crate::membership`], [`crate::lock`] and an offset
//! table with the commit fence; a network that delays (so reorders) and drops; a virtual clock.
//!
//! A [`Schedule`] drawn from a seed joins, leaves (gracefully), kills and pauses members
//! (shorter and longer than the lease), loses notices, slows listeners and adds queues to the
//! topic while a producer writes steadily. At every delivery and commit the simulator checks:
//! - **exclusive delivery**: a member hands a message of a queue to its listener only while no
//!   other member may still do so for that queue (has it started, not stopped, with a lease
//!   valid at that instant, paused or not);
//! - **committed offsets never move backwards**;
//! - after the schedule (faults off, everyone resumed, production stopped): **every message is
//!   delivered at least once** and the group settles (each queue owned by one live member).
//!
//! **Coordinated mode** ([`SimConfig::coordinated`], `SimConfig::coordinated_for_seed`): the
//! broker also runs the sans-IO [`crate::coordinator::Coordinator`] and each member a
//! membership as `shoal-client` has (group heartbeats on notices, after releases and every
//! interval, reporting the queues held; the assignment as the rebalancer's target; fenced or
//! no answer for a session: drop everything and rejoin). Pulls, commits and locks carry the
//! member epoch and are fenced; unlocks are release evidence; half of the members are static
//! and schedules also restart members. On top of the checks above: the coordinator's own
//! invariants after every broker step, and at the end the coordinator is reconciled and every
//! live member owns exactly what it was assigned.
//!
//! Duplicates and the settle time are counted. The same seed always gives the same run
//! ([`run`] is a pure function of [`SimConfig`]), so a failing seed replays exactly.

mod broker;
mod coordinated;
mod model;

pub use broker::{coordinator_config, SimBroker};
pub use model::{
    mq, Answer, BrokerModel, GroupAnswer, MemberListNotice, Outbox, Reply, Req, BROKER, GROUP,
    PULL_BATCH, TOPIC,
};

use crate::rebalance::{Action, Handover, Lease, LockAnswer, Rebalancer, RebalancerConfig};
use crate::strategy_by_name;
use coordinated::Membership;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_proto::MessageQueue;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::fmt;
use std::sync::Arc;

#[derive(Clone, Copy)]
enum Kind {
    Fence,
    Other,
}

/// Steps after which a run is declared stuck (a livelock in the rebalancer or the driver).
pub const MAX_STEPS: u64 = 3_000_000;

/// Settings of one simulated run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Seed of everything random (schedule, delays, drops).
    pub seed: u64,
    /// How queues change hands (the simulator shows what [`Handover::Delay`] gets wrong).
    pub handover: Handover,
    /// Allocation strategy name.
    pub strategy: String,
    /// Session timeout of the members, ms (the lease of their locks).
    pub session_timeout_ms: u64,
    /// Heartbeat period, ms.
    pub heartbeat_ms: u64,
    /// How long the schedule runs, ms of virtual time.
    pub duration_ms: u64,
    /// After the schedule, how long the group may take to settle and deliver everything.
    pub drain_ms: u64,
    /// One message is produced every this many ms (to a random queue).
    pub produce_every_ms: u64,
    /// One-way network delay is uniform in 1..=this, ms.
    pub max_delay_ms: u64,
    /// A request or answer is lost with this probability (the request then times out).
    pub loss: f64,
    /// Request timeout, ms.
    pub rpc_timeout_ms: u64,
    /// Print every step.
    pub trace: bool,
    /// Coordinated mode: the members' targets come from a [`crate::coordinator::Coordinator`]
    /// in the simulated broker (group heartbeats, revoke-then-assign, unlock evidence,
    /// member-epoch fence, static members); `strategy` is the coordinator's assignor.
    pub coordinated: bool,
    /// Coordinated mode: the coordinator's rebalance timeout, ms (a member that does not
    /// release a revoked queue within it is fenced).
    pub rebalance_timeout_ms: u64,
    /// Coordinated mode: probability that a member has a static instance id.
    pub static_share: f64,
    /// Only graceful changes (joins, leaves, slow listeners, more queues; nothing lost on the
    /// network): no member may be fenced and no message delivered twice
    /// ([`Violation::NotGraceful`]).
    pub graceful: bool,
    /// The broker has Shoal's round-trip savings: lock grants carry the committed offsets,
    /// unlocks carry the final commit, membership notices carry the member list (with a
    /// version). Off: the plain protocol (as against Apache RocketMQ, with session locks).
    pub extensions: bool,
}

impl SimConfig {
    /// The settings CI uses for `seed`: hand-over by locks, AVG or BALANCED_STICKY by seed,
    /// a 3 s session, 15 s of schedule; the broker's round-trip savings
    /// ([`SimConfig::extensions`]) for half of the seeds (`seed / 2` odd).
    pub fn for_seed(seed: u64) -> Self {
        Self {
            seed,
            handover: Handover::Locks,
            strategy: if seed % 2 == 0 {
                "AVG"
            } else {
                "BALANCED_STICKY"
            }
            .into(),
            session_timeout_ms: 3_000,
            heartbeat_ms: 1_000,
            duration_ms: 15_000,
            drain_ms: 45_000,
            produce_every_ms: 20,
            max_delay_ms: 20,
            loss: 0.002,
            rpc_timeout_ms: 1_000,
            trace: false,
            coordinated: false,
            rebalance_timeout_ms: 5_000,
            static_share: 0.0,
            graceful: false,
            extensions: (seed / 2) % 2 == 1,
        }
    }

    /// The settings CI uses for coordinated mode and `seed`: the classic settings, with the
    /// coordinator's assignor STICKY, COOPERATIVE_STICKY, AVG or BALANCED_STICKY by seed, a
    /// 3 s session (the coordinator's and the locks'), 1 s heartbeats, a 5 s rebalance
    /// timeout, half of the members static; schedules also restart members.
    pub fn coordinated_for_seed(seed: u64) -> Self {
        Self {
            strategy: ["STICKY", "COOPERATIVE_STICKY", "AVG", "BALANCED_STICKY"]
                [(seed % 4) as usize]
                .into(),
            coordinated: true,
            static_share: 0.5,
            ..Self::for_seed(seed)
        }
    }

    /// Coordinated mode with graceful changes only (see [`SimConfig::graceful`]): messages
    /// are still delayed and reordered (a heartbeat built before an unlock may land after it),
    /// never lost.
    pub fn coordinated_graceful_for_seed(seed: u64) -> Self {
        Self {
            graceful: true,
            loss: 0.0,
            ..Self::coordinated_for_seed(seed)
        }
    }
}

/// A membership or fault event of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimEvent {
    /// A new member starts.
    Join,
    /// A member shuts down gracefully (index among the live members, modulo their number).
    Leave(usize),
    /// A member dies: connections dropped, nothing committed or released.
    Kill(usize),
    /// A member is frozen for this many ms with its connections open, then resumes.
    Pause(usize, u64),
    /// Notices (membership changes, lock-freed) are lost for this many ms.
    LoseNotices(u64),
    /// A member's listener takes this many ms per message from now on.
    SlowListener(usize, u64),
    /// The topic gets this many more queues.
    AddQueues(i32),
    /// A member's process dies and a new one starts at once with the same static instance id
    /// (coordinated mode; without an instance id it is a kill and a join).
    Restart(usize),
}

/// What a run does: initial group and timed events.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Queues of the topic at the start.
    pub queues: i32,
    /// Members at the start.
    pub members: usize,
    /// Events at virtual ms.
    pub events: Vec<(u64, SimEvent)>,
}

impl Schedule {
    /// A random schedule over `duration_ms`.
    pub fn random(rng: &mut impl Rng, duration_ms: u64, session_ms: u64) -> Self {
        let queues = rng.gen_range(2..=16);
        let members = rng.gen_range(1..=4);
        let n = rng.gen_range(3..=9);
        let mut events: Vec<(u64, SimEvent)> = (0..n)
            .map(|_| {
                let at = rng.gen_range(500..duration_ms.saturating_sub(1_000).max(501));
                let who = rng.gen_range(0..8);
                let ev = match rng.gen_range(0..100) {
                    0..=24 => SimEvent::Join,
                    25..=44 => SimEvent::Leave(who),
                    45..=54 => SimEvent::Kill(who),
                    55..=64 => SimEvent::Pause(who, rng.gen_range(100..session_ms * 2 / 3)),
                    65..=74 => {
                        SimEvent::Pause(who, rng.gen_range(session_ms + 500..session_ms * 3))
                    }
                    75..=84 => SimEvent::LoseNotices(rng.gen_range(200..3_000)),
                    85..=94 => SimEvent::SlowListener(who, rng.gen_range(20..400)),
                    _ => SimEvent::AddQueues(rng.gen_range(1..=4)),
                };
                (at, ev)
            })
            .collect();
        events.sort_by_key(|(t, _)| *t);
        Self {
            queues,
            members,
            events,
        }
    }

    /// A random schedule of graceful changes only: joins, leaves, slow listeners, more
    /// queues.
    pub fn random_graceful(rng: &mut impl Rng, duration_ms: u64) -> Self {
        let queues = rng.gen_range(2..=16);
        let members = rng.gen_range(1..=4);
        let n = rng.gen_range(3..=9);
        let mut events: Vec<(u64, SimEvent)> = (0..n)
            .map(|_| {
                let at = rng.gen_range(500..duration_ms.saturating_sub(1_000).max(501));
                let who = rng.gen_range(0..8);
                let ev = match rng.gen_range(0..100) {
                    0..=39 => SimEvent::Join,
                    40..=74 => SimEvent::Leave(who),
                    75..=89 => SimEvent::SlowListener(who, rng.gen_range(20..400)),
                    _ => SimEvent::AddQueues(rng.gen_range(1..=4)),
                };
                (at, ev)
            })
            .collect();
        events.sort_by_key(|(t, _)| *t);
        Self {
            queues,
            members,
            events,
        }
    }

    /// A random coordinated-mode schedule: [`Schedule::random`] plus up to two restarts.
    pub fn random_coordinated(rng: &mut impl Rng, duration_ms: u64, session_ms: u64) -> Self {
        let mut s = Self::random(rng, duration_ms, session_ms);
        for _ in 0..rng.gen_range(0..=2) {
            let at = rng.gen_range(500..duration_ms.saturating_sub(1_000).max(501));
            s.events.push((at, SimEvent::Restart(rng.gen_range(0..8))));
        }
        s.events.sort_by_key(|(t, _)| *t);
        s
    }
}

/// What went wrong in a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Two members could deliver one queue at the same instant.
    TwoDispatchers {
        /// Virtual ms.
        at: u64,
        /// The queue.
        queue: i32,
        /// The member delivering.
        member: String,
        /// The member that could still deliver.
        other: String,
    },
    /// A committed offset went down.
    OffsetMovedBack {
        /// Virtual ms.
        at: u64,
        /// The queue.
        queue: i32,
        /// Before.
        from: i64,
        /// After.
        to: i64,
    },
    /// Messages never delivered by the end of the drain.
    Lost {
        /// How many.
        count: u64,
        /// A few of them (queue, offset).
        examples: Vec<(i32, i64)>,
    },
    /// The run made no progress in virtual time (a livelock).
    Stuck {
        /// Virtual ms.
        at: u64,
    },
    /// The group did not settle by the end of the drain.
    NotSettled {
        /// Queues without a single live owner.
        queues: Vec<i32>,
    },
    /// A run of graceful changes only fenced a member or delivered a message twice.
    NotGraceful {
        /// Queues fenced (leases, locks) plus fences by the coordinator.
        fences: u64,
        /// Deliveries beyond the first.
        duplicates: u64,
    },
    /// The coordinator's own invariants broke (a queue in two members' sets).
    Coordinator {
        /// Virtual ms.
        at: u64,
        /// What broke.
        detail: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::TwoDispatchers {
                at,
                queue,
                member,
                other,
            } => write!(
                f,
                "at {at} ms {member} delivered queue {queue} while {other} still could"
            ),
            Violation::OffsetMovedBack {
                at,
                queue,
                from,
                to,
            } => {
                write!(
                    f,
                    "at {at} ms the offset of queue {queue} went from {from} to {to}"
                )
            }
            Violation::Lost { count, examples } => {
                write!(f, "{count} messages never delivered, e.g. {examples:?}")
            }
            Violation::Stuck { at } => write!(f, "stuck at {at} ms (no progress)"),
            Violation::NotSettled { queues } => {
                write!(f, "queues {queues:?} have no single live owner at the end (or the coordinator is not reconciled)")
            }
            Violation::NotGraceful { fences, duplicates } => write!(
                f,
                "graceful changes only, yet {fences} fences and {duplicates} duplicates"
            ),
            Violation::Coordinator { at, detail } => {
                write!(f, "at {at} ms the coordinator broke an invariant: {detail}")
            }
        }
    }
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// The schedule that ran.
    pub schedule: Schedule,
    /// Invariant violations (empty: all held).
    pub violations: Vec<Violation>,
    /// Messages produced.
    pub produced: u64,
    /// Deliveries to listeners.
    pub deliveries: u64,
    /// Deliveries beyond the first of a message.
    pub duplicates: u64,
    /// From the end of the schedule until the group settled with everything delivered, ms.
    pub settle_ms: Option<u64>,
    /// Queues fenced by lease expiry or lost locks, over all members.
    pub fenced: u64,
}

// ---- the world --------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Ev {
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
enum Inbound {
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
enum Life {
    Alive,
    Paused,
    Leaving,
    Gone,
}

#[derive(Debug)]
struct Runner {
    token: u64,
    lease_until: Option<u64>,
    next_pull: i64,
    delivered_next: i64,
    cached: VecDeque<i64>,
    pull_in_flight: bool,
    in_flight: Option<i64>,
    stopping: Option<bool>, // Some(true) = fence
}

#[derive(Debug, Clone)]
enum Pending {
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
struct Member {
    id: String,
    conn: u64,
    rb: Rebalancer,
    life: Life,
    inbox: VecDeque<Inbound>,
    runners: BTreeMap<MessageQueue, Runner>,
    pending: BTreeMap<u64, Pending>,
    next_heartbeat: u64,
    next_persist: u64,
    listener_ms: u64,
    /// Timers that fired while paused (they run on resume).
    deferred: Vec<Ev>,
    subscribed: bool,
    /// Coordinated mode: the membership of the coordinated group.
    coord: Option<Membership>,
}

/// A pull held until a message arrives or it times out.
#[derive(Debug, Clone)]
struct HeldPull {
    conn: u64,
    req: u64,
    offset: i64,
}

struct World {
    cfg: SimConfig,
    rng: ChaCha8Rng,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Ev>>,
    broker: Box<dyn BrokerModel>,
    /// Pulls the broker holds.
    held: BTreeMap<MessageQueue, Vec<HeldPull>>,
    members: Vec<Member>,
    next_conn: u64,
    closed: BTreeSet<u64>,
    next_req: u64,
    next_token: u64,
    lose_notices_until: u64,
    faults: bool,
    producing: bool,
    /// Deliveries per (queue id, offset).
    deliveries: BTreeMap<(i32, i64), u32>,
    violations: Vec<Violation>,
    produced: u64,
}

impl World {
    fn schedule(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Some(ev));
        self.heap
            .push(Reverse((at, self.seq, self.events.len() - 1)));
    }

    fn delay(&mut self) -> u64 {
        self.rng.gen_range(1..=self.cfg.max_delay_ms.max(1))
    }

    fn lost(&mut self) -> bool {
        self.faults && self.cfg.loss > 0.0 && self.rng.gen_bool(self.cfg.loss)
    }

    fn trace(&self, what: impl FnOnce() -> String) {
        if self.cfg.trace {
            println!("{:>7} {}", self.now, what());
        }
    }

    // ---- members --------------------------------------------------------------------

    fn add_member(&mut self) {
        let instance = (self.cfg.coordinated
            && self.cfg.static_share > 0.0
            && self.rng.gen_bool(self.cfg.static_share.min(1.0)))
        .then(|| format!("i{:02}", self.members.len()));
        self.add_member_with(instance);
    }

    /// A new member (coordinated mode: with this static instance id, if any).
    fn add_member_with(&mut self, instance: Option<String>) {
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

    fn live(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|i| matches!(self.members[*i].life, Life::Alive | Life::Paused))
            .collect()
    }

    fn request(&mut self, m: usize, body: Req, pending: Pending) {
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

    fn oneway(&mut self, m: usize, body: Req) {
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

    fn send_heartbeat(&mut self, m: usize) {
        let sent = self.now;
        self.members[m].next_heartbeat = self.now + self.cfg.heartbeat_ms;
        let session_timeout_ms = self.locks().then_some(self.cfg.session_timeout_ms);
        self.request(
            m,
            Req::Heartbeat { session_timeout_ms },
            Pending::Heartbeat { sent },
        );
    }

    fn lease(&self, sent: u64, session: Option<u64>) -> Lease {
        let t = self.cfg.session_timeout_ms;
        Lease {
            until: sent + t,
            renew_at: sent + t * 2 / 3,
            session,
        }
    }

    fn locks(&self) -> bool {
        self.cfg.handover == Handover::Locks
    }

    /// Executes the rebalancer's actions and moves the member's queues along.
    fn pump(&mut self, m: usize) {
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

    fn take_actions(&mut self, m: usize) {
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
    fn run_queues(&mut self, m: usize) -> bool {
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
    fn on_deliver(&mut self, m: usize, queue: &MessageQueue, offset: i64) {
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

    fn member_timer(&mut self, m: usize) -> Option<u64> {
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

    fn on_member_timer(&mut self, m: usize) {
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

    fn on_inbound(&mut self, m: usize, msg: Inbound) {
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
    fn on_reply(&mut self, m: usize, p: Pending, reply: Option<Reply>) {
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

    fn send_to_conn(&mut self, conn: u64, msg: Inbound, droppable: bool) {
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

    fn flush(&mut self, out: Outbox) {
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

    fn on_broker(
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

    fn answer_held(&mut self, queue: &MessageQueue, only: Option<u64>) {
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

    fn produce(&mut self) {
        let n = self.broker.queues().len() as i32;
        let i = self.rng.gen_range(0..n);
        self.broker.produce(self.now, i);
        let q = mq(i);
        self.produced += 1;
        self.answer_held(&q, None);
    }

    // ---- schedule events -------------------------------------------------------------------

    fn pick(&self, who: usize) -> Option<usize> {
        let live: Vec<usize> = self
            .live()
            .into_iter()
            .filter(|i| self.members[*i].life == Life::Alive)
            .collect();
        (!live.is_empty()).then(|| live[who % live.len()])
    }

    fn on_schedule(&mut self, ev: SimEvent) {
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

    fn kill(&mut self, m: usize) {
        self.members[m].life = Life::Gone;
        self.members[m].runners.clear();
        let conn = self.members[m].conn;
        // After everything already sent on the connection (TCP keeps order).
        let at = self.now + self.cfg.max_delay_ms + 1;
        self.schedule(at, Ev::Closed { conn });
    }

    fn step_leaving(&mut self) {
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

    fn handle(&mut self, ev: Ev) {
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

    fn settled(&self) -> Result<(), Vec<i32>> {
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

    fn all_delivered(&self) -> bool {
        self.deliveries.len() as u64 == self.produced
    }

    fn missing(&self) -> Vec<(i32, i64)> {
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

/// Runs one schedule; a pure function of `cfg` (same seed, same run).
pub fn run(cfg: &SimConfig) -> SimReport {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let schedule = schedule_for(cfg, &mut rng);
    run_schedule(cfg, schedule, rng)
}

/// The schedule a seeded run follows.
fn schedule_for(cfg: &SimConfig, rng: &mut ChaCha8Rng) -> Schedule {
    if cfg.graceful {
        Schedule::random_graceful(rng, cfg.duration_ms)
    } else if cfg.coordinated {
        Schedule::random_coordinated(rng, cfg.duration_ms, cfg.session_timeout_ms)
    } else {
        Schedule::random(rng, cfg.duration_ms, cfg.session_timeout_ms)
    }
}

/// Runs a given schedule (random choices still come from `cfg.seed`).
pub fn run_with(cfg: &SimConfig, schedule: Schedule) -> SimReport {
    let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    run_schedule(cfg, schedule, rng)
}

/// Runs `cfg`'s seeded schedule against the broker `model` builds for the schedule's queue
/// count (the real broker's handlers, in `shoal-broker`'s harness).
pub fn run_on(
    cfg: &SimConfig,
    model: impl FnOnce(i32, &SimConfig) -> Box<dyn BrokerModel>,
) -> SimReport {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let schedule = schedule_for(cfg, &mut rng);
    let broker = model(schedule.queues, cfg);
    run_schedule_on(cfg, schedule, rng, broker)
}

fn run_schedule(cfg: &SimConfig, schedule: Schedule, rng: ChaCha8Rng) -> SimReport {
    let broker = Box::new(SimBroker::new(schedule.queues, cfg));
    run_schedule_on(cfg, schedule, rng, broker)
}

fn run_schedule_on(
    cfg: &SimConfig,
    schedule: Schedule,
    rng: ChaCha8Rng,
    broker: Box<dyn BrokerModel>,
) -> SimReport {
    let mut w = World {
        cfg: cfg.clone(),
        rng,
        now: 0,
        seq: 0,
        heap: BinaryHeap::new(),
        events: Vec::new(),
        broker,
        held: BTreeMap::new(),
        members: Vec::new(),
        next_conn: 0,
        closed: BTreeSet::new(),
        next_req: 0,
        next_token: 0,
        lose_notices_until: 0,
        faults: true,
        producing: true,
        deliveries: BTreeMap::new(),
        violations: Vec::new(),
        produced: 0,
    };
    for _ in 0..schedule.members {
        w.add_member();
    }
    w.schedule(1, Ev::Produce);
    w.schedule(250, Ev::Housekeeping);
    let mut next_event = 0;
    let end = cfg.duration_ms;
    let limit = end + cfg.drain_ms;
    let mut settle_ms = None;
    let mut last_check = 0;
    let mut steps: u64 = 0;
    loop {
        steps += 1;
        if steps > MAX_STEPS {
            w.violations.push(Violation::Stuck { at: w.now });
            break;
        }
        let heap_t = w.heap.peek().map(|Reverse((t, _, _))| *t);
        let sched_t = schedule.events.get(next_event).map(|(t, _)| *t);
        let mut member_t: Option<(u64, usize)> = None;
        for m in 0..w.members.len() {
            if let Some(t) = w.member_timer(m) {
                let t = t.max(w.now);
                if member_t.is_none_or(|(b, _)| t < b) {
                    member_t = Some((t, m));
                }
            }
        }
        let t = [
            heap_t,
            sched_t,
            member_t.map(|x| x.0),
            (w.now < end).then_some(end),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(limit);
        if t > limit {
            break;
        }
        w.now = t.max(w.now);
        if w.now >= end && w.faults {
            // The schedule is over: no more faults, no more production.
            w.faults = false;
            w.producing = false;
            for m in w.members.iter_mut() {
                m.listener_ms = 1;
            }
            if w.live().iter().all(|i| w.members[*i].life != Life::Alive) {
                w.add_member();
            }
        }
        if sched_t == Some(t) {
            let ev = schedule.events[next_event].1.clone();
            next_event += 1;
            w.on_schedule(ev);
        } else if member_t.is_some_and(|(mt, _)| mt == t) && heap_t != Some(t) {
            let m = member_t.map_or(0, |x| x.1);
            w.on_member_timer(m);
        } else if heap_t == Some(t) {
            let Some(Reverse((_, _, idx))) = w.heap.pop() else {
                break;
            };
            if let Some(ev) = w.events.get_mut(idx).and_then(Option::take) {
                w.handle(ev);
            }
        }
        w.step_leaving();
        if w.now >= end && w.now >= last_check + 50 {
            last_check = w.now;
            if w.all_delivered() && w.settled().is_ok() {
                settle_ms = Some(w.now - end);
                break;
            }
        }
        if w.violations.len() > 20 {
            break;
        }
    }
    if settle_ms.is_none() {
        let missing = w.missing();
        if !missing.is_empty() {
            w.violations.push(Violation::Lost {
                count: missing.len() as u64,
                examples: missing.into_iter().take(5).collect(),
            });
        }
        if let Err(queues) = w.settled() {
            w.violations.push(Violation::NotSettled { queues });
        }
    }
    let deliveries: u64 = w.deliveries.values().map(|c| u64::from(*c)).sum();
    let duplicates = deliveries - w.deliveries.len() as u64;
    let fenced: u64 = w.members.iter().map(|m| m.rb.stats().fenced).sum();
    let member_fences: u64 = w
        .members
        .iter()
        .filter_map(|m| m.coord.as_ref())
        .map(|c| c.core.fences())
        .sum();
    if cfg.graceful && (fenced + member_fences > 0 || duplicates > 0) {
        w.violations.push(Violation::NotGraceful {
            fences: fenced + member_fences,
            duplicates,
        });
    }
    SimReport {
        seed: cfg.seed,
        schedule,
        violations: w.violations,
        produced: w.produced,
        deliveries,
        duplicates,
        settle_ms,
        fenced,
    }
}
