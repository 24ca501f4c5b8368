//! Helpers of the integration tests.

pub mod records;
