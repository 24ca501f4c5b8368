//! The classic group state machine on virtual time.

use super::*;
use proptest::prelude::*;
use shoal_proto::mq::MessageQueue;

/// The groups driven one request at a time: each call hands the event in and takes every
/// output it produced ([`ClassicGroups::poll_output`]).
trait Drive {
    fn outputs(&mut self) -> Vec<Output>;
    fn join(&mut self, group: &str, req: RequestId, join: JoinRequest, now: u64) -> Vec<Output>;
    fn sync(&mut self, group: &str, req: RequestId, sync: SyncRequest, now: u64) -> Vec<Output>;
    fn heartbeat(
        &mut self,
        group: &str,
        req: RequestId,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: u64,
    ) -> Vec<Output>;
    fn release_heartbeat(&mut self, group: &str, req: RequestId, now: u64) -> Vec<Output>;
    fn leave(
        &mut self,
        group: &str,
        members: &[LeavingMember],
        now: u64,
    ) -> (Vec<Result<(), ClassicError>>, Vec<Output>);
    fn tick(&mut self, now: u64) -> Vec<Output>;
}

impl Drive for ClassicGroups {
    fn outputs(&mut self) -> Vec<Output> {
        std::iter::from_fn(|| self.poll_output()).collect()
    }
    fn join(&mut self, group: &str, req: RequestId, join: JoinRequest, now: u64) -> Vec<Output> {
        self.handle_join(now, group, req, join);
        self.outputs()
    }
    fn sync(&mut self, group: &str, req: RequestId, sync: SyncRequest, now: u64) -> Vec<Output> {
        self.handle_sync(now, group, req, sync);
        self.outputs()
    }
    fn heartbeat(
        &mut self,
        group: &str,
        req: RequestId,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: u64,
    ) -> Vec<Output> {
        self.handle_heartbeat(now, group, req, member_id, instance_id, generation);
        self.outputs()
    }
    fn release_heartbeat(&mut self, group: &str, req: RequestId, now: u64) -> Vec<Output> {
        self.handle_heartbeat_release(now, group, req);
        self.outputs()
    }
    fn leave(
        &mut self,
        group: &str,
        members: &[LeavingMember],
        now: u64,
    ) -> (Vec<Result<(), ClassicError>>, Vec<Output>) {
        let results = self.handle_leave(now, group, members);
        (results, self.outputs())
    }
    fn tick(&mut self, now: u64) -> Vec<Output> {
        self.handle_timeout(now);
        self.outputs()
    }
}

const SESSION: u64 = 10_000;
const REBALANCE: u64 = 30_000;

/// Heartbeats answered at once and members told of a rebalance at once (as Kafka does);
/// [`held`] turns both on.
fn cfg(delay: u64) -> ClassicConfig {
    ClassicConfig {
        initial_rebalance_delay_ms: delay,
        heartbeat_hold_ms: 0,
        new_member_window_ms: 0,
        ..ClassicConfig::default()
    }
}

/// Heartbeats held up to `hold` ms and a new-member window of `window` ms.
fn held(hold: u64, window: u64) -> ClassicConfig {
    ClassicConfig {
        initial_rebalance_delay_ms: 0,
        heartbeat_hold_ms: hold,
        new_member_window_ms: window,
        ..ClassicConfig::default()
    }
}

/// A heartbeat that must be answered at once.
fn hb(
    g: &mut ClassicGroups,
    member: &str,
    instance: Option<&str>,
    gen: i32,
    now: u64,
) -> Result<(), ClassicError> {
    let out = g.heartbeat("G", 9_999, member, instance, gen, now);
    beats(&out)
        .into_iter()
        .find(|(r, _)| *r == 9_999)
        .map(|(_, a)| a)
        .unwrap_or_else(|| panic!("heartbeat of {member} not answered: {out:?}"))
}

fn beats(out: &[Output]) -> Vec<(RequestId, Result<(), ClassicError>)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Heartbeat(r, a) => Some((*r, *a)),
            _ => None,
        })
        .collect()
}

fn join_req(member: &str, new_id: &str, instance: Option<&str>, meta: &[u8]) -> JoinRequest {
    JoinRequest {
        member_id: member.into(),
        instance_id: instance.map(str::to_string),
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: SESSION,
        rebalance_timeout_ms: REBALANCE,
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), meta.to_vec())],
        require_known_member_id: true,
        new_member_id: new_id.into(),
        supports_skip_assignment: true,
    }
}

fn joins(out: &[Output]) -> Vec<(RequestId, JoinResponse)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Join(r, j) => Some((*r, j.clone())),
            _ => None,
        })
        .collect()
}

fn syncs(out: &[Output]) -> Vec<(RequestId, SyncResponse)> {
    out.iter()
        .filter_map(|o| match o {
            Output::Sync(r, s) => Some((*r, s.clone())),
            _ => None,
        })
        .collect()
}

/// Joins a new dynamic member (MEMBER_ID_REQUIRED round trip); returns its id.
fn first_join(g: &mut ClassicGroups, id: &str, req: RequestId, now: u64) -> Vec<Output> {
    let out = g.join("G", req, join_req("", id, None, b"m"), now);
    let j = joins(&out);
    assert_eq!(j[0].1.error, Some(ClassicError::MemberIdRequired));
    assert_eq!(j[0].1.member_id, id);
    g.join("G", req + 1000, join_req(id, "unused", None, b"m"), now)
}

#[test]
fn one_member_becomes_leader_and_gets_its_assignment() {
    let mut g = ClassicGroups::new(cfg(0));
    let out = first_join(&mut g, "a", 1, 0);
    let j = joins(&out);
    assert_eq!(j.len(), 1);
    assert_eq!(j[0].1.generation, 1);
    assert_eq!(j[0].1.leader, "a");
    assert_eq!(j[0].1.members.len(), 1);
    assert_eq!(j[0].1.protocol_name.as_deref(), Some("range"));
    let out = g.sync(
        "G",
        2,
        SyncRequest {
            member_id: "a".into(),
            instance_id: None,
            generation: 1,
            protocol_type: Some("consumer".into()),
            protocol_name: Some("range".into()),
            assignments: [("a".to_string(), b"all".to_vec())].into(),
        },
        1,
    );
    let s = syncs(&out);
    assert_eq!(s[0].1.assignment, b"all");
    assert_eq!(g.get("G").unwrap().state(), GroupState::Stable);
    assert_eq!(hb(&mut g, "a", None, 1, 2), Ok(()));
    assert_eq!(
        hb(&mut g, "a", None, 0, 2),
        Err(ClassicError::IllegalGeneration)
    );
    assert_eq!(
        hb(&mut g, "x", None, 1, 2),
        Err(ClassicError::UnknownMemberId)
    );
}

fn sync_all(
    g: &mut ClassicGroups,
    gen: i32,
    leader: &str,
    members: &[&str],
    now: u64,
) -> Vec<Output> {
    let mut out = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let assignments = if *m == leader {
            members
                .iter()
                .map(|x| (x.to_string(), format!("for-{x}").into_bytes()))
                .collect()
        } else {
            BTreeMap::new()
        };
        out.extend(g.sync(
            "G",
            500 + i as u64,
            SyncRequest {
                member_id: m.to_string(),
                instance_id: None,
                generation: gen,
                protocol_type: None,
                protocol_name: None,
                assignments,
            },
            now,
        ));
    }
    out
}

#[test]
fn a_second_member_triggers_a_rebalance_that_waits_for_the_first() {
    let mut g = ClassicGroups::new(cfg(0));
    first_join(&mut g, "a", 1, 0);
    sync_all(&mut g, 1, "a", &["a"], 0);
    // b joins: the group prepares a rebalance; b waits until a rejoins.
    let out = first_join(&mut g, "b", 10, 100);
    assert!(joins(&out).is_empty());
    assert_eq!(
        hb(&mut g, "a", None, 1, 200),
        Err(ClassicError::RebalanceInProgress)
    );
    let out = g.join("G", 20, join_req("a", "", None, b"m"), 300);
    let j = joins(&out);
    assert_eq!(j.len(), 2);
    assert!(j.iter().all(|(_, r)| r.generation == 2 && r.leader == "a"));
    let leader = j.iter().find(|(_, r)| r.member_id == "a").unwrap();
    assert_eq!(leader.1.members.len(), 2);
    let follower = j.iter().find(|(_, r)| r.member_id == "b").unwrap();
    assert!(follower.1.members.is_empty());
    // The follower's sync waits for the leader's.
    let out = sync_all(&mut g, 2, "a", &["b", "a"], 400);
    let s = syncs(&out);
    assert_eq!(s.len(), 2);
    assert!(s.iter().any(|(_, r)| r.assignment == b"for-b"));
}

/// a and b in a Stable group; returns (generation, leader).
fn stable_pair(g: &mut ClassicGroups) -> (i32, String) {
    first_join(g, "a", 1, 0);
    sync_all(g, 1, "a", &["a"], 0);
    first_join(g, "b", 3, 0);
    let out = g.join("G", 7, join_req("a", "", None, b"m"), 0);
    let j = joins(&out);
    assert_eq!(j.len(), 2);
    let (gen, leader) = (j[0].1.generation, j[0].1.leader.clone());
    sync_all(g, gen, &leader, &["a", "b"], 0);
    assert_eq!(g.get("G").unwrap().state(), GroupState::Stable);
    (gen, leader)
}

#[test]
fn the_description_shows_generation_leader_and_decoded_assignments_while_stable() {
    let mut g = ClassicGroups::new(cfg(0));
    let (gen, leader) = stable_pair(&mut g);
    // The "decoder" turns `for-a` into queue 0 of topic T and `for-b` into queue 1.
    let decode = |pt: &str, bytes: &[u8]| -> Vec<MessageQueue> {
        assert_eq!(pt, "consumer");
        let id = match bytes {
            b"for-a" => 0,
            b"for-b" => 1,
            _ => return Vec::new(),
        };
        vec![MessageQueue {
            topic: "T".into(),
            broker_name: "b".into(),
            queue_id: id,
        }]
    };
    let d = g.get("G").unwrap().describe(decode);
    assert_eq!(d.group, "G");
    assert_eq!(d.state, "Stable");
    assert_eq!(d.generation, gen);
    assert_eq!(d.protocol.as_deref(), Some("range"));
    assert_eq!(d.leader.as_deref(), Some(leader.as_str()));
    let ids: Vec<(&str, bool, Vec<i32>)> = d
        .members
        .iter()
        .map(|m| {
            (
                m.member_id.as_str(),
                m.leader,
                m.owned.iter().map(|q| q.queue_id).collect(),
            )
        })
        .collect();
    assert_eq!(
        ids,
        vec![("a", leader == "a", vec![0]), ("b", leader == "b", vec![1])]
    );
    // A third member starts a rebalance: assignments of the old generation are not shown.
    first_join(&mut g, "c", 30, 10);
    let d = g.get("G").unwrap().describe(decode);
    assert_eq!(d.state, "PreparingRebalance");
    assert!(d.members.iter().all(|m| m.owned.is_empty()));
}

#[test]
fn a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_timeout() {
    let mut g = ClassicGroups::new(cfg(0));
    stable_pair(&mut g);
    // c joins; a rejoins, b keeps heartbeating but never rejoins.
    first_join(&mut g, "c", 10, 1000);
    g.join("G", 20, join_req("a", "", None, b"m"), 1000);
    for t in (2000..1000 + REBALANCE).step_by(2000) {
        assert_eq!(
            hb(&mut g, "b", None, 2, t),
            Err(ClassicError::RebalanceInProgress)
        );
        assert!(joins(&g.tick(t)).is_empty());
    }
    let out = g.tick(1000 + REBALANCE);
    let j = joins(&out);
    assert_eq!(j.len(), 2, "a and c get the new generation");
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::MemberRemoved { member_id, .. } if member_id == "b")));
    assert_eq!(
        g.get("G").unwrap().member_ids(),
        vec!["a".to_string(), "c".to_string()]
    );
}

#[test]
fn sessions_expire_without_heartbeats() {
    let mut g = ClassicGroups::new(cfg(0));
    let (gen, _) = stable_pair(&mut g);
    for t in (1000..SESSION + 2000).step_by(1000) {
        hb(&mut g, "a", None, gen, t).ok();
        g.tick(t);
    }
    assert_eq!(g.get("G").unwrap().member_ids(), vec!["a".to_string()]);
    assert_eq!(g.get("G").unwrap().state(), GroupState::PreparingRebalance);
}

#[test]
fn leaving_rebalances_and_the_last_leave_empties_the_group() {
    let mut g = ClassicGroups::new(cfg(0));
    stable_pair(&mut g);
    let (r, _) = g.leave(
        "G",
        &[LeavingMember {
            member_id: "b".into(),
            instance_id: None,
        }],
        10,
    );
    assert_eq!(r, vec![Ok(())]);
    assert_eq!(g.get("G").unwrap().state(), GroupState::PreparingRebalance);
    let out = g.join("G", 30, join_req("a", "", None, b"m"), 20);
    assert_eq!(joins(&out)[0].1.generation, 3);
    let (r, _) = g.leave(
        "G",
        &[LeavingMember {
            member_id: "a".into(),
            instance_id: None,
        }],
        30,
    );
    assert_eq!(r, vec![Ok(())]);
    assert_eq!(g.get("G").unwrap().state(), GroupState::Empty);
    assert!(g
        .validate_commit("G", "", None, -1, 40, |_, _| Covers::All)
        .is_ok());
    assert_eq!(g.delete("G"), Ok(()));
}

#[test]
fn a_static_member_restarting_moves_nothing_and_fences_its_old_self() {
    let mut g = ClassicGroups::new(cfg(0));
    let s = |member: &str, new_id: &str, inst: &str| join_req(member, new_id, Some(inst), b"m");
    g.join("G", 1, s("", "a1", "ia"), 0);
    sync_all(&mut g, 1, "a1", &["a1"], 0);
    g.join("G", 2, s("", "b1", "ib"), 0);
    // b1's join starts a rebalance; a1 rejoins and the phase completes.
    let out = g.join("G", 4, s("a1", "", "ia"), 0);
    let j = joins(&out);
    let gen = j[0].1.generation;
    let leader = j[0].1.leader.clone();
    assert_eq!(g.get("G").unwrap().state(), GroupState::CompletingRebalance);
    sync_all(&mut g, gen, &leader, &["a1", "b1"], 0);
    assert_eq!(g.get("G").unwrap().state(), GroupState::Stable);
    // b restarts: a new incarnation with the same instance id and subscription.
    let out = g.join("G", 3, s("", "b2", "ib"), 5000);
    let j = joins(&out);
    assert_eq!(j.len(), 1);
    assert_eq!(j[0].1.error, None);
    assert_eq!(j[0].1.generation, gen, "no new generation");
    assert_eq!(g.get("G").unwrap().state(), GroupState::Stable);
    assert_eq!(
        g.get("G").unwrap().assignment_of("b2"),
        Some(&b"for-b1"[..])
    );
    // The old incarnation is fenced.
    assert_eq!(
        hb(&mut g, "b1", Some("ib"), gen, 5001),
        Err(ClassicError::FencedInstanceId)
    );
    assert_eq!(hb(&mut g, "b2", Some("ib"), gen, 5001), Ok(()));
}

#[test]
fn the_initial_delay_collects_members_before_the_first_generation() {
    let mut g = ClassicGroups::new(cfg(3000));
    first_join(&mut g, "a", 1, 0);
    first_join(&mut g, "b", 3, 1000);
    assert!(joins(&g.tick(2000)).is_empty());
    let out = g.tick(3000);
    let j = joins(&out);
    assert_eq!(j.len(), 2);
    assert!(j.iter().all(|(_, r)| r.generation == 1));
}

#[test]
fn inconsistent_protocols_and_bad_timeouts_are_refused() {
    let mut g = ClassicGroups::new(cfg(0));
    first_join(&mut g, "a", 1, 0);
    let mut other = join_req("", "x", None, b"m");
    other.protocols = vec![("roundrobin".into(), vec![])];
    let out = g.join("G", 5, other, 1);
    assert_eq!(
        joins(&out)[0].1.error,
        Some(ClassicError::InconsistentGroupProtocol)
    );
    let mut short = join_req("", "y", None, b"m");
    short.session_timeout_ms = 10;
    let out = g.join("G", 6, short, 1);
    assert_eq!(
        joins(&out)[0].1.error,
        Some(ClassicError::InvalidSessionTimeout)
    );
}

#[test]
fn the_group_size_is_bounded() {
    let mut g = ClassicGroups::new(ClassicConfig {
        max_size: 2,
        initial_rebalance_delay_ms: 0,
        ..ClassicConfig::default()
    });
    first_join(&mut g, "a", 1, 0);
    first_join(&mut g, "b", 3, 0);
    let out = g.join("G", 9, join_req("", "c", None, b"m"), 0);
    assert_eq!(
        joins(&out)[0].1.error,
        Some(ClassicError::GroupMaxSizeReached)
    );
}

/// Random schedules of joins, syncs, heartbeats (answered at once, or held and released by
/// a later request of the member), leaves and time jumps: every answered request is answered
/// once, members of a Stable group share one generation and all got an assignment from that
/// generation's leader, a group always gets out of PreparingRebalance by the rebalance
/// timeout, and every heartbeat is answered by the end of its hold.
#[derive(Debug, Clone)]
enum Step {
    Join(usize),
    Sync(usize),
    Heartbeat(usize),
    Release(usize),
    Leave(usize),
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0usize..4).prop_map(Step::Join),
        (0usize..4).prop_map(Step::Sync),
        (0usize..4).prop_map(Step::Heartbeat),
        (0usize..4).prop_map(Step::Release),
        (0usize..4).prop_map(Step::Leave),
        (1u64..15_000).prop_map(Step::Advance),
    ]
}

proptest! {
    #[test]
    fn random_schedules_keep_the_invariants(
        steps in proptest::collection::vec(step(), 1..80),
        holds in any::<bool>(),
    ) {
        let config = if holds { held(3_000, 200) } else { cfg(0) };
        let mut g = ClassicGroups::new(config);
        // Per client: its heartbeat waiting for an answer.
        let mut beating: Vec<Option<RequestId>> = vec![None; 4];
        let mut now = 0u64;
        let mut next_req: RequestId = 1;
        // Per client: its member id and generation as it believes them.
        let mut ids: Vec<Option<(String, i32)>> = vec![None; 4];
        let mut answered = std::collections::HashSet::new();
        let mut waiting: std::collections::HashMap<RequestId, usize> = Default::default();
        let mut prep_since: Option<u64> = None;
        for s in steps {
            let out = match s {
                Step::Join(c) => {
                    let req = next_req; next_req += 1;
                    waiting.insert(req, c);
                    let member = ids[c].as_ref().map(|x| x.0.clone()).unwrap_or_default();
                    g.join("G", req, join_req(&member, &format!("m{c}-{req}"), None, b"m"), now)
                }
                Step::Sync(c) => match ids[c].clone() {
                    Some((m, gen)) => {
                        let req = next_req; next_req += 1;
                        waiting.insert(req, c);
                        let members = g.get("G").map(|x| x.member_ids()).unwrap_or_default();
                        let assignments = members.iter().map(|x| (x.clone(), x.clone().into_bytes())).collect();
                        g.sync("G", req, SyncRequest { member_id: m, instance_id: None, generation: gen, protocol_type: None, protocol_name: None, assignments }, now)
                    }
                    None => Vec::new(),
                },
                Step::Heartbeat(c) => match ids[c].clone() {
                    Some((m, gen)) if beating[c].is_none() => {
                        let req = next_req; next_req += 1;
                        waiting.insert(req, c);
                        beating[c] = Some(req);
                        g.heartbeat("G", req, &m, None, gen, now)
                    }
                    _ => Vec::new(),
                },
                // Another request of the client on its connection: its held heartbeat is
                // answered first.
                Step::Release(c) => match beating[c] {
                    Some(req) => g.release_heartbeat("G", req, now),
                    None => Vec::new(),
                },
                Step::Leave(c) => match ids[c].take() {
                    Some((m, _)) => g.leave("G", &[LeavingMember { member_id: m, instance_id: None }], now).1,
                    None => Vec::new(),
                },
                Step::Advance(d) => { now += d; g.tick(now) }
            };
            for o in &out {
                let (req, member, gen, err) = match o {
                    Output::Join(r, j) => (*r, Some(j.member_id.clone()), j.generation, j.error),
                    Output::Sync(r, s) => (*r, None, -2, s.error),
                    Output::Heartbeat(r, a) => {
                        prop_assert!(answered.insert(*r), "heartbeat {} answered twice", r);
                        if let Some(c) = waiting.remove(r) {
                            beating[c] = None;
                            if *a == Err(ClassicError::UnknownMemberId) {
                                ids[c] = None;
                            }
                        }
                        continue;
                    }
                    _ => continue,
                };
                prop_assert!(answered.insert(req), "request {} answered twice", req);
                let c = waiting.remove(&req);
                if let (Some(c), Some(m)) = (c, member) {
                    match err {
                        None => ids[c] = Some((m, gen)),
                        Some(ClassicError::MemberIdRequired) => ids[c] = Some((m, -1)),
                        Some(ClassicError::UnknownMemberId) => ids[c] = None,
                        _ => {}
                    }
                }
            }
            if let Some(grp) = g.get("G") {
                if grp.state() == GroupState::PreparingRebalance {
                    let since = *prep_since.get_or_insert(now);
                    prop_assert!(now <= since + REBALANCE + SESSION, "stuck in PreparingRebalance");
                } else {
                    prep_since = None;
                }
                if grp.state() == GroupState::Stable {
                    let gen = grp.generation();
                    for m in grp.members() {
                        prop_assert_eq!(m.assignment.clone(), m.member_id.clone().into_bytes(), "stable member without its assignment");
                    }
                    prop_assert!(gen >= 1);
                }
            }
        }
        // Every heartbeat is answered by the end of its hold (or of the new-member window).
        let end = now + 3_000 + 10 * 200 + 1;
        for o in g.tick(end) {
            if let Output::Heartbeat(r, _) = o {
                prop_assert!(answered.insert(r), "heartbeat {} answered twice", r);
                if let Some(c) = waiting.remove(&r) {
                    beating[c] = None;
                }
            }
        }
        prop_assert!(beating.iter().all(Option::is_none), "heartbeats never answered: {:?}", beating);
    }
}

/// a and b in a Stable group whose heartbeats are held (requests 41 and 42); returns the
/// generation.
fn holding_pair(g: &mut ClassicGroups, now: u64) -> i32 {
    let (gen, _) = stable_pair(g);
    assert!(g.heartbeat("G", 41, "a", None, gen, now).is_empty());
    assert!(g.heartbeat("G", 42, "b", None, gen, now).is_empty());
    gen
}

#[test]
fn a_held_heartbeat_is_answered_at_the_end_of_its_hold_or_when_released() {
    let mut g = ClassicGroups::new(held(3_000, 0));
    let gen = holding_pair(&mut g, 100);
    assert_eq!(g.get("G").unwrap().next_deadline(), Some(3_100));
    assert!(beats(&g.tick(3_099)).is_empty());
    assert_eq!(beats(&g.tick(3_100)), vec![(41, Ok(())), (42, Ok(()))]);
    // Another request on b's connection answers its held heartbeat at once.
    assert!(g.heartbeat("G", 43, "b", None, gen, 3_200).is_empty());
    assert_eq!(
        beats(&g.release_heartbeat("G", 43, 3_250)),
        vec![(43, Ok(()))]
    );
    assert!(
        g.release_heartbeat("G", 43, 3_260).is_empty(),
        "answered once"
    );
    // A member with a held heartbeat is alive: held heartbeats keep the session going.
    for t in (3_300..3 * SESSION).step_by(3_000) {
        g.heartbeat("G", 1_000 + t, "a", None, gen, t);
        g.heartbeat("G", 2_000 + t, "b", None, gen, t);
        g.tick(t + 1);
    }
    assert_eq!(g.get("G").unwrap().member_ids().len(), 2);
    // The hold is at most a third of the session timeout.
    let mut g = ClassicGroups::new(held(60_000, 0));
    holding_pair(&mut g, 0);
    assert_eq!(g.get("G").unwrap().next_deadline(), Some(SESSION / 3));
}

#[test]
fn a_rebalance_answers_held_heartbeats_at_once() {
    let mut g = ClassicGroups::new(held(3_000, 0));
    let gen = holding_pair(&mut g, 0);
    // c joins: a and b learn it from their held heartbeats, not at their next heartbeat.
    let out = first_join(&mut g, "c", 10, 500);
    let mut told = beats(&out);
    told.sort_unstable_by_key(|(r, _)| *r);
    let rip = Err(ClassicError::RebalanceInProgress);
    assert_eq!(told, vec![(41, rip), (42, rip)]);
    g.join("G", 20, join_req("a", "", None, b"m"), 501);
    let j = joins(&g.join("G", 21, join_req("b", "", None, b"m"), 501));
    assert_eq!(j.len(), 3, "a new generation at once");
    assert!(j.iter().all(|(_, r)| r.generation == gen + 1));
    // A leave does the same.
    let gen = gen + 1;
    sync_all(&mut g, gen, &j[0].1.leader, &["b", "c", "a"], 502);
    assert!(g.heartbeat("G", 50, "a", None, gen, 503).is_empty());
    let (_, out) = g.leave(
        "G",
        &[LeavingMember {
            member_id: "c".into(),
            instance_id: None,
        }],
        504,
    );
    assert_eq!(beats(&out), vec![(50, rip)]);
}

/// Members that start together join one generation: the old members are told only once no
/// new member joined for the window, so the cooperative protocol needs two rounds (the
/// first revokes, the second assigns), not one more for each late joiner.
#[test]
fn new_members_within_the_window_join_one_generation() {
    let mut g = ClassicGroups::new(held(3_000, 200));
    let gen = holding_pair(&mut g, 0);
    // c, d and e start 50-150 ms apart; nobody is told until 200 ms after e.
    assert!(beats(&first_join(&mut g, "c", 10, 1_000)).is_empty());
    assert!(beats(&first_join(&mut g, "d", 20, 1_050)).is_empty());
    assert!(beats(&first_join(&mut g, "e", 30, 1_200)).is_empty());
    assert_eq!(g.get("G").unwrap().next_deadline(), Some(1_400));
    // A heartbeat that arrives meanwhile waits for the window too.
    assert!(beats(&g.release_heartbeat("G", 42, 1_300)).len() == 1);
    assert!(g.heartbeat("G", 43, "b", None, gen, 1_300).is_empty());
    assert!(beats(&g.tick(1_399)).is_empty());
    let rip = Err(ClassicError::RebalanceInProgress);
    assert_eq!(beats(&g.tick(1_400)), vec![(41, rip), (43, rip)]);
    g.join("G", 60, join_req("a", "", None, b"m"), 1_401);
    let j = joins(&g.join("G", 61, join_req("b", "", None, b"m"), 1_401));
    assert_eq!(j.len(), 5, "one generation for the five members");
    let gen = gen + 1;
    let leader = j[0].1.leader.clone();
    sync_all(&mut g, gen, &leader, &["b", "c", "d", "e", "a"], 1_402);
    // Round two: a revoked what moves and rejoins with its new metadata; the others are
    // told at once (no new member, no window), and one more generation completes.
    for (i, m) in ["b", "c", "d", "e"].iter().enumerate() {
        assert!(g
            .heartbeat("G", 70 + i as u64, m, None, gen, 1_403)
            .is_empty());
    }
    let out = g.join("G", 80, join_req("a", "", None, b"m-revoked"), 1_404);
    assert_eq!(beats(&out).len(), 4);
    assert!(beats(&out).iter().all(|(_, a)| *a == rip));
    let mut out = Vec::new();
    for (i, m) in ["b", "c", "d", "e"].iter().enumerate() {
        out = g.join("G", 90 + i as u64, join_req(m, "", None, b"m"), 1_405);
    }
    let j = joins(&out);
    assert_eq!(j.len(), 5);
    assert!(j.iter().all(|(_, r)| r.generation == gen + 1));
}

#[test]
fn the_new_member_window_is_bounded() {
    let mut g = ClassicGroups::new(held(3_000, 200));
    holding_pair(&mut g, 0);
    // A new member every 150 ms: the members are told ten windows after the first.
    let mut told_at = None;
    for i in 0..30u64 {
        let t = 1_000 + i * 150;
        let mut out = first_join(&mut g, &format!("n{i}"), 100 + 10 * i, t);
        out.extend(g.tick(t));
        if !beats(&out).is_empty() {
            told_at = Some(t);
            break;
        }
    }
    assert_eq!(
        told_at,
        Some(3_100),
        "1000 + ten windows of 200 ms, on the next join"
    );
}

/// With no initial delay, a new group's first members get their assignments without
/// waiting for a heartbeat interval: the first member's held heartbeat tells it of the
/// others at once, and the cooperative second round follows at once.
#[test]
fn a_new_group_settles_without_waiting_for_heartbeat_intervals() {
    let mut g = ClassicGroups::new(held(3_000, 200));
    first_join(&mut g, "a", 1, 0);
    sync_all(&mut g, 1, "a", &["a"], 1);
    assert!(g.heartbeat("G", 40, "a", None, 1, 2).is_empty());
    for (i, m) in ["b", "c", "d"].iter().enumerate() {
        first_join(&mut g, m, 10 * (i as u64 + 1), 45 + i as u64);
    }
    let out = g.tick(247);
    assert_eq!(
        beats(&out),
        vec![(40, Err(ClassicError::RebalanceInProgress))]
    );
    let j = joins(&g.join("G", 50, join_req("a", "", None, b"m"), 248));
    assert_eq!(j.len(), 4);
    assert!(j.iter().all(|(_, r)| r.generation == 2));
    assert_eq!(g.get("G").unwrap().state(), GroupState::CompletingRebalance);
}

/// A member that commits what it releases while the group already moved to a new generation
/// (fast rebalances make this common: it is told at once) keeps its commit of partitions of
/// the assignment it holds while no newer assignment is out, and of partitions of its previous
/// assignment that the newer one gives nobody else; a commit of other partitions, of
/// partitions now another member's, or with an older generation, is fenced.
#[test]
fn a_commit_with_an_older_generation_is_kept_while_nobody_else_was_given_its_partitions() {
    let mut g = ClassicGroups::new(held(3_000, 0));
    let gen = holding_pair(&mut g, 0);
    // c joins; a and b are told and rejoin: a new generation, its assignment not out yet.
    first_join(&mut g, "c", 10, 100);
    g.join("G", 20, join_req("a", "", None, b"m"), 101);
    let j = joins(&g.join("G", 21, join_req("b", "", None, b"m"), 101));
    assert_eq!(j[0].1.generation, gen + 1);
    // The commit names what `for-a` holds (and, with `taken`, what `for-c` holds too).
    let mine = |_: &str, bytes: &[u8]| {
        if bytes == b"for-a" {
            Covers::All
        } else {
            Covers::None
        }
    };
    let taken = |_: &str, bytes: &[u8]| {
        if bytes == b"for-a" || bytes == b"for-c" {
            Covers::All
        } else {
            Covers::None
        }
    };
    assert_eq!(g.validate_commit("G", "a", None, gen, 102, mine), Ok(()));
    assert_eq!(
        g.validate_commit("G", "a", None, gen, 102, |_, _| Covers::Some),
        Err(ClassicError::IllegalGeneration),
        "partitions it does not hold"
    );
    assert_eq!(
        g.validate_commit("G", "a", None, gen - 2, 102, mine),
        Err(ClassicError::IllegalGeneration),
        "a generation older than the last two synced"
    );
    // The leader hands out the new assignment: what nobody else was given may still be
    // committed with the old generation; what c was given may not.
    sync_all(&mut g, gen + 1, &j[0].1.leader, &["a", "b", "c"], 103);
    assert_eq!(g.validate_commit("G", "a", None, gen, 104, mine), Ok(()));
    assert_eq!(
        g.validate_commit("G", "a", None, gen, 104, taken),
        Err(ClassicError::IllegalGeneration),
        "partitions another member was given"
    );
    assert_eq!(
        g.validate_commit("G", "a", None, gen + 1, 104, |_, _| Covers::All),
        Ok(())
    );
    // One more generation synced: the oldest one is fenced whatever it names.
    first_join(&mut g, "d", 30, 200);
    for (i, m) in ["a", "b", "c"].iter().enumerate() {
        g.join("G", 40 + i as u64, join_req(m, "", None, b"m"), 201);
    }
    sync_all(&mut g, gen + 2, &j[0].1.leader, &["a", "b", "c", "d"], 202);
    assert_eq!(
        g.validate_commit("G", "a", None, gen, 203, mine),
        Err(ClassicError::IllegalGeneration)
    );
    assert_eq!(
        g.validate_commit("G", "a", None, gen + 1, 203, mine),
        Ok(())
    );
}
