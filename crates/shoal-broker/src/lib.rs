//! `shoal-broker`: the broker.
//!
//! [`Broker::start`] opens the store, loads the topic and subscription-group tables, listens,
//! registers with the name servers and runs the background services (client expiry,
//! delay-level delivery, registration). Requests are routed by [`processor::BrokerProcessor`]
//! to the handlers in [`send`], [`pull`], [`client`], [`offsets`], [`retry`] and [`admin`].

pub mod admin;
pub mod broker;
pub mod client;
pub mod config;
pub mod coordinated;
pub mod filter;
pub mod group_config;
pub mod group_ctx;
pub mod group_state;
pub mod hold;
pub mod lease;
pub mod metrics;
pub mod offsets;
pub mod persist;
pub mod pop;
pub mod processor;
pub mod pull;
pub mod reply;
pub mod retry;
pub mod schedule;
pub mod send;
pub mod stats;
pub mod timeline;
pub mod topic;
pub mod transaction;

pub use broker::{Broker, BrokerError, BrokerInner};

pub use config::{BrokerConfig, CorruptRecordPolicy, FlushMode, NetLimits};
