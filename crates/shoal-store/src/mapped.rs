//! A commit-log segment written through a shared memory map (Linux).
//!
//! An append copies its bytes into a `MAP_SHARED` mapping of the segment file, instead of
//! calling `pwrite` (which costs a system call, a page-cache lookup, the file system's
//! write-begin/write-end and an mtime update per append). The mapping *is* the page cache, so
//! reads with `pread` see the bytes at once, and `fdatasync` writes them back like any other
//! dirty page.
//!
//! Only small appends go through the map: an append of [`PWRITE_FROM`] bytes or more (a page:
//! a batch) is one `pwrite`, which fills whole new pages more cheaply than they fault into a
//! map, while the system call it costs is shared by many messages.
//!
//! The file is mapped one chunk at a time ([`SegmentOptions::chunk`], a few MiB). Before a
//! chunk is mapped its blocks are reserved with `fallocate` (which also extends the file to
//! the chunk's end): a store into a page of a sparse file needs a block at fault time, and a
//! full disk then raises SIGBUS, which would kill the process instead of failing the append.
//! Nothing is ever mapped beyond the file's length, and the file is truncated only after its
//! mapping is gone. When reserving or mapping fails, the writes go through `pwrite` instead:
//! for the rest of the chunk after `ENOSPC`/`EDQUOT` (the `pwrite` then reports the full disk
//! as it always did), for the rest of the file after any other error (a file system without
//! `fallocate`, no address space), logged once per segment file.
//!
//! The file is therefore longer on disk than the bytes written (by less than a chunk) while it
//! is being appended to. The handle hides it: [`StoreFile::len`] is the bytes written and
//! reads stop there; [`StoreFile::seal`] unmaps and truncates the file to the bytes written.
//! After a crash the zero-filled reserved tail is on disk; recovery treats zeros after the last
//! valid record as free space.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};
use parking_lot::Mutex;

use crate::file::{SegmentOptions, StoreFile};
use crate::prefetch::{Populate, Prefetcher};

/// A segment file appended to through a memory map of reserved space.
#[derive(Debug)]
pub(crate) struct MappedFile {
    file: File,
    path: PathBuf,
    max_len: u64,
    chunk: u64,
    /// Bytes written: what the store sees as the file's length. The file on disk may be longer
    /// (reserved space, zeros).
    len: AtomicU64,
    state: Mutex<MapState>,
    /// Reserves blocks and extends the file (`fallocate`; replaced in tests to inject errors).
    reserve: ReserveFn,
    /// Appends of at least this many bytes go through `pwrite` ([`PWRITE_FROM`]; tests of the
    /// map itself raise it).
    pwrite_from: usize,
    /// Makes the map's next pages writable ahead of the writes (`None`: they fault in on the
    /// stores that reach them).
    prefetch: Option<&'static Prefetcher>,
    /// File offset below which the prefetcher has made the pages writable (for tests).
    populated: Arc<AtomicU64>,
}

type ReserveFn = fn(&File, u64, u64) -> rustix::io::Result<()>;

/// `fallocate` without `FALLOC_FL_KEEP_SIZE`: reserves the blocks of `offset..offset + len`
/// and extends the file to cover them.
fn fallocate(file: &File, offset: u64, len: u64) -> rustix::io::Result<()> {
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), offset, len)
}

#[derive(Debug, Default)]
struct MapState {
    /// The mapped chunk: file offset of its first byte, and the map (shared with the
    /// prefetcher's requests, which keep it mapped until they are done).
    map: Option<(u64, Arc<MmapRaw>)>,
    /// Writes below this offset go through `pwrite`: set after reserving or mapping failed
    /// (to the chunk's end for a full disk, to `u64::MAX` for errors that do not go away).
    pwrite_below: u64,
    /// The prefetcher was asked to make the map's pages below this file offset writable (see
    /// `prefetch`); pages written by `pwrite` count as done.
    requested_to: u64,
}

/// How far ahead of the writes the prefetcher keeps the map's pages writable: it is asked
/// again when the writes come within half of it.
const PREFETCH_LEAD: u64 = 1 << 20;

/// Appends of at least this many bytes go through `pwrite` rather than the map: the map
/// saves a system call per append, which pays for small appends (one message, a few
/// pipelined sends) but not for a page or more (a batch), where faulting the new pages into
/// the map costs more than `pwrite` filling them (docs/benchmarks.md, "Memory-mapped appends").
pub(crate) const PWRITE_FROM: usize = 4096;

/// File systems where `fallocate` does not guarantee room for later stores into the map
/// (copy on write: every write allocates anew), so a full disk would be a SIGBUS: btrfs, ZFS,
/// bcachefs (`statfs` magic numbers).
const COPY_ON_WRITE_FS: [u64; 3] = [0x9123_683E, 0x2FC1_2FC1, 0xCA45_1A4E];

/// Whether appends to `file` may go through a map: not on a copy-on-write file system (see
/// [`COPY_ON_WRITE_FS`]; logged once per process), and not where `fstatfs` fails.
pub(crate) fn may_map(file: &File, path: &std::path::Path) -> bool {
    static LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let fs_type = match rustix::fs::fstatfs(file) {
        Ok(st) => st.f_type as u64 & 0xFFFF_FFFF,
        Err(_) => return false,
    };
    let copy_on_write = COPY_ON_WRITE_FS.contains(&fs_type);
    if copy_on_write && !LOGGED.swap(true, Ordering::Relaxed) {
        tracing::info!(path = %path.display(), fs_type = format_args!("{fs_type:#x}"),
            "commit log on a copy-on-write file system: appending with pwrite, not through a map");
    }
    !copy_on_write
}

impl MappedFile {
    /// Wraps an open segment file; nothing is mapped until the first write.
    pub(crate) fn new(file: File, path: PathBuf, opts: &SegmentOptions) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(MappedFile {
            file,
            path,
            max_len: opts.max_len,
            chunk: opts.chunk.max(1),
            len: AtomicU64::new(len),
            state: Mutex::new(MapState::default()),
            reserve: fallocate,
            pwrite_from: PWRITE_FROM,
            prefetch: Prefetcher::get(),
            populated: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Whether `pos` is inside the current map: (offset in the map, map).
    fn covering(st: &MapState, pos: u64) -> Option<(usize, &MmapRaw)> {
        let (start, map) = st.map.as_ref()?;
        let off = pos.checked_sub(*start)?;
        (off < map.len() as u64).then_some((off as usize, map))
    }

    /// Reserves and maps the chunk holding `pos`; on failure, makes the writes of that chunk
    /// (or of the whole file) go through `pwrite`.
    fn map_chunk(&self, st: &mut MapState, pos: u64) {
        let start = pos - pos % self.chunk;
        let end = start.saturating_add(self.chunk).min(self.max_len);
        // The previous chunk is unmapped first: its dirty pages stay in the page cache, and
        // the next fdatasync writes them back like any others.
        st.map = None;
        if let Err(errno) = (self.reserve)(&self.file, start, end - start) {
            let e = io::Error::from(errno);
            if errno == rustix::io::Errno::NOSPC || errno == rustix::io::Errno::DQUOT {
                // The pwrite of the data tells the appender the disk is full (or succeeds if
                // the little it needs is there); try mapping again at the next chunk.
                tracing::debug!(path = %self.path.display(), error = %e,
                    "commit log: no space to reserve a chunk; writing it with pwrite");
                st.pwrite_below = end;
            } else {
                self.fall_back(st, "reserve space (fallocate)", &e);
            }
            return;
        }
        #[allow(unsafe_code)]
        // SAFETY: the mapping covers `start..end`, which is inside the file (fallocate just
        // extended it to at least `end`, with blocks reserved), so no access through it is past
        // the end of the file or needs a block the disk may not have. This handle shortens the
        // file only after dropping the map (`set_len`, `seal`), and the store's directory lock
        // keeps other stores off the file. The memory is only accessed through the `MmapMut`,
        // under `state`'s lock, as plain bytes (the prefetcher only advises the kernel about
        // its pages). (Another process truncating a segment under a running store would make a
        // store into the map raise SIGBUS, as with any mapped file; that is outside what the
        // store defends against.)
        let mapped = MmapOptions::new()
            .offset(start)
            .len((end - start) as usize)
            .map_raw(&self.file);
        match mapped {
            Ok(map) => {
                st.map = Some((start, Arc::new(map)));
                // Pages below the bytes written (by `pwrite` too) are never stored to again,
                // but the last, partly written one: no need to populate them.
                let written = self.len.load(Ordering::Acquire);
                st.requested_to = start.max(written - written % 4096);
            }
            Err(e) => self.fall_back(st, "map", &e),
        }
    }

    /// Gives up mapping this file (logged once: the map is never tried again).
    fn fall_back(&self, st: &mut MapState, what: &str, e: &io::Error) {
        st.pwrite_below = u64::MAX;
        tracing::warn!(path = %self.path.display(), error = %e,
            "commit log: cannot {what} the segment; appending to it with pwrite instead");
    }

    /// Writes `data` at `pos` and returns how many bytes went through the map (0: use pwrite).
    fn write_mapped(&self, st: &mut MapState, pos: u64, data: &[u8]) -> usize {
        if pos >= self.max_len || pos < st.pwrite_below {
            return 0;
        }
        if Self::covering(st, pos).is_none() {
            self.map_chunk(st, pos);
        }
        let Some((off, map)) = Self::covering(st, pos) else {
            return 0;
        };
        let n = data.len().min(map.len() - off);
        #[allow(unsafe_code)]
        // SAFETY: `off + n` is inside the map (`covering`, and `n` is capped at its end), which
        // is mapped readable and writable while `st.map` holds it. Only this handle stores into
        // it, under `state`'s lock (the prefetcher advises the kernel, reads go through
        // `pread`), and `data` is the caller's memory, not the map's.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), map.as_mut_ptr().add(off), n);
        }
        self.prefetch(st, pos + n as u64);
        n
    }

    /// Asks the prefetcher to make the map's pages writable up to [`PREFETCH_LEAD`] beyond
    /// `written` when the writes have come within half of that of what it was asked before. A
    /// full queue leaves the request to a later write.
    fn prefetch(&self, st: &mut MapState, written: u64) {
        if written + PREFETCH_LEAD / 2 <= st.requested_to {
            return;
        }
        let (Some(prefetch), Some((start, map))) = (self.prefetch, st.map.as_ref()) else {
            return;
        };
        let map_end = start + map.len() as u64;
        let from = st.requested_to.max(*start);
        let to = written.saturating_add(PREFETCH_LEAD).min(map_end);
        if from >= to {
            return;
        }
        let asked = prefetch.request(Populate {
            map: Arc::clone(map),
            map_start: *start,
            from,
            to,
            done: Arc::clone(&self.populated),
        });
        if asked {
            st.requested_to = to;
        }
    }
}

impl StoreFile for MappedFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        // Only the bytes written: the reserved zeros beyond are not data.
        let len = self.len.load(Ordering::Acquire);
        let n = buf.len().min(len.saturating_sub(offset) as usize);
        if n == 0 {
            return Ok(0);
        }
        // pread reads the page cache, which the map writes into.
        self.file.read_at(&mut buf[..n], offset)
    }

    fn write_all_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut st = self.state.lock();
        if data.len() >= self.pwrite_from {
            // A large append: one system call for a page or more, and the kernel fills whole
            // new pages more cheaply than they fault into the map. Both write the page cache,
            // so the map, `pread` and `fdatasync` see the same bytes.
            let result = self.file.write_all_at(data, offset);
            if result.is_ok() {
                let end = offset + data.len() as u64;
                self.len.fetch_max(end, Ordering::AcqRel);
                // The pages written are in the page cache already and never stored to through
                // the map again (but the last, partly written one): the prefetcher need not
                // populate them for writing.
                st.requested_to = st.requested_to.max(end - end % 4096);
            }
            return result;
        }
        let mut pos = offset;
        let mut rest = data;
        let mut result = Ok(());
        while !rest.is_empty() {
            let n = self.write_mapped(&mut st, pos, rest);
            let n = if n > 0 {
                n
            } else {
                // Not mapped: this chunk (or file) goes through pwrite, up to where the map
                // may take over again.
                let stop = if pos < st.pwrite_below {
                    st.pwrite_below.saturating_sub(pos)
                } else {
                    u64::MAX
                };
                let n = rest.len().min(usize::try_from(stop).unwrap_or(usize::MAX));
                if let Err(e) = self.file.write_all_at(&rest[..n], pos) {
                    result = Err(e);
                    break;
                }
                n
            };
            pos += n as u64;
            rest = &rest[n..];
        }
        self.len.fetch_max(pos, Ordering::AcqRel);
        result
    }

    fn sync(&self) -> io::Result<()> {
        // No msync needed: on Linux a store through a shared file mapping marks the page dirty
        // in the page cache at fault time (page_mkwrite), writeback write-protects the page
        // again so the next store faults and re-dirties it, and fdatasync writes back every
        // dirty page of the file whether it was dirtied by write() or through a map (msync
        // with MS_SYNC is itself implemented as an fsync of the range). Unmapped chunks' dirty
        // pages are still in the page cache and are covered the same way.
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.len.load(Ordering::Acquire))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        // Never shorten a mapped file: unmap first.
        st.map = None;
        self.file.set_len(len)?;
        self.len.store(len, Ordering::Release);
        Ok(())
    }

    fn seal(&self) -> io::Result<()> {
        let mut st = self.state.lock();
        st.map = None;
        let len = self.len.load(Ordering::Acquire);
        if self.file.metadata()?.len() > len {
            self.file.set_len(len)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &std::path::Path, max_len: u64, chunk: u64) -> MappedFile {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap();
        let opts = SegmentOptions {
            max_len,
            mmap: true,
            chunk,
        };
        let mut f = MappedFile::new(file, path.to_path_buf(), &opts).unwrap();
        // These tests are about the map: every write goes through it, whatever its size.
        f.pwrite_from = usize::MAX;
        f
    }

    #[test]
    fn large_appends_go_through_pwrite_between_mapped_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let mut f = open(&p, 1 << 20, 64 << 10);
        f.pwrite_from = PWRITE_FROM;
        let mut want = Vec::new();
        // Small, large, small, a large one across the chunk boundary, small: in order, at
        // their offsets, whichever way each went.
        for (i, size) in [100usize, 5000, 300, 70_000, 10, 4095, 4096]
            .into_iter()
            .enumerate()
        {
            let rec: Vec<u8> = (0..size).map(|k| (k + 7 * i) as u8 | 1).collect();
            f.write_all_at(want.len() as u64, &rec).unwrap();
            want.extend_from_slice(&rec);
            assert_eq!(f.len().unwrap(), want.len() as u64);
        }
        // The small writes mapped a chunk; the large ones did not need it, and the pages they
        // wrote are not populated again for the small writes after them.
        assert!(is_mapped(&f));
        let end = want.len() as u64;
        assert!(f.state.lock().requested_to >= end - end % 4096);
        let mut back = vec![0u8; want.len()];
        f.read_exact_at(0, &mut back).unwrap();
        assert_eq!(back, want);
        f.sync().unwrap();
        assert_eq!(&on_disk(&p)[..want.len()], &want[..]);
        // Sealed, the file is exactly the data.
        f.seal().unwrap();
        assert_eq!(on_disk(&p), want);
    }

    #[test]
    fn copy_on_write_file_systems_are_told_apart_by_magic() {
        // This machine's file system (where the tests run) is not one of them, and the
        // check does not fail on a regular file.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let file = std::fs::File::create(&p).unwrap();
        let fs_type = rustix::fs::fstatfs(&file).unwrap().f_type as u64 & 0xFFFF_FFFF;
        assert_eq!(may_map(&file, &p), !COPY_ON_WRITE_FS.contains(&fs_type));
    }

    fn on_disk(path: &std::path::Path) -> Vec<u8> {
        std::fs::read(path).unwrap()
    }

    fn is_mapped(f: &MappedFile) -> bool {
        f.state.lock().map.is_some()
    }

    #[test]
    fn writes_through_the_map_are_read_back_and_reserve_whole_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let f = open(&p, 40_000, 16_384);
        f.write_all_at(0, b"hello").unwrap();
        assert!(is_mapped(&f));
        f.write_all_at(5, b" world").unwrap();
        // The store sees the bytes written; the disk holds the reserved chunk.
        assert_eq!(f.len().unwrap(), 11);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 16_384);
        let mut buf = [0u8; 64];
        assert_eq!(f.read_at(0, &mut buf).unwrap(), 11);
        assert_eq!(&buf[..11], b"hello world");
        assert_eq!(f.read_at(11, &mut buf).unwrap(), 0);
        // Another descriptor sees the bytes at once (same page cache).
        assert_eq!(&on_disk(&p)[..11], b"hello world");
        f.sync().unwrap();
        // A write across the chunk boundary maps the next chunk; the last chunk stops at the
        // segment size, never beyond.
        let big = vec![7u8; 30_000];
        f.write_all_at(11, &big).unwrap();
        assert_eq!(f.len().unwrap(), 30_011);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 32_768);
        f.write_all_at(30_011, &vec![9u8; 9_989]).unwrap();
        assert_eq!(f.len().unwrap(), 40_000);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 40_000);
        let mut back = vec![0u8; 30_000];
        f.read_exact_at(11, &mut back).unwrap();
        assert_eq!(back, big);
        f.sync().unwrap();
    }

    #[test]
    fn small_writes_across_prefetch_steps_read_back_and_are_prefetched_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let chunk = 4 * PREFETCH_LEAD;
        let f = open(&p, 2 * chunk, chunk);
        let prefetch = f.prefetch.expect("the prefetch thread starts");
        let mut want = Vec::new();
        let mut pos = 0u64;
        let mut i = 0u32;
        // Records of odd sizes over two chunks: every prefetch step and the chunk boundary
        // fall inside some record.
        while pos + 300 < 2 * chunk {
            let rec: Vec<u8> = (0..(97 + i % 200)).map(|k| (k + i) as u8).collect();
            f.write_all_at(pos, &rec).unwrap();
            pos += rec.len() as u64;
            want.extend_from_slice(&rec);
            i += 1;
            // The prefetcher was asked to stay at least half its lead ahead (or to the end of
            // the map).
            let (requested, map_end) = {
                let st = f.state.lock();
                let (start, map) = st.map.as_ref().unwrap();
                (st.requested_to, start + map.len() as u64)
            };
            assert!(
                requested >= (pos + PREFETCH_LEAD / 2).min(map_end),
                "asked up to {requested}, written {pos}"
            );
        }
        // What it was asked is done once it has worked through its queue.
        prefetch.barrier();
        let requested = f.state.lock().requested_to;
        assert!(f.populated.load(Ordering::Acquire) >= requested);
        let mut back = vec![0u8; want.len()];
        f.read_exact_at(0, &mut back).unwrap();
        assert_eq!(back, want);
        assert_eq!(&on_disk(&p)[..want.len()], &want[..]);
    }

    #[test]
    fn a_prefetch_of_a_map_the_file_left_behind_is_harmless() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let chunk = 4 * PREFETCH_LEAD;
        let f = open(&p, chunk, chunk);
        let prefetch = f.prefetch.expect("the prefetch thread starts");
        f.write_all_at(0, b"abc").unwrap();
        // A request for pages the file no longer has by the time it runs (the file is sealed
        // and truncated right after it was queued): the kernel refuses it, nothing faults.
        let (start, map) = f.state.lock().map.clone().unwrap();
        f.seal().unwrap();
        assert!(!is_mapped(&f));
        let done = Arc::new(AtomicU64::new(0));
        assert!(prefetch.request(Populate {
            map,
            map_start: start,
            from: 4096,
            to: chunk,
            done: Arc::clone(&done),
        }));
        prefetch.barrier();
        assert!(done.load(Ordering::Acquire) < chunk);
        assert_eq!(on_disk(&p), b"abc");
        // The file goes on as before.
        f.write_all_at(3, b"def").unwrap();
        let mut buf = [0u8; 6];
        f.read_exact_at(0, &mut buf).unwrap();
        assert_eq!(&buf, b"abcdef");
    }

    #[test]
    fn seal_and_set_len_unmap_then_truncate_and_writes_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let f = open(&p, 1 << 20, 8192);
        f.write_all_at(0, &[1u8; 5000]).unwrap();
        f.seal().unwrap();
        assert!(!is_mapped(&f));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 5000);
        // Sealing again changes nothing.
        f.seal().unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 5000);
        // Writing again maps again (the chunk holding the position, data below kept).
        f.write_all_at(5000, &[2u8; 100]).unwrap();
        assert!(is_mapped(&f));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 8192);
        let disk = on_disk(&p);
        assert!(disk[..5000].iter().all(|b| *b == 1));
        assert!(disk[5000..5100].iter().all(|b| *b == 2));
        assert!(disk[5100..].iter().all(|b| *b == 0));
        // Truncating a torn tail: unmapped first, then the file is exactly that long.
        f.set_len(5050).unwrap();
        assert!(!is_mapped(&f));
        assert_eq!(f.len().unwrap(), 5050);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 5050);
        f.write_all_at(5050, b"xyz").unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(f.read_at(5048, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], &[2, 2, b'x', b'y', b'z']);
    }

    #[test]
    fn dropped_without_seal_leaves_the_data_and_a_zero_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let f = open(&p, 1 << 20, 4096);
        f.write_all_at(0, &[5u8; 100]).unwrap();
        drop(f);
        let disk = on_disk(&p);
        assert_eq!(disk.len(), 4096);
        assert!(disk[..100].iter().all(|b| *b == 5));
        assert!(disk[100..].iter().all(|b| *b == 0));
        // Opened again, the whole file counts (recovery finds the end by the records).
        let f = open(&p, 1 << 20, 4096);
        assert_eq!(f.len().unwrap(), 4096);
    }

    #[test]
    fn without_fallocate_every_write_is_a_pwrite() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let mut f = open(&p, 1 << 20, 4096);
        f.reserve = |_, _, _| Err(rustix::io::Errno::OPNOTSUPP);
        f.write_all_at(0, b"abc").unwrap();
        assert!(!is_mapped(&f));
        assert_eq!(f.state.lock().pwrite_below, u64::MAX);
        f.write_all_at(3, &[4u8; 10_000]).unwrap();
        assert!(!is_mapped(&f));
        // No reserved space: the file is as long as the data.
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 10_003);
        assert_eq!(f.len().unwrap(), 10_003);
        let mut buf = [0u8; 4];
        f.read_exact_at(1, &mut buf).unwrap();
        assert_eq!(&buf, b"bc\x04\x04");
        f.sync().unwrap();
        f.seal().unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 10_003);
    }

    #[test]
    fn a_full_disk_writes_the_chunk_with_pwrite_and_maps_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seg");
        let mut f = open(&p, 1 << 20, 4096);
        f.reserve = |_, _, _| Err(rustix::io::Errno::NOSPC);
        f.write_all_at(0, &[1u8; 1000]).unwrap();
        assert!(!is_mapped(&f));
        assert_eq!(f.state.lock().pwrite_below, 4096);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 1000);
        // Space again: the rest of the chunk still goes through pwrite, the next is mapped.
        f.reserve = fallocate;
        f.write_all_at(1000, &[2u8; 4000]).unwrap();
        assert!(is_mapped(&f));
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 8192);
        let mut back = vec![0u8; 5000];
        f.read_exact_at(0, &mut back).unwrap();
        assert!(back[..1000].iter().all(|b| *b == 1));
        assert!(back[1000..].iter().all(|b| *b == 2));
    }
}
