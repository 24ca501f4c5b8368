//! Produce: record batches (magic 2, any compression) become stored RocketMQ messages of the
//! partition's queue. acks=0 answers nothing, acks=1 and acks=all answer once the store has
//! the messages (after fsync under sync flush; there is one copy, so "all" is this broker).

use crate::clock::wall_ms;
use crate::convert::{record_to_message, HeaderList};
use crate::producer::{ProducerEntry, SeqCheck};
use crate::records::BatchError;
use crate::request::{code, RequestCtx};
use crate::state::State;
use bytes::Bytes;
use futures::future::join_all;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Record;
use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use shoal_store::{FlushStatus, MessageExtBrokerInner};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Most record bytes (all partitions of a request together) checked and converted on the
/// connection's own task; the partitions of a larger request, and every compressed set
/// (inflating may cost far more than its bytes), are handed to the blocking pool, where the
/// thread hop is small next to the work.
const INLINE_REQUEST_BYTES: usize = 64 * 1024;

/// A partition's answer: an error, or where its records went.
struct Outcome {
    error: Option<(ResponseError, String)>,
    base_offset: i64,
    log_start: i64,
}

impl Outcome {
    /// A refusal with `e` and a message.
    fn err(e: ResponseError, m: impl Into<String>) -> Outcome {
        Outcome {
            error: Some((e, m.into())),
            base_offset: -1,
            log_start: -1,
        }
    }
}

/// Handles a Produce request; `None` for acks=0.
///
/// Every partition of the request is checked, converted and queued for the store's appender
/// together (their appends share one write), on the connection's task: no thread hop unless a
/// partition's records are compressed or the request is large (see [`INLINE_REQUEST_BYTES`]).
pub(crate) async fn produce(
    state: &Arc<State>,
    ctx: &RequestCtx,
    req: ProduceRequest,
) -> Option<ProduceResponse> {
    let acks = req.acks;
    let version = ctx.version;
    let global_error = if req.transactional_id.is_some() {
        Some((
            ResponseError::InvalidRequest,
            "transactional produce is not supported by Shoal's Kafka listener".to_string(),
        ))
    } else if !(-1..=1).contains(&acks) {
        Some((
            ResponseError::InvalidRequiredAcks,
            format!("acks={acks}: only 0, 1 and -1 (all) exist"),
        ))
    } else {
        None
    };
    let mut names: Vec<TopicName> = Vec::with_capacity(req.topic_data.len());
    let mut work = Vec::new();
    for t in req.topic_data {
        for p in t.partition_data {
            work.push((names.len(), p.index, p.records));
        }
        names.push(t.name);
    }
    let peer = ctx.peer;
    let total: usize = work
        .iter()
        .map(|(_, _, r)| r.as_ref().map_or(0, Bytes::len))
        .sum();
    let small = total <= INLINE_REQUEST_BYTES;
    let names_ref = &names;
    let ge = &global_error;
    let outcomes = join_all(work.into_iter().map(|(t, index, records)| async move {
        let o = match ge {
            Some((e, m)) => Outcome::err(*e, m.clone()),
            None => partition(state, names_ref[t].0.as_str(), index, records, peer, small).await,
        };
        (t, index, o)
    }))
    .await;
    if acks == 0 {
        return None;
    }
    let mut resp = ProduceResponse::default();
    resp.responses = names
        .into_iter()
        .map(|name| {
            let mut t = TopicProduceResponse::default();
            t.name = name;
            t
        })
        .collect();
    for (t, index, o) in outcomes {
        let mut p = PartitionProduceResponse::default();
        p.index = index;
        p.base_offset = o.base_offset;
        p.log_append_time_ms = -1;
        if version >= 5 {
            p.log_start_offset = o.log_start;
        }
        if let Some((e, m)) = o.error {
            p.error_code = code(e);
            if version >= 8 {
                p.error_message = Some(StrBytes::from_string(m));
            }
        }
        resp.responses[t].partition_responses.push(p);
    }
    Some(resp)
}

/// One partition's records, checked and converted, ready for the store.
enum Prepared {
    /// Records of no idempotent producer: stored as one put.
    Plain(Vec<MessageExtBrokerInner>),
    /// An idempotent producer's batches, each checked against its sequences before it is put.
    Idempotent {
        producer_id: i64,
        batches: Vec<IdempotentBatch>,
    },
}

struct IdempotentBatch {
    epoch: i16,
    first_seq: i32,
    last_seq: i32,
    msgs: Vec<MessageExtBrokerInner>,
}

/// Checks, converts and stores one partition's batches; `small`: the request's records are
/// few enough to be worked on the connection's task.
async fn partition(
    state: &Arc<State>,
    topic: &str,
    index: i32,
    records: Option<Bytes>,
    peer: SocketAddr,
    small: bool,
) -> Outcome {
    let layout = state.host.topic_layout(topic);
    let (queue, info) = match crate::cluster::local_queue(layout.as_ref(), index) {
        Ok(q) => q,
        Err(e) => {
            let why = match (e, &layout) {
                (ResponseError::NotLeaderOrFollower, _) => {
                    format!("partition {index} of topic {topic} is led by another broker")
                }
                (_, Some(l)) => format!(
                    "topic {topic} has {} partitions, not {index}",
                    l.partitions()
                ),
                (_, None) => format!("topic {topic} does not exist"),
            };
            return Outcome::err(e, why);
        }
    };
    // From here on the partition is this broker's queue `queue`.
    let index = queue;
    if !info.writable {
        return Outcome::err(
            ResponseError::TopicAuthorizationFailed,
            format!("topic {topic} is not writable (its permission forbids writes)"),
        );
    }
    let Some(bytes) = records else {
        return Outcome::err(ResponseError::CorruptMessage, "no records");
    };
    let prepared = if small && !crate::records::any_compressed(&bytes) {
        prepare(state, topic, index, bytes, peer)
    } else {
        let st = Arc::clone(state);
        let t = topic.to_string();
        match tokio::task::spawn_blocking(move || prepare(&st, &t, index, bytes, peer)).await {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "produce decode task failed");
                Err(Outcome::err(
                    ResponseError::UnknownServerError,
                    "the record set could not be decoded (internal error)",
                ))
            }
        }
    };
    let prepared = match prepared {
        Ok(p) => p,
        Err(o) => return o,
    };
    let log_start = state.store.min_offset(topic, index) as i64;
    let stored = match prepared {
        Prepared::Plain(msgs) => store(state, msgs).await,
        Prepared::Idempotent {
            producer_id,
            batches,
        } => store_idempotent(state, topic, index, producer_id, batches).await,
    };
    match stored {
        Ok(base_offset) => Outcome {
            error: None,
            base_offset,
            log_start,
        },
        Err(o) => o,
    }
}

/// Decodes one partition's record set and converts its records to messages (CPU only).
fn prepare(
    state: &State,
    topic: &str,
    index: i32,
    bytes: Bytes,
    peer: SocketAddr,
) -> Result<Prepared, Outcome> {
    let sets =
        match crate::records::decode_record_set(bytes, state.config.max_batch_decompressed_bytes) {
            Ok(s) => s,
            Err(e) => {
                let err = match e {
                    BatchError::LegacyFormat(_) => ResponseError::UnsupportedForMessageFormat,
                    BatchError::TooLarge { .. } => ResponseError::RecordListTooLarge,
                    BatchError::Malformed(_) => ResponseError::CorruptMessage,
                };
                let counter = match e {
                    BatchError::LegacyFormat(_) => None,
                    BatchError::TooLarge { .. } => {
                        Some(&state.counters.limit_max_batch_decompressed_bytes)
                    }
                    BatchError::Malformed(_) => Some(&state.counters.batches_malformed),
                };
                if let Some(c) = counter {
                    c.fetch_add(1, Ordering::Relaxed);
                }
                return Err(Outcome::err(err, format!("record batch rejected: {e}")));
            }
        };
    let max = state.host.max_message_bytes();
    let cluster = state.host.cluster_name();
    let now = wall_ms();
    let convert =
        |recs: &[Record], headers: &[HeaderList]| -> Result<Vec<MessageExtBrokerInner>, Outcome> {
            recs.iter()
                .zip(headers)
                .map(|(r, headers)| {
                    let size = r.value.as_ref().map_or(0, |v| v.len());
                    if size > max {
                        return Err(Outcome::err(
                            ResponseError::MessageTooLarge,
                            format!("record of {size} bytes exceeds the limit of {max} bytes"),
                        ));
                    }
                    let mut m = record_to_message(r, headers, topic, index, peer, &cluster)
                        .map_err(|e| Outcome::err(ResponseError::InvalidRecord, e))?;
                    if m.born_timestamp < 0 {
                        m.born_timestamp = now;
                    }
                    Ok(m)
                })
                .collect()
        };
    for s in &sets {
        if s.set.records.iter().any(|r| r.transactional || r.control) {
            return Err(Outcome::err(
                ResponseError::InvalidRecord,
                "transactional and control batches are not supported",
            ));
        }
    }
    let first = sets.iter().find_map(|s| s.set.records.first());
    let Some(producer_id) = first.map(|r| r.producer_id).filter(|&id| id >= 0) else {
        let mut msgs = Vec::new();
        for s in &sets {
            msgs.extend(convert(&s.set.records, &s.headers)?);
        }
        if msgs.is_empty() {
            return Err(Outcome::err(
                ResponseError::CorruptMessage,
                "empty record batch",
            ));
        }
        return Ok(Prepared::Plain(msgs));
    };
    let mut batches = Vec::with_capacity(sets.len());
    for s in &sets {
        let (Some(head), Some(tail)) = (s.set.records.first(), s.set.records.last()) else {
            continue;
        };
        if head.producer_id != producer_id {
            return Err(Outcome::err(
                ResponseError::InvalidRecord,
                "batches of different producers in one partition",
            ));
        }
        batches.push(IdempotentBatch {
            epoch: head.producer_epoch,
            first_seq: head.sequence,
            last_seq: tail.sequence,
            msgs: convert(&s.set.records, &s.headers)?,
        });
    }
    Ok(Prepared::Idempotent {
        producer_id,
        batches,
    })
}

/// The mark that a request is writing an idempotent producer's partition, removed when the
/// request is done with it (answered, or dropped with its connection).
struct Writing<'a> {
    entry: &'a Mutex<ProducerEntry>,
    topic: &'a str,
    partition: i32,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.entry.lock().end_write(self.topic, self.partition);
    }
}

/// Stores an idempotent producer's batches of one partition: each is checked against the
/// producer's sequences (a repeat answered with its first offset and not stored again) and
/// put; the producer's state is locked only to check and to record, never across the put.
async fn store_idempotent(
    state: &State,
    topic: &str,
    index: i32,
    producer_id: i64,
    batches: Vec<IdempotentBatch>,
) -> Result<i64, Outcome> {
    let entry = match state.producers.get(producer_id) {
        Some(e) => e,
        // A producer whose id another broker of the cluster gave, or this broker group's
        // master before a failover (producer state is not replicated), or this broker before
        // its state was evicted: taken from its first batch, as it is
        // ([`crate::producer::ProducerTable::adopt`]).
        None if !batches.is_empty() => {
            let (e, evicted) = state.producers.adopt(producer_id, batches[0].epoch);
            if evicted > 0 {
                state
                    .counters
                    .limit_max_producer_states
                    .fetch_add(evicted as u64, Ordering::Relaxed);
            }
            e
        }
        None => {
            return Err(Outcome::err(
                ResponseError::UnknownProducerId,
                format!(
                    "producer id {producer_id} is not known (expired or from before a restart)"
                ),
            ))
        }
    };
    let began = entry.lock().begin_write(topic, index);
    if !began {
        state
            .counters
            .concurrent_writes_refused
            .fetch_add(1, Ordering::Relaxed);
        return Err(Outcome::err(
            ResponseError::RequestTimedOut,
            format!(
                "another request of producer {producer_id} is still writing {topic}-{index}; \
                 retry once it is answered"
            ),
        ));
    }
    let _writing = Writing {
        entry: &entry,
        topic,
        partition: index,
    };
    let queue = batches
        .iter()
        .find_map(|b| b.msgs.first())
        .map(|m| m.queue_id);
    let needs_log = entry.lock().needs_log(topic, index);
    if let (Some(queue), true) = (queue, needs_log) {
        crate::producer_log::rebuild(state, &entry, topic, index, queue, producer_id)
            .await
            .map_err(|(e, m)| Outcome::err(e, m))?;
    }
    let mut base_offset: Option<i64> = None;
    for b in batches {
        let check = entry
            .lock()
            .check(topic, index, b.epoch, b.first_seq, b.last_seq);
        match check {
            SeqCheck::Duplicate(at) => {
                state
                    .counters
                    .duplicate_batches
                    .fetch_add(1, Ordering::Relaxed);
                base_offset.get_or_insert(at);
            }
            SeqCheck::Refuse(e) => {
                state
                    .counters
                    .sequence_errors
                    .fetch_add(1, Ordering::Relaxed);
                return Err(Outcome::err(
                    e,
                    format!(
                        "batch with sequence {}..={} (epoch {}) refused",
                        b.first_seq, b.last_seq, b.epoch
                    ),
                ));
            }
            SeqCheck::Append => {
                let mut msgs = b.msgs;
                crate::producer_log::mark(&mut msgs, producer_id, b.epoch, b.first_seq, b.last_seq);
                let at = store(state, msgs).await?;
                entry
                    .lock()
                    .record(topic, index, b.epoch, b.first_seq, b.last_seq, at);
                base_offset.get_or_insert(at);
            }
        }
    }
    base_offset.ok_or_else(|| Outcome::err(ResponseError::CorruptMessage, "empty record batch"))
}

/// Appends messages through the store's appender (together with every put waiting then);
/// returns the first one's queue offset once they are written (fsynced under sync flush).
async fn store(state: &State, msgs: Vec<MessageExtBrokerInner>) -> Result<i64, Outcome> {
    let count = msgs.len() as u64;
    state
        .host
        .check_replicated_write()
        .map_err(replica_outcome)?;
    let r = state.store.submit(msgs).await.map_err(|e| match e {
        shoal_store::StoreError::MessageTooLarge { size, max } => Outcome::err(
            ResponseError::MessageTooLarge,
            format!("message of {size} bytes exceeds the store limit of {max}"),
        ),
        other => Outcome::err(
            ResponseError::KafkaStorageError,
            format!("the store refused the write: {other}"),
        ),
    })?;
    match r.flush {
        FlushStatus::Flushed | FlushStatus::NotFlushed => {}
        FlushStatus::FlushTimeout => {
            return Err(Outcome::err(
                ResponseError::RequestTimedOut,
                "written, but the fsync did not complete in time",
            ))
        }
        FlushStatus::FlushFailed => {
            return Err(Outcome::err(
                ResponseError::KafkaStorageError,
                "written, but the fsync failed; the store refuses writes until restarted",
            ))
        }
    }
    if let Some(last) = r.messages.last() {
        // A replicated group: answered once the in-sync set has it (acks=all's promise).
        state
            .host
            .replicated_write(last.physical_offset + u64::from(last.size))
            .await
            .map_err(replica_outcome)?;
    }
    state
        .counters
        .records_produced
        .fetch_add(count, Ordering::Relaxed);
    r.messages
        .first()
        .map(|m| m.queue_offset as i64)
        .ok_or_else(|| Outcome::err(ResponseError::KafkaStorageError, "the store stored nothing"))
}

/// A replicated group's refusal as the produce answer's error.
fn replica_outcome(r: crate::ReplicaRefusal) -> Outcome {
    use crate::ReplicaRefusal as R;
    let (e, why) = match r {
        R::NotLeader => (
            ResponseError::NotLeaderOrFollower,
            "this broker is not the master of its replicated group",
        ),
        R::NotEnoughReplicas => (
            ResponseError::NotEnoughReplicas,
            "in-sync replicas not enough (min_insync_replicas)",
        ),
        R::NotEnoughReplicasAfterAppend => (
            ResponseError::NotEnoughReplicasAfterAppend,
            "written, but the in-sync replicas did not acknowledge it in time",
        ),
        R::Busy => (
            ResponseError::RequestTimedOut,
            "too many writes wait for the in-sync replicas",
        ),
    };
    Outcome::err(e, why)
}

/// InitProducerId for idempotent (non-transactional) producers.
pub(crate) fn init_producer_id(
    state: &Arc<State>,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut resp = InitProducerIdResponse::default();
    if req.transactional_id.is_some() {
        // Transactions are not implemented; TRANSACTIONAL_ID_AUTHORIZATION_FAILED would mislead.
        resp.error_code = ResponseError::UnsupportedVersion.code();
        resp.producer_id = ProducerId(-1);
        resp.producer_epoch = -1;
        tracing::info!("InitProducerId with a transactional id refused: transactions are not supported over Kafka");
        return resp;
    }
    let existing = (req.producer_id.0 >= 0).then_some((req.producer_id.0, req.producer_epoch));
    match state.producers.init(existing) {
        Ok(((id, epoch), evicted)) => {
            if evicted > 0 {
                state
                    .counters
                    .limit_max_producer_states
                    .fetch_add(evicted as u64, Ordering::Relaxed);
                tracing::warn!(
                    evicted,
                    limit = state.config.max_producer_states,
                    "idempotent producer states forgotten: max_producer_states reached"
                );
            }
            resp.producer_id = ProducerId(id);
            resp.producer_epoch = epoch;
        }
        Err(e) => {
            resp.error_code = e.code();
            resp.producer_id = ProducerId(-1);
            resp.producer_epoch = -1;
        }
    }
    resp
}
