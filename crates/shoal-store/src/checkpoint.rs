//! What the data directory says about the last run: the checkpoint (below which offsets the
//! commit log, the consume queues and the index are durable, and, after a clean shutdown,
//! where everything ends) and the abort marker (present while the store is open).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::commitlog::CommitLog;
use crate::error::{io_err, Result};
use crate::index::Index;
use crate::queues::QueueTable;
use crate::StoreError;

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Checkpoint {
    /// Commit log durable below this offset.
    pub(crate) commit_log_flushed: u64,
    /// Consume queues and index durable for every record below this offset.
    pub(crate) logics_flushed: u64,
    /// Set only by a clean shutdown: the exact end of the commit log.
    pub(crate) clean_end: Option<u64>,
    /// Set only by a clean shutdown: every consume queue (`topic/queueId`) and its max offset,
    /// so the next start notices a queue that lost entries or files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) queues: Option<BTreeMap<String, u64>>,
    /// Replicated stores: a confirmed offset (a record boundary, at most the true one: the
    /// dispatched offset when written). Recovery makes nothing above it visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) confirmed: Option<u64>,
}

const CHECKPOINT_FILE: &str = "checkpoint";
const ABORT_FILE: &str = "abort";

/// The checkpoint file and the abort marker of one data directory. Checkpoint writes by the
/// flusher thread and by explicit flushes are serialized.
pub(crate) struct Checkpoints {
    backend: Arc<dyn Backend>,
    dir: PathBuf,
    /// Serializes [`Checkpoints::flush_logics`] (flusher thread vs. explicit flush).
    logics_lock: Mutex<()>,
}

impl Checkpoints {
    /// The checkpoint and abort marker of the data directory `dir`.
    pub(crate) fn new(backend: Arc<dyn Backend>, dir: PathBuf) -> Self {
        Checkpoints {
            backend,
            dir,
            logics_lock: Mutex::new(()),
        }
    }

    /// The last checkpoint written, if there is one that parses.
    pub(crate) fn read(&self) -> Result<Option<Checkpoint>> {
        read_checkpoint(&*self.backend, &self.dir.join(CHECKPOINT_FILE))
    }

    /// Whether the abort marker is present: the previous run did not shut down cleanly.
    pub(crate) fn abnormal_shutdown(&self) -> bool {
        self.backend.exists(&self.dir.join(ABORT_FILE))
    }

    /// Creates the abort marker (durably): the store is open.
    pub(crate) fn mark_open(&self) -> Result<()> {
        let abort_path = self.dir.join(ABORT_FILE);
        let marker = self
            .backend
            .open(&abort_path, true)
            .map_err(io_err("create abort marker", &abort_path))?;
        marker.sync().map_err(io_err("fsync", &abort_path))
    }

    /// Removes the abort marker: the store shut down cleanly.
    pub(crate) fn mark_clean(&self) -> Result<()> {
        let abort = self.dir.join(ABORT_FILE);
        self.backend
            .remove_file(&abort)
            .map_err(io_err("remove abort marker", &abort))
    }

    /// Flushes consume queues and index, then records in the checkpoint the commit log
    /// offset below which they are durable (`dispatched`: records below it have their
    /// consume-queue and index entries written), in a replicated store also as the confirmed
    /// offset.
    pub(crate) fn flush_logics(
        &self,
        dispatched: &AtomicU64,
        queues: &QueueTable,
        index: &Index,
        commit_log: &CommitLog,
        replicated: bool,
    ) -> Result<()> {
        let _g = self.logics_lock.lock();
        let dispatched = dispatched.load(Ordering::Acquire);
        for cq in queues.all() {
            cq.flush()?;
        }
        index.flush()?;
        let cp = Checkpoint {
            commit_log_flushed: commit_log.flushed(),
            logics_flushed: dispatched,
            clean_end: None,
            queues: None,
            confirmed: replicated.then_some(dispatched),
        };
        self.write(&cp)
    }

    /// Replicated stores, before a cut of the log at `to`: lowers `dispatched` to `to` at
    /// most and writes a checkpoint saying so (durably), serialized with
    /// [`Self::flush_logics`], so that no later checkpoint names a higher confirmed offset
    /// unless records are dispatched again.
    pub(crate) fn lower(
        &self,
        dispatched: &AtomicU64,
        to: u64,
        commit_log_flushed: u64,
    ) -> Result<()> {
        let _g = self.logics_lock.lock();
        dispatched.fetch_min(to, Ordering::AcqRel);
        let d = dispatched.load(Ordering::Acquire);
        let cp = Checkpoint {
            commit_log_flushed: commit_log_flushed.min(to),
            logics_flushed: d,
            clean_end: None,
            queues: None,
            confirmed: Some(d),
        };
        self.write(&cp)
    }

    /// Writes `cp` atomically.
    pub(crate) fn write(&self, cp: &Checkpoint) -> Result<()> {
        let bytes =
            serde_json::to_vec(cp).map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
        write_file_atomically(&*self.backend, &self.dir.join(CHECKPOINT_FILE), &bytes)
    }
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
