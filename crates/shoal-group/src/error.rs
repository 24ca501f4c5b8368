//! The one error type of `shoal-group`.

/// Everything that can go wrong in consumer-group logic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// A strategy name that no strategy answers to.
    #[error("unknown allocation strategy {0:?}")]
    UnknownStrategy(String),
    /// A zone-aware strategy was asked about a member whose machine room is not known.
    #[error("machine room of member {0:?} is not known")]
    MemberZoneMissing(String),
    /// A zone-aware strategy was asked about a queue whose broker's machine room is not known.
    #[error("machine room of broker {0:?} is not known")]
    BrokerZoneMissing(String),
    /// A strategy parameter out of range (e.g. a virtual node count that is too large).
    #[error("invalid strategy parameter: {0}")]
    InvalidParameter(String),
    /// Coordinated mode: the member's epoch is not one the coordinator accepts (ahead of the
    /// coordinator's, or its report does not match what it was given). The member must drop
    /// its queues and rejoin with epoch 0.
    #[error("member {member:?} of group {group:?} is fenced: epoch {received}, coordinator has {current}{detail}")]
    FencedMemberEpoch {
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The epoch the member sent.
        received: i32,
        /// The member's epoch at the coordinator.
        current: i32,
        /// What else was wrong (empty, or starting with `: `).
        detail: String,
    },
    /// Coordinated mode: the member id is not (or no longer) a member of the group: it was
    /// fenced, expired, left or was replaced by a newer instance. It must rejoin with epoch 0.
    #[error("{member:?} is not a member of group {group:?}")]
    UnknownMember {
        /// The group.
        group: String,
        /// The member.
        member: String,
    },
    /// Coordinated mode: a static member joined with an instance id that a live member holds.
    #[error("instance id {instance:?} of group {group:?} is held by live member {holder:?}")]
    UnreleasedInstanceId {
        /// The group.
        group: String,
        /// The instance id.
        instance: String,
        /// The member that holds it.
        holder: String,
    },
    /// Coordinated mode: a pull, commit or lock of a queue the member does not own.
    #[error("queue {queue} is not assigned to member {member:?} of group {group:?}")]
    QueueNotAssigned {
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The queue, as `topic@broker#id`.
        queue: String,
    },
    /// Coordinated mode: a group already has the configured maximum of members.
    #[error("group {group:?} is full ({max} members)")]
    GroupFull {
        /// The group.
        group: String,
        /// The limit (`coordinator_max_members_per_group`).
        max: usize,
    },
    /// Coordinated mode: the coordinator already serves the configured maximum of groups.
    #[error("the coordinator already serves {0} groups")]
    TooManyGroups(usize),
    /// Coordinated mode: a request the coordinator cannot accept as sent.
    #[error("invalid group request: {0}")]
    InvalidRequest(String),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, GroupError>;
