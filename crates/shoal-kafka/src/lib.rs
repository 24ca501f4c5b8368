//! `shoal-kafka`: a Kafka wire-protocol listener on Shoal's broker, so that Kafka clients
//! produce, fetch and form consumer groups on the same store, topics and offsets as RocketMQ
//! clients (`docs/kafka.md` in the repository has the mapping and the supported APIs).
//!
//! - [`KafkaServer::start`] binds the listener; the broker's services come through
//!   [`BrokerHandle`] (this crate does not depend on `shoal-broker`; the `shoal` binary
//!   implements the trait over a running broker).
//! - Codecs are the `kafka-protocol` crate's; records are converted to and from RocketMQ's
//!   stored message format ([`convert`]).
//! - Classic consumer groups run on `shoal_group::classic_group` (sans-IO), driven here.
//! - The listener's [`Counters`] are exported to Prometheus by [`KafkaCollector`]
//!   ([`KafkaServer::metrics_collector`]), read at scrape time.

#![warn(missing_docs)]

mod api;
mod batch_writer;
mod classic_groups;
mod clock;
pub mod cluster;
mod config;
mod consumer_group;
pub mod convert;
pub mod epochs;
mod error;
mod fetch;
mod fetch_hold;
mod groups;
mod guard;
mod host;
mod member_cache;
mod metadata;
mod metrics;
mod offsets;
mod produce;
mod producer;
mod producer_log;
mod records;
mod request;
mod server;
mod state;
/// Record builders shared by the unit tests, `tests/` and `benches/`.
#[cfg(test)]
#[path = "../tests/support/records.rs"]
mod test_records;
mod unsupported;

pub use config::{KafkaConfig, KafkaFile};
pub use error::KafkaError;
pub use host::{BrokerHandle, ReplicaRefusal, TopicInfo, WaitPosition};
pub use metrics::KafkaCollector;
pub use server::KafkaServer;
pub use state::{topic_id, Counters};

/// The APIs and version ranges the listener implements, as ApiVersions reports them:
/// (API key, min version, max version).
pub fn supported_apis() -> Vec<(i16, i16, i16)> {
    api::SUPPORTED
        .iter()
        .map(|(k, lo, hi)| (*k as i16, *lo, *hi))
        .collect()
}
