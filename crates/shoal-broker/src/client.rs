//! HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP (locks: [`crate::lease`]).

use crate::caller::Caller;
use crate::group_ctx::GroupCtx;
use crate::reply::{ok, ok_json, worth_logging, Handled, Reject};
use shoal_group::membership::ClientChannel;
use shoal_group::state::{ConsumerHeartbeat, ConsumerMeta};
use shoal_proto::body::{GetConsumerListByGroupResponseBody, HeartbeatData};
use shoal_proto::code::response_code as resp;
use shoal_proto::constants::{perm, retry_topic};
use shoal_proto::header::{GetConsumerListByGroupRequestHeader, UnregisterClientRequestHeader};
use shoal_proto::RemotingCommand;
use tracing::{info, warn};

/// HEART_BEAT: registers producers and consumers of a client connection. Topics and groups it
/// auto-created are made durable by the caller before the answer is sent
/// (`Shared::persist_tables`).
pub(crate) fn heartbeat(cx: &GroupCtx<'_>, caller: &Caller<'_>, req: &RemotingCommand) -> Handled {
    let body_len = req.body.as_ref().map_or(0, |b| b.len());
    if body_len > cx.config.max_heartbeat_bytes {
        return Err(refuse_heartbeat(
            cx,
            caller,
            format!(
                "heartbeat body of {body_len} bytes exceeds max_heartbeat_bytes = {}",
                cx.config.max_heartbeat_bytes
            ),
        ));
    }
    let data: HeartbeatData = req.decode_json_body()?;
    let conn_id = caller.conn_id;
    {
        let mut groups: std::collections::BTreeSet<&str> = data
            .consumer_data_set
            .iter()
            .map(|c| c.group_name.as_str())
            .collect();
        let joined = cx.groups.read(|g, _| g.clients().groups_of_conn(conn_id));
        let mut total = data.producer_data_set.len();
        for g in &joined {
            groups.insert(g.as_str());
        }
        total += groups.len();
        if total > cx.config.max_groups_per_client {
            return Err(refuse_heartbeat(
                cx,
                caller,
                format!(
                    "heartbeat names {total} producer and consumer groups for this connection, more than max_groups_per_client = {}",
                    cx.config.max_groups_per_client
                ),
            ));
        }
        if let Some(c) = data
            .consumer_data_set
            .iter()
            .find(|c| c.subscription_data_set.len() > cx.config.max_subscriptions_per_group)
        {
            return Err(refuse_heartbeat(
                cx,
                caller,
                format!(
                    "consumer group {} has {} subscriptions, more than max_subscriptions_per_group = {}",
                    c.group_name,
                    c.subscription_data_set.len(),
                    cx.config.max_subscriptions_per_group
                ),
            ));
        }
    }
    if data.client_id.is_empty() {
        return Err(Reject::new(
            resp::SYSTEM_ERROR,
            "heartbeat without clientID",
        ));
    }
    if let Some(conn) = caller.conn {
        cx.connections.remember(conn);
    }
    let channel = ClientChannel {
        conn_id,
        client_id: data.client_id.clone(),
        client_addr: caller.peer.to_string(),
        language: req.language.name().to_string(),
        version: req.version,
    };
    let session_timeout = crate::lease::requested_session_timeout(cx, req);
    let mut sessions: Vec<(String, u64)> = Vec::new();
    let mut any_sub_change = false;
    for consumer in &data.consumer_data_set {
        let group = consumer.group_name.clone();
        if group.is_empty() {
            continue;
        }
        let group_config = match cx.sub_groups.get_or_auto_create(&group) {
            Ok(c) => c,
            Err(why) => {
                warn!(group = %group, client = %data.client_id, reason = %why, "heartbeat for an unknown subscription group ignored");
                continue;
            }
        };
        if group_config.retry_queue_nums > 0 {
            let retry = retry_topic(&group);
            if let Err(e) = cx.routes.topics.ensure(
                &retry,
                group_config.retry_queue_nums,
                perm::PERM_READ_WRITE,
            ) {
                warn!(topic = %retry, error = %e, "could not create the retry topic");
            }
        }
        let hb = ConsumerHeartbeat {
            group: group.clone(),
            channel: channel.clone(),
            meta: ConsumerMeta {
                consume_type: consumer.consume_type,
                message_model: consumer.message_model,
                consume_from_where: consumer.consume_from_where,
            },
            subscriptions: (!data.without_sub).then(|| {
                consumer
                    .subscription_data_set
                    .iter()
                    .map(|s| (s.topic.clone(), s.clone()))
                    .collect()
            }),
            session_timeout_ms: session_timeout,
            // A broker without a coordinator has no coordinated groups: a client's claim (an
            // Auto consumer announces itself before it has asked every broker what it offers)
            // must not hide its classic membership, or GROUP_DESCRIBE would call the group
            // coordinated.
            coordinated: cx.config.coordinator.enabled && speaks_coordinated(req, &group),
        };
        let outcome = cx
            .groups
            .with(|g, now| g.handle_consumer_heartbeat(now, hb));
        if let Some(s) = outcome.session {
            sessions.push((group.clone(), s.id));
        }
        if outcome.joined {
            info!(group = %group, client = %data.client_id, "consumer joined or changed connection");
        }
        any_sub_change |= outcome.subscription_changed;
    }
    for producer in &data.producer_data_set {
        if !producer.group_name.is_empty() {
            cx.groups.with(|g, now| {
                g.handle_producer_heartbeat(now, &producer.group_name, channel.clone())
            });
        }
    }
    let mut r = RemotingCommand::response(resp::SUCCESS, None);
    let mut ext = shoal_proto::command::ExtFields::new();
    ext.insert("IS_SUPPORT_HEART_BEAT_V2", "false");
    ext.insert("IS_SUB_CHANGE", any_sub_change.to_string());
    if !sessions.is_empty() {
        ext.insert(
            shoal_proto::ext::field::SESSIONS,
            shoal_proto::ext::encode_sessions(sessions.iter().map(|(g, s)| (g.as_str(), *s))),
        );
    }
    r.ext_fields = Some(ext);
    Ok(Some(r))
}

/// Counts and logs a refused heartbeat; the refusal to answer.
fn refuse_heartbeat(cx: &GroupCtx<'_>, caller: &Caller<'_>, why: String) -> Reject {
    let n = cx
        .counters
        .heartbeats_refused
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    if worth_logging(n) {
        warn!(peer = %caller.peer, reason = %why, refused = n, "heartbeat refused");
    }
    Reject::new(resp::SYSTEM_ERROR, why)
}

/// True when a Shoal client's HEART_BEAT says its consumer of `group` speaks coordinated mode.
fn speaks_coordinated(req: &RemotingCommand, group: &str) -> bool {
    req.ext("shoalCoordinatedGroups")
        .is_some_and(|list| list.split(',').any(|g| g == group))
}

/// UNREGISTER_CLIENT: a client leaves a producer and/or consumer group.
pub(crate) fn unregister_client(
    cx: &GroupCtx<'_>,
    caller: &Caller<'_>,
    req: &RemotingCommand,
) -> Handled {
    let h: UnregisterClientRequestHeader = req.decode_command_header()?;
    let conn_id = caller.conn_id;
    if let Some(g) = h.producer_group.as_deref().filter(|g| !g.is_empty()) {
        cx.groups
            .with(|s, _| s.handle_unregister_producer(g, conn_id));
    }
    if let Some(g) = h.consumer_group.as_deref().filter(|g| !g.is_empty()) {
        let left = cx
            .groups
            .with(|s, now| s.handle_unregister_consumer(now, g, &h.client_id, conn_id));
        if left {
            info!(group = %g, client = %h.client_id, "consumer unregistered");
        }
    }
    ok()
}

/// GET_CONSUMER_LIST_BY_GROUP: the group's client ids (SUCCESS always carries a body).
pub(crate) fn consumer_list(cx: &GroupCtx<'_>, req: &RemotingCommand) -> Handled {
    let h: GetConsumerListByGroupRequestHeader = req.decode_command_header()?;
    let ids = cx
        .groups
        .read(|g, _| g.clients().client_ids(&h.consumer_group));
    if ids.is_empty() {
        return Err(Reject::new(
            resp::SYSTEM_ERROR,
            format!("no consumer for this group, {}", h.consumer_group),
        ));
    }
    ok_json(&GetConsumerListByGroupResponseBody {
        consumer_id_list: ids,
    })
}
