//! Offsets committed to a replica reach the master.
//!
//! A RocketMQ client commits to a replica when its route has no master (Java 5.3.3 at once,
//! 4.9.8 after asking the name server again; docs/failover.md "Official clients through a
//! failover"). The replica stores the commit, so its own pulls and queries see it, and keeps it
//! in [`ForwardedCommits`] until the group's master has it: the forwarding task
//! ([`start`]) sends each one to the master it follows (UPDATE_CONSUMER_OFFSET marked
//! [`field::FORWARDED`]), which stores it only when it is above what it has (an offset never
//! moves back through a forward) and only once it has taken over its group's state, so the
//! old master's replicated offsets it applies first cannot replace it. Until the master has
//! it, the replica does not let the master's replicated offsets move it back, and a replica
//! elected master keeps it (it is in its own store, and its metadata rounds carry it to the
//! others). A master that has not yet taken over its group's state keeps the commits it takes
//! in the same way until it has, so the old master's offsets it applies first do not replace
//! them.
//!
//! Bounded: at most `replication.max_pending_commits` queues wait; a commit for one more queue
//! is refused with SYSTEM_BUSY (the client commits again; it loses nothing), counted in
//! `shoal_replication_commits_refused_full`.

use super::{Replication, RoleView};
use crate::shared::Shared;
use parking_lot::Mutex;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::ext::field;
use shoal_proto::header::UpdateConsumerOffsetRequestHeader;
use shoal_proto::RemotingCommand;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::{debug, info};

/// How often the task tries again while commits wait (a master not yet known or not yet
/// serving).
const RETRY: Duration = Duration::from_millis(250);

/// Commits forwarded per pass at most (one request each, in turn).
const PER_PASS: usize = 256;

/// A queue of a group: (group, topic, queue id).
pub(crate) type QueueKey = (String, String, i32);

/// The commits a replica holds for its master. One short lock; nothing awaits under it.
#[derive(Debug)]
pub(crate) struct ForwardedCommits {
    pending: Mutex<BTreeMap<QueueKey, i64>>,
    limit: usize,
    wake: Notify,
    /// Commits the master stored (or already had).
    pub(crate) forwarded: AtomicU64,
    /// Commits for one more queue refused because `limit` queues waited.
    pub(crate) refused_full: AtomicU64,
}

/// The refusal of a commit for one more queue while `limit` queues wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    /// `replication.max_pending_commits`.
    pub(crate) limit: usize,
}

impl ForwardedCommits {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            pending: Mutex::new(BTreeMap::new()),
            limit,
            wake: Notify::new(),
            forwarded: AtomicU64::new(0),
            refused_full: AtomicU64::new(0),
        }
    }

    /// Keeps `offset` for the master (the highest one per queue).
    pub(crate) fn record(&self, key: QueueKey, offset: i64) -> Result<(), Full> {
        {
            let mut p = self.pending.lock();
            if let Some(o) = p.get_mut(&key) {
                *o = (*o).max(offset);
            } else if p.len() >= self.limit {
                drop(p);
                self.refused_full.fetch_add(1, Ordering::Relaxed);
                return Err(Full { limit: self.limit });
            } else {
                p.insert(key, offset);
            }
        }
        self.wake.notify_one();
        Ok(())
    }

    /// The offset waiting for the master of a queue when it is above `offset`: what a
    /// replicated offset record must not replace.
    pub(crate) fn above(&self, key: &QueueKey, offset: i64) -> Option<i64> {
        self.pending
            .lock()
            .get(key)
            .copied()
            .filter(|o| *o > offset)
    }

    /// Up to `n` waiting commits.
    fn batch(&self, n: usize) -> Vec<(QueueKey, i64)> {
        self.pending
            .lock()
            .iter()
            .take(n)
            .map(|(k, o)| (k.clone(), *o))
            .collect()
    }

    /// The master has `offset` of the queue: it no longer waits, unless a higher one came
    /// meanwhile.
    fn done(&self, key: &QueueKey, offset: i64) {
        let mut p = self.pending.lock();
        if p.get(key).is_some_and(|o| *o <= offset) {
            p.remove(key);
        }
    }

    /// Forgets every waiting commit (this broker became master: its store has them).
    fn clear(&self) -> usize {
        let mut p = self.pending.lock();
        let n = p.len();
        p.clear();
        n
    }

    /// Queues waiting.
    pub(crate) fn len(&self) -> usize {
        self.pending.lock().len()
    }

    /// Whether no commit waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.pending.lock().is_empty()
    }
}

/// Stores a commit a client made to this broker; on a replica, keeps it for the master (and on
/// a master that has not taken over yet, until it has).
pub(crate) fn store_commit(
    b: &Shared,
    group: &str,
    topic: &str,
    queue_id: i32,
    offset: i64,
) -> Result<(), crate::reply::Reject> {
    if let Some(r) = b.replication.get() {
        if !r.serves_as_master() {
            r.commits
                .record((group.to_string(), topic.to_string(), queue_id), offset)
                .map_err(|f| {
                    crate::reply::Reject::new(
                        resp::SYSTEM_BUSY,
                        format!(
                            "this replica holds commits of {} queues for its master already \
                             (replication.max_pending_commits); commit again shortly",
                            f.limit
                        ),
                    )
                })?;
        }
    }
    b.store.commit_offset(group, topic, queue_id, offset);
    Ok(())
}

/// Starts the task that forwards a replica's commits to its master.
pub(crate) fn start(b: Arc<Shared>, repl: Arc<Replication>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if repl.commits.is_empty() {
                repl.commits.wake.notified().await;
            }
            let view = repl.view();
            match (&view.role, view.master_addr.as_deref()) {
                // A master still applying its log keeps them: a replicated offset it applies
                // must not replace them.
                (RoleView::Master { .. }, _) if repl.serves_as_master() => {
                    let n = repl.commits.clear();
                    if n > 0 {
                        info!(
                            queues = n,
                            "commits made while a replica are this master's own now"
                        );
                    }
                }
                (RoleView::Replica { .. }, Some(addr)) => {
                    forward(&b, &repl, addr).await;
                }
                _ => {}
            }
            if !repl.commits.is_empty() {
                tokio::time::sleep(RETRY).await;
            }
        }
    })
}

/// Sends the waiting commits to the master at `addr`, one request each.
async fn forward(b: &Shared, repl: &Replication, addr: &str) {
    for (key, offset) in repl.commits.batch(PER_PASS) {
        let mut req = RemotingCommand::request_with_header(
            rc::UPDATE_CONSUMER_OFFSET,
            &UpdateConsumerOffsetRequestHeader {
                consumer_group: key.0.clone(),
                topic: key.1.clone(),
                queue_id: key.2,
                commit_offset: offset,
                ..Default::default()
            },
        );
        req.ext_fields
            .get_or_insert_with(Default::default)
            .insert(field::FORWARDED, "true");
        match b.namesrv.call_broker(addr, req).await {
            Ok(r) if r.code == resp::SUCCESS => {
                repl.commits.done(&key, offset);
                repl.commits.forwarded.fetch_add(1, Ordering::Relaxed);
            }
            Ok(r)
                if r.code == resp::TOPIC_NOT_EXIST
                    || r.code == resp::INVALID_PARAMETER
                    || r.code == shoal_proto::ext::response_code::QUEUE_NOT_LOCKED =>
            {
                // The master will never take it: the topic or queue is gone there, or a
                // member holding the queue's lock owns its offset.
                debug!(group = %key.0, topic = %key.1, queue = key.2, remark = ?r.remark,
                    "commit for the master dropped: it refused it for good");
                repl.commits.done(&key, offset);
            }
            Ok(r) => {
                debug!(code = r.code, remark = ?r.remark, "master did not take a forwarded commit yet");
                return;
            }
            Err(e) => {
                debug!(error = %e, "master not reached with a forwarded commit");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    fn key(q: i32) -> QueueKey {
        ("g".into(), "T".into(), q)
    }

    #[test]
    fn the_highest_commit_per_queue_waits_and_the_queues_are_bounded() {
        let c = ForwardedCommits::new(2);
        c.record(key(0), 5).unwrap();
        c.record(key(0), 3).unwrap();
        assert_eq!(
            c.above(&key(0), 4),
            Some(5),
            "a lower commit keeps the higher"
        );
        assert_eq!(c.above(&key(0), 5), None);
        c.record(key(1), 1).unwrap();
        assert_eq!(c.record(key(2), 9), Err(Full { limit: 2 }));
        assert_eq!(c.refused_full.load(Ordering::Relaxed), 1);
        // A queue already waiting still moves on when full.
        c.record(key(1), 4).unwrap();
        assert_eq!(c.batch(10), vec![(key(0), 5), (key(1), 4)]);
        // The master took 5 of queue 0; queue 1 got a higher commit meanwhile.
        c.done(&key(0), 5);
        c.record(key(1), 6).unwrap();
        c.done(&key(1), 4);
        assert_eq!(c.batch(10), vec![(key(1), 6)]);
        assert_eq!(c.clear(), 1);
        assert_eq!(c.len(), 0);
        c.record(key(2), 9).unwrap();
    }
}
