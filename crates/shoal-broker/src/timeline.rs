//! The rebalance timeline of classic-mode groups, as the broker observes it: each membership or
//! subscription change opens a rebalance; every queue whose puller changes afterwards is a move
//! (from, to, when); the rebalance has converged once every queue of the group is pulled by a
//! current member and nothing moved for [`QUIET_MS`]. Its convergence time is the time of the
//! last move (or of the change itself when nothing had to move).
//!
//! Sans-IO: the broker feeds membership changes and the pullers it saw (with their times) and
//! calls [`Timeline::tick`]; finished rebalances come back to be counted in metrics. Coordinated
//! groups have the coordinator's own history; this one is for groups whose members allocate
//! queues themselves (RocketMQ's model), where the broker only sees the effects.
//!
//! Bounded: [`HISTORY_PER_GROUP`] rebalances per group, [`MAX_GROUPS`] groups (the group seen
//! least recently is forgotten first), [`MAX_MOVES`] moves per rebalance.

use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// Rebalances kept per group.
pub(crate) const HISTORY_PER_GROUP: usize = 32;
/// Groups tracked at once.
pub(crate) const MAX_GROUPS: usize = 1024;
/// Moves kept per rebalance (further ones are counted, not listed).
pub(crate) const MAX_MOVES: usize = 1024;
/// Nothing moved for this long, and every queue has a current member pulling it: converged.
pub(crate) const QUIET_MS: i64 = 2_000;
/// A rebalance still not settled after this long is closed as not converged.
pub(crate) const GIVE_UP_MS: i64 = 120_000;

/// One queue changing hands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    /// Topic.
    pub topic: String,
    /// Queue id.
    pub queue_id: i32,
    /// Who pulled it before (none: nobody since the broker started).
    pub from: Option<String>,
    /// Who pulls it now.
    pub to: String,
    /// When the new owner's first pull arrived (wall clock, ms).
    pub at_ms: i64,
}

/// How a rebalance ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// Still moving queues.
    Converging,
    /// Every queue pulled by a current member, nothing moving.
    Converged,
    /// Another change came first.
    Superseded,
    /// Not settled within [`GIVE_UP_MS`] (e.g. a queue nobody pulls).
    NotConverged,
}

/// One observed rebalance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedRebalance {
    /// Sequence number within the group.
    pub seq: u64,
    /// When the cause happened (wall clock, ms).
    pub at_ms: i64,
    /// `member_joined`, `member_left`, `members_changed`, `subscription_changed` or
    /// `owner_changed` (a queue moved without a membership change).
    pub cause: String,
    /// Client ids that joined.
    pub joined: Vec<String>,
    /// Client ids that left.
    pub left: Vec<String>,
    /// Members after the change.
    pub members: Vec<String>,
    /// Queues that changed hands.
    pub moves: Vec<Move>,
    /// Moves beyond [`MAX_MOVES`] (not listed).
    pub moves_dropped: usize,
    /// When the last needed move happened (or the change itself when none was needed).
    pub converged_at_ms: Option<i64>,
    /// How it ended (so far).
    pub outcome: Outcome,
}

impl ObservedRebalance {
    /// Milliseconds from the cause to convergence.
    pub fn convergence_ms(&self) -> Option<i64> {
        self.converged_at_ms.map(|c| (c - self.at_ms).max(0))
    }
}

#[derive(Debug, Default)]
struct GroupTimeline {
    members: BTreeSet<String>,
    /// (topic, queue) -> (client id, time of its first pull as owner).
    owners: BTreeMap<(String, i32), (String, i64)>,
    history: VecDeque<ObservedRebalance>,
    open: Option<ObservedRebalance>,
    last_event_ms: i64,
    next_seq: u64,
}

impl GroupTimeline {
    /// Opens a rebalance; returns the previous open one, closed: converged when it had
    /// settled (`prev_settled`), superseded otherwise.
    fn open(
        &mut self,
        at_ms: i64,
        cause: &str,
        joined: Vec<String>,
        left: Vec<String>,
        prev_settled: bool,
    ) -> Option<ObservedRebalance> {
        let closed = self.open.take().map(|mut prev| {
            if prev_settled {
                prev.outcome = Outcome::Converged;
                prev.converged_at_ms = Some(
                    prev.moves
                        .iter()
                        .map(|m| m.at_ms)
                        .max()
                        .unwrap_or(prev.at_ms),
                );
            } else {
                prev.outcome = Outcome::Superseded;
            }
            self.push(prev.clone());
            prev
        });
        self.next_seq += 1;
        self.open = Some(ObservedRebalance {
            seq: self.next_seq,
            at_ms,
            cause: cause.to_string(),
            joined,
            left,
            members: self.members.iter().cloned().collect(),
            moves: Vec::new(),
            moves_dropped: 0,
            converged_at_ms: None,
            outcome: Outcome::Converging,
        });
        self.last_event_ms = at_ms;
        closed
    }

    fn push(&mut self, r: ObservedRebalance) {
        self.history.push_back(r);
        while self.history.len() > HISTORY_PER_GROUP {
            self.history.pop_front();
        }
    }

    /// Every queue seen is pulled by a current member (or the group has no members left).
    fn settled(&self) -> bool {
        self.members.is_empty()
            || self
                .owners
                .values()
                .all(|(owner, _)| self.members.contains(owner))
    }
}

/// The timelines of every classic group this broker serves.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    groups: HashMap<String, GroupTimeline>,
    /// Client id of each member connection seen (kept after it leaves, so its last pulls
    /// can still be named; bounded).
    conns: HashMap<u64, String>,
    /// Rebalances closed outside `tick` (superseded), returned by the next `tick`.
    closed: Vec<(String, ObservedRebalance)>,
}

impl Timeline {
    /// An empty timeline.
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    fn group(&mut self, group: &str, now_ms: i64) -> &mut GroupTimeline {
        if !self.groups.contains_key(group) && self.groups.len() >= MAX_GROUPS {
            if let Some(oldest) = self
                .groups
                .iter()
                .min_by_key(|(_, g)| g.last_event_ms)
                .map(|(k, _)| k.clone())
            {
                self.groups.remove(&oldest);
            }
        }
        let g = self.groups.entry(group.to_string()).or_default();
        if g.last_event_ms == 0 {
            g.last_event_ms = now_ms;
        }
        g
    }

    /// The group's members are now `members` (after a heartbeat, unregister, expiry or closed
    /// connection); `subscription_changed` when a member's subscriptions changed.
    pub(crate) fn membership(
        &mut self,
        group: &str,
        members: Vec<(u64, String)>,
        subscription_changed: bool,
        now_ms: i64,
    ) {
        if self.conns.len() > 4 * MAX_GROUPS {
            self.conns.clear();
        }
        for (conn, id) in &members {
            self.conns.insert(*conn, id.clone());
        }
        let members: BTreeSet<String> = members.into_iter().map(|(_, id)| id).collect();
        let g = self.group(group, now_ms);
        let joined: Vec<String> = members.difference(&g.members).cloned().collect();
        let left: Vec<String> = g.members.difference(&members).cloned().collect();
        if joined.is_empty() && left.is_empty() && !subscription_changed {
            return;
        }
        let cause = match (joined.is_empty(), left.is_empty()) {
            (false, true) => "member_joined",
            (true, false) => "member_left",
            (false, false) => "members_changed",
            (true, true) => "subscription_changed",
        };
        let prev_settled = g.settled();
        g.members = members;
        if let Some(r) = g.open(now_ms, cause, joined, left, prev_settled) {
            self.closed.push((group.to_string(), r));
        }
    }

    /// The member on connection `conn_id` pulled (topic, queue) at `at_ms` (ignored when the
    /// connection never belonged to a member).
    pub(crate) fn puller_conn(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: i32,
        conn_id: u64,
        at_ms: i64,
    ) {
        if let Some(id) = self.conns.get(&conn_id).cloned() {
            self.puller(group, topic, queue_id, &id, at_ms);
        }
    }

    /// `client_id` pulled (topic, queue) at `at_ms`. A change of puller is a move.
    pub(crate) fn puller(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: i32,
        client_id: &str,
        at_ms: i64,
    ) {
        let g = self.group(group, at_ms);
        let key = (topic.to_string(), queue_id);
        let from = match g.owners.get(&key) {
            Some((owner, _)) if owner == client_id => return,
            Some((owner, since)) if *since > at_ms => {
                // An older observation than the one we have: ignore.
                let _ = owner;
                return;
            }
            Some((owner, _)) => Some(owner.clone()),
            None => None,
        };
        g.owners.insert(key, (client_id.to_string(), at_ms));
        if g.open.is_none() {
            if from.is_none() && g.history.is_empty() {
                // First sight of a queue (e.g. after a broker restart): nothing moved.
                return;
            }
            g.open(at_ms, "owner_changed", Vec::new(), Vec::new(), true);
        }
        g.last_event_ms = g.last_event_ms.max(at_ms);
        if let Some(open) = g.open.as_mut() {
            if open.moves.len() < MAX_MOVES {
                open.moves.push(Move {
                    topic: topic.to_string(),
                    queue_id,
                    from,
                    to: client_id.to_string(),
                    at_ms,
                });
            } else {
                open.moves_dropped += 1;
            }
        }
    }

    /// Closes rebalances that converged or gave up; returns them (for metrics).
    pub(crate) fn tick(&mut self, now_ms: i64) -> Vec<(String, ObservedRebalance)> {
        let mut done = std::mem::take(&mut self.closed);
        for (name, g) in self.groups.iter_mut() {
            let Some(open) = g.open.as_ref() else {
                continue;
            };
            let quiet = now_ms - g.last_event_ms >= QUIET_MS;
            let outcome = if quiet && g.settled() {
                Some(Outcome::Converged)
            } else if now_ms - open.at_ms >= GIVE_UP_MS {
                Some(Outcome::NotConverged)
            } else {
                None
            };
            if let Some(outcome) = outcome {
                let Some(mut r) = g.open.take() else { continue };
                r.outcome = outcome;
                if outcome == Outcome::Converged {
                    r.converged_at_ms =
                        Some(r.moves.iter().map(|m| m.at_ms).max().unwrap_or(r.at_ms));
                }
                done.push((name.clone(), r.clone()));
                g.push(r);
            }
        }
        done
    }

    /// The group's rebalances, oldest first, the open one last.
    pub(crate) fn history(&self, group: &str) -> Vec<ObservedRebalance> {
        self.groups
            .get(group)
            .map(|g| g.history.iter().chain(g.open.iter()).cloned().collect())
            .unwrap_or_default()
    }

    #[cfg(test)]
    /// Who pulls each queue of the group now, per the last pulls seen.
    pub(crate) fn owners(&self, group: &str) -> BTreeMap<(String, i32), String> {
        self.groups
            .get(group)
            .map(|g| {
                g.owners
                    .iter()
                    .map(|(k, (c, _))| (k.clone(), c.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> Vec<(u64, String)> {
        ids.iter()
            .map(|s| (s.bytes().map(u64::from).sum(), s.to_string()))
            .collect()
    }

    #[test]
    fn a_join_moves_queues_and_converges_at_the_last_move() {
        let mut t = Timeline::new();
        t.membership("g", set(&["a"]), false, 1_000);
        t.puller("g", "T", 0, "a", 1_010);
        t.puller("g", "T", 1, "a", 1_020);
        assert!(t.tick(5_000).len() == 1);
        t.membership("g", set(&["a", "b"]), false, 10_000);
        t.puller("g", "T", 0, "a", 10_005); // a still pulls before releasing: no move
        t.puller("g", "T", 1, "b", 10_150);
        assert!(t.tick(11_000).is_empty(), "not quiet yet");
        let done = t.tick(12_200);
        assert_eq!(done.len(), 1);
        let r = &done[0].1;
        assert_eq!(r.cause, "member_joined");
        assert_eq!(r.joined, vec!["b".to_string()]);
        assert_eq!(r.outcome, Outcome::Converged);
        assert_eq!(
            r.moves,
            vec![Move {
                topic: "T".into(),
                queue_id: 1,
                from: Some("a".into()),
                to: "b".into(),
                at_ms: 10_150
            }]
        );
        assert_eq!(r.convergence_ms(), Some(150));
        assert_eq!(t.history("g").len(), 2);
    }

    #[test]
    fn a_leave_waits_until_nobody_gone_owns_a_queue() {
        let mut t = Timeline::new();
        t.membership("g", set(&["a", "b"]), false, 0);
        t.puller("g", "T", 0, "a", 10);
        t.puller("g", "T", 1, "b", 10);
        t.tick(3_000);
        t.membership("g", set(&["a"]), false, 5_000);
        // b's queue is not taken yet: quiet but not settled.
        assert!(t.tick(8_000).is_empty());
        t.puller("g", "T", 1, "a", 8_500);
        let done = t.tick(11_000);
        assert_eq!(done[0].1.cause, "member_left");
        assert_eq!(done[0].1.convergence_ms(), Some(3_500));
    }

    #[test]
    fn a_newer_change_supersedes_and_stale_sightings_are_ignored() {
        let mut t = Timeline::new();
        t.membership("g", set(&["a"]), false, 0);
        t.membership("g", set(&["a", "b"]), false, 100);
        t.puller("g", "T", 0, "b", 200);
        t.puller("g", "T", 0, "a", 150); // older than what we know
        let h = t.history("g");
        // The first had nothing to settle when the second came: it converged at once.
        assert_eq!(h[0].outcome, Outcome::Converged);
        assert_eq!(h[1].moves.len(), 1);
        assert_eq!(t.owners("g").get(&("T".into(), 0)), Some(&"b".to_string()));
        // A change while b's queue is still b's... and b leaves before anyone takes it.
        t.membership("g", set(&["c"]), false, 1_000);
        t.membership("g", set(&["c", "d"]), false, 1_100);
        let done = t.tick(1_100 + GIVE_UP_MS);
        let outcomes: Vec<Outcome> = done.iter().map(|(_, r)| r.outcome).collect();
        assert!(outcomes.contains(&Outcome::Superseded), "{outcomes:?}");
        assert_eq!(
            done.last().map(|(_, r)| r.outcome),
            Some(Outcome::NotConverged)
        );
    }

    #[test]
    fn history_and_groups_are_bounded() {
        let mut t = Timeline::new();
        for i in 0..(HISTORY_PER_GROUP as i64 + 5) {
            let m = if i % 2 == 0 {
                set(&["a"])
            } else {
                set(&["a", "b"])
            };
            t.membership("g", m, false, i * 10);
        }
        assert_eq!(t.history("g").len(), HISTORY_PER_GROUP + 1);
        for i in 0..(MAX_GROUPS + 3) {
            t.membership(&format!("g{i}"), set(&["a"]), false, 1_000 + i as i64);
        }
        assert!(t.groups.len() <= MAX_GROUPS);
    }
}
