//! ACL of the gRPC endpoint, as RocketMQ 5 checks its clients: the `authorization` header
//! `MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time, Signature=<hex>`
//! carries HMAC-SHA1 of the `x-mq-date-time` header's value under the account's secret key
//! (hex, as the clients write it; RocketMQ compares it as base64, and so does the broker's
//! ACL here after converting it). The call's resources then need the account's
//! permissions: PUB on the topic to send, SUB on the topic and the group to receive, ack,
//! change invisibility or dead-letter, PUB or SUB on a topic to ask its route.

use shoal_broker::BrokerApi;
use shoal_proto::acl::{perm, AccessRequest};
use std::net::IpAddr;
use tonic::metadata::MetadataMap;

/// The header with the signature.
pub const AUTHORIZATION: &str = "authorization";
/// The signed header.
pub const DATE_TIME: &str = "x-mq-date-time";
/// The client id header.
pub const CLIENT_ID: &str = "x-mq-client-id";

/// What a call needs: (topic or `%RETRY%<group>`, permission).
pub(crate) type Needs = Vec<(String, u8)>;

/// PUB on a topic.
pub(crate) fn publish(topic: &str) -> Needs {
    vec![(topic.to_string(), perm::PUB)]
}

/// SUB on a topic and a group.
pub(crate) fn subscribe(topic: &str, group: &str) -> Needs {
    let mut v = vec![(shoal_proto::constants::retry_topic(group), perm::SUB)];
    if !topic.is_empty() {
        v.push((topic.to_string(), perm::SUB));
    }
    v
}

/// PUB or SUB on a topic.
pub(crate) fn any(topic: &str) -> Needs {
    vec![(topic.to_string(), perm::ANY)]
}

/// Access key and signature of an `authorization` header.
pub fn parse_authorization(value: &str) -> Option<(String, String)> {
    let rest = value.trim().strip_prefix("MQv2-HMAC-SHA1")?.trim();
    let mut ak = None;
    let mut sig = None;
    for part in rest.split(',') {
        let (k, v) = part.trim().split_once('=')?;
        match k.trim() {
            "Credential" => ak = Some(v.trim().to_string()),
            "Signature" => sig = Some(v.trim().to_string()),
            _ => {}
        }
    }
    Some((ak?, sig?))
}

/// The hex signature as the base64 RocketMQ compares (`None` when it is not hex).
fn hex_to_base64(hex: &str) -> Option<String> {
    use base64::Engine;
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    Some(base64::engine::general_purpose::STANDARD.encode(bytes?))
}

/// The signature RocketMQ 5 clients send for `date_time` under `secret` (upper-case hex of
/// HMAC-SHA1), for tests and tools.
pub fn sign(secret: &str, date_time: &str) -> String {
    use hmac::Mac;
    // HMAC takes keys of any length: this never fails.
    let Ok(mut mac) = hmac::Hmac::<sha1::Sha1>::new_from_slice(secret.as_bytes()) else {
        return String::new();
    };
    mac.update(date_time.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect()
}

/// Checks a call against the broker's ACL (nothing to check without one).
pub(crate) fn check(
    api: &BrokerApi,
    meta: &MetadataMap,
    remote: IpAddr,
    code: i32,
    needs: Needs,
) -> Result<(), tonic::Status> {
    if !api.acl_enabled() {
        return Ok(());
    }
    let header = |k: &str| meta.get(k).and_then(|v| v.to_str().ok());
    let parsed = header(AUTHORIZATION).and_then(parse_authorization);
    let (access_key, signature) = match parsed {
        Some((ak, sig)) => (Some(ak), hex_to_base64(&sig)),
        None => (None, None),
    };
    let req = AccessRequest {
        code,
        remote,
        access_key,
        signature,
        content: header(DATE_TIME).unwrap_or("").as_bytes().to_vec(),
        resources: needs,
        parse_error: None,
    };
    api.acl_check(&req)
        .map_err(tonic::Status::permission_denied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorization_headers_as_the_clients_write_them() {
        let v = "MQv2-HMAC-SHA1 Credential=RocketMQ, SignedHeaders=x-mq-date-time, Signature=AB12";
        assert_eq!(
            parse_authorization(v),
            Some(("RocketMQ".to_string(), "AB12".to_string()))
        );
        assert_eq!(parse_authorization("Basic abc"), None);
        assert_eq!(
            parse_authorization("MQv2-HMAC-SHA1 Credential=ak"),
            None,
            "no signature"
        );
        // HMAC-SHA1("key", "The quick brown fox jumps over the lazy dog").
        assert_eq!(
            sign("key", "The quick brown fox jumps over the lazy dog"),
            "DE7C9B85B8B78AA6BC8A7A36F70A90701C9DB4D9"
        );
        assert_eq!(hex_to_base64("DE7C"), Some("3nw=".to_string()));
        assert_eq!(hex_to_base64("XY"), None);
    }
}
