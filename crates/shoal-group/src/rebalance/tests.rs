//! Races replayed on virtual time: every input is given with its instant, nothing sleeps.

use super::*;
use crate::strategy_by_name;

fn q(i: i32) -> MessageQueue {
    MessageQueue::new("T", "b", i)
}

fn qs(ids: &[i32]) -> Vec<MessageQueue> {
    ids.iter().map(|i| q(*i)).collect()
}

fn rb(id: &str) -> Rebalancer {
    let strategy: Arc<dyn AllocateStrategy> = Arc::from(strategy_by_name("AVG").unwrap());
    Rebalancer::new(RebalancerConfig::new("G", id), strategy)
}

fn ms(t0: u64, n: u64) -> u64 {
    t0 + n
}

fn lease(at: u64, session: Option<u64>) -> Lease {
    Lease {
        until: at + 10000,
        renew_at: at + 7000,
        session,
    }
}

fn drain(r: &mut Rebalancer) -> Vec<Action> {
    std::iter::from_fn(|| r.poll_action()).collect()
}

/// A broker lock table as small as a test needs: queue → holder.
#[derive(Default)]
struct Locks(BTreeMap<MessageQueue, String>);

impl Locks {
    fn lock(&mut self, who: &str, queues: &[MessageQueue]) -> BTreeSet<MessageQueue> {
        queues
            .iter()
            .filter(|mq| {
                let h = self.0.entry((*mq).clone()).or_insert_with(|| who.into());
                h == who
            })
            .cloned()
            .collect()
    }
    fn unlock(&mut self, who: &str, mq: &MessageQueue) {
        if self.0.get(mq).is_some_and(|h| h == who) {
            self.0.remove(mq);
        }
    }
}

/// Brings a lone member to owning queues 0..n, answering every action at once.
fn own_all(r: &mut Rebalancer, t: u64, n: i32, locks: &mut Locks, members: &[&str]) {
    r.handle_subscribe(t, "T");
    let ids: Vec<i32> = (0..n).collect();
    let me = r.config().client_id.clone();
    loop {
        let acts = drain(r);
        if acts.is_empty() {
            break;
        }
        for a in acts {
            match a {
                Action::FetchView { topic } => r.handle_view(
                    t,
                    &topic,
                    qs(&ids),
                    members.iter().map(|m| m.to_string()).collect(),
                ),
                Action::Lock { queues, .. } => {
                    let g = locks.lock(&me, &queues);
                    r.handle_lock_result(t, &queues, &g, Some(lease(t, Some(1))), true)
                }
                Action::QueryStartOffset { mq } => {
                    r.handle_start_offset(t, &mq, Some(StartOffset::Committed(0)))
                }
                Action::Start { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

#[test]
fn a_gain_waits_for_the_former_owner_to_commit_and_unlock() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t0, 4, &mut locks, &["a"]);
    assert_eq!(a.owned(), qs(&[0, 1, 2, 3]));
    assert!(a.is_settled());

    // b joins; b learns of it first (a's notice is late).
    let mut b = rb("b");
    b.handle_subscribe(ms(t0, 100), "T");
    assert_eq!(drain(&mut b), vec![Action::FetchView { topic: "T".into() }]);
    b.handle_view(
        ms(t0, 101),
        "T",
        qs(&[0, 1, 2, 3]),
        vec!["a".into(), "b".into()],
    );
    let acts = drain(&mut b);
    assert_eq!(
        acts,
        vec![Action::Lock {
            broker: "b".into(),
            queues: qs(&[2, 3])
        }]
    );
    // Refused: a still holds them. Nothing is read, nothing started.
    let g = locks.lock("b", &qs(&[2, 3]));
    assert!(g.is_empty());
    b.handle_lock_result(
        ms(t0, 102),
        &qs(&[2, 3]),
        &g,
        Some(lease(t0, Some(2))),
        true,
    );
    assert!(drain(&mut b).is_empty());
    assert_eq!(b.phase(&q(2)), Some(QueuePhase::Pending));
    // The retry (a safety net) comes 1 s later: still refused.
    assert_eq!(b.poll_timeout(), Some(ms(t0, 1102)));

    // a hears of the join 300 ms later: stops 2 and 3, commits, unlocks.
    a.handle_notice(ms(t0, 400));
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    a.handle_view(
        ms(t0, 401),
        "T",
        qs(&[0, 1, 2, 3]),
        vec!["a".into(), "b".into()],
    );
    assert_eq!(
        drain(&mut a),
        vec![Action::Stop { mq: q(2) }, Action::Stop { mq: q(3) }]
    );
    assert!(!a.may_dispatch(&q(2), ms(t0, 401)));
    assert!(a.may_dispatch(&q(0), ms(t0, 401)));
    a.handle_drained(ms(t0, 420), &q(2), Some(397));
    assert_eq!(
        drain(&mut a),
        vec![Action::Commit {
            mq: q(2),
            offset: 397,
            rewind: false
        }]
    );
    // No unlock before the commit is acknowledged.
    a.handle_committed(ms(t0, 425), &q(2), true);
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(2)]
        }]
    );
    locks.unlock("a", &q(2));
    a.handle_unlocked(ms(t0, 426), &q(2), true);
    assert_eq!(a.phase(&q(2)), None);

    // The broker tells b at once; b locks, then (only then) reads the offset.
    b.handle_lock_freed(ms(t0, 427), &[q(2)]);
    assert_eq!(
        drain(&mut b),
        vec![Action::Lock {
            broker: "b".into(),
            queues: vec![q(2)]
        }]
    );
    let g = locks.lock("b", &[q(2)]);
    b.handle_lock_result(
        ms(t0, 428),
        &[q(2)],
        &g,
        Some(lease(ms(t0, 427), Some(2))),
        true,
    );
    assert_eq!(drain(&mut b), vec![Action::QueryStartOffset { mq: q(2) }]);
    b.handle_start_offset(ms(t0, 429), &q(2), Some(StartOffset::Committed(397)));
    assert_eq!(
        drain(&mut b),
        vec![Action::Start {
            mq: q(2),
            offset: 397,
            lease_until: Some(ms(t0, 10_427))
        }]
    );
    assert!(b.may_dispatch(&q(2), ms(t0, 429)));
    assert!(!b.may_dispatch(&q(3), ms(t0, 429)));
}

#[test]
fn a_lease_that_runs_out_fences_the_queue_and_it_is_acquired_again() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t0, 2, &mut locks, &["a"]);
    // Renewal is due at 7 s; the member is frozen and wakes at 12 s.
    assert_eq!(a.poll_timeout(), Some(ms(t0, 7000)));
    let late = ms(t0, 12_000);
    assert!(!a.may_dispatch(&q(0), late));
    a.handle_timeout(late);
    assert_eq!(
        drain(&mut a),
        vec![Action::Fence { mq: q(0) }, Action::Fence { mq: q(1) }]
    );
    assert_eq!(a.stats().fenced, 2);
    // Fenced queues commit nothing and are acquired again (they are still ours to take).
    a.handle_drained(late, &q(0), Some(55));
    a.handle_drained(late, &q(1), Some(66));
    let lock = |i| Action::Lock {
        broker: "b".into(),
        queues: vec![q(i)],
    };
    assert_eq!(drain(&mut a), vec![lock(0), lock(1)]);
    // Someone else took q1 meanwhile.
    let granted: BTreeSet<MessageQueue> = [q(0)].into();
    a.handle_lock_result(late, &[q(0)], &granted, Some(lease(late, Some(3))), true);
    a.handle_lock_result(late, &[q(1)], &granted, Some(lease(late, Some(3))), true);
    assert_eq!(drain(&mut a), vec![Action::QueryStartOffset { mq: q(0) }]);
    assert_eq!(a.phase(&q(1)), Some(QueuePhase::Pending));
}

#[test]
fn a_heartbeat_of_another_session_means_the_locks_are_gone() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t0, 1, &mut locks, &["a"]);
    // Same session: the lease moves on.
    let t = ms(t0, 3000);
    a.handle_lease(t, "b", lease(t, Some(1)));
    assert_eq!(
        drain(&mut a),
        vec![Action::Lease {
            mq: q(0),
            until: ms(t0, 13_000)
        }]
    );
    // Another broker's heartbeat changes nothing.
    a.handle_lease(t, "other", lease(t, Some(9)));
    assert!(drain(&mut a).is_empty());
    // A new session: the broker dropped us (and our locks) in between.
    let t = ms(t0, 6000);
    a.handle_lease(t, "b", lease(t, Some(2)));
    assert_eq!(drain(&mut a), vec![Action::Fence { mq: q(0) }]);
    assert!(!a.may_dispatch(&q(0), t));
}

#[test]
fn a_refused_renewal_fences_at_once() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t0, 1, &mut locks, &["a"]);
    let t = ms(t0, 7000);
    a.handle_timeout(t);
    assert_eq!(
        drain(&mut a),
        vec![Action::Lock {
            broker: "b".into(),
            queues: vec![q(0)]
        }]
    );
    a.handle_lock_result(t, &[q(0)], &BTreeSet::new(), Some(lease(t, Some(1))), true);
    assert_eq!(drain(&mut a), vec![Action::Fence { mq: q(0) }]);
    // A failed renewal (no answer) is no evidence either way: the lease stands.
    let mut b = rb("b");
    own_all(&mut b, t0, 1, &mut Locks::default(), &["b"]);
    b.handle_timeout(t);
    assert_eq!(drain(&mut b).len(), 1);
    b.handle_lock_result(t, &[q(0)], &BTreeSet::new(), None, true);
    assert!(drain(&mut b).is_empty());
    assert!(b.may_dispatch(&q(0), ms(t0, 9999)));
    assert!(!b.may_dispatch(&q(0), ms(t0, 10_000)));
}

#[test]
fn a_view_fetched_across_a_notice_is_discarded() {
    let t0: u64 = 0;
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    assert_eq!(drain(&mut a).len(), 1);
    a.handle_notice(ms(t0, 1));
    assert!(drain(&mut a).is_empty(), "one fetch at a time");
    a.handle_view(ms(t0, 2), "T", qs(&[0, 1]), vec!["a".into(), "x".into()]);
    assert_eq!(a.stats().stale_views, 1);
    assert!(a.target().is_empty());
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    a.handle_view(ms(t0, 3), "T", qs(&[0, 1]), vec!["a".into()]);
    assert_eq!(a.target().len(), 2);
    assert_eq!(a.round(), 1);
    // The safety net comes 20 s after the last view.
    assert_eq!(a.poll_timeout(), Some(ms(t0, 20_003)));
    drain(&mut a);
}

#[test]
fn a_member_list_without_this_member_is_fetched_again_soon() {
    let t0: u64 = 0;
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    // The broker has not processed a's first heartbeat yet: the list holds only b.
    a.handle_view(ms(t0, 1), "T", qs(&[0, 1]), vec!["b".into()]);
    assert!(a.target().is_empty());
    assert_eq!(a.stats().views_without_self, 1);
    // Fetched again after refresh_retry (500 ms), not at the 20 s refresh.
    assert_eq!(a.poll_timeout(), Some(ms(t0, 501)));
    a.handle_timeout(ms(t0, 501));
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    a.handle_view(ms(t0, 502), "T", qs(&[0, 1]), vec!["a".into(), "b".into()]);
    assert_eq!(a.target().len(), 1);
    assert_eq!(a.stats().views_without_self, 1);
    assert_eq!(a.poll_timeout().map(|t| t > ms(t0, 5_000)), Some(true));
}

#[test]
fn lock_refusals_back_off_without_notices() {
    let t0: u64 = 0;
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    drain(&mut a);
    a.handle_view(t0, "T", qs(&[0]), vec!["a".into()]);
    let mut waits = Vec::new();
    let mut t = t0;
    for _ in 0..8 {
        let acts = drain(&mut a);
        assert!(matches!(acts.as_slice(), [Action::Lock { .. }]), "{acts:?}");
        a.handle_lock_result(t, &[q(0)], &BTreeSet::new(), Some(lease(t, None)), false);
        let next = a.poll_timeout().unwrap();
        waits.push(u128::from(next - t));
        t = next;
        a.handle_timeout(t);
    }
    assert_eq!(waits, vec![20, 40, 80, 160, 320, 640, 1000, 1000]);
}

#[test]
fn shutdown_releases_everything_in_order() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t0, 2, &mut locks, &["a"]);
    a.handle_shutdown(t0);
    assert!(a.is_shutting_down());
    assert_eq!(
        drain(&mut a),
        vec![Action::Stop { mq: q(0) }, Action::Stop { mq: q(1) }]
    );
    a.handle_drained(t0, &q(0), Some(10));
    a.handle_drained(t0, &q(1), None);
    assert_eq!(
        drain(&mut a),
        vec![
            Action::Commit {
                mq: q(0),
                offset: 10,
                rewind: false
            },
            Action::Unlock {
                broker: "b".into(),
                queues: vec![q(1)]
            }
        ]
    );
    a.handle_committed(t0, &q(0), false);
    a.handle_unlocked(t0, &q(1), true);
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(0)]
        }]
    );
    a.handle_unlocked(t0, &q(0), true);
    assert!(a.is_idle());
    // Late views change nothing.
    a.handle_view(t0, "T", qs(&[0, 1]), vec!["a".into()]);
    assert!(drain(&mut a).is_empty());
    assert!(a.poll_timeout().is_none());
}

/// A lone member subscribed to 2 queues with both locks granted: the start offsets are asked.
fn locked_not_started(a: &mut Rebalancer, t: u64, locks: &mut Locks) {
    a.handle_subscribe(t, "T");
    assert_eq!(drain(a), vec![Action::FetchView { topic: "T".into() }]);
    a.handle_view(t, "T", qs(&[0, 1]), vec!["a".into()]);
    let acts = drain(a);
    let [Action::Lock { queues, .. }] = acts.as_slice() else {
        panic!("{acts:?}")
    };
    let g = locks.lock("a", queues);
    a.handle_lock_result(t, queues, &g, Some(lease(t, Some(1))), true);
    assert_eq!(
        drain(a),
        vec![
            Action::QueryStartOffset { mq: q(0) },
            Action::QueryStartOffset { mq: q(1) }
        ]
    );
}

#[test]
fn a_queue_released_before_it_started_keeps_the_position_it_resolved() {
    // The group has no offset for queue 0: consume-from-where put it at 0. The member shuts
    // down before the answer comes; the position it chose is committed before the unlock, so
    // a next owner with another consume-from-where does not skip what it would have read.
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    locked_not_started(&mut a, t0, &mut locks);
    a.handle_shutdown(ms(t0, 1));
    assert!(drain(&mut a).is_empty(), "the queries are in flight");
    a.handle_start_offset(ms(t0, 2), &q(0), Some(StartOffset::Resolved(0)));
    // A committed start is the group's already: nothing to commit.
    a.handle_start_offset(ms(t0, 2), &q(1), Some(StartOffset::Committed(4)));
    assert_eq!(
        drain(&mut a),
        vec![
            Action::Commit {
                mq: q(0),
                offset: 0,
                rewind: false
            },
            Action::Unlock {
                broker: "b".into(),
                queues: vec![q(1)]
            }
        ]
    );
    assert_eq!(a.phase(&q(0)), Some(QueuePhase::Committing));
    a.handle_committed(ms(t0, 3), &q(0), true);
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(0)]
        }]
    );
    a.handle_unlocked(ms(t0, 4), &q(0), true);
    a.handle_unlocked(ms(t0, 4), &q(1), true);
    assert!(a.is_idle());
}

#[test]
fn a_resolved_start_is_not_committed_without_the_lock() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    locked_not_started(&mut a, t0, &mut locks);
    a.handle_shutdown(ms(t0, 1));
    // The answer comes after the lease ran out: the queue may be someone else's by now.
    a.handle_start_offset(ms(t0, 20_000), &q(0), Some(StartOffset::Resolved(0)));
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(0)]
        }]
    );
}

#[test]
fn a_queue_held_for_a_fresh_view_commits_its_resolved_start_when_the_view_takes_it() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    locked_not_started(&mut a, t0, &mut locks);
    // A notice after the view: started queues wait for a fresh view (held, locked).
    a.handle_notice(ms(t0, 1));
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    a.handle_start_offset(ms(t0, 2), &q(0), Some(StartOffset::Resolved(3)));
    a.handle_start_offset(ms(t0, 2), &q(1), Some(StartOffset::Resolved(5)));
    assert!(drain(&mut a).is_empty());
    assert_eq!(a.phase(&q(1)), Some(QueuePhase::Starting));
    // The fresh view gives queue 1 to b.
    a.handle_view(ms(t0, 3), "T", qs(&[0, 1]), vec!["a".into(), "b".into()]);
    assert_eq!(
        drain(&mut a),
        vec![
            Action::Start {
                mq: q(0),
                offset: 3,
                lease_until: Some(lease(t0, Some(1)).until)
            },
            Action::Commit {
                mq: q(1),
                offset: 5,
                rewind: false
            }
        ]
    );
}

#[test]
fn a_lease_lost_while_draining_commits_nothing() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t0, 1, &mut locks, &["a"]);
    a.handle_shutdown(t0);
    assert_eq!(drain(&mut a), vec![Action::Stop { mq: q(0) }]);
    // A slow listener: the drain ends after the lease (renewal failed meanwhile).
    a.handle_timeout(ms(t0, 7000));
    let renew = drain(&mut a);
    assert_eq!(renew.len(), 1);
    a.handle_lock_result(ms(t0, 7000), &[q(0)], &BTreeSet::new(), None, true);
    a.handle_drained(ms(t0, 11_000), &q(0), Some(99));
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(0)]
        }]
    );
}

#[test]
fn an_offset_reset_restarts_the_queue_from_the_new_offset() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t0, 1, &mut locks, &["a"]);
    a.handle_reset(t0, &q(0), 5);
    assert_eq!(drain(&mut a), vec![Action::Fence { mq: q(0) }]);
    a.handle_drained(t0, &q(0), Some(40));
    assert_eq!(
        drain(&mut a),
        vec![Action::Commit {
            mq: q(0),
            offset: 5,
            rewind: true
        }]
    );
    a.handle_committed(t0, &q(0), true);
    assert_eq!(drain(&mut a), vec![Action::QueryStartOffset { mq: q(0) }]);
    a.handle_start_offset(t0, &q(0), Some(StartOffset::Committed(5)));
    assert!(matches!(
        drain(&mut a).as_slice(),
        [Action::Start { offset: 5, .. }]
    ));
}

#[test]
fn a_delay_hand_over_starts_without_locks_after_the_delay() {
    let t0: u64 = 0;
    let strategy: Arc<dyn AllocateStrategy> = Arc::from(strategy_by_name("AVG").unwrap());
    let mut c = RebalancerConfig::new("G", "a");
    c.handover = Handover::Delay(Duration::from_millis(200));
    let mut a = Rebalancer::new(c, strategy);
    a.handle_subscribe(t0, "T");
    drain(&mut a);
    a.handle_view(t0, "T", qs(&[0]), vec!["a".into()]);
    assert!(drain(&mut a).is_empty());
    assert_eq!(a.poll_timeout(), Some(ms(t0, 200)));
    a.handle_timeout(ms(t0, 200));
    assert_eq!(drain(&mut a), vec![Action::QueryStartOffset { mq: q(0) }]);
    a.handle_start_offset(ms(t0, 201), &q(0), Some(StartOffset::Committed(7)));
    assert_eq!(
        drain(&mut a),
        vec![Action::Start {
            mq: q(0),
            offset: 7,
            lease_until: None
        }]
    );
    assert!(a.may_dispatch(&q(0), ms(t0, 1_000_000)));
}

#[test]
fn a_coordinator_target_replaces_the_views() {
    let t0: u64 = 0;
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    drain(&mut a);
    a.handle_target(t0, 3, qs(&[1]).into_iter().collect());
    assert_eq!(a.target_epoch(), Some(3));
    assert_eq!(
        drain(&mut a),
        vec![Action::Lock {
            broker: "b".into(),
            queues: vec![q(1)]
        }]
    );
    // The in-flight view is ignored; an older epoch too.
    a.handle_view(t0, "T", qs(&[0, 1]), vec!["a".into()]);
    a.handle_target(t0, 2, BTreeSet::new());
    assert_eq!(a.target().len(), 1);
    a.handle_notice(t0);
    assert!(drain(&mut a).is_empty());
}

#[test]
fn after_a_coordinator_move_the_new_lineage_starts_at_any_epoch() {
    let t0: u64 = 0;
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    a.handle_target(t0, 7, qs(&[0, 1]).into_iter().collect());
    drain(&mut a);
    a.handle_coordinator_moved(t0);
    assert_eq!(a.target().len(), 2, "the queues stay where they are");
    assert!(drain(&mut a).is_empty());
    // The new coordinator's joining member is at epoch 0 until it released what it must.
    a.handle_target(t0, 0, qs(&[0]).into_iter().collect());
    assert_eq!(a.target_epoch(), Some(0));
    assert_eq!(a.target().iter().cloned().collect::<Vec<_>>(), qs(&[0]));
}

#[test]
fn a_lock_granted_after_the_queue_left_the_target_is_given_back() {
    let t0: u64 = 0;
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    drain(&mut a);
    a.handle_view(t0, "T", qs(&[0]), vec!["a".into()]);
    assert_eq!(drain(&mut a).len(), 1);
    a.handle_notice(t0);
    drain(&mut a);
    a.handle_view(t0, "T", qs(&[0]), vec!["a".into(), "0".into()]);
    assert!(a.target().is_empty());
    let granted: BTreeSet<MessageQueue> = [q(0)].into();
    a.handle_lock_result(t0, &[q(0)], &granted, Some(lease(t0, Some(1))), true);
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(0)]
        }]
    );
    a.handle_unlocked(t0, &q(0), true);
    assert!(a.is_idle());
}

#[test]
fn a_failed_unlock_is_sent_again_and_an_unknown_lock_is_given_back() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t0, 1, &mut locks, &["a"]);
    a.handle_shutdown(t0);
    drain(&mut a);
    a.handle_drained(t0, &q(0), None);
    assert_eq!(drain(&mut a).len(), 1);
    a.handle_unlocked(t0, &q(0), false);
    assert!(drain(&mut a).is_empty());
    assert_eq!(a.poll_timeout(), Some(ms(t0, 500)));
    a.handle_timeout(ms(t0, 500));
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(0)]
        }]
    );
    a.handle_unlocked(ms(t0, 501), &q(0), true);
    assert!(a.is_idle());

    // A lock request without an answer may have been granted: if the queue then leaves the
    // target, it is unlocked before being forgotten.
    let mut b = rb("b");
    b.handle_subscribe(t0, "T");
    drain(&mut b);
    b.handle_view(t0, "T", qs(&[0]), vec!["b".into()]);
    assert_eq!(drain(&mut b).len(), 1);
    b.handle_lock_result(t0, &[q(0)], &BTreeSet::new(), None, true);
    b.handle_notice(t0);
    drain(&mut b);
    b.handle_view(t0, "T", qs(&[0]), vec!["b".into(), "a".into()]);
    assert_eq!(
        drain(&mut b),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(0)]
        }]
    );
}

/// Owns `ids` by a coordinator's target at `epoch`, answering every action at once.
fn own_by_target(r: &mut Rebalancer, t: u64, epoch: i64, ids: &[i32], locks: &mut Locks) {
    r.handle_target(t, epoch, qs(ids).into_iter().collect());
    let me = r.config().client_id.clone();
    loop {
        let acts = drain(r);
        if acts.is_empty() {
            break;
        }
        for a in acts {
            match a {
                Action::Lock { queues, .. } => {
                    let g = locks.lock(&me, &queues);
                    r.handle_lock_result(t, &queues, &g, Some(lease(t, Some(1))), true)
                }
                Action::QueryStartOffset { mq } => {
                    r.handle_start_offset(t, &mq, Some(StartOffset::Committed(0)))
                }
                Action::Start { .. } | Action::FetchView { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert!(r.is_settled());
}

#[test]
fn a_fence_drops_every_queue_without_committing_and_accepts_a_lower_epoch() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    own_by_target(&mut a, t0, 7, &[0, 1], &mut locks);
    a.handle_fenced(t0);
    assert_eq!(a.target_epoch(), None);
    assert!(a.target().is_empty());
    assert!(!a.may_dispatch(&q(0), t0));
    assert_eq!(
        drain(&mut a),
        vec![Action::Fence { mq: q(0) }, Action::Fence { mq: q(1) }]
    );
    // Fenced queues commit nothing: straight to the unlock.
    for i in 0..2 {
        a.handle_drained(t0, &q(i), Some(5));
        assert_eq!(
            drain(&mut a),
            vec![Action::Unlock {
                broker: "b".into(),
                queues: vec![q(i)]
            }]
        );
        locks.unlock("a", &q(i));
        a.handle_unlocked(t0, &q(i), true);
    }
    assert!(a.is_idle());
    assert_eq!(a.stats().fenced, 2);
    // The rejoin's epoch may be lower than the fenced one.
    own_by_target(&mut a, t0, 1, &[1], &mut locks);
    assert_eq!(a.target_epoch(), Some(1));
    assert_eq!(a.owned(), vec![q(1)]);
    // A graceful stop already under way commits nothing either once fenced.
    a.handle_target(t0, 2, BTreeSet::new());
    assert_eq!(drain(&mut a), vec![Action::Stop { mq: q(1) }]);
    a.handle_fenced(t0);
    assert!(drain(&mut a).is_empty());
    a.handle_drained(t0, &q(1), Some(9));
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(1)]
        }]
    );
}

#[test]
fn a_rejoin_releases_gracefully_and_accepts_any_epoch() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    own_by_target(&mut a, t0, 1005, &[3], &mut locks);
    a.handle_rejoin(t0);
    assert_eq!(drain(&mut a), vec![Action::Stop { mq: q(3) }]);
    a.handle_drained(t0, &q(3), Some(42));
    assert_eq!(
        drain(&mut a),
        vec![Action::Commit {
            mq: q(3),
            offset: 42,
            rewind: false
        }]
    );
    a.handle_committed(t0, &q(3), true);
    assert_eq!(drain(&mut a).len(), 1);
    locks.unlock("a", &q(3));
    a.handle_unlocked(t0, &q(3), true);
    assert!(a.is_idle());
    own_by_target(&mut a, t0, 2, &[4], &mut locks);
    assert_eq!(a.owned(), vec![q(4)]);
}

#[test]
fn back_to_classic_keeps_held_queues_until_the_views_decide() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    own_by_target(&mut a, t0, 4, &[0, 1], &mut locks);
    assert!(a.is_coordinated());
    // The view fetched before coordinated mode comes back: ignored.
    a.handle_view(t0, "T", qs(&[0, 1, 2, 3]), vec!["a".into()]);
    assert_eq!(a.target().len(), 2);
    a.handle_classic(t0);
    assert!(!a.is_coordinated());
    assert_eq!(a.target_epoch(), None);
    // Nothing is dropped while the view is fetched.
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    assert_eq!(a.owned(), qs(&[0, 1]));
    // AVG over two members: a keeps 0 and 1, loses nothing, gains nothing.
    a.handle_view(t0, "T", qs(&[0, 1, 2, 3]), vec!["a".into(), "b".into()]);
    assert!(drain(&mut a).is_empty());
    assert!(a.is_settled());
    // Alone: gains 2 and 3 by locks.
    a.handle_notice(t0);
    drain(&mut a);
    a.handle_view(t0, "T", qs(&[0, 1, 2, 3]), vec!["a".into()]);
    assert_eq!(
        drain(&mut a),
        vec![Action::Lock {
            broker: "b".into(),
            queues: qs(&[2, 3])
        }]
    );
}

#[test]
fn a_draining_queue_keeps_its_lock_and_lease_until_the_drain_ends() {
    let t0: u64 = 0;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t0, 2, &mut locks, &["a"]);
    // b joins: a loses q1 and stops it; a listener call on it runs for 30 s.
    a.handle_notice(t0);
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    a.handle_view(t0, "T", qs(&[0, 1]), vec!["a".into(), "b".into()]);
    assert_eq!(drain(&mut a), vec![Action::Stop { mq: q(1) }]);
    // Heartbeats of the same session extend the lease of the draining queue too (the driver
    // keeps waiting while the lock is ours), and the lock is renewed, never released.
    for s in 1..=10u64 {
        let t = ms(t0, s * 3000);
        a.handle_lease(t, "b", lease(t, Some(1)));
        let acts = drain(&mut a);
        assert!(
            acts.contains(&Action::Lease {
                mq: q(1),
                until: t + 10000
            }),
            "{acts:?}"
        );
        assert!(
            !acts.iter().any(|x| matches!(x, Action::Unlock { .. })),
            "{acts:?}"
        );
        assert_eq!(a.phase(&q(1)), Some(QueuePhase::Draining));
    }
    // The call returns: commit, then unlock.
    let t = ms(t0, 30_500);
    a.handle_drained(t, &q(1), Some(42));
    assert_eq!(
        drain(&mut a),
        vec![Action::Commit {
            mq: q(1),
            offset: 42,
            rewind: false
        }]
    );
    a.handle_committed(t, &q(1), true);
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(1)]
        }]
    );
}

#[test]
fn a_lock_freed_notice_that_overtakes_the_refusal_is_not_lost() {
    let t0: u64 = 0;
    let mut a = rb("a");
    a.handle_subscribe(t0, "T");
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    a.handle_view(t0, "T", qs(&[0]), vec!["a".into()]);
    let lock = Action::Lock {
        broker: "b".into(),
        queues: vec![q(0)],
    };
    assert_eq!(drain(&mut a), vec![lock.clone()]);
    // The holder unlocks between the broker's refusal and its arrival here: the notice is
    // handled first, then the refusal. The lock is asked again at once, not after the 1 s
    // safety net.
    let t = ms(t0, 5);
    a.handle_lock_freed(t, &[q(0)]);
    assert!(drain(&mut a).is_empty());
    a.handle_lock_result(t, &[q(0)], &BTreeSet::new(), Some(lease(t, Some(1))), true);
    assert_eq!(drain(&mut a), vec![lock.clone()]);
    // A later refusal without such a notice waits for the next notice (or the safety net).
    a.handle_lock_result(t, &[q(0)], &BTreeSet::new(), Some(lease(t, Some(1))), true);
    assert!(drain(&mut a).is_empty());
    assert_eq!(a.poll_timeout(), Some(t + 1000));
}

fn answer(t: u64, granted: &BTreeSet<MessageQueue>, committed: &[(i32, i64)]) -> LockAnswer {
    LockAnswer {
        granted: granted.clone(),
        lease: Some(lease(t, Some(1))),
        notice_expected: true,
        committed: committed.iter().map(|(i, o)| (q(*i), *o)).collect(),
        commit_on_unlock: true,
    }
}

/// A Shoal broker with `offsetOnGrant` reads the committed offsets after the grant: a queue
/// listed starts there at once; one without a committed offset is queried as before.
#[test]
fn a_grant_with_the_committed_offset_starts_without_a_query() {
    let t = 0u64;
    let mut a = rb("a");
    a.handle_subscribe(t, "T");
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    a.handle_view(t, "T", qs(&[0, 1]), vec!["a".into()]);
    assert_eq!(
        drain(&mut a),
        vec![Action::Lock {
            broker: "b".into(),
            queues: qs(&[0, 1])
        }]
    );
    let granted: BTreeSet<MessageQueue> = qs(&[0, 1]).into_iter().collect();
    a.handle_lock_answer(t, &qs(&[0, 1]), answer(t, &granted, &[(0, 42)]));
    assert_eq!(
        drain(&mut a),
        vec![
            Action::QueryStartOffset { mq: q(1) },
            Action::Start {
                mq: q(0),
                offset: 42,
                lease_until: Some(t + 10000)
            }
        ]
    );
    assert_eq!(a.stats().offsets_on_grant, 1);
    a.handle_start_offset(t, &q(1), Some(StartOffset::Committed(7)));
    assert!(a.is_settled());
}

/// With `commitOnUnlock` the end of a release is one request carrying the final offset (sent
/// again as it was if it failed); without a valid lease nothing is committed, only unlocked.
#[test]
fn a_release_to_a_commit_on_unlock_broker_is_one_request() {
    let t = 0u64;
    let mut a = rb("a");
    a.handle_subscribe(t, "T");
    drain(&mut a);
    a.handle_view(t, "T", qs(&[0, 1]), vec!["a".into()]);
    drain(&mut a);
    let granted: BTreeSet<MessageQueue> = qs(&[0, 1]).into_iter().collect();
    a.handle_lock_answer(t, &qs(&[0, 1]), answer(t, &granted, &[(0, 5), (1, 9)]));
    assert_eq!(drain(&mut a).len(), 2);
    assert!(a.is_settled());
    // b joins: a gives up queue 1.
    a.handle_view(ms(t, 10), "T", qs(&[0, 1]), vec!["a".into(), "b".into()]);
    assert_eq!(drain(&mut a), vec![Action::Stop { mq: q(1) }]);
    a.handle_drained(ms(t, 20), &q(1), Some(12));
    let one = Action::CommitAndUnlock {
        broker: "b".into(),
        mq: q(1),
        offset: 12,
    };
    assert_eq!(drain(&mut a), vec![one.clone()]);
    assert_eq!(a.phase(&q(1)), Some(QueuePhase::Unlocking));
    // No answer: the same request again after the retry wait.
    a.handle_unlocked(ms(t, 30), &q(1), false);
    assert!(drain(&mut a).is_empty());
    a.handle_timeout(ms(t, 530));
    assert_eq!(drain(&mut a), vec![one]);
    a.handle_unlocked(ms(t, 540), &q(1), true);
    assert_eq!(a.phase(&q(1)), None);
    assert_eq!(a.stats().released, 1);
    // A drain that ends after the lease ran out commits nothing: a plain unlock.
    // (Members sort as bytes: "A" and "B" come before "a", so a gets nothing.)
    a.handle_view(
        ms(t, 600),
        "T",
        qs(&[0, 1]),
        vec!["A".into(), "B".into(), "a".into()],
    );
    assert_eq!(drain(&mut a), vec![Action::Stop { mq: q(0) }]);
    a.handle_drained(ms(t, 11_000), &q(0), Some(8));
    assert_eq!(
        drain(&mut a),
        vec![Action::Unlock {
            broker: "b".into(),
            queues: vec![q(0)]
        }]
    );
}

/// A notice that carries the member list is the view's member half: applied at once, no
/// fetch; an older version (notices overtake each other) is ignored; a fetch in flight when a
/// list came keeps its queues but not its (older) member list.
#[test]
fn a_member_list_notice_is_applied_without_a_fetch() {
    let t = 0u64;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t, 4, &mut locks, &["a"]);
    a.handle_members(ms(t, 10), "b", 7, vec!["a".into(), "b".into()]);
    assert_eq!(
        drain(&mut a),
        vec![Action::Stop { mq: q(2) }, Action::Stop { mq: q(3) }]
    );
    assert_eq!(a.stats().member_lists, 1);
    // An older list from the same broker: ignored.
    a.handle_members(ms(t, 11), "b", 6, vec!["a".into()]);
    assert!(drain(&mut a).is_empty());
    assert_eq!(a.target().len(), 2);
    // A list of another broker (no queue of the topic there): nothing changes.
    a.handle_members(ms(t, 12), "other", 1, vec!["a".into()]);
    assert!(drain(&mut a).is_empty());
    // A plain notice starts a fetch; a list arrives while it is in flight and is applied at
    // once; the fetch (which may predate it) is made again, and its answer applied.
    a.handle_notice(ms(t, 20));
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    let four: Vec<String> = ["a", "b", "c", "d"].iter().map(|m| m.to_string()).collect();
    a.handle_members(ms(t, 21), "b", 8, four.clone());
    assert_eq!(a.target().len(), 1);
    drain(&mut a);
    a.handle_view(
        ms(t, 22),
        "T",
        qs(&[0, 1, 2, 3]),
        vec!["a".into(), "b".into()],
    );
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    assert_eq!(a.target().len(), 1, "the older fetch was not applied");
    a.handle_view(ms(t, 23), "T", qs(&[0, 1, 2, 3]), four);
    assert_eq!(a.target().iter().cloned().collect::<Vec<_>>(), qs(&[0]));
    // A list that comes while the first fetch of a topic is in flight (its queues are not
    // known yet) makes that fetch be asked again too.
    let mut n = rb("n");
    n.handle_subscribe(ms(t, 30), "T");
    assert_eq!(drain(&mut n), vec![Action::FetchView { topic: "T".into() }]);
    n.handle_members(ms(t, 31), "b", 9, vec!["a".into(), "n".into(), "z".into()]);
    n.handle_view(
        ms(t, 32),
        "T",
        qs(&[0, 1, 2, 3]),
        vec!["a".into(), "n".into()],
    );
    assert_eq!(drain(&mut n), vec![Action::FetchView { topic: "T".into() }]);
}

/// The lock of a gained queue comes back after a newer membership notice: the queue is held
/// (locked, not started) until the fresh view says whether it is still this member's.
#[test]
fn a_queue_locked_after_a_newer_notice_waits_for_the_fresh_view() {
    let t = 0u64;
    let mut a = rb("a");
    a.handle_subscribe(t, "T");
    drain(&mut a);
    a.handle_view(t, "T", qs(&[0, 1, 2, 3]), vec!["a".into(), "b".into()]);
    assert_eq!(
        drain(&mut a),
        vec![Action::Lock {
            broker: "b".into(),
            queues: qs(&[0, 1])
        }]
    );
    // c joins while the lock request is in flight.
    a.handle_notice(ms(t, 5));
    assert_eq!(drain(&mut a), vec![Action::FetchView { topic: "T".into() }]);
    let granted: BTreeSet<MessageQueue> = qs(&[0, 1]).into_iter().collect();
    a.handle_lock_answer(
        ms(t, 6),
        &qs(&[0, 1]),
        answer(t, &granted, &[(0, 3), (1, 4)]),
    );
    assert!(drain(&mut a).is_empty(), "nothing starts on a stale view");
    assert_eq!(a.phase(&q(0)), Some(QueuePhase::Starting));
    assert_eq!(a.stats().held_for_view, 2);
    // The fresh view (a, b, c, d): a keeps queue 0 and starts it; queue 1 is unlocked
    // without ever having started.
    a.handle_view(
        ms(t, 9),
        "T",
        qs(&[0, 1, 2, 3]),
        vec!["a".into(), "b".into(), "c".into(), "d".into()],
    );
    assert_eq!(
        drain(&mut a),
        vec![
            Action::Start {
                mq: q(0),
                offset: 3,
                lease_until: Some(t + 10000)
            },
            Action::Unlock {
                broker: "b".into(),
                queues: vec![q(1)]
            }
        ]
    );
    assert_eq!(a.stats().started, 1);
}

/// A renewal sent before the unlock may be processed after it and take the lock again (the
/// simulator found the leak: the next owner waited forever): a "granted" renewal answer that
/// comes while the unlock is in flight is followed by one more unlock.
#[test]
fn a_renewal_granted_while_unlocking_is_followed_by_another_unlock() {
    let t = 0u64;
    let mut locks = Locks::default();
    let mut a = rb("a");
    own_all(&mut a, t, 2, &mut locks, &["a"]);
    a.handle_timeout(ms(t, 7_000));
    assert_eq!(
        drain(&mut a),
        vec![Action::Lock {
            broker: "b".into(),
            queues: qs(&[0, 1])
        }]
    );
    // ("A" sorts before "a": A gets queue 0.)
    a.handle_view(ms(t, 7_001), "T", qs(&[0, 1]), vec!["A".into(), "a".into()]);
    assert_eq!(drain(&mut a), vec![Action::Stop { mq: q(0) }]);
    a.handle_drained(ms(t, 7_002), &q(0), Some(3));
    drain(&mut a);
    a.handle_committed(ms(t, 7_003), &q(0), true);
    let unlock0 = Action::Unlock {
        broker: "b".into(),
        queues: vec![q(0)],
    };
    assert_eq!(drain(&mut a), vec![unlock0.clone()]);
    let both: BTreeSet<MessageQueue> = qs(&[0, 1]).into_iter().collect();
    a.handle_lock_result(
        ms(t, 7_004),
        &qs(&[0, 1]),
        &both,
        Some(lease(ms(t, 7_000), Some(1))),
        true,
    );
    drain(&mut a);
    a.handle_unlocked(ms(t, 7_005), &q(0), true);
    assert_eq!(drain(&mut a), vec![unlock0]);
    assert_eq!(a.phase(&q(0)), Some(QueuePhase::Unlocking));
    a.handle_unlocked(ms(t, 7_006), &q(0), true);
    assert_eq!(a.phase(&q(0)), None);
    assert!(a.is_settled());
}
