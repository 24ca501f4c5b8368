//! The replication state machines of a broker group, sans-IO: [`Master`] (ships commit-log
//! ranges, counts acks, keeps the in-sync set through the controller, acknowledges writes
//! under its lease), [`Replica`] (epoch entries, truncation at the divergence point, takes
//! batches only from the current epoch's master) and [`Member`], one broker's whole
//! replication logic (controller session and role switches).

mod epoch;
mod master;
mod member;
mod message;
mod replica;

pub use epoch::{EpochCache, EpochEntry, EpochOrder};
pub use master::{AckMode, Acked, Master, MasterConfig, MasterTransmit, WriteRefusal};
pub use member::{DiskState, Member, MemberConfig, PeerMessage, Role, Transmit};
pub use message::{BatchHeader, ToMaster, ToReplica};
pub use replica::{BatchVerdict, Replica, ReplicaAction};
