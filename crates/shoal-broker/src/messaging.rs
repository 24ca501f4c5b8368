//! What a protocol front end of the broker (the gRPC endpoint of `shoal-grpc`) asks of its
//! messaging services, as methods of [`BrokerApi`]:
//! - sends and transaction ends, run through the same handlers as remoting requests (so a
//!   gRPC send gets the remoting send's checks: topic, permission, message type, size, delay
//!   and timer, half messages);
//! - POP receives (the broker's POP engine, long polling included), acks, invisibility changes
//!   and dead-lettering by receipt;
//! - consumer offsets, queue bounds;
//! - transaction checks routed to the front end's producers when no remoting producer of the
//!   group is connected.
//!
//! Refusals carry RocketMQ's remoting response code and remark ([`Refusal`]); the front end
//! maps them to its own status codes.

use crate::api::BrokerApi;
use crate::caller::Caller;
use crate::pop::consume::{self, PopAsk, PopOutcome};
use crate::pop::revive::pop_retry_topic;
use crate::reply::Reject;
pub use crate::transaction::front::{TransactionCheck, TransactionChecker};
use bytes::Bytes;
use shoal_group::pop::QueueKey;
use shoal_proto::body::{SubscriptionData, TopicConfig};
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::RETRY_GROUP_TOPIC_PREFIX;
use shoal_proto::header::{
    EndTransactionRequestHeader, PopExtraInfo, PopRetryFlag, SendMessageRequestHeader,
    SendMessageRequestHeaderV2, SendMessageResponseHeader,
};
use shoal_proto::message::{encode_properties, MessageExt, OffsetMsgId, Properties};
use shoal_proto::RemotingCommand;
use std::net::SocketAddr;
use std::time::Duration;

/// Connection id of requests a front end runs through the remoting handlers (no socket).
const FRONT_END_CONN_ID: u64 = 0;

/// Why the broker refused: RocketMQ's remoting response code and a remark.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{remark} (code {code})")]
pub struct Refusal {
    /// Remoting response code (`shoal_proto::code::response_code`).
    pub code: i32,
    /// Why.
    pub remark: String,
}

impl From<Reject> for Refusal {
    fn from(r: Reject) -> Self {
        Self {
            code: r.code,
            remark: r.remark,
        }
    }
}

impl Refusal {
    fn new(code: i32, remark: impl Into<String>) -> Self {
        Self {
            code,
            remark: remark.into(),
        }
    }

    fn of(r: &RemotingCommand) -> Self {
        Self::new(r.code, r.remark.clone().unwrap_or_default())
    }
}

/// A message to send.
#[derive(Debug, Clone)]
pub struct OutgoingMessage {
    /// Topic.
    pub topic: String,
    /// Queue, or `None` for one the broker picks.
    pub queue_id: Option<i32>,
    /// Body.
    pub body: Bytes,
    /// Properties (user and system: `UNIQ_KEY`, `TAGS`, `KEYS`, `__SHARDINGKEY`,
    /// `TIMER_DELIVER_MS`, `TRAN_MSG`, ...).
    pub properties: Properties,
    /// Producer group (`PGROUP` of a transactional message).
    pub producer_group: String,
    /// A transactional (half) message.
    pub transactional: bool,
    /// When the producer made it, ms.
    pub born_timestamp: i64,
}

/// Where a sent message was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReceipt {
    /// Queue.
    pub queue_id: i32,
    /// Queue offset.
    pub queue_offset: i64,
    /// Offset message id (store host and commit-log offset).
    pub offset_msg_id: String,
    /// Commit-log offset.
    pub commit_log_offset: i64,
}

/// A subscription's filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// Tag expression (`*`, `a || b`).
    Tag(String),
    /// SQL92 selector.
    Sql(String),
}

/// A POP receive.
#[derive(Debug, Clone)]
pub struct PopQuery {
    /// Consumer group.
    pub group: String,
    /// Topic.
    pub topic: String,
    /// One queue, or every readable queue (`None`).
    pub queue_id: Option<i32>,
    /// At most this many messages (1..=32).
    pub max: usize,
    /// Lease length asked, ms (clamped to 1 s..12 h).
    pub invisible_ms: u64,
    /// FIFO: a queue hands out its next message only after the previous one is acked.
    pub fifo: bool,
    /// Filter.
    pub filter: Filter,
    /// Who receives (shown by `group describe`).
    pub consumer: String,
}

/// One message received under lease.
#[derive(Debug, Clone)]
pub struct PoppedMessage {
    /// The message as stored (its topic is the POP retry topic's for a redelivery).
    pub message: MessageExt,
    /// The receipt (ack and invisibility changes name it).
    pub receipt: PopExtraInfo,
    /// Which delivery this is (1 the first time).
    pub attempt: u32,
}

/// What a POP receive got.
#[derive(Debug, Clone, Default)]
pub struct PopBatch {
    /// Receipt time of every message, ms.
    pub pop_time: u64,
    /// Lease length granted, ms.
    pub invisible_ms: u64,
    /// The messages.
    pub messages: Vec<PoppedMessage>,
    outcome: PopOutcome,
}

/// The queue a receipt names: `topic`, or its POP retry topic when the receipt says so.
fn receipt_key(group: &str, topic: &str, receipt: &PopExtraInfo) -> QueueKey {
    let topic =
        if topic.starts_with(RETRY_GROUP_TOPIC_PREFIX) || receipt.retry == PopRetryFlag::Normal {
            topic.to_owned()
        } else {
            pop_retry_topic(group, topic)
        };
    QueueKey::new(group, topic, receipt.queue_id)
}

/// The header of a send's answer: as the send handler writes it for a JSON request (its
/// JSON text), or as a map.
fn send_answer(r: &RemotingCommand) -> Option<SendMessageResponseHeader> {
    if let Some(shoal_proto::RawExtFields::Json(text)) = &r.ext_fields_raw {
        let v: serde_json::Value = serde_json::from_str(text).ok()?;
        let field = |k: &str| -> Option<String> {
            match v.get(k)? {
                serde_json::Value::String(s) => Some(s.clone()),
                other => Some(other.to_string()),
            }
        };
        return Some(SendMessageResponseHeader {
            msg_id: field("msgId")?,
            queue_id: field("queueId")?.parse().ok()?,
            queue_offset: field("queueOffset")?.parse().ok()?,
            ..Default::default()
        });
    }
    r.decode_command_header().ok()
}

impl BrokerApi {
    fn caller(peer: SocketAddr) -> Caller<'static> {
        Caller {
            conn_id: FRONT_END_CONN_ID,
            peer,
            conn: None,
        }
    }

    /// The topic's config; created from the auto-create template when it does not exist and
    /// the broker auto-creates topics.
    pub fn topic_or_auto_create(&self, topic: &str) -> Option<TopicConfig> {
        if let Some(c) = self.b.topics.get(topic) {
            return Some(c);
        }
        if !self.b.config.auto_create_topic || crate::topic::validate_topic_name(topic).is_err() {
            return None;
        }
        let made = self
            .b
            .topics
            .ensure_from_template(
                topic,
                shoal_proto::constants::AUTO_CREATE_TOPIC_KEY_TOPIC,
                4,
            )
            .ok()
            .flatten()?;
        if let Err(e) = self.b.topics.persist() {
            tracing::warn!(%topic, error = %e, "auto-created topic not persisted");
            return None;
        }
        Some(made.config)
    }

    /// Sends one message through the broker's send handler.
    ///
    /// # Errors
    /// The send handler's refusals (topic, permission, message type, size, busy store).
    pub async fn send(&self, peer: SocketAddr, m: OutgoingMessage) -> Result<SendReceipt, Refusal> {
        let mut props = m.properties;
        let mut sys_flag = 0;
        if m.transactional {
            props.insert(
                shoal_proto::message::property::TRAN_MSG.into(),
                "true".into(),
            );
            props.insert(
                shoal_proto::message::property::PGROUP.into(),
                m.producer_group.clone(),
            );
            sys_flag = shoal_proto::message::sys_flag::TRANSACTION_PREPARED_TYPE;
        }
        let properties = encode_properties(&props)
            .map_err(|e| Refusal::new(resp::MESSAGE_ILLEGAL, e.to_string()))?;
        let header = SendMessageRequestHeader {
            producer_group: m.producer_group,
            topic: m.topic,
            default_topic: shoal_proto::constants::AUTO_CREATE_TOPIC_KEY_TOPIC.into(),
            default_topic_queue_nums: 4,
            queue_id: m.queue_id.unwrap_or(-1),
            sys_flag,
            born_timestamp: m.born_timestamp,
            flag: 0,
            properties: Some(properties),
            ..Default::default()
        };
        let mut req = RemotingCommand::request_with_header(
            rc::SEND_MESSAGE_V2,
            &SendMessageRequestHeaderV2::from(header),
        )
        .with_body(m.body);
        // Answered with a JSON header, read below.
        req.serialize_type = shoal_proto::SerializeType::Json;
        let r = crate::send::send_message(&self.b, &Self::caller(peer), &req)
            .await?
            .ok_or_else(|| Refusal::new(resp::SYSTEM_ERROR, "the send was not answered"))?;
        if r.code != resp::SUCCESS {
            return Err(Refusal::of(&r));
        }
        let h = send_answer(&r)
            .ok_or_else(|| Refusal::new(resp::SYSTEM_ERROR, "the send's answer has no header"))?;
        let commit_log_offset = OffsetMsgId::parse(&h.msg_id)
            .map(|o| o.commit_log_offset)
            .unwrap_or(-1);
        Ok(SendReceipt {
            queue_id: h.queue_id,
            queue_offset: h.queue_offset,
            offset_msg_id: h.msg_id,
            commit_log_offset,
        })
    }

    /// Commits or rolls back a half message (END_TRANSACTION's handler).
    ///
    /// # Errors
    /// The handler's refusals (no such half message, wrong group or offsets).
    pub async fn end_transaction(
        &self,
        peer: SocketAddr,
        header: EndTransactionRequestHeader,
    ) -> Result<(), Refusal> {
        let req = RemotingCommand::request_with_header(rc::END_TRANSACTION, &header);
        match crate::transaction::end::end_transaction(&self.b, &Self::caller(peer), &req).await? {
            Some(r) if r.code != resp::SUCCESS => Err(Refusal::of(&r)),
            _ => Ok(()),
        }
    }

    /// Routes the broker's transaction checks of producer groups with no remoting producer
    /// connected to `checker` (once; `false` when one was set already).
    pub fn set_transaction_checker(&self, checker: TransactionChecker) -> bool {
        self.b.transaction_checker.set(checker).is_ok()
    }

    /// Pops up to `q.max` messages under lease, holding the request up to `poll` until one
    /// arrives; stops at once without leasing when `gone` says the receiver left. `None`
    /// when too many receives are held already (`pop_max_polling`).
    ///
    /// # Errors
    /// Unknown topic or group, a group that may not consume, a filter that does not compile,
    /// store or journal failures.
    pub async fn pop(
        &self,
        q: PopQuery,
        poll: Duration,
        gone: impl Fn() -> bool,
    ) -> Result<Option<PopBatch>, Refusal> {
        let b = &self.b;
        crate::pop::view::consumer_group(b, &q.group)?;
        let queues = crate::pop::view::readable_queues(b, &q.topic)?;
        if q.queue_id.is_some_and(|id| id < 0 || id >= queues) {
            return Err(Refusal::new(
                resp::INVALID_PARAMETER,
                format!("queue {:?} of {} does not exist", q.queue_id, q.topic),
            ));
        }
        let (sql, tags) = match &q.filter {
            Filter::Sql(expr) => (crate::filter::compile_typed(b, Some("SQL92"), expr)?, None),
            Filter::Tag(expr) => (
                None,
                Some(SubscriptionData::from_tag_expression(
                    q.topic.clone(),
                    expr,
                    0,
                )),
            ),
        };
        let ask = PopAsk {
            group: q.group,
            topic: q.topic,
            queue_id: q.queue_id,
            max: q.max.clamp(1, consume::MAX_BATCH as usize),
            invisible_ms: q.invisible_ms,
            from_min: false,
            fifo: q.fifo,
            tags,
            sql,
            consumer: q.consumer,
        };
        let out = match consume::pop_waiting(b, &ask, poll, gone).await? {
            Ok(out) => out,
            Err(()) => return Ok(None),
        };
        let mut messages = Vec::with_capacity(out.messages.len());
        for p in &out.messages {
            let (message, _) = shoal_proto::message::decode_record(
                &p.record,
                0,
                &shoal_proto::message::DecodeOptions {
                    decompress_body: true,
                    ..Default::default()
                },
            )
            .map_err(|e| Refusal::new(resp::SYSTEM_ERROR, format!("stored message: {e}")))?;
            let fifo = ask.fifo && !p.key.topic.starts_with(RETRY_GROUP_TOPIC_PREFIX);
            let attempt = if fifo {
                p.attempts.max(1)
            } else {
                message.reconsume_times.max(0) as u32 + 1
            };
            let receipt = PopExtraInfo {
                ck_queue_offset: p.offset as i64,
                pop_time: out.pop_time as i64,
                invisible_time: out.invisible_ms as i64,
                revive_qid: 0,
                retry: PopRetryFlag::of_topic(&p.key.topic),
                broker_name: b.config.broker_name.clone(),
                queue_id: p.key.queue_id,
                msg_queue_offset: Some(p.offset as i64),
            };
            messages.push(PoppedMessage {
                message,
                receipt,
                attempt,
            });
        }
        Ok(Some(PopBatch {
            pop_time: out.pop_time,
            invisible_ms: out.invisible_ms,
            messages,
            outcome: out,
        }))
    }

    /// Gives back the leases of a batch that could not be handed to its receiver: its
    /// messages become visible again after the shortest lease.
    pub fn release(&self, batch: &PopBatch) {
        consume::release(&self.b, &batch.outcome);
    }

    fn check_receipt_broker(&self, receipt: &PopExtraInfo) -> Result<(), Refusal> {
        if receipt.broker_name != self.b.config.broker_name {
            return Err(Refusal::new(
                resp::NO_MESSAGE,
                format!(
                    "the receipt was issued by broker {}, not {}",
                    receipt.broker_name, self.b.config.broker_name
                ),
            ));
        }
        Ok(())
    }

    /// Acknowledges a received message by its receipt (`topic` as subscribed).
    ///
    /// # Errors
    /// NO_MESSAGE for a stale, lapsed, foreign or repeated receipt; SYSTEM_ERROR when the
    /// lease journal could not be written.
    pub fn ack(&self, group: &str, topic: &str, receipt: &PopExtraInfo) -> Result<(), Refusal> {
        self.check_receipt_broker(receipt)?;
        let key = receipt_key(group, topic, receipt);
        let offset = receipt.msg_queue_offset.unwrap_or(receipt.ck_queue_offset);
        consume::ack(
            &self.b,
            &key,
            offset.max(0) as u64,
            receipt.pop_time.max(0) as u64,
        )?;
        Ok(())
    }

    /// Makes a received message invisible for `invisible_ms` from now; returns its new
    /// receipt (the old one is void).
    ///
    /// # Errors
    /// As [`BrokerApi::ack`].
    pub fn change_invisible(
        &self,
        group: &str,
        topic: &str,
        receipt: &PopExtraInfo,
        invisible_ms: u64,
    ) -> Result<PopExtraInfo, Refusal> {
        self.check_receipt_broker(receipt)?;
        let key = receipt_key(group, topic, receipt);
        let offset = receipt.msg_queue_offset.unwrap_or(receipt.ck_queue_offset);
        let (pop_time, invisible) = consume::change_invisible(
            &self.b,
            &key,
            offset.max(0) as u64,
            receipt.pop_time.max(0) as u64,
            invisible_ms,
        )?;
        Ok(PopExtraInfo {
            pop_time: pop_time as i64,
            invisible_time: invisible as i64,
            ..receipt.clone()
        })
    }

    /// Moves a received message to the group's dead-letter topic and acknowledges it (the
    /// client gave up on it).
    ///
    /// # Errors
    /// As [`BrokerApi::ack`]; the copy could not be stored (nothing is acknowledged then).
    pub async fn dead_letter(
        &self,
        group: &str,
        topic: &str,
        receipt: &PopExtraInfo,
    ) -> Result<(), Refusal> {
        self.check_receipt_broker(receipt)?;
        let key = receipt_key(group, topic, receipt);
        let offset = receipt.msg_queue_offset.unwrap_or(receipt.ck_queue_offset);
        // The lease must be current before anything is copied.
        let renewed = self.change_invisible(group, topic, receipt, 60_000)?;
        crate::pop::revive::copy(
            &self.b,
            &key.group,
            &key.topic,
            key.queue_id,
            offset.max(0) as u64,
            true,
        )
        .await
        .map_err(|why| Refusal::new(resp::SYSTEM_ERROR, why))?;
        self.ack(group, topic, &renewed)
    }

    /// The group's committed offset of a queue, if it has one.
    pub fn consumer_offset(&self, group: &str, topic: &str, queue_id: i32) -> Option<i64> {
        self.b
            .store
            .query_offset(group, topic, queue_id)
            .filter(|o| *o >= 0)
    }

    /// Commits the group's offset of a queue.
    pub fn commit_consumer_offset(&self, group: &str, topic: &str, queue_id: i32, offset: i64) {
        self.b.store.commit_offset(group, topic, queue_id, offset);
    }

    /// A queue's first and next offsets.
    pub fn queue_bounds(&self, topic: &str, queue_id: i32) -> (u64, u64) {
        crate::pop::view::queue_bounds(&self.b, topic, queue_id)
    }
}

impl BrokerApi {
    /// Whether the broker checks an ACL.
    pub fn acl_enabled(&self) -> bool {
        self.b.acl.is_some()
    }

    /// Checks a front end's request against the broker's ACL (accepted when it has none);
    /// refusals are counted and logged as remoting ones are.
    ///
    /// # Errors
    /// Why the ACL refuses.
    pub fn acl_check(&self, req: &shoal_proto::acl::AccessRequest) -> Result<(), String> {
        let Some(acl) = self.b.acl.as_ref() else {
            return Ok(());
        };
        acl.check(req, shoal_proto::acl::ADMIN_REQUEST_CODES)
            .map_err(|denied| {
                let n = self
                    .b
                    .counters
                    .acl_refused
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    + 1;
                if crate::reply::worth_logging(n) {
                    tracing::warn!(peer = %req.remote, reason = %denied.0, refused = n, "gRPC call refused by the ACL");
                }
                denied.0
            })
    }
}

impl BrokerApi {
    /// The group's `retryMaxTimes`, if the group exists.
    pub fn group_retry_max_times(&self, group: &str) -> Option<i32> {
        self.b.sub_groups.get(group).map(|g| g.retry_max_times)
    }

    /// Whether the group consumes in order (`consumeMessageOrderly`): its POP receives are
    /// FIFO.
    pub fn group_is_fifo(&self, group: &str) -> bool {
        self.b
            .sub_groups
            .get(group)
            .is_some_and(|g| g.consume_message_orderly)
    }

    /// The first offset of a queue stored at or after `timestamp_ms` (the queue's next offset
    /// when none is).
    pub fn offset_at_time(&self, topic: &str, queue_id: i32, timestamp_ms: i64) -> i64 {
        self.b
            .store
            .offset_by_timestamp(
                topic,
                queue_id,
                timestamp_ms,
                shoal_store::BoundaryType::Lower,
            )
            .map_or_else(
                |_| self.b.store.max_offset(topic, queue_id) as i64,
                |o| o as i64,
            )
    }

    /// The delay levels, ms (level n is index n − 1).
    pub fn delay_levels_ms(&self) -> &[u64] {
        &self.b.delay_levels_ms
    }
}
