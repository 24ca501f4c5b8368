//! The file trait the store reads and writes through, and how a commit-log segment is opened:
//! what every backend ([`crate::backend`]) hands out, the memory-mapped segment included.

use std::fmt::Debug;
use std::io;

/// One open file with positional I/O. Shared between threads.
pub trait StoreFile: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (short at EOF).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes all of `data` at `offset`, extending the file if needed.
    fn write_all_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes everything written so far durable.
    fn sync(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Truncates (or extends with zeros) to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Says no write is expected for now: a file that reserves space ahead of its writes
    /// (see [`Backend::open_segment`]) unmaps it and truncates the file to [`Self::len`], the
    /// bytes written. Later writes still work. Nothing to do for other files.
    ///
    /// [`Backend::open_segment`]: crate::backend::Backend::open_segment
    fn seal(&self) -> io::Result<()> {
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes at `offset`, failing with `UnexpectedEof` if the file is
    /// shorter.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(offset + done as u64, &mut buf[done..])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short read at {}", offset + done as u64),
                ));
            }
            done += n;
        }
        Ok(())
    }
}

/// How a commit-log segment is opened (see [`Backend::open_segment`]).
///
/// [`Backend::open_segment`]: crate::backend::Backend::open_segment
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentOptions {
    /// The segment size: the file never grows beyond it.
    pub max_len: u64,
    /// Write through a shared memory map of space reserved ahead of the writes (where the
    /// backend supports it), instead of one positional write per append.
    pub mmap: bool,
    /// Bytes reserved and mapped at a time (a multiple of it is the most the file is longer on
    /// disk than the bytes written).
    pub chunk: u64,
}
