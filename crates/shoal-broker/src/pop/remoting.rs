//! The remoting POP codes (RocketMQ 5.x, spec section 8) over the engine: POP_MESSAGE (with
//! long polling), ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, NOTIFICATION, POLLING_INFO, and
//! QUERY_ASSIGNMENT / SET_MESSAGE_REQUEST_MODE for push consumers that let the broker assign
//! (`setClientRebalance(false)`). PEEK_MESSAGE, BATCH_ACK_MESSAGE and POP_ROLLBACK are
//! answered REQUEST_CODE_NOT_SUPPORTED by the dispatcher.

use super::revive::pop_retry_topic;
use super::view;
use crate::reply::{ok, ok_json, Handled, Reject};
use crate::shared::Shared;
use bytes::{Bytes, BytesMut};
use shoal_group::pop::{Candidate, QueueKey, ReceiptError};
use shoal_net::RequestContext;
use shoal_proto::body::{
    MessageQueueAssignment, MessageRequestMode, QueryAssignmentRequestBody,
    QueryAssignmentResponseBody, SetMessageRequestModeRequestBody, SubscriptionData,
};
use shoal_proto::code::response_code as resp;
use shoal_proto::constants::RETRY_GROUP_TOPIC_PREFIX;
use shoal_proto::header::{
    build_msg_offset_info, build_start_offset_info, AckMessageRequestHeader,
    ChangeInvisibleTimeRequestHeader, ChangeInvisibleTimeResponseHeader, NotificationRequestHeader,
    NotificationResponseHeader, PopExtraInfo, PopMessageRequestHeader, PopMessageResponseHeader,
    PopMsgOffsets, PopRetryFlag, PopStartOffset,
};
use shoal_proto::{MessageQueue, RemotingCommand};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest long-poll of a pop, ms.
const MAX_POLL_MS: i64 = 60_000;
/// Most messages one pop returns (RocketMQ clients ask 1..32).
const MAX_BATCH: i32 = 32;

/// A validated pop.
#[derive(Debug, Clone)]
pub struct PopAsk {
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
pub struct Popped {
    /// The queue (the topic may be the POP retry topic).
    pub key: QueueKey,
    /// Queue offset.
    pub offset: u64,
    /// The stored record.
    pub record: Bytes,
}

/// What a pop found.
#[derive(Debug, Clone, Default)]
pub struct PopOutcome {
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
pub fn try_pop(b: &Shared, ask: &PopAsk) -> Result<PopOutcome, Reject> {
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
/// `pop_max_polling` held pops, answers `None` at once with POLLING_FULL counted.
pub async fn pop_waiting(
    b: &Arc<Shared>,
    ask: &PopAsk,
    poll: Duration,
) -> Result<Result<PopOutcome, ()>, Reject> {
    let deadline = Instant::now() + poll;
    let mut held = false;
    let result = loop {
        let notified = b.pop.arrivals.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
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

fn retry_flag(topic: &str) -> PopRetryFlag {
    PopRetryFlag::of_topic(topic)
}

fn pop_response(b: &Shared, out: &PopOutcome) -> RemotingCommand {
    let mut starts: Vec<PopStartOffset> = Vec::new();
    let mut offsets: Vec<PopMsgOffsets> = Vec::new();
    let mut body = BytesMut::new();
    for m in &out.messages {
        let flag = retry_flag(&m.key.topic);
        match offsets
            .iter_mut()
            .find(|o| o.retry == flag && o.queue_id == m.key.queue_id)
        {
            Some(o) => o.offsets.push(m.offset as i64),
            None => {
                starts.push(PopStartOffset {
                    retry: flag,
                    queue_id: m.key.queue_id,
                    start_offset: m.offset as i64,
                });
                offsets.push(PopMsgOffsets {
                    retry: flag,
                    queue_id: m.key.queue_id,
                    offsets: vec![m.offset as i64],
                });
            }
        }
        body.extend_from_slice(&m.record);
    }
    let _ = b;
    let header = PopMessageResponseHeader {
        pop_time: out.pop_time as i64,
        invisible_time: out.invisible_ms as i64,
        revive_qid: 0,
        rest_num: out.rest as i64,
        start_offset_info: Some(build_start_offset_info(&starts)),
        msg_offset_info: Some(build_msg_offset_info(&offsets)),
        order_count_info: None,
    };
    let mut cmd =
        RemotingCommand::response(resp::SUCCESS, Some("FOUND".into())).with_header(&header);
    cmd.body = Some(body.freeze());
    cmd
}

/// POP_MESSAGE (200050).
pub async fn pop_message(b: &Arc<Shared>, ctx: &RequestContext, req: &RemotingCommand) -> Handled {
    let h: PopMessageRequestHeader = req.decode_command_header()?;
    view::consumer_group(b, &h.consumer_group)?;
    let n = view::readable_queues(b, &h.topic)?;
    if h.queue_id >= n || h.queue_id < -1 {
        return Err(Reject::new(
            resp::INVALID_PARAMETER,
            format!(
                "queueId[{}] is illegal, topic:[{}] readQueueNums:[{n}]",
                h.queue_id, h.topic
            ),
        ));
    }
    if h.max_msg_nums <= 0 || h.max_msg_nums > MAX_BATCH {
        return Err(Reject::new(
            resp::INVALID_PARAMETER,
            format!(
                "the max message number {} must be in 1..={MAX_BATCH}",
                h.max_msg_nums
            ),
        ));
    }
    let expr = h.exp.clone().unwrap_or_else(|| "*".into());
    let sql = crate::filter::compile_typed(b, h.exp_type.as_deref(), &expr)?;
    let tags = sql
        .is_none()
        .then(|| SubscriptionData::from_tag_expression(h.topic.clone(), &expr, 0));
    let ask = PopAsk {
        group: h.consumer_group.clone(),
        topic: h.topic.clone(),
        queue_id: (h.queue_id >= 0).then_some(h.queue_id),
        max: h.max_msg_nums as usize,
        invisible_ms: h.invisible_time.max(0) as u64,
        from_min: h.init_mode == 0,
        fifo: h.order,
        tags,
        sql,
        consumer: ctx.peer_addr().to_string(),
    };
    let first = try_pop(b, &ask)?;
    if !first.messages.is_empty() || h.poll_time <= 0 {
        return Ok(Some(if first.messages.is_empty() {
            RemotingCommand::response(resp::PULL_NOT_FOUND, Some("no new message".into()))
        } else {
            pop_response(b, &first)
        }));
    }
    let poll = Duration::from_millis(h.poll_time.clamp(0, MAX_POLL_MS) as u64);
    let responder = ctx.responder();
    let b = b.clone();
    tokio::spawn(async move {
        let r = match pop_waiting(&b, &ask, poll).await {
            Ok(Ok(out)) if !out.messages.is_empty() => pop_response(&b, &out),
            Ok(Ok(_)) => RemotingCommand::response(
                resp::POLLING_TIMEOUT,
                Some("no new message in the poll time".into()),
            ),
            Ok(Err(())) => RemotingCommand::response(
                resp::POLLING_FULL,
                Some("too many pops held (pop_max_polling)".into()),
            ),
            Err(r) => RemotingCommand::response(r.code, Some(r.remark)),
        };
        if let Err(e) = responder.send(r).await {
            tracing::debug!(error = %e, "held pop could not be answered (client gone)");
        }
    });
    Ok(None)
}

/// The queue a receipt names: the header's topic, or the retry topic its flag names.
fn receipt_key(group: &str, topic: &str, queue_id: i32, extra: &PopExtraInfo) -> QueueKey {
    let topic = if topic.starts_with(RETRY_GROUP_TOPIC_PREFIX) {
        topic.to_owned()
    } else {
        match extra.retry {
            PopRetryFlag::Normal => topic.to_owned(),
            _ => pop_retry_topic(group, topic),
        }
    };
    QueueKey::new(group, topic, queue_id)
}

fn refused(e: ReceiptError) -> Reject {
    Reject::new(resp::NO_MESSAGE, e.to_string())
}

fn parse_receipt(b: &Shared, extra_info: &str) -> Result<PopExtraInfo, Reject> {
    let extra = PopExtraInfo::parse(extra_info)
        .map_err(|e| Reject::new(resp::INVALID_PARAMETER, e.to_string()))?;
    if extra.broker_name != b.config.broker_name {
        return Err(Reject::new(
            resp::NO_MESSAGE,
            format!(
                "the receipt was issued by broker {}, not {}",
                extra.broker_name, b.config.broker_name
            ),
        ));
    }
    Ok(extra)
}

/// Acknowledges a receipt; shared with gRPC.
///
/// # Errors
/// NO_MESSAGE for a stale, foreign or lapsed receipt; SYSTEM_ERROR when the journal failed.
pub fn ack(b: &Shared, key: &QueueKey, offset: u64, pop_time: u64) -> Result<(), Reject> {
    let now = b.clock.now_ms();
    b.pop
        .with_engine(&b.store, |e| e.handle_ack(now, key, offset, pop_time))
        .map_err(|e| Reject::system(format!("POP journal write failed: {e}")))?
        .map_err(refused)
}

/// Changes a receipt's invisibility; returns the new receipt time and lease length.
///
/// # Errors
/// As [`ack`].
pub fn change_invisible(
    b: &Shared,
    key: &QueueKey,
    offset: u64,
    pop_time: u64,
    invisible_ms: u64,
) -> Result<(u64, u64), Reject> {
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

/// ACK_MESSAGE (200051).
pub fn ack_message(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: AckMessageRequestHeader = req.decode_command_header()?;
    let extra = parse_receipt(b, &h.extra_info)?;
    let key = receipt_key(&h.consumer_group, &h.topic, h.queue_id, &extra);
    ack(
        b,
        &key,
        h.offset.max(0) as u64,
        extra.pop_time.max(0) as u64,
    )?;
    ok()
}

/// CHANGE_MESSAGE_INVISIBLETIME (200053).
pub fn change_invisible_time(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: ChangeInvisibleTimeRequestHeader = req.decode_command_header()?;
    let extra = parse_receipt(b, &h.extra_info)?;
    let key = receipt_key(&h.consumer_group, &h.topic, h.queue_id, &extra);
    let (pop_time, invisible) = change_invisible(
        b,
        &key,
        h.offset.max(0) as u64,
        extra.pop_time.max(0) as u64,
        h.invisible_time.max(0) as u64,
    )?;
    let header = ChangeInvisibleTimeResponseHeader {
        pop_time: pop_time as i64,
        invisible_time: invisible as i64,
        revive_qid: 0,
    };
    Ok(Some(
        RemotingCommand::response(resp::SUCCESS, None).with_header(&header),
    ))
}

/// True when some queue of the ask has a message the group has not been handed.
fn has_message(b: &Shared, group: &str, topic: &str, queue_id: i32) -> bool {
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

/// NOTIFICATION (200054): are there messages to pop? Held up to `pollTime` until there are.
pub async fn notification(b: &Arc<Shared>, ctx: &RequestContext, req: &RemotingCommand) -> Handled {
    let h: NotificationRequestHeader = req.decode_command_header()?;
    view::consumer_group(b, &h.consumer_group)?;
    view::readable_queues(b, &h.topic)?;
    let answer = |has: bool| {
        RemotingCommand::response(resp::SUCCESS, None).with_header(&NotificationResponseHeader {
            has_msg: has,
            polling_full: false,
        })
    };
    if has_message(b, &h.consumer_group, &h.topic, h.queue_id) || h.poll_time <= 0 {
        return Ok(Some(answer(has_message(
            b,
            &h.consumer_group,
            &h.topic,
            h.queue_id,
        ))));
    }
    let deadline = Instant::now() + Duration::from_millis(h.poll_time.clamp(0, MAX_POLL_MS) as u64);
    let responder = ctx.responder();
    let b = b.clone();
    tokio::spawn(async move {
        b.pop.polling.fetch_add(1, Ordering::AcqRel);
        let has = loop {
            let notified = b.pop.arrivals.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let has = has_message(&b, &h.consumer_group, &h.topic, h.queue_id);
            let now = Instant::now();
            if has || now >= deadline {
                break has;
            }
            let _ =
                tokio::time::timeout((deadline - now).min(Duration::from_secs(1)), notified).await;
        };
        b.pop.polling.fetch_sub(1, Ordering::AcqRel);
        let _ = responder.send(answer(has)).await;
    });
    Ok(None)
}

/// POLLING_INFO (200055): pops held now (extField `pollingNum`).
pub fn polling_info(b: &Shared) -> Handled {
    let mut cmd = RemotingCommand::response(resp::SUCCESS, None);
    cmd.ext_fields.get_or_insert_with(Default::default).insert(
        "pollingNum",
        b.pop.polling.load(Ordering::Relaxed).to_string(),
    );
    Ok(Some(cmd))
}

/// SET_MESSAGE_REQUEST_MODE (401).
pub fn set_message_request_mode(b: &Shared, req: &RemotingCommand) -> Handled {
    let body: SetMessageRequestModeRequestBody = req.decode_json_body()?;
    if body.topic.starts_with(RETRY_GROUP_TOPIC_PREFIX) {
        return Err(Reject::new(
            resp::NO_PERMISSION,
            "retry topics are always consumed by PULL",
        ));
    }
    b.pop
        .set_request_mode(
            &body.topic,
            &body.consumer_group,
            body.mode,
            body.pop_share_queue_num,
        )
        .map_err(Reject::system)?;
    ok()
}

/// QUERY_ASSIGNMENT (400): the broker assigns. POP mode: every consumer gets every queue as
/// one queue id −1 (the broker picks at each pop; `popShareQueueNum` is not applied). PULL
/// mode and retry topics: the group's strategy over its consumers, as clients would compute.
pub fn query_assignment(b: &Shared, req: &RemotingCommand) -> Handled {
    let body: QueryAssignmentRequestBody = req.decode_json_body()?;
    let n = view::queue_count(b, &body.topic).ok_or_else(|| {
        Reject::new(
            resp::TOPIC_NOT_EXIST,
            format!("topic[{}] not exist", body.topic),
        )
    })?;
    let broker = b.config.broker_name.clone();
    let (mode, _) = b.pop.request_mode(&body.topic, &body.consumer_group);
    let retry = body.topic.starts_with(RETRY_GROUP_TOPIC_PREFIX);
    let assignments: Vec<MessageQueueAssignment> = if mode == MessageRequestMode::Pop && !retry {
        vec![MessageQueueAssignment {
            attachments: None,
            message_queue: MessageQueue::new(&body.topic, &broker, -1),
            mode: MessageRequestMode::Pop,
        }]
    } else {
        let all: Vec<MessageQueue> = (0..n)
            .map(|q| MessageQueue::new(&body.topic, &broker, q))
            .collect();
        let ids = view::consumer_ids(b, &body.consumer_group);
        let strategy = shoal_group::strategy_by_name(if body.strategy_name.is_empty() {
            "AVG"
        } else {
            &body.strategy_name
        })
        .or_else(|_| shoal_group::strategy_by_name("AVG"))
        .map_err(Reject::system)?;
        let mine = if body.message_model == shoal_proto::body::MessageModel::Broadcasting {
            all
        } else {
            let input = shoal_group::AllocationInput::new(&body.consumer_group, all, ids);
            strategy
                .allocate(&input, &body.client_id)
                .unwrap_or_default()
        };
        mine.into_iter()
            .map(|mq| MessageQueueAssignment {
                attachments: None,
                message_queue: mq,
                mode: MessageRequestMode::Pull,
            })
            .collect()
    };
    ok_json(&QueryAssignmentResponseBody {
        message_queue_assignments: assignments,
    })
}
