//! Pulls answered by the master and by a replica of a replicated broker group (separate
//! `shoal` processes on 127.0.0.1): both suggest `brokerId` 0, and a pull past the queue's end
//! moves the consumer's offset at the master (PULL_OFFSET_MOVED) but not at a replica
//! (PULL_RETRY_IMMEDIATELY at the requested offset), as RocketMQ's slaves answer with
//! `offsetCheckInSlave = false`. Offsets committed to replicas while the group has no master
//! reach the master elected next, whichever replica it is.
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
use shoal_proto::header::{
    PullMessageRequestHeader, PullMessageResponseHeader, QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader, UpdateConsumerOffsetRequestHeader,
};
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

fn commit(queue_id: i32, offset: i64) -> RemotingCommand {
    RemotingCommand::request(rc::UPDATE_CONSUMER_OFFSET).with_header(
        &UpdateConsumerOffsetRequestHeader {
            consumer_group: GROUP.into(),
            topic: TOPIC.into(),
            queue_id,
            commit_offset: offset,
            ..Default::default()
        },
    )
}

fn query(queue_id: i32) -> RemotingCommand {
    RemotingCommand::request(rc::QUERY_CONSUMER_OFFSET).with_header(
        &QueryConsumerOffsetRequestHeader {
            consumer_group: GROUP.into(),
            topic: TOPIC.into(),
            queue_id,
            set_zero_if_not_found: Some(false),
            ..Default::default()
        },
    )
}

/// A group with a master and three in sync, and [`TOPIC`] of `queues` queues created on the
/// master: the group, its master epoch, the master's index and every broker's address.
fn group_with_topic(queues: &str) -> (Replicas, u64, usize, Vec<String>) {
    let r = Replicas::start();
    let g = r.wait_group("no master with three in sync", |g| {
        g["master"].is_u64() && in_sync_len(g) == 3
    });
    let epoch = g["masterEpoch"].as_u64().unwrap();
    let master = r.index_of(&g, g["master"].as_u64().unwrap());
    let addrs: Vec<String> = r.brokers.iter().map(|b| b.0.clone()).collect();
    let create = ["topic", "create", TOPIC, "--queues", queues, "--brokers"];
    let mut args = create.to_vec();
    args.extend([addrs[master].as_str(), "--json"]);
    r.cluster.json(&args);
    (r, epoch, master, addrs)
}

/// The master is killed; a client commits queue 0 to one replica and queue 1 to the other
/// (as RocketMQ's clients commit to a replica while their route has no master). Whichever
/// replica is elected, the new master ends up with both commits, and so does the other
/// replica (through the new master's replicated offsets).
#[test]
fn offsets_committed_to_replicas_without_a_master_reach_the_new_master() {
    let (mut r, epoch, master, addrs) = group_with_topic("2");
    let replicas = [(master + 1) % 3, (master + 2) % 3];
    let addr = |i: usize| addrs[i].clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    // Both replicas know the topic (the master's tables replicated) before the kill: they
    // take a commit of offset 0 (forwarded to the live master).
    rt.block_on(async {
        for i in replicas {
            let deadline = Instant::now() + LIMIT;
            loop {
                let a = client.invoke(&addr(i), commit(0, 0), T).await.unwrap();
                if a.code == resp::SUCCESS {
                    break;
                }
                assert!(Instant::now() < deadline, "replica {i} never had the topic");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    r.kill_broker(master);
    rt.block_on(async {
        for (i, (queue, offset)) in replicas.into_iter().zip([(0, 3), (1, 4)]) {
            let a = client
                .invoke(&addr(i), commit(queue, offset), T)
                .await
                .unwrap();
            assert_eq!(
                a.code,
                resp::SUCCESS,
                "commit to replica {i}: {:?}",
                a.remark
            );
        }
    });
    let g = r.wait_group("no new master elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    let new_master = r.index_of(&g, g["master"].as_u64().unwrap());
    assert_ne!(new_master, master);
    rt.block_on(async {
        // The new master first, then the other replica (from the new master's offsets).
        let other = replicas.into_iter().find(|i| *i != new_master).unwrap();
        for i in [new_master, other] {
            let deadline = Instant::now() + LIMIT;
            loop {
                let mut got = Vec::new();
                for q in [0, 1] {
                    let a = client.invoke(&addr(i), query(q), T).await.unwrap();
                    let h: Option<QueryConsumerOffsetResponseHeader> =
                        a.decode_command_header().ok();
                    got.push(h.filter(|_| a.code == resp::SUCCESS).map(|h| h.offset));
                }
                if got == [Some(3), Some(4)] {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "broker {i} (new master {new_master}) has offsets {got:?}, not [3, 4]"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
}

/// A topic created on the master, and then a commit marked `shoalWaitReplicated` (how a Kafka
/// coordinator commits another broker group's partition), and a plain commit that waits for
/// its answer, are answered only once the in-sync set has them (a replica refuses the marked
/// commit): the master killed right after the answers, the new master has the topic and both
/// offsets.
#[test]
fn a_topic_and_a_commit_answered_once_replicated_survive_a_kill_right_after_their_answers() {
    let (mut r, epoch, master, addrs) = group_with_topic("2");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = RemotingClient::new(NetConfig::default(), Arc::new(NotSupportedProcessor));
    let waiting = |offset: i64| {
        let mut c = commit(0, offset);
        c.ext_fields
            .get_or_insert_with(Default::default)
            .insert(shoal_proto::ext::field::WAIT_REPLICATED, "true");
        c
    };
    rt.block_on(async {
        let replica = (master + 1) % 3;
        let a = client.invoke(&addrs[replica], waiting(1), T).await.unwrap();
        assert_eq!(a.code, resp::SERVICE_NOT_AVAILABLE, "{:?}", a.remark);
        let a = client.invoke(&addrs[master], waiting(9), T).await.unwrap();
        assert_eq!(a.code, resp::SUCCESS, "{:?}", a.remark);
        // A plain commit that waits for its answer (not oneway) is answered so too.
        let a = client
            .invoke(&addrs[master], commit(1, 7), T)
            .await
            .unwrap();
        assert_eq!(a.code, resp::SUCCESS, "{:?}", a.remark);
    });
    r.kill_broker(master);
    let g = r.wait_group("no new master elected", |g| {
        g["masterEpoch"].as_u64().unwrap_or(0) > epoch && g["master"].is_u64()
    });
    let new_master = r.index_of(&g, g["master"].as_u64().unwrap());
    rt.block_on(async {
        let deadline = Instant::now() + LIMIT;
        loop {
            // A forwarded commit is answered once the new master took over (it applied its
            // log), and moves no offset back.
            let mut probe = commit(0, 0);
            probe
                .ext_fields
                .get_or_insert_with(Default::default)
                .insert(shoal_proto::ext::field::FORWARDED, "true");
            let a = client.invoke(&addrs[new_master], probe, T).await.unwrap();
            if a.code == resp::SUCCESS {
                break;
            }
            assert!(Instant::now() < deadline, "{:?}", a.remark);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let a = client
            .invoke(&addrs[new_master], query(0), T)
            .await
            .unwrap();
        let h: QueryConsumerOffsetResponseHeader = a.decode_command_header().unwrap();
        assert_eq!(
            h.offset, 9,
            "the new master has the commit answered before the kill"
        );
        let a = client
            .invoke(&addrs[new_master], query(1), T)
            .await
            .unwrap();
        let h: QueryConsumerOffsetResponseHeader = a.decode_command_header().unwrap();
        assert_eq!(
            h.offset, 7,
            "the new master has the plain commit answered before the kill"
        );
    });
}
