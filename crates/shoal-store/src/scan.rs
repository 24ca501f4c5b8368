//! The recovery scan: reads the commit log through from a point, checks every record (magic,
//! size, CRC, its own position) and finds where the valid data ends.

use std::sync::Arc;

use shoal_proto::message::record::{RecordView, BLANK_MAGIC_CODE, MIN_RECORD_LEN};

use crate::backend::StoreFile;
use crate::commitlog::CommitLog;
use crate::consume_queue::CqEntry;
use crate::error::{io_err, Result};
use crate::record::{index_keys, validate_topic, TORN_PROPERTIES_END};

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
pub(crate) struct ScannedRecord {
    pub(crate) phys: u64,
    pub(crate) size: u32,
    pub(crate) topic: String,
    pub(crate) queue_id: i32,
    pub(crate) queue_offset: i64,
    pub(crate) tag_code: i64,
    pub(crate) store_timestamp: i64,
    pub(crate) keys: Vec<String>,
}

impl ScannedRecord {
    pub(crate) fn cq_entry(&self) -> CqEntry {
        CqEntry {
            phys_offset: self.phys,
            size: self.size,
            tag_code: self.tag_code,
        }
    }
}

/// Outcome of a recovery scan.
pub(crate) struct ScanOutcome {
    /// End of the valid data.
    pub(crate) end: u64,
    /// Why the scan stopped, if it stopped on bad data.
    pub(crate) reason: Option<String>,
    /// Records validated.
    pub(crate) checked: u64,
    /// Store timestamp of the last valid record (0 if none).
    pub(crate) last_store_timestamp: i64,
    /// Records with intact framing and a failed body CRC, followed by valid records (kept).
    pub(crate) corrupt: Vec<u64>,
    /// Zeros from the end of the last record to the end of the last segment's file: space
    /// reserved ahead of memory-mapped appends, not data.
    pub(crate) free_tail: u64,
}

/// Scans the commit log from `from`, validating records; hands those at or above
/// `collect_from` to `sink`. A record whose framing is intact (size, magic, field lengths, its
/// own position) but whose body CRC fails is kept in its place (reported in `corrupt`) when a
/// valid record follows it; at the tail it is a torn write and ends the log.
pub(crate) fn scan_commit_log(
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
