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
mod report;
mod schedule;
mod world;

pub use broker::{coordinator_config, SimBroker};
pub use model::{
    mq, Answer, BrokerModel, GroupAnswer, MemberListNotice, Outbox, Reply, Req, BROKER, GROUP,
    PULL_BATCH, TOPIC,
};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
pub use report::{SimReport, Violation};
pub use schedule::{Schedule, SimConfig, SimEvent};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use world::{Ev, Life, Pending, World};

/// Steps after which a run is declared stuck (a livelock in the rebalancer or the driver).
pub const MAX_STEPS: u64 = 3_000_000;

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
