//! `shoal-broker`: the broker.
//!
//! [`Broker::start`] opens the store, loads the topic and subscription-group tables, listens,
//! registers with the name servers and runs the background services (group timers, delay-level
//! delivery, transaction checks, registration). Its state is held by a few owners, each with
//! private fields behind one short lock (`shared.rs` lists them); requests are routed by the
//! processor to handler families (send, pull, offsets, client and locks, coordinated groups,
//! retries, transactions, admin), each of which receives the owners it needs. What runs around
//! the broker in one process (the `shoal` binary's HTTP port, the Kafka listener) uses
//! [`BrokerApi`]. `docs/architecture.md` walks through the paths of a send, a pull, a
//! heartbeat and a rebalance.

mod admin;
mod api;
mod broker;
mod caller;
mod client;
mod clock;
mod cluster_view;
mod collector;
mod config;
mod connections;
mod coordinated;
mod fence;
mod filter;
mod group_config;
mod group_ctx;
mod groups;
#[cfg(test)]
mod harness;
mod hold;
mod lease;
mod listener;
mod messaging;
mod metrics;
mod namesrv;
mod observe;
mod offsets;
mod persist;
mod pop;
mod processor;
mod pull;
mod replication;
mod reply;
mod retry;
mod route_notices;
mod schedule;
mod selectors;
mod send;
mod shared;
mod stats;
mod sub_groups;
mod timeline;
mod topic;
mod topics;
mod transaction;

pub use api::{ApiError, BrokerApi, BrokerSummary};
pub use broker::{Broker, BrokerError};
pub use clock::wall_ms;
pub use config::{
    load_acl, read_acl_config, BrokerConfig, ConfigError, CorruptRecordPolicy, FlushMode,
    HttpSettings, NamesrvFile, NetLimits, TlsSettings,
};
pub use listener::{DescribeListenerGroup, ListenerGroups, ListenerMemberHosts};
pub use messaging::{
    Filter, OutgoingMessage, PopBatch, PopQuery, PoppedMessage, Refusal, SendReceipt,
    TransactionCheck, TransactionChecker,
};
pub use metrics::{BrokerMetrics, TopicTraffic};
pub use persist::PersistError;
pub use pop::{PopConsumerView, PopGroupView, PopQueueView};
pub use replication::{AckSetting, ReplicationSettings};
pub use timeline::{Move, ObservedRebalance, Outcome};
pub use topic::TopicError;
