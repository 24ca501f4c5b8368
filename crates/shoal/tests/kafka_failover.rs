//! Kafka clients through a failover of a replicated broker group: a name server, one
//! controller voter and three `shoal broker` replicas of `broker-a`, each with a Kafka
//! listener; a client program produces with `acks=all` and an idempotent producer every 10 ms
//! and consumes in a KIP-848 group and a classic group; the master is SIGKILLed; every
//! acknowledged record must be consumed from the new master. The clients are confluent-kafka
//! (`tests/compat/kafka/kafka_cluster.py failover`) and the Java kafka-clients
//! (`tests/compat/kafka/java/src/main/java/KafkaFailover.java`), which speak the same protocol
//! on their standard input and output.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use support::external;
use support::replicas::{in_sync_len, Replicas, TOPIC};

/// One failover at a time: each runs a cluster of its own under load, and the times it prints
/// are those of one cluster on the machine.
static ONE: Mutex<()> = Mutex::new(());

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
    failover("kafka_cluster.py failover", |bootstrap| {
        let mut cmd = Command::new(&py);
        cmd.arg(external::repo_root().join("tests/compat/kafka/kafka_cluster.py"))
            .args(["failover", bootstrap, "-", TOPIC]);
        cmd
    });
}

#[test]
fn java_kafka_clients_lose_no_acknowledged_record_when_the_master_is_killed() {
    let root = external::repo_root();
    let lib = root.join("target/external/kafka-java-lib");
    let java = Command::new("java")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !java || !lib.is_dir() {
        external::skip(
            "java or the Java kafka-clients are not installed (.ci/setup.d/40-kafka-clients.sh)",
        );
        return;
    }
    let src = root.join("tests/compat/kafka/java/src/main/java");
    failover("KafkaFailover.java", |bootstrap| {
        let mut cmd = Command::new("java");
        cmd.arg("-cp")
            .arg(format!("{}/*:{}", lib.display(), src.display()))
            .arg(src.join("KafkaFailover.java"))
            .args([bootstrap, TOPIC]);
        cmd
    });
}

/// Starts the group with Kafka listeners, creates [`TOPIC`] on its master and runs the client
/// program `client` gives for the bootstrap list: once it prints `READY`, SIGKILLs the master,
/// writes `killed` to it, and waits for a new master; the program must then exit with success.
fn failover(what: &str, client: impl FnOnce(&str) -> Command) {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    println!("== {what}");
    let mut r = Replicas::start_with_kafka();
    let g = r.wait_group("no master with three in sync", |g| {
        g["master"].is_u64() && in_sync_len(g) == 3
    });
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
    let mut child = client(&bootstrap)
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
            // The master now (on a loaded machine a lease can lapse before this point, and
            // another replica be master).
            let g = r.wait_group("no master", |g| g["master"].is_u64());
            let epoch = g["masterEpoch"].as_u64().unwrap();
            let master = r.index_of(&g, g["master"].as_u64().unwrap());
            r.kill_broker(master);
            writeln!(stdin, "killed").unwrap();
            let g = r.wait_group("no new master elected", |g| {
                g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
            });
            assert_ne!(r.index_of(&g, g["master"].as_u64().unwrap()), master);
        }
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "{what} failed: {status}");
}

/// Kafka's admin requests on a replicated master are answered once the group's in-sync set has
/// the change, as a Kafka controller answers once its log has it: a topic created by
/// CreateTopics and partitions added by CreatePartitions are on the new master when the master
/// is SIGKILLed right after the answers.
#[test]
fn kafka_topic_changes_answered_on_the_master_survive_its_kill() {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::*;
    use support::kafka_wire::{topic_name, Client};

    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = Replicas::start_with_kafka();
    let g = r.wait_group("no master with three in sync", |g| {
        g["master"].is_u64() && in_sync_len(g) == 3
    });
    let epoch = g["masterEpoch"].as_u64().unwrap();
    let master = r.index_of(&g, g["master"].as_u64().unwrap());
    let mut c = Client::connect(&r.kafka[master]);
    let mut create = CreateTopicsRequest::default();
    create.timeout_ms = 10_000;
    for name in ["KafkaMade", "KafkaGrown"] {
        let mut t = CreatableTopic::default();
        t.name = topic_name(name);
        t.num_partitions = 2;
        t.replication_factor = 3;
        create.topics.push(t);
    }
    let made: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create);
    for t in &made.topics {
        assert_eq!(t.error_code, 0, "{:?}", t.error_message);
        assert_eq!(t.replication_factor, 3);
    }
    let mut grow = CreatePartitionsRequest::default();
    grow.timeout_ms = 10_000;
    let mut t = CreatePartitionsTopic::default();
    t.name = topic_name("KafkaGrown");
    t.count = 5;
    grow.topics.push(t);
    let grown: CreatePartitionsResponse = c.call(ApiKey::CreatePartitions, 3, &grow);
    assert_eq!(
        grown.results[0].error_code, 0,
        "{:?}",
        grown.results[0].error_message
    );
    r.kill_broker(master);

    let g = r.wait_group("no new master elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    let new_master = r.index_of(&g, g["master"].as_u64().unwrap());
    let mut c = Client::connect(&r.kafka[new_master]);
    let mut ask = MetadataRequest::default();
    ask.allow_auto_topic_creation = false;
    for name in ["KafkaMade", "KafkaGrown"] {
        let mut t = MetadataRequestTopic::default();
        t.name = Some(topic_name(name));
        ask.topics.get_or_insert_with(Vec::new).push(t);
    }
    let deadline = std::time::Instant::now() + support::replicas::LIMIT;
    let partitions = loop {
        let m: MetadataResponse = c.call(ApiKey::Metadata, 9, &ask);
        let counts: Vec<(String, i16, usize)> = m
            .topics
            .iter()
            .map(|t| {
                let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
                (name, t.error_code, t.partitions.len())
            })
            .collect();
        // A new master answers its own topics once it took over its log's metadata.
        if counts.iter().all(|(_, e, _)| *e == 0) {
            break counts;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new master does not have the topics answered before the kill: {counts:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(
        partitions,
        [
            ("KafkaMade".to_string(), 0, 2),
            ("KafkaGrown".to_string(), 0, 5)
        ]
    );
}
