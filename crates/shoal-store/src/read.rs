//! The read path: pulls (consume queue entries, then the records' bytes from the commit log,
//! corrupt records applied to the [`CorruptRecordPolicy`]), offsets by time, and lookups by
//! physical offset and by key.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use shoal_proto::message::record::{MessageVersion, RecordView, MIN_RECORD_LEN};

use crate::config::CorruptRecordPolicy;
use crate::consume_queue::{ConsumeQueue, CqEntry};
use crate::error::Result;
use crate::store::{Inner, MessageStore};
use crate::types::{BoundaryType, GetMessageResult, GetMessageStatus};
use crate::StoreError;

/// Consume-queue entries scanned at most per pull (RocketMQ scans 16000 bytes of entries).
const MAX_SCAN_ENTRIES: usize = 800;

impl MessageStore {
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
        let cq = inner.queues.get(topic, queue_id, false).ok().flatten();
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
        let bad = inner
            .corrupt
            .find(inner.config.check_crc_on_read, picked, &buf);
        if bad.is_empty() {
            return Ok(buf.freeze());
        }
        inner.corrupt.note_read(&bad, picked, |i| {
            tracing::warn!(
                offset = picked[i].phys_offset,
                %topic,
                queue_id,
                queue_offset = result.queue_offsets[i],
                "commit log record failed its CRC check on read"
            );
        });
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
        self.inner.corrupt.reads()
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
        self.inner.queues.get(topic, queue_id, false).ok().flatten()
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

    /// The first queue offset of (topic, queue id) whose message is at commit-log offset
    /// `phys` or later (binary search on the queue's entries): the queue's max offset when
    /// none is, its min offset when every readable one is. 0 for an unknown queue.
    pub fn offset_at_physical(&self, topic: &str, queue_id: i32, phys: u64) -> Result<u64> {
        let Some(cq) = self.cq(topic, queue_id) else {
            return Ok(0);
        };
        let (mut lo, mut hi) = (cq.min_offset(), cq.max_offset());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let e = cq.get(mid)?.ok_or_else(|| {
                StoreError::InvalidArgument(format!("queue offset {mid} is not stored"))
            })?;
            if e.phys_offset < phys {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    fn entry_store_timestamp(&self, cq: &ConsumeQueue, offset: u64) -> Result<i64> {
        let e = cq.get(offset)?.ok_or_else(|| {
            StoreError::InvalidArgument(format!("queue offset {offset} is not stored"))
        })?;
        self.inner.commit_log.store_timestamp_at(e.phys_offset)
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
}

impl Inner {
    /// The record starting at commit log offset `offset`, if one does.
    fn record_at(&self, offset: u64) -> Result<Option<Bytes>> {
        // A replicated store shows no record above what is dispatched (confirmed).
        let end = if self.config.replicated {
            self.dispatched.load(std::sync::atomic::Ordering::Acquire)
        } else {
            self.commit_log.write_pos()
        };
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

    /// Records of `topic` indexed under `key` (only those whose UNIQ_KEY it is, with
    /// `uniq_only`), stored between `begin` and `end`, newest first, at most `max`.
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
}
