//! Consumer offset tables.
//!
//! [`OffsetTable`] is the in-memory table both modes share: the next offset to consume per owned
//! queue, with RocketMQ's `increaseOnly` updates, and a guard so that a queue the consumer no
//! longer owns is never committed again (a late commit from a former owner would move the new
//! owner's offset backwards). [`LocalOffsetFile`] persists a table for broadcasting consumers,
//! atomically (temp file, fsync, rename), one file per client and group.

use serde::{Deserialize, Serialize};
use shoal_proto::MessageQueue;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Next offset to consume per queue, for the queues this consumer owns.
#[derive(Debug, Default, Clone)]
pub struct OffsetTable {
    offsets: HashMap<MessageQueue, i64>,
}

impl OffsetTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a queue's offset; with `increase_only` a smaller value is ignored.
    pub fn update(&mut self, mq: &MessageQueue, offset: i64, increase_only: bool) {
        match self.offsets.get_mut(mq) {
            Some(cur) if increase_only && offset <= *cur => {}
            Some(cur) => *cur = offset,
            None => {
                self.offsets.insert(mq.clone(), offset);
            }
        }
    }

    /// The queue's offset, if known.
    pub fn get(&self, mq: &MessageQueue) -> Option<i64> {
        self.offsets.get(mq).copied()
    }

    /// Forgets a queue (it was lost in a rebalance, after its final commit).
    pub fn remove(&mut self, mq: &MessageQueue) -> Option<i64> {
        self.offsets.remove(mq)
    }

    /// The offsets to commit now: only for queues in `owned`.
    pub fn to_commit<'a>(
        &'a self,
        owned: impl Fn(&MessageQueue) -> bool + 'a,
    ) -> impl Iterator<Item = (&'a MessageQueue, i64)> + 'a {
        self.offsets
            .iter()
            .filter(move |(mq, _)| owned(mq))
            .map(|(mq, o)| (mq, *o))
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = (&MessageQueue, i64)> {
        self.offsets.iter().map(|(mq, o)| (mq, *o))
    }

    /// Number of queues.
    pub fn len(&self) -> usize {
        self.offsets.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }
}

/// Errors of the local offset file.
#[derive(Debug, thiserror::Error)]
pub enum OffsetFileError {
    /// Reading or writing the file failed.
    #[error("offset file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file exists but is not a valid offset file.
    #[error("offset file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize, Default)]
struct FileBody {
    /// Keyed by the queue's JSON (as RocketMQ's stringified MessageQueue keys).
    #[serde(rename = "offsetTable")]
    offset_table: BTreeMap<String, i64>,
}

/// The local offset file of a broadcasting consumer: `<dir>/<client id>/<group>/offsets.json`.
#[derive(Debug, Clone)]
pub struct LocalOffsetFile {
    path: PathBuf,
}

impl LocalOffsetFile {
    /// The file for a client and group under `dir`.
    pub fn new(dir: &Path, client_id: &str, group: &str) -> Self {
        let clean = |s: &str| s.replace(['/', '\\', ':'], "_");
        Self {
            path: dir
                .join(clean(client_id))
                .join(clean(group))
                .join("offsets.json"),
        }
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the table; a missing file is an empty table.
    pub fn load(&self) -> Result<OffsetTable, OffsetFileError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OffsetTable::new()),
            Err(source) => {
                return Err(OffsetFileError::Io {
                    path: self.path.clone(),
                    source,
                })
            }
        };
        let corrupt = |reason: String| OffsetFileError::Corrupt {
            path: self.path.clone(),
            reason,
        };
        let body: FileBody = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let mut table = OffsetTable::new();
        for (k, v) in body.offset_table {
            let mq: MessageQueue =
                serde_json::from_str(&k).map_err(|e| corrupt(format!("key {k:?}: {e}")))?;
            table.update(&mq, v, false);
        }
        Ok(table)
    }

    /// Writes the table atomically: a temp file, fsync, rename, fsync of the directory.
    pub fn store(&self, table: &OffsetTable) -> Result<(), OffsetFileError> {
        let io = |source| OffsetFileError::Io {
            path: self.path.clone(),
            source,
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io)?;
        let body = FileBody {
            offset_table: table
                .iter()
                .map(|(mq, o)| {
                    let key = serde_json::to_string(mq).unwrap_or_default();
                    (key, o)
                })
                .collect(),
        };
        let json = serde_json::to_vec_pretty(&body).map_err(|e| io(std::io::Error::other(e)))?;
        let tmp = self.path.with_extension("json.tmp");
        {
            let mut f = std::fs::File::create(&tmp).map_err(io)?;
            f.write_all(&json).map_err(io)?;
            f.sync_all().map_err(io)?;
        }
        std::fs::rename(&tmp, &self.path).map_err(io)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(i: i32) -> MessageQueue {
        MessageQueue::new("T", "broker-a", i)
    }

    #[test]
    fn increase_only_and_owned_filter() {
        let mut t = OffsetTable::new();
        t.update(&q(0), 5, true);
        t.update(&q(0), 3, true);
        assert_eq!(t.get(&q(0)), Some(5));
        t.update(&q(0), 3, false);
        assert_eq!(t.get(&q(0)), Some(3));
        t.update(&q(1), 9, true);
        let owned: Vec<_> = t.to_commit(|mq| mq.queue_id == 1).collect();
        assert_eq!(owned, vec![(&q(1), 9)]);
    }

    #[test]
    fn local_file_round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let f = LocalOffsetFile::new(dir.path(), "127.0.0.1@1#2", "G");
        assert!(f.load().unwrap().is_empty());
        let mut t = OffsetTable::new();
        t.update(&q(0), 7, false);
        t.update(&q(3), 11, false);
        f.store(&t).unwrap();
        let back = f.load().unwrap();
        assert_eq!(back.get(&q(0)), Some(7));
        assert_eq!(back.get(&q(3)), Some(11));
        std::fs::write(f.path(), b"{not json").unwrap();
        let e = f.load().unwrap_err();
        assert!(e.to_string().contains("corrupt"), "{e}");
    }
}
