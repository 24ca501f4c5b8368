//! PULL_MESSAGE and LITE_PULL_MESSAGE (spec 5.2), with long polling.

use crate::caller::Caller;
use crate::clock::wall_ms;
use crate::fence::{check_commit, check_stamp, piggyback_refused};
use crate::observe::PullMark;
use crate::reply::{Handled, Reject};
use crate::shared::Shared;
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
pub(crate) struct PullPlan {
    header: PullMessageRequestHeader,
    filter: Option<SubscriptionData>,
    /// An SQL92 subscription's selector (then `filter` is `None`).
    sql: Option<Arc<shoal_filter::Selector>>,
}

/// What a pull gets now.
pub(crate) enum PullNow {
    /// The answer.
    Answer(RemotingCommand),
    /// Nothing new: hold the pull until a matching message is stored, or this long.
    Hold(PullPlan, Duration),
}

/// Handles a pull: validates it, commits the piggy-backed offset, reads, and either answers
/// or holds the request until a matching message arrives.
pub(crate) async fn pull_message(
    b: &Arc<Shared>,
    ctx: &RequestContext,
    req: &RemotingCommand,
) -> Handled {
    let caller = Caller::of(ctx);
    let plan = prepare(b, &caller, req)?;
    // A group auto-created by this pull is durable before the answer.
    if b.tables_dirty() {
        Box::pin(b.persist_tables()).await?;
    }
    let (plan, hold_for) = match pull_now(b, &caller, req, plan)? {
        PullNow::Answer(r) => return Ok(Some(r)),
        PullNow::Hold(plan, hold_for) => (plan, hold_for),
    };
    // Long polling: hold until a matching message is stored or the suspend time passes.
    let h = &plan.header;
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
        let response = match read(&b, &plan) {
            Ok(result) => answer(result, plan.header.queue_offset, answers_as_replica(&b)),
            Err(r) => RemotingCommand::response(r.code, Some(r.remark)),
        };
        if let Err(e) = responder.send(response).await {
            tracing::debug!(error = %e, "held pull could not be answered (client gone)");
        }
    });
    Ok(None)
}

/// Decodes and validates a pull (a group it names is auto-created when allowed).
pub(crate) fn prepare(
    b: &Shared,
    caller: &Caller<'_>,
    req: &RemotingCommand,
) -> Result<PullPlan, Reject> {
    let h: PullMessageRequestHeader = req.decode_command_header()?;
    validate(b, caller, h)
}

/// A validated pull against the store: the member-epoch fence, the piggy-backed commit
/// (fenced), the pull mark, the read; the answer, or a hold when there is nothing new.
pub(crate) fn pull_now(
    b: &Shared,
    caller: &Caller<'_>,
    req: &RemotingCommand,
    plan: PullPlan,
) -> Result<PullNow, Reject> {
    let h = &plan.header;
    let mq = shoal_proto::MessageQueue::new(&h.topic, &b.config.broker_name, h.queue_id);
    let cx = b.group_ctx();
    check_stamp(&cx, &h.consumer_group, std::slice::from_ref(&mq), req)?;
    if h.sys_flag & pull_sys_flag::COMMIT_OFFSET != 0 && h.commit_offset >= 0 {
        match check_commit(
            &cx,
            caller.conn_id,
            &h.consumer_group,
            &mq,
            h.commit_offset,
            false,
        ) {
            Ok(()) => {
                if let Err(r) = crate::replication::store_commit(
                    b,
                    &h.consumer_group,
                    &h.topic,
                    h.queue_id,
                    h.commit_offset,
                ) {
                    piggyback_refused(&r);
                }
            }
            Err(r) => piggyback_refused(&r),
        }
    }
    b.observer.pulled(
        &h.consumer_group,
        &h.topic,
        h.queue_id,
        PullMark {
            offset: h.queue_offset,
            at_ms: wall_ms(),
            conn_id: caller.conn_id,
        },
    );
    let result = read(b, &plan)?;
    let may_suspend = h.sys_flag & pull_sys_flag::SUSPEND != 0;
    let nothing_new = result.status == GetMessageStatus::OffsetOverflowOne
        || (result.status == GetMessageStatus::NoMessageInQueue && h.queue_offset == 0);
    if !(may_suspend && nothing_new) {
        return Ok(PullNow::Answer(answer(
            result,
            h.queue_offset,
            answers_as_replica(b),
        )));
    }
    let hold_for = if b.config.long_polling {
        Duration::from_millis(h.suspend_timeout_millis.clamp(0, 60_000) as u64)
    } else {
        Duration::from_millis(b.config.short_polling_ms)
    };
    Ok(PullNow::Hold(plan, hold_for))
}

fn validate(
    b: &Shared,
    caller: &Caller<'_>,
    h: PullMessageRequestHeader,
) -> Result<PullPlan, Reject> {
    // As RocketMQ: a pull for an unknown group creates it when auto-create is on.
    let group = b
        .sub_groups
        .get_or_auto_create(&h.consumer_group)
        .map_err(|why| Reject::new(resp::SUBSCRIPTION_GROUP_NOT_EXIST, why))?;
    if !group.consume_enable {
        return Err(Reject::new(
            resp::NO_PERMISSION,
            format!("subscription group no permission, {}", h.consumer_group),
        ));
    }
    let topic = b.topics.get(&h.topic).ok_or_else(|| {
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
                h.queue_id, h.topic, topic.read_queue_nums, caller.peer
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
        let found = b.groups.read(|g, _| {
            let clients = g.clients();
            let model = clients
                .group(&h.consumer_group)
                .map(|g| g.meta.message_model);
            let sub = clients
                .subscription(&h.consumer_group, &h.topic, Some(caller.conn_id))
                .cloned();
            (model, sub)
        });
        let (Some(model), sub) = found else {
            return Err(Reject::new(
                resp::SUBSCRIPTION_NOT_EXIST,
                format!(
                    "the consumer's group info not exist, group: {}",
                    h.consumer_group
                ),
            ));
        };
        if model == MessageModel::Broadcasting && !group.consume_broadcast_enable {
            return Err(Reject::new(
                resp::NO_PERMISSION,
                format!(
                    "the consumer group[{}] can not consume by broadcast way",
                    h.consumer_group
                ),
            ));
        }
        let sub = sub.ok_or_else(|| {
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

fn read(b: &Shared, plan: &PullPlan) -> Result<GetMessageResult, Reject> {
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
        if crate::reply::worth_logging(n) {
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

/// Whether this broker answers pulls as a replica of its group: it is not registered as
/// `brokerId` 0 (a replica, a master that lost its lease, or one without an id yet). A lone
/// broker never is.
fn answers_as_replica(b: &Shared) -> bool {
    b.replication.get().is_some() && b.route_broker_id() != Some(0)
}

/// The pull's answer. `suggestWhichBrokerId` is always 0, as RocketMQ brokers with the default
/// `slaveReadEnable = false` answer (a replica included): the client's next pull goes to the
/// master when its route has one and to any replica when it has none. A replica never moves a
/// consumer's offset (RocketMQ's `offsetCheckInSlave = false`): where the master would answer
/// PULL_OFFSET_MOVED, a replica answers PULL_RETRY_IMMEDIATELY and the offset stays, so that a
/// replica a little behind the master's confirmed offset, or one read during a failover, does
/// not send a consumer back (or forward) on its queue.
fn answer(r: GetMessageResult, request_offset: i64, replica: bool) -> RemotingCommand {
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
    // Clients take nextBeginOffset as their next offset on PULL_RETRY_IMMEDIATELY too: a
    // replica hands the requested one back, as RocketMQ's slaves correct no offset.
    let (code, next_begin_offset) =
        if replica && code == resp::PULL_OFFSET_MOVED && request_offset >= 0 {
            (resp::PULL_RETRY_IMMEDIATELY, request_offset)
        } else {
            (code, r.next_begin_offset as i64)
        };
    let header = PullMessageResponseHeader {
        suggest_which_broker_id: 0,
        next_begin_offset,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]
    use super::*;

    fn result(status: GetMessageStatus, next: u64) -> GetMessageResult {
        GetMessageResult {
            status,
            messages: bytes::Bytes::new(),
            message_count: 0,
            queue_offsets: Vec::new(),
            next_begin_offset: next,
            min_offset: 0,
            max_offset: next,
            corrupt_skipped: 0,
        }
    }

    fn header(cmd: &RemotingCommand) -> PullMessageResponseHeader {
        cmd.decode_command_header().unwrap()
    }

    #[test]
    fn a_replica_moves_no_offset_and_a_lone_broker_or_master_does() {
        use GetMessageStatus::*;
        for (status, request) in [(OffsetOverflowBadly, 50), (NoMessageInQueue, 7)] {
            // Master (or a lone broker): the offset moves to the queue's end.
            let m = answer(result(status, 3), request, false);
            assert_eq!(m.code, resp::PULL_OFFSET_MOVED);
            assert_eq!(header(&m).next_begin_offset, 3);
            assert_eq!(header(&m).suggest_which_broker_id, 0);
            // A replica behind: ask again, from the same offset, and go to the master.
            let r = answer(result(status, 3), request, true);
            assert_eq!(r.code, resp::PULL_RETRY_IMMEDIATELY);
            assert_eq!(header(&r).next_begin_offset, request);
            assert_eq!(header(&r).suggest_which_broker_id, 0);
        }
        // Anything else is answered alike by both.
        for status in [OffsetOverflowOne, NoMatchedMessage] {
            let m = answer(result(status, 9), 9, false);
            let r = answer(result(status, 9), 9, true);
            assert_eq!(
                (m.code, header(&m).next_begin_offset),
                (r.code, header(&r).next_begin_offset)
            );
        }
    }
}
