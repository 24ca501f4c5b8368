//! What the listener keeps of KIP-848 consumer groups: each member's last subscriptions and
//! owned partitions (Kafka heartbeats leave out what did not change; the coordinator wants
//! them every time), reached through the broker's coordinator. The wire side is
//! `consumer_group.rs`.

use crate::config::KafkaConfig;
use crate::host::BrokerHandle;
use crate::KafkaError;
use kafka_protocol::ResponseError;
use parking_lot::Mutex;
use shoal_group::coordinator::{Coordinator, GroupDescription};
use shoal_group::GroupError;
use shoal_proto::mq::MessageQueue;
use std::collections::BTreeMap;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use tokio::sync::Notify;

#[derive(Debug, Default, Clone)]
pub(crate) struct MemberCache {
    pub(crate) subscriptions: BTreeSet<String>,
    pub(crate) owned: BTreeSet<MessageQueue>,
    pub(crate) assignor: Option<String>,
    pub(crate) rebalance_timeout_ms: Option<u64>,
    /// The assignment the member was last sent: partition (topic, index) → the queue it was
    /// then.
    pub(crate) last_sent: Option<BTreeMap<(String, i32), MessageQueue>>,
    /// The heartbeat interval the last answer gave (librdkafka times its next heartbeat
    /// out after it, so that heartbeat's answer must not be held longer).
    pub(crate) told_ms: Option<u64>,
    pub(crate) client_host: String,
}

/// The Kafka side of the consumer groups of this listener: what Kafka heartbeats leave out,
/// and the members whose heartbeat answer is held.
#[derive(Debug)]
pub(crate) struct ConsumerGroups {
    pub(crate) members: Mutex<HashMap<(String, String), MemberCache>>,
    /// Heartbeats being answered, by (group, member): notified when the coordinator tells
    /// the member to heartbeat. At most one entry per connection (one request at a time).
    watched: Mutex<HashMap<(String, String), Arc<Notify>>>,
    pub(crate) broker_name: String,
    pub(crate) heartbeat_interval_ms: u64,
    pub(crate) reconcile_interval_ms: u64,
    pub(crate) hold_ms: u64,
}

pub(crate) fn error_of(e: &GroupError) -> ResponseError {
    match e {
        GroupError::FencedMemberEpoch { .. } => ResponseError::FencedMemberEpoch,
        GroupError::UnknownMember { .. } => ResponseError::UnknownMemberId,
        GroupError::UnreleasedInstanceId { .. } => ResponseError::UnreleasedInstanceId,
        GroupError::GroupFull { .. } => ResponseError::GroupMaxSizeReached,
        GroupError::TooManyGroups(_) => ResponseError::CoordinatorNotAvailable,
        GroupError::UnknownStrategy(_) => ResponseError::UnsupportedAssignor,
        _ => ResponseError::InvalidRequest,
    }
}

/// Runs `f` once on the broker's coordinator (see [`BrokerHandle::with_coordinator`]).
pub(crate) fn on_coordinator<R>(
    host: &dyn BrokerHandle,
    group: Option<&str>,
    topics: &[String],
    f: impl FnOnce(&mut Coordinator, u64) -> R,
) -> Result<R, KafkaError> {
    let mut f = Some(f);
    let mut out = None;
    host.with_coordinator(group, topics, &mut |c, now| {
        if let Some(f) = f.take() {
            out = Some(f(c, now));
        }
    })?;
    out.ok_or_else(|| KafkaError::Broker("the broker did not run the coordinator request".into()))
}

/// Who fences a commit, from the coordinator's answer to whether it knows the group:
/// `Ok(true)` the consumer-protocol coordinator, `Ok(false)` the classic groups (a group the
/// coordinator does not know, or a group of classic RocketMQ members). A coordinator that
/// answers no group now (a new master still taking over the group's state) does not know
/// the group yet: the commit is refused with the code that makes the client send it again
/// (COORDINATOR_LOAD_IN_PROGRESS), not fenced as a classic group's, whose ILLEGAL_GENERATION
/// librdkafka's KIP-848 consumer takes for a lost assignment (it drops its partitions and
/// joins again).
pub(crate) fn commit_fencing(knows: Result<bool, KafkaError>) -> Result<bool, ResponseError> {
    match knows {
        Ok(known) => Ok(known),
        Err(KafkaError::ClassicGroup(_)) => Ok(false),
        Err(e) => Err(ResponseError::try_from_code(e.code())
            .unwrap_or(ResponseError::CoordinatorNotAvailable)),
    }
}

/// Kafka's state name of a consumer group.
pub(crate) fn state_name(d: &GroupDescription) -> &'static str {
    if d.members.is_empty() {
        "Empty"
    } else if d.reconciled {
        "Stable"
    } else {
        "Reconciling"
    }
}

impl ConsumerGroups {
    pub(crate) fn new(config: &KafkaConfig, broker_name: String) -> ConsumerGroups {
        ConsumerGroups {
            members: Mutex::new(HashMap::new()),
            watched: Mutex::new(HashMap::new()),
            broker_name,
            heartbeat_interval_ms: config.consumer_heartbeat_interval_ms,
            reconcile_interval_ms: config.consumer_reconcile_heartbeat_interval_ms,
            hold_ms: config.consumer_heartbeat_hold_ms,
        }
    }

    /// The coordinator asks `member` of `group` to heartbeat now (its assignment changed): a
    /// held answer to it goes out at once. Members that are not being answered are skipped.
    pub(crate) fn notify_member(&self, group: &str, member: &str) {
        if let Some(n) = self
            .watched
            .lock()
            .get(&(group.to_string(), member.to_string()))
        {
            n.notify_one();
        }
    }

    /// Watches a member's heartbeat being answered (see [`Self::notify_member`]).
    pub(crate) fn watch(&self, key: &(String, String)) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.watched.lock().insert(key.clone(), n.clone());
        n
    }

    /// The answer went out.
    pub(crate) fn unwatch(&self, key: &(String, String), n: &Arc<Notify>) {
        let mut w = self.watched.lock();
        if w.get(key).is_some_and(|x| Arc::ptr_eq(x, n)) {
            w.remove(key);
        }
    }

    /// The queue partition `partition` of `topic` is ([`crate::cluster`]); this broker's
    /// queue of that id when no layout is known.
    pub(crate) fn queue(
        &self,
        host: &dyn BrokerHandle,
        topic: &str,
        partition: i32,
    ) -> MessageQueue {
        host.topic_layout(topic)
            .and_then(|l| l.queue_of(topic, partition))
            .unwrap_or_else(|| MessageQueue {
                topic: topic.to_string(),
                broker_name: self.broker_name.clone(),
                queue_id: partition,
            })
    }

    /// Forgets the cached heartbeat fields of members the coordinator no longer has (left,
    /// expired, fenced, or cleared when the group went classic).
    pub(crate) fn prune(&self, host: &dyn BrokerHandle) {
        let keys: Vec<(String, String)> = self.members.lock().keys().cloned().collect();
        if keys.is_empty() {
            return;
        }
        let gone = on_coordinator(host, None, &[], |c, _| {
            keys.into_iter()
                .filter(|(g, m)| !c.has_member(g, m))
                .collect::<Vec<_>>()
        });
        match gone {
            Ok(gone) => {
                let mut members = self.members.lock();
                for k in gone {
                    members.remove(&k);
                }
            }
            Err(e) => tracing::debug!(error = %e, "kafka consumer-group cache not pruned"),
        }
    }

    /// (member id, host) of the members of `group` this listener has heard from.
    pub(crate) fn member_hosts(&self, group: &str) -> Vec<(String, String)> {
        self.members
            .lock()
            .iter()
            .filter(|((g, _), _)| g == group)
            .map(|((_, m), c)| (m.clone(), c.client_host.clone()))
            .collect()
    }

    /// Whether the coordinator knows this group (it then fences the group's commits); `Err`
    /// is the answer to a commit while the coordinator answers no group ([`commit_fencing`]).
    pub(crate) fn has_group(
        &self,
        host: &dyn BrokerHandle,
        group: &str,
    ) -> Result<bool, ResponseError> {
        commit_fencing(on_coordinator(host, Some(group), &[], |c, _| {
            c.knows_group(group)
        }))
    }

    /// Whether the coordinator's group has members (Kafka's or Shoal's).
    pub(crate) fn has_members(&self, host: &dyn BrokerHandle, group: &str) -> bool {
        on_coordinator(host, None, &[], |c, _| c.has_members(group)).unwrap_or(false)
    }

    /// Offset-commit fencing for a consumer-group member at `epoch`.
    pub(crate) fn validate_commit(
        &self,
        host: &dyn BrokerHandle,
        group: &str,
        member_id: &str,
        epoch: i32,
        topic: &str,
        partition: i32,
    ) -> Result<(), ResponseError> {
        let q = self.queue(host, topic, partition);
        match on_coordinator(host, None, &[], |c, _| {
            c.validate(group, member_id, epoch, &q)
        }) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(GroupError::FencedMemberEpoch { .. })) => Err(ResponseError::StaleMemberEpoch),
            Ok(Err(e)) => Err(error_of(&e)),
            Err(_) => Err(ResponseError::CoordinatorNotAvailable),
        }
    }

    /// Group names with their state (for ListGroups): every group of the coordinator, Kafka's
    /// and Shoal's coordinated ones.
    pub(crate) fn list(&self, host: &dyn BrokerHandle) -> Vec<(String, &'static str)> {
        on_coordinator(host, None, &[], |c, now| {
            c.group_names()
                .into_iter()
                .map(|g| {
                    let st = c.describe(&g, now).as_ref().map_or("Dead", state_name);
                    (g, st)
                })
                .collect()
        })
        .unwrap_or_default()
    }

    /// Forgets the members-less group's coordinator state (DeleteGroups); `Ok(false)` when
    /// the coordinator does not know it.
    pub(crate) fn delete(
        &self,
        host: &dyn BrokerHandle,
        group: &str,
    ) -> Result<bool, ResponseError> {
        on_coordinator(host, None, &[], |c, now| {
            if !c.knows_group(group) {
                return Ok(false);
            }
            if c.has_members(group) {
                return Err(ResponseError::NonEmptyGroup);
            }
            c.handle_clear_group(now, group);
            Ok(true)
        })
        .unwrap_or(Err(ResponseError::CoordinatorNotAvailable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_to_a_master_taking_over_is_sent_again_not_fenced_as_a_classic_groups() {
        let loading = KafkaError::CoordinatorLoading("still applying its log".into());
        assert_eq!(
            commit_fencing(Err(loading)),
            Err(ResponseError::CoordinatorLoadInProgress)
        );
        let replica = KafkaError::NotCoordinator("a replica".into());
        assert_eq!(
            commit_fencing(Err(replica)),
            Err(ResponseError::NotCoordinator)
        );
    }

    #[test]
    fn a_known_group_is_fenced_by_the_coordinator_and_others_as_classic() {
        assert_eq!(commit_fencing(Ok(true)), Ok(true));
        assert_eq!(commit_fencing(Ok(false)), Ok(false));
        let classic = KafkaError::ClassicGroup("g".into());
        assert_eq!(commit_fencing(Err(classic)), Ok(false));
    }
}
