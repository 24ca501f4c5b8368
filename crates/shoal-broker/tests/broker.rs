//! The broker over real TCP, driven with raw protocol requests: every request family, its error
//! paths, and the invariants of issue 4.

mod common;

use common::*;
use shoal_proto::body::{
    ConsumeStats, GetConsumerListByGroupResponseBody, KVTable, LockBatchRequestBody,
    LockBatchResponseBody, MessageModel, UnlockBatchRequestBody,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::pull_sys_flag;
use shoal_proto::header::*;
use shoal_proto::message::property;
use shoal_proto::{MessageQueue, RemotingCommand};
use std::time::{Duration, Instant};

#[tokio::test]
async fn send_and_pull_round_trip_with_tags() {
    let c = Cluster::start().await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req("T", 2)).await);

    for (i, tag) in ["tagA", "tagB", "tagA"].iter().enumerate() {
        let r = client
            .call(send_req(
                "T",
                0,
                format!("m{i}").as_bytes(),
                &props(&[
                    ("TAGS", tag),
                    ("UNIQ_KEY", &format!("U{i}")),
                    ("KEYS", "k1 k2"),
                ]),
            ))
            .await;
        ok(&r);
        let h: SendMessageResponseHeader = r.decode_command_header().unwrap();
        assert_eq!(h.queue_id, 0);
        assert_eq!(h.queue_offset, i as i64);
        assert_eq!(h.msg_id.len(), 32);
        assert_eq!(h.transaction_id.as_deref(), Some(format!("U{i}").as_str()));
    }

    // Subscription in the pull itself (lite pull style), filter tagA.
    let mut pull = pull_req("G", "T", 0, 0, pull_sys_flag::SUBSCRIPTION, 0);
    pull.ext_fields
        .as_mut()
        .unwrap()
        .insert("subscription", "tagA");
    client.join("c1", "G", &[("T", "*")]).await;
    let r = client.call(pull).await;
    ok(&r);
    let h: PullMessageResponseHeader = r.decode_command_header().unwrap();
    assert_eq!(h.next_begin_offset, 3);
    assert_eq!((h.min_offset, h.max_offset), (0, 3));
    let msgs = decode(&r);
    assert_eq!(msgs.len(), 2);
    assert!(msgs.iter().all(|m| m.tags() == Some("tagA")));
    assert_eq!(msgs[1].body.as_ref(), b"m2");
    assert_eq!(msgs[0].property(property::CLUSTER), Some("DefaultCluster"));

    // Heartbeat subscription "*": all three.
    let r = client.call(pull_req("G", "T", 0, 0, 0, 0)).await;
    assert_eq!(decode(&r).len(), 3);

    // Status rules of spec 5.2.
    let r = client.call(pull_req("G", "T", 0, 3, 0, 0)).await;
    assert_eq!(r.code, resp::PULL_NOT_FOUND);
    let r = client.call(pull_req("G", "T", 0, 9, 0, 0)).await;
    assert_eq!(r.code, resp::PULL_OFFSET_MOVED);
    assert_eq!(
        r.decode_command_header::<PullMessageResponseHeader>()
            .unwrap()
            .next_begin_offset,
        3
    );
    let r = client.call(pull_req("G", "T", 1, 0, 0, 0)).await;
    assert_eq!(r.code, resp::PULL_NOT_FOUND, "empty queue at offset 0");
    let r = client.call(pull_req("G", "T", 1, 5, 0, 0)).await;
    assert_eq!(r.code, resp::PULL_OFFSET_MOVED, "empty queue at offset 5");
    // Only tagB at offset 1 when subscribing tagB from offset 1.. and nothing matching after.
    let mut pull = pull_req("G", "T", 0, 2, pull_sys_flag::SUBSCRIPTION, 0);
    pull.ext_fields
        .as_mut()
        .unwrap()
        .insert("subscription", "tagB");
    let r = client.call(pull).await;
    assert_eq!(r.code, resp::PULL_RETRY_IMMEDIATELY);

    // Lookups.
    let r = client
        .call(RemotingCommand::request_with_header(
            rc::GET_MAX_OFFSET,
            &GetMaxOffsetRequestHeader {
                topic: "T".into(),
                queue_id: 0,
                ..Default::default()
            },
        ))
        .await;
    assert_eq!(
        r.decode_command_header::<GetMaxOffsetResponseHeader>()
            .unwrap()
            .offset,
        3
    );
    let r = client
        .call(RemotingCommand::request_with_header(
            rc::GET_MIN_OFFSET,
            &GetMinOffsetRequestHeader {
                topic: "T".into(),
                queue_id: 0,
                ..Default::default()
            },
        ))
        .await;
    assert_eq!(
        r.decode_command_header::<GetMinOffsetResponseHeader>()
            .unwrap()
            .offset,
        0
    );
    let r = client
        .call(RemotingCommand::request_with_header(
            rc::GET_EARLIEST_MSG_STORETIME,
            &GetEarliestMsgStoretimeRequestHeader {
                topic: "T".into(),
                queue_id: 0,
                ..Default::default()
            },
        ))
        .await;
    let earliest = r
        .decode_command_header::<GetEarliestMsgStoretimeResponseHeader>()
        .unwrap()
        .timestamp;
    assert!(earliest > 1_700_000_000_000);
    let r = client
        .call(RemotingCommand::request_with_header(
            rc::SEARCH_OFFSET_BY_TIMESTAMP,
            &SearchOffsetRequestHeader {
                topic: "T".into(),
                queue_id: 0,
                timestamp: earliest + 3_600_000,
                ..Default::default()
            },
        ))
        .await;
    assert_eq!(
        r.decode_command_header::<SearchOffsetResponseHeader>()
            .unwrap()
            .offset,
        3
    );
    let r = client
        .call(RemotingCommand::request_with_header(
            rc::VIEW_MESSAGE_BY_ID,
            &ViewMessageByIdRequestHeader {
                offset: msgs[0].commit_log_offset,
                ..Default::default()
            },
        ))
        .await;
    ok(&r);
    assert_eq!(decode(&r)[0].uniq_key(), Some("U0"));
    let r = client
        .call(RemotingCommand::request_with_header(
            rc::VIEW_MESSAGE_BY_ID,
            &ViewMessageByIdRequestHeader {
                offset: 1 << 40,
                ..Default::default()
            },
        ))
        .await;
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    let q = QueryMessageRequestHeader {
        topic: "T".into(),
        key: "k2".into(),
        max_num: 32,
        begin_timestamp: 0,
        end_timestamp: i64::MAX,
        ..Default::default()
    };
    let r = client
        .call(RemotingCommand::request_with_header(rc::QUERY_MESSAGE, &q))
        .await;
    ok(&r);
    assert_eq!(decode(&r).len(), 3);
    let q = QueryMessageRequestHeader {
        key: "U1".into(),
        unique_key_query: Some(true),
        ..q
    };
    let r = client
        .call(RemotingCommand::request_with_header(rc::QUERY_MESSAGE, &q))
        .await;
    assert_eq!(decode(&r)[0].body.as_ref(), b"m1");
    client.shutdown();
    c.stop().await;
}

#[tokio::test]
async fn error_paths_are_answered_with_the_right_codes() {
    let c = Cluster::start().await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req("T", 2)).await);
    // Unknown topic (auto-create is off by default).
    let r = client.call(send_req("Nope", 0, b"x", "")).await;
    assert_eq!(r.code, resp::TOPIC_NOT_EXIST);
    assert!(r.remark.unwrap().contains("Nope"));
    // Bad queue id.
    let r = client.call(send_req("T", 7, b"x", "")).await;
    assert_eq!(r.code, resp::INVALID_PARAMETER);
    // Oversized body (limit 1 MiB in tests).
    let r = client
        .call(send_req("T", 0, &vec![0u8; 1024 * 1024 + 1], ""))
        .await;
    assert_eq!(r.code, resp::MESSAGE_ILLEGAL);
    // Missing required header field.
    let mut req = send_req("T", 0, b"x", "");
    req.ext_fields.as_mut().unwrap().remove("b");
    let r = client.call(req).await;
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    assert!(r.remark.unwrap().contains("`b`"));
    // Unknown request code.
    let r = client.call(RemotingCommand::request(4242)).await;
    assert_eq!(r.code, resp::REQUEST_CODE_NOT_SUPPORTED);
    assert!(r.remark.unwrap().contains("4242"));
    // Pull: unknown group, unknown topic, bad queue, no subscription.
    // An unknown group is auto-created by the pull (as RocketMQ), but has no subscription.
    let r = client.call(pull_req("NoGroup", "T", 0, 0, 0, 0)).await;
    assert_eq!(r.code, resp::SUBSCRIPTION_NOT_EXIST);
    client.join("c1", "G", &[("T", "*")]).await;
    let r = client.call(pull_req("G", "Nope", 0, 0, 0, 0)).await;
    assert_eq!(r.code, resp::TOPIC_NOT_EXIST);
    let r = client.call(pull_req("G", "T", 5, 0, 0, 0)).await;
    assert_eq!(r.code, resp::INVALID_PARAMETER);
    ok(&client.call(create_topic_req("U", 1)).await);
    let r = client.call(pull_req("G", "U", 0, 0, 0, 0)).await;
    assert_eq!(r.code, resp::SUBSCRIPTION_NOT_EXIST);
    // Consumer list of an unknown group.
    let r = client
        .call(RemotingCommand::request_with_header(
            rc::GET_CONSUMER_LIST_BY_GROUP,
            &GetConsumerListByGroupRequestHeader {
                consumer_group: "X".into(),
                ..Default::default()
            },
        ))
        .await;
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    // Bad topic name.
    let r = client.call(create_topic_req("bad topic", 1)).await;
    assert_eq!(r.code, resp::INVALID_PARAMETER);
    // Heartbeat with a broken body.
    let r = client
        .call(RemotingCommand::request(rc::HEART_BEAT).with_body(&b"{oops"[..]))
        .await;
    assert_eq!(r.code, resp::SYSTEM_ERROR);
    client.shutdown();
    c.stop().await;
}

#[tokio::test]
async fn long_polling_answers_at_the_moment_of_store() {
    let c = Cluster::start().await;
    let consumer = RawClient::new(&c.broker_addr);
    let producer = RawClient::new(&c.broker_addr);
    ok(&consumer.call(create_topic_req("T", 1)).await);
    consumer.join("c1", "G", &[("T", "tagA")]).await;
    let pull = pull_req("G", "T", 0, 0, pull_sys_flag::SUSPEND, 20_000);
    let started = Instant::now();
    let held = tokio::spawn(async move {
        let r = consumer.call(pull).await;
        (r, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "pull was not held");
    // A non-matching tag does not wake it.
    ok(&producer
        .call(send_req("T", 0, b"b", &props(&[("TAGS", "tagB")])))
        .await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!held.is_finished(), "a non-matching message woke the pull");
    let sent_at = Instant::now();
    ok(&producer
        .call(send_req("T", 0, b"a", &props(&[("TAGS", "tagA")])))
        .await);
    let (r, answered_at) = held.await.unwrap();
    ok(&r);
    let msgs = decode(&r);
    assert_eq!(msgs.iter().filter(|m| m.tags() == Some("tagA")).count(), 1);
    let latency = answered_at.saturating_duration_since(sent_at);
    println!(
        "long-poll answer {:?} after the send (held {:?})",
        latency,
        sent_at - started
    );
    assert!(
        latency < Duration::from_secs(5),
        "held pull answered only at its timeout"
    );

    // Without a message the hold ends at its suspend time with PULL_NOT_FOUND.
    let consumer = RawClient::new(&c.broker_addr);
    consumer.join("c1", "G", &[("T", "*")]).await;
    let r = consumer
        .call(pull_req("G", "T", 0, 2, pull_sys_flag::SUSPEND, 300))
        .await;
    assert_eq!(r.code, resp::PULL_NOT_FOUND);
    c.stop().await;
}

#[tokio::test]
async fn membership_changes_notify_every_member() {
    let c = Cluster::start().await;
    let a = RawClient::new(&c.broker_addr);
    let b = RawClient::new(&c.broker_addr);
    let x = RawClient::new(&c.broker_addr);
    ok(&a.call(create_topic_req("T", 4)).await);
    a.join("a", "G", &[("T", "*")]).await;
    b.join("b", "G", &[("T", "*")]).await;
    assert!(
        a.wait_notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED, 2)
            .await,
        "a: own join + b's join"
    );
    assert!(
        b.wait_notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED, 1)
            .await
    );
    x.join("x", "G", &[("T", "*")]).await;
    assert!(
        a.wait_notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED, 3)
            .await
    );
    assert!(
        b.wait_notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED, 2)
            .await
    );
    let r = a
        .call(RemotingCommand::request_with_header(
            rc::GET_CONSUMER_LIST_BY_GROUP,
            &GetConsumerListByGroupRequestHeader {
                consumer_group: "G".into(),
                ..Default::default()
            },
        ))
        .await;
    let list: GetConsumerListByGroupResponseBody = r.decode_json_body().unwrap();
    assert_eq!(list.consumer_id_list, vec!["a", "b", "x"]);
    // A repeated heartbeat changes nothing and notifies nobody.
    let before = a.notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED);
    a.join("a", "G", &[("T", "*")]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(a.notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED), before);
    // Connection loss: x's connection goes; a and b hear of it.
    x.shutdown();
    assert!(
        a.wait_notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED, before + 1)
            .await,
        "connection loss not notified"
    );
    // Graceful leave.
    let un = RemotingCommand::request_with_header(
        rc::UNREGISTER_CLIENT,
        &UnregisterClientRequestHeader {
            client_id: "b".into(),
            consumer_group: Some("G".into()),
            ..Default::default()
        },
    );
    ok(&b.call(un).await);
    assert!(
        a.wait_notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED, before + 2)
            .await,
        "leave not notified"
    );
    let r = a
        .call(RemotingCommand::request_with_header(
            rc::GET_CONSUMER_LIST_BY_GROUP,
            &GetConsumerListByGroupRequestHeader {
                consumer_group: "G".into(),
                ..Default::default()
            },
        ))
        .await;
    let list: GetConsumerListByGroupResponseBody = r.decode_json_body().unwrap();
    assert_eq!(list.consumer_id_list, vec!["a"]);
    // Broadcasting groups are not notified.
    let d = RawClient::new(&c.broker_addr);
    ok(&d
        .call(heartbeat_req(
            "d",
            "B",
            &[("T", "*")],
            MessageModel::Broadcasting,
        ))
        .await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(d.notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED), 0);
    c.stop().await;
}

#[tokio::test]
async fn misconfigured_groups_are_flagged() {
    let c = Cluster::start().await;
    let a = RawClient::new(&c.broker_addr);
    let b = RawClient::new(&c.broker_addr);
    ok(&a.call(create_topic_req("T", 4)).await);
    a.join("same-id", "G", &[("T", "tagA")]).await;
    b.join("same-id", "G", &[("T", "tagB")]).await;
    let r = a
        .call(RemotingCommand::request_with_header(
            rc::GET_CONSUMER_CONNECTION_LIST,
            &GetConsumerConnectionListRequestHeader {
                consumer_group: "G".into(),
                ..Default::default()
            },
        ))
        .await;
    ok(&r);
    let v: serde_json::Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
    assert_eq!(v["connectionSet"].as_array().unwrap().len(), 2);
    assert_eq!(v["duplicateClientIds"], serde_json::json!(["same-id"]));
    assert_eq!(
        v["inconsistentSubscriptionTopics"],
        serde_json::json!(["T"])
    );
    let r = a
        .call(RemotingCommand::request_with_header(
            rc::GET_CONSUME_STATS,
            &GetConsumeStatsRequestHeader {
                consumer_group: "G".into(),
                ..Default::default()
            },
        ))
        .await;
    ok(&r);
    let v: serde_json::Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
    assert_eq!(v["duplicateClientIds"], serde_json::json!(["same-id"]));
    c.stop().await;
}

#[tokio::test]
async fn queue_locks_are_exclusive_and_released_on_leave() {
    let c = Cluster::start().await;
    let a = RawClient::new(&c.broker_addr);
    let b = RawClient::new(&c.broker_addr);
    ok(&a.call(create_topic_req("T", 2)).await);
    a.join("a", "G", &[("T", "*")]).await;
    b.join("b", "G", &[("T", "*")]).await;
    let mqs = vec![
        MessageQueue::new("T", "broker-a", 0),
        MessageQueue::new("T", "broker-a", 1),
    ];
    let lock = |id: &str| {
        RemotingCommand::request(rc::LOCK_BATCH_MQ)
            .with_ext_fields(Default::default())
            .with_json_body(&LockBatchRequestBody {
                client_id: id.into(),
                consumer_group: "G".into(),
                mq_set: mqs.clone(),
                only_this_broker: false,
            })
            .unwrap()
    };
    let r = a.call(lock("a")).await;
    let got: LockBatchResponseBody = r.decode_json_body().unwrap();
    assert_eq!(got.lock_ok_mq_set.len(), 2);
    let r = b.call(lock("b")).await;
    let got: LockBatchResponseBody = r.decode_json_body().unwrap();
    assert!(got.lock_ok_mq_set.is_empty(), "locks must be exclusive");
    // a unlocks queue 1: b gets it.
    let unlock = RemotingCommand::request(rc::UNLOCK_BATCH_MQ)
        .with_ext_fields(Default::default())
        .with_json_body(&UnlockBatchRequestBody {
            client_id: "a".into(),
            consumer_group: "G".into(),
            mq_set: vec![mqs[1].clone()],
            only_this_broker: false,
        })
        .unwrap();
    ok(&a.call(unlock).await);
    let got: LockBatchResponseBody = b.call(lock("b")).await.decode_json_body().unwrap();
    assert_eq!(got.lock_ok_mq_set, vec![mqs[1].clone()]);
    // a leaves (connection closed): its lock on queue 0 is released at once.
    a.shutdown();
    let mut got_both = false;
    for _ in 0..100 {
        let got: LockBatchResponseBody = b.call(lock("b")).await.decode_json_body().unwrap();
        if got.lock_ok_mq_set.len() == 2 {
            got_both = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(got_both, "a's lock was not released when it left");
    c.stop().await;
}

#[tokio::test]
async fn offsets_and_topics_survive_a_restart() {
    let mut c = Cluster::start().await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req("T", 2)).await);
    ok(&client.call(send_req("T", 1, b"x", "")).await);
    client.join("c1", "G", &[("T", "*")]).await;
    let upd = RemotingCommand::request_with_header(
        rc::UPDATE_CONSUMER_OFFSET,
        &UpdateConsumerOffsetRequestHeader {
            consumer_group: "G".into(),
            topic: "T".into(),
            queue_id: 1,
            commit_offset: 1,
            ..Default::default()
        },
    );
    ok(&client.call(upd).await);
    // Piggy-backed commit in a pull.
    let mut pull = pull_req("G", "T", 0, 0, pull_sys_flag::COMMIT_OFFSET, 0);
    pull.ext_fields
        .as_mut()
        .unwrap()
        .insert("commitOffset", "0");
    client.call(pull).await;
    client.shutdown();
    c.restart_broker(|_| {}).await;
    let client = RawClient::new(&c.broker_addr);
    let q = |queue_id| {
        RemotingCommand::request_with_header(
            rc::QUERY_CONSUMER_OFFSET,
            &QueryConsumerOffsetRequestHeader {
                consumer_group: "G".into(),
                topic: "T".into(),
                queue_id,
                set_zero_if_not_found: Some(false),
                ..Default::default()
            },
        )
    };
    let r = client.call(q(1)).await;
    ok(&r);
    assert_eq!(
        r.decode_command_header::<QueryConsumerOffsetResponseHeader>()
            .unwrap()
            .offset,
        1
    );
    let r = client.call(q(0)).await;
    assert_eq!(
        r.decode_command_header::<QueryConsumerOffsetResponseHeader>()
            .unwrap()
            .offset,
        0
    );
    // Unknown group: QUERY_NOT_FOUND when asked not to default to zero.
    let r = client
        .call(RemotingCommand::request_with_header(
            rc::QUERY_CONSUMER_OFFSET,
            &QueryConsumerOffsetRequestHeader {
                consumer_group: "Other".into(),
                topic: "T".into(),
                queue_id: 1,
                set_zero_if_not_found: Some(false),
                ..Default::default()
            },
        ))
        .await;
    assert_eq!(r.code, resp::QUERY_NOT_FOUND);
    // Topic config survived: sending still works, message still there.
    let r = client
        .call(pull_req("G", "T", 1, 0, pull_sys_flag::SUBSCRIPTION, 0))
        .await;
    assert_eq!(decode(&r).len(), 1);
    // Consume stats show broker and consumer offsets.
    client.join("c1", "G", &[("T", "*")]).await;
    let r = client
        .call(RemotingCommand::request_with_header(
            rc::GET_CONSUME_STATS,
            &GetConsumeStatsRequestHeader {
                consumer_group: "G".into(),
                ..Default::default()
            },
        ))
        .await;
    let stats: ConsumeStats = r.decode_json_body().unwrap();
    let w = &stats.offset_table[&MessageQueue::new("T", "broker-a", 1)];
    assert_eq!((w.broker_offset, w.consumer_offset), (1, 1));
    c.stop().await;
}

#[tokio::test]
async fn a_message_failing_16_times_ends_in_the_dlq() {
    let c = Cluster::start().await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req("T", 1)).await);
    client
        .join("c1", "G", &[("T", "*"), ("%RETRY%G", "*")])
        .await;
    let r = client
        .call(send_req(
            "T",
            0,
            b"poison",
            &props(&[("UNIQ_KEY", "POISON1"), ("TAGS", "t")]),
        ))
        .await;
    ok(&r);
    let first = decode(&client.call(pull_req("G", "T", 0, 0, 0, 0)).await).remove(0);
    let mut current = first.clone();
    let mut retry_offset = 0;
    for attempt in 0..=16 {
        let back = RemotingCommand::request_with_header(
            rc::CONSUMER_SEND_MSG_BACK,
            &ConsumerSendMsgBackRequestHeader {
                offset: current.commit_log_offset,
                group: "G".into(),
                delay_level: 0,
                origin_msg_id: Some("POISON1".into()),
                origin_topic: Some("T".into()),
                max_reconsume_times: Some(16),
                ..Default::default()
            },
        );
        ok(&client.call(back).await);
        if attempt == 16 {
            break;
        }
        // The retry copy shows up in %RETRY%G after its (20 ms) delay.
        let mut found = None;
        for _ in 0..300 {
            let r = client
                .call(pull_req("G", "%RETRY%G", 0, retry_offset, 0, 0))
                .await;
            if r.code == resp::SUCCESS {
                found = Some(decode(&r).remove(0));
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let m = found.unwrap_or_else(|| panic!("retry message {attempt} never arrived"));
        assert_eq!(m.reconsume_times, attempt + 1);
        assert_eq!(m.property(property::RETRY_TOPIC), Some("T"));
        assert_eq!(m.uniq_key(), Some("POISON1"));
        retry_offset = m.queue_offset + 1;
        current = m;
    }
    client
        .join("c1", "G", &[("T", "*"), ("%RETRY%G", "*"), ("%DLQ%G", "*")])
        .await;
    let r = client.call(pull_req("G", "%DLQ%G", 0, 0, 0, 0)).await;
    ok(&r);
    let dead = decode(&r);
    assert_eq!(dead.len(), 1);
    let d = &dead[0];
    assert_eq!(d.reconsume_times, 17);
    assert_eq!(d.property(property::RETRY_TOPIC), Some("T"));
    assert_eq!(
        d.property(property::ORIGIN_MESSAGE_ID),
        Some(first.offset_msg_id().as_str())
    );
    assert_eq!(d.uniq_key(), Some("POISON1"));
    assert_eq!(d.body.as_ref(), b"poison");
    // The DLQ topic is routed by the name server.
    let ns = RawClient::new(&c.namesrv_addr);
    let route = ns.wait_route("%DLQ%G").await.expect("%DLQ%G not routed");
    assert!(!route.queue_datas.is_empty(), "%DLQ%G not routed");
    c.stop().await;
}

#[tokio::test]
async fn delayed_messages_are_delivered_after_their_level() {
    let c = Cluster::start_with(|cfg| cfg.delay_levels = "300ms 1s".into()).await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req("T", 1)).await);
    client.join("c1", "G", &[("T", "*")]).await;
    let sent = Instant::now();
    ok(&client
        .call(send_req("T", 0, b"later", &props(&[("DELAY", "1")])))
        .await);
    let r = client.call(pull_req("G", "T", 0, 0, 0, 0)).await;
    assert_eq!(
        r.code,
        resp::PULL_NOT_FOUND,
        "delayed message visible at once"
    );
    let r = client
        .call(pull_req("G", "T", 0, 0, pull_sys_flag::SUSPEND, 10_000))
        .await;
    ok(&r);
    let waited = sent.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "delivered early: {waited:?}"
    );
    let m = decode(&r).remove(0);
    assert_eq!(m.body.as_ref(), b"later");
    assert_eq!(m.property(property::REAL_TOPIC), Some("T"));
    assert_eq!(m.property(property::DELAY), None);
    println!("delay level 1 (300 ms) delivered after {waited:?}");
    c.stop().await;
}

#[tokio::test]
async fn timed_messages_hop_through_the_levels_and_are_never_early() {
    // Levels 300 ms and 1 s: a message due in 1.5 s hops 1 s, then 300 ms twice.
    let c = Cluster::start_with(|cfg| cfg.delay_levels = "300ms 1s".into()).await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req("T", 1)).await);
    client.join("c1", "G", &[("T", "*")]).await;
    let sent = Instant::now();
    let due = shoal_broker::wall_ms() + 1_500;
    ok(&client
        .call(send_req(
            "T",
            0,
            b"timed",
            &props(&[("TIMER_DELIVER_MS", &due.to_string())]),
        ))
        .await);
    let r = client.call(pull_req("G", "T", 0, 0, 0, 0)).await;
    assert_eq!(
        r.code,
        resp::PULL_NOT_FOUND,
        "timed message visible at once"
    );
    let mut got = None;
    while sent.elapsed() < Duration::from_secs(10) && got.is_none() {
        let r = client
            .call(pull_req("G", "T", 0, 0, pull_sys_flag::SUSPEND, 2_000))
            .await;
        if r.code == resp::SUCCESS {
            got = decode(&r).into_iter().next();
        }
    }
    let m = got.expect("timed message never delivered");
    assert!(
        shoal_broker::wall_ms() >= due,
        "delivered {} ms early",
        due - shoal_broker::wall_ms()
    );
    assert_eq!(m.body.as_ref(), b"timed");
    assert_eq!(m.property(property::DELAY), None);
    // A relative timer (TIMER_DELAY_SEC) becomes an absolute one.
    let before = shoal_broker::wall_ms();
    ok(&client
        .call(send_req(
            "T",
            0,
            b"rel",
            &props(&[("TIMER_DELAY_SEC", "1")]),
        ))
        .await);
    let r = client
        .call(pull_req("G", "T", 0, 1, pull_sys_flag::SUSPEND, 5_000))
        .await;
    ok(&r);
    let m = decode(&r).remove(0);
    let at: i64 = m
        .property(property::TIMER_DELIVER_MS)
        .unwrap()
        .parse()
        .unwrap();
    assert!(at >= before + 1_000 && shoal_broker::wall_ms() >= at);
    c.stop().await;
}

#[tokio::test]
async fn batch_send_and_admin_requests() {
    let c = Cluster::start().await;
    let client = RawClient::new(&c.broker_addr);
    ok(&client.call(create_topic_req("T", 1)).await);
    let mut batch = Vec::new();
    for i in 0..3 {
        let mut m = shoal_proto::message::Message::new("T", format!("b{i}").into_bytes());
        m.set_uniq_key(format!("B{i}")).unwrap();
        batch.push(m);
    }
    let body = shoal_proto::message::encode_batch(batch.iter()).unwrap();
    let mut req = send_req("T", 0, &body, "");
    req.code = rc::SEND_BATCH_MESSAGE;
    req.ext_fields.as_mut().unwrap().insert("m", "true");
    let r = client.call(req).await;
    ok(&r);
    let h: SendMessageResponseHeader = r.decode_command_header().unwrap();
    assert_eq!(h.msg_id.split(',').count(), 3);
    assert_eq!(h.queue_offset, 0);
    client.join("c1", "G", &[("T", "*")]).await;
    let msgs = decode(&client.call(pull_req("G", "T", 0, 0, 0, 0)).await);
    assert_eq!(
        msgs.iter()
            .map(|m| m.uniq_key().unwrap().to_string())
            .collect::<Vec<_>>(),
        ["B0", "B1", "B2"]
    );

    let r = client
        .call(RemotingCommand::request(rc::GET_BROKER_RUNTIME_INFO))
        .await;
    let kv: KVTable = r.decode_json_body().unwrap();
    assert_eq!(kv.table["msgPutTotal"], "3");
    let r = client
        .call(RemotingCommand::request(rc::GET_ALL_TOPIC_CONFIG))
        .await;
    let v: serde_json::Value = serde_json::from_slice(r.body.as_ref().unwrap()).unwrap();
    assert!(v["topicConfigTable"]["T"].is_object());
    assert!(v["topicConfigTable"]["SCHEDULE_TOPIC_XXXX"].is_object());
    // Reset offsets to the beginning (timestamp 0) for the group.
    let reset = RemotingCommand::request_with_header(
        rc::INVOKE_BROKER_TO_RESET_OFFSET,
        &ResetOffsetRequestHeader {
            topic: "T".into(),
            group: "G".into(),
            timestamp: 0,
            is_force: true,
            ..Default::default()
        },
    );
    ok(&client.call(reset).await);
    assert!(
        client
            .wait_notifications(rc::RESET_CONSUMER_CLIENT_OFFSET, 1)
            .await
    );
    // Delete the topic.
    let del = RemotingCommand::request_with_header(
        rc::DELETE_TOPIC_IN_BROKER,
        &DeleteTopicRequestHeader {
            topic: "T".into(),
            ..Default::default()
        },
    );
    ok(&client.call(del).await);
    assert_eq!(
        client.call(send_req("T", 0, b"x", "")).await.code,
        resp::TOPIC_NOT_EXIST
    );
    c.stop().await;
}

#[tokio::test]
async fn auto_create_uses_the_tbw102_template() {
    let c = Cluster::start_with(|cfg| cfg.auto_create_topic = true).await;
    let client = RawClient::new(&c.broker_addr);
    let r = client.call(send_req("Fresh", -1, b"x", "")).await;
    ok(&r);
    let ns = RawClient::new(&c.namesrv_addr);
    let route = ns
        .wait_route("Fresh")
        .await
        .expect("auto-created topic not registered with the name server");
    assert_eq!(route.queue_datas[0].write_queue_nums, 4);
    assert!(ns.wait_route("TBW102").await.is_some(), "TBW102 not routed");
    c.stop().await;
}

#[tokio::test]
async fn registers_with_every_name_server() {
    use shoal_namesrv::{NameServer, NamesrvConfig};
    let start_ns = || async {
        NameServer::start(NamesrvConfig {
            listen_addr: "127.0.0.1:0".into(),
            ..NamesrvConfig::default()
        })
        .await
        .unwrap()
    };
    let ns1 = start_ns().await;
    let ns2 = start_ns().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = test_config(dir.path(), &ns1.local_addr().to_string());
    cfg.namesrv_addrs.push(ns2.local_addr().to_string());
    cfg.register_interval_ms = 200;
    let broker = shoal_broker::Broker::start(cfg).await.unwrap();
    let client = RawClient::new(&broker.local_addr().to_string());
    ok(&client.call(create_topic_req("Both", 3)).await);
    let route_from = |addr: String| async move { RawClient::new(&addr).wait_route("Both").await };
    let a = route_from(ns1.local_addr().to_string())
        .await
        .expect("route on name server 1");
    let b = route_from(ns2.local_addr().to_string())
        .await
        .expect("route on name server 2");
    assert_eq!(a, b);
    assert_eq!(a.queue_datas[0].write_queue_nums, 3);
    // One name server goes away: the other keeps serving, and the broker keeps registering.
    let ns2_addr = ns2.local_addr().to_string();
    ns1.shutdown().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(route_from(ns2_addr.clone()).await.is_some());
    // Shutdown unregisters: the route disappears from the remaining name server.
    broker.shutdown().await;
    let ns = RawClient::new(&ns2_addr);
    let r = ns
        .call(RemotingCommand::request_with_header(
            rc::GET_ROUTEINFO_BY_TOPIC,
            &GetRouteInfoRequestHeader {
                topic: "Both".into(),
                ..Default::default()
            },
        ))
        .await;
    assert_eq!(r.code, resp::TOPIC_NOT_EXIST);
    ns2.shutdown().await;
}

#[tokio::test]
async fn a_silent_client_expires_and_the_others_are_told() {
    let c = Cluster::start_with(|cfg| cfg.client_expiry_ms = 600).await;
    let a = RawClient::new(&c.broker_addr);
    let b = RawClient::new(&c.broker_addr);
    ok(&a.call(create_topic_req("T", 2)).await);
    a.join("a", "G", &[("T", "*")]).await;
    b.join("b", "G", &[("T", "*")]).await;
    assert!(
        a.wait_notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED, 2)
            .await
    );
    // a keeps heartbeating, b falls silent (its connection stays open).
    let list = || {
        RemotingCommand::request_with_header(
            rc::GET_CONSUMER_LIST_BY_GROUP,
            &GetConsumerListByGroupRequestHeader {
                consumer_group: "G".into(),
                ..Default::default()
            },
        )
    };
    let mut expired = false;
    for _ in 0..40 {
        a.join("a", "G", &[("T", "*")]).await;
        let ids: GetConsumerListByGroupResponseBody =
            a.call(list()).await.decode_json_body().unwrap();
        if ids.consumer_id_list == vec!["a"] {
            expired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(expired, "b never expired");
    assert!(
        a.wait_notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED, 3)
            .await,
        "expiry not notified"
    );
    c.stop().await;
}

#[tokio::test]
async fn running_info_is_forwarded_to_the_client() {
    use shoal_net::{processor_fn, NetConfig, RemotingClient};
    use shoal_proto::body::{ConsumerRunningInfo, ProcessQueueInfo};
    let c = Cluster::start().await;
    // A client that answers GET_CONSUMER_RUNNING_INFO with one owned queue.
    let processor = processor_fn(|_ctx, req: RemotingCommand| async move {
        if req.code != rc::GET_CONSUMER_RUNNING_INFO {
            return Ok(None);
        }
        let mut info = ConsumerRunningInfo::default();
        info.mq_table.insert(
            MessageQueue::new("T", "broker-a", 1),
            ProcessQueueInfo {
                commit_offset: 7,
                ..Default::default()
            },
        );
        Ok(Some(
            RemotingCommand::response(resp::SUCCESS, None)
                .with_json_body(&info)
                .unwrap(),
        ))
    });
    let member = RemotingClient::new(NetConfig::default(), std::sync::Arc::new(processor));
    let hb = heartbeat_req("m1", "G", &[("T", "*")], MessageModel::Clustering);
    ok(&member
        .invoke(&c.broker_addr, create_topic_req("T", 2), T)
        .await
        .unwrap());
    ok(&member.invoke(&c.broker_addr, hb, T).await.unwrap());
    let admin = RawClient::new(&c.broker_addr);
    let req = RemotingCommand::request_with_header(
        rc::GET_CONSUMER_RUNNING_INFO,
        &GetConsumerRunningInfoRequestHeader {
            consumer_group: "G".into(),
            client_id: "m1".into(),
            ..Default::default()
        },
    );
    let r = admin.call(req).await;
    ok(&r);
    let info: ConsumerRunningInfo = r.decode_json_body().unwrap();
    assert_eq!(
        info.mq_table[&MessageQueue::new("T", "broker-a", 1)].commit_offset,
        7
    );
    // An unknown client is an error, not a hang.
    let req = RemotingCommand::request_with_header(
        rc::GET_CONSUMER_RUNNING_INFO,
        &GetConsumerRunningInfoRequestHeader {
            consumer_group: "G".into(),
            client_id: "nobody".into(),
            ..Default::default()
        },
    );
    assert_eq!(admin.call(req).await.code, resp::SYSTEM_ERROR);
    c.stop().await;
}
