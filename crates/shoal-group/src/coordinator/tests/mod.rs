//! Coordinator tests on virtual time, with simulated clients that act on the answers.

use super::*;
use crate::allocate::{minimum_moves, moved_queues, Assignment};
use proptest::prelude::*;

/// Every pending effect.
fn drain(c: &mut Coordinator) -> Vec<Effect> {
    std::iter::from_fn(|| c.poll_effect()).collect()
}

const T: &str = "T";

fn queues(n: i32) -> Vec<MessageQueue> {
    (0..n)
        .map(|i| MessageQueue::new(T, "broker-a", i))
        .collect()
}

/// A simulated member process: what it physically consumes, and how it answers.
#[derive(Debug, Clone)]
struct Client {
    member_id: String,
    instance_id: Option<String>,
    conn: u64,
    epoch: i32,
    /// Queues it consumes now.
    owned: BTreeSet<MessageQueue>,
    /// It releases revoked queues only when told to (`release_now`).
    slow: bool,
    /// It holds revoked queues here until it releases them.
    to_release: BTreeSet<MessageQueue>,
    assignor: String,
    heartbeats: usize,
    /// The session timeout its heartbeats name (the coordinator's default when `None`).
    session_timeout_ms: Option<u64>,
}

impl Client {
    fn new(id: &str, conn: u64, assignor: &str) -> Self {
        Self {
            member_id: id.to_string(),
            instance_id: None,
            conn,
            epoch: 0,
            owned: BTreeSet::new(),
            slow: false,
            to_release: BTreeSet::new(),
            assignor: assignor.to_string(),
            heartbeats: 0,
            session_timeout_ms: None,
        }
    }

    fn with_instance(mut self, inst: &str) -> Self {
        self.instance_id = Some(inst.to_string());
        self
    }

    fn request(&self, group: &str) -> HeartbeatRequest {
        HeartbeatRequest {
            group: group.to_string(),
            member_id: self.member_id.clone(),
            member_epoch: self.epoch,
            instance_id: self.instance_id.clone(),
            client_id: format!("client-{}", self.member_id),
            conn_id: self.conn,
            subscriptions: [T.to_string()].into(),
            owned: self.owned.clone(),
            adoptable: BTreeSet::new(),
            rebalance_timeout_ms: Some(10_000),
            session_timeout_ms: self.session_timeout_ms,
            // "" names none (the coordinator's default).
            assignor: (!self.assignor.is_empty()).then(|| self.assignor.clone()),
            last_epoch: None,
        }
    }

    /// One heartbeat; acts on the answer. Returns the error, if any.
    fn heartbeat(&mut self, c: &mut Coordinator, now: u64) -> Option<GroupError> {
        let answer = c.handle_heartbeat(now, self.request("G"));
        self.apply(answer)
    }

    /// Acts on a heartbeat answer (possibly to a request built earlier).
    fn apply(&mut self, answer: Result<HeartbeatResponse>) -> Option<GroupError> {
        self.heartbeats += 1;
        match answer {
            Ok(r) => {
                self.epoch = r.member_epoch;
                let assigned: BTreeSet<MessageQueue> = r.assignment.into_iter().collect();
                let lose: Vec<MessageQueue> = self.owned.difference(&assigned).cloned().collect();
                for q in lose {
                    if self.slow {
                        self.to_release.insert(q);
                    } else {
                        self.owned.remove(&q);
                    }
                }
                self.owned.extend(assigned);
                None
            }
            Err(e) => {
                // Fenced or unknown: drop everything, rejoin.
                self.owned.clear();
                self.to_release.clear();
                self.epoch = JOIN_EPOCH;
                Some(e)
            }
        }
    }

    fn release_now(&mut self) {
        for q in std::mem::take(&mut self.to_release) {
            self.owned.remove(&q);
        }
    }

    /// It releases its revoked queues and unlocks them (the broker tells the coordinator),
    /// while a heartbeat it built before the unlock is still on its way; that heartbeat then
    /// arrives. Returns the heartbeat's answer (already acted on).
    fn unlock_racing_heartbeat(&mut self, c: &mut Coordinator, now: u64) -> Option<GroupError> {
        let in_flight = self.request("G");
        let gone: Vec<MessageQueue> = self.to_release.iter().cloned().collect();
        self.release_now();
        let client = format!("client-{}", self.member_id);
        c.handle_released_by_client(now, "G", &client, &gone);
        let answer = c.handle_heartbeat(now, in_flight);
        self.apply(answer)
    }
}

/// Safety: no queue is consumed by two clients whose pulls the broker would accept.
fn check_exclusive(c: &Coordinator, clients: &[Client]) {
    c.check_invariants().unwrap();
    let mut seen: BTreeMap<&MessageQueue, &str> = BTreeMap::new();
    for cl in clients {
        for q in &cl.owned {
            if c.validate("G", &cl.member_id, cl.epoch, q).is_err() {
                continue;
            }
            if let Some(other) = seen.insert(q, &cl.member_id) {
                panic!("{q} consumed by {other} and {}", cl.member_id);
            }
        }
    }
}

/// Heartbeats everyone (after the notices, as the broker would deliver them) until nothing
/// changes; returns the rounds taken.
fn converge(c: &mut Coordinator, clients: &mut [Client], now: u64) -> usize {
    for round in 0..20 {
        let before: Vec<(i32, BTreeSet<MessageQueue>)> =
            clients.iter().map(|x| (x.epoch, x.owned.clone())).collect();
        for cl in clients.iter_mut() {
            cl.heartbeat(c, now);
            check_exclusive(c, std::slice::from_ref(cl));
        }
        check_exclusive(c, clients);
        let after: Vec<(i32, BTreeSet<MessageQueue>)> =
            clients.iter().map(|x| (x.epoch, x.owned.clone())).collect();
        if before == after {
            return round;
        }
    }
    panic!("no convergence in 20 rounds");
}

fn coordinator() -> Coordinator {
    let mut c = Coordinator::new(CoordinatorConfig::default());
    c.handle_topic_queues(0, T, queues(16));
    c
}

fn assignment_of(clients: &[Client]) -> Assignment {
    let mut a = Assignment::new();
    for cl in clients {
        a.insert(cl.member_id.clone(), cl.owned.iter().cloned().collect());
    }
    a
}

fn complete(c: &Coordinator, clients: &[Client]) -> bool {
    let d = c.describe("G", 0).unwrap();
    d.reconciled
        && assignment_of(clients)
            .coverage(&queues(16))
            .is_exclusive_and_complete()
}

#[test]
fn first_member_gets_everything() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY");
    assert!(a.heartbeat(&mut c, 0).is_none());
    assert_eq!(a.owned.len(), 16);
    assert_eq!(a.epoch, 1);
    let h = c.history("G");
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].reconciled_at_ms, Some(0));
    assert!(matches!(h[0].cause, RebalanceCause::Join { .. }));
}

#[test]
fn revoke_then_assign_on_join() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY");
    a.slow = true;
    a.heartbeat(&mut c, 0);
    let _ = drain(&mut c);
    let mut b = Client::new("b", 2, "STICKY");
    b.heartbeat(&mut c, 10);
    // b gets nothing yet: a must release first. a is told to heartbeat.
    assert!(b.owned.is_empty());
    let fx = drain(&mut c);
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Notify { member_id, .. } if member_id == "a")));
    a.heartbeat(&mut c, 11);
    assert_eq!(a.to_release.len(), 8);
    // Still held: still not b's.
    a.heartbeat(&mut c, 12);
    b.heartbeat(&mut c, 12);
    assert!(b.owned.is_empty());
    check_exclusive(&c, &[a.clone(), b.clone()]);
    assert_eq!(
        c.describe("G", 12).unwrap().members[0].state,
        MemberState::UnrevokedQueues
    );
    a.release_now();
    a.heartbeat(&mut c, 13);
    // b is told at once that its queues are free.
    let fx = drain(&mut c);
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Notify { member_id, .. } if member_id == "b")));
    b.heartbeat(&mut c, 14);
    assert_eq!((a.owned.len(), b.owned.len()), (8, 8));
    let mut all = vec![a, b];
    assert!(complete(&c, &all));
    converge(&mut c, &mut all, 15);
    let h = c.history("G");
    assert_eq!(h.last().unwrap().reconcile_ms(), Some(4));
    assert_eq!(h.last().unwrap().moved(), 8);
}

/// The answer's `reconciling` flag: set while the member has queues to release or waits for
/// queues another member still holds, cleared by the answer that leaves it nothing to do (a
/// Kafka member is asked back soon while it is set, and given the steady interval after).
#[test]
fn reconciling_is_set_while_a_member_has_work_left() {
    let mut c = coordinator();
    let hb =
        |c: &mut Coordinator, cl: &Client, now| c.handle_heartbeat(now, cl.request("G")).unwrap();
    let mut a = Client::new("a", 1, "STICKY");
    a.slow = true;
    let r = hb(&mut c, &a, 0);
    assert!(!r.reconciling, "alone, a owns its whole target at once");
    a.apply(Ok(r));
    let mut b = Client::new("b", 2, "STICKY");
    let r = hb(&mut c, &b, 10);
    assert!(r.reconciling, "b waits for queues a still holds");
    assert!(r.assignment.is_empty());
    b.apply(Ok(r));
    let r = hb(&mut c, &a, 11);
    assert!(r.reconciling, "a must release half of its queues");
    a.apply(Ok(r));
    let r = hb(&mut c, &a, 12);
    assert!(r.reconciling, "a still holds what it must release");
    a.apply(Ok(r));
    a.release_now();
    let r = hb(&mut c, &a, 13);
    assert!(!r.reconciling, "a released: nothing left for it");
    a.apply(Ok(r));
    let r = hb(&mut c, &b, 14);
    assert!(!r.reconciling, "this answer hands b its queues");
    assert_eq!(r.assignment.len(), 8);
    b.apply(Ok(r));
    // Steady: both stay reconciled.
    assert!(!hb(&mut c, &a, 15).reconciling);
    assert!(!hb(&mut c, &b, 15).reconciling);
}

/// Every member whose assignment changes is told at once ([`Effect::Notify`]), on a join, a
/// leave and a session expiry: a Kafka member's held heartbeat is answered on that notice.
#[test]
fn every_member_whose_assignment_changes_is_notified() {
    let notified = |c: &mut Coordinator| -> BTreeSet<String> {
        drain(c)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Notify { member_id, .. } => Some(member_id),
                _ => None,
            })
            .collect()
    };
    let mut c = coordinator();
    let mut all: Vec<Client> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, id)| Client::new(id, i as u64 + 1, "STICKY"))
        .collect();
    converge(&mut c, &mut all, 0);
    let _ = drain(&mut c);
    // A join: every old member gives up a queue or more, and is told.
    let mut d = Client::new("d", 4, "STICKY");
    d.heartbeat(&mut c, 10);
    assert_eq!(notified(&mut c), ["a", "b", "c"].map(String::from).into());
    all.push(d);
    converge(&mut c, &mut all, 11);
    let _ = drain(&mut c);
    // A leave: the members that receive its queues are told.
    c.handle_leave(20, "G", "d", true).unwrap();
    all.pop();
    let told = notified(&mut c);
    assert!(!told.is_empty() && !told.contains("d"), "{told:?}");
    for cl in &all {
        let grows = c
            .describe("G", 20)
            .unwrap()
            .members
            .iter()
            .any(|m| m.member_id == cl.member_id && m.target.len() > cl.owned.len());
        assert_eq!(grows, told.contains(&cl.member_id), "{}", cl.member_id);
    }
    converge(&mut c, &mut all, 21);
    let _ = drain(&mut c);
    // A session expiry: the same.
    let expiry = 21 + CoordinatorConfig::default().session_timeout_ms;
    for cl in all.iter_mut().take(2) {
        cl.heartbeat(&mut c, expiry - 1);
    }
    let _ = drain(&mut c);
    c.handle_timeout(expiry + 1);
    let told = notified(&mut c);
    assert_eq!(told, ["a", "b"].map(String::from).into());
}

#[test]
fn unlock_evidence_frees_queues_before_the_heartbeat() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY");
    a.heartbeat(&mut c, 0);
    let mut b = Client::new("b", 2, "STICKY");
    b.heartbeat(&mut c, 1);
    let revoked: Vec<MessageQueue> = c.describe("G", 1).unwrap().members[0].revoking.clone();
    assert_eq!(revoked.len(), 8);
    let _ = drain(&mut c);
    // The broker saw a unlock them.
    c.handle_released_by_client(2, "G", "client-a", &revoked);
    let fx = drain(&mut c);
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Notify { member_id, .. } if member_id == "b")));
    b.heartbeat(&mut c, 3);
    assert_eq!(b.owned.len(), 8);
}

/// The fence race of the orderly test: a member's heartbeat still lists a revoked queue
/// because it was built before the member unlocked it; the broker processes the unlock first
/// (release evidence: the queue goes to the joining member at once), then the heartbeat. The
/// report is stale, not a claim: the member is not fenced (a fence would drop everything it
/// has not committed), keeps its other queues, and ownership stays exclusive.
#[test]
fn a_heartbeat_built_before_an_unlock_is_not_fenced() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY");
    a.slow = true;
    a.heartbeat(&mut c, 0);
    let mut b = Client::new("b", 2, "STICKY");
    b.heartbeat(&mut c, 1);
    a.heartbeat(&mut c, 2);
    assert_eq!(a.to_release.len(), 8);
    let a_epoch = a.epoch;
    let kept: BTreeSet<MessageQueue> = a.owned.difference(&a.to_release).cloned().collect();
    let revoked: BTreeSet<MessageQueue> = a.to_release.clone();
    // Built now (names the 8 revoked queues), delivered after the unlock.
    let in_flight = a.request("G");
    a.release_now();
    c.handle_released_by_client(
        3,
        "G",
        "client-a",
        &revoked.iter().cloned().collect::<Vec<_>>(),
    );
    // The unlock was the evidence: b is told and takes the queues before a's heartbeat lands.
    b.heartbeat(&mut c, 3);
    assert_eq!(b.owned, revoked);
    check_exclusive(&c, &[a.clone(), b.clone()]);
    let answer = c.handle_heartbeat(4, in_flight.clone());
    let r = answer.as_ref().expect("a stale report is not fenced");
    assert!(r.member_epoch > a_epoch, "a moved on to the target epoch");
    let assigned: BTreeSet<MessageQueue> = r.assignment.iter().cloned().collect();
    assert_eq!(
        assigned, kept,
        "a keeps its own queues, b keeps the released ones"
    );
    a.apply(answer);
    assert_eq!(a.owned, kept);
    for q in &revoked {
        assert_eq!(c.owner_of("G", q), Some("b"));
    }
    check_exclusive(&c, &[a.clone(), b.clone()]);
    // The same report repeated (reordered duplicates of the old request) is still stale.
    assert!(c.handle_heartbeat(5, in_flight).is_ok());
    let mut all = vec![a.clone(), b.clone()];
    converge(&mut c, &mut all, 6);
    assert!(complete(&c, &all));
    // Once a's heartbeats no longer name them, naming b's queue again is a real conflict,
    // and so is a report at a's new epoch of a queue another member owns.
    let mut claim = all[0].request("G");
    claim.owned.insert(revoked.iter().next().unwrap().clone());
    let err = c.handle_heartbeat(7, claim).unwrap_err();
    assert!(
        matches!(&err, GroupError::FencedMemberEpoch { detail, .. } if detail.contains("which b owns")),
        "{err:?}"
    );
}

/// A report at the member's new epoch (newer than its unlock) of a queue it unlocked is a
/// claim, fenced when another member owns the queue; a late report after the new owner left
/// (the queues came back to it) is fine.
#[test]
fn a_report_newer_than_the_unlock_is_fenced_only_on_a_conflict() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY");
    a.slow = true;
    a.heartbeat(&mut c, 0);
    let mut b = Client::new("b", 2, "STICKY");
    b.slow = true;
    b.heartbeat(&mut c, 1);
    a.heartbeat(&mut c, 2);
    let revoked: Vec<MessageQueue> = a.to_release.iter().cloned().collect();
    let q = revoked[0].clone();
    a.release_now();
    c.handle_released_by_client(3, "G", "client-a", &revoked);
    // A heartbeat at a's new epoch that names q while b owns it: a real conflict.
    let epoch_after = c
        .describe("G", 3)
        .unwrap()
        .members
        .iter()
        .find(|m| m.member_id == "a")
        .unwrap()
        .member_epoch;
    assert_eq!(c.owner_of("G", &q), Some("b"));
    let mut r = a.request("G");
    r.member_epoch = epoch_after;
    r.owned.insert(q.clone());
    assert!(matches!(
        c.handle_heartbeat(4, r),
        Err(GroupError::FencedMemberEpoch { .. })
    ));

    // Again, but the new owner leaves before the late report lands.
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY");
    a.slow = true;
    a.heartbeat(&mut c, 0);
    let mut b = Client::new("b", 2, "STICKY");
    b.heartbeat(&mut c, 1);
    a.heartbeat(&mut c, 2);
    let revoked: Vec<MessageQueue> = a.to_release.iter().cloned().collect();
    let in_flight = a.request("G");
    a.release_now();
    c.handle_released_by_client(3, "G", "client-a", &revoked);
    c.handle_leave(4, "G", "b", false).unwrap();
    // a is given everything back; its late report names nothing it may not hold.
    assert!(c.handle_heartbeat(5, in_flight).is_ok());
    let mut all = vec![a];
    converge(&mut c, &mut all, 6);
    assert!(complete(&c, &all));
}

/// 16 queues, 4 -> 8 -> 4 members: sticky assignors move exactly the minimum, ownership is
/// exclusive at every step and complete after each change.
#[test]
fn sticky_moves_the_minimum_4_8_4() {
    // "": members that name no assignor get the coordinator's default.
    for assignor in ["", "STICKY", "COOPERATIVE_STICKY"] {
        let mut c = coordinator();
        let mut clients: Vec<Client> = (0..4)
            .map(|i| Client::new(&format!("m{i}"), i as u64, assignor))
            .collect();
        converge(&mut c, &mut clients, 0);
        assert!(complete(&c, &clients));
        let mut now = 100;
        for i in 4..8 {
            let before = assignment_of(&clients);
            clients.push(Client::new(&format!("m{i}"), i as u64, assignor));
            converge(&mut c, &mut clients, now);
            assert!(complete(&c, &clients), "{assignor}");
            let after = assignment_of(&clients);
            let members: Vec<String> = clients.iter().map(|x| x.member_id.clone()).collect();
            assert_eq!(
                moved_queues(&before, &after),
                minimum_moves(&before, &queues(16), &members),
                "{assignor} join m{i}"
            );
            now += 100;
        }
        for _ in 0..4 {
            let before = assignment_of(&clients);
            let gone = clients.remove(1);
            // A graceful leave: it released everything.
            c.handle_leave(now, "G", &gone.member_id, false).unwrap();
            converge(&mut c, &mut clients, now);
            assert!(complete(&c, &clients));
            let after = assignment_of(&clients);
            let members: Vec<String> = clients.iter().map(|x| x.member_id.clone()).collect();
            assert_eq!(
                moved_queues(&before, &after),
                minimum_moves(&before, &queues(16), &members)
            );
            now += 100;
        }
        assert_eq!(assignment_of(&clients).load_range(), (4, 4));
        let d = c.describe("G", now).unwrap();
        let source = if assignor.is_empty() {
            AssignorSource::Default
        } else {
            AssignorSource::Members
        };
        assert_eq!(d.assignor_source, source, "{assignor:?}");
    }
}

/// A group whose members name no assignor uses the coordinator's default (balanced, fewest
/// moves); a member's explicit choice is kept while members ask for it, and the group goes
/// back to the default when none does any more.
#[test]
fn default_assignor_unless_members_choose_one() {
    let mut c = coordinator();
    let mut clients = vec![Client::new("a", 1, ""), Client::new("b", 2, "")];
    converge(&mut c, &mut clients, 0);
    let d = c.describe("G", 0).unwrap();
    assert_eq!(
        (d.assignor.as_str(), d.assignor_source),
        ("STICKY", AssignorSource::Default)
    );
    // An explicit choice: the group follows it (one member asks, none asks otherwise).
    clients.push(Client::new("c", 3, "AVG"));
    converge(&mut c, &mut clients, 10);
    let d = c.describe("G", 10).unwrap();
    assert_eq!(
        (d.assignor.as_str(), d.assignor_source),
        ("AVG", AssignorSource::Members)
    );
    // The member that asked for it leaves: back to the default.
    let gone = clients.pop().unwrap();
    c.handle_leave(20, "G", &gone.member_id, false).unwrap();
    converge(&mut c, &mut clients, 20);
    let d = c.describe("G", 20).unwrap();
    assert_eq!(
        (d.assignor.as_str(), d.assignor_source),
        ("STICKY", AssignorSource::Default)
    );
    assert!(complete(&c, &clients));
}

#[test]
fn stale_epochs_are_fenced() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY");
    a.heartbeat(&mut c, 0);
    let q0 = queues(16)[0].clone();
    // Ahead of the coordinator.
    let mut r = a.request("G");
    r.member_epoch = 5;
    assert!(matches!(
        c.handle_heartbeat(1, r),
        Err(GroupError::FencedMemberEpoch { .. })
    ));
    // Claims a queue it was not given.
    let mut b = Client::new("b", 2, "STICKY");
    b.heartbeat(&mut c, 2);
    a.heartbeat(&mut c, 3);
    a.heartbeat(&mut c, 3);
    b.heartbeat(&mut c, 4);
    let a_q = a.owned.iter().next().unwrap().clone();
    let b_q = b.owned.iter().next().unwrap().clone();
    let mut r = a.request("G");
    r.owned.insert(b_q.clone());
    assert!(matches!(
        c.handle_heartbeat(5, r),
        Err(GroupError::FencedMemberEpoch { .. })
    ));
    // Pulls: own queue at its epoch ok; someone else's not assigned; ahead fenced.
    assert!(c.validate("G", "a", a.epoch, &a_q).is_ok());
    assert!(matches!(
        c.validate("G", "a", a.epoch, &b_q),
        Err(GroupError::QueueNotAssigned { .. })
    ));
    assert!(matches!(
        c.validate("G", "a", a.epoch + 1, &a_q),
        Err(GroupError::FencedMemberEpoch { .. })
    ));
    // A queue given at epoch 2 is fenced for a pull stamped with epoch 1 (stale, from an
    // earlier ownership).
    assert!(b.epoch >= 2);
    assert!(matches!(
        c.validate("G", "b", 1, &b_q),
        Err(GroupError::FencedMemberEpoch { .. })
    ));
    // After leaving: unknown.
    c.handle_leave(6, "G", "b", false).unwrap();
    assert!(matches!(
        c.validate("G", "b", b.epoch, &b_q),
        Err(GroupError::UnknownMember { .. })
    ));
    let mut r = b.request("G");
    r.member_epoch = b.epoch;
    assert!(matches!(
        c.handle_heartbeat(7, r),
        Err(GroupError::UnknownMember { .. })
    ));
    let _ = q0;
    // A fenced client drops its queues and rejoins.
    let mut all = vec![a, b];
    converge(&mut c, &mut all, 8);
    assert!(complete(&c, &all));
}

#[test]
fn a_lost_answer_is_not_fenced() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY");
    a.heartbeat(&mut c, 0);
    let mut b = Client::new("b", 2, "STICKY");
    b.heartbeat(&mut c, 1);
    // a releases, but the answer with the bumped epoch is lost.
    let mut lost = a.clone();
    lost.heartbeat(&mut c, 2);
    lost.release_now();
    let mut r = a.request("G");
    r.owned = lost.owned.clone();
    assert!(c.handle_heartbeat(3, r).is_ok());
}

#[test]
fn static_member_restart_moves_nothing() {
    let mut c = coordinator();
    let mut clients: Vec<Client> = (0..4)
        .map(|i| Client::new(&format!("m{i}"), i as u64, "STICKY").with_instance(&format!("i{i}")))
        .collect();
    converge(&mut c, &mut clients, 0);
    let before = assignment_of(&clients);
    let epoch = c.describe("G", 0).unwrap().group_epoch;
    let history = c.history("G").len();
    // m2 leaves gracefully (a restart): its queues stay reserved.
    let old = clients.remove(2);
    c.handle_leave(1000, "G", &old.member_id, false).unwrap();
    converge(&mut c, &mut clients, 1000);
    for cl in &clients {
        assert!(
            cl.owned.is_disjoint(&old.owned),
            "reserved queues went to {}",
            cl.member_id
        );
    }
    assert_eq!(
        c.describe("G", 1000).unwrap().members[2].state,
        MemberState::Away
    );
    // The restarted process: a new member id, the same instance id.
    let mut new = Client::new("m2-restarted", 9, "STICKY").with_instance("i2");
    new.heartbeat(&mut c, 20_000);
    assert_eq!(new.owned, old.owned);
    clients.insert(2, new);
    converge(&mut c, &mut clients, 20_001);
    let d = c.describe("G", 20_001).unwrap();
    assert_eq!(d.group_epoch, epoch);
    assert_eq!(c.history("G").len(), history);
    let mut after = assignment_of(&clients);
    let moved_back = after.queues_of("m2-restarted").to_vec();
    after.insert("m2", moved_back);
    let mut after_renamed = Assignment::new();
    for (m, q) in after.iter().filter(|(m, _)| m.as_str() != "m2-restarted") {
        after_renamed.insert(m.clone(), q.clone());
    }
    assert_eq!(before, after_renamed);
    // The old incarnation is fenced.
    let q = old.owned.iter().next().unwrap();
    assert!(c.validate("G", "m2", old.epoch, q).is_err());
}

#[test]
fn static_member_reserved_until_session_timeout() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY").with_instance("ia");
    let mut b = Client::new("b", 2, "STICKY");
    let mut both = vec![a.clone(), b.clone()];
    converge(&mut c, &mut both, 0);
    a = both[0].clone();
    b = both[1].clone();
    // a's connection closes (killed): away, reserved.
    c.handle_connection_closed(100, 1);
    let fx = drain(&mut c);
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::ReleaseLocks { client_id, .. } if client_id == "client-a")));
    b.heartbeat(&mut c, 200);
    assert_eq!(b.owned.len(), 8);
    // A live holder blocks a second instance with the same id; an away one does not.
    let session = c.config().session_timeout_ms;
    c.handle_timeout(100 + session - 1);
    b.heartbeat(&mut c, 100 + session - 1);
    assert_eq!(b.owned.len(), 8);
    assert_eq!(c.poll_timeout(), Some(100 + session));
    c.handle_timeout(100 + session);
    b.heartbeat(&mut c, 100 + session);
    assert_eq!(b.owned.len(), 16);
    assert!(matches!(
        c.history("G").last().unwrap().cause,
        RebalanceCause::SessionExpired { .. }
    ));
    let _ = a;
}

#[test]
fn unreleased_instance_id_is_refused() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "STICKY").with_instance("i");
    a.heartbeat(&mut c, 0);
    let mut twin = Client::new("a2", 2, "STICKY").with_instance("i");
    assert!(matches!(
        twin.heartbeat(&mut c, 1),
        Some(GroupError::UnreleasedInstanceId { .. })
    ));
    assert!(twin.owned.is_empty());
}

#[test]
fn dynamic_session_expiry_and_connection_close() {
    let mut c = coordinator();
    let mut all = vec![
        Client::new("a", 1, "STICKY"),
        Client::new("b", 2, "STICKY"),
        Client::new("c", 3, "STICKY"),
    ];
    converge(&mut c, &mut all, 0);
    // c is killed: its connection closes; its queues go at once.
    let killed = all.remove(2);
    c.handle_connection_closed(10, killed.conn);
    converge(&mut c, &mut all, 11);
    assert!(complete(&c, &all));
    // b freezes: it keeps consuming but stops heartbeating; after the session timeout its
    // queues go to a, and b's stale pulls are refused.
    let session = c.config().session_timeout_ms;
    let mut now = 11;
    while now < 11 + session + 1000 {
        now += 1000;
        all[0].heartbeat(&mut c, now);
        c.handle_timeout(now);
    }
    all[0].heartbeat(&mut c, now);
    assert_eq!(all[0].owned.len(), 16);
    check_exclusive(&c, &all);
}

#[test]
fn a_member_s_own_short_session_expires_it_before_the_coordinator_default() {
    let mut c = coordinator();
    assert_eq!(c.config().session_timeout_ms, 45_000);
    let mut a = Client::new("a", 1, "STICKY");
    let mut b = Client::new("b", 2, "STICKY");
    a.session_timeout_ms = Some(2_000);
    b.session_timeout_ms = Some(2_000);
    let mut all = vec![a, b];
    converge(&mut c, &mut all, 0);
    assert_eq!(all[1].owned.len(), 8);
    // The next deadline is the members' session, not the coordinator's 45 s.
    let last = 0; // converge heartbeats every round at this time
    assert_eq!(c.poll_timeout(), Some(last + 2_000));
    // b freezes (keeps its queues, stops heartbeating); a heartbeats every 500 ms.
    let frozen = all[1].clone();
    let mut now = last;
    let mut taken_at = None;
    while now < 10_000 && taken_at.is_none() {
        now += 500;
        c.handle_timeout(now);
        all[0].heartbeat(&mut c, now);
        all[0].heartbeat(&mut c, now);
        if all[0].owned.len() == 16 {
            taken_at = Some(now);
        }
    }
    // Taken over within its own session plus a heartbeat, long before 45 s.
    let taken_at = taken_at.expect("b's queues never went to a");
    assert!(
        taken_at <= last + 2_000 + 500,
        "taken over at {taken_at} ms"
    );
    assert_eq!(c.describe("G", now).unwrap().members.len(), 1);
    // The frozen member's stale pulls are fenced.
    let q = frozen.owned.iter().next().unwrap();
    assert!(matches!(
        c.validate("G", &frozen.member_id, frozen.epoch, q),
        Err(GroupError::UnknownMember { .. } | GroupError::FencedMemberEpoch { .. })
    ));
    // A member that names no session keeps the coordinator's default.
    let mut d = Client::new("d", 4, "STICKY");
    d.heartbeat(&mut c, now);
    let later = now + 5_000; // past a's own session, far from the default 45 s
    all[0].heartbeat(&mut c, later);
    all[0].heartbeat(&mut c, later);
    c.handle_timeout(later);
    assert_eq!(c.describe("G", later).unwrap().members.len(), 2);
}

#[test]
fn stuck_member_is_fenced_after_rebalance_timeout_and_others_go_on() {
    let mut c = coordinator();
    let mut all = vec![Client::new("a", 1, "STICKY"), Client::new("b", 2, "STICKY")];
    converge(&mut c, &mut all, 0);
    all[0].slow = true; // a will never release
    all.push(Client::new("c", 3, "STICKY"));
    for t in 1..5 {
        for cl in all.iter_mut() {
            cl.heartbeat(&mut c, t);
        }
        check_exclusive(&c, &all);
    }
    // b released promptly: c already has b's share although a is stuck.
    let from_b = all[2].owned.len();
    assert!(from_b >= 2, "c got {from_b}");
    assert_eq!(
        c.describe("G", 5).unwrap().members[0].state,
        MemberState::UnrevokedQueues
    );
    // a's rebalance timeout is 10 s.
    let mut now = 5;
    while now <= 10_010 {
        now += 500;
        all[1].heartbeat(&mut c, now);
        all[2].heartbeat(&mut c, now);
        c.handle_timeout(now);
        check_exclusive(&c, &all);
    }
    assert!(matches!(
        c.history("G").last().unwrap().cause,
        RebalanceCause::RebalanceTimeout { .. }
    ));
    // a is out (its pulls are fenced); b and c share everything.
    assert!(all[0].heartbeat(&mut c, now).is_some());
    all[0].slow = false;
    converge(&mut c, &mut all, now);
    assert!(complete(&c, &all));
}

#[test]
fn topic_growth_rebalances() {
    let mut c = coordinator();
    let mut all = vec![Client::new("a", 1, "STICKY"), Client::new("b", 2, "STICKY")];
    converge(&mut c, &mut all, 0);
    let more: Vec<MessageQueue> = (0..20)
        .map(|i| MessageQueue::new(T, "broker-a", i))
        .collect();
    c.handle_topic_queues(10, T, more.clone());
    converge(&mut c, &mut all, 11);
    assert!(assignment_of(&all)
        .coverage(&more)
        .is_exclusive_and_complete());
    assert_eq!(assignment_of(&all).load_range(), (10, 10));
    assert!(matches!(
        c.history("G").last().unwrap().cause,
        RebalanceCause::TopicChanged { .. }
    ));
}

#[test]
fn restore_keeps_assignments_and_moves_epochs_forward() {
    let mut c = coordinator();
    let mut all: Vec<Client> = (0..3)
        .map(|i| Client::new(&format!("m{i}"), i, "STICKY"))
        .collect();
    converge(&mut c, &mut all, 0);
    let before = assignment_of(&all);
    let epoch = c.describe("G", 0).unwrap().group_epoch;
    let json = serde_json::to_string(&c.snapshot()).unwrap();
    let snap: CoordinatorSnapshot = serde_json::from_str(&json).unwrap();
    let mut c2 = Coordinator::restore(CoordinatorConfig::default(), snap, 50);
    c2.handle_topic_queues(50, T, queues(16));
    c2.check_invariants().unwrap();
    // The members carry on with their old epochs: accepted, nothing moves.
    for cl in all.iter_mut() {
        assert!(cl.heartbeat(&mut c2, 60).is_none());
    }
    converge(&mut c2, &mut all, 61);
    assert_eq!(assignment_of(&all), before);
    assert!(c2.describe("G", 61).unwrap().group_epoch >= epoch + RESTORE_EPOCH_GAP);
    assert!(all.iter().all(|cl| cl.epoch > epoch));
}

#[test]
fn adoption_needs_evidence_and_a_free_queue() {
    let mut c = coordinator();
    let q = queues(16);
    let mut r = Client::new("a", 1, "STICKY").request("G");
    r.owned = q[..4].iter().cloned().collect();
    r.adoptable = q[..2].iter().cloned().collect();
    let resp = c.handle_heartbeat(0, r).unwrap();
    assert_eq!(resp.assignment.len(), 16);
    let mut r = Client::new("b", 2, "STICKY").request("G");
    r.owned = q[..2].iter().cloned().collect();
    r.adoptable = r.owned.clone();
    // a owns them: b adopts nothing.
    let b = r.member_id.clone();
    let resp = c.handle_heartbeat(1, r).unwrap();
    assert!(resp.assignment.is_empty());
    c.check_invariants().unwrap();
    // b releases them: its final commits pass the member-epoch fence (the lock decides) while
    // it still reports them, and no longer once it stopped naming them.
    let epoch = resp.member_epoch;
    c.validate("G", &b, epoch, &q[0]).unwrap();
    assert!(c.validate("G", &b, epoch, &q[5]).is_err());
    let mut r = Client::new("b", 2, "STICKY").request("G");
    r.member_id = b.clone();
    r.member_epoch = epoch;
    r.owned = BTreeSet::new();
    c.handle_heartbeat(2, r).unwrap();
    assert!(matches!(
        c.validate("G", &b, epoch, &q[0]),
        Err(GroupError::QueueNotAssigned { .. })
    ));
}

#[test]
fn limits_and_bad_requests() {
    let mut c = Coordinator::new(CoordinatorConfig {
        max_members_per_group: 2,
        max_groups: 1,
        ..CoordinatorConfig::default()
    });
    c.handle_topic_queues(0, T, queues(4));
    let mut a = Client::new("a", 1, "STICKY");
    a.heartbeat(&mut c, 0);
    Client::new("b", 2, "STICKY").heartbeat(&mut c, 0);
    assert!(matches!(
        Client::new("c", 3, "STICKY").heartbeat(&mut c, 0),
        Some(GroupError::GroupFull { .. })
    ));
    let mut r = a.request("H");
    r.member_epoch = 0;
    assert!(matches!(
        c.handle_heartbeat(0, r),
        Err(GroupError::TooManyGroups(1))
    ));
    for bad in ["MACHINE_ROOM", "CONFIG", "CONSISTENT_HASH:0", "nope"] {
        let mut r = a.request("G");
        r.assignor = Some(bad.into());
        assert!(c.handle_heartbeat(0, r).is_err(), "{bad}");
    }
    let mut r = a.request("G");
    r.member_id = "x".repeat(300);
    assert!(matches!(
        c.handle_heartbeat(0, r),
        Err(GroupError::InvalidRequest(_))
    ));
    let mut r = a.request("G");
    r.member_epoch = -1;
    assert!(c.handle_heartbeat(0, r).is_err());
    assert_eq!(
        canonical_assignor("cooperative-sticky").unwrap(),
        "COOPERATIVE_STICKY"
    );
    assert_eq!(
        canonical_assignor("consistent_hash:5").unwrap(),
        "CONSISTENT_HASH:5"
    );
}

#[test]
fn assignor_follows_the_members_and_history_is_bounded() {
    let mut c = Coordinator::new(CoordinatorConfig {
        history_limit: 3,
        ..CoordinatorConfig::default()
    });
    c.handle_topic_queues(0, T, queues(16));
    let mut all = vec![Client::new("a", 1, "AVG"), Client::new("b", 2, "AVG")];
    converge(&mut c, &mut all, 0);
    assert_eq!(c.describe("G", 0).unwrap().assignor, "AVG");
    // AVG is RocketMQ's arithmetic: contiguous blocks by member order.
    assert_eq!(all[0].owned, queues(16)[..8].iter().cloned().collect());
    for cl in all.iter_mut() {
        cl.assignor = "BALANCED_STICKY".into();
    }
    converge(&mut c, &mut all, 1);
    assert_eq!(c.describe("G", 1).unwrap().assignor, "BALANCED_STICKY");
    for i in 0..5 {
        all.push(Client::new(&format!("x{i}"), 10 + i, "BALANCED_STICKY"));
        converge(&mut c, &mut all, 2 + i);
    }
    assert_eq!(c.history("G").len(), 3);
    assert!(complete(&c, &all));
}

mod properties;
mod replicated;

/// A group whose coordinator moved: members join the new coordinator with the queues they
/// hold, one after the other. The first adopts what it holds (and is given what nobody
/// holds yet); a later member that reports queues it was not given is not fenced for naming
/// them while it lets go of them, and what it was given becomes its own as usual.
#[test]
fn members_rejoining_a_new_coordinator_are_not_fenced_for_what_they_hold() {
    let mut c = coordinator();
    c.handle_topic_queues(0, T, queues(4));
    let q = queues(4);
    let join = |member: &str, conn: u64, owned: &[MessageQueue]| HeartbeatRequest {
        group: "G".into(),
        member_id: member.into(),
        member_epoch: 0,
        client_id: member.into(),
        conn_id: conn,
        subscriptions: [T.to_string()].into(),
        owned: owned.iter().cloned().collect(),
        adoptable: owned.iter().cloned().collect(),
        ..Default::default()
    };
    let a = c.handle_heartbeat(10, join("a", 1, &q[..2])).unwrap();
    assert!(a.assignment.contains(&q[0]) && a.assignment.contains(&q[1]));
    // b held q2 and q3 under the old coordinator (and still q1, which it is releasing).
    let b = c.handle_heartbeat(11, join("b", 2, &q[1..])).unwrap();
    assert!(!b.assignment.contains(&q[1]), "q1 stays with a");
    // b's next heartbeat still names what it holds: stale reports, not claims.
    let mut again = join("b", 2, &q[1..]);
    again.member_epoch = b.member_epoch;
    let b2 = c
        .handle_heartbeat(12, again)
        .expect("not fenced for queues it holds and lets go of");
    // Once it stopped naming q1, naming it again is a claim and fenced.
    let mut without = join("b", 2, &b2.assignment);
    without.member_epoch = b2.member_epoch;
    let b3 = c.handle_heartbeat(13, without).unwrap();
    let mut claim = join("b", 2, &q[1..2]);
    claim.member_epoch = b3.member_epoch;
    assert!(matches!(
        c.handle_heartbeat(14, claim),
        Err(GroupError::FencedMemberEpoch { .. })
    ));
}

/// A member of the group's previous coordinator that cannot reach its target at once (here
/// the new coordinator does not know the topic's queues yet, so it must release what it
/// holds) keeps the epoch it had instead of being answered epoch 0: a Kafka client takes
/// epoch 0 for a join and would leave out its subscription. Its next heartbeats at that
/// epoch are accepted, and it moves above it once it reaches the target.
#[test]
fn a_moved_in_member_keeps_its_epoch_until_it_reaches_the_target() {
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let q = queues(4);
    let join = HeartbeatRequest {
        group: "G".into(),
        member_id: "a".into(),
        member_epoch: 0,
        client_id: "a".into(),
        conn_id: 1,
        subscriptions: [T.to_string()].into(),
        owned: q[..2].iter().cloned().collect(),
        adoptable: q[..2].iter().cloned().collect(),
        last_epoch: Some(5),
        ..Default::default()
    };
    let first = c.handle_heartbeat(10, join.clone()).unwrap();
    assert_eq!(
        first.member_epoch, 5,
        "not 0 while it releases what it holds"
    );
    assert!(first.assignment.is_empty(), "no queue of an unknown topic");
    // Still holding them, at the epoch it was told.
    let mut again = join.clone();
    again.member_epoch = 5;
    again.adoptable.clear();
    again.last_epoch = None;
    let second = c.handle_heartbeat(11, again.clone()).unwrap();
    assert_eq!(second.member_epoch, 5);
    // The queues become known and it let go: it reaches the target above its old epoch.
    c.handle_topic_queues(12, T, q.clone());
    again.owned.clear();
    let third = c.handle_heartbeat(13, again).unwrap();
    assert!(third.member_epoch > 5, "epoch {}", third.member_epoch);
    assert_eq!(third.assignment.len(), 4);
}
