//! `shoal-group`: consumer-group logic with no I/O (its place among the crates and the sans-IO
//! contract: `docs/architecture.md`; the strategies and the simulator: `docs/rebalance.md`).
//!
//! - [`allocate`]: allocation strategies (RocketMQ's, Kafka's and Shoal's balanced-sticky), one
//!   trait [`AllocateStrategy`] with a per-member view (classic client-side mode) and a
//!   whole-assignment view (coordinated mode) that agree, plus movement metrics used by
//!   `shoal rebalance simulate`.
//! - [`membership`]: who is in a consumer group (members by connection, their subscriptions,
//!   expiry, and the health checks for duplicate client ids and inconsistent subscriptions).
//! - [`lock`]: queue locks (orderly and, for Shoal members, concurrent consumption), with a TTL
//!   or for the holder's session, and the members waiting for them.
//! - [`rebalance`]: the client-side [`rebalance::Rebalancer`], a sans-IO state machine shared by
//!   the push and lite pull consumers (hand-over by locks, leases, fencing).
//! - [`member`]: a consumer's membership of a coordinated group (client side): heartbeats,
//!   answers, fences, coordinator moves, as a sans-IO state machine the client drives.
//! - [`sim`]: a deterministic simulator of rebalancers against a simulated broker, with seeded
//!   schedules of joins, leaves, kills, pauses, lost notices and route changes.
//! - [`coordinator`]: the group coordinator of coordinated mode (member and group epochs,
//!   target assignment, revoke-then-assign reconciliation, fencing, static membership).
//! - [`state`]: the broker's group state behind one owner: the registry, the locks and the
//!   coordinator together, their fences, and every reaction to a membership change as effects.
//! - [`classic_group`]: Kafka's classic JoinGroup/SyncGroup group protocol as a sans-IO state
//!   machine (generations, leader-computed assignments, static membership).

pub mod allocate;
pub mod classic_group;
pub mod coordinator;
pub mod error;
pub mod lock;
pub mod member;
pub mod membership;
pub mod pop;
pub mod rebalance;
pub mod sim;
pub mod state;

pub use allocate::{
    strategy_by_name, AllocateStrategy, AllocationContext, AllocationInput, Assignment,
    STRATEGY_NAMES,
};
pub use error::{GroupError, Result};
