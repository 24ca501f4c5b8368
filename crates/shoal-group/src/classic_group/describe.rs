//! A classic group as `shoal group describe` shows it (through the broker's GROUP_DESCRIBE):
//! state, generation, protocol, leader and each member with the queues its assignment names.

use super::group::{ClassicGroup, GroupState};
use serde::Serialize;
use shoal_proto::mq::MessageQueue;

/// A classic group's snapshot for operators.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassicGroupDescription {
    /// Group id.
    pub group: String,
    /// Kafka's state name (`Empty`, `PreparingRebalance`, `CompletingRebalance`, `Stable`).
    pub state: &'static str,
    /// Current generation (0 before the first).
    pub generation: i32,
    /// Protocol type (`consumer` for Kafka consumers).
    pub protocol_type: Option<String>,
    /// The chosen protocol of the generation: the client-side assignor (`range`,
    /// `cooperative-sticky`, ...).
    pub protocol: Option<String>,
    /// The leader's member id.
    pub leader: Option<String>,
    /// Members, by member id.
    pub members: Vec<ClassicMemberDescription>,
}

/// A member of a classic group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassicMemberDescription {
    /// Member id.
    pub member_id: String,
    /// `group.instance.id` of a static member.
    pub instance_id: Option<String>,
    /// Client id.
    pub client_id: String,
    /// Client host (`/ip`).
    pub client_host: String,
    /// Whether it is the leader of the generation.
    pub leader: bool,
    /// The queues of its assignment of the current generation, as decoded by the listener
    /// (empty before the first sync, while a rebalance runs, or for an assignment it cannot
    /// read).
    pub owned: Vec<MessageQueue>,
}

impl ClassicGroup {
    /// The group's snapshot; `owned` decodes a member's opaque assignment (given the group's
    /// protocol type) into queues. Assignments are shown only while the group is `Stable`
    /// (during a rebalance the previous generation's assignment is no longer in force).
    pub fn describe(
        &self,
        owned: impl Fn(&str, &[u8]) -> Vec<MessageQueue>,
    ) -> ClassicGroupDescription {
        let protocol_type = self.protocol_type().unwrap_or("");
        let stable = self.state() == GroupState::Stable;
        ClassicGroupDescription {
            group: self.id().to_string(),
            state: self.state().name(),
            generation: self.generation(),
            protocol_type: self.protocol_type().map(str::to_string),
            protocol: self.protocol().map(str::to_string),
            leader: self.leader().map(str::to_string),
            members: self
                .members()
                .into_iter()
                .map(|m| ClassicMemberDescription {
                    leader: self.leader() == Some(m.member_id.as_str()),
                    owned: if stable {
                        owned(protocol_type, &m.assignment)
                    } else {
                        Vec::new()
                    },
                    member_id: m.member_id,
                    instance_id: m.instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                })
                .collect(),
        }
    }
}
