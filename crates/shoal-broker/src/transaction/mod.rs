//! Transactional messages, as RocketMQ's broker does them.
//!
//! - A send whose properties say `TRAN_MSG=true` is stored as a **half message** in
//!   `RMQ_SYS_TRANS_HALF_TOPIC` queue 0, with its real topic and queue saved in `REAL_TOPIC` /
//!   `REAL_QID` ([`half::to_half`]): consumers of the real topic do not see it.
//! - END_TRANSACTION ([`end`]) commits (the message is stored in its real topic and queue, with
//!   `preparedTransactionOffset` pointing at the half message) or rolls back; either way an op
//!   message (tag `d`, body `"<half queue offset>,"`) is appended to
//!   `RMQ_SYS_TRANS_OP_HALF_TOPIC`.
//! - The check service ([`service`], decisions in [`check`]) walks the half queue every
//!   `transaction_check_interval_ms`: a half message without a decision after
//!   `transaction_timeout_ms` is written back to the half queue with `TRANSACTION_CHECK_TIMES`
//!   raised and a producer of its group (`PGROUP`) is asked with CHECK_TRANSACTION_STATE; after
//!   `transaction_check_max` checks it is moved to `transaction_discard_topic`
//!   (`TRANS_CHECK_MAX_TIME_TOPIC`, or dropped when empty).
//! - Progress is kept as the offsets of the internal group `CID_RMQ_SYS_TRANS` on the half and
//!   op queues, persisted with every other consumer offset, so pending half messages are found
//!   again after a restart.
//!
//! Beyond RocketMQ: a transaction (by its `UNIQ_KEY`) is committed at most once. Decisions are
//! remembered (up to `transaction_max_remembered_decisions`, the oldest forgotten first, and
//! rebuilt from the op queue on start), so a second END_TRANSACTION, or one for a copy written
//! back by the checker, does not store the message twice.

pub(crate) mod check;
pub(crate) mod end;
pub(crate) mod front;
pub(crate) mod half;
pub(crate) mod service;

use std::collections::{HashMap, VecDeque};

/// Topic of half messages.
pub(crate) use shoal_proto::constants::TRANS_HALF_TOPIC as HALF_TOPIC;
/// Topic of op messages (decisions).
pub(crate) use shoal_proto::constants::TRANS_OP_HALF_TOPIC as OP_TOPIC;

/// RocketMQ's discard topic for half messages checked too often.
pub(crate) const CHECK_MAX_TIME_TOPIC: &str = "TRANS_CHECK_MAX_TIME_TOPIC";
/// The internal group whose offsets record the check service's progress.
pub(crate) const CHECK_GROUP: &str = "CID_RMQ_SYS_TRANS";
/// Tag of op messages.
pub(crate) const REMOVE_TAG: &str = "d";

/// What END_TRANSACTION decided for a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Stored in its real topic.
    Committed,
    /// Thrown away.
    RolledBack,
}

/// Decisions by transaction (the half message's `UNIQ_KEY`), bounded; oldest forgotten first.
#[derive(Debug)]
pub(crate) struct Decisions {
    max: usize,
    by_key: HashMap<String, Decision>,
    order: VecDeque<String>,
    forgotten: u64,
}

impl Decisions {
    /// Remembers at most `max` decisions.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            by_key: HashMap::new(),
            order: VecDeque::new(),
            forgotten: 0,
        }
    }

    /// The decision for a transaction, if remembered.
    pub(crate) fn get(&self, key: &str) -> Option<Decision> {
        self.by_key.get(key).copied()
    }

    /// Records a decision unless one exists; returns the one that stands.
    pub(crate) fn decide(&mut self, key: &str, d: Decision) -> Decision {
        if let Some(existing) = self.by_key.get(key) {
            return *existing;
        }
        if self.by_key.len() >= self.max {
            if let Some(old) = self.order.pop_front() {
                self.by_key.remove(&old);
                self.forgotten += 1;
            }
        }
        self.by_key.insert(key.to_string(), d);
        self.order.push_back(key.to_string());
        d
    }

    /// Forgets a decision (its storing failed; a retry or the check decides again).
    pub(crate) fn forget(&mut self, key: &str) {
        if self.by_key.remove(key).is_some() {
            self.order.retain(|k| k != key);
        }
    }

    #[cfg(test)]
    /// How many are remembered.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    #[cfg(test)]
    /// How many were forgotten because the limit was reached.
    pub(crate) fn forgotten(&self) -> u64 {
        self.forgotten
    }
}

/// The broker's transaction state: remembered decisions and counters.
#[derive(Debug)]
pub(crate) struct TransactionState {
    /// Decisions by transaction.
    pub decisions: parking_lot::Mutex<Decisions>,
    /// Counters.
    pub counters: TransactionCounters,
}

impl TransactionState {
    /// Remembering at most `max_decisions` decisions.
    pub(crate) fn new(max_decisions: usize) -> Self {
        Self {
            decisions: parking_lot::Mutex::new(Decisions::new(max_decisions)),
            counters: TransactionCounters::default(),
        }
    }
}

/// Counters of the transaction machinery (GET_BROKER_RUNTIME_INFO, logs).
#[derive(Debug, Default)]
pub(crate) struct TransactionCounters {
    /// Half messages stored.
    pub half_stored: std::sync::atomic::AtomicU64,
    /// Commits.
    pub committed: std::sync::atomic::AtomicU64,
    /// Rollbacks.
    pub rolled_back: std::sync::atomic::AtomicU64,
    /// END_TRANSACTION requests for an already decided transaction (ignored).
    pub duplicate_decisions: std::sync::atomic::AtomicU64,
    /// CHECK_TRANSACTION_STATE sent.
    pub checks_sent: std::sync::atomic::AtomicU64,
    /// Checks due with no producer of the group connected.
    pub checks_without_producer: std::sync::atomic::AtomicU64,
    /// Half messages discarded after too many checks.
    pub discarded: std::sync::atomic::AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_stand_and_are_bounded() {
        let mut d = Decisions::new(2);
        assert_eq!(d.decide("a", Decision::Committed), Decision::Committed);
        assert_eq!(d.decide("a", Decision::RolledBack), Decision::Committed);
        d.decide("b", Decision::RolledBack);
        d.decide("c", Decision::Committed);
        assert_eq!(d.len(), 2);
        assert_eq!(d.get("a"), None, "the oldest is forgotten first");
        assert_eq!(d.get("b"), Some(Decision::RolledBack));
        assert_eq!(d.forgotten(), 1);
    }
}
