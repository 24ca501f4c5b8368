//! The messages of the transaction machinery: half messages, their copies written back by the
//! checker, the committed message, op messages and discarded messages.

use super::{HALF_TOPIC, OP_TOPIC, REMOVE_TAG};
use crate::clock::wall_ms;
use crate::reply::Reject;
use crate::shared::Shared;
use shoal_proto::constants::perm;
use shoal_proto::message::{encode_properties, property, sys_flag, MessageExt, Properties};
use shoal_store::MessageExtBrokerInner;

/// Whether a send's properties make it a half message (`TRAN_MSG=true`), leaving out the
/// retry sends of clients older than 4.6.1 that kept the property (reconsumed and delayed).
pub(crate) fn is_prepared(props: &Properties, reconsume_times: i32) -> bool {
    let tran = props
        .get(property::TRAN_MSG)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let delayed = props
        .get(property::DELAY)
        .and_then(|d| d.trim().parse::<i32>().ok())
        .is_some_and(|d| d > 0);
    tran && !(reconsume_times > 0 && delayed)
}

/// Turns a send into a half message: real topic and queue saved in `REAL_TOPIC` / `REAL_QID`,
/// the transaction id (`__transactionId__`) set from `UNIQ_KEY`, the transaction bits of the
/// sysFlag cleared, stored in the half topic's queue 0.
pub(crate) fn to_half(msg: &mut MessageExtBrokerInner, props: &mut Properties) {
    if let Some(uniq) = props.get(property::UNIQ_KEY).cloned() {
        if !uniq.is_empty() {
            props.insert(property::TRANSACTION_ID.into(), uniq);
        }
    }
    props.insert(property::REAL_TOPIC.into(), msg.topic.clone());
    props.insert(property::REAL_QID.into(), msg.queue_id.to_string());
    msg.sys_flag = sys_flag::reset_transaction_value(msg.sys_flag, sys_flag::TRANSACTION_NOT_TYPE);
    msg.topic = HALF_TOPIC.into();
    msg.queue_id = 0;
}

fn inner_from(
    m: &MessageExt,
    topic: String,
    queue_id: i32,
    props: &Properties,
) -> Result<MessageExtBrokerInner, Reject> {
    Ok(MessageExtBrokerInner {
        topic,
        queue_id,
        flag: m.flag,
        sys_flag: m.sys_flag,
        born_timestamp: m.born_timestamp,
        born_host: m.born_host,
        reconsume_times: m.reconsume_times,
        prepared_transaction_offset: 0,
        body: m.body.clone(),
        properties: encode_properties(props)?,
        known: None,
    })
}

/// A copy of a half message for the end of the half queue: with `TRANSACTION_CHECK_TIMES`
/// set to `check_times` (when checking) and `TRAN_PREPARED_QUEUE_OFFSET` pointing at the
/// original (when renewing within the producer's immunity time).
pub(crate) fn renewed(
    m: &MessageExt,
    check_times: Option<i32>,
    keep_origin: bool,
) -> Result<MessageExtBrokerInner, Reject> {
    let mut props = m.properties.clone();
    if let Some(t) = check_times {
        props.insert(property::TRANSACTION_CHECK_TIMES.into(), t.to_string());
    }
    if keep_origin && !props.contains_key(property::TRAN_PREPARED_QUEUE_OFFSET) {
        props.insert(
            property::TRAN_PREPARED_QUEUE_OFFSET.into(),
            m.queue_offset.to_string(),
        );
    }
    inner_from(m, HALF_TOPIC.into(), 0, &props)
}

/// The real topic and queue of a half message.
pub(crate) fn real_destination(m: &MessageExt) -> Result<(String, i32), Reject> {
    let topic = m
        .property(property::REAL_TOPIC)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Reject::system("the half message has no REAL_TOPIC"))?;
    let qid = m
        .property(property::REAL_QID)
        .and_then(|q| q.trim().parse::<i32>().ok())
        .ok_or_else(|| Reject::system("the half message has no REAL_QID"))?;
    Ok((topic.to_string(), qid))
}

/// The committed message: stored in its real topic and queue, without the transaction
/// properties, sysFlag marked committed, `preparedTransactionOffset` = the half message's
/// commit log offset. Returns it with its properties (for the delay rule).
pub(crate) fn committed(m: &MessageExt) -> Result<(MessageExtBrokerInner, Properties), Reject> {
    let (topic, queue_id) = real_destination(m)?;
    let mut props = m.properties.clone();
    for k in [
        property::REAL_TOPIC,
        property::REAL_QID,
        property::TRAN_MSG,
        property::TRANSACTION_CHECK_TIMES,
        property::TRAN_PREPARED_QUEUE_OFFSET,
    ] {
        props.shift_remove(k);
    }
    let mut inner = inner_from(m, topic, queue_id, &props)?;
    inner.sys_flag =
        sys_flag::reset_transaction_value(m.sys_flag, sys_flag::TRANSACTION_COMMIT_TYPE);
    inner.prepared_transaction_offset = m.commit_log_offset;
    Ok((inner, props))
}

/// A half message moved to the discard topic (queue 0), properties kept.
pub(crate) fn discarded(m: &MessageExt, topic: &str) -> Result<MessageExtBrokerInner, Reject> {
    inner_from(m, topic.to_string(), 0, &m.properties)
}

/// An op message recording a decision for the half message at `half_queue_offset` (body
/// `"<offset>,"`, tag `d`, as RocketMQ writes them), with the transaction id for rebuilding
/// the decision table on start.
pub(crate) fn op_message(
    b: &Shared,
    half_queue_offset: u64,
    transaction_id: Option<&str>,
    committed: bool,
) -> Result<MessageExtBrokerInner, Reject> {
    let mut props = Properties::default();
    props.insert(property::TAGS.into(), REMOVE_TAG.into());
    props.insert(property::WAIT.into(), "false".into());
    if let Some(id) = transaction_id {
        props.insert(property::TRANSACTION_ID.into(), id.to_string());
    }
    props.insert(
        OP_DECISION.into(),
        if committed { "commit" } else { "rollback" }.into(),
    );
    Ok(MessageExtBrokerInner {
        topic: OP_TOPIC.into(),
        queue_id: 0,
        flag: 0,
        sys_flag: 0,
        born_timestamp: wall_ms(),
        born_host: b.store_host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
        body: format!("{half_queue_offset},").into_bytes().into(),
        properties: encode_properties(&props)?,
        known: None,
    })
}

/// Property of Shoal's op messages naming the decision (`commit` or `rollback`).
pub(crate) const OP_DECISION: &str = "SHOAL_TRAN_DECISION";

/// Creates a system topic of the transaction machinery (one queue, read and write) if missing,
/// as RocketMQ does on first use; registration follows.
pub(crate) fn ensure_topic(b: &Shared, topic: &str) -> Result<(), Reject> {
    b.topics
        .ensure(topic, 1, perm::PERM_READ_WRITE)
        .map(|_| ())
        .map_err(Reject::system)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> Properties {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn prepared_sends() {
        assert!(is_prepared(&props(&[("TRAN_MSG", "true")]), 0));
        assert!(is_prepared(&props(&[("TRAN_MSG", "TRUE")]), 0));
        assert!(!is_prepared(&props(&[("TRAN_MSG", "false")]), 0));
        assert!(!is_prepared(&props(&[]), 0));
        // Old clients' retries kept TRAN_MSG: reconsumed and delayed is not a half message.
        assert!(!is_prepared(
            &props(&[("TRAN_MSG", "true"), ("DELAY", "3")]),
            1
        ));
        assert!(is_prepared(
            &props(&[("TRAN_MSG", "true"), ("DELAY", "3")]),
            0
        ));
    }

    #[test]
    fn half_messages_keep_their_destination() {
        let mut m = MessageExtBrokerInner {
            topic: "Orders".into(),
            queue_id: 3,
            flag: 0,
            sys_flag: sys_flag::TRANSACTION_PREPARED_TYPE,
            born_timestamp: 1,
            born_host: "127.0.0.1:1".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
            body: bytes::Bytes::from_static(b"x"),
            properties: String::new(),
            known: None,
        };
        let mut p = props(&[("TRAN_MSG", "true"), ("UNIQ_KEY", "ABC"), ("PGROUP", "PG")]);
        to_half(&mut m, &mut p);
        assert_eq!(m.topic, HALF_TOPIC);
        assert_eq!(m.queue_id, 0);
        assert_eq!(sys_flag::transaction_value(m.sys_flag), 0);
        assert_eq!(p["REAL_TOPIC"], "Orders");
        assert_eq!(p["REAL_QID"], "3");
        assert_eq!(p["__transactionId__"], "ABC");
    }
}
