//! PULL_MESSAGE and LITE_PULL_MESSAGE (spec 5.2), with long polling.

use crate::broker::{wall_ms, BrokerInner, PullMark};
use crate::reply::{Handled, Reject};
use shoal_net::RequestContext;
use shoal_proto::body::{ExpressionType, MessageModel, SubscriptionData};
use shoal_proto::code::response_code as resp;
use shoal_proto::constants::{perm, pull_sys_flag};
use shoal_proto::header::{PullMessageRequestHeader, PullMessageResponseHeader};
use shoal_proto::RemotingCommand;
use shoal_store::{GetMessageResult, GetMessageStatus};
use std::sync::Arc;
use std::time::Duration;

/// A validated pull, ready to run against the store (again, after a wake-up).
struct PullPlan {
    header: PullMessageRequestHeader,
    filter: Option<SubscriptionData>,
    /// An SQL92 subscription's selector (then `filter` is `None`).
    sql: Option<Arc<shoal_filter::Selector>>,
}

/// Handles a pull: validates it, commits the piggy-backed offset, reads, and either answers
/// or holds the request until a matching message arrives.
pub async fn pull_message(
    b: &Arc<BrokerInner>,
    ctx: &RequestContext,
    req: &RemotingCommand,
) -> Handled {
    let h: PullMessageRequestHeader = req.decode_command_header()?;
    let plan = validate(b, ctx, h)?;
    // A group auto-created by this pull is durable before the answer.
    if b.tables_dirty() {
        Box::pin(b.persist_tables()).await?;
    }
    let h = &plan.header;
    let mq = shoal_proto::MessageQueue::new(&h.topic, &b.config.broker_name, h.queue_id);
    crate::coordinated::check_stamp(&b.group_ctx(), &h.consumer_group, &[mq], req)?;
    if h.sys_flag & pull_sys_flag::COMMIT_OFFSET != 0 && h.commit_offset >= 0 {
        match crate::lease::check_commit(
            &b.group_ctx(),
            ctx.connection().id(),
            &h.consumer_group,
            &h.topic,
            h.queue_id,
            h.commit_offset,
            false,
        ) {
            Ok(()) => {
                b.store
                    .commit_offset(&h.consumer_group, &h.topic, h.queue_id, h.commit_offset)
            }
            Err(r) => crate::lease::piggyback_refused(&r),
        }
    }
    let mark = PullMark {
        offset: h.queue_offset,
        at_ms: wall_ms(),
        conn_id: ctx.connection().id(),
    };
    let owner_changed = b
        .pull_marks
        .lock()
        .insert(
            (h.consumer_group.clone(), h.topic.clone(), h.queue_id),
            mark,
        )
        .is_none_or(|prev| prev.conn_id != mark.conn_id);
    if owner_changed {
        // Rare (a queue changing hands): recorded for the rebalance timeline.
        b.note_owner_change(&h.consumer_group, &h.topic, h.queue_id, mark);
    }
    let result = read(b, &plan).await?;
    let may_suspend = h.sys_flag & pull_sys_flag::SUSPEND != 0;
    let nothing_new = result.status == GetMessageStatus::OffsetOverflowOne
        || (result.status == GetMessageStatus::NoMessageInQueue && h.queue_offset == 0);
    if !(may_suspend && nothing_new) {
        return Ok(Some(answer(result, h.queue_offset)));
    }

    // Long polling: hold until a matching message is stored or the suspend time passes.
    let hold_for = if b.config.long_polling {
        Duration::from_millis(h.suspend_timeout_millis.clamp(0, 60_000) as u64)
    } else {
        Duration::from_millis(b.config.short_polling_ms)
    };
    let offset = h.queue_offset.max(0) as u64;
    let ticket = b
        .holds
        .hold(&h.topic, h.queue_id, offset, plan.filter.clone());
    b.holds.recheck(
        &h.topic,
        h.queue_id,
        b.store.max_offset(&h.topic, h.queue_id),
    );
    b.counters.pulls_held.inc();
    let responder = ctx.responder();
    let b = b.clone();
    tokio::spawn(async move {
        b.holds.wait(ticket, hold_for).await;
        let response = match read(&b, &plan).await {
            Ok(result) => answer(result, plan.header.queue_offset),
            Err(r) => RemotingCommand::response(r.code, Some(r.remark)),
        };
        if let Err(e) = responder.send(response).await {
            tracing::debug!(error = %e, "held pull could not be answered (client gone)");
        }
    });
    Ok(None)
}

fn validate(
    b: &BrokerInner,
    ctx: &RequestContext,
    h: PullMessageRequestHeader,
) -> Result<PullPlan, Reject> {
    // As RocketMQ: a pull for an unknown group creates it when auto-create is on.
    let group = b
        .group_or_auto_create(&h.consumer_group)
        .map_err(|why| Reject::new(resp::SUBSCRIPTION_GROUP_NOT_EXIST, why))?;
    if !group.consume_enable {
        return Err(Reject::new(
            resp::NO_PERMISSION,
            format!("subscription group no permission, {}", h.consumer_group),
        ));
    }
    let topic = b.topics.lock().get(&h.topic).cloned().ok_or_else(|| {
        Reject::new(
            resp::TOPIC_NOT_EXIST,
            format!("topic[{}] not exist, apply first please!", h.topic),
        )
    })?;
    if !perm::is_readable(topic.perm) {
        return Err(Reject::new(
            resp::NO_PERMISSION,
            format!("the topic[{}] pulling message is forbidden", h.topic),
        ));
    }
    if h.queue_id < 0 || h.queue_id >= topic.read_queue_nums {
        return Err(Reject::new(
            resp::INVALID_PARAMETER,
            format!(
                "queueId[{}] is illegal, topic:[{}] topicConfig.readQueueNums:[{}] consumer:[{}]",
                h.queue_id,
                h.topic,
                topic.read_queue_nums,
                ctx.peer_addr()
            ),
        ));
    }
    let filter = if h.sys_flag & pull_sys_flag::SUBSCRIPTION != 0 {
        // Java treats a missing or empty expression type as TAG.
        let expr_type = h
            .expression_type
            .as_deref()
            .filter(|t| !t.is_empty())
            .unwrap_or("TAG");
        let expr = h.subscription.as_deref().unwrap_or("*");
        if let Some(sql) = crate::filter::compile_typed(b, Some(expr_type), expr)? {
            return Ok(PullPlan {
                header: h,
                filter: None,
                sql: Some(sql),
            });
        }
        Some(SubscriptionData::from_tag_expression(
            h.topic.clone(),
            expr,
            h.sub_version,
        ))
    } else {
        let clients = b.clients.lock();
        let g = clients.group(&h.consumer_group).ok_or_else(|| {
            Reject::new(
                resp::SUBSCRIPTION_NOT_EXIST,
                format!(
                    "the consumer's group info not exist, group: {}",
                    h.consumer_group
                ),
            )
        })?;
        if g.meta.message_model == MessageModel::Broadcasting && !group.consume_broadcast_enable {
            return Err(Reject::new(
                resp::NO_PERMISSION,
                format!(
                    "the consumer group[{}] can not consume by broadcast way",
                    h.consumer_group
                ),
            ));
        }
        let sub = clients
            .subscription(&h.consumer_group, &h.topic, Some(ctx.connection().id()))
            .cloned()
            .ok_or_else(|| {
                Reject::new(
                    resp::SUBSCRIPTION_NOT_EXIST,
                    format!(
                        "the consumer's subscription not exist, group: {} topic: {}",
                        h.consumer_group, h.topic
                    ),
                )
            })?;
        if sub.sub_version < h.sub_version {
            return Err(Reject::new(
                resp::SUBSCRIPTION_NOT_LATEST,
                "the consumer's subscription not latest",
            ));
        }
        if sub.expression_type != ExpressionType::Tag {
            let sql = crate::filter::compile(b, &sub)?;
            return Ok(PullPlan {
                header: h,
                filter: None,
                sql,
            });
        }
        Some(sub)
    };
    Ok(PullPlan {
        header: h,
        filter,
        sql: None,
    })
}

async fn read(b: &Arc<BrokerInner>, plan: &PullPlan) -> Result<GetMessageResult, Reject> {
    let h = &plan.header;
    let (store, topic, queue_id) = (b.store.clone(), h.topic.clone(), h.queue_id);
    let offset = h.queue_offset.max(0) as u64;
    // The broker's caps bound what one pull can make it read into memory; the client can only
    // ask for less. A single message larger than the byte cap is still served alone.
    let cap_count = b.config.max_pull_batch_messages;
    let cap_bytes = b.config.max_pull_batch_bytes;
    let asked_count = h.max_msg_nums.max(1) as usize;
    let asked_bytes = h
        .max_msg_bytes
        .filter(|m| *m > 0)
        .map_or(usize::MAX, |m| m as usize);
    let explicit_bytes = h.max_msg_bytes.is_some_and(|m| m > 0);
    if asked_count > cap_count || (explicit_bytes && asked_bytes > cap_bytes) {
        let n = b
            .counters
            .pulls_capped
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        if crate::broker::worth_logging(n) {
            tracing::info!(
                asked_count,
                asked_bytes,
                cap_count,
                cap_bytes,
                pulls_capped = n,
                "pull asked for more than max_pull_batch_messages / max_pull_batch_bytes; answer capped"
            );
        }
    }
    let max_count = asked_count.min(cap_count);
    let max_bytes = asked_bytes.min(cap_bytes);
    let filter = plan.filter.clone();
    let negative = h.queue_offset < 0;
    // Read on the connection's task: consume-queue entries and records come from the page
    // cache (two positional reads), cheaper than a hop to a blocking thread.
    let pass = |code: i64| filter.as_ref().is_none_or(|f| f.matches_tags_code(code));
    let mut r = store
        .get_messages(&topic, queue_id, offset, max_count, max_bytes, &pass)
        .map_err(|e| Reject::system(format!("get message failed: {e}")))?;
    if let Some(sql) = &plan.sql {
        crate::filter::retain_matching(sql, &mut r);
    }
    if negative && r.status != GetMessageStatus::NoMessageInQueue {
        r.status = GetMessageStatus::OffsetTooSmall;
        r.next_begin_offset = r.min_offset;
        r.messages = bytes::Bytes::new();
        r.message_count = 0;
    }
    b.counters.msgs_got.inc_by(r.message_count as u64);
    if r.message_count > 0 {
        b.metrics
            .topic(&h.topic)
            .pulled(r.message_count as u64, r.messages.len() as u64);
    }
    Ok(r)
}

fn answer(r: GetMessageResult, request_offset: i64) -> RemotingCommand {
    use GetMessageStatus::*;
    let (code, remark) = match r.status {
        Found => (resp::SUCCESS, "FOUND"),
        NoMatchedMessage => (resp::PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE"),
        // Empty queue: offset 0 is "nothing new", anything else has moved.
        NoMessageInQueue if request_offset == 0 => (resp::PULL_NOT_FOUND, "NO_MESSAGE_IN_QUEUE"),
        NoMessageInQueue => (resp::PULL_OFFSET_MOVED, "NO_MESSAGE_IN_QUEUE"),
        OffsetTooSmall => (resp::PULL_OFFSET_MOVED, "OFFSET_TOO_SMALL"),
        OffsetOverflowOne => (resp::PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE"),
        OffsetOverflowBadly => (resp::PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY"),
    };
    let header = PullMessageResponseHeader {
        suggest_which_broker_id: 0,
        next_begin_offset: r.next_begin_offset as i64,
        min_offset: r.min_offset as i64,
        max_offset: r.max_offset as i64,
        ..Default::default()
    };
    let mut cmd = RemotingCommand::response(code, Some(remark.to_string())).with_header(&header);
    if r.status == Found {
        cmd.body = Some(r.messages);
    }
    cmd
}
