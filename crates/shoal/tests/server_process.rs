//! The `shoal` binary as separate processes: a broker killed with SIGKILL under sync flush
//! serves every acknowledged message after restart, exactly once; a broker started before its
//! name server registers soon after the name server comes up.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;
use shoal_net::{NetConfig, NotSupportedProcessor, RemotingClient};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    CreateTopicRequestHeader, PullMessageRequestHeader, SendMessageRequestHeader,
    SendMessageRequestHeaderV2, SendMessageResponseHeader,
};
use shoal_proto::message::{decode_records, DecodeOptions};
use shoal_proto::RemotingCommand;
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use support::free_port;

const T: Duration = Duration::from_secs(5);

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str]) -> Proc {
    Proc(
        Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn shoal"),
    )
}

async fn wait_ready(client: &RemotingClient, addr: &str) {
    for _ in 0..200 {
        if let Ok(r) = client
            .invoke(
                addr,
                RemotingCommand::request(rc::GET_BROKER_RUNTIME_INFO),
                T,
            )
            .await
        {
            if r.code == resp::SUCCESS {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("broker at {addr} never became ready");
}

fn send_req(topic: &str, queue_id: i32, body: Vec<u8>) -> RemotingCommand {
    let h = SendMessageRequestHeader {
        producer_group: "PG".into(),
        topic: topic.into(),
        default_topic: "TBW102".into(),
        default_topic_queue_nums: 4,
        queue_id,
        born_timestamp: 1,
        ..Default::default()
    };
    RemotingCommand::request_with_header(rc::SEND_MESSAGE_V2, &SendMessageRequestHeaderV2::from(h))
        .with_body(body)
}

#[tokio::test]
async fn sigkilled_broker_under_sync_flush_serves_every_acknowledged_message() {
    let dir = tempfile::tempdir().unwrap();
    let ns_port = free_port();
    let broker_port = free_port();
    let ns_addr = format!("127.0.0.1:{ns_port}");
    let broker_addr = format!("127.0.0.1:{broker_port}");
    let data = dir.path().join("broker");
    let broker_args = [
        "broker",
        "--listen",
        &broker_addr,
        "--namesrv",
        &ns_addr,
        "--data-dir",
        data.to_str().unwrap(),
        "--flush",
        "sync",
    ];
    let _ns = spawn(&["namesrv", "--listen", &ns_addr]);
    let mut broker = spawn(&broker_args);
    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    wait_ready(&client, &broker_addr).await;
    let create = RemotingCommand::request_with_header(
        rc::UPDATE_AND_CREATE_TOPIC,
        &CreateTopicRequestHeader {
            topic: "Durable".into(),
            default_topic: "TBW102".into(),
            read_queue_nums: 2,
            write_queue_nums: 2,
            perm: 6,
            topic_filter_type: "SINGLE_TAG".into(),
            ..Default::default()
        },
    );
    assert_eq!(
        client.invoke(&broker_addr, create, T).await.unwrap().code,
        resp::SUCCESS
    );

    // Concurrent senders; SIGKILL lands while sends are in flight.
    let acked = Arc::new(std::sync::Mutex::new(Vec::<(i32, i64, Vec<u8>)>::new()));
    let mut senders = Vec::new();
    for w in 0..4 {
        let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
        let acked = acked.clone();
        let addr = broker_addr.clone();
        senders.push(tokio::spawn(async move {
            for i in 0..100_000 {
                let body = format!("w{w}-m{i}").into_bytes();
                match client
                    .invoke(&addr, send_req("Durable", w % 2, body.clone()), T)
                    .await
                {
                    Ok(r) if r.code == resp::SUCCESS => {
                        let h: SendMessageResponseHeader = r.decode_command_header().unwrap();
                        acked
                            .lock()
                            .unwrap()
                            .push((h.queue_id, h.queue_offset, body));
                    }
                    _ => break,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    broker.0.kill().unwrap(); // SIGKILL
    broker.0.wait().unwrap();
    for s in senders {
        s.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 10,
        "too few sends acknowledged before the kill: {}",
        acked.len()
    );

    let _broker2 = spawn(&broker_args);
    wait_ready(&client, &broker_addr).await;
    let mut stored: HashMap<(i32, i64), Vec<u8>> = HashMap::new();
    for q in 0..2 {
        let mut offset = 0;
        loop {
            let pull = RemotingCommand::request_with_header(
                rc::PULL_MESSAGE,
                &PullMessageRequestHeader {
                    consumer_group: "G".into(),
                    topic: "Durable".into(),
                    queue_id: q,
                    queue_offset: offset,
                    max_msg_nums: 256,
                    sys_flag: shoal_proto::constants::pull_sys_flag::SUBSCRIPTION,
                    subscription: Some("*".into()),
                    ..Default::default()
                },
            );
            // The group is auto-created by a heartbeat in real use; create it via a heartbeat.
            let hb = shoal_proto::body::HeartbeatData {
                client_id: "checker".into(),
                consumer_data_set: vec![shoal_proto::body::ConsumerData {
                    group_name: "G".into(),
                    ..Default::default()
                }],
                ..Default::default()
            };
            let hb = RemotingCommand::request(rc::HEART_BEAT)
                .with_json_body(&hb)
                .unwrap();
            client.invoke(&broker_addr, hb, T).await.unwrap();
            let r = client.invoke(&broker_addr, pull, T).await.unwrap();
            if r.code != resp::SUCCESS {
                break;
            }
            let run = decode_records(r.body.as_ref().unwrap(), &DecodeOptions::client());
            assert!(
                run.error.is_none(),
                "corrupt record after recovery: {:?}",
                run.error
            );
            for m in run.messages {
                assert!(
                    stored
                        .insert((q, m.queue_offset), m.body.to_vec())
                        .is_none(),
                    "offset served twice"
                );
            }
            let h: shoal_proto::header::PullMessageResponseHeader =
                r.decode_command_header().unwrap();
            offset = h.next_begin_offset;
        }
    }
    for (q, off, body) in &acked {
        assert_eq!(
            stored.get(&(*q, *off)),
            Some(body),
            "acknowledged message {q}/{off} lost or changed after SIGKILL"
        );
    }
    let mut bodies: Vec<&Vec<u8>> = stored.values().collect();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), stored.len(), "a message was stored twice");
    println!(
        "acknowledged before SIGKILL: {}, served after restart: {} (extra = written but not acknowledged)",
        acked.len(),
        stored.len()
    );
}

/// A broker started before its name server (as compose files and unit files often do) is known
/// to the name server soon after the name server comes up: a registration that failed is tried
/// again after 0.5 s, doubling, not only every `register_interval_ms` (30 s).
#[test]
fn a_broker_started_before_its_name_server_registers_soon_after_it_comes_up() {
    let dir = tempfile::tempdir().unwrap();
    let (ns_port, broker_port) = (free_port(), free_port());
    let ns = format!("127.0.0.1:{ns_port}");
    let data = dir.path().join("data");
    let _broker = spawn(&[
        "broker",
        "--listen",
        &format!("127.0.0.1:{broker_port}"),
        "--namesrv",
        &ns,
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    // The broker's first registrations are refused: nothing listens yet.
    std::thread::sleep(Duration::from_secs(2));
    let _namesrv = spawn(&["namesrv", "--listen", &ns]);
    let started = std::time::Instant::now();
    let known = loop {
        let out = Command::new(env!("CARGO_BIN_EXE_shoal"))
            .args(["--namesrv", &ns, "cluster", "list"])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains(&broker_port.to_string()) {
            break true;
        }
        if started.elapsed() > Duration::from_secs(15) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The backoff reaches 4 s by then (0.5, 1, 2, 4): well within 15 s, far from the 30 s
    // interval a registration used to wait after a failure.
    assert!(
        known,
        "the broker was not registered 15 s after the name server started"
    );
}
