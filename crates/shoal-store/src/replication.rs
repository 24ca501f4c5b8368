//! Replication support: the commit log shipped from a master to its replicas byte for byte,
//! and the confirmed offset of a replicated store ([`StoreConfig::replicated`]).
//!
//! A master reads its log in batches of whole records ([`MessageStore::read_log`]); a replica
//! writes them at the same offsets ([`MessageStore::append_replicated`]), so both logs are
//! byte-identical. An end-of-segment blank marker travels as the rest of its segment (its
//! 8-byte header, then zeros), so a batch is as long as the log range it covers; only the
//! header is written to disk, on either side.
//!
//! In a replicated store nothing is dispatched (consume-queue and index entries, arrival
//! listeners) above the confirmed offset: puts and replicated appends only write the commit
//! log and note the queue offsets they used ([`ConsumeQueue::note_assigned`], so puts keep
//! numbering each queue after the records that wait). [`MessageStore::set_confirmed`] raises
//! the offset, and whoever raises it (or appends) dispatches the waiting records in order by
//! reading them back from the commit log, at most [`DISPATCH_CHUNK`] bytes at a time; a thread
//! that finds another one dispatching leaves the work to it (the holder looks again before
//! it lets go). The dispatched offset (a record boundary at or below the confirmed offset) is
//! what the checkpoint persists as the confirmed offset: recovery dispatches up to it only.
//!
//! [`ConsumeQueue::note_assigned`]: crate::consume_queue::ConsumeQueue::note_assigned

use std::sync::atomic::Ordering;

use bytes::Bytes;
use shoal_proto::message::record::{MessageVersion, RecordView, MIN_RECORD_LEN};

use crate::commitlog::{BLANK_MAGIC_CODE, END_OF_SEGMENT_MIN_BLANK};
use crate::consume_queue::CqEntry;
use crate::error::Result;
use crate::record::{index_keys, validate_topic, TORN_PROPERTIES_END};
use crate::store::{Inner, MessageStore};
use crate::types::MessageArrival;
use crate::StoreError;

/// Most commit-log bytes one dispatch round reads (a larger record is read whole).
pub(crate) const DISPATCH_CHUNK: usize = 1 << 20;

/// The header of the unit at some commit-log offset.
enum Unit {
    /// A record of this many bytes.
    Record(u64),
    /// An end-of-segment blank marker (its 8 bytes are all that is stored).
    Blank,
}

/// Reads the 8-byte header at `pos` (`left`: bytes left in its segment).
fn unit_at(head: &[u8], pos: u64, left: u64) -> std::result::Result<Unit, String> {
    let word = |i: usize| -> Option<u32> {
        Some(u32::from_be_bytes(head.get(i..i + 4)?.try_into().ok()?))
    };
    let (Some(size), Some(magic)) = (word(0), word(4)) else {
        return Err(format!("torn header at {pos}"));
    };
    if magic == BLANK_MAGIC_CODE {
        if u64::from(size) != left {
            return Err(format!(
                "blank marker at {pos} says {size} bytes, its segment has {left} left"
            ));
        }
        return Ok(Unit::Blank);
    }
    if MessageVersion::from_magic_code(magic).is_none() {
        return Err(format!("no record starts at {pos} (magic code {magic:#x})"));
    }
    let size = u64::from(size);
    if size < MIN_RECORD_LEN as u64 || size + END_OF_SEGMENT_MIN_BLANK > left {
        return Err(format!(
            "record at {pos} has size {size}, which does not fit its segment"
        ));
    }
    Ok(Unit::Record(size))
}

impl MessageStore {
    /// Commit-log bytes from `start` for a replica: whole records only (an end-of-segment
    /// blank marker is one unit that fills the rest of its segment: its 8-byte header, then
    /// zeros; it ends the batch), at most `max_bytes` but at least one whole unit, never past
    /// the write position, never past the end of the segment holding `start`. The bytes are
    /// as long as the log range they cover. Empty when `start` is the write position.
    ///
    /// Errors: [`StoreError::LogOffsetGone`] below the commit log's min offset;
    /// [`StoreError::InvalidArgument`] above the write position or not at a record boundary.
    pub fn read_log(&self, start: u64, max_bytes: usize) -> Result<Bytes> {
        let inner = &*self.inner;
        let min = inner.commit_log.min_offset();
        let end = inner.commit_log.write_pos();
        if start < min {
            return Err(StoreError::LogOffsetGone { offset: start, min });
        }
        if start > end {
            return Err(StoreError::InvalidArgument(format!(
                "commit log offset {start} is past the write position {end}"
            )));
        }
        let (bytes, padding) = inner
            .read_units_counting(start, end, max_bytes, true)
            .map_err(|e| match e {
                StoreError::Corrupt { reason, .. } => StoreError::InvalidArgument(format!(
                    "commit log offset {start} is not a record boundary: {reason}"
                )),
                e => e,
            })?;
        if bytes.is_empty() && start < end {
            return Err(StoreError::InvalidArgument(format!(
                "commit log offset {start} is not a record boundary (nothing starts there)"
            )));
        }
        // The first unit's own position field, when it is a record.
        if bytes.len() > END_OF_SEGMENT_MIN_BLANK as usize {
            let view = RecordView::parse(&bytes)?;
            if view.physical_offset() != start as i64 {
                return Err(StoreError::InvalidArgument(format!(
                    "commit log offset {start} is not a record boundary (the bytes there say {})",
                    view.physical_offset()
                )));
            }
        }
        if padding == 0 {
            return Ok(bytes);
        }
        // The blank marker travels as long as the log range it takes.
        let mut out = bytes::BytesMut::with_capacity(bytes.len() + padding as usize);
        out.extend_from_slice(&bytes);
        out.resize(bytes.len() + padding as usize, 0);
        Ok(out.freeze())
    }

    /// A replica appends commit-log bytes from its master (see [`Self::read_log`]) at
    /// `start`, which must be the write position. Every record must be where its
    /// physical-offset field says, with a valid topic and a body CRC that checks; a blank
    /// marker must fill exactly to its segment's end, zeros after its header (as
    /// [`Self::read_log`] ships it; only the header is stored), and may be followed by the
    /// next segment's records. Bad input: [`StoreError::InvalidLogBytes`], nothing written.
    /// The bytes are durable (fsynced) when this returns; the queues' numbering counts their
    /// records, and what is now below the confirmed offset is dispatched. Returns the new
    /// write position.
    pub fn append_replicated(&self, start: u64, bytes: &[u8]) -> Result<u64> {
        let inner = &*self.inner;
        let seg_size = inner.commit_log.segment_size();
        let bad = |offset: u64, reason: String| StoreError::InvalidLogBytes { offset, reason };
        let mut w = inner.lock_writer();
        if let Some(reason) = &w.failed {
            return Err(StoreError::WriteFailed(reason.clone()));
        }
        if inner.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        let write_pos = inner.commit_log.write_pos();
        if start != write_pos {
            return Err(bad(
                start,
                format!("the batch starts at {start}, the log ends at {write_pos}"),
            ));
        }
        // Check everything first: (commit-log position, bytes) per segment, and per record
        // its queue and queue offset.
        let mut pieces: Vec<(u64, &[u8])> = Vec::new();
        let mut queues: Vec<(&str, i32, u64)> = Vec::new();
        let mut newest_ts = 0i64;
        let (mut at, mut pos, mut piece_at, mut piece_pos) = (0usize, start, 0usize, start);
        while at < bytes.len() {
            let left = seg_size - pos % seg_size;
            let head = bytes.get(at..at + 8).unwrap_or(&bytes[at..]);
            match unit_at(head, pos, left).map_err(|r| bad(pos, r))? {
                Unit::Blank => {
                    let unit = bytes.get(at..at + left as usize).ok_or_else(|| {
                        bad(
                            pos,
                            format!(
                                "the blank marker must fill the {left} bytes left in its segment, {} given",
                                bytes.len() - at
                            ),
                        )
                    })?;
                    if unit[END_OF_SEGMENT_MIN_BLANK as usize..]
                        .iter()
                        .any(|b| *b != 0)
                    {
                        return Err(bad(pos, "the blank marker's padding is not zeros".into()));
                    }
                    // Only the marker's header is stored, as at the master.
                    let header_end = at + END_OF_SEGMENT_MIN_BLANK as usize;
                    pieces.push((piece_pos, &bytes[piece_at..header_end]));
                    at += left as usize;
                    pos += left;
                    (piece_at, piece_pos) = (at, pos);
                }
                Unit::Record(size) => {
                    let rec = bytes
                        .get(at..at + size as usize)
                        .ok_or_else(|| bad(pos, format!("record of {size} bytes is torn")))?;
                    let view = RecordView::parse(rec).map_err(|e| bad(pos, e.to_string()))?;
                    if view.physical_offset() != pos as i64 {
                        return Err(bad(
                            pos,
                            format!("the record says it is at {}", view.physical_offset()),
                        ));
                    }
                    validate_topic(view.topic()).map_err(|e| bad(pos, e.to_string()))?;
                    if view.queue_id() < 0 || view.queue_offset() < 0 {
                        return Err(bad(pos, "negative queue id or queue offset".into()));
                    }
                    if view.verify_crc().is_err()
                        || view.properties_str().ends_with(TORN_PROPERTIES_END)
                    {
                        return Err(bad(pos, "the record fails its CRC check".into()));
                    }
                    newest_ts = newest_ts.max(view.store_timestamp());
                    queues.push((view.topic(), view.queue_id(), view.queue_offset() as u64));
                    at += size as usize;
                    pos += size;
                }
            }
        }
        if piece_at < bytes.len() {
            pieces.push((piece_pos, &bytes[piece_at..]));
        }
        if pieces.is_empty() {
            return Ok(write_pos);
        }
        if let Err(e) = inner.commit_log.append_raw(&pieces, pos) {
            if inner.commit_log.write_pos() != write_pos {
                // Written but not durable: nothing more goes on top of it.
                w.failed = Some(format!("replicated append failed: {e}"));
                inner.write_failed.store(true, Ordering::Release);
            }
            return Err(e);
        }
        w.last_store_timestamp = w.last_store_timestamp.max(newest_ts);
        for (topic, queue_id, offset) in queues {
            if let Some(cq) = inner.queues.get(topic, queue_id, true)? {
                cq.note_assigned(offset + 1);
            }
        }
        if !inner.config.replicated {
            // Visible at once, as after a put (dispatched under the writer's lock, as puts are).
            let _d = inner.dispatch_lock.lock();
            inner.dispatch_to(pos)?;
            return Ok(pos);
        }
        drop(w);
        inner.dispatch_confirmed();
        Ok(pos)
    }

    /// Cuts the log at `end` (a record boundary at or below the write position), durably:
    /// the confirmed offset is lowered to `end` at most (and persisted first), the
    /// consume-queue and index entries of records at or above `end` go (dispatched or not),
    /// then the commit-log bytes; the queues' numbering is recomputed from what stays.
    /// Errors: [`StoreError::LogOffsetGone`] below the min offset, [`StoreError::InvalidArgument`]
    /// past the write position or not at a record boundary.
    pub fn truncate_log(&self, end: u64) -> Result<()> {
        let inner = &*self.inner;
        let mut w = inner.lock_writer();
        let _d = inner.dispatch_lock.lock();
        if let Some(reason) = &w.failed {
            return Err(StoreError::WriteFailed(reason.clone()));
        }
        let min = inner.commit_log.min_offset();
        let write_pos = inner.commit_log.write_pos();
        if end < min {
            return Err(StoreError::LogOffsetGone { offset: end, min });
        }
        if end > write_pos {
            return Err(StoreError::InvalidArgument(format!(
                "cannot truncate the log at {end}: it ends at {write_pos}"
            )));
        }
        if end == write_pos && inner.dispatched.load(Ordering::Acquire) <= end {
            inner.confirmed.fetch_min(end, Ordering::AcqRel);
            return Ok(());
        }
        let seg_size = inner.commit_log.segment_size();
        if end < write_pos && end % seg_size != 0 {
            // A record boundary: a blank marker, or a record that says it is there.
            inner
                .read_units(end, write_pos, 1)
                .and_then(|b| match b.len() as u64 {
                    END_OF_SEGMENT_MIN_BLANK => Ok(()),
                    _ => RecordView::parse(&b)
                        .ok()
                        .filter(|v| v.physical_offset() == end as i64)
                        .map(|_| ())
                        .ok_or_else(|| StoreError::InvalidArgument(String::new())),
                })
                .map_err(|_| {
                    StoreError::InvalidArgument(format!(
                        "cannot truncate the log at {end}: not a record boundary"
                    ))
                })?;
        }
        inner.confirmed.fetch_min(end, Ordering::AcqRel);
        inner
            .checkpoints()
            .lower(&inner.dispatched, end, inner.commit_log.flushed())?;
        let cut = || -> Result<()> {
            for cq in inner.queues.all() {
                cq.truncate_phys(end)?;
                cq.clear_assigned();
            }
            inner.index.truncate(end)?;
            inner.commit_log.truncate_to(end)?;
            inner.corrupt.forget_from(end);
            // The records still waiting for their dispatch number their queues again.
            let from = inner.dispatched.load(Ordering::Acquire);
            inner.note_waiting(from, end)
        };
        cut().inspect_err(|e| {
            // Half cut: nothing more is appended until a reopen recovers (and cuts again).
            w.failed = Some(format!("truncation of the log at {end} failed: {e}"));
            inner.write_failed.store(true, Ordering::Release);
        })
    }

    /// A replica too far behind its master: empties the commit log, the consume queues and
    /// the index, and starts the log afresh at `base` (a segment start: the master's min
    /// offset), so that `append_replicated(base, ..)` comes next. Consumer offsets and delay
    /// offsets stay. Each queue then starts at the queue offset of its first record appended.
    /// The confirmed offset becomes `base`. A crash part-way may leave old segments below
    /// `base`; calling this again removes them.
    pub fn restart_log_at(&self, base: u64) -> Result<()> {
        let inner = &*self.inner;
        let seg_size = inner.commit_log.segment_size();
        if base % seg_size != 0 {
            return Err(StoreError::InvalidArgument(format!(
                "the log can restart only at a segment start, not at {base}"
            )));
        }
        let mut w = inner.lock_writer();
        let _d = inner.dispatch_lock.lock();
        if let Some(reason) = &w.failed {
            return Err(StoreError::WriteFailed(reason.clone()));
        }
        // Nothing of the old log stays visible after a crash from here on.
        inner.dispatched.store(base, Ordering::Release);
        inner.confirmed.store(base, Ordering::Release);
        inner.checkpoints().lower(&inner.dispatched, base, base)?;
        let reset = || -> Result<()> {
            for topic in inner.queues.topics() {
                inner.queues.remove_topic(&topic)?;
            }
            inner.index.clear()?;
            inner.commit_log.reset_to(base)?;
            inner.corrupt.forget_from(0);
            Ok(())
        };
        reset().inspect_err(|e| {
            w.failed = Some(format!("restarting the log at {base} failed: {e}"));
            inner.write_failed.store(true, Ordering::Release);
        })
    }

    /// Replicated stores: records ending at or below `offset` become visible (dispatched,
    /// arrival listeners told), on this thread unless another one is dispatching (which then
    /// takes them too). Never moves back (a lower value is ignored; see
    /// [`Self::truncate_log`]). `offset` should be a record boundary of the group's log. A
    /// no-op in an unreplicated store. Cheap when nothing becomes visible; otherwise the
    /// calling thread reads the newly visible records back from the commit log (1 MiB at a
    /// time) and writes their consume-queue and index entries, so its time grows with what it
    /// makes visible: call it where a short blocking read is acceptable.
    pub fn set_confirmed(&self, offset: u64) {
        let inner = &*self.inner;
        if !inner.config.replicated {
            return;
        }
        let before = inner.confirmed.fetch_max(offset, Ordering::AcqRel);
        if offset > before {
            inner.dispatch_confirmed();
        }
    }

    /// The confirmed offset (replicated stores; it may be past the write position when the
    /// group confirmed more than this store holds yet), or the write position.
    pub fn confirmed(&self) -> u64 {
        let inner = &*self.inner;
        if inner.config.replicated {
            inner.confirmed.load(Ordering::Acquire)
        } else {
            inner.commit_log.write_pos()
        }
    }

    /// Records below this commit-log offset are visible to reads (dispatched); in an
    /// unreplicated store, the write position.
    pub fn dispatched_offset(&self) -> u64 {
        self.inner.dispatched.load(Ordering::Acquire)
    }
}

impl Inner {
    /// Whole units from `start` (records, or a blank marker which ends the answer), ending at
    /// or below `limit` and inside the segment of `start`, at most `max_bytes` but at least
    /// one unit when one fits below `limit`. [`StoreError::Corrupt`] when the bytes at a
    /// position are not a unit.
    pub(crate) fn read_units(&self, start: u64, limit: u64, max_bytes: usize) -> Result<Bytes> {
        Ok(self.read_units_counting(start, limit, max_bytes, false)?.0)
    }

    /// [`Self::read_units`]; with `blank_is_whole`, a blank marker counts against
    /// `max_bytes` as the bytes left in its segment (what [`MessageStore::read_log`] ships).
    /// Also says how many bytes the blank marker ending the answer leaves in its segment
    /// after its header (0 without one).
    fn read_units_counting(
        &self,
        start: u64,
        limit: u64,
        max_bytes: usize,
        blank_is_whole: bool,
    ) -> Result<(Bytes, u64)> {
        let cl = &self.commit_log;
        let seg_size = cl.segment_size();
        let seg_end = start - start % seg_size + seg_size;
        let Some(seg) = cl.segment_for(start) else {
            return Ok((Bytes::new(), 0));
        };
        // The blank marker's segment is only as long as the marker's end.
        let data_end = seg.base
            + seg
                .file
                .len()
                .map_err(crate::error::io_err("stat segment", &seg.path))?;
        let hard = limit.min(seg_end).min(data_end);
        if start >= hard {
            return Ok((Bytes::new(), 0));
        }
        let corrupt = |reason: String| StoreError::Corrupt {
            path: seg.path.clone(),
            reason,
        };
        let want = (max_bytes as u64)
            .max(END_OF_SEGMENT_MIN_BLANK)
            .min(hard - start);
        let mut buf = cl.read(start, want as usize)?;
        let mut at = 0usize;
        let mut padding = 0;
        loop {
            let pos = start + at as u64;
            if pos + END_OF_SEGMENT_MIN_BLANK > hard {
                break;
            }
            let head = match buf.get(at..at + 8) {
                Some(h) => h,
                None if at == 0 => {
                    buf = cl.read(start, 8)?;
                    &buf[..]
                }
                None => break,
            };
            match unit_at(head, pos, seg_end - pos).map_err(corrupt)? {
                Unit::Blank => {
                    let counted = if blank_is_whole {
                        seg_end - pos
                    } else {
                        END_OF_SEGMENT_MIN_BLANK
                    };
                    let over = at > 0 && at as u64 + counted > max_bytes as u64;
                    if seg_end <= limit && !over {
                        at += END_OF_SEGMENT_MIN_BLANK as usize;
                        padding = seg_end - pos - END_OF_SEGMENT_MIN_BLANK;
                    }
                    break;
                }
                Unit::Record(size) => {
                    if pos + size > limit || (at > 0 && at as u64 + size > max_bytes as u64) {
                        break;
                    }
                    if at as u64 + size > buf.len() as u64 {
                        if at > 0 {
                            break;
                        }
                        // A first record larger than asked for: read whole.
                        buf = cl.read(start, size as usize)?;
                    }
                    at += size as usize;
                }
            }
        }
        Ok((buf.slice(..at), padding))
    }

    /// Replicated stores: dispatches the records ending at or below the confirmed offset
    /// (and the write position), unless another thread is dispatching: the holder looks
    /// again after letting go, so nothing confirmed is left waiting. A failure marks the
    /// store failed (as a failed dispatch after a put does).
    pub(crate) fn dispatch_confirmed(&self) {
        loop {
            let target = self.dispatch_target();
            if self.dispatched.load(Ordering::Acquire) >= target {
                return;
            }
            let Some(guard) = self.dispatch_lock.try_lock() else {
                return;
            };
            let result = self.dispatch_to(target);
            drop(guard);
            match result {
                Err(e) => {
                    tracing::error!(error = %e, "dispatch of confirmed records failed");
                    let mut w = self.lock_writer();
                    w.failed = Some(format!("dispatch of confirmed records failed: {e}"));
                    self.write_failed.store(true, Ordering::Release);
                    return;
                }
                // Nothing more can go (the target ends inside a record): done unless it moved.
                Ok(false) if self.dispatch_target() == target => return,
                Ok(_) => {}
            }
        }
    }

    fn dispatch_target(&self) -> u64 {
        self.confirmed
            .load(Ordering::Acquire)
            .min(self.commit_log.write_pos())
    }

    /// Dispatches every whole record from the dispatched offset up to `target` (the
    /// dispatch lock held). Returns whether it moved.
    fn dispatch_to(&self, target: u64) -> Result<bool> {
        let seg_size = self.commit_log.segment_size();
        let mut pos = self.dispatched.load(Ordering::Acquire);
        let mut moved = false;
        let mut arrivals: Vec<(String, i32, u64, i64, i64)> = Vec::new();
        while pos < target {
            let chunk = self.read_units(pos, target, DISPATCH_CHUNK)?;
            if chunk.is_empty() {
                break;
            }
            let mut at = 0usize;
            while at < chunk.len() {
                let rec = &chunk[at..];
                let head = u32::from_be_bytes([rec[4], rec[5], rec[6], rec[7]]);
                if head == BLANK_MAGIC_CODE {
                    pos = pos - pos % seg_size + seg_size;
                    break;
                }
                let view = RecordView::parse(rec)?;
                let size = view.total_size() as u64;
                self.dispatch_record(&view, pos, &mut arrivals)?;
                at += size as usize;
                pos += size;
            }
            self.dispatched.store(pos, Ordering::Release);
            moved = true;
            self.notify_dispatched(&mut arrivals);
        }
        Ok(moved)
    }

    /// The consume-queue and index entries of one record at `phys`.
    fn dispatch_record(
        &self,
        view: &RecordView<'_>,
        phys: u64,
        arrivals: &mut Vec<(String, i32, u64, i64, i64)>,
    ) -> Result<()> {
        let (topic, queue_id) = (view.topic(), view.queue_id());
        let q = view.queue_offset() as u64;
        let cq = self
            .queues
            .get(topic, queue_id, true)?
            .ok_or_else(|| StoreError::InvalidArgument("queue not created".into()))?;
        let max = cq.max_offset();
        if q < max {
            tracing::warn!(%topic, queue_id, queue_offset = q, max, phys,
                "record already dispatched; skipped");
            return Ok(());
        }
        if q > max {
            if cq.min_offset() != max {
                return Err(StoreError::Corrupt {
                    path: self.config.data_dir.clone(),
                    reason: format!(
                        "record at {phys} has queue offset {q} in {topic}/{queue_id}, whose next is {max}"
                    ),
                });
            }
            // An empty queue (a restarted log): it starts at this record.
            cq.reset_to(q)?;
        }
        let ts = view.store_timestamp();
        cq.append(&[CqEntry {
            phys_offset: phys,
            size: view.total_size() as u32,
            tag_code: view.tags_code(),
        }])?;
        for key in index_keys(view.properties_str()) {
            self.index.put(topic, key, phys, ts)?;
        }
        arrivals.push((topic.to_string(), queue_id, q, view.tags_code(), ts));
        Ok(())
    }

    /// Tells the arrival listeners of dispatched records (and empties the list).
    fn notify_dispatched(&self, arrivals: &mut Vec<(String, i32, u64, i64, i64)>) {
        let listeners = self.listeners.read();
        for (topic, queue_id, queue_offset, tag_code, store_timestamp) in arrivals.drain(..) {
            let arrival = MessageArrival {
                topic: &topic,
                queue_id,
                queue_offset,
                tag_code,
                store_timestamp,
            };
            for l in listeners.iter() {
                l(&arrival);
            }
        }
    }

    /// Notes the queue offsets of the records in `[from, end)` (waiting for their dispatch),
    /// reading them from the commit log.
    fn note_waiting(&self, from: u64, end: u64) -> Result<()> {
        let seg_size = self.commit_log.segment_size();
        let mut pos = from;
        while pos < end {
            let chunk = self.read_units(pos, end, DISPATCH_CHUNK)?;
            if chunk.is_empty() {
                break;
            }
            let mut at = 0usize;
            while at < chunk.len() {
                let rec = &chunk[at..];
                if u32::from_be_bytes([rec[4], rec[5], rec[6], rec[7]]) == BLANK_MAGIC_CODE {
                    pos = pos - pos % seg_size + seg_size;
                    break;
                }
                let view = RecordView::parse(rec)?;
                if let Some(cq) = self.queues.get(view.topic(), view.queue_id(), true)? {
                    cq.note_assigned(view.queue_offset() as u64 + 1);
                }
                at += view.total_size() as usize;
                pos += view.total_size() as u64;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemBackend;
    use crate::types::MessageExtBrokerInner;
    use std::path::PathBuf;
    use std::sync::Arc;

    fn store(replicated: bool) -> MessageStore {
        let be = MemBackend::new();
        let mut c = crate::StoreConfig::new(PathBuf::from("/data"));
        c.backend = Arc::new(be);
        c.commit_log_segment_size = 4096;
        c.max_message_size = 2048;
        c.background_threads = false;
        c.replicated = replicated;
        MessageStore::open(c).unwrap().0
    }

    fn msg(i: usize) -> MessageExtBrokerInner {
        MessageExtBrokerInner {
            topic: "T".into(),
            queue_id: (i % 2) as i32,
            flag: 0,
            sys_flag: 0,
            born_timestamp: 1,
            born_host: "127.0.0.1:1".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: bytes::Bytes::from(vec![b'a' + (i % 26) as u8; 300 + i]),
            properties: format!("KEYS\u{1}k{i}\u{2}"),
            known: None,
        }
    }

    #[test]
    fn unit_headers() {
        let blank = |size: u32| {
            let mut h = size.to_be_bytes().to_vec();
            h.extend_from_slice(&BLANK_MAGIC_CODE.to_be_bytes());
            h
        };
        assert!(matches!(unit_at(&blank(100), 3996, 100), Ok(Unit::Blank)));
        assert!(unit_at(&blank(100), 3996, 108).is_err());
        assert!(unit_at(&blank(100)[..6], 3996, 100).is_err());
        let mut rec = 200u32.to_be_bytes().to_vec();
        rec.extend_from_slice(&MessageVersion::V1.magic_code().to_be_bytes());
        assert!(matches!(unit_at(&rec, 0, 4096), Ok(Unit::Record(200))));
        // A record must leave room for a blank marker after it.
        assert!(unit_at(&rec, 3896, 200).is_err());
        assert!(unit_at(&rec, 3888, 208).is_ok());
        let mut small = 20u32.to_be_bytes().to_vec();
        small.extend_from_slice(&MessageVersion::V1.magic_code().to_be_bytes());
        assert!(unit_at(&small, 0, 4096).is_err());
        assert!(unit_at(&[0u8; 8], 0, 4096).is_err());
    }

    #[test]
    fn read_units_gives_whole_records_inside_one_segment() {
        let s = store(true);
        let mut ends = Vec::new();
        for i in 0..30 {
            let r = s.put_message(&msg(i)).unwrap();
            ends.push(r.messages[0].physical_offset + u64::from(r.messages[0].size));
        }
        let inner = &*s.inner;
        let end = inner.commit_log.write_pos();
        // At least one record even when asked for one byte.
        let one = inner.read_units(0, end, 1).unwrap();
        assert_eq!(one.len() as u64, ends[0]);
        // Never past the limit, only whole records.
        let some = inner.read_units(0, ends[3] + 10, 1 << 20).unwrap();
        assert_eq!(some.len() as u64, ends[3]);
        // The first segment ends with its blank marker (8 bytes, the last unit).
        let first_seg = inner.read_units(0, end, 1 << 20).unwrap();
        let n = first_seg.len();
        assert_eq!(
            u32::from_be_bytes(first_seg[n - 4..].try_into().unwrap()),
            BLANK_MAGIC_CODE
        );
        let marker_at = (n - 8) as u64;
        assert!(ends.contains(&marker_at));
        // The marker alone; nothing but the marker is a unit there.
        assert_eq!(inner.read_units(marker_at, end, 1).unwrap().len(), 8);
        // A limit inside the marker's segment tail: the marker is not whole below it.
        assert!(inner.read_units(marker_at, 4000, 100).unwrap().is_empty());
        // Not a boundary.
        assert!(inner.read_units(5, end, 100).is_err());
        // Dispatch of the confirmed part only; arrivals only for dispatched records.
        s.set_confirmed(ends[9] + 1);
        assert_eq!(s.dispatched_offset(), ends[9]);
        assert_eq!(s.max_offset("T", 0) + s.max_offset("T", 1), 10);
        s.set_confirmed(u64::MAX);
        assert_eq!(s.dispatched_offset(), end);
        assert_eq!(s.max_offset("T", 0) + s.max_offset("T", 1), 30);
        assert_eq!(
            s.query_by_key("T", "k29", 10, 0, i64::MAX).unwrap().len(),
            1
        );
    }

    #[test]
    fn unreplicated_store_dispatches_replicated_appends_at_once() {
        let (m, r) = (store(false), store(false));
        for i in 0..12 {
            m.put_message(&msg(i)).unwrap();
        }
        let bytes = m.read_log(0, 1 << 20).unwrap();
        let end = r.append_replicated(0, &bytes).unwrap();
        // Up to the end of the first segment (its blank marker is the last unit).
        assert_eq!(end, 4096);
        assert_eq!(r.confirmed(), end);
        assert!(r.max_offset("T", 0) > 0);
        while r.commit_log_max_offset() < m.commit_log_max_offset() {
            let at = r.commit_log_max_offset();
            r.append_replicated(at, &m.read_log(at, 1 << 20).unwrap())
                .unwrap();
        }
        assert_eq!(r.max_offset("T", 0), m.max_offset("T", 0));
        let next = r.put_message(&msg(0)).unwrap();
        assert_eq!(next.messages[0].queue_offset, m.max_offset("T", 0));
    }
}
