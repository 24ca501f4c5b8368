//! Which brokers to tell that their group changed (RocketMQ's NOTIFY_BROKER_ROLE_CHANGED):
//! after an election or a new in-sync set, the leader tells every member of the group at once
//! instead of letting each find out at its next heartbeat. A notice is only a hint; the
//! broker asks the controller for the group and acts on that answer, so a lost, late or
//! repeated notice costs at most a heartbeat interval, never safety.
//!
//! Sans-IO: [`GroupNotices::poll`] compares what the node applied with what it saw last time
//! and returns the notices to send. Only a leader sends (it alone hears the brokers); a voter
//! that becomes leader notifies every group once. Bounded by the metadata's group limit.

use super::{ControllerNode, GroupInfo};
use crate::{BrokerId, Epoch};
use shoal_proto::code::request_code::NOTIFY_BROKER_ROLE_CHANGED;
use shoal_proto::ext_fields::ExtFields;
use shoal_proto::RemotingCommand;
use std::collections::BTreeMap;

const GROUP: &str = "brokerName";

/// What a group's notice says (the fields of RocketMQ's notice header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupNotice {
    /// The broker group.
    pub group: String,
    /// The members to tell, with their addresses.
    pub to: Vec<(BrokerId, String)>,
    /// The master, if one is elected.
    pub master: Option<BrokerId>,
    /// The master epoch.
    pub master_epoch: Epoch,
    /// The in-sync set's epoch.
    pub in_sync_epoch: Epoch,
}

impl GroupNotice {
    /// The oneway request telling a member: NOTIFY_BROKER_ROLE_CHANGED (1008) with the group
    /// and RocketMQ's header fields `masterBrokerId`, `masterAddress`, `masterEpoch` and
    /// `syncStateSetEpoch`.
    pub fn to_command(&self) -> RemotingCommand {
        let mut fields = ExtFields::default();
        fields.insert(GROUP, self.group.as_str());
        if let Some(m) = self.master {
            fields.insert("masterBrokerId", m.to_string());
            if let Some((_, addr)) = self.to.iter().find(|(id, _)| *id == m) {
                fields.insert("masterAddress", addr.as_str());
            }
        }
        fields.insert("masterEpoch", self.master_epoch.to_string());
        fields.insert("syncStateSetEpoch", self.in_sync_epoch.to_string());
        let mut cmd = RemotingCommand::request(NOTIFY_BROKER_ROLE_CHANGED).with_ext_fields(fields);
        cmd.set_oneway();
        cmd
    }

    /// The group a notice request names, if `cmd` is one.
    pub fn group_of(cmd: &RemotingCommand) -> Option<&str> {
        if cmd.code != NOTIFY_BROKER_ROLE_CHANGED {
            return None;
        }
        cmd.ext(GROUP)
    }
}

type Seen = (Option<BrokerId>, Epoch, Epoch);

/// What each group looked like when its members were last told (sans-IO).
#[derive(Debug, Default)]
pub struct GroupNotices {
    seen: BTreeMap<String, Seen>,
    applied: Option<u64>,
    leading: bool,
}

impl GroupNotices {
    /// Nothing seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The notices `node` owes its brokers now: the groups whose master, master epoch or
    /// in-sync set changed since the last call (every group once, when it has just become
    /// leader). Cheap when nothing was applied since the last call.
    pub fn poll(&mut self, node: &ControllerNode) -> Vec<GroupNotice> {
        if !node.is_leader() {
            self.leading = false;
            return Vec::new();
        }
        if self.leading && self.applied == Some(node.applied_index()) {
            return Vec::new();
        }
        if !self.leading {
            self.seen.clear();
            self.leading = true;
        }
        self.applied = Some(node.applied_index());
        let groups = node.metadata().groups();
        self.seen.retain(|g, _| groups.contains_key(g));
        let mut out = Vec::new();
        for (name, info) in groups {
            let now = key(info);
            if self.seen.get(name) == Some(&now) {
                continue;
            }
            self.seen.insert(name.clone(), now);
            out.push(GroupNotice {
                group: name.clone(),
                to: info
                    .members
                    .iter()
                    .map(|(id, m)| (*id, m.addr.clone()))
                    .collect(),
                master: info.master,
                master_epoch: info.master_epoch,
                in_sync_epoch: info.in_sync_epoch,
            });
        }
        out
    }
}

fn key(info: &GroupInfo) -> Seen {
    (info.master, info.master_epoch, info.in_sync_epoch)
}
