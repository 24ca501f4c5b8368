//! Subscription groups (RocketMQ's `SubscriptionGroupManager`): a consumer group's settings on
//! this broker, created on first heartbeat when auto-create is on, persisted as
//! `<data>/config/subscriptionGroup.json` in RocketMQ's `SubscriptionGroupWrapper` shape.

use crate::persist::{read_json, PersistError};
use crate::topic::TableSnapshot;
pub(crate) use shoal_proto::body::SubscriptionGroupConfig;
use shoal_proto::body::SubscriptionGroupWrapper;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Checks a group name as RocketMQ clients do: 1..=255 characters of `[%|a-zA-Z0-9_-]`.
pub(crate) fn validate_group_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 255 {
        return Err(format!("group name {name:?} must have 1..=255 characters"));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-'))
    {
        return Err(format!(
            "group name {name:?} is invalid: only letters, digits and % | _ - are allowed"
        ));
    }
    Ok(())
}

/// The group table.
#[derive(Debug)]
pub(crate) struct GroupTable {
    path: Option<PathBuf>,
    inner: SubscriptionGroupWrapper,
    defaults: SubscriptionGroupConfig,
    /// Changes made so far, and how many of them are on disk.
    changes: u64,
    persisted: u64,
}

impl GroupTable {
    /// Loads the table (or starts empty); `defaults` are used for auto-created groups.
    pub(crate) fn open(
        path: Option<PathBuf>,
        defaults: SubscriptionGroupConfig,
    ) -> Result<Self, PersistError> {
        let inner = match &path {
            Some(p) => read_json(p)?.unwrap_or_default(),
            None => SubscriptionGroupWrapper::default(),
        };
        Ok(Self {
            path,
            inner,
            defaults,
            changes: 1,
            persisted: 0,
        })
    }

    /// A group's config.
    pub(crate) fn get(&self, group: &str) -> Option<&SubscriptionGroupConfig> {
        self.inner.subscription_group_table.get(group)
    }

    /// Creates a group with the defaults if missing; returns (config, created).
    pub(crate) fn ensure(&mut self, group: &str, now_ms: i64) -> (SubscriptionGroupConfig, bool) {
        if let Some(c) = self.inner.subscription_group_table.get(group) {
            return (c.clone(), false);
        }
        let c = SubscriptionGroupConfig {
            group_name: group.to_string(),
            ..self.defaults.clone()
        };
        self.upsert(c.clone(), now_ms);
        (c, true)
    }

    /// Creates or replaces a group.
    pub(crate) fn upsert(&mut self, config: SubscriptionGroupConfig, now_ms: i64) {
        self.inner
            .subscription_group_table
            .insert(config.group_name.clone(), config);
        self.inner.data_version.next_version(now_ms);
        self.changes += 1;
    }

    /// Deletes a group.
    pub(crate) fn remove(&mut self, group: &str, now_ms: i64) -> bool {
        let removed = self.inner.subscription_group_table.remove(group).is_some();
        if removed {
            self.inner.data_version.next_version(now_ms);
            self.changes += 1;
        }
        removed
    }

    /// Every group.
    pub(crate) fn all(&self) -> &BTreeMap<String, SubscriptionGroupConfig> {
        &self.inner.subscription_group_table
    }

    /// The whole table as GET_ALL_SUBSCRIPTIONGROUP_CONFIG answers it.
    pub(crate) fn wrapper(&self) -> &SubscriptionGroupWrapper {
        &self.inner
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
    pub(crate) fn snapshot(&self) -> TableSnapshot<SubscriptionGroupWrapper> {
        TableSnapshot {
            path: self.path.clone(),
            value: self.inner.clone(),
            changes: self.changes,
        }
    }

    /// Records that the snapshot taken at `changes` is on disk.
    pub(crate) fn mark_persisted(&mut self, changes: u64) {
        self.persisted = self.persisted.max(changes);
    }

    /// Number of groups.
    pub(crate) fn len(&self) -> usize {
        self.inner.subscription_group_table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_persist_reload() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config/subscriptionGroup.json");
        let mut t = GroupTable::open(Some(p.clone()), SubscriptionGroupConfig::default()).unwrap();
        let (c, created) = t.ensure("G", 1);
        assert!(created);
        assert_eq!(c.retry_max_times, 16);
        assert!(!t.ensure("G", 2).1);
        t.persist().unwrap();
        let back = GroupTable::open(Some(p.clone()), SubscriptionGroupConfig::default()).unwrap();
        assert_eq!(back.get("G").unwrap().group_name, "G");
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("\"retryQueueNums\": 1"), "{text}");
        assert!(t.remove("G", 3));
        assert!(t.get("G").is_none());
    }
}
