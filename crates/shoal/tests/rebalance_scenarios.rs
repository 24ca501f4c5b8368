//! The rebalance engine's "Must show" scenario, as a user runs it: a `shoal dev` server,
//! separate `shoal consume` processes of one group on a 16-queue topic, a steady producer;
//! 4 -> 8 -> 4 members (joins started a few ms apart, leaves at once by SIGTERM), twice; a
//! SIGKILL; a member frozen with SIGSTOP (its connections stay open) past its session timeout,
//! then resumed with SIGCONT.
//!
//! Checked on the actual deliveries (each consumer prints a record with queue, offset and the
//! listener's time): within each interval between changes, no queue goes back and forth
//! between members (two members consuming one queue at once), graceful changes deliver no
//! message twice, nothing is lost, the killed member's and the frozen member's queues are
//! taken over, and the frozen member delivers nothing stale after it resumes. Timings are
//! printed; only generous liveness bounds are asserted (the machine is shared).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::*;

const TOPIC: &str = "RbScenario";
const QUEUES: i64 = 16;
const SESSION_MS: u64 = 4_000;

#[derive(Debug, Clone)]
struct Delivery {
    member: String,
    queue: i64,
    offset: i64,
    body: String,
    at_us: u64,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

/// What a member's debug log says (its stderr, `RUST_LOG` set for this): when it registered
/// (its consumer started, i.e. its first heartbeat was answered) and when it started a queue.
#[derive(Debug, Clone)]
struct LogEvent {
    member: String,
    /// `None`: the consumer started; `Some(q)`: queue `q` of the topic started.
    queue: Option<i64>,
    at_us: u64,
}

/// `2026-12-01T20:03:00.921644Z DEBUG shoal_client::rebalance: queue started queue=T@b#8 ..`
fn parse_log_line(member: &str, line: &str) -> Option<LogEvent> {
    let (ts, rest) = line.split_once(' ')?;
    let at = humantime::parse_rfc3339_weak(ts.trim_end_matches('Z')).ok()?;
    let at_us = at.duration_since(UNIX_EPOCH).ok()?.as_micros() as u64;
    let queue = if rest.contains("push consumer started") {
        None
    } else {
        let (_, q) = rest.split_once(&format!("queue started queue={TOPIC}@"))?;
        let (_, id) = q.split_once('#')?;
        Some(id.split_whitespace().next()?.parse().ok()?)
    };
    Some(LogEvent {
        member: member.to_string(),
        queue,
        at_us,
    })
}

struct Members {
    group: String,
    procs: BTreeMap<String, Proc>,
    seen: Arc<Mutex<Vec<Delivery>>>,
    log: Arc<Mutex<Vec<LogEvent>>>,
}

impl Members {
    fn join(&mut self, dev: &Dev, name: &str) {
        let session = SESSION_MS.to_string();
        let mut child = Command::new(shoal())
            .args([
                "consume",
                TOPIC,
                "--group",
                &self.group,
                "--json",
                "--from",
                "first",
                "--instance",
                name,
                "--protocol",
                "classic",
                "--session-timeout-ms",
                &session,
            ])
            .env("SHOAL_NAMESRV", &dev.namesrv)
            .env(
                "RUST_LOG",
                "warn,shoal_client::consumer=info,shoal_client::rebalance=debug",
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = self.log.clone();
        let who = name.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(e) = parse_log_line(&who, &line) {
                    log.lock().unwrap().push(e);
                }
            }
        });
        let stdout = child.stdout.take().unwrap();
        let seen = self.seen.clone();
        let who = name.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                seen.lock().unwrap().push(Delivery {
                    member: who.clone(),
                    queue: v["queue"].as_i64().unwrap_or(-1),
                    offset: v["queueOffset"].as_i64().unwrap_or(-1),
                    body: v["body"].as_str().unwrap_or_default().to_string(),
                    at_us: v["atUs"].as_u64().unwrap_or_default(),
                });
            }
        });
        self.procs.insert(name.to_string(), Proc { child });
    }

    fn signal(&self, name: &str, sig: &str) {
        let pid = self.procs[name].child.id().to_string();
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    }

    /// SIGTERM to all of `names` at once, then wait for them to exit.
    fn leave(&mut self, names: &[String]) {
        for n in names {
            self.signal(n, "-TERM");
        }
        for n in names {
            let mut p = self.procs.remove(n).unwrap();
            assert!(p.wait_exit(Duration::from_secs(30)), "{n} did not stop");
        }
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until, over the last `window`, every queue was delivered by exactly one member
    /// and the members delivering are exactly `live`.
    fn wait_settled(&self, live: &BTreeSet<String>, since_us: u64, limit: Duration) {
        let start = Instant::now();
        loop {
            let d = self.deliveries();
            let from = now_us().saturating_sub(1_000_000).max(since_us);
            let mut owners: HashMap<i64, BTreeSet<String>> = HashMap::new();
            for x in d.iter().filter(|x| x.at_us >= from) {
                owners.entry(x.queue).or_default().insert(x.member.clone());
            }
            let all: BTreeSet<String> = owners.values().flatten().cloned().collect();
            if owners.len() as i64 == QUEUES
                && owners.values().all(|o| o.len() == 1)
                && &all == live
            {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "not settled with {live:?} after {limit:?}: {owners:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Per-interval analysis of the deliveries between `from_us` and `to_us`.
struct Window {
    /// Queues whose deliveries went back and forth between members.
    interleaved: Vec<i64>,
    /// (queue, offset) delivered more than once in the window, or already before it.
    duplicates: usize,
    /// From the start of the window until every queue was delivered by its final owner, ms.
    convergence_ms: f64,
}

fn window(all: &[Delivery], from_us: u64, to_us: u64) -> Window {
    let mut by_queue: BTreeMap<i64, Vec<&Delivery>> = BTreeMap::new();
    for d in all.iter().filter(|d| d.at_us >= from_us && d.at_us < to_us) {
        by_queue.entry(d.queue).or_default().push(d);
    }
    let mut interleaved = Vec::new();
    let mut convergence_us = 0u64;
    for (q, list) in by_queue.iter_mut() {
        list.sort_by_key(|d| d.at_us);
        let mut runs: Vec<&str> = Vec::new();
        for d in list.iter() {
            if runs.last() != Some(&d.member.as_str()) {
                runs.push(&d.member);
            }
        }
        // Two members consuming one queue at once: their deliveries alternate in time and
        // they deliver the same messages (a member handed a queue back later starts after
        // the other's committed offset, so a legitimate A -> B -> A shares no offset).
        let repeated = runs
            .iter()
            .enumerate()
            .any(|(i, a)| runs[i + 1..].iter().skip(1).any(|b| b == a));
        if repeated {
            let mut by: HashMap<(i64, i64), BTreeSet<&str>> = HashMap::new();
            for d in list.iter() {
                by.entry((d.queue, d.offset)).or_default().insert(&d.member);
            }
            if by.values().any(|m| m.len() > 1) {
                interleaved.push(*q);
            }
        }
        if let Some(last) = runs.last().filter(|_| runs.len() > 1) {
            if let Some(first) = list
                .iter()
                .rposition(|d| d.member != *last)
                .and_then(|i| list.get(i + 1))
            {
                convergence_us = convergence_us.max(first.at_us.saturating_sub(from_us));
            }
        }
    }
    let mut before: BTreeSet<(i64, i64)> = all
        .iter()
        .filter(|d| d.at_us < from_us)
        .map(|d| (d.queue, d.offset))
        .collect();
    let mut duplicates = 0;
    for d in all.iter().filter(|d| d.at_us >= from_us && d.at_us < to_us) {
        if !before.insert((d.queue, d.offset)) {
            duplicates += 1;
        }
    }
    Window {
        interleaved,
        duplicates,
        convergence_ms: convergence_us as f64 / 1000.0,
    }
}

/// Hand-over times of a graceful change at `from_us` (window until `to_us`), from the
/// members' logs: (last registration of a member started in the window, µs after `from_us`;
/// the time the last moved queue was started by its final owner, µs after `from_us`).
fn handover(
    all: &[Delivery],
    log: &[LogEvent],
    from_us: u64,
    to_us: u64,
) -> (Option<u64>, Option<u64>) {
    let registered = log
        .iter()
        .filter(|e| e.queue.is_none() && e.at_us >= from_us && e.at_us < to_us)
        .map(|e| e.at_us - from_us)
        .max();
    let mut last_started = None;
    for q in 0..QUEUES {
        let owner_before = all
            .iter()
            .filter(|d| d.queue == q && d.at_us < from_us)
            .max_by_key(|d| d.at_us)
            .map(|d| d.member.as_str());
        let Some(owner_after) = all
            .iter()
            .filter(|d| d.queue == q && d.at_us >= from_us && d.at_us < to_us)
            .max_by_key(|d| d.at_us)
            .map(|d| d.member.as_str())
        else {
            continue;
        };
        if owner_before == Some(owner_after) {
            continue;
        }
        let started = log
            .iter()
            .filter(|e| {
                e.queue == Some(q)
                    && e.member == owner_after
                    && e.at_us >= from_us
                    && e.at_us < to_us
            })
            .map(|e| e.at_us - from_us)
            .max();
        last_started = last_started.max(started);
    }
    (registered, last_started)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[test]
fn four_eight_four_kill_and_freeze_keep_every_queue_exclusive() {
    let dev = Dev::start();
    let q = QUEUES.to_string();
    assert!(dev
        .cmd(&["topic", "create", TOPIC, "--queues", &q])
        .status
        .success());
    let mut m = Members {
        group: "rb-scenario".into(),
        procs: BTreeMap::new(),
        seen: Arc::new(Mutex::new(Vec::new())),
        log: Arc::new(Mutex::new(Vec::new())),
    };
    let names: Vec<String> = (1..=9).map(|i| format!("m{i}")).collect();
    for n in &names[..4] {
        m.join(&dev, n);
    }
    // Two steady producers: a queue's next message comes every few tens of ms, the
    // resolution of the delivery-based figures (printed below).
    let mut producer = steady_producer(&dev, TOPIC, "s", 1_000_000, 1);
    let mut producer2 = steady_producer(&dev, TOPIC, "t", 1_000_000, 1);
    let live = |v: &[String]| -> BTreeSet<String> { v.iter().cloned().collect() };
    m.wait_settled(&live(&names[..4]), 0, Duration::from_secs(60));

    // (label, start µs, graceful)
    let mut events: Vec<(String, u64, bool)> = Vec::new();
    let rounds: usize = std::env::var("SHOAL_RB_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let steady_from = now_us();
    std::thread::sleep(Duration::from_secs(1));
    let steady_to = now_us();
    for round in 1..=rounds {
        let t = now_us();
        for n in &names[4..8] {
            m.join(&dev, n);
            std::thread::sleep(Duration::from_millis(3));
        }
        events.push((format!("join 4->8 #{round}"), t, true));
        m.wait_settled(&live(&names[..8]), t, Duration::from_secs(60));
        std::thread::sleep(Duration::from_secs(2));
        let t = now_us();
        m.leave(&names[4..8]);
        events.push((format!("leave 8->4 #{round}"), t, true));
        m.wait_settled(&live(&names[..4]), t, Duration::from_secs(60));
        std::thread::sleep(Duration::from_secs(2));
    }

    // SIGKILL: no unregister, no final commit.
    let killed_queues: BTreeSet<i64> = {
        let d = m.deliveries();
        let from = now_us() - 1_000_000;
        d.iter()
            .filter(|x| x.member == "m4" && x.at_us >= from)
            .map(|x| x.queue)
            .collect()
    };
    let t_kill = now_us();
    let mut p = m.procs.remove("m4").unwrap();
    p.sigkill();
    events.push(("kill m4".into(), t_kill, false));
    m.wait_settled(&live(&names[..3]), t_kill, Duration::from_secs(60));
    let taken_kill = {
        let d = m.deliveries();
        killed_queues
            .iter()
            .filter_map(|q| {
                d.iter()
                    .filter(|x| x.queue == *q && x.at_us >= t_kill && x.member != "m4")
                    .map(|x| x.at_us)
                    .min()
            })
            .max()
            .map(|t| (t - t_kill) as f64 / 1000.0)
    };
    std::thread::sleep(Duration::from_secs(2));

    // SIGSTOP: frozen with its connections open, past the session timeout; then SIGCONT.
    m.join(&dev, &names[8]);
    let four: Vec<String> = vec![
        names[0].clone(),
        names[1].clone(),
        names[2].clone(),
        names[8].clone(),
    ];
    let t = now_us();
    m.wait_settled(&live(&four), t, Duration::from_secs(60));
    let frozen = "m9";
    let frozen_queues: BTreeSet<i64> = {
        let d = m.deliveries();
        let from = now_us() - 1_000_000;
        d.iter()
            .filter(|x| x.member == frozen && x.at_us >= from)
            .map(|x| x.queue)
            .collect()
    };
    let t_stop = now_us();
    m.signal(frozen, "-STOP");
    events.push(("freeze m9".into(), t_stop, false));
    m.wait_settled(&live(&names[..3]), t_stop, Duration::from_secs(60));
    let taken_frozen = {
        let d = m.deliveries();
        frozen_queues
            .iter()
            .filter_map(|q| {
                d.iter()
                    .filter(|x| x.queue == *q && x.at_us >= t_stop && x.member != frozen)
                    .map(|x| x.at_us)
                    .min()
            })
            .max()
            .map(|t| (t - t_stop) as f64 / 1000.0)
    };
    std::thread::sleep(Duration::from_millis(1500));
    let t_cont = now_us();
    m.signal(frozen, "-CONT");
    events.push(("resume m9".into(), t_cont, false));
    m.wait_settled(&live(&four), t_cont, Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(2));
    producer.sigkill();
    producer2.sigkill();
    std::thread::sleep(Duration::from_secs(3));
    let t_end = now_us();

    let all = m.deliveries();
    // Stale: the frozen member delivering, after it resumed, an offset another member
    // delivered after the freeze.
    let taken_over: BTreeSet<(i64, i64)> = all
        .iter()
        .filter(|d| d.member != frozen && d.at_us >= t_stop)
        .map(|d| (d.queue, d.offset))
        .collect();
    let stale = all
        .iter()
        .filter(|d| {
            d.member == frozen && d.at_us >= t_cont && taken_over.contains(&(d.queue, d.offset))
        })
        .count();
    let resumed_at_all = all
        .iter()
        .filter(|d| d.member == frozen && d.at_us >= t_cont)
        .count();

    println!(
        "rebalance scenario: {QUEUES} queues, session timeout {SESSION_MS} ms, uptime: {}",
        String::from_utf8_lossy(
            &Command::new("uptime")
                .output()
                .map(|o| o.stdout)
                .unwrap_or_default()
        )
        .trim()
    );
    // The resolution of the delivery-based figures: the mean gap between two messages of a
    // queue in one steady second.
    let steady_n = all
        .iter()
        .filter(|d| d.at_us >= steady_from && d.at_us < steady_to)
        .count()
        .max(1);
    println!(
        "  steady load: {steady_n} messages/s, a queue's next message every {:.1} ms on average",
        (steady_to - steady_from) as f64 / 1000.0 / (steady_n as f64 / QUEUES as f64)
    );
    let log = m.log.lock().unwrap().clone();
    let mut failures = Vec::new();
    let mut graceful_conv = Vec::new();
    // Join: from the last joiner's registration; leave: from the SIGTERM.
    let (mut join_handover, mut join_consumed, mut leave_handover) = (vec![], vec![], vec![]);
    for (i, (label, t, graceful)) in events.iter().enumerate() {
        let to = events.get(i + 1).map_or(t_end, |e| e.1);
        let w = window(&all, *t, to);
        println!(
            "  {label:<18} converged {:>8.1} ms  duplicates {:>4}  interleaved queues {:?}",
            w.convergence_ms, w.duplicates, w.interleaved
        );
        if *graceful {
            let (registered, started) = handover(&all, &log, *t, to);
            let ms = |us: u64| us as f64 / 1000.0;
            match registered {
                Some(r) => {
                    let h = started.map(|s| ms(s.saturating_sub(r)));
                    let c = w.convergence_ms - ms(r);
                    println!(
                        "      last joiner registered {:.1} ms after the first spawn; after it: queues handed over {:?} ms, consumed by their owners {c:.1} ms",
                        ms(r),
                        h
                    );
                    join_handover.extend(h);
                    join_consumed.push(c);
                }
                None => {
                    let h = started.map(ms);
                    println!("      queues handed over {h:?} ms after the SIGTERM");
                    leave_handover.extend(h);
                }
            }
        }
        if !w.interleaved.is_empty() {
            failures.push(format!(
                "{label}: two members consumed queues {:?}",
                w.interleaved
            ));
        }
        if *graceful {
            graceful_conv.push(w.convergence_ms);
            if w.duplicates > 0 {
                failures.push(format!(
                    "{label}: {} duplicates on a graceful change",
                    w.duplicates
                ));
            }
        }
    }
    for v in [&mut join_handover, &mut join_consumed, &mut leave_handover] {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "  joins ({} events, from the last registration): handed over p50 {:.1} / max {:.1} ms; consumed p50 {:.1} / max {:.1} ms",
        join_consumed.len(),
        percentile(&join_handover, 0.5),
        percentile(&join_handover, 1.0),
        percentile(&join_consumed, 0.5),
        percentile(&join_consumed, 1.0)
    );
    println!(
        "  leaves ({} events, from the SIGTERM): handed over p50 {:.1} / max {:.1} ms",
        leave_handover.len(),
        percentile(&leave_handover, 0.5),
        percentile(&leave_handover, 1.0)
    );
    graceful_conv.sort_by(f64::total_cmp);
    println!(
        "  graceful changes: convergence max {:.1} ms over {} events",
        graceful_conv.last().copied().unwrap_or_default(),
        graceful_conv.len()
    );
    println!("  killed member's queues taken over in {taken_kill:?} ms");
    println!("  frozen member's queues taken over in {taken_frozen:?} ms (session timeout {SESSION_MS} ms)");
    println!("  frozen member after resume: {resumed_at_all} deliveries, {stale} stale");
    // Nothing lost: every steady message up to the last one seen.
    let mut lost: Vec<String> = Vec::new();
    let mut sent = 0;
    for prefix in ["s-", "t-"] {
        let steady: BTreeSet<usize> = all
            .iter()
            .filter_map(|d| d.body.strip_prefix(prefix).and_then(|n| n.parse().ok()))
            .collect();
        let max = steady.iter().copied().max().unwrap_or(0);
        sent += max + 1;
        lost.extend(
            (0..max)
                .filter(|i| !steady.contains(i))
                .map(|i| format!("{prefix}{i}")),
        );
    }
    println!(
        "  {sent} steady messages, {} lost, {} deliveries",
        lost.len(),
        all.len()
    );
    assert!(lost.is_empty(), "lost: {:?}", &lost[..lost.len().min(20)]);
    assert_eq!(
        stale, 0,
        "the frozen member delivered stale messages after it resumed"
    );
    assert!(
        taken_kill.is_some_and(|ms| ms < 20_000.0),
        "the killed member's queues were not taken over"
    );
    assert!(
        taken_frozen.is_some_and(|ms| ms < (SESSION_MS + 10_000) as f64),
        "the frozen member's queues were not taken over"
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
