//! Shoal's extensions to the remoting protocol (`docs/protocol-extensions.md`): request and
//! response codes in ranges Apache RocketMQ does not use, the extra header fields Shoal
//! clients and brokers exchange, and the JSON bodies. An Apache RocketMQ broker answers the
//! requests with REQUEST_CODE_NOT_SUPPORTED and ignores the extra header fields, which is how a
//! Shoal client tells the two apart and stays compatible.

use crate::MessageQueue;
use serde::{Deserialize, Serialize};

/// Extension request codes of the rebalance engine (9000–9019).
pub mod request_code {
    /// Client → broker: which Shoal features the broker has ([`BrokerFeatures`] answer).
    pub const GET_BROKER_FEATURES: i32 = 9000;
    /// Broker → client, oneway: queue locks the member asked for are free now
    /// ([`LockFreedBody`]).
    pub const NOTIFY_LOCK_FREED: i32 = 9001;
    /// Controller voter → voter, oneway: one Raft message (raft-rs's `eraftpb::Message`,
    /// protobuf-encoded) as the body.
    pub const CONTROLLER_RAFT_MESSAGE: i32 = 9080;
    /// Master → controller: renew the write lease (JSON `RenewLease` request as the body).
    pub const CONTROLLER_RENEW_LEASE: i32 = 9081;
    /// Master → replica of its group, oneway: a replication message (JSON in the `haMessage`
    /// header field), with the commit-log bytes of a batch as the body.
    pub const HA_TO_REPLICA: i32 = 9082;
    /// Replica → master of its group, oneway: a handshake or an acknowledgement (JSON in the
    /// `haMessage` header field).
    pub const HA_TO_MASTER: i32 = 9083;
}

/// Extension response codes of the rebalance engine (9000–9009).
pub mod response_code {
    /// An offset commit refused: the committing member does not hold the queue's lock (or the
    /// commit would move a Shoal member's offset backwards).
    pub const QUEUE_NOT_LOCKED: i32 = 9000;
}

/// Header fields (`extFields`) Shoal adds to RocketMQ requests and answers.
pub mod field {
    /// HEART_BEAT request: the Shoal member's session timeout, ms (its session locks last
    /// that long after its last heartbeat).
    pub const SESSION_TIMEOUT_MS: &str = "shoalSessionTimeoutMs";
    /// HEART_BEAT answer: `group=sessionId;group=sessionId` for the consumer groups of the
    /// heartbeat that have a session.
    pub const SESSIONS: &str = "shoalSessions";
    /// LOCK_BATCH_MQ request: `true` asks for session locks (a Shoal member).
    pub const LEASE: &str = "shoalLease";
    /// LOCK_BATCH_MQ request: `true` when the member consumes orderly.
    pub const ORDERLY: &str = "shoalOrderly";
    /// LOCK_BATCH_MQ answer: the session the granted locks last for.
    pub const SESSION: &str = "shoalSession";
    /// UPDATE_CONSUMER_OFFSET request: `true` when a lower offset is meant (a seek back).
    pub const REWIND: &str = "shoalRewind";
    /// LOCK_BATCH_MQ request (with [`LEASE`]): `true` asks for the group's committed offsets
    /// of the granted queues in the answer ([`super::feature::OFFSET_ON_GRANT`]).
    pub const WANT_OFFSETS: &str = "shoalWantOffsets";
    /// LOCK_BATCH_MQ answer: the committed offsets of granted queues, read after the grant,
    /// as [`super::encode_queue_offsets`] (queues without a committed offset are left out).
    pub const COMMITTED_OFFSETS: &str = "shoalCommittedOffsets";
    /// UNLOCK_BATCH_MQ request: final commits ([`super::encode_queue_offsets`]) the broker
    /// stores (commit fence as for UPDATE_CONSUMER_OFFSET) before it frees the locks
    /// ([`super::feature::COMMIT_ON_UNLOCK`]).
    pub const COMMIT: &str = "shoalCommit";
    /// UPDATE_CONSUMER_OFFSET request: `true` when a replica forwards to its master a commit
    /// a client made to it; the master stores it only above what it has, and only once it has
    /// taken over its group's state.
    pub const FORWARDED: &str = "shoalForwarded";
    /// UPDATE_CONSUMER_OFFSET request: `true` asks a replicated group's master to answer only
    /// once the in-sync set has the offset (a Kafka coordinator committing another broker
    /// group's partition); FLUSH_SLAVE_TIMEOUT when that does not happen in time, and
    /// SERVICE_NOT_AVAILABLE from a broker that is not its group's master.
    pub const WAIT_REPLICATED: &str = "shoalWaitReplicated";
}

/// The feature names a Shoal broker lists.
pub mod feature {
    /// Session locks for Shoal members (leases that last the session).
    pub const SESSION_LOCKS: &str = "sessionLocks";
    /// NOTIFY_LOCK_FREED to members refused a lock.
    pub const LOCK_FREED_NOTICE: &str = "lockFreedNotice";
    /// Offset commits fenced by queue locks.
    pub const COMMIT_FENCE: &str = "commitFence";
    /// The broker is a group coordinator (coordinated mode: GROUP_HEARTBEAT and the rest of
    /// `shoal_proto::coordinated`); `Auto` consumers speak coordinated mode only to brokers
    /// listing it.
    pub const COORDINATOR: &str = "coordinator";
    /// LOCK_BATCH_MQ answers carry the committed offsets of granted queues on request
    /// ([`super::field::WANT_OFFSETS`]).
    pub const OFFSET_ON_GRANT: &str = "offsetOnGrant";
    /// UNLOCK_BATCH_MQ applies the final commits it carries ([`super::field::COMMIT`]), then
    /// frees the locks.
    pub const COMMIT_ON_UNLOCK: &str = "commitOnUnlock";
    /// NOTIFY_CONSUMER_IDS_CHANGED to Shoal members carries the member list
    /// ([`super::ConsumerIdsNotice`]).
    pub const MEMBER_LIST_NOTICE: &str = "memberListNotice";
}

/// The answer to GET_BROKER_FEATURES. Clients ignore names they do not know, so the list
/// grows without a version bump.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BrokerFeatures {
    /// Feature names ([`feature`]; other issues add theirs, e.g. `coordinator`).
    pub features: Vec<String>,
    /// Shortest session timeout the broker accepts, ms.
    pub min_session_timeout_ms: u64,
    /// Longest session timeout the broker accepts, ms.
    pub max_session_timeout_ms: u64,
}

impl BrokerFeatures {
    /// True when `name` is listed.
    pub fn has(&self, name: &str) -> bool {
        self.features.iter().any(|f| f == name)
    }
}

/// The body of NOTIFY_LOCK_FREED.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LockFreedBody {
    /// Consumer group.
    pub consumer_group: String,
    /// The queues whose locks are free.
    #[serde(rename = "mqSet")]
    pub mq_set: Vec<MessageQueue>,
}

/// The body of NOTIFY_CONSUMER_IDS_CHANGED a Shoal broker sends to Shoal members (those with a
/// session) on a membership change that did not change subscriptions: the group's member list
/// as GET_CONSUMER_LIST_BY_GROUP would answer it, so the member need not ask.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumerIdsNotice {
    /// The group's client ids after the change.
    pub consumer_id_list: Vec<String>,
    /// Grows with every list this broker sends (it starts at the broker's start time in
    /// microseconds, so a restarted broker's lists are newer): a member applies a list only
    /// if it is newer than the last one it applied from the broker (notices can overtake
    /// each other).
    pub version: u64,
}

/// Encodes offsets per queue of one broker (`topic:queueId=offset;...`; RocketMQ topic names
/// have neither `:` nor `;` nor `=`), for [`field::COMMITTED_OFFSETS`] and [`field::COMMIT`].
pub fn encode_queue_offsets<'a>(offsets: impl IntoIterator<Item = (&'a str, i32, i64)>) -> String {
    offsets
        .into_iter()
        .map(|(t, q, o)| format!("{t}:{q}={o}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// Decodes [`encode_queue_offsets`] text into (topic, queue id, offset); malformed entries are
/// skipped.
pub fn decode_queue_offsets(text: &str) -> Vec<(String, i32, i64)> {
    text.split(';')
        .filter_map(|e| {
            let (tq, o) = e.rsplit_once('=')?;
            let (t, q) = tq.rsplit_once(':')?;
            if t.is_empty() {
                return None;
            }
            Some((t.to_string(), q.parse().ok()?, o.parse().ok()?))
        })
        .collect()
}

/// Encodes the [`field::SESSIONS`] value.
pub fn encode_sessions<'a>(sessions: impl IntoIterator<Item = (&'a str, u64)>) -> String {
    sessions
        .into_iter()
        .map(|(g, s)| format!("{g}={s}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// Decodes the [`field::SESSIONS`] value (malformed entries are skipped).
pub fn decode_sessions(text: &str) -> Vec<(String, u64)> {
    text.split(';')
        .filter_map(|e| {
            let (g, s) = e.rsplit_once('=')?;
            Some((g.to_string(), s.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_round_trip_and_features_are_open_ended() {
        let text = encode_sessions([("G1", 7), ("%RETRY%x", 9)]);
        assert_eq!(text, "G1=7;%RETRY%x=9");
        assert_eq!(
            decode_sessions(&text),
            vec![("G1".to_string(), 7), ("%RETRY%x".to_string(), 9)]
        );
        assert!(decode_sessions("bad;G=x;H=3").len() == 1);
        let f: BrokerFeatures =
            serde_json::from_str(r#"{"features":["sessionLocks","coordinator"],"later":1}"#)
                .unwrap();
        assert!(f.has(feature::SESSION_LOCKS) && f.has("coordinator"));
        assert!(!f.has(feature::COMMIT_FENCE));
        let b = LockFreedBody {
            consumer_group: "G".into(),
            mq_set: vec![MessageQueue::new("T", "b", 1)],
        };
        let json = serde_json::to_string(&b).unwrap();
        assert!(json.contains("\"mqSet\"") && json.contains("\"consumerGroup\""));
    }

    #[test]
    fn queue_offsets_round_trip_and_bad_entries_are_skipped() {
        let text = encode_queue_offsets([("T", 0, 5), ("%RETRY%G", 3, -1)]);
        assert_eq!(text, "T:0=5;%RETRY%G:3=-1");
        assert_eq!(
            decode_queue_offsets(&text),
            vec![("T".to_string(), 0, 5), ("%RETRY%G".to_string(), 3, -1)]
        );
        assert_eq!(decode_queue_offsets(""), vec![]);
        assert_eq!(
            decode_queue_offsets("T:x=1;:1=2;T1=2;T:1=y;U:2=9"),
            vec![("U".to_string(), 2, 9)]
        );
        let n: ConsumerIdsNotice =
            serde_json::from_str(r#"{"consumerIdList":["a","b"],"version":7,"later":1}"#).unwrap();
        assert_eq!(n.consumer_id_list, vec!["a", "b"]);
        assert_eq!(n.version, 7);
    }
}
