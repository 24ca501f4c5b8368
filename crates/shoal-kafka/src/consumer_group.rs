//! KIP-848 consumer groups (`group.protocol=consumer`): ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe on `shoal_group::coordinator`, the coordinator of Shoal's
//! coordinated mode (server-side assignors, member and group epochs, revoke-then-assign
//! reconciliation, static members). A Kafka partition is the coordinator's `MessageQueue`
//! (topic, this broker, queue id).
//!
//! Kafka heartbeats leave out what did not change (subscriptions, owned partitions); the
//! coordinator wants them every time, so the last ones per member are kept here.

use crate::api::{code, sb, RequestCtx};
use crate::config::KafkaConfig;
use crate::state::{topic_id, State};
use kafka_protocol::messages::consumer_group_describe_response as cgd;
use kafka_protocol::messages::consumer_group_heartbeat_response as cgh;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use shoal_group::coordinator::{Coordinator, CoordinatorConfig, Effect, HeartbeatRequest};
use shoal_group::GroupError;
use shoal_proto::mq::MessageQueue;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Kafka's leave epochs.
const LEAVE_EPOCH: i32 = -1;
const STATIC_LEAVE_EPOCH: i32 = -2;

#[derive(Debug, Default, Clone)]
struct MemberCache {
    subscriptions: BTreeSet<String>,
    owned: BTreeSet<MessageQueue>,
    assignor: Option<String>,
    rebalance_timeout_ms: Option<u64>,
    last_sent: Option<Vec<MessageQueue>>,
    client_host: String,
}

#[derive(Debug)]
struct Inner {
    coord: Coordinator,
    members: HashMap<(String, String), MemberCache>,
}

/// The consumer groups of this listener.
#[derive(Debug)]
pub(crate) struct ConsumerGroups {
    inner: Mutex<Inner>,
    broker_name: String,
}

fn error_of(e: &GroupError) -> ResponseError {
    match e {
        GroupError::FencedMemberEpoch { .. } => ResponseError::FencedMemberEpoch,
        GroupError::UnknownMember { .. } => ResponseError::UnknownMemberId,
        GroupError::UnreleasedInstanceId { .. } => ResponseError::UnreleasedInstanceId,
        GroupError::GroupFull { .. } => ResponseError::GroupMaxSizeReached,
        GroupError::TooManyGroups(_) => ResponseError::CoordinatorNotAvailable,
        GroupError::UnknownStrategy(_) => ResponseError::UnsupportedAssignor,
        _ => ResponseError::InvalidRequest,
    }
}

/// Kafka's server-side assignor names (`uniform`, `range`) and Shoal's strategy names.
fn assignor_name(kafka: &str) -> String {
    match kafka {
        "uniform" => "STICKY".to_string(),
        "range" => "RANGE".to_string(),
        other => other.to_ascii_uppercase().replace('-', "_"),
    }
}

impl ConsumerGroups {
    pub fn new(config: &KafkaConfig, broker_name: String) -> ConsumerGroups {
        let cc = CoordinatorConfig {
            heartbeat_interval_ms: config.consumer_heartbeat_interval_ms,
            session_timeout_ms: config.consumer_session_timeout_ms,
            max_members_per_group: config.group_max_size,
            max_groups: config.max_groups,
            ..CoordinatorConfig::default()
        };
        ConsumerGroups {
            inner: Mutex::new(Inner {
                coord: Coordinator::new(cc),
                members: HashMap::new(),
            }),
            broker_name,
        }
    }

    fn queue(&self, topic: &str, partition: i32) -> MessageQueue {
        MessageQueue {
            topic: topic.to_string(),
            broker_name: self.broker_name.clone(),
            queue_id: partition,
        }
    }

    fn apply_effects(inner: &mut Inner) {
        for e in inner.coord.drain_effects() {
            if let Effect::MemberRemoved {
                group, member_id, ..
            } = e
            {
                tracing::info!(group = %group, member = %member_id, "kafka consumer-group member removed");
                inner.members.remove(&(group, member_id));
            }
        }
    }

    /// Runs the coordinator's timers; returns its next deadline.
    pub fn tick(&self, now: u64) -> Option<u64> {
        let mut inner = self.inner.lock();
        inner.coord.tick(now);
        Self::apply_effects(&mut inner);
        inner.coord.next_deadline()
    }

    /// Whether the coordinator knows this group (it then fences the group's commits).
    pub fn has_group(&self, group: &str) -> bool {
        self.inner
            .lock()
            .coord
            .group_names()
            .iter()
            .any(|g| g == group)
    }

    /// Offset-commit fencing for a consumer-group member at `epoch`.
    pub fn validate_commit(
        &self,
        group: &str,
        member_id: &str,
        epoch: i32,
        topic: &str,
        partition: i32,
    ) -> Result<(), ResponseError> {
        let q = self.queue(topic, partition);
        match self
            .inner
            .lock()
            .coord
            .validate(group, member_id, epoch, &q)
        {
            Ok(()) => Ok(()),
            Err(GroupError::FencedMemberEpoch { .. }) => Err(ResponseError::StaleMemberEpoch),
            Err(e) => Err(error_of(&e)),
        }
    }

    /// Group names with their state (for ListGroups).
    pub fn list(&self, now: u64) -> Vec<(String, &'static str)> {
        let inner = self.inner.lock();
        inner
            .coord
            .group_names()
            .into_iter()
            .map(|g| {
                let st = match inner.coord.describe(&g, now) {
                    Some(d) if d.members.is_empty() => "Empty",
                    Some(d) if d.reconciled => "Stable",
                    Some(_) => "Reconciling",
                    None => "Dead",
                };
                (g, st)
            })
            .collect()
    }

    /// Forgets an empty group (DeleteGroups).
    pub fn delete(&self, group: &str, now: u64) -> Result<bool, ResponseError> {
        let mut inner = self.inner.lock();
        if !inner.coord.group_names().iter().any(|g| g == group) {
            return Ok(false);
        }
        if inner.coord.has_members(group) {
            return Err(ResponseError::NonEmptyGroup);
        }
        inner.coord.clear_group(group, now);
        Ok(true)
    }
}

/// ConsumerGroupHeartbeat.
pub(crate) fn heartbeat(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    let cg = &state.consumer_groups;
    let group = req.group_id.0.to_string();
    let now = state.now_ms();
    let mut resp = ConsumerGroupHeartbeatResponse::default();
    let fail = |mut resp: ConsumerGroupHeartbeatResponse, e: ResponseError, m: String| {
        if e == ResponseError::InvalidRequest || e == ResponseError::UnsupportedAssignor {
            tracing::info!(group = %req.group_id.0.as_str(), error = %m, "ConsumerGroupHeartbeat refused");
        }
        resp.error_code = code(e);
        resp.error_message = Some(StrBytes::from_string(m));
        resp
    };
    if group.is_empty() {
        return fail(
            resp,
            ResponseError::InvalidGroupId,
            "group id is empty".into(),
        );
    }
    if state.groups.has_members(&group) {
        return fail(
            resp,
            ResponseError::GroupIdNotFound,
            format!("group {group} is a classic group with members"),
        );
    }
    if req
        .subscribed_topic_regex
        .as_ref()
        .is_some_and(|r| !r.is_empty())
    {
        return fail(
            resp,
            ResponseError::InvalidRequest,
            "regular-expression subscriptions are not supported by Shoal's Kafka listener".into(),
        );
    }
    let mut member_id = req.member_id.to_string();
    if member_id.is_empty() {
        if req.member_epoch != 0 || ctx.version >= 1 {
            return fail(
                resp,
                ResponseError::UnknownMemberId,
                "member id is empty".into(),
            );
        }
        member_id = uuid::Uuid::from_bytes(rand::random()).simple().to_string();
    }
    let key = (group.clone(), member_id.clone());
    let mut inner = cg.inner.lock();
    if req.member_epoch == LEAVE_EPOCH || req.member_epoch == STATIC_LEAVE_EPOCH {
        let permanent = req.member_epoch == LEAVE_EPOCH || req.instance_id.is_none();
        if let Err(e) = inner.coord.leave(&group, &member_id, permanent, now) {
            let e = error_of(&e);
            drop(inner);
            return fail(resp, e, "leave failed".into());
        }
        inner.members.remove(&key);
        ConsumerGroups::apply_effects(&mut inner);
        resp.member_id = Some(sb(&member_id));
        resp.member_epoch = req.member_epoch;
        return resp;
    }
    let mut cache = inner.members.get(&key).cloned().unwrap_or_default();
    if req.member_epoch == 0 {
        let Some(subs) = &req.subscribed_topic_names else {
            drop(inner);
            return fail(
                resp,
                ResponseError::InvalidRequest,
                "a joining member must send its subscription".into(),
            );
        };
        cache = MemberCache {
            subscriptions: subs.iter().map(|t| t.0.to_string()).collect(),
            ..MemberCache::default()
        };
    } else if let Some(subs) = &req.subscribed_topic_names {
        cache.subscriptions = subs.iter().map(|t| t.0.to_string()).collect();
    }
    if let Some(owned) = &req.topic_partitions {
        let topics = state.host.topics();
        let mut set = BTreeSet::new();
        for tp in owned {
            if let Some(t) = topics.iter().find(|t| topic_id(&t.name) == tp.topic_id) {
                for p in &tp.partitions {
                    set.insert(cg.queue(&t.name, *p));
                }
            }
        }
        cache.owned = set;
    }
    if let Some(a) = &req.server_assignor {
        cache.assignor = Some(assignor_name(a.as_str()));
    }
    if req.rebalance_timeout_ms > 0 {
        cache.rebalance_timeout_ms = Some(req.rebalance_timeout_ms as u64);
    }
    cache.client_host = format!("/{}", ctx.peer.ip());
    // The coordinator learns the subscribed topics' partitions from here.
    for t in &cache.subscriptions {
        if let Some(info) = state.host.topic(t) {
            let known = inner.coord.topic_queues(t).map_or(0, |q| q.len());
            if known != info.partitions.max(0) as usize {
                let queues = (0..info.partitions).map(|p| cg.queue(t, p)).collect();
                inner.coord.set_topic_queues(t, queues, now);
            }
        }
    }
    let hb = HeartbeatRequest {
        group: group.clone(),
        member_id: member_id.clone(),
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.as_ref().map(|s| s.to_string()),
        client_id: ctx.client_id.to_string(),
        conn_id: 0,
        subscriptions: cache.subscriptions.clone(),
        owned: cache.owned.clone(),
        adoptable: BTreeSet::new(),
        rebalance_timeout_ms: cache.rebalance_timeout_ms,
        assignor: cache.assignor.clone(),
    };
    match inner.coord.heartbeat(hb, now) {
        Ok(r) => {
            resp.member_id = Some(sb(&r.member_id));
            resp.member_epoch = r.member_epoch;
            resp.heartbeat_interval_ms = r.heartbeat_interval_ms.min(i32::MAX as u64) as i32;
            let changed = cache.last_sent.as_ref() != Some(&r.assignment) || req.member_epoch == 0;
            if changed {
                let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                for q in &r.assignment {
                    by_topic
                        .entry(q.topic.clone())
                        .or_default()
                        .push(q.queue_id);
                }
                let mut a = cgh::Assignment::default();
                a.topic_partitions = by_topic
                    .into_iter()
                    .map(|(t, mut ps)| {
                        ps.sort_unstable();
                        let mut tp = cgh::TopicPartitions::default();
                        tp.topic_id = topic_id(&t);
                        tp.partitions = ps;
                        tp
                    })
                    .collect();
                resp.assignment = Some(a);
                cache.last_sent = Some(r.assignment.clone());
            }
            inner
                .members
                .insert((group.clone(), r.member_id.clone()), cache);
            ConsumerGroups::apply_effects(&mut inner);
            drop(inner);
            if let Err(e) = state.host.ensure_group(&group) {
                tracing::debug!(group = %group, error = %e, "Kafka group not registered as a subscription group");
            }
            resp
        }
        Err(e) => {
            let code_e = error_of(&e);
            if code_e == ResponseError::UnknownMemberId
                || code_e == ResponseError::FencedMemberEpoch
            {
                inner.members.remove(&key);
            }
            ConsumerGroups::apply_effects(&mut inner);
            drop(inner);
            fail(resp, code_e, e.to_string())
        }
    }
}

fn assignment(queues: &[MessageQueue]) -> cgd::Assignment {
    let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for q in queues {
        by_topic
            .entry(q.topic.clone())
            .or_default()
            .push(q.queue_id);
    }
    let mut a = cgd::Assignment::default();
    a.topic_partitions = by_topic
        .into_iter()
        .map(|(t, mut ps)| {
            ps.sort_unstable();
            let mut tp = cgd::TopicPartitions::default();
            tp.topic_id = topic_id(&t);
            tp.topic_name = TopicName(sb(&t));
            tp.partitions = ps;
            tp
        })
        .collect();
    a
}

/// ConsumerGroupDescribe.
pub(crate) fn describe(
    state: &Arc<State>,
    req: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let mut resp = ConsumerGroupDescribeResponse::default();
    let now = state.now_ms();
    let inner = state.consumer_groups.inner.lock();
    for gid in req.group_ids {
        let name = gid.0.to_string();
        let mut d = cgd::DescribedGroup::default();
        d.group_id = gid.clone();
        match inner.coord.describe(&name, now) {
            None => {
                d.error_code = code(ResponseError::GroupIdNotFound);
                d.error_message = Some(sb(&format!("group {name} is not a consumer group")));
                d.group_state = sb("Dead");
            }
            Some(g) => {
                d.group_state = sb(if g.members.is_empty() {
                    "Empty"
                } else if g.reconciled {
                    "Stable"
                } else {
                    "Reconciling"
                });
                d.group_epoch = g.group_epoch;
                d.assignment_epoch = g.target_epoch;
                d.assignor_name = sb(&g.assignor.to_ascii_lowercase());
                d.members = g
                    .members
                    .iter()
                    .map(|m| {
                        let mut x = cgd::Member::default();
                        x.member_id = sb(&m.member_id);
                        x.instance_id = m.instance_id.as_deref().map(sb);
                        x.member_epoch = m.member_epoch;
                        x.client_id = sb(&m.client_id);
                        x.client_host = sb(inner
                            .members
                            .get(&(name.clone(), m.member_id.clone()))
                            .map_or("", |c| c.client_host.as_str()));
                        x.subscribed_topic_names =
                            m.subscriptions.iter().map(|t| TopicName(sb(t))).collect();
                        x.assignment = assignment(&m.owned);
                        x.target_assignment = assignment(&m.target);
                        x
                    })
                    .collect();
            }
        }
        resp.groups.push(d);
    }
    resp
}
