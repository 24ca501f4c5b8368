//! Kafka clients through a failover of a replicated broker group: a name server, one
//! controller voter and three `shoal broker` replicas of `broker-a`, each with a Kafka
//! listener; confluent-kafka (`tests/compat/kafka/kafka_cluster.py failover`) produces with
//! `acks=all` and an idempotent producer every 10 ms and consumes in a KIP-848 group; the
//! master is SIGKILLed; every acknowledged record must be consumed from the new master.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use support::external;
use support::replicas::{in_sync_len, Replicas, TOPIC};

#[test]
fn kafka_clients_lose_no_acknowledged_record_when_the_master_is_killed() {
    let py = external::repo_root().join("target/external/venv-kafka/bin/python");
    let installed = Command::new(&py)
        .args(["-c", "import confluent_kafka"])
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        external::skip("confluent-kafka is not installed (.ci/setup.d/40-kafka-clients.sh)");
        return;
    }
    let mut r = Replicas::start_with_kafka();
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
    let bootstrap = r.kafka.join(",");
    let mut child = Command::new(&py)
        .arg(external::repo_root().join("tests/compat/kafka/kafka_cluster.py"))
        .args(["failover", &bootstrap, "-", TOPIC])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    for line in stdout.lines() {
        let line = line.unwrap();
        println!("{line}");
        if line == "READY" {
            r.kill_broker(master);
            writeln!(stdin, "killed").unwrap();
            let g = r.wait_group("no new master elected", |g| {
                g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
            });
            assert_ne!(r.index_of(&g, g["master"].as_u64().unwrap()), master);
        }
    }
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "kafka_cluster.py failover failed: {status}"
    );
}
