//! Files behind a small trait, so tests can inject faults and build crash images.
//!
//! [`FsBackend`] is the real file system (positional reads and writes; on Linux, commit-log
//! segments are written through a memory map, see [`Backend::open_segment`]). [`MemBackend`]
//! keeps files in memory and records every write in a journal; a *crash image* keeps everything
//! that was fsynced plus a prefix (in write order, possibly ending in a torn write) of what was
//! not, which is what a machine can leave behind when it loses power. Directory operations
//! (create, remove, rename) are treated as immediately durable by both backends (the real one
//! fsyncs directories where it matters).
//!
//! # Preallocated segments
//!
//! A segment opened with [`SegmentOptions::mmap`] may be *longer on disk than the bytes written
//! to it*: space is reserved in chunks ahead of the writes (so that writing through a memory map
//! can never meet a full disk), and the reserved space reads as zeros. The handle hides this
//! while the file is open ([`StoreFile::len`] is the length written, reads stop there), and
//! [`StoreFile::seal`] gives the reserved space back. After a crash the zeros are visible:
//! recovery treats zeros after the last record of the last segment as free space.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

pub use crate::file::{SegmentOptions, StoreFile};

/// A file system: opens files and manipulates directories.
pub trait Backend: Send + Sync + Debug {
    /// Opens `path` for reading and writing, creating it if `create` is set.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StoreFile>>;
    /// Opens a commit-log segment (appended to at increasing offsets, never longer than
    /// `opts.max_len`). With `opts.mmap` the backend may reserve space ahead of the writes (the
    /// file is then longer on disk than [`StoreFile::len`], with zeros after the data, until
    /// [`StoreFile::seal`]); the [`StoreFile`] semantics are otherwise those of
    /// [`Backend::open`], which is what the default does.
    fn open_segment(
        &self,
        path: &Path,
        create: bool,
        opts: &SegmentOptions,
    ) -> io::Result<Arc<dyn StoreFile>> {
        let _ = opts;
        self.open(path, create)
    }
    /// Names of the entries (files and directories) directly inside `dir`; empty if absent.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Creates `dir` and its parents.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Removes one file (no error if absent).
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything under it (no error if absent).
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Atomically replaces `to` with `from`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Whether a file or directory exists at `path`.
    fn exists(&self, path: &Path) -> bool;
    /// Takes an exclusive lock on the lock file `path` (created if needed) without waiting,
    /// writing `owner` into it. `Ok(Err(current))` when another owner holds it (`current` is
    /// what that owner wrote). The lock is held until the returned guard is dropped, or the
    /// process dies.
    fn try_lock(&self, path: &Path, owner: &str) -> io::Result<Result<DirLock, String>>;
}

/// An exclusive lock taken with [`Backend::try_lock`]; released when dropped.
pub struct DirLock {
    _guard: Box<dyn Send + Sync>,
    path: PathBuf,
}

impl Debug for DirLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirLock").field("path", &self.path).finish()
    }
}

impl DirLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsBackend;

#[derive(Debug)]
struct FsFile(std::fs::File);

#[cfg(unix)]
impl StoreFile for FsFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(&self.0, buf, offset)
    }
    fn write_all_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, data, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

#[cfg(windows)]
impl StoreFile for FsFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        std::os::windows::fs::FileExt::seek_read(&self.0, buf, offset)
    }
    fn write_all_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut done = 0;
        while done < data.len() {
            done += std::os::windows::fs::FileExt::seek_write(
                &self.0,
                &data[done..],
                offset + done as u64,
            )?;
        }
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
}

impl FsBackend {
    fn open_file(path: &Path, create: bool) -> io::Result<std::fs::File> {
        let is_new = create && !path.exists();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        #[cfg(unix)]
        if is_new {
            // Make the new directory entry durable, so an fsync of the file's data is enough.
            if let Some(parent) = path.parent() {
                std::fs::File::open(parent)?.sync_all()?;
            }
        }
        #[cfg(not(unix))]
        let _ = is_new;
        Ok(file)
    }
}

impl Backend for FsBackend {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StoreFile>> {
        Ok(Arc::new(FsFile(Self::open_file(path, create)?)))
    }

    /// On Linux with `opts.mmap`: a file written through a shared memory map of space
    /// reserved with `fallocate` ahead of the writes (appends of a page or more, and writes
    /// where reserving or mapping fails, with `pwrite`). Elsewhere, on a copy-on-write file
    /// system, or without `opts.mmap`: as [`Backend::open`].
    fn open_segment(
        &self,
        path: &Path,
        create: bool,
        opts: &SegmentOptions,
    ) -> io::Result<Arc<dyn StoreFile>> {
        let file = Self::open_file(path, create)?;
        #[cfg(target_os = "linux")]
        if opts.mmap && crate::mapped::may_map(&file, path) {
            return Ok(Arc::new(crate::mapped::MappedFile::new(
                file,
                path.to_path_buf(),
                opts,
            )?));
        }
        #[cfg(not(target_os = "linux"))]
        let _ = opts;
        Ok(Arc::new(FsFile(file)))
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let rd = match std::fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        for entry in rd {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        // Remember which components are new, to make their entries durable.
        let mut new_dirs = Vec::new();
        let mut p = Some(dir);
        while let Some(d) = p {
            if d.as_os_str().is_empty() || d.exists() {
                break;
            }
            new_dirs.push(d.to_path_buf());
            p = d.parent();
        }
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        for d in new_dirs.iter().rev() {
            if let Some(parent) = d.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::File::open(parent)?.sync_all()?;
            }
        }
        Ok(())
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)?;
        #[cfg(unix)]
        if let Some(parent) = to.parent() {
            // Make the rename itself durable.
            std::fs::File::open(parent)?.sync_all()?;
        }
        Ok(())
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn try_lock(&self, path: &Path, owner: &str) -> io::Result<Result<DirLock, String>> {
        use std::io::{Read, Seek, Write};
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                let mut current = String::new();
                let _ = file.read_to_string(&mut current);
                return Ok(Err(current.trim().to_string()));
            }
            Err(e) => return Err(e.into()),
        }
        file.set_len(0)?;
        file.seek(io::SeekFrom::Start(0))?;
        file.write_all(owner.as_bytes())?;
        file.sync_data()?;
        Ok(Ok(DirLock {
            _guard: Box::new(file),
            path: path.to_path_buf(),
        }))
    }
}

/// Faults a [`MemBackend`] injects.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Total bytes that may still be written; a write that goes past it writes what fits and
    /// then fails with `StorageFull` (a full disk). `None` = unlimited.
    pub write_budget: Option<u64>,
    /// Every `sync` fails with an I/O error.
    pub fail_sync: bool,
    /// Every write fails with an I/O error (before writing anything).
    pub fail_write: bool,
}

#[derive(Debug)]
enum Op {
    Write {
        file: u64,
        offset: u64,
        data: Vec<u8>,
    },
    SetLen {
        file: u64,
        len: u64,
    },
}

#[derive(Debug)]
struct JournalEntry {
    op: Op,
    synced: bool,
}

#[derive(Debug, Default)]
struct MemFs {
    /// Path -> file id.
    names: BTreeMap<PathBuf, u64>,
    /// Current contents per file id.
    data: HashMap<u64, Vec<u8>>,
    /// Indexes into `journal` of the unsynced operations per file.
    unsynced: HashMap<u64, Vec<usize>>,
    dirs: std::collections::BTreeSet<PathBuf>,
    journal: Vec<JournalEntry>,
    next_id: u64,
    faults: Faults,
    record: bool,
    syncs: u64,
    /// Lock files held, with what their owner wrote (see [`Backend::try_lock`]).
    locks: HashMap<PathBuf, String>,
    /// Segments opened with [`SegmentOptions::mmap`] reserve space ahead of their writes.
    preallocate_segments: bool,
}

/// In-memory file system with a write journal, fault injection and crash images.
#[derive(Debug, Clone)]
pub struct MemBackend {
    fs: Arc<Mutex<MemFs>>,
}

impl Default for MemBackend {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug)]
struct MemFile {
    fs: Arc<Mutex<MemFs>>,
    id: u64,
    /// For a segment that reserves space ahead of its writes (see
    /// [`MemBackend::set_segment_preallocation`]).
    prealloc: Option<Prealloc>,
}

/// The reserved-space model of one open segment.
#[derive(Debug)]
struct Prealloc {
    chunk: u64,
    max_len: u64,
    /// Bytes written (the length the store sees); the file may be longer (zeros).
    len: std::sync::atomic::AtomicU64,
}

fn apply(data: &mut Vec<u8>, op: &Op, limit: usize) {
    match op {
        Op::Write {
            offset,
            data: bytes,
            ..
        } => {
            let n = limit.min(bytes.len());
            let start = *offset as usize;
            if data.len() < start + n {
                data.resize(start + n, 0);
            }
            data[start..start + n].copy_from_slice(&bytes[..n]);
        }
        Op::SetLen { len, .. } => data.resize(*len as usize, 0),
    }
}

fn op_file(op: &Op) -> u64 {
    match op {
        Op::Write { file, .. } | Op::SetLen { file, .. } => *file,
    }
}

impl MemBackend {
    /// An empty in-memory file system that journals writes (for crash images).
    pub fn new() -> Self {
        MemBackend {
            fs: Arc::new(Mutex::new(MemFs {
                record: true,
                ..MemFs::default()
            })),
        }
    }

    /// Replaces the injected faults.
    pub fn set_faults(&self, faults: Faults) {
        self.fs.lock().faults = faults;
    }

    /// Models commit-log segments appended through a memory map, as [`FsBackend`] does on
    /// Linux: a segment opened with [`SegmentOptions::mmap`] that is written past its end is
    /// first extended with zeros to the next multiple of [`SegmentOptions::chunk`] (at most
    /// `max_len`), as `fallocate` does. The extension is journaled like a write (durable after
    /// a sync; in crash images in issue order), so images can hold a zero-filled tail after
    /// the data. While the file is open its [`StoreFile::len`] and reads cover the bytes
    /// written only, and [`StoreFile::seal`] truncates it to them. Off by default; crash
    /// images keep the setting.
    pub fn set_segment_preallocation(&self, on: bool) {
        self.fs.lock().preallocate_segments = on;
    }

    /// The length of a file as stored (with any reserved zeros), for assertions in tests.
    pub fn stored_len(&self, path: &Path) -> Option<u64> {
        let fs = self.fs.lock();
        let id = fs.names.get(path)?;
        fs.data.get(id).map(|d| d.len() as u64)
    }

    /// Total bytes of writes (set-len counts as one byte) not yet covered by an fsync: crash
    /// images exist for every cut in `0..=unsynced_bytes()`.
    pub fn unsynced_bytes(&self) -> u64 {
        let fs = self.fs.lock();
        fs.journal
            .iter()
            .filter(|e| !e.synced)
            .map(|e| match &e.op {
                Op::Write { data, .. } => data.len() as u64,
                Op::SetLen { .. } => 1,
            })
            .sum()
    }

    /// Builds what the disk could hold after a power loss now: every fsynced write, plus the
    /// first `cut` bytes of the unsynced writes in the order they were issued (the last one
    /// possibly torn). The image is a new backend with no journal history.
    pub fn crash_image(&self, cut: u64) -> MemBackend {
        let fs = self.fs.lock();
        let mut contents: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut budget = cut;
        for entry in &fs.journal {
            let file = op_file(&entry.op);
            let target = contents.entry(file).or_default();
            if entry.synced {
                apply(target, &entry.op, usize::MAX);
                continue;
            }
            let cost = match &entry.op {
                Op::Write { data, .. } => data.len() as u64,
                Op::SetLen { .. } => 1,
            };
            if budget >= cost {
                apply(target, &entry.op, usize::MAX);
                budget -= cost;
            } else if budget > 0 {
                if let Op::Write { .. } = entry.op {
                    apply(target, &entry.op, budget as usize);
                }
                budget = 0;
            }
        }
        let mut image = MemFs {
            record: true,
            dirs: fs.dirs.clone(),
            preallocate_segments: fs.preallocate_segments,
            ..MemFs::default()
        };
        for (path, id) in &fs.names {
            let new_id = image.next_id;
            image.next_id += 1;
            image.names.insert(path.clone(), new_id);
            let data = contents.remove(id).unwrap_or_default();
            image.data.insert(new_id, data.clone());
            // The image starts fully durable: record its contents as one synced write.
            image.journal.push(JournalEntry {
                op: Op::Write {
                    file: new_id,
                    offset: 0,
                    data,
                },
                synced: true,
            });
        }
        MemBackend {
            fs: Arc::new(Mutex::new(image)),
        }
    }

    /// Number of successful `sync` calls so far (to observe group commit).
    pub fn sync_count(&self) -> u64 {
        self.fs.lock().syncs
    }

    /// The current (not crash-cut) contents of a file, for assertions in tests.
    pub fn file_contents(&self, path: &Path) -> Option<Vec<u8>> {
        let fs = self.fs.lock();
        let id = fs.names.get(path)?;
        fs.data.get(id).cloned()
    }

    /// Overwrites bytes of a file in place, as durable (to simulate on-disk corruption).
    pub fn corrupt(&self, path: &Path, offset: u64, bytes: &[u8]) -> bool {
        let mut fs = self.fs.lock();
        let Some(&id) = fs.names.get(path) else {
            return false;
        };
        let op = Op::Write {
            file: id,
            offset,
            data: bytes.to_vec(),
        };
        if let Some(d) = fs.data.get_mut(&id) {
            apply(d, &op, usize::MAX);
        }
        fs.journal.push(JournalEntry { op, synced: true });
        true
    }
}

impl MemFs {
    fn push(&mut self, op: Op) {
        let file = op_file(&op);
        if let Some(d) = self.data.get_mut(&file) {
            apply(d, &op, usize::MAX);
        }
        if self.record {
            let idx = self.journal.len();
            self.journal.push(JournalEntry { op, synced: false });
            self.unsynced.entry(file).or_default().push(idx);
        }
    }
}

impl MemFile {
    /// Length the store sees: the bytes written for a preallocating segment, else the length.
    fn visible_len(&self, fs: &MemFs) -> u64 {
        match &self.prealloc {
            Some(p) => p.len.load(std::sync::atomic::Ordering::Acquire),
            None => fs.data.get(&self.id).map_or(0, |d| d.len() as u64),
        }
    }
}

impl StoreFile for MemFile {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let fs = self.fs.lock();
        let visible = self.visible_len(&fs);
        let data = fs
            .data
            .get(&self.id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "file removed"))?;
        let data = &data[..data.len().min(visible as usize)];
        let start = (offset as usize).min(data.len());
        let n = buf.len().min(data.len() - start);
        buf[..n].copy_from_slice(&data[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut fs = self.fs.lock();
        if fs.faults.fail_write {
            return Err(io::Error::other("injected write failure"));
        }
        let mut len = data.len();
        let mut full = false;
        if let Some(budget) = fs.faults.write_budget.as_mut() {
            if (len as u64) > *budget {
                len = *budget as usize;
                full = true;
            }
            *budget -= len as u64;
        }
        if let Some(p) = &self.prealloc {
            // Reserve (extend with zeros) up to the chunk end past the write, as fallocate
            // does before the chunk is mapped; not on a full disk (fallocate fails there).
            let end = offset + data.len() as u64;
            let stored = fs.data.get(&self.id).map_or(0, |d| d.len() as u64);
            if !full && end > stored && end <= p.max_len {
                let reserved = end.div_ceil(p.chunk).saturating_mul(p.chunk).min(p.max_len);
                fs.push(Op::SetLen {
                    file: self.id,
                    len: reserved,
                });
            }
            p.len
                .fetch_max(offset + len as u64, std::sync::atomic::Ordering::AcqRel);
        }
        if len > 0 {
            fs.push(Op::Write {
                file: self.id,
                offset,
                data: data[..len].to_vec(),
            });
        }
        if full {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "injected full disk",
            ));
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut fs = self.fs.lock();
        if fs.faults.fail_sync {
            return Err(io::Error::other("injected fsync failure"));
        }
        fs.syncs += 1;
        let pending = fs.unsynced.remove(&self.id).unwrap_or_default();
        for idx in pending {
            if let Some(e) = fs.journal.get_mut(idx) {
                e.synced = true;
            }
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let fs = self.fs.lock();
        Ok(self.visible_len(&fs))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut fs = self.fs.lock();
        fs.push(Op::SetLen { file: self.id, len });
        if let Some(p) = &self.prealloc {
            p.len.store(len, std::sync::atomic::Ordering::Release);
        }
        Ok(())
    }

    fn seal(&self) -> io::Result<()> {
        let mut fs = self.fs.lock();
        if let Some(p) = &self.prealloc {
            let len = p.len.load(std::sync::atomic::Ordering::Acquire);
            if fs.data.get(&self.id).is_some_and(|d| d.len() as u64 > len) {
                fs.push(Op::SetLen { file: self.id, len });
            }
        }
        Ok(())
    }
}

impl MemBackend {
    fn open_id(&self, path: &Path, create: bool) -> io::Result<u64> {
        let mut fs = self.fs.lock();
        let id = match fs.names.get(path) {
            Some(&id) => id,
            None if create => {
                let id = fs.next_id;
                fs.next_id += 1;
                fs.names.insert(path.to_path_buf(), id);
                fs.data.insert(id, Vec::new());
                id
            }
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} not found", path.display()),
                ))
            }
        };
        Ok(id)
    }
}

impl Backend for MemBackend {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StoreFile>> {
        let id = self.open_id(path, create)?;
        Ok(Arc::new(MemFile {
            fs: self.fs.clone(),
            id,
            prealloc: None,
        }))
    }

    /// As [`Backend::open`], with reserved space modelled when
    /// [`MemBackend::set_segment_preallocation`] is on and `opts.mmap` is set.
    fn open_segment(
        &self,
        path: &Path,
        create: bool,
        opts: &SegmentOptions,
    ) -> io::Result<Arc<dyn StoreFile>> {
        let id = self.open_id(path, create)?;
        let fs = self.fs.lock();
        let prealloc = (fs.preallocate_segments && opts.mmap).then(|| Prealloc {
            chunk: opts.chunk.max(1),
            max_len: opts.max_len,
            len: std::sync::atomic::AtomicU64::new(fs.data.get(&id).map_or(0, |d| d.len() as u64)),
        });
        drop(fs);
        Ok(Arc::new(MemFile {
            fs: self.fs.clone(),
            id,
            prealloc,
        }))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let fs = self.fs.lock();
        let mut names: Vec<String> = fs
            .names
            .keys()
            .chain(fs.dirs.iter())
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(String::from))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        let mut p = Some(dir);
        while let Some(d) = p {
            if d.as_os_str().is_empty() {
                break;
            }
            fs.dirs.insert(d.to_path_buf());
            p = d.parent();
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        if let Some(id) = fs.names.remove(path) {
            fs.data.remove(&id);
            fs.unsynced.remove(&id);
        }
        Ok(())
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        let victims: Vec<PathBuf> = fs
            .names
            .keys()
            .filter(|p| p.starts_with(dir))
            .cloned()
            .collect();
        for p in victims {
            if let Some(id) = fs.names.remove(&p) {
                fs.data.remove(&id);
                fs.unsynced.remove(&id);
            }
        }
        fs.dirs.retain(|d| !d.starts_with(dir));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut fs = self.fs.lock();
        let id = fs.names.remove(from).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} not found", from.display()),
            )
        })?;
        if let Some(old) = fs.names.insert(to.to_path_buf(), id) {
            fs.data.remove(&old);
            fs.unsynced.remove(&old);
        }
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        let fs = self.fs.lock();
        fs.names.contains_key(path) || fs.dirs.contains(path)
    }

    fn try_lock(&self, path: &Path, owner: &str) -> io::Result<Result<DirLock, String>> {
        let mut fs = self.fs.lock();
        if let Some(current) = fs.locks.get(path) {
            return Ok(Err(current.clone()));
        }
        fs.locks.insert(path.to_path_buf(), owner.to_string());
        Ok(Ok(DirLock {
            _guard: Box::new(MemLock {
                fs: self.fs.clone(),
                path: path.to_path_buf(),
            }),
            path: path.to_path_buf(),
        }))
    }
}

/// A lock on a [`MemBackend`] lock file (crash images start with no locks held: the process
/// that held them is gone).
struct MemLock {
    fs: Arc<Mutex<MemFs>>,
    path: PathBuf,
}

impl Drop for MemLock {
    fn drop(&mut self) {
        self.fs.lock().locks.remove(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_image_keeps_synced_and_prefix_of_unsynced() {
        let be = MemBackend::new();
        let f = be.open(Path::new("/a"), true).unwrap();
        let g = be.open(Path::new("/b"), true).unwrap();
        f.write_all_at(0, b"hello").unwrap();
        f.sync().unwrap();
        g.write_all_at(0, b"xyz").unwrap();
        f.write_all_at(5, b"world").unwrap();
        assert_eq!(be.unsynced_bytes(), 8);
        let img = be.crash_image(0);
        assert_eq!(img.file_contents(Path::new("/a")).unwrap(), b"hello");
        assert_eq!(img.file_contents(Path::new("/b")).unwrap(), b"");
        let img = be.crash_image(5);
        assert_eq!(img.file_contents(Path::new("/a")).unwrap(), b"hellowo");
        assert_eq!(img.file_contents(Path::new("/b")).unwrap(), b"xyz");
        let img = be.crash_image(8);
        assert_eq!(img.file_contents(Path::new("/a")).unwrap(), b"helloworld");
        // the image is durable in full
        assert_eq!(img.unsynced_bytes(), 0);
        assert_eq!(
            img.crash_image(0).file_contents(Path::new("/a")).unwrap(),
            b"helloworld"
        );
    }

    #[test]
    fn full_disk_writes_what_fits_then_fails() {
        let be = MemBackend::new();
        be.set_faults(Faults {
            write_budget: Some(3),
            ..Faults::default()
        });
        let f = be.open(Path::new("/a"), true).unwrap();
        let err = f.write_all_at(0, b"hello").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(f.len().unwrap(), 3);
        be.set_faults(Faults {
            fail_sync: true,
            ..Faults::default()
        });
        assert!(f.sync().is_err());
    }

    #[test]
    fn list_rename_remove() {
        let be = MemBackend::new();
        be.create_dir_all(Path::new("/d/e")).unwrap();
        be.open(Path::new("/d/x.tmp"), true).unwrap();
        be.rename(Path::new("/d/x.tmp"), Path::new("/d/x")).unwrap();
        assert_eq!(be.list(Path::new("/d")).unwrap(), vec!["e", "x"]);
        be.remove_dir_all(Path::new("/d")).unwrap();
        assert!(!be.exists(Path::new("/d/x")));
    }

    #[test]
    fn fs_backend_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let be = FsBackend;
        let p = dir.path().join("f");
        let f = be.open(&p, true).unwrap();
        f.write_all_at(4, b"abcd").unwrap();
        f.sync().unwrap();
        let mut buf = [0u8; 8];
        f.read_exact_at(0, &mut buf).unwrap();
        assert_eq!(&buf, b"\0\0\0\0abcd");
        assert!(f.read_exact_at(6, &mut buf).is_err());
        f.set_len(2).unwrap();
        assert_eq!(f.len().unwrap(), 2);
        assert_eq!(be.list(dir.path()).unwrap(), vec!["f"]);
    }
}
