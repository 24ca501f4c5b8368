//! Coordinated mode over real TCP: group heartbeats, revoke-then-assign with notices, the
//! member-epoch fence on pulls and commits, unlock evidence, describe and history, the switch
//! to classic mode when a classic-only member joins, and a coordinator restart.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

mod common;

use common::*;
use shoal_proto::body::{LockBatchRequestBody, UnlockBatchRequestBody};
use shoal_proto::code::request_code as rc;
use shoal_proto::coordinated::{
    request_code as crc, response_code as cresp, stamp, GroupHeartbeatRequest,
    GroupHeartbeatResponse, GroupLeaveRequest, GroupRef,
};
use shoal_proto::header::UpdateConsumerOffsetRequestHeader;
use shoal_proto::{MessageQueue, RemotingCommand};

struct Member {
    raw: RawClient,
    id: String,
    client_id: String,
    epoch: i32,
    owned: Vec<MessageQueue>,
    instance: Option<String>,
    session_ms: Option<u64>,
}

impl Member {
    fn new(addr: &str, id: &str) -> Member {
        Member {
            raw: RawClient::new(addr),
            id: id.into(),
            client_id: format!("client-{id}"),
            epoch: 0,
            owned: Vec::new(),
            instance: None,
            session_ms: None,
        }
    }

    async fn heartbeat_raw(&self) -> RemotingCommand {
        let body = GroupHeartbeatRequest {
            assignor: Some("STICKY".into()),
            client_id: self.client_id.clone(),
            group: "G".into(),
            instance_id: self.instance.clone(),
            last_epoch: None,
            member_epoch: self.epoch,
            member_id: self.id.clone(),
            owned: self.owned.clone(),
            rebalance_timeout_ms: Some(30_000),
            session_timeout_ms: self.session_ms,
            subscriptions: vec!["T".into()],
        };
        self.raw
            .call(
                RemotingCommand::request(crc::GROUP_HEARTBEAT)
                    .with_json_body(&body)
                    .unwrap(),
            )
            .await
    }

    /// Heartbeats and applies the answer: releases what is no longer assigned (after `release`
    /// says so), takes what is.
    async fn heartbeat(&mut self, release: bool) -> GroupHeartbeatResponse {
        let r = self.heartbeat_raw().await;
        ok(&r);
        let a: GroupHeartbeatResponse = r.decode_json_body().unwrap();
        self.epoch = a.member_epoch;
        if release {
            self.owned = a.assignment.clone();
        } else {
            for q in &a.assignment {
                if !self.owned.contains(q) {
                    self.owned.push(q.clone());
                }
            }
        }
        a
    }

    fn notices(&self) -> usize {
        self.raw.notifications(crc::GROUP_ASSIGNMENT_CHANGED)
    }

    async fn wait_notices(&self, n: usize) -> bool {
        self.raw
            .wait_notifications(crc::GROUP_ASSIGNMENT_CHANGED, n)
            .await
    }
}

fn describe_req() -> RemotingCommand {
    RemotingCommand::request(crc::GROUP_DESCRIBE)
        .with_json_body(&GroupRef { group: "G".into() })
        .unwrap()
}

#[tokio::test]
async fn revoke_then_assign_fencing_and_evidence() {
    let c = Cluster::start().await;
    let mut a = Member::new(&c.broker_addr, "a");
    let mut b = Member::new(&c.broker_addr, "b");
    ok(&a.raw.call(create_topic_req("T", 4)).await);
    let r = a.heartbeat(true).await;
    assert_eq!(r.assignment.len(), 4);
    assert_eq!(
        a.notices(),
        0,
        "a heartbeat is not answered with a notice too"
    );
    // Shoal clients send the classic heartbeat too (after the coordinated one).
    a.raw.join(&a.client_id, "G", &[("T", "*")]).await;
    assert_eq!(r.member_epoch, 1);

    // b joins: gets nothing until a released; a is told to heartbeat.
    let r = b.heartbeat(true).await;
    assert!(r.assignment.is_empty());
    b.raw.join(&b.client_id, "G", &[("T", "*")]).await;
    assert!(a.wait_notices(1).await, "a was not told");
    let r = a.heartbeat(false).await;
    assert_eq!(r.assignment.len(), 2);
    let revoked: Vec<MessageQueue> = a
        .owned
        .iter()
        .filter(|q| !r.assignment.contains(q))
        .cloned()
        .collect();
    assert_eq!(revoked.len(), 2);

    // a may still commit a revoked queue with its epoch (final commit), and pull it.
    let mut commit = RemotingCommand::request_with_header(
        rc::UPDATE_CONSUMER_OFFSET,
        &UpdateConsumerOffsetRequestHeader {
            consumer_group: "G".into(),
            topic: "T".into(),
            queue_id: revoked[0].queue_id,
            commit_offset: 0,
            ..Default::default()
        },
    );
    stamp(&mut commit, "a", a.epoch);
    ok(&a.raw.call(commit.clone()).await);
    // b may not pull it yet.
    let mut pull = pull_req("G", "T", revoked[0].queue_id, 0, 0, 0);
    stamp(&mut pull, "b", b.epoch);
    assert_eq!(
        b.raw.call(pull.clone()).await.code,
        cresp::QUEUE_NOT_ASSIGNED
    );

    // a unlocks them: the broker takes that as release evidence and tells b at once.
    let before = b.notices();
    let unlock = RemotingCommand::request(rc::UNLOCK_BATCH_MQ)
        .with_json_body(&UnlockBatchRequestBody {
            consumer_group: "G".into(),
            client_id: a.client_id.clone(),
            mq_set: revoked.clone(),
            ..Default::default()
        })
        .unwrap();
    ok(&a.raw.call(unlock).await);
    assert!(b.wait_notices(before + 1).await, "b was not told");
    let r = b.heartbeat(true).await;
    assert_eq!(r.assignment.len(), 2);
    a.owned.retain(|q| !revoked.contains(q));

    // Now b pulls and locks it with its epoch; a's commit of it is fenced.
    let mut pull = pull_req("G", "T", revoked[0].queue_id, 0, 0, 0);
    stamp(&mut pull, "b", b.epoch);
    let code = b.raw.call(pull).await.code;
    assert!(code != cresp::QUEUE_NOT_ASSIGNED && code != cresp::FENCED_MEMBER_EPOCH);
    let mut lock = RemotingCommand::request(rc::LOCK_BATCH_MQ)
        .with_json_body(&LockBatchRequestBody {
            consumer_group: "G".into(),
            client_id: b.client_id.clone(),
            mq_set: r.assignment.clone(),
            ..Default::default()
        })
        .unwrap();
    stamp(&mut lock, "b", b.epoch);
    ok(&b.raw.call(lock.clone()).await);
    assert_eq!(a.raw.call(commit).await.code, cresp::QUEUE_NOT_ASSIGNED);
    // A stamp ahead of the coordinator is fenced.
    let mut lock_ahead = lock.clone();
    stamp(&mut lock_ahead, "b", b.epoch + 5);
    assert_eq!(
        b.raw.call(lock_ahead).await.code,
        cresp::FENCED_MEMBER_EPOCH
    );

    // Describe and history.
    let d: serde_json::Value = a.raw.call(describe_req()).await.decode_json_body().unwrap();
    assert_eq!(d["mode"], "coordinated");
    assert_eq!(d["assignor"], "STICKY");
    assert_eq!(d["reconciled"], true);
    assert_eq!(d["members"].as_array().unwrap().len(), 2);
    let h: serde_json::Value = a
        .raw
        .call(
            RemotingCommand::request(crc::GROUP_HISTORY)
                .with_json_body(&GroupRef { group: "G".into() })
                .unwrap(),
        )
        .await
        .decode_json_body()
        .unwrap();
    let rebalances = h["rebalances"].as_array().unwrap();
    assert_eq!(rebalances.len(), 2);
    assert_eq!(rebalances[1]["cause"]["kind"], "join");
    assert_eq!(rebalances[1]["moves"].as_array().unwrap().len(), 2);
    assert!(rebalances[1]["reconciledAtMs"].as_u64().is_some());

    // b leaves: its queues go back to a.
    let leave = RemotingCommand::request(crc::GROUP_LEAVE)
        .with_json_body(&GroupLeaveRequest {
            group: "G".into(),
            member_id: "b".into(),
            permanent: false,
        })
        .unwrap();
    ok(&b.raw.call(leave).await);
    let r = b.heartbeat_raw().await;
    assert_eq!(r.code, cresp::UNKNOWN_MEMBER_ID);
    let r = a.heartbeat(true).await;
    assert_eq!(r.assignment.len(), 4);
    c.stop().await;
}

#[tokio::test]
async fn a_member_s_session_is_its_own_bounded_by_the_broker() {
    let c = Cluster::start().await;
    let mut a = Member::new(&c.broker_addr, "a");
    let mut b = Member::new(&c.broker_addr, "b");
    ok(&a.raw.call(create_topic_req("T", 4)).await);
    // 10 ms is below the broker's min_session_timeout_ms (1 s): a gets 1 s.
    a.session_ms = Some(10);
    b.session_ms = Some(60_000);
    let r = a.heartbeat(true).await;
    assert!(r.heartbeat_interval_ms <= 1_000 / 3, "{r:?}");
    let r = b.heartbeat(true).await;
    assert!(r.heartbeat_interval_ms > 1_000 / 3, "{r:?}");
    let d: serde_json::Value = a.raw.call(describe_req()).await.decode_json_body().unwrap();
    let expires = |d: &serde_json::Value, id: &str| {
        d["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["memberId"] == id)
            .map(|m| m["sessionExpiresInMs"].as_u64().unwrap())
    };
    assert!(
        expires(&d, "a").is_some_and(|ms| ms <= 1_000 && ms > 10),
        "{d}"
    );
    assert!(expires(&d, "b").is_some_and(|ms| ms > 1_000), "{d}");
    // a goes silent; b heartbeats and gets a's queues once a's own 1 s session expired (the
    // coordinator's default is 45 s). Liveness bound only.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let r = b.heartbeat(true).await;
        if r.assignment.len() == 4 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "a was never removed");
    }
    let d: serde_json::Value = b.raw.call(describe_req()).await.decode_json_body().unwrap();
    assert!(expires(&d, "a").is_none(), "{d}");
}

#[tokio::test]
async fn a_classic_member_makes_the_group_classic_until_it_leaves() {
    let c = Cluster::start().await;
    let mut a = Member::new(&c.broker_addr, "a");
    ok(&a.raw.call(create_topic_req("T", 4)).await);
    a.heartbeat(true).await;
    a.raw.join(&a.client_id, "G", &[("T", "*")]).await;
    let official = RawClient::new(&c.broker_addr);
    official.join("cpp-client", "G", &[("T", "*")]).await;
    assert!(a.wait_notices(1).await, "a not told of the mode change");
    let r = a.heartbeat_raw().await;
    assert_eq!(r.code, cresp::GROUP_CLASSIC_MODE);
    let d: serde_json::Value = a.raw.call(describe_req()).await.decode_json_body().unwrap();
    assert_eq!(d["mode"], "classic");
    assert_eq!(d["classicClients"][0], "cpp-client");
    official.shutdown();
    assert!(a.wait_notices(2).await, "a not told of the way back");
    a.epoch = 0;
    a.owned.clear();
    let r = a.heartbeat(true).await;
    assert_eq!(r.assignment.len(), 4);
    c.stop().await;
}

#[tokio::test]
async fn a_coordinator_restart_keeps_assignments_and_epochs_move_on() {
    let mut c = Cluster::start().await;
    let mut a = Member::new(&c.broker_addr, "a");
    let mut b = Member::new(&c.broker_addr, "b");
    b.instance = Some("b-static".into());
    ok(&a.raw.call(create_topic_req("T", 4)).await);
    a.heartbeat(true).await;
    b.heartbeat(true).await;
    a.heartbeat(true).await;
    a.heartbeat(true).await;
    b.heartbeat(true).await;
    let (a_owned, b_owned) = (a.owned.clone(), b.owned.clone());
    assert_eq!((a_owned.len(), b_owned.len()), (2, 2));
    let epoch = b.epoch;
    c.restart_broker(|_| {}).await;
    let mut a = Member {
        raw: RawClient::new(&c.broker_addr),
        ..a
    };
    let mut b = Member {
        raw: RawClient::new(&c.broker_addr),
        ..b
    };
    let ra = a.heartbeat(true).await;
    let rb = b.heartbeat(true).await;
    assert_eq!(a.owned, a_owned);
    assert_eq!(b.owned, b_owned);
    assert!(ra.member_epoch > epoch && rb.member_epoch > epoch);
    c.stop().await;
}

/// A broker without a coordinator ignores a heartbeat's claim that a group speaks coordinated
/// mode (an Auto consumer announces itself before it knows what every broker offers): the
/// group is classic there, and GROUP_DESCRIBE says so. (It called such a group coordinated,
/// with no members, for the claim's session timeout.)
#[tokio::test]
async fn a_broker_without_a_coordinator_ignores_coordinated_claims() {
    let c = Cluster::start_with(|b| b.coordinator.enabled = false).await;
    let raw = RawClient::new(&c.broker_addr);
    ok(&raw.call(create_topic_req("T", 4)).await);
    let mut hb = heartbeat_req(
        "auto-client",
        "G",
        &[("T", "*")],
        shoal_proto::body::MessageModel::Clustering,
    );
    hb.ext_fields
        .get_or_insert_with(Default::default)
        .insert("shoalCoordinatedGroups", "G");
    ok(&raw.call(hb).await);
    let d: serde_json::Value = raw.call(describe_req()).await.decode_json_body().unwrap();
    assert_eq!(d["mode"], "classic", "{d}");
    assert_eq!(d["classicClients"][0], "auto-client", "{d}");
    raw.shutdown();
    c.stop().await;
}
