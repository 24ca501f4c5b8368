//! The thread that makes a mapped commit-log segment's next pages writable ahead of the
//! appender (Linux), as RocketMQ's `AllocateMappedFileService` prepares its next file.
//!
//! The first store into a page of a shared file mapping faults: the kernel allocates a page cache
//! page, zeroes it, marks it dirty and maps it. Done on the appender's path this costs the append
//! that crosses into a new page (or, with `MADV_POPULATE_WRITE` there, the append that crosses a
//! populate step) tens to hundreds of microseconds, which shows in the sends' tail
//! (docs/benchmarks.md, "Memory-mapped appends"). Here one thread per process takes requests "make
//! pages `from..to` of this map writable" and does them with `MADV_POPULATE_WRITE`, while the
//! appender goes on writing below them.
//!
//! Nothing depends on a request being done: a store into a page not populated yet faults as it
//! would have, and a request dropped because the queue is full is asked again by a later
//! append. A request holds the map (`Arc`), so the mapping stays valid until the request is
//! done even when the appender has moved to the next chunk; pages that went away meanwhile
//! (the segment truncated) make the call fail with `EFAULT`, never a signal, and the failure is
//! ignored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};

use memmap2::{Advice, MmapRaw};

/// Requests waiting at most: one per half-megabyte of appends normally, so a full queue means
/// the thread is far behind, and later appends ask again.
const QUEUE: usize = 64;

/// Bytes populated per system call: the call holds the process's map lock for reading, so a
/// long one would delay other threads' `mmap`/`munmap`/`mprotect` (allocations, the next
/// chunk's map).
const PIECE: usize = 64 << 10;

/// Pages of a map to make writable.
pub(crate) struct Populate {
    /// The map (kept alive by the request).
    pub(crate) map: Arc<MmapRaw>,
    /// File offset of the map's first byte.
    pub(crate) map_start: u64,
    /// File offsets to populate (inside the map).
    pub(crate) from: u64,
    pub(crate) to: u64,
    /// Raised to `to` when done (the file's progress, for tests and reports).
    pub(crate) done: Arc<AtomicU64>,
}

enum Job {
    Populate(Populate),
    /// Answered once every job queued before it is done.
    #[cfg_attr(not(test), allow(dead_code))]
    Barrier(std::sync::mpsc::Sender<()>),
}

/// The process's prefetch thread, started at the first request.
#[derive(Debug)]
pub(crate) struct Prefetcher {
    tx: SyncSender<Job>,
}

impl Prefetcher {
    /// The process-wide prefetcher (`None` if its thread cannot be started; then pages fault
    /// in on the appender's path, as without it).
    pub(crate) fn get() -> Option<&'static Prefetcher> {
        static ONE: OnceLock<Option<Prefetcher>> = OnceLock::new();
        ONE.get_or_init(|| {
            let (tx, rx) = sync_channel(QUEUE);
            match std::thread::Builder::new()
                .name("shoal-prefetch".into())
                .spawn(move || run(rx))
            {
                Ok(_) => Some(Prefetcher { tx }),
                Err(e) => {
                    tracing::warn!(error = %e,
                        "cannot start the commit log's prefetch thread; pages fault in on appends");
                    None
                }
            }
        })
        .as_ref()
    }

    /// Queues `req`; `false` when the queue is full (ask again later).
    pub(crate) fn request(&self, req: Populate) -> bool {
        match self.tx.try_send(Job::Populate(req)) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => false,
            // The thread is gone (it never exits while the sender lives).
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    /// Waits until every request queued before this call is done.
    #[cfg(test)]
    pub(crate) fn barrier(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx
            .send(Job::Barrier(tx))
            .expect("the prefetch thread runs");
        rx.recv().expect("the prefetch thread answers");
    }
}

fn run(rx: Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        match job {
            Job::Populate(p) => populate(&p),
            Job::Barrier(done) => {
                let _ = done.send(());
            }
        }
    }
}

fn populate(p: &Populate) {
    let len = p.map.len() as u64;
    let from = p.from.max(p.map_start) - p.map_start;
    let to = (p.to.max(p.map_start) - p.map_start).min(len);
    let mut at = from;
    while at < to {
        let n = (to - at).min(PIECE as u64);
        // Best effort: refused before Linux 5.14 (the pages then fault in on the stores), and
        // EFAULT for pages a truncation removed.
        if p.map
            .advise_range(Advice::PopulateWrite, at as usize, n as usize)
            .is_err()
        {
            break;
        }
        at += n;
    }
    p.done.fetch_max(p.map_start + at, Ordering::AcqRel);
}
