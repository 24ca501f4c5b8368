//! End-to-end scenarios through the `shoal` binary, as separate processes: a dev server,
//! consumer processes of one group, producers, and `shoal group progress` to read ownership.
//! Each scenario checks that every message sent is consumed at least once, that after each
//! change every queue has exactly one owner among the live members, and prints convergence
//! times and duplicate counts.

mod support;

use std::time::Duration;
use support::*;

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn scale_out_one_to_four_and_back_to_one() {
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", "Scale", "--queues", "8"])
        .status
        .success());
    let mut g = Group::new("scale-group", "Scale");
    g.join(&dev, "c1");
    let t = g.converge(&dev, 8, LIMIT);
    println!("1 member: converged in {t:?}");
    let mut expected = send(&dev, "Scale", "before", 40);
    let mut producer = steady_producer(&dev, "Scale", "during", 100_000, 20);
    for m in ["c2", "c3", "c4"] {
        g.join(&dev, m);
        let t = g.converge(&dev, 8, LIMIT);
        println!("join {m}: {} members converged in {t:?}", g.members.len());
    }
    for m in ["c4", "c3", "c2"] {
        g.leave(m);
        let t = g.converge(&dev, 8, LIMIT);
        println!("leave {m}: {} members converged in {t:?}", g.members.len());
    }
    producer.sigkill();
    // Everything the steady producer got acknowledged must arrive; we know its bodies only
    // by prefix, so check the synchronous batches exactly and the steady stream for gaps.
    expected.extend(send(&dev, "Scale", "after", 40));
    g.wait_all(&expected, LIMIT);
    let (counts, dups) = g.tally();
    let during: Vec<usize> = counts
        .keys()
        .filter_map(|b| b.strip_prefix("during-").and_then(|n| n.parse().ok()))
        .collect();
    let max = during.iter().copied().max().unwrap_or(0);
    let missing: Vec<usize> = (0..max).filter(|i| !during.contains(i)).collect();
    assert!(
        missing.is_empty(),
        "steady messages lost during rebalances: {missing:?}"
    );
    println!(
        "scale 1->4->1: {} distinct messages ({} from the steady producer), {dups} duplicates",
        counts.len(),
        max + 1
    );
}

#[test]
fn a_killed_consumer_loses_nothing() {
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", "Crash", "--queues", "8"])
        .status
        .success());
    let mut g = Group::new("crash-group", "Crash");
    for m in ["k1", "k2", "k3"] {
        g.join(&dev, m);
    }
    g.converge(&dev, 8, LIMIT);
    let mut expected = send(&dev, "Crash", "a", 60);
    g.wait_all(&expected, LIMIT);
    g.crash("k2");
    let t = g.converge(&dev, 8, LIMIT);
    println!("SIGKILL k2: 2 members converged in {t:?}");
    expected.extend(send(&dev, "Crash", "b", 60));
    g.wait_all(&expected, LIMIT);
    let (counts, dups) = g.tally();
    println!(
        "crash: {} distinct messages, {dups} duplicates (redelivered after the crash)",
        counts.len()
    );
}

#[test]
fn queues_added_to_a_live_topic_get_owners() {
    let dev = Dev::start();
    assert!(dev
        .cmd(&["topic", "create", "Grow", "--queues", "4"])
        .status
        .success());
    let mut g = Group::new("grow-group", "Grow");
    g.join(&dev, "g1");
    g.join(&dev, "g2");
    g.converge(&dev, 4, LIMIT);
    let mut expected = send(&dev, "Grow", "four", 20);
    assert!(dev
        .cmd(&["topic", "update", "Grow", "--queues", "8"])
        .status
        .success());
    // The broker re-registers the topic and notifies the group; consumers refresh the route
    // and rebalance at once (RocketMQ waits for the 30 s route poll).
    let t = g.converge(&dev, 8, LIMIT);
    println!("4 -> 8 queues: converged in {t:?}");
    expected.extend(send(&dev, "Grow", "eight", 40));
    g.wait_all(&expected, LIMIT);
    let (counts, dups) = g.tally();
    let queues: std::collections::BTreeSet<i64> =
        g.seen.lock().unwrap().iter().map(|s| s.queue).collect();
    assert!(
        queues.iter().any(|q| *q >= 4),
        "no message consumed from the new queues: {queues:?}"
    );
    println!(
        "grow: {} distinct messages over queues {queues:?}, {dups} duplicates",
        counts.len()
    );
}
