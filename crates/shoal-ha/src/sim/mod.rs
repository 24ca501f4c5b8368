//! A seeded simulator of one replicated broker group: controller voters ([`ControllerNode`],
//! raft-rs inside) and brokers ([`Member`]: master and replica state machines), exactly the
//! shipped types, driven over simulated networks, disks and clocks.
//!
//! - **Network**: every message takes 1 to 15 ms (so messages reorder); partitions cut one
//!   direction or both between any two processes; lossy periods drop a share of messages.
//! - **Processes**: brokers crash (and restart with their disk), pause (their clock runs on,
//!   messages wait: a GC pause or SIGSTOP, shorter than the lease or longer than the election
//!   delay), lose their disk (a replica's: it restarts empty with a new token, so a new broker
//!   id); voters crash and restart with their Raft log. Each process's clock drifts by up to
//!   [`crate::MAX_CLOCK_DRIFT_PPM`] against real time.
//! - **Load**: a producer writes a 32-byte record about every `write_every_ms` to a random
//!   broker that believes it is master (stale ones included).
//! - **Operators** ask for switch-overs.
//!
//! After every event the invariants of [`invariants`] are checked (see there). After the
//! faults, everything heals and the group must acknowledge a write again within
//! `settle_ms`. A run is a pure function of its [`SimConfig`]: a failing seed replays exactly.
//!
//! [`ControllerNode`]: crate::controller::ControllerNode
//! [`Member`]: crate::replication::Member

mod invariants;
mod report;
mod schedule;
mod world;

pub use report::{SimReport, Violation};
pub use schedule::{Fault, Node, Schedule, SimConfig};
pub use world::{controller_config, record, GROUP};

use crate::replication::AckMode;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use world::World;

/// Runs the seed's schedule.
pub fn run(cfg: &SimConfig) -> SimReport {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let schedule = Schedule::random(cfg, &mut rng);
    run_schedule(cfg, &schedule, rng)
}

/// Runs a given schedule (other random choices still come from the seed).
pub fn run_with(cfg: &SimConfig, schedule: &Schedule) -> SimReport {
    let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    run_schedule(cfg, schedule, rng)
}

fn run_schedule(cfg: &SimConfig, schedule: &Schedule, rng: ChaCha8Rng) -> SimReport {
    let mut w = World::new(cfg.clone(), rng, schedule);
    let healed_at = cfg.faults_until_ms;
    let mut ok = w.run_until(healed_at);
    if ok {
        w.heal();
        ok = w.run_until(healed_at + cfg.settle_ms);
    }
    if ok && w.checker().last_ack_at <= healed_at {
        let (detail, at) = (w.describe(), w.now);
        w.checker_mut()
            .violations
            .push(Violation::Stuck { at, detail });
    }
    let mut report = std::mem::take(&mut w.report);
    report.writes.2 = w.checker().acked_count;
    if let Some(info) = invariants::controller_view(&w) {
        report.master_epoch = info.master_epoch;
        report.master = info.master;
    }
    if cfg.ack == AckMode::Master {
        let reference = &w.checker().reference;
        report.acked_lost_master_mode = w
            .checker()
            .acked_master_mode
            .iter()
            .filter(|(id, at)| {
                let Some(&(_, s, e)) = w.writes.get(id) else {
                    return false;
                };
                *at < healed_at && reference.get(s as usize..e as usize) != Some(&record(*id)[..])
            })
            .count() as u64;
    }
    report.confirmed_bytes = w.checker().reference.len() as u64;
    report.snapshots_installed = w
        .controllers
        .iter()
        .filter_map(|c| c.node.as_ref())
        .map(|n| n.snapshots_installed())
        .sum();
    report.violations = std::mem::take(&mut w.checker_mut().violations);
    report
}
