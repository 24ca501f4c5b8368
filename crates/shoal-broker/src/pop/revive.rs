//! Lapsed leases become copies in the group's POP retry topic (`%RETRY%<group>_<topic>`,
//! reconsume count + 1) or, past the group's `retryMaxTimes` (and for FIFO messages delivered
//! `max_attempts` times), its dead-letter topic. The offset is done only once the copy is
//! stored; a failed write is tried again.

use super::{view, ReviveJob};
use crate::shared::Shared;
use shoal_proto::constants::{dlq_topic, RETRY_GROUP_TOPIC_PREFIX};
use shoal_proto::message::{decode_record, encode_properties, property, DecodeOptions};
use shoal_store::MessageExtBrokerInner;
use std::sync::Arc;
use std::time::Duration;

/// The POP retry topic of a group and topic: RocketMQ's v1 name (its default,
/// `enableRetryTopicV2=false`; the v2 name's `+` is not a valid topic character), receipt
/// retry flag 1.
pub(crate) fn pop_retry_topic(group: &str, topic: &str) -> String {
    if topic.starts_with(RETRY_GROUP_TOPIC_PREFIX) {
        return topic.to_owned();
    }
    format!("{RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}")
}

/// Writes the copy of one lapsed message and tells the engine.
pub(crate) async fn run(b: &Arc<Shared>, (key, offset, pop_time, fifo_dead): ReviveJob) {
    let outcome = copy(b, &key.group, &key.topic, key.queue_id, offset, fifo_dead).await;
    let _ = b.pop.with_engine(&b.store, |e| match outcome {
        Ok(dead) => e.handle_revived(&key, offset, pop_time, dead),
        Err(ref why) => {
            tracing::warn!(group = %key.group, topic = %key.topic, queue = key.queue_id, offset, error = %why, "POP revive failed; trying again");
            e.handle_revive_failed(b.clock.now_ms(), &key, offset, pop_time);
        }
    });
}

/// Stores the copy; returns whether it went to the dead-letter topic. A message that is no
/// longer in the store (retention) has nothing to copy and counts as done.
pub(crate) async fn copy(
    b: &Arc<Shared>,
    group: &str,
    topic: &str,
    queue_id: i32,
    offset: u64,
    fifo_dead: bool,
) -> Result<bool, String> {
    let r = view::read(b, topic, queue_id, offset, 1, &|_| true).map_err(|r| r.remark)?;
    if r.messages.is_empty() || r.queue_offsets.first() != Some(&offset) {
        return Ok(false);
    }
    let (msg, _) =
        decode_record(&r.messages, 0, &DecodeOptions::default()).map_err(|e| e.to_string())?;
    let max = view::consumer_group(b, group).map_or(16, |g| g.retry_max_times);
    let reconsume = msg.reconsume_times + 1;
    let dead = fifo_dead || reconsume > max;
    let mut props = msg.properties.clone();
    let original = msg
        .property(property::RETRY_TOPIC)
        .map_or_else(|| msg.topic.clone(), str::to_owned);
    props.insert(property::RETRY_TOPIC.into(), original.clone());
    let origin_id = msg
        .property(property::ORIGIN_MESSAGE_ID)
        .map(str::to_string)
        .unwrap_or_else(|| msg.offset_msg_id());
    props.insert(property::ORIGIN_MESSAGE_ID.into(), origin_id);
    props.shift_remove(property::DELAY);
    let target = if dead {
        props.insert(property::DLQ_ORIGIN_TOPIC.into(), original.clone());
        props.insert(
            property::DLQ_ORIGIN_MESSAGE_ID.into(),
            msg.msg_id().into_owned(),
        );
        dlq_topic(group)
    } else {
        pop_retry_topic(group, &original)
    };
    view::ensure_topic(b, &target, 1).map_err(|r| r.remark)?;
    let inner = MessageExtBrokerInner {
        topic: target,
        queue_id: 0,
        flag: msg.flag,
        sys_flag: msg.sys_flag,
        born_timestamp: msg.born_timestamp,
        born_host: msg.born_host,
        reconsume_times: reconsume,
        prepared_transaction_offset: 0,
        body: msg.body.clone(),
        properties: encode_properties(&props).map_err(|e| e.to_string())?,
        known: None,
    };
    view::put(b, vec![inner]).await.map_err(|r| r.remark)?;
    if dead {
        tracing::info!(%group, %original, attempts = reconsume, "POP message moved to the dead-letter queue");
    }
    Ok(dead)
}

/// Starts the revive service: lapses leases at their deadlines and writes the copies (only
/// where this broker writes its own log).
pub(crate) fn start(b: Arc<Shared>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if !b.writes_log() {
                // A replica (or a master still taking over): the master revives, and the
                // state this one adopts when it takes over holds what it did.
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            let now = b.clock.now_ms();
            let next = b.pop.with_engine(&b.store, |e| {
                e.handle_timeout(now);
                e.poll_timeout()
            });
            let jobs: Vec<ReviveJob> = b.pop.revives.lock().drain(..).collect();
            let any = !jobs.is_empty();
            for job in jobs {
                run(&b, job).await;
            }
            if any {
                // FIFO redeliveries and retry copies are new messages for held pops.
                b.pop.arrivals.notify_waiters();
            }
            let wait = next.ok().flatten().map_or(Duration::from_secs(1), |t| {
                Duration::from_millis(t.saturating_sub(b.clock.now_ms()).min(1_000))
            });
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = b.pop.revive_wakeup.notified() => {}
            }
        }
    })
}
