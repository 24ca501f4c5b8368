//! POP consumption (RocketMQ 5's broker-side queue choice with invisibility leases) as a
//! sans-IO state machine. The broker reads the store and writes files; this module decides.
//!
//! Per (group, topic, queue) the engine keeps a contiguous **acked offset** (everything below
//! is done: acknowledged, filtered out, or moved to the retry or dead-letter topic), a
//! **cursor** (the next offset never handed out), and between them every offset is either
//! **leased** (handed out under an invisibility lease with a receipt, its `pop_time`) or
//! **done**. Nothing else: an offset is never lost between the two, and a done offset is never
//! handed out again.
//!
//! - [`PopEngine::plan_pop`] orders a request's candidate queues (rotating per group and
//!   topic, retry queues first every [`RETRY_FIRST_EVERY`] pops) and
//!   [`PopEngine::read_plan`] says what to read from one: the lapsed messages of a FIFO queue
//!   (in order), then fresh ones from the cursor, or nothing while the queue is at its
//!   in-flight limit or a FIFO queue has a message under lease.
//! - [`PopEngine::handle_read`] takes what the read found (which offsets matched the
//!   subscription) and grants leases; filtered-out offsets are done at once.
//! - [`PopEngine::handle_ack`] / [`PopEngine::handle_change_invisible`] check the receipt:
//!   the lease must be the current one (same `pop_time`) and not lapsed (`now < deadline`);
//!   a stale, foreign or lapsed receipt is refused ([`ReceiptError`]).
//! - [`PopEngine::handle_timeout`] lapses leases at their deadline. A lapsed message of a
//!   normal queue becomes a [`PopAction::Revive`]: the broker writes a copy to the group's
//!   retry topic (reconsume count + 1; the dead-letter topic after the group's max attempts)
//!   and only then reports [`PopEngine::handle_revived`], which marks the offset done. A
//!   failed write ([`PopEngine::handle_revive_failed`]) is retried: the message is never
//!   dropped (RocketMQ #7914), and an acknowledged message is never revived (#7724), since an
//!   ack is accepted only before the deadline and a revive only starts after it. Leases end by
//!   the engine's own deadline, not by a coarse delay level (#3787, #4153).
//! - A FIFO queue is redelivered in place, in order, with its attempt count raised; after
//!   `max_attempts` deliveries a message becomes [`PopAction::DeadLetter`].
//! - Every change is a [`PopRecord`] in [`PopEngine::poll_action`] (as
//!   [`PopAction::Journal`]); records replayed by [`PopEngine::restore`] rebuild the state, so
//!   a restart redelivers no acknowledged message and loses no unacknowledged one.
//!   [`PopEngine::snapshot`] gives the few records that rebuild the current state (for
//!   compacting a journal).

mod record;
#[cfg(test)]
mod tests;

pub use record::{PopRecord, RecordError};

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// Every this many pops of a group and topic, its retry queues are tried first (RocketMQ
/// reads the retry topic first with a 20% probability; here by count, so it is
/// deterministic).
pub const RETRY_FIRST_EVERY: u64 = 5;

/// A queue of one group: (group, topic, queue id). The topic may be the group's retry topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey {
    /// Consumer group.
    pub group: String,
    /// Topic (or the group's retry topic for it).
    pub topic: String,
    /// Queue id.
    pub queue_id: i32,
}

impl QueueKey {
    /// A key.
    pub fn new(group: impl Into<String>, topic: impl Into<String>, queue_id: i32) -> Self {
        Self {
            group: group.into(),
            topic: topic.into(),
            queue_id,
        }
    }
}

/// Limits of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopConfig {
    /// Messages of one queue under lease at once (RocketMQ `popInflightMessageThreshold`
    /// applies per broker; here per queue). A queue at the limit hands out nothing more.
    pub max_inflight_per_queue: usize,
    /// Deliveries of a FIFO message before it goes to the dead-letter topic (normal messages
    /// count their redeliveries in the stored reconsume count).
    pub max_attempts: u32,
    /// Shortest invisibility a lease may have, ms (shorter asks are raised to it).
    pub min_invisible_ms: u64,
    /// Longest invisibility a lease may have, ms (longer asks are lowered to it).
    pub max_invisible_ms: u64,
    /// Wait before a revive whose write failed is tried again, ms.
    pub revive_retry_ms: u64,
    /// Most offsets between a queue's acked offset and its cursor: a message held under lease
    /// keeps every later done offset in memory, so fresh reads stop this far past it.
    pub max_span: u64,
}

impl Default for PopConfig {
    fn default() -> Self {
        Self {
            max_inflight_per_queue: 2_000,
            max_attempts: 16,
            min_invisible_ms: 1_000,
            max_invisible_ms: 12 * 3_600_000,
            revive_retry_ms: 1_000,
            max_span: 65_536,
        }
    }
}

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseState {
    /// Handed out; the receipt is valid until the deadline.
    Leased,
    /// Lapsed; a revive (copy to retry or DLQ) is being written.
    Reviving,
    /// Lapsed in a FIFO queue; waits to be handed out again in place.
    Lapsed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Lease {
    pop_time: u64,
    deadline: u64,
    /// Deliveries of this offset so far (1 on the first).
    attempts: u32,
    consumer: String,
    state: LeaseState,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct QueueState {
    /// Every offset below is done.
    ack: u64,
    /// The next offset never handed out.
    cursor: u64,
    /// Offsets in `[ack, cursor)` not yet done.
    leases: BTreeMap<u64, Lease>,
    /// Offsets in `(ack, cursor)` done out of order.
    done: BTreeSet<u64>,
    fifo: bool,
    started: bool,
    /// A base record of the queue is in the journal.
    journaled: bool,
}

impl QueueState {
    fn advance_ack(&mut self) {
        while self.ack < self.cursor && self.done.remove(&self.ack) {
            self.ack += 1;
        }
    }

    fn inflight(&self) -> usize {
        self.leases.len()
    }
}

/// What to read from a queue for a pop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadPlan {
    /// Lapsed FIFO messages to hand out again, in order (read these offsets).
    pub redeliver: Vec<u64>,
    /// Read fresh messages from this offset...
    pub from: u64,
    /// ...at most this many (0: none).
    pub max_fresh: usize,
}

/// One message the broker read for a pop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Queue offset.
    pub offset: u64,
    /// The subscription's filter matched it (an unmatched message is done at once).
    pub matched: bool,
}

/// A lease granted by [`PopEngine::handle_read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// Queue offset.
    pub offset: u64,
    /// Deliveries of this offset so far, this one included.
    pub attempts: u32,
}

/// The leases of one pop from one queue: one receipt time for all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The receipt's time (part of every receipt of this grant), ms.
    pub pop_time: u64,
    /// The invisibility granted, ms.
    pub invisible_ms: u64,
    /// Leased messages, in offset order.
    pub leases: Vec<Granted>,
}

/// Why a receipt was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    /// No lease on that offset: already done, never handed out, or another group's.
    #[error(
        "the message is not in flight (already acknowledged, or never delivered to this group)"
    )]
    NotInFlight,
    /// The offset is leased under another receipt (a later delivery or a changed lease).
    #[error("the receipt handle is stale: the message was delivered again or its lease changed")]
    Stale,
    /// The lease lapsed before the request: the message is being redelivered.
    #[error("the invisibility lease lapsed; the message will be delivered again")]
    Expired,
}

/// What the broker must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PopAction {
    /// Append to the journal (durably, before answering the request that caused it).
    Journal(PopRecord),
    /// A lease of a normal queue lapsed: write a copy of the message to the group's retry
    /// topic (reconsume count + 1), or its dead-letter topic when the count reaches the
    /// group's max, then report [`PopEngine::handle_revived`] (or `handle_revive_failed`).
    Revive {
        /// The queue.
        key: QueueKey,
        /// Queue offset of the message.
        offset: u64,
        /// The lapsed lease's receipt time.
        pop_time: u64,
    },
    /// A FIFO message was delivered `max_attempts` times: write it to the dead-letter topic,
    /// then report [`PopEngine::handle_revived`].
    DeadLetter {
        /// The queue.
        key: QueueKey,
        /// Queue offset of the message.
        offset: u64,
        /// The lapsed lease's receipt time.
        pop_time: u64,
    },
    /// Everything below `ack` of this queue is done: the group's consumer offset.
    CommitOffset {
        /// The queue.
        key: QueueKey,
        /// The new acked offset.
        ack: u64,
    },
}

/// Counters of the engine, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PopCounters {
    /// Leases granted (first deliveries and FIFO redeliveries).
    pub leased: u64,
    /// Receipts accepted for an ack.
    pub acked: u64,
    /// Receipts refused (stale, foreign, lapsed).
    pub refused: u64,
    /// Leases that lapsed without an ack.
    pub lapsed: u64,
    /// Copies written to a retry topic or a dead-letter topic.
    pub revived: u64,
    /// Messages sent to a dead-letter topic by the engine (FIFO).
    pub dead_lettered: u64,
    /// Invisibility changes accepted.
    pub changed: u64,
}

/// The POP engine of one broker: every group's POP queues.
#[derive(Debug, Default)]
pub struct PopEngine {
    config: PopConfig,
    queues: BTreeMap<QueueKey, QueueState>,
    /// Pops so far per (group, topic): the rotation.
    rotation: HashMap<(String, String), u64>,
    /// Deadlines: (deadline, key, offset), the earliest first.
    deadlines: BTreeSet<(u64, QueueKey, u64)>,
    /// Revives to try again: (not before, key, offset, pop_time).
    retry_revives: BTreeSet<(u64, QueueKey, u64, u64)>,
    actions: VecDeque<PopAction>,
    /// The last receipt time handed out (receipt times only grow).
    last_pop_time: u64,
    counters: PopCounters,
    /// The same counters per group (since the engine started).
    by_group: HashMap<String, PopCounters>,
}

/// Adds to the engine's counters and to its group's.
fn bump(
    all: &mut PopCounters,
    by_group: &mut HashMap<String, PopCounters>,
    group: &str,
    f: impl Fn(&mut PopCounters),
) {
    f(all);
    match by_group.get_mut(group) {
        Some(c) => f(c),
        None => {
            let mut c = PopCounters::default();
            f(&mut c);
            by_group.insert(group.to_owned(), c);
        }
    }
}

impl PopEngine {
    /// An engine with these limits.
    pub fn new(config: PopConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The limits.
    pub fn config(&self) -> &PopConfig {
        &self.config
    }

    /// Counters so far.
    pub fn counters(&self) -> PopCounters {
        self.counters
    }

    /// Orders a pop's candidate queues: rotated by one more each pop of the group and topic
    /// (fair across queues and across the consumers that share them), with the retry queues
    /// (`retry` true) first every [`RETRY_FIRST_EVERY`] pops and last otherwise.
    pub fn plan_pop(
        &mut self,
        group: &str,
        topic: &str,
        candidates: &[(QueueKey, bool)],
    ) -> Vec<QueueKey> {
        let n = self
            .rotation
            .entry((group.to_owned(), topic.to_owned()))
            .or_insert(0);
        let turn = *n;
        *n = n.wrapping_add(1);
        let (retry, normal): (Vec<_>, Vec<_>) = candidates.iter().partition(|(_, r)| *r);
        let rotate = |v: Vec<&(QueueKey, bool)>| -> Vec<QueueKey> {
            if v.is_empty() {
                return Vec::new();
            }
            let start = (turn % v.len() as u64) as usize;
            v[start..]
                .iter()
                .chain(&v[..start])
                .map(|(k, _)| k.clone())
                .collect()
        };
        let (retry, normal) = (rotate(retry), rotate(normal));
        if turn % RETRY_FIRST_EVERY == 0 {
            retry.into_iter().chain(normal).collect()
        } else {
            normal.into_iter().chain(retry).collect()
        }
    }

    /// What to read from `key` for a pop of at most `max` messages. `start` is where a queue
    /// the engine has not seen starts (the group's committed offset, or where its
    /// consume-from rule puts it); `min_offset` is the store's first offset (older ones were
    /// deleted by retention and count as done). `None`: nothing may be handed out now.
    pub fn read_plan(
        &mut self,
        key: &QueueKey,
        fifo: bool,
        max: usize,
        start: u64,
        min_offset: u64,
    ) -> Option<ReadPlan> {
        let cap = self.config.max_inflight_per_queue;
        let span = self.config.max_span;
        let q = self.queue_mut(key, start);
        if !q.journaled || q.fifo != fifo {
            // The queue's start and kind are journaled before anything is read from it.
            q.journaled = true;
            q.fifo = fifo;
            let base = PopRecord::Base {
                key: key.clone(),
                ack: q.ack,
                cursor: q.cursor,
                fifo,
            };
            self.actions.push_back(PopAction::Journal(base));
        }
        let q = self.queues.get_mut(key)?;
        if q.ack < min_offset {
            // Retention deleted what was not consumed: those offsets are gone, not leased.
            let gone: Vec<u64> = q.leases.range(..min_offset).map(|(o, _)| *o).collect();
            for o in gone {
                q.leases.remove(&o);
            }
            q.done.retain(|o| *o >= min_offset);
            q.ack = min_offset;
            q.cursor = q.cursor.max(min_offset);
            q.advance_ack();
        }
        if max == 0 {
            return None;
        }
        if fifo {
            // In order: lapsed messages first; nothing while one is under lease.
            if q.leases.values().any(|l| l.state != LeaseState::Lapsed) {
                return None;
            }
            let redeliver: Vec<u64> = q.leases.keys().copied().take(max).collect();
            let window = (q.ack + span).saturating_sub(q.cursor);
            let max_fresh = if redeliver.is_empty() {
                max.min(usize::try_from(window).unwrap_or(usize::MAX))
            } else {
                0
            };
            return Some(ReadPlan {
                redeliver,
                from: q.cursor,
                max_fresh,
            });
        }
        let room = cap.saturating_sub(q.inflight());
        let window = (q.ack + span).saturating_sub(q.cursor);
        let max_fresh = max
            .min(room)
            .min(usize::try_from(window).unwrap_or(usize::MAX));
        if max_fresh == 0 {
            return None;
        }
        Some(ReadPlan {
            redeliver: Vec::new(),
            from: q.cursor,
            max_fresh,
        })
    }

    fn queue_mut(&mut self, key: &QueueKey, start: u64) -> &mut QueueState {
        let q = self.queues.entry(key.clone()).or_default();
        if !q.started {
            q.started = true;
            q.ack = start;
            q.cursor = start;
        }
        q
    }

    /// A new receipt time for a pop at `now` (receipt times only grow, so a receipt names one
    /// delivery). One pop over several queues uses one receipt time for all its grants.
    pub fn next_pop_time(&mut self, now: u64) -> u64 {
        self.last_pop_time = now.max(self.last_pop_time + 1);
        self.last_pop_time
    }

    /// Clamps an asked invisibility to the configured bounds.
    pub fn invisible_ms(&self, asked: u64) -> u64 {
        asked.clamp(self.config.min_invisible_ms, self.config.max_invisible_ms)
    }

    /// The broker read `found` for a pop by `consumer`: redelivered offsets of the plan and
    /// fresh ones from its `from`, in offset order, with `scanned_to` the offset after the
    /// last fresh entry read. Matched messages are leased for `invisible_ms` (clamped);
    /// unmatched ones are done. `pop_time` comes from [`PopEngine::next_pop_time`]. Returns the
    /// grant (empty leases when nothing matched).
    #[allow(clippy::too_many_arguments)]
    pub fn handle_read(
        &mut self,
        now: u64,
        pop_time: u64,
        key: &QueueKey,
        consumer: &str,
        found: &[Candidate],
        scanned_to: u64,
        invisible_ms: u64,
    ) -> Grant {
        let invisible_ms = self.invisible_ms(invisible_ms);
        let deadline = now.saturating_add(invisible_ms);
        let mut leases = Vec::new();
        let mut records = Vec::new();
        let mut deadlines = Vec::new();
        let Some(q) = self.queues.get_mut(key) else {
            return Grant {
                pop_time,
                invisible_ms,
                leases,
            };
        };
        let old_cursor = q.cursor;
        for c in found {
            let redelivery = c.offset < old_cursor;
            if redelivery {
                // Only a lapsed FIFO lease is handed out again.
                match q.leases.get(&c.offset) {
                    Some(l) if l.state == LeaseState::Lapsed => {}
                    _ => continue,
                }
            } else if c.offset >= scanned_to || c.offset < q.cursor {
                continue;
            }
            if !c.matched {
                if redelivery {
                    q.leases.remove(&c.offset);
                }
                q.done.insert(c.offset);
                records.push(PopRecord::Done {
                    key: key.clone(),
                    offset: c.offset,
                });
                continue;
            }
            let attempts = q.leases.get(&c.offset).map_or(1, |l| l.attempts + 1);
            q.leases.insert(
                c.offset,
                Lease {
                    pop_time,
                    deadline,
                    attempts,
                    consumer: consumer.to_owned(),
                    state: LeaseState::Leased,
                },
            );
            deadlines.push((deadline, key.clone(), c.offset));
            records.push(PopRecord::Grant {
                key: key.clone(),
                offset: c.offset,
                pop_time,
                deadline,
                attempts,
                consumer: consumer.to_owned(),
            });
            leases.push(Granted {
                offset: c.offset,
                attempts,
            });
        }
        // Fresh offsets the read passed over without returning (gaps) are done as well.
        if scanned_to > q.cursor {
            for o in q.cursor..scanned_to {
                if !q.leases.contains_key(&o) {
                    q.done.insert(o);
                }
            }
            q.cursor = scanned_to;
            records.push(PopRecord::Cursor {
                key: key.clone(),
                cursor: scanned_to,
            });
        }
        let before = q.ack;
        q.advance_ack();
        let ack = (q.ack != before).then_some(q.ack);
        let n = leases.len() as u64;
        bump(&mut self.counters, &mut self.by_group, &key.group, |c| {
            c.leased += n
        });
        self.deadlines.extend(deadlines);
        self.journal(records);
        if let Some(ack) = ack {
            self.actions.push_back(PopAction::CommitOffset {
                key: key.clone(),
                ack,
            });
        }
        Grant {
            pop_time,
            invisible_ms,
            leases,
        }
    }

    fn journal(&mut self, records: Vec<PopRecord>) {
        self.actions
            .extend(records.into_iter().map(PopAction::Journal));
    }

    /// Checks a receipt: the current lease of the offset, not lapsed at `now`.
    fn check_receipt(
        &self,
        now: u64,
        key: &QueueKey,
        offset: u64,
        pop_time: u64,
    ) -> Result<(), ReceiptError> {
        let l = self
            .queues
            .get(key)
            .and_then(|q| q.leases.get(&offset))
            .ok_or(ReceiptError::NotInFlight)?;
        if l.pop_time != pop_time {
            return Err(ReceiptError::Stale);
        }
        if l.state != LeaseState::Leased || now >= l.deadline {
            return Err(ReceiptError::Expired);
        }
        Ok(())
    }

    /// An ack with a receipt `(key, offset, pop_time)`.
    ///
    /// # Errors
    /// [`ReceiptError`] when the receipt is not the offset's current, unlapsed lease; nothing
    /// changes then.
    pub fn handle_ack(
        &mut self,
        now: u64,
        key: &QueueKey,
        offset: u64,
        pop_time: u64,
    ) -> Result<(), ReceiptError> {
        self.lapse_due(now);
        if let Err(e) = self.check_receipt(now, key, offset, pop_time) {
            bump(&mut self.counters, &mut self.by_group, &key.group, |c| {
                c.refused += 1
            });
            return Err(e);
        }
        bump(&mut self.counters, &mut self.by_group, &key.group, |c| {
            c.acked += 1
        });
        self.finish(key, offset);
        Ok(())
    }

    /// Marks an offset done (ack, revive written) and journals it.
    fn finish(&mut self, key: &QueueKey, offset: u64) {
        let Some(q) = self.queues.get_mut(key) else {
            return;
        };
        if let Some(l) = q.leases.remove(&offset) {
            self.deadlines.remove(&(l.deadline, key.clone(), offset));
        }
        q.done.insert(offset);
        let before = q.ack;
        q.advance_ack();
        let ack = (q.ack != before).then_some(q.ack);
        self.actions.push_back(PopAction::Journal(PopRecord::Done {
            key: key.clone(),
            offset,
        }));
        if let Some(ack) = ack {
            self.actions.push_back(PopAction::CommitOffset {
                key: key.clone(),
                ack,
            });
        }
    }

    /// Changes the invisibility of a leased message to `invisible_ms` from `now`. The old
    /// receipt is void afterwards; the new one has the returned receipt time.
    ///
    /// # Errors
    /// [`ReceiptError`] as for [`PopEngine::handle_ack`].
    pub fn handle_change_invisible(
        &mut self,
        now: u64,
        key: &QueueKey,
        offset: u64,
        pop_time: u64,
        invisible_ms: u64,
    ) -> Result<Grant, ReceiptError> {
        self.lapse_due(now);
        if let Err(e) = self.check_receipt(now, key, offset, pop_time) {
            bump(&mut self.counters, &mut self.by_group, &key.group, |c| {
                c.refused += 1
            });
            return Err(e);
        }
        let invisible_ms = self.invisible_ms(invisible_ms);
        let new_time = self.next_pop_time(now);
        let deadline = now.saturating_add(invisible_ms);
        let q = self.queues.get_mut(key).ok_or(ReceiptError::NotInFlight)?;
        let l = q.leases.get_mut(&offset).ok_or(ReceiptError::NotInFlight)?;
        self.deadlines.remove(&(l.deadline, key.clone(), offset));
        l.pop_time = new_time;
        l.deadline = deadline;
        let record = PopRecord::Grant {
            key: key.clone(),
            offset,
            pop_time: new_time,
            deadline,
            attempts: l.attempts,
            consumer: l.consumer.clone(),
        };
        let attempts = l.attempts;
        self.deadlines.insert((deadline, key.clone(), offset));
        self.actions.push_back(PopAction::Journal(record));
        bump(&mut self.counters, &mut self.by_group, &key.group, |c| {
            c.changed += 1
        });
        Ok(Grant {
            pop_time: new_time,
            invisible_ms,
            leases: vec![Granted { offset, attempts }],
        })
    }

    /// Time passed: lapses the leases whose deadline is at or before `now` and retries
    /// failed revives that are due.
    pub fn handle_timeout(&mut self, now: u64) {
        self.lapse_due(now);
        while let Some(first) = self.retry_revives.first().cloned() {
            if first.0 > now {
                break;
            }
            self.retry_revives.pop_first();
            let (_, key, offset, pop_time) = first;
            let still = self
                .queues
                .get(&key)
                .and_then(|q| q.leases.get(&offset))
                .is_some_and(|l| l.pop_time == pop_time && l.state == LeaseState::Reviving);
            if still {
                let fifo = self.queues.get(&key).is_some_and(|q| q.fifo);
                self.actions.push_back(if fifo {
                    PopAction::DeadLetter {
                        key,
                        offset,
                        pop_time,
                    }
                } else {
                    PopAction::Revive {
                        key,
                        offset,
                        pop_time,
                    }
                });
            }
        }
    }

    fn lapse_due(&mut self, now: u64) {
        while let Some(first) = self.deadlines.first().cloned() {
            if first.0 > now {
                break;
            }
            self.deadlines.pop_first();
            let (_, key, offset) = first;
            let max_attempts = self.config.max_attempts;
            let Some(q) = self.queues.get_mut(&key) else {
                continue;
            };
            let fifo = q.fifo;
            let Some(l) = q.leases.get_mut(&offset) else {
                continue;
            };
            if l.state != LeaseState::Leased {
                continue;
            }
            bump(&mut self.counters, &mut self.by_group, &key.group, |c| {
                c.lapsed += 1
            });
            let pop_time = l.pop_time;
            if fifo && l.attempts < max_attempts {
                l.state = LeaseState::Lapsed;
            } else {
                l.state = LeaseState::Reviving;
                self.actions.push_back(if fifo {
                    PopAction::DeadLetter {
                        key,
                        offset,
                        pop_time,
                    }
                } else {
                    PopAction::Revive {
                        key,
                        offset,
                        pop_time,
                    }
                });
            }
        }
    }

    /// The copy of a lapsed message (retry or dead-letter topic) is durable: the offset is
    /// done. A report for a lease that is not being revived changes nothing.
    pub fn handle_revived(
        &mut self,
        key: &QueueKey,
        offset: u64,
        pop_time: u64,
        dead_letter: bool,
    ) {
        let reviving = self
            .queues
            .get(key)
            .and_then(|q| q.leases.get(&offset))
            .is_some_and(|l| l.pop_time == pop_time && l.state == LeaseState::Reviving);
        if reviving {
            bump(&mut self.counters, &mut self.by_group, &key.group, |c| {
                c.revived += 1;
                if dead_letter {
                    c.dead_lettered += 1;
                }
            });
            self.finish(key, offset);
        }
    }

    /// Writing the copy failed: tried again after `revive_retry_ms` (the message stays).
    pub fn handle_revive_failed(&mut self, now: u64, key: &QueueKey, offset: u64, pop_time: u64) {
        self.retry_revives.insert((
            now.saturating_add(self.config.revive_retry_ms),
            key.clone(),
            offset,
            pop_time,
        ));
    }

    /// The next action, if any. Journal records come before the answer they belong to is
    /// sent.
    #[must_use]
    pub fn poll_action(&mut self) -> Option<PopAction> {
        self.actions.pop_front()
    }

    /// When [`PopEngine::handle_timeout`] has something to do next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<u64> {
        let lease = self.deadlines.first().map(|d| d.0);
        let retry = self.retry_revives.first().map(|r| r.0);
        match (lease, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Rebuilds the state from journal records (a snapshot's, then the journal's, in order).
    /// Leases come back with their deadlines; those already past lapse at the next
    /// [`PopEngine::handle_timeout`]. Produces no actions.
    pub fn restore(&mut self, records: impl IntoIterator<Item = PopRecord>) {
        for r in records {
            match r {
                PopRecord::Base {
                    key,
                    ack,
                    cursor,
                    fifo,
                } => {
                    let q = self.queues.entry(key).or_default();
                    q.started = true;
                    q.journaled = true;
                    q.ack = q.ack.max(ack);
                    q.cursor = q.cursor.max(cursor).max(q.ack);
                    q.fifo = fifo;
                    let ack = q.ack;
                    q.leases.retain(|o, _| *o >= ack);
                    q.done.retain(|o| *o >= ack);
                }
                PopRecord::Cursor { key, cursor } => {
                    let q = self.queues.entry(key).or_default();
                    if !q.started {
                        q.started = true;
                        q.ack = cursor;
                    }
                    if cursor > q.cursor {
                        for o in q.cursor..cursor {
                            if !q.leases.contains_key(&o) {
                                q.done.insert(o);
                            }
                        }
                        q.cursor = cursor;
                    }
                    q.advance_ack();
                }
                PopRecord::Grant {
                    key,
                    offset,
                    pop_time,
                    deadline,
                    attempts,
                    consumer,
                } => {
                    let q = self.queues.entry(key).or_default();
                    if !q.started {
                        q.started = true;
                        q.ack = offset;
                        q.cursor = offset;
                    }
                    if offset < q.ack || q.done.contains(&offset) {
                        continue;
                    }
                    q.done.remove(&offset);
                    q.leases.insert(
                        offset,
                        Lease {
                            pop_time,
                            deadline,
                            attempts,
                            consumer,
                            state: LeaseState::Leased,
                        },
                    );
                    self.last_pop_time = self.last_pop_time.max(pop_time);
                }
                PopRecord::Done { key, offset } => {
                    let q = self.queues.entry(key).or_default();
                    q.leases.remove(&offset);
                    if offset >= q.ack {
                        q.done.insert(offset);
                    }
                    q.advance_ack();
                }
            }
        }
        self.deadlines.clear();
        for (key, q) in &mut self.queues {
            // A lease recorded before its cursor moved: the cursor covers it.
            if let Some((&last, _)) = q.leases.last_key_value() {
                q.cursor = q.cursor.max(last + 1);
            }
            q.done.retain(|o| *o < q.cursor);
            q.advance_ack();
            for (o, l) in &q.leases {
                self.deadlines.insert((l.deadline, key.clone(), *o));
            }
        }
        self.actions.clear();
    }

    /// Records that rebuild the current state (for compacting a journal): a base per queue,
    /// its leases and its out-of-order done offsets. Leases being revived come back leased
    /// with their (past) deadline, so a restart revives them again.
    pub fn snapshot(&self) -> Vec<PopRecord> {
        let mut out = Vec::new();
        for (key, q) in &self.queues {
            out.push(PopRecord::Base {
                key: key.clone(),
                ack: q.ack,
                cursor: q.cursor,
                fifo: q.fifo,
            });
            for (o, l) in &q.leases {
                out.push(PopRecord::Grant {
                    key: key.clone(),
                    offset: *o,
                    pop_time: l.pop_time,
                    deadline: l.deadline,
                    attempts: l.attempts,
                    consumer: l.consumer.clone(),
                });
            }
            for o in &q.done {
                out.push(PopRecord::Done {
                    key: key.clone(),
                    offset: *o,
                });
            }
        }
        out
    }

    /// A queue's acked offset and cursor, if the engine knows it.
    pub fn queue_offsets(&self, key: &QueueKey) -> Option<(u64, u64)> {
        self.queues.get(key).map(|q| (q.ack, q.cursor))
    }

    /// Messages under lease (or lapsed and not yet redelivered) per queue of `group`.
    pub fn inflight_of_group(&self, group: &str) -> Vec<(QueueKey, usize)> {
        self.queues
            .iter()
            .filter(|(k, _)| k.group == group)
            .map(|(k, q)| (k.clone(), q.inflight()))
            .collect()
    }

    /// Consumers holding leases in `group`, with how many each holds.
    pub fn consumers_of_group(&self, group: &str) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for (_, q) in self.queues.iter().filter(|(k, _)| k.group == group) {
            for l in q.leases.values().filter(|l| l.state == LeaseState::Leased) {
                *out.entry(l.consumer.clone()).or_insert(0) += 1;
            }
        }
        out
    }

    /// The counters of one group since the engine started.
    pub fn group_counters(&self, group: &str) -> PopCounters {
        self.by_group.get(group).copied().unwrap_or_default()
    }

    /// Groups with POP state.
    pub fn groups(&self) -> BTreeSet<String> {
        self.queues.keys().map(|k| k.group.clone()).collect()
    }

    /// Forgets every queue of `group` (the group was deleted).
    pub fn remove_group(&mut self, group: &str) {
        self.queues.retain(|k, _| k.group != group);
        self.deadlines.retain(|d| d.1.group != group);
        self.retry_revives.retain(|d| d.1.group != group);
        self.rotation.retain(|k, _| k.0 != group);
        self.by_group.remove(group);
    }

    /// True when every offset below the cursor of every queue is done or leased exactly once
    /// (the engine's invariant; tests check it after every step).
    pub fn check_invariants(&self) -> Result<(), String> {
        for (key, q) in &self.queues {
            if q.ack > q.cursor {
                return Err(format!("{key:?}: ack {} above cursor {}", q.ack, q.cursor));
            }
            for o in q.leases.keys() {
                if *o < q.ack || *o >= q.cursor {
                    return Err(format!(
                        "{key:?}: lease {o} outside [{}, {})",
                        q.ack, q.cursor
                    ));
                }
                if q.done.contains(o) {
                    return Err(format!("{key:?}: {o} both leased and done"));
                }
            }
            for o in &q.done {
                if *o <= q.ack || *o >= q.cursor {
                    return Err(format!(
                        "{key:?}: done {o} outside ({}, {})",
                        q.ack, q.cursor
                    ));
                }
            }
            if q.done.contains(&q.ack) {
                return Err(format!("{key:?}: ack {} not advanced", q.ack));
            }
            for o in q.ack..q.cursor {
                if !q.leases.contains_key(&o) && !q.done.contains(&o) {
                    return Err(format!(
                        "{key:?}: offset {o} neither leased nor done (lost)"
                    ));
                }
            }
        }
        Ok(())
    }
}
