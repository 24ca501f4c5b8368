//! Kafka's assignors over the queues of several topics at once. A topic's partitions are
//! its queues in `MessageQueue` order (broker name, then queue id); every member is taken to
//! subscribe every topic of the input.

use super::{all_from_each, AllocateStrategy, AllocationInput, Assignment};
use crate::error::Result;
use shoal_proto::mq::MessageQueue;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// `RANGE` (Kafka `RangeAssignor`): per topic, contiguous ranges; the first
/// `partitions % members` members get one more of that topic. Loads differ by at most one
/// per topic, so by at most the number of topics overall.
#[derive(Debug, Clone, Copy, Default)]
pub struct Range;

impl AllocateStrategy for Range {
    fn name(&self) -> String {
        "RANGE".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        let members = input.members();
        let mut lists: Vec<Vec<MessageQueue>> = vec![Vec::new(); members.len()];
        for topic in input.queues().chunk_by(|a, b| a.topic == b.topic) {
            for (i, list) in lists.iter_mut().enumerate() {
                list.extend_from_slice(range_share(topic, members.len(), i));
            }
        }
        let mut a = Assignment::new();
        for (m, list) in members.iter().zip(lists) {
            a.insert(m.clone(), list);
        }
        Ok(a)
    }

    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        let Some(i) = input.member_index(member) else {
            return Ok(Vec::new());
        };
        let m = input.members().len();
        let mut out = Vec::new();
        for topic in input.queues().chunk_by(|a, b| a.topic == b.topic) {
            out.extend_from_slice(range_share(topic, m, i));
        }
        Ok(out)
    }
}

/// Member `i`'s range of one topic's partitions among `m` members.
fn range_share(topic: &[MessageQueue], m: usize, i: usize) -> &[MessageQueue] {
    if m == 0 {
        return &[];
    }
    let per = topic.len() / m;
    let extra = topic.len() % m;
    let start = per * i + i.min(extra);
    let len = per + usize::from(i < extra);
    topic.get(start..start + len).unwrap_or(&[])
}

/// `ROUND_ROBIN` (Kafka `RoundRobinAssignor`): all partitions sorted by topic then
/// partition, dealt to the sorted members in turn.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundRobin;

impl AllocateStrategy for RoundRobin {
    fn name(&self) -> String {
        "ROUND_ROBIN".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        all_from_each(self, input)
    }

    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        let Some(i) = input.member_index(member) else {
            return Ok(Vec::new());
        };
        let m = input.members().len();
        Ok(input.queues().iter().skip(i).step_by(m).cloned().collect())
    }
}

/// The balanced assignment closest to the previous one: owner index per queue.
///
/// Loads end at `base = n / m` or `base + 1` (`r = n % m` members get `base + 1`). Each
/// member keeps up to `base` of the queues it owned before; the `r` members that owned the
/// most beyond `base` (ties by member order) keep one more. Every other queue goes, in queue
/// order, to the least loaded member (ties by member order). This keeps the largest number of
/// queues any balanced assignment can keep, so it moves exactly
/// [`minimum_moves`](super::minimum_moves).
fn sticky_target(input: &AllocationInput<'_>) -> Vec<Option<usize>> {
    let queues = input.queues();
    let members = input.members();
    let (n, m) = (queues.len(), members.len());
    if m == 0 {
        return vec![None; n];
    }
    let base = n / m;
    let r = n % m;
    let prev_owner: HashMap<&MessageQueue, &str> = input
        .context()
        .previous
        .as_ref()
        .map(Assignment::sole_owners)
        .unwrap_or_default();
    let mut kept: Vec<Vec<usize>> = vec![Vec::new(); m];
    for (qi, q) in queues.iter().enumerate() {
        if let Some(mi) = prev_owner.get(q).and_then(|o| input.member_index(o)) {
            if let Some(k) = kept.get_mut(mi) {
                k.push(qi);
            }
        }
    }
    let mut over: Vec<usize> = (0..m)
        .filter(|&i| kept.get(i).is_some_and(|k| k.len() > base))
        .collect();
    over.sort_by_key(|&i| (Reverse(kept.get(i).map_or(0, Vec::len)), i));
    let mut cap = vec![base; m];
    for &i in over.iter().take(r) {
        if let Some(c) = cap.get_mut(i) {
            *c = base + 1;
        }
    }
    let mut owner: Vec<Option<usize>> = vec![None; n];
    let mut load = vec![0usize; m];
    for (mi, k) in kept.iter().enumerate() {
        let c = cap.get(mi).copied().unwrap_or(base);
        for &qi in k.iter().take(c) {
            if let Some(o) = owner.get_mut(qi) {
                *o = Some(mi);
            }
        }
        if let Some(l) = load.get_mut(mi) {
            *l = k.len().min(c);
        }
    }
    let mut heap: BinaryHeap<Reverse<(usize, usize)>> = load
        .iter()
        .enumerate()
        .map(|(i, &l)| Reverse((l, i)))
        .collect();
    for o in owner.iter_mut().filter(|o| o.is_none()) {
        if let Some(Reverse((l, i))) = heap.pop() {
            *o = Some(i);
            heap.push(Reverse((l + 1, i)));
        }
    }
    owner
}

/// `STICKY` (Kafka `StickyAssignor`): balanced first (loads differ by at most one), then as
/// many queues as possible stay with their previous owner
/// ([`previous`](super::AllocationContext::previous)); without a previous assignment it deals
/// queues round-robin. It moves exactly the minimum number of queues a balanced assignment
/// needs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sticky;

impl AllocateStrategy for Sticky {
    fn name(&self) -> String {
        "STICKY".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        Ok(Assignment::from_owner_indices(
            input.queues(),
            input.members(),
            &sticky_target(input),
        ))
    }
}

/// `COOPERATIVE_STICKY` (Kafka `CooperativeStickyAssignor`): the [`Sticky`] target, but a
/// queue whose previous owner is still a member and is not its target owner is only revoked
/// in this round (left unowned); it is given to its new owner in the following round, once
/// the previous assignment shows it released. Queues of members that left are reassigned at
/// once. Exclusive always; complete after the follow-up round (two rounds per change).
#[derive(Debug, Clone, Copy, Default)]
pub struct CooperativeSticky;

impl AllocateStrategy for CooperativeSticky {
    fn name(&self) -> String {
        "COOPERATIVE_STICKY".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        let mut owner = sticky_target(input);
        if let Some(prev) = input.context().previous.as_ref() {
            let prev_owner = prev.sole_owners();
            for (q, o) in input.queues().iter().zip(owner.iter_mut()) {
                let before = prev_owner.get(q).and_then(|p| input.member_index(p));
                if before.is_some() && before != *o {
                    *o = None;
                }
            }
        }
        Ok(Assignment::from_owner_indices(
            input.queues(),
            input.members(),
            &owner,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{minimum_moves, moved_queues, AllocationContext};
    use super::*;

    fn topics(spec: &[(&str, i32)]) -> Vec<MessageQueue> {
        spec.iter()
            .flat_map(|(t, n)| (0..*n).map(move |i| MessageQueue::new(*t, "b", i)))
            .collect()
    }

    fn names(qs: &[MessageQueue]) -> Vec<String> {
        qs.iter()
            .map(|q| format!("{}p{}", q.topic, q.queue_id))
            .collect()
    }

    /// Topics t0 (3 partitions) and t1 (8), consumers C0 and C1.
    #[test]
    fn range_kafka_example() {
        let input = AllocationInput::new("g", topics(&[("t0", 3), ("t1", 8)]), ["C0", "C1"]);
        let a = Range.allocate_all(&input).unwrap();
        assert_eq!(
            names(a.queues_of("C0")),
            ["t0p0", "t0p1", "t1p0", "t1p1", "t1p2", "t1p3"]
        );
        assert_eq!(
            names(a.queues_of("C1")),
            ["t0p2", "t1p4", "t1p5", "t1p6", "t1p7"]
        );
    }

    #[test]
    fn round_robin_kafka_example() {
        let input = AllocationInput::new("g", topics(&[("t0", 3), ("t1", 8)]), ["C0", "C1"]);
        let a = RoundRobin.allocate_all(&input).unwrap();
        assert_eq!(
            names(a.queues_of("C0")),
            ["t0p0", "t0p2", "t1p1", "t1p3", "t1p5", "t1p7"]
        );
        assert_eq!(
            names(a.queues_of("C1")),
            ["t0p1", "t1p0", "t1p2", "t1p4", "t1p6"]
        );
    }

    /// Kafka's StickyAssignor example: four topics of two partitions, three consumers; the
    /// middle one leaves and the others keep everything they had.
    #[test]
    fn sticky_keeps_survivors_when_middle_member_leaves() {
        let qs = topics(&[("t0", 2), ("t1", 2), ("t2", 2), ("t3", 2)]);
        let first = Sticky
            .allocate_all(&AllocationInput::new("g", qs.clone(), ["C1", "C2", "C3"]))
            .unwrap();
        assert_eq!(first.load_range(), (2, 3));
        let ctx = AllocationContext {
            previous: Some(first.clone()),
            ..Default::default()
        };
        let input = AllocationInput::new("g", qs.clone(), ["C1", "C3"]).with_context(&ctx);
        let second = Sticky.allocate_all(&input).unwrap();
        for m in ["C1", "C3"] {
            for q in first.queues_of(m) {
                assert!(second.queues_of(m).contains(q), "{m} lost {q}");
            }
        }
        assert_eq!(second.load_range(), (4, 4));
        assert!(second.coverage(&qs).is_exclusive_and_complete());
        assert_eq!(
            moved_queues(&first, &second),
            minimum_moves(&first, &qs, input.members())
        );
    }

    #[test]
    fn cooperative_revokes_then_assigns() {
        let qs = topics(&[("t", 6)]);
        let first = CooperativeSticky
            .allocate_all(&AllocationInput::new("g", qs.clone(), ["a", "b"]))
            .unwrap();
        assert!(first.coverage(&qs).is_exclusive_and_complete());
        let ctx = AllocationContext {
            previous: Some(first.clone()),
            ..Default::default()
        };
        let input = AllocationInput::new("g", qs.clone(), ["a", "b", "c"]).with_context(&ctx);
        let second = CooperativeSticky.allocate_all(&input).unwrap();
        // c gets nothing yet: its two queues are revoked from a and b first.
        assert!(second.queues_of("c").is_empty());
        assert_eq!(second.coverage(&qs).unowned, 2);
        assert_eq!(moved_queues(&first, &second), 0);
        let ctx = AllocationContext {
            previous: Some(second),
            ..Default::default()
        };
        let input = AllocationInput::new("g", qs.clone(), ["a", "b", "c"]).with_context(&ctx);
        let third = CooperativeSticky.allocate_all(&input).unwrap();
        assert!(third.coverage(&qs).is_exclusive_and_complete());
        assert_eq!(third.load_range(), (2, 2));
        assert_eq!(moved_queues(&first, &third), 2);
    }
}
