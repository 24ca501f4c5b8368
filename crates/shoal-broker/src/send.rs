//! SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE, and the storing rules every path
//! shares (delay levels, retry-topic diversion to the DLQ).

use crate::caller::Caller;
use crate::clock::wall_ms;
use crate::reply::{Handled, Reject};
use crate::shared::Shared;
use shoal_proto::body::TopicMessageType;
use shoal_proto::code::{request_code as rc, response_code as resp};
use shoal_proto::constants::{
    dlq_topic, group_of_retry_topic, is_retry_topic, perm, DEFAULT_REGION, SCHEDULE_TOPIC,
};
use shoal_proto::header::{send_response_binary, send_response_json, SendHeaderRef};
use shoal_proto::message::{
    decode_batch_raw, decode_properties, encode_properties, property, Properties,
};
use shoal_proto::{RawExtFields, RemotingCommand, SerializeType};
use shoal_store::{
    FlushStatus, KnownProperties, MessageExtBrokerInner, PutMessageResult, StoreError,
};
use std::sync::atomic::Ordering;

/// The client version from which `maxReconsumeTimes` in a send header is honoured (V3_4_9).
const V3_4_9: i32 = 121;

/// System topics a client may not send to (RocketMQ's `TopicValidator` "not allowed send"
/// set): the broker writes them itself (delay levels, transaction half and op messages).
pub(crate) const NOT_ALLOWED_SEND_TOPICS: [&str; 7] = [
    crate::replication::METADATA_TOPIC,
    "SCHEDULE_TOPIC_XXXX",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT",
];

/// Refuses a client's send to a system topic with NO_PERMISSION, as Java's broker does.
/// Only the request's own topic is checked: the broker's internal writes (delay levels,
/// transaction half messages) do not pass through here.
pub(crate) fn refuse_system_topic(b: &Shared, topic: &str) -> Result<(), Reject> {
    if !NOT_ALLOWED_SEND_TOPICS.contains(&topic) {
        return Ok(());
    }
    let n = b
        .counters
        .system_topic_sends_refused
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    if crate::reply::worth_logging(n) {
        tracing::warn!(%topic, refused = n, "client send to a system topic refused");
    }
    Err(Reject::new(
        resp::NO_PERMISSION,
        format!("Sending message to topic[{topic}] is forbidden."),
    ))
}

/// Maps a store error to RocketMQ's answer.
pub(crate) fn store_reject(e: StoreError) -> Reject {
    match e {
        StoreError::MessageTooLarge { size, max } => Reject::new(
            resp::MESSAGE_ILLEGAL,
            format!("message of {size} bytes exceeds the limit of {max} bytes"),
        ),
        StoreError::InvalidArgument(m) => Reject::new(resp::MESSAGE_ILLEGAL, m),
        StoreError::Proto(e) => Reject::new(resp::MESSAGE_ILLEGAL, e.to_string()),
        other => Reject::new(
            resp::SERVICE_NOT_AVAILABLE,
            format!("service not available now: the store refused the write ({other})"),
        ),
    }
}

/// Applies the delay rule (spec 6): a message with `DELAY` ≥ 1 is parked in the schedule topic
/// at queue level−1 with its real topic and queue saved. Returns the level used, if any.
///
/// A timed message (RocketMQ 5's `TIMER_DELIVER_MS`, or `TIMER_DELAY_MS` / `TIMER_DELAY_SEC`
/// from now) with no delay level travels through the delay levels in hops: the longest level
/// that does not pass its time (the shortest when none fits), again at each arrival until the
/// time has come, so it is delivered at its time or up to one shortest level later, never
/// before.
pub(crate) fn apply_delay(
    b: &Shared,
    msg: &mut MessageExtBrokerInner,
    props: &mut Properties,
) -> Option<i32> {
    let level: i32 = match props.get(property::DELAY) {
        Some(l) => l.trim().parse().ok()?,
        None => timer_hop(b, props, wall_ms())?,
    };
    if level < 1 || msg.sys_flag & 0xC == 0x4 {
        return None;
    }
    let level = level.min(b.delay_levels_ms.len() as i32);
    props.insert(property::REAL_TOPIC.into(), msg.topic.clone());
    props.insert(property::REAL_QID.into(), msg.queue_id.to_string());
    props.insert(property::DELAY.into(), level.to_string());
    msg.topic = SCHEDULE_TOPIC.into();
    msg.queue_id = level - 1;
    Some(level)
}

/// The delay level of a timed message's next hop (its time is made `TIMER_DELIVER_MS`), `None`
/// when it is not timed or its time has come.
fn timer_hop(b: &Shared, props: &mut Properties, now: i64) -> Option<i32> {
    let number = |k: &str| props.get(k).and_then(|v| v.trim().parse::<i64>().ok());
    let deliver = match number(property::TIMER_DELIVER_MS) {
        Some(t) => t,
        None => {
            let after = number(property::TIMER_DELAY_MS)
                .or_else(|| number(property::TIMER_DELAY_SEC).map(|s| s.saturating_mul(1000)))?;
            let t = now.saturating_add(after);
            props.shift_remove(property::TIMER_DELAY_MS);
            props.shift_remove(property::TIMER_DELAY_SEC);
            props.insert(property::TIMER_DELIVER_MS.into(), t.to_string());
            t
        }
    };
    let left = deliver.saturating_sub(now);
    if left <= 0 {
        return None;
    }
    let levels = &b.delay_levels_ms;
    let fits = (0..levels.len())
        .filter(|&i| levels[i] as i64 <= left)
        .max_by_key(|&i| levels[i]);
    let shortest = (0..levels.len()).min_by_key(|&i| levels[i]);
    fits.or(shortest).map(|i| i as i32 + 1)
}

/// Stores messages through the store's appender (no blocking, no thread hop) and counts them.
pub(crate) async fn put(
    b: &std::sync::Arc<Shared>,
    msgs: Vec<MessageExtBrokerInner>,
) -> Result<PutMessageResult, Reject> {
    let replication = b.replication.get();
    if let Some(r) = replication {
        r.check_writable()
            .map_err(crate::replication::refusal_reject)?;
    }
    let admitted = Admitted::new(b, &msgs)?;
    // Queued for the store's appender: encoded here, appended together with every other send
    // waiting at that moment (one write), completed without a thread hop.
    let start = std::time::Instant::now();
    let r = b.store.submit(msgs).await.map_err(store_reject)?;
    b.metrics.store_append.observe(start.elapsed());
    if let (Some(repl), Some(last)) = (replication, r.messages.last()) {
        // Answered once the in-sync set has it (or refused: the bytes stay, unacknowledged).
        // Boxed: an unreplicated send's future stays as small as it was.
        Box::pin(repl.acknowledged(last.physical_offset + u64::from(last.size)))
            .await
            .map_err(crate::replication::refusal_reject)?;
    }
    admitted.stored(b);
    Ok(r)
}

/// A put let in under `max_inflight_sends` (the count goes down when it is dropped), with
/// what it adds to the counters once stored.
struct Admitted<'b> {
    inflight: &'b std::sync::atomic::AtomicUsize,
    /// The traffic counters of the messages' topic.
    traffic: Option<std::sync::Arc<crate::metrics::TopicTraffic>>,
    messages: u64,
    bytes: u64,
}

impl<'b> Admitted<'b> {
    fn new(b: &'b Shared, msgs: &[MessageExtBrokerInner]) -> Result<Self, Reject> {
        let inflight = &b.counters.inflight_puts;
        if inflight.fetch_add(1, Ordering::AcqRel) >= b.config.max_inflight_sends {
            inflight.fetch_sub(1, Ordering::AcqRel);
            b.counters.sends_rejected_busy.inc();
            return Err(Reject::new(
                resp::SYSTEM_BUSY,
                format!(
                    "[REJECTREQUEST]system busy, {} sends are waiting for the store, start flow control for a while",
                    b.config.max_inflight_sends
                ),
            ));
        }
        Ok(Self {
            inflight,
            traffic: msgs.first().map(|m| b.metrics.topic(&m.topic)),
            messages: msgs.len() as u64,
            bytes: msgs.iter().map(|m| m.body.len() as u64).sum(),
        })
    }

    /// Counts the stored messages (the broker's total and their topic's traffic).
    fn stored(self, b: &Shared) {
        b.counters.msgs_put.inc_by(self.messages);
        if let Some(t) = &self.traffic {
            t.sent(self.messages, self.bytes);
        }
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The response code for a put's durability.
fn flush_code(flush: FlushStatus) -> Result<i32, Reject> {
    match flush {
        FlushStatus::Flushed | FlushStatus::NotFlushed => Ok(resp::SUCCESS),
        FlushStatus::FlushTimeout => Ok(resp::FLUSH_DISK_TIMEOUT),
        FlushStatus::FlushFailed => Err(Reject::new(
            resp::SERVICE_NOT_AVAILABLE,
            "the message was written but its fsync failed; the store refuses writes until restarted",
        )),
    }
}

/// Handles the three send codes.
///
/// Everything but the store's write is done before the first await ([`prepare`]): what the
/// future keeps across its awaits is the put and the few fields of the answer, so the future
/// allocated and moved once per request stays small.
pub(crate) async fn send_message(
    b: &std::sync::Arc<Shared>,
    caller: &Caller<'_>,
    req: &RemotingCommand,
) -> Handled {
    let Prepared {
        msgs,
        queue_id,
        uniq,
    } = prepare(b, caller, req)?;
    if b.tables_dirty() {
        // Rare (a topic or group auto-created): boxed, so its future does not size this one.
        Box::pin(b.persist_tables()).await?;
    }
    let put_result = put(b, msgs).await?;
    answer(req.serialize_type, queue_id, uniq.as_deref(), put_result)
}

/// A send checked and turned into the messages to store.
struct Prepared<'r> {
    msgs: Vec<MessageExtBrokerInner>,
    /// The queue the messages go to (as the client asked, or chosen here).
    queue_id: i32,
    /// The message's UNIQ_KEY, answered as the header's `transactionId` (as RocketMQ does).
    uniq: Option<std::borrow::Cow<'r, str>>,
}

/// Decodes and checks a send request and builds the messages to store (no await).
fn prepare<'r>(
    b: &Shared,
    caller: &Caller<'_>,
    req: &'r RemotingCommand,
) -> Result<Prepared<'r>, Reject> {
    // Borrowed from the request (its map, or the binary area the connection kept): no
    // `String` per header field.
    let h = SendHeaderRef::of_request(req)?;
    refuse_system_topic(b, h.topic)?;
    let is_batch = req.code == rc::SEND_BATCH_MESSAGE || h.batch == Some(true);
    let body = req.body.clone().unwrap_or_default();
    if body.len() > b.config.max_message_bytes && !is_batch {
        return Err(Reject::new(
            resp::MESSAGE_ILLEGAL,
            format!(
                "message body of {} bytes exceeds the limit of {} bytes",
                body.len(),
                b.config.max_message_bytes
            ),
        ));
    }

    let topic_config = ensure_topic_for_send(b, &h)?;
    let mut topic = h.topic.to_owned();
    let mut queue_id = h.queue_id;
    let queues = topic_config
        .write_queue_nums
        .max(topic_config.read_queue_nums);
    if queue_id >= queues {
        return Err(Reject::new(
            resp::INVALID_PARAMETER,
            format!("request queueId[{queue_id}] is illegal, topic {topic} has {queues} queues"),
        ));
    }
    if queue_id < 0 {
        queue_id = (rand::random::<u32>() % topic_config.write_queue_nums.max(1) as u32) as i32;
    }

    let raw_props = h.properties.unwrap_or("");
    if !is_batch {
        check_message_type(h.topic, topic_config.message_type, raw_props)?;
    }
    // Decoded into a map only when something has to change in them (retry, delay, batch).
    // (A cluster name that cannot be appended verbatim takes the map as well.)
    let plain_found = if !is_batch && !is_retry_topic(&topic) && b.cluster_property.is_some() {
        plain_properties_ok(raw_props)
    } else {
        None
    };
    let mut props = if plain_found.is_some() {
        Properties::default()
    } else {
        decode_properties(raw_props)
    };
    let reconsume_times = h.reconsume_times.unwrap_or(0);
    // Retry topic: too many attempts (or a group consuming orderly) divert to the DLQ.
    if is_retry_topic(&topic) {
        if is_batch {
            return Err(Reject::new(
                resp::MESSAGE_ILLEGAL,
                "batch sends to retry topics are not supported",
            ));
        }
        let group = group_of_retry_topic(&topic).unwrap_or_default().to_string();
        let group_config = b.sub_groups.get(&group).ok_or_else(|| {
            Reject::new(
                resp::SUBSCRIPTION_GROUP_NOT_EXIST,
                format!("subscription group not exist, {group}"),
            )
        })?;
        let max = match h.max_reconsume_times {
            Some(m) if req.version >= V3_4_9 => m,
            _ => group_config.retry_max_times,
        };
        let orderly_group = b
            .groups
            .read(|g, now| g.locks().group_has_live_locks(&group, now));
        if reconsume_times > max || orderly_group {
            let dlq = dlq_topic(&group);
            b.topics
                .ensure(&dlq, 1, perm::PERM_READ_WRITE)
                .map_err(Reject::system)?;
            props.insert(property::DELAY.into(), "-1".into());
            topic = dlq;
            queue_id = 0;
        }
    }

    let born_host = caller.peer;
    let mut inner = MessageExtBrokerInner {
        topic,
        queue_id,
        flag: h.flag,
        sys_flag: h.sys_flag,
        born_timestamp: h.born_timestamp,
        born_host,
        reconsume_times,
        prepared_transaction_offset: 0,
        body: body.clone(),
        properties: String::new(),
        known: None,
    };

    let msgs = if is_batch {
        let items = decode_batch_raw(&body)
            .map_err(|e| Reject::new(resp::MESSAGE_ILLEGAL, format!("bad batch body: {e}")))?;
        if items.is_empty() {
            return Err(Reject::new(resp::MESSAGE_ILLEGAL, "empty batch"));
        }
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            if item.body.len() > b.config.max_message_bytes {
                return Err(Reject::new(
                    resp::MESSAGE_ILLEGAL,
                    format!(
                        "a batch item of {} bytes exceeds the limit of {} bytes",
                        item.body.len(),
                        b.config.max_message_bytes
                    ),
                ));
            }
            let bad = |e: shoal_proto::ProtoError| {
                Reject::new(resp::MESSAGE_ILLEGAL, format!("bad batch body: {e}"))
            };
            let raw = std::str::from_utf8(&item.properties)
                .map_err(|_| bad(shoal_proto::ProtoError::Utf8("message properties")))?;
            check_message_type(&inner.topic, topic_config.message_type, raw)?;
            // As a plain send: stored as they came plus CLUSTER when decoding and encoding
            // would give the same text, else through a map.
            let plain = plain_properties_ok(raw).and_then(|found| {
                Some((
                    with_cluster(raw, b.cluster_property.as_deref())?,
                    found.known,
                ))
            });
            let (stored, known) = match plain {
                Some((stored, known)) => (stored, Some(known)),
                None => {
                    let mut item_props = decode_properties(raw);
                    item_props.insert(property::CLUSTER.into(), b.config.cluster_name.clone());
                    let stored = encode_properties(&item_props)
                        .map_err(|e| Reject::new(resp::MESSAGE_ILLEGAL, e.to_string()))?;
                    (stored, None)
                }
            };
            out.push(MessageExtBrokerInner {
                flag: item.flag,
                body: item.body,
                properties: stored,
                known,
                ..inner.clone()
            });
        }
        out
    } else if let Some((stored, found)) = plain_found.and_then(|found| {
        Some((
            with_cluster(raw_props, b.cluster_property.as_deref())?,
            found,
        ))
    }) {
        // The common case: the client's properties are stored as they came, plus CLUSTER
        // (and the store is told where its properties are: they did not move).
        inner.properties = stored;
        inner.known = Some(found.known);
        vec![inner]
    } else {
        props.insert(property::CLUSTER.into(), b.config.cluster_name.clone());
        if crate::transaction::half::is_prepared(&props, reconsume_times) {
            if b.config.reject_transaction_message {
                return Err(Reject::new(
                    resp::NO_PERMISSION,
                    format!(
                        "the broker[{}] sending transaction message is forbidden",
                        b.config.announce_addr()
                    ),
                ));
            }
            crate::transaction::half::ensure_topic(b, crate::transaction::HALF_TOPIC)?;
            crate::transaction::half::to_half(&mut inner, &mut props);
            b.transactions
                .counters
                .half_stored
                .fetch_add(1, Ordering::Relaxed);
        } else {
            apply_delay(b, &mut inner, &mut props);
        }
        inner.properties = encode_properties(&props)
            .map_err(|e| Reject::new(resp::MESSAGE_ILLEGAL, e.to_string()))?;
        vec![inner]
    };
    let uniq = if let Some(found) = plain_found {
        found.uniq.map(std::borrow::Cow::Borrowed)
    } else if props.is_empty() {
        property::find_property(raw_props, property::UNIQ_KEY).map(std::borrow::Cow::Borrowed)
    } else {
        props
            .get(property::UNIQ_KEY)
            .map(|u| std::borrow::Cow::Owned(u.clone()))
    };
    Ok(Prepared {
        msgs,
        queue_id,
        uniq,
    })
}

/// The answer to a stored send: SendMessageResponseHeader's fields.
fn answer(
    serialize_type: SerializeType,
    queue_id: i32,
    uniq: Option<&str>,
    put_result: PutMessageResult,
) -> Handled {
    let code = flush_code(put_result.flush)?;
    let stored = put_result.messages;
    let queue_offset = stored
        .first()
        .ok_or_else(|| Reject::system("the store stored nothing"))?
        .queue_offset as i64;
    // The offset message ids, comma-separated, written where they go (no `String` each).
    let msg_ids = |out: &mut String| {
        for (i, m) in stored.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            m.push_offset_msg_id(out);
        }
    };
    let remark = (code == resp::FLUSH_DISK_TIMEOUT).then(|| "flush disk timeout".to_string());
    let mut answer = RemotingCommand::response(code, remark);
    // SendMessageResponseHeader's entries, written without a `String` per field; the answer
    // to a JSON request (it goes back as JSON) as its JSON text straight away, with no map.
    let (region, trace) = (Some(DEFAULT_REGION), Some(true));
    if serialize_type == SerializeType::Json {
        let json = send_response_json(msg_ids, queue_id, queue_offset, uniq, region, trace);
        answer.ext_fields_raw = Some(RawExtFields::Json(json));
    } else {
        let msg_ids = |out: &mut Vec<u8>| {
            for (i, m) in stored.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                m.push_offset_msg_id_bytes(out);
            }
        };
        let area = send_response_binary(msg_ids, queue_id, queue_offset, uniq, region, trace)
            .map_err(|e| Reject::system(format!("cannot write the answer: {e}")))?;
        answer.ext_fields_raw = Some(RawExtFields::Binary(area));
    }
    Ok(Some(answer))
}

/// What [`plain_properties_ok`] found in properties it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlainProperties<'a> {
    /// UNIQ_KEY's value.
    uniq: Option<&'a str>,
    /// Where the properties the store reads are (they stay where they are when CLUSTER is
    /// appended), so that the store does not look for them again.
    known: KnownProperties,
}

/// `Some` (with UNIQ_KEY's value and where the store's properties are) when `raw` is exactly
/// what decoding and re-encoding it would give (every pair well formed, no key twice) and
/// holds none of DELAY, the timer keys, CLUSTER and TRAN_MSG (the keys the broker acts on:
/// delay levels and timed messages, its own cluster, half messages): then the stored properties are `raw` plus CLUSTER, with no
/// map built.
fn plain_properties_ok(raw: &str) -> Option<PlainProperties<'_>> {
    // One pass over the bytes: every pair is a non-empty key up to its 0x01, then a non-empty
    // value up to its 0x02 (a separator anywhere else, or a last pair without its 0x02, is
    // something decoding would change).
    let bytes = raw.as_bytes();
    if bytes.len() > u32::MAX as usize {
        return None;
    }
    let mut seen: [&str; 24] = [""; 24];
    let mut n = 0;
    let mut found = PlainProperties {
        uniq: None,
        known: KnownProperties::default(),
    };
    let mut pos = 0;
    while pos < bytes.len() {
        let key_len = property::find_separator(&bytes[pos..])?;
        let value_at = pos + key_len + 1;
        if key_len == 0 || bytes[value_at - 1] != 1 {
            return None;
        }
        let value_len = property::find_separator(&bytes[value_at..])?;
        let end = value_at + value_len;
        if value_len == 0 || bytes[end] != 2 {
            return None;
        }
        // Separators are ASCII: these are character boundaries.
        let (k, v) = (&raw[pos..value_at - 1], &raw[value_at..end]);
        if n == seen.len() || seen[..n].contains(&k) {
            return None;
        }
        seen[n] = k;
        n += 1;
        // Checked above: the string's length fits a u32.
        let at = Some((value_at as u32, end as u32));
        match k {
            property::DELAY
            | property::TIMER_DELIVER_MS
            | property::TIMER_DELAY_MS
            | property::TIMER_DELAY_SEC
            | property::CLUSTER
            | property::TRAN_MSG => return None,
            property::UNIQ_KEY => {
                found.uniq = Some(v);
                found.known.uniq = at;
            }
            property::TAGS => found.known.tags = at,
            property::KEYS => found.known.keys = at,
            property::WAIT => found.known.wait = at,
            _ => {}
        }
        pos = end + 1;
    }
    Some(found)
}

/// The CLUSTER pair a plain send's stored properties end with (see
/// [`Shared::cluster_property`](crate::broker::Shared::cluster_property)); `None`
/// when the cluster name holds a separator and cannot be stored verbatim.
pub(crate) fn cluster_property(cluster: &str) -> Option<String> {
    if cluster.contains(['\u{1}', '\u{2}']) {
        return None;
    }
    Some(format!("{}\u{1}{cluster}\u{2}", property::CLUSTER))
}

/// The stored properties of a plain send: `raw` (checked by [`plain_properties_ok`]) plus
/// `cluster` (from [`cluster_property`]); `None` when there is no such pair.
fn with_cluster(raw: &str, cluster: Option<&str>) -> Option<String> {
    let cluster = cluster?;
    let mut out = String::with_capacity(raw.len() + cluster.len());
    out.push_str(raw);
    out.push_str(cluster);
    Some(out)
}

/// What a send needs of its topic's config (copied out of the table, which keeps the rest).
#[derive(Debug, Clone, Copy)]
struct SendTopic {
    write_queue_nums: i32,
    read_queue_nums: i32,
    perm: i32,
    /// The topic's message type: a send of another type is refused (UNSPECIFIED and MIXED
    /// take every type).
    message_type: TopicMessageType,
}

impl SendTopic {
    fn of(c: &shoal_proto::body::TopicConfig) -> Self {
        Self {
            write_queue_nums: c.write_queue_nums,
            read_queue_nums: c.read_queue_nums,
            perm: c.perm,
            message_type: c.message_type(),
        }
    }
}

/// Refuses a message whose type (from its properties, as RocketMQ decides it) the topic's
/// type does not take.
fn check_message_type(topic: &str, topic_type: TopicMessageType, raw: &str) -> Result<(), Reject> {
    if matches!(
        topic_type,
        TopicMessageType::Unspecified | TopicMessageType::Mixed
    ) {
        return Ok(());
    }
    let props = decode_properties(raw);
    let message_type = TopicMessageType::of_message(|k| props.get(k).map(String::as_str));
    if topic_type.accepts(message_type) {
        return Ok(());
    }
    Err(Reject::new(
        resp::MESSAGE_ILLEGAL,
        format!(
            "topic {topic} takes {topic_type} messages, not {message_type} (RocketMQ's MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)"
        ),
    ))
}

/// Finds the topic of a send, creating it from its template when allowed (spec 7.6).
fn ensure_topic_for_send(b: &Shared, h: &SendHeaderRef<'_>) -> Result<SendTopic, Reject> {
    crate::topic::validate_topic_name(h.topic)
        .map_err(|e| Reject::new(resp::INVALID_PARAMETER, e.to_string()))?;
    let config = match b.topics.read(h.topic, |c| c.map(SendTopic::of)) {
        Some(c) => c,
        None => {
            let created = if is_retry_topic(h.topic) {
                // Clients may send to %RETRY%<group> before any heartbeat created it.
                let group = group_of_retry_topic(h.topic).unwrap_or_default();
                match b.sub_groups.get(group).map(|g| g.retry_queue_nums) {
                    Some(q) if q > 0 => Some(
                        b.topics
                            .ensure(h.topic, q, perm::PERM_READ_WRITE)
                            .map_err(Reject::system)?,
                    ),
                    _ => None,
                }
            } else if b.config.auto_create_topic {
                b.topics
                    .ensure_from_template(h.topic, h.default_topic, h.default_topic_queue_nums)
                    .map_err(Reject::system)?
            } else {
                None
            };
            match created {
                Some(c) => {
                    if c.created {
                        tracing::info!(topic = %h.topic, queues = c.config.write_queue_nums, "topic auto-created on first send");
                    }
                    SendTopic::of(&c.config)
                }
                None => {
                    return Err(Reject::new(
                        resp::TOPIC_NOT_EXIST,
                        format!("topic[{}] not exist, apply first please!", h.topic),
                    ))
                }
            }
        }
    };
    if !perm::is_writeable(config.perm) {
        return Err(Reject::new(
            resp::NO_PERMISSION,
            format!("the topic[{}] sending message is forbidden", h.topic),
        ));
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What [`plain_properties_ok`] must answer, from its definition: `raw` is what decoding
    /// and re-encoding it gives and holds none of the keys the broker acts on (and at most 24
    /// pairs, past which the slow path is taken).
    fn plain_properties_ok_reference(raw: &str) -> Option<Option<&str>> {
        let props = decode_properties(raw);
        let round_trip = encode_properties(&props).ok()? == raw;
        let acted_on = [
            property::DELAY,
            property::TIMER_DELIVER_MS,
            property::TIMER_DELAY_MS,
            property::TIMER_DELAY_SEC,
            property::CLUSTER,
            property::TRAN_MSG,
        ]
        .iter()
        .any(|k| props.contains_key(*k));
        if !round_trip || acted_on || props.len() > 24 {
            return None;
        }
        Some(
            shoal_proto::message::property::iter_properties(raw)
                .find(|(k, _)| *k == property::UNIQ_KEY)
                .map(|(_, v)| v),
        )
    }

    /// UNIQ_KEY's value as [`plain_properties_ok`] finds it, when it takes `raw`.
    fn uniq_of(raw: &str) -> Option<Option<&str>> {
        plain_properties_ok(raw).map(|found| found.uniq)
    }

    #[test]
    fn a_missing_last_separator_is_not_made_up_by_an_empty_pair() {
        // The iterator-based check this replaced counted the bytes of the pairs it read: an
        // empty pair (two separators in a row) made up for a missing last separator, and the
        // CLUSTER property appended to such properties ran into the last value.
        assert_eq!(plain_properties_ok("a\u{1}a\u{2}\u{2}b\u{1}a"), None);
        assert_eq!(uniq_of("a\u{1}a\u{2}b\u{1}a\u{2}"), Some(None));
    }

    proptest! {
        /// The byte pass agrees with its definition on properties made of separators, the keys
        /// the broker acts on, and short words, also past 24 pairs.
        #[test]
        fn the_byte_pass_agrees_with_the_reference(
            parts in proptest::collection::vec(
                prop_oneof![
                    6 => "[a-c]{0,2}",
                    3 => Just("\u{1}".to_string()),
                    3 => Just("\u{2}".to_string()),
                    1 => prop::sample::select(vec!["DELAY", "CLUSTER", "TRAN_MSG", "UNIQ_KEY", "é"])
                        .prop_map(String::from),
                ],
                0..120,
            ),
        ) {
            let raw: String = parts.concat();
            prop_assert_eq!(uniq_of(&raw), plain_properties_ok_reference(&raw));
        }

        /// Well-formed properties (distinct keys) are taken, with their UNIQ_KEY and where
        /// the values of the properties the store reads are.
        #[test]
        fn well_formed_properties_are_taken(
            pairs in proptest::collection::btree_map(
                prop_oneof![
                    3 => "[A-Z_]{1,8}",
                    1 => prop::sample::select(vec!["TAGS", "WAIT", "KEYS", "UNIQ_KEY", "XTAGS"])
                        .prop_map(String::from),
                ],
                "[ -~]{1,12}",
                0..30,
            ),
        ) {
            let raw: String = pairs.iter().map(|(k, v)| format!("{k}\u{1}{v}\u{2}")).collect();
            prop_assert_eq!(uniq_of(&raw), plain_properties_ok_reference(&raw));
            if let Some(found) = plain_properties_ok(&raw) {
                let k = found.known;
                for (at, key) in [
                    (k.tags, property::TAGS),
                    (k.wait, property::WAIT),
                    (k.keys, property::KEYS),
                    (k.uniq, property::UNIQ_KEY),
                ] {
                    prop_assert_eq!(
                        at.map(|(s, e)| &raw[s as usize..e as usize]),
                        property::find_property(&raw, key),
                        "{}", key
                    );
                }
            }
        }
    }

    #[test]
    fn plain_properties_match_decode_and_encode() {
        for raw in [
            "",
            "TAGS\u{1}a\u{2}UNIQ_KEY\u{1}U1\u{2}WAIT\u{1}true\u{2}",
            "KEYS\u{1}k1 k2\u{2}",
        ] {
            let mut props = decode_properties(raw);
            props.insert(property::CLUSTER.into(), "C".into());
            assert_eq!(
                plain_properties_ok(raw)
                    .and_then(|_| with_cluster(raw, cluster_property("C").as_deref()))
                    .as_deref(),
                Some(encode_properties(&props).unwrap().as_str()),
                "{raw:?}"
            );
        }
        // A cluster name holding a separator cannot be appended verbatim.
        assert_eq!(cluster_property("a\u{1}b"), None);
        assert_eq!(with_cluster("TAGS\u{1}a\u{2}", None), None);
        // The answer's transaction id comes from the same pass.
        assert_eq!(
            uniq_of("TAGS\u{1}a\u{2}UNIQ_KEY\u{1}U1\u{2}"),
            Some(Some("U1"))
        );
        assert_eq!(uniq_of("KEYS\u{1}k\u{2}"), Some(None));
        // Anything that decoding would change takes the slow path.
        for raw in [
            "TAGS\u{1}a\u{2}TAGS\u{1}b\u{2}",
            "DELAY\u{1}3\u{2}",
            "CLUSTER\u{1}x\u{2}",
            "TRAN_MSG\u{1}true\u{2}PGROUP\u{1}g\u{2}",
            "TAGS\u{1}a",
            "junk\u{2}TAGS\u{1}a\u{2}",
            "TAGS\u{1}a\u{1}b\u{2}",
        ] {
            assert_eq!(
                plain_properties_ok(raw)
                    .and_then(|_| with_cluster(raw, cluster_property("C").as_deref())),
                None,
                "{raw:?}"
            );
        }
    }
}

#[cfg(test)]
mod future_size {
    use super::*;
    use std::sync::Arc;

    /// The size of the future an async fn over (broker, context, request) returns.
    fn future_size<'a, F, Fut>(_: F) -> usize
    where
        F: FnOnce(&'a Arc<Shared>, &'a Caller<'a>, &'a RemotingCommand) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// The send's future is allocated and moved once per request: what it keeps across its
    /// awaits (the put, the answer's few fields) is all it should hold (it was 776 bytes when
    /// the decoded header and the property map lived across them).
    #[test]
    fn a_send_keeps_little_across_its_awaits() {
        let send = future_size(send_message);
        assert!(send <= 256, "send future grew to {send} bytes");
    }
}
