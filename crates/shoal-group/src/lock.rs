//! Queue locks for orderly consumption (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ).
//!
//! One lock per (consumer group, message queue), owned by a client id, valid for a TTL
//! (60 s by default, as RocketMQ's `rocketmq.broker.rebalance.lockMaxLiveTime`) after its last
//! renewal. An expired lock may be taken by anyone; a client that leaves loses its locks at once.
//! Sans-IO: the caller passes the time.

use shoal_proto::MessageQueue;
use std::collections::{BTreeSet, HashMap};

/// Default lock lifetime after the last renewal.
pub const DEFAULT_LOCK_TTL_MS: u64 = 60_000;

#[derive(Debug, Clone)]
struct LockEntry {
    client_id: String,
    last_update_ms: u64,
}

/// All queue locks of a broker.
#[derive(Debug)]
pub struct QueueLockTable {
    ttl_ms: u64,
    groups: HashMap<String, HashMap<MessageQueue, LockEntry>>,
}

impl QueueLockTable {
    /// A table whose locks expire `ttl_ms` after their last renewal.
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            groups: HashMap::new(),
        }
    }

    /// Locks (or renews) every queue that is free, expired, or already held by `client_id`;
    /// returns the queues `client_id` holds afterwards among those asked for.
    pub fn lock_batch(
        &mut self,
        group: &str,
        mqs: &[MessageQueue],
        client_id: &str,
        now_ms: u64,
    ) -> BTreeSet<MessageQueue> {
        let ttl = self.ttl_ms;
        let table = self.groups.entry(group.to_string()).or_default();
        let mut locked = BTreeSet::new();
        for mq in mqs {
            let take = match table.get(mq) {
                None => true,
                Some(e) => {
                    e.client_id == client_id || now_ms.saturating_sub(e.last_update_ms) > ttl
                }
            };
            if take {
                table.insert(
                    mq.clone(),
                    LockEntry {
                        client_id: client_id.to_string(),
                        last_update_ms: now_ms,
                    },
                );
                locked.insert(mq.clone());
            }
        }
        locked
    }

    /// Releases the queues that `client_id` holds among `mqs`; returns how many were released.
    pub fn unlock_batch(&mut self, group: &str, mqs: &[MessageQueue], client_id: &str) -> usize {
        let Some(table) = self.groups.get_mut(group) else {
            return 0;
        };
        let mut released = 0;
        for mq in mqs {
            if table.get(mq).is_some_and(|e| e.client_id == client_id) {
                table.remove(mq);
                released += 1;
            }
        }
        if table.is_empty() {
            self.groups.remove(group);
        }
        released
    }

    /// Releases every lock `client_id` holds in `group` (the client left the group).
    pub fn release_client(&mut self, group: &str, client_id: &str) -> usize {
        let Some(table) = self.groups.get_mut(group) else {
            return 0;
        };
        let before = table.len();
        table.retain(|_, e| e.client_id != client_id);
        let released = before - table.len();
        if table.is_empty() {
            self.groups.remove(group);
        }
        released
    }

    /// The live owner of a queue's lock, if any.
    pub fn owner(&self, group: &str, mq: &MessageQueue, now_ms: u64) -> Option<&str> {
        let e = self.groups.get(group)?.get(mq)?;
        (now_ms.saturating_sub(e.last_update_ms) <= self.ttl_ms).then_some(e.client_id.as_str())
    }

    /// True when `group` holds at least one unexpired lock (RocketMQ diverts such a group's
    /// `%RETRY%` sends to the DLQ).
    pub fn group_has_live_locks(&self, group: &str, now_ms: u64) -> bool {
        self.groups.get(group).is_some_and(|t| {
            t.values()
                .any(|e| now_ms.saturating_sub(e.last_update_ms) <= self.ttl_ms)
        })
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
        assert_eq!(t.unlock_batch("G", &[q(0)], "c2"), 0);
        assert_eq!(t.unlock_batch("G", &[q(0)], "c1"), 1);
        assert!(t.group_has_live_locks("G", 0));
        assert_eq!(t.release_client("G", "c1"), 1);
        assert!(!t.group_has_live_locks("G", 0));
        assert_eq!(t.lock_batch("G", &[q(1)], "c2", 1).len(), 1);
    }

    #[test]
    fn groups_are_independent() {
        let mut t = QueueLockTable::default();
        assert_eq!(t.lock_batch("G1", &[q(0)], "c1", 0).len(), 1);
        assert_eq!(t.lock_batch("G2", &[q(0)], "c2", 0).len(), 1);
    }
}
