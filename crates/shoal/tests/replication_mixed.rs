//! Two replicated broker groups and a mix of consumers, as separate processes on 127.0.0.1
//! (ports chosen at run time): one name server, one controller voter, three brokers of
//! `broker-a` and three of `broker-b`. A topic has 4 queues on each group; a Shoal producer
//! sends every 10 ms, and three consumer groups read it: a coordinated Shoal group of two
//! members, a classic Shoal group of two members, and a group of two official Go clients
//! (`rocketmq-go-check consume`, built by `.ci/setup.d/30-go-client.sh`; without it, that
//! group is skipped with a message).
//!
//! Then, under load: broker-a's master is SIGKILLed and a replica elected; that group's other
//! replica is SIGKILLed (the new master goes on alone); the old master is restarted and rejoins
//! as a replica. Checked: every acknowledged message is consumed by every group; no queue is
//! consumed by two members of a group at once (per queue, a member's deliveries never alternate
//! with another's over the same messages); the old master rejoins the in-sync set under the
//! new master. Printed per change: when sends to broker-a resumed (or the longest time between
//! two of its acknowledgements), when each group first consumed from broker-a a message
//! acknowledged after the change, and when the in-sync set changed.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::cluster::{Line, SteadyProducer, TrackedGroup};
use support::replicas::{
    acknowledged, check_history, in_sync_len, wait_all_consumed, wait_sends, Replicas, LIMIT,
};
use support::{log_sink, Proc, Seen};

const TOPIC: &str = "Mixed";
const A: &str = "broker-a";
const B: &str = "broker-b";

/// The Go client's program, when it is built with its `consume` mode.
fn go_consumer() -> Option<PathBuf> {
    let bin = support::external::repo_root().join("target/external/rocketmq-go-check");
    if !bin.is_file() {
        support::external::skip(
            "the official Go client group: target/external/rocketmq-go-check is not built (.ci/setup.d/30-go-client.sh)",
        );
        return None;
    }
    // Its usage line names the modes it has.
    let out = Command::new(&bin).output().ok()?;
    if !String::from_utf8_lossy(&out.stdout).contains("consume NAMESRV") {
        support::external::skip(
            "the official Go client group: target/external/rocketmq-go-check predates its consume mode (rerun .ci/setup.d/30-go-client.sh)",
        );
        return None;
    }
    Some(bin)
}

/// Starts a Go client as member `member` of `g`; its lines go where a Shoal member's do.
fn join_go(g: &mut TrackedGroup, bin: &Path, namesrv: &str, home: &Path, member: &str) {
    let mut child = Command::new(bin)
        .args(["consume", namesrv, &g.group.name, &g.group.topic, member])
        // The client writes its own log under HOME.
        .env("HOME", home)
        .stdout(Stdio::piped())
        .stderr(log_sink(&format!("go-{member}")))
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (seen, lines) = (g.group.seen.clone(), g.lines.clone());
    let who = member.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let at = Instant::now();
            let body = v["body"].as_str().unwrap_or_default().to_string();
            lines.lock().unwrap().push(Line {
                at,
                broker: v["broker"].as_str().unwrap_or_default().to_string(),
                queue: v["queue"].as_i64().unwrap_or(-1),
                body: body.clone(),
                member: who.clone(),
                at_us: v["atUs"].as_u64().unwrap_or_default(),
                offset: v["queueOffset"].as_i64().unwrap_or(-1),
            });
            seen.lock().unwrap().push(Seen {
                consumer: who.clone(),
                msg_id: v["msgId"].as_str().unwrap_or_default().to_string(),
                queue: v["queue"].as_i64().unwrap_or(-1),
                body,
                at,
            });
        }
    });
    g.group.members.insert(member.to_string(), Proc { child });
}

/// Group `name` with a master and all three in sync: (its master epoch, the master's index).
fn settled(r: &Replicas, name: &str) -> (u64, usize) {
    let g = r.wait_group_named(
        name,
        &format!("{name}: no master with three in sync"),
        |g| g["master"].is_u64() && in_sync_len(g) == 3,
    );
    let master = r.index_of(&g, g["master"].as_u64().unwrap());
    (g["masterEpoch"].as_u64().unwrap(), master)
}

/// The time from `since` until `group` first consumed from `broker` a message that broker
/// acknowledged after `since`; waits for it.
fn consumed_again(
    group: &TrackedGroup,
    producer: &SteadyProducer,
    broker: &str,
    since: Instant,
) -> Duration {
    let deadline = Instant::now() + LIMIT;
    loop {
        let after: BTreeSet<String> = producer
            .sent
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.broker == broker && l.at > since)
            .map(|l| l.body.clone())
            .collect();
        let first = group
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.broker == broker && after.contains(&l.body))
            .map(|l| l.at)
            .min();
        if let Some(at) = first {
            return at - since;
        }
        assert!(
            Instant::now() < deadline,
            "{}: nothing acknowledged by {broker} after the change was consumed",
            group.group.name
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The time from `since` until `broker` acknowledged a send that began after `since` (one
/// acknowledged 50 ms after it at the earliest: a send in flight at `since` is not one);
/// waits for it.
fn sends_again(producer: &SteadyProducer, broker: &str, since: Instant) -> Duration {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(at) = producer.first_to(broker, since + Duration::from_millis(50)) {
            return at - since;
        }
        assert!(
            Instant::now() < deadline,
            "{broker} acknowledged no send after the change"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The longest time between two acknowledgements by `broker` from `since` (counted from
/// `since` itself) until `until`.
fn longest_gap_to(
    producer: &SteadyProducer,
    broker: &str,
    since: Instant,
    until: Instant,
) -> Duration {
    let mut at: Vec<Instant> = producer
        .sent
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.broker == broker && l.at >= since && l.at <= until)
        .map(|l| l.at)
        .collect();
    at.sort();
    at.push(until);
    let mut last = since;
    let mut gap = Duration::ZERO;
    for t in at {
        gap = gap.max(t - last);
        last = t;
    }
    gap
}

/// What a group's deliveries show, per queue (broker group and queue id).
#[derive(Debug, Default)]
struct Exclusivity {
    /// Queues two members consumed at once.
    shared: Vec<(String, i64)>,
    /// Times a queue's deliveries passed from one member to another.
    handovers: usize,
    /// Deliveries beyond the first of each message.
    again: usize,
}

/// Per queue, the deliveries from `from_us` on in the order the consumers got them, as runs of
/// one member each. A member that consumes a queue again after another member did (X, Y, X)
/// either got it back, and then starts where it was told to (the committed offset, past Y's
/// messages or, after a failover, below its own), or never let go, and then takes up at the
/// offset after its last one: that is two members consuming the queue at once.
fn exclusivity(group: &TrackedGroup, from_us: u64, origin_us: u64) -> Exclusivity {
    let lines: Vec<Line> = group
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.at_us >= from_us)
        .cloned()
        .collect();
    let mut by_queue: BTreeMap<(String, i64), Vec<&Line>> = BTreeMap::new();
    for l in &lines {
        by_queue
            .entry((l.broker.clone(), l.queue))
            .or_default()
            .push(l);
    }
    let mut out = Exclusivity::default();
    let rel = |us: u64| (us as i64 - origin_us as i64) / 1000;
    for (q, list) in by_queue.iter_mut() {
        list.sort_by_key(|l| l.at_us);
        // (member, deliveries, lowest and highest offset, first and last ms from the origin)
        let mut runs: Vec<(&str, usize, i64, i64, i64, i64)> = Vec::new();
        for l in list.iter() {
            match runs.last_mut() {
                Some(r) if r.0 == l.member => {
                    r.1 += 1;
                    r.2 = r.2.min(l.offset);
                    r.3 = r.3.max(l.offset);
                    r.5 = rel(l.at_us);
                }
                _ => runs.push((&l.member, 1, l.offset, l.offset, rel(l.at_us), rel(l.at_us))),
            }
        }
        out.handovers += runs.len() - 1;
        let went_on = runs.iter().enumerate().any(|(i, a)| {
            runs[i + 1..]
                .iter()
                .skip(1)
                .find(|b| b.0 == a.0)
                .is_some_and(|b| b.2 == a.3 + 1)
        });
        if went_on {
            out.shared.push(q.clone());
            eprintln!(
                "{} {q:?}: runs (member, deliveries, offsets, ms from the first kill) {runs:?}",
                group.group.name
            );
        }
    }
    let distinct: BTreeSet<&str> = lines.iter().map(|l| l.body.as_str()).collect();
    out.again = lines.len() - distinct.len();
    out
}

/// Waits until, over the last second, each of the topic's 8 queues was consumed by exactly one
/// member of `group`; returns the start of that second (µs since the epoch).
fn settled_from(group: &TrackedGroup) -> u64 {
    let deadline = Instant::now() + LIMIT;
    loop {
        let from = now_us().saturating_sub(1_000_000);
        let mut owners: BTreeMap<(String, i64), BTreeSet<String>> = BTreeMap::new();
        for l in group
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.at_us >= from)
        {
            owners
                .entry((l.broker.clone(), l.queue))
                .or_default()
                .insert(l.member.clone());
        }
        owners.retain(|(_, q), _| *q >= 0);
        if owners.len() == 8 && owners.values().all(|o| o.len() == 1) {
            return from;
        }
        assert!(
            Instant::now() < deadline,
            "{}: its queues never had one member each: {owners:?}",
            group.group.name
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

#[test]
fn two_groups_mixed_consumers_through_master_then_replica_killed_and_old_master_back() {
    let mut r = Replicas::start_groups(&[A, B]);
    let (epoch, master) = settled(&r, A);
    let (_, master_b) = settled(&r, B);
    let masters = format!("{},{}", r.brokers[master].0, r.brokers[master_b].0);
    r.cluster.json(&[
        "topic",
        "create",
        TOPIC,
        "--queues",
        "4",
        "--brokers",
        &masters,
        "--json",
    ]);
    // The name server routes the topic to both groups' 4 queues.
    let deadline = Instant::now() + LIMIT;
    let queues = || {
        let out = r.cluster.dev.cmd(&["topic", "status", TOPIC, "--json"]);
        serde_json::from_slice::<Value>(&out.stdout)
            .ok()
            .and_then(|v| v.as_array().map(Vec::len))
            .unwrap_or(0)
    };
    while queues() != 8 {
        assert!(Instant::now() < deadline, "{TOPIC} never had 8 queues");
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut producer = SteadyProducer::start(&r.cluster.dev, TOPIC, "x", 10);
    let mut coordinated = TrackedGroup::new("mixed-coordinated", TOPIC);
    let mut classic = TrackedGroup::new("mixed-classic", TOPIC);
    for m in ["c1", "c2"] {
        coordinated.join(&r.cluster.dev, m, &["--protocol", "coordinated"]);
        classic.join(&r.cluster.dev, m, &["--protocol", "classic"]);
    }
    let home = r.cluster.dev.dir.path().join("go-home");
    std::fs::create_dir_all(&home).unwrap();
    let mut official = go_consumer().map(|bin| {
        let mut g = TrackedGroup::new("mixed-official", TOPIC);
        for m in ["g1", "g2"] {
            join_go(&mut g, &bin, &r.cluster.dev.namesrv, &home, m);
        }
        g
    });
    // Every group consumes, from both broker groups.
    wait_sends(&producer, 200, "too few sends acknowledged at first");
    let first = acknowledged(&producer);
    let mut groups: Vec<&TrackedGroup> = vec![&coordinated, &classic];
    groups.extend(official.as_ref());
    for g in &groups {
        wait_all_consumed(g, &first);
    }
    // Shoal members are exclusive from the start (they lock their queues at the broker); an
    // official concurrent consumer does not lock, and may start a queue another member still
    // consumes while the group forms (RocketMQ's own guarantee: agreement once every member
    // saw the change), so the official group is checked from the point each of its queues
    // had one member.
    let mut checked_from = vec![0, 0];
    checked_from.extend(official.as_ref().map(settled_from));
    // The Shoal groups run in the mode they were started in.
    for (g, mode) in [(&coordinated, "coordinated"), (&classic, "classic")] {
        let d = r
            .cluster
            .json(&["group", "describe", &g.group.name, "--json"]);
        assert_eq!(d["mode"], mode, "{d}");
    }

    // 1. broker-a's master is SIGKILLed; a replica is elected.
    let killed = Instant::now();
    let killed_us = now_us();
    r.kill_broker(master);
    let g = r.wait_group_named(A, "no new master elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    let elected = killed.elapsed();
    let new_master = r.index_of(&g, g["master"].as_u64().unwrap());
    assert_ne!(new_master, master);
    let new_epoch = g["masterEpoch"].as_u64().unwrap();
    let replica = (0..3).find(|i| *i != master && *i != new_master).unwrap();
    let sends_1 = sends_again(&producer, A, killed);
    let consumed_1: Vec<Duration> = groups
        .iter()
        .map(|g| consumed_again(g, &producer, A, killed))
        .collect();

    // 2. broker-a's other replica is SIGKILLed: the new master goes on alone.
    let replica_killed = Instant::now();
    r.kill_broker(replica);
    r.wait_group_named(A, "the killed replica stayed in the in-sync set", |g| {
        in_sync_len(g) == 1
    });
    let shrunk = replica_killed.elapsed();
    let consumed_2: Vec<Duration> = groups
        .iter()
        .map(|g| consumed_again(g, &producer, A, replica_killed))
        .collect();
    wait_sends(&producer, 100, "sends stopped with broker-a's master alone");
    let gap_2 = longest_gap_to(&producer, A, replica_killed, Instant::now());

    // 3. The old master starts again and rejoins as a replica of the new one.
    let restarted = Instant::now();
    r.start_broker(master);
    let g = r.wait_group_named(A, "the old master did not rejoin the in-sync set", |g| {
        in_sync_len(g) == 2
    });
    let rejoined = restarted.elapsed();
    assert_eq!(g["masterEpoch"].as_u64(), Some(new_epoch), "{g}");
    assert_eq!(r.index_of(&g, g["master"].as_u64().unwrap()), new_master);
    let old_id = r.id_of(&g, master);
    assert!(
        g["inSync"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v.as_u64() == Some(old_id)),
        "{g}"
    );
    let consumed_3: Vec<Duration> = groups
        .iter()
        .map(|g| consumed_again(g, &producer, A, restarted))
        .collect();
    wait_sends(
        &producer,
        100,
        "sends stopped after the old master rejoined",
    );
    let gap_3 = longest_gap_to(&producer, A, restarted, Instant::now());
    let gap_b = longest_gap_to(&producer, B, killed, Instant::now());

    // Every acknowledged message is consumed by every group, each queue by one member at a
    // time.
    let acked: BTreeSet<String> = producer.stop().into_iter().collect();
    let failed = producer.failed.lock().unwrap().len();
    for g in &groups {
        wait_all_consumed(g, &acked);
    }
    // The Shoal members print where each message was stored.
    for g in [&coordinated, &classic] {
        check_history(&producer, g);
    }
    let names: Vec<&str> = groups.iter().map(|g| g.group.name.as_str()).collect();
    let figures = |d: &[Duration]| -> String {
        names
            .iter()
            .zip(d)
            .map(|(n, d)| format!("{n} {}", ms(*d)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    eprintln!(
        "mixed groups: {} acknowledged, {failed} sends failed, all consumed by {}",
        acked.len(),
        names.join(", ")
    );
    eprintln!(
        "1. broker-a's master killed: new master after {}, sends to broker-a again after {}; consumed again after: {}",
        ms(elected),
        ms(sends_1),
        figures(&consumed_1)
    );
    eprintln!(
        "2. broker-a's replica killed: out of the in-sync set after {}, longest time between two acknowledgements by broker-a {}; consumed again after: {}",
        ms(shrunk),
        ms(gap_2),
        figures(&consumed_2)
    );
    eprintln!(
        "3. the old master restarted: in sync after {}, longest time between two acknowledgements by broker-a {}; consumed again after: {}",
        ms(rejoined),
        ms(gap_3),
        figures(&consumed_3)
    );
    eprintln!(
        "broker-b throughout: longest time between two acknowledgements {}",
        ms(gap_b)
    );
    let mut shared = Vec::new();
    for (g, from) in groups.iter().zip(checked_from) {
        let e = exclusivity(g, from, killed_us);
        eprintln!(
            "{}: {} queues consumed by two members at once, {} hand-overs, {} deliveries again",
            g.group.name,
            e.shared.len(),
            e.handovers,
            e.again
        );
        shared.extend(e.shared.into_iter().map(|q| (g.group.name.clone(), q)));
    }
    assert!(
        shared.is_empty(),
        "queues consumed by two members of a group at once: {shared:?}"
    );
    for g in [&mut coordinated, &mut classic]
        .into_iter()
        .chain(official.as_mut())
    {
        for m in g.group.members.values_mut() {
            m.sigkill();
        }
    }
}
