//! A controller voter's Raft log on disk: `controller.log` in its data directory, records
//! appended with a length and a CRC32 each (`shoal_ha`'s `ControllerStorage::take_journal`)
//! and synced before anything that depends on them is sent; written again whole (a temporary
//! file, synced, renamed over the log, the directory synced) when the log is compacted or a
//! snapshot from the leader replaces it. At start the records are read back up to the first
//! torn or bad one (a torn tail after a crash is normal: it is logged and cut off).

use anyhow::Context;
use shoal_ha::controller::{ControllerStorage, JournalWrite};
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use tracing::warn;

/// The voter's log file in its data directory.
const LOG_FILE: &str = "controller.log";

/// The voter's log file, open for appending.
pub(crate) struct LogFile {
    storage: ControllerStorage,
    path: PathBuf,
    /// `None` until the file is first written whole.
    file: Option<File>,
}

impl LogFile {
    /// Opens (or creates) the log in `dir`: the file and the log it holds (a new one for a
    /// voter among `voters`). A torn tail is logged and cut off.
    pub(crate) fn open(dir: &Path, voters: &[u64]) -> anyhow::Result<(Self, ControllerStorage)> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(LOG_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let recovered = ControllerStorage::recover(&bytes, voters)
            .with_context(|| format!("reading {}", path.display()))?;
        if let Some(why) = &recovered.torn {
            warn!(
                file = %path.display(),
                kept = recovered.valid_len,
                dropped = bytes.len() - recovered.valid_len,
                "controller log: {why}; the records from there on are dropped (a write cut by a crash)"
            );
        }
        let file = if recovered.valid_len == 0 {
            None
        } else {
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            if recovered.valid_len < bytes.len() {
                f.set_len(recovered.valid_len as u64)
                    .and_then(|()| f.sync_all())
                    .with_context(|| format!("cutting {}", path.display()))?;
            }
            drop(f);
            Some(Self::append_handle(&path)?)
        };
        let storage = recovered.storage;
        Ok((
            Self {
                storage: storage.clone(),
                path,
                file,
            },
            storage,
        ))
    }

    fn append_handle(path: &Path) -> anyhow::Result<File> {
        OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes and syncs what changed since the last call; whether anything was written.
    pub(crate) fn sync(&mut self) -> anyhow::Result<bool> {
        let write = self.storage.take_journal()?;
        let done = match (write, &mut self.file) {
            (JournalWrite::Nothing, _) => false,
            (JournalWrite::Append(bytes), Some(f)) => {
                f.write_all(&bytes)
                    .and_then(|()| f.sync_data())
                    .with_context(|| format!("appending to {}", self.path.display()))?;
                true
            }
            (JournalWrite::Append(bytes), None) => {
                // Nothing on disk yet to append to (cannot happen: a new log is written whole
                // first); write what there is.
                self.rewrite(&bytes)?;
                true
            }
            (JournalWrite::Rewrite(bytes), _) => {
                self.rewrite(&bytes)?;
                true
            }
        };
        Ok(done)
    }

    /// The whole file: a temporary file, synced, renamed over the log, the directory synced.
    fn rewrite(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.file = None;
        let tmp = self.path.with_extension("tmp");
        (|| -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            if let Some(dir) = self.path.parent() {
                File::open(dir)?.sync_all()?;
            }
            Ok(())
        })()
        .with_context(|| format!("writing {}", self.path.display()))?;
        self.file = Some(Self::append_handle(&self.path)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_ha::controller::{ControllerConfig, ControllerNode};

    #[test]
    fn a_torn_tail_is_cut_off_and_the_log_goes_on_from_there() {
        let dir = tempfile::tempdir().unwrap();
        let (mut file, storage) = LogFile::open(dir.path(), &[1]).unwrap();
        // A single voter elects itself and commits its first entry.
        let mut node =
            ControllerNode::new(ControllerConfig::new(1, vec![1]), storage.clone(), 0).unwrap();
        for now in (100..3_000).step_by(100) {
            node.handle_timeout(now);
            file.sync().unwrap();
        }
        assert!(node.is_leader());
        let path = file.path().to_path_buf();
        let whole = std::fs::read(&path).unwrap();
        let log = storage.to_bytes().unwrap();
        drop((node, file));
        // A crash in the middle of a write: garbage after the last record.
        let mut torn = whole.clone();
        torn.extend_from_slice(&[0, 0, 0, 9, 1, 2]);
        std::fs::write(&path, &torn).unwrap();
        let (mut file, storage) = LogFile::open(dir.path(), &[1]).unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            whole,
            "the torn tail is cut off"
        );
        assert_eq!(storage.to_bytes().unwrap(), log);
        // The voter starts on it, leads again in a new term, and its records follow.
        let mut node =
            ControllerNode::new(ControllerConfig::new(1, vec![1]), storage.clone(), 0).unwrap();
        let term = node.term();
        for now in (100..3_000).step_by(100) {
            node.handle_timeout(now);
            file.sync().unwrap();
        }
        assert!(node.is_leader() && node.term() > term);
        let (_, again) = LogFile::open(dir.path(), &[1]).unwrap();
        assert_eq!(again.to_bytes().unwrap(), storage.to_bytes().unwrap());
    }
}
