//! Store configuration.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Backend, FsBackend};

/// When an append is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushMode {
    /// Appends return once their bytes are written to the OS; a flusher thread fsyncs every
    /// [`StoreConfig::flush_interval`] (RocketMQ `ASYNC_FLUSH`, the default).
    #[default]
    Async,
    /// Appends return only after an fsync covering their bytes; concurrent appends share one
    /// fsync (group commit). RocketMQ `SYNC_FLUSH`.
    Sync,
}

/// What a read does with a record whose framing is intact but whose body CRC fails (bit rot,
/// a bad disk block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CorruptRecordPolicy {
    /// Leave it out of the answer (the next offset moves past it); it is logged and counted.
    #[default]
    Skip,
    /// Answer the read that reaches it with [`crate::StoreError::CorruptRecord`] (records
    /// before it are still served); the consumer stays there until an operator acts.
    Error,
}

/// Configuration of a [`crate::MessageStore`].
#[derive(Clone)]
pub struct StoreConfig {
    /// Root directory of the store (`commitlog/`, `consumequeue/`, `keyindex/`, `config/`, ...).
    pub data_dir: PathBuf,
    /// Size of one commit log segment file in bytes (1 GiB by default).
    pub commit_log_segment_size: u64,
    /// Append to commit log segments through a shared memory map instead of one `pwrite` per
    /// append (Linux only, ignored elsewhere). Space is reserved with `fallocate`
    /// [`Self::mmap_chunk_size`] bytes at a time ahead of the writes, so a segment being
    /// written is longer on disk than its data (zeros, given back when the segment is full or
    /// the store shuts down). Appends of a page or more (batches) still go through `pwrite`,
    /// which fills whole new pages more cheaply. A file system without `fallocate` gets
    /// `pwrite` (logged once per segment), and so do copy-on-write file systems (btrfs, ZFS,
    /// bcachefs; see docs/storage.md). Durability is the same either way: bytes are durable
    /// after the flush's `fdatasync`. Off by default: it saves CPU per small append, but the
    /// send p99 with many sends in flight is higher with it (docs/benchmarks.md,
    /// "Memory-mapped appends").
    pub mmap_commit_log: bool,
    /// Bytes reserved and mapped at a time with [`Self::mmap_commit_log`] (4 MiB by default):
    /// the most a segment's file is longer than its data.
    pub mmap_chunk_size: u64,
    /// Number of 20-byte entries in one consume-queue file (300 000 by default, as RocketMQ).
    pub consume_queue_file_entries: u64,
    /// Number of entries in one key index file (4 000 000 by default, at most `u32::MAX`); a
    /// quarter as many hash slots, whose table (4 bytes a slot) is the memory the index holds.
    pub index_file_entries: u64,
    /// Async or sync flush.
    pub flush_mode: FlushMode,
    /// Interval of the flusher thread (500 ms by default). Under sync flush it still flushes
    /// consume queues, index and checkpoint on this interval.
    pub flush_interval: Duration,
    /// How long a sync-flush append waits for its fsync before reporting
    /// [`crate::FlushStatus::FlushTimeout`] (5 s by default).
    pub sync_flush_timeout: Duration,
    /// Commit log segments whose newest message is older than this are deleted (72 h).
    pub retention: Duration,
    /// How often the background thread checks retention (10 s by default).
    pub retention_check_interval: Duration,
    /// Largest accepted stored record in bytes (4 MiB by default).
    pub max_message_size: usize,
    /// How often consumer offsets and delay-level progress are persisted (5 s by default).
    pub offsets_persist_interval: Duration,
    /// Address written as STOREHOST into every record and used in offset message ids.
    pub store_host: SocketAddr,
    /// Check the body CRC of every record a pull reads (RocketMQ's `checkCRCOnRecover`, applied
    /// to reads too; on by default). Records found corrupt by recovery are always treated as
    /// corrupt.
    pub check_crc_on_read: bool,
    /// What reads do with a corrupt record.
    pub corrupt_record_policy: CorruptRecordPolicy,
    /// Start the flusher / retention / offsets threads. Tests turn this off and call
    /// [`crate::MessageStore::flush`] and friends themselves.
    pub background_threads: bool,
    /// The store belongs to a replicated broker group (off by default): records become
    /// visible to reads (consume-queue and index entries written, arrival listeners told) only
    /// up to the confirmed offset ([`crate::MessageStore::set_confirmed`]); those above it
    /// wait in the commit log. Off, everything is visible once appended.
    pub replicated: bool,
    /// Where files live: the real file system by default, an in-memory fault-injecting
    /// backend in tests.
    pub backend: Arc<dyn Backend>,
}

impl std::fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreConfig")
            .field("data_dir", &self.data_dir)
            .field("commit_log_segment_size", &self.commit_log_segment_size)
            .field("mmap_commit_log", &self.mmap_commit_log)
            .field("mmap_chunk_size", &self.mmap_chunk_size)
            .field(
                "consume_queue_file_entries",
                &self.consume_queue_file_entries,
            )
            .field("index_file_entries", &self.index_file_entries)
            .field("flush_mode", &self.flush_mode)
            .field("flush_interval", &self.flush_interval)
            .field("sync_flush_timeout", &self.sync_flush_timeout)
            .field("retention", &self.retention)
            .field("retention_check_interval", &self.retention_check_interval)
            .field("max_message_size", &self.max_message_size)
            .field("offsets_persist_interval", &self.offsets_persist_interval)
            .field("store_host", &self.store_host)
            .field("check_crc_on_read", &self.check_crc_on_read)
            .field("corrupt_record_policy", &self.corrupt_record_policy)
            .field("background_threads", &self.background_threads)
            .field("replicated", &self.replicated)
            .finish_non_exhaustive()
    }
}

impl StoreConfig {
    /// Defaults (as RocketMQ's) with the given data directory on the real file system.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        StoreConfig {
            data_dir: data_dir.into(),
            commit_log_segment_size: 1 << 30,
            mmap_commit_log: false,
            mmap_chunk_size: 4 << 20,
            consume_queue_file_entries: 300_000,
            index_file_entries: 4_000_000,
            flush_mode: FlushMode::Async,
            flush_interval: Duration::from_millis(500),
            sync_flush_timeout: Duration::from_secs(5),
            retention: Duration::from_secs(72 * 3600),
            retention_check_interval: Duration::from_secs(10),
            max_message_size: 4 * 1024 * 1024,
            offsets_persist_interval: Duration::from_secs(5),
            store_host: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 10911)),
            check_crc_on_read: true,
            corrupt_record_policy: CorruptRecordPolicy::Skip,
            background_threads: true,
            replicated: false,
            backend: Arc::new(FsBackend),
        }
    }

    /// Validates sizes that would make the store unusable.
    pub(crate) fn validate(&self) -> crate::Result<()> {
        if self.commit_log_segment_size < 4096 {
            return Err(crate::StoreError::InvalidArgument(format!(
                "commit_log_segment_size {} is below 4096",
                self.commit_log_segment_size
            )));
        }
        if self.max_message_size as u64 + 8 > self.commit_log_segment_size {
            return Err(crate::StoreError::InvalidArgument(format!(
                "max_message_size {} does not fit in a segment of {} bytes",
                self.max_message_size, self.commit_log_segment_size
            )));
        }
        if self.mmap_chunk_size == 0 {
            return Err(crate::StoreError::InvalidArgument(
                "mmap_chunk_size must be positive".into(),
            ));
        }
        if self.consume_queue_file_entries == 0 || self.index_file_entries == 0 {
            return Err(crate::StoreError::InvalidArgument(
                "consume_queue_file_entries and index_file_entries must be positive".into(),
            ));
        }
        Ok(())
    }
}
