//! The simulated broker: shoal-group's membership registry and lock table, an offset table
//! with the commit fence, one topic's queues with their messages, and held pulls.

use crate::coordinator::Coordinator;
use crate::lock::QueueLockTable;
use crate::membership::{ClientChannel, ClientRegistry, GroupChange};
use shoal_proto::MessageQueue;
use std::collections::BTreeMap;

pub(super) const GROUP: &str = "G";
pub(super) const TOPIC: &str = "T";
pub(super) const BROKER: &str = "b";

pub(super) fn mq(i: i32) -> MessageQueue {
    MessageQueue::new(TOPIC, BROKER, i)
}

/// A pull held until a message arrives or it times out.
#[derive(Debug, Clone)]
pub(super) struct HeldPull {
    pub member: usize,
    pub conn: u64,
    pub req: u64,
    pub offset: i64,
}

/// What the broker wants sent after handling something.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    /// Membership notices to these connections.
    pub notify: Vec<u64>,
    /// Lock-freed notices: connection → queues.
    pub freed: Vec<(u64, Vec<MessageQueue>)>,
    /// The coordinator's assignment notices (heartbeat now) to these connections.
    pub assign: Vec<u64>,
}

#[derive(Debug)]
pub(super) struct SimBroker {
    pub registry: ClientRegistry<(), &'static str>,
    pub locks: QueueLockTable,
    pub offsets: BTreeMap<MessageQueue, i64>,
    /// Next offset to be written, per queue.
    pub max_offset: BTreeMap<MessageQueue, i64>,
    pub queue_count: i32,
    pub held: BTreeMap<MessageQueue, Vec<HeldPull>>,
    /// The group coordinator (coordinated runs).
    pub coordinator: Option<Coordinator>,
    /// Version of the member lists sent with notices.
    pub member_version: u64,
}

impl SimBroker {
    pub fn new(queue_count: i32) -> Self {
        let mut b = Self {
            registry: ClientRegistry::with_session_base(1000),
            locks: QueueLockTable::default(),
            offsets: BTreeMap::new(),
            max_offset: BTreeMap::new(),
            queue_count: 0,
            held: BTreeMap::new(),
            coordinator: None,
            member_version: 0,
        };
        b.grow(queue_count);
        b
    }

    pub fn queues(&self) -> Vec<MessageQueue> {
        (0..self.queue_count).map(mq).collect()
    }

    pub fn grow(&mut self, to: i32) {
        for i in self.queue_count..to {
            self.max_offset.insert(mq(i), 0);
        }
        self.queue_count = self.queue_count.max(to);
    }

    /// Releases the locks of members that left and finds who to tell.
    pub fn apply(&mut self, change: &GroupChange, out: &mut Outbox) {
        for id in &change.left_client_ids {
            let freed = self.locks.release_client(GROUP, id);
            self.freed(freed, out);
        }
        if change.needs_notify() {
            out.notify.extend(change.notify_conn_ids.iter().copied());
        }
    }

    pub fn freed(&mut self, freed: Vec<MessageQueue>, out: &mut Outbox) {
        if freed.is_empty() {
            return;
        }
        for (client, queues) in self.locks.take_waiters(GROUP, &freed) {
            if let Some(conn) = self.registry.conn_of(GROUP, &client) {
                out.freed.push((conn, queues));
            }
        }
    }

    pub fn heartbeat(
        &mut self,
        conn: u64,
        client_id: &str,
        session_timeout: Option<u64>,
        now: u64,
        out: &mut Outbox,
    ) -> u64 {
        let channel = ClientChannel {
            conn_id: conn,
            client_id: client_id.to_string(),
            client_addr: String::new(),
            language: "RUST".into(),
            version: 0,
        };
        let subs = [(TOPIC.to_string(), "*")].into();
        let change = self
            .registry
            .consumer_heartbeat(GROUP, channel, (), subs, now);
        let session = self
            .registry
            .set_session_timeout(GROUP, conn, session_timeout)
            .map_or(0, |s| s.id);
        self.apply(&change, out);
        session
    }

    /// A Shoal session lock request: granted queues and the session (none without one).
    pub fn lock(
        &mut self,
        conn: u64,
        queues: &[MessageQueue],
        now: u64,
    ) -> (Vec<MessageQueue>, Option<u64>) {
        let Some(s) = self.registry.touch(GROUP, conn, now) else {
            return (Vec::new(), None);
        };
        let got = self
            .locks
            .lock_batch_session(GROUP, queues, &s.client_id, s.id, false, now);
        (got.into_iter().collect(), Some(s.id))
    }

    pub fn unlock(&mut self, conn: u64, queues: &[MessageQueue], now: u64, out: &mut Outbox) {
        let Some(s) = self.registry.session(GROUP, conn) else {
            return;
        };
        let freed = self.locks.unlock_batch(GROUP, queues, &s.client_id);
        // Evidence for the coordinator: revoked queues are free for their next owners.
        if let Some(c) = self.coordinator.as_mut() {
            c.released_by_client(GROUP, &s.client_id, queues, now);
        }
        self.coordinator_effects(out);
        self.freed(freed, out);
    }

    /// The commit fence. Returns `Ok(moved_back)` when applied (`moved_back`: the stored
    /// offset went down, an invariant violation), `Err(())` when refused.
    pub fn commit(
        &mut self,
        conn: u64,
        queue: &MessageQueue,
        offset: i64,
        now: u64,
    ) -> Result<Option<i64>, ()> {
        let session = self.registry.session(GROUP, conn);
        let holder = self
            .locks
            .holder(GROUP, queue, now)
            .map(|h| h.client_id.to_string());
        let stored = self.offsets.get(queue).copied();
        let allowed = match &session {
            // A Shoal member commits only what it holds, and never moves an offset back.
            Some(s) if s.timeout_ms.is_some() => {
                holder.as_deref() == Some(s.client_id.as_str())
                    && stored.is_none_or(|o| offset >= o)
            }
            // Others (official clients) are refused only where another member holds the lock.
            Some(s) => holder.is_none_or(|h| h == s.client_id),
            None => holder.is_none(),
        };
        if !allowed {
            return Err(());
        }
        self.offsets.insert(queue.clone(), offset);
        Ok(stored.filter(|o| offset < *o))
    }

    /// Messages from `offset` (at most `max`).
    pub fn read(&self, queue: &MessageQueue, offset: i64, max: i64) -> Vec<i64> {
        let end = self.max_offset.get(queue).copied().unwrap_or(0);
        (offset.max(0)..end.min(offset.max(0) + max)).collect()
    }
}
