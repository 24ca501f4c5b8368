//! Property test of the coordinator: random schedules of joins, leaves, kills, freezes,
//! heartbeats, releases, unlocks, restarts and topic changes on virtual time; every step keeps
//! each queue with at most one member, and the group converges once the schedule ends.

use super::*;

#[derive(Debug, Clone)]
enum Op {
    Join {
        static_member: bool,
    },
    Leave(usize),
    Kill(usize),
    Freeze(usize),
    Heartbeat(usize),
    HeartbeatAll,
    SetSlow(usize, bool),
    Release(usize),
    Unlock(usize),
    /// Unlock while a heartbeat built before it is in flight; the heartbeat lands after.
    UnlockRacingHeartbeat(usize),
    Restart(usize),
    Queues(i32),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<bool>().prop_map(|s| Op::Join { static_member: s }),
        1 => (0usize..16).prop_map(Op::Leave),
        1 => (0usize..16).prop_map(Op::Kill),
        1 => (0usize..16).prop_map(Op::Freeze),
        6 => (0usize..16).prop_map(Op::Heartbeat),
        3 => Just(Op::HeartbeatAll),
        2 => ((0usize..16), any::<bool>()).prop_map(|(i, s)| Op::SetSlow(i, s)),
        2 => (0usize..16).prop_map(Op::Release),
        1 => (0usize..16).prop_map(Op::Unlock),
        2 => (0usize..16).prop_map(Op::UnlockRacingHeartbeat),
        1 => (0usize..16).prop_map(Op::Restart),
        1 => (1i32..24).prop_map(Op::Queues),
        2 => (1u64..20_000).prop_map(Op::Advance),
    ]
}

#[derive(Debug, Clone)]
struct Sim {
    c_next: u64,
    live: Vec<Client>,
    /// Frozen processes: they keep consuming what they had, never heartbeat again.
    frozen: Vec<Client>,
    now: u64,
    queues: i32,
}

fn run(ops: Vec<Op>, assignor: &str) {
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let mut s = Sim {
        c_next: 1,
        live: Vec::new(),
        frozen: Vec::new(),
        now: 0,
        queues: 16,
    };
    c.handle_topic_queues(0, T, queues(s.queues));
    let pick = |n: usize, i: usize| if n == 0 { None } else { Some(i % n) };
    for op in ops {
        match op {
            Op::Join { static_member } => {
                let id = format!("m{}", s.c_next);
                let mut cl = Client::new(&id, s.c_next, assignor);
                if static_member {
                    cl = cl.with_instance(&format!("inst{}", s.c_next));
                }
                s.c_next += 1;
                cl.heartbeat(&mut c, s.now);
                s.live.push(cl);
            }
            Op::Leave(i) => {
                if let Some(i) = pick(s.live.len(), i) {
                    let cl = s.live.remove(i);
                    c.handle_leave(s.now, "G", &cl.member_id, false).unwrap();
                }
            }
            Op::Kill(i) => {
                if let Some(i) = pick(s.live.len(), i) {
                    let cl = s.live.remove(i);
                    c.handle_connection_closed(s.now, cl.conn);
                }
            }
            Op::Freeze(i) => {
                if let Some(i) = pick(s.live.len(), i) {
                    let cl = s.live.remove(i);
                    s.frozen.push(cl);
                }
            }
            Op::Heartbeat(i) => {
                if let Some(i) = pick(s.live.len(), i) {
                    s.live[i].heartbeat(&mut c, s.now);
                }
            }
            Op::HeartbeatAll => {
                for cl in s.live.iter_mut() {
                    cl.heartbeat(&mut c, s.now);
                }
            }
            Op::SetSlow(i, slow) => {
                if let Some(i) = pick(s.live.len(), i) {
                    s.live[i].slow = slow;
                }
            }
            Op::Release(i) => {
                if let Some(i) = pick(s.live.len(), i) {
                    s.live[i].release_now();
                }
            }
            Op::Unlock(i) => {
                if let Some(i) = pick(s.live.len(), i) {
                    let gone: Vec<MessageQueue> = s.live[i].to_release.iter().cloned().collect();
                    s.live[i].release_now();
                    let client = format!("client-{}", s.live[i].member_id);
                    c.handle_released_by_client(s.now, "G", &client, &gone);
                }
            }
            Op::UnlockRacingHeartbeat(i) => {
                if let Some(i) = pick(s.live.len(), i) {
                    let e = s.live[i].unlock_racing_heartbeat(&mut c, s.now);
                    assert!(
                        !matches!(e, Some(GroupError::FencedMemberEpoch { .. })),
                        "a heartbeat built before an unlock was fenced: {e:?}"
                    );
                }
            }
            Op::Restart(i) => {
                // A static member restarts: graceful leave, new process, same instance id.
                if let Some(i) = pick(s.live.len(), i) {
                    if let Some(inst) = s.live[i].instance_id.clone() {
                        let old = s.live.remove(i);
                        c.handle_leave(s.now, "G", &old.member_id, false).unwrap();
                        let id = format!("m{}", s.c_next);
                        let mut cl = Client::new(&id, s.c_next, assignor).with_instance(&inst);
                        s.c_next += 1;
                        cl.heartbeat(&mut c, s.now);
                        s.live.push(cl);
                    }
                }
            }
            Op::Queues(n) => {
                s.queues = n;
                c.handle_topic_queues(s.now, T, queues(n));
            }
            Op::Advance(ms) => {
                s.now += ms;
                c.handle_timeout(s.now);
                // Everyone alive heartbeats at least every 5 s.
                if ms >= 5_000 {
                    for cl in s.live.iter_mut() {
                        cl.heartbeat(&mut c, s.now);
                    }
                }
            }
        }
        let everyone: Vec<Client> = s.live.iter().chain(s.frozen.iter()).cloned().collect();
        check_exclusive(&c, &everyone);
    }
    // Quiet period: no churn, everyone releases promptly; frozen members' sessions expire.
    for cl in s.live.iter_mut() {
        cl.slow = false;
        cl.release_now();
    }
    s.now += c.config().session_timeout_ms + 1;
    for cl in s.live.iter_mut() {
        cl.heartbeat(&mut c, s.now - 1);
    }
    c.handle_timeout(s.now);
    converge(&mut c, &mut s.live, s.now);
    let everyone: Vec<Client> = s.live.iter().chain(s.frozen.iter()).cloned().collect();
    check_exclusive(&c, &everyone);
    let d = c.describe("G", s.now);
    if !s.live.is_empty() {
        let d = d.expect("group");
        assert!(d.reconciled, "{d:?}");
        let a = assignment_of(&s.live);
        assert!(
            a.coverage(&queues(s.queues)).is_exclusive_and_complete(),
            "{a:?}"
        );
        assert_eq!(
            d.members.len(),
            s.live.len(),
            "only live members remain: {d:?}"
        );
        let last = c.history("G");
        assert!(last
            .last()
            .is_some_and(|r| r.reconciled_at_ms.is_some() || r.superseded));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_schedules_stay_exclusive_and_converge(
        ops in prop::collection::vec(op(), 1..80),
        assignor in prop::sample::select(vec!["STICKY", "COOPERATIVE_STICKY", "AVG", "BALANCED_STICKY", "ROUND_ROBIN"]),
    ) {
        run(ops, assignor);
    }
}
