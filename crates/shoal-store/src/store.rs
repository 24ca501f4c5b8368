//! The message store: commit log + consume queues + index + offsets, with flush, recovery and
//! retention. See the crate documentation for the overview.

use foldhash::{HashMap, HashMapExt};
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use parking_lot::{Condvar, Mutex, RwLock};
use serde::{Deserialize, Serialize};
use shoal_proto::message::property::{find_properties, KEYS, UNIQ_KEY};
use shoal_proto::message::record::{
    store_timestamp_pos, MessageVersion, RecordView, BLANK_MAGIC_CODE, MIN_RECORD_LEN,
};

use crate::appender::{AppendQueue, Job};
use crate::backend::{Backend, DirLock, StoreFile};
use crate::commitlog::CommitLog;
use crate::config::{CorruptRecordPolicy, FlushMode, StoreConfig};
use crate::consume_queue::{ConsumeQueue, CqEntry};
use crate::error::{io_err, Result};
use crate::index::Index;
use crate::offsets::OffsetStore;
use crate::StoreError;

/// A message handed to the store by the broker (RocketMQ `MessageExtBrokerInner`): everything
/// but the fields the store fills in (queue offset, physical offset, store timestamp, store
/// host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageExtBrokerInner {
    /// Topic.
    pub topic: String,
    /// Queue id within the topic.
    pub queue_id: i32,
    /// User flag.
    pub flag: i32,
    /// Message sysFlag (spec section 4.2); the IPv6 host bits are derived from the addresses.
    pub sys_flag: i32,
    /// Born timestamp (ms).
    pub born_timestamp: i64,
    /// Producer address.
    pub born_host: SocketAddr,
    /// Reconsume times.
    pub reconsume_times: i32,
    /// Prepared transaction offset (0 for normal messages).
    pub prepared_transaction_offset: i64,
    /// Body as stored (already compressed if the sysFlag says so).
    pub body: Bytes,
    /// Encoded properties string (spec section 4.4).
    pub properties: String,
    /// Where the properties the store reads are in `properties`, when whoever wrote them
    /// found them already (`None`: the store finds them). Whoever replaces `properties`
    /// must reset it.
    pub known: Option<KnownProperties>,
}

/// Where the values of the properties the store reads (TAGS, WAIT, KEYS, UNIQ_KEY) are in a
/// message's properties string, as byte ranges, for a sender that went over the pairs
/// already (the broker's send handler checks every pair): the store then skips its own pass.
///
/// A range must be the value of a whole `KEY\u{1}value\u{2}` pair of its key, and a key given
/// as absent must not be in the string. A range that is not (a stale or wrong one) makes the
/// store find the properties itself; absence cannot be checked, so it must be right.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KnownProperties {
    /// TAGS's value.
    pub tags: Option<(u32, u32)>,
    /// WAIT's value.
    pub wait: Option<(u32, u32)>,
    /// KEYS's value.
    pub keys: Option<(u32, u32)>,
    /// UNIQ_KEY's value.
    pub uniq: Option<(u32, u32)>,
}

impl KnownProperties {
    /// The values in `properties` of TAGS, WAIT, KEYS and UNIQ_KEY, in that order; `None` when
    /// a range is not the value of its key's pair there.
    pub(crate) fn resolve<'a>(&self, properties: &'a str) -> Option<[Option<&'a str>; 4]> {
        use shoal_proto::message::property::{TAGS, WAIT};
        let one = |at: Option<(u32, u32)>, key: &str| -> Option<Option<&'a str>> {
            let Some((start, end)) = at else {
                return Some(None);
            };
            let (start, end) = (start as usize, end as usize);
            let value = properties.get(start..end)?;
            let bytes = properties.as_bytes();
            let pair_start = start.checked_sub(key.len() + 1)?;
            let whole = bytes.get(pair_start..start - 1) == Some(key.as_bytes())
                && bytes.get(start - 1) == Some(&1)
                && (pair_start == 0 || bytes.get(pair_start - 1) == Some(&2))
                && bytes.get(end) == Some(&2);
            whole.then_some(Some(value))
        };
        Some([
            one(self.tags, TAGS)?,
            one(self.wait, WAIT)?,
            one(self.keys, KEYS)?,
            one(self.uniq, UNIQ_KEY)?,
        ])
    }
}

/// Where and how one message was appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendedMessage {
    /// Commit log (physical) offset of the record.
    pub physical_offset: u64,
    /// Offset in the consume queue of (topic, queue id).
    pub queue_offset: u64,
    /// Store timestamp written into the record (ms).
    pub store_timestamp: i64,
    /// Size of the stored record.
    pub size: u32,
    /// The store host written into the record (with the physical offset, the offset message
    /// id: see [`AppendedMessage::offset_msg_id`]).
    pub store_host: SocketAddr,
}

impl AppendedMessage {
    /// The offset message id (store host + physical offset, spec section 4.5).
    pub fn offset_msg_id(&self) -> String {
        shoal_proto::message::offset_msg_id(self.store_host, self.physical_offset as i64)
    }

    /// Appends the offset message id to `out` (32 or 56 uppercase hex digits).
    pub fn push_offset_msg_id(&self, out: &mut String) {
        shoal_proto::message::push_offset_msg_id(out, self.store_host, self.physical_offset as i64);
    }

    /// [`AppendedMessage::push_offset_msg_id`] into bytes (a binary header's value).
    pub fn push_offset_msg_id_bytes(&self, out: &mut Vec<u8>) {
        shoal_proto::message::push_offset_msg_id_bytes(
            out,
            self.store_host,
            self.physical_offset as i64,
        );
    }
}

/// Durability of an append, for the broker's answer (FLUSH_DISK_TIMEOUT under sync flush).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushStatus {
    /// The bytes were fsynced before the call returned (sync flush).
    Flushed,
    /// Written to the OS only; the flusher thread will fsync them (async flush).
    NotFlushed,
    /// Sync flush: the fsync did not complete within `sync_flush_timeout`.
    FlushTimeout,
    /// Sync flush: the fsync failed; the store refuses further appends until reopened.
    FlushFailed,
}

/// Result of [`MessageStore::put_message`] / [`MessageStore::put_messages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutMessageResult {
    /// One entry per message, in the order given.
    pub messages: Vec<AppendedMessage>,
    /// Durability of the whole put.
    pub flush: FlushStatus,
}

/// Notice that a message was appended to (topic, queue id), for long polling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageArrival<'a> {
    /// Topic (borrowed from the appended message: listeners copy what they keep).
    pub topic: &'a str,
    /// Queue id.
    pub queue_id: i32,
    /// Queue offset of the message.
    pub queue_offset: u64,
    /// Tag hash code of the message.
    pub tag_code: i64,
    /// Store timestamp of the message.
    pub store_timestamp: i64,
}

/// A callback told about every appended message (called on the appending thread after the
/// writer lock is released; keep it short and non-blocking, e.g. send on a channel).
pub type ArrivalListener = Arc<dyn Fn(&MessageArrival<'_>) + Send + Sync>;

/// Outcome of a [`MessageStore::get_messages`] (RocketMQ `GetMessageStatus`); the broker maps
/// it to a response code as spec section 5.2 says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetMessageStatus {
    /// At least one matching message (SUCCESS).
    Found,
    /// Entries were scanned but none matched the filter (PULL_RETRY_IMMEDIATELY).
    NoMatchedMessage,
    /// The queue holds nothing (max offset 0, or the queue does not exist): PULL_NOT_FOUND if
    /// the requested offset is 0, else PULL_OFFSET_MOVED; next begin offset 0.
    NoMessageInQueue,
    /// Requested offset below the min offset (PULL_OFFSET_MOVED, next = min offset).
    OffsetTooSmall,
    /// Requested offset equals the max offset: nothing new yet (PULL_NOT_FOUND, next = offset).
    OffsetOverflowOne,
    /// Requested offset beyond the max offset (PULL_OFFSET_MOVED, next = max offset).
    OffsetOverflowBadly,
}

/// Result of [`MessageStore::get_messages`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetMessageResult {
    /// Status, see [`GetMessageStatus`].
    pub status: GetMessageStatus,
    /// The stored records back to back, ready to be a pull response body.
    pub messages: Bytes,
    /// Number of records in `messages`.
    pub message_count: usize,
    /// Queue offsets of the records in `messages`.
    pub queue_offsets: Vec<u64>,
    /// Where the next pull should start.
    pub next_begin_offset: u64,
    /// The queue's min offset.
    pub min_offset: u64,
    /// The queue's max offset (next offset to be written).
    pub max_offset: u64,
    /// Corrupt records (body CRC failed) left out of `messages` under
    /// [`CorruptRecordPolicy::Skip`].
    pub corrupt_skipped: usize,
}

/// Which end of a run of equal-time messages [`MessageStore::offset_by_timestamp`] picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoundaryType {
    /// The first offset whose store time is at or after the timestamp (max offset if none).
    Lower,
    /// The last offset whose store time is at or before the timestamp (min offset if none).
    Upper,
}

/// What recovery found and did when the store was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The abort marker was present: the previous run did not shut down cleanly.
    pub abnormal_shutdown: bool,
    /// Records were checked (magic, size, CRC) from the checkpoint's segment onwards; false
    /// when a clean shutdown allowed the fast path.
    pub full_check: bool,
    /// Commit log offset where the check started.
    pub checked_from: u64,
    /// Records validated by the check.
    pub records_checked: u64,
    /// End of the valid commit log (next write position).
    pub commit_log_end: u64,
    /// Bytes of torn or invalid tail removed from the commit log.
    pub truncated_bytes: u64,
    /// Why the check stopped where it did, if it stopped on bad data (not a clean end).
    pub truncation_reason: Option<String>,
    /// Zeros found after the last record, to the end of the last segment file: space reserved
    /// ahead of memory-mapped appends ([`StoreConfig::mmap_commit_log`]) by a run that did not
    /// shut down cleanly. A clean end, not data: given back, not counted in `truncated_bytes`.
    pub reserved_tail_bytes: u64,
    /// Consume-queue entries dropped because they pointed past the commit log end.
    pub consume_queue_entries_dropped: u64,
    /// Consume-queue entries re-created from the commit log.
    pub consume_queue_entries_rebuilt: u64,
    /// Index entries dropped because they pointed past the commit log end.
    pub index_entries_dropped: u64,
    /// Commit log offsets of records whose framing is intact but whose body CRC failed; they
    /// keep their place (and queue offset) and are skipped or refused on read.
    pub corrupt_records: Vec<u64>,
    /// Consume queues (`topic/queueId`) found damaged or missing and rebuilt from the whole
    /// commit log, with the reason.
    pub consume_queues_rebuilt: Vec<String>,
    /// Time recovery took.
    pub duration: Duration,
}

/// What a retention run deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Start offsets of the deleted commit log segments.
    pub deleted_segments: Vec<u64>,
    /// Index files deleted.
    pub deleted_index_files: usize,
    /// New min commit log offset.
    pub min_commit_log_offset: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Checkpoint {
    /// Commit log durable below this offset.
    commit_log_flushed: u64,
    /// Consume queues and index durable for every record below this offset.
    logics_flushed: u64,
    /// Set only by a clean shutdown: the exact end of the commit log.
    clean_end: Option<u64>,
    /// Set only by a clean shutdown: every consume queue (`topic/queueId`) and its max offset,
    /// so the next start notices a queue that lost entries or files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    queues: Option<BTreeMap<String, u64>>,
}

const CHECKPOINT_FILE: &str = "checkpoint";
const ABORT_FILE: &str = "abort";
/// Lock file of the data directory: held (flock) while the store is open, holds the owner's pid.
pub const LOCK_FILE: &str = "lock";
/// Consume-queue entries scanned at most per pull (RocketMQ scans 16000 bytes of entries).
const MAX_SCAN_ENTRIES: usize = 800;

pub(crate) struct WriterState {
    pub(crate) last_store_timestamp: i64,
    pub(crate) failed: Option<String>,
    /// Lists every append fills and empties (reused, so an append allocates little).
    pub(crate) scratch: crate::appender::AppendScratch,
}

type QueueMap = HashMap<String, HashMap<i32, Arc<ConsumeQueue>>>;

pub(crate) struct Inner {
    pub(crate) config: StoreConfig,
    backend: Arc<dyn Backend>,
    pub(crate) commit_log: CommitLog,
    queues: RwLock<QueueMap>,
    pub(crate) index: Index,
    offsets: OffsetStore,
    /// Owned by whoever appends. Anyone else who locks it must use `lock_writer`, which
    /// appends what was queued meanwhile when it lets go (a put that finds the writer busy
    /// leaves its job to the holder).
    pub(crate) writer: Mutex<WriterState>,
    /// Set with `WriterState::failed`: read without the writer's lock.
    pub(crate) write_failed: std::sync::atomic::AtomicBool,
    /// Puts waiting for the appender, and appends waiting for their fsync.
    pub(crate) appends: AppendQueue,
    /// Records below this commit log offset have their consume-queue and index entries written.
    pub(crate) dispatched: AtomicU64,
    group_commit: Mutex<bool>,
    group_commit_cv: Condvar,
    pub(crate) listeners: RwLock<Vec<ArrivalListener>>,
    pub(crate) closed: AtomicBool,
    pub(crate) stop: Mutex<bool>,
    stop_cv: Condvar,
    /// Serializes checkpoint writes (flusher thread vs. explicit flush).
    logics_lock: Mutex<()>,
    /// Records whose body CRC failed (commit log offsets), found by recovery or by reads.
    corrupt: RwLock<HashSet<u64>>,
    /// Corrupt records met by reads (skipped or refused), for the broker's counters.
    corrupt_reads: AtomicU64,
    /// The exclusive lock on the data directory, held while the store is open.
    dir_lock: Mutex<Option<DirLock>>,
}

/// The message store. `Send + Sync`; share it with an `Arc`.
pub struct MessageStore {
    pub(crate) inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for MessageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageStore")
            .field("data_dir", &self.inner.config.data_dir)
            .field("commit_log_end", &self.inner.commit_log.write_pos())
            .finish_non_exhaustive()
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Topic names become directory names: RocketMQ's character set (`[%|a-zA-Z0-9_-]`), at most
/// 255 bytes.
pub(crate) fn validate_topic(topic: &str) -> Result<()> {
    if topic.is_empty() || topic.len() > 255 {
        return Err(StoreError::InvalidArgument(format!(
            "topic length {} is outside 1..=255",
            topic.len()
        )));
    }
    if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'%' | b'|' | b'_' | b'-'))
    {
        return Err(StoreError::InvalidArgument(format!(
            "topic {topic:?} contains characters outside [%|a-zA-Z0-9_-]"
        )));
    }
    Ok(())
}

fn write_file_atomically(backend: &dyn Backend, path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    backend.remove_file(&tmp).map_err(io_err("remove", &tmp))?;
    let file = backend.open(&tmp, true).map_err(io_err("create", &tmp))?;
    file.write_all_at(0, bytes).map_err(io_err("write", &tmp))?;
    file.sync().map_err(io_err("fsync", &tmp))?;
    backend.rename(&tmp, path).map_err(io_err("rename", path))
}

fn read_checkpoint(backend: &dyn Backend, path: &Path) -> Result<Option<Checkpoint>> {
    if !backend.exists(path) {
        return Ok(None);
    }
    let file = backend.open(path, false).map_err(io_err("open", path))?;
    let len = file.len().map_err(io_err("stat", path))?;
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(0, &mut buf)
        .map_err(io_err("read", path))?;
    // A checkpoint that cannot be parsed only costs a longer check.
    Ok(serde_json::from_slice(&buf).ok())
}

/// A stored record whose properties end with this is taken for a torn write (see
/// [`scan_commit_log`]); puts refuse such properties.
pub(crate) const TORN_PROPERTIES_END: char = '\0';

/// Reads a segment sequentially through a buffer (recovery scans).
struct SegmentReader {
    file: Arc<dyn StoreFile>,
    file_len: u64,
    buf: Vec<u8>,
    start: u64,
}

impl SegmentReader {
    fn new(file: Arc<dyn StoreFile>) -> std::io::Result<Self> {
        let file_len = file.len()?;
        Ok(SegmentReader {
            file,
            file_len,
            buf: Vec::new(),
            start: 0,
        })
    }

    /// `len` bytes at `off`, or `None` if the file ends before.
    fn slice(&mut self, off: u64, len: usize) -> std::io::Result<Option<&[u8]>> {
        let inside = off >= self.start && off + len as u64 <= self.start + self.buf.len() as u64;
        if !inside {
            let left = self.file_len.saturating_sub(off) as usize;
            let want = len.max(1 << 20).min(left);
            self.buf.clear();
            self.buf.resize(want, 0);
            let mut got = 0;
            while got < want {
                let n = self.file.read_at(off + got as u64, &mut self.buf[got..])?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            self.buf.truncate(got);
            self.start = off;
        }
        let from = (off - self.start) as usize;
        Ok(self.buf.get(from..from + len))
    }

    /// Whether the file has any byte at `off`.
    fn has_data_at(&self, off: u64) -> bool {
        off < self.file_len
    }

    /// Whether every byte from `off` to the end of the file is zero.
    fn zeros_from(&mut self, off: u64) -> std::io::Result<bool> {
        let mut at = off;
        while at < self.file_len {
            let n = (self.file_len - at).min(1 << 20) as usize;
            match self.slice(at, n)? {
                Some(bytes) if bytes.iter().all(|b| *b == 0) => at += n as u64,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }
}

/// One record found during a recovery scan.
struct ScannedRecord {
    phys: u64,
    size: u32,
    topic: String,
    queue_id: i32,
    queue_offset: i64,
    tag_code: i64,
    store_timestamp: i64,
    keys: Vec<String>,
}

impl ScannedRecord {
    fn cq_entry(&self) -> CqEntry {
        CqEntry {
            phys_offset: self.phys,
            size: self.size,
            tag_code: self.tag_code,
        }
    }
}

/// The keys a record is indexed under: each of its `KEYS` (space separated), then its
/// `UNIQ_KEY` unless it is one of them. Borrowed from `properties`, no copy.
pub(crate) fn index_keys(properties: &str) -> impl Iterator<Item = &str> {
    let [keys, uniq] = find_properties(properties, [KEYS, UNIQ_KEY]);
    index_keys_of(keys, uniq)
}

/// [`index_keys`] given the values of KEYS and UNIQ_KEY (for a caller that found them in a
/// pass over the properties of its own).
pub(crate) fn index_keys_of<'a>(
    keys: Option<&'a str>,
    uniq: Option<&'a str>,
) -> impl Iterator<Item = &'a str> {
    let keys = keys.unwrap_or("");
    let uniq = uniq.filter(|u| !u.is_empty() && !keys.split(' ').any(|k| k == *u));
    keys.split(' ').filter(|k| !k.is_empty()).chain(uniq)
}

/// [`index_keys_of`] as calls of `f`, without iterator adapters (the appender's dispatch
/// runs it for every record under the index's lock).
#[inline]
pub(crate) fn for_each_index_key<'a>(
    keys: Option<&'a str>,
    uniq: Option<&'a str>,
    mut f: impl FnMut(&'a str),
) {
    let uniq = uniq.filter(|u| !u.is_empty());
    let mut uniq_among_keys = false;
    if let Some(keys) = keys.filter(|k| !k.is_empty()) {
        for k in keys.split(' ') {
            if !k.is_empty() {
                uniq_among_keys |= uniq == Some(k);
                f(k);
            }
        }
    }
    if let Some(u) = uniq.filter(|_| !uniq_among_keys) {
        f(u);
    }
}

impl MessageStore {
    /// Opens (creating if needed) the store in `config.data_dir`, recovers it and starts the
    /// background threads (if configured).
    pub fn open(config: StoreConfig) -> Result<(MessageStore, RecoveryReport)> {
        config.validate()?;
        let started = Instant::now();
        let backend = config.backend.clone();
        let dir = config.data_dir.clone();
        backend
            .create_dir_all(&dir)
            .map_err(io_err("create data dir", &dir))?;
        let lock_path = dir.join(LOCK_FILE);
        let owner = format!("pid {}, opened at {} ms", std::process::id(), now_ms());
        let dir_lock = match backend
            .try_lock(&lock_path, &owner)
            .map_err(io_err("lock data dir", &lock_path))?
        {
            Ok(l) => l,
            Err(current) => {
                return Err(StoreError::Locked {
                    dir: dir.clone(),
                    owner: if current.is_empty() {
                        "owner unknown".into()
                    } else {
                        current
                    },
                })
            }
        };
        let abort_path = dir.join(ABORT_FILE);
        let abnormal = backend.exists(&abort_path);
        let checkpoint = read_checkpoint(&*backend, &dir.join(CHECKPOINT_FILE))?;
        let commit_log = CommitLog::open(
            backend.clone(),
            dir.join("commitlog"),
            config.commit_log_segment_size,
            config.mmap_commit_log.then_some(config.mmap_chunk_size),
        )?;
        let mut report = RecoveryReport {
            abnormal_shutdown: abnormal,
            ..RecoveryReport::default()
        };

        // 1. Find the end of the commit log.
        let mut scanned = Vec::new();
        let fast_end = match (&checkpoint, abnormal) {
            (Some(cp), false) => cp.clean_end.filter(|end| {
                // Fast path: the data must end exactly where the clean shutdown said.
                let segs = commit_log.segments();
                match segs.last() {
                    None => *end == 0 || *end % config.commit_log_segment_size == 0,
                    Some(last) => {
                        let len = CommitLog::segment_len(last).unwrap_or(u64::MAX);
                        last.base + len == *end
                            || (*end == last.base + config.commit_log_segment_size)
                    }
                }
            }),
            _ => None,
        };
        let mut last_store_timestamp = 0;
        let mut corrupt_found = Vec::new();
        let mut free_tail = 0;
        let end = match fast_end {
            Some(end) => end,
            None => {
                report.full_check = true;
                let from = checkpoint
                    .as_ref()
                    .map_or(0, |cp| cp.commit_log_flushed.min(cp.logics_flushed));
                let seg_size = config.commit_log_segment_size;
                let from = (from - from % seg_size).max(commit_log.min_offset());
                report.checked_from = from;
                // Only records the consume queues / index may miss are kept for re-dispatch.
                let collect_from = checkpoint.as_ref().map_or(0, |cp| cp.logics_flushed);
                let scan = scan_commit_log(&commit_log, from, collect_from, &mut |r| {
                    scanned.push(r);
                    Ok(())
                })?;
                report.truncation_reason = scan.reason;
                report.records_checked = scan.checked;
                last_store_timestamp = scan.last_store_timestamp;
                corrupt_found = scan.corrupt;
                free_tail = scan.free_tail;
                scan.end
            }
        };
        // Reserved zeros after the last record are given back too, but they were not data.
        report.truncated_bytes = commit_log.truncate_to(end)?.saturating_sub(free_tail);
        report.reserved_tail_bytes = free_tail;
        report.commit_log_end = end;
        let cl_min = commit_log.min_offset();

        // 2. Consume queues: cut entries past the end; note the damaged ones.
        let mut damaged: BTreeMap<(String, i32), String> = BTreeMap::new();
        let mut queues: QueueMap = HashMap::new();
        let cq_root = dir.join("consumequeue");
        for topic in backend.list(&cq_root).map_err(io_err("list", &cq_root))? {
            if validate_topic(&topic).is_err() {
                continue;
            }
            let tdir = cq_root.join(&topic);
            for qid in backend.list(&tdir).map_err(io_err("list", &tdir))? {
                let Ok(queue_id) = qid.parse::<i32>() else {
                    continue;
                };
                let cq = ConsumeQueue::open(
                    backend.clone(),
                    tdir.join(&qid),
                    config.consume_queue_file_entries,
                )?;
                let (dropped, bad) = cq.recover(cl_min, end)?;
                report.consume_queue_entries_dropped += dropped;
                if bad || (dropped > 0 && fast_end.is_some()) {
                    damaged.insert(
                        (topic.clone(), queue_id),
                        format!("{dropped} entries were invalid"),
                    );
                }
                queues
                    .entry(topic.clone())
                    .or_default()
                    .insert(queue_id, Arc::new(cq));
            }
        }

        // 3. Index: cut entries past the end.
        let (index, idx_dropped) = Index::open(
            backend.clone(),
            dir.join("keyindex"),
            &dir.join("index"),
            config.index_file_entries,
            end,
        )?;
        report.index_entries_dropped = idx_dropped;

        let offsets = OffsetStore::open(backend.clone(), dir.join("config"))?;
        let inner = Arc::new(Inner {
            backend: backend.clone(),
            commit_log,
            queues: RwLock::new(queues),
            index,
            offsets,
            writer: Mutex::new(WriterState {
                last_store_timestamp,
                failed: None,
                scratch: Default::default(),
            }),
            write_failed: std::sync::atomic::AtomicBool::new(false),
            appends: AppendQueue::default(),
            dispatched: AtomicU64::new(end),
            group_commit: Mutex::new(false),
            group_commit_cv: Condvar::new(),
            listeners: RwLock::new(Vec::new()),
            closed: AtomicBool::new(false),
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
            logics_lock: Mutex::new(()),
            dir_lock: Mutex::new(Some(dir_lock)),
            corrupt: RwLock::new(corrupt_found.iter().copied().collect()),
            corrupt_reads: AtomicU64::new(0),
            config,
        });

        // 4. Re-dispatch the checked records the consume queues or index miss.
        if report.full_check {
            let logics = checkpoint.as_ref().map_or(0, |cp| cp.logics_flushed);
            report.consume_queue_entries_rebuilt =
                inner.redispatch(&scanned, logics, &mut damaged)?;
        }
        drop(scanned);
        // 4b. Verify every consume queue against the commit log (on every start): entries in
        // order and inside the log, sampled entries pointing at their own records, and after a
        // clean shutdown every queue as long as it was. Rebuild what does not match.
        if let Some(expected) = checkpoint.as_ref().and_then(|cp| cp.queues.as_ref()) {
            if fast_end.is_some() {
                for (name, max) in expected {
                    let Some((topic, qid)) = name
                        .rsplit_once('/')
                        .and_then(|(t, q)| q.parse::<i32>().ok().map(|q| (t.to_string(), q)))
                    else {
                        continue;
                    };
                    let have = inner
                        .queues
                        .read()
                        .get(&topic)
                        .and_then(|m| m.get(&qid))
                        .map(|cq| cq.max_offset());
                    if have != Some(*max) && validate_topic(&topic).is_ok() {
                        let why = match have {
                            None => format!("its files are missing (it had {max} entries)"),
                            Some(h) => format!("it has {h} entries, {max} at the clean shutdown"),
                        };
                        damaged.entry((topic, qid)).or_insert(why);
                    }
                }
            }
        }
        inner.verify_queues(&mut damaged)?;
        if !damaged.is_empty() {
            for ((topic, qid), why) in &damaged {
                tracing::warn!(%topic, queue_id = qid, reason = %why, "consume queue does not match the commit log; rebuilding it");
                report
                    .consume_queues_rebuilt
                    .push(format!("{topic}/{qid}: {why}"));
            }
            let set: HashSet<(String, i32)> = damaged.into_keys().collect();
            report.consume_queue_entries_rebuilt += inner.rebuild_queues(&set)?;
        }
        report.corrupt_records = corrupt_found;
        if last_store_timestamp == 0 && end > 0 {
            last_store_timestamp = inner.last_record_timestamp().unwrap_or(0);
        }
        inner.writer.lock().last_store_timestamp = last_store_timestamp;

        // 5. Everything consistent and durable: new checkpoint, then the abort marker.
        inner.flush_logics()?;
        let marker = backend
            .open(&abort_path, true)
            .map_err(io_err("create abort marker", &abort_path))?;
        marker.sync().map_err(io_err("fsync", &abort_path))?;
        report.duration = started.elapsed();
        tracing::info!(?report, "message store recovered");

        let store = MessageStore {
            inner,
            threads: Mutex::new(Vec::new()),
        };
        if store.inner.config.background_threads {
            store.start_threads();
        }
        Ok((store, report))
    }

    fn start_threads(&self) {
        let inner = self.inner.clone();
        let handle = std::thread::Builder::new()
            .name("shoal-store-flush".into())
            .spawn(move || inner.background_loop());
        match handle {
            Ok(h) => self.threads.lock().push(h),
            Err(e) => tracing::error!(error = %e, "cannot start the store flusher thread"),
        }
        if self.inner.config.flush_mode == FlushMode::Sync {
            let inner = self.inner.clone();
            let handle = std::thread::Builder::new()
                .name("shoal-store-commit".into())
                .spawn(move || inner.group_commit_loop());
            match handle {
                Ok(h) => {
                    self.inner
                        .appends
                        .sync_thread
                        .store(true, Ordering::Release);
                    self.threads.lock().push(h);
                }
                Err(e) => tracing::error!(error = %e, "cannot start the group commit thread"),
            }
        }
    }

    /// Appends one message. See [`Self::put_messages`].
    pub fn put_message(&self, msg: &MessageExtBrokerInner) -> Result<PutMessageResult> {
        self.put_messages(std::slice::from_ref(msg))
    }

    /// Appends messages (any mix of topics and queues) as one batch: queue offsets are
    /// assigned per (topic, queue) in order, the records are written with one write per
    /// segment, and under sync flush the call returns after one fsync covering all of them
    /// (unless every message carries `WAIT=false`, as RocketMQ, then `NotFlushed`).
    /// Either all messages are appended or (on error) none is visible.
    pub fn put_messages(&self, msgs: &[MessageExtBrokerInner]) -> Result<PutMessageResult> {
        let inner = &*self.inner;
        if inner.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        if msgs.is_empty() {
            return Ok(PutMessageResult {
                messages: Vec::new(),
                flush: FlushStatus::NotFlushed,
            });
        }
        // Encoded outside the lock; offsets and store timestamp are patched in under it,
        // together with every put queued by others (see `appender`).
        let job = Job::encode(inner, std::borrow::Cow::Borrowed(msgs))?;
        inner.put_blocking(job)
    }

    /// Reads up to `max_count` messages (and about `max_bytes`, at least one message) from
    /// (topic, queue id) starting at queue offset `offset`, keeping only entries whose tag
    /// code passes `filter`. At most 800 consume-queue entries are scanned per call.
    pub fn get_messages(
        &self,
        topic: &str,
        queue_id: i32,
        offset: u64,
        max_count: usize,
        max_bytes: usize,
        filter: &dyn Fn(i64) -> bool,
    ) -> Result<GetMessageResult> {
        let inner = &*self.inner;
        let cq = inner.queue(topic, queue_id, false).ok().flatten();
        let (min, max) = cq
            .as_ref()
            .map_or((0, 0), |cq| (cq.min_offset(), cq.max_offset()));
        let mut result = GetMessageResult {
            status: GetMessageStatus::NoMessageInQueue,
            messages: Bytes::new(),
            message_count: 0,
            queue_offsets: Vec::new(),
            next_begin_offset: 0,
            min_offset: min,
            max_offset: max,
            corrupt_skipped: 0,
        };
        let Some(cq) = cq.filter(|_| max > 0) else {
            return Ok(result);
        };
        if offset < min {
            result.status = GetMessageStatus::OffsetTooSmall;
            result.next_begin_offset = min;
            return Ok(result);
        }
        if offset == max {
            result.status = GetMessageStatus::OffsetOverflowOne;
            result.next_begin_offset = offset;
            return Ok(result);
        }
        if offset > max {
            result.status = GetMessageStatus::OffsetOverflowBadly;
            result.next_begin_offset = max;
            return Ok(result);
        }
        let cl_min = inner.commit_log.min_offset();
        let mut scanned = 0u64;
        let mut total = 0usize;
        let mut picked: Vec<CqEntry> = Vec::new();
        let chunk = max_count.clamp(16, MAX_SCAN_ENTRIES);
        'scan: while (scanned as usize) < MAX_SCAN_ENTRIES && picked.len() < max_count {
            let want = chunk.min(MAX_SCAN_ENTRIES - scanned as usize);
            let entries = cq.read(offset + scanned, want)?;
            if entries.is_empty() {
                break;
            }
            for e in &entries {
                if picked.len() >= max_count
                    || (!picked.is_empty() && total + e.size as usize > max_bytes)
                {
                    break 'scan;
                }
                scanned += 1;
                if e.phys_offset < cl_min || !filter(e.tag_code) {
                    continue;
                }
                total += e.size as usize;
                result.queue_offsets.push(offset + scanned - 1);
                picked.push(*e);
            }
        }
        let mut buf = BytesMut::with_capacity(total);
        // Coalesce adjacent records into one read.
        let mut i = 0;
        while i < picked.len() {
            let start = picked[i].phys_offset;
            let mut run_end = start + u64::from(picked[i].size);
            let seg_end =
                start - start % inner.commit_log.segment_size() + inner.commit_log.segment_size();
            let mut j = i + 1;
            while j < picked.len() && picked[j].phys_offset == run_end {
                let e = run_end + u64::from(picked[j].size);
                if e > seg_end {
                    break;
                }
                run_end = e;
                j += 1;
            }
            inner
                .commit_log
                .read_into(start, (run_end - start) as usize, &mut buf)?;
            i = j;
        }
        result.next_begin_offset = offset + scanned;
        let buf = self.drop_corrupt(topic, queue_id, &mut picked, &mut result, buf)?;
        result.message_count = picked.len();
        result.messages = buf;
        result.status = if picked.is_empty() {
            GetMessageStatus::NoMatchedMessage
        } else {
            GetMessageStatus::Found
        };
        Ok(result)
    }

    /// Finds corrupt records (known ones, and by CRC when `check_crc_on_read`) among the
    /// records read by a pull and applies the [`CorruptRecordPolicy`].
    fn drop_corrupt(
        &self,
        topic: &str,
        queue_id: i32,
        picked: &mut Vec<CqEntry>,
        result: &mut GetMessageResult,
        buf: BytesMut,
    ) -> Result<Bytes> {
        let inner = &*self.inner;
        let check = inner.config.check_crc_on_read;
        let mut bad = Vec::new();
        {
            let known = inner.corrupt.read();
            if !check && known.is_empty() {
                return Ok(buf.freeze());
            }
            let mut at = 0usize;
            for (i, e) in picked.iter().enumerate() {
                let end = at + e.size as usize;
                let rec = buf.get(at..end).unwrap_or(&[]);
                let corrupt = known.contains(&e.phys_offset)
                    || (check && RecordView::parse(rec).and_then(|v| v.verify_crc()).is_err());
                if corrupt {
                    bad.push(i);
                }
                at = end;
            }
        }
        if bad.is_empty() {
            return Ok(buf.freeze());
        }
        inner
            .corrupt_reads
            .fetch_add(bad.len() as u64, Ordering::Relaxed);
        {
            let mut known = inner.corrupt.write();
            for &i in &bad {
                let e = picked[i];
                if known.insert(e.phys_offset) {
                    tracing::warn!(
                        offset = e.phys_offset,
                        %topic,
                        queue_id,
                        queue_offset = result.queue_offsets[i],
                        "commit log record failed its CRC check on read"
                    );
                }
            }
        }
        let first = bad[0];
        if inner.config.corrupt_record_policy == CorruptRecordPolicy::Error {
            if first == 0 {
                return Err(StoreError::CorruptRecord {
                    phys_offset: picked[0].phys_offset,
                    topic: topic.to_string(),
                    queue_id,
                    queue_offset: result.queue_offsets[0],
                });
            }
            // Serve what precedes it; the next pull starts at the corrupt record.
            let keep: usize = picked[..first].iter().map(|e| e.size as usize).sum();
            result.next_begin_offset = result.queue_offsets[first];
            picked.truncate(first);
            result.queue_offsets.truncate(first);
            let mut buf = buf;
            buf.truncate(keep);
            return Ok(buf.freeze());
        }
        let mut out = BytesMut::with_capacity(buf.len());
        let mut at = 0usize;
        let mut kept = Vec::with_capacity(picked.len());
        let mut offsets = Vec::with_capacity(picked.len());
        for (i, e) in picked.iter().enumerate() {
            let end = at + e.size as usize;
            if !bad.contains(&i) {
                out.extend_from_slice(buf.get(at..end).unwrap_or(&[]));
                kept.push(*e);
                offsets.push(result.queue_offsets[i]);
            }
            at = end;
        }
        result.corrupt_skipped = bad.len();
        *picked = kept;
        result.queue_offsets = offsets;
        Ok(out.freeze())
    }

    /// Corrupt records met by reads so far (skipped or refused).
    pub fn corrupt_records_read(&self) -> u64 {
        self.inner.corrupt_reads.load(Ordering::Relaxed)
    }

    /// Next queue offset to be written in (topic, queue id); 0 for an unknown queue.
    pub fn max_offset(&self, topic: &str, queue_id: i32) -> u64 {
        self.cq(topic, queue_id).map_or(0, |cq| cq.max_offset())
    }

    /// First readable queue offset of (topic, queue id); 0 for an unknown queue.
    pub fn min_offset(&self, topic: &str, queue_id: i32) -> u64 {
        self.cq(topic, queue_id).map_or(0, |cq| cq.min_offset())
    }

    fn cq(&self, topic: &str, queue_id: i32) -> Option<Arc<ConsumeQueue>> {
        self.inner.queue(topic, queue_id, false).ok().flatten()
    }

    /// Queue offset for a time (SEARCH_OFFSET_BY_TIMESTAMP, reset by time): binary search on
    /// the store timestamps of the queue's messages. 0 for an unknown or empty queue.
    pub fn offset_by_timestamp(
        &self,
        topic: &str,
        queue_id: i32,
        timestamp: i64,
        boundary: BoundaryType,
    ) -> Result<u64> {
        let Some(cq) = self.cq(topic, queue_id) else {
            return Ok(0);
        };
        let (min, max) = (cq.min_offset(), cq.max_offset());
        let (mut lo, mut hi) = (min, max);
        // Find the first offset whose store time is > timestamp (Upper) or >= (Lower).
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let ts = self.entry_store_timestamp(&cq, mid)?;
            let before = match boundary {
                BoundaryType::Lower => ts < timestamp,
                BoundaryType::Upper => ts <= timestamp,
            };
            if before {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(match boundary {
            BoundaryType::Lower => lo,
            BoundaryType::Upper => lo.saturating_sub(1).max(min),
        })
    }

    fn entry_store_timestamp(&self, cq: &ConsumeQueue, offset: u64) -> Result<i64> {
        let e = cq.get(offset)?.ok_or_else(|| {
            StoreError::InvalidArgument(format!("queue offset {offset} is not stored"))
        })?;
        self.inner.store_timestamp_at(e.phys_offset)
    }

    /// Store timestamp of the oldest message still in (topic, queue id).
    pub fn earliest_store_time(&self, topic: &str, queue_id: i32) -> Result<Option<i64>> {
        let Some(cq) = self.cq(topic, queue_id) else {
            return Ok(None);
        };
        let min = cq.min_offset();
        if min >= cq.max_offset() {
            return Ok(None);
        }
        self.entry_store_timestamp(&cq, min).map(Some)
    }

    /// Store timestamp of the message at (topic, queue id, offset), if stored.
    pub fn store_time_of(&self, topic: &str, queue_id: i32, offset: u64) -> Result<Option<i64>> {
        match self.cq(topic, queue_id) {
            Some(cq) if offset >= cq.min_offset() && offset < cq.max_offset() => {
                self.entry_store_timestamp(&cq, offset).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The stored record at a commit log offset (VIEW_MESSAGE_BY_ID with an offset message
    /// id), or `None` if no record starts there.
    pub fn message_by_physical_offset(&self, offset: u64) -> Result<Option<Bytes>> {
        self.inner.record_at(offset)
    }

    /// Records of `topic` whose `KEYS` contain `key` or whose `UNIQ_KEY` is `key`, stored
    /// between `begin` and `end` (ms, inclusive), newest first, at most `max`.
    pub fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        max: usize,
        begin: i64,
        end: i64,
    ) -> Result<Vec<Bytes>> {
        self.inner.query(topic, key, max, begin, end, false)
    }

    /// Records of `topic` whose `UNIQ_KEY` is `uniq_key`, newest first (a retried send can
    /// store the same key more than once), at most 32.
    pub fn query_by_uniq_key(&self, topic: &str, uniq_key: &str) -> Result<Vec<Bytes>> {
        self.inner
            .query(topic, uniq_key, 32, i64::MIN, i64::MAX, true)
    }

    /// Deletes a topic's consume queues and consumer offsets. Its records stay in the commit
    /// log until retention removes them, but are no longer reachable by queue or key.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        // The topic names a directory: never let it point elsewhere.
        validate_topic(topic)?;
        let inner = &*self.inner;
        let _w = inner.lock_writer();
        let removed = inner.queues.write().remove(topic);
        if let Some(qs) = removed {
            for cq in qs.values() {
                cq.destroy()?;
            }
        }
        let tdir = inner.config.data_dir.join("consumequeue").join(topic);
        inner
            .backend
            .remove_dir_all(&tdir)
            .map_err(io_err("remove topic dir", &tdir))?;
        inner.offsets.remove_topic(topic);
        drop(_w);
        // A crash must not re-create the queues from the commit log tail.
        inner.flush_logics()
    }

    /// Topics that have consume queues.
    pub fn topics(&self) -> Vec<String> {
        let mut t: Vec<String> = self.inner.queues.read().keys().cloned().collect();
        t.sort();
        t
    }

    /// Queue ids of a topic that have consume queues.
    pub fn queue_ids(&self, topic: &str) -> Vec<i32> {
        let mut q: Vec<i32> = self
            .inner
            .queues
            .read()
            .get(topic)
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        q.sort_unstable();
        q
    }

    /// Registers a callback told about every appended message (for long polling).
    pub fn add_arrival_listener(&self, listener: ArrivalListener) {
        self.inner.listeners.write().push(listener);
    }

    /// Commits a consumer offset for (group, topic, queue id).
    pub fn commit_offset(&self, group: &str, topic: &str, queue_id: i32, offset: i64) {
        self.inner.offsets.commit(group, topic, queue_id, offset);
    }

    /// The committed offset of (group, topic, queue id), if any.
    pub fn query_offset(&self, group: &str, topic: &str, queue_id: i32) -> Option<i64> {
        self.inner.offsets.query(group, topic, queue_id)
    }

    /// All committed offsets of a group as (topic, queue id, offset).
    pub fn offsets_of_group(&self, group: &str) -> Vec<(String, i32, i64)> {
        self.inner.offsets.of_group(group)
    }

    /// Groups that committed offsets on a topic.
    pub fn groups_of_topic(&self, topic: &str) -> Vec<String> {
        self.inner.offsets.groups_of_topic(topic)
    }

    /// Forgets every offset of a group.
    pub fn remove_group_offsets(&self, group: &str) {
        self.inner.offsets.remove_group(group);
    }

    /// Delivery progress of a delay level (the schedule topic's queue offset), if any.
    pub fn schedule_offset(&self, delay_level: i32) -> Option<i64> {
        self.inner.offsets.schedule_offset(delay_level)
    }

    /// Records the delivery progress of a delay level.
    pub fn set_schedule_offset(&self, delay_level: i32, offset: i64) {
        self.inner.offsets.set_schedule_offset(delay_level, offset);
    }

    /// Persists consumer offsets and delay progress now (also done on an interval and on
    /// shutdown).
    pub fn persist_offsets(&self) -> Result<()> {
        self.inner.offsets.persist()
    }

    /// Flushes everything now: commit log, consume queues, index, checkpoint. Returns the
    /// durable commit log offset.
    pub fn flush(&self) -> Result<u64> {
        let flushed = self.inner.commit_log.flush()?;
        self.inner.flush_logics()?;
        Ok(flushed)
    }

    /// Deletes commit log segments whose messages are all older than the retention time at
    /// `now_ms`, with the consume-queue and index files behind them.
    pub fn delete_expired(&self, now_ms: i64) -> Result<RetentionReport> {
        self.inner.delete_expired(now_ms)
    }

    /// Offset where the next record goes in the commit log.
    pub fn commit_log_max_offset(&self) -> u64 {
        self.inner.commit_log.write_pos()
    }

    /// First commit log offset still stored.
    pub fn commit_log_min_offset(&self) -> u64 {
        self.inner.commit_log.min_offset()
    }

    /// Durable commit log offset.
    pub fn commit_log_flushed_offset(&self) -> u64 {
        self.inner.commit_log.flushed()
    }

    /// The histogram of commit log fsync times (each flush round that had bytes to sync).
    pub fn flush_latency(&self) -> shoal_metrics::LatencyHistogram {
        self.inner.commit_log.flush_latency.clone()
    }

    /// The configuration the store runs with.
    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// Clean shutdown: stops the background threads, flushes everything, persists offsets,
    /// writes the clean-shutdown checkpoint and removes the abort marker. Further puts fail
    /// with [`StoreError::Closed`]. Idempotent.
    pub fn shutdown(&self) -> Result<()> {
        let inner = &*self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let r = self.close_files();
        // Another process may open the directory now.
        inner.dir_lock.lock().take();
        r
    }

    fn close_files(&self) -> Result<()> {
        let inner = &*self.inner;
        {
            *inner.stop.lock() = true;
            inner.stop_cv.notify_all();
            inner.appends.sync_cv.notify_all();
        }
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
        inner.appends.sync_thread.store(false, Ordering::Release);
        // Puts still queued fail; appended ones waiting for an fsync get the flush below.
        inner.fail_waiting();
        let w = inner.writer.lock();
        inner.offsets.persist()?;
        if let Some(reason) = &w.failed {
            // Leave the abort marker: the next open must run the full check and re-dispatch
            // whatever the failed write left behind.
            tracing::warn!(%reason, "store closed after a write failure; next open runs a full check");
            return Ok(());
        }
        inner.commit_log.flush()?;
        // Every segment file as long as its data again (the clean start's fast path checks it).
        inner.commit_log.seal()?;
        inner.flush_logics()?;
        let end = inner.commit_log.write_pos();
        let queues: BTreeMap<String, u64> = inner
            .queues
            .read()
            .iter()
            .flat_map(|(t, m)| {
                m.iter()
                    .map(move |(q, cq)| (format!("{t}/{q}"), cq.max_offset()))
            })
            .collect();
        let cp = Checkpoint {
            commit_log_flushed: end,
            logics_flushed: end,
            clean_end: Some(end),
            queues: Some(queues),
        };
        inner.write_checkpoint(&cp)?;
        let abort = inner.config.data_dir.join(ABORT_FILE);
        inner
            .backend
            .remove_file(&abort)
            .map_err(io_err("remove abort marker", &abort))
    }
}

impl MessageStore {
    /// Simulates the process dying, for crash tests: stops the background threads and releases
    /// the data directory lock, with no flush, no checkpoint and the abort marker left in place.
    /// Bytes already written stay where the OS has them.
    pub fn abandon(self) {
        let inner = &*self.inner;
        inner.closed.store(true, Ordering::Release);
        {
            *inner.stop.lock() = true;
            inner.stop_cv.notify_all();
        }
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
        inner.dir_lock.lock().take();
        std::mem::forget(self);
    }
}

impl Drop for MessageStore {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::error!(error = %e, "message store shutdown failed");
        }
    }
}

/// Outcome of a recovery scan.
struct ScanOutcome {
    /// End of the valid data.
    end: u64,
    /// Why the scan stopped, if it stopped on bad data.
    reason: Option<String>,
    /// Records validated.
    checked: u64,
    /// Store timestamp of the last valid record (0 if none).
    last_store_timestamp: i64,
    /// Records with intact framing and a failed body CRC, followed by valid records (kept).
    corrupt: Vec<u64>,
    /// Zeros from the end of the last record to the end of the last segment's file: space
    /// reserved ahead of memory-mapped appends, not data.
    free_tail: u64,
}

/// Scans the commit log from `from`, validating records; hands those at or above
/// `collect_from` to `sink`. A record whose framing is intact (size, magic, field lengths, its
/// own position) but whose body CRC fails is kept in its place (reported in `corrupt`) when a
/// valid record follows it; at the tail it is a torn write and ends the log.
fn scan_commit_log(
    cl: &CommitLog,
    from: u64,
    collect_from: u64,
    sink: &mut dyn FnMut(ScannedRecord) -> Result<()>,
) -> Result<ScanOutcome> {
    let mut checked = 0u64;
    let mut last_ts = 0i64;
    let mut corrupt: Vec<u64> = Vec::new();
    // CRC-failed records not yet followed by a valid one.
    let mut pending: Vec<ScannedRecord> = Vec::new();
    let done = |end: u64,
                reason: Option<String>,
                checked: u64,
                last_ts: i64,
                pending: Vec<ScannedRecord>,
                corrupt: Vec<u64>| {
        let (end, reason) = match pending.first() {
            Some(first) => (
                first.phys,
                Some(format!(
                    "record at {} failed its CRC check (or its properties end in a zero byte) \
                     and no valid record follows it (torn tail)",
                    first.phys
                )),
            ),
            None => (end, reason),
        };
        Ok(ScanOutcome {
            end,
            reason,
            checked,
            last_store_timestamp: last_ts,
            corrupt,
            free_tail: 0,
        })
    };
    let seg_size = cl.segment_size();
    let mut pos = from;
    let segs = cl.segments();
    let mut seg_idx = segs.partition_point(|s| s.base + seg_size <= pos);
    loop {
        let Some(seg) = segs.get(seg_idx) else {
            return done(pos, None, checked, last_ts, pending, corrupt);
        };
        if seg.base > pos {
            // A gap between segments: the data after it cannot be trusted.
            return done(
                pos,
                Some(format!("missing segment at {pos}")),
                checked,
                last_ts,
                pending,
                corrupt,
            );
        }
        let mut reader =
            SegmentReader::new(seg.file.clone()).map_err(io_err("stat segment", &seg.path))?;
        loop {
            let in_seg = pos - seg.base;
            let left = seg_size - in_seg;
            let header = reader
                .slice(in_seg, 8)
                .map_err(io_err("read commit log", &seg.path))?;
            let later = segs.get(seg_idx + 1).is_some();
            // Only zeros from here to the end of the last segment (even fewer than a header):
            // the space reserved ahead of memory-mapped appends (see `commitlog.rs`), a clean
            // end of the log. Zeros followed by data are damage (pages written back out of
            // order before a crash).
            let free_tail = |reader: &mut SegmentReader| -> Result<Option<u64>> {
                let zeros = !later
                    && reader.has_data_at(in_seg)
                    && reader
                        .zeros_from(in_seg)
                        .map_err(io_err("read commit log", &seg.path))?;
                Ok(zeros.then(|| reader.file_len - in_seg))
            };
            let Some(header) = header else {
                // End of data in this segment. Later segments would be unreachable.
                if let Some(free) = free_tail(&mut reader)? {
                    let mut out = done(pos, None, checked, last_ts, pending, corrupt)?;
                    out.free_tail = free;
                    return Ok(out);
                }
                let reason = if reader.has_data_at(in_seg) {
                    Some(format!("torn record header at {pos}"))
                } else if later {
                    Some(format!("segment ends at {pos} without an end marker"))
                } else {
                    None
                };
                return done(pos, reason, checked, last_ts, pending, corrupt);
            };
            let size = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
            let magic = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
            if magic == BLANK_MAGIC_CODE {
                if u64::from(size) != left {
                    return done(
                        pos,
                        Some(format!("bad end-of-segment marker at {pos}")),
                        checked,
                        last_ts,
                        pending,
                        corrupt,
                    );
                }
                pos = seg.base + seg_size;
                break;
            }
            if size == 0 && magic == 0 {
                if let Some(free) = free_tail(&mut reader)? {
                    let mut out = done(pos, None, checked, last_ts, pending, corrupt)?;
                    out.free_tail = free;
                    return Ok(out);
                }
                return done(
                    pos,
                    Some(format!("zeroed space at {pos}")),
                    checked,
                    last_ts,
                    pending,
                    corrupt,
                );
            }
            if (size as usize) < MIN_RECORD_LEN || u64::from(size) + 8 > left {
                return done(
                    pos,
                    Some(format!("bad record size {size} at {pos}")),
                    checked,
                    last_ts,
                    pending,
                    corrupt,
                );
            }
            let Some(rec) = reader
                .slice(in_seg, size as usize)
                .map_err(io_err("read commit log", &seg.path))?
            else {
                return done(
                    pos,
                    Some(format!("torn record at {pos}")),
                    checked,
                    last_ts,
                    pending,
                    corrupt,
                );
            };
            let view = match RecordView::parse(rec) {
                Ok(v) => v,
                Err(e) => {
                    let reason = format!("invalid record at {pos}: {e}");
                    return done(pos, Some(reason), checked, last_ts, pending, corrupt);
                }
            };
            if view.physical_offset() != pos as i64 || view.queue_offset() < 0 {
                let reason = format!("record at {pos} carries offset {}", view.physical_offset());
                return done(pos, Some(reason), checked, last_ts, pending, corrupt);
            }
            // The body CRC does not cover the topic and properties after the body. A write torn
            // in them leaves zeros there (the reserved zeros of a preallocated segment, or a
            // page not written back): a topic that is not a topic is an invalid record, and
            // properties ending in a zero byte count as damaged, like a failed CRC (puts never
            // store such properties; see `Job::encode`).
            if let Err(e) = validate_topic(view.topic()) {
                let reason = format!("invalid record at {pos}: {e}");
                return done(pos, Some(reason), checked, last_ts, pending, corrupt);
            }
            let crc_ok =
                view.verify_crc().is_ok() && !view.properties_str().ends_with(TORN_PROPERTIES_END);
            let record = ScannedRecord {
                phys: pos,
                size,
                topic: view.topic().to_string(),
                queue_id: view.queue_id(),
                queue_offset: view.queue_offset(),
                tag_code: view.tags_code(),
                store_timestamp: view.store_timestamp(),
                keys: index_keys(view.properties_str())
                    .map(str::to_owned)
                    .collect(),
            };
            pos += u64::from(size);
            if !crc_ok {
                // Framing intact, contents damaged: decided by what follows.
                pending.push(record);
                continue;
            }
            for p in pending.drain(..) {
                tracing::warn!(
                    offset = p.phys,
                    topic = %p.topic,
                    queue_id = p.queue_id,
                    queue_offset = p.queue_offset,
                    "commit log record failed its CRC check (or its properties end in a zero \
                     byte); kept in place and skipped on read"
                );
                corrupt.push(p.phys);
                checked += 1;
                if p.phys >= collect_from {
                    sink(p)?;
                }
            }
            checked += 1;
            last_ts = view.store_timestamp();
            if record.phys >= collect_from {
                sink(record)?;
            }
        }
        seg_idx += 1;
    }
}

impl Inner {
    /// The consume queue of (topic, queue id), created if asked. `Ok(None)` if absent.
    pub(crate) fn queue(
        &self,
        topic: &str,
        queue_id: i32,
        create: bool,
    ) -> Result<Option<Arc<ConsumeQueue>>> {
        if let Some(cq) = self.queues.read().get(topic).and_then(|m| m.get(&queue_id)) {
            return Ok(Some(cq.clone()));
        }
        if !create {
            return Ok(None);
        }
        let dir = self
            .config
            .data_dir
            .join("consumequeue")
            .join(topic)
            .join(queue_id.to_string());
        let cq = Arc::new(ConsumeQueue::open(
            self.backend.clone(),
            dir,
            self.config.consume_queue_file_entries,
        )?);
        let mut qs = self.queues.write();
        let slot = qs.entry(topic.to_string()).or_default();
        Ok(Some(slot.entry(queue_id).or_insert(cq).clone()))
    }

    /// Recovery: adds consume-queue and index entries for scanned records that lack them.
    /// Queues found with a hole are added to `broken` (to be rebuilt) and skipped.
    fn redispatch(
        &self,
        scanned: &[ScannedRecord],
        logics_flushed: u64,
        broken: &mut BTreeMap<(String, i32), String>,
    ) -> Result<u64> {
        let mut rebuilt = 0;
        let indexed_to = self.index.indexed_to();
        for r in scanned.iter().filter(|r| r.phys >= logics_flushed) {
            if r.phys >= indexed_to {
                for key in &r.keys {
                    self.index.put(&r.topic, key, r.phys, r.store_timestamp)?;
                }
            }
            if broken.contains_key(&(r.topic.clone(), r.queue_id)) {
                continue;
            }
            let Some(cq) = self.queue(&r.topic, r.queue_id, true)? else {
                continue;
            };
            let q = r.queue_offset as u64;
            let max = cq.max_offset();
            if q == max {
                cq.append(&[r.cq_entry()])?;
                rebuilt += 1;
            } else if q > max {
                // Entries are missing below the checkpoint (or the queue lost its files):
                // rebuild this queue from the whole commit log below.
                tracing::warn!(
                    topic = %r.topic,
                    queue_id = r.queue_id,
                    max,
                    next = q,
                    "consume queue has a hole; rebuilding it from the commit log"
                );
                broken.insert(
                    (r.topic.clone(), r.queue_id),
                    format!("entries {max}..{q} are missing below the checkpoint"),
                );
            }
        }
        Ok(rebuilt)
    }

    /// Start-up check of every consume queue against the commit log; adds the queues that do
    /// not match to `damaged`.
    fn verify_queues(&self, damaged: &mut BTreeMap<(String, i32), String>) -> Result<()> {
        let all: Vec<(String, i32, Arc<ConsumeQueue>)> = self
            .queues
            .read()
            .iter()
            .flat_map(|(t, m)| m.iter().map(move |(q, cq)| (t.clone(), *q, cq.clone())))
            .collect();
        let (cl_min, cl_end) = (self.commit_log.min_offset(), self.commit_log.write_pos());
        for (topic, qid, cq) in all {
            if damaged.contains_key(&(topic.clone(), qid)) {
                continue;
            }
            let samples = match cq.check_entries(cl_min, cl_end)? {
                Ok(samples) => samples,
                Err(why) => {
                    damaged.insert((topic, qid), why);
                    continue;
                }
            };
            for (logical, e) in samples {
                if let Some(why) = self.entry_mismatch(&topic, qid, logical, &e) {
                    damaged.insert((topic.clone(), qid), why);
                    break;
                }
            }
        }
        Ok(())
    }

    /// Why the consume-queue entry `logical` of (topic, queue id) does not point at its own
    /// record, if it does not.
    fn entry_mismatch(&self, topic: &str, qid: i32, logical: u64, e: &CqEntry) -> Option<String> {
        let rec = match self.commit_log.read(e.phys_offset, e.size as usize) {
            Ok(r) => r,
            Err(err) => return Some(format!("entry {logical} cannot be read: {err}")),
        };
        let ok = RecordView::parse(&rec).is_ok_and(|v| {
            v.total_size() as u32 == e.size
                && v.physical_offset() == e.phys_offset as i64
                && v.queue_offset() == logical as i64
                && v.queue_id() == qid
                && v.topic() == topic
        });
        (!ok).then(|| {
            format!(
                "entry {logical} points at commit log offset {} which is not its record",
                e.phys_offset
            )
        })
    }

    /// Re-creates the given consume queues from every record in the commit log.
    fn rebuild_queues(&self, queues: &HashSet<(String, i32)>) -> Result<u64> {
        let mut cqs = HashMap::new();
        for (topic, qid) in queues {
            if let Some(cq) = self.queue(topic, *qid, true)? {
                cq.reset_to(0)?;
                cqs.insert((topic.clone(), *qid), (cq, true));
            }
        }
        let mut rebuilt = 0u64;
        let from = self.commit_log.min_offset();
        scan_commit_log(&self.commit_log, from, from, &mut |r| {
            let Some((cq, first)) = cqs.get_mut(&(r.topic.clone(), r.queue_id)) else {
                return Ok(());
            };
            let q = r.queue_offset as u64;
            if *first && q > 0 {
                cq.reset_to(q)?;
            }
            *first = false;
            if q == cq.max_offset() {
                cq.append(&[r.cq_entry()])?;
                rebuilt += 1;
            }
            Ok(())
        })?;
        Ok(rebuilt)
    }

    fn last_record_timestamp(&self) -> Option<i64> {
        // Newest consume-queue entry across queues gives a recent record.
        let qs = self.queues.read();
        let mut best: Option<u64> = None;
        for cq in qs.values().flat_map(|m| m.values()) {
            let max = cq.max_offset();
            if max > cq.min_offset() {
                if let Ok(Some(e)) = cq.get(max - 1) {
                    best = best.max(Some(e.phys_offset));
                }
            }
        }
        drop(qs);
        best.and_then(|p| self.store_timestamp_at(p).ok())
    }

    fn record_at(&self, offset: u64) -> Result<Option<Bytes>> {
        let end = self.commit_log.write_pos();
        let seg_size = self.commit_log.segment_size();
        let fits = |len: u64| {
            offset
                .checked_add(len)
                .is_some_and(|e| e <= end && offset % seg_size + len <= seg_size)
        };
        if offset < self.commit_log.min_offset() || !fits(MIN_RECORD_LEN as u64) {
            return Ok(None);
        }
        let head = self.commit_log.read(offset, 8)?;
        let size = u64::from(u32::from_be_bytes([head[0], head[1], head[2], head[3]]));
        let magic = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if MessageVersion::from_magic_code(magic).is_none()
            || size < MIN_RECORD_LEN as u64
            || !fits(size)
        {
            return Ok(None);
        }
        let rec = match self.commit_log.read(offset, size as usize) {
            Ok(r) => r,
            Err(StoreError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::UnexpectedEof =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        match RecordView::parse(&rec) {
            Ok(v) if v.physical_offset() == offset as i64 => Ok(Some(rec)),
            _ => Ok(None),
        }
    }

    fn store_timestamp_at(&self, phys: u64) -> Result<i64> {
        let head = self.commit_log.read(phys, 40)?;
        let sys_flag = i32::from_be_bytes([head[36], head[37], head[38], head[39]]);
        let at = store_timestamp_pos(sys_flag) as u64;
        let ts = self.commit_log.read(phys + at, 8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(&ts);
        Ok(i64::from_be_bytes(b))
    }

    fn query(
        &self,
        topic: &str,
        key: &str,
        max: usize,
        begin: i64,
        end: i64,
        uniq_only: bool,
    ) -> Result<Vec<Bytes>> {
        let mut out = Vec::new();
        if max == 0 {
            return Ok(out);
        }
        let cl_min = self.commit_log.min_offset();
        let candidates =
            self.index
                .lookup(topic, key, max.saturating_mul(4).max(64), begin, end)?;
        let mut seen = HashSet::new();
        for phys in candidates {
            if out.len() >= max {
                break;
            }
            if phys < cl_min || !seen.insert(phys) {
                continue;
            }
            let Some(rec) = self.record_at(phys)? else {
                continue;
            };
            let Ok(view) = RecordView::parse(&rec) else {
                continue;
            };
            if view.topic() != topic {
                continue;
            }
            let uniq_match = view.uniq_key() == Some(key);
            let key_match = view
                .keys()
                .is_some_and(|ks| ks.split(' ').any(|k| k == key));
            if uniq_match || (!uniq_only && key_match) {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// Sync flush with group commit: the first waiter fsyncs everything written so far (the
    /// lock is not held during the fsync); others wait for it.
    pub(crate) fn wait_durable(&self, end: u64) -> FlushStatus {
        let deadline = Instant::now() + self.config.sync_flush_timeout;
        let mut flushing = self.group_commit.lock();
        loop {
            if self.commit_log.flushed() >= end {
                return FlushStatus::Flushed;
            }
            if self.writer_failed() {
                return FlushStatus::FlushFailed;
            }
            if !*flushing {
                *flushing = true;
                drop(flushing);
                let r = self.commit_log.flush();
                flushing = self.group_commit.lock();
                *flushing = false;
                self.group_commit_cv.notify_all();
                if let Err(e) = r {
                    tracing::error!(error = %e, "sync flush failed");
                    // Not under the group commit lock: letting go of the writer appends what
                    // was queued meanwhile (which then fails), and that may wait here.
                    drop(flushing);
                    self.lock_writer().failed = Some(format!("fsync failed: {e}"));
                    self.write_failed.store(true, Ordering::Release);
                    return FlushStatus::FlushFailed;
                }
                continue;
            }
            if self
                .group_commit_cv
                .wait_until(&mut flushing, deadline)
                .timed_out()
            {
                return if self.commit_log.flushed() >= end {
                    FlushStatus::Flushed
                } else {
                    FlushStatus::FlushTimeout
                };
            }
        }
    }

    fn writer_failed(&self) -> bool {
        self.write_failed.load(Ordering::Acquire)
    }

    /// Flushes consume queues and index, then records in the checkpoint the commit log
    /// offset below which they are durable.
    fn flush_logics(&self) -> Result<()> {
        let _g = self.logics_lock.lock();
        let dispatched = self.dispatched.load(Ordering::Acquire);
        let queues: Vec<Arc<ConsumeQueue>> = self
            .queues
            .read()
            .values()
            .flat_map(|m| m.values().cloned())
            .collect();
        for cq in queues {
            cq.flush()?;
        }
        self.index.flush()?;
        let cp = Checkpoint {
            commit_log_flushed: self.commit_log.flushed(),
            logics_flushed: dispatched,
            clean_end: None,
            queues: None,
        };
        self.write_checkpoint(&cp)
    }

    fn write_checkpoint(&self, cp: &Checkpoint) -> Result<()> {
        let bytes =
            serde_json::to_vec(cp).map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
        write_file_atomically(
            &*self.backend,
            &self.config.data_dir.join(CHECKPOINT_FILE),
            &bytes,
        )
    }

    fn delete_expired(&self, now_ms: i64) -> Result<RetentionReport> {
        let retention_ms = self.config.retention.as_millis() as i64;
        let cutoff = now_ms.saturating_sub(retention_ms);
        let segs = self.commit_log.segments();
        // Segment i is expired when the first record of segment i+1 (newer than all of
        // segment i, store timestamps being monotonic) is older than the cutoff.
        let mut delete_before = None;
        for pair in segs.windows(2) {
            let next = &pair[1];
            if next.base >= self.commit_log.write_pos() {
                break;
            }
            match self.store_timestamp_at(next.base) {
                Ok(ts) if ts < cutoff => delete_before = Some(next.base),
                _ => break,
            }
        }
        let mut report = RetentionReport {
            min_commit_log_offset: self.commit_log.min_offset(),
            ..RetentionReport::default()
        };
        let Some(before) = delete_before else {
            return Ok(report);
        };
        report.deleted_segments = self.commit_log.delete_segments_before(before)?;
        let cl_min = self.commit_log.min_offset();
        report.min_commit_log_offset = cl_min;
        let queues: Vec<Arc<ConsumeQueue>> = self
            .queues
            .read()
            .values()
            .flat_map(|m| m.values().cloned())
            .collect();
        for cq in queues {
            cq.correct_min_offset(cl_min)?;
        }
        report.deleted_index_files = self.index.delete_before(cl_min)?;
        tracing::info!(?report, "retention deleted expired files");
        Ok(report)
    }

    fn background_loop(&self) {
        let mut last_retention = Instant::now();
        let mut last_offsets = Instant::now();
        loop {
            {
                let mut stop = self.stop.lock();
                if *stop {
                    return;
                }
                let _ = self.stop_cv.wait_for(&mut stop, self.config.flush_interval);
                if *stop {
                    return;
                }
            }
            if self.config.flush_mode == FlushMode::Async {
                if let Err(e) = self.commit_log.flush() {
                    tracing::error!(error = %e, "commit log flush failed");
                }
            }
            if let Err(e) = self.flush_logics() {
                tracing::error!(error = %e, "consume queue / index flush failed");
            }
            if last_offsets.elapsed() >= self.config.offsets_persist_interval {
                last_offsets = Instant::now();
                if let Err(e) = self.offsets.persist() {
                    tracing::error!(error = %e, "offsets persist failed");
                }
            }
            if last_retention.elapsed() >= self.config.retention_check_interval {
                last_retention = Instant::now();
                if let Err(e) = self.delete_expired(now_ms()) {
                    tracing::error!(error = %e, "retention failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod known_properties_tests {
    use super::*;
    use proptest::prelude::*;
    use shoal_proto::message::property::{TAGS, WAIT};

    /// The ranges a sender that went over the pairs would give.
    fn known_of(properties: &str) -> KnownProperties {
        let mut known = KnownProperties::default();
        let mut pos = 0;
        for pair in properties.split_terminator('\u{2}') {
            let (key, value) = pair.split_once('\u{1}').unwrap_or((pair, ""));
            let start = (pos + key.len() + 1) as u32;
            let at = Some((start, start + value.len() as u32));
            match key {
                k if k == TAGS => known.tags = at,
                k if k == WAIT => known.wait = at,
                k if k == KEYS => known.keys = at,
                k if k == UNIQ_KEY => known.uniq = at,
                _ => {}
            }
            pos += pair.len() + 1;
        }
        known
    }

    proptest! {
        /// Ranges of a pass over the pairs resolve to what the store's own search finds.
        #[test]
        fn known_ranges_give_what_the_search_finds(
            pairs in proptest::collection::btree_map(
                prop_oneof![
                    Just("TAGS".to_owned()), Just("WAIT".to_owned()), Just("KEYS".to_owned()),
                    Just("UNIQ_KEY".to_owned()), Just("XTAGS".to_owned()), Just("AGS".to_owned()),
                    "[A-Z_]{1,8}",
                ],
                "[ -~]{1,12}",
                0..8,
            ),
        ) {
            let properties: String =
                pairs.iter().map(|(k, v)| format!("{k}\u{1}{v}\u{2}")).collect();
            let known = known_of(&properties);
            prop_assert_eq!(
                known.resolve(&properties),
                Some(find_properties(&properties, [TAGS, WAIT, KEYS, UNIQ_KEY]))
            );
        }
    }

    #[test]
    fn ranges_that_are_not_their_keys_values_are_refused() {
        let p = "TAGS\u{1}a\u{2}KEYS\u{1}k1 k2\u{2}XUNIQ_KEY\u{1}U\u{2}";
        let good = known_of("TAGS\u{1}a\u{2}KEYS\u{1}k1 k2\u{2}");
        assert_eq!(
            good.resolve(p),
            Some([Some("a"), None, Some("k1 k2"), None])
        );
        // The value of another key, part of a value, past the end, a key's tail.
        for bad in [
            KnownProperties {
                tags: Some((12, 17)),
                ..good
            },
            KnownProperties {
                keys: Some((12, 14)),
                ..good
            },
            KnownProperties {
                keys: Some((12, 99)),
                ..good
            },
            KnownProperties {
                uniq: Some((28, 29)),
                ..good
            },
        ] {
            assert_eq!(bad.resolve(p), None, "{bad:?}");
        }
    }
}
