//! Queue locks (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ).
//!
//! One lock per (consumer group, message queue), owned by a client id. Two kinds:
//! - **TTL locks** (what Apache RocketMQ brokers keep, and what official orderly clients get):
//!   valid for a TTL (60 s by default, RocketMQ's `rocketmq.broker.rebalance.lockMaxLiveTime`)
//!   after their last renewal; an expired lock may be taken by anyone.
//! - **Session locks** (Shoal members, concurrent and orderly): held as long as the holder's
//!   broker session lasts (see [`crate::membership`]); they never expire by time and are
//!   released by an unlock or when the session ends. A member that asked for a session lock
//!   and was refused is remembered as a *waiter*, so the broker can tell it the moment the
//!   lock frees ([`QueueLockTable::take_waiters`]).
//!
//! A client that leaves loses its locks at once. Sans-IO: the caller passes the time.
//!
//! **Across a failover** (replicated broker groups): the master's live locks
//! ([`QueueLockTable::held`]) reach its replicas, and a new master adopts them
//! ([`QueueLockTable::adopt`]): each is held by the same client id until that client locks it
//! again (it becomes an ordinary lock of the new master), unlocks it, or the hold the old
//! master's lock gave it runs out, so no other member gets the queue while its holder may
//! still consume it under its lease.

use serde::{Deserialize, Serialize};
use shoal_proto::MessageQueue;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Default lock lifetime after the last renewal.
pub const DEFAULT_LOCK_TTL_MS: u64 = 60_000;

/// Most members remembered as waiting for one queue's lock (more wait on their retry timer).
pub const MAX_WAITERS_PER_QUEUE: usize = 64;

#[derive(Debug, Clone)]
struct LockEntry {
    client_id: String,
    last_update_ms: u64,
    /// Session locks: the holder's broker session.
    session: Option<u64>,
    /// Taken for orderly consumption (RocketMQ diverts such groups' retry sends to the DLQ).
    orderly: bool,
    /// Adopted from an older master: held until then (instead of by session or TTL).
    adopted_until: Option<u64>,
}

/// A live lock as a new master adopts it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldLock {
    /// Consumer group.
    pub group: String,
    /// The queue.
    pub queue: MessageQueue,
    /// The holder's client id.
    pub client_id: String,
    /// Taken for orderly consumption.
    pub orderly: bool,
    /// How long the holder may consume under it without renewing, ms: its session timeout
    /// (session locks) or the TTL.
    pub hold_ms: u64,
}

/// The holder of a live lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder<'a> {
    /// Client id.
    pub client_id: &'a str,
    /// The holder's session (session locks).
    pub session: Option<u64>,
}

/// All queue locks of a broker.
#[derive(Debug)]
pub struct QueueLockTable {
    ttl_ms: u64,
    groups: HashMap<String, HashMap<MessageQueue, LockEntry>>,
    /// group -> queue -> client ids refused a session lock on it.
    waiters: HashMap<String, HashMap<MessageQueue, BTreeSet<String>>>,
}

impl QueueLockTable {
    /// A table whose TTL locks expire `ttl_ms` after their last renewal.
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            groups: HashMap::new(),
            waiters: HashMap::new(),
        }
    }

    fn live(&self, e: &LockEntry, now_ms: u64) -> bool {
        entry_live(e, self.ttl_ms, now_ms)
    }

    /// Every live lock, sorted, each with how long its holder may go on without renewing:
    /// `session_hold` of its session (session locks; the TTL when unknown), or what is left of
    /// its TTL.
    pub fn held(
        &self,
        now_ms: u64,
        session_hold: impl Fn(&str, u64) -> Option<u64>,
    ) -> Vec<HeldLock> {
        let session_hold = &session_hold;
        let mut out: Vec<HeldLock> = self
            .groups
            .iter()
            .flat_map(|(group, table)| {
                table
                    .iter()
                    .filter(|(_, e)| self.live(e, now_ms))
                    .map(move |(mq, e)| HeldLock {
                        group: group.clone(),
                        queue: mq.clone(),
                        client_id: e.client_id.clone(),
                        orderly: e.orderly,
                        hold_ms: match (e.adopted_until, e.session) {
                            (Some(until), _) => until.saturating_sub(now_ms),
                            (None, Some(s)) => session_hold(group, s).unwrap_or(self.ttl_ms),
                            (None, None) => self
                                .ttl_ms
                                .saturating_sub(now_ms.saturating_sub(e.last_update_ms)),
                        },
                    })
            })
            .collect();
        out.sort();
        out
    }

    /// Adopts an older master's live locks (this broker became master and took over its
    /// log's state before answering any lock request): they replace the table, whose own
    /// locks and waiters are from an earlier time this broker was master. Each queue is held
    /// by the same client for its `hold_ms` from now, or until that client locks it again or
    /// unlocks it.
    pub fn adopt(&mut self, locks: Vec<HeldLock>, now_ms: u64) {
        self.groups.clear();
        self.waiters.clear();
        for l in locks {
            let table = self.groups.entry(l.group).or_default();
            table.insert(
                l.queue,
                LockEntry {
                    client_id: l.client_id,
                    last_update_ms: now_ms,
                    session: None,
                    orderly: l.orderly,
                    adopted_until: Some(now_ms.saturating_add(l.hold_ms)),
                },
            );
        }
    }

    /// TTL locks (RocketMQ's LOCK_BATCH_MQ, orderly): locks or renews every queue that is
    /// free, expired, or already held by `client_id`; returns the queues `client_id` holds
    /// afterwards among those asked for.
    pub fn lock_batch(
        &mut self,
        group: &str,
        mqs: &[MessageQueue],
        client_id: &str,
        now_ms: u64,
    ) -> BTreeSet<MessageQueue> {
        self.lock_inner(group, mqs, client_id, None, true, now_ms)
    }

    /// Session locks (Shoal members): as [`QueueLockTable::lock_batch`], but the locks taken
    /// last for `session`, and a refused member is remembered as waiting (up to
    /// [`MAX_WAITERS_PER_QUEUE`] per queue).
    pub fn lock_batch_session(
        &mut self,
        group: &str,
        mqs: &[MessageQueue],
        client_id: &str,
        session: u64,
        orderly: bool,
        now_ms: u64,
    ) -> BTreeSet<MessageQueue> {
        let locked = self.lock_inner(group, mqs, client_id, Some(session), orderly, now_ms);
        let waiting = self.waiters.entry(group.to_string()).or_default();
        for mq in mqs {
            if locked.contains(mq) {
                if let Some(w) = waiting.get_mut(mq) {
                    w.remove(client_id);
                    if w.is_empty() {
                        waiting.remove(mq);
                    }
                }
            } else {
                let w = waiting.entry(mq.clone()).or_default();
                if w.len() < MAX_WAITERS_PER_QUEUE {
                    w.insert(client_id.to_string());
                }
            }
        }
        if waiting.is_empty() {
            self.waiters.remove(group);
        }
        locked
    }

    fn lock_inner(
        &mut self,
        group: &str,
        mqs: &[MessageQueue],
        client_id: &str,
        session: Option<u64>,
        orderly: bool,
        now_ms: u64,
    ) -> BTreeSet<MessageQueue> {
        let ttl = self.ttl_ms;
        let table = self.groups.entry(group.to_string()).or_default();
        let mut locked = BTreeSet::new();
        for mq in mqs {
            let take = match table.get(mq) {
                None => true,
                Some(e) => e.client_id == client_id || !entry_live(e, ttl, now_ms),
            };
            if take {
                table.insert(
                    mq.clone(),
                    LockEntry {
                        client_id: client_id.to_string(),
                        last_update_ms: now_ms,
                        session,
                        orderly,
                        adopted_until: None,
                    },
                );
                locked.insert(mq.clone());
            }
        }
        if table.is_empty() {
            self.groups.remove(group);
        }
        locked
    }

    /// Releases the queues that `client_id` holds among `mqs`; returns those released.
    pub fn unlock_batch(
        &mut self,
        group: &str,
        mqs: &[MessageQueue],
        client_id: &str,
    ) -> Vec<MessageQueue> {
        let Some(table) = self.groups.get_mut(group) else {
            return Vec::new();
        };
        let mut released = Vec::new();
        for mq in mqs {
            if table.get(mq).is_some_and(|e| e.client_id == client_id) {
                table.remove(mq);
                released.push(mq.clone());
            }
        }
        if table.is_empty() {
            self.groups.remove(group);
        }
        released
    }

    /// Releases every lock `client_id` holds in `group` (the client left the group) and
    /// forgets it as a waiter; returns the queues released.
    pub fn release_client(&mut self, group: &str, client_id: &str) -> Vec<MessageQueue> {
        if let Some(w) = self.waiters.get_mut(group) {
            w.retain(|_, ids| {
                ids.remove(client_id);
                !ids.is_empty()
            });
            if w.is_empty() {
                self.waiters.remove(group);
            }
        }
        let Some(table) = self.groups.get_mut(group) else {
            return Vec::new();
        };
        let mut released: Vec<MessageQueue> = table
            .iter()
            .filter(|(_, e)| e.client_id == client_id)
            .map(|(mq, _)| mq.clone())
            .collect();
        released.sort();
        for mq in &released {
            table.remove(mq);
        }
        if table.is_empty() {
            self.groups.remove(group);
        }
        released
    }

    /// The members waiting for the locks of `freed` (now free), each with its queues; they
    /// are no longer remembered as waiting.
    pub fn take_waiters(
        &mut self,
        group: &str,
        freed: &[MessageQueue],
    ) -> BTreeMap<String, Vec<MessageQueue>> {
        let mut out: BTreeMap<String, Vec<MessageQueue>> = BTreeMap::new();
        let Some(w) = self.waiters.get_mut(group) else {
            return out;
        };
        for mq in freed {
            if let Some(ids) = w.remove(mq) {
                for id in ids {
                    out.entry(id).or_default().push(mq.clone());
                }
            }
        }
        if w.is_empty() {
            self.waiters.remove(group);
        }
        out
    }

    /// The live owner of a queue's lock, if any.
    pub fn owner(&self, group: &str, mq: &MessageQueue, now_ms: u64) -> Option<&str> {
        self.holder(group, mq, now_ms).map(|h| h.client_id)
    }

    /// The live holder of a queue's lock, with its session (session locks).
    pub fn holder(&self, group: &str, mq: &MessageQueue, now_ms: u64) -> Option<Holder<'_>> {
        let e = self.groups.get(group)?.get(mq)?;
        self.live(e, now_ms).then_some(Holder {
            client_id: e.client_id.as_str(),
            session: e.session,
        })
    }

    /// True when `group` holds at least one live lock taken for orderly consumption
    /// (RocketMQ diverts such a group's `%RETRY%` sends to the DLQ; Shoal members' locks for
    /// concurrent consumption do not count).
    pub fn group_has_live_locks(&self, group: &str, now_ms: u64) -> bool {
        self.groups
            .get(group)
            .is_some_and(|t| t.values().any(|e| e.orderly && self.live(e, now_ms)))
    }

    /// Number of locks held (live or not yet cleaned up) and members waiting, for metrics.
    pub fn sizes(&self) -> (usize, usize) {
        (
            self.groups.values().map(HashMap::len).sum(),
            self.waiters
                .values()
                .flat_map(HashMap::values)
                .map(BTreeSet::len)
                .sum(),
        )
    }
}

/// Whether a lock is live: adopted ones until their hold ends, session locks always, TTL
/// locks for `ttl_ms` after their last renewal.
fn entry_live(e: &LockEntry, ttl_ms: u64, now_ms: u64) -> bool {
    match e.adopted_until {
        Some(until) => now_ms <= until,
        None => e.session.is_some() || now_ms.saturating_sub(e.last_update_ms) <= ttl_ms,
    }
}

impl Default for QueueLockTable {
    fn default() -> Self {
        Self::new(DEFAULT_LOCK_TTL_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(i: i32) -> MessageQueue {
        MessageQueue::new("T", "broker-a", i)
    }

    #[test]
    fn lock_is_exclusive_until_expiry() {
        let mut t = QueueLockTable::new(60_000);
        let got = t.lock_batch("G", &[q(0), q(1)], "c1", 0);
        assert_eq!(got.len(), 2);
        let got = t.lock_batch("G", &[q(1), q(2)], "c2", 30_000);
        assert_eq!(got.into_iter().collect::<Vec<_>>(), vec![q(2)]);
        // c1 renews q0 at 50 s; q1 expires at 60 s after its lock.
        t.lock_batch("G", &[q(0)], "c1", 50_000);
        let got = t.lock_batch("G", &[q(0), q(1)], "c2", 60_001);
        assert_eq!(got.into_iter().collect::<Vec<_>>(), vec![q(1)]);
        assert_eq!(t.owner("G", &q(0), 60_001), Some("c1"));
        assert_eq!(t.owner("G", &q(0), 110_001), None);
    }

    #[test]
    fn unlock_only_by_owner_and_release_on_leave() {
        let mut t = QueueLockTable::default();
        t.lock_batch("G", &[q(0), q(1)], "c1", 0);
        assert!(t.unlock_batch("G", &[q(0)], "c2").is_empty());
        assert_eq!(t.unlock_batch("G", &[q(0)], "c1"), vec![q(0)]);
        assert!(t.group_has_live_locks("G", 0));
        assert_eq!(t.release_client("G", "c1"), vec![q(1)]);
        assert!(!t.group_has_live_locks("G", 0));
        assert_eq!(t.lock_batch("G", &[q(1)], "c2", 1).len(), 1);
    }

    /// A new master adopts the old one's live locks: each stays with its client (who takes it
    /// over by locking again) until its hold runs out; nobody else gets it meanwhile.
    #[test]
    fn adopted_locks_stay_with_their_holder_until_their_hold_ends() {
        let mut old = QueueLockTable::new(60_000);
        old.lock_batch_session("G", &[q(0), q(1)], "a", 7, true, 0);
        old.lock_batch("G", &[q(2)], "official", 0);
        old.lock_batch_session("G", &[q(3)], "gone", 9, false, 0);
        let held = old.held(70_000, |g, s| (g == "G" && s == 7).then_some(10_000));
        // The TTL lock expired; session locks hold for their session's timeout (the TTL when
        // the session is not known).
        assert_eq!(
            held.iter()
                .map(|l| (l.queue.queue_id, l.client_id.as_str(), l.hold_ms))
                .collect::<Vec<_>>(),
            [(0, "a", 10_000), (1, "a", 10_000), (3, "gone", 60_000)]
        );
        let held = old.held(30_000, |_, _| None);
        assert_eq!(held.len(), 4);
        // TTL locks are orderly ones (RocketMQ's); what is left of the TTL is their hold.
        assert!(held[0].orderly && held[2].orderly && !held[3].orderly);
        assert_eq!(held[2].hold_ms, 30_000);

        let mut new = QueueLockTable::new(60_000);
        // What this broker held when it was master before is replaced.
        new.lock_batch_session("G", &[q(1), q(4)], "b", 1, true, 100);
        new.lock_batch_session("G", &[q(1)], "c", 2, true, 100);
        new.adopt(old.held(0, |_, _| Some(10_000)), 100);
        assert_eq!(new.owner("G", &q(1), 100), Some("a"));
        assert_eq!(new.owner("G", &q(4), 100), None);
        assert_eq!(new.sizes(), (4, 0));
        assert!(new
            .lock_batch_session("G", &[q(0), q(1), q(2)], "b", 1, true, 200)
            .is_empty());
        assert!(new.group_has_live_locks("G", 200));
        // a takes q0 over with its new session; the hold of q2 (a TTL lock) is the TTL.
        assert_eq!(
            new.lock_batch_session("G", &[q(0)], "a", 3, true, 300)
                .len(),
            1
        );
        assert_eq!(
            new.holder("G", &q(0), 1_000_000).map(|h| h.session),
            Some(Some(3))
        );
        assert_eq!(new.owner("G", &q(2), 60_100), Some("official"));
        assert_eq!(new.lock_batch("G", &[q(2)], "b", 60_101).len(), 1);
        // A hold that ran out frees the queue; an adopted lock can be unlocked by its holder.
        assert_eq!(new.owner("G", &q(3), 10_100), Some("gone"));
        assert_eq!(new.owner("G", &q(3), 10_101), None);
        assert_eq!(new.lock_batch("G", &[q(3)], "b", 10_101).len(), 1);
        let mut again = QueueLockTable::new(60_000);
        again.adopt(old.held(0, |_, _| None), 0);
        assert_eq!(again.unlock_batch("G", &[q(2)], "official"), vec![q(2)]);
        assert_eq!(again.held(0, |_, _| None).len(), 3);
    }

    #[test]
    fn groups_are_independent() {
        let mut t = QueueLockTable::default();
        assert_eq!(t.lock_batch("G1", &[q(0)], "c1", 0).len(), 1);
        assert_eq!(t.lock_batch("G2", &[q(0)], "c2", 0).len(), 1);
    }

    #[test]
    fn session_locks_never_expire_and_waiters_are_told_once() {
        let mut t = QueueLockTable::new(1_000);
        assert_eq!(
            t.lock_batch_session("G", &[q(0), q(1)], "a", 7, false, 0)
                .len(),
            2
        );
        // Long after the TTL, b is still refused and waits.
        assert!(t
            .lock_batch_session("G", &[q(0)], "b", 8, false, 99_000)
            .is_empty());
        assert!(t.lock_batch("G", &[q(1)], "c", 99_000).is_empty());
        assert_eq!(
            t.holder("G", &q(0), 99_000),
            Some(Holder {
                client_id: "a",
                session: Some(7)
            })
        );
        // Concurrent session locks do not make the group "orderly".
        assert!(!t.group_has_live_locks("G", 0));
        assert_eq!(t.sizes(), (2, 1));
        let freed = t.unlock_batch("G", &[q(0)], "a");
        let w = t.take_waiters("G", &freed);
        assert_eq!(w.get("b"), Some(&vec![q(0)]));
        assert!(t.take_waiters("G", &freed).is_empty());
        assert_eq!(
            t.lock_batch_session("G", &[q(0)], "b", 8, true, 99_001)
                .len(),
            1
        );
        assert!(t.group_has_live_locks("G", 0));
        // A waiter that leaves is forgotten.
        assert!(t
            .lock_batch_session("G", &[q(1)], "b", 8, false, 99_002)
            .is_empty());
        t.release_client("G", "b");
        assert_eq!(t.release_client("G", "a"), vec![q(1)]);
        assert!(t.take_waiters("G", &[q(1)]).is_empty());
        assert_eq!(t.sizes(), (0, 0));
    }

    #[test]
    fn waiters_are_bounded_per_queue() {
        let mut t = QueueLockTable::default();
        t.lock_batch_session("G", &[q(0)], "a", 1, false, 0);
        for i in 0..200 {
            t.lock_batch_session("G", &[q(0)], &format!("w{i}"), 2, false, 0);
        }
        assert_eq!(t.sizes(), (1, MAX_WAITERS_PER_QUEUE));
    }
}
