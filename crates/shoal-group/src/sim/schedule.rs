//! What a simulated run does: its settings ([`SimConfig`]) and its seeded schedule of
//! membership and fault events ([`Schedule`]).

use crate::rebalance::Handover;
use rand::Rng;

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
