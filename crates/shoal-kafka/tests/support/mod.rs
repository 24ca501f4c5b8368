//! Helpers of the integration tests.

pub mod broker;
pub mod records;
