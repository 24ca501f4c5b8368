//! Produce: record batches (magic 2, any compression) become stored RocketMQ messages of the
//! partition's queue. acks=0 answers nothing, acks=1 and acks=all answer once the store has
//! the messages (after fsync under sync flush; there is one copy, so "all" is this broker).

use crate::api::{code, RequestCtx};
use crate::convert::record_to_message;
use crate::producer::SeqCheck;
use crate::records::BatchError;
use crate::state::{wall_ms, State};
use bytes::Bytes;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Record;
use kafka_protocol::ResponseError;
use shoal_store::{FlushStatus, MessageExtBrokerInner};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A topic's partitions and their record bytes.
type TopicWork = (TopicName, Vec<(i32, Option<Bytes>)>);

struct Outcome {
    error: Option<(ResponseError, String)>,
    base_offset: i64,
    log_start: i64,
}

impl Outcome {
    fn err(e: ResponseError, m: impl Into<String>) -> Outcome {
        Outcome {
            error: Some((e, m.into())),
            base_offset: -1,
            log_start: -1,
        }
    }
}

/// Handles a Produce request; `None` for acks=0.
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
    let work: Vec<TopicWork> = req
        .topic_data
        .into_iter()
        .map(|t| {
            (
                t.name,
                t.partition_data
                    .into_iter()
                    .map(|p| (p.index, p.records))
                    .collect(),
            )
        })
        .collect();
    let st = state.clone();
    let peer = ctx.peer;
    let ge = global_error.clone();
    let done = tokio::task::spawn_blocking(move || {
        work.into_iter()
            .map(|(topic, parts)| {
                let outcomes: Vec<(i32, Outcome)> = parts
                    .into_iter()
                    .map(|(index, records)| {
                        let o = match &ge {
                            Some((e, m)) => Outcome::err(*e, m.clone()),
                            None => partition(&st, topic.0.as_str(), index, records, peer),
                        };
                        (index, o)
                    })
                    .collect();
                (topic, outcomes)
            })
            .collect::<Vec<_>>()
    })
    .await;
    let done = match done {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "produce task failed");
            Vec::new()
        }
    };
    if acks == 0 {
        return None;
    }
    let mut resp = ProduceResponse::default();
    for (topic, outcomes) in done {
        let mut t = TopicProduceResponse::default();
        t.name = topic;
        for (index, o) in outcomes {
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
            t.partition_responses.push(p);
        }
        resp.responses.push(t);
    }
    Some(resp)
}

/// Decodes, checks and stores one partition's batches (blocking).
fn partition(
    state: &State,
    topic: &str,
    index: i32,
    records: Option<Bytes>,
    peer: SocketAddr,
) -> Outcome {
    let Some(info) = state.host.topic(topic) else {
        return Outcome::err(
            ResponseError::UnknownTopicOrPartition,
            format!("topic {topic} does not exist"),
        );
    };
    if index < 0 || index >= info.partitions {
        return Outcome::err(
            ResponseError::UnknownTopicOrPartition,
            format!(
                "topic {topic} has {} partitions, not {index}",
                info.partitions
            ),
        );
    }
    if !info.writable {
        return Outcome::err(
            ResponseError::TopicAuthorizationFailed,
            format!("topic {topic} is not writable (its permission forbids writes)"),
        );
    }
    let Some(bytes) = records else {
        return Outcome::err(ResponseError::CorruptMessage, "no records");
    };
    let sets =
        match crate::records::decode_record_set(bytes, state.config.max_batch_decompressed_bytes) {
            Ok(s) => s,
            Err(e) => {
                let err = match e {
                    BatchError::LegacyFormat(_) => ResponseError::UnsupportedForMessageFormat,
                    BatchError::TooLarge { .. } => ResponseError::RecordListTooLarge,
                    BatchError::Malformed(_) => ResponseError::CorruptMessage,
                };
                if !matches!(e, BatchError::LegacyFormat(_)) {
                    state
                        .counters
                        .batches_malformed
                        .fetch_add(1, Ordering::Relaxed);
                }
                return Outcome::err(err, format!("record batch rejected: {e}"));
            }
        };
    let max = state.host.max_message_bytes();
    let cluster = state.host.cluster_name();
    let now = wall_ms();
    let convert = |recs: &[Record]| -> Result<Vec<MessageExtBrokerInner>, Outcome> {
        recs.iter()
            .map(|r| {
                let size = r.value.as_ref().map_or(0, |v| v.len());
                if size > max {
                    return Err(Outcome::err(
                        ResponseError::MessageTooLarge,
                        format!("record of {size} bytes exceeds the limit of {max} bytes"),
                    ));
                }
                let mut m = record_to_message(r, topic, index, peer, &cluster)
                    .map_err(|e| Outcome::err(ResponseError::InvalidRecord, e))?;
                if m.born_timestamp < 0 {
                    m.born_timestamp = now;
                }
                Ok(m)
            })
            .collect()
    };
    for s in &sets {
        if s.records.iter().any(|r| r.transactional || r.control) {
            return Outcome::err(
                ResponseError::InvalidRecord,
                "transactional and control batches are not supported",
            );
        }
    }
    let log_start = state.store.min_offset(topic, index) as i64;
    let idempotent = sets
        .first()
        .and_then(|s| s.records.first())
        .is_some_and(|r| r.producer_id >= 0);
    if !idempotent {
        let all: Vec<Record> = sets.into_iter().flat_map(|s| s.records).collect();
        if all.is_empty() {
            return Outcome::err(ResponseError::CorruptMessage, "empty record batch");
        }
        let msgs = match convert(&all) {
            Ok(m) => m,
            Err(o) => return o,
        };
        return match store(state, &msgs) {
            Ok(base) => Outcome {
                error: None,
                base_offset: base,
                log_start,
            },
            Err(o) => o,
        };
    }
    // Idempotent: check each batch's sequence range against the producer's state.
    let first = &sets[0].records[0];
    let Some(entry) = state.producers.get(first.producer_id) else {
        return Outcome::err(
            ResponseError::UnknownProducerId,
            format!(
                "producer id {} is not known (expired or from before a restart)",
                first.producer_id
            ),
        );
    };
    let mut entry = entry.lock();
    let mut base_offset: Option<i64> = None;
    for s in &sets {
        let (Some(head), Some(tail)) = (s.records.first(), s.records.last()) else {
            continue;
        };
        if head.producer_id != first.producer_id {
            return Outcome::err(
                ResponseError::InvalidRecord,
                "batches of different producers in one partition",
            );
        }
        match entry.check(
            topic,
            index,
            head.producer_epoch,
            head.sequence,
            tail.sequence,
        ) {
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
                return Outcome::err(
                    e,
                    format!(
                        "batch with sequence {}..={} (epoch {}) refused",
                        head.sequence, tail.sequence, head.producer_epoch
                    ),
                );
            }
            SeqCheck::Append => {
                let msgs = match convert(&s.records) {
                    Ok(m) => m,
                    Err(o) => return o,
                };
                match store(state, &msgs) {
                    Ok(at) => {
                        entry.record(
                            topic,
                            index,
                            head.producer_epoch,
                            head.sequence,
                            tail.sequence,
                            at,
                        );
                        base_offset.get_or_insert(at);
                    }
                    Err(o) => return o,
                }
            }
        }
    }
    match base_offset {
        Some(b) => Outcome {
            error: None,
            base_offset: b,
            log_start,
        },
        None => Outcome::err(ResponseError::CorruptMessage, "empty record batch"),
    }
}

/// Appends messages; returns the first one's queue offset.
fn store(state: &State, msgs: &[MessageExtBrokerInner]) -> Result<i64, Outcome> {
    let r = if msgs.len() == 1 {
        state.store.put_message(&msgs[0])
    } else {
        state.store.put_messages(msgs)
    };
    let r = r.map_err(|e| match e {
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
    state
        .counters
        .records_produced
        .fetch_add(msgs.len() as u64, Ordering::Relaxed);
    r.messages
        .first()
        .map(|m| m.queue_offset as i64)
        .ok_or_else(|| Outcome::err(ResponseError::KafkaStorageError, "the store stored nothing"))
}
