//! What a simulated run found: the invariants it checks ([`Violation`]) and its report.

use super::Schedule;
use std::fmt;

/// What went wrong in a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Two members could deliver one queue at the same instant.
    TwoDispatchers {
        /// Virtual ms.
        at: u64,
        /// The queue.
        queue: i32,
        /// The member delivering.
        member: String,
        /// The member that could still deliver.
        other: String,
    },
    /// A committed offset went down.
    OffsetMovedBack {
        /// Virtual ms.
        at: u64,
        /// The queue.
        queue: i32,
        /// Before.
        from: i64,
        /// After.
        to: i64,
    },
    /// Messages never delivered by the end of the drain.
    Lost {
        /// How many.
        count: u64,
        /// A few of them (queue, offset).
        examples: Vec<(i32, i64)>,
    },
    /// The run made no progress in virtual time (a livelock).
    Stuck {
        /// Virtual ms.
        at: u64,
    },
    /// The group did not settle by the end of the drain.
    NotSettled {
        /// Queues without a single live owner.
        queues: Vec<i32>,
    },
    /// A run of graceful changes only fenced a member or delivered a message twice.
    NotGraceful {
        /// Queues fenced (leases, locks) plus fences by the coordinator.
        fences: u64,
        /// Deliveries beyond the first.
        duplicates: u64,
    },
    /// The coordinator's own invariants broke (a queue in two members' sets).
    Coordinator {
        /// Virtual ms.
        at: u64,
        /// What broke.
        detail: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::TwoDispatchers {
                at,
                queue,
                member,
                other,
            } => write!(
                f,
                "at {at} ms {member} delivered queue {queue} while {other} still could"
            ),
            Violation::OffsetMovedBack {
                at,
                queue,
                from,
                to,
            } => {
                write!(
                    f,
                    "at {at} ms the offset of queue {queue} went from {from} to {to}"
                )
            }
            Violation::Lost { count, examples } => {
                write!(f, "{count} messages never delivered, e.g. {examples:?}")
            }
            Violation::Stuck { at } => write!(f, "stuck at {at} ms (no progress)"),
            Violation::NotSettled { queues } => {
                write!(f, "queues {queues:?} have no single live owner at the end (or the coordinator is not reconciled)")
            }
            Violation::NotGraceful { fences, duplicates } => write!(
                f,
                "graceful changes only, yet {fences} fences and {duplicates} duplicates"
            ),
            Violation::Coordinator { at, detail } => {
                write!(f, "at {at} ms the coordinator broke an invariant: {detail}")
            }
        }
    }
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// The seed.
    pub seed: u64,
    /// The schedule that ran.
    pub schedule: Schedule,
    /// Invariant violations (empty: all held).
    pub violations: Vec<Violation>,
    /// Messages produced.
    pub produced: u64,
    /// Deliveries to listeners.
    pub deliveries: u64,
    /// Deliveries beyond the first of a message.
    pub duplicates: u64,
    /// From the end of the schedule until the group settled with everything delivered, ms.
    pub settle_ms: Option<u64>,
    /// Queues fenced by lease expiry or lost locks, over all members.
    pub fenced: u64,
}
