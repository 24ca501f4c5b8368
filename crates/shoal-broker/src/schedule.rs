//! Delay levels (RocketMQ's `ScheduleMessageService`): messages parked in
//! `SCHEDULE_TOPIC_XXXX` queue `level - 1` are re-stored in their real topic and queue when
//! their store time plus the level's delay has passed. One task per level; each sleeps until
//! the next message is due (or a new one arrives), so delivery is on time rather than polled.
//! Progress per level is kept in the store's delay offsets (persisted with consumer offsets).

use crate::clock::wall_ms;
use crate::reply::Reject;
use crate::send::put;
use crate::shared::Shared;
use shoal_proto::constants::SCHEDULE_TOPIC;
use shoal_proto::message::{decode_records, encode_properties, property, DecodeOptions};
use shoal_store::MessageExtBrokerInner;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

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
    loop {
        if !b.writes_log() {
            // A replica: the master delivers, and its progress reaches this log.
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
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
