//! The table of consume queues: one [`ConsumeQueue`] per (topic, queue id), under
//! `consumequeue/<topic>/<queueId>/`, created on first use.

use foldhash::{HashMap, HashMapExt};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::backend::Backend;
use crate::consume_queue::ConsumeQueue;
use crate::error::{io_err, Result};
use crate::record::validate_topic;

type QueueMap = HashMap<String, HashMap<i32, Arc<ConsumeQueue>>>;

/// Every consume queue of the store, by topic and queue id.
pub(crate) struct QueueTable {
    backend: Arc<dyn Backend>,
    /// `consumequeue/` in the data directory.
    root: PathBuf,
    file_entries: u64,
    map: RwLock<QueueMap>,
}

impl QueueTable {
    /// Opens every consume queue found under `root` (directories that are not a valid topic
    /// and queue id are left alone), handing each to `found` before it joins the table
    /// (recovery checks it there).
    pub(crate) fn open(
        backend: Arc<dyn Backend>,
        root: PathBuf,
        file_entries: u64,
        mut found: impl FnMut(&str, i32, &ConsumeQueue) -> Result<()>,
    ) -> Result<Self> {
        let mut queues: QueueMap = HashMap::new();
        for topic in backend.list(&root).map_err(io_err("list", &root))? {
            if validate_topic(&topic).is_err() {
                continue;
            }
            let tdir = root.join(&topic);
            for qid in backend.list(&tdir).map_err(io_err("list", &tdir))? {
                let Ok(queue_id) = qid.parse::<i32>() else {
                    continue;
                };
                let cq = ConsumeQueue::open(backend.clone(), tdir.join(&qid), file_entries)?;
                found(&topic, queue_id, &cq)?;
                queues
                    .entry(topic.clone())
                    .or_default()
                    .insert(queue_id, Arc::new(cq));
            }
        }
        Ok(QueueTable {
            backend,
            root,
            file_entries,
            map: RwLock::new(queues),
        })
    }

    /// The consume queue of (topic, queue id), created if asked. `Ok(None)` if absent.
    pub(crate) fn get(
        &self,
        topic: &str,
        queue_id: i32,
        create: bool,
    ) -> Result<Option<Arc<ConsumeQueue>>> {
        if let Some(cq) = self.map.read().get(topic).and_then(|m| m.get(&queue_id)) {
            return Ok(Some(cq.clone()));
        }
        if !create {
            return Ok(None);
        }
        let dir = self.root.join(topic).join(queue_id.to_string());
        let cq = Arc::new(ConsumeQueue::open(
            self.backend.clone(),
            dir,
            self.file_entries,
        )?);
        let mut qs = self.map.write();
        let slot = qs.entry(topic.to_string()).or_default();
        Ok(Some(slot.entry(queue_id).or_insert(cq).clone()))
    }

    /// Every consume queue.
    pub(crate) fn all(&self) -> Vec<Arc<ConsumeQueue>> {
        self.map
            .read()
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// Every consume queue with its topic and queue id.
    pub(crate) fn named(&self) -> Vec<(String, i32, Arc<ConsumeQueue>)> {
        self.map
            .read()
            .iter()
            .flat_map(|(t, m)| m.iter().map(move |(q, cq)| (t.clone(), *q, cq.clone())))
            .collect()
    }

    /// The max offset of every consume queue, by `topic/queueId` (the clean checkpoint's list).
    pub(crate) fn max_offsets(&self) -> BTreeMap<String, u64> {
        self.map
            .read()
            .iter()
            .flat_map(|(t, m)| {
                m.iter()
                    .map(move |(q, cq)| (format!("{t}/{q}"), cq.max_offset()))
            })
            .collect()
    }

    /// The commit log offset of the newest entry across queues (a recent record), if any.
    pub(crate) fn newest_entry(&self) -> Option<u64> {
        let qs = self.map.read();
        let mut best: Option<u64> = None;
        for cq in qs.values().flat_map(|m| m.values()) {
            let max = cq.max_offset();
            if max > cq.min_offset() {
                if let Ok(Some(e)) = cq.get(max - 1) {
                    best = best.max(Some(e.phys_offset));
                }
            }
        }
        best
    }

    /// Deletes a topic's consume queues, their files and its directory.
    pub(crate) fn remove_topic(&self, topic: &str) -> Result<()> {
        let removed = self.map.write().remove(topic);
        if let Some(qs) = removed {
            for cq in qs.values() {
                cq.destroy()?;
            }
        }
        let tdir = self.root.join(topic);
        self.backend
            .remove_dir_all(&tdir)
            .map_err(io_err("remove topic dir", &tdir))
    }

    /// Topics that have consume queues, sorted.
    pub(crate) fn topics(&self) -> Vec<String> {
        let mut t: Vec<String> = self.map.read().keys().cloned().collect();
        t.sort();
        t
    }

    /// Queue ids of a topic that have consume queues, sorted.
    pub(crate) fn queue_ids(&self, topic: &str) -> Vec<i32> {
        let mut q: Vec<i32> = self
            .map
            .read()
            .get(topic)
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        q.sort_unstable();
        q
    }
}
