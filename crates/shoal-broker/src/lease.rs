//! The broker's part of the rebalance engine (`docs/rebalance.md`): Shoal member sessions,
//! session locks, lock-freed notices, the offset commit fence, and GET_BROKER_FEATURES.
//!
//! - A Shoal client announces its session timeout in HEART_BEAT ([`field::SESSION_TIMEOUT_MS`],
//!   clamped to `[min_session_timeout_ms, max_session_timeout_ms]`); it then expires after that
//!   long without a heartbeat (official clients keep the 120 s channel expiry) and the answer
//!   names its session ([`field::SESSIONS`]).
//! - Its LOCK_BATCH_MQ ([`field::LEASE`]) takes session locks: they last until it unlocks or
//!   its session ends; the request counts as a heartbeat; a refused member is told the moment
//!   the lock frees (NOTIFY_LOCK_FREED). Official clients' locks keep RocketMQ's TTL.
//! - Offset commits (UPDATE_CONSUMER_OFFSET and a pull's piggy-backed commit) are fenced: a
//!   Shoal member commits only queues whose lock it holds, and never below the stored offset
//!   unless it says it rewinds ([`field::REWIND`]); anyone else is refused only where another
//!   member holds the queue's lock.
//! - Round trips saved for Shoal members: a lock request may ask for the committed offsets of
//!   the granted queues ([`field::WANT_OFFSETS`], answered in [`field::COMMITTED_OFFSETS`],
//!   read after the grant); an unlock may carry the final commits ([`field::COMMIT`]), stored
//!   (fenced as any commit) before the locks are freed; membership notices to Shoal members
//!   carry the member list (`BrokerInner::apply_group_change`).

use crate::group_ctx::GroupCtx;
use crate::reply::{ok, ok_json, Handled, Reject};
use shoal_net::RequestContext;
use shoal_proto::body::{LockBatchRequestBody, LockBatchResponseBody, UnlockBatchRequestBody};
use shoal_proto::ext::{self, feature, field, BrokerFeatures};
use shoal_proto::{MessageQueue, RemotingCommand};
use tracing::debug;

/// GET_BROKER_FEATURES.
pub fn features(cx: &GroupCtx<'_>) -> Handled {
    let mut features = vec![
        feature::SESSION_LOCKS.into(),
        feature::LOCK_FREED_NOTICE.into(),
        feature::COMMIT_FENCE.into(),
        feature::OFFSET_ON_GRANT.into(),
        feature::COMMIT_ON_UNLOCK.into(),
        feature::MEMBER_LIST_NOTICE.into(),
    ];
    if cx.config.coordinator.enabled {
        features.push(feature::COORDINATOR.into());
    }
    ok_json(&BrokerFeatures {
        features,
        min_session_timeout_ms: cx.config.min_session_timeout_ms,
        max_session_timeout_ms: cx.config.max_session_timeout_ms,
    })
}

/// The session timeout a heartbeat asks for, clamped to the broker's bounds.
pub fn requested_session_timeout(cx: &GroupCtx<'_>, req: &RemotingCommand) -> Option<u64> {
    let ms: u64 = req.ext(field::SESSION_TIMEOUT_MS)?.parse().ok()?;
    Some(
        ms.clamp(
            cx.config.min_session_timeout_ms,
            cx.config
                .max_session_timeout_ms
                .max(cx.config.min_session_timeout_ms),
        ),
    )
}

/// LOCK_BATCH_MQ: session locks for Shoal members, RocketMQ's TTL locks for everyone else.
pub fn lock_batch(cx: &GroupCtx<'_>, ctx: &RequestContext, req: &RemotingCommand) -> Handled {
    let body: LockBatchRequestBody = req.decode_json_body()?;
    crate::coordinated::check_stamp(cx, &body.consumer_group, &body.mq_set, req)?;
    let now = cx.state.clock().mono_ms();
    if req.ext(field::LEASE) != Some("true") {
        let locked = cx.state.lock().locks.lock_batch(
            &body.consumer_group,
            &body.mq_set,
            &body.client_id,
            now,
        );
        return ok_json(&LockBatchResponseBody {
            lock_ok_mq_set: locked.into_iter().collect(),
        });
    }
    let orderly = req.ext(field::ORDERLY) == Some("true");
    let conn_id = ctx.connection().id();
    // One critical section: the session is checked (and touched) and the locks taken together.
    let granted = cx.state.with(|g, _| {
        let session = g
            .clients
            .touch(&body.consumer_group, conn_id, now)
            .filter(|s| s.client_id == body.client_id)?;
        let locked = g.locks.lock_batch_session(
            &body.consumer_group,
            &body.mq_set,
            &body.client_id,
            session.id,
            orderly,
            now,
        );
        Some((session.id, locked))
    });
    let Some((session, locked)) = granted else {
        let mut r = RemotingCommand::response(
            shoal_proto::code::response_code::SUCCESS,
            Some("no session in this group on this connection: heartbeat first".into()),
        )
        .with_json_body(&LockBatchResponseBody::default())?;
        r.ext_fields = Some(Default::default());
        return Ok(Some(r));
    };
    let locked: Vec<MessageQueue> = locked.into_iter().collect();
    let mut ext_fields = shoal_proto::command::ExtFields::new();
    ext_fields.insert(field::SESSION, session.to_string());
    if req.ext(field::WANT_OFFSETS) == Some("true") {
        // Read after the grant (outside the group-state lock): from now on only this member
        // may move these offsets (commit fence), so they are what a query would answer.
        let committed: Vec<(&str, i32, i64)> = locked
            .iter()
            .filter_map(|q| {
                cx.store
                    .query_offset(&body.consumer_group, &q.topic, q.queue_id)
                    .map(|o| (q.topic.as_str(), q.queue_id, o))
            })
            .collect();
        ext_fields.insert(
            field::COMMITTED_OFFSETS,
            ext::encode_queue_offsets(committed),
        );
    }
    let mut r = RemotingCommand::response(shoal_proto::code::response_code::SUCCESS, None)
        .with_json_body(&LockBatchResponseBody {
            lock_ok_mq_set: locked,
        })?;
    r.ext_fields = Some(ext_fields);
    Ok(Some(r))
}

/// UNLOCK_BATCH_MQ: stores the final commits it carries ([`field::COMMIT`]), then releases the
/// client's locks and tells the members waiting for them.
///
/// A carried commit is checked as UPDATE_CONSUMER_OFFSET checks one (the topic and queue id,
/// the member epoch of a coordinated member, the commit fence) and stored before the locks are
/// freed: while this member holds a lock nobody else is granted it, so the next owner's grant
/// (and the offset it carries) comes after it. A refused commit is named in the answer's
/// remark; the unlock still happens.
pub fn unlock_batch(cx: &GroupCtx<'_>, conn_id: u64, req: &RemotingCommand) -> Handled {
    let body: UnlockBatchRequestBody = req.decode_json_body()?;
    let mut refused = Vec::new();
    if let Some(text) = req.ext(field::COMMIT) {
        for (topic, queue_id, offset) in ext::decode_queue_offsets(text) {
            let Some(mq) = body
                .mq_set
                .iter()
                .find(|q| q.topic == topic && q.queue_id == queue_id)
            else {
                refused.push(format!("{topic}:{queue_id} (not unlocked by this request)"));
                continue;
            };
            match final_commit(cx, conn_id, &body.consumer_group, mq, offset, req) {
                Ok(()) => cx
                    .store
                    .commit_offset(&body.consumer_group, &topic, queue_id, offset),
                Err(r) => refused.push(format!("{topic}:{queue_id} ({})", r.remark)),
            }
        }
    }
    cx.state.with(|g, now| {
        let freed = g
            .locks
            .unlock_batch(&body.consumer_group, &body.mq_set, &body.client_id);
        // Evidence for the coordinator: revoked queues are free for their next owners.
        g.unlocked(&body.consumer_group, &body.client_id, &body.mq_set, now);
        // The waiters are told after the lock is released ([`GroupEffect::LockFreed`]).
        g.locks_freed(&body.consumer_group, &freed);
    });
    if refused.is_empty() {
        return ok();
    }
    debug!(group = %body.consumer_group, ?refused, "final commits carried by an unlock not stored");
    Ok(Some(RemotingCommand::response(
        shoal_proto::code::response_code::SUCCESS,
        Some(format!(
            "unlocked; final commits not stored: {}",
            refused.join(", ")
        )),
    )))
}

/// The checks of a final commit carried by UNLOCK_BATCH_MQ (those of UPDATE_CONSUMER_OFFSET:
/// member epoch, an existing topic and queue, not negative, the commit fence).
fn final_commit(
    cx: &GroupCtx<'_>,
    conn_id: u64,
    group: &str,
    mq: &MessageQueue,
    offset: i64,
    req: &RemotingCommand,
) -> Result<(), Reject> {
    let own = MessageQueue::new(&mq.topic, &cx.config.broker_name, mq.queue_id);
    crate::coordinated::check_stamp(cx, group, std::slice::from_ref(&own), req)?;
    let Some(queues) = cx.routes.topic_queues(&mq.topic) else {
        return Err(Reject::new(
            shoal_proto::code::response_code::TOPIC_NOT_EXIST,
            format!("topic[{}] not exist", mq.topic),
        ));
    };
    if !queues.contains(&own) {
        return Err(Reject::new(
            shoal_proto::code::response_code::INVALID_PARAMETER,
            format!("queueId[{}] is illegal", mq.queue_id),
        ));
    }
    if offset < 0 {
        return Err(Reject::new(
            shoal_proto::code::response_code::INVALID_PARAMETER,
            format!("commitOffset {offset} is negative"),
        ));
    }
    check_commit(cx, conn_id, group, &mq.topic, mq.queue_id, offset, false)
}

/// The commit fence: may the connection `conn_id` store `offset` for the queue?
pub fn check_commit(
    cx: &GroupCtx<'_>,
    conn_id: u64,
    group: &str,
    topic: &str,
    queue_id: i32,
    offset: i64,
    rewind: bool,
) -> Result<(), Reject> {
    let mq = MessageQueue::new(topic, cx.config.broker_name.clone(), queue_id);
    let now = cx.state.clock().mono_ms();
    // The member's session and the queue's lock holder, read in one critical section.
    let (session, holder) = cx.state.with(|g, _| {
        (
            g.clients.session(group, conn_id),
            g.locks
                .holder(group, &mq, now)
                .map(|h| h.client_id.to_string()),
        )
    });
    let refuse = |why: String| {
        cx.counters.commits_fenced.inc();
        Err(Reject::new(ext::response_code::QUEUE_NOT_LOCKED, why))
    };
    match session {
        Some(s) if s.timeout_ms.is_some() => {
            if holder.as_deref() != Some(s.client_id.as_str()) {
                return refuse(format!(
                    "{} does not hold the lock of {mq}; the offset is not moved",
                    s.client_id
                ));
            }
            if !rewind {
                if let Some(stored) = cx.store.query_offset(group, topic, queue_id) {
                    if offset < stored {
                        return refuse(format!(
                            "commit {offset} of {mq} is below the stored {stored}; the offset is not moved back"
                        ));
                    }
                }
            }
            Ok(())
        }
        s => match holder {
            Some(h) if s.as_ref().is_none_or(|s| s.client_id != h) => {
                refuse(format!("{mq} is locked by {h}; the offset is not moved"))
            }
            _ => Ok(()),
        },
    }
}

/// Logs a commit that a fence refused on a pull (pulls are still answered).
pub fn piggyback_refused(r: &Reject) {
    debug!(remark = %r.remark, "offset carried by a pull not stored");
}
