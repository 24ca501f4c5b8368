//! Pulls answered by the master and by a replica of a replicated broker group (separate
//! `shoal` processes on 127.0.0.1): both suggest `brokerId` 0, and a pull past the queue's end
//! moves the consumer's offset at the master (PULL_OFFSET_MOVED) but not at a replica
//! (PULL_RETRY_IMMEDIATELY at the requested offset), as RocketMQ's slaves answer with
//! `offsetCheckInSlave = false`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod support;

use shoal_net::{NetConfig, NotSupportedProcessor, RemotingClient};
use shoal_proto::body::{ConsumerData, HeartbeatData};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::pull_sys_flag;
use shoal_proto::header::{PullMessageRequestHeader, PullMessageResponseHeader};
use shoal_proto::RemotingCommand;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::replicas::{in_sync_len, Replicas, LIMIT};

const T: Duration = Duration::from_secs(5);
const TOPIC: &str = "Pulls";
const GROUP: &str = "PullsGroup";

fn pull(offset: i64) -> RemotingCommand {
    RemotingCommand::request(rc::PULL_MESSAGE).with_header(&PullMessageRequestHeader {
        consumer_group: GROUP.into(),
        topic: TOPIC.into(),
        queue_id: 0,
        queue_offset: offset,
        max_msg_nums: 32,
        sys_flag: pull_sys_flag::SUBSCRIPTION,
        subscription: Some("*".into()),
        ..Default::default()
    })
}

fn heartbeat() -> RemotingCommand {
    let hb = HeartbeatData {
        client_id: "replication-pull".into(),
        consumer_data_set: vec![ConsumerData {
            group_name: GROUP.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    RemotingCommand::request(rc::HEART_BEAT)
        .with_json_body(&hb)
        .unwrap()
}

#[test]
fn a_pull_past_the_end_moves_the_offset_at_the_master_and_not_at_a_replica() {
    let r = Replicas::start();
    let g = r.wait_group("no master with three in sync", |g| {
        g["master"].is_u64() && in_sync_len(g) == 3
    });
    let master = r.index_of(&g, g["master"].as_u64().unwrap());
    let replica = (master + 1) % 3;
    let master_addr = r.brokers[master].0.clone();
    let replica_addr = r.brokers[replica].0.clone();
    r.cluster.json(&[
        "topic",
        "create",
        TOPIC,
        "--queues",
        "1",
        "--brokers",
        &master_addr,
        "--json",
    ]);
    let sent = r
        .cluster
        .dev
        .cmd(&["send", TOPIC, "--body", "m-{i}", "--count", "5"]);
    assert!(
        sent.status.success(),
        "send: {}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
        // The replica serves the five messages once its log and the group's tables caught up.
        let deadline = Instant::now() + LIMIT;
        loop {
            client.invoke(&master_addr, heartbeat(), T).await.unwrap();
            client.invoke(&replica_addr, heartbeat(), T).await.unwrap();
            let a = client.invoke(&replica_addr, pull(0), T).await.unwrap();
            // Answers other than SUCCESS (the topic or group not there yet) carry no header.
            let h: Option<PullMessageResponseHeader> = a.decode_command_header().ok();
            if let Some(h) = h.filter(|h| a.code == resp::SUCCESS && h.next_begin_offset == 5) {
                assert_eq!(h.suggest_which_broker_id, 0);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica never served the 5 messages: code {} {:?}",
                a.code,
                a.remark
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let at_master = client.invoke(&master_addr, pull(100), T).await.unwrap();
        let h: PullMessageResponseHeader = at_master.decode_command_header().unwrap();
        assert_eq!(
            at_master.code,
            resp::PULL_OFFSET_MOVED,
            "{:?}",
            at_master.remark
        );
        assert_eq!(h.next_begin_offset, 5);
        assert_eq!(h.suggest_which_broker_id, 0);
        let at_replica = client.invoke(&replica_addr, pull(100), T).await.unwrap();
        let h: PullMessageResponseHeader = at_replica.decode_command_header().unwrap();
        assert_eq!(
            at_replica.code,
            resp::PULL_RETRY_IMMEDIATELY,
            "{:?}",
            at_replica.remark
        );
        assert_eq!(h.next_begin_offset, 100, "the replica keeps the offset");
        assert_eq!(
            h.suggest_which_broker_id, 0,
            "and sends the consumer to the master"
        );
    });
}
