//! Shoal's extension requests for coordinated mode (the broker as group coordinator), in the
//! range `docs/protocol-extensions.md` reserves: requests 9020–9049, response codes 9010–9029.
//! Bodies are JSON with `camelCase` fields, as RocketMQ's own.
//!
//! A coordinated member stamps its pulls, offset commits and lock requests with its member id
//! and epoch ([`stamp`]: extFields `shoalMemberId`, `shoalMemberEpoch`); a Shoal broker fences
//! stale ones with [`response_code::FENCED_MEMBER_EPOCH`] (or
//! [`response_code::UNKNOWN_MEMBER_ID`] / [`response_code::QUEUE_NOT_ASSIGNED`]); an Apache
//! RocketMQ broker ignores extFields it does not know.

use crate::{MessageQueue, RemotingCommand};
use serde::{Deserialize, Serialize};

/// Request codes of coordinated mode.
pub mod request_code {
    /// Member → coordinator: heartbeat (join with epoch 0) ([`GroupHeartbeatRequest`](super::GroupHeartbeatRequest) →
    /// [`GroupHeartbeatResponse`](super::GroupHeartbeatResponse)).
    pub const GROUP_HEARTBEAT: i32 = 9020;
    /// Member → coordinator: leave ([`GroupLeaveRequest`](super::GroupLeaveRequest)).
    pub const GROUP_LEAVE: i32 = 9021;
    /// Admin → coordinator: describe a group ([`GroupRef`](super::GroupRef) → JSON description).
    pub const GROUP_DESCRIBE: i32 = 9022;
    /// Admin → coordinator: a group's last rebalances ([`GroupRef`](super::GroupRef) → JSON list).
    pub const GROUP_HISTORY: i32 = 9023;
    /// Coordinator → member, oneway: your assignment changed, heartbeat now
    /// ([`AssignmentChangedNotice`](super::AssignmentChangedNotice)).
    pub const GROUP_ASSIGNMENT_CHANGED: i32 = 9024;
}

/// Response codes of coordinated mode.
pub mod response_code {
    /// The member epoch is stale (or ahead): drop every queue and rejoin with epoch 0.
    pub const FENCED_MEMBER_EPOCH: i32 = 9010;
    /// Not (or no longer) a member: fenced, expired, left or replaced; rejoin with epoch 0.
    pub const UNKNOWN_MEMBER_ID: i32 = 9011;
    /// A live member holds this static instance id.
    pub const UNRELEASED_INSTANCE_ID: i32 = 9012;
    /// The queue is not assigned to this member.
    pub const QUEUE_NOT_ASSIGNED: i32 = 9013;
    /// The group (or the coordinator) is full.
    pub const GROUP_FULL: i32 = 9014;
    /// The group runs in classic mode (an official client is in it): allocate client-side as
    /// RocketMQ does, and ask again later.
    pub const GROUP_CLASSIC_MODE: i32 = 9015;
    /// The request is malformed or names something the coordinator does not support.
    pub const INVALID_GROUP_REQUEST: i32 = 9016;
    /// This broker is not the group's coordinator; the remark names the one that is.
    pub const NOT_COORDINATOR: i32 = 9017;
}

/// extField carrying the member id on pulls, commits and lock requests.
pub const MEMBER_ID_EXT: &str = "shoalMemberId";
/// extField carrying the member epoch on pulls, commits and lock requests.
pub const MEMBER_EPOCH_EXT: &str = "shoalMemberEpoch";

/// extField naming the coordinator (its address) that gave the member its epoch: a broker
/// fences only stamps of its own coordinator (another coordinator's epochs mean nothing to it;
/// queue locks guard the hand-over across a coordinator move).
pub const MEMBER_COORDINATOR_EXT: &str = "shoalMemberCoordinator";

/// Adds a coordinated member's id and epoch to a request's extFields.
pub fn stamp(cmd: &mut RemotingCommand, member_id: &str, member_epoch: i32) {
    let ext = cmd.ext_fields.get_or_insert_with(Default::default);
    ext.insert(MEMBER_ID_EXT, member_id);
    ext.insert(MEMBER_EPOCH_EXT, member_epoch.to_string());
}

/// Adds the member's id and epoch and the coordinator that gave them.
pub fn stamp_from(
    cmd: &mut RemotingCommand,
    member_id: &str,
    member_epoch: i32,
    coordinator: &str,
) {
    stamp(cmd, member_id, member_epoch);
    if let Some(ext) = cmd.ext_fields.as_mut() {
        ext.insert(MEMBER_COORDINATOR_EXT, coordinator);
    }
}

/// The coordinator a stamp names, if it names one (older clients do not).
pub fn stamp_coordinator(cmd: &RemotingCommand) -> Option<&str> {
    cmd.ext(MEMBER_COORDINATOR_EXT)
}

/// The member id and epoch a request is stamped with: `None` when it is not stamped,
/// `Some(Err(..))` when the stamp is malformed.
pub fn member_stamp(cmd: &RemotingCommand) -> Option<Result<(String, i32), String>> {
    let id = cmd.ext(MEMBER_ID_EXT)?;
    let epoch = match cmd.ext(MEMBER_EPOCH_EXT) {
        Some(e) => e,
        None => return Some(Err(format!("{MEMBER_ID_EXT} without {MEMBER_EPOCH_EXT}"))),
    };
    Some(
        epoch
            .parse::<i32>()
            .map(|e| (id.to_string(), e))
            .map_err(|_| format!("{MEMBER_EPOCH_EXT} {epoch:?} is not a number")),
    )
}

/// GROUP_HEARTBEAT body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupHeartbeatRequest {
    /// Assignor the member asks for (`STICKY`, `AVG`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignor: Option<String>,
    /// Client id (`ip@instance`), as in the classic heartbeat.
    pub client_id: String,
    /// The consumer group.
    pub group: String,
    /// Static instance id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// Member epoch (0 to join).
    pub member_epoch: i32,
    /// Member id, chosen by the client, unique per incarnation.
    pub member_id: String,
    /// Queues the member holds now.
    #[serde(default)]
    pub owned: Vec<MessageQueue>,
    /// Rebalance timeout, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalance_timeout_ms: Option<u64>,
    /// Session timeout, ms: without a heartbeat for this long the member is removed and its
    /// queues go to others (the broker bounds it by its `min/max_session_timeout_ms`; absent:
    /// the member's HEART_BEAT session, else the coordinator's `session_timeout_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_timeout_ms: Option<u64>,
    /// Subscribed topics.
    #[serde(default)]
    pub subscriptions: Vec<String>,
    /// A joining member's epoch under the group's previous coordinator (the coordinator
    /// moved): the new coordinator's epochs continue above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_epoch: Option<i32>,
}

/// GROUP_HEARTBEAT answer body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupHeartbeatResponse {
    /// Queues the member may own now; it releases every other queue it holds.
    pub assignment: Vec<MessageQueue>,
    /// Group epoch.
    pub group_epoch: i32,
    /// Next heartbeat in this many ms if nothing happens.
    pub heartbeat_interval_ms: u64,
    /// Member epoch now.
    pub member_epoch: i32,
    /// Member id.
    pub member_id: String,
}

/// GROUP_LEAVE body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupLeaveRequest {
    /// The consumer group.
    pub group: String,
    /// The member.
    pub member_id: String,
    /// A static member leaving for good (otherwise its queues stay reserved until its session
    /// times out).
    #[serde(default)]
    pub permanent: bool,
}

/// GROUP_DESCRIBE / GROUP_HISTORY body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupRef {
    /// The consumer group.
    pub group: String,
}

/// GROUP_ASSIGNMENT_CHANGED body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssignmentChangedNotice {
    /// The consumer group.
    pub group: String,
    /// The member.
    pub member_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_round_trips_and_bad_stamps_are_errors() {
        let mut cmd = RemotingCommand::request(11);
        assert!(member_stamp(&cmd).is_none());
        stamp(&mut cmd, "m-1", 7);
        assert_eq!(member_stamp(&cmd), Some(Ok(("m-1".to_string(), 7))));
        if let Some(ext) = cmd.ext_fields.as_mut() {
            ext.insert(MEMBER_EPOCH_EXT, "x");
        }
        assert!(matches!(member_stamp(&cmd), Some(Err(_))));
        if let Some(ext) = cmd.ext_fields.as_mut() {
            ext.shift_remove(MEMBER_EPOCH_EXT);
        }
        assert!(matches!(member_stamp(&cmd), Some(Err(_))));
    }

    #[test]
    fn bodies_are_camel_case() {
        let r = GroupHeartbeatRequest {
            client_id: "c".into(),
            group: "G".into(),
            member_epoch: 0,
            member_id: "m".into(),
            subscriptions: vec!["T".into()],
            ..Default::default()
        };
        let s = String::from_utf8(crate::body::to_json_bytes(&r).unwrap()).unwrap();
        assert_eq!(
            s,
            r#"{"clientId":"c","group":"G","memberEpoch":0,"memberId":"m","owned":[],"subscriptions":["T"]}"#
        );
        let back: GroupHeartbeatRequest = crate::body::from_json_slice(s.as_bytes()).unwrap();
        assert_eq!(back, r);
        let r = GroupHeartbeatRequest {
            session_timeout_ms: Some(2_000),
            ..r
        };
        let s = String::from_utf8(crate::body::to_json_bytes(&r).unwrap()).unwrap();
        assert!(s.contains(r#""sessionTimeoutMs":2000"#), "{s}");
        let back: GroupHeartbeatRequest = crate::body::from_json_slice(s.as_bytes()).unwrap();
        assert_eq!(back, r);
    }
}
