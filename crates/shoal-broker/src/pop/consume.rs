//! The protocol-neutral core of POP consumption, shared by the remoting codes ([`super::remoting`])
//! and the gRPC endpoint: one pop against the engine (queue choice, reads, leases), long
//! polling, acks and invisibility changes by receipt, and "has the group anything to pop".

use super::revive::pop_retry_topic;
use super::view;
use crate::reply::Reject;
use crate::shared::Shared;
use bytes::Bytes;
use shoal_group::pop::{Candidate, QueueKey, ReceiptError};
use shoal_proto::body::SubscriptionData;
use shoal_proto::code::response_code as resp;
use shoal_proto::constants::RETRY_GROUP_TOPIC_PREFIX;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest long-poll of a pop, ms.
pub(crate) const MAX_POLL_MS: i64 = 60_000;
/// Most messages one pop returns (RocketMQ clients ask 1..32).
pub(crate) const MAX_BATCH: i32 = 32;

/// A validated pop.
#[derive(Debug, Clone)]
pub(crate) struct PopAsk {
    /// Consumer group.
    pub group: String,
    /// Topic (never a retry topic: its retry queues are added).
    pub topic: String,
    /// One queue, or every readable queue (`None`).
    pub queue_id: Option<i32>,
    /// At most this many messages.
    pub max: usize,
    /// Lease length, ms.
    pub invisible_ms: u64,
    /// New queues start at their first offset (else at their last).
    pub from_min: bool,
    /// In order (FIFO): one batch per queue until acked.
    pub fifo: bool,
    /// Tag filter.
    pub tags: Option<SubscriptionData>,
    /// SQL92 filter.
    pub sql: Option<Arc<shoal_filter::Selector>>,
    /// Who asks (receipts name it; shown by `group describe`).
    pub consumer: String,
}

/// One popped message: its stored record and where it came from.
#[derive(Debug, Clone)]
pub(crate) struct Popped {
    /// The queue (the topic may be the POP retry topic).
    pub key: QueueKey,
    /// Queue offset.
    pub offset: u64,
    /// The stored record.
    pub record: Bytes,
    /// Deliveries of this message so far, this one included (FIFO queues count in place;
    /// other messages count through the reconsume times of their retry copies).
    pub attempts: u32,
}

/// What a pop found.
#[derive(Debug, Clone, Default)]
pub(crate) struct PopOutcome {
    /// Receipt time of every message.
    pub pop_time: u64,
    /// Lease length granted, ms.
    pub invisible_ms: u64,
    /// The messages, queue by queue.
    pub messages: Vec<Popped>,
    /// Messages left in the queues read (approximate).
    pub rest: u64,
}

/// Splits a run of stored records into (offset, record) pairs.
fn records(r: &shoal_store::GetMessageResult) -> Vec<(u64, Bytes)> {
    let mut out = Vec::with_capacity(r.queue_offsets.len());
    let mut at = 0usize;
    for &qo in &r.queue_offsets {
        let len = r
            .messages
            .get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map_or(0, |b| i32::from_be_bytes(b).max(0) as usize);
        if len == 0 || at + len > r.messages.len() {
            break;
        }
        out.push((qo, r.messages.slice(at..at + len)));
        at += len;
    }
    out
}

/// Runs one pop against the engine (no waiting): the shared core of remoting and gRPC.
///
/// # Errors
/// Store or journal failures.
pub(crate) fn try_pop(b: &Shared, ask: &PopAsk) -> Result<PopOutcome, Reject> {
    view::serving(b)?;
    let now = b.clock.now_ms();
    let retry = pop_retry_topic(&ask.group, &ask.topic);
    let mut cands: Vec<(QueueKey, bool)> = Vec::new();
    match ask.queue_id {
        Some(q) => cands.push((QueueKey::new(&ask.group, &ask.topic, q), false)),
        None => {
            let n = view::readable_queues(b, &ask.topic)?;
            cands.extend((0..n).map(|q| (QueueKey::new(&ask.group, &ask.topic, q), false)));
        }
    }
    if let Some(n) = view::queue_count(b, &retry) {
        cands.extend((0..n).map(|q| (QueueKey::new(&ask.group, &retry, q), true)));
    }
    let tags = ask.tags.clone();
    let pass = move |code: i64| tags.as_ref().is_none_or(|f| f.matches_tags_code(code));
    let outcome = b
        .pop
        .with_engine(&b.store, |e| -> Result<PopOutcome, Reject> {
            let order = e.plan_pop(&ask.group, &ask.topic, &cands);
            let pop_time = e.next_pop_time(now);
            let mut out = PopOutcome {
                pop_time,
                invisible_ms: e.invisible_ms(ask.invisible_ms),
                ..PopOutcome::default()
            };
            for key in order {
                let left = ask.max.saturating_sub(out.messages.len());
                let (min, max_off) = view::queue_bounds(b, &key.topic, key.queue_id);
                if left == 0 {
                    if let Some((_, cursor)) = e.queue_offsets(&key) {
                        out.rest += max_off.saturating_sub(cursor);
                    }
                    continue;
                }
                let is_retry = key.topic.starts_with(RETRY_GROUP_TOPIC_PREFIX);
                let start = view::start_offset(b, &key, ask.from_min || is_retry);
                let fifo = ask.fifo && !is_retry;
                let Some(plan) = e.read_plan(&key, fifo, left, start, min) else {
                    continue;
                };
                let mut found: Vec<(u64, Bytes)> = Vec::new();
                for &o in &plan.redeliver {
                    let r = view::read(b, &key.topic, key.queue_id, o, 1, &|_| true)?;
                    found.extend(records(&r).into_iter().filter(|(qo, _)| *qo == o));
                }
                let mut scanned_to = plan.from;
                if plan.max_fresh > 0 && plan.from < max_off {
                    let mut r = view::read(
                        b,
                        &key.topic,
                        key.queue_id,
                        plan.from,
                        plan.max_fresh,
                        &pass,
                    )?;
                    if let Some(sql) = ask.sql.as_ref().filter(|_| !is_retry) {
                        crate::filter::retain_matching(sql, &mut r);
                    }
                    use shoal_store::GetMessageStatus as S;
                    if matches!(r.status, S::Found | S::NoMatchedMessage) {
                        scanned_to = r.next_begin_offset;
                    }
                    found.extend(records(&r));
                }
                let cands: Vec<Candidate> = found
                    .iter()
                    .map(|(o, _)| Candidate {
                        offset: *o,
                        matched: true,
                    })
                    .collect();
                let grant = e.handle_read(
                    now,
                    pop_time,
                    &key,
                    &ask.consumer,
                    &cands,
                    scanned_to,
                    ask.invisible_ms,
                );
                for g in &grant.leases {
                    if let Some((_, rec)) = found.iter().find(|(o, _)| *o == g.offset) {
                        out.messages.push(Popped {
                            key: key.clone(),
                            offset: g.offset,
                            record: rec.clone(),
                            attempts: g.attempts,
                        });
                    }
                }
                if let Some((_, cursor)) = e.queue_offsets(&key) {
                    out.rest += max_off.saturating_sub(cursor);
                }
            }
            Ok(out)
        });
    let outcome =
        outcome.map_err(|e| Reject::system(format!("POP journal write failed: {e}")))??;
    let c = if outcome.messages.is_empty() {
        &b.pop.counters.pops_empty
    } else {
        &b.pop.counters.pops_found
    };
    c.fetch_add(1, Ordering::Relaxed);
    if !outcome.messages.is_empty() {
        b.counters.msgs_got.inc_by(outcome.messages.len() as u64);
    }
    Ok(outcome)
}

/// Pops, holding the request up to `poll` until a message arrives. Bounded: past
/// `pop_max_polling` held pops, answers `Err(())` at once with POLLING_FULL counted. A held
/// pop whose client is `gone` (its connection or stream closed) stops without leasing
/// anything, so no message is leased to nobody.
pub(crate) async fn pop_waiting(
    b: &Arc<Shared>,
    ask: &PopAsk,
    poll: Duration,
    gone: impl Fn() -> bool,
) -> Result<Result<PopOutcome, ()>, Reject> {
    let deadline = Instant::now() + poll;
    let mut held = false;
    let result = loop {
        let notified = b.pop.arrivals.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if gone() {
            break Ok(Ok(PopOutcome::default()));
        }
        let out = try_pop(b, ask);
        let done = match &out {
            Ok(o) => !o.messages.is_empty(),
            Err(_) => true,
        };
        let now = Instant::now();
        if done || now >= deadline {
            break out.map(Ok);
        }
        if !held {
            if b.pop.polling.fetch_add(1, Ordering::AcqRel) >= b.pop.max_polling {
                b.pop.polling.fetch_sub(1, Ordering::AcqRel);
                b.pop.counters.polling_full.fetch_add(1, Ordering::Relaxed);
                b.metrics.limit("pop_max_polling").inc();
                break Ok(Err(()));
            }
            held = true;
        }
        // Woken by a stored message; at least once a second (leases lapse, FIFO queues free).
        let wait = (deadline - now).min(Duration::from_secs(1));
        let _ = tokio::time::timeout(wait, notified).await;
    };
    if held {
        b.pop.polling.fetch_sub(1, Ordering::AcqRel);
    }
    result
}

pub(crate) fn refused(e: ReceiptError) -> Reject {
    Reject::new(resp::NO_MESSAGE, e.to_string())
}

/// Acknowledges a receipt; shared with gRPC.
///
/// # Errors
/// NO_MESSAGE for a stale, foreign or lapsed receipt; SYSTEM_ERROR when the journal failed.
pub(crate) fn ack(b: &Shared, key: &QueueKey, offset: u64, pop_time: u64) -> Result<(), Reject> {
    view::serving(b)?;
    let now = b.clock.now_ms();
    b.pop
        .with_engine(&b.store, |e| e.handle_ack(now, key, offset, pop_time))
        .map_err(|e| Reject::system(format!("POP journal write failed: {e}")))?
        .map_err(refused)
}

/// Gives back the leases of a pop whose answer could not be delivered (the client left): each
/// message becomes visible again after the shortest lease (1 s) instead of its whole
/// invisible time.
pub(crate) fn release(b: &Shared, out: &PopOutcome) {
    for m in &out.messages {
        if let Err(e) = change_invisible(b, &m.key, m.offset, out.pop_time, 0) {
            tracing::debug!(error = %e.remark, "lease of an undelivered pop not released");
        }
    }
}

/// Changes a receipt's invisibility; returns the new receipt time and lease length.
///
/// # Errors
/// As [`ack`].
pub(crate) fn change_invisible(
    b: &Shared,
    key: &QueueKey,
    offset: u64,
    pop_time: u64,
    invisible_ms: u64,
) -> Result<(u64, u64), Reject> {
    view::serving(b)?;
    let now = b.clock.now_ms();
    let g = b
        .pop
        .with_engine(&b.store, |e| {
            e.handle_change_invisible(now, key, offset, pop_time, invisible_ms)
        })
        .map_err(|e| Reject::system(format!("POP journal write failed: {e}")))?
        .map_err(refused)?;
    b.pop.revive_wakeup.notify_one();
    Ok((g.pop_time, g.invisible_ms))
}

/// True when some queue of the ask has a message the group has not been handed.
pub(crate) fn has_message(b: &Shared, group: &str, topic: &str, queue_id: i32) -> bool {
    let mut keys: Vec<QueueKey> = Vec::new();
    let n = view::queue_count(b, topic).unwrap_or(0);
    if queue_id >= 0 {
        keys.push(QueueKey::new(group, topic, queue_id));
    } else {
        keys.extend((0..n).map(|q| QueueKey::new(group, topic, q)));
    }
    let retry = pop_retry_topic(group, topic);
    keys.extend(
        (0..view::queue_count(b, &retry).unwrap_or(0)).map(|q| QueueKey::new(group, &retry, q)),
    );
    let cursors: Vec<Option<(u64, u64)>> = {
        let core = b.pop.core.lock();
        keys.iter().map(|k| core.engine.queue_offsets(k)).collect()
    };
    keys.iter().zip(cursors).any(|(k, c)| {
        let (_, max) = view::queue_bounds(b, &k.topic, k.queue_id);
        let at = c.map_or_else(
            || view::start_offset(b, k, k.topic.starts_with(RETRY_GROUP_TOPIC_PREFIX)),
            |(_, cursor)| cursor,
        );
        at < max
    })
}
