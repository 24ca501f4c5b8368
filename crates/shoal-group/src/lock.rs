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
        e.session.is_some() || now_ms.saturating_sub(e.last_update_ms) <= self.ttl_ms
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
                Some(e) => {
                    e.client_id == client_id
                        || (e.session.is_none() && now_ms.saturating_sub(e.last_update_ms) > ttl)
                }
            };
            if take {
                table.insert(
                    mq.clone(),
                    LockEntry {
                        client_id: client_id.to_string(),
                        last_update_ms: now_ms,
                        session,
                        orderly,
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
