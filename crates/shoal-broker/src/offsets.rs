//! Offsets and lookups: QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET, GET_MAX_OFFSET,
//! GET_MIN_OFFSET, SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME, VIEW_MESSAGE_BY_ID,
//! QUERY_MESSAGE.

use crate::caller::Caller;
use crate::fence::{check_commit, check_stamp};
use crate::reply::{blocking, ok, Handled, Reject};
use crate::shared::Shared;
use shoal_proto::code::response_code as resp;
use shoal_proto::header::{
    BoundaryType, GetEarliestMsgStoretimeRequestHeader, GetEarliestMsgStoretimeResponseHeader,
    GetMaxOffsetRequestHeader, GetMaxOffsetResponseHeader, GetMinOffsetRequestHeader,
    GetMinOffsetResponseHeader, QueryConsumerOffsetRequestHeader,
    QueryConsumerOffsetResponseHeader, QueryMessageRequestHeader, QueryMessageResponseHeader,
    SearchOffsetRequestHeader, SearchOffsetResponseHeader, UpdateConsumerOffsetRequestHeader,
    ViewMessageByIdRequestHeader,
};
use shoal_proto::RemotingCommand;
use std::sync::Arc;

fn with_header<H: shoal_proto::header::CommandHeader>(h: &H) -> Handled {
    Ok(Some(
        RemotingCommand::response(resp::SUCCESS, None).with_header(h),
    ))
}

/// Refuses a queue id that cannot exist: negative, or (for a known topic) not below the
/// topic's queue count. Offsets of such queues would be stored and served forever.
pub(crate) fn check_queue_id(b: &Shared, topic: &str, queue_id: i32) -> Result<(), Reject> {
    let queues = b.topics.read(topic, |c| {
        c.map(|c| c.read_queue_nums.max(c.write_queue_nums))
    });
    let bad = queue_id < 0 || queues.is_some_and(|n| queue_id >= n);
    if !bad {
        return Ok(());
    }
    let n = b
        .counters
        .invalid_queue_requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    if crate::reply::worth_logging(n) {
        tracing::warn!(%topic, queue_id, refused = n, "request for a queue id out of range refused");
    }
    Err(Reject::new(
        resp::INVALID_PARAMETER,
        match queues {
            Some(q) => format!("queueId[{queue_id}] is illegal, topic {topic} has {q} queues"),
            None => format!("queueId[{queue_id}] is illegal"),
        },
    ))
}

/// QUERY_CONSUMER_OFFSET (spec 2.3): the stored offset; without one, 0 when the queue still
/// starts at 0 unless the client asked `setZeroIfNotFound=false`, else QUERY_NOT_FOUND.
pub(crate) fn query_consumer_offset(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: QueryConsumerOffsetRequestHeader = req.decode_command_header()?;
    check_queue_id(b, &h.topic, h.queue_id)?;
    if let Some(offset) = b
        .store
        .query_offset(&h.consumer_group, &h.topic, h.queue_id)
    {
        return with_header(&QueryConsumerOffsetResponseHeader { offset });
    }
    if h.set_zero_if_not_found != Some(false) && b.store.min_offset(&h.topic, h.queue_id) == 0 {
        return with_header(&QueryConsumerOffsetResponseHeader { offset: 0 });
    }
    Err(Reject::new(
        resp::QUERY_NOT_FOUND,
        "Not found, do not set to zero, maybe this group boot first",
    ))
}

/// UPDATE_CONSUMER_OFFSET: stores the group's next offset for a queue. At the master of a
/// replicated group a commit that waits for its answer is answered once the in-sync set has
/// it (as a send is), so a new master has every commit answered SUCCESS; a oneway commit (the
/// clients' periodic persistence) reaches the replicas with the next metadata round. With
/// [`ext::field::WAIT_REPLICATED`](shoal_proto::ext::field::WAIT_REPLICATED) a broker that is
/// not master refuses it instead of storing it.
pub(crate) async fn update_consumer_offset(
    b: &Shared,
    caller: &Caller<'_>,
    req: &RemotingCommand,
) -> Handled {
    let flagged = req.ext(shoal_proto::ext::field::WAIT_REPLICATED) == Some("true");
    if let (Some(r), true) = (b.replication.get(), flagged) {
        if !r.is_master() {
            return Err(Reject::new(
                resp::SERVICE_NOT_AVAILABLE,
                "this broker is not the master of its group; commit at its master (brokerId 0)",
            ));
        }
    }
    store_consumer_offset(b, caller, req)?;
    let repl = b
        .replication
        .get()
        .filter(|r| flagged || (!req.is_oneway() && r.is_master()));
    if let Some(r) = repl {
        let timeout = std::time::Duration::from_millis(b.config.replication.ack_timeout_ms);
        if !r.metadata_replicated(timeout).await {
            return Err(Reject::new(
                resp::FLUSH_SLAVE_TIMEOUT,
                "the offset is stored; the in-sync set did not acknowledge it in time",
            ));
        }
    }
    ok()
}

/// Checks and stores an UPDATE_CONSUMER_OFFSET.
fn store_consumer_offset(b: &Shared, caller: &Caller<'_>, req: &RemotingCommand) -> Handled {
    let h: UpdateConsumerOffsetRequestHeader = req.decode_command_header()?;
    let mq = shoal_proto::MessageQueue::new(&h.topic, &b.config.broker_name, h.queue_id);
    let cx = b.group_ctx();
    check_stamp(&cx, &h.consumer_group, std::slice::from_ref(&mq), req)?;
    if b.topics.get(&h.topic).is_none() {
        return Err(Reject::new(
            resp::TOPIC_NOT_EXIST,
            format!("topic[{}] not exist, apply first please!", h.topic),
        ));
    }
    check_queue_id(b, &h.topic, h.queue_id)?;
    if h.commit_offset < 0 {
        return Err(Reject::new(
            resp::INVALID_PARAMETER,
            format!("commitOffset {} is negative", h.commit_offset),
        ));
    }
    if req.ext(shoal_proto::ext::field::FORWARDED) == Some("true") {
        return store_forwarded(b, caller, &h, &mq);
    }
    check_commit(
        &cx,
        caller.conn_id,
        &h.consumer_group,
        &mq,
        h.commit_offset,
        req.ext(shoal_proto::ext::field::REWIND) == Some("true"),
    )?;
    crate::replication::store_commit(b, &h.consumer_group, &h.topic, h.queue_id, h.commit_offset)?;
    ok()
}

/// A commit a replica of this broker's group forwards (a client committed to it while it had
/// no master): stored only by a master that took over its group's state (the old master's
/// offsets it applies first would replace it), and only above the stored offset (a forward
/// never moves an offset back; a lower one is answered SUCCESS, as the master has it).
fn store_forwarded(
    b: &Shared,
    caller: &Caller<'_>,
    h: &UpdateConsumerOffsetRequestHeader,
    mq: &shoal_proto::MessageQueue,
) -> Handled {
    if let Some(r) = b.replication.get() {
        r.refuse_unless_serving()?;
    }
    let stored = b
        .store
        .query_offset(&h.consumer_group, &h.topic, h.queue_id);
    if stored.is_some_and(|s| s >= h.commit_offset) {
        return ok();
    }
    check_commit(
        &b.group_ctx(),
        caller.conn_id,
        &h.consumer_group,
        mq,
        h.commit_offset,
        false,
    )?;
    b.store
        .commit_offset(&h.consumer_group, &h.topic, h.queue_id, h.commit_offset);
    ok()
}

/// GET_MAX_OFFSET: the next offset to be written in a queue.
pub(crate) fn get_max_offset(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: GetMaxOffsetRequestHeader = req.decode_command_header()?;
    check_queue_id(b, &h.topic, h.queue_id)?;
    let offset = b.store.max_offset(&h.topic, h.queue_id) as i64;
    with_header(&GetMaxOffsetResponseHeader { offset })
}

/// GET_MIN_OFFSET: the smallest offset still stored in a queue.
pub(crate) fn get_min_offset(b: &Shared, req: &RemotingCommand) -> Handled {
    let h: GetMinOffsetRequestHeader = req.decode_command_header()?;
    check_queue_id(b, &h.topic, h.queue_id)?;
    let offset = b.store.min_offset(&h.topic, h.queue_id) as i64;
    with_header(&GetMinOffsetResponseHeader { offset })
}

/// SEARCH_OFFSET_BY_TIMESTAMP: binary search of a queue by store time.
pub(crate) async fn search_offset(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: SearchOffsetRequestHeader = req.decode_command_header()?;
    check_queue_id(b, &h.topic, h.queue_id)?;
    let store = b.store.clone();
    let boundary = match h.boundary_type.unwrap_or_default() {
        BoundaryType::Lower => shoal_store::BoundaryType::Lower,
        BoundaryType::Upper => shoal_store::BoundaryType::Upper,
    };
    let offset = blocking(move || {
        store
            .offset_by_timestamp(&h.topic, h.queue_id, h.timestamp, boundary)
            .map_err(Reject::system)
    })
    .await?;
    with_header(&SearchOffsetResponseHeader {
        offset: offset as i64,
    })
}

/// GET_EARLIEST_MSG_STORETIME: store time of a queue's first message.
pub(crate) async fn earliest_store_time(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: GetEarliestMsgStoretimeRequestHeader = req.decode_command_header()?;
    check_queue_id(b, &h.topic, h.queue_id)?;
    let store = b.store.clone();
    let ts = blocking(move || {
        store
            .earliest_store_time(&h.topic, h.queue_id)
            .map_err(Reject::system)
    })
    .await?;
    with_header(&GetEarliestMsgStoretimeResponseHeader {
        timestamp: ts.unwrap_or(-1),
    })
}

/// VIEW_MESSAGE_BY_ID: the stored record at a commit log offset.
pub(crate) async fn view_message_by_id(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: ViewMessageByIdRequestHeader = req.decode_command_header()?;
    if h.offset < 0 {
        return Err(Reject::new(
            resp::SYSTEM_ERROR,
            format!("can not find message by the offset, {}", h.offset),
        ));
    }
    let store = b.store.clone();
    let offset = h.offset as u64;
    let record = blocking(move || {
        store
            .message_by_physical_offset(offset)
            .map_err(Reject::system)
    })
    .await?;
    match record {
        Some(bytes) => Ok(Some(
            RemotingCommand::response(resp::SUCCESS, None).with_body(bytes),
        )),
        None => Err(Reject::new(
            resp::SYSTEM_ERROR,
            format!("can not find message by the offset, {}", h.offset),
        )),
    }
}

/// QUERY_MESSAGE: messages by key (or by UNIQ_KEY when `_UNIQUE_KEY_QUERY` is true).
pub(crate) async fn query_message(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: QueryMessageRequestHeader = req.decode_command_header()?;
    let store = b.store.clone();
    let max = h.max_num.clamp(1, 64) as usize;
    let records = blocking(move || {
        let r = if h.unique_key_query == Some(true) {
            store.query_by_uniq_key(&h.topic, &h.key)
        } else {
            store.query_by_key(&h.topic, &h.key, max, h.begin_timestamp, h.end_timestamp)
        };
        r.map_err(Reject::system)
    })
    .await?;
    if records.is_empty() {
        return Err(Reject::new(
            resp::QUERY_NOT_FOUND,
            "can not find message, maybe time range not correct",
        ));
    }
    let mut body = Vec::with_capacity(records.iter().map(|r| r.len()).sum());
    for r in &records {
        body.extend_from_slice(r);
    }
    let header = QueryMessageResponseHeader {
        index_last_update_timestamp: crate::clock::wall_ms(),
        index_last_update_phyoffset: b.store.commit_log_max_offset() as i64,
    };
    Ok(Some(
        RemotingCommand::response(resp::SUCCESS, None)
            .with_header(&header)
            .with_body(body),
    ))
}
