//! How a controller voter is set up, and why building one fails.

use super::metadata::MetadataLimits;
use crate::time::{LeaseTiming, Millis};

/// How a voter is set up.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// This voter's id (non-zero).
    pub id: u64,
    /// Every voter's id, this one included.
    pub voters: Vec<u64>,
    /// One Raft tick.
    pub tick_ms: Millis,
    /// Raft's election timeout in ticks (each voter adds its own offset, see
    /// [`ControllerNode::new`]).
    pub election_ticks: usize,
    /// Raft's heartbeat interval in ticks.
    pub heartbeat_ticks: usize,
    /// A broker not heard from for this long is dead.
    pub session_timeout_ms: Millis,
    /// Lease and election delay.
    pub lease: LeaseTiming,
    /// What the metadata may hold: proposed by this voter when it leads, so every voter
    /// applies the leader's (see [`super::Command::SetLimits`]).
    pub limits: MetadataLimits,
    /// Requests waiting for their entry to apply, at most.
    pub max_pending: usize,
    /// Replace the applied log by a snapshot every this many entries.
    pub compact_every: u64,
}

impl ControllerConfig {
    /// A voter with the defaults: 100 ms ticks, 1 s election timeout, 2 s session, 1 s lease,
    /// 1.2 s election delay (docs/ha.md says why).
    pub fn new(id: u64, voters: Vec<u64>) -> Self {
        Self {
            id,
            voters,
            tick_ms: 100,
            election_ticks: 10,
            heartbeat_ticks: 2,
            session_timeout_ms: 2_000,
            lease: LeaseTiming::default(),
            limits: MetadataLimits::default(),
            max_pending: 1_024,
            compact_every: 10_000,
        }
    }
}

/// Errors building a voter.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// raft-rs refused the configuration or the storage.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// This voter's id is not among the voters.
    #[error("voter {0} is not in the voter list")]
    NotAVoter(u64),
    /// The snapshot on disk does not decode.
    #[error("snapshot: {0}")]
    Snapshot(#[from] serde_json::Error),
}
