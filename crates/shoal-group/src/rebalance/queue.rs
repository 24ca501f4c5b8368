//! The state of one queue inside the [`Rebalancer`](super::Rebalancer).

use super::ms;
use super::{Action, Lease, RebalancerConfig};
use shoal_proto::MessageQueue;
use std::collections::VecDeque;
use std::time::Duration;

/// Where a queue is in its life, as introspection shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum QueuePhase {
    /// In the target, waiting to ask for the lock (or for the hand-over delay).
    Pending,
    /// Lock requested.
    Acquiring,
    /// Lock held; the start offset is being read.
    Starting,
    /// Started: messages are delivered while the lease is valid.
    Owned,
    /// Stopped (or fenced); in-flight deliveries are finishing.
    Draining,
    /// Final offset being committed.
    Committing,
    /// Lock being released.
    Unlocking,
}

/// What follows a drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    /// Graceful hand-over: commit, unlock, forget.
    Release,
    /// Offset reset: commit this offset and start again from it.
    Restart(i64),
    /// Lease lost: commit nothing; acquire again if still in the target.
    Fenced,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QState {
    Pending {
        retry_at: Option<u64>,
    },
    Acquiring,
    /// `retry_at`: a failed query is retried then; `None` while one is in flight.
    Starting {
        retry_at: Option<u64>,
    },
    /// Lock held and start offset known, but a membership notice came after the view the
    /// target rests on: the queue starts once a fresh view still gives it to this member
    /// (or is unlocked if it does not), so it does not make an intermediate hand-over.
    Ready {
        offset: i64,
    },
    Owned,
    Draining {
        after: After,
    },
    Committing {
        after: After,
    },
    /// `retry_at`: a failed unlock is sent again then; `None` while one is in flight.
    Unlocking {
        retry_at: Option<u64>,
    },
}

impl QState {
    /// States in which the broker lock is (believed) held.
    pub(super) fn holds_lock(&self) -> bool {
        matches!(
            self,
            QState::Starting { .. }
                | QState::Ready { .. }
                | QState::Owned
                | QState::Draining { .. }
                | QState::Committing { .. }
        )
    }
}

#[derive(Debug, Clone)]
pub(super) struct Queue {
    pub(super) state: QState,
    /// The lease of the held lock (`None`: none, or lost).
    pub(super) lease: Option<Lease>,
    /// Guarded by a lock (hand-over by locks): no lease means no deliveries.
    guarded: bool,
    /// A renewal request is in flight.
    pub(super) renewing: bool,
    /// Current wait between refused lock requests.
    pub(super) backoff: Duration,
    /// The lease was lost while owned: fence at the next step.
    pub(super) fence_now: bool,
    /// A lock request's outcome is unknown (no answer): unlock before forgetting the queue.
    pub(super) maybe_locked: bool,
    /// Failed unlocks so far.
    pub(super) unlock_failures: u32,
    /// A lock-freed notice came while the lock request was in flight: the notice may have
    /// overtaken the refusal, so a refusal is asked again at once.
    pub(super) freed_while_acquiring: bool,
    /// The broker that granted the lock applies a final commit carried on the unlock
    /// ([`LockAnswer::commit_on_unlock`](super::LockAnswer::commit_on_unlock)).
    pub(super) commit_on_unlock: bool,
    /// The final offset of a graceful release sent with the unlock (sent again with a retry).
    pub(super) final_offset: Option<i64>,
    /// A renewal answered "granted" while the unlock was in flight: the broker may have
    /// processed the renewal after the unlock, so another unlock follows.
    pub(super) unlock_again: bool,
    /// The start offset was resolved by consume-from-where (the group has none) and the queue
    /// has not started: a release commits it (see
    /// [`StartOffset::Resolved`](super::StartOffset::Resolved)).
    pub(super) unsaved_start: Option<i64>,
}

impl Queue {
    pub(super) fn new(state: QState, guarded: bool) -> Self {
        Self {
            state,
            lease: None,
            guarded,
            renewing: false,
            backoff: Duration::ZERO,
            fence_now: false,
            maybe_locked: false,
            unlock_failures: 0,
            freed_while_acquiring: false,
            commit_on_unlock: false,
            final_offset: None,
            unlock_again: false,
            unsaved_start: None,
        }
    }

    pub(super) fn phase(&self) -> QueuePhase {
        match self.state {
            QState::Pending { .. } => QueuePhase::Pending,
            QState::Acquiring => QueuePhase::Acquiring,
            QState::Starting { .. } | QState::Ready { .. } => QueuePhase::Starting,
            QState::Owned => QueuePhase::Owned,
            QState::Draining { .. } => QueuePhase::Draining,
            QState::Committing { .. } => QueuePhase::Committing,
            QState::Unlocking { .. } => QueuePhase::Unlocking,
        }
    }

    pub(super) fn lease_valid(&self, now: u64) -> bool {
        match self.lease {
            Some(l) => l.until > now,
            None => !self.guarded,
        }
    }

    /// The next time something is due for this queue.
    pub(super) fn deadline(&self) -> Option<u64> {
        let mut t = match self.state {
            QState::Pending { retry_at }
            | QState::Starting { retry_at }
            | QState::Unlocking { retry_at } => retry_at,
            _ => None,
        };
        if self.state.holds_lock() {
            if let Some(l) = self.lease {
                let mut due = l.until;
                if !self.renewing {
                    due = due.min(l.renew_at);
                }
                t = Some(t.map_or(due, |t| t.min(due)));
            }
        }
        t
    }

    /// A refused (or failed) lock request: try again after the back-off.
    pub(super) fn retry_later(&mut self, now: u64, c: &RebalancerConfig, notice: bool) {
        if std::mem::take(&mut self.freed_while_acquiring) {
            self.state = QState::Pending {
                retry_at: Some(now),
            };
            return;
        }
        self.backoff = if notice {
            c.lock_retry_notified
        } else if self.backoff.is_zero() {
            c.lock_retry_min
        } else {
            (self.backoff * 2).min(c.lock_retry_max)
        };
        self.state = QState::Pending {
            retry_at: Some(now + ms(self.backoff)),
        };
    }

    /// New evidence for a held lock.
    pub(super) fn extend(&mut self, lease: Lease, mq: &MessageQueue, out: &mut VecDeque<Action>) {
        let Some(cur) = self.lease else { return };
        if !self.state.holds_lock() {
            return;
        }
        let next = Lease {
            until: cur.until.max(lease.until),
            renew_at: cur.renew_at.max(lease.renew_at),
            session: lease.session,
        };
        self.lease = Some(next);
        // Owned: deliveries go on; draining: the driver keeps waiting for in-flight listener
        // calls while the lock is ours.
        if next.until != cur.until && matches!(self.state, QState::Owned | QState::Draining { .. })
        {
            out.push_back(Action::Lease {
                mq: mq.clone(),
                until: next.until,
            });
        }
    }

    /// The lock is no longer ours (lease ran out, renewal refused, session ended).
    pub(super) fn lose_lease(&mut self, now: u64) {
        self.lease = None;
        self.unsaved_start = None;
        match self.state {
            QState::Owned => self.fence_now = true,
            QState::Starting { .. } | QState::Ready { .. } => {
                self.state = QState::Pending {
                    retry_at: Some(now),
                }
            }
            _ => {}
        }
    }
}
