//! POP over remoting (RocketMQ 5.x codes 200050..): leases with receipts, acks refused for
//! stale, foreign and repeated receipts, redelivery of a lapsed lease through the POP retry
//! topic with its reconsume count, invisibility changes, long polling, FIFO order, and lease
//! state across a broker restart.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::*;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::header::{
    AckMessageRequestHeader, ChangeInvisibleTimeRequestHeader, ChangeInvisibleTimeResponseHeader,
    PopExtraInfo, PopMessageRequestHeader, PopMessageResponseHeader, PopRetryFlag,
};
use shoal_proto::message::MessageExt;
use shoal_proto::RemotingCommand;
use std::time::{Duration, Instant};

fn pop_req(topic: &str, max: i32, invisible_ms: i64, poll_ms: i64, order: bool) -> RemotingCommand {
    RemotingCommand::request_with_header(
        rc::POP_MESSAGE,
        &PopMessageRequestHeader {
            consumer_group: "G".into(),
            topic: topic.into(),
            queue_id: -1,
            max_msg_nums: max,
            invisible_time: invisible_ms,
            poll_time: poll_ms,
            born_time: 0,
            init_mode: 0,
            exp_type: Some("TAG".into()),
            exp: Some("*".into()),
            order,
            ..Default::default()
        },
    )
}

/// A popped message with the receipt (`extraInfo`) a Java client would build.
struct Got {
    msg: MessageExt,
    extra: PopExtraInfo,
}

fn popped(r: &RemotingCommand) -> Vec<Got> {
    if r.code != resp::SUCCESS {
        return Vec::new();
    }
    let h: PopMessageResponseHeader = r.decode_command_header().unwrap();
    decode(r)
        .into_iter()
        .map(|msg| {
            let extra = PopExtraInfo {
                ck_queue_offset: msg.queue_offset,
                pop_time: h.pop_time,
                invisible_time: h.invisible_time,
                revive_qid: h.revive_qid,
                retry: PopRetryFlag::of_topic(&msg.topic),
                broker_name: "broker-a".into(),
                queue_id: msg.queue_id,
                msg_queue_offset: Some(msg.queue_offset),
            };
            Got { msg, extra }
        })
        .collect()
}

fn ack_req(topic: &str, g: &Got) -> RemotingCommand {
    RemotingCommand::request_with_header(
        rc::ACK_MESSAGE,
        &AckMessageRequestHeader {
            consumer_group: "G".into(),
            topic: topic.into(),
            queue_id: g.msg.queue_id,
            extra_info: g.extra.to_extra_info(),
            offset: g.msg.queue_offset,
            ..Default::default()
        },
    )
}

fn bodies(v: &[Got]) -> Vec<String> {
    let mut b: Vec<String> = v
        .iter()
        .map(|g| String::from_utf8_lossy(&g.msg.body).into_owned())
        .collect();
    b.sort();
    b
}

async fn setup(cluster: &Cluster, queues: i32, n: usize) -> RawClient {
    let c = RawClient::new(&cluster.broker_addr);
    ok(&c.call(create_topic_req("T", queues)).await);
    for i in 0..n {
        ok(&c
            .call(send_req(
                "T",
                (i % queues as usize) as i32,
                format!("m{i}").as_bytes(),
                &props(&[]),
            ))
            .await);
    }
    c
}

#[tokio::test]
async fn receipts_acks_redelivery_through_the_retry_topic() {
    let cluster = Cluster::start().await;
    let c = setup(&cluster, 2, 6).await;

    let first = popped(&c.call(pop_req("T", 4, 1_500, 0, false)).await);
    assert_eq!(first.len(), 4);
    let second = popped(&c.call(pop_req("T", 4, 1_500, 0, false)).await);
    assert_eq!(second.len(), 2);
    let mut all = first;
    all.extend(second);
    assert_eq!(bodies(&all), ["m0", "m1", "m2", "m3", "m4", "m5"]);
    // Everything is under lease: nothing more.
    let r = c.call(pop_req("T", 4, 1_500, 0, false)).await;
    assert_eq!(r.code, resp::PULL_NOT_FOUND);

    // A stale receipt and another broker's are refused; a good one once.
    let mut stale = Got {
        msg: all[0].msg.clone(),
        extra: all[0].extra.clone(),
    };
    stale.extra.pop_time -= 1;
    assert_eq!(c.call(ack_req("T", &stale)).await.code, resp::NO_MESSAGE);
    let mut foreign = Got {
        msg: all[0].msg.clone(),
        extra: all[0].extra.clone(),
    };
    foreign.extra.broker_name = "broker-z".into();
    assert_eq!(c.call(ack_req("T", &foreign)).await.code, resp::NO_MESSAGE);
    for g in &all[..4] {
        ok(&c.call(ack_req("T", g)).await);
    }
    assert_eq!(c.call(ack_req("T", &all[0])).await.code, resp::NO_MESSAGE);

    // The two unacknowledged come back through %RETRY%G_T, reconsume count 1.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = Vec::new();
    while again.len() < 2 && Instant::now() < deadline {
        again.extend(popped(&c.call(pop_req("T", 4, 5_000, 500, false)).await));
    }
    assert_eq!(again.len(), 2);
    for g in &again {
        assert_eq!(g.msg.topic, "%RETRY%G_T");
        assert_eq!(g.msg.reconsume_times, 1);
        assert_eq!(
            g.msg.properties.get("RETRY_TOPIC").map(String::as_str),
            Some("T")
        );
        assert_eq!(g.extra.retry, PopRetryFlag::RetryV1);
    }
    let mut expect: Vec<String> = all[4..]
        .iter()
        .map(|g| String::from_utf8_lossy(&g.msg.body).into_owned())
        .collect();
    expect.sort();
    assert_eq!(bodies(&again), expect);
    // The lapsed receipts are void now.
    assert_eq!(c.call(ack_req("T", &all[4])).await.code, resp::NO_MESSAGE);
    // Java acks with the original topic and the retry flag in the receipt.
    for g in &again {
        ok(&c.call(ack_req("T", g)).await);
    }
    // Committed offsets follow the acks.
    let offsets = cluster
        .broker
        .as_ref()
        .unwrap()
        .api()
        .store()
        .offsets_of_group("G");
    let total: i64 = offsets
        .iter()
        .filter(|(t, _, _)| t == "T")
        .map(|(_, _, o)| *o)
        .sum();
    assert_eq!(total, 6, "{offsets:?}");
    c.shutdown();
    cluster.stop().await;
}

#[tokio::test]
async fn change_invisible_time_and_long_polling() {
    let cluster = Cluster::start().await;
    let c = setup(&cluster, 1, 1).await;
    let got = popped(&c.call(pop_req("T", 1, 1_000, 0, false)).await);
    assert_eq!(got.len(), 1);
    let change = RemotingCommand::request_with_header(
        rc::CHANGE_MESSAGE_INVISIBLETIME,
        &ChangeInvisibleTimeRequestHeader {
            consumer_group: "G".into(),
            topic: "T".into(),
            queue_id: 0,
            extra_info: got[0].extra.to_extra_info(),
            offset: 0,
            invisible_time: 30_000,
            ..Default::default()
        },
    );
    let r = c.call(change).await;
    ok(&r);
    let h: ChangeInvisibleTimeResponseHeader = r.decode_command_header().unwrap();
    assert!(h.pop_time > got[0].extra.pop_time);
    assert_eq!(h.invisible_time, 30_000);
    // Past the first lease: not redelivered, the old receipt is void, the new one acks.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        c.call(pop_req("T", 1, 1_000, 0, false)).await.code,
        resp::PULL_NOT_FOUND
    );
    assert_eq!(c.call(ack_req("T", &got[0])).await.code, resp::NO_MESSAGE);
    let mut renewed = Got {
        msg: got[0].msg.clone(),
        extra: got[0].extra.clone(),
    };
    renewed.extra.pop_time = h.pop_time;
    ok(&c.call(ack_req("T", &renewed)).await);

    // A held pop is answered when a message arrives.
    let started = Instant::now();
    let held = {
        let client = RawClient::new(&cluster.broker_addr);
        tokio::spawn(async move {
            let r = client.call(pop_req("T", 1, 10_000, 4_000, false)).await;
            client.shutdown();
            r
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    ok(&c.call(send_req("T", 0, b"late", &props(&[]))).await);
    let got = popped(&held.await.unwrap());
    assert_eq!(bodies(&got), ["late"]);
    assert!(started.elapsed() < Duration::from_secs(3));
    // Nothing arrives: POLLING_TIMEOUT at the poll time.
    let r = c.call(pop_req("T", 1, 10_000, 300, false)).await;
    assert_eq!(r.code, resp::POLLING_TIMEOUT);
    c.shutdown();
    cluster.stop().await;
}

#[tokio::test]
async fn fifo_pops_wait_for_the_ack_and_redeliver_in_place() {
    let cluster = Cluster::start().await;
    let c = setup(&cluster, 1, 3).await;
    let got = popped(&c.call(pop_req("T", 2, 1_000, 0, true)).await);
    assert_eq!(bodies(&got), ["m0", "m1"]);
    // Under lease: the queue hands out nothing, not even m2.
    assert_eq!(
        c.call(pop_req("T", 2, 1_000, 0, true)).await.code,
        resp::PULL_NOT_FOUND
    );
    ok(&c.call(ack_req("T", &got[0])).await);
    // m1 lapses: it comes back first, in place (same topic and offset), before m2.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let again = popped(&c.call(pop_req("T", 2, 5_000, 0, true)).await);
    assert_eq!(bodies(&again), ["m1"]);
    assert_eq!(again[0].msg.topic, "T");
    ok(&c.call(ack_req("T", &again[0])).await);
    let last = popped(&c.call(pop_req("T", 2, 5_000, 0, true)).await);
    assert_eq!(bodies(&last), ["m2"]);
    c.shutdown();
    cluster.stop().await;
}

#[tokio::test]
async fn leases_survive_a_restart() {
    let mut cluster = Cluster::start().await;
    let c = setup(&cluster, 1, 3).await;
    let got = popped(&c.call(pop_req("T", 3, 2_000, 0, false)).await);
    assert_eq!(got.len(), 3);
    ok(&c.call(ack_req("T", &got[0])).await);
    c.shutdown();
    cluster.restart_broker(|_| {}).await;
    let c = RawClient::new(&cluster.broker_addr);
    // The acked message is never seen again; the receipt of a leased one still acks.
    ok(&c.call(ack_req("T", &got[1])).await);
    assert_eq!(c.call(ack_req("T", &got[0])).await.code, resp::NO_MESSAGE);
    // The third lapses and comes back through the retry topic: nothing lost.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = Vec::new();
    while again.is_empty() && Instant::now() < deadline {
        again = popped(&c.call(pop_req("T", 3, 5_000, 500, false)).await);
    }
    assert_eq!(bodies(&again), ["m2"]);
    ok(&c.call(ack_req("T", &again[0])).await);
    assert_eq!(
        c.call(pop_req("T", 3, 5_000, 0, false)).await.code,
        resp::PULL_NOT_FOUND
    );
    c.shutdown();
    cluster.stop().await;
}

fn order_counts(r: &RemotingCommand) -> Vec<shoal_proto::header::PopOrderCount> {
    let h: PopMessageResponseHeader = r.decode_command_header().unwrap();
    shoal_proto::header::parse_order_count_info(h.order_count_info.as_deref().unwrap_or(""))
        .unwrap()
}

#[tokio::test]
async fn fifo_pops_tell_the_delivery_attempt_in_order_count_info() {
    let cluster = Cluster::start().await;
    let c = setup(&cluster, 1, 2).await;
    let r = c.call(pop_req("T", 2, 1_000, 0, true)).await;
    let first = popped(&r);
    assert_eq!(bodies(&first), ["m0", "m1"]);
    // First delivery: no earlier ones, one entry per message (Java's queue-offset form).
    let counts = order_counts(&r);
    assert_eq!(counts.len(), 2);
    assert!(counts.iter().all(|c| c.count == 0 && c.queue_id == 0));
    assert_eq!(
        counts.iter().map(|c| c.queue_offset).collect::<Vec<_>>(),
        [0, 1]
    );
    ok(&c.call(ack_req("T", &first[0])).await);
    // m1 lapses and comes back in place: one earlier delivery.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let r = c.call(pop_req("T", 2, 5_000, 0, true)).await;
    assert_eq!(bodies(&popped(&r)), ["m1"]);
    let counts = order_counts(&r);
    assert_eq!(counts.len(), 1);
    assert_eq!((counts[0].queue_offset, counts[0].count), (1, 1));
    // A normal pop carries no order counts.
    let h: PopMessageResponseHeader = c
        .call(pop_req("T", 1, 1_000, 0, false))
        .await
        .decode_command_header()
        .unwrap_or_default();
    assert!(h.order_count_info.is_none());
    c.shutdown();
    cluster.stop().await;
}

#[tokio::test]
async fn peek_shows_without_leasing_and_batch_ack_acks_a_bit_set() {
    use shoal_proto::body::{BatchAck, BatchAckMessageRequestBody};
    use shoal_proto::header::PeekMessageRequestHeader;
    let cluster = Cluster::start().await;
    let c = setup(&cluster, 1, 4).await;
    let peek = || {
        RemotingCommand::request_with_header(
            rc::PEEK_MESSAGE,
            &PeekMessageRequestHeader {
                consumer_group: "G".into(),
                topic: "T".into(),
                queue_id: -1,
                max_msg_nums: 3,
                ..Default::default()
            },
        )
    };
    let r = c.call(peek()).await;
    ok(&r);
    let peeked = decode(&r);
    assert_eq!(peeked.len(), 3);
    let h: PopMessageResponseHeader = r.decode_command_header().unwrap();
    assert_eq!(h.rest_num, 1);
    // Peeking leased nothing: a pop gets all four.
    let got = popped(&c.call(pop_req("T", 4, 10_000, 0, false)).await);
    assert_eq!(got.len(), 4);
    // Still shown by a peek while under lease (nothing is acked yet).
    assert_eq!(decode(&c.call(peek()).await).len(), 3);

    // One batch ack for offsets 0, 1 and 3; a stale receipt time refuses nothing else.
    let mut a = BatchAck {
        consumer_group: "G".into(),
        topic: "T".into(),
        retry: Some("0".into()),
        start_offset: 0,
        queue_id: 0,
        pop_time: got[0].extra.pop_time,
        invisible_time: got[0].extra.invisible_time,
        ..Default::default()
    };
    a.set_offsets(&[0, 1, 3]);
    let batch = |acks: Vec<BatchAck>| {
        RemotingCommand::request(rc::BATCH_ACK_MESSAGE)
            .with_json_body(&BatchAckMessageRequestBody {
                broker_name: "broker-a".into(),
                acks,
            })
            .unwrap()
    };
    ok(&c.call(batch(vec![a.clone()])).await);
    // Again: all three are refused now (already acknowledged), and said so.
    let again = c.call(batch(vec![a])).await;
    assert_eq!(again.code, resp::NO_MESSAGE);
    assert!(
        again.remark.as_deref().unwrap_or("").contains("3 of 3"),
        "{:?}",
        again.remark
    );
    // Offset 2 is the only one left: its own ack works, and the peek starts there.
    let two = got.iter().find(|g| g.msg.queue_offset == 2).unwrap();
    let r = c.call(peek()).await;
    assert_eq!(decode(&r)[0].queue_offset, 2);
    ok(&c.call(ack_req("T", two)).await);
    assert_eq!(c.call(peek()).await.code, resp::PULL_NOT_FOUND);
    c.shutdown();
    cluster.stop().await;
}

#[tokio::test]
async fn group_describe_shows_a_pop_group() {
    use shoal_proto::coordinated::{request_code as crc, GroupRef};
    let cluster = Cluster::start().await;
    let c = setup(&cluster, 2, 4).await;
    let got = popped(&c.call(pop_req("T", 4, 1_000, 0, false)).await);
    assert_eq!(got.len(), 4);
    ok(&c.call(ack_req("T", &got[0])).await);
    let describe = || {
        RemotingCommand::request(crc::GROUP_DESCRIBE)
            .with_json_body(&GroupRef { group: "G".into() })
            .unwrap()
    };
    let r = c.call(describe()).await;
    ok(&r);
    let v: serde_json::Value = serde_json::from_slice(r.body.as_deref().unwrap()).unwrap();
    let pop = &v["pop"];
    assert_eq!(pop["inflight"], 3, "{v}");
    assert_eq!(pop["leased"], 4);
    assert_eq!(pop["acked"], 1);
    assert_eq!(pop["consumers"].as_array().unwrap().len(), 1);
    assert_eq!(pop["consumers"][0]["inflight"], 3);
    // The three lapse: redeliveries counted.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v: serde_json::Value =
            serde_json::from_slice(c.call(describe()).await.body.as_deref().unwrap()).unwrap();
        if v["pop"]["redeliveries"] == 3 && v["pop"]["inflight"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.shutdown();
    cluster.stop().await;
}
