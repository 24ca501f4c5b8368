//! The POP engine's journal on disk: `<data_dir>/pop/journal`, one [`PopRecord`] a line,
//! appended before the request that caused it is answered (and synced under sync flush).
//! Past [`COMPACT_BYTES`] it is rewritten from the engine's snapshot (temp file, fsync,
//! rename). A torn last line (a crash during a write) ends the replay.

use shoal_group::pop::PopRecord;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

/// A journal larger than this is compacted to a snapshot.
pub(crate) const COMPACT_BYTES: u64 = 64 * 1024 * 1024;

/// The open journal.
#[derive(Debug)]
pub(crate) struct Journal {
    path: PathBuf,
    file: File,
    bytes: u64,
    sync: bool,
    buf: String,
}

impl Journal {
    /// Reads the records of `dir/journal` (stopping at a line that does not parse), then
    /// rewrites the file as `snapshot(records)` and opens it for appending.
    pub(crate) fn open(
        dir: &Path,
        sync: bool,
        snapshot: impl FnOnce(Vec<PopRecord>) -> Vec<PopRecord>,
    ) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("journal");
        let mut records = Vec::new();
        if let Ok(f) = File::open(&path) {
            for line in BufReader::new(f).lines() {
                let Ok(line) = line else { break };
                match PopRecord::decode(&line) {
                    Ok(r) => records.push(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "POP journal ends in a torn or unreadable line; replay stops there");
                        break;
                    }
                }
            }
        }
        let snap = snapshot(records);
        let mut j = Self {
            file: write_snapshot(&path, &snap)?,
            path,
            bytes: 0,
            sync,
            buf: String::new(),
        };
        j.bytes = j.file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(j)
    }

    /// Appends records (one write).
    pub(crate) fn append(&mut self, records: &[PopRecord]) -> std::io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        self.buf.clear();
        for r in records {
            r.encode(&mut self.buf);
        }
        self.file.write_all(self.buf.as_bytes())?;
        if self.sync {
            self.file.sync_data()?;
        }
        self.bytes += self.buf.len() as u64;
        Ok(())
    }

    /// True when the journal should be compacted.
    pub(crate) fn wants_compaction(&self) -> bool {
        self.bytes > COMPACT_BYTES
    }

    /// Replaces the journal with `snapshot`.
    pub(crate) fn compact(&mut self, snapshot: &[PopRecord]) -> std::io::Result<()> {
        self.file = write_snapshot(&self.path, snapshot)?;
        self.bytes = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(())
    }
}

fn write_snapshot(path: &Path, records: &[PopRecord]) -> std::io::Result<File> {
    let tmp = path.with_extension("tmp");
    let mut s = String::new();
    for r in records {
        r.encode(&mut s);
    }
    {
        let mut f = File::create(&tmp)?;
        f.write_all(s.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    OpenOptions::new().append(true).open(path)
}
