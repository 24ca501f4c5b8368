//! `shoal-broker`: the broker.

pub mod config;
pub mod lock;
pub mod registry;
