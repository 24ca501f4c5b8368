//! The simulated broker built from what ships: the broker's [`GroupState`] (registry, queue
//! locks, coordinator, the commit and member-epoch fences, lock releases of members that left,
//! notices as effects), plus an offset table and one topic whose messages are only counted.

use super::model::{
    mq, Answer, BrokerModel, GroupAnswer, MemberListNotice, Outbox, Reply, Req, GROUP, TOPIC,
};
use super::SimConfig;
use crate::coordinator::{CoordinatorConfig, GroupDescription, HeartbeatRequest};
use crate::error::GroupError;
use crate::membership::ClientChannel;
use crate::rebalance::StartOffset;
use crate::state::{
    CommitCheck, ConsumerHeartbeat, ConsumerMeta, GroupEffect, GroupState, GroupStateConfig,
    LockOutcome, LockRequest,
};
use shoal_proto::body::{ConsumeFromWhere, ConsumeType, MessageModel, SubscriptionData};
use shoal_proto::MessageQueue;
use std::collections::BTreeMap;

/// The coordinator settings of a simulated run. Its own session timeout stays the default
/// (45 s, longer than any run): members name theirs in every heartbeat, as the client does.
pub fn coordinator_config(
    heartbeat_ms: u64,
    rebalance_ms: u64,
    assignor: &str,
) -> CoordinatorConfig {
    CoordinatorConfig {
        heartbeat_interval_ms: heartbeat_ms,
        rebalance_timeout_ms: rebalance_ms,
        max_rebalance_timeout_ms: rebalance_ms.max(1),
        default_assignor: assignor.to_string(),
        ..CoordinatorConfig::default()
    }
}

/// See the [module documentation](self).
#[derive(Debug)]
pub struct SimBroker {
    state: GroupState,
    offsets: BTreeMap<MessageQueue, i64>,
    /// Next offset to be written, per queue.
    max_offset: BTreeMap<MessageQueue, i64>,
    queue_count: i32,
    /// Lock grants carry committed offsets; notices carry the member list.
    extensions: bool,
    coordinated: bool,
    rebalance_timeout_ms: u64,
    session_timeout_ms: u64,
    assignor: String,
}

impl SimBroker {
    /// A broker with `queues` queues for a run with these settings.
    pub fn new(queues: i32, cfg: &SimConfig) -> Self {
        let mut b = Self {
            state: GroupState::new(GroupStateConfig {
                coordinator: coordinator_config(
                    cfg.heartbeat_ms,
                    cfg.rebalance_timeout_ms,
                    &cfg.strategy,
                ),
                session_base: 1000,
                ..GroupStateConfig::default()
            }),
            offsets: BTreeMap::new(),
            max_offset: BTreeMap::new(),
            queue_count: 0,
            extensions: cfg.extensions,
            coordinated: cfg.coordinated,
            rebalance_timeout_ms: cfg.rebalance_timeout_ms,
            session_timeout_ms: cfg.session_timeout_ms,
            assignor: cfg.strategy.clone(),
        };
        b.grow(queues);
        if b.coordinated {
            b.state.set_topic_queues(0, TOPIC, Some(b.queues()));
        }
        b
    }

    fn grow(&mut self, to: i32) {
        for i in self.queue_count..to {
            self.max_offset.insert(mq(i), 0);
        }
        self.queue_count = self.queue_count.max(to);
    }

    /// The state's effects as what the simulated network carries.
    fn drain(&mut self, out: &mut Outbox) {
        while let Some(e) = self.state.poll_effect() {
            match e {
                GroupEffect::ConsumerIdsChanged {
                    conn_ids,
                    member_list,
                    ..
                } => {
                    for conn in conn_ids {
                        let list = member_list
                            .as_ref()
                            .filter(|l| self.extensions && l.to.contains(&conn))
                            .map(|l| MemberListNotice {
                                version: l.notice.version,
                                client_ids: l.notice.consumer_id_list.clone(),
                            });
                        out.notify.push((conn, list));
                    }
                }
                GroupEffect::LockFreed {
                    conn_id, queues, ..
                } => out.freed.push((conn_id, queues)),
                GroupEffect::NotifyMember { conn_id, .. } => out.assign.push(conn_id),
                GroupEffect::ModeChanged {
                    notify_conn_ids, ..
                } => out.assign.extend(notify_conn_ids),
                GroupEffect::MemberRemoved { .. }
                | GroupEffect::Persist { .. }
                | GroupEffect::MembershipObserved { .. }
                | GroupEffect::ClientLocksReleased { .. }
                | GroupEffect::HealthChanged { .. } => {}
            }
        }
    }

    fn stamp_refused(&self, stamp: Option<&(String, i32)>, queues: &[MessageQueue]) -> bool {
        stamp.is_some_and(|(member, epoch)| {
            self.state
                .check_stamp(GROUP, member, *epoch, queues)
                .is_err()
        })
    }

    fn commit(&mut self, now: u64, conn: u64, queue: &MessageQueue, offset: i64) -> bool {
        let stored = self.offsets.get(queue).copied();
        let check = CommitCheck {
            conn_id: conn,
            group: GROUP,
            queue,
            offset,
            rewind: false,
        };
        if self.state.check_commit(now, check, || stored).is_err() {
            return false;
        }
        self.offsets.insert(queue.clone(), offset);
        true
    }

    fn group_heartbeat(&mut self, now: u64, conn: u64, client_id: &str, req: &Req) -> GroupAnswer {
        let Req::GroupHeartbeat {
            member_id,
            epoch,
            instance_id,
            owned,
        } = req
        else {
            return GroupAnswer::Refused;
        };
        let request = HeartbeatRequest {
            group: GROUP.into(),
            member_id: member_id.clone(),
            member_epoch: *epoch,
            instance_id: instance_id.clone(),
            client_id: client_id.to_string(),
            conn_id: conn,
            subscriptions: [TOPIC.to_string()].into(),
            owned: owned.iter().cloned().collect(),
            adoptable: Default::default(),
            rebalance_timeout_ms: Some(self.rebalance_timeout_ms),
            // The member's own session (the coordinator's default is Kafka's 45 s, longer
            // than the run): as the client sends it.
            session_timeout_ms: Some(self.session_timeout_ms),
            assignor: Some(self.assignor.clone()),
            last_epoch: None,
        };
        match self.state.handle_group_heartbeat(now, request, Vec::new()) {
            Ok(Some(r)) => GroupAnswer::Assigned {
                epoch: r.member_epoch,
                queues: r.assignment,
                interval: r.heartbeat_interval_ms,
            },
            Ok(None) => GroupAnswer::Refused,
            Err(e @ (GroupError::FencedMemberEpoch { .. } | GroupError::UnknownMember { .. })) => {
                GroupAnswer::Fenced(e.to_string())
            }
            Err(_) => GroupAnswer::Refused,
        }
    }
}

impl BrokerModel for SimBroker {
    fn handle(
        &mut self,
        now: u64,
        conn: u64,
        client_id: &str,
        req: &Req,
        stamp: Option<&(String, i32)>,
        out: &mut Outbox,
    ) -> Answer {
        // The member-epoch fence on locks, pulls and commits (coordinated mode).
        let fenced = match req {
            Req::Lock(queues) => self.stamp_refused(stamp, queues),
            Req::Pull(q, _) | Req::Commit(q, _) => {
                self.stamp_refused(stamp, std::slice::from_ref(q))
            }
            _ => false,
        };
        if fenced {
            return Answer::Reply(Reply::Fenced);
        }
        let reply = match req {
            Req::Heartbeat { session_timeout_ms } => {
                let outcome = self.state.handle_consumer_heartbeat(
                    now,
                    ConsumerHeartbeat {
                        group: GROUP.into(),
                        channel: ClientChannel {
                            conn_id: conn,
                            client_id: client_id.to_string(),
                            client_addr: String::new(),
                            language: "RUST".into(),
                            version: 0,
                        },
                        meta: ConsumerMeta {
                            consume_type: ConsumeType::ConsumePassively,
                            message_model: MessageModel::Clustering,
                            consume_from_where: ConsumeFromWhere::ConsumeFromFirstOffset,
                        },
                        subscriptions: Some(
                            [(
                                TOPIC.to_string(),
                                SubscriptionData::from_tag_expression(TOPIC, "*", 1),
                            )]
                            .into(),
                        ),
                        session_timeout_ms: *session_timeout_ms,
                        coordinated: self.coordinated,
                    },
                );
                Reply::Heartbeat(outcome.session.map_or(0, |s| s.id))
            }
            Req::View => Reply::View(self.queues(), self.state.clients().client_ids(GROUP)),
            Req::Lock(queues) => {
                let outcome = self.state.handle_lock(
                    now,
                    LockRequest {
                        group: GROUP,
                        queues,
                        client_id,
                        conn_id: conn,
                        session: true,
                        orderly: false,
                    },
                );
                let (granted, session) = match outcome {
                    LockOutcome::Session { granted, session } => (granted, Some(session)),
                    LockOutcome::Ttl(granted) => (granted, None),
                    LockOutcome::NoSession => (Default::default(), None),
                };
                // Read after the grant, as the broker does.
                let committed = if self.extensions && session.is_some() {
                    granted
                        .iter()
                        .filter_map(|q| self.offsets.get(q).map(|o| (q.clone(), *o)))
                        .collect()
                } else {
                    BTreeMap::new()
                };
                Reply::Lock(granted.into_iter().collect(), session, committed)
            }
            Req::CommitUnlock(q, o) => {
                // The commit first (fenced as any commit; the member-epoch fence too), then
                // the unlock: the next owner's grant sees the offset.
                if !self.stamp_refused(stamp, std::slice::from_ref(q)) {
                    self.commit(now, conn, q, *o);
                }
                self.state
                    .handle_unlock(now, GROUP, client_id, std::slice::from_ref(q));
                Reply::Unlocked
            }
            Req::Unlock(queues) => {
                self.state.handle_unlock(now, GROUP, client_id, queues);
                Reply::Unlocked
            }
            Req::GroupHeartbeat { .. } => {
                Reply::Group(self.group_heartbeat(now, conn, client_id, req))
            }
            Req::GroupLeave { member_id } => {
                let _ = self.state.handle_group_leave(now, GROUP, member_id, false);
                Reply::Done
            }
            Req::QueryOffset(q) => Reply::Offset(match self.offsets.get(q) {
                Some(&o) => StartOffset::Committed(o),
                None => StartOffset::Resolved(0),
            }),
            Req::Commit(q, o) => Reply::Committed(self.commit(now, conn, q, *o)),
            Req::Pull(q, offset) => {
                let msgs = self.read(q, *offset, super::model::PULL_BATCH);
                if msgs.is_empty() {
                    self.drain(out);
                    return Answer::Hold;
                }
                Reply::Pull(msgs)
            }
            Req::Unregister => {
                self.state
                    .handle_unregister_consumer(now, GROUP, client_id, conn);
                Reply::Done
            }
        };
        self.drain(out);
        Answer::Reply(reply)
    }

    fn committed_offset(&self, queue: &MessageQueue) -> Option<i64> {
        self.offsets.get(queue).copied()
    }

    fn connection_closed(&mut self, now: u64, conn: u64, out: &mut Outbox) {
        let _ = self.state.handle_connection_closed(now, conn);
        self.drain(out);
    }

    fn tick(&mut self, now: u64, out: &mut Outbox) {
        let _ = self.state.handle_timeout(now);
        self.drain(out);
    }

    fn produce(&mut self, _now: u64, queue: i32) {
        *self.max_offset.entry(mq(queue)).or_default() += 1;
    }

    fn add_queues(&mut self, now: u64, more: i32, out: &mut Outbox) {
        self.grow(self.queue_count + more);
        let queues = self.queues();
        self.state.handle_topic_changed(now, TOPIC, Some(queues));
        self.drain(out);
    }

    fn queues(&self) -> Vec<MessageQueue> {
        (0..self.queue_count).map(mq).collect()
    }

    fn max_offset(&self, queue: &MessageQueue) -> i64 {
        self.max_offset.get(queue).copied().unwrap_or(0)
    }

    fn read(&mut self, queue: &MessageQueue, offset: i64, max: i64) -> Vec<i64> {
        let end = self.max_offset(queue);
        (offset.max(0)..end.min(offset.max(0) + max)).collect()
    }

    fn check_coordinator(&self) -> Result<(), String> {
        self.state.coordinator().check_invariants()
    }

    fn describe_group(&self, now: u64) -> Option<GroupDescription> {
        self.state.coordinator().describe(GROUP, now)
    }
}
