//! The message store: the state a store shares with its threads, opening (see `recovery.rs`)
//! and shutting down, the flusher thread, and the calls that are neither a put (see
//! `appender.rs`) nor a read (see `read.rs`): topics, offsets, flushes, retention. See the
//! crate documentation for the overview.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};

use crate::appender::{AppendQueue, AppendScratch};
use crate::backend::DirLock;
use crate::checkpoint::{Checkpoint, Checkpoints};
use crate::commitlog::CommitLog;
use crate::config::{FlushMode, StoreConfig};
use crate::corrupt::CorruptRecords;
use crate::error::Result;
use crate::flusher::{GroupCommit, StopSignal};
use crate::index::Index;
use crate::offsets::OffsetStore;
use crate::queues::QueueTable;
use crate::record::{now_ms, validate_topic};
use crate::recovery::{recover, Recovered};
use crate::retention;
use crate::types::{ArrivalListener, FlushStatus, RecoveryReport, RetentionReport};

pub(crate) struct WriterState {
    pub(crate) last_store_timestamp: i64,
    pub(crate) failed: Option<String>,
    /// Lists every append fills and empties (reused, so an append allocates little).
    pub(crate) scratch: AppendScratch,
}

/// What a store shares with its threads.
pub(crate) struct Inner {
    pub(crate) config: StoreConfig,
    pub(crate) commit_log: CommitLog,
    pub(crate) queues: QueueTable,
    pub(crate) index: Index,
    offsets: OffsetStore,
    /// Owned by whoever appends. Anyone else who locks it must use `lock_writer`, which
    /// appends what was queued meanwhile when it lets go (a put that finds the writer busy
    /// leaves its job to the holder).
    pub(crate) writer: Mutex<WriterState>,
    /// Set with `WriterState::failed`: read without the writer's lock.
    pub(crate) write_failed: AtomicBool,
    /// Puts waiting for the appender, and appends waiting for their fsync.
    pub(crate) appends: AppendQueue,
    /// Records below this commit log offset have their consume-queue and index entries written.
    pub(crate) dispatched: AtomicU64,
    /// Replicated stores: records ending at or below this offset may be dispatched (see
    /// `replication.rs`). Unused otherwise.
    pub(crate) confirmed: AtomicU64,
    /// Replicated stores: held by whoever dispatches records from the commit log (taken after
    /// the writer's lock by those that hold both).
    pub(crate) dispatch_lock: Mutex<()>,
    /// Sync flush's group commit.
    group_commit: GroupCommit,
    pub(crate) listeners: RwLock<Vec<ArrivalListener>>,
    pub(crate) closed: AtomicBool,
    /// Puts are refused (a replica's store: only replicated appends write its log).
    pub(crate) puts_refused: AtomicBool,
    /// Stops the background threads.
    pub(crate) stop: StopSignal,
    checkpoints: Checkpoints,
    /// Records whose body CRC failed, found by recovery or by reads.
    pub(crate) corrupt: CorruptRecords,
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

impl MessageStore {
    /// Opens (creating if needed) the store in `config.data_dir`, recovers it and starts the
    /// background threads (if configured).
    pub fn open(config: StoreConfig) -> Result<(MessageStore, RecoveryReport)> {
        config.validate()?;
        let (recovered, report) = recover(&config)?;
        let Recovered {
            dir_lock,
            checkpoints,
            commit_log,
            queues,
            index,
            offsets,
            last_store_timestamp,
            dispatched,
        } = recovered;
        let inner = Arc::new(Inner {
            commit_log,
            queues,
            index,
            offsets,
            writer: Mutex::new(WriterState {
                last_store_timestamp,
                failed: None,
                scratch: Default::default(),
            }),
            write_failed: AtomicBool::new(false),
            appends: AppendQueue::default(),
            dispatched: AtomicU64::new(dispatched),
            confirmed: AtomicU64::new(dispatched),
            dispatch_lock: Mutex::new(()),
            group_commit: GroupCommit::default(),
            listeners: RwLock::new(Vec::new()),
            closed: AtomicBool::new(false),
            puts_refused: AtomicBool::new(false),
            stop: StopSignal::default(),
            checkpoints,
            corrupt: CorruptRecords::new(&report.corrupt_records),
            dir_lock: Mutex::new(Some(dir_lock)),
            config,
        });
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

    /// Whether puts are taken (the default) or refused with [`crate::StoreError::PutsRefused`]
    /// (a replica's store, written only by [`MessageStore::append_replicated`]). Refusing
    /// waits for an append in progress: once this returns, no put appends until allowed
    /// again, and the write position is final.
    pub fn set_puts_allowed(&self, allowed: bool) {
        self.inner.puts_refused.store(!allowed, Ordering::Release);
        if !allowed {
            // Whoever holds the writer now finishes; every later append sees the flag.
            drop(self.inner.lock_writer());
        }
    }

    /// Deletes a topic's consume queues and consumer offsets. Its records stay in the commit
    /// log until retention removes them, but are no longer reachable by queue or key.
    pub fn delete_topic(&self, topic: &str) -> Result<()> {
        // The topic names a directory: never let it point elsewhere.
        validate_topic(topic)?;
        let inner = &*self.inner;
        let _w = inner.lock_writer();
        inner.queues.remove_topic(topic)?;
        inner.offsets.remove_topic(topic);
        drop(_w);
        // A crash must not re-create the queues from the commit log tail.
        inner.flush_logics()
    }

    /// Topics that have consume queues.
    pub fn topics(&self) -> Vec<String> {
        self.inner.queues.topics()
    }

    /// Queue ids of a topic that have consume queues.
    pub fn queue_ids(&self, topic: &str) -> Vec<i32> {
        self.inner.queues.queue_ids(topic)
    }

    /// Registers a callback told about every appended message (for long polling); in a
    /// replicated store, about every message when it becomes visible.
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

    /// Every committed offset as (group, topic, queue id, offset).
    pub fn all_offsets(&self) -> Vec<(String, String, i32, i64)> {
        self.inner.offsets.all()
    }

    /// Every delay level's progress as (level, offset).
    pub fn all_schedule_offsets(&self) -> Vec<(i32, i64)> {
        self.inner.offsets.delay_all()
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
    /// with [`StoreError::Closed`](crate::StoreError::Closed). Idempotent.
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
        inner.stop.raise();
        inner.appends.sync_cv.notify_all();
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
        inner.appends.sync_thread.store(false, Ordering::Release);
        // Puts still queued fail; appended ones waiting for an fsync get the flush below.
        inner.fail_waiting();
        let w = inner.writer.lock();
        // No dispatch moves the dispatched offset while the checkpoint is written.
        let _d = inner.dispatch_lock.lock();
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
        let replicated = inner.config.replicated;
        let logics = if replicated {
            inner.dispatched.load(Ordering::Acquire)
        } else {
            end
        };
        let cp = Checkpoint {
            commit_log_flushed: end,
            logics_flushed: logics,
            clean_end: Some(end),
            queues: Some(inner.queues.max_offsets()),
            confirmed: replicated.then_some(logics),
        };
        inner.checkpoints.write(&cp)?;
        inner.checkpoints.mark_clean()
    }
}

impl MessageStore {
    /// Simulates the process dying, for crash tests: stops the background threads and releases
    /// the data directory lock, with no flush, no checkpoint and the abort marker left in place.
    /// Bytes already written stay where the OS has them.
    pub fn abandon(self) {
        let inner = &*self.inner;
        inner.closed.store(true, Ordering::Release);
        inner.stop.raise();
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

impl Inner {
    /// Sync flush with group commit: the first waiter fsyncs everything written so far (the
    /// lock is not held during the fsync); others wait for it.
    pub(crate) fn wait_durable(&self, end: u64) -> FlushStatus {
        self.group_commit.wait_durable(
            &self.commit_log,
            end,
            self.config.sync_flush_timeout,
            || self.writer_failed(),
            |e| {
                self.lock_writer().failed = Some(format!("fsync failed: {e}"));
                self.write_failed.store(true, Ordering::Release);
            },
        )
    }

    fn writer_failed(&self) -> bool {
        self.write_failed.load(Ordering::Acquire)
    }

    /// Flushes consume queues and index, then records in the checkpoint the commit log
    /// offset below which they are durable.
    fn flush_logics(&self) -> Result<()> {
        self.checkpoints.flush_logics(
            &self.dispatched,
            &self.queues,
            &self.index,
            &self.commit_log,
            self.config.replicated,
        )
    }

    /// The checkpoints of the data directory.
    pub(crate) fn checkpoints(&self) -> &Checkpoints {
        &self.checkpoints
    }

    fn delete_expired(&self, now_ms: i64) -> Result<RetentionReport> {
        retention::delete_expired(
            &self.commit_log,
            &self.queues,
            &self.index,
            self.config.retention,
            now_ms,
            // Never a segment holding records that wait for their dispatch.
            self.dispatched.load(Ordering::Acquire),
        )
    }

    /// The flusher thread: every flush interval, fsyncs the commit log (async flush) and
    /// writes the checkpoint; persists offsets and runs retention on their own intervals.
    fn background_loop(&self) {
        let mut last_retention = Instant::now();
        let mut last_offsets = Instant::now();
        loop {
            if self.stop.sleep(self.config.flush_interval) {
                return;
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
