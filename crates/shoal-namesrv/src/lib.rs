//! `shoal-namesrv`: the name server (routes: topic -> brokers -> queues).

pub mod route;
