//! `ProcessQueue`: a consumer's local state for one owned message queue.
//!
//! Holds the messages pulled but not yet consumed, ordered by queue offset, and answers the one
//! question offset commits depend on: the smallest offset still in flight (RocketMQ semantics:
//! the committed offset never passes a message that has not been consumed). Also carries the
//! `dropped` flag set when the queue is lost in a rebalance, and the orderly-consumption lock
//! state. No I/O: the push consumer owns one per queue behind a short lock.

use std::collections::BTreeMap;

/// A message as the process queue sees it: its offset and size, with the payload carried along.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached<M> {
    /// Queue offset of the message.
    pub offset: i64,
    /// Body size in bytes (flow control).
    pub size: usize,
    /// The message itself.
    pub message: M,
}

/// Local state of one owned queue.
#[derive(Debug)]
pub struct ProcessQueue<M> {
    /// Pulled, not yet consumed (concurrent mode), or not yet taken (orderly mode).
    msgs: BTreeMap<i64, Cached<M>>,
    /// Orderly mode: taken for consumption, not yet committed.
    consuming: BTreeMap<i64, Cached<M>>,
    cached_bytes: usize,
    /// Highest offset ever put.
    max_offset_put: i64,
    /// Set when the queue was lost: stop pulling and consuming, never commit its offset again.
    pub dropped: bool,
    /// Orderly mode: whether the broker lock is held (follows the broker's answers).
    pub locked: bool,
    /// When the broker lock was last obtained or renewed (ms).
    pub last_lock_ms: u64,
    /// When the last pull was made (ms).
    pub last_pull_ms: u64,
    /// When the last message was consumed (ms).
    pub last_consume_ms: u64,
    /// Orderly mode: a consume is running (for graceful hand-over).
    pub consuming_now: bool,
}

impl<M> Default for ProcessQueue<M> {
    fn default() -> Self {
        Self::new()
    }
}

impl<M> ProcessQueue<M> {
    /// An empty process queue.
    pub fn new() -> Self {
        Self {
            msgs: BTreeMap::new(),
            consuming: BTreeMap::new(),
            cached_bytes: 0,
            max_offset_put: -1,
            dropped: false,
            locked: false,
            last_lock_ms: 0,
            last_pull_ms: 0,
            last_consume_ms: 0,
            consuming_now: false,
        }
    }

    /// Whether the message at `offset` is held (cached or being consumed).
    pub fn contains(&self, offset: i64) -> bool {
        self.msgs.contains_key(&offset) || self.consuming.contains_key(&offset)
    }

    /// Adds pulled messages; messages already present (same offset) are ignored. Returns how
    /// many were new.
    pub fn put(&mut self, items: impl IntoIterator<Item = Cached<M>>) -> usize {
        let mut added = 0;
        for item in items {
            if self.contains(item.offset) {
                continue;
            }
            self.cached_bytes += item.size;
            self.max_offset_put = self.max_offset_put.max(item.offset);
            self.msgs.insert(item.offset, item);
            added += 1;
        }
        added
    }

    /// Concurrent mode: removes consumed messages and returns the offset to commit — the
    /// smallest offset still cached, or one past the highest offset put when nothing is left.
    /// `None` when nothing was ever put.
    pub fn remove(&mut self, offsets: &[i64]) -> Option<i64> {
        for o in offsets {
            if let Some(m) = self.msgs.remove(o) {
                self.cached_bytes -= m.size;
            }
        }
        self.commit_offset()
    }

    /// The offset a commit may safely store now (see [`ProcessQueue::remove`]).
    pub fn commit_offset(&self) -> Option<i64> {
        if self.max_offset_put < 0 {
            return None;
        }
        let first_in_flight = self
            .consuming
            .keys()
            .next()
            .into_iter()
            .chain(self.msgs.keys().next())
            .min()
            .copied();
        Some(first_in_flight.unwrap_or(self.max_offset_put + 1))
    }

    /// Orderly mode: takes up to `n` messages in offset order for consumption.
    pub fn take(&mut self, n: usize) -> Vec<&Cached<M>> {
        let keys: Vec<i64> = self.msgs.keys().take(n).copied().collect();
        for k in &keys {
            if let Some(m) = self.msgs.remove(k) {
                self.consuming.insert(*k, m);
            }
        }
        keys.iter().filter_map(|k| self.consuming.get(k)).collect()
    }

    /// Orderly mode: the taken messages were consumed; returns the offset to commit (one past
    /// the highest taken), or `None` if nothing was taken.
    pub fn commit_taken(&mut self) -> Option<i64> {
        let last = *self.consuming.keys().next_back()?;
        for (_, m) in std::mem::take(&mut self.consuming) {
            self.cached_bytes -= m.size;
        }
        Some(last + 1)
    }

    /// Orderly mode: the taken messages must be consumed again (suspend and retry); they go
    /// back in front, in order.
    pub fn return_taken(&mut self) {
        for (k, m) in std::mem::take(&mut self.consuming) {
            self.msgs.insert(k, m);
        }
    }

    /// Cached message count (both maps).
    pub fn cached_count(&self) -> usize {
        self.msgs.len() + self.consuming.len()
    }

    /// Cached body bytes.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    /// Distance between the lowest and highest cached offsets (concurrent flow control).
    pub fn max_span(&self) -> i64 {
        match (self.msgs.keys().next(), self.msgs.keys().next_back()) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        }
    }

    /// True when nothing is cached or being consumed.
    pub fn is_idle(&self) -> bool {
        self.msgs.is_empty() && self.consuming.is_empty()
    }

    /// Drops everything cached (after OFFSET_ILLEGAL or when the queue is lost).
    pub fn clear(&mut self) {
        self.msgs.clear();
        self.consuming.clear();
        self.cached_bytes = 0;
    }

    /// Highest offset ever put, or -1.
    pub fn max_offset_put(&self) -> i64 {
        self.max_offset_put
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(offset: i64) -> Cached<()> {
        Cached {
            offset,
            size: 10,
            message: (),
        }
    }

    #[test]
    fn commit_never_passes_an_unconsumed_message() {
        let mut pq = ProcessQueue::new();
        assert_eq!(pq.commit_offset(), None);
        assert_eq!(pq.put((0..5).map(c)), 5);
        assert_eq!(pq.put([c(3)]), 0);
        assert_eq!(pq.cached_bytes(), 50);
        assert_eq!(pq.max_span(), 4);
        // 1..4 consumed, 0 still in flight.
        assert_eq!(pq.remove(&[1, 2, 3, 4]), Some(0));
        assert_eq!(pq.remove(&[0]), Some(5));
        assert!(pq.is_idle());
        assert_eq!(pq.cached_bytes(), 0);
    }

    #[test]
    fn orderly_take_commit_and_return() {
        let mut pq = ProcessQueue::new();
        pq.put((10..16).map(c));
        let taken: Vec<i64> = pq.take(4).iter().map(|m| m.offset).collect();
        assert_eq!(taken, vec![10, 11, 12, 13]);
        assert_eq!(pq.commit_offset(), Some(10));
        pq.return_taken();
        let taken: Vec<i64> = pq.take(2).iter().map(|m| m.offset).collect();
        assert_eq!(taken, vec![10, 11]);
        assert_eq!(pq.commit_taken(), Some(12));
        assert_eq!(pq.cached_count(), 4);
        assert_eq!(pq.commit_offset(), Some(12));
        assert_eq!(pq.commit_taken(), None);
    }
}
