//! Held heartbeat answers over TCP (docs/kafka.md, "Heartbeats"): a member whose heartbeat
//! tells it nothing new gets the answer when its assignment changes or a rebalance starts,
//! not when its hold ends; the holds here are far longer than the tests' time limits, so an
//! answer that arrives proves the wake-up, not a timer.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use shoal_group::coordinator::{Coordinator, CoordinatorConfig};
use shoal_kafka::KafkaConfig;
use std::time::Duration;

mod support;
use support::broker::{Client, Fixture};

/// Far longer than any wait below.
const HOLD_MS: u64 = 50_000;
const LIMIT: Duration = Duration::from_secs(10);

fn create_req(topic: &str, partitions: i32) -> CreateTopicsRequest {
    let mut t = create_topics_request::CreatableTopic::default();
    t.name = TopicName(StrBytes::from_string(topic.into()));
    t.num_partitions = partitions;
    t.replication_factor = 1;
    let mut r = CreateTopicsRequest::default();
    r.topics = vec![t];
    r.timeout_ms = 5000;
    r
}

fn cg_heartbeat(member: &str, epoch: i32, owned: Vec<i32>) -> ConsumerGroupHeartbeatRequest {
    let mut r = ConsumerGroupHeartbeatRequest::default();
    r.group_id = GroupId(StrBytes::from_static_str("KH"));
    r.member_id = StrBytes::from_string(member.into());
    r.member_epoch = epoch;
    r.rebalance_timeout_ms = 30_000;
    if epoch == 0 {
        r.subscribed_topic_names = Some(vec![TopicName(StrBytes::from_static_str("TH"))]);
    }
    let mut tp = consumer_group_heartbeat_request::TopicPartitions::default();
    tp.topic_id = shoal_kafka::topic_id("TH");
    tp.partitions = owned;
    r.topic_partitions = Some(vec![tp]);
    r
}

fn partitions(r: &ConsumerGroupHeartbeatResponse) -> Option<Vec<i32>> {
    r.assignment.as_ref().map(|a| {
        let mut ps: Vec<i32> = a
            .topic_partitions
            .iter()
            .flat_map(|t| t.partitions.clone())
            .collect();
        ps.sort_unstable();
        ps
    })
}

async fn answer(c: &mut Client, id: i32) -> ConsumerGroupHeartbeatResponse {
    tokio::time::timeout(LIMIT, c.recv(ApiKey::ConsumerGroupHeartbeat, 1, id))
        .await
        .expect("the held answer goes out when the assignment changes")
}

#[tokio::test]
async fn a_consumer_member_learns_of_a_join_from_its_held_heartbeat() {
    let f = Fixture::start_holding(KafkaConfig {
        consumer_heartbeat_interval_ms: HOLD_MS + 10_000,
        consumer_heartbeat_hold_ms: HOLD_MS,
        ..KafkaConfig::default()
    })
    .await;
    // The coordinator's interval is the longer one here too (the answer gives the shorter).
    *f.broker.coordinator.lock() = Coordinator::new(CoordinatorConfig {
        heartbeat_interval_ms: HOLD_MS + 10_000,
        session_timeout_ms: 10 * HOLD_MS,
        ..CoordinatorConfig::default()
    });
    let (mut a, mut b) = (f.client().await, f.client().await);
    let _: CreateTopicsResponse = a.call(ApiKey::CreateTopics, 7, &create_req("TH", 4)).await;
    // A joins: the answer gives it every partition at once, with the steady interval.
    let r: ConsumerGroupHeartbeatResponse = a
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("a", 0, vec![]),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(partitions(&r), Some(vec![0, 1, 2, 3]));
    assert_eq!(r.heartbeat_interval_ms as u64, HOLD_MS + 10_000);
    let epoch_a = r.member_epoch;
    // A's next heartbeat tells it nothing new: held.
    let held = a
        .send(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("a", epoch_a, vec![0, 1, 2, 3]),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // B joins. Its own answer waits for the partitions A still holds; A's held answer goes
    // out at once and takes two partitions away.
    let join_b = b
        .send(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("b", 0, vec![]),
        )
        .await;
    let r = answer(&mut a, held).await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let kept = partitions(&r).expect("a revocation for A");
    assert_eq!(kept.len(), 2);
    // A reports it released them: B's held join answer goes out with them.
    let ack = a
        .send(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("a", r.member_epoch, kept.clone()),
        )
        .await;
    let r = answer(&mut b, join_b).await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let got = partitions(&r).expect("B's partitions");
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|p| !kept.contains(p)));
    // A is reconciled: its acknowledging heartbeat is held (nothing new), until B leaves.
    let mut leave = cg_heartbeat("b", -1, vec![]);
    leave.topic_partitions = None;
    let _: ConsumerGroupHeartbeatResponse = b.call(ApiKey::ConsumerGroupHeartbeat, 1, &leave).await;
    let r = answer(&mut a, ack).await;
    assert_eq!(
        partitions(&r),
        Some(vec![0, 1, 2, 3]),
        "B's partitions back"
    );
    f.broker.coordinator.lock().check_invariants().unwrap();
}

fn fetch_req(partitions: &[i32]) -> FetchRequest {
    let mut t = fetch_request::FetchTopic::default();
    t.topic = TopicName(StrBytes::from_static_str("TH"));
    t.partitions = partitions
        .iter()
        .map(|p| {
            let mut fp = fetch_request::FetchPartition::default();
            fp.partition = *p;
            fp.partition_max_bytes = 1 << 20;
            fp
        })
        .collect();
    let mut r = FetchRequest::default();
    r.replica_id = BrokerId(-1);
    r.max_bytes = 1 << 20;
    r.session_epoch = -1;
    r.topics = vec![t];
    r
}

/// librdkafka pauses its fetcher during each rebalance callback (crate docs of
/// `fetch_hold`). When the heartbeat that acknowledges one assignment is answered with the
/// next (another member joined meanwhile), the member runs a second callback at once: its
/// fetches stay held through it, until the heartbeat after it, with no gap in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_stay_held_when_an_acknowledgement_is_answered_with_the_next_assignment() {
    let f = Fixture::start_holding(KafkaConfig {
        consumer_heartbeat_hold_ms: 0,
        rebalance_fetch_hold_ms: HOLD_MS,
        consumer_fetch_hold_ms: HOLD_MS,
        rebalance_answer_delay_ms: 200,
        ..KafkaConfig::default()
    })
    .await;
    let (mut a, mut b, mut c) = (f.client().await, f.client().await, f.client().await);
    let _: CreateTopicsResponse = a.call(ApiKey::CreateTopics, 7, &create_req("TH", 6)).await;
    let r: ConsumerGroupHeartbeatResponse = a
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("a", 0, vec![]),
        )
        .await;
    assert_eq!(partitions(&r), Some(vec![0, 1, 2, 3, 4, 5]));
    let epoch = r.member_epoch;
    // B joins; A's next heartbeat is answered with a revocation (its callback runs next).
    let r: ConsumerGroupHeartbeatResponse = b
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("b", 0, vec![]),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let asked = std::time::Instant::now();
    let r: ConsumerGroupHeartbeatResponse = a
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("a", epoch, vec![0, 1, 2, 3, 4, 5]),
        )
        .await;
    // The answer waits `rebalance_answer_delay_ms` after the hold (a fetch answered before
    // the hold reaches A first).
    assert!(asked.elapsed() >= Duration::from_millis(200));
    let first = partitions(&r).expect("a revocation for A");
    assert_eq!(first.len(), 3);
    let epoch = r.member_epoch;
    // C joins meanwhile. A fetch of what A kept is held through its callback.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("c", 0, vec![]),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let mut fetcher = f.client().await;
    let id = fetcher.send(ApiKey::Fetch, 12, &fetch_req(&first)).await;
    let fetch = tokio::spawn(async move {
        let r: FetchResponse = fetcher.recv(ApiKey::Fetch, 12, id).await;
        r
    });
    // A acknowledges; the answer takes another partition away: a second callback.
    let r: ConsumerGroupHeartbeatResponse = a
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("a", epoch, first.clone()),
        )
        .await;
    let second = partitions(&r).expect("the next revocation in the acknowledgement's answer");
    assert_eq!(second.len(), 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !fetch.is_finished(),
        "the fetch is still held while the second callback runs"
    );
    // A's heartbeat after the second callback ends the hold.
    let r: ConsumerGroupHeartbeatResponse = a
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("a", r.member_epoch, second),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let r = tokio::time::timeout(LIMIT, fetch)
        .await
        .expect("answered after the hold ends")
        .unwrap();
    assert_eq!(r.error_code, 0);
    f.broker.coordinator.lock().check_invariants().unwrap();
}

fn join_req(member: &StrBytes) -> JoinGroupRequest {
    let mut jr = JoinGroupRequest::default();
    jr.group_id = GroupId(StrBytes::from_static_str("CH"));
    jr.member_id = member.clone();
    jr.session_timeout_ms = 180_000;
    jr.rebalance_timeout_ms = 10_000;
    jr.protocol_type = StrBytes::from_static_str("consumer");
    let mut proto = join_group_request::JoinGroupRequestProtocol::default();
    proto.name = StrBytes::from_static_str("range");
    proto.metadata = Bytes::from_static(b"meta");
    jr.protocols = vec![proto];
    jr
}

fn heartbeat_req(member: &StrBytes, generation: i32) -> HeartbeatRequest {
    let mut h = HeartbeatRequest::default();
    h.group_id = GroupId(StrBytes::from_static_str("CH"));
    h.member_id = member.clone();
    h.generation_id = generation;
    h
}

#[tokio::test]
async fn a_classic_member_learns_of_a_rebalance_from_its_held_heartbeat() {
    let f = Fixture::start_holding(KafkaConfig {
        group_heartbeat_hold_ms: HOLD_MS,
        group_new_member_window_ms: 0,
        ..KafkaConfig::default()
    })
    .await;
    let (mut a, mut b) = (f.client().await, f.client().await);
    // A forms the group alone and syncs.
    let r: JoinGroupResponse = a
        .call(ApiKey::JoinGroup, 7, &join_req(&StrBytes::default()))
        .await;
    assert_eq!(r.error_code, 79, "MEMBER_ID_REQUIRED");
    let id_a = r.member_id.clone();
    let r: JoinGroupResponse = a.call(ApiKey::JoinGroup, 7, &join_req(&id_a)).await;
    assert_eq!((r.error_code, r.generation_id), (0, 1));
    let mut sr = SyncGroupRequest::default();
    sr.group_id = GroupId(StrBytes::from_static_str("CH"));
    sr.generation_id = 1;
    sr.member_id = id_a.clone();
    let r: SyncGroupResponse = a.call(ApiKey::SyncGroup, 4, &sr).await;
    assert_eq!(r.error_code, 0);
    // A held heartbeat does not hold back the next request of its connection (this client
    // gave no software name: answers go out in request order, the held one first).
    let hb = a.send(ApiKey::Heartbeat, 4, &heartbeat_req(&id_a, 1)).await;
    let list = a
        .send(ApiKey::ListGroups, 4, &ListGroupsRequest::default())
        .await;
    let r: HeartbeatResponse = tokio::time::timeout(LIMIT, a.recv(ApiKey::Heartbeat, 4, hb))
        .await
        .expect("released by the next request");
    assert_eq!(r.error_code, 0);
    let _: ListGroupsResponse = a.recv(ApiKey::ListGroups, 4, list).await;
    // Held again; B joins: A's held heartbeat says REBALANCE_IN_PROGRESS at once.
    let hb = a.send(ApiKey::Heartbeat, 4, &heartbeat_req(&id_a, 1)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r: JoinGroupResponse = b
        .call(ApiKey::JoinGroup, 7, &join_req(&StrBytes::default()))
        .await;
    let id_b = r.member_id.clone();
    let join_b = b.send(ApiKey::JoinGroup, 7, &join_req(&id_b)).await;
    let r: HeartbeatResponse = tokio::time::timeout(LIMIT, a.recv(ApiKey::Heartbeat, 4, hb))
        .await
        .expect("answered when the rebalance starts");
    assert_eq!(r.error_code, 27, "REBALANCE_IN_PROGRESS");
    // A rejoins: one generation with both.
    let r: JoinGroupResponse = a.call(ApiKey::JoinGroup, 7, &join_req(&id_a)).await;
    assert_eq!((r.error_code, r.generation_id, r.members.len()), (0, 2, 2));
    let r: JoinGroupResponse = b.recv(ApiKey::JoinGroup, 7, join_b).await;
    assert_eq!((r.error_code, r.generation_id), (0, 2));
}

/// A consumer-protocol assignment (version 3) of `partitions` of TH, as SyncGroup carries it.
fn assignment(partitions: Vec<i32>) -> Bytes {
    use bytes::BufMut;
    use kafka_protocol::protocol::Encodable;
    let mut tp = consumer_protocol_assignment::TopicPartition::default();
    tp.topic = TopicName(StrBytes::from_static_str("TH"));
    tp.partitions = partitions;
    let mut cpa = ConsumerProtocolAssignment::default();
    cpa.assigned_partitions = vec![tp];
    let mut b = bytes::BytesMut::new();
    b.put_i16(3);
    cpa.encode(&mut b, 3).unwrap();
    b.freeze()
}

/// A classic member's second SyncGroup gives it partition 2 beside the 0 and 1 it held: its
/// fetches of 0 and 1 wait through its assign callback, and end when it asks for the
/// committed offset of 2 (librdkafka does so from the assign call, after resuming its
/// partitions), long before the hold's end; another group's OffsetFetch ends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_member_s_offset_fetch_of_a_new_partition_ends_its_fetch_holds() {
    let f = Fixture::start_holding(KafkaConfig {
        group_heartbeat_hold_ms: 0,
        group_new_member_window_ms: 0,
        rebalance_fetch_hold_ms: HOLD_MS,
        ..KafkaConfig::default()
    })
    .await;
    let mut a = f.client().await;
    let _: CreateTopicsResponse = a.call(ApiKey::CreateTopics, 7, &create_req("TH", 4)).await;
    let r: JoinGroupResponse = a
        .call(ApiKey::JoinGroup, 7, &join_req(&StrBytes::default()))
        .await;
    let id = r.member_id.clone();
    let sync = |generation: i32, partitions: Vec<i32>| {
        let mut sr = SyncGroupRequest::default();
        sr.group_id = GroupId(StrBytes::from_static_str("CH"));
        sr.generation_id = generation;
        sr.member_id = id.clone();
        let mut sa = sync_group_request::SyncGroupRequestAssignment::default();
        sa.member_id = id.clone();
        sa.assignment = assignment(partitions);
        sr.assignments = vec![sa];
        sr
    };
    for (generation, partitions) in [(1, vec![0, 1]), (2, vec![0, 1, 2])] {
        let r: JoinGroupResponse = a.call(ApiKey::JoinGroup, 7, &join_req(&id)).await;
        assert_eq!((r.error_code, r.generation_id), (0, generation));
        let r: SyncGroupResponse = a
            .call(ApiKey::SyncGroup, 4, &sync(generation, partitions.clone()))
            .await;
        assert_eq!((r.error_code, r.assignment), (0, assignment(partitions)));
    }
    // Generation 2 gave A partition 2: its fetch of 0 and 1 waits for its callback.
    let mut fetcher = f.client().await;
    let fid = fetcher.send(ApiKey::Fetch, 12, &fetch_req(&[0, 1])).await;
    let fetch = tokio::spawn(async move {
        let r: FetchResponse = fetcher.recv(ApiKey::Fetch, 12, fid).await;
        r
    });
    let offset_fetch = |group: &'static str| {
        let mut t = offset_fetch_request::OffsetFetchRequestTopic::default();
        t.name = TopicName(StrBytes::from_static_str("TH"));
        t.partition_indexes = vec![2];
        let mut r = OffsetFetchRequest::default();
        r.group_id = GroupId(StrBytes::from_static_str(group));
        r.topics = Some(vec![t]);
        r
    };
    let _: OffsetFetchResponse = a.call(ApiKey::OffsetFetch, 7, &offset_fetch("other")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !fetch.is_finished(),
        "still held after another group's OffsetFetch"
    );
    let _: OffsetFetchResponse = a.call(ApiKey::OffsetFetch, 7, &offset_fetch("CH")).await;
    let r = tokio::time::timeout(LIMIT, fetch)
        .await
        .expect("answered once A asked for partition 2's offset")
        .unwrap();
    assert_eq!(r.error_code, 0);
}
