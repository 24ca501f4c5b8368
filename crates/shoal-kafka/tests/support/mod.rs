//! Helpers of the integration tests.
#![allow(
    unreachable_pub,
    reason = "test code: a failed unwrap is a failed test"
)]

pub mod broker;
pub mod records;
