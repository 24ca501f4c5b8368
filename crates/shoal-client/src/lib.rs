//! `shoal-client`: producer, push consumer, lite pull consumer and admin client for Shoal and
//! Apache RocketMQ brokers (remoting protocol).
//!
//! - [`Producer`] (build with [`Producer::builder`]): sync / async / oneway sends, batches,
//!   selectors (ordered messages), latency fault tolerance ([`fault`]).
//! - [`PushConsumer`] (build with [`PushConsumer::builder`]): clustering or broadcasting,
//!   concurrent or orderly listeners, classic client-side rebalance with Shoal's fixes
//!   (immediate rebalance on notification, graceful hand-over, broker-held orderly locks,
//!   offsets never moved back by a former owner), retry and DLQ.
//! - [`LitePullConsumer`]: subscribe (with rebalance) or assign, `poll`, commits, seeks,
//!   pause/resume.
//! - [`AdminClient`]: topics, cluster, consumer progress with owners, connections, offset
//!   resets, messages by id, DLQ re-send.
//! - [`TransactionProducer`]: transactional messages (half message, local transaction,
//!   commit or rollback, answers to the broker's checks).
//! - [`ClientInstance`]: the shared machinery (client id, routes, heartbeats, typed requests).
//!
//! Sans-IO parts: [`fault`], [`process_queue`], [`offset_store`].

pub mod admin;
pub mod config;
pub mod consumer;
pub mod coordinated;
pub mod error;
pub mod fault;
pub mod instance;
pub mod lite_pull;
pub mod metrics;
pub mod offset_store;
pub mod pop;
pub mod process_queue;
pub mod producer;
mod rebalance;
mod send_header;
pub mod transaction;
mod transaction_check;

pub use config::ClientConfig;
pub use consumer::{
    ConsumeConcurrentlyStatus, ConsumeContext, ConsumeOrderlyStatus, ConsumerConfig,
    MessageListener, PushConsumer, PushConsumerBuilder,
};
pub use coordinated::GroupProtocol;
pub use error::{ClientError, Result};
pub use instance::ClientInstance;
pub use lite_pull::{LitePullConfig, LitePullConsumer};
pub use pop::{PopConsumeResult, PopConsumer, PopConsumerConfig, PoppedMessage};

pub use admin::{AdminClient, GroupProgress, QueueProgress, TopicSpec};
pub use producer::{Producer, ProducerBuilder, ProducerConfig, SendResult, SendStatus};
pub use shoal_proto::body::{ConsumeFromWhere, MessageModel};
pub use shoal_proto::message::{Message, MessageExt};
pub use shoal_proto::MessageQueue;
pub use transaction::{LocalTransactionState, TransactionProducer, TransactionSendResult};

/// Milliseconds since the Unix epoch.
/// Milliseconds from a process-wide origin to `at`: the fault tolerance's clock (monotonic, so
/// a wall-clock step neither isolates nor frees a broker; and derived from an `Instant` a send
/// already read, so it costs no clock read of its own).
pub(crate) fn mono_ms(at: std::time::Instant) -> u64 {
    // Offset so that 0 ("never") is not a time the clock gives.
    at.saturating_duration_since(origin()).as_millis() as u64 + MONO_OFFSET_MS
}

/// The process-wide origin of [`mono_ms`].
fn origin() -> std::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

const MONO_OFFSET_MS: u64 = 1_000;

/// The `Instant` of a [`mono_ms`] time (the rebalancer's leases, checked per delivery).
pub(crate) fn instant_of(ms: u64) -> std::time::Instant {
    origin() + std::time::Duration::from_millis(ms.saturating_sub(MONO_OFFSET_MS))
}

pub(crate) fn now_ms_u64() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}
