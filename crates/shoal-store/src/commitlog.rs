//! The commit log: all topics' records appended to fixed-size segment files.
//!
//! Segment files are named by their start offset (20 digits, zero padded, as RocketMQ) and
//! hold records back to back. A record never straddles two segments: when a record (plus the
//! 8 bytes always kept free at a segment's end) does not fit in the rest of the current
//! segment, an 8-byte end-of-segment blank marker (`TOTALSIZE` = bytes left in the segment,
//! `MAGICCODE` = 0xCBD43194) is written and the record goes at the start of the next segment.
//!
//! Segments are opened with [`Backend::open_segment`]. Without memory-mapped appends a segment
//! file is only as long as the bytes written to it. With them (the default on Linux), the
//! segment being written reserves space ahead of its writes, so its file is longer on disk than
//! its data (zeros, less than one chunk); [`StoreFile::len`] is still the bytes written while
//! it is open, and the zeros are given back ([`StoreFile::seal`]) when the writer moves on to
//! the next segment and at shutdown. After a crash the zeros are on disk: recovery reads the
//! last segment's records up to the first zero header and, when only zeros follow to the end
//! of the file, treats them as free space (see `scan.rs`), then truncates the file there.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::RwLock;
use shoal_proto::message::record::store_timestamp_pos;

use crate::backend::{Backend, SegmentOptions, StoreFile};
use crate::error::{io_err, Result};
use crate::StoreError;

pub use shoal_proto::message::BLANK_MAGIC_CODE;
/// Bytes always kept free at the end of a segment for the blank marker.
pub const END_OF_SEGMENT_MIN_BLANK: u64 = 8;

/// One segment file.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) base: u64,
    pub(crate) file: Arc<dyn StoreFile>,
    pub(crate) path: PathBuf,
}

/// Name of a segment (or consume-queue / index file) starting at `offset`.
pub(crate) fn file_name(offset: u64) -> String {
    format!("{offset:020}")
}

/// Parses a 20-digit file name.
pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    if name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()) {
        name.parse().ok()
    } else {
        None
    }
}

/// The commit log.
#[derive(Debug)]
pub(crate) struct CommitLog {
    backend: Arc<dyn Backend>,
    dir: PathBuf,
    segment_size: u64,
    /// How segment files are opened (memory-mapped appends or not).
    seg_opts: SegmentOptions,
    segments: RwLock<Vec<Arc<Segment>>>,
    /// Offset where the next record goes; everything below is written and readable.
    write_pos: AtomicU64,
    /// Everything below is durable.
    flushed: AtomicU64,
    /// Time of each fsync round (exported by the broker).
    pub(crate) flush_latency: shoal_metrics::LatencyHistogram,
}

impl CommitLog {
    /// Opens the segment files under `dir` (nothing is validated here; see recovery).
    /// `mmap_chunk`: append through memory maps of this many bytes reserved at a time (where
    /// the backend can), or `None` for one positional write per append.
    pub(crate) fn open(
        backend: Arc<dyn Backend>,
        dir: PathBuf,
        segment_size: u64,
        mmap_chunk: Option<u64>,
    ) -> Result<Self> {
        let seg_opts = SegmentOptions {
            max_len: segment_size,
            mmap: mmap_chunk.is_some(),
            chunk: mmap_chunk.unwrap_or(segment_size),
        };
        backend
            .create_dir_all(&dir)
            .map_err(io_err("create commit log dir", &dir))?;
        let mut segments = Vec::new();
        for name in backend.list(&dir).map_err(io_err("list", &dir))? {
            let Some(base) = parse_file_name(&name) else {
                continue;
            };
            if base % segment_size != 0 {
                return Err(StoreError::Corrupt {
                    path: dir.join(&name),
                    reason: format!(
                        "segment start is not a multiple of the segment size {segment_size}"
                    ),
                });
            }
            let path = dir.join(&name);
            let file = backend
                .open_segment(&path, false, &seg_opts)
                .map_err(io_err("open segment", &path))?;
            if file.len().map_err(io_err("stat segment", &path))? > segment_size {
                return Err(StoreError::Corrupt {
                    path,
                    reason: format!(
                        "segment is longer than the configured segment size {segment_size}"
                    ),
                });
            }
            segments.push(Arc::new(Segment { base, file, path }));
        }
        segments.sort_by_key(|s| s.base);
        Ok(CommitLog {
            backend,
            dir,
            segment_size,
            seg_opts,
            segments: RwLock::new(segments),
            write_pos: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            flush_latency: shoal_metrics::LatencyHistogram::default(),
        })
    }

    /// Segment size in bytes.
    pub(crate) fn segment_size(&self) -> u64 {
        self.segment_size
    }

    /// A snapshot of the segment list.
    pub(crate) fn segments(&self) -> Vec<Arc<Segment>> {
        self.segments.read().clone()
    }

    /// First offset still stored (start of the oldest segment), or the write position if none.
    pub(crate) fn min_offset(&self) -> u64 {
        self.segments
            .read()
            .first()
            .map_or_else(|| self.write_pos(), |s| s.base)
    }

    /// Offset where the next record goes.
    pub(crate) fn write_pos(&self) -> u64 {
        self.write_pos.load(Ordering::Acquire)
    }

    /// Everything below this offset is durable.
    pub(crate) fn flushed(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    /// The segment holding `offset`.
    pub(crate) fn segment_for(&self, offset: u64) -> Option<Arc<Segment>> {
        let segs = self.segments.read();
        let idx = segs.partition_point(|s| s.base <= offset);
        if idx == 0 {
            return None;
        }
        let seg = segs.get(idx - 1)?;
        (offset < seg.base + self.segment_size).then(|| seg.clone())
    }

    /// Reads `len` bytes at `offset` (which must lie in one segment and below the write
    /// position) and appends them to `out`.
    pub(crate) fn read_into(&self, offset: u64, len: usize, out: &mut BytesMut) -> Result<()> {
        let end = offset.saturating_add(len as u64);
        if end > self.write_pos() {
            return Err(StoreError::InvalidArgument(format!(
                "read of {len} bytes at {offset} goes past the commit log end {}",
                self.write_pos()
            )));
        }
        let seg = self.segment_for(offset).ok_or_else(|| {
            StoreError::InvalidArgument(format!("commit log offset {offset} is not stored"))
        })?;
        if end > seg.base + self.segment_size {
            return Err(StoreError::InvalidArgument(format!(
                "read of {len} bytes at {offset} straddles a segment end"
            )));
        }
        let start = out.len();
        out.resize(start + len, 0);
        seg.file
            .read_exact_at(offset - seg.base, &mut out[start..])
            .map_err(|e| {
                out.truncate(start);
                io_err("read commit log", &seg.path)(e)
            })
    }

    /// Reads `len` bytes at `offset` (see [`Self::read_into`]).
    pub(crate) fn read(&self, offset: u64, len: usize) -> Result<Bytes> {
        let mut buf = BytesMut::with_capacity(len);
        self.read_into(offset, len, &mut buf)?;
        Ok(buf.freeze())
    }

    /// The store timestamp of the record at `phys`.
    pub(crate) fn store_timestamp_at(&self, phys: u64) -> Result<i64> {
        let head = self.read(phys, 40)?;
        let sys_flag = i32::from_be_bytes([head[36], head[37], head[38], head[39]]);
        let at = store_timestamp_pos(sys_flag) as u64;
        let ts = self.read(phys + at, 8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(&ts);
        Ok(i64::from_be_bytes(b))
    }

    fn segment_at_base(&self, base: u64, create: bool) -> Result<Arc<Segment>> {
        if let Some(seg) = self.segments.read().iter().find(|s| s.base == base) {
            return Ok(seg.clone());
        }
        if !create {
            return Err(StoreError::InvalidArgument(format!("no segment at {base}")));
        }
        let path = self.dir.join(file_name(base));
        let file = self
            .backend
            .open_segment(&path, true, &self.seg_opts)
            .map_err(io_err("create segment", &path))?;
        let seg = Arc::new(Segment { base, file, path });
        let prev = {
            let mut segs = self.segments.write();
            let prev = segs.iter().rev().find(|s| s.base < base).cloned();
            segs.push(seg.clone());
            segs.sort_by_key(|s| s.base);
            prev
        };
        // The writer moves on: the segment before is full (it ends with its blank marker), so
        // its map and reserved space can go. Not being able to give the space back costs
        // only disk space (the zeros after a blank marker are never read).
        if let Some(prev) = prev {
            if let Err(e) = prev.file.seal() {
                tracing::warn!(path = %prev.path.display(), error = %e,
                    "commit log: could not give back the space reserved after a full segment");
            }
        }
        Ok(seg)
    }

    /// Appends records of the given sizes. For each record, `fill(index, physical_offset,
    /// buffer)` must append exactly `sizes[index]` bytes to `buffer`. Pushes the physical
    /// offset of every record to `offsets`; `buf` (empty) is the caller's room for the bytes
    /// of one write. Only the single writer (holding the store's writer lock) calls this. On
    /// error nothing becomes visible and the write position is unchanged.
    pub(crate) fn append<F>(
        &self,
        sizes: &[usize],
        offsets: &mut Vec<u64>,
        buf: &mut Vec<u8>,
        mut fill: F,
    ) -> Result<()>
    where
        F: FnMut(usize, u64, &mut Vec<u8>) -> Result<()>,
    {
        let mut pos = self.write_pos();
        let total: usize = sizes.iter().sum();
        buf.clear();
        buf.reserve(total.min(8 << 20) + 8);
        let mut buf_start = pos;
        for (i, &size) in sizes.iter().enumerate() {
            let size64 = size as u64;
            if size64 + END_OF_SEGMENT_MIN_BLANK > self.segment_size {
                return Err(StoreError::MessageTooLarge {
                    size,
                    max: (self.segment_size - END_OF_SEGMENT_MIN_BLANK) as usize,
                });
            }
            let in_seg = pos % self.segment_size;
            if in_seg + size64 + END_OF_SEGMENT_MIN_BLANK > self.segment_size {
                let left = self.segment_size - in_seg;
                buf.extend_from_slice(&(left as u32).to_be_bytes());
                buf.extend_from_slice(&BLANK_MAGIC_CODE.to_be_bytes());
                self.write_run(buf_start, buf)?;
                buf.clear();
                pos += left;
                buf_start = pos;
            }
            offsets.push(pos);
            let before = buf.len();
            fill(i, pos, buf)?;
            if buf.len() - before != size {
                return Err(StoreError::InvalidArgument(format!(
                    "encoder wrote {} bytes for a record of {size}",
                    buf.len() - before
                )));
            }
            pos += size64;
        }
        self.write_run(buf_start, buf)?;
        self.write_pos.store(pos, Ordering::Release);
        Ok(())
    }

    fn write_run(&self, start: u64, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let base = start - start % self.segment_size;
        let seg = self.segment_at_base(base, true)?;
        seg.file
            .write_all_at(start - base, data)
            .map_err(io_err("write commit log", &seg.path))
    }

    /// Makes everything written so far durable; returns the new flushed offset. Segments are
    /// synced oldest first, so a later segment is never durable before an earlier one.
    pub(crate) fn flush(&self) -> Result<u64> {
        let target = self.write_pos();
        let from = self.flushed();
        if target <= from {
            return Ok(from);
        }
        let segs: Vec<Arc<Segment>> = self
            .segments
            .read()
            .iter()
            .filter(|s| s.base + self.segment_size > from && s.base < target)
            .cloned()
            .collect();
        let start = std::time::Instant::now();
        for seg in segs {
            seg.file
                .sync()
                .map_err(io_err("fsync commit log", &seg.path))?;
        }
        self.flush_latency.observe(start.elapsed());
        self.flushed.fetch_max(target, Ordering::AcqRel);
        Ok(target)
    }

    /// Recovery: sets the end of the log to `end`, truncating the segment holding it and
    /// deleting later segments. Returns the number of bytes dropped.
    pub(crate) fn truncate_to(&self, end: u64) -> Result<u64> {
        let mut dropped = 0;
        let mut segs = self.segments.write();
        let mut keep = Vec::with_capacity(segs.len());
        for seg in segs.drain(..) {
            let len = seg.file.len().map_err(io_err("stat segment", &seg.path))?;
            if seg.base >= end && !(seg.base == end && len == 0) {
                dropped += len;
                // Unmapped before it goes.
                seg.file
                    .seal()
                    .map_err(io_err("unmap segment", &seg.path))?;
                self.backend
                    .remove_file(&seg.path)
                    .map_err(io_err("remove segment", &seg.path))?;
                continue;
            }
            if seg.base < end && end < seg.base + self.segment_size {
                let keep_len = end - seg.base;
                if len > keep_len {
                    dropped += len - keep_len;
                    seg.file
                        .set_len(keep_len)
                        .map_err(io_err("truncate segment", &seg.path))?;
                    seg.file
                        .sync()
                        .map_err(io_err("fsync segment", &seg.path))?;
                }
            }
            keep.push(seg);
        }
        *segs = keep;
        drop(segs);
        self.write_pos.store(end, Ordering::Release);
        self.flushed.store(end, Ordering::Release);
        Ok(dropped)
    }

    /// Replication: writes `pieces` (commit-log position, bytes; in order, each inside one
    /// segment, the first at the write position), moves the write position to `end` and
    /// makes everything durable. Only the single writer calls this. If a write fails nothing
    /// becomes visible; if the fsync fails the bytes are visible but not durable (the caller
    /// marks the store failed).
    pub(crate) fn append_raw(&self, pieces: &[(u64, &[u8])], end: u64, sync: bool) -> Result<()> {
        for &(at, data) in pieces {
            self.write_run(at, data)?;
        }
        if let Some(base) = pieces.last().map(|&(at, _)| at - at % self.segment_size) {
            // A piece ending a segment with its marker moves the writer on: make the next
            // segment exist now, so that the previous one is sealed as after a put.
            if end % self.segment_size == 0 && end > base {
                self.segment_at_base(end, true)?;
            }
        }
        self.write_pos.store(end, Ordering::Release);
        if sync {
            self.flush()?;
        }
        Ok(())
    }

    /// Replication: removes every segment and starts the log afresh at `base` (a segment
    /// start) with an empty segment file there, durably.
    pub(crate) fn reset_to(&self, base: u64) -> Result<()> {
        let mut segs = self.segments.write();
        // Newest first: a crash part-way leaves a shorter log, which recovery reads as such.
        while let Some(seg) = segs.pop() {
            seg.file
                .seal()
                .map_err(io_err("unmap segment", &seg.path))?;
            self.backend
                .remove_file(&seg.path)
                .map_err(io_err("remove segment", &seg.path))?;
        }
        let path = self.dir.join(file_name(base));
        let file = self
            .backend
            .open_segment(&path, true, &self.seg_opts)
            .map_err(io_err("create segment", &path))?;
        file.sync().map_err(io_err("fsync segment", &path))?;
        segs.push(Arc::new(Segment { base, file, path }));
        drop(segs);
        self.write_pos.store(base, Ordering::Release);
        self.flushed.store(base, Ordering::Release);
        Ok(())
    }

    /// Retention: deletes whole segments that end at or before `before` (never the segment
    /// holding the write position). Returns the bases deleted.
    pub(crate) fn delete_segments_before(&self, before: u64) -> Result<Vec<u64>> {
        let write = self.write_pos();
        let mut segs = self.segments.write();
        let mut deleted = Vec::new();
        while let Some(seg) = segs.first() {
            let end = seg.base + self.segment_size;
            if end > before || end > write {
                break;
            }
            // Unmapped before it goes (sealed when the writer left it, unless that failed).
            seg.file
                .seal()
                .map_err(io_err("unmap segment", &seg.path))?;
            self.backend
                .remove_file(&seg.path)
                .map_err(io_err("remove segment", &seg.path))?;
            deleted.push(seg.base);
            segs.remove(0);
        }
        Ok(deleted)
    }

    /// Shutdown: gives back the space reserved ahead of the writes (see
    /// [`StoreFile::seal`]), so that every segment file is exactly as long as its data, and
    /// makes that durable for the last segment (the one a clean start checks).
    pub(crate) fn seal(&self) -> Result<()> {
        let segs = self.segments();
        for seg in &segs {
            seg.file
                .seal()
                .map_err(io_err("truncate segment", &seg.path))?;
        }
        if let Some(last) = segs.last() {
            last.file
                .sync()
                .map_err(io_err("fsync segment", &last.path))?;
        }
        Ok(())
    }

    /// Length of the data in a segment file.
    pub(crate) fn segment_len(seg: &Segment) -> Result<u64> {
        seg.file.len().map_err(io_err("stat segment", &seg.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemBackend;

    fn fill_with(byte: u8) -> impl FnMut(usize, u64, &mut Vec<u8>) -> Result<()> {
        move |_, _, buf| {
            buf.extend_from_slice(&[byte; 100]);
            Ok(())
        }
    }

    /// [`CommitLog::append`] returning the offsets.
    fn append_all<F>(cl: &CommitLog, sizes: &[usize], fill: F) -> Result<Vec<u64>>
    where
        F: FnMut(usize, u64, &mut Vec<u8>) -> Result<()>,
    {
        let (mut offsets, mut buf) = (Vec::new(), Vec::new());
        cl.append(sizes, &mut offsets, &mut buf, fill)
            .map(|()| offsets)
    }

    #[test]
    fn rolls_with_blank_marker_and_reads_back() {
        let be = Arc::new(MemBackend::new());
        let cl = CommitLog::open(be.clone(), PathBuf::from("/cl"), 4096, None).unwrap();
        let mut all = Vec::new();
        for i in 0..50u8 {
            all.extend(append_all(&cl, &[100], fill_with(i)).unwrap());
        }
        // 40 records fit in the first segment (40*100 + 8 <= 4096), the 41st rolls.
        assert_eq!(all[39], 3900);
        assert_eq!(all[40], 4096);
        let blank = be
            .file_contents(&PathBuf::from("/cl").join(file_name(0)))
            .unwrap();
        assert_eq!(&blank[4000..4004], &96u32.to_be_bytes());
        assert_eq!(&blank[4004..4008], &BLANK_MAGIC_CODE.to_be_bytes());
        assert_eq!(cl.read(all[45], 100).unwrap()[0], 45);
        assert!(cl.read(4000, 200).is_err());
        assert!(cl.read(cl.write_pos(), 1).is_err());
        assert_eq!(cl.segments().len(), 2);
        assert_eq!(cl.flush().unwrap(), cl.write_pos());
    }

    #[test]
    fn batch_straddling_a_segment_and_truncate() {
        let be = Arc::new(MemBackend::new());
        let cl = CommitLog::open(be.clone(), PathBuf::from("/cl"), 4096, None).unwrap();
        let offs = append_all(&cl, &[100; 60], fill_with(7)).unwrap();
        assert_eq!(offs[40], 4096);
        assert_eq!(cl.write_pos(), 4096 + 2000);
        let dropped = cl.truncate_to(4096 + 500).unwrap();
        assert_eq!(dropped, 1500);
        assert_eq!(cl.write_pos(), 4596);
        cl.truncate_to(3000).unwrap();
        assert_eq!(cl.segments().len(), 1);
        let cl2 = CommitLog::open(be, PathBuf::from("/cl"), 4096, None).unwrap();
        assert_eq!(cl2.segments().len(), 1);
    }

    #[test]
    fn too_large_record_is_refused() {
        let be = Arc::new(MemBackend::new());
        let cl = CommitLog::open(be, PathBuf::from("/cl"), 4096, None).unwrap();
        let err = append_all(&cl, &[4090], |_, _, _| Ok(())).unwrap_err();
        assert!(matches!(err, StoreError::MessageTooLarge { .. }));
    }
}
