//! The deterministic rebalance simulator (`shoal_group::sim`) over seeded schedules.
//!
//! - CI: `cargo test -p shoal-group --test sim` runs `SHOAL_SIM_SCHEDULES` schedules (default
//!   2000) and fails on any invariant violation, printing the seed.
//! - Coordinated mode: `SHOAL_SIM_COORD_SCHEDULES` schedules (default 250) with faults, and
//!   as many with graceful changes only.
//! - Replay one seed with a trace of every step:
//!   `SHOAL_SIM_SEED=1234 cargo test -p shoal-group --test sim replay -- --nocapture`
//!   (`SHOAL_SIM_MODE=coordinated` or `graceful` for the coordinated runs).
//! - A long run: `SHOAL_SIM_SCHEDULES=100000 SHOAL_SIM_FIRST=2000 cargo test --release -p
//!   shoal-group --test sim many_schedules -- --nocapture`.

use shoal_group::rebalance::Handover;
use shoal_group::sim::{run, run_with, Schedule, SimConfig, SimEvent, Violation};
use std::time::{Duration, Instant};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `n` seeds from `first` with `make`'s settings; prints the totals; returns the seeds
/// with violations.
fn run_many(what: &str, make: fn(u64) -> SimConfig, n: u64, first: u64, mode: &str) -> Vec<u64> {
    let started = Instant::now();
    let (mut deliveries, mut dups, mut produced, mut fenced) = (0u64, 0u64, 0u64, 0u64);
    let mut settle: Vec<u64> = Vec::new();
    let mut failed = Vec::new();
    for seed in first..first + n {
        let r = run(&make(seed));
        deliveries += r.deliveries;
        dups += r.duplicates;
        produced += r.produced;
        fenced += r.fenced;
        settle.extend(r.settle_ms);
        if !r.violations.is_empty() {
            println!("{what}: seed {seed} FAILED: {:?}", r.schedule);
            for v in &r.violations {
                println!("  {v}");
            }
            println!(
                "  replay: SHOAL_SIM_SEED={seed} SHOAL_SIM_MODE={mode} cargo test -p shoal-group --test sim replay -- --nocapture"
            );
            failed.push(seed);
        }
    }
    settle.sort_unstable();
    let pct = |p: f64| {
        settle
            .get(((settle.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or_default()
    };
    println!(
        "{what}: {n} schedules in {:?}: {produced} messages, {deliveries} deliveries, {dups} duplicates, {fenced} queues fenced; settled after the schedule in p50 {} ms, p99 {} ms, max {} ms",
        started.elapsed(),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    failed
}

#[test]
fn many_schedules_hold_every_invariant() {
    let n = env_u64("SHOAL_SIM_SCHEDULES", 2000);
    let first = env_u64("SHOAL_SIM_FIRST", 0);
    let failed = run_many("classic", SimConfig::for_seed, n, first, "classic");
    assert!(failed.is_empty(), "seeds with violations: {failed:?}");
}

/// Coordinated mode: the members' targets come from the coordinator; joins, graceful
/// leaves, kills, freezes shorter and longer than the session, lost notices and messages,
/// slow listeners, more queues and restarts of static members.
#[test]
fn coordinated_schedules_hold_every_invariant() {
    let n = env_u64("SHOAL_SIM_COORD_SCHEDULES", 250);
    let first = env_u64("SHOAL_SIM_FIRST", 0);
    let failed = run_many(
        "coordinated",
        SimConfig::coordinated_for_seed,
        n,
        first,
        "coordinated",
    );
    assert!(failed.is_empty(), "seeds with violations: {failed:?}");
}

/// Coordinated mode with graceful changes only (joins, leaves, slow listeners, more queues)
/// over a network that delays and reorders but loses nothing: no member is ever fenced and
/// no message is delivered twice.
#[test]
fn coordinated_graceful_changes_fence_nobody_and_duplicate_nothing() {
    let n = env_u64("SHOAL_SIM_COORD_SCHEDULES", 250);
    let first = env_u64("SHOAL_SIM_FIRST", 0);
    let failed = run_many(
        "coordinated graceful",
        SimConfig::coordinated_graceful_for_seed,
        n,
        first,
        "graceful",
    );
    assert!(failed.is_empty(), "seeds with violations: {failed:?}");
}

#[test]
fn replay() {
    let Ok(seed) = std::env::var("SHOAL_SIM_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("SHOAL_SIM_SEED is a number");
    let mut cfg = match std::env::var("SHOAL_SIM_MODE").as_deref() {
        Ok("coordinated") => SimConfig::coordinated_for_seed(seed),
        Ok("graceful") => SimConfig::coordinated_graceful_for_seed(seed),
        _ => SimConfig::for_seed(seed),
    };
    cfg.trace = true;
    if std::env::var("SHOAL_SIM_HANDOVER").as_deref() == Ok("delay") {
        cfg.handover = Handover::Delay(Duration::from_millis(200));
    }
    let r = run(&cfg);
    println!("{:?}", r.schedule);
    for v in &r.violations {
        println!("VIOLATION {v}");
    }
    println!(
        "produced {} deliveries {} duplicates {} settle {:?}",
        r.produced, r.deliveries, r.duplicates, r.settle_ms
    );
    assert!(r.violations.is_empty());
}

/// The same seed is the same run.
#[test]
fn runs_are_deterministic() {
    for seed in [3, 77, 1234] {
        let a = run(&SimConfig::for_seed(seed));
        let b = run(&SimConfig::for_seed(seed));
        assert_eq!(
            (a.deliveries, a.duplicates, a.settle_ms, a.produced),
            (b.deliveries, b.duplicates, b.settle_ms, b.produced)
        );
    }
}

fn delay_config(seed: u64) -> SimConfig {
    let mut c = SimConfig::for_seed(seed);
    c.handover = Handover::Delay(Duration::from_millis(200));
    c
}

/// The race Shoal had before the rebalance engine: a gaining member waits a fixed hand-over
/// delay and starts while the former owner, whose notice came late, still delivers. With the
/// evidence-based hand-over switched off, the simulator catches it.
#[test]
fn the_timer_hand_over_race_is_caught_without_locks() {
    // One member, a second joins while notices are being lost: the first keeps its queues
    // until its safety-net refresh while the second starts them after 200 ms.
    let schedule = Schedule {
        queues: 4,
        members: 1,
        events: vec![
            (1_000, SimEvent::LoseNotices(2_000)),
            (1_500, SimEvent::Join),
        ],
    };
    let r = run_with(&delay_config(1), schedule.clone());
    assert!(
        r.violations
            .iter()
            .any(|v| matches!(v, Violation::TwoDispatchers { .. })),
        "{:?}",
        r.violations
    );
    // The same schedule with hand-over by locks holds.
    let r = run_with(&SimConfig::for_seed(1), schedule);
    assert!(r.violations.is_empty(), "{:?}", r.violations);

    // And random schedules find it too.
    let caught = (0..200)
        .filter(|s| {
            run(&delay_config(*s))
                .violations
                .iter()
                .any(|v| matches!(v, Violation::TwoDispatchers { .. }))
        })
        .count();
    println!("the delay hand-over broke exclusivity in {caught} of 200 schedules");
    assert!(caught > 0);
}

/// A member frozen past its lease delivers nothing stale after it resumes, and its queues are
/// taken over within the session timeout.
#[test]
fn a_member_frozen_past_its_lease_is_fenced() {
    let schedule = Schedule {
        queues: 8,
        members: 2,
        events: vec![(2_000, SimEvent::Pause(0, 7_000))],
    };
    let r = run_with(&SimConfig::for_seed(5), schedule);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(r.fenced > 0, "the frozen member's queues were fenced");
}
