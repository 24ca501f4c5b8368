//! KIP-848 consumer groups (`group.protocol=consumer`): ConsumerGroupHeartbeat and
//! ConsumerGroupDescribe on the broker's own `shoal_group::coordinator` (reached through
//! [`BrokerHandle::with_coordinator`]), the coordinator of Shoal's coordinated mode: one
//! coordinator serves Kafka consumer groups and Shoal's coordinated groups, so both show in
//! `shoal group describe`, and a Kafka member and a Shoal member of the same group share its
//! queues (server-side assignors, member and group epochs, revoke-then-assign
//! reconciliation, static members). A Kafka partition is the coordinator's `MessageQueue`
//! (topic, this broker, queue id).
//!
//! Kafka heartbeats leave out what did not change (subscriptions, owned partitions); the
//! coordinator wants them every time, so the last ones per member are kept (in
//! `member_cache.rs`; entries of members the coordinator no longer has are pruned by the
//! listener's timer). The cache lock and the broker's group-state lock are never held
//! together.
//!
//! [`BrokerHandle::with_coordinator`]: crate::BrokerHandle::with_coordinator

use crate::member_cache::{error_of, on_coordinator, state_name, ConsumerGroups, MemberCache};
use crate::request::{code, sb, RequestCtx};
use crate::state::{topic_id, State};
use kafka_protocol::messages::consumer_group_describe_response as cgd;
use kafka_protocol::messages::consumer_group_heartbeat_response as cgh;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use shoal_group::coordinator::HeartbeatRequest;
use shoal_proto::mq::MessageQueue;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// Kafka's leave epochs.
const LEAVE_EPOCH: i32 = -1;
const STATIC_LEAVE_EPOCH: i32 = -2;

/// The connection id Kafka members are registered with in the coordinator: Shoal's remoting
/// connection ids start at 1, so no remoting connection close removes a Kafka member, and the
/// coordinator's push notices to it go nowhere (Kafka members learn changes by heartbeating).
const KAFKA_CONN_ID: u64 = 0;

/// Kafka's server-side assignor names (`uniform`, `range`) and Shoal's strategy names.
fn assignor_name(kafka: &str) -> String {
    match kafka {
        "uniform" => "STICKY".to_string(),
        "range" => "RANGE".to_string(),
        other => other.to_ascii_uppercase().replace('-', "_"),
    }
}

/// How much earlier than a heartbeat's timeout (the interval the member was given) its held
/// answer goes out: a twentieth, at least 20 ms.
fn hold_margin(interval_ms: u64) -> u64 {
    (interval_ms / 20).max(20)
}

/// A heartbeat that passed the checks: what to ask the coordinator.
struct Prepared {
    hb: HeartbeatRequest,
    cache: MemberCache,
    topics: Vec<String>,
}

/// Whether the member reports partitions of this broker (whose fetches a new assignment holds).
fn holds_here(cg: &ConsumerGroups, p: &Prepared) -> bool {
    p.hb.owned.iter().any(|q| q.broker_name == cg.broker_name)
}

fn fail(
    req: &ConsumerGroupHeartbeatRequest,
    e: ResponseError,
    m: String,
) -> ConsumerGroupHeartbeatResponse {
    if e == ResponseError::InvalidRequest || e == ResponseError::UnsupportedAssignor {
        tracing::info!(group = %req.group_id.0.as_str(), error = %m, "ConsumerGroupHeartbeat refused");
    }
    let mut resp = ConsumerGroupHeartbeatResponse::default();
    resp.error_code = code(e);
    resp.error_message = Some(StrBytes::from_string(m));
    resp
}

/// ConsumerGroupHeartbeat. A member that is reconciled and gets nothing new in the answer
/// has the answer held (up to `consumer_heartbeat_hold_ms`) until its assignment changes,
/// so it learns of a change at once rather than at its next heartbeat; the connection's next
/// request also ends the hold (answers go out in request order). A member with partitions to
/// revoke or to receive is given `consumer_reconcile_heartbeat_interval_ms`.
pub(crate) async fn heartbeat(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: ConsumerGroupHeartbeatRequest,
) -> ConsumerGroupHeartbeatResponse {
    let cg = &state.consumer_groups;
    if !state.coordinates(req.group_id.as_str()).await {
        let mut resp = ConsumerGroupHeartbeatResponse::default();
        resp.error_code = code(ResponseError::NotCoordinator);
        resp.error_message = Some(StrBytes::from_static_str(
            "another broker coordinates this group: ask FindCoordinator",
        ));
        return resp;
    }
    // A new master takes over its group's state a few hundred milliseconds after its election
    // (it names itself coordinator at once) and answers the group's members after that: the
    // heartbeat waits for it, as long as a held answer may. Refused meanwhile with
    // COORDINATOR_LOAD_IN_PROGRESS, librdkafka retries at most twice and then waits its
    // heartbeat interval. The connection's next request ends the wait (answers go out in
    // request order).
    if cg.hold_ms > 0 {
        tokio::select! {
            _ = state.host.coordinator_ready(Duration::from_millis(cg.hold_ms)) => {}
            _ = ctx.next_request() => {}
        }
    }
    let prepared = match prepare(state, ctx, &req) {
        Ok(p) => p,
        Err(resp) => {
            if !req.member_id.is_empty() {
                state.release_fetches(&(req.group_id.0.to_string(), req.member_id.to_string()));
            }
            return *resp;
        }
    };
    // The coordinator allocates every broker group's queues of the subscribed topics: it
    // learns them from routes at most a second old (changes of watched routes are pushed).
    state.host.refresh_routes(prepared.topics.clone()).await;
    let key = (prepared.hb.group.clone(), prepared.hb.member_id.clone());
    // A heartbeat after a new assignment shows the member past its rebalance callback: the
    // answer ends its fetch holds, or replaces them when it carries another new assignment.
    // Watched before the coordinator runs, so a change right after it is not missed.
    let wake = cg.watch(&key);
    let (resp, hold) = answer(state, &req, &prepared);
    let resp = match hold {
        Some(hold) => {
            tokio::select! {
                // The coordinator told this member to heartbeat: answer as of now.
                _ = wake.notified() => answer(state, &req, &prepared).0,
                _ = tokio::time::sleep(hold) => resp,
                _ = ctx.next_request() => resp,
            }
        }
        None => resp,
    };
    cg.unwatch(&key, &wake);
    if resp.assignment.is_some() && req.member_epoch > 0 && holds_here(cg, &prepared) {
        state.delay_after_hold().await;
    }
    resp
}

/// Checks a heartbeat and builds the coordinator's request from it and the member's cache;
/// `Err` is the final answer (a refusal, or a leave).
fn prepare(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: &ConsumerGroupHeartbeatRequest,
) -> Result<Prepared, Box<ConsumerGroupHeartbeatResponse>> {
    let cg = &state.consumer_groups;
    let host = state.host.as_ref();
    let group = req.group_id.0.to_string();
    if group.is_empty() {
        return Err(Box::new(fail(
            req,
            ResponseError::InvalidGroupId,
            "group id is empty".into(),
        )));
    }
    if state.groups.has_members(&group) {
        return Err(Box::new(fail(
            req,
            ResponseError::GroupIdNotFound,
            format!("group {group} is a classic group with members"),
        )));
    }
    if req
        .subscribed_topic_regex
        .as_ref()
        .is_some_and(|r| !r.is_empty())
    {
        return Err(Box::new(fail(
            req,
            ResponseError::InvalidRequest,
            "regular-expression subscriptions are not supported by Shoal's Kafka listener".into(),
        )));
    }
    let mut member_id = req.member_id.to_string();
    if member_id.is_empty() {
        if req.member_epoch != 0 || ctx.version >= 1 {
            return Err(Box::new(fail(
                req,
                ResponseError::UnknownMemberId,
                "member id is empty".into(),
            )));
        }
        member_id = uuid::Uuid::from_bytes(rand::random()).simple().to_string();
    }
    let key = (group.clone(), member_id.clone());
    if req.member_epoch == LEAVE_EPOCH || req.member_epoch == STATIC_LEAVE_EPOCH {
        let permanent = req.member_epoch == LEAVE_EPOCH || req.instance_id.is_none();
        let left = on_coordinator(host, None, &[], |c, now| {
            c.handle_leave(now, &group, &member_id, permanent)
        });
        cg.members.lock().remove(&key);
        return Err(Box::new(match left {
            Ok(Ok(())) => {
                let mut resp = ConsumerGroupHeartbeatResponse::default();
                resp.member_id = Some(sb(&member_id));
                resp.member_epoch = req.member_epoch;
                resp
            }
            Ok(Err(e)) => fail(req, error_of(&e), "leave failed".into()),
            Err(e) => fail(req, ResponseError::CoordinatorNotAvailable, e.to_string()),
        }));
    }
    let cached = cg.members.lock().get(&key).cloned();
    // A member of this group's previous coordinator (its broker stopped or left, so
    // FindCoordinator named this one): librdkafka sends its whole state after a coordinator
    // change. It joins here keeping what it owns that nobody else does, on its word (its
    // partitions' brokers hold no lock for Kafka members), and the group's epochs continue
    // above its own, as Shoal members do when their coordinator moves.
    let moved_in = req.member_epoch > 0
        && cached.is_none()
        && req.subscribed_topic_names.is_some()
        && req.topic_partitions.is_some()
        && !on_coordinator(host, None, &[], |c, _| c.has_member(&group, &member_id))
            .unwrap_or(true);
    // A member the coordinator has that this listener has not heard from: the group's state
    // came with the coordinator (this broker group's new master took it over). The Java
    // client sends the new coordinator only its id and epoch, so what its heartbeat leaves
    // out is what it last told the coordinator, not nothing.
    let cached = match cached {
        None if req.member_epoch > 0 && !moved_in => {
            on_coordinator(host, None, &[], |c, _| c.member_report(&group, &member_id))
                .ok()
                .flatten()
                .map(|r| MemberCache {
                    subscriptions: r.subscriptions,
                    owned: r.held,
                    assignor: r.assignor,
                    rebalance_timeout_ms: Some(r.rebalance_timeout_ms),
                    ..MemberCache::default()
                })
        }
        cached => cached,
    };
    let mut cache = cached.unwrap_or_default();
    if req.member_epoch == 0 || moved_in {
        // A member this listener knows that heartbeats at epoch 0 without its subscription
        // (a client answered epoch 0 takes it for a join but sends only what changed) keeps
        // the subscription it sent before.
        let subscriptions = match &req.subscribed_topic_names {
            Some(subs) => subs.iter().map(|t| t.0.to_string()).collect(),
            None if !cache.subscriptions.is_empty() => std::mem::take(&mut cache.subscriptions),
            None => {
                return Err(Box::new(fail(
                    req,
                    ResponseError::InvalidRequest,
                    "a joining member must send its subscription".into(),
                )))
            }
        };
        cache = MemberCache {
            subscriptions,
            ..MemberCache::default()
        };
    } else if let Some(subs) = &req.subscribed_topic_names {
        cache.subscriptions = subs.iter().map(|t| t.0.to_string()).collect();
    }
    if let Some(owned) = &req.topic_partitions {
        // Topic ids name the member's subscriptions (any broker's) or this broker's topics.
        let mut names: Vec<String> = cache.subscriptions.iter().cloned().collect();
        names.extend(host.topics().into_iter().map(|t| t.name));
        let mut set = BTreeSet::new();
        for tp in owned {
            if let Some(t) = names.iter().find(|t| topic_id(t) == tp.topic_id) {
                // Joining from another coordinator, it keeps only partitions a broker still
                // leads (a departed broker group's are nobody's to keep).
                let layout = moved_in.then(|| host.topic_layout(t)).flatten();
                for p in &tp.partitions {
                    let led = layout.as_ref().is_none_or(|l| {
                        l.locate(*p)
                            .is_some_and(|(s, _)| s.leader != crate::cluster::Leader::Unknown)
                    });
                    if led {
                        set.insert(cg.queue(host, t, *p));
                    }
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
    let hb = HeartbeatRequest {
        group,
        member_id,
        member_epoch: if moved_in { 0 } else { req.member_epoch },
        instance_id: req.instance_id.as_ref().map(|s| s.to_string()),
        client_id: ctx.client_id.to_string(),
        conn_id: KAFKA_CONN_ID,
        subscriptions: cache.subscriptions.clone(),
        owned: cache.owned.clone(),
        adoptable: if moved_in {
            cache.owned.clone()
        } else {
            BTreeSet::new()
        },
        rebalance_timeout_ms: cache.rebalance_timeout_ms,
        // Kafka's consumer protocol has no member session timeout: the group's (coordinator's).
        session_timeout_ms: None,
        assignor: cache.assignor.clone(),
        last_epoch: moved_in.then_some(req.member_epoch),
    };
    if moved_in {
        tracing::info!(group = %hb.group, member = %hb.member_id, epoch = req.member_epoch, owned = hb.owned.len(), "a Kafka member of the group's previous coordinator joins with what it owns");
    }
    // The coordinator learns the subscribed topics' queues from the broker, in the same lock.
    let topics: Vec<String> = cache.subscriptions.iter().cloned().collect();
    Ok(Prepared { hb, cache, topics })
}

/// Runs the heartbeat on the coordinator and builds the answer; `Some(hold)` when the answer
/// tells the member nothing new and may be held that long.
fn answer(
    state: &Arc<State>,
    req: &ConsumerGroupHeartbeatRequest,
    p: &Prepared,
) -> (ConsumerGroupHeartbeatResponse, Option<Duration>) {
    let cg = &state.consumer_groups;
    let host = state.host.as_ref();
    let (group, key) = (&p.hb.group, (p.hb.group.clone(), p.hb.member_id.clone()));
    let mut cache = p.cache.clone();
    let hb = p.hb.clone();
    let result = match on_coordinator(host, Some(group), &p.topics, |c, now| {
        c.handle_heartbeat(now, hb)
    }) {
        Ok(r) => r,
        Err(e) => {
            cg.members.lock().remove(&key);
            state.release_fetches(&key);
            let code_e = ResponseError::try_from_code(e.code())
                .unwrap_or(ResponseError::CoordinatorNotAvailable);
            return (fail(req, code_e, e.to_string()), None);
        }
    };
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            let code_e = error_of(&e);
            if code_e == ResponseError::UnknownMemberId
                || code_e == ResponseError::FencedMemberEpoch
            {
                cg.members.lock().remove(&key);
            }
            state.release_fetches(&key);
            return (fail(req, code_e, e.to_string()), None);
        }
    };
    let mut resp = ConsumerGroupHeartbeatResponse::default();
    resp.member_id = Some(sb(&r.member_id));
    resp.member_epoch = r.member_epoch;
    let steady = r.heartbeat_interval_ms.min(cg.heartbeat_interval_ms).max(1);
    let told_before = cache.told_ms;
    // With held answers a member waiting for something is answered when it comes, and keeps
    // the steady interval: librdkafka times a heartbeat out after the interval it was last
    // given, so a short interval would leave it unreachable while the interval grows back.
    // Without them, a member with work left is asked back after the short interval.
    let interval = if r.reconciling && cg.hold_ms == 0 {
        cg.reconcile_interval_ms.min(steady)
    } else {
        steady
    };
    resp.heartbeat_interval_ms = interval.min(i32::MAX as u64) as i32;
    cache.told_ms = Some(interval);
    // The coordinator allocates every broker group's queues of the topics; each is a
    // partition of the cluster's numbering ([`crate::cluster`]). A queue no layout places
    // (a broker not in the routes this listener knows) is not sent.
    let mut numbering = Numbering::new(host);
    let mut own: BTreeMap<(String, i32), MessageQueue> = r
        .assignment
        .iter()
        .filter_map(|q| Some(((q.topic.clone(), numbering.partition(q)?), q.clone())))
        .collect();
    // A partition whose index names another queue than when the member was given it (a
    // broker group added before another in name order renumbers those after it) is left out
    // of this answer, so the member drops its position there; the next answer gives it back
    // as new, and the member reads its committed offset.
    if let Some(sent) = &cache.last_sent {
        own.retain(|k, q| sent.get(k).is_none_or(|was| was == q));
    }
    let changed = cache.last_sent.as_ref() != Some(&own) || req.member_epoch == 0;
    if changed {
        let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (t, p) in own.keys() {
            by_topic.entry(t.clone()).or_default().push(*p);
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
        cache.last_sent = Some(own);
        // Its fetches of what it held wait for its rebalance callback (crate::fetch_hold).
        // Held by partition index, as fetches name them; only fetches to this listener wait.
        let held: Vec<(String, i32)> = if req.member_epoch > 0 {
            p.hb.owned
                .iter()
                .filter(|q| q.broker_name == cg.broker_name)
                .filter_map(|q| Some((q.topic.clone(), numbering.partition(q)?)))
                .collect()
        } else {
            Vec::new()
        };
        let given = cache
            .last_sent
            .iter()
            .flat_map(|s| s.keys())
            .filter(|p| !held.contains(p))
            .cloned()
            .collect();
        state.replace_fetch_holds(&key, held, given);
    } else {
        state.release_fetches(&key);
    }
    cg.members
        .lock()
        .insert((group.clone(), r.member_id.clone()), cache);
    if let Err(e) = host.ensure_group(group) {
        tracing::debug!(group = %group, error = %e, "Kafka group not registered as a subscription group");
    }
    // An answer that changes nothing the member consumes (it is reconciled, or waits for
    // partitions others still hold, or joins and waits for its first) may wait for a change,
    // as long as the client waits for it (librdkafka times a heartbeat out after the interval
    // it was last given). One that takes partitions away or gives some goes out at once.
    let owned: Vec<&MessageQueue> =
        p.hb.owned
            .iter()
            .filter(|q| numbering.partition(q).is_some())
            .collect();
    let quiet = r
        .assignment
        .iter()
        .filter(|q| numbering.partition(q).is_some())
        .eq(owned);
    let hold = (cg.hold_ms * steady / cg.heartbeat_interval_ms.max(1))
        .min(told_before.map_or(u64::MAX, |t| t.saturating_sub(hold_margin(t))));
    (
        resp,
        (quiet && hold > 0).then(|| Duration::from_millis(hold)),
    )
}

/// Partition indexes of queues, one topic layout looked up per topic.
struct Numbering<'a> {
    host: &'a dyn crate::host::BrokerHandle,
    layouts: HashMap<String, Option<crate::cluster::TopicLayout>>,
}

impl<'a> Numbering<'a> {
    fn new(host: &'a dyn crate::host::BrokerHandle) -> Self {
        Numbering {
            host,
            layouts: HashMap::new(),
        }
    }

    /// The partition `q` is, when a layout places its broker group.
    fn partition(&mut self, q: &MessageQueue) -> Option<i32> {
        let host = self.host;
        self.layouts
            .entry(q.topic.clone())
            .or_insert_with(|| host.topic_layout(&q.topic))
            .as_ref()?
            .index_of(&q.broker_name, q.queue_id)
    }
}

fn assignment(host: &dyn crate::host::BrokerHandle, queues: &[MessageQueue]) -> cgd::Assignment {
    let mut numbering = Numbering::new(host);
    let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for q in queues {
        if let Some(p) = numbering.partition(q) {
            by_topic.entry(q.topic.clone()).or_default().push(p);
        }
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
    let names: Vec<String> = req.group_ids.iter().map(|g| g.0.to_string()).collect();
    let found = on_coordinator(state.host.as_ref(), None, &[], |c, now| {
        names.iter().map(|n| c.describe(n, now)).collect::<Vec<_>>()
    });
    let found = match found {
        Ok(f) => f,
        Err(e) => {
            for gid in req.group_ids {
                let mut d = cgd::DescribedGroup::default();
                d.group_id = gid;
                d.error_code = code(ResponseError::CoordinatorNotAvailable);
                d.error_message = Some(sb(&e.to_string()));
                resp.groups.push(d);
            }
            return resp;
        }
    };
    let hosts: HashMap<(String, String), String> = {
        let members = state.consumer_groups.members.lock();
        found
            .iter()
            .flatten()
            .flat_map(|g| {
                g.members.iter().filter_map(|m| {
                    let k = (g.group.clone(), m.member_id.clone());
                    members.get(&k).map(|c| (k, c.client_host.clone()))
                })
            })
            .collect()
    };
    for (gid, desc) in req.group_ids.into_iter().zip(found) {
        let name = gid.0.to_string();
        let mut d = cgd::DescribedGroup::default();
        d.group_id = gid.clone();
        match desc {
            None => {
                d.error_code = code(ResponseError::GroupIdNotFound);
                d.error_message = Some(sb(&format!("group {name} is not a consumer group")));
                d.group_state = sb("Dead");
            }
            Some(g) => {
                d.group_state = sb(state_name(&g));
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
                        x.client_host = sb(hosts
                            .get(&(name.clone(), m.member_id.clone()))
                            .map_or("", String::as_str));
                        x.subscribed_topic_names =
                            m.subscriptions.iter().map(|t| TopicName(sb(t))).collect();
                        x.assignment = assignment(state.host.as_ref(), &m.owned);
                        x.target_assignment = assignment(state.host.as_ref(), &m.target);
                        x
                    })
                    .collect();
            }
        }
        resp.groups.push(d);
    }
    resp
}
