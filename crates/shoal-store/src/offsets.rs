//! Consumer offsets per (group, topic, queue) and delay-level progress, persisted atomically
//! (temp file + fsync + rename) in RocketMQ's JSON shapes: `config/consumerOffset.json`
//! (`{"offsetTable":{"topic@group":{"0":12}}}`) and `config/delayOffset.json`
//! (`{"offsetTable":{"1":42}}`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::error::{io_err, Result};
use crate::StoreError;

#[derive(Debug, Default, Serialize, Deserialize)]
struct ConsumerOffsetFile {
    #[serde(rename = "offsetTable")]
    offset_table: BTreeMap<String, BTreeMap<i32, i64>>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct DelayOffsetFile {
    #[serde(rename = "offsetTable")]
    offset_table: BTreeMap<i32, i64>,
}

#[derive(Debug, Default)]
struct Tables {
    /// (topic, group) -> queue id -> offset.
    consumer: BTreeMap<(String, String), BTreeMap<i32, i64>>,
    delay: BTreeMap<i32, i64>,
    dirty: bool,
}

/// The offsets store.
#[derive(Debug)]
pub(crate) struct OffsetStore {
    backend: Arc<dyn Backend>,
    dir: PathBuf,
    tables: Mutex<Tables>,
    /// Serializes persists so two writers never share the temp file.
    persist_lock: Mutex<()>,
}

const CONSUMER_FILE: &str = "consumerOffset.json";
const DELAY_FILE: &str = "delayOffset.json";

fn read_json<T: for<'de> Deserialize<'de> + Default>(
    backend: &dyn Backend,
    path: &Path,
) -> Result<T> {
    if !backend.exists(path) {
        return Ok(T::default());
    }
    let file = backend.open(path, false).map_err(io_err("open", path))?;
    let len = file.len().map_err(io_err("stat", path))?;
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(0, &mut buf)
        .map_err(io_err("read", path))?;
    serde_json::from_slice(&buf).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn write_json_atomically(backend: &dyn Backend, path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    backend.remove_file(&tmp).map_err(io_err("remove", &tmp))?;
    let file = backend.open(&tmp, true).map_err(io_err("create", &tmp))?;
    file.write_all_at(0, bytes).map_err(io_err("write", &tmp))?;
    file.sync().map_err(io_err("fsync", &tmp))?;
    backend.rename(&tmp, path).map_err(io_err("rename", path))
}

impl OffsetStore {
    /// Loads both tables from `dir` (missing files are empty tables).
    pub(crate) fn open(backend: Arc<dyn Backend>, dir: PathBuf) -> Result<Self> {
        backend
            .create_dir_all(&dir)
            .map_err(io_err("create config dir", &dir))?;
        let c: ConsumerOffsetFile = read_json(&*backend, &dir.join(CONSUMER_FILE))?;
        let d: DelayOffsetFile = read_json(&*backend, &dir.join(DELAY_FILE))?;
        let mut consumer = BTreeMap::new();
        for (key, queues) in c.offset_table {
            let Some((topic, group)) = key.split_once('@') else {
                return Err(StoreError::Corrupt {
                    path: dir.join(CONSUMER_FILE),
                    reason: format!("key {key:?} is not topic@group"),
                });
            };
            consumer.insert((topic.to_string(), group.to_string()), queues);
        }
        Ok(OffsetStore {
            backend,
            dir,
            tables: Mutex::new(Tables {
                consumer,
                delay: d.offset_table,
                dirty: false,
            }),
            persist_lock: Mutex::new(()),
        })
    }

    pub(crate) fn commit(&self, group: &str, topic: &str, queue_id: i32, offset: i64) {
        let mut t = self.tables.lock();
        t.consumer
            .entry((topic.to_string(), group.to_string()))
            .or_default()
            .insert(queue_id, offset);
        t.dirty = true;
    }

    pub(crate) fn query(&self, group: &str, topic: &str, queue_id: i32) -> Option<i64> {
        let t = self.tables.lock();
        t.consumer
            .get(&(topic.to_string(), group.to_string()))
            .and_then(|q| q.get(&queue_id).copied())
    }

    pub(crate) fn of_group(&self, group: &str) -> Vec<(String, i32, i64)> {
        let t = self.tables.lock();
        t.consumer
            .iter()
            .filter(|((_, g), _)| g == group)
            .flat_map(|((topic, _), q)| q.iter().map(move |(&qid, &o)| (topic.clone(), qid, o)))
            .collect()
    }

    pub(crate) fn all(&self) -> Vec<(String, String, i32, i64)> {
        let t = self.tables.lock();
        t.consumer
            .iter()
            .flat_map(|((topic, group), q)| {
                q.iter()
                    .map(move |(&qid, &o)| (group.clone(), topic.clone(), qid, o))
            })
            .collect()
    }

    pub(crate) fn delay_all(&self) -> Vec<(i32, i64)> {
        let t = self.tables.lock();
        t.delay.iter().map(|(&l, &o)| (l, o)).collect()
    }

    pub(crate) fn groups_of_topic(&self, topic: &str) -> Vec<String> {
        let t = self.tables.lock();
        t.consumer
            .keys()
            .filter(|(tp, _)| tp == topic)
            .map(|(_, g)| g.clone())
            .collect()
    }

    pub(crate) fn remove_topic(&self, topic: &str) {
        let mut t = self.tables.lock();
        t.consumer.retain(|(tp, _), _| tp != topic);
        t.dirty = true;
    }

    pub(crate) fn remove_group(&self, group: &str) {
        let mut t = self.tables.lock();
        t.consumer.retain(|(_, g), _| g != group);
        t.dirty = true;
    }

    pub(crate) fn schedule_offset(&self, level: i32) -> Option<i64> {
        self.tables.lock().delay.get(&level).copied()
    }

    pub(crate) fn set_schedule_offset(&self, level: i32, offset: i64) {
        let mut t = self.tables.lock();
        t.delay.insert(level, offset);
        t.dirty = true;
    }

    /// Writes both files if anything changed since the last persist.
    pub(crate) fn persist(&self) -> Result<()> {
        let _guard = self.persist_lock.lock();
        let (consumer, delay) = {
            let mut t = self.tables.lock();
            if !t.dirty {
                return Ok(());
            }
            t.dirty = false;
            let c = ConsumerOffsetFile {
                offset_table: t
                    .consumer
                    .iter()
                    .map(|((topic, group), q)| (format!("{topic}@{group}"), q.clone()))
                    .collect(),
            };
            let d = DelayOffsetFile {
                offset_table: t.delay.clone(),
            };
            (c, d)
        };
        let result = (|| {
            let c = serde_json::to_vec(&consumer)
                .map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
            write_json_atomically(&*self.backend, &self.dir.join(CONSUMER_FILE), &c)?;
            let d = serde_json::to_vec(&delay)
                .map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
            write_json_atomically(&*self.backend, &self.dir.join(DELAY_FILE), &d)
        })();
        if result.is_err() {
            self.tables.lock().dirty = true;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemBackend;

    #[test]
    fn persist_and_reload_atomically() {
        let mem = MemBackend::new();
        let be: Arc<dyn Backend> = Arc::new(mem.clone());
        let dir = PathBuf::from("/data/config");
        let os = OffsetStore::open(be.clone(), dir.clone()).unwrap();
        os.commit("g1", "T", 0, 12);
        os.commit("g1", "T", 3, 7);
        os.commit("g2", "U", 1, 5);
        os.set_schedule_offset(3, 99);
        os.persist().unwrap();
        let text = mem.file_contents(&dir.join(CONSUMER_FILE)).unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            r#"{"offsetTable":{"T@g1":{"0":12,"3":7},"U@g2":{"1":5}}}"#
        );
        os.commit("g1", "T", 0, 13);
        // a crash now loses only the unpersisted commit
        let img = mem.crash_image(0);
        let os2 = OffsetStore::open(Arc::new(img), dir.clone()).unwrap();
        assert_eq!(os2.query("g1", "T", 0), Some(12));
        assert_eq!(os2.schedule_offset(3), Some(99));
        assert_eq!(os2.of_group("g1").len(), 2);
        assert_eq!(os2.groups_of_topic("U"), vec!["g2".to_string()]);
        os2.remove_topic("T");
        assert!(os2.of_group("g1").is_empty());
    }

    #[test]
    fn corrupt_file_is_an_error() {
        let mem = MemBackend::new();
        let be: Arc<dyn Backend> = Arc::new(mem.clone());
        let dir = PathBuf::from("/c");
        be.create_dir_all(&dir).unwrap();
        let f = be.open(&dir.join(CONSUMER_FILE), true).unwrap();
        f.write_all_at(0, b"{not json").unwrap();
        assert!(matches!(
            OffsetStore::open(be, dir),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
