//! Retention: commit log segments whose messages are all older than the retention time are
//! deleted, with the consume-queue entries and index files behind them.

use std::time::Duration;

use crate::commitlog::CommitLog;
use crate::error::Result;
use crate::index::Index;
use crate::queues::QueueTable;
use crate::types::RetentionReport;

/// Deletes the segments of `commit_log` expired at `now_ms` under `retention`, moves the
/// consume queues' min offsets past them and deletes the index files behind them. Segments
/// ending above `dispatched` stay.
pub(crate) fn delete_expired(
    commit_log: &CommitLog,
    queues: &QueueTable,
    index: &Index,
    retention: Duration,
    now_ms: i64,
    dispatched: u64,
) -> Result<RetentionReport> {
    let retention_ms = retention.as_millis() as i64;
    let cutoff = now_ms.saturating_sub(retention_ms);
    let segs = commit_log.segments();
    // Segment i is expired when the first record of segment i+1 (newer than all of
    // segment i, store timestamps being monotonic) is older than the cutoff.
    let mut delete_before = None;
    for pair in segs.windows(2) {
        let next = &pair[1];
        if next.base >= commit_log.write_pos() || next.base > dispatched {
            break;
        }
        match commit_log.store_timestamp_at(next.base) {
            Ok(ts) if ts < cutoff => delete_before = Some(next.base),
            _ => break,
        }
    }
    let mut report = RetentionReport {
        min_commit_log_offset: commit_log.min_offset(),
        ..RetentionReport::default()
    };
    let Some(before) = delete_before else {
        return Ok(report);
    };
    report.deleted_segments = commit_log.delete_segments_before(before)?;
    let cl_min = commit_log.min_offset();
    report.min_commit_log_offset = cl_min;
    for cq in queues.all() {
        cq.correct_min_offset(cl_min)?;
    }
    report.deleted_index_files = index.delete_before(cl_min)?;
    tracing::info!(?report, "retention deleted expired files");
    Ok(report)
}
