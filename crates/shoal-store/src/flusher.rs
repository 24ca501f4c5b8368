//! What the background threads and sync flush wait on: the stop signal of the flusher and
//! group commit threads, and the group commit of sync flush (one fsync for every append
//! waiting).

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::commitlog::CommitLog;
use crate::error::StoreError;
use crate::types::FlushStatus;

/// Tells the background threads to stop; they sleep on it between rounds.
#[derive(Default)]
pub(crate) struct StopSignal {
    stopped: Mutex<bool>,
    cv: Condvar,
}

impl StopSignal {
    /// Stops the threads, waking those asleep.
    pub(crate) fn raise(&self) {
        *self.stopped.lock() = true;
        self.cv.notify_all();
    }

    /// Whether the threads must stop.
    pub(crate) fn is_raised(&self) -> bool {
        *self.stopped.lock()
    }

    /// Sleeps for `interval` unless the signal is raised meanwhile; true when it is raised
    /// (before or after the sleep).
    pub(crate) fn sleep(&self, interval: Duration) -> bool {
        let mut stopped = self.stopped.lock();
        if *stopped {
            return true;
        }
        let _ = self.cv.wait_for(&mut stopped, interval);
        *stopped
    }
}

/// Sync flush with group commit: the first waiter fsyncs everything written so far, the
/// others wait for it.
#[derive(Default)]
pub(crate) struct GroupCommit {
    /// Whether a waiter is fsyncing now.
    flushing: Mutex<bool>,
    cv: Condvar,
}

impl GroupCommit {
    /// Waits until the commit log is durable up to `end` (fsyncing it if nobody is), at most
    /// `timeout`. `failed` says whether the writer failed already; `on_failure` is told of an
    /// fsync that failed (the lock is not held then, nor during the fsync).
    pub(crate) fn wait_durable(
        &self,
        commit_log: &CommitLog,
        end: u64,
        timeout: Duration,
        failed: impl Fn() -> bool,
        on_failure: impl FnOnce(&StoreError),
    ) -> FlushStatus {
        let deadline = Instant::now() + timeout;
        let mut flushing = self.flushing.lock();
        loop {
            if commit_log.flushed() >= end {
                return FlushStatus::Flushed;
            }
            if failed() {
                return FlushStatus::FlushFailed;
            }
            if !*flushing {
                *flushing = true;
                drop(flushing);
                let r = commit_log.flush();
                flushing = self.flushing.lock();
                *flushing = false;
                self.cv.notify_all();
                if let Err(e) = r {
                    tracing::error!(error = %e, "sync flush failed");
                    // Not under the group commit lock: letting go of the writer appends what
                    // was queued meanwhile (which then fails), and that may wait here.
                    drop(flushing);
                    on_failure(&e);
                    return FlushStatus::FlushFailed;
                }
                continue;
            }
            if self.cv.wait_until(&mut flushing, deadline).timed_out() {
                return if commit_log.flushed() >= end {
                    FlushStatus::Flushed
                } else {
                    FlushStatus::FlushTimeout
                };
            }
        }
    }
}
