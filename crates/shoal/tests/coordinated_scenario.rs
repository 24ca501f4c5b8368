//! Coordinated mode through the `shoal` binary, as separate processes: `shoal consume
//! --protocol coordinated --strategy STICKY`, 16 queues, 4 -> 8 -> 4 members under steady
//! load, a SIGKILL, and the restart of a static member (`--instance-id`). Checks: every
//! message consumed (0 lost), 0 duplicates on graceful changes, no queue ever in two members'
//! assignments (sampled from `shoal group describe`), the static restart moves 0 queues and is
//! not a rebalance. Prints the coordinator's convergence per change (`shoal group history`):
//! the time from the change until every member owned its target and had been told so.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};
use support::*;

const LIMIT: Duration = Duration::from_secs(60);
const TOPIC: &str = "CoordScenario";
const GROUP: &str = "coord-scenario";

fn join(dev: &Dev, g: &mut Group, member: &str, instance_id: Option<&str>) {
    let mut args = vec![
        "consume",
        TOPIC,
        "--group",
        GROUP,
        "--json",
        "--from",
        "first",
        "--instance",
        member,
        "--protocol",
        "coordinated",
        "--strategy",
        "STICKY",
    ];
    if let Some(id) = instance_id {
        args.extend(["--instance-id", id]);
    }
    let mut child = dev.spawn(&args);
    let stdout = child.stdout.take().unwrap();
    let seen = g.seen.clone();
    let who = member.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            seen.lock().unwrap().push(Seen {
                consumer: who.clone(),
                msg_id: v["msgId"].as_str().unwrap_or_default().to_string(),
                queue: v["queue"].as_i64().unwrap_or(-1),
                body: v["body"].as_str().unwrap_or_default().to_string(),
                at: Instant::now(),
            });
        }
    });
    g.members.insert(member.to_string(), Proc { child });
}

fn describe(dev: &Dev) -> Value {
    dev.json(&["group", "describe", GROUP, "--json"])
}

/// Queues listed twice over the members' owned and revoking sets of a description.
fn double_owned(d: &Value) -> usize {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for m in d["members"].as_array().into_iter().flatten() {
        for q in m["owned"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(m["revoking"].as_array().into_iter().flatten())
        {
            *seen.entry(q.to_string()).or_default() += 1;
        }
    }
    seen.values().filter(|n| **n > 1).count()
}

/// Waits until the coordinator is reconciled with `members` members owning all 16 queues;
/// samples exclusivity meanwhile.
fn settle(dev: &Dev, members: usize) -> (Duration, usize) {
    let start = Instant::now();
    let mut doubles = 0;
    loop {
        let d = describe(dev);
        doubles += double_owned(&d);
        let owned: usize = d["members"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|m| m["owned"].as_array().cloned().unwrap_or_default())
            .filter(|q| q["topic"] == TOPIC)
            .count();
        if d["mode"] == "coordinated"
            && d["reconciled"] == true
            && d["members"].as_array().map(Vec::len) == Some(members)
            && owned == 16
        {
            return (start.elapsed(), doubles);
        }
        assert!(
            start.elapsed() < LIMIT,
            "no convergence to {members} members: {d}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn owned_by_instance(d: &Value, instance: &str) -> BTreeSet<String> {
    d["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["instanceId"] == instance)
        .flat_map(|m| m["owned"].as_array().cloned().unwrap_or_default())
        .map(|q| q.to_string())
        .collect()
}

/// The coordinator's rebalances (`shoal group history`): (epoch, cause, queues moved, ms from
/// the change until every member owned its target and had been told so).
fn history(dev: &Dev) -> Vec<(u64, String, usize, Option<u64>)> {
    let h = dev.json(&["group", "history", GROUP, "--json"]);
    h["rebalances"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["groupEpoch"].as_u64().unwrap_or(0),
                r["cause"]["kind"].as_str().unwrap_or("?").to_string(),
                r["moves"].as_array().map_or(0, Vec::len),
                r["reconciledAtMs"]
                    .as_u64()
                    .zip(r["atMs"].as_u64())
                    .map(|(a, b)| a.saturating_sub(b)),
            )
        })
        .collect()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
fn four_eight_four_kill_and_static_restart_in_coordinated_mode() {
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", TOPIC, "--queues", "16"])
        .status
        .success());
    let mut g = Group::new(GROUP, TOPIC);
    join(&dev, &mut g, "s0", Some("static-0"));
    for m in ["c1", "c2", "c3"] {
        join(&dev, &mut g, m, None);
    }
    let (t, _) = settle(&dev, 4);
    println!("start: 4 members reconciled after {t:?}");
    let mut expected = send(&dev, TOPIC, "before", 40);
    let mut producer = steady_producer(&dev, TOPIC, "during", 100_000, 5);
    let mut doubles = 0;
    let (_, d0) = g.tally();
    let epoch0 = describe(&dev)["groupEpoch"].as_u64().unwrap_or(0);
    for m in ["c4", "c5", "c6", "c7"] {
        join(&dev, &mut g, m, None);
        let (_, d) = settle(&dev, g.members.len());
        doubles += d;
    }
    for m in ["c7", "c6", "c5", "c4"] {
        g.leave(m);
        let (_, d) = settle(&dev, g.members.len());
        doubles += d;
    }
    std::thread::sleep(Duration::from_millis(500));
    let epoch1 = describe(&dev)["groupEpoch"].as_u64().unwrap_or(0);
    let (_, d1) = g.tally();
    println!(
        "4 -> 8 -> 4: {} duplicates, {doubles} doubly owned queues sampled",
        d1 - d0
    );
    assert_eq!(d1 - d0, 0, "graceful changes duplicated messages");
    assert_eq!(doubles, 0, "a queue was in two members' assignments");

    // The static member restarts: same instance id, new process.
    let before = describe(&dev);
    let queues_before = owned_by_instance(&before, "static-0");
    g.leave("s0");
    join(&dev, &mut g, "s0-again", Some("static-0"));
    let (t, _) = settle(&dev, 4);
    let after = describe(&dev);
    let queues_after = owned_by_instance(&after, "static-0");
    println!(
        "static restart: reconciled after {t:?}, group epoch {} -> {}, {} queues kept",
        before["groupEpoch"],
        after["groupEpoch"],
        queues_after.len()
    );
    assert_eq!(
        queues_before, queues_after,
        "the static restart moved queues"
    );
    assert_eq!(
        before["groupEpoch"], after["groupEpoch"],
        "a static restart is not a rebalance"
    );

    // SIGKILL: the connection closes, the member is removed at once.
    g.crash("c3");
    let (t, _) = settle(&dev, 3);
    println!("SIGKILL c3: reconciled after {t:?}");

    producer.sigkill();
    expected.extend(send(&dev, TOPIC, "after", 40));
    g.wait_all(&expected, LIMIT);
    let (counts, dups) = g.tally();
    let during: Vec<usize> = counts
        .keys()
        .filter_map(|b| b.strip_prefix("during-").and_then(|n| n.parse().ok()))
        .collect();
    let max = during.iter().copied().max().unwrap_or(0);
    let missing: Vec<usize> = (0..max).filter(|i| !during.contains(i)).collect();
    assert!(missing.is_empty(), "steady messages lost: {missing:?}");

    // Convergence as the coordinator measured it, per change.
    let h = history(&dev);
    for (epoch, cause, moved, ms) in &h {
        println!("  epoch {epoch:>3} {cause:<18} moved {moved:>2} reconciled after {ms:?} ms");
    }
    let mut graceful: Vec<u64> = h
        .iter()
        .filter(|(e, ..)| *e > epoch0 && *e <= epoch1)
        .filter_map(|(_, _, _, ms)| *ms)
        .collect();
    graceful.sort_unstable();
    let mut all: Vec<u64> = h.iter().filter_map(|(_, _, _, ms)| *ms).collect();
    all.sort_unstable();
    println!(
        "{} distinct messages ({} steady), {dups} duplicates in total (the SIGKILL's at most); graceful changes 4 -> 8 -> 4: {} rebalances reconciled p50 {} ms, p99 {} ms, max {} ms; all {} rebalances (incl. the start and the SIGKILL) p50 {} ms, p99 {} ms",
        counts.len(),
        max + 1,
        graceful.len(),
        percentile(&graceful, 0.5),
        percentile(&graceful, 0.99),
        graceful.last().copied().unwrap_or(0),
        all.len(),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
    );
    assert_eq!(graceful.len(), 8, "history: {h:?}");
    assert!(all.len() >= 9, "history: {h:?}");
}
