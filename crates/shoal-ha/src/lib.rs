//! Shoal's high availability: replicated broker groups with a controller on raft-rs.
//!
//! A broker group (one `brokerName`) has replicas; one is master. The **controller**
//! ([`controller`]) holds every group's replication metadata (members and their broker ids,
//! master and master epoch, in-sync set and its epoch, the master's lease) as a replicated
//! state machine on raft-rs's `RawNode`. The **replication** state machines
//! ([`replication`]) ship the master's commit log to its replicas in batches that never span
//! two epochs, truncate a replica's divergent tail at the first point both logs agree on
//! (Kafka KIP-101, RocketMQ's epoch file), and acknowledge a write only when every in-sync
//! member has it and the master's lease holds.
//!
//! Everything here is sans-IO in quinn-proto's shape (`handle_*` with `now`, `poll_*` for what
//! to do, one time type [`Millis`]), so the seeded simulator ([`sim`]) drives exactly these
//! state machines with simulated networks, disks and clocks, and checks the safety invariants
//! after every step. `docs/ha.md` describes the design and what it promises.

pub mod controller;
pub mod replication;
pub mod sim;
pub mod time;

pub use time::{LeaseTiming, Millis, MAX_CLOCK_DRIFT_PPM};

/// A broker's id within its group, given by the controller (1, 2, ...; never reused). Routes
/// show the master as `brokerId` 0, as RocketMQ's do.
pub type BrokerId = u64;

/// A master epoch or an in-sync-set epoch: grows by one at every change.
pub type Epoch = u32;
