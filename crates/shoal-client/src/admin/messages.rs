//! Messages through the admin client: lookup by message id or key, and the dead-letter
//! queue (listing a group's dead letters, sending one back to its group).

use super::{refused, AdminClient, AdminError, AdminResult};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::dlq_topic;
use shoal_proto::header::*;
use shoal_proto::message::{decode_records, DecodeOptions, MessageExt, OffsetMsgId};
use shoal_proto::RemotingCommand;

impl AdminClient {
    /// Looks a message up by its offset message id (32 or 56 hex characters, as returned by a
    /// send) or, with `topic`, by its UNIQ_KEY.
    pub async fn view_message(&self, id: &str, topic: Option<&str>) -> AdminResult<MessageExt> {
        if let Ok(oid) = OffsetMsgId::parse(id) {
            let addr = oid.store_host.to_string();
            let req = RemotingCommand::request_with_header(
                rc::VIEW_MESSAGE_BY_ID,
                &ViewMessageByIdRequestHeader {
                    offset: oid.commit_log_offset,
                    ..Default::default()
                },
            );
            let r = self.call(&addr, req).await?;
            if r.code == resp::SUCCESS {
                return Self::first_message(&addr, &r, id);
            }
            // A refusal (the ACL) is said as one, not as "not found".
            if r.code == resp::NO_PERMISSION {
                return Err(refused("VIEW_MESSAGE_BY_ID", &addr, &r));
            }
            if topic.is_none() {
                return Err(AdminError::MessageNotFound(id.into()));
            }
        }
        let topic = topic.ok_or_else(|| {
            AdminError::Invalid(format!(
                "{id} is not an offset message id; give --topic to look it up by its message key"
            ))
        })?;
        let route = self.topic_route(topic).await?;
        for b in &route.broker_datas {
            let Some(addr) = b.master_addr() else {
                continue;
            };
            let req = RemotingCommand::request_with_header(
                rc::QUERY_MESSAGE,
                &QueryMessageRequestHeader {
                    topic: topic.into(),
                    key: id.into(),
                    max_num: 1,
                    begin_timestamp: 0,
                    end_timestamp: i64::MAX,
                    unique_key_query: Some(true),
                    ..Default::default()
                },
            );
            let r = self.call(addr, req).await?;
            if r.code == resp::SUCCESS {
                return Self::first_message(addr, &r, id);
            }
            if r.code == resp::NO_PERMISSION {
                return Err(refused("QUERY_MESSAGE", addr, &r));
            }
        }
        Err(AdminError::MessageNotFound(id.into()))
    }

    /// Messages of `topic` whose KEYS include `key` (RocketMQ's index query), on every broker
    /// of the topic, at most `max` in all, oldest first.
    pub async fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        max: usize,
    ) -> AdminResult<Vec<MessageExt>> {
        let route = self.topic_route(topic).await?;
        let mut found = Vec::new();
        for b in &route.broker_datas {
            let Some(addr) = b.master_addr() else {
                continue;
            };
            let req = RemotingCommand::request_with_header(
                rc::QUERY_MESSAGE,
                &QueryMessageRequestHeader {
                    topic: topic.into(),
                    key: key.into(),
                    max_num: max.min(i32::MAX as usize) as i32,
                    begin_timestamp: 0,
                    end_timestamp: i64::MAX,
                    ..Default::default()
                },
            );
            let r = self.call(addr, req).await?;
            if r.code == resp::NO_PERMISSION {
                return Err(refused("QUERY_MESSAGE", addr, &r));
            }
            if r.code == resp::SUCCESS {
                let body = r.body.clone().unwrap_or_default();
                found.extend(
                    decode_records(&body, &DecodeOptions::client())
                        .messages
                        .into_iter()
                        .filter(|m| m.keys().is_some_and(|k| k.split(' ').any(|k| k == key))),
                );
            }
        }
        found.sort_by_key(|m| (m.store_timestamp, m.queue_offset));
        found.truncate(max);
        Ok(found)
    }

    fn first_message(addr: &str, r: &RemotingCommand, id: &str) -> AdminResult<MessageExt> {
        let body = r.body.clone().unwrap_or_default();
        decode_records(&body, &DecodeOptions::client())
            .messages
            .into_iter()
            .next()
            .ok_or_else(|| AdminError::MessageNotFound(format!("{id} (empty answer from {addr})")))
    }

    /// Registers the tools consumer group on a broker (pulls need a known group).
    async fn ensure_tools_group(&self, addr: &str) -> AdminResult<()> {
        let data = shoal_proto::body::HeartbeatData {
            client_id: format!("shoal-admin@{}", std::process::id()),
            consumer_data_set: vec![shoal_proto::body::ConsumerData {
                group_name: shoal_proto::constants::TOOLS_CONSUMER_GROUP.into(),
                consume_type: shoal_proto::body::ConsumeType::ConsumeActively,
                ..Default::default()
            }],
            ..Default::default()
        };
        let req = RemotingCommand::request(rc::HEART_BEAT)
            .with_json_body(&data)
            .map_err(|source| AdminError::Proto {
                addr: addr.to_string(),
                source,
            })?;
        self.call_ok("heartbeat", addr, req).await?;
        Ok(())
    }

    /// Sends a dead-letter message back to the topic it came from (its `RETRY_TOPIC` or
    /// `DLQ_ORIGIN_TOPIC` property), with the same body, tags, keys and message id, as a fresh
    /// message (reconsume count 0). Returns the topic and the new offset message id.
    pub async fn resend_dlq_message(&self, msg: &MessageExt) -> AdminResult<(String, String)> {
        use shoal_proto::message::property;
        let topic = msg
            .property(property::RETRY_TOPIC)
            .or_else(|| msg.property(property::DLQ_ORIGIN_TOPIC))
            .ok_or_else(|| {
                AdminError::Invalid(format!(
                    "message {} does not say which topic it came from",
                    msg.msg_id()
                ))
            })?
            .to_string();
        let route = self.topic_route(&topic).await?;
        let queues = route.publish_queues(&topic);
        let n = queues.len().max(1);
        let pick = (shoal_proto::hash::java_string_hash(&msg.msg_id()) as u32 as usize) % n;
        let mq = queues
            .get(pick)
            .ok_or_else(|| AdminError::Invalid(format!("topic {topic} has no writable queue")))?;
        let addr = route
            .broker_datas
            .iter()
            .find(|b| b.broker_name == mq.broker_name)
            .and_then(|b| b.master_addr())
            .ok_or_else(|| AdminError::Invalid(format!("broker {} has no master", mq.broker_name)))?
            .to_string();
        let mut props = msg.properties.clone();
        for k in [
            property::RETRY_TOPIC,
            property::DLQ_ORIGIN_TOPIC,
            property::DLQ_ORIGIN_MESSAGE_ID,
            property::REAL_TOPIC,
            property::REAL_QID,
            property::DELAY,
            property::ORIGIN_MESSAGE_ID,
            property::CLUSTER,
            property::MAX_OFFSET,
            property::MIN_OFFSET,
        ] {
            props.shift_remove(k);
        }
        let props = shoal_proto::message::encode_properties(&props).map_err(|source| {
            AdminError::Proto {
                addr: addr.clone(),
                source,
            }
        })?;
        let header = SendMessageRequestHeader {
            producer_group: shoal_proto::constants::TOOLS_CONSUMER_GROUP.into(),
            topic: topic.clone(),
            default_topic: "TBW102".into(),
            default_topic_queue_nums: 4,
            queue_id: mq.queue_id,
            sys_flag: msg.sys_flag & !0x30,
            born_timestamp: msg.born_timestamp,
            flag: msg.flag,
            properties: Some(props),
            reconsume_times: Some(0),
            ..Default::default()
        };
        let req = RemotingCommand::request_with_header(
            rc::SEND_MESSAGE_V2,
            &SendMessageRequestHeaderV2::from(header),
        )
        .with_body(msg.body.clone());
        let r = self.call_ok("resend", &addr, req).await?;
        let h: SendMessageResponseHeader =
            r.decode_command_header()
                .map_err(|source| AdminError::Proto {
                    addr: addr.clone(),
                    source,
                })?;
        Ok((topic, h.msg_id))
    }

    /// Messages in a group's dead-letter queue (up to `max`).
    pub async fn dlq_messages(&self, group: &str, max: usize) -> AdminResult<Vec<MessageExt>> {
        let topic = dlq_topic(group);
        let route = match self.topic_route(&topic).await {
            Ok(r) => r,
            Err(AdminError::TopicNotFound(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for qd in &route.queue_datas {
            let Some(addr) = route
                .broker_datas
                .iter()
                .find(|b| b.broker_name == qd.broker_name)
                .and_then(|b| b.master_addr())
            else {
                continue;
            };
            self.ensure_tools_group(addr).await?;
            for q in 0..qd.read_queue_nums {
                let mut offset = 0;
                while out.len() < max {
                    let req = RemotingCommand::request_with_header(
                        rc::PULL_MESSAGE,
                        &PullMessageRequestHeader {
                            consumer_group: shoal_proto::constants::TOOLS_CONSUMER_GROUP.into(),
                            topic: topic.clone(),
                            queue_id: q,
                            queue_offset: offset,
                            max_msg_nums: 32,
                            sys_flag: shoal_proto::constants::pull_sys_flag::SUBSCRIPTION,
                            subscription: Some("*".into()),
                            ..Default::default()
                        },
                    );
                    let r = self.call(addr, req).await?;
                    if r.code != resp::SUCCESS {
                        break;
                    }
                    let h: PullMessageResponseHeader =
                        r.decode_command_header()
                            .map_err(|source| AdminError::Proto {
                                addr: addr.to_string(),
                                source,
                            })?;
                    let body = r.body.clone().unwrap_or_default();
                    out.extend(decode_records(&body, &DecodeOptions::client()).messages);
                    offset = h.next_begin_offset;
                }
            }
        }
        out.truncate(max);
        Ok(out)
    }
}
