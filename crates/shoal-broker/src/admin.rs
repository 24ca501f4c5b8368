//! Admin requests: topics, subscription groups, consumer connections and progress, offsets
//! reset, runtime info, and requests forwarded to a client.

use crate::reply::{blocking, ok, ok_json, Handled, Reject};
use crate::shared::Shared;
use shoal_proto::body::{
    ConsumeStats, ConsumerConnection, ConsumerOffsetSerializeWrapper, GroupList, KVTable,
    OffsetWrapper, ResetOffsetBody, SubscriptionGroupConfig, TopicConfig, TopicFilterType,
    TopicMessageType, TopicOffset, TopicStatsTable,
};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::{AUTO_CREATE_TOPIC_KEY_TOPIC, SCHEDULE_TOPIC};
use shoal_proto::header::{
    ConsumeMessageDirectlyRequestHeader, CreateTopicRequestHeader,
    DeleteSubscriptionGroupRequestHeader, DeleteTopicRequestHeader, GetConsumeStatsRequestHeader,
    GetConsumerConnectionListRequestHeader, GetConsumerRunningInfoRequestHeader,
    GetTopicStatsInfoRequestHeader, QueryTopicConsumeByWhoRequestHeader, ResetOffsetRequestHeader,
};
use shoal_proto::message::OffsetMsgId;
use shoal_proto::{MessageQueue, RemotingCommand};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How long a request forwarded to a client may take (RocketMQ: 10 s... and the admin's own
/// timeout is usually shorter).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Clients older than V3_1_8_SNAPSHOT cannot answer forwarded requests.
const V3_1_8_SNAPSHOT: i32 = 62;

fn is_system_topic(t: &str) -> bool {
    t == AUTO_CREATE_TOPIC_KEY_TOPIC || t == SCHEDULE_TOPIC
}

/// UPDATE_AND_CREATE_TOPIC.
pub(crate) async fn create_topic(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: CreateTopicRequestHeader = req.decode_command_header()?;
    if is_system_topic(&h.topic) {
        return Err(Reject::new(
            resp::INVALID_PARAMETER,
            format!("The topic[{}] is conflict with system topic.", h.topic),
        ));
    }
    let filter = TopicFilterType::from_name(&h.topic_filter_type).ok_or_else(|| {
        Reject::new(
            resp::INVALID_PARAMETER,
            format!(
                "topicFilterType {:?} is not SINGLE_TAG or MULTI_TAG",
                h.topic_filter_type
            ),
        )
    })?;
    // RocketMQ's attribute syntax: `+key=value` sets, `-key` removes (from the topic's
    // current attributes when it exists).
    let mut attributes = b
        .topics
        .read(&h.topic, |c| c.map(|c| c.attributes.clone()))
        .unwrap_or_default();
    apply_attributes(&mut attributes, h.attributes.as_deref().unwrap_or(""))?;
    let config = TopicConfig {
        attributes,
        order: h.order,
        perm: h.perm,
        read_queue_nums: h.read_queue_nums,
        topic_filter_type: filter,
        topic_name: h.topic.clone(),
        topic_sys_flag: h.topic_sys_flag.unwrap_or(0),
        write_queue_nums: h.write_queue_nums,
    };
    let queues_before = b.topics.read(&h.topic, |c| {
        c.map(|c| (c.read_queue_nums, c.write_queue_nums))
    });
    let changed = b
        .topics
        .upsert(config)
        .map_err(|e| Reject::new(resp::INVALID_PARAMETER, e.to_string()))?;
    if changed {
        tracing::info!(topic = %h.topic, read = h.read_queue_nums, write = h.write_queue_nums, "topic created or updated");
        if let Err(e) = b.topics.persist() {
            return Err(Reject::system(e));
        }
        if queues_before.is_some_and(|q| q != (h.read_queue_nums, h.write_queue_nums)) {
            // The name servers must know the new queues before consumers look them up.
            b.register_all().await;
            // Consumers rebalance at once instead of at their next route refresh.
            b.topic_changed(&h.topic);
        }
    }
    ok()
}

/// Applies RocketMQ's attribute changes (`+key=value,-key`) to a topic's attributes; the
/// message type (`message.type`) must be one RocketMQ defines, and is stored upper case.
pub(crate) fn apply_attributes(
    attributes: &mut BTreeMap<String, String>,
    changes: &str,
) -> Result<(), Reject> {
    for item in changes.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Some(key) = item.strip_prefix('-') {
            attributes.remove(key.split('=').next().unwrap_or(key));
            continue;
        }
        let item = item.trim_start_matches('+');
        let Some((k, v)) = item.split_once('=') else {
            return Err(Reject::new(
                resp::INVALID_PARAMETER,
                format!("attribute {item:?} is not key=value"),
            ));
        };
        let v = if k == TopicMessageType::ATTRIBUTE {
            TopicMessageType::parse(v)
                .ok_or_else(|| {
                    Reject::new(
                        resp::INVALID_PARAMETER,
                        format!(
                            "message.type {v:?} is not one of NORMAL, FIFO, DELAY, TRANSACTION, MIXED, UNSPECIFIED"
                        ),
                    )
                })?
                .name()
                .to_string()
        } else {
            v.to_string()
        };
        attributes.insert(k.to_string(), v);
    }
    Ok(())
}

/// DELETE_TOPIC_IN_BROKER: the topic's config, consume queues and offsets go.
pub(crate) async fn delete_topic(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: DeleteTopicRequestHeader = req.decode_command_header()?;
    if is_system_topic(&h.topic) {
        return Err(Reject::new(
            resp::INVALID_PARAMETER,
            format!("The topic[{}] is conflict with system topic.", h.topic),
        ));
    }
    b.topics.remove(&h.topic);
    let store = b.store.clone();
    let topic = h.topic.clone();
    blocking(move || store.delete_topic(&topic).map_err(Reject::system)).await?;
    b.topics.persist().map_err(Reject::system)?;
    tracing::info!(topic = %h.topic, "topic deleted");
    ok()
}

/// GET_ALL_TOPIC_CONFIG.
pub(crate) fn all_topic_config(b: &Shared) -> Handled {
    ok_json(&b.topics.wrapper())
}

/// GET_TOPIC_CONFIG (5.x admin tools ask it before topic and consume stats): the topic's
/// config; Shoal has no static topics, so never a `mappingDetail`.
pub(crate) fn topic_config(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: shoal_proto::header::GetTopicConfigRequestHeader = req.decode_command_header()?;
    let config = b.topics.get(&h.topic).ok_or_else(|| {
        Reject::new(
            resp::TOPIC_NOT_EXIST,
            format!("No topic in this broker. topic: {}", h.topic),
        )
    })?;
    ok_json(&config)
}

/// GET_TOPIC_STATS_INFO: per queue min/max offsets and last store time.
pub(crate) async fn topic_stats(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: GetTopicStatsInfoRequestHeader = req.decode_command_header()?;
    let config = b.topics.get(&h.topic).ok_or_else(|| {
        Reject::new(
            resp::TOPIC_NOT_EXIST,
            format!("topic[{}] not exist", h.topic),
        )
    })?;
    let store = b.store.clone();
    let broker_name = b.config.broker_name.clone();
    let table = blocking(move || {
        let mut offset_table = BTreeMap::new();
        for q in 0..config.write_queue_nums.max(config.read_queue_nums) {
            let min = store.min_offset(&config.topic_name, q);
            let max = store.max_offset(&config.topic_name, q);
            let last = if max > min {
                store
                    .store_time_of(&config.topic_name, q, max - 1)
                    .map_err(Reject::system)?
                    .unwrap_or(0)
            } else {
                0
            };
            offset_table.insert(
                MessageQueue::new(config.topic_name.clone(), broker_name.clone(), q),
                TopicOffset {
                    last_update_timestamp: last,
                    max_offset: max as i64,
                    min_offset: min as i64,
                },
            );
        }
        Ok(TopicStatsTable {
            offset_table,
            topic_put_tps: 0.0,
        })
    })
    .await?;
    ok_json(&table)
}

/// Adds Shoal's group-health flags to a JSON body (extra keys Java tools ignore).
fn with_health(body: serde_json::Value, b: &Shared, group: &str) -> Result<Vec<u8>, Reject> {
    let health = b.groups.read(|g, _| g.clients().health(group));
    let mut body = body;
    if let serde_json::Value::Object(map) = &mut body {
        map.insert(
            "duplicateClientIds".into(),
            serde_json::json!(health.duplicate_client_ids),
        );
        map.insert(
            "inconsistentSubscriptionTopics".into(),
            serde_json::json!(health.inconsistent_topics),
        );
    }
    serde_json::to_vec(&body).map_err(Reject::system)
}

/// GET_CONSUMER_CONNECTION_LIST: the group's connections and subscriptions, with Shoal's
/// duplicate-client-id and inconsistent-subscription flags.
pub(crate) fn consumer_connections(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: GetConsumerConnectionListRequestHeader = req.decode_command_header()?;
    let cc = b.groups.read(|state, _| {
        let clients = state.clients();
        let g = clients.group(&h.consumer_group)?;
        Some(ConsumerConnection {
            connection_set: clients
                .members(&h.consumer_group)
                .into_iter()
                .map(|(c, _)| shoal_proto::body::Connection {
                    client_addr: c.client_addr.clone(),
                    client_id: c.client_id.clone(),
                    language: shoal_proto::LanguageCode::from_name(&c.language).unwrap_or_default(),
                    version: c.version,
                })
                .collect(),
            consume_from_where: Some(g.meta.consume_from_where),
            consume_type: Some(g.meta.consume_type),
            message_model: Some(g.meta.message_model),
            subscription_table: clients
                .group_subscriptions(&h.consumer_group)
                .cloned()
                .unwrap_or_default(),
        })
    });
    let Some(cc) = cc else {
        return Err(Reject::new(
            resp::CONSUMER_NOT_ONLINE,
            format!("the consumer group[{}] not online", h.consumer_group),
        ));
    };
    let value = serde_json::to_value(&cc).map_err(Reject::system)?;
    let body = with_health(value, b, &h.consumer_group)?;
    Ok(Some(
        RemotingCommand::response(resp::SUCCESS, None).with_body(body),
    ))
}

/// Topics a group consumes: its subscriptions and the topics it has offsets for.
fn topics_of_group(b: &Shared, group: &str) -> BTreeSet<String> {
    let mut topics: BTreeSet<String> = b.groups.read(|g, _| {
        g.clients()
            .group_subscriptions(group)
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default()
    });
    for (t, _, _) in b.store.offsets_of_group(group) {
        topics.insert(t);
    }
    topics
}

/// GET_CONSUME_STATS: per queue broker offset, consumer offset, last pulled offset and the
/// store time of the last consumed message, with Shoal's group-health flags.
pub(crate) async fn consume_stats(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: GetConsumeStatsRequestHeader = req.decode_command_header()?;
    let topics: BTreeSet<String> = match (&h.topic, &h.topic_list) {
        (Some(t), _) if !t.is_empty() => [t.clone()].into(),
        (_, Some(list)) if !list.is_empty() => list.split(',').map(str::to_string).collect(),
        _ => topics_of_group(b, &h.consumer_group),
    };
    if topics.is_empty() && !b.sub_groups.contains(&h.consumer_group) {
        return Err(Reject::new(
            resp::SUBSCRIPTION_GROUP_NOT_EXIST,
            format!("subscription group [{}] does not exist", h.consumer_group),
        ));
    }
    let mut plan = Vec::new();
    for t in &topics {
        if let Some(n) = b.topics.read(t, |c| c.map(|c| c.read_queue_nums)) {
            plan.push((t.clone(), n));
        }
    }
    if plan.is_empty() && !topics.is_empty() {
        return Err(Reject::new(
            resp::TOPIC_NOT_EXIST,
            format!(
                "none of the topics of group {} exist on this broker",
                h.consumer_group
            ),
        ));
    }
    let marks = b.observer.marks();
    let store = b.store.clone();
    let group = h.consumer_group.clone();
    let broker_name = b.config.broker_name.clone();
    let stats = blocking(move || {
        let mut offset_table = BTreeMap::new();
        for (topic, queues) in plan {
            for q in 0..queues {
                let broker_offset = store.max_offset(&topic, q) as i64;
                let consumer_offset = store.query_offset(&group, &topic, q).unwrap_or(0).max(0);
                let pull_offset = marks
                    .get(&(group.clone(), topic.clone(), q))
                    .map(|m| m.offset)
                    .unwrap_or(consumer_offset);
                let last_timestamp = if consumer_offset > 0 {
                    store
                        .store_time_of(&topic, q, (consumer_offset - 1) as u64)
                        .map_err(Reject::system)?
                        .unwrap_or(0)
                } else {
                    0
                };
                offset_table.insert(
                    MessageQueue::new(topic.clone(), broker_name.clone(), q),
                    OffsetWrapper {
                        broker_offset,
                        consumer_offset,
                        last_timestamp,
                        pull_offset,
                    },
                );
            }
        }
        Ok(ConsumeStats {
            consume_tps: 0.0,
            offset_table,
        })
    })
    .await?;
    let value = serde_json::to_value(&stats).map_err(Reject::system)?;
    let body = with_health(value, b, &h.consumer_group)?;
    Ok(Some(
        RemotingCommand::response(resp::SUCCESS, None).with_body(body),
    ))
}

async fn call_client(
    b: &Shared,
    group: &str,
    client_id: &str,
    mut req: RemotingCommand,
) -> Handled {
    let member = b.groups.read(|g, _| {
        let clients = g.clients();
        let conn_id = clients.conn_of(group, client_id)?;
        let version = clients
            .members(group)
            .into_iter()
            .find(|(c, _)| c.conn_id == conn_id)
            .map(|(c, _)| c.version)
            .unwrap_or(0);
        Some((conn_id, version))
    });
    let (conn_id, version) = member.ok_or_else(|| {
        Reject::new(
            resp::SYSTEM_ERROR,
            format!("The Consumer <{client_id}> not online in group {group}"),
        )
    })?;
    if version < V3_1_8_SNAPSHOT {
        return Err(Reject::new(
            resp::SYSTEM_ERROR,
            format!("The Consumer <{client_id}> Version <{version}> too low to finish, please upgrade it"),
        ));
    }
    let conn = b.connections.get(conn_id).ok_or_else(|| {
        Reject::new(
            resp::SYSTEM_ERROR,
            format!("The Consumer <{client_id}> connection is gone"),
        )
    })?;
    req.flag = 0;
    match conn.request(req, FORWARD_TIMEOUT).await {
        Ok(mut r) => {
            r.flag = shoal_proto::command::FLAG_RESPONSE;
            Ok(Some(r))
        }
        Err(shoal_net::NetError::Timeout { .. }) => Err(Reject::new(
            resp::CONSUME_MSG_TIMEOUT,
            format!(
                "consumer <{client_id}> did not answer within {} s",
                FORWARD_TIMEOUT.as_secs()
            ),
        )),
        Err(e) => Err(Reject::system(format!(
            "forward to consumer <{client_id}> failed: {e}"
        ))),
    }
}

/// GET_CONSUMER_RUNNING_INFO: asks the client itself and returns its answer.
pub(crate) async fn forward_to_client(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: GetConsumerRunningInfoRequestHeader = req.decode_command_header()?;
    let mut fwd = RemotingCommand::request(rc::GET_CONSUMER_RUNNING_INFO);
    fwd.ext_fields = req.ext_fields.clone();
    fwd.body = req.body.clone();
    call_client(b, &h.consumer_group, &h.client_id, fwd).await
}

/// CONSUME_MESSAGE_DIRECTLY: attaches the stored message and asks the client to consume it.
pub(crate) async fn consume_message_directly(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: ConsumeMessageDirectlyRequestHeader = req.decode_command_header()?;
    let client_id = h
        .client_id
        .clone()
        .ok_or_else(|| Reject::system("missing required header field `clientId`"))?;
    let msg_id = h
        .msg_id
        .clone()
        .ok_or_else(|| Reject::system("missing required header field `msgId`"))?;
    let id = OffsetMsgId::parse(&msg_id)?;
    let store = b.store.clone();
    let record = blocking(move || {
        store
            .message_by_physical_offset(id.commit_log_offset.max(0) as u64)
            .map_err(Reject::system)
    })
    .await?
    .ok_or_else(|| {
        Reject::new(
            resp::SYSTEM_ERROR,
            format!("can not find message by id {msg_id}"),
        )
    })?;
    let mut fwd = RemotingCommand::request(rc::CONSUME_MESSAGE_DIRECTLY);
    fwd.ext_fields = req.ext_fields.clone();
    fwd.body = Some(record);
    call_client(b, &h.consumer_group, &client_id, fwd).await
}

/// GET_BROKER_RUNTIME_INFO: counters and offsets as a string table.
pub(crate) fn runtime_info(b: &Shared) -> Handled {
    let c = &b.counters;
    let mut table = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        table.insert(k.to_string(), v);
    };
    put(
        "brokerVersion",
        shoal_proto::command::CURRENT_VERSION.to_string(),
    );
    put(
        "brokerVersionDesc",
        format!("Shoal {}", env!("CARGO_PKG_VERSION")),
    );
    put("bootTimestamp", b.started_wall_ms().to_string());
    put("runtime", format!("{} ms", b.mono_ms()));
    put("msgPutTotal", c.msgs_put.get().to_string());
    put("msgGetTotal", c.msgs_got.get().to_string());
    put("pullsHeldTotal", c.pulls_held.get().to_string());
    put("pullsHeldNow", b.holds.len().to_string());
    put(
        "notifyConsumerIdsChangedTotal",
        c.notifications_sent.get().to_string(),
    );
    put("sendsRejectedBusy", c.sends_rejected_busy.get().to_string());
    put(
        "sendsWaitingForStore",
        c.inflight_puts.load(Ordering::Relaxed).to_string(),
    );
    // Transport limits (shoal-net): how often each was hit, and what is held now.
    let n = b.net_stats.snapshot();
    for (k, v) in [
        (
            "netConnectionsOpen",
            n.connections_opened.saturating_sub(n.connections_closed),
        ),
        ("netConnectionsRefusedPerIp", n.refused_per_ip),
        ("netClosedIdle", n.closed_idle),
        ("netClosedPartialFrameBudget", n.closed_partial_budget),
        ("netClosedBadFrame", n.closed_bad_frame),
        ("netPausedInflight", n.paused_inflight),
        ("netPausedWriteQueue", n.paused_write_queue),
        ("netPartialFrameBytes", n.partial_frame_bytes),
        ("netRequestsReceived", n.requests_received),
        ("netRequestsBinaryHeader", n.requests_binary_header),
        ("netReadCalls", n.read_calls),
        ("netWriteCalls", n.write_calls),
        ("netTlsHandshakes", n.tls_handshakes),
        ("netTlsHandshakeFailures", n.tls_handshake_failures),
        ("netTlsHandshakeTimeouts", n.tls_handshake_timeouts),
        ("netPlaintextAccepted", n.plaintext_accepted),
        ("netPlaintextRefused", n.plaintext_refused),
    ] {
        put(k, v.to_string());
    }
    put(
        "commitLogMaxOffset",
        b.store.commit_log_max_offset().to_string(),
    );
    put(
        "commitLogMinOffset",
        b.store.commit_log_min_offset().to_string(),
    );
    put(
        "commitLogDiskFlushedOffset",
        b.store.commit_log_flushed_offset().to_string(),
    );
    put("clientConnections", b.connections.len().to_string());
    put(
        "consumerGroupsOnline",
        b.groups
            .read(|g, _| g.clients().group_names().len())
            .to_string(),
    );
    put("topicCount", b.topics.len().to_string());
    // The keys RocketMQ's broker reports that mqadmin (clusterList, brokerStatus) reads.
    let put_now = c.msgs_put.get();
    let got_now = c.msgs_got.get();
    let s = b.stats.snapshot();
    put("brokerActive", "true".into());
    put("msgPutTotalTodayNow", put_now.to_string());
    put("msgGetTotalTodayNow", got_now.to_string());
    put("msgPutTotalTodayMorning", s.put_today_morning.to_string());
    put("msgGetTotalTodayMorning", s.got_today_morning.to_string());
    put(
        "msgPutTotalYesterdayMorning",
        s.put_yesterday_morning.to_string(),
    );
    put(
        "msgGetTotalYesterdayMorning",
        s.got_yesterday_morning.to_string(),
    );
    put("putTps", crate::stats::format_tps(&s.put_tps));
    put("getTransferredTps", crate::stats::format_tps(&s.got_tps));
    // The 4.x tools read the key with RocketMQ's old spelling.
    put("getTransferedTps", crate::stats::format_tps(&s.got_tps));
    put(
        "sendThreadPoolQueueSize",
        c.inflight_puts.load(Ordering::Relaxed).to_string(),
    );
    put(
        "sendThreadPoolQueueCapacity",
        b.config.max_inflight_sends.to_string(),
    );
    if let Some(t) = earliest_message_time(b) {
        put("earliestMessageTimeStamp", t.to_string());
    }
    put(
        "startAcceptSendRequestTimeStamp",
        b.started_wall_ms().to_string(),
    );
    ok_json(&KVTable { table })
}

/// The store time of the oldest message in the commit log.
fn earliest_message_time(b: &Shared) -> Option<i64> {
    let record = b
        .store
        .message_by_physical_offset(b.store.commit_log_min_offset())
        .ok()??;
    let run = shoal_proto::message::decode_records(
        &record,
        &shoal_proto::message::DecodeOptions::default(),
    );
    run.messages.first().map(|m| m.store_timestamp)
}

/// INVOKE_BROKER_TO_RESET_OFFSET: moves a group's offsets of a topic to a time (or the
/// latest offset for timestamp -1), stores them, and tells online members
/// (RESET_CONSUMER_CLIENT_OFFSET). Unlike RocketMQ, an offline group is reset too.
pub(crate) async fn reset_offset(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: ResetOffsetRequestHeader = req.decode_command_header()?;
    let config = b.topics.get(&h.topic).ok_or_else(|| {
        Reject::new(
            resp::TOPIC_NOT_EXIST,
            format!("topic[{}] not exist", h.topic),
        )
    })?;
    if !b.sub_groups.contains(&h.group) {
        return Err(Reject::new(
            resp::SUBSCRIPTION_GROUP_NOT_EXIST,
            format!("subscription group not exist, {}", h.group),
        ));
    }
    let store = b.store.clone();
    let broker_name = b.config.broker_name.clone();
    let hh = h.clone();
    let table = blocking(move || {
        let mut table = BTreeMap::new();
        for q in 0..config.read_queue_nums {
            if hh.queue_id >= 0 && q != hh.queue_id {
                continue;
            }
            let target = match hh.offset {
                Some(o) if hh.queue_id >= 0 => o,
                _ if hh.timestamp == -1 => store.max_offset(&hh.topic, q) as i64,
                _ => store
                    .offset_by_timestamp(
                        &hh.topic,
                        q,
                        hh.timestamp,
                        shoal_store::BoundaryType::Lower,
                    )
                    .map_err(Reject::system)? as i64,
            };
            let current = store.query_offset(&hh.group, &hh.topic, q);
            let apply = hh.is_force || current.is_none_or(|c| target < c);
            let value = if apply {
                target
            } else {
                current.unwrap_or(target)
            };
            if apply {
                store.commit_offset(&hh.group, &hh.topic, q, target);
            }
            table.insert(
                MessageQueue::new(hh.topic.clone(), broker_name.clone(), q),
                value,
            );
        }
        Ok(table)
    })
    .await?;
    let body = ResetOffsetBody {
        offset_table: table.clone(),
    };
    let notify = shoal_proto::header::ResetOffsetRequestHeader {
        topic: h.topic.clone(),
        group: h.group.clone(),
        queue_id: h.queue_id,
        offset: h.offset,
        timestamp: h.timestamp,
        is_force: h.is_force,
        ..Default::default()
    };
    let member_conns: Vec<u64> = b.groups.read(|g, _| {
        g.clients()
            .members(&h.group)
            .into_iter()
            .map(|(c, _)| c.conn_id)
            .collect()
    });
    let conns: Vec<_> = member_conns
        .into_iter()
        .filter_map(|id| b.connections.get(id))
        .collect();
    let bytes = shoal_proto::body::to_json_bytes(&body)?;
    for conn in conns {
        let mut r = RemotingCommand::request_with_header(rc::RESET_CONSUMER_CLIENT_OFFSET, &notify)
            .with_body(bytes.clone());
        r.set_oneway();
        tokio::spawn(async move {
            let _ = conn.oneway(r).await;
        });
    }
    tracing::info!(group = %h.group, topic = %h.topic, timestamp = h.timestamp, "consumer offsets reset");
    ok_json(&body)
}

/// QUERY_TOPIC_CONSUME_BY_WHO: groups that subscribe to or have offsets for a topic.
pub(crate) fn topic_consumed_by(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: QueryTopicConsumeByWhoRequestHeader = req.decode_command_header()?;
    let mut groups: BTreeSet<String> = b
        .groups
        .read(|g, _| g.clients().groups_of_topic(&h.topic))
        .into_iter()
        .collect();
    groups.extend(b.store.groups_of_topic(&h.topic));
    ok_json(&GroupList { group_list: groups })
}

/// UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (body: SubscriptionGroupConfig).
pub(crate) fn upsert_group(b: &Shared, req: &RemotingCommand) -> Handled {
    let config: SubscriptionGroupConfig = req.decode_json_body()?;
    if config.group_name.is_empty() {
        return Err(Reject::new(resp::INVALID_PARAMETER, "groupName is empty"));
    }
    b.sub_groups.upsert(config);
    b.sub_groups.persist().map_err(Reject::system)?;
    ok()
}

/// DELETE_SUBSCRIPTIONGROUP.
pub(crate) fn delete_group(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: DeleteSubscriptionGroupRequestHeader = req.decode_command_header()?;
    b.sub_groups.remove(&h.group_name);
    b.sub_groups.persist().map_err(Reject::system)?;
    if h.clean_offset {
        b.store.remove_group_offsets(&h.group_name);
    }
    ok()
}

/// GET_ALL_CONSUMER_OFFSET: `topic@group` -> queue -> offset.
pub(crate) fn all_consumer_offsets(b: &Shared) -> Handled {
    let groups: BTreeSet<String> = b
        .sub_groups
        .names()
        .into_iter()
        .chain(b.groups.read(|g, _| g.clients().group_names()))
        .collect();
    let mut offset_table: BTreeMap<String, BTreeMap<i32, i64>> = BTreeMap::new();
    for g in groups {
        for (topic, q, o) in b.store.offsets_of_group(&g) {
            offset_table
                .entry(format!("{topic}@{g}"))
                .or_default()
                .insert(q, o);
        }
    }
    ok_json(&ConsumerOffsetSerializeWrapper {
        data_version: None,
        offset_table,
    })
}
