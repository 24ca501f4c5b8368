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
//!   carry the member list ([`shoal_group::state::GroupEffect::ConsumerIdsChanged`]).

use crate::caller::Caller;
use crate::fence::{check_commit, check_stamp};
use crate::group_ctx::GroupCtx;
use crate::reply::{ok, ok_json, Handled, Reject};
use shoal_group::state::{LockOutcome, LockRequest};
use shoal_proto::body::{LockBatchRequestBody, LockBatchResponseBody, UnlockBatchRequestBody};
use shoal_proto::ext::{self, feature, field, BrokerFeatures};
use shoal_proto::{MessageQueue, RemotingCommand};
use tracing::debug;

/// GET_BROKER_FEATURES.
pub(crate) fn features(cx: &GroupCtx<'_>) -> Handled {
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
pub(crate) fn requested_session_timeout(cx: &GroupCtx<'_>, req: &RemotingCommand) -> Option<u64> {
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
pub(crate) fn lock_batch(cx: &GroupCtx<'_>, caller: &Caller<'_>, req: &RemotingCommand) -> Handled {
    let body: LockBatchRequestBody = req.decode_json_body()?;
    check_stamp(cx, &body.consumer_group, &body.mq_set, req)?;
    let request = LockRequest {
        group: &body.consumer_group,
        queues: &body.mq_set,
        client_id: &body.client_id,
        conn_id: caller.conn_id,
        session: req.ext(field::LEASE) == Some("true"),
        orderly: req.ext(field::ORDERLY) == Some("true"),
    };
    let (session, locked) = match cx.groups.with(|g, now| g.handle_lock(now, request)) {
        LockOutcome::Ttl(locked) => {
            return ok_json(&LockBatchResponseBody {
                lock_ok_mq_set: locked.into_iter().collect(),
            })
        }
        LockOutcome::Session { granted, session } => (session, granted),
        LockOutcome::NoSession => {
            let mut r = RemotingCommand::response(
                shoal_proto::code::response_code::SUCCESS,
                Some("no session in this group on this connection: heartbeat first".into()),
            )
            .with_json_body(&LockBatchResponseBody::default())?;
            r.ext_fields = Some(Default::default());
            return Ok(Some(r));
        }
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
pub(crate) fn unlock_batch(cx: &GroupCtx<'_>, conn_id: u64, req: &RemotingCommand) -> Handled {
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
    // Evidence for the coordinator (revoked queues are free for their next owners); the
    // waiters are told after the lock is released.
    cx.groups
        .with(|g, now| g.handle_unlock(now, &body.consumer_group, &body.client_id, &body.mq_set));
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
    check_stamp(cx, group, std::slice::from_ref(&own), req)?;
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
    check_commit(cx, conn_id, group, &own, offset, false)
}
