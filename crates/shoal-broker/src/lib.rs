//! `shoal-broker`: the broker.

pub mod lock;
pub mod registry;
