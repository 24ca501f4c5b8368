//! CONSUMER_SEND_MSG_BACK (spec 6): a message the consumer failed goes to the group's retry
//! topic after a delay, or to its dead-letter topic after too many attempts.

use crate::reply::{ok, Handled, Reject};
use crate::send::{apply_delay, put};
use crate::shared::Shared;
use shoal_proto::code::response_code as resp;
use shoal_proto::constants::{dlq_topic, perm, retry_topic};
use shoal_proto::header::ConsumerSendMsgBackRequestHeader;
use shoal_proto::message::{decode_record, encode_properties, property, DecodeOptions};
use shoal_proto::RemotingCommand;
use shoal_store::MessageExtBrokerInner;
use std::sync::Arc;

/// The client version from which `maxReconsumeTimes` in the header is honoured (V3_4_9).
const V3_4_9: i32 = 121;

/// Handles CONSUMER_SEND_MSG_BACK.
pub(crate) async fn consumer_send_msg_back(b: &Arc<Shared>, req: &RemotingCommand) -> Handled {
    let h: ConsumerSendMsgBackRequestHeader = req.decode_command_header()?;
    let group = b.sub_groups.get(&h.group).ok_or_else(|| {
        Reject::new(
            resp::SUBSCRIPTION_GROUP_NOT_EXIST,
            format!("subscription group not exist, {}", h.group),
        )
    })?;
    if group.retry_queue_nums <= 0 {
        return ok();
    }
    if h.offset < 0 {
        return Err(Reject::new(
            resp::SYSTEM_ERROR,
            format!("look message by offset failed, {}", h.offset),
        ));
    }
    // One record read from the commit log (the page cache, as pulls read it): on this task,
    // not handed to the blocking pool.
    let record = b
        .store
        .message_by_physical_offset(h.offset as u64)
        .map_err(Reject::system)?
        .ok_or_else(|| {
            Reject::new(
                resp::SYSTEM_ERROR,
                format!("look message by offset failed, {}", h.offset),
            )
        })?;
    let (mut msg, _) = decode_record(&record, 0, &DecodeOptions::default())?;

    let original_topic = msg.topic.clone();
    if msg.property(property::RETRY_TOPIC).is_none() {
        msg.put_property(property::RETRY_TOPIC, original_topic.clone())?;
    }
    let max = match h.max_reconsume_times {
        Some(m) if req.version >= V3_4_9 => m,
        _ => group.retry_max_times,
    };
    let origin_id = msg
        .property(property::ORIGIN_MESSAGE_ID)
        .map(str::to_string)
        .unwrap_or_else(|| msg.offset_msg_id());
    let mut props = msg.properties.clone();
    props.insert(property::ORIGIN_MESSAGE_ID.into(), origin_id.clone());
    props.shift_remove(property::DELAY);

    let (topic, queue_id) = if msg.reconsume_times >= max || h.delay_level < 0 {
        let dlq = dlq_topic(&h.group);
        b.topics
            .ensure(&dlq, 1, perm::PERM_READ_WRITE)
            .map_err(Reject::system)?;
        props.insert(
            property::DLQ_ORIGIN_TOPIC.into(),
            msg.property(property::RETRY_TOPIC)
                .unwrap_or(&original_topic)
                .to_string(),
        );
        props.insert(
            property::DLQ_ORIGIN_MESSAGE_ID.into(),
            msg.msg_id().into_owned(),
        );
        tracing::info!(group = %h.group, msg_id = %msg.msg_id(), attempts = msg.reconsume_times, "message moved to the dead-letter queue");
        (dlq, 0)
    } else {
        let retry = retry_topic(&h.group);
        let queues = b
            .topics
            .ensure(&retry, group.retry_queue_nums, perm::PERM_READ_WRITE)
            .map_err(Reject::system)?
            .config
            .write_queue_nums
            .max(1);
        let level = if h.delay_level == 0 {
            3 + msg.reconsume_times
        } else {
            h.delay_level
        };
        props.insert(property::DELAY.into(), level.to_string());
        (retry, (rand::random::<u32>() % queues as u32) as i32)
    };

    let mut inner = MessageExtBrokerInner {
        topic,
        queue_id,
        flag: msg.flag,
        sys_flag: msg.sys_flag,
        born_timestamp: msg.born_timestamp,
        born_host: msg.born_host,
        reconsume_times: msg.reconsume_times + 1,
        prepared_transaction_offset: 0,
        body: msg.body.clone(),
        properties: String::new(),
        known: None,
    };
    apply_delay(b, &mut inner, &mut props);
    inner.properties = encode_properties(&props)?;
    b.persist_tables().await?;
    put(b, vec![inner]).await?;
    ok()
}
