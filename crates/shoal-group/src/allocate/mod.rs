//! Allocation strategies: who consumes which message queue of a consumer group.
//!
//! Every strategy is a pure function of an [`AllocationInput`]: the consumer group, the
//! message queues (sorted in Java's `MessageQueue.compareTo` order), the member (client) ids
//! (sorted in Java's `String.compareTo` order) and an optional [`AllocationContext`] (machine
//! rooms, a configured list, the previous assignment). [`AllocationInput::new`] sorts and
//! de-duplicates both lists, so results never depend on the order the caller found them in.
//!
//! Two views of one strategy, which always agree:
//! - [`AllocateStrategy::allocate`]: the queues of one member (classic mode: each client
//!   computes its own share, as RocketMQ's `AllocateMessageQueueStrategy.allocate`);
//! - [`AllocateStrategy::allocate_all`]: the whole [`Assignment`] (coordinated mode: the broker
//!   computes the target assignment of the group).
//!
//! Strategies and the names the client configuration spells (see [`strategy_by_name`]):
//!
//! | name | strategy | balance (max load − min load) |
//! |---|---|---|
//! | `AVG` | [`Averagely`] (byte-for-byte Java) | ≤ 1 |
//! | `AVG_BY_CIRCLE` | [`AveragelyByCircle`] | ≤ 1 |
//! | `CONSISTENT_HASH[:n]` | [`ConsistentHash`] (n virtual nodes, default 10) | none |
//! | `MACHINE_ROOM` | [`MachineRoom`] (queues of the configured rooms only) | ≤ 1 over those |
//! | `MACHINE_ROOM_NEARBY[-INNER]` | [`MachineRoomNearby`] around an inner strategy | per room |
//! | `CONFIG` | [`ByConfig`] | as configured |
//! | `RANGE` | [`Range`] (Kafka, per topic) | ≤ 1 per topic, ≤ #topics overall |
//! | `ROUND_ROBIN` | [`RoundRobin`] (Kafka) | ≤ 1 |
//! | `STICKY` | [`Sticky`] (Kafka) | ≤ 1 |
//! | `COOPERATIVE_STICKY` | [`CooperativeSticky`] (Kafka) | ≤ 1 once converged |
//! | `BALANCED_STICKY` | [`BalancedSticky`] (Shoal) | ≤ 1 |

mod balanced;
mod hash;
mod kafka;
mod rocketmq;

pub use balanced::BalancedSticky;
pub use hash::{java_md5_hash, java_message_queue_string};
pub use kafka::{CooperativeSticky, Range, RoundRobin, Sticky};
pub use rocketmq::{
    broker_machine_room, Averagely, AveragelyByCircle, ByConfig, ConsistentHash, MachineRoom,
    MachineRoomNearby,
};

use crate::error::{GroupError, Result};
use serde::{Deserialize, Serialize};
use shoal_proto::mq::{java_str_cmp, MessageQueue};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// Optional facts a strategy may need besides queues and members.
///
/// Strategies ignore what they do not use; all fields are empty by default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationContext {
    /// Member id -> machine room (zone) it runs in ([`MachineRoomNearby`]).
    #[serde(default)]
    pub member_zones: BTreeMap<String, String>,
    /// Broker name -> machine room it runs in ([`MachineRoomNearby`]). A broker missing here
    /// falls back to RocketMQ's naming convention `room@brokerName` ([`broker_machine_room`]).
    #[serde(default)]
    pub broker_zones: BTreeMap<String, String>,
    /// Machine rooms whose queues the group consumes (Java's `consumeridcs`, [`MachineRoom`]).
    #[serde(default)]
    pub consume_rooms: BTreeSet<String>,
    /// Member id -> queues configured for it ([`ByConfig`]).
    #[serde(default)]
    pub configured: BTreeMap<String, Vec<MessageQueue>>,
    /// The assignment in force before this round ([`Sticky`], [`CooperativeSticky`]).
    #[serde(default)]
    pub previous: Option<Assignment>,
}

static EMPTY_CONTEXT: AllocationContext = AllocationContext {
    member_zones: BTreeMap::new(),
    broker_zones: BTreeMap::new(),
    consume_rooms: BTreeSet::new(),
    configured: BTreeMap::new(),
    previous: None,
};

/// The inputs of one allocation: group, sorted queues, sorted members, context.
#[derive(Debug, Clone)]
pub struct AllocationInput<'a> {
    consumer_group: &'a str,
    queues: Vec<MessageQueue>,
    members: Vec<String>,
    context: &'a AllocationContext,
}

impl<'a> AllocationInput<'a> {
    /// Builds an input with an empty context; sorts queues (Java `MessageQueue` order) and
    /// members (Java `String` order) and drops duplicates.
    pub fn new<M: Into<String>>(
        consumer_group: &'a str,
        queues: impl IntoIterator<Item = MessageQueue>,
        members: impl IntoIterator<Item = M>,
    ) -> Self {
        let mut queues: Vec<MessageQueue> = queues.into_iter().collect();
        queues.sort_by(queue_cmp);
        queues.dedup();
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort_by(|a, b| member_cmp(a, b));
        members.dedup();
        Self {
            consumer_group,
            queues,
            members,
            context: &EMPTY_CONTEXT,
        }
    }

    /// The same input with a context.
    pub fn with_context(mut self, context: &'a AllocationContext) -> Self {
        self.context = context;
        self
    }

    /// The consumer group.
    pub fn consumer_group(&self) -> &str {
        self.consumer_group
    }

    /// The queues, sorted and distinct.
    pub fn queues(&self) -> &[MessageQueue] {
        &self.queues
    }

    /// The member ids, sorted in Java order and distinct.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// The context.
    pub fn context(&self) -> &AllocationContext {
        self.context
    }

    /// Position of `member` in [`members`](Self::members), if present.
    pub fn member_index(&self, member: &str) -> Option<usize> {
        self.members
            .binary_search_by(|m| member_cmp(m, member))
            .ok()
    }
}

/// A whole assignment: member id -> the queues it owns (sorted).
///
/// Every member of the input has an entry, possibly empty. Serialises as a JSON object
/// `{"member": [queue, ...]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Assignment {
    owned: BTreeMap<String, Vec<MessageQueue>>,
}

/// How well an assignment covers a list of queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// Queues of the list that nobody owns.
    pub unowned: usize,
    /// Queues of the list owned by more than one member.
    pub shared: usize,
    /// Assigned queues that are not in the list.
    pub foreign: usize,
}

impl Coverage {
    /// True when every queue has exactly one owner and nothing else is assigned.
    pub fn is_exclusive_and_complete(&self) -> bool {
        self.unowned == 0 && self.shared == 0 && self.foreign == 0
    }
}

impl Assignment {
    /// An empty assignment.
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives `member` the queues `queues` (replacing what it had); the list is sorted.
    pub fn insert(&mut self, member: impl Into<String>, mut queues: Vec<MessageQueue>) {
        queues.sort_by(queue_cmp);
        queues.dedup();
        self.owned.insert(member.into(), queues);
    }

    /// An assignment with an empty entry for each member.
    pub fn with_members<'m>(members: impl IntoIterator<Item = &'m String>) -> Self {
        Self {
            owned: members
                .into_iter()
                .map(|m| (m.clone(), Vec::new()))
                .collect(),
        }
    }

    /// Builds an assignment from `owner[i]` = index into `members` of the owner of `queues[i]`.
    pub(crate) fn from_owner_indices(
        queues: &[MessageQueue],
        members: &[String],
        owner: &[Option<usize>],
    ) -> Self {
        let mut lists: Vec<Vec<MessageQueue>> = vec![Vec::new(); members.len()];
        for (q, o) in queues.iter().zip(owner) {
            if let Some(list) = o.and_then(|i| lists.get_mut(i)) {
                list.push(q.clone());
            }
        }
        let mut a = Self::new();
        for (m, list) in members.iter().zip(lists) {
            a.insert(m.clone(), list);
        }
        a
    }

    /// The queues of `member` (empty if it has none or is unknown).
    pub fn queues_of(&self, member: &str) -> &[MessageQueue] {
        self.owned.get(member).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Members and their queues.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Vec<MessageQueue>)> {
        self.owned.iter()
    }

    /// The members that have an entry.
    pub fn members(&self) -> impl Iterator<Item = &String> {
        self.owned.keys()
    }

    /// Number of members with an entry.
    pub fn member_count(&self) -> usize {
        self.owned.len()
    }

    /// Queue -> its owners.
    pub fn owners(&self) -> HashMap<&MessageQueue, Vec<&str>> {
        let mut map: HashMap<&MessageQueue, Vec<&str>> = HashMap::new();
        for (m, qs) in &self.owned {
            for q in qs {
                map.entry(q).or_default().push(m.as_str());
            }
        }
        map
    }

    /// Queue -> its single owner; queues with several owners are left out.
    pub fn sole_owners(&self) -> HashMap<&MessageQueue, &str> {
        self.owners()
            .into_iter()
            .filter_map(|(q, o)| match o.as_slice() {
                [one] => Some((q, *one)),
                _ => None,
            })
            .collect()
    }

    /// Smallest and largest load over the members with an entry (`(0, 0)` when none).
    pub fn load_range(&self) -> (usize, usize) {
        let loads = self.owned.values().map(Vec::len);
        let min = loads.clone().min().unwrap_or(0);
        let max = loads.max().unwrap_or(0);
        (min, max)
    }

    /// How this assignment covers `queues`.
    pub fn coverage(&self, queues: &[MessageQueue]) -> Coverage {
        let owners = self.owners();
        let mut c = Coverage::default();
        for q in queues {
            match owners.get(q).map(Vec::len).unwrap_or(0) {
                0 => c.unowned += 1,
                1 => {}
                _ => c.shared += 1,
            }
        }
        let known: std::collections::HashSet<&MessageQueue> = queues.iter().collect();
        c.foreign = owners.keys().filter(|q| !known.contains(*q)).count();
        c
    }
}

/// Java's `String.compareTo` order (UTF-16 code units), with a fast path for ASCII, where
/// it is byte order.
pub fn member_cmp(a: &str, b: &str) -> Ordering {
    if a.is_ascii() && b.is_ascii() {
        a.cmp(b)
    } else {
        java_str_cmp(a, b)
    }
}

/// Java's `MessageQueue.compareTo` order (the same as `MessageQueue`'s `Ord`), with
/// [`member_cmp`]'s fast path for the names.
pub fn queue_cmp(a: &MessageQueue, b: &MessageQueue) -> Ordering {
    member_cmp(&a.topic, &b.topic)
        .then_with(|| member_cmp(&a.broker_name, &b.broker_name))
        .then_with(|| a.queue_id.cmp(&b.queue_id))
}

/// An allocation strategy: both views of one pure function.
pub trait AllocateStrategy: fmt::Debug + Send + Sync {
    /// The name the client configuration spells, e.g. `AVG` (Java's `getName()` for
    /// RocketMQ's strategies).
    fn name(&self) -> String;

    /// The whole assignment: an entry for every member of the input.
    fn allocate_all(&self, input: &AllocationInput<'_>) -> Result<Assignment>;

    /// The queues of `member` (empty when it is not a member). Always equal to
    /// `allocate_all(input)?.queues_of(member)`; strategies override it when one member's
    /// share is cheaper to compute alone.
    fn allocate(&self, input: &AllocationInput<'_>, member: &str) -> Result<Vec<MessageQueue>> {
        Ok(self.allocate_all(input)?.queues_of(member).to_vec())
    }
}

/// Builds the whole assignment from a per-member view.
pub(crate) fn all_from_each<S: AllocateStrategy + ?Sized>(
    s: &S,
    input: &AllocationInput<'_>,
) -> Result<Assignment> {
    let mut a = Assignment::new();
    for m in input.members() {
        a.insert(m.clone(), s.allocate(input, m)?);
    }
    Ok(a)
}

/// The names [`strategy_by_name`] answers to (canonical spelling).
pub const STRATEGY_NAMES: &[&str] = &[
    "AVG",
    "AVG_BY_CIRCLE",
    "CONSISTENT_HASH",
    "MACHINE_ROOM",
    "MACHINE_ROOM_NEARBY",
    "CONFIG",
    "RANGE",
    "ROUND_ROBIN",
    "STICKY",
    "COOPERATIVE_STICKY",
    "BALANCED_STICKY",
];

/// Looks a strategy up by name, case-insensitively, `-` and `_` alike.
///
/// Accepted: the names of [`STRATEGY_NAMES`]; Kafka's spellings `roundrobin` and
/// `cooperative-sticky`; `CONSISTENT_HASH:<virtual nodes>`; `MACHINE_ROOM_NEARBY-<inner>`
/// (inner defaults to `AVG`, e.g. `MACHINE_ROOM_NEARBY-BALANCED_STICKY`).
pub fn strategy_by_name(name: &str) -> Result<Box<dyn AllocateStrategy>> {
    let norm = name.trim().to_ascii_uppercase().replace('-', "_");
    if let Some(rest) = norm.strip_prefix("MACHINE_ROOM_NEARBY") {
        let inner = rest.strip_prefix('_').unwrap_or(rest);
        let inner = if inner.is_empty() { "AVG" } else { inner };
        if inner.starts_with("MACHINE_ROOM_NEARBY") {
            return Err(GroupError::UnknownStrategy(name.to_string()));
        }
        return Ok(Box::new(MachineRoomNearby::new(strategy_by_name(inner)?)));
    }
    if let Some(count) = norm.strip_prefix("CONSISTENT_HASH:") {
        let n: usize = count.parse().map_err(|_| {
            GroupError::InvalidParameter(format!("virtual node count {count:?} is not a number"))
        })?;
        return Ok(Box::new(ConsistentHash::new(n)?));
    }
    let s: Box<dyn AllocateStrategy> = match norm.as_str() {
        "AVG" | "AVERAGELY" => Box::new(Averagely),
        "AVG_BY_CIRCLE" | "AVERAGELY_BY_CIRCLE" => Box::new(AveragelyByCircle),
        "CONSISTENT_HASH" => Box::new(ConsistentHash::default()),
        "MACHINE_ROOM" => Box::new(MachineRoom),
        "CONFIG" | "BY_CONFIG" => Box::new(ByConfig),
        "RANGE" => Box::new(Range),
        "ROUND_ROBIN" | "ROUNDROBIN" => Box::new(RoundRobin),
        "STICKY" => Box::new(Sticky),
        "COOPERATIVE_STICKY" => Box::new(CooperativeSticky),
        "BALANCED_STICKY" => Box::new(BalancedSticky::default()),
        _ => return Err(GroupError::UnknownStrategy(name.to_string())),
    };
    Ok(s)
}

/// Queues that changed owner between `before` and `after`: owned by exactly one member in
/// both, and by different members. A queue that gains its first owner, or loses its last
/// one, is not a move.
pub fn moved_queues(before: &Assignment, after: &Assignment) -> usize {
    let b = before.sole_owners();
    after
        .sole_owners()
        .into_iter()
        .filter(|(q, owner)| b.get(q).is_some_and(|prev| prev != owner))
        .count()
}

/// The fewest moves (as [`moved_queues`] counts them) that any assignment of `queues` to
/// `members` with loads differing by at most one needs, starting from `before`.
///
/// With `n` queues, `m` members, `base = n / m` and `r = n % m` members allowed `base + 1`:
/// member `i` can keep at most `min(p_i, base)` of the `p_i` queues it owned before, plus one
/// more for at most `r` members with `p_i > base`. Every other queue that had an owner moves.
pub fn minimum_moves(before: &Assignment, queues: &[MessageQueue], members: &[String]) -> usize {
    if members.is_empty() || queues.is_empty() {
        return 0;
    }
    let n = queues.len();
    let base = n / members.len();
    let r = n % members.len();
    let owners = before.sole_owners();
    let index: HashMap<&str, usize> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    let mut kept = vec![0usize; members.len()];
    let mut had_owner = 0usize;
    for q in queues {
        if let Some(owner) = owners.get(q) {
            had_owner += 1;
            if let Some(&i) = index.get(owner) {
                if let Some(k) = kept.get_mut(i) {
                    *k += 1;
                }
            }
        }
    }
    let retained: usize = kept.iter().map(|&p| p.min(base)).sum::<usize>()
        + kept.iter().filter(|&&p| p > base).count().min(r);
    had_owner - retained
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qs(n: i32) -> Vec<MessageQueue> {
        (0..n).map(|i| MessageQueue::new("T", "b", i)).collect()
    }

    #[test]
    fn input_sorts_and_dedups() {
        let input = AllocationInput::new(
            "g",
            vec![qs(3)[2].clone(), qs(3)[0].clone(), qs(3)[2].clone()],
            vec!["b", "a", "b", "\u{FF61}", "\u{1F600}"],
        );
        assert_eq!(input.queues().len(), 2);
        assert_eq!(input.members(), ["a", "b", "\u{1F600}", "\u{FF61}"]);
        assert_eq!(input.member_index("\u{FF61}"), Some(3));
        assert_eq!(input.member_index("zz"), None);
    }

    #[test]
    fn fast_orders_agree_with_java() {
        let words = [
            "",
            "a",
            "b",
            "ab",
            "B",
            "\u{FF61}",
            "\u{1F600}",
            "a\u{1F600}",
            "\u{e9}",
        ];
        for a in words {
            for b in words {
                assert_eq!(member_cmp(a, b), java_str_cmp(a, b), "{a:?} {b:?}");
                let (x, y) = (MessageQueue::new(a, b, 1), MessageQueue::new(b, a, 2));
                assert_eq!(queue_cmp(&x, &y), x.cmp(&y));
            }
        }
    }

    #[test]
    fn names_resolve() {
        for name in STRATEGY_NAMES {
            let s = strategy_by_name(name).unwrap();
            assert!(s.name().starts_with(name), "{name} -> {}", s.name());
        }
        assert_eq!(
            strategy_by_name("roundrobin").unwrap().name(),
            "ROUND_ROBIN"
        );
        assert_eq!(
            strategy_by_name("cooperative-sticky").unwrap().name(),
            "COOPERATIVE_STICKY"
        );
        assert_eq!(
            strategy_by_name("machine_room_nearby-balanced-sticky")
                .unwrap()
                .name(),
            "MACHINE_ROOM_NEARBY-BALANCED_STICKY"
        );
        assert_eq!(
            strategy_by_name("CONSISTENT_HASH:3").unwrap().name(),
            "CONSISTENT_HASH"
        );
        assert!(matches!(
            strategy_by_name("nope"),
            Err(GroupError::UnknownStrategy(_))
        ));
        assert!(strategy_by_name("CONSISTENT_HASH:x").is_err());
        assert!(strategy_by_name("MACHINE_ROOM_NEARBY-MACHINE_ROOM_NEARBY").is_err());
    }

    #[test]
    fn movement_metrics() {
        let q = qs(6);
        let members: Vec<String> = vec!["a".into(), "b".into()];
        let mut before = Assignment::new();
        before.insert("a", q[..4].to_vec());
        before.insert("b", q[4..].to_vec());
        // Balanced needs 3/3: at least one move.
        assert_eq!(minimum_moves(&before, &q, &members), 1);
        let mut after = Assignment::new();
        after.insert("a", q[..3].to_vec());
        after.insert("b", q[3..].to_vec());
        assert_eq!(moved_queues(&before, &after), 1);
        assert!(after.coverage(&q).is_exclusive_and_complete());
        // A member leaves: its queues must move.
        let one: Vec<String> = vec!["a".into()];
        assert_eq!(minimum_moves(&before, &q, &one), 2);
        assert_eq!(minimum_moves(&before, &q, &[]), 0);
        let c = before.coverage(&q[..5]);
        assert_eq!(c.foreign, 1);
        assert_eq!(before.load_range(), (2, 4));
    }
}
