//! `shoal-store`: Shoal's message store, a blocking API with no async runtime (where it sits
//! among the crates: `docs/architecture.md` in the repository). The broker's connection tasks
//! queue sends without blocking ([`MessageStore::submit`]: whoever finds the writer free
//! appends every put waiting) and read pulls from the page cache; calls that may block for
//! long, such as open and shutdown, run on the blocking pool.
//!
//! - [`MessageStore`]: the entry point. [`MessageStore::open`] recovers the store and reports
//!   what it found ([`RecoveryReport`]); [`MessageStore::put_message`] /
//!   [`MessageStore::put_messages`] append records in RocketMQ's stored format (spec section
//!   4.1, encoded by `shoal_proto::message`) and report where they went and whether they are
//!   durable ([`FlushStatus`]); [`MessageStore::get_messages`] answers pulls with the records'
//!   bytes and the status rules of spec section 5.2.
//! - Commit log: fixed-size segments named by start offset, end-of-segment blank markers;
//!   written with `pwrite`, or on Linux through a memory map of space reserved ahead of the
//!   writes ([`StoreConfig::mmap_commit_log`], off by default).
//! - Consume queues: 20-byte entries per (topic, queue id), rebuilt from the commit log.
//! - Index: an append-only hash-chain log by `topic#key` (`KEYS` and `UNIQ_KEY`).
//! - Offsets: consumer offsets and delay-level progress, persisted atomically.
//! - Replication ([`StoreConfig::replicated`]): [`MessageStore::read_log`] /
//!   [`MessageStore::append_replicated`] ship the commit log byte for byte to a replica,
//!   [`MessageStore::truncate_log`] / [`MessageStore::restart_log_at`] cut or restart it, and
//!   records become visible only up to the group's confirmed offset
//!   ([`MessageStore::set_confirmed`]).
//! - [`backend`]: files behind a trait; [`backend::MemBackend`] injects faults and builds crash
//!   images for tests.
//!
//! Layout of the data directory: `commitlog/`, `consumequeue/<topic>/<queueId>/`, `keyindex/`,
//! `config/consumerOffset.json`, `config/delayOffset.json`, `checkpoint`, `abort`. See
//! `docs/storage.md` in the repository for the design and its reasons.

#![warn(missing_docs)]

mod appender;
pub mod backend;
mod checkpoint;
mod commitlog;
mod config;
mod consume_queue;
mod corrupt;
mod error;
mod file;
mod flusher;
mod index;
#[cfg(target_os = "linux")]
mod mapped;
mod offsets;
#[cfg(target_os = "linux")]
mod prefetch;
mod queues;
mod read;
mod record;
mod recovery;
mod replication;
mod retention;
mod scan;
mod store;
mod types;

pub use appender::PutFuture;
pub use commitlog::{BLANK_MAGIC_CODE, END_OF_SEGMENT_MIN_BLANK};
pub use config::{CorruptRecordPolicy, FlushMode, StoreConfig};
pub use consume_queue::{CqEntry, CQ_ENTRY_SIZE};
pub use error::{Result, StoreError};
pub use index::INDEX_ENTRY_SIZE;
pub use recovery::LOCK_FILE;
pub use store::MessageStore;
pub use types::{
    AppendedMessage, ArrivalListener, BoundaryType, FlushStatus, GetMessageResult,
    GetMessageStatus, KnownProperties, MessageArrival, MessageExtBrokerInner, PutMessageResult,
    RecoveryReport, RetentionReport,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn store_is_send_and_sync() {
        assert_send_sync::<MessageStore>();
    }
}
