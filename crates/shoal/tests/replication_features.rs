//! Shoal's own features through a master failover of a replicated broker group, as separate
//! `shoal` processes on 127.0.0.1 (ports chosen at run time; the group of
//! [`support::replicas`]): delay levels, retries and dead-letter queues, and orderly
//! consumption under queue locks. Each test SIGKILLs the master at a moment chosen so that the
//! feature has work in flight, and checks what the consumers get from the new master.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::replicas::{in_sync_len, Replicas, LIMIT, TOPIC};
use support::{Dev, Proc};

/// One delivery a consumer printed: who got it, and the JSON line (`body`, `topic`, `queue`,
/// `queueOffset`, `reconsumeTimes`, `storeTimestamp`, `failed`, `atUs`).
#[derive(Debug, Clone)]
struct Delivery {
    member: String,
    v: Value,
}

impl Delivery {
    fn body(&self) -> &str {
        self.v["body"].as_str().unwrap_or_default()
    }

    fn queue(&self) -> i64 {
        self.v["queue"].as_i64().unwrap_or(-1)
    }

    fn offset(&self) -> i64 {
        self.v["queueOffset"].as_i64().unwrap_or(-1)
    }

    /// Where the message is stored: (topic, queue, queue offset).
    fn stored_at(&self) -> (String, i64, i64) {
        (
            self.v["topic"].as_str().unwrap_or_default().to_string(),
            self.queue(),
            self.offset(),
        )
    }

    /// When the listener got it, ms since the epoch.
    fn at_ms(&self) -> i64 {
        self.v["atUs"].as_i64().unwrap_or_default() / 1000
    }
}

/// `shoal consume` processes of one group, every delivery kept.
struct Readers {
    group: String,
    topic: String,
    procs: Vec<Proc>,
    seen: Arc<Mutex<Vec<Delivery>>>,
}

impl Readers {
    fn new(group: &str, topic: &str) -> Readers {
        Readers {
            group: group.to_string(),
            topic: topic.to_string(),
            procs: Vec::new(),
            seen: Arc::default(),
        }
    }

    /// Starts member `member` (from the first message) with `extra` arguments.
    fn join(&mut self, dev: &Dev, member: &str, extra: &[&str]) {
        let mut args = vec![
            "consume",
            &self.topic,
            "--group",
            &self.group,
            "--json",
            "--from",
            "first",
            "--instance",
            member,
        ];
        args.extend_from_slice(extra);
        let mut child = dev.spawn(&args);
        let stdout = child.stdout.take().unwrap();
        let seen = self.seen.clone();
        let member = member.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                seen.lock().unwrap().push(Delivery {
                    member: member.clone(),
                    v,
                });
            }
        });
        self.procs.push(Proc { child });
    }

    fn all(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }

    /// The deliveries of `body`.
    fn of(&self, body: &str) -> Vec<Delivery> {
        self.all()
            .into_iter()
            .filter(|d| d.body() == body)
            .collect()
    }

    /// Waits until `ok` holds for the deliveries so far.
    fn wait(&self, what: &str, ok: impl Fn(&[Delivery]) -> bool) {
        let deadline = Instant::now() + LIMIT;
        while !ok(&self.all()) {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every body of `bodies` was delivered at least once.
    fn wait_bodies(&self, what: &str, bodies: &[String]) {
        self.wait(what, |seen| {
            let got: BTreeSet<&str> = seen.iter().map(Delivery::body).collect();
            bodies.iter().all(|b| got.contains(b.as_str()))
        });
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        for p in &mut self.procs {
            p.sigkill();
        }
    }
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Waits for a master with all three in sync and creates [`TOPIC`] (4 queues) on it; returns
/// the master's epoch and index.
fn with_topic(r: &Replicas) -> (u64, usize) {
    let g = r.wait_group("no master with three in sync", |g| {
        g["master"].is_u64() && in_sync_len(g) == 3
    });
    let epoch = g["masterEpoch"].as_u64().unwrap();
    let master = r.index_of(&g, g["master"].as_u64().unwrap());
    let master_addr = r.brokers[master].0.clone();
    r.cluster.json(&[
        "topic",
        "create",
        TOPIC,
        "--queues",
        "4",
        "--brokers",
        &master_addr,
        "--json",
    ]);
    (epoch, master)
}

/// Sends `count` messages `<prefix>-<i>` through `shoal send` with `extra` arguments; every
/// one must be acknowledged.
fn send(dev: &Dev, prefix: &str, count: usize, extra: &[&str]) -> Vec<String> {
    let body = format!("{prefix}-{{i}}");
    let n = count.to_string();
    let mut args = vec!["send", TOPIC, "--body", &body, "--count", &n, "--json"];
    args.extend_from_slice(extra);
    let out = dev.cmd(&args);
    assert!(
        out.status.success(),
        "send failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let acked = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("\"n\""))
        .count();
    assert_eq!(acked, count, "not every send was acknowledged");
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

/// SIGKILLs the master; returns once another broker is elected (and its index).
fn kill_master(r: &mut Replicas, master: usize, epoch: u64) -> usize {
    r.kill_broker(master);
    let g = r.wait_group("no new master elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    let new_master = r.index_of(&g, g["master"].as_u64().unwrap());
    assert_ne!(new_master, master);
    new_master
}

/// Per body of `bodies`, where its deliveries were stored (one place: stored once; the same
/// place more than once is a redelivery, not a second copy).
fn copies(readers: &Readers, bodies: &[String]) -> BTreeMap<String, BTreeSet<(String, i64, i64)>> {
    let all = readers.all();
    bodies
        .iter()
        .map(|b| {
            let places = all
                .iter()
                .filter(|d| d.body() == b)
                .map(Delivery::stored_at)
                .collect();
            (b.clone(), places)
        })
        .collect()
}

/// Scheduled messages (delay level 2, 5 s, and level 3, 10 s) are acknowledged by the first
/// master. It is SIGKILLed right after it delivered the level-2 ones (its last delay progress
/// may not have reached its replicas yet) and before the level-3 ones are due. The new master
/// delivers the level-3 ones, and nothing is delivered twice: every scheduled message is
/// stored in its topic exactly once, never before its due time.
#[test]
fn scheduled_messages_are_delivered_once_across_a_failover() {
    let mut r = Replicas::start();
    let (epoch, master) = with_topic(&r);
    let mut readers = Readers::new("delay-readers", TOPIC);
    readers.join(&r.cluster.dev, "c1", &[]);
    let ready = send(&r.cluster.dev, "ready", 1, &[]);
    readers.wait_bodies("the consumer never got going", &ready);

    let t0 = wall_ms();
    let early = send(&r.cluster.dev, "early", 10, &["--delay-level", "2"]);
    let late = send(&r.cluster.dev, "late", 10, &["--delay-level", "3"]);
    readers.wait_bodies("the level-2 messages were not delivered", &early);
    // At once: the old master's last delay progress is likely not replicated yet.
    let new_master = kill_master(&mut r, master, epoch);
    let elected_ms = wall_ms() - t0;
    readers.wait_bodies(
        "the level-3 messages were not delivered after the failover",
        &late,
    );
    // Time for a second copy of anything to show up (the scheduler runs every level at once
    // when it starts).
    std::thread::sleep(Duration::from_secs(3));

    let due = |b: &str| {
        t0 + if b.starts_with("early") {
            5_000
        } else {
            10_000
        }
    };
    let bodies: Vec<String> = early.iter().chain(&late).cloned().collect();
    let all = readers.all();
    let mut redelivered = 0;
    for (body, places) in copies(&readers, &bodies) {
        assert_eq!(
            places.len(),
            1,
            "{body} was stored {} times in its topic: {places:?}",
            places.len()
        );
        for d in all.iter().filter(|d| d.body() == body) {
            assert!(
                d.at_ms() >= due(&body),
                "{body} delivered {} ms before it was due",
                due(&body) - d.at_ms()
            );
            assert!(
                d.v["storeTimestamp"].as_i64().unwrap() >= due(&body),
                "{body} stored in its topic before it was due: {:?}",
                d.v
            );
        }
        redelivered += all.iter().filter(|d| d.body() == body).count() - 1;
    }
    let late_at: Vec<i64> = late
        .iter()
        .flat_map(|b| readers.of(b))
        .map(|d| d.at_ms() - t0)
        .collect();
    eprintln!(
        "delay levels across a failover: new master (broker {new_master}) elected {elected_ms} ms after the first send; \
         level-3 messages (due at 10,000 ms) consumed at {}..{} ms; every scheduled message stored once; \
         {redelivered} deliveries repeated from an older committed offset",
        late_at.iter().min().unwrap(),
        late_at.iter().max().unwrap()
    );
}

/// Delay levels with level 3 (a message's first retry) at 20 s, so that a retry scheduled
/// before the failover is due well after it.
const SLOW_RETRY_LEVELS: &str = "1s 5s 20s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h";

/// Waits until `group` committed every message of [`TOPIC`] at the master, then for a few
/// metadata rounds (500 ms each), so that the committed offsets are in the replicas' logs.
fn wait_committed(r: &Replicas, group: &str) {
    let deadline = Instant::now() + LIMIT;
    loop {
        let out = r
            .cluster
            .dev
            .cmd(&["group", "progress", group, "--topic", TOPIC, "--json"]);
        let done = out.status.success()
            && serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|v| {
                v["queues"].as_array().is_some_and(|qs| {
                    !qs.is_empty()
                        && qs.iter().all(|q| {
                            q["consumerOffset"].as_i64().is_some()
                                && q["consumerOffset"] == q["brokerOffset"]
                        })
                })
            });
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{group} did not commit what it consumed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(1_500));
}

/// Two groups fail every `doomed-*` message: `retry-readers` (at most one reconsume) sends
/// each back for a retry, `dead-now` (none) sends each to its dead-letter queue at once. The
/// master is SIGKILLed while the retries are scheduled (level 3, set to 20 s here) and the
/// dead letters of `dead-now` are stored. The new master delivers each retry once (stored once
/// in `%RETRY%retry-readers`); it fails again and lands in `%DLQ%retry-readers`; both DLQs,
/// read after the failover, hold each message exactly once.
#[test]
fn retries_and_dead_letters_are_kept_across_a_failover() {
    let mut r = Replicas::start_with(1, |dir| {
        let path = dir.join("broker.toml");
        std::fs::write(&path, format!("delay_levels = \"{SLOW_RETRY_LEVELS}\"\n")).unwrap();
        vec!["--config".into(), path.to_str().unwrap().into()]
    });
    let (epoch, master) = with_topic(&r);
    let mut retrying = Readers::new("retry-readers", TOPIC);
    let mut dying = Readers::new("dead-now", TOPIC);
    for (readers, max) in [(&mut retrying, "1"), (&mut dying, "0")] {
        let args = ["--fail", "doomed", "--max-reconsume-times", max];
        readers.join(&r.cluster.dev, "c1", &args);
    }
    let ready = send(&r.cluster.dev, "ready", 1, &[]);
    retrying.wait_bodies("the retrying consumer never got going", &ready);
    dying.wait_bodies("the dying consumer never got going", &ready);

    let tries = |readers: &Readers, body: &str, reconsumed: i64| {
        readers
            .of(body)
            .into_iter()
            .filter(|d| d.v["reconsumeTimes"].as_i64() == Some(reconsumed))
            .count()
    };
    let doomed = send(&r.cluster.dev, "doomed", 5, &[]);
    retrying.wait("the messages were not tried", |_| {
        doomed.iter().all(|m| tries(&retrying, m, 0) > 0)
    });
    dying.wait("the messages were not tried", |_| {
        doomed.iter().all(|m| tries(&dying, m, 0) > 0)
    });
    // What they consumed is committed and replicated: the new master does not deliver the
    // originals again (which would be tried, and sent back, once more).
    wait_committed(&r, "retry-readers");
    wait_committed(&r, "dead-now");
    let killed_ms = wall_ms();
    kill_master(&mut r, master, epoch);
    retrying.wait("the retries were not delivered after the failover", |_| {
        doomed.iter().all(|m| tries(&retrying, m, 1) > 0)
    });
    let retried_ms = wall_ms() - killed_ms;
    // Time for a second retry of anything to show up.
    std::thread::sleep(Duration::from_secs(3));
    for m in &doomed {
        let retries: Vec<Delivery> = retrying
            .of(m)
            .into_iter()
            .filter(|d| d.v["reconsumeTimes"].as_i64() == Some(1))
            .collect();
        let places: BTreeSet<_> = retries.iter().map(Delivery::stored_at).collect();
        assert_eq!(places.len(), 1, "{m}: retried {retries:?}");
        // Stored by the new master: the old one was dead by then.
        assert!(
            retries
                .iter()
                .all(|d| d.v["storeTimestamp"].as_i64().unwrap() >= killed_ms),
            "{m}: retried before the failover: {retries:?}"
        );
        assert_eq!(
            tries(&retrying, m, 2),
            0,
            "{m} tried after its last reconsume"
        );
        assert_eq!(
            tries(&dying, m, 1),
            0,
            "{m} retried with no reconsume allowed"
        );
    }

    // The dead-letter queues, after the failover: each message exactly once.
    for group in ["retry-readers", "dead-now"] {
        let mut dead = Readers::new(&format!("dlq-of-{group}"), &format!("%DLQ%{group}"));
        dead.join(&r.cluster.dev, "d1", &[]);
        dead.wait_bodies(
            &format!("not every failed message of {group} reached its DLQ"),
            &doomed,
        );
        std::thread::sleep(Duration::from_secs(2));
        for (body, places) in copies(&dead, &doomed) {
            assert_eq!(places.len(), 1, "{body} in the DLQ of {group}: {places:?}");
        }
    }
    eprintln!(
        "retries across a failover: the retries (due 20 s after the first attempt) consumed {retried_ms} ms after the master was killed; \
         5 dead letters per group, each stored once"
    );
}

/// `shoal send` processes, one per sharding key `k<K>` (each key's messages go to one queue,
/// in order), sending `k<K>-<i>` every 20 ms; the acknowledged numbers kept per key.
struct OrderedProducers {
    procs: Vec<Proc>,
    acked: Arc<Mutex<BTreeMap<String, Vec<u64>>>>,
}

impl OrderedProducers {
    fn start(dev: &Dev, keys: usize) -> OrderedProducers {
        let acked: Arc<Mutex<BTreeMap<String, Vec<u64>>>> = Arc::default();
        let procs = (0..keys)
            .map(|k| {
                let key = format!("k{k}");
                let body = format!("{key}-{{i}}");
                let mut child = std::process::Command::new(support::shoal())
                    .args(["send", TOPIC, "--body", &body, "--sharding-key", &key])
                    .args(["--count", "1000000", "--interval-ms", "20", "--json"])
                    .env("SHOAL_NAMESRV", &dev.namesrv)
                    .stdout(std::process::Stdio::piped())
                    .stderr(support::log_sink(&format!("ordered-{key}")))
                    .spawn()
                    .unwrap();
                let stdout = child.stdout.take().unwrap();
                let acked = acked.clone();
                std::thread::spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        let Ok(v) = serde_json::from_str::<Value>(&line) else {
                            continue;
                        };
                        if let Some(n) = v["n"].as_u64() {
                            acked
                                .lock()
                                .unwrap()
                                .entry(key.clone())
                                .or_default()
                                .push(n);
                        }
                    }
                });
                Proc { child }
            })
            .collect();
        OrderedProducers { procs, acked }
    }

    fn count(&self) -> usize {
        self.acked.lock().unwrap().values().map(Vec::len).sum()
    }

    /// Stops sending; returns every acknowledged body with its key and its rank among the
    /// key's acknowledged messages (a send that failed during the failover has no rank).
    fn stop(&mut self) -> BTreeMap<String, (String, usize)> {
        for p in &mut self.procs {
            p.sigkill();
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut out = BTreeMap::new();
        for (k, ns) in self.acked.lock().unwrap().iter() {
            let mut ns = ns.clone();
            ns.sort_unstable();
            for (rank, n) in ns.iter().enumerate() {
                out.insert(format!("{k}-{n}"), (k.clone(), rank));
            }
        }
        out
    }
}

/// Two orderly members of a classic group (queue locks through LOCK_BATCH_MQ) share the 4
/// queues while ordered producers send. Member `c1` is frozen (SIGSTOP) and the master
/// SIGKILLed: `c2` reaches the new master alone, sees itself as the only member and asks for
/// every queue's lock, while `c1`'s locks still have their lease by its own clock. `c1` is
/// thawed 3 s after the election. Every acknowledged message is consumed afterwards; in time
/// order, every key's messages are consumed in order (a message only once all before it were,
/// a redelivery going back to an older committed offset allowed); and no queue is consumed by
/// two members at once: a member that gets a queue back after another member consumed from
/// it starts again from what that member committed, never where its own old run stopped
/// (which would mean it never let go). The new master adopted the old one's locks, so `c2`
/// was refused `c1`'s queues: they stay with `c1`, which came back within its lease.
#[test]
fn orderly_consumption_keeps_one_member_per_queue_across_a_failover() {
    let mut r = Replicas::start();
    let (epoch, master) = with_topic(&r);
    let mut readers = Readers::new("orderly-readers", TOPIC);
    let args = ["--orderly", "--protocol", "classic"];
    readers.join(&r.cluster.dev, "c1", &args);
    readers.join(&r.cluster.dev, "c2", &args);
    let mut producers = OrderedProducers::start(&r.cluster.dev, 4);
    // Both members consume for a while.
    readers.wait("both members did not consume", |seen| {
        let members: BTreeSet<&str> = seen.iter().map(|d| d.member.as_str()).collect();
        members.len() == 2 && seen.len() > 200
    });
    let before = producers.count();
    let c1 = readers.procs[0].child.id().to_string();
    let signal = |s: &str| {
        let ok = std::process::Command::new("kill")
            .args([s, &c1])
            .status()
            .unwrap();
        assert!(ok.success());
    };
    // Hand-overs before the fault are the group's start-up rebalance, not the failover's.
    let fault_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    signal("-STOP");
    kill_master(&mut r, master, epoch);
    std::thread::sleep(Duration::from_secs(3));
    signal("-CONT");
    let deadline = Instant::now() + LIMIT;
    while producers.count() < before + 200 {
        assert!(
            Instant::now() < deadline,
            "sends did not resume after the failover"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let ranks = producers.stop();
    let acked: Vec<String> = ranks.keys().cloned().collect();
    readers.wait_bodies("not every acknowledged message was consumed", &acked);
    let key_and_n = |body: &str| ranks.get(body).map(|(k, n)| (k.as_str(), *n));

    let mut all = readers.all();
    all.sort_by_key(|d| d.v["atUs"].as_i64().unwrap_or_default());
    // Order per key: the key's n-th acknowledged message only after every one before it.
    let mut next: BTreeMap<String, usize> = BTreeMap::new();
    let mut redelivered = 0;
    for d in &all {
        let Some((k, n)) = key_and_n(d.body()) else {
            continue;
        };
        let high = next.entry(k.to_string()).or_insert(0);
        assert!(
            n <= *high,
            "{} consumed before the key's acknowledged message #{} ({d:?})",
            d.body(),
            *high
        );
        if n < *high {
            redelivered += 1;
        }
        *high = (*high).max(n + 1);
    }
    // One member per queue at a time: runs of one member on a queue, in time order.
    let mut handovers = 0;
    // Per key (each key's messages are on one queue).
    let mut runs: BTreeMap<String, Vec<(String, usize, usize)>> = BTreeMap::new();
    for d in all
        .iter()
        .filter(|d| d.v["atUs"].as_i64().unwrap_or_default() >= fault_us)
    {
        let Some((k, n)) = key_and_n(d.body()) else {
            continue;
        };
        let q = runs.entry(k.to_string()).or_default();
        match q.last_mut() {
            Some((m, _, last)) if *m == d.member => *last = n,
            _ => q.push((d.member.clone(), n, n)),
        }
    }
    for (key, q) in &runs {
        handovers += q.len() - 1;
        assert!(
            q.iter().all(|r| r.0 == q[0].0),
            "key {key} changed hands although its holder came back within its lease: {q:?}"
        );
        for (i, (member, first, _)) in q.iter().enumerate() {
            // This member's previous run on the queue, and what others consumed since.
            let Some(j) = (0..i).rev().find(|j| q[*j].0 == *member) else {
                continue;
            };
            let others_went_to = q[j + 1..i].iter().map(|r| r.2).max().unwrap_or(0);
            assert!(
                !(*first == q[j].2 + 1 && others_went_to >= *first),
                "key {key}: {member} went on from {} after another member consumed up to {others_went_to} meanwhile: {q:?}",
                q[j].2
            );
        }
    }
    eprintln!(
        "orderly consumption across a failover: {} acknowledged, {} deliveries, {redelivered} repeated, {handovers} queue hand-overs; runs per key (member, first, last): {runs:?}",
        acked.len(),
        all.len()
    );
}

/// POP consumption (`shoal consume --pop`) across a failover. The consumer fails every
/// `held-*` message (each is made invisible for 20 s) and acknowledges every `done-*` one,
/// sent after them, so each queue's acked offset stays below the acknowledged messages. Once
/// a few metadata rounds carried the leases to the replicas, the master is SIGKILLed. The new
/// master adopted the old one's leases and acknowledgements: no `done-*` message is delivered
/// again, no `held-*` one before its lease ends, and after it each comes back (attempt 2,
/// revived by the new master). Messages sent after the failover are consumed.
#[test]
fn pop_leases_and_acknowledgements_are_kept_across_a_failover() {
    const RETRY_SECS: i64 = 20;
    let mut r = Replicas::start();
    let (epoch, master) = with_topic(&r);
    let mut readers = Readers::new("pop-readers", TOPIC);
    let retry = RETRY_SECS.to_string();
    readers.join(
        &r.cluster.dev,
        "p1",
        &["--pop", "--fail", "held", "--retry-delay-secs", &retry],
    );
    let held = send(&r.cluster.dev, "held", 12, &[]);
    let done = send(&r.cluster.dev, "done", 12, &[]);
    let before: Vec<String> = held.iter().chain(&done).cloned().collect();
    readers.wait_bodies("the POP consumer did not get every message", &before);
    // Leases and acknowledgements reach the replicas' logs within a few rounds (500 ms each).
    std::thread::sleep(Duration::from_millis(2_000));
    let t_kill = wall_ms();
    let new_master = kill_master(&mut r, master, epoch);
    let elected_ms = wall_ms() - t_kill;
    let after = send(&r.cluster.dev, "after", 12, &[]);
    readers.wait_bodies("messages sent after the failover were not consumed", &after);
    // Each held message comes back once its lease (from its failure) ended.
    readers.wait(
        "the held messages did not come back after their leases",
        |seen| {
            held.iter().all(|b| {
                seen.iter()
                    .filter(|d| d.body() == b)
                    .any(|d| d.v["attempt"].as_u64() == Some(2))
            })
        },
    );
    let all = readers.all();
    for b in &done {
        let n = all.iter().filter(|d| d.body() == b).count();
        assert_eq!(
            n, 1,
            "{b}, acknowledged before the failover, delivered {n} times"
        );
    }
    let mut back_after = Vec::new();
    for b in &held {
        let mut ds: Vec<&Delivery> = all.iter().filter(|d| d.body() == b).collect();
        ds.sort_by_key(|d| d.at_ms());
        let first = ds[0].at_ms();
        let second = ds
            .iter()
            .find(|d| d.v["attempt"].as_u64() == Some(2))
            .unwrap();
        assert!(
            ds[1].v["attempt"].as_u64() == Some(2),
            "{b} delivered again under its lease: {:?}",
            ds.iter().map(|d| &d.v).collect::<Vec<_>>()
        );
        assert!(
            second.at_ms() >= first + RETRY_SECS * 1_000 - 500,
            "{b} came back {} ms after its first delivery, before its {RETRY_SECS} s lease ended",
            second.at_ms() - first
        );
        back_after.push(second.at_ms() - first);
    }
    for b in &after {
        assert!(all
            .iter()
            .any(|d| d.body() == b && !d.v["failed"].as_bool().unwrap_or(true)));
    }
    eprintln!(
        "POP across a failover: new master (broker {new_master}) elected {elected_ms} ms after the kill; \
         {} acknowledged messages not delivered again; {} leased messages back {}..{} ms after their first delivery ({RETRY_SECS} s leases)",
        done.len(),
        held.len(),
        back_after.iter().min().unwrap(),
        back_after.iter().max().unwrap()
    );
}
