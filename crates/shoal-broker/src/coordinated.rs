//! Coordinated mode requests (GROUP_HEARTBEAT, GROUP_LEAVE, GROUP_DESCRIBE, GROUP_HISTORY) and
//! the member-epoch fence on pulls, offset commits and lock requests.

use crate::caller::Caller;
use crate::fence::reject_of;
use crate::group_ctx::GroupCtx;
use crate::reply::{ok, ok_json, Handled, Reject};
use serde::Serialize;
use shoal_group::classic_group::ClassicMemberDescription;
use shoal_group::coordinator::{
    GroupDescription, HeartbeatRequest, MemberDescription, RebalanceRecord,
};
use shoal_group::state::GroupMode;
use shoal_proto::coordinated::{
    response_code as cresp, GroupHeartbeatRequest, GroupHeartbeatResponse, GroupLeaveRequest,
    GroupRef,
};
use shoal_proto::{MessageQueue, RemotingCommand};

/// GROUP_HEARTBEAT: join or heartbeat a coordinated group.
pub(crate) async fn heartbeat(
    cx: &GroupCtx<'_>,
    caller: &Caller<'_>,
    req: &RemotingCommand,
) -> Handled {
    if !cx.config.coordinator.enabled {
        return Err(Reject::new(
            shoal_proto::code::response_code::REQUEST_CODE_NOT_SUPPORTED,
            "this broker does not coordinate groups ([coordinator] enabled = false): allocate client-side",
        ));
    }
    let body: GroupHeartbeatRequest = req.decode_json_body()?;
    let conn_id = caller.conn_id;
    if let Some(conn) = caller.conn {
        cx.connections.remember(conn);
    }
    // The coordinator allocates every queue of the topics in the cluster.
    let mut topics: Vec<(String, Option<Vec<MessageQueue>>)> = Vec::new();
    for t in body
        .subscriptions
        .iter()
        .take(cx.config.coordinator.max_subscriptions)
    {
        topics.push((t.clone(), cx.routes.cluster_topic_queues(t).await));
    }
    let group = body.group.clone();
    if !group.is_empty() {
        cx.sub_groups.get_or_auto_create(&group).map_err(|e| {
            Reject::new(
                shoal_proto::code::response_code::SUBSCRIPTION_GROUP_NOT_EXIST,
                e,
            )
        })?;
    }
    let request = HeartbeatRequest {
        group: body.group,
        member_id: body.member_id,
        member_epoch: body.member_epoch,
        instance_id: body.instance_id,
        client_id: body.client_id,
        conn_id,
        subscriptions: body.subscriptions.into_iter().collect(),
        owned: body.owned.into_iter().collect(),
        adoptable: Default::default(),
        rebalance_timeout_ms: body.rebalance_timeout_ms,
        session_timeout_ms: body
            .session_timeout_ms
            .map(|ms| cx.config.clamp_session_timeout(ms)),
        assignor: body.assignor,
        last_epoch: body.last_epoch,
    };
    // A client that does not name its session timeout in GROUP_HEARTBEAT gets its HEART_BEAT
    // session's (already bounded), as in classic mode; else the coordinator's default.
    let result = cx
        .groups
        .with(|g, now| g.handle_group_heartbeat(now, request, topics));
    match result {
        Ok(Some(r)) => ok_json(&GroupHeartbeatResponse {
            assignment: r.assignment,
            group_epoch: r.group_epoch,
            heartbeat_interval_ms: r.heartbeat_interval_ms,
            member_epoch: r.member_epoch,
            member_id: r.member_id,
        }),
        Ok(None) => Err(Reject::new(
            cresp::GROUP_CLASSIC_MODE,
            format!(
                "group {group} has members that only speak the classic protocol: allocate client-side"
            ),
        )),
        Err(e) => Err(reject_of(&e)),
    }
}

/// GROUP_LEAVE: a member leaves (a static member's queues stay reserved unless `permanent`).
pub(crate) fn leave(cx: &GroupCtx<'_>, req: &RemotingCommand) -> Handled {
    let body: GroupLeaveRequest = req.decode_json_body()?;
    cx.groups
        .with(|g, now| g.handle_group_leave(now, &body.group, &body.member_id, body.permanent))
        .map_err(|e| reject_of(&e))?;
    ok()
}

/// A member as GROUP_DESCRIBE shows it: the coordinator's (or the listener's) view plus its
/// lag.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MemberView<M = MemberDescription> {
    #[serde(flatten)]
    member: M,
    /// Host of a coordinated member as a protocol listener saw it (Kafka members).
    #[serde(skip_serializing_if = "Option::is_none")]
    client_host: Option<String>,
    /// Messages not yet committed over its owned queues.
    lag: i64,
}

/// GROUP_DESCRIBE's answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct DescribeAnswer {
    group: String,
    mode: GroupMode,
    #[serde(skip_serializing_if = "Option::is_none")]
    group_epoch: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    target_epoch: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    assignor: Option<String>,
    /// `default` (no member asks for an assignor) or `members`.
    #[serde(skip_serializing_if = "Option::is_none")]
    assignor_source: Option<shoal_group::coordinator::AssignorSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reconciled: Option<bool>,
    members: Vec<MemberView>,
    /// Members that only speak the classic protocol (client ids).
    classic_clients: Vec<String>,
    /// The group's POP consumption on this broker, if it pops here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pop: Option<crate::pop::PopGroupView>,
}

/// GROUP_DESCRIBE's answer for a Kafka classic group of the Kafka listener.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ListenerGroupAnswer {
    group: String,
    mode: GroupMode,
    /// Kafka's state name.
    state: &'static str,
    generation: i32,
    protocol_type: Option<String>,
    /// The client-side assignor the generation chose (`range`, `cooperative-sticky`, ...).
    assignor: Option<String>,
    leader: Option<String>,
    members: Vec<MemberView<ClassicMemberDescription>>,
    classic_clients: Vec<String>,
}

/// GROUP_DESCRIBE: mode, epochs, assignor, members with owned and target queues and lag (for
/// a Kafka classic group: state, generation, assignor, leader, members with their queues).
pub(crate) fn describe(
    cx: &GroupCtx<'_>,
    pop: impl FnOnce(&str) -> Option<crate::pop::PopGroupView>,
    req: &RemotingCommand,
) -> Handled {
    let body: GroupRef = req.decode_json_body()?;
    let pop = pop(&body.group);
    let (mode, desc, classic): (GroupMode, Option<GroupDescription>, Vec<String>) =
        cx.groups.read(|g, now| {
            (
                g.mode(&body.group),
                g.coordinator().describe(&body.group, now),
                g.classic_clients(&body.group),
            )
        });
    // Lag of this broker's queues (admin clients add the other brokers').
    let lag = |q: &MessageQueue| -> i64 {
        if q.broker_name != cx.config.broker_name {
            return 0;
        }
        let max = cx.store.max_offset(&q.topic, q.queue_id) as i64;
        let committed = cx
            .store
            .query_offset(&body.group, &q.topic, q.queue_id)
            .unwrap_or(0);
        (max - committed).max(0)
    };
    if mode == GroupMode::Empty {
        // Not the coordinator's nor RocketMQ's: maybe a Kafka classic group of the listener.
        // (Called with no broker lock held.)
        let listener = cx
            .listener_groups
            .get()
            .and_then(|f| (f.describe)(&body.group));
        if let Some(d) = listener.filter(|d| !d.members.is_empty()) {
            return ok_json(&ListenerGroupAnswer {
                mode: GroupMode::KafkaClassic,
                group: d.group,
                state: d.state,
                generation: d.generation,
                protocol_type: d.protocol_type,
                assignor: d.protocol,
                leader: d.leader,
                members: d
                    .members
                    .into_iter()
                    .map(|m| MemberView {
                        lag: m.owned.iter().map(lag).sum(),
                        client_host: None,
                        member: m,
                    })
                    .collect(),
                classic_clients: Vec::new(),
            });
        }
    }
    let answer = match desc {
        Some(d) if mode == GroupMode::Coordinated => {
            let hosts: std::collections::HashMap<String, String> = cx
                .listener_groups
                .get()
                .map(|f| (f.member_hosts)(&d.group).into_iter().collect())
                .unwrap_or_default();
            DescribeAnswer {
                group: d.group,
                mode,
                group_epoch: Some(d.group_epoch),
                target_epoch: Some(d.target_epoch),
                assignor: Some(d.assignor),
                assignor_source: Some(d.assignor_source),
                reconciled: Some(d.reconciled),
                members: d
                    .members
                    .into_iter()
                    .map(|m| MemberView {
                        lag: m.owned.iter().chain(m.revoking.iter()).map(lag).sum(),
                        client_host: hosts.get(&m.member_id).cloned(),
                        member: m,
                    })
                    .collect(),
                classic_clients: classic,
                pop,
            }
        }
        _ => DescribeAnswer {
            group: body.group,
            mode,
            group_epoch: None,
            target_epoch: None,
            assignor: None,
            assignor_source: None,
            reconciled: None,
            members: Vec::new(),
            classic_clients: classic,
            pop,
        },
    };
    ok_json(&answer)
}

/// GROUP_HISTORY's answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct HistoryAnswer {
    group: String,
    rebalances: Vec<RebalanceRecord>,
}

/// GROUP_HISTORY: the group's last rebalances, oldest first.
pub(crate) fn history(cx: &GroupCtx<'_>, req: &RemotingCommand) -> Handled {
    let body: GroupRef = req.decode_json_body()?;
    let rebalances = cx.groups.read(|g, _| g.coordinator().history(&body.group));
    ok_json(&HistoryAnswer {
        group: body.group,
        rebalances,
    })
}
