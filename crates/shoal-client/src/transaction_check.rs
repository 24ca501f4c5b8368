//! The contract of a transaction check: the outcome of a local transaction
//! ([`LocalTransactionState`]), what answers a broker's CHECK_TRANSACTION_STATE for a group
//! ([`CheckListener`]), and the handling of such a request by whichever client instance
//! receives it (see [`crate::transaction`] for the producer).

use crate::error::Result;
use futures::future::BoxFuture;
use shoal_proto::code::request_code as rc;
use shoal_proto::header::{CheckTransactionStateRequestHeader, EndTransactionRequestHeader};
use shoal_proto::message::{property, sys_flag, MessageExt};
use shoal_proto::RemotingCommand;
use std::sync::Arc;

/// The outcome of a local transaction, as RocketMQ names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalTransactionState {
    /// Commit: the message becomes visible in its topic.
    CommitMessage,
    /// Roll back: the message is thrown away.
    RollbackMessage,
    /// Not known yet: the broker will ask again later (CHECK_TRANSACTION_STATE).
    Unknown,
}

impl LocalTransactionState {
    /// The END_TRANSACTION `commitOrRollback` value.
    pub fn wire_value(self) -> i32 {
        match self {
            Self::CommitMessage => sys_flag::TRANSACTION_COMMIT_TYPE,
            Self::RollbackMessage => sys_flag::TRANSACTION_ROLLBACK_TYPE,
            Self::Unknown => sys_flag::TRANSACTION_NOT_TYPE,
        }
    }
}

/// Answers a broker's CHECK_TRANSACTION_STATE for a half message of the group.
pub type CheckListener =
    Arc<dyn Fn(MessageExt) -> BoxFuture<'static, LocalTransactionState> + Send + Sync>;

/// Handles a broker's CHECK_TRANSACTION_STATE: asks the group's listener and returns the
/// END_TRANSACTION to send back on the same connection (None when nobody here can answer).
pub(crate) async fn answer_check(
    request: &RemotingCommand,
    lookup: impl Fn(&str) -> Option<CheckListener>,
) -> Result<Option<RemotingCommand>> {
    let h: CheckTransactionStateRequestHeader = request.decode_command_header()?;
    let body = request.body.clone().unwrap_or_default();
    let run =
        shoal_proto::message::decode_records(&body, &shoal_proto::message::DecodeOptions::client());
    let Some(msg) = run.messages.into_iter().next() else {
        tracing::warn!("CHECK_TRANSACTION_STATE without a message");
        return Ok(None);
    };
    let Some(group) = msg.property(property::PGROUP).map(str::to_string) else {
        tracing::warn!("CHECK_TRANSACTION_STATE for a message without a producer group");
        return Ok(None);
    };
    let Some(listener) = lookup(&group) else {
        tracing::debug!(%group, "CHECK_TRANSACTION_STATE for a group without a checker here");
        return Ok(None);
    };
    let msg_id = h
        .msg_id
        .clone()
        .or_else(|| msg.property(property::UNIQ_KEY).map(str::to_string))
        .unwrap_or_default();
    let state = listener(msg).await;
    let header = EndTransactionRequestHeader {
        topic: h.topic.clone(),
        producer_group: group,
        tran_state_table_offset: h.tran_state_table_offset,
        commit_log_offset: h.commit_log_offset,
        commit_or_rollback: state.wire_value(),
        from_transaction_check: true,
        msg_id,
        transaction_id: h.transaction_id.clone(),
        ..Default::default()
    };
    let mut req = RemotingCommand::request_with_header(rc::END_TRANSACTION, &header);
    req.set_oneway();
    Ok(Some(req))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values() {
        assert_eq!(LocalTransactionState::CommitMessage.wire_value(), 8);
        assert_eq!(LocalTransactionState::RollbackMessage.wire_value(), 12);
        assert_eq!(LocalTransactionState::Unknown.wire_value(), 0);
    }
}
