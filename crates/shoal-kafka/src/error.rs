//! The crate's error type.

use kafka_protocol::ResponseError;

/// Errors of the Kafka listener and of the broker operations it asks for.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// The listen address could not be bound.
    #[error("kafka listener cannot listen on {addr}: {source}")]
    Bind {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The configuration is unusable.
    #[error("kafka listener configuration: {0}")]
    Config(String),
    /// A topic name is not acceptable to the broker.
    #[error("invalid topic: {0}")]
    InvalidTopic(String),
    /// The topic exists already.
    #[error("topic {0} already exists")]
    TopicExists(String),
    /// The topic does not exist.
    #[error("topic {0} does not exist")]
    UnknownTopic(String),
    /// A partition count or other request value is refused.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The group name is not acceptable to the broker.
    #[error("invalid group id: {0}")]
    InvalidGroup(String),
    /// The group has RocketMQ members on the classic protocol (client-side allocation), so
    /// the coordinator does not serve it.
    #[error("group {0} has RocketMQ members that allocate client-side (classic protocol)")]
    ClassicGroup(String),
    /// The store refused an operation.
    #[error("message store: {0}")]
    Store(#[from] shoal_store::StoreError),
    /// Something else went wrong in the broker.
    #[error("{0}")]
    Broker(String),
    /// This broker's coordinator answers no member: a replica.
    #[error("{0}")]
    NotCoordinator(String),
    /// This broker is the group's new master and still takes over the group's state: it
    /// answers the group's members once it has (COORDINATOR_LOAD_IN_PROGRESS, which clients
    /// retry on the same coordinator after a short back-off).
    #[error("{0}")]
    CoordinatorLoading(String),
    /// A replica: topics change on its group's master (the Kafka controller it names).
    #[error("{0}")]
    NotController(String),
}

impl KafkaError {
    /// The Kafka error code that reports this error to a client.
    pub fn code(&self) -> i16 {
        let e = match self {
            KafkaError::InvalidTopic(_) => ResponseError::InvalidTopicException,
            KafkaError::TopicExists(_) => ResponseError::TopicAlreadyExists,
            KafkaError::UnknownTopic(_) => ResponseError::UnknownTopicOrPartition,
            KafkaError::InvalidRequest(_) => ResponseError::InvalidRequest,
            KafkaError::InvalidGroup(_) => ResponseError::InvalidGroupId,
            KafkaError::ClassicGroup(_) => ResponseError::GroupIdNotFound,
            KafkaError::Store(shoal_store::StoreError::MessageTooLarge { .. }) => {
                ResponseError::MessageTooLarge
            }
            KafkaError::Store(_) | KafkaError::Broker(_) => ResponseError::KafkaStorageError,
            KafkaError::NotCoordinator(_) => ResponseError::NotCoordinator,
            KafkaError::CoordinatorLoading(_) => ResponseError::CoordinatorLoadInProgress,
            KafkaError::NotController(_) => ResponseError::NotController,
            KafkaError::Bind { .. } | KafkaError::Config(_) => ResponseError::UnknownServerError,
        };
        e.code()
    }
}
