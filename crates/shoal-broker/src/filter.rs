//! SQL92 subscriptions at the broker (RocketMQ's `enablePropertyFilter`): selectors compiled
//! once and kept in a bounded cache, CHECK_CLIENT_CONFIG, and the filter over the records a
//! read found (after the consume queue's tag check, as RocketMQ's `ExpressionMessageFilter`).
//!
//! With `enable_property_filter` off (RocketMQ's default; `shoal dev` turns it on), an SQL92
//! subscription is refused with SYSTEM_ERROR, as RocketMQ's broker does; a selector that does
//! not compile is refused with SUBSCRIPTION_PARSE_FAILED (23) and says why.

use crate::reply::{ok, Handled, Reject};
use crate::shared::Shared;
use shoal_filter::{RawProperties, Selector};
use shoal_proto::body::{CheckClientRequestBody, ExpressionType, SubscriptionData};
use shoal_proto::code::response_code as resp;
use shoal_proto::message::RecordView;
use shoal_proto::RemotingCommand;
use shoal_store::{GetMessageResult, GetMessageStatus};
use std::sync::Arc;

/// The selector of an SQL92 expression, checked as RocketMQ checks a subscription:
/// SYSTEM_ERROR when the broker's property filter is off, SUBSCRIPTION_PARSE_FAILED when it
/// does not compile.
pub(crate) fn compile_sql(b: &Shared, sql: &str) -> Result<Arc<Selector>, Reject> {
    if !b.config.enable_property_filter {
        return Err(Reject::new(
            resp::SYSTEM_ERROR,
            "The broker does not support consumer to filter message by SQL92 (enable_property_filter is off)",
        ));
    }
    b.selectors.get(sql).map_err(|e| {
        Reject::new(
            resp::SUBSCRIPTION_PARSE_FAILED,
            format!("parse the consumer's subscription[{sql}] failed: {e}"),
        )
    })
}

/// The selector of a subscription: `None` for TAG subscriptions.
pub(crate) fn compile(b: &Shared, sub: &SubscriptionData) -> Result<Option<Arc<Selector>>, Reject> {
    match sub.expression_type {
        ExpressionType::Tag => Ok(None),
        ExpressionType::Sql92 => compile_sql(b, &sub.sub_string).map(Some),
    }
}

/// The selector of an expression type and expression as a request names them (pull headers,
/// POP headers, gRPC filter expressions): `None` for TAG (or no type), an error for a type the
/// broker does not know.
pub(crate) fn compile_typed(
    b: &Shared,
    expr_type: Option<&str>,
    expr: &str,
) -> Result<Option<Arc<Selector>>, Reject> {
    match expr_type.filter(|t| !t.is_empty()) {
        None => Ok(None),
        Some(t) if t.eq_ignore_ascii_case("TAG") => Ok(None),
        Some(t) if t.eq_ignore_ascii_case("SQL92") => compile_sql(b, expr).map(Some),
        Some(t) => Err(Reject::new(
            resp::SYSTEM_ERROR,
            format!("the broker does not support consumer to filter message by {t}"),
        )),
    }
}

/// True when the stored record in `rec` matches `selector` (a record that does not parse does
/// not match).
pub(crate) fn record_matches(selector: &Selector, rec: &[u8]) -> bool {
    RecordView::parse(rec).is_ok_and(|v| selector.matches(&RawProperties(v.properties_str())))
}

/// Keeps the records of a read that match `selector`. What was scanned stays scanned
/// (`next_begin_offset` unchanged): a read whose records all fail answers NO_MATCHED_MESSAGE
/// and the consumer reads on from there, as with tags.
pub(crate) fn retain_matching(selector: &Selector, r: &mut GetMessageResult) {
    if r.message_count == 0 {
        return;
    }
    let mut out = bytes::BytesMut::with_capacity(r.messages.len());
    let mut offsets = Vec::with_capacity(r.queue_offsets.len());
    let mut at = 0usize;
    for &qo in &r.queue_offsets {
        let Some(len) = r
            .messages
            .get(at..at + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(|b| i32::from_be_bytes(b).max(0) as usize)
        else {
            break;
        };
        let rec = r.messages.get(at..at + len).unwrap_or(&[]);
        if record_matches(selector, rec) {
            out.extend_from_slice(rec);
            offsets.push(qo);
        }
        at += len.max(1);
    }
    r.message_count = offsets.len();
    r.queue_offsets = offsets;
    r.messages = out.freeze();
    if r.message_count == 0 && r.status == GetMessageStatus::Found {
        r.status = GetMessageStatus::NoMatchedMessage;
    }
}

/// CHECK_CLIENT_CONFIG (46): a consumer's start-up check of its subscription. TAG is always
/// served; SQL92 needs `enable_property_filter` and a selector that compiles.
pub(crate) fn check_client_config(b: &Shared, req: &RemotingCommand) -> Handled {
    if req.body.as_ref().is_none_or(|body| body.is_empty()) {
        return ok();
    }
    let body: CheckClientRequestBody = req.decode_json_body()?;
    if let Some(sub) = &body.subscription_data {
        compile(b, sub)?;
    }
    ok()
}
