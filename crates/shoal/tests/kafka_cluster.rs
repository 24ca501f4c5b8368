//! Kafka clients see the whole cluster: a name server and two `shoal broker` processes, each
//! with a Kafka listener, a topic with 2 queues on each; confluent-kafka
//! (`tests/compat/kafka/kafka_cluster.py`) bootstrapped at either broker sees 4 partitions
//! with their leaders, produces to all, consumes them in classic and KIP-848 groups whose
//! members are bootstrapped at different brokers, and reads the commits back. Then broker-b is
//! stopped: its partitions keep their numbers, without a leader.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use support::cluster::Cluster;
use support::external;

fn python() -> Option<std::path::PathBuf> {
    let py = external::repo_root().join("target/external/venv-kafka/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import confluent_kafka"])
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(py)
}

fn phase(py: &std::path::Path, name: &str, a: &str, b: &str, topic: &str) {
    let status = Command::new(py)
        .arg(external::repo_root().join("tests/compat/kafka/kafka_cluster.py"))
        .args([name, a, b, topic])
        .status()
        .unwrap();
    assert!(status.success(), "kafka_cluster.py {name} failed: {status}");
}

/// A name server and brokers `broker-a` and `broker-b`, each with a Kafka listener (their
/// addresses returned), and `topic` with 2 queues on each.
fn two_brokers(topic: &str) -> (Cluster, String, String) {
    let mut c = Cluster::start(None);
    let kafka_a = format!("127.0.0.1:{}", support::free_port());
    let kafka_b = format!("127.0.0.1:{}", support::free_port());
    c.start_broker_with("broker-a", &["--kafka-listen", &kafka_a]);
    c.start_broker_with("broker-b", &["--kafka-listen", &kafka_b]);
    let out = c.dev.cmd(&["topic", "create", topic, "--queues", "2"]);
    assert!(out.status.success(), "{out:?}");
    (c, kafka_a, kafka_b)
}

#[test]
fn kafka_clients_see_every_broker_of_the_cluster() {
    let Some(py) = python() else {
        external::skip("confluent-kafka is not installed (.ci/setup.d/40-kafka-clients.sh)");
        return;
    };
    let topic = "KCluster";
    let (mut c, kafka_a, kafka_b) = two_brokers(topic);
    phase(&py, "whole", &kafka_a, &kafka_b, topic);
    c.stop_broker("broker-b");
    phase(&py, "departed", &kafka_a, &kafka_b, topic);
}

/// Issue 39's coordinator move with Kafka clients: a classic and a KIP-848 group coordinated
/// by broker-a keep consuming broker-b's partitions while broker-a is stopped (SIGTERM).
#[test]
fn kafka_groups_keep_consuming_while_their_coordinator_broker_stops() {
    let Some(py) = python() else {
        external::skip("confluent-kafka is not installed (.ci/setup.d/40-kafka-clients.sh)");
        return;
    };
    let topic = "KMove";
    let (mut c, kafka_a, kafka_b) = two_brokers(topic);
    let mut child = Command::new(&py)
        .arg(external::repo_root().join("tests/compat/kafka/kafka_cluster.py"))
        .args(["move", &kafka_a, &kafka_b, topic])
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
            c.stop_broker("broker-a");
            writeln!(stdin, "stopped").unwrap();
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "kafka_cluster.py move failed: {status}");
}
