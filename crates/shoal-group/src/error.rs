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
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, GroupError>;
