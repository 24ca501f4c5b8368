//! Metadata, CreateTopics, DeleteTopics, CreatePartitions and DescribeConfigs: the topic
//! table as Kafka clients and admin tools see it: every broker group's queues of a topic as a
//! run of partitions ([`crate::cluster`]), each led by its group's master, with the group's
//! listeners as replicas, its in-sync set as ISR and its master epoch as leader epoch (epoch
//! 0 and the leader alone for a broker that does not replicate).

use crate::cluster::{GroupReplicas, KafkaNode, Leader, TopicLayout};
use crate::host::TopicInfo;
use crate::request::{code, sb, RequestCtx};
use crate::state::{topic_id, State};
use crate::KafkaError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use std::sync::Arc;
use uuid::Uuid;

/// Longest topic name RocketMQ accepts.
const MAX_TOPIC_LEN: usize = 127;

/// Checks a topic name against the rules both sides share: RocketMQ's `[%|a-zA-Z0-9_-]`, at
/// most 127 characters (Kafka also allows `.`; Shoal does not, as RocketMQ).
pub(crate) fn valid_topic_name(name: &str) -> Result<(), KafkaError> {
    if name.is_empty() || name.len() > MAX_TOPIC_LEN {
        return Err(KafkaError::InvalidTopic(format!(
            "topic name {name:?} must have 1 to {MAX_TOPIC_LEN} characters"
        )));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-'))
    {
        return Err(KafkaError::InvalidTopic(format!(
            "topic name {name:?} may only hold letters, digits and % | _ - (RocketMQ's rule)"
        )));
    }
    Ok(())
}

fn partition_metadata(index: i32, leader: i32, r: &GroupReplicas) -> MetadataResponsePartition {
    let mut p = MetadataResponsePartition::default();
    p.partition_index = index;
    p.leader_id = BrokerId(leader);
    p.leader_epoch = r.leader_epoch;
    let listed = |nodes: &[i32]| -> Vec<BrokerId> {
        let mut out: Vec<BrokerId> = nodes.iter().copied().map(BrokerId).collect();
        if leader >= 0 && !nodes.contains(&leader) {
            out.insert(0, BrokerId(leader));
        }
        out
    };
    if leader < 0 {
        p.error_code = code(ResponseError::LeaderNotAvailable);
    }
    // The leader is always listed (the leader alone for a broker that does not replicate).
    p.replica_nodes = listed(&r.nodes);
    p.isr_nodes = listed(&r.in_sync);
    p
}

/// A topic's partitions as the cluster serves them ([`crate::cluster`]); `leaders` collects
/// the other listeners that lead some of them.
fn topic_metadata(
    state: &State,
    name: &str,
    layout: &TopicLayout,
    version: i16,
    leaders: &mut Vec<KafkaNode>,
) -> MetadataResponseTopic {
    let mut m = MetadataResponseTopic::default();
    m.name = Some(TopicName(sb(name)));
    if version >= 10 {
        m.topic_id = topic_id(name);
    }
    m.is_internal = layout.local.as_ref().is_some_and(|t| t.internal);
    let mut index = 0;
    for s in &layout.slots {
        let leader = match &s.leader {
            Leader::Here => state.node_id,
            Leader::At(n) => {
                if !leaders.contains(n) {
                    leaders.push(n.clone());
                }
                n.node_id
            }
            Leader::Unknown => -1,
        };
        for _ in 0..s.partitions.max(0) {
            m.partitions
                .push(partition_metadata(index, leader, &s.replicas));
            index += 1;
        }
    }
    m
}

fn error_topic(name: Option<&str>, id: Uuid, error: ResponseError) -> MetadataResponseTopic {
    let mut m = MetadataResponseTopic::default();
    m.name = name.map(sb).map(TopicName);
    m.topic_id = id;
    m.error_code = code(error);
    m
}

/// Creates a topic on a client's behalf (Metadata auto-creation).
fn auto_create(state: &State, name: &str) -> Result<TopicInfo, KafkaError> {
    valid_topic_name(name)?;
    let partitions = state
        .config
        .default_partitions
        .unwrap_or_else(|| state.host.default_partitions());
    match state.host.create_topic(name, partitions) {
        Ok(t) => {
            tracing::info!(topic = %name, partitions, "topic created by a Kafka client's metadata request");
            Ok(t)
        }
        Err(KafkaError::TopicExists(_)) => state
            .host
            .topic(name)
            .ok_or_else(|| KafkaError::UnknownTopic(name.into())),
        Err(e) => Err(e),
    }
}

/// Metadata: the cluster's Kafka listeners, and the requested (or all non-internal) topics
/// with every broker group's partitions ([`crate::cluster`]).
pub(crate) async fn metadata(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: MetadataRequest,
) -> MetadataResponse {
    let v = ctx.version;
    let mut resp = MetadataResponse::default();
    if v >= 2 {
        resp.cluster_id = Some(sb(&state.config.cluster_id));
    }
    let allow_auto = (v < 4 || req.allow_auto_topic_creation) && state.host.auto_create_topics();
    let wanted = match req.topics {
        None => None,
        Some(t) if t.is_empty() && v == 0 => None,
        Some(t) => Some(t),
    };
    let names: Vec<String> = wanted
        .iter()
        .flatten()
        .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
        .collect();
    let mut refresh = vec![state.host.refresh_cluster()];
    if !names.is_empty() {
        refresh.push(state.host.refresh_routes(names));
    }
    futures::future::join_all(refresh).await;
    if v >= 1 {
        // Topics change on a broker group's master: this broker's own group's names the
        // controller (a replica's listener names its master's; -1 while it has none).
        let own = state.host.broker_name();
        resp.controller_id = BrokerId(
            match state
                .host
                .kafka_masters()
                .iter()
                .find(|(name, _)| *name == own)
            {
                None | Some((_, Leader::Here)) => state.node_id,
                Some((_, Leader::At(n))) => n.node_id,
                Some((_, Leader::Unknown)) => -1,
            },
        );
    }
    let mut leaders: Vec<KafkaNode> = Vec::new();
    resp.topics = match wanted {
        None => state
            .host
            .topics()
            .iter()
            .filter(|t| !t.internal)
            .filter_map(|t| {
                let layout = state.host.topic_layout(&t.name)?;
                Some(topic_metadata(state, &t.name, &layout, v, &mut leaders))
            })
            .collect(),
        Some(list) => list
            .into_iter()
            .map(|t| match t.name {
                Some(name) => {
                    let name = name.0.to_string();
                    match state.host.topic_layout(&name) {
                        Some(layout) => topic_metadata(state, &name, &layout, v, &mut leaders),
                        None if allow_auto => match auto_create(state, &name) {
                            Ok(info) => {
                                let layout = state.host.topic_layout(&name).unwrap_or_else(|| {
                                    TopicLayout::alone(&state.host.broker_name(), info)
                                });
                                topic_metadata(state, &name, &layout, v, &mut leaders)
                            }
                            Err(e) => {
                                let mut m = error_topic(
                                    Some(&name),
                                    Uuid::nil(),
                                    ResponseError::UnknownTopicOrPartition,
                                );
                                m.error_code = e.code();
                                m
                            }
                        },
                        None => match valid_topic_name(&name) {
                            Ok(()) => error_topic(
                                Some(&name),
                                Uuid::nil(),
                                ResponseError::UnknownTopicOrPartition,
                            ),
                            Err(_) => error_topic(
                                Some(&name),
                                Uuid::nil(),
                                ResponseError::InvalidTopicException,
                            ),
                        },
                    }
                }
                None => match state
                    .topic_by_id(t.topic_id)
                    .and_then(|info| Some((state.host.topic_layout(&info.name)?, info)))
                {
                    Some((layout, info)) => {
                        topic_metadata(state, &info.name, &layout, v, &mut leaders)
                    }
                    None => error_topic(None, t.topic_id, ResponseError::UnknownTopicId),
                },
            })
            .collect(),
    };
    // This listener, every listener of the cluster, and any leader not listed yet.
    let mut me = MetadataResponseBroker::default();
    me.node_id = BrokerId(state.node_id);
    me.host = sb(&state.advertised_host);
    me.port = state.advertised_port;
    resp.brokers = vec![me];
    for n in state.host.cluster_nodes().into_iter().chain(leaders) {
        if n.node_id == state.node_id || resp.brokers.iter().any(|b| b.node_id.0 == n.node_id) {
            continue;
        }
        let mut b = MetadataResponseBroker::default();
        b.node_id = BrokerId(n.node_id);
        b.host = sb(&n.host);
        b.port = n.port;
        resp.brokers.push(b);
    }
    resp
}

fn msg(s: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.into()))
}

/// Why a table change is answered REQUEST_TIMED_OUT: made, but not known replicated.
const NOT_REPLICATED: &str =
    "made on the master of its broker group; the group's in-sync set did not acknowledge it in time";

/// Whether the table changes made so far are on the broker group's in-sync set (at once for a
/// broker that does not replicate): a change is answered only then, as a Kafka controller
/// answers once the change is committed to its log, so a new master elected right after the
/// answer has it.
async fn tables_replicated(state: &State) -> bool {
    state.host.offsets_replicated().await
}

/// [`create_topics`], answered once the topics created are replicated (REQUEST_TIMED_OUT
/// when not in time: the topic exists on the master).
pub(crate) async fn create_topics_replicated(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let changes = !req.validate_only;
    let mut resp = create_topics(state, ctx, req);
    let made = |t: &CreatableTopicResult| t.error_code == 0;
    if changes && resp.topics.iter().any(made) && !tables_replicated(state).await {
        for t in resp.topics.iter_mut().filter(|t| made(t)) {
            t.error_code = code(ResponseError::RequestTimedOut);
            if ctx.version >= 1 {
                t.error_message = msg(format!("topic {} {NOT_REPLICATED}", t.name.0));
            }
        }
    }
    resp
}

/// [`delete_topics`], answered once the deletions are replicated.
pub(crate) async fn delete_topics_replicated(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let mut resp = delete_topics(state, ctx, req);
    let made = |t: &DeletableTopicResult| t.error_code == 0;
    if resp.responses.iter().any(made) && !tables_replicated(state).await {
        for t in resp.responses.iter_mut().filter(|t| made(t)) {
            t.error_code = code(ResponseError::RequestTimedOut);
            if ctx.version >= 5 {
                t.error_message = msg(format!("the deletion was {NOT_REPLICATED}"));
            }
        }
    }
    resp
}

/// [`create_partitions`], answered once the new counts are replicated.
pub(crate) async fn create_partitions_replicated(
    state: &Arc<State>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let changes = !req.validate_only;
    let mut resp = create_partitions(state, req);
    let made = |t: &CreatePartitionsTopicResult| t.error_code == 0;
    if changes && resp.results.iter().any(made) && !tables_replicated(state).await {
        for t in resp.results.iter_mut().filter(|t| made(t)) {
            t.error_code = code(ResponseError::RequestTimedOut);
            t.error_message = msg(format!("the new count was {NOT_REPLICATED}"));
        }
    }
    resp
}

/// CreateTopics: one replica; partitions -1 take the default; `cleanup.policy=compact` is
/// refused (Shoal does not compact); other configs are accepted and reported, not applied.
pub(crate) fn create_topics(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut resp = CreateTopicsResponse::default();
    for t in req.topics {
        let name = t.name.0.to_string();
        let mut r = CreatableTopicResult::default();
        r.name = t.name.clone();
        let partitions = if t.num_partitions == -1 {
            state
                .config
                .default_partitions
                .unwrap_or_else(|| state.host.default_partitions())
        } else {
            t.num_partitions
        };
        let replicas = state.host.replica_count() as i64;
        let check = || -> Result<(), (ResponseError, String)> {
            valid_topic_name(&name)
                .map_err(|e| (ResponseError::InvalidTopicException, e.to_string()))?;
            if !(1..=65_535).contains(&partitions) {
                return Err((
                    ResponseError::InvalidPartitions,
                    format!("{partitions} partitions: must be 1..=65535"),
                ));
            }
            let rf = t.replication_factor;
            if rf != -1 && !(1..=replicas).contains(&i64::from(rf)) {
                return Err((
                    ResponseError::InvalidReplicationFactor,
                    format!(
                        "replication factor {rf} requested; this broker group keeps {replicas} \
                         cop{} of every partition (its replicas)",
                        if replicas == 1 { "y" } else { "ies" }
                    ),
                ));
            }
            if !t.assignments.is_empty() {
                return Err((
                    ResponseError::InvalidReplicaAssignment,
                    "manual replica assignments are not supported".into(),
                ));
            }
            for c in &t.configs {
                if c.name.as_str() == "cleanup.policy"
                    && c.value.as_ref().is_some_and(|v| v.contains("compact"))
                {
                    return Err((
                        ResponseError::InvalidConfig,
                        "cleanup.policy=compact is not supported: Shoal deletes by retention only"
                            .into(),
                    ));
                }
            }
            if state.host.topic(&name).is_some() {
                return Err((
                    ResponseError::TopicAlreadyExists,
                    format!("topic {name} already exists"),
                ));
            }
            Ok(())
        };
        let outcome = check().and_then(|()| {
            if req.validate_only {
                return Ok(());
            }
            state
                .host
                .create_topic(&name, partitions)
                .map(|_| ())
                .map_err(|e| {
                    (
                        ResponseError::try_from_code(e.code())
                            .unwrap_or(ResponseError::UnknownServerError),
                        e.to_string(),
                    )
                })
        });
        match outcome {
            Ok(()) => {
                if !t.configs.is_empty() {
                    let names: Vec<&str> = t.configs.iter().map(|c| c.name.as_str()).collect();
                    tracing::info!(topic = %name, configs = ?names, "CreateTopics: topic configs are not applied per topic (broker settings hold)");
                }
                if ctx.version >= 5 {
                    r.num_partitions = partitions;
                    r.replication_factor = i16::try_from(replicas).unwrap_or(i16::MAX);
                    r.configs = Some(
                        topic_config_entries(state)
                            .into_iter()
                            .map(|(k, v)| {
                                let mut c = CreatableTopicConfigs::default();
                                c.name = sb(k);
                                c.value = Some(sb(&v));
                                c.config_source = 5;
                                c
                            })
                            .collect(),
                    );
                }
                if ctx.version >= 7 {
                    r.topic_id = topic_id(&name);
                }
                if !req.validate_only {
                    tracing::info!(topic = %name, partitions, "topic created by a Kafka CreateTopics request");
                }
            }
            Err((e, m)) => {
                r.error_code = code(e);
                if ctx.version >= 1 {
                    r.error_message = msg(m);
                }
            }
        }
        resp.topics.push(r);
    }
    resp
}

/// DeleteTopics by name (or by id from v6).
pub(crate) fn delete_topics(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: DeleteTopicsRequest,
) -> DeleteTopicsResponse {
    let mut resp = DeleteTopicsResponse::default();
    let targets: Vec<(Option<String>, Uuid)> = if ctx.version >= 6 {
        req.topics
            .into_iter()
            .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
            .collect()
    } else {
        req.topic_names
            .into_iter()
            .map(|n| (Some(n.0.to_string()), Uuid::nil()))
            .collect()
    };
    for (name, id) in targets {
        let mut r = DeletableTopicResult::default();
        let name = name.or_else(|| state.topic_by_id(id).map(|t| t.name));
        r.topic_id = if ctx.version >= 6 { id } else { Uuid::nil() };
        match name {
            None => r.error_code = code(ResponseError::UnknownTopicId),
            Some(n) => {
                r.name = Some(TopicName(sb(&n)));
                if ctx.version >= 6 {
                    r.topic_id = topic_id(&n);
                }
                let result = match state.host.topic(&n) {
                    None => Err(KafkaError::UnknownTopic(n.clone())),
                    Some(t) if t.internal => Err(KafkaError::InvalidTopic(format!(
                        "{n} is an internal topic"
                    ))),
                    Some(_) => state.host.delete_topic(&n),
                };
                match result {
                    Ok(()) => {
                        tracing::info!(topic = %n, "topic deleted by a Kafka DeleteTopics request")
                    }
                    Err(e) => {
                        r.error_code = e.code();
                        if ctx.version >= 5 {
                            r.error_message = msg(e.to_string());
                        }
                    }
                }
            }
        }
        resp.responses.push(r);
    }
    resp
}

/// CreatePartitions: raises a topic's queue count.
pub(crate) fn create_partitions(
    state: &Arc<State>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut resp = CreatePartitionsResponse::default();
    for t in req.topics {
        let name = t.name.0.to_string();
        let mut r = CreatePartitionsTopicResult::default();
        r.name = t.name.clone();
        let outcome = match state.host.topic(&name) {
            None => Err((
                ResponseError::UnknownTopicOrPartition,
                format!("topic {name} does not exist"),
            )),
            Some(info) if t.count <= info.partitions => Err((
                ResponseError::InvalidPartitions,
                format!(
                    "topic {name} has {} partitions; the new count {} must be larger",
                    info.partitions, t.count
                ),
            )),
            Some(_) if t.count > 65_535 => Err((
                ResponseError::InvalidPartitions,
                "at most 65535 partitions".into(),
            )),
            Some(_) if t.assignments.as_ref().is_some_and(|a| !a.is_empty()) => Err((
                ResponseError::InvalidReplicaAssignment,
                "manual replica assignments are not supported".into(),
            )),
            Some(_) if req.validate_only => Ok(()),
            Some(_) => state.host.set_partitions(&name, t.count).map_err(|e| {
                (
                    ResponseError::try_from_code(e.code())
                        .unwrap_or(ResponseError::UnknownServerError),
                    e.to_string(),
                )
            }),
        };
        if let Err((e, m)) = outcome {
            r.error_code = code(e);
            r.error_message = msg(m);
        } else if !req.validate_only {
            tracing::info!(topic = %name, partitions = t.count, "partitions added by a Kafka CreatePartitions request");
        }
        resp.results.push(r);
    }
    resp
}

/// The configs every topic reports (broker-wide values: Shoal has no per-topic overrides).
fn topic_config_entries(state: &State) -> Vec<(&'static str, String)> {
    let retention_ms = state.host.retention_hours().saturating_mul(3_600_000);
    vec![
        ("cleanup.policy", "delete".into()),
        ("compression.type", "producer".into()),
        (
            "max.message.bytes",
            state.host.max_message_bytes().to_string(),
        ),
        ("message.timestamp.type", "CreateTime".into()),
        ("min.insync.replicas", "1".into()),
        ("retention.bytes", "-1".into()),
        ("retention.ms", retention_ms.to_string()),
    ]
}

fn broker_config_entries(state: &State) -> Vec<(&'static str, String)> {
    vec![
        (
            "auto.create.topics.enable",
            state.host.auto_create_topics().to_string(),
        ),
        ("broker.id", state.node_id.to_string()),
        (
            "group.initial.rebalance.delay.ms",
            state.config.group_initial_rebalance_delay_ms.to_string(),
        ),
        (
            "group.max.session.timeout.ms",
            state.config.group_max_session_timeout_ms.to_string(),
        ),
        (
            "group.min.session.timeout.ms",
            state.config.group_min_session_timeout_ms.to_string(),
        ),
        (
            "message.max.bytes",
            state.host.max_message_bytes().to_string(),
        ),
        (
            "num.partitions",
            state
                .config
                .default_partitions
                .unwrap_or_else(|| state.host.default_partitions())
                .to_string(),
        ),
        (
            "socket.request.max.bytes",
            state.config.max_request_bytes.to_string(),
        ),
    ]
}

/// DescribeConfigs for topics (type 2) and this broker (type 4).
pub(crate) fn describe_configs(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let mut resp = DescribeConfigsResponse::default();
    for res in req.resources {
        let mut r = DescribeConfigsResult::default();
        r.resource_type = res.resource_type;
        r.resource_name = res.resource_name.clone();
        let entries = match res.resource_type {
            2 => match state.host.topic(res.resource_name.as_str()) {
                Some(_) => Ok(topic_config_entries(state)),
                None => Err((
                    ResponseError::UnknownTopicOrPartition,
                    format!("topic {} does not exist", res.resource_name.as_str()),
                )),
            },
            4 => {
                let n = res.resource_name.as_str();
                if n.is_empty() || n == state.node_id.to_string() {
                    Ok(broker_config_entries(state))
                } else {
                    Err((
                        ResponseError::InvalidRequest,
                        format!("broker {n} is not this broker ({})", state.node_id),
                    ))
                }
            }
            t => Err((
                ResponseError::InvalidRequest,
                format!("config resource type {t} is not supported (topics and brokers are)"),
            )),
        };
        match entries {
            Ok(list) => {
                let source = if res.resource_type == 2 { 5 } else { 4 };
                r.configs = list
                    .into_iter()
                    .filter(|(k, _)| {
                        res.configuration_keys
                            .as_ref()
                            .is_none_or(|keys| keys.iter().any(|x| x.as_str() == *k))
                    })
                    .map(|(k, v)| {
                        let mut c = DescribeConfigsResourceResult::default();
                        c.name = sb(k);
                        c.value = Some(sb(&v));
                        c.read_only = true;
                        c.config_source = source;
                        if ctx.version >= 3 {
                            c.config_type = if v.parse::<i64>().is_ok() {
                                5
                            } else if v == "true" || v == "false" {
                                1
                            } else {
                                2
                            };
                            c.documentation = None;
                        } else {
                            c.documentation = Some(StrBytes::default());
                        }
                        c
                    })
                    .collect();
            }
            Err((e, m)) => {
                r.error_code = code(e);
                r.error_message = msg(m);
            }
        }
        resp.results.push(r);
    }
    resp
}
