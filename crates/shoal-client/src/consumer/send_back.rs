//! Failed messages back to the broker for retry: CONSUMER_SEND_MSG_BACK, else a normal send
//! to `%RETRY%<group>`; and the real topic of retry messages restored for listeners.

use super::Inner;
use crate::producer::Producer;
use shoal_proto::constants::{is_retry_topic, retry_topic};
use shoal_proto::message::{property, Message, MessageExt};
use shoal_proto::MessageQueue;
use std::sync::atomic::Ordering;
use tracing::warn;

impl Inner {
    /// Restores the real topic of a retry message for the listener.
    pub(super) fn for_listener(&self, mut m: MessageExt) -> MessageExt {
        if let Some(t) = original_topic(&m) {
            m.topic = t;
        }
        m
    }

    /// [`Inner::for_listener`] in place: returns the retry topics it replaced, by position.
    pub(super) fn for_listener_in_place(&self, msgs: &mut [MessageExt]) -> Vec<(usize, String)> {
        let mut replaced = Vec::new();
        for (i, m) in msgs.iter_mut().enumerate() {
            if let Some(t) = original_topic(m) {
                replaced.push((i, std::mem::replace(&mut m.topic, t)));
            }
        }
        replaced
    }

    pub(super) fn max_reconsume(&self) -> i32 {
        self.config.max_reconsume_times.unwrap_or(16)
    }

    /// Sends a failed message back for retry: CONSUMER_SEND_MSG_BACK, else a normal send to
    /// `%RETRY%<group>`. Returns false if both failed.
    pub(super) async fn send_back(&self, mq: &MessageQueue, m: &MessageExt) -> bool {
        let max = self.max_reconsume();
        match self
            .instance
            .send_back(&mq.broker_name, &self.config.group, m, 0, max)
            .await
        {
            Ok(()) => {
                self.stats.sent_back.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                warn!(queue = %mq, error = %e, "send back failed; sending to the retry topic");
                self.send_to_retry_topic(m, max, 3 + m.reconsume_times)
                    .await
            }
        }
    }

    /// A normal send to `%RETRY%<group>` (spec 6) with the retry properties.
    pub(super) async fn send_to_retry_topic(&self, m: &MessageExt, max: i32, delay: i32) -> bool {
        let producer = match self
            .retry_producer
            .get_or_try_init(|| async {
                let mut cfg = crate::producer::ProducerConfig::new(
                    shoal_proto::constants::CLIENT_INNER_PRODUCER_GROUP,
                );
                cfg.client = self.config.client.clone();
                cfg.client.instance_name = None;
                Producer::start(cfg).await
            })
            .await
        {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "retry producer failed to start");
                return false;
            }
        };
        let mut msg = Message::new(retry_topic(&self.config.group), m.body.clone());
        msg.flag = m.flag;
        msg.properties = m.properties.clone();
        let origin_topic = m
            .property(property::RETRY_TOPIC)
            .map(str::to_owned)
            .unwrap_or_else(|| m.topic.clone());
        let origin_id = m
            .property(property::ORIGIN_MESSAGE_ID)
            .map(str::to_owned)
            .unwrap_or_else(|| m.msg_id().into_owned());
        msg.remove_property(property::TRAN_MSG);
        let ok = msg
            .put_property(property::RETRY_TOPIC, origin_topic)
            .is_ok()
            && msg
                .put_property(property::ORIGIN_MESSAGE_ID, origin_id)
                .is_ok()
            && msg
                .put_property(
                    property::RECONSUME_TIME,
                    (m.reconsume_times + 1).to_string(),
                )
                .is_ok()
            && msg
                .put_property(property::MAX_RECONSUME_TIMES, max.to_string())
                .is_ok()
            && (delay <= 0 || msg.set_delay_level(delay).is_ok());
        if !ok {
            return false;
        }
        match producer.send(msg).await {
            Ok(_) => {
                self.stats.sent_back.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                warn!(error = %e, "sending to the retry topic failed");
                false
            }
        }
    }
}

/// The topic a message of a retry topic was first sent to (its `RETRY_TOPIC` property).
fn original_topic(m: &MessageExt) -> Option<String> {
    if is_retry_topic(&m.topic) {
        m.property(property::RETRY_TOPIC).map(str::to_owned)
    } else {
        None
    }
}
