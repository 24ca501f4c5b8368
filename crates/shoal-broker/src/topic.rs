//! The broker's topic table (RocketMQ's `TopicConfigManager`), persisted as
//! `<data>/config/topics.json` in RocketMQ's `TopicConfigSerializeWrapper` shape.

use crate::persist::{read_json, write_json_atomic, PersistError};
use shoal_proto::body::{DataVersion, TopicConfig, TopicConfigAndMappingSerializeWrapper};
use shoal_proto::constants::{perm, AUTO_CREATE_TOPIC_KEY_TOPIC, SCHEDULE_TOPIC};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Longest topic name accepted (RocketMQ `TopicValidator`).
pub(crate) const MAX_TOPIC_LEN: usize = 127;

/// Why a topic name or config is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// Bad name.
    #[error("topic name {0:?} is invalid: {1}")]
    InvalidName(String, &'static str),
    /// Bad queue counts or permission.
    #[error("topic {0}: {1}")]
    InvalidConfig(String, String),
}

/// Per byte, whether a topic name may hold it: ASCII letters and digits, `%`, `|`, `_`, `-`.
const TOPIC_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || matches!(c, b'%' | b'|' | b'_' | b'-');
        b += 1;
    }
    table
};

/// Checks a topic name as RocketMQ does: 1..=127 characters of `[%|a-zA-Z0-9_-]`.
pub(crate) fn validate_topic_name(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::InvalidName(name.into(), "it is empty"));
    }
    if name.len() > MAX_TOPIC_LEN {
        return Err(TopicError::InvalidName(
            name.into(),
            "it is longer than 127 characters",
        ));
    }
    // By byte (every send checks its topic): a byte of a non-ASCII character is never allowed,
    // as the character is not.
    if !name.bytes().all(|b| TOPIC_BYTE[usize::from(b)]) {
        return Err(TopicError::InvalidName(
            name.into(),
            "only letters, digits and % | _ - are allowed",
        ));
    }
    Ok(())
}

/// The topic table.
#[derive(Debug)]
pub(crate) struct TopicTable {
    path: Option<PathBuf>,
    topics: BTreeMap<String, TopicConfig>,
    data_version: DataVersion,
    /// Changes made so far, and how many of them are on disk.
    changes: u64,
    persisted: u64,
}

impl TopicTable {
    /// Loads the table from `<data_dir>/config/topics.json` (or starts empty), then adds the
    /// system topics: SCHEDULE_TOPIC_XXXX (one queue per delay level) and, when auto-create is
    /// on, TBW102 (perm 7, inheritable) as RocketMQ does.
    pub(crate) fn open(
        path: Option<PathBuf>,
        delay_levels: usize,
        auto_create: bool,
        default_queue_nums: i32,
        now_ms: i64,
    ) -> Result<Self, PersistError> {
        let loaded: Option<TopicConfigAndMappingSerializeWrapper> = match &path {
            Some(p) => read_json(p)?,
            None => None,
        };
        let (topics, data_version) = match loaded {
            Some(w) => (w.topic_config_table, w.data_version),
            None => (BTreeMap::new(), DataVersion::new(now_ms)),
        };
        let mut t = Self {
            path,
            topics,
            data_version,
            changes: 1,
            persisted: 0,
        };
        let mut schedule = TopicConfig::new(SCHEDULE_TOPIC, delay_levels as i32);
        schedule.perm = perm::PERM_READ_WRITE;
        t.topics.insert(SCHEDULE_TOPIC.into(), schedule);
        if auto_create {
            let mut tbw = TopicConfig::new(AUTO_CREATE_TOPIC_KEY_TOPIC, default_queue_nums.max(8));
            tbw.perm = perm::PERM_READ_WRITE | perm::PERM_INHERIT;
            t.topics.insert(AUTO_CREATE_TOPIC_KEY_TOPIC.into(), tbw);
        } else {
            t.topics.remove(AUTO_CREATE_TOPIC_KEY_TOPIC);
        }
        Ok(t)
    }

    /// A topic's config.
    pub(crate) fn get(&self, topic: &str) -> Option<&TopicConfig> {
        self.topics.get(topic)
    }

    /// Every topic.
    pub(crate) fn all(&self) -> &BTreeMap<String, TopicConfig> {
        &self.topics
    }

    /// The data version (changes with every update).
    #[cfg(test)]
    pub(crate) fn data_version(&self) -> DataVersion {
        self.data_version
    }

    /// The wrapper sent to name servers and in GET_ALL_TOPIC_CONFIG.
    pub(crate) fn wrapper(&self) -> TopicConfigAndMappingSerializeWrapper {
        TopicConfigAndMappingSerializeWrapper {
            data_version: self.data_version,
            topic_config_table: self.topics.clone(),
            ..TopicConfigAndMappingSerializeWrapper::default()
        }
    }

    /// Creates or replaces a topic after validating it; returns true if anything changed.
    pub(crate) fn upsert(&mut self, config: TopicConfig, now_ms: i64) -> Result<bool, TopicError> {
        validate_topic_name(&config.topic_name)?;
        if !(0..=65_535).contains(&config.read_queue_nums)
            || !(0..=65_535).contains(&config.write_queue_nums)
            || config.read_queue_nums + config.write_queue_nums == 0
        {
            return Err(TopicError::InvalidConfig(
                config.topic_name.clone(),
                format!(
                    "queue counts read={} write={} must be within 0..=65535 and not both 0",
                    config.read_queue_nums, config.write_queue_nums
                ),
            ));
        }
        if !(0..=15).contains(&config.perm) {
            return Err(TopicError::InvalidConfig(
                config.topic_name.clone(),
                format!("permission {} is not within 0..=15", config.perm),
            ));
        }
        if self.topics.get(&config.topic_name) == Some(&config) {
            return Ok(false);
        }
        self.topics.insert(config.topic_name.clone(), config);
        self.data_version.next_version(now_ms);
        self.changes += 1;
        Ok(true)
    }

    /// Creates `topic` if missing with `queues` queues and `perm`; returns its config.
    pub(crate) fn ensure(
        &mut self,
        topic: &str,
        queues: i32,
        perm: i32,
        now_ms: i64,
    ) -> Result<TopicConfig, TopicError> {
        if let Some(c) = self.topics.get(topic) {
            return Ok(c.clone());
        }
        let mut c = TopicConfig::new(topic, queues);
        c.perm = perm;
        self.upsert(c.clone(), now_ms)?;
        Ok(c)
    }

    /// Creates `topic` on first send from the template `default_topic` (spec 7.6): only when
    /// the template exists and is inheritable. Queue count = min(requested, template's write
    /// queues). Returns the new config, or `None` when the template does not allow it.
    pub(crate) fn create_from_template(
        &mut self,
        topic: &str,
        default_topic: &str,
        requested_queues: i32,
        now_ms: i64,
    ) -> Result<Option<TopicConfig>, TopicError> {
        let Some(template) = self.topics.get(default_topic) else {
            return Ok(None);
        };
        if !perm::is_inherited(template.perm) {
            return Ok(None);
        }
        let queues = requested_queues.clamp(1, template.write_queue_nums.max(1));
        let mut c = TopicConfig::new(topic, queues);
        c.perm = template.perm & !perm::PERM_INHERIT;
        self.upsert(c.clone(), now_ms)?;
        Ok(Some(c))
    }

    /// Deletes a topic; returns its config if it existed.
    pub(crate) fn remove(&mut self, topic: &str, now_ms: i64) -> Option<TopicConfig> {
        let c = self.topics.remove(topic)?;
        self.data_version.next_version(now_ms);
        self.changes += 1;
        Some(c)
    }

    /// Writes the table to disk (when it has a path).
    pub(crate) fn persist(&mut self) -> Result<(), PersistError> {
        let snapshot = self.snapshot();
        snapshot.write()?;
        self.mark_persisted(snapshot.changes);
        Ok(())
    }

    /// Whether changes are not on disk yet.
    pub(crate) fn is_dirty(&self) -> bool {
        self.persisted < self.changes
    }

    /// A copy to write outside the table's lock (then [`Self::mark_persisted`]).
    pub(crate) fn snapshot(&self) -> TableSnapshot<TopicConfigAndMappingSerializeWrapper> {
        TableSnapshot {
            path: self.path.clone(),
            value: self.wrapper(),
            changes: self.changes,
        }
    }

    /// Records that the snapshot taken at `changes` is on disk.
    pub(crate) fn mark_persisted(&mut self, changes: u64) {
        self.persisted = self.persisted.max(changes);
    }
}

/// A copy of a config table to write to disk without holding the table's lock.
#[derive(Debug)]
pub(crate) struct TableSnapshot<T> {
    /// Where it goes (nothing is written without a path).
    pub path: Option<PathBuf>,
    /// The content.
    pub value: T,
    /// The table's change count when the copy was taken.
    pub changes: u64,
}

impl<T: serde::Serialize> TableSnapshot<T> {
    /// Writes the copy atomically (temp file, fsync, rename).
    pub(crate) fn write(&self) -> Result<(), PersistError> {
        match &self.path {
            Some(p) => write_json_atomic(p, &self.value),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(validate_topic_name("Topic_1-%RETRY%|x").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("a b").is_err());
        assert!(validate_topic_name("caf\u{e9}").is_err());
        // Every character below U+0300, alone and after a valid one, as the character class
        // says.
        for c in (0u32..0x300).filter_map(char::from_u32) {
            let allowed = c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-');
            assert_eq!(
                validate_topic_name(&c.to_string()).is_ok(),
                allowed,
                "{c:?}"
            );
            assert_eq!(
                validate_topic_name(&format!("a{c}")).is_ok(),
                allowed,
                "{c:?}"
            );
        }
        assert!(validate_topic_name(&"x".repeat(128)).is_err());
    }

    #[test]
    fn system_topics_and_template_creation() {
        let mut t = TopicTable::open(None, 18, true, 4, 0).unwrap();
        assert_eq!(t.get(SCHEDULE_TOPIC).unwrap().read_queue_nums, 18);
        assert_eq!(t.get("TBW102").unwrap().perm, 7);
        let c = t
            .create_from_template("T", "TBW102", 4, 1)
            .unwrap()
            .unwrap();
        assert_eq!(c.write_queue_nums, 4);
        assert_eq!(c.perm, 6);
        // A non-inheritable template does not create.
        assert!(t.create_from_template("U", "T", 4, 1).unwrap().is_none());
        let t2 = TopicTable::open(None, 18, false, 4, 0).unwrap();
        assert!(t2.get("TBW102").is_none());
    }

    #[test]
    fn upsert_versions_and_persists() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config/topics.json");
        let mut t = TopicTable::open(Some(path.clone()), 18, false, 4, 0).unwrap();
        let v0 = t.data_version();
        assert!(t.upsert(TopicConfig::new("T", 8), 5).unwrap());
        assert!(!t.upsert(TopicConfig::new("T", 8), 6).unwrap());
        assert_ne!(t.data_version(), v0);
        assert!(t.upsert(TopicConfig::new("bad topic", 8), 6).is_err());
        assert!(t.upsert(TopicConfig::new("Z", 0), 6).is_err());
        t.persist().unwrap();
        let back = TopicTable::open(Some(path), 18, false, 4, 0).unwrap();
        assert_eq!(back.get("T").unwrap().write_queue_nums, 8);
        assert_eq!(back.data_version(), t.data_version());
    }
}
