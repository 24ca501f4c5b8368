//! The Kafka listener over TCP on 127.0.0.1 (a free port), driven with the `kafka-protocol`
//! crate's client-side codecs, on a real `MessageStore` in a temporary directory. The broker
//! side is a small in-test `BrokerHandle` (topics in a map, arrivals from the store's
//! listener, a group coordinator of its own as the broker's `GroupState` owns one).

mod fixture;
mod groups;
mod limits;
mod produce_fetch;
#[path = "../support/mod.rs"]
mod support;
