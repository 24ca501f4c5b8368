//! The controller: the replication metadata of every broker group (members and broker ids,
//! master and master epoch, in-sync set and its epoch, lease generation and fence) as a
//! replicated state machine on raft-rs.
//!
//! - [`Metadata`] is the state every voter applies, command by command, in log order;
//!   every fence (master epoch, in-sync-set epoch, fenced leases) is checked when applying.
//! - [`ControllerNode`] is one voter: raft-rs's `RawNode`, the metadata, and the leader's
//!   decisions taken outside the log from its own clock (which brokers are alive, when the
//!   last lease it saw has certainly expired, whom to elect), each proposed as a command.

mod command;
mod config;
mod connections;
mod election;
mod journal;
mod limits;
mod metadata;
mod node;
#[cfg(test)]
mod node_tests;
mod notices;
mod ready;
mod request;
mod storage;
mod wire;

pub use command::{Command, GroupInfo, Member, Outcome, Refusal};
pub use config::{ControllerConfig, ControllerError};
pub use connections::{BrokerConnections, ConnectionId};
pub use metadata::{Metadata, MetadataLimits};
pub use node::{ControllerNode, Heard};
pub use notices::{GroupNotice, GroupNotices};
/// raft-rs's message between voters, as [`ControllerNode`] takes and gives it.
pub use raft::eraftpb::Message as RaftMessage;
/// The kind of a [`RaftMessage`].
pub use raft::eraftpb::MessageType as RaftMessageType;
pub use request::{ClientToken, Request, Response};
pub use storage::{ControllerStorage, JournalWrite, Recovered};
pub use wire::{decode_raft_message, encode_raft_message, WireError};
