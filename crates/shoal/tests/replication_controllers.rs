//! A replicated broker group whose controller has three voters (`shoal controller` processes
//! with their own data directories), as separate processes on 127.0.0.1 (ports chosen at run
//! time): a name server, the voters, and three brokers of `broker-a`, under a producer sending
//! every 10 ms and a consumer group. Controller voters and brokers are SIGKILLed in turn, or
//! replication messages between brokers are held one way (from the master to a replica, or
//! from the replicas to the master); every acknowledged message must be consumed.
//!
//! The times each step took are printed (run with `--nocapture`); they are figures for
//! docs/ha.md, not assertions.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use support::replicas::{
    acknowledged, check_history, in_sync_len, longest_gap, under_load, wait_all_consumed,
    wait_sends, Loaded, Replicas, GROUP, LIMIT,
};

/// (a) The controller's Raft leader is SIGKILLed under load: the two other voters elect a new
/// leader, the master renews its lease through it and stays master (same epoch), and sends go
/// on. (b) With that voter still down, the master is SIGKILLed: the two voters left elect an
/// in-sync replica, sends resume, and every message acknowledged so far is consumed with the
/// old master down. (c) The dead voter and the old master are restarted: the voter catches up
/// (it shows the new master and the whole in-sync set), the old master rejoins the in-sync set
/// as a replica, and every acknowledged message is consumed.
#[test]
fn controller_leader_then_master_killed_under_load() {
    let mut r = Replicas::start_with(3, |_| Vec::new());
    let Loaded {
        epoch,
        master,
        mut producer,
        mut group,
        ..
    } = under_load(&r, "v", "voter-readers");
    wait_sends(&producer, 100, "the first master acknowledged too little");

    // (a) The controller's leader dies.
    let leader = r.wait_leader(0, "no controller leader", |_| true);
    let survivor = (leader + 1) % 3;
    let voter_killed_at = Instant::now();
    r.kill_voter(leader);
    let new_leader = r.wait_leader(survivor, "no new controller leader", |i| i != leader);
    let leader_after = voter_killed_at.elapsed();
    wait_sends(
        &producer,
        200,
        "sends stopped after the controller leader died",
    );
    // The master kept its lease through the new leader: nobody was elected in its place.
    let g = r
        .status_of(new_leader)
        .map(|v| v["groups"][GROUP].clone())
        .expect("the new leader does not answer");
    assert_eq!(
        g["masterEpoch"].as_u64(),
        Some(epoch),
        "a new master was elected after the controller leader died: {g}"
    );
    assert_eq!(r.index_of(&g, g["master"].as_u64().unwrap()), master);
    assert_eq!(in_sync_len(&g), 3, "{g}");
    let voter_gap = longest_gap(&producer, voter_killed_at);
    let failed_a = producer.failed.lock().unwrap().len();
    eprintln!(
        "controller leader (voter {}) killed: new leader (voter {}) known after {leader_after:?}, longest time between two acknowledgements {voter_gap:?}, {failed_a} sends failed, master and epoch unchanged",
        leader + 1,
        new_leader + 1,
    );

    // (b) With that voter still down, the master dies.
    let master_killed_at = Instant::now();
    r.kill_broker(master);
    let g = r.wait_group("the two voters left elected no new master", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    let elected_after = master_killed_at.elapsed();
    let new_master = r.index_of(&g, g["master"].as_u64().unwrap());
    assert_ne!(new_master, master);
    wait_sends(&producer, 200, "sends did not resume after the failover");
    // The first acknowledgement of a send made after the kill (not one in flight then).
    let resumed_after = producer
        .sent
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.at)
        .find(|at| *at > master_killed_at + Duration::from_millis(50))
        .map(|at| at - master_killed_at);
    let master_gap = longest_gap(&producer, master_killed_at);
    // Every message acknowledged so far, with the old master and a voter down.
    let acked_b = acknowledged(&producer);
    wait_all_consumed(&group, &acked_b);
    let failed_b = producer.failed.lock().unwrap().len() - failed_a;
    eprintln!(
        "master killed with a voter down: new master after {elected_after:?}, first send acknowledged {resumed_after:?} after the kill, longest time between two acknowledgements {master_gap:?}, {failed_b} sends failed"
    );

    // (c) The dead voter and the old master come back.
    r.start_voter(leader);
    r.start_broker(master);
    // (A voter that restarted shows its log's older view until it catches up: the new epoch.)
    let g = r.wait_group("the old master did not rejoin the in-sync set", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && in_sync_len(g) == 3
    });
    assert_eq!(r.index_of(&g, g["master"].as_u64().unwrap()), new_master);
    // The restarted voter caught up: it shows the same group.
    let deadline = Instant::now() + LIMIT;
    loop {
        let g = r.status_of(leader).map(|v| v["groups"][GROUP].clone());
        if g.as_ref().is_some_and(|g| {
            g["masterEpoch"].as_u64().unwrap_or(0) > epoch
                && in_sync_len(g) == 3
                && g["master"].as_u64().map(|m| r.index_of(g, m)) == Some(new_master)
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted voter did not catch up: {g:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_sends(
        &producer,
        100,
        "sends stopped after the old master rejoined",
    );
    let acked: BTreeSet<String> = producer.stop().into_iter().collect();
    assert!(acked.is_superset(&acked_b));
    wait_all_consumed(&group, &acked);
    check_history(&producer, &group);
    let failed = producer.failed.lock().unwrap().len();
    eprintln!(
        "voter and old master restarted: old master back in the in-sync set; {} acknowledged in all, every one consumed, {failed} sends failed",
        acked.len()
    );
    for m in group.group.members.values_mut() {
        m.sigkill();
    }
}

/// Which way replication messages are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OneWay {
    /// The master's messages to one replica (batches, heartbeats); its acknowledgements to the
    /// master still arrive.
    MasterToReplica,
    /// Both replicas' messages to the master (acknowledgements, handshakes); the master's to
    /// them still arrive.
    ReplicasToMaster,
    /// One replica's messages to the master; the other replica's, and the master's to both,
    /// still arrive.
    OneReplicaToMaster,
}

/// A one-way partition between brokers: every replication message to a broker goes through a
/// proxy the test controls (the broker advertises it with `--replication-addr`). The master's
/// messages to one replica are held; the connection stays open, so nothing tells the master
/// the replica is gone: the master drops it from the in-sync set once it has been behind for
/// `max_lag_ms` (2 s here), and sends go on. Healed, the replica takes what was held, catches
/// up and rejoins the set. Then the master and the other replica are SIGKILLed: the replica is
/// elected, so it holds every acknowledged message, and every one is consumed.
#[test]
fn a_replica_cut_off_one_way_from_the_master_leaves_the_in_sync_set_and_rejoins() {
    one_way(OneWay::MasterToReplica);
}

/// The other way: the replicas' acknowledgements to the master are held (they still receive
/// and write what it ships). The master drops both from the in-sync set after `max_lag_ms`
/// and acknowledges alone (`min_insync_replicas = 1`); healed, the held acknowledgements
/// arrive and both rejoin. The same SIGKILLs and checks follow.
#[test]
fn acknowledgements_held_one_way_drop_the_replicas_until_healed() {
    one_way(OneWay::ReplicasToMaster);
}

/// One replica's acknowledgements alone are held on their way to the master (the proxy in
/// front of the master tells the replicas' connections apart by their sender field). The
/// master drops that replica after `max_lag_ms`, keeps the other in the in-sync set, and
/// acknowledges with it; healed, the replica rejoins. The same SIGKILLs and checks follow.
#[test]
fn one_replicas_acknowledgements_held_drop_it_alone_until_healed() {
    one_way(OneWay::OneReplicaToMaster);
}

fn one_way(way: OneWay) {
    let mut r = Replicas::start_with_peer_proxies(1, |dir| {
        let file = dir.join("lag.toml");
        std::fs::write(&file, "[replication]\nmax_lag_ms = 2000\n").unwrap();
        vec!["-c".into(), file.to_str().unwrap().into()]
    });
    let Loaded {
        epoch,
        master,
        replica,
        other,
        mut producer,
        mut group,
    } = under_load(&r, "w", "one-way-readers");
    wait_sends(&producer, 100, "the master acknowledged too little");
    let g = r.wait_group("no master with three in sync", |g| in_sync_len(g) == 3);
    let replica_id = r.id_of(&g, replica);
    let holds = |g: &serde_json::Value, id: u64| {
        g["inSync"]
            .as_array()
            .is_some_and(|s| s.iter().any(|m| m.as_u64() == Some(id)))
    };
    // The proxy held, and the in-sync set while it is.
    let (held, in_sync_cut) = match way {
        OneWay::MasterToReplica => (replica, 2),
        OneWay::ReplicasToMaster => (master, 1),
        OneWay::OneReplicaToMaster => (master, 2),
    };
    let other_id = r.id_of(&g, other);

    let cut_at = Instant::now();
    match way {
        OneWay::OneReplicaToMaster => {
            r.peers[held].hold_up_from(&format!("\"haFrom\":\"{replica_id}\""));
        }
        _ => r.peers[held].cut_one_way(true),
    }
    let g = r.wait_group(
        "the master kept a cut-off replica in the in-sync set",
        |g| !holds(g, replica_id) && in_sync_len(g) == in_sync_cut,
    );
    let dropped_after = cut_at.elapsed();
    assert_eq!(g["masterEpoch"].as_u64(), Some(epoch), "{g}");
    if way == OneWay::OneReplicaToMaster {
        assert!(
            holds(&g, other_id),
            "the other replica left the set too: {g}"
        );
    }
    assert_eq!(r.index_of(&g, g["master"].as_u64().unwrap()), master);
    wait_sends(
        &producer,
        100,
        "sends did not go on without the cut-off replicas",
    );
    let cut_gap = longest_gap(&producer, cut_at);
    let failed_cut = producer.failed.lock().unwrap().len();

    r.peers[held].heal();
    let healed_at = Instant::now();
    r.wait_group("the healed replicas did not rejoin the in-sync set", |g| {
        holds(g, replica_id) && in_sync_len(g) == 3
    });
    let rejoined_after = healed_at.elapsed();
    wait_sends(&producer, 100, "sends stopped after the replicas rejoined");
    eprintln!(
        "{way:?} held: in-sync set down to {in_sync_cut} after {dropped_after:?}, longest time between two acknowledgements {cut_gap:?}, {failed_cut} sends failed; healed, all three in the set again after {rejoined_after:?}"
    );

    // The replica holds every acknowledged message: alone with the new epoch, it serves them.
    r.kill_broker(master);
    r.kill_broker(other);
    let g = r.wait_group("the replica was not elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    assert_eq!(r.index_of(&g, g["master"].as_u64().unwrap()), replica);
    wait_sends(&producer, 50, "sends did not resume on the replica");
    let acked: BTreeSet<String> = producer.stop().into_iter().collect();
    wait_all_consumed(&group, &acked);
    check_history(&producer, &group);
    eprintln!(
        "then the master and the other replica killed: {} acknowledged, every one consumed from the replica, {} sends failed",
        acked.len(),
        producer.failed.lock().unwrap().len()
    );
    for m in group.group.members.values_mut() {
        m.sigkill();
    }
}
