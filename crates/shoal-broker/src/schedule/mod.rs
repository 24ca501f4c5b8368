//! Delay levels (RocketMQ's `ScheduleMessageService`): messages parked in
//! `SCHEDULE_TOPIC_XXXX` queue `level - 1` are re-stored in their real topic and queue when
//! their store time plus the level's delay has passed. One task per level; each sleeps until
//! the next message is due (or a new one arrives), so delivery is on time rather than polled.
//! Progress per level is kept in the store's delay offsets (persisted with consumer offsets,
//! and replicated as metadata records in a replicated group).
//!
//! Progress written out lags the deliveries (a persisted file every few seconds, a replicated
//! record every metadata round), so a broker that starts delivering (after a restart, or as a
//! new master) first moves each level past what its log shows delivered already: every
//! delivered copy carries [`SCHEDULE_ORIGIN`] (`level:offset` of its schedule-queue entry),
//! and deliveries go in offset order, so the entries from the progress on whose copies are in
//! the log (found by their `UNIQ_KEY`) are a prefix ([`skip_delivered`]). An entry without a
//! `UNIQ_KEY` cannot be looked up and stops the skip (it may be delivered again).

use crate::clock::wall_ms;
use crate::reply::Reject;
use crate::send::put;
use crate::shared::Shared;
use shoal_proto::constants::SCHEDULE_TOPIC;
use shoal_proto::message::{
    decode_records, encode_properties, property, DecodeOptions, MessageExt,
};
use shoal_store::MessageExtBrokerInner;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// The property of a delivered copy naming the schedule-queue entry it came from,
/// `level:offset`.
pub(crate) const SCHEDULE_ORIGIN: &str = "SHOAL_SCHEDULE_ORIGIN";

/// The [`SCHEDULE_ORIGIN`] value of `level`'s entry at `offset`.
fn origin(level: i32, offset: i64) -> String {
    format!("{level}:{offset}")
}

/// Starts one delivery task per delay level.
pub(crate) fn start(b: Arc<Shared>) -> Vec<JoinHandle<()>> {
    (1..=b.delay_levels_ms.len() as i32)
        .map(|level| tokio::spawn(run_level(b.clone(), level)))
        .collect()
}

enum Step {
    /// Delivered up to here; look again at once.
    Progress,
    /// Nothing due: wait this long (or until a new message arrives).
    Wait(Duration),
}

async fn run_level(b: Arc<Shared>, level: i32) {
    // Whether this run of delivering started from what the log shows delivered.
    let mut resumed = false;
    loop {
        if !b.writes_log() {
            // A replica: the master delivers, and its progress reaches this log.
            resumed = false;
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        if !resumed {
            match skip_delivered(&b, level).await {
                Ok(0) => {}
                Ok(n) => info!(
                    level,
                    entries = n,
                    "delay level resumes past entries its log shows delivered"
                ),
                Err(e) => {
                    warn!(level, error = %e.remark, "delay level progress not checked; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
            resumed = true;
        }
        let notified = b.schedule_wakeup.notified();
        let step = match deliver_due(&b, level).await {
            Ok(s) => s,
            Err(e) => {
                warn!(level, error = %e.remark, "delay level delivery failed; retrying in 1 s");
                Step::Wait(Duration::from_secs(1))
            }
        };
        if let Step::Wait(d) = step {
            tokio::select! {
                _ = tokio::time::sleep(d) => {}
                _ = notified => {}
            }
        }
    }
}

async fn deliver_due(b: &Arc<Shared>, level: i32) -> Result<Step, Reject> {
    let queue_id = level - 1;
    let delay_ms = b.delay_levels_ms[(level - 1) as usize] as i64;
    let offset = b.store.schedule_offset(level).unwrap_or(0).max(0) as u64;
    let store = b.store.clone();
    let got = crate::reply::blocking(move || {
        store
            .get_messages(
                SCHEDULE_TOPIC,
                queue_id,
                offset,
                32,
                4 * 1024 * 1024,
                &|_| true,
            )
            .map_err(Reject::system)
    })
    .await?;
    if got.message_count == 0 {
        if got.next_begin_offset > offset
            && got.status == shoal_store::GetMessageStatus::OffsetTooSmall
        {
            b.store
                .set_schedule_offset(level, got.next_begin_offset as i64);
            return Ok(Step::Progress);
        }
        return Ok(Step::Wait(Duration::from_secs(1)));
    }
    let run = decode_records(&got.messages, &DecodeOptions::default());
    let now = wall_ms();
    let mut next = offset;
    for msg in run.messages {
        let due = msg.store_timestamp + delay_ms;
        if due > now {
            if next > offset {
                b.store.set_schedule_offset(level, next as i64);
            }
            return Ok(Step::Wait(Duration::from_millis((due - now) as u64)));
        }
        let real_topic = msg.property(property::REAL_TOPIC).map(str::to_string);
        let real_qid = msg
            .property(property::REAL_QID)
            .and_then(|q| q.parse::<i32>().ok());
        match (real_topic, real_qid) {
            (Some(topic), Some(queue_id)) => {
                let mut props = msg.properties.clone();
                props.shift_remove(property::DELAY);
                props.insert(SCHEDULE_ORIGIN.to_string(), origin(level, msg.queue_offset));
                let mut inner = MessageExtBrokerInner {
                    topic,
                    queue_id,
                    flag: msg.flag,
                    sys_flag: msg.sys_flag,
                    born_timestamp: msg.born_timestamp,
                    born_host: msg.born_host,
                    reconsume_times: msg.reconsume_times,
                    prepared_transaction_offset: 0,
                    body: msg.body.clone(),
                    properties: String::new(),
                    known: None,
                };
                // A timed message whose time has not come yet takes its next hop.
                crate::send::apply_delay(b, &mut inner, &mut props);
                inner.properties = encode_properties(&props)?;
                put(b, vec![inner]).await?;
                debug!(level, msg_id = %msg.msg_id(), "delayed message delivered");
            }
            _ => warn!(
                level,
                offset = msg.queue_offset,
                "scheduled message without REAL_TOPIC/REAL_QID skipped"
            ),
        }
        next = msg.queue_offset as u64 + 1;
    }
    let next = next.max(got.next_begin_offset);
    b.store.set_schedule_offset(level, next as i64);
    Ok(Step::Progress)
}

/// Moves `level`'s progress past the entries whose delivered copies the log holds; returns
/// how many.
async fn skip_delivered(b: &Arc<Shared>, level: i32) -> Result<u64, Reject> {
    let start = b.store.schedule_offset(level).unwrap_or(0).max(0) as u64;
    let store = b.store.clone();
    let skipped = crate::reply::blocking(move || {
        let mut offset = start;
        loop {
            let got = store
                .get_messages(
                    SCHEDULE_TOPIC,
                    level - 1,
                    offset,
                    32,
                    4 * 1024 * 1024,
                    &|_| true,
                )
                .map_err(Reject::system)?;
            let run = decode_records(&got.messages, &DecodeOptions::default());
            if run.messages.is_empty() {
                return Ok(offset);
            }
            for msg in &run.messages {
                if !delivered(&store, level, msg)? {
                    return Ok(offset);
                }
                offset = msg.queue_offset as u64 + 1;
            }
        }
    })
    .await?;
    if skipped > start {
        b.store.set_schedule_offset(level, skipped as i64);
    }
    Ok(skipped - start)
}

/// Whether a copy of `level`'s entry `msg` was delivered: stored in its real topic (or, a
/// timed message's next hop, in the schedule topic) with the entry's [`SCHEDULE_ORIGIN`].
/// An entry without its real topic is never delivered (it is skipped).
fn delivered(
    store: &shoal_store::MessageStore,
    level: i32,
    msg: &MessageExt,
) -> Result<bool, Reject> {
    let Some(topic) = msg.property(property::REAL_TOPIC) else {
        return Ok(true);
    };
    let Some(uniq) = msg.property(property::UNIQ_KEY) else {
        return Ok(false);
    };
    let want = origin(level, msg.queue_offset);
    for t in [topic, SCHEDULE_TOPIC] {
        for rec in store.query_by_uniq_key(t, uniq).map_err(Reject::system)? {
            let copies = decode_records(&rec, &DecodeOptions::default());
            if copies
                .messages
                .iter()
                .any(|m| m.property(SCHEDULE_ORIGIN) == Some(want.as_str()))
            {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests;
