//! The classic group protocol over the wire: FindCoordinator, JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup, DescribeGroups, ListGroups and DeleteGroups, driving the sans-IO
//! `shoal_group::classic_group` state machine. One owner: the groups live behind one short
//! lock; a JoinGroup or SyncGroup that has to wait registers a one-shot channel under a
//! request id and awaits it outside the lock; a timer task runs the group timers.

use crate::classic_groups::{
    assigned_queues, err_code, error_of, partition_key, GroupCoordinator, Inner, Waiter,
};
use crate::cluster::Leader;
use crate::request::{code, sb, RequestCtx};
use crate::state::State;
use bytes::Bytes;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use shoal_group::classic_group::{
    ClassicError, ClassicGroups, Covers, JoinRequest, LeavingMember, Output, RequestId, SyncRequest,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};

impl GroupCoordinator {
    fn deliver(inner: &mut Inner, state: &State) {
        while let Some(o) = inner.groups.poll_output() {
            match o {
                Output::Join(r, j) => {
                    if let Some(Waiter::Join(tx)) = inner.waiters.remove(&r) {
                        let _ = tx.send(j);
                    }
                }
                Output::Sync(r, s) => {
                    if let Some(Waiter::Sync(tx)) = inner.waiters.remove(&r) {
                        let _ = tx.send(s);
                    }
                }
                Output::Heartbeat(r, h) => {
                    if let Some(Waiter::Heartbeat(tx)) = inner.waiters.remove(&r) {
                        let _ = tx.send(h);
                    }
                }
                Output::Rebalanced {
                    group,
                    generation,
                    members,
                } => {
                    state.counters.rebalances.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(group = %group, generation, members, "kafka group rebalanced");
                }
                Output::MemberRemoved {
                    group,
                    member_id,
                    reason,
                } => {
                    tracing::info!(group = %group, member = %member_id, reason, "kafka group member removed");
                }
            }
        }
    }

    /// Offset commit fencing of a commit of `partitions` (topic, partition).
    pub(crate) fn validate_commit(
        &self,
        state: &State,
        group: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        partitions: &[(String, i32)],
    ) -> Result<(), ResponseError> {
        let now = state.now_ms();
        let broker = state.host.broker_name();
        let key = partition_key(&broker);
        let covers = |protocol_type: &str, bytes: &[u8]| {
            let held = assigned_queues(protocol_type, bytes, &key);
            let named = partitions
                .iter()
                .filter(|(t, p)| held.iter().any(|q| &q.topic == t && q.queue_id == *p))
                .count();
            match named {
                0 => Covers::None,
                n if n == partitions.len() => Covers::All,
                _ => Covers::Some,
            }
        };
        self.inner
            .lock()
            .groups
            .validate_commit(group, member_id, instance_id, generation, now, covers)
            .map_err(error_of)
    }
}

/// Runs the group timers (session expiry, join and sync deadlines).
pub(crate) async fn timer_loop(state: Arc<State>, mut stop: watch::Receiver<bool>) {
    // The broker runs the coordinator's timers; here only the Kafka-side cache of consumer
    // group members is pruned now and then.
    let mut next_prune = 0;
    loop {
        let now = state.now_ms();
        let next = {
            let mut inner = state.groups.inner.lock();
            inner.groups.handle_timeout(now);
            GroupCoordinator::deliver(&mut inner, &state);
            inner.groups.poll_timeout()
        };
        if now >= next_prune {
            state.consumer_groups.prune(state.host.as_ref());
            next_prune = now + 5_000;
        }
        // Liveness only: wake at the next deadline, at most every 200 ms, or on a change.
        let wait = next
            .map(|t| t.saturating_sub(now).clamp(5, 200))
            .unwrap_or(200);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
            _ = state.groups.wake.notified() => {}
            _ = stop.changed() => return,
        }
    }
}

/// FindCoordinator: a group's coordinator is one broker's listener, the same whichever broker
/// is asked ([`crate::cluster::coordinator_of`]); transactions have no coordinator.
pub(crate) async fn find_coordinator(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: FindCoordinatorRequest,
) -> FindCoordinatorResponse {
    state.host.refresh_cluster().await;
    let masters = state.host.kafka_masters();
    let mut resp = FindCoordinatorResponse::default();
    // (error, message, node): the node for groups; an error for the others.
    let answer = |key_type: i8, key: &str| -> (i16, Option<StrBytes>, Option<(i32, String, i32)>) {
        match key_type {
            0 => match crate::cluster::coordinator_of(key, &masters) {
                None | Some(Leader::Here) => (
                    0,
                    None,
                    Some((
                        state.node_id,
                        state.advertised_host.clone(),
                        state.advertised_port,
                    )),
                ),
                Some(Leader::At(n)) => (0, None, Some((n.node_id, n.host.clone(), n.port))),
                Some(Leader::Unknown) => (
                    code(ResponseError::CoordinatorNotAvailable),
                    Some(sb("the group's coordinator broker has no master now")),
                    None,
                ),
            },
            1 => (
                code(ResponseError::CoordinatorNotAvailable),
                Some(sb(
                    "transactions are not supported by Shoal's Kafka listener",
                )),
                None,
            ),
            t => (
                code(ResponseError::InvalidRequest),
                Some(sb(&format!("coordinator key type {t} is not supported"))),
                None,
            ),
        }
    };
    if ctx.version >= 4 {
        for key in req.coordinator_keys {
            let (err, m, node) = answer(req.key_type, key.as_str());
            let mut c = Coordinator::default();
            c.key = key;
            c.error_code = err;
            c.error_message = m;
            match node {
                Some((id, host, port)) => {
                    c.node_id = BrokerId(id);
                    c.host = sb(&host);
                    c.port = port;
                }
                None => {
                    c.node_id = BrokerId(-1);
                    c.port = -1;
                }
            }
            resp.coordinators.push(c);
        }
        return resp;
    }
    let (err, m, node) = answer(
        if ctx.version >= 1 { req.key_type } else { 0 },
        req.key.as_str(),
    );
    resp.error_code = err;
    if ctx.version >= 1 {
        resp.error_message = m;
    }
    match node {
        Some((id, host, port)) => {
            resp.node_id = BrokerId(id);
            resp.host = sb(&host);
            resp.port = port;
        }
        None => {
            resp.node_id = BrokerId(-1);
            resp.port = -1;
        }
    }
    resp
}

fn new_member_id(client_id: &str) -> String {
    let bytes: [u8; 16] = rand::random();
    format!("{client_id}-{}", uuid::Uuid::from_bytes(bytes).hyphenated())
}

/// JoinGroup.
pub(crate) async fn join_group(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: JoinGroupRequest,
) -> JoinGroupResponse {
    let v = ctx.version;
    let group = req.group_id.0.to_string();
    let mut resp = JoinGroupResponse::default();
    if v < 7 {
        resp.protocol_name = Some(StrBytes::default());
    }
    if group.is_empty() {
        resp.error_code = code(ResponseError::InvalidGroupId);
        resp.generation_id = -1;
        return resp;
    }
    if !state.coordinates(&group).await {
        resp.error_code = code(ResponseError::NotCoordinator);
        resp.generation_id = -1;
        return resp;
    }
    // A member that joins is past its rebalance callback (crate::fetch_hold).
    state.release_fetches(&(group.clone(), req.member_id.to_string()));
    let session = req.session_timeout_ms.max(0) as u64;
    let rebalance = if v == 0 || req.rebalance_timeout_ms < 0 {
        session
    } else {
        req.rebalance_timeout_ms as u64
    };
    let join = JoinRequest {
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()),
        client_id: ctx.client_id.to_string(),
        client_host: format!("/{}", ctx.peer.ip()),
        session_timeout_ms: session,
        rebalance_timeout_ms: rebalance,
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .iter()
            .map(|p| (p.name.to_string(), p.metadata.to_vec()))
            .collect(),
        require_known_member_id: v >= 4,
        new_member_id: new_member_id(ctx.client_id.as_str()),
        supports_skip_assignment: v >= 9,
    };
    if !state.groups.has_members(&group)
        && state
            .consumer_groups
            .has_members(state.host.as_ref(), &group)
    {
        // Members of the coordinator's group (Kafka consumer-protocol or Shoal coordinated).
        resp.error_code = code(ResponseError::InconsistentGroupProtocol);
        resp.generation_id = -1;
        return resp;
    }
    let asked = ask(state, Waiter::Join, |groups, id, now| {
        groups.handle_join(now, &group, id, join)
    });
    let Some(j) = asked.await else {
        resp.error_code = code(ResponseError::CoordinatorNotAvailable);
        resp.generation_id = -1;
        return resp;
    };
    let limit = match j.error {
        Some(ClassicError::GroupMaxSizeReached) => Some(&state.counters.limit_group_max_size),
        Some(ClassicError::TooManyGroups) => Some(&state.counters.limit_max_groups),
        _ => None,
    };
    if let Some(c) = limit {
        c.fetch_add(1, Ordering::Relaxed);
    }
    if j.error.is_none() {
        if let Err(e) = state.host.ensure_group(&group) {
            tracing::debug!(group = %group, error = %e, "Kafka group not registered as a subscription group");
        }
    }
    resp.error_code = err_code(j.error);
    resp.generation_id = j.generation;
    resp.member_id = sb(&j.member_id);
    resp.leader = sb(&j.leader);
    if v >= 7 {
        resp.protocol_type = j.protocol_type.as_deref().map(sb);
        resp.protocol_name = j.protocol_name.as_deref().map(sb);
    } else {
        resp.protocol_name = Some(sb(j.protocol_name.as_deref().unwrap_or("")));
    }
    if v >= 9 {
        resp.skip_assignment = j.skip_assignment;
    }
    resp.members = j
        .members
        .into_iter()
        .map(|(m, inst, meta)| {
            let mut x = JoinGroupResponseMember::default();
            x.member_id = sb(&m);
            if v >= 5 {
                x.group_instance_id = inst.as_deref().map(sb);
            }
            x.metadata = Bytes::from(meta);
            x
        })
        .collect();
    resp
}

/// Hands a join or sync to the group state machine (under the coordinator's lock, its outputs
/// delivered there) and waits for its answer; `None` when the listener stopped first.
fn ask<T>(
    state: &Arc<State>,
    waiter: fn(oneshot::Sender<T>) -> Waiter,
    run: impl FnOnce(&mut ClassicGroups, RequestId, u64),
) -> impl std::future::Future<Output = Option<T>> {
    let id = state.groups.next_req.fetch_add(1, Ordering::Relaxed);
    ask_as(state, id, waiter, run)
}

/// [`ask`] with the request id chosen by the caller.
fn ask_as<T>(
    state: &Arc<State>,
    id: RequestId,
    waiter: fn(oneshot::Sender<T>) -> Waiter,
    run: impl FnOnce(&mut ClassicGroups, RequestId, u64),
) -> impl std::future::Future<Output = Option<T>> {
    let (tx, rx) = oneshot::channel();
    {
        let mut inner = state.groups.inner.lock();
        inner.waiters.insert(id, waiter(tx));
        run(&mut inner.groups, id, state.now_ms());
        GroupCoordinator::deliver(&mut inner, state);
    }
    state.groups.wake.notify_one();
    async move { rx.await.ok() }
}

/// SyncGroup.
pub(crate) async fn sync_group(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: SyncGroupRequest,
) -> SyncGroupResponse {
    let group = req.group_id.0.to_string();
    if !state.coordinates(&group).await {
        let mut resp = SyncGroupResponse::default();
        resp.error_code = code(ResponseError::NotCoordinator);
        return resp;
    }
    let sync = SyncRequest {
        member_id: req.member_id.to_string(),
        instance_id: req.group_instance_id.as_ref().map(|s| s.to_string()),
        generation: req.generation_id,
        protocol_type: req.protocol_type.as_ref().map(|s| s.to_string()),
        protocol_name: req.protocol_name.as_ref().map(|s| s.to_string()),
        assignments: req
            .assignments
            .iter()
            .map(|a| (a.member_id.to_string(), a.assignment.to_vec()))
            .collect(),
    };
    let key = (group.clone(), req.member_id.to_string());
    state.release_fetches(&key);
    // What the member holds now: its assignment of the previous generation.
    let mut held = Vec::new();
    let own = state.host.broker_name();
    let as_key = partition_key(&own);
    let asked = ask(state, Waiter::Sync, |groups, id, now| {
        if let Some(g) = groups.get(&group) {
            if let (Some(pt), Some(a)) = (g.protocol_type(), g.assignment_of(&key.1)) {
                held = assigned_queues(pt, a, &as_key);
            }
        }
        groups.handle_sync(now, &group, id, sync)
    });
    let mut resp = SyncGroupResponse::default();
    match asked.await {
        Some(s) => {
            if s.error.is_none() && !held.is_empty() {
                // Its fetches of what it held wait for its rebalance callback.
                let held: Vec<(String, i32)> =
                    held.into_iter().map(|q| (q.topic, q.queue_id)).collect();
                let given = s
                    .protocol_type
                    .as_deref()
                    .map(|pt| assigned_queues(pt, &s.assignment, &as_key))
                    .unwrap_or_default()
                    .into_iter()
                    .map(|q| (q.topic, q.queue_id))
                    .filter(|p| !held.contains(p))
                    .collect();
                state.hold_fetches(&key, held, given);
                state.delay_after_hold().await;
            }
            resp.error_code = err_code(s.error);
            resp.assignment = Bytes::from(s.assignment);
            if ctx.version >= 5 {
                resp.protocol_type = s.protocol_type.as_deref().map(sb);
                resp.protocol_name = s.protocol_name.as_deref().map(sb);
            }
        }
        None => resp.error_code = code(ResponseError::CoordinatorNotAvailable),
    }
    resp
}

/// Heartbeat. In a Stable group the answer is held until a rebalance starts (answered
/// REBALANCE_IN_PROGRESS at once), the hold ends, or the connection's next request arrives
/// (answers go out in request order, so that one is not kept waiting).
pub(crate) async fn heartbeat(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: HeartbeatRequest,
) -> HeartbeatResponse {
    let group = req.group_id.0.to_string();
    if !state.coordinates(&group).await {
        let mut resp = HeartbeatResponse::default();
        resp.error_code = code(ResponseError::NotCoordinator);
        return resp;
    }
    let id = state.groups.next_req.fetch_add(1, Ordering::Relaxed);
    let answer = ask_as(state, id, Waiter::Heartbeat, |groups, id, now| {
        groups.handle_heartbeat(
            now,
            &group,
            id,
            req.member_id.as_str(),
            req.group_instance_id.as_ref().map(|s| s.as_str()),
            req.generation_id,
        )
    });
    tokio::pin!(answer);
    let r = tokio::select! {
        r = &mut answer => r,
        _ = ctx.next_request() => {
            {
                let mut inner = state.groups.inner.lock();
                inner.groups.handle_heartbeat_release(state.now_ms(), &group, id);
                GroupCoordinator::deliver(&mut inner, state);
            }
            answer.await
        }
    };
    let mut resp = HeartbeatResponse::default();
    match r {
        Some(Ok(())) => {}
        Some(Err(e)) => resp.error_code = code(error_of(e)),
        None => resp.error_code = code(ResponseError::CoordinatorNotAvailable),
    }
    resp
}

/// LeaveGroup (one member before v3, a batch from v3).
pub(crate) async fn leave_group(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: LeaveGroupRequest,
) -> LeaveGroupResponse {
    let group = req.group_id.0.to_string();
    if !state.coordinates(&group).await {
        let mut resp = LeaveGroupResponse::default();
        resp.error_code = code(ResponseError::NotCoordinator);
        return resp;
    }
    let leaving: Vec<LeavingMember> = if ctx.version >= 3 {
        req.members
            .iter()
            .map(|m| LeavingMember {
                member_id: m.member_id.to_string(),
                instance_id: m.group_instance_id.as_ref().map(|s| s.to_string()),
            })
            .collect()
    } else {
        vec![LeavingMember {
            member_id: req.member_id.to_string(),
            instance_id: None,
        }]
    };
    for l in &leaving {
        state.release_fetches(&(group.clone(), l.member_id.clone()));
    }
    let results = {
        let mut inner = state.groups.inner.lock();
        let results = inner.groups.handle_leave(state.now_ms(), &group, &leaving);
        GroupCoordinator::deliver(&mut inner, state);
        results
    };
    state.groups.wake.notify_one();
    let mut resp = LeaveGroupResponse::default();
    if ctx.version >= 3 {
        resp.members = leaving
            .iter()
            .zip(&results)
            .map(|(l, r)| {
                let mut m = MemberResponse::default();
                m.member_id = sb(&l.member_id);
                m.group_instance_id = l.instance_id.as_deref().map(sb);
                m.error_code = r.err().map_or(0, |e| code(error_of(e)));
                m
            })
            .collect();
    } else if let Some(Err(e)) = results.first() {
        resp.error_code = code(error_of(*e));
    }
    resp
}

/// DescribeGroups: classic groups with members; a group known only by its committed offsets
/// (a RocketMQ group, or Kafka consumers that assign partitions themselves) is `Empty`.
pub(crate) fn describe_groups(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let mut resp = DescribeGroupsResponse::default();
    let inner = state.groups.inner.lock();
    for gid in req.groups {
        let name = gid.0.to_string();
        let mut d = DescribedGroup::default();
        d.group_id = gid.clone();
        match inner.groups.get(&name).filter(|g| !g.is_empty()) {
            Some(g) => {
                d.group_state = sb(g.state().name());
                d.protocol_type = sb(g.protocol_type().unwrap_or(""));
                let stable = g.state() == shoal_group::classic_group::GroupState::Stable;
                d.protocol_data = sb(if stable {
                    g.protocol().unwrap_or("")
                } else {
                    ""
                });
                d.members = g
                    .members()
                    .into_iter()
                    .map(|m| {
                        let mut x = DescribedGroupMember::default();
                        x.member_id = sb(&m.member_id);
                        if ctx.version >= 4 {
                            x.group_instance_id = m.instance_id.as_deref().map(sb);
                        }
                        x.client_id = sb(&m.client_id);
                        x.client_host = sb(&m.client_host);
                        if stable {
                            x.member_metadata = Bytes::from(m.metadata);
                            x.member_assignment = Bytes::from(m.assignment);
                        }
                        x
                    })
                    .collect();
            }
            None => {
                let known = !state.store.offsets_of_group(&name).is_empty()
                    || inner.groups.get(&name).is_some();
                d.group_state = sb(if known { "Empty" } else { "Dead" });
                d.protocol_type = sb(if known { "consumer" } else { "" });
            }
        }
        resp.groups.push(d);
    }
    resp
}

/// ListGroups: the classic groups held (state filter from v4).
pub(crate) fn list_groups(state: &Arc<State>, req: ListGroupsRequest) -> ListGroupsResponse {
    let mut resp = ListGroupsResponse::default();
    let inner = state.groups.inner.lock();
    for g in inner.groups.iter() {
        let st = if g.is_empty() {
            "Empty"
        } else {
            g.state().name()
        };
        if !req.states_filter.is_empty()
            && !req
                .states_filter
                .iter()
                .any(|s| s.as_str().eq_ignore_ascii_case(st))
        {
            continue;
        }
        let mut l = ListedGroup::default();
        l.group_id = GroupId(sb(g.id()));
        l.protocol_type = sb(g.protocol_type().unwrap_or("consumer"));
        l.group_state = sb(st);
        resp.groups.push(l);
    }
    drop(inner);
    for (g, st) in state.consumer_groups.list(state.host.as_ref()) {
        if !req.states_filter.is_empty()
            && !req
                .states_filter
                .iter()
                .any(|s| s.as_str().eq_ignore_ascii_case(st))
        {
            continue;
        }
        let mut l = ListedGroup::default();
        l.group_id = GroupId(sb(&g));
        l.protocol_type = sb("consumer");
        l.group_state = sb(st);
        resp.groups.push(l);
    }
    resp
}

/// DeleteGroups: empty groups only; their committed offsets and subscription group go too.
pub(crate) fn delete_groups(state: &Arc<State>, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut resp = DeleteGroupsResponse::default();
    for gid in req.groups_names {
        let name = gid.0.to_string();
        let mut r = DeletableGroupResult::default();
        r.group_id = gid.clone();
        let classic = state.groups.inner.lock().groups.delete(&name);
        let consumer = state.consumer_groups.delete(state.host.as_ref(), &name);
        let has_offsets = !state.store.offsets_of_group(&name).is_empty();
        let outcome = match (classic, consumer) {
            (Err(ClassicError::NonEmptyGroup), _) | (_, Err(_)) => {
                Err(ResponseError::NonEmptyGroup)
            }
            (_, Ok(true)) => state.host.delete_group(&name).map_err(|e| {
                tracing::warn!(group = %name, error = %e, "DeleteGroups: the broker refused");
                ResponseError::UnknownServerError
            }),
            (classic, Ok(false)) => match classic {
                Err(ClassicError::NonEmptyGroup) => Err(ResponseError::NonEmptyGroup),
                Err(_) if !has_offsets => Err(ResponseError::GroupIdNotFound),
                _ => state.host.delete_group(&name).map_err(|e| {
                    tracing::warn!(group = %name, error = %e, "DeleteGroups: the broker refused");
                    ResponseError::try_from_code(e.code())
                        .unwrap_or(ResponseError::UnknownServerError)
                }),
            },
        };
        match outcome {
            Ok(()) => {
                tracing::info!(group = %name, "group deleted by a Kafka DeleteGroups request")
            }
            Err(e) => r.error_code = code(e),
        }
        resp.results.push(r);
    }
    resp
}
