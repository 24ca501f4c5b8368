//! What a replicated broker keeps beside its store for replication: the token it applied for
//! its broker id with, the id the controller gave it, and its epoch entries (RocketMQ's
//! `EpochFile`, Kafka's leader-epoch checkpoint). One JSON file, `ha/member.json` under the
//! data directory, replaced atomically (temp file, fsync, rename) whenever it changes, and
//! always before anything that depends on the change is sent.

use crate::persist::{read_json, write_json_atomic, PersistError};
use serde::{Deserialize, Serialize};
use shoal_ha::replication::{EpochCache, EpochEntry};
use shoal_ha::BrokerId;
use std::path::{Path, PathBuf};

/// The file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct MemberFile {
    /// The group it belongs to: a data directory never changes group.
    pub(crate) group: String,
    /// The nonce it applies for its id with; a lost disk means a new token, so a new id.
    pub(crate) token: String,
    /// The id the controller gave it.
    pub(crate) broker_id: Option<BrokerId>,
    /// Its epoch entries, oldest first.
    pub(crate) epochs: Vec<EpochEntry>,
}

/// The member file of a data directory.
#[derive(Debug)]
pub(crate) struct MemberDisk {
    path: PathBuf,
    written: MemberFile,
}

impl MemberDisk {
    /// Reads (or creates, with a fresh token) the member file under `data_dir`.
    pub(crate) fn open(data_dir: &Path, group: &str) -> Result<Self, PersistError> {
        let path = data_dir.join("ha").join("member.json");
        let file = match read_json::<MemberFile>(&path)? {
            Some(f) => {
                if f.group != group {
                    return Err(PersistError::Corrupt {
                        path: path.display().to_string(),
                        reason: format!(
                            "this data directory belongs to broker group {:?}, not {group:?}",
                            f.group
                        ),
                    });
                }
                if EpochCache::from_entries(f.epochs.clone()).is_err() {
                    return Err(PersistError::Corrupt {
                        path: path.display().to_string(),
                        reason: "epoch entries out of order".into(),
                    });
                }
                f
            }
            None => {
                let f = MemberFile {
                    group: group.to_string(),
                    token: new_token(),
                    broker_id: None,
                    epochs: Vec::new(),
                };
                write_json_atomic(&path, &f)?;
                f
            }
        };
        Ok(Self {
            path,
            written: file,
        })
    }

    /// What the file holds.
    pub(crate) fn file(&self) -> &MemberFile {
        &self.written
    }

    /// Its epoch entries, cut at `log_end` (entries past the log's end describe bytes a crash
    /// took).
    pub(crate) fn epochs_for(&self, log_end: u64) -> EpochCache {
        let mut cache = EpochCache::from_entries(self.written.epochs.clone()).unwrap_or_default();
        cache.truncate_to(log_end);
        cache
    }

    /// Writes the id and epoch entries if they changed (blocking: fsync).
    pub(crate) fn update(
        &mut self,
        broker_id: Option<BrokerId>,
        epochs: &EpochCache,
    ) -> Result<bool, PersistError> {
        if self.written.broker_id == broker_id && self.written.epochs == epochs.entries() {
            return Ok(false);
        }
        let next = MemberFile {
            broker_id,
            epochs: epochs.entries().to_vec(),
            ..self.written.clone()
        };
        write_json_atomic(&self.path, &next)?;
        self.written = next;
        Ok(true)
    }
}

/// A nonce unlikely to repeat across machines and restarts.
fn new_token() -> String {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    format!("{:016x}{:016x}", rng.gen::<u64>(), rng.gen::<u64>())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests")]
    use super::*;

    #[test]
    fn created_once_updated_on_change_and_bound_to_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let mut d = MemberDisk::open(dir.path(), "g").unwrap();
        let token = d.file().token.clone();
        assert_eq!(d.file().broker_id, None);
        let mut epochs = EpochCache::default();
        epochs.push(1, 0).unwrap();
        epochs.push(3, 500).unwrap();
        assert!(d.update(Some(2), &epochs).unwrap());
        assert!(!d.update(Some(2), &epochs).unwrap());
        let again = MemberDisk::open(dir.path(), "g").unwrap();
        assert_eq!(again.file().token, token);
        assert_eq!(again.file().broker_id, Some(2));
        assert_eq!(again.epochs_for(10_000).entries(), epochs.entries());
        // A crash took the bytes of epoch 3: its entry goes with them.
        assert_eq!(again.epochs_for(400).last_epoch(), 1);
        assert!(MemberDisk::open(dir.path(), "other").is_err());
    }
}
