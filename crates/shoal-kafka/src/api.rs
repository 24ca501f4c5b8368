//! Request routing: the supported API versions, header decoding, response framing.

use crate::request::{frame, ConnInfo, Reply, RequestCtx};
use crate::state::State;
use bytes::Bytes;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use kafka_protocol::ResponseError;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The APIs and versions this listener implements (what ApiVersions reports).
pub(crate) const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 11),
    (ApiKey::Fetch, 4, 16),
    (ApiKey::ListOffsets, 1, 8),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetCommit, 2, 9),
    (ApiKey::OffsetFetch, 1, 9),
    (ApiKey::FindCoordinator, 0, 5),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
];

fn supported(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, lo, hi)| (*lo, *hi))
}

fn api_versions_body(error: i16) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = error;
    r.api_keys = SUPPORTED
        .iter()
        .map(|(k, lo, hi)| {
            let mut v = ApiVersion::default();
            v.api_key = *k as i16;
            v.min_version = *lo;
            v.max_version = *hi;
            v
        })
        .collect();
    r
}

/// Decodes a request body; declared lengths are checked first ([`crate::guard`]) so that a
/// malformed frame costs no more memory than its own bytes.
fn decode<R: Decodable>(
    state: &State,
    key: ApiKey,
    version: i16,
    buf: &mut Bytes,
) -> Result<R, Reply> {
    let malformed = |what: String| {
        state
            .counters
            .requests_malformed
            .fetch_add(1, Ordering::Relaxed);
        Reply::Close(format!("malformed {key:?} v{version} request: {what}"))
    };
    crate::guard::check_request(key, version, buf).map_err(|e| malformed(e.to_string()))?;
    R::decode(buf, version).map_err(|e| malformed(e.to_string()))
}

/// Whether the request in `frame` (its header first) may have its answer held: the group
/// heartbeats (classic Heartbeat, ConsumerGroupHeartbeat).
pub(crate) fn holdable(frame: &[u8]) -> bool {
    let key = frame.get(..2).map(|k| i16::from_be_bytes([k[0], k[1]]));
    key == Some(ApiKey::Heartbeat as i16) || key == Some(ApiKey::ConsumerGroupHeartbeat as i16)
}

/// Reads one request frame and answers it. `next_request` (for [`holdable`] requests) is
/// notified when the connection's next request arrives or the connection closes: a held
/// answer must then go out.
pub(crate) async fn dispatch(
    state: &Arc<State>,
    mut buf: Bytes,
    conn: &ConnInfo,
    next_request: Option<Arc<tokio::sync::Notify>>,
) -> Reply {
    let api_key = i16::from_be_bytes([buf[0], buf[1]]);
    let version = i16::from_be_bytes([buf[2], buf[3]]);
    let correlation_id = i32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
    let Ok(key) = ApiKey::try_from(api_key) else {
        // No response layout is known for an unknown key: Kafka closes too.
        state
            .counters
            .requests_unsupported
            .fetch_add(1, Ordering::Relaxed);
        return Reply::Close(format!("unknown API key {api_key} (v{version})"));
    };
    let unsupported = match supported(key) {
        None => Some(format!(
            "{key:?} (API key {api_key}) is not supported (see ApiVersions)"
        )),
        Some((lo, hi)) if version < lo || version > hi => Some(format!(
            "{key:?} v{version} is not supported (versions {lo}..={hi})"
        )),
        Some(_) => None,
    };
    if let Some(why) = unsupported {
        if key == ApiKey::ApiVersions {
            // KIP-511: answer a version we do not know with v0 and the versions we have.
            let body = api_versions_body(ResponseError::UnsupportedVersion.code());
            return frame(key, 0, correlation_id, &body);
        }
        state
            .counters
            .requests_unsupported
            .fetch_add(1, Ordering::Relaxed);
        let reply = crate::unsupported::answer(key, version, correlation_id, &why);
        if let Reply::Frame(_) = reply {
            // The header is parsed for the log line only (the body is not read).
            let client = RequestHeader::decode(&mut buf, key.request_header_version(version))
                .ok()
                .and_then(|h| h.client_id)
                .unwrap_or_default();
            tracing::info!(client_id = %client, peer = %conn.peer, "answered UNSUPPORTED_VERSION: {why}");
        }
        return reply;
    }
    let header = match RequestHeader::decode(&mut buf, key.request_header_version(version)) {
        Ok(h) => h,
        Err(e) => return Reply::Close(format!("malformed {key:?} request header: {e}")),
    };
    let client_id = header
        .client_id
        .clone()
        .unwrap_or_else(|| StrBytes::from_static_str(""));
    if key == ApiKey::ApiVersions && version >= 3 {
        // librdkafka looks answers up by correlation id: a held heartbeat answer need not
        // hold back the connection's later answers (see `server::serve`).
        if let Ok(req) = ApiVersionsRequest::decode(&mut buf.clone(), version) {
            if is_librdkafka(&req.client_software_name, &req.client_software_version) {
                conn.answers_by_correlation_id
                    .store(true, Ordering::Relaxed);
            }
        }
    }
    let ctx = RequestCtx {
        key,
        version,
        correlation_id,
        client_id,
        peer: conn.peer,
        next_request,
    };
    match route(state, &ctx, buf).await {
        Ok(r) | Err(r) => r,
    }
}

/// Whether ApiVersions' client software (KIP-511) is librdkafka: itself (`librdkafka`), or a
/// binding that names its librdkafka in its version (confluent-kafka-python, -go, -dotnet:
/// `2.16.1-rdkafka-2.16.0`).
pub(crate) fn is_librdkafka(name: &str, version: &str) -> bool {
    name == "librdkafka" || version.contains("-rdkafka-")
}

async fn route(state: &Arc<State>, ctx: &RequestCtx, mut buf: Bytes) -> Result<Reply, Reply> {
    let (key, v) = (ctx.key, ctx.version);
    let b = &mut buf;
    // `answer!(handler)`: decode the request, call `handler(state, ctx, request)` (`no_ctx`:
    // `handler(state, request)`; `await`: an async handler) and frame its response.
    macro_rules! answer {
        ($f:path) => {
            ctx.reply(&$f(state, ctx, decode(state, key, v, b)?))
        };
        ($f:path, no_ctx) => {
            ctx.reply(&$f(state, decode(state, key, v, b)?))
        };
        ($f:path, await) => {
            ctx.reply(&$f(state, ctx, decode(state, key, v, b)?).await)
        };
    }
    Ok(match key {
        ApiKey::ApiVersions => {
            let _req: ApiVersionsRequest = decode(state, key, v, b)?;
            ctx.reply(&api_versions_body(0))
        }
        ApiKey::SaslHandshake => {
            let _req: SaslHandshakeRequest = decode(state, key, v, b)?;
            let mut r = SaslHandshakeResponse::default();
            r.error_code = ResponseError::UnsupportedSaslMechanism.code();
            ctx.reply(&r)
        }
        ApiKey::Metadata => answer!(crate::metadata::metadata, await),
        ApiKey::CreateTopics => answer!(crate::metadata::create_topics_replicated, await),
        ApiKey::DeleteTopics => answer!(crate::metadata::delete_topics_replicated, await),
        ApiKey::CreatePartitions => {
            let req = decode(state, key, v, b)?;
            ctx.reply(&crate::metadata::create_partitions_replicated(state, req).await)
        }
        ApiKey::DescribeConfigs => answer!(crate::metadata::describe_configs),
        ApiKey::Produce => {
            match crate::produce::produce(state, ctx, decode(state, key, v, b)?).await {
                Some(r) => ctx.reply(&r),
                None => Reply::Nothing,
            }
        }
        ApiKey::InitProducerId => answer!(crate::produce::init_producer_id, no_ctx),
        ApiKey::Fetch => answer!(crate::fetch::fetch, await),
        ApiKey::ListOffsets => answer!(crate::offsets::list_offsets, await),
        ApiKey::OffsetForLeaderEpoch => answer!(crate::offsets::offset_for_leader_epoch, no_ctx),
        ApiKey::OffsetCommit => answer!(crate::offsets::offset_commit, await),
        ApiKey::OffsetFetch => answer!(crate::offsets::offset_fetch, await),
        ApiKey::FindCoordinator => answer!(crate::groups::find_coordinator, await),
        ApiKey::JoinGroup => answer!(crate::groups::join_group, await),
        ApiKey::SyncGroup => answer!(crate::groups::sync_group, await),
        ApiKey::Heartbeat => answer!(crate::groups::heartbeat, await),
        ApiKey::LeaveGroup => answer!(crate::groups::leave_group, await),
        ApiKey::DescribeGroups => answer!(crate::groups::describe_groups),
        ApiKey::ListGroups => answer!(crate::groups::list_groups, no_ctx),
        ApiKey::DeleteGroups => answer!(crate::groups::delete_groups, no_ctx),
        ApiKey::ConsumerGroupHeartbeat => answer!(crate::consumer_group::heartbeat, await),
        ApiKey::ConsumerGroupDescribe => answer!(crate::consumer_group::describe, no_ctx),
        // `dispatch` answers every API outside SUPPORTED before routing.
        other => crate::unsupported::answer(
            key,
            v,
            ctx.correlation_id,
            &format!("{other:?} has no handler"),
        ),
    })
}
