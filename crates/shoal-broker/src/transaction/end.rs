//! END_TRANSACTION (37): a producer's commit or rollback of a half message, after its local
//! transaction or in answer to CHECK_TRANSACTION_STATE.

use super::half::{self, OP_DECISION};
use super::{Decision, HALF_TOPIC};
use crate::caller::Caller;
use crate::clock::wall_ms;
use crate::reply::{blocking, Handled, Reject};
use crate::shared::Shared;
use shoal_proto::code::response_code as resp;
use shoal_proto::header::EndTransactionRequestHeader;
use shoal_proto::message::{
    decode_records, encode_properties, property, sys_flag, DecodeOptions, MessageExt,
};
use shoal_proto::RemotingCommand;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tracing::{debug, info, warn};

/// Reads the message stored at a commit log offset.
pub(crate) async fn message_at(b: &Arc<Shared>, offset: i64) -> Result<Option<MessageExt>, Reject> {
    if offset < 0 {
        return Ok(None);
    }
    let store = b.store.clone();
    let record = blocking(move || {
        store
            .message_by_physical_offset(offset as u64)
            .map_err(Reject::system)
    })
    .await?;
    Ok(record.and_then(|r| {
        decode_records(&r, &DecodeOptions::default())
            .messages
            .into_iter()
            .next()
    }))
}

/// The key a transaction's decision is remembered by: its `UNIQ_KEY` (the same on every copy
/// of the half message), else the half message's own offset.
pub(crate) fn transaction_key(m: &MessageExt) -> String {
    m.property(property::UNIQ_KEY)
        .or_else(|| m.property(property::TRANSACTION_ID))
        .map(str::to_string)
        .unwrap_or_else(|| format!("@{}", m.commit_log_offset))
}

/// Handles END_TRANSACTION.
pub(crate) async fn end_transaction(
    b: &Arc<Shared>,
    caller: &Caller<'_>,
    req: &RemotingCommand,
) -> Handled {
    let h: EndTransactionRequestHeader = req.decode_command_header()?;
    let decision = match h.commit_or_rollback {
        sys_flag::TRANSACTION_COMMIT_TYPE => Decision::Committed,
        sys_flag::TRANSACTION_ROLLBACK_TYPE => Decision::RolledBack,
        other => {
            // Unknown (0): the producer does not know yet; the check will ask again. RocketMQ
            // sends no answer.
            debug!(peer = %caller.peer, state = other, msg_id = %h.msg_id, from_check = h.from_transaction_check,
                "END_TRANSACTION without a decision");
            return Ok(None);
        }
    };
    let half = message_at(b, h.commit_log_offset)
        .await?
        .filter(|m| m.topic == HALF_TOPIC)
        .ok_or_else(|| Reject::system("Find prepared transaction message failed"))?;
    if half.property(property::PGROUP) != Some(h.producer_group.as_str()) {
        return Err(Reject::system("The producer group wrong"));
    }
    if half.queue_offset != h.tran_state_table_offset {
        return Err(Reject::system("The transaction state table offset wrong"));
    }
    if half.commit_log_offset != h.commit_log_offset {
        return Err(Reject::system("The commit log offset wrong"));
    }
    // A producer-chosen first check time: a late decision not asked for is refused; the check
    // decides (RocketMQ's rejectCommitOrRollback).
    if !h.from_transaction_check {
        if let Some(secs) = half
            .property(property::CHECK_IMMUNITY_TIME_IN_SECONDS)
            .and_then(|s| s.trim().parse::<i64>().ok())
        {
            let immunity = (secs.saturating_mul(1000)).max(b.config.transaction_timeout_ms as i64);
            if wall_ms() - half.born_timestamp > immunity {
                return Err(Reject::new(
                    resp::ILLEGAL_OPERATION,
                    "the transaction's check immunity time has passed; its state will be checked",
                ));
            }
        }
    }
    decide(b, &half, decision).await?;
    Ok(Some(RemotingCommand::response(resp::SUCCESS, None)))
}

/// Applies a decision to a half message: stores the committed message (commit), records the
/// decision in the op queue. A transaction already decided is left as it is.
pub(crate) async fn decide(
    b: &Arc<Shared>,
    half: &MessageExt,
    decision: Decision,
) -> Result<(), Reject> {
    let key = transaction_key(half);
    let t = &b.transactions;
    let prior = {
        let mut d = t.decisions.lock();
        let prior = d.get(&key);
        if prior.is_none() {
            d.decide(&key, decision);
        }
        prior
    };
    if let Some(prior) = prior {
        t.counters
            .duplicate_decisions
            .fetch_add(1, Ordering::Relaxed);
        info!(transaction = %key, ?prior, ?decision, "transaction already decided; END_TRANSACTION ignored");
        // Still mark this copy done, so the checker does not ask about it again.
        return write_op(b, half, &key, prior).await;
    }
    let stored = async {
        if decision == Decision::Committed {
            let (mut inner, mut props) = half::committed(half)?;
            if crate::send::apply_delay(b, &mut inner, &mut props).is_some() {
                inner.properties = encode_properties(&props)?;
            }
            crate::send::put(b, vec![inner]).await?;
        }
        write_op(b, half, &key, decision).await
    }
    .await;
    match stored {
        Ok(()) => {
            let c = match decision {
                Decision::Committed => &t.counters.committed,
                Decision::RolledBack => &t.counters.rolled_back,
            };
            c.fetch_add(1, Ordering::Relaxed);
            debug!(transaction = %key, ?decision, "transaction decided");
            Ok(())
        }
        Err(e) => {
            // Nothing (or only the committed message) was stored: let a retry or the check
            // decide again.
            warn!(transaction = %key, error = %e.remark, "could not store a transaction decision");
            t.decisions.lock().forget(&key);
            Err(e)
        }
    }
}

async fn write_op(
    b: &Arc<Shared>,
    half: &MessageExt,
    key: &str,
    decision: Decision,
) -> Result<(), Reject> {
    half::ensure_topic(b, super::OP_TOPIC)?;
    let op = half::op_message(
        b,
        half.queue_offset as u64,
        Some(key),
        decision == Decision::Committed,
    )?;
    debug_assert!(op.properties.contains(OP_DECISION));
    crate::send::put(b, vec![op]).await?;
    Ok(())
}
