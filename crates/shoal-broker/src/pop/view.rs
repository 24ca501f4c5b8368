//! The broker state POP reads and writes, in one place: topics, groups, consumers, offsets,
//! the store and the send path.

use crate::reply::Reject;
use crate::shared::Shared;
use shoal_group::pop::QueueKey;
use shoal_proto::body::SubscriptionGroupConfig;
use shoal_proto::code::response_code as resp;
use shoal_proto::constants::perm;
use shoal_store::{GetMessageResult, MessageExtBrokerInner};

/// Refuses a request that leases, acknowledges or renews when this broker is a replica of a
/// group, or a master still taking over the state its log replicated (the leases of the old
/// master among it): the client asks again, at the master.
pub(crate) fn serving(b: &Shared) -> Result<(), Reject> {
    match b.replication.get() {
        Some(r) => r.refuse_unless_serving(),
        None => Ok(()),
    }
}

/// A readable topic's read queue count.
pub(crate) fn readable_queues(b: &Shared, topic: &str) -> Result<i32, Reject> {
    let t = b.topics.get(topic).ok_or_else(|| {
        Reject::new(
            resp::TOPIC_NOT_EXIST,
            format!("topic[{topic}] not exist, apply first please!"),
        )
    })?;
    if !perm::is_readable(t.perm) {
        return Err(Reject::new(
            resp::NO_PERMISSION,
            format!("the topic[{topic}] peeking message is forbidden"),
        ));
    }
    Ok(t.read_queue_nums)
}

/// Read queue count of a topic, if it exists.
pub(crate) fn queue_count(b: &Shared, topic: &str) -> Option<i32> {
    b.topics.read(topic, |t| t.map(|t| t.read_queue_nums))
}

/// The group's config (created when auto-create is on), refused when it may not consume.
pub(crate) fn consumer_group(b: &Shared, group: &str) -> Result<SubscriptionGroupConfig, Reject> {
    let g = b
        .sub_groups
        .get_or_auto_create(group)
        .map_err(|why| Reject::new(resp::SUBSCRIPTION_GROUP_NOT_EXIST, why))?;
    if !g.consume_enable {
        return Err(Reject::new(
            resp::NO_PERMISSION,
            format!("subscription group no permission, {group}"),
        ));
    }
    Ok(g)
}

/// Creates a retry or dead-letter topic if missing.
pub(crate) fn ensure_topic(b: &Shared, topic: &str, queues: i32) -> Result<(), Reject> {
    b.topics
        .ensure(topic, queues, perm::PERM_READ_WRITE)
        .map(|_| ())
        .map_err(Reject::system)
}

/// The group's client ids (classic heartbeats).
pub(crate) fn consumer_ids(b: &Shared, group: &str) -> Vec<String> {
    b.groups.read(|g, _| g.clients().client_ids(group))
}

/// Where a queue the engine has not seen starts: the group's committed offset, else the
/// queue's first offset (`from_min`, or a queue that still has its first message, as RocketMQ's
/// `initPopOffsetByCheckMsgInMem` does) or its last.
pub(crate) fn start_offset(b: &Shared, key: &QueueKey, from_min: bool) -> u64 {
    match b.store.query_offset(&key.group, &key.topic, key.queue_id) {
        Some(o) if o >= 0 => o as u64,
        _ => {
            let min = b.store.min_offset(&key.topic, key.queue_id);
            if from_min || min == 0 {
                min
            } else {
                b.store.max_offset(&key.topic, key.queue_id)
            }
        }
    }
}

/// The store's first and next offsets of a queue.
pub(crate) fn queue_bounds(b: &Shared, topic: &str, queue_id: i32) -> (u64, u64) {
    (
        b.store.min_offset(topic, queue_id),
        b.store.max_offset(topic, queue_id),
    )
}

/// Reads up to `count` records from `offset` that pass the tag filter.
pub(crate) fn read(
    b: &Shared,
    topic: &str,
    queue_id: i32,
    offset: u64,
    count: usize,
    pass: &dyn Fn(i64) -> bool,
) -> Result<GetMessageResult, Reject> {
    b.store
        .get_messages(
            topic,
            queue_id,
            offset,
            count,
            b.config.max_pull_batch_bytes,
            pass,
        )
        .map_err(|e| Reject::system(format!("get message failed: {e}")))
}

/// Stores messages through the send path (retry and dead-letter copies).
pub(crate) async fn put(
    b: &std::sync::Arc<Shared>,
    msgs: Vec<MessageExtBrokerInner>,
) -> Result<(), Reject> {
    b.persist_tables().await?;
    crate::send::put(b, msgs).await.map(|_| ())
}
