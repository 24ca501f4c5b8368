//! The coordinator's state as a replicated broker group carries it from its master to its
//! replicas: the master's coordinator gives [`CoordinatorUpdate`]s (the whole state of the
//! groups that changed, the groups gone, the topics' queues when they changed, and in a full
//! round the name of every group); a replica applies them in order to a
//! [`CoordinatorFollower`], which never decides anything (no timers, no members answered). A
//! replica that becomes master restores its coordinator from the follower's snapshot
//! ([`crate::state::GroupState::take_over_coordinator`]), every group's epoch moved forward,
//! so epochs only grow across a failover.

use super::group::Group;
use super::{Coordinator, CoordinatorSnapshot};
use serde::{Deserialize, Serialize};
use shoal_proto::mq::MessageQueue;
use std::collections::{BTreeMap, BTreeSet};

/// One replicated change of a coordinator's state.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CoordinatorUpdate {
    /// The whole state of these groups now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    groups: Vec<Group>,
    /// Groups the coordinator no longer has.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    removed: Vec<String>,
    /// A full round's end: every group the coordinator has; a follower drops the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    all: Option<Vec<String>>,
    /// The topics' queues, when they changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    topics: Option<BTreeMap<String, Vec<MessageQueue>>>,
}

impl CoordinatorUpdate {
    /// Groups whose state it carries or removes.
    pub fn group_count(&self) -> usize {
        self.groups.len() + self.removed.len()
    }

    /// Names of the groups whose state it carries.
    pub fn group_names(&self) -> Vec<String> {
        self.groups.iter().map(|g| g.name().to_string()).collect()
    }
}

impl Coordinator {
    /// The state of `groups` now, for the followers (a group it does not have is carried as
    /// removed).
    pub fn update_for<'a>(&self, groups: impl IntoIterator<Item = &'a str>) -> CoordinatorUpdate {
        let mut u = CoordinatorUpdate::default();
        for name in groups {
            match self.groups.get(name) {
                Some(g) => u.groups.push(g.clone()),
                None => u.removed.push(name.to_string()),
            }
        }
        u
    }

    /// A full round's closing update: the name of every group it has.
    pub fn names_update(&self) -> CoordinatorUpdate {
        CoordinatorUpdate {
            all: Some(self.groups.keys().cloned().collect()),
            ..Default::default()
        }
    }

    /// The topics' queues, for the followers, when they changed since `version` (a number
    /// this coordinator gave before; 0 the first time): the update and the version it is.
    pub fn topics_update(&self, version: u64) -> Option<(CoordinatorUpdate, u64)> {
        (version != self.topics_version).then(|| {
            (
                CoordinatorUpdate {
                    topics: Some(self.topics.clone()),
                    ..Default::default()
                },
                self.topics_version,
            )
        })
    }

    /// Every group's epoch.
    pub fn group_epochs(&self) -> BTreeMap<String, i32> {
        self.groups
            .iter()
            .map(|(n, g)| (n.clone(), g.epoch()))
            .collect()
    }
}

impl CoordinatorSnapshot {
    /// The group epoch of `group`, if the snapshot has it.
    pub fn group_epoch(&self, group: &str) -> Option<i32> {
        self.groups
            .iter()
            .find(|g| g.name() == group)
            .map(Group::epoch)
    }

    /// Names of its groups.
    pub fn group_names(&self) -> Vec<String> {
        self.groups.iter().map(|g| g.name().to_string()).collect()
    }

    /// Raises every group's epoch to at least its floor in `floors` (never lowers one).
    pub fn raise_epochs(&mut self, floors: &BTreeMap<String, i32>) {
        for g in &mut self.groups {
            if let Some(f) = floors.get(g.name()) {
                g.raise_epoch(*f);
            }
        }
    }
}

/// A replica's copy of its master's coordinator state: [`CoordinatorUpdate`]s applied in
/// order. It holds at most `max_groups` groups (the coordinator's own limit; a group beyond
/// it is left out and counted).
#[derive(Debug)]
pub struct CoordinatorFollower {
    groups: BTreeMap<String, Group>,
    topics: BTreeMap<String, Vec<MessageQueue>>,
    max_groups: usize,
    applied: u64,
    left_out: u64,
}

impl CoordinatorFollower {
    /// An empty follower holding at most `max_groups` groups.
    pub fn new(max_groups: usize) -> Self {
        Self {
            groups: BTreeMap::new(),
            topics: BTreeMap::new(),
            max_groups,
            applied: 0,
            left_out: 0,
        }
    }

    /// Applies the master's next update.
    pub fn apply(&mut self, update: CoordinatorUpdate) {
        for g in update.groups {
            let name = g.name().to_string();
            if self.groups.len() >= self.max_groups && !self.groups.contains_key(&name) {
                self.left_out += 1;
                continue;
            }
            self.groups.insert(name, g);
        }
        for name in &update.removed {
            self.groups.remove(name);
        }
        if let Some(all) = update.all {
            let keep: BTreeSet<String> = all.into_iter().collect();
            self.groups.retain(|n, _| keep.contains(n));
        }
        if let Some(t) = update.topics {
            self.topics = t;
        }
        self.applied += 1;
    }

    /// Updates applied so far (0: it knows nothing of the master's coordinator).
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// Groups left out because the follower held `max_groups` already.
    pub fn left_out(&self) -> u64 {
        self.left_out
    }

    /// Groups it holds.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// True when it holds no group.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// The group epoch of `group` as the master last replicated it.
    pub fn group_epoch(&self, group: &str) -> Option<i32> {
        self.groups.get(group).map(Group::epoch)
    }

    /// The state to restore a coordinator from.
    pub fn snapshot(&self) -> CoordinatorSnapshot {
        CoordinatorSnapshot {
            groups: self.groups.values().cloned().collect(),
            topics: self.topics.clone(),
        }
    }
}
