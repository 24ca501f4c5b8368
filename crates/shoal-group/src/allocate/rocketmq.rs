//! RocketMQ's allocation strategies, with the same results as the Java client's.

use super::hash::{java_md5_hash, java_message_queue_string};
use super::{all_from_each, queue_cmp, AllocateStrategy, AllocationInput, Assignment};
use crate::error::{GroupError, Result};
use shoal_proto::mq::MessageQueue;
use std::collections::BTreeMap;

/// `AVG` (Java `AllocateMessageQueueAveragely`): contiguous blocks, the first
/// `|queues| % |members|` members get one more. Byte-for-byte Java's result (protocol spec
/// section 7.3), so Java and Shoal consumers can share a group.
#[derive(Debug, Clone, Copy, Default)]
pub struct Averagely;

impl AllocateStrategy for Averagely {
    fn name(&self) -> String {
        "AVG".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        all_from_each(self, input)
    }

    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        let Some(index) = input.member_index(member) else {
            return Ok(Vec::new());
        };
        let queues = input.queues();
        let (n, m) = (queues.len(), input.members().len());
        let modulo = n % m;
        let avg = if n <= m {
            1
        } else if modulo > 0 && index < modulo {
            n / m + 1
        } else {
            n / m
        };
        let start = if modulo > 0 && index < modulo {
            index * avg
        } else {
            index * avg + modulo
        };
        let len = avg.min(n.saturating_sub(start));
        Ok(queues.get(start..start + len).unwrap_or(&[]).to_vec())
    }
}

/// `AVG_BY_CIRCLE` (Java `AllocateMessageQueueAveragelyByCircle`): queue `i` goes to member
/// `i % |members|`.
#[derive(Debug, Clone, Copy, Default)]
pub struct AveragelyByCircle;

impl AllocateStrategy for AveragelyByCircle {
    fn name(&self) -> String {
        "AVG_BY_CIRCLE".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        all_from_each(self, input)
    }

    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        let Some(index) = input.member_index(member) else {
            return Ok(Vec::new());
        };
        let m = input.members().len();
        Ok(input
            .queues()
            .iter()
            .skip(index)
            .step_by(m)
            .cloned()
            .collect())
    }
}

/// `CONSISTENT_HASH` (Java `AllocateMessageQueueConsistentHash`).
///
/// The ring holds `virtual_nodes` points per member, at `H(memberId + "-" + i)` for
/// `i = 0..virtual_nodes`, inserted in member order (a later point replaces an earlier one
/// on an exact collision, as Java's `TreeMap.put`). A queue goes to the first point at or
/// after `H(MessageQueue.toString())`, wrapping to the smallest. `H` is [`java_md5_hash`]:
/// the first four bytes of the MD5 digest of the UTF-8 key, big-endian, unsigned.
/// Loads are not balanced (each member's share follows its arcs of the ring).
#[derive(Debug, Clone, Copy)]
pub struct ConsistentHash {
    virtual_nodes: usize,
}

/// Largest virtual node count accepted (keeps the ring in memory bounds).
pub(super) const MAX_VIRTUAL_NODES: usize = 10_000;

impl Default for ConsistentHash {
    /// Java's default of 10 virtual nodes per member.
    fn default() -> Self {
        Self { virtual_nodes: 10 }
    }
}

impl ConsistentHash {
    /// A ring with `virtual_nodes` points per member (0 gives nobody anything, as Java).
    pub fn new(virtual_nodes: usize) -> Result<Self> {
        if virtual_nodes > MAX_VIRTUAL_NODES {
            return Err(GroupError::InvalidParameter(format!(
                "virtual node count {virtual_nodes} exceeds {MAX_VIRTUAL_NODES}"
            )));
        }
        Ok(Self { virtual_nodes })
    }

    /// Virtual nodes per member.
    pub fn virtual_nodes(&self) -> usize {
        self.virtual_nodes
    }

    fn ring(&self, members: &[String]) -> BTreeMap<i64, usize> {
        let mut ring = BTreeMap::new();
        for (i, m) in members.iter().enumerate() {
            for v in 0..self.virtual_nodes {
                ring.insert(java_md5_hash(&format!("{m}-{v}")), i);
            }
        }
        ring
    }

    fn route(ring: &BTreeMap<i64, usize>, mq: &MessageQueue) -> Option<usize> {
        let h = java_md5_hash(&java_message_queue_string(mq));
        ring.range(h..)
            .next()
            .or_else(|| ring.iter().next())
            .map(|(_, &i)| i)
    }
}

impl AllocateStrategy for ConsistentHash {
    fn name(&self) -> String {
        "CONSISTENT_HASH".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        let ring = self.ring(input.members());
        let owner: Vec<Option<usize>> = input
            .queues()
            .iter()
            .map(|q| Self::route(&ring, q))
            .collect();
        Ok(Assignment::from_owner_indices(
            input.queues(),
            input.members(),
            &owner,
        ))
    }

    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        let Some(index) = input.member_index(member) else {
            return Ok(Vec::new());
        };
        let ring = self.ring(input.members());
        Ok(input
            .queues()
            .iter()
            .filter(|q| Self::route(&ring, q) == Some(index))
            .cloned()
            .collect())
    }
}

/// The machine room of a broker by RocketMQ's naming convention `room@brokerName`: the part
/// before `@` when Java's `brokerName.split("@")` gives exactly two parts (trailing empty
/// parts dropped, as Java does), else `None`.
pub fn broker_machine_room(broker_name: &str) -> Option<&str> {
    let mut parts: Vec<&str> = broker_name.split('@').collect();
    while parts.len() > 1 && parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    match parts.as_slice() {
        [room, _] => Some(room),
        _ => None,
    }
}

/// `MACHINE_ROOM` (Java `AllocateMessageQueueByMachineRoom`): only queues of brokers named
/// `room@name` with `room` in [`consume_rooms`](super::AllocationContext::consume_rooms) are
/// allocated, `⌊k/m⌋` contiguous ones to each member plus one of the `k % m` remaining to the
/// first members. Queues of other rooms are left unowned, as in Java.
#[derive(Debug, Clone, Copy, Default)]
pub struct MachineRoom;

impl AllocateStrategy for MachineRoom {
    fn name(&self) -> String {
        "MACHINE_ROOM".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        let pre = Self::consumed(input);
        let mut a = Assignment::new();
        for (index, m) in input.members().iter().enumerate() {
            a.insert(m.clone(), Self::share(input, &pre, index));
        }
        Ok(a)
    }

    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        let Some(index) = input.member_index(member) else {
            return Ok(Vec::new());
        };
        Ok(Self::share(input, &Self::consumed(input), index))
    }
}

impl MachineRoom {
    /// The queues of the consumed rooms, in queue order.
    fn consumed<'i>(input: &'i AllocationInput<'_>) -> Vec<&'i MessageQueue> {
        let rooms = &input.context().consume_rooms;
        input
            .queues()
            .iter()
            .filter(|q| broker_machine_room(&q.broker_name).is_some_and(|r| rooms.contains(r)))
            .collect()
    }

    /// Member `index`'s share of the consumed queues `pre`.
    fn share(
        input: &AllocationInput<'_>,
        pre: &[&MessageQueue],
        index: usize,
    ) -> Vec<MessageQueue> {
        let m = input.members().len();
        let per = pre.len() / m;
        let rem = pre.len() % m;
        let start = per * index;
        let mut out: Vec<MessageQueue> = pre
            .get(start..start + per)
            .unwrap_or(&[])
            .iter()
            .map(|q| (*q).clone())
            .collect();
        if rem > index {
            if let Some(q) = pre.get(index + per * m) {
                out.push((*q).clone());
            }
        }
        out
    }
}

/// `MACHINE_ROOM_NEARBY-<inner>` (Java `AllocateMachineRoomNearby`): queues of a machine
/// room are shared by the members in that room with the inner strategy; queues of a room
/// with no member are shared by all members with the inner strategy.
///
/// Rooms come from the context: [`member_zones`](super::AllocationContext::member_zones) for
/// members (a member without a room is an error, as in Java), and
/// [`broker_zones`](super::AllocationContext::broker_zones) or else the `room@name`
/// convention for brokers (a broker with neither is an error).
#[derive(Debug)]
pub struct MachineRoomNearby {
    inner: Box<dyn AllocateStrategy>,
}

impl MachineRoomNearby {
    /// Wraps `inner`, the strategy used within each room.
    pub fn new(inner: Box<dyn AllocateStrategy>) -> Self {
        Self { inner }
    }

    fn broker_room<'c>(input: &'c AllocationInput<'_>, mq: &'c MessageQueue) -> Result<&'c str> {
        input
            .context()
            .broker_zones
            .get(&mq.broker_name)
            .map(String::as_str)
            .or_else(|| broker_machine_room(&mq.broker_name))
            .filter(|r| !r.is_empty())
            .ok_or_else(|| GroupError::BrokerZoneMissing(mq.broker_name.clone()))
    }

    fn member_room<'c>(input: &'c AllocationInput<'_>, member: &str) -> Result<&'c str> {
        input
            .context()
            .member_zones
            .get(member)
            .map(String::as_str)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| GroupError::MemberZoneMissing(member.to_string()))
    }

    /// Queues by room and members by room (both sorted, as the input is).
    #[allow(clippy::type_complexity)]
    fn rooms<'c>(
        input: &'c AllocationInput<'_>,
    ) -> Result<(
        BTreeMap<&'c str, Vec<MessageQueue>>,
        BTreeMap<&'c str, Vec<String>>,
    )> {
        let mut mq_rooms: BTreeMap<&str, Vec<MessageQueue>> = BTreeMap::new();
        for q in input.queues() {
            mq_rooms
                .entry(Self::broker_room(input, q)?)
                .or_default()
                .push(q.clone());
        }
        let mut member_rooms: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for m in input.members() {
            member_rooms
                .entry(Self::member_room(input, m)?)
                .or_default()
                .push(m.clone());
        }
        Ok((mq_rooms, member_rooms))
    }
}

impl AllocateStrategy for MachineRoomNearby {
    fn name(&self) -> String {
        format!("MACHINE_ROOM_NEARBY-{}", self.inner.name())
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        let (mq_rooms, member_rooms) = Self::rooms(input)?;
        let mut lists: BTreeMap<String, Vec<MessageQueue>> = input
            .members()
            .iter()
            .map(|m| (m.clone(), Vec::new()))
            .collect();
        for (room, queues) in mq_rooms {
            // A room with members shares its queues among them; a room without members
            // shares its queues among all members (each such room separately, as Java).
            let members: Vec<String> = match member_rooms.get(room) {
                Some(members) => members.clone(),
                None => input.members().to_vec(),
            };
            let sub = AllocationInput::new(input.consumer_group(), queues, members)
                .with_context(input.context());
            for (m, qs) in self.inner.allocate_all(&sub)?.iter() {
                if let Some(list) = lists.get_mut(m) {
                    list.extend(qs.iter().cloned());
                }
            }
        }
        let mut a = Assignment::new();
        for (m, qs) in lists {
            a.insert(m, qs);
        }
        Ok(a)
    }

    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        if input.member_index(member).is_none() {
            return Ok(Vec::new());
        }
        let (mut mq_rooms, member_rooms) = Self::rooms(input)?;
        let mine = Self::member_room(input, member)?;
        let mut out = Vec::new();
        if let (Some(queues), Some(members)) = (mq_rooms.remove(mine), member_rooms.get(mine)) {
            let sub = AllocationInput::new(input.consumer_group(), queues, members.iter().cloned())
                .with_context(input.context());
            out.extend(self.inner.allocate(&sub, member)?);
        }
        for (room, queues) in mq_rooms {
            if member_rooms.contains_key(room) {
                continue;
            }
            let sub = AllocationInput::new(
                input.consumer_group(),
                queues,
                input.members().iter().cloned(),
            )
            .with_context(input.context());
            out.extend(self.inner.allocate(&sub, member)?);
        }
        out.sort_by(queue_cmp);
        Ok(out)
    }
}

/// `CONFIG` (Java `AllocateMessageQueueByConfig`): each member takes the queues configured
/// for it in [`configured`](super::AllocationContext::configured). Unlike Java, configured
/// queues that are not in the current queue list are dropped. Exclusivity and completeness
/// are the configuration's business.
#[derive(Debug, Clone, Copy, Default)]
pub struct ByConfig;

impl AllocateStrategy for ByConfig {
    fn name(&self) -> String {
        "CONFIG".into()
    }

    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment> {
        all_from_each(self, input)
    }

    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        if input.member_index(member).is_none() {
            return Ok(Vec::new());
        }
        let mut out: Vec<MessageQueue> = input
            .context()
            .configured
            .get(member)
            .map(|qs| {
                qs.iter()
                    .filter(|q| input.queues().binary_search_by(|k| queue_cmp(k, q)).is_ok())
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(queue_cmp);
        out.dedup();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::AllocationContext;
    use super::*;

    fn queues(n: i32) -> Vec<MessageQueue> {
        (0..n)
            .map(|i| MessageQueue::new("T", "broker-a", i))
            .collect()
    }

    fn ids(qs: &[MessageQueue]) -> Vec<i32> {
        qs.iter().map(|q| q.queue_id).collect()
    }

    fn shares(s: &dyn AllocateStrategy, n: i32, members: &[&str]) -> Vec<Vec<i32>> {
        let input = AllocationInput::new("g", queues(n), members.iter().copied());
        members
            .iter()
            .map(|m| ids(&s.allocate(&input, m).unwrap()))
            .collect()
    }

    /// Java's `AllocateMessageQueueAveragely` on a table of cases (queues 0..n, members
    /// c0..: shares in member order), computed from the Java algorithm.
    #[test]
    fn averagely_matches_java_table() {
        type Case<'a> = (i32, &'a [&'a str], &'a [&'a [i32]]);
        let cases: &[Case<'_>] = &[
            (8, &["c0", "c1", "c2"], &[&[0, 1, 2], &[3, 4, 5], &[6, 7]]),
            (5, &["c0", "c1", "c2"], &[&[0, 1], &[2, 3], &[4]]),
            (2, &["c0", "c1", "c2"], &[&[0], &[1], &[]]),
            (3, &["c0", "c1", "c2"], &[&[0], &[1], &[2]]),
            (
                10,
                &["c0", "c1", "c2", "c3"],
                &[&[0, 1, 2], &[3, 4, 5], &[6, 7], &[8, 9]],
            ),
            (4, &["c0"], &[&[0, 1, 2, 3]]),
            (0, &["c0", "c1"], &[&[], &[]]),
            (7, &["c0", "c1"], &[&[0, 1, 2, 3], &[4, 5, 6]]),
            (
                16,
                &["c0", "c1", "c2", "c3", "c4"],
                &[
                    &[0, 1, 2, 3],
                    &[4, 5, 6],
                    &[7, 8, 9],
                    &[10, 11, 12],
                    &[13, 14, 15],
                ],
            ),
        ];
        for (n, members, want) in cases {
            let got = shares(&Averagely, *n, members);
            let want: Vec<Vec<i32>> = want.iter().map(|w| w.to_vec()).collect();
            assert_eq!(got, want, "{n} queues, {} members", members.len());
        }
    }

    #[test]
    fn averagely_sorts_members_in_java_order() {
        // Java sorts "c10" before "c2"; and U+FF61 after U+1F600 (UTF-16 order).
        let got = shares(&Averagely, 3, &["c2", "c10", "c1"]);
        assert_eq!(got, vec![vec![2], vec![1], vec![0]]);
        let got = shares(&Averagely, 2, &["\u{FF61}", "\u{1F600}"]);
        assert_eq!(got, vec![vec![1], vec![0]]);
        // Not a member: nothing.
        let input = AllocationInput::new("g", queues(3), ["a"]);
        assert!(Averagely.allocate(&input, "b").unwrap().is_empty());
    }

    #[test]
    fn by_circle_matches_java_table() {
        assert_eq!(
            shares(&AveragelyByCircle, 8, &["c0", "c1", "c2"]),
            vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5]]
        );
        assert_eq!(
            shares(&AveragelyByCircle, 2, &["c0", "c1", "c2"]),
            vec![vec![0], vec![1], vec![]]
        );
        assert_eq!(
            shares(&AveragelyByCircle, 5, &["c0", "c1"]),
            vec![vec![0, 2, 4], vec![1, 3]]
        );
    }

    #[test]
    fn seed_example_3_3_2() {
        for s in [&Averagely as &dyn AllocateStrategy, &AveragelyByCircle] {
            let loads: Vec<usize> = shares(s, 8, &["c0", "c1", "c2"])
                .iter()
                .map(Vec::len)
                .collect();
            assert_eq!(loads, [3, 3, 2], "{}", s.name());
        }
    }

    #[test]
    fn consistent_hash_routes_on_md5_ring() {
        let members = ["c0", "c1", "c2"];
        let s = ConsistentHash::new(4).unwrap();
        let input = AllocationInput::new("g", queues(20), members);
        let all = s.allocate_all(&input).unwrap();
        // Check every queue against a direct walk of the ring.
        let mut points: Vec<(i64, &str)> = Vec::new();
        for m in members {
            for v in 0..4 {
                points.push((java_md5_hash(&format!("{m}-{v}")), m));
            }
        }
        points.sort();
        for q in input.queues() {
            let h = java_md5_hash(&java_message_queue_string(q));
            let owner = points
                .iter()
                .find(|(p, _)| *p >= h)
                .or(points.first())
                .map(|(_, m)| *m)
                .unwrap();
            assert!(all.queues_of(owner).contains(q));
        }
        assert!(all.coverage(input.queues()).is_exclusive_and_complete());
        let none = ConsistentHash::new(0)
            .unwrap()
            .allocate_all(&input)
            .unwrap();
        assert_eq!(none.coverage(input.queues()).unowned, 20);
        assert!(ConsistentHash::new(MAX_VIRTUAL_NODES + 1).is_err());
    }

    #[test]
    fn machine_room_split_is_java_split() {
        assert_eq!(broker_machine_room("hz@broker-a"), Some("hz"));
        assert_eq!(broker_machine_room("broker-a"), None);
        assert_eq!(broker_machine_room("hz@"), None);
        assert_eq!(broker_machine_room("@b"), Some(""));
        assert_eq!(broker_machine_room("a@b@c"), None);
    }

    #[test]
    fn machine_room_takes_configured_rooms_only() {
        let mut qs = Vec::new();
        for b in ["hz@b1", "sh@b2", "plain"] {
            for i in 0..4 {
                qs.push(MessageQueue::new("T", b, i));
            }
        }
        let ctx = AllocationContext {
            consume_rooms: ["hz".to_string()].into_iter().collect(),
            ..Default::default()
        };
        let input = AllocationInput::new("g", qs, ["c0", "c1", "c2"]).with_context(&ctx);
        let a = MachineRoom.allocate_all(&input).unwrap();
        let loads: Vec<usize> = a.iter().map(|(_, q)| q.len()).collect();
        assert_eq!(loads, [2, 1, 1]);
        // Java: c0 gets premq[0] and premq[0 + 1*3] = queues 0 and 3.
        assert_eq!(ids(a.queues_of("c0")), [0, 3]);
        assert!(a
            .iter()
            .flat_map(|(_, q)| q)
            .all(|q| q.broker_name == "hz@b1"));
    }

    #[test]
    fn nearby_keeps_rooms_local_and_shares_orphans() {
        let mut qs = Vec::new();
        for b in ["hz@b1", "sh@b2", "bj@b3"] {
            for i in 0..4 {
                qs.push(MessageQueue::new("T", b, i));
            }
        }
        let ctx = AllocationContext {
            member_zones: [("c0", "hz"), ("c1", "hz"), ("c2", "sh")]
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            ..Default::default()
        };
        let s = MachineRoomNearby::new(Box::new(Averagely));
        let input = AllocationInput::new("g", qs, ["c0", "c1", "c2"]).with_context(&ctx);
        let a = s.allocate_all(&input).unwrap();
        assert!(a.coverage(input.queues()).is_exclusive_and_complete());
        for q in a.queues_of("c2") {
            assert_ne!(q.broker_name, "hz@b1");
        }
        assert_eq!(
            a.queues_of("c2")
                .iter()
                .filter(|q| q.broker_name == "sh@b2")
                .count(),
            4
        );
        for m in input.members() {
            assert_eq!(a.queues_of(m), s.allocate(&input, m).unwrap().as_slice());
        }
        // Missing member zone is an error, not a panic.
        let bad = AllocationInput::new("g", queues(2), ["zz"]).with_context(&ctx);
        assert!(matches!(
            s.allocate_all(&bad),
            Err(GroupError::BrokerZoneMissing(_))
        ));
        let ctx2 = AllocationContext::default();
        let bad = AllocationInput::new("g", input.queues().to_vec(), ["zz"]).with_context(&ctx2);
        assert!(matches!(
            s.allocate(&bad, "zz"),
            Err(GroupError::MemberZoneMissing(_))
        ));
    }

    #[test]
    fn by_config_returns_configured_existing_queues() {
        let q = queues(4);
        let ctx = AllocationContext {
            configured: [
                (
                    "c0".to_string(),
                    vec![q[1].clone(), MessageQueue::new("X", "y", 9)],
                ),
                ("c1".to_string(), vec![q[0].clone(), q[2].clone()]),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        let input = AllocationInput::new("g", q, ["c0", "c1", "c2"]).with_context(&ctx);
        assert_eq!(ids(&ByConfig.allocate(&input, "c0").unwrap()), [1]);
        assert_eq!(ids(&ByConfig.allocate(&input, "c1").unwrap()), [0, 2]);
        assert!(ByConfig.allocate(&input, "c2").unwrap().is_empty());
        assert!(ByConfig.allocate(&input, "c9").unwrap().is_empty());
    }
}
