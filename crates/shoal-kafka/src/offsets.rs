//! ListOffsets, OffsetForLeaderEpoch, OffsetCommit and OffsetFetch. Kafka offsets are queue
//! offsets; committed offsets live in the store's offset table beside RocketMQ groups' (a
//! Kafka commit of offset N means "next to read is N", as RocketMQ's commit does).

use crate::epochs::EpochEnd;
use crate::request::{code, RequestCtx};
use crate::state::State;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;
use shoal_store::BoundaryType;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Latest offset (the high watermark).
const LATEST: i64 = -1;
/// Earliest offset.
const EARLIEST: i64 = -2;
/// The offset of the message with the largest timestamp.
const MAX_TIMESTAMP: i64 = -3;
/// Earliest local offset (no tiered storage here: the earliest).
const EARLIEST_LOCAL: i64 = -4;

/// The queue of this broker that partition `partition` of `topic` is, or the error it gets.
fn local(state: &State, topic: &str, partition: i32) -> Result<i32, ResponseError> {
    crate::cluster::local_queue(state.host.topic_layout(topic).as_ref(), partition).map(|(q, _)| q)
}

/// ListOffsets: earliest, latest, max timestamp, and by timestamp (store time; the first
/// message stored at or after it). The client's leader epoch (v4+) is checked; offsets are
/// answered with the current leader epoch (at least the epoch of the record there, which is
/// what a later OffsetForLeaderEpoch needs not to truncate below it).
pub(crate) async fn list_offsets(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let st = state.clone();
    let v = ctx.version;
    tokio::task::spawn_blocking(move || {
        let mut resp = ListOffsetsResponse::default();
        let epochs = st.host.leader_epochs();
        for t in req.topics {
            let name = t.name.0.to_string();
            let mut tr = ListOffsetsTopicResponse::default();
            tr.name = t.name.clone();
            for p in t.partitions {
                let mut pr = ListOffsetsPartitionResponse::default();
                pr.partition_index = p.partition_index;
                let current = if v >= 4 { p.current_leader_epoch } else { -1 };
                let found = local(&st, &name, p.partition_index)
                    .and_then(|queue| epochs.check(current).map(|()| queue))
                    .and_then(|queue| lookup(&st, &name, queue, p.timestamp));
                match found {
                    Ok((offset, ts)) => {
                        pr.offset = offset;
                        pr.timestamp = ts;
                        if v >= 4 {
                            pr.leader_epoch = epochs.current;
                        }
                    }
                    Err(e) => pr.error_code = code(e),
                }
                tr.partitions.push(pr);
            }
            resp.topics.push(tr);
        }
        resp
    })
    .await
    .unwrap_or_default()
}

/// Offset and timestamp of `ts` (a time or one of the special values) in queue `partition`.
fn lookup(
    state: &State,
    topic: &str,
    partition: i32,
    ts: i64,
) -> Result<(i64, i64), ResponseError> {
    let s = &state.store;
    let (min, max) = (
        s.min_offset(topic, partition),
        s.max_offset(topic, partition),
    );
    let io = |e: shoal_store::StoreError| {
        tracing::warn!(error = %e, "ListOffsets: store lookup failed");
        ResponseError::KafkaStorageError
    };
    Ok(match ts {
        LATEST => (max as i64, -1),
        EARLIEST | EARLIEST_LOCAL => (min as i64, -1),
        MAX_TIMESTAMP => {
            if max == min {
                (-1, -1)
            } else {
                // Store times are monotonic in the log, so the newest message has the max.
                let at = max - 1;
                let t = s
                    .store_time_of(topic, partition, at)
                    .map_err(io)?
                    .unwrap_or(-1);
                (at as i64, t)
            }
        }
        t if t >= 0 => {
            let at = s
                .offset_by_timestamp(topic, partition, t, BoundaryType::Lower)
                .map_err(io)?;
            if at >= max {
                (-1, -1)
            } else {
                let found = s
                    .store_time_of(topic, partition, at)
                    .map_err(io)?
                    .unwrap_or(-1);
                (at as i64, found)
            }
        }
        _ => return Err(ResponseError::InvalidRequest),
    })
}

/// OffsetForLeaderEpoch: where a leader epoch's records end in the partition
/// ([`crate::epochs::LeaderEpochs::end_of`]): the current epoch's at the high watermark, an older one's at
/// the first record of a later epoch; the client truncates its position to it. The client's
/// current leader epoch is checked as for Fetch.
pub(crate) fn offset_for_leader_epoch(
    state: &Arc<State>,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut resp = OffsetForLeaderEpochResponse::default();
    let epochs = state.host.leader_epochs();
    for t in req.topics {
        let name = t.topic.0.to_string();
        let mut tr = OffsetForLeaderTopicResult::default();
        tr.topic = t.topic.clone();
        for p in t.partitions {
            let mut e = EpochEndOffset::default();
            e.partition = p.partition;
            let queue = local(state, &name, p.partition)
                .and_then(|q| epochs.check(p.current_leader_epoch).map(|()| q));
            let end = queue.and_then(|q| match epochs.end_of(p.leader_epoch) {
                EpochEnd::Undefined => Ok((-1, -1)),
                EpochEnd::LogEnd { epoch } => Ok((epoch, state.store.max_offset(&name, q) as i64)),
                // The next epoch's first record not shown yet (a new master confirms its log's
                // tail first): where this epoch ends in the partition is not known yet; the
                // client asks again.
                EpochEnd::Before { next_start, .. }
                    if state.store.dispatched_offset() <= next_start
                        && !crate::fetch::store_caught_up(&state.store) =>
                {
                    Err(ResponseError::UnknownLeaderEpoch)
                }
                EpochEnd::Before { epoch, next_start } => state
                    .store
                    .offset_at_physical(&name, q, next_start)
                    .map(|o| (epoch, o as i64))
                    .map_err(|err| {
                        tracing::warn!(error = %err, "OffsetForLeaderEpoch: store lookup failed");
                        ResponseError::KafkaStorageError
                    }),
            });
            match end {
                Ok((epoch, offset)) => {
                    e.leader_epoch = epoch;
                    e.end_offset = offset;
                }
                Err(err) => e.error_code = code(err),
            }
            tr.partitions.push(e);
        }
        resp.topics.push(tr);
    }
    resp
}

/// Where a partition's committed offset lives: this broker's queue, or another broker
/// group's (the offset stays with the queue, wherever the group's coordinator is).
enum OffsetHome {
    Here(i32),
    At(String, i32),
}

fn offset_home(
    layout: Option<&crate::cluster::TopicLayout>,
    own: &str,
    partition: i32,
) -> Result<OffsetHome, ResponseError> {
    let (slot, queue) = layout
        .and_then(|l| l.locate(partition))
        .ok_or(ResponseError::UnknownTopicOrPartition)?;
    Ok(if slot.broker_name == own {
        OffsetHome::Here(queue)
    } else {
        OffsetHome::At(slot.broker_name.clone(), queue)
    })
}

/// OffsetCommit: fenced by the classic group's generation and member id; a commit with
/// generation -1 and no member (a consumer that assigns itself partitions) is accepted while
/// the group has no members. Partitions of other broker groups are committed at their
/// brokers.
pub(crate) async fn offset_commit(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let group = req.group_id.0.to_string();
    let mut resp = OffsetCommitResponse::default();
    if !state.coordinates(&group).await {
        for t in req.topics {
            let mut tr = OffsetCommitResponseTopic::default();
            tr.name = t.name.clone();
            if ctx.version >= 10 {
                tr.topic_id = t.topic_id;
            }
            for p in t.partitions {
                let mut pr = OffsetCommitResponsePartition::default();
                pr.partition_index = p.partition_index;
                pr.error_code = code(ResponseError::NotCoordinator);
                tr.partitions.push(pr);
            }
            resp.topics.push(tr);
        }
        return resp;
    }
    // A new master still taking over the group's state answers COORDINATOR_LOAD_IN_PROGRESS
    // (member_cache::commit_fencing), and the client sends the commit again.
    let fencing = if req.member_id.is_empty() {
        Ok(false)
    } else {
        state.consumer_groups.has_group(state.host.as_ref(), &group)
    };
    let consumer = fencing == Ok(true);
    let check = if consumer {
        Ok(())
    } else if let Err(e) = fencing {
        Err(e)
    } else {
        let partitions: Vec<(String, i32)> = req
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (t.name.0.to_string(), p.partition_index))
            })
            .collect();
        state.groups.validate_commit(
            state,
            &group,
            req.member_id.as_str(),
            req.group_instance_id.as_ref().map(|s| s.as_str()),
            req.generation_id_or_member_epoch,
            &partitions,
        )
    };
    if check.is_ok() {
        if let Err(e) = state.host.ensure_group(&group) {
            tracing::debug!(group = %group, error = %e, "Kafka group not registered as a subscription group (it still commits)");
        }
    }
    let own = state.host.broker_name();
    let mut remote = Vec::new();
    let mut here = Vec::new();
    for t in req.topics {
        let name = t.name.0.to_string();
        let layout = state.host.topic_layout(&name);
        let mut tr = OffsetCommitResponseTopic::default();
        tr.name = t.name.clone();
        if ctx.version >= 10 {
            tr.topic_id = t.topic_id;
        }
        for p in t.partitions {
            let mut pr = OffsetCommitResponsePartition::default();
            pr.partition_index = p.partition_index;
            let r = check
                .and_then(|()| offset_home(layout.as_ref(), &own, p.partition_index))
                .and_then(|home| {
                    if consumer {
                        state.consumer_groups.validate_commit(
                            state.host.as_ref(),
                            &group,
                            req.member_id.as_str(),
                            req.generation_id_or_member_epoch,
                            &name,
                            p.partition_index,
                        )?;
                    }
                    (p.committed_offset >= 0)
                        .then_some(home)
                        .ok_or(ResponseError::InvalidCommitOffsetSize)
                });
            match r {
                Ok(OffsetHome::Here(queue)) => {
                    state
                        .store
                        .commit_offset(&group, &name, queue, p.committed_offset);
                    here.push((resp.topics.len(), tr.partitions.len()));
                }
                Ok(OffsetHome::At(broker, queue)) => {
                    remote.push((
                        resp.topics.len(),
                        tr.partitions.len(),
                        state.host.commit_offset_at(
                            &broker,
                            &group,
                            &name,
                            queue,
                            p.committed_offset,
                        ),
                    ));
                }
                Err(e) => pr.error_code = code(e),
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    let (at, calls): (Vec<(usize, usize)>, Vec<_>) =
        remote.into_iter().map(|(t, p, f)| ((t, p), f)).unzip();
    for ((t, p), r) in at.into_iter().zip(futures::future::join_all(calls).await) {
        if let Err(e) = r {
            tracing::warn!(group = %group, error = %e, "a commit for another broker's partition failed");
            resp.topics[t].partitions[p].error_code = code(ResponseError::CoordinatorNotAvailable);
        }
    }
    // In a replicated group the commit is answered once the in-sync set has it, as Kafka
    // answers once its offsets topic's in-sync replicas have it: a new master then has it.
    if !here.is_empty() && !state.host.offsets_replicated().await {
        tracing::debug!(group = %group, "committed offsets not replicated in time");
        for (t, p) in here {
            resp.topics[t].partitions[p].error_code = code(ResponseError::CoordinatorNotAvailable);
        }
    }
    resp
}

/// The committed offsets of a group: `topics` = None means every partition it committed on
/// this broker. Partitions of other broker groups are asked of their brokers; one that does
/// not answer (stopped, crashed) gets KAFKA_STORAGE_ERROR on its partitions, which a client
/// reports for those partitions alone and does not fetch them until its next assignment
/// (a retriable error would hold every partition of the request back; no offset would let
/// `auto.offset.reset` skip what was not consumed).
async fn committed(
    state: &State,
    group: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
) -> Vec<(String, Vec<(i32, i64, i16)>)> {
    match topics {
        Some(list) => {
            let own = state.host.broker_name();
            let mut out = Vec::with_capacity(list.len());
            for (name, parts) in list {
                let layout = state.host.topic_layout(&name);
                let mut offs = Vec::with_capacity(parts.len());
                let mut asks = Vec::new();
                for p in parts {
                    match offset_home(layout.as_ref(), &own, p) {
                        Ok(OffsetHome::Here(q)) => offs.push((
                            p,
                            state.store.query_offset(group, &name, q).unwrap_or(-1),
                            0,
                        )),
                        Ok(OffsetHome::At(broker, q)) => {
                            asks.push((
                                offs.len(),
                                state.host.query_offset_at(&broker, group, &name, q),
                            ));
                            offs.push((p, -1, 0));
                        }
                        // A partition nobody serves (now) has no committed offset.
                        Err(_) => offs.push((p, -1, 0)),
                    }
                }
                let (at, calls): (Vec<usize>, Vec<_>) = asks.into_iter().unzip();
                for (i, r) in at.into_iter().zip(futures::future::join_all(calls).await) {
                    match r {
                        Ok(o) => offs[i].1 = o.unwrap_or(-1),
                        Err(e) => {
                            tracing::warn!(group = %group, error = %e, "a committed offset of another broker's partition could not be read");
                            offs[i].2 = code(ResponseError::KafkaStorageError);
                        }
                    }
                }
                out.push((name, offs));
            }
            out
        }
        None => {
            let own = state.host.broker_name();
            let mut by_topic: BTreeMap<String, Vec<(i32, i64, i16)>> = BTreeMap::new();
            for (topic, q, off) in state.store.offsets_of_group(group) {
                let p = state
                    .host
                    .topic_layout(&topic)
                    .and_then(|l| l.index_of(&own, q))
                    .unwrap_or(q);
                by_topic.entry(topic).or_default().push((p, off, 0));
            }
            by_topic
                .into_iter()
                .map(|(t, mut v)| {
                    v.sort_unstable();
                    (t, v)
                })
                .collect()
        }
    }
}

/// OffsetFetch (one group before v8, several from v8). Metadata strings are not kept: they
/// come back empty.
pub(crate) async fn offset_fetch(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: OffsetFetchRequest,
) -> OffsetFetchResponse {
    let mut resp = OffsetFetchResponse::default();
    if ctx.version < 8 {
        let group = req.group_id.0.to_string();
        if !state.coordinates(&group).await {
            resp.error_code = code(ResponseError::NotCoordinator);
            return resp;
        }
        let topics: Option<Vec<(String, Vec<i32>)>> = req.topics.map(|ts| {
            ts.into_iter()
                .map(|t| (t.name.0.to_string(), t.partition_indexes))
                .collect()
        });
        asked(state, &group, topics.as_deref());
        for (name, offs) in committed(state, &group, topics).await {
            let mut tr = OffsetFetchResponseTopic::default();
            tr.name = TopicName(crate::request::sb(&name));
            tr.partitions = offs
                .into_iter()
                .map(|(p, o, e)| {
                    let mut pr = OffsetFetchResponsePartition::default();
                    pr.partition_index = p;
                    pr.committed_offset = o;
                    pr.error_code = e;
                    pr
                })
                .collect();
            resp.topics.push(tr);
        }
        return resp;
    }
    for g in req.groups {
        let group = g.group_id.0.to_string();
        let mut gr = OffsetFetchResponseGroup::default();
        gr.group_id = g.group_id.clone();
        if !state.coordinates(&group).await {
            gr.error_code = code(ResponseError::NotCoordinator);
            resp.groups.push(gr);
            continue;
        }
        let topics: Option<Vec<(String, Vec<i32>)>> = g.topics.map(|ts| {
            ts.into_iter()
                .map(|t| (t.name.0.to_string(), t.partition_indexes))
                .collect()
        });
        asked(state, &group, topics.as_deref());
        for (name, offs) in committed(state, &group, topics).await {
            let mut tr = OffsetFetchResponseTopics::default();
            tr.name = TopicName(crate::request::sb(&name));
            tr.partitions = offs
                .into_iter()
                .map(|(p, o, e)| {
                    let mut pr = OffsetFetchResponsePartitions::default();
                    pr.partition_index = p;
                    pr.committed_offset = o;
                    pr.error_code = e;
                    pr
                })
                .collect();
            gr.topics.push(tr);
        }
        resp.groups.push(gr);
    }
    resp
}

/// A member asks for the committed offsets of partitions it was just given from the assign
/// call that ends its rebalance callback: fetches held for that callback go on
/// ([`crate::fetch_hold`]).
fn asked(state: &State, group: &str, topics: Option<&[(String, Vec<i32>)]>) {
    let Some(topics) = topics else {
        return;
    };
    let partitions: Vec<(String, i32)> = topics
        .iter()
        .flat_map(|(t, ps)| ps.iter().map(move |p| (t.clone(), *p)))
        .collect();
    state.offsets_asked(group, &partitions);
}
