//! The engine's invariants under seeded random schedules (pops, acks with good, stale and
//! lapsed receipts, invisibility changes, consumers killed while holding leases, revives that
//! fail, broker restarts from the journal), and unit tests of single rules. A failing seed
//! replays with `SHOAL_POP_SEED=<seed>`.

use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashSet;

fn key(q: i32) -> QueueKey {
    QueueKey::new("G", "T", q)
}

fn pop(e: &mut PopEngine, now: u64, k: &QueueKey, n: usize, fifo: bool, store_len: u64) -> Grant {
    let plan = e.read_plan(k, fifo, n, 0, 0).expect("plan");
    let mut found: Vec<Candidate> = plan
        .redeliver
        .iter()
        .map(|&offset| Candidate {
            offset,
            matched: true,
        })
        .collect();
    let end = (plan.from + plan.max_fresh as u64).min(store_len);
    found.extend((plan.from..end).map(|offset| Candidate {
        offset,
        matched: true,
    }));
    let t = e.next_pop_time(now);
    e.handle_read(now, t, k, "c1", &found, end.max(plan.from), 30_000)
}

fn drain(e: &mut PopEngine) -> Vec<PopAction> {
    std::iter::from_fn(|| e.poll_action()).collect()
}

#[test]
fn ack_needs_the_current_unlapsed_receipt() {
    let mut e = PopEngine::new(PopConfig::default());
    let k = key(0);
    let g = pop(&mut e, 1_000, &k, 2, false, 10);
    assert_eq!(g.leases.len(), 2);
    assert_eq!(
        e.handle_ack(1_001, &k, 0, g.pop_time + 1),
        Err(ReceiptError::Stale)
    );
    assert_eq!(
        e.handle_ack(1_001, &QueueKey::new("Other", "T", 0), 0, g.pop_time),
        Err(ReceiptError::NotInFlight)
    );
    assert_eq!(
        e.handle_ack(1_001, &k, 5, g.pop_time),
        Err(ReceiptError::NotInFlight)
    );
    assert_eq!(e.handle_ack(1_001, &k, 0, g.pop_time), Ok(()));
    assert_eq!(
        e.handle_ack(1_002, &k, 0, g.pop_time),
        Err(ReceiptError::NotInFlight)
    );
    // Lapsed at its deadline: refused, then revived.
    assert_eq!(
        e.handle_ack(31_000, &k, 1, g.pop_time),
        Err(ReceiptError::Expired)
    );
    let actions = drain(&mut e);
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, PopAction::Revive { offset: 1, .. })),
        "{actions:?}"
    );
    e.handle_revived(&k, 1, g.pop_time, false);
    assert_eq!(e.queue_offsets(&k), Some((2, 2)));
    assert!(drain(&mut e).contains(&PopAction::CommitOffset {
        key: k.clone(),
        ack: 2
    }));
}

#[test]
fn a_changed_lease_voids_the_old_receipt() {
    let mut e = PopEngine::new(PopConfig::default());
    let k = key(0);
    let g = pop(&mut e, 1_000, &k, 1, false, 10);
    let c = e
        .handle_change_invisible(20_000, &k, 0, g.pop_time, 60_000)
        .unwrap();
    assert!(c.pop_time > g.pop_time);
    assert_eq!(
        e.handle_ack(20_001, &k, 0, g.pop_time),
        Err(ReceiptError::Stale)
    );
    // Past the first deadline, inside the new one.
    e.handle_timeout(40_000);
    assert_eq!(e.handle_ack(40_000, &k, 0, c.pop_time), Ok(()));
}

#[test]
fn invisibility_is_clamped_to_the_configured_bounds() {
    let mut e = PopEngine::new(PopConfig::default());
    let k = key(0);
    e.read_plan(&k, false, 1, 0, 0).unwrap();
    let t = e.next_pop_time(0);
    let g = e.handle_read(
        0,
        t,
        &k,
        "c",
        &[Candidate {
            offset: 0,
            matched: true,
        }],
        1,
        10,
    );
    assert_eq!(g.invisible_ms, 1_000);
    assert_eq!(e.poll_timeout(), Some(1_000));
}

#[test]
fn fifo_queues_hand_out_in_order_and_redeliver_in_place() {
    let mut e = PopEngine::new(PopConfig {
        max_attempts: 2,
        ..PopConfig::default()
    });
    let k = key(0);
    let g = pop(&mut e, 0, &k, 2, true, 10);
    assert_eq!(
        g.leases.iter().map(|l| l.offset).collect::<Vec<_>>(),
        [0, 1]
    );
    // Under lease: nothing more from this queue.
    assert_eq!(e.read_plan(&k, true, 5, 0, 0), None);
    e.handle_ack(1, &k, 0, g.pop_time).unwrap();
    assert_eq!(e.read_plan(&k, true, 5, 0, 0), None);
    // Offset 1 lapses: delivered again before anything newer, attempts 2.
    e.handle_timeout(30_000);
    let g2 = pop(&mut e, 30_000, &k, 5, true, 10);
    assert_eq!(
        g2.leases,
        vec![Granted {
            offset: 1,
            attempts: 2
        }]
    );
    // Lapses again at the max: dead letter, then the queue moves on.
    e.handle_timeout(60_000);
    let dl = drain(&mut e)
        .into_iter()
        .find_map(|a| match a {
            PopAction::DeadLetter {
                offset, pop_time, ..
            } => Some((offset, pop_time)),
            _ => None,
        })
        .expect("dead letter");
    assert_eq!(dl.0, 1);
    assert_eq!(e.read_plan(&k, true, 5, 0, 0), None);
    e.handle_revived(&k, 1, dl.1, true);
    let g3 = pop(&mut e, 60_001, &k, 1, true, 10);
    assert_eq!(
        g3.leases,
        vec![Granted {
            offset: 2,
            attempts: 1
        }]
    );
    assert_eq!(e.counters().dead_lettered, 1);
}

#[test]
fn queue_choice_rotates_and_reads_retry_queues_first_sometimes() {
    let mut e = PopEngine::default();
    let cands: Vec<(QueueKey, bool)> = (0..3)
        .map(|q| (key(q), false))
        .chain([(QueueKey::new("G", "%RETRY%G+T", 0), true)])
        .collect();
    let firsts: Vec<String> = (0..10)
        .map(|_| {
            let p = e.plan_pop("G", "T", &cands);
            assert_eq!(p.len(), 4);
            format!("{}:{}", p[0].topic, p[0].queue_id)
        })
        .collect();
    assert_eq!(firsts[0], "%RETRY%G+T:0");
    assert_eq!(firsts[5], "%RETRY%G+T:0");
    assert_eq!(&firsts[1..4], ["T:1", "T:2", "T:0"]);
}

#[test]
fn inflight_and_span_are_bounded() {
    let mut e = PopEngine::new(PopConfig {
        max_inflight_per_queue: 3,
        max_span: 5,
        ..PopConfig::default()
    });
    let k = key(0);
    let g = pop(&mut e, 0, &k, 10, false, 100);
    assert_eq!(g.leases.len(), 3);
    assert_eq!(e.read_plan(&k, false, 10, 0, 0), None);
    for o in 1..3 {
        e.handle_ack(1, &k, o, g.pop_time).unwrap();
    }
    // Offset 0 is still leased: at most 5 offsets past it.
    let plan = e.read_plan(&k, false, 10, 0, 0).unwrap();
    assert_eq!(plan.max_fresh, 2);
}

#[test]
fn journal_lines_round_trip() {
    let k = QueueKey::new("G-1", "%RETRY%G-1+T", 3);
    for r in [
        PopRecord::Base {
            key: k.clone(),
            ack: 5,
            cursor: 9,
            fifo: true,
        },
        PopRecord::Cursor {
            key: k.clone(),
            cursor: 10,
        },
        PopRecord::Grant {
            key: k.clone(),
            offset: 7,
            pop_time: 123,
            deadline: 456,
            attempts: 2,
            consumer: "127.0.0.1@1#2".into(),
        },
        PopRecord::Done {
            key: k.clone(),
            offset: 8,
        },
    ] {
        let mut s = String::new();
        r.encode(&mut s);
        assert!(s.ends_with('\n'));
        assert_eq!(PopRecord::decode(s.trim_end()).unwrap(), r);
    }
    assert!(PopRecord::decode("G G T 0 1 2").is_err());
    assert!(PopRecord::decode("X G T 0 1").is_err());
}

/// The simulated world: queues of messages in a store, a retry queue, a DLQ, consumers with
/// receipts, and the journal as the broker would have written it.
struct World {
    rng: ChaCha8Rng,
    e: PopEngine,
    now: u64,
    fifo: bool,
    /// Messages per original queue; the retry queue grows with revives.
    store: BTreeMap<QueueKey, Vec<u64>>,
    /// (original queue id, original offset) of each retry-queue message.
    retry_origin: Vec<(i32, u64)>,
    journal: Vec<PopRecord>,
    /// Receipts consumers hold: (consumer, key, offset, pop_time).
    held: Vec<(usize, QueueKey, u64, u64)>,
    /// Originals acknowledged (through any copy) or dead-lettered.
    consumed: HashSet<(i32, u64)>,
    dead: HashSet<(i32, u64)>,
    /// (key, offset) of copies acknowledged: must never be granted again.
    acked: HashSet<(QueueKey, u64)>,
    /// Leases granted and their deadlines, for the "one valid lease" check.
    live: HashMap<(QueueKey, u64), (u64, u64)>,
    pending_revives: Vec<(QueueKey, u64, u64, bool)>,
    redeliveries: u64,
}

const QUEUES: i32 = 3;
const PER_QUEUE: u64 = 40;

fn retry_key() -> QueueKey {
    QueueKey::new("G", "%RETRY%G+T", 0)
}

fn matched(offset: u64) -> bool {
    offset % 7 != 3
}

impl World {
    fn new(seed: u64, fifo: bool) -> Self {
        let mut store = BTreeMap::new();
        for q in 0..QUEUES {
            store.insert(key(q), (0..PER_QUEUE).collect());
        }
        store.insert(retry_key(), Vec::new());
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            e: PopEngine::new(PopConfig {
                max_attempts: 3,
                max_inflight_per_queue: 8,
                ..PopConfig::default()
            }),
            now: 1_000,
            fifo,
            store,
            retry_origin: Vec::new(),
            journal: Vec::new(),
            held: Vec::new(),
            consumed: HashSet::new(),
            dead: HashSet::new(),
            acked: HashSet::new(),
            live: HashMap::new(),
            pending_revives: Vec::new(),
            redeliveries: 0,
        }
    }

    fn origin(&self, k: &QueueKey, offset: u64) -> (i32, u64) {
        if k.topic == "T" {
            (k.queue_id, offset)
        } else {
            self.retry_origin[offset as usize]
        }
    }

    fn settle(&mut self) -> Result<(), String> {
        while let Some(a) = self.e.poll_action() {
            match a {
                PopAction::Journal(r) => {
                    // Records travel through their text form, as on disk.
                    let mut s = String::new();
                    r.encode(&mut s);
                    self.journal
                        .push(PopRecord::decode(s.trim_end()).map_err(|e| e.to_string())?);
                }
                PopAction::Revive {
                    key,
                    offset,
                    pop_time,
                } => {
                    self.pending_revives.push((key, offset, pop_time, false));
                }
                PopAction::DeadLetter {
                    key,
                    offset,
                    pop_time,
                } => {
                    self.pending_revives.push((key, offset, pop_time, true));
                }
                PopAction::CommitOffset { .. } => {}
            }
        }
        self.e.check_invariants()
    }

    fn pop(&mut self, consumer: usize) -> Result<(), String> {
        let cands: Vec<(QueueKey, bool)> = self
            .store
            .keys()
            .map(|k| (k.clone(), k.topic != "T"))
            .collect();
        let order = self.e.plan_pop("G", "T", &cands);
        let max = self.rng.gen_range(1..5);
        for k in order {
            let fifo = self.fifo && k.topic == "T";
            let Some(plan) = self.e.read_plan(&k, fifo, max, 0, 0) else {
                continue;
            };
            let len = self.store[&k].len() as u64;
            let mut found: Vec<Candidate> = plan
                .redeliver
                .iter()
                .map(|&o| Candidate {
                    offset: o,
                    matched: true,
                })
                .collect();
            let end = (plan.from + plan.max_fresh as u64).min(len);
            found.extend((plan.from..end).map(|o| Candidate {
                offset: o,
                matched: matched(o) || k.topic != "T",
            }));
            if found.is_empty() {
                continue;
            }
            let invisible = self.rng.gen_range(1_000..20_000);
            if fifo {
                for c in &found {
                    let below_done = (0..c.offset).all(|o| {
                        let orig = (k.queue_id, o);
                        !matched(o)
                            || self.consumed.contains(&orig)
                            || self.dead.contains(&orig)
                            || found.iter().any(|f| f.offset == o)
                    });
                    if c.matched && !below_done {
                        return Err(format!(
                            "FIFO {k:?}: {} handed out before an earlier message was done",
                            c.offset
                        ));
                    }
                }
            }
            let t = self.e.next_pop_time(self.now);
            let g = self.e.handle_read(
                self.now,
                t,
                &k,
                &format!("c{consumer}"),
                &found,
                end.max(plan.from),
                invisible,
            );
            for l in &g.leases {
                if self.acked.contains(&(k.clone(), l.offset)) {
                    return Err(format!(
                        "{k:?} {} acknowledged, then handed out again",
                        l.offset
                    ));
                }
                if let Some((_, deadline)) = self.live.get(&(k.clone(), l.offset)) {
                    if *deadline > self.now {
                        return Err(format!("{k:?} {} leased twice at once", l.offset));
                    }
                    self.redeliveries += 1;
                }
                self.live.insert(
                    (k.clone(), l.offset),
                    (g.pop_time, self.now + g.invisible_ms),
                );
                self.held.push((consumer, k.clone(), l.offset, g.pop_time));
            }
            return self.settle();
        }
        Ok(())
    }

    fn ack(&mut self) -> Result<(), String> {
        if self.held.is_empty() {
            return Ok(());
        }
        let i = self.rng.gen_range(0..self.held.len());
        let (_, k, offset, pop_time) = self.held.swap_remove(i);
        // Now and then a receipt is mangled into a stale one.
        let stale = self.rng.gen_bool(0.05);
        let t = if stale {
            pop_time + 1_000_000
        } else {
            pop_time
        };
        let valid = self
            .live
            .get(&(k.clone(), offset))
            .is_some_and(|(p, d)| *p == t && self.now < *d)
            && !self.acked.contains(&(k.clone(), offset));
        let r = self.e.handle_ack(self.now, &k, offset, t);
        if r.is_ok() != valid {
            return Err(format!(
                "ack {k:?} {offset} {t}: engine {r:?}, model valid={valid}"
            ));
        }
        if r.is_ok() {
            self.acked.insert((k.clone(), offset));
            self.live.remove(&(k.clone(), offset));
            let o = self.origin(&k, offset);
            self.consumed.insert(o);
        }
        self.settle()
    }

    fn change(&mut self) -> Result<(), String> {
        if self.held.is_empty() {
            return Ok(());
        }
        let i = self.rng.gen_range(0..self.held.len());
        let (c, k, offset, pop_time) = self.held[i].clone();
        let extra = self.rng.gen_range(1_000..10_000);
        if let Ok(g) = self
            .e
            .handle_change_invisible(self.now, &k, offset, pop_time, extra)
        {
            self.held[i] = (c, k.clone(), offset, g.pop_time);
            self.live
                .insert((k, offset), (g.pop_time, self.now + g.invisible_ms));
        }
        self.settle()
    }

    fn revive_some(&mut self) -> Result<(), String> {
        let mut keep = Vec::new();
        for (k, offset, pop_time, dlq) in std::mem::take(&mut self.pending_revives) {
            if self.rng.gen_bool(0.2) {
                self.e.handle_revive_failed(self.now, &k, offset, pop_time);
                continue;
            }
            if self.rng.gen_bool(0.3) {
                keep.push((k, offset, pop_time, dlq));
                continue;
            }
            let o = self.origin(&k, offset);
            // A copy's attempts: RocketMQ counts them in the stored reconsume count.
            let copies = self.retry_origin.iter().filter(|x| **x == o).count() as u32;
            if dlq || copies + 1 >= self.e.config().max_attempts {
                self.dead.insert(o);
                self.e.handle_revived(&k, offset, pop_time, true);
            } else {
                self.retry_origin.push(o);
                self.store
                    .get_mut(&retry_key())
                    .unwrap()
                    .push(self.retry_origin.len() as u64 - 1);
                self.e.handle_revived(&k, offset, pop_time, false);
            }
            self.live.remove(&(k, offset));
        }
        self.pending_revives.extend(keep);
        self.settle()
    }

    fn restart(&mut self) -> Result<(), String> {
        // Compact now and then: the snapshot replaces the journal.
        if self.rng.gen_bool(0.5) {
            self.journal = self.e.snapshot();
        }
        let config = self.e.config().clone();
        self.e = PopEngine::new(config);
        self.e.restore(self.journal.clone());
        // Revives in progress are forgotten by the broker; the engine revives again.
        self.pending_revives.clear();
        self.settle()
    }

    fn step(&mut self) -> Result<(), String> {
        match self.rng.gen_range(0..100) {
            0..=34 => {
                let c = self.rng.gen_range(0..3);
                self.pop(c)?;
            }
            35..=64 => self.ack()?,
            65..=69 => self.change()?,
            70..=74 => {
                // A consumer dies holding its receipts.
                let c = self.rng.gen_range(0..3);
                self.held.retain(|h| h.0 != c);
            }
            75..=84 => self.revive_some()?,
            85..=87 => self.restart()?,
            _ => {
                self.now += self.rng.gen_range(100..8_000);
                self.e.handle_timeout(self.now);
                self.settle()?;
            }
        }
        Ok(())
    }

    /// Everyone keeps acknowledging until every message is consumed or dead-lettered.
    fn finish(&mut self) -> Result<(), String> {
        for _ in 0..20_000 {
            let all = (0..QUEUES).all(|q| {
                (0..PER_QUEUE).all(|o| {
                    !matched(o) || self.consumed.contains(&(q, o)) || self.dead.contains(&(q, o))
                })
            });
            if all && self.pending_revives.is_empty() {
                return Ok(());
            }
            self.pop(0)?;
            while !self.held.is_empty() {
                self.ack()?;
            }
            self.revive_some()?;
            self.now += 5_000;
            self.e.handle_timeout(self.now);
            self.settle()?;
        }
        let lost: Vec<_> = (0..QUEUES)
            .flat_map(|q| (0..PER_QUEUE).map(move |o| (q, o)))
            .filter(|(q, o)| {
                matched(*o) && !self.consumed.contains(&(*q, *o)) && !self.dead.contains(&(*q, *o))
            })
            .collect();
        Err(format!("not consumed in the end (lost): {lost:?}"))
    }
}

/// Runs one seed; returns (redeliveries, dead letters, refused receipts) so the tests can
/// check the schedules reached those paths.
fn run(seed: u64, fifo: bool) -> (u64, usize, u64) {
    let mut w = World::new(seed, fifo);
    let result = (0..600)
        .try_for_each(|_| w.step())
        .and_then(|()| w.finish());
    if let Err(e) = result {
        panic!("seed {seed} (fifo {fifo}): {e}\nreplay: SHOAL_POP_SEED={seed} cargo test -p shoal-group pop::tests");
    }
    (
        w.redeliveries + w.retry_origin.len() as u64,
        w.dead.len(),
        w.e.counters().refused,
    )
}

fn run_all(fifo: bool) {
    let mut totals = (0, 0, 0);
    for seed in seeds() {
        let (r, d, x) = run(seed, fifo);
        totals = (totals.0 + r, totals.1 + d, totals.2 + x);
    }
    if std::env::var("SHOAL_POP_SEED").is_err() {
        assert!(
            totals.0 > 0 && totals.1 > 0 && totals.2 > 0,
            "paths not reached: {totals:?}"
        );
    }
}

fn seeds() -> Vec<u64> {
    match std::env::var("SHOAL_POP_SEED") {
        Ok(s) => vec![s.parse().expect("SHOAL_POP_SEED is a number")],
        Err(_) => (0..150).collect(),
    }
}

#[test]
fn seeded_schedules_keep_the_invariants_normal_queues() {
    run_all(false);
}

#[test]
fn seeded_schedules_keep_the_invariants_fifo_queues() {
    run_all(true);
}
