//! The classic groups of the listener (Kafka's JoinGroup/SyncGroup groups): the sans-IO
//! `shoal_group::classic_group` state machine behind one short lock, and the JoinGroup and
//! SyncGroup requests waiting for its answer. The wire side is `groups.rs`.

use crate::config::KafkaConfig;
use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;
use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use shoal_group::classic_group::{
    ClassicConfig, ClassicError, ClassicGroupDescription, ClassicGroups, JoinResponse, RequestId,
    SyncResponse,
};
use shoal_proto::mq::MessageQueue;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use tokio::sync::{oneshot, Notify};

pub(crate) enum Waiter {
    Join(oneshot::Sender<JoinResponse>),
    Sync(oneshot::Sender<SyncResponse>),
    Heartbeat(oneshot::Sender<Result<(), ClassicError>>),
}

#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) groups: ClassicGroups,
    pub(crate) waiters: HashMap<RequestId, Waiter>,
}

/// The classic groups of this listener and the requests waiting on them.
///
/// The wire side (`groups.rs`) locks `inner` for one state-machine call at a time and
/// delivers its outputs there, numbers waiting requests with `next_req`, and wakes the timer
/// task with `wake`.
pub(crate) struct GroupCoordinator {
    pub(crate) inner: Mutex<Inner>,
    pub(crate) next_req: AtomicU64,
    pub(crate) wake: Notify,
}

impl std::fmt::Debug for GroupCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCoordinator")
            .field("groups", &self.inner.lock().groups.iter().count())
            .finish()
    }
}

pub(crate) fn error_of(e: ClassicError) -> ResponseError {
    match e {
        ClassicError::UnknownMemberId => ResponseError::UnknownMemberId,
        ClassicError::IllegalGeneration => ResponseError::IllegalGeneration,
        ClassicError::RebalanceInProgress => ResponseError::RebalanceInProgress,
        ClassicError::InconsistentGroupProtocol => ResponseError::InconsistentGroupProtocol,
        ClassicError::MemberIdRequired => ResponseError::MemberIdRequired,
        ClassicError::InvalidSessionTimeout => ResponseError::InvalidSessionTimeout,
        ClassicError::GroupMaxSizeReached => ResponseError::GroupMaxSizeReached,
        ClassicError::FencedInstanceId => ResponseError::FencedInstanceId,
        ClassicError::CoordinatorNotAvailable | ClassicError::TooManyGroups => {
            ResponseError::CoordinatorNotAvailable
        }
        ClassicError::NonEmptyGroup => ResponseError::NonEmptyGroup,
        ClassicError::GroupIdNotFound => ResponseError::GroupIdNotFound,
    }
}

/// The partitions a `consumer`-protocol assignment names (Kafka's ConsumerProtocolAssignment:
/// a version, then the topics with their partitions), each as `to_queue(topic, partition)`
/// makes it. Anything else (another protocol type, bytes that do not decode) names none.
pub(crate) fn assigned_queues(
    protocol_type: &str,
    bytes: &[u8],
    to_queue: &dyn Fn(&str, i32) -> MessageQueue,
) -> Vec<MessageQueue> {
    if protocol_type != "consumer" || !plausible_assignment(bytes) {
        return Vec::new();
    }
    let Some((version, body)) = bytes.split_first_chunk::<2>() else {
        return Vec::new();
    };
    // Newer versions only add fields at the end: read what version 3 knows.
    let version = i16::from_be_bytes(*version).clamp(0, 3);
    let mut buf = Bytes::copy_from_slice(body);
    match ConsumerProtocolAssignment::decode(&mut buf, version) {
        Ok(a) => a
            .assigned_partitions
            .iter()
            .flat_map(|tp| {
                tp.partitions
                    .iter()
                    .map(|p| to_queue(tp.topic.0.as_str(), *p))
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Whether the array lengths an assignment declares fit in its bytes (the decoder reserves
/// room for a declared length before it reads the elements, so a forged length must not
/// reach it).
fn plausible_assignment(bytes: &[u8]) -> bool {
    fn take<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
        let (head, rest) = b.split_first_chunk::<N>()?;
        *b = rest;
        Some(*head)
    }
    let mut b = bytes;
    let check = |b: &mut &[u8]| -> Option<()> {
        take::<2>(b)?;
        let topics = i32::from_be_bytes(take::<4>(b)?);
        // Each topic takes at least 6 bytes (name length, partition count).
        if topics < 0 || topics as usize > b.len() / 6 {
            return None;
        }
        for _ in 0..topics {
            let name = i16::from_be_bytes(take::<2>(b)?);
            if name < 0 || name as usize > b.len() {
                return None;
            }
            *b = &b[name as usize..];
            let parts = i32::from_be_bytes(take::<4>(b)?);
            if parts < 0 || parts as usize > b.len() / 4 {
                return None;
            }
            *b = &b[parts as usize * 4..];
        }
        Some(())
    };
    check(&mut b).is_some()
}

pub(crate) fn err_code(e: Option<ClassicError>) -> i16 {
    e.map_or(0, |e| error_of(e).code())
}

impl GroupCoordinator {
    /// A classic group with members as `shoal group describe` shows it; assignments of the
    /// `consumer` protocol are decoded into the cluster's queues (`host`'s topic layouts).
    pub(crate) fn describe(
        &self,
        group: &str,
        host: &dyn crate::host::BrokerHandle,
    ) -> Option<ClassicGroupDescription> {
        let own = host.broker_name();
        let to_queue = |t: &str, p: i32| {
            host.topic_layout(t)
                .and_then(|l| l.queue_of(t, p))
                .unwrap_or_else(|| MessageQueue::new(t, own.clone(), p))
        };
        let inner = self.inner.lock();
        let g = inner.groups.get(group).filter(|g| !g.is_empty())?;
        Some(g.describe(|pt, bytes| assigned_queues(pt, bytes, &to_queue)))
    }
}

/// A partition as a queue key of the listener's own bookkeeping (fetch holds, commit
/// checks): the topic and the partition index, under this broker's name.
pub(crate) fn partition_key(broker_name: &str) -> impl Fn(&str, i32) -> MessageQueue + '_ {
    move |t, p| MessageQueue::new(t, broker_name.to_string(), p)
}

impl GroupCoordinator {
    pub(crate) fn new(config: &KafkaConfig) -> GroupCoordinator {
        GroupCoordinator {
            inner: Mutex::new(Inner {
                groups: ClassicGroups::new(ClassicConfig {
                    initial_rebalance_delay_ms: config.group_initial_rebalance_delay_ms,
                    min_session_timeout_ms: config.group_min_session_timeout_ms,
                    max_session_timeout_ms: config.group_max_session_timeout_ms,
                    max_size: config.group_max_size,
                    max_groups: config.max_groups,
                    heartbeat_hold_ms: config.group_heartbeat_hold_ms,
                    new_member_window_ms: config.group_new_member_window_ms,
                }),
                waiters: HashMap::new(),
            }),
            next_req: AtomicU64::new(1),
            wake: Notify::new(),
        }
    }

    /// Whether a classic group has members (then it is not a consumer group).
    pub(crate) fn has_members(&self, group: &str) -> bool {
        self.inner
            .lock()
            .groups
            .get(group)
            .is_some_and(|g| !g.is_empty())
    }
}
