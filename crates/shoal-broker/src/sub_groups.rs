//! The owner of the subscription-group table (RocketMQ's `SubscriptionGroupManager`): reads,
//! auto-creation within `max_subscription_groups`, and changes.

use crate::clock::wall_ms;
use crate::group_config::{validate_group_name, GroupTable, SubscriptionGroupConfig};
use crate::persist::PersistError;
use crate::reply::worth_logging;
use crate::topic::TableSnapshot;
use parking_lot::Mutex;
use shoal_proto::body::SubscriptionGroupWrapper;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::{info, warn};

/// The subscription-group table behind one short lock.
#[derive(Debug)]
pub(crate) struct SubscriptionGroups {
    table: Mutex<GroupTable>,
    auto_create: bool,
    max_groups: usize,
    /// Auto-creations refused at `max_groups`.
    refused: AtomicU64,
}

impl SubscriptionGroups {
    pub(crate) fn new(table: GroupTable, auto_create: bool, max_groups: usize) -> Self {
        Self {
            table: Mutex::new(table),
            auto_create,
            max_groups,
            refused: AtomicU64::new(0),
        }
    }

    /// A group's config.
    pub(crate) fn get(&self, group: &str) -> Option<SubscriptionGroupConfig> {
        self.table.lock().get(group).cloned()
    }

    /// Whether the group exists.
    pub(crate) fn contains(&self, group: &str) -> bool {
        self.table.lock().get(group).is_some()
    }

    /// Whether members of `group` are told of membership changes (true for unknown groups).
    pub(crate) fn notifies_consumer_ids_changed(&self, group: &str) -> bool {
        self.table
            .lock()
            .get(group)
            .is_none_or(|g| g.notify_consumer_ids_changed_enable)
    }

    /// A subscription group, created with the defaults when auto-create is on. `Err` with the
    /// reason when it does not exist and may not be created: auto-create is off, the name is
    /// invalid, or `max_subscription_groups` is reached.
    pub(crate) fn get_or_auto_create(
        &self,
        group: &str,
    ) -> Result<SubscriptionGroupConfig, String> {
        let mut groups = self.table.lock();
        if let Some(c) = groups.get(group) {
            return Ok(c.clone());
        }
        if !self.auto_create {
            return Err(format!("subscription group [{group}] does not exist"));
        }
        validate_group_name(group)?;
        if groups.len() >= self.max_groups {
            drop(groups);
            let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
            if worth_logging(n) {
                warn!(%group, limit = self.max_groups, refused = n,
                    "subscription group not auto-created: max_subscription_groups reached");
            }
            return Err(format!(
                "subscription group [{group}] does not exist and cannot be auto-created: the broker holds max_subscription_groups = {} groups",
                self.max_groups
            ));
        }
        let (c, created) = groups.ensure(group, wall_ms());
        if created {
            info!(%group, "subscription group auto-created");
        }
        Ok(c)
    }

    /// The group, created with the defaults if missing; true when it was created.
    pub(crate) fn ensure(&self, group: &str) -> bool {
        self.table.lock().ensure(group, wall_ms()).1
    }

    /// Creates or replaces a group.
    pub(crate) fn upsert(&self, config: SubscriptionGroupConfig) {
        self.table.lock().upsert(config, wall_ms());
    }

    /// Deletes a group; true when it existed.
    pub(crate) fn remove(&self, group: &str) -> bool {
        self.table.lock().remove(group, wall_ms())
    }

    /// Group names.
    pub(crate) fn names(&self) -> Vec<String> {
        self.table.lock().all().keys().cloned().collect()
    }

    /// The whole table as GET_ALL_SUBSCRIPTIONGROUP_CONFIG answers it.
    pub(crate) fn wrapper(&self) -> SubscriptionGroupWrapper {
        self.table.lock().wrapper().clone()
    }

    /// Auto-creations refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Writes the table now (blocking).
    pub(crate) fn persist(&self) -> Result<(), PersistError> {
        self.table.lock().persist()
    }

    /// The table has changes not on disk.
    pub(crate) fn is_dirty(&self) -> bool {
        self.table.lock().is_dirty()
    }

    /// A copy to write, if the table changed.
    pub(crate) fn snapshot_if_dirty(&self) -> Option<TableSnapshot<SubscriptionGroupWrapper>> {
        let t = self.table.lock();
        t.is_dirty().then(|| t.snapshot())
    }

    /// A snapshot's changes are on disk.
    pub(crate) fn mark_persisted(&self, changes: u64) {
        self.table.lock().mark_persisted(changes);
    }
}
