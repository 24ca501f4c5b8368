use super::*;
use shoal_proto::body::{ConsumeFromWhere, ConsumeType, MessageModel};

fn meta(model: MessageModel) -> ConsumerMeta {
    ConsumerMeta {
        consume_type: ConsumeType::ConsumePassively,
        message_model: model,
        consume_from_where: ConsumeFromWhere::ConsumeFromLastOffset,
    }
}

fn channel(conn: u64, client: &str) -> ClientChannel {
    ClientChannel {
        conn_id: conn,
        client_id: client.into(),
        client_addr: "127.0.0.1:1".into(),
        language: "CPP".into(),
        version: 1,
    }
}

fn heartbeat(
    conn: u64,
    client: &str,
    session: Option<u64>,
    coordinated: bool,
    model: MessageModel,
) -> ConsumerHeartbeat {
    ConsumerHeartbeat {
        group: "G".into(),
        channel: channel(conn, client),
        meta: meta(model),
        subscriptions: Some(
            [(
                "T".to_string(),
                SubscriptionData::from_tag_expression("T", "*", 1),
            )]
            .into(),
        ),
        session_timeout_ms: session,
        coordinated,
    }
}

fn classic(s: &mut GroupState, conn: u64, client: &str, now: u64) {
    s.handle_consumer_heartbeat(
        now,
        heartbeat(conn, client, None, false, MessageModel::Clustering),
    );
}

fn coordinated(
    s: &mut GroupState,
    conn: u64,
    client: &str,
    owned: &[MessageQueue],
    now: u64,
) -> Option<HeartbeatResponse> {
    s.handle_group_heartbeat(
        now,
        HeartbeatRequest {
            group: "G".into(),
            member_id: format!("m-{client}"),
            member_epoch: 0,
            client_id: client.into(),
            conn_id: conn,
            subscriptions: ["T".to_string()].into(),
            owned: owned.iter().cloned().collect(),
            ..Default::default()
        },
        vec![("T".into(), Some(qs()))],
    )
    .unwrap()
}

fn qs() -> Vec<MessageQueue> {
    (0..4).map(|i| MessageQueue::new("T", "b", i)).collect()
}

fn effects(s: &mut GroupState) -> Vec<GroupEffect> {
    std::iter::from_fn(|| s.poll_effect()).collect()
}

fn lock(s: &mut GroupState, conn: u64, client: &str, queues: &[MessageQueue], now: u64) {
    let _ = s.handle_lock(
        now,
        LockRequest {
            group: "G",
            queues,
            client_id: client,
            conn_id: conn,
            session: false,
            orderly: false,
        },
    );
}

#[test]
fn a_classic_member_switches_the_group_and_its_leave_switches_back() {
    let mut s = GroupState::new(GroupStateConfig::default());
    let r = coordinated(&mut s, 1, "shoal-a", &[], 0).unwrap();
    assert_eq!(r.assignment.len(), 4);
    s.handle_consumer_heartbeat(
        0,
        heartbeat(1, "shoal-a", None, true, MessageModel::Clustering),
    );
    assert_eq!(s.mode("G"), GroupMode::Coordinated);
    // shoal-a locks what it owns (it does in both modes).
    lock(&mut s, 1, "shoal-a", &qs(), 1);
    // An official client joins: classic mode, the coordinator lets go, locks stay.
    classic(&mut s, 2, "cpp", 2);
    assert_eq!(s.mode("G"), GroupMode::Classic);
    assert!(!s.coordinator().has_members("G"));
    assert_eq!(s.locks().owner("G", &qs()[0], 2), Some("shoal-a"));
    assert!(effects(&mut s).iter().any(|e| matches!(
        e,
        GroupEffect::ModeChanged {
            mode: GroupMode::Classic,
            ..
        }
    )));
    assert!(coordinated(&mut s, 1, "shoal-a", &qs(), 3).is_none());
    // The official client leaves: coordinated again; shoal-a rejoins and keeps the queues it
    // holds the locks of.
    s.handle_connection_closed(4, 2);
    assert!(effects(&mut s).iter().any(|e| matches!(
        e,
        GroupEffect::ModeChanged {
            mode: GroupMode::Coordinated,
            ..
        }
    )));
    let mut held = qs();
    held.truncate(2);
    s.handle_unlock(4, "G", "shoal-a", &qs()[2..]);
    let r = coordinated(&mut s, 1, "shoal-a", &held, 5).unwrap();
    assert_eq!(r.assignment.len(), 4);
    assert_eq!(s.mode("G"), GroupMode::Coordinated);
}

/// A member the coordinator removes (its coordinator session ran out) while its broker
/// session lives on (frozen, or its group heartbeats lost) keeps its queue locks: its lease
/// rests on that session. They are freed when the session ends.
#[test]
fn a_member_removed_by_the_coordinator_keeps_its_locks_while_its_session_lives() {
    let mut s = GroupState::new(GroupStateConfig {
        coordinator: CoordinatorConfig {
            session_timeout_ms: 1_000,
            ..CoordinatorConfig::default()
        },
        ..GroupStateConfig::default()
    });
    coordinated(&mut s, 1, "shoal-a", &[], 0).unwrap();
    s.handle_consumer_heartbeat(
        0,
        heartbeat(1, "shoal-a", None, true, MessageModel::Clustering),
    );
    lock(&mut s, 1, "shoal-a", &qs(), 0);
    // No group heartbeat for the coordinator's session: removed.
    s.handle_timeout(2_000);
    let _ = effects(&mut s);
    assert!(!s.coordinator().has_members("G"));
    assert_eq!(s.locks().owner("G", &qs()[0], 2_000), Some("shoal-a"));
    // Its broker session ends (here: the connection closes): the locks go.
    s.handle_connection_closed(2_100, 1);
    assert_eq!(s.locks().owner("G", &qs()[0], 2_100), None);
    assert!(effects(&mut s)
        .iter()
        .any(|e| matches!(e, GroupEffect::ClientLocksReleased { count: 4, .. })));
}

/// One membership change is one operation: the notice to every remaining member (with the
/// member list for Shoal members when only members changed), the lock release of the member
/// that left and the observation come out of it as effects.
#[test]
fn a_membership_change_yields_its_notices_as_effects() {
    let mut s = GroupState::new(GroupStateConfig {
        member_list_version_base: 100,
        ..GroupStateConfig::default()
    });
    s.handle_consumer_heartbeat(
        0,
        heartbeat(1, "shoal-a", Some(3_000), false, MessageModel::Clustering),
    );
    classic(&mut s, 2, "cpp", 0);
    lock(&mut s, 2, "cpp", &qs(), 0);
    let _ = effects(&mut s);
    assert!(s.handle_unregister_consumer(10, "G", "cpp", 2));
    let e = effects(&mut s);
    assert!(e.iter().any(|e| matches!(
        e,
        GroupEffect::ClientLocksReleased { client_id, count: 4, .. } if client_id == "cpp"
    )));
    assert!(e.iter().any(|e| matches!(
        e,
        GroupEffect::MembershipObserved { members, subscription_changed: false, .. }
            if members == &vec![(1, "shoal-a".to_string())]
    )));
    let notice = e.iter().find_map(|e| match e {
        GroupEffect::ConsumerIdsChanged {
            conn_ids,
            member_list,
            ..
        } => Some((conn_ids.clone(), member_list.clone())),
        _ => None,
    });
    let (conns, list) = notice.expect("a notice");
    assert_eq!(conns, vec![1]);
    let list = list.expect("a member list for the Shoal member");
    assert_eq!(list.notice.consumer_id_list, vec!["shoal-a".to_string()]);
    assert!(list.notice.version > 100);
    assert_eq!(list.to, [1].into());
}

#[test]
fn broadcasting_groups_are_not_told_to_rebalance() {
    let mut s = GroupState::new(GroupStateConfig::default());
    s.handle_consumer_heartbeat(
        0,
        heartbeat(1, "a", None, false, MessageModel::Broadcasting),
    );
    s.handle_consumer_heartbeat(
        0,
        heartbeat(2, "b", None, false, MessageModel::Broadcasting),
    );
    assert!(!effects(&mut s)
        .iter()
        .any(|e| matches!(e, GroupEffect::ConsumerIdsChanged { .. })));
}

#[test]
fn the_commit_fence_keeps_offsets_with_the_lock_holder() {
    let mut s = GroupState::new(GroupStateConfig::default());
    s.handle_consumer_heartbeat(
        0,
        heartbeat(1, "shoal-a", Some(3_000), false, MessageModel::Clustering),
    );
    s.handle_consumer_heartbeat(
        0,
        heartbeat(2, "shoal-b", Some(3_000), false, MessageModel::Clustering),
    );
    classic(&mut s, 3, "official", 0);
    let q = &qs()[0];
    let _ = s.handle_lock(
        1,
        LockRequest {
            group: "G",
            queues: std::slice::from_ref(q),
            client_id: "shoal-a",
            conn_id: 1,
            session: true,
            orderly: false,
        },
    );
    let check = |conn, offset, rewind| CommitCheck {
        conn_id: conn,
        group: "G",
        queue: q,
        offset,
        rewind,
    };
    // The holder commits forward, not backwards unless it rewinds.
    assert!(s.check_commit(2, check(1, 10, false), || Some(5)).is_ok());
    assert!(s.check_commit(2, check(1, 4, false), || Some(5)).is_err());
    assert!(s.check_commit(2, check(1, 4, true), || Some(5)).is_ok());
    // A Shoal member without the lock, and an official client while another holds it: refused.
    assert!(s.check_commit(2, check(2, 10, false), || None).is_err());
    assert!(s.check_commit(2, check(3, 10, false), || None).is_err());
    // Free queue: an official client commits; a Shoal member still needs the lock.
    let free = &qs()[1];
    let c = CommitCheck {
        conn_id: 3,
        group: "G",
        queue: free,
        offset: 1,
        rewind: false,
    };
    assert!(s.check_commit(2, c, || None).is_ok());
    assert!(s
        .check_commit(2, CommitCheck { conn_id: 2, ..c }, || None)
        .is_err());
}
