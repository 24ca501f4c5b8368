//! What `shoal group describe` and the dashboard show of a POP group on one broker: its
//! consumers, queues, messages in flight and counters.

use super::view;
use crate::shared::Shared;
use shoal_proto::body::MessageRequestMode;

/// A consumer holding leases in a POP group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PopConsumerView {
    /// Who popped: a gRPC client id, or a remoting client's address.
    pub consumer: String,
    /// Messages it holds under lease now.
    pub inflight: usize,
}

/// A queue of a POP group on this broker.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PopQueueView {
    /// Topic (or the group's POP retry topic).
    pub topic: String,
    /// Queue id.
    pub queue_id: i32,
    /// Everything below is done (acknowledged, filtered out or revived).
    pub acked_offset: u64,
    /// The next offset never handed out.
    pub cursor: u64,
    /// The queue's next offset to be written.
    pub max_offset: u64,
    /// Messages under lease (or lapsed and waiting to be handed out again).
    pub inflight: usize,
}

/// What `shoal group describe` and the dashboard show of a POP group on one broker.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PopGroupView {
    /// Consumers holding leases.
    pub consumers: Vec<PopConsumerView>,
    /// Queues the group popped from.
    pub queues: Vec<PopQueueView>,
    /// Messages under lease now.
    pub inflight: usize,
    /// Leases granted since the broker started.
    pub leased: u64,
    /// Acks accepted.
    pub acked: u64,
    /// Leases that lapsed without an ack: messages redelivered (through the retry topic, or
    /// in place for FIFO).
    pub redeliveries: u64,
    /// Acks or invisibility changes refused (stale, foreign or lapsed receipts).
    pub refused: u64,
    /// Messages moved to the dead-letter topic.
    pub dead_lettered: u64,
    /// Messages in the group's dead-letter topic on this broker now.
    pub dlq_messages: u64,
    /// Topics set to POP by SET_MESSAGE_REQUEST_MODE.
    pub pop_mode_topics: Vec<String>,
}

/// The POP view of `group` on this broker, `None` when the group has no POP state here.
pub(crate) fn describe_group(b: &Shared, group: &str) -> Option<PopGroupView> {
    let (consumers, inflight, counters, known) = {
        let core = b.pop.core.lock();
        let e = &core.engine;
        (
            e.consumers_of_group(group),
            e.inflight_of_group(group),
            e.group_counters(group),
            e.groups().contains(group),
        )
    };
    let pop_mode_topics: Vec<String> = b
        .pop
        .modes
        .lock()
        .iter()
        .filter(|((_, g), (m, _))| g == group && *m == MessageRequestMode::Pop)
        .map(|((t, _), _)| t.clone())
        .collect();
    if !known && pop_mode_topics.is_empty() {
        return None;
    }
    let queues: Vec<PopQueueView> = inflight
        .iter()
        .map(|(k, n)| {
            let (acked, cursor) = b.pop.queue_offsets(k).unwrap_or((0, 0));
            PopQueueView {
                topic: k.topic.clone(),
                queue_id: k.queue_id,
                acked_offset: acked,
                cursor,
                max_offset: b.store.max_offset(&k.topic, k.queue_id),
                inflight: *n,
            }
        })
        .collect();
    let dlq = shoal_proto::constants::dlq_topic(group);
    let dlq_messages = view::queue_count(b, &dlq).map_or(0, |n| {
        (0..n)
            .map(|q| {
                let (min, max) = view::queue_bounds(b, &dlq, q);
                max.saturating_sub(min)
            })
            .sum()
    });
    Some(PopGroupView {
        consumers: consumers
            .into_iter()
            .map(|(consumer, inflight)| PopConsumerView { consumer, inflight })
            .collect(),
        inflight: queues.iter().map(|q| q.inflight).sum(),
        queues,
        leased: counters.leased,
        acked: counters.acked,
        redeliveries: counters.lapsed,
        refused: counters.refused,
        dead_lettered: counters.dead_lettered,
        dlq_messages,
        pop_mode_topics,
    })
}
