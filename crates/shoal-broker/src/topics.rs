//! The owner of the broker's topic table: reads, creation (auto-creation included) and
//! changes, each of which wakes the name-server registration, so the routes follow every
//! change without the callers remembering to.

use crate::clock::wall_ms;
use crate::persist::PersistError;
use crate::topic::{TableSnapshot, TopicError, TopicTable};
use parking_lot::Mutex;
use shoal_proto::body::{TopicConfig, TopicConfigAndMappingSerializeWrapper};
use shoal_proto::MessageQueue;
use tokio::sync::Notify;

/// The topic table behind one short lock. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Topics {
    table: Mutex<TopicTable>,
    /// Wakes the registration task.
    changed: Notify,
}

/// What [`Topics::ensure`] found or did.
#[derive(Debug, Clone)]
pub(crate) struct Ensured {
    /// The topic's config.
    pub(crate) config: TopicConfig,
    /// It was created now.
    pub(crate) created: bool,
}

impl Topics {
    pub(crate) fn new(table: TopicTable) -> Self {
        Self {
            table: Mutex::new(table),
            changed: Notify::new(),
        }
    }

    /// A topic's config.
    pub(crate) fn get(&self, topic: &str) -> Option<TopicConfig> {
        self.table.lock().get(topic).cloned()
    }

    /// Reads a topic's config in place (the send path: no copy of the config).
    pub(crate) fn read<R>(&self, topic: &str, f: impl FnOnce(Option<&TopicConfig>) -> R) -> R {
        f(self.table.lock().get(topic))
    }

    /// Every topic's config.
    pub(crate) fn all(&self) -> Vec<TopicConfig> {
        self.table.lock().all().values().cloned().collect()
    }

    /// How many topics.
    pub(crate) fn len(&self) -> usize {
        self.table.lock().all().len()
    }

    /// The wrapper REGISTER_BROKER and GET_ALL_TOPIC_CONFIG carry.
    pub(crate) fn wrapper(&self) -> TopicConfigAndMappingSerializeWrapper {
        self.table.lock().wrapper()
    }

    /// The readable queues of `topic` on this broker (`broker_name`).
    pub(crate) fn queues(&self, topic: &str, broker_name: &str) -> Option<Vec<MessageQueue>> {
        let n = self.table.lock().get(topic).map(|c| c.read_queue_nums)?;
        Some(
            (0..n)
                .map(|i| MessageQueue::new(topic, broker_name, i))
                .collect(),
        )
    }

    /// The topic, created with `queues` queues and `perm` when it does not exist.
    pub(crate) fn ensure(
        &self,
        topic: &str,
        queues: i32,
        perm: i32,
    ) -> Result<Ensured, TopicError> {
        let mut t = self.table.lock();
        if let Some(c) = t.get(topic) {
            return Ok(Ensured {
                config: c.clone(),
                created: false,
            });
        }
        let config = t.ensure(topic, queues, perm, wall_ms())?;
        drop(t);
        self.changed.notify_one();
        Ok(Ensured {
            config,
            created: true,
        })
    }

    /// The topic, or created from the template a producer named (a send's auto-creation,
    /// spec 7.6): `None` when it does not exist and the template does not allow it.
    pub(crate) fn ensure_from_template(
        &self,
        topic: &str,
        template: &str,
        queues: i32,
    ) -> Result<Option<Ensured>, TopicError> {
        let mut t = self.table.lock();
        if let Some(c) = t.get(topic) {
            return Ok(Some(Ensured {
                config: c.clone(),
                created: false,
            }));
        }
        let created = t.create_from_template(topic, template, queues, wall_ms())?;
        drop(t);
        Ok(created.map(|config| {
            self.changed.notify_one();
            Ensured {
                config,
                created: true,
            }
        }))
    }

    /// Creates or changes a topic; true when something changed.
    pub(crate) fn upsert(&self, config: TopicConfig) -> Result<bool, TopicError> {
        let changed = self.table.lock().upsert(config, wall_ms())?;
        if changed {
            self.changed.notify_one();
        }
        Ok(changed)
    }

    /// Removes a topic; its config when it existed.
    pub(crate) fn remove(&self, topic: &str) -> Option<TopicConfig> {
        let removed = self.table.lock().remove(topic, wall_ms());
        if removed.is_some() {
            self.changed.notify_one();
        }
        removed
    }

    /// Writes the table now if it changed (blocking).
    pub(crate) fn persist(&self) -> Result<(), PersistError> {
        self.table.lock().persist()
    }

    /// The table has changes not on disk.
    pub(crate) fn is_dirty(&self) -> bool {
        self.table.lock().is_dirty()
    }

    /// A copy to write, if the table changed.
    pub(crate) fn snapshot_if_dirty(
        &self,
    ) -> Option<TableSnapshot<TopicConfigAndMappingSerializeWrapper>> {
        let t = self.table.lock();
        t.is_dirty().then(|| t.snapshot())
    }

    /// A snapshot's changes are on disk.
    pub(crate) fn mark_persisted(&self, changes: u64) {
        self.table.lock().mark_persisted(changes);
    }

    /// Waits until the table changes (the registration task).
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }
}
