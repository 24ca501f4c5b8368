//! The remoting POP codes (RocketMQ 5.x, spec section 8) over the engine: POP_MESSAGE (with
//! long polling; FIFO pops say each message's earlier deliveries in `orderCountInfo`),
//! PEEK_MESSAGE, ACK_MESSAGE, BATCH_ACK_MESSAGE, CHANGE_MESSAGE_INVISIBLETIME, NOTIFICATION,
//! POLLING_INFO, and QUERY_ASSIGNMENT / SET_MESSAGE_REQUEST_MODE for push consumers that let
//! the broker assign (`setClientRebalance(false)`). POP_ROLLBACK (an operator's code no
//! client sends) is answered REQUEST_CODE_NOT_SUPPORTED by the dispatcher.

use super::consume::{
    ack, change_invisible, has_message, pop_waiting, release, try_pop, PopAsk, PopOutcome,
    MAX_BATCH, MAX_POLL_MS,
};
use super::revive::pop_retry_topic;
use super::view;
use crate::reply::{ok, ok_json, Handled, Reject};
use crate::shared::Shared;
use bytes::BytesMut;
use shoal_group::pop::QueueKey;
use shoal_net::RequestContext;
use shoal_proto::body::{
    BatchAckMessageRequestBody, MessageQueueAssignment, MessageRequestMode,
    QueryAssignmentRequestBody, QueryAssignmentResponseBody, SetMessageRequestModeRequestBody,
    SubscriptionData,
};
use shoal_proto::code::response_code as resp;
use shoal_proto::constants::RETRY_GROUP_TOPIC_PREFIX;
use shoal_proto::header::{
    build_msg_offset_info, build_order_count_info, build_start_offset_info,
    AckMessageRequestHeader, ChangeInvisibleTimeRequestHeader, ChangeInvisibleTimeResponseHeader,
    NotificationRequestHeader, NotificationResponseHeader, PeekMessageRequestHeader, PopExtraInfo,
    PopMessageRequestHeader, PopMessageResponseHeader, PopMsgOffsets, PopOrderCount, PopRetryFlag,
    PopStartOffset,
};
use shoal_proto::{MessageQueue, RemotingCommand};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most offsets one BATCH_ACK_MESSAGE acknowledges (its receipts beyond are refused).
const MAX_BATCH_ACK_OFFSETS: usize = 1_024;

fn retry_flag(topic: &str) -> PopRetryFlag {
    PopRetryFlag::of_topic(topic)
}

fn pop_response(out: &PopOutcome, fifo: bool) -> RemotingCommand {
    let mut starts: Vec<PopStartOffset> = Vec::new();
    let mut counts: Vec<PopOrderCount> = Vec::new();
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
        if fifo {
            counts.push(PopOrderCount {
                retry: flag,
                queue_id: m.key.queue_id,
                queue_offset: m.offset as i64,
                count: m.attempts.saturating_sub(1) as i32,
            });
        }
        body.extend_from_slice(&m.record);
    }
    let header = PopMessageResponseHeader {
        pop_time: out.pop_time as i64,
        invisible_time: out.invisible_ms as i64,
        revive_qid: 0,
        rest_num: out.rest as i64,
        start_offset_info: Some(build_start_offset_info(&starts)),
        msg_offset_info: Some(build_msg_offset_info(&offsets)),
        order_count_info: fifo.then(|| build_order_count_info(&counts)),
    };
    let mut cmd =
        RemotingCommand::response(resp::SUCCESS, Some("FOUND".into())).with_header(&header);
    cmd.body = Some(body.freeze());
    cmd
}

/// POP_MESSAGE (200050).
pub(crate) async fn pop_message(
    b: &Arc<Shared>,
    ctx: &RequestContext,
    req: &RemotingCommand,
) -> Handled {
    let h: PopMessageRequestHeader = req.decode_command_header()?;
    view::consumer_group(b, &h.consumer_group)?;
    let n = view::readable_queues(b, &h.topic)?;
    check_queue_and_batch(&h.topic, h.queue_id, n, h.max_msg_nums)?;
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
            pop_response(&first, ask.fifo)
        }));
    }
    let poll = Duration::from_millis(h.poll_time.clamp(0, MAX_POLL_MS) as u64);
    let responder = ctx.responder();
    let b = b.clone();
    tokio::spawn(async move {
        let conn = responder.connection().clone();
        let mut leased = None;
        let r = match pop_waiting(&b, &ask, poll, || conn.is_closed()).await {
            Ok(Ok(out)) if !out.messages.is_empty() => {
                let r = pop_response(&out, ask.fifo);
                leased = Some(out);
                r
            }
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
            if let Some(out) = leased {
                release(&b, &out);
            }
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

/// PEEK_MESSAGE (200052): up to `maxMsgNums` messages from where the group stands in each
/// queue (its acked offset, so messages under lease are shown too), leasing nothing and
/// changing nothing. Answered as a pop is (PULL_NOT_FOUND when there is nothing).
pub(crate) fn peek_message(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: PeekMessageRequestHeader = req.decode_command_header()?;
    view::consumer_group(b, &h.consumer_group)?;
    let n = view::readable_queues(b, &h.topic)?;
    check_queue_and_batch(&h.topic, h.queue_id, n, h.max_msg_nums)?;
    let queues: Vec<i32> = if h.queue_id < 0 {
        (0..n).collect()
    } else {
        vec![h.queue_id]
    };
    let mut body = BytesMut::new();
    let mut found = 0usize;
    let mut rest = 0u64;
    for q in queues {
        let key = QueueKey::new(&h.consumer_group, &h.topic, q);
        let from = b
            .pop
            .queue_offsets(&key)
            .map_or_else(|| view::start_offset(b, &key, true), |(acked, _)| acked);
        let (_, max) = view::queue_bounds(b, &h.topic, q);
        let left = (h.max_msg_nums as usize).saturating_sub(found);
        let mut read = 0u64;
        if left > 0 && from < max {
            let r = view::read(b, &h.topic, q, from, left, &|_| true)?;
            read = r.queue_offsets.len() as u64;
            found += r.queue_offsets.len();
            body.extend_from_slice(&r.messages);
        }
        rest += max.saturating_sub(from).saturating_sub(read);
    }
    if found == 0 {
        return Err(Reject::new(resp::PULL_NOT_FOUND, "no new message"));
    }
    let header = PopMessageResponseHeader {
        rest_num: rest as i64,
        ..Default::default()
    };
    let mut cmd =
        RemotingCommand::response(resp::SUCCESS, Some("FOUND".into())).with_header(&header);
    cmd.body = Some(body.freeze());
    Ok(Some(cmd))
}

/// A pop's or peek's queue id (−1 or a read queue) and batch size (1..=[`MAX_BATCH`]).
fn check_queue_and_batch(topic: &str, queue_id: i32, queues: i32, max: i32) -> Result<(), Reject> {
    if queue_id >= queues || queue_id < -1 {
        return Err(Reject::new(
            resp::INVALID_PARAMETER,
            format!("queueId[{queue_id}] is illegal, topic:[{topic}] readQueueNums:[{queues}]"),
        ));
    }
    if max <= 0 || max > MAX_BATCH {
        return Err(Reject::new(
            resp::INVALID_PARAMETER,
            format!("the max message number {max} must be in 1..={MAX_BATCH}"),
        ));
    }
    Ok(())
}

/// BATCH_ACK_MESSAGE (200151): the acks of several receipts at once, one entry per pop of a
/// queue with a bit set of offsets. Every receipt is checked as ACK_MESSAGE checks it; the
/// good ones are acknowledged even when others are refused, and the answer is SUCCESS only
/// when none was (otherwise NO_MESSAGE naming the first refusals). At most
/// [`MAX_BATCH_ACK_OFFSETS`] offsets per request.
pub(crate) fn batch_ack_message(b: &Shared, req: &RemotingCommand) -> Handled {
    let body: BatchAckMessageRequestBody = req.decode_json_body()?;
    if !body.broker_name.is_empty() && body.broker_name != b.config.broker_name {
        return Err(Reject::new(
            resp::NO_MESSAGE,
            format!(
                "the receipts were issued by broker {}, not {}",
                body.broker_name, b.config.broker_name
            ),
        ));
    }
    let mut budget = MAX_BATCH_ACK_OFFSETS;
    let mut total = 0usize;
    let mut refused: Vec<String> = Vec::new();
    for a in &body.acks {
        let retry = match a.retry.as_deref() {
            Some("1") => PopRetryFlag::RetryV1,
            Some("2") => PopRetryFlag::RetryV2,
            _ => PopRetryFlag::Normal,
        };
        let extra = PopExtraInfo {
            retry,
            ..PopExtraInfo::default()
        };
        let key = receipt_key(&a.consumer_group, &a.topic, a.queue_id, &extra);
        for offset in a.offsets(budget.saturating_add(1)) {
            total += 1;
            if budget == 0 {
                refused.push(format!(
                    "{}#{} {offset}: more than {MAX_BATCH_ACK_OFFSETS} offsets in one batch",
                    key.topic, key.queue_id
                ));
                continue;
            }
            budget -= 1;
            match ack(b, &key, offset.max(0) as u64, a.pop_time.max(0) as u64) {
                Ok(()) => {}
                Err(r) if r.code == resp::SYSTEM_ERROR => return Err(r),
                Err(r) => refused.push(format!(
                    "{}#{} {offset}: {}",
                    key.topic, key.queue_id, r.remark
                )),
            }
        }
    }
    if refused.is_empty() {
        return ok();
    }
    let shown: Vec<&str> = refused.iter().take(3).map(String::as_str).collect();
    Err(Reject::new(
        resp::NO_MESSAGE,
        format!(
            "{} of {total} receipts refused: {}",
            refused.len(),
            shown.join("; ")
        ),
    ))
}

/// ACK_MESSAGE (200051).
pub(crate) fn ack_message(b: &Shared, req: &RemotingCommand) -> Handled {
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
pub(crate) fn change_invisible_time(b: &Shared, req: &RemotingCommand) -> Handled {
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

/// NOTIFICATION (200054): are there messages to pop? Held up to `pollTime` until there are.
pub(crate) async fn notification(
    b: &Arc<Shared>,
    ctx: &RequestContext,
    req: &RemotingCommand,
) -> Handled {
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
pub(crate) fn polling_info(b: &Shared) -> Handled {
    let mut cmd = RemotingCommand::response(resp::SUCCESS, None);
    cmd.ext_fields.get_or_insert_with(Default::default).insert(
        "pollingNum",
        b.pop.polling.load(Ordering::Relaxed).to_string(),
    );
    Ok(Some(cmd))
}

/// SET_MESSAGE_REQUEST_MODE (401).
pub(crate) fn set_message_request_mode(b: &Shared, req: &RemotingCommand) -> Handled {
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
pub(crate) fn query_assignment(b: &Shared, req: &RemotingCommand) -> Handled {
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
