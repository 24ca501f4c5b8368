//! `shoal-namesrv`: the name server (routes: topic -> brokers -> queues).
//!
//! [`route::RouteTable`] is the sans-IO route table; [`server::NameServer`] serves it over the
//! remoting protocol (REGISTER_BROKER, UNREGISTER_BROKER, BROKER_HEARTBEAT,
//! GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO, topic lists, KV config).

pub mod metrics;
pub mod route;
pub mod server;

pub use server::{NameServer, NamesrvConfig, NamesrvError, NamesrvProcessor};
