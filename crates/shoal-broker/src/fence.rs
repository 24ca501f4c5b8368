//! The broker's side of the group state's fences ([`shoal_group::state`]): the member-epoch
//! fence on a stamped request and the offset commit fence, as refusals with RocketMQ response
//! codes and counters. Used by pulls, offset commits, lock and unlock requests.

use crate::group_ctx::GroupCtx;
use crate::reply::Reject;
use shoal_group::state::CommitCheck;
use shoal_group::GroupError;
use shoal_proto::coordinated::{member_stamp, response_code as cresp, stamp_coordinator};
use shoal_proto::ext;
use shoal_proto::{MessageQueue, RemotingCommand};
use tracing::debug;

/// The response code of a coordinator error.
pub(crate) fn reject_of(e: &GroupError) -> Reject {
    let code = match e {
        GroupError::FencedMemberEpoch { .. } => cresp::FENCED_MEMBER_EPOCH,
        GroupError::UnknownMember { .. } => cresp::UNKNOWN_MEMBER_ID,
        GroupError::UnreleasedInstanceId { .. } => cresp::UNRELEASED_INSTANCE_ID,
        GroupError::QueueNotAssigned { .. } => cresp::QUEUE_NOT_ASSIGNED,
        GroupError::GroupFull { .. } | GroupError::TooManyGroups(_) => cresp::GROUP_FULL,
        _ => cresp::INVALID_GROUP_REQUEST,
    };
    Reject::new(code, e.to_string())
}

/// The member-epoch fence: a request stamped with a coordinated member's id and epoch must be
/// valid for every queue it touches. Unstamped requests (classic members) pass.
pub(crate) fn check_stamp(
    cx: &GroupCtx<'_>,
    group: &str,
    queues: &[MessageQueue],
    req: &RemotingCommand,
) -> Result<(), Reject> {
    let Some(stamp) = member_stamp(req) else {
        return Ok(());
    };
    // Another broker's coordinator gave this epoch: not this broker's to fence (the queue's
    // lock guards it).
    if stamp_coordinator(req).is_some_and(|c| c != cx.config.announce_addr()) {
        return Ok(());
    }
    let (member, epoch) =
        stamp.map_err(|e| Reject::new(shoal_proto::code::response_code::INVALID_PARAMETER, e))?;
    cx.groups
        .read(|g, _| g.check_stamp(group, &member, epoch, queues))
        .map_err(|e| {
            cx.counters.coordinator_fenced.inc();
            reject_of(&e)
        })
}

/// The commit fence: may the connection `conn_id` store `offset` for the queue?
pub(crate) fn check_commit(
    cx: &GroupCtx<'_>,
    conn_id: u64,
    group: &str,
    queue: &MessageQueue,
    offset: i64,
    rewind: bool,
) -> Result<(), Reject> {
    let check = CommitCheck {
        conn_id,
        group,
        queue,
        offset,
        rewind,
    };
    cx.groups
        .read(|g, now| {
            g.check_commit(now, check, || {
                cx.store.query_offset(group, &queue.topic, queue.queue_id)
            })
        })
        .map_err(|refused| {
            cx.counters.commits_fenced.inc();
            Reject::new(ext::response_code::QUEUE_NOT_LOCKED, refused.0)
        })
}

/// Logs a commit that a fence refused on a pull (pulls are still answered).
pub(crate) fn piggyback_refused(r: &Reject) {
    debug!(remark = %r.remark, "offset carried by a pull not stored");
}
