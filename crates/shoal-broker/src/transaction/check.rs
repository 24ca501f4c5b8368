//! One round of the transaction check (RocketMQ's `TransactionalMessageServiceImpl.check`), as a
//! state machine without I/O: the driver feeds it the op messages (decisions) read from
//! `RMQ_SYS_TRANS_OP_HALF_TOPIC` and then, in queue order, the half messages of
//! `RMQ_SYS_TRANS_HALF_TOPIC`; for each half message it answers what to do, and at the end how
//! far both queues are done. The progress is stored as the offsets of the internal group
//! `CID_RMQ_SYS_TRANS`, so a restarted broker resumes where the last round stopped.

use std::collections::BTreeMap;

/// Limits of one check round (RocketMQ's `transactionTimeOut`, `transactionCheckMax`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CheckLimits {
    /// A half message younger than this (since it was born) is not checked yet, ms.
    pub timeout_ms: i64,
    /// Checks before a half message is discarded.
    pub check_max: i32,
}

/// What the checker sees of one half message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HalfView {
    /// Its offset in the half queue.
    pub queue_offset: u64,
    /// When the producer created it, ms.
    pub born_timestamp: i64,
    /// When this copy was stored, ms.
    pub store_timestamp: i64,
    /// `TRANSACTION_CHECK_TIMES`: checks so far (absent = 0).
    pub check_times: i32,
    /// `CHECK_IMMUNITY_TIME_IN_SECONDS`: the producer's own first-check delay, if any.
    pub immunity_secs: Option<i64>,
    /// `TRAN_PREPARED_QUEUE_OFFSET`: for a copy written back by the checker, the offset of the
    /// half message it continues.
    pub prepared_offset: Option<u64>,
}

/// The checker's decision for one half message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Committed or rolled back already: nothing to do.
    Decided,
    /// Checked `check_max` times without an answer: move it to the discard topic.
    Discard,
    /// Due: write it back to the half queue (check count + 1) and ask a producer of its
    /// group with CHECK_TRANSACTION_STATE.
    Check,
    /// Within the producer's own immunity time: write it back unchanged (keeping a pointer to
    /// the original offset) so the messages after it can be checked.
    Renew,
    /// Not due yet (or stored after the round began): the round ends here.
    Wait,
}

/// One check round over the half queue.
#[derive(Debug, Clone)]
pub(crate) struct CheckRound {
    limits: CheckLimits,
    start_ms: i64,
    now_ms: i64,
    half_start: u64,
    next_half: u64,
    op_start: u64,
    /// Decided half offset → the op offset that decided it.
    removed: BTreeMap<u64, u64>,
    /// Op offset → half offsets of it not yet passed by the round.
    op_pending: BTreeMap<u64, usize>,
    /// One past the last op offset read.
    op_end: u64,
}

impl CheckRound {
    /// A round starting at `half_offset` and `op_offset` at time `now_ms`.
    pub(crate) fn new(limits: CheckLimits, half_offset: u64, op_offset: u64, now_ms: i64) -> Self {
        Self {
            limits,
            start_ms: now_ms,
            now_ms,
            half_start: half_offset,
            next_half: half_offset,
            op_start: op_offset,
            removed: BTreeMap::new(),
            op_pending: BTreeMap::new(),
            op_end: op_offset,
        }
    }

    /// The time used for ages from now on (the driver advances it while the round runs).
    pub(crate) fn set_now(&mut self, now_ms: i64) {
        self.now_ms = now_ms;
    }

    /// An op message (decisions): at `op_offset`, deciding the half offsets listed.
    pub(crate) fn add_op(&mut self, op_offset: u64, half_offsets: &[u64]) {
        let mut live = 0;
        for &h in half_offsets {
            if h >= self.half_start {
                self.removed.insert(h, op_offset);
                live += 1;
            }
        }
        if live > 0 {
            self.op_pending.insert(op_offset, live);
        }
        self.op_end = self.op_end.max(op_offset + 1);
    }

    /// The half offset the round wants next.
    pub(crate) fn next_half(&self) -> u64 {
        self.next_half
    }

    /// The half queue has nothing at `next_half` up to `to` (expired by retention): move on.
    pub(crate) fn skip_to(&mut self, to: u64) {
        while self.next_half < to {
            self.consume_removed(self.next_half);
            self.next_half += 1;
        }
    }

    fn consume_removed(&mut self, half: u64) -> bool {
        let Some(op) = self.removed.remove(&half) else {
            return false;
        };
        if let Some(n) = self.op_pending.get_mut(&op) {
            *n -= 1;
            if *n == 0 {
                self.op_pending.remove(&op);
            }
        }
        true
    }

    /// Whether an END_TRANSACTION for the half message at `queue_offset` was seen by this
    /// round (directly, or for the original a copy continues).
    pub(crate) fn is_decided(&self, m: &HalfView) -> bool {
        self.removed.contains_key(&m.queue_offset)
            || m.prepared_offset
                .is_some_and(|p| self.removed.contains_key(&p))
    }

    /// Judges the half message at `next_half` and, unless the answer is [`Verdict::Wait`],
    /// moves past it.
    pub(crate) fn judge(&mut self, m: &HalfView) -> Verdict {
        debug_assert_eq!(m.queue_offset, self.next_half);
        let verdict = self.verdict(m);
        if verdict != Verdict::Wait {
            self.consume_removed(m.queue_offset);
            if let Some(p) = m.prepared_offset {
                if verdict == Verdict::Decided {
                    self.consume_removed(p);
                }
            }
            self.next_half = m.queue_offset + 1;
        }
        verdict
    }

    fn verdict(&self, m: &HalfView) -> Verdict {
        if self.is_decided(m) {
            return Verdict::Decided;
        }
        if m.check_times >= self.limits.check_max {
            return Verdict::Discard;
        }
        if m.store_timestamp >= self.start_ms {
            return Verdict::Wait;
        }
        let age = self.now_ms - m.born_timestamp;
        match m.immunity_secs {
            Some(s) => {
                let immunity = (s.saturating_mul(1000)).max(self.limits.timeout_ms);
                if (0..immunity).contains(&age) {
                    Verdict::Renew
                } else {
                    Verdict::Check
                }
            }
            None if (0..self.limits.timeout_ms).contains(&age) => Verdict::Wait,
            None => Verdict::Check,
        }
    }

    /// Where the round ends: the next half offset to look at, and the first op offset whose
    /// decisions are not all passed yet.
    pub(crate) fn progress(&self) -> (u64, u64) {
        let op = self
            .op_pending
            .keys()
            .next()
            .copied()
            .unwrap_or(self.op_end)
            .max(self.op_start);
        (self.next_half, op)
    }
}

/// Parses an op message body: half queue offsets separated by commas (`"3,4,"`).
pub(crate) fn parse_op_body(body: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(body)
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CheckLimits = CheckLimits {
        timeout_ms: 6_000,
        check_max: 15,
    };

    fn half(offset: u64, born: i64) -> HalfView {
        HalfView {
            queue_offset: offset,
            born_timestamp: born,
            store_timestamp: born,
            check_times: 0,
            immunity_secs: None,
            prepared_offset: None,
        }
    }

    #[test]
    fn decided_messages_are_passed_and_the_op_queue_advances() {
        let mut r = CheckRound::new(LIMITS, 0, 0, 100_000);
        r.add_op(0, &[0]);
        r.add_op(1, &[2]);
        assert_eq!(r.judge(&half(0, 1_000)), Verdict::Decided);
        assert_eq!(r.progress(), (1, 1), "op 0 fully passed, op 1 still ahead");
        assert_eq!(r.judge(&half(1, 1_000)), Verdict::Check);
        assert_eq!(r.judge(&half(2, 1_000)), Verdict::Decided);
        assert_eq!(r.progress(), (3, 2));
    }

    #[test]
    fn young_messages_stop_the_round() {
        let mut r = CheckRound::new(LIMITS, 5, 0, 10_000);
        assert_eq!(r.judge(&half(5, 3_000)), Verdict::Check, "7 s old");
        assert_eq!(r.judge(&half(6, 5_000)), Verdict::Wait, "5 s old: not yet");
        assert_eq!(r.progress().0, 6, "the round stays at the young message");
        let mut stored_late = half(6, 1_000);
        stored_late.store_timestamp = 10_000;
        assert_eq!(
            r.judge(&stored_late),
            Verdict::Wait,
            "stored after the round began"
        );
    }

    #[test]
    fn too_many_checks_discard() {
        let mut r = CheckRound::new(LIMITS, 0, 0, 100_000);
        let mut m = half(0, 1_000);
        m.check_times = 14;
        assert_eq!(r.judge(&m), Verdict::Check, "the 15th check");
        let mut m = half(1, 1_000);
        m.check_times = 15;
        assert_eq!(r.judge(&m), Verdict::Discard);
    }

    #[test]
    fn immunity_time_renews_instead_of_stopping() {
        let mut r = CheckRound::new(LIMITS, 0, 0, 20_000);
        let mut m = half(0, 10_000);
        m.immunity_secs = Some(60);
        assert_eq!(r.judge(&m), Verdict::Renew, "10 s old, immune for 60 s");
        assert_eq!(
            r.judge(&half(1, 1_000)),
            Verdict::Check,
            "the next one is checked"
        );
        let mut short = half(2, 1_000);
        short.immunity_secs = Some(1);
        assert_eq!(
            r.judge(&short),
            Verdict::Check,
            "immunity below the timeout counts as the timeout; 19 s old is due"
        );
    }

    #[test]
    fn a_copy_is_decided_by_its_original() {
        // 3 was renewed (immunity) as 9 in this round, then its decision is read.
        let mut r = CheckRound::new(LIMITS, 3, 0, 100_000);
        r.add_op(7, &[1, 3]); // 1 is before the round: ignored
        let mut copy = half(9, 1_000);
        copy.prepared_offset = Some(3);
        assert!(r.is_decided(&copy));
        r.skip_to(9);
        assert_eq!(r.progress(), (9, 8), "passing 3 completes op 7");
        let mut r = CheckRound::new(LIMITS, 3, 0, 100_000);
        r.add_op(7, &[3]);
        let mut original = half(3, 99_000);
        original.immunity_secs = Some(60);
        r.skip_to(3);
        assert_eq!(r.judge(&original), Verdict::Decided);
    }

    #[test]
    fn op_bodies() {
        assert_eq!(parse_op_body(b"3,4,"), vec![3, 4]);
        assert_eq!(parse_op_body(b""), Vec::<u64>::new());
        assert_eq!(parse_op_body(b"x,5"), vec![5]);
    }
}
