//! What brokers can make the controller hold.

use serde::{Deserialize, Serialize};

/// Limits on what brokers can make the controller hold; the same on every voter (they are
/// part of the deterministic apply). A voter starts with the defaults; the leader proposes
/// its configured limits as a [`super::Command::SetLimits`] when they differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataLimits {
    /// Broker groups at most.
    pub max_groups: usize,
    /// Members of one group at most (ids given, live or not).
    pub max_members: usize,
    /// Bytes of a group name, an address or a token at most.
    pub max_text_len: usize,
}

impl Default for MetadataLimits {
    fn default() -> Self {
        Self {
            max_groups: 4_096,
            max_members: 16,
            max_text_len: 256,
        }
    }
}
