//! `shoal-group`: consumer-group logic with no I/O (see `shared/DESIGN.md` section 3).
//!
//! - [`allocate`]: allocation strategies (RocketMQ's, Kafka's and Shoal's balanced-sticky), one
//!   trait [`AllocateStrategy`] with a per-member view (classic client-side mode) and a
//!   whole-assignment view (coordinated mode) that agree, plus movement metrics used by
//!   `shoal rebalance simulate`.
//! - [`membership`]: who is in a consumer group (members by connection, their subscriptions,
//!   expiry, and the health checks for duplicate client ids and inconsistent subscriptions).
//! - [`lock`]: queue locks for orderly consumption, with a TTL.
//! - [`coordinator`]: the group coordinator of coordinated mode (member and group epochs,
//!   target assignment, revoke-then-assign reconciliation, fencing, static membership).

pub mod allocate;
pub mod coordinator;
pub mod error;
pub mod lock;
pub mod membership;

pub use allocate::{
    strategy_by_name, AllocateStrategy, AllocationContext, AllocationInput, Assignment,
    STRATEGY_NAMES,
};
pub use error::{GroupError, Result};
