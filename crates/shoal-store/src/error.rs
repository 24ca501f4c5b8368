//! The one error type of `shoal-store`.

use std::path::PathBuf;

/// Everything that can go wrong in the message store.
///
/// The broker maps these to RocketMQ response codes: [`StoreError::MessageTooLarge`] to
/// MESSAGE_ILLEGAL, [`StoreError::Io`] (including a full disk) to SERVICE_NOT_AVAILABLE or
/// SYSTEM_ERROR, [`StoreError::Closed`] to SERVICE_NOT_AVAILABLE.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O operation failed (a full disk is reported as `io::ErrorKind::StorageFull`).
    #[error("I/O error during {op} on {path}: {source}")]
    Io {
        /// What the store was doing.
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A message (encoded, as stored) larger than the configured limit.
    #[error("message of {size} bytes exceeds the limit of {max} bytes")]
    MessageTooLarge {
        /// Encoded size of the stored record.
        size: usize,
        /// The configured limit.
        max: usize,
    },
    /// A topic name, queue id, property or key that the store cannot accept.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Encoding or decoding a stored message failed.
    #[error("message format error: {0}")]
    Proto(#[from] shoal_proto::ProtoError),
    /// Data on disk that contradicts itself and cannot be recovered automatically.
    #[error("corrupt store data in {path}: {reason}")]
    Corrupt {
        /// The file concerned.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An earlier write failed half-way; the store refuses further appends until reopened,
    /// so that nothing is appended after a hole.
    #[error("store is read-only after an earlier write failure: {0}")]
    WriteFailed(String),
    /// A record whose framing is intact but whose body CRC fails, under
    /// [`crate::config::CorruptRecordPolicy::Error`].
    #[error("record at commit log offset {phys_offset} ({topic} queue {queue_id} offset {queue_offset}) failed its CRC check")]
    CorruptRecord {
        /// Commit log offset of the record.
        phys_offset: u64,
        /// Topic of the queue read.
        topic: String,
        /// Queue id.
        queue_id: i32,
        /// Queue offset of the record.
        queue_offset: u64,
    },
    /// Another process (or another store in this process) has the data directory open.
    #[error("data directory {} is in use by another process ({owner}); stop it or use another data directory", dir.display())]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// What the owner wrote into the lock file (its pid and start time).
        owner: String,
    },
    /// The store has been shut down.
    #[error("message store is closed")]
    Closed,
    /// A replicated store that takes no puts now: its broker is not the master of its group
    /// ([`crate::MessageStore::set_puts_allowed`]).
    #[error("this store takes no puts: its broker is not the master of its group")]
    PutsRefused,
    /// Replication: a commit-log offset below the oldest one still stored (retention removed
    /// it); the caller falls back to copying whole segments from `min`.
    #[error("commit log offset {offset} is gone: the log starts at {min}")]
    LogOffsetGone {
        /// The offset asked for.
        offset: u64,
        /// The commit log's min offset.
        min: u64,
    },
    /// Replication: commit-log bytes from a master that cannot be appended as they are
    /// (wrong start, a torn or damaged record, a record not where its header says, a blank
    /// marker that does not fill its segment). Nothing was written.
    #[error("replicated bytes at commit log offset {offset} refused: {reason}")]
    InvalidLogBytes {
        /// Commit-log offset of the first byte refused.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// `Result` with [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Helper to wrap an `io::Error` with the operation and path. The path is copied only when
/// an error happens (`.map_err(io_err(..))` is evaluated on every call, also on success).
pub(crate) fn io_err<P: AsRef<std::path::Path>>(
    op: &'static str,
    path: P,
) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::Io {
        op,
        path: path.as_ref().to_path_buf(),
        source,
    }
}
