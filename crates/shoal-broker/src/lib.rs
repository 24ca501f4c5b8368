//! `shoal-broker`: the broker.

pub mod config;
pub mod group_config;
pub mod lock;
pub mod persist;
pub mod registry;
pub mod topic;
