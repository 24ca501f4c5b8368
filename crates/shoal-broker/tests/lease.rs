//! The rebalance engine's round-trip savings over real TCP, with raw protocol requests: the
//! committed offsets on the lock grant (`offsetOnGrant`), the final commit carried by the
//! unlock and stored before the lock frees, fenced as any commit (`commitOnUnlock`), the member
//! list on NOTIFY_CONSUMER_IDS_CHANGED to Shoal members (`memberListNotice`), and
//! GET_BROKER_FEATURES listing them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::*;
use shoal_proto::body::{
    LockBatchRequestBody, LockBatchResponseBody, MessageModel, UnlockBatchRequestBody,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::ext::{self, feature, field, BrokerFeatures, ConsumerIdsNotice};
use shoal_proto::header::{QueryConsumerOffsetRequestHeader, QueryConsumerOffsetResponseHeader};
use shoal_proto::{MessageQueue, RemotingCommand};

const G: &str = "G";

fn mq(i: i32) -> MessageQueue {
    MessageQueue::new("T", "broker-a", i)
}

fn set_ext(r: &mut RemotingCommand, k: &str, v: &str) {
    r.ext_fields
        .get_or_insert_with(Default::default)
        .insert(k, v);
}

/// A Shoal member's heartbeat (it announces a session timeout, so it has a session).
fn session_heartbeat(client_id: &str) -> RemotingCommand {
    let mut r = heartbeat_req(client_id, G, &[("T", "*")], MessageModel::Clustering);
    set_ext(&mut r, field::SESSION_TIMEOUT_MS, "10000");
    r
}

fn lock_req(client_id: &str, queues: &[MessageQueue], want_offsets: bool) -> RemotingCommand {
    let mut r = RemotingCommand::request(rc::LOCK_BATCH_MQ)
        .with_ext_fields(Default::default())
        .with_json_body(&LockBatchRequestBody {
            client_id: client_id.into(),
            consumer_group: G.into(),
            mq_set: queues.to_vec(),
            only_this_broker: false,
        })
        .unwrap();
    set_ext(&mut r, field::LEASE, "true");
    if want_offsets {
        set_ext(&mut r, field::WANT_OFFSETS, "true");
    }
    r
}

fn unlock_req(client_id: &str, queues: &[MessageQueue], commit: Option<&str>) -> RemotingCommand {
    let mut r = RemotingCommand::request(rc::UNLOCK_BATCH_MQ)
        .with_ext_fields(Default::default())
        .with_json_body(&UnlockBatchRequestBody {
            client_id: client_id.into(),
            consumer_group: G.into(),
            mq_set: queues.to_vec(),
            only_this_broker: false,
        })
        .unwrap();
    if let Some(c) = commit {
        set_ext(&mut r, field::COMMIT, c);
    }
    r
}

fn granted(r: &RemotingCommand) -> Vec<MessageQueue> {
    ok(r);
    r.decode_json_body::<LockBatchResponseBody>()
        .unwrap()
        .lock_ok_mq_set
}

fn committed(r: &RemotingCommand) -> Option<Vec<(String, i32, i64)>> {
    r.ext(field::COMMITTED_OFFSETS)
        .map(ext::decode_queue_offsets)
}

async fn stored(c: &RawClient, queue: i32) -> Option<i64> {
    let r = c
        .call(RemotingCommand::request_with_header(
            rc::QUERY_CONSUMER_OFFSET,
            &QueryConsumerOffsetRequestHeader {
                consumer_group: G.into(),
                topic: "T".into(),
                queue_id: queue,
                set_zero_if_not_found: Some(false),
                ..Default::default()
            },
        ))
        .await;
    match r.code {
        resp::SUCCESS => Some(
            r.decode_command_header::<QueryConsumerOffsetResponseHeader>()
                .unwrap()
                .offset,
        ),
        _ => None,
    }
}

#[tokio::test]
async fn the_grant_carries_committed_offsets_and_the_unlock_the_final_commit() {
    let c = Cluster::start().await;
    let a = RawClient::new(&c.broker_addr);
    let b = RawClient::new(&c.broker_addr);
    ok(&a.call(create_topic_req("T", 4)).await);

    let f: BrokerFeatures = a
        .call(RemotingCommand::request(
            ext::request_code::GET_BROKER_FEATURES,
        ))
        .await
        .decode_json_body()
        .unwrap();
    for name in [
        feature::OFFSET_ON_GRANT,
        feature::COMMIT_ON_UNLOCK,
        feature::MEMBER_LIST_NOTICE,
    ] {
        assert!(f.has(name), "GET_BROKER_FEATURES lists {name}: {f:?}");
    }

    ok(&a.call(session_heartbeat("a")).await);
    ok(&b.call(session_heartbeat("b")).await);

    // a takes queues 0 and 1; nothing is committed yet: the field is there and empty.
    let r = a.call(lock_req("a", &[mq(0), mq(1)], true)).await;
    assert_eq!(granted(&r), vec![mq(0), mq(1)]);
    assert_eq!(committed(&r), Some(vec![]));
    // Without the request field the answer has no offsets (plain Shoal session lock).
    let r = a.call(lock_req("a", &[mq(1)], false)).await;
    assert_eq!(granted(&r), vec![mq(1)]);
    assert_eq!(committed(&r), None);

    // b is refused while a holds queue 0.
    let r = b.call(lock_req("b", &[mq(0)], true)).await;
    assert!(granted(&r).is_empty());

    // a's final commit rides on its unlock: stored, then the lock frees, then b is told.
    let r = a
        .call(unlock_req(
            "a",
            &[mq(0)],
            Some(&ext::encode_queue_offsets([("T", 0, 5)])),
        ))
        .await;
    ok(&r);
    assert_eq!(r.remark, None, "nothing refused");
    assert_eq!(stored(&a, 0).await, Some(5));
    assert!(
        b.wait_notifications(ext::request_code::NOTIFY_LOCK_FREED, 1)
            .await
    );
    // b's grant carries the offset a committed.
    let r = b.call(lock_req("b", &[mq(0)], true)).await;
    assert_eq!(granted(&r), vec![mq(0)]);
    assert_eq!(committed(&r), Some(vec![("T".to_string(), 0, 5)]));

    // A commit on an unlock from a member that does not hold the lock is fenced: not stored,
    // named in the remark; b keeps the lock.
    let r = a
        .call(unlock_req(
            "a",
            &[mq(0)],
            Some(&ext::encode_queue_offsets([("T", 0, 9)])),
        ))
        .await;
    ok(&r);
    let remark = r.remark.clone().unwrap_or_default();
    assert!(
        remark.contains("final commits not stored") && remark.contains("T:0"),
        "{remark}"
    );
    assert_eq!(stored(&a, 0).await, Some(5));
    let r = b.call(lock_req("b", &[mq(0)], false)).await;
    assert_eq!(granted(&r), vec![mq(0)], "b still holds queue 0");

    // The holder cannot move the offset back on its unlock either; the lock is freed anyway.
    let r = b
        .call(unlock_req(
            "b",
            &[mq(0)],
            Some(&ext::encode_queue_offsets([("T", 0, 3)])),
        ))
        .await;
    ok(&r);
    assert!(r.remark.unwrap_or_default().contains("below the stored"));
    assert_eq!(stored(&a, 0).await, Some(5));
    let r = a.call(lock_req("a", &[mq(0)], true)).await;
    assert_eq!(granted(&r), vec![mq(0)], "b's unlock freed the lock");

    // A commit for a queue the request does not unlock is not stored.
    let r = a
        .call(unlock_req(
            "a",
            &[mq(1)],
            Some(&ext::encode_queue_offsets([("T", 0, 7)])),
        ))
        .await;
    ok(&r);
    assert!(r
        .remark
        .unwrap_or_default()
        .contains("not unlocked by this request"));
    assert_eq!(stored(&a, 0).await, Some(5));
    a.shutdown();
    b.shutdown();
    c.stop().await;
}

fn notices(c: &RawClient) -> Vec<Option<ConsumerIdsNotice>> {
    c.received
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.code == rc::NOTIFY_CONSUMER_IDS_CHANGED)
        .map(|r| r.body.as_ref().map(|_| r.decode_json_body().unwrap()))
        .collect()
}

#[tokio::test]
async fn membership_notices_carry_the_member_list_to_shoal_members_only() {
    let c = Cluster::start().await;
    let a = RawClient::new(&c.broker_addr);
    let official = RawClient::new(&c.broker_addr);
    let b = RawClient::new(&c.broker_addr);
    ok(&a.call(create_topic_req("T", 4)).await);
    ok(&a.call(session_heartbeat("a")).await);
    // An official client: no session timeout in its heartbeat.
    ok(&official
        .call(heartbeat_req(
            "official",
            G,
            &[("T", "*")],
            MessageModel::Clustering,
        ))
        .await);
    ok(&b.call(session_heartbeat("b")).await);
    let full = vec!["a".to_string(), "b".into(), "official".into()];
    let mut got = Vec::new();
    for _ in 0..200 {
        got = notices(&a);
        if got.iter().flatten().any(|n| n.consumer_id_list == full) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The Shoal member's notices after its own join carry the list after each change, with
    // growing versions (its own join's notice may predate its session: plain).
    let lists: Vec<&ConsumerIdsNotice> = got.iter().flatten().collect();
    assert!(
        lists
            .iter()
            .any(|n| n.consumer_id_list == ["a", "official"]),
        "{got:?}"
    );
    assert_eq!(lists.last().unwrap().consumer_id_list, full, "{got:?}");
    assert!(lists.windows(2).all(|w| w[0].version < w[1].version));
    // The official client's notices are RocketMQ's plain ones.
    assert!(
        official
            .wait_notifications(rc::NOTIFY_CONSUMER_IDS_CHANGED, 1)
            .await
    );
    assert!(notices(&official).iter().all(Option::is_none));
    a.shutdown();
    b.shutdown();
    official.shutdown();
    c.stop().await;
}
