//! SQL92 subscriptions on pull (RocketMQ's `enablePropertyFilter`): refused when the filter is
//! off, compile errors answered SUBSCRIPTION_PARSE_FAILED, matching records served from the
//! header's or the heartbeat's subscription, held pulls woken by arrivals.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::*;
use shoal_proto::body::{
    CheckClientRequestBody, ConsumeFromWhere, ConsumeType, ConsumerData, HeartbeatData,
    MessageModel, SubscriptionData,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{PullMessageRequestHeader, PullMessageResponseHeader};
use shoal_proto::RemotingCommand;
use std::time::{Duration, Instant};

const SUSPEND: i32 = 0x2;
const SUBSCRIPTION: i32 = 0x4;

fn sql_pull(topic: &str, offset: i64, sql: &str, suspend_ms: i64) -> RemotingCommand {
    RemotingCommand::request_with_header(
        rc::PULL_MESSAGE,
        &PullMessageRequestHeader {
            consumer_group: "G".into(),
            topic: topic.into(),
            queue_id: 0,
            queue_offset: offset,
            max_msg_nums: 32,
            sys_flag: SUBSCRIPTION | SUSPEND,
            suspend_timeout_millis: suspend_ms,
            subscription: Some(sql.into()),
            expression_type: Some("SQL92".into()),
            ..Default::default()
        },
    )
}

fn check_req(sql: &str) -> RemotingCommand {
    let body = CheckClientRequestBody {
        client_id: "c1".into(),
        group: "G".into(),
        subscription_data: Some(SubscriptionData::sql92("T", sql, 1)),
    };
    RemotingCommand::request(rc::CHECK_CLIENT_CONFIG)
        .with_ext_fields(Default::default())
        .with_json_body(&body)
        .unwrap()
}

async fn send_numbered(c: &RawClient, topic: &str, n: usize) {
    for i in 0..n {
        let p = props(&[
            ("a", &i.to_string()),
            ("kind", if i % 2 == 0 { "even" } else { "odd" }),
        ]);
        ok(&c
            .call(send_req(topic, 0, format!("m{i}").as_bytes(), &p))
            .await);
    }
}

fn values(r: &RemotingCommand) -> Vec<String> {
    decode(r)
        .iter()
        .map(|m| m.properties.get("a").cloned().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn sql92_is_refused_while_the_property_filter_is_off() {
    let cluster = Cluster::start().await;
    let c = RawClient::new(&cluster.broker_addr);
    ok(&c.call(create_topic_req("T", 1)).await);
    let r = c.call(sql_pull("T", 0, "a > 1", 0)).await;
    assert_eq!(r.code, resp::SYSTEM_ERROR, "{:?}", r.remark);
    assert!(r.remark.unwrap_or_default().contains("SQL92"));
    let r = c.call(check_req("a > 1")).await;
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    c.shutdown();
    cluster.stop().await;
}

#[tokio::test]
async fn header_subscriptions_filter_by_properties() {
    let cluster = Cluster::start_with(|c| c.enable_property_filter = true).await;
    let c = RawClient::new(&cluster.broker_addr);
    ok(&c.call(create_topic_req("T", 1)).await);
    send_numbered(&c, "T", 10).await;

    // Checked at subscribe time: a good selector passes, a bad one says why.
    ok(&c.call(check_req("a >= 5 AND kind = 'odd'")).await);
    let r = c.call(check_req("a >=")).await;
    assert_eq!(r.code, resp::SUBSCRIPTION_PARSE_FAILED);
    assert!(r.remark.unwrap_or_default().contains("a >="));

    let r = c.call(sql_pull("T", 0, "a >= 5 AND kind = 'odd'", 0)).await;
    ok(&r);
    assert_eq!(values(&r), ["5", "7", "9"]);
    let h: PullMessageResponseHeader = r.decode_command_header().unwrap();
    assert_eq!(h.next_begin_offset, 10);
    let offsets: Vec<i64> = decode(&r).iter().map(|m| m.queue_offset).collect();
    assert_eq!(offsets, [5, 7, 9]);

    // Nothing matches: NO_MATCHED_MESSAGE, and the scan moves on.
    let r = c.call(sql_pull("T", 0, "a > 100", 0)).await;
    assert_eq!(r.code, resp::PULL_RETRY_IMMEDIATELY);
    let h: PullMessageResponseHeader = r.decode_command_header().unwrap();
    assert_eq!(h.next_begin_offset, 10);

    // Absent properties are null: not a match, in either form.
    let r = c
        .call(sql_pull("T", 0, "missing IS NULL AND a IN ('3', '4')", 0))
        .await;
    assert_eq!(values(&r), ["3", "4"]);
    let r = c.call(sql_pull("T", 0, "missing NOT IN ('x')", 0)).await;
    assert_eq!(r.code, resp::PULL_RETRY_IMMEDIATELY);

    let r = c.call(sql_pull("T", 0, "a BETWEEN 9 AND 1", 0)).await;
    assert_eq!(r.code, resp::SUBSCRIPTION_PARSE_FAILED, "{:?}", r.remark);
    c.shutdown();
    cluster.stop().await;
}

#[tokio::test]
async fn heartbeat_subscriptions_filter_and_held_pulls_wake() {
    let cluster = Cluster::start_with(|c| c.enable_property_filter = true).await;
    let c = RawClient::new(&cluster.broker_addr);
    ok(&c.call(create_topic_req("T", 1)).await);
    let data = HeartbeatData {
        client_id: "c1".into(),
        consumer_data_set: vec![ConsumerData {
            consume_from_where: ConsumeFromWhere::ConsumeFromFirstOffset,
            consume_type: ConsumeType::ConsumePassively,
            group_name: "G".into(),
            message_model: MessageModel::Clustering,
            subscription_data_set: vec![SubscriptionData::sql92("T", "kind = 'even'", 1)],
            unit_mode: false,
        }],
        ..Default::default()
    };
    let hb = RemotingCommand::request(rc::HEART_BEAT)
        .with_ext_fields(Default::default())
        .with_json_body(&data)
        .unwrap();
    ok(&c.call(hb).await);
    send_numbered(&c, "T", 4).await;
    // No SUBSCRIPTION flag: the heartbeat's selector applies.
    let r = c.call(pull_req("G", "T", 0, 0, SUSPEND, 0)).await;
    ok(&r);
    assert_eq!(values(&r), ["0", "2"]);

    // A pull held at the end is answered when a matching message arrives.
    let started = Instant::now();
    let held = {
        let client = RawClient::new(&cluster.broker_addr);
        tokio::spawn(async move {
            let r = client.call(sql_pull("T", 4, "a = 42", 4_000)).await;
            client.shutdown();
            r
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let p = props(&[("a", "42")]);
    ok(&c.call(send_req("T", 0, b"answer", &p)).await);
    let r = held.await.unwrap();
    ok(&r);
    assert_eq!(values(&r), ["42"]);
    assert!(started.elapsed() < Duration::from_secs(3));
    c.shutdown();
    cluster.stop().await;
}
