//! The broker's fences over the group state: the offset commit fence (who may move a queue's
//! committed offset) and the member-epoch fence (coordinated members' pulls, commits and lock
//! requests).

use super::GroupState;
use crate::error::GroupError;
use shoal_proto::MessageQueue;

/// An offset commit the commit fence refused, with the reason (the broker answers
/// `QUEUE_NOT_LOCKED` with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CommitRefused(pub String);

/// An offset commit to check ([`GroupState::check_commit`]).
#[derive(Debug, Clone, Copy)]
pub struct CommitCheck<'a> {
    /// The connection the commit came on.
    pub conn_id: u64,
    /// The consumer group.
    pub group: &'a str,
    /// The queue (of this broker).
    pub queue: &'a MessageQueue,
    /// The offset to store.
    pub offset: i64,
    /// The member says it moves the offset back on purpose (a reset).
    pub rewind: bool,
}

impl GroupState {
    /// The commit fence: may the connection store this offset?
    ///
    /// - A Shoal member (a session with a timeout) commits only queues whose lock it holds,
    ///   and never below the stored offset unless it says it rewinds; `stored` is asked only
    ///   then.
    /// - Anyone else (official clients) is refused only where another member holds the lock.
    pub fn check_commit(
        &self,
        now_ms: u64,
        c: CommitCheck<'_>,
        stored: impl FnOnce() -> Option<i64>,
    ) -> Result<(), CommitRefused> {
        let session = self.clients.session(c.group, c.conn_id);
        let holder = self
            .locks
            .holder(c.group, c.queue, now_ms)
            .map(|h| h.client_id);
        let mq = c.queue;
        match session {
            Some(s) if s.timeout_ms.is_some() => {
                if holder != Some(s.client_id.as_str()) {
                    return Err(CommitRefused(format!(
                        "{} does not hold the lock of {mq}; the offset is not moved",
                        s.client_id
                    )));
                }
                if !c.rewind {
                    if let Some(stored) = stored() {
                        if c.offset < stored {
                            return Err(CommitRefused(format!(
                                "commit {} of {mq} is below the stored {stored}; the offset is not moved back",
                                c.offset
                            )));
                        }
                    }
                }
                Ok(())
            }
            s => match holder {
                Some(h) if s.as_ref().is_none_or(|s| s.client_id != h) => Err(CommitRefused(
                    format!("{mq} is locked by {h}; the offset is not moved"),
                )),
                _ => Ok(()),
            },
        }
    }

    /// The member-epoch fence: a request stamped with a coordinated member's id and epoch
    /// must be valid for every queue it touches. A group this broker does not coordinate (no
    /// members here: another broker coordinates it, or nobody does) is not fenced by epoch.
    pub fn check_stamp(
        &self,
        group: &str,
        member_id: &str,
        epoch: i32,
        queues: &[MessageQueue],
    ) -> Result<(), GroupError> {
        if !self.coordinator.has_members(group) {
            return Ok(());
        }
        queues
            .iter()
            .try_for_each(|q| self.coordinator.validate(group, member_id, epoch, q))
    }
}
