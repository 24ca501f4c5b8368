//! A controller voter's Raft log on disk: `controller.log` in its data directory.

use anyhow::Context;
use shoal_ha::controller::ControllerStorage;
use std::path::{Path, PathBuf};

/// The voter's log file in its data directory.
const LOG_FILE: &str = "controller.log";

/// Where the voter's log is kept on disk, and the version of it written last.
pub(crate) struct LogFile {
    storage: ControllerStorage,
    path: PathBuf,
    written: u64,
}

impl LogFile {
    /// Opens (or creates) the log in `dir`: the file and the log it holds (a new one for a
    /// voter among `voters`).
    pub(crate) fn open(dir: &Path, voters: &[u64]) -> anyhow::Result<(Self, ControllerStorage)> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(LOG_FILE);
        let storage = match std::fs::read(&path) {
            Ok(bytes) => ControllerStorage::from_bytes(&bytes)
                .with_context(|| format!("reading {}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                ControllerStorage::new(voters.to_vec())
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let file = Self {
            storage: storage.clone(),
            path,
            written: storage.version(),
        };
        Ok((file, storage))
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the log if it changed (a temporary file, synced, renamed over the old one);
    /// whether it wrote.
    pub(crate) fn sync(&mut self) -> anyhow::Result<bool> {
        let version = self.storage.version();
        if version == self.written {
            return Ok(false);
        }
        let bytes = self.storage.to_bytes()?;
        let tmp = self.path.with_extension("tmp");
        (|| -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            if let Some(dir) = self.path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        })()
        .with_context(|| format!("writing {}", self.path.display()))?;
        self.written = version;
        Ok(true)
    }
}
