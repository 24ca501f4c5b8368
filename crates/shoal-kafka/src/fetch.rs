//! Fetch: reads each partition's queue from the fetch offset, rebuilds one record batch per
//! partition from the stored messages, and long-polls (min bytes / max wait) on the broker's
//! hold service when there is not enough data yet. Fetch sessions (KIP-227) are not kept:
//! every answer says session 0, so clients send full fetches.

use crate::cluster::local_queue;
use crate::convert::stored_to_batch;
use crate::epochs::LeaderEpochs;
use crate::host::{TopicInfo, WaitPosition};
use crate::request::{code, RequestCtx};
use crate::state::State;
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use kafka_protocol::ResponseError;
use shoal_store::GetMessageStatus;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Consume-queue entries read per store call; several calls fill a partition's byte budget.
const MAX_MESSAGES_PER_READ: usize = 512;

/// Most messages waiting past the fetch offsets (all partitions) for a fetch to be read on the
/// connection's task; a fetch that may return more is read on the blocking pool, where the
/// thread hop is small next to the reading and converting.
const INLINE_FETCH_MESSAGES: u64 = 128;

#[derive(Debug, Clone)]
struct Wanted {
    name: Option<String>,
    /// The partition as the client names it (cluster-wide numbering).
    partition: i32,
    /// Its queue on this broker, or why this broker does not serve it.
    queue: Result<(i32, TopicInfo), ResponseError>,
    offset: i64,
    max_bytes: usize,
    /// This leader's epochs (records carry the epoch they were written in).
    epochs: Arc<LeaderEpochs>,
}

/// Waits while a member that fetches `all` is in its rebalance callback
/// ([`crate::fetch_hold`]).
async fn wait_fetch_holds(state: &State, all: &[Wanted]) {
    if state.fetch_holds_any() {
        let fetched: Vec<(String, i32)> = all
            .iter()
            .filter_map(|w| w.name.clone().map(|n| (n, w.partition)))
            .collect();
        state.wait_fetch_holds(&fetched).await;
    }
}

struct Read {
    error: Option<ResponseError>,
    records: Bytes,
    count: usize,
    high_watermark: i64,
    log_start: i64,
    /// Offset after what was read (where a wait for more starts).
    next: i64,
}

/// Handles a Fetch request.
pub(crate) async fn fetch(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: FetchRequest,
) -> FetchResponse {
    let v = ctx.version;
    let mut resp = FetchResponse::default();
    if v >= 7 && (req.session_id != 0 || req.session_epoch > 0) {
        resp.error_code = code(ResponseError::FetchSessionIdNotFound);
        return resp;
    }
    let mut topics: Vec<(Option<String>, Uuid, Vec<Wanted>)> = Vec::new();
    let epochs = Arc::new(state.host.leader_epochs());
    for t in &req.topics {
        let name = if v >= 13 {
            state.topic_by_id(t.topic_id).map(|i| i.name)
        } else {
            Some(t.topic.0.to_string())
        };
        let layout = name.as_deref().and_then(|n| state.host.topic_layout(n));
        let wanted = t
            .partitions
            .iter()
            .map(|p| Wanted {
                name: name.clone(),
                partition: p.partition,
                queue: match &name {
                    // The client's leader epoch (v9+) is checked where this broker leads.
                    Some(_) => local_queue(layout.as_ref(), p.partition).and_then(|q| {
                        let current = if v >= 9 { p.current_leader_epoch } else { -1 };
                        epochs.check(current).map(|()| q)
                    }),
                    None => Err(ResponseError::UnknownTopicId),
                },
                offset: p.fetch_offset,
                max_bytes: p.partition_max_bytes.max(0) as usize,
                epochs: epochs.clone(),
            })
            .collect();
        topics.push((name, t.topic_id, wanted));
    }
    let max_bytes = if v >= 3 {
        (req.max_bytes.max(0) as usize).min(state.config.max_fetch_response_bytes)
    } else {
        state.config.max_fetch_response_bytes
    };
    let min_bytes = req.min_bytes.max(0) as usize;
    let max_wait =
        Duration::from_millis((req.max_wait_ms.max(0) as u64).min(state.config.max_fetch_wait_ms));
    let deadline = Instant::now() + max_wait;
    let all: Vec<Wanted> = topics.iter().flat_map(|(_, _, w)| w.clone()).collect();
    // A member being told of a new assignment: answered after its rebalance callback.
    wait_fetch_holds(state, &all).await;
    let mut held = false;
    let reads = loop {
        let reads = if waiting_messages(state, &all) <= INLINE_FETCH_MESSAGES {
            read_all(state, &all, max_bytes)
        } else {
            let st = state.clone();
            let list = all.clone();
            tokio::task::spawn_blocking(move || read_all(&st, &list, max_bytes))
                .await
                .unwrap_or_default()
        };
        let bytes: usize = reads.iter().map(|r| r.records.len()).sum();
        let any_error = reads.iter().any(|r| r.error.is_some());
        let now = Instant::now();
        if bytes >= min_bytes.max(1)
            || any_error
            || now >= deadline
            || (bytes > 0 && min_bytes <= 1)
        {
            // A fetch that waited for data may have been overtaken by a new assignment.
            if held {
                wait_fetch_holds(state, &all).await;
            }
            break reads;
        }
        if !held {
            held = true;
            state.counters.fetches_held.fetch_add(1, Ordering::Relaxed);
        }
        // Wait past what we have: each partition's offset plus what this read found.
        let positions: Vec<WaitPosition> = all
            .iter()
            .zip(&reads)
            .filter_map(|(w, r)| {
                Some(WaitPosition {
                    topic: w.name.clone()?,
                    partition: w.queue.as_ref().ok()?.0,
                    offset: r.next.max(0) as u64,
                })
            })
            .collect();
        if positions.is_empty() {
            tokio::time::sleep(deadline - now).await;
            continue;
        }
        state
            .host
            .wait_for_messages(positions, deadline - now)
            .await;
    };
    let mut it = reads.into_iter();
    let mut fetched = 0u64;
    for (name, id, wanted) in topics {
        let mut t = FetchableTopicResponse::default();
        if v >= 13 {
            t.topic_id = id;
        } else {
            t.topic = TopicName(crate::request::sb(name.as_deref().unwrap_or("")));
        }
        for w in wanted {
            let r = it.next().unwrap_or(Read {
                error: Some(ResponseError::UnknownServerError),
                records: Bytes::new(),
                count: 0,
                high_watermark: -1,
                log_start: -1,
                next: -1,
            });
            fetched += r.count as u64;
            let mut p = PartitionData::default();
            p.partition_index = w.partition;
            p.high_watermark = r.high_watermark;
            if v >= 4 {
                p.last_stable_offset = r.high_watermark;
                p.aborted_transactions = Some(Vec::new());
            }
            if v >= 5 {
                p.log_start_offset = r.log_start;
            }
            if let Some(e) = r.error {
                p.error_code = code(e);
            }
            p.records = Some(r.records);
            t.partitions.push(p);
        }
        resp.responses.push(t);
    }
    state
        .counters
        .records_fetched
        .fetch_add(fetched, Ordering::Relaxed);
    resp
}

/// Messages stored past the fetch offsets of `wanted` (what a read could return at most; a
/// partition that does not exist counts none). One consume-queue bound per partition.
fn waiting_messages(state: &State, wanted: &[Wanted]) -> u64 {
    wanted
        .iter()
        .filter_map(|w| {
            let max = state
                .store
                .max_offset(w.name.as_deref()?, w.queue.as_ref().ok()?.0);
            Some(max.saturating_sub(w.offset.max(0) as u64))
        })
        .fold(0u64, u64::saturating_add)
}

fn read_all(state: &State, wanted: &[Wanted], max_bytes: usize) -> Vec<Read> {
    let mut budget = max_bytes;
    let mut first_with_data = true;
    wanted
        .iter()
        .map(|w| {
            let r = read_partition(state, w, budget, first_with_data);
            budget = budget.saturating_sub(r.records.len());
            if r.count > 0 {
                first_with_data = false;
            }
            r
        })
        .collect()
}

/// Whether every record of the commit log is visible to reads (in a replicated group, the
/// confirmed offset reached the log end).
pub(crate) fn store_caught_up(store: &shoal_store::MessageStore) -> bool {
    store.dispatched_offset() >= store.commit_log_max_offset()
}

fn read_partition(state: &State, w: &Wanted, budget: usize, may_exceed: bool) -> Read {
    let mut out = Read {
        error: None,
        records: Bytes::new(),
        count: 0,
        high_watermark: -1,
        log_start: -1,
        next: w.offset,
    };
    let Some(name) = &w.name else {
        out.error = Some(ResponseError::UnknownTopicId);
        return out;
    };
    let (queue, info) = match &w.queue {
        Ok(q) => q,
        Err(e) => {
            out.error = Some(*e);
            return out;
        }
    };
    let queue = *queue;
    if !info.readable {
        out.error = Some(ResponseError::TopicAuthorizationFailed);
        return out;
    }
    let store = &state.store;
    let (min, max) = (
        store.min_offset(name, queue) as i64,
        store.max_offset(name, queue) as i64,
    );
    out.high_watermark = max;
    out.log_start = min;
    if w.offset > max && w.epochs.current > 0 && !store_caught_up(store) {
        // A replicated group's records this broker has but does not show yet (a new master
        // confirms its log's tail before consumers see it): a position read from the previous
        // leader may be there. Nothing to read yet, as Kafka answers a fetch between its high
        // watermark and its log end.
        return out;
    }
    if w.offset < min || w.offset > max {
        out.error = Some(ResponseError::OffsetOutOfRange);
        return out;
    }
    // KIP-74: the first partition with data may exceed the limits by one batch.
    let limit = w.max_bytes.min(budget);
    if limit == 0 && !may_exceed {
        return out;
    }
    // Nothing at or past the high watermark reported above: the partition may grow while it is
    // read, and a client drops records past the last stable offset (librdkafka) and moves on.
    let end = max as u64;
    let mut offset = w.offset as u64;
    let mut stored = BytesMut::new();
    let mut got = 0usize;
    for _ in 0..64 {
        let left = limit.saturating_sub(stored.len());
        if (left == 0 && got > 0) || offset >= end {
            break;
        }
        let r = match store.get_messages(
            name,
            queue,
            offset,
            MAX_MESSAGES_PER_READ.min((end - offset) as usize),
            left.max(1),
            &|_| true,
        ) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(topic = %name, partition = w.partition, error = %e, "kafka fetch: store read failed");
                out.error = Some(ResponseError::KafkaStorageError);
                return out;
            }
        };
        if r.status != GetMessageStatus::Found {
            if r.status == GetMessageStatus::NoMatchedMessage && r.next_begin_offset > offset {
                offset = r.next_begin_offset;
                continue;
            }
            break;
        }
        // The first read may exceed `left` (at least one message); later ones must fit.
        if (got > 0 || !may_exceed) && stored.len() + r.messages.len() > limit {
            break;
        }
        stored.extend_from_slice(&r.messages);
        got += r.message_count;
        offset = r.next_begin_offset;
        if stored.len() >= limit {
            break;
        }
    }
    if got == 0 {
        return out;
    }
    match stored_to_batch(
        &stored.freeze(),
        state.host.max_message_bytes().saturating_mul(8),
        &w.epochs,
    ) {
        Ok(b) => {
            out.records = b.bytes;
            out.count = b.records;
            out.next = b.next_offset.unwrap_or(w.offset);
        }
        Err(e) => {
            tracing::warn!(topic = %name, partition = w.partition, error = %e, "kafka fetch: stored messages could not be converted");
            out.error = Some(ResponseError::CorruptMessage);
        }
    }
    out
}
