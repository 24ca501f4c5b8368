//! Property tests of every allocation strategy over random groups: up to 200 members and
//! 2000 queues over several topics and brokers (machine rooms as `room@broker`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use proptest::prelude::*;
use shoal_group::allocate::{
    minimum_moves, moved_queues, Averagely, AveragelyByCircle, BalancedSticky, ByConfig,
    ConsistentHash, CooperativeSticky, MachineRoom, MachineRoomNearby, Range, RoundRobin, Sticky,
};
use shoal_group::{AllocateStrategy, AllocationContext, AllocationInput, Assignment};
use shoal_proto::MessageQueue;
use std::collections::BTreeSet;

#[derive(Debug, Clone)]
struct Group {
    queues: Vec<MessageQueue>,
    members: Vec<String>,
    context: AllocationContext,
    topics: usize,
    /// Rotation used to present the inputs in another order.
    rotate: usize,
}

const ROOMS: [&str; 3] = ["hz", "sh", "bj"];

fn group(
    max_members: usize,
    max_queues: usize,
) -> impl proptest::strategy::Strategy<Value = Group> {
    (
        1usize..5,
        1usize..4,
        0..=max_queues,
        prop::collection::btree_set("[a-f0-9]{1,3}\\.[0-9]{1,2}@[0-9]{1,5}", 0..=max_members),
        prop::collection::vec(0usize..3, max_members + 1),
        0usize..1000,
    )
        .prop_map(|(topics, brokers, total, members, zones, rotate)| {
            let per = total / (topics * brokers);
            let mut queues = Vec::new();
            for t in 0..topics {
                for b in 0..brokers {
                    let room = ROOMS.get(b % 2).copied().unwrap_or("hz");
                    for q in 0..per {
                        queues.push(MessageQueue::new(
                            format!("topic-{t}"),
                            format!("{room}@broker-{b}"),
                            q as i32,
                        ));
                    }
                }
            }
            let members: Vec<String> = members.into_iter().collect();
            let mut context = AllocationContext::default();
            for (m, z) in members.iter().zip(zones) {
                let room = ROOMS.get(z).copied().unwrap_or("hz");
                context.member_zones.insert(m.clone(), room.to_string());
            }
            context.consume_rooms.insert("hz".to_string());
            // A configuration that partitions the queues (ByConfig).
            if !members.is_empty() {
                for (i, q) in queues.iter().enumerate() {
                    if let Some(m) = members.get(i % members.len()) {
                        context
                            .configured
                            .entry(m.clone())
                            .or_default()
                            .push(q.clone());
                    }
                }
            }
            Group {
                queues,
                members,
                context,
                topics,
                rotate,
            }
        })
}

/// The same inputs in another order: reversed and rotated.
fn shuffled<T: Clone>(v: &[T], rotate: usize) -> Vec<T> {
    let mut out: Vec<T> = v.iter().rev().cloned().collect();
    if !out.is_empty() {
        let k = rotate % out.len();
        out.rotate_left(k);
    }
    out
}

/// Checks shared by every strategy; returns the assignment.
fn check_common(s: &dyn AllocateStrategy, g: &Group, ctx: &AllocationContext) -> Assignment {
    let input = AllocationInput::new("g", g.queues.clone(), g.members.clone()).with_context(ctx);
    let all = s.allocate_all(&input).unwrap();
    // An entry per member, nothing else.
    assert_eq!(all.member_count(), input.members().len(), "{}", s.name());
    let cov = all.coverage(input.queues());
    assert_eq!(cov.shared, 0, "{}: a queue has two owners", s.name());
    assert_eq!(
        cov.foreign,
        0,
        "{}: an unknown queue was assigned",
        s.name()
    );
    // Independent of input order.
    let again = AllocationInput::new(
        "g",
        shuffled(&g.queues, g.rotate),
        shuffled(&g.members, g.rotate / 7),
    )
    .with_context(ctx);
    assert_eq!(
        s.allocate_all(&again).unwrap(),
        all,
        "{}: order matters",
        s.name()
    );
    // Each member computing its own share gets its entry of the whole assignment (a sample
    // of members: the per-member view of some strategies costs a whole computation).
    let step = (input.members().len() / 4).max(1);
    for m in input.members().iter().step_by(step) {
        assert_eq!(
            s.allocate(&input, m).unwrap().as_slice(),
            all.queues_of(m),
            "{}: views disagree for {m}",
            s.name()
        );
    }
    assert!(s.allocate(&input, "not-a-member").unwrap().is_empty());
    all
}

fn complete(all: &Assignment, g: &Group) -> bool {
    all.coverage(&g.queues).unowned
        == if g.members.is_empty() {
            g.queues.len()
        } else {
            0
        }
}

fn spread(all: &Assignment) -> usize {
    let (lo, hi) = all.load_range();
    hi - lo
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn balanced_strategies(g in group(200, 2000)) {
        let ctx = g.context.clone();
        let strategies: [&dyn AllocateStrategy; 5] =
            [&Averagely, &AveragelyByCircle, &RoundRobin, &Sticky, &BalancedSticky::default()];
        for s in strategies {
            let all = check_common(s, &g, &ctx);
            prop_assert!(complete(&all, &g), "{} incomplete", s.name());
            prop_assert!(spread(&all) <= 1, "{}: loads {:?}", s.name(), all.load_range());
        }
        let all = check_common(&CooperativeSticky, &g, &ctx);
        prop_assert!(complete(&all, &g));
        prop_assert!(spread(&all) <= 1);
    }

    #[test]
    fn range_balanced_per_topic(g in group(200, 2000)) {
        let all = check_common(&Range, &g, &g.context);
        prop_assert!(complete(&all, &g));
        prop_assert!(spread(&all) <= g.topics);
    }

    #[test]
    fn consistent_hash_complete(g in group(200, 2000), vnodes in 1usize..20) {
        let s = ConsistentHash::new(vnodes).unwrap();
        let all = check_common(&s, &g, &g.context);
        prop_assert!(complete(&all, &g));
    }

    #[test]
    fn machine_room_strategies(g in group(200, 2000)) {
        let all = check_common(&MachineRoom, &g, &g.context);
        // Exactly the queues of the consumed room are owned (when there are members).
        let owned: BTreeSet<&MessageQueue> = all.iter().flat_map(|(_, q)| q).collect();
        let want: BTreeSet<&MessageQueue> = if g.members.is_empty() {
            BTreeSet::new()
        } else {
            g.queues.iter().filter(|q| q.broker_name.starts_with("hz@")).collect()
        };
        prop_assert_eq!(owned, want);
        prop_assert!(spread(&all) <= 1);

        let nearby = MachineRoomNearby::new(Box::new(Averagely));
        let all = check_common(&nearby, &g, &g.context);
        prop_assert!(complete(&all, &g));
        // A member never gets a queue of another room that has members of its own.
        let rooms_with_members: BTreeSet<&String> = g.context.member_zones.values().collect();
        for (m, qs) in all.iter() {
            let mine = g.context.member_zones.get(m).unwrap();
            for q in qs {
                let room = q.broker_name.split('@').next().unwrap().to_string();
                prop_assert!(room == *mine || !rooms_with_members.contains(&room));
            }
        }
    }

    #[test]
    fn by_config_follows_configuration(g in group(200, 2000)) {
        let all = check_common(&ByConfig, &g, &g.context);
        prop_assert!(complete(&all, &g));
        for (m, qs) in all.iter() {
            let mut want = g.context.configured.get(m).cloned().unwrap_or_default();
            want.sort();
            prop_assert_eq!(qs, &want);
        }
    }

    /// Sticky reaches the minimum number of moves exactly; the cooperative variant too, in
    /// two rounds, without giving a queue to a new member while its owner still holds it.
    #[test]
    fn sticky_moves_the_minimum(
        g in group(60, 600),
        leave in prop::collection::vec(any::<bool>(), 60),
        joiners in 0usize..10,
    ) {
        let first = Sticky
            .allocate_all(&AllocationInput::new("g", g.queues.clone(), g.members.clone()))
            .unwrap();
        let mut next: Vec<String> = g
            .members
            .iter()
            .zip(leave.iter().chain(std::iter::repeat(&false)))
            .filter(|(_, l)| !**l)
            .map(|(m, _)| m.clone())
            .collect();
        next.extend((0..joiners).map(|i| format!("new-{i}")));
        // Some queues disappear and some appear as well.
        let mut queues: Vec<MessageQueue> = g.queues.iter().skip(g.queues.len() / 10).cloned().collect();
        queues.extend((0..5).map(|i| MessageQueue::new("fresh", "b", i)));
        let ctx = AllocationContext { previous: Some(first.clone()), ..Default::default() };
        let input = AllocationInput::new("g", queues.clone(), next.clone()).with_context(&ctx);
        let min = minimum_moves(&first, input.queues(), input.members());

        let sticky = Sticky.allocate_all(&input).unwrap();
        prop_assert!(sticky.coverage(&queues).is_exclusive_and_complete() || next.is_empty());
        prop_assert!(spread(&sticky) <= 1);
        prop_assert_eq!(moved_queues(&first, &sticky), min);

        let round1 = CooperativeSticky.allocate_all(&input).unwrap();
        prop_assert_eq!(round1.coverage(&queues).shared, 0);
        let before = first.sole_owners();
        for (m, qs) in round1.iter() {
            for q in qs {
                if let Some(prev) = before.get(q) {
                    prop_assert!(
                        *prev == m.as_str() || !input.members().iter().any(|x| x == prev),
                        "{q} handed from {prev} to {m} in one round"
                    );
                }
            }
        }
        let ctx2 = AllocationContext { previous: Some(round1), ..Default::default() };
        let input2 = AllocationInput::new("g", queues.clone(), next.clone()).with_context(&ctx2);
        let round2 = CooperativeSticky.allocate_all(&input2).unwrap();
        prop_assert!(round2.coverage(&queues).is_exclusive_and_complete() || next.is_empty());
        prop_assert!(spread(&round2) <= 1);
        prop_assert_eq!(moved_queues(&first, &round2), min);
    }
}
