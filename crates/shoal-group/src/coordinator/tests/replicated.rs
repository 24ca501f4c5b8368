//! The coordinator's state carried from a replicated group's master to a replica, and the
//! replica taking over: epochs only grow, members keep their queues.

use super::*;
use crate::state::{GroupState, GroupStateConfig};

/// An update as a replica gets it: through its JSON form (a metadata record's body).
fn shipped(u: CoordinatorUpdate) -> CoordinatorUpdate {
    serde_json::from_slice(&serde_json::to_vec(&u).unwrap()).unwrap()
}

/// The groups whose state changed, from the coordinator's persistence effects.
fn changed(c: &mut Coordinator) -> Vec<String> {
    let mut names: Vec<String> = drain(c)
        .into_iter()
        .filter_map(|e| match e {
            Effect::Persist { group } => Some(group),
            _ => None,
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn a_follower_applies_updates_in_order() {
    let mut c = coordinator();
    let mut all: Vec<Client> = (0..3)
        .map(|i| Client::new(&format!("m{i}"), i, "STICKY"))
        .collect();
    converge(&mut c, &mut all, 0);
    let mut f = CoordinatorFollower::new(16);
    assert_eq!(f.applied(), 0);
    let names = changed(&mut c);
    assert_eq!(names, vec!["G".to_string()]);
    f.apply(shipped(c.update_for(names.iter().map(String::as_str))));
    let (topics, version) = c.topics_update(0).unwrap();
    f.apply(shipped(topics));
    assert!(
        c.topics_update(version).is_none(),
        "unchanged topics are not sent again"
    );
    let epoch = c.describe("G", 0).unwrap().group_epoch;
    assert_eq!(f.group_epoch("G"), Some(epoch));

    // A fourth member: the group moves on; the follower with it.
    all.push(Client::new("m3", 3, "STICKY"));
    converge(&mut c, &mut all, 1);
    let names = changed(&mut c);
    f.apply(shipped(c.update_for(names.iter().map(String::as_str))));
    let later = c.describe("G", 1).unwrap().group_epoch;
    assert!(later > epoch);
    assert_eq!(f.group_epoch("G"), Some(later));

    // A group the master no longer has is removed; a full round's names drop the rest.
    f.apply(shipped(c.update_for(["gone"])));
    assert_eq!(f.len(), 1);
    let mut other = Coordinator::new(CoordinatorConfig::default());
    other
        .handle_heartbeat(0, Client::new("x", 9, "STICKY").request("H"))
        .unwrap();
    f.apply(shipped(other.update_for(["H"])));
    assert_eq!(f.len(), 2);
    f.apply(shipped(c.names_update()));
    assert_eq!(f.len(), 1);
    assert_eq!(f.applied(), 6);
}

#[test]
fn a_follower_holds_at_most_max_groups() {
    let mut c = Coordinator::new(CoordinatorConfig::default());
    for g in ["A", "B", "C"] {
        let mut r = Client::new("m", 1, "STICKY").request(g);
        r.member_id = format!("m-{g}");
        c.handle_heartbeat(0, r).unwrap();
    }
    let mut f = CoordinatorFollower::new(2);
    f.apply(shipped(c.update_for(["A", "B", "C"])));
    assert_eq!(f.len(), 2);
    assert_eq!(f.left_out(), 1);
    // A group it holds is still updated at the limit.
    f.apply(shipped(c.update_for(["A"])));
    assert_eq!(f.len(), 2);
}

#[test]
fn a_replica_taking_over_continues_above_the_master_and_its_own_epochs() {
    let mut master = coordinator();
    let mut all: Vec<Client> = (0..3)
        .map(|i| Client::new(&format!("m{i}"), i + 1, "STICKY"))
        .collect();
    converge(&mut master, &mut all, 0);
    let before = assignment_of(&all);
    let mut f = CoordinatorFollower::new(16);
    f.apply(shipped(master.update_for(["G"])));
    f.apply(shipped(master.topics_update(0).unwrap().0));
    let master_epoch = master.describe("G", 0).unwrap().group_epoch;

    // The replica's own coordinator (it was master once) knows G at a higher epoch.
    let mut floors = BTreeMap::new();
    floors.insert("G".to_string(), master_epoch + 5_000);
    let mut own = master.snapshot();
    own.raise_epochs(&floors);
    assert_eq!(own.group_epoch("G"), Some(master_epoch + 5_000));
    assert_eq!(own.group_names(), vec!["G".to_string()]);
    let mut replica = GroupState::restore(GroupStateConfig::default(), own, 0);
    let own_epoch = replica.coordinator().describe("G", 0).unwrap().group_epoch;
    assert!(own_epoch >= master_epoch + 5_000);

    replica.take_over_coordinator(100, f.snapshot());
    let effects: Vec<_> = std::iter::from_fn(|| replica.poll_effect()).collect();
    assert!(effects.contains(&crate::state::GroupEffect::Persist { group: "G".into() }));
    let d = replica.coordinator().describe("G", 100).unwrap();
    assert!(d.group_epoch >= own_epoch + RESTORE_EPOCH_GAP, "{d:?}");
    assert!(d.group_epoch > master_epoch);
    assert_eq!(d.members.len(), 3);
    replica.coordinator().check_invariants().unwrap();
    // The members' connection ids were the master's: a connection of this broker with the
    // same id closing removes nobody.
    replica.handle_connection_closed(120, 1);
    assert_eq!(
        replica
            .coordinator()
            .describe("G", 120)
            .unwrap()
            .members
            .len(),
        3
    );

    // Without a higher own epoch: the master's plus the gap.
    let mut fresh = GroupState::new(GroupStateConfig::default());
    fresh.take_over_coordinator(100, f.snapshot());
    let d = fresh.coordinator().describe("G", 100).unwrap();
    assert_eq!(d.group_epoch, master_epoch + RESTORE_EPOCH_GAP);
    // The members carry on at the new master with their queues: nothing moves.
    for cl in all.iter_mut() {
        let r = fresh.handle_group_heartbeat(110, cl.request("G"), Vec::new());
        let r = r.unwrap().unwrap();
        cl.epoch = r.member_epoch;
        assert_eq!(
            r.assignment.iter().cloned().collect::<BTreeSet<_>>(),
            cl.owned
        );
    }
    assert_eq!(assignment_of(&all), before);
    assert!(all.iter().all(|cl| cl.epoch > master_epoch));
}

/// What a member last reported comes with the group's state to a coordinator that takes it
/// over: its subscriptions and every queue it holds (assigned, or being released).
#[test]
fn a_member_report_comes_with_the_taken_over_group() {
    let mut c = coordinator();
    let mut a = Client::new("a", 1, "RANGE");
    assert!(a.heartbeat(&mut c, 0).is_none());
    let mut b = Client::new("b", 2, "RANGE");
    a.slow = true;
    assert!(b.heartbeat(&mut c, 0).is_none());
    assert!(a.heartbeat(&mut c, 0).is_none());
    assert!(
        !a.to_release.is_empty(),
        "a is asked to release some queues"
    );
    let taken = Coordinator::restore(CoordinatorConfig::default(), c.snapshot(), 10);
    let r = taken
        .member_report("G", "a")
        .expect("a is in the taken-over group");
    assert_eq!(r.subscriptions, [T.to_string()].into());
    assert_eq!(
        r.held, a.owned,
        "its queues, those it is releasing included"
    );
    assert_eq!(r.assignor.as_deref(), Some("RANGE"));
    assert_eq!(r.rebalance_timeout_ms, 10_000);
    assert!(taken.member_report("G", "nobody").is_none());
    assert!(taken.member_report("other", "a").is_none());
}
