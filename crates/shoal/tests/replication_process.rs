//! A replicated broker group as separate `shoal` processes on 127.0.0.1 (ports chosen at run
//! time): one name server, one controller voter, three brokers of `broker-a` with
//! `--controller`, each reaching the controller through a TCP proxy the test controls. A
//! producer sends every 10 ms and a consumer group reads; then the master fails: SIGKILLed,
//! frozen (SIGSTOP, then SIGCONT) or cut off from the controller. The controller elects an
//! in-sync replica, which registers as brokerId 0; sends go on to it, and every acknowledged
//! message is consumed (the ones the old master acknowledged included) while the old master is
//! still down, frozen or cut off. The old master then rejoins the in-sync set as a replica.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::cluster::{SteadyProducer, TrackedGroup};
use support::replicas::{
    check_history, in_sync_len, under_load, wait_all_consumed, wait_sends, Loaded, Replicas, GROUP,
    LIMIT, TOPIC,
};
use support::{free_port, log_sink, shoal, Proc};

/// How the master (the first three) or another process of the group fails.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill,
    Freeze,
    CutFromController,
    /// A replica SIGKILLed (restarted afterwards).
    ReplicaKill,
    /// A replica frozen with SIGSTOP (SIGCONT afterwards).
    ReplicaFreeze,
    /// A replica cut off from the other brokers of its group (the proxy in front of it cuts
    /// every replication connection; healed afterwards).
    ReplicaCutFromPeers,
    /// The controller voters' Raft leader SIGKILLed (restarted afterwards).
    ControllerLeaderKill,
    /// The controller voters' Raft leader frozen with SIGSTOP (SIGCONT afterwards).
    ControllerLeaderFreeze,
}

impl Fault {
    fn of_master(self) -> bool {
        matches!(self, Fault::Kill | Fault::Freeze | Fault::CutFromController)
    }
}

#[test]
fn the_masters_death_loses_no_acknowledged_message() {
    scenario(Replicas::start(), Fault::Kill);
}

#[test]
fn a_frozen_master_is_replaced_and_rejoins() {
    scenario(Replicas::start(), Fault::Freeze);
}

#[test]
fn a_master_cut_off_from_the_controller_stops_and_is_replaced() {
    scenario(Replicas::start(), Fault::CutFromController);
}

#[test]
fn a_replica_cut_off_from_its_peers_leaves_the_in_sync_set_and_rejoins() {
    scenario(
        Replicas::start_with_peer_proxies(1, |_| Vec::new()),
        Fault::ReplicaCutFromPeers,
    );
}

#[test]
fn a_frozen_controller_leader_is_replaced_and_the_master_keeps_serving() {
    scenario(
        Replicas::start_with(3, |_| Vec::new()),
        Fault::ControllerLeaderFreeze,
    );
}

/// What one fault took.
struct Outcome {
    acknowledged: usize,
    /// A master fault: until the new master was elected. Another fault: until the group
    /// showed it (the replica out of the in-sync set, a new controller leader).
    elected: Duration,
    /// A master fault: until the first send after the fault was acknowledged. Another fault:
    /// the longest time between two acknowledgements from the fault on.
    resumed: Option<Duration>,
}

/// The master fails `SHOAL_SOAK_RUNS` times (default 100), killed, frozen and cut off from the
/// controller in turn, each in a fresh group; every run checks what `scenario` checks. By hand:
/// `SHOAL_TEST_BIN=target/release/shoal cargo test -p shoal --test replication_process -- \
/// --ignored --nocapture soak` (about 15 s per run).
#[test]
#[ignore = "a soak of about 25 minutes, run by hand"]
fn soak_master_faults() {
    soak(
        &[Fault::Kill, Fault::Freeze, Fault::CutFromController],
        Replicas::start,
    );
}

/// Every fault of [`Fault`] in turn, `SHOAL_SOAK_RUNS` runs (default 100), each in a fresh
/// group of three voters with a proxy in front of every broker: masters killed, frozen and cut
/// off from the controller, replicas killed, frozen and cut off from their peers, the
/// controller's leader killed and frozen. By hand: `SHOAL_TEST_BIN=target/release/shoal cargo
/// test -p shoal --test replication_process -- --ignored --nocapture soak_mixed`.
#[test]
#[ignore = "a soak of about 35 minutes, run by hand"]
fn soak_mixed_faults() {
    soak(
        &[
            Fault::Kill,
            Fault::ReplicaKill,
            Fault::ControllerLeaderKill,
            Fault::Freeze,
            Fault::ReplicaFreeze,
            Fault::ControllerLeaderFreeze,
            Fault::CutFromController,
            Fault::ReplicaCutFromPeers,
        ],
        || Replicas::start_with_peer_proxies(3, |_| Vec::new()),
    );
}

fn soak(faults: &[Fault], start: impl Fn() -> Replicas) {
    let runs: usize = std::env::var("SHOAL_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut by_fault: Vec<(Fault, Vec<Outcome>)> =
        faults.iter().map(|f| (*f, Vec::new())).collect();
    for run in 0..runs {
        let fault = faults[run % faults.len()];
        let o = scenario(start(), fault);
        by_fault[run % faults.len()].1.push(o);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for (fault, outcomes) in &by_fault {
        if outcomes.is_empty() {
            continue;
        }
        let mut elected: Vec<f64> = outcomes.iter().map(|o| ms(o.elected)).collect();
        let mut resumed: Vec<f64> = outcomes.iter().filter_map(|o| o.resumed).map(ms).collect();
        elected.sort_by(f64::total_cmp);
        resumed.sort_by(f64::total_cmp);
        let pct = |v: &[f64], p: f64| {
            v.get(((v.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        let acked: usize = outcomes.iter().map(|o| o.acknowledged).sum();
        let (took, gap) = match fault.of_master() {
            true => ("new master after", "first send after"),
            false => ("seen after", "longest gap between acknowledgements"),
        };
        eprintln!(
            "soak {fault:?}: {} runs, {acked} acknowledged, 0 lost; {took} (ms) min {:.0} median {:.0} max {:.0}; {gap} (ms) min {:.0} median {:.0} p99 {:.0} max {:.0}",
            outcomes.len(),
            pct(&elected, 0.0),
            pct(&elected, 0.5),
            pct(&elected, 1.0),
            pct(&resumed, 0.0),
            pct(&resumed, 0.5),
            pct(&resumed, 0.99),
            pct(&resumed, 1.0),
        );
    }
}

fn scenario(r: Replicas, fault: Fault) -> Outcome {
    if !fault.of_master() {
        return beside_the_master(r, fault);
    }
    let mut r = r;
    let g = r.wait_group("no master with three in sync", |g| {
        g["master"].is_u64() && in_sync_len(g) == 3
    });
    let epoch = g["masterEpoch"].as_u64().unwrap();
    let master = r.index_of(&g, g["master"].as_u64().unwrap());

    // The topic on the master only: the replicas learn it from the group's log.
    let master_addr = r.brokers[master].0.clone();
    let topic_args = ["topic", "create", TOPIC, "--queues", "4", "--brokers"];
    let mut args: Vec<&str> = topic_args.to_vec();
    args.extend([master_addr.as_str(), "--json"]);
    r.cluster.json(&args);
    let mut producer = SteadyProducer::start(&r.cluster.dev, TOPIC, "m", 10);
    let mut group = TrackedGroup::new("replicated-readers", TOPIC);
    group.join(&r.cluster.dev, "c1", &[]);
    // Messages flow through the first master for a while.
    let deadline = Instant::now() + LIMIT;
    while producer.sent.lock().unwrap().len() < 200 {
        assert!(
            Instant::now() < deadline,
            "the first master acknowledged too little"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // The master fails.
    let killed_at = Instant::now();
    let pid = r.brokers[master].2.as_ref().unwrap().child.id().to_string();
    match fault {
        Fault::Kill => r.brokers[master].2.as_mut().unwrap().sigkill(),
        Fault::Freeze => {
            Command::new("kill").args(["-STOP", &pid]).status().unwrap();
        }
        Fault::CutFromController => r.cut_from_controller(master),
        _ => unreachable!("not a master fault"),
    }
    let g = r.wait_group("no new master elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    let new_master = r.index_of(&g, g["master"].as_u64().unwrap());
    assert_ne!(new_master, master);
    let elected = killed_at.elapsed();
    // Sends go on to the new master.
    wait_sends(&producer, 200, "sends did not resume after the failover");
    // The first acknowledgement after the fault that was not already in flight then.
    let resumed = producer
        .sent
        .lock()
        .unwrap()
        .iter()
        .map(|l| l.at)
        .find(|at| *at > killed_at + Duration::from_millis(50))
        .map(|at| at - killed_at);
    let acked: BTreeSet<String> = producer.stop().into_iter().collect();
    let failed = producer.failed.lock().unwrap().len();

    // Every acknowledged message is consumed, with the old master still down.
    wait_all_consumed(&group, &acked);
    check_history(&producer, &group);
    eprintln!(
        "replicated failover ({fault:?}): {} acknowledged, {failed} sends failed, new master elected after {elected:?}, first send acknowledged {resumed:?} after the fault",
        acked.len()
    );

    // The old master comes back as a replica and rejoins the in-sync set.
    match fault {
        Fault::Kill => r.start_broker(master),
        Fault::Freeze => {
            Command::new("kill").args(["-CONT", &pid]).status().unwrap();
        }
        Fault::CutFromController => r.heal_to_controller(master),
        _ => unreachable!("not a master fault"),
    }
    r.wait_group("the old master did not rejoin the in-sync set", |g| {
        in_sync_len(g) == 3
    });
    for m in group.group.members.values_mut() {
        m.sigkill();
    }
    Outcome {
        acknowledged: acked.len(),
        elected,
        resumed,
    }
}

/// A fault of a replica or of the controller's leader under load: the master stays, sends go
/// on (a frozen replica holds them until the master gives up on it), every acknowledged
/// message is consumed, and once the process is back (restarted, thawed, healed) the group is
/// whole again: three in sync, with a master.
fn beside_the_master(mut r: Replicas, fault: Fault) -> Outcome {
    let mut l = under_load(&r, "m", "replicated-readers");
    wait_sends(&l.producer, 200, "the first master acknowledged too little");
    let at = Instant::now();
    let pid = |p: &Option<support::Proc>| p.as_ref().unwrap().child.id().to_string();
    let signal = |sig: &str, pid: &str| {
        Command::new("kill").args([sig, pid]).status().unwrap();
    };
    let leader = match fault {
        Fault::ControllerLeaderKill | Fault::ControllerLeaderFreeze => {
            Some(r.wait_leader(0, "no controller leader", |_| true))
        }
        _ => None,
    };
    let mut frozen_voter = None;
    match fault {
        Fault::ReplicaKill => r.kill_broker(l.replica),
        Fault::ReplicaFreeze => signal("-STOP", &pid(&r.brokers[l.replica].2)),
        Fault::ReplicaCutFromPeers => r.peers[l.replica].cut(),
        Fault::ControllerLeaderKill => r.kill_voter(leader.unwrap()),
        Fault::ControllerLeaderFreeze => {
            // Out of the voters the test asks while frozen (it would not answer).
            let p = r.voters[leader.unwrap()].proc.take();
            signal("-STOP", &pid(&p));
            frozen_voter = p;
        }
        _ => unreachable!("a master fault"),
    }
    let replica_id = r.id_of(
        &r.wait_group("no group", |g| g["master"].is_u64()),
        l.replica,
    );
    let seen = match leader {
        Some(old) => {
            let from = (old + 1) % r.voters.len();
            r.wait_leader(from, "no new controller leader", |i| i != old);
            at.elapsed()
        }
        None => {
            r.wait_group("the replica did not leave the in-sync set", |g| {
                in_sync_len(g) == 2
                    && !g["inSync"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|id| id.as_u64() == Some(replica_id))
            });
            at.elapsed()
        }
    };
    // Sends go on, to the same master.
    wait_sends(&l.producer, 200, "sends did not go on beside the fault");
    let gap = support::replicas::longest_gap(&l.producer, at);
    let acked: BTreeSet<String> = l.producer.stop().into_iter().collect();
    let failed = l.producer.failed.lock().unwrap().len();
    wait_all_consumed(&l.group, &acked);
    check_history(&l.producer, &l.group);
    eprintln!(
        "fault beside the master ({fault:?}): {} acknowledged, {failed} sends failed, seen after {seen:?}, longest gap between acknowledgements {gap:?}",
        acked.len()
    );
    match fault {
        Fault::ReplicaKill => r.start_broker(l.replica),
        Fault::ReplicaFreeze => signal("-CONT", &pid(&r.brokers[l.replica].2)),
        Fault::ReplicaCutFromPeers => r.peers[l.replica].heal(),
        Fault::ControllerLeaderKill => r.start_voter(leader.unwrap()),
        Fault::ControllerLeaderFreeze => {
            signal("-CONT", &pid(&frozen_voter));
            r.voters[leader.unwrap()].proc = frozen_voter;
        }
        _ => unreachable!("a master fault"),
    }
    let g = r.wait_group("the group is not whole again", |g| {
        g["master"].is_u64() && in_sync_len(g) == 3
    });
    if matches!(fault, Fault::ReplicaKill | Fault::ReplicaCutFromPeers) {
        assert_eq!(
            g["masterEpoch"].as_u64(),
            Some(l.epoch),
            "a replica's fault moved the master"
        );
    }
    for m in l.group.group.members.values_mut() {
        m.sigkill();
    }
    Outcome {
        acknowledged: acked.len(),
        elected: seen,
        resumed: Some(gap),
    }
}

/// A replica SIGKILLed under load: the master proposes it out of the in-sync set and sends go
/// on; restarted with its disk, it catches up from the master and rejoins the set. Then the
/// master and the other replica are SIGKILLed together: the caught-up replica is elected and
/// alone serves every acknowledged message, those acknowledged while it was down included.
#[test]
fn a_killed_replica_catches_up_and_then_carries_every_message_alone() {
    let mut r = Replicas::start();
    let Loaded {
        epoch,
        master,
        replica,
        other,
        mut producer,
        mut group,
    } = under_load(&r, "r", "replica-readers");
    wait_sends(&producer, 100, "the master acknowledged too little");

    r.brokers[replica].2.as_mut().unwrap().sigkill();
    r.wait_group("the killed replica stayed in the in-sync set", |g| {
        in_sync_len(g) == 2
    });
    wait_sends(&producer, 200, "sends stopped with a replica down");
    r.start_broker(replica);
    r.wait_group(
        "the restarted replica did not rejoin the in-sync set",
        |g| in_sync_len(g) == 3,
    );
    wait_sends(&producer, 100, "sends stopped after the replica rejoined");
    let failed_before = producer.failed.lock().unwrap().len();

    r.brokers[master].2.as_mut().unwrap().sigkill();
    r.brokers[other].2.as_mut().unwrap().sigkill();
    let g = r.wait_group("the caught-up replica was not elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    assert_eq!(r.index_of(&g, g["master"].as_u64().unwrap()), replica);
    let acked: BTreeSet<String> = producer.stop().into_iter().collect();
    let failed = producer.failed.lock().unwrap().len();
    wait_all_consumed(&group, &acked);
    check_history(&producer, &group);
    eprintln!(
        "replica killed, restarted, then alone: {} acknowledged, all consumed; sends failed: {failed_before} before the master and the other replica were killed, {} after",
        acked.len(),
        failed - failed_before
    );
    for m in group.group.members.values_mut() {
        m.sigkill();
    }
}

/// The whole group SIGKILLed at once under load (the controller's voter and all three
/// brokers, as a power cut of one machine would), then restarted on the same data directories:
/// the voter keeps its Raft log, the group has a master again (the same one in the same epoch
/// when it comes back holding the log the controller knows it by), all three are in sync again,
/// sends go on, and every message acknowledged before the cut is consumed
/// with those after it.
#[test]
fn everything_killed_at_once_and_restarted_keeps_every_acknowledged_message() {
    let mut r = Replicas::start();
    let Loaded {
        epoch,
        mut producer,
        mut group,
        ..
    } = under_load(&r, "w", "whole-readers");
    wait_sends(&producer, 200, "the first master acknowledged too little");
    r.kill_voter(0);
    for i in 0..3 {
        r.kill_broker(i);
    }
    let before = producer.sent.lock().unwrap().len();
    r.start_voter(0);
    for i in 0..3 {
        r.start_broker(i);
    }
    let g = r.wait_group(
        "the restarted group has no master with three in sync",
        |g| g["master"].is_u64() && in_sync_len(g) == 3 && g["masterEpoch"].as_u64() >= Some(epoch),
    );
    wait_sends(&producer, 200, "sends did not go on after the restart");
    let acked: BTreeSet<String> = producer.stop().into_iter().collect();
    let failed = producer.failed.lock().unwrap().len();
    wait_all_consumed(&group, &acked);
    check_history(&producer, &group);
    eprintln!(
        "everything killed and restarted: {before} acknowledged before the cut, {} in all, every one consumed; {failed} sends failed; master epoch {epoch} then {}",
        acked.len(),
        g["masterEpoch"]
    );
    for m in group.group.members.values_mut() {
        m.sigkill();
    }
}

/// A broker's `commitLogMinOffset` and `commitLogMaxOffset` (`shoal broker status`).
fn log_range(r: &Replicas, broker: usize) -> (u64, u64) {
    let addr = &r.brokers[broker].0;
    let v = r
        .cluster
        .json(&["broker", "status", "--broker", addr, "--json"]);
    let t = &v[addr.as_str()];
    let get = |k: &str| t[k].as_str().unwrap().parse::<u64>().unwrap();
    (get("commitLogMinOffset"), get("commitLogMaxOffset"))
}

/// Retention (128 KiB segments, kept 0 hours) deletes on the master what a SIGKILLed replica
/// lacks. Restarted, the replica is told to restart its log at the master's first offset,
/// catches up from there and rejoins the in-sync set; with the master and the other replica
/// then SIGKILLed it serves alone every message acknowledged since its restart point, and the
/// group has consumed every acknowledged message.
#[test]
fn a_replica_behind_the_masters_retention_restarts_its_log_and_rejoins() {
    let mut r = Replicas::start_with(1, |dir| {
        let file = dir.join("small-segments.toml");
        std::fs::write(
            &file,
            "commit_log_segment_bytes = 131072\nmax_message_bytes = 8192\nretention_hours = 0\n",
        )
        .unwrap();
        vec!["-c".into(), file.to_str().unwrap().into()]
    });
    let Loaded {
        epoch,
        master,
        replica,
        other,
        mut producer,
        mut group,
    } = under_load(&r, "t", "retained-readers");
    wait_sends(&producer, 50, "the master acknowledged too little");

    // The replica goes down; the master fills segments, and retention deletes them.
    r.brokers[replica].2.as_mut().unwrap().sigkill();
    let (_, replica_end) = log_range(&r, master);
    let bulk = format!("{}-bulk", "x".repeat(1_000));
    let mut acked: BTreeSet<String> = support::send(&r.cluster.dev, TOPIC, &bulk, 600)
        .into_iter()
        .collect();
    let deadline = Instant::now() + LIMIT;
    let master_start = loop {
        let (min, _) = log_range(&r, master);
        if min > replica_end {
            break min;
        }
        assert!(
            Instant::now() < deadline,
            "the master's retention never passed the replica's log end {replica_end}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };

    // Back, it restarts its log at (or after) the master's first offset and rejoins.
    r.start_broker(replica);
    r.wait_group("the replica did not rejoin the in-sync set", |g| {
        in_sync_len(g) == 3
    });
    let (replica_min, _) = log_range(&r, replica);
    assert!(
        replica_min >= master_start,
        "the replica's log starts at {replica_min}, below the master's {master_start}: it did not restart"
    );
    wait_sends(&producer, 50, "sends stopped after the replica rejoined");

    r.brokers[master].2.as_mut().unwrap().sigkill();
    r.brokers[other].2.as_mut().unwrap().sigkill();
    let g = r.wait_group("the restarted replica was not elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    assert_eq!(r.index_of(&g, g["master"].as_u64().unwrap()), replica);
    acked.extend(producer.stop());
    wait_all_consumed(&group, &acked);
    check_history(&producer, &group);
    eprintln!(
        "retention passed the replica: its log end {replica_end}, the master's first offset {master_start}, the replica's first offset after its restart {replica_min}; {} acknowledged, all consumed",
        acked.len()
    );
    for m in group.group.members.values_mut() {
        m.sigkill();
    }
}

/// `shoal dev --replicas 3` as a user runs it: three replicas come up, a message sent is
/// acknowledged, the master printed by dev is SIGKILLed, and a message sent afterwards goes to
/// the replica elected in its place; both are consumed.
#[test]
fn dev_with_three_replicas_fails_over() {
    let dir = tempfile::tempdir().unwrap();
    let ns_port = free_port();
    let namesrv = format!("127.0.0.1:{ns_port}");
    let controller = format!("127.0.0.1:{}", ns_port + 2);
    let mut dev = Command::new(shoal())
        .args([
            "dev",
            "--replicas",
            "3",
            "--data-dir",
            dir.path().to_str().unwrap(),
        ])
        .args(["--namesrv-port", &ns_port.to_string()])
        .args(["--broker-port", &free_port().to_string()])
        .stdout(Stdio::piped())
        .stderr(log_sink("dev-replicas"))
        .spawn()
        .unwrap();
    // The replicas' addresses and pids as dev prints them.
    let stdout = dev.stdout.take().unwrap();
    let mut replicas: Vec<(String, u32)> = Vec::new();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.trim_start().starts_with("replica ") {
            let words: Vec<&str> = line.split_whitespace().collect();
            let addr =
                words[words.iter().position(|w| *w == "at").unwrap() + 1].trim_end_matches(',');
            let pid =
                words[words.iter().position(|w| *w == "pid").unwrap() + 1].trim_end_matches(',');
            replicas.push((addr.to_string(), pid.parse().unwrap()));
        }
        if line.starts_with("Try it") {
            break;
        }
    }
    // Dev prints on (a replica that exits): keep reading.
    std::thread::spawn(move || lines.for_each(drop));
    // At the end, or on a failure: SIGTERM to dev (which stops its replicas), SIGKILL to any
    // replica left.
    struct Stop(Proc, Vec<u32>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.sigterm();
            self.0.wait_exit(Duration::from_secs(20));
            for pid in &self.1 {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
    }
    let _dev = Stop(Proc { child: dev }, replicas.iter().map(|r| r.1).collect());
    assert_eq!(replicas.len(), 3);
    let status = |ok: &dyn Fn(&Value) -> bool| -> Value {
        let deadline = Instant::now() + LIMIT;
        loop {
            let out = Command::new(shoal())
                .args(["cluster", "status", "--controller", &controller, "--json"])
                .output()
                .unwrap();
            if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) {
                if ok(&v["groups"][GROUP]) {
                    return v["groups"][GROUP].clone();
                }
            }
            assert!(Instant::now() < deadline, "cluster status never matched");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let g = status(&|g| g["master"].is_u64() && in_sync_len(g) == 3);
    let run = |args: &[&str]| {
        let out = Command::new(shoal())
            .args(args)
            .args(["--namesrv", &namesrv])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // A replica refuses to change its tables: they come from the master.
    let replica_addr = g["members"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(id, _)| id.as_str() != g["master"].as_u64().unwrap().to_string())
        .map(|(_, a)| a.as_str().unwrap().to_string())
        .unwrap();
    let out = Command::new(shoal())
        .args(["topic", "create", "OnReplica", "--brokers", &replica_addr])
        .args(["--namesrv", &namesrv])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("replica of broker-a"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    run(&["topic", "create", "DevReplicated", "--queues", "2"]);
    run(&["send", "DevReplicated", "--body", "before"]);
    let master_addr = g["members"][g["master"].as_u64().unwrap().to_string()]
        .as_str()
        .unwrap()
        .to_string();
    let pid = replicas.iter().find(|(a, _)| *a == master_addr).unwrap().1;
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    let epoch = g["masterEpoch"].as_u64().unwrap();
    status(&|g| g["masterEpoch"].as_u64().unwrap_or(0) > epoch);
    // The route moves to the new master; sends retry until it does.
    let deadline = Instant::now() + LIMIT;
    loop {
        let out = Command::new(shoal())
            .args([
                "send",
                "DevReplicated",
                "--body",
                "after",
                "--namesrv",
                &namesrv,
            ])
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no send succeeded after the failover"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = Command::new(shoal())
        .args([
            "consume",
            "DevReplicated",
            "--group",
            "dev-readers",
            "--from",
            "first",
        ])
        .args(["--count", "2", "--json", "--namesrv", &namesrv])
        .output()
        .unwrap();
    let bodies: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["body"].as_str().map(str::to_string))
        .collect();
    assert!(
        bodies.contains("before") && bodies.contains("after"),
        "{bodies:?}"
    );
}

/// `shoal group describe GROUP --json`, when it answers.
fn describe(r: &Replicas, group: &str) -> Option<Value> {
    let out = r.cluster.dev.cmd(&["group", "describe", group, "--json"]);
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice::<Value>(&out.stdout).ok()
}

/// Queues of [`TOPIC`] the group's members hold (the group's retry queue aside).
fn topic_queues_held(v: &Value) -> usize {
    v["members"].as_array().map_or(0, |m| {
        m.iter()
            .flat_map(|m| m["owned"].as_array().cloned().unwrap_or_default())
            .filter(|q| q["topic"] == TOPIC)
            .count()
    })
}

/// The group's description once its members hold the 4 queues of [`TOPIC`], reconciled, at
/// a group epoch above `above`.
fn wait_held(r: &Replicas, group: &str, above: i64) -> Value {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(v) = describe(r, group).filter(|v| {
            v["groupEpoch"].as_i64().unwrap_or(0) > above
                && topic_queues_held(v) == 4
                && v["reconciled"] == true
        }) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "the group never held the 4 queues above epoch {above}: {:?}",
            describe(r, group)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A group with a master holding all three in sync, [`TOPIC`] created on it, and a consumer
/// of `group` holding its queues: (the master epoch, the master's index, the consumer, its
/// group epoch).
fn with_a_consumer(r: &Replicas, group: &str) -> (u64, usize, TrackedGroup, i64) {
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
    let mut consumer = TrackedGroup::new(group, TOPIC);
    consumer.join(&r.cluster.dev, "c1", &[]);
    let before = wait_held(r, group, 0);
    // A few metadata rounds (one every 500 ms) write the group's state to the log; a message
    // the caller sends and sees consumed next is above it, so it is confirmed by then.
    std::thread::sleep(Duration::from_secs(2));
    (
        epoch,
        master,
        consumer,
        before["groupEpoch"].as_i64().unwrap(),
    )
}

/// Waits until the consumer consumed a message with body `body`; how many times it did.
fn wait_consumed(consumer: &TrackedGroup, body: &str) -> usize {
    let deadline = Instant::now() + LIMIT;
    loop {
        let n = consumer
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.body == body)
            .count();
        if n > 0 {
            return n;
        }
        assert!(Instant::now() < deadline, "{body} was never consumed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGKILLs the master; returns once another broker is elected.
fn kill_master(r: &mut Replicas, master: usize, epoch: u64) {
    r.brokers[master].2.as_mut().unwrap().sigkill();
    let g = r.wait_group("no new master elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    assert_ne!(r.index_of(&g, g["master"].as_u64().unwrap()), master);
}

/// A coordinated group's state follows the data: a consumer joins through the first master;
/// after it is SIGKILLed, the new master's coordinator continues from the replicated state, so
/// the group epoch is at least the old one plus the restore gap (1000), and the member is
/// still in the group with its queues.
#[test]
fn a_coordinated_groups_epoch_grows_across_a_failover() {
    let mut r = Replicas::start();
    let (epoch, master, mut consumer, group_epoch) = with_a_consumer(&r, "epoch-readers");
    assert!(group_epoch > 0);
    let sent = support::send(&r.cluster.dev, TOPIC, "after-join", 1);
    wait_consumed(&consumer, &sent[0]);

    kill_master(&mut r, master, epoch);
    // The new master coordinates the group from the replicated state: the epoch moved
    // forward by the restore gap, the member is still there, holding the 4 queues.
    let after = wait_held(&r, "epoch-readers", group_epoch);
    assert!(
        after["groupEpoch"].as_i64().unwrap() >= group_epoch + 1000,
        "the group epoch did not continue from the replicated state: {group_epoch}, then {after}"
    );
    eprintln!(
        "coordinated group across the failover: group epoch {group_epoch} at the old master, {} at the new one",
        after["groupEpoch"]
    );
    for m in consumer.group.members.values_mut() {
        m.sigkill();
    }
}

/// A half message prepared at the first master is committed after the failover: the producer's
/// local transaction ends only once the master was SIGKILLed and the new one took over (its
/// coordinator serves the consumer's group from the replicated state), END_TRANSACTION goes
/// to the new master, and the consumer gets the message exactly once.
#[test]
fn a_half_message_prepared_before_a_failover_is_committed_after_it() {
    use shoal_client::{LocalTransactionState, Message, Producer, TransactionProducer};
    let mut r = Replicas::start();
    let (epoch, master, mut consumer, group_epoch) = with_a_consumer(&r, "txn-readers");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let builder = Producer::builder("txn-producer").namesrv(&r.cluster.dev.namesrv);
    // Asked by a check before the decision: not known yet.
    let producer = std::sync::Arc::new(
        rt.block_on(TransactionProducer::start(builder, |_m| async {
            LocalTransactionState::Unknown
        }))
        .unwrap(),
    );
    let (prepared_tx, prepared_rx) = std::sync::mpsc::channel::<()>();
    let (decide_tx, decide_rx) = tokio::sync::oneshot::channel::<()>();
    let p = producer.clone();
    let transaction = rt.spawn(async move {
        p.send_in_transaction(
            Message::new(TOPIC, "tx-body"),
            move |_m, _sent| async move {
                prepared_tx.send(()).unwrap();
                decide_rx.await.unwrap();
                LocalTransactionState::CommitMessage
            },
        )
        .await
    });
    prepared_rx.recv_timeout(LIMIT).unwrap();
    // The half message is in the log before the master dies (a message sent after it is
    // consumed: both are below the confirmed offset).
    let sent = support::send(&r.cluster.dev, TOPIC, "after-half", 1);
    wait_consumed(&consumer, &sent[0]);

    kill_master(&mut r, master, epoch);
    // The new master took over (it coordinates the group above the old epoch)...
    wait_held(&r, "txn-readers", group_epoch + 999);
    // ...and the producer's route names it (a plain send through the same producer works).
    let deadline = Instant::now() + LIMIT;
    while rt
        .block_on(producer.producer().send(Message::new(TOPIC, "probe")))
        .is_err()
    {
        assert!(Instant::now() < deadline, "no send reached the new master");
        std::thread::sleep(Duration::from_millis(200));
    }
    decide_tx.send(()).unwrap();
    let result = rt.block_on(transaction).unwrap().unwrap();
    assert!(result.end_sent, "{result:?}");
    assert_eq!(wait_consumed(&consumer, "tx-body"), 1);
    // A message sent after the commit is consumed, and still only one copy of it.
    let sent = support::send(&r.cluster.dev, TOPIC, "after-commit", 1);
    wait_consumed(&consumer, &sent[0]);
    assert_eq!(wait_consumed(&consumer, "tx-body"), 1);
    rt.block_on(producer.shutdown());
    for m in consumer.group.members.values_mut() {
        m.sigkill();
    }
}
