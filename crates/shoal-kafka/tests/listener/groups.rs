//! Classic groups (JoinGroup/SyncGroup) and KIP-848 consumer groups on the broker's
//! coordinator.

use crate::fixture::*;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};
use shoal_kafka::KafkaConfig;

#[tokio::test]
async fn a_classic_group_forms_and_commits_offsets() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T4", 2)).await;
    let mut fc = FindCoordinatorRequest::default();
    fc.key = StrBytes::from_static_str("G");
    let r: FindCoordinatorResponse = c.call(ApiKey::FindCoordinator, 3, &fc).await;
    assert_eq!(r.error_code, 0);
    assert_eq!(
        r.port as u16,
        f.server.as_ref().unwrap().local_addr().port()
    );
    let mut jr = JoinGroupRequest::default();
    jr.group_id = GroupId(StrBytes::from_static_str("G"));
    jr.session_timeout_ms = 10_000;
    jr.rebalance_timeout_ms = 10_000;
    jr.protocol_type = StrBytes::from_static_str("consumer");
    let mut proto = join_group_request::JoinGroupRequestProtocol::default();
    proto.name = StrBytes::from_static_str("range");
    proto.metadata = Bytes::from_static(b"meta");
    jr.protocols = vec![proto];
    let r: JoinGroupResponse = c.call(ApiKey::JoinGroup, 7, &jr).await;
    assert_eq!(r.error_code, 79, "MEMBER_ID_REQUIRED");
    jr.member_id = r.member_id.clone();
    let r: JoinGroupResponse = c.call(ApiKey::JoinGroup, 7, &jr).await;
    assert_eq!(r.error_code, 0);
    assert_eq!(r.generation_id, 1);
    assert_eq!(r.leader, jr.member_id);
    assert_eq!(r.members.len(), 1);
    let mut sr = SyncGroupRequest::default();
    sr.group_id = jr.group_id.clone();
    sr.generation_id = 1;
    sr.member_id = jr.member_id.clone();
    let mut a = sync_group_request::SyncGroupRequestAssignment::default();
    a.member_id = jr.member_id.clone();
    // A consumer-protocol assignment (version 3) of both partitions of T4.
    let mut tp = consumer_protocol_assignment::TopicPartition::default();
    tp.topic = TopicName(StrBytes::from_static_str("T4"));
    tp.partitions = vec![0, 1];
    let mut cpa = ConsumerProtocolAssignment::default();
    cpa.assigned_partitions = vec![tp];
    let mut both = BytesMut::new();
    both.put_i16(3);
    cpa.encode(&mut both, 3).unwrap();
    let both = both.freeze();
    a.assignment = both.clone();
    sr.assignments = vec![a];
    let r: SyncGroupResponse = c.call(ApiKey::SyncGroup, 4, &sr).await;
    assert_eq!((r.error_code, &r.assignment), (0, &both));
    // What `shoal group describe` shows (through the broker's GROUP_DESCRIBE).
    let describe = f.server.as_ref().unwrap().classic_group_describer();
    let d = describe("G").expect("the group is described");
    assert_eq!(
        (
            d.state,
            d.generation,
            d.protocol.as_deref(),
            d.leader.as_deref()
        ),
        ("Stable", 1, Some("range"), Some(jr.member_id.as_str()))
    );
    assert_eq!(d.members.len(), 1);
    assert!(d.members[0].leader);
    let owned: Vec<(String, i32)> = d.members[0]
        .owned
        .iter()
        .map(|q| (q.topic.clone(), q.queue_id))
        .collect();
    assert_eq!(owned, [("T4".to_string(), 0), ("T4".to_string(), 1)]);
    assert!(describe("unknown").is_none());
    let mut hb = HeartbeatRequest::default();
    hb.group_id = jr.group_id.clone();
    hb.generation_id = 1;
    hb.member_id = jr.member_id.clone();
    let r: HeartbeatResponse = c.call(ApiKey::Heartbeat, 4, &hb).await;
    assert_eq!(r.error_code, 0);
    // Commit fenced by generation.
    let mut oc = OffsetCommitRequest::default();
    oc.group_id = jr.group_id.clone();
    oc.generation_id_or_member_epoch = 1;
    oc.member_id = jr.member_id.clone();
    let mut op = offset_commit_request::OffsetCommitRequestPartition::default();
    op.partition_index = 1;
    op.committed_offset = 42;
    let mut ot = offset_commit_request::OffsetCommitRequestTopic::default();
    ot.name = TopicName(StrBytes::from_static_str("T4"));
    ot.partitions = vec![op];
    oc.topics = vec![ot];
    let r: OffsetCommitResponse = c.call(ApiKey::OffsetCommit, 8, &oc).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    oc.generation_id_or_member_epoch = 7;
    let r: OffsetCommitResponse = c.call(ApiKey::OffsetCommit, 8, &oc).await;
    assert_eq!(
        r.topics[0].partitions[0].error_code, 22,
        "ILLEGAL_GENERATION"
    );
    assert_eq!(f.broker.store.query_offset("G", "T4", 1), Some(42));
    assert_eq!(f.broker.groups.lock().as_slice(), ["G".to_string()]);
    let mut of = OffsetFetchRequest::default();
    of.group_id = jr.group_id.clone();
    of.topics = None;
    let r: OffsetFetchResponse = c.call(ApiKey::OffsetFetch, 7, &of).await;
    assert_eq!(r.topics[0].partitions[0].committed_offset, 42);
    // Leave: the group is empty and can be deleted.
    let mut lg = LeaveGroupRequest::default();
    lg.group_id = jr.group_id.clone();
    let mut m = leave_group_request::MemberIdentity::default();
    m.member_id = jr.member_id.clone();
    lg.members = vec![m];
    let r: LeaveGroupResponse = c.call(ApiKey::LeaveGroup, 4, &lg).await;
    assert_eq!(r.members[0].error_code, 0);
    let mut dg = DeleteGroupsRequest::default();
    dg.groups_names = vec![jr.group_id.clone()];
    let r: DeleteGroupsResponse = c.call(ApiKey::DeleteGroups, 2, &dg).await;
    assert_eq!(r.results[0].error_code, 0);
    assert_eq!(f.broker.store.query_offset("G", "T4", 1), None);
}

fn cg_heartbeat(
    member: &str,
    epoch: i32,
    subscribe: Option<&str>,
    owned: Option<Vec<i32>>,
) -> ConsumerGroupHeartbeatRequest {
    let mut r = ConsumerGroupHeartbeatRequest::default();
    r.group_id = GroupId(StrBytes::from_static_str("KG"));
    r.member_id = StrBytes::from_string(member.into());
    r.member_epoch = epoch;
    r.rebalance_timeout_ms = 30_000;
    r.subscribed_topic_names = subscribe.map(|t| vec![TopicName(StrBytes::from_string(t.into()))]);
    r.topic_partitions = owned.map(|ps| {
        let mut tp = consumer_group_heartbeat_request::TopicPartitions::default();
        tp.topic_id = shoal_kafka::topic_id("T5");
        tp.partitions = ps;
        vec![tp]
    });
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

#[tokio::test]
async fn consumer_protocol_members_live_in_the_brokers_coordinator() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T5", 4)).await;
    // A joins and gets every partition.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-a", 0, Some("T5"), Some(vec![])),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let epoch_a = r.member_epoch;
    assert_eq!(partitions(&r), Some(vec![0, 1, 2, 3]));
    // The member is in the broker's coordinator, not in one of the listener's own.
    {
        let coord = f.broker.coordinator.lock();
        assert!(coord.has_member("KG", "member-a"));
        let d = coord.describe("KG", 0).unwrap();
        assert_eq!(d.members.len(), 1);
        assert_eq!(d.members[0].client_id, "test");
    }
    // B joins: nothing for it until A gives up what moves to B.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-b", 0, Some("T5"), Some(vec![])),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(partitions(&r), Some(vec![]));
    let epoch_b = r.member_epoch;
    // A heartbeats (what it owns left out: unchanged) and is told to keep two.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-a", epoch_a, None, None),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let kept = partitions(&r).expect("a new assignment for A");
    assert_eq!(kept.len(), 2);
    // A reports it released the others; then B gets them.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-a", r.member_epoch, None, Some(kept.clone())),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-b", epoch_b, None, None),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let got = partitions(&r).expect("an assignment for B");
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|p| !kept.contains(p)));
    f.broker.coordinator.lock().check_invariants().unwrap();
    // ConsumerGroupDescribe answers from the same coordinator.
    let mut d = ConsumerGroupDescribeRequest::default();
    d.group_ids = vec![GroupId(StrBytes::from_static_str("KG"))];
    let r: ConsumerGroupDescribeResponse = c.call(ApiKey::ConsumerGroupDescribe, 0, &d).await;
    assert_eq!(r.groups[0].error_code, 0);
    assert_eq!(r.groups[0].members.len(), 2);
    // A leaves; the coordinator forgets it.
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-a", -1, None, None),
        )
        .await;
    assert_eq!(r.error_code, 0);
    assert!(!f.broker.coordinator.lock().has_member("KG", "member-a"));
}

/// A joining member must send its subscription; one this listener knows that heartbeats at
/// epoch 0 without it (librdkafka does after an answer at epoch 0) keeps the one it sent.
#[tokio::test]
async fn an_epoch_zero_heartbeat_without_subscription_needs_a_known_member() {
    let f = Fixture::start(KafkaConfig::default()).await;
    let mut c = f.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T5", 2)).await;
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-n", 0, None, Some(vec![])),
        )
        .await;
    assert_eq!(r.error_code, 42, "INVALID_REQUEST: {:?}", r.error_message);
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-k", 0, Some("T5"), Some(vec![])),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(partitions(&r), Some(vec![0, 1]));
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-k", 0, None, Some(vec![0, 1])),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(partitions(&r), Some(vec![0, 1]), "still subscribed to T5");
}

/// A member whose group's state came with the coordinator (a broker group's new master took
/// it over) and that heartbeats there with only its id and epoch, as the Java client does
/// after a coordinator change, keeps its subscription and what it owns.
#[tokio::test]
async fn a_member_of_a_taken_over_group_keeps_what_its_heartbeat_leaves_out() {
    let old = Fixture::start(KafkaConfig::default()).await;
    let mut c = old.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T5", 4)).await;
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-j", 0, Some("T5"), Some(vec![])),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(partitions(&r), Some(vec![0, 1, 2, 3]));
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-j", r.member_epoch, None, Some(vec![0, 1, 2, 3])),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let epoch = r.member_epoch;
    let snapshot = old.broker.coordinator.lock().snapshot();
    // The new coordinator has the group's state, and its listener has heard nothing.
    let new = Fixture::start(KafkaConfig::default()).await;
    let mut c = new.client().await;
    let _: CreateTopicsResponse = c.call(ApiKey::CreateTopics, 7, &create_req("T5", 4)).await;
    *new.broker.coordinator.lock() = shoal_group::coordinator::Coordinator::restore(
        shoal_group::coordinator::CoordinatorConfig::default(),
        snapshot,
        0,
    );
    let r: ConsumerGroupHeartbeatResponse = c
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            1,
            &cg_heartbeat("member-j", epoch, None, None),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(
        partitions(&r),
        Some(vec![0, 1, 2, 3]),
        "it keeps its partitions"
    );
    let d = new.broker.coordinator.lock().describe("KG", 0).unwrap();
    assert_eq!(d.members[0].subscriptions, ["T5".to_string()]);
    assert_eq!(d.members[0].owned.len(), 4);
    new.broker.coordinator.lock().check_invariants().unwrap();
}
