//! Bounded resources and protocol strictness over TCP against an in-process broker: pull answer
//! caps, heartbeat limits, system topics, queue ids, expression types, group auto-create.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::*;
use shoal_proto::body::{ConsumerData, HeartbeatData, MessageModel, SubscriptionData};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::pull_sys_flag;
use shoal_proto::header::{
    GetMaxOffsetRequestHeader, PullMessageResponseHeader, UpdateConsumerOffsetRequestHeader,
};
use shoal_proto::RemotingCommand;

fn sub_pull(group: &str, topic: &str, q: i32, offset: i64, max: i32) -> RemotingCommand {
    let mut r = pull_req(group, topic, q, offset, pull_sys_flag::SUBSCRIPTION, 0);
    let mut h: shoal_proto::header::PullMessageRequestHeader = r.decode_command_header().unwrap();
    h.max_msg_nums = max;
    h.subscription = Some("*".into());
    r = RemotingCommand::request_with_header(rc::PULL_MESSAGE, &h);
    r
}

#[tokio::test]
async fn pull_answers_are_capped_and_a_large_message_is_served_alone() {
    let c = Cluster::start_with(|cfg| {
        cfg.max_message_bytes = 1024 * 1024;
    })
    .await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req("Big", 1)).await);
    // 6 messages of 700 KiB: each is above the 256 KiB cap.
    for _ in 0..6 {
        ok(&client
            .call(send_req("Big", 0, &vec![7u8; 700 * 1024], ""))
            .await);
    }
    // 100 small ones.
    for i in 0..100 {
        ok(&client
            .call(send_req("Big", 0, format!("s{i}").as_bytes(), ""))
            .await);
    }
    // A pull asking for 1000 messages and 2 GiB: one large message per answer.
    let mut req = sub_pull("G", "Big", 0, 0, 1000);
    req.ext_fields
        .as_mut()
        .unwrap()
        .insert("maxMsgBytes", (i32::MAX).to_string());
    let r = client.call(req).await;
    ok(&r);
    assert_eq!(
        decode(&r).len(),
        1,
        "a message above the cap is served alone"
    );
    let mut offset = 0;
    let mut answers = 0;
    while offset < 106 {
        let r = client.call(sub_pull("G", "Big", 0, offset, 1000)).await;
        ok(&r);
        let n = decode(&r).len();
        assert!(
            n <= 32,
            "answer of {n} messages is above the 32-message cap"
        );
        assert!(r.body.as_ref().unwrap().len() <= 700 * 1024 + 512);
        let h: PullMessageResponseHeader = r.decode_command_header().unwrap();
        offset = h.next_begin_offset;
        answers += 1;
    }
    assert!(answers >= 6 + 4, "{answers} answers");
    assert!(c.counter("shoal_broker_pulls_capped_total") >= 1);
    client.shutdown();
    c.stop().await;
}

fn heartbeat_with_groups(client_id: &str, groups: usize, subs: usize) -> RemotingCommand {
    let data = HeartbeatData {
        client_id: client_id.into(),
        consumer_data_set: (0..groups)
            .map(|g| ConsumerData {
                group_name: format!("G{g}"),
                message_model: MessageModel::Clustering,
                subscription_data_set: (0..subs)
                    .map(|t| SubscriptionData::from_tag_expression(format!("T{t}"), "*", 1))
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    RemotingCommand::request(rc::HEART_BEAT)
        .with_json_body(&data)
        .unwrap()
}

#[tokio::test]
async fn heartbeat_contents_are_bounded() {
    let c = Cluster::start_with(|cfg| {
        cfg.max_groups_per_client = 8;
        cfg.max_subscriptions_per_group = 4;
        cfg.max_heartbeat_bytes = 64 * 1024;
        cfg.max_subscription_groups = 12;
    })
    .await;
    let client = RawClient::new(&c.broker_addr);
    let b = c.broker.as_ref().unwrap().api();
    // Within the limits.
    ok(&client.call(heartbeat_with_groups("c1", 8, 4)).await);
    // Too many groups for one connection (also across heartbeats).
    let r = client.call(heartbeat_with_groups("c1", 9, 1)).await;
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("max_groups_per_client"));
    // Too many subscriptions in one group.
    let r = client.call(heartbeat_with_groups("c1", 1, 5)).await;
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("max_subscriptions_per_group"));
    // Too large a body.
    let mut big = heartbeat_with_groups("c1", 1, 1);
    big.body = Some(vec![b' '; 64 * 1024 + 1].into());
    let r = client.call(big).await;
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("max_heartbeat_bytes"));
    assert_eq!(c.counter("shoal_broker_heartbeats_refused_total"), 3);
    assert_eq!(
        b.subscription_groups().len(),
        8,
        "refused heartbeats created nothing"
    );
    // The broker-wide cap on auto-created groups: another client, 8 more groups, 4 fit.
    let other = RawClient::new(&c.broker_addr);
    let hb = heartbeat_with_groups("c2", 8, 1);
    let mut data: HeartbeatData = hb.decode_json_body().unwrap();
    for (i, cd) in data.consumer_data_set.iter_mut().enumerate() {
        cd.group_name = format!("H{i}");
    }
    let hb = RemotingCommand::request(rc::HEART_BEAT)
        .with_json_body(&data)
        .unwrap();
    ok(&other.call(hb).await);
    assert_eq!(b.subscription_groups().len(), 12);
    assert_eq!(c.counter("shoal_broker_groups_refused_total"), 4);
    // A pull for yet another new group is refused too.
    ok(&client.call(create_topic_req("T0", 1)).await);
    let r = client.call(sub_pull("Fresh", "T0", 0, 0, 1)).await;
    assert_eq!(r.code, resp::SUBSCRIPTION_GROUP_NOT_EXIST);
    assert!(r.remark.unwrap().contains("max_subscription_groups"));
    client.shutdown();
    other.shutdown();
    c.stop().await;
}

#[tokio::test]
async fn protocol_strictness_as_java() {
    let c = Cluster::start().await;
    let client = RawClient::new(&c.broker_addr);
    let b = c.broker.as_ref().unwrap().api();
    // System topics refuse client sends.
    for topic in [
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    ] {
        let r = client.call(send_req(topic, 0, b"x", "")).await;
        assert_eq!(r.code, resp::NO_PERMISSION, "{topic}");
        assert!(r.remark.unwrap().contains("forbidden"));
    }
    assert_eq!(b.store().max_offset("SCHEDULE_TOPIC_XXXX", 0), 0);
    // Delayed messages still reach the schedule topic through the broker itself.
    ok(&client.call(create_topic_req("T", 2)).await);
    ok(&client
        .call(send_req("T", 0, b"later", &props(&[("DELAY", "1")])))
        .await);
    assert_eq!(b.store().max_offset("SCHEDULE_TOPIC_XXXX", 0), 1);

    // Offset commits and offset queries for impossible queue ids are refused.
    client.join("c1", "G", &[("T", "*")]).await;
    for q in [-2, 2, i32::MAX] {
        let commit = RemotingCommand::request_with_header(
            rc::UPDATE_CONSUMER_OFFSET,
            &UpdateConsumerOffsetRequestHeader {
                consumer_group: "G".into(),
                topic: "T".into(),
                queue_id: q,
                commit_offset: 5,
                ..Default::default()
            },
        );
        let r = client.call(commit).await;
        assert_eq!(r.code, resp::INVALID_PARAMETER, "commit for queue {q}");
        let max = RemotingCommand::request_with_header(
            rc::GET_MAX_OFFSET,
            &GetMaxOffsetRequestHeader {
                topic: "T".into(),
                queue_id: q,
                ..Default::default()
            },
        );
        assert_eq!(client.call(max).await.code, resp::INVALID_PARAMETER);
    }
    assert!(b.store().offsets_of_group("G").is_empty());

    // expressionType "" means TAG.
    ok(&client.call(send_req("T", 1, b"m", "")).await);
    let mut req = sub_pull("G", "T", 1, 0, 8);
    req.ext_fields
        .as_mut()
        .unwrap()
        .insert("expressionType", String::new());
    let r = client.call(req).await;
    ok(&r);
    assert_eq!(decode(&r).len(), 1);

    // A pull for a group that never sent a heartbeat creates it (auto-create on).
    let r = client.call(sub_pull("NeverSeen", "T", 1, 0, 8)).await;
    ok(&r);
    assert!(b.subscription_groups().contains(&"NeverSeen".to_string()));
    let text = std::fs::read_to_string(c.dir.path().join("config/subscriptionGroup.json")).unwrap();
    assert!(
        text.contains("NeverSeen"),
        "the auto-created group is on disk before the answer"
    );
    client.shutdown();
    c.stop().await;
}
