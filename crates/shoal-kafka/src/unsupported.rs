//! Answers to requests for an API or version the listener does not implement.
//!
//! Apache Kafka's broker closes the connection on such a request (ApiVersions excepted, which
//! KIP-511 answers with v0). A closed connection tells a client nothing: the Java client and
//! librdkafka treat it as a network failure and retry until their timeouts. So where the answer
//! can say it, the listener answers instead: the request's API, at the request's version (the
//! one the client will decode), with UNSUPPORTED_VERSION (35) in the response's top-level error
//! code and, where the response has one, an error message naming what is missing. Clients
//! surface that as an `UnsupportedVersionException` (or librdkafka's
//! `ERR_UNSUPPORTED_VERSION`) right away, which is not retried.
//!
//! An answer is only sent when it cannot be read as success: the response type must have a
//! top-level error code at the request's version. Responses that carry errors only per
//! topic, partition, group or resource (Produce, ListOffsets, OffsetCommit, DescribeGroups,
//! CreateAcls, ...) would answer an empty list, which a client reads as "nothing to report"
//! and waits on (a producer's batches until its delivery timeout); for those, and for
//! versions the `kafka-protocol` crate cannot encode, the connection is closed with the reason
//! logged, as Kafka does. The request body is not decoded (its layout at an unknown version
//! is not known to the listener's length checks).

use crate::request::{sb, try_frame, Reply};
use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::ResponseError;

/// The answer to `key` at `version` (a version the `kafka-protocol` crate knows, or not),
/// which the listener does not serve: `why` says what is supported instead.
pub(crate) fn answer(key: ApiKey, version: i16, correlation_id: i32, why: &str) -> Reply {
    let known = key.valid_versions();
    if version < known.min || version > known.max {
        return Reply::Close(format!(
            "{why}; {key:?} v{version} is a version unknown to the codec (it knows \
             {}..={}), so no answer can be encoded",
            known.min, known.max
        ));
    }
    let message = format!("Shoal's Kafka listener: {why}");
    match error_frame(key, version, correlation_id, &message) {
        Some(frame) => Reply::Frame(frame),
        None => Reply::Close(format!(
            "{why}; the {key:?} v{version} response has no top-level error code to carry \
             UNSUPPORTED_VERSION"
        )),
    }
}

/// The response frame of `key` at `version` with UNSUPPORTED_VERSION in its top-level error
/// code (and `message` in its error message where that version has one), or `None` where
/// the response has no top-level error code at that version.
// (A plain, repetitive table: one arm per API, as kafka-protocol has no common trait for the
// error fields.)
fn error_frame(key: ApiKey, version: i16, correlation_id: i32, message: &str) -> Option<Bytes> {
    let code = ResponseError::UnsupportedVersion.code();
    // `top!(T, codes)`: a `T` with the error code set, for the versions `codes` in which the
    // response has a top-level error code; `top!(T, codes, messages)`: also the error message
    // in the versions `messages` that have one. (Versions from kafka-protocol's field
    // documentation; the version is already within the codec's range for the API. The
    // encoder does not refuse every field a version lacks, so the ranges are needed.)
    macro_rules! top {
        ($t:ty, $codes:expr) => {{
            if !$codes.contains(&version) {
                return None;
            }
            let mut r = <$t>::default();
            r.error_code = code;
            try_frame(key, version, correlation_id, &r).ok()
        }};
        ($t:ty, $codes:expr, $messages:expr) => {{
            if !$codes.contains(&version) {
                return None;
            }
            let mut r = <$t>::default();
            r.error_code = code;
            if $messages.contains(&version) {
                r.error_message = Some(sb(message));
            }
            try_frame(key, version, correlation_id, &r).ok()
        }};
    }
    match key {
        ApiKey::Fetch => top!(FetchResponse, 7..=18),
        ApiKey::Metadata => top!(MetadataResponse, 13..),
        ApiKey::OffsetFetch => top!(OffsetFetchResponse, 2..=7),
        ApiKey::FindCoordinator => top!(FindCoordinatorResponse, 0..=3, 1..=3),
        ApiKey::JoinGroup => top!(JoinGroupResponse, 0..),
        ApiKey::Heartbeat => top!(HeartbeatResponse, 0..),
        ApiKey::LeaveGroup => top!(LeaveGroupResponse, 0..),
        ApiKey::SyncGroup => top!(SyncGroupResponse, 0..),
        ApiKey::ListGroups => top!(ListGroupsResponse, 0..),
        ApiKey::SaslHandshake => top!(SaslHandshakeResponse, 0..),
        ApiKey::InitProducerId => top!(InitProducerIdResponse, 0..),
        ApiKey::AddPartitionsToTxn => top!(AddPartitionsToTxnResponse, 4..),
        ApiKey::AddOffsetsToTxn => top!(AddOffsetsToTxnResponse, 0..),
        ApiKey::EndTxn => top!(EndTxnResponse, 0..),
        ApiKey::DescribeAcls => top!(DescribeAclsResponse, 0.., 0..),
        ApiKey::DescribeLogDirs => top!(DescribeLogDirsResponse, 3..),
        ApiKey::SaslAuthenticate => top!(SaslAuthenticateResponse, 0.., 0..),
        ApiKey::CreateDelegationToken => top!(CreateDelegationTokenResponse, 0..),
        ApiKey::RenewDelegationToken => top!(RenewDelegationTokenResponse, 0..),
        ApiKey::ExpireDelegationToken => top!(ExpireDelegationTokenResponse, 0..),
        ApiKey::DescribeDelegationToken => top!(DescribeDelegationTokenResponse, 0..),
        ApiKey::ElectLeaders => top!(ElectLeadersResponse, 1..),
        ApiKey::AlterPartitionReassignments => top!(AlterPartitionReassignmentsResponse, 0.., 0..),
        ApiKey::ListPartitionReassignments => top!(ListPartitionReassignmentsResponse, 0.., 0..),
        ApiKey::OffsetDelete => top!(OffsetDeleteResponse, 0..),
        ApiKey::DescribeClientQuotas => top!(DescribeClientQuotasResponse, 0.., 0..),
        ApiKey::DescribeUserScramCredentials => {
            top!(DescribeUserScramCredentialsResponse, 0.., 0..)
        }
        ApiKey::Vote => top!(VoteResponse, 0..),
        ApiKey::BeginQuorumEpoch => top!(BeginQuorumEpochResponse, 0..),
        ApiKey::EndQuorumEpoch => top!(EndQuorumEpochResponse, 0..),
        ApiKey::DescribeQuorum => top!(DescribeQuorumResponse, 0.., 2..),
        ApiKey::AlterPartition => top!(AlterPartitionResponse, 0..),
        ApiKey::UpdateFeatures => top!(UpdateFeaturesResponse, 0.., 0..),
        ApiKey::Envelope => top!(EnvelopeResponse, 0..),
        ApiKey::FetchSnapshot => top!(FetchSnapshotResponse, 0..),
        ApiKey::DescribeCluster => top!(DescribeClusterResponse, 0.., 0..),
        ApiKey::BrokerRegistration => top!(BrokerRegistrationResponse, 0..),
        ApiKey::BrokerHeartbeat => top!(BrokerHeartbeatResponse, 0..),
        ApiKey::UnregisterBroker => top!(UnregisterBrokerResponse, 0.., 0..),
        ApiKey::ListTransactions => top!(ListTransactionsResponse, 0..),
        ApiKey::AllocateProducerIds => top!(AllocateProducerIdsResponse, 0..),
        ApiKey::ConsumerGroupHeartbeat => top!(ConsumerGroupHeartbeatResponse, 0.., 0..),
        ApiKey::ControllerRegistration => top!(ControllerRegistrationResponse, 0.., 0..),
        ApiKey::GetTelemetrySubscriptions => top!(GetTelemetrySubscriptionsResponse, 0..),
        ApiKey::PushTelemetry => top!(PushTelemetryResponse, 0..),
        ApiKey::AssignReplicasToDirs => top!(AssignReplicasToDirsResponse, 0..),
        ApiKey::ListConfigResources => top!(ListConfigResourcesResponse, 0..),
        ApiKey::ShareGroupHeartbeat => top!(ShareGroupHeartbeatResponse, 0.., 0..),
        ApiKey::ShareFetch => top!(ShareFetchResponse, 0.., 0..),
        ApiKey::ShareAcknowledge => top!(ShareAcknowledgeResponse, 0.., 0..),
        ApiKey::AddRaftVoter => top!(AddRaftVoterResponse, 0.., 0..),
        ApiKey::RemoveRaftVoter => top!(RemoveRaftVoterResponse, 0.., 0..),
        ApiKey::UpdateRaftVoter => top!(UpdateRaftVoterResponse, 0..),
        ApiKey::AlterShareGroupOffsets => top!(AlterShareGroupOffsetsResponse, 0.., 0..),
        ApiKey::DeleteShareGroupOffsets => top!(DeleteShareGroupOffsetsResponse, 0.., 0..),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::Decodable;

    fn decoded<R: kafka_protocol::protocol::Decodable>(key: ApiKey, version: i16) -> R {
        let Reply::Frame(frame) = answer(key, version, 9, "not served") else {
            panic!("{key:?} v{version} is answered");
        };
        let mut b = frame.slice(4..);
        let h = ResponseHeader::decode(&mut b, key.response_header_version(version)).unwrap();
        assert_eq!(h.correlation_id, 9);
        let r = R::decode(&mut b, version).unwrap();
        assert!(
            b.is_empty(),
            "{key:?} v{version}: the whole frame is the response"
        );
        r
    }

    #[test]
    fn a_top_level_error_code_carries_unsupported_version_and_a_message_where_there_is_one() {
        let r: DescribeAclsResponse = decoded(ApiKey::DescribeAcls, 1);
        assert_eq!(r.error_code, 35);
        assert_eq!(
            r.error_message.as_deref(),
            Some("Shoal's Kafka listener: not served")
        );
        // FindCoordinator v0 has an error code but no message field: answered without it
        // (so the frame is just throttle-less v0: error code, node id, host, port).
        let Reply::Frame(v0) = answer(ApiKey::FindCoordinator, 0, 9, "not served") else {
            panic!("FindCoordinator v0 is answered");
        };
        assert_eq!(v0.len(), 4 + 4 + 2 + 4 + 2 + 4);
        let r: FindCoordinatorResponse = decoded(ApiKey::FindCoordinator, 0);
        assert_eq!(r.error_code, 35);
        let r: FindCoordinatorResponse = decoded(ApiKey::FindCoordinator, 2);
        assert_eq!(r.error_code, 35);
        assert!(r.error_message.is_some());
        let r: JoinGroupResponse = decoded(ApiKey::JoinGroup, 9);
        assert_eq!(r.error_code, 35);
        let r: MetadataResponse = decoded(ApiKey::Metadata, 13);
        assert_eq!(r.error_code, 35);
    }

    #[test]
    fn responses_without_a_top_level_error_code_and_unknown_versions_close() {
        for (key, version) in [
            // Errors only per partition / group / resource.
            (ApiKey::Produce, 12),
            (ApiKey::DescribeGroups, 6),
            (ApiKey::CreateAcls, 1),
            // FindCoordinator v4+ answers per key; Metadata below v13 has no error code.
            (ApiKey::FindCoordinator, 6),
            (ApiKey::Metadata, 3),
            // Versions kafka-protocol cannot encode.
            (ApiKey::Heartbeat, 99),
            (ApiKey::JoinGroup, -1),
        ] {
            let expected = if version == 99 || version < 0 {
                "a version unknown to the codec"
            } else {
                "no top-level error code"
            };
            match answer(key, version, 9, "not served") {
                Reply::Close(reason) => assert!(
                    reason.starts_with("not served; ") && reason.contains(expected),
                    "{reason}"
                ),
                other => panic!("{key:?} v{version}: {other:?}"),
            }
        }
    }
}
