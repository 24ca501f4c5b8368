//! The web dashboard: static assets embedded in the binary and a JSON API. Cluster-wide views
//! go through the name server (as `shoal topic|group|message|dlq` do); the rebalance
//! timeline and the broker's own counters come from the broker of this process.

use crate::http_access::RequestAdmin;
use crate::http_state::HttpState;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use shoal_client::admin::AdminClient;
use shoal_proto::message::MessageExt;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const STYLE_CSS: &str = include_str!("dashboard/style.css");

/// Adds the dashboard's pages and API to `r`.
pub(crate) fn routes(r: Router<HttpState>) -> Router<HttpState> {
    r.route(
        "/",
        get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
    )
    .route(
        "/app.js",
        get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
    )
    .route(
        "/style.css",
        get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
    )
    .route("/api/cluster", get(cluster))
    .route("/api/topics", get(topics).post(create_topic))
    .route("/api/topics/{topic}", get(topic))
    .route("/api/groups", get(groups))
    .route("/api/groups/{group}", get(group))
    .route("/api/messages", get(messages))
    .route("/api/dlq/{group}", get(dlq))
    .route("/api/dlq/{group}/resend", post(dlq_resend))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// An API error: 404 for things that do not exist, 502 when a server could not be asked.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

impl From<shoal_client::admin::AdminError> for ApiError {
    fn from(e: shoal_client::admin::AdminError) -> Self {
        use shoal_client::admin::AdminError as E;
        let code = match &e {
            E::TopicNotFound(_) | E::GroupNotFound(_) | E::MessageNotFound(_) => {
                StatusCode::NOT_FOUND
            }
            E::Invalid(_) => StatusCode::BAD_REQUEST,
            // Refused by a server's ACL: a refusal, shown as one.
            E::Refused { code, .. } if *code == shoal_proto::code::response_code::NO_PERMISSION => {
                return ApiError(
                    StatusCode::FORBIDDEN,
                    format!("refused by the ACL (the signed-in account may not do this): {e}"),
                );
            }
            _ => StatusCode::BAD_GATEWAY,
        };
        ApiError(code, e.to_string())
    }
}

type ApiResult = Result<Json<Value>, ApiError>;

fn admin(a: &RequestAdmin) -> Result<&AdminClient, ApiError> {
    a.0.as_deref().ok_or_else(|| {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            "no name server configured".into(),
        )
    })
}

/// System topics: RocketMQ's own and the per group retry and dead-letter topics.
pub(crate) fn is_system_topic(t: &str) -> bool {
    shoal_proto::constants::is_retry_topic(t)
        || t.starts_with("%DLQ%")
        || t.starts_with("rmq_sys_")
        || matches!(
            t,
            shoal_proto::constants::AUTO_CREATE_TOPIC_KEY_TOPIC
                | shoal_proto::constants::SCHEDULE_TOPIC
                | "OFFSET_MOVED_EVENT"
                | "SELF_TEST_TOPIC"
                | "BenchmarkTest"
                | "RMQ_SYS_TRANS_HALF_TOPIC"
                | "RMQ_SYS_TRACE_TOPIC"
                | "RMQ_SYS_TRANS_OP_HALF_TOPIC"
                | "TRANS_CHECK_MAX_TIME_TOPIC"
                | "DefaultCluster"
                | "DefaultCluster_REPLY_TOPIC"
        )
        || t.ends_with("_REPLY_TOPIC")
}

/// `/api/cluster`: clusters and brokers; this broker's runtime counters.
async fn cluster(State(s): State<HttpState>, Extension(ra): Extension<RequestAdmin>) -> ApiResult {
    let info = admin(&ra)?.cluster_info().await?;
    let mut clusters = Vec::new();
    for (cluster, names) in &info.cluster_addr_table {
        let mut brokers = Vec::new();
        for name in names {
            if let Some(b) = info.broker_addr_table.get(name) {
                for (id, addr) in &b.broker_addrs {
                    brokers.push(json!({"name": name, "id": id, "addr": addr}));
                }
            }
        }
        clusters.push(json!({"name": cluster, "brokers": brokers}));
    }
    let local = s.broker.as_ref().map(|b| b.summary());
    // This broker's replication (role, epoch, in-sync set, each replica's lag), if it
    // replicates.
    let replication = s.broker.as_ref().and_then(|b| b.replication_status());
    Ok(Json(json!({
        "namesrv": s.namesrv_addrs,
        "clusters": clusters,
        "broker": local,
        "replication": replication,
    })))
}

#[derive(Debug, Deserialize)]
struct TopicsQuery {
    /// Include system topics.
    #[serde(default)]
    system: bool,
}

/// `/api/topics`: every topic with its queues and stored messages, and this broker's traffic
/// counters (the page derives rates from successive polls).
async fn topics(
    State(s): State<HttpState>,
    Extension(ra): Extension<RequestAdmin>,
    Query(q): Query<TopicsQuery>,
) -> ApiResult {
    let admin = admin(&ra)?;
    let names = admin.topic_list().await?;
    let mut out = Vec::new();
    for t in names
        .iter()
        .filter(|t| q.system || !is_system_topic(t))
        .take(500)
    {
        let Ok(route) = admin.topic_route(t).await else {
            continue;
        };
        let (read, write): (i32, i32) = route.queue_datas.iter().fold((0, 0), |(r, w), d| {
            (r + d.read_queue_nums, w + d.write_queue_nums)
        });
        let stored: i64 = match admin.topic_status(t).await {
            Ok(st) => st
                .offset_table
                .values()
                .map(|o| o.max_offset - o.min_offset)
                .sum(),
            Err(_) => 0,
        };
        let traffic = s.broker.as_ref().and_then(|b| b.topic_traffic(t));
        // RocketMQ 5's message type, from this process's broker ("any" when untyped).
        let message_type = match s.broker.as_ref().and_then(|b| b.topic(t)) {
            Some(c) => match c.message_type() {
                shoal_proto::body::TopicMessageType::Unspecified => "any",
                other => other.name(),
            },
            None => "-",
        };
        out.push(json!({
            "topic": t,
            "system": is_system_topic(t),
            "brokers": route.queue_datas.iter().map(|d| d.broker_name.clone()).collect::<Vec<_>>(),
            "messageType": message_type,
            "readQueues": read,
            "writeQueues": write,
            "messages": stored,
            "messagesIn": traffic.as_ref().map_or(0, |c| c.messages_in.load(Ordering::Relaxed)),
            "messagesOut": traffic.as_ref().map_or(0, |c| c.messages_out.load(Ordering::Relaxed)),
        }));
    }
    Ok(Json(json!({"topics": out, "atMs": now_ms()})))
}

/// `POST /api/topics`'s body.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewTopic {
    topic: String,
    #[serde(default = "default_queues")]
    queues: i32,
    #[serde(default)]
    message_type: Option<String>,
}

fn default_queues() -> i32 {
    8
}

/// `POST /api/topics`: creates a topic on every broker (as `shoal topic create`), with RocketMQ
/// 5's message type when one is given.
async fn create_topic(
    Extension(ra): Extension<RequestAdmin>,
    Json(t): Json<NewTopic>,
) -> ApiResult {
    let admin = admin(&ra)?;
    if t.queues <= 0 || t.queues > 1024 {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "queues must be 1 to 1024".into(),
        ));
    }
    let message_type = match t.message_type.as_deref().filter(|m| !m.is_empty()) {
        None => None,
        Some(m) => Some(
            shoal_proto::body::TopicMessageType::parse(m).ok_or_else(|| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("message type {m:?}: use NORMAL, FIFO, DELAY, TRANSACTION or MIXED"),
                )
            })?,
        ),
    };
    if admin.topic_route(&t.topic).await.is_ok() {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("topic {} exists already", t.topic),
        ));
    }
    let spec = shoal_client::TopicSpec {
        message_type,
        ..shoal_client::TopicSpec::new(&t.topic, t.queues)
    };
    let brokers = admin.create_topic(&spec, None).await?;
    Ok(Json(json!({
        "topic": t.topic,
        "brokers": brokers,
        "messageType": message_type.map(|m| m.name()),
    })))
}

/// `/api/topics/{topic}`: per queue offsets and last store time.
async fn topic(Extension(ra): Extension<RequestAdmin>, Path(topic): Path<String>) -> ApiResult {
    let st = admin(&ra)?.topic_status(&topic).await?;
    let queues: Vec<Value> = st
        .offset_table
        .iter()
        .map(|(mq, o)| {
            json!({"broker": mq.broker_name, "queue": mq.queue_id, "minOffset": o.min_offset,
                "maxOffset": o.max_offset, "lastStoreMs": o.last_update_timestamp})
        })
        .collect();
    Ok(Json(json!({"topic": topic, "queues": queues})))
}

fn mode_of(s: &HttpState, group: &str) -> &'static str {
    match &s.broker {
        Some(b) => match b.group_mode(group) {
            shoal_group::state::GroupMode::Classic => "classic",
            shoal_group::state::GroupMode::Coordinated => "coordinated",
            shoal_group::state::GroupMode::Empty => "-",
            shoal_group::state::GroupMode::KafkaClassic => "kafkaClassic",
        },
        None => "-",
    }
}

/// The group's state: EMPTY without members, REBALANCING while a rebalance is open or a queue
/// has no owner or several, STABLE otherwise.
fn state_of(
    s: &HttpState,
    group: &str,
    members: usize,
    p: &shoal_client::GroupProgress,
) -> &'static str {
    if members == 0 {
        return "EMPTY";
    }
    let open = s.broker.as_ref().is_some_and(|b| b.rebalancing(group));
    let (shared, unowned) = p.ownership_problems();
    let unowned_real = unowned
        .iter()
        .any(|mq| !shoal_proto::constants::is_retry_topic(&mq.topic));
    if open || !shared.is_empty() || unowned_real {
        "REBALANCING"
    } else {
        "STABLE"
    }
}

/// `/api/groups`: every group with members, mode, lag and state.
async fn groups(State(s): State<HttpState>, Extension(ra): Extension<RequestAdmin>) -> ApiResult {
    let admin = admin(&ra)?;
    let names = admin.group_list().await?;
    let mut out = Vec::new();
    for g in names.iter().take(200) {
        let members = match admin.consumer_connections(g).await {
            Ok((c, _)) => c.connection_set.len(),
            Err(_) => 0,
        };
        let Ok(p) = admin.group_progress(g).await else {
            continue;
        };
        out.push(json!({
            "group": g,
            "members": members,
            "mode": mode_of(&s, g),
            "lag": p.total_lag(),
            "state": state_of(&s, g, members, &p),
            "duplicateClientIds": p.duplicate_client_ids,
            "inconsistentTopics": p.inconsistent_topics,
        }));
    }
    Ok(Json(json!({"groups": out})))
}

/// `/api/groups/{group}`: members, each queue's owner and lag, health flags and the rebalance
/// timeline.
async fn group(
    State(s): State<HttpState>,
    Extension(ra): Extension<RequestAdmin>,
    Path(group): Path<String>,
) -> ApiResult {
    let admin = admin(&ra)?;
    let p = admin.group_progress(&group).await?;
    let conns = admin.consumer_connections(&group).await.ok();
    let members: Vec<Value> = conns
        .as_ref()
        .map(|(c, _)| {
            c.connection_set
                .iter()
                .map(|m| {
                    let owned = p
                        .queues
                        .iter()
                        .filter(|q| q.owner.as_deref().is_some_and(|o| o.split(',').any(|x| x == m.client_id)))
                        .count();
                    json!({"clientId": m.client_id, "addr": m.client_addr, "language": m.language.name(),
                        "version": m.version, "queues": owned,
                        "duplicate": p.duplicate_client_ids.contains(&m.client_id)})
                })
                .collect()
        })
        .unwrap_or_default();
    let subscriptions: BTreeMap<String, String> = conns
        .as_ref()
        .map(|(c, _)| {
            c.subscription_table
                .iter()
                .map(|(t, sd)| (t.clone(), sd.sub_string.clone()))
                .collect()
        })
        .unwrap_or_default();
    let model = conns
        .as_ref()
        .and_then(|(c, _)| c.message_model)
        .map(|m| m.name())
        .unwrap_or("-");
    let queues: Vec<Value> = p
        .queues
        .iter()
        .map(|q| {
            json!({"topic": q.mq.topic, "broker": q.mq.broker_name, "queue": q.mq.queue_id,
                "brokerOffset": q.broker_offset, "committedOffset": q.consumer_offset, "lag": q.lag,
                "owner": q.owner, "lastConsumedStoreMs": q.last_consume_timestamp})
        })
        .collect();
    let (timeline, source) = timeline(&s, &group);
    let pop = s.broker.as_ref().and_then(|b| b.pop_group(&group));
    Ok(Json(json!({
        "pop": pop,
        "group": group,
        "mode": mode_of(&s, &group),
        "messageModel": model,
        "state": state_of(&s, &group, members.len(), &p),
        "members": members,
        "subscriptions": subscriptions,
        "queues": queues,
        "totalLag": p.total_lag(),
        "duplicateClientIds": p.duplicate_client_ids,
        "inconsistentTopics": p.inconsistent_topics,
        "unreachableMembers": p.unreachable_members,
        "rebalances": timeline,
        "rebalanceSource": source,
        "atMs": now_ms(),
    })))
}

/// The group's rebalances, newest first: the coordinator's history for coordinated groups,
/// the broker's observations otherwise. Both as `{atMs, cause, moves: [{topic, queue, from,
/// to}], convergedAtMs, outcome}`.
fn timeline(s: &HttpState, group: &str) -> (Vec<Value>, &'static str) {
    let Some(b) = &s.broker else {
        return (Vec::new(), "none");
    };
    let coordinated = b.coordinator_history(group);
    if !coordinated.is_empty() {
        let rows = coordinated
            .iter()
            .rev()
            .map(|r| {
                json!({
                    "atMs": r.at_ms,
                    "cause": r.cause.to_string(),
                    "epoch": r.group_epoch,
                    "members": r.members,
                    "moves": r.moves.iter().map(|m| json!({"topic": m.queue.topic, "queue": m.queue.queue_id,
                        "broker": m.queue.broker_name, "from": m.from, "to": m.to})).collect::<Vec<_>>(),
                    "convergedAtMs": r.reconciled_at_ms,
                    "convergenceMs": r.reconcile_ms(),
                    "outcome": if r.reconciled_at_ms.is_some() { "converged" } else if r.superseded { "superseded" } else { "converging" },
                })
            })
            .collect();
        return (rows, "coordinator");
    }
    let rows = b
        .observed_rebalances(group)
        .iter()
        .rev()
        .map(|r| {
            json!({
                "atMs": r.at_ms,
                "cause": r.cause,
                "joined": r.joined,
                "left": r.left,
                "members": r.members.len(),
                "moves": r.moves.iter().map(|m| json!({"topic": m.topic, "queue": m.queue_id,
                    "from": m.from, "to": m.to, "atMs": m.at_ms})).collect::<Vec<_>>(),
                "movesDropped": r.moves_dropped,
                "convergedAtMs": r.converged_at_ms,
                "convergenceMs": r.convergence_ms(),
                "outcome": r.outcome,
            })
        })
        .collect();
    (rows, "broker")
}

fn message_json(m: &MessageExt) -> Value {
    json!({
        "msgId": m.msg_id(),
        "offsetMsgId": m.offset_msg_id(),
        "topic": m.topic,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "tags": m.tags(),
        "keys": m.keys(),
        "reconsumeTimes": m.reconsume_times,
        "bornMs": m.born_timestamp,
        "storeMs": m.store_timestamp,
        "bornHost": m.born_host.to_string(),
        "properties": m.properties,
        "body": String::from_utf8_lossy(&m.body),
    })
}

#[derive(Debug, Deserialize)]
struct MessageQuery {
    id: Option<String>,
    key: Option<String>,
    topic: Option<String>,
}

/// `/api/messages?id=..[&topic=..]` or `?key=..&topic=..`.
async fn messages(
    Extension(ra): Extension<RequestAdmin>,
    Query(q): Query<MessageQuery>,
) -> ApiResult {
    let admin = admin(&ra)?;
    let topic = q.topic.as_deref().filter(|t| !t.is_empty());
    let found = match (
        q.id.as_deref().filter(|i| !i.is_empty()),
        q.key.as_deref().filter(|k| !k.is_empty()),
    ) {
        (Some(id), _) => vec![admin.view_message(id, topic).await?],
        (None, Some(key)) => {
            let topic = topic.ok_or_else(|| {
                ApiError(StatusCode::BAD_REQUEST, "a key lookup needs a topic".into())
            })?;
            admin.query_by_key(topic, key, 64).await?
        }
        (None, None) => return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "give id=... (offset message id, or message id with topic=...) or key=...&topic=..."
                .into(),
        )),
    };
    Ok(Json(
        json!({"messages": found.iter().map(message_json).collect::<Vec<_>>()}),
    ))
}

/// `/api/dlq/{group}`: the group's dead-letter messages.
async fn dlq(Extension(ra): Extension<RequestAdmin>, Path(group): Path<String>) -> ApiResult {
    let msgs = admin(&ra)?.dlq_messages(&group, 200).await?;
    Ok(Json(
        json!({"group": group, "messages": msgs.iter().map(message_json).collect::<Vec<_>>()}),
    ))
}

#[derive(Debug, Deserialize)]
struct ResendQuery {
    /// Only this message id; all of them when absent.
    id: Option<String>,
}

/// `POST /api/dlq/{group}/resend[?id=..]`: sends dead-letter messages back to their topic.
async fn dlq_resend(
    Extension(ra): Extension<RequestAdmin>,
    Path(group): Path<String>,
    Query(q): Query<ResendQuery>,
) -> ApiResult {
    let admin = admin(&ra)?;
    let msgs = admin.dlq_messages(&group, 1000).await?;
    let chosen: Vec<&MessageExt> = msgs
        .iter()
        .filter(|m| q.id.as_deref().is_none_or(|i| m.msg_id() == i))
        .collect();
    if chosen.is_empty() {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no matching message in the dead-letter queue of {group}"),
        ));
    }
    let mut resent = Vec::new();
    for m in chosen {
        let (topic, new_id) = admin.resend_dlq_message(m).await?;
        resent.push(json!({"msgId": m.msg_id(), "topic": topic, "newOffsetMsgId": new_id}));
    }
    Ok(Json(json!({"resent": resent})))
}

fn now_ms() -> i64 {
    shoal_broker::wall_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_topics() {
        assert!(is_system_topic("TBW102"));
        assert!(is_system_topic("%RETRY%g"));
        assert!(is_system_topic("%DLQ%g"));
        assert!(is_system_topic("SCHEDULE_TOPIC_XXXX"));
        assert!(!is_system_topic("Orders"));
    }
}
