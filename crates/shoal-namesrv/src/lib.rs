//! `shoal-namesrv`: the name server (routes: topic -> brokers -> queues).
//!
//! [`route::RouteTable`] is the sans-IO route table; [`server::NameServer`] serves it over the
//! remoting protocol (REGISTER_BROKER, UNREGISTER_BROKER, BROKER_HEARTBEAT,
//! GET_ROUTEINFO_BY_TOPIC, GET_BROKER_CLUSTER_INFO, topic lists, KV config, broker write
//! permission) and pushes route changes to the Shoal clients that watch them
//! ([`watch::RouteWatches`], `shoal_proto::route_watch`).

pub mod metrics;
pub mod route;
pub mod server;
pub mod watch;

pub use server::{NameServer, NamesrvConfig, NamesrvError, NamesrvProcessor};
