//! `shoal-proto`: Apache RocketMQ's remoting protocol as typed Rust.
//!
//! This crate has no I/O and no async runtime. It owns:
//! - [`command`]: the [`RemotingCommand`] frame (JSON and ROCKETMQ binary headers);
//! - [`mq`]: [`MessageQueue`], the (topic, broker, queue id) triple every plane shares.
//! - [`code`]: request and response codes with their RocketMQ names;
//! - [`header`]: typed request/response headers ([`header::CommandHeader`]) and the
//!   `RemotingCommand` helpers `request_with_header` / `decode_command_header`;
//! - [`body`]: JSON bodies (fastjson-compatible) with `to_json_bytes` / `from_json_slice`;
//! - [`hash`]: Java `String.hashCode` (tag codes); [`constants`]: well-known names and bits.
//!
//! The byte layouts follow `shared/protocol/rocketmq-remoting.md` (the "spec" below).

pub mod acl;
pub mod body;
pub mod code;
pub mod command;
pub mod constants;
pub mod coordinated;
pub mod error;
pub mod ext;
pub mod ext_fields;
pub mod hash;
pub mod header;
pub mod kafka_cluster;
pub mod message;
pub mod mq;
pub mod route_watch;

pub use command::{
    push_binary_decimal, push_binary_entry, push_binary_entry_with, push_decimal, LanguageCode,
    RawExtFields, RemotingCommand, SerializeType,
};
pub use error::{ProtoError, Result};
pub use mq::MessageQueue;
